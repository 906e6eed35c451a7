/* reduce.c — CPU kernels for reductions (sum, mean, amax, argmax over any
 * set of dims) and softmax / log_softmax over one dim. Sums accumulate in
 * f64; inputs of any strides and float dtype. */
#include "backend/cpu/cpu.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Splits x's dims into kept (outer) and reduced (inner) index spaces. */
typedef struct {
    int nk, nr;
    int64_t kshape[TS_MAX_DIMS], kst[TS_MAX_DIMS];
    int64_t rshape[TS_MAX_DIMS], rst[TS_MAX_DIMS];
    int64_t kcount, rcount;
} red_plan;

static void plan_reduce(const ts_tensor *x, const ts_attrs *a, red_plan *p) {
    bool red[TS_MAX_DIMS] = {0};
    for (int k = 0; k < a->ni; k++)
        red[a->i[k]] = true;
    p->nk = p->nr = 0;
    p->kcount = p->rcount = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (red[d]) {
            p->rshape[p->nr] = x->shape[d];
            p->rst[p->nr++] = x->strides[d];
            p->rcount *= x->shape[d];
        } else {
            p->kshape[p->nk] = x->shape[d];
            p->kst[p->nk++] = x->strides[d];
            p->kcount *= x->shape[d];
        }
    }
}

static int64_t offset_of(int64_t flat, int nd, const int64_t *shape,
                         const int64_t *st) {
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        off += (flat % shape[d]) * st[d];
        flat /= shape[d];
    }
    return off;
}

/* Visits the reduced elements of one output in row-major order. */
#define FOR_REDUCED(p, base_ptr, es, body)                                     \
    do {                                                                       \
        int64_t inner_n = (p)->nr ? (p)->rshape[(p)->nr - 1] : 1;              \
        int64_t inner_s = (p)->nr ? (p)->rst[(p)->nr - 1] : 0;                 \
        int64_t outer_n = (p)->rcount / (inner_n ? inner_n : 1);               \
        if (inner_n == 0)                                                      \
            outer_n = 0;                                                       \
        for (int64_t ro = 0; ro < outer_n; ro++) {                             \
            int64_t roff = offset_of(ro, (p)->nr - 1, (p)->rshape, (p)->rst);  \
            const char *rp = (base_ptr) + roff * (int64_t)(es);                \
            for (int64_t ri = 0; ri < inner_n; ri++) {                         \
                float v = ts_load_f32(rp + ri * inner_s * (int64_t)(es), dt);  \
                int64_t flat_r = ro * inner_n + ri;                            \
                (void)flat_r;                                                  \
                body;                                                          \
            }                                                                  \
        }                                                                      \
    } while (0)

/* Sum of the leading rows of a contiguous (R, C) block: a column sum that
 * streams memory in order instead of striding down each column. Each
 * column is summed over the rows in order, whichever chunk holds it. */
typedef struct {
    const ts_tensor *x;
    int64_t R, C;
    double *acc;
} colsum_job;

static void column_sums_range(void *p, int64_t c0, int64_t c1) {
    const colsum_job *j = p;
    ts_dtype dt = j->x->dtype;
    const char *base = ts_tensor_ptr(j->x);
    int64_t es = (int64_t)ts_dtype_size(dt);
    float buf[1024];
    for (int64_t r = 0; r < j->R; r++)
        for (int64_t cb = c0; cb < c1; cb += 1024) {
            int64_t m = c1 - cb < 1024 ? c1 - cb : 1024;
            cpu_gather_f32(buf, base + (r * j->C + cb) * es, dt, 1, m);
            for (int64_t i = 0; i < m; i++)
                j->acc[cb + i] += buf[i];
        }
}

static void column_sums(const ts_tensor *x, int64_t R, int64_t C, double *acc) {
    memset(acc, 0, sizeof(double) * (size_t)C);
    colsum_job j = {x, R, C, acc};
    int64_t grain = cpu_grain(R, 32768);
    ts_parallel_for(C, grain < 64 ? 64 : grain, column_sums_range, &j);
}

/* outputs [o0, o1) of a reduction or an argmax over the plan's dims */
typedef struct {
    const red_plan *p;
    const char *base;
    size_t es;
    ts_dtype dt;
    bool is_max;
    double scale;
    float *out;
    int64_t *idx; /* argmax */
} reduce_job;

static void reduce_range(void *arg, int64_t o0, int64_t o1) {
    const reduce_job *j = arg;
    const red_plan *p = j->p;
    size_t es = j->es;
    ts_dtype dt = j->dt;
    for (int64_t o = o0; o < o1; o++) {
        const char *bp =
            j->base + offset_of(o, p->nk, p->kshape, p->kst) * (int64_t)es;
        if (j->is_max) {
            float m = -INFINITY;
            bool nan = false;
            FOR_REDUCED(p, bp, es, {
                if (v > m)
                    m = v;
                if (v != v)
                    nan = true;
            });
            j->out[o] = nan ? NAN : m;
        } else {
            double s = 0;
            FOR_REDUCED(p, bp, es, { s += v; });
            j->out[o] = (float)(s * j->scale);
        }
    }
}

static void argmax_range(void *arg, int64_t o0, int64_t o1) {
    const reduce_job *j = arg;
    const red_plan *p = j->p;
    size_t es = j->es;
    ts_dtype dt = j->dt;
    for (int64_t o = o0; o < o1; o++) {
        const char *bp =
            j->base + offset_of(o, p->nk, p->kshape, p->kst) * (int64_t)es;
        float m = -INFINITY;
        int64_t best = 0;
        bool found_nan = false;
        FOR_REDUCED(p, bp, es, {
            if (!found_nan && (v > m || v != v)) {
                m = v;
                best = flat_r;
                if (v != v)
                    found_nan = true;
            }
        });
        j->idx[o] = best;
    }
}

CPU_KERNEL(reduce) {
    ts_tensor *x = n->in[0], *y = n->out;
    ts_dtype dt = x->dtype;
    size_t es = ts_dtype_size(dt);
    red_plan p;
    plan_reduce(x, &n->attrs, &p);
    float *out = malloc(sizeof(float) * (size_t)(p.kcount ? p.kcount : 1));
    if (!out)
        return ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory",
                            ts_op_table[n->op].name);
    bool is_max = n->op == TS_OP_AMAX;
    double scale = n->op == TS_OP_MEAN ? 1.0 / (double)p.rcount : 1.0;
    /* reduced dims leading and contiguous: column sums */
    bool leading = !is_max && ts_tensor_is_contiguous(x) && p.nr > 0;
    for (int k = 0; leading && k < n->attrs.ni; k++)
        leading = n->attrs.i[k] == k;
    if (leading && p.kcount > 1) {
        double *acc = malloc(sizeof(double) * (size_t)p.kcount);
        if (!acc) {
            free(out);
            return ts_set_error(ctx, TS_ERR_OOM, "sum: out of memory");
        }
        column_sums(x, p.rcount, p.kcount, acc);
        for (int64_t i = 0; i < p.kcount; i++)
            out[i] = (float)(acc[i] * scale);
        free(acc);
    } else {
        reduce_job j = {&p, ts_tensor_ptr(x), es, dt, is_max, scale, out, NULL};
        ts_parallel_for(p.kcount, cpu_grain(p.rcount, 16384), reduce_range, &j);
    }
    cpu_store_out(y, out);
    free(out);
    return TS_OK;
}

CPU_KERNEL(argmax) {
    (void)ctx;
    ts_tensor *x = n->in[0], *y = n->out;
    ts_dtype dt = x->dtype;
    size_t es = ts_dtype_size(dt);
    red_plan p;
    plan_reduce(x, &n->attrs, &p);
    int64_t *out = (int64_t *)ts_tensor_ptr(y);
    reduce_job j = {&p, ts_tensor_ptr(x), es, dt, false, 1.0, NULL, out};
    ts_parallel_for(p.kcount, cpu_grain(p.rcount, 16384), argmax_range, &j);
    return TS_OK;
}

typedef struct {
    const ts_tensor *x;
    ts_tensor *y;
    int64_t L, xs, ys;
    int nr;
    const int64_t *rshape, *rxst, *ryst;
    bool log_out;
    size_t xes, yes;
    atomic_int fail;
} softmax_job;

static void softmax_range(void *arg, int64_t r0, int64_t r1) {
    softmax_job *j = arg;
    int64_t L = j->L;
    float *buf = malloc(sizeof(float) * (size_t)(L ? L : 1));
    if (!buf) {
        atomic_store(&j->fail, 1);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const char *xp =
            ts_tensor_ptr(j->x) +
            offset_of(r, j->nr, j->rshape, j->rxst) * (int64_t)j->xes;
        char *yp = ts_tensor_ptr(j->y) +
                   offset_of(r, j->nr, j->rshape, j->ryst) * (int64_t)j->yes;
        cpu_gather_f32(buf, xp, j->x->dtype, j->xs, L);
        float m = -INFINITY;
        for (int64_t i = 0; i < L; i++)
            m = buf[i] > m ? buf[i] : m;
        if (m == -INFINITY)
            m = 0; /* all -inf: avoid inf - inf */
        double s = 0;
        for (int64_t i = 0; i < L; i++)
            s += expf(buf[i] - m);
        if (j->log_out) {
            float lse = m + (float)log(s);
            for (int64_t i = 0; i < L; i++)
                buf[i] -= lse;
        } else {
            float inv = (float)(1.0 / s);
            for (int64_t i = 0; i < L; i++)
                buf[i] = expf(buf[i] - m) * inv;
        }
        cpu_scatter_f32(yp, j->y->dtype, j->ys, buf, L);
    }
    free(buf);
}

/* softmax / log_softmax along dim: rows are the other dims */
CPU_KERNEL(softmax) {
    ts_tensor *x = n->in[0], *y = n->out;
    int dim = (int)n->attrs.i[0];
    int64_t L = x->shape[dim];
    int64_t rows = L ? ts_tensor_numel(x) / L : 0;
    int64_t xs = x->strides[dim], ys = y->strides[dim];
    /* index space of the rows: x's shape without dim */
    int64_t rshape[TS_MAX_DIMS], rxst[TS_MAX_DIMS], ryst[TS_MAX_DIMS];
    int nr = 0;
    for (int d = 0; d < x->ndim; d++)
        if (d != dim) {
            rshape[nr] = x->shape[d];
            rxst[nr] = x->strides[d];
            ryst[nr++] = y->strides[d];
        }
    bool log_out = n->op == TS_OP_LOG_SOFTMAX;
    size_t xes = ts_dtype_size(x->dtype), yes = ts_dtype_size(y->dtype);
    softmax_job j = {x,    y,    L,       xs,  ys,  nr, rshape,
                     rxst, ryst, log_out, xes, yes, 0};
    ts_parallel_for(rows, cpu_grain(L, 16384), softmax_range, &j);
    int fail = atomic_load(&j.fail);
    if (fail)
        return ts_set_error(ctx, TS_ERR_OOM, "softmax: out of memory");
    return TS_OK;
}
