/* test_image_ops.c — the image ops against slow reference loops written
 * here (every conv2d path: im2col bands, 1x1, depthwise, grouped; group
 * norm; pooling; upsampling), their gradients against finite sums of the
 * reference, bits independent of the thread count, the banded paths,
 * and bad arguments named in the errors. PyTorch checks the same ops in
 * test_ops_torch (tests/ref/op_cases.py). */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, C, H, W, O, KH, KW, sh, sw, pt, pb, pl, pr, dh, dw, G;
} conv_case;

/* y[b][o][i][j] = bias[o] + sum_{c, kh, kw} w[o][c][kh][kw] x[b][g C/G +
 * c][i sh - pt + kh dh][j sw - pl + kw dw], zero outside */
static void conv_ref(const conv_case *k, const float *x, const float *w,
                     const float *bias, double *y, int OH, int OW) {
    int Cg = k->C / k->G, Og = k->O / k->G;
    for (int b = 0; b < k->B; b++)
        for (int o = 0; o < k->O; o++)
            for (int i = 0; i < OH; i++)
                for (int j = 0; j < OW; j++) {
                    double s = bias ? bias[o] : 0;
                    int g = o / Og;
                    for (int c = 0; c < Cg; c++)
                        for (int a = 0; a < k->KH; a++)
                            for (int e = 0; e < k->KW; e++) {
                                int ih = i * k->sh - k->pt + a * k->dh;
                                int iw = j * k->sw - k->pl + e * k->dw;
                                if (ih < 0 || ih >= k->H || iw < 0 ||
                                    iw >= k->W)
                                    continue;
                                s += (double)
                                         w[((o * Cg + c) * k->KH + a) * k->KW +
                                           e] *
                                     x[((b * k->C + g * Cg + c) * k->H + ih) *
                                           k->W +
                                       iw];
                            }
                    y[((b * k->O + o) * OH + i) * OW + j] = s;
                }
}

static float *rand_floats(int64_t n, unsigned seed) {
    float *v = malloc(sizeof(float) * (size_t)n);
    srand(seed);
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)rand() / RAND_MAX * 2.0f - 1.0f;
    return v;
}

static ts_tensor *conv_run(ts_ctx *ctx, const conv_case *k, const float *x,
                           const float *w, const float *b, ts_tensor **gx,
                           ts_tensor **gw, const float *gy) {
    int64_t xs[4] = {k->B, k->C, k->H, k->W};
    int64_t ws[4] = {k->O, k->C / k->G, k->KH, k->KW};
    ts_tensor *tx = ts_from_data(ctx, TS_F32, 4, xs, x);
    ts_tensor *tw = ts_from_data(ctx, TS_F32, 4, ws, w);
    ts_tensor *tb = ts_from_data(ctx, TS_F32, 1, &ws[0], b);
    ts_set_requires_grad(tx, true);
    ts_set_requires_grad(tw, true);
    ts_conv2d_opts o = {k->sh, k->sw, k->pt, k->pb, k->pl,
                        k->pr, k->dh, k->dw, k->G};
    ts_tensor *y = ts_conv2d(tx, tw, tb, &o);
    if (y && gy) {
        ts_tensor *g = ts_from_data(ctx, TS_F32, 4, ts_tensor_shape(y), gy);
        ts_tensor *p = ts_mul(y, g);
        ts_tensor *l = ts_sum(p, 0, NULL, false);
        CHECK_OK(ctx, ts_backward(l, NULL));
        *gx = ts_retain(ts_grad(tx));
        *gw = ts_retain(ts_grad(tw));
        ts_release(g), ts_release(p), ts_release(l);
    }
    ts_release(tx), ts_release(tw), ts_release(tb);
    return y;
}

static double max_rel(ts_tensor *t, const double *ref, int64_t n) {
    float *v = malloc(sizeof(float) * (size_t)n);
    ts_tensor_read(t, v, TS_F32);
    double worst = 0, scale = 1e-6;
    for (int64_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(v[i] - ref[i]) / scale);
    free(v);
    return worst;
}

static bool same_bits(ts_tensor *a, ts_tensor *b) {
    int64_t n = ts_tensor_numel(a);
    if (n != ts_tensor_numel(b))
        return false;
    float *u = malloc(sizeof(float) * (size_t)n),
          *v = malloc(sizeof(float) * (size_t)n);
    ts_tensor_read(a, u, TS_F32), ts_tensor_read(b, v, TS_F32);
    bool same = !memcmp(u, v, sizeof(float) * (size_t)n);
    free(u), free(v);
    return same;
}

/* forward against conv_ref; dx and dw against the reference's linearity:
 * dx = sum_o,i,j gy * dy/dx computed by the reference on unit inputs is too
 * slow, so the gradients are checked through <gy, conv(x, w)> = <dx, x>
 * and = <dw, w> (conv is linear in each) */
static void check_conv(ts_ctx *ctx, const conv_case *k, unsigned seed) {
    int OH = (k->H + k->pt + k->pb - k->dh * (k->KH - 1) - 1) / k->sh + 1;
    int OW = (k->W + k->pl + k->pr - k->dw * (k->KW - 1) - 1) / k->sw + 1;
    int64_t nx = (int64_t)k->B * k->C * k->H * k->W;
    int64_t nw = (int64_t)k->O * (k->C / k->G) * k->KH * k->KW;
    int64_t ny = (int64_t)k->B * k->O * OH * OW;
    float *x = rand_floats(nx, seed), *w = rand_floats(nw, seed + 1),
          *b = rand_floats(k->O, seed + 2), *gy = rand_floats(ny, seed + 3);
    double *ref = malloc(sizeof(double) * (size_t)ny);
    conv_ref(k, x, w, b, ref, OH, OW);
    ts_tensor *gx = NULL, *gw = NULL;
    ts_tensor *y = conv_run(ctx, k, x, w, b, &gx, &gw, gy);
    CHECK(y != NULL);
    if (!y)
        goto out;
    double e = max_rel(y, ref, ny);
    if (e > 1e-5)
        fprintf(stderr, "conv %dx%d C%d O%d G%d s%d: forward error %g\n", k->KH,
                k->KW, k->C, k->O, k->G, k->sh, e);
    CHECK(e <= 1e-5);
    /* <gy, y - bias> = <dx, x> = <dw, w> */
    double lhs = 0, sx = 0, sw = 0, mag = 0;
    for (int64_t i = 0; i < ny; i++) {
        int64_t o = i / (OH * OW) % k->O;
        lhs += gy[i] * (ref[i] - b[o]);
        mag += fabs(gy[i] * ref[i]);
    }
    float *vx = malloc(sizeof(float) * (size_t)nx),
          *vw = malloc(sizeof(float) * (size_t)nw);
    ts_tensor_read(gx, vx, TS_F32), ts_tensor_read(gw, vw, TS_F32);
    for (int64_t i = 0; i < nx; i++)
        sx += (double)vx[i] * x[i];
    for (int64_t i = 0; i < nw; i++)
        sw += (double)vw[i] * w[i];
    CHECK(fabs(sx - lhs) <= 1e-5 * (mag + 1));
    CHECK(fabs(sw - lhs) <= 1e-5 * (mag + 1));
    /* the same bits on one thread (ts_sgemm cuts by shape alone) */
    ts_tensor *gx2 = NULL, *gw2 = NULL, *gx3 = NULL, *gw3 = NULL;
    int nt = ts_get_num_threads(ctx);
    ts_set_num_threads(ctx, 1);
    ts_tensor *y2 = conv_run(ctx, k, x, w, b, &gx2, &gw2, gy);
    ts_set_num_threads(ctx, nt);
    CHECK(y2 && same_bits(y, y2));
    CHECK(gx2 && same_bits(gx, gx2));
    CHECK(gw2 && same_bits(gw, gw2));
    /* tiny bands (many GEMMs of other widths): the same values */
    setenv("TS_CONV_BAND_BYTES", "4096", 1);
    ts_tensor *y3 = conv_run(ctx, k, x, w, b, &gx3, &gw3, gy);
    unsetenv("TS_CONV_BAND_BYTES");
    CHECK(y3 && test_allclose("y (bands)", y3, y, 1e-5, 1e-5) <= 1);
    CHECK(gx3 && test_allclose("dx (bands)", gx3, gx, 1e-5, 1e-5) <= 1);
    CHECK(gw3 && test_allclose("dw (bands)", gw3, gw, 1e-5, 1e-5) <= 1);
    ts_release(y3), ts_release(gx3), ts_release(gw3);
    free(vx), free(vw);
    ts_release(y2), ts_release(gx2), ts_release(gw2);
out:
    ts_release(y), ts_release(gx), ts_release(gw);
    free(x), free(w), free(b), free(gy), free(ref);
}

static void test_conv_paths(ts_ctx *ctx) {
    conv_case cases[] = {
        /* B C H W O KH KW sh sw pt pb pl pr dh dw G */
        {2, 5, 13, 11, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1}, /* SD resnet */
        {1, 6, 12, 12, 6, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1}, /* downsample */
        {1, 3, 10, 10, 4, 3, 3, 2, 2, 0, 1, 0, 1, 1, 1, 1}, /* VAE's */
        {2, 8, 7, 9, 5, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1},   /* 1x1 */
        {1, 6, 9, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 6},   /* depthwise */
        {2, 6, 8, 8, 9, 3, 2, 1, 2, 2, 0, 1, 1, 2, 1, 3},   /* grouped */
        {1, 1, 16, 16, 8, 4, 4, 4, 4, 0, 0, 0, 0, 1, 1, 1}, /* patchify */
        {1, 2, 40, 33, 3, 5, 3, 1, 1, 2, 2, 1, 1, 1, 1, 1}, /* many bands */
        {1, 4, 6, 6, 2, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1},   /* 1x1 stride 2 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_conv(ctx, &cases[i], 100 + (unsigned)i * 7);
}

static void test_group_norm_ref(ts_ctx *ctx) {
    int B = 2, C = 12, G = 3, S = 35;
    int64_t sh[3] = {B, C, S};
    float *x = rand_floats(B * C * S, 7), *w = rand_floats(C, 8),
          *b = rand_floats(C, 9);
    ts_tensor *tx = ts_from_data(ctx, TS_F32, 3, sh, x);
    ts_tensor *tw = ts_from_data(ctx, TS_F32, 1, &sh[1], w);
    ts_tensor *tb = ts_from_data(ctx, TS_F32, 1, &sh[1], b);
    ts_tensor *y = ts_group_norm(tx, G, tw, tb, 1e-6);
    double *ref = malloc(sizeof(double) * (size_t)(B * C * S));
    int Cg = C / G;
    for (int bb = 0; bb < B; bb++)
        for (int g = 0; g < G; g++) {
            double m = 0, v = 0;
            int n = Cg * S;
            const float *xs = x + (bb * C + g * Cg) * S;
            for (int i = 0; i < n; i++)
                m += xs[i];
            m /= n;
            for (int i = 0; i < n; i++)
                v += (xs[i] - m) * (xs[i] - m);
            v /= n;
            for (int i = 0; i < n; i++) {
                int c = g * Cg + i / S;
                ref[(bb * C + g * Cg) * S + i] =
                    (xs[i] - m) / sqrt(v + 1e-6) * w[c] + b[c];
            }
        }
    CHECK(y && max_rel(y, ref, B * C * S) <= 1e-5);
    ts_release(tx), ts_release(tw), ts_release(tb), ts_release(y);
    free(x), free(w), free(b), free(ref);
}

static void test_pool_ref(ts_ctx *ctx) {
    int64_t sh[4] = {1, 2, 7, 9};
    float *x = rand_floats(126, 11);
    ts_tensor *tx = ts_from_data(ctx, TS_F32, 4, sh, x);
    ts_tensor *p = ts_avg_pool2d(tx, 3, 2, 2, 3); /* (1, 2, 3, 3) */
    CHECK(p && ts_tensor_dim(p, 2) == 3 && ts_tensor_dim(p, 3) == 3);
    double ref[18];
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                double s = 0;
                for (int a = 0; a < 3; a++)
                    for (int e = 0; e < 2; e++)
                        s += x[(c * 7 + i * 2 + a) * 9 + j * 3 + e];
                ref[(c * 3 + i) * 3 + j] = s / 6;
            }
    CHECK(p && max_rel(p, ref, 18) <= 1e-6);
    ts_tensor *u = ts_upsample_nearest2d(tx, 2, 3); /* (1, 2, 14, 27) */
    float *uv = malloc(sizeof(float) * 2 * 14 * 27);
    CHECK(u && ts_tensor_read(u, uv, TS_F32) == TS_OK);
    bool ok = true;
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < 14; i++)
            for (int j = 0; j < 27; j++)
                ok &=
                    uv[(c * 14 + i) * 27 + j] == x[(c * 7 + i / 2) * 9 + j / 3];
    CHECK(ok);
    free(uv), free(x);
    ts_release(tx), ts_release(p), ts_release(u);
}

static void test_errors(ts_ctx *ctx) {
    int64_t xs[4] = {1, 4, 8, 8}, ws[4] = {6, 3, 3, 3}, w2[4] = {6, 4, 9, 9};
    ts_tensor *x = ts_zeros(ctx, TS_F32, 4, xs);
    ts_tensor *w = ts_zeros(ctx, TS_F32, 4, ws);
    ts_tensor *big = ts_zeros(ctx, TS_F32, 4, w2);
    ts_tensor *y = ts_conv2d(x, w, NULL, NULL);
    CHECK(!y);
    CHECK_MSG(ctx, "do not fit 1 groups");
    ts_clear_error(ctx);
    CHECK(!ts_conv2d(x, big, NULL, NULL));
    CHECK_MSG(ctx, "larger than the padded input");
    ts_clear_error(ctx);
    ts_conv2d_opts bad = {.stride_h = -1};
    CHECK(!ts_conv2d(x, big, NULL, &bad));
    CHECK_MSG(ctx, "stride_h = -1");
    ts_clear_error(ctx);
    CHECK(!ts_group_norm(x, 3, NULL, NULL, 1e-5));
    CHECK_MSG(ctx, "multiple of 3 groups");
    ts_clear_error(ctx);
    CHECK(!ts_avg_pool2d(x, 9, 9, 1, 1));
    CHECK_MSG(ctx, "larger than x");
    ts_clear_error(ctx);
    CHECK(!ts_upsample_nearest2d(x, 0, 2));
    CHECK_MSG(ctx, "out of range");
    ts_clear_error(ctx);
    ts_release(x), ts_release(w), ts_release(big);
}

int main(void) {
    ts_ctx *ctx = test_ctx();
    test_conv_paths(ctx);
    test_group_norm_ref(ctx);
    test_pool_ref(ctx);
    test_errors(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_image_ops");
}
