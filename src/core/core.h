/* core.h — internal layout of the core objects: context, storage, tensor,
 * and the caching allocator. Shared by every layer inside the library; never
 * installed. Must not include anything from ops, backends or graph. */
#ifndef TS_CORE_H
#define TS_CORE_H

#include "tessera.h"

#include <stdarg.h>
#include <stdlib.h>

struct ts_node;
struct ts_fused;

/* A device backend: memory and kernels behind one small vtable. The CPU
 * and Vulkan backends fill it (src/backend/); nothing outside src/backend/
 * sees more of a backend than this. Memory is named by a pointer that only
 * the backend may dereference (on the CPU a host address, on Vulkan a
 * device address); dev is the device's index within its kind. */
typedef struct ts_backend {
    const char *name;
    ts_device_kind kind;
    /* NULL with the error set when the device is full (TS_ERR_OOM naming
     * the bytes asked and free) or missing */
    void *(*alloc)(ts_ctx *ctx, int dev, size_t bytes);
    void (*free)(ts_ctx *ctx, int dev, void *p, size_t bytes);
    /* bytes between two buffers of the same device (queued, in order) */
    ts_status (*copy)(ts_ctx *ctx, int dev, void *dst, const void *src,
                      size_t bytes);
    /* host memory to the device (queued after earlier work) and back (waits
     * for the work that writes src) */
    ts_status (*upload)(ts_ctx *ctx, int dev, void *dst, const void *host,
                        size_t bytes);
    ts_status (*download)(ts_ctx *ctx, int dev, void *host, const void *src,
                          size_t bytes);
    /* count elements of elem_bytes set to the bytes at pattern */
    ts_status (*fill)(ts_ctx *ctx, int dev, void *dst, size_t count,
                      const void *pattern, size_t elem_bytes);
    ts_status (*run_node)(ts_ctx *ctx, struct ts_node *n);
    /* waits for every queued kernel of the device */
    ts_status (*sync)(ts_ctx *ctx, int dev);
    /* fusion: which ops this backend can run inside a fused group */
    bool (*fusable)(int op);
    ts_status (*run_fused)(ts_ctx *ctx, const struct ts_fused *f);
    /* constant folding: a fusable op on one element of each input (host
     * arithmetic, the CPU's; NULL: the CPU backend's is used) */
    float (*eval_scalar)(const struct ts_node *n, const float *args);
    /* compiled mode (NULL: not offered): a plan's kernels on device dev as
     * one recorded unit, replayed on later calls with the same shapes (the
     * analogue of CUDA graphs). graph_begin runs before the plan's kernels
     * and graph_end after (ok: they all succeeded); *handle is the plan's,
     * NULL at first, kept between calls, released by graph_free. */
    ts_status (*graph_begin)(ts_ctx *ctx, int dev, void **handle);
    ts_status (*graph_end)(ts_ctx *ctx, int dev, void *handle, bool ok);
    void (*graph_free)(void *handle);
    /* devices of this kind (0 with the reason in the error when none) */
    int (*count)(ts_ctx *ctx);
    ts_status (*info)(ts_ctx *ctx, int dev, ts_device_info *out);
    /* the context is going away: release the backend's state */
    void (*ctx_free)(ts_ctx *ctx);
    /* b is the right operand of products x @ b to come (a weight seen
     * transposed, (K, N)): its storage gets the backend's packed copy for
     * it now (ts_storage.packed; any other packed copy replaced). TS_OK
     * also when the backend has no layout for it (b's dtype, the ISA level
     * in use); TS_ERR_OOM when the copy does not fit. NULL: none. */
    ts_status (*prepack)(ts_ctx *ctx, ts_tensor *b);
} ts_backend;

/* The backend of a device kind; NULL when this build has none. */
const ts_backend *ts_backend_of(ts_device_kind kind);
/* The backend that runs (or holds) a storage / a node. */
#define ts_storage_backend(s) ts_backend_of((s)->device.kind)
/* true when s's data is host memory the caller may read and write */
#define ts_storage_on_host(s) ((s)->device.kind == TS_DEVICE_CPU)

/* Size-class caching allocator: freed blocks go to a free list per size
 * class and are handed out again before asking the system. */
#define TS_ALLOC_CLASSES 96
typedef struct ts_free_block {
    struct ts_free_block *next;
    size_t bytes;
} ts_free_block;

typedef struct {
    ts_free_block *free_lists[TS_ALLOC_CLASSES];
    bool no_cache;
    ts_alloc_stats stats;
} ts_allocator;

struct ts_trace; /* the recorded graph (src/graph/compile.c) */

struct ts_ctx {
    ts_status status;
    char errmsg[1024];
    int num_threads;
    bool grad_enabled;
    ts_allocator alloc;
    ts_device device; /* where new tensors go (ts_set_device) */
    ts_device_stats dev_stats[TS_DEVICE_KINDS][TS_MAX_DEVICES];
    void *backend_state[TS_DEVICE_KINDS]; /* owned by each backend */
    ts_mode mode;
    bool force_eager;
    bool syncing;
    struct ts_trace *trace;
    ts_compile_stats cstats;
    /* ts_set_grad_ready_hook's */
    ts_grad_ready_fn grad_ready;
    void *grad_ready_arg;
    /* TS_PROFILE=1: time and calls per op kernel, printed at ctx free */
    bool profile;
#define TS_PROFILE_SLOTS 96 /* >= the number of ops (checked in node.c) */
    double prof_seconds[TS_PROFILE_SLOTS];
    uint64_t prof_calls[TS_PROFILE_SLOTS];
};

/* Runs n's kernel on the backend, timing it when profiling. */
struct ts_node;
ts_status ts_run_kernel(ts_ctx *ctx, struct ts_node *n);

typedef struct ts_storage {
    int refcount;
    void *data;
    size_t bytes;
    ts_device device;
    ts_ctx *ctx;
    bool external;  /* data not owned (not freed on release) */
    size_t counted; /* bytes in its device's stats (allocated or mapped) */
    /* external data kept alive by an owner (a file mapping): released with
     * the storage */
    void *owner;
    void (*owner_release)(void *owner);
    bool pending; /* compiled mode: data not computed (nor allocated) yet */
    int pending_writes; /* compiled mode: recorded in-place writes to it */
    bool uniform;       /* every element holds uniform_value (made by
                           ts_full/ts_zeros/ts_scalar, not written since):
                           a constant the compiler may fold */
    double uniform_value;
    int scratch; /* used by the compiler while it plans a graph */
    int scratch2;
    /* a device storage that came from the host whole and small (a paged
     * attention's block tables): the host's bytes, so that shape rules
     * read it without waiting on the device; dropped at the first write */
    void *shadow;
    /* a weight's copy in a kernel's layout (the CPU's bf16 GEMM packs a
     * matrix seen as W^T, cpu_bf16_pack_b), made by its backend at the
     * first product when pack_wanted is set (ts_decoder_prepack sets it),
     * or at once by ts_backend.prepack; packed_bytes is its size, and
     * packed_free releases it. It goes (ts_storage_drop_packed) whenever
     * the data may change, and with the storage; pack_wanted stays, so
     * the next product packs the new values. No lock: made and dropped by
     * the thread running the context's ops. */
    bool pack_wanted;
    void *packed;
    size_t packed_bytes;
    void (*packed_free)(void *packed);
} ts_storage;
/* s's data may change: its packed copy goes */
static inline void ts_storage_drop_packed(ts_storage *s) {
    if (s->packed) {
        s->packed_free(s->packed);
        s->packed = NULL;
        s->packed_bytes = 0;
    }
}
/* s is about to be written (by a kernel or the host): its shadow and its
 * packed copy go */
static inline void ts_storage_written(ts_storage *s) {
    if (s->shadow) {
        free(s->shadow);
        s->shadow = NULL;
    }
    ts_storage_drop_packed(s);
}

struct ts_tensor {
    int refcount;
    ts_ctx *ctx;
    ts_dtype dtype;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    int64_t strides[TS_MAX_DIMS]; /* elements */
    int64_t offset;               /* elements from storage->data */
    ts_storage *storage;
    bool requires_grad;
    ts_tensor *grad;         /* accumulated gradient (leaves) */
    struct ts_node *grad_fn; /* the node that made this tensor, when it
                                needs a gradient; strong reference */
    int scratch;             /* used by the compiler while it plans */
    int grad_pending;        /* backward: edges yet to add to .grad (a leaf) */
    bool inner_leaf; /* made by autograd (a checkpoint's input): no hook */
};

/* Errors: record status + formatted message on the context; return NULL /
 * status so call sites can `return ts_fail(...)`. */

/* Allocator (host memory, 64-byte aligned). */
void *ts_alloc_bytes(ts_ctx *ctx, size_t bytes);
void ts_free_bytes(ts_ctx *ctx, void *p, size_t bytes);
void ts_allocator_destroy(ts_allocator *a);

/* Storage references (compiled mode keeps outputs' storage alive). */
void ts_storage_retain(ts_storage *s);
void ts_storage_release(ts_storage *s);
/* Compiled mode: runs the recorded graph when t's data is not computed. */
ts_status ts_materialize(ts_tensor *t);
void ts_trace_destroy(ts_ctx *ctx);

/* Tensors. */
int64_t ts_shape_numel(int ndim, const int64_t *shape);
void ts_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
/* A new contiguous tensor with fresh (uninitialized) storage. */
ts_tensor *ts_tensor_new(ts_ctx *ctx, ts_dtype dt, int ndim,
                         const int64_t *shape);
/* A tensor over memory the caller owns (host, contiguous); owner_release
 * (may be NULL) is called with owner when the storage dies. */
ts_tensor *ts_tensor_wrap(ts_ctx *ctx, ts_dtype dt, int ndim,
                          const int64_t *shape, void *data, void *owner,
                          void (*owner_release)(void *));
/* A new contiguous tensor on cpu:0 whatever the current device (data the
 * host makes: random numbers, ranges, tables), then moved to the current
 * device (host released; NULL on failure). */
ts_tensor *ts_tensor_new_host(ts_ctx *ctx, ts_dtype dt, int ndim,
                              const int64_t *shape);
ts_tensor *ts_tensor_to_current(ts_ctx *ctx, ts_tensor *host);
/* t itself when its data is on the host, else a host copy (new ref) */
ts_tensor *ts_host_copy(ts_tensor *t);
/* A tensor whose storage is allocated later (compiled mode). */
ts_tensor *ts_tensor_new_pending(ts_ctx *ctx, ts_dtype dt, int ndim,
                                 const int64_t *shape);
/* A new tensor header viewing base's storage with the given geometry. */
ts_tensor *ts_tensor_view_of(ts_tensor *base, int ndim, const int64_t *shape,
                             const int64_t *strides, int64_t offset);
/* The first element's address; a block format's offset is whole blocks. */
static inline char *ts_tensor_ptr(const ts_tensor *t) {
    size_t es = ts_dtype_size(t->dtype);
    return (char *)t->storage->data +
           (es ? (size_t)t->offset * es
               : (size_t)ts_dtype_nbytes(t->dtype, t->offset));
}
bool ts_shape_equal(int na, const int64_t *a, int nb, const int64_t *b);
/* "[2, 3, 4]" into buf. */
const char *ts_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);
/* Normalizes a possibly negative dim against ndim; -1 when out of range. */
int ts_norm_dim(int dim, int ndim);

/* Element conversion helpers for kernels. */
static inline float ts_load_f32(const void *p, ts_dtype dt) {
    switch (dt) {
    case TS_F32:
        return *(const float *)p;
    case TS_BF16:
        return ts_bf16_to_f32(*(const uint16_t *)p);
    case TS_F16:
        return ts_f16_to_f32(*(const uint16_t *)p);
    case TS_I32:
        return (float)*(const int32_t *)p;
    case TS_I64:
        return (float)*(const int64_t *)p;
    default:
        return 0.0f;
    }
}
static inline void ts_store_f32(void *p, ts_dtype dt, float v) {
    switch (dt) {
    case TS_F32:
        *(float *)p = v;
        break;
    case TS_BF16:
        *(uint16_t *)p = ts_f32_to_bf16(v);
        break;
    case TS_F16:
        *(uint16_t *)p = ts_f32_to_f16(v);
        break;
    case TS_I32:
        *(int32_t *)p = (int32_t)v;
        break;
    case TS_I64:
        *(int64_t *)p = (int64_t)v;
        break;
    default:
        break;
    }
}
double ts_load_f64(const void *p, ts_dtype dt);
void ts_store_f64(void *p, ts_dtype dt, double v);

/* Drops one reference to a node (defined by the graph layer, which owns
 * node lifetime); called when a tensor holding it as grad_fn dies. */
void ts_node_release(struct ts_node *n);
void ts_node_forget_out(struct ts_node *n, const ts_tensor *out);

/* path itself, or path/name when path is a folder (model folders hold
 * config.json, tokenizer.json ...); into buf of n bytes. */
const char *ts_file_in(const char *path, const char *name, char *buf, size_t n);

/* Files written whole or not at all (atomic_file.c): open a temporary
 * beside path, write, then commit (fsync, rename over path) or abandon
 * (keep false). err holds the errno of the first failure. */
typedef struct {
    int fd, err;
    bool ok;
    char path[4096], tmp[4200];
} ts_atomic_file;
bool ts_atomic_open(ts_atomic_file *f, const char *path);
bool ts_atomic_write(ts_atomic_file *f, const void *p, size_t n);
bool ts_atomic_commit(ts_atomic_file *f, bool keep);
/* from's bytes to `to`, atomically (ts_atomic_*); an error names the file */
ts_status ts_copy_file(ts_ctx *ctx, const char *from, const char *to);

/* Threading: Tessera's own pool (threadpool.c). ts_threads_apply sets the
 * threads that take part in each loop (the caller included). */
void ts_threads_apply(int n);
int ts_threads_count(void);
/* threads this process may run on (its affinity mask) */
int ts_default_threads(void);
/* true inside a chunk run by the pool: a nested loop runs serially */
bool ts_in_parallel(void);
/* fn(arg, c) for every c in [0, nchunks), chunks spread over the pool's
 * threads; returns when all are done. The chunk-to-index map is fixed, so
 * per-chunk partial results combine in the same order every time. */
typedef void (*ts_chunk_fn)(void *arg, int64_t chunk);
void ts_parallel_chunks(int64_t nchunks, ts_chunk_fn fn, void *arg);
/* fn(arg, begin, end) over [0, n) cut into ranges of at least grain items
 * (a few per thread); a loop with n < 2 * grain runs on the caller alone. */
typedef void (*ts_range_fn)(void *arg, int64_t begin, int64_t end);
void ts_parallel_for(int64_t n, int64_t grain, ts_range_fn fn, void *arg);
/* OpenBLAS held to one thread a call (once; every context does it, so a
 * BLAS call anywhere never wakes OpenBLAS's own threads) */
void ts_blas_init(void);
/* row-major C = alpha op(A) op(B) + beta C, OpenBLAS's serial sgemm on
 * slices of C run by the pool (blas.c) */
void ts_sgemm(bool ta, bool tb, int M, int N, int K, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta,
              float *C, int ldc);

#endif
