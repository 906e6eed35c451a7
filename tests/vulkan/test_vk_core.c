/* test_vk_core.c — the Vulkan backend's core: devices listed, memory
 * (sub-allocated, counted, reused), transfers both ways for every dtype,
 * fills, element access and printing of device tensors, and the errors a
 * user gets (bad device names, out-of-range indices, mixed devices). */
#include "backend/vulkan/vk_internal.h"
#include "vk_test.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_devices(ts_ctx *ctx) {
    int n = ts_device_count(ctx, TS_DEVICE_VULKAN);
    CHECK(n >= 1);
    ts_device_info info;
    CHECK_OK(ctx, ts_device_info_get(ctx, VK0, &info));
    CHECK(info.name[0] != 0);
    CHECK(info.total_bytes > 0);
    printf("vulkan:0: %s [%s] %s, %.1f GiB, %s\n", info.name, info.type,
           info.driver, (double)info.total_bytes / (1 << 30), info.features);
    ts_device d;
    CHECK_OK(ctx, ts_device_parse(ctx, "vulkan", &d));
    CHECK(d.kind == TS_DEVICE_VULKAN && d.index == 0);
    CHECK(ts_device_parse(ctx, "vulkan:7", &d) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "vulkan:0..vulkan:");
    CHECK(ts_device_parse(ctx, "vulcan:0", &d) == TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "expected cpu");
    char buf[16];
    CHECK(!strcmp(ts_device_name(VK0, buf), "vulkan:0"));
}

static void test_roundtrip(ts_ctx *ctx) {
    const ts_dtype dts[] = {TS_F32, TS_BF16, TS_F16, TS_I32, TS_I64};
    const int64_t sizes[] = {1, 3, 17, 1000, 300000};
    for (size_t a = 0; a < 5; a++)
        for (size_t b = 0; b < 5; b++) {
            int64_t shape[1] = {sizes[b]};
            ts_tensor *h = ts_randn(ctx, TS_F32, 1, shape, 10.0, 7 + b);
            ts_tensor *hc = ts_cast(h, dts[a]);
            ts_tensor *dv = vkt_up(hc);
            CHECK(dv && ts_tensor_device(dv).kind == TS_DEVICE_VULKAN);
            CHECK(ts_tensor_data(dv) == NULL); /* not host memory */
            ts_tensor *back = vkt_down(dv);
            size_t bytes = (size_t)sizes[b] * ts_dtype_size(dts[a]);
            CHECK(back &&
                  !memcmp(ts_tensor_data(back), ts_tensor_data(hc), bytes));
            ts_release(back), ts_release(dv), ts_release(hc), ts_release(h);
        }
}

static void test_fill_and_access(ts_ctx *ctx) {
    CHECK_OK(ctx, ts_set_device(ctx, VK0));
    int64_t shape[2] = {5, 7};
    ts_tensor *z = ts_zeros(ctx, TS_BF16, 2, shape);
    ts_tensor *f = ts_full(ctx, TS_F32, 2, shape, 2.5);
    ts_tensor *r = ts_randn(ctx, TS_F32, 2, shape, 1.0, 3);
    ts_tensor *ar = ts_arange(ctx, TS_I64, 0, 10, 1);
    CHECK(ts_tensor_device(z).kind == TS_DEVICE_VULKAN);
    CHECK(ts_tensor_device(r).kind == TS_DEVICE_VULKAN);
    double v = -1;
    int64_t idx[2] = {4, 6};
    CHECK_OK(ctx, ts_get(z, idx, &v));
    CHECK(v == 0);
    CHECK_OK(ctx, ts_get(f, idx, &v));
    CHECK(v == 2.5);
    CHECK_OK(ctx, ts_set(f, idx, -1.25));
    CHECK_OK(ctx, ts_get(f, idx, &v));
    CHECK(v == -1.25);
    int64_t i7 = 7;
    CHECK_OK(ctx, ts_get(ar, &i7, &v));
    CHECK(v == 7);
    idx[0] = 5;
    CHECK(ts_get(f, idx, &v) == TS_ERR_RANGE);
    /* the same numbers as the host's generator */
    CHECK_OK(ctx, ts_set_device(ctx, CPU0));
    ts_tensor *rh = ts_randn(ctx, TS_F32, 2, shape, 1.0, 3);
    CHECK(vkt_close("randn on vulkan", r, rh, 0, 0) <= 1);
    char *s = ts_to_string(f);
    CHECK(s && strstr(s, "device='vulkan:0'") && strstr(s, "2.5000"));
    free(s);
    ts_tensor *one = ts_slice(f, 0, 1, 2, 1); /* a row view */
    double item = 0;
    ts_tensor *e = one ? ts_slice(one, 1, 3, 4, 1) : NULL;
    CHECK_OK(ctx, ts_item(e, &item));
    CHECK(item == 2.5);
    /* an op across devices names both */
    ts_tensor *bad = ts_add(f, rh);
    CHECK(bad == NULL);
    CHECK_MSG(ctx, "vulkan:0 and cpu:0");
    ts_clear_error(ctx);
    ts_release(e), ts_release(one), ts_release(rh), ts_release(ar);
    ts_release(r), ts_release(f), ts_release(z);
}

static void test_memory(ts_ctx *ctx) {
    ts_device_stats st0, st1;
    ts_device_get_stats(ctx, VK0, &st0);
    int64_t shape[1] = {1 << 20};
    ts_tensor *h = ts_zeros(ctx, TS_F32, 1, shape);
    /* many tensors of one size: carved from blocks, freed chunks reused */
    for (int round = 0; round < 3; round++) {
        ts_tensor *ts[64];
        for (int i = 0; i < 64; i++)
            ts[i] = vkt_up(h);
        ts_device_get_stats(ctx, VK0, &st1);
        CHECK(st1.bytes_in_use == st0.bytes_in_use + 64 * (4u << 20));
        for (int i = 0; i < 64; i++)
            ts_release(ts[i]);
    }
    ts_device_get_stats(ctx, VK0, &st1);
    CHECK(st1.bytes_in_use == st0.bytes_in_use);
    /* a tensor larger than a block gets its own */
    int64_t big[1] = {100 << 20};
    ts_tensor *hb = ts_full(ctx, TS_BF16, 1, big, 1.0);
    ts_tensor *db = vkt_up(hb);
    CHECK(db != NULL);
    int64_t last = (100 << 20) - 1;
    double v = 0;
    CHECK_OK(ctx, ts_get(db, &last, &v));
    CHECK(v == 1.0);
    ts_release(db), ts_release(hb), ts_release(h);
    /* more than the device has: a clear out-of-memory error */
    ts_device_info info;
    CHECK_OK(ctx, ts_device_info_get(ctx, VK0, &info));
    CHECK_OK(ctx, ts_set_device(ctx, VK0));
    int64_t huge[1] = {(int64_t)(info.total_bytes / 2) * 3};
    ts_tensor *oom = ts_empty(ctx, TS_BF16, 1, huge);
    CHECK(oom == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_OOM);
    CHECK_MSG(ctx, "bytes");
    ts_clear_error(ctx);
    CHECK_OK(ctx, ts_set_device(ctx, CPU0));
}

/* the pipelines built are kept on disk for the next run: a file per
 * device and driver in $TS_VK_PIPELINE_CACHE, which a new context loads */
static void test_pipeline_cache(void) {
    char dir[] = "/tmp/ts_vk_cacheXXXXXX";
    if (!mkdtemp(dir))
        return;
    const char *old = getenv("TS_VK_PIPELINE_CACHE");
    char *keep = old ? strdup(old) : NULL;
    setenv("TS_VK_PIPELINE_CACHE", dir, 1);
    for (int round = 0; round < 2; round++) { /* write, then read back */
        ts_ctx *ctx = test_ctx();
        CHECK_OK(ctx, ts_set_device(ctx, VK0));
        int64_t shape[1] = {10};
        ts_tensor *a = ts_full(ctx, TS_F32, 1, shape, 1.5);
        double v = 0;
        int64_t i = 9;
        CHECK_OK(ctx, ts_get(a, &i, &v));
        CHECK(v == 1.5);
        ts_release(a);
        ts_ctx_free(ctx);
    }
    DIR *d = opendir(dir);
    int files = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, "vk-pipelines-", 13)) {
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            FILE *f = fopen(path, "rb");
            long n = f && !fseek(f, 0, SEEK_END) ? ftell(f) : 0;
            if (f)
                fclose(f);
            files += n > 0;
            remove(path);
        }
    if (d)
        closedir(d);
    rmdir(dir);
    CHECK(files == 1);
    if (keep)
        setenv("TS_VK_PIPELINE_CACHE", keep, 1);
    else
        unsetenv("TS_VK_PIPELINE_CACHE");
    free(keep);
}

/* a device the driver reports lost (simulated: the flag the backend sets on
 * VK_ERROR_DEVICE_LOST or a wait past TS_VK_TIMEOUT_S): every later call
 * on it fails at once with a message saying so, nothing waits, the host
 * and the context's release still work */
static void test_lost_device(void) {
    ts_ctx *ctx = test_ctx();
    CHECK_OK(ctx, ts_set_device(ctx, VK0));
    int64_t shape[1] = {1000};
    ts_tensor *a = ts_full(ctx, TS_F32, 1, shape, 2.0);
    vk_dev *d = vk_dev_get(ctx, 0);
    CHECK(d != NULL);
    if (d)
        d->lost = true;
    ts_tensor *b = a ? ts_mul_scalar(a, 3.0) : NULL;
    CHECK(b == NULL && ts_ctx_status(ctx) == TS_ERR_STATE);
    CHECK_MSG(ctx, "lost");
    ts_clear_error(ctx);
    double v = 0;
    int64_t i = 0;
    CHECK(ts_get(a, &i, &v) != TS_OK);
    CHECK_MSG(ctx, "lost");
    ts_clear_error(ctx);
    CHECK(ts_device_sync(ctx, VK0) == TS_OK || ts_ctx_status(ctx) != TS_OK);
    ts_clear_error(ctx);
    ts_tensor *c = ts_zeros(ctx, TS_F32, 1, shape);
    CHECK(c == NULL);
    CHECK_MSG(ctx, "lost");
    ts_clear_error(ctx);
    /* the host is unaffected */
    CHECK_OK(ctx, ts_set_device(ctx, CPU0));
    ts_tensor *h = ts_full(ctx, TS_F32, 1, shape, 1.0);
    CHECK_OK(ctx, ts_get(h, &i, &v));
    CHECK(v == 1.0);
    ts_release(h), ts_release(c), ts_release(b), ts_release(a);
    ts_ctx_free(ctx);
}

int main(void) {
    ts_ctx *ctx = vkt_ctx("test_vk_core");
    test_devices(ctx);
    test_roundtrip(ctx);
    test_fill_and_access(ctx);
    test_memory(ctx);
    ts_ctx_free(ctx);
    test_pipeline_cache();
    test_lost_device();
    /* no Vulkan device: a named error (a device index past the count) */
    return test_finish("test_vk_core");
}
