/* gpt2.c — GPT-2 from a Hugging Face folder, for inference: learned
 * position embeddings, pre-LayerNorm blocks with a fused q/k/v projection,
 * Conv1D weights stored (in, out) as Hugging Face keeps them (used as they
 * are: x @ W + b), the tanh GELU, the LM head tied to the token embedding;
 * a KV cache for greedy generation. Parameters are read by name with or
 * without the "transformer." prefix; the causal-mask buffers some
 * checkpoints carry (attn.bias, attn.masked_bias) are ignored. */
#include "tessera_models.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ts_tensor *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
    ts_tensor *ln2_w, *ln2_b, *fc_w, *fc_b, *fc_proj_w, *fc_proj_b;
} gpt2_layer;

struct ts_gpt2_cache {
    ts_gpt2_model *m;
    int64_t len, max_T;
    ts_tensor **k, **v; /* per layer (1, H, max_T, D) */
};

struct ts_gpt2_model {
    ts_ctx *ctx;
    ts_model_config cfg;
    ts_tensor *wte, *wpe, *lnf_w, *lnf_b;
    gpt2_layer *layer;
};

static ts_tensor *get(ts_ctx *ctx, ts_safetensors *st, const char *dir,
                      const char *name, int ndim, int64_t d0, int64_t d1,
                      ts_status *s) {
    if (*s)
        return NULL;
    char full[256];
    snprintf(full, sizeof full, "transformer.%s", name);
    ts_tensor *t = NULL;
    for (int k = 0; k < ts_safetensors_count(st) && !t; k++) {
        const char *n = ts_safetensors_name(st, k);
        if (!strcmp(n, full) || !strcmp(n, name))
            t = ts_safetensors_get(st, n);
    }
    if (!t) {
        *s = ts_set_error(ctx, TS_ERR_IO,
                          "%s: the checkpoint has no tensor \"%s\"", dir, name);
        return NULL;
    }
    int64_t want[2] = {d0, d1};
    if (ts_tensor_ndim(t) != ndim ||
        memcmp(ts_tensor_shape(t), want, sizeof(int64_t) * (size_t)ndim)) {
        *s = ts_set_error(
            ctx, TS_ERR_SHAPE,
            "%s: tensor \"%s\" has the wrong shape for the config", dir, name);
        ts_release(t);
        return NULL;
    }
    if (ts_tensor_dtype(t) != TS_F32) { /* computed in f32 */
        ts_tensor *f = ts_cast(t, TS_F32);
        ts_release(t);
        t = f;
    }
    return t;
}

void ts_gpt2_free(ts_gpt2_model *m) {
    if (!m)
        return;
    for (int64_t i = 0; m->layer && i < m->cfg.layers; i++) {
        ts_tensor **p = &m->layer[i].ln1_w; /* the struct is all tensors */
        for (size_t k = 0; k < sizeof(gpt2_layer) / sizeof(ts_tensor *); k++)
            ts_release(p[k]);
    }
    ts_release(m->wte), ts_release(m->wpe), ts_release(m->lnf_w),
        ts_release(m->lnf_b);
    free(m->layer);
    free(m);
}

ts_status ts_gpt2_load(ts_ctx *ctx, const char *dir, ts_gpt2_model **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!dir || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "gpt2_load: NULL argument");
    *out = NULL;
    ts_model_config c;
    ts_status s = ts_config_load(ctx, dir, &c);
    if (s)
        return s;
    if (c.arch != TS_ARCH_GPT2)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "%s: a %s model; ts_gpt2_load reads gpt2 ones", dir,
                            c.model_type);
    ts_safetensors *st;
    if ((s = ts_safetensors_open(ctx, dir, &st)))
        return s;
    ts_gpt2_model *m = calloc(1, sizeof *m);
    if (m)
        m->layer = calloc((size_t)c.layers, sizeof *m->layer);
    if (!m || !m->layer) {
        ts_safetensors_close(st);
        free(m);
        return ts_set_error(ctx, TS_ERR_OOM, "gpt2_load: out of memory");
    }
    m->ctx = ctx, m->cfg = c;
    int64_t C = c.hidden, F = c.intermediate;
    bool old = ts_set_grad_enabled(ctx, false);
    m->wte = get(ctx, st, dir, "wte.weight", 2, c.vocab, C, &s);
    m->wpe = get(ctx, st, dir, "wpe.weight", 2, c.max_positions, C, &s);
    for (int64_t i = 0; i < c.layers && !s; i++) {
        gpt2_layer *L = &m->layer[i];
        char n[128];
#define P(field, suffix, nd, a, b)                                             \
    snprintf(n, sizeof n, "h.%lld.%s", (long long)i, suffix);                  \
    L->field = get(ctx, st, dir, n, nd, a, b, &s)
        P(ln1_w, "ln_1.weight", 1, C, 0);
        P(ln1_b, "ln_1.bias", 1, C, 0);
        P(attn_w, "attn.c_attn.weight", 2, C, 3 * C);
        P(attn_b, "attn.c_attn.bias", 1, 3 * C, 0);
        P(proj_w, "attn.c_proj.weight", 2, C, C);
        P(proj_b, "attn.c_proj.bias", 1, C, 0);
        P(ln2_w, "ln_2.weight", 1, C, 0);
        P(ln2_b, "ln_2.bias", 1, C, 0);
        P(fc_w, "mlp.c_fc.weight", 2, C, F);
        P(fc_b, "mlp.c_fc.bias", 1, F, 0);
        P(fc_proj_w, "mlp.c_proj.weight", 2, F, C);
        P(fc_proj_b, "mlp.c_proj.bias", 1, C, 0);
#undef P
    }
    m->lnf_w = get(ctx, st, dir, "ln_f.weight", 1, C, 0, &s);
    m->lnf_b = get(ctx, st, dir, "ln_f.bias", 1, C, 0, &s);
    ts_set_grad_enabled(ctx, old);
    ts_safetensors_close(st);
    if (s) {
        ts_gpt2_free(m);
        return s;
    }
    *out = m;
    return TS_OK;
}

/* x @ W + b with W (in, out) */
static ts_tensor *conv1d(ts_tensor *x, ts_tensor *w, ts_tensor *b) {
    ts_tensor *y = ts_matmul(x, w);
    ts_tensor *r = ts_add(y, b);
    ts_release(y);
    return r;
}

/* (B, T, C) slice [off, off+C) of the fused qkv -> heads (B, H, T, D) */
static ts_tensor *heads(ts_tensor *qkv, int64_t off, const ts_model_config *c) {
    int64_t B = ts_tensor_dim(qkv, 0), T = ts_tensor_dim(qkv, 1);
    ts_tensor *part = ts_slice(qkv, 2, off, off + c->hidden, 1);
    int64_t shape[4] = {B, T, c->heads, c->head_dim};
    ts_tensor *r = ts_reshape(part, 4, shape);
    ts_tensor *t = ts_transpose(r, 1, 2);
    ts_release(part), ts_release(r);
    return t;
}

static ts_tensor *append(ts_tensor *cache, ts_tensor *x, int64_t len) {
    int64_t T = ts_tensor_dim(x, 2);
    ts_tensor *dst = ts_slice(cache, 2, len, len + T, 1);
    ts_status s = dst ? ts_copy_(dst, x) : TS_ERR_INVALID_ARG;
    ts_release(dst);
    return s == TS_OK ? ts_slice(cache, 2, 0, len + T, 1) : NULL;
}

/* ids (B, T) at positions pos0.. -> logits (B, T or 1, V); with a cache:
 * attends to and appends the layers' caches (B == 1) */
static ts_tensor *forward(ts_gpt2_model *m, ts_tensor *ids, int64_t pos0,
                          ts_gpt2_cache *kc, bool last_only) {
    ts_ctx *ctx = m->ctx;
    const ts_model_config *c = &m->cfg;
    int64_t B = ts_tensor_dim(ids, 0), T = ts_tensor_dim(ids, 1), C = c->hidden;
    if (pos0 + T > c->max_positions) {
        ts_set_error(ctx, TS_ERR_RANGE,
                     "gpt2: positions up to %lld past n_positions %lld",
                     (long long)(pos0 + T), (long long)c->max_positions);
        return NULL;
    }
    ts_tensor *pos =
        ts_arange(ctx, TS_I64, (double)pos0, (double)(pos0 + T), 1);
    ts_tensor *pe = ts_embedding(m->wpe, pos);
    ts_tensor *te = ts_embedding(m->wte, ids);
    ts_tensor *x = ts_add(te, pe);
    ts_release(pos), ts_release(pe), ts_release(te);
    for (int64_t i = 0; i < c->layers && x; i++) {
        gpt2_layer *L = &m->layer[i];
        ts_tensor *h = ts_layernorm(x, L->ln1_w, L->ln1_b, c->norm_eps);
        ts_tensor *qkv = conv1d(h, L->attn_w, L->attn_b);
        ts_tensor *q = heads(qkv, 0, c), *k = heads(qkv, C, c),
                  *v = heads(qkv, 2 * C, c);
        if (kc) {
            ts_tensor *ka = append(kc->k[i], k, pos0),
                      *va = append(kc->v[i], v, pos0);
            ts_release(k), ts_release(v);
            k = ka, v = va;
        }
        ts_tensor *a = ts_attention(q, k, v, NULL, true, 0);
        ts_tensor *at = ts_transpose(a, 1, 2);
        int64_t shape[3] = {B, T, C};
        ts_tensor *ar = ts_reshape(at, 3, shape);
        ts_tensor *o = conv1d(ar, L->proj_w, L->proj_b);
        ts_tensor *x1 = ts_add(x, o);
        ts_tensor *h2 = ts_layernorm(x1, L->ln2_w, L->ln2_b, c->norm_eps);
        ts_tensor *f = conv1d(h2, L->fc_w, L->fc_b);
        ts_tensor *g = ts_gelu(f, TS_GELU_TANH);
        ts_tensor *mo = conv1d(g, L->fc_proj_w, L->fc_proj_b);
        ts_tensor *x2 = ts_add(x1, mo);
        ts_tensor *tmp[] = {x, h, qkv, q, k, v, a, at, ar, o, x1, h2, f, g, mo};
        for (size_t j = 0; j < sizeof tmp / sizeof *tmp; j++)
            ts_release(tmp[j]);
        x = x2;
    }
    if (last_only && x) { /* the next token needs the last position only */
        ts_tensor *l = ts_slice(x, 1, T - 1, T, 1);
        ts_release(x);
        x = l;
    }
    ts_tensor *hf = ts_layernorm(x, m->lnf_w, m->lnf_b, c->norm_eps);
    ts_tensor *wt = ts_transpose(m->wte, 0, 1);
    ts_tensor *logits = ts_matmul(hf, wt);
    ts_release(x), ts_release(hf), ts_release(wt);
    return logits;
}

ts_tensor *ts_gpt2_forward(ts_gpt2_model *m, ts_tensor *ids, int64_t pos0) {
    if (!m || !ids)
        return NULL;
    if (ts_tensor_ndim(ids) != 2 ||
        (ts_tensor_dtype(ids) != TS_I64 && ts_tensor_dtype(ids) != TS_I32)) {
        ts_set_error(m->ctx, TS_ERR_SHAPE,
                     "gpt2_forward: ids must be (B, T) of i32 or i64");
        return NULL;
    }
    return forward(m, ids, pos0, NULL, false);
}

ts_status ts_gpt2_cache_new(ts_gpt2_model *m, int64_t max_T,
                            ts_gpt2_cache **out) {
    if (!m || !out)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    const ts_model_config *c = &m->cfg;
    if (max_T < 1 || max_T > c->max_positions)
        return ts_set_error(m->ctx, TS_ERR_RANGE,
                            "gpt2_cache_new: length %lld outside 1..%lld "
                            "(n_positions)",
                            (long long)max_T, (long long)c->max_positions);
    ts_gpt2_cache *kc = calloc(1, sizeof *kc);
    if (kc) {
        kc->k = calloc((size_t)c->layers, sizeof *kc->k);
        kc->v = calloc((size_t)c->layers, sizeof *kc->v);
    }
    if (!kc || !kc->k || !kc->v) {
        if (kc)
            free(kc->k), free(kc->v);
        free(kc);
        return ts_set_error(m->ctx, TS_ERR_OOM,
                            "gpt2_cache_new: out of memory");
    }
    kc->m = m, kc->max_T = max_T;
    int64_t shape[4] = {1, c->heads, max_T, c->head_dim};
    for (int64_t i = 0; i < c->layers; i++) {
        kc->k[i] = ts_zeros(m->ctx, TS_F32, 4, shape);
        kc->v[i] = ts_zeros(m->ctx, TS_F32, 4, shape);
        if (!kc->k[i] || !kc->v[i]) {
            ts_gpt2_cache_free(kc);
            return ts_ctx_status(m->ctx);
        }
    }
    *out = kc;
    return TS_OK;
}

void ts_gpt2_cache_free(ts_gpt2_cache *kc) {
    if (!kc)
        return;
    for (int64_t i = 0; i < kc->m->cfg.layers; i++)
        ts_release(kc->k[i]), ts_release(kc->v[i]);
    free(kc->k), free(kc->v), free(kc);
}

int64_t ts_gpt2_cache_len(const ts_gpt2_cache *kc) {
    return kc ? kc->len : 0;
}

void ts_gpt2_cache_truncate(ts_gpt2_cache *kc, int64_t len) {
    if (kc && len >= 0 && len < kc->len)
        kc->len = len;
}

ts_tensor *ts_gpt2_forward_cached(ts_gpt2_model *m, ts_gpt2_cache *kc,
                                  ts_tensor *ids, bool last_only) {
    if (!m || !kc || !ids)
        return NULL;
    if (ts_tensor_ndim(ids) != 2 || ts_tensor_dim(ids, 0) != 1 ||
        kc->len + ts_tensor_dim(ids, 1) > kc->max_T) {
        ts_set_error(m->ctx, TS_ERR_RANGE,
                     "gpt2_forward_cached: ids must be (1, T) with T fitting "
                     "the cache (%lld of %lld positions used)",
                     (long long)kc->len, (long long)kc->max_T);
        return NULL;
    }
    ts_tensor *logits = forward(m, ids, kc->len, kc, last_only);
    if (logits)
        kc->len += ts_tensor_dim(ids, 1);
    return logits;
}

typedef struct {
    ts_gpt2_model *m;
    ts_gpt2_cache *kc;
} gpt2_step;

static ts_tensor *gpt2_next_logits(void *arg, ts_tensor *ids) {
    gpt2_step *g = arg;
    return ts_gpt2_forward_cached(g->m, g->kc, ids, false);
}

ts_status ts_gpt2_generate_greedy(ts_gpt2_model *m, const int64_t *prompt,
                                  int64_t n_prompt, int64_t n_new,
                                  int64_t *out) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    if (n_prompt < 1 || n_new < 0)
        return ts_set_error(m->ctx, TS_ERR_RANGE,
                            "gpt2_generate_greedy: %lld prompt and %lld new "
                            "tokens",
                            (long long)n_prompt, (long long)n_new);
    gpt2_step g = {m, NULL};
    ts_status s = ts_gpt2_cache_new(m, n_prompt + n_new, &g.kc);
    if (!s)
        s = ts_generate_greedy_with(m->ctx, gpt2_next_logits, &g, prompt,
                                    n_prompt, n_new, out);
    ts_gpt2_cache_free(g.kc);
    return s;
}
