/* bench_unet.c — one UNet2DConditionModel step (issue 23): ts_unet_forward
 * on a Diffusers unet/ folder at batch B (2: classifier-free guidance),
 * latents S x S, T text positions, eager and compiled (the plan recorded
 * once, then replayed), median of reps; the process's peak RSS. Driven by
 * bench/bench_diffusion.py beside the PyTorch reference at the same thread
 * count (TS_NUM_THREADS).
 *
 * Usage: bench_unet UNET_DIR [--batch B] [--size S] [--seq T] [--reps N]
 *                    [--bf16] [--json]
 * With --json the last line is {"eager_ms":..,"compiled_ms":..,
 * "first_compiled_ms":..,"load_s":..,"peak_rss_mb":..,"isa":..}. */
#include "tessera_diffusion.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

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

/* one forward, materialised; its wall time in ms (negative on error) */
static double step_ms(ts_ctx *ctx, ts_unet *u, ts_tensor *x, ts_tensor *t,
                      ts_tensor *ehs) {
    double t0 = now_s();
    ts_tensor *out = ts_unet_forward(u, x, t, ehs);
    if (!out) {
        fprintf(stderr, "bench_unet: %s\n", ts_errmsg(ctx));
        return -1;
    }
    /* reading the output runs what compiled mode recorded */
    float *buf = malloc(sizeof(float) * (size_t)ts_tensor_numel(out));
    ts_status s = buf ? ts_tensor_read(out, buf, TS_F32) : TS_ERR_OOM;
    free(buf);
    ts_release(out);
    if (s != TS_OK) {
        fprintf(stderr, "bench_unet: %s\n", ts_errmsg(ctx));
        return -1;
    }
    return 1e3 * (now_s() - t0);
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    int B = 2, S = 32, T = 77, reps = 5;
    bool bf16 = false, json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--size") && i + 1 < argc)
            S = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc)
            T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bf16"))
            bf16 = true;
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else {
            fprintf(stderr, "bench_unet: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!dir || B < 1 || S < 1 || T < 1 || reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: bench_unet UNET_DIR [--batch B] [--size S] "
                        "[--seq T] [--reps N] [--bf16] [--json]\n");
        return 2;
    }
    ts_ctx *ctx = NULL;
    if (ts_ctx_new(&ctx, NULL) != TS_OK) {
        fprintf(stderr, "bench_unet: no context\n");
        return 1;
    }
    double t0 = now_s();
    ts_component_opts o = {.dtype = bf16 ? TS_BF16 : TS_F32};
    ts_unet *u = NULL;
    if (ts_unet_load(ctx, dir, &o, &u) != TS_OK) {
        fprintf(stderr, "bench_unet: %s\n", ts_errmsg(ctx));
        ts_ctx_free(ctx);
        return 1;
    }
    double load_s = now_s() - t0;
    int64_t C = ts_unet_in_channels(u), D = ts_unet_cross_attention_dim(u);
    int64_t xs[4] = {B, C, S, S}, es[3] = {B, T, D}, ts_[1] = {B};
    ts_tensor *x = ts_randn(ctx, TS_F32, 4, xs, 1.0, 1);
    ts_tensor *ehs = ts_randn(ctx, TS_F32, 3, es, 1.0, 2);
    ts_tensor *t = ts_full(ctx, TS_F32, 1, ts_, 801.0);
    double times[1000];
    double first_compiled = 0, eager = 0, compiled = 0;
    int ok = x && ehs && t;
    /* eager: a warm-up, then reps */
    for (int r = 0; ok && r <= reps; r++) {
        double ms = step_ms(ctx, u, x, t, ehs);
        ok = ms >= 0;
        if (r)
            times[r - 1] = ms;
    }
    if (ok)
        eager = median(times, reps);
    ts_set_mode(ctx, TS_MODE_COMPILED);
    for (int r = 0; ok && r <= reps; r++) {
        double ms = step_ms(ctx, u, x, t, ehs);
        ok = ms >= 0;
        if (r)
            times[r - 1] = ms;
        else
            first_compiled = ms;
    }
    ts_set_mode(ctx, TS_MODE_EAGER);
    if (ok)
        compiled = median(times, reps);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss_mb = (double)ru.ru_maxrss / 1024.0;
    if (ok) {
        printf("unet %s: batch %d, latents %dx%d, %d text positions, %s "
               "weights, ISA %s\n",
               dir, B, S, S, T, bf16 ? "bf16" : "f32", ts_cpu_isa());
        printf("  load %.2f s; eager %.1f ms/step; compiled %.1f ms/step "
               "(first, recording: %.1f ms); peak RSS %.0f MB\n",
               load_s, eager, compiled, first_compiled, rss_mb);
        if (json)
            printf("{\"eager_ms\":%.3f,\"compiled_ms\":%.3f,"
                   "\"first_compiled_ms\":%.3f,\"load_s\":%.3f,"
                   "\"peak_rss_mb\":%.1f,\"isa\":\"%s\"}\n",
                   eager, compiled, first_compiled, load_s, rss_mb,
                   ts_cpu_isa());
    }
    ts_release(x), ts_release(ehs), ts_release(t);
    ts_unet_free(u);
    ts_ctx_free(ctx);
    return ok ? 0 : 1;
}
