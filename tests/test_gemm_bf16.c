/* test_gemm_bf16.c — the AVX512_BF16 GEMM (src/backend/cpu/gemm_bf16.c)
 * against its slow reference: random shapes (1, primes, multiples of the
 * 8 x 48 tile and of the K block, sizes that cross the packing blocks),
 * f32 and bf16 operands, row-major, transposed and strided views, acc on
 * and off; f32 rounded to bf16 exactly as ts_f32_to_bf16; the pre-packed
 * B giving the same bits as the unpacked call; each row the same bits
 * alone as among M rows; the same bits on 1 and 2 threads; a level below
 * AVX512_BF16 or an unsupported dtype refused with C untouched. Skipped (with
 * the reason) on a machine without AVX512_BF16.
 *
 * Every C element is one chain whatever the path: the kernel adds the K
 * bf16 products (each exact in f32) one by one (vdpbf16ps, a pair at a
 * time) into an f32 lane that starts at 0, or at the old C with acc; the
 * tiles store it and load it back between K blocks, which is exact. So the
 * element's bits do not depend on M or the rows beside it, and the few-
 * rows path (M <= 64, B streamed), the blocked one (cpu_gemm_bf16_blocked)
 * and the pre-packed B agree bit for bit (checked on random shapes and
 * layouts: each row alone against all of them, across the 64-row switch).
 *
 * Tolerance: at most K + 1 roundings of 2^-24 with the reference's cast to
 * float, so the classic bound for a sum, |err| <= gamma_{K+1} (sum |a b|
 * + |C0|) with gamma_n = n 2^-24 / (1 - n 2^-24), holds; the test allows
 * (K + 3) 2^-24, above gamma_{K+1} for K < 5000. A missing, doubled or
 * misplaced product errs by about sum|ab| / K, far above the bound for K
 * below a few thousand. 1e-30 covers products of bf16 subnormals, which
 * vdpbf16ps flushes to zero. */
#include "backend/cpu/gemm_bf16.h"
#include "core/core.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static float frand(void) {
    return (float)((next_u64() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f -
           1.0f;
}
static int64_t irand(int64_t lo, int64_t hi) { /* [lo, hi] */
    return lo + (int64_t)(next_u64() % (uint64_t)(hi - lo + 1));
}

typedef enum { ROWS, COLS, STRIDED } layout;
static const char *layout_name[] = {"rows", "cols", "strided"};

/* an (R, C) operand: storage filled with random values, strides by layout */
typedef struct {
    void *data;
    ts_dtype dt;
    int64_t rs, cs;
} operand;

static operand make_operand(int64_t R, int64_t C, ts_dtype dt, layout l) {
    operand o = {NULL, dt, 0, 0};
    int64_t n;
    if (l == ROWS) { /* padded rows */
        o.rs = C + 3, o.cs = 1, n = R * o.rs;
    } else if (l == COLS) { /* the transpose of a padded (C, R) matrix */
        o.rs = 1, o.cs = R + 5, n = C * o.cs;
    } else { /* every other element of every other row */
        o.rs = 2 * (2 * C + 1), o.cs = 2, n = R * o.rs;
    }
    size_t es = ts_dtype_size(dt);
    o.data = malloc(es * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        float v = frand();
        if (dt == TS_F32)
            ((float *)o.data)[i] = v;
        else
            ((uint16_t *)o.data)[i] = ts_f32_to_bf16(v);
    }
    return o;
}

static double value_bf16(const operand *o, int64_t r, int64_t c) {
    int64_t i = r * o->rs + c * o->cs;
    if (o->dt == TS_BF16)
        return ts_bf16_to_f32(((const uint16_t *)o->data)[i]);
    return ts_bf16_to_f32(ts_f32_to_bf16(((const float *)o->data)[i]));
}

static int cases_run, worst_case_permille;

/* one product: fast against the reference, within the bound above;
 * columns past N in C (ldc = N + 2) untouched; the pre-packed B gives the
 * same bits. Returns the fast result (caller frees) for bit comparisons. */
static float *check_case(cpu_isa isa, int64_t M, int64_t N, int64_t K,
                         ts_dtype adt, layout al, ts_dtype bdt, layout bl,
                         bool acc, bool packed) {
    operand a = make_operand(M, K, adt, al), b = make_operand(K, N, bdt, bl);
    int64_t ldc = N + 2;
    float *c0 = malloc(sizeof(float) * (size_t)(M * ldc));
    for (int64_t i = 0; i < M * ldc; i++)
        c0[i] = frand();
    float *cf = malloc(sizeof(float) * (size_t)(M * ldc));
    float *cr = malloc(sizeof(float) * (size_t)(M * ldc));
    memcpy(cf, c0, sizeof(float) * (size_t)(M * ldc));
    memcpy(cr, c0, sizeof(float) * (size_t)(M * ldc));
    bool ok = cpu_gemm_bf16(isa, M, N, K, a.data, adt, a.rs, a.cs, b.data, bdt,
                            b.rs, b.cs, cf, ldc, acc);
    CHECK(ok);
    CHECK(cpu_gemm_bf16_reference(M, N, K, a.data, adt, a.rs, a.cs, b.data, bdt,
                                  b.rs, b.cs, cr, ldc, acc));
    /* |a| (M, K) and |b| (N, K) as rounded, for the bound */
    double *aa = malloc(sizeof(double) * (size_t)(M * K + 1));
    double *bb = malloc(sizeof(double) * (size_t)(N * K + 1));
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++)
            aa[m * K + k] = fabs(value_bf16(&a, m, k));
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            bb[n * K + k] = fabs(value_bf16(&b, k, n));
    double worst = 0;
    int64_t bad = 0, untouched = 0;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t n = 0; n < N; n++) {
            double mag = acc ? fabs(c0[m * ldc + n]) : 0;
            for (int64_t k = 0; k < K; k++)
                mag += aa[m * K + k] * bb[n * K + k];
            double tol = (double)(K + 3) * 0x1p-24 * mag + 1e-30;
            double err = fabs((double)cf[m * ldc + n] - cr[m * ldc + n]);
            if (!(err <= tol)) {
                if (bad++ < 3)
                    fprintf(stderr, "  C[%lld,%lld] = %.9g, ref %.9g, tol %g\n",
                            (long long)m, (long long)n, cf[m * ldc + n],
                            cr[m * ldc + n], tol);
            } else if (tol > 0 && err / tol > worst) {
                worst = err / tol;
            }
        }
        for (int64_t n = N; n < ldc; n++)
            untouched += cf[m * ldc + n] == c0[m * ldc + n];
    }
    CHECK(bad == 0);
    CHECK(untouched == M * (ldc - N));
    if (bad || untouched != M * (ldc - N))
        fprintf(stderr,
                "gemm_bf16 M=%lld N=%lld K=%lld A %s %s, B %s %s, acc=%d: "
                "%lld elements out of tolerance, %lld of %lld pads kept\n",
                (long long)M, (long long)N, (long long)K, ts_dtype_name(adt),
                layout_name[al], ts_dtype_name(bdt), layout_name[bl], acc,
                (long long)bad, (long long)untouched,
                (long long)(M * (ldc - N)));
    int permille = (int)(worst * 1000);
    if (permille > worst_case_permille)
        worst_case_permille = permille;
    cases_run++;
    if (packed) {
        cpu_bf16_packed *p =
            cpu_bf16_pack_b(isa, K, N, b.data, bdt, b.rs, b.cs);
        CHECK(p != NULL);
        if (p) {
            CHECK(cpu_bf16_packed_k(p) == K && cpu_bf16_packed_n(p) == N);
            float *cp = malloc(sizeof(float) * (size_t)(M * ldc));
            memcpy(cp, c0, sizeof(float) * (size_t)(M * ldc));
            CHECK(cpu_gemm_bf16_packed(isa, M, a.data, adt, a.rs, a.cs, p, cp,
                                       ldc, acc));
            bool same = memcmp(cp, cf, sizeof(float) * (size_t)(M * ldc)) == 0;
            CHECK(same);
            if (!same)
                fprintf(stderr, "packed B differs: M=%lld N=%lld K=%lld\n",
                        (long long)M, (long long)N, (long long)K);
            free(cp);
            cpu_bf16_packed_free(p);
        }
    }
    free(a.data), free(b.data), free(c0), free(cr), free(aa), free(bb);
    return cf;
}

/* fixed shapes: the edges of every block (tile 8 x 48, K block of 256
 * pairs, 256 rows, tasks of 4 strips), primes, ones; every layout and
 * dtype */
static void test_fixed_shapes(cpu_isa isa) {
    const int64_t shapes[][3] = {
        {1, 1, 1},      {1, 1, 2},     {2, 3, 1},       {8, 48, 2},
        {8, 48, 512},   {7, 47, 511},  {9, 49, 513},    {16, 96, 1024},
        {17, 97, 1023}, {1, 300, 300}, {300, 1, 300},   {300, 300, 1},
        {13, 191, 3},   {257, 193, 7}, {251, 241, 239}, {64, 64, 64},
        {3, 5, 1025},   {40, 200, 33}, {256, 192, 512}, {2, 17, 31}};
    int c = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int al = 0; al < 3; al++)
            for (int bl = 0; bl < 3; bl++, c++) {
                ts_dtype adt = (c & 1) ? TS_BF16 : TS_F32;
                ts_dtype bdt = (c & 2) ? TS_BF16 : TS_F32;
                free(check_case(isa, shapes[s][0], shapes[s][1], shapes[s][2],
                                adt, (layout)al, bdt, (layout)bl, (c / 4) & 1,
                                c % 3 == 0));
            }
}

static void test_random_shapes(cpu_isa isa) {
    for (int i = 0; i < 120; i++) {
        int64_t M = irand(1, 300), N = irand(1, 300), K = irand(1, 300);
        free(check_case(isa, M, N, K, irand(0, 1) ? TS_BF16 : TS_F32,
                        (layout)irand(0, 2), irand(0, 1) ? TS_BF16 : TS_F32,
                        (layout)irand(0, 2), irand(0, 1), i % 4 == 0));
    }
}

/* K long enough for several K blocks and for the packed A block (4 MiB)
 * to hold fewer rows than the product has; one B strip shared out by
 * rows; a K block of two pairs at the end */
static void test_large_blocks(cpu_isa isa) {
    free(check_case(isa, 700, 40, 4096, TS_F32, ROWS, TS_BF16, COLS, false,
                    true));
    free(check_case(isa, 24, 530, 4100, TS_F32, COLS, TS_BF16, COLS, true,
                    true));
}

/* a row's bits do not depend on M or on the other rows: M rows at once
 * (the streaming path up to 64 rows, the blocked one above) against each
 * row alone, and against the blocked path and the packed B at the same M;
 * any layout and dtype, acc on and off */
static void test_rows_alone(cpu_isa isa) {
    const int64_t Ms[] = {1, 2, 7, 8, 9, 31, 63, 64, 65, 66, 130};
    for (int i = 0; i < 40; i++) {
        int64_t M = Ms[i % 11], N = irand(1, 160), K = irand(1, 700);
        ts_dtype adt = irand(0, 1) ? TS_BF16 : TS_F32;
        ts_dtype bdt = irand(0, 1) ? TS_BF16 : TS_F32;
        operand a = make_operand(M, K, adt, (layout)irand(0, 2));
        operand b = make_operand(K, N, bdt, (layout)irand(0, 2));
        bool acc = irand(0, 1);
        int64_t ldc = N + 1;
        size_t bytes = sizeof(float) * (size_t)(M * ldc);
        float *c0 = malloc(bytes), *all = malloc(bytes), *one = malloc(bytes),
              *blk = malloc(bytes), *pk = malloc(bytes);
        for (int64_t j = 0; j < M * ldc; j++)
            c0[j] = frand();
        memcpy(all, c0, bytes), memcpy(one, c0, bytes);
        memcpy(blk, c0, bytes), memcpy(pk, c0, bytes);
        size_t es = ts_dtype_size(adt);
        CHECK(cpu_gemm_bf16(isa, M, N, K, a.data, adt, a.rs, a.cs, b.data, bdt,
                            b.rs, b.cs, all, ldc, acc));
        for (int64_t m = 0; m < M; m++)
            CHECK(cpu_gemm_bf16(isa, 1, N, K,
                                (const char *)a.data + (size_t)(m * a.rs) * es,
                                adt, a.rs, a.cs, b.data, bdt, b.rs, b.cs,
                                one + m * ldc, ldc, acc));
        CHECK(cpu_gemm_bf16_blocked(isa, M, N, K, a.data, adt, a.rs, a.cs,
                                    b.data, bdt, b.rs, b.cs, NULL, blk, ldc,
                                    acc));
        cpu_bf16_packed *p =
            cpu_bf16_pack_b(isa, K, N, b.data, bdt, b.rs, b.cs);
        CHECK(p && cpu_gemm_bf16_packed(isa, M, a.data, adt, a.rs, a.cs, p, pk,
                                        ldc, acc));
        bool same = !memcmp(all, one, bytes) && !memcmp(all, blk, bytes) &&
                    !memcmp(all, pk, bytes);
        CHECK(same);
        if (!same)
            fprintf(stderr,
                    "rows alone: M=%lld N=%lld K=%lld acc=%d: the rows of one "
                    "call, alone, blocked and packed differ\n",
                    (long long)M, (long long)N, (long long)K, acc);
        cpu_bf16_packed_free(p);
        free(a.data), free(b.data), free(c0), free(all), free(one), free(blk),
            free(pk);
    }
}

/* the pool's thread count changes how the work is cut, never a bit of the
 * result */
static void test_threads_same_bits(ts_ctx *ctx, cpu_isa isa) {
    float *r[2];
    for (int t = 0; t < 2; t++) {
        CHECK_OK(ctx, ts_set_num_threads(ctx, t + 1));
        rng = 12345;
        r[t] = check_case(isa, 300, 400, 500, TS_F32, ROWS, TS_BF16, COLS,
                          false, false);
    }
    CHECK(memcmp(r[0], r[1], sizeof(float) * 300 * 402) == 0);
    free(r[0]), free(r[1]);
    CHECK_OK(ctx, ts_set_num_threads(ctx, 2));
}

/* f32 -> bf16 while packing is ts_f32_to_bf16: ties to even, a value that
 * rounds up to Inf, NaN; through both packing paths (pairs along K
 * contiguous and items contiguous) */
static void test_rounding(cpu_isa isa) {
    const float vals[] = {1.00390625f, /* 1 + 2^-8: tie, down to 1 */
                          1.01171875f, /* 1 + 3 2^-8: tie, up to 1 + 2^-6 */
                          -1.00390625f,
                          3.4028235e38f,             /* FLT_MAX -> Inf */
                          1.0f + 0x1p-8f + 0x1p-20f, /* above a tie: up */
                          0.333333343f,
                          -2.5e-3f,
                          65504.0f};
    int n = (int)(sizeof vals / sizeof *vals);
    /* path 0: K = 1; path 1: K = 2 with zeros in the second pair half and
     * the values' matrix stored so that its items are contiguous */
    float two[2 * 8] = {0};
    memcpy(two, vals, sizeof vals);
    uint16_t ones[2] = {ts_f32_to_bf16(1.0f), ts_f32_to_bf16(1.0f)};
    for (int K = 1; K <= 2; K++) {
        float c[8];
        /* as A (n, K): a_rs = 1, a_cs = n */
        CHECK(cpu_gemm_bf16(isa, n, 1, K, two, TS_F32, 1, n, ones, TS_BF16, 1,
                            1, c, 1, false));
        for (int i = 0; i < n; i++)
            CHECK(c[i] == ts_bf16_to_f32(ts_f32_to_bf16(vals[i])));
        /* as B (K, n): b_rs = n, b_cs = 1 */
        CHECK(cpu_gemm_bf16(isa, 1, n, K, ones, TS_BF16, K, 1, two, TS_F32, n,
                            1, c, n, false));
        for (int i = 0; i < n; i++)
            CHECK(c[i] == ts_bf16_to_f32(ts_f32_to_bf16(vals[i])));
    }
    float nan_in[4] = {1, NAN, 2, 3}, fones[4] = {1, 1, 1, 1}, y = 0;
    CHECK(cpu_gemm_bf16(isa, 1, 1, 4, nan_in, TS_F32, 4, 1, fones, TS_F32, 1, 1,
                        &y, 1, false));
    CHECK(isnan(y));
}

/* below AVX512_BF16, or with a dtype it does not take: false, C as it was */
static void test_refusals(void) {
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 1, 1, 1}, c[4] = {7, 7, 7, 7};
    for (int isa = CPU_ISA_SSE2; isa < CPU_ISA_AVX512_BF16; isa++) {
        CHECK(!cpu_gemm_bf16((cpu_isa)isa, 2, 2, 2, a, TS_F32, 2, 1, b, TS_F32,
                             2, 1, c, 2, false));
        CHECK(cpu_bf16_pack_b((cpu_isa)isa, 2, 2, b, TS_F32, 2, 1) == NULL);
    }
    CHECK(!cpu_gemm_bf16(CPU_ISA_AVX512_BF16, 2, 2, 2, a, TS_F16, 2, 1, b,
                         TS_F32, 2, 1, c, 2, false));
    CHECK(!cpu_gemm_bf16(CPU_ISA_AVX512_BF16, 2, 2, 2, a, TS_F32, 2, 1, b,
                         TS_I32, 2, 1, c, 2, false));
    CHECK(!cpu_gemm_bf16_reference(2, 2, 2, a, TS_F16, 2, 1, b, TS_F32, 2, 1, c,
                                   2, false));
    CHECK(!cpu_gemm_bf16_packed(CPU_ISA_AVX2, 2, a, TS_F32, 2, 1, NULL, c, 2,
                                false));
    for (int i = 0; i < 4; i++)
        CHECK(c[i] == 7);
}

/* M, N or K zero: nothing to do, or C = 0 for an empty sum */
static void test_empty(cpu_isa isa) {
    float a[1] = {1}, b[1] = {1}, c[4] = {7, 7, 7, 7};
    CHECK(cpu_gemm_bf16(isa, 0, 2, 2, a, TS_F32, 2, 1, b, TS_F32, 2, 1, c, 2,
                        false));
    CHECK(cpu_gemm_bf16(isa, 2, 0, 2, a, TS_F32, 2, 1, b, TS_F32, 2, 1, c, 2,
                        false));
    CHECK(c[0] == 7 && c[3] == 7);
    CHECK(cpu_gemm_bf16(isa, 2, 2, 0, a, TS_F32, 0, 1, b, TS_F32, 2, 1, c, 2,
                        true));
    CHECK(c[0] == 7 && c[3] == 7);
    CHECK(cpu_gemm_bf16(isa, 2, 2, 0, a, TS_F32, 0, 1, b, TS_F32, 2, 1, c, 2,
                        false));
    CHECK(c[0] == 0 && c[1] == 0 && c[2] == 0 && c[3] == 0);
}

int main(void) {
    ts_ctx *ctx = test_ctx(); /* the pool, with TS_NUM_THREADS threads */
    test_refusals();
    /* the machine's level, or the lower one TS_CPU_ISA asks for */
    cpu_isa isa = cpu_isa_active();
    if (isa < CPU_ISA_AVX512_BF16) {
        printf("SKIP: the CPU level is %s (machine: %s), below avx512_bf16: "
               "the bf16 GEMM cannot run (only its refusals were checked)\n",
               cpu_isa_name(isa), cpu_isa_name(cpu_isa_detected()));
        ts_ctx_free(ctx);
        return test_finish("test_gemm_bf16");
    }
    test_empty(isa);
    test_rounding(isa);
    test_fixed_shapes(isa);
    test_random_shapes(isa);
    test_large_blocks(isa);
    test_rows_alone(isa);
    test_threads_same_bits(ctx, isa);
    printf("%d products against the reference; largest error %.3f of the "
           "bound\n",
           cases_run, worst_case_permille / 1000.0);
    ts_ctx_free(ctx);
    return test_finish("test_gemm_bf16");
}
