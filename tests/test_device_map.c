/* test_device_map.c — device placement: device_map strings (one device,
 * "auto", explicit splits) place the embedding, layers and head of a
 * Hugging Face decoder on separate devices with separate memory; the
 * forward moves activations between them explicitly, and the logits are
 * bit-identical to a single-device run, with and without the KV cache,
 * in eager and in compiled mode. Ops refuse inputs on different devices;
 * bad maps give errors naming what is wrong.
 * argv: HF_MODELS_DIR (written by tests/reference/hf_qwen3.py) */
#include "tessera_models.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

static const int64_t IDS[2][5] = {{3, 14, 15, 42, 6}, {5, 35, 8, 9, 7}};

/* logits (2, 5, V) of the model in dir placed by map, as a malloc'd copy */
static float *logits_for(ts_ctx *ctx, const char *dir, const char *map,
                         ts_dtype wdt, size_t *n) {
    ts_load_options o = {.weight_dtype = wdt, .device_map = map};
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_load_opts(ctx, dir, &o, &m));
    if (!m)
        return NULL;
    int64_t shape[2] = {2, 5};
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, IDS);
    ts_tensor *lg = ts_decoder_forward(m, ids, 0);
    float *out = NULL;
    if (lg) {
        *n = (size_t)ts_tensor_numel(lg);
        out = malloc(*n * sizeof(float));
        memcpy(out, ts_tensor_data(lg), *n * sizeof(float));
    }
    CHECK(lg != NULL);
    if (!lg)
        fprintf(stderr, "  %s with \"%s\": %s\n", dir, map ? map : "(none)",
                ts_errmsg(ctx));
    ts_release(lg), ts_release(ids);
    ts_decoder_free(m);
    return out;
}

/* generation through the KV cache: the last-position logits of a prompt
 * then of 3 single tokens, concatenated */
static float *cached_logits(ts_ctx *ctx, const char *dir, const char *map,
                            size_t *n) {
    ts_load_options o = {.device_map = map};
    ts_decoder *m = NULL;
    ts_decoder_cache *kc = NULL;
    CHECK_OK(ctx, ts_decoder_load_opts(ctx, dir, &o, &m));
    if (!m)
        return NULL;
    CHECK_OK(ctx, ts_decoder_cache_new(m, 1, 16, &kc));
    float *out = NULL;
    size_t at = 0;
    for (int step = 0; kc && step < 4; step++) {
        int64_t T = step ? 1 : 5, shape[2] = {1, T};
        ts_tensor *ids =
            ts_from_data(ctx, TS_I64, 2, shape, step ? &IDS[1][step] : IDS[0]);
        ts_tensor *lg = ts_decoder_forward_cached_last(m, kc, ids);
        CHECK(lg != NULL);
        if (!lg)
            fprintf(stderr, "  cached %s with \"%s\": %s\n", dir, map,
                    ts_errmsg(ctx));
        if (lg) {
            size_t V = (size_t)ts_tensor_dim(lg, 2);
            out = realloc(out, (at + V) * sizeof(float));
            memcpy(out + at, ts_tensor_data(lg), V * sizeof(float));
            at += V;
        }
        ts_release(lg), ts_release(ids);
    }
    *n = at;
    ts_decoder_cache_free(kc);
    ts_decoder_free(m);
    return out;
}

static void check_same(const char *what, const float *a, size_t na,
                       const float *b, size_t nb) {
    bool same = a && b && na == nb && !memcmp(a, b, na * sizeof(float));
    CHECK(same);
    if (!same)
        fprintf(stderr, "  %s: logits differ from the single-device run\n",
                what);
}

static void test_splits_match(ts_ctx *ctx, const char *models) {
    /* "auto" is the host here only without a Vulkan device (else the
     * GPU: tests/vulkan/test_vk_models.c) */
    bool host_auto = ts_device_count(ctx, TS_DEVICE_VULKAN) == 0;
    ts_clear_error(ctx);
    const char *maps[] = {
        "cpu",
        host_auto ? "auto" : "cpu:0",
        "cpu:3",
        "embed,0:cpu:0;1,head:cpu:1",
        "embed:cpu:2;0:cpu:0;1:cpu:1;head:cpu:3",
        "head:cpu:1;1:cpu:0;embed,0:cpu:1",
    };
    static const char *names[] = {"gqa2_untied", "mha_tied", "bf16_tied"};
    char dir[1024];
    for (int k = 0; k < 3; k++) {
        snprintf(dir, sizeof dir, "%s/%s", models, names[k]);
        ts_dtype wdt = k == 2 ? TS_BF16 : TS_F32;
        size_t n0 = 0, n = 0;
        float *ref = logits_for(ctx, dir, NULL, wdt, &n0);
        for (size_t j = 0; j < sizeof maps / sizeof *maps; j++) {
            float *got = logits_for(ctx, dir, maps[j], wdt, &n);
            char what[256];
            snprintf(what, sizeof what, "%s with \"%s\"", names[k], maps[j]);
            check_same(what, ref, n0, got, n);
            free(got);
        }
        /* compiled mode across a split: the same bits as eager */
        ts_set_mode(ctx, TS_MODE_COMPILED);
        float *comp =
            logits_for(ctx, dir, "embed,0:cpu:0;1,head:cpu:1", wdt, &n);
        ts_set_mode(ctx, TS_MODE_EAGER);
        check_same("compiled split", ref, n0, comp, n);
        free(comp);
        /* the KV cache lives beside its layer */
        size_t c0 = 0, c1 = 0;
        float *one = cached_logits(ctx, dir, "cpu", &c0);
        float *two =
            cached_logits(ctx, dir, "embed:cpu:1;0:cpu:2;1,head:cpu:0", &c1);
        check_same("cached split", one, c0, two, c1);
        free(one), free(two), free(ref);
    }
}

/* each device holds what the map puts there, and only that */
static void test_memory_and_transfers(ts_ctx *ctx, const char *models) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/gqa2_untied", models);
    ts_device d0 = {TS_DEVICE_CPU, 4}, d1 = {TS_DEVICE_CPU, 5};
    ts_device_stats a0, b0, a1, b1;
    ts_device_get_stats(ctx, d0, &a0);
    ts_device_get_stats(ctx, d1, &a1);
    ts_load_options o = {.device_map = "embed:cpu:4;0,1,head:cpu:5"};
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_load_opts(ctx, dir, &o, &m));
    if (!m)
        return;
    ts_device_get_stats(ctx, d0, &b0);
    ts_device_get_stats(ctx, d1, &b1);
    const ts_model_config *c = ts_decoder_get_config(m);
    size_t embed = (size_t)(c->vocab * c->hidden) * 4;
    /* cpu:4 holds the embedding table (f32) and nothing else */
    CHECK(b0.bytes_in_use - a0.bytes_in_use == embed);
    /* cpu:5 holds the layers and the untied head: more than the table */
    CHECK(b1.bytes_in_use - a1.bytes_in_use > embed);
    int64_t shape[2] = {1, 5};
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, IDS[0]);
    ts_tensor *lg = ts_decoder_forward(m, ids, 0);
    CHECK(lg && ts_tensor_device(lg).index == 5);
    ts_device_stats c0, c1;
    ts_device_get_stats(ctx, d0, &c0);
    ts_device_get_stats(ctx, d1, &c1);
    CHECK(c0.transfers_in == b0.transfers_in + 1); /* the ids */
    /* the embedded activations (1, 5, C) f32 */
    CHECK(c1.transfers_in == b1.transfers_in + 1 &&
          c1.bytes_in - b1.bytes_in == (size_t)(5 * c->hidden) * 4);
    ts_release(lg), ts_release(ids);
    ts_decoder_free(m);
    ts_device_get_stats(ctx, d0, &c0);
    CHECK(c0.bytes_in_use == a0.bytes_in_use); /* all returned */
}

static void test_errors(ts_ctx *ctx, const char *models) {
    ts_device_map dm;
    struct {
        const char *spec, *msg;
    } bad[] = {
        {"embed,0-3:cpu:0;head:cpu:1", "layers 0-3 outside the model's 0-1"},
        {"embed,0:cpu:0;head:cpu:1", "layer 1 is not placed"},
        {"0,1,head:cpu:0", "embed is not placed"},
        {"embed,0,1:cpu:0;1,head:cpu:1", "layer 1 placed twice"},
        {"embed,0,1,head:cuda:0", "no cuda backend"},
        {"embed,0,1,head:cpu:9", "the index must be 0..7"},
        {"embed,0,1,head", "has no \":DEVICE\""},
        {"embed,zero,1,head:cpu:0", "\"zero\" is not embed, head"},
        {"gpu", "expected cpu, cpu:N"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(ts_device_map_parse(ctx, bad[i].spec, 2, &dm) != TS_OK);
        CHECK_MSG(ctx, bad[i].msg);
        ts_clear_error(ctx);
    }
    CHECK_OK(ctx,
             ts_device_map_parse(ctx, "embed,0-1:cpu:1;head:cpu:2", 2, &dm));
    CHECK(ts_device_map_count(&dm) == 2 && dm.layer[1].index == 1 &&
          dm.head.index == 2);
    ts_device_map_free(&dm);
    /* a load with a bad map names the map */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/gqa2_untied", models);
    ts_load_options o = {.device_map = "embed,0-5:cpu:0;head:cpu:1"};
    ts_decoder *m = NULL;
    CHECK(ts_decoder_load_opts(ctx, dir, &o, &m) != TS_OK && !m);
    CHECK_MSG(ctx, "outside the model's 0-1");
    ts_clear_error(ctx);
    /* ops refuse inputs on two devices */
    int64_t shape[1] = {4};
    ts_tensor *a = ts_zeros(ctx, TS_F32, 1, shape);
    ts_set_device(ctx, (ts_device){TS_DEVICE_CPU, 1});
    ts_tensor *b = ts_zeros(ctx, TS_F32, 1, shape);
    ts_set_device(ctx, (ts_device){TS_DEVICE_CPU, 0});
    CHECK(ts_tensor_device(b).index == 1);
    ts_tensor *s = ts_add(a, b);
    CHECK(!s);
    CHECK_MSG(ctx, "inputs on different devices (cpu:0 and cpu:1)");
    ts_clear_error(ctx);
    ts_tensor *bm = ts_to_device(b, (ts_device){TS_DEVICE_CPU, 0});
    s = ts_add(a, bm);
    CHECK(s && ts_tensor_device(s).index == 0);
    ts_release(s), ts_release(bm), ts_release(a), ts_release(b);
    CHECK(ts_set_device(ctx, (ts_device){TS_DEVICE_CPU, 8}) == TS_ERR_RANGE);
    ts_clear_error(ctx);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s HF_MODELS_DIR\n", argv[0]);
        return 2;
    }
    ts_ctx *ctx = test_ctx();
    ts_set_grad_enabled(ctx, false);
    test_splits_match(ctx, argv[1]);
    test_memory_and_transfers(ctx, argv[1]);
    test_errors(ctx, argv[1]);
    ts_ctx_free(ctx);
    return test_finish("test_device_map");
}
