/* decoder.c — one decoder-only transformer for every causal LM family:
 * the parameters a config's description asks for (decoder_spec.c names
 * them), their initialization, the forward pass to logits (with a KV
 * cache, a paged KV pool, or neither), the next-token loss with the
 * experts' load-balancing term. What differs between families is data in
 * ts_model_config (norm kind, positions and rope scaling, fused or split
 * projections, q/k norm, sliding windows, soft-capping, gated or plain
 * MLP, experts); there is no per-family forward code. Built from public
 * ops only (eager now, recorded unchanged in compiled mode); owns the
 * model and its parameter tensors, never kernels or files. */
#include "decoder_spec.h"

#include "core/core.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEC_MAX_LAYERS 4096

/* One layer's parameters by role; borrowed from the model's list. */
typedef struct {
    ts_tensor *p[R_LAYER_COUNT];
} dec_layer;

struct ts_decoder {
    ts_ctx *ctx;
    ts_model_config cfg;
    ts_tensor *g[R_COUNT]; /* the model's own (embeddings, head, ...) */
    dec_layer *layer;
    int n_params;
    ts_tensor **params; /* owned references, state_dict order */
    dec_param *spec;    /* each parameter's role, name, parts */
    /* placement: embedding, each layer, head (final norm + LM head) */
    ts_device embed_dev, head_dev, *layer_dev;
    ts_tensor *head_copy;   /* tied LM head on another device than embed:
                               a copy made at the first forward */
    struct layer_ref *ckpt; /* activation checkpointing: one per layer */
    ts_layer_hook hook;     /* around each layer (parameter sharding) */
    void *hook_arg;
    bool compute_bf16; /* matrices cast to bf16 where used (mixed) */
    /* the load-balancing loss: each sparse layer's router logits (N, E)
     * of the current forward, kept while collect_router is set */
    bool collect_router;
    ts_tensor **router_logits;
    int n_router;
    char config_src[4096]; /* the config.json a loaded model came from */
    int layout;            /* its checkpoint's layout (DEC_LAYOUT_*) */
};

/* a layer as ts_checkpoint's block argument */
typedef struct layer_ref {
    ts_decoder *m;
    int64_t index;
} layer_ref;

/* The per-call state a layer reads: rope tables (global and local
 * variants), the KV cache slot or paged pool. */
typedef struct {
    ts_tensor *cos, *sin;             /* global layers' */
    ts_tensor *cos_local, *sin_local; /* sliding layers' (Gemma 3); NULL:
                                         the global ones */
} rope_set;

/* A layer's KV pools and the step's meta (ts_paged_attention) */
typedef struct {
    ts_tensor *k_pool, *v_pool, *meta;
} paged_ref;

/* One layer's keys and values for positions 0..len-1 (B, KV, max_T, D). */
typedef struct {
    ts_tensor *k, *v;
    int64_t len;
} kv_slot;

/* *x to device d when it is elsewhere (takes over the reference) */
static bool move_to(ts_tensor **x, ts_device d) {
    if (!*x)
        return true;
    if (ts_device_equal(ts_tensor_device(*x), d))
        return true;
    ts_tensor *y = ts_to_device(*x, d);
    ts_release(*x);
    *x = y;
    return y != NULL;
}

static void release_all(ts_tensor **t, size_t n) {
    for (size_t i = 0; i < n; i++)
        ts_release(t[i]);
}

/* ---- config ---- */

ts_status ts_decoder_config_check(ts_ctx *ctx, const ts_model_config *c) {
    if (!c)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "decoder: NULL config");
    const char *fam = ts_arch_name(c->arch);
    if ((unsigned)c->arch >= TS_ARCH_COUNT)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "decoder config: arch %d is not a known family",
                            (int)c->arch);
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
        if (sizes[i].v <= 0 &&
            !(c->n_experts > 0 && !strcmp(sizes[i].name, "intermediate")))
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "%s config: %s is %" PRId64 " (want > 0)", fam,
                                sizes[i].name, sizes[i].v);
    const char *bad = NULL;
    if (c->layers > DEC_MAX_LAYERS)
        bad = "layers is above 4096";
    else if (c->heads % c->kv_heads)
        bad = "heads is not a multiple of kv_heads";
    else if (c->pos == TS_POS_ROPE && c->head_dim % 2)
        bad = "head_dim is odd (rope rotates two halves)";
    else if (!(c->norm_eps > 0))
        bad = "the norm epsilon is not > 0";
    else if (c->pos == TS_POS_ROPE && !(c->rope_theta > 0))
        bad = "rope_theta is not > 0";
    else if ((c->rope == TS_ROPE_LINEAR || c->rope == TS_ROPE_LLAMA3 ||
              c->rope == TS_ROPE_YARN) &&
             !(c->rope_factor > 0))
        bad = "rope_scaling's factor is not > 0";
    else if (c->rope == TS_ROPE_LLAMA3 &&
             !(c->rope_low_freq_factor > 0 &&
               c->rope_high_freq_factor > c->rope_low_freq_factor &&
               c->rope_original_max_positions > 0))
        bad = "rope_scaling llama3 needs factor > 0, 0 < low_freq_factor < "
              "high_freq_factor and original_max_position_embeddings > 0";
    else if (c->vocab > 2147483647ll || c->hidden > (1 << 20) ||
             c->heads > 4096 || c->kv_heads > 4096 || c->head_dim > 4096 ||
             c->intermediate > (1 << 24) || c->moe_intermediate > (1 << 24) ||
             c->n_experts > 65536 || c->max_positions > 2147483647ll)
        bad = "a size is beyond what a model can have (vocab < 2^31, hidden "
              "<= 2^20, heads and head_dim <= 4096, intermediate <= 2^24, "
              "experts <= 65536, max_positions < 2^31)";
    else if (c->rope == TS_ROPE_LONGROPE &&
             (c->rope_n_factors != c->head_dim / 2 ||
              c->rope_n_factors > TS_ROPE_MAX_FACTORS ||
              c->rope_original_max_positions < 1))
        bad = "longrope needs head_dim / 2 short and long factors and "
              "original_max_position_embeddings";
    else if (c->attn_softcap < 0 || c->final_softcap < 0)
        bad = "a soft-capping value is negative";
    else if (c->sliding_window < 0)
        bad = "sliding_window is negative";
    else if (c->gated && c->fused_gate_up && c->mlp_bias)
        bad = "a fused gate_up projection with biases is not a supported "
              "layout";
    else if (c->n_experts < 0 ||
             (c->n_experts > 0 &&
              (c->experts_per_tok < 1 || c->experts_per_tok > c->n_experts ||
               c->moe_intermediate < 1 || c->moe_step < 1)))
        bad = "experts: want 1 <= experts_per_tok <= n_experts, "
              "moe_intermediate >= 1 and moe_step >= 1";
    else if (c->pos == TS_POS_LEARNED && c->max_positions > (1 << 24))
        bad = "max_positions is above 16777216 with learned positions";
    if (bad)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "%s config: %s", fam, bad);
    for (int64_t i = 0; i < c->layers; i++)
        if (!ts_model_layer_moe(c, i) && c->intermediate <= 0)
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "%s config: layer %lld is dense and "
                                "intermediate is %lld (want > 0)",
                                fam, (long long)i, (long long)c->intermediate);
    return TS_OK;
}

/* ---- parameters ---- */

/* splitmix64: a distinct, well-mixed seed per parameter index. */
static uint64_t param_seed(uint64_t seed, int i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static ts_tensor *make_param(ts_decoder *m, const dec_param *p, ts_dtype wdt,
                             bool no_init, uint64_t seed, int i) {
    ts_dtype dt = p->matrix ? wdt : TS_F32;
    double std = 0.02;
    if (p->init == INIT_RESIDUAL)
        std /= sqrt(2.0 * (double)m->cfg.layers);
    ts_tensor *t =
        no_init ? ts_empty(m->ctx, dt, p->ndim, p->shape)
        : p->init == INIT_NORMAL || p->init == INIT_RESIDUAL
            ? ts_randn(m->ctx, dt, p->ndim, p->shape, std, param_seed(seed, i))
            : ts_full(m->ctx, TS_F32, p->ndim, p->shape,
                      p->init == INIT_ONES ? 1.0 : 0.0);
    if (t)
        ts_set_requires_grad(t, true);
    return t;
}

/* the slot a parameter's borrowed pointer lives in */
static ts_tensor **slot_of(ts_decoder *m, const dec_param *p) {
    return p->layer < 0 ? &m->g[p->role] : &m->layer[p->layer].p[p->role];
}

ts_status ts_decoder_new(ts_ctx *ctx, const ts_model_config *cfg,
                         const ts_decoder_options *opt, uint64_t seed,
                         ts_decoder **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "decoder_new: NULL out");
    *out = NULL;
    ts_decoder_options none = {.weight_dtype = TS_F32};
    if (!opt)
        opt = &none;
    ts_status s = ts_decoder_config_check(ctx, cfg);
    if (s != TS_OK)
        return s;
    if (opt->weight_dtype != TS_F32 && opt->weight_dtype != TS_BF16)
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "decoder_new: weights can be kept in f32 or bf16, "
                            "not %s",
                            ts_dtype_name(opt->weight_dtype));
    const ts_device_map *dm = opt->device_map;
    if (dm && dm->n_layers != cfg->layers)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "decoder_new: the device map places %d layers; "
                            "the model has %lld",
                            dm->n_layers, (long long)cfg->layers);
    int n = dec_plan(cfg, NULL, 0);
    ts_decoder *m = calloc(1, sizeof *m);
    if (m) {
        m->ctx = ctx;
        m->cfg = *cfg;
        m->layer = calloc((size_t)cfg->layers, sizeof *m->layer);
        m->params = calloc((size_t)n, sizeof *m->params);
        m->spec = calloc((size_t)n, sizeof *m->spec);
        m->layer_dev = calloc((size_t)cfg->layers + 1, sizeof *m->layer_dev);
        m->router_logits =
            calloc((size_t)cfg->layers + 1, sizeof *m->router_logits);
    }
    if (!m || !m->layer || !m->params || !m->spec || !m->layer_dev ||
        !m->router_logits) {
        ts_decoder_free(m);
        return ts_set_error(ctx, TS_ERR_OOM, "decoder_new: out of memory");
    }
    dec_plan(cfg, m->spec, n);
    if ((s = dec_plan_check(ctx, cfg, m->spec, n)) != TS_OK) {
        ts_decoder_free(m);
        return s;
    }
    ts_device here = ts_get_device(ctx);
    m->embed_dev = dm ? dm->embed : here;
    m->head_dev = dm ? dm->head : here;
    for (int64_t i = 0; i < cfg->layers; i++)
        m->layer_dev[i] = dm ? dm->layer[i] : here;
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        const dec_param *p = &m->spec[i];
        ts_set_device(ctx, p->layer >= 0 ? m->layer_dev[p->layer]
                           : p->role == R_FINAL_NORM ||
                                   p->role == R_FINAL_NORM_B ||
                                   p->role == R_HEAD
                               ? m->head_dev
                               : m->embed_dev);
        ts_tensor *t =
            make_param(m, p, opt->weight_dtype, opt->no_init, seed, i);
        ok = t != NULL;
        m->params[i] = t;
        m->n_params = i + 1;
        *slot_of(m, p) = t;
    }
    ts_set_device(ctx, here);
    if (ok && cfg->tie_word_embeddings)
        m->g[R_HEAD] = m->g[R_EMBED];
    if (!ok) {
        ts_decoder_free(m);
        s = ts_ctx_status(ctx);
        return s != TS_OK ? s
                          : ts_set_error(ctx, TS_ERR_OOM,
                                         "decoder_new: cannot create "
                                         "parameters");
    }
    *out = m;
    return TS_OK;
}

void ts_decoder_free(ts_decoder *m) {
    if (!m)
        return;
    for (int i = 0; i < m->n_params; i++)
        ts_release(m->params[i]);
    for (int i = 0; i < m->n_router; i++)
        ts_release(m->router_logits[i]);
    free(m->router_logits);
    free(m->params);
    free(m->spec);
    free(m->layer);
    free(m->ckpt);
    free(m->layer_dev);
    ts_release(m->head_copy);
    free(m);
}

ts_status ts_decoder_set_param(ts_decoder *m, int i, ts_tensor *t) {
    if (!m || !t)
        return TS_ERR_INVALID_ARG;
    ts_tensor *old = i >= 0 && i < m->n_params ? m->params[i] : NULL;
    if (!old || ts_tensor_dtype(t) != ts_tensor_dtype(old) ||
        ts_tensor_ndim(t) != ts_tensor_ndim(old) ||
        memcmp(ts_tensor_shape(t), ts_tensor_shape(old),
               sizeof(int64_t) * (size_t)ts_tensor_ndim(old)) ||
        !ts_device_equal(ts_tensor_device(t), ts_tensor_device(old)))
        return ts_set_error(m->ctx, TS_ERR_INVALID_ARG,
                            "decoder_set_param: %d does not name a parameter "
                            "of that dtype, shape and device",
                            i);
    *slot_of(m, &m->spec[i]) = t;
    if (m->g[R_HEAD] == old)
        m->g[R_HEAD] = t; /* tied */
    ts_set_requires_grad(t, ts_requires_grad(old));
    m->params[i] = ts_retain(t);
    ts_release(old);
    ts_release(m->head_copy); /* made again from the new table */
    m->head_copy = NULL;
    return TS_OK;
}

ts_status dec_set_param_kept(ts_decoder *m, int i, ts_tensor *t, bool conv1d) {
    ts_tensor *old = i >= 0 && i < m->n_params ? m->params[i] : NULL;
    if (!old || !t || ts_tensor_ndim(old) != 2 || ts_tensor_ndim(t) != 2)
        return ts_set_error(m->ctx, TS_ERR_INVALID_ARG,
                            "decoder: parameter %d kept in its file's dtype "
                            "must be a matrix",
                            i);
    const int64_t *os = ts_tensor_shape(old), *ns = ts_tensor_shape(t);
    bool same = os[0] == ns[0] && os[1] == ns[1];
    bool flipped = conv1d && os[0] == ns[1] && os[1] == ns[0];
    if (!same && !flipped)
        return ts_set_error(m->ctx, TS_ERR_SHAPE,
                            "decoder: %s has shape [%lld, %lld] in the file, "
                            "the model wants [%lld, %lld]",
                            m->spec[i].name, (long long)ns[0], (long long)ns[1],
                            (long long)os[0], (long long)os[1]);
    ts_device d = ts_tensor_device(old);
    if (ts_dtype_is_quantized(ts_tensor_dtype(t)) && d.kind != TS_DEVICE_CPU)
        return ts_set_error(m->ctx, TS_ERR_UNSUPPORTED,
                            "decoder: %s is %s, a quantized format that "
                            "computes on the CPU only (the device map puts "
                            "it on %s:%d)",
                            m->spec[i].name, ts_dtype_name(ts_tensor_dtype(t)),
                            ts_backend_of(d.kind)->name, d.index);
    ts_tensor *moved = ts_to_device(t, d); /* cpu:k of a device map */
    if (!moved)
        return ts_ctx_status(m->ctx);
    *slot_of(m, &m->spec[i]) = moved;
    if (m->g[R_HEAD] == old)
        m->g[R_HEAD] = moved; /* tied */
    m->params[i] = moved;
    ts_release(old);
    ts_release(m->head_copy);
    m->head_copy = NULL;
    return TS_OK;
}

const ts_model_config *ts_decoder_get_config(const ts_decoder *m) {
    return m ? &m->cfg : NULL;
}

int ts_decoder_num_params(const ts_decoder *m) {
    return m ? m->n_params : 0;
}

const char *ts_decoder_param_name(const ts_decoder *m, int i) {
    return m && i >= 0 && i < m->n_params ? m->spec[i].name : NULL;
}

ts_tensor *ts_decoder_param(const ts_decoder *m, int i) {
    return m && i >= 0 && i < m->n_params ? m->params[i] : NULL;
}

ts_tensor *const *ts_decoder_params(const ts_decoder *m) {
    return m ? m->params : NULL;
}

ts_tensor *ts_decoder_find_param(const ts_decoder *m, const char *name) {
    if (!m || !name)
        return NULL;
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->spec[i].name, name))
            return m->params[i];
    return NULL;
}

ts_status ts_decoder_layer_params(const ts_decoder *m, int64_t layer,
                                  int *first, int *count) {
    if (!m || !first || !count || layer < -1 || layer > m->cfg.layers)
        return TS_ERR_INVALID_ARG;
    int a = 0, b = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dec_param *p = &m->spec[i];
        int64_t l = p->layer >= 0                            ? p->layer
                    : p->role == R_EMBED || p->role == R_POS ? -1
                                                             : m->cfg.layers;
        if (l == layer) {
            if (b == 0)
                a = i;
            b++;
        }
    }
    *first = a, *count = b;
    return TS_OK;
}

ts_status ts_decoder_set_compute_dtype(ts_decoder *m, ts_dtype dt) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    if (dt != TS_F32 && dt != TS_BF16)
        return ts_set_error(m->ctx, TS_ERR_DTYPE,
                            "decoder: compute dtype must be f32 or bf16, not "
                            "%s",
                            ts_dtype_name(dt));
    m->compute_bf16 = dt == TS_BF16;
    return TS_OK;
}

ts_status ts_decoder_set_layer_hook(ts_decoder *m, ts_layer_hook fn,
                                    void *arg) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    m->hook = fn, m->hook_arg = arg;
    return TS_OK;
}

ts_status ts_decoder_set_checkpointing(ts_decoder *m, bool on) {
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
        m->ckpt[i] = (layer_ref){m, i};
    return TS_OK;
}

/* ---- the forward pieces ---- */

/* a f32 matrix cast to bf16 (recorded, so its gradient reaches the f32
 * master), else w itself; a new reference (NULL for NULL). The stacked
 * experts stay f32 (computed in f32 under bf16 compute too). */
static ts_tensor *compute_copy(const ts_decoder *m, ts_tensor *w) {
    /* 2-D only: the experts kernel reads its f32 weights itself and gives
     * no gradient through a bf16 copy */
    if (!w || !m->compute_bf16 || ts_tensor_dtype(w) != TS_F32 ||
        ts_tensor_ndim(w) != 2)
        return w ? ts_retain(w) : NULL;
    return ts_cast(w, TS_BF16);
}

/* x (..., in) through a projection w and bias b (may be NULL): HF's
 * (out, in) layout, or Conv1D's (in, out) */
static ts_tensor *project(const ts_decoder *m, ts_tensor *x, ts_tensor *w,
                          ts_tensor *b) {
    /* a weight of a block format is rows of `in` whatever the family */
    if (!m->cfg.conv1d || ts_dtype_is_quantized(ts_tensor_dtype(w)))
        return ts_linear(x, w, b);
    ts_tensor *y = ts_matmul(x, w);
    if (!b || !y)
        return y;
    ts_tensor *yb = ts_add(y, b);
    ts_release(y);
    return yb;
}

/* the model's norm over the last dim: w (and b for LayerNorm) */
static ts_tensor *norm(const ts_decoder *m, ts_tensor *x, ts_tensor *w,
                       ts_tensor *b) {
    const ts_model_config *c = &m->cfg;
    if (c->norm == TS_NORM_LAYER)
        return ts_layernorm(x, w, b, c->norm_eps);
    if (c->norm == TS_NORM_RMS)
        return ts_rmsnorm(x, w, c->norm_eps);
    ts_tensor *w1 = ts_add_scalar(w, 1.0); /* Gemma: x / rms * (1 + w) */
    ts_tensor *y = w1 ? ts_rmsnorm(x, w1, c->norm_eps) : NULL;
    ts_release(w1);
    return y;
}

static ts_tensor *softcap(ts_tensor *x, double cap) {
    ts_tensor *a = ts_mul_scalar(x, 1.0 / cap);
    ts_tensor *t = ts_tanh(a);
    ts_tensor *y = ts_mul_scalar(t, cap);
    ts_release(a), ts_release(t);
    return y;
}

static ts_tensor *activate(ts_tensor *x, ts_act act) {
    return act == TS_ACT_SILU        ? ts_silu(x)
           : act == TS_ACT_GELU_TANH ? ts_gelu(x, TS_GELU_TANH)
                                     : ts_gelu(x, TS_GELU_ERF);
}

/* p (B, T, n*D) [borrowed] -> (B, n, T, D): per-head norm when norm_w is
 * set (q/k norm), heads to dim 1, rope when cos is set */
static ts_tensor *to_heads(const ts_decoder *m, ts_tensor *p, ts_tensor *norm_w,
                           int64_t n, ts_tensor *cos, ts_tensor *sin) {
    int64_t B = ts_tensor_dim(p, 0), T = ts_tensor_dim(p, 1);
    int64_t shape[4] = {B, T, n, m->cfg.head_dim};
    ts_tensor *r = ts_reshape(p, 4, shape); /* (B, T, n, D) */
    if (norm_w && r) {
        ts_tensor *nr = norm(m, r, norm_w, NULL);
        ts_release(r);
        r = nr;
    }
    ts_tensor *t = ts_transpose(r, 1, 2); /* (B, n, T, D) */
    ts_release(r);
    if (!cos || !t)
        return t;
    ts_tensor *rot = ts_rope(t, cos, sin);
    ts_release(t);
    return rot;
}

/* Writes the new k or v (B, KV, T, D) at positions len..len+T-1 of the
 * cache and returns the view of positions 0..len+T-1. */
static ts_tensor *cache_append(ts_tensor *cache, ts_tensor *x, int64_t len) {
    if (!x)
        return NULL;
    int64_t T = ts_tensor_dim(x, 2);
    ts_tensor *dst = ts_slice(cache, 2, len, len + T, 1);
    ts_status s = dst ? ts_copy_(dst, x) : TS_ERR_INVALID_ARG;
    ts_release(dst);
    return s == TS_OK ? ts_slice(cache, 2, 0, len + T, 1) : NULL;
}

/* h (B, T, C), the normed input -> the attention's output after o_proj
 * (B, T, C); with a cache slot, attends to the cached positions too and
 * appends its own; with pg, through the paged pool. */
static ts_tensor *attention(const ts_decoder *m, const dec_layer *L, int64_t li,
                            ts_tensor *h, const rope_set *rs, const kv_slot *kv,
                            const paged_ref *pg) {
    const ts_model_config *c = &m->cfg;
    int64_t B = ts_tensor_dim(h, 0), T = ts_tensor_dim(h, 1);
    int64_t HD = c->heads * c->head_dim, KVD = c->kv_heads * c->head_dim;
    bool sliding = ts_model_layer_sliding(c, li);
    ts_tensor *cos = rs ? rs->cos : NULL, *sin = rs ? rs->sin : NULL;
    if (rs && sliding && rs->cos_local)
        cos = rs->cos_local, sin = rs->sin_local;
    ts_tensor *qp, *kp, *vp;
    if (c->fused_qkv) { /* one product, three views */
        ts_tensor *qkv = project(m, h, L->p[R_QKV], L->p[R_QKV_B]);
        qp = ts_slice(qkv, 2, 0, HD, 1);
        kp = ts_slice(qkv, 2, HD, HD + KVD, 1);
        vp = ts_slice(qkv, 2, HD + KVD, HD + 2 * KVD, 1);
        ts_release(qkv);
    } else {
        qp = project(m, h, L->p[R_Q], L->p[R_Q_B]);
        kp = project(m, h, L->p[R_K], L->p[R_K_B]);
        vp = project(m, h, L->p[R_V], L->p[R_V_B]);
    }
    ts_tensor *q =
        qp ? to_heads(m, qp, L->p[R_Q_NORM], c->heads, cos, sin) : NULL;
    ts_tensor *k =
        kp ? to_heads(m, kp, L->p[R_K_NORM], c->kv_heads, cos, sin) : NULL;
    ts_tensor *v = vp ? to_heads(m, vp, NULL, c->kv_heads, NULL, NULL) : NULL;
    ts_release(qp), ts_release(kp), ts_release(vp);
    if (kv) { /* keys and values of every position so far */
        ts_tensor *ka = cache_append(kv->k, k, kv->len);
        ts_tensor *va = cache_append(kv->v, v, kv->len);
        ts_release(k), ts_release(v);
        k = ka, v = va;
    }
    ts_attn_opts ao = {.causal = true,
                       .scale = c->attn_scale,
                       .window = sliding ? c->sliding_window : 0,
                       .softcap = c->attn_softcap};
    ts_tensor *a = NULL;
    if (q && k && v)
        a = pg ? ts_paged_attention_ex(q, k, v, pg->k_pool, pg->v_pool,
                                       pg->meta, &ao)
               : ts_attention_ex(q, k, v, NULL, &ao); /* (B, H, T, D) */
    ts_release(q), ts_release(k), ts_release(v);
    ts_tensor *at = ts_transpose(a, 1, 2); /* (B, T, H, D) */
    ts_release(a);
    int64_t shape[3] = {B, T, HD};
    ts_tensor *ar = ts_reshape(at, 3, shape); /* (B, T, H*D), a copy */
    ts_release(at);
    ts_tensor *o = project(m, ar, L->p[R_O], L->p[R_O_B]);
    ts_release(ar);
    return o;
}

/* h (B, T, C) -> the dense MLP's output (B, T, C) */
static ts_tensor *mlp(const ts_decoder *m, const dec_layer *L, ts_tensor *h) {
    const ts_model_config *c = &m->cfg;
    if (!c->gated) { /* act(up x + b) -> down */
        ts_tensor *u = project(m, h, L->p[R_UP], L->p[R_UP_B]);
        ts_tensor *a = activate(u, c->act);
        ts_tensor *y = project(m, a, L->p[R_DOWN], L->p[R_DOWN_B]);
        ts_release(u), ts_release(a);
        return y;
    }
    ts_tensor *gate, *up;
    if (c->fused_gate_up) { /* (2F): gate rows first */
        ts_tensor *gu = project(m, h, L->p[R_GATE_UP], NULL);
        gate = ts_slice(gu, 2, 0, c->intermediate, 1);
        up = ts_slice(gu, 2, c->intermediate, 2 * c->intermediate, 1);
        ts_release(gu);
    } else { /* with Llama's mlp_bias, biases on all three */
        gate = project(m, h, L->p[R_GATE], L->p[R_GATE_B]);
        up = project(m, h, L->p[R_UP], L->p[R_UP_B]);
    }
    ts_tensor *a = activate(gate, c->act);
    ts_tensor *g = ts_mul(a, up);
    ts_tensor *y = project(m, g, L->p[R_DOWN], L->p[R_DOWN_B]);
    ts_release(gate), ts_release(up), ts_release(a), ts_release(g);
    return y;
}

/* h (B, T, C) -> the sparse MLP's output (B, T, C): the router's softmax
 * over experts, the top k, renormalized when the family says so, and the
 * experts kernel; the router logits kept for the load-balancing loss */
static ts_tensor *moe(ts_decoder *m, const dec_layer *L, ts_tensor *h) {
    const ts_model_config *c = &m->cfg;
    int64_t B = ts_tensor_dim(h, 0), T = ts_tensor_dim(h, 1), C = c->hidden;
    int64_t flat[2] = {B * T, C};
    ts_tensor *x = ts_reshape(h, 2, flat); /* (N, C) */
    /* the router in f32 math whatever the matrices' dtype: a near tie
     * between experts decides the routing, and the bf16 GEMM's rounded
     * activations would flip it (small: E x C) */
    ts_tensor *rw = ts_tensor_dtype(L->p[R_ROUTER]) == TS_BF16
                        ? ts_cast(L->p[R_ROUTER], TS_F32)
                        : ts_retain(L->p[R_ROUTER]);
    ts_tensor *logits = x && rw ? ts_linear(x, rw, NULL) : NULL;
    ts_release(rw);
    ts_tensor *probs = logits ? ts_softmax(logits, 1) : NULL; /* (N, E) */
    ts_tensor *idx = probs ? ts_topk(probs, c->experts_per_tok) : NULL;
    ts_tensor *w = idx ? ts_gather(probs, 1, idx) : NULL; /* (N, k) */
    if (w && c->norm_topk_prob) {
        int last = 1;
        ts_tensor *sum = ts_sum(w, 1, &last, true);
        ts_tensor *wn = sum ? ts_div(w, sum) : NULL;
        ts_release(sum), ts_release(w);
        w = wn;
    }
    ts_tensor *y = w ? ts_moe_experts(x, idx, w, L->p[R_EXP_GATE],
                                      L->p[R_EXP_UP], L->p[R_EXP_DOWN], c->act)
                     : NULL;
    if (logits && m->collect_router && m->n_router < c->layers) {
        ts_tensor *kept = ts_retain(logits);
        if (move_to(&kept, m->head_dev) && kept)
            m->router_logits[m->n_router++] = kept;
    }
    ts_release(x), ts_release(logits), ts_release(probs), ts_release(idx),
        ts_release(w);
    int64_t shape[3] = {B, T, C};
    ts_tensor *out = ts_reshape(y, 3, shape);
    ts_release(y);
    return out;
}

/* x + y, y normed first where the family has sandwich norms (post_w);
 * takes over y, borrows x */
static ts_tensor *add_branch(const ts_decoder *m, ts_tensor *x, ts_tensor *y,
                             ts_tensor *post_w) {
    if (y && m->cfg.sandwich_norm) {
        ts_tensor *yn = norm(m, y, post_w, NULL);
        ts_release(y);
        y = yn;
    }
    ts_tensor *sum = x && y ? ts_add(x, y) : NULL;
    ts_release(y);
    return sum;
}

/* x (B, T, C) -> x + attn(norm(x)) -> that + mlp(norm(that)), with the
 * sandwich norms where the family has them; takes over x. */
static ts_tensor *layer_body(ts_decoder *m, const dec_layer *L, int64_t li,
                             ts_tensor *x, const rope_set *rs,
                             const kv_slot *kv, const paged_ref *pg) {
    ts_tensor *h = norm(m, x, L->p[R_ATTN_NORM], L->p[R_ATTN_NORM_B]);
    ts_tensor *a = h ? attention(m, L, li, h, rs, kv, pg) : NULL;
    ts_release(h);
    ts_tensor *x1 = add_branch(m, x, a, L->p[R_POST_ATTN_NORM]);
    ts_release(x);
    ts_tensor *h2 =
        x1 ? norm(m, x1, L->p[R_MLP_NORM], L->p[R_MLP_NORM_B]) : NULL;
    ts_tensor *f = !h2                               ? NULL
                   : ts_model_layer_moe(&m->cfg, li) ? moe(m, L, h2)
                                                     : mlp(m, L, h2);
    ts_release(h2);
    ts_tensor *x2 = add_branch(m, x1, f, L->p[R_POST_MLP_NORM]);
    ts_release(x1);
    return x2;
}

/* layer_body with bf16 copies of the layer's matrices under bf16
 * compute */
static ts_tensor *run_layer(ts_decoder *m, int64_t li, ts_tensor *x,
                            const rope_set *rs, const kv_slot *kv,
                            const paged_ref *pg) {
    const dec_layer *L = &m->layer[li];
    if (!m->compute_bf16)
        return layer_body(m, L, li, x, rs, kv, pg);
    dec_layer cl;
    bool ok = true;
    for (int r = 0; r < R_LAYER_COUNT; r++)
        ok &= (cl.p[r] = compute_copy(m, L->p[r])) != NULL || !L->p[r];
    ts_tensor *y = ok ? layer_body(m, &cl, li, x, rs, kv, pg) : NULL;
    if (!ok)
        ts_release(x);
    release_all(cl.p, R_LAYER_COUNT);
    return y;
}

/* in: x, cos, sin, cos_local, sin_local (borrowed; the last two may
 * repeat the first). With grad mode on this is the recompute in backward:
 * the layer hook is told first. */
static ts_tensor *layer_block(void *arg, int n, ts_tensor **in) {
    const layer_ref *r = arg;
    if (r->m->hook && ts_is_grad_enabled(r->m->ctx) &&
        r->m->hook(r->m->hook_arg, r->index, true, true) != TS_OK)
        return NULL;
    rope_set rs = {n > 1 ? in[1] : NULL, n > 2 ? in[2] : NULL,
                   n > 3 ? in[3] : NULL, n > 4 ? in[4] : NULL};
    return run_layer(r->m, r->index, ts_retain(in[0]), n > 1 ? &rs : NULL, NULL,
                     NULL);
}

static ts_status layer_done(void *arg) {
    const layer_ref *r = arg;
    return r->m->hook ? r->m->hook(r->m->hook_arg, r->index, false, true)
                      : TS_OK;
}

/* ---- rotary tables ---- */

/* inv_freq of the config's rope for a call whose largest position is
 * max_pos (longrope picks its factors by it); local: Gemma 3's sliding
 * layers (the default rope with rope_local_theta). *att: the cos/sin
 * scale (longrope, yarn). */
static void inv_freqs(const ts_model_config *c, bool local, int64_t max_pos,
                      double *inv, double *att) {
    int64_t D = c->head_dim, half = D / 2;
    double theta = local ? c->rope_local_theta : c->rope_theta;
    ts_rope_kind kind = local ? TS_ROPE_DEFAULT : c->rope;
    *att = 1.0;
    double old = (double)c->rope_original_max_positions;
    for (int64_t i = 0; i < half; i++)
        inv[i] = 1.0 / pow(theta, (double)(2 * i) / (double)D);
    if (kind == TS_ROPE_LINEAR) {
        for (int64_t i = 0; i < half; i++)
            inv[i] /= c->rope_factor;
    } else if (kind == TS_ROPE_LLAMA3) {
        double lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
        for (int64_t i = 0; i < half; i++) {
            double wl = 2 * M_PI / inv[i];
            if (wl > old / lo) {
                inv[i] /= c->rope_factor;
            } else if (wl >= old / hi) {
                double smooth = (old / wl - lo) / (hi - lo);
                inv[i] =
                    (1 - smooth) * inv[i] / c->rope_factor + smooth * inv[i];
            }
        }
    } else if (kind == TS_ROPE_LONGROPE) {
        /* HF's _compute_longrope_parameters: long factors past the
         * original context, the attention factor from the extension */
        const double *f = max_pos + 1 > c->rope_original_max_positions
                              ? c->rope_long_factor
                              : c->rope_short_factor;
        for (int64_t i = 0; i < half; i++)
            inv[i] = 1.0 / (f[i] * pow(theta, (double)(2 * i) / (double)D));
        double factor = (double)c->max_positions / old;
        *att = c->rope_attention_factor > 0 ? c->rope_attention_factor
               : factor <= 1.0              ? 1.0
                               : sqrt(1.0 + log(factor) / log(old));
    } else if (kind == TS_ROPE_YARN) {
        /* HF's _compute_yarn_parameters: NTK-by-parts between the
         * interpolated and extrapolated frequencies */
        double factor = c->rope_factor;
        double omax = old > 0 ? old : (double)c->max_positions;
        double dd = (double)D;
        double lo = floor(dd * log(omax / (c->rope_beta_fast * 2 * M_PI)) /
                          (2 * log(theta)));
        double hi = ceil(dd * log(omax / (c->rope_beta_slow * 2 * M_PI)) /
                         (2 * log(theta)));
        lo = lo < 0 ? 0 : lo;
        hi = hi > dd - 1 ? dd - 1 : hi;
        if (lo == hi)
            hi += 0.001;
        for (int64_t i = 0; i < half; i++) {
            double ramp = ((double)i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extra = 1.0 - ramp; /* the extrapolation's weight */
            inv[i] = inv[i] / factor * (1 - extra) + inv[i] * extra;
        }
        *att = c->rope_attention_factor > 0 ? c->rope_attention_factor
               : factor <= 1                ? 1.0
                                            : 0.1 * log(factor) + 1.0;
    }
}

/* cos, sin (n, D) at the given positions (HF's layout: inv_freq in f32,
 * the two halves repeated) */
static ts_status rope_at(const ts_decoder *m, bool local, const int32_t *pos,
                         int64_t n, ts_tensor **cos, ts_tensor **sin) {
    const ts_model_config *c = &m->cfg;
    int64_t D = c->head_dim, half = D / 2, shape[2] = {n, D};
    float *cb = malloc(sizeof(float) * (size_t)(n * D + 1));
    float *sb = malloc(sizeof(float) * (size_t)(n * D + 1));
    double *inv = malloc(sizeof(double) * (size_t)(half + 1));
    if (!cb || !sb || !inv) {
        free(cb), free(sb), free(inv);
        return ts_set_error(m->ctx, TS_ERR_OOM, "rope: out of memory");
    }
    int64_t max_pos = 0;
    for (int64_t t = 0; t < n; t++)
        max_pos = pos[t] > max_pos ? pos[t] : max_pos;
    double att;
    inv_freqs(c, local, max_pos, inv, &att);
    float fa = (float)att;
    for (int64_t i = 0; i < half; i++) {
        float fi = (float)inv[i];
        for (int64_t t = 0; t < n; t++) {
            float ang = (float)pos[t] * fi;
            cb[t * D + i] = cb[t * D + i + half] = cosf(ang) * fa;
            sb[t * D + i] = sb[t * D + i + half] = sinf(ang) * fa;
        }
    }
    *cos = ts_from_data(m->ctx, TS_F32, 2, shape, cb);
    *sin = ts_from_data(m->ctx, TS_F32, 2, shape, sb);
    free(cb), free(sb), free(inv);
    return *cos && *sin ? TS_OK : ts_ctx_status(m->ctx);
}

static void rope_release(rope_set *rs) {
    ts_release(rs->cos), ts_release(rs->sin);
    ts_release(rs->cos_local), ts_release(rs->sin_local);
    memset(rs, 0, sizeof *rs);
}

/* the rope tables a call at these positions needs (none with learned
 * positions) */
static ts_status rope_tables(const ts_decoder *m, const int32_t *pos, int64_t n,
                             rope_set *rs) {
    memset(rs, 0, sizeof *rs);
    const ts_model_config *c = &m->cfg;
    if (c->pos != TS_POS_ROPE)
        return TS_OK;
    ts_status s = rope_at(m, false, pos, n, &rs->cos, &rs->sin);
    if (s == TS_OK && c->rope_local_theta > 0)
        s = rope_at(m, true, pos, n, &rs->cos_local, &rs->sin_local);
    if (s != TS_OK)
        rope_release(rs);
    return s;
}

static bool rope_move(rope_set *rs, ts_device d) {
    return move_to(&rs->cos, d) && move_to(&rs->sin, d) &&
           move_to(&rs->cos_local, d) && move_to(&rs->sin_local, d);
}

/* token embeddings (+ learned positions, x sqrt(hidden) where the family
 * scales) as f32 (B, T, C); pos: the positions of the T tokens */
static ts_tensor *embed(ts_decoder *m, ts_tensor *ids, const int32_t *pos,
                        int64_t T) {
    const ts_model_config *c = &m->cfg;
    ts_tensor *e = ts_embedding(m->g[R_EMBED], ids);
    if (e && ts_tensor_dtype(e) != TS_F32) {
        ts_tensor *f = ts_cast(e, TS_F32);
        ts_release(e);
        e = f;
    }
    if (e && c->embed_scale) {
        ts_tensor *s = ts_mul_scalar(e, (double)(float)sqrt((double)c->hidden));
        ts_release(e);
        e = s;
    }
    if (e && c->pos == TS_POS_LEARNED) {
        int64_t shape[1] = {T};
        ts_tensor *p = ts_from_data(m->ctx, TS_I32, 1, shape, pos);
        ts_tensor *pe = p ? ts_embedding(m->g[R_POS], p) : NULL;
        ts_release(p);
        if (pe && ts_tensor_dtype(pe) != TS_F32) {
            ts_tensor *f = ts_cast(pe, TS_F32);
            ts_release(pe);
            pe = f;
        }
        ts_tensor *x = pe ? ts_add(e, pe) : NULL;
        ts_release(e), ts_release(pe);
        e = x;
    }
    return e;
}

static ts_tensor *head_weight(ts_decoder *m) {
    ts_tensor *w = m->g[R_HEAD];
    if (ts_device_equal(ts_tensor_device(w), m->head_dev))
        return w;
    if (!m->head_copy)
        m->head_copy = ts_to_device(w, m->head_dev);
    return m->head_copy;
}

/* x (..., C) on the head's device -> the final norm's output (..., C):
 * the hidden state an embedding pools */
static ts_tensor *final_norm(ts_decoder *m, ts_tensor *x) {
    return norm(m, x, m->g[R_FINAL_NORM], m->g[R_FINAL_NORM_B]);
}

/* x (..., C) on the head's device -> logits (..., V): final norm, head,
 * final soft-capping */
static ts_tensor *head(ts_decoder *m, ts_tensor *x) {
    const ts_model_config *c = &m->cfg;
    ts_tensor *h = final_norm(m, x);
    ts_tensor *w = h ? compute_copy(m, head_weight(m)) : NULL;
    ts_tensor *logits = w ? ts_linear(h, w, NULL) : NULL;
    ts_release(h), ts_release(w);
    if (logits && c->final_softcap > 0) {
        ts_tensor *l = softcap(logits, c->final_softcap);
        ts_release(logits);
        logits = l;
    }
    return logits;
}

/* ids of host tensors within the vocabulary (targets may also be -100,
 * ignored): the error is the same whichever device the embedding is on
 * (a device kernel cannot report one without a wait) */
static bool ids_in_vocab(ts_ctx *ctx, const char *what, ts_tensor *ids,
                         int64_t V, bool targets) {
    if (ts_tensor_device(ids).kind != TS_DEVICE_CPU)
        return true; /* already on a device: its kernel's rules */
    int64_t n = ts_tensor_numel(ids);
    bool i64 = ts_tensor_dtype(ids) == TS_I64;
    ts_tensor *c = ts_contiguous(ids);
    const void *p = c ? ts_tensor_data(c) : NULL;
    bool ok = p != NULL;
    for (int64_t i = 0; ok && i < n; i++) {
        int64_t v = i64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
        if ((v < 0 || v >= V) && !(v == -100 && targets)) {
            ts_set_error(ctx, TS_ERR_RANGE,
                         "decoder: %s[%" PRId64 "] = %" PRId64
                         " is outside the vocabulary (0..%" PRId64 ")",
                         what, i, v, V - 1);
            ok = false;
        }
    }
    ts_release(c);
    return ok;
}

static bool check_ids(ts_ctx *ctx, const char *what, ts_tensor *ids,
                      int64_t V) {
    if (!ids) {
        if (ts_ctx_status(ctx) == TS_OK)
            ts_set_error(ctx, TS_ERR_INVALID_ARG, "decoder: %s is NULL", what);
        return false;
    }
    ts_dtype dt = ts_tensor_dtype(ids);
    if (ts_tensor_ndim(ids) != 2 || (dt != TS_I64 && dt != TS_I32)) {
        ts_set_error(ctx, TS_ERR_SHAPE,
                     "decoder: %s must be (B, T) i64 or i32, got %d dims of %s",
                     what, ts_tensor_ndim(ids), ts_dtype_name(dt));
        return false;
    }
    return ids_in_vocab(ctx, what, ids, V, !strcmp(what, "targets"));
}

/* positions pos0 .. pos0+T-1 as i32 (malloc'd) */
static int32_t *positions(ts_ctx *ctx, int64_t pos0, int64_t T) {
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(T + 1));
    if (!pos) {
        ts_set_error(ctx, TS_ERR_OOM, "decoder: out of memory");
        return NULL;
    }
    for (int64_t t = 0; t < T; t++)
        pos[t] = (int32_t)(pos0 + t);
    return pos;
}

/* ids (B, T) at positions pos0.. through embedding, layers (with their KV
 * slots when given) and head -> logits (B, T or 1, V), or with hidden the
 * final norm's output (B, T or 1, C) instead, moving activations to each
 * part's device where the placement changes device. */
static ts_tensor *run_layers(ts_decoder *m, ts_tensor *ids, int64_t pos0,
                             kv_slot *slots, bool last_only, bool hidden) {
    ts_ctx *ctx = m->ctx;
    const ts_model_config *c = &m->cfg;
    int64_t T = ts_tensor_dim(ids, 1);
    int32_t *pos = positions(ctx, pos0, T);
    if (!pos)
        return NULL;
    ts_device here = ts_get_device(ctx);
    ts_set_device(ctx, m->embed_dev);
    ts_tensor *id_moved = ts_to_device(ids, m->embed_dev);
    ts_tensor *x = id_moved ? embed(m, id_moved, pos, T) : NULL; /* B,T,C */
    ts_release(id_moved);
    rope_set rs = {0};
    ts_set_device(ctx, c->layers ? m->layer_dev[0] : m->embed_dev);
    if (x && rope_tables(m, pos, T, &rs) != TS_OK)
        ts_release(x), x = NULL;
    free(pos);
    for (int64_t i = 0; i < c->layers && x; i++) {
        ts_device d = m->layer_dev[i];
        ts_set_device(ctx, d);
        if (!move_to(&x, d) || !rope_move(&rs, d)) {
            ts_release(x), x = NULL;
            break;
        }
        if (m->hook && m->hook(m->hook_arg, i, true, false) != TS_OK) {
            ts_release(x), x = NULL;
            break;
        }
        bool keep_router = m->collect_router && ts_model_layer_moe(c, i);
        if (m->ckpt && !slots && !keep_router) { /* keeps the input only */
            ts_tensor *in[5] = {x, rs.cos, rs.sin, rs.cos_local, rs.sin_local};
            int n = !rs.cos ? 1 : rs.cos_local ? 5 : 3;
            ts_tensor *y =
                ts_checkpoint_ex(layer_block, layer_done, &m->ckpt[i], n, in);
            ts_release(x);
            x = y;
        } else
            x = run_layer(m, i, x, c->pos == TS_POS_ROPE ? &rs : NULL,
                          slots ? &slots[i] : NULL, NULL);
        if (m->hook && x && m->hook(m->hook_arg, i, false, false) != TS_OK)
            ts_release(x), x = NULL;
    }
    rope_release(&rs);
    if (last_only && x) { /* the next token needs the last position only */
        ts_tensor *l = ts_slice(x, 1, T - 1, T, 1);
        ts_release(x);
        x = l;
    }
    ts_set_device(ctx, m->head_dev);
    ts_tensor *logits = NULL;
    if (x && move_to(&x, m->head_dev))
        logits = hidden ? final_norm(m, x) : head(m, x);
    ts_release(x);
    ts_set_device(ctx, here);
    return logits;
}

static ts_tensor *forward_full(ts_decoder *m, ts_tensor *ids, int64_t pos0,
                               bool hidden) {
    if (!m)
        return NULL;
    ts_ctx *ctx = m->ctx;
    const ts_model_config *c = &m->cfg;
    if (!check_ids(ctx, "ids", ids, m->cfg.vocab))
        return NULL;
    int64_t T = ts_tensor_dim(ids, 1);
    if (pos0 < 0 || T > c->max_positions || pos0 > c->max_positions - T) {
        ts_set_error(ctx, TS_ERR_RANGE,
                     "decoder_forward: positions %" PRId64 "..%" PRId64
                     " outside max_positions %" PRId64,
                     pos0, pos0 + T - 1, c->max_positions);
        return NULL;
    }
    return run_layers(m, ids, pos0, NULL, false, hidden);
}

ts_tensor *ts_decoder_forward(ts_decoder *m, ts_tensor *ids, int64_t pos0) {
    return forward_full(m, ids, pos0, false);
}

ts_tensor *ts_decoder_forward_hidden(ts_decoder *m, ts_tensor *ids,
                                     int64_t pos0) {
    return forward_full(m, ids, pos0, true);
}

/* HF's load_balancing_loss_func over the router logits kept: the experts'
 * share of the top-k picks times their mean router probability, summed,
 * times E */
static ts_tensor *aux_loss(ts_decoder *m) {
    const ts_model_config *c = &m->cfg;
    ts_tensor *all = m->n_router == 1
                         ? ts_retain(m->router_logits[0])
                         : ts_concat(m->n_router, m->router_logits, 0);
    ts_tensor *probs = all ? ts_softmax(all, 1) : NULL; /* (LN, E) */
    ts_tensor *idx = probs ? ts_topk(probs, c->experts_per_tok) : NULL;
    ts_tensor *hot = idx ? ts_one_hot(idx, c->n_experts) : NULL; /* LN,k,E */
    int d0 = 0;
    ts_tensor *share = hot ? ts_mean(hot, 1, &d0, false) : NULL;      /* k,E */
    ts_tensor *mean_p = probs ? ts_mean(probs, 1, &d0, false) : NULL; /* E */
    ts_tensor *prod = share && mean_p ? ts_mul(share, mean_p) : NULL;
    ts_tensor *sum = prod ? ts_sum(prod, 0, NULL, false) : NULL;
    ts_tensor *out =
        sum ? ts_mul_scalar(sum, (double)c->n_experts * c->router_aux_loss_coef)
            : NULL;
    ts_tensor *tmp[] = {all, probs, idx, hot, share, mean_p, prod, sum};
    release_all(tmp, sizeof tmp / sizeof *tmp);
    return out;
}

static void drop_router(ts_decoder *m) {
    for (int i = 0; i < m->n_router; i++)
        ts_release(m->router_logits[i]);
    m->n_router = 0;
    m->collect_router = false;
}

ts_tensor *ts_decoder_loss(ts_decoder *m, ts_tensor *ids, ts_tensor *targets,
                           ts_tensor **logits_out) {
    if (logits_out)
        *logits_out = NULL;
    if (!m)
        return NULL;
    ts_ctx *ctx = m->ctx;
    if (!check_ids(ctx, "ids", ids, m->cfg.vocab) ||
        !check_ids(ctx, "targets", targets, m->cfg.vocab))
        return NULL;
    int64_t B = ts_tensor_dim(ids, 0), T = ts_tensor_dim(ids, 1);
    if (ts_tensor_dim(targets, 0) != B || ts_tensor_dim(targets, 1) != T) {
        ts_set_error(ctx, TS_ERR_SHAPE,
                     "decoder_loss: targets [%" PRId64 ", %" PRId64
                     "] do not match ids [%" PRId64 ", %" PRId64 "]",
                     ts_tensor_dim(targets, 0), ts_tensor_dim(targets, 1), B,
                     T);
        return NULL;
    }
    drop_router(m);
    m->collect_router = m->cfg.n_experts > 0 && m->cfg.router_aux_loss_coef > 0;
    ts_tensor *logits = ts_decoder_forward(m, ids, 0);
    m->collect_router = false;
    int64_t lshape[2] = {B * T, m->cfg.vocab}, tshape[1] = {B * T};
    ts_tensor *flat = ts_reshape(logits, 2, lshape);   /* (B*T, V) */
    ts_tensor *tflat = ts_reshape(targets, 1, tshape); /* (B*T) */
    if (flat && tflat) /* the targets go where the head is */
        move_to(&tflat, ts_tensor_device(flat));
    ts_tensor *loss = ts_cross_entropy(flat, tflat, -100, TS_REDUCE_MEAN);
    ts_release(flat), ts_release(tflat);
    if (loss && m->n_router > 0) {
        ts_device here = ts_get_device(ctx);
        ts_set_device(ctx, m->head_dev);
        ts_tensor *aux = aux_loss(m);
        ts_tensor *total = aux ? ts_add(loss, aux) : NULL;
        ts_set_device(ctx, here);
        ts_release(aux), ts_release(loss);
        loss = total;
    }
    drop_router(m);
    if (logits_out && loss)
        *logits_out = logits;
    else
        ts_release(logits);
    return loss;
}

/* ---- KV cache and generation ---- */

struct ts_decoder_cache {
    ts_decoder *m;
    int64_t B, max_T, len;
    kv_slot *slot; /* one per layer */
};

ts_status ts_decoder_cache_new(ts_decoder *m, int64_t B, int64_t max_T,
                               ts_decoder_cache **out) {
    if (!m || !out)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    const ts_model_config *c = &m->cfg;
    if (B < 1 || max_T < 1 || max_T > c->max_positions)
        return ts_set_error(
            m->ctx, TS_ERR_RANGE,
            "decoder_cache_new: batch %lld and length %lld (want >= 1, length "
            "<= max_positions %lld)",
            (long long)B, (long long)max_T, (long long)c->max_positions);
    ts_decoder_cache *kc = calloc(1, sizeof *kc);
    if (kc)
        kc->slot = calloc((size_t)c->layers, sizeof *kc->slot);
    if (!kc || !kc->slot) {
        free(kc);
        return ts_set_error(m->ctx, TS_ERR_OOM,
                            "decoder_cache_new: out of memory");
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
            ts_decoder_cache_free(kc);
            return ts_ctx_status(m->ctx);
        }
    }
    *out = kc;
    return TS_OK;
}

void ts_decoder_cache_free(ts_decoder_cache *kc) {
    if (!kc)
        return;
    for (int64_t i = 0; i < kc->m->cfg.layers; i++)
        ts_release(kc->slot[i].k), ts_release(kc->slot[i].v);
    free(kc->slot);
    free(kc);
}

int64_t ts_decoder_cache_len(const ts_decoder_cache *kc) {
    return kc ? kc->len : 0;
}

void ts_decoder_cache_reset(ts_decoder_cache *kc) {
    if (kc)
        kc->len = 0;
}

void ts_decoder_cache_truncate(ts_decoder_cache *kc, int64_t len) {
    if (kc && len >= 0 && len < kc->len)
        kc->len = len; /* later positions are overwritten as they come */
}

static ts_tensor *forward_cached(ts_decoder *m, ts_decoder_cache *kc,
                                 ts_tensor *ids, bool last_only) {
    if (!m || !kc)
        return NULL;
    ts_ctx *ctx = m->ctx;
    const ts_model_config *c = &m->cfg;
    if (!check_ids(ctx, "ids", ids, m->cfg.vocab))
        return NULL;
    int64_t B = ts_tensor_dim(ids, 0), T = ts_tensor_dim(ids, 1);
    if (B != kc->B || kc->len + T > kc->max_T) {
        ts_set_error(ctx, TS_ERR_RANGE,
                     "decoder_forward_cached: %lld x %lld new tokens do not "
                     "fit the cache (batch %lld, %lld of %lld positions used)",
                     (long long)B, (long long)T, (long long)kc->B,
                     (long long)kc->len, (long long)kc->max_T);
        return NULL;
    }
    for (int64_t i = 0; i < c->layers; i++)
        kc->slot[i].len = kc->len;
    ts_tensor *logits = run_layers(m, ids, kc->len, kc->slot, last_only, false);
    if (logits)
        kc->len += T;
    return logits;
}

ts_tensor *ts_decoder_forward_cached(ts_decoder *m, ts_decoder_cache *kc,
                                     ts_tensor *ids) {
    return forward_cached(m, kc, ids, false);
}

ts_tensor *ts_decoder_forward_cached_last(ts_decoder *m, ts_decoder_cache *kc,
                                          ts_tensor *ids) {
    return forward_cached(m, kc, ids, true);
}

typedef struct {
    ts_decoder *m;
    ts_decoder_cache *kc;
} greedy_step;

static ts_tensor *next_logits(void *arg, ts_tensor *ids) {
    greedy_step *q = arg;
    return ts_decoder_forward_cached_last(q->m, q->kc, ids);
}

ts_status ts_decoder_generate_greedy(ts_decoder *m, const int64_t *prompt,
                                     int64_t n_prompt, int64_t n_new,
                                     int64_t *out) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    greedy_step q = {m, NULL};
    if (n_prompt >= 1 && n_new >= 0 &&
        ts_decoder_cache_new(m, 1, n_prompt + n_new, &q.kc) != TS_OK)
        return ts_ctx_status(m->ctx);
    ts_status s = ts_generate_greedy_with(m->ctx, next_logits, &q, prompt,
                                          n_prompt, n_new, out);
    ts_decoder_cache_free(q.kc);
    return s;
}

/* ---- paged KV cache (serving) ---- */

struct ts_kv_pool {
    ts_decoder *m;
    int64_t n_blocks, block_size;
    ts_kv_dtype dt;     /* the type every layer's pools hold */
    int64_t row_bytes;  /* one position of one KV head */
    ts_tensor **k, **v; /* per layer (blocks, KV, block_size, row), beside
                           it */
};

const char *ts_kv_dtype_name(ts_kv_dtype dt) {
    switch (dt) {
    case TS_KV_BF16:
        return "bf16";
    case TS_KV_F32:
        return "f32";
    case TS_KV_INT8:
        return "int8";
    }
    return "?";
}

/* the pool tensors' last dim and dtype for type dt and head dim D */
static int64_t kv_row_elems(ts_kv_dtype dt, int64_t D, ts_dtype *tdt) {
    *tdt = dt == TS_KV_BF16 ? TS_BF16 : dt == TS_KV_INT8 ? TS_I32 : TS_F32;
    return dt == TS_KV_INT8 ? (D + 3) / 4 + 1 : D;
}

static int64_t kv_row_bytes(ts_kv_dtype dt, int64_t D) {
    ts_dtype tdt;
    int64_t n = kv_row_elems(dt, D, &tdt);
    return n * (int64_t)ts_dtype_size(tdt);
}

int64_t ts_kv_block_bytes_ex(const ts_model_config *c, int64_t block_size,
                             ts_kv_dtype dt) {
    return 2 * c->layers * c->kv_heads * block_size *
           kv_row_bytes(dt, c->head_dim);
}

int64_t ts_kv_block_bytes(const ts_model_config *c, int64_t block_size) {
    return ts_kv_block_bytes_ex(c, block_size, TS_KV_F32);
}

ts_kv_dtype ts_decoder_kv_dtype(const ts_decoder *m, ts_kv_dtype want) {
    /* the other backends' paged kernels read f32 pools */
    for (int64_t i = 0; m && i < m->cfg.layers; i++)
        if (m->layer_dev[i].kind != TS_DEVICE_CPU)
            return TS_KV_F32;
    return want;
}

ts_status ts_kv_pool_new_ex(ts_decoder *m, int64_t n_blocks, int64_t block_size,
                            ts_kv_dtype dt, ts_kv_pool **out) {
    if (!m || !out)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    const ts_model_config *c = &m->cfg;
    if (n_blocks < 1 || block_size < 1 || block_size > 1024)
        return ts_set_error(m->ctx, TS_ERR_RANGE,
                            "kv_pool: %lld blocks of %lld positions (want at "
                            "least one block of 1..1024)",
                            (long long)n_blocks, (long long)block_size);
    if (dt != TS_KV_BF16 && dt != TS_KV_F32 && dt != TS_KV_INT8)
        return ts_set_error(m->ctx, TS_ERR_RANGE,
                            "kv_pool: KV dtype %d (want bf16, f32 or int8)",
                            (int)dt);
    dt = ts_decoder_kv_dtype(m, dt);
    ts_kv_pool *p = calloc(1, sizeof *p);
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
    p->m = m, p->n_blocks = n_blocks, p->block_size = block_size, p->dt = dt;
    p->row_bytes = kv_row_bytes(dt, c->head_dim);
    ts_dtype tdt;
    int64_t shape[4] = {n_blocks, c->kv_heads, block_size,
                        kv_row_elems(dt, c->head_dim, &tdt)};
    ts_device here = ts_get_device(m->ctx);
    ts_status s = TS_OK;
    for (int64_t i = 0; i < c->layers && s == TS_OK; i++) {
        ts_set_device(m->ctx, m->layer_dev[i]);
        p->k[i] = ts_zeros(m->ctx, tdt, 4, shape);
        p->v[i] = ts_zeros(m->ctx, tdt, 4, shape);
        if (!p->k[i] || !p->v[i])
            s = ts_ctx_status(m->ctx);
    }
    ts_set_device(m->ctx, here);
    if (s != TS_OK) {
        ts_kv_pool_free(p);
        return s;
    }
    *out = p;
    return TS_OK;
}

ts_status ts_kv_pool_new(ts_decoder *m, int64_t n_blocks, int64_t block_size,
                         ts_kv_pool **out) {
    return ts_kv_pool_new_ex(m, n_blocks, block_size, TS_KV_F32, out);
}

void ts_kv_pool_free(ts_kv_pool *p) {
    if (!p)
        return;
    for (int64_t i = 0; i < p->m->cfg.layers; i++)
        ts_release(p->k[i]), ts_release(p->v[i]);
    free(p->k), free(p->v), free(p);
}

ts_kv_dtype ts_kv_pool_dtype(const ts_kv_pool *p) {
    return p ? p->dt : TS_KV_F32;
}

/* one block of a pool on a device (f32 there): read back, or written from
 * the host (the KV transfer of prefill/decode disaggregation) */
static ts_status device_block(ts_tensor *pool, int64_t block, float *out,
                              const float *in) {
    ts_ctx *ctx = ts_tensor_ctx(pool);
    ts_tensor *v = ts_slice(pool, 0, block, block + 1, 1);
    ts_status st = v ? TS_OK : ts_ctx_status(ctx);
    if (st == TS_OK && out)
        st = ts_tensor_read(v, out, TS_F32);
    if (st == TS_OK && in) {
        ts_device here = ts_get_device(ctx);
        ts_set_device(ctx, ts_tensor_device(pool));
        ts_tensor *src = ts_from_data(ctx, TS_F32, ts_tensor_ndim(v),
                                      ts_tensor_shape(v), in);
        ts_set_device(ctx, here);
        st = src ? ts_copy_(v, src) : ts_ctx_status(ctx);
        ts_release(src);
    }
    ts_release(v);
    return st;
}

/* the block's bytes of every layer, per layer K then V, each one slab of
 * (KV, block_size) rows of the pool's type */
static ts_status kv_pool_copy(ts_kv_pool *p, int64_t block, char *out,
                              const char *in) {
    if (!p || (!out && !in))
        return TS_ERR_INVALID_ARG;
    if (block < 0 || block >= p->n_blocks)
        return ts_set_error(p->m->ctx, TS_ERR_RANGE,
                            "kv_pool: block %lld of %lld", (long long)block,
                            (long long)p->n_blocks);
    const ts_model_config *c = &p->m->cfg;
    size_t slab = (size_t)(c->kv_heads * p->block_size * p->row_bytes);
    for (int64_t i = 0; i < c->layers; i++)
        for (int kv = 0; kv < 2; kv++) {
            ts_tensor *t = kv ? p->v[i] : p->k[i];
            size_t at = (size_t)(2 * i + kv) * slab;
            if (ts_tensor_device(t).kind != TS_DEVICE_CPU) {
                ts_status st = device_block(
                    t, block, out ? (float *)(void *)(out + at) : NULL,
                    in ? (const float *)(const void *)(in + at) : NULL);
                if (st != TS_OK)
                    return st;
                continue;
            }
            char *pool = ts_tensor_data(t);
            if (!pool)
                return ts_ctx_status(p->m->ctx);
            pool += (size_t)block * slab;
            if (out)
                memcpy(out + at, pool, slab);
            else
                memcpy(pool, in + at, slab);
        }
    return TS_OK;
}

ts_status ts_kv_pool_read_block(ts_kv_pool *p, int64_t block, void *out) {
    return out ? kv_pool_copy(p, block, out, NULL) : TS_ERR_INVALID_ARG;
}

ts_status ts_kv_pool_write_block(ts_kv_pool *p, int64_t block, const void *in) {
    return in ? kv_pool_copy(p, block, NULL, in) : TS_ERR_INVALID_ARG;
}

/* rows[0..n) of x (N, C) on the head's device, gathered -> (n, C) */
static ts_tensor *gather_rows(ts_decoder *m, ts_tensor *x, int64_t N,
                              const int32_t *rows, int64_t n) {
    int64_t flat[2] = {N, m->cfg.hidden}, rshape[1] = {n};
    ts_tensor *xf = ts_reshape(x, 2, flat);
    ts_tensor *idx = ts_from_data(m->ctx, TS_I32, 1, rshape, rows);
    ts_tensor *sel = xf && idx ? ts_embedding(xf, idx) : NULL;
    ts_release(xf), ts_release(idx);
    return sel;
}

static bool rows_in_range(ts_ctx *ctx, const char *what, const int32_t *rows,
                          int64_t n, int64_t N) {
    for (int64_t r = 0; r < n; r++)
        if (rows[r] < 0 || rows[r] >= N) {
            ts_set_error(ctx, TS_ERR_RANGE,
                         "forward_paged: %s row %d outside the %lld tokens",
                         what, rows[r], (long long)N);
            return false;
        }
    return true;
}

ts_status ts_decoder_forward_paged_ex(ts_decoder *m, ts_kv_pool *pool,
                                      ts_tensor *ids, const int32_t *positions,
                                      ts_tensor *meta, const int32_t *rows,
                                      int64_t n_rows, const int32_t *hrows,
                                      int64_t n_hrows, ts_tensor **logits,
                                      ts_tensor **hidden) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    ts_ctx *ctx = m->ctx;
    const ts_model_config *c = &m->cfg;
    if (!pool || !positions || !meta || n_rows < 0 || n_hrows < 0 ||
        (n_rows && (!rows || !logits)) || (n_hrows && (!hrows || !hidden)))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "forward_paged: NULL argument");
    if (logits)
        *logits = NULL;
    if (hidden)
        *hidden = NULL;
    if (!check_ids(ctx, "ids", ids, m->cfg.vocab))
        return ts_ctx_status(ctx);
    int64_t N = ts_tensor_dim(ids, 1);
    for (int64_t t = 0; t < N; t++)
        if (positions[t] < 0 || positions[t] >= c->max_positions)
            return ts_set_error(ctx, TS_ERR_RANGE,
                                "forward_paged: position %d outside "
                                "max_positions %lld",
                                positions[t], (long long)c->max_positions);
    if (!rows_in_range(ctx, "logits", rows, n_rows, N) ||
        !rows_in_range(ctx, "hidden", hrows, n_hrows, N))
        return ts_ctx_status(ctx);
    ts_device here = ts_get_device(ctx);
    ts_set_device(ctx, m->embed_dev);
    ts_tensor *id_moved = ts_to_device(ids, m->embed_dev);
    ts_tensor *x = id_moved ? embed(m, id_moved, positions, N) : NULL;
    ts_release(id_moved);
    rope_set rs = {0};
    ts_tensor *mt = ts_retain(meta);
    ts_set_device(ctx, c->layers ? m->layer_dev[0] : m->embed_dev);
    if (x && rope_tables(m, positions, N, &rs) != TS_OK)
        ts_release(x), x = NULL;
    for (int64_t i = 0; i < c->layers && x; i++) {
        ts_device d = m->layer_dev[i];
        ts_set_device(ctx, d);
        if (!move_to(&x, d) || !rope_move(&rs, d) || !move_to(&mt, d)) {
            ts_release(x), x = NULL;
            break;
        }
        paged_ref pg = {pool->k[i], pool->v[i], mt};
        x = run_layer(m, i, x, c->pos == TS_POS_ROPE ? &rs : NULL, NULL, &pg);
    }
    rope_release(&rs);
    ts_release(mt);
    ts_set_device(ctx, m->head_dev);
    bool ok = x && move_to(&x, m->head_dev);
    if (ok && n_rows) { /* the rows whose next token is wanted */
        ts_tensor *sel = gather_rows(m, x, N, rows, n_rows);
        *logits = sel ? head(m, sel) : NULL; /* (n_rows, V) */
        ts_release(sel);
        ok = *logits != NULL;
    }
    if (ok && n_hrows) { /* the rows an embedding pools */
        ts_tensor *sel = gather_rows(m, x, N, hrows, n_hrows);
        *hidden = sel ? final_norm(m, sel) : NULL; /* (n_hrows, C) */
        ts_release(sel);
        ok = *hidden != NULL;
    }
    ts_release(x);
    ts_set_device(ctx, here);
    if (ok)
        return TS_OK;
    if (logits)
        ts_release(*logits), *logits = NULL;
    return ts_ctx_status(ctx) ? ts_ctx_status(ctx)
                              : ts_set_error(ctx, TS_ERR_STATE,
                                             "forward_paged: forward failed");
}

ts_tensor *ts_decoder_forward_paged(ts_decoder *m, ts_kv_pool *pool,
                                    ts_tensor *ids, const int32_t *positions,
                                    ts_tensor *meta, const int32_t *rows,
                                    int64_t n_rows) {
    if (!m || !pool || !positions || !meta || !rows || n_rows < 1)
        return NULL;
    ts_tensor *logits = NULL;
    ts_decoder_forward_paged_ex(m, pool, ids, positions, meta, rows, n_rows,
                                NULL, 0, &logits, NULL);
    return logits;
}

/* ---- the checkpoint's view ---- */

void ts_decoder_state_dict_free(int n, char **names, ts_tensor **tensors) {
    for (int i = 0; i < n; i++) {
        if (names)
            free(names[i]);
        if (tensors)
            ts_release(tensors[i]);
    }
    free(names), free(tensors);
}

ts_status ts_decoder_state_dict(const ts_decoder *m, ts_tensor *const *params,
                                int *n, char ***names, ts_tensor ***tensors) {
    if (!m || !n || !names || !tensors)
        return TS_ERR_INVALID_ARG;
    if (!params)
        params = m->params;
    *n = 0, *names = NULL, *tensors = NULL;
    int64_t total = 0;
    for (int i = 0; i < m->n_params; i++)
        total += m->spec[i].parts;
    char **nm = calloc((size_t)total + 1, sizeof *nm);
    ts_tensor **ts = calloc((size_t)total + 1, sizeof *ts);
    if (!nm || !ts) {
        free(nm), free(ts);
        return ts_set_error(m->ctx, TS_ERR_OOM, "state_dict: out of memory");
    }
    int k = 0;
    ts_status s = TS_OK;
    for (int i = 0; i < m->n_params && s == TS_OK; i++) {
        const dec_param *p = &m->spec[i];
        for (int64_t e = 0; e < p->parts && s == TS_OK; e++, k++) {
            char name[DEC_NAME_LEN], spelled[DEC_NAME_LEN + 32];
            dec_part_name(&m->cfg, p, e, name, sizeof name);
            dec_layout_name(m->layout, name, spelled, sizeof spelled);
            nm[k] = strdup(spelled);
            if (p->parts == 1)
                ts[k] = ts_retain(params[i]);
            else { /* expert e's slice as a 2-D view */
                ts_tensor *sl = ts_slice(params[i], 0, e, e + 1, 1);
                ts[k] = sl ? ts_squeeze(sl, 0) : NULL;
                ts_release(sl);
            }
            if (!nm[k] || !ts[k])
                s = ts_ctx_status(m->ctx) != TS_OK
                        ? ts_ctx_status(m->ctx)
                        : ts_set_error(m->ctx, TS_ERR_OOM,
                                       "state_dict: out of memory");
        }
    }
    if (s != TS_OK) {
        ts_decoder_state_dict_free(k, nm, ts);
        return s;
    }
    *n = k, *names = nm, *tensors = ts;
    return TS_OK;
}

/* the loader's: the checkpoint layout the state dict keeps */
void dec_set_layout(ts_decoder *m, int layout);
void dec_set_layout(ts_decoder *m, int layout) {
    if (m)
        m->layout = layout;
}

/* the loader's: where config.json came from, for ts_decoder_save */
void dec_set_config_src(ts_decoder *m, const char *path);
void dec_set_config_src(ts_decoder *m, const char *path) {
    if (m && path)
        snprintf(m->config_src, sizeof m->config_src, "%s", path);
}

ts_status ts_decoder_save(ts_decoder *m, const char *dir) {
    if (!m || !dir)
        return TS_ERR_INVALID_ARG;
    int n;
    char **names;
    ts_tensor **ts;
    ts_status s = ts_decoder_state_dict(m, NULL, &n, &names, &ts);
    if (s != TS_OK)
        return s;
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    const char *meta[2] = {"format", "pt"};
    s = ts_safetensors_save(m->ctx, p, n, (const char *const *)names, ts, 1,
                            meta);
    ts_decoder_state_dict_free(n, names, ts);
    if (s == TS_OK && m->config_src[0]) {
        snprintf(p, sizeof p, "%s/config.json", dir);
        if (strcmp(p, m->config_src))
            s = ts_copy_file(m->ctx, m->config_src, p);
    }
    return s;
}
