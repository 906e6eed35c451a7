/* diffusion_load.c — a Diffusers component folder opened and read
 * (diffusion_internal.h): config values by key, parameters by name with
 * their shapes checked, and the layers the components share. Owns no
 * model; the components (unet.c, vae.c, clip_text.c, dit.c) own theirs. */
#include "diffusion_internal.h"

#include "tessera_nn.h"

#include "core/core.h" /* ts_shape_equal */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

ts_status dz_open(ts_ctx *ctx, const char *dir, const char *class_name,
                  const ts_component_opts *opts, dz_comp *c) {
    memset(c, 0, sizeof *c);
    c->ctx = ctx;
    c->dtype = opts && opts->dtype == TS_BF16 ? TS_BF16 : TS_F32;
    if (opts && opts->dtype != TS_F32 && opts->dtype != TS_BF16)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "%s: weights can be kept in f32 or bf16, not %s",
                            dir, ts_dtype_name(opts->dtype));
    c->device = opts && opts->set ? opts->device : ts_get_device(ctx);
    if (snprintf(c->dir, sizeof c->dir, "%s", dir) >= (int)sizeof c->dir)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "path too long: %s", dir);
    snprintf(c->config_path, sizeof c->config_path, "%s/config.json", dir);
    if (!is_file(c->config_path))
        return ts_set_error(ctx, TS_ERR_IO, "%s: no config.json in %s",
                            class_name ? class_name : "component", dir);
    json_error_t je;
    c->config = json_load_file(c->config_path, JSON_REJECT_DUPLICATES, &je);
    if (!c->config || !json_is_object(c->config)) {
        ts_status s = ts_set_error(ctx, TS_ERR_INVALID_ARG, "%s: line %d: %s",
                                   c->config_path, je.line,
                                   c->config ? "not a JSON object" : je.text);
        dz_close(c);
        return s;
    }
    if (class_name) {
        const char *cls =
            json_string_value(json_object_get(c->config, "_class_name"));
        json_t *arch = json_object_get(c->config, "architectures");
        if (!cls && json_is_array(arch))
            cls = json_string_value(json_array_get(arch, 0));
        if (cls && strcmp(cls, class_name)) {
            ts_status s =
                ts_set_error(ctx, TS_ERR_INVALID_ARG,
                             "%s: _class_name is \"%s\", expected \"%s\"",
                             c->config_path, cls, class_name);
            dz_close(c);
            return s;
        }
    }
    const char *names[] = {"diffusion_pytorch_model.safetensors",
                           "model.safetensors"};
    for (int k = 0; k < 2 && !c->weights_path[0]; k++) {
        char p[DZ_PATH_LEN];
        int len = snprintf(p, sizeof p, "%s/%s", dir, names[k]);
        if (len > 0 && len < (int)sizeof p && is_file(p))
            memcpy(c->weights_path, p, (size_t)len + 1);
    }
    if (!c->weights_path[0]) {
        ts_status s = ts_set_error(
            ctx, TS_ERR_IO,
            "%s: no diffusion_pytorch_model.safetensors or model.safetensors",
            dir);
        dz_close(c);
        return s;
    }
    ts_status s = ts_safetensors_open(ctx, c->weights_path, &c->st);
    if (s)
        dz_close(c);
    return s;
}

void dz_close(dz_comp *c) {
    if (c->st)
        ts_safetensors_close(c->st);
    if (c->config)
        json_decref(c->config);
    c->st = NULL;
    c->config = NULL;
}

static json_t *value(dz_comp *c, const char *key) {
    json_t *v = json_object_get(c->config, key);
    return v && !json_is_null(v) ? v : NULL;
}

static bool wrong_type(dz_comp *c, const char *key, const char *want) {
    ts_set_error(c->ctx, TS_ERR_INVALID_ARG, "%s: \"%s\" should be %s",
                 c->config_path, key, want);
    return false;
}

bool dz_int(dz_comp *c, const char *key, int64_t def, int64_t *out) {
    json_t *v = value(c, key);
    if (!v)
        return *out = def, true;
    if (!json_is_integer(v))
        return wrong_type(c, key, "an integer");
    *out = (int64_t)json_integer_value(v);
    return true;
}

bool dz_num(dz_comp *c, const char *key, double def, double *out) {
    json_t *v = value(c, key);
    if (!v)
        return *out = def, true;
    if (!json_is_number(v))
        return wrong_type(c, key, "a number");
    *out = json_number_value(v);
    return true;
}

bool dz_bool(dz_comp *c, const char *key, bool def, bool *out) {
    json_t *v = value(c, key);
    if (!v)
        return *out = def, true;
    if (!json_is_boolean(v))
        return wrong_type(c, key, "true or false");
    *out = json_is_true(v);
    return true;
}

bool dz_str(dz_comp *c, const char *key, const char *def, char *out,
            size_t cap) {
    json_t *v = value(c, key);
    const char *s = v ? json_string_value(v) : def;
    if (v && !s)
        return wrong_type(c, key, "a string");
    if (!s) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG, "%s: \"%s\" is missing",
                     c->config_path, key);
        return false;
    }
    if (strlen(s) >= cap) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG, "%s: \"%s\" is too long",
                     c->config_path, key);
        return false;
    }
    memcpy(out, s, strlen(s) + 1);
    return true;
}

int dz_int_list(dz_comp *c, const char *key, int n_expect, int64_t *out) {
    json_t *v = value(c, key);
    if (v && json_is_integer(v) && n_expect > 0) {
        for (int k = 0; k < n_expect; k++)
            out[k] = (int64_t)json_integer_value(v);
        return n_expect;
    }
    if (!v || !json_is_array(v)) {
        wrong_type(c, key, "a list of integers");
        return -1;
    }
    size_t n = json_array_size(v);
    if (n == 0 || n > DZ_MAX_ARRAY) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                     "%s: \"%s\" has %zu entries (1 to %d supported)",
                     c->config_path, key, n, DZ_MAX_ARRAY);
        return -1;
    }
    for (size_t k = 0; k < n; k++) {
        json_t *e = json_array_get(v, k);
        if (!json_is_integer(e)) {
            wrong_type(c, key, "a list of integers");
            return -1;
        }
        out[k] = (int64_t)json_integer_value(e);
    }
    return (int)n;
}

int dz_str_list(dz_comp *c, const char *key, char (*out)[64]) {
    json_t *v = value(c, key);
    if (!v || !json_is_array(v)) {
        wrong_type(c, key, "a list of strings");
        return -1;
    }
    size_t n = json_array_size(v);
    if (n == 0 || n > DZ_MAX_ARRAY) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                     "%s: \"%s\" has %zu entries (1 to %d supported)",
                     c->config_path, key, n, DZ_MAX_ARRAY);
        return -1;
    }
    for (size_t k = 0; k < n; k++) {
        const char *s = json_string_value(json_array_get(v, k));
        if (!s || strlen(s) >= 64) {
            wrong_type(c, key, "a list of strings");
            return -1;
        }
        memcpy(out[k], s, strlen(s) + 1);
    }
    return (int)n;
}

static void shape_str(int nd, const int64_t *sh, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "(");
    for (int k = 0; k < nd && o < cap; k++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", k ? ", " : "",
                              (long long)sh[k]);
    if (o < cap)
        snprintf(buf + o, cap - o, ")");
}

static ts_tensor *fetch(dz_comp *c, bool required, int ndim,
                        const int64_t *shape, const char *name) {
    ts_dtype fdt;
    int fnd;
    int64_t fsh[TS_MAX_DIMS];
    if (!ts_safetensors_shape(c->st, name, &fdt, &fnd, fsh)) {
        if (required)
            ts_set_error(c->ctx, TS_ERR_INVALID_ARG, "%s: tensor %s is missing",
                         c->weights_path, name);
        return NULL;
    }
    if (!ts_shape_equal(fnd, fsh, ndim, shape)) {
        char a[160], b[160];
        shape_str(fnd, fsh, a, sizeof a);
        shape_str(ndim, shape, b, sizeof b);
        ts_set_error(c->ctx, TS_ERR_SHAPE,
                     "%s: tensor %s has shape %s, the config (%s) implies %s",
                     c->weights_path, name, a, c->config_path, b);
        return NULL;
    }
    if (!ts_dtype_is_float(fdt)) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                     "%s: tensor %s is %s, expected a float type",
                     c->weights_path, name, ts_dtype_name(fdt));
        return NULL;
    }
    if (ts_safetensors_check_finite(c->st, name))
        return NULL;
    ts_tensor *t = ts_safetensors_get(c->st, name);
    if (!t)
        return NULL;
    ts_dtype want = ndim >= 2 ? c->dtype : TS_F32;
    ts_tensor *u = t;
    if (fdt != want || !ts_device_equal(c->device, ts_tensor_device(t))) {
        /* a private copy in the wanted dtype: the mapped file stays read
         * only, and training may update the copy */
        ts_tensor *cast = fdt != want ? ts_cast(t, want) : ts_copy(t);
        ts_release(t);
        if (!cast)
            return NULL;
        u = ts_to_device(cast, c->device);
        ts_release(cast);
        if (!u)
            return NULL;
    }
    c->bytes += (size_t)ts_dtype_nbytes(want, ts_tensor_numel(u));
    return u;
}

static ts_tensor *fetchv(dz_comp *c, bool required, int ndim,
                         const int64_t *shape, const char *fmt, va_list ap) {
    char name[512];
    if (vsnprintf(name, sizeof name, fmt, ap) >= (int)sizeof name) {
        ts_set_error(c->ctx, TS_ERR_INVALID_ARG, "tensor name too long: %s",
                     name);
        return NULL;
    }
    return fetch(c, required, ndim, shape, name);
}

ts_tensor *dz_param(dz_comp *c, int ndim, const int64_t *shape, const char *fmt,
                    ...) {
    va_list ap;
    va_start(ap, fmt);
    ts_tensor *t = fetchv(c, true, ndim, shape, fmt, ap);
    va_end(ap);
    return t;
}

ts_tensor *dz_param_opt(dz_comp *c, int ndim, const int64_t *shape,
                        const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ts_tensor *t = fetchv(c, false, ndim, shape, fmt, ap);
    va_end(ap);
    return t;
}

bool dz_has(dz_comp *c, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return n < (int)sizeof name && ts_safetensors_find(c->st, name) >= 0;
}

ts_tensor *dz_conv(ts_tensor *x, ts_tensor *w, ts_tensor *b, int stride,
                   int pad) {
    ts_conv2d_opts o = {.stride_h = stride,
                        .stride_w = stride,
                        .pad_top = pad,
                        .pad_bottom = pad,
                        .pad_left = pad,
                        .pad_right = pad};
    return ts_conv2d(x, w, b, &o);
}

ts_tensor *dz_timestep_embedding(ts_tensor *t, int64_t dim,
                                 bool flip_sin_to_cos, double shift,
                                 double scale, double max_period,
                                 ts_device dev) {
    if (!t)
        return NULL;
    ts_ctx *ctx = ts_tensor_ctx(t);
    int64_t B = ts_tensor_numel(t), half = dim / 2;
    float *tv = malloc(sizeof(float) * (size_t)(B + 1));
    float *e = calloc((size_t)(B * dim + 1), sizeof(float));
    ts_tensor *out = NULL;
    if (!tv || !e) {
        ts_set_error(ctx, TS_ERR_OOM, "timestep embedding: out of memory");
        goto done;
    }
    if (ts_tensor_read(t, tv, TS_F32))
        goto done;
    for (int64_t b = 0; b < B; b++)
        for (int64_t k = 0; k < half; k++) {
            /* as torch computes it, in f32: exp(-ln(P) * k / (half - s)) */
            float ex = (float)(-log(max_period)) * (float)k;
            ex = ex / (float)((double)half - shift);
            float a = tv[b] * expf(ex) * (float)scale;
            float s = sinf(a), co = cosf(a);
            float *row = e + b * dim;
            row[k] = flip_sin_to_cos ? co : s;
            row[half + k] = flip_sin_to_cos ? s : co;
        }
    int64_t shape[2] = {B, dim};
    ts_tensor *h = ts_from_data(ctx, TS_F32, 2, shape, e);
    out = h ? ts_to_device(h, dev) : NULL;
    ts_release(h);
done:
    free(tv), free(e);
    return out;
}

/* x (B, T, C) -> (B, heads, T, C / heads) */
static ts_tensor *split_heads(ts_tensor *x, int64_t heads) {
    const int64_t *s = ts_tensor_shape(x);
    int64_t sh[4] = {s[0], s[1], heads, s[2] / heads};
    ts_tensor *r = ts_reshape(x, 4, sh);
    ts_tensor *p = ts_transpose(r, 1, 2);
    ts_release(r);
    return p;
}

ts_tensor *dz_attention(ts_tensor *x, ts_tensor *ctx_, int64_t heads,
                        ts_tensor *wq, ts_tensor *bq, ts_tensor *wk,
                        ts_tensor *bk, ts_tensor *wv, ts_tensor *bv,
                        ts_tensor *wo, ts_tensor *bo) {
    if (!x)
        return NULL;
    ts_tensor *kv = ctx_ ? ctx_ : x;
    ts_tensor *q = ts_linear(x, wq, bq), *k = ts_linear(kv, wk, bk),
              *v = ts_linear(kv, wv, bv);
    ts_tensor *qh = q ? split_heads(q, heads) : NULL;
    ts_tensor *kh = k ? split_heads(k, heads) : NULL;
    ts_tensor *vh = v ? split_heads(v, heads) : NULL;
    ts_release(q), ts_release(k), ts_release(v);
    int64_t D = ts_tensor_dim(x, 2) / heads;
    ts_tensor *o = ts_attention(qh, kh, vh, NULL, false, 1.0 / sqrt((double)D));
    ts_release(qh), ts_release(kh), ts_release(vh);
    ts_tensor *ot = o ? ts_transpose(o, 1, 2) : NULL; /* (B, T, H, D) */
    ts_release(o);
    int64_t sh[3] = {ts_tensor_dim(x, 0), ts_tensor_dim(x, 1),
                     ts_tensor_dim(x, 2)};
    ts_tensor *oc = ot ? ts_contiguous(ot) : NULL;
    ts_release(ot);
    ts_tensor *of = oc ? ts_reshape(oc, 3, sh) : NULL;
    ts_release(oc);
    ts_tensor *y = of ? ts_linear(of, wo, bo) : NULL;
    ts_release(of);
    return y;
}
