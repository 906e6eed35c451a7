/* tessera_nn.h — the nn layer of Tessera: layers built from the public ops
 * (linear, SwiGLU MLP), the Qwen3 decoder with Hugging Face parameter names,
 * the AdamW optimizer, gradient clipping and the cosine LR schedule.
 *
 * Everything here is written with the op functions of tessera.h only, so the
 * same calls run eagerly now and are recorded unchanged in compiled mode.
 * Conventions are tessera.h's: ops return a new reference or NULL with the
 * error in ts_errmsg(ctx); functions that can fail otherwise return a
 * ts_status. Dimension letters: B batch, T positions, C hidden channels,
 * H query heads, KV key/value heads, D head dim, F MLP intermediate size,
 * V vocabulary.
 */
#ifndef TESSERA_NN_H
#define TESSERA_NN_H

#include "tessera.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- layers ------------------------------------------------------------- */

/* Hugging Face / torch.nn.Linear layout: x (..., in), w (out, in), b (out)
 * or NULL -> (..., out) = x @ w^T + b. w^T is a view (no copy). */
ts_tensor *ts_linear(ts_tensor *x, ts_tensor *w, ts_tensor *b);

/* down(silu(gate(x)) * up(x)), the Llama/Qwen MLP without biases:
 * x (..., C), gate_w (F, C), up_w (F, C), down_w (C, F) -> (..., C). */
ts_tensor *ts_swiglu_mlp(ts_tensor *x, ts_tensor *gate_w, ts_tensor *up_w,
                         ts_tensor *down_w);

/* ---- Qwen3 decoder ------------------------------------------------------ */

/* The fields of Hugging Face's Qwen3Config that shape the model. hidden need
 * not equal heads * head_dim (Qwen3-0.6B: 1024 vs 16 * 128). */
typedef struct {
    int64_t vocab;        /* V (vocab_size) */
    int64_t hidden;       /* C (hidden_size) */
    int64_t layers;       /* num_hidden_layers */
    int64_t heads;        /* H (num_attention_heads) */
    int64_t kv_heads;     /* KV (num_key_value_heads), heads % kv_heads == 0 */
    int64_t head_dim;     /* D, even (RoPE rotates halves) */
    int64_t intermediate; /* F (intermediate_size) */
    double rms_eps;       /* rms_norm_eps, > 0 */
    double rope_theta;    /* > 0 */
    bool tie_word_embeddings; /* lm_head shares model.embed_tokens.weight */
    int64_t max_positions;    /* max_position_embeddings */
    /* The same decoder serves Qwen2 and Llama (zero = Qwen3's choices): */
    bool no_qk_norm;     /* no q_norm/k_norm (Qwen2, Llama) */
    bool attention_bias; /* q/k/v projections with biases (Qwen2) */
    bool rope_llama3;    /* Llama 3.1 rope_scaling of type llama3 */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max_positions;
    /* dtype of the embedding and projection matrices (f32 default, or
     * bf16: kept in bf16, computed in f32); norms and biases stay f32 */
    ts_dtype weight_dtype;
    /* where the parameters (and KV cache) live: NULL for the current
     * device; else a map of cfg->layers layers (copied). A forward moves
     * the activations between devices where the map changes device. */
    const ts_device_map *device_map;
    /* parameters left uninitialized (a loader fills them from a
     * checkpoint): no random init's time and temporaries */
    bool no_init;
} ts_qwen3_config;

typedef struct ts_qwen3_model ts_qwen3_model;
/* Replaces parameter i by t (same dtype, shape and device), e.g. a view
 * of a mapped checkpoint: the loader's zero-copy path. */
ts_status ts_qwen3_set_param(ts_qwen3_model *m, int i, ts_tensor *t);

/* TS_OK, or TS_ERR_INVALID_ARG with a message naming the bad field. */
ts_status ts_qwen3_config_check(ts_ctx *ctx, const ts_qwen3_config *cfg);

/* Allocates the parameters (f32, requires_grad on) and initializes them as
 * Hugging Face does: Normal(0, 0.02) for embeddings and projections, ones
 * for norm weights, each from a seed derived from seed and its index. On
 * failure *out is NULL and ts_errmsg(ctx) says why. */
ts_status ts_qwen3_new(ts_ctx *ctx, const ts_qwen3_config *cfg, uint64_t seed,
                       ts_qwen3_model **out);
void ts_qwen3_free(ts_qwen3_model *m); /* NULL is fine */
const ts_qwen3_config *ts_qwen3_get_config(const ts_qwen3_model *m);

/* Parameters as (name, tensor) pairs in Hugging Face's state_dict order:
 * model.embed_tokens.weight; per layer i model.layers.{i}.self_attn.
 * {q,k,v,o}_proj.weight, .self_attn.{q,k}_norm.weight, .mlp.{gate,up,down}
 * _proj.weight, .input_layernorm.weight, .post_attention_layernorm.weight;
 * model.norm.weight; lm_head.weight (absent when tied). Tensors and names
 * are borrowed: they live as long as the model. A loader fills a parameter
 * with ts_copy_ (which also casts, e.g. from bf16). */
int ts_qwen3_num_params(const ts_qwen3_model *m);
const char *ts_qwen3_param_name(const ts_qwen3_model *m, int i);
ts_tensor *ts_qwen3_param(const ts_qwen3_model *m, int i);
/* The borrowed parameter list (ts_qwen3_num_params entries), for optimizers
 * and gradient clipping. */
ts_tensor *const *ts_qwen3_params(const ts_qwen3_model *m);
/* The parameter called name, or NULL (with no error recorded). */
ts_tensor *ts_qwen3_find_param(const ts_qwen3_model *m, const char *name);

/* ids (B, T) i64 or i32, at positions pos0 .. pos0+T-1 -> logits (B, T, V).
 * Causal self-attention over the T positions given (no KV cache). */
ts_tensor *ts_qwen3_forward(ts_qwen3_model *m, ts_tensor *ids, int64_t pos0);

/* Mean cross-entropy of forward(ids, 0) against targets (B, T) i64/i32,
 * which are the next tokens already aligned with ids (no shift inside);
 * targets of -100 are ignored. Returns the scalar loss; when logits is not
 * NULL it receives a new reference to the logits (B, T, V). */
ts_tensor *ts_qwen3_loss(ts_qwen3_model *m, ts_tensor *ids, ts_tensor *targets,
                         ts_tensor **logits);

/* Activation checkpointing per decoder layer (ts_checkpoint): forward
 * with a graph keeps each layer's input only, backward recomputes the
 * layer. Same values and gradients; less memory, one more forward. */
ts_status ts_qwen3_set_checkpointing(ts_qwen3_model *m, bool on);

/* Mixed precision: with TS_BF16, every forward (and backward) multiplies
 * by bf16 copies of the f32 projection and LM-head matrices, cast where
 * used, so their gradients arrive, bf16-rounded, in the f32 masters'
 * .grad; activations, norms and the optimizer stay f32. TS_F32 (the
 * default) uses the masters. */
ts_status ts_qwen3_set_compute_dtype(ts_qwen3_model *m, ts_dtype dt);

/* fn(arg, layer, before, backward) around each decoder layer: before and
 * after its forward (backward false), and, for a checkpointed layer, before
 * its recompute and after its backward (backward true: its parameters'
 * gradients are then complete). What fully sharded training uses to
 * gather a layer's parameters just in time and release them after. NULL
 * removes it. An error from fn fails the forward or backward. */
typedef ts_status (*ts_layer_hook)(void *arg, int64_t layer, bool before,
                                   bool backward);
ts_status ts_qwen3_set_layer_hook(ts_qwen3_model *m, ts_layer_hook fn,
                                  void *arg);

/* ---- KV cache and generation --------------------------------------------- */

/* Keys and values of every layer for B sequences of up to max_T positions
 * (f32, allocated here). forward_cached runs ids (B, T) at the positions
 * after those cached, attends to them too, appends its own, and returns
 * the logits (B, T, V). */
typedef struct ts_qwen3_cache ts_qwen3_cache;
ts_status ts_qwen3_cache_new(ts_qwen3_model *m, int64_t B, int64_t max_T,
                             ts_qwen3_cache **out);
void ts_qwen3_cache_free(ts_qwen3_cache *kc);
int64_t ts_qwen3_cache_len(const ts_qwen3_cache *kc);
void ts_qwen3_cache_reset(ts_qwen3_cache *kc);
/* ---- paged KV cache (serving) ---------------------------------------------
 * A pool of KV blocks shared by many sequences: per layer K and V (blocks,
 * KV, block_size, D) f32, beside the layer. The engine (src/engine) owns
 * which block holds what; the model only reads and writes through the
 * block tables of ts_paged_attention's meta. */
typedef struct ts_qwen3_kv_pool ts_qwen3_kv_pool;
ts_status ts_qwen3_kv_pool_new(ts_qwen3_model *m, int64_t n_blocks,
                               int64_t block_size, ts_qwen3_kv_pool **out);
void ts_qwen3_kv_pool_free(ts_qwen3_kv_pool *p);
/* bytes of one block over all layers (K and V, f32) */
int64_t ts_qwen3_kv_block_bytes(const ts_qwen3_config *c, int64_t block_size);
/* Block `block` of every layer out of the pool into out, or from in into
 * the pool: per layer K then V, each (KV, block_size, D) f32,
 * ts_qwen3_kv_block_bytes in all (what a KV transfer carries). */
ts_status ts_qwen3_kv_pool_read_block(ts_qwen3_kv_pool *p, int64_t block,
                                      void *out);
ts_status ts_qwen3_kv_pool_write_block(ts_qwen3_kv_pool *p, int64_t block,
                                       const void *in);
/* One engine step: ids (1, N) are the new tokens of several sequences
 * (meta: ts_paged_attention's), positions[N] their positions; returns
 * the logits (n_rows, V) of the tokens at rows[] (each sequence's last). */
ts_tensor *ts_qwen3_forward_paged(ts_qwen3_model *m, ts_qwen3_kv_pool *pool,
                                  ts_tensor *ids, const int32_t *positions,
                                  ts_tensor *meta, const int32_t *rows,
                                  int64_t n_rows);

/* keeps the first len positions (a shorter len than cached only) */
void ts_qwen3_cache_truncate(ts_qwen3_cache *kc, int64_t len);
ts_tensor *ts_qwen3_forward_cached(ts_qwen3_model *m, ts_qwen3_cache *kc,
                                   ts_tensor *ids);
/* The same, with the logits of the last position only (B, 1, V): what
 * generation needs, without the LM head over the whole prompt. */
ts_tensor *ts_qwen3_forward_cached_last(ts_qwen3_model *m, ts_qwen3_cache *kc,
                                        ts_tensor *ids);
/* Greedy decoding: the prompt in one pass, then n_new tokens one at a time
 * through the cache, written to out. */
ts_status ts_qwen3_generate_greedy(ts_qwen3_model *m, const int64_t *prompt,
                                   int64_t n_prompt, int64_t n_new,
                                   int64_t *out);

/* The greedy loop models share: step(model, ids (1, T)) runs the new
 * tokens through the model's cache and returns logits (1, T or 1, V); the
 * argmax of the last position is the next token, n_new times. */
typedef ts_tensor *(*ts_next_logits_fn)(void *model, ts_tensor *ids);
ts_status ts_generate_greedy_with(ts_ctx *ctx, ts_next_logits_fn step,
                                  void *model, const int64_t *prompt,
                                  int64_t n_prompt, int64_t n_new,
                                  int64_t *out);

/* ---- optimizer ---------------------------------------------------------- */

/* torch.optim.AdamW's hyperparameters. */
typedef struct {
    double lr;           /* 1e-3 */
    double beta1, beta2; /* 0.9, 0.999 */
    double eps;          /* 1e-8 */
    double weight_decay; /* 1e-2, decoupled: p -= lr * wd * p */
} ts_adamw_options;

/* torch.optim.AdamW's defaults (shown above). */
ts_adamw_options ts_adamw_default_options(void);

typedef struct ts_adamw ts_adamw;

/* An optimizer over n parameters (float tensors; retained until free). opt
 * NULL means the defaults. The moments m and v are f32 zeros, allocated
 * here. On failure *out is NULL and ts_errmsg(ctx) says why. */
ts_status ts_adamw_new(ts_ctx *ctx, ts_tensor *const *params, int n,
                       const ts_adamw_options *opt, ts_adamw **out);
void ts_adamw_free(ts_adamw *opt); /* NULL is fine */
/* The learning rate of the next steps (for schedules). */
void ts_adamw_set_lr(ts_adamw *opt, double lr);
double ts_adamw_get_lr(const ts_adamw *opt);
/* One update of every parameter that has a .grad (others are skipped and
 * keep their step count, as in torch), with grad mode off:
 *   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
 *   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps) */
ts_status ts_adamw_step(ts_adamw *opt);
/* The same with every gradient read as grad_scale * g (one f32 value, e.g.
 * ts_clip_coef's): clipping folded into the update, no pass of its own.
 * NULL is ts_adamw_step. */
ts_status ts_adamw_step_scaled(ts_adamw *opt, ts_tensor *grad_scale);
/* ts_clip_grad_norm over the optimizer's parameters then ts_adamw_step, in
 * one pass over the gradients (they are left unscaled); the norm before
 * clipping goes to *total_norm (may be NULL), read once the update is
 * recorded, so a compiled step stays one graph. */
ts_status ts_adamw_step_clipped(ts_adamw *opt, double max_norm,
                                double *total_norm);
/* The moments of parameter i (borrowed), for checkpoints; NULL if out of
 * range. */
ts_tensor *ts_adamw_exp_avg(const ts_adamw *opt, int i);
ts_tensor *ts_adamw_exp_avg_sq(const ts_adamw *opt, int i);
int64_t ts_adamw_step_count(const ts_adamw *opt, int i);
/* Restores parameter i's step count (a resumed run). */
void ts_adamw_set_step_count(ts_adamw *opt, int i, int64_t steps);

/* Drops the .grad of n parameters (torch's zero_grad(set_to_none=True)). */
void ts_zero_grads(ts_tensor *const *params, int n);

/* torch.nn.utils.clip_grad_norm_ with the 2-norm: total = sqrt(sum over
 * params of |g|^2); when total > max_norm every grad is scaled in place by
 * max_norm / (total + 1e-6). Params without a .grad are skipped. The norm
 * before clipping goes to *total_norm (may be NULL). */
ts_status ts_clip_grad_norm(ts_tensor *const *params, int n, double max_norm,
                            double *total_norm);
/* The pieces: the global 2-norm of the gradients as a () f32 tensor (NULL
 * when no parameter has a gradient, or on error), and min(max_norm /
 * (norm + 1e-6), 1) from it. New references; nothing is read back. */
ts_tensor *ts_grad_norm(ts_tensor *const *params, int n);
ts_tensor *ts_clip_coef(ts_tensor *norm, double max_norm);

/* ---- LR schedule -------------------------------------------------------- */

/* Linear warmup from 0 to max_lr over warmup steps (lr = max_lr * step /
 * warmup), then cosine decay to min_lr at total_steps, min_lr after that:
 *   lr = min_lr + (max_lr - min_lr) * 0.5 * (1 + cos(pi * progress)),
 *   progress = (step - warmup) / (total_steps - warmup).
 * With min_lr 0 this is Hugging Face's get_cosine_schedule_with_warmup. */
double ts_lr_cosine_warmup(int64_t step, int64_t warmup, int64_t total_steps,
                           double max_lr, double min_lr);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_NN_H */
