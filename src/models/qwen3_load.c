/* qwen3_load.c — decoder models (Qwen3, Qwen2, Llama: one decoder with
 * their differences as config flags) from a Hugging Face folder: config.json
 * into the decoder's config, then every parameter by its Hugging Face name
 * from the safetensors, shape-checked and converted to the model's dtype. */
#include "tessera_models.h"

#include <stdio.h>
#include <string.h>

ts_qwen3_config ts_decoder_config(const ts_model_config *mc) {
    return (ts_qwen3_config){.vocab = mc->vocab,
                             .hidden = mc->hidden,
                             .layers = mc->layers,
                             .heads = mc->heads,
                             .kv_heads = mc->kv_heads,
                             .head_dim = mc->head_dim,
                             .intermediate = mc->intermediate,
                             .rms_eps = mc->norm_eps,
                             .rope_theta = mc->rope_theta,
                             .tie_word_embeddings = mc->tie_word_embeddings,
                             .max_positions = mc->max_positions,
                             .no_qk_norm = !mc->qk_norm,
                             .attention_bias = mc->attention_bias,
                             .rope_llama3 = mc->rope_llama3,
                             .rope_factor = mc->rope_factor,
                             .rope_low_freq_factor = mc->rope_low_freq_factor,
                             .rope_high_freq_factor = mc->rope_high_freq_factor,
                             .rope_original_max_positions =
                                 mc->rope_original_max_positions};
}

static ts_status load(ts_ctx *ctx, const char *dir, ts_qwen3_model **out,
                      bool any_decoder, ts_dtype weight_dtype,
                      const char *device_map) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!dir || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "model load: NULL argument");
    *out = NULL;
    ts_model_config mc;
    ts_status s = ts_config_load(ctx, dir, &mc);
    if (s != TS_OK)
        return s;
    if (!any_decoder && mc.arch != TS_ARCH_QWEN3)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "%s: a %s model; ts_qwen3_load reads qwen3 ones",
                            dir, mc.model_type);
    if (mc.arch == TS_ARCH_GPT2)
        return ts_set_error(
            ctx, TS_ERR_UNSUPPORTED,
            "%s: a gpt2 model; ts_decoder_load reads qwen3, qwen2 and llama "
            "(gpt2: ts_gpt2_load)",
            dir);
    ts_qwen3_config cfg = ts_decoder_config(&mc);
    cfg.weight_dtype = weight_dtype;
    cfg.no_init = true; /* the checkpoint fills them */
    if (weight_dtype != TS_F32 && weight_dtype != TS_BF16)
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "%s: weights can be kept in f32 or bf16, not %s",
                            dir, ts_dtype_name(weight_dtype));
    if (mc.rope_llama3 &&
        !(mc.rope_factor > 0 && mc.rope_low_freq_factor > 0 &&
          mc.rope_high_freq_factor > mc.rope_low_freq_factor &&
          mc.rope_original_max_positions > 0))
        return ts_set_error(
            ctx, TS_ERR_IO,
            "%s: rope_scaling llama3 needs factor > 0, 0 < low_freq_factor < "
            "high_freq_factor and original_max_position_embeddings > 0",
            dir);
    ts_device_map dmap = {0};
    if (device_map) {
        if ((s = ts_device_map_parse(ctx, device_map, (int)mc.layers, &dmap)) !=
            TS_OK)
            return s;
        cfg.device_map = &dmap;
    }
    ts_safetensors *st = NULL;
    ts_qwen3_model *m = NULL;
    if ((s = ts_safetensors_open(ctx, dir, &st)) != TS_OK) {
        ts_device_map_free(&dmap);
        return s;
    }
    s = ts_qwen3_new(ctx, &cfg, 0, &m);
    ts_device_map_free(&dmap);
    if (s != TS_OK) {
        ts_safetensors_close(st);
        return s;
    }
    ts_device here = ts_get_device(ctx);
    bool old = ts_set_grad_enabled(ctx, false);
    for (int i = 0; i < ts_qwen3_num_params(m) && s == TS_OK; i++) {
        const char *name = ts_qwen3_param_name(m, i);
        ts_tensor *p = ts_qwen3_param(m, i);
        ts_set_device(ctx, ts_tensor_device(p)); /* read where it lives */
        ts_tensor *src = ts_safetensors_get(st, name);
        if (!src) {
            s = ts_set_error(ctx, TS_ERR_IO,
                             "%s: the checkpoint has no tensor \"%s\"", dir,
                             name);
            break;
        }
        int nd = ts_tensor_ndim(p);
        if (ts_tensor_ndim(src) != nd ||
            memcmp(ts_tensor_shape(src), ts_tensor_shape(p),
                   sizeof(int64_t) * (size_t)nd)) {
            char a[128] = "", b[128] = "";
            for (int d = 0; d < ts_tensor_ndim(src); d++)
                snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld",
                         d ? ", " : "", (long long)ts_tensor_shape(src)[d]);
            for (int d = 0; d < nd; d++)
                snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld",
                         d ? ", " : "", (long long)ts_tensor_shape(p)[d]);
            s = ts_set_error(ctx, TS_ERR_SHAPE,
                             "%s: tensor \"%s\" has shape [%s] in the "
                             "checkpoint; the config "
                             "needs [%s]",
                             dir, name, a, b);
        } else if (ts_tensor_dtype(src) == ts_tensor_dtype(p) &&
                   ts_tensor_is_contiguous(src)) {
            s = ts_qwen3_set_param(m, i, src); /* the mapping, no copy */
        } else {
            s = ts_copy_(p, src); /* converted to the model's dtype */
        }
        ts_release(src);
    }
    ts_set_grad_enabled(ctx, old);
    ts_set_device(ctx, here);
    ts_safetensors_close(st);
    if (s != TS_OK) {
        ts_qwen3_free(m);
        return s;
    }
    *out = m;
    return TS_OK;
}

ts_status ts_qwen3_load(ts_ctx *ctx, const char *dir, ts_qwen3_model **out) {
    return load(ctx, dir, out, false, TS_F32, NULL);
}

ts_status ts_decoder_load(ts_ctx *ctx, const char *dir, ts_qwen3_model **out) {
    return load(ctx, dir, out, true, TS_F32, NULL);
}

ts_status ts_decoder_load_as(ts_ctx *ctx, const char *dir,
                             ts_dtype weight_dtype, ts_qwen3_model **out) {
    return load(ctx, dir, out, true, weight_dtype, NULL);
}

ts_status ts_decoder_load_opts(ts_ctx *ctx, const char *dir,
                               const ts_load_options *opt,
                               ts_qwen3_model **out) {
    ts_load_options none = {.weight_dtype = TS_F32};
    if (!opt)
        opt = &none;
    return load(ctx, dir, out, true, opt->weight_dtype, opt->device_map);
}
