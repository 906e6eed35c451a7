/* cpu.h — shared pieces of the CPU backend: the kernel signature, the
 * strided iterator used by elementwise kernels, conversion helpers, and the
 * slow reference kernels kept next to the fast ones for tests. */
#ifndef TS_CPU_H
#define TS_CPU_H

#include "backend/cpu/isa.h"
#include "ops/ops.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

/* The kernel files (attention, elementwise, loss, matmul, moe, norm, reduce,
 * routing, kernels) compile once per ISA level, each time with that level's
 * flags and CPU_ISA_SUFFIX set; their exported names get the suffix
 * (cpu_isa_names.h), and cpu_backend.c calls the level chosen at run time
 * through the table each compile exports. Code inside them selects its
 * paths with the compiler's macros (__AVX2__, __AVX512F__, ...). */
#ifdef CPU_ISA_SUFFIX
#include "backend/cpu/cpu_isa_names.h"
#endif
/* The level this compile is for (in the kernel files). */
#if defined(__AVX512BF16__)
#define CPU_THIS_ISA CPU_ISA_AVX512_BF16
#elif defined(__AVX512F__)
#define CPU_THIS_ISA CPU_ISA_AVX512
#elif defined(__AVX2__)
#define CPU_THIS_ISA CPU_ISA_AVX2
#else
#define CPU_THIS_ISA CPU_ISA_SSE2
#endif

#ifdef __AVX2__
/* e^x for 8 lanes: x = n ln2 + r, |r| <= ln2/2, e^r by its Taylor series to
 * r^7 (relative error < 2e-7), 2^n put into the exponent bits. Lanes below
 * -87.3 (including -inf) give exactly 0. */
static inline __m256 cpu_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f), hi = _mm256_set1_ps(88.7f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 nf = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(nf), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

/* silu(x) = x / (1 + e^-x) over n floats with cpu_exp8; the tail goes
 * through a padded vector, so every element is computed alike (a folded
 * constant equals the kernel's value) */
static inline __m256 cpu_silu8(__m256 x) {
    __m256 e = cpu_exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}
/* y = f(x) over n floats, 8 lanes at a time; the tail goes through a
 * padded vector, so every element is computed alike */
static inline void cpu_map8(float *y, const float *x, int64_t n,
                            __m256 (*f)(__m256)) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float buf[8] = {0};
        memcpy(buf, x + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(buf, f(_mm256_loadu_ps(buf)));
        memcpy(y + i, buf, sizeof(float) * (size_t)(n - i));
    }
}
static inline void cpu_silu(float *y, const float *x, int64_t n) {
    cpu_map8(y, x, n, cpu_silu8);
}

/* GELU with the tanh approximation, 0.5 x (1 + tanh(u)) = x sigmoid(2u)
 * with u = sqrt(2/pi) (x + 0.044715 x^3), and its derivative
 * s + 2 x s (1 - s) u' (s = sigmoid(2u)), through cpu_exp8; tails padded
 * as cpu_silu's. */
static inline __m256 cpu_gelu_sig8(__m256 x, __m256 *du) {
    const __m256 k2 = _mm256_set1_ps(2.0f * 0.7978845608028654f),
                 c = _mm256_set1_ps(0.044715f), one = _mm256_set1_ps(1.0f);
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 kx = _mm256_mul_ps(k2, x); /* 2u = 2k x (1 + c x^2) */
    __m256 e = cpu_exp8(_mm256_sub_ps(
        _mm256_setzero_ps(), _mm256_mul_ps(kx, _mm256_fmadd_ps(c, x2, one))));
    if (du) /* 2u' = 2k (1 + 3c x^2) */
        *du = _mm256_mul_ps(
            k2, _mm256_fmadd_ps(_mm256_set1_ps(3.0f * 0.044715f), x2, one));
    return _mm256_div_ps(one, _mm256_add_ps(one, e));
}
static inline __m256 cpu_gelu_tanh8(__m256 x) {
    return _mm256_mul_ps(x, cpu_gelu_sig8(x, NULL));
}
static inline __m256 cpu_gelu_tanh_bwd8(__m256 g, __m256 x) {
    __m256 du, s = cpu_gelu_sig8(x, &du);
    __m256 s1 = _mm256_mul_ps(s, _mm256_sub_ps(_mm256_set1_ps(1.0f), s));
    return _mm256_mul_ps(g, _mm256_fmadd_ps(_mm256_mul_ps(x, s1), du, s));
}
static inline void cpu_gelu_tanh(float *y, const float *x, int64_t n) {
    cpu_map8(y, x, n, cpu_gelu_tanh8);
}
static inline void cpu_gelu_tanh_bwd(float *y, const float *g, const float *x,
                                     int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, cpu_gelu_tanh_bwd8(_mm256_loadu_ps(g + i),
                                                   _mm256_loadu_ps(x + i)));
    if (i < n) {
        float gb[8] = {0}, xb[8] = {0};
        memcpy(gb, g + i, sizeof(float) * (size_t)(n - i));
        memcpy(xb, x + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(
            gb, cpu_gelu_tanh_bwd8(_mm256_loadu_ps(gb), _mm256_loadu_ps(xb)));
        memcpy(y + i, gb, sizeof(float) * (size_t)(n - i));
    }
}

/* tanh for 8 lanes through cpu_exp8: sign(x) (e - 1) / (e + 1) with
 * e = e^(2|x|) (clamped, so large |x| gives +-1); absolute error ~1e-7 */
static inline __m256 cpu_tanh8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 ax = _mm256_andnot_ps(sign, x);
    __m256 e = cpu_exp8(_mm256_add_ps(ax, ax));
    __m256 t = _mm256_div_ps(_mm256_sub_ps(e, one), _mm256_add_ps(e, one));
    return _mm256_or_ps(t, _mm256_and_ps(sign, x));
}

#else
/* Without AVX2: the same functions one float at a time (libm's expf and
 * tanhf; results within rounding of the vector versions). */
static inline void cpu_silu(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] / (1.0f + expf(-x[i]));
}
static inline float cpu_gelu_tanh1(float x, float *dydx) {
    const float k = 0.7978845608028654f, c = 0.044715f;
    float u = k * (x + c * x * x * x);
    float s = 1.0f / (1.0f + expf(-2.0f * u));
    if (dydx)
        *dydx = s + 2.0f * x * s * (1.0f - s) * k * (1.0f + 3.0f * c * x * x);
    return x * s;
}
static inline void cpu_gelu_tanh(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = cpu_gelu_tanh1(x[i], NULL);
}
static inline void cpu_gelu_tanh_bwd(float *y, const float *g, const float *x,
                                     int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float d;
        cpu_gelu_tanh1(x[i], &d);
        y[i] = g[i] * d;
    }
}
#endif

/* GELU with erf, its derivative, and silu's derivative, one float at a
 * time: the unary kernels (elementwise.c) and the experts MLP (moe.c)
 * share them, so both compute the same bits */
static inline float cpu_gelu_erf(float x) {
    return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
}
static inline float cpu_gelu_erf_grad(float x) {
    const float inv_sqrt_2pi = 0.3989422804014327f;
    float cdf = 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));
    return cdf + x * inv_sqrt_2pi * expf(-0.5f * x * x);
}
/* g * silu'(x) */
static inline float cpu_silu_bwd(float g, float x) {
    float s = 1.0f / (1.0f + expf(-x));
    return g * s * (1.0f + x * (1.0f - s));
}

typedef ts_status (*ts_cpu_kernel)(ts_ctx *ctx, ts_node *n);

/* Iteration over a shape for up to 4 operands (operand 0 is usually the
 * output), dims merged where every operand allows, size-1 dims dropped.
 * The last dim is the inner loop; "rows" are the other dims flattened. */
#define CPU_ITER_MAX_OPS (TS_FUSE_MAX_EXT + 1)
typedef struct {
    int ndim;
    int nops;
    int64_t shape[TS_MAX_DIMS];
    int64_t st[CPU_ITER_MAX_OPS][TS_MAX_DIMS];
} cpu_iter;

void cpu_iter_init(cpu_iter *it, int ndim, const int64_t *shape, int nops,
                   int64_t (*strides)[TS_MAX_DIMS]);
static inline int64_t cpu_iter_rows(const cpu_iter *it) {
    int64_t r = 1;
    for (int d = 0; d < it->ndim - 1; d++)
        r *= it->shape[d];
    return r;
}
static inline int64_t cpu_iter_inner(const cpu_iter *it) {
    return it->shape[it->ndim - 1];
}
/* Element offsets (in elements) of the first element of row `row`. */
static inline void cpu_iter_offsets(const cpu_iter *it, int64_t row,
                                    int64_t *off) {
    for (int k = 0; k < it->nops; k++)
        off[k] = 0;
    for (int d = it->ndim - 2; d >= 0; d--) {
        int64_t i = row % it->shape[d];
        row /= it->shape[d];
        for (int k = 0; k < it->nops; k++)
            off[k] += i * it->st[k][d];
    }
}

/* n elements from src (dtype dt, stride in elements) into f32 dst. */
void cpu_gather_f32(float *dst, const char *src, ts_dtype dt, int64_t stride,
                    int64_t n);
/* n f32 elements into dst (dtype dt, stride in elements). */
void cpu_scatter_f32(char *dst, ts_dtype dt, int64_t stride, const float *src,
                     int64_t n);
/* Copy with conversion over a strided shape. */
void cpu_copy_strided(char *dst, ts_dtype ddt, const int64_t *dst_strides,
                      const char *src, ts_dtype sdt, const int64_t *src_strides,
                      int ndim, const int64_t *shape);

/* t's elements as contiguous f32: t's own memory when it already is, else a
 * converted copy in *tmp (free with free()). NULL on out-of-memory. */
/* Temporaries of kernels: kept per thread and reused (see cpu_backend.c);
 * cpu_tmp_free takes any malloc'd block (or NULL). */
void *cpu_tmp_alloc(size_t bytes);

/* Rows per pool chunk so that each chunk holds at least `work` elements of
 * `inner` each: a loop smaller than two chunks runs on the caller alone. */
static inline int64_t cpu_grain(int64_t inner, int64_t work) {
    return inner >= work ? 1 : (work + inner - 1) / (inner > 0 ? inner : 1);
}
void cpu_tmp_free(void *p);
const float *cpu_as_f32(const ts_tensor *t, float **tmp);
/* Writes f32 values (numel of t) into t (contiguous, any float dtype). */
void cpu_store_out(ts_tensor *t, const float *src);

/* Small dense products on row-major f32 blocks, register-blocked for
 * AVX2/FMA: C[M,N] = (acc ? C : 0) + A[M,K] @ B[K,N]. */
void cpu_gemm_f32(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float *C, int64_t ldc, bool acc);
void cpu_gemm_f32_reference(int64_t M, int64_t N, int64_t K, const float *A,
                            int64_t lda, const float *B, int64_t ldb, float *C,
                            int64_t ldc, bool acc);

/* Attention on contiguous f32 (q (B,H,T,D), k/v (B,KV,S,D), mask NULL or
 * with strides for (B,H,T,S)); out (B,H,T,D), lse (B,H,T). Query t sits
 * at position p = t + S - T; causal: it sees keys s <= p; window > 0: only
 * keys s > p - window; softcap > 0: scores (after scale, before the mask)
 * become softcap tanh(score / softcap). */
typedef struct {
    int64_t B, H, KV, T, S, D;
    bool causal;
    float scale;
    const float *mask;
    int64_t mask_st[4];
    int64_t window;
    float softcap;
} cpu_attn_shape;
void cpu_attention_fwd(const cpu_attn_shape *p, const float *q, const float *k,
                       const float *v, float *out, float *lse);
/* Decoding (few query rows, no mask): per head, scores against the K rows
 * as dot products, softmax, weighted V rows; K and V read in place with
 * head strides (kst, vst: elements between (b, kv-head) blocks of S x D
 * rows; a KV cache's view), so nothing is copied or transposed. */
void cpu_attention_decode(const cpu_attn_shape *p, const float *q,
                          const float *k, int64_t kst_b, int64_t kst_h,
                          const float *v, int64_t vst_b, int64_t vst_h,
                          float *out, float *lse);
/* The slow reference: scores row by row, softmax, weighted sum. */
void cpu_attention_reference(const cpu_attn_shape *p, const float *q,
                             const float *k, const float *v, float *out,
                             float *lse);
void cpu_attention_bwd_reference(const cpu_attn_shape *p, const float *q,
                                 const float *k, const float *v,
                                 const float *dout, float *dq, float *dk,
                                 float *dv);
/* dq, dk, dv are overwritten (no need to zero them). */
void cpu_attention_bwd(const cpu_attn_shape *p, const float *q, const float *k,
                       const float *v, const float *out, const float *lse,
                       const float *dout, float *dq, float *dk, float *dv);

/* Y (R, N) = A (R, K) @ W^T, A f32 rows lda apart, W (N, K) bf16 (bf16
 * true) or f16 rows ldw apart, Y contiguous f32, f32 math: up to 64 rows
 * of bf16 weights read each weight once, widening it in registers, each
 * element summed the same way whatever R (one vector accumulator over K,
 * lanes added in a fixed order; a plain loop without AVX2); f16 weights
 * and more rows widen blocks of W to f32 for the BLAS. false when out of
 * memory. */
bool cpu_gemm_f32_w16t(int64_t R, int64_t N, int64_t K, const float *A,
                       int64_t lda, const uint16_t *W, int64_t ldw, bool bf16,
                       float *Y);
/* rows (nb, K) of 16-bit weights, row r at W + r * ld, widened to f32
 * rows of K in out (bf16 by a shift, f16 by F16C) */
void cpu_widen_rows(const uint16_t *W, int64_t ld, int64_t nb, int64_t K,
                    bool bf16, float *out);

/* b (K, N), a product's bf16 right operand on the host (a weight seen
 * transposed): the packed copy (cpu_bf16_pack_b at isa) its storage keeps
 * for this very view; made now when the storage asks for one (pack_wanted)
 * and holds no other, or when make is set (replacing any other). NULL when
 * there is none: isa below AVX512_BF16, another view's copy, out of memory
 * (the caller multiplies b as it is). cpu_backend.c. */
typedef struct cpu_bf16_packed cpu_bf16_packed;
const cpu_bf16_packed *cpu_packed_operand(ts_tensor *b, cpu_isa isa, bool make);

bool cpu_fusable(int op);
ts_status cpu_run_fused(ts_ctx *ctx, const ts_fused *f);
float cpu_eval_scalar(const ts_node *n, const float *args);
/* A fused group headed by a matmul: the product in row panels, each
 * consumed by the group while in cache. */
ts_status cpu_matmul_epilogue(ts_ctx *ctx, const ts_fused *f);

/* What each ISA level's compile of the kernel files exports (kernels.c):
 * a kernel per op (NULL where the op is a view), the fusion hooks, and the
 * kernels that tests and benchmarks call directly. */
typedef struct {
    cpu_isa isa;
    ts_cpu_kernel kernels[TS_OP_COUNT];
    bool (*fusable)(int op);
    ts_status (*run_fused)(ts_ctx *ctx, const ts_fused *f);
    float (*eval_scalar)(const ts_node *n, const float *args);
    void (*gemm_f32)(int64_t M, int64_t N, int64_t K, const float *A,
                     int64_t lda, const float *B, int64_t ldb, float *C,
                     int64_t ldc, bool acc);
    bool (*gemm_f32_w16t)(int64_t R, int64_t N, int64_t K, const float *A,
                          int64_t lda, const uint16_t *W, int64_t ldw,
                          bool bf16, float *Y);
    void (*attention_fwd)(const cpu_attn_shape *p, const float *q,
                          const float *k, const float *v, float *out,
                          float *lse);
    void (*attention_decode)(const cpu_attn_shape *p, const float *q,
                             const float *k, int64_t kst_b, int64_t kst_h,
                             const float *v, int64_t vst_b, int64_t vst_h,
                             float *out, float *lse);
    void (*attention_bwd)(const cpu_attn_shape *p, const float *q,
                          const float *k, const float *v, const float *out,
                          const float *lse, const float *dout, float *dq,
                          float *dk, float *dv);
} cpu_kernel_set;
#ifdef CPU_ISA_SUFFIX
extern const cpu_kernel_set cpu_kernel_table; /* this compile's level */
#endif
/* The set of a level (NULL above what the machine runs), and the active
 * one (cpu_isa_active(); the functions declared above, called outside the
 * kernel files, go to it). */
const cpu_kernel_set *cpu_kernels_for(cpu_isa isa);
const cpu_kernel_set *cpu_kernels_active(void);

#define CPU_KERNEL(name) ts_status cpu_##name(ts_ctx *ctx, ts_node *n)
CPU_KERNEL(binary);
CPU_KERNEL(index_add);
CPU_KERNEL(unary);
CPU_KERNEL(unary_backward);
CPU_KERNEL(where);
CPU_KERNEL(masked_fill);
CPU_KERNEL(copy);
CPU_KERNEL(reduce);
CPU_KERNEL(argmax);
CPU_KERNEL(softmax);
CPU_KERNEL(matmul);
CPU_KERNEL(embedding);
CPU_KERNEL(embedding_backward);
CPU_KERNEL(concat);
CPU_KERNEL(slice_scatter);
CPU_KERNEL(rmsnorm);
CPU_KERNEL(rmsnorm_backward);
CPU_KERNEL(layernorm);
CPU_KERNEL(layernorm_backward);
CPU_KERNEL(rope);
CPU_KERNEL(attention);
CPU_KERNEL(attention_backward);
CPU_KERNEL(paged_attention);
CPU_KERNEL(cross_entropy);
CPU_KERNEL(cross_entropy_backward);
CPU_KERNEL(copy_into);
CPU_KERNEL(adamw);
CPU_KERNEL(topk);
CPU_KERNEL(gather);
CPU_KERNEL(gather_backward);
CPU_KERNEL(one_hot);
CPU_KERNEL(moe_experts);
CPU_KERNEL(moe_experts_backward);
CPU_KERNEL(conv2d);
CPU_KERNEL(conv2d_backward_input);
CPU_KERNEL(conv2d_backward_weight);
CPU_KERNEL(group_norm);
CPU_KERNEL(group_norm_backward);
CPU_KERNEL(upsample_nearest);
CPU_KERNEL(avg_pool2d);
CPU_KERNEL(avg_pool2d_backward);

#endif
