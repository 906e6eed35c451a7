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
/* config's shift_factor, 0 when null. AutoencoderKL itself does not apply
 * it; a pipeline does (SD3, Flux): latents / scaling + shift to decode,
 * (mean - shift) * scaling after encoding. */
double ts_vae_shift_factor(const ts_vae *v);
int64_t ts_vae_latent_channels(const ts_vae *v);
int ts_vae_downscale(const ts_vae *v); /* f */
size_t ts_vae_param_bytes(const ts_vae *v);

/* CLIPTextModel. */
typedef struct ts_clip_text ts_clip_text;
ts_status ts_clip_text_load(ts_ctx *ctx, const char *dir,
                            const ts_component_opts *opts, ts_clip_text **out);
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
    /* the class tables' init std (0: DiT's 0.02); a short training run
     * learns the class far sooner from a table of std 1 (nn.Embedding's
     * default), whose rows stand out from the time embedding at once */
    double class_embed_std;
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

/* A noise scheduler read from a Diffusers scheduler_config.json, with
 * Diffusers' semantics for DDIMScheduler (eta 0), EulerDiscreteScheduler
 * (s_churn 0: deterministic), DPMSolverMultistepScheduler (dpmsolver++,
 * order 2, midpoint or heun) and DDPMScheduler (training: add_noise_at;
 * sampling: the ancestral step). A PNDMScheduler config (what SD 1.x ships)
 * loads and runs as DDIM unless another kind is set; keys the config lacks
 * take the defaults of the kind that runs, as Diffusers' from_config does.
 * Timestep i counts from 0 (the noisiest) to ts_scheduler_num_steps - 1.
 * Samples are f32 tensors of any shape on any device; steps are built from
 * public elementwise ops, so they run eagerly or recorded (compiled). */
typedef enum {
    TS_SCHED_DDIM,
    TS_SCHED_EULER,
    TS_SCHED_DPMPP_2M,
    TS_SCHED_DDPM
} ts_scheduler_kind;
typedef struct ts_scheduler ts_scheduler;

/* Reads config_json_path (a scheduler_config.json). An unknown
 * _class_name, beta_schedule, prediction_type, timestep_spacing, ... is an
 * error naming the key, its value and the file; options Tessera does not build
 * (use_karras_sigmas true, thresholding true, rescale_betas_zero_snr true,
 * ...) are TS_ERR_UNSUPPORTED naming the key. */
ts_status ts_scheduler_load(ts_ctx *ctx, const char *config_json_path,
                            ts_scheduler **out);
void ts_scheduler_free(ts_scheduler *s);
/* name "ddim" | "euler" | "dpm++2m" | "ddpm" (an unknown one is an error
 * listing these). Clears the timesteps: call set_timesteps again. */
ts_status ts_scheduler_set_kind(ts_scheduler *s, const char *name);
ts_scheduler_kind ts_scheduler_get_kind(const ts_scheduler *s);
/* The inference schedule of num_inference_steps steps (1 ..
 * num_train_timesteps); resets DPM++'s model-output history. */
ts_status ts_scheduler_set_timesteps(ts_scheduler *s, int num_inference_steps);
int ts_scheduler_num_steps(const ts_scheduler *s);
/* The i-th timestep fed to the model: an integer for DDIM/DPM/DDPM, a
 * float32 value for Euler (e.g. 999, 957.375, ...). */
double ts_scheduler_timestep(const ts_scheduler *s, int i);
/* The std of the initial noise: 1, or Euler's max sigma (sqrt(max
 * sigma^2 + 1) with "leading" spacing). */
double ts_scheduler_init_noise_sigma(const ts_scheduler *s);
/* sample (...) -> the model's input at step i: Euler divides by
 * sqrt(sigma_i^2 + 1); the others return a new reference to sample. */
ts_tensor *ts_scheduler_scale_model_input(ts_scheduler *s, ts_tensor *sample,
                                          int i);
/* model_output and sample (same shape, f32) at step i -> prev_sample (new
 * reference). DPM++ 2M keeps the converted model outputs of earlier steps;
 * call the steps in order. NULL on error (the message names the step). */
ts_tensor *ts_scheduler_step(ts_scheduler *s, ts_tensor *model_output, int i,
                             ts_tensor *sample);
/* img2img (StableDiffusionImg2ImgPipeline.get_timesteps): strength in
 * [0, 1] keeps the last min(steps * strength, steps) steps; *t_start is the
 * first step to run (the loop runs i = t_start .. num_steps - 1). */
ts_status ts_scheduler_set_strength(ts_scheduler *s, double strength,
                                    int *t_start);
/* original and noise (same shape) -> the noisy sample at the i-th timestep
 * of the schedule: sqrt(ac) x + sqrt(1 - ac) n (DDIM/DDPM), x + sigma n
 * (Euler), alpha_t x + sigma_t n from sigma (DPM). */
ts_tensor *ts_scheduler_add_noise(ts_scheduler *s, ts_tensor *original,
                                  ts_tensor *noise, int i);
/* Training: original and noise (B, ...), train_timesteps B integers in
 * [0, num_train_timesteps) -> sqrt(ac[t_b]) x_b + sqrt(1 - ac[t_b]) n_b. */
ts_tensor *ts_scheduler_add_noise_at(ts_scheduler *s, ts_tensor *original,
                                     ts_tensor *noise,
                                     const int64_t *train_timesteps);
/* DDPM's step i, when its timestep is above 0, adds sqrt(variance) times
 * ts_randn(the sample's ctx, TS_F32, shape, 1.0, seed + i), moved to the
 * sample's device; the seed is 0 until set. */
void ts_scheduler_set_seed(ts_scheduler *s, uint64_t seed);
/* The num_train_timesteps cumulative alpha products (as Diffusers' float32
 * values), owned by s; their count in *n (n may be NULL). */
const double *ts_scheduler_alphas_cumprod(const ts_scheduler *s, int *n);
/* The config's num_train_timesteps and prediction_type ("epsilon",
 * "v_prediction", "sample"). */
int ts_scheduler_num_train_timesteps(const ts_scheduler *s);
const char *ts_scheduler_prediction_type(const ts_scheduler *s);

/* ---- pipeline ----------------------------------------------------------- */

/* A pipeline folder as Diffusers saves it: model_index.json names the
 * pipeline class and its components. Text-to-image (and image-to-image)
 * pipelines have text_encoder, tokenizer, unet, vae and scheduler;
 * class-conditional ones (DiTPipeline) transformer, scheduler, an optional
 * vae (without one the model works on pixels) and id2label. */
typedef struct ts_pipeline ts_pipeline;

/* Where the components run.
 *   devices: the devices "balanced" spreads over, "cpu:0,cpu:1" (NULL:
 *     every host device the map names, else the context's device);
 *   device_map: NULL or "" — every component on the context's device;
 *     "balanced" — components, largest first, each onto the device with
 *     the fewest bytes placed so far (Diffusers' pipeline-level
 *     device_map="balanced");
 *     "unet=cpu:1,vae=cpu:0,text_encoder=cpu:0" — per component (unnamed
 *     ones on the first device); "unet=cpu:0+cpu:1" splits the UNet's
 *     blocks over two devices at the middle block,
 *     "unet=cpu:0+cpu:1@4" at block 4.
 *   cfg_parallel: the conditional and unconditional branches of
 *     classifier-free guidance each on their own device (the denoiser
 *     replicated onto the second of `devices`);
 *   batch_devices > 1: the images of a batch split over that many of
 *     `devices`, a replica of the denoiser on each. */
typedef struct {
    ts_dtype dtype; /* weights: TS_F32 (default) or TS_BF16 */
    const char *devices;
    const char *device_map;
    bool cfg_parallel;
    int batch_devices;
} ts_pipeline_opts;

ts_status ts_pipeline_load(ts_ctx *ctx, const char *dir,
                           const ts_pipeline_opts *opts, ts_pipeline **out);
void ts_pipeline_free(ts_pipeline *p);
/* true: class-conditional (DiT); false: text-conditional */
bool ts_pipeline_is_class_conditional(const ts_pipeline *p);
/* The class id of a label: a number, or a name of id2label (each label's
 * comma-separated synonyms; case-sensitive first, then not); -1 (with the
 * error naming the label) when none matches. */
int ts_pipeline_class_id(ts_pipeline *p, const char *label);
int ts_pipeline_num_classes(const ts_pipeline *p);
/* Default output size (sample_size times the VAE's factor). */
void ts_pipeline_default_size(const ts_pipeline *p, int *width, int *height);
/* Where each component landed, one line each ("unet: cpu:0 (12.3 MB)"),
 * into buf. */
void ts_pipeline_describe(const ts_pipeline *p, char *buf, size_t cap);

/* Called after each denoising step (i from 1 to n). */
typedef void (*ts_diffusion_progress_fn)(void *arg, int i, int n);

typedef struct {
    const char *prompt;          /* text-conditional */
    const char *negative_prompt; /* NULL: "" */
    int class_id;                /* class-conditional */
    int num_images;              /* 0: 1 */
    int steps;                   /* 0: 25 */
    double guidance;             /* <= 1: no classifier-free guidance */
    uint64_t seed;
    int width, height;     /* 0: the default size */
    const char *scheduler; /* NULL: the folder's; "ddim", "euler", "dpm++2m" */
    ts_tensor *init_image; /* image-to-image: (C, H, W) or (B, C, H, W)
                              in [0, 1], or NULL */
    double strength;       /* image-to-image: 0 < strength <= 1 */
    ts_tensor *latents;    /* initial noise (B, C, h, w), or NULL */
    bool latents_only;     /* skip the VAE: *images gets the latents */
    ts_diffusion_progress_fn progress;
    void *progress_arg;
} ts_diffusion_request;

/* Runs the pipeline: *images (B, C, H, W) f32 in [0, 1] on the host
 * device (or the final latents with latents_only). */
ts_status ts_pipeline_generate(ts_pipeline *p, const ts_diffusion_request *r,
                               ts_tensor **images);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_DIFFUSION_H */
