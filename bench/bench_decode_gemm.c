/* bench_decode_gemm.c — decode's products against bf16 weights: Y (R, N) =
 * A (R, K) f32 @ W^T, W (N, K) bf16, for R = 1, 2, 4, 8, 16, 32, 64 rows
 * (the sequences of a batched decode step), on the LM head of Qwen3-0.6B
 * (151936 x 1024) and its MLP (gate/up 3072 x 1024, down 1024 x 3072),
 * every path side by side in one run:
 *   read       a plain streaming read of the same weight bytes by the same
 *              threads (AVX2 loads): the memory's bound for one pass
 *   old        the kernels before the decode work (copied below): R = 1 a
 *              dot kernel, R <= 32 gemv_rows (8 rows a pass), above that
 *              the blocked bf16 GEMM (cpu_gemm_bf16_blocked; at a level
 *              below AVX512_BF16 nothing: "-")
 *   f32@avx2   cpu_gemm_f32_w16t of the avx2 level: f32 activations,
 *              weights widened once in registers, register tiles
 *   f32@avx512 the same compiled for the avx512 level (zmm)
 *   bf16       cpu_gemm_bf16 (vdpbf16ps; W packed a strip at a time)
 *   packed     cpu_gemm_bf16_packed, W packed beforehand (ts_decoder_prepack)
 * Decode streams every weight from memory once per step, so the weights
 * (and their packed copies) cycle through copies filling 256 MiB or more
 * (8x the 32 MiB L3): every call reads from DRAM as a model's step does.
 * Times are medians of the runs (at least 3, about 0.4 s of each path),
 * the paths alternating run by run in a rotating order, so that the
 * machine's load hits them alike and each follows each (a path runs
 * slower after one that leaves the caches or the memory system busy). GFLOP/s =
 * 2 R N K / time; GB/s = the weight bytes (2 N K) / time;
 * "% read" = read time / packed time (100%: the packed kernel reads the
 * weights as fast as a plain read does). Before timing every path is
 * checked: 64 sampled elements against a double sum (bf16 bound as in
 * tests/test_gemm_bf16.c; the f32 paths 1e-5 relative), and the packed
 * rows equal to the same rows computed alone (exit 1 when not).
 *
 * On a machine shared with other work, --cpu-time measures each run by the
 * process's CPU time (all threads together: the figures are then per
 * CPU-second) and --best takes the fastest run instead of the median.
 *
 *   bench_decode_gemm [--threads N] [--reps R] [--no-lm-head] [--quick]
 *                     [--cpu-time] [--best] [--only lm_head|gate/up|down]
 *                     [--rows R]
 *   (--quick: 32 MiB of copies and 3 runs: a smoke test) */
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemm_bf16.h"
#include "core/core.h"
#include "tessera.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OLD_TARGET __attribute__((target("avx2,fma")))

/* ---- the kernels before this work (src/backend/cpu/matmul.c at its
 * avx2 level, as of the commit before bench_decode_gemm.c), for the
 * side-by-side figures ---- */
/* dot(a[0..K), w[0..K)) with w bf16, converted 8 lanes at a time; four
 * accumulators so the FMA latency is hidden */
OLD_TARGET static float dot_f32_bf16(const float *a, const uint16_t *w,
                                     int64_t K) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t k = 0;
    for (; k + 32 <= K; k += 32)
        for (int j = 0; j < 4; j++) {
            __m256i wj = _mm256_cvtepu16_epi32(
                _mm_loadu_si128((const __m128i *)(w + k + 8 * j)));
            acc[j] = _mm256_fmadd_ps(
                _mm256_loadu_ps(a + k + 8 * j),
                _mm256_castsi256_ps(_mm256_slli_epi32(wj, 16)), acc[j]);
        }
    float lanes[8], s = 0;
    _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]),
                                          _mm256_add_ps(acc[2], acc[3])));
    for (int i = 0; i < 8; i++)
        s += lanes[i];
    for (; k < K; k++)
        s += a[k] * ts_bf16_to_f32(w[k]);
    return s;
}

/* y[r * ldy] = dot(A row r, w) for r < R (R <= 8 rows of activations):
 * each 8 weights are widened once and used by every row's accumulator, so
 * a batch of decoding sequences costs one read and one conversion of the
 * weights. Inlined with R a constant (see gemv_rows), the accumulators
 * live in registers. */
static inline __attribute__((always_inline)) OLD_TARGET void
dot_rows_bf16(const float *A, int64_t asr, const int R, const uint16_t *w,
              int64_t K, float *y, int64_t ldy) {
    __m256 acc[8];
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + k))),
            16));
        for (int r = 0; r < R; r++)
            acc[r] =
                _mm256_fmadd_ps(_mm256_loadu_ps(A + r * asr + k), wv, acc[r]);
    }
    for (int r = 0; r < R; r++) {
        float lanes[8], s = 0;
        _mm256_storeu_ps(lanes, acc[r]);
        for (int q = 0; q < 8; q++)
            s += lanes[q];
        for (int64_t kk = k; kk < K; kk++)
            s += A[r * asr + kk] * ts_bf16_to_f32(w[kk]);
        y[r * ldy] = s;
    }
}

/* Two weight rows against NA <= 6 activation rows at once: 12
 * accumulators, two widened weight vectors and one activation vector fill
 * the 16 AVX2 registers, so each activation load feeds two FMAs and each
 * widened weight NA of them (FMA-bound, not load-bound). */
static inline __attribute__((always_inline)) OLD_TARGET void
dot2_rows_bf16(const float *A, int64_t asr, const int NA, const uint16_t *w0,
               const uint16_t *w1, int64_t K, float *y0, float *y1,
               int64_t ldy) {
    __m256 c0[6], c1[6];
    for (int r = 0; r < 6; r++)
        c0[r] = c1[r] = _mm256_setzero_ps();
    int64_t k = 0;
    /* few activation rows: two steps of k on separate accumulators, so
     * enough FMA chains are in flight to hide their latency */
    const int U = NA <= 3 ? 2 : 1;
    for (; k + 8 * U <= K; k += 8 * U)
        for (int u = 0; u < U; u++) {
            __m256 x0 = _mm256_castsi256_ps(
                _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                                      (const __m128i *)(w0 + k + 8 * u))),
                                  16));
            __m256 x1 = _mm256_castsi256_ps(
                _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                                      (const __m128i *)(w1 + k + 8 * u))),
                                  16));
            for (int r = 0; r < NA; r++) {
                __m256 v = _mm256_loadu_ps(A + r * asr + k + 8 * u);
                c0[r + 3 * u] = _mm256_fmadd_ps(v, x0, c0[r + 3 * u]);
                c1[r + 3 * u] = _mm256_fmadd_ps(v, x1, c1[r + 3 * u]);
            }
        }
    if (U == 2)
        for (int r = 0; r < NA; r++) {
            c0[r] = _mm256_add_ps(c0[r], c0[r + 3]);
            c1[r] = _mm256_add_ps(c1[r], c1[r + 3]);
        }
    for (int r = 0; r < NA; r++) {
        float l0[8], l1[8], s0 = 0, s1 = 0;
        _mm256_storeu_ps(l0, c0[r]);
        _mm256_storeu_ps(l1, c1[r]);
        for (int q = 0; q < 8; q++)
            s0 += l0[q], s1 += l1[q];
        for (int64_t kk = k; kk < K; kk++) {
            s0 += A[r * asr + kk] * ts_bf16_to_f32(w0[kk]);
            s1 += A[r * asr + kk] * ts_bf16_to_f32(w1[kk]);
        }
        y0[r * ldy] = s0;
        y1[r * ldy] = s1;
    }
}

/* Y (R, N) = A (R, K) @ W^T with W (N, K) bf16 rows bsc apart, R <= 8:
 * weight rows in pairs, activation rows in groups of up to 6 */
typedef struct {
    const float *A;
    int64_t asr, R;
    const uint16_t *W;
    int64_t bsc, N, K;
    float *Y;
} gemv_job;

/* weight rows [n0, n1) of gemv_rows */
OLD_TARGET static void gemv_rows_range(void *p, int64_t n0, int64_t n1) {
    const gemv_job *j = p;
    const float *A = j->A;
    const uint16_t *W = j->W;
    float *Y = j->Y;
    int64_t asr = j->asr, R = j->R, bsc = j->bsc, N = j->N, K = j->K;
#define TS_PAIR_CASE(na)                                                       \
    case na:                                                                   \
        dot2_rows_bf16(A + r0 * asr, asr, na, W + nn * bsc,                    \
                       W + (nn + 1) * bsc, K, Y + r0 * N + nn,                 \
                       Y + r0 * N + nn + 1, N);                                \
        break
#define TS_ROWS_CASE(r)                                                        \
    case r:                                                                    \
        dot_rows_bf16(A, asr, r, W + nn * bsc, K, Y + nn, N);                  \
        break
    int64_t nn = n0;
    for (; nn + 1 < n1; nn += 2)
        for (int64_t r0 = 0; r0 < R; r0 += 6)
            switch (R - r0 < 6 ? R - r0 : 6) {
                TS_PAIR_CASE(1);
                TS_PAIR_CASE(2);
                TS_PAIR_CASE(3);
                TS_PAIR_CASE(4);
                TS_PAIR_CASE(5);
                TS_PAIR_CASE(6);
            default:
                break;
            }
    if (nn < n1) /* an odd last row */
        switch (R) {
            TS_ROWS_CASE(1);
            TS_ROWS_CASE(2);
            TS_ROWS_CASE(3);
            TS_ROWS_CASE(4);
            TS_ROWS_CASE(5);
            TS_ROWS_CASE(6);
            TS_ROWS_CASE(7);
            TS_ROWS_CASE(8);
        default:
            break;
        }
#undef TS_PAIR_CASE
#undef TS_ROWS_CASE
}

OLD_TARGET static void gemv_rows(const float *A, int64_t asr, int64_t R,
                                 const uint16_t *W, int64_t bsc, int64_t N,
                                 int64_t K, float *Y) {
    gemv_job j = {A, asr, R, W, bsc, N, K, Y};
    /* pairs of weight rows; ~64K weights a chunk at least */
    int64_t grain = cpu_grain(K, 32768);
    ts_parallel_for(N, grain < 2 ? 2 : (grain + 1) / 2 * 2, gemv_rows_range,
                    &j);
}

/* weight rows [n0, n1) of a single activation row (decoding one
 * sequence): Y[n] = dot(A, W row n) */
OLD_TARGET static void dot_rows_range(void *p, int64_t n0, int64_t n1) {
    const gemv_job *j = p;
    for (int64_t nn = n0; nn < n1; nn++)
        j->Y[nn] = dot_f32_bf16(j->A, j->W + nn * j->bsc, j->K);
}

/* the old cpu_gemm_f32_w16t's decode paths; R > 32 went to the bf16 GEMM
 * at the AVX512_BF16 level */
static bool old_w16t(cpu_isa isa, int64_t R, int64_t N, int64_t K,
                     const float *A, const uint16_t *W, float *Y) {
    if (R == 1) {
        gemv_job j = {A, 0, 1, W, K, N, K, Y};
        ts_parallel_for(N, cpu_grain(K, 32768), dot_rows_range, &j);
        return true;
    }
    if (R <= 32) {
        for (int64_t r = 0; r < R; r += 8)
            gemv_rows(A + r * K, K, R - r < 8 ? R - r : 8, W, K, N, K,
                      Y + r * N);
        return true;
    }
    return cpu_gemm_bf16_blocked(isa, R, N, K, A, TS_F32, K, 1, W, TS_BF16, 1,
                                 K, NULL, Y, N, false);
}

/* ---- the bound: a plain read ---- */

typedef struct {
    const char *p;
    int64_t bytes;
    long long sink[64];
} read_job;

/* 64 KiB blocks [b0, b1) */
OLD_TARGET static void read_range(void *arg, int64_t b0, int64_t b1) {
    read_job *j = arg;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t b = b0; b < b1; b++) {
        int64_t o = b << 16, e = o + (1 << 16) < j->bytes
                                     ? o + (1 << 16)
                                     : j->bytes / 128 * 128;
        for (; o + 128 <= e; o += 128) {
            s0 = _mm256_xor_si256(
                s0, _mm256_loadu_si256((const __m256i *)(j->p + o)));
            s1 = _mm256_xor_si256(
                s1, _mm256_loadu_si256((const __m256i *)(j->p + o + 32)));
            s2 = _mm256_xor_si256(
                s2, _mm256_loadu_si256((const __m256i *)(j->p + o + 64)));
            s3 = _mm256_xor_si256(
                s3, _mm256_loadu_si256((const __m256i *)(j->p + o + 96)));
        }
    }
    s0 = _mm256_xor_si256(_mm256_xor_si256(s0, s1), _mm256_xor_si256(s2, s3));
    j->sink[b0 & 63] ^= _mm256_extract_epi64(s0, 0);
}

static void read_all(const void *p, int64_t bytes) {
    read_job j = {.p = p, .bytes = bytes};
    ts_parallel_for((bytes + 65535) >> 16, 4, read_range, &j);
}

/* ---- harness ---- */

enum { READ, OLD, F32_AVX2, F32_512, BF16, PACKED, METHODS };
static const char *method_name[METHODS] = {"read",       "old",  "f32@avx2",
                                           "f32@avx512", "bf16", "packed"};

static bool quick, cpu_time, best;
static const char *only;
static int64_t only_rows; /* --rows R: that row count only */

static double now(void) {
    struct timespec ts;
    clock_gettime(cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct {
    int64_t N, K, copies;
    uint16_t **W;
    cpu_bf16_packed **P;
    const float *A;
    float *Y;
    cpu_isa isa;
    const cpu_kernel_set *avx2, *avx512;
    int64_t next; /* the copy the next call reads */
} shape_run;

/* method m at R rows on the next copy; false when it failed, -1 when the
 * machine lacks it */
static int run(shape_run *s, int m, int64_t R) {
    int64_t c = s->next++ % s->copies;
    const uint16_t *W = s->W[c];
    switch (m) {
    case READ:
        read_all(W, 2 * s->N * s->K);
        return 1;
    case OLD:
        if (s->isa < CPU_ISA_AVX2 || (R > 32 && s->isa < CPU_ISA_AVX512_BF16))
            return -1;
        return old_w16t(s->isa, R, s->N, s->K, s->A, W, s->Y);
    case F32_AVX2:
        if (!s->avx2)
            return -1;
        return s->avx2->gemm_f32_w16t(R, s->N, s->K, s->A, s->K, W, s->K, true,
                                      s->Y);
    case F32_512:
        if (!s->avx512)
            return -1;
        return s->avx512->gemm_f32_w16t(R, s->N, s->K, s->A, s->K, W, s->K,
                                        true, s->Y);
    case BF16:
        if (s->isa < CPU_ISA_AVX512_BF16)
            return -1;
        return cpu_gemm_bf16(s->isa, R, s->N, s->K, s->A, TS_F32, s->K, 1, W,
                             TS_BF16, 1, s->K, s->Y, s->N, false);
    default:
        if (!s->P[c])
            return -1;
        return cpu_gemm_bf16_packed(s->isa, R, s->A, TS_F32, s->K, 1, s->P[c],
                                    s->Y, s->N, false);
    }
}

/* 64 sampled elements of the last call's Y (copy c's weights) against a
 * double sum: bf16-rounded activations for the bf16 paths */
static bool check(const shape_run *s, int m, int64_t R, int64_t c) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)R;
    const uint16_t *W = s->W[c];
    for (int i = 0; i < 64; i++) {
        h ^= h << 13, h ^= h >> 7, h ^= h << 17;
        int64_t r = (int64_t)(h % (uint64_t)R),
                n = (int64_t)((h >> 20) % (uint64_t)s->N);
        double sum = 0, mag = 0;
        for (int64_t k = 0; k < s->K; k++) {
            float a = s->A[r * s->K + k];
            if (m == BF16 || m == PACKED || (m == OLD && R > 32))
                a = ts_bf16_to_f32(ts_f32_to_bf16(a));
            double p = (double)a * ts_bf16_to_f32(W[n * s->K + k]);
            sum += p, mag += fabs(p);
        }
        double tol = m == BF16 || m == PACKED || (m == OLD && R > 32)
                         ? (double)(s->K + 3) * 0x1p-24 * mag
                         : 1e-5 * mag;
        if (!(fabs(s->Y[r * s->N + n] - sum) <= tol + 1e-30)) {
            fprintf(stderr,
                    "bench_decode_gemm: %s R=%lld N=%lld K=%lld: Y[%lld,%lld] "
                    "= %.9g, expected %.9g\n",
                    method_name[m], (long long)R, (long long)s->N,
                    (long long)s->K, (long long)r, (long long)n,
                    s->Y[r * s->N + n], sum);
            return false;
        }
    }
    return true;
}

/* the packed rows of an R-row call equal each row computed alone */
static bool rows_alone(shape_run *s, int64_t R) {
    if (!s->P[0])
        return true;
    float *Y1 = malloc(sizeof(float) * (size_t)s->N);
    bool same = Y1 != NULL;
    cpu_gemm_bf16_packed(s->isa, R, s->A, TS_F32, s->K, 1, s->P[0], s->Y, s->N,
                         false);
    for (int64_t r = 0; same && r<R; r += R> 8 ? 7 : 1) {
        cpu_gemm_bf16_packed(s->isa, 1, s->A + r * s->K, TS_F32, s->K, 1,
                             s->P[0], Y1, s->N, false);
        same = !memcmp(Y1, s->Y + r * s->N, sizeof(float) * (size_t)s->N);
        if (!same)
            fprintf(stderr,
                    "bench_decode_gemm: N=%lld K=%lld: row %lld of %lld rows "
                    "differs from the row alone\n",
                    (long long)s->N, (long long)s->K, (long long)r,
                    (long long)R);
    }
    free(Y1);
    return same;
}

static int bench_shape(const char *name, int64_t N, int64_t K, int reps,
                       cpu_isa isa) {
    static const int64_t rows[] = {1, 2, 4, 8, 16, 32, 64};
    enum { NR_ROWS = sizeof rows / sizeof *rows, RMAX = 64 };
    int64_t bytes = 2 * N * K;
    int64_t fill = (quick ? 32LL : 256LL) << 20;
    shape_run s = {.N = N,
                   .K = K,
                   .copies = (fill + bytes - 1) / bytes,
                   .isa = isa,
                   .avx2 = cpu_kernels_for(CPU_ISA_AVX2),
                   .avx512 = cpu_kernels_for(CPU_ISA_AVX512)};
    s.W = calloc((size_t)s.copies, sizeof *s.W);
    s.P = calloc((size_t)s.copies, sizeof *s.P);
    float *A = malloc(sizeof(float) * (size_t)(RMAX * K));
    s.Y = malloc(sizeof(float) * (size_t)(RMAX * N));
    if (!s.W || !s.P || !A || !s.Y)
        return 1;
    for (int64_t i = 0; i < RMAX * K; i++)
        A[i] = frand();
    s.A = A;
    for (int64_t c = 0; c < s.copies; c++) {
        s.W[c] = malloc((size_t)bytes);
        if (!s.W[c])
            return 1;
        for (int64_t i = 0; i < N * K; i++)
            s.W[c][i] = ts_f32_to_bf16(0.1f * frand());
        s.P[c] = cpu_bf16_pack_b(isa, K, N, s.W[c], TS_BF16, 1, K);
    }
    printf("\n%s: N = %lld, K = %lld, %.1f MiB of bf16 weights (%lld "
           "copies)%s\n",
           name, (long long)N, (long long)K, (double)bytes / 1048576.0,
           (long long)s.copies,
           s.P[0] ? "" : "; no packed path below avx512_bf16");
    printf("%3s %8s %8s %9s %10s %8s %8s | %8s %7s %6s %7s\n", "R", "read ms",
           "old ms", "f32@avx2", "f32@avx512", "bf16 ms", "packed", "GFLOP/s",
           "GB/s", "% read", "old/new");
    int status = 0;
    for (int ri = 0; ri < NR_ROWS; ri++) {
        int64_t R = rows[ri];
        if (only_rows && R != only_rows)
            continue;
        bool have[METHODS];
        for (int m = 0; m < METHODS; m++) { /* checks, and a warm-up */
            int64_t c = s.next % s.copies;
            int r = run(&s, m, R);
            have[m] = r >= 0;
            if (r == 0 || (m != READ && r > 0 && !check(&s, m, R, c)))
                status = 1;
        }
        if (!rows_alone(&s, R))
            status = 1;
        double once = now();
        run(&s, PACKED, R);
        run(&s, OLD, R);
        once = (now() - once) / 2;
        int n = reps > 0 ? reps : (int)(0.4 / (once > 1e-6 ? once : 1e-6));
        n = quick ? 3 : n < 3 ? 3 : n > 40 ? 40 : n;
        double *t = malloc(sizeof(double) * (size_t)(n * METHODS));
        for (int i = 0; i < n; i++)
            for (int q = 0; q < METHODS; q++) {
                int m = (q + i) % METHODS; /* each follows each in turn */
                double t0 = now();
                if (have[m])
                    run(&s, m, R);
                t[m * n + i] = now() - t0;
            }
        double ms[METHODS];
        for (int m = 0; m < METHODS; m++) {
            qsort(t + m * n, (size_t)n, sizeof(double), cmp_d);
            ms[m] = have[m] ? t[m * n + (best ? 0 : n / 2)] * 1e3 : NAN;
        }
        free(t);
        int best = have[PACKED] ? PACKED : have[F32_512] ? F32_512 : F32_AVX2;
        double sec = ms[best] * 1e-3;
        char cell[METHODS][16];
        for (int m = 0; m < METHODS; m++)
            if (have[m])
                snprintf(cell[m], sizeof cell[m], "%.3f", ms[m]);
            else
                snprintf(cell[m], sizeof cell[m], "-");
        printf("%3lld %8s %8s %9s %10s %8s %8s | %8.1f %7.1f %5.0f%% %6.2fx\n",
               (long long)R, cell[READ], cell[OLD], cell[F32_AVX2],
               cell[F32_512], cell[BF16], cell[PACKED],
               2.0 * (double)R * (double)N * (double)K / sec / 1e9,
               (double)bytes / sec / 1e9, 100.0 * ms[READ] / ms[best],
               have[OLD] ? ms[OLD] / ms[best] : NAN);
        fflush(stdout);
    }
    for (int64_t c = 0; c < s.copies; c++) {
        free(s.W[c]);
        cpu_bf16_packed_free(s.P[c]);
    }
    free(s.W), free(s.P), free(A), free(s.Y);
    return status;
}

int main(int argc, char **argv) {
    int threads = 0, reps = 0;
    bool lm_head = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-lm-head"))
            lm_head = false;
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--cpu-time"))
            cpu_time = true;
        else if (!strcmp(argv[i], "--best"))
            best = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            only_rows = atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_decode_gemm [--threads N] [--reps R] "
                            "[--no-lm-head] [--quick] [--cpu-time] [--best] "
                            "[--only lm_head|gate/up|down] [--rows R]\n");
            return !strcmp(argv[i], "--help") ? 0 : 2;
        }
    }
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    if (threads > 0)
        ts_set_num_threads(ctx, threads);
    cpu_isa isa = cpu_isa_active();
    printf("bench_decode_gemm: Y (R, N) = A (R, K) f32 @ W^T, W (N, K) bf16; "
           "%d threads; level %s; median ms of runs, weights from DRAM; "
           "GFLOP/s, GB/s, %% of the read bound and old/new of the packed "
           "path (the f32 one below avx512_bf16)\n",
           ts_threads_count(), cpu_isa_name(isa));
    int status = 0;
    const struct {
        const char *name;
        int64_t N, K;
    } shapes[] = {{"lm_head", 151936, 1024},
                  {"gate/up", 3072, 1024},
                  {"down", 1024, 3072}};
    for (int i = 0; i < 3; i++)
        if ((lm_head || i > 0) && (!only || !strcmp(only, shapes[i].name)))
            status |= bench_shape(shapes[i].name, shapes[i].N, shapes[i].K,
                                  reps, isa);
    ts_ctx_free(ctx);
    return status;
}
