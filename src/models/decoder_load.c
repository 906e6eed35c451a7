/* decoder_load.c — any family's decoder from a Hugging Face folder:
 * config.json into the description (config.c); the checkpoint's header
 * checked against the tensors that description needs (decoder_spec.c's
 * names and shapes) before the model is allocated, and their values for
 * NaN/Inf; then every parameter by its Hugging Face name, converted to the
 * model's dtype (or the mapped file itself where it already is), the
 * per-expert tensors of a mixture of experts into their stacked
 * parameter's slices. */
#include "decoder_spec.h"
#include "load_check.h"

#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dec_set_config_src(ts_decoder *m, const char *path);

void dec_set_layout(ts_decoder *m, int layout);
ts_status dec_set_param_kept(ts_decoder *m, int i, ts_tensor *t, bool conv1d);

/* The checkpoint index of name, or of its other spellings (GPT-2's
 * without "transformer."; a multimodal Gemma 3's text weights in either
 * layout, *layout set to the one that matched), or -1. */
static int find_in(const ckpt_review *r, const char *name, int *layout) {
    int k = ckpt_find(r, name);
    const char *alt = k < 0 ? dec_alt_name(name) : NULL;
    if (alt)
        k = ckpt_find(r, alt);
    for (int l = DEC_LAYOUT_PLAIN + 1; k < 0 && l < DEC_LAYOUT_COUNT; l++) {
        char spelled[DEC_NAME_LEN + 32];
        dec_layout_name(l, name, spelled, sizeof spelled);
        if ((k = ckpt_find(r, spelled)) >= 0 && layout)
            *layout = l;
    }
    return k;
}

static int find(const ckpt_review *r, const char *name) {
    return find_in(r, name, NULL);
}

/* Every tensor the plan needs in the checkpoint with its shape, then
 * finite: before anything the size of the config is allocated. */
static ts_status review_checkpoint(ckpt_review *r, const ts_model_config *c,
                                   const dec_param *plan, int n) {
    ts_status s = TS_OK;
    for (int i = 0; i < n && s == TS_OK; i++) {
        const dec_param *p = &plan[i];
        bool stacked = p->parts > 1;
        for (int64_t e = 0; e < p->parts && s == TS_OK; e++) {
            char name[DEC_NAME_LEN];
            dec_part_name(c, p, e, name, sizeof name);
            int k = find(r, name); /* errors name the checkpoint's own */
            s = ckpt_expect(r, k, k >= 0 ? ts_safetensors_name(r->st, k) : name,
                            stacked ? 2 : p->ndim,
                            stacked ? p->shape + 1 : p->shape);
        }
    }
    return s;
}

/* stored by some checkpoints, read by no model (as Hugging Face's
 * _keys_to_ignore_on_load_unexpected): a tied model's lm_head.weight, the
 * rotary inv_freq buffers, GPT-2's causal-mask buffers */
static bool ignored(const char *name) {
    size_t n = strlen(name), k = strlen("rotary_emb.inv_freq");
    const char *dot = strrchr(name, '.');
    return !strcmp(name, "lm_head.weight") ||
           (n >= k && !strcmp(name + n - k, "rotary_emb.inv_freq")) ||
           (dot && (!strcmp(dot, ".bias") || !strcmp(dot, ".masked_bias")) &&
            dot >= name + 5 && !strncmp(dot - 5, ".attn", 5));
}

static int64_t layer_of(const char *name) {
    long long l;
    if (sscanf(name, "model.layers.%lld.", &l) == 1 ||
        sscanf(name, "transformer.h.%lld.", &l) == 1 ||
        sscanf(name, "h.%lld.", &l) == 1)
        return (int64_t)l;
    return -1;
}

/* parameter i of m from the checkpoint: the mapping itself when dtype and
 * layout match, else converted into the parameter; part by part for
 * stacked experts */
static ts_status fill_param(ts_ctx *ctx, const char *dir, ts_decoder *m,
                            const dec_param *p, int i, ckpt_review *rv) {
    ts_tensor *dst = ts_decoder_param(m, i);
    ts_set_device(ctx, ts_tensor_device(dst)); /* read where it lives */
    ts_status s = TS_OK;
    for (int64_t e = 0; e < p->parts && s == TS_OK; e++) {
        char name[DEC_NAME_LEN];
        dec_part_name(ts_decoder_get_config(m), p, e, name, sizeof name);
        int k = find(rv, name);
        ts_tensor *src =
            k >= 0 ? ts_safetensors_get(rv->st, ts_safetensors_name(rv->st, k))
                   : NULL;
        if (!src)
            return ts_ctx_status(ctx) != TS_OK
                       ? ts_ctx_status(ctx)
                       : ts_set_error(ctx, TS_ERR_IO,
                                      "%s: the checkpoint has no tensor "
                                      "\"%s\"",
                                      dir, name);
        if (ts_dtype_is_quantized(ts_tensor_dtype(src)) && p->parts != 1)
            s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                             "%s: %s is %s: experts' weights in a quantized "
                             "format are not supported",
                             dir, name, ts_dtype_name(ts_tensor_dtype(src)));
        else if (ts_dtype_is_quantized(ts_tensor_dtype(src)))
            /* weights of a block format stay as they are (mapped) */
            s = dec_set_param_kept(m, i, src, ts_decoder_get_config(m)->conv1d);
        else if (p->parts == 1 &&
                 ts_tensor_dtype(src) == ts_tensor_dtype(dst) &&
                 ts_tensor_is_contiguous(src) &&
                 ts_device_equal(ts_tensor_device(src), ts_tensor_device(dst)))
            s = ts_decoder_set_param(m, i, src); /* the mapping, no copy */
        else if (p->parts == 1)
            s = ts_copy_(dst, src); /* converted to the model's dtype */
        else {
            ts_tensor *sl = ts_slice(dst, 0, e, e + 1, 1);
            ts_tensor *part = sl ? ts_squeeze(sl, 0) : NULL;
            s = part ? ts_copy_(part, src) : ts_ctx_status(ctx);
            ts_release(sl), ts_release(part);
        }
        ts_release(src);
    }
    return s;
}

/* the load's device_map; "auto" sized by the model's parameters */
static ts_status parse_map(ts_ctx *ctx, const ts_load_options *opt,
                           const ts_model_config *mc, const dec_param *plan,
                           int n, ts_device_map *out) {
    if (strcmp(opt->device_map, "auto"))
        return ts_device_map_parse(ctx, opt->device_map, (int)mc->layers, out);
    size_t layer = 0, other = 0;
    for (int i = 0; i < n; i++) {
        size_t b = plan[i].matrix ? ts_dtype_size(opt->weight_dtype) : 4;
        for (int d = 0; d < plan[i].ndim; d++)
            b *= (size_t)plan[i].shape[d];
        if (plan[i].layer == 0)
            layer += b;
        else if (plan[i].layer < 0)
            other += b;
    }
    return ts_device_map_auto(ctx, (int)mc->layers, layer, other, out);
}

ts_status ts_decoder_load_opts(ts_ctx *ctx, const char *dir,
                               const ts_load_options *opt, ts_decoder **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!dir || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "model load: NULL argument");
    *out = NULL;
    ts_load_options none = {.weight_dtype = TS_F32};
    if (!opt)
        opt = &none;
    ts_status s =
        ts_model_dir_check(ctx, dir, TS_MODEL_CONFIG | TS_MODEL_WEIGHTS);
    ts_model_config mc; /* a folder with config.json, or an error saying */
    if (s == TS_OK)
        s = ts_config_load(ctx, dir, &mc);
    if (s != TS_OK)
        return s;
    if (opt->weight_dtype != TS_F32 && opt->weight_dtype != TS_BF16)
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "%s: weights can be kept in f32 or bf16, not %s",
                            dir, ts_dtype_name(opt->weight_dtype));
    if ((s = ts_decoder_config_check(ctx, &mc)) != TS_OK)
        return s;
    int n = dec_plan(&mc, NULL, 0);
    dec_param *plan = calloc((size_t)n + 1, sizeof *plan);
    if (!plan)
        return ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", dir);
    dec_plan(&mc, plan, n);
    if ((s = dec_plan_check(ctx, &mc, plan, n)) != TS_OK) {
        free(plan);
        return s;
    }
    ts_safetensors *st = NULL;
    ckpt_review rv = {0};
    ts_device_map dmap = {0};
    ts_decoder *m = NULL;
    if ((s = ts_safetensors_open(ctx, dir, &st)) == TS_OK &&
        (s = ckpt_review_begin(&rv, ctx, dir, st, opt)) == TS_OK &&
        (s = review_checkpoint(&rv, &mc, plan, n)) == TS_OK &&
        (!opt->device_map ||
         (s = parse_map(ctx, opt, &mc, plan, n, &dmap)) == TS_OK)) {
        ts_decoder_options o = {.weight_dtype = opt->weight_dtype,
                                .device_map = opt->device_map ? &dmap : NULL,
                                .no_init = true}; /* the checkpoint fills */
        s = ts_decoder_new(ctx, &mc, &o, 0, &m);
    }
    ts_device_map_free(&dmap);
    if (s == TS_OK) {
        ts_device here = ts_get_device(ctx);
        bool old = ts_set_grad_enabled(ctx, false);
        for (int i = 0; i < n && s == TS_OK; i++)
            s = fill_param(ctx, dir, m, &plan[i], i, &rv);
        ts_set_grad_enabled(ctx, old);
        ts_set_device(ctx, here);
        for (int i = 0; s == TS_OK && i < n; i++) /* inference: no grads */
            ts_set_requires_grad(ts_decoder_param(m, i), false);
    }
    if (s == TS_OK) { /* saved back in the layout it came in */
        int layout = DEC_LAYOUT_PLAIN;
        find_in(&rv, plan[0].name, &layout);
        dec_set_layout(m, layout);
        ckpt_warn_unused(&rv, ignored, layer_of, mc.layers,
                         mc.arch == TS_ARCH_GPT2 ? "n_layer"
                                                 : "num_hidden_layers");
        char cfg[4200];
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        dec_set_config_src(m, cfg);
    }
    if (rv.ctx)
        ckpt_review_end(&rv);
    ts_safetensors_close(st);
    free(plan);
    if (s != TS_OK) {
        ts_decoder_free(m);
        return s;
    }
    *out = m;
    return TS_OK;
}

ts_status ts_decoder_load(ts_ctx *ctx, const char *dir, ts_decoder **out) {
    return ts_decoder_load_opts(ctx, dir, NULL, out);
}

/* ---- packed weights for inference ---- */

/* does a forward multiply activations by the parameter of role r (x @
 * W.T, or a Conv1D family's x @ W)? The router is cast to f32 where it is
 * used and experts are stacked (3-D): neither. */
static bool multiplies(dec_role r, bool tied) {
    switch (r) {
    case R_Q:
    case R_K:
    case R_V:
    case R_QKV:
    case R_O:
    case R_GATE:
    case R_UP:
    case R_GATE_UP:
    case R_DOWN:
    case R_HEAD:
        return true;
    case R_EMBED:
        return tied; /* the LM head is the table seen transposed */
    default:
        return false;
    }
}

ts_status ts_decoder_prepack(ts_decoder *m) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    const ts_model_config *c = ts_decoder_get_config(m);
    int n = ts_decoder_num_params(m);
    ts_ctx *ctx = n > 0 ? ts_tensor_ctx(ts_decoder_param(m, 0)) : NULL;
    if (!ctx)
        return TS_OK;
    dec_param *plan = calloc((size_t)n + 1, sizeof *plan);
    if (!plan)
        return ts_set_error(ctx, TS_ERR_OOM, "decoder prepack: out of memory");
    ts_status s = TS_OK;
    if (dec_plan(c, plan, n) != n)
        s = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                         "decoder prepack: the model has %d parameters, its "
                         "config describes another count",
                         n);
    bool old = ts_set_grad_enabled(ctx, false);
    for (int i = 0; i < n && s == TS_OK; i++) {
        ts_tensor *w = ts_decoder_param(m, i);
        if (!multiplies(plan[i].role, c->tie_word_embeddings) ||
            ts_tensor_dtype(w) != TS_BF16 || ts_tensor_ndim(w) != 2)
            continue;
        const ts_backend *be = ts_storage_backend(w->storage);
        if (!be || !be->prepack)
            continue; /* a device without a packed layout */
        /* the operand as the forward passes it to the product */
        bool as_is =
            c->conv1d && plan[i].role != R_HEAD && plan[i].role != R_EMBED;
        ts_tensor *b = as_is ? ts_retain(w) : ts_transpose(w, 0, 1);
        if (!b) {
            s = ts_ctx_status(ctx);
            break;
        }
        w->storage->pack_wanted = true;
        s = be->prepack(ctx, b);
        ts_release(b);
        if (s != TS_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", ts_errmsg(ctx));
            s = ts_set_error(ctx, s, "decoder prepack: %s: %s",
                             ts_decoder_param_name(m, i), why);
        }
    }
    ts_set_grad_enabled(ctx, old);
    free(plan);
    return s;
}

int64_t ts_decoder_packed_bytes(const ts_decoder *m) {
    int n = ts_decoder_num_params(m);
    int64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        const ts_storage *st = ts_decoder_param(m, i)->storage;
        bool seen = false; /* storages a tied or shared parameter repeats */
        for (int j = 0; j < i && !seen; j++)
            seen = ts_decoder_param(m, j)->storage == st;
        if (!seen)
            bytes += (int64_t)st->packed_bytes;
    }
    return bytes;
}
