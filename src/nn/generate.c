/* generate.c — the greedy decoding loop any model with a KV cache shares:
 * the prompt in one step, then one token at a time, each the argmax of the
 * last position's logits. The model supplies the step; this file owns only
 * the loop. */
#include "tessera_nn.h"

ts_status ts_generate_greedy_with(ts_ctx *ctx, ts_next_logits_fn step,
                                  void *model, const int64_t *prompt,
                                  int64_t n_prompt, int64_t n_new,
                                  int64_t *out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!step || !prompt || !out || n_prompt < 1 || n_new < 0)
        return ts_set_error(
            ctx, TS_ERR_INVALID_ARG,
            "generate_greedy: a prompt of >= 1 token and n_new >= 0");
    bool old = ts_set_grad_enabled(ctx, false);
    int64_t shape[2] = {1, n_prompt};
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, prompt);
    ts_status s = ids ? TS_OK : ts_ctx_status(ctx);
    for (int64_t t = 0; t < n_new && s == TS_OK; t++) {
        ts_tensor *logits = step(model, ids);
        ts_release(ids);
        ids = NULL;
        int64_t T = logits ? ts_tensor_dim(logits, 1) : 0;
        ts_tensor *last = logits ? ts_slice(logits, 1, T - 1, T, 1) : NULL;
        ts_tensor *best = last ? ts_argmax(last, -1, false) : NULL; /* (1, 1) */
        double v;
        s = best ? ts_item(best, &v) : ts_ctx_status(ctx);
        if (s == TS_OK) {
            out[t] = (int64_t)v;
            int64_t one[2] = {1, 1};
            ids = ts_from_data(ctx, TS_I64, 2, one, &out[t]);
        }
        ts_release(logits), ts_release(last), ts_release(best);
    }
    ts_release(ids);
    ts_set_grad_enabled(ctx, old);
    return s;
}
