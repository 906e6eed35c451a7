/* tessera_diffusion.h — diffusion pipelines in Hugging Face Diffusers'
 * folder layout, loaded as downloaded: model_index.json, scheduler/
 * scheduler_config.json and component folders (config.json +
 * diffusion_pytorch_model.safetensors or model.safetensors). Components:
 * UNet2DConditionModel, AutoencoderKL, CLIPTextModel (its tokenizer is in
 * tessera_tokenizer.h), DiTTransformer2DModel; schedulers DDIM, Euler
 * discrete and DPM-Solver++ 2M; the pipeline that runs them, over one or
 * several devices. Images are NCHW float tensors. */
#ifndef TESSERA_DIFFUSION_H
#define TESSERA_DIFFUSION_H

#include "tessera.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- components --------------------------------------------------------- */

/* How a component is loaded: the dtype its weights are kept in (TS_F32,
 * the default, or TS_BF16; activations stay f32) and the device it runs
 * on (the context's device when .set is false). split_block > 0 (UNet
 * only): blocks from that index on run on device2 (the blocks in order:
 * conv_in and the time embedding, each of down_blocks, mid_block, each of
 * up_blocks, the output norm and conv; ts_unet_num_blocks counts them). */
typedef struct {
    ts_dtype dtype;
    bool set;
    ts_device device;
    int split_block;
    ts_device device2;
} ts_component_opts;

/* UNet2DConditionModel (Stable Diffusion 1.x/2.x blocks). dir holds
 * config.json and the weights. */
typedef struct ts_unet ts_unet;
ts_status ts_unet_load(ts_ctx *ctx, const char *dir,
                       const ts_component_opts *opts, ts_unet **out);
void ts_unet_free(ts_unet *u);
/* sample (B, in_channels, H, W) f32, timestep (B) f32 (a scheduler's
 * timestep, may be fractional), encoder_hidden_states (B, S,
 * cross_attention_dim) f32 -> the model output (B, out_channels, H, W),
 * a new reference on the device of the UNet's last block. */
ts_tensor *ts_unet_forward(ts_unet *u, ts_tensor *sample, ts_tensor *timestep,
                           ts_tensor *encoder_hidden_states);
int ts_unet_num_blocks(const ts_unet *u);
int64_t ts_unet_in_channels(const ts_unet *u);
int64_t ts_unet_sample_size(const ts_unet *u);
int64_t ts_unet_cross_attention_dim(const ts_unet *u);
size_t ts_unet_param_bytes(const ts_unet *u);

/* AutoencoderKL. */
typedef struct ts_vae ts_vae;
ts_status ts_vae_load(ts_ctx *ctx, const char *dir,
                      const ts_component_opts *opts, ts_vae **out);
void ts_vae_free(ts_vae *v);
/* vae.decode: latents (B, latent_channels, h, w) f32, already divided by
 * the scaling factor -> image (B, out_channels, h f, w f) in about [-1, 1],
 * f = 2^(len(block_out_channels) - 1). */
ts_tensor *ts_vae_decode(ts_vae *v, ts_tensor *latents);
/* vae.encode: image (B, in_channels, H, W) in [-1, 1] -> the latent
 * distribution's mean and log-variance (B, latent_channels, H / f, W / f)
 * (logvar clamped to [-30, 20] as Diffusers does). */
ts_status ts_vae_encode(ts_vae *v, ts_tensor *image, ts_tensor **mean,
                        ts_tensor **logvar);
double ts_vae_scaling_factor(const ts_vae *v); /* config's, default 0.18215 */
int64_t ts_vae_latent_channels(const ts_vae *v);
int ts_vae_downscale(const ts_vae *v); /* f */
size_t ts_vae_param_bytes(const ts_vae *v);

/* CLIPTextModel. */
typedef struct ts_clip_text ts_clip_text;
ts_status ts_clip_text_load(ts_ctx *ctx, const char *dir,
                            const ts_component_opts *opts,
                            ts_clip_text **out);
void ts_clip_text_free(ts_clip_text *c);
/* ids (B, T) i32/i64, T <= max_position_embeddings -> last_hidden_state
 * (B, T, hidden_size) f32 (after the final layer norm, causal mask as
 * CLIP's). */
ts_tensor *ts_clip_text_forward(ts_clip_text *c, ts_tensor *ids);
int64_t ts_clip_text_hidden_size(const ts_clip_text *c);
int64_t ts_clip_text_max_positions(const ts_clip_text *c);
size_t ts_clip_text_param_bytes(const ts_clip_text *c);

/* DiTTransformer2DModel (class-conditional, adaLN-Zero, patchify). */
typedef struct ts_dit ts_dit;
ts_status ts_dit_load(ts_ctx *ctx, const char *dir,
                      const ts_component_opts *opts, ts_dit **out);
void ts_dit_free(ts_dit *d);
/* x (B, in_channels, H, W) f32, timestep (B) f32, class_labels (B)
 * i32/i64 in [0, num_embeds_ada_norm] (num_embeds_ada_norm is the null
 * class of classifier-free guidance) -> (B, out_channels, H, W). */
ts_tensor *ts_dit_forward(ts_dit *d, ts_tensor *x, ts_tensor *timestep,
                          ts_tensor *class_labels);
int64_t ts_dit_in_channels(const ts_dit *d);
int64_t ts_dit_out_channels(const ts_dit *d);
int64_t ts_dit_sample_size(const ts_dit *d);
int64_t ts_dit_num_classes(const ts_dit *d);
size_t ts_dit_param_bytes(const ts_dit *d);
/* A new DiT for training, initialised as DiT's reference code does
 * (initialize_weights): xavier-uniform linears (the patch embedding's
 * kernel seen as a (D, C p p) matrix) with zero biases, normal(0.02) time
 * MLPs and class tables, zero adaLN modulations (norm1.linear,
 * proj_out_1) and a zero final projection (proj_out_2). out_channels 0:
 * in_channels, or twice that with learn_sigma. Parameters are f32 leaves
 * that require gradients. */
typedef struct {
    int64_t sample_size, in_channels, out_channels, patch_size, num_layers,
        num_attention_heads, attention_head_dim,
        num_classes; /* num_embeds_ada_norm */
    bool learn_sigma;
} ts_dit_config;
ts_status ts_dit_new(ts_ctx *ctx, const ts_dit_config *cfg, uint64_t seed,
                     ts_dit **out);
void ts_dit_get_config(const ts_dit *d, ts_dit_config *out);
/* The parameters (borrowed) and their Diffusers names, in the order the
 * file holds them; returns their count. */
int ts_dit_parameters(ts_dit *d, ts_tensor ***params, const char ***names);
/* dir/config.json (Diffusers' keys, _class_name DiTTransformer2DModel) and
 * dir/diffusion_pytorch_model.safetensors (f32), each written atomically;
 * dir is created when missing. */
ts_status ts_dit_save(ts_dit *d, const char *dir);
/* Matrices cast to dt (TS_BF16 or TS_F32) inside the forward: bf16
 * compute copies of f32 masters for mixed-precision training. */
ts_status ts_dit_set_compute_dtype(ts_dit *d, ts_dtype dt);

/* ---- schedulers --------------------------------------------------------- */

/* ---- pipeline ----------------------------------------------------------- */

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_DIFFUSION_H */
