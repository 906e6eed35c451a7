/* tessera_nn.h — the nn layer of Tessera: layers built from the public ops
 * (linear, SwiGLU MLP), the greedy decoding loop models share, the AdamW
 * optimizer, gradient clipping and the cosine LR schedule.
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
