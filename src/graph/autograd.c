/* autograd.c — reverse-mode differentiation over the recorded nodes:
 * topological order from the root, each node's backward rule applied to the
 * gradient accumulated for its output, gradients summed into the .grad of
 * leaves that require them. Owns no op semantics (those are the rules in
 * the op table). */
#include "ops/ops.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    ts_node **v;
    size_t n, cap;
} node_vec;

static bool vec_push(node_vec *a, ts_node *n) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        ts_node **p = realloc(a->v, cap * sizeof *p);
        if (!p)
            return false;
        a->v = p;
        a->cap = cap;
    }
    a->v[a->n++] = n;
    return true;
}

/* Post-order DFS without recursion: a node is emitted after all the nodes
 * that produced its inputs. visit: 0 new, 1 on stack, 2 done. Inputs are
 * explored first to last, so backward (the reverse order) takes a node's
 * later inputs before its first: a weight's view (x @ w^T) right after the
 * product, not after the whole chain of activations behind x; weights'
 * gradients are then final early (for the grad-ready hook) and a tied
 * table's head gradient exists before its embedding adds rows to it. */
static bool topo_sort(ts_node *root, node_vec *order) {
    node_vec stack = {0};
    bool ok = vec_push(&stack, root);
    while (ok && stack.n) {
        ts_node *n = stack.v[stack.n - 1];
        if (n->visit == 0) {
            n->visit = 1;
            for (int i = n->n_in - 1; i >= 0 && ok; i--) {
                ts_node *p = n->in[i]->grad_fn;
                if (p && p->visit == 0)
                    ok = vec_push(&stack, p);
            }
        } else {
            stack.n--;
            if (n->visit == 1) {
                n->visit = 2;
                ok = vec_push(order, n);
            }
        }
    }
    free(stack.v);
    return ok;
}

/* *acc += g (new tensor), with g made contiguous and of dtype dt */
static ts_status accumulate(ts_ctx *ctx, ts_tensor **acc, ts_tensor *g,
                            ts_dtype dt) {
    ts_tensor *gc = g->dtype == dt ? ts_retain(g) : ts_cast(g, dt);
    if (!gc)
        return ctx->status;
    if (!*acc) {
        *acc = ts_contiguous(gc);
    } else {
        ts_tensor *sum = ts_add(*acc, gc);
        ts_release(*acc);
        *acc = sum;
    }
    ts_release(gc);
    return *acc ? TS_OK : ctx->status;
}

void ts_set_grad_ready_hook(ts_ctx *ctx, ts_grad_ready_fn fn, void *arg) {
    if (ctx) {
        ctx->grad_ready = fn;
        ctx->grad_ready_arg = fn ? arg : NULL;
    }
}

static bool grad_leaf(const ts_tensor *x) {
    return x->requires_grad && !x->grad_fn && !x->inner_leaf;
}

/* One edge of n into a leaf is done; the hook when it was the last. */
static ts_status edge_done(ts_ctx *ctx, ts_tensor *x) {
    if (--x->grad_pending > 0 || !ctx->grad_ready || !x->grad)
        return TS_OK;
    ts_status st = ctx->grad_ready(ctx->grad_ready_arg, x);
    if (st != TS_OK && ts_ctx_status(ctx) == TS_OK)
        ts_set_error(ctx, st, "ts_backward: the grad-ready hook failed");
    return st;
}

ts_status ts_backward(ts_tensor *root, ts_tensor *grad) {
    if (!root)
        return TS_ERR_INVALID_ARG;
    ts_ctx *ctx = root->ctx;
    char sb[128], gb[128];
    if (!root->requires_grad)
        return ts_set_error(ctx, TS_ERR_STATE,
                            "ts_backward: the tensor does not require grad "
                            "(no input of the ops that made it requires "
                            "grad, or grad mode was off)");
    if (grad) {
        if (!ts_shape_equal(grad->ndim, grad->shape, root->ndim, root->shape))
            return ts_set_error(
                ctx, TS_ERR_SHAPE,
                "ts_backward: grad of shape %s for a tensor of shape %s",
                ts_shape_str(grad->ndim, grad->shape, gb, sizeof gb),
                ts_shape_str(root->ndim, root->shape, sb, sizeof sb));
    } else if (ts_tensor_numel(root) != 1) {
        return ts_set_error(
            ctx, TS_ERR_SHAPE,
            "ts_backward: grad can be omitted only for a one-element tensor; "
            "this one has shape %s",
            ts_shape_str(root->ndim, root->shape, sb, sizeof sb));
    }
    bool old_mode = ts_set_grad_enabled(ctx, false);
    ts_device here = ctx->device; /* the seed goes where root is */
    ctx->device = root->storage->device;
    ts_tensor *seed =
        grad ? ts_retain(grad)
             : ts_full(ctx, root->dtype, root->ndim, root->shape, 1.0);
    ctx->device = here;
    ts_status st = seed ? TS_OK : ctx->status;
    if (st == TS_OK && !root->grad_fn) { /* a leaf */
        st = accumulate(ctx, &root->grad, seed, root->dtype);
        ts_release(seed);
        if (st == TS_OK && grad_leaf(root)) {
            root->grad_pending++;
            st = edge_done(ctx, root);
        }
        ts_set_grad_enabled(ctx, old_mode);
        return st;
    }
    node_vec order = {0};
    if (st == TS_OK && !topo_sort(root->grad_fn, &order))
        st = ts_set_error(ctx, TS_ERR_OOM, "ts_backward: out of memory");
    if (st == TS_OK)
        st = accumulate(ctx, &root->grad_fn->grad_acc, seed, root->dtype);
    ts_release(seed);
    /* each leaf's edges from this graph (added to those of an enclosing
     * backward, when this one recomputes a checkpointed block) */
    for (size_t k = 0; k < order.n; k++)
        for (int i = 0; i < order.v[k]->n_in; i++)
            if (grad_leaf(order.v[k]->in[i]))
                order.v[k]->in[i]->grad_pending++;
    for (size_t k = order.n; k-- > 0 && st == TS_OK;) {
        ts_node *n = order.v[k];
        ts_tensor *g = n->grad_acc;
        n->grad_acc = NULL;
        if (!g) {
            for (int i = 0; i < n->n_in && st == TS_OK; i++)
                if (grad_leaf(n->in[i]))
                    st = edge_done(ctx, n->in[i]);
            continue;
        }
        bool want[TS_MAX_INPUTS] = {0};
        ts_tensor *gin[TS_MAX_INPUTS] = {0};
        for (int i = 0; i < n->n_in; i++)
            want[i] = n->in[i]->requires_grad || n->in[i]->grad_fn;
        /* a leaf's .grad that the op can add into in place, no new one */
        ts_accumulate_fn acc_fn = ts_op_table[n->op].accumulate;
        for (int i = 0; acc_fn && i < n->n_in && st == TS_OK; i++) {
            ts_tensor *x = n->in[i], *xg = x->grad;
            if (want[i] && grad_leaf(x) && xg && xg->refcount == 1 &&
                xg->dtype == TS_F32 && x->dtype == TS_F32 &&
                ts_tensor_is_contiguous(xg)) {
                st = acc_fn(ctx, n, g, i, xg);
                want[i] = false;
            }
        }
        bool any = false; /* (all taken in place: no rule to run) */
        for (int i = 0; i < n->n_in; i++)
            any |= want[i];
        if (st == TS_OK && any)
            st = ts_op_table[n->op].backward(ctx, n, g, want, gin);
        ts_release(g);
        for (int i = 0; i < n->n_in; i++) {
            if (st == TS_OK && gin[i] && want[i]) {
                ts_tensor *x = n->in[i];
                if (!ts_shape_equal(gin[i]->ndim, gin[i]->shape, x->ndim,
                                    x->shape))
                    st = ts_set_error(
                        ctx, TS_ERR_SHAPE,
                        "ts_backward: rule of %s gave a gradient of shape %s "
                        "for input %d of shape %s",
                        ts_op_table[n->op].name,
                        ts_shape_str(gin[i]->ndim, gin[i]->shape, gb, 128), i,
                        ts_shape_str(x->ndim, x->shape, sb, 128));
                else if (x->grad_fn)
                    st = accumulate(ctx, &x->grad_fn->grad_acc, gin[i],
                                    x->dtype);
                else if (x->requires_grad)
                    st = accumulate(ctx, &x->grad, gin[i], x->dtype);
            }
            ts_release(gin[i]);
        }
        for (int i = 0; i < n->n_in && st == TS_OK; i++)
            if (grad_leaf(n->in[i]))
                st = edge_done(ctx, n->in[i]);
    }
    /* an error stops this backward and any enclosing one: no count is
     * left for a later pass */
    for (size_t k = 0; k < order.n && st != TS_OK; k++)
        for (int i = 0; i < order.v[k]->n_in; i++)
            order.v[k]->in[i]->grad_pending = 0;
    for (size_t k = 0; k < order.n; k++) {
        order.v[k]->visit = 0;
        ts_release(order.v[k]->grad_acc);
        order.v[k]->grad_acc = NULL;
    }
    free(order.v);
    ts_set_grad_enabled(ctx, old_mode);
    return st;
}
