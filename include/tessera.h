/* tessera.h — the public C API of Tessera.
 *
 * Owns: the opaque handles (ts_ctx, ts_tensor), status codes, dtypes, tensor
 * creation and inspection, the op functions, and autograd entry points.
 * Nothing here exposes a struct layout; all state lives behind handles.
 *
 * Conventions
 * - Functions that can fail return ts_status; ts_errmsg(ctx) says why.
 * - Op functions (ts_add, ts_matmul, ...) return a NEW reference to a tensor,
 *   or NULL on error with the status and message recorded in the context
 *   (ts_ctx_status / ts_errmsg). A NULL input makes an op return NULL and keep
 *   the first error, so a chain of ops can be checked once at the end.
 * - Every tensor returned to you holds one reference: release it with
 *   ts_release. Ops keep their own references to what they need.
 * - Dimension letters used in comments: B batch, T query positions, S key
 *   positions, C channels, H query heads, KV key/value heads, D head dim,
 *   V vocabulary, N rows.
 */
#ifndef TESSERA_H
#define TESSERA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_MAX_DIMS 8

typedef enum {
    TS_OK = 0,
    TS_ERR_INVALID_ARG, /* a NULL handle, bad option, malformed argument */
    TS_ERR_SHAPE,       /* shapes that do not fit the op */
    TS_ERR_DTYPE,       /* a dtype the op does not take, or mismatched dtypes */
    TS_ERR_RANGE,       /* a dim, index or value out of range */
    TS_ERR_OOM,         /* an allocation failed */
    TS_ERR_IO,          /* a file could not be read or written */
    TS_ERR_STATE,       /* a call not valid in the current state */
    TS_ERR_UNSUPPORTED  /* valid input that this build cannot handle */
} ts_status;

typedef enum {
    TS_F32 = 0,
    TS_BF16,
    TS_F16,
    TS_I32,
    TS_I64,
    /* Quantized block formats with the layouts and semantics of llama.cpp's
     * (so GGUF files map as they are). A tensor of one holds whole blocks
     * along its last dim (a multiple of ts_dtype_block_elems) and is
     * contiguous; matmul (as a weight), embedding and ts_cast to a float
     * dtype take it. */
    TS_Q8_0, /* 32 elems: f16 d, 32 x int8           (34 bytes) */
    TS_Q4_0, /* 32 elems: f16 d, 16 bytes of nibbles (18 bytes), x = d (q - 8)
              */
    TS_Q4_K, /* 256 elems: f16 d, dmin, 12 bytes of 6-bit scales/mins, 128 qs */
    TS_Q5_K, /* 256 elems: as Q4_K plus 32 bytes of high bits (176 bytes) */
    TS_Q6_K, /* 256 elems: 128 ql, 64 qh, 16 int8 scales, f16 d (210 bytes) */
    TS_DTYPE_COUNT
} ts_dtype;

typedef enum {
    TS_DEVICE_CPU = 0,
    TS_DEVICE_VULKAN, /* a GPU (or Mesa's lavapipe) through Vulkan compute */
    TS_DEVICE_KINDS
} ts_device_kind;

/* A device: a kind and an index ("cpu:0", "vulkan:1"). Each has its own
 * memory and tensors move between devices only by ts_to_device. The CPU's
 * TS_MAX_DEVICES indices are separate memory pools of the host (accounted
 * apart, copied between explicitly), so that a model split across devices
 * runs and is tested the same way as on accelerators. vulkan:N is the N-th
 * device vkEnumeratePhysicalDevices lists (when the build has Vulkan). */
typedef struct {
    ts_device_kind kind;
    int index;
} ts_device;
#define TS_MAX_DEVICES 8

typedef struct ts_ctx ts_ctx;
typedef struct ts_tensor ts_tensor;

/* ---- the CPU's instruction sets ------------------------------------------ */

/* The CPU kernels are compiled for several x86 ISA levels and the level is
 * chosen at run time: "sse2" (baseline x86-64), "avx2" (+FMA, F16C),
 * "avx512" (F/BW/VL/DQ), "avx512_bf16" (+VNNI, BF16), "amx" (+AMX tiles).
 * ts_cpu_isa: the level in use (the machine's highest, or the one the
 * environment variable TS_CPU_ISA names, for tests and comparisons; one
 * the machine lacks makes ts_ctx_new fail with TS_ERR_UNSUPPORTED, the
 * reason on stderr). ts_cpu_isa_max: the machine's highest. */
const char *ts_cpu_isa(void);
const char *ts_cpu_isa_max(void);
/* The machine's features as cpuid and the OS report them, space-separated
 * ("sse2 avx avx2 fma f16c ... avx512_bf16"). */
void ts_cpu_features(char *buf, size_t cap);

/* ---- context ----------------------------------------------------------- */

typedef struct {
    int num_threads; /* 0: TS_NUM_THREADS from the environment, else cores */
    bool no_alloc_cache; /* true: every free goes back to the system */
} ts_ctx_options;

/* Creates a context; opt may be NULL for defaults. On failure *out is NULL. */
ts_status ts_ctx_new(ts_ctx **out, const ts_ctx_options *opt);
void ts_ctx_free(ts_ctx *ctx);
/* The message of the last error, "" when none. Valid until the next call. */
const char *ts_errmsg(const ts_ctx *ctx);
/* The status of the last error recorded (TS_OK when none). */
ts_status ts_ctx_status(const ts_ctx *ctx);
void ts_clear_error(ts_ctx *ctx);
/* Records an error (for layers built on this API); returns s. */
ts_status ts_set_error(ts_ctx *ctx, ts_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *ts_status_name(ts_status s);

int ts_get_num_threads(const ts_ctx *ctx);
ts_status ts_set_num_threads(ts_ctx *ctx, int n);

/* Allocator statistics, in bytes; counts are of calls. */
typedef struct {
    size_t bytes_in_use; /* held by live storages */
    size_t peak_bytes_in_use;
    size_t bytes_cached;    /* freed, kept for reuse */
    uint64_t system_allocs; /* calls that reached the system allocator */
    uint64_t cache_hits;    /* allocations served from the cache */
} ts_alloc_stats;
void ts_alloc_get_stats(const ts_ctx *ctx, ts_alloc_stats *out);
void ts_alloc_reset_peak(ts_ctx *ctx);
/* Returns cached blocks to the system. */
void ts_alloc_empty_cache(ts_ctx *ctx);

/* ---- devices -------------------------------------------------------------
 * New tensors (zeros, from_data, loaded weights) go to the current device;
 * an op's output goes where its inputs are, and inputs on different
 * devices are an error that names both. */
ts_status ts_set_device(ts_ctx *ctx, ts_device d);
ts_device ts_get_device(const ts_ctx *ctx);
/* "cpu", "cpu:N", "vulkan" (vulkan:0) or "vulkan:N"; an unknown kind or
 * index, or a Vulkan device this machine lacks, is an error naming the
 * devices there are. */
ts_status ts_device_parse(ts_ctx *ctx, const char *s, ts_device *out);
/* "cpu:1" into buf (at least 16 bytes); returns buf */
const char *ts_device_name(ts_device d, char *buf);
bool ts_device_equal(ts_device a, ts_device b);
/* A copy of t in d's memory (a new reference to t when t is there). Not
 * differentiable: an explicit transfer, counted in the device stats. */
ts_tensor *ts_to_device(ts_tensor *t, ts_device d);
typedef struct {
    size_t bytes_in_use; /* storages placed on the device */
    size_t peak_bytes_in_use;
    uint64_t transfers_in; /* ts_to_device copies into the device */
    size_t bytes_in;
} ts_device_stats;
void ts_device_get_stats(const ts_ctx *ctx, ts_device d, ts_device_stats *out);
/* How many devices of a kind this process can use: TS_MAX_DEVICES CPU
 * pools; the Vulkan devices found (0 when the build has no Vulkan or the
 * machine no driver or device: ts_errmsg then says which). */
int ts_device_count(ts_ctx *ctx, ts_device_kind kind);
/* What `tessera devices` prints for one device. */
typedef struct {
    char name[256];     /* "llvmpipe (LLVM 15.0.6, 256 bits)", the CPU model */
    char driver[128];   /* driver name and version; "" for the CPU */
    char type[32];      /* "cpu", "discrete-gpu", "integrated-gpu", ... */
    size_t total_bytes; /* device-local memory (the host's RAM for the CPU) */
    size_t free_bytes;  /* as the driver reports it (budget), else total */
    char features[512]; /* space-separated: bf16 coopmat subgroup=32 ... */
} ts_device_info;
ts_status ts_device_info_get(ts_ctx *ctx, ts_device d, ts_device_info *out);
/* Waits until every kernel queued on d has finished (a no-op on the CPU);
 * reports a device error (lost device) as TS_ERR_STATE. */
ts_status ts_device_sync(ts_ctx *ctx, ts_device d);

/* device_map: where each part of a decoder lives, as Hugging Face's
 * device_map places modules. Strings: "cpu" (or any one device: all
 * there: "vulkan:0"), "auto" (the GPU first, the rest on the host: see
 * ts_device_map_auto; a model load gives it the model's sizes), or groups
 * "ITEMS:DEVICE" joined by ';', where ITEMS is a comma-separated list of
 * `embed`, `head` (final norm + LM head), a layer N or a range N-M, e.g.
 * "embed,0-13:cpu:0;14-27,head:cpu:1". Every layer, the embedding and the head
 * must be placed exactly once. */
typedef struct {
    ts_device embed, head;
    int n_layers;
    ts_device *layer; /* n_layers entries, owned */
} ts_device_map;
ts_status ts_device_map_parse(ts_ctx *ctx, const char *spec, int n_layers,
                              ts_device_map *out);
void ts_device_map_free(ts_device_map *m);
/* "auto" for a model of n_layers layers of layer_bytes each and
 * other_bytes more (embedding, head, norms): the GPU (vulkan:0) first —
 * the embedding and as many leading layers as fit in 80% of its free
 * memory, the head too when every layer fits — the rest on cpu:0; all on
 * cpu:0 without a Vulkan device. Sizes 0: everything on the GPU. */
ts_status ts_device_map_auto(ts_ctx *ctx, int n_layers, size_t layer_bytes,
                             size_t other_bytes, ts_device_map *out);
/* number of distinct devices the map uses */
int ts_device_map_count(const ts_device_map *m);

/* ---- execution mode ----------------------------------------------------- */

/* EAGER runs each op at once. COMPILED records op calls into a graph that
 * runs, after dead-code elimination and memory planning, when a result is
 * read (ts_tensor_data, ts_tensor_read, ts_get, ts_item, ts_print) or at
 * ts_sync (torch_xla's mark_step). Compiled plans are cached by the graph's
 * structure, dtypes and shapes. TS_FORCE_EAGER=1 in the environment (or
 * ts_force_eager) keeps every context eager, to bisect a difference. */
typedef enum { TS_MODE_EAGER = 0, TS_MODE_COMPILED } ts_mode;
/* Returns the previous mode; switching to eager first runs what was
 * recorded. */
ts_mode ts_set_mode(ts_ctx *ctx, ts_mode mode);
ts_mode ts_get_mode(const ts_ctx *ctx);
void ts_force_eager(ts_ctx *ctx, bool on);
/* Runs everything recorded so far. */
ts_status ts_sync(ts_ctx *ctx);

typedef struct {
    uint64_t graphs_run;   /* syncs that had work */
    uint64_t compilations; /* plans built (cache misses) */
    uint64_t cache_hits;   /* plans replayed */
    uint64_t nodes_run;    /* in the last graph */
    uint64_t nodes_dead;   /* removed by dead-code elimination, last graph */
    uint64_t nodes_cse;    /* removed as common subexpressions, last graph */
    uint64_t outputs_in_place; /* written over a dying input, last graph */
    uint64_t nodes_fused;      /* run inside a later node's loop, last graph */
    uint64_t nodes_recomputed; /* run again for late readers, last graph */
    uint64_t nodes_folded; /* constants computed when planning, last graph */
    uint64_t patterns_rewritten; /* op-by-op math run as a fused kernel */
    uint64_t matmul_epilogues;   /* matmuls whose result a fused loop ate */
    size_t planned_peak_bytes;   /* last graph: arena + results kept after it */
    size_t arena_bytes;          /* last graph: intermediates' shared arena */
    size_t arena_lower_bound;    /* last graph: most intermediate bytes alive
                                    at one moment (no plan can beat it) */
    uint64_t device_replays;     /* plans a device ran from the command
                                    buffer it recorded at their first run */
} ts_compile_stats;
void ts_get_compile_stats(const ts_ctx *ctx, ts_compile_stats *out);

/* ---- dtypes ------------------------------------------------------------ */

const char *ts_dtype_name(ts_dtype dt);
size_t ts_dtype_size(ts_dtype dt);
bool ts_dtype_is_float(ts_dtype dt);
/* Block formats: elements per block and bytes per block (1 and the element
 * size for the others); ts_dtype_size is 0 for a block format. */
bool ts_dtype_is_quantized(ts_dtype dt);
int64_t ts_dtype_block_elems(ts_dtype dt);
size_t ts_dtype_block_bytes(ts_dtype dt);
/* Bytes that n elements take (n a multiple of the block size); -1 if not,
 * or on overflow. */
int64_t ts_dtype_nbytes(ts_dtype dt, int64_t n);
/* The dtype named "f32", "bf16", "q8_0", "q4_k", ... (case-insensitive);
 * TS_DTYPE_COUNT when none is. */
ts_dtype ts_dtype_from_name(const char *name);
/* Round to nearest even; NaN stays NaN (quiet), Inf stays Inf. */
uint16_t ts_f32_to_bf16(float x);
float ts_bf16_to_f32(uint16_t x);
uint16_t ts_f32_to_f16(float x);
float ts_f16_to_f32(uint16_t x);

/* ---- tensor creation ---------------------------------------------------- */

/* shape has ndim entries (0 <= ndim <= TS_MAX_DIMS); ndim 0 is a scalar. */
ts_tensor *ts_empty(ts_ctx *ctx, ts_dtype dt, int ndim, const int64_t *shape);
ts_tensor *ts_zeros(ts_ctx *ctx, ts_dtype dt, int ndim, const int64_t *shape);
ts_tensor *ts_full(ts_ctx *ctx, ts_dtype dt, int ndim, const int64_t *shape,
                   double value);
/* Copies numel elements of dtype dt from data (row-major). */
ts_tensor *ts_from_data(ts_ctx *ctx, ts_dtype dt, int ndim,
                        const int64_t *shape, const void *data);
ts_tensor *ts_scalar(ts_ctx *ctx, ts_dtype dt, double value);
/* [start, end) with step, as torch.arange. */
ts_tensor *ts_arange(ts_ctx *ctx, ts_dtype dt, double start, double end,
                     double step);
/* Normal(0, std) and Uniform[lo, hi) from a seeded generator (xoshiro256**);
 * the same seed gives the same values on every machine. */
ts_tensor *ts_randn(ts_ctx *ctx, ts_dtype dt, int ndim, const int64_t *shape,
                    double std, uint64_t seed);
ts_tensor *ts_rand(ts_ctx *ctx, ts_dtype dt, int ndim, const int64_t *shape,
                   double lo, double hi, uint64_t seed);

ts_tensor *ts_retain(ts_tensor *t);
void ts_release(ts_tensor *t); /* NULL is fine */

/* ---- tensor inspection -------------------------------------------------- */

ts_ctx *ts_tensor_ctx(const ts_tensor *t);
ts_dtype ts_tensor_dtype(const ts_tensor *t);
int ts_tensor_ndim(const ts_tensor *t);
const int64_t *ts_tensor_shape(const ts_tensor *t);
const int64_t *ts_tensor_strides(const ts_tensor *t); /* in elements */
/* Size of dim (negative counts from the end); -1 when out of range. */
int64_t ts_tensor_dim(const ts_tensor *t, int dim);
int64_t ts_tensor_numel(const ts_tensor *t);
bool ts_tensor_is_contiguous(const ts_tensor *t);
ts_device ts_tensor_device(const ts_tensor *t);
/* True when a and b are views of the same storage. */
bool ts_tensor_shares_storage(const ts_tensor *a, const ts_tensor *b);
/* Address of element [0,...,0] (host memory on the CPU device); NULL where
 * the data is not on the host. Reads through it see the strides above. */
void *ts_tensor_data(ts_tensor *t);
/* Copies the elements in row-major order to dst, converted to dst_dt. */
ts_status ts_tensor_read(ts_tensor *t, void *dst, ts_dtype dst_dt);
/* Element access for tests and debugging; idx has ndim entries. */
ts_status ts_get(ts_tensor *t, const int64_t *idx, double *out);
ts_status ts_set(ts_tensor *t, const int64_t *idx, double value);
/* The single element of a one-element tensor. */
ts_status ts_item(ts_tensor *t, double *out);
/* PyTorch-like text, summarized past 1000 elements (3 edge items). */
ts_status ts_print(ts_tensor *t, FILE *f);
/* Same text into a new malloc'd string; caller frees. NULL on error. */
char *ts_to_string(ts_tensor *t);

/* ---- DLPack (zero-copy exchange with PyTorch, NumPy, ...) --------------
 * The unversioned DLManagedTensor of dlpack.h (Debian's libdlpack-dev).
 * ts_to_dlpack: a new DLManagedTensor viewing t's host memory (t is
 * computed first in compiled mode; a tensor on another device is
 * TS_ERR_UNSUPPORTED); it holds a reference to t until the consumer calls
 * its deleter. ts_from_dlpack: a tensor viewing m's memory (host memory;
 * f32, bf16, f16, i32 or i64; any non-negative strides), which takes m
 * over: m's deleter runs when the last view of it dies. On failure (NULL,
 * the reason in ts_errmsg) m stays the caller's. */
struct DLManagedTensor;
ts_status ts_to_dlpack(ts_tensor *t, struct DLManagedTensor **out);
ts_tensor *ts_from_dlpack(ts_ctx *ctx, struct DLManagedTensor *m);

/* ---- autograd ----------------------------------------------------------- */

ts_status ts_set_requires_grad(ts_tensor *t, bool on); /* leaves only */
bool ts_requires_grad(const ts_tensor *t);
bool ts_is_leaf(const ts_tensor *t);
/* Borrowed reference to the accumulated gradient, NULL when none. */
ts_tensor *ts_grad(const ts_tensor *t);
void ts_zero_grad(ts_tensor *t); /* drops .grad, as set_to_none=True */
/* Backpropagates from root. grad may be NULL when root has one element
 * (seeded with 1). Gradients accumulate (+=) into the .grad of leaves that
 * require grad. The graph is kept, so backward may run again. */
ts_status ts_backward(ts_tensor *root, ts_tensor *grad);
/* A new tensor sharing data with t, cut from the graph. */
ts_tensor *ts_detach(ts_tensor *t);
/* Activation checkpointing (torch.utils.checkpoint). fn computes a block
 * from in[0] (the activation) and in[1..n-1] (other tensors it reads, e.g.
 * rotary tables), borrowing them, and returns a new reference; arg must
 * stay valid until backward. ts_checkpoint runs fn without recording a
 * graph, so the block's intermediates are not kept, and returns its result
 * tied to one node holding the inputs; backward recomputes fn with the
 * graph on and backpropagates through it: parameters fn uses get their
 * gradients then, in[0] its own. With grad mode off, just fn. */
typedef ts_tensor *(*ts_block_fn)(void *arg, int n, ts_tensor **in);
ts_tensor *ts_checkpoint(ts_block_fn fn, void *arg, int n, ts_tensor **in);
/* ... and done(arg) once backward has gone through the recomputed block
 * (its parameters' gradients complete), e.g. to reduce them at once. */
typedef ts_status (*ts_block_done_fn)(void *arg);
ts_tensor *ts_checkpoint_ex(ts_block_fn fn, ts_block_done_fn done, void *arg,
                            int n, ts_tensor **in);
/* fn(arg, leaf) once a backward pass has added its last contribution to
 * a leaf's .grad (torch's post-accumulate-grad hook, for all leaves of
 * ctx): after the last node that uses the leaf, also inside a
 * checkpointed block's recompute. The order is the backward's, the same
 * on every run of the same graph, so data-parallel training can reduce
 * gradients as they become final. An error from fn stops the backward.
 * fn NULL removes the hook. In compiled mode the gradient may still be
 * pending: reading it runs what was recorded. */
typedef ts_status (*ts_grad_ready_fn)(void *arg, ts_tensor *leaf);
void ts_set_grad_ready_hook(ts_ctx *ctx, ts_grad_ready_fn fn, void *arg);
/* Grad mode: while disabled, ops record no graph. Returns the old mode, to
 * pass back to ts_set_grad_enabled at the end of a no-grad scope. */
bool ts_set_grad_enabled(ts_ctx *ctx, bool enabled);
bool ts_is_grad_enabled(const ts_ctx *ctx);

/* ---- in-place updates (never recorded by autograd) ---------------------- */

/* dst[...] = src, broadcasting src to dst's shape, casting dtype. */
ts_status ts_copy_(ts_tensor *dst, ts_tensor *src);
ts_status ts_fill_(ts_tensor *dst, double value);
/* Fused AdamW (decoupled weight decay) on one parameter, in place:
 *   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= lr/bc1 * m / (sqrt(v / bc2) + eps)
 * m, v f32 of p's shape; hyper f32 [7] = {lr, b1, b2, eps, wd, bc1, bc2}
 * (a tensor, so a compiled step's plan does not change with the step), or
 * [8] with a gradient scale s last: g is read as s * g (a clipping
 * coefficient applied in the same pass). */
ts_status ts_adamw_update_(ts_tensor *p, ts_tensor *g, ts_tensor *m,
                           ts_tensor *v, ts_tensor *hyper);

/* ---- views (share storage; no copy) ------------------------------------- */

/* One entry of shape may be -1. A view when strides allow, else a copy. */
ts_tensor *ts_reshape(ts_tensor *x, int ndim, const int64_t *shape);
ts_tensor *ts_permute(ts_tensor *x, const int *perm);
ts_tensor *ts_transpose(ts_tensor *x, int d0, int d1);
/* Elements start, start+step, ... < end along dim; negative start/end count
 * from the end and are clamped as in Python; step >= 1. */
ts_tensor *ts_slice(ts_tensor *x, int dim, int64_t start, int64_t end,
                    int64_t step);
/* Broadcast to shape (size-1 dims stretch, new leading dims; -1 keeps). */
ts_tensor *ts_expand(ts_tensor *x, int ndim, const int64_t *shape);
ts_tensor *ts_squeeze(ts_tensor *x, int dim);
ts_tensor *ts_unsqueeze(ts_tensor *x, int dim);
/* x itself (a new reference) when already contiguous, else a copy. */
ts_tensor *ts_contiguous(ts_tensor *x);

/* ---- elementwise -------------------------------------------------------- */

/* Binary ops broadcast as NumPy does; both operands have the same float
 * dtype (f32, bf16, f16); bf16/f16 are computed in f32. */
ts_tensor *ts_add(ts_tensor *a, ts_tensor *b);
ts_tensor *ts_sub(ts_tensor *a, ts_tensor *b);
ts_tensor *ts_mul(ts_tensor *a, ts_tensor *b);
ts_tensor *ts_div(ts_tensor *a, ts_tensor *b);
ts_tensor *ts_add_scalar(ts_tensor *x, double s);
ts_tensor *ts_mul_scalar(ts_tensor *x, double s);
ts_tensor *ts_neg(ts_tensor *x);
ts_tensor *ts_exp(ts_tensor *x);
ts_tensor *ts_log(ts_tensor *x);
ts_tensor *ts_sqrt(ts_tensor *x);
ts_tensor *ts_rsqrt(ts_tensor *x);
ts_tensor *ts_abs(ts_tensor *x);
ts_tensor *ts_pow_scalar(ts_tensor *x, double exponent);
ts_tensor *ts_tanh(ts_tensor *x);
ts_tensor *ts_sigmoid(ts_tensor *x);
ts_tensor *ts_relu(ts_tensor *x);
ts_tensor *ts_silu(ts_tensor *x);
typedef enum { TS_GELU_ERF = 0, TS_GELU_TANH } ts_gelu_approx;
ts_tensor *ts_gelu(ts_tensor *x, ts_gelu_approx approx);
/* cond: any dtype, nonzero is true; a and b the same dtype. Broadcasts. */
ts_tensor *ts_where(ts_tensor *cond, ts_tensor *a, ts_tensor *b);
/* x where mask is zero, value where mask is nonzero. */
ts_tensor *ts_masked_fill(ts_tensor *x, ts_tensor *mask, double value);
ts_tensor *ts_cast(ts_tensor *x, ts_dtype dt);
/* A contiguous copy (torch.clone). */
ts_tensor *ts_copy(ts_tensor *x);

/* ---- reductions --------------------------------------------------------- */

/* Over the ndims dims listed (negative allowed); ndims == 0 reduces all. */
ts_tensor *ts_sum(ts_tensor *x, int ndims, const int *dims, bool keepdim);
ts_tensor *ts_mean(ts_tensor *x, int ndims, const int *dims, bool keepdim);
ts_tensor *ts_amax(ts_tensor *x, int ndims, const int *dims, bool keepdim);
/* Values of the max over one dim (torch.max(x, dim).values). */
ts_tensor *ts_max(ts_tensor *x, int dim, bool keepdim);
/* Index (i64) of the first max over one dim. */
ts_tensor *ts_argmax(ts_tensor *x, int dim, bool keepdim);
ts_tensor *ts_softmax(ts_tensor *x, int dim);
ts_tensor *ts_log_softmax(ts_tensor *x, int dim);

/* ---- linear algebra ----------------------------------------------------- */

/* torch.matmul: a (..., M, K) @ b (..., K, N) -> (..., M, N), batch dims
 * broadcast; 1-D operands as in NumPy. Transposed views are used without a
 * copy. f32 goes to the BLAS; bf16/f16 are accumulated in f32. */
ts_tensor *ts_matmul(ts_tensor *a, ts_tensor *b);

/* ---- indexing and shape ------------------------------------------------- */

/* weight (V, C), ids (...) of i32/i64 -> (..., C). */
ts_tensor *ts_embedding(ts_tensor *weight, ts_tensor *ids);
ts_tensor *ts_concat(int n, ts_tensor *const *xs, int dim);
/* Splits x along dim into n views of the given sizes (summing to the dim);
 * outs receives n new references. */
ts_status ts_split(ts_tensor *x, int dim, int n, const int64_t *sizes,
                   ts_tensor **outs);

/* ---- fused layers ------------------------------------------------------- */

/* Over the last dim C: x (..., C), weight (C) or NULL. */
ts_tensor *ts_rmsnorm(ts_tensor *x, ts_tensor *weight, double eps);
ts_tensor *ts_layernorm(ts_tensor *x, ts_tensor *weight, ts_tensor *bias,
                        double eps);
/* Rotary embedding, Hugging Face rotate-half layout:
 *   out = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x2, x1)
 * x (..., T, D); cos, sin (T, D) (broadcast over leading dims). No gradient
 * flows to cos and sin. */
ts_tensor *ts_rope(ts_tensor *x, ts_tensor *cos, ts_tensor *sin);
/* cos, sin tables (T, D) for positions pos0 .. pos0+T-1 with base theta,
 * inv_freq[i] = theta^(-2i/D), duplicated over the two halves (HF layout). */
ts_status ts_rope_tables(ts_ctx *ctx, int64_t T, int64_t D, double theta,
                         int64_t pos0, ts_tensor **cos, ts_tensor **sin);
/* Scaled dot-product attention, fused (online softmax; no T x S matrix).
 * q (B, H, T, D); k, v (B, KV, S, D) with H % KV == 0 (grouped-query).
 * mask: NULL or additive, broadcastable to (B, H, T, S).
 * causal: query t sees keys s <= t + (S - T) (the queries are the last T).
 * scale: <= 0 means 1/sqrt(D). No gradient flows to mask. The same as
 * ts_attention_ex with {causal, scale} and no window or softcap. */
ts_tensor *ts_attention(ts_tensor *q, ts_tensor *k, ts_tensor *v,
                        ts_tensor *mask, bool causal, double scale);
/* Attention over a paged KV cache, for serving: q (1, H, N, D) and the new
 * keys/values k, v (1, KV, N, D) of N tokens from several sequences;
 * k_pool, v_pool (blocks, KV, block_size, row): f32 or bf16 rows of D, or
 * i32 words of int8 rows ((D + 3) / 4 + 1 words: the values, then the
 * row's f32 scale; see ts_kv_dtype), f32 only off the CPU; meta (i32, 1-D):
 * n_seqs, max_blocks, seq_start[n_seqs + 1] (token ranges), ctx_len[n_seqs]
 * (positions cached before these tokens), block_table[n_seqs x max_blocks].
 * Writes the new keys/values into their blocks, then each token attends
 * causally to its own sequence. -> (1, H, N, D). It writes the pools in
 * place (in the compiled mode, when its node runs: the node always runs);
 * no gradient. scale <= 0: 1/sqrt(D). */
ts_tensor *ts_paged_attention(ts_tensor *q, ts_tensor *k, ts_tensor *v,
                              ts_tensor *k_pool, ts_tensor *v_pool,
                              ts_tensor *meta, double scale);
/* ts_attention with the options decoder families need; opts NULL: all
 * zero (not causal, scale 1/sqrt(D), no window, no softcap). Shapes, mask
 * and gradients as ts_attention's; the backward includes the softcap's
 * derivative. Key blocks that a query block cannot see (the causal future,
 * the positions before the window) are skipped, not computed and masked.
 * A negative window, a negative or non-finite softcap, or a non-finite
 * scale is TS_ERR_RANGE. */
typedef struct {
    bool causal;    /* as ts_attention's */
    double scale;   /* <= 0: 1/sqrt(D) */
    int64_t window; /* > 0: query t (at position p = t + S - T) sees only
                       the keys s with p - s < window, i.e. the last window
                       positions, itself included (Mistral's and Gemma's
                       sliding window, Hugging Face's kv_idx > q_idx -
                       sliding_window); with causal off the keys after p
                       stay visible; 0: no limit */
    double softcap; /* > 0: each score (after scale) becomes
                       softcap * tanh(score / softcap) before the mask and
                       the softmax (Gemma 2's attn_logit_softcapping); 0:
                       none */
} ts_attn_opts;
ts_tensor *ts_attention_ex(ts_tensor *q, ts_tensor *k, ts_tensor *v,
                           ts_tensor *mask, const ts_attn_opts *opts);
/* ts_paged_attention with opts (causal is implied, opts->causal is not
 * read; window and softcap as above, positions counted within each
 * sequence: token i of a sequence with ctx_len cached positions sits at
 * ctx_len + i); opts NULL: defaults. ts_paged_attention(..., scale) is
 * this with {.scale = scale}. */
ts_tensor *ts_paged_attention_ex(ts_tensor *q, ts_tensor *k, ts_tensor *v,
                                 ts_tensor *k_pool, ts_tensor *v_pool,
                                 ts_tensor *meta, const ts_attn_opts *opts);

/* ---- mixture of experts ------------------------------------------------- */

/* Indices (i64) of the k largest entries along the last dim, largest
 * first, ties to the lower index (torch.topk(x, k).indices); x (..., n)
 * float, 1 <= k <= n -> (..., k). No gradient. */
ts_tensor *ts_topk(ts_tensor *x, int64_t k);
/* torch.gather(x, dim, index): out[i][j] = x[i][index[i][j]] along dim
 * (dim 1 of a matrix here); x any dtype, index i32/i64 with x's number of
 * dims and sizes <= x's except along dim -> index's shape, x's dtype. An
 * index outside [0, x.shape[dim]) is TS_ERR_RANGE naming it (in compiled
 * mode when the graph runs). The gradient flows to x (scatter-added). */
ts_tensor *ts_gather(ts_tensor *x, int dim, ts_tensor *index);
/* idx (...) i32/i64 in [0, n) -> (..., n) f32 of 0 and 1; n >= 1. An
 * index outside is TS_ERR_RANGE. No gradient. */
ts_tensor *ts_one_hot(ts_tensor *idx, int64_t n);
/* The MLP activations of the decoder families. */
typedef enum { TS_ACT_SILU = 0, TS_ACT_GELU_TANH, TS_ACT_GELU } ts_act;
/* A sparse mixture-of-experts MLP, tokens grouped by expert (each
 * expert's rows gathered into one matrix product, not token by token):
 *   out[n] = sum_j w[n, j] * down_e(act(gate_e x[n]) * (up_e x[n])),
 *   e = idx[n, j]
 * x (N, C) f32; idx (N, k) i32/i64 in [0, E), or -1 for a slot that
 * routes nowhere (it adds nothing); w (N, k) f32 routing weights; gate,
 * up (E, F, C) and down (E, C, F), each f32 or bf16 (read as f32).
 * gate NULL: down_e(act(up_e x[n])). The activation is computed as
 * ts_silu / ts_gelu compute it. The k terms of a token are added in j
 * order: results do not depend on the thread count. Gradients flow to x,
 * w and the f32 weights (none to bf16 weights or idx). An idx entry
 * outside [-1, E) is TS_ERR_RANGE naming it (in compiled mode when the
 * graph runs). */
ts_tensor *ts_moe_experts(ts_tensor *x, ts_tensor *idx, ts_tensor *w,
                          ts_tensor *gate, ts_tensor *up, ts_tensor *down,
                          ts_act act);
typedef enum { TS_REDUCE_MEAN = 0, TS_REDUCE_SUM, TS_REDUCE_NONE } ts_reduction;
/* Fused log-softmax + negative log-likelihood. logits (N, V) float,
 * targets (N) i32/i64; rows whose target == ignore_index count for nothing
 * (mean divides by the rows not ignored). Result: scalar, or (N) for NONE. */
ts_tensor *ts_cross_entropy(ts_tensor *logits, ts_tensor *targets,
                            int64_t ignore_index, ts_reduction reduction);

/* ---- images: convolution, group norm, resampling ------------------------- */

/* Options of ts_conv2d; zeros mean the defaults (stride 1, dilation 1, one
 * group, no padding). Padding may differ per side (Diffusers' VAE pads
 * only the bottom and right before its stride-2 convolutions). */
typedef struct {
    int stride_h, stride_w;
    int pad_top, pad_bottom, pad_left, pad_right;
    int dilation_h, dilation_w;
    int groups;
} ts_conv2d_opts;
/* torch.nn.functional.conv2d: x (B, C, H, W), w (O, C / groups, KH, KW),
 * bias (O) or NULL -> (B, O, OH, OW), OH = (H + pad_top + pad_bottom -
 * dilation_h (KH - 1) - 1) / stride_h + 1 (OW alike). Float x and w (f32
 * or bf16 weights), f32 accumulation; opts NULL: the defaults. Gradients
 * flow to x, w and bias. */
ts_tensor *ts_conv2d(ts_tensor *x, ts_tensor *w, ts_tensor *bias,
                     const ts_conv2d_opts *opts);
/* torch.nn.functional.group_norm: x (B, C, *) float, C a multiple of
 * groups; mean and variance over each group's C / groups channels and all
 * positions; weight and bias (C) or NULL. */
ts_tensor *ts_group_norm(ts_tensor *x, int64_t groups, ts_tensor *weight,
                         ts_tensor *bias, double eps);
/* Nearest upsampling by integer factors (F.interpolate(mode="nearest",
 * scale_factor=...)): x (B, C, H, W) -> (B, C, H sh, W sw). */
ts_tensor *ts_upsample_nearest2d(ts_tensor *x, int scale_h, int scale_w);
/* F.avg_pool2d(x, (kh, kw), (sh, sw)) without padding: x (B, C, H, W) ->
 * (B, C, (H - kh) / sh + 1, (W - kw) / sw + 1). */
ts_tensor *ts_avg_pool2d(ts_tensor *x, int kernel_h, int kernel_w, int stride_h,
                         int stride_w);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_H */
