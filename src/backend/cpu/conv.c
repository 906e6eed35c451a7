/* conv.c — CPU kernels of the image ops (src/ops/image_ops.c) on NCHW
 * f32: conv2d forward and its two backward products, group norm and its
 * backward, nearest upsampling, average pooling and its backward.
 *
 * conv2d is a GEMM (OpenBLAS's sgemm through ts_sgemm, whose slicing
 * depends on the shape alone) over packed patches: for each image and
 * group, a band of output rows at a time, the patches are laid out as
 * cols (K' = C/groups * KH * KW, P = band rows * OW) and
 *   out[g] (O/groups, P) = w[g] (O/groups, K') cols.
 * A 1x1 kernel with stride 1 and no padding reads x as cols directly; a
 * depthwise convolution (one input channel per group) runs a direct loop
 * instead, as a GEMM of one row would waste the kernel. The bands keep
 * cols near COLS_BYTES, so a 512x512 image needs no gigabyte buffer.
 * Every kernel gives the same bits for any thread count. */
#include "backend/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define COLS_BYTES (8u << 20)

enum { C_SH, C_SW, C_PT, C_PB, C_PL, C_PR, C_DH, C_DW, C_G, C_BIAS, C_SHAPE };

typedef struct {
    int64_t B, C, H, W, O, KH, KW, OH, OW, G, Cg, Og, Kc;
    int64_t sh, sw, pt, pl, dh, dw;
} conv_geom;

static conv_geom geom(const int64_t *a, const int64_t *xs, const int64_t *ws,
                      const int64_t *ys) {
    conv_geom g = {.B = xs[0],
                   .C = xs[1],
                   .H = xs[2],
                   .W = xs[3],
                   .O = ws[0],
                   .KH = ws[2],
                   .KW = ws[3],
                   .OH = ys[2],
                   .OW = ys[3],
                   .G = a[C_G],
                   .sh = a[C_SH],
                   .sw = a[C_SW],
                   .pt = a[C_PT],
                   .pl = a[C_PL],
                   .dh = a[C_DH],
                   .dw = a[C_DW]};
    g.Cg = g.C / g.G;
    g.Og = g.O / g.G;
    g.Kc = g.Cg * g.KH * g.KW;
    return g;
}

static bool is_pointwise(const conv_geom *g) {
    return g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->pt == 0 &&
           g->pl == 0 && g->OH == g->H && g->OW == g->W;
}

/* the band budget: COLS_BYTES, or TS_CONV_BAND_BYTES (tests make bands
 * small to run the banded paths on small images) */
static int64_t band_bytes(void) {
    const char *e = getenv("TS_CONV_BAND_BYTES");
    long long v = e ? atoll(e) : 0;
    return v > 0 ? (int64_t)v : (int64_t)COLS_BYTES;
}

/* output rows per band: cols of at most band_bytes(), at least one row */
static int64_t band_rows(const conv_geom *g) {
    int64_t per_row = g->Kc * g->OW * (int64_t)sizeof(float);
    int64_t r = per_row > 0 ? band_bytes() / per_row : g->OH;
    return r < 1 ? 1 : r > g->OH ? g->OH : r;
}

typedef struct {
    const conv_geom *g;
    const float *x; /* (Cg, H, W): one image's group */
    float *col;     /* (Kc, (oh1 - oh0) OW) */
    int64_t oh0, oh1;
} im2col_job;

/* rows r = (c, kh, kw) of cols: x's pixels each output position reads */
static void im2col_rows(void *p, int64_t lo, int64_t hi) {
    const im2col_job *j = p;
    const conv_geom *g = j->g;
    int64_t P = (j->oh1 - j->oh0) * g->OW;
    for (int64_t r = lo; r < hi; r++) {
        int64_t c = r / (g->KH * g->KW), kh = r / g->KW % g->KH, kw = r % g->KW;
        const float *xc = j->x + c * g->H * g->W;
        float *dst = j->col + r * P;
        for (int64_t oh = j->oh0; oh < j->oh1; oh++, dst += g->OW) {
            int64_t ih = oh * g->sh - g->pt + kh * g->dh;
            if (ih < 0 || ih >= g->H) {
                memset(dst, 0, sizeof(float) * (size_t)g->OW);
                continue;
            }
            const float *row = xc + ih * g->W;
            int64_t off = kw * g->dw - g->pl;
            if (g->sw == 1) { /* a shifted copy with zero edges */
                int64_t a = off < 0 ? -off : 0;
                int64_t b = g->W - off < g->OW ? g->W - off : g->OW;
                if (b < a)
                    b = a;
                memset(dst, 0, sizeof(float) * (size_t)a);
                memcpy(dst + a, row + a + off, sizeof(float) * (size_t)(b - a));
                memset(dst + b, 0, sizeof(float) * (size_t)(g->OW - b));
                continue;
            }
            for (int64_t ow = 0; ow < g->OW; ow++) {
                int64_t iw = ow * g->sw + off;
                dst[ow] = iw >= 0 && iw < g->W ? row[iw] : 0.0f;
            }
        }
    }
}

static void im2col(const conv_geom *g, const float *x, float *col, int64_t oh0,
                   int64_t oh1) {
    im2col_job j = {.g = g, .x = x, .col = col, .oh0 = oh0, .oh1 = oh1};
    ts_parallel_for(g->Kc, cpu_grain((oh1 - oh0) * g->OW, 16384), im2col_rows,
                    &j);
}

/* col2im: dx channels of one image's group += the cols' contributions;
 * a channel's rows are added by one thread in a fixed order */
static void col2im_channels(void *p, int64_t lo, int64_t hi) {
    const im2col_job *j = p;
    const conv_geom *g = j->g;
    int64_t P = (j->oh1 - j->oh0) * g->OW;
    for (int64_t c = lo; c < hi; c++) {
        float *xc = (float *)j->x + c * g->H * g->W;
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++) {
                const float *src = j->col + ((c * g->KH + kh) * g->KW + kw) * P;
                for (int64_t oh = j->oh0; oh < j->oh1; oh++, src += g->OW) {
                    int64_t ih = oh * g->sh - g->pt + kh * g->dh;
                    if (ih < 0 || ih >= g->H)
                        continue;
                    float *row = xc + ih * g->W;
                    int64_t off = kw * g->dw - g->pl;
                    for (int64_t ow = 0; ow < g->OW; ow++) {
                        int64_t iw = ow * g->sw + off;
                        if (iw >= 0 && iw < g->W)
                            row[iw] += src[ow];
                    }
                }
            }
    }
}

typedef struct {
    const conv_geom *g;
    const float *x, *w;
    float *y;
} dw_job;

/* depthwise: plane (b, c) of y from plane (b, c) of x and kernel c */
static void depthwise_planes(void *p, int64_t lo, int64_t hi) {
    const dw_job *j = p;
    const conv_geom *g = j->g;
    for (int64_t bc = lo; bc < hi; bc++) {
        int64_t c = bc % g->C;
        const float *xp = j->x + bc * g->H * g->W;
        const float *wk = j->w + c * g->KH * g->KW;
        float *yp = j->y + bc * g->OH * g->OW;
        for (int64_t oh = 0; oh < g->OH; oh++)
            for (int64_t ow = 0; ow < g->OW; ow++) {
                float s = 0.0f;
                for (int64_t kh = 0; kh < g->KH; kh++) {
                    int64_t ih = oh * g->sh - g->pt + kh * g->dh;
                    if (ih < 0 || ih >= g->H)
                        continue;
                    for (int64_t kw = 0; kw < g->KW; kw++) {
                        int64_t iw = ow * g->sw - g->pl + kw * g->dw;
                        if (iw >= 0 && iw < g->W)
                            s += wk[kh * g->KW + kw] * xp[ih * g->W + iw];
                    }
                }
                yp[oh * g->OW + ow] = s;
            }
    }
}

typedef struct {
    float *y;
    const float *b;
    int64_t O, plane;
} bias_job;

static void add_bias(void *p, int64_t lo, int64_t hi) {
    const bias_job *j = p;
    for (int64_t r = lo; r < hi; r++) {
        float v = j->b[r % j->O], *y = j->y + r * j->plane;
        for (int64_t k = 0; k < j->plane; k++)
            y[k] += v;
    }
}

static void fill_bias(void *p, int64_t lo, int64_t hi) {
    const bias_job *j = p;
    for (int64_t r = lo; r < hi; r++) {
        float v = j->b[r % j->O], *y = j->y + r * j->plane;
        for (int64_t k = 0; k < j->plane; k++)
            y[k] = v;
    }
}

static float *out_f32(ts_tensor *y, float **tmp) {
    *tmp = NULL;
    if (y->dtype == TS_F32)
        return (float *)ts_tensor_ptr(y);
    return *tmp = malloc(sizeof(float) * (size_t)(ts_tensor_numel(y) + 1));
}

static ts_status finish(ts_ctx *ctx, const char *op, ts_tensor *y, float *yt,
                        bool ok, float **tmps, int ntmp) {
    if (ok && yt)
        cpu_store_out(y, yt);
    free(yt);
    for (int k = 0; k < ntmp; k++)
        cpu_tmp_free(tmps[k]);
    return ok ? TS_OK : ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", op);
}

/* x (B, C, H, W), w (O, C/G, KH, KW), [b (O)] -> y (B, O, OH, OW) */
CPU_KERNEL(conv2d) {
    ts_tensor *x = n->in[0], *w = n->in[1], *y = n->out;
    conv_geom g = geom(n->attrs.i, x->shape, w->shape, y->shape);
    float *tmp[3] = {NULL, NULL, NULL}, *yt, *col = NULL;
    const float *xf = cpu_as_f32(x, &tmp[0]), *wf = cpu_as_f32(w, &tmp[1]);
    const float *bf = n->attrs.i[C_BIAS] ? cpu_as_f32(n->in[2], &tmp[2]) : NULL;
    float *yf = out_f32(y, &yt);
    bool ok = xf && wf && yf && (bf || !n->attrs.i[C_BIAS]);
    int64_t plane = g.OH * g.OW, rows = band_rows(&g);
    if (ok && g.Cg == 1 && g.Og == 1 && g.G > 1) {
        dw_job j = {.g = &g, .x = xf, .w = wf, .y = yf};
        ts_parallel_for(g.B * g.C, cpu_grain(plane * g.KH * g.KW, 16384),
                        depthwise_planes, &j);
    } else if (ok) {
        /* the bias written first and the products added to it (beta 1):
         * one pass over y fewer than adding it after */
        if (bf) {
            bias_job j = {.y = yf, .b = bf, .O = g.O, .plane = plane};
            ts_parallel_for(g.B * g.O, cpu_grain(plane, 16384), fill_bias, &j);
        }
        float beta = bf ? 1.0f : 0.0f;
        bool pw = is_pointwise(&g);
        if (!pw &&
            !(col = malloc(sizeof(float) * (size_t)(g.Kc * rows * g.OW + 1))))
            ok = false;
        for (int64_t b = 0; ok && b < g.B; b++)
            for (int64_t gi = 0; gi < g.G; gi++) {
                const float *xg = xf + (b * g.C + gi * g.Cg) * g.H * g.W;
                const float *wg = wf + gi * g.Og * g.Kc;
                float *yg = yf + (b * g.O + gi * g.Og) * plane;
                if (pw) {
                    ts_sgemm(false, false, (int)g.Og, (int)plane, (int)g.Kc,
                             1.0f, wg, (int)g.Kc, xg, (int)plane, beta, yg,
                             (int)plane);
                    continue;
                }
                for (int64_t oh0 = 0; oh0 < g.OH; oh0 += rows) {
                    int64_t oh1 = oh0 + rows < g.OH ? oh0 + rows : g.OH;
                    int64_t P = (oh1 - oh0) * g.OW;
                    im2col(&g, xg, col, oh0, oh1);
                    ts_sgemm(false, false, (int)g.Og, (int)P, (int)g.Kc, 1.0f,
                             wg, (int)g.Kc, col, (int)P, beta, yg + oh0 * g.OW,
                             (int)plane);
                }
            }
    }
    if (ok && bf && g.Cg == 1 && g.Og == 1 && g.G > 1) { /* depthwise */
        bias_job j = {.y = yf, .b = bf, .O = g.O, .plane = plane};
        ts_parallel_for(g.B * g.O, cpu_grain(plane, 16384), add_bias, &j);
    }
    free(col);
    return finish(ctx, "conv2d", y, yt, ok, tmp, 3);
}

/* g (B, O, OH, OW), w (O, C/G, KH, KW) -> dx (B, C, H, W) */
CPU_KERNEL(conv2d_backward_input) {
    ts_tensor *gy = n->in[0], *w = n->in[1], *dx = n->out;
    conv_geom g = geom(n->attrs.i, dx->shape, w->shape, gy->shape);
    float *tmp[2] = {NULL, NULL}, *dxt, *col = NULL;
    const float *gf = cpu_as_f32(gy, &tmp[0]), *wf = cpu_as_f32(w, &tmp[1]);
    float *dxf = out_f32(dx, &dxt);
    bool ok = gf && wf && dxf;
    int64_t plane = g.OH * g.OW, rows = band_rows(&g);
    bool pw = is_pointwise(&g);
    if (ok) {
        memset(dxf, 0, sizeof(float) * (size_t)ts_tensor_numel(dx));
        if (!pw &&
            !(col = malloc(sizeof(float) * (size_t)(g.Kc * rows * g.OW + 1))))
            ok = false;
    }
    for (int64_t b = 0; ok && b < g.B; b++)
        for (int64_t gi = 0; gi < g.G; gi++) {
            float *xg = dxf + (b * g.C + gi * g.Cg) * g.H * g.W;
            const float *wg = wf + gi * g.Og * g.Kc;
            const float *gg = gf + (b * g.O + gi * g.Og) * plane;
            if (pw) { /* dx[g] (Cg, HW) = w[g]^T (Cg, Og) g (Og, HW) */
                ts_sgemm(true, false, (int)g.Kc, (int)plane, (int)g.Og, 1.0f,
                         wg, (int)g.Kc, gg, (int)plane, 0.0f, xg, (int)plane);
                continue;
            }
            for (int64_t oh0 = 0; oh0 < g.OH; oh0 += rows) {
                int64_t oh1 = oh0 + rows < g.OH ? oh0 + rows : g.OH;
                int64_t P = (oh1 - oh0) * g.OW;
                ts_sgemm(true, false, (int)g.Kc, (int)P, (int)g.Og, 1.0f, wg,
                         (int)g.Kc, gg + oh0 * g.OW, (int)plane, 0.0f, col,
                         (int)P);
                im2col_job j = {
                    .g = &g, .x = xg, .col = col, .oh0 = oh0, .oh1 = oh1};
                ts_parallel_for(g.Cg, 1, col2im_channels, &j);
            }
        }
    free(col);
    return finish(ctx, "conv2d_backward_input", dx, dxt, ok, tmp, 2);
}

/* g (B, O, OH, OW), x (B, C, H, W) -> dw (O, C/G, KH, KW), f32; the images
 * and bands are added in order */
CPU_KERNEL(conv2d_backward_weight) {
    ts_tensor *gy = n->in[0], *x = n->in[1], *dw = n->out;
    conv_geom g = geom(n->attrs.i, x->shape, dw->shape, gy->shape);
    float *tmp[2] = {NULL, NULL}, *col = NULL;
    const float *gf = cpu_as_f32(gy, &tmp[0]), *xf = cpu_as_f32(x, &tmp[1]);
    float *dwf = (float *)ts_tensor_ptr(dw);
    bool ok = gf && xf;
    int64_t plane = g.OH * g.OW, rows = band_rows(&g);
    bool pw = is_pointwise(&g);
    if (ok) {
        memset(dwf, 0, sizeof(float) * (size_t)ts_tensor_numel(dw));
        if (!pw &&
            !(col = malloc(sizeof(float) * (size_t)(g.Kc * rows * g.OW + 1))))
            ok = false;
    }
    for (int64_t b = 0; ok && b < g.B; b++)
        for (int64_t gi = 0; gi < g.G; gi++) {
            const float *xg = xf + (b * g.C + gi * g.Cg) * g.H * g.W;
            float *wg = dwf + gi * g.Og * g.Kc;
            const float *gg = gf + (b * g.O + gi * g.Og) * plane;
            if (pw) { /* dw[g] (Og, Cg) += g (Og, HW) x[g]^T (HW, Cg) */
                ts_sgemm(false, true, (int)g.Og, (int)g.Kc, (int)plane, 1.0f,
                         gg, (int)plane, xg, (int)plane, 1.0f, wg, (int)g.Kc);
                continue;
            }
            for (int64_t oh0 = 0; oh0 < g.OH; oh0 += rows) {
                int64_t oh1 = oh0 + rows < g.OH ? oh0 + rows : g.OH;
                int64_t P = (oh1 - oh0) * g.OW;
                im2col(&g, xg, col, oh0, oh1);
                ts_sgemm(false, true, (int)g.Og, (int)g.Kc, (int)P, 1.0f,
                         gg + oh0 * g.OW, (int)plane, col, (int)P, 1.0f, wg,
                         (int)g.Kc);
            }
        }
    free(col);
    return finish(ctx, "conv2d_backward_weight", dw, NULL, ok, tmp, 2);
}

/* ---- group norm ---------------------------------------------------------- */

typedef struct {
    const float *x, *g, *w, *b;
    float *y, *mean, *rstd;
    int64_t C, Cg, G, S; /* S: positions per channel */
    float eps;
} gn_job;

/* one (image, group) per row: N = Cg S values */
static void gn_rows(void *p, int64_t lo, int64_t hi) {
    const gn_job *j = p;
    int64_t N = j->Cg * j->S;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = j->x + r * N;
        float *y = j->y + r * N;
        double s = 0;
        for (int64_t k = 0; k < N; k++)
            s += x[k];
        float mu = (float)(s / (double)N);
        double v = 0;
        for (int64_t k = 0; k < N; k++)
            v += (double)(x[k] - mu) * (x[k] - mu);
        float rs = 1.0f / sqrtf((float)(v / (double)N) + j->eps);
        j->mean[r] = mu;
        j->rstd[r] = rs;
        int64_t c0 = r % j->G * j->Cg;
        for (int64_t c = 0; c < j->Cg; c++) {
            float a = j->w ? j->w[c0 + c] : 1.0f;
            float b = j->b ? j->b[c0 + c] : 0.0f;
            const float *xc = x + c * j->S;
            float *yc = y + c * j->S;
            for (int64_t k = 0; k < j->S; k++)
                yc[k] = (xc[k] - mu) * rs * a + b;
        }
    }
}

/* x (B, C, ...), [w (C)], [b (C)] -> y; saved mean, rstd (B, G) */
CPU_KERNEL(group_norm) {
    ts_tensor *x = n->in[0], *y = n->out;
    bool has_w = n->attrs.i[1], has_b = n->attrs.i[2];
    int64_t B = x->shape[0], C = x->shape[1], G = n->attrs.i[0];
    int64_t S = B > 0 && C > 0 ? ts_tensor_numel(x) / (B * C) : 0;
    float *tmp[3] = {NULL, NULL, NULL}, *yt;
    const float *xf = cpu_as_f32(x, &tmp[0]);
    const float *wf = has_w ? cpu_as_f32(n->in[1], &tmp[1]) : NULL;
    const float *bf = has_b ? cpu_as_f32(n->in[has_w ? 2 : 1], &tmp[2]) : NULL;
    float *yf = out_f32(y, &yt);
    bool ok = xf && yf && (wf || !has_w) && (bf || !has_b);
    if (ok) {
        gn_job j = {.x = xf,
                    .w = wf,
                    .b = bf,
                    .y = yf,
                    .mean = (float *)ts_tensor_ptr(n->saved[0]),
                    .rstd = (float *)ts_tensor_ptr(n->saved[1]),
                    .C = C,
                    .Cg = C / G,
                    .G = G,
                    .S = S,
                    .eps = (float)n->attrs.f[0]};
        ts_parallel_for(B * G, cpu_grain(C / G * S, 16384), gn_rows, &j);
    }
    return finish(ctx, "group_norm", y, yt, ok, tmp, 3);
}

/* dx = rstd (gw - mean(gw) - xhat mean(gw xhat)), gw = g w, per group */
static void gn_backward_rows(void *p, int64_t lo, int64_t hi) {
    const gn_job *j = p;
    int64_t N = j->Cg * j->S;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = j->x + r * N, *g = j->g + r * N;
        float *dx = j->y + r * N;
        float mu = j->mean[r], rs = j->rstd[r];
        int64_t c0 = r % j->G * j->Cg;
        double s1 = 0, s2 = 0;
        for (int64_t c = 0; c < j->Cg; c++) {
            float a = j->w ? j->w[c0 + c] : 1.0f;
            for (int64_t k = c * j->S; k < (c + 1) * j->S; k++) {
                float gw = g[k] * a;
                s1 += gw;
                s2 += (double)gw * ((x[k] - mu) * rs);
            }
        }
        float m1 = (float)(s1 / (double)N), m2 = (float)(s2 / (double)N);
        for (int64_t c = 0; c < j->Cg; c++) {
            float a = j->w ? j->w[c0 + c] : 1.0f;
            for (int64_t k = c * j->S; k < (c + 1) * j->S; k++) {
                float h = (x[k] - mu) * rs;
                dx[k] = rs * (g[k] * a - m1 - h * m2);
            }
        }
    }
}

/* g, x, mean, rstd, [w] -> dx */
CPU_KERNEL(group_norm_backward) {
    ts_tensor *x = n->in[1], *dx = n->out;
    int64_t B = x->shape[0], C = x->shape[1], G = n->attrs.i[0];
    int64_t S = B > 0 && C > 0 ? ts_tensor_numel(x) / (B * C) : 0;
    float *tmp[5] = {NULL, NULL, NULL, NULL, NULL}, *dxt;
    const float *gf = cpu_as_f32(n->in[0], &tmp[0]);
    const float *xf = cpu_as_f32(x, &tmp[1]);
    const float *mean = cpu_as_f32(n->in[2], &tmp[2]);
    const float *rstd = cpu_as_f32(n->in[3], &tmp[3]);
    const float *wf = n->n_in > 4 ? cpu_as_f32(n->in[4], &tmp[4]) : NULL;
    float *dxf = out_f32(dx, &dxt);
    bool ok = gf && xf && mean && rstd && dxf && (wf || n->n_in <= 4);
    if (ok) {
        gn_job j = {.x = xf,
                    .g = gf,
                    .w = wf,
                    .y = dxf,
                    .mean = (float *)mean,
                    .rstd = (float *)rstd,
                    .C = C,
                    .Cg = C / G,
                    .G = G,
                    .S = S};
        ts_parallel_for(B * G, cpu_grain(C / G * S, 16384), gn_backward_rows,
                        &j);
    }
    return finish(ctx, "group_norm_backward", dx, dxt, ok, tmp, 5);
}

/* ---- upsampling and pooling -----------------------------------------------
 */

typedef struct {
    const float *x;
    float *y;
    int64_t H, W, OH, OW, kh, kw, sh, sw;
    float scale;
} pool_job;

static void upsample_planes(void *p, int64_t lo, int64_t hi) {
    const pool_job *j = p;
    for (int64_t pl = lo; pl < hi; pl++) {
        const float *x = j->x + pl * j->H * j->W;
        float *y = j->y + pl * j->OH * j->OW;
        for (int64_t oh = 0; oh < j->OH; oh++) {
            const float *row = x + oh / j->sh * j->W;
            float *out = y + oh * j->OW;
            for (int64_t ow = 0; ow < j->OW; ow++)
                out[ow] = row[ow / j->sw];
        }
    }
}

/* x (B, C, H, W) -> (B, C, H sh, W sw) */
CPU_KERNEL(upsample_nearest) {
    ts_tensor *x = n->in[0], *y = n->out;
    float *tmp = NULL, *yt;
    const float *xf = cpu_as_f32(x, &tmp);
    float *yf = out_f32(y, &yt);
    bool ok = xf && yf;
    if (ok) {
        pool_job j = {.x = xf,
                      .y = yf,
                      .H = x->shape[2],
                      .W = x->shape[3],
                      .OH = y->shape[2],
                      .OW = y->shape[3],
                      .sh = n->attrs.i[0],
                      .sw = n->attrs.i[1]};
        ts_parallel_for(x->shape[0] * x->shape[1],
                        cpu_grain(j.OH * j.OW, 16384), upsample_planes, &j);
    }
    return finish(ctx, "upsample_nearest2d", y, yt, ok, &tmp, 1);
}

static void pool_planes(void *p, int64_t lo, int64_t hi) {
    const pool_job *j = p;
    for (int64_t pl = lo; pl < hi; pl++) {
        const float *x = j->x + pl * j->H * j->W;
        float *y = j->y + pl * j->OH * j->OW;
        for (int64_t oh = 0; oh < j->OH; oh++)
            for (int64_t ow = 0; ow < j->OW; ow++) {
                float s = 0.0f;
                for (int64_t a = 0; a < j->kh; a++)
                    for (int64_t b = 0; b < j->kw; b++)
                        s += x[(oh * j->sh + a) * j->W + ow * j->sw + b];
                y[oh * j->OW + ow] = s * j->scale;
            }
    }
}

/* x (B, C, H, W) -> (B, C, OH, OW): window sums / the divisor */
CPU_KERNEL(avg_pool2d) {
    ts_tensor *x = n->in[0], *y = n->out;
    float *tmp = NULL, *yt;
    const float *xf = cpu_as_f32(x, &tmp);
    float *yf = out_f32(y, &yt);
    bool ok = xf && yf;
    if (ok) {
        pool_job j = {.x = xf,
                      .y = yf,
                      .H = x->shape[2],
                      .W = x->shape[3],
                      .OH = y->shape[2],
                      .OW = y->shape[3],
                      .kh = n->attrs.i[0],
                      .kw = n->attrs.i[1],
                      .sh = n->attrs.i[2],
                      .sw = n->attrs.i[3],
                      .scale = (float)(1.0 / n->attrs.f[0])};
        ts_parallel_for(x->shape[0] * x->shape[1],
                        cpu_grain(j.OH * j.OW * j.kh * j.kw, 16384),
                        pool_planes, &j);
    }
    return finish(ctx, "avg_pool2d", y, yt, ok, &tmp, 1);
}

static void pool_backward_planes(void *p, int64_t lo, int64_t hi) {
    const pool_job *j = p;
    for (int64_t pl = lo; pl < hi; pl++) {
        const float *g = j->x + pl * j->OH * j->OW;
        float *dx = j->y + pl * j->H * j->W;
        memset(dx, 0, sizeof(float) * (size_t)(j->H * j->W));
        for (int64_t oh = 0; oh < j->OH; oh++)
            for (int64_t ow = 0; ow < j->OW; ow++) {
                float v = g[oh * j->OW + ow] * j->scale;
                for (int64_t a = 0; a < j->kh; a++)
                    for (int64_t b = 0; b < j->kw; b++)
                        dx[(oh * j->sh + a) * j->W + ow * j->sw + b] += v;
            }
    }
}

/* g (B, C, OH, OW) -> dx (B, C, H, W) */
CPU_KERNEL(avg_pool2d_backward) {
    ts_tensor *gy = n->in[0], *dx = n->out;
    float *tmp = NULL, *dxt;
    const float *gf = cpu_as_f32(gy, &tmp);
    float *dxf = out_f32(dx, &dxt);
    bool ok = gf && dxf;
    if (ok) {
        pool_job j = {.x = gf,
                      .y = dxf,
                      .H = dx->shape[2],
                      .W = dx->shape[3],
                      .OH = gy->shape[2],
                      .OW = gy->shape[3],
                      .kh = n->attrs.i[0],
                      .kw = n->attrs.i[1],
                      .sh = n->attrs.i[2],
                      .sw = n->attrs.i[3],
                      .scale = (float)(1.0 / n->attrs.f[0])};
        ts_parallel_for(gy->shape[0] * gy->shape[1],
                        cpu_grain(j.H * j.W, 16384), pool_backward_planes, &j);
    }
    return finish(ctx, "avg_pool2d_backward", dx, dxt, ok, &tmp, 1);
}
