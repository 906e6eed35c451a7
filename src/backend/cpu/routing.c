/* routing.c — the indexing ops a mixture-of-experts router needs on the
 * CPU: top-k indices along the last dim, torch.gather and its gradient (a
 * scatter-add), and one-hot rows. Indices are checked before any write, and
 * an error names the first bad one by its row-major position. The experts
 * MLP itself is in moe.c. */
#include "backend/cpu/cpu.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- top-k ---- */

/* a ranks above b: larger, NaN above every number (as torch.topk) */
static inline bool ranks_above(float a, float b) {
    return a > b || (isnan(a) && !isnan(b));
}

typedef struct {
    const float *x;
    int64_t n, k;
    int64_t *out;
    atomic_int oom;
} topk_job;

/* rows [r0, r1): the k best of each row kept sorted, best first; a value
 * enters only when it ranks above the k-th, so ties keep the lower index */
static void topk_rows(void *arg, int64_t r0, int64_t r1) {
    topk_job *j = arg;
    int64_t n = j->n, k = j->k;
    float *val = malloc(sizeof(float) * (size_t)k);
    if (!val) {
        atomic_store(&j->oom, 1);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * n;
        int64_t *ix = j->out + r * k, cnt = 0;
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            if (cnt == k && !ranks_above(v, val[k - 1]))
                continue;
            int64_t p = cnt < k ? cnt++ : k - 1;
            for (; p > 0 && ranks_above(v, val[p - 1]); p--) {
                val[p] = val[p - 1];
                ix[p] = ix[p - 1];
            }
            val[p] = v;
            ix[p] = i;
        }
    }
    free(val);
}

/* x (..., n) -> (..., k) i64 */
CPU_KERNEL(topk) {
    ts_tensor *x = n->in[0];
    int64_t len = x->shape[x->ndim - 1], k = n->attrs.i[0];
    int64_t rows = len ? ts_tensor_numel(x) / len : 0;
    float *tmp = NULL;
    const float *xf = cpu_as_f32(x, &tmp);
    if (!xf)
        return ts_set_error(ctx, TS_ERR_OOM, "topk: out of memory");
    topk_job j = {xf, len, k, (int64_t *)ts_tensor_ptr(n->out), 0};
    ts_parallel_for(rows, cpu_grain(len * (k < 8 ? 1 : k / 8), 16384),
                    topk_rows, &j);
    cpu_tmp_free(tmp);
    if (atomic_load(&j.oom))
        return ts_set_error(ctx, TS_ERR_OOM, "topk: out of memory");
    return TS_OK;
}

/* ---- gather ---- */

static int64_t load_index(const ts_tensor *t, int64_t off) {
    const char *p = ts_tensor_ptr(t) + off * (int64_t)ts_dtype_size(t->dtype);
    if (t->dtype == TS_I32) {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The walk of a gather: the index's shape cut into lines along dim, each
 * line one fixed position in the other dims. Offsets in elements. */
typedef struct {
    int ndim, dim;
    const int64_t *shape; /* the index's */
    int64_t J;            /* shape[dim] */
    int64_t lines;
} line_walk;

static void walk_init(line_walk *w, const ts_tensor *index, int dim) {
    w->ndim = index->ndim;
    w->dim = dim;
    w->shape = index->shape;
    w->J = index->shape[dim];
    w->lines = w->J ? ts_tensor_numel(index) / w->J : 0;
}

/* offsets of line `line` in up to three operands with strides st[k] */
static void walk_offsets(const line_walk *w, int64_t line, int nops,
                         const int64_t *const *st, int64_t *off) {
    for (int k = 0; k < nops; k++)
        off[k] = 0;
    for (int d = w->ndim - 1; d >= 0; d--) {
        if (d == w->dim)
            continue;
        int64_t i = line % w->shape[d];
        line /= w->shape[d];
        for (int k = 0; k < nops; k++)
            off[k] += i * st[k][d];
    }
}

/* every index in [0, L), else an error naming the first bad one */
static ts_status check_indices(ts_ctx *ctx, const char *op,
                               const ts_tensor *index, int64_t L) {
    int64_t n = ts_tensor_numel(index), idx[TS_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < index->ndim; d++)
            off += idx[d] * index->strides[d];
        int64_t v = load_index(index, off);
        if (v < 0 || v >= L)
            return ts_set_error(ctx, TS_ERR_RANGE,
                                "%s: index %lld out of range [0, %lld) at "
                                "position %lld of the indices",
                                op, (long long)v, (long long)L, (long long)i);
        for (int d = index->ndim - 1; d >= 0; d--) {
            if (++idx[d] < index->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return TS_OK;
}

typedef struct {
    line_walk w;
    const ts_tensor *x, *index;
    char *out;
    const int64_t *ost;
    size_t es;
} gather_job;

static void gather_lines(void *arg, int64_t l0, int64_t l1) {
    const gather_job *j = arg;
    const ts_tensor *x = j->x, *ix = j->index;
    int dim = j->w.dim;
    const int64_t *st[3] = {x->strides, ix->strides, j->ost};
    const char *xp = ts_tensor_ptr(x);
    for (int64_t l = l0; l < l1; l++) {
        int64_t off[3];
        walk_offsets(&j->w, l, 3, st, off);
        for (int64_t q = 0; q < j->w.J; q++) {
            int64_t id = load_index(ix, off[1] + q * ix->strides[dim]);
            memcpy(j->out + (off[2] + q * j->ost[dim]) * (int64_t)j->es,
                   xp + (off[0] + id * x->strides[dim]) * (int64_t)j->es,
                   j->es);
        }
    }
}

/* out (index's shape) = x at index along dim; any dtype */
CPU_KERNEL(gather) {
    ts_tensor *x = n->in[0], *ix = n->in[1], *y = n->out;
    int dim = (int)n->attrs.i[0];
    if (check_indices(ctx, "gather", ix, x->shape[dim]))
        return ctx->status;
    gather_job j = {.x = x,
                    .index = ix,
                    .out = ts_tensor_ptr(y),
                    .ost = y->strides,
                    .es = ts_dtype_size(x->dtype)};
    walk_init(&j.w, ix, dim);
    ts_parallel_for(j.w.lines, cpu_grain(j.w.J, 16384), gather_lines, &j);
    return TS_OK;
}

typedef struct {
    line_walk w;
    const float *g; /* contiguous, the index's shape */
    const int64_t *gst;
    const ts_tensor *index;
    float *acc; /* contiguous, the input's shape */
    const int64_t *ast;
} scatter_job;

/* each line adds into its own line of acc (the other dims fixed), in
 * index order: no two threads touch one element, and the sums do not
 * depend on the thread count */
static void scatter_lines(void *arg, int64_t l0, int64_t l1) {
    const scatter_job *j = arg;
    const ts_tensor *ix = j->index;
    int dim = j->w.dim;
    const int64_t *st[3] = {j->ast, ix->strides, j->gst};
    for (int64_t l = l0; l < l1; l++) {
        int64_t off[3];
        walk_offsets(&j->w, l, 3, st, off);
        for (int64_t q = 0; q < j->w.J; q++) {
            int64_t id = load_index(ix, off[1] + q * ix->strides[dim]);
            j->acc[off[0] + id * j->ast[dim]] += j->g[off[2] + q * j->gst[dim]];
        }
    }
}

/* in g (index's shape), index -> zeros of the input's shape with g added
 * at index along dim, accumulated in f32 */
CPU_KERNEL(gather_backward) {
    ts_tensor *g = n->in[0], *ix = n->in[1], *y = n->out;
    int dim = (int)n->attrs.i[0];
    if (check_indices(ctx, "gather_backward", ix, y->shape[dim]))
        return ctx->status;
    int64_t ny = ts_tensor_numel(y), gst[TS_MAX_DIMS], ast[TS_MAX_DIMS];
    ts_contiguous_strides(g->ndim, g->shape, gst);
    ts_contiguous_strides(y->ndim, y->shape, ast);
    float *gtmp = NULL,
          *acc = y->dtype == TS_F32
                     ? (float *)ts_tensor_ptr(y)
                     : cpu_tmp_alloc(sizeof(float) * (size_t)(ny ? ny : 1));
    const float *gf = cpu_as_f32(g, &gtmp);
    if (!gf || !acc) {
        cpu_tmp_free(gtmp);
        if (acc != (float *)ts_tensor_ptr(y))
            cpu_tmp_free(acc);
        return ts_set_error(ctx, TS_ERR_OOM, "gather_backward: out of memory");
    }
    memset(acc, 0, sizeof(float) * (size_t)ny);
    scatter_job j = {.g = gf, .gst = gst, .index = ix, .acc = acc, .ast = ast};
    walk_init(&j.w, ix, dim);
    ts_parallel_for(j.w.lines, cpu_grain(j.w.J, 16384), scatter_lines, &j);
    if (acc != (float *)ts_tensor_ptr(y)) {
        cpu_store_out(y, acc);
        cpu_tmp_free(acc);
    }
    cpu_tmp_free(gtmp);
    return TS_OK;
}

/* ---- one-hot ---- */

/* idx (...) -> (..., n) f32: 1 at each index, 0 elsewhere */
CPU_KERNEL(one_hot) {
    ts_tensor *ix = n->in[0], *y = n->out;
    int64_t classes = n->attrs.i[0];
    if (check_indices(ctx, "one_hot", ix, classes))
        return ctx->status;
    float *out = (float *)ts_tensor_ptr(y);
    int64_t cnt = ts_tensor_numel(ix), idx[TS_MAX_DIMS] = {0};
    memset(out, 0, sizeof(float) * (size_t)(cnt * classes));
    for (int64_t i = 0; i < cnt; i++) {
        int64_t off = 0;
        for (int d = 0; d < ix->ndim; d++)
            off += idx[d] * ix->strides[d];
        out[i * classes + load_index(ix, off)] = 1.0f;
        for (int d = ix->ndim - 1; d >= 0; d--) {
            if (++idx[d] < ix->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return TS_OK;
}
