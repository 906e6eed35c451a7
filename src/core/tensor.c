/* tensor.c — tensor headers and reference-counted storage: creation,
 * inspection, element access and the raw strided copy used by read-out.
 * Owns ts_tensor and ts_storage lifetimes; builds no nodes. */
#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The product of the sizes; -1 when a size is negative or the product
 * passes INT64_MAX (checked, never a signed overflow). */
int64_t ts_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    bool zero = false, over = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        zero |= shape[i] == 0;
        over |= !zero && __builtin_mul_overflow(n, shape[i], &n);
    }
    return zero ? 0 : over ? -1 : n;
}

/* numel x the dtype's size in bytes, when both fit int64 (and size_t) */
static bool shape_bytes(int ndim, const int64_t *shape, ts_dtype dt,
                        size_t *bytes) {
    int64_t n = ts_shape_numel(ndim, shape), b;
    if (n < 0 || (b = ts_dtype_nbytes(dt, n)) < 0 || (uint64_t)b > SIZE_MAX)
        return false;
    *bytes = (size_t)b;
    return true;
}

void ts_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        /* saturates on shapes no tensor can have (creation refuses them) */
        if (__builtin_mul_overflow(s, shape[i] > 0 ? shape[i] : 1, &s))
            s = INT64_MAX;
    }
}

bool ts_shape_equal(int na, const int64_t *a, int nb, const int64_t *b) {
    if (na != nb)
        return false;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i])
            return false;
    return true;
}

const char *ts_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t p = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && p < n; i++)
        p += (size_t)snprintf(buf + p, n - p, "%s%lld", i ? ", " : "",
                              (long long)shape[i]);
    if (p < n)
        snprintf(buf + p, n - p, "]");
    return buf;
}

int ts_norm_dim(int dim, int ndim) {
    if (dim < 0)
        dim += ndim;
    return dim >= 0 && dim < ndim ? dim : -1;
}

/* s's bytes join its device's memory stats (released with it) */
static void count_on_device(ts_storage *s, size_t bytes) {
    ts_device_stats *ds = &s->ctx->dev_stats[s->device.kind][s->device.index];
    s->counted = bytes;
    ds->bytes_in_use += bytes;
    if (ds->bytes_in_use > ds->peak_bytes_in_use)
        ds->peak_bytes_in_use = ds->bytes_in_use;
}

static ts_storage *storage_new(ts_ctx *ctx, size_t bytes) {
    ts_storage *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    const ts_backend *be = ts_backend_of(ctx->device.kind);
    s->data = be ? be->alloc(ctx, ctx->device.index, bytes) : NULL;
    if (!s->data) {
        free(s);
        return NULL;
    }
    s->refcount = 1;
    s->bytes = bytes;
    s->ctx = ctx;
    s->device = ctx->device;
    count_on_device(s, bytes);
    return s;
}

void ts_storage_retain(ts_storage *s) {
    if (s)
        s->refcount++;
}

void ts_storage_release(ts_storage *s) {
    if (!s || --s->refcount > 0)
        return;
    if (!s->external && s->data)
        ts_storage_backend(s)->free(s->ctx, s->device.index, s->data, s->bytes);
    s->ctx->dev_stats[s->device.kind][s->device.index].bytes_in_use -=
        s->counted;
    if (s->owner_release)
        s->owner_release(s->owner);
    free(s->shadow);
    ts_storage_drop_packed(s);
    free(s);
}

/* A contiguous tensor header over a new storage object with no data yet
 * (the callers fill in where the data is); NULL + OOM error on failure. */
/* A block format holds whole blocks along its last dim. */
static bool blocks_whole(ts_ctx *ctx, ts_dtype dt, int ndim,
                         const int64_t *shape) {
    int64_t be = ts_dtype_block_elems(dt);
    if (be <= 1 || (ndim > 0 && shape[ndim - 1] % be == 0))
        return true;
    char sb[160];
    ts_set_error(ctx, TS_ERR_SHAPE,
                 "a %s tensor holds whole blocks of %lld along its last dim; "
                 "shape %s does not",
                 ts_dtype_name(dt), (long long)be,
                 ts_shape_str(ndim, shape, sb, sizeof sb));
    return false;
}

static ts_tensor *header_and_storage(ts_ctx *ctx, ts_dtype dt, int ndim,
                                     const int64_t *shape) {
    size_t bytes;
    if (!blocks_whole(ctx, dt, ndim, shape))
        return NULL;
    if (!shape_bytes(ndim, shape, dt, &bytes)) {
        char sb[160];
        ts_set_error(ctx, TS_ERR_RANGE,
                     "tensor of shape %s and dtype %s: its size overflows "
                     "64 bits",
                     ts_shape_str(ndim, shape, sb, sizeof sb),
                     ts_dtype_name(dt));
        return NULL;
    }
    ts_tensor *t = calloc(1, sizeof *t);
    ts_storage *s = calloc(1, sizeof *s);
    if (!t || !s) {
        free(t), free(s);
        ts_set_error(ctx, TS_ERR_OOM, "out of memory (tensor header)");
        return NULL;
    }
    s->refcount = 1;
    s->bytes = bytes;
    s->ctx = ctx;
    s->device = ctx->device;
    t->refcount = 1;
    t->ctx = ctx;
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim && d < TS_MAX_DIMS; d++)
        t->shape[d] = shape[d];
    ts_contiguous_strides(ndim, t->shape, t->strides);
    t->storage = s;
    return t;
}

ts_tensor *ts_tensor_wrap(ts_ctx *ctx, ts_dtype dt, int ndim,
                          const int64_t *shape, void *data, void *owner,
                          void (*owner_release)(void *)) {
    ts_tensor *t = header_and_storage(ctx, dt, ndim, shape);
    if (!t)
        return NULL;
    if (ctx->device.kind != TS_DEVICE_CPU) /* host memory: a host tensor */
        t->storage->device = (ts_device){TS_DEVICE_CPU, 0};
    t->storage->data = data;
    t->storage->external = true;
    count_on_device(t->storage, t->storage->bytes); /* e.g. mapped weights */
    t->storage->owner = owner;
    t->storage->owner_release = owner_release;
    return t;
}

#define storage_release ts_storage_release

ts_status ts_materialize(ts_tensor *t) {
    if (!t)
        return TS_ERR_INVALID_ARG;
    if (!t->storage->pending && !t->storage->pending_writes)
        return TS_OK;
    ts_status st = ts_sync(t->ctx);
    if (st == TS_OK && (t->storage->pending || t->storage->pending_writes))
        return ts_set_error(t->ctx, TS_ERR_STATE,
                            "compiled mode: a result read after its graph ran "
                            "was never computed");
    return st;
}

static ts_status fill_raw(ts_tensor *dst, double value);

static bool shape_valid(ts_ctx *ctx, const char *fn, int ndim,
                        const int64_t *shape) {
    if (ndim < 0 || ndim > TS_MAX_DIMS) {
        ts_set_error(ctx, TS_ERR_RANGE, "%s: %d dims (at most %d)", fn, ndim,
                     TS_MAX_DIMS);
        return false;
    }
    if (ndim > 0 && !shape) {
        ts_set_error(ctx, TS_ERR_INVALID_ARG, "%s: shape is NULL", fn);
        return false;
    }
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) {
            ts_set_error(ctx, TS_ERR_SHAPE, "%s: dim %d has size %lld", fn, i,
                         (long long)shape[i]);
            return false;
        }
    return true;
}

ts_tensor *ts_tensor_new(ts_ctx *ctx, ts_dtype dt, int ndim,
                         const int64_t *shape) {
    if (!ctx)
        return NULL;
    if ((unsigned)dt >= TS_DTYPE_COUNT) {
        ts_set_error(ctx, TS_ERR_DTYPE, "unknown dtype %d", (int)dt);
        return NULL;
    }
    if (!shape_valid(ctx, "ts_empty", ndim, shape) ||
        !blocks_whole(ctx, dt, ndim, shape))
        return NULL;
    size_t bytes;
    if (!shape_bytes(ndim, shape, dt, &bytes)) {
        char sb[160];
        ts_set_error(ctx, TS_ERR_RANGE,
                     "ts_empty: shape %s of %s: its size overflows 64 bits",
                     ts_shape_str(ndim, shape, sb, sizeof sb),
                     ts_dtype_name(dt));
        return NULL;
    }
    ts_tensor *t = calloc(1, sizeof *t);
    if (t)
        t->storage = storage_new(ctx, bytes);
    if (!t || !t->storage) {
        free(t);
        if (ctx->device.kind == TS_DEVICE_CPU || ctx->status == TS_OK)
            ts_set_error(ctx, TS_ERR_OOM, "out of memory allocating %zu bytes",
                         bytes);
        return NULL;
    }
    t->refcount = 1;
    t->ctx = ctx;
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim)
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    ts_contiguous_strides(ndim, t->shape, t->strides);
    return t;
}

ts_tensor *ts_tensor_new_pending(ts_ctx *ctx, ts_dtype dt, int ndim,
                                 const int64_t *shape) {
    ts_tensor *t = header_and_storage(ctx, dt, ndim, shape);
    if (t)
        t->storage->pending = true;
    return t;
}

ts_tensor *ts_tensor_view_of(ts_tensor *base, int ndim, const int64_t *shape,
                             const int64_t *strides, int64_t offset) {
    ts_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        ts_set_error(base->ctx, TS_ERR_OOM, "out of memory (tensor header)");
        return NULL;
    }
    t->refcount = 1;
    t->ctx = base->ctx;
    t->dtype = base->dtype;
    t->ndim = ndim;
    if (ndim) {
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
        memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
    }
    t->offset = offset;
    t->storage = base->storage;
    t->storage->refcount++;
    return t;
}

ts_tensor *ts_empty(ts_ctx *ctx, ts_dtype dt, int ndim, const int64_t *shape) {
    return ts_tensor_new(ctx, dt, ndim, shape);
}

ts_tensor *ts_full(ts_ctx *ctx, ts_dtype dt, int ndim, const int64_t *shape,
                   double value) {
    ts_tensor *t = ts_tensor_new(ctx, dt, ndim, shape);
    if (t && fill_raw(t, value) != TS_OK) {
        ts_release(t);
        return NULL;
    }
    if (t) { /* the value as stored (rounded to dt) */
        char one[8];
        ts_store_f64(one, dt, value);
        t->storage->uniform = true;
        t->storage->uniform_value = ts_load_f64(one, dt);
    }
    return t;
}

ts_tensor *ts_zeros(ts_ctx *ctx, ts_dtype dt, int ndim, const int64_t *shape) {
    ts_tensor *t = ts_tensor_new(ctx, dt, ndim, shape);
    if (t && fill_raw(t, 0.0) != TS_OK) {
        ts_release(t);
        return NULL;
    }
    if (t) {
        t->storage->uniform = true;
        t->storage->uniform_value = 0;
    }
    return t;
}

ts_tensor *ts_scalar(ts_ctx *ctx, ts_dtype dt, double value) {
    return ts_full(ctx, dt, 0, NULL, value);
}

ts_tensor *ts_from_data(ts_ctx *ctx, ts_dtype dt, int ndim,
                        const int64_t *shape, const void *data) {
    if (ctx && !data) {
        ts_set_error(ctx, TS_ERR_INVALID_ARG, "ts_from_data: data is NULL");
        return NULL;
    }
    ts_tensor *t = ts_tensor_new(ctx, dt, ndim, shape);
    if (t && ts_storage_backend(t->storage)
                     ->upload(ctx, t->storage->device.index, t->storage->data,
                              data, t->storage->bytes) != TS_OK) {
        ts_release(t);
        return NULL;
    }
    return t;
}

ts_tensor *ts_tensor_new_host(ts_ctx *ctx, ts_dtype dt, int ndim,
                              const int64_t *shape) {
    ts_device old = ctx->device;
    ctx->device = (ts_device){TS_DEVICE_CPU, 0};
    ts_tensor *t = ts_tensor_new(ctx, dt, ndim, shape);
    ctx->device = old;
    return t;
}

ts_tensor *ts_tensor_to_current(ts_ctx *ctx, ts_tensor *host) {
    if (!host || ts_device_equal(host->storage->device, ctx->device))
        return host;
    ts_tensor *t = ts_to_device(host, ctx->device);
    ts_release(host);
    return t;
}

ts_tensor *ts_host_copy(ts_tensor *t) {
    if (ts_storage_on_host(t->storage))
        return ts_retain(t);
    if (t->storage->shadow && ts_tensor_is_contiguous(t)) {
        ts_tensor *h = ts_tensor_new_host(t->ctx, t->dtype, t->ndim, t->shape);
        if (h)
            memcpy(h->storage->data,
                   (char *)t->storage->shadow +
                       (size_t)t->offset * ts_dtype_size(t->dtype),
                   h->storage->bytes);
        return h;
    }
    return ts_to_device(t, (ts_device){TS_DEVICE_CPU, 0});
}

ts_tensor *ts_arange(ts_ctx *ctx, ts_dtype dt, double start, double end,
                     double step) {
    if (!ctx)
        return NULL;
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step)) {
        ts_set_error(ctx, TS_ERR_RANGE,
                     "ts_arange: start %g, end %g, step %g (step must be "
                     "nonzero, all finite)",
                     start, end, step);
        return NULL;
    }
    double count = ceil((end - start) / step);
    int64_t n = count > 0 ? (int64_t)count : 0;
    ts_tensor *t = ts_tensor_new_host(ctx, dt, 1, &n);
    if (!t)
        return NULL;
    size_t es = ts_dtype_size(dt);
    for (int64_t i = 0; i < n; i++)
        ts_store_f64((char *)t->storage->data + (size_t)i * es, dt,
                     start + (double)i * step);
    return ts_tensor_to_current(ctx, t);
}

ts_tensor *ts_retain(ts_tensor *t) {
    if (t)
        t->refcount++;
    return t;
}

void ts_release(ts_tensor *t) {
    if (!t || --t->refcount > 0)
        return;
    ts_release(t->grad);
    storage_release(t->storage);
    struct ts_node *fn = t->grad_fn;
    if (fn)
        ts_node_forget_out(fn, t);
    free(t);
    if (fn)
        ts_node_release(fn);
}

ts_ctx *ts_tensor_ctx(const ts_tensor *t) {
    return t ? t->ctx : NULL;
}
ts_dtype ts_tensor_dtype(const ts_tensor *t) {
    return t ? t->dtype : TS_F32;
}
int ts_tensor_ndim(const ts_tensor *t) {
    return t ? t->ndim : 0;
}
const int64_t *ts_tensor_shape(const ts_tensor *t) {
    return t ? t->shape : NULL;
}
const int64_t *ts_tensor_strides(const ts_tensor *t) {
    return t ? t->strides : NULL;
}

int64_t ts_tensor_dim(const ts_tensor *t, int dim) {
    if (!t)
        return -1;
    int d = ts_norm_dim(dim, t->ndim);
    return d < 0 ? -1 : t->shape[d];
}

int64_t ts_tensor_numel(const ts_tensor *t) {
    return t ? ts_shape_numel(t->ndim, t->shape) : 0;
}

bool ts_tensor_is_contiguous(const ts_tensor *t) {
    if (!t)
        return false;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s)
            return false;
        s *= t->shape[i];
    }
    return true;
}

ts_device ts_tensor_device(const ts_tensor *t) {
    ts_device d = {TS_DEVICE_CPU, 0};
    if (t)
        d = t->storage->device;
    return d;
}

bool ts_tensor_shares_storage(const ts_tensor *a, const ts_tensor *b) {
    return a && b && a->storage == b->storage;
}

void *ts_tensor_data(ts_tensor *t) {
    if (!t || ts_materialize(t) != TS_OK)
        return NULL;
    t->storage->uniform = false; /* the caller may write through it */
    ts_storage_drop_packed(t->storage);
    if (t->storage->device.kind != TS_DEVICE_CPU)
        return NULL;
    return ts_tensor_ptr(t);
}

ts_status ts_tensor_read(ts_tensor *t, void *dst, ts_dtype dst_dt) {
    if (!t)
        return TS_ERR_INVALID_ARG;
    if (!dst || (unsigned)dst_dt >= TS_DTYPE_COUNT)
        return ts_set_error(t->ctx, TS_ERR_INVALID_ARG,
                            "ts_tensor_read: NULL destination or bad dtype");
    if (ts_materialize(t) != TS_OK)
        return t->ctx->status;
    if (!ts_storage_on_host(t->storage)) { /* through a host copy */
        ts_tensor *h = ts_host_copy(t);
        ts_status st = h ? ts_tensor_read(h, dst, dst_dt) : t->ctx->status;
        ts_release(h);
        return st;
    }
    int64_t n = ts_tensor_numel(t);
    size_t es = ts_dtype_size(t->dtype), ds = ts_dtype_size(dst_dt);
    const char *base = ts_tensor_ptr(t);
    int64_t idx[TS_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++)
            off += idx[d] * t->strides[d];
        const char *src = base + off * (int64_t)es;
        char *out = (char *)dst + (size_t)i * ds;
        if (dst_dt == t->dtype)
            memcpy(out, src, es);
        else if (dst_dt == TS_I64 || dst_dt == TS_I32 || t->dtype == TS_I64 ||
                 t->dtype == TS_I32)
            ts_store_f64(out, dst_dt, ts_load_f64(src, t->dtype));
        else
            ts_store_f32(out, dst_dt, ts_load_f32(src, t->dtype));
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return TS_OK;
}

static ts_status element_ptr(ts_tensor *t, const int64_t *idx, char **p,
                             const char *fn) {
    if (!t)
        return TS_ERR_INVALID_ARG;
    if (ts_materialize(t) != TS_OK)
        return t->ctx->status;
    if (t->ndim > 0 && !idx)
        return ts_set_error(t->ctx, TS_ERR_INVALID_ARG, "%s: index is NULL",
                            fn);
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (idx[d] < 0 || idx[d] >= t->shape[d]) {
            char sb[128];
            return ts_set_error(
                t->ctx, TS_ERR_RANGE,
                "%s: index %lld out of range for dim %d of shape %s", fn,
                (long long)idx[d], d, ts_shape_str(t->ndim, t->shape, sb, 128));
        }
        off += idx[d] * t->strides[d];
    }
    *p = ts_tensor_ptr(t) + off * (int64_t)ts_dtype_size(t->dtype);
    return TS_OK;
}

/* one element of a device tensor, through a one-element view */
static ts_status device_element(ts_tensor *t, const int64_t *idx, double *get,
                                const double *set, const char *fn) {
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (!idx || idx[d] < 0 || idx[d] >= t->shape[d]) {
            char sb[128];
            return ts_set_error(
                t->ctx, TS_ERR_RANGE,
                "%s: index %lld out of range for dim %d of shape %s", fn,
                idx ? (long long)idx[d] : -1LL, d,
                ts_shape_str(t->ndim, t->shape, sb, 128));
        }
        off += idx[d] * t->strides[d];
    }
    ts_tensor *v = ts_tensor_view_of(t, 0, NULL, NULL, t->offset + off);
    if (!v)
        return t->ctx->status;
    ts_status st;
    if (set) {
        char one[8];
        ts_store_f64(one, t->dtype, *set);
        ts_storage_written(t->storage);
        st = ts_storage_backend(t->storage)
                 ->upload(t->ctx, t->storage->device.index, ts_tensor_ptr(v),
                          one, ts_dtype_size(t->dtype));
        t->storage->uniform = false;
    } else {
        char one[8];
        st = ts_tensor_read(v, one, t->dtype);
        if (st == TS_OK)
            *get = ts_load_f64(one, t->dtype);
    }
    ts_release(v);
    return st;
}

ts_status ts_get(ts_tensor *t, const int64_t *idx, double *out) {
    if (t && !ts_storage_on_host(t->storage)) {
        double v = 0;
        ts_status st = ts_materialize(t);
        if (st == TS_OK)
            st = device_element(t, idx, &v, NULL, "ts_get");
        if (st == TS_OK && out)
            *out = v;
        return st;
    }
    char *p;
    ts_status s = element_ptr(t, idx, &p, "ts_get");
    if (s == TS_OK && out)
        *out = ts_load_f64(p, t->dtype);
    return s;
}

ts_status ts_set(ts_tensor *t, const int64_t *idx, double value) {
    if (t && !ts_storage_on_host(t->storage)) {
        ts_status st = ts_materialize(t);
        return st == TS_OK ? device_element(t, idx, NULL, &value, "ts_set")
                           : st;
    }
    char *p;
    ts_status s = element_ptr(t, idx, &p, "ts_set");
    if (s == TS_OK) {
        ts_store_f64(p, t->dtype, value);
        t->storage->uniform = false;
        ts_storage_drop_packed(t->storage);
    }
    return s;
}

ts_status ts_item(ts_tensor *t, double *out) {
    if (!t)
        return TS_ERR_INVALID_ARG;
    if (ts_tensor_numel(t) != 1) {
        char sb[128];
        return ts_set_error(t->ctx, TS_ERR_SHAPE,
                            "ts_item: tensor of shape %s has %lld elements, "
                            "not one",
                            ts_shape_str(t->ndim, t->shape, sb, sizeof sb),
                            (long long)ts_tensor_numel(t));
    }
    int64_t zero[TS_MAX_DIMS] = {0};
    return ts_get(t, zero, out);
}

/* Writes value into every element of dst (materialized storage). */
static ts_status fill_raw(ts_tensor *dst, double value) {
    int64_t n = ts_tensor_numel(dst);
    size_t es = ts_dtype_size(dst->dtype);
    char one[8];
    ts_store_f64(one, dst->dtype, value);
    if (!ts_storage_on_host(dst->storage)) {
        ts_storage_written(dst->storage);
        if (ts_tensor_is_contiguous(dst))
            return ts_storage_backend(dst->storage)
                ->fill(dst->ctx, dst->storage->device.index, ts_tensor_ptr(dst),
                       (size_t)n, one, es);
        /* a strided view: a constant expanded over it, by the copy kernel */
        ts_tensor *v = ts_full(dst->ctx, dst->dtype, 0, NULL, value);
        ts_status st = v ? ts_copy_(dst, v) : dst->ctx->status;
        ts_release(v);
        return st;
    }
    char *base = ts_tensor_ptr(dst);
    int64_t idx[TS_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < dst->ndim; d++)
            off += idx[d] * dst->strides[d];
        memcpy(base + off * (int64_t)es, one, es);
        for (int d = dst->ndim - 1; d >= 0; d--) {
            if (++idx[d] < dst->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return TS_OK;
}

ts_status ts_fill_(ts_tensor *dst, double value) {
    if (!dst)
        return TS_ERR_INVALID_ARG;
    if (dst->ctx->mode == TS_MODE_COMPILED) { /* record as a copy */
        ts_tensor *v = ts_scalar(dst->ctx, dst->dtype, value);
        ts_status st = v ? ts_copy_(dst, v) : dst->ctx->status;
        ts_release(v);
        return st;
    }
    if (ts_materialize(dst) != TS_OK)
        return dst->ctx->status;
    dst->storage->uniform = false;
    ts_storage_drop_packed(dst->storage);
    return fill_raw(dst, value);
}

/* ---- autograd flags (the engine itself lives in src/graph) ---- */

ts_status ts_set_requires_grad(ts_tensor *t, bool on) {
    if (!t)
        return TS_ERR_INVALID_ARG;
    if (t->grad_fn)
        return ts_set_error(t->ctx, TS_ERR_STATE,
                            "ts_set_requires_grad: only leaf tensors (not "
                            "results of ops that track gradients) can change "
                            "requires_grad; use ts_detach first");
    if (on && !ts_dtype_is_float(t->dtype))
        return ts_set_error(t->ctx, TS_ERR_DTYPE,
                            "ts_set_requires_grad: dtype %s cannot require "
                            "gradients (float dtypes only)",
                            ts_dtype_name(t->dtype));
    t->requires_grad = on;
    return TS_OK;
}

bool ts_requires_grad(const ts_tensor *t) {
    return t && t->requires_grad;
}
bool ts_is_leaf(const ts_tensor *t) {
    return t && !t->grad_fn;
}
ts_tensor *ts_grad(const ts_tensor *t) {
    return t ? t->grad : NULL;
}

void ts_zero_grad(ts_tensor *t) {
    if (!t)
        return;
    ts_release(t->grad);
    t->grad = NULL;
}

ts_tensor *ts_detach(ts_tensor *t) {
    if (!t)
        return NULL;
    return ts_tensor_view_of(t, t->ndim, t->shape, t->strides, t->offset);
}
