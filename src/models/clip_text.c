/* clip_text.c — Transformers' CLIPTextModel (Stable Diffusion's
 * text_encoder/): token + position embeddings, pre-norm encoder layers
 * (causal multi-head self-attention, an MLP with quick_gelu or gelu), the
 * final layer norm; last_hidden_state out. Loaded from a folder's
 * config.json (CLIPTextConfig) and model.safetensors, names under
 * text_model.; built from public ops only, so eager and compiled modes
 * run the same code. Owns its parameters; the tokenizer is bpe.c's. */
#include "diffusion_internal.h"

#include "tessera_nn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum { ACT_QUICK_GELU, ACT_GELU, ACT_GELU_TANH } clip_act;

typedef struct {
    ts_tensor *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    ts_tensor *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo;
    ts_tensor *fc1_w, *fc1_b, *fc2_w, *fc2_b;
} clip_layer;

struct ts_clip_text {
    ts_ctx *ctx;
    int64_t vocab, C, inter, n_layers, H, max_pos;
    double eps;
    clip_act act;
    ts_tensor *tok_emb, *pos_emb; /* (V, C), (P, C) */
    clip_layer *layers;
    ts_tensor *lnf_w, *lnf_b;
    size_t bytes;
};

#define N_LAYER_TENSORS 16

static ts_tensor **layer_tensors(clip_layer *l) {
    return &l->ln1_w;
}

void ts_clip_text_free(ts_clip_text *c) {
    if (!c)
        return;
    for (int64_t i = 0; c->layers && i < c->n_layers; i++) {
        ts_tensor **t = layer_tensors(&c->layers[i]);
        for (int k = 0; k < N_LAYER_TENSORS; k++)
            ts_release(t[k]);
    }
    free(c->layers);
    ts_release(c->tok_emb), ts_release(c->pos_emb);
    ts_release(c->lnf_w), ts_release(c->lnf_b);
    free(c);
}

/* hidden_act names as Transformers' ACT2FN spells them */
static bool parse_act(const char *s, clip_act *a) {
    if (!strcmp(s, "quick_gelu"))
        *a = ACT_QUICK_GELU;
    else if (!strcmp(s, "gelu"))
        *a = ACT_GELU;
    else if (!strcmp(s, "gelu_new") || !strcmp(s, "gelu_pytorch_tanh"))
        *a = ACT_GELU_TANH;
    else
        return false;
    return true;
}

static ts_status load_layer(dz_comp *dc, ts_clip_text *c, int64_t i,
                            clip_layer *l) {
    int64_t C = c->C, I = c->inter, cc[2] = {C, C}, ic[2] = {I, C},
            ci[2] = {C, I}, v[1] = {C}, vi[1] = {I};
    const char *p = "text_model.encoder.layers";
    long long li = (long long)i;
    if (!(l->ln1_w = dz_param(dc, 1, v, "%s.%lld.layer_norm1.weight", p, li)) ||
        !(l->ln1_b = dz_param(dc, 1, v, "%s.%lld.layer_norm1.bias", p, li)) ||
        !(l->wq =
              dz_param(dc, 2, cc, "%s.%lld.self_attn.q_proj.weight", p, li)) ||
        !(l->bq = dz_param(dc, 1, v, "%s.%lld.self_attn.q_proj.bias", p, li)) ||
        !(l->wk =
              dz_param(dc, 2, cc, "%s.%lld.self_attn.k_proj.weight", p, li)) ||
        !(l->bk = dz_param(dc, 1, v, "%s.%lld.self_attn.k_proj.bias", p, li)) ||
        !(l->wv =
              dz_param(dc, 2, cc, "%s.%lld.self_attn.v_proj.weight", p, li)) ||
        !(l->bv = dz_param(dc, 1, v, "%s.%lld.self_attn.v_proj.bias", p, li)) ||
        !(l->wo = dz_param(dc, 2, cc, "%s.%lld.self_attn.out_proj.weight", p,
                           li)) ||
        !(l->bo =
              dz_param(dc, 1, v, "%s.%lld.self_attn.out_proj.bias", p, li)) ||
        !(l->ln2_w = dz_param(dc, 1, v, "%s.%lld.layer_norm2.weight", p, li)) ||
        !(l->ln2_b = dz_param(dc, 1, v, "%s.%lld.layer_norm2.bias", p, li)) ||
        !(l->fc1_w = dz_param(dc, 2, ic, "%s.%lld.mlp.fc1.weight", p, li)) ||
        !(l->fc1_b = dz_param(dc, 1, vi, "%s.%lld.mlp.fc1.bias", p, li)) ||
        !(l->fc2_w = dz_param(dc, 2, ci, "%s.%lld.mlp.fc2.weight", p, li)) ||
        !(l->fc2_b = dz_param(dc, 1, v, "%s.%lld.mlp.fc2.bias", p, li)))
        return ts_ctx_status(c->ctx);
    return TS_OK;
}

ts_status ts_clip_text_load(ts_ctx *ctx, const char *dir,
                            const ts_component_opts *opts, ts_clip_text **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!dir || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "clip_text_load: NULL argument");
    *out = NULL;
    dz_comp dc;
    ts_status s = dz_open(ctx, dir, NULL, opts, &dc);
    if (s)
        return s;
    ts_clip_text *c = calloc(1, sizeof *c);
    if (!c) {
        dz_close(&dc);
        return ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", dir);
    }
    c->ctx = ctx;
    /* CLIPTextModel, or SDXL's CLIPTextModelWithProjection (whose
     * last_hidden_state is the same) */
    const char *arch = json_string_value(
        json_array_get(json_object_get(dc.config, "architectures"), 0));
    if (arch && strcmp(arch, "CLIPTextModel") &&
        strcmp(arch, "CLIPTextModelWithProjection"))
        s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: architectures[0] is \"%s\", expected "
                         "\"CLIPTextModel\"",
                         dc.config_path, arch);
    char act[64];
    /* CLIPTextConfig's defaults */
    if (!s && !(dz_int(&dc, "vocab_size", 49408, &c->vocab) &&
                dz_int(&dc, "hidden_size", 512, &c->C) &&
                dz_int(&dc, "intermediate_size", 2048, &c->inter) &&
                dz_int(&dc, "num_hidden_layers", 12, &c->n_layers) &&
                dz_int(&dc, "num_attention_heads", 8, &c->H) &&
                dz_int(&dc, "max_position_embeddings", 77, &c->max_pos) &&
                dz_num(&dc, "layer_norm_eps", 1e-5, &c->eps) &&
                dz_str(&dc, "hidden_act", "quick_gelu", act, sizeof act)))
        s = ts_ctx_status(ctx);
    if (!s && !parse_act(act, &c->act))
        s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: hidden_act \"%s\" is not supported (quick_gelu, "
                         "gelu, gelu_new, gelu_pytorch_tanh)",
                         dc.config_path, act);
    if (!s &&
        (c->vocab <= 0 || c->C <= 0 || c->inter <= 0 || c->n_layers <= 0 ||
         c->n_layers > 4096 || c->H <= 0 || c->C % c->H || c->max_pos <= 0))
        s = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                         "%s: sizes out of range (vocab_size %lld, "
                         "hidden_size %lld divisible by num_attention_heads "
                         "%lld, intermediate_size %lld, num_hidden_layers "
                         "%lld, max_position_embeddings %lld)",
                         dc.config_path, (long long)c->vocab, (long long)c->C,
                         (long long)c->H, (long long)c->inter,
                         (long long)c->n_layers, (long long)c->max_pos);
    int64_t vc[2] = {c->vocab, c->C}, pc[2] = {c->max_pos, c->C}, v[1] = {c->C};
    if (!s &&
        (!(c->tok_emb = dz_param(&dc, 2, vc,
                                 "text_model.embeddings.token_embedding."
                                 "weight")) ||
         !(c->pos_emb = dz_param(&dc, 2, pc,
                                 "text_model.embeddings.position_embedding."
                                 "weight")) ||
         !(c->lnf_w =
               dz_param(&dc, 1, v, "text_model.final_layer_norm.weight")) ||
         !(c->lnf_b = dz_param(&dc, 1, v, "text_model.final_layer_norm.bias"))))
        s = ts_ctx_status(ctx);
    if (!s && !(c->layers = calloc((size_t)c->n_layers, sizeof *c->layers)))
        s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", dir);
    for (int64_t i = 0; !s && i < c->n_layers; i++)
        s = load_layer(&dc, c, i, &c->layers[i]);
    c->bytes = dc.bytes;
    dz_close(&dc);
    if (s) {
        ts_clip_text_free(c);
        return s;
    }
    *out = c;
    return TS_OK;
}

/* x (B, T, C) -> (B, H, T, D) */
static ts_tensor *heads_of(ts_tensor *x, int64_t H) {
    int64_t sh[4] = {ts_tensor_dim(x, 0), ts_tensor_dim(x, 1), H,
                     ts_tensor_dim(x, 2) / H};
    ts_tensor *r = ts_reshape(x, 4, sh);
    ts_tensor *p = r ? ts_transpose(r, 1, 2) : NULL;
    ts_release(r);
    return p;
}

/* CLIPAttention with the causal mask: x (B, T, C) -> (B, T, C) */
static ts_tensor *self_attention(const ts_clip_text *c, const clip_layer *l,
                                 ts_tensor *x) {
    ts_tensor *q = ts_linear(x, l->wq, l->bq), *k = ts_linear(x, l->wk, l->bk),
              *v = ts_linear(x, l->wv, l->bv);
    ts_tensor *qh = q ? heads_of(q, c->H) : NULL,
              *kh = k ? heads_of(k, c->H) : NULL,
              *vh = v ? heads_of(v, c->H) : NULL;
    ts_release(q), ts_release(k), ts_release(v);
    double D = (double)(c->C / c->H);
    ts_tensor *o = ts_attention(qh, kh, vh, NULL, true, 1.0 / sqrt(D));
    ts_release(qh), ts_release(kh), ts_release(vh);
    ts_tensor *ot = o ? ts_transpose(o, 1, 2) : NULL; /* (B, T, H, D) */
    ts_release(o);
    ts_tensor *oc = ot ? ts_contiguous(ot) : NULL;
    ts_release(ot);
    int64_t sh[3] = {ts_tensor_dim(x, 0), ts_tensor_dim(x, 1), c->C};
    ts_tensor *of = oc ? ts_reshape(oc, 3, sh) : NULL;
    ts_release(oc);
    ts_tensor *y = of ? ts_linear(of, l->wo, l->bo) : NULL;
    ts_release(of);
    return y;
}

static ts_tensor *activation(clip_act a, ts_tensor *x) {
    if (a == ACT_GELU)
        return ts_gelu(x, TS_GELU_ERF);
    if (a == ACT_GELU_TANH)
        return ts_gelu(x, TS_GELU_TANH);
    /* quick_gelu: x * sigmoid(1.702 x) */
    ts_tensor *s = ts_mul_scalar(x, 1.702);
    ts_tensor *g = s ? ts_sigmoid(s) : NULL;
    ts_release(s);
    ts_tensor *y = g ? ts_mul(x, g) : NULL;
    ts_release(g);
    return y;
}

/* one pre-norm encoder layer: h (B, T, C) -> (B, T, C) */
static ts_tensor *encoder_layer(const ts_clip_text *c, const clip_layer *l,
                                ts_tensor *h) {
    ts_tensor *n1 = ts_layernorm(h, l->ln1_w, l->ln1_b, c->eps);
    ts_tensor *a = n1 ? self_attention(c, l, n1) : NULL;
    ts_release(n1);
    ts_tensor *h1 = a ? ts_add(h, a) : NULL;
    ts_release(a);
    ts_tensor *n2 = h1 ? ts_layernorm(h1, l->ln2_w, l->ln2_b, c->eps) : NULL;
    ts_tensor *f1 = n2 ? ts_linear(n2, l->fc1_w, l->fc1_b) : NULL;
    ts_release(n2);
    ts_tensor *g = f1 ? activation(c->act, f1) : NULL;
    ts_release(f1);
    ts_tensor *f2 = g ? ts_linear(g, l->fc2_w, l->fc2_b) : NULL;
    ts_release(g);
    ts_tensor *h2 = f2 ? ts_add(h1, f2) : NULL;
    ts_release(f2), ts_release(h1);
    return h2;
}

ts_tensor *ts_clip_text_forward(ts_clip_text *c, ts_tensor *ids) {
    if (!c || !ids)
        return NULL;
    ts_dtype dt = ts_tensor_dtype(ids);
    if (ts_tensor_ndim(ids) != 2 || (dt != TS_I32 && dt != TS_I64)) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                     "clip_text_forward: ids must be (B, T) of i32 or i64, "
                     "not %dD %s",
                     ts_tensor_ndim(ids), ts_dtype_name(dt));
        return NULL;
    }
    int64_t T = ts_tensor_dim(ids, 1);
    if (T < 1 || T > c->max_pos) {
        ts_set_error(c->ctx, TS_ERR_RANGE,
                     "clip_text_forward: %lld tokens, but the model has %lld "
                     "positions (max_position_embeddings)",
                     (long long)T, (long long)c->max_pos);
        return NULL;
    }
    /* (B, T, C) = token rows + position rows 0..T-1 (broadcast over B) */
    ts_tensor *tok = ts_embedding(c->tok_emb, ids);
    ts_tensor *pos = ts_slice(c->pos_emb, 0, 0, T, 1);
    ts_tensor *pf = pos && ts_tensor_dtype(pos) != TS_F32 ? ts_cast(pos, TS_F32)
                                                          : ts_retain(pos);
    ts_tensor *tf = tok && ts_tensor_dtype(tok) != TS_F32 ? ts_cast(tok, TS_F32)
                                                          : ts_retain(tok);
    ts_release(tok), ts_release(pos);
    ts_tensor *h = tf && pf ? ts_add(tf, pf) : NULL;
    ts_release(tf), ts_release(pf);
    for (int64_t i = 0; h && i < c->n_layers; i++) {
        ts_tensor *next = encoder_layer(c, &c->layers[i], h);
        ts_release(h);
        h = next;
    }
    ts_tensor *y = h ? ts_layernorm(h, c->lnf_w, c->lnf_b, c->eps) : NULL;
    ts_release(h);
    return y;
}

int64_t ts_clip_text_hidden_size(const ts_clip_text *c) {
    return c ? c->C : 0;
}

int64_t ts_clip_text_max_positions(const ts_clip_text *c) {
    return c ? c->max_pos : 0;
}

size_t ts_clip_text_param_bytes(const ts_clip_text *c) {
    return c ? c->bytes : 0;
}
