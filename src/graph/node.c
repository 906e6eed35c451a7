/* node.c — building and running nodes (eager execution) and node lifetime.
 * Every op call comes through ts_op_call: check inputs, apply the op's
 * shape rule, allocate the output (or make the view), run the kernel on the
 * backend, and keep the node as the output's grad_fn when a gradient will
 * be needed. Owns ts_node; the autograd traversal is in autograd.c. */
#include "ops/ops.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

ts_ctx *ts_ctx_of(int n, ts_tensor **in) {
    for (int i = 0; i < n; i++)
        if (in[i])
            return in[i]->ctx;
    return NULL;
}

/* Releasing a long chain of nodes recursively could overflow the stack, so
 * nodes whose count drops to zero go on a pending list that the outermost
 * call drains. */
static ts_node **pending;
static size_t n_pending, cap_pending;
static bool draining;

static void node_destroy(ts_node *n) {
    ts_storage_release(n->out_st);
    for (int i = 0; i < n->n_in; i++)
        ts_release(n->in[i]);
    for (int i = 0; i < n->n_saved; i++)
        ts_release(n->saved[i]);
    ts_release(n->grad_acc);
    free(n);
}

void ts_node_release(ts_node *n) {
    if (!n || --n->refcount > 0)
        return;
    if (draining) {
        if (n_pending == cap_pending) {
            size_t cap = cap_pending ? cap_pending * 2 : 64;
            ts_node **p = realloc(pending, cap * sizeof *p);
            if (!p) { /* no room to defer: free now (recursion) */
                node_destroy(n);
                return;
            }
            pending = p;
            cap_pending = cap;
        }
        pending[n_pending++] = n;
        return;
    }
    draining = true;
    node_destroy(n);
    while (n_pending)
        node_destroy(pending[--n_pending]);
    draining = false;
    free(pending);
    pending = NULL;
    cap_pending = 0;
}

void ts_node_forget_out(ts_node *n, const ts_tensor *out) {
    if (n->out == out)
        n->out = NULL;
}

_Static_assert(TS_OP_COUNT <= TS_PROFILE_SLOTS, "TS_PROFILE_SLOTS too small");

/* the backend of the device n runs on: its output's (in place: input 0's) */
static const ts_backend *node_backend(const ts_node *n) {
    const ts_tensor *t = n->out ? n->out : n->in[0];
    return ts_storage_backend(t->storage);
}

ts_status ts_run_kernel(ts_ctx *ctx, ts_node *n) {
    const ts_backend *be = node_backend(n);
    if (!ctx->profile)
        return be->run_node(ctx, n);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    ts_status st = be->run_node(ctx, n);
    clock_gettime(CLOCK_MONOTONIC, &b);
    ctx->prof_seconds[n->op] +=
        (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    ctx->prof_calls[n->op]++;
    return st;
}

void ts_profile_report(ts_ctx *ctx, FILE *f) {
    double total = 0;
    for (int i = 0; i < TS_OP_COUNT; i++)
        total += ctx->prof_seconds[i];
    fprintf(f, "tessera profile (kernel time per op, %.3f s in all):\n", total);
    for (;;) { /* largest first */
        int best = -1;
        for (int i = 0; i < TS_OP_COUNT; i++)
            if (ctx->prof_calls[i] &&
                (best < 0 || ctx->prof_seconds[i] > ctx->prof_seconds[best]))
                best = i;
        if (best < 0)
            break;
        fprintf(f, "  %-24s %9.3f s %5.1f%% %8llu calls\n",
                ts_op_table[best].name, ctx->prof_seconds[best],
                100 * ctx->prof_seconds[best] / (total > 0 ? total : 1),
                (unsigned long long)ctx->prof_calls[best]);
        ctx->prof_calls[best] = 0;
    }
}

static bool input_needs_grad(const ts_tensor *t) {
    return t && (t->requires_grad || t->grad_fn);
}

static ts_tensor *op_call(ts_ctx *ctx, ts_op_id op, int n_in, ts_tensor **in,
                          const ts_attrs *attrs);

/* Ops run where their inputs are: all on one device, the output made
 * there; inputs on different devices are an error naming both. */
ts_tensor *ts_op_call(ts_ctx *ctx, ts_op_id op, int n_in, ts_tensor **in,
                      const ts_attrs *attrs) {
    if (!ctx)
        ctx = ts_ctx_of(n_in, in);
    if (!ctx)
        return NULL;
    bool have = false;
    ts_device dev = {TS_DEVICE_CPU, 0};
    for (int i = 0; i < n_in; i++) {
        if (!in[i] || in[i]->ctx != ctx)
            continue; /* op_call reports these */
        ts_device d = in[i]->storage->device;
        if (have && !ts_device_equal(d, dev)) {
            char a[16], b[16];
            ts_set_error(ctx, TS_ERR_INVALID_ARG,
                         "%s: inputs on different devices (%s and %s); move "
                         "one with ts_to_device",
                         ts_op_table[op].name, ts_device_name(dev, a),
                         ts_device_name(d, b));
            return NULL;
        }
        dev = d;
        have = true;
    }
    ts_device old = ctx->device;
    if (have)
        ctx->device = dev;
    ts_tensor *out = op_call(ctx, op, n_in, in, attrs);
    ctx->device = old;
    return out;
}

/* A tensor of a block format (q8_0, q4_k, ...) is a weight: it enters only
 * a matmul as the right operand (the transpose of a (N, K) weight), an
 * embedding as the table, a cast or copy to a float dtype, a 2-D transpose
 * and a copy to another device; and it computes on the CPU only. */
static bool quantized_inputs_ok(ts_ctx *ctx, ts_op_id op, int n_in,
                                ts_tensor **in, const ts_attrs *attrs) {
    (void)attrs;
    for (int i = 0; i < n_in; i++) {
        ts_dtype dt = in[i]->dtype;
        if (!ts_dtype_is_quantized(dt))
            continue;
        bool ok = (op == TS_OP_MATMUL && i == 1) ||
                  (op == TS_OP_EMBEDDING && i == 0) ||
                  ((op == TS_OP_CAST || op == TS_OP_COPY) && i == 0) ||
                  (op == TS_OP_PERMUTE && in[i]->ndim == 2);
        if (!ok) {
            ts_set_error(ctx, TS_ERR_DTYPE,
                         "%s: input %d is %s, a quantized weight format (it "
                         "enters matmul as x @ W.T, embedding and a cast to "
                         "a float dtype only)",
                         ts_op_table[op].name, i, ts_dtype_name(dt));
            return false;
        }
        if (in[i]->storage->device.kind != TS_DEVICE_CPU &&
            op != TS_OP_PERMUTE) {
            ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: %s weights compute on the CPU only (this one is "
                         "on a %s device)",
                         ts_op_table[op].name, ts_dtype_name(dt),
                         ts_backend_of(in[i]->storage->device.kind)->name);
            return false;
        }
    }
    return true;
}

static ts_tensor *op_call(ts_ctx *ctx, ts_op_id op, int n_in, ts_tensor **in,
                          const ts_attrs *attrs) {
    const ts_op_def *def = &ts_op_table[op];
    if (!ctx)
        ctx = ts_ctx_of(n_in, in);
    if (!ctx)
        return NULL;
    for (int i = 0; i < n_in; i++) {
        if (!in[i]) {
            /* keep the first error: a NULL input usually means an earlier
             * op failed */
            if (ctx->status == TS_OK)
                ts_set_error(ctx, TS_ERR_INVALID_ARG, "%s: input %d is NULL",
                             def->name, i);
            return NULL;
        }
        if (in[i]->ctx != ctx) {
            ts_set_error(ctx, TS_ERR_INVALID_ARG,
                         "%s: input %d belongs to another context", def->name,
                         i);
            return NULL;
        }
    }
    if (!quantized_inputs_ok(ctx, op, n_in, in, attrs))
        return NULL;
    ts_node *n = calloc(1, sizeof *n);
    if (!n) {
        ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory (node)", def->name);
        return NULL;
    }
    n->refcount = 1;
    n->op = op;
    n->n_in = n_in;
    for (int i = 0; i < n_in; i++)
        n->in[i] = ts_retain(in[i]);
    if (attrs)
        n->attrs = *attrs;

    ts_desc od, sd[TS_MAX_SAVED];
    memset(&od, 0, sizeof od);
    memset(sd, 0, sizeof sd);
    int n_saved = 0;
    ts_tensor *out = NULL;
    if (def->infer(ctx, n, &od, sd, &n_saved) != TS_OK)
        goto fail;
    if (ctx->mode == TS_MODE_COMPILED && !def->is_view) {
        /* record: the output's storage exists, its data comes at sync */
        n->out_desc = od;
        if (def->in_place) {
            out = ts_retain(in[0]);
            n->out_st = in[0]->storage;
            for (int i = 0; i < n_in; i++) /* reads must see these writes */
                if (i == 0 || (op == TS_OP_ADAMW && (i == 2 || i == 3)))
                    in[i]->storage->pending_writes++,
                        in[i]->storage->uniform = false,
                        ts_storage_written(in[i]->storage);
        } else {
            out = ts_tensor_new_pending(ctx, od.dtype, od.ndim, od.shape);
            if (!out)
                goto fail;
            n->out_st = out->storage;
        }
        if (op == TS_OP_PAGED_ATTENTION) /* writes the KV pools too */
            ts_storage_written(in[3]->storage),
                ts_storage_written(in[4]->storage);
        ts_storage_retain(n->out_st);
        for (int i = 0; i < n_saved; i++) {
            n->saved_desc[i] = sd[i];
            n->saved[i] = ts_tensor_new_pending(ctx, sd[i].dtype, sd[i].ndim,
                                                sd[i].shape);
            if (!n->saved[i])
                goto fail;
            n->n_saved = i + 1;
        }
        if (ts_trace_append(ctx, n) != TS_OK)
            goto fail;
        n->out = def->in_place ? NULL : out;
    } else if (def->is_view) {
        out =
            ts_tensor_view_of(in[0], od.ndim, od.shape, od.strides, od.offset);
        if (!out)
            goto fail;
    } else {
        out = def->in_place ? ts_retain(in[0])
                            : ts_tensor_new(ctx, od.dtype, od.ndim, od.shape);
        if (!out)
            goto fail;
        for (int i = 0; def->in_place && i < n_in;
             i++) /* written: no constant */
            if (i == 0 || (op == TS_OP_ADAMW && (i == 2 || i == 3)))
                in[i]->storage->uniform = false,
                ts_storage_written(in[i]->storage);
        for (int i = 0; i < n_saved; i++) {
            n->saved[i] =
                ts_tensor_new(ctx, sd[i].dtype, sd[i].ndim, sd[i].shape);
            if (!n->saved[i])
                goto fail;
            n->n_saved = i + 1;
        }
        n->out = out;
        if (op == TS_OP_PAGED_ATTENTION) /* writes the KV pools too */
            ts_storage_written(in[3]->storage),
                ts_storage_written(in[4]->storage);
        if (ts_run_kernel(ctx, n) != TS_OK)
            goto fail;
    }

    bool track = false;
    if (ctx->grad_enabled && def->backward)
        for (int i = 0; i < n_in; i++)
            track |= input_needs_grad(in[i]);
    if (track && !def->in_place) {
        out->requires_grad = true;
        out->grad_fn = n; /* the node's one reference moves to out */
        n->out = out;
        if (ctx->mode == TS_MODE_COMPILED && def->is_view) {
            /* views run at once, but the compiler must see that this node
             * holds its input, to tell intermediates from kept results */
            n->out_st = in[0]->storage;
            ts_storage_retain(n->out_st);
            if (ts_trace_append(ctx, n) != TS_OK) {
                ts_release(out);
                return NULL;
            }
        }
    } else {
        n->out = NULL;
        ts_node_release(n);
    }
    return out;

fail:
    n->out = NULL;
    ts_release(out);
    ts_node_release(n);
    return NULL;
}
