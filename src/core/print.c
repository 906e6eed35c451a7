/* print.c — PyTorch-like text for a tensor, for eager debugging:
 *   tensor([[ 0.5000, -1.2500],
 *           [ 2.0000,  3.0000]], dtype=bf16)
 * Past 1000 elements every dim shows its first and last 3 entries. */
#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *buf;
    size_t len, cap;
    bool oom;
} strbuf;

static void sb_put(strbuf *sb, const char *s) {
    size_t n = strlen(s);
    if (sb->len + n + 1 > sb->cap) {
        size_t cap = (sb->cap ? sb->cap * 2 : 256) + n;
        char *p = realloc(sb->buf, cap);
        if (!p) {
            sb->oom = true;
            return;
        }
        sb->buf = p;
        sb->cap = cap;
    }
    memcpy(sb->buf + sb->len, s, n + 1);
    sb->len += n;
}

typedef struct {
    ts_tensor *t;
    bool summarize;
    bool sci;
    bool is_int;
    int width;
} print_opts;

static double elem(ts_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++)
        off += idx[d] * t->strides[d];
    return ts_load_f64(
        ts_tensor_ptr(t) + off * (int64_t)ts_dtype_size(t->dtype), t->dtype);
}

static void fmt_value(const print_opts *o, double v, char *out, size_t n) {
    if (o->is_int)
        snprintf(out, n, "%lld", (long long)v);
    else if (isnan(v))
        snprintf(out, n, "nan");
    else if (isinf(v))
        snprintf(out, n, v > 0 ? "inf" : "-inf");
    else if (o->sci)
        snprintf(out, n, "%.4e", v);
    else
        snprintf(out, n, "%.4f", v);
}

static void put_elem(strbuf *sb, const print_opts *o, double v) {
    char s[64], pad[72];
    fmt_value(o, v, s, sizeof s);
    int w = o->width - (int)strlen(s);
    snprintf(pad, sizeof pad, "%*s%s", w > 0 ? w : 0, "", s);
    sb_put(sb, pad);
}

static void put_dim(strbuf *sb, const print_opts *o, int64_t *idx, int d,
                    int indent) {
    ts_tensor *t = o->t;
    sb_put(sb, "[");
    int64_t n = t->shape[d];
    bool cut = o->summarize && n > 6;
    for (int64_t i = 0; i < n; i++) {
        if (cut && i == 3) {
            i = n - 3;
            sb_put(sb, d == t->ndim - 1 ? "..., " : "...,\n");
            if (d != t->ndim - 1)
                for (int k = 0; k < indent + 1; k++)
                    sb_put(sb, " ");
        }
        idx[d] = i;
        if (d == t->ndim - 1)
            put_elem(sb, o, elem(t, idx));
        else
            put_dim(sb, o, idx, d + 1, indent + 1);
        if (i + 1 < n) {
            if (d == t->ndim - 1) {
                sb_put(sb, ", ");
            } else {
                sb_put(sb, ",");
                for (int k = d; k < t->ndim - 1; k++)
                    sb_put(sb, "\n");
                for (int k = 0; k < indent + 1; k++)
                    sb_put(sb, " ");
            }
        }
    }
    sb_put(sb, "]");
}

static char *host_string(ts_tensor *t);

/* a device tensor prints from a host copy, tagged with its device as
 * PyTorch tags it */
char *ts_to_string(ts_tensor *t) {
    if (!t || ts_materialize(t) != TS_OK)
        return NULL;
    if (ts_storage_on_host(t->storage))
        return host_string(t);
    ts_tensor *h = ts_host_copy(t);
    char *s = h ? host_string(h) : NULL;
    ts_release(h);
    char dev[16], *out = NULL;
    ts_device_name(t->storage->device, dev);
    size_t n = s ? strlen(s) + sizeof dev + 16 : 0;
    if (s && (out = malloc(n)) != NULL)
        snprintf(out, n, "%s, device='%s'", s, dev);
    free(s);
    if (!out && t->ctx->status == TS_OK)
        ts_set_error(t->ctx, TS_ERR_OOM, "ts_to_string: out of memory");
    return out;
}

static char *host_string(ts_tensor *t) {
    print_opts o = {.t = t};
    int64_t numel = ts_tensor_numel(t);
    o.summarize = numel > 1000;
    o.is_int = !ts_dtype_is_float(t->dtype);
    /* pick one format and width for all elements, as PyTorch does */
    double maxabs = 0, minabs = INFINITY;
    int64_t idx[TS_MAX_DIMS] = {0};
    for (int64_t i = 0; i < numel; i++) {
        double v = fabs(elem(t, idx));
        if (isfinite(v)) {
            if (v > maxabs)
                maxabs = v;
            if (v > 0 && v < minabs)
                minabs = v;
        }
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d])
                break;
            idx[d] = 0;
        }
    }
    o.sci = !o.is_int && (maxabs >= 1e8 || (minabs < 1e-4 && maxabs > 0));
    memset(idx, 0, sizeof idx);
    o.width = 0;
    for (int64_t i = 0; i < numel; i++) {
        char s[64];
        fmt_value(&o, elem(t, idx), s, sizeof s);
        if ((int)strlen(s) > o.width)
            o.width = (int)strlen(s);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d])
                break;
            idx[d] = 0;
        }
    }
    strbuf sb = {0};
    sb_put(&sb, "tensor(");
    memset(idx, 0, sizeof idx);
    if (t->ndim == 0)
        put_elem(&sb, &o, elem(t, idx));
    else if (numel == 0)
        sb_put(&sb, "[]");
    else
        put_dim(&sb, &o, idx, 0, 7);
    char tail[160], shp[128];
    snprintf(tail, sizeof tail, ", dtype=%s%s%s)", ts_dtype_name(t->dtype),
             numel == 0 || o.summarize ? ", shape=" : "",
             numel == 0 || o.summarize
                 ? ts_shape_str(t->ndim, t->shape, shp, sizeof shp)
                 : "");
    sb_put(&sb, tail);
    if (t->grad_fn)
        sb_put(&sb, " <grad_fn>");
    if (sb.oom) {
        free(sb.buf);
        ts_set_error(t->ctx, TS_ERR_OOM, "ts_to_string: out of memory");
        return NULL;
    }
    return sb.buf;
}

ts_status ts_print(ts_tensor *t, FILE *f) {
    if (!t || !f)
        return TS_ERR_INVALID_ARG;
    char *s = ts_to_string(t);
    if (!s)
        return TS_ERR_OOM;
    fprintf(f, "%s\n", s);
    free(s);
    return TS_OK;
}
