/* qwen3_load.c — decoder models (Qwen3, Qwen2, Llama: one decoder with
 * their differences as config flags) from a Hugging Face folder: config.json
 * into the decoder's config; the checkpoint's header checked against the
 * tensors that config needs (before the model is allocated) and their
 * values for NaN/Inf; then every parameter by its Hugging Face name from
 * the safetensors, converted to the model's dtype. */
#include "load_check.h"

#include <stdio.h>
#include <stdlib.h>
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
                             .rope_llama3 = mc->rope == TS_ROPE_LLAMA3,
                             .rope_factor = mc->rope_factor,
                             .rope_low_freq_factor = mc->rope_low_freq_factor,
                             .rope_high_freq_factor = mc->rope_high_freq_factor,
                             .rope_original_max_positions =
                                 mc->rope_original_max_positions};
}

/* The checkpoint tensors the decoder of cfg reads, in nn/qwen3.c's
 * parameter order: name and shape, for the header check made before the
 * model is allocated. Returns how many (at most cap). */
typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
} expected_tensor;

static int expected_tensors(const ts_qwen3_config *c, expected_tensor *e,
                            int cap) {
    int n = 0;
    int64_t V = c->vocab, C = c->hidden, D = c->head_dim, F = c->intermediate;
    int64_t HD = c->heads * D, KVD = c->kv_heads * D;
#define ADD(nd, d0, d1, ...)                                                   \
    do {                                                                       \
        if (n < cap) {                                                         \
            snprintf(e[n].name, sizeof e[n].name, __VA_ARGS__);                \
            e[n].ndim = nd, e[n].shape[0] = d0, e[n].shape[1] = d1;            \
        }                                                                      \
        n++;                                                                   \
    } while (0)
    ADD(2, V, C, "model.embed_tokens.weight");
    for (int64_t i = 0; i < c->layers; i++) {
        const char *L = "model.layers";
        long long l = (long long)i;
        ADD(2, HD, C, "%s.%lld.self_attn.q_proj.weight", L, l);
        if (c->attention_bias)
            ADD(1, HD, 0, "%s.%lld.self_attn.q_proj.bias", L, l);
        ADD(2, KVD, C, "%s.%lld.self_attn.k_proj.weight", L, l);
        if (c->attention_bias)
            ADD(1, KVD, 0, "%s.%lld.self_attn.k_proj.bias", L, l);
        ADD(2, KVD, C, "%s.%lld.self_attn.v_proj.weight", L, l);
        if (c->attention_bias)
            ADD(1, KVD, 0, "%s.%lld.self_attn.v_proj.bias", L, l);
        ADD(2, C, HD, "%s.%lld.self_attn.o_proj.weight", L, l);
        if (!c->no_qk_norm) {
            ADD(1, D, 0, "%s.%lld.self_attn.q_norm.weight", L, l);
            ADD(1, D, 0, "%s.%lld.self_attn.k_norm.weight", L, l);
        }
        ADD(2, F, C, "%s.%lld.mlp.gate_proj.weight", L, l);
        ADD(2, F, C, "%s.%lld.mlp.up_proj.weight", L, l);
        ADD(2, C, F, "%s.%lld.mlp.down_proj.weight", L, l);
        ADD(1, C, 0, "%s.%lld.input_layernorm.weight", L, l);
        ADD(1, C, 0, "%s.%lld.post_attention_layernorm.weight", L, l);
    }
    ADD(1, C, 0, "model.norm.weight");
    if (!c->tie_word_embeddings)
        ADD(2, V, C, "lm_head.weight");
#undef ADD
    return n;
}

/* stored by some checkpoints, read by no model (as Hugging Face's
 * _keys_to_ignore_on_load_unexpected): a tied model's lm_head.weight and
 * the rotary inv_freq buffers */
static bool decoder_ignores(const char *name) {
    size_t n = strlen(name), k = strlen("rotary_emb.inv_freq");
    return !strcmp(name, "lm_head.weight") ||
           (n >= k && !strcmp(name + n - k, "rotary_emb.inv_freq"));
}

static int64_t decoder_layer_of(const char *name) {
    long long l;
    return sscanf(name, "model.layers.%lld.", &l) == 1 ? (int64_t)l : -1;
}

/* Every expected tensor in the checkpoint with its shape, then finite:
 * before anything the size of the config is allocated. */
static ts_status review_checkpoint(ckpt_review *r, const ts_qwen3_config *c) {
    int n = expected_tensors(c, NULL, 0);
    expected_tensor *e = calloc((size_t)n, sizeof *e);
    if (!e)
        return ts_set_error(r->ctx, TS_ERR_OOM, "%s: out of memory", r->dir);
    expected_tensors(c, e, n);
    ts_status s = TS_OK;
    for (int i = 0; i < n && s == TS_OK; i++)
        s = ckpt_expect(r, ckpt_find(r, e[i].name), e[i].name, e[i].ndim,
                        e[i].shape);
    free(e);
    return s;
}

static ts_status load(ts_ctx *ctx, const char *dir, ts_qwen3_model **out,
                      bool any_decoder, const ts_load_options *opt) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!dir || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "model load: NULL argument");
    *out = NULL;
    ts_dtype weight_dtype = opt->weight_dtype;
    ts_model_config mc; /* a folder with config.json, or an error saying */
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
    if (mc.rope == TS_ROPE_LLAMA3 &&
        !(mc.rope_factor > 0 && mc.rope_low_freq_factor > 0 &&
          mc.rope_high_freq_factor > mc.rope_low_freq_factor &&
          mc.rope_original_max_positions > 0))
        return ts_set_error(
            ctx, TS_ERR_IO,
            "%s: rope_scaling llama3 needs factor > 0, 0 < low_freq_factor < "
            "high_freq_factor and original_max_position_embeddings > 0",
            dir);
    if ((s = ts_qwen3_config_check(ctx, &cfg)) != TS_OK ||
        (s = ts_model_dir_check(ctx, dir, TS_MODEL_WEIGHTS)) != TS_OK)
        return s;
    ts_safetensors *st = NULL;
    if ((s = ts_safetensors_open(ctx, dir, &st)) != TS_OK)
        return s;
    ckpt_review rv;
    if ((s = ckpt_review_begin(&rv, ctx, dir, st, opt)) != TS_OK ||
        (s = review_checkpoint(&rv, &cfg)) != TS_OK) {
        ckpt_review_end(&rv);
        ts_safetensors_close(st);
        return s;
    }
    ts_device_map dmap = {0};
    if (opt->device_map) {
        if ((s = ts_device_map_parse(ctx, opt->device_map, (int)mc.layers,
                                     &dmap)) != TS_OK) {
            ckpt_review_end(&rv);
            ts_safetensors_close(st);
            return s;
        }
        cfg.device_map = &dmap;
    }
    ts_qwen3_model *m = NULL;
    s = ts_qwen3_new(ctx, &cfg, 0, &m);
    ts_device_map_free(&dmap);
    if (s != TS_OK) {
        ckpt_review_end(&rv);
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
        if (!src) { /* the list above and the model's disagree */
            s = ts_set_error(ctx, TS_ERR_IO,
                             "%s: the checkpoint has no tensor \"%s\"", dir,
                             name);
            break;
        }
        int nd = ts_tensor_ndim(p);
        if (ts_tensor_ndim(src) != nd ||
            memcmp(ts_tensor_shape(src), ts_tensor_shape(p),
                   sizeof(int64_t) * (size_t)nd))
            s = ts_set_error(ctx, TS_ERR_SHAPE,
                             "%s: tensor \"%s\": the model's shape is not "
                             "the checkpoint's",
                             dir, name);
        else if (ts_tensor_dtype(src) == ts_tensor_dtype(p) &&
                 ts_tensor_is_contiguous(src))
            s = ts_qwen3_set_param(m, i, src); /* the mapping, no copy */
        else
            s = ts_copy_(p, src); /* converted to the model's dtype */
        ts_release(src);
    }
    ts_set_grad_enabled(ctx, old);
    ts_set_device(ctx, here);
    if (s == TS_OK)
        ckpt_warn_unused(&rv, decoder_ignores, decoder_layer_of, mc.layers,
                         "num_hidden_layers");
    ckpt_review_end(&rv);
    ts_safetensors_close(st);
    if (s != TS_OK) {
        ts_qwen3_free(m);
        return s;
    }
    *out = m;
    return TS_OK;
}

ts_status ts_qwen3_load(ts_ctx *ctx, const char *dir, ts_qwen3_model **out) {
    ts_load_options o = {.weight_dtype = TS_F32};
    return load(ctx, dir, out, false, &o);
}

ts_status ts_decoder_load(ts_ctx *ctx, const char *dir, ts_qwen3_model **out) {
    ts_load_options o = {.weight_dtype = TS_F32};
    return load(ctx, dir, out, true, &o);
}

ts_status ts_decoder_load_as(ts_ctx *ctx, const char *dir,
                             ts_dtype weight_dtype, ts_qwen3_model **out) {
    ts_load_options o = {.weight_dtype = weight_dtype};
    return load(ctx, dir, out, true, &o);
}

ts_status ts_decoder_load_opts(ts_ctx *ctx, const char *dir,
                               const ts_load_options *opt,
                               ts_qwen3_model **out) {
    ts_load_options none = {.weight_dtype = TS_F32};
    return load(ctx, dir, out, true, opt ? opt : &none);
}
