/* norm.c — fused CPU kernels over the last dim: rmsnorm and layernorm with
 * their backward (dx; the weight gradients are sums built from ops), and
 * the rotary embedding in Hugging Face's rotate-half layout. Rows are
 * processed in f32 whatever the storage dtype. */
#include "backend/cpu/cpu.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define OOM(op) ts_set_error(ctx, TS_ERR_OOM, op ": out of memory")

/* sum of x[i]^2 in 32 lanes (4 AVX accumulators), so the loop runs at
 * memory speed instead of one dependent add per element */
static float sum_squares(const float *x, int64_t n) {
#ifndef __AVX2__
    float l[32] = {0}; /* the same 32 lanes, summed in the same order */
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 32; k++)
            l[k] += x[i + k] * x[i + k];
    float s = 0;
    for (int k = 0; k < 8; k++)
        s += (l[k] + l[k + 8]) + (l[k + 16] + l[k + 24]);
    for (; i < n; i++)
        s += x[i] * x[i];
    return s;
#else
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        __m256 v2 = _mm256_loadu_ps(x + i + 16),
               v3 = _mm256_loadu_ps(x + i + 24);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
        a2 = _mm256_fmadd_ps(v2, v2, a2);
        a3 = _mm256_fmadd_ps(v3, v3, a3);
    }
    __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float lanes[8], s = 0;
    _mm256_storeu_ps(lanes, a);
    for (int k = 0; k < 8; k++)
        s += lanes[k];
    for (; i < n; i++)
        s += x[i] * x[i];
    return s;
#endif
}

/* one job for the four norm kernels' row loops: x, g (backward), w, b;
 * y; mean and rstd saved by the forward, read by the backward */
typedef struct {
    const float *x, *g, *w, *b;
    float *y, *mean, *rstd;
    float eps;
    int64_t C;
} norm_job;

static void rmsnorm_rows(void *p_, int64_t lo_, int64_t hi_) {
    const norm_job *a_ = p_;
    const float *xf = a_->x;
    const float *w = a_->w;
    float *yf = a_->y;
    float *rstd = a_->rstd;
    float eps = a_->eps;
    int64_t C = a_->C;
    for (int64_t r = lo_; r < hi_; r++) {
        const float *xr = xf + r * C;
        float *yr = yf + r * C;
        float ss = sum_squares(xr, C);
        float rs = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[r] = rs;
        if (w)
            for (int64_t c = 0; c < C; c++)
                yr[c] = xr[c] * rs * w[c];
        else
            for (int64_t c = 0; c < C; c++)
                yr[c] = xr[c] * rs;
    }
}

/* x (N, C) -> y (N, C), rstd (N):  y = x * rstd * w,
 * rstd = 1 / sqrt(mean(x^2) + eps) */
CPU_KERNEL(rmsnorm) {
    ts_tensor *x = n->in[0], *y = n->out;
    int64_t C = x->shape[x->ndim - 1], N = C ? ts_tensor_numel(x) / C : 0;
    float *xt = NULL, *wt = NULL, *yt = NULL;
    const float *xf = cpu_as_f32(x, &xt);
    const float *w = n->n_in > 1 ? cpu_as_f32(n->in[1], &wt) : NULL;
    float *yf = y->dtype == TS_F32
                    ? (float *)ts_tensor_ptr(y)
                    : (yt = malloc(sizeof(float) * (size_t)(N * C + 1)));
    float *rstd = (float *)ts_tensor_ptr(n->saved[0]);
    float eps = (float)n->attrs.f[0];
    if (!xf || (n->n_in > 1 && !w) || !yf) {
        cpu_tmp_free(xt), cpu_tmp_free(wt), cpu_tmp_free(yt);
        return OOM("rmsnorm");
    }
    norm_job job = {.x = xf, .w = w, .y = yf, .rstd = rstd, .eps = eps, .C = C};
    ts_parallel_for(N, cpu_grain(C, 16384), rmsnorm_rows, &job);
    if (yt)
        cpu_store_out(y, yt);
    cpu_tmp_free(xt), cpu_tmp_free(wt), cpu_tmp_free(yt);
    return TS_OK;
}

static void rmsnorm_backward_rows(void *p_, int64_t lo_, int64_t hi_) {
    const norm_job *a_ = p_;
    const float *gf = a_->g;
    const float *xf = a_->x;
    const float *w = a_->w;
    const float *rstd = a_->rstd;
    float *yf = a_->y;
    int64_t C = a_->C;
    for (int64_t r = lo_; r < hi_; r++) {
        const float *gr = gf + r * C, *xr = xf + r * C;
        float *dr = yf + r * C, rs = rstd[r];
        double dot = 0;
        for (int64_t c = 0; c < C; c++)
            dot += (double)gr[c] * (w ? w[c] : 1.0f) * xr[c] * rs;
        float m = (float)(dot / (double)C);
        for (int64_t c = 0; c < C; c++)
            dr[c] = rs * (gr[c] * (w ? w[c] : 1.0f) - xr[c] * rs * m);
    }
}

/* dx = rstd * (g*w - xhat * mean(g*w*xhat)),  xhat = x * rstd
 * inputs: g, x, rstd, [w] */
CPU_KERNEL(rmsnorm_backward) {
    ts_tensor *x = n->in[1], *y = n->out;
    int64_t C = x->shape[x->ndim - 1], N = C ? ts_tensor_numel(x) / C : 0;
    float *gt = NULL, *xt = NULL, *wt = NULL, *yt = NULL;
    const float *gf = cpu_as_f32(n->in[0], &gt), *xf = cpu_as_f32(x, &xt);
    float *rstd = (float *)ts_tensor_ptr(n->in[2]);
    const float *w = n->n_in > 3 ? cpu_as_f32(n->in[3], &wt) : NULL;
    float *yf = y->dtype == TS_F32
                    ? (float *)ts_tensor_ptr(y)
                    : (yt = malloc(sizeof(float) * (size_t)(N * C + 1)));
    if (!gf || !xf || (n->n_in > 3 && !w) || !yf) {
        cpu_tmp_free(gt), cpu_tmp_free(xt), cpu_tmp_free(wt), cpu_tmp_free(yt);
        return OOM("rmsnorm_backward");
    }
    norm_job job = {.g = gf, .x = xf, .w = w, .rstd = rstd, .y = yf, .C = C};
    ts_parallel_for(N, cpu_grain(C, 16384), rmsnorm_backward_rows, &job);
    if (yt)
        cpu_store_out(y, yt);
    cpu_tmp_free(gt), cpu_tmp_free(xt), cpu_tmp_free(wt), cpu_tmp_free(yt);
    return TS_OK;
}

static void layernorm_rows(void *p_, int64_t lo_, int64_t hi_) {
    const norm_job *a_ = p_;
    const float *xf = a_->x;
    const float *w = a_->w;
    const float *b = a_->b;
    float *yf = a_->y;
    float *mean = a_->mean;
    float *rstd = a_->rstd;
    float eps = a_->eps;
    int64_t C = a_->C;
    for (int64_t r = lo_; r < hi_; r++) {
        const float *xr = xf + r * C;
        float *yr = yf + r * C;
        double s = 0;
        for (int64_t c = 0; c < C; c++)
            s += xr[c];
        float mu = (float)(s / (double)C);
        double v = 0;
        for (int64_t c = 0; c < C; c++)
            v += (double)(xr[c] - mu) * (xr[c] - mu);
        float rs = 1.0f / sqrtf((float)(v / (double)C) + eps);
        mean[r] = mu;
        rstd[r] = rs;
        for (int64_t c = 0; c < C; c++) {
            float h = (xr[c] - mu) * rs;
            yr[c] = h * (w ? w[c] : 1.0f) + (b ? b[c] : 0.0f);
        }
    }
}

/* y = (x - mean) * rstd * w + b; saved mean, rstd (N). inputs x, [w], [b] */
CPU_KERNEL(layernorm) {
    ts_tensor *x = n->in[0], *y = n->out;
    bool has_w = n->attrs.i[0], has_b = n->attrs.i[1];
    int64_t C = x->shape[x->ndim - 1], N = C ? ts_tensor_numel(x) / C : 0;
    float *xt = NULL, *wt = NULL, *bt = NULL, *yt = NULL;
    const float *xf = cpu_as_f32(x, &xt);
    const float *w = has_w ? cpu_as_f32(n->in[1], &wt) : NULL;
    const float *b = has_b ? cpu_as_f32(n->in[has_w ? 2 : 1], &bt) : NULL;
    float *yf = y->dtype == TS_F32
                    ? (float *)ts_tensor_ptr(y)
                    : (yt = malloc(sizeof(float) * (size_t)(N * C + 1)));
    float *mean = (float *)ts_tensor_ptr(n->saved[0]);
    float *rstd = (float *)ts_tensor_ptr(n->saved[1]);
    float eps = (float)n->attrs.f[0];
    if (!xf || (has_w && !w) || (has_b && !b) || !yf) {
        cpu_tmp_free(xt), cpu_tmp_free(wt), cpu_tmp_free(bt), cpu_tmp_free(yt);
        return OOM("layernorm");
    }
    norm_job job = {.x = xf,
                    .w = w,
                    .b = b,
                    .y = yf,
                    .mean = mean,
                    .rstd = rstd,
                    .eps = eps,
                    .C = C};
    ts_parallel_for(N, cpu_grain(C, 16384), layernorm_rows, &job);
    if (yt)
        cpu_store_out(y, yt);
    cpu_tmp_free(xt), cpu_tmp_free(wt), cpu_tmp_free(bt), cpu_tmp_free(yt);
    return TS_OK;
}

static void layernorm_backward_rows(void *p_, int64_t lo_, int64_t hi_) {
    const norm_job *a_ = p_;
    const float *gf = a_->g;
    const float *xf = a_->x;
    const float *w = a_->w;
    const float *mean = a_->mean;
    const float *rstd = a_->rstd;
    float *yf = a_->y;
    int64_t C = a_->C;
    for (int64_t r = lo_; r < hi_; r++) {
        const float *gr = gf + r * C, *xr = xf + r * C;
        float *dr = yf + r * C, mu = mean[r], rs = rstd[r];
        double s1 = 0, s2 = 0;
        for (int64_t c = 0; c < C; c++) {
            float gw = gr[c] * (w ? w[c] : 1.0f);
            s1 += gw;
            s2 += (double)gw * (xr[c] - mu) * rs;
        }
        float m1 = (float)(s1 / (double)C), m2 = (float)(s2 / (double)C);
        for (int64_t c = 0; c < C; c++) {
            float gw = gr[c] * (w ? w[c] : 1.0f);
            dr[c] = rs * (gw - m1 - (xr[c] - mu) * rs * m2);
        }
    }
}

/* dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * w
 * inputs: g, x, mean, rstd, [w] */
CPU_KERNEL(layernorm_backward) {
    ts_tensor *x = n->in[1], *y = n->out;
    int64_t C = x->shape[x->ndim - 1], N = C ? ts_tensor_numel(x) / C : 0;
    float *gt = NULL, *xt = NULL, *wt = NULL, *yt = NULL;
    const float *gf = cpu_as_f32(n->in[0], &gt), *xf = cpu_as_f32(x, &xt);
    float *mean = (float *)ts_tensor_ptr(n->in[2]);
    float *rstd = (float *)ts_tensor_ptr(n->in[3]);
    const float *w = n->n_in > 4 ? cpu_as_f32(n->in[4], &wt) : NULL;
    float *yf = y->dtype == TS_F32
                    ? (float *)ts_tensor_ptr(y)
                    : (yt = malloc(sizeof(float) * (size_t)(N * C + 1)));
    if (!gf || !xf || (n->n_in > 4 && !w) || !yf) {
        cpu_tmp_free(gt), cpu_tmp_free(xt), cpu_tmp_free(wt), cpu_tmp_free(yt);
        return OOM("layernorm_backward");
    }
    norm_job job = {
        .g = gf, .x = xf, .w = w, .mean = mean, .rstd = rstd, .y = yf, .C = C};
    ts_parallel_for(N, cpu_grain(C, 16384), layernorm_backward_rows, &job);
    if (yt)
        cpu_store_out(y, yt);
    cpu_tmp_free(gt), cpu_tmp_free(xt), cpu_tmp_free(wt), cpu_tmp_free(yt);
    return TS_OK;
}

typedef struct {
    const ts_tensor *x;
    const ts_tensor *cs;
    const ts_tensor *sn;
    ts_tensor *y;
    const cpu_iter *itp;
    int64_t h;
    int64_t xd;
    int64_t cd;
    int64_t sd;
    bool fwd;
} rope_rows_args;

static void rope_rows(void *p_, int64_t lo_, int64_t hi_) {
    const rope_rows_args *a_ = p_;
    const ts_tensor *x = a_->x;
    const ts_tensor *cs = a_->cs;
    const ts_tensor *sn = a_->sn;
    ts_tensor *y = a_->y;
    const cpu_iter *itp = a_->itp;
    int64_t h = a_->h;
    int64_t xd = a_->xd;
    int64_t cd = a_->cd;
    int64_t sd = a_->sd;
    bool fwd = a_->fwd;
    for (int64_t r = lo_; r < hi_; r++) {
        float xb[1024], cb[1024], sb[1024], yb[1024];
        int64_t off[4] = {0, 0, 0, 0};
        /* rows of the shape with last dim 1: all iterator dims are "rows" */
        int64_t rem = r;
        for (int d = itp->ndim - 1; d >= 0; d--) {
            int64_t i = rem % itp->shape[d];
            rem /= itp->shape[d];
            for (int k = 0; k < 4; k++)
                off[k] += i * itp->st[k][d];
        }
        for (int64_t d0 = 0; d0 < h; d0 += 512) {
            int64_t m = h - d0 < 512 ? h - d0 : 512;
            /* first-half and second-half pieces [d0, d0+m) and [h+d0, ...) */
            for (int half = 0; half < 2; half++) {
                int64_t base = half * h + d0;
                cpu_gather_f32(xb + half * 512,
                               ts_tensor_ptr(x) +
                                   (off[1] + base * xd) *
                                       (int64_t)ts_dtype_size(x->dtype),
                               x->dtype, xd, m);
                cpu_gather_f32(cb + half * 512,
                               ts_tensor_ptr(cs) +
                                   (off[2] + base * cd) *
                                       (int64_t)ts_dtype_size(cs->dtype),
                               cs->dtype, cd, m);
                cpu_gather_f32(sb + half * 512,
                               ts_tensor_ptr(sn) +
                                   (off[3] + base * sd) *
                                       (int64_t)ts_dtype_size(sn->dtype),
                               sn->dtype, sd, m);
            }
            for (int64_t i = 0; i < m; i++) {
                float x1 = xb[i], x2 = xb[512 + i];
                if (fwd) {
                    yb[i] = x1 * cb[i] - x2 * sb[i];
                    yb[512 + i] = x2 * cb[512 + i] + x1 * sb[512 + i];
                } else {
                    yb[i] = x1 * cb[i] + x2 * sb[512 + i];
                    yb[512 + i] = x2 * cb[512 + i] - x1 * sb[i];
                }
            }
            size_t es = ts_dtype_size(y->dtype);
            cpu_scatter_f32(ts_tensor_ptr(y) + (off[0] + d0) * (int64_t)es,
                            y->dtype, 1, yb, m);
            cpu_scatter_f32(ts_tensor_ptr(y) + (off[0] + h + d0) * (int64_t)es,
                            y->dtype, 1, yb + 512, m);
        }
    }
}

/* x (..., T, D), cos/sin broadcast to x. direction +1:
 *   y[d]   = x[d] c[d]     - x[d+h] s[d]
 *   y[d+h] = x[d+h] c[d+h] + x[d] s[d+h]           (h = D/2)
 * direction -1 applies the transpose (the backward of the above). */
CPU_KERNEL(rope) {
    ts_tensor *x = n->in[0], *cs = n->in[1], *sn = n->in[2], *y = n->out;
    int64_t D = x->shape[x->ndim - 1], h = D / 2;
    int64_t rows = D ? ts_tensor_numel(x) / D : 0;
    bool fwd = n->attrs.f[0] > 0;
    int64_t st[CPU_ITER_MAX_OPS][TS_MAX_DIMS];
    memcpy(st[0], y->strides, sizeof st[0]);
    memcpy(st[1], x->strides, sizeof st[1]);
    ts_broadcast_strides(cs, x->ndim, x->shape, st[2]);
    ts_broadcast_strides(sn, x->ndim, x->shape, st[3]);
    /* iterate rows over all dims but the last, which the loop below does */
    cpu_iter it;
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = 1;
    cpu_iter_init(&it, x->ndim, shape, 4, st);
    int64_t xd = x->strides[x->ndim - 1], cd = st[2][x->ndim - 1],
            sd = st[3][x->ndim - 1];
    (void)ctx;
    rope_rows_args job = {x, cs, sn, y, &it, h, xd, cd, sd, fwd};
    ts_parallel_for(rows, cpu_grain(D, 16384), rope_rows, &job);
    return TS_OK;
}
