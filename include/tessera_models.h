/* tessera_models.h — models built from Hugging Face folders (config.json +
 * safetensors, loaded as they are). */
#ifndef TESSERA_MODELS_H
#define TESSERA_MODELS_H

#include "tessera_io.h"
#include "tessera_nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A decoder's (qwen3, qwen2, llama) shape from its config.json. */
ts_qwen3_config ts_decoder_config(const ts_model_config *mc);

/* Builds the Qwen3 model that dir's config.json describes and fills its
 * parameters from dir's safetensors (one file or shards), converting the
 * stored dtype to the model's f32. dir must be a model folder
 * (ts_model_dir_check). Every parameter must be present with its exact
 * shape (lm_head.weight may be absent when embeddings are tied), checked
 * against the checkpoint's header before anything is allocated; errors
 * name the tensor, the file and both shapes. The weights are scanned for
 * NaN/Inf (see ts_load_options); tensors the model does not use are
 * reported as a warning. */
ts_status ts_qwen3_load(ts_ctx *ctx, const char *dir, ts_qwen3_model **out);
/* The same for any decoder the ts_qwen3 model covers: qwen3, qwen2 (q/k/v
 * biases, no qk-norm) and llama (no qk-norm, llama3 rope scaling). */
ts_status ts_decoder_load(ts_ctx *ctx, const char *dir, ts_qwen3_model **out);
/* ... keeping the embedding and projection matrices in weight_dtype (f32,
 * or bf16: half the memory, read and widened to f32 as they are used). */
ts_status ts_decoder_load_as(ts_ctx *ctx, const char *dir,
                             ts_dtype weight_dtype, ts_qwen3_model **out);

/* ... with options: weight dtype and a device_map string ("cpu", "auto",
 * "embed,0-13:cpu:0;14-27,head:cpu:1", see ts_device_map_parse). */
typedef struct {
    ts_dtype weight_dtype;  /* TS_F32 (0, the default) or TS_BF16 */
    const char *device_map; /* NULL: everything on the current device */
    /* Loading scans the f32/bf16/f16 weights the model uses once and
     * refuses a checkpoint holding NaN or Inf (the first one named: tensor
     * and index); true skips the scan (`--no-check-weights`). */
    bool no_check_weights;
    /* Where warnings go, e.g. "Some weights of the checkpoint at DIR were
     * not used: ..." (tensors the model does not have, layers beyond
     * config.json's count): warn(warn_user, message); NULL prints
     * "tessera: warning: message" to stderr. */
    void (*warn)(void *warn_user, const char *message);
    void *warn_user;
} ts_load_options;
ts_status ts_decoder_load_opts(ts_ctx *ctx, const char *dir,
                               const ts_load_options *opt,
                               ts_qwen3_model **out);

/* GPT-2: learned positions, LayerNorm, fused q/k/v, Conv1D weights (in,
 * out), tanh GELU, tied LM head. */
typedef struct ts_gpt2_model ts_gpt2_model;
/* Loaded from a Hugging Face folder (inference: the parameters do not
 * require grad; set it on ts_gpt2_params to fine-tune). */
ts_status ts_gpt2_load(ts_ctx *ctx, const char *dir, ts_gpt2_model **out);
/* ... with options (weight_dtype must be f32 and device_map NULL: the
 * model is made on the current device; the checks and warnings as for
 * the decoders) */
ts_status ts_gpt2_load_opts(ts_ctx *ctx, const char *dir,
                            const ts_load_options *opt, ts_gpt2_model **out);
/* A new model for training: cfg a gpt2 config (ts_config_load's, or filled
 * by hand: arch TS_ARCH_GPT2, vocab, hidden, layers, heads, head_dim =
 * hidden / heads, intermediate, max_positions, norm_eps); the LM head is
 * always tied. Parameters are f32 with requires_grad, initialized as
 * Hugging Face's GPT2PreTrainedModel does: Normal(0, 0.02), the residual
 * projections (attn.c_proj, mlp.c_proj weights) Normal(0, 0.02 /
 * sqrt(2 layers)), biases zeros, LayerNorm weights ones; each from a seed
 * derived from seed and its index. */
ts_status ts_gpt2_new(ts_ctx *ctx, const ts_model_config *cfg, uint64_t seed,
                      ts_gpt2_model **out);
void ts_gpt2_free(ts_gpt2_model *m);
const ts_model_config *ts_gpt2_get_config(const ts_gpt2_model *m);
/* Parameters as (name, tensor) pairs in GPT2LMHeadModel's state_dict order
 * and names: transformer.wte.weight, transformer.wpe.weight; per layer i
 * transformer.h.{i}.ln_1.{weight,bias}, .attn.c_attn.{weight,bias},
 * .attn.c_proj.{weight,bias}, .ln_2.{weight,bias}, .mlp.c_fc.{weight,bias},
 * .mlp.c_proj.{weight,bias}; transformer.ln_f.{weight,bias} (lm_head.weight
 * is wte, not listed). Borrowed: they live as long as the model. */
int ts_gpt2_num_params(const ts_gpt2_model *m);
const char *ts_gpt2_param_name(const ts_gpt2_model *m, int i);
ts_tensor *ts_gpt2_param(const ts_gpt2_model *m, int i);
ts_tensor *const *ts_gpt2_params(const ts_gpt2_model *m);
/* The parameter called name, or NULL (with no error recorded). */
ts_tensor *ts_gpt2_find_param(const ts_gpt2_model *m, const char *name);
/* ids (B, T) i32/i64 at positions pos0.. -> logits (B, T, V) */
ts_tensor *ts_gpt2_forward(ts_gpt2_model *m, ts_tensor *ids, int64_t pos0);
/* Activation checkpointing (ts_checkpoint per block): with a graph, each
 * block keeps its input only and is recomputed in backward; the same
 * values. Off by default. */
ts_status ts_gpt2_set_checkpointing(ts_gpt2_model *m, bool on);
/* Mixed precision: with TS_BF16 the blocks' and the head's matrices are
 * cast to bf16 where they are used (the gradients reach the f32 masters);
 * TS_F32 (the default) turns it off. */
ts_status ts_gpt2_set_compute_dtype(ts_gpt2_model *m, ts_dtype dt);
/* Mean cross-entropy of forward(ids, 0) against targets (B, T) i32/i64,
 * the next tokens already aligned with ids; targets of -100 are ignored.
 * The scalar loss; logits (may be NULL) receives the logits (B, T, V). */
ts_tensor *ts_gpt2_loss(ts_gpt2_model *m, ts_tensor *ids, ts_tensor *targets,
                        ts_tensor **logits);
/* KV cache (batch 1): forward_cached runs ids (1, T) after the cached
 * positions and returns logits (1, T, V), or (1, 1, V) with last_only */
typedef struct ts_gpt2_cache ts_gpt2_cache;
ts_status ts_gpt2_cache_new(ts_gpt2_model *m, int64_t max_T,
                            ts_gpt2_cache **out);
void ts_gpt2_cache_free(ts_gpt2_cache *kc);
int64_t ts_gpt2_cache_len(const ts_gpt2_cache *kc);
void ts_gpt2_cache_truncate(ts_gpt2_cache *kc, int64_t len);
ts_tensor *ts_gpt2_forward_cached(ts_gpt2_model *m, ts_gpt2_cache *kc,
                                  ts_tensor *ids, bool last_only);
/* greedy decoding with a KV cache: n_new tokens after the prompt */
ts_status ts_gpt2_generate_greedy(ts_gpt2_model *m, const int64_t *prompt,
                                  int64_t n_prompt, int64_t n_new,
                                  int64_t *out);

/* ---- any causal LM --------------------------------------------------------
 * One handle over the architectures above, chosen by config.json: what
 * generation and serving drive without knowing the architecture. gpt2
 * takes a one-device map and f32 weights only. */
typedef struct ts_lm ts_lm;
/* dir must be a model folder (ts_model_dir_check: config.json and the
 * safetensors); opt may be NULL (f32, one device, weights checked,
 * warnings to stderr). */
ts_status ts_lm_load(ts_ctx *ctx, const char *dir, const ts_load_options *opt,
                     ts_lm **out);
void ts_lm_free(ts_lm *lm);
const ts_model_config *ts_lm_config(const ts_lm *lm);
/* the decoder (qwen3/qwen2/llama) inside, or NULL for gpt2 */
ts_qwen3_model *ts_lm_decoder(ts_lm *lm);
/* KV cache for one sequence of up to max_T positions */
typedef struct ts_lm_cache ts_lm_cache;
ts_status ts_lm_cache_new(ts_lm *lm, int64_t max_T, ts_lm_cache **out);
void ts_lm_cache_free(ts_lm_cache *kc);
int64_t ts_lm_cache_len(const ts_lm_cache *kc);
/* keeps the first len cached positions (to reuse a common prefix) */
void ts_lm_cache_truncate(ts_lm_cache *kc, int64_t len);
/* ids (1, T) after the cached positions -> logits (1, T, V); (1, 1, V) of
 * the last position with last_only */
ts_tensor *ts_lm_forward_cached(ts_lm *lm, ts_lm_cache *kc, ts_tensor *ids,
                                bool last_only);
/* ids (B, T) from position 0 -> logits (B, T, V) */
ts_tensor *ts_lm_forward(ts_lm *lm, ts_tensor *ids);

#ifdef __cplusplus
}
#endif
#endif
