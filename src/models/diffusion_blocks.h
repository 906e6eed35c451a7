/* diffusion_blocks.h — what the UNet (unet.c) and the VAE (vae.c) share:
 * a loader that fetches a component's parameters by their Diffusers names
 * and keeps the references (the first error wins, later fetches are
 * skipped), ResnetBlock2D, Downsample2D and Upsample2D. Also the
 * block-by-block forwards the tests compare with the reference's
 * intermediate outputs. Not public. */
#ifndef TS_DIFFUSION_BLOCKS_H
#define TS_DIFFUSION_BLOCKS_H

#include "diffusion_internal.h"

/* The parameters a component owns, released together. */
typedef struct {
    ts_tensor **t;
    int n, cap;
} dz_params;
void dz_params_free(dz_params *p);

typedef struct {
    dz_comp *c;
    dz_params *owned;
    bool failed; /* an error is recorded; later fetches return NULL */
} dz_loader;

/* The tensor named (printf-style) with exactly shape (nd dims), kept in
 * L->owned; NULL (and L->failed) when missing or mis-shaped. */
ts_tensor *dz_get(dz_loader *L, int nd, const int64_t *shape, const char *fmt,
                  ...) __attribute__((format(printf, 4, 5)));
/* A vector (n), a matrix (o, i), a kernel (o, i, k, k) */
ts_tensor *dz_vec(dz_loader *L, int64_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
ts_tensor *dz_mat(dz_loader *L, int64_t o, int64_t i, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
ts_tensor *dz_kernel(dz_loader *L, int64_t o, int64_t i, int64_t k,
                     const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Records an error unless one is (first error wins); returns false. */
bool dz_fail(dz_loader *L, ts_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ResnetBlock2D with time_embedding_norm "default" and silu:
 *   h = conv1(silu(norm1(x))) [+ time_emb_proj(silu(temb))[:, :, None, None]]
 *   h = conv2(silu(norm2(h)))
 *   out = (shortcut(x) + h) / output_scale_factor
 * shortcut: conv_shortcut (1x1) when in != out channels. */
typedef struct {
    ts_tensor *norm1_w, *norm1_b, *conv1_w, *conv1_b, *temb_w, *temb_b;
    ts_tensor *norm2_w, *norm2_b, *conv2_w, *conv2_b, *short_w, *short_b;
    int64_t groups;
    double eps, out_scale;
} dz_resnet;
/* prefix "down_blocks.0.resnets.1"; temb 0: no time embedding (VAE) */
void dz_resnet_load(dz_loader *L, dz_resnet *r, const char *prefix, int64_t cin,
                    int64_t cout, int64_t temb, int64_t groups, double eps,
                    double out_scale);
/* x (B, cin, H, W), temb_act (B, temb) = silu(temb) or NULL -> (B, cout,
 * H, W) */
ts_tensor *dz_resnet_forward(const dz_resnet *r, ts_tensor *x,
                             ts_tensor *temb_act);
/* Checks that groups divides the channels of the GroupNorm named. */
bool dz_check_groups(dz_loader *L, int64_t groups, int64_t channels,
                     const char *key, const char *norm_name);

/* Downsample2D(use_conv): x (B, C, H, W) -> 3x3 conv, stride 2, padding
 * pad; pad 0 pads the bottom and right by one first (Diffusers' VAE). */
ts_tensor *dz_downsample(ts_tensor *x, ts_tensor *w, ts_tensor *b, int pad);
/* Upsample2D(use_conv): nearest x2, then a 3x3 conv with padding 1. */
ts_tensor *dz_upsample(ts_tensor *x, ts_tensor *w, ts_tensor *b);
/* silu(group_norm(x)) */
ts_tensor *dz_norm_silu(ts_tensor *x, int64_t groups, ts_tensor *w,
                        ts_tensor *b, double eps);

/* The UNet's forward with each block's output (ts_unet_num_blocks of them,
 * new references, NULL when not wanted) — the test's per-block check. */
ts_tensor *dz_unet_forward_blocks(ts_unet *u, ts_tensor *sample,
                                  ts_tensor *timestep, ts_tensor *ehs,
                                  ts_tensor **block_out);
/* The VAE's halves with their stages' outputs: the decoder's conv_in (after
 * post_quant_conv), mid_block, each up block, the output (2 + n + 1
 * entries); the encoder's conv_in, each down block, mid_block, and the
 * moments after quant_conv (1 + n + 2 entries). */
int dz_vae_stages(const ts_vae *v);
ts_tensor *dz_vae_decode_stages(ts_vae *v, ts_tensor *z, ts_tensor **out);
ts_tensor *dz_vae_encode_stages(ts_vae *v, ts_tensor *x, ts_tensor **out);

#endif
