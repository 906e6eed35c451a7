/* dtype.c — dtype names and sizes, and the bf16/f16 <-> f32 conversions
 * (round to nearest even, NaN kept quiet, Inf kept). Owns nothing else. */
#include "core/core.h"

#include <string.h>
#include <strings.h>

static const char *const dtype_names[TS_DTYPE_COUNT] = {
    "f32", "bf16", "f16", "i32", "i64", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"};
static const size_t dtype_sizes[TS_DTYPE_COUNT] = {4, 2, 2, 4, 8,
                                                   0, 0, 0, 0, 0};
static const int64_t block_elems[TS_DTYPE_COUNT] = {1,  1,  1,   1,   1,
                                                    32, 32, 256, 256, 256};
static const size_t block_bytes[TS_DTYPE_COUNT] = {4,  2,  2,   4,   8,
                                                   34, 18, 144, 176, 210};

const char *ts_dtype_name(ts_dtype dt) {
    return (unsigned)dt < TS_DTYPE_COUNT ? dtype_names[dt] : "invalid";
}

size_t ts_dtype_size(ts_dtype dt) {
    return (unsigned)dt < TS_DTYPE_COUNT ? dtype_sizes[dt] : 0;
}

bool ts_dtype_is_quantized(ts_dtype dt) {
    return dt >= TS_Q8_0 && dt < TS_DTYPE_COUNT;
}

int64_t ts_dtype_block_elems(ts_dtype dt) {
    return (unsigned)dt < TS_DTYPE_COUNT ? block_elems[dt] : 0;
}

size_t ts_dtype_block_bytes(ts_dtype dt) {
    return (unsigned)dt < TS_DTYPE_COUNT ? block_bytes[dt] : 0;
}

int64_t ts_dtype_nbytes(ts_dtype dt, int64_t n) {
    int64_t be = ts_dtype_block_elems(dt), b;
    if (be <= 0 || n < 0 || n % be ||
        __builtin_mul_overflow(n / be, (int64_t)block_bytes[dt], &b))
        return -1;
    return b;
}

ts_dtype ts_dtype_from_name(const char *name) {
    for (int i = 0; name && i < TS_DTYPE_COUNT; i++)
        if (!strcasecmp(name, dtype_names[i]))
            return (ts_dtype)i;
    return TS_DTYPE_COUNT;
}

bool ts_dtype_is_float(ts_dtype dt) {
    return dt == TS_F32 || dt == TS_BF16 || dt == TS_F16;
}

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t ts_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float ts_bf16_to_f32(uint16_t x) {
    return bits_f32((uint32_t)x << 16);
}

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
uint16_t ts_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t ax = u & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {   /* below 2^-14: subnormal or zero */
        if (ax < 0x33000000u) /* below 2^-25: rounds to zero */
            return sign;
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(ax >> 23); /* 14 + (113 - e) */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax - 0x38000000u; /* rebias exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float ts_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0)
            return bits_f32(sign);
        /* subnormal: mant * 2^-24 */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

double ts_load_f64(const void *p, ts_dtype dt) {
    switch (dt) {
    case TS_I64:
        return (double)*(const int64_t *)p;
    case TS_I32:
        return (double)*(const int32_t *)p;
    default:
        return (double)ts_load_f32(p, dt);
    }
}

void ts_store_f64(void *p, ts_dtype dt, double v) {
    switch (dt) {
    case TS_I64:
        *(int64_t *)p = (int64_t)v;
        break;
    case TS_I32:
        *(int32_t *)p = (int32_t)v;
        break;
    default:
        ts_store_f32(p, dt, (float)v);
        break;
    }
}
