/* api.c — the public op functions: argument checks that need the call's
 * own parameters (dims, perms, slices), attribute packing, then one call to
 * ts_op_call. No kernels here. */
#include "ops/rules.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static ts_tensor *call(ts_op_id op, int n, ts_tensor **in, const ts_attrs *a) {
    return ts_op_call(NULL, op, n, in, a);
}

ts_tensor *ts_op_n(ts_op_id op, int n, ts_tensor **in, const ts_attrs *a) {
    return call(op, n, in, a);
}

static ts_tensor *call1(ts_op_id op, ts_tensor *x, const ts_attrs *a) {
    return call(op, 1, &x, a);
}

static ts_tensor *call2(ts_op_id op, ts_tensor *x, ts_tensor *y,
                        const ts_attrs *a) {
    ts_tensor *in[2] = {x, y};
    return call(op, 2, in, a);
}

static ts_tensor *fail(ts_ctx *ctx, ts_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ts_tensor *fail(ts_ctx *ctx, ts_status s, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ts_set_error(ctx, s, "%s", msg);
    return NULL;
}

static ts_tensor *null_input(ts_ctx *ctx, const char *fn) {
    if (ctx && ctx->status == TS_OK)
        ts_set_error(ctx, TS_ERR_INVALID_ARG, "%s: input is NULL", fn);
    return NULL;
}

/* ---- views ---- */

ts_tensor *ts_reshape(ts_tensor *x, int ndim, const int64_t *shape) {
    if (!x)
        return NULL;
    ts_ctx *ctx = x->ctx;
    char sa[128], sb[128];
    if (ndim < 0 || ndim > TS_MAX_DIMS || (ndim && !shape))
        return fail(ctx, TS_ERR_INVALID_ARG, "reshape: bad target (%d dims)",
                    ndim);
    ts_attrs a = {.ni = ndim};
    int infer_at = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) {
            if (infer_at >= 0)
                return fail(ctx, TS_ERR_SHAPE,
                            "reshape: more than one -1 in %s",
                            ts_shape_str(ndim, shape, sb, sizeof sb));
            infer_at = i;
        } else if (shape[i] < 0) {
            return fail(ctx, TS_ERR_SHAPE, "reshape: negative size in %s",
                        ts_shape_str(ndim, shape, sb, sizeof sb));
        } else if (__builtin_mul_overflow(known, shape[i], &known)) {
            return fail(ctx, TS_ERR_SHAPE,
                        "reshape: %s has more than 2^63 elements",
                        ts_shape_str(ndim, shape, sb, sizeof sb));
        }
        a.i[i] = shape[i];
    }
    int64_t numel = ts_tensor_numel(x);
    if (infer_at >= 0)
        a.i[infer_at] = known ? numel / known : 0;
    if (ts_shape_numel(ndim, a.i) != numel || (infer_at >= 0 && known == 0))
        return fail(ctx, TS_ERR_SHAPE,
                    "reshape: cannot view shape %s (%lld elements) as %s",
                    ts_shape_str(x->ndim, x->shape, sa, sizeof sa),
                    (long long)numel, ts_shape_str(ndim, shape, sb, sizeof sb));
    int64_t strides[TS_MAX_DIMS];
    if (ts_view_strides(x, ndim, a.i, strides))
        return call1(TS_OP_RESHAPE_VIEW, x, &a);
    ts_tensor *c = ts_contiguous(x);
    ts_tensor *r = call1(TS_OP_RESHAPE_VIEW, c, &a);
    ts_release(c);
    return r;
}

ts_tensor *ts_permute(ts_tensor *x, const int *perm) {
    if (!x)
        return NULL;
    ts_attrs a = {.ni = x->ndim};
    bool seen[TS_MAX_DIMS] = {0};
    for (int i = 0; i < x->ndim; i++) {
        int d = perm ? ts_norm_dim(perm[i], x->ndim) : -1;
        if (d < 0 || seen[d])
            return fail(
                x->ctx, TS_ERR_RANGE,
                "permute: entry %d (%d) is not a permutation of %d dims", i,
                perm ? perm[i] : -1, x->ndim);
        seen[d] = true;
        a.i[i] = d;
    }
    return call1(TS_OP_PERMUTE, x, &a);
}

ts_tensor *ts_transpose(ts_tensor *x, int d0, int d1) {
    if (!x)
        return NULL;
    int a = ts_norm_dim(d0, x->ndim), b = ts_norm_dim(d1, x->ndim);
    if (a < 0 || b < 0)
        return fail(x->ctx, TS_ERR_RANGE,
                    "transpose: dims (%d, %d) out of range for %d dims", d0, d1,
                    x->ndim);
    int perm[TS_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++)
        perm[i] = i;
    perm[a] = b;
    perm[b] = a;
    return ts_permute(x, perm);
}

ts_tensor *ts_slice(ts_tensor *x, int dim, int64_t start, int64_t end,
                    int64_t step) {
    if (!x)
        return NULL;
    int d = ts_norm_dim(dim, x->ndim);
    if (d < 0)
        return fail(x->ctx, TS_ERR_RANGE,
                    "slice: dim %d out of range for %d dims", dim, x->ndim);
    if (step < 1)
        return fail(x->ctx, TS_ERR_RANGE, "slice: step %lld (want >= 1)",
                    (long long)step);
    int64_t n = x->shape[d];
    if (start < 0)
        start += n;
    if (end < 0)
        end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    ts_attrs a = {.i = {d, start, end, step}, .ni = 4};
    return call1(TS_OP_SLICE, x, &a);
}

ts_tensor *ts_expand(ts_tensor *x, int ndim, const int64_t *shape) {
    if (!x)
        return NULL;
    if (ndim < x->ndim || ndim > TS_MAX_DIMS || !shape)
        return fail(x->ctx, TS_ERR_SHAPE,
                    "expand: target has %d dims; input has %d", ndim, x->ndim);
    ts_attrs a = {.ni = ndim};
    memcpy(a.i, shape, sizeof(int64_t) * (size_t)ndim);
    return call1(TS_OP_EXPAND, x, &a);
}

ts_tensor *ts_squeeze(ts_tensor *x, int dim) {
    if (!x)
        return NULL;
    int d = ts_norm_dim(dim, x->ndim);
    if (d < 0)
        return fail(x->ctx, TS_ERR_RANGE,
                    "squeeze: dim %d out of range for %d dims", dim, x->ndim);
    if (x->shape[d] != 1)
        return ts_retain(x); /* as torch.squeeze(x, dim) */
    int64_t shape[TS_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < x->ndim; i++)
        if (i != d)
            shape[nd++] = x->shape[i];
    return ts_reshape(x, nd, shape);
}

ts_tensor *ts_unsqueeze(ts_tensor *x, int dim) {
    if (!x)
        return NULL;
    int d = ts_norm_dim(dim, x->ndim + 1);
    if (d < 0 || x->ndim >= TS_MAX_DIMS)
        return fail(x->ctx, TS_ERR_RANGE,
                    "unsqueeze: dim %d out of range for %d dims", dim, x->ndim);
    int64_t shape[TS_MAX_DIMS];
    for (int i = 0, j = 0; i <= x->ndim; i++)
        shape[i] = i == d ? 1 : x->shape[j++];
    return ts_reshape(x, x->ndim + 1, shape);
}

ts_tensor *ts_contiguous(ts_tensor *x) {
    if (!x)
        return NULL;
    if (ts_tensor_is_contiguous(x))
        return ts_retain(x);
    return call1(TS_OP_COPY, x, NULL);
}

/* ---- elementwise ---- */

ts_tensor *ts_add(ts_tensor *a, ts_tensor *b) {
    return call2(TS_OP_ADD, a, b, NULL);
}
ts_tensor *ts_sub(ts_tensor *a, ts_tensor *b) {
    return call2(TS_OP_SUB, a, b, NULL);
}
ts_tensor *ts_mul(ts_tensor *a, ts_tensor *b) {
    return call2(TS_OP_MUL, a, b, NULL);
}
ts_tensor *ts_div(ts_tensor *a, ts_tensor *b) {
    return call2(TS_OP_DIV, a, b, NULL);
}
ts_tensor *ts_eq(ts_tensor *a, ts_tensor *b) {
    return call2(TS_OP_EQ, a, b, NULL);
}

static ts_tensor *unary_f(ts_op_id op, ts_tensor *x, double f) {
    ts_attrs a = {.f = {f}};
    return call1(op, x, &a);
}

ts_tensor *ts_add_scalar(ts_tensor *x, double s) {
    return unary_f(TS_OP_ADD_SCALAR, x, s);
}
ts_tensor *ts_mul_scalar(ts_tensor *x, double s) {
    return unary_f(TS_OP_MUL_SCALAR, x, s);
}
ts_tensor *ts_neg(ts_tensor *x) {
    return call1(TS_OP_NEG, x, NULL);
}
ts_tensor *ts_exp(ts_tensor *x) {
    return call1(TS_OP_EXP, x, NULL);
}
ts_tensor *ts_log(ts_tensor *x) {
    return call1(TS_OP_LOG, x, NULL);
}
ts_tensor *ts_sqrt(ts_tensor *x) {
    return call1(TS_OP_SQRT, x, NULL);
}
ts_tensor *ts_rsqrt(ts_tensor *x) {
    return call1(TS_OP_RSQRT, x, NULL);
}
ts_tensor *ts_abs(ts_tensor *x) {
    return call1(TS_OP_ABS, x, NULL);
}
ts_tensor *ts_pow_scalar(ts_tensor *x, double e) {
    return unary_f(TS_OP_POW_SCALAR, x, e);
}
ts_tensor *ts_tanh(ts_tensor *x) {
    return call1(TS_OP_TANH, x, NULL);
}
ts_tensor *ts_sigmoid(ts_tensor *x) {
    return call1(TS_OP_SIGMOID, x, NULL);
}
ts_tensor *ts_relu(ts_tensor *x) {
    return call1(TS_OP_RELU, x, NULL);
}
ts_tensor *ts_silu(ts_tensor *x) {
    return call1(TS_OP_SILU, x, NULL);
}

ts_tensor *ts_gelu(ts_tensor *x, ts_gelu_approx approx) {
    if (x && approx != TS_GELU_ERF && approx != TS_GELU_TANH)
        return fail(x->ctx, TS_ERR_INVALID_ARG,
                    "gelu: unknown approximation %d", (int)approx);
    ts_attrs a = {.i = {approx}, .ni = 1};
    return call1(TS_OP_GELU, x, &a);
}

ts_tensor *ts_unary_backward(ts_tensor *g, ts_tensor *x, ts_tensor *out,
                             ts_op_id fwd, const ts_attrs *fwd_attrs) {
    ts_attrs a = *fwd_attrs;
    a.i[8] = fwd; /* forward op id; i[0] keeps the forward's own attribute */
    ts_tensor *in[3] = {g, x, out};
    return call(TS_OP_UNARY_BACKWARD, 3, in, &a);
}

ts_tensor *ts_where(ts_tensor *cond, ts_tensor *a, ts_tensor *b) {
    ts_tensor *in[3] = {cond, a, b};
    return call(TS_OP_WHERE, 3, in, NULL);
}

ts_tensor *ts_masked_fill(ts_tensor *x, ts_tensor *mask, double value) {
    ts_attrs a = {.f = {value}};
    return call2(TS_OP_MASKED_FILL, x, mask, &a);
}

ts_tensor *ts_cast(ts_tensor *x, ts_dtype dt) {
    if (x && (unsigned)dt >= TS_DTYPE_COUNT)
        return fail(x->ctx, TS_ERR_DTYPE, "cast: unknown dtype %d", (int)dt);
    ts_attrs a = {.dtype = dt};
    return call1(TS_OP_CAST, x, &a);
}

ts_tensor *ts_copy(ts_tensor *x) {
    return call1(TS_OP_COPY, x, NULL);
}

/* ---- reductions ---- */

static ts_tensor *reduce(ts_op_id op, ts_tensor *x, int ndims, const int *dims,
                         bool keepdim) {
    if (!x)
        return NULL;
    const char *name = ts_op_table[op].name;
    ts_attrs a = {.f = {keepdim ? 1.0 : 0.0}};
    bool seen[TS_MAX_DIMS] = {0};
    if (ndims < 0 || ndims > x->ndim || (ndims && !dims))
        return fail(x->ctx, TS_ERR_RANGE,
                    "%s: %d dims given for a %d-dim input", name, ndims,
                    x->ndim);
    for (int k = 0; k < ndims; k++) {
        int d = ts_norm_dim(dims[k], x->ndim);
        if (d < 0)
            return fail(x->ctx, TS_ERR_RANGE,
                        "%s: dim %d out of range for a %d-dim input", name,
                        dims[k], x->ndim);
        if (seen[d])
            return fail(x->ctx, TS_ERR_RANGE, "%s: dim %d listed twice", name,
                        dims[k]);
        seen[d] = true;
    }
    for (int d = 0; d < x->ndim; d++) /* sorted; none listed means all */
        if (seen[d] || ndims == 0)
            a.i[a.ni++] = d;
    return call1(op, x, &a);
}

ts_tensor *ts_sum(ts_tensor *x, int nd, const int *dims, bool keep) {
    return reduce(TS_OP_SUM, x, nd, dims, keep);
}
ts_tensor *ts_mean(ts_tensor *x, int nd, const int *dims, bool keep) {
    return reduce(TS_OP_MEAN, x, nd, dims, keep);
}
ts_tensor *ts_amax(ts_tensor *x, int nd, const int *dims, bool keep) {
    return reduce(TS_OP_AMAX, x, nd, dims, keep);
}
ts_tensor *ts_max(ts_tensor *x, int dim, bool keep) {
    if (x && x->ndim == 0)
        return fail(x->ctx, TS_ERR_RANGE, "max: a scalar has no dim %d", dim);
    return reduce(TS_OP_AMAX, x, 1, &dim, keep);
}
ts_tensor *ts_argmax(ts_tensor *x, int dim, bool keep) {
    if (x && x->ndim == 0)
        return fail(x->ctx, TS_ERR_RANGE, "argmax: a scalar has no dim %d",
                    dim);
    return reduce(TS_OP_ARGMAX, x, 1, &dim, keep);
}

static ts_tensor *softmax_like(ts_op_id op, ts_tensor *x, int dim) {
    if (!x)
        return NULL;
    int d = ts_norm_dim(dim, x->ndim);
    if (d < 0)
        return fail(x->ctx, TS_ERR_RANGE, "%s: dim %d out of range for %d dims",
                    ts_op_table[op].name, dim, x->ndim);
    ts_attrs a = {.i = {d}, .ni = 1};
    return call1(op, x, &a);
}

ts_tensor *ts_softmax(ts_tensor *x, int dim) {
    return softmax_like(TS_OP_SOFTMAX, x, dim);
}
ts_tensor *ts_log_softmax(ts_tensor *x, int dim) {
    return softmax_like(TS_OP_LOG_SOFTMAX, x, dim);
}

/* ---- linear algebra, indexing ---- */

ts_tensor *ts_matmul(ts_tensor *a, ts_tensor *b) {
    if (!a || !b)
        return null_input(ts_tensor_ctx(a ? a : b), "matmul");
    if (a->ndim == 0 || b->ndim == 0)
        return fail(a->ctx, TS_ERR_SHAPE,
                    "matmul: operands must have >= 1 dim");
    /* NumPy's rule for 1-D operands: (K) @ (..., K, N) and (..., M, K) @ (K) */
    ts_tensor *a2 = a->ndim == 1 ? ts_unsqueeze(a, 0) : ts_retain(a);
    ts_tensor *b2 = b->ndim == 1 ? ts_unsqueeze(b, -1) : ts_retain(b);
    ts_tensor *r = call2(TS_OP_MATMUL, a2, b2, NULL);
    ts_release(a2);
    ts_release(b2);
    if (r && a->ndim == 1) {
        ts_tensor *s = ts_squeeze(r, -2);
        ts_release(r);
        r = s;
    }
    if (r && b->ndim == 1) {
        ts_tensor *s = ts_squeeze(r, -1);
        ts_release(r);
        r = s;
    }
    return r;
}

ts_tensor *ts_embedding(ts_tensor *weight, ts_tensor *ids) {
    return call2(TS_OP_EMBEDDING, weight, ids, NULL);
}

ts_tensor *ts_embedding_backward(ts_tensor *g, ts_tensor *ids, int64_t V) {
    ts_attrs a = {.i = {V}, .ni = 1};
    return call2(TS_OP_EMBEDDING_BACKWARD, g, ids, &a);
}

ts_tensor *ts_concat(int n, ts_tensor *const *xs, int dim) {
    if (n < 1 || !xs)
        return NULL;
    for (int k = 0; k < n; k++)
        if (!xs[k])
            return null_input(ts_ctx_of(n, (ts_tensor **)xs), "concat");
    int d = ts_norm_dim(dim, xs[0]->ndim);
    if (d < 0)
        return fail(xs[0]->ctx, TS_ERR_RANGE,
                    "concat: dim %d out of range for %d dims", dim,
                    xs[0]->ndim);
    if (n == 1)
        return ts_contiguous(xs[0]);
    ts_attrs a = {.i = {d}, .ni = 1};
    if (n <= TS_MAX_INPUTS)
        return call(TS_OP_CONCAT, n, (ts_tensor **)xs, &a);
    /* more inputs than a node holds: concat in groups, then the groups */
    ts_tensor *parts[TS_MAX_INPUTS] = {0};
    int np = 0, per = (n + TS_MAX_INPUTS - 1) / TS_MAX_INPUTS;
    for (int k = 0; k < n; k += per)
        parts[np++] = ts_concat(n - k < per ? n - k : per, xs + k, d);
    ts_tensor *r = ts_concat(np, parts, d);
    for (int k = 0; k < np; k++)
        ts_release(parts[k]);
    return r;
}

ts_status ts_split(ts_tensor *x, int dim, int n, const int64_t *sizes,
                   ts_tensor **outs) {
    if (!x)
        return TS_ERR_INVALID_ARG;
    if (n < 1 || !sizes || !outs)
        return ts_set_error(x->ctx, TS_ERR_INVALID_ARG,
                            "split: need n >= 1 sizes and an output array");
    int d = ts_norm_dim(dim, x->ndim);
    if (d < 0)
        return ts_set_error(x->ctx, TS_ERR_RANGE,
                            "split: dim %d out of range for %d dims", dim,
                            x->ndim);
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        if (sizes[k] < 0)
            return ts_set_error(x->ctx, TS_ERR_SHAPE,
                                "split: size %d is negative (%lld)", k,
                                (long long)sizes[k]);
        total += sizes[k];
    }
    if (total != x->shape[d])
        return ts_set_error(x->ctx, TS_ERR_SHAPE,
                            "split: sizes sum to %lld but dim %d has %lld",
                            (long long)total, dim, (long long)x->shape[d]);
    int64_t off = 0;
    for (int k = 0; k < n; k++) {
        outs[k] = ts_slice(x, d, off, off + sizes[k], 1);
        if (!outs[k]) {
            for (int j = 0; j < k; j++)
                ts_release(outs[j]), outs[j] = NULL;
            return x->ctx->status;
        }
        off += sizes[k];
    }
    return TS_OK;
}

ts_tensor *ts_slice_scatter(ts_tensor *g, const ts_attrs *slice_attrs, int ndim,
                            const int64_t *shape) {
    ts_attrs a = *slice_attrs;
    a.ni = 4 + ndim;
    memcpy(a.i + 4, shape, sizeof(int64_t) * (size_t)ndim);
    return call1(TS_OP_SLICE_SCATTER, g, &a);
}

/* ---- fused layers ---- */

static bool eps_ok(ts_tensor *x, const char *op, double eps) {
    if (x && !(eps >= 0 && isfinite(eps))) {
        fail(x->ctx, TS_ERR_RANGE, "%s: eps %g (want finite, >= 0)", op, eps);
        return false;
    }
    return true;
}

ts_tensor *ts_rmsnorm(ts_tensor *x, ts_tensor *weight, double eps) {
    if (!eps_ok(x, "rmsnorm", eps))
        return NULL;
    ts_attrs a = {.f = {eps}};
    return weight ? call2(TS_OP_RMSNORM, x, weight, &a)
                  : call1(TS_OP_RMSNORM, x, &a);
}

ts_tensor *ts_layernorm(ts_tensor *x, ts_tensor *weight, ts_tensor *bias,
                        double eps) {
    if (!eps_ok(x, "layernorm", eps))
        return NULL;
    ts_attrs a = {.i = {weight != NULL, bias != NULL}, .ni = 2, .f = {eps}};
    ts_tensor *in[3] = {x};
    int n = 1;
    if (weight)
        in[n++] = weight;
    if (bias)
        in[n++] = bias;
    return call(TS_OP_LAYERNORM, n, in, &a);
}

ts_tensor *ts_rope_dir(ts_tensor *x, ts_tensor *cos, ts_tensor *sin,
                       double direction) {
    ts_attrs a = {.f = {direction}};
    ts_tensor *in[3] = {x, cos, sin};
    return call(TS_OP_ROPE, 3, in, &a);
}

ts_tensor *ts_rope(ts_tensor *x, ts_tensor *cos, ts_tensor *sin) {
    return ts_rope_dir(x, cos, sin, 1.0);
}

ts_status ts_rope_tables(ts_ctx *ctx, int64_t T, int64_t D, double theta,
                         int64_t pos0, ts_tensor **cos, ts_tensor **sin) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!cos || !sin)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "rope_tables: NULL output");
    *cos = *sin = NULL;
    if (T < 0 || D <= 0 || D % 2 || !(theta > 0) || pos0 < 0)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "rope_tables: T %lld, D %lld, theta %g, pos0 %lld "
                            "(want T >= 0, D even > 0, theta > 0, pos0 >= 0)",
                            (long long)T, (long long)D, theta, (long long)pos0);
    int64_t shape[2] = {T, D};
    *cos = ts_tensor_new_host(ctx, TS_F32, 2, shape);
    *sin = ts_tensor_new_host(ctx, TS_F32, 2, shape);
    if (!*cos || !*sin) {
        ts_release(*cos), ts_release(*sin);
        *cos = *sin = NULL;
        return ctx->status;
    }
    float *c = (float *)ts_tensor_ptr(*cos), *s = (float *)ts_tensor_ptr(*sin);
    int64_t half = D / 2;
    for (int64_t i = 0; i < half; i++) {
        /* HF: inv_freq = 1 / theta^(arange(0, D, 2) / D), in f32 */
        float inv = (float)(1.0 / pow(theta, (double)(2 * i) / (double)D));
        for (int64_t t = 0; t < T; t++) {
            float ang = (float)(pos0 + t) * inv;
            c[t * D + i] = c[t * D + i + half] = cosf(ang);
            s[t * D + i] = s[t * D + i + half] = sinf(ang);
        }
    }
    *cos = ts_tensor_to_current(ctx, *cos);
    *sin = ts_tensor_to_current(ctx, *sin);
    if (!*cos || !*sin) {
        ts_release(*cos), ts_release(*sin);
        *cos = *sin = NULL;
        return ctx->status;
    }
    return TS_OK;
}

/* the options' checks, shared by both attention entry points; the scale
 * defaulted from q's D */
static bool attn_opts_ok(ts_tensor *q, const char *op, ts_attn_opts *o) {
    if (!q) /* the op call reports it */
        return true;
    if (!isfinite(o->scale)) {
        fail(q->ctx, TS_ERR_RANGE, "%s: scale %g is not finite", op, o->scale);
        return false;
    }
    if (!(o->softcap >= 0) || !isfinite(o->softcap)) {
        fail(q->ctx, TS_ERR_RANGE,
             "%s: softcap %g (want 0 for none, or finite > 0)", op, o->softcap);
        return false;
    }
    if (o->window < 0) {
        fail(q->ctx, TS_ERR_RANGE, "%s: window %lld (want 0 for none, or > 0)",
             op, (long long)o->window);
        return false;
    }
    if (q->ndim == 4 && o->scale <= 0)
        o->scale = 1.0 / sqrt((double)q->shape[3]);
    return true;
}

ts_tensor *ts_attention_ex(ts_tensor *q, ts_tensor *k, ts_tensor *v,
                           ts_tensor *mask, const ts_attn_opts *opts) {
    ts_attn_opts o = opts ? *opts : (ts_attn_opts){0};
    if (!attn_opts_ok(q, "attention", &o))
        return NULL;
    /* i: causal, has mask, window; f: scale, softcap (a rewrite in
     * compile.c builds i[0..1], f[0] and leaves the rest zero) */
    ts_attrs a = {.i = {o.causal, mask != NULL, o.window},
                  .ni = 3,
                  .f = {o.scale, o.softcap}};
    ts_tensor *in[4] = {q, k, v, mask};
    return call(TS_OP_ATTENTION, mask ? 4 : 3, in, &a);
}

ts_tensor *ts_attention(ts_tensor *q, ts_tensor *k, ts_tensor *v,
                        ts_tensor *mask, bool causal, double scale) {
    ts_attn_opts o = {.causal = causal, .scale = scale};
    return ts_attention_ex(q, k, v, mask, &o);
}

ts_tensor *ts_paged_attention_ex(ts_tensor *q, ts_tensor *k, ts_tensor *v,
                                 ts_tensor *k_pool, ts_tensor *v_pool,
                                 ts_tensor *meta, const ts_attn_opts *opts) {
    ts_attn_opts o = opts ? *opts : (ts_attn_opts){.causal = true};
    if (!attn_opts_ok(q, "paged_attention", &o))
        return NULL;
    ts_attrs a = {.i = {o.window}, .ni = 1, .f = {o.scale, o.softcap}};
    ts_tensor *in[6] = {q, k, v, k_pool, v_pool, meta};
    return call(TS_OP_PAGED_ATTENTION, 6, in, &a);
}

ts_tensor *ts_paged_attention(ts_tensor *q, ts_tensor *k, ts_tensor *v,
                              ts_tensor *k_pool, ts_tensor *v_pool,
                              ts_tensor *meta, double scale) {
    ts_attn_opts o = {.causal = true, .scale = scale};
    return ts_paged_attention_ex(q, k, v, k_pool, v_pool, meta, &o);
}

/* ---- mixture of experts ---- */

ts_tensor *ts_topk(ts_tensor *x, int64_t k) {
    if (!x)
        return NULL;
    if (x->ndim == 0)
        return fail(x->ctx, TS_ERR_SHAPE,
                    "topk: input is a scalar (want "
                    "(..., n))");
    int64_t n = x->shape[x->ndim - 1];
    if (k < 1 || k > n)
        return fail(x->ctx, TS_ERR_RANGE,
                    "topk: k = %lld out of range for a last dim of %lld (want "
                    "1 <= k <= n)",
                    (long long)k, (long long)n);
    ts_attrs a = {.i = {k}, .ni = 1};
    return call1(TS_OP_TOPK, x, &a);
}

ts_tensor *ts_gather(ts_tensor *x, int dim, ts_tensor *index) {
    if (!x || !index)
        return null_input(ts_tensor_ctx(x ? x : index), "gather");
    int d = ts_norm_dim(dim, x->ndim);
    if (d < 0)
        return fail(x->ctx, TS_ERR_RANGE,
                    "gather: dim %d out of range for %d dims", dim, x->ndim);
    ts_attrs a = {.i = {d}, .ni = 1};
    return call2(TS_OP_GATHER, x, index, &a);
}

ts_tensor *ts_gather_backward(ts_tensor *g, ts_tensor *index, int dim, int ndim,
                              const int64_t *shape) {
    ts_attrs a = {.i = {dim}, .ni = 1 + ndim};
    memcpy(a.i + 1, shape, sizeof(int64_t) * (size_t)ndim);
    return call2(TS_OP_GATHER_BACKWARD, g, index, &a);
}

ts_tensor *ts_one_hot(ts_tensor *idx, int64_t n) {
    if (!idx)
        return NULL;
    if (n < 1)
        return fail(idx->ctx, TS_ERR_RANGE,
                    "one_hot: n = %lld classes (want >= 1)", (long long)n);
    ts_attrs a = {.i = {n}, .ni = 1};
    return call1(TS_OP_ONE_HOT, idx, &a);
}

ts_tensor *ts_moe_experts(ts_tensor *x, ts_tensor *idx, ts_tensor *w,
                          ts_tensor *gate, ts_tensor *up, ts_tensor *down,
                          ts_act act) {
    if (!x || !idx || !w || !up || !down)
        return null_input(ts_ctx_of(5, (ts_tensor *[]){x, idx, w, up, down}),
                          "moe_experts");
    if ((unsigned)act > TS_ACT_GELU)
        return fail(x->ctx, TS_ERR_INVALID_ARG,
                    "moe_experts: unknown activation %d", (int)act);
    /* i: activation, gated */
    ts_attrs a = {.i = {act, gate != NULL}, .ni = 2};
    ts_tensor *in[6] = {x, idx, w};
    int n = 3;
    if (gate)
        in[n++] = gate;
    in[n++] = up;
    in[n++] = down;
    return call(TS_OP_MOE_EXPERTS, n, in, &a);
}

ts_tensor *ts_cross_entropy(ts_tensor *logits, ts_tensor *targets,
                            int64_t ignore_index, ts_reduction reduction) {
    if (logits && (unsigned)reduction > TS_REDUCE_NONE)
        return fail(logits->ctx, TS_ERR_INVALID_ARG,
                    "cross_entropy: unknown reduction %d", (int)reduction);
    ts_attrs a = {.i = {ignore_index, reduction}, .ni = 2};
    return call2(TS_OP_CROSS_ENTROPY, logits, targets, &a);
}

/* ---- in-place updates ---- */

/* an in-place op over in[0..n-1], never recorded by autograd */
static ts_status call_in_place(ts_op_id op, int n, ts_tensor **in) {
    ts_ctx *ctx = ts_ctx_of(n, in);
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    bool old = ts_set_grad_enabled(ctx, false);
    ts_tensor *r = ts_op_call(ctx, op, n, in, NULL);
    ts_set_grad_enabled(ctx, old);
    if (!r)
        return ctx->status;
    ts_release(r);
    return TS_OK;
}

ts_status ts_adamw_update_(ts_tensor *p, ts_tensor *g, ts_tensor *m,
                           ts_tensor *v, ts_tensor *hyper) {
    ts_tensor *in[5] = {p, g, m, v, hyper};
    return call_in_place(TS_OP_ADAMW, 5, in);
}

ts_status ts_index_add_(ts_tensor *dst, ts_tensor *ids, ts_tensor *src) {
    ts_tensor *in[3] = {dst, ids, src};
    return call_in_place(TS_OP_INDEX_ADD, 3, in);
}

ts_status ts_copy_(ts_tensor *dst, ts_tensor *src) {
    if (!dst || !src)
        return TS_ERR_INVALID_ARG;
    ts_ctx *ctx = dst->ctx;
    if (!ts_device_equal(dst->storage->device, src->storage->device)) {
        /* from another device: moved beside dst first (a host mapping is
         * uploaded straight from its pages) */
        ts_tensor *moved = ts_to_device(src, dst->storage->device);
        ts_status st = moved ? ts_copy_(dst, moved) : ctx->status;
        ts_release(moved);
        return st;
    }
    /* compiled: recorded, runs in order; on a device: its kernel */
    if (ctx->mode == TS_MODE_COMPILED || !ts_storage_on_host(dst->storage)) {
        ts_tensor *in[2] = {dst, src};
        bool old = ts_set_grad_enabled(ctx, false);
        ts_tensor *r = ts_op_call(ctx, TS_OP_COPY_INTO, 2, in, NULL);
        ts_set_grad_enabled(ctx, old);
        if (!r)
            return ctx->status;
        ts_release(r);
        return TS_OK;
    }
    if (ts_materialize(dst) != TS_OK || ts_materialize(src) != TS_OK)
        return ctx->status;
    if (ts_check_copy_shapes(ctx, dst, src))
        return ctx->status;
    dst->storage->uniform = false;
    ts_storage_drop_packed(dst->storage);
    bool old = ts_set_grad_enabled(ctx, false);
    ts_tensor *s = ts_expand(src, dst->ndim, dst->shape);
    ts_tensor *c =
        s ? ts_cast(s, dst->dtype) : NULL; /* contiguous, converted */
    ts_set_grad_enabled(ctx, old);
    ts_release(s);
    if (!c)
        return ctx->status;
    /* write c into dst's strided view */
    int64_t n = ts_tensor_numel(dst);
    size_t es = ts_dtype_size(dst->dtype);
    const char *sp = ts_tensor_ptr(c);
    char *dp = ts_tensor_ptr(dst);
    if (ts_tensor_is_contiguous(dst)) {
        memmove(dp, sp, (size_t)n * es);
    } else {
        int64_t idx[TS_MAX_DIMS] = {0};
        for (int64_t i = 0; i < n; i++) {
            int64_t off = 0;
            for (int d = 0; d < dst->ndim; d++)
                off += idx[d] * dst->strides[d];
            memcpy(dp + off * (int64_t)es, sp + (size_t)i * es, es);
            for (int d = dst->ndim - 1; d >= 0; d--) {
                if (++idx[d] < dst->shape[d])
                    break;
                idx[d] = 0;
            }
        }
    }
    ts_release(c);
    return TS_OK;
}
