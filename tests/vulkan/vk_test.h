/* vk_test.h — what the Vulkan tests share: a context with vulkan:0 (or the
 * test exits 77, which CTest reports as skipped, naming what is missing),
 * moving tensors there and back, and comparing a Vulkan result with the
 * CPU backend's. Each tests/vulkan/test_vk_*.c is one CTest test. */
#ifndef TS_VK_TEST_H
#define TS_VK_TEST_H

#include "test_util.h"

#include <stdlib.h>

#define VK0  ((ts_device){TS_DEVICE_VULKAN, 0})
#define CPU0 ((ts_device){TS_DEVICE_CPU, 0})

/* A context whose device vulkan:0 exists; exits 77 (skipped) otherwise. */
static inline ts_ctx *vkt_ctx(const char *test) {
    ts_ctx *ctx = test_ctx();
    if (ts_device_count(ctx, TS_DEVICE_VULKAN) < 1) {
        printf("%s: skipped: no Vulkan device (%s)\n", test, ts_errmsg(ctx));
        ts_ctx_free(ctx);
        exit(77);
    }
    return ctx;
}

/* t on vulkan:0 / on the CPU (new references; t is kept) */
static inline ts_tensor *vkt_up(ts_tensor *t) {
    return ts_to_device(t, VK0);
}
static inline ts_tensor *vkt_down(ts_tensor *t) {
    return ts_to_device(t, CPU0);
}

/* got (on vulkan:0) against want (on the CPU): test_allclose after moving
 * got to the CPU. Returns test_allclose's figure (<= 1 passes), 1e30 when
 * got is NULL or cannot come back. */
static inline double vkt_close(const char *what, ts_tensor *got,
                               ts_tensor *want, double rtol, double atol) {
    ts_test_checks++;
    ts_tensor *h = got ? vkt_down(got) : NULL;
    if (!h) {
        ts_test_failures++;
        fprintf(stderr, "%s: no result on the device (%s)\n", what,
                want ? ts_errmsg(ts_tensor_ctx(want)) : "");
        return 1e30;
    }
    ts_test_checks--; /* test_allclose counts its own check */
    double r = test_allclose(what, h, want, rtol, atol);
    ts_release(h);
    return r;
}

/* m's forward on ids eager, then compiled (ts_sync), both brought back
 * and compared to 1e-5 under the name what */
#include "tessera_models.h"
static inline void vkt_eager_vs_compiled(ts_ctx *ctx, ts_decoder *m,
                                         ts_tensor *ids, const char *what) {
    ts_tensor *eager = ts_decoder_forward(m, ids, 0);
    ts_tensor *eh = eager ? vkt_down(eager) : NULL;
    ts_set_mode(ctx, TS_MODE_COMPILED);
    ts_tensor *comp = ts_decoder_forward(m, ids, 0);
    CHECK_OK(ctx, ts_sync(ctx));
    ts_tensor *ch = comp ? vkt_down(comp) : NULL;
    ts_set_mode(ctx, TS_MODE_EAGER);
    test_allclose(what, ch, eh, 1e-5, 1e-5);
    ts_release(eh), ts_release(ch), ts_release(eager), ts_release(comp);
}

#endif
