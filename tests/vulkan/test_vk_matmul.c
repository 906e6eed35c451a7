/* test_vk_matmul.c — TS_OP_MATMUL on vulkan:0 against the CPU backend:
 * f32, bf16 and f32 x bf16 operands; odd sizes (1, 3, 17, 65, 1000) in M, N
 * and K through both shaders (mm_gemv for M <= 8, mm_tiled above);
 * transposed, sliced and expanded operands as views; batch dims broadcast;
 * 1-D operands; backward (both operands' gradients); and, for information,
 * the GFLOP/s of a 512^3 f32 product.
 *
 * Tolerances: inputs are N(0, 1), so a result element is a sum of K terms
 * of size ~1 and its f32 rounding error grows with the reduction length:
 * f32 results rtol 1e-5, atol 1e-5 * sqrt(K); bf16 results are rounded
 * once from f32 sums that may differ in their last bits, so they may land
 * one bf16 step apart: rtol 8e-3 (2^-7), same atol. */
#include "vk_test.h"

#include "backend/vulkan/vk.h"

#include <math.h>
#include <time.h>

/* how an operand reaches the matmul */
enum { PLAIN, TRANSPOSED, SLICED, EXPANDED };

typedef struct {
    ts_dtype dt;
    int ndim;
    int64_t shape[4]; /* as the matmul sees it */
    int view;
} operand;

/* libtessera is a static archive and vk_backend.c names its kernels with
 * weak references, which do not pull k_matmul.o out of the archive: this
 * strong one does (without it the backend reports no kernel for matmul). */
vk_kernel ts_test_vk_matmul_link = vk_k_matmul;

static ts_ctx *ctx;
static uint64_t seed = 1;

/* the view of base that o asks for (a new reference) */
static ts_tensor *view_of(ts_tensor *base, const operand *o) {
    int nd = o->ndim;
    switch (o->view) {
    case TRANSPOSED:
        return ts_transpose(base, nd - 1, nd - 2);
    case SLICED: {
        ts_tensor *r = ts_slice(base, nd - 2, 1, o->shape[nd - 2] + 1, 1);
        ts_tensor *c = ts_slice(r, nd - 1, 2, o->shape[nd - 1] + 2, 1);
        ts_release(r);
        return c;
    }
    case EXPANDED:
        return ts_expand(base, nd, o->shape);
    default:
        return ts_retain(base);
    }
}

/* the stored tensor behind o: shape swapped, padded or with a 1 in front */
static ts_tensor *base_of(const operand *o) {
    int64_t sh[4];
    int nd = o->ndim;
    memcpy(sh, o->shape, sizeof sh);
    if (o->view == TRANSPOSED) {
        sh[nd - 1] = o->shape[nd - 2];
        sh[nd - 2] = o->shape[nd - 1];
    } else if (o->view == SLICED) {
        sh[nd - 2] += 2;
        sh[nd - 1] += 5;
    } else if (o->view == EXPANDED) {
        sh[0] = 1;
    }
    return ts_randn(ctx, o->dt, nd, sh, 1.0, seed++);
}

static double tol_rtol(ts_dtype dt) {
    return dt == TS_F32 ? 1e-5 : 8e-3;
}

/* a @ b on both devices, compared */
static void check_case(const char *what, operand a, operand b) {
    ts_tensor *ba = base_of(&a), *bb = base_of(&b);
    ts_tensor *ua = vkt_up(ba), *ub = vkt_up(bb);
    ts_tensor *ca = view_of(ba, &a), *cb = view_of(bb, &b);
    ts_tensor *va = view_of(ua, &a), *vb = view_of(ub, &b);
    /* f32 x bf16: against the weights widened exactly (the CPU's own mixed
     * product rounds many rows' activations to bf16 at AVX512_BF16) */
    ts_tensor *cbw =
        a.dt == TS_F32 && b.dt == TS_BF16 ? ts_cast(cb, TS_F32) : ts_retain(cb);
    ts_tensor *want = ts_matmul(ca, cbw), *got = ts_matmul(va, vb);
    ts_release(cbw);
    CHECK(want != NULL);
    int64_t K = a.shape[a.ndim - 1];
    double atol = 1e-5 * sqrt((double)(K > 1 ? K : 1));
    if (want)
        vkt_close(what, got, want, tol_rtol(a.dt), atol);
    ts_release(want), ts_release(got);
    ts_release(ca), ts_release(cb), ts_release(va), ts_release(vb);
    ts_release(ua), ts_release(ub), ts_release(ba), ts_release(bb);
}

#define OP2(dt, m, n)    ((operand){dt, 2, {m, n}, PLAIN})
#define OPV(dt, m, n, v) ((operand){dt, 2, {m, n}, v})

/* 2-D products: odd edges through both shaders, both dtypes */
static void test_sizes(ts_dtype dt) {
    const int64_t mnk[][3] = {
        {1, 17, 1000}, {17, 3, 65}, {130, 129, 70}, {3, 1000, 17},
        {8, 65, 33},   {9, 65, 33}, {65, 1, 17},    {1, 1, 1},
        {1000, 17, 3}, {5, 7, 1},   {64, 64, 64},   {2, 1000, 65},
    };
    char what[96];
    for (size_t i = 0; i < sizeof mnk / sizeof mnk[0]; i++) {
        int64_t M = mnk[i][0], N = mnk[i][1], K = mnk[i][2];
        snprintf(what, sizeof what, "%s (%lldx%lld)@(%lldx%lld)",
                 ts_dtype_name(dt), (long long)M, (long long)K, (long long)K,
                 (long long)N);
        check_case(what, OP2(dt, M, K), OP2(dt, K, N));
    }
}

/* x @ W^T with W a row-major (N, K) weight, and other views */
static void test_views(ts_dtype dt) {
    const int64_t mnk[][3] = {
        {1, 1000, 65}, {3, 17, 1000}, {8, 129, 70}, {130, 129, 70}, {17, 3, 65},
    };
    char what[96];
    for (size_t i = 0; i < sizeof mnk / sizeof mnk[0]; i++) {
        int64_t M = mnk[i][0], N = mnk[i][1], K = mnk[i][2];
        snprintf(what, sizeof what, "%s x(%lldx%lld) @ W^T, W (%lldx%lld)",
                 ts_dtype_name(dt), (long long)M, (long long)K, (long long)N,
                 (long long)K);
        check_case(what, OP2(dt, M, K), OPV(dt, K, N, TRANSPOSED));
        snprintf(what, sizeof what, "%s A^T @ B^T (%lld, %lld, %lld)",
                 ts_dtype_name(dt), (long long)M, (long long)N, (long long)K);
        check_case(what, OPV(dt, M, K, TRANSPOSED), OPV(dt, K, N, TRANSPOSED));
        snprintf(what, sizeof what, "%s sliced (%lld, %lld, %lld)",
                 ts_dtype_name(dt), (long long)M, (long long)N, (long long)K);
        check_case(what, OPV(dt, M, K, SLICED), OPV(dt, K, N, SLICED));
    }
}

/* f32 activations times bf16 weights (an f32 result), as the CPU allows */
static void test_mixed(void) {
    check_case("f32 x bf16 W^T decode", OP2(TS_F32, 1, 1000),
               OPV(TS_BF16, 1000, 17, TRANSPOSED));
    check_case("f32 x bf16 W^T", OP2(TS_F32, 130, 70),
               OPV(TS_BF16, 70, 129, TRANSPOSED));
    check_case("f32 x bf16 plain", OP2(TS_F32, 17, 65), OP2(TS_BF16, 65, 3));
    check_case("f32 x bf16 (5 rows)", OP2(TS_F32, 5, 65), OP2(TS_BF16, 65, 33));
}

/* batch dims broadcast: size-1 dims, missing dims, expanded views */
static void test_batched(ts_dtype dt) {
    check_case("batched (2,3,17,65)@(3,65,33)",
               (operand){dt, 4, {2, 3, 17, 65}, PLAIN},
               (operand){dt, 3, {3, 65, 33}, PLAIN});
    check_case("batched (4,1,5,20)@(1,3,20,7)",
               (operand){dt, 4, {4, 1, 5, 20}, PLAIN},
               (operand){dt, 4, {1, 3, 20, 7}, PLAIN});
    check_case("batched (3,70,33)@W^T (shared weight)",
               (operand){dt, 3, {3, 70, 33}, PLAIN},
               OPV(dt, 33, 65, TRANSPOSED));
    check_case("batched (17,65)@(2,65,3)", OP2(dt, 17, 65),
               (operand){dt, 3, {2, 65, 3}, PLAIN});
    check_case("batched decode (4,1,64)@(4,64,37)^T",
               (operand){dt, 3, {4, 1, 64}, PLAIN},
               (operand){dt, 3, {4, 64, 37}, TRANSPOSED});
    check_case("batched expanded (3,5,20)@(3,20,7)",
               (operand){dt, 3, {3, 5, 20}, EXPANDED},
               (operand){dt, 3, {3, 20, 7}, EXPANDED});
    /* enough tiles for mm_tiled's 64 x 64 and 128 x 128 tilings, with
     * ragged edges */
    check_case("batched (4,130,70)@(70,129) (64-tiles)",
               (operand){dt, 3, {4, 130, 70}, PLAIN}, OP2(dt, 70, 129));
    check_case("batched (32,129,20)@(32,20,129)^T (128-tiles)",
               (operand){dt, 3, {32, 129, 20}, PLAIN},
               (operand){dt, 3, {32, 20, 129}, TRANSPOSED});
    check_case("batched transposed (2,3,17,65)^T@(2,3,65,9)^T",
               (operand){dt, 4, {2, 3, 17, 65}, TRANSPOSED},
               (operand){dt, 4, {2, 3, 65, 9}, TRANSPOSED});
}

/* NumPy's 1-D rule: (K) @ (K, N) and (M, K) @ (K) */
static void test_vectors(void) {
    int64_t k = 65, sa[2] = {17, 65}, sb[2] = {65, 3};
    ts_tensor *v = ts_randn(ctx, TS_F32, 1, &k, 1.0, seed++);
    ts_tensor *A = ts_randn(ctx, TS_F32, 2, sa, 1.0, seed++);
    ts_tensor *B = ts_randn(ctx, TS_F32, 2, sb, 1.0, seed++);
    ts_tensor *uv = vkt_up(v), *uA = vkt_up(A), *uB = vkt_up(B);
    ts_tensor *w1 = ts_matmul(v, B), *g1 = ts_matmul(uv, uB);
    ts_tensor *w2 = ts_matmul(A, v), *g2 = ts_matmul(uA, uv);
    double atol = 1e-5 * sqrt(65.0);
    vkt_close("1-D (65)@(65x3)", g1, w1, 1e-5, atol);
    vkt_close("1-D (17x65)@(65)", g2, w2, 1e-5, atol);
    CHECK(g1 && ts_tensor_ndim(g1) == 1 && ts_tensor_dim(g1, 0) == 3);
    CHECK(g2 && ts_tensor_ndim(g2) == 1 && ts_tensor_dim(g2, 0) == 17);
    ts_release(w1), ts_release(g1), ts_release(w2), ts_release(g2);
    ts_release(uv), ts_release(uA), ts_release(uB);
    ts_release(v), ts_release(A), ts_release(B);
}

/* K = 0: a result of zeros */
static void test_empty_k(void) {
    int64_t sa[2] = {3, 0}, sb[2] = {0, 4};
    ts_tensor *A = ts_zeros(ctx, TS_F32, 2, sa),
              *B = ts_zeros(ctx, TS_F32, 2, sb);
    ts_tensor *uA = vkt_up(A), *uB = vkt_up(B);
    ts_tensor *want = ts_matmul(A, B), *got = ts_matmul(uA, uB);
    vkt_close("K = 0", got, want, 0, 0);
    ts_release(want), ts_release(got), ts_release(uA), ts_release(uB);
    ts_release(A), ts_release(B);
}

/* grads of both operands through ts_backward, seeded with a random dY;
 * a 3-D x against a 2-D weight takes the folded dW = x^T @ dY path */
static void backward_case(const char *what, int an, const int64_t *sa,
                          int64_t K, int64_t N) {
    int64_t sb[2] = {K, N}, sy[4];
    memcpy(sy, sa, sizeof(int64_t) * (size_t)an);
    sy[an - 1] = N;
    ts_tensor *A = ts_randn(ctx, TS_F32, an, sa, 1.0, seed++);
    ts_tensor *B = ts_randn(ctx, TS_F32, 2, sb, 1.0, seed++);
    ts_tensor *G = ts_randn(ctx, TS_F32, an, sy, 1.0, seed++);
    ts_tensor *uA = vkt_up(A), *uB = vkt_up(B), *uG = vkt_up(G);
    ts_set_requires_grad(A, true), ts_set_requires_grad(B, true);
    ts_set_requires_grad(uA, true), ts_set_requires_grad(uB, true);
    ts_tensor *yc = ts_matmul(A, B), *yv = ts_matmul(uA, uB);
    CHECK_OK(ctx, ts_backward(yc, G));
    CHECK_OK(ctx, ts_backward(yv, uG));
    /* the reductions are over N (dA) and the rows (dB) */
    int64_t rows = ts_tensor_numel(A) / K;
    char w[96];
    snprintf(w, sizeof w, "%s dA", what);
    vkt_close(w, ts_grad(uA), ts_grad(A), 1e-5, 1e-5 * sqrt((double)N));
    snprintf(w, sizeof w, "%s dB", what);
    vkt_close(w, ts_grad(uB), ts_grad(B), 1e-5, 1e-5 * sqrt((double)rows));
    ts_release(yc), ts_release(yv);
    ts_release(uA), ts_release(uB), ts_release(uG);
    ts_release(A), ts_release(B), ts_release(G);
}

static void test_backward(void) {
    int64_t s2[2] = {17, 65}, s3[3] = {2, 9, 33};
    backward_case("backward (17x65)@(65x3)", 2, s2, 65, 3);
    backward_case("backward (2,9,33)@(33x17)", 3, s3, 33, 17);
}

static double now_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* informational: 512^3 f32 on this device (a warm-up run first) */
static void report_gflops(void) {
    int64_t s[2] = {512, 512};
    ts_tensor *A = ts_randn(ctx, TS_F32, 2, s, 1.0, seed++);
    ts_tensor *B = ts_randn(ctx, TS_F32, 2, s, 1.0, seed++);
    ts_tensor *uA = vkt_up(A), *uB = vkt_up(B);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        ts_tensor *y = ts_matmul(uA, uB);
        CHECK_OK(ctx, ts_sync(ctx));
        int64_t idx[2] = {0, 0};
        double v;
        CHECK_OK(ctx, ts_get(y, idx, &v));
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
        ts_release(y);
    }
    ts_tensor *want = ts_matmul(A, B), *got = ts_matmul(uA, uB);
    vkt_close("f32 512^3", got, want, 1e-5, 1e-5 * sqrt(512.0));
    ts_release(want), ts_release(got);
    printf("matmul 512^3 f32 on vulkan:0: %.1f ms, %.2f GFLOP/s\n", best * 1e3,
           2.0 * 512 * 512 * 512 / best * 1e-9);
    ts_release(uA), ts_release(uB), ts_release(A), ts_release(B);
}

int main(void) {
    ctx = vkt_ctx("test_vk_matmul");
    test_sizes(TS_F32);
    test_sizes(TS_BF16);
    test_views(TS_F32);
    test_views(TS_BF16);
    test_mixed();
    test_batched(TS_F32);
    test_batched(TS_BF16);
    test_vectors();
    test_empty_k();
    test_backward();
    report_gflops();
    ts_ctx_free(ctx);
    return test_finish("test_vk_matmul");
}
