/* bench_moe.c — the grouped experts kernel (ts_moe_experts, forward)
 * against plain sgemm on the same FLOPs, in one run: a Qwen3-MoE-like
 * layer scaled to a small machine, C = 1024, F = 768 per expert, E = 8
 * experts, top-2 routing (random, two distinct experts per token), gated
 * silu, for N tokens in {1, 16, 256, 1024}, f32 weights and bf16 weights.
 * The reference is what a dense layer of the same size would cost: the
 * k N routed rows through one (F, C) gate, one (F, C) up and one (C, F)
 * down product with ts_sgemm (no activation, no routing). FLOPs for both:
 * 3 products x 2 x (k N) x C x F. Time: the median of the timed runs
 * after a warm-up (at least 3, and at least ~0.5 s of each), the two
 * kernels' runs alternating.
 *
 *   bench_moe [--threads N] [--reps R]
 *   make bench-moe */
#include "core/core.h"
#include "tessera.h"
#include "tessera_train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { C = 1024, F = 768, E = 8, K = 2 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(ts_ctx *ctx, const char *what) {
    fprintf(stderr, "bench_moe: %s: %s\n", what, ts_errmsg(ctx));
    exit(1);
}

/* seconds of one call of f and of g: runs of the two alternate (so a
 * change in the machine's load hits both alike), the medians of reps runs
 * each (at least 3 and ~0.5 s of each) after a warm-up */
typedef void (*run_fn)(void *arg);
static void time_pair(run_fn f, void *fa, run_fn g, void *ga, int reps,
                      double *tf, double *tg) {
    f(fa), g(ga);
    double t0 = now();
    f(fa);
    double t1 = now();
    g(ga);
    double once = (t1 - t0) > (now() - t1) ? t1 - t0 : now() - t1;
    int n = reps > 0 ? reps : (int)(0.5 / (once > 1e-6 ? once : 1e-6));
    n = n < 3 ? 3 : n > 200 ? 200 : n;
    double *a = malloc(sizeof(double) * (size_t)n),
           *b = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) {
        double t = now();
        f(fa);
        a[i] = now() - t;
        t = now();
        g(ga);
        b[i] = now() - t;
    }
    qsort(a, (size_t)n, sizeof(double), cmp_d);
    qsort(b, (size_t)n, sizeof(double), cmp_d);
    *tf = a[n / 2], *tg = b[n / 2];
    free(a), free(b);
}

typedef struct {
    ts_tensor *x, *idx, *w, *gate, *up, *down;
} moe_run;

static void run_moe(void *arg) {
    moe_run *r = arg;
    ts_tensor *y = ts_moe_experts(r->x, r->idx, r->w, r->gate, r->up, r->down,
                                  TS_ACT_SILU);
    if (!y)
        die(ts_tensor_ctx(r->x), "ts_moe_experts");
    ts_release(y);
}

typedef struct {
    int R;
    const float *A, *Wg, *Wu, *Wd;
    float *G, *U, *Y;
} dense_run;

static void run_dense(void *arg) {
    dense_run *d = arg;
    ts_sgemm(false, true, d->R, F, C, 1.0f, d->A, C, d->Wg, C, 0.0f, d->G, F);
    ts_sgemm(false, true, d->R, F, C, 1.0f, d->A, C, d->Wu, C, 0.0f, d->U, F);
    ts_sgemm(false, true, d->R, C, F, 1.0f, d->G, F, d->Wd, F, 0.0f, d->Y, C);
}

static float *rand_floats(int64_t n, uint64_t *s) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
        p[i] = (float)((double)(*s >> 11) / 9007199254740992.0 - 0.5) * 0.1f;
    }
    return p;
}

int main(int argc, char **argv) {
    int threads = 0, reps = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_moe [--threads N] [--reps R]\n");
            return !strcmp(argv[i], "--help") ? 0 : 2;
        }
    }
    ts_ctx *ctx;
    ts_ctx_options co = {.num_threads = threads};
    if (ts_ctx_new(&ctx, &co) != TS_OK)
        return 1;
    ts_peak_info pk;
    if (ts_peak_measure(ctx, false, &pk) != TS_OK)
        die(ctx, "peak");
    printf("bench_moe: experts MLP forward, C=%d F=%d E=%d top-%d, gated "
           "silu; %d threads, %s (%s%s%s), hardware peak %.1f GFLOP/s\n",
           C, F, E, K, ts_get_num_threads(ctx), pk.cpu, pk.isa,
           pk.isa_note[0] ? "; " : "", pk.isa_note, pk.hardware / 1e9);
    printf("reference: the k N rows through one dense (F, C) gate, up and "
           "(C, F) down with ts_sgemm\n\n");
    printf("%-6s %6s %6s %12s %12s %12s %8s\n", "dtype", "N", "rows", "moe ms",
           "moe GF/s", "sgemm GF/s", "ratio");

    int64_t sw[3] = {E, F, C}, sd[3] = {E, C, F};
    ts_tensor *gate = ts_randn(ctx, TS_F32, 3, sw, 0.03, 1);
    ts_tensor *up = ts_randn(ctx, TS_F32, 3, sw, 0.03, 2);
    ts_tensor *down = ts_randn(ctx, TS_F32, 3, sd, 0.03, 3);
    ts_tensor *gate16 = ts_cast(gate, TS_BF16), *up16 = ts_cast(up, TS_BF16),
              *down16 = ts_cast(down, TS_BF16);
    if (!gate16 || !up16 || !down16)
        die(ctx, "weights");
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    float *Wg = rand_floats((int64_t)F * C, &seed),
          *Wu = rand_floats((int64_t)F * C, &seed),
          *Wd = rand_floats((int64_t)C * F, &seed);
    const int Ns[4] = {1, 16, 256, 1024};
    for (int dt = 0; dt < 2; dt++)
        for (int c = 0; c < 4; c++) {
            int64_t N = Ns[c], R = N * K;
            int64_t sx[2] = {N, C}, sk[2] = {N, K};
            int64_t *ids = malloc(sizeof(int64_t) * (size_t)R);
            float *wv = malloc(sizeof(float) * (size_t)R);
            for (int64_t n = 0; n < N; n++) { /* two distinct experts */
                seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                int64_t e0 = (int64_t)(seed % E),
                        e1 = (e0 + 1 + (int64_t)(seed >> 32) % (E - 1)) % E;
                ids[n * K] = e0, ids[n * K + 1] = e1;
                wv[n * K] = 0.6f, wv[n * K + 1] = 0.4f;
            }
            moe_run m = {ts_randn(ctx, TS_F32, 2, sx, 1, 10 + (uint64_t)c),
                         ts_from_data(ctx, TS_I64, 2, sk, ids),
                         ts_from_data(ctx, TS_F32, 2, sk, wv),
                         dt ? gate16 : gate,
                         dt ? up16 : up,
                         dt ? down16 : down};
            if (!m.x || !m.idx || !m.w)
                die(ctx, "inputs");
            float *A = rand_floats(R * C, &seed);
            dense_run d = {(int)R,
                           A,
                           Wg,
                           Wu,
                           Wd,
                           malloc(sizeof(float) * (size_t)(R * F)),
                           malloc(sizeof(float) * (size_t)(R * F)),
                           malloc(sizeof(float) * (size_t)(R * C))};
            double flops = 3.0 * 2.0 * (double)R * C * F;
            double tm, td;
            time_pair(run_moe, &m, run_dense, &d, reps, &tm, &td);
            printf("%-6s %6lld %6lld %12.3f %12.1f %12.1f %8.2f\n",
                   dt ? "bf16" : "f32", (long long)N, (long long)R, tm * 1e3,
                   flops / tm / 1e9, flops / td / 1e9, td / tm);
            fflush(stdout);
            ts_release(m.x), ts_release(m.idx), ts_release(m.w);
            free(ids), free(wv), free(A), free(d.G), free(d.U), free(d.Y);
        }
    printf("\nratio: sgemm time / experts time on the same FLOPs (1 = as fast "
           "as one dense product; at N = 1 the experts read k = %d weight "
           "sets against the reference's one)\n",
           K);
    free(Wg), free(Wu), free(Wd);
    ts_release(gate), ts_release(up), ts_release(down);
    ts_release(gate16), ts_release(up16), ts_release(down16);
    ts_ctx_free(ctx);
    return 0;
}
