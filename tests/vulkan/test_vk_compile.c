/* test_vk_compile.c — the compiler's passes on Vulkan tensors, each against
 * eager CPU: the fused-kernel rewrite (rmsnorm written op by op; its saved
 * statistic lives on the device), rematerialization in a graph whose arena
 * is on one device and a recomputed node on the other (both directions),
 * and empty tensors on the device. Run under ASan in `make test`: the
 * failures these guard against were writes to freed or foreign memory. */
#include "vk_test.h"

#include <stdlib.h>

static ts_tensor *rmsnorm_by_hand(ts_ctx *ctx) {
    int64_t xs[3] = {2, 16, 64}, ws = 64;
    ts_tensor *x = ts_randn(ctx, TS_F32, 3, xs, 1, 1);
    ts_tensor *w = ts_randn(ctx, TS_F32, 1, &ws, 1, 2);
    ts_tensor *sq = ts_mul(x, x);
    int last = -1;
    ts_tensor *ms = ts_mean(sq, 1, &last, true);
    ts_tensor *a = ts_add_scalar(ms, 1e-6);
    ts_tensor *r = ts_rsqrt(a);
    ts_tensor *y = ts_mul(x, r);
    ts_tensor *norm = ts_mul(y, w);
    ts_tensor *tmp[] = {x, w, sq, ms, a, r, y};
    for (int i = 0; i < 7; i++)
        ts_release(tmp[i]);
    return norm;
}

static void test_rewrite(ts_ctx *ctx) {
    ts_tensor *want = rmsnorm_by_hand(ctx);
    CHECK_OK(ctx, ts_set_device(ctx, VK0));
    ts_set_mode(ctx, TS_MODE_COMPILED);
    bool g = ts_set_grad_enabled(ctx, false);
    ts_tensor *got = rmsnorm_by_hand(ctx);
    CHECK_OK(ctx, ts_sync(ctx));
    ts_compile_stats cs;
    ts_get_compile_stats(ctx, &cs);
    CHECK(cs.patterns_rewritten >= 1);
    ts_set_mode(ctx, TS_MODE_EAGER);
    ts_set_grad_enabled(ctx, g);
    CHECK_OK(ctx, ts_set_device(ctx, CPU0));
    vkt_close("rmsnorm rewritten on vulkan", got, want, 1e-5, 1e-6);
    ts_release(want), ts_release(got);
}

/* the arena on A (the first result's device), a cheap node on B read
 * early and again 40 nodes later */
static ts_tensor *remat_graph(ts_ctx *ctx, ts_device A, ts_device B,
                              ts_tensor **keep) {
    int64_t sh[1] = {4096};
    ts_set_device(ctx, A);
    ts_tensor *xa = ts_randn(ctx, TS_F32, 1, sh, 1, 1);
    ts_set_device(ctx, B);
    ts_tensor *xb = ts_randn(ctx, TS_F32, 1, sh, 1, 2);
    *keep = ts_mul_scalar(xa, 2.0);
    ts_tensor *a = ts_silu(xb);
    ts_tensor *c = ts_add_scalar(a, 1.0);
    for (int i = 0; i < 40; i++) {
        ts_tensor *s = ts_tanh(c); /* bounded: errors do not grow */
        ts_tensor *e = ts_add(c, s);
        ts_tensor *n = ts_mul_scalar(e, 0.5);
        ts_release(s), ts_release(e), ts_release(c);
        c = n;
    }
    ts_tensor *out = ts_add(c, a);
    ts_release(xa), ts_release(xb), ts_release(a), ts_release(c);
    ts_set_device(ctx, CPU0);
    return out;
}

static void test_remat_two_devices(ts_ctx *ctx) {
    for (int rev = 0; rev < 2; rev++) {
        ts_device A = rev ? VK0 : CPU0, B = rev ? CPU0 : VK0;
        ts_tensor *k1, *k2;
        ts_tensor *want = remat_graph(ctx, CPU0, CPU0, &k1);
        ts_set_mode(ctx, TS_MODE_COMPILED);
        bool g = ts_set_grad_enabled(ctx, false);
        ts_tensor *got = remat_graph(ctx, A, B, &k2);
        CHECK_OK(ctx, ts_sync(ctx));
        ts_set_mode(ctx, TS_MODE_EAGER);
        ts_set_grad_enabled(ctx, g);
        ts_tensor *h = got ? vkt_down(got) : NULL;
        test_allclose(rev ? "remat, arena on vulkan" : "remat, arena on cpu", h,
                      want, 1e-5, 1e-6);
        ts_release(h), ts_release(want), ts_release(got);
        ts_release(k1), ts_release(k2);
    }
}

static void test_empty(ts_ctx *ctx) {
    CHECK_OK(ctx, ts_set_device(ctx, VK0));
    int64_t sh[1] = {0};
    float x = 0;
    ts_tensor *t = ts_from_data(ctx, TS_F32, 1, sh, &x);
    CHECK(t != NULL);
    ts_tensor *u = t ? ts_add_scalar(t, 1.0) : NULL;
    CHECK(u != NULL && ts_tensor_numel(u) == 0);
    ts_tensor *h = u ? vkt_down(u) : NULL;
    CHECK(h != NULL);
    CHECK_OK(ctx, ts_device_sync(ctx, VK0));
    ts_release(h), ts_release(u), ts_release(t);
    CHECK_OK(ctx, ts_set_device(ctx, CPU0));
}

int main(void) {
    ts_ctx *ctx = vkt_ctx("test_vk_compile");
    test_rewrite(ctx);
    test_remat_two_devices(ctx);
    test_empty(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_vk_compile");
}
