/* elementwise.c — CPU kernels for elementwise ops with broadcasting (binary,
 * unary, their backward), where, masked_fill, cast/copy, concat, slice
 * scatter and embedding gather/scatter-add. Inputs of any strides; outputs
 * are contiguous. bf16/f16 are converted to f32 in blocks and back. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/quant_gemm.h"
#include "core/quant.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 2048 /* elements per work item and per f32 staging buffer */

/* Reads n elements of operand k at p (stride s) as f32: the memory itself
 * when it is f32 with unit stride, else converted into buf. */
static const float *view_f32(const char *p, ts_dtype dt, int64_t s, int64_t n,
                             float *buf) {
    if (dt == TS_F32 && s == 1)
        return (const float *)p;
    cpu_gather_f32(buf, p, dt, s, n);
    return buf;
}

static void apply_binary(ts_op_id op, float *y, const float *a, const float *b,
                         int64_t n) {
    switch (op) {
    case TS_OP_ADD:
        for (int64_t i = 0; i < n; i++)
            y[i] = a[i] + b[i];
        break;
    case TS_OP_SUB:
        for (int64_t i = 0; i < n; i++)
            y[i] = a[i] - b[i];
        break;
    case TS_OP_MUL:
        for (int64_t i = 0; i < n; i++)
            y[i] = a[i] * b[i];
        break;
    case TS_OP_DIV:
        for (int64_t i = 0; i < n; i++)
            y[i] = a[i] / b[i];
        break;
    case TS_OP_EQ:
        for (int64_t i = 0; i < n; i++)
            y[i] = a[i] == b[i] ? 1.0f : 0.0f;
        break;
    default:
        break;
    }
}

/* fn over (out, in...) in CHUNK pieces (run_chunks, in parallel) */
typedef void (*chunk_fn)(const ts_node *n, float *y, const float **x,
                         int64_t len);

typedef struct {
    const ts_node *n;
    int nin;
    ts_tensor **ins;
    chunk_fn fn;
    const cpu_iter *itp;
    int64_t per_row;
    int64_t inner;
    int last;
    ts_tensor *out;
} run_chunk_items_args;

static void run_chunk_items(void *p_, int64_t lo_, int64_t hi_) {
    const run_chunk_items_args *a_ = p_;
    const ts_node *n = a_->n;
    int nin = a_->nin;
    ts_tensor **ins = a_->ins;
    chunk_fn fn = a_->fn;
    const cpu_iter *itp = a_->itp;
    int64_t per_row = a_->per_row;
    int64_t inner = a_->inner;
    int last = a_->last;
    ts_tensor *out = a_->out;
    for (int64_t w = lo_; w < hi_; w++) {
        float bufs[4][CHUNK];
        int64_t r = w / per_row, c0 = (w % per_row) * CHUNK;
        int64_t len = inner - c0 < CHUNK ? inner - c0 : CHUNK;
        int64_t off[CPU_ITER_MAX_OPS];
        cpu_iter_offsets(itp, r, off);
        const float *x[CPU_ITER_MAX_OPS - 1];
        for (int k = 0; k < nin; k++) {
            const ts_tensor *t = ins[k];
            int64_t s = itp->st[k + 1][last];
            const char *p =
                ts_tensor_ptr(t) +
                (off[k + 1] + c0 * s) * (int64_t)ts_dtype_size(t->dtype);
            x[k] = view_f32(p, t->dtype, s, len, bufs[k + 1]);
        }
        char *yp = ts_tensor_ptr(out) +
                   (off[0] + c0) * (int64_t)ts_dtype_size(out->dtype);
        float *y = out->dtype == TS_F32 ? (float *)yp : bufs[0];
        fn(n, y, x, len);
        if (out->dtype != TS_F32)
            cpu_scatter_f32(yp, out->dtype, 1, y, len);
    }
}

static void run_chunks(ts_node *n, int nin, ts_tensor **ins, chunk_fn fn) {
    ts_tensor *out = n->out;
    int64_t st[CPU_ITER_MAX_OPS][TS_MAX_DIMS];
    memcpy(st[0], out->strides, sizeof st[0]);
    for (int k = 0; k < nin; k++)
        ts_broadcast_strides(ins[k], out->ndim, out->shape, st[k + 1]);
    cpu_iter it;
    cpu_iter_init(&it, out->ndim, out->shape, nin + 1, st);
    int64_t rows = cpu_iter_rows(&it), inner = cpu_iter_inner(&it);
    int64_t per_row = (inner + CHUNK - 1) / CHUNK;
    int64_t items = rows * per_row;
    int last = it.ndim - 1;
    run_chunk_items_args job = {n,       nin,   ins,  fn, &it,
                                per_row, inner, last, out};
    ts_parallel_for(items, cpu_grain(CHUNK, 16384), run_chunk_items, &job);
}

static void binary_chunk(const ts_node *n, float *y, const float **x,
                         int64_t len) {
    apply_binary(n->op, y, x[0], x[1], len);
}

CPU_KERNEL(binary) {
    (void)ctx;
    run_chunks(n, 2, n->in, binary_chunk);
    return TS_OK;
}

static void unary_chunk(const ts_node *n, float *y, const float **xs,
                        int64_t len) {
    const float *x = xs[0];
    float f = (float)n->attrs.f[0];
    switch (n->op) {
    case TS_OP_ADD_SCALAR:
        for (int64_t i = 0; i < len; i++)
            y[i] = x[i] + f;
        break;
    case TS_OP_MUL_SCALAR:
        for (int64_t i = 0; i < len; i++)
            y[i] = x[i] * f;
        break;
    case TS_OP_NEG:
        for (int64_t i = 0; i < len; i++)
            y[i] = -x[i];
        break;
    case TS_OP_EXP:
        for (int64_t i = 0; i < len; i++)
            y[i] = expf(x[i]);
        break;
    case TS_OP_LOG:
        for (int64_t i = 0; i < len; i++)
            y[i] = logf(x[i]);
        break;
    case TS_OP_SQRT:
        for (int64_t i = 0; i < len; i++)
            y[i] = sqrtf(x[i]);
        break;
    case TS_OP_RSQRT:
        for (int64_t i = 0; i < len; i++)
            y[i] = 1.0f / sqrtf(x[i]);
        break;
    case TS_OP_ABS:
        for (int64_t i = 0; i < len; i++)
            y[i] = fabsf(x[i]);
        break;
    case TS_OP_POW_SCALAR:
        for (int64_t i = 0; i < len; i++)
            y[i] = powf(x[i], f);
        break;
    case TS_OP_TANH:
        for (int64_t i = 0; i < len; i++)
            y[i] = tanhf(x[i]);
        break;
    case TS_OP_SIGMOID:
        for (int64_t i = 0; i < len; i++)
            y[i] = 1.0f / (1.0f + expf(-x[i]));
        break;
    case TS_OP_RELU:
        for (int64_t i = 0; i < len; i++)
            y[i] = x[i] > 0 ? x[i] : 0.0f;
        break;
    case TS_OP_SILU:
        cpu_silu(y, x, len);
        break;
    case TS_OP_GELU:
        if (n->attrs.i[0] == TS_GELU_TANH)
            cpu_gelu_tanh(y, x, len);
        else
            for (int64_t i = 0; i < len; i++)
                y[i] = cpu_gelu_erf(x[i]);
        break;
    default:
        break;
    }
}

CPU_KERNEL(unary) {
    (void)ctx;
    run_chunks(n, 1, n->in, unary_chunk);
    return TS_OK;
}

/* dx from (g, x, out) for the forward op stored in attrs.i[8] */
static void unary_bwd_chunk(const ts_node *n, float *y, const float **xs,
                            int64_t len) {
    const float *g = xs[0], *x = xs[1], *o = xs[2];
    float f = (float)n->attrs.f[0];
    switch ((ts_op_id)n->attrs.i[8]) {
    case TS_OP_EXP:
        for (int64_t i = 0; i < len; i++)
            y[i] = g[i] * o[i];
        break;
    case TS_OP_LOG:
        for (int64_t i = 0; i < len; i++)
            y[i] = g[i] / x[i];
        break;
    case TS_OP_SQRT:
        for (int64_t i = 0; i < len; i++)
            y[i] = g[i] * 0.5f / o[i];
        break;
    case TS_OP_RSQRT:
        for (int64_t i = 0; i < len; i++)
            y[i] = -0.5f * g[i] * o[i] * o[i] * o[i];
        break;
    case TS_OP_ABS:
        for (int64_t i = 0; i < len; i++)
            y[i] = x[i] > 0 ? g[i] : x[i] < 0 ? -g[i] : 0.0f;
        break;
    case TS_OP_POW_SCALAR:
        for (int64_t i = 0; i < len; i++)
            y[i] = f == 0 ? 0.0f : g[i] * f * powf(x[i], f - 1.0f);
        break;
    case TS_OP_TANH:
        for (int64_t i = 0; i < len; i++)
            y[i] = g[i] * (1.0f - o[i] * o[i]);
        break;
    case TS_OP_SIGMOID:
        for (int64_t i = 0; i < len; i++)
            y[i] = g[i] * o[i] * (1.0f - o[i]);
        break;
    case TS_OP_RELU:
        for (int64_t i = 0; i < len; i++)
            y[i] = x[i] > 0 ? g[i] : 0.0f;
        break;
    case TS_OP_SILU:
        for (int64_t i = 0; i < len; i++)
            y[i] = cpu_silu_bwd(g[i], x[i]);
        break;
    case TS_OP_GELU:
        if (n->attrs.i[0] == TS_GELU_TANH) {
            cpu_gelu_tanh_bwd(y, g, x, len);
        } else {
            for (int64_t i = 0; i < len; i++)
                y[i] = g[i] * cpu_gelu_erf_grad(x[i]);
        }
        break;
    default:
        for (int64_t i = 0; i < len; i++)
            y[i] = NAN;
        break;
    }
}

CPU_KERNEL(unary_backward) {
    (void)ctx;
    run_chunks(n, 3, n->in, unary_bwd_chunk);
    return TS_OK;
}

/* where and masked_fill work on raw elements of any dtype */
static bool nonzero(const char *p, ts_dtype dt) {
    return ts_load_f64(p, dt) != 0;
}

typedef struct {
    ts_tensor **ins;
    const char *fill_value;
    const cpu_iter *itp;
    int64_t inner;
    int last;
    size_t es;
    ts_tensor *out;
} select_rows_args;

static void select_rows(void *p_, int64_t lo_, int64_t hi_) {
    const select_rows_args *a_ = p_;
    ts_tensor **ins = a_->ins;
    const char *fill_value = a_->fill_value;
    const cpu_iter *itp = a_->itp;
    int64_t inner = a_->inner;
    int last = a_->last;
    size_t es = a_->es;
    ts_tensor *out = a_->out;
    for (int64_t r = lo_; r < hi_; r++) {
        int64_t off[CPU_ITER_MAX_OPS];
        cpu_iter_offsets(itp, r, off);
        char *y = ts_tensor_ptr(out) + off[0] * (int64_t)es;
        for (int64_t i = 0; i < inner; i++) {
            const char *src;
            if (fill_value) { /* masked_fill: ins = {x, mask} */
                const ts_tensor *m = ins[1];
                const char *mp =
                    ts_tensor_ptr(m) + (off[2] + i * itp->st[2][last]) *
                                           (int64_t)ts_dtype_size(m->dtype);
                src = nonzero(mp, m->dtype)
                          ? fill_value
                          : ts_tensor_ptr(ins[0]) +
                                (off[1] + i * itp->st[1][last]) * (int64_t)es;
            } else { /* where: ins = {cond, a, b} */
                const ts_tensor *c = ins[0];
                const char *cp =
                    ts_tensor_ptr(c) + (off[1] + i * itp->st[1][last]) *
                                           (int64_t)ts_dtype_size(c->dtype);
                int k = nonzero(cp, c->dtype) ? 2 : 3;
                src = ts_tensor_ptr(ins[k - 1]) +
                      (off[k] + i * itp->st[k][last]) * (int64_t)es;
            }
            memcpy(y + i * (int64_t)es, src, es);
        }
    }
}

static void select_elems(ts_node *n, int nin, ts_tensor **ins,
                         const char *fill_value) {
    ts_tensor *out = n->out;
    int64_t st[CPU_ITER_MAX_OPS][TS_MAX_DIMS];
    memcpy(st[0], out->strides, sizeof st[0]);
    for (int k = 0; k < nin; k++)
        ts_broadcast_strides(ins[k], out->ndim, out->shape, st[k + 1]);
    cpu_iter it;
    cpu_iter_init(&it, out->ndim, out->shape, nin + 1, st);
    int64_t rows = cpu_iter_rows(&it), inner = cpu_iter_inner(&it);
    int last = it.ndim - 1;
    size_t es = ts_dtype_size(out->dtype);
    select_rows_args job = {ins, fill_value, &it, inner, last, es, out};
    ts_parallel_for(rows, cpu_grain(inner, 16384), select_rows, &job);
}

CPU_KERNEL(where) {
    (void)ctx;
    select_elems(n, 3, n->in, NULL);
    return TS_OK;
}

CPU_KERNEL(masked_fill) {
    (void)ctx;
    char value[8];
    ts_store_f64(value, n->out->dtype, n->attrs.f[0]);
    select_elems(n, 2, n->in, value);
    return TS_OK;
}

typedef struct {
    const ts_tensor *x;
    ts_tensor *y;
    const float *xf; /* x as contiguous f32 (quantizing) */
    int64_t C;
    atomic_int oom; /* a range's row buffer could not be had */
} block_copy_job;

/* rows [r0, r1) of a copy from or to a block format (both contiguous, or
 * x read through xf): dequantized, quantized, or copied as bytes */
static void block_copy_rows(void *p, int64_t r0, int64_t r1) {
    const block_copy_job *j = p;
    const ts_tensor *x = j->x;
    ts_tensor *y = j->y;
    int64_t C = j->C;
    bool xq = ts_dtype_is_quantized(x->dtype);
    int64_t xb = xq ? ts_dtype_nbytes(x->dtype, C) : 0,
            yb = ts_dtype_nbytes(y->dtype, C);
    bool need_row = xq && y->dtype != TS_F32 && y->dtype != x->dtype;
    float *row = need_row ? malloc(sizeof(float) * (size_t)C) : NULL;
    if (need_row && !row) {
        atomic_store(&((block_copy_job *)p)->oom, 1);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const char *src = ts_tensor_ptr(x) + r * xb;
        char *dst = ts_tensor_ptr(y) + r * yb;
        if (x->dtype == y->dtype)
            memcpy(dst, src, (size_t)yb);
        else if (!xq) /* quantize */
            ts_quantize_row(y->dtype, j->xf + r * C, dst, C);
        else if (y->dtype == TS_F32)
            cpu_dequant_rows(CPU_THIS_ISA, x->dtype, src, xb, 1, C,
                             (float *)dst);
        else if (row) { /* dequantize, then to bf16/f16/another format */
            cpu_dequant_rows(CPU_THIS_ISA, x->dtype, src, xb, 1, C, row);
            if (ts_dtype_is_quantized(y->dtype))
                ts_quantize_row(y->dtype, row, dst, C);
            else
                cpu_scatter_f32(dst, y->dtype, 1, row, C);
        }
    }
    free(row);
}

/* a copy or cast from or to a block format: x of a block format is
 * contiguous (ts_infer_cast says so), y is a new contiguous tensor */
static ts_status copy_blocks(ts_ctx *ctx, const ts_tensor *x, ts_tensor *y) {
    int64_t numel = ts_tensor_numel(y);
    int64_t C = y->ndim ? y->shape[y->ndim - 1] : 1;
    if (!numel)
        return TS_OK;
    block_copy_job j = {x, y, NULL, C, 0};
    float *tmp = NULL;
    if (!ts_dtype_is_quantized(x->dtype)) { /* x's elements as f32 rows */
        tmp = malloc(sizeof(float) * (size_t)numel);
        if (!tmp)
            return ts_set_error(ctx, TS_ERR_OOM, "cast: out of memory");
        int64_t st[TS_MAX_DIMS];
        ts_contiguous_strides(x->ndim, x->shape, st);
        cpu_copy_strided((char *)tmp, TS_F32, st, ts_tensor_ptr(x), x->dtype,
                         x->strides, x->ndim, x->shape);
        j.xf = tmp;
    }
    ts_parallel_for(numel / C, cpu_grain(C, 16384), block_copy_rows, &j);
    free(tmp);
    if (atomic_load(&j.oom))
        return ts_set_error(ctx, TS_ERR_OOM, "cast: out of memory");
    return TS_OK;
}

CPU_KERNEL(copy) {
    ts_tensor *x = n->in[0], *y = n->out;
    if (ts_dtype_is_quantized(x->dtype) || ts_dtype_is_quantized(y->dtype))
        return copy_blocks(ctx, x, y);
    cpu_copy_strided(ts_tensor_ptr(y), y->dtype, y->strides, ts_tensor_ptr(x),
                     x->dtype, x->strides, x->ndim, x->shape);
    return TS_OK;
}

CPU_KERNEL(concat) {
    (void)ctx;
    ts_tensor *y = n->out;
    int dim = (int)n->attrs.i[0];
    int64_t off = 0;
    size_t es = ts_dtype_size(y->dtype);
    for (int k = 0; k < n->n_in; k++) {
        ts_tensor *x = n->in[k];
        cpu_copy_strided(ts_tensor_ptr(y) + off * y->strides[dim] * (int64_t)es,
                         y->dtype, y->strides, ts_tensor_ptr(x), x->dtype,
                         x->strides, x->ndim, x->shape);
        off += x->shape[dim];
    }
    return TS_OK;
}

CPU_KERNEL(slice_scatter) {
    (void)ctx;
    ts_tensor *g = n->in[0], *y = n->out;
    int dim = (int)n->attrs.i[0];
    int64_t start = n->attrs.i[1], step = n->attrs.i[3];
    size_t es = ts_dtype_size(y->dtype);
    memset(ts_tensor_ptr(y), 0, (size_t)ts_tensor_numel(y) * es);
    int64_t st[TS_MAX_DIMS];
    memcpy(st, y->strides, sizeof st);
    st[dim] *= step;
    cpu_copy_strided(ts_tensor_ptr(y) + start * y->strides[dim] * (int64_t)es,
                     y->dtype, st, ts_tensor_ptr(g), g->dtype, g->strides,
                     g->ndim, g->shape);
    return TS_OK;
}

static int64_t load_id(const ts_tensor *ids, const int64_t *idx_off) {
    return (int64_t)ts_load_f64(
        ts_tensor_ptr(ids) + *idx_off * (int64_t)ts_dtype_size(ids->dtype),
        ids->dtype);
}

/* Flat offsets of every element of ids, in row-major order. */
static int64_t *id_offsets(ts_ctx *ctx, const ts_tensor *ids) {
    int64_t n = ts_tensor_numel(ids);
    int64_t *offs = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!offs) {
        ts_set_error(ctx, TS_ERR_OOM, "embedding: out of memory");
        return NULL;
    }
    int64_t idx[TS_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t o = 0;
        for (int d = 0; d < ids->ndim; d++)
            o += idx[d] * ids->strides[d];
        offs[i] = o;
        for (int d = ids->ndim - 1; d >= 0; d--) {
            if (++idx[d] < ids->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return offs;
}

static ts_status check_ids(ts_ctx *ctx, const ts_tensor *ids,
                           const int64_t *offs, int64_t V) {
    int64_t n = ts_tensor_numel(ids);
    for (int64_t i = 0; i < n; i++) {
        int64_t id = load_id(ids, &offs[i]);
        if (id < 0 || id >= V)
            return ts_set_error(ctx, TS_ERR_RANGE,
                                "embedding: index %lld out of range [0, %lld) "
                                "at position %lld of the ids",
                                (long long)id, (long long)V, (long long)i);
    }
    return TS_OK;
}

typedef struct {
    const ts_tensor *ids;
    const int64_t *offs;
    const ts_tensor *w;
    ts_tensor *y;
    int64_t C;
    size_t es;
} embedding_rows_args;

static void embedding_rows(void *p_, int64_t lo_, int64_t hi_) {
    const embedding_rows_args *a_ = p_;
    const ts_tensor *ids = a_->ids;
    const int64_t *offs = a_->offs;
    const ts_tensor *w = a_->w;
    ts_tensor *y = a_->y;
    int64_t C = a_->C;
    size_t es = a_->es;
    if (ts_dtype_is_quantized(w->dtype)) { /* rows of blocks, to f32 */
        int64_t rb = ts_dtype_nbytes(w->dtype, C);
        for (int64_t i = lo_; i < hi_; i++)
            cpu_dequant_rows(CPU_THIS_ISA, w->dtype,
                             ts_tensor_ptr(w) + load_id(ids, &offs[i]) * rb, rb,
                             1, C, (float *)ts_tensor_ptr(y) + i * C);
        return;
    }
    for (int64_t i = lo_; i < hi_; i++) {
        int64_t id = load_id(ids, &offs[i]);
        const char *src = ts_tensor_ptr(w) + id * w->strides[0] * (int64_t)es;
        char *dst = ts_tensor_ptr(y) + i * C * (int64_t)es;
        if (w->strides[1] == 1)
            memcpy(dst, src, (size_t)C * es);
        else
            for (int64_t c = 0; c < C; c++)
                memcpy(dst + c * (int64_t)es,
                       src + c * w->strides[1] * (int64_t)es, es);
    }
}

/* out (N, C) = weight[ids] */
CPU_KERNEL(embedding) {
    ts_tensor *w = n->in[0], *ids = n->in[1], *y = n->out;
    int64_t N = ts_tensor_numel(ids), C = w->shape[1];
    int64_t *offs = id_offsets(ctx, ids);
    if (!offs)
        return ctx->status;
    ts_status st = check_ids(ctx, ids, offs, w->shape[0]);
    size_t es = ts_dtype_size(w->dtype);
    if (st == TS_OK) {
        embedding_rows_args job = {ids, offs, w, y, C, es};
        ts_parallel_for(N, cpu_grain(C, 32768), embedding_rows, &job);
    }
    free(offs);
    return st;
}

/* columns [c0, c1) of every id's row: each thread owns whole columns,
 * and rows are added in id order, so the sums do not depend on threads */
typedef struct {
    const ts_tensor *ids;
    const int64_t *offs;
    const float *g;
    float *acc;
    int64_t N, C;
} scatter_job;

static void scatter_cols(void *p, int64_t c0, int64_t c1) {
    const scatter_job *j = p;
    for (int64_t i = 0; i < j->N; i++) {
        float *dst = j->acc + load_id(j->ids, &j->offs[i]) * j->C;
        const float *src = j->g + i * j->C;
        for (int64_t c = c0; c < c1; c++)
            dst[c] += src[c];
    }
}

/* acc (V, C) rows at ids += g rows (f32), columns split across threads:
 * no two threads touch one element */
static ts_status scatter_add_rows(ts_ctx *ctx, float *acc, int64_t V, int64_t C,
                                  const ts_tensor *ids, const ts_tensor *g) {
    int64_t N = ts_tensor_numel(ids);
    int64_t *offs = id_offsets(ctx, ids);
    if (!offs)
        return ctx->status;
    ts_status st = check_ids(ctx, ids, offs, V);
    float *gtmp = NULL;
    const float *gf = st == TS_OK ? cpu_as_f32(g, &gtmp) : NULL;
    if (st == TS_OK && !gf)
        st = ts_set_error(ctx, TS_ERR_OOM, "embedding: out of memory");
    if (st == TS_OK) {
        scatter_job j = {ids, offs, gf, acc, N, C};
        int64_t grain = cpu_grain(N, 32768);
        ts_parallel_for(C, grain < 16 ? 16 : grain, scatter_cols, &j);
    }
    cpu_tmp_free(gtmp);
    free(offs);
    return st;
}

/* dweight (V, C) = scatter-add of g (N, C) rows at ids; f32 accumulation */
CPU_KERNEL(embedding_backward) {
    ts_tensor *y = n->out;
    int64_t V = y->shape[0], C = y->shape[1];
    float *acc = y->dtype == TS_F32
                     ? (float *)ts_tensor_ptr(y)
                     : malloc(sizeof(float) * (size_t)(V * C + 1));
    if (!acc)
        return ts_set_error(ctx, TS_ERR_OOM,
                            "embedding_backward: out of memory");
    memset(acc, 0, sizeof(float) * (size_t)(V * C));
    ts_status st = scatter_add_rows(ctx, acc, V, C, n->in[1], n->in[0]);
    if (acc != (float *)ts_tensor_ptr(y)) {
        if (st == TS_OK)
            cpu_store_out(y, acc);
        free(acc);
    }
    return st;
}

/* in[0] (V, C) f32 contiguous rows at in[1] += in[2], in place */
CPU_KERNEL(index_add) {
    ts_tensor *d = n->in[0];
    return scatter_add_rows(ctx, (float *)ts_tensor_ptr(d), d->shape[0],
                            d->shape[1], n->in[1], n->in[2]);
}

/* in[0] (any strides) = in[1] broadcast and converted */
CPU_KERNEL(copy_into) {
    (void)ctx;
    ts_tensor *d = n->in[0], *s = n->in[1];
    int64_t st[TS_MAX_DIMS];
    ts_broadcast_strides(s, d->ndim, d->shape, st);
    cpu_copy_strided(ts_tensor_ptr(d), d->dtype, d->strides, ts_tensor_ptr(s),
                     s->dtype, st, d->ndim, d->shape);
    return TS_OK;
}

typedef struct {
    char *pp;
    ts_dtype dt;
    const float *gf;
    float *m, *v;
    float gs, b1, b2, eps, step, inv_bc2, decay;
    int64_t N;
} adamw_job;

/* CHUNK-element pieces [c0, c1) of the update */
static void adamw_chunks(void *arg, int64_t c0, int64_t c1) {
    const adamw_job *j = arg;
    ts_dtype dt = j->dt;
    const float *gf = j->gf;
    float *m = j->m, *v = j->v;
    float b1 = j->b1, b2 = j->b2, gs = j->gs;
    for (int64_t i0 = c0 * CHUNK; i0 < j->N && i0 < c1 * CHUNK; i0 += CHUNK) {
        int64_t len = j->N - i0 < CHUNK ? j->N - i0 : CHUNK;
        float buf[CHUNK];
        char *at = j->pp + i0 * (int64_t)ts_dtype_size(dt);
        float *pf = dt == TS_F32 ? (float *)j->pp + i0 : buf;
        if (dt != TS_F32)
            cpu_gather_f32(buf, at, dt, 1, len);
        for (int64_t i = 0; i < len; i++) {
            float gi = gf[i0 + i] * gs;
            float mi = m[i0 + i] = b1 * m[i0 + i] + (1.0f - b1) * gi;
            float vi = v[i0 + i] = b2 * v[i0 + i] + (1.0f - b2) * gi * gi;
            pf[i] = pf[i] * j->decay -
                    j->step * mi / (sqrtf(vi * j->inv_bc2) + j->eps);
        }
        if (dt != TS_F32)
            cpu_scatter_f32(at, dt, 1, buf, len);
    }
}

/* fused AdamW over contiguous p (any float dtype), m, v (f32); g any
 * layout; h = {lr, b1, b2, eps, wd, bc1, bc2[, gradient scale]} */
CPU_KERNEL(adamw) {
    ts_tensor *p = n->in[0], *g = n->in[1];
    float *m = (float *)ts_tensor_ptr(n->in[2]),
          *v = (float *)ts_tensor_ptr(n->in[3]);
    const float *h = (const float *)ts_tensor_ptr(n->in[4]);
    float lr = h[0], b1 = h[1], b2 = h[2], eps = h[3], wd = h[4];
    float step = lr / h[5], inv_bc2 = 1.0f / h[6], decay = 1.0f - lr * wd;
    float gs = n->in[4]->shape[0] > 7 ? h[7] : 1.0f;
    int64_t N = ts_tensor_numel(p);
    float *gt = NULL;
    const float *gf = cpu_as_f32(g, &gt);
    if (!gf)
        return ts_set_error(ctx, TS_ERR_OOM, "adamw: out of memory");
    char *pp = ts_tensor_ptr(p);
    ts_dtype dt = p->dtype;
    adamw_job j = {pp, dt, gf, m, v, gs, b1, b2, eps, step, inv_bc2, decay, N};
    ts_parallel_for((N + CHUNK - 1) / CHUNK, cpu_grain(CHUNK, 32768),
                    adamw_chunks, &j);
    cpu_tmp_free(gt);
    return TS_OK;
}

bool cpu_fusable(int op) {
    switch (op) {
    case TS_OP_ADD:
    case TS_OP_SUB:
    case TS_OP_MUL:
    case TS_OP_DIV:
    case TS_OP_EQ:
    case TS_OP_ADD_SCALAR:
    case TS_OP_MUL_SCALAR:
    case TS_OP_NEG:
    case TS_OP_EXP:
    case TS_OP_LOG:
    case TS_OP_SQRT:
    case TS_OP_RSQRT:
    case TS_OP_ABS:
    case TS_OP_POW_SCALAR:
    case TS_OP_TANH:
    case TS_OP_SIGMOID:
    case TS_OP_RELU:
    case TS_OP_SILU:
    case TS_OP_GELU:
    case TS_OP_UNARY_BACKWARD:
        return true;
    default:
        return false;
    }
}

static void eval_chunk(const ts_node *n, float *y, const float **x,
                       int64_t len) {
    if (n->op == TS_OP_UNARY_BACKWARD)
        unary_bwd_chunk(n, y, x, len);
    else if (n->n_in == 2)
        binary_chunk(n, y, x, len);
    else
        unary_chunk(n, y, x, len);
}

float cpu_eval_scalar(const ts_node *n, const float *args) {
    const float *x[3] = {args, args + 1, args + 2};
    float y = 0.0f;
    eval_chunk(n, &y, x, 1);
    return y;
}

typedef struct {
    const ts_fused *f;
    const cpu_iter *it;
    int64_t per_row, inner;
    atomic_int fail;
} fused_job;

/* CHUNK pieces [w0, w1) of a fused elementwise group */
static void fused_items(void *arg, int64_t w0, int64_t w1) {
    fused_job *j = arg;
    const ts_fused *f = j->f;
    const cpu_iter *it = j->it;
    ts_tensor *out = f->out;
    int64_t per_row = j->per_row, inner = j->inner;
    int last = it->ndim - 1;
    /* registers: one chunk per outside input and per member */
    float *regs =
        malloc(sizeof(float) * CHUNK * (size_t)(f->n_ext + f->n_members));
    if (!regs) {
        atomic_store(&j->fail, 1);
        return;
    }
    for (int64_t w = w0; w < w1; w++) {
        int64_t r = w / per_row, c0 = (w % per_row) * CHUNK;
        int64_t len = inner - c0 < CHUNK ? inner - c0 : CHUNK;
        int64_t off[CPU_ITER_MAX_OPS];
        cpu_iter_offsets(it, r, off);
        const float *xv[TS_FUSE_MAX_EXT];
        for (int k = 0; k < f->n_ext; k++) {
            const ts_tensor *t = f->ext[k];
            int64_t s = it->st[k + 1][last];
            const char *p =
                ts_tensor_ptr(t) +
                (off[k + 1] + c0 * s) * (int64_t)ts_dtype_size(t->dtype);
            xv[k] = view_f32(p, t->dtype, s, len, regs + (size_t)k * CHUNK);
        }
        char *yp = ts_tensor_ptr(out) +
                   (off[0] + c0) * (int64_t)ts_dtype_size(out->dtype);
        float *mreg = regs + (size_t)f->n_ext * CHUNK;
        for (int m = 0; m < f->n_members; m++) {
            const ts_node *n = f->members[m];
            const float *x[3];
            for (int k = 0; k < n->n_in; k++) {
                int a = f->arg[m][k];
                x[k] = a >= 0 ? xv[a] : mreg + (size_t)(-a - 1) * CHUNK;
            }
            bool root = m == f->n_members - 1;
            float *y = root && out->dtype == TS_F32 ? (float *)yp
                                                    : mreg + (size_t)m * CHUNK;
            eval_chunk(n, y, x, len);
            if (root && out->dtype != TS_F32)
                cpu_scatter_f32(yp, out->dtype, 1, y, len);
        }
    }
    free(regs);
}

ts_status cpu_run_fused(ts_ctx *ctx, const ts_fused *f) {
    if (f->head)
        return cpu_matmul_epilogue(ctx, f);
    ts_tensor *out = f->out;
    int64_t st[CPU_ITER_MAX_OPS][TS_MAX_DIMS];
    memcpy(st[0], out->strides, sizeof st[0]);
    for (int k = 0; k < f->n_ext; k++)
        ts_broadcast_strides(f->ext[k], out->ndim, out->shape, st[k + 1]);
    cpu_iter it;
    cpu_iter_init(&it, out->ndim, out->shape, f->n_ext + 1, st);
    int64_t rows = cpu_iter_rows(&it), inner = cpu_iter_inner(&it);
    int64_t per_row = (inner + CHUNK - 1) / CHUNK, items = rows * per_row;
    fused_job j = {f, &it, per_row, inner, 0};
    ts_parallel_for(items, cpu_grain(CHUNK, 16384), fused_items, &j);
    int fail = atomic_load(&j.fail);
    if (fail)
        return ts_set_error(ctx, TS_ERR_OOM,
                            "fused elementwise: out of memory");
    return TS_OK;
}
