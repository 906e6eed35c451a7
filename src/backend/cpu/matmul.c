/* matmul.c — batched matmul on the CPU. f32 goes to OpenBLAS's sgemm with
 * transposed views passed as transpose flags (no copy), and a batch that
 * shares one right-hand matrix folded into a single sgemm; bf16/f16 operands
 * are widened to f32 per batch and accumulated in f32. Also the small
 * register-blocked GEMM used inside fused kernels (attention), and its slow
 * reference. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/quant_gemm.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Can a (r x c) matrix with strides (sr, sc) be passed to BLAS? */
static bool blas_layout(int64_t r, int64_t c, int64_t sr, int64_t sc,
                        bool *trans, int64_t *ld) {
    int64_t cmax = c > 1 ? c : 1, rmax = r > 1 ? r : 1;
    if ((c == 1 || sc == 1) && (r == 1 || sr >= cmax)) {
        *trans = false;
        *ld = r == 1 ? cmax : sr;
        return true;
    }
    if ((r == 1 || sr == 1) && (c == 1 || sc >= rmax)) {
        *trans = true;
        *ld = c == 1 ? rmax : sc;
        return true;
    }
    return false;
}

#ifdef __AVX2__
/* dot(a[0..K), w[0..K)) with w bf16, converted 8 lanes at a time; four
 * accumulators so the FMA latency is hidden */
static float dot_f32_bf16(const float *a, const uint16_t *w, int64_t K) {
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
static inline __attribute__((always_inline)) void
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
static inline __attribute__((always_inline)) void
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

#else
/* Without AVX2: plain loops, one weight row at a time. */
static float dot_f32_bf16(const float *a, const uint16_t *w, int64_t K) {
    float s = 0;
    for (int64_t k = 0; k < K; k++)
        s += a[k] * ts_bf16_to_f32(w[k]);
    return s;
}

static inline void dot_rows_bf16(const float *A, int64_t asr, const int R,
                                 const uint16_t *w, int64_t K, float *y,
                                 int64_t ldy) {
    for (int r = 0; r < R; r++)
        y[r * ldy] = dot_f32_bf16(A + r * asr, w, K);
}

static inline void dot2_rows_bf16(const float *A, int64_t asr, const int NA,
                                  const uint16_t *w0, const uint16_t *w1,
                                  int64_t K, float *y0, float *y1,
                                  int64_t ldy) {
    dot_rows_bf16(A, asr, NA, w0, K, y0, ldy);
    dot_rows_bf16(A, asr, NA, w1, K, y1, ldy);
}
#endif

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
static void gemv_rows_range(void *p, int64_t n0, int64_t n1) {
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

static void gemv_rows(const float *A, int64_t asr, int64_t R, const uint16_t *W,
                      int64_t bsc, int64_t N, int64_t K, float *Y) {
    gemv_job j = {A, asr, R, W, bsc, N, K, Y};
    /* pairs of weight rows; ~64K weights a chunk at least */
    int64_t grain = cpu_grain(K, 32768);
    ts_parallel_for(N, grain < 2 ? 2 : (grain + 1) / 2 * 2, gemv_rows_range,
                    &j);
}

typedef struct {
    const uint16_t *W;
    int64_t ld;
    int64_t K;
    bool bf16;
    float *out;
} widen_rows_range_args;

static void widen_rows_range(void *p_, int64_t lo_, int64_t hi_) {
    const widen_rows_range_args *a_ = p_;
    const uint16_t *W = a_->W;
    int64_t ld = a_->ld;
    int64_t K = a_->K;
    bool bf16 = a_->bf16;
    float *out = a_->out;
    for (int64_t r = lo_; r < hi_; r++) {
        const uint16_t *src = W + r * ld;
        float *dst = out + r * K;
        int64_t k = 0;
#ifdef __AVX2__
        for (; k + 8 <= K; k += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(src + k));
            __m256 f = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(
                                  _mm256_cvtepu16_epi32(h), 16))
                            : _mm256_cvtph_ps(h);
            _mm256_storeu_ps(dst + k, f);
        }
#endif
        for (; k < K; k++)
            dst[k] = bf16 ? ts_bf16_to_f32(src[k]) : ts_f16_to_f32(src[k]);
    }
}

/* weight rows [n0, n1) of a single activation row (decoding one
 * sequence): Y[n] = dot(A, W row n) */
static void dot_rows_range(void *p, int64_t n0, int64_t n1) {
    const gemv_job *j = p;
    for (int64_t nn = n0; nn < n1; nn++)
        j->Y[nn] = dot_f32_bf16(j->A, j->W + nn * j->bsc, j->K);
}

void cpu_widen_rows(const uint16_t *W, int64_t ld, int64_t nb, int64_t K,
                    bool bf16, float *out) {
    widen_rows_range_args job = {W, ld, K, bf16, out};
    ts_parallel_for(nb, cpu_grain(K, 32768), widen_rows_range, &job);
}

/* f32 activations x bf16/f16 weights. A weight shared by the batch and
 * stored as rows of K (a linear layer's (N, K) weight seen transposed):
 * few rows (decoding) go through a dot-product kernel that reads each
 * weight once, converting on the fly; more rows convert the weight to f32
 * once and use the BLAS. Anything else: TS_ERR_UNSUPPORTED (the general
 * path packs per batch). */
static ts_status matmul_mixed(ts_ctx *ctx, ts_tensor *a, ts_tensor *b,
                              ts_tensor *y, int nb, int64_t M, int64_t N,
                              int64_t K, int64_t batch, const int64_t *ast,
                              const int64_t *bst) {
    bool shared = true;
    for (int d = 0; d < nb; d++)
        shared &= bst[d] == 0;
    int64_t bsr = b->strides[b->ndim - 2], bsc = b->strides[b->ndim - 1];
    int64_t asr = a->strides[a->ndim - 2], asc = a->strides[a->ndim - 1];
    bool rows_of_k =
        bsr == 1 && (N == 1 || bsc >= K); /* column n = weight row n */
    int64_t R = M * batch;                /* rows of a, batch folded */
    bool a_rows = asc == 1 && (asr >= K || (M == 1 && batch == 1));
    int64_t expect = asr * M;
    for (int d = nb - 1; d >= 0 && a_rows; d--) {
        if (y->shape[d] != 1 && ast[d] != expect)
            a_rows = false;
        expect *= y->shape[d];
    }
    if (ts_dtype_is_quantized(b->dtype)) {
        /* weights of a block format: W (N, K) contiguous, seen as W^T */
        if (!shared || !rows_of_k || !a_rows || y->dtype != TS_F32 ||
            (N > 1 && bsc != K))
            return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                                "matmul: a %s right operand must be the "
                                "transpose of a whole (N, K) weight shared by "
                                "the batch (x @ W.T), with f32 rows of x",
                                ts_dtype_name(b->dtype));
        if (!cpu_gemm_wq(CPU_THIS_ISA, R, N, K, (const float *)ts_tensor_ptr(a),
                         M == 1 && batch == 1 ? K : asr, ts_tensor_ptr(b),
                         ts_dtype_nbytes(b->dtype, K), b->dtype,
                         (float *)ts_tensor_ptr(y)))
            return ts_set_error(ctx, TS_ERR_OOM, "matmul: out of memory");
        return TS_OK;
    }
    if (!shared || !rows_of_k || !a_rows || y->dtype != TS_F32)
        return TS_ERR_UNSUPPORTED;
    /* a linear layer's many rows (prefill, training) against bf16 weights at
     * the AVX512_BF16 level: a native bf16 GEMM (vdpbf16ps; the activations
     * rounded to bf16 as the weights are, as PyTorch's bf16 autocast and
     * llama.cpp do; f32 sums), no widening pass. Decode's few rows keep f32
     * activations (cpu_gemm_f32_w16t reads each weight once either way). */
    if (R > 32 && b->dtype == TS_BF16 &&
        cpu_gemm_bf16(CPU_THIS_ISA, R, N, K, ts_tensor_ptr(a), TS_F32,
                      M == 1 && batch == 1 ? K : asr, 1, ts_tensor_ptr(b),
                      TS_BF16, 1, bsc, (float *)ts_tensor_ptr(y), N, false))
        return TS_OK;
    if (!cpu_gemm_f32_w16t(R, N, K, (const float *)ts_tensor_ptr(a),
                           M == 1 && batch == 1 ? K : asr,
                           (const uint16_t *)ts_tensor_ptr(b), bsc,
                           b->dtype == TS_BF16, (float *)ts_tensor_ptr(y)))
        return ts_set_error(ctx, TS_ERR_OOM, "matmul: out of memory");
    return TS_OK;
}

bool cpu_gemm_f32_w16t(int64_t R, int64_t N, int64_t K, const float *A,
                       int64_t lda, const uint16_t *W, int64_t ldw, bool bf16,
                       float *Y) {
    if (R == 1 && bf16) {
        gemv_job j = {A, 0, 1, W, ldw, N, K, Y};
        ts_parallel_for(N, cpu_grain(K, 32768), dot_rows_range, &j);
        return true;
    }
    /* a batch of decoding sequences: groups of 8 rows, each reading the
     * weights once (cheaper than widening a whole matrix per step) */
    if (R <= 32 && bf16) {
        for (int64_t r = 0; r < R; r += 8)
            gemv_rows(A + r * lda, lda, R - r < 8 ? R - r : 8, W, ldw, N, K,
                      Y + r * N);
        return true;
    }
    /* Y[:, n0:n0+nb] = A @ W[n0:n0+nb]^T block by block: each block of
     * weight rows widened to f32 (about 2 MiB, so it stays in cache for
     * the sgemm that reads it) */
    int64_t NB = ((int64_t)1 << 23) / K;
    NB = NB < 64 ? 64 : NB > N ? N : NB;
    float *wf = malloc(sizeof(float) * (size_t)(NB * K));
    if (!wf)
        return false;
    for (int64_t n0 = 0; n0 < N; n0 += NB) {
        int64_t nb = N - n0 < NB ? N - n0 : NB;
        cpu_widen_rows(W + n0 * ldw, ldw, nb, K, bf16, wf);
        ts_sgemm(false, true, (int)R, (int)nb, (int)K, 1.0f, A, (int)lda, wf,
                 (int)K, 0.0f, Y + n0, (int)N);
    }
    free(wf);
    return true;
}

typedef struct {
    const ts_tensor *a, *b;
    ts_tensor *y;
    int nb;
    int64_t M, N, K;
    bool ta, tb, a_ok, b_ok;
    int64_t lda, ldb, asr, asc, bsr, bsc;
    const int64_t *ast, *bst;
    atomic_int oom;
} batch_job;

/* batch elements [b0, b1) of the general matmul, with their own packing
 * buffers */
static void batch_range(void *p, int64_t b0, int64_t b1) {
    batch_job *j = p;
    const ts_tensor *a = j->a, *b = j->b;
    ts_tensor *y = j->y;
    int64_t M = j->M, N = j->N, K = j->K;
    float *apack = NULL, *bpack = NULL, *ypack = NULL;
    if (!j->a_ok)
        apack = malloc(sizeof(float) * (size_t)(M * K));
    if (!j->b_ok)
        bpack = malloc(sizeof(float) * (size_t)(K * N));
    bool y32 = y->dtype == TS_F32;
    if (!y32)
        ypack = malloc(sizeof(float) * (size_t)(M * N));
    if ((!j->a_ok && !apack) || (!j->b_ok && !bpack) || (!y32 && !ypack)) {
        free(apack), free(bpack), free(ypack);
        atomic_store(&j->oom, 1);
        return;
    }
    int64_t pst_a[2] = {K, 1}, pst_b[2] = {N, 1};
    float *yf = (float *)ts_tensor_ptr(y);
    for (int64_t bi = b0; bi < b1; bi++) {
        int64_t ao = 0, bo = 0, rem = bi;
        for (int d = j->nb - 1; d >= 0; d--) {
            int64_t i = rem % y->shape[d];
            rem /= y->shape[d];
            ao += i * j->ast[d];
            bo += i * j->bst[d];
        }
        const char *ap =
            ts_tensor_ptr(a) + ao * (int64_t)ts_dtype_size(a->dtype);
        const char *bp =
            ts_tensor_ptr(b) + bo * (int64_t)ts_dtype_size(b->dtype);
        const float *A = (const float *)ap, *Bm = (const float *)bp;
        bool tA = j->ta, tB = j->tb;
        int64_t lA = j->lda, lB = j->ldb;
        if (!j->a_ok) {
            int64_t sh[2] = {M, K}, st[2] = {j->asr, j->asc};
            cpu_copy_strided((char *)apack, TS_F32, pst_a, ap, a->dtype, st, 2,
                             sh);
            A = apack, tA = false, lA = K;
        }
        if (!j->b_ok) {
            int64_t sh[2] = {K, N}, st[2] = {j->bsr, j->bsc};
            cpu_copy_strided((char *)bpack, TS_F32, pst_b, bp, b->dtype, st, 2,
                             sh);
            Bm = bpack, tB = false, lB = N;
        }
        float *Y = y32 ? yf + bi * M * N : ypack;
        ts_sgemm(tA, tB, (int)M, (int)N, (int)K, 1.0f, A, (int)lA, Bm, (int)lB,
                 0.0f, Y, (int)N);
        if (!y32)
            cpu_scatter_f32(ts_tensor_ptr(y) +
                                bi * M * N * (int64_t)ts_dtype_size(y->dtype),
                            y->dtype, 1, ypack, M * N);
    }
    free(apack), free(bpack), free(ypack);
}

/* A (..., M, K) @ B (..., K, N) -> Y (batch..., M, N), Y contiguous. */
CPU_KERNEL(matmul) {
    ts_tensor *a = n->in[0], *b = n->in[1], *y = n->out;
    int nb = y->ndim - 2;
    int64_t M = y->shape[nb], N = y->shape[nb + 1];
    int64_t K = a->shape[a->ndim - 1];
    int64_t batch = 1;
    for (int d = 0; d < nb; d++)
        batch *= y->shape[d];
    if (M == 0 || N == 0 || batch == 0)
        return TS_OK;
    float *yf = (float *)ts_tensor_ptr(y);
    if (K == 0) {
        memset(ts_tensor_ptr(y), 0,
               (size_t)ts_tensor_numel(y) * ts_dtype_size(y->dtype));
        return TS_OK;
    }
    /* batch strides of a and b as broadcast to y's batch shape */
    int64_t ast[TS_MAX_DIMS] = {0}, bst[TS_MAX_DIMS] = {0};
    for (int d = 0; d < nb; d++) {
        int ia = a->ndim - 2 - nb + d, ib = b->ndim - 2 - nb + d;
        ast[d] = ia >= 0 && a->shape[ia] != 1 ? a->strides[ia] : 0;
        bst[d] = ib >= 0 && b->shape[ib] != 1 ? b->strides[ib] : 0;
    }
    int64_t asr = a->strides[a->ndim - 2], asc = a->strides[a->ndim - 1];
    int64_t bsr = b->strides[b->ndim - 2], bsc = b->strides[b->ndim - 1];
    bool mixed = a->dtype == TS_F32 && b->dtype != TS_F32;
    if (mixed) {
        ts_status st = matmul_mixed(ctx, a, b, y, nb, M, N, K, batch, ast, bst);
        if (st != TS_ERR_UNSUPPORTED)
            return st; /* else the general path */
    }
    bool f32 = a->dtype == TS_F32 && b->dtype == TS_F32;
    bool ta = false, tb = false;
    int64_t lda = 0, ldb = 0;
    bool a_ok = a->dtype == TS_F32 && blas_layout(M, K, asr, asc, &ta, &lda);
    bool b_ok = f32 && blas_layout(K, N, bsr, bsc, &tb, &ldb);

    /* fold: b shared by every batch and a's batch rows stacked evenly */
    bool b_shared = true;
    for (int d = 0; d < nb; d++)
        b_shared &= bst[d] == 0;
    if (a_ok && b_ok && !ta && b_shared && batch > 1) {
        bool stacked = true;
        int64_t expect = M * lda;
        for (int d = nb - 1; d >= 0; d--) {
            if (y->shape[d] != 1 && ast[d] != expect)
                stacked = false;
            expect *= y->shape[d];
        }
        if (stacked) {
            ts_sgemm(false, tb, (int)(M * batch), (int)N, (int)K, 1.0f,
                     (const float *)ts_tensor_ptr(a), (int)lda,
                     (const float *)ts_tensor_ptr(b), (int)ldb, 0.0f, yf,
                     (int)N);
            return TS_OK;
        }
    }
    /* general: one product per batch element; operands that BLAS cannot
     * take as they are (or that are not f32) are packed to f32 first.
     * Small products (attention's per-head ones) run a batch element per
     * thread; large ones are cut by ts_sgemm instead. */
    batch_job j = {a,    b,   y,   nb,  M,   N,   K,   ta,  tb,  a_ok,
                   b_ok, lda, ldb, asr, asc, bsr, bsc, ast, bst, 0};
    double flops = 2.0 * (double)M * (double)N * (double)K;
    int64_t grain = flops >= 4e6 ? batch : (int64_t)(4e6 / flops) + 1;
    ts_parallel_for(batch, grain, batch_range, &j);
    if (atomic_load(&j.oom))
        return ts_set_error(ctx, TS_ERR_OOM, "matmul: out of memory");
    return TS_OK;
}

/* ---- matmul epilogue ----
 * out = group(A @ B, ...): A's rows (batch folded in) in panels of about
 * 1 MiB of result; each panel's product goes to a scratch buffer and the
 * fused group turns it into the same rows of out at once. Where the shapes
 * do not allow panels (a broadcast A, a non-f32 product, outside inputs
 * that are not row-regular) the product is made whole in a temporary. */

/* t broadcast to (R, N) rows: one row stride, one column stride? */
static bool row_strides(const ts_tensor *t, const ts_tensor *out, int64_t *rs,
                        int64_t *cs) {
    int64_t st[TS_MAX_DIMS];
    ts_broadcast_strides(t, out->ndim, out->shape, st);
    int last = out->ndim - 1;
    *cs = st[last];
    *rs = last > 0 ? st[last - 1] : 0;
    for (int d = last - 2; d >= 0; d--)
        if (out->shape[d] != 1 && st[d] != st[d + 1] * out->shape[d + 1])
            return false;
    /* rows collapse only when the row dims are themselves regular */
    if (last > 0 && out->shape[last - 1] == 1)
        return false;
    return true;
}

ts_status cpu_matmul_epilogue(ts_ctx *ctx, const ts_fused *f) {
    const ts_node *mm = f->head;
    ts_tensor *a = mm->in[0], *b = mm->in[1], *out = f->out;
    int64_t N = out->shape[out->ndim - 1], K = a->shape[a->ndim - 1];
    int64_t R = N ? ts_tensor_numel(out) / N : 0;
    bool tb = false;
    int64_t ldb = 0, lda = a->ndim >= 2 ? a->strides[a->ndim - 2] : K;
    bool panels = a->dtype == TS_F32 && b->dtype == TS_F32 && b->ndim == 2 &&
                  a->strides[a->ndim - 1] == 1 && lda >= K && K > 0 &&
                  ts_tensor_numel(a) == R * K && ts_tensor_is_contiguous(out) &&
                  blas_layout(K, N, b->strides[0], b->strides[1], &tb, &ldb);
    int64_t expect = lda * (a->ndim >= 2 ? a->shape[a->ndim - 2] : 1);
    for (int d = a->ndim - 3; d >= 0 && panels; d--) {
        if (a->shape[d] != 1 && a->strides[d] != expect)
            panels = false;
        expect *= a->shape[d];
    }
    if (a->ndim >= 2 && a->shape[a->ndim - 2] == 1 && a->ndim > 2)
        panels = false;
    int64_t rs[TS_FUSE_MAX_EXT], cs[TS_FUSE_MAX_EXT];
    for (int e = 0; e < f->n_ext && panels; e++)
        if (e != f->head_ext)
            panels = row_strides(f->ext[e], out, &rs[e], &cs[e]);
    ts_fused g = *f;
    g.head = NULL;
    ts_storage scratch_st = {.refcount = 1, .ctx = ctx, .external = true};
    ts_tensor prod = {
        .refcount = 1, .ctx = ctx, .dtype = TS_F32, .storage = &scratch_st};
    if (!panels) { /* the whole product in a temporary, then the group */
        prod.ndim = out->ndim;
        memcpy(prod.shape, out->shape, sizeof prod.shape);
        ts_contiguous_strides(prod.ndim, prod.shape, prod.strides);
        scratch_st.data = malloc(sizeof(float) * (size_t)(R * N + 1));
        if (!scratch_st.data)
            return ts_set_error(ctx, TS_ERR_OOM,
                                "matmul epilogue: out of memory");
        ts_node mn = *mm;
        mn.out = &prod;
        ts_status st = cpu_matmul(ctx, &mn);
        if (st == TS_OK) {
            g.ext[f->head_ext] = &prod;
            st = cpu_run_fused(ctx, &g);
        }
        free(scratch_st.data);
        return st;
    }
    /* panels of ~1 MB of output, but at least 256 rows (the scratch is then
     * 256 N floats): each panel's sgemm packs all of b again, which costs
     * more than the cache it saves when panels are thinner (GPT-2's
     * 256-row steps, N = 3072: 85-row panels made its compiled step slower
     * than eager) */
    int64_t P = (int64_t)(262144 / (N > 0 ? N : 1));
    P = P < 256 ? 256 : P;
    P = P > R ? R : P;
    scratch_st.data = malloc(sizeof(float) * (size_t)(P * N + 1));
    if (!scratch_st.data)
        return ts_set_error(ctx, TS_ERR_OOM, "matmul epilogue: out of memory");
    ts_tensor ext_panel[TS_FUSE_MAX_EXT], out_panel = *out;
    ts_status st = TS_OK;
    for (int64_t r0 = 0; r0 < R && st == TS_OK; r0 += P) {
        int64_t rows = R - r0 < P ? R - r0 : P;
        ts_sgemm(false, tb, (int)rows, (int)N, (int)K, 1.0f,
                 (const float *)ts_tensor_ptr(a) + r0 * lda, (int)lda,
                 (const float *)ts_tensor_ptr(b), (int)ldb, 0.0f,
                 (float *)scratch_st.data, (int)N);
        prod.ndim = 2, prod.shape[0] = rows, prod.shape[1] = N;
        prod.strides[0] = N, prod.strides[1] = 1;
        out_panel.ndim = 2, out_panel.shape[0] = rows, out_panel.shape[1] = N;
        out_panel.strides[0] = N, out_panel.strides[1] = 1;
        out_panel.offset = out->offset + r0 * N;
        for (int e = 0; e < f->n_ext; e++) {
            if (e == f->head_ext) {
                g.ext[e] = &prod;
                continue;
            }
            ext_panel[e] = *f->ext[e];
            ext_panel[e].ndim = 2;
            ext_panel[e].shape[0] = rows, ext_panel[e].shape[1] = N;
            ext_panel[e].strides[0] = rs[e], ext_panel[e].strides[1] = cs[e];
            ext_panel[e].offset = f->ext[e]->offset + r0 * rs[e];
            g.ext[e] = &ext_panel[e];
        }
        g.out = &out_panel;
        st = cpu_run_fused(ctx, &g);
    }
    free(scratch_st.data);
    return st;
}

/* ---- small GEMM for fused kernels ---- */

void cpu_gemm_f32_reference(int64_t M, int64_t N, int64_t K, const float *A,
                            int64_t lda, const float *B, int64_t ldb, float *C,
                            int64_t ldc, bool acc) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = acc ? C[i * ldc + j] : 0.0;
            for (int64_t k = 0; k < K; k++)
                s += (double)A[i * lda + k] * B[k * ldb + j];
            C[i * ldc + j] = (float)s;
        }
}

#ifdef __AVX2__
/* 4 rows x 16 columns of C in 8 AVX registers; B rows are read once per k
 * and each A element is broadcast. */
static inline void tile_4x16(int64_t K, const float *A, int64_t lda,
                             const float *B, int64_t ldb, float *C, int64_t ldc,
                             bool acc) {
    __m256 c[4][2];
    for (int r = 0; r < 4; r++) {
        c[r][0] = acc ? _mm256_loadu_ps(C + r * ldc) : _mm256_setzero_ps();
        c[r][1] = acc ? _mm256_loadu_ps(C + r * ldc + 8) : _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < K; k++) {
        __m256 b0 = _mm256_loadu_ps(B + k * ldb);
        __m256 b1 = _mm256_loadu_ps(B + k * ldb + 8);
        for (int r = 0; r < 4; r++) {
            __m256 av = _mm256_broadcast_ss(A + r * lda + k);
            c[r][0] = _mm256_fmadd_ps(av, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(av, b1, c[r][1]);
        }
    }
    for (int r = 0; r < 4; r++) {
        _mm256_storeu_ps(C + r * ldc, c[r][0]);
        _mm256_storeu_ps(C + r * ldc + 8, c[r][1]);
    }
}

/* 1 row x 16 columns (row tails) */
static inline void tile_1x16(int64_t K, const float *A, const float *B,
                             int64_t ldb, float *C, bool acc) {
    __m256 c0 = acc ? _mm256_loadu_ps(C) : _mm256_setzero_ps();
    __m256 c1 = acc ? _mm256_loadu_ps(C + 8) : _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m256 av = _mm256_broadcast_ss(A + k);
        c0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(B + k * ldb), c0);
        c1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(B + k * ldb + 8), c1);
    }
    _mm256_storeu_ps(C, c0);
    _mm256_storeu_ps(C + 8, c1);
}

#else
/* Without AVX2: the same tiles as plain loops (the compiler vectorizes
 * the 16 columns) */
static inline void tile_1x16(int64_t K, const float *A, const float *B,
                             int64_t ldb, float *C, bool acc) {
    float c[16];
    for (int j = 0; j < 16; j++)
        c[j] = acc ? C[j] : 0.0f;
    for (int64_t k = 0; k < K; k++)
        for (int j = 0; j < 16; j++)
            c[j] += A[k] * B[k * ldb + j];
    memcpy(C, c, sizeof c);
}

static inline void tile_4x16(int64_t K, const float *A, int64_t lda,
                             const float *B, int64_t ldb, float *C, int64_t ldc,
                             bool acc) {
    for (int r = 0; r < 4; r++)
        tile_1x16(K, A + r * lda, B, ldb, C + r * ldc, acc);
}
#endif

void cpu_gemm_f32(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float *C, int64_t ldc,
                  bool acc) {
    int64_t N16 = N / 16 * 16, M4 = M / 4 * 4;
    for (int64_t j = 0; j < N16; j += 16) {
        int64_t i = 0;
        for (; i < M4; i += 4)
            tile_4x16(K, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc,
                      acc);
        for (; i < M; i++)
            tile_1x16(K, A + i * lda, B + j, ldb, C + i * ldc + j, acc);
    }
    if (N16 < N) { /* column tail */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = N16; j < N; j++) {
                float s = acc ? C[i * ldc + j] : 0.0f;
                for (int64_t k = 0; k < K; k++)
                    s += A[i * lda + k] * B[k * ldb + j];
                C[i * ldc + j] = s;
            }
    }
}
