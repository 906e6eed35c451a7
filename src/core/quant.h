/* quant.h — llama.cpp's (ggml's) quantized block formats: their byte
 * layouts, the reference quantizers (the bytes ggml's quantize_row_*_ref
 * write, which is what llama-quantize writes without an importance matrix),
 * dequantization, the activation formats the integer dot products take
 * (Q8_0 beside q8_0 and q4_0 weights, Q8_K beside the k-quants) and the
 * reference dot products (ggml's vec_dot_<w>_q8_<a>). Portable C at the
 * baseline ISA; the fast kernels (src/backend/cpu/quant_gemm.c) are held
 * against these by tests/test_quant.c. Knows nothing of backends.
 *
 * Element order inside a block (x the block's 32 or 256 values):
 *   q8_0  x[i] = d * qs[i]
 *   q4_0  x[i] = d * ((qs[i] & 15) - 8), x[i + 16] = d * ((qs[i] >> 4) - 8)
 *   q4_K  8 sub-blocks of 32 with 6-bit scales sc and mins m (packed as
 *         ts_get_scale_min_k4 reads them); x = d sc q - dmin m, q the low
 *         nibbles of qs[32 c ..] for sub-block 2c and the high for 2c + 1
 *   q5_K  as q4_K with a fifth bit from qh: bit 2c (2c + 1) of qh[l] is the
 *         high bit of element l of sub-block 2c (2c + 1)
 *   q6_K  16 sub-blocks of 16 with int8 scales; x = d sc (q - 32), q six
 *         bits: four from ql, two from qh (see ts_dequantize_row) */
#ifndef TS_QUANT_H
#define TS_QUANT_H

#include "tessera.h"

#include <stddef.h>
#include <stdint.h>

#define TS_QK8_0 32
#define TS_QK4_0 32
#define TS_QK_K  256

typedef struct {
    uint16_t d; /* f16 */
    int8_t qs[TS_QK8_0];
} ts_block_q8_0;

typedef struct {
    uint16_t d; /* f16 */
    uint8_t qs[TS_QK4_0 / 2];
} ts_block_q4_0;

typedef struct {
    uint16_t d, dmin;   /* f16: scale of the scales, of the mins */
    uint8_t scales[12]; /* 8 six-bit scales and 8 six-bit mins */
    uint8_t qs[TS_QK_K / 2];
} ts_block_q4_K;

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[TS_QK_K / 8];
    uint8_t qs[TS_QK_K / 2];
} ts_block_q5_K;

typedef struct {
    uint8_t ql[TS_QK_K / 2]; /* low four bits */
    uint8_t qh[TS_QK_K / 4]; /* high two bits */
    int8_t scales[TS_QK_K / 16];
    uint16_t d; /* f16 */
} ts_block_q6_K;

/* Activations beside a k-quant: d in f32, 256 int8 values and the sums of
 * each 16 (the k-quants' mins and offsets multiply those). */
typedef struct {
    float d;
    int8_t qs[TS_QK_K];
    int16_t bsums[TS_QK_K / 16];
} ts_block_q8_K;

/* ggml's round to nearest (ties to even) through the f32 adder, valid for
 * |x| <= 4194303 */
static inline int ts_nearest_int(float x) {
    float v = x + 12582912.f;
    int32_t i;
    __builtin_memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* scale and min j (0..7) of a q4_K/q5_K block's 12 packed bytes: 0..3 in
 * the low six bits of bytes j and j + 4, 4..7 in the nibbles of byte j + 4
 * with their top two bits in the top bits of bytes j - 4 and j */
static inline void ts_get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc,
                                       uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* y = the blocks of the k values at x (k a multiple of the block), as
 * ggml's quantize_row_<dt>_ref writes them. dt quantized. */
void ts_quantize_row(ts_dtype dt, const float *x, void *y, int64_t k);
/* y = the k values of the blocks at x; also widens f32/bf16/f16 (and the
 * integer dtypes) element by element. */
void ts_dequantize_row(ts_dtype dt, const void *x, float *y, int64_t k);

/* *out = a new contiguous tensor of dtype dt (quantized) holding src (f32,
 * bf16 or f16, any strides, its last dim whole blocks of dt) row by row;
 * rows quantized in parallel. On the context's current device. */
ts_status ts_quantize_tensor(ts_ctx *ctx, const ts_tensor *src, ts_dtype dt,
                             ts_tensor **out);

/* The activation format beside weights of dtype wdt: Q8_0 for q8_0 and
 * q4_0, Q8_K (no tensor dtype) for the k-quants. ts_act_row_bytes: the
 * bytes of k activations in it (0 when wdt is not quantized or k is not
 * whole blocks). */
size_t ts_act_row_bytes(ts_dtype wdt, int64_t k);
bool ts_act_is_q8_K(ts_dtype wdt);
/* Activations quantized for weights of dtype wdt: Q8_0 (ggml's
 * quantize_row_q8_0_ref) or Q8_K (quantize_row_q8_K_ref). */
void ts_quantize_act_ref(ts_dtype wdt, const float *x, void *y, int64_t k);
void ts_quantize_row_q8_K_ref(const float *x, ts_block_q8_K *y, int64_t k);
void ts_dequantize_row_q8_K(const ts_block_q8_K *x, float *y, int64_t k);

/* The dot product of one weight row (k values of dtype wdt) with one
 * activation row quantized by ts_quantize_act_ref(wdt): per block the
 * integer sum of products, exact, then scaled in f32 and summed over the
 * blocks in order (ggml's vec_dot_*_q8_* semantics). */
float ts_vec_dot_ref(ts_dtype wdt, int64_t k, const void *wrow,
                     const void *act_q);

#endif
