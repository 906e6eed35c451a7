/* bench_quant.c — products with weights in llama.cpp's block formats
 * (cpu_gemm_wq, src/backend/cpu/quant_gemm.c) at each ISA level the machine
 * runs, on Qwen3-0.6B's shapes: N = 3072, K = 1024 (the MLP's gate/up) and
 * N = 1024, K = 3072 (its down), for R = 1 (a decode step's GEMV) and R = 8
 * (a batch of 8 sequences), on 1 and 2 threads.
 *
 * Decode streams every weight from memory once per step, so the weights
 * cycle through copies filling 256 MiB (8x the 32 MiB L3): the kernels
 * read from DRAM as in a real model. The same bytes are read by a plain
 * streaming loop in the same run, alternating with the kernel, and the
 * ratio kernel GB/s / stream GB/s says how close the kernel comes to the
 * memory's speed. GB/s counts the weight bytes read; GFLOP/s 2 R N K. The
 * bf16 GEMV (cpu_gemm_f32_w16t) on the same shapes is shown beside.
 * Then prefill-sized R (16 .. 512) with the weights in cache: the int8
 * kernels against the f32 path (dequantized blocks through OpenBLAS), the
 * figures behind cpu_gemm_wq's choice. Each figure is the median of 3 runs
 * or more (about 0.3 s of each) after a warm-up.
 *
 *   bench_quant [--threads N] [--quick] [--only decode|prefill]
 *   (--threads: only that count, else 1 and 2; --quick: 32 MiB of copies,
 *   one run each, smoke test only; --only: one of the two tables) */
#include "backend/cpu/cpu.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/quant_gemm.h"
#include "core/core.h"
#include "core/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static size_t pool_bytes = (size_t)256 << 20;
static int min_reps = 3;

/* ---- the streaming read ---- */

typedef struct {
    const uint64_t *p;
    int64_t n; /* words */
    uint64_t sums[64];
} stream_job;

static void stream_range(void *arg, int64_t c0, int64_t c1) {
    stream_job *j = arg;
    for (int64_t c = c0; c < c1; c++) {
        int64_t w0 = j->n * c / 64, w1 = j->n * (c + 1) / 64;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        int64_t w = w0;
        for (; w + 4 <= w1; w += 4)
            s0 += j->p[w], s1 += j->p[w + 1], s2 += j->p[w + 2],
                s3 += j->p[w + 3];
        for (; w < w1; w++)
            s0 += j->p[w];
        j->sums[c] = s0 + s1 + s2 + s3;
    }
}

/* reads bytes at p in 64 slices over the pool */
static void stream_read(const void *p, size_t bytes) {
    stream_job j = {.p = p, .n = (int64_t)(bytes / 8)};
    ts_parallel_for(64, 1, stream_range, &j);
    volatile uint64_t sink = 0;
    for (int c = 0; c < 64; c++)
        sink += j.sums[c];
    (void)sink;
}

/* ---- timing: a kernel pass and a stream pass alternate ---- */

typedef void (*pass_fn)(void *arg);

/* medians of the seconds of one pass of f and of g (g may be NULL) */
static void time_alternating(pass_fn f, void *fa, pass_fn g, void *ga,
                             double *tf, double *tg) {
    f(fa);
    if (g)
        g(ga);
    double t0 = now();
    f(fa);
    double once = now() - t0;
    int n = (int)(0.3 / (once > 1e-6 ? once : 1e-6));
    n = n < min_reps ? min_reps : n > 50 ? 50 : n;
    double a[50], b[50];
    for (int i = 0; i < n; i++) {
        double t = now();
        f(fa);
        a[i] = now() - t;
        if (g) {
            t = now();
            g(ga);
            b[i] = now() - t;
        }
    }
    qsort(a, (size_t)n, sizeof *a, cmp_d);
    *tf = a[n / 2];
    if (g) {
        qsort(b, (size_t)n, sizeof *b, cmp_d);
        *tg = b[n / 2];
    }
}

typedef struct {
    cpu_isa isa;
    ts_dtype dt; /* TS_BF16: cpu_gemm_f32_w16t */
    int64_t R, N, K, rb, copies;
    const uint8_t *W;
    const float *A;
    float *Y;
    int path; /* 0 cpu_gemm_wq, 1 int8, 2 f32 */
} gemm_pass;

/* one product with each copy of the weights */
static void run_gemm_pass(void *arg) {
    gemm_pass *p = arg;
    for (int64_t c = 0; c < p->copies; c++) {
        const uint8_t *w = p->W + (size_t)c * (size_t)(p->N * p->rb);
        bool ok;
        if (p->dt == TS_BF16)
            ok = cpu_gemm_f32_w16t(p->R, p->N, p->K, p->A, p->K,
                                   (const uint16_t *)w, p->K, true, p->Y);
        else if (p->path == 1)
            ok = cpu_gemm_wq_int8(p->isa, p->R, p->N, p->K, p->A, p->K, w,
                                  p->rb, p->dt, p->Y);
        else if (p->path == 2)
            ok = cpu_gemm_wq_f32(p->isa, p->R, p->N, p->K, p->A, p->K, w, p->rb,
                                 p->dt, p->Y);
        else
            ok = cpu_gemm_wq(p->isa, p->R, p->N, p->K, p->A, p->K, w, p->rb,
                             p->dt, p->Y);
        if (!ok) {
            fprintf(stderr, "bench_quant: out of memory\n");
            exit(1);
        }
    }
}

typedef struct {
    const void *p;
    size_t bytes;
} stream_pass;

static void run_stream_pass(void *arg) {
    stream_pass *s = arg;
    stream_read(s->p, s->bytes);
}

/* the weights of one (N, K) matrix in format dt, copied to fill pool */
static int64_t fill_copies(ts_dtype dt, int64_t N, int64_t K, uint8_t *pool,
                           int64_t *rb_out) {
    int64_t rb = dt == TS_BF16 ? 2 * K : ts_dtype_nbytes(dt, K);
    size_t mat = (size_t)(N * rb);
    float *x = malloc(sizeof(float) * (size_t)K);
    uint64_t s = 12345;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < K; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            x[k] = ((float)(s >> 40) / 16777216.0f - 0.5f) * 0.1f;
        }
        if (dt == TS_BF16)
            for (int64_t k = 0; k < K; k++)
                ((uint16_t *)(pool + n * rb))[k] = ts_f32_to_bf16(x[k]);
        else
            ts_quantize_row(dt, x, pool + n * rb, K);
    }
    free(x);
    int64_t copies = (int64_t)(pool_bytes / mat);
    copies = copies < 1 ? 1 : copies;
    for (int64_t c = 1; c < copies; c++)
        memcpy(pool + (size_t)c * mat, pool, mat);
    *rb_out = rb;
    return copies;
}

static const ts_dtype formats[5] = {TS_Q8_0, TS_Q4_0, TS_Q4_K, TS_Q5_K,
                                    TS_Q6_K};

static void decode_table(ts_ctx *ctx, const int *threads, int nthreads) {
    const int64_t shapes[2][2] = {{3072, 1024}, {1024, 3072}};
    uint8_t *pool = aligned_alloc(64, pool_bytes + ((size_t)8 << 20));
    float *A = malloc(sizeof(float) * 8 * 3072),
          *Y = malloc(sizeof(float) * 8 * 3072);
    for (int i = 0; i < 8 * 3072; i++)
        A[i] = sinf((float)i * 0.37f);
    printf("%-5s %-12s %-11s %2s %3s %9s %8s %8s %9s %6s\n", "fmt", "level",
           "N x K", "R", "thr", "us/call", "GB/s", "GFLOP/s", "stream",
           "ratio");
    for (int s = 0; s < 2; s++) {
        int64_t N = shapes[s][0], K = shapes[s][1];
        for (int f = -1; f < 5; f++) {
            ts_dtype dt = f < 0 ? TS_BF16 : formats[f];
            int64_t rb, copies = fill_copies(dt, N, K, pool, &rb);
            size_t mat = (size_t)(N * rb);
            for (cpu_isa isa = CPU_ISA_SSE2; isa <= cpu_isa_detected(); isa++) {
                if (dt == TS_BF16 && isa != cpu_isa_detected())
                    continue; /* not level-dispatched: one row */
                for (int ti = 0; ti < nthreads; ti++) {
                    ts_set_num_threads(ctx, threads[ti]);
                    for (int64_t R = 1; R <= 8; R += 7) {
                        /* the scalar level is slow: fewer copies */
                        int64_t cp = isa == CPU_ISA_SSE2 && dt != TS_BF16
                                         ? (copies < 4 ? copies : 4)
                                         : copies;
                        gemm_pass gp = {isa, dt,   R, N, K, rb,
                                        cp,  pool, A, Y, 0};
                        stream_pass sp = {pool, (size_t)cp * mat};
                        double tk, ts;
                        time_alternating(run_gemm_pass, &gp, run_stream_pass,
                                         &sp, &tk, &ts);
                        double gbs = (double)(cp * mat) / tk / 1e9;
                        double sgbs = (double)(cp * mat) / ts / 1e9;
                        double flops = 2.0 * R * N * K * cp / tk / 1e9;
                        char shape[24];
                        snprintf(shape, sizeof shape, "%lldx%lld", (long long)N,
                                 (long long)K);
                        printf("%-5s %-12s %-11s %2lld %3d %9.1f %8.2f %8.2f "
                               "%9.2f "
                               "%6.2f%s\n",
                               ts_dtype_name(dt),
                               dt == TS_BF16 ? "(w16t)" : cpu_isa_name(isa),
                               shape, (long long)R, threads[ti],
                               tk / (double)cp * 1e6, gbs, flops, sgbs,
                               gbs / sgbs, cp < copies ? "  (in L3)" : "");
                        fflush(stdout);
                    }
                }
            }
        }
    }
    free(pool), free(A), free(Y);
}

/* prefill-sized R, weights in cache: int8 kernels vs the f32 path */
static void prefill_table(ts_ctx *ctx, const int *threads, int nthreads) {
    const int64_t N = 3072, K = 1024;
    const int64_t Rs[] = {16, 32, 64, 128, 512};
    float *A = malloc(sizeof(float) * 512 * K),
          *Y = malloc(sizeof(float) * 512 * N);
    for (int64_t i = 0; i < 512 * K; i++)
        A[i] = sinf((float)i * 0.37f);
    size_t save = pool_bytes;
    pool_bytes = 1; /* one copy */
    uint8_t *W = aligned_alloc(64, (size_t)(N * 2 * K));
    printf("\nprefill (N x K = %lld x %lld, weights in cache): GFLOP/s of "
           "the int8 kernels and of the f32 path (dequantize + sgemm)\n",
           (long long)N, (long long)K);
    printf("%-5s %-12s %4s %3s %9s %9s %7s\n", "fmt", "level", "R", "thr",
           "int8", "f32", "f32/int8");
    for (int f = 0; f < 5; f++) {
        int64_t rb;
        fill_copies(formats[f], N, K, W, &rb);
        for (cpu_isa isa = CPU_ISA_AVX2; isa <= cpu_isa_detected(); isa++)
            for (int ti = 0; ti < nthreads; ti++) {
                ts_set_num_threads(ctx, threads[ti]);
                for (size_t i = 0; i < sizeof Rs / sizeof *Rs; i++) {
                    gemm_pass a = {isa, formats[f], Rs[i], N, K, rb,
                                   1,   W,          A,     Y, 1};
                    gemm_pass b = a;
                    b.path = 2;
                    double ta, tb;
                    time_alternating(run_gemm_pass, &a, run_gemm_pass, &b, &ta,
                                     &tb);
                    double fl = 2.0 * Rs[i] * N * K / 1e9;
                    printf("%-5s %-12s %4lld %3d %9.1f %9.1f %7.2f\n",
                           ts_dtype_name(formats[f]), cpu_isa_name(isa),
                           (long long)Rs[i], threads[ti], fl / ta, fl / tb,
                           ta / tb);
                    fflush(stdout);
                }
            }
    }
    pool_bytes = save;
    free(A), free(Y), free(W);
}

int main(int argc, char **argv) {
    int threads[2] = {1, 2}, nthreads = 2;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads[0] = atoi(argv[++i]);
            nthreads = 1;
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = argv[++i];
        } else if (!strcmp(argv[i], "--quick")) {
            pool_bytes = (size_t)32 << 20;
            min_reps = 1;
        } else {
            fprintf(stderr, "usage: bench_quant [--threads N] [--quick] "
                            "[--only decode|prefill]\n");
            return 2;
        }
    }
    if (nthreads == 2 && getenv("TS_NUM_THREADS")) {
        threads[0] = atoi(getenv("TS_NUM_THREADS"));
        nthreads = 1;
    }
    ts_ctx *ctx = NULL;
    if (ts_ctx_new(&ctx, NULL) != TS_OK) {
        fprintf(stderr, "bench_quant: no context\n");
        return 1;
    }
    char feats[256];
    cpu_features_str(feats, sizeof feats);
    printf("bench_quant: levels sse2 .. %s (%s); weights cycle through %zu "
           "MiB of copies\n\n",
           cpu_isa_name(cpu_isa_detected()), feats, pool_bytes >> 20);
    if (!only || !strcmp(only, "decode"))
        decode_table(ctx, threads, nthreads);
    if (!only || !strcmp(only, "prefill"))
        prefill_table(ctx, threads, nthreads);
    ts_ctx_free(ctx);
    return 0;
}
