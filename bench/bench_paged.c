/* bench_paged.c — the paged attention kernel (ts_paged_attention_ex) on
 * the CPU with f32, bf16 and int8 KV pools side by side, on Qwen3-0.6B's
 * attention shape (16 query heads, 8 KV heads, head dim 128, blocks of 16
 * positions), one layer:
 *  - warm prefill: a chunk of 100 new tokens over 3,900 cached positions
 *    (what a 4,000-token prompt with a 3,900-token cached prefix costs per
 *    layer), and a cold chunk of 512 tokens with nothing cached;
 *  - decode: 1 new token for each of 16 sequences of 1,000 cached
 *    positions, and for 1 sequence of 4,000.
 * The median time of a call, in ms, per pool type (n/a where the kernel
 * refuses the type).
 *   bench_paged [--reps N] [--case I] [--type f32|bf16|int8] [--cpu]
 * (--case, --type: that one only, e.g. under a profiler; --cpu: the
 * process's CPU time instead of wall time, steadier on a shared machine,
 * with TS_NUM_THREADS=1) */
#include "tessera.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { H = 16, KV = 8, D = 128, BS = 16 };

static bool cpu_time; /* --cpu */

static double now(void) {
    struct timespec ts;
    clock_gettime(cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* a pool of nb blocks of type kt ("f32", "bf16", "int8") with random rows:
 * f32 and bf16 tensors of (nb, KV, BS, D); int8 rows packed in i32 words
 * (D int8 values, then the f32 scale) */
static ts_tensor *pool_new(ts_ctx *ctx, const char *kt, int64_t nb,
                           uint64_t seed) {
    if (!strcmp(kt, "int8")) {
        int64_t w = (D + 3) / 4 + 1, shape[4] = {nb, KV, BS, w};
        ts_tensor *p = ts_zeros(ctx, TS_I32, 4, shape);
        uint8_t *b = p ? ts_tensor_data(p) : NULL;
        if (!b)
            return p;
        uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
        for (int64_t r = 0; r < nb * KV * BS; r++) {
            uint8_t *row = b + r * w * 4;
            for (int d = 0; d < D; d++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                row[d] = (uint8_t)(int8_t)((int)(s >> 56) % 127);
            }
            float scale = 1.0f / 64;
            memcpy(row + (w - 1) * 4, &scale, 4);
        }
        return p;
    }
    int64_t shape[4] = {nb, KV, BS, D};
    return ts_randn(ctx, !strcmp(kt, "bf16") ? TS_BF16 : TS_F32, 4, shape, 1,
                    seed);
}

/* median ms of reps calls: n_seqs sequences, each with nnew new tokens
 * after clen cached ones; -1 when the kernel refuses the pool type */
static double run_case(ts_ctx *ctx, const char *kt, int n_seqs, int nnew,
                       int clen, int reps) {
    int64_t per = (clen + nnew + BS - 1) / BS, nb = per * n_seqs + 1;
    int64_t N = (int64_t)n_seqs * nnew,
            nmeta = 2 + (n_seqs + 1) + n_seqs + (int64_t)n_seqs * per;
    int32_t *meta = calloc((size_t)nmeta, sizeof *meta);
    meta[0] = n_seqs, meta[1] = (int32_t)per;
    int32_t *start = meta + 2, *cl = start + n_seqs + 1, *table = cl + n_seqs;
    for (int i = 0; i < n_seqs; i++) {
        start[i + 1] = start[i] + nnew;
        cl[i] = clen;
        for (int64_t b = 0; b < per; b++) /* scattered over the pool */
            table[i * per + b] = (int32_t)((i * per + b) * 7 % (nb - 1) + 1);
    }
    int64_t sq[4] = {1, H, N, D}, sk[4] = {1, KV, N, D};
    ts_tensor *mt = ts_from_data(ctx, TS_I32, 1, &nmeta, meta);
    ts_tensor *q = ts_randn(ctx, TS_F32, 4, sq, 1, 1);
    ts_tensor *k = ts_randn(ctx, TS_F32, 4, sk, 1, 2);
    ts_tensor *v = ts_randn(ctx, TS_F32, 4, sk, 1, 3);
    ts_tensor *kp = pool_new(ctx, kt, nb, 4), *vp = pool_new(ctx, kt, nb, 5);
    double *t = malloc(sizeof(double) * (size_t)reps), med = -1;
    int ok = 1;
    for (int r = 0; r < reps && ok; r++) {
        double t0 = now();
        ts_tensor *o = ts_paged_attention_ex(q, k, v, kp, vp, mt, NULL);
        if (o)
            ts_tensor_data(o); /* ready */
        t[r] = now() - t0;
        ok = o != NULL;
        ts_release(o);
    }
    if (ok) {
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        med = 1e3 * t[reps / 2];
    } else {
        if (getenv("BENCH_PAGED_VERBOSE"))
            fprintf(stderr, "%s: %s\n", kt, ts_errmsg(ctx));
        ts_clear_error(ctx);
    }
    free(t), free(meta);
    ts_release(mt), ts_release(q), ts_release(k), ts_release(v);
    ts_release(kp), ts_release(vp);
    return med;
}

int main(int argc, char **argv) {
    int reps = 7, only = -1;
    const char *only_type = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--case") && i + 1 < argc)
            only = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--type") && i + 1 < argc)
            only_type = argv[++i];
        else if (!strcmp(argv[i], "--cpu"))
            cpu_time = true;
        else {
            fprintf(stderr, "usage: bench_paged [--reps N] [--case I] "
                            "[--type f32|bf16|int8] [--cpu]\n");
            return 2;
        }
    }
    if (reps < 1)
        reps = 1;
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_set_grad_enabled(ctx, false);
    static const struct {
        const char *what;
        int n_seqs, nnew, clen;
    } cases[] = {
        {"prefill chunk: 100 new over 3,900 cached", 1, 100, 3900},
        {"prefill chunk: 512 new, nothing cached", 1, 512, 0},
        {"decode: 16 sequences x 1 new over 1,000", 16, 1, 1000},
        {"decode: 1 sequence x 1 new over 4,000", 1, 1, 4000},
    };
    static const char *types[3] = {"f32", "bf16", "int8"};
    printf("paged attention, one layer of Qwen3-0.6B (H %d, KV %d, D %d, "
           "blocks of %d), %d threads, ISA %s; median of %d, ms of %s\n",
           H, KV, D, BS, ts_get_num_threads(ctx), ts_cpu_isa(), reps,
           cpu_time ? "CPU time" : "wall time");
    printf("%-44s %9s %9s %9s\n", "case", types[0], types[1], types[2]);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (only >= 0 && (size_t)only != c)
            continue;
        printf("%-44s", cases[c].what);
        for (int k = 0; k < 3; k++) {
            if (only_type && strcmp(only_type, types[k])) {
                printf(" %9s", "-");
                continue;
            }
            double ms = run_case(ctx, types[k], cases[c].n_seqs, cases[c].nnew,
                                 cases[c].clen, reps);
            if (ms < 0)
                printf(" %9s", "n/a");
            else
                printf(" %9.3f", ms);
        }
        printf("\n");
    }
    ts_ctx_free(ctx);
    return 0;
}
