/* checkpoint.c — activation checkpointing (ts_checkpoint): a block runs
 * without recording a graph, so none of its intermediates are kept for
 * backward; one node stands for it, holding only its inputs. Backward
 * recomputes the block from those inputs with the graph on (the input cut
 * from the outer graph, as a leaf that wants a gradient) and runs backward
 * through the recomputed graph: the block's parameters get their gradients
 * there, the input's gradient flows on to the outer graph. Eager and
 * compiled modes alike (the recompute and its backward are ordinary ops). */
#include "ops/rules.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* the block and its argument ride in the node's attributes */
typedef union {
    ts_block_fn fn;
    int64_t bits;
} fn_bits;
typedef union {
    ts_block_done_fn fn;
    int64_t bits;
} done_bits;

ts_status ts_infer_checkpoint(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                              ts_desc *s, int *ns) {
    (void)n, (void)o, (void)s, (void)ns;
    return ts_set_error(ctx, TS_ERR_STATE,
                        "checkpoint: made by ts_checkpoint only");
}

ts_tensor *ts_checkpoint(ts_block_fn fn, void *arg, int n, ts_tensor **in) {
    return ts_checkpoint_ex(fn, NULL, arg, n, in);
}

ts_tensor *ts_checkpoint_ex(ts_block_fn fn, ts_block_done_fn done, void *arg,
                            int n, ts_tensor **in) {
    ts_ctx *ctx = ts_ctx_of(n, in);
    if (!ctx)
        return NULL;
    bool null_in = false;
    for (int i = 0; i < n && i < TS_MAX_INPUTS; i++)
        null_in |= !in[i];
    if (!fn || n < 1 || n > TS_MAX_INPUTS || null_in) {
        if (ctx->status == TS_OK) /* a NULL input: keep the first error */
            ts_set_error(ctx, TS_ERR_INVALID_ARG,
                         "ts_checkpoint: a block and 1..%d inputs, none "
                         "NULL",
                         TS_MAX_INPUTS);
        return NULL;
    }
    /* parameters inside the block want gradients even when the inputs do
     * not: with grad mode on the node is always made */
    if (!ctx->grad_enabled) /* nothing to record: the block as it is */
        return fn(arg, n, in);
    bool old = ts_set_grad_enabled(ctx, false);
    ts_tensor *y = fn(arg, n, in);
    ts_set_grad_enabled(ctx, old);
    if (!y)
        return NULL;
    ts_node *node = calloc(1, sizeof *node);
    ts_tensor *out =
        node ? ts_tensor_view_of(y, y->ndim, y->shape, y->strides, y->offset)
             : NULL;
    ts_release(y);
    if (!out) {
        free(node);
        if (ctx->status == TS_OK)
            ts_set_error(ctx, TS_ERR_OOM, "ts_checkpoint: out of memory");
        return NULL;
    }
    node->refcount = 1;
    node->op = TS_OP_CHECKPOINT;
    node->n_in = n;
    for (int i = 0; i < n; i++)
        node->in[i] = ts_retain(in[i]);
    fn_bits fb = {.fn = fn};
    node->attrs.i[0] = fb.bits;
    node->attrs.i[1] = (int64_t)(intptr_t)arg;
    done_bits db = {.fn = done};
    node->attrs.i[2] = db.bits;
    node->attrs.ni = 3;
    node->out = out;
    out->requires_grad = true;
    out->grad_fn = node; /* the node's reference moves to out */
    return out;
}

ts_status ts_grad_checkpoint(ts_ctx *ctx, const ts_node *n, ts_tensor *g,
                             const bool *want, ts_tensor **gin) {
    fn_bits fb = {.bits = n->attrs.i[0]};
    void *arg = (void *)(intptr_t)n->attrs.i[1];
    ts_tensor *in[TS_MAX_INPUTS];
    memcpy(in, n->in, sizeof(ts_tensor *) * (size_t)n->n_in);
    /* the block's input as a leaf of its own graph */
    ts_tensor *x = ts_detach(n->in[0]);
    if (!x)
        return ctx->status;
    if (want[0])
        ts_set_requires_grad(x, true);
    x->inner_leaf = true; /* not the caller's: no grad-ready hook */
    in[0] = x;
    bool old = ts_set_grad_enabled(ctx, true);
    ts_tensor *y = fb.fn(arg, n->n_in, in);
    ts_set_grad_enabled(ctx, old);
    ts_status st = y ? TS_OK : ctx->status;
    if (st == TS_OK && y->requires_grad)
        st = ts_backward(y, g); /* parameters: into their .grad */
    done_bits db = {.bits = n->attrs.i[2]};
    if (st == TS_OK && db.fn) /* the block's gradients are complete */
        st = db.fn(arg);
    if (st == TS_OK && want[0] && x->grad)
        gin[0] = ts_retain(x->grad);
    ts_release(y);
    ts_release(x);
    return st;
}
