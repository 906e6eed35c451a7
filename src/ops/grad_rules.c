/* grad_rules.c — the backward rule of every differentiable op, written with
 * the public ops (grad mode is off while they run), so a compiled graph can
 * capture the backward pass like any other code. Fused ops have fused
 * backward kernels (attention, cross-entropy, norms, rope, embedding). */
#include "ops/rules.h"

#include <string.h>

static ts_tensor *sum_to(ts_tensor *g, const ts_tensor *x) {
    return ts_sum_to_shape(g, x->ndim, x->shape);
}

/* Takes ownership of t (a fresh result) and stores it in gin[i]. */
static ts_status put(ts_ctx *ctx, ts_tensor **gin, int i, ts_tensor *t) {
    gin[i] = t;
    return t ? TS_OK : ctx->status;
}

ts_tensor *ts_sum_to_shape(ts_tensor *g, int ndim, const int64_t *shape) {
    if (!g)
        return NULL;
    if (ts_shape_equal(g->ndim, g->shape, ndim, shape))
        return ts_retain(g);
    int dims[TS_MAX_DIMS], nd = 0, lead = g->ndim - ndim;
    for (int d = 0; d < g->ndim; d++)
        if (d < lead || (shape[d - lead] == 1 && g->shape[d] != 1))
            dims[nd++] = d;
    ts_tensor *s = nd ? ts_sum(g, nd, dims, true) : ts_retain(g);
    ts_tensor *r = ts_reshape(s, ndim, shape);
    ts_release(s);
    return r;
}

TS_GRAD(reshape) {
    (void)want;
    const ts_tensor *x = n->in[0];
    return put(ctx, gin, 0, ts_reshape(g, x->ndim, x->shape));
}

TS_GRAD(permute) {
    (void)want;
    int inv[TS_MAX_DIMS];
    for (int i = 0; i < n->in[0]->ndim; i++)
        inv[n->attrs.i[i]] = i;
    return put(ctx, gin, 0, ts_permute(g, inv));
}

TS_GRAD(slice) {
    (void)want;
    const ts_tensor *x = n->in[0];
    return put(ctx, gin, 0, ts_slice_scatter(g, &n->attrs, x->ndim, x->shape));
}

TS_GRAD(expand) {
    (void)want;
    return put(ctx, gin, 0, sum_to(g, n->in[0]));
}

TS_GRAD(add) {
    if (want[0] && put(ctx, gin, 0, sum_to(g, n->in[0])))
        return ctx->status;
    if (want[1] && put(ctx, gin, 1, sum_to(g, n->in[1])))
        return ctx->status;
    return TS_OK;
}

TS_GRAD(sub) {
    if (want[0] && put(ctx, gin, 0, sum_to(g, n->in[0])))
        return ctx->status;
    if (want[1]) {
        ts_tensor *s = sum_to(g, n->in[1]);
        if (put(ctx, gin, 1, ts_neg(s)))
            return ts_release(s), ctx->status;
        ts_release(s);
    }
    return TS_OK;
}

TS_GRAD(mul) {
    for (int i = 0; i < 2; i++) {
        if (!want[i])
            continue;
        ts_tensor *p = ts_mul(g, n->in[1 - i]);
        if (put(ctx, gin, i, sum_to(p, n->in[i])))
            return ts_release(p), ctx->status;
        ts_release(p);
    }
    return TS_OK;
}

TS_GRAD(div) {
    if (want[0]) {
        ts_tensor *p = ts_div(g, n->in[1]);
        if (put(ctx, gin, 0, sum_to(p, n->in[0])))
            return ts_release(p), ctx->status;
        ts_release(p);
    }
    if (want[1]) { /* d(a/b)/db = -(a/b)/b = -out/b */
        ts_tensor *go = ts_mul(g, n->out);
        ts_tensor *q = ts_div(go, n->in[1]);
        ts_tensor *nq = ts_neg(q);
        ts_release(go);
        ts_release(q);
        if (put(ctx, gin, 1, sum_to(nq, n->in[1])))
            return ts_release(nq), ctx->status;
        ts_release(nq);
    }
    return TS_OK;
}

TS_GRAD(add_scalar) {
    (void)want, (void)n;
    return put(ctx, gin, 0, ts_retain(g));
}

TS_GRAD(mul_scalar) {
    (void)want;
    return put(ctx, gin, 0, ts_mul_scalar(g, n->attrs.f[0]));
}

TS_GRAD(neg) {
    (void)want, (void)n;
    return put(ctx, gin, 0, ts_neg(g));
}

TS_GRAD(unary) {
    (void)want;
    return put(ctx, gin, 0,
               ts_unary_backward(g, n->in[0], n->out, n->op, &n->attrs));
}

TS_GRAD(where) {
    ts_device here = ctx->device; /* beside g */
    ctx->device = g->storage->device;
    ts_tensor *zero = ts_scalar(ctx, g->dtype, 0.0);
    ctx->device = here;
    for (int i = 1; i <= 2; i++) {
        if (!want[i])
            continue;
        ts_tensor *w =
            i == 1 ? ts_where(n->in[0], g, zero) : ts_where(n->in[0], zero, g);
        gin[i] = sum_to(w, n->in[i]);
        ts_release(w);
        if (!gin[i])
            return ts_release(zero), ctx->status;
    }
    ts_release(zero);
    return TS_OK;
}

TS_GRAD(masked_fill) {
    (void)want;
    ts_tensor *m = ts_masked_fill(g, n->in[1], 0.0);
    ts_status st = put(ctx, gin, 0, sum_to(m, n->in[0]));
    ts_release(m);
    return st;
}

TS_GRAD(cast) {
    (void)want;
    return put(ctx, gin, 0, ts_cast(g, n->in[0]->dtype));
}

TS_GRAD(copy) {
    (void)want, (void)n;
    return put(ctx, gin, 0, ts_retain(g));
}

/* g reshaped to keepdim form of a reduction over attrs dims */
static ts_tensor *keepdim_view(ts_tensor *g, const ts_node *n) {
    const ts_tensor *x = n->in[0];
    if (n->attrs.f[0] != 0)
        return ts_retain(g);
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    for (int k = 0; k < n->attrs.ni; k++)
        shape[n->attrs.i[k]] = 1;
    return ts_reshape(g, x->ndim, shape);
}

TS_GRAD(sum) {
    (void)want;
    ts_tensor *gk = keepdim_view(g, n);
    ts_status st =
        put(ctx, gin, 0, ts_expand(gk, n->in[0]->ndim, n->in[0]->shape));
    ts_release(gk);
    return st;
}

TS_GRAD(mean) {
    (void)want;
    const ts_tensor *x = n->in[0];
    double count = 1;
    for (int k = 0; k < n->attrs.ni; k++)
        count *= (double)x->shape[n->attrs.i[k]];
    ts_tensor *gk = keepdim_view(g, n);
    ts_tensor *e = ts_expand(gk, x->ndim, x->shape);
    ts_status st = put(ctx, gin, 0, ts_mul_scalar(e, 1.0 / count));
    ts_release(gk);
    ts_release(e);
    return st;
}

/* The gradient of a max goes to the elements equal to it, split evenly
 * between ties (as torch.amax does). */
TS_GRAD(amax) {
    (void)want;
    ts_tensor *x = n->in[0];
    ts_tensor *gk = keepdim_view(g, n);
    ts_tensor *ok = keepdim_view(n->out, n);
    ts_tensor *mask = ts_eq(x, ok);
    int dims[TS_MAX_DIMS];
    for (int k = 0; k < n->attrs.ni; k++)
        dims[k] = (int)n->attrs.i[k];
    ts_tensor *cnt = ts_sum(mask, n->attrs.ni, dims, true);
    ts_tensor *share = ts_div(gk, cnt);
    ts_status st = put(ctx, gin, 0, ts_mul(mask, share));
    ts_release(gk), ts_release(ok), ts_release(mask), ts_release(cnt);
    ts_release(share);
    return st;
}

TS_GRAD(softmax) {
    (void)want;
    int dim = (int)n->attrs.i[0];
    ts_tensor *go = ts_mul(g, n->out);
    ts_tensor *s = ts_sum(go, 1, &dim, true);
    ts_tensor *d = ts_sub(g, s);
    ts_status st = put(ctx, gin, 0, ts_mul(n->out, d));
    ts_release(go), ts_release(s), ts_release(d);
    return st;
}

TS_GRAD(log_softmax) {
    (void)want;
    int dim = (int)n->attrs.i[0];
    ts_tensor *s = ts_sum(g, 1, &dim, true);
    ts_tensor *p = ts_exp(n->out);
    ts_tensor *ps = ts_mul(p, s);
    ts_status st = put(ctx, gin, 0, ts_sub(g, ps));
    ts_release(s), ts_release(p), ts_release(ps);
    return st;
}

/* (..., M, K) with batch dims folded into the rows: (prod(...) * M, K) */
static ts_tensor *fold_rows(ts_tensor *x) {
    int64_t shape[2] = {-1, x->shape[x->ndim - 1]};
    return ts_reshape(x, 2, shape);
}

TS_GRAD(matmul) {
    ts_tensor *a = n->in[0], *b = n->in[1];
    if (want[0]) { /* dA = dC @ B^T */
        ts_tensor *bt = ts_transpose(b, -1, -2);
        ts_tensor *p = ts_matmul(g, bt);
        ts_release(bt);
        if (put(ctx, gin, 0, sum_to(p, a)))
            return ts_release(p), ctx->status;
        ts_release(p);
    }
    if (want[1]) { /* dB = A^T @ dC */
        ts_tensor *p;
        if (b->ndim == 2 && a->ndim > 2) {
            /* B shared by every batch (a linear layer): one product with the
             * batch folded into the reduction, (K, B*M) @ (B*M, N), instead
             * of a (batch, K, N) temporary summed afterwards */
            ts_tensor *af = fold_rows(a), *gf = fold_rows(g);
            ts_tensor *at = ts_transpose(af, 0, 1);
            p = ts_matmul(at, gf);
            ts_release(af), ts_release(gf), ts_release(at);
        } else {
            ts_tensor *at = ts_transpose(a, -1, -2);
            p = ts_matmul(at, g);
            ts_release(at);
        }
        if (put(ctx, gin, 1, sum_to(p, b)))
            return ts_release(p), ctx->status;
        ts_release(p);
    }
    return TS_OK;
}

TS_GRAD(embedding) {
    if (!want[0]) /* (the ids have no gradient) */
        return TS_OK;
    return put(ctx, gin, 0,
               ts_embedding_backward(g, n->in[1], n->in[0]->shape[0]));
}

/* the table's gradient added into acc row by row, no dense temporary */
ts_status ts_accum_embedding(ts_ctx *ctx, const ts_node *n, ts_tensor *g, int i,
                             ts_tensor *acc) {
    if (i != 0)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "embedding: no gradient for the ids");
    return ts_index_add_(acc, n->in[1], g);
}

TS_GRAD(concat) {
    int dim = (int)n->attrs.i[0];
    int64_t off = 0;
    for (int k = 0; k < n->n_in; k++) {
        int64_t len = n->in[k]->shape[dim];
        if (want[k] && put(ctx, gin, k, ts_slice(g, dim, off, off + len, 1)))
            return ctx->status;
        off += len;
    }
    return TS_OK;
}

static ts_tensor *as_f32(ts_tensor *t) {
    return t->dtype == TS_F32 ? ts_retain(t) : ts_cast(t, TS_F32);
}

/* sum over all dims but the last, cast to dt */
static ts_tensor *sum_rows(ts_tensor *t, ts_dtype dt) {
    if (!t) /* an op before failed: its error stands */
        return NULL;
    int dims[TS_MAX_DIMS];
    for (int d = 0; d < t->ndim - 1; d++)
        dims[d] = d;
    ts_tensor *s =
        t->ndim > 1 ? ts_sum(t, t->ndim - 1, dims, false) : ts_retain(t);
    ts_tensor *r = s && s->dtype != dt ? ts_cast(s, dt) : ts_retain(s);
    ts_release(s);
    return r;
}

TS_GRAD(rmsnorm) {
    ts_tensor *x = n->in[0], *rstd = n->saved[0];
    bool has_w = n->n_in > 1;
    if (want[0]) {
        ts_tensor *in[4] = {g, x, rstd, has_w ? n->in[1] : NULL};
        if (put(ctx, gin, 0,
                ts_op_n(TS_OP_RMSNORM_BACKWARD, has_w ? 4 : 3, in, &n->attrs)))
            return ctx->status;
    }
    if (has_w && want[1]) { /* dw = sum_rows(g * x * rstd) */
        ts_tensor *gf = as_f32(g), *xf = as_f32(x);
        ts_tensor *ru = ts_unsqueeze(rstd, -1);
        ts_tensor *xh = ts_mul(xf, ru);
        ts_tensor *p = ts_mul(gf, xh);
        ts_status st = put(ctx, gin, 1, sum_rows(p, n->in[1]->dtype));
        ts_release(gf), ts_release(xf), ts_release(ru), ts_release(xh);
        ts_release(p);
        if (st)
            return st;
    }
    return TS_OK;
}

TS_GRAD(layernorm) {
    ts_tensor *x = n->in[0], *mean = n->saved[0], *rstd = n->saved[1];
    bool has_w = n->attrs.i[0] != 0;
    if (want[0]) {
        ts_tensor *in[5] = {g, x, mean, rstd, has_w ? n->in[1] : NULL};
        if (put(ctx, gin, 0,
                ts_op_n(TS_OP_LAYERNORM_BACKWARD, has_w ? 5 : 4, in,
                        &n->attrs)))
            return ctx->status;
    }
    int iw = has_w ? 1 : -1, ib = n->attrs.i[1] ? (has_w ? 2 : 1) : -1;
    ts_tensor *gf = as_f32(g);
    ts_status st = TS_OK;
    if (iw > 0 && want[iw]) { /* dw = sum_rows(g * (x - mean) * rstd) */
        ts_tensor *xf = as_f32(x);
        ts_tensor *mu = ts_unsqueeze(mean, -1), *ru = ts_unsqueeze(rstd, -1);
        ts_tensor *xc = ts_sub(xf, mu);
        ts_tensor *xh = ts_mul(xc, ru);
        ts_tensor *p = ts_mul(gf, xh);
        st = put(ctx, gin, iw, sum_rows(p, n->in[iw]->dtype));
        ts_release(xf), ts_release(mu), ts_release(ru), ts_release(xc);
        ts_release(xh), ts_release(p);
    }
    if (st == TS_OK && ib > 0 && want[ib])
        st = put(ctx, gin, ib, sum_rows(gf, n->in[ib]->dtype));
    ts_release(gf);
    return st;
}

TS_GRAD(rope) {
    (void)want;
    return put(ctx, gin, 0, ts_rope_dir(g, n->in[1], n->in[2], -n->attrs.f[0]));
}

TS_GRAD(attention) {
    ts_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    bool has_mask = n->attrs.i[1] != 0;
    ts_tensor *in[7] = {
        g, q, k, v, n->out, n->saved[0], has_mask ? n->in[3] : NULL};
    ts_tensor *packed =
        ts_op_n(TS_OP_ATTENTION_BACKWARD, has_mask ? 7 : 6, in, &n->attrs);
    if (!packed)
        return ctx->status;
    int64_t off = 0;
    ts_status st = TS_OK;
    for (int i = 0; i < 3 && st == TS_OK; i++) {
        ts_tensor *x = n->in[i];
        int64_t len = ts_tensor_numel(x);
        if (want[i]) {
            ts_tensor *part = ts_slice(packed, 0, off, off + len, 1);
            st = put(ctx, gin, i, ts_reshape(part, x->ndim, x->shape));
            ts_release(part);
        }
        off += len;
    }
    ts_release(packed);
    return st;
}

TS_GRAD(cross_entropy) {
    (void)want;
    ts_tensor *in[4] = {g, n->in[0], n->in[1], n->saved[0]};
    return put(ctx, gin, 0,
               ts_op_n(TS_OP_CROSS_ENTROPY_BACKWARD, 4, in, &n->attrs));
}

TS_GRAD(gather) {
    if (!want[0]) /* (the index has no gradient) */
        return TS_OK;
    const ts_tensor *x = n->in[0];
    return put(
        ctx, gin, 0,
        ts_gather_backward(g, n->in[1], (int)n->attrs.i[0], x->ndim, x->shape));
}

/* One backward kernel for the wanted gradients (x, w, and the f32 expert
 * weights; bf16 weights and idx get none), packed and cut apart here. */
TS_GRAD(moe_experts) {
    bool gated = n->attrs.i[1] != 0;
    int i_gate = gated ? 3 : -1, i_up = gated ? 4 : 3, i_down = i_up + 1;
    int64_t bits = 0;
    if (want[0])
        bits |= TS_MOE_WANT_X;
    if (want[2])
        bits |= TS_MOE_WANT_W;
    if (gated && want[i_gate] && n->in[i_gate]->dtype == TS_F32)
        bits |= TS_MOE_WANT_GATE;
    if (want[i_up] && n->in[i_up]->dtype == TS_F32)
        bits |= TS_MOE_WANT_UP;
    if (want[i_down] && n->in[i_down]->dtype == TS_F32)
        bits |= TS_MOE_WANT_DOWN;
    if (!bits)
        return TS_OK;
    ts_attrs a = n->attrs;
    a.i[2] = bits;
    a.ni = 3;
    ts_tensor *in[TS_MAX_INPUTS] = {g};
    for (int i = 0; i < n->n_in; i++)
        in[1 + i] = n->in[i];
    ts_tensor *packed =
        ts_op_n(TS_OP_MOE_EXPERTS_BACKWARD, n->n_in + 1, in, &a);
    if (!packed)
        return ctx->status;
    /* the parts in the packed order: x, w, gate, up, down */
    const int order[5] = {0, 2, i_gate, i_up, i_down};
    int64_t off = 0;
    ts_status st = TS_OK;
    for (int p = 0; p < 5 && st == TS_OK; p++) {
        if (!(bits & (1 << p)))
            continue;
        ts_tensor *x = n->in[order[p]];
        int64_t len = ts_tensor_numel(x);
        ts_tensor *part = ts_slice(packed, 0, off, off + len, 1);
        st = put(ctx, gin, order[p], ts_reshape(part, x->ndim, x->shape));
        ts_release(part);
        off += len;
    }
    ts_release(packed);
    return st;
}
