/* dit.c — Diffusers' DiTTransformer2DModel (tessera_diffusion.h): loaded
 * from a component folder or made new for training (DiT's reference
 * initialisation), its forward built from public ops only (eager and
 * compiled alike, gradients flowing to every parameter), and saved back in
 * Diffusers' layout. Owns the model; the folder reading is
 * diffusion_load.c's.
 *
 * Dimension letters: B batch, C in channels, H W pixels, p patch, gh gw
 * patches per column/row, N = gh gw tokens, D = heads x head_dim hidden,
 * Co out channels. The forward:
 *   tokens (B, N, D) = patchify(x) @ proj^T + b + sincos(gh, gw)
 *   per block: c = time_mlp(sinusoid(t)) + class_table[y]   (B, D)
 *     shift/scale/gate x2 = norm1.linear(silu(c))           (B, 6D)
 *     h += gate_msa * attn(ln(h) (1 + scale_msa) + shift_msa)
 *     h += gate_mlp * ff(ln(h) (1 + scale_mlp) + shift_mlp)
 *   shift, scale = proj_out_1(silu(c of block 0))
 *   out = unpatchify(proj_out_2(ln(h) (1 + scale) + shift)) (B, Co, H, W)
 * The patch embedding is a convolution of kernel = stride = p, computed
 * as the product it is: patches flattened as (c, i, j) times the kernel
 * seen as (D, C p p). */
#define _GNU_SOURCE
#include "diffusion_internal.h"

#include "tessera_nn.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TIME_CHANNELS 256 /* Timesteps(num_channels=256) */

/* per block, in file order */
enum {
    P_T1_W,
    P_T1_B,
    P_T2_W,
    P_T2_B,
    P_CLASS,
    P_ADA_W,
    P_ADA_B,
    P_Q_W,
    P_Q_B,
    P_K_W,
    P_K_B,
    P_V_W,
    P_V_B,
    P_O_W,
    P_O_B,
    P_FF1_W,
    P_FF1_B,
    P_FF2_W,
    P_FF2_B,
    P_PER_BLOCK
};
/* the globals: proj before the blocks, proj_out after them */
enum { G_PROJ_W, G_PROJ_B, G_HEAD = 2 };
enum { G_PO1_W, G_PO1_B, G_PO2_W, G_PO2_B, G_TAIL };

typedef enum { INIT_ZERO, INIT_XAVIER, INIT_NORMAL } init_kind;

struct ts_dit {
    ts_ctx *ctx;
    ts_dit_config cfg;
    int64_t D, heads;
    double norm_eps;  /* norm3 (the ff's layer norm) */
    bool attn_bias;   /* to_q/k/v biases */
    ts_dtype compute; /* matrices cast to this in the forward */
    int n;            /* slots: G_HEAD + P_PER_BLOCK L + G_TAIL */
    ts_tensor **slot; /* NULL: absent (attention biases without bias) */
    char **slot_name;
    int n_params; /* the present ones, compacted for ts_dit_parameters */
    ts_tensor **params;
    const char **names;
    size_t bytes;
    /* the sin-cos table of the last grid, reused while it does not change */
    ts_tensor *pos;
    int64_t pos_gh, pos_gw;
};

/* ---- the parameter table ---- */

typedef struct {
    char name[128];
    int nd;
    int64_t shape[4];
    init_kind init;
    bool optional; /* absent without attention_bias */
} pspec;

static void spec(const ts_dit *d, int i, pspec *s) {
    const ts_dit_config *c = &d->cfg;
    int64_t D = d->D, p = c->patch_size;
    memset(s, 0, sizeof *s);
    s->nd = 2;
    if (i < G_HEAD) {
        if (i == G_PROJ_W) {
            snprintf(s->name, sizeof s->name, "pos_embed.proj.weight");
            s->nd = 4;
            s->shape[0] = D, s->shape[1] = c->in_channels, s->shape[2] = p,
            s->shape[3] = p, s->init = INIT_XAVIER;
        } else {
            snprintf(s->name, sizeof s->name, "pos_embed.proj.bias");
            s->nd = 1, s->shape[0] = D, s->init = INIT_ZERO;
        }
        return;
    }
    int64_t L = c->num_layers;
    if (i >= G_HEAD + P_PER_BLOCK * L) {
        int k = i - G_HEAD - P_PER_BLOCK * (int)L;
        bool w = k == G_PO1_W || k == G_PO2_W;
        int64_t rows = k <= G_PO1_B ? 2 * D : p * p * c->out_channels;
        snprintf(s->name, sizeof s->name, "proj_out_%d.%s",
                 k <= G_PO1_B ? 1 : 2, w ? "weight" : "bias");
        s->nd = w ? 2 : 1;
        s->shape[0] = rows, s->shape[1] = D;
        s->init = INIT_ZERO;
        return;
    }
    int b = (i - G_HEAD) / P_PER_BLOCK, k = (i - G_HEAD) % P_PER_BLOCK;
    static const char *const leaf[P_PER_BLOCK] = {
        "norm1.emb.timestep_embedder.linear_1.weight",
        "norm1.emb.timestep_embedder.linear_1.bias",
        "norm1.emb.timestep_embedder.linear_2.weight",
        "norm1.emb.timestep_embedder.linear_2.bias",
        "norm1.emb.class_embedder.embedding_table.weight",
        "norm1.linear.weight",
        "norm1.linear.bias",
        "attn1.to_q.weight",
        "attn1.to_q.bias",
        "attn1.to_k.weight",
        "attn1.to_k.bias",
        "attn1.to_v.weight",
        "attn1.to_v.bias",
        "attn1.to_out.0.weight",
        "attn1.to_out.0.bias",
        "ff.net.0.proj.weight",
        "ff.net.0.proj.bias",
        "ff.net.2.weight",
        "ff.net.2.bias"};
    /* rows, columns (columns 0: a bias) and the initialisation */
    static const struct {
        int rows_d, cols;
        init_kind init;
    } shp[P_PER_BLOCK] = {
        {1, -1, INIT_NORMAL}, {1, 0, INIT_ZERO},   {1, 1, INIT_NORMAL},
        {1, 0, INIT_ZERO},    {0, 1, INIT_NORMAL}, {6, 1, INIT_ZERO},
        {6, 0, INIT_ZERO},    {1, 1, INIT_XAVIER}, {1, 0, INIT_ZERO},
        {1, 1, INIT_XAVIER},  {1, 0, INIT_ZERO},   {1, 1, INIT_XAVIER},
        {1, 0, INIT_ZERO},    {1, 1, INIT_XAVIER}, {1, 0, INIT_ZERO},
        {4, 1, INIT_XAVIER},  {4, 0, INIT_ZERO},   {1, 4, INIT_XAVIER},
        {1, 0, INIT_ZERO}};
    snprintf(s->name, sizeof s->name, "transformer_blocks.%d.%s", b, leaf[k]);
    s->shape[0] = k == P_CLASS ? c->num_classes + 1 : shp[k].rows_d * D;
    if (shp[k].cols == 0)
        s->nd = 1;
    else
        s->shape[1] = shp[k].cols < 0 ? TIME_CHANNELS : shp[k].cols * D;
    s->init = shp[k].init;
    s->optional = k == P_Q_B || k == P_K_B || k == P_V_B;
}

static ts_status alloc_slots(ts_dit *d) {
    d->n = G_HEAD + P_PER_BLOCK * (int)d->cfg.num_layers + G_TAIL;
    d->slot = calloc((size_t)d->n, sizeof *d->slot);
    d->slot_name = calloc((size_t)d->n, sizeof *d->slot_name);
    d->params = calloc((size_t)d->n, sizeof *d->params);
    d->names = calloc((size_t)d->n, sizeof *d->names);
    if (!d->slot || !d->slot_name || !d->params || !d->names)
        return ts_set_error(d->ctx, TS_ERR_OOM, "DiT: out of memory");
    return TS_OK;
}

/* names and the compacted list of present parameters */
static ts_status finish_slots(ts_dit *d) {
    d->n_params = 0;
    d->bytes = 0;
    for (int i = 0; i < d->n; i++) {
        pspec s;
        spec(d, i, &s);
        if (!(d->slot_name[i] = strdup(s.name)))
            return ts_set_error(d->ctx, TS_ERR_OOM, "DiT: out of memory");
        if (!d->slot[i])
            continue;
        d->params[d->n_params] = d->slot[i];
        d->names[d->n_params++] = d->slot_name[i];
        d->bytes += (size_t)ts_dtype_nbytes(ts_tensor_dtype(d->slot[i]),
                                            ts_tensor_numel(d->slot[i]));
    }
    return TS_OK;
}

void ts_dit_free(ts_dit *d) {
    if (!d)
        return;
    for (int i = 0; d->slot && i < d->n; i++) {
        ts_release(d->slot[i]);
        free(d->slot_name ? d->slot_name[i] : NULL);
    }
    ts_release(d->pos);
    free(d->slot), free(d->slot_name), free(d->params), free(d->names);
    free(d);
}

/* ---- load ---- */

static ts_status check_config(ts_ctx *ctx, const char *where,
                              const ts_dit_config *c) {
    const char *bad = NULL;
    if (c->in_channels < 1 || c->out_channels < 1)
        bad = "in_channels and out_channels must be >= 1";
    else if (c->patch_size < 1 || c->sample_size < 1 ||
             c->sample_size % c->patch_size)
        bad = "sample_size must be a positive multiple of patch_size";
    else if (c->num_layers < 1 || c->num_layers > 1024)
        bad = "num_layers must be in 1..1024";
    else if (c->num_attention_heads < 1 || c->attention_head_dim < 1)
        bad = "num_attention_heads and attention_head_dim must be >= 1";
    else if ((c->num_attention_heads * c->attention_head_dim) % 4)
        bad = "the hidden size (heads x head dim) must be a multiple of 4 "
              "(the 2-D sin-cos position table)";
    else if (c->num_classes < 1)
        bad = "num_embeds_ada_norm (the class count) must be >= 1";
    return bad ? ts_set_error(ctx, TS_ERR_INVALID_ARG, "%s: %s", where, bad)
               : TS_OK;
}

static ts_status read_config(dz_comp *c, ts_dit *d) {
    ts_dit_config *g = &d->cfg;
    char norm_type[64];
    bool ok =
        dz_int(c, "num_attention_heads", 16, &g->num_attention_heads) &&
        dz_int(c, "attention_head_dim", 72, &g->attention_head_dim) &&
        dz_int(c, "in_channels", 4, &g->in_channels) &&
        dz_int(c, "out_channels", 0, &g->out_channels) &&
        dz_int(c, "num_layers", 28, &g->num_layers) &&
        dz_int(c, "sample_size", 32, &g->sample_size) &&
        dz_int(c, "patch_size", 2, &g->patch_size) &&
        dz_int(c, "num_embeds_ada_norm", 1000, &g->num_classes) &&
        dz_bool(c, "attention_bias", true, &d->attn_bias) &&
        dz_num(c, "norm_eps", 1e-5, &d->norm_eps) &&
        dz_str(c, "norm_type", "ada_norm_zero", norm_type, sizeof norm_type);
    if (!ok)
        return ts_ctx_status(c->ctx);
    if (!g->out_channels)
        g->out_channels = g->in_channels;
    g->learn_sigma = g->out_channels == 2 * g->in_channels;
    if (strcmp(norm_type, "ada_norm_zero"))
        return ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                            "%s: norm_type \"%s\" is not supported (a "
                            "DiTTransformer2DModel has \"ada_norm_zero\")",
                            c->config_path, norm_type);
    char act[64];
    if (!dz_str(c, "activation_fn", "gelu-approximate", act, sizeof act))
        return ts_ctx_status(c->ctx);
    if (strcmp(act, "gelu-approximate"))
        return ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                            "%s: activation_fn \"%s\" is not supported "
                            "(\"gelu-approximate\" is DiT's)",
                            c->config_path, act);
    bool affine = false;
    if (!dz_bool(c, "norm_elementwise_affine", false, &affine))
        return ts_ctx_status(c->ctx);
    if (affine)
        return ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                            "%s: norm_elementwise_affine true is not "
                            "supported (DiT's layer norms have no weights)",
                            c->config_path);
    return check_config(c->ctx, c->config_path, g);
}

static ts_dit *dit_alloc(ts_ctx *ctx) {
    ts_dit *d = calloc(1, sizeof *d);
    if (!d) {
        ts_set_error(ctx, TS_ERR_OOM, "DiT: out of memory");
        return NULL;
    }
    d->ctx = ctx;
    d->compute = TS_F32;
    d->norm_eps = 1e-5;
    d->attn_bias = true;
    return d;
}

ts_status ts_dit_load(ts_ctx *ctx, const char *dir,
                      const ts_component_opts *opts, ts_dit **out) {
    *out = NULL;
    dz_comp c;
    ts_status st = dz_open(ctx, dir, "DiTTransformer2DModel", opts, &c);
    if (st)
        return st;
    ts_dit *d = dit_alloc(ctx);
    st = d ? read_config(&c, d) : TS_ERR_OOM;
    if (st == TS_OK) {
        d->D = d->cfg.num_attention_heads * d->cfg.attention_head_dim;
        d->heads = d->cfg.num_attention_heads;
        st = alloc_slots(d);
    }
    for (int i = 0; st == TS_OK && i < d->n; i++) {
        pspec s;
        spec(d, i, &s);
        if (s.optional && !d->attn_bias)
            continue;
        d->slot[i] = dz_param(&c, s.nd, s.shape, "%s", s.name);
        if (!d->slot[i])
            st = ts_ctx_status(ctx) ? ts_ctx_status(ctx) : TS_ERR_INVALID_ARG;
    }
    if (st == TS_OK)
        st = finish_slots(d);
    dz_close(&c);
    if (st) {
        ts_dit_free(d);
        return st;
    }
    *out = d;
    return TS_OK;
}

/* ---- new ---- */

ts_status ts_dit_new(ts_ctx *ctx, const ts_dit_config *cfg, uint64_t seed,
                     ts_dit **out) {
    *out = NULL;
    ts_dit *d = dit_alloc(ctx);
    if (!d)
        return TS_ERR_OOM;
    d->cfg = *cfg;
    if (!d->cfg.out_channels)
        d->cfg.out_channels = d->cfg.in_channels * (cfg->learn_sigma ? 2 : 1);
    d->D = d->cfg.num_attention_heads * d->cfg.attention_head_dim;
    d->heads = d->cfg.num_attention_heads;
    ts_status st = check_config(ctx, "DiT config", &d->cfg);
    if (st == TS_OK)
        st = alloc_slots(d);
    for (int i = 0; st == TS_OK && i < d->n; i++) {
        pspec s;
        spec(d, i, &s);
        ts_tensor *t;
        uint64_t sd = seed * 1000003u + (uint64_t)i;
        if (s.init == INIT_ZERO) {
            t = ts_zeros(ctx, TS_F32, s.nd, s.shape);
        } else if (s.init == INIT_NORMAL) {
            t = ts_randn(ctx, TS_F32, s.nd, s.shape, 0.02, sd);
        } else { /* xavier_uniform_: fan_in x fan_out of the 2-D view */
            double fan_out = (double)s.shape[0], fan_in = 1;
            for (int k = 1; k < s.nd; k++)
                fan_in *= (double)s.shape[k];
            double a = sqrt(6.0 / (fan_in + fan_out));
            t = ts_rand(ctx, TS_F32, s.nd, s.shape, -a, a, sd);
        }
        if (!t || ts_set_requires_grad(t, true) != TS_OK) {
            ts_release(t);
            st = ts_ctx_status(ctx) ? ts_ctx_status(ctx) : TS_ERR_OOM;
            break;
        }
        d->slot[i] = t;
    }
    if (st == TS_OK)
        st = finish_slots(d);
    if (st) {
        ts_dit_free(d);
        return st;
    }
    *out = d;
    return TS_OK;
}

/* ---- accessors ---- */

int64_t ts_dit_in_channels(const ts_dit *d) {
    return d->cfg.in_channels;
}
int64_t ts_dit_out_channels(const ts_dit *d) {
    return d->cfg.out_channels;
}
int64_t ts_dit_sample_size(const ts_dit *d) {
    return d->cfg.sample_size;
}
int64_t ts_dit_num_classes(const ts_dit *d) {
    return d->cfg.num_classes;
}
size_t ts_dit_param_bytes(const ts_dit *d) {
    return d->bytes;
}
void ts_dit_get_config(const ts_dit *d, ts_dit_config *out) {
    *out = d->cfg;
}

int ts_dit_parameters(ts_dit *d, ts_tensor ***params, const char ***names) {
    if (params)
        *params = d->params;
    if (names)
        *names = d->names;
    return d->n_params;
}

ts_status ts_dit_set_compute_dtype(ts_dit *d, ts_dtype dt) {
    if (dt != TS_F32 && dt != TS_BF16)
        return ts_set_error(d->ctx, TS_ERR_INVALID_ARG,
                            "DiT: compute dtype must be f32 or bf16, not %s",
                            ts_dtype_name(dt));
    d->compute = dt;
    return TS_OK;
}

/* ---- save ---- */

static ts_status mkdir_p(ts_ctx *ctx, const char *dir) {
    char buf[DZ_PATH_LEN];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "path too long: %s", dir);
    for (char *s = buf + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(buf, 0755) && errno != EEXIST)
            return ts_set_error(ctx, TS_ERR_IO, "cannot create %s: %s", buf,
                                strerror(errno));
        *s = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST)
        return ts_set_error(ctx, TS_ERR_IO, "cannot create %s: %s", buf,
                            strerror(errno));
    return TS_OK;
}

static json_t *config_json(const ts_dit *d) {
    const ts_dit_config *c = &d->cfg;
    json_t *j = json_object();
    json_object_set_new(j, "_class_name", json_string("DiTTransformer2DModel"));
    json_object_set_new(j, "_diffusers_version", json_string("0.30.0"));
    json_object_set_new(j, "activation_fn", json_string("gelu-approximate"));
    json_object_set_new(j, "attention_bias", json_boolean(d->attn_bias));
    json_object_set_new(j, "attention_head_dim",
                        json_integer(c->attention_head_dim));
    json_object_set_new(j, "dropout", json_real(0.0));
    json_object_set_new(j, "in_channels", json_integer(c->in_channels));
    json_object_set_new(j, "norm_elementwise_affine", json_false());
    json_object_set_new(j, "norm_eps", json_real(d->norm_eps));
    json_object_set_new(j, "norm_num_groups", json_integer(32));
    json_object_set_new(j, "norm_type", json_string("ada_norm_zero"));
    json_object_set_new(j, "num_attention_heads",
                        json_integer(c->num_attention_heads));
    json_object_set_new(j, "num_embeds_ada_norm", json_integer(c->num_classes));
    json_object_set_new(j, "num_layers", json_integer(c->num_layers));
    json_object_set_new(j, "out_channels", json_integer(c->out_channels));
    json_object_set_new(j, "patch_size", json_integer(c->patch_size));
    json_object_set_new(j, "sample_size", json_integer(c->sample_size));
    json_object_set_new(j, "upcast_attention", json_false());
    return j;
}

ts_status ts_dit_save(ts_dit *d, const char *dir) {
    ts_ctx *ctx = d->ctx;
    ts_status st = mkdir_p(ctx, dir);
    if (st)
        return st;
    char path[DZ_PATH_LEN + 64], tmp[DZ_PATH_LEN + 80];
    /* f32 copies on the host: the file holds what a reader expects */
    ts_tensor **ts = calloc((size_t)d->n_params + 1, sizeof *ts);
    if (!ts)
        return ts_set_error(ctx, TS_ERR_OOM, "DiT: out of memory");
    ts_device host = {TS_DEVICE_CPU, 0};
    for (int i = 0; i < d->n_params && st == TS_OK; i++) {
        ts_tensor *p = d->params[i];
        ts_tensor *c =
            ts_tensor_dtype(p) == TS_F32 ? ts_retain(p) : ts_cast(p, TS_F32);
        ts_tensor *h = c ? ts_to_device(c, host) : NULL;
        ts_release(c);
        if (!(ts[i] = h))
            st = ts_ctx_status(ctx) ? ts_ctx_status(ctx) : TS_ERR_OOM;
    }
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    if (st == TS_OK) {
        const char *meta[2] = {"format", "pt"};
        st = ts_safetensors_save(ctx, path, d->n_params, d->names, ts, 1, meta);
    }
    for (int i = 0; i < d->n_params; i++)
        ts_release(ts[i]);
    free(ts);
    if (st)
        return st;
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(tmp, sizeof tmp, "%s/.config.json.tmp", dir);
    json_t *j = config_json(d);
    int rc = json_dump_file(j, tmp, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    if (rc || rename(tmp, path)) {
        remove(tmp);
        return ts_set_error(ctx, TS_ERR_IO, "cannot write %s: %s", path,
                            strerror(errno));
    }
    return TS_OK;
}

/* ---- forward ---- */

/* r, with a released: the forward's chain of temporaries */
static ts_tensor *take(ts_tensor *r, ts_tensor *a) {
    ts_release(a);
    return r;
}

/* a matrix as the forward uses it (a new reference): a bf16 compute copy
 * of an f32 master under ts_dit_set_compute_dtype(TS_BF16) */
static ts_tensor *mat(const ts_dit *d, ts_tensor *w) {
    if (d->compute == TS_BF16 && ts_tensor_dtype(w) == TS_F32)
        return ts_cast(w, TS_BF16);
    return ts_retain(w);
}

static ts_tensor *lin(const ts_dit *d, ts_tensor *x, int wi, int bi) {
    if (!x)
        return NULL;
    ts_tensor *w = mat(d, d->slot[wi]);
    ts_tensor *y = w ? ts_linear(x, w, bi >= 0 ? d->slot[bi] : NULL) : NULL;
    ts_release(w);
    return y;
}

/* x (B, N, D) without weights -> ln(x) (1 + scale) + shift, scale and
 * shift (B, 1, D) */
static ts_tensor *modulate(ts_tensor *x, double eps, ts_tensor *shift,
                           ts_tensor *scale) {
    if (!x || !shift || !scale)
        return NULL;
    ts_tensor *n = ts_layernorm(x, NULL, NULL, eps);
    ts_tensor *s1 = ts_add_scalar(scale, 1.0);
    ts_tensor *m = n && s1 ? ts_mul(n, s1) : NULL;
    ts_release(n), ts_release(s1);
    return m ? take(ts_add(m, shift), m) : NULL;
}

/* get_2d_sincos_pos_embed(D, (gh, gw), base_size, interpolation_scale 1)
 * as Diffusers' PatchEmbed computes it (in f64, stored as f32): position
 * n = i gw + j has [sin(w w_k), cos(w w_k), sin(h w_k), cos(h w_k)], D/4
 * each, w = j / (gw / base), h = i / (gh / base), w_k = 10000^(-k/(D/4)) */
static ts_tensor *pos_table(ts_dit *d, int64_t gh, int64_t gw) {
    if (d->pos && d->pos_gh == gh && d->pos_gw == gw)
        return ts_retain(d->pos);
    int64_t D = d->D, q = D / 4;
    double base = (double)(d->cfg.sample_size / d->cfg.patch_size);
    float *e = malloc(sizeof(float) * (size_t)(gh * gw * D));
    if (!e) {
        ts_set_error(d->ctx, TS_ERR_OOM, "DiT: out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < gh; i++)
        for (int64_t j = 0; j < gw; j++) {
            double w = (double)j / ((double)gw / base);
            double h = (double)i / ((double)gh / base);
            float *row = e + (i * gw + j) * D;
            for (int64_t k = 0; k < q; k++) {
                double om = 1.0 / pow(10000.0, (double)k / (double)q);
                row[k] = (float)sin(w * om);
                row[q + k] = (float)cos(w * om);
                row[2 * q + k] = (float)sin(h * om);
                row[3 * q + k] = (float)cos(h * om);
            }
        }
    int64_t shape[2] = {gh * gw, D};
    ts_tensor *t = ts_from_data(d->ctx, TS_F32, 2, shape, e);
    free(e);
    ts_device dev = ts_tensor_device(d->slot[G_PROJ_W]);
    ts_tensor *u = t ? ts_to_device(t, dev) : NULL;
    ts_release(t);
    if (!u)
        return NULL;
    ts_release(d->pos);
    d->pos = ts_retain(u), d->pos_gh = gh, d->pos_gw = gw;
    return u;
}

/* x (B, C, H, W) -> tokens (B, N, D) with the position table added */
static ts_tensor *patch_embed(ts_dit *d, ts_tensor *x) {
    const int64_t *s = ts_tensor_shape(x);
    int64_t B = s[0], C = s[1], p = d->cfg.patch_size;
    int64_t gh = s[2] / p, gw = s[3] / p, D = d->D;
    int64_t s6[6] = {B, C, gh, p, gw, p};
    int perm[6] = {0, 2, 4, 1, 3, 5}; /* (B, gh, gw, C, p, p) */
    ts_tensor *r = ts_reshape(x, 6, s6);
    ts_tensor *t = r ? take(ts_permute(r, perm), r) : NULL;
    t = t ? take(ts_contiguous(t), t) : NULL;
    int64_t s3[3] = {B, gh * gw, C * p * p};
    t = t ? take(ts_reshape(t, 3, s3), t) : NULL;
    int64_t ws[2] = {D, C * p * p};
    ts_tensor *w = mat(d, d->slot[G_PROJ_W]);
    ts_tensor *w2 = w ? take(ts_reshape(w, 2, ws), w) : NULL;
    ts_tensor *h = t && w2 ? ts_linear(t, w2, d->slot[G_PROJ_B]) : NULL;
    ts_release(t), ts_release(w2);
    ts_tensor *pos = h ? pos_table(d, gh, gw) : NULL;
    ts_tensor *out = pos ? ts_add(h, pos) : NULL;
    ts_release(h), ts_release(pos);
    return out;
}

/* CombinedTimestepLabelEmbeddings of block b: the time MLP of the
 * sinusoid tproj (B, 256) plus the class row -> (B, D) */
static ts_tensor *conditioning(ts_dit *d, int b, ts_tensor *tproj,
                               ts_tensor *labels) {
    int o = G_HEAD + b * P_PER_BLOCK;
    ts_tensor *h = lin(d, tproj, o + P_T1_W, o + P_T1_B);
    h = h ? take(ts_silu(h), h) : NULL;
    h = h ? take(lin(d, h, o + P_T2_W, o + P_T2_B), h) : NULL;
    ts_tensor *c = h ? ts_embedding(d->slot[o + P_CLASS], labels) : NULL;
    if (c && ts_tensor_dtype(c) != TS_F32)
        c = take(ts_cast(c, TS_F32), c);
    ts_tensor *e = c ? ts_add(h, c) : NULL;
    ts_release(h), ts_release(c);
    return e;
}

/* emb (B, D) -> n chunks (B, 1, D) of silu(emb) @ W^T + b */
static ts_status chunks(ts_dit *d, ts_tensor *emb, int wi, int bi, int n,
                        ts_tensor **out) {
    for (int k = 0; k < n; k++)
        out[k] = NULL;
    ts_tensor *a = emb ? ts_silu(emb) : NULL;
    ts_tensor *m = a ? take(lin(d, a, wi, bi), a) : NULL;
    int64_t B = emb ? ts_tensor_dim(emb, 0) : 0, sh[3] = {B, 1, n * d->D};
    m = m ? take(ts_reshape(m, 3, sh), m) : NULL;
    if (!m)
        return ts_ctx_status(d->ctx) ? ts_ctx_status(d->ctx) : TS_ERR_STATE;
    int64_t sizes[6];
    for (int k = 0; k < n; k++)
        sizes[k] = d->D;
    ts_status st = ts_split(m, 2, n, sizes, out);
    ts_release(m);
    return st;
}

static void release_n(ts_tensor **t, int n) {
    for (int k = 0; k < n; k++)
        ts_release(t[k]), t[k] = NULL;
}

/* h (B, N, D) += gate (B, 1, D) * y, y released */
static ts_tensor *gated_add(ts_tensor *h, ts_tensor *gate, ts_tensor *y) {
    ts_tensor *g = y && gate ? ts_mul(gate, y) : NULL;
    ts_release(y);
    ts_tensor *r = g ? ts_add(h, g) : NULL;
    ts_release(g);
    return r;
}

/* one BasicTransformerBlock (ada_norm_zero); h is released */
static ts_tensor *block(ts_dit *d, int b, ts_tensor *h, ts_tensor *emb) {
    int o = G_HEAD + b * P_PER_BLOCK;
    ts_tensor *m[6]; /* shift, scale, gate (msa); shift, scale, gate (mlp) */
    if (!h || chunks(d, emb, o + P_ADA_W, o + P_ADA_B, 6, m) != TS_OK) {
        ts_release(h);
        return NULL;
    }
    ts_tensor *n = modulate(h, 1e-6, m[0], m[1]);
    ts_tensor *wq = mat(d, d->slot[o + P_Q_W]),
              *wk = mat(d, d->slot[o + P_K_W]),
              *wv = mat(d, d->slot[o + P_V_W]),
              *wo = mat(d, d->slot[o + P_O_W]);
    ts_tensor *a =
        n && wq && wk && wv && wo
            ? dz_attention(n, NULL, d->heads, wq, d->slot[o + P_Q_B], wk,
                           d->slot[o + P_K_B], wv, d->slot[o + P_V_B], wo,
                           d->slot[o + P_O_B])
            : NULL;
    ts_release(n), ts_release(wq), ts_release(wk), ts_release(wv),
        ts_release(wo);
    ts_tensor *h2 = a ? gated_add(h, m[2], a) : NULL;
    ts_release(h);
    n = h2 ? modulate(h2, d->norm_eps, m[3], m[4]) : NULL;
    ts_tensor *f = lin(d, n, o + P_FF1_W, o + P_FF1_B);
    ts_release(n);
    f = f ? take(ts_gelu(f, TS_GELU_TANH), f) : NULL;
    f = f ? take(lin(d, f, o + P_FF2_W, o + P_FF2_B), f) : NULL;
    ts_tensor *h3 = f ? gated_add(h2, m[5], f) : NULL;
    ts_release(h2);
    release_n(m, 6);
    return h3;
}

static bool check_inputs(ts_dit *d, ts_tensor *x, ts_tensor *t, ts_tensor *y) {
    const char *bad = NULL;
    char msg[160];
    int64_t p = d->cfg.patch_size;
    if (!x || !t || !y)
        bad = "x, timestep and class_labels are required";
    else if (ts_tensor_ndim(x) != 4 ||
             ts_tensor_dim(x, 1) != d->cfg.in_channels ||
             ts_tensor_dim(x, 2) % p || ts_tensor_dim(x, 3) % p ||
             ts_tensor_dim(x, 2) < p || ts_tensor_dim(x, 3) < p) {
        snprintf(msg, sizeof msg,
                 "x must be (B, %lld, H, W) with H and W multiples of the "
                 "patch size %lld",
                 (long long)d->cfg.in_channels, (long long)p);
        bad = msg;
    } else if (ts_tensor_numel(t) != ts_tensor_dim(x, 0) ||
               ts_tensor_numel(y) != ts_tensor_dim(x, 0))
        bad = "timestep and class_labels must hold one value per sample";
    else if (ts_tensor_dtype(y) != TS_I32 && ts_tensor_dtype(y) != TS_I64)
        bad = "class_labels must be i32 or i64";
    if (bad) {
        ts_set_error(d->ctx, TS_ERR_SHAPE, "DiT forward: %s", bad);
        return false;
    }
    return true;
}

ts_tensor *ts_dit_forward(ts_dit *d, ts_tensor *x, ts_tensor *timestep,
                          ts_tensor *class_labels) {
    if (!d || !check_inputs(d, x, timestep, class_labels))
        return NULL;
    const int64_t *s = ts_tensor_shape(x);
    int64_t B = s[0], H = s[2], W = s[3], p = d->cfg.patch_size;
    int64_t gh = H / p, gw = W / p, Co = d->cfg.out_channels;
    int64_t L = d->cfg.num_layers;
    int64_t flat[1] = {B};
    ts_tensor *labels = ts_reshape(class_labels, 1, flat);
    ts_tensor *tproj = dz_timestep_embedding(timestep, TIME_CHANNELS, true, 1.0,
                                             1.0, 10000.0, ts_tensor_device(x));
    ts_tensor *h = labels && tproj ? patch_embed(d, x) : NULL;
    ts_tensor *emb0 = NULL;
    for (int b = 0; b < L && h; b++) {
        ts_tensor *e = conditioning(d, b, tproj, labels);
        if (!e) {
            ts_release(h), h = NULL;
            break;
        }
        h = block(d, b, h, e);
        if (b == 0)
            emb0 = e;
        else
            ts_release(e);
    }
    ts_release(tproj), ts_release(labels);
    int po = G_HEAD + (int)L * P_PER_BLOCK;
    ts_tensor *m[2] = {NULL, NULL}; /* shift, scale */
    if (h && chunks(d, emb0, po + G_PO1_W, po + G_PO1_B, 2, m) != TS_OK)
        ts_release(h), h = NULL;
    ts_release(emb0);
    ts_tensor *n = h ? modulate(h, 1e-6, m[0], m[1]) : NULL;
    ts_release(h), release_n(m, 2);
    ts_tensor *y = take(lin(d, n, po + G_PO2_W, po + G_PO2_B), n);
    /* unpatchify: (B, gh, gw, p, p, Co) -> nhwpqc->nchpwq -> (B, Co, H, W) */
    int64_t s6[6] = {B, gh, gw, p, p, Co};
    int perm[6] = {0, 5, 1, 3, 2, 4};
    y = y ? take(ts_reshape(y, 6, s6), y) : NULL;
    y = y ? take(ts_permute(y, perm), y) : NULL;
    y = y ? take(ts_contiguous(y), y) : NULL;
    int64_t s4[4] = {B, Co, H, W};
    return y ? take(ts_reshape(y, 4, s4), y) : NULL;
}
