/* gguf_write.c — GGUF files written: metadata serialized as it is added,
 * tensors referenced until save, then v3 with alignment 32 (each tensor
 * padded to it, as llama.cpp writes) through a temporary file renamed over
 * the target. Owns the writer's buffers and its tensor references; the
 * reader is gguf.c's. */
#include "io/gguf_internal.h"

#include "core/core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    unsigned char *p;
    size_t n, cap;
    bool oom;
} bytes_buf;

static void put(bytes_buf *b, const void *src, size_t n) {
    if (b->oom || !n)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_le(bytes_buf *b, uint64_t v, int width) {
    unsigned char le[8];
    for (int i = 0; i < width; i++)
        le[i] = (unsigned char)(v >> (8 * i));
    put(b, le, (size_t)width);
}

static void put_str(bytes_buf *b, const char *s, size_t n) {
    put_le(b, n, 8);
    put(b, s, n);
}

typedef struct {
    char *name;
    ts_tensor *t;
    int type; /* ggml */
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes;
} wtensor;

struct ts_gguf_writer {
    ts_ctx *ctx;
    bytes_buf kv; /* every key-value, serialized */
    int64_t n_kv;
    char **keys;
    wtensor *t;
    int64_t n_t, cap_t;
};

ts_gguf_writer *ts_gguf_writer_new(ts_ctx *ctx) {
    if (!ctx)
        return NULL;
    ts_gguf_writer *w = calloc(1, sizeof *w);
    if (!w)
        ts_set_error(ctx, TS_ERR_OOM, "gguf writer: out of memory");
    else
        w->ctx = ctx;
    return w;
}

void ts_gguf_writer_free(ts_gguf_writer *w) {
    if (!w)
        return;
    for (int64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    for (int64_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        ts_release(w->t[i].t);
    }
    free(w->keys), free(w->t), free(w->kv.p);
    free(w);
}

/* the key's header (key, type) after checks; false with the error set */
static bool begin_kv(ts_gguf_writer *w, const char *key, ts_gguf_type type) {
    if (!w)
        return false;
    size_t kl = key ? strlen(key) : 0;
    if (!kl || kl > GGUF_MAX_KEY) {
        ts_set_error(w->ctx, TS_ERR_INVALID_ARG,
                     "gguf writer: a key is 1 to %d bytes (got %s)",
                     GGUF_MAX_KEY, key ? "a longer one" : "NULL or empty");
        return false;
    }
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) {
            ts_set_error(w->ctx, TS_ERR_INVALID_ARG,
                         "gguf writer: key \"%s\" given twice", key);
            return false;
        }
    char **keys = realloc(w->keys, sizeof *keys * (size_t)(w->n_kv + 1));
    char *copy = strdup(key);
    if (keys)
        w->keys = keys;
    if (!keys || !copy) {
        free(copy);
        ts_set_error(w->ctx, TS_ERR_OOM, "gguf writer: out of memory");
        return false;
    }
    w->keys[w->n_kv++] = copy;
    put_str(&w->kv, key, kl);
    put_le(&w->kv, type, 4);
    return true;
}

static ts_status end_kv(ts_gguf_writer *w) {
    if (w->kv.oom)
        return ts_set_error(w->ctx, TS_ERR_OOM, "gguf writer: out of memory");
    return TS_OK;
}

static ts_status add_scalar(ts_gguf_writer *w, const char *key,
                            ts_gguf_type type, uint64_t bits) {
    if (!w)
        return TS_ERR_INVALID_ARG;
    if (key && !strcmp(key, "general.alignment") &&
        (type != TS_GGUF_UINT32 || bits != GGUF_ALIGN_DEFAULT))
        return ts_set_error(w->ctx, TS_ERR_INVALID_ARG,
                            "gguf writer: general.alignment must be the "
                            "uint32 %d, the alignment this writer uses",
                            GGUF_ALIGN_DEFAULT);
    if (!begin_kv(w, key, type))
        return ts_ctx_status(w->ctx);
    put_le(&w->kv, bits, gguf_type_sizes[type]);
    return end_kv(w);
}

ts_status ts_gguf_writer_add_u8(ts_gguf_writer *w, const char *k, uint8_t v) {
    return add_scalar(w, k, TS_GGUF_UINT8, v);
}
ts_status ts_gguf_writer_add_i8(ts_gguf_writer *w, const char *k, int8_t v) {
    return add_scalar(w, k, TS_GGUF_INT8, (uint8_t)v);
}
ts_status ts_gguf_writer_add_u16(ts_gguf_writer *w, const char *k, uint16_t v) {
    return add_scalar(w, k, TS_GGUF_UINT16, v);
}
ts_status ts_gguf_writer_add_i16(ts_gguf_writer *w, const char *k, int16_t v) {
    return add_scalar(w, k, TS_GGUF_INT16, (uint16_t)v);
}
ts_status ts_gguf_writer_add_u32(ts_gguf_writer *w, const char *k, uint32_t v) {
    return add_scalar(w, k, TS_GGUF_UINT32, v);
}
ts_status ts_gguf_writer_add_i32(ts_gguf_writer *w, const char *k, int32_t v) {
    return add_scalar(w, k, TS_GGUF_INT32, (uint32_t)v);
}
ts_status ts_gguf_writer_add_u64(ts_gguf_writer *w, const char *k, uint64_t v) {
    return add_scalar(w, k, TS_GGUF_UINT64, v);
}
ts_status ts_gguf_writer_add_i64(ts_gguf_writer *w, const char *k, int64_t v) {
    return add_scalar(w, k, TS_GGUF_INT64, (uint64_t)v);
}
ts_status ts_gguf_writer_add_f32(ts_gguf_writer *w, const char *k, float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    return add_scalar(w, k, TS_GGUF_FLOAT32, b);
}
ts_status ts_gguf_writer_add_f64(ts_gguf_writer *w, const char *k, double v) {
    uint64_t b;
    memcpy(&b, &v, 8);
    return add_scalar(w, k, TS_GGUF_FLOAT64, b);
}
ts_status ts_gguf_writer_add_bool(ts_gguf_writer *w, const char *k, bool v) {
    return add_scalar(w, k, TS_GGUF_BOOL, v ? 1 : 0);
}

ts_status ts_gguf_writer_add_string_n(ts_gguf_writer *w, const char *key,
                                      const char *v, size_t len) {
    if (w && !v && len)
        return ts_set_error(w->ctx, TS_ERR_INVALID_ARG,
                            "gguf writer: key \"%s\": NULL string",
                            key ? key : "(null)");
    if (!begin_kv(w, key, TS_GGUF_STRING))
        return w ? ts_ctx_status(w->ctx) : TS_ERR_INVALID_ARG;
    put_str(&w->kv, v ? v : "", len);
    return end_kv(w);
}

ts_status ts_gguf_writer_add_string(ts_gguf_writer *w, const char *key,
                                    const char *v) {
    return ts_gguf_writer_add_string_n(w, key, v, v ? strlen(v) : 0);
}

ts_status ts_gguf_writer_add_array(ts_gguf_writer *w, const char *key,
                                   ts_gguf_type elem, const void *data,
                                   uint64_t n) {
    if (!w)
        return TS_ERR_INVALID_ARG;
    if ((unsigned)elem >= TS_GGUF_TYPE_COUNT || elem == TS_GGUF_STRING ||
        elem == TS_GGUF_ARRAY || (n && !data))
        return ts_set_error(w->ctx, TS_ERR_INVALID_ARG,
                            "gguf writer: key \"%s\": an array needs data "
                            "and a numeric or bool element type (strings: "
                            "ts_gguf_writer_add_string_array)",
                            key ? key : "(null)");
    const unsigned char *p = data;
    size_t es = gguf_type_sizes[elem];
    if (elem == TS_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (p[i] > 1)
                return ts_set_error(w->ctx, TS_ERR_INVALID_ARG,
                                    "gguf writer: key \"%s\": bool element "
                                    "%llu is %u (0 or 1)",
                                    key ? key : "(null)", (unsigned long long)i,
                                    p[i]);
    if (!begin_kv(w, key, TS_GGUF_ARRAY))
        return ts_ctx_status(w->ctx);
    put_le(&w->kv, (uint64_t)elem, 4);
    put_le(&w->kv, n, 8);
    for (uint64_t i = 0; i < n; i++) { /* host order to little-endian */
        uint64_t v = 0;
        if (es == 1)
            v = p[i];
        else if (es == 2) {
            uint16_t x;
            memcpy(&x, p + 2 * i, 2);
            v = x;
        } else if (es == 4) {
            uint32_t x;
            memcpy(&x, p + 4 * i, 4);
            v = x;
        } else
            memcpy(&v, p + 8 * i, 8);
        put_le(&w->kv, v, (int)es);
    }
    return end_kv(w);
}

ts_status ts_gguf_writer_add_string_array(ts_gguf_writer *w, const char *key,
                                          const char *const *v,
                                          const size_t *lens, uint64_t n) {
    if (!w)
        return TS_ERR_INVALID_ARG;
    for (uint64_t i = 0; i < n; i++)
        if (!v || (!v[i] && !(lens && lens[i] == 0)))
            return ts_set_error(w->ctx, TS_ERR_INVALID_ARG,
                                "gguf writer: key \"%s\": string %llu is NULL",
                                key ? key : "(null)", (unsigned long long)i);
    if (!begin_kv(w, key, TS_GGUF_ARRAY))
        return ts_ctx_status(w->ctx);
    put_le(&w->kv, TS_GGUF_STRING, 4);
    put_le(&w->kv, n, 8);
    for (uint64_t i = 0; i < n; i++)
        put_str(&w->kv, v[i] ? v[i] : "", lens ? lens[i] : strlen(v[i]));
    return end_kv(w);
}

ts_status ts_gguf_writer_add_tensor(ts_gguf_writer *w, const char *name,
                                    ts_tensor *t) {
    if (!w)
        return TS_ERR_INVALID_ARG;
    size_t nl = name ? strlen(name) : 0;
    if (!nl || nl > GGUF_WRITE_NAME || !t)
        return ts_set_error(w->ctx, TS_ERR_INVALID_ARG,
                            "gguf writer: tensor \"%s\": %s",
                            name ? name : "(null)",
                            !t ? "NULL tensor"
                               : "a name is 1 to 63 bytes (llama.cpp's "
                                 "limit)");
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return ts_set_error(w->ctx, TS_ERR_INVALID_ARG,
                                "gguf writer: tensor \"%s\" given twice", name);
    ts_dtype dt = ts_tensor_dtype(t);
    int type = gguf_ggml_of_dtype(dt);
    int nd = ts_tensor_ndim(t);
    const int64_t *shape = ts_tensor_shape(t);
    if (type < 0)
        return ts_set_error(w->ctx, TS_ERR_DTYPE,
                            "gguf writer: tensor \"%s\": dtype %s has no "
                            "ggml type",
                            name, ts_dtype_name(dt));
    if (nd > GGUF_MAX_DIMS)
        return ts_set_error(w->ctx, TS_ERR_SHAPE,
                            "gguf writer: tensor \"%s\" has %d dims (GGUF "
                            "holds at most %d)",
                            name, nd, GGUF_MAX_DIMS);
    for (int d = 0; d < nd; d++)
        if (shape[d] < 1)
            return ts_set_error(w->ctx, TS_ERR_SHAPE,
                                "gguf writer: tensor \"%s\": dim %d is %lld "
                                "(GGUF dims are at least 1)",
                                name, d, (long long)shape[d]);
    if (ts_dtype_is_quantized(dt) && !ts_tensor_is_contiguous(t))
        return ts_set_error(w->ctx, TS_ERR_INVALID_ARG,
                            "gguf writer: tensor \"%s\" of %s is not "
                            "contiguous (block data is written as it lies)",
                            name, ts_dtype_name(dt));
    int64_t nbytes = ts_dtype_nbytes(dt, ts_tensor_numel(t));
    if (nbytes < 0)
        return ts_set_error(w->ctx, TS_ERR_SHAPE,
                            "gguf writer: tensor \"%s\": %lld elements are "
                            "not whole %s blocks",
                            name, (long long)ts_tensor_numel(t),
                            ts_dtype_name(dt));
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *p = realloc(w->t, sizeof *p * (size_t)cap);
        if (!p)
            return ts_set_error(w->ctx, TS_ERR_OOM,
                                "gguf writer: out of memory");
        w->t = p, w->cap_t = cap;
    }
    wtensor *e = &w->t[w->n_t];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name)))
        return ts_set_error(w->ctx, TS_ERR_OOM, "gguf writer: out of memory");
    e->t = ts_retain(t);
    e->type = type, e->n_dims = nd, e->nbytes = (uint64_t)nbytes;
    for (int d = 0; d < nd; d++)
        e->ne[d] = shape[nd - 1 - d];
    w->n_t++;
    return TS_OK;
}

/* tensor e's bytes: a buffer to free in *owned, or NULL on failure */
static const void *tensor_bytes(ts_gguf_writer *w, const wtensor *e,
                                void **owned) {
    *owned = NULL;
    ts_dtype dt = ts_tensor_dtype(e->t);
    if (!ts_dtype_is_quantized(dt)) {
        void *buf = malloc(e->nbytes ? (size_t)e->nbytes : 1);
        if (!buf) {
            ts_set_error(w->ctx, TS_ERR_OOM, "gguf writer: out of memory");
            return NULL;
        }
        if (ts_tensor_read(e->t, buf, dt) != TS_OK) {
            free(buf);
            return NULL;
        }
        return *owned = buf;
    }
    ts_tensor *h = ts_host_copy(e->t);
    const void *p = h ? ts_tensor_data(h) : NULL;
    if (p) {
        void *buf = malloc((size_t)e->nbytes);
        if (buf)
            memcpy(buf, p, (size_t)e->nbytes);
        else
            ts_set_error(w->ctx, TS_ERR_OOM, "gguf writer: out of memory");
        p = *owned = buf;
    }
    ts_release(h);
    return p;
}

ts_status ts_gguf_writer_save(ts_gguf_writer *w, const char *path) {
    if (!w)
        return TS_ERR_INVALID_ARG;
    if (!path)
        return ts_set_error(w->ctx, TS_ERR_INVALID_ARG,
                            "gguf writer: NULL path");
    const uint64_t A = GGUF_ALIGN_DEFAULT;
    bytes_buf h = {0};
    put(&h, "GGUF", 4);
    put_le(&h, 3, 4);
    put_le(&h, (uint64_t)w->n_t, 8);
    put_le(&h, (uint64_t)w->n_kv, 8);
    put(&h, w->kv.p, w->kv.n);
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        const wtensor *e = &w->t[i];
        put_str(&h, e->name, strlen(e->name));
        put_le(&h, (uint64_t)e->n_dims, 4);
        for (int d = 0; d < e->n_dims; d++)
            put_le(&h, (uint64_t)e->ne[d], 8);
        put_le(&h, (uint64_t)e->type, 4);
        put_le(&h, off, 8);
        off += (e->nbytes + A - 1) / A * A;
    }
    static const unsigned char zeros[GGUF_ALIGN_DEFAULT];
    put(&h, zeros, (size_t)((A - h.n % A) % A));
    if (h.oom) {
        free(h.p);
        return ts_set_error(w->ctx, TS_ERR_OOM, "%s: out of memory", path);
    }
    ts_atomic_file f;
    if (!ts_atomic_open(&f, path)) {
        free(h.p);
        return ts_set_error(w->ctx, TS_ERR_IO, "%s: cannot create %s: %s", path,
                            f.tmp, strerror(f.err));
    }
    bool ok = ts_atomic_write(&f, h.p, h.n);
    free(h.p);
    ts_status s = TS_OK;
    for (int64_t i = 0; i < w->n_t && ok; i++) {
        const wtensor *e = &w->t[i];
        void *owned;
        const void *p = tensor_bytes(w, e, &owned);
        if (!p) {
            s = ts_ctx_status(w->ctx) ? ts_ctx_status(w->ctx)
                                      : ts_set_error(w->ctx, TS_ERR_IO,
                                                     "%s: tensor \"%s\" could "
                                                     "not be read",
                                                     path, e->name);
            ok = false;
            break;
        }
        ok = ts_atomic_write(&f, p, (size_t)e->nbytes) &&
             ts_atomic_write(&f, zeros, (size_t)((A - e->nbytes % A) % A));
        free(owned);
    }
    if (!ts_atomic_commit(&f, ok) && s == TS_OK)
        s = ts_set_error(w->ctx, TS_ERR_IO,
                         "%s: write failed (%s); the previous file is kept",
                         path, strerror(f.err ? f.err : EIO));
    return s;
}
