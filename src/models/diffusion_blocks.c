/* diffusion_blocks.c — the pieces the UNet and the VAE share
 * (diffusion_blocks.h): a parameter loader that keeps what it fetched,
 * ResnetBlock2D, Downsample2D and Upsample2D as Diffusers defines them
 * (resnet.py), built from the public ops. Owns no model. */
#include "diffusion_blocks.h"

#include "tessera_nn.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void dz_params_free(dz_params *p) {
    for (int k = 0; k < p->n; k++)
        ts_release(p->t[k]);
    free(p->t);
    p->t = NULL;
    p->n = p->cap = 0;
}

static ts_tensor *keep(dz_loader *L, ts_tensor *t) {
    if (!t) {
        L->failed = true;
        return NULL;
    }
    dz_params *p = L->owned;
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        ts_tensor **nt = realloc(p->t, sizeof *nt * (size_t)cap);
        if (!nt) {
            ts_release(t);
            dz_fail(L, TS_ERR_OOM, "%s: out of memory", L->c->dir);
            return NULL;
        }
        p->t = nt, p->cap = cap;
    }
    return p->t[p->n++] = t;
}

static ts_tensor *getv(dz_loader *L, int nd, const int64_t *shape,
                       const char *fmt, va_list ap) {
    if (L->failed)
        return NULL;
    char name[512];
    if (vsnprintf(name, sizeof name, fmt, ap) >= (int)sizeof name) {
        dz_fail(L, TS_ERR_INVALID_ARG, "tensor name too long: %s", name);
        return NULL;
    }
    return keep(L, dz_param(L->c, nd, shape, "%s", name));
}

ts_tensor *dz_get(dz_loader *L, int nd, const int64_t *shape, const char *fmt,
                  ...) {
    va_list ap;
    va_start(ap, fmt);
    ts_tensor *t = getv(L, nd, shape, fmt, ap);
    va_end(ap);
    return t;
}

ts_tensor *dz_vec(dz_loader *L, int64_t n, const char *fmt, ...) {
    int64_t sh[1] = {n};
    va_list ap;
    va_start(ap, fmt);
    ts_tensor *t = getv(L, 1, sh, fmt, ap);
    va_end(ap);
    return t;
}

ts_tensor *dz_mat(dz_loader *L, int64_t o, int64_t i, const char *fmt, ...) {
    int64_t sh[2] = {o, i};
    va_list ap;
    va_start(ap, fmt);
    ts_tensor *t = getv(L, 2, sh, fmt, ap);
    va_end(ap);
    return t;
}

ts_tensor *dz_kernel(dz_loader *L, int64_t o, int64_t i, int64_t k,
                     const char *fmt, ...) {
    int64_t sh[4] = {o, i, k, k};
    va_list ap;
    va_start(ap, fmt);
    ts_tensor *t = getv(L, 4, sh, fmt, ap);
    va_end(ap);
    return t;
}

bool dz_fail(dz_loader *L, ts_status s, const char *fmt, ...) {
    if (!L->failed) {
        char msg[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        ts_set_error(L->c->ctx, s, "%s", msg);
    }
    L->failed = true;
    return false;
}

bool dz_check_groups(dz_loader *L, int64_t groups, int64_t channels,
                     const char *key, const char *norm_name) {
    if (groups > 0 && channels % groups == 0)
        return true;
    return dz_fail(L, TS_ERR_INVALID_ARG,
                   "%s: \"%s\" is %lld, which does not divide the %lld "
                   "channels of %s",
                   L->c->config_path, key, (long long)groups,
                   (long long)channels, norm_name);
}

void dz_resnet_load(dz_loader *L, dz_resnet *r, const char *p, int64_t cin,
                    int64_t cout, int64_t temb, int64_t groups, double eps,
                    double out_scale) {
    char n1[300], n2[300];
    snprintf(n1, sizeof n1, "%s.norm1", p);
    snprintf(n2, sizeof n2, "%s.norm2", p);
    dz_check_groups(L, groups, cin, "norm_num_groups", n1);
    dz_check_groups(L, groups, cout, "norm_num_groups", n2);
    r->groups = groups, r->eps = eps, r->out_scale = out_scale;
    r->norm1_w = dz_vec(L, cin, "%s.norm1.weight", p);
    r->norm1_b = dz_vec(L, cin, "%s.norm1.bias", p);
    r->conv1_w = dz_kernel(L, cout, cin, 3, "%s.conv1.weight", p);
    r->conv1_b = dz_vec(L, cout, "%s.conv1.bias", p);
    if (temb > 0) {
        r->temb_w = dz_mat(L, cout, temb, "%s.time_emb_proj.weight", p);
        r->temb_b = dz_vec(L, cout, "%s.time_emb_proj.bias", p);
    }
    r->norm2_w = dz_vec(L, cout, "%s.norm2.weight", p);
    r->norm2_b = dz_vec(L, cout, "%s.norm2.bias", p);
    r->conv2_w = dz_kernel(L, cout, cout, 3, "%s.conv2.weight", p);
    r->conv2_b = dz_vec(L, cout, "%s.conv2.bias", p);
    if (cin != cout) {
        r->short_w = dz_kernel(L, cout, cin, 1, "%s.conv_shortcut.weight", p);
        r->short_b = dz_vec(L, cout, "%s.conv_shortcut.bias", p);
    }
}

ts_tensor *dz_norm_silu(ts_tensor *x, int64_t groups, ts_tensor *w,
                        ts_tensor *b, double eps) {
    ts_tensor *n = ts_group_norm(x, groups, w, b, eps);
    ts_tensor *a = ts_silu(n);
    ts_release(n);
    return a;
}

ts_tensor *dz_resnet_forward(const dz_resnet *r, ts_tensor *x,
                             ts_tensor *temb_act) {
    if (!x)
        return NULL;
    ts_tensor *a = dz_norm_silu(x, r->groups, r->norm1_w, r->norm1_b, r->eps);
    ts_tensor *h = dz_conv(a, r->conv1_w, r->conv1_b, 1, 1);
    ts_release(a);
    if (r->temb_w && temb_act) {
        /* (B, temb) -> (B, cout, 1, 1), added over the positions */
        ts_tensor *t = ts_linear(temb_act, r->temb_w, r->temb_b);
        int64_t sh[4] = {ts_tensor_dim(x, 0), -1, 1, 1};
        ts_tensor *t4 = t ? ts_reshape(t, 4, sh) : NULL;
        ts_tensor *s = ts_add(h, t4);
        ts_release(t), ts_release(t4), ts_release(h);
        h = s;
    }
    a = dz_norm_silu(h, r->groups, r->norm2_w, r->norm2_b, r->eps);
    ts_release(h);
    h = dz_conv(a, r->conv2_w, r->conv2_b, 1, 1);
    ts_release(a);
    ts_tensor *sc =
        r->short_w ? dz_conv(x, r->short_w, r->short_b, 1, 0) : ts_retain(x);
    ts_tensor *out = ts_add(sc, h);
    ts_release(sc), ts_release(h);
    if (out && r->out_scale != 1.0) {
        ts_tensor *o = ts_mul_scalar(out, 1.0 / r->out_scale);
        ts_release(out);
        out = o;
    }
    return out;
}

ts_tensor *dz_downsample(ts_tensor *x, ts_tensor *w, ts_tensor *b, int pad) {
    ts_conv2d_opts o = {.stride_h = 2,
                        .stride_w = 2,
                        .pad_top = pad,
                        .pad_bottom = pad ? pad : 1,
                        .pad_left = pad,
                        .pad_right = pad ? pad : 1};
    return ts_conv2d(x, w, b, &o);
}

ts_tensor *dz_upsample(ts_tensor *x, ts_tensor *w, ts_tensor *b) {
    ts_tensor *u = ts_upsample_nearest2d(x, 2, 2);
    ts_tensor *y = dz_conv(u, w, b, 1, 1);
    ts_release(u);
    return y;
}
