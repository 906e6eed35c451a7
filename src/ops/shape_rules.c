/* shape_rules.c — the shape/dtype rule of every op: checks its operands and
 * fills the output descriptor, or records an error that names the op, the
 * operand and the shapes at fault. No kernels, no autograd. */
#include "ops/ops.h"

#include <string.h>

#define SHP(t, buf) ts_shape_str((t)->ndim, (t)->shape, buf, sizeof buf)

static void desc_like(ts_desc *d, ts_dtype dt, int ndim, const int64_t *shape) {
    d->dtype = dt;
    d->ndim = ndim;
    if (ndim)
        memcpy(d->shape, shape, sizeof(int64_t) * (size_t)ndim);
}

static ts_status need_float(ts_ctx *ctx, const char *op, int i,
                            const ts_tensor *t) {
    if (ts_dtype_is_float(t->dtype))
        return TS_OK;
    return ts_set_error(ctx, TS_ERR_DTYPE,
                        "%s: input %d has dtype %s; this op takes float "
                        "dtypes (f32, bf16, f16)",
                        op, i, ts_dtype_name(t->dtype));
}

static ts_status need_same_dtype(ts_ctx *ctx, const char *op,
                                 const ts_tensor *a, const ts_tensor *b) {
    if (a->dtype == b->dtype)
        return TS_OK;
    return ts_set_error(ctx, TS_ERR_DTYPE,
                        "%s: dtypes differ (%s and %s); cast one with ts_cast",
                        op, ts_dtype_name(a->dtype), ts_dtype_name(b->dtype));
}

static ts_status need_int(ts_ctx *ctx, const char *op, const char *what,
                          const ts_tensor *t) {
    if (t->dtype == TS_I32 || t->dtype == TS_I64)
        return TS_OK;
    return ts_set_error(ctx, TS_ERR_DTYPE,
                        "%s: %s has dtype %s (want i32 or i64)", op, what,
                        ts_dtype_name(t->dtype));
}

ts_status ts_broadcast_shapes(ts_ctx *ctx, const char *op, int na,
                              const int64_t *a, int nb, const int64_t *b,
                              int *nout, int64_t *out) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = na - n + i, ib = nb - n + i;
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[128], sb[128];
            return ts_set_error(
                ctx, TS_ERR_SHAPE,
                "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)",
                op, ts_shape_str(na, a, sa, sizeof sa),
                ts_shape_str(nb, b, sb, sizeof sb), i - n, (long long)da,
                (long long)db);
        }
        out[i] = da == 1 ? db : da;
    }
    *nout = n;
    return TS_OK;
}

void ts_broadcast_strides(const ts_tensor *t, int ndim, const int64_t *shape,
                          int64_t *strides) {
    for (int i = 0; i < ndim; i++) {
        int it = t->ndim - ndim + i;
        strides[i] = (it >= 0 && t->shape[it] == shape[i] && shape[i] != 1)
                         ? t->strides[it]
                         : 0;
    }
}

/* ---- views ---- */

/* Strides for viewing x as new_shape without a copy, as PyTorch's
 * computeStride: each run of merged old dims must be contiguous in memory. */
bool ts_view_strides(const ts_tensor *x, int nd, const int64_t *shape,
                     int64_t *strides) {
    int64_t numel = ts_tensor_numel(x);
    if (numel == 0 || x->ndim == 0) {
        ts_contiguous_strides(nd, shape, strides);
        return true;
    }
    int view_d = nd - 1;
    int64_t chunk_base_stride = x->strides[x->ndim - 1];
    int64_t tensor_numel = 1, view_numel = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
        tensor_numel *= x->shape[d];
        if (d == 0 || (x->shape[d - 1] != 1 &&
                       x->strides[d - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 &&
                   (view_numel < tensor_numel || shape[view_d] == 1)) {
                strides[view_d] = view_numel * chunk_base_stride;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel)
                return false;
            if (d > 0) {
                chunk_base_stride = x->strides[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

ts_status ts_infer_reshape(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                           ts_desc *s, int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0];
    desc_like(o, x->dtype, n->attrs.ni, n->attrs.i);
    if (!ts_view_strides(x, o->ndim, o->shape, o->strides))
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "reshape: strides of the input do not allow a "
                            "view; make it contiguous first");
    o->offset = x->offset;
    return TS_OK;
}

ts_status ts_infer_permute(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                           ts_desc *s, int *ns) {
    (void)ctx, (void)s, (void)ns;
    const ts_tensor *x = n->in[0];
    o->dtype = x->dtype;
    o->ndim = x->ndim;
    for (int i = 0; i < x->ndim; i++) {
        o->shape[i] = x->shape[n->attrs.i[i]];
        o->strides[i] = x->strides[n->attrs.i[i]];
    }
    o->offset = x->offset;
    return TS_OK;
}

ts_status ts_infer_slice(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                         int *ns) {
    (void)ctx, (void)s, (void)ns;
    const ts_tensor *x = n->in[0];
    int dim = (int)n->attrs.i[0];
    int64_t start = n->attrs.i[1], end = n->attrs.i[2], step = n->attrs.i[3];
    desc_like(o, x->dtype, x->ndim, x->shape);
    memcpy(o->strides, x->strides, sizeof(int64_t) * (size_t)x->ndim);
    o->shape[dim] = end > start ? (end - start + step - 1) / step : 0;
    o->strides[dim] = x->strides[dim] * step;
    o->offset = x->offset + start * x->strides[dim];
    return TS_OK;
}

ts_status ts_infer_expand(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                          int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0];
    int nd = n->attrs.ni;
    o->dtype = x->dtype;
    o->ndim = nd;
    o->offset = x->offset;
    for (int i = 0; i < nd; i++) {
        int ix = x->ndim - nd + i;
        int64_t want = n->attrs.i[i];
        int64_t have = ix >= 0 ? x->shape[ix] : 1;
        if (want == -1)
            want = have;
        if (ix < 0 && n->attrs.i[i] == -1) {
            return ts_set_error(ctx, TS_ERR_SHAPE,
                                "expand: -1 given for new leading dim %d", i);
        }
        if (have != want && have != 1) {
            char sb[128], tb[128];
            return ts_set_error(
                ctx, TS_ERR_SHAPE,
                "expand: cannot expand shape %s to %s (dim %d is %lld, not 1)",
                SHP(x, sb), ts_shape_str(nd, n->attrs.i, tb, sizeof tb), i,
                (long long)have);
        }
        o->shape[i] = want;
        o->strides[i] = (ix >= 0 && have == want) ? x->strides[ix] : 0;
    }
    return TS_OK;
}

/* ---- elementwise ---- */

ts_status ts_infer_binary(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                          int *ns) {
    (void)s, (void)ns;
    const char *op = ts_op_table[n->op].name;
    const ts_tensor *a = n->in[0], *b = n->in[1];
    if (need_same_dtype(ctx, op, a, b) || need_float(ctx, op, 0, a))
        return ctx->status;
    o->dtype = a->dtype;
    return ts_broadcast_shapes(ctx, op, a->ndim, a->shape, b->ndim, b->shape,
                               &o->ndim, o->shape);
}

ts_status ts_infer_unary(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                         int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0];
    if (need_float(ctx, ts_op_table[n->op].name, 0, x))
        return ctx->status;
    desc_like(o, x->dtype, x->ndim, x->shape);
    return TS_OK;
}

ts_status ts_infer_where(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                         int *ns) {
    (void)s, (void)ns;
    const ts_tensor *c = n->in[0], *a = n->in[1], *b = n->in[2];
    if (need_same_dtype(ctx, "where", a, b))
        return ctx->status;
    int nd;
    int64_t sh[TS_MAX_DIMS];
    if (ts_broadcast_shapes(ctx, "where", c->ndim, c->shape, a->ndim, a->shape,
                            &nd, sh) ||
        ts_broadcast_shapes(ctx, "where", nd, sh, b->ndim, b->shape, &o->ndim,
                            o->shape))
        return ctx->status;
    o->dtype = a->dtype;
    return TS_OK;
}

ts_status ts_infer_masked_fill(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                               ts_desc *s, int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0], *m = n->in[1];
    o->dtype = x->dtype;
    return ts_broadcast_shapes(ctx, "masked_fill", x->ndim, x->shape, m->ndim,
                               m->shape, &o->ndim, o->shape);
}

ts_status ts_infer_cast(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                        int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0];
    ts_dtype to = n->op == TS_OP_CAST ? n->attrs.dtype : x->dtype;
    char sb[128];
    /* block formats: from a contiguous tensor only (rows of whole blocks);
     * into one from a float tensor whose last dim is whole blocks (each
     * row quantized as llama.cpp's reference quantizer does) */
    if (ts_dtype_is_quantized(x->dtype) && !ts_tensor_is_contiguous(x))
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "%s: a %s tensor is read as whole rows of blocks; "
                            "this one is a strided view of shape %s",
                            ts_op_table[n->op].name, ts_dtype_name(x->dtype),
                            SHP(x, sb));
    if (ts_dtype_is_quantized(to)) {
        int64_t be = ts_dtype_block_elems(to);
        /* from another block format: through its f32 values, as
         * llama-quantize --allow-requantize does */
        if (!ts_dtype_is_float(x->dtype) && !ts_dtype_is_quantized(x->dtype))
            return ts_set_error(ctx, TS_ERR_DTYPE,
                                "cast: %s to %s (quantizing takes a float "
                                "tensor)",
                                ts_dtype_name(x->dtype), ts_dtype_name(to));
        if (x->ndim == 0 || x->shape[x->ndim - 1] % be)
            return ts_set_error(ctx, TS_ERR_SHAPE,
                                "cast to %s: the last dim of %s is not a "
                                "multiple of the block size %lld",
                                ts_dtype_name(to), SHP(x, sb), (long long)be);
    }
    desc_like(o, n->op == TS_OP_CAST ? n->attrs.dtype : x->dtype, x->ndim,
              x->shape);
    return TS_OK;
}

/* ---- reductions ---- */

ts_status ts_infer_reduce(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                          int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0];
    if (n->op != TS_OP_ARGMAX && need_float(ctx, ts_op_table[n->op].name, 0, x))
        return ctx->status;
    bool keep = n->attrs.f[0] != 0;
    bool reduced[TS_MAX_DIMS] = {0};
    for (int k = 0; k < n->attrs.ni; k++)
        reduced[n->attrs.i[k]] = true;
    o->dtype = n->op == TS_OP_ARGMAX ? TS_I64 : x->dtype;
    o->ndim = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (reduced[d] && x->shape[d] == 0 &&
            (n->op == TS_OP_AMAX || n->op == TS_OP_ARGMAX)) {
            return ts_set_error(ctx, TS_ERR_SHAPE,
                                "%s: reducing dim %d of size 0 has no "
                                "identity",
                                ts_op_table[n->op].name, d);
        }
        if (!reduced[d])
            o->shape[o->ndim++] = x->shape[d];
        else if (keep)
            o->shape[o->ndim++] = 1;
    }
    return TS_OK;
}

/* ---- linear algebra, indexing ---- */

ts_status ts_infer_matmul(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                          int *ns) {
    (void)s, (void)ns;
    const ts_tensor *a = n->in[0], *b = n->in[1];
    char sa[128], sb[128];
    /* same float dtypes, or f32 activations times bf16/f16 weights (computed
     * in f32, an f32 result) */
    bool mixed =
        a->dtype == TS_F32 && (b->dtype == TS_BF16 || b->dtype == TS_F16 ||
                               ts_dtype_is_quantized(b->dtype));
    if ((!mixed && need_same_dtype(ctx, "matmul", a, b)) ||
        need_float(ctx, "matmul", 0, a))
        return ctx->status;
    int64_t K = a->shape[a->ndim - 1];
    if (ts_dtype_is_quantized(b->dtype) &&
        (b->ndim != 2 || b->strides[0] != 1 ||
         (b->shape[1] > 1 && b->strides[1] != b->shape[0])))
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "matmul: a %s right operand must be the transpose "
                            "of a whole (N, K) weight (x @ W.T); got shape %s",
                            ts_dtype_name(b->dtype), SHP(b, sb));
    if (b->shape[b->ndim - 2] != K)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "matmul: inner dims differ: %s @ %s (%lld vs %lld)",
                            SHP(a, sa), SHP(b, sb), (long long)K,
                            (long long)b->shape[b->ndim - 2]);
    if (ts_broadcast_shapes(ctx, "matmul (batch dims)", a->ndim - 2, a->shape,
                            b->ndim - 2, b->shape, &o->ndim, o->shape))
        return ctx->status;
    o->shape[o->ndim++] = a->shape[a->ndim - 2];
    o->shape[o->ndim++] = b->shape[b->ndim - 1];
    o->dtype = a->dtype;
    return TS_OK;
}

ts_status ts_infer_embedding(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                             ts_desc *s, int *ns) {
    (void)s, (void)ns;
    const ts_tensor *w = n->in[0], *ids = n->in[1];
    char sb[128];
    if (w->ndim != 2)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "embedding: weight has shape %s (want (V, C))",
                            SHP(w, sb));
    if (need_int(ctx, "embedding", "ids", ids))
        return ctx->status;
    if (ts_dtype_is_quantized(w->dtype) && !ts_tensor_is_contiguous(w))
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "embedding: a %s table is read as whole rows of "
                            "blocks; this one is a strided view of shape %s",
                            ts_dtype_name(w->dtype), SHP(w, sb));
    if (ids->ndim + 1 > TS_MAX_DIMS)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "embedding: ids have too many dims");
    /* a table of a block format gives its rows dequantized to f32 */
    desc_like(o, ts_dtype_is_quantized(w->dtype) ? TS_F32 : w->dtype, ids->ndim,
              ids->shape);
    o->shape[o->ndim++] = w->shape[1];
    return TS_OK;
}

ts_status ts_infer_embedding_bwd(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                                 ts_desc *s, int *ns) {
    (void)ctx, (void)s, (void)ns;
    const ts_tensor *g = n->in[0];
    o->dtype = g->dtype;
    o->ndim = 2;
    o->shape[0] = n->attrs.i[0];
    o->shape[1] = g->shape[g->ndim - 1];
    return TS_OK;
}

ts_status ts_infer_concat(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                          int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x0 = n->in[0];
    int dim = (int)n->attrs.i[0];
    desc_like(o, x0->dtype, x0->ndim, x0->shape);
    o->shape[dim] = 0;
    for (int k = 0; k < n->n_in; k++) {
        const ts_tensor *x = n->in[k];
        char sa[128], sb[128];
        if (x->dtype != x0->dtype)
            return ts_set_error(
                ctx, TS_ERR_DTYPE, "concat: input %d has dtype %s, input 0 %s",
                k, ts_dtype_name(x->dtype), ts_dtype_name(x0->dtype));
        bool fits = x->ndim == x0->ndim;
        for (int d = 0; fits && d < x->ndim; d++)
            fits = d == dim || x->shape[d] == x0->shape[d];
        if (!fits)
            return ts_set_error(ctx, TS_ERR_SHAPE,
                                "concat: input %d has shape %s, input 0 %s "
                                "(all dims but %d must match)",
                                k, SHP(x, sa), SHP(x0, sb), dim);
        o->shape[dim] += x->shape[dim];
    }
    return TS_OK;
}

ts_status ts_infer_slice_scatter(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                                 ts_desc *s, int *ns) {
    (void)ctx, (void)s, (void)ns;
    desc_like(o, n->in[0]->dtype, n->attrs.ni - 4, n->attrs.i + 4);
    return TS_OK;
}

/* ---- fused layers ---- */

static ts_status check_norm_param(ts_ctx *ctx, const char *op, const char *what,
                                  const ts_tensor *x, const ts_tensor *p) {
    char sa[128], sb[128];
    if (p->ndim != 1 || p->shape[0] != x->shape[x->ndim - 1])
        return ts_set_error(
            ctx, TS_ERR_SHAPE, "%s: %s has shape %s; want [%lld] for input %s",
            op, what, SHP(p, sa), (long long)x->shape[x->ndim - 1], SHP(x, sb));
    return need_same_dtype(ctx, op, x, p);
}

ts_status ts_infer_rmsnorm(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                           ts_desc *s, int *ns) {
    const ts_tensor *x = n->in[0];
    if (need_float(ctx, "rmsnorm", 0, x))
        return ctx->status;
    if (x->ndim < 1)
        return ts_set_error(ctx, TS_ERR_SHAPE, "rmsnorm: input is a scalar");
    if (n->n_in > 1 && check_norm_param(ctx, "rmsnorm", "weight", x, n->in[1]))
        return ctx->status;
    desc_like(o, x->dtype, x->ndim, x->shape);
    desc_like(&s[0], TS_F32, x->ndim - 1, x->shape); /* rstd per row */
    *ns = 1;
    return TS_OK;
}

ts_status ts_infer_layernorm(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                             ts_desc *s, int *ns) {
    const ts_tensor *x = n->in[0];
    if (need_float(ctx, "layernorm", 0, x))
        return ctx->status;
    if (x->ndim < 1)
        return ts_set_error(ctx, TS_ERR_SHAPE, "layernorm: input is a scalar");
    for (int k = 1; k < n->n_in; k++)
        if (check_norm_param(ctx, "layernorm",
                             (k == 1 && n->attrs.i[0]) ? "weight" : "bias", x,
                             n->in[k]))
            return ctx->status;
    desc_like(o, x->dtype, x->ndim, x->shape);
    desc_like(&s[0], TS_F32, x->ndim - 1, x->shape); /* mean */
    desc_like(&s[1], TS_F32, x->ndim - 1, x->shape); /* rstd */
    *ns = 2;
    return TS_OK;
}

ts_status ts_infer_norm_bwd(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                            ts_desc *s, int *ns) {
    (void)ctx, (void)s, (void)ns;
    const ts_tensor *x = n->in[1];
    desc_like(o, x->dtype, x->ndim, x->shape);
    return TS_OK;
}

ts_status ts_infer_rope(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                        int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0], *c = n->in[1], *sn = n->in[2];
    char sa[128], sb[128];
    if (need_float(ctx, "rope", 0, x) || need_float(ctx, "rope", 1, c) ||
        need_float(ctx, "rope", 2, sn))
        return ctx->status;
    if (x->ndim < 1 || x->shape[x->ndim - 1] % 2)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "rope: input %s needs an even last dim (D)",
                            SHP(x, sa));
    if (!ts_shape_equal(c->ndim, c->shape, sn->ndim, sn->shape))
        return ts_set_error(ctx, TS_ERR_SHAPE, "rope: cos %s and sin %s differ",
                            SHP(c, sa), SHP(sn, sb));
    int nd;
    int64_t sh[TS_MAX_DIMS];
    if (ts_broadcast_shapes(ctx, "rope (x vs cos/sin)", x->ndim, x->shape,
                            c->ndim, c->shape, &nd, sh))
        return ctx->status;
    if (!ts_shape_equal(nd, sh, x->ndim, x->shape))
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "rope: cos/sin %s must broadcast to x %s without "
                            "growing it",
                            SHP(c, sa), SHP(x, sb));
    desc_like(o, x->dtype, x->ndim, x->shape);
    return TS_OK;
}

ts_status ts_infer_attention(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                             ts_desc *s, int *ns) {
    const ts_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    char sq[128], sk[128], sv[128];
    if (need_float(ctx, "attention", 0, q) ||
        need_same_dtype(ctx, "attention (q, k)", q, k) ||
        need_same_dtype(ctx, "attention (q, v)", q, v))
        return ctx->status;
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "attention: want q (B, H, T, D), k and v (B, KV, "
                            "S, D); got q %s, k %s, v %s",
                            SHP(q, sq), SHP(k, sk), SHP(v, sv));
    int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3];
    int64_t KV = k->shape[1], S = k->shape[2];
    if (k->shape[0] != B || v->shape[0] != B || k->shape[3] != D ||
        !ts_shape_equal(4, k->shape, 4, v->shape) || KV == 0 || H % KV)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "attention: shapes q %s, k %s, v %s do not fit "
                            "(same B and D, k == v, H a multiple of KV)",
                            SHP(q, sq), SHP(k, sk), SHP(v, sv));
    if (n->attrs.i[0] && S < T)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "attention: causal with fewer keys (%lld) than "
                            "queries (%lld)",
                            (long long)S, (long long)T);
    if (n->attrs.i[1]) {
        const ts_tensor *m = n->in[3];
        int64_t full[4] = {B, H, T, S}, sh[TS_MAX_DIMS];
        int nd;
        if (need_float(ctx, "attention (mask)", 3, m) ||
            ts_broadcast_shapes(ctx, "attention (mask)", m->ndim, m->shape, 4,
                                full, &nd, sh))
            return ctx->status;
        if (!ts_shape_equal(nd, sh, 4, full))
            return ts_set_error(ctx, TS_ERR_SHAPE,
                                "attention: mask %s does not broadcast to "
                                "(B, H, T, S) = %s",
                                SHP(m, sq), ts_shape_str(4, full, sk, 128));
    }
    desc_like(o, q->dtype, 4, q->shape);
    int64_t lse_shape[3] = {B, H, T};
    desc_like(&s[0], TS_F32, 3, lse_shape);
    *ns = 1;
    return TS_OK;
}

/* the block tables' values: within the pools, sequences in order */
static ts_status check_paged_meta(ts_ctx *ctx, const ts_tensor *meta,
                                  const int32_t *m, int64_t N, int64_t BS,
                                  int64_t NB) {
    int64_t S = m ? m[0] : -1, MB = m ? m[1] : -1;
    if (S < 1 || MB < 1 || meta->shape[0] != 2 + (S + 1) + S + S * MB)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "paged_attention: meta of %lld values does not "
                            "hold %lld sequences of %lld blocks",
                            (long long)meta->shape[0], (long long)S,
                            (long long)MB);
    const int32_t *start = m + 2, *ctx_len = start + S + 1,
                  *table = ctx_len + S;
    if (start[0] != 0 || start[S] != N)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "paged_attention: sequence starts must run from 0 "
                            "to the %lld tokens",
                            (long long)N);
    for (int64_t i = 0; i < S; i++) {
        int64_t last = ctx_len[i] + (start[i + 1] - start[i]); /* positions */
        if (start[i + 1] < start[i] || ctx_len[i] < 0 || last > MB * BS)
            return ts_set_error(ctx, TS_ERR_RANGE,
                                "paged_attention: sequence %lld: %d cached + "
                                "%d new positions do not fit %lld blocks of "
                                "%lld",
                                (long long)i, ctx_len[i],
                                start[i + 1] - start[i], (long long)MB,
                                (long long)BS);
        for (int64_t b = 0; b < (last + BS - 1) / BS; b++)
            if (table[i * MB + b] < 0 || table[i * MB + b] >= NB)
                return ts_set_error(ctx, TS_ERR_RANGE,
                                    "paged_attention: sequence %lld names "
                                    "block %d of a pool of %lld",
                                    (long long)i, table[i * MB + b],
                                    (long long)NB);
    }
    return TS_OK;
}

/* q (1, H, N, D), new k, v (1, KV, N, D) f32, pools (NB, KV, BS, row)
 * and meta (i32): n_seqs, max_blocks, seq_start[n_seqs + 1],
 * ctx_len[n_seqs], block_table[n_seqs x max_blocks]. The pools' dtype is
 * their element type: f32 or bf16 rows of D, or i32 words of int8 rows
 * (D int8 values, padding, the f32 scale: (D + 3) / 4 + 1 words; see
 * ts_kv_dtype in tessera_models.h); off the CPU only f32. The values are
 * checked here too, so the kernel never reads or writes outside the
 * pools */
ts_status ts_infer_paged_attention(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                                   ts_desc *s, int *ns) {
    (void)s, (void)ns;
    const ts_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2], *kp = n->in[3],
                    *vp = n->in[4], *meta = n->in[5];
    char sq[128], sk[128], sp[128];
    for (int i = 0; i < 5; i++) {
        ts_dtype dt = n->in[i]->dtype;
        bool ok = dt == TS_F32 ||
                  (i >= 3 && (dt == TS_BF16 || dt == TS_I32)); /* pools */
        if (!ok || n->in[i]->ndim != 4)
            return ts_set_error(ctx, TS_ERR_DTYPE,
                                "paged_attention: input %d must be %s with 4 "
                                "dims, got %s %s",
                                i,
                                i >= 3 ? "f32, bf16 or i32 (int8 rows)" : "f32",
                                ts_dtype_name(dt), SHP(n->in[i], sq));
    }
    int64_t H = q->shape[1], N = q->shape[2], D = q->shape[3];
    int64_t KV = k->shape[1], NB = kp->shape[0], BS = kp->shape[2];
    int64_t row = kp->dtype == TS_I32 ? (D + 3) / 4 + 1 : D;
    if (q->shape[0] != 1 || k->shape[0] != 1 || k->shape[2] != N ||
        k->shape[3] != D || !ts_shape_equal(4, k->shape, 4, v->shape) ||
        !ts_shape_equal(4, kp->shape, 4, vp->shape) || kp->shape[1] != KV ||
        kp->shape[3] != row || KV == 0 || H % KV || BS < 1)
        return ts_set_error(
            ctx, TS_ERR_SHAPE,
            "paged_attention: want q (1, H, N, D), k and v (1, "
            "KV, N, D), pools (blocks, KV, block size, %s); got "
            "q %s, k %s, pool %s",
            kp->dtype == TS_I32 ? "(D + 3) / 4 + 1" : "D", SHP(q, sq),
            SHP(k, sk), SHP(kp, sp));
    if (vp->dtype != kp->dtype)
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "paged_attention: the K pool is %s, the V pool %s "
                            "(want one type)",
                            ts_dtype_name(kp->dtype), ts_dtype_name(vp->dtype));
    if (!ts_tensor_is_contiguous(kp) || !ts_tensor_is_contiguous(vp))
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "paged_attention: the KV pools must be contiguous "
                            "(blocks as allocated, not views)");
    ts_device pd = ts_tensor_device(kp);
    if (pd.kind != TS_DEVICE_CPU && kp->dtype != TS_F32) {
        char dn[32];
        return ts_set_error(
            ctx, TS_ERR_UNSUPPORTED,
            "paged_attention: a %s KV pool on %s (the paged kernels there "
            "read f32 pools only)",
            kp->dtype == TS_I32 ? "int8" : ts_dtype_name(kp->dtype),
            ts_device_name(pd, dn));
    }
    if (meta->dtype != TS_I32 || meta->ndim != 1 || meta->shape[0] < 2 ||
        !ts_tensor_is_contiguous(meta))
        return ts_set_error(
            ctx, TS_ERR_DTYPE,
            "paged_attention: meta must be a contiguous 1-D i32 "
            "tensor");
    /* the values as the host sees them (a device's copy comes back) */
    ts_tensor *mh = ts_host_copy((ts_tensor *)meta);
    ts_status st =
        check_paged_meta(ctx, meta, mh ? ts_tensor_data(mh) : NULL, N, BS, NB);
    ts_release(mh);
    if (st != TS_OK)
        return st;
    desc_like(o, TS_F32, 4, q->shape);
    return TS_OK;
}

ts_status ts_infer_attention_bwd(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                                 ts_desc *s, int *ns) {
    (void)ctx, (void)s, (void)ns;
    int64_t total = ts_tensor_numel(n->in[1]) + ts_tensor_numel(n->in[2]) +
                    ts_tensor_numel(n->in[3]);
    desc_like(o, n->in[1]->dtype, 1, &total);
    return TS_OK;
}

ts_status ts_infer_cross_entropy(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                                 ts_desc *s, int *ns) {
    const ts_tensor *x = n->in[0], *t = n->in[1];
    char sa[128], sb[128];
    if (need_float(ctx, "cross_entropy", 0, x) ||
        need_int(ctx, "cross_entropy", "targets", t))
        return ctx->status;
    if (x->ndim != 2 || t->ndim != 1 || t->shape[0] != x->shape[0])
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "cross_entropy: want logits (N, V) and targets "
                            "(N); got %s and %s",
                            SHP(x, sa), SHP(t, sb));
    if (n->attrs.i[1] == TS_REDUCE_NONE)
        desc_like(o, x->dtype, 1, x->shape);
    else
        desc_like(o, x->dtype, 0, NULL);
    desc_like(&s[0], TS_F32, 1, x->shape); /* lse per row */
    *ns = 1;
    return TS_OK;
}

ts_status ts_infer_ce_bwd(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                          int *ns) {
    (void)ctx, (void)s, (void)ns;
    const ts_tensor *x = n->in[1];
    desc_like(o, x->dtype, x->ndim, x->shape);
    return TS_OK;
}

/* ---- mixture of experts ---- */

/* x (..., n) float -> (..., k) i64 */
ts_status ts_infer_topk(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                        int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0];
    if (need_float(ctx, "topk", 0, x))
        return ctx->status;
    desc_like(o, TS_I64, x->ndim, x->shape);
    o->shape[x->ndim - 1] = n->attrs.i[0];
    return TS_OK;
}

/* x (any dtype), index i32/i64 of x's dims, each <= x's but along dim ->
 * index's shape, x's dtype */
ts_status ts_infer_gather(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                          int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0], *ix = n->in[1];
    int dim = (int)n->attrs.i[0];
    char sa[128], sb[128];
    if (need_int(ctx, "gather", "index", ix))
        return ctx->status;
    bool fits = ix->ndim == x->ndim;
    for (int d = 0; fits && d < x->ndim; d++)
        fits = d == dim || ix->shape[d] <= x->shape[d];
    if (!fits)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "gather: index %s does not fit input %s along dim "
                            "%d (same number of dims, sizes <= the input's "
                            "but along dim)",
                            SHP(ix, sa), SHP(x, sb), dim);
    desc_like(o, x->dtype, ix->ndim, ix->shape);
    return TS_OK;
}

/* g (index's shape), index -> attrs.i[1..] (the gathered input's shape) */
ts_status ts_infer_gather_bwd(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                              ts_desc *s, int *ns) {
    (void)ctx, (void)s, (void)ns;
    desc_like(o, n->in[0]->dtype, n->attrs.ni - 1, n->attrs.i + 1);
    return TS_OK;
}

/* idx (...) i32/i64 -> (..., n) f32 */
ts_status ts_infer_one_hot(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                           ts_desc *s, int *ns) {
    (void)s, (void)ns;
    const ts_tensor *ix = n->in[0];
    if (need_int(ctx, "one_hot", "idx", ix))
        return ctx->status;
    if (ix->ndim + 1 > TS_MAX_DIMS)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "one_hot: idx has too many dims (%d)", ix->ndim);
    desc_like(o, TS_F32, ix->ndim, ix->shape);
    o->shape[o->ndim++] = n->attrs.i[0];
    return TS_OK;
}

/* an expert weight (E, rows, cols) of f32 or bf16 */
static ts_status check_expert_weight(ts_ctx *ctx, const char *what,
                                     const ts_tensor *t, int64_t E,
                                     int64_t rows, int64_t cols) {
    char sa[128], sb[128];
    int64_t want[3] = {E, rows, cols};
    if (t->dtype != TS_F32 && t->dtype != TS_BF16)
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "moe_experts: %s has dtype %s (want f32 or bf16)",
                            what, ts_dtype_name(t->dtype));
    if (!ts_shape_equal(t->ndim, t->shape, 3, want))
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "moe_experts: %s has shape %s; want %s", what,
                            SHP(t, sa), ts_shape_str(3, want, sb, sizeof sb));
    return TS_OK;
}

/* x (N, C) f32, idx (N, k) i32/i64, w (N, k) f32, [gate (E, F, C)],
 * up (E, F, C), down (E, C, F) -> (N, C) f32 */
ts_status ts_infer_moe_experts(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                               ts_desc *s, int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0], *ix = n->in[1], *w = n->in[2];
    bool gated = n->attrs.i[1] != 0;
    const ts_tensor *up = n->in[gated ? 4 : 3], *down = n->in[gated ? 5 : 4];
    char sa[128], sb[128], sc[128];
    if (x->dtype != TS_F32 || x->ndim != 2)
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "moe_experts: x must be f32 (N, C), got %s %s",
                            ts_dtype_name(x->dtype), SHP(x, sa));
    if (need_int(ctx, "moe_experts", "idx", ix))
        return ctx->status;
    if (w->dtype != TS_F32)
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "moe_experts: routing weights w have dtype %s "
                            "(want f32)",
                            ts_dtype_name(w->dtype));
    int64_t N = x->shape[0], C = x->shape[1];
    if (ix->ndim != 2 || ix->shape[0] != N || ix->shape[1] < 1 ||
        !ts_shape_equal(ix->ndim, ix->shape, w->ndim, w->shape))
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "moe_experts: want idx and w (N, k) with k >= 1 "
                            "for x %s; got idx %s, w %s",
                            SHP(x, sa), SHP(ix, sb), SHP(w, sc));
    if (up->ndim != 3 || up->shape[0] < 1)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "moe_experts: up has shape %s; want (E, F, C) "
                            "with E >= 1",
                            SHP(up, sa));
    int64_t E = up->shape[0], F = up->shape[1];
    if (check_expert_weight(ctx, "up", up, E, F, C) ||
        (gated && check_expert_weight(ctx, "gate", n->in[3], E, F, C)) ||
        check_expert_weight(ctx, "down", down, E, C, F))
        return ctx->status;
    desc_like(o, TS_F32, 2, x->shape);
    return TS_OK;
}

/* g, x, idx, w, [gate], up, down -> the wanted gradients (attrs.i[2]),
 * packed in one f32 vector: dx | dw | dgate | dup | ddown */
ts_status ts_infer_moe_experts_bwd(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                                   ts_desc *s, int *ns) {
    (void)ctx, (void)s, (void)ns;
    bool gated = n->attrs.i[1] != 0;
    int64_t want = n->attrs.i[2], total = 0;
    if (want & TS_MOE_WANT_X)
        total += ts_tensor_numel(n->in[1]);
    if (want & TS_MOE_WANT_W)
        total += ts_tensor_numel(n->in[3]);
    if (gated && (want & TS_MOE_WANT_GATE))
        total += ts_tensor_numel(n->in[4]);
    if (want & TS_MOE_WANT_UP)
        total += ts_tensor_numel(n->in[gated ? 5 : 4]);
    if (want & TS_MOE_WANT_DOWN)
        total += ts_tensor_numel(n->in[gated ? 6 : 5]);
    desc_like(o, TS_F32, 1, &total);
    return TS_OK;
}

/* src must broadcast to dst's shape without growing it */
ts_status ts_check_copy_shapes(ts_ctx *ctx, const ts_tensor *d,
                               const ts_tensor *src) {
    int nd;
    int64_t sh[TS_MAX_DIMS];
    if (ts_broadcast_shapes(ctx, "copy_", d->ndim, d->shape, src->ndim,
                            src->shape, &nd, sh))
        return ctx->status;
    if (!ts_shape_equal(nd, sh, d->ndim, d->shape)) {
        char sa[128], sb[128];
        return ts_set_error(
            ctx, TS_ERR_SHAPE,
            "copy_: source %s does not broadcast to destination "
            "%s",
            SHP(src, sa), SHP(d, sb));
    }
    return TS_OK;
}

/* the destination keeps its geometry */
ts_status ts_infer_copy_into(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                             ts_desc *s, int *ns) {
    (void)s, (void)ns;
    if (ts_check_copy_shapes(ctx, n->in[0], n->in[1]))
        return ctx->status;
    desc_like(o, n->in[0]->dtype, n->in[0]->ndim, n->in[0]->shape);
    return TS_OK;
}

/* dst (V, C) f32 contiguous; ids integers; src (numel(ids), C) as any
 * (..., C) of that many rows, a float dtype */
ts_status ts_infer_index_add(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                             ts_desc *s, int *ns) {
    (void)s, (void)ns;
    const ts_tensor *d = n->in[0], *ids = n->in[1], *src = n->in[2];
    char sa[128], sb[128];
    if (d->dtype != TS_F32 || d->ndim != 2 || !ts_tensor_is_contiguous(d))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "index_add: the destination must be a contiguous "
                            "f32 matrix (it is %s %s)",
                            ts_dtype_name(d->dtype), SHP(d, sa));
    if (ids->dtype != TS_I32 && ids->dtype != TS_I64)
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "index_add: ids must be i32 or i64, not %s",
                            ts_dtype_name(ids->dtype));
    if (need_float(ctx, "index_add", 2, src))
        return ctx->status;
    if (src->ndim < 1 || src->shape[src->ndim - 1] != d->shape[1] ||
        ts_tensor_numel(src) != ts_tensor_numel(ids) * d->shape[1])
        return ts_set_error(
            ctx, TS_ERR_SHAPE, "index_add: rows %s for %lld ids into %s",
            SHP(src, sa), (long long)ts_tensor_numel(ids), SHP(d, sb));
    desc_like(o, d->dtype, d->ndim, d->shape);
    return TS_OK;
}

/* param, grad, m, v of one shape; m, v f32; hyper f32 [7] or [8] */
ts_status ts_infer_adamw(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                         int *ns) {
    (void)s, (void)ns;
    const ts_tensor *p = n->in[0], *h = n->in[4];
    char sa[128], sb[128];
    if (need_float(ctx, "adamw", 0, p) || need_float(ctx, "adamw", 1, n->in[1]))
        return ctx->status;
    for (int k = 1; k < 4; k++)
        if (!ts_shape_equal(n->in[k]->ndim, n->in[k]->shape, p->ndim, p->shape))
            return ts_set_error(
                ctx, TS_ERR_SHAPE,
                "adamw: input %d has shape %s, the parameter %s", k,
                SHP(n->in[k], sa), SHP(p, sb));
    if (n->in[2]->dtype != TS_F32 || n->in[3]->dtype != TS_F32)
        return ts_set_error(ctx, TS_ERR_DTYPE, "adamw: moments must be f32");
    if (!ts_tensor_is_contiguous(p) || !ts_tensor_is_contiguous(n->in[2]) ||
        !ts_tensor_is_contiguous(n->in[3]))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "adamw: parameter and moments must be contiguous");
    if (h->dtype != TS_F32 || h->ndim != 1 ||
        (h->shape[0] != 7 && h->shape[0] != 8))
        return ts_set_error(
            ctx, TS_ERR_SHAPE,
            "adamw: hyperparameters must be f32 [7] (lr, beta1, "
            "beta2, eps, weight_decay, bias_correction1, "
            "bias_correction2) or [8] (and a gradient scale)");
    desc_like(o, p->dtype, p->ndim, p->shape);
    return TS_OK;
}
