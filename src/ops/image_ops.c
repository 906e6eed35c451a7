/* image_ops.c — the image ops on NCHW tensors: conv2d, group norm,
 * nearest upsampling and average pooling. Their public functions, shape
 * rules and backward rules (op_table.c assembles the rows); the kernels
 * are the backends' (src/backend/cpu/conv.c).
 *
 * Attributes (ts_attrs.i):
 *   conv2d            0 stride_h, 1 stride_w, 2 pad_top, 3 pad_bottom,
 *                     4 pad_left, 5 pad_right, 6 dilation_h, 7 dilation_w,
 *                     8 groups, 9 has bias; backward ops: 10..13 the shape
 *                     of what they produce (x's or w's)
 *   group_norm        0 groups, 1 has weight, 2 has bias; f[0] eps
 *   upsample_nearest  0 scale_h, 1 scale_w
 *   avg_pool2d        0 kernel_h, 1 kernel_w, 2 stride_h, 3 stride_w;
 *                     f[0] the divisor; backward: 4..7 x's shape */
#include "ops/rules.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define SHP(t, buf) ts_shape_str((t)->ndim, (t)->shape, buf, sizeof buf)

enum { C_SH, C_SW, C_PT, C_PB, C_PL, C_PR, C_DH, C_DW, C_G, C_BIAS, C_SHAPE };

static ts_tensor *call(ts_op_id op, int n, ts_tensor **in, const ts_attrs *a) {
    return ts_op_n(op, n, in, a);
}

static ts_tensor *fail(ts_tensor *x, ts_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ts_tensor *fail(ts_tensor *x, ts_status s, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (x)
        ts_set_error(ts_tensor_ctx(x), s, "%s", msg);
    return NULL;
}

static void set_desc(ts_desc *d, ts_dtype dt, int ndim, const int64_t *shape) {
    d->dtype = dt;
    d->ndim = ndim;
    memcpy(d->shape, shape, sizeof(int64_t) * (size_t)ndim);
}

static ts_status need_float(ts_ctx *ctx, const char *op, const char *what,
                            const ts_tensor *t) {
    if (ts_dtype_is_float(t->dtype))
        return TS_OK;
    return ts_set_error(ctx, TS_ERR_DTYPE,
                        "%s: %s has dtype %s; this op takes float dtypes", op,
                        what, ts_dtype_name(t->dtype));
}

/* output extent of a convolution or pooling along one dim; < 1: none */
static int64_t out_extent(int64_t in, int64_t pad, int64_t dil, int64_t k,
                          int64_t stride) {
    int64_t span = in + pad - dil * (k - 1) - 1;
    return span < 0 ? 0 : span / stride + 1;
}

/* ---- conv2d ------------------------------------------------------------- */

ts_tensor *ts_conv2d(ts_tensor *x, ts_tensor *w, ts_tensor *bias,
                     const ts_conv2d_opts *opts) {
    if (!x || !w)
        return fail(x ? x : w, TS_ERR_INVALID_ARG, "conv2d: input is NULL");
    ts_conv2d_opts o = opts ? *opts : (ts_conv2d_opts){0};
    int v[9] = {o.stride_h,   o.stride_w,   o.pad_top,
                o.pad_bottom, o.pad_left,   o.pad_right,
                o.dilation_h, o.dilation_w, o.groups};
    static const char *names[9] = {"stride_h",   "stride_w",   "pad_top",
                                   "pad_bottom", "pad_left",   "pad_right",
                                   "dilation_h", "dilation_w", "groups"};
    ts_attrs a = {.ni = C_SHAPE};
    for (int k = 0; k < 9; k++) {
        if (v[k] < 0 || v[k] > 65536)
            return fail(x, TS_ERR_INVALID_ARG,
                        "conv2d: %s = %d is out of range (0 to 65536; 0 "
                        "means the default)",
                        names[k], v[k]);
        bool one = k == C_SH || k == C_SW || k == C_DH || k == C_DW ||
                   k == C_G; /* 0 means 1 */
        a.i[k] = one && v[k] == 0 ? 1 : v[k];
    }
    a.i[C_BIAS] = bias != NULL;
    ts_tensor *in[3] = {x, w, bias};
    return call(TS_OP_CONV2D, bias ? 3 : 2, in, &a);
}

ts_status ts_infer_conv2d(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                          int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0], *w = n->in[1];
    const int64_t *a = n->attrs.i;
    char sx[128], sw[128];
    if (need_float(ctx, "conv2d", "x", x) || need_float(ctx, "conv2d", "w", w))
        return ctx->status;
    if (x->ndim != 4 || w->ndim != 4)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "conv2d: want x (B, C, H, W) and w (O, C / "
                            "groups, KH, KW); got x %s, w %s",
                            SHP(x, sx), SHP(w, sw));
    int64_t G = a[C_G], C = x->shape[1], O = w->shape[0];
    if (C % G || O % G || w->shape[1] != C / G)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "conv2d: x %s and w %s do not fit %lld groups (C "
                            "and O multiples of groups, w's dim 1 = C / "
                            "groups)",
                            SHP(x, sx), SHP(w, sw), (long long)G);
    if (a[C_BIAS]) {
        const ts_tensor *b = n->in[2];
        if (need_float(ctx, "conv2d", "bias", b))
            return ctx->status;
        if (b->ndim != 1 || b->shape[0] != O)
            return ts_set_error(ctx, TS_ERR_SHAPE,
                                "conv2d: bias %s should be (%lld) for w %s",
                                SHP(b, sx), (long long)O, SHP(w, sw));
    }
    int64_t OH = out_extent(x->shape[2], a[C_PT] + a[C_PB], a[C_DH],
                            w->shape[2], a[C_SH]);
    int64_t OW = out_extent(x->shape[3], a[C_PL] + a[C_PR], a[C_DW],
                            w->shape[3], a[C_SW]);
    if (OH < 1 || OW < 1)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "conv2d: the kernel %s (dilated) is larger than "
                            "the padded input %s",
                            SHP(w, sw), SHP(x, sx));
    int64_t shape[4] = {x->shape[0], O, OH, OW};
    set_desc(o, x->dtype, 4, shape);
    return TS_OK;
}

/* conv2d_backward_input (g, w) -> dx; conv2d_backward_weight (g, x) -> dw */
ts_status ts_infer_conv2d_bwd(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                              ts_desc *s, int *ns) {
    (void)ctx, (void)s, (void)ns;
    ts_dtype dt =
        n->op == TS_OP_CONV2D_BACKWARD_INPUT ? n->in[0]->dtype : TS_F32;
    set_desc(o, dt, 4, &n->attrs.i[C_SHAPE]);
    return TS_OK;
}

TS_GRAD(conv2d) {
    ts_tensor *x = n->in[0], *w = n->in[1];
    ts_attrs a = n->attrs;
    a.ni = C_SHAPE + 4;
    if (want[0]) {
        memcpy(&a.i[C_SHAPE], x->shape, sizeof(int64_t) * 4);
        ts_tensor *in[2] = {g, w};
        ts_tensor *dx = call(TS_OP_CONV2D_BACKWARD_INPUT, 2, in, &a);
        if (!dx)
            return ctx->status;
        gin[0] = dx;
    }
    if (want[1]) {
        memcpy(&a.i[C_SHAPE], w->shape, sizeof(int64_t) * 4);
        ts_tensor *in[2] = {g, x};
        ts_tensor *dw = call(TS_OP_CONV2D_BACKWARD_WEIGHT, 2, in, &a);
        if (dw && w->dtype != TS_F32) {
            ts_tensor *c = ts_cast(dw, w->dtype);
            ts_release(dw);
            dw = c;
        }
        if (!dw)
            return ctx->status;
        gin[1] = dw;
    }
    if (n->n_in > 2 && want[2]) {
        int dims[3] = {0, 2, 3};
        ts_tensor *db = ts_sum(g, 3, dims, false);
        if (db && db->dtype != n->in[2]->dtype) {
            ts_tensor *c = ts_cast(db, n->in[2]->dtype);
            ts_release(db);
            db = c;
        }
        if (!db)
            return ctx->status;
        gin[2] = db;
    }
    return TS_OK;
}

/* ---- group norm --------------------------------------------------------- */

ts_tensor *ts_group_norm(ts_tensor *x, int64_t groups, ts_tensor *weight,
                         ts_tensor *bias, double eps) {
    if (!x)
        return fail(weight, TS_ERR_INVALID_ARG, "group_norm: input is NULL");
    if (groups < 1)
        return fail(x, TS_ERR_INVALID_ARG,
                    "group_norm: groups = %lld (want >= 1)", (long long)groups);
    if (!(eps >= 0) || eps > 1)
        return fail(x, TS_ERR_INVALID_ARG,
                    "group_norm: eps = %g is out of range [0, 1]", eps);
    ts_attrs a = {
        .i = {groups, weight != NULL, bias != NULL}, .ni = 3, .f = {eps}};
    ts_tensor *in[3] = {x};
    int k = 1;
    if (weight)
        in[k++] = weight;
    if (bias)
        in[k++] = bias;
    return call(TS_OP_GROUP_NORM, k, in, &a);
}

ts_status ts_infer_group_norm(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                              ts_desc *s, int *ns) {
    const ts_tensor *x = n->in[0];
    char sx[128], sp[128];
    if (need_float(ctx, "group_norm", "x", x))
        return ctx->status;
    int64_t G = n->attrs.i[0];
    if (x->ndim < 2 || x->shape[1] % G)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "group_norm: x %s should be (B, C, ...) with C a "
                            "multiple of %lld groups",
                            SHP(x, sx), (long long)G);
    for (int k = 1; k < n->n_in; k++) {
        const ts_tensor *p = n->in[k];
        const char *what = k == 1 && n->attrs.i[1] ? "weight" : "bias";
        if (need_float(ctx, "group_norm", what, p))
            return ctx->status;
        if (p->ndim != 1 || p->shape[0] != x->shape[1])
            return ts_set_error(ctx, TS_ERR_SHAPE,
                                "group_norm: %s %s should be (%lld) for x %s",
                                what, SHP(p, sp), (long long)x->shape[1],
                                SHP(x, sx));
    }
    set_desc(o, x->dtype, x->ndim, x->shape);
    int64_t bg[2] = {x->shape[0], G};
    set_desc(&s[0], TS_F32, 2, bg); /* mean */
    set_desc(&s[1], TS_F32, 2, bg); /* rstd */
    *ns = 2;
    return TS_OK;
}

/* x normalized as the forward did: (x - mean) rstd, f32, x's shape */
static ts_tensor *normalized(const ts_node *n) {
    ts_tensor *x = n->in[0];
    int64_t B = x->shape[0], G = n->attrs.i[0];
    int64_t sh[3] = {B, G, ts_tensor_numel(x) / (B * G > 0 ? B * G : 1)};
    ts_tensor *xf = x->dtype == TS_F32 ? ts_retain(x) : ts_cast(x, TS_F32);
    ts_tensor *xc = xf ? ts_contiguous(xf) : NULL;
    ts_tensor *xr = xc ? ts_reshape(xc, 3, sh) : NULL;
    ts_tensor *mu = ts_unsqueeze(n->saved[0], -1);
    ts_tensor *rs = ts_unsqueeze(n->saved[1], -1);
    ts_tensor *d = xr ? ts_sub(xr, mu) : NULL;
    ts_tensor *h = d ? ts_mul(d, rs) : NULL;
    ts_tensor *out = h ? ts_reshape(h, x->ndim, x->shape) : NULL;
    ts_release(xf), ts_release(xc), ts_release(xr), ts_release(mu);
    ts_release(rs), ts_release(d), ts_release(h);
    return out;
}

/* sum of t (B, C, ...) over every dim but C, cast to dt */
static ts_tensor *sum_but_channels(ts_tensor *t, ts_dtype dt) {
    if (!t)
        return NULL;
    int dims[TS_MAX_DIMS], nd = 0;
    for (int d = 0; d < t->ndim; d++)
        if (d != 1)
            dims[nd++] = d;
    ts_tensor *s = ts_sum(t, nd, dims, false);
    ts_tensor *r = s && s->dtype != dt ? ts_cast(s, dt) : ts_retain(s);
    ts_release(s);
    return r;
}

TS_GRAD(group_norm) {
    bool has_w = n->attrs.i[1] != 0;
    if (want[0]) {
        ts_tensor *in[5] = {g, n->in[0], n->saved[0], n->saved[1],
                            has_w ? n->in[1] : NULL};
        ts_tensor *dx =
            call(TS_OP_GROUP_NORM_BACKWARD, has_w ? 5 : 4, in, &n->attrs);
        if (!dx)
            return ctx->status;
        gin[0] = dx;
    }
    int iw = has_w ? 1 : -1, ib = n->attrs.i[2] ? (has_w ? 2 : 1) : -1;
    if (iw > 0 && want[iw]) {
        ts_tensor *h = normalized(n);
        ts_tensor *gf = g->dtype == TS_F32 ? ts_retain(g) : ts_cast(g, TS_F32);
        ts_tensor *p = h && gf ? ts_mul(gf, h) : NULL;
        ts_release(gf);
        ts_tensor *dw = sum_but_channels(p, n->in[iw]->dtype);
        ts_release(h), ts_release(p);
        if (!dw)
            return ctx->status;
        gin[iw] = dw;
    }
    if (ib > 0 && want[ib]) {
        ts_tensor *db = sum_but_channels(g, n->in[ib]->dtype);
        if (!db)
            return ctx->status;
        gin[ib] = db;
    }
    return TS_OK;
}

/* ---- nearest upsampling and average pooling ----------------------------- */

ts_tensor *ts_upsample_nearest2d(ts_tensor *x, int scale_h, int scale_w) {
    if (!x)
        return NULL;
    if (scale_h < 1 || scale_w < 1 || scale_h > 1024 || scale_w > 1024)
        return fail(x, TS_ERR_INVALID_ARG,
                    "upsample_nearest2d: scale factors %d x %d out of range "
                    "(1 to 1024)",
                    scale_h, scale_w);
    ts_attrs a = {.i = {scale_h, scale_w}, .ni = 2};
    return call(TS_OP_UPSAMPLE_NEAREST, 1, &x, &a);
}

static ts_tensor *pool(ts_tensor *x, int kh, int kw, int sh, int sw,
                       double divisor) {
    ts_attrs a = {.i = {kh, kw, sh, sw}, .ni = 4, .f = {divisor}};
    return call(TS_OP_AVG_POOL2D, 1, &x, &a);
}

ts_tensor *ts_avg_pool2d(ts_tensor *x, int kernel_h, int kernel_w, int stride_h,
                         int stride_w) {
    if (!x)
        return NULL;
    if (kernel_h < 1 || kernel_w < 1 || stride_h < 1 || stride_w < 1 ||
        kernel_h > 65536 || kernel_w > 65536 || stride_h > 65536 ||
        stride_w > 65536)
        return fail(x, TS_ERR_INVALID_ARG,
                    "avg_pool2d: kernel %d x %d, stride %d x %d: each must "
                    "be 1 to 65536",
                    kernel_h, kernel_w, stride_h, stride_w);
    return pool(x, kernel_h, kernel_w, stride_h, stride_w,
                (double)kernel_h * kernel_w);
}

ts_status ts_infer_pool2d(ts_ctx *ctx, const ts_node *n, ts_desc *o, ts_desc *s,
                          int *ns) {
    (void)s, (void)ns;
    const ts_tensor *x = n->in[0];
    const int64_t *a = n->attrs.i;
    bool up = n->op == TS_OP_UPSAMPLE_NEAREST;
    const char *op = up ? "upsample_nearest2d" : "avg_pool2d";
    char sx[128];
    if (need_float(ctx, op, "x", x))
        return ctx->status;
    if (x->ndim != 4)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "%s: want x (B, C, H, W); got %s", op, SHP(x, sx));
    int64_t shape[4] = {x->shape[0], x->shape[1], 0, 0};
    if (up) {
        shape[2] = x->shape[2] * a[0];
        shape[3] = x->shape[3] * a[1];
    } else {
        shape[2] = out_extent(x->shape[2], 0, 1, a[0], a[2]);
        shape[3] = out_extent(x->shape[3], 0, 1, a[1], a[3]);
        if (shape[2] < 1 || shape[3] < 1)
            return ts_set_error(ctx, TS_ERR_SHAPE,
                                "avg_pool2d: kernel %lld x %lld is larger "
                                "than x %s",
                                (long long)a[0], (long long)a[1], SHP(x, sx));
    }
    set_desc(o, x->dtype, 4, shape);
    return TS_OK;
}

ts_status ts_infer_pool2d_bwd(ts_ctx *ctx, const ts_node *n, ts_desc *o,
                              ts_desc *s, int *ns) {
    (void)ctx, (void)s, (void)ns;
    set_desc(o, n->in[0]->dtype, 4, &n->attrs.i[4]);
    return TS_OK;
}

/* the gradient of nearest upsampling: each input pixel's block summed */
TS_GRAD(upsample_nearest) {
    (void)want;
    int sh = (int)n->attrs.i[0], sw = (int)n->attrs.i[1];
    ts_tensor *d = pool(g, sh, sw, sh, sw, 1.0);
    if (!d)
        return ctx->status;
    gin[0] = d;
    return TS_OK;
}

TS_GRAD(avg_pool2d) {
    (void)want;
    ts_attrs a = n->attrs;
    memcpy(&a.i[4], n->in[0]->shape, sizeof(int64_t) * 4);
    a.ni = 8;
    ts_tensor *d = call(TS_OP_AVG_POOL2D_BACKWARD, 1, &g, &a);
    if (!d)
        return ctx->status;
    gin[0] = d;
    return TS_OK;
}
