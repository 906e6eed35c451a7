/* diffusion_internal.h — what the diffusion components (unet.c, vae.c,
 * clip_text.c, dit.c) share: a component folder opened (config.json read,
 * the weights file mapped), config values and parameters fetched by their
 * Diffusers names with the file, key or tensor at fault named in every
 * error, and the layers more than one component uses. Not public. */
#ifndef TS_DIFFUSION_INTERNAL_H
#define TS_DIFFUSION_INTERNAL_H

#include "tessera_diffusion.h"
#include "tessera_io.h"

#include <jansson.h>

#define DZ_PATH_LEN  1024
#define DZ_MAX_ARRAY 16 /* entries of a config list (block types, widths) */

typedef struct {
    ts_ctx *ctx;
    char dir[DZ_PATH_LEN];
    char config_path[DZ_PATH_LEN];
    char weights_path[DZ_PATH_LEN];
    json_t *config;
    ts_safetensors *st;
    ts_dtype dtype;   /* matrices and convolution kernels */
    ts_device device; /* where parameters go */
    size_t bytes;     /* parameter bytes fetched so far */
} dz_comp;

/* Opens dir/config.json and dir/diffusion_pytorch_model.safetensors (or
 * dir/model.safetensors). class_name: the _class_name (or architectures[0])
 * the config must name, or NULL. opts may be NULL. */
ts_status dz_open(ts_ctx *ctx, const char *dir, const char *class_name,
                  const ts_component_opts *opts, dz_comp *c);
void dz_close(dz_comp *c); /* the fetched parameters stay valid */

/* Config values: the default when the key is absent or null; a value of
 * the wrong type is an error naming the file and key (returns false). */
bool dz_int(dz_comp *c, const char *key, int64_t def, int64_t *out);
bool dz_num(dz_comp *c, const char *key, double def, double *out);
bool dz_bool(dz_comp *c, const char *key, bool def, bool *out);
/* A string value copied into out (cap bytes); def may be NULL (then the
 * key is required). */
bool dz_str(dz_comp *c, const char *key, const char *def, char *out,
            size_t cap);
/* An integer list (or a single integer repeated n_expect times when
 * n_expect > 0, as Diffusers accepts for attention_head_dim); returns the
 * count, or -1 with the error recorded. */
int dz_int_list(dz_comp *c, const char *key, int n_expect, int64_t *out);
/* A string list, each entry into out[k] (64 bytes); the count or -1. */
int dz_str_list(dz_comp *c, const char *key, char (*out)[64]);

/* The parameter named (printf-style) with exactly this shape, on the
 * component's device: matrices and kernels (ndim >= 2) in its dtype,
 * vectors in f32. Missing, mis-shaped or non-finite: NULL, with the error
 * naming the tensor, the file and both shapes. */
ts_tensor *dz_param(dz_comp *c, int ndim, const int64_t *shape, const char *fmt,
                    ...) __attribute__((format(printf, 4, 5)));
/* As dz_param, but an absent tensor gives NULL without an error. */
ts_tensor *dz_param_opt(dz_comp *c, int ndim, const int64_t *shape,
                        const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool dz_has(dz_comp *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Shared layers, built from the public ops (eager and compiled alike). */
/* x (B, C, H, W) with a conv's weight (O, C, k, k) and bias, stride s,
 * symmetric padding p */
ts_tensor *dz_conv(ts_tensor *x, ts_tensor *w, ts_tensor *b, int stride,
                   int pad);
/* Diffusers' get_timestep_embedding: t (B) f32 -> (B, dim) f32 computed
 * on the host (no gradient), on the device dev:
 * exponent = -ln(max_period) * k / (half - shift), emb = t * exp(exponent),
 * [sin, cos] (flip_sin_to_cos: [cos, sin]) */
ts_tensor *dz_timestep_embedding(ts_tensor *t, int64_t dim,
                                 bool flip_sin_to_cos, double shift,
                                 double scale, double max_period,
                                 ts_device dev);
/* Multi-head attention of Diffusers' Attention with the default
 * processor: x (B, T, C) queries, ctx_ (B, S, Cc) keys/values (NULL: x),
 * heads of dim C / heads, to_q/to_k/to_v without or with biases,
 * to_out.0 with a bias -> (B, T, C) */
ts_tensor *dz_attention(ts_tensor *x, ts_tensor *ctx_, int64_t heads,
                        ts_tensor *wq, ts_tensor *bq, ts_tensor *wk,
                        ts_tensor *bk, ts_tensor *wv, ts_tensor *bv,
                        ts_tensor *wo, ts_tensor *bo);

#endif
