/* qwen3.c — the Qwen3 decoder-only transformer: config checking, the
 * parameters under Hugging Face's names, their initialization, the forward
 * pass to logits and the next-token loss. Built from public ops only (eager
 * now, recorded unchanged in compiled mode); owns ts_qwen3_model and the
 * parameter tensors, never kernels or files (loaders fill parameters through
 * the (name, tensor) list). */
#include "tessera_nn.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define QWEN3_MAX_LAYERS 4096
#define QWEN3_NAME_LEN   96

/* One decoder layer's parameters; borrowed from the model's list. */
typedef struct {
    ts_tensor *q_proj;     /* (H*D, C) */
    ts_tensor *k_proj;     /* (KV*D, C) */
    ts_tensor *v_proj;     /* (KV*D, C) */
    ts_tensor *o_proj;     /* (C, H*D) */
    ts_tensor *q_norm;     /* (D); NULL without qk-norm */
    ts_tensor *k_norm;     /* (D) */
    ts_tensor *q_bias;     /* (H*D); NULL without attention bias */
    ts_tensor *k_bias;     /* (KV*D) */
    ts_tensor *v_bias;     /* (KV*D) */
    ts_tensor *gate_proj;  /* (F, C) */
    ts_tensor *up_proj;    /* (F, C) */
    ts_tensor *down_proj;  /* (C, F) */
    ts_tensor *input_norm; /* (C) */
    ts_tensor *post_norm;  /* (C) */
} qwen3_layer;

struct ts_qwen3_model {
    ts_ctx *ctx;
    ts_qwen3_config cfg;
    ts_tensor *embed;   /* (V, C) */
    ts_tensor *norm;    /* (C) */
    ts_tensor *lm_head; /* (V, C); == embed when tied */
    qwen3_layer *layer;
    int n_params, cap_params;
    ts_tensor **params; /* owned references, state_dict order */
    char (*names)[QWEN3_NAME_LEN];
    /* placement: embedding, each layer, head (final norm + LM head) */
    ts_device embed_dev, head_dev, *layer_dev;
    ts_tensor *head_copy;   /* tied LM head on another device than embed:
                               a copy made at the first forward */
    struct layer_ref *ckpt; /* activation checkpointing: one per layer */
    ts_layer_hook hook;     /* around each layer (parameter sharding) */
    void *hook_arg;
    bool compute_bf16; /* matrices cast to bf16 where used (mixed) */
};

/* a layer as ts_checkpoint's block argument */
typedef struct layer_ref {
    const ts_qwen3_model *m;
    const qwen3_layer *L;
    int64_t index;
} layer_ref;

/* *x to device d when it is elsewhere (takes over the reference) */
static bool move_to(ts_tensor **x, ts_device d) {
    if (!*x)
        return false;
    if (ts_device_equal(ts_tensor_device(*x), d))
        return true;
    ts_tensor *y = ts_to_device(*x, d);
    ts_release(*x);
    *x = y;
    return y != NULL;
}

static ts_tensor *head_weight(ts_qwen3_model *m) {
    if (ts_device_equal(ts_tensor_device(m->lm_head), m->head_dev))
        return m->lm_head;
    if (!m->head_copy)
        m->head_copy = ts_to_device(m->lm_head, m->head_dev);
    return m->head_copy;
}

ts_status ts_qwen3_config_check(ts_ctx *ctx, const ts_qwen3_config *c) {
    if (!c)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "qwen3: NULL config");
    struct {
        const char *name;
        int64_t v;
    } sizes[] = {{"vocab", c->vocab},
                 {"hidden", c->hidden},
                 {"layers", c->layers},
                 {"heads", c->heads},
                 {"kv_heads", c->kv_heads},
                 {"head_dim", c->head_dim},
                 {"intermediate", c->intermediate},
                 {"max_positions", c->max_positions}};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        if (sizes[i].v <= 0)
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "qwen3 config: %s is %" PRId64 " (want > 0)",
                                sizes[i].name, sizes[i].v);
    if (c->layers > QWEN3_MAX_LAYERS)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "qwen3 config: layers is %" PRId64 " (at most %d)",
                            c->layers, QWEN3_MAX_LAYERS);
    if (c->heads % c->kv_heads)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "qwen3 config: heads (%" PRId64
                            ") is not a multiple of kv_heads (%" PRId64 ")",
                            c->heads, c->kv_heads);
    if (c->head_dim % 2)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "qwen3 config: head_dim is %" PRId64
                            " (want even: RoPE rotates two halves)",
                            c->head_dim);
    if (!(c->rms_eps > 0))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "qwen3 config: rms_eps is %g (want > 0)",
                            c->rms_eps);
    if (!(c->rope_theta > 0))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "qwen3 config: rope_theta is %g (want > 0)",
                            c->rope_theta);
    return TS_OK;
}

/* splitmix64: a distinct, well-mixed seed per parameter index. */
static uint64_t param_seed(uint64_t seed, int i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A new parameter named name: Normal(0, 0.02) when normal (1), else ones
 * (0) or zeros (2, biases). */
static ts_tensor *add_param(ts_qwen3_model *m, uint64_t seed, int normal,
                            int ndim, int64_t d0, int64_t d1,
                            const char *name) {
    int64_t shape[2] = {d0, d1};
    int i = m->n_params;
    if (i == m->cap_params)
        return NULL; /* sized in ts_qwen3_new */
    ts_dtype dt = ndim == 2 ? m->cfg.weight_dtype : TS_F32; /* matrices */
    ts_tensor *t =
        m->cfg.no_init
            ? ts_empty(m->ctx, normal == 1 ? dt : TS_F32, ndim, shape)
        : normal == 1
            ? ts_randn(m->ctx, dt, ndim, shape, 0.02, param_seed(seed, i))
            : ts_full(m->ctx, TS_F32, ndim, shape, normal == 2 ? 0.0 : 1.0);
    if (!t)
        return NULL;
    ts_set_requires_grad(t, true);
    m->params[i] = t;
    snprintf(m->names[i], QWEN3_NAME_LEN, "%s", name);
    m->n_params++;
    return t;
}

static bool add_layer(ts_qwen3_model *m, uint64_t seed, int i) {
    const ts_qwen3_config *c = &m->cfg;
    int64_t C = c->hidden, D = c->head_dim, F = c->intermediate;
    int64_t HD = c->heads * D, KVD = c->kv_heads * D;
    qwen3_layer *L = &m->layer[i];
    char name[QWEN3_NAME_LEN];
#define PARAM(field, normal, ndim, d0, d1, suffix)                             \
    do {                                                                       \
        snprintf(name, sizeof name, "model.layers.%d.%s", i, suffix);          \
        if (!(L->field = add_param(m, seed, normal, ndim, d0, d1, name)))      \
            return false;                                                      \
    } while (0)
    PARAM(q_proj, true, 2, HD, C, "self_attn.q_proj.weight");
    if (c->attention_bias)
        PARAM(q_bias, 2, 1, HD, 0, "self_attn.q_proj.bias");
    PARAM(k_proj, true, 2, KVD, C, "self_attn.k_proj.weight");
    if (c->attention_bias)
        PARAM(k_bias, 2, 1, KVD, 0, "self_attn.k_proj.bias");
    PARAM(v_proj, true, 2, KVD, C, "self_attn.v_proj.weight");
    if (c->attention_bias)
        PARAM(v_bias, 2, 1, KVD, 0, "self_attn.v_proj.bias");
    PARAM(o_proj, true, 2, C, HD, "self_attn.o_proj.weight");
    if (!c->no_qk_norm) {
        PARAM(q_norm, false, 1, D, 0, "self_attn.q_norm.weight");
        PARAM(k_norm, false, 1, D, 0, "self_attn.k_norm.weight");
    }
    PARAM(gate_proj, true, 2, F, C, "mlp.gate_proj.weight");
    PARAM(up_proj, true, 2, F, C, "mlp.up_proj.weight");
    PARAM(down_proj, true, 2, C, F, "mlp.down_proj.weight");
    PARAM(input_norm, false, 1, C, 0, "input_layernorm.weight");
    PARAM(post_norm, false, 1, C, 0, "post_attention_layernorm.weight");
#undef PARAM
    return true;
}

ts_status ts_qwen3_new(ts_ctx *ctx, const ts_qwen3_config *cfg, uint64_t seed,
                       ts_qwen3_model **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "qwen3_new: NULL out");
    *out = NULL;
    ts_status s = ts_qwen3_config_check(ctx, cfg);
    if (s != TS_OK)
        return s;
    ts_qwen3_model *m = calloc(1, sizeof *m);
    int cap = 3 + 14 * (int)cfg->layers;
    if (m) {
        m->ctx = ctx;
        m->cfg = *cfg;
        m->cap_params = cap;
        m->layer = calloc((size_t)cfg->layers, sizeof *m->layer);
        m->params = calloc((size_t)cap, sizeof *m->params);
        m->names = calloc((size_t)cap, sizeof *m->names);
    }
    if (!m || !m->layer || !m->params || !m->names) {
        ts_qwen3_free(m);
        return ts_set_error(ctx, TS_ERR_OOM, "qwen3_new: out of memory");
    }
    const ts_device_map *dm = cfg->device_map;
    m->cfg.device_map = NULL; /* the model keeps its own copy below */
    m->layer_dev = calloc((size_t)cfg->layers + 1, sizeof *m->layer_dev);
    if (!m->layer_dev || (dm && dm->n_layers != cfg->layers)) {
        ts_qwen3_free(m);
        return dm ? ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                 "qwen3_new: the device map places %d layers; "
                                 "the model has %lld",
                                 dm->n_layers, (long long)cfg->layers)
                  : ts_set_error(ctx, TS_ERR_OOM, "qwen3_new: out of memory");
    }
    ts_device here = ts_get_device(ctx);
    m->embed_dev = dm ? dm->embed : here;
    m->head_dev = dm ? dm->head : here;
    for (int64_t i = 0; i < cfg->layers; i++)
        m->layer_dev[i] = dm ? dm->layer[i] : here;
    int64_t V = cfg->vocab, C = cfg->hidden;
    ts_set_device(ctx, m->embed_dev);
    bool ok = (m->embed = add_param(m, seed, true, 2, V, C,
                                    "model.embed_tokens.weight")) != NULL;
    for (int i = 0; ok && i < (int)cfg->layers; i++) {
        ts_set_device(ctx, m->layer_dev[i]);
        ok = add_layer(m, seed, i);
    }
    ts_set_device(ctx, m->head_dev);
    ok = ok && (m->norm = add_param(m, seed, false, 1, C, 0,
                                    "model.norm.weight")) != NULL;
    if (ok)
        m->lm_head = cfg->tie_word_embeddings
                         ? m->embed
                         : add_param(m, seed, true, 2, V, C, "lm_head.weight");
    ts_set_device(ctx, here);
    if (!ok || !m->lm_head) {
        ts_qwen3_free(m);
        s = ts_ctx_status(ctx);
        return s != TS_OK ? s
                          : ts_set_error(ctx, TS_ERR_OOM,
                                         "qwen3_new: cannot create parameters");
    }
    *out = m;
    return TS_OK;
}

void ts_qwen3_free(ts_qwen3_model *m) {
    if (!m)
        return;
    for (int i = 0; i < m->n_params; i++)
        ts_release(m->params[i]);
    free(m->params);
    free(m->names);
    free(m->layer);
    free(m->ckpt);
    free(m->layer_dev);
    ts_release(m->head_copy);
    free(m);
}

ts_status ts_qwen3_set_param(ts_qwen3_model *m, int i, ts_tensor *t) {
    if (!m || !t)
        return TS_ERR_INVALID_ARG;
    ts_tensor *old = i >= 0 && i < m->n_params ? m->params[i] : NULL;
    if (!old || ts_tensor_dtype(t) != ts_tensor_dtype(old) ||
        ts_tensor_ndim(t) != ts_tensor_ndim(old) ||
        memcmp(ts_tensor_shape(t), ts_tensor_shape(old),
               sizeof(int64_t) * (size_t)ts_tensor_ndim(old)) ||
        !ts_device_equal(ts_tensor_device(t), ts_tensor_device(old)))
        return ts_set_error(m->ctx, TS_ERR_INVALID_ARG,
                            "qwen3_set_param: %d does not name a parameter of "
                            "that dtype, shape and device",
                            i);
    /* every borrowed pointer to the old tensor now points to t */
    ts_tensor **named[] = {&m->embed, &m->norm, &m->lm_head};
    for (size_t k = 0; k < 3; k++)
        if (*named[k] == old)
            *named[k] = t;
    for (int64_t l = 0; l < m->cfg.layers; l++) {
        ts_tensor **f = &m->layer[l].q_proj; /* the struct is all tensors */
        for (size_t k = 0; k < sizeof(qwen3_layer) / sizeof(ts_tensor *); k++)
            if (f[k] == old)
                f[k] = t;
    }
    ts_set_requires_grad(t, ts_requires_grad(old));
    m->params[i] = ts_retain(t);
    ts_release(old);
    return TS_OK;
}

const ts_qwen3_config *ts_qwen3_get_config(const ts_qwen3_model *m) {
    return m ? &m->cfg : NULL;
}

int ts_qwen3_num_params(const ts_qwen3_model *m) {
    return m ? m->n_params : 0;
}

const char *ts_qwen3_param_name(const ts_qwen3_model *m, int i) {
    return m && i >= 0 && i < m->n_params ? m->names[i] : NULL;
}

ts_tensor *ts_qwen3_param(const ts_qwen3_model *m, int i) {
    return m && i >= 0 && i < m->n_params ? m->params[i] : NULL;
}

ts_tensor *const *ts_qwen3_params(const ts_qwen3_model *m) {
    return m ? m->params : NULL;
}

ts_tensor *ts_qwen3_find_param(const ts_qwen3_model *m, const char *name) {
    if (!m || !name)
        return NULL;
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->names[i], name) == 0)
            return m->params[i];
    return NULL;
}

/* h (B, T, C) -> projected heads (B, n, T, D): linear, per-head RMSNorm over
 * D when norm_w is set (Qwen3's qk-norm), heads to dim 1, RoPE when cos is
 * set. */
static ts_tensor *project_heads(const ts_qwen3_model *m, ts_tensor *h,
                                ts_tensor *w, ts_tensor *b, ts_tensor *norm_w,
                                int64_t n, ts_tensor *cos, ts_tensor *sin) {
    int64_t B = ts_tensor_dim(h, 0), T = ts_tensor_dim(h, 1);
    int64_t shape[4] = {B, T, n, m->cfg.head_dim};
    ts_tensor *p = ts_linear(h, w, b);      /* (B, T, n*D) */
    ts_tensor *r = ts_reshape(p, 4, shape); /* (B, T, n, D), a view */
    ts_release(p);
    if (norm_w) {
        ts_tensor *nr = ts_rmsnorm(r, norm_w, m->cfg.rms_eps);
        ts_release(r);
        r = nr;
    }
    ts_tensor *t = ts_transpose(r, 1, 2); /* (B, n, T, D) */
    ts_release(r);
    if (!cos)
        return t;
    ts_tensor *rot = ts_rope(t, cos, sin);
    ts_release(t);
    return rot;
}

/* A layer's KV pools and the step's meta (ts_paged_attention) */
typedef struct {
    ts_tensor *k_pool, *v_pool, *meta;
} paged_ref;

/* One layer's keys and values for positions 0..len-1 (B, KV, max_T, D). */
typedef struct {
    ts_tensor *k, *v;
    int64_t len;
} kv_slot;

/* Writes the new k or v (B, KV, T, D) at positions len..len+T-1 of the
 * cache and returns the view of positions 0..len+T-1. */
static ts_tensor *cache_append(ts_tensor *cache, ts_tensor *x, int64_t len) {
    int64_t T = ts_tensor_dim(x, 2);
    ts_tensor *dst = ts_slice(cache, 2, len, len + T, 1);
    ts_status s = dst ? ts_copy_(dst, x) : TS_ERR_INVALID_ARG;
    ts_release(dst);
    return s == TS_OK ? ts_slice(cache, 2, 0, len + T, 1) : NULL;
}

/* x (B, T, C) -> self-attention output after o_proj (B, T, C); with a
 * cache slot, attends to the cached positions too and appends its own. */
static ts_tensor *attention_block(const ts_qwen3_model *m, const qwen3_layer *L,
                                  ts_tensor *x, ts_tensor *cos, ts_tensor *sin,
                                  const kv_slot *kv, const paged_ref *pg) {
    const ts_qwen3_config *c = &m->cfg;
    int64_t B = ts_tensor_dim(x, 0), T = ts_tensor_dim(x, 1);
    ts_tensor *h = ts_rmsnorm(x, L->input_norm, c->rms_eps);
    ts_tensor *q = project_heads(m, h, L->q_proj, L->q_bias, L->q_norm,
                                 c->heads, cos, sin); /* (B, H, T, D) */
    ts_tensor *k = project_heads(m, h, L->k_proj, L->k_bias, L->k_norm,
                                 c->kv_heads, cos, sin); /* (B, KV, T, D) */
    ts_tensor *v = project_heads(m, h, L->v_proj, L->v_bias, NULL, c->kv_heads,
                                 NULL, NULL); /* (B, KV, T, D) */
    ts_release(h);
    if (kv) { /* keys and values of every position so far */
        ts_tensor *ka = cache_append(kv->k, k, kv->len);
        ts_tensor *va = cache_append(kv->v, v, kv->len);
        ts_release(k), ts_release(v);
        k = ka, v = va;
    }
    ts_tensor *a =
        pg ? ts_paged_attention(q, k, v, pg->k_pool, pg->v_pool, pg->meta, 0)
           : ts_attention(q, k, v, NULL, true, 0); /* (B, H, T, D) */
    ts_release(q), ts_release(k), ts_release(v);
    ts_tensor *at = ts_transpose(a, 1, 2); /* (B, T, H, D) */
    ts_release(a);
    int64_t shape[3] = {B, T, c->heads * c->head_dim};
    ts_tensor *ar = ts_reshape(at, 3, shape); /* (B, T, H*D), a copy */
    ts_release(at);
    ts_tensor *o = ts_linear(ar, L->o_proj, NULL);
    ts_release(ar);
    return o;
}

/* a f32 matrix cast to bf16 (recorded, so its gradient reaches the f32
 * master), else w itself; a new reference */
static ts_tensor *compute_copy(const ts_qwen3_model *m, ts_tensor *w) {
    if (!w || !m->compute_bf16 || ts_tensor_dtype(w) != TS_F32)
        return w ? ts_retain(w) : NULL;
    return ts_cast(w, TS_BF16);
}

static ts_tensor *layer_body(const ts_qwen3_model *m, const qwen3_layer *L,
                             ts_tensor *x, ts_tensor *cos, ts_tensor *sin,
                             const kv_slot *kv, const paged_ref *pg);

/* x (B, T, C) -> x + attn(norm(x)) -> that + mlp(norm(that)); takes over
 * the reference to x. With bf16 compute, the layer's matrices are bf16
 * copies of the f32 masters for this call. */
static ts_tensor *decoder_layer(const ts_qwen3_model *m, const qwen3_layer *L,
                                ts_tensor *x, ts_tensor *cos, ts_tensor *sin,
                                const kv_slot *kv, const paged_ref *pg) {
    if (!m->compute_bf16)
        return layer_body(m, L, x, cos, sin, kv, pg);
    qwen3_layer c = *L;
    ts_tensor **mats[] = {&c.q_proj,    &c.k_proj,  &c.v_proj,   &c.o_proj,
                          &c.gate_proj, &c.up_proj, &c.down_proj};
    bool ok = true;
    for (size_t k = 0; k < sizeof mats / sizeof *mats; k++)
        ok &= (*mats[k] = compute_copy(m, *mats[k])) != NULL;
    ts_tensor *y = ok ? layer_body(m, &c, x, cos, sin, kv, pg) : NULL;
    if (!ok)
        ts_release(x);
    for (size_t k = 0; k < sizeof mats / sizeof *mats; k++)
        ts_release(*mats[k]);
    return y;
}

static ts_tensor *layer_body(const ts_qwen3_model *m, const qwen3_layer *L,
                             ts_tensor *x, ts_tensor *cos, ts_tensor *sin,
                             const kv_slot *kv, const paged_ref *pg) {
    ts_tensor *a = attention_block(m, L, x, cos, sin, kv, pg);
    ts_tensor *x1 = ts_add(x, a);
    ts_release(x), ts_release(a);
    ts_tensor *h = ts_rmsnorm(x1, L->post_norm, m->cfg.rms_eps);
    ts_tensor *f = ts_swiglu_mlp(h, L->gate_proj, L->up_proj, L->down_proj);
    ts_release(h);
    ts_tensor *x2 = ts_add(x1, f);
    ts_release(x1), ts_release(f);
    return x2;
}

static ts_status rope_at(const ts_qwen3_model *m, const int32_t *pos, int64_t n,
                         ts_tensor **cos, ts_tensor **sin);

/* in: x, cos, sin (borrowed). With grad mode on this is the recompute in
 * backward: the layer hook is told first. */
static ts_tensor *layer_block(void *arg, int n, ts_tensor **in) {
    (void)n;
    const layer_ref *r = arg;
    if (r->m->hook && ts_is_grad_enabled(r->m->ctx) &&
        r->m->hook(r->m->hook_arg, r->index, true, true) != TS_OK)
        return NULL;
    return decoder_layer(r->m, r->L, ts_retain(in[0]), in[1], in[2], NULL,
                         NULL);
}

static ts_status layer_done(void *arg) {
    const layer_ref *r = arg;
    return r->m->hook ? r->m->hook(r->m->hook_arg, r->index, false, true)
                      : TS_OK;
}

ts_status ts_qwen3_set_compute_dtype(ts_qwen3_model *m, ts_dtype dt) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    if (dt != TS_F32 && dt != TS_BF16)
        return ts_set_error(m->ctx, TS_ERR_DTYPE,
                            "qwen3: compute dtype must be f32 or bf16, not %s",
                            ts_dtype_name(dt));
    m->compute_bf16 = dt == TS_BF16;
    return TS_OK;
}

ts_status ts_qwen3_set_layer_hook(ts_qwen3_model *m, ts_layer_hook fn,
                                  void *arg) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    m->hook = fn, m->hook_arg = arg;
    return TS_OK;
}

ts_status ts_qwen3_set_checkpointing(ts_qwen3_model *m, bool on) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    if (!on) {
        free(m->ckpt);
        m->ckpt = NULL;
        return TS_OK;
    }
    if (m->ckpt)
        return TS_OK;
    int64_t L = m->cfg.layers;
    m->ckpt = malloc(sizeof *m->ckpt * (size_t)(L > 0 ? L : 1));
    if (!m->ckpt)
        return ts_set_error(m->ctx, TS_ERR_OOM, "checkpointing: out of memory");
    for (int64_t i = 0; i < L; i++)
        m->ckpt[i] = (layer_ref){m, &m->layer[i], i};
    return TS_OK;
}

/* cos, sin (T, D) for positions pos0.. */
static ts_status rope_for(const ts_qwen3_model *m, int64_t T, int64_t pos0,
                          ts_tensor **cos, ts_tensor **sin) {
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(T + 1));
    if (!pos)
        return ts_set_error(m->ctx, TS_ERR_OOM, "rope: out of memory");
    for (int64_t t = 0; t < T; t++)
        pos[t] = (int32_t)(pos0 + t);
    ts_status s = rope_at(m, pos, T, cos, sin);
    free(pos);
    return s;
}

/* token embeddings as f32, whatever the table's dtype (B, T, C) */
static ts_tensor *embed_f32(const ts_qwen3_model *m, ts_tensor *ids) {
    ts_tensor *e = ts_embedding(m->embed, ids);
    if (!e || ts_tensor_dtype(e) == TS_F32)
        return e;
    ts_tensor *f = ts_cast(e, TS_F32);
    ts_release(e);
    return f;
}

static bool check_ids(ts_ctx *ctx, const char *what, ts_tensor *ids) {
    if (!ids) {
        if (ts_ctx_status(ctx) == TS_OK)
            ts_set_error(ctx, TS_ERR_INVALID_ARG, "qwen3: %s is NULL", what);
        return false;
    }
    ts_dtype dt = ts_tensor_dtype(ids);
    if (ts_tensor_ndim(ids) != 2 || (dt != TS_I64 && dt != TS_I32)) {
        ts_set_error(ctx, TS_ERR_SHAPE,
                     "qwen3: %s must be (B, T) i64 or i32, got %d dims of %s",
                     what, ts_tensor_ndim(ids), ts_dtype_name(dt));
        return false;
    }
    return true;
}

/* ids (B, T) at positions pos0.. through embedding, layers (with their KV
 * slots when given) and head -> logits (B, T or 1, V), moving activations
 * to each part's device where the placement changes device. */
static ts_tensor *run_layers(ts_qwen3_model *m, ts_tensor *ids, int64_t pos0,
                             kv_slot *slots, bool last_only) {
    ts_ctx *ctx = m->ctx;
    const ts_qwen3_config *c = &m->cfg;
    int64_t T = ts_tensor_dim(ids, 1);
    ts_device here = ts_get_device(ctx);
    ts_tensor *id_moved = ts_to_device(ids, m->embed_dev);
    ts_tensor *x = id_moved ? embed_f32(m, id_moved) : NULL; /* (B, T, C) */
    ts_release(id_moved);
    ts_tensor *cos = NULL, *sin = NULL;
    ts_set_device(ctx, c->layers ? m->layer_dev[0] : m->embed_dev);
    if (x && rope_for(m, T, pos0, &cos, &sin) != TS_OK)
        ts_release(x), x = NULL;
    for (int64_t i = 0; i < c->layers && x; i++) {
        ts_device d = m->layer_dev[i];
        if (!move_to(&x, d) || !move_to(&cos, d) || !move_to(&sin, d)) {
            ts_release(x), x = NULL;
            break;
        }
        if (m->hook && m->hook(m->hook_arg, i, true, false) != TS_OK) {
            ts_release(x), x = NULL;
            break;
        }
        if (m->ckpt && !slots) { /* keeps only the layer's input */
            ts_tensor *in[3] = {x, cos, sin};
            ts_tensor *y =
                ts_checkpoint_ex(layer_block, layer_done, &m->ckpt[i], 3, in);
            ts_release(x);
            x = y;
        } else
            x = decoder_layer(m, &m->layer[i], x, cos, sin,
                              slots ? &slots[i] : NULL, NULL);
        if (m->hook && x && m->hook(m->hook_arg, i, false, false) != TS_OK)
            ts_release(x), x = NULL;
    }
    ts_release(cos), ts_release(sin);
    ts_set_device(ctx, here);
    if (last_only && x) { /* the next token needs the last position only */
        ts_tensor *l = ts_slice(x, 1, T - 1, T, 1);
        ts_release(x);
        x = l;
    }
    if (!move_to(&x, m->head_dev))
        return NULL;
    ts_tensor *h = ts_rmsnorm(x, m->norm, c->rms_eps);
    ts_release(x);
    ts_tensor *w = h ? compute_copy(m, head_weight(m)) : NULL;
    ts_tensor *logits = w ? ts_linear(h, w, NULL) : NULL; /* (B, T, V) */
    ts_release(h), ts_release(w);
    return logits;
}

/* ids (B, T) -> logits (B, T, V) */
ts_tensor *ts_qwen3_forward(ts_qwen3_model *m, ts_tensor *ids, int64_t pos0) {
    if (!m)
        return NULL;
    ts_ctx *ctx = m->ctx;
    const ts_qwen3_config *c = &m->cfg;
    if (!check_ids(ctx, "ids", ids))
        return NULL;
    int64_t T = ts_tensor_dim(ids, 1);
    if (pos0 < 0 || T > c->max_positions || pos0 > c->max_positions - T) {
        ts_set_error(ctx, TS_ERR_RANGE,
                     "qwen3_forward: positions %" PRId64 "..%" PRId64
                     " outside max_positions %" PRId64,
                     pos0, pos0 + T - 1, c->max_positions);
        return NULL;
    }
    return run_layers(m, ids, pos0, NULL, false);
}

ts_tensor *ts_qwen3_loss(ts_qwen3_model *m, ts_tensor *ids, ts_tensor *targets,
                         ts_tensor **logits_out) {
    if (logits_out)
        *logits_out = NULL;
    if (!m)
        return NULL;
    ts_ctx *ctx = m->ctx;
    if (!check_ids(ctx, "ids", ids) || !check_ids(ctx, "targets", targets))
        return NULL;
    int64_t B = ts_tensor_dim(ids, 0), T = ts_tensor_dim(ids, 1);
    if (ts_tensor_dim(targets, 0) != B || ts_tensor_dim(targets, 1) != T) {
        ts_set_error(ctx, TS_ERR_SHAPE,
                     "qwen3_loss: targets [%" PRId64 ", %" PRId64
                     "] do not match ids [%" PRId64 ", %" PRId64 "]",
                     ts_tensor_dim(targets, 0), ts_tensor_dim(targets, 1), B,
                     T);
        return NULL;
    }
    ts_tensor *logits = ts_qwen3_forward(m, ids, 0);
    int64_t lshape[2] = {B * T, m->cfg.vocab}, tshape[1] = {B * T};
    ts_tensor *flat = ts_reshape(logits, 2, lshape);   /* (B*T, V) */
    ts_tensor *tflat = ts_reshape(targets, 1, tshape); /* (B*T) */
    ts_tensor *loss = ts_cross_entropy(flat, tflat, -100, TS_REDUCE_MEAN);
    ts_release(flat), ts_release(tflat);
    if (logits_out && loss)
        *logits_out = logits;
    else
        ts_release(logits);
    return loss;
}

/* ---- KV cache and generation ---- */

struct ts_qwen3_cache {
    ts_qwen3_model *m;
    int64_t B, max_T, len;
    kv_slot *slot; /* one per layer */
};

ts_status ts_qwen3_cache_new(ts_qwen3_model *m, int64_t B, int64_t max_T,
                             ts_qwen3_cache **out) {
    if (!m || !out)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    const ts_qwen3_config *c = &m->cfg;
    if (B < 1 || max_T < 1 || max_T > c->max_positions)
        return ts_set_error(
            m->ctx, TS_ERR_RANGE,
            "qwen3_cache_new: batch %lld and length %lld (want >= 1, length "
            "<= max_positions %lld)",
            (long long)B, (long long)max_T, (long long)c->max_positions);
    ts_qwen3_cache *kc = calloc(1, sizeof *kc);
    if (kc)
        kc->slot = calloc((size_t)c->layers, sizeof *kc->slot);
    if (!kc || !kc->slot) {
        free(kc);
        return ts_set_error(m->ctx, TS_ERR_OOM,
                            "qwen3_cache_new: out of memory");
    }
    kc->m = m, kc->B = B, kc->max_T = max_T;
    int64_t shape[4] = {B, c->kv_heads, max_T, c->head_dim};
    ts_device here = ts_get_device(m->ctx);
    for (int64_t i = 0; i < c->layers; i++) {
        ts_set_device(m->ctx, m->layer_dev[i]); /* beside its layer */
        kc->slot[i].k = ts_zeros(m->ctx, TS_F32, 4, shape);
        kc->slot[i].v = ts_zeros(m->ctx, TS_F32, 4, shape);
        ts_set_device(m->ctx, here);
        if (!kc->slot[i].k || !kc->slot[i].v) {
            ts_qwen3_cache_free(kc);
            return ts_ctx_status(m->ctx);
        }
    }
    *out = kc;
    return TS_OK;
}

void ts_qwen3_cache_free(ts_qwen3_cache *kc) {
    if (!kc)
        return;
    for (int64_t i = 0; i < kc->m->cfg.layers; i++)
        ts_release(kc->slot[i].k), ts_release(kc->slot[i].v);
    free(kc->slot);
    free(kc);
}

int64_t ts_qwen3_cache_len(const ts_qwen3_cache *kc) {
    return kc ? kc->len : 0;
}
void ts_qwen3_cache_reset(ts_qwen3_cache *kc) {
    if (kc)
        kc->len = 0;
}

void ts_qwen3_cache_truncate(ts_qwen3_cache *kc, int64_t len) {
    if (kc && len >= 0 && len < kc->len)
        kc->len = len; /* later positions are overwritten as they come */
}

static ts_tensor *forward_cached(ts_qwen3_model *m, ts_qwen3_cache *kc,
                                 ts_tensor *ids, bool last_only) {
    if (!m || !kc)
        return NULL;
    ts_ctx *ctx = m->ctx;
    const ts_qwen3_config *c = &m->cfg;
    if (!check_ids(ctx, "ids", ids))
        return NULL;
    int64_t B = ts_tensor_dim(ids, 0), T = ts_tensor_dim(ids, 1);
    if (B != kc->B || kc->len + T > kc->max_T) {
        ts_set_error(
            ctx, TS_ERR_RANGE,
            "qwen3_forward_cached: %lld x %lld new tokens do not fit the cache "
            "(batch %lld, %lld of %lld positions used)",
            (long long)B, (long long)T, (long long)kc->B, (long long)kc->len,
            (long long)kc->max_T);
        return NULL;
    }
    for (int64_t i = 0; i < c->layers; i++)
        kc->slot[i].len = kc->len;
    ts_tensor *logits = run_layers(m, ids, kc->len, kc->slot, last_only);
    if (logits)
        kc->len += T;
    return logits;
}

ts_tensor *ts_qwen3_forward_cached(ts_qwen3_model *m, ts_qwen3_cache *kc,
                                   ts_tensor *ids) {
    return forward_cached(m, kc, ids, false);
}

ts_tensor *ts_qwen3_forward_cached_last(ts_qwen3_model *m, ts_qwen3_cache *kc,
                                        ts_tensor *ids) {
    return forward_cached(m, kc, ids, true);
}

typedef struct {
    ts_qwen3_model *m;
    ts_qwen3_cache *kc;
} qwen3_step;

static ts_tensor *qwen3_next_logits(void *arg, ts_tensor *ids) {
    qwen3_step *q = arg;
    return ts_qwen3_forward_cached_last(q->m, q->kc, ids);
}

ts_status ts_qwen3_generate_greedy(ts_qwen3_model *m, const int64_t *prompt,
                                   int64_t n_prompt, int64_t n_new,
                                   int64_t *out) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    qwen3_step q = {m, NULL};
    if (n_prompt >= 1 && n_new >= 0 &&
        ts_qwen3_cache_new(m, 1, n_prompt + n_new, &q.kc) != TS_OK)
        return ts_ctx_status(m->ctx);
    ts_status s = ts_generate_greedy_with(m->ctx, qwen3_next_logits, &q, prompt,
                                          n_prompt, n_new, out);
    ts_qwen3_cache_free(q.kc);
    return s;
}

/* ---- paged KV cache (serving) ---- */

struct ts_qwen3_kv_pool {
    ts_qwen3_model *m;
    int64_t n_blocks, block_size;
    ts_tensor **k, **v; /* per layer (blocks, KV, block_size, D), beside it */
};

ts_status ts_qwen3_kv_pool_new(ts_qwen3_model *m, int64_t n_blocks,
                               int64_t block_size, ts_qwen3_kv_pool **out) {
    if (!m || !out)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    const ts_qwen3_config *c = &m->cfg;
    if (n_blocks < 1 || block_size < 1 || block_size > 1024)
        return ts_set_error(m->ctx, TS_ERR_RANGE,
                            "kv_pool: %lld blocks of %lld positions (want at "
                            "least one block of 1..1024)",
                            (long long)n_blocks, (long long)block_size);
    ts_qwen3_kv_pool *p = calloc(1, sizeof *p);
    if (p) {
        p->k = calloc((size_t)c->layers, sizeof *p->k);
        p->v = calloc((size_t)c->layers, sizeof *p->v);
    }
    if (!p || !p->k || !p->v) {
        if (p)
            free(p->k), free(p->v);
        free(p);
        return ts_set_error(m->ctx, TS_ERR_OOM, "kv_pool: out of memory");
    }
    p->m = m, p->n_blocks = n_blocks, p->block_size = block_size;
    int64_t shape[4] = {n_blocks, c->kv_heads, block_size, c->head_dim};
    ts_device here = ts_get_device(m->ctx);
    ts_status s = TS_OK;
    for (int64_t i = 0; i < c->layers && s == TS_OK; i++) {
        ts_set_device(m->ctx, m->layer_dev[i]);
        p->k[i] = ts_zeros(m->ctx, TS_F32, 4, shape);
        p->v[i] = ts_zeros(m->ctx, TS_F32, 4, shape);
        if (!p->k[i] || !p->v[i])
            s = ts_ctx_status(m->ctx);
    }
    ts_set_device(m->ctx, here);
    if (s != TS_OK) {
        ts_qwen3_kv_pool_free(p);
        return s;
    }
    *out = p;
    return TS_OK;
}

void ts_qwen3_kv_pool_free(ts_qwen3_kv_pool *p) {
    if (!p)
        return;
    for (int64_t i = 0; i < p->m->cfg.layers; i++)
        ts_release(p->k[i]), ts_release(p->v[i]);
    free(p->k), free(p->v), free(p);
}

static ts_status kv_pool_copy(ts_qwen3_kv_pool *p, int64_t block, float *out,
                              const float *in) {
    if (!p || (!out && !in))
        return TS_ERR_INVALID_ARG;
    if (block < 0 || block >= p->n_blocks)
        return ts_set_error(p->m->ctx, TS_ERR_RANGE,
                            "kv_pool: block %lld of %lld", (long long)block,
                            (long long)p->n_blocks);
    const ts_qwen3_config *c = &p->m->cfg;
    size_t slab = (size_t)(c->kv_heads * p->block_size * c->head_dim);
    for (int64_t i = 0; i < c->layers; i++)
        for (int kv = 0; kv < 2; kv++) {
            float *pool = ts_tensor_data(kv ? p->v[i] : p->k[i]);
            if (!pool)
                return ts_ctx_status(p->m->ctx);
            pool += (size_t)block * slab;
            size_t at = (size_t)(2 * i + kv) * slab;
            if (out)
                memcpy(out + at, pool, slab * sizeof(float));
            else
                memcpy(pool, in + at, slab * sizeof(float));
        }
    return TS_OK;
}

ts_status ts_qwen3_kv_pool_read_block(ts_qwen3_kv_pool *p, int64_t block,
                                      void *out) {
    return out ? kv_pool_copy(p, block, out, NULL) : TS_ERR_INVALID_ARG;
}

ts_status ts_qwen3_kv_pool_write_block(ts_qwen3_kv_pool *p, int64_t block,
                                       const void *in) {
    return in ? kv_pool_copy(p, block, NULL, in) : TS_ERR_INVALID_ARG;
}

int64_t ts_qwen3_kv_block_bytes(const ts_qwen3_config *c, int64_t block_size) {
    return 2 * c->layers * c->kv_heads * block_size * c->head_dim * 4;
}

/* cos, sin (n, D) at the given positions with the config's rope: HF's
 * default (inv_freq in f32, as ts_rope_tables), or Llama 3.1's
 * rope_scaling of type llama3 (long wavelengths divided by factor, short
 * ones kept, a smooth blend between) */
static ts_status rope_at(const ts_qwen3_model *m, const int32_t *pos, int64_t n,
                         ts_tensor **cos, ts_tensor **sin) {
    const ts_qwen3_config *c = &m->cfg;
    int64_t D = c->head_dim, half = D / 2, shape[2] = {n, D};
    float *cb = malloc(sizeof(float) * (size_t)(n * D + 1));
    float *sb = malloc(sizeof(float) * (size_t)(n * D + 1));
    if (!cb || !sb) {
        free(cb), free(sb);
        return ts_set_error(m->ctx, TS_ERR_OOM, "rope: out of memory");
    }
    double old = (double)c->rope_original_max_positions;
    for (int64_t i = 0; i < half; i++) {
        double inv = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)D);
        if (c->rope_llama3) {
            double low_wl = old / c->rope_low_freq_factor,
                   high_wl = old / c->rope_high_freq_factor,
                   wl = 2 * M_PI / inv;
            if (wl > low_wl) {
                inv /= c->rope_factor;
            } else if (wl >= high_wl) {
                double smooth =
                    (old / wl - c->rope_low_freq_factor) /
                    (c->rope_high_freq_factor - c->rope_low_freq_factor);
                inv = (1 - smooth) * inv / c->rope_factor + smooth * inv;
            }
        }
        float fi = (float)inv;
        for (int64_t t = 0; t < n; t++) {
            float ang = (float)pos[t] * fi;
            cb[t * D + i] = cb[t * D + i + half] = cosf(ang);
            sb[t * D + i] = sb[t * D + i + half] = sinf(ang);
        }
    }
    *cos = ts_from_data(m->ctx, TS_F32, 2, shape, cb);
    *sin = ts_from_data(m->ctx, TS_F32, 2, shape, sb);
    free(cb), free(sb);
    return *cos && *sin ? TS_OK : ts_ctx_status(m->ctx);
}

ts_tensor *ts_qwen3_forward_paged(ts_qwen3_model *m, ts_qwen3_kv_pool *pool,
                                  ts_tensor *ids, const int32_t *positions,
                                  ts_tensor *meta, const int32_t *rows,
                                  int64_t n_rows) {
    if (!m || !pool || !positions || !meta || !rows || n_rows < 1)
        return NULL;
    ts_ctx *ctx = m->ctx;
    const ts_qwen3_config *c = &m->cfg;
    if (!check_ids(ctx, "ids", ids))
        return NULL;
    int64_t N = ts_tensor_dim(ids, 1);
    for (int64_t t = 0; t < N; t++)
        if (positions[t] < 0 || positions[t] >= c->max_positions) {
            ts_set_error(ctx, TS_ERR_RANGE,
                         "forward_paged: position %d outside max_positions "
                         "%lld",
                         positions[t], (long long)c->max_positions);
            return NULL;
        }
    for (int64_t r = 0; r < n_rows; r++)
        if (rows[r] < 0 || rows[r] >= N) {
            ts_set_error(ctx, TS_ERR_RANGE,
                         "forward_paged: logits row %d outside the %lld "
                         "tokens",
                         rows[r], (long long)N);
            return NULL;
        }
    ts_device here = ts_get_device(ctx);
    ts_tensor *id_moved = ts_to_device(ids, m->embed_dev);
    ts_tensor *x = id_moved ? embed_f32(m, id_moved) : NULL; /* (1, N, C) */
    ts_release(id_moved);
    ts_tensor *cos = NULL, *sin = NULL, *mt = ts_retain(meta);
    ts_set_device(ctx, c->layers ? m->layer_dev[0] : m->embed_dev);
    if (x && rope_at(m, positions, N, &cos, &sin) != TS_OK)
        ts_release(x), x = NULL;
    for (int64_t i = 0; i < c->layers && x; i++) {
        ts_device d = m->layer_dev[i];
        if (!move_to(&x, d) || !move_to(&cos, d) || !move_to(&sin, d) ||
            !move_to(&mt, d)) {
            ts_release(x), x = NULL;
            break;
        }
        paged_ref pg = {pool->k[i], pool->v[i], mt};
        x = decoder_layer(m, &m->layer[i], x, cos, sin, NULL, &pg);
    }
    ts_release(cos), ts_release(sin), ts_release(mt);
    ts_set_device(ctx, here);
    if (!move_to(&x, m->head_dev))
        return NULL;
    /* the rows whose next token is wanted: x (N, C) gathered */
    int64_t flat[2] = {N, c->hidden}, rshape[1] = {n_rows};
    ts_tensor *xf = ts_reshape(x, 2, flat);
    ts_release(x);
    ts_set_device(ctx, m->head_dev);
    ts_tensor *idx = ts_from_data(ctx, TS_I32, 1, rshape, rows);
    ts_set_device(ctx, here);
    ts_tensor *sel = xf && idx ? ts_embedding(xf, idx) : NULL; /* (n, C) */
    ts_release(xf), ts_release(idx);
    ts_tensor *h = sel ? ts_rmsnorm(sel, m->norm, c->rms_eps) : NULL;
    ts_release(sel);
    ts_tensor *w = h ? head_weight(m) : NULL;
    ts_tensor *logits = w ? ts_linear(h, w, NULL) : NULL; /* (n, V) */
    ts_release(h);
    return logits;
}
