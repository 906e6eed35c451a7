/* bench_conv.c — conv2d's rate against sgemm's on the same FLOPs (issue
 * 23): for each convolution of the small SD-layout UNet the pipeline
 * benchmark runs at 256x256 (latents 32x32, a batch of 2 for guidance)
 * and of its VAE decoder, ts_conv2d (forward; with --backward the two
 * backward products too) against ts_sgemm of the GEMM the convolution
 * amounts to (M = out channels, N = output pixels, K = in channels x
 * kernel area, once per image), timed alternately rep by rep in one
 * process. Target: conv2d >= 80% of sgemm's GFLOP/s.
 *
 * Usage: bench_conv [--reps N] [--threads N] [--backward] */
#include "core/core.h"
#include "tessera.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const char *where;
    int B, C, O, H, K, stride;
} shape;

/* the UNet at 256x256 (block_out_channels 64, 128, 256, 256; CFG batch
 * 2) and the VAE decoder's widest layers (batch 1) */
static const shape SHAPES[] = {
    {"unet conv_in", 2, 4, 64, 32, 3, 1},
    {"unet down0 resnet", 2, 64, 64, 32, 3, 1},
    {"unet down0 downsample", 2, 64, 64, 32, 3, 2},
    {"unet down1 resnet", 2, 128, 128, 16, 3, 1},
    {"unet down2 resnet", 2, 256, 256, 8, 3, 1},
    {"unet up1 resnet (concat)", 2, 384, 128, 16, 3, 1},
    {"unet up2 resnet (concat)", 2, 512, 256, 8, 3, 1},
    {"unet up0 resnet (concat)", 2, 192, 64, 32, 3, 1},
    {"unet resnet shortcut 1x1", 2, 384, 128, 16, 1, 1},
    {"unet attn proj_in 1x1", 2, 128, 128, 16, 1, 1},
    {"vae decoder 128ch 256px", 1, 128, 128, 256, 3, 1},
    {"vae decoder 256ch 128px", 1, 256, 256, 128, 3, 1},
    {"vae decoder 256ch 64px", 1, 256, 256, 64, 3, 1},
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

int main(int argc, char **argv) {
    int reps = 7, threads = 0;
    bool backward = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--backward"))
            backward = true;
        else {
            fprintf(stderr, "usage: bench_conv [--reps N] [--threads N] "
                            "[--backward]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 64)
        reps = 7;
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL))
        return 1;
    if (threads > 0)
        ts_set_num_threads(ctx, threads);
    char feat[256];
    ts_cpu_features(feat, sizeof feat);
    printf("bench_conv: CPU path %s, %d threads (%s)\n", ts_cpu_isa(),
           ts_get_num_threads(ctx), feat);
    printf("%-28s %6s %9s %9s %7s\n", "convolution", "GFLOP", "conv GF/s",
           "sgemm GF/s", "ratio");
    double sum_conv = 0, sum_gemm = 0;
    int failed = 0;
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++) {
        const shape *c = &SHAPES[s];
        int pad = c->K / 2;
        int64_t OH = (c->H + 2 * pad - c->K) / c->stride + 1;
        int64_t xs[4] = {c->B, c->C, c->H, c->H};
        int64_t ws[4] = {c->O, c->C, c->K, c->K};
        ts_tensor *x = ts_randn(ctx, TS_F32, 4, xs, 1.0, 1);
        ts_tensor *w = ts_randn(ctx, TS_F32, 4, ws, 0.05, 2);
        ts_tensor *b = ts_zeros(ctx, TS_F32, 1, &ws[0]);
        if (backward) {
            ts_set_requires_grad(x, true);
            ts_set_requires_grad(w, true);
        }
        int M = c->O, N = (int)(OH * OH), K = c->C * c->K * c->K;
        float *A = malloc(sizeof(float) * (size_t)M * K);
        float *Bm = malloc(sizeof(float) * (size_t)K * N);
        float *Cm = malloc(sizeof(float) * (size_t)M * N);
        if (!A || !Bm || !Cm || !x || !w || !b)
            return 1;
        for (size_t k = 0; k < (size_t)M * K; k++)
            A[k] = (float)(k % 7) * 0.01f;
        for (size_t k = 0; k < (size_t)K * N; k++)
            Bm[k] = (float)(k % 5) * 0.01f;
        ts_conv2d_opts o = {.stride_h = c->stride,
                            .stride_w = c->stride,
                            .pad_top = pad,
                            .pad_bottom = pad,
                            .pad_left = pad,
                            .pad_right = pad};
        double tc[64], tg[64];
        /* passes: forward (1 GEMM) or forward + backward (3 GEMMs) */
        int passes = backward ? 3 : 1;
        for (int r = -1; r < reps; r++) {
            double t0 = now_s();
            ts_tensor *y = ts_conv2d(x, w, b, &o);
            if (backward && y) {
                ts_tensor *l = ts_sum(y, 0, NULL, false);
                if (!l || ts_backward(l, NULL))
                    failed = 1;
                ts_release(l);
                ts_zero_grad(x), ts_zero_grad(w);
            }
            if (!y)
                failed = 1;
            ts_release(y);
            double t1 = now_s();
            for (int p = 0; p < passes; p++)
                for (int i = 0; i < c->B; i++)
                    ts_sgemm(false, false, M, N, K, 1.0f, A, K, Bm, N, 0.0f, Cm,
                             N);
            double t2 = now_s();
            if (r >= 0)
                tc[r] = t1 - t0, tg[r] = t2 - t1;
        }
        double flops = 2.0 * M * N * (double)K * c->B * passes;
        double gc = flops / median(tc, reps) / 1e9;
        double gg = flops / median(tg, reps) / 1e9;
        sum_conv += flops / gc, sum_gemm += flops / gg;
        printf("%-28s %6.2f %9.1f %9.1f %6.0f%%\n", c->where, flops / 1e9, gc,
               gg, 100.0 * gc / gg);
        free(A), free(Bm), free(Cm);
        ts_release(x), ts_release(w), ts_release(b);
    }
    printf("all shapes, time-weighted: conv2d %.0f%% of sgemm (target >= "
           "80%%)\n",
           100.0 * sum_gemm / sum_conv);
    ts_ctx_free(ctx);
    return failed;
}
