/* bench_gemm_bf16.c — prefill products of Qwen3-0.6B (M = 512 tokens, f32
 * activations times a bf16 (N, K) weight seen as W^T) four ways, side by
 * side in one run, on 1 and on 2 threads:
 *   sgemm  ts_sgemm on an f32 copy of the weight (what f32 weights cost)
 *   widen  the current bf16 path: blocks of W widened to f32, then
 *          ts_sgemm (cpu_gemm_f32_w16t in src/backend/cpu/matmul.c, the
 *          active ISA level's compile)
 *   bf16   cpu_gemm_bf16 (vdpbf16ps; A and W packed on every call)
 *   packed cpu_gemm_bf16_packed with W packed once beforehand (the packing
 *          time is shown apart)
 * Shapes (N x K): q 2048 x 1024, k/v 1024 x 1024, gate/up 3072 x 1024,
 * down 1024 x 3072, LM head 151936 x 1024. GFLOP/s = 2 M N K / time; time:
 * the median of the timed runs after a warm-up (at least 3 and ~1 s of
 * each), the four methods alternating run by run so the machine's load
 * hits them alike. Before timing, 64 sampled elements of the bf16 and
 * packed results are checked against a double-precision sum of the
 * bf16-rounded operands (exit 1 when off). On a machine shared with other
 * work, --cpu-time measures each run by the process's CPU time instead
 * (all threads together: GFLOP per CPU-second, the throughput of one
 * core, which other processes' load barely changes); the load average is
 * printed before and after.
 *
 * --m sets the rows (tokens of a prefill chunk; the pre-packed B matters
 * more the fewer they are, its packing being saved on every call).
 *
 *   bench_gemm_bf16 [--threads N] [--reps R] [--m M] [--no-lm-head]
 *                   [--cpu-time] */
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemm_bf16.h"
#include "tessera.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { METHODS = 4 };
static int M = 512; /* tokens: --m (a prefill chunk) */

static bool cpu_time;

static double now(void) {
    struct timespec ts;
    clock_gettime(cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void print_load(const char *when) {
    char buf[128] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f))
            strcpy(buf, "?\n");
        fclose(f);
    }
    printf("load average %s: %s", when, buf);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    int64_t N, K;
    const float *A, *Wf;
    const uint16_t *W;
    const cpu_bf16_packed *P;
    float *Y;
    cpu_isa isa;
} job;

static bool run(const job *j, int method) {
    switch (method) {
    case 0:
        ts_sgemm(false, true, M, (int)j->N, (int)j->K, 1.0f, j->A, (int)j->K,
                 j->Wf, (int)j->K, 0.0f, j->Y, (int)j->N);
        return true;
    case 1:
        return cpu_gemm_f32_w16t(M, j->N, j->K, j->A, j->K, j->W, j->K, true,
                                 j->Y);
    case 2:
        return cpu_gemm_bf16(j->isa, M, j->N, j->K, j->A, TS_F32, j->K, 1, j->W,
                             TS_BF16, 1, j->K, j->Y, j->N, false);
    default:
        return cpu_gemm_bf16_packed(j->isa, M, j->A, TS_F32, j->K, 1, j->P,
                                    j->Y, j->N, false);
    }
}

/* 64 sampled elements of Y against the double sum of bf16-rounded
 * operands; bound as in tests/test_gemm_bf16.c */
static bool check(const job *j, const char *what) {
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < 64; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        int64_t m = (int64_t)(s % M), n = (int64_t)((s >> 20) % j->N);
        double sum = 0, mag = 0;
        for (int64_t k = 0; k < j->K; k++) {
            double p =
                (double)ts_bf16_to_f32(ts_f32_to_bf16(j->A[m * j->K + k])) *
                ts_bf16_to_f32(j->W[n * j->K + k]);
            sum += p, mag += fabs(p);
        }
        double err = fabs(j->Y[m * j->N + n] - sum);
        if (!(err <= (double)(j->K + 3) * 0x1p-24 * mag + 1e-30)) {
            fprintf(stderr,
                    "bench_gemm_bf16: %s N=%lld K=%lld: Y[%lld,%lld] = "
                    "%.9g, expected %.9g\n",
                    what, (long long)j->N, (long long)j->K, (long long)m,
                    (long long)n, j->Y[m * j->N + n], sum);
            return false;
        }
    }
    return true;
}

static float *rand_floats(int64_t n, uint64_t *s, float scale) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; p && i < n; i++) {
        *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
        p[i] = (float)((double)(*s >> 11) / 9007199254740992.0 - 0.5) * scale;
    }
    return p;
}

int main(int argc, char **argv) {
    int only_threads = 0, reps = 0;
    bool lm_head = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            only_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-lm-head"))
            lm_head = false;
        else if (!strcmp(argv[i], "--m") && i + 1 < argc &&
                 atoi(argv[i + 1]) > 0)
            M = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu-time"))
            cpu_time = true;
        else {
            fprintf(stderr, "usage: bench_gemm_bf16 [--threads N] [--reps R] "
                            "[--m M] [--no-lm-head] [--cpu-time]\n");
            return !strcmp(argv[i], "--help") ? 0 : 2;
        }
    }
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    cpu_isa isa = cpu_isa_active(); /* the machine's, or TS_CPU_ISA's */
    if (isa < CPU_ISA_AVX512_BF16) {
        printf("bench_gemm_bf16: the CPU level is %s, below avx512_bf16: "
               "nothing to measure\n",
               cpu_isa_name(isa));
        ts_ctx_free(ctx);
        return 0;
    }
    const struct {
        const char *name;
        int64_t N, K;
    } shapes[] = {{"q", 2048, 1024},
                  {"k/v", 1024, 1024},
                  {"gate/up", 3072, 1024},
                  {"down", 1024, 3072},
                  {"lm_head", 151936, 1024}};
    int nshapes = lm_head ? 5 : 4;
    printf("bench_gemm_bf16: Y (M=%d, N) = A (M, K) f32 @ W^T, W (N, K) bf16; "
           "GFLOP/s by %s, median of runs\n",
           M, cpu_time ? "CPU time (GFLOP per CPU-second)" : "wall clock");
    print_load("before");
    printf("\n");
    printf("%-8s %6s %5s %3s %8s %8s %8s %8s %8s %8s %9s\n", "shape", "N", "K",
           "thr", "sgemm", "widen", "bf16", "packed", "bf16/wid", "pack/wid",
           "pack ms");
    int status = 0;
    uint64_t seed = 42;
    for (int s = 0; s < nshapes; s++) {
        int64_t N = shapes[s].N, K = shapes[s].K;
        float *A = rand_floats((int64_t)M * K, &seed, 2.0f);
        float *Wf = rand_floats(N * K, &seed, 0.1f);
        uint16_t *W = malloc(sizeof(uint16_t) * (size_t)(N * K));
        float *Y = malloc(sizeof(float) * (size_t)((int64_t)M * N));
        if (!A || !Wf || !W || !Y) {
            fprintf(stderr, "bench_gemm_bf16: out of memory\n");
            return 1;
        }
        /* the f32 copy holds the bf16 weight's values, as a widened one */
        for (int64_t i = 0; i < N * K; i++) {
            W[i] = ts_f32_to_bf16(Wf[i]);
            Wf[i] = ts_bf16_to_f32(W[i]);
        }
        memset(Y, 0, sizeof(float) * (size_t)((int64_t)M * N));
        for (int t = 1; t <= 2; t++) {
            if (only_threads && t != only_threads)
                continue;
            ts_set_num_threads(ctx, t);
            double tp = now();
            cpu_bf16_packed *P = cpu_bf16_pack_b(isa, K, N, W, TS_BF16, 1, K);
            tp = now() - tp;
            job j = {N, K, A, Wf, W, P, Y, isa};
            if (!P || !run(&j, 2) || !check(&j, "bf16") || !run(&j, 3) ||
                !check(&j, "packed")) {
                fprintf(stderr, "bench_gemm_bf16: %s failed\n", shapes[s].name);
                return 1;
            }
            for (int m = 0; m < METHODS; m++) /* warm-up */
                run(&j, m);
            double once = now();
            run(&j, 1);
            once = now() - once;
            int n = reps > 0 ? reps : (int)(1.0 / (once > 1e-6 ? once : 1e-6));
            n = n < 3 ? 3 : n > 50 ? 50 : n;
            double *times = malloc(sizeof(double) * (size_t)(n * METHODS));
            for (int i = 0; i < n; i++)
                for (int m = 0; m < METHODS; m++) {
                    double t0 = now();
                    if (!run(&j, m))
                        status = 1;
                    times[m * n + i] = now() - t0;
                }
            double gf[METHODS];
            for (int m = 0; m < METHODS; m++) {
                qsort(times + m * n, (size_t)n, sizeof(double), cmp_d);
                gf[m] = 2.0 * M * (double)N * (double)K / times[m * n + n / 2] /
                        1e9;
            }
            printf("%-8s %6lld %5lld %3d %8.1f %8.1f %8.1f %8.1f %7.2fx %7.2fx "
                   "%9.1f\n",
                   shapes[s].name, (long long)N, (long long)K, t, gf[0], gf[1],
                   gf[2], gf[3], gf[2] / gf[1], gf[3] / gf[1], tp * 1e3);
            fflush(stdout);
            free(times);
            cpu_bf16_packed_free(P);
        }
        free(A), free(Wf), free(W), free(Y);
    }
    print_load("after");
    ts_ctx_free(ctx);
    return status;
}
