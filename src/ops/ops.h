/* ops.h — the op table and the node. Every op call builds a node (op id,
 * inputs, attributes); eager mode runs it at once, and the compiled mode
 * records it. One table row per op: name, shape/dtype rule, backward rule.
 * Kernels live in the backends, in a table indexed by the same op ids. */
#ifndef TS_OPS_H
#define TS_OPS_H

#include "core/core.h"

#define TS_MAX_INPUTS 8
#define TS_MAX_SAVED  2

typedef enum {
    /* views: the output shares input 0's storage */
    TS_OP_RESHAPE_VIEW,
    TS_OP_PERMUTE,
    TS_OP_SLICE,
    TS_OP_EXPAND,
    /* elementwise */
    TS_OP_ADD,
    TS_OP_SUB,
    TS_OP_MUL,
    TS_OP_DIV,
    TS_OP_EQ,
    TS_OP_ADD_SCALAR,
    TS_OP_MUL_SCALAR,
    TS_OP_NEG,
    TS_OP_EXP,
    TS_OP_LOG,
    TS_OP_SQRT,
    TS_OP_RSQRT,
    TS_OP_ABS,
    TS_OP_POW_SCALAR,
    TS_OP_TANH,
    TS_OP_SIGMOID,
    TS_OP_RELU,
    TS_OP_SILU,
    TS_OP_GELU,
    TS_OP_UNARY_BACKWARD,
    TS_OP_WHERE,
    TS_OP_MASKED_FILL,
    TS_OP_CAST,
    TS_OP_COPY,
    /* reductions */
    TS_OP_SUM,
    TS_OP_MEAN,
    TS_OP_AMAX,
    TS_OP_ARGMAX,
    TS_OP_SOFTMAX,
    TS_OP_LOG_SOFTMAX,
    /* linear algebra, indexing */
    TS_OP_MATMUL,
    TS_OP_EMBEDDING,
    TS_OP_EMBEDDING_BACKWARD,
    TS_OP_CONCAT,
    TS_OP_SLICE_SCATTER,
    /* fused layers and their backward kernels */
    TS_OP_RMSNORM,
    TS_OP_RMSNORM_BACKWARD,
    TS_OP_LAYERNORM,
    TS_OP_LAYERNORM_BACKWARD,
    TS_OP_ROPE,
    TS_OP_ATTENTION,
    TS_OP_ATTENTION_BACKWARD,
    TS_OP_PAGED_ATTENTION,
    TS_OP_CROSS_ENTROPY,
    TS_OP_CROSS_ENTROPY_BACKWARD,
    /* mixture of experts: routing and the grouped experts MLP */
    TS_OP_TOPK,
    TS_OP_GATHER,
    TS_OP_GATHER_BACKWARD,
    TS_OP_ONE_HOT,
    TS_OP_MOE_EXPERTS,
    TS_OP_MOE_EXPERTS_BACKWARD,
    /* in-place write of in[1] into in[0]'s memory (compiled mode's ts_copy_) */
    TS_OP_COPY_INTO,
    /* fused AdamW: updates in[0] (param), in[2] (m), in[3] (v) in place */
    TS_OP_ADAMW,
    /* in[0] (V, C) f32 rows at ids in[1] += in[2] (numel(ids), C), in place
     * (torch's index_add_ on dim 0): an embedding's gradient accumulated
     * into an existing one */
    TS_OP_INDEX_ADD,
    /* activation checkpoint (src/graph/checkpoint.c): no kernel; its
     * backward recomputes a block and backpropagates through it */
    TS_OP_CHECKPOINT,
    /* images (NCHW): convolution, group norm, resampling (image_ops.c) */
    TS_OP_CONV2D,
    TS_OP_CONV2D_BACKWARD_INPUT,
    TS_OP_CONV2D_BACKWARD_WEIGHT,
    TS_OP_GROUP_NORM,
    TS_OP_GROUP_NORM_BACKWARD,
    TS_OP_UPSAMPLE_NEAREST,
    TS_OP_AVG_POOL2D,
    TS_OP_AVG_POOL2D_BACKWARD,
    TS_OP_COUNT
} ts_op_id;

/* What TS_OP_MOE_EXPERTS_BACKWARD computes: bits of its attrs.i[2]. Its
 * packed f32 result holds the wanted parts in this order. */
enum {
    TS_MOE_WANT_X = 1,
    TS_MOE_WANT_W = 2,
    TS_MOE_WANT_GATE = 4,
    TS_MOE_WANT_UP = 8,
    TS_MOE_WANT_DOWN = 16
};

/* Attributes: small integer list (dims, shape, perm, ...) and scalars. */
typedef struct {
    int64_t i[2 * TS_MAX_DIMS];
    int ni;
    double f[4];
    ts_dtype dtype;
} ts_attrs;

/* Geometry of an output or saved tensor, filled by the shape rule. */
typedef struct {
    ts_dtype dtype;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    int64_t strides[TS_MAX_DIMS]; /* views only */
    int64_t offset;               /* views only */
} ts_desc;

typedef struct ts_node {
    int refcount;
    ts_op_id op;
    int n_in;
    ts_tensor *in[TS_MAX_INPUTS]; /* strong references */
    int n_saved;
    ts_tensor *saved[TS_MAX_SAVED]; /* extra kernel outputs kept for
                                       backward (lse, rstd); strong */
    ts_attrs attrs;
    ts_tensor *out;      /* weak: cleared when out dies */
    ts_tensor *grad_acc; /* during backward only */
    int visit;           /* traversal mark (autograd's topological sort) */
    int live_visit;      /* the compiler's liveness walk: its own mark, as
                            it may run in the middle of a backward */
    /* compiled mode: the node is recorded, its output computed later */
    ts_storage *out_st; /* strong: where the result goes */
    ts_desc out_desc;
    ts_desc saved_desc[TS_MAX_SAVED];
} ts_node;

/* Shape rule: fills the output descriptor (and saved descriptors), or
 * records an error naming the op, the operand and the shapes. */
typedef ts_status (*ts_infer_fn)(ts_ctx *ctx, const ts_node *n, ts_desc *out,
                                 ts_desc *saved, int *n_saved);
/* Backward rule: given d(out), writes a new reference (or NULL when no
 * gradient) for each input i with want[i]. Runs with grad mode off, built
 * from the public ops so that the compiled mode can capture it too. */
typedef ts_status (*ts_backward_fn)(ts_ctx *ctx, const ts_node *n,
                                    ts_tensor *gout, const bool *want,
                                    ts_tensor **gin);

/* Accumulation rule: adds the gradient of input i for d(out) = gout into
 * acc in place (a leaf's f32 contiguous .grad that nothing else holds),
 * where that is cheaper than making the gradient and adding it (an
 * embedding: a few rows of a large table). Built from the ops, as
 * backward rules are. */
typedef ts_status (*ts_accumulate_fn)(ts_ctx *ctx, const ts_node *n,
                                      ts_tensor *gout, int i, ts_tensor *acc);

typedef struct {
    const char *name;
    bool is_view;
    bool in_place; /* writes into its inputs' memory; no new output */
    ts_infer_fn infer;
    ts_backward_fn backward;     /* NULL: no gradient flows through */
    ts_accumulate_fn accumulate; /* NULL: backward's gradient is added */
} ts_op_def;

extern const ts_op_def ts_op_table[TS_OP_COUNT];

/* Builds a node for op over the inputs and runs it (eager). Returns a new
 * reference, or NULL with the error recorded. NULL inputs propagate. */
ts_tensor *ts_op_call(ts_ctx *ctx, ts_op_id op, int n_in, ts_tensor **in,
                      const ts_attrs *attrs);
/* A fused group of elementwise nodes (the compiler's fusion pass): the
 * members run in order on f32 registers of one chunk at a time and the
 * last one writes out; nothing in between touches memory. arg[m][k] is
 * member m's input k: >= 0 an outside tensor ext[...], < 0 member
 * -(arg + 1). */
#define TS_FUSE_MAX     16
#define TS_FUSE_MAX_EXT 11
typedef struct ts_fused {
    int n_members;
    const ts_node *members[TS_FUSE_MAX];
    int arg[TS_FUSE_MAX][3];
    int n_ext;
    ts_tensor *ext[TS_FUSE_MAX_EXT];
    ts_tensor *out;
    /* matmul epilogue: a matmul whose result only this group reads, given
     * to the group as ext[head_ext]; computed panel by panel, each panel
     * consumed while it is in cache, never stored whole */
    const ts_node *head;
    int head_ext;
} ts_fused;

/* Compiled mode: appends n to the recorded graph (takes a reference). */
ts_status ts_trace_append(ts_ctx *ctx, ts_node *n);

/* The context of the first non-NULL input; NULL when all are NULL. */
ts_ctx *ts_ctx_of(int n, ts_tensor **in);

/* Helpers shared by shape rules and backward rules. */
ts_status ts_broadcast_shapes(ts_ctx *ctx, const char *op, int na,
                              const int64_t *a, int nb, const int64_t *b,
                              int *nout, int64_t *out);
/* Strides (elements) for reading t as if broadcast to (ndim, shape). */
void ts_broadcast_strides(const ts_tensor *t, int ndim, const int64_t *shape,
                          int64_t *strides);
/* Sums g down to (ndim, shape) (the reverse of broadcasting). */
ts_tensor *ts_sum_to_shape(ts_tensor *g, int ndim, const int64_t *shape);

#endif
