/* vae.c — Diffusers' AutoencoderKL: its config.json read (values that
 * would change the computation in ways not built here are refused by key
 * and value), its parameters fetched by their Diffusers names (the legacy
 * attention names query/key/value/proj_attn too, as Diffusers converts them
 * at load), the encoder (image -> the latent distribution's mean and
 * log-variance) and the decoder (latents -> image). One device. */
#include "diffusion_blocks.h"

#include "tessera_nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The mid block's Attention: GroupNorm (eps 1e-6), one head over the H W
 * positions (attention_head_dim is the width), to_out, plus the input. */
typedef struct {
    ts_tensor *gn_w, *gn_b, *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *o_w, *o_b;
    int64_t heads;
} attn_block;

typedef struct {
    dz_resnet res[2];
    attn_block attn;
    bool has_attn;
} mid_block;

typedef struct {
    int n_res;
    dz_resnet *res;
    ts_tensor *sample_w, *sample_b; /* down/upsampler conv or NULL */
} vae_block;

struct ts_vae {
    ts_ctx *ctx;
    ts_device dev;
    dz_params params;
    size_t bytes;
    int64_t in_ch, out_ch, latent, groups, lpb, sample_size;
    int n;
    int64_t boc[DZ_MAX_ARRAY];
    double scaling, shift;
    bool has_shift;
    /* encoder */
    ts_tensor *e_in_w, *e_in_b, *e_norm_w, *e_norm_b, *e_out_w, *e_out_b;
    vae_block down[DZ_MAX_ARRAY];
    mid_block e_mid;
    /* between */
    ts_tensor *quant_w, *quant_b, *pquant_w, *pquant_b;
    /* decoder */
    ts_tensor *d_in_w, *d_in_b, *d_norm_w, *d_norm_b, *d_out_w, *d_out_b;
    vae_block up[DZ_MAX_ARRAY];
    mid_block d_mid;
};

#define VAE_EPS 1e-6 /* every GroupNorm of the encoder and decoder */

static bool refuse(dz_comp *c, const char *key, const char *value,
                   const char *supported) {
    ts_set_error(c->ctx, TS_ERR_UNSUPPORTED, "%s: \"%s\" is %s (supported: %s)",
                 c->config_path, key, value, supported);
    return false;
}

static bool block_types(dz_comp *c, const char *key, const char *want,
                        int n_expect) {
    char t[DZ_MAX_ARRAY][64];
    int n;
    if (!json_object_get(c->config, key)) {
        n = 1;
        snprintf(t[0], 64, "%s", want);
        /* Diffusers' default: one block, as block_out_channels' (64) */
        if (n_expect != 1) {
            ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                         "%s: \"%s\" is missing (block_out_channels has %d "
                         "entries)",
                         c->config_path, key, n_expect);
            return false;
        }
        return true;
    }
    if ((n = dz_str_list(c, key, t)) < 0)
        return false;
    for (int k = 0; k < n; k++)
        if (strcmp(t[k], want)) {
            ts_set_error(c->ctx, TS_ERR_UNSUPPORTED,
                         "%s: %s[%d]: unknown block type \"%s\" (supported: "
                         "%s)",
                         c->config_path, key, k, t[k], want);
            return false;
        }
    if (n != n_expect) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                     "%s: \"%s\" has %d entries, block_out_channels %d",
                     c->config_path, key, n, n_expect);
        return false;
    }
    return true;
}

static bool read_config(dz_comp *c, ts_vae *v, bool *mid_attn, bool *quant,
                        bool *pquant) {
    char act[64];
    bool upcast;
    if (!dz_int(c, "in_channels", 3, &v->in_ch) ||
        !dz_int(c, "out_channels", 3, &v->out_ch) ||
        !dz_int(c, "latent_channels", 4, &v->latent) ||
        !dz_int(c, "norm_num_groups", 32, &v->groups) ||
        !dz_int(c, "layers_per_block", 1, &v->lpb) ||
        !dz_int(c, "sample_size", 32, &v->sample_size) ||
        !dz_num(c, "scaling_factor", 0.18215, &v->scaling) ||
        !dz_bool(c, "force_upcast", true, &upcast) ||
        !dz_bool(c, "mid_block_add_attention", true, mid_attn) ||
        !dz_bool(c, "use_quant_conv", true, quant) ||
        !dz_bool(c, "use_post_quant_conv", true, pquant) ||
        !dz_str(c, "act_fn", "silu", act, sizeof act))
        return false;
    if (strcmp(act, "silu") && strcmp(act, "swish")) {
        char q[80];
        snprintf(q, sizeof q, "\"%s\"", act);
        return refuse(c, "act_fn", q, "\"silu\"");
    }
    json_t *sf = json_object_get(c->config, "shift_factor");
    v->has_shift = sf && !json_is_null(sf);
    if (!dz_num(c, "shift_factor", 0, &v->shift))
        return false;
    if (v->in_ch <= 0 || v->out_ch <= 0 || v->latent <= 0 || v->groups <= 0 ||
        v->lpb <= 0) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                     "%s: in_channels, out_channels, latent_channels, "
                     "norm_num_groups and layers_per_block must be positive",
                     c->config_path);
        return false;
    }
    if (!json_object_get(c->config, "block_out_channels")) {
        v->boc[0] = 64, v->n = 1;
    } else if ((v->n = dz_int_list(c, "block_out_channels", 0, v->boc)) < 0) {
        return false;
    }
    for (int k = 0; k < v->n; k++)
        if (v->boc[k] <= 0) {
            ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                         "%s: block_out_channels[%d] is %lld", c->config_path,
                         k, (long long)v->boc[k]);
            return false;
        }
    return block_types(c, "down_block_types", "DownEncoderBlock2D", v->n) &&
           block_types(c, "up_block_types", "UpDecoderBlock2D", v->n);
}

/* Diffusers' name, else the legacy one it converts at load */
static const char *attn_name(dz_loader *L, const char *p, const char *now,
                             const char *legacy) {
    return dz_has(L->c, "%s.%s.weight", p, now) ||
                   !dz_has(L->c, "%s.%s.weight", p, legacy)
               ? now
               : legacy;
}

static void load_mid(dz_loader *L, mid_block *m, const char *p, int64_t C,
                     int64_t G, bool attn) {
    char nm[300];
    snprintf(nm, sizeof nm, "%s.resnets.0", p);
    dz_resnet_load(L, &m->res[0], nm, C, C, 0, G, VAE_EPS, 1.0);
    m->has_attn = attn;
    if (attn) {
        attn_block *a = &m->attn;
        snprintf(nm, sizeof nm, "%s.attentions.0", p);
        dz_check_groups(L, G, C, "norm_num_groups", nm);
        a->heads = 1; /* attention_head_dim = the width */
        a->gn_w = dz_vec(L, C, "%s.group_norm.weight", nm);
        a->gn_b = dz_vec(L, C, "%s.group_norm.bias", nm);
        const char *names[4][2] = {{"to_q", "query"},
                                   {"to_k", "key"},
                                   {"to_v", "value"},
                                   {"to_out.0", "proj_attn"}};
        ts_tensor **dst[4][2] = {{&a->q_w, &a->q_b},
                                 {&a->k_w, &a->k_b},
                                 {&a->v_w, &a->v_b},
                                 {&a->o_w, &a->o_b}};
        for (int k = 0; k < 4; k++) {
            const char *n = attn_name(L, nm, names[k][0], names[k][1]);
            *dst[k][0] = dz_mat(L, C, C, "%s.%s.weight", nm, n);
            *dst[k][1] = dz_vec(L, C, "%s.%s.bias", nm, n);
        }
    }
    snprintf(nm, sizeof nm, "%s.resnets.1", p);
    dz_resnet_load(L, &m->res[1], nm, C, C, 0, G, VAE_EPS, 1.0);
}

static bool alloc_block(dz_loader *L, vae_block *b, int n) {
    b->n_res = n;
    b->res = calloc((size_t)n, sizeof *b->res);
    if (!b->res)
        return dz_fail(L, TS_ERR_OOM, "%s: out of memory", L->c->dir);
    return true;
}

static void load_all(dz_loader *L, ts_vae *v, bool mid_attn, bool quant,
                     bool pquant) {
    int n = v->n;
    int64_t G = v->groups, top = v->boc[n - 1], L2 = 2 * v->latent;
    char p[300];
    /* encoder */
    v->e_in_w = dz_kernel(L, v->boc[0], v->in_ch, 3, "encoder.conv_in.weight");
    v->e_in_b = dz_vec(L, v->boc[0], "encoder.conv_in.bias");
    int64_t out = v->boc[0];
    for (int i = 0; i < n && !L->failed; i++) {
        int64_t in = out;
        out = v->boc[i];
        vae_block *b = &v->down[i];
        if (!alloc_block(L, b, (int)v->lpb))
            return;
        for (int j = 0; j < b->n_res; j++) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.resnets.%d", i, j);
            dz_resnet_load(L, &b->res[j], p, j ? out : in, out, 0, G, VAE_EPS,
                           1.0);
        }
        if (i < n - 1) {
            b->sample_w = dz_kernel(
                L, out, out, 3,
                "encoder.down_blocks.%d.downsamplers.0.conv.weight", i);
            b->sample_b = dz_vec(
                L, out, "encoder.down_blocks.%d.downsamplers.0.conv.bias", i);
        }
    }
    load_mid(L, &v->e_mid, "encoder.mid_block", top, G, mid_attn);
    dz_check_groups(L, G, top, "norm_num_groups", "encoder.conv_norm_out");
    v->e_norm_w = dz_vec(L, top, "encoder.conv_norm_out.weight");
    v->e_norm_b = dz_vec(L, top, "encoder.conv_norm_out.bias");
    v->e_out_w = dz_kernel(L, L2, top, 3, "encoder.conv_out.weight");
    v->e_out_b = dz_vec(L, L2, "encoder.conv_out.bias");
    if (quant) {
        v->quant_w = dz_kernel(L, L2, L2, 1, "quant_conv.weight");
        v->quant_b = dz_vec(L, L2, "quant_conv.bias");
    }
    if (pquant) {
        v->pquant_w =
            dz_kernel(L, v->latent, v->latent, 1, "post_quant_conv.weight");
        v->pquant_b = dz_vec(L, v->latent, "post_quant_conv.bias");
    }
    /* decoder: widths reversed */
    v->d_in_w = dz_kernel(L, top, v->latent, 3, "decoder.conv_in.weight");
    v->d_in_b = dz_vec(L, top, "decoder.conv_in.bias");
    load_mid(L, &v->d_mid, "decoder.mid_block", top, G, mid_attn);
    out = top;
    for (int i = 0; i < n && !L->failed; i++) {
        int64_t prev = out;
        out = v->boc[n - 1 - i];
        vae_block *b = &v->up[i];
        if (!alloc_block(L, b, (int)v->lpb + 1))
            return;
        for (int j = 0; j < b->n_res; j++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d", i, j);
            dz_resnet_load(L, &b->res[j], p, j ? out : prev, out, 0, G, VAE_EPS,
                           1.0);
        }
        if (i < n - 1) {
            b->sample_w =
                dz_kernel(L, out, out, 3,
                          "decoder.up_blocks.%d.upsamplers.0.conv.weight", i);
            b->sample_b = dz_vec(
                L, out, "decoder.up_blocks.%d.upsamplers.0.conv.bias", i);
        }
    }
    int64_t c0 = v->boc[0];
    dz_check_groups(L, G, c0, "norm_num_groups", "decoder.conv_norm_out");
    v->d_norm_w = dz_vec(L, c0, "decoder.conv_norm_out.weight");
    v->d_norm_b = dz_vec(L, c0, "decoder.conv_norm_out.bias");
    v->d_out_w = dz_kernel(L, v->out_ch, c0, 3, "decoder.conv_out.weight");
    v->d_out_b = dz_vec(L, v->out_ch, "decoder.conv_out.bias");
}

ts_status ts_vae_load(ts_ctx *ctx, const char *dir,
                      const ts_component_opts *opts, ts_vae **out) {
    *out = NULL;
    ts_vae *v = calloc(1, sizeof *v);
    if (!v)
        return ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", dir);
    v->ctx = ctx;
    dz_comp c;
    ts_status s = dz_open(ctx, dir, "AutoencoderKL", opts, &c);
    if (s) {
        free(v);
        return s;
    }
    v->dev = c.device;
    dz_loader L = {.c = &c, .owned = &v->params};
    bool mid_attn, quant, pquant;
    if (!read_config(&c, v, &mid_attn, &quant, &pquant))
        L.failed = true;
    else
        load_all(&L, v, mid_attn, quant, pquant);
    v->bytes = c.bytes;
    dz_close(&c);
    if (L.failed) {
        s = ts_ctx_status(ctx) ? ts_ctx_status(ctx) : TS_ERR_INVALID_ARG;
        ts_vae_free(v);
        return s;
    }
    *out = v;
    return TS_OK;
}

void ts_vae_free(ts_vae *v) {
    if (!v)
        return;
    for (int i = 0; i < DZ_MAX_ARRAY; i++)
        free(v->down[i].res), free(v->up[i].res);
    dz_params_free(&v->params);
    free(v);
}

double ts_vae_scaling_factor(const ts_vae *v) {
    return v ? v->scaling : 0;
}
double ts_vae_shift_factor(const ts_vae *v) {
    return v ? v->shift : 0;
}
int64_t ts_vae_latent_channels(const ts_vae *v) {
    return v ? v->latent : 0;
}
int ts_vae_downscale(const ts_vae *v) {
    return v ? 1 << (v->n - 1) : 0;
}
size_t ts_vae_param_bytes(const ts_vae *v) {
    return v ? v->bytes : 0;
}

/* ---- forward ---- */

/* x (B, C, H, W) -> x + to_out(attention(group_norm(x) over H W)) */
static ts_tensor *attn_forward(const attn_block *a, int64_t groups,
                               ts_tensor *x) {
    if (!x)
        return NULL;
    const int64_t *s = ts_tensor_shape(x);
    int64_t B = s[0], C = s[1], H = s[2], W = s[3];
    ts_tensor *n = ts_group_norm(x, groups, a->gn_w, a->gn_b, VAE_EPS);
    int64_t s3[3] = {B, C, H * W};
    ts_tensor *n3 = n ? ts_reshape(n, 3, s3) : NULL;
    ts_release(n);
    ts_tensor *t = n3 ? ts_transpose(n3, 1, 2) : NULL; /* (B, H W, C) */
    ts_release(n3);
    ts_tensor *tc = t ? ts_contiguous(t) : NULL;
    ts_release(t);
    ts_tensor *o = dz_attention(tc, NULL, a->heads, a->q_w, a->q_b, a->k_w,
                                a->k_b, a->v_w, a->v_b, a->o_w, a->o_b);
    ts_release(tc);
    ts_tensor *ot = o ? ts_transpose(o, 1, 2) : NULL; /* (B, C, H W) */
    ts_release(o);
    ts_tensor *oc = ot ? ts_contiguous(ot) : NULL;
    ts_release(ot);
    int64_t s4[4] = {B, C, H, W};
    ts_tensor *o4 = oc ? ts_reshape(oc, 4, s4) : NULL;
    ts_release(oc);
    ts_tensor *y = ts_add(o4, x);
    ts_release(o4);
    return y;
}

static ts_tensor *step(ts_tensor *x, ts_tensor *y) {
    ts_release(x);
    return y;
}

static ts_tensor *mid_forward(const mid_block *m, int64_t groups,
                              ts_tensor *x) {
    ts_tensor *h = dz_resnet_forward(&m->res[0], x, NULL);
    if (m->has_attn)
        h = step(h, attn_forward(&m->attn, groups, h));
    return step(h, dz_resnet_forward(&m->res[1], h, NULL));
}

static ts_tensor *block_forward(const vae_block *b, ts_tensor *x, bool up) {
    ts_tensor *h = ts_retain(x);
    for (int j = 0; j < b->n_res && h; j++)
        h = step(h, dz_resnet_forward(&b->res[j], h, NULL));
    if (b->sample_w && h)
        h = step(h, up ? dz_upsample(h, b->sample_w, b->sample_b)
                       : dz_downsample(h, b->sample_w, b->sample_b, 0));
    return h;
}

static bool check_image(ts_vae *v, ts_tensor *x, int64_t ch, int64_t mult,
                        const char *what) {
    if (!x || ts_tensor_ndim(x) != 4 || ts_tensor_dim(x, 1) != ch ||
        ts_tensor_dtype(x) != TS_F32 || ts_tensor_dim(x, 2) % mult ||
        ts_tensor_dim(x, 3) % mult) {
        ts_set_error(v->ctx, TS_ERR_SHAPE,
                     "vae %s: input must be f32 (B, %lld, H, W), H and W "
                     "multiples of %lld",
                     what, (long long)ch, (long long)mult);
        return false;
    }
    return true;
}

int dz_vae_stages(const ts_vae *v) {
    return v ? v->n + 3 : 0;
}

static void keep_stage(ts_tensor **out, int k, ts_tensor *x) {
    if (out)
        out[k] = x ? ts_retain(x) : NULL;
}

ts_tensor *dz_vae_decode_stages(ts_vae *v, ts_tensor *z, ts_tensor **out) {
    if (!v || !check_image(v, z, v->latent, 1, "decode"))
        return NULL;
    ts_tensor *x = ts_to_device(z, v->dev);
    if (v->pquant_w)
        x = step(x, dz_conv(x, v->pquant_w, v->pquant_b, 1, 0));
    x = step(x, dz_conv(x, v->d_in_w, v->d_in_b, 1, 1));
    keep_stage(out, 0, x);
    x = step(x, mid_forward(&v->d_mid, v->groups, x));
    keep_stage(out, 1, x);
    for (int i = 0; i < v->n; i++) {
        x = step(x, block_forward(&v->up[i], x, true));
        keep_stage(out, 2 + i, x);
    }
    x = step(x, dz_norm_silu(x, v->groups, v->d_norm_w, v->d_norm_b, VAE_EPS));
    x = step(x, dz_conv(x, v->d_out_w, v->d_out_b, 1, 1));
    keep_stage(out, 2 + v->n, x);
    return x;
}

ts_tensor *dz_vae_encode_stages(ts_vae *v, ts_tensor *img, ts_tensor **out) {
    if (!v || !check_image(v, img, v->in_ch, ts_vae_downscale(v), "encode"))
        return NULL;
    ts_tensor *x = ts_to_device(img, v->dev);
    x = step(x, dz_conv(x, v->e_in_w, v->e_in_b, 1, 1));
    keep_stage(out, 0, x);
    for (int i = 0; i < v->n; i++) {
        x = step(x, block_forward(&v->down[i], x, false));
        keep_stage(out, 1 + i, x);
    }
    x = step(x, mid_forward(&v->e_mid, v->groups, x));
    keep_stage(out, 1 + v->n, x);
    x = step(x, dz_norm_silu(x, v->groups, v->e_norm_w, v->e_norm_b, VAE_EPS));
    x = step(x, dz_conv(x, v->e_out_w, v->e_out_b, 1, 1));
    if (v->quant_w)
        x = step(x, dz_conv(x, v->quant_w, v->quant_b, 1, 0));
    keep_stage(out, 2 + v->n, x);
    return x;
}

/* max(x, c) elementwise: the larger of x and a constant stacked on a new
 * leading dim */
static ts_tensor *max_const(ts_vae *v, ts_tensor *x, double c) {
    int nd = ts_tensor_ndim(x);
    int64_t sh[TS_MAX_DIMS];
    sh[0] = 1;
    memcpy(sh + 1, ts_tensor_shape(x), sizeof(int64_t) * (size_t)nd);
    ts_tensor *k = ts_full(v->ctx, TS_F32, nd + 1, sh, c);
    ts_tensor *kd = k ? ts_to_device(k, v->dev) : NULL;
    ts_release(k);
    ts_tensor *x1 = ts_unsqueeze(x, 0);
    ts_tensor *both[2] = {x1, kd};
    ts_tensor *cat = x1 && kd ? ts_concat(2, both, 0) : NULL;
    ts_release(x1), ts_release(kd);
    int dim0 = 0;
    ts_tensor *m = cat ? ts_amax(cat, 1, &dim0, false) : NULL;
    ts_release(cat);
    return m;
}

ts_tensor *ts_vae_decode(ts_vae *v, ts_tensor *latents) {
    return dz_vae_decode_stages(v, latents, NULL);
}

ts_status ts_vae_encode(ts_vae *v, ts_tensor *image, ts_tensor **mean,
                        ts_tensor **logvar) {
    *mean = *logvar = NULL;
    ts_tensor *m = dz_vae_encode_stages(v, image, NULL);
    if (!m)
        return v ? ts_ctx_status(v->ctx) : TS_ERR_INVALID_ARG;
    /* moments (B, 2 latent, h, w): mean, then logvar clamped to [-30, 20] */
    int64_t L = v->latent;
    ts_tensor *mu = ts_slice(m, 1, 0, L, 1);
    ts_tensor *lv = ts_slice(m, 1, L, 2 * L, 1);
    ts_release(m);
    ts_tensor *mc = mu ? ts_contiguous(mu) : NULL;
    ts_release(mu);
    /* clamp(lv, -30, 20) exactly: max(lv, -30), then -max(-y, -20) */
    ts_tensor *c1 = lv ? max_const(v, lv, -30.0) : NULL;
    ts_release(lv);
    ts_tensor *n1 = c1 ? ts_neg(c1) : NULL;
    ts_release(c1);
    ts_tensor *n2 = n1 ? max_const(v, n1, -20.0) : NULL;
    ts_release(n1);
    ts_tensor *c2 = n2 ? ts_neg(n2) : NULL;
    ts_release(n2);
    if (!mc || !c2) {
        ts_release(mc), ts_release(c2);
        return ts_ctx_status(v->ctx) ? ts_ctx_status(v->ctx) : TS_ERR_STATE;
    }
    *mean = mc, *logvar = c2;
    return TS_OK;
}
