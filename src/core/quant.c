/* quant.c — the reference side of the quantized block formats (quant.h):
 * ggml's reference quantizers transcribed step for step (the same f32
 * operations in the same order, so the bytes match llama.cpp's), the
 * dequantizers, the Q8_0/Q8_K activation quantizers, the reference dot
 * products, and ts_quantize_tensor. Scalar C for the baseline ISA; owns no
 * fast kernel (src/backend/cpu/quant_gemm.c has them).
 *
 * No FMA contraction here: ggml's reference (built without -m flags in
 * ggml-base) rounds every product and sum on its own, and a fused a*b+c
 * would change a scale's last bit and then the bytes. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include "core/quant.h"
#include "core/core.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(ts_block_q8_0) == 34, "block_q8_0 is 34 bytes");
_Static_assert(sizeof(ts_block_q4_0) == 18, "block_q4_0 is 18 bytes");
_Static_assert(sizeof(ts_block_q4_K) == 144, "block_q4_K is 144 bytes");
_Static_assert(sizeof(ts_block_q5_K) == 176, "block_q5_K is 176 bytes");
_Static_assert(sizeof(ts_block_q6_K) == 210, "block_q6_K is 210 bytes");
_Static_assert(sizeof(ts_block_q8_K) == 292, "block_q8_K is 292 bytes");

#define GROUP_MAX_EPS 1e-15f

static inline int imin(int a, int b) {
    return a < b ? a : b;
}
static inline int imax(int a, int b) {
    return a > b ? a : b;
}

/* ---- block 32 formats (x: 32 values a block) ---- */

static void quantize_q8_0(const float *x, ts_block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += TS_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < TS_QK8_0; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = ts_f32_to_f16(d);
        for (int j = 0; j < TS_QK8_0; j++)
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* d = the signed value of largest magnitude / -8, so that value maps to
 * -8 exactly and the others to -8..7 (q = x / d + 8.5, truncated) */
static void quantize_q4_0(const float *x, ts_block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += TS_QK4_0) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < TS_QK4_0; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = ts_f32_to_f16(d);
        for (int j = 0; j < TS_QK4_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[TS_QK4_0 / 2 + j] * id;
            const uint8_t q0 = (uint8_t)imin(15, (int8_t)(x0 + 8.5f));
            const uint8_t q1 = (uint8_t)imin(15, (int8_t)(x1 + 8.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* ---- the k-quants' searches (ggml-quants.c) ---- */

/* Scale and min (returned as -min in *the_min, min <= 0) of n values into
 * levels 0..nmax, minimizing the weighted squared error: the plain
 * min/max fit, then nstep + 1 trial scales (rmin + rdelta is + nmax) /
 * (max - min), each refined by weighted least squares. */
static float make_qkx2_quants(int n, int nmax, const float *x,
                              const float *weights, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta,
                              int nstep) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++)
            L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = ts_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)imax(0, imin(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = ts_nearest_int(iscale * (x[i] - min));
            l = imax(0, imin(nmax, l));
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Signed scale of n values into levels -nmax..nmax-1 (stored + nmax),
 * weights x^2 (ggml's rmse_type 1, no importance): the scale through the
 * value of largest magnitude, then 18 trial scales around it, keeping the
 * one whose least-squares fit explains the most. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++)
            L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = ts_nearest_int(iscale * x[i]);
        l = imax(-nmax, imin(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = ts_nearest_int(iscale * x[i]);
            l = imax(-nmax, imin(nmax - 1, l));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = ts_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* The shared first half of q4_K and q5_K: per sub-block of 32 a scale and
 * a min (make_qkx2_quants with weights rms + |x|), both quantized to six
 * bits against the block's largest, packed into scales[12]; then every
 * value requantized against the rounded scales into L (0..nmax). */
static void kquant_scales(const float *x, int nmax, float rmin, int nstep,
                          uint16_t *d_out, uint16_t *dmin_out,
                          uint8_t packed[12], uint8_t L[TS_QK_K]) {
    uint8_t Laux[32];
    float weights[32], mins[TS_QK_K / 32], scales[TS_QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < TS_QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j,
                                     &mins[j], Laux, rmin, 0.1f, nstep);
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(packed, 0, 12);
    for (int j = 0; j < TS_QK_K / 32; j++) {
        uint8_t ls = (uint8_t)ts_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)ts_nearest_int(inv_min * mins[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            packed[j - 4] |= (uint8_t)((ls >> 4) << 6);
            packed[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = ts_f32_to_f16(max_scale / 63.f);
    *dmin_out = ts_f32_to_f16(max_min / 63.f);
    for (int j = 0; j < TS_QK_K / 32; j++) {
        uint8_t sc, m;
        ts_get_scale_min_k4(j, packed, &sc, &m);
        const float d = ts_f16_to_f32(*d_out) * sc;
        if (!d)
            continue;
        const float dm = ts_f16_to_f32(*dmin_out) * m;
        for (int ii = 0; ii < 32; ii++) {
            int l = ts_nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
        }
    }
}

static void quantize_q4_K(const float *x, ts_block_q4_K *y, int64_t nb) {
    uint8_t L[TS_QK_K];
    for (int64_t i = 0; i < nb; i++, x += TS_QK_K) {
        kquant_scales(x, 15, -1.f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < TS_QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++)
                q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void quantize_q5_K(const float *x, ts_block_q5_K *y, int64_t nb) {
    uint8_t L[TS_QK_K];
    for (int64_t i = 0; i < nb; i++, x += TS_QK_K) {
        kquant_scales(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, TS_QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < TS_QK_K; n += 64, ql += 32) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 = (uint8_t)(m1 << 2);
            m2 = (uint8_t)(m2 << 2);
        }
    }
}

static void quantize_q6_K(const float *x, ts_block_q6_K *y, int64_t nb) {
    int8_t L[TS_QK_K];
    float scales[TS_QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += TS_QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < TS_QK_K / 16; ib++) {
            const float scale =
                make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) {
                max_abs_scale = fabsf(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -128.f / max_scale;
        y[i].d = ts_f32_to_f16(1 / iscale);
        for (int ib = 0; ib < TS_QK_K / 16; ib++)
            y[i].scales[ib] =
                (int8_t)imin(127, ts_nearest_int(iscale * scales[ib]));
        for (int j = 0; j < TS_QK_K / 16; j++) {
            float d = ts_f16_to_f32(y[i].d) * y[i].scales[j];
            if (!d)
                continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = ts_nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(imax(-32, imin(31, l)) + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < TS_QK_K; j += 128, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                const int q1 = L[j + l], q2 = L[j + l + 32];
                const int q3 = L[j + l + 64], q4 = L[j + l + 96];
                ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) |
                                  ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
    }
}

void ts_quantize_row_q8_K_ref(const float *x, ts_block_q8_K *y, int64_t k) {
    for (int64_t i = 0; i < k / TS_QK_K; i++, x += TS_QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < TS_QK_K; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < TS_QK_K; j++)
            y[i].qs[j] = (int8_t)imin(127, ts_nearest_int(iscale * x[j]));
        for (int j = 0; j < TS_QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++)
                sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

void ts_quantize_row(ts_dtype dt, const float *x, void *y, int64_t k) {
    int64_t nb =
        k / (ts_dtype_block_elems(dt) > 0 ? ts_dtype_block_elems(dt) : 1);
    switch (dt) {
    case TS_Q8_0:
        quantize_q8_0(x, y, nb);
        break;
    case TS_Q4_0:
        quantize_q4_0(x, y, nb);
        break;
    case TS_Q4_K:
        quantize_q4_K(x, y, nb);
        break;
    case TS_Q5_K:
        quantize_q5_K(x, y, nb);
        break;
    case TS_Q6_K:
        quantize_q6_K(x, y, nb);
        break;
    default: /* a plain dtype: element by element */
        for (int64_t i = 0; i < k; i++)
            ts_store_f32((char *)y + i * (int64_t)ts_dtype_size(dt), dt, x[i]);
        break;
    }
}

/* ---- dequantization (ggml's dequantize_row_*, same operation order) ---- */

static void dequant_q8_0(const ts_block_q8_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += TS_QK8_0) {
        const float d = ts_f16_to_f32(x[i].d);
        for (int j = 0; j < TS_QK8_0; j++)
            y[j] = x[i].qs[j] * d;
    }
}

static void dequant_q4_0(const ts_block_q4_0 *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += TS_QK4_0) {
        const float d = ts_f16_to_f32(x[i].d);
        for (int j = 0; j < TS_QK4_0 / 2; j++) {
            y[j] = ((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + TS_QK4_0 / 2] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_K(const ts_block_q4_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *q = x[i].qs;
        const float d = ts_f16_to_f32(x[i].d), min = ts_f16_to_f32(x[i].dmin);
        for (int j = 0; j < TS_QK_K / 64; j++, q += 32) {
            uint8_t sc, m;
            ts_get_scale_min_k4(2 * j, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            ts_get_scale_min_k4(2 * j + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void dequant_q5_K(const ts_block_q5_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = ts_f16_to_f32(x[i].d), min = ts_f16_to_f32(x[i].dmin);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < TS_QK_K / 64; j++, ql += 32) {
            uint8_t sc, m;
            ts_get_scale_min_k4(2 * j, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            ts_get_scale_min_k4(2 * j + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            u1 = (uint8_t)(u1 << 2);
            u2 = (uint8_t)(u2 << 2);
        }
    }
}

static void dequant_q6_K(const ts_block_q6_K *x, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        const float d = ts_f16_to_f32(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int n = 0; n < TS_QK_K;
             n += 128, y += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 =
                    ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 =
                    ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
    }
}

void ts_dequantize_row(ts_dtype dt, const void *x, float *y, int64_t k) {
    int64_t nb =
        k / (ts_dtype_block_elems(dt) > 0 ? ts_dtype_block_elems(dt) : 1);
    switch (dt) {
    case TS_Q8_0:
        dequant_q8_0(x, y, nb);
        break;
    case TS_Q4_0:
        dequant_q4_0(x, y, nb);
        break;
    case TS_Q4_K:
        dequant_q4_K(x, y, nb);
        break;
    case TS_Q5_K:
        dequant_q5_K(x, y, nb);
        break;
    case TS_Q6_K:
        dequant_q6_K(x, y, nb);
        break;
    case TS_F32:
        memcpy(y, x, sizeof(float) * (size_t)k);
        break;
    default:
        for (int64_t i = 0; i < k; i++)
            y[i] = ts_load_f32((const char *)x + i * (int64_t)ts_dtype_size(dt),
                               dt);
        break;
    }
}

void ts_dequantize_row_q8_K(const ts_block_q8_K *x, float *y, int64_t k) {
    for (int64_t i = 0; i < k / TS_QK_K; i++, y += TS_QK_K)
        for (int j = 0; j < TS_QK_K; j++)
            y[j] = x[i].d * x[i].qs[j];
}

/* ---- activations and the reference dot products ---- */

bool ts_act_is_q8_K(ts_dtype wdt) {
    return wdt == TS_Q4_K || wdt == TS_Q5_K || wdt == TS_Q6_K;
}

size_t ts_act_row_bytes(ts_dtype wdt, int64_t k) {
    if (!ts_dtype_is_quantized(wdt) || k < 0 || k % ts_dtype_block_elems(wdt))
        return 0;
    return ts_act_is_q8_K(wdt) ? (size_t)(k / TS_QK_K) * sizeof(ts_block_q8_K)
                               : (size_t)(k / TS_QK8_0) * sizeof(ts_block_q8_0);
}

void ts_quantize_act_ref(ts_dtype wdt, const float *x, void *y, int64_t k) {
    if (ts_act_is_q8_K(wdt))
        ts_quantize_row_q8_K_ref(x, y, k);
    else
        quantize_q8_0(x, y, k / TS_QK8_0);
}

static float dot_q8_0(int64_t nb, const ts_block_q8_0 *x,
                      const ts_block_q8_0 *y) {
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < TS_QK8_0; j++)
            sumi += x[i].qs[j] * y[i].qs[j];
        sumf += sumi * (ts_f16_to_f32(x[i].d) * ts_f16_to_f32(y[i].d));
    }
    return sumf;
}

/* one q4_0 block's integer sum of products (kept out of line: inlined,
 * GCC vectorizes across blocks with byte inserts, 8x slower) */
static __attribute__((noinline)) int dot_q4_0_block(const ts_block_q4_0 *x,
                                                    const ts_block_q8_0 *y) {
    int sumi = 0;
    for (int j = 0; j < TS_QK4_0 / 2; j++)
        sumi += ((x->qs[j] & 0x0F) - 8) * y->qs[j] +
                ((x->qs[j] >> 4) - 8) * y->qs[j + TS_QK4_0 / 2];
    return sumi;
}

static float dot_q4_0(int64_t nb, const ts_block_q4_0 *x,
                      const ts_block_q8_0 *y) {
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++)
        sumf += dot_q4_0_block(&x[i], &y[i]) *
                (ts_f16_to_f32(x[i].d) * ts_f16_to_f32(y[i].d));
    return sumf;
}

/* q4_K and q5_K: sum = d dy sum_j sc_j (q . a)_j - dmin dy sum_j m_j
 * (sum of a)_j, the two integer sums exact */
static float dot_q45_K(int64_t nb, const void *vx, size_t stride, bool five,
                       const ts_block_q8_K *y) {
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++) {
        const char *blk = (const char *)vx + (size_t)i * stride;
        const ts_block_q4_K *x4 = (const ts_block_q4_K *)blk;
        const ts_block_q5_K *x5 = (const ts_block_q5_K *)blk;
        const uint8_t *scales = five ? x5->scales : x4->scales;
        const uint8_t *qs = five ? x5->qs : x4->qs;
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < TS_QK_K / 32; j++) {
            uint8_t sc, m;
            ts_get_scale_min_k4(j, scales, &sc, &m);
            int32_t s = 0;
            for (int l = 0; l < 32; l++) {
                int q = (qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0xF;
                if (five && (x5->qh[l] >> j) & 1)
                    q += 16;
                s += q * y[i].qs[32 * j + l];
            }
            isum += sc * s;
            msum += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        }
        const uint16_t d = five ? x5->d : x4->d;
        const uint16_t dmin = five ? x5->dmin : x4->dmin;
        sumf += ts_f16_to_f32(d) * y[i].d * isum -
                ts_f16_to_f32(dmin) * y[i].d * msum;
    }
    return sumf;
}

static float dot_q6_K(int64_t nb, const ts_block_q6_K *x,
                      const ts_block_q8_K *y) {
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++) {
        int8_t q[TS_QK_K]; /* the levels minus 32, in element order */
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                q[128 * h + l] =
                    (int8_t)(((ql[l] & 0xF) | (qh[l] & 3) << 4) - 32);
                q[128 * h + l + 32] =
                    (int8_t)(((ql[l + 32] & 0xF) | (qh[l] >> 2 & 3) << 4) - 32);
                q[128 * h + l + 64] =
                    (int8_t)(((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4) - 32);
                q[128 * h + l + 96] =
                    (int8_t)(((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4) - 32);
            }
        int32_t isum = 0;
        for (int g = 0; g < TS_QK_K / 16; g++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++)
                s += q[16 * g + l] * y[i].qs[16 * g + l];
            isum += x[i].scales[g] * s;
        }
        sumf += ts_f16_to_f32(x[i].d) * y[i].d * isum;
    }
    return sumf;
}

float ts_vec_dot_ref(ts_dtype wdt, int64_t k, const void *wrow,
                     const void *act_q) {
    switch (wdt) {
    case TS_Q8_0:
        return dot_q8_0(k / TS_QK8_0, wrow, act_q);
    case TS_Q4_0:
        return dot_q4_0(k / TS_QK4_0, wrow, act_q);
    case TS_Q4_K:
        return dot_q45_K(k / TS_QK_K, wrow, sizeof(ts_block_q4_K), false,
                         act_q);
    case TS_Q5_K:
        return dot_q45_K(k / TS_QK_K, wrow, sizeof(ts_block_q5_K), true, act_q);
    case TS_Q6_K:
        return dot_q6_K(k / TS_QK_K, wrow, act_q);
    default:
        return 0.0f;
    }
}

/* ---- whole tensors ---- */

typedef struct {
    const char *src;
    ts_dtype sdt, dt;
    int ndim;
    const int64_t *shape, *strides; /* src's, elements */
    int64_t K;
    size_t out_row_bytes;
    char *out;
    bool direct; /* f32 rows with unit stride: quantized in place */
    atomic_bool oom;
} quant_job;

static void quant_rows(void *p, int64_t r0, int64_t r1) {
    quant_job *j = p;
    float *buf = j->direct ? NULL : malloc(sizeof(float) * (size_t)j->K);
    if (!j->direct && !buf) {
        atomic_store(&j->oom, true);
        return;
    }
    size_t es = ts_dtype_size(j->sdt);
    int64_t inner = j->strides[j->ndim - 1];
    for (int64_t r = r0; r < r1; r++) {
        int64_t off = 0, rem = r; /* row r's first element */
        for (int d = j->ndim - 2; d >= 0; d--) {
            off += (rem % j->shape[d]) * j->strides[d];
            rem /= j->shape[d];
        }
        const char *row = j->src + off * (int64_t)es;
        const float *x = (const float *)row;
        if (!j->direct) {
            for (int64_t i = 0; i < j->K; i++)
                buf[i] = ts_load_f32(row + i * inner * (int64_t)es, j->sdt);
            x = buf;
        }
        ts_quantize_row(j->dt, x, j->out + (size_t)r * j->out_row_bytes, j->K);
    }
    free(buf);
}

ts_status ts_quantize_tensor(ts_ctx *ctx, const ts_tensor *src, ts_dtype dt,
                             ts_tensor **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!src || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_quantize_tensor: NULL %s",
                            src ? "output pointer" : "source tensor");
    *out = NULL;
    if (!ts_dtype_is_quantized(dt))
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "ts_quantize_tensor: target dtype %s is not a "
                            "quantized block format (q8_0, q4_0, q4_k, q5_k, "
                            "q6_k)",
                            ts_dtype_name(dt));
    if (!ts_dtype_is_float(src->dtype))
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "ts_quantize_tensor: source tensor is %s; f32, "
                            "bf16 or f16 expected",
                            ts_dtype_name(src->dtype));
    int64_t be = ts_dtype_block_elems(dt);
    if (src->ndim < 1 || src->shape[src->ndim - 1] % be) {
        char sb[160];
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "ts_quantize_tensor: a %s tensor holds whole "
                            "blocks of %lld along its last dim; shape %s "
                            "does not",
                            ts_dtype_name(dt), (long long)be,
                            ts_shape_str(src->ndim, src->shape, sb, sizeof sb));
    }
    ts_tensor *s = (ts_tensor *)src;
    if (ts_materialize(s) != TS_OK)
        return ctx->status;
    ts_tensor *h = ts_host_copy(s);
    if (!h)
        return ctx->status ? ctx->status
                           : ts_set_error(ctx, TS_ERR_OOM,
                                          "ts_quantize_tensor: out of memory "
                                          "copying the source to the host");
    ts_tensor *q = ts_tensor_new_host(ctx, dt, h->ndim, h->shape);
    if (!q) {
        ts_release(h);
        return ctx->status;
    }
    int64_t K = h->shape[h->ndim - 1];
    int64_t rows = K ? ts_shape_numel(h->ndim, h->shape) / K : 0;
    quant_job j = {.src = ts_tensor_ptr(h),
                   .sdt = h->dtype,
                   .dt = dt,
                   .ndim = h->ndim,
                   .shape = h->shape,
                   .strides = h->strides,
                   .K = K,
                   .out_row_bytes = (size_t)ts_dtype_nbytes(dt, K),
                   .out = ts_tensor_ptr(q),
                   .direct =
                       h->dtype == TS_F32 && h->strides[h->ndim - 1] == 1};
    /* ~64K elements a chunk (a q4_K row of 1024 takes ~20 us) */
    int64_t grain = K >= 65536 ? 1 : (65536 + K - 1) / (K ? K : 1);
    if (rows > 0)
        ts_parallel_for(rows, grain, quant_rows, &j);
    ts_release(h);
    if (atomic_load(&j.oom)) {
        ts_release(q);
        return ts_set_error(ctx, TS_ERR_OOM,
                            "ts_quantize_tensor: out of memory (a row buffer "
                            "of %lld floats)",
                            (long long)K);
    }
    q = ts_tensor_to_current(ctx, q);
    if (!q)
        return ctx->status;
    *out = q;
    return TS_OK;
}
