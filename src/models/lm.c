/* lm.c — a causal LM as generation drives it: the decoder config.json
 * describes, loaded with the user's options, and one sequence's KV cache.
 * What `tessera run` uses; it never branches on the family. */
#include "tessera_models.h"

#include <stdlib.h>

struct ts_lm {
    ts_ctx *ctx;
    ts_decoder *dec;
};

struct ts_lm_cache {
    ts_lm *lm;
    ts_decoder_cache *dec;
};

ts_status ts_lm_load(ts_ctx *ctx, const char *dir, const ts_load_options *opt,
                     ts_lm **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!dir || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "lm_load: NULL argument");
    *out = NULL;
    ts_lm *lm = calloc(1, sizeof *lm);
    if (!lm)
        return ts_set_error(ctx, TS_ERR_OOM, "lm_load: out of memory");
    lm->ctx = ctx;
    ts_status s = ts_decoder_load_opts(ctx, dir, opt, &lm->dec);
    /* generation only: the weights packed once for the decode kernels */
    if (s == TS_OK)
        s = ts_decoder_prepack(lm->dec);
    if (s != TS_OK) {
        ts_decoder_free(lm->dec);
        free(lm);
        return s;
    }
    *out = lm;
    return TS_OK;
}

void ts_lm_free(ts_lm *lm) {
    if (!lm)
        return;
    ts_decoder_free(lm->dec);
    free(lm);
}

const ts_model_config *ts_lm_config(const ts_lm *lm) {
    return lm ? ts_decoder_get_config(lm->dec) : NULL;
}

ts_decoder *ts_lm_decoder(ts_lm *lm) {
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
    ts_status s = ts_decoder_cache_new(lm->dec, 1, max_T, &kc->dec);
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
    ts_decoder_cache_free(kc->dec);
    free(kc);
}

int64_t ts_lm_cache_len(const ts_lm_cache *kc) {
    return kc ? ts_decoder_cache_len(kc->dec) : 0;
}

void ts_lm_cache_truncate(ts_lm_cache *kc, int64_t len) {
    if (kc)
        ts_decoder_cache_truncate(kc->dec, len);
}

ts_tensor *ts_lm_forward_cached(ts_lm *lm, ts_lm_cache *kc, ts_tensor *ids,
                                bool last_only) {
    if (!lm || !kc)
        return NULL;
    return last_only ? ts_decoder_forward_cached_last(lm->dec, kc->dec, ids)
                     : ts_decoder_forward_cached(lm->dec, kc->dec, ids);
}

ts_tensor *ts_lm_forward(ts_lm *lm, ts_tensor *ids) {
    return lm ? ts_decoder_forward(lm->dec, ids, 0) : NULL;
}
