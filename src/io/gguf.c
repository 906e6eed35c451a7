/* gguf.c — llama.cpp's GGUF files: the reader (mmap; every count, length,
 * type, dim and offset checked against the file before it is used; keys
 * and tensor names hashed) and the type tables the writer shares.
 * Owns the file mappings (refcounted: tensors viewing a file keep it
 * mapped after ts_gguf_close) and nothing of the Hugging Face view, which
 * is gguf_hf.c's, nor the writer, gguf_write.c's. The layout is in
 * include/tessera_gguf.h. */
#define _GNU_SOURCE /* qsort_r */
#include "io/gguf_internal.h"

#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define GGUF_MAX_ALIGN (1u << 30)
/* the smallest key-value (a 1-byte key and a 1-byte value) and tensor info
 * (a 1-byte name, no dims): what a count may claim per remaining byte */
#define MIN_KV_BYTES     (8 + 1 + 4 + 1)
#define MIN_TENSOR_BYTES (8 + 1 + 4 + 4 + 8)

/* ---- types ---- */

static const struct {
    const char *name;
    int64_t blck;   /* elements per block */
    uint32_t bytes; /* bytes per block */
    int dt;         /* ts_dtype + 1, or 0: no Tessera dtype */
} ggml_types[] = {
    [0] = {"f32", 1, 4, TS_F32 + 1},
    [1] = {"f16", 1, 2, TS_F16 + 1},
    [2] = {"q4_0", 32, 18, TS_Q4_0 + 1},
    [3] = {"q4_1", 32, 20, 0},
    [6] = {"q5_0", 32, 22, 0},
    [7] = {"q5_1", 32, 24, 0},
    [8] = {"q8_0", 32, 34, TS_Q8_0 + 1},
    [9] = {"q8_1", 32, 36, 0},
    [10] = {"q2_K", 256, 84, 0},
    [11] = {"q3_K", 256, 110, 0},
    [12] = {"q4_K", 256, 144, TS_Q4_K + 1},
    [13] = {"q5_K", 256, 176, TS_Q5_K + 1},
    [14] = {"q6_K", 256, 210, TS_Q6_K + 1},
    [15] = {"q8_K", 256, 292, 0},
    [16] = {"iq2_xxs", 256, 66, 0},
    [17] = {"iq2_xs", 256, 74, 0},
    [18] = {"iq3_xxs", 256, 98, 0},
    [19] = {"iq1_s", 256, 50, 0},
    [20] = {"iq4_nl", 32, 18, 0},
    [21] = {"iq3_s", 256, 110, 0},
    [22] = {"iq2_s", 256, 82, 0},
    [23] = {"iq4_xs", 256, 136, 0},
    [24] = {"i8", 1, 1, 0},
    [25] = {"i16", 1, 2, 0},
    [26] = {"i32", 1, 4, TS_I32 + 1},
    [27] = {"i64", 1, 8, TS_I64 + 1},
    [28] = {"f64", 1, 8, 0},
    [29] = {"iq1_m", 256, 56, 0},
    [30] = {"bf16", 1, 2, TS_BF16 + 1},
    [34] = {"tq1_0", 256, 54, 0},
    [35] = {"tq2_0", 256, 66, 0},
    [39] = {"mxfp4", 32, 17, 0},
    [40] = {"nvfp4", 64, 36, 0},
    [41] = {"q1_0", 128, 18, 0},
    [42] = {"q2_0", 64, 18, 0},
};
#define N_GGML_TYPES (int)(sizeof ggml_types / sizeof *ggml_types)

const char *ts_ggml_type_name(int t) {
    return t >= 0 && t < N_GGML_TYPES ? ggml_types[t].name : NULL;
}

int gguf_ggml_of_dtype(ts_dtype dt) {
    for (int t = 0; t < N_GGML_TYPES; t++)
        if (ggml_types[t].dt == (int)dt + 1)
            return t;
    return -1;
}

static const char *const type_names[TS_GGUF_TYPE_COUNT] = {
    "uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
    "bool",  "string", "array",  "uint64", "int64",  "float64"};
const uint8_t gguf_type_sizes[TS_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4,
                                                     1, 0, 0, 8, 8, 8};

const char *ts_gguf_type_name(ts_gguf_type t) {
    return (unsigned)t < TS_GGUF_TYPE_COUNT ? type_names[t] : "invalid";
}

/* ---- the reader's state ---- */

typedef struct {
    int refcount;
    void *base;
    size_t len;
} gguf_map;

typedef struct {
    char *key;
    ts_gguf_type type;
    ts_gguf_type elem; /* arrays */
    uint64_t n;        /* arrays: elements */
    uint64_t at;       /* the value (an array: its first element) */
    char *str;         /* a string value, NUL-terminated copy */
    uint64_t str_len;
    uint64_t *str_at; /* a string array: each element's length field */
} kv_entry;

typedef struct {
    char *name;
    uint32_t type;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    uint64_t offset; /* in the data section */
    uint64_t nbytes;
} tensor_entry;

/* names to entries: open addressing, index + 1 per slot (0: empty) */
typedef struct {
    int64_t *slot;
    size_t n_slots;
} name_index;

struct ts_gguf {
    ts_ctx *ctx;
    char *path;
    gguf_map *map;
    const unsigned char *p;
    uint64_t len;
    uint32_t version;
    uint64_t alignment, data_start;
    kv_entry *kv;
    int64_t n_kv;
    tensor_entry *t;
    int64_t n_t;
    name_index keys, names;
};

static ts_status fail(const ts_gguf *g, ts_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ts_status fail(const ts_gguf *g, ts_status s, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ts_set_error(g->ctx, s, "%s: %s", g->path, msg);
}

static uint64_t rd64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

/* ---- hashed names ---- */

static size_t hash_of(const char *s) {
    return (size_t)XXH3_64bits(s, strlen(s));
}

/* builds the index over n names (name(i)); the first name seen twice is
 * returned in *dup (index of its second appearance), else -1 */
static bool index_build(name_index *x, int64_t n,
                        const char *(*name)(const ts_gguf *, int64_t),
                        const ts_gguf *g, int64_t *dup) {
    *dup = -1;
    size_t cap = 16;
    while (cap < 2 * (size_t)n)
        cap *= 2;
    x->slot = calloc(cap, sizeof *x->slot);
    if (!x->slot)
        return false;
    x->n_slots = cap;
    for (int64_t i = 0; i < n; i++) {
        size_t h = hash_of(name(g, i)) & (cap - 1);
        for (; x->slot[h]; h = (h + 1) & (cap - 1))
            if (!strcmp(name(g, x->slot[h] - 1), name(g, i))) {
                *dup = i;
                return true;
            }
        x->slot[h] = i + 1;
    }
    return true;
}

static int64_t index_find(const name_index *x, const char *s,
                          const char *(*name)(const ts_gguf *, int64_t),
                          const ts_gguf *g) {
    if (!x->n_slots || !s)
        return -1;
    size_t mask = x->n_slots - 1;
    for (size_t h = hash_of(s) & mask;; h = (h + 1) & mask) {
        int64_t k = x->slot[h] - 1;
        if (k < 0)
            return -1;
        if (!strcmp(name(g, k), s))
            return k;
    }
}

static const char *key_at(const ts_gguf *g, int64_t i) {
    return g->kv[i].key;
}
static const char *name_at(const ts_gguf *g, int64_t i) {
    return g->t[i].name;
}

/* ---- parsing ---- */

typedef struct {
    ts_gguf *g;
    uint64_t at;
    ts_status st;
    char what[160]; /* the item being read, for messages */
} cursor;

static bool need(cursor *c, uint64_t n, const char *field) {
    if (c->st)
        return false;
    if (n > c->g->len - c->at) {
        c->st = fail(c->g, TS_ERR_IO,
                     "%s: %s at byte %llu needs %llu bytes, but the file "
                     "ends at byte %llu (truncated?)",
                     c->what, field, (unsigned long long)c->at,
                     (unsigned long long)n, (unsigned long long)c->g->len);
        return false;
    }
    return true;
}

static uint32_t get32(cursor *c, const char *field) {
    if (!need(c, 4, field))
        return 0;
    c->at += 4;
    return rd32(c->g->p + c->at - 4);
}

static uint64_t get64(cursor *c, const char *field) {
    if (!need(c, 8, field))
        return 0;
    c->at += 8;
    return rd64(c->g->p + c->at - 8);
}

/* a string's length and bytes: *at its first byte */
static uint64_t get_string(cursor *c, const char *field, uint64_t *at) {
    uint64_t n = get64(c, field);
    if (c->st)
        return 0;
    if (n > c->g->len - c->at) {
        c->st = fail(c->g, TS_ERR_IO,
                     "%s: %s of %llu bytes at byte %llu runs past the end of "
                     "the %llu-byte file",
                     c->what, field, (unsigned long long)n,
                     (unsigned long long)c->at, (unsigned long long)c->g->len);
        return 0;
    }
    *at = c->at;
    c->at += n;
    return n;
}

static char *copy_str(const unsigned char *p, uint64_t n) {
    char *s = malloc((size_t)n + 1);
    if (s) {
        memcpy(s, p, (size_t)n);
        s[n] = '\0';
    }
    return s;
}

static bool check_bools(cursor *c, uint64_t at, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (c->g->p[at + i] > 1) {
            c->st =
                fail(c->g, TS_ERR_IO,
                     "%s: bool%s%.0llu at byte %llu is %u (a bool is 0 or 1)",
                     c->what, n > 1 ? " element " : "",
                     (unsigned long long)(n > 1 ? i : 0),
                     (unsigned long long)(at + i), c->g->p[at + i]);
            return false;
        }
    return true;
}

static bool oom(cursor *c) {
    c->st = fail(c->g, TS_ERR_OOM, "%s: out of memory", c->what);
    return false;
}

static bool read_value(cursor *c, kv_entry *e) {
    uint32_t type = get32(c, "value type");
    if (c->st)
        return false;
    if (type >= TS_GGUF_TYPE_COUNT) {
        c->st = fail(c->g, TS_ERR_IO,
                     "%s: unknown value type %u at byte %llu (0 to 12)",
                     c->what, type, (unsigned long long)(c->at - 4));
        return false;
    }
    e->type = (ts_gguf_type)type;
    if (type == TS_GGUF_STRING) {
        uint64_t at = 0, n = get_string(c, "string value", &at);
        if (c->st)
            return false;
        e->at = at, e->str_len = n;
        return (e->str = copy_str(c->g->p + at, n)) != NULL || oom(c);
    }
    if (type != TS_GGUF_ARRAY) {
        if (!need(c, gguf_type_sizes[type], type_names[type]))
            return false;
        e->at = c->at;
        c->at += gguf_type_sizes[type];
        return type != TS_GGUF_BOOL || check_bools(c, e->at, 1);
    }
    uint32_t elem = get32(c, "array element type");
    uint64_t n = get64(c, "array length");
    if (c->st)
        return false;
    if (elem == TS_GGUF_ARRAY) {
        c->st = fail(c->g, TS_ERR_IO,
                     "%s: an array of arrays (nested arrays are not "
                     "supported)",
                     c->what);
        return false;
    }
    if (elem >= TS_GGUF_TYPE_COUNT) {
        c->st =
            fail(c->g, TS_ERR_IO, "%s: unknown array element type %u (0 to 12)",
                 c->what, elem);
        return false;
    }
    e->elem = (ts_gguf_type)elem, e->n = n, e->at = c->at;
    uint64_t left = c->g->len - c->at;
    uint64_t min = elem == TS_GGUF_STRING ? 8 : gguf_type_sizes[elem];
    if (n > left / min) {
        c->st = fail(c->g, TS_ERR_IO,
                     "%s: array of %llu %s elements at byte %llu cannot fit "
                     "in the %llu bytes left in the file",
                     c->what, (unsigned long long)n, type_names[elem],
                     (unsigned long long)c->at, (unsigned long long)left);
        return false;
    }
    if (elem != TS_GGUF_STRING) {
        c->at += n * gguf_type_sizes[elem];
        return elem != TS_GGUF_BOOL || check_bools(c, e->at, n);
    }
    e->str_at = malloc(sizeof *e->str_at * (size_t)(n ? n : 1));
    if (!e->str_at)
        return oom(c);
    for (uint64_t i = 0; i < n; i++) {
        e->str_at[i] = c->at;
        uint64_t at;
        get_string(c, "string element", &at);
        if (c->st) /* said again with the element's index */
            return (c->st = fail(c->g, TS_ERR_IO,
                                 "%s: string element %llu at byte %llu runs "
                                 "past the end of the %llu-byte file",
                                 c->what, (unsigned long long)i,
                                 (unsigned long long)e->str_at[i],
                                 (unsigned long long)c->g->len)) == TS_OK;
    }
    return true;
}

static bool read_kvs(cursor *c, uint64_t n) {
    ts_gguf *g = c->g;
    if (n > (g->len - c->at) / MIN_KV_BYTES) {
        c->st = fail(g, TS_ERR_IO,
                     "metadata count %llu is more than the %llu-byte file "
                     "can hold",
                     (unsigned long long)n, (unsigned long long)g->len);
        return false;
    }
    g->kv = calloc((size_t)n + 1, sizeof *g->kv);
    if (!g->kv)
        return oom(c);
    for (uint64_t i = 0; i < n; i++) {
        snprintf(c->what, sizeof c->what, "metadata entry %llu",
                 (unsigned long long)i);
        uint64_t at = 0, kl = get_string(c, "key", &at);
        if (c->st)
            return false;
        if (kl == 0 || kl > GGUF_MAX_KEY || memchr(g->p + at, 0, kl)) {
            c->st = fail(g, TS_ERR_IO,
                         "%s: key at byte %llu is %s (keys are 1 to %d "
                         "bytes of ASCII)",
                         c->what, (unsigned long long)at,
                         kl == 0             ? "empty"
                         : kl > GGUF_MAX_KEY ? "too long"
                                             : "holding a NUL byte",
                         GGUF_MAX_KEY);
            return false;
        }
        kv_entry *e = &g->kv[i];
        if (!(e->key = copy_str(g->p + at, kl)))
            return oom(c);
        g->n_kv = (int64_t)i + 1;
        snprintf(c->what, sizeof c->what, "key \"%.100s\"", e->key);
        if (!read_value(c, e))
            return false;
    }
    int64_t dup;
    if (!index_build(&g->keys, g->n_kv, key_at, g, &dup))
        return oom(c);
    if (dup >= 0) {
        c->st =
            fail(g, TS_ERR_IO, "key \"%.100s\" appears twice", g->kv[dup].key);
        return false;
    }
    return true;
}

static bool read_alignment(cursor *c) {
    ts_gguf *g = c->g;
    g->alignment = GGUF_ALIGN_DEFAULT;
    int64_t k = ts_gguf_find_key(g, "general.alignment");
    if (k < 0)
        return true;
    uint64_t a = 0;
    if (ts_gguf_get_u64(g, "general.alignment", &a) != TS_OK) {
        c->st = g->ctx->status;
        return false;
    }
    if (a == 0 || (a & (a - 1)) || a > GGUF_MAX_ALIGN) {
        c->st = fail(g, TS_ERR_IO,
                     "general.alignment is %llu: it must be a power of two "
                     "(1 to 2^30)",
                     (unsigned long long)a);
        return false;
    }
    g->alignment = a;
    return true;
}

static bool read_tensor(cursor *c, tensor_entry *t) {
    ts_gguf *g = c->g;
    uint64_t at = 0, nl = get_string(c, "name", &at);
    if (c->st)
        return false;
    if (nl == 0 || nl > GGUF_MAX_NAME || memchr(g->p + at, 0, nl)) {
        c->st = fail(g, TS_ERR_IO,
                     "%s: name at byte %llu is %s (names are 1 to %d bytes)",
                     c->what, (unsigned long long)at,
                     nl == 0              ? "empty"
                     : nl > GGUF_MAX_NAME ? "too long"
                                          : "holding a NUL byte",
                     GGUF_MAX_NAME);
        return false;
    }
    if (!(t->name = copy_str(g->p + at, nl)))
        return oom(c);
    snprintf(c->what, sizeof c->what, "tensor \"%s\"", t->name);
    uint32_t nd = get32(c, "dim count");
    if (c->st)
        return false;
    if (nd > GGUF_MAX_DIMS) {
        c->st = fail(g, TS_ERR_IO, "%s: %u dims (at most %d)", c->what, nd,
                     GGUF_MAX_DIMS);
        return false;
    }
    t->n_dims = (int)nd;
    int64_t numel = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t ne = get64(c, "dim");
        if (c->st)
            return false;
        if (ne == 0 || ne > INT64_MAX) {
            c->st =
                fail(g, TS_ERR_IO, "%s: dim %u is %lld (dims are at least 1)",
                     c->what, d, (long long)ne);
            return false;
        }
        t->ne[d] = (int64_t)ne;
        if (__builtin_mul_overflow(numel, t->ne[d], &numel)) {
            c->st = fail(g, TS_ERR_IO,
                         "%s: the element count overflows 64 bits", c->what);
            return false;
        }
    }
    t->type = get32(c, "ggml type");
    if (c->st)
        return false;
    const char *tn = ts_ggml_type_name((int)t->type);
    if (!tn) {
        c->st = fail(g, TS_ERR_IO, "unknown ggml type %u for tensor %s",
                     t->type, t->name);
        return false;
    }
    int64_t blck = ggml_types[t->type].blck, row = nd ? t->ne[0] : 1, bytes;
    if (row % blck) {
        c->st = fail(g, TS_ERR_IO,
                     "%s: type %s stores whole blocks of %lld elements along "
                     "ne[0], which is %lld",
                     c->what, tn, (long long)blck, (long long)row);
        return false;
    }
    if (__builtin_mul_overflow(numel / blck, (int64_t)ggml_types[t->type].bytes,
                               &bytes)) {
        c->st =
            fail(g, TS_ERR_IO, "%s: the byte count overflows 63 bits", c->what);
        return false;
    }
    t->nbytes = (uint64_t)bytes;
    t->offset = get64(c, "data offset");
    if (c->st)
        return false;
    if (t->offset % g->alignment) {
        c->st = fail(g, TS_ERR_IO,
                     "%s: data offset %llu is not a multiple of the "
                     "alignment %llu",
                     c->what, (unsigned long long)t->offset,
                     (unsigned long long)g->alignment);
        return false;
    }
    return true;
}

static int by_offset_of(const void *a, const void *b, void *arg) {
    const tensor_entry *t = arg;
    uint64_t x = t[*(const int64_t *)a].offset,
             y = t[*(const int64_t *)b].offset;
    return x < y ? -1 : x > y;
}

static bool check_data(cursor *c) {
    ts_gguf *g = c->g;
    uint64_t data_len = g->data_start <= g->len ? g->len - g->data_start : 0;
    for (int64_t i = 0; i < g->n_t; i++) {
        const tensor_entry *t = &g->t[i];
        if (t->offset > data_len || t->nbytes > data_len - t->offset) {
            c->st = fail(g, TS_ERR_IO,
                         "tensor \"%s\": data at bytes [%llu, %llu) of the "
                         "data section (file byte %llu on) runs past the end "
                         "of the %llu-byte file (truncated?)",
                         t->name, (unsigned long long)t->offset,
                         (unsigned long long)(t->offset + t->nbytes),
                         (unsigned long long)g->data_start,
                         (unsigned long long)g->len);
            return false;
        }
    }
    int64_t *order = malloc(sizeof *order * (size_t)(g->n_t + 1));
    if (!order)
        return oom(c);
    for (int64_t i = 0; i < g->n_t; i++)
        order[i] = i;
    qsort_r(order, (size_t)g->n_t, sizeof *order, by_offset_of, g->t);
    for (int64_t k = 1; k < g->n_t; k++) {
        const tensor_entry *a = &g->t[order[k - 1]], *b = &g->t[order[k]];
        if (a->nbytes && b->nbytes && a->offset + a->nbytes > b->offset) {
            c->st = fail(g, TS_ERR_IO,
                         "tensors \"%s\" (bytes %llu to %llu) and \"%s\" "
                         "(from %llu) overlap",
                         a->name, (unsigned long long)a->offset,
                         (unsigned long long)(a->offset + a->nbytes), b->name,
                         (unsigned long long)b->offset);
            break;
        }
    }
    free(order);
    return !c->st;
}

static bool read_tensors(cursor *c, uint64_t n) {
    ts_gguf *g = c->g;
    if (n > (g->len - c->at) / MIN_TENSOR_BYTES) {
        c->st = fail(g, TS_ERR_IO,
                     "tensor count %llu is more than the %llu-byte file can "
                     "hold",
                     (unsigned long long)n, (unsigned long long)g->len);
        return false;
    }
    g->t = calloc((size_t)n + 1, sizeof *g->t);
    if (!g->t)
        return oom(c);
    for (uint64_t i = 0; i < n; i++) {
        snprintf(c->what, sizeof c->what, "tensor info %llu",
                 (unsigned long long)i);
        g->n_t = (int64_t)i + 1;
        if (!read_tensor(c, &g->t[i]))
            return false;
    }
    int64_t dup;
    if (!index_build(&g->names, g->n_t, name_at, g, &dup))
        return oom(c);
    if (dup >= 0) {
        c->st =
            fail(g, TS_ERR_IO, "tensor \"%s\" appears twice", g->t[dup].name);
        return false;
    }
    uint64_t a = g->alignment;
    g->data_start = (c->at + a - 1) / a * a; /* c->at < 2^63: no overflow */
    return check_data(c);
}

static ts_status parse(ts_gguf *g) {
    cursor c = {g, 0, TS_OK, "header"};
    if (g->len < 4 || memcmp(g->p, "GGUF", 4)) {
        char shown[16] = "";
        for (uint64_t i = 0; i < 4 && i < g->len; i++)
            snprintf(shown + strlen(shown), sizeof shown - strlen(shown),
                     "%02x", g->p[i]);
        return fail(g, TS_ERR_IO,
                    "not a GGUF file: it starts with bytes %s%s, GGUF files "
                    "with \"GGUF\" (47475546)",
                    g->len ? shown : "(none: the file is empty)",
                    g->len && g->len < 4 ? " (all of them)" : "");
    }
    c.at = 4;
    g->version = get32(&c, "version");
    if (c.st)
        return c.st;
    uint32_t swapped = __builtin_bswap32(g->version);
    if ((g->version & 0xffffu) == 0 && (swapped == 2 || swapped == 3))
        return fail(g, TS_ERR_UNSUPPORTED,
                    "a big-endian GGUF (version %u byte-swapped); only "
                    "little-endian files are supported",
                    swapped);
    if (g->version == 1)
        return fail(g, TS_ERR_UNSUPPORTED,
                    "GGUF version 1 (the 2023 layout with 32-bit counts) is "
                    "not supported; convert the model again with a current "
                    "llama.cpp (versions 2 and 3 are read)");
    if (g->version != 2 && g->version != 3)
        return fail(g, g->version > 3 ? TS_ERR_UNSUPPORTED : TS_ERR_IO,
                    "GGUF version %u is not one this reader knows (2 and 3)",
                    g->version);
    uint64_t n_t = get64(&c, "tensor count");
    uint64_t n_kv = get64(&c, "metadata count");
    if (!c.st && read_kvs(&c, n_kv) && read_alignment(&c)) {
        snprintf(c.what, sizeof c.what, "tensor infos");
        read_tensors(&c, n_t);
    }
    return c.st;
}

static void map_release(void *p) {
    gguf_map *m = p;
    if (--m->refcount > 0)
        return;
    if (m->len)
        munmap(m->base, m->len);
    free(m);
}

void *gguf_map_retain(ts_gguf *g) {
    g->map->refcount++;
    return g->map;
}

void gguf_map_span(const ts_gguf *g, void **base, size_t *len) {
    *base = g->map->base, *len = g->map->len;
}

void gguf_map_release(void *owner) {
    map_release(owner);
}

ts_status ts_gguf_open(ts_ctx *ctx, const char *path, ts_gguf **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!path || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_gguf_open: NULL argument");
    *out = NULL;
    ts_gguf *g = calloc(1, sizeof *g);
    gguf_map *m = calloc(1, sizeof *m);
    char *pc = strdup(path);
    if (!g || !m || !pc) {
        free(g), free(m), free(pc);
        return ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", path);
    }
    g->ctx = ctx, g->path = pc, g->map = m;
    m->refcount = 1;
    ts_status s = TS_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        s = fail(g, TS_ERR_IO, "cannot open: %s", strerror(errno));
    else if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        s = fail(g, TS_ERR_IO, "not a regular file");
    else if (sb.st_size > 0) {
        /* private and writable, as safetensors: tensors used in place may
         * be written; the pages are copied and the file never changes */
        void *base = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE, fd, 0);
        if (base == MAP_FAILED)
            s = fail(g, TS_ERR_IO, "cannot map: %s", strerror(errno));
        else
            m->base = base, m->len = (size_t)sb.st_size;
    }
    if (fd >= 0)
        close(fd);
    g->p = m->base, g->len = m->len;
    if (s == TS_OK)
        s = parse(g);
    if (s != TS_OK) {
        ts_gguf_close(g);
        return s;
    }
    *out = g;
    return TS_OK;
}

void ts_gguf_close(ts_gguf *g) {
    if (!g)
        return;
    for (int64_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str);
        free(g->kv[i].str_at);
    }
    for (int64_t i = 0; i < g->n_t; i++)
        free(g->t[i].name);
    free(g->kv), free(g->t), free(g->keys.slot), free(g->names.slot);
    map_release(g->map);
    free(g->path);
    free(g);
}

ts_ctx *ts_gguf_ctx(const ts_gguf *g) {
    return g ? g->ctx : NULL;
}
const char *ts_gguf_path(const ts_gguf *g) {
    return g ? g->path : NULL;
}
uint32_t ts_gguf_version(const ts_gguf *g) {
    return g ? g->version : 0;
}
uint64_t ts_gguf_alignment(const ts_gguf *g) {
    return g ? g->alignment : 0;
}
uint64_t ts_gguf_data_offset(const ts_gguf *g) {
    return g ? g->data_start : 0;
}

/* ---- metadata ---- */

int64_t ts_gguf_kv_count(const ts_gguf *g) {
    return g ? g->n_kv : 0;
}

const char *ts_gguf_kv_key(const ts_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_kv ? g->kv[i].key : NULL;
}

ts_gguf_type ts_gguf_kv_type(const ts_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_kv ? g->kv[i].type : TS_GGUF_TYPE_COUNT;
}

int64_t ts_gguf_find_key(const ts_gguf *g, const char *key) {
    return g ? index_find(&g->keys, key, key_at, g) : -1;
}

typedef enum { V_INT, V_UINT, V_FLOAT, V_BOOL, V_OTHER } value_class;

/* the scalar of type t at byte at, by class */
static value_class load(const ts_gguf *g, ts_gguf_type t, uint64_t at,
                        int64_t *i, uint64_t *u, double *f) {
    const unsigned char *p = g->p + at;
    switch (t) {
    case TS_GGUF_UINT8:
        return *u = p[0], V_UINT;
    case TS_GGUF_INT8:
        return *i = (int8_t)p[0], V_INT;
    case TS_GGUF_UINT16:
        return *u = (uint16_t)(p[0] | p[1] << 8), V_UINT;
    case TS_GGUF_INT16:
        return *i = (int16_t)(p[0] | p[1] << 8), V_INT;
    case TS_GGUF_UINT32:
        return *u = rd32(p), V_UINT;
    case TS_GGUF_INT32:
        return *i = (int32_t)rd32(p), V_INT;
    case TS_GGUF_UINT64:
        return *u = rd64(p), V_UINT;
    case TS_GGUF_INT64:
        return *i = (int64_t)rd64(p), V_INT;
    case TS_GGUF_FLOAT32: {
        uint32_t b = rd32(p);
        float x;
        memcpy(&x, &b, 4);
        return *f = x, V_FLOAT;
    }
    case TS_GGUF_FLOAT64: {
        uint64_t b = rd64(p);
        memcpy(f, &b, 8);
        return V_FLOAT;
    }
    case TS_GGUF_BOOL:
        return *u = p[0], V_BOOL;
    default:
        return V_OTHER;
    }
}

static const kv_entry *want_key(const ts_gguf *g, const char *key) {
    if (!g)
        return NULL;
    int64_t k = ts_gguf_find_key(g, key);
    if (k < 0) {
        fail(g, TS_ERR_IO, "no metadata key \"%s\"", key ? key : "(null)");
        return NULL;
    }
    return &g->kv[k];
}

/* an integer value of key within [lo, hi] (as signed when lo < 0) */
static ts_status get_int(const ts_gguf *g, const char *key, bool is_signed,
                         int64_t lo, uint64_t hi, const char *want, int64_t *si,
                         uint64_t *ui) {
    const kv_entry *e = want_key(g, key);
    if (!e)
        return g ? g->ctx->status : TS_ERR_INVALID_ARG;
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0;
    value_class c = load(g, e->type, e->at, &i, &u, &f);
    if (c != V_INT && c != V_UINT)
        return fail(g, TS_ERR_IO, "key \"%s\" is a %s, not an integer (%s)",
                    key, type_names[e->type], want);
    bool fits = c == V_INT
                    ? (is_signed ? i >= lo && (i < 0 || (uint64_t)i <= hi)
                                 : i >= 0 && (uint64_t)i <= hi)
                    : u <= hi;
    if (!fits) {
        if (c == V_INT)
            return fail(g, TS_ERR_IO, "key \"%s\" is %lld, outside %s", key,
                        (long long)i, want);
        return fail(g, TS_ERR_IO, "key \"%s\" is %llu, outside %s", key,
                    (unsigned long long)u, want);
    }
    if (si)
        *si = c == V_INT ? i : (int64_t)u;
    if (ui)
        *ui = c == V_INT ? (uint64_t)i : u;
    return TS_OK;
}

ts_status ts_gguf_get_u32(const ts_gguf *g, const char *key, uint32_t *out) {
    uint64_t v = 0;
    ts_status s = get_int(g, key, false, 0, UINT32_MAX, "a uint32", NULL, &v);
    if (s == TS_OK && out)
        *out = (uint32_t)v;
    return s;
}

ts_status ts_gguf_get_i32(const ts_gguf *g, const char *key, int32_t *out) {
    int64_t v = 0;
    ts_status s =
        get_int(g, key, true, INT32_MIN, INT32_MAX, "an int32", &v, NULL);
    if (s == TS_OK && out)
        *out = (int32_t)v;
    return s;
}

ts_status ts_gguf_get_u64(const ts_gguf *g, const char *key, uint64_t *out) {
    uint64_t v = 0;
    ts_status s = get_int(g, key, false, 0, UINT64_MAX, "a uint64", NULL, &v);
    if (s == TS_OK && out)
        *out = v;
    return s;
}

ts_status ts_gguf_get_i64(const ts_gguf *g, const char *key, int64_t *out) {
    int64_t v = 0;
    ts_status s =
        get_int(g, key, true, INT64_MIN, INT64_MAX, "an int64", &v, NULL);
    if (s == TS_OK && out)
        *out = v;
    return s;
}

ts_status ts_gguf_get_f64(const ts_gguf *g, const char *key, double *out) {
    const kv_entry *e = want_key(g, key);
    if (!e)
        return g ? g->ctx->status : TS_ERR_INVALID_ARG;
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0;
    value_class c = load(g, e->type, e->at, &i, &u, &f);
    if (c == V_INT)
        f = (double)i;
    else if (c == V_UINT)
        f = (double)u;
    else if (c != V_FLOAT)
        return fail(g, TS_ERR_IO, "key \"%s\" is a %s, not a number", key,
                    type_names[e->type]);
    if (out)
        *out = f;
    return TS_OK;
}

ts_status ts_gguf_get_f32(const ts_gguf *g, const char *key, float *out) {
    double f = 0;
    ts_status s = ts_gguf_get_f64(g, key, &f);
    if (s == TS_OK && out)
        *out = (float)f;
    return s;
}

ts_status ts_gguf_get_bool(const ts_gguf *g, const char *key, bool *out) {
    const kv_entry *e = want_key(g, key);
    if (!e)
        return g ? g->ctx->status : TS_ERR_INVALID_ARG;
    if (e->type != TS_GGUF_BOOL)
        return fail(g, TS_ERR_IO, "key \"%s\" is a %s, not a bool", key,
                    type_names[e->type]);
    if (out)
        *out = g->p[e->at] != 0;
    return TS_OK;
}

ts_status ts_gguf_get_string(const ts_gguf *g, const char *key,
                             const char **out, size_t *len) {
    const kv_entry *e = want_key(g, key);
    if (!e)
        return g ? g->ctx->status : TS_ERR_INVALID_ARG;
    if (e->type != TS_GGUF_STRING)
        return fail(g, TS_ERR_IO, "key \"%s\" is a %s, not a string", key,
                    type_names[e->type]);
    if (out)
        *out = e->str;
    if (len)
        *len = (size_t)e->str_len;
    return TS_OK;
}

static const kv_entry *want_array(const ts_gguf *g, const char *key) {
    const kv_entry *e = want_key(g, key);
    if (e && e->type != TS_GGUF_ARRAY) {
        fail(g, TS_ERR_IO, "key \"%s\" is a %s, not an array", key,
             type_names[e->type]);
        return NULL;
    }
    return e;
}

ts_status ts_gguf_get_array(const ts_gguf *g, const char *key,
                            ts_gguf_type *elem, uint64_t *n) {
    const kv_entry *e = want_array(g, key);
    if (!e)
        return g ? g->ctx->status : TS_ERR_INVALID_ARG;
    if (elem)
        *elem = e->elem;
    if (n)
        *n = e->n;
    return TS_OK;
}

/* element i of key's array of a kind checked by the caller */
static const kv_entry *want_element(const ts_gguf *g, const char *key,
                                    uint64_t i) {
    const kv_entry *e = want_array(g, key);
    if (e && i >= e->n) {
        fail(g, TS_ERR_IO, "key \"%s\": element %llu of an array of %llu", key,
             (unsigned long long)i, (unsigned long long)e->n);
        return NULL;
    }
    return e;
}

ts_status ts_gguf_array_string(const ts_gguf *g, const char *key, uint64_t i,
                               const char **s, size_t *len) {
    const kv_entry *e = want_element(g, key, i);
    if (!e)
        return g ? g->ctx->status : TS_ERR_INVALID_ARG;
    if (e->elem != TS_GGUF_STRING)
        return fail(g, TS_ERR_IO, "key \"%s\" is an array of %s, not strings",
                    key, type_names[e->elem]);
    uint64_t at = e->str_at[i];
    if (s)
        *s = (const char *)g->p + at + 8;
    if (len)
        *len = (size_t)rd64(g->p + at);
    return TS_OK;
}

ts_status ts_gguf_array_int(const ts_gguf *g, const char *key, uint64_t i,
                            int64_t *out) {
    const kv_entry *e = want_element(g, key, i);
    if (!e)
        return g ? g->ctx->status : TS_ERR_INVALID_ARG;
    int64_t si = 0;
    uint64_t u = 0;
    double f = 0;
    value_class c = e->elem == TS_GGUF_STRING
                        ? V_OTHER
                        : load(g, e->elem, e->at + i * gguf_type_sizes[e->elem],
                               &si, &u, &f);
    if (c != V_INT && c != V_UINT && c != V_BOOL)
        return fail(g, TS_ERR_IO,
                    "key \"%s\" is an array of %s, not of integers", key,
                    type_names[e->elem]);
    if (c != V_INT && u > INT64_MAX)
        return fail(g, TS_ERR_IO,
                    "key \"%s\" element %llu is %llu, over "
                    "int64",
                    key, (unsigned long long)i, (unsigned long long)u);
    if (out)
        *out = c == V_INT ? si : (int64_t)u;
    return TS_OK;
}

ts_status ts_gguf_array_f64(const ts_gguf *g, const char *key, uint64_t i,
                            double *out) {
    const kv_entry *e = want_element(g, key, i);
    if (!e)
        return g ? g->ctx->status : TS_ERR_INVALID_ARG;
    int64_t si = 0;
    uint64_t u = 0;
    double f = 0;
    value_class c = e->elem == TS_GGUF_STRING
                        ? V_OTHER
                        : load(g, e->elem, e->at + i * gguf_type_sizes[e->elem],
                               &si, &u, &f);
    if (c == V_OTHER || c == V_BOOL)
        return fail(g, TS_ERR_IO, "key \"%s\" is an array of %s, not numbers",
                    key, type_names[e->elem]);
    if (out)
        *out = c == V_INT ? (double)si : c == V_UINT ? (double)u : f;
    return TS_OK;
}

const void *ts_gguf_array_data(const ts_gguf *g, const char *key,
                               ts_gguf_type *elem, uint64_t *n) {
    const kv_entry *e = want_array(g, key);
    if (!e)
        return NULL;
    if (e->elem == TS_GGUF_STRING) {
        fail(g, TS_ERR_IO, "key \"%s\" is an array of strings, not numbers",
             key);
        return NULL;
    }
    if (elem)
        *elem = e->elem;
    if (n)
        *n = e->n;
    return g->p + e->at;
}

/* ---- tensors ---- */

int64_t ts_gguf_tensor_count(const ts_gguf *g) {
    return g ? g->n_t : 0;
}

const char *ts_gguf_tensor_name(const ts_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_t ? g->t[i].name : NULL;
}

int64_t ts_gguf_find_tensor(const ts_gguf *g, const char *name) {
    return g ? index_find(&g->names, name, name_at, g) : -1;
}

int ts_gguf_tensor_type(const ts_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_t ? (int)g->t[i].type : -1;
}

int ts_gguf_tensor_ne(const ts_gguf *g, int64_t i, int64_t *ne) {
    if (!g || i < 0 || i >= g->n_t)
        return -1;
    if (ne)
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            ne[d] = d < g->t[i].n_dims ? g->t[i].ne[d] : 1;
    return g->t[i].n_dims;
}

uint64_t ts_gguf_tensor_nbytes(const ts_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_t ? g->t[i].nbytes : 0;
}

uint64_t ts_gguf_tensor_file_offset(const ts_gguf *g, int64_t i) {
    return g && i >= 0 && i < g->n_t ? g->data_start + g->t[i].offset : 0;
}

unsigned char *gguf_tensor_bytes(const ts_gguf *g, int64_t i) {
    return (unsigned char *)g->map->base + g->data_start + g->t[i].offset;
}

ts_status ts_gguf_dtype_of(const ts_gguf *g, int type, const char *tensor,
                           ts_dtype *out) {
    const char *name = ts_ggml_type_name(type);
    if (name && ggml_types[type].dt) {
        if (out)
            *out = (ts_dtype)(ggml_types[type].dt - 1);
        return TS_OK;
    }
    char list[200] = "";
    for (int t = 0; t < N_GGML_TYPES; t++)
        if (ggml_types[t].dt)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                     *list ? ", " : "", ggml_types[t].name);
    char what[120] = "";
    if (tensor)
        snprintf(what, sizeof what, " of tensor \"%s\"", tensor);
    ts_ctx *ctx = g ? g->ctx : NULL;
    if (!ctx)
        return TS_ERR_UNSUPPORTED;
    if (!name)
        return fail(g, TS_ERR_IO, "unknown ggml type %d%s", type, what);
    return fail(g, TS_ERR_UNSUPPORTED,
                "ggml type %s%s is not supported (supported: %s); "
                "requantize the model to one of them",
                name, what, list);
}

ts_tensor *ts_gguf_tensor(ts_gguf *g, const char *name) {
    if (!g)
        return NULL;
    int64_t k = ts_gguf_find_tensor(g, name);
    if (k < 0) {
        ts_set_error(g->ctx, TS_ERR_INVALID_ARG, "%s: no tensor \"%s\"",
                     g->path, name ? name : "(null)");
        return NULL;
    }
    const tensor_entry *t = &g->t[k];
    ts_dtype dt;
    if (ts_gguf_dtype_of(g, (int)t->type, t->name, &dt) != TS_OK)
        return NULL;
    int64_t shape[GGUF_MAX_DIMS];
    for (int d = 0; d < t->n_dims; d++)
        shape[d] = t->ne[t->n_dims - 1 - d];
    unsigned char *p = gguf_tensor_bytes(g, k);
    size_t es = ts_dtype_size(dt);
    if (es && (uintptr_t)p % es) /* an alignment below the element's */
        return ts_from_data(g->ctx, dt, t->n_dims, shape, p);
    ts_tensor *out = ts_tensor_wrap(g->ctx, dt, t->n_dims, shape, p,
                                    gguf_map_retain(g), map_release);
    if (!out)
        map_release(g->map);
    return out;
}
