/* quant_gemm.c — the CPU's products with weights in llama.cpp's block
 * formats, per ISA level (quant_gemm.h): activation quantization (Q8_0,
 * Q8_K), the int8 GEMV/GEMM kernels, dequantization of weight rows, and
 * the f32 path for many rows (dequantized blocks of W through OpenBLAS).
 * Compiled at the baseline ISA: every function using more carries a target
 * attribute and is only called at a level that has it. The reference the
 * kernels are held against is src/core/quant.c (tests/test_quant.c).
 *
 * Integer kernels, per weight row and up to 8 activation rows at once (a
 * block's weights unpacked once, then dotted with every row):
 *   SSE2         the reference dot (ts_vec_dot_ref)
 *   AVX2         256-bit maddubs (u8 x s8 -> s16 pairs) then madd (-> s32,
 *                times a sub-block scale for the k-quants)
 *   AVX512       the same at 512 bits (two q8_0/q4_0 blocks a vector)
 *   AVX512_BF16  and AMX: 512 bits with VNNI: vpdpbusd (u8 x s8 summed into
 *                s32) for q8_0/q4_0, maddubs then vpdpwssd (s16 x scale
 *                summed into s32) for the k-quants
 * q8_0's signed weights go through |w| and the activation with w's sign;
 * the unsigned levels of the others go in as they are, their offsets (8
 * for q4_0, 32 for q6_K) and mins (q4_K, q5_K) through the activations'
 * sums, computed once per call.
 * Every sum of products is exact in int32; the f32 part (a block's scales,
 * the sum over blocks) is where results may differ from the reference, by
 * rounding only.
 *
 * No FMA contraction in this file: dequantization must give the
 * reference's bits (d * q - m rounded twice); the kernels ask for fused
 * multiply-adds explicitly where they want them. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include "backend/cpu/quant_gemm.h"
#include "backend/cpu/gemm_bf16.h"
#include "core/core.h"
#include "core/quant.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define TGT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TGT_AVX512                                                             \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,"       \
                          "f16c")))
#define TGT_VNNI                                                               \
    __attribute__((target(                                                     \
        "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* the activation rows as the kernels read them, unpacked from the Q8_0 or
 * Q8_K blocks once per call: row r's int8 values contiguous at
 * qs + r * qs_stride, its per-block scales at d + r * nb, and for the
 * k-quants its sums of 16 (bsums + r * nb * 16, in block order) and, for
 * q4_K/q5_K, d times the sum of each 32 (bsd + r * nb * 8, the mins'
 * partners). d8: each block's d eight times (the 512-bit q8_0/q4_0
 * kernels' two-block scale vectors). c8, beside q4_0: -8 times the sum of
 * each 4 values (8 int32 a block, the int32 lanes of a u8 x s8 dot), so
 * that the unsigned nibbles' products plus c8 are the products of q - 8. */
typedef struct {
    const int8_t *qs;
    int64_t qs_stride, nb;
    const float *d, *d8, *bsd;
    const int16_t *bsums;
    const int32_t *c8;
} act_rows;

/* ---- activation quantization ---- */

size_t cpu_act_bytes(ts_dtype wdt, int64_t k) {
    return ts_act_row_bytes(wdt, k);
}

TGT_AVX2 static float hmax8(__m256 v) {
    __m128 m =
        _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

TGT_AVX2 static float hsum8(__m256 v) {
    __m128 s =
        _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* four vectors of 8 int32 (-128..127) to 32 int8 in order */
TGT_AVX2 static __m256i pack32_i8(__m256i q0, __m256i q1, __m256i q2,
                                  __m256i q3) {
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1),
                                   _mm256_packs_epi32(q2, q3));
    return _mm256_permutevar8x32_epi32(
        p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* C's roundf (halves away from zero), exactly: truncate, then step away
 * from zero when the dropped fraction is at least a half */
TGT_AVX2 static __m256 roundf8(__m256 t) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(t, r));
    __m256 step = _mm256_or_ps(_mm256_and_ps(t, sign), _mm256_set1_ps(1.0f));
    __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    return _mm256_add_ps(r, _mm256_and_ps(up, step));
}

/* quantize_row_q8_0_ref's bytes */
TGT_AVX2 static void quantize_q8_0_avx2(const float *x, ts_block_q8_0 *y,
                                        int64_t nb) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < nb; i++, x += 32) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
        }
        const float d = hmax8(m) / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = ts_f32_to_f16(d);
        __m256i q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvttps_epi32(
                roundf8(_mm256_mul_ps(v[j], _mm256_set1_ps(id))));
        _mm256_storeu_si256((__m256i *)y[i].qs,
                            pack32_i8(q[0], q[1], q[2], q[3]));
    }
}

/* quantize_row_q8_K_ref's bytes: the scale from the first value of
 * largest magnitude (its sign matters), values rounded to nearest even
 * (cvtps under the default MXCSR, as nearest_int) */
TGT_AVX2 static void quantize_q8_K_avx2(const float *x, ts_block_q8_K *y,
                                        int64_t nb) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < nb; i++, x += TS_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < TS_QK_K; j += 8)
            m = _mm256_max_ps(m,
                              _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        const float amax = hmax8(m);
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float max = 0;
        const __m256 va = _mm256_set1_ps(amax);
        for (int j = 0; j < TS_QK_K; j += 8) {
            __m256 ax = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j));
            int mask = _mm256_movemask_ps(_mm256_cmp_ps(ax, va, _CMP_EQ_OQ));
            if (mask) {
                max = x[j + __builtin_ctz((unsigned)mask)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i top = _mm256_set1_epi32(127);
        for (int j = 0; j < TS_QK_K; j += 32) {
            __m256i q[4];
            for (int u = 0; u < 4; u++)
                q[u] = _mm256_min_epi32(
                    top, _mm256_cvtps_epi32(_mm256_mul_ps(
                             _mm256_loadu_ps(x + j + 8 * u), vs)));
            _mm256_storeu_si256((__m256i *)(y[i].qs + j),
                                pack32_i8(q[0], q[1], q[2], q[3]));
        }
        for (int j = 0; j < TS_QK_K / 16; j++) {
            __m256i w = _mm256_cvtepi8_epi16(
                _mm_loadu_si128((const __m128i *)(y[i].qs + 16 * j)));
            __m256i s = _mm256_madd_epi16(w, _mm256_set1_epi16(1));
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s),
                                      _mm256_extracti128_si256(s, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
            y[i].bsums[j] = (int16_t)_mm_cvtsi128_si32(h);
        }
        y[i].d = 1 / iscale;
    }
}

void cpu_quantize_act(cpu_isa isa, ts_dtype wdt, const float *x, int64_t k,
                      void *out) {
    if (isa < CPU_ISA_AVX2) {
        ts_quantize_act_ref(wdt, x, out, k);
        return;
    }
    if (ts_act_is_q8_K(wdt))
        quantize_q8_K_avx2(x, out, k / TS_QK_K);
    else
        quantize_q8_0_avx2(x, out, k / TS_QK8_0);
}

/* ---- dequantization: ts_dequantize_row's operations, 8 lanes at once ---- */

/* 8 bytes to 8 floats */
TGT_AVX2 static __m256 u8x8_ps(const uint8_t *p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

TGT_AVX2 static void dequant_q8_0_avx2(const ts_block_q8_0 *x, float *y,
                                       int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[i].d));
        for (int j = 0; j < 32; j += 8)
            _mm256_storeu_ps(
                y + j, _mm256_mul_ps(_mm256_cvtepi32_ps(
                                         _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                             (const __m128i *)(x[i].qs + j)))),
                                     d));
    }
}

TGT_AVX2 static void dequant_q4_0_avx2(const ts_block_q4_0 *x, float *y,
                                       int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[i].d));
        __m128i q = _mm_loadu_si128((const __m128i *)x[i].qs);
        __m128i m4 = _mm_set1_epi8(0xF), eight = _mm_set1_epi8(8);
        __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m4), eight);
        __m128i hi =
            _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), eight);
        for (int j = 0; j < 2; j++) {
            __m128i l = j ? _mm_srli_si128(lo, 8) : lo;
            __m128i h = j ? _mm_srli_si128(hi, 8) : hi;
            _mm256_storeu_ps(
                y + 8 * j,
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(l)), d));
            _mm256_storeu_ps(
                y + 16 + 8 * j,
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h)), d));
        }
    }
}

/* y[0..32) = d1 * q - m1 for 32 levels already in bytes */
TGT_AVX2 static void dequant32_levels(const uint8_t *lv, float d1, float m1,
                                      float *y) {
    const __m256 vd = _mm256_set1_ps(d1), vm = _mm256_set1_ps(m1);
    for (int j = 0; j < 32; j += 8)
        _mm256_storeu_ps(y + j,
                         _mm256_sub_ps(_mm256_mul_ps(vd, u8x8_ps(lv + j)), vm));
}

TGT_AVX2 static void dequant_q45_K_avx2(const uint8_t *x, size_t stride,
                                        bool five, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += stride) {
        const ts_block_q4_K *b4 = (const ts_block_q4_K *)x;
        const ts_block_q5_K *b5 = (const ts_block_q5_K *)x;
        const uint8_t *scales = five ? b5->scales : b4->scales;
        const uint8_t *q = five ? b5->qs : b4->qs;
        const float d = _cvtsh_ss(five ? b5->d : b4->d);
        const float min = _cvtsh_ss(five ? b5->dmin : b4->dmin);
        __m256i qh = five ? _mm256_loadu_si256((const __m256i *)b5->qh)
                          : _mm256_setzero_si256();
        const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            __m256i v = _mm256_loadu_si256((const __m256i *)q);
            __m256i lo = _mm256_and_si256(v, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (five) {
                __m256i h0 = _mm256_and_si256(
                    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one);
                __m256i h1 = _mm256_and_si256(
                    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
            }
            uint8_t lv[64], sc, m;
            _mm256_storeu_si256((__m256i *)lv, lo);
            _mm256_storeu_si256((__m256i *)(lv + 32), hi);
            ts_get_scale_min_k4(2 * c, scales, &sc, &m);
            dequant32_levels(lv, d * sc, min * m, y);
            ts_get_scale_min_k4(2 * c + 1, scales, &sc, &m);
            dequant32_levels(lv + 32, d * sc, min * m, y + 32);
        }
    }
}

TGT_AVX2 static void dequant_q6_K_avx2(const ts_block_q6_K *x, float *y,
                                       int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    for (int64_t i = 0; i < nb; i++) {
        const float d = _cvtsh_ss(x[i].d);
        for (int h = 0; h < 2; h++, y += 128) {
            __m256i l0 =
                _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            __m256i l1 =
                _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            __m256i qh =
                _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(
                _mm256_and_si256(l0, m4),
                _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[1] = _mm256_or_si256(
                _mm256_and_si256(l1, m4),
                _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[2] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int s = 0; s < 4; s++) {
                int8_t lv[32];
                _mm256_storeu_si256(
                    (__m256i *)lv, _mm256_sub_epi8(q[s], _mm256_set1_epi8(32)));
                for (int g = 0; g < 2; g++) {
                    const __m256 ds =
                        _mm256_set1_ps(d * x[i].scales[8 * h + 2 * s + g]);
                    for (int j = 0; j < 16; j += 8)
                        _mm256_storeu_ps(
                            y + 32 * s + 16 * g + j,
                            _mm256_mul_ps(
                                ds,
                                _mm256_cvtepi32_ps(
                                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                        (const __m128i *)(lv + 16 * g + j))))));
                }
            }
        }
    }
}

static void dequant_row(cpu_isa isa, ts_dtype wdt, const void *w, float *y,
                        int64_t K) {
    if (isa < CPU_ISA_AVX2) {
        ts_dequantize_row(wdt, w, y, K);
        return;
    }
    int64_t nb = K / ts_dtype_block_elems(wdt);
    switch (wdt) {
    case TS_Q8_0:
        dequant_q8_0_avx2(w, y, nb);
        break;
    case TS_Q4_0:
        dequant_q4_0_avx2(w, y, nb);
        break;
    case TS_Q4_K:
        dequant_q45_K_avx2(w, sizeof(ts_block_q4_K), false, y, nb);
        break;
    case TS_Q5_K:
        dequant_q45_K_avx2(w, sizeof(ts_block_q5_K), true, y, nb);
        break;
    case TS_Q6_K:
        dequant_q6_K_avx2(w, y, nb);
        break;
    default:
        ts_dequantize_row(wdt, w, y, K);
        break;
    }
}

typedef struct {
    cpu_isa isa;
    ts_dtype wdt;
    const char *W;
    int64_t wrb, K;
    float *out;
} dequant_job;

static void dequant_range(void *p, int64_t r0, int64_t r1) {
    const dequant_job *j = p;
    for (int64_t r = r0; r < r1; r++)
        dequant_row(j->isa, j->wdt, j->W + r * j->wrb, j->out + r * j->K, j->K);
}

void cpu_dequant_rows(cpu_isa isa, ts_dtype wdt, const void *W,
                      int64_t w_row_bytes, int64_t nrows, int64_t K,
                      float *out) {
    dequant_job j = {isa, wdt, W, w_row_bytes, K, out};
    int64_t grain = K >= 32768 ? 1 : (32768 + K - 1) / (K > 0 ? K : 1);
    ts_parallel_for(nrows, grain, dequant_range, &j);
}

/* ---- AVX2 kernels: one weight row, R <= 8 activation rows ---- */

/* q4_K/q5_K's packed six-bit scales and mins: bytes 0..7 of out the
 * scales, 8..15 the mins (ggml's kmask unpacking) */
static inline void unpack_k4_scales(const uint8_t *s12, uint32_t out[4]) {
    uint32_t u[3];
    memcpy(u, s12, 12);
    out[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    out[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    out[2] = u[1] & 0x3f3f3f3fu;
    out[0] = u[0] & 0x3f3f3f3fu;
}

/* q8_0: the signed weights as |w| times a with w's sign */
INLINE TGT_AVX2 void q8_0_avx2(const int R, int64_t nb, const uint8_t *w,
                               const act_rows *a, int64_t r0, float *y,
                               int64_t ldy) {
    __m256 acc[8];
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++, w += sizeof(ts_block_q8_0)) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + 2));
        uint16_t dh;
        memcpy(&dh, w, 2);
        const float dw = _cvtsh_ss(dh);
        const __m256i aw = _mm256_sign_epi8(wv, wv);
        for (int r = 0; r < R; r++) {
            const int8_t *qa = a->qs + (r0 + r) * a->qs_stride + 32 * b;
            __m256i sa =
                _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)qa), wv);
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sa), ones);
            acc[r] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(p),
                _mm256_set1_ps(dw * a->d[(r0 + r) * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++)
        y[r * ldy] = hsum8(acc[r]);
}

/* q4_0: the nibbles unsigned (low ones the block's first 16 values, high
 * the next), the offset 8 through the activations' c8 */
INLINE TGT_AVX2 void q4_0_avx2(const int R, int64_t nb, const uint8_t *w,
                               const act_rows *a, int64_t r0, float *y,
                               int64_t ldy) {
    __m256 acc[8];
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0xF);
    for (int64_t b = 0; b < nb; b++, w += sizeof(ts_block_q4_0)) {
        const __m128i q = _mm_loadu_si128((const __m128i *)(w + 2));
        const __m256i u =
            _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
        uint16_t dh;
        memcpy(&dh, w, 2);
        const float dw = _cvtsh_ss(dh);
        for (int r = 0; r < R; r++) {
            const int64_t rb = (r0 + r) * nb + b;
            const int8_t *qa = a->qs + (r0 + r) * a->qs_stride + 32 * b;
            __m256i p = _mm256_madd_epi16(
                _mm256_maddubs_epi16(u,
                                     _mm256_loadu_si256((const __m256i *)qa)),
                ones);
            p = _mm256_add_epi32(
                p, _mm256_loadu_si256((const __m256i *)(a->c8 + 8 * rb)));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                     _mm256_set1_ps(dw * a->d[rb]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++)
        y[r * ldy] = hsum8(acc[r]);
}

/* q4_K and q5_K: 4 x 64 values a block; low nibbles the even sub-block,
 * high the odd one (plus qh's bits for q5_K); sums of maddubs scaled by
 * each sub-block's six-bit scale; mins through d * (sums of 32) */
INLINE TGT_AVX2 void q45_K_avx2(const int R, int64_t nb, const uint8_t *w,
                                const act_rows *a, int64_t r0, float *y,
                                int64_t ldy, bool five) {
    __m256 acc[8], accm[8];
    for (int r = 0; r < R; r++)
        acc[r] = accm[r] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    const size_t bs = five ? sizeof(ts_block_q5_K) : sizeof(ts_block_q4_K);
    for (int64_t b = 0; b < nb; b++, w += bs) {
        const ts_block_q4_K *b4 = (const ts_block_q4_K *)w;
        const ts_block_q5_K *b5 = (const ts_block_q5_K *)w;
        uint32_t u[4];
        unpack_k4_scales(five ? b5->scales : b4->scales, u);
        const __m256i sm =
            _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)u));
        const __m256i sc = _mm256_permute2x128_si256(sm, sm, 0x00);
        const __m256 wmin =
            _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(five ? b5->dmin : b4->dmin)),
                          u8x8_ps((const uint8_t *)(u + 2)));
        const float dw = _cvtsh_ss(five ? b5->d : b4->d);
        const uint8_t *qs = five ? b5->qs : b4->qs;
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)b5->qh)
                                : _mm256_setzero_si256();
        __m256i isum[8];
        for (int r = 0; r < R; r++)
            isum[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(v, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (five) {
                __m256i h0 = _mm256_and_si256(
                    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one);
                __m256i h1 = _mm256_and_si256(
                    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
            }
            /* int16 scale 2c, 2c + 1 in every lane */
            const __m256i slo = _mm256_shuffle_epi8(
                sc, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * c))));
            const __m256i shi = _mm256_shuffle_epi8(
                sc, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * c + 1))));
            for (int r = 0; r < R; r++) {
                const int8_t *qa =
                    a->qs + (r0 + r) * a->qs_stride + TS_QK_K * b + 64 * c;
                __m256i p0 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(
                        lo, _mm256_loadu_si256((const __m256i *)qa)),
                    slo);
                __m256i p1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(
                        hi, _mm256_loadu_si256((const __m256i *)(qa + 32))),
                    shi);
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(p0, p1));
            }
        }
        for (int r = 0; r < R; r++) {
            int64_t rb = (r0 + r) * nb + b;
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]),
                                     _mm256_set1_ps(dw * a->d[rb]), acc[r]);
            accm[r] = _mm256_fmadd_ps(wmin, _mm256_loadu_ps(a->bsd + 8 * rb),
                                      accm[r]);
        }
    }
    for (int r = 0; r < R; r++)
        y[r * ldy] = hsum8(_mm256_sub_ps(acc[r], accm[r]));
}

/* q6_K: 2 x 128 values a block, six-bit levels 0..63 from ql and qh; the
 * offset 32 as -32 sc . bsums */
INLINE TGT_AVX2 void q6_K_avx2(const int R, int64_t nb, const uint8_t *w,
                               const act_rows *a, int64_t r0, float *y,
                               int64_t ldy) {
    __m256 acc[8];
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    for (int64_t b = 0; b < nb; b++, w += sizeof(ts_block_q6_K)) {
        const ts_block_q6_K *x = (const ts_block_q6_K *)w;
        const float dw = _cvtsh_ss(x->d);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
        const __m256i negsc32 = _mm256_slli_epi16(
            _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_cvtepi8_epi16(sc8)),
            5);
        __m256i isum[8];
        for (int r = 0; r < R; r++)
            isum[r] = _mm256_madd_epi16(
                _mm256_loadu_si256(
                    (const __m256i *)(a->bsums + ((r0 + r) * nb + b) * 16)),
                negsc32);
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
            __m256i l1 =
                _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(
                _mm256_and_si256(l0, m4),
                _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[1] = _mm256_or_si256(
                _mm256_and_si256(l1, m4),
                _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[2] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int s = 0; s < 4; s++) {
                /* sub-blocks g, g + 1 of 16: their scales in the low and
                 * high 128 bits */
                const int g = 8 * h + 2 * s;
                const __m256i scv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                    sc8, _mm_set_epi64x(0x0101010101010101ll * (g + 1),
                                        0x0101010101010101ll * g)));
                for (int r = 0; r < R; r++) {
                    const int8_t *qa = a->qs + (r0 + r) * a->qs_stride +
                                       TS_QK_K * b + 128 * h + 32 * s;
                    __m256i p = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(
                            q[s], _mm256_loadu_si256((const __m256i *)qa)),
                        scv);
                    isum[r] = _mm256_add_epi32(isum[r], p);
                }
            }
        }
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(isum[r]),
                _mm256_set1_ps(dw * a->d[(r0 + r) * nb + b]), acc[r]);
    }
    for (int r = 0; r < R; r++)
        y[r * ldy] = hsum8(acc[r]);
}

/* one weight row against R (1..8) activation rows from r0: y[r * ldy] */
typedef void (*wq_kernel)(int R, int64_t nb, const uint8_t *w,
                          const act_rows *a, int64_t r0, float *y, int64_t ldy);

/* R as a constant in each case, so the accumulators stay in registers */
#define WQ_ROWS_SWITCH(call)                                                   \
    switch (R) {                                                               \
    case 1:                                                                    \
        call(1);                                                               \
        break;                                                                 \
    case 2:                                                                    \
        call(2);                                                               \
        break;                                                                 \
    case 3:                                                                    \
        call(3);                                                               \
        break;                                                                 \
    case 4:                                                                    \
        call(4);                                                               \
        break;                                                                 \
    case 5:                                                                    \
        call(5);                                                               \
        break;                                                                 \
    case 6:                                                                    \
        call(6);                                                               \
        break;                                                                 \
    case 7:                                                                    \
        call(7);                                                               \
        break;                                                                 \
    default:                                                                   \
        call(8);                                                               \
        break;                                                                 \
    }

TGT_AVX2 static void k_q8_0_avx2(int R, int64_t nb, const uint8_t *w,
                                 const act_rows *a, int64_t r0, float *y,
                                 int64_t ldy){
#define CALL(n) q8_0_avx2(n, nb, w, a, r0, y, ldy)
    WQ_ROWS_SWITCH(CALL)
#undef CALL
}

TGT_AVX2 static void k_q4_0_avx2(int R, int64_t nb, const uint8_t *w,
                                 const act_rows *a, int64_t r0, float *y,
                                 int64_t ldy){
#define CALL(n) q4_0_avx2(n, nb, w, a, r0, y, ldy)
    WQ_ROWS_SWITCH(CALL)
#undef CALL
}

TGT_AVX2 static void k_q4_K_avx2(int R, int64_t nb, const uint8_t *w,
                                 const act_rows *a, int64_t r0, float *y,
                                 int64_t ldy){
#define CALL(n) q45_K_avx2(n, nb, w, a, r0, y, ldy, false)
    WQ_ROWS_SWITCH(CALL)
#undef CALL
}

TGT_AVX2 static void k_q5_K_avx2(int R, int64_t nb, const uint8_t *w,
                                 const act_rows *a, int64_t r0, float *y,
                                 int64_t ldy){
#define CALL(n) q45_K_avx2(n, nb, w, a, r0, y, ldy, true)
    WQ_ROWS_SWITCH(CALL)
#undef CALL
}

TGT_AVX2 static void k_q6_K_avx2(int R, int64_t nb, const uint8_t *w,
                                 const act_rows *a, int64_t r0, float *y,
                                 int64_t ldy) {
#define CALL(n) q6_K_avx2(n, nb, w, a, r0, y, ldy)
    WQ_ROWS_SWITCH(CALL)
#undef CALL
}

/* ---- AVX-512 kernels, with and without VNNI (quant_gemm_avx512.inc) ---- */

#define QG_SUFFIX(name) name##_avx512
#define QG_TARGET       TGT_AVX512
#define QG_VNNI         0
#include "backend/cpu/quant_gemm_avx512.inc"
#undef QG_SUFFIX
#undef QG_TARGET
#undef QG_VNNI

#define QG_SUFFIX(name) name##_vnni
#define QG_TARGET       TGT_VNNI
#define QG_VNNI         1
#include "backend/cpu/quant_gemm_avx512.inc"
#undef QG_SUFFIX
#undef QG_TARGET
#undef QG_VNNI

/* ---- dispatch ---- */

static int fmt_index(ts_dtype wdt) {
    switch (wdt) {
    case TS_Q8_0:
        return 0;
    case TS_Q4_0:
        return 1;
    case TS_Q4_K:
        return 2;
    case TS_Q5_K:
        return 3;
    case TS_Q6_K:
        return 4;
    default:
        return -1;
    }
}

static const wq_kernel kernels_avx2[5] = {k_q8_0_avx2, k_q4_0_avx2, k_q4_K_avx2,
                                          k_q5_K_avx2, k_q6_K_avx2};
static const wq_kernel kernels_avx512[5] = {
    k_q8_0_avx512, k_q4_0_avx512, k_q4_K_avx512, k_q5_K_avx512, k_q6_K_avx512};
static const wq_kernel kernels_vnni[5] = {k_q8_0_vnni, k_q4_0_vnni, k_q4_K_vnni,
                                          k_q5_K_vnni, k_q6_K_vnni};

static wq_kernel kernel_for(cpu_isa isa, ts_dtype wdt) {
    int f = fmt_index(wdt);
    if (f < 0 || isa < CPU_ISA_AVX2)
        return NULL;
    if (isa >= CPU_ISA_AVX512_BF16)
        return kernels_vnni[f];
    if (isa >= CPU_ISA_AVX512)
        return kernels_avx512[f];
    return kernels_avx2[f];
}

/* ---- the int8 path ---- */

typedef struct {
    cpu_isa isa;
    ts_dtype wdt;
    int64_t R, N, K;
    const float *A;
    int64_t lda;
    const uint8_t *W;
    int64_t wrb;
    float *Y;
    uint8_t *actq; /* R rows of cpu_act_bytes: the Q8_0/Q8_K blocks */
    size_t act_bytes;
    act_rows a;
    wq_kernel kern; /* NULL: the reference dot (SSE2) */
} wq_job;

/* activation rows [r0, r1): quantized, then unpacked into act_rows */
static void act_range(void *p, int64_t r0, int64_t r1) {
    wq_job *j = p;
    const int64_t nb = j->a.nb, K = j->K;
    const bool k8 = ts_act_is_q8_K(j->wdt);
    for (int64_t r = r0; r < r1; r++) {
        uint8_t *q = j->actq + (size_t)r * j->act_bytes;
        cpu_quantize_act(j->isa, j->wdt, j->A + r * j->lda, K, q);
        int8_t *qs = (int8_t *)j->a.qs + r * j->a.qs_stride;
        float *d = (float *)j->a.d + r * nb;
        if (!k8) {
            const ts_block_q8_0 *x = (const ts_block_q8_0 *)q;
            float *d8 = (float *)j->a.d8 + r * nb * 8;
            int32_t *c8 = (int32_t *)j->a.c8 + r * nb * 8;
            for (int64_t b = 0; b < nb; b++) {
                memcpy(qs + 32 * b, x[b].qs, 32);
                d[b] = ts_f16_to_f32(x[b].d);
                for (int l = 0; l < 8; l++) {
                    d8[8 * b + l] = d[b];
                    c8[8 * b + l] =
                        -8 * (x[b].qs[4 * l] + x[b].qs[4 * l + 1] +
                              x[b].qs[4 * l + 2] + x[b].qs[4 * l + 3]);
                }
            }
            continue;
        }
        const ts_block_q8_K *x = (const ts_block_q8_K *)q;
        int16_t *bs = (int16_t *)j->a.bsums + r * nb * 16;
        float *bsd = (float *)j->a.bsd + r * nb * 8;
        for (int64_t b = 0; b < nb; b++) {
            memcpy(qs + TS_QK_K * b, x[b].qs, TS_QK_K);
            memcpy(bs + 16 * b, x[b].bsums, sizeof x[b].bsums);
            d[b] = x[b].d;
            for (int l = 0; l < 8; l++)
                bsd[8 * b + l] =
                    x[b].d * (float)(x[b].bsums[2 * l] + x[b].bsums[2 * l + 1]);
        }
    }
}

/* weight rows [n0, n1) against all R rows: weight rows in groups of 16
 * (in L1 across the row tiles), activation rows in tiles of 8 */
static void wq_range(void *p, int64_t n0, int64_t n1) {
    const wq_job *j = p;
    const int64_t R = j->R, N = j->N, nb = j->a.nb;
    for (int64_t g0 = n0; g0 < n1; g0 += 16) {
        int64_t g1 = g0 + 16 < n1 ? g0 + 16 : n1;
        for (int64_t r0 = 0; r0 < R; r0 += 8) {
            int rows = (int)(R - r0 < 8 ? R - r0 : 8);
            for (int64_t n = g0; n < g1; n++) {
                const uint8_t *w = j->W + n * j->wrb;
                float *y = j->Y + r0 * N + n;
                if (j->kern) {
                    j->kern(rows, nb, w, &j->a, r0, y, N);
                    continue;
                }
                for (int r = 0; r < rows; r++)
                    y[r * N] = ts_vec_dot_ref(j->wdt, j->K, w,
                                              j->actq + (size_t)(r0 + r) *
                                                            j->act_bytes);
            }
        }
    }
}

bool cpu_gemm_wq_int8(cpu_isa isa, int64_t R, int64_t N, int64_t K,
                      const float *A, int64_t lda, const void *W,
                      int64_t w_row_bytes, ts_dtype wdt, float *Y) {
    if (R <= 0 || N <= 0)
        return true;
    const int64_t nb = K / ts_dtype_block_elems(wdt);
    const size_t act_bytes = cpu_act_bytes(wdt, K);
    /* one allocation: the blocks, then the unpacked rows (qs 64-aligned) */
    const int64_t qs_stride = (K + 63) / 64 * 64;
    size_t off_q = (size_t)R * act_bytes;
    size_t off_qs = (off_q + 63) / 64 * 64;
    size_t off_d = off_qs + (size_t)(R * qs_stride);
    size_t off_d8 = off_d + sizeof(float) * (size_t)(R * nb);
    size_t off_bsd = off_d8 + sizeof(float) * (size_t)(R * nb * 8);
    size_t off_bs = off_bsd + sizeof(float) * (size_t)(R * nb * 8);
    size_t off_c8 = off_bs + sizeof(int16_t) * (size_t)(R * nb * 16);
    size_t total = off_c8 + sizeof(int32_t) * (size_t)(R * nb * 8);
    uint8_t *scratch = aligned_alloc(64, (total + 63) / 64 * 64);
    if (!scratch)
        return false;
    wq_job j = {.isa = isa,
                .wdt = wdt,
                .R = R,
                .N = N,
                .K = K,
                .A = A,
                .lda = lda,
                .W = W,
                .wrb = w_row_bytes,
                .Y = Y,
                .actq = scratch,
                .act_bytes = act_bytes,
                .a = {.qs = (const int8_t *)(scratch + off_qs),
                      .qs_stride = qs_stride,
                      .nb = nb,
                      .d = (const float *)(scratch + off_d),
                      .d8 = (const float *)(scratch + off_d8),
                      .bsd = (const float *)(scratch + off_bsd),
                      .bsums = (const int16_t *)(scratch + off_bs),
                      .c8 = (const int32_t *)(scratch + off_c8)},
                .kern = kernel_for(isa, wdt)};
    int64_t agrain = K >= 16384 ? 1 : (16384 + K - 1) / (K > 0 ? K : 1);
    ts_parallel_for(R, agrain, act_range, &j);
    /* ~64K weights a chunk */
    int64_t grain = K >= 65536 ? 1 : (65536 + K - 1) / (K > 0 ? K : 1);
    ts_parallel_for(N, grain, wq_range, &j);
    free(scratch);
    return true;
}

/* ---- the f32 path: blocks of W dequantized, then OpenBLAS ---- */

/* blocks of W dequantized to f32, then OpenBLAS's sgemm, or (bf16) the
 * bf16 GEMM */
static bool gemm_dequantized(cpu_isa isa, int64_t R, int64_t N, int64_t K,
                             const float *A, int64_t lda, const void *W,
                             int64_t w_row_bytes, ts_dtype wdt, float *Y,
                             bool bf16) {
    if (R <= 0 || N <= 0)
        return true;
    /* ~2 MiB of f32 weights a block: widened, then read by the sgemm while
     * still in cache */
    int64_t NB = ((int64_t)1 << 19) / (K > 0 ? K : 1);
    NB = NB < 64 ? 64 : NB > N ? N : NB;
    float *wf = malloc(sizeof(float) * (size_t)(NB * K));
    if (!wf)
        return false;
    for (int64_t n0 = 0; n0 < N; n0 += NB) {
        int64_t nb = N - n0 < NB ? N - n0 : NB;
        cpu_dequant_rows(isa, wdt, (const char *)W + n0 * w_row_bytes,
                         w_row_bytes, nb, K, wf);
        /* bf16: the bf16 GEMM (both operands rounded as it packs) */
        if (!bf16 || !cpu_gemm_bf16(isa, R, nb, K, A, TS_F32, lda, 1, wf,
                                    TS_F32, 1, K, Y + n0, N, false))
            ts_sgemm(false, true, (int)R, (int)nb, (int)K, 1.0f, A, (int)lda,
                     wf, (int)K, 0.0f, Y + n0, (int)N);
    }
    free(wf);
    return true;
}

bool cpu_gemm_wq_f32(cpu_isa isa, int64_t R, int64_t N, int64_t K,
                     const float *A, int64_t lda, const void *W,
                     int64_t w_row_bytes, ts_dtype wdt, float *Y) {
    return gemm_dequantized(isa, R, N, K, A, lda, W, w_row_bytes, wdt, Y,
                            false);
}

bool cpu_gemm_wq_bf16(cpu_isa isa, int64_t R, int64_t N, int64_t K,
                      const float *A, int64_t lda, const void *W,
                      int64_t w_row_bytes, ts_dtype wdt, float *Y) {
    return gemm_dequantized(isa, R, N, K, A, lda, W, w_row_bytes, wdt, Y, true);
}

bool cpu_gemm_wq_uses_bf16(cpu_isa isa, ts_dtype wdt, int64_t R) {
    return isa >= CPU_ISA_AVX512_BF16 && (wdt == TS_Q8_0 || wdt == TS_Q4_0) &&
           R > CPU_WQ_BLOCK32_MAX_ROWS;
}

bool cpu_gemm_wq_uses_f32(cpu_isa isa, ts_dtype wdt, int64_t R) {
    if (isa < CPU_ISA_AVX2)
        return R > CPU_WQ_SCALAR_MAX_ROWS;
    if (cpu_gemm_wq_uses_bf16(isa, wdt, R))
        return false;
    return (wdt == TS_Q8_0 || wdt == TS_Q4_0) && R > CPU_WQ_BLOCK32_MAX_ROWS;
}

bool cpu_gemm_wq(cpu_isa isa, int64_t R, int64_t N, int64_t K, const float *A,
                 int64_t lda, const void *W, int64_t w_row_bytes, ts_dtype wdt,
                 float *Y) {
    if (cpu_gemm_wq_uses_bf16(isa, wdt, R))
        return cpu_gemm_wq_bf16(isa, R, N, K, A, lda, W, w_row_bytes, wdt, Y);
    if (cpu_gemm_wq_uses_f32(isa, wdt, R))
        return cpu_gemm_wq_f32(isa, R, N, K, A, lda, W, w_row_bytes, wdt, Y);
    return cpu_gemm_wq_int8(isa, R, N, K, A, lda, W, w_row_bytes, wdt, Y);
}
