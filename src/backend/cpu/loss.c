/* loss.c — fused cross-entropy on the CPU: log-softmax and the negative
 * log-likelihood in one pass per row (saving the row's log-sum-exp), and
 * the backward (softmax - one_hot) * scale from the saved lse. */
#include "backend/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>

static int64_t target_at(const ts_tensor *t, int64_t i) {
    const char *p =
        ts_tensor_ptr(t) + i * t->strides[0] * (int64_t)ts_dtype_size(t->dtype);
    return t->dtype == TS_I64 ? *(const int64_t *)p : *(const int32_t *)p;
}

static ts_status check_targets(ts_ctx *ctx, const ts_tensor *t, int64_t V,
                               int64_t ignore) {
    for (int64_t i = 0; i < t->shape[0]; i++) {
        int64_t y = target_at(t, i);
        if (y != ignore && (y < 0 || y >= V))
            return ts_set_error(ctx, TS_ERR_RANGE,
                                "cross_entropy: target %lld at row %lld is out "
                                "of range [0, %lld) and is not ignore_index "
                                "(%lld)",
                                (long long)y, (long long)i, (long long)V,
                                (long long)ignore);
    }
    return TS_OK;
}

/* rows [r0, r1) of a cross-entropy: the loop bodies of both kernels */
typedef struct {
    const float *x;
    const ts_tensor *t;
    int64_t V, ignore;
    float *lse, *out; /* forward: loss per row; backward: dlogits */
    const float *g;
    ts_reduction red;
    int64_t count;
} ce_rows;

static void ce_forward_rows(void *p, int64_t r0, int64_t r1) {
    const ce_rows *j = p;
    int64_t V = j->V;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = j->x + r * V;
        float m = -INFINITY;
        for (int64_t k = 0; k < V; k++)
            m = xr[k] > m ? xr[k] : m;
        double s = 0;
        for (int64_t k = 0; k < V; k++)
            s += expf(xr[k] - m);
        j->lse[r] = m + (float)log(s);
        int64_t tg = target_at(j->t, r);
        j->out[r] = tg == j->ignore ? 0.0f : j->lse[r] - xr[tg];
    }
}

static void ce_backward_rows(void *p, int64_t r0, int64_t r1) {
    const ce_rows *j = p;
    int64_t V = j->V;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = j->x + r * V;
        float *dr = j->out + r * V;
        int64_t tg = target_at(j->t, r);
        float scale = j->red == TS_REDUCE_NONE  ? j->g[r]
                      : j->red == TS_REDUCE_SUM ? j->g[0]
                                                : j->g[0] / (float)j->count;
        if (tg == j->ignore) {
            for (int64_t k = 0; k < V; k++)
                dr[k] = 0.0f;
            continue;
        }
        for (int64_t k = 0; k < V; k++)
            dr[k] = expf(xr[k] - j->lse[r]) * scale;
        dr[tg] -= scale;
    }
}

/* logits (N, V), targets (N) -> loss (scalar or (N)), lse (N) */
CPU_KERNEL(cross_entropy) {
    ts_tensor *x = n->in[0], *t = n->in[1], *y = n->out;
    int64_t N = x->shape[0], V = x->shape[1], ignore = n->attrs.i[0];
    ts_reduction red = (ts_reduction)n->attrs.i[1];
    if (check_targets(ctx, t, V, ignore))
        return ctx->status;
    float *xt = NULL;
    const float *xf = cpu_as_f32(x, &xt);
    float *loss = malloc(sizeof(float) * (size_t)(N + 1));
    if (!xf || !loss) {
        cpu_tmp_free(xt), cpu_tmp_free(loss);
        return ts_set_error(ctx, TS_ERR_OOM, "cross_entropy: out of memory");
    }
    ce_rows job = {xf,   t,    V, ignore, (float *)ts_tensor_ptr(n->saved[0]),
                   loss, NULL, 0, 0};
    ts_parallel_for(N, cpu_grain(V, 16384), ce_forward_rows, &job);
    if (red == TS_REDUCE_NONE) {
        cpu_store_out(y, loss);
    } else {
        double s = 0;
        int64_t count = 0;
        for (int64_t r = 0; r < N; r++) {
            s += loss[r];
            count += target_at(t, r) != ignore;
        }
        /* mean over zero rows is 0/0 = NaN, as PyTorch gives */
        float v = red == TS_REDUCE_SUM ? (float)s : (float)(s / (double)count);
        cpu_store_out(y, &v);
    }
    cpu_tmp_free(xt), cpu_tmp_free(loss);
    return TS_OK;
}

/* inputs g, logits, targets, lse -> dlogits (N, V) */
CPU_KERNEL(cross_entropy_backward) {
    ts_tensor *g = n->in[0], *x = n->in[1], *t = n->in[2], *y = n->out;
    const float *lse = (const float *)ts_tensor_ptr(n->in[3]);
    int64_t N = x->shape[0], V = x->shape[1], ignore = n->attrs.i[0];
    ts_reduction red = (ts_reduction)n->attrs.i[1];
    float *xt = NULL, *gt = NULL, *yt = NULL;
    const float *xf = cpu_as_f32(x, &xt), *gf = cpu_as_f32(g, &gt);
    float *yf = y->dtype == TS_F32
                    ? (float *)ts_tensor_ptr(y)
                    : (yt = malloc(sizeof(float) * (size_t)(N * V + 1)));
    if (!xf || !gf || !yf) {
        cpu_tmp_free(xt), cpu_tmp_free(gt), cpu_tmp_free(yt);
        return ts_set_error(ctx, TS_ERR_OOM,
                            "cross_entropy_backward: out of memory");
    }
    int64_t count = 0;
    for (int64_t r = 0; r < N; r++)
        count += target_at(t, r) != ignore;
    ce_rows job = {xf, t, V, ignore, (float *)lse, yf, gf, red, count};
    ts_parallel_for(N, cpu_grain(V, 16384), ce_backward_rows, &job);
    if (yt)
        cpu_store_out(y, yt);
    cpu_tmp_free(xt), cpu_tmp_free(gt), cpu_tmp_free(yt);
    return TS_OK;
}
