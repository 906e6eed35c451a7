/* matmul.c — batched matmul on the CPU. f32 goes to OpenBLAS's sgemm with
 * transposed views passed as transpose flags (no copy), and a batch that
 * shares one right-hand matrix folded into a single sgemm; a bf16 weight
 * seen as W^T goes to the bf16 GEMM at the AVX512_BF16 level (gemm_bf16.c)
 * and to decode's widen-in-registers kernel below it; other bf16/f16
 * operands are widened to f32 per batch and accumulated in f32. Also the
 * small register-blocked GEMM used inside fused kernels (attention), and
 * its slow reference. */
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

/* ---- few rows against bf16 weights, f32 math ----
 * Y (R, N) = A (R, K) @ W^T, W (N, K) bf16 rows ldw apart, R <= W16_ROWS
 * (decode's rows): register tiles of NW weight rows x NA activation rows,
 * each weight vector widened once and used by the NA rows. Every Y element
 * is one vector accumulator: lane l of it sums a[k] w[k] for k = l, l + L,
 * l + 2L, ... in order (fused multiply-adds; a zero-padded last step for
 * K's tail), then the lanes are added in a fixed tree. The tile only
 * decides which elements run side by side, never how one is summed: an
 * element's bits do not depend on R or on the other rows (decode alone,
 * batched, or a prefill's rows through here agree). Without AVX2, the
 * same holds of a plain loop over k. */
#define W16_ROWS 64
#define W16_NA   6 /* activation rows per tile, at most */

#if defined(__AVX512F__)
#define W16_L 16
typedef __m512 w16_vec;
static inline w16_vec w16_zero(void) {
    return _mm512_setzero_ps();
}
static inline w16_vec w16_fma(w16_vec a, w16_vec w, w16_vec c) {
    return _mm512_fmadd_ps(a, w, c);
}
static inline w16_vec w16_a(const float *a) {
    return _mm512_loadu_ps(a);
}
static inline w16_vec w16_w(const uint16_t *w) {
    __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)w));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}
/* t (1 .. L - 1) elements, zeros after */
static inline w16_vec w16_a_tail(const float *a, int t) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << t) - 1), a);
}
static inline w16_vec w16_w_tail(const uint16_t *w, int t) {
    __m512i x = _mm512_cvtepu16_epi32(
        _mm256_maskz_loadu_epi16((__mmask16)((1u << t) - 1), w));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}
static inline float w16_sum(w16_vec v) {
    __m256 h = _mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 q =
        _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
    return _mm_cvtss_f32(q);
}
/* weight rows per tile for na activation rows: NW + NW na + 1 of the 32
 * registers */
#define W16_NW(na) 4
#elif defined(__AVX2__)
#define W16_L      8
typedef __m256 w16_vec;
static inline w16_vec w16_zero(void) {
    return _mm256_setzero_ps();
}
static inline w16_vec w16_fma(w16_vec a, w16_vec w, w16_vec c) {
    return _mm256_fmadd_ps(a, w, c);
}
static inline w16_vec w16_a(const float *a) {
    return _mm256_loadu_ps(a);
}
static inline w16_vec w16_w(const uint16_t *w) {
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)w));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}
static inline w16_vec w16_a_tail(const float *a, int t) {
    float b[8] = {0};
    memcpy(b, a, sizeof(float) * (size_t)t);
    return _mm256_loadu_ps(b);
}
static inline w16_vec w16_w_tail(const uint16_t *w, int t) {
    uint16_t b[8] = {0};
    memcpy(b, w, sizeof(uint16_t) * (size_t)t);
    return w16_w(b);
}
static inline float w16_sum(w16_vec v) {
    __m128 q =
        _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
    return _mm_cvtss_f32(q);
}
/* NW + NW na + 1 of the 16 registers */
#define W16_NW(na) ((na) <= 2 ? 4 : (na) == 3 ? 3 : 2)
#endif

#ifdef W16_L
/* Y[r * ldy + i] = A row r . W row i for r < NA, i < NW */
static inline __attribute__((always_inline)) void
w16_tile(const float *A, int64_t lda, const int NA, const uint16_t *W,
         int64_t ldw, const int NW, int64_t K, float *Y, int64_t ldy) {
    w16_vec c[4][W16_NA];
    for (int i = 0; i < NW; i++)
        for (int r = 0; r < NA; r++)
            c[i][r] = w16_zero();
    int64_t k = 0;
    for (; k + W16_L <= K; k += W16_L) {
        w16_vec w[4];
        /* the next tile's rows at this k, a line every 32 weights: a
         * tile's NW row streams, each a page or less, are more than the
         * hardware prefetcher follows (the LM head at one row ran 1.5x
         * slower without) */
        if ((k & 31) == 0)
            for (int i = 0; i < NW; i++)
                _mm_prefetch((const char *)(W + (i + NW) * ldw + k),
                             _MM_HINT_T0);
        for (int i = 0; i < NW; i++)
            w[i] = w16_w(W + i * ldw + k);
        for (int r = 0; r < NA; r++) {
            w16_vec a = w16_a(A + r * lda + k);
            for (int i = 0; i < NW; i++)
                c[i][r] = w16_fma(a, w[i], c[i][r]);
        }
    }
    if (k < K) {
        int t = (int)(K - k);
        w16_vec w[4];
        for (int i = 0; i < NW; i++)
            w[i] = w16_w_tail(W + i * ldw + k, t);
        for (int r = 0; r < NA; r++) {
            w16_vec a = w16_a_tail(A + r * lda + k, t);
            for (int i = 0; i < NW; i++)
                c[i][r] = w16_fma(a, w[i], c[i][r]);
        }
    }
    for (int i = 0; i < NW; i++)
        for (int r = 0; r < NA; r++)
            Y[r * ldy + i] = w16_sum(c[i][r]);
}

/* NA rows of A against weight rows [n0, n1): tiles of W16_NW(NA) weight
 * rows, then the last few one by one */
#define W16_ROWS_FN(na)                                                        \
    static void w16_rows_##na(const float *A, int64_t lda, const uint16_t *W,  \
                              int64_t ldw, int64_t n0, int64_t n1, int64_t K,  \
                              float *Y, int64_t ldy) {                         \
        enum { NW = W16_NW(na) };                                              \
        int64_t n = n0;                                                        \
        for (; n + NW <= n1; n += NW)                                          \
            w16_tile(A, lda, na, W + n * ldw, ldw, NW, K, Y + n, ldy);         \
        for (; n < n1; n++)                                                    \
            w16_tile(A, lda, na, W + n * ldw, ldw, 1, K, Y + n, ldy);          \
    }
W16_ROWS_FN(1)
W16_ROWS_FN(2)
W16_ROWS_FN(3)
W16_ROWS_FN(4)
W16_ROWS_FN(5)
W16_ROWS_FN(6)
#undef W16_ROWS_FN
typedef void (*w16_rows_fn)(const float *A, int64_t lda, const uint16_t *W,
                            int64_t ldw, int64_t n0, int64_t n1, int64_t K,
                            float *Y, int64_t ldy);
static const w16_rows_fn w16_rows[W16_NA + 1] = {
    NULL,       w16_rows_1, w16_rows_2, w16_rows_3,
    w16_rows_4, w16_rows_5, w16_rows_6};
#else
/* Without AVX2: a plain loop per element, k in order */
static void w16_rows_any(const float *A, int64_t lda, int64_t na,
                         const uint16_t *W, int64_t ldw, int64_t n0, int64_t n1,
                         int64_t K, float *Y, int64_t ldy) {
    for (int64_t n = n0; n < n1; n++)
        for (int64_t r = 0; r < na; r++) {
            float s = 0;
            for (int64_t k = 0; k < K; k++)
                s += A[r * lda + k] * ts_bf16_to_f32(W[n * ldw + k]);
            Y[r * ldy + n] = s;
        }
}
#endif

typedef struct {
    const float *A;
    int64_t lda, R;
    const uint16_t *W;
    int64_t ldw, N, K;
    float *Y;
} w16_job;

/* weight rows [n0, n1), a block at a time that stays in L2 while every
 * group of activation rows passes over it */
static void w16_range(void *p, int64_t n0, int64_t n1) {
    const w16_job *j = p;
    int64_t NB = ((int64_t)128 << 10) / (2 * j->K + 1);
    NB = NB < 8 ? 8 : NB / 4 * 4;
    for (int64_t b0 = n0; b0 < n1; b0 += NB) {
        int64_t b1 = n1 - b0 < NB ? n1 : b0 + NB;
        for (int64_t r = 0; r < j->R; r += W16_NA) {
            int64_t na = j->R - r < W16_NA ? j->R - r : W16_NA;
#ifdef W16_L
            w16_rows[na](j->A + r * j->lda, j->lda, j->W, j->ldw, b0, b1, j->K,
                         j->Y + r * j->N, j->N);
#else
            w16_rows_any(j->A + r * j->lda, j->lda, na, j->W, j->ldw, b0, b1,
                         j->K, j->Y + r * j->N, j->N);
#endif
        }
    }
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

void cpu_widen_rows(const uint16_t *W, int64_t ld, int64_t nb, int64_t K,
                    bool bf16, float *out) {
    widen_rows_range_args job = {W, ld, K, bf16, out};
    ts_parallel_for(nb, cpu_grain(K, 32768), widen_rows_range, &job);
}

/* f32 activations x bf16/f16 weights shared by the batch. At the
 * AVX512_BF16 level a bf16 weight of any strides goes to the bf16 GEMM
 * (packed at load or not). Else a weight stored as rows of K (a linear
 * layer's (N, K) weight seen transposed): up to 64 rows (decoding) go
 * through a register-blocked kernel that reads each weight once, widening
 * it in registers, and more rows convert the weight to f32 once and use
 * the BLAS. Anything else: TS_ERR_UNSUPPORTED (the general path packs per
 * batch). */
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
    int64_t lda = M == 1 && batch == 1 ? K : asr;
    /* at the AVX512_BF16 level, bf16 weights in any number of rows go
     * through the bf16 GEMM (vdpbf16ps; the activations rounded to bf16 as
     * the weights are, as PyTorch's bf16 autocast and llama.cpp do; f32
     * sums): decode's rows stream the weights once, a prefill's are
     * blocked for cache, and a row's result is the same bits either way.
     * A weight packed at load (ts_storage.packed, ts_decoder_prepack) is
     * read in the kernel's layout, whatever its strides. */
    bool bf16_gemm = CPU_THIS_ISA >= CPU_ISA_AVX512_BF16 &&
                     b->dtype == TS_BF16 && y->dtype == TS_F32 && shared &&
                     a_rows;
    const cpu_bf16_packed *pb = bf16_gemm && b->ndim == 2
                                    ? cpu_packed_operand(b, CPU_THIS_ISA, false)
                                    : NULL;
    if (pb &&
        cpu_gemm_bf16_packed(CPU_THIS_ISA, R, ts_tensor_ptr(a), TS_F32, lda, 1,
                             pb, (float *)ts_tensor_ptr(y), N, false))
        return TS_OK;
    /* any strides of the weight (a Conv1D family's x @ W too): the GEMM
     * packs it as it goes, the same bits as its packed copy */
    if (bf16_gemm &&
        cpu_gemm_bf16(CPU_THIS_ISA, R, N, K, ts_tensor_ptr(a), TS_F32, lda, 1,
                      ts_tensor_ptr(b), TS_BF16, bsr, bsc,
                      (float *)ts_tensor_ptr(y), N, false))
        return TS_OK;
    if (!shared || !rows_of_k || !a_rows || y->dtype != TS_F32)
        return TS_ERR_UNSUPPORTED;
    if (!cpu_gemm_f32_w16t(R, N, K, (const float *)ts_tensor_ptr(a), lda,
                           (const uint16_t *)ts_tensor_ptr(b), bsc,
                           b->dtype == TS_BF16, (float *)ts_tensor_ptr(y)))
        return ts_set_error(ctx, TS_ERR_OOM, "matmul: out of memory");
    return TS_OK;
}

bool cpu_gemm_f32_w16t(int64_t R, int64_t N, int64_t K, const float *A,
                       int64_t lda, const uint16_t *W, int64_t ldw, bool bf16,
                       float *Y) {
    /* decode's rows: each weight read once per call, R-independent sums */
    if (R <= W16_ROWS && bf16) {
        w16_job j = {A, lda, R, W, ldw, N, K, Y};
        /* ~64K weights a chunk at least, whole tiles */
        int64_t grain = cpu_grain(K, 65536);
        ts_parallel_for(N, (grain + 3) / 4 * 4, w16_range, &j);
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
