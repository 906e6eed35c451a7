/* test_quant.c — llama.cpp's quantized block formats (src/core/quant.c) and
 * the CPU's kernels over them (src/backend/cpu/quant_gemm.c):
 *   - blocks quantized from values whose bytes follow by hand from each
 *     format's definition, and hand-built blocks decoded to exact floats;
 *   - the reference quantizers byte for byte against an independent
 *     transcription of ggml's (tests/ref/ggml_quants.py writes the cases);
 *   - dequantize(quantize(x)) within each format's error bound;
 *   - every kernel at every ISA level the machine runs: activation
 *     quantization and dequantization bit for bit the reference's, the
 *     int8 GEMV/GEMM against ts_vec_dot_ref to f32 rounding, the f32 path
 *     against the dequantized product, a row's result independent of R;
 *   - ts_quantize_tensor on contiguous, bf16 and strided sources, and its
 *     errors. */
#include "backend/cpu/quant_gemm.h"
#include "core/core.h"
#include "core/quant.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static float grand(void) { /* standard normal (Box-Muller) */
    double u = urand(), v = urand();
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}
static float *gauss_buf(int64_t n, float scale) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        p[i] = grand() * scale;
    return p;
}

static const ts_dtype formats[5] = {TS_Q8_0, TS_Q4_0, TS_Q4_K, TS_Q5_K,
                                    TS_Q6_K};

/* ---- blocks worked out by hand ---- */

/* x = i - 16: amax 16, d = 16/127 (f16 0x3008); 1/d rounds to 7.9375
 * exactly, so q = roundf(7.9375 (i - 16)), the halves at i - 16 = +-8
 * (+-63.5) away from zero */
static void test_q8_0_by_hand(void) {
    float x[32], y[32];
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i - 16);
    ts_block_q8_0 b;
    ts_quantize_row(TS_Q8_0, x, &b, 32);
    static const int8_t want[32] = {-127, -119, -111, -103, -95, -87, -79, -71,
                                    -64,  -56,  -48,  -40,  -32, -24, -16, -8,
                                    0,    8,    16,   24,   32,  40,  48,  56,
                                    64,   71,   79,   87,   95,  103, 111, 119};
    CHECK(b.d == 0x3008);
    CHECK(memcmp(b.qs, want, 32) == 0);
    ts_dequantize_row(TS_Q8_0, &b, y, 32);
    for (int i = 0; i < 32; i++)
        CHECK(y[i] == want[i] * 0.1259765625f); /* f16 0x3008 */
}

/* x = i - 16: the first value of largest magnitude is -16, d = -16 / -8
 * = 2 (f16 0x4000), q = min(15, trunc((i - 16) / 2 + 8.5)) =
 * min(15, (i + 1) / 2) */
static void test_q4_0_by_hand(void) {
    float x[32], y[32];
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i - 16);
    ts_block_q4_0 b;
    ts_quantize_row(TS_Q4_0, x, &b, 32);
    CHECK(b.d == 0x4000);
    for (int j = 0; j < 16; j++) {
        int lo = (j + 1) / 2, hi = (j + 17) / 2 > 15 ? 15 : (j + 17) / 2;
        CHECK(b.qs[j] == (lo | hi << 4));
    }
    ts_dequantize_row(TS_Q4_0, &b, y, 32);
    CHECK(y[0] == -16 && y[1] == -14 && y[2] == -14 && y[16] == 0 &&
          y[31] == 14);
}

/* Every sub-block the ramp x = 0.5 l - 2 (l = 0..15, twice): the first fit
 * is exact (iscale 15 / 7.5 = 2, error 0), so scale 0.5, min 2 in every
 * sub-block; six-bit scale and min 63, d = f16(0.5 / 63) = 0x2010, dmin =
 * f16(2 / 63) = 0x2810; requantized against d 63 = 0.49988 and dmin 63 =
 * 1.99951 the levels stay l. Packed: bytes 0..3 = 63 | (63 >> 4) << 6 =
 * 255, bytes 4..7 = 63 | 3 << 6 = 255, bytes 8..11 = 15 | 15 << 4 = 255. */
static void test_q4_K_by_hand(void) {
    float x[512], y[512];
    for (int i = 0; i < 256; i++)
        x[i] = 0.5f * (float)(i % 16) - 2.0f;
    for (int i = 256; i < 512; i++) /* a constant block */
        x[i] = 0.37f;
    ts_block_q4_K b[2];
    ts_quantize_row(TS_Q4_K, x, b, 512);
    CHECK(b[0].d == 0x2010 && b[0].dmin == 0x2810);
    for (int i = 0; i < 12; i++)
        CHECK(b[0].scales[i] == 255);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            CHECK(b[0].qs[32 * c + l] == ((l % 16) | (l % 16) << 4));
    ts_dequantize_row(TS_Q4_K, b, y, 512);
    for (int i = 0; i < 256; i++) /* x (d 63 - 0.5) l + 2 - dmin 63 */
        CHECK_NEAR(y[i], x[i], 0.005);
    /* x = 7.5: 0.0079345703 * 63 * 15 - 0.03173828 * 63 */
    CHECK(y[15] == 0.0079345703125f * 63 * 15 - 0.03173828125f * 63);
    for (int i = 256; i < 512; i++)
        CHECK_NEAR(y[i], 0.37, 0.37 * 0.002);
}

/* The ramp x = 0.25 l - 1 (l = 0..31) in every sub-block: exact first fit
 * (iscale 31 / 7.75 = 4), scale 0.25, min 1; d = f16(0.25 / 63) = 0x1C10,
 * dmin = f16(1 / 63) = 0x2410, six-bit scales and mins 63; levels l, the
 * fifth bit of sub-block j's element l in bit j of qh[l]. */
static void test_q5_K_by_hand(void) {
    float x[256], y[256];
    for (int i = 0; i < 256; i++)
        x[i] = 0.25f * (float)(i % 32) - 1.0f;
    ts_block_q5_K b;
    ts_quantize_row(TS_Q5_K, x, &b, 256);
    CHECK(b.d == 0x1C10 && b.dmin == 0x2410);
    for (int i = 0; i < 12; i++)
        CHECK(b.scales[i] == 255);
    for (int l = 0; l < 32; l++) {
        CHECK(b.qh[l] == (l >= 16 ? 0xFF : 0x00));
        for (int c = 0; c < 4; c++)
            CHECK(b.qs[32 * c + l] == ((l % 16) | (l % 16) << 4));
    }
    ts_dequantize_row(TS_Q5_K, &b, y, 256);
    for (int i = 0; i < 256; i++)
        CHECK_NEAR(y[i], x[i], 0.003);
}

/* x = 0.25 (i % 16 - 8): in each sub-block of 16 the first value of
 * largest magnitude is -2, iscale -32 / -2 = 16 makes l = 16 x exact,
 * scale 1/16, and no trial beats an exact fit. All 16 scales equal:
 * iscale -128 / 0.0625 = -2048, d = f16(-1/2048) = 0x9000, every int8
 * scale -128; levels 16 x + 32 = 4 (i % 16); the round trip is exact. */
static void test_q6_K_by_hand(void) {
    float x[256], y[256];
    for (int i = 0; i < 256; i++)
        x[i] = 0.25f * (float)(i % 16 - 8);
    ts_block_q6_K b;
    ts_quantize_row(TS_Q6_K, x, &b, 256);
    CHECK(b.d == 0x9000);
    for (int g = 0; g < 16; g++)
        CHECK(b.scales[g] == -128);
    /* value v of a half of 128: ql[v % 64] nibble v / 64, qh[v % 32] bits
     * 2 (v / 32) */
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            int q[4];
            for (int s = 0; s < 4; s++)
                q[s] = 4 * ((128 * h + 32 * s + l) % 16);
            CHECK(b.ql[64 * h + l] == ((q[0] & 15) | (q[2] & 15) << 4));
            CHECK(b.ql[64 * h + 32 + l] == ((q[1] & 15) | (q[3] & 15) << 4));
            CHECK(b.qh[32 * h + l] == ((q[0] >> 4) | (q[1] >> 4) << 2 |
                                       (q[2] >> 4) << 4 | (q[3] >> 4) << 6));
        }
    ts_dequantize_row(TS_Q6_K, &b, y, 256);
    CHECK(memcmp(x, y, sizeof x) == 0);
}

/* Q8_K activations: iscale = -127 / max (max the first value of largest
 * magnitude, here -4 at i = 3), q = nearest_int(iscale x), d = 1/iscale */
static void test_q8_K_by_hand(void) {
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = i == 3 ? -4.0f : i == 7 ? 4.0f : (float)(i % 5) * 0.5f;
    ts_block_q8_K b;
    ts_quantize_row_q8_K_ref(x, &b, 256);
    CHECK(b.d == 1 / (-127.f / -4.0f));
    CHECK(b.qs[3] == -127 && b.qs[7] == 127);
    CHECK(b.qs[1] == 16); /* 31.75 * 0.5 = 15.875 */
    CHECK(b.qs[2] == 32); /* 31.75 rounds to 32 */
    CHECK(b.qs[4] == 64); /* 63.5, a tie: to even */
    int s = 0;
    for (int i = 0; i < 16; i++)
        s += b.qs[i];
    CHECK(b.bsums[0] == s);
}

/* ---- hand-built blocks decoded ---- */

static void test_decode_by_hand(void) {
    float y[256];
    /* q8_0: d = 0.5 (f16 0x3800) */
    uint8_t q80[34] = {0x00, 0x38, 0x81, 0xFF, 0x00, 0x01, 0x7F};
    ts_dequantize_row(TS_Q8_0, q80, y, 32);
    CHECK(y[0] == -63.5f && y[1] == -0.5f && y[2] == 0 && y[3] == 0.5f &&
          y[4] == 63.5f && y[31] == 0);
    /* q4_0: d = -2 (f16 0xC000); byte 0 = 0xF0: x0 = (0 - 8) -2 = 16,
     * x16 = (15 - 8) -2 = -14 */
    uint8_t q40[18] = {0x00, 0xC0, 0xF0, 0x8A};
    ts_dequantize_row(TS_Q4_0, q40, y, 32);
    CHECK(y[0] == 16 && y[16] == -14 && y[1] == -4 && y[17] == 0 &&
          y[2] == 16 && y[18] == 16);
    /* q4_K: d = 1, dmin = 0.5; scales (1, 2, 3, 4, 17, 33, 50, 63), mins
     * (0, 1, 2, 3, 16, 20, 40, 63) packed by get_scale_min_k4's rules */
    uint8_t q4k[144] = {0x00, 0x3C, 0x00, 0x38, 65, 130, 195, 196,
                        64,   65,   130,  195,  1,  65,  130, 255};
    for (int i = 0; i < 128; i++)
        q4k[16 + i] = (uint8_t)(i * 7);
    ts_dequantize_row(TS_Q4_K, q4k, y, 256);
    static const int sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
    static const int mn[8] = {0, 1, 2, 3, 16, 20, 40, 63};
    for (int e = 0; e < 256; e++) {
        int j = e / 32, l = e % 32, byte = (32 * (j / 2) + l) * 7 & 0xFF;
        int q = j % 2 ? byte >> 4 : byte & 15;
        CHECK(y[e] == (float)(sc[j] * q) - 0.5f * (float)mn[j]);
    }
    CHECK(y[0] == 0 && y[32] == 0 - 0.5f); /* q 0: -dmin m */
    CHECK(y[255] == 63.0f * ((127 * 7 & 0xFF) >> 4) - 31.5f);
    /* q5_K: the same scales, qh bit j of qh[l] adds 16 to sub-block j's
     * element l */
    uint8_t q5k[176] = {0x00, 0x3C, 0x00, 0x38, 65, 130, 195, 196,
                        64,   65,   130,  195,  1,  65,  130, 255};
    for (int l = 0; l < 32; l++)
        q5k[16 + l] = (uint8_t)(l * 37);
    for (int i = 0; i < 128; i++)
        q5k[48 + i] = (uint8_t)(i * 7);
    ts_dequantize_row(TS_Q5_K, q5k, y, 256);
    for (int e = 0; e < 256; e++) {
        int j = e / 32, l = e % 32, byte = (32 * (j / 2) + l) * 7 & 0xFF;
        int q =
            (j % 2 ? byte >> 4 : byte & 15) + ((l * 37 & 0xFF) >> j & 1) * 16;
        CHECK(y[e] == (float)(sc[j] * q) - 0.5f * (float)mn[j]);
    }
    /* q6_K: d = 0.25 (f16 0x3400), scales g - 8 times 16 */
    uint8_t q6k[210] = {0};
    for (int i = 0; i < 128; i++)
        q6k[i] = (uint8_t)(i * 13);
    for (int i = 0; i < 64; i++)
        q6k[128 + i] = (uint8_t)(i * 29);
    for (int g = 0; g < 16; g++)
        q6k[192 + g] = (uint8_t)(int8_t)((g - 8) * 16);
    q6k[208] = 0x00, q6k[209] = 0x34;
    ts_dequantize_row(TS_Q6_K, q6k, y, 256);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, v = e % 128;
        int lo = q6k[64 * h + v % 64], hi = q6k[128 + 32 * h + v % 32];
        int q = ((v < 64 ? lo & 15 : lo >> 4) | (hi >> 2 * (v / 32) & 3) << 4);
        CHECK(y[e] == 0.25f * (float)((e / 16 - 8) * 16) * (float)(q - 32));
    }
    /* element 0: ql 0, qh 0 -> q 0, scale -128: 0.25 -128 -32 = 1024 */
    CHECK(y[0] == 1024);
    /* the plain float dtypes widen element by element */
    const float f32[3] = {1.5f, -2.25f, 3e-3f};
    const uint16_t bf16[3] = {0x3FC0, 0xC010, 0x0000}; /* 1.5, -2.25, 0 */
    const uint16_t f16[3] = {0x3E00, 0xC080, 0x0001};  /* 1.5, -2.25, 2^-24 */
    ts_dequantize_row(TS_F32, f32, y, 3);
    CHECK(y[0] == 1.5f && y[1] == -2.25f && y[2] == 3e-3f);
    ts_dequantize_row(TS_BF16, bf16, y, 3);
    CHECK(y[0] == 1.5f && y[1] == -2.25f && y[2] == 0);
    ts_dequantize_row(TS_F16, f16, y, 3);
    CHECK(y[0] == 1.5f && y[1] == -2.25f && y[2] == 0x1p-24f);
}

/* ---- the reference quantizers against ggml_quants.py's bytes ---- */

static void test_against_python(const char *path) {
    size_t n = 0;
    uint8_t *f = tu_read_file(path, &n);
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK(n > 12 && memcmp(f, "TSQREF1", 8) == 0);
    size_t off = 8;
    uint32_t count;
    memcpy(&count, f + off, 4), off += 4;
    CHECK(count == 6);
    for (uint32_t c = 0; c < count && off + 16 <= n; c++) {
        char name[9] = {0};
        memcpy(name, f + off, 8), off += 8;
        uint32_t rows, k, nbytes;
        memcpy(&rows, f + off, 4), memcpy(&k, f + off + 4, 4), off += 8;
        const float *x = (const float *)(f + off);
        off += (size_t)rows * k * 4;
        memcpy(&nbytes, f + off, 4), off += 4;
        const uint8_t *want = f + off;
        off += nbytes;
        CHECK(off <= n);
        if (off > n)
            break;
        uint8_t *got = calloc(1, nbytes);
        size_t rb = nbytes / rows;
        bool q8k = !strcmp(name, "q8_k");
        ts_dtype dt = ts_dtype_from_name(name);
        CHECK(q8k || ts_dtype_is_quantized(dt));
        for (uint32_t r = 0; r < rows; r++) {
            if (q8k)
                ts_quantize_row_q8_K_ref(x + (size_t)r * k,
                                         (ts_block_q8_K *)(got + r * rb), k);
            else
                ts_quantize_row(dt, x + (size_t)r * k, got + r * rb, k);
        }
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < nbytes; i++)
            if (got[i] != want[i] && !bad++)
                first = i;
        CHECK(bad == 0);
        if (bad)
            fprintf(stderr,
                    "%s: %zu of %u bytes differ from ggml_quants.py; first "
                    "at row %zu byte %zu (%u, expected %u)\n",
                    name, bad, nbytes, first / rb, first % rb, got[first],
                    want[first]);
        free(got);
    }
    free(f);
}

/* ---- error bounds ---- */

/* RMS of dequantize(quantize(x)) - x over RMS of x, gaussian rows */
static void test_error_bounds(void) {
    /* q8_0 7 bits + sign per block of 32; q4_0 16 levels; q4_K/q5_K
     * 16/32 levels with a min per 32; q6_K 64 levels per 16 */
    static const double bound[5] = {0.007, 0.11, 0.085, 0.045, 0.022};
    const int64_t K = 4096;
    float *x = gauss_buf(K, 0.02f), *y = malloc(sizeof(float) * K);
    uint8_t *q = malloc((size_t)ts_dtype_nbytes(TS_Q8_0, K));
    for (int f = 0; f < 5; f++) {
        ts_quantize_row(formats[f], x, q, K);
        ts_dequantize_row(formats[f], q, y, K);
        double e = 0, s = 0;
        for (int64_t i = 0; i < K; i++)
            e += (double)(y[i] - x[i]) * (y[i] - x[i]),
                s += (double)x[i] * x[i];
        double rel = sqrt(e / s);
        CHECK(rel < bound[f]);
        if (getenv("TS_TEST_VERBOSE") || rel >= bound[f])
            fprintf(stderr, "%s: RMS relative error %.4f (bound %.3f)\n",
                    ts_dtype_name(formats[f]), rel, bound[f]);
    }
    free(x), free(y), free(q);
}

/* ---- kernels at every level ---- */

static float *special_rows(int64_t R, int64_t K) {
    float *x = gauss_buf(R * K, 1.0f);
    for (int64_t i = 0; i < K && R > 1; i++) /* zeros, then ties */
        x[K + i] = i < 300 ? 0.0f : (float)((i % 9) - 4) * 0.25f;
    for (int64_t i = 0; i < K && R > 2; i++) /* equal magnitudes, +- */
        x[2 * K + i] = i % 3 ? 3.0f : -3.0f;
    return x;
}

static void test_quantize_act_levels(void) {
    const int64_t R = 6, K = 1280;
    float *x = special_rows(R, K);
    for (int f = 0; f < 5; f++) {
        size_t ab = cpu_act_bytes(formats[f], K);
        uint8_t *want = malloc(ab), *got = malloc(ab);
        for (cpu_isa isa = CPU_ISA_SSE2; isa <= cpu_isa_detected(); isa++)
            for (int64_t r = 0; r < R; r++) {
                ts_quantize_act_ref(formats[f], x + r * K, want, K);
                memset(got, 0xAB, ab);
                cpu_quantize_act(isa, formats[f], x + r * K, K, got);
                CHECK(memcmp(want, got, ab) == 0);
                if (memcmp(want, got, ab))
                    fprintf(stderr, "cpu_quantize_act %s at %s: row %lld\n",
                            ts_dtype_name(formats[f]), cpu_isa_name(isa),
                            (long long)r);
            }
        free(want), free(got);
    }
    free(x);
}

static void test_dequant_levels(void) {
    const int64_t N = 7, K = 768;
    float *x = special_rows(N, K);
    for (int f = 0; f < 5; f++) {
        int64_t rb = ts_dtype_nbytes(formats[f], K);
        uint8_t *w = malloc((size_t)(N * rb));
        float *want = malloc(sizeof(float) * N * K),
              *got = malloc(sizeof(float) * N * K);
        for (int64_t r = 0; r < N; r++) {
            ts_quantize_row(formats[f], x + r * K, w + r * rb, K);
            ts_dequantize_row(formats[f], w + r * rb, want + r * K, K);
        }
        for (cpu_isa isa = CPU_ISA_SSE2; isa <= cpu_isa_detected(); isa++) {
            cpu_dequant_rows(isa, formats[f], w, rb, N, K, got);
            CHECK(memcmp(want, got, sizeof(float) * N * K) == 0);
            if (memcmp(want, got, sizeof(float) * N * K))
                fprintf(stderr, "cpu_dequant_rows %s at %s differs\n",
                        ts_dtype_name(formats[f]), cpu_isa_name(isa));
        }
        free(w), free(want), free(got);
    }
    free(x);
}

/* The int8 path against ts_vec_dot_ref: the integer sums are exact, so
 * the difference is f32 rounding of the per-block scales and of the sum
 * over blocks: |y - ref| <= 1e-6 |w| |a| (|w|, |a| the 2-norms of the
 * dequantized weight and activation rows, which bound the sum of the
 * blocks' magnitudes). At SSE2 the kernel is the reference itself. */
static void check_int8(ts_dtype wdt, cpu_isa isa, int64_t R, int64_t N,
                       int64_t K) {
    const int64_t lda = K + 5; /* rows apart by more than K */
    int64_t rb = ts_dtype_nbytes(wdt, K);
    float *A = gauss_buf(R * lda, 1.0f), *Wf = gauss_buf(N * K, 0.05f);
    for (int64_t i = 0; i < K && N > 1; i++) /* a row of zeros */
        Wf[K + i] = 0;
    uint8_t *W = malloc((size_t)(N * rb));
    for (int64_t n = 0; n < N; n++)
        ts_quantize_row(wdt, Wf + n * K, W + n * rb, K);
    float *Y = malloc(sizeof(float) * R * N), *tmp = malloc(sizeof(float) * K);
    size_t ab = cpu_act_bytes(wdt, K);
    uint8_t *act = malloc(ab);
    double *wn = malloc(sizeof(double) * N);
    for (int64_t n = 0; n < N; n++) {
        ts_dequantize_row(wdt, W + n * rb, tmp, K);
        double s = 0;
        for (int64_t i = 0; i < K; i++)
            s += (double)tmp[i] * tmp[i];
        wn[n] = sqrt(s);
    }
    CHECK(cpu_gemm_wq_int8(isa, R, N, K, A, lda, W, rb, wdt, Y));
    double worst = 0;
    for (int64_t r = 0; r < R; r++) {
        ts_quantize_act_ref(wdt, A + r * lda, act, K);
        if (ts_act_is_q8_K(wdt))
            ts_dequantize_row_q8_K((const ts_block_q8_K *)act, tmp, K);
        else
            ts_dequantize_row(TS_Q8_0, act, tmp, K);
        double an = 0;
        for (int64_t i = 0; i < K; i++)
            an += (double)tmp[i] * tmp[i];
        an = sqrt(an);
        for (int64_t n = 0; n < N; n++) {
            float ref = ts_vec_dot_ref(wdt, K, W + n * rb, act);
            double tol = isa == CPU_ISA_SSE2 ? 0 : 1e-6 * wn[n] * an;
            double e = fabs((double)Y[r * N + n] - ref);
            if (!(e <= tol) && !(tol == 0 && Y[r * N + n] == ref))
                worst = fmax(worst, isnan(e) ? INFINITY : e / (tol + 1e-30));
        }
    }
    CHECK(worst <= 1);
    if (worst > 1)
        fprintf(stderr,
                "cpu_gemm_wq_int8 %s at %s R=%lld N=%lld K=%lld: %.3g x tol\n",
                ts_dtype_name(wdt), cpu_isa_name(isa), (long long)R,
                (long long)N, (long long)K, worst);
    /* cpu_gemm_wq takes this path here */
    float *Y2 = malloc(sizeof(float) * R * N);
    if (!cpu_gemm_wq_uses_f32(isa, wdt, R)) {
        CHECK(cpu_gemm_wq(isa, R, N, K, A, lda, W, rb, wdt, Y2));
        CHECK(memcmp(Y, Y2, sizeof(float) * R * N) == 0);
    }
    free(Y2);
    /* each row alone gives the same bits (the kernels are per row) */
    float *y1 = malloc(sizeof(float) * N);
    for (int64_t r = 0; r<R; r += R> 3 ? R / 3 : 1) {
        CHECK(cpu_gemm_wq_int8(isa, 1, N, K, A + r * lda, lda, W, rb, wdt, y1));
        CHECK(memcmp(y1, Y + r * N, sizeof(float) * N) == 0);
    }
    free(y1);
    free(A), free(Wf), free(W), free(Y), free(tmp), free(act), free(wn);
}

static void test_gemm_int8_levels(void) {
    static const int64_t Rs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 33, 64};
    /* K = 800: 25 blocks of 32, an odd count (the 512-bit kernels' last
     * q8_0/q4_0 block goes alone) */
    static const int64_t NK[][2] = {
        {37, 256}, {64, 512}, {19, 1280}, {13, 800}};
    for (int f = 0; f < 5; f++)
        for (cpu_isa isa = CPU_ISA_SSE2; isa <= cpu_isa_detected(); isa++)
            for (size_t s = 0; s < sizeof NK / sizeof *NK; s++)
                for (size_t i = 0; i < sizeof Rs / sizeof *Rs; i++) {
                    if (NK[s][1] % ts_dtype_block_elems(formats[f]))
                        continue;
                    /* the scalar level on the smaller cases only */
                    if (isa == CPU_ISA_SSE2 && Rs[i] > 9 && s > 0)
                        continue;
                    check_int8(formats[f], isa, Rs[i], NK[s][0], NK[s][1]);
                }
}

/* The f32 path (and cpu_gemm_wq where it takes it) against the
 * dequantized weights times the f32 activations in f64: sgemm rounding,
 * |y - ref| <= 1e-5 |w| |a|. */
static void test_gemm_f32_levels(void) {
    const int64_t N = 45, K = 512, lda = 515;
    for (int f = 0; f < 5; f++) {
        int64_t rb = ts_dtype_nbytes(formats[f], K);
        float *Wf = gauss_buf(N * K, 0.05f);
        uint8_t *W = malloc((size_t)(N * rb));
        float *deq = malloc(sizeof(float) * N * K);
        for (int64_t n = 0; n < N; n++) {
            ts_quantize_row(formats[f], Wf + n * K, W + n * rb, K);
            ts_dequantize_row(formats[f], W + n * rb, deq + n * K, K);
        }
        for (int64_t R = 5; R <= 70; R += 65) {
            float *A = gauss_buf(R * lda, 1.0f),
                  *Y = malloc(sizeof(float) * R * N);
            for (cpu_isa isa = CPU_ISA_SSE2; isa <= cpu_isa_detected(); isa++)
                for (int path = 0; path < 2; path++) {
                    if (path == 1 && !cpu_gemm_wq_uses_f32(isa, formats[f], R))
                        continue; /* cpu_gemm_wq takes the int8 path there */
                    CHECK(path ? cpu_gemm_wq(isa, R, N, K, A, lda, W, rb,
                                             formats[f], Y)
                               : cpu_gemm_wq_f32(isa, R, N, K, A, lda, W, rb,
                                                 formats[f], Y));
                    double worst = 0;
                    for (int64_t r = 0; r < R; r++)
                        for (int64_t n = 0; n < N; n++) {
                            double s = 0, wn = 0, an = 0;
                            for (int64_t k = 0; k < K; k++) {
                                double a = A[r * lda + k], w = deq[n * K + k];
                                s += a * w, wn += w * w, an += a * a;
                            }
                            double e = fabs(Y[r * N + n] - s) /
                                       (1e-5 * sqrt(wn * an) + 1e-30);
                            worst = fmax(worst, isnan(e) ? INFINITY : e);
                        }
                    CHECK(worst <= 1);
                    if (worst > 1)
                        fprintf(stderr, "%s %s at %s R=%lld: %.3g x tol\n",
                                path ? "cpu_gemm_wq" : "cpu_gemm_wq_f32",
                                ts_dtype_name(formats[f]), cpu_isa_name(isa),
                                (long long)R, worst);
                }
            free(A), free(Y);
        }
        free(Wf), free(W), free(deq);
    }
}

/* ---- whole tensors ---- */

static void test_quantize_tensor(void) {
    ts_ctx *ctx = test_ctx();
    const int64_t shape[2] = {6, 512};
    float *x = gauss_buf(6 * 512, 1.0f);
    ts_tensor *t = ts_from_data(ctx, TS_F32, 2, shape, x);
    for (int f = 0; f < 5; f++) {
        ts_tensor *q = NULL;
        CHECK_OK(ctx, ts_quantize_tensor(ctx, t, formats[f], &q));
        if (!q)
            continue;
        CHECK(ts_tensor_dtype(q) == formats[f] && ts_tensor_ndim(q) == 2);
        int64_t rb = ts_dtype_nbytes(formats[f], 512);
        uint8_t *want = malloc((size_t)rb);
        const uint8_t *got = ts_tensor_data(q);
        for (int r = 0; r < 6; r++) {
            ts_quantize_row(formats[f], x + r * 512, want, 512);
            CHECK(memcmp(got + r * rb, want, (size_t)rb) == 0);
        }
        free(want);
        ts_release(q);
    }
    /* bf16 source: rows widened, then quantized */
    ts_tensor *tb = ts_cast(t, TS_BF16), *q = NULL;
    CHECK_OK(ctx, ts_quantize_tensor(ctx, tb, TS_Q4_K, &q));
    if (q) {
        float row[512];
        uint8_t want[288];
        const uint16_t *bv = ts_tensor_data(tb);
        for (int i = 0; i < 512; i++)
            row[i] = ts_bf16_to_f32(bv[512 + i]);
        ts_quantize_row(TS_Q4_K, row, want, 512);
        CHECK(memcmp((const uint8_t *)ts_tensor_data(q) + 288, want, 288) == 0);
        ts_release(q);
    }
    /* a strided view: the transpose of a (512, 6) tensor */
    const int64_t tshape[2] = {512, 6};
    float *xt = malloc(sizeof(float) * 512 * 6);
    for (int r = 0; r < 6; r++)
        for (int i = 0; i < 512; i++)
            xt[i * 6 + r] = x[r * 512 + i];
    ts_tensor *tt = ts_from_data(ctx, TS_F32, 2, tshape, xt);
    ts_tensor *view = ts_transpose(tt, 0, 1);
    CHECK_OK(ctx, ts_quantize_tensor(ctx, view, TS_Q6_K, &q));
    if (q) {
        uint8_t want[420];
        ts_quantize_row(TS_Q6_K, x + 5 * 512, want, 512);
        CHECK(memcmp((const uint8_t *)ts_tensor_data(q) + 5 * 420, want, 420) ==
              0);
        ts_release(q);
    }
    /* errors: the last dim not whole blocks, a non-float source, a
     * target that is no block format */
    const int64_t bad_shape[2] = {4, 300};
    ts_tensor *bad = ts_zeros(ctx, TS_F32, 2, bad_shape);
    CHECK(ts_quantize_tensor(ctx, bad, TS_Q4_K, &q) == TS_ERR_SHAPE && !q);
    CHECK_MSG(ctx, "whole blocks of 256");
    CHECK_MSG(ctx, "[4, 300]");
    ts_tensor *ints = ts_zeros(ctx, TS_I32, 2, shape);
    CHECK(ts_quantize_tensor(ctx, ints, TS_Q8_0, &q) == TS_ERR_DTYPE);
    CHECK_MSG(ctx, "source tensor is i32");
    CHECK(ts_quantize_tensor(ctx, t, TS_BF16, &q) == TS_ERR_DTYPE);
    CHECK_MSG(ctx, "bf16 is not a quantized block format");
    CHECK(ts_quantize_tensor(ctx, NULL, TS_Q8_0, &q) == TS_ERR_INVALID_ARG);
    ts_release(bad), ts_release(ints), ts_release(view), ts_release(tt);
    ts_release(tb), ts_release(t);
    free(x), free(xt);
    ts_ctx_free(ctx);
}

int main(int argc, char **argv) {
    test_q8_0_by_hand();
    test_q4_0_by_hand();
    test_q4_K_by_hand();
    test_q5_K_by_hand();
    test_q6_K_by_hand();
    test_q8_K_by_hand();
    test_decode_by_hand();
    if (argc > 1)
        test_against_python(argv[1]);
    else
        fprintf(stderr, "no cases file given: the comparison with "
                        "ggml_quants.py is skipped\n");
    test_error_bounds();
    fprintf(stderr, "levels: sse2 .. %s\n", cpu_isa_name(cpu_isa_detected()));
    test_quantize_act_levels();
    test_dequant_levels();
    test_gemm_int8_levels();
    test_gemm_f32_levels();
    test_quantize_tensor();
    return test_finish("test_quant");
}
