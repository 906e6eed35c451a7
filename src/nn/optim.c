/* optim.c — training helpers of the nn layer: the AdamW optimizer (state and
 * step), gradient-norm clipping, zero_grad over a parameter list, and the
 * cosine-with-warmup learning-rate schedule. The update is the fused
 * in-place ts_adamw_update_, which compiled mode records like any op.
 * Owns ts_adamw and its moment tensors, never the parameters. */
#include "tessera_nn.h"

#include <math.h>
#include <stdlib.h>

struct ts_adamw {
    ts_ctx *ctx;
    ts_adamw_options o;
    int n;
    ts_tensor **params; /* retained */
    ts_tensor **m;      /* exp_avg, f32, shape of params[i] */
    ts_tensor **v;      /* exp_avg_sq, f32 */
    int64_t *steps;     /* updates applied to params[i] */
};

ts_adamw_options ts_adamw_default_options(void) {
    ts_adamw_options o = {.lr = 1e-3,
                          .beta1 = 0.9,
                          .beta2 = 0.999,
                          .eps = 1e-8,
                          .weight_decay = 1e-2};
    return o;
}

static ts_status check_options(ts_ctx *ctx, const ts_adamw_options *o) {
    /* torch.optim.AdamW's own checks */
    if (!(o->lr >= 0))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "adamw: lr is %g (want >= 0)", o->lr);
    if (!(o->beta1 >= 0 && o->beta1 < 1))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "adamw: beta1 is %g (want 0 <= beta1 < 1)",
                            o->beta1);
    if (!(o->beta2 >= 0 && o->beta2 < 1))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "adamw: beta2 is %g (want 0 <= beta2 < 1)",
                            o->beta2);
    if (!(o->eps >= 0))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "adamw: eps is %g (want >= 0)", o->eps);
    if (!(o->weight_decay >= 0))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "adamw: weight_decay is %g (want >= 0)",
                            o->weight_decay);
    return TS_OK;
}

ts_status ts_adamw_new(ts_ctx *ctx, ts_tensor *const *params, int n,
                       const ts_adamw_options *opt, ts_adamw **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "adamw_new: NULL out");
    *out = NULL;
    if (n < 0 || (n > 0 && !params))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "adamw_new: %d parameters at %p", n,
                            (const void *)params);
    ts_adamw_options o = opt ? *opt : ts_adamw_default_options();
    ts_status s = check_options(ctx, &o);
    if (s != TS_OK)
        return s;
    for (int i = 0; i < n; i++) {
        if (!params[i])
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "adamw_new: parameter %d is NULL", i);
        if (ts_tensor_ctx(params[i]) != ctx)
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "adamw_new: parameter %d belongs to another "
                                "context",
                                i);
        if (!ts_dtype_is_float(ts_tensor_dtype(params[i])))
            return ts_set_error(ctx, TS_ERR_DTYPE,
                                "adamw_new: parameter %d is %s (want a float "
                                "dtype)",
                                i, ts_dtype_name(ts_tensor_dtype(params[i])));
    }
    ts_adamw *a = calloc(1, sizeof *a);
    size_t cnt = (size_t)(n ? n : 1);
    if (a) {
        a->ctx = ctx;
        a->o = o;
        a->params = calloc(cnt, sizeof *a->params);
        a->m = calloc(cnt, sizeof *a->m);
        a->v = calloc(cnt, sizeof *a->v);
        a->steps = calloc(cnt, sizeof *a->steps);
    }
    if (!a || !a->params || !a->m || !a->v || !a->steps) {
        ts_adamw_free(a);
        return ts_set_error(ctx, TS_ERR_OOM, "adamw_new: out of memory");
    }
    for (int i = 0; i < n; i++) {
        int nd = ts_tensor_ndim(params[i]);
        const int64_t *sh = ts_tensor_shape(params[i]);
        a->params[i] = ts_retain(params[i]);
        a->n = i + 1;
        ts_device here = ts_get_device(ctx); /* moments beside the param */
        ts_set_device(ctx, ts_tensor_device(params[i]));
        a->m[i] = ts_zeros(ctx, TS_F32, nd, sh);
        a->v[i] = ts_zeros(ctx, TS_F32, nd, sh);
        ts_set_device(ctx, here);
        if (!a->m[i] || !a->v[i]) {
            ts_adamw_free(a);
            return ts_ctx_status(ctx);
        }
    }
    *out = a;
    return TS_OK;
}

void ts_adamw_free(ts_adamw *a) {
    if (!a)
        return;
    for (int i = 0; i < a->n; i++) {
        ts_release(a->params[i]);
        ts_release(a->m[i]);
        ts_release(a->v[i]);
    }
    free(a->params), free(a->m), free(a->v), free(a->steps);
    free(a);
}

void ts_adamw_set_lr(ts_adamw *a, double lr) {
    if (a)
        a->o.lr = lr;
}

double ts_adamw_get_lr(const ts_adamw *a) {
    return a ? a->o.lr : 0.0;
}

ts_tensor *ts_adamw_exp_avg(const ts_adamw *a, int i) {
    return a && i >= 0 && i < a->n ? a->m[i] : NULL;
}

ts_tensor *ts_adamw_exp_avg_sq(const ts_adamw *a, int i) {
    return a && i >= 0 && i < a->n ? a->v[i] : NULL;
}

int64_t ts_adamw_step_count(const ts_adamw *a, int i) {
    return a && i >= 0 && i < a->n ? a->steps[i] : 0;
}

/* A new f32 reference to x: x itself when already f32. */
static ts_tensor *as_f32(ts_tensor *x) {
    return ts_tensor_dtype(x) == TS_F32 ? ts_retain(x) : ts_cast(x, TS_F32);
}

void ts_adamw_set_step_count(ts_adamw *a, int i, int64_t steps) {
    if (a && i >= 0 && i < a->n && steps >= 0)
        a->steps[i] = steps;
}

/* One AdamW update of p from g with moments m, v at step t (>= 1), by the
 * fused in-place op. The hyperparameters travel as a small tensor, so a
 * compiled training step keeps one plan while lr and t change. */
static ts_status adamw_update(ts_ctx *ctx, const ts_adamw_options *o,
                              ts_tensor *p, ts_tensor *g, ts_tensor *m,
                              ts_tensor *v, int64_t t, ts_tensor *gscale) {
    float h[7] = {(float)o->lr,
                  (float)o->beta1,
                  (float)o->beta2,
                  (float)o->eps,
                  (float)o->weight_decay,
                  (float)(1.0 - pow(o->beta1, (double)t)),
                  (float)(1.0 - pow(o->beta2, (double)t))};
    int64_t seven = 7;
    ts_device here = ts_get_device(ctx); /* on p's device */
    ts_set_device(ctx, ts_tensor_device(p));
    ts_tensor *hyper = ts_from_data(ctx, TS_F32, 1, &seven, h);
    ts_set_device(ctx, here);
    if (hyper && gscale) { /* [8]: the scale stays a device value */
        int64_t one = 1;
        ts_tensor *s1 = ts_reshape(gscale, 1, &one);
        ts_tensor *parts[2] = {hyper, s1};
        ts_tensor *h8 = s1 ? ts_concat(2, parts, 0) : NULL;
        ts_release(s1), ts_release(hyper);
        hyper = h8;
    }
    if (!hyper)
        return ts_ctx_status(ctx);
    ts_status s = ts_adamw_update_(p, g, m, v, hyper);
    ts_release(hyper);
    return s;
}

ts_status ts_adamw_step(ts_adamw *a) {
    return ts_adamw_step_scaled(a, NULL);
}

ts_status ts_adamw_step_scaled(ts_adamw *a, ts_tensor *grad_scale) {
    if (!a)
        return TS_ERR_INVALID_ARG;
    ts_ctx *ctx = a->ctx;
    if (grad_scale && (ts_tensor_numel(grad_scale) != 1 ||
                       ts_tensor_dtype(grad_scale) != TS_F32))
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "adamw_step: the gradient scale must be one f32 "
                            "value");
    bool old = ts_set_grad_enabled(ctx, false);
    ts_status s = TS_OK;
    for (int i = 0; i < a->n && s == TS_OK; i++) {
        ts_tensor *g = ts_grad(a->params[i]);
        if (!g)
            continue;
        a->steps[i]++;
        s = adamw_update(ctx, &a->o, a->params[i], g, a->m[i], a->v[i],
                         a->steps[i], grad_scale);
    }
    ts_set_grad_enabled(ctx, old);
    if (s != TS_OK && ts_ctx_status(ctx) == TS_OK)
        ts_set_error(ctx, s, "adamw_step: update failed");
    return s;
}

void ts_zero_grads(ts_tensor *const *params, int n) {
    for (int i = 0; params && i < n; i++)
        if (params[i])
            ts_zero_grad(params[i]);
}

/* min(c, 1) of a scalar tensor, exactly: -amax([-c, -1]). */
static ts_tensor *min_one(ts_tensor *c) {
    int64_t one[1] = {1};
    ts_tensor *nc = ts_mul_scalar(c, -1.0);
    ts_tensor *nc1 = ts_reshape(nc, 1, one);
    ts_ctx *ctx = ts_tensor_ctx(c);
    ts_device here = ts_get_device(ctx); /* beside c */
    ts_set_device(ctx, ts_tensor_device(c));
    ts_tensor *m1 = ts_full(ctx, TS_F32, 1, one, -1.0);
    ts_set_device(ctx, here);
    ts_tensor *both[2] = {nc1, m1};
    ts_tensor *cat = ts_concat(2, both, 0);
    ts_tensor *mx = ts_amax(cat, 0, NULL, false);
    ts_tensor *r = ts_mul_scalar(mx, -1.0);
    ts_release(nc), ts_release(nc1), ts_release(m1), ts_release(cat);
    ts_release(mx);
    return r;
}

/* Sum of squares of one gradient as a (1, n) @ (n, 1) product: the BLAS
 * dot's speed, no n-element temporary. */
static ts_tensor *sum_squares(ts_tensor *g) {
    if (ts_tensor_numel(g) > INT32_MAX) { /* past BLAS's int counts */
        ts_tensor *g32 = as_f32(g), *gg = g32 ? ts_mul(g32, g32) : NULL;
        ts_tensor *s = gg ? ts_sum(gg, 0, NULL, false) : NULL;
        ts_release(g32), ts_release(gg);
        return s;
    }
    ts_tensor *g32 = as_f32(g);
    ts_tensor *c = g32 ? ts_contiguous(g32) : NULL;
    int64_t row[2] = {1, -1}, col[2] = {-1, 1};
    ts_tensor *a = c ? ts_reshape(c, 2, row) : NULL;
    ts_tensor *b = c ? ts_reshape(c, 2, col) : NULL;
    ts_tensor *ss = a && b ? ts_matmul(a, b) : NULL;
    ts_tensor *r = ss ? ts_reshape(ss, 0, NULL) : NULL;
    ts_release(g32), ts_release(c), ts_release(a), ts_release(b);
    ts_release(ss);
    return r;
}

/* The norm and the coefficient stay on the device as scalar tensors (no
 * branch on the norm, as torch does), so only reading them syncs. */
ts_tensor *ts_grad_norm(ts_tensor *const *params, int n) {
    ts_ctx *ctx = NULL;
    for (int i = 0; i < n && params && !ctx; i++)
        if (params[i] && ts_grad(params[i]))
            ctx = ts_tensor_ctx(params[i]);
    if (!ctx)
        return NULL;
    bool old = ts_set_grad_enabled(ctx, false);
    ts_tensor *acc = NULL; /* sum of squares over every grad, () f32 */
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        ts_tensor *g = params[i] ? ts_grad(params[i]) : NULL;
        if (!g)
            continue;
        ts_tensor *ss = sum_squares(g);
        ts_tensor *next = !ss ? NULL : acc ? ts_add(acc, ss) : ts_retain(ss);
        ts_release(ss), ts_release(acc);
        acc = next;
        ok = acc != NULL;
    }
    ts_tensor *total = acc ? ts_sqrt(acc) : NULL;
    ts_release(acc);
    ts_set_grad_enabled(ctx, old);
    return total;
}

ts_tensor *ts_clip_coef(ts_tensor *norm, double max_norm) {
    if (!norm)
        return NULL;
    ts_ctx *ctx = ts_tensor_ctx(norm);
    bool old = ts_set_grad_enabled(ctx, false);
    /* coef = min(max_norm / (total + 1e-6), 1) */
    ts_tensor *den = ts_add_scalar(norm, 1e-6);
    ts_tensor *inv = den ? ts_pow_scalar(den, -1.0) : NULL;
    ts_tensor *c = inv ? ts_mul_scalar(inv, max_norm) : NULL;
    ts_tensor *coef = c ? min_one(c) : NULL;
    ts_release(den), ts_release(inv), ts_release(c);
    ts_set_grad_enabled(ctx, old);
    return coef;
}

ts_status ts_clip_grad_norm(ts_tensor *const *params, int n, double max_norm,
                            double *total_norm) {
    if (total_norm)
        *total_norm = 0.0;
    if (n < 0 || (n > 0 && !params))
        return TS_ERR_INVALID_ARG;
    ts_ctx *ctx = NULL;
    for (int i = 0; i < n && !ctx; i++)
        if (params[i] && ts_grad(params[i]))
            ctx = ts_tensor_ctx(params[i]);
    if (!ctx)
        return TS_OK; /* no gradients: norm 0, nothing to scale */
    bool old = ts_set_grad_enabled(ctx, false);
    ts_tensor *total = ts_grad_norm(params, n);
    ts_tensor *coef = ts_clip_coef(total, max_norm);
    ts_status s = coef ? TS_OK : ts_ctx_status(ctx);
    for (int i = 0; s == TS_OK && i < n; i++) {
        ts_tensor *g = params[i] ? ts_grad(params[i]) : NULL;
        if (!g)
            continue;
        ts_dtype dt = ts_tensor_dtype(g);
        ts_tensor *cc = dt == TS_F32 ? ts_retain(coef) : ts_cast(coef, dt);
        ts_tensor *sc = ts_mul(g, cc);
        ts_release(cc);
        s = sc ? ts_copy_(g, sc) : ts_ctx_status(ctx);
        ts_release(sc);
    }
    if (s == TS_OK && total_norm)
        s = ts_item(total, total_norm);
    ts_release(total), ts_release(coef);
    ts_set_grad_enabled(ctx, old);
    return s;
}

double ts_lr_cosine_warmup(int64_t step, int64_t warmup, int64_t total_steps,
                           double max_lr, double min_lr) {
    const double pi = 3.14159265358979323846;
    if (step < 0)
        step = 0;
    if (step < warmup)
        return max_lr * (double)step / (double)warmup;
    if (step >= total_steps)
        return min_lr;
    double progress = (double)(step - warmup) / (double)(total_steps - warmup);
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + cos(pi * progress));
}

ts_status ts_adamw_step_clipped(ts_adamw *a, double max_norm,
                                double *total_norm) {
    if (total_norm)
        *total_norm = 0.0;
    if (!a)
        return TS_ERR_INVALID_ARG;
    ts_tensor *norm = ts_grad_norm(a->params, a->n);
    if (!norm) /* no gradient at all, or an error */
        return ts_ctx_status(a->ctx);
    ts_tensor *coef = ts_clip_coef(norm, max_norm);
    ts_status s = coef ? ts_adamw_step_scaled(a, coef) : ts_ctx_status(a->ctx);
    if (s == TS_OK && total_norm) /* read after the update is recorded */
        s = ts_item(norm, total_norm);
    ts_release(norm), ts_release(coef);
    return s;
}
