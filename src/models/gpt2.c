/* gpt2.c — GPT-2: learned position embeddings, pre-LayerNorm blocks with a
 * fused q/k/v projection, Conv1D weights stored (in, out) as Hugging Face
 * keeps them (used as they are: x @ W + b), the tanh GELU, the LM head tied
 * to the token embedding. Loaded from a Hugging Face folder for inference
 * (a KV cache for greedy generation), or built with GPT-2's random init for
 * training (parameters with requires_grad, the next-token loss). Parameters
 * are read by name with or without the "transformer." prefix and listed
 * with it (GPT2LMHeadModel's state_dict names); the causal-mask buffers
 * some checkpoints carry (attn.bias, attn.masked_bias) are ignored. */
#include "load_check.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPT2_MAX_LAYERS       4096
#define GPT2_PARAMS_PER_LAYER 12
#define GPT2_NAME_LEN         64

/* One block's parameters, borrowed from the model's list. */
typedef struct {
    ts_tensor *ln1_w, *ln1_b;         /* (C) */
    ts_tensor *attn_w, *attn_b;       /* (C, 3C), (3C) */
    ts_tensor *proj_w, *proj_b;       /* (C, C), (C) */
    ts_tensor *ln2_w, *ln2_b;         /* (C) */
    ts_tensor *fc_w, *fc_b;           /* (C, F), (F) */
    ts_tensor *fc_proj_w, *fc_proj_b; /* (F, C), (C) */
} gpt2_layer;

struct ts_gpt2_cache {
    ts_gpt2_model *m;
    int64_t len, max_T;
    ts_tensor **k, **v; /* per layer (1, H, max_T, D) */
};

/* a block as ts_checkpoint's argument */
typedef struct {
    struct ts_gpt2_model *m;
    int64_t i;
} gpt2_block_ref;

struct ts_gpt2_model {
    ts_ctx *ctx;
    ts_model_config cfg;
    ts_tensor *wte, *wpe, *lnf_w, *lnf_b; /* (V, C), (P, C), (C), (C) */
    gpt2_layer *layer;
    gpt2_block_ref *ckpt; /* activation checkpointing: one per block */
    bool compute_bf16;    /* matrices cast to bf16 where used (mixed) */
    int n_params, cap_params;
    ts_tensor **params; /* owned references, state_dict order */
    char (*names)[GPT2_NAME_LEN];
};

/* How a new parameter starts (GPT-2's _init_weights): Normal(0, 0.02);
 * the residual projections (attn.c_proj, mlp.c_proj) Normal(0, 0.02 /
 * sqrt(2 L)); LayerNorm weights ones; biases zeros. */
typedef enum { INIT_NORMAL, INIT_RESIDUAL, INIT_ONES, INIT_ZEROS } gpt2_init;

/* Where parameters come from: a checkpoint (st) or the random init. */
typedef struct {
    ts_gpt2_model *m;
    ts_safetensors *st; /* NULL: initialize */
    ckpt_review *rv;    /* with st: the checks on what is read */
    const char *dir;
    uint64_t seed;
    ts_status s;
} gpt2_builder;

/* splitmix64: a distinct, well-mixed seed per parameter index. */
static uint64_t param_seed(uint64_t seed, int i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* name (without "transformer.") from the checkpoint, checked against the
 * shape the config gives (on the header: nothing read or allocated before)
 * and for NaN/Inf, as f32 */
static ts_tensor *load_tensor(gpt2_builder *b, const char *name, int ndim,
                              const int64_t *want) {
    char full[GPT2_NAME_LEN + 16];
    snprintf(full, sizeof full, "transformer.%s", name);
    int k = ckpt_find(b->rv, full);
    if (k < 0)
        k = ckpt_find(b->rv, name);
    if ((b->s = ckpt_expect(b->rv, k, name, ndim, want)) != TS_OK)
        return NULL;
    ts_tensor *t = ts_safetensors_get(b->st, ts_safetensors_name(b->st, k));
    if (!t) {
        b->s = ts_ctx_status(b->m->ctx);
        return NULL;
    }
    if (ts_tensor_dtype(t) != TS_F32) { /* computed in f32 */
        ts_tensor *f = ts_cast(t, TS_F32);
        ts_release(t);
        t = f;
    }
    return t;
}

/* The next parameter of the list: loaded or initialized, named
 * "transformer." + name. */
static ts_tensor *add_param(gpt2_builder *b, const char *name, gpt2_init init,
                            int ndim, int64_t d0, int64_t d1) {
    ts_gpt2_model *m = b->m;
    if (b->s || m->n_params == m->cap_params)
        return NULL;
    int64_t shape[2] = {d0, d1};
    int i = m->n_params;
    ts_tensor *t = NULL;
    if (b->st)
        t = load_tensor(b, name, ndim, shape);
    else {
        double std = 0.02;
        if (init == INIT_RESIDUAL)
            std /= sqrt(2.0 * (double)m->cfg.layers);
        t = init == INIT_NORMAL || init == INIT_RESIDUAL
                ? ts_randn(m->ctx, TS_F32, ndim, shape, std,
                           param_seed(b->seed, i))
                : ts_full(m->ctx, TS_F32, ndim, shape,
                          init == INIT_ONES ? 1.0 : 0.0);
        if (t)
            ts_set_requires_grad(t, true);
    }
    if (!t) {
        if (!b->s)
            b->s = ts_ctx_status(m->ctx) ? ts_ctx_status(m->ctx) : TS_ERR_OOM;
        return NULL;
    }
    m->params[i] = t;
    snprintf(m->names[i], GPT2_NAME_LEN, "transformer.%s", name);
    m->n_params++;
    return t;
}

/* Every parameter in state_dict order. */
static ts_status build_params(gpt2_builder *b) {
    ts_gpt2_model *m = b->m;
    const ts_model_config *c = &m->cfg;
    int64_t C = c->hidden, F = c->intermediate;
    m->wte = add_param(b, "wte.weight", INIT_NORMAL, 2, c->vocab, C);
    m->wpe = add_param(b, "wpe.weight", INIT_NORMAL, 2, c->max_positions, C);
    for (int64_t i = 0; i < c->layers && !b->s; i++) {
        gpt2_layer *L = &m->layer[i];
        char n[GPT2_NAME_LEN];
#define P(field, suffix, init, nd, a, bb)                                      \
    snprintf(n, sizeof n, "h.%" PRId64 ".%s", i, suffix);                      \
    L->field = add_param(b, n, init, nd, a, bb)
        P(ln1_w, "ln_1.weight", INIT_ONES, 1, C, 0);
        P(ln1_b, "ln_1.bias", INIT_ZEROS, 1, C, 0);
        P(attn_w, "attn.c_attn.weight", INIT_NORMAL, 2, C, 3 * C);
        P(attn_b, "attn.c_attn.bias", INIT_ZEROS, 1, 3 * C, 0);
        P(proj_w, "attn.c_proj.weight", INIT_RESIDUAL, 2, C, C);
        P(proj_b, "attn.c_proj.bias", INIT_ZEROS, 1, C, 0);
        P(ln2_w, "ln_2.weight", INIT_ONES, 1, C, 0);
        P(ln2_b, "ln_2.bias", INIT_ZEROS, 1, C, 0);
        P(fc_w, "mlp.c_fc.weight", INIT_NORMAL, 2, C, F);
        P(fc_b, "mlp.c_fc.bias", INIT_ZEROS, 1, F, 0);
        P(fc_proj_w, "mlp.c_proj.weight", INIT_RESIDUAL, 2, F, C);
        P(fc_proj_b, "mlp.c_proj.bias", INIT_ZEROS, 1, C, 0);
#undef P
    }
    m->lnf_w = add_param(b, "ln_f.weight", INIT_ONES, 1, C, 0);
    m->lnf_b = add_param(b, "ln_f.bias", INIT_ZEROS, 1, C, 0);
    return b->s;
}

void ts_gpt2_free(ts_gpt2_model *m) {
    if (!m)
        return;
    for (int i = 0; i < m->n_params; i++)
        ts_release(m->params[i]);
    free(m->params), free(m->names), free(m->layer), free(m->ckpt);
    free(m);
}

ts_status ts_gpt2_set_checkpointing(ts_gpt2_model *m, bool on) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    if (!on) {
        free(m->ckpt);
        m->ckpt = NULL;
        return TS_OK;
    }
    if (m->ckpt)
        return TS_OK;
    m->ckpt = calloc((size_t)m->cfg.layers, sizeof *m->ckpt);
    if (!m->ckpt)
        return ts_set_error(m->ctx, TS_ERR_OOM,
                            "gpt2 checkpointing: out of memory");
    for (int64_t i = 0; i < m->cfg.layers; i++)
        m->ckpt[i] = (gpt2_block_ref){m, i};
    return TS_OK;
}

static ts_status check_config(ts_ctx *ctx, const ts_model_config *c) {
    const char *bad = NULL;
    if (c->arch != TS_ARCH_GPT2)
        bad = "not a gpt2 config";
    else if (c->vocab < 1 || c->hidden < 1 || c->heads < 1 ||
             c->intermediate < 1 || c->max_positions < 1 || c->layers < 1)
        bad = "vocab, n_embd, n_head, n_inner, n_positions and n_layer must "
              "be >= 1";
    else if (c->layers > GPT2_MAX_LAYERS)
        bad = "n_layer is above 4096";
    else if (c->hidden % c->heads || c->head_dim != c->hidden / c->heads)
        bad = "n_embd must be n_head x the head size";
    else if (!(c->norm_eps > 0))
        bad = "layer_norm_epsilon must be > 0";
    return bad ? ts_set_error(ctx, TS_ERR_INVALID_ARG, "gpt2 config: %s", bad)
               : TS_OK;
}

/* the model's shell: config copied, lists sized, no parameters yet */
static ts_status model_alloc(ts_ctx *ctx, const ts_model_config *c,
                             ts_gpt2_model **out) {
    ts_status s = check_config(ctx, c);
    if (s)
        return s;
    ts_gpt2_model *m = calloc(1, sizeof *m);
    int cap = 4 + GPT2_PARAMS_PER_LAYER * (int)c->layers;
    if (m) {
        m->ctx = ctx, m->cfg = *c, m->cap_params = cap;
        m->layer = calloc((size_t)c->layers, sizeof *m->layer);
        m->params = calloc((size_t)cap, sizeof *m->params);
        m->names = calloc((size_t)cap, sizeof *m->names);
    }
    if (!m || !m->layer || !m->params || !m->names) {
        ts_gpt2_free(m);
        return ts_set_error(ctx, TS_ERR_OOM, "gpt2: out of memory");
    }
    *out = m;
    return TS_OK;
}

/* buffers GPT-2 checkpoints carry that no parameter reads (the causal
 * masks), and the tied head */
static bool gpt2_ignores(const char *name) {
    const char *dot = strrchr(name, '.');
    return !strcmp(name, "lm_head.weight") ||
           (dot && (!strcmp(dot, ".bias") || !strcmp(dot, ".masked_bias")) &&
            dot >= name + 5 && !strncmp(dot - 5, ".attn", 5));
}

static int64_t gpt2_layer_of(const char *name) {
    long long l;
    if (!strncmp(name, "transformer.", 12))
        name += 12;
    return sscanf(name, "h.%lld.", &l) == 1 ? (int64_t)l : -1;
}

ts_status ts_gpt2_load_opts(ts_ctx *ctx, const char *dir,
                            const ts_load_options *opt, ts_gpt2_model **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!dir || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "gpt2_load: NULL argument");
    *out = NULL;
    ts_load_options none = {.weight_dtype = TS_F32};
    if (!opt)
        opt = &none;
    if (opt->weight_dtype != TS_F32 || opt->device_map)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "%s: gpt2 keeps its weights in f32 on the current "
                            "device (no weight_dtype or device_map)",
                            dir);
    ts_status s =
        ts_model_dir_check(ctx, dir, TS_MODEL_CONFIG | TS_MODEL_WEIGHTS);
    if (s)
        return s;
    ts_model_config c;
    if ((s = ts_config_load(ctx, dir, &c)))
        return s;
    if (c.arch != TS_ARCH_GPT2)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "%s: a %s model; ts_gpt2_load reads gpt2 ones", dir,
                            c.model_type);
    ts_gpt2_model *m;
    if ((s = model_alloc(ctx, &c, &m)))
        return s;
    ckpt_review rv = {0};
    gpt2_builder b = {.m = m, .dir = dir, .rv = &rv};
    if ((s = ts_safetensors_open(ctx, dir, &b.st)) ||
        (s = ckpt_review_begin(&rv, ctx, dir, b.st, opt))) {
        ts_safetensors_close(b.st);
        ts_gpt2_free(m);
        return s;
    }
    bool old = ts_set_grad_enabled(ctx, false);
    s = build_params(&b);
    ts_set_grad_enabled(ctx, old);
    if (!s)
        ckpt_warn_unused(&rv, gpt2_ignores, gpt2_layer_of, c.layers, "n_layer");
    ckpt_review_end(&rv);
    ts_safetensors_close(b.st);
    if (s) {
        ts_gpt2_free(m);
        return s;
    }
    *out = m;
    return TS_OK;
}

ts_status ts_gpt2_load(ts_ctx *ctx, const char *dir, ts_gpt2_model **out) {
    return ts_gpt2_load_opts(ctx, dir, NULL, out);
}

ts_status ts_gpt2_new(ts_ctx *ctx, const ts_model_config *cfg, uint64_t seed,
                      ts_gpt2_model **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!cfg || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "gpt2_new: NULL argument");
    *out = NULL;
    ts_gpt2_model *m;
    ts_status s = model_alloc(ctx, cfg, &m);
    if (s)
        return s;
    m->cfg.tie_word_embeddings = true; /* the head is wte */
    gpt2_builder b = {.m = m, .seed = seed};
    bool old = ts_set_grad_enabled(ctx, false);
    s = build_params(&b);
    ts_set_grad_enabled(ctx, old);
    if (s) {
        ts_gpt2_free(m);
        return s;
    }
    *out = m;
    return TS_OK;
}

const ts_model_config *ts_gpt2_get_config(const ts_gpt2_model *m) {
    return m ? &m->cfg : NULL;
}

int ts_gpt2_num_params(const ts_gpt2_model *m) {
    return m ? m->n_params : 0;
}

const char *ts_gpt2_param_name(const ts_gpt2_model *m, int i) {
    return m && i >= 0 && i < m->n_params ? m->names[i] : NULL;
}

ts_tensor *ts_gpt2_param(const ts_gpt2_model *m, int i) {
    return m && i >= 0 && i < m->n_params ? m->params[i] : NULL;
}

ts_tensor *const *ts_gpt2_params(const ts_gpt2_model *m) {
    return m ? m->params : NULL;
}

ts_tensor *ts_gpt2_find_param(const ts_gpt2_model *m, const char *name) {
    if (!m || !name)
        return NULL;
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->names[i], name))
            return m->params[i];
    return NULL;
}

/* x @ W + b with W (in, out) */
/* w itself, or (bf16 compute) a bf16 copy made here: the cast is recorded,
 * so the gradient reaches the f32 master */
static ts_tensor *compute_copy(const ts_gpt2_model *m, ts_tensor *w) {
    if (!w || !m->compute_bf16 || ts_tensor_dtype(w) != TS_F32)
        return w ? ts_retain(w) : NULL;
    return ts_cast(w, TS_BF16);
}

static ts_tensor *conv1d(const ts_gpt2_model *m, ts_tensor *x, ts_tensor *w,
                         ts_tensor *b) {
    ts_tensor *wc = compute_copy(m, w);
    ts_tensor *y = wc ? ts_matmul(x, wc) : NULL;
    ts_tensor *r = ts_add(y, b);
    ts_release(wc), ts_release(y);
    return r;
}

ts_status ts_gpt2_set_compute_dtype(ts_gpt2_model *m, ts_dtype dt) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    if (dt != TS_F32 && dt != TS_BF16)
        return ts_set_error(m->ctx, TS_ERR_DTYPE,
                            "gpt2: compute dtype must be f32 or bf16, not %s",
                            ts_dtype_name(dt));
    m->compute_bf16 = dt == TS_BF16;
    return TS_OK;
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

/* block i over x (B, T, C) at positions pos0..; with a cache, attends to
 * and appends block i's (B == 1). A new reference; x is borrowed. */
static ts_tensor *block(ts_gpt2_model *m, int64_t i, ts_tensor *x,
                        ts_gpt2_cache *kc, int64_t pos0) {
    const ts_model_config *c = &m->cfg;
    int64_t B = ts_tensor_dim(x, 0), T = ts_tensor_dim(x, 1), C = c->hidden;
    gpt2_layer *L = &m->layer[i];
    ts_tensor *h = ts_layernorm(x, L->ln1_w, L->ln1_b, c->norm_eps);
    ts_tensor *qkv = conv1d(m, h, L->attn_w, L->attn_b);
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
    ts_tensor *o = conv1d(m, ar, L->proj_w, L->proj_b);
    ts_tensor *x1 = ts_add(x, o);
    ts_tensor *h2 = ts_layernorm(x1, L->ln2_w, L->ln2_b, c->norm_eps);
    ts_tensor *f = conv1d(m, h2, L->fc_w, L->fc_b);
    ts_tensor *g = ts_gelu(f, TS_GELU_TANH);
    ts_tensor *mo = conv1d(m, g, L->fc_proj_w, L->fc_proj_b);
    ts_tensor *x2 = ts_add(x1, mo);
    ts_tensor *tmp[] = {h, qkv, q, k, v, a, at, ar, o, x1, h2, f, g, mo};
    for (size_t j = 0; j < sizeof tmp / sizeof *tmp; j++)
        ts_release(tmp[j]);
    return x2;
}

static ts_tensor *block_fn(void *arg, int n, ts_tensor **in) {
    (void)n;
    gpt2_block_ref *r = arg;
    return block(r->m, r->i, in[0], NULL, 0);
}

/* ids (B, T) at positions pos0.. -> logits (B, T or 1, V); with a cache:
 * attends to and appends the layers' caches (B == 1) */
static ts_tensor *forward(ts_gpt2_model *m, ts_tensor *ids, int64_t pos0,
                          ts_gpt2_cache *kc, bool last_only) {
    ts_ctx *ctx = m->ctx;
    const ts_model_config *c = &m->cfg;
    int64_t T = ts_tensor_dim(ids, 1);
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
    /* blocks recomputed in backward when checkpointing a graph (not with
     * a cache: decoding keeps no graph) */
    bool ckpt = m->ckpt && !kc && ts_is_grad_enabled(ctx);
    for (int64_t i = 0; i < c->layers && x; i++) {
        ts_tensor *x2 = ckpt ? ts_checkpoint(block_fn, &m->ckpt[i], 1, &x)
                             : block(m, i, x, kc, pos0);
        ts_release(x);
        x = x2;
    }
    if (last_only && x) { /* the next token needs the last position only */
        ts_tensor *l = ts_slice(x, 1, T - 1, T, 1);
        ts_release(x);
        x = l;
    }
    ts_tensor *hf = ts_layernorm(x, m->lnf_w, m->lnf_b, c->norm_eps);
    ts_tensor *wc = compute_copy(m, m->wte);
    ts_tensor *wt = wc ? ts_transpose(wc, 0, 1) : NULL;
    ts_tensor *logits = wt ? ts_matmul(hf, wt) : NULL;
    ts_release(x), ts_release(hf), ts_release(wc), ts_release(wt);
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

ts_tensor *ts_gpt2_loss(ts_gpt2_model *m, ts_tensor *ids, ts_tensor *targets,
                        ts_tensor **logits_out) {
    if (logits_out)
        *logits_out = NULL;
    if (!m)
        return NULL;
    ts_ctx *ctx = m->ctx;
    if (!ids || !targets) {
        if (ts_ctx_status(ctx) == TS_OK)
            ts_set_error(ctx, TS_ERR_INVALID_ARG,
                         "gpt2_loss: ids or targets is NULL");
        return NULL;
    }
    int64_t B = ts_tensor_dim(ids, 0), T = ts_tensor_dim(ids, 1);
    ts_dtype dt = ts_tensor_dtype(targets);
    if (ts_tensor_ndim(targets) != 2 || ts_tensor_dim(targets, 0) != B ||
        ts_tensor_dim(targets, 1) != T || (dt != TS_I64 && dt != TS_I32)) {
        ts_set_error(ctx, TS_ERR_SHAPE,
                     "gpt2_loss: targets must be i32/i64 of the shape of ids "
                     "[%" PRId64 ", %" PRId64 "]",
                     B, T);
        return NULL;
    }
    ts_tensor *logits = ts_gpt2_forward(m, ids, 0); /* (B, T, V) */
    int64_t lshape[2] = {B * T, m->cfg.vocab}, tshape[1] = {B * T};
    ts_tensor *flat = ts_reshape(logits, 2, lshape);
    ts_tensor *tflat = ts_reshape(targets, 1, tshape);
    ts_tensor *loss = ts_cross_entropy(flat, tflat, -100, TS_REDUCE_MEAN);
    ts_release(flat), ts_release(tflat);
    if (logits_out && loss)
        *logits_out = logits;
    else
        ts_release(logits);
    return loss;
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
