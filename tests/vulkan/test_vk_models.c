/* test_vk_models.c — whole models on vulkan:0 against the CPU: each
 * family's logits (Qwen3, Qwen2, Llama, GPT-2, f32 and bf16 weights), the
 * KV-cached decode, a model split CPU+GPU by device_map and "auto", eager
 * against compiled on Vulkan, 20 training steps (losses against the
 * CPU's), and the serving engine (greedy tokens identical to the CPU's,
 * prefix reuse, 8 concurrent streams). argv[2]: the HF model fixtures. */
#include "tessera_engine.h"
#include "tessera_models.h"
#include "tessera_nn.h"
#include "vk_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int64_t IDS[2][6] = {{3, 14, 15, 42, 6, 9}, {5, 35, 8, 9, 7, 1}};

/* logits (2, 6, V) of dir placed by map, on the host; NULL on failure */
static ts_tensor *logits_of(ts_ctx *ctx, const char *dir, const char *map,
                            ts_dtype wdt) {
    ts_load_options o = {.weight_dtype = wdt, .device_map = map};
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_load_opts(ctx, dir, &o, &m));
    if (!m)
        return NULL;
    int64_t shape[2] = {2, 6};
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, IDS);
    ts_tensor *lg = ts_decoder_forward(m, ids, 0);
    if (!lg)
        fprintf(stderr, "  %s on %s: %s\n", dir, map, ts_errmsg(ctx));
    ts_tensor *h = lg ? vkt_down(lg) : NULL;
    ts_release(lg), ts_release(ids);
    ts_decoder_free(m);
    return h;
}

static void test_families(ts_ctx *ctx, const char *models) {
    static const char *names[] = {
        "gqa2_untied", "mha_tied",      "bf16_tied", "qwen2_tied",
        "llama_gqa4",  "llama3_scaled", "gpt2_bare", "gpt2_prefixed"};
    char dir[1024], what[1200], split1[128], split2[128];
    const char *maps[] = {"vulkan:0", "auto", split1, split2};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        snprintf(dir, sizeof dir, "%s/%s", models, names[k]);
        ts_decoder *probe = NULL; /* the layer count, for the splits */
        CHECK_OK(ctx, ts_decoder_load(ctx, dir, &probe));
        int L = probe ? (int)ts_decoder_get_config(probe)->layers : 2;
        ts_decoder_free(probe);
        snprintf(split1, sizeof split1, "embed,0:vulkan:0;1-%d,head:cpu:0",
                 L - 1);
        snprintf(split2, sizeof split2,
                 "embed:cpu:0;0:cpu:1;1-%d,head:vulkan:0", L - 1);
        ts_dtype wdt = strstr(names[k], "bf16") ? TS_BF16 : TS_F32;
        ts_tensor *ref = logits_of(ctx, dir, "cpu", wdt);
        for (size_t j = 0; j < sizeof maps / sizeof *maps; j++) {
            ts_tensor *got = logits_of(ctx, dir, maps[j], wdt);
            snprintf(what, sizeof what, "%s on %s", names[k], maps[j]);
            /* f32 sums in another order; bf16 weights are the same values,
             * but the CPU's products round the activations to bf16 at
             * AVX512_BF16 */
            bool bf16_gemm =
                wdt == TS_BF16 && (!strcmp(ts_cpu_isa(), "avx512_bf16") ||
                                   !strcmp(ts_cpu_isa(), "amx"));
            test_allclose(what, got, ref, bf16_gemm ? 0 : 1e-4,
                          bf16_gemm ? 0.1 : 1e-4);
            ts_release(got);
        }
        ts_release(ref);
    }
}

/* a token outside the vocabulary: the same clear error on the device as on
 * the CPU, nothing run */
static void test_bad_ids(ts_ctx *ctx, const char *models) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", models, "gqa2_untied");
    ts_load_options o = {.device_map = "vulkan:0"};
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_load_opts(ctx, dir, &o, &m));
    if (!m)
        return;
    int64_t shape[2] = {1, 4}, bad[4] = {1, 2, 5000, 3};
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, bad);
    ts_tensor *lg = ts_decoder_forward(m, ids, 0);
    CHECK(lg == NULL && ts_ctx_status(ctx) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "ids[2] = 5000 is outside the vocabulary");
    ts_clear_error(ctx);
    ts_release(lg), ts_release(ids);
    ts_decoder_free(m);
}

/* the last-position logits of a prompt then 3 single tokens through the
 * KV cache, all concatenated (host) */
static ts_tensor *cached_of(ts_ctx *ctx, const char *dir, const char *map) {
    ts_load_options o = {.device_map = map};
    ts_decoder *m = NULL;
    ts_decoder_cache *kc = NULL;
    CHECK_OK(ctx, ts_decoder_load_opts(ctx, dir, &o, &m));
    if (!m)
        return NULL;
    CHECK_OK(ctx, ts_decoder_cache_new(m, 1, 16, &kc));
    ts_tensor *all = NULL;
    for (int step = 0; kc && step < 4; step++) {
        int64_t T = step ? 1 : 5, shape[2] = {1, T};
        ts_tensor *ids =
            ts_from_data(ctx, TS_I64, 2, shape, step ? &IDS[1][step] : IDS[0]);
        ts_tensor *lg = ts_decoder_forward_cached_last(m, kc, ids);
        ts_tensor *h = lg ? vkt_down(lg) : NULL;
        CHECK(h != NULL);
        if (h) {
            ts_tensor *two[2] = {all, h};
            ts_tensor *cat = all ? ts_concat(2, two, 1) : ts_retain(h);
            ts_release(all);
            all = cat;
        }
        ts_release(h), ts_release(lg), ts_release(ids);
    }
    ts_decoder_cache_free(kc);
    ts_decoder_free(m);
    return all;
}

static void test_cached(ts_ctx *ctx, const char *models) {
    char dir[1024];
    const char *names[] = {"gqa2_untied", "gpt2_bare"};
    for (int k = 0; k < 2; k++) {
        snprintf(dir, sizeof dir, "%s/%s", models, names[k]);
        ts_tensor *ref = cached_of(ctx, dir, "cpu");
        ts_tensor *got = cached_of(ctx, dir, "vulkan:0");
        test_allclose(names[k], got, ref, 1e-4, 1e-4);
        ts_release(ref), ts_release(got);
    }
}

static ts_model_config tiny(const char *family) {
    ts_model_config c = tu_config(family);
    c.vocab = 101, c.hidden = 32, c.intermediate = 48, c.layers = 2;
    c.heads = 4, c.kv_heads = !strcmp(family, "gpt2") ? 4 : 2;
    c.head_dim = 8;
    c.norm_eps = 1e-6, c.rope_theta = 10000, c.max_positions = 64;
    return c;
}

/* eager and compiled forward of the same model on Vulkan agree; calls
 * after the first replay the command buffer the first recorded, with new
 * inputs each time */
static void test_compiled(ts_ctx *ctx) {
    ts_model_config c = tiny("qwen3");
    ts_device_map dm;
    CHECK_OK(ctx, ts_device_map_parse(ctx, "vulkan:0", (int)c.layers, &dm));
    ts_decoder_options o = {.device_map = &dm};
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, &o, 11, &m));
    ts_device_map_free(&dm);
    if (!m)
        return;
    bool g = ts_set_grad_enabled(ctx, false);
    ts_compile_stats cs0, cs1;
    ts_get_compile_stats(ctx, &cs0);
    for (int rep = 0; rep < 4; rep++) {
        int64_t shape[2] = {2, 6}, ids_v[2][6];
        for (int b = 0; b < 2; b++)
            for (int t = 0; t < 6; t++)
                ids_v[b][t] = (IDS[b][t] + 13 * rep) % 101;
        ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, ids_v);
        char what[64];
        snprintf(what, sizeof what, "compiled on vulkan, call %d", rep + 1);
        vkt_eager_vs_compiled(ctx, m, ids, what);
        ts_release(ids);
    }
    ts_set_grad_enabled(ctx, g);
    ts_get_compile_stats(ctx, &cs1);
    CHECK(cs1.cache_hits - cs0.cache_hits >= 3);
    /* every call after the first: the recorded command buffer replayed */
    CHECK(cs1.device_replays - cs0.device_replays >= 3);
    printf("compiled on vulkan:0: %llu of 4 calls replayed a recorded "
           "command buffer\n",
           (unsigned long long)(cs1.device_replays - cs0.device_replays));
    ts_decoder_free(m);
}

/* 20 AdamW steps of a fresh model; the losses into out */
static void train_losses(ts_ctx *ctx, const char *family, const char *map,
                         double *out) {
    ts_model_config c = tiny(family);
    ts_device_map dm;
    CHECK_OK(ctx, ts_device_map_parse(ctx, map, (int)c.layers, &dm));
    ts_decoder_options o = {.device_map = &dm};
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, &o, 5, &m));
    ts_device_map_free(&dm);
    if (!m)
        return;
    ts_adamw_options ao = ts_adamw_default_options();
    ao.lr = 3e-3;
    ts_adamw *opt = NULL;
    CHECK_OK(ctx, ts_adamw_new(ctx, ts_decoder_params(m),
                               ts_decoder_num_params(m), &ao, &opt));
    int64_t shape[2] = {2, 6};
    int64_t tg[2][6];
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 6; t++)
            tg[b][t] = (IDS[b][t] * 7 + 3) % 101;
    for (int step = 0; opt && step < 20; step++) {
        ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, IDS);
        ts_tensor *tgt = ts_from_data(ctx, TS_I64, 2, shape, tg);
        ts_tensor *loss = ts_decoder_loss(m, ids, tgt, NULL);
        out[step] = NAN;
        if (loss) {
            CHECK_OK(ctx, ts_backward(loss, NULL));
            CHECK_OK(ctx, ts_adamw_step(opt));
            CHECK_OK(ctx, ts_item(loss, &out[step]));
            for (int i = 0; i < ts_decoder_num_params(m); i++)
                ts_zero_grad(ts_decoder_params(m)[i]);
        } else {
            fprintf(stderr, "  train on %s: %s\n", map, ts_errmsg(ctx));
            CHECK(loss != NULL);
            ts_release(ids), ts_release(tgt);
            break;
        }
        ts_release(loss), ts_release(ids), ts_release(tgt);
    }
    ts_adamw_free(opt);
    ts_decoder_free(m);
}

static void test_training(ts_ctx *ctx) {
    const char *fams[] = {"qwen3", "gpt2", "llama"};
    for (int f = 0; f < 3; f++) {
        double cpu[20], vk[20];
        train_losses(ctx, fams[f], "cpu", cpu);
        train_losses(ctx, fams[f], "vulkan:0", vk);
        double worst = 0;
        for (int s = 0; s < 20; s++) {
            double r = fabs(vk[s] - cpu[s]) / fabs(cpu[s]);
            worst = r > worst || isnan(r) ? r : worst;
        }
        printf("training %s: loss %.5f -> %.5f on the CPU, %.5f -> %.5f on "
               "vulkan:0, worst relative difference %.2e\n",
               fams[f], cpu[0], cpu[19], vk[0], vk[19], worst);
        CHECK(worst <= 1e-4);
        CHECK(cpu[19] < cpu[0]); /* it learns */
    }
}

/* greedy tokens of 8 concurrent requests sharing prefixes */
static int generate(ts_ctx *ctx, const char *dir, const char *map,
                    int32_t out[8][8], ts_engine_stats *st) {
    ts_load_options o = {.device_map = map};
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_load_opts(ctx, dir, &o, &m));
    ts_engine_options eo = ts_engine_options_default();
    eo.block_size = 4;
    eo.n_blocks = 64;
    ts_engine *e = NULL;
    if (m)
        CHECK_OK(ctx, ts_engine_new(ctx, m, &eo, &e));
    if (!e) {
        ts_decoder_free(m);
        return 0;
    }
    int64_t ids[8];
    int n_done = 0, got[8] = {0};
    for (int r = 0; r < 8; r++) {
        int32_t prompt[12];
        for (int i = 0; i < 12; i++) /* two shared 8-token prefixes */
            prompt[i] = i < 8 ? (int32_t)((r % 2) * 11 + i + 3)
                              : (int32_t)(r * 5 + i) % 90 + 3;
        ts_request q = {.prompt = prompt, .n_prompt = 12, .max_tokens = 8};
        q.sampling = (ts_sampling){
            .temperature = 0, .top_p = 1, .repetition_penalty = 1};
        q.ignore_eos = true;
        CHECK_OK(ctx, ts_engine_add(e, &q, &ids[r]));
        if (r == 1) { /* the first two run before the rest arrive */
            ts_engine_output outs[16];
            int n = 0;
            for (int s = 0; s < 3; s++)
                CHECK_OK(ctx, ts_engine_step(e, outs, 16, &n));
            for (int k = 0; k < n; k++) {
                int i = (int)(outs[k].id - ids[0]);
                if (i >= 0 && i < 8 && got[i] < 8)
                    out[i][got[i]++] = outs[k].token;
            }
        }
    }
    for (int guard = 0; ts_engine_has_work(e) && guard < 200; guard++) {
        ts_engine_output outs[16];
        int n = 0;
        if (ts_engine_step(e, outs, 16, &n) != TS_OK) {
            fprintf(stderr, "  engine on %s: %s\n", map, ts_errmsg(ctx));
            CHECK(false);
            break;
        }
        for (int k = 0; k < n; k++) {
            int i = (int)(outs[k].id - ids[0]);
            if (i >= 0 && i < 8 && got[i] < 8)
                out[i][got[i]++] = outs[k].token;
            n_done += outs[k].finish != TS_FINISH_NONE;
        }
    }
    ts_engine_get_stats(e, st);
    ts_engine_free(e);
    ts_decoder_free(m);
    return n_done;
}

static void test_engine(ts_ctx *ctx, const char *models) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", models, "gqa2_untied");
    int32_t cpu[8][8] = {{0}}, vk[8][8] = {{0}};
    ts_engine_stats sc, sv;
    generate(ctx, dir, "cpu", cpu, &sc);
    int done = generate(ctx, dir, "vulkan:0", vk, &sv);
    CHECK(done >= 6); /* the first two may finish in the steps above */
    CHECK(!memcmp(cpu, vk, sizeof cpu));
    CHECK(sv.prefix_hit_tokens > 0);
    CHECK(sv.prefix_hit_tokens == sc.prefix_hit_tokens);
    printf("engine on vulkan:0: 8 streams, %lld prompt tokens from the "
           "prefix cache, tokens identical to the CPU's\n",
           (long long)sv.prefix_hit_tokens);
}

/* the KV transfer of prefill/decode disaggregation reads a device's pool:
 * the exported blocks of a prompt equal the CPU engine's, and blocks
 * imported into another device engine export back the same */
static void *export_of(ts_ctx *ctx, const char *dir, const char *map,
                       const int32_t *prompt, size_t *n_blocks, size_t *bytes) {
    ts_load_options o = {.device_map = map};
    ts_decoder *m = NULL;
    ts_engine *e = NULL;
    ts_engine_options eo = ts_engine_options_default();
    eo.block_size = 4, eo.n_blocks = 32;
    eo.kv_dtype = TS_KV_F32; /* a device's pools are f32: the same bytes */
    CHECK_OK(ctx, ts_decoder_load_opts(ctx, dir, &o, &m));
    if (m)
        CHECK_OK(ctx, ts_engine_new(ctx, m, &eo, &e));
    void *buf = NULL;
    if (e) {
        ts_request q = {.prompt = prompt, .n_prompt = 12, .max_tokens = 1};
        q.sampling = (ts_sampling){.top_p = 1, .repetition_penalty = 1};
        int64_t id;
        CHECK_OK(ctx, ts_engine_add(e, &q, &id));
        ts_engine_output out[4];
        int n;
        while (ts_engine_has_work(e) && ts_engine_step(e, out, 4, &n) == TS_OK)
            ;
        *bytes = (size_t)ts_engine_block_bytes(e);
        buf = malloc(*bytes * 3);
        *n_blocks = ts_engine_export_prefix(e, prompt, 12, buf, 3);
        ts_engine_free(e);
    }
    ts_decoder_free(m);
    return buf;
}

static void test_kv_transfer(ts_ctx *ctx, const char *models) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", models, "gqa2_untied");
    int32_t prompt[12];
    for (int i = 0; i < 12; i++)
        prompt[i] = (int32_t)(i * 7 + 2);
    size_t nc = 0, nv = 0, bytes = 0;
    float *c = export_of(ctx, dir, "cpu", prompt, &nc, &bytes);
    float *v = export_of(ctx, dir, "vulkan:0", prompt, &nv, &bytes);
    CHECK(nc == 3 && nv == 3);
    double worst = 0;
    for (size_t i = 0; c && v && i < bytes * nc / 4; i++) {
        double d = fabs((double)c[i] - v[i]);
        worst = d > worst ? d : worst;
    }
    CHECK(c && v && worst <= 1e-4);
    /* into a fresh engine on the device, and out again */
    ts_load_options o = {.device_map = "vulkan:0"};
    ts_decoder *m = NULL;
    ts_engine *e = NULL;
    ts_engine_options eo = ts_engine_options_default();
    eo.block_size = 4, eo.n_blocks = 32;
    eo.kv_dtype = TS_KV_F32; /* a device's pools are f32: the same bytes */
    CHECK_OK(ctx, ts_decoder_load_opts(ctx, dir, &o, &m));
    if (m)
        CHECK_OK(ctx, ts_engine_new(ctx, m, &eo, &e));
    size_t adopted = 0;
    if (e && v) {
        CHECK_OK(ctx, ts_engine_import_prefix(e, prompt, nv, v, &adopted));
        CHECK(adopted == 3);
        float *back = malloc(bytes * 3);
        CHECK(ts_engine_export_prefix(e, prompt, 12, back, 3) == 3);
        CHECK(!memcmp(back, v, bytes * 3));
        free(back);
    }
    ts_engine_free(e);
    ts_decoder_free(m);
    free(c), free(v);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SRC_DIR HF_MODELS_DIR\n", argv[0]);
        return 2;
    }
    ts_ctx *ctx = vkt_ctx("test_vk_models");
    test_families(ctx, argv[2]);
    test_cached(ctx, argv[2]);
    test_bad_ids(ctx, argv[2]);
    test_compiled(ctx);
    test_training(ctx);
    test_engine(ctx, argv[2]);
    test_kv_transfer(ctx, argv[2]);
    ts_ctx_free(ctx);
    return test_finish("test_vk_models");
}
