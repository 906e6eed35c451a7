/* test_isa.c — the ISA levels: detection agrees with the compiler's own
 * cpuid reading, TS_CPU_ISA is parsed and a level the machine lacks is a
 * clear error, and every level's kernels the machine can run agree with
 * the slow references and with each other. The op-level suites run again
 * at each level through tests/at_isa.sh (tests/CMakeLists.txt). */
#include "backend/cpu/cpu.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 12345;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static void test_detection(void) {
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") &&
                __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                  __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") &&
                  __builtin_cpu_supports("avx512dq");
    bool bf16 = avx512 && __builtin_cpu_supports("avx512vnni") &&
                __builtin_cpu_supports("avx512bf16");
    cpu_isa d = cpu_isa_detected();
    CHECK((d >= CPU_ISA_AVX2) == avx2);
    CHECK((d >= CPU_ISA_AVX512) == avx512);
    CHECK((d >= CPU_ISA_AVX512_BF16) == bf16);
    const cpu_features *f = cpu_features_get();
    CHECK(f->sse2);
    CHECK(f->avx2 == (bool)__builtin_cpu_supports("avx2"));
    char feats[512];
    ts_cpu_features(feats, sizeof feats);
    CHECK(!strncmp(feats, "sse2", 4));
    CHECK((strstr(feats, "avx2") != NULL) == avx2);
    printf("test_isa: machine level %s, in use %s; features: %s\n",
           ts_cpu_isa_max(), ts_cpu_isa(), feats);
    CHECK(!strcmp(ts_cpu_isa_max(), cpu_isa_name(d)));
}

static void test_names(void) {
    for (int i = 0; i < CPU_ISA_COUNT; i++)
        CHECK(cpu_isa_from_name(cpu_isa_name((cpu_isa)i)) == (cpu_isa)i);
    CHECK(cpu_isa_from_name("AVX2") == CPU_ISA_AVX2);
    CHECK(cpu_isa_from_name("avx512bf16") == CPU_ISA_AVX512_BF16);
    CHECK(cpu_isa_from_name("avx3") == CPU_ISA_COUNT);
    CHECK(cpu_isa_from_name("") == CPU_ISA_COUNT);
    CHECK(!strcmp(cpu_isa_name(CPU_ISA_COUNT), "invalid"));
}

/* TS_CPU_ISA naming an unknown level or one above the machine's: the
 * context is refused and the reason says which */
static void test_forcing_errors(void) {
    const char *old = getenv("TS_CPU_ISA");
    char *keep = old ? strdup(old) : NULL;
    char err[512];
    setenv("TS_CPU_ISA", "avx3", 1);
    CHECK(!cpu_isa_init(err, sizeof err));
    CHECK(strstr(err, "TS_CPU_ISA=avx3: unknown level") != NULL);
    ts_ctx *ctx = NULL;
    CHECK(ts_ctx_new(&ctx, NULL) == TS_ERR_UNSUPPORTED && !ctx);
    if (cpu_isa_detected() < CPU_ISA_AMX) {
        setenv("TS_CPU_ISA", "amx", 1);
        CHECK(!cpu_isa_init(err, sizeof err));
        CHECK(strstr(err, "this machine runs at most") != NULL);
        CHECK(strstr(err, cpu_isa_name(cpu_isa_detected())) != NULL);
        CHECK(ts_ctx_new(&ctx, NULL) == TS_ERR_UNSUPPORTED && !ctx);
        CHECK(cpu_kernels_for(CPU_ISA_AMX) == NULL);
    }
    setenv("TS_CPU_ISA", "sse2", 1);
    CHECK(cpu_isa_init(err, sizeof err));
    if (keep)
        setenv("TS_CPU_ISA", keep, 1);
    else
        unsetenv("TS_CPU_ISA");
    free(keep);
}

/* max |a - b| / (1 + |b|) */
static double max_rel(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (1.0 + fabs((double)b[i]));
        m = e > m || isnan(e) ? e : m;
    }
    return m;
}

/* the register-blocked GEMM of fused kernels, each level against the
 * reference, and the levels with FMA against each other bit for bit (the
 * same intrinsics, compiled for wider registers) */
static void test_gemm_levels(void) {
    const int64_t M = 13, N = 37, K = 71;
    float *A = malloc(sizeof(float) * M * K),
          *B = malloc(sizeof(float) * K * N);
    float *ref = malloc(sizeof(float) * M * N),
          *C = malloc(sizeof(float) * M * N);
    float *first = malloc(sizeof(float) * M * N);
    for (int64_t i = 0; i < M * K; i++)
        A[i] = frand();
    for (int64_t i = 0; i < K * N; i++)
        B[i] = frand();
    cpu_gemm_f32_reference(M, N, K, A, K, B, N, ref, N, false);
    bool have_first = false;
    for (int l = 0; l <= (int)cpu_isa_detected(); l++) {
        const cpu_kernel_set *ks = cpu_kernels_for((cpu_isa)l);
        CHECK(ks && (int)ks->isa ==
                        (l == CPU_ISA_AMX ? (int)CPU_ISA_AVX512_BF16 : l));
        if (!ks)
            continue;
        memset(C, 0, sizeof(float) * M * N);
        ks->gemm_f32(M, N, K, A, K, B, N, C, N, false);
        double e = max_rel(C, ref, M * N);
        if (e > 1e-5)
            printf("gemm_f32 at %s: max rel err %g\n", cpu_isa_name(l), e);
        CHECK(e <= 1e-5);
        if (l >= CPU_ISA_AVX2) {
            if (have_first)
                CHECK(!memcmp(C, first, sizeof(float) * M * N));
            memcpy(first, C, sizeof(float) * M * N);
            have_first = true;
        }
    }
    free(A), free(B), free(ref), free(C), free(first);
}

/* decode's bf16/f16 weight products at every level and row count */
static void test_w16_levels(void) {
    const int64_t N = 67, K = 200;
    const int64_t rows[] = {1, 2, 5, 8, 13, 33, 40};
    uint16_t *W = malloc(sizeof(uint16_t) * N * K);
    float *A = malloc(sizeof(float) * 40 * K),
          *Y = malloc(sizeof(float) * 40 * N);
    double *ref = malloc(sizeof(double) * 40 * N),
           *mag = malloc(sizeof(double) * 40 * N);
    for (int bf = 0; bf < 2; bf++) {
        for (int64_t i = 0; i < N * K; i++)
            W[i] = bf ? ts_f32_to_bf16(frand()) : ts_f32_to_f16(frand());
        for (int64_t i = 0; i < 40 * K; i++)
            A[i] = frand();
        for (int64_t r = 0; r < 40; r++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0, m = 0;
                for (int64_t k = 0; k < K; k++) {
                    double t = (double)A[r * K + k] *
                               (bf ? ts_bf16_to_f32(W[n * K + k])
                                   : ts_f16_to_f32(W[n * K + k]));
                    s += t, m += fabs(t);
                }
                ref[r * N + n] = s, mag[r * N + n] = m;
            }
        for (int l = 0; l <= (int)cpu_isa_detected(); l++) {
            const cpu_kernel_set *ks = cpu_kernels_for((cpu_isa)l);
            for (size_t ri = 0; ks && ri < sizeof rows / sizeof *rows; ri++) {
                int64_t R = rows[ri];
                CHECK(ks->gemm_f32_w16t(R, N, K, A, K, W, K, bf, Y));
                double worst = 0;
                for (int64_t i = 0; i < R * N; i++) {
                    /* f32 sums of K products: error ~ K eps sum|a w| */
                    double e = fabs(Y[i] - ref[i]) / (1e-30 + mag[i]);
                    worst = e > worst ? e : worst;
                }
                if (worst > 1e-5)
                    printf("w16 %s R=%lld at %s: rel err %g\n",
                           bf ? "bf16" : "f16", (long long)R, cpu_isa_name(l),
                           worst);
                CHECK(worst <= 1e-5);
            }
        }
    }
    free(W), free(A), free(Y), free(ref), free(mag);
}

/* attention forward (prefill), decode and backward at every level */
static void test_attention_levels(void) {
    cpu_attn_shape p = {.B = 1,
                        .H = 4,
                        .KV = 2,
                        .T = 9,
                        .S = 9,
                        .D = 40,
                        .causal = true,
                        .scale = 0.158f};
    int64_t nq = p.B * p.H * p.T * p.D, nk = p.B * p.KV * p.S * p.D;
    float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk);
    float *o = malloc(4 * nq), *oref = malloc(4 * nq);
    float *lse = malloc(4 * p.B * p.H * p.T),
          *lref = malloc(4 * p.B * p.H * p.T);
    float *dout = malloc(4 * nq), *dq = malloc(4 * nq), *dk = malloc(4 * nk),
          *dv = malloc(4 * nk), *dqr = malloc(4 * nq), *dkr = malloc(4 * nk),
          *dvr = malloc(4 * nk);
    for (int64_t i = 0; i < nq; i++)
        q[i] = frand(), dout[i] = frand();
    for (int64_t i = 0; i < nk; i++)
        k[i] = frand(), v[i] = frand();
    cpu_attention_reference(&p, q, k, v, oref, lref);
    cpu_attention_bwd_reference(&p, q, k, v, dout, dqr, dkr, dvr);
    for (int l = 0; l <= (int)cpu_isa_detected(); l++) {
        const cpu_kernel_set *ks = cpu_kernels_for((cpu_isa)l);
        if (!ks)
            continue;
        ks->attention_fwd(&p, q, k, v, o, lse);
        CHECK(max_rel(o, oref, nq) < 1e-5);
        CHECK(max_rel(lse, lref, p.B * p.H * p.T) < 1e-5);
        ks->attention_bwd(&p, q, k, v, o, lse, dout, dq, dk, dv);
        CHECK(max_rel(dq, dqr, nq) < 1e-4);
        CHECK(max_rel(dk, dkr, nk) < 1e-4);
        CHECK(max_rel(dv, dvr, nk) < 1e-4);
        /* decode: the last query row alone against the whole cache */
        cpu_attn_shape d = p;
        d.T = 1;
        float od[4 * 40], ld[4];
        float q1[4 * 40];
        for (int h = 0; h < 4; h++)
            memcpy(q1 + h * 40, q + (h * 9 + 8) * 40, 4 * 40);
        ks->attention_decode(&d, q1, k, p.KV * p.S * p.D, p.S * p.D, v,
                             p.KV * p.S * p.D, p.S * p.D, od, ld);
        for (int h = 0; h < 4; h++) {
            CHECK(max_rel(od + h * 40, oref + (h * 9 + 8) * 40, 40) < 1e-5);
            CHECK(fabs(ld[h] - lref[h * 9 + 8]) < 1e-4);
        }
    }
    free(q), free(k), free(v), free(o), free(oref), free(lse), free(lref);
    free(dout), free(dq), free(dk), free(dv), free(dqr), free(dkr), free(dvr);
}

int main(void) {
    test_detection();
    test_names();
    test_forcing_errors();
    test_gemm_levels();
    test_w16_levels();
    test_attention_levels();
    return test_finish("test_isa");
}
