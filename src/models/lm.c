/* lm.c — one handle for every causal LM architecture (the decoder family
 * qwen3/qwen2/llama, and gpt2): load by config.json's model_type, a KV
 * cache for generation, logits with or without it. What `tessera run` and
 * the engine drive; they never branch on the architecture. */
#include "tessera_models.h"

#include <stdlib.h>
#include <string.h>

struct ts_lm {
    ts_ctx *ctx;
    ts_model_config cfg;
    ts_qwen3_model *dec; /* one of these two */
    ts_gpt2_model *gpt2;
    ts_device gpt2_dev; /* gpt2 runs on one device */
};

struct ts_lm_cache {
    ts_lm *lm;
    ts_qwen3_cache *dec;
    ts_gpt2_cache *gpt2;
};

ts_status ts_lm_load(ts_ctx *ctx, const char *dir, const ts_load_options *opt,
                     ts_lm **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!dir || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "lm_load: NULL argument");
    *out = NULL;
    ts_load_options none = {.weight_dtype = TS_F32};
    if (!opt)
        opt = &none;
    ts_lm *lm = calloc(1, sizeof *lm);
    if (!lm)
        return ts_set_error(ctx, TS_ERR_OOM, "lm_load: out of memory");
    lm->ctx = ctx;
    ts_status s =
        ts_model_dir_check(ctx, dir, TS_MODEL_CONFIG | TS_MODEL_WEIGHTS);
    if (s == TS_OK)
        s = ts_config_load(ctx, dir, &lm->cfg);
    if (s == TS_OK && lm->cfg.arch == TS_ARCH_GPT2) {
        ts_device_map dm = {0};
        lm->gpt2_dev = ts_get_device(ctx);
        if (opt->device_map &&
            (s = ts_device_map_parse(ctx, opt->device_map, (int)lm->cfg.layers,
                                     &dm)) == TS_OK) {
            if (ts_device_map_count(&dm) > 1)
                s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                                 "%s: gpt2 runs on one device; device_map "
                                 "splits are for qwen3, qwen2 and llama",
                                 dir);
            lm->gpt2_dev = dm.embed;
            ts_device_map_free(&dm);
        }
        if (s == TS_OK && opt->weight_dtype != TS_F32)
            s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                             "%s: gpt2 keeps its weights in f32", dir);
        ts_device here = ts_get_device(ctx);
        ts_load_options one = *opt; /* placed and typed above */
        one.device_map = NULL;
        if (s == TS_OK && (s = ts_set_device(ctx, lm->gpt2_dev)) == TS_OK)
            s = ts_gpt2_load_opts(ctx, dir, &one, &lm->gpt2);
        ts_set_device(ctx, here);
    } else if (s == TS_OK) {
        s = ts_decoder_load_opts(ctx, dir, opt, &lm->dec);
    }
    if (s != TS_OK) {
        ts_lm_free(lm);
        return s;
    }
    *out = lm;
    return TS_OK;
}

void ts_lm_free(ts_lm *lm) {
    if (!lm)
        return;
    ts_qwen3_free(lm->dec);
    ts_gpt2_free(lm->gpt2);
    free(lm);
}

const ts_model_config *ts_lm_config(const ts_lm *lm) {
    return lm ? &lm->cfg : NULL;
}

ts_qwen3_model *ts_lm_decoder(ts_lm *lm) {
    return lm ? lm->dec : NULL;
}

ts_status ts_lm_cache_new(ts_lm *lm, int64_t max_T, ts_lm_cache **out) {
    if (!lm || !out)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    ts_lm_cache *kc = calloc(1, sizeof *kc);
    if (!kc)
        return ts_set_error(lm->ctx, TS_ERR_OOM, "lm_cache_new: out of memory");
    kc->lm = lm;
    ts_status s;
    if (lm->dec)
        s = ts_qwen3_cache_new(lm->dec, 1, max_T, &kc->dec);
    else {
        ts_device here = ts_get_device(lm->ctx);
        ts_set_device(lm->ctx, lm->gpt2_dev);
        s = ts_gpt2_cache_new(lm->gpt2, max_T, &kc->gpt2);
        ts_set_device(lm->ctx, here);
    }
    if (s != TS_OK) {
        free(kc);
        return s;
    }
    *out = kc;
    return TS_OK;
}

void ts_lm_cache_free(ts_lm_cache *kc) {
    if (!kc)
        return;
    ts_qwen3_cache_free(kc->dec);
    ts_gpt2_cache_free(kc->gpt2);
    free(kc);
}

int64_t ts_lm_cache_len(const ts_lm_cache *kc) {
    return !kc       ? 0
           : kc->dec ? ts_qwen3_cache_len(kc->dec)
                     : ts_gpt2_cache_len(kc->gpt2);
}

void ts_lm_cache_truncate(ts_lm_cache *kc, int64_t len) {
    if (kc && kc->dec)
        ts_qwen3_cache_truncate(kc->dec, len);
    else if (kc)
        ts_gpt2_cache_truncate(kc->gpt2, len);
}

/* gpt2 on its device: ids moved there, new tensors made there */
static ts_tensor *gpt2_call(ts_lm *lm, ts_lm_cache *kc, ts_tensor *ids,
                            bool last_only) {
    ts_device here = ts_get_device(lm->ctx);
    ts_set_device(lm->ctx, lm->gpt2_dev);
    ts_tensor *moved = ts_to_device(ids, lm->gpt2_dev);
    ts_tensor *out =
        !moved ? NULL
        : kc   ? ts_gpt2_forward_cached(lm->gpt2, kc->gpt2, moved, last_only)
               : ts_gpt2_forward(lm->gpt2, moved, 0);
    ts_release(moved);
    ts_set_device(lm->ctx, here);
    return out;
}

ts_tensor *ts_lm_forward_cached(ts_lm *lm, ts_lm_cache *kc, ts_tensor *ids,
                                bool last_only) {
    if (!lm || !kc)
        return NULL;
    if (lm->dec)
        return last_only ? ts_qwen3_forward_cached_last(lm->dec, kc->dec, ids)
                         : ts_qwen3_forward_cached(lm->dec, kc->dec, ids);
    return gpt2_call(lm, kc, ids, last_only);
}

ts_tensor *ts_lm_forward(ts_lm *lm, ts_tensor *ids) {
    if (!lm)
        return NULL;
    if (lm->dec)
        return ts_qwen3_forward(lm->dec, ids, 0);
    return gpt2_call(lm, NULL, ids, false);
}
