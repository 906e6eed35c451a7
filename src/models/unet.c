/* unet.c — Diffusers' UNet2DConditionModel with the Stable Diffusion 1.x /
 * 2.x blocks (CrossAttnDownBlock2D, DownBlock2D, UNetMidBlock2DCrossAttn,
 * UpBlock2D, CrossAttnUpBlock2D; Transformer2DModel with
 * BasicTransformerBlock and GEGLU): its config.json read (values that would
 * change the computation in ways not built here are refused by key and
 * value), its parameters fetched by their Diffusers names, and its forward.
 * The model is a list of blocks (the input stage, each down block, the mid
 * block, each up block, the output stage), each on its device
 * (ts_component_opts' split): activations, the time embedding and the
 * text states move with ts_to_device where the device changes. */
#include "diffusion_blocks.h"

#include "tessera_nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* BasicTransformerBlock: self-attention, cross-attention, GEGLU MLP, each
 * after a LayerNorm (eps 1e-5) and added back. */
typedef struct {
    ts_tensor *n1_w, *n1_b, *q1, *k1, *v1, *o1_w, *o1_b;
    ts_tensor *n2_w, *n2_b, *q2, *k2, *v2, *o2_w, *o2_b;
    ts_tensor *n3_w, *n3_b, *ff1_w, *ff1_b, *ff2_w, *ff2_b;
} tblock;

/* Transformer2DModel (continuous input): GroupNorm (eps 1e-6), proj_in
 * (Linear, or a 1x1 conv kept as its (inner, C) matrix), the blocks over
 * the H W positions, proj_out, plus the input. */
typedef struct {
    ts_tensor *norm_w, *norm_b, *pin_w, *pin_b, *pout_w, *pout_b;
    int n_layers;
    tblock *tb;
    int64_t heads, inner, groups;
    bool linear;
} xformer;

enum { ST_IN, ST_DOWN, ST_XDOWN, ST_MID, ST_UP, ST_XUP, ST_OUT };

typedef struct {
    int kind;
    ts_device dev;
    int n_res; /* resnets (and attentions, in the cross-attention kinds) */
    dz_resnet *res;
    xformer *attn;                  /* NULL in DownBlock2D / UpBlock2D */
    ts_tensor *sample_w, *sample_b; /* downsampler / upsampler conv, or NULL */
} stage;

struct ts_unet {
    ts_ctx *ctx;
    dz_params params;
    size_t bytes;
    int64_t in_ch, out_ch, sample_size, cross_dim, c0, temb_dim;
    bool center, flip;
    double freq_shift, norm_eps;
    int64_t groups;
    int downsample_pad, n_down, n_up;
    /* input and output stages' parameters */
    ts_tensor *conv_in_w, *conv_in_b, *t1_w, *t1_b, *t2_w, *t2_b;
    ts_tensor *norm_out_w, *norm_out_b, *conv_out_w, *conv_out_b;
    int conv_in_pad, conv_out_pad;
    int n_stages;
    stage *st;
};

/* ---- config ---- */

static const char *down_types[] = {"CrossAttnDownBlock2D", "DownBlock2D"};
static const char *up_types[] = {"UpBlock2D", "CrossAttnUpBlock2D"};

static bool refuse(dz_comp *c, const char *key, const char *value,
                   const char *supported) {
    ts_set_error(c->ctx, TS_ERR_UNSUPPORTED, "%s: \"%s\" is %s (supported: %s)",
                 c->config_path, key, value, supported);
    return false;
}

/* key absent or null (the only value supported) */
static bool need_null(dz_comp *c, const char *key) {
    json_t *v = json_object_get(c->config, key);
    if (!v || json_is_null(v))
        return true;
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    refuse(c, key, s ? s : "set", "null");
    free(s);
    return false;
}

/* a string key that must be want (def when absent) */
static bool need_str(dz_comp *c, const char *key, const char *def,
                     const char *want) {
    char v[64];
    if (!dz_str(c, key, def, v, sizeof v))
        return false;
    if (!strcmp(v, want))
        return true;
    char q[80];
    snprintf(q, sizeof q, "\"%s\"", v);
    char w[80];
    snprintf(w, sizeof w, "\"%s\"", want);
    return refuse(c, key, q, w);
}

static bool need_false(dz_comp *c, const char *key) {
    json_t *v = json_object_get(c->config, key);
    if (!v || json_is_null(v) || json_is_false(v))
        return true;
    if (json_is_array(v)) {
        size_t k;
        json_t *e;
        bool all_false = true;
        json_array_foreach(v, k, e) all_false &= json_is_false(e);
        if (all_false)
            return true;
    }
    return refuse(c, key, json_is_true(v) ? "true" : "a list with true",
                  "false");
}

static bool act_ok(dz_comp *c) {
    char a[64];
    if (!dz_str(c, "act_fn", "silu", a, sizeof a))
        return false;
    if (!strcmp(a, "silu") || !strcmp(a, "swish"))
        return true;
    char q[80];
    snprintf(q, sizeof q, "\"%s\"", a);
    return refuse(c, "act_fn", q, "\"silu\"");
}

/* A list of block types (Diffusers' defaults when absent), each one of
 * the names in ok. */
static int block_types(dz_comp *c, const char *key, const char *const *defs,
                       int n_defs, const char *const *ok, char (*out)[64]) {
    int n;
    if (!json_object_get(c->config, key)) {
        for (int k = 0; k < n_defs; k++)
            snprintf(out[k], 64, "%s", defs[k]);
        n = n_defs;
    } else if ((n = dz_str_list(c, key, out)) < 0) {
        return -1;
    }
    for (int k = 0; k < n; k++)
        if (strcmp(out[k], ok[0]) && strcmp(out[k], ok[1])) {
            ts_set_error(c->ctx, TS_ERR_UNSUPPORTED,
                         "%s: %s[%d]: unknown block type \"%s\" (supported: "
                         "%s, %s)",
                         c->config_path, key, k, out[k], ok[0], ok[1]);
            return -1;
        }
    return n;
}

/* int or list of n ints (Diffusers' default def when absent) */
static bool int_list(dz_comp *c, const char *key, int64_t def, int n,
                     int64_t *out) {
    if (!json_object_get(c->config, key) ||
        json_is_null(json_object_get(c->config, key))) {
        for (int k = 0; k < n; k++)
            out[k] = def;
        return true;
    }
    int got = dz_int_list(c, key, n, out);
    if (got < 0)
        return false;
    if (got != n) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                     "%s: \"%s\" has %d entries, down_block_types %d",
                     c->config_path, key, got, n);
        return false;
    }
    for (int k = 0; k < n; k++)
        if (out[k] <= 0) {
            ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                         "%s: \"%s\"[%d] is %lld (must be positive)",
                         c->config_path, key, k, (long long)out[k]);
            return false;
        }
    return true;
}

typedef struct {
    int n;
    char down[DZ_MAX_ARRAY][64], up[DZ_MAX_ARRAY][64];
    int64_t boc[DZ_MAX_ARRAY], lpb[DZ_MAX_ARRAY], heads[DZ_MAX_ARRAY],
        tlayers[DZ_MAX_ARRAY], cross[DZ_MAX_ARRAY];
    int64_t conv_in_k, conv_out_k, temb_dim;
    bool linear;
    double mid_scale;
} unet_cfg;

static bool read_config(dz_comp *c, ts_unet *u, unet_cfg *g) {
    static const char *def_down[] = {"CrossAttnDownBlock2D",
                                     "CrossAttnDownBlock2D",
                                     "CrossAttnDownBlock2D", "DownBlock2D"};
    static const char *def_up[] = {"UpBlock2D", "CrossAttnUpBlock2D",
                                   "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"};
    int64_t v;
    if (!dz_int(c, "sample_size", 0, &u->sample_size) ||
        !dz_int(c, "in_channels", 4, &u->in_ch) ||
        !dz_int(c, "out_channels", 4, &u->out_ch) ||
        !dz_bool(c, "center_input_sample", false, &u->center) ||
        !dz_bool(c, "flip_sin_to_cos", true, &u->flip) ||
        !dz_num(c, "freq_shift", 0, &u->freq_shift) ||
        !dz_int(c, "downsample_padding", 1, &v) ||
        !dz_num(c, "mid_block_scale_factor", 1, &g->mid_scale) ||
        !dz_num(c, "norm_eps", 1e-5, &u->norm_eps) ||
        !dz_bool(c, "use_linear_projection", false, &g->linear) ||
        !dz_int(c, "conv_in_kernel", 3, &g->conv_in_k) ||
        !dz_int(c, "conv_out_kernel", 3, &g->conv_out_k) ||
        !dz_int(c, "time_embedding_dim", 0, &g->temb_dim))
        return false;
    u->downsample_pad = (int)v;
    if (v < 0 || v > 1) {
        char s[32];
        snprintf(s, sizeof s, "%lld", (long long)v);
        return refuse(c, "downsample_padding", s, "0, 1");
    }
    /* norm_num_groups null removes the output norm: not built here */
    json_t *ng = json_object_get(c->config, "norm_num_groups");
    if (ng && json_is_null(ng))
        return refuse(c, "norm_num_groups", "null", "an integer");
    if (!dz_int(c, "norm_num_groups", 32, &u->groups))
        return false;
    if (u->in_ch <= 0 || u->out_ch <= 0 || u->groups <= 0) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                     "%s: in_channels, out_channels and norm_num_groups "
                     "must be positive",
                     c->config_path);
        return false;
    }
    if (g->conv_in_k < 1 || g->conv_in_k % 2 == 0 || g->conv_out_k < 1 ||
        g->conv_out_k % 2 == 0) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                     "%s: conv_in_kernel and conv_out_kernel must be odd "
                     "and positive",
                     c->config_path);
        return false;
    }
    /* the keys whose other values would change the computation */
    bool upcast; /* f32 attention already: upcasting changes nothing */
    if (!need_str(c, "resnet_time_scale_shift", "default", "default") ||
        !need_str(c, "time_embedding_type", "positional", "positional") ||
        !need_str(c, "attention_type", "default", "default") ||
        !need_null(c, "class_embed_type") ||
        !need_null(c, "addition_embed_type") ||
        !need_null(c, "encoder_hid_dim") ||
        !need_null(c, "encoder_hid_dim_type") ||
        !need_null(c, "num_class_embeds") ||
        !need_null(c, "time_embedding_act_fn") ||
        !need_null(c, "timestep_post_act") ||
        !need_null(c, "time_cond_proj_dim") ||
        !need_null(c, "cross_attention_norm") ||
        !need_null(c, "reverse_transformer_layers_per_block") ||
        !need_false(c, "dual_cross_attention") ||
        !need_false(c, "only_cross_attention") ||
        !need_false(c, "class_embeddings_concat") || !act_ok(c) ||
        !dz_bool(c, "upcast_attention", false, &upcast) ||
        !need_str(c, "mid_block_type", "UNetMidBlock2DCrossAttn",
                  "UNetMidBlock2DCrossAttn"))
        return false;
    json_t *mid = json_object_get(c->config, "mid_block_type");
    if (mid && json_is_null(mid))
        return refuse(c, "mid_block_type", "null",
                      "\"UNetMidBlock2DCrossAttn\"");
    int nd =
        block_types(c, "down_block_types", def_down, 4, down_types, g->down);
    if (nd < 0)
        return false;
    int nu = block_types(c, "up_block_types", def_up, 4, up_types, g->up);
    if (nu < 0)
        return false;
    int nb;
    if (!json_object_get(c->config, "block_out_channels")) {
        int64_t d[4] = {320, 640, 1280, 1280};
        memcpy(g->boc, d, sizeof d);
        nb = 4;
    } else if ((nb = dz_int_list(c, "block_out_channels", 0, g->boc)) < 0) {
        return false;
    }
    if (nd != nb || nu != nb) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                     "%s: down_block_types (%d), up_block_types (%d) and "
                     "block_out_channels (%d) must have as many entries",
                     c->config_path, nd, nu, nb);
        return false;
    }
    for (int k = 0; k < nb; k++)
        if (g->boc[k] <= 0) {
            ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                         "%s: block_out_channels[%d] is %lld", c->config_path,
                         k, (long long)g->boc[k]);
            return false;
        }
    g->n = nb;
    /* attention_head_dim is the head count (Diffusers' legacy naming) unless
     * num_attention_heads is given */
    json_t *nh = json_object_get(c->config, "num_attention_heads");
    bool has_nh = nh && !json_is_null(nh);
    if (!int_list(c, has_nh ? "num_attention_heads" : "attention_head_dim", 8,
                  nb, g->heads) ||
        !int_list(c, "layers_per_block", 2, nb, g->lpb) ||
        !int_list(c, "transformer_layers_per_block", 1, nb, g->tlayers) ||
        !int_list(c, "cross_attention_dim", 1280, nb, g->cross))
        return false;
    for (int k = 1; k < nb; k++)
        if (g->cross[k] != g->cross[0]) {
            ts_set_error(c->ctx, TS_ERR_UNSUPPORTED,
                         "%s: \"cross_attention_dim\" differs between blocks "
                         "(%lld and %lld); one text width is supported",
                         c->config_path, (long long)g->cross[0],
                         (long long)g->cross[k]);
            return false;
        }
    u->cross_dim = g->cross[0];
    u->c0 = g->boc[0];
    u->temb_dim = g->temb_dim > 0 ? g->temb_dim : 4 * g->boc[0];
    u->n_down = nd, u->n_up = nu;
    return true;
}

/* ---- loading ---- */

static void load_tblock(dz_loader *L, tblock *b, const char *p, int64_t C,
                        int64_t cross) {
    int64_t F = 4 * C; /* FeedForward's mult 4 */
    b->n1_w = dz_vec(L, C, "%s.norm1.weight", p);
    b->n1_b = dz_vec(L, C, "%s.norm1.bias", p);
    b->q1 = dz_mat(L, C, C, "%s.attn1.to_q.weight", p);
    b->k1 = dz_mat(L, C, C, "%s.attn1.to_k.weight", p);
    b->v1 = dz_mat(L, C, C, "%s.attn1.to_v.weight", p);
    b->o1_w = dz_mat(L, C, C, "%s.attn1.to_out.0.weight", p);
    b->o1_b = dz_vec(L, C, "%s.attn1.to_out.0.bias", p);
    b->n2_w = dz_vec(L, C, "%s.norm2.weight", p);
    b->n2_b = dz_vec(L, C, "%s.norm2.bias", p);
    b->q2 = dz_mat(L, C, C, "%s.attn2.to_q.weight", p);
    b->k2 = dz_mat(L, C, cross, "%s.attn2.to_k.weight", p);
    b->v2 = dz_mat(L, C, cross, "%s.attn2.to_v.weight", p);
    b->o2_w = dz_mat(L, C, C, "%s.attn2.to_out.0.weight", p);
    b->o2_b = dz_vec(L, C, "%s.attn2.to_out.0.bias", p);
    b->n3_w = dz_vec(L, C, "%s.norm3.weight", p);
    b->n3_b = dz_vec(L, C, "%s.norm3.bias", p);
    b->ff1_w = dz_mat(L, 2 * F, C, "%s.ff.net.0.proj.weight", p);
    b->ff1_b = dz_vec(L, 2 * F, "%s.ff.net.0.proj.bias", p);
    b->ff2_w = dz_mat(L, C, F, "%s.ff.net.2.weight", p);
    b->ff2_b = dz_vec(L, C, "%s.ff.net.2.bias", p);
}

/* a 1x1 conv's (O, I, 1, 1) kernel as its (O, I) matrix */
static ts_tensor *conv1x1_matrix(dz_loader *L, int64_t o, int64_t i,
                                 const char *name) {
    ts_tensor *k = dz_kernel(L, o, i, 1, "%s", name);
    if (!k)
        return NULL;
    int64_t sh[2] = {o, i};
    ts_tensor *m = ts_reshape(k, 2, sh);
    if (!m)
        L->failed = true;
    else
        L->owned->t[L->owned->n - 1] = m, ts_release(k);
    return m;
}

static void load_xformer(dz_loader *L, xformer *x, const char *p, int64_t C,
                         int64_t heads, int n_layers, int64_t cross,
                         int64_t groups, bool linear) {
    char nm[300];
    if (heads <= 0 || C / heads == 0) {
        dz_fail(L, TS_ERR_INVALID_ARG,
                "%s: %lld attention heads for the %lld channels of %s",
                L->c->config_path, (long long)heads, (long long)C, p);
        return;
    }
    x->heads = heads, x->inner = heads * (C / heads);
    x->groups = groups, x->linear = linear, x->n_layers = n_layers;
    int64_t I = x->inner;
    snprintf(nm, sizeof nm, "%s.norm", p);
    dz_check_groups(L, groups, C, "norm_num_groups", nm);
    x->norm_w = dz_vec(L, C, "%s.norm.weight", p);
    x->norm_b = dz_vec(L, C, "%s.norm.bias", p);
    if (linear) {
        x->pin_w = dz_mat(L, I, C, "%s.proj_in.weight", p);
        x->pout_w = dz_mat(L, C, I, "%s.proj_out.weight", p);
    } else {
        snprintf(nm, sizeof nm, "%s.proj_in.weight", p);
        x->pin_w = conv1x1_matrix(L, I, C, nm);
        snprintf(nm, sizeof nm, "%s.proj_out.weight", p);
        x->pout_w = conv1x1_matrix(L, C, I, nm);
    }
    x->pin_b = dz_vec(L, I, "%s.proj_in.bias", p);
    x->pout_b = dz_vec(L, C, "%s.proj_out.bias", p);
    x->tb = calloc((size_t)n_layers, sizeof *x->tb);
    if (!x->tb) {
        dz_fail(L, TS_ERR_OOM, "%s: out of memory", L->c->dir);
        return;
    }
    for (int k = 0; k < n_layers && !L->failed; k++) {
        snprintf(nm, sizeof nm, "%s.transformer_blocks.%d", p, k);
        load_tblock(L, &x->tb[k], nm, I, cross);
    }
}

static bool stage_alloc(dz_loader *L, stage *s, int n_res, bool attn) {
    s->n_res = n_res;
    s->res = calloc((size_t)n_res, sizeof *s->res);
    s->attn = attn ? calloc((size_t)n_res, sizeof *s->attn) : NULL;
    if (!s->res || (attn && !s->attn))
        return dz_fail(L, TS_ERR_OOM, "%s: out of memory", L->c->dir);
    return true;
}

static void load_stages(dz_loader *L, ts_unet *u, const unet_cfg *g,
                        const ts_component_opts *opts) {
    int nb = g->n;
    int64_t T = u->temb_dim, G = u->groups;
    double eps = u->norm_eps;
    char p[300];
    for (int s = 0; s < u->n_stages; s++) {
        bool second = opts && opts->split_block > 0 && s >= opts->split_block;
        u->st[s].dev = second ? opts->device2 : L->c->device;
    }
    dz_comp *c = L->c;
    ts_device first = c->device;
    /* input: conv_in and the time embedding */
    c->device = u->st[0].dev;
    u->st[0].kind = ST_IN;
    int64_t k = g->conv_in_k;
    u->conv_in_w = dz_kernel(L, u->c0, u->in_ch, k, "conv_in.weight");
    u->conv_in_b = dz_vec(L, u->c0, "conv_in.bias");
    u->conv_in_pad = (int)(k - 1) / 2;
    u->t1_w = dz_mat(L, T, u->c0, "time_embedding.linear_1.weight");
    u->t1_b = dz_vec(L, T, "time_embedding.linear_1.bias");
    u->t2_w = dz_mat(L, T, T, "time_embedding.linear_2.weight");
    u->t2_b = dz_vec(L, T, "time_embedding.linear_2.bias");
    /* down blocks */
    int64_t out = g->boc[0];
    for (int i = 0; i < nb && !L->failed; i++) {
        stage *s = &u->st[1 + i];
        c->device = s->dev;
        int64_t in = out;
        out = g->boc[i];
        bool cross = !strcmp(g->down[i], "CrossAttnDownBlock2D");
        s->kind = cross ? ST_XDOWN : ST_DOWN;
        if (!stage_alloc(L, s, (int)g->lpb[i], cross))
            return;
        for (int j = 0; j < s->n_res; j++) {
            snprintf(p, sizeof p, "down_blocks.%d.resnets.%d", i, j);
            dz_resnet_load(L, &s->res[j], p, j ? out : in, out, T, G, eps, 1.0);
            if (cross) {
                snprintf(p, sizeof p, "down_blocks.%d.attentions.%d", i, j);
                load_xformer(L, &s->attn[j], p, out, g->heads[i],
                             (int)g->tlayers[i], u->cross_dim, G, g->linear);
            }
        }
        if (i < nb - 1) {
            s->sample_w = dz_kernel(
                L, out, out, 3, "down_blocks.%d.downsamplers.0.conv.weight", i);
            s->sample_b =
                dz_vec(L, out, "down_blocks.%d.downsamplers.0.conv.bias", i);
        }
    }
    /* mid block */
    stage *m = &u->st[1 + nb];
    c->device = m->dev;
    m->kind = ST_MID;
    int64_t top = g->boc[nb - 1];
    if (!L->failed && stage_alloc(L, m, 2, true)) {
        dz_resnet_load(L, &m->res[0], "mid_block.resnets.0", top, top, T, G,
                       eps, g->mid_scale);
        load_xformer(L, &m->attn[0], "mid_block.attentions.0", top,
                     g->heads[nb - 1], (int)g->tlayers[nb - 1], u->cross_dim, G,
                     g->linear);
        dz_resnet_load(L, &m->res[1], "mid_block.resnets.1", top, top, T, G,
                       eps, g->mid_scale);
    }
    /* up blocks, widths reversed; each takes the skips of a down block */
    out = g->boc[nb - 1];
    for (int i = 0; i < nb && !L->failed; i++) {
        stage *s = &u->st[2 + nb + i];
        c->device = s->dev;
        int r = nb - 1 - i; /* the mirrored down block */
        int64_t prev = out;
        out = g->boc[r];
        int64_t in = g->boc[r > 0 ? r - 1 : 0];
        bool cross = !strcmp(g->up[i], "CrossAttnUpBlock2D");
        s->kind = cross ? ST_XUP : ST_UP;
        if (!stage_alloc(L, s, (int)g->lpb[r] + 1, cross))
            return;
        for (int j = 0; j < s->n_res; j++) {
            int64_t skip = j == s->n_res - 1 ? in : out;
            int64_t rin = j == 0 ? prev : out;
            snprintf(p, sizeof p, "up_blocks.%d.resnets.%d", i, j);
            dz_resnet_load(L, &s->res[j], p, rin + skip, out, T, G, eps, 1.0);
            if (cross) {
                snprintf(p, sizeof p, "up_blocks.%d.attentions.%d", i, j);
                load_xformer(L, &s->attn[j], p, out, g->heads[r],
                             (int)g->tlayers[r], u->cross_dim, G, g->linear);
            }
        }
        if (i < nb - 1) {
            s->sample_w = dz_kernel(L, out, out, 3,
                                    "up_blocks.%d.upsamplers.0.conv.weight", i);
            s->sample_b =
                dz_vec(L, out, "up_blocks.%d.upsamplers.0.conv.bias", i);
        }
    }
    /* output */
    stage *o = &u->st[u->n_stages - 1];
    c->device = o->dev;
    o->kind = ST_OUT;
    dz_check_groups(L, G, u->c0, "norm_num_groups", "conv_norm_out");
    u->norm_out_w = dz_vec(L, u->c0, "conv_norm_out.weight");
    u->norm_out_b = dz_vec(L, u->c0, "conv_norm_out.bias");
    k = g->conv_out_k;
    u->conv_out_w = dz_kernel(L, u->out_ch, u->c0, k, "conv_out.weight");
    u->conv_out_b = dz_vec(L, u->out_ch, "conv_out.bias");
    u->conv_out_pad = (int)(k - 1) / 2;
    c->device = first;
}

static void free_stages(ts_unet *u) {
    for (int s = 0; u->st && s < u->n_stages; s++) {
        stage *st = &u->st[s];
        for (int j = 0; st->attn && j < st->n_res; j++)
            free(st->attn[j].tb);
        free(st->attn);
        free(st->res);
    }
    free(u->st);
}

ts_status ts_unet_load(ts_ctx *ctx, const char *dir,
                       const ts_component_opts *opts, ts_unet **out) {
    *out = NULL;
    ts_unet *u = calloc(1, sizeof *u);
    if (!u)
        return ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", dir);
    u->ctx = ctx;
    dz_comp c;
    ts_status s = dz_open(ctx, dir, "UNet2DConditionModel", opts, &c);
    if (s) {
        free(u);
        return s;
    }
    unet_cfg g;
    memset(&g, 0, sizeof g);
    dz_loader L = {.c = &c, .owned = &u->params};
    if (!read_config(&c, u, &g)) {
        L.failed = true;
    } else {
        u->n_stages = g.n * 2 + 3;
        if (opts && opts->split_block > 0 && opts->split_block >= u->n_stages)
            dz_fail(&L, TS_ERR_INVALID_ARG,
                    "%s: split_block %d, but the UNet has %d blocks", dir,
                    opts->split_block, u->n_stages);
        else if (!(u->st = calloc((size_t)u->n_stages, sizeof *u->st)))
            dz_fail(&L, TS_ERR_OOM, "%s: out of memory", dir);
        else
            load_stages(&L, u, &g, opts);
    }
    u->bytes = c.bytes;
    dz_close(&c);
    if (L.failed) {
        s = ts_ctx_status(ctx) ? ts_ctx_status(ctx) : TS_ERR_INVALID_ARG;
        ts_unet_free(u);
        return s;
    }
    *out = u;
    return TS_OK;
}

void ts_unet_free(ts_unet *u) {
    if (!u)
        return;
    free_stages(u);
    dz_params_free(&u->params);
    free(u);
}

int ts_unet_num_blocks(const ts_unet *u) {
    return u ? u->n_stages : 0;
}
int64_t ts_unet_in_channels(const ts_unet *u) {
    return u ? u->in_ch : 0;
}
int64_t ts_unet_sample_size(const ts_unet *u) {
    return u ? u->sample_size : 0;
}
int64_t ts_unet_cross_attention_dim(const ts_unet *u) {
    return u ? u->cross_dim : 0;
}
size_t ts_unet_param_bytes(const ts_unet *u) {
    return u ? u->bytes : 0;
}

/* ---- forward ---- */

static ts_tensor *layernorm(ts_tensor *x, ts_tensor *w, ts_tensor *b) {
    return ts_layernorm(x, w, b, 1e-5);
}

static ts_tensor *add_into(ts_tensor *x, ts_tensor *y) {
    ts_tensor *s = ts_add(x, y);
    ts_release(x), ts_release(y);
    return s;
}

/* x (B, T, C), ehs (B, S, cross) -> (B, T, C) */
static ts_tensor *tblock_forward(const tblock *b, ts_tensor *x, ts_tensor *ehs,
                                 int64_t heads) {
    ts_tensor *h = layernorm(x, b->n1_w, b->n1_b);
    ts_tensor *a = dz_attention(h, NULL, heads, b->q1, NULL, b->k1, NULL, b->v1,
                                NULL, b->o1_w, b->o1_b);
    ts_release(h);
    x = add_into(ts_retain(x), a);
    h = layernorm(x, b->n2_w, b->n2_b);
    a = dz_attention(h, ehs, heads, b->q2, NULL, b->k2, NULL, b->v2, NULL,
                     b->o2_w, b->o2_b);
    ts_release(h);
    x = add_into(x, a);
    /* GEGLU: proj -> (hidden, gate) halves, hidden * gelu(gate) (erf) */
    h = layernorm(x, b->n3_w, b->n3_b);
    ts_tensor *p = ts_linear(h, b->ff1_w, b->ff1_b);
    ts_release(h);
    int64_t F = ts_tensor_dim(b->ff2_w, 1);
    ts_tensor *hid = p ? ts_slice(p, 2, 0, F, 1) : NULL;
    ts_tensor *gate = p ? ts_slice(p, 2, F, 2 * F, 1) : NULL;
    ts_release(p);
    ts_tensor *gg = gate ? ts_gelu(gate, TS_GELU_ERF) : NULL;
    ts_tensor *m = ts_mul(hid, gg);
    ts_release(hid), ts_release(gate), ts_release(gg);
    ts_tensor *y = m ? ts_linear(m, b->ff2_w, b->ff2_b) : NULL;
    ts_release(m);
    return add_into(x, y);
}

/* x (B, C, H, W) -> (B, C, H, W) */
static ts_tensor *xformer_forward(const xformer *t, ts_tensor *x,
                                  ts_tensor *ehs) {
    if (!x)
        return NULL;
    const int64_t *s = ts_tensor_shape(x);
    int64_t B = s[0], C = s[1], H = s[2], W = s[3];
    ts_tensor *n = ts_group_norm(x, t->groups, t->norm_w, t->norm_b, 1e-6);
    /* (B, C, H, W) -> (B, H W, C); a 1x1 conv is the same product */
    int perm[4] = {0, 2, 3, 1};
    ts_tensor *pm = n ? ts_permute(n, perm) : NULL;
    ts_release(n);
    int64_t s3[3] = {B, H * W, C};
    ts_tensor *h = pm ? ts_reshape(pm, 3, s3) : NULL;
    ts_release(pm);
    ts_tensor *hi = h ? ts_linear(h, t->pin_w, t->pin_b) : NULL;
    ts_release(h);
    h = hi;
    for (int k = 0; k < t->n_layers && h; k++) {
        ts_tensor *nh = tblock_forward(&t->tb[k], h, ehs, t->heads);
        ts_release(h);
        h = nh;
    }
    ts_tensor *o = h ? ts_linear(h, t->pout_w, t->pout_b) : NULL;
    ts_release(h);
    int64_t s4[4] = {B, H, W, C};
    ts_tensor *o4 = o ? ts_reshape(o, 4, s4) : NULL;
    ts_release(o);
    int back[4] = {0, 3, 1, 2};
    ts_tensor *op = o4 ? ts_permute(o4, back) : NULL;
    ts_release(o4);
    ts_tensor *oc = op ? ts_contiguous(op) : NULL;
    ts_release(op);
    return add_into(oc, ts_retain(x));
}

/* Moves *t to d (no copy when it is there). */
static void move(ts_tensor **t, ts_device d) {
    if (!*t)
        return;
    ts_tensor *m = ts_to_device(*t, d);
    ts_release(*t);
    *t = m;
}

static bool check_inputs(ts_unet *u, ts_tensor *sample, ts_tensor *timestep,
                         ts_tensor *ehs) {
    ts_ctx *ctx = u->ctx;
    if (!sample || !timestep || !ehs) {
        ts_set_error(ctx, TS_ERR_INVALID_ARG,
                     "unet forward: sample, timestep and "
                     "encoder_hidden_states are required");
        return false;
    }
    if (ts_tensor_ndim(sample) != 4 || ts_tensor_dim(sample, 1) != u->in_ch ||
        ts_tensor_dtype(sample) != TS_F32) {
        ts_set_error(ctx, TS_ERR_SHAPE,
                     "unet forward: sample must be f32 (B, %lld, H, W)",
                     (long long)u->in_ch);
        return false;
    }
    int64_t B = ts_tensor_dim(sample, 0);
    int64_t f = (int64_t)1 << (u->n_down - 1);
    if (ts_tensor_dim(sample, 2) % f || ts_tensor_dim(sample, 3) % f) {
        ts_set_error(ctx, TS_ERR_SHAPE,
                     "unet forward: sample's height and width (%lld, %lld) "
                     "must be multiples of %lld (%d down blocks)",
                     (long long)ts_tensor_dim(sample, 2),
                     (long long)ts_tensor_dim(sample, 3), (long long)f,
                     u->n_down);
        return false;
    }
    int64_t nt = ts_tensor_numel(timestep);
    if (ts_tensor_ndim(timestep) > 1 || (nt != B && nt != 1)) {
        ts_set_error(ctx, TS_ERR_SHAPE,
                     "unet forward: timestep must be (%lld) or one value",
                     (long long)B);
        return false;
    }
    if (ts_tensor_ndim(ehs) != 3 || ts_tensor_dim(ehs, 0) != B ||
        ts_tensor_dim(ehs, 2) != u->cross_dim ||
        ts_tensor_dtype(ehs) != TS_F32) {
        ts_set_error(ctx, TS_ERR_SHAPE,
                     "unet forward: encoder_hidden_states must be f32 "
                     "(%lld, S, %lld)",
                     (long long)B, (long long)u->cross_dim);
        return false;
    }
    return true;
}

ts_tensor *dz_unet_forward_blocks(ts_unet *u, ts_tensor *sample,
                                  ts_tensor *timestep, ts_tensor *ehs_in,
                                  ts_tensor **block_out) {
    if (!u || !check_inputs(u, sample, timestep, ehs_in))
        return NULL;
    int64_t B = ts_tensor_dim(sample, 0);
    int max_skips = 1;
    for (int s = 1; s <= u->n_down; s++)
        max_skips += u->st[s].n_res + 1;
    ts_tensor **skips = calloc((size_t)max_skips, sizeof *skips);
    if (!skips) {
        ts_set_error(u->ctx, TS_ERR_OOM, "unet forward: out of memory");
        return NULL;
    }
    int n_skips = 0;
    ts_device dev = u->st[0].dev;
    ts_tensor *x = ts_to_device(sample, dev);
    ts_tensor *ehs = ts_to_device(ehs_in, dev);
    if (u->center) {
        ts_tensor *x2 = x ? ts_mul_scalar(x, 2.0) : NULL;
        ts_release(x);
        x = x2 ? ts_add_scalar(x2, -1.0) : NULL;
        ts_release(x2);
    }
    /* time: sinusoidal (B, c0) -> linear, silu, linear (B, temb); the
     * resnets read silu(temb) */
    ts_tensor *te = dz_timestep_embedding(timestep, u->c0, u->flip,
                                          u->freq_shift, 1.0, 10000.0, dev);
    if (te && ts_tensor_dim(te, 0) != B) {
        int64_t sh[2] = {B, u->c0};
        ts_tensor *e = ts_expand(te, 2, sh);
        ts_release(te);
        te = e;
    }
    ts_tensor *t1 = te ? ts_linear(te, u->t1_w, u->t1_b) : NULL;
    ts_release(te);
    ts_tensor *a1 = t1 ? ts_silu(t1) : NULL;
    ts_release(t1);
    ts_tensor *emb = a1 ? ts_linear(a1, u->t2_w, u->t2_b) : NULL;
    ts_release(a1);
    ts_tensor *temb = emb ? ts_silu(emb) : NULL;
    ts_release(emb);
    ts_tensor *h =
        x ? dz_conv(x, u->conv_in_w, u->conv_in_b, 1, u->conv_in_pad) : NULL;
    ts_release(x);
    x = h;
    skips[n_skips++] = x ? ts_retain(x) : NULL;
    if (block_out)
        block_out[0] = x ? ts_retain(x) : NULL;
    for (int si = 1; si < u->n_stages && x; si++) {
        stage *s = &u->st[si];
        if (!ts_device_equal(s->dev, dev)) {
            dev = s->dev;
            move(&x, dev), move(&ehs, dev), move(&temb, dev);
        }
        switch (s->kind) {
        case ST_DOWN:
        case ST_XDOWN:
            for (int j = 0; j < s->n_res && x; j++) {
                h = dz_resnet_forward(&s->res[j], x, temb);
                ts_release(x);
                x = h;
                if (s->attn) {
                    h = xformer_forward(&s->attn[j], x, ehs);
                    ts_release(x);
                    x = h;
                }
                skips[n_skips++] = x ? ts_retain(x) : NULL;
            }
            if (s->sample_w && x) {
                h = dz_downsample(x, s->sample_w, s->sample_b,
                                  u->downsample_pad);
                ts_release(x);
                x = h;
                skips[n_skips++] = x ? ts_retain(x) : NULL;
            }
            break;
        case ST_MID:
            h = dz_resnet_forward(&s->res[0], x, temb);
            ts_release(x);
            x = xformer_forward(&s->attn[0], h, ehs);
            ts_release(h);
            h = dz_resnet_forward(&s->res[1], x, temb);
            ts_release(x);
            x = h;
            break;
        case ST_UP:
        case ST_XUP:
            for (int j = 0; j < s->n_res && x; j++) {
                ts_tensor *sk = skips[--n_skips];
                skips[n_skips] = NULL;
                move(&sk, dev);
                ts_tensor *cat[2] = {x, sk};
                h = sk ? ts_concat(2, cat, 1) : NULL;
                ts_release(x), ts_release(sk);
                x = dz_resnet_forward(&s->res[j], h, temb);
                ts_release(h);
                if (s->attn && x) {
                    h = xformer_forward(&s->attn[j], x, ehs);
                    ts_release(x);
                    x = h;
                }
            }
            if (s->sample_w && x) {
                h = dz_upsample(x, s->sample_w, s->sample_b);
                ts_release(x);
                x = h;
            }
            break;
        case ST_OUT:
            h = dz_norm_silu(x, u->groups, u->norm_out_w, u->norm_out_b,
                             u->norm_eps);
            ts_release(x);
            x = h ? dz_conv(h, u->conv_out_w, u->conv_out_b, 1, u->conv_out_pad)
                  : NULL;
            ts_release(h);
            break;
        }
        if (block_out)
            block_out[si] = x ? ts_retain(x) : NULL;
    }
    for (int k = 0; k < n_skips; k++)
        ts_release(skips[k]);
    free(skips);
    ts_release(ehs), ts_release(temb);
    return x;
}

ts_tensor *ts_unet_forward(ts_unet *u, ts_tensor *sample, ts_tensor *timestep,
                           ts_tensor *encoder_hidden_states) {
    return dz_unet_forward_blocks(u, sample, timestep, encoder_hidden_states,
                                  NULL);
}
