/* safetensors.c — reading (mmap, zero copy where aligned, every header field
 * validated, sharded folders through model.safetensors.index.json) and
 * atomic writing of Hugging Face's safetensors format:
 *   8 bytes  little-endian u64 N, the header length
 *   N bytes  JSON: {"name": {"dtype", "shape", "data_offsets": [b, e]}, ...,
 *                   "__metadata__": {"k": "v"}}
 *   rest     the data section; offsets are relative to its start.
 * Owns the file mappings (refcounted: tensors viewing a file keep it mapped
 * after ts_safetensors_close), and handles over memory another reader owns
 * (st_from_regions: a GGUF under Hugging Face's names, gguf_hf.c). JSON
 * through jansson. */
#include "io/gguf_internal.h"
#include "tessera_gguf.h"
#include "tessera_io.h"

#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define MAX_HEADER 100000000ull

typedef struct {
    int refcount;
    void *base;
    size_t len;
    /* memory another reader owns (st_from_regions): released through it,
     * not unmapped here */
    void *owner;
    void (*owner_release)(void *owner);
} file_map;

typedef struct {
    char *name;
    ts_dtype dt;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    uint64_t begin, end; /* in the data section */
    int file;
} entry;

struct ts_safetensors {
    ts_ctx *ctx;
    int n_files;
    file_map **maps;
    char **paths;
    uint64_t *data_start; /* per file: 8 + N */
    entry *e;
    int n, cap;
    char **meta; /* key, value, key, value ... */
    int n_meta;
    /* names to entries: open addressing on the names' hashes, entry index
     * + 1 per slot (0: empty); n_slots a power of two >= 2 n */
    int *slot;
    size_t n_slots;
};

static size_t name_hash(const char *name) {
    return (size_t)XXH3_64bits(name, strlen(name));
}

/* The index of the entry called name, or -1. */
static int lookup(const ts_safetensors *st, const char *name) {
    if (!st || !name || !st->n_slots)
        return -1;
    size_t mask = st->n_slots - 1;
    for (size_t h = name_hash(name) & mask;; h = (h + 1) & mask) {
        int k = st->slot[h] - 1;
        if (k < 0)
            return -1;
        if (!strcmp(st->e[k].name, name))
            return k;
    }
}

/* The name index over every entry; an error naming a tensor that appears
 * twice (across shards too). */
static ts_status build_index(ts_safetensors *st, const char *path) {
    size_t n = 16;
    while (n < 2 * (size_t)st->n)
        n *= 2;
    st->slot = calloc(n, sizeof *st->slot);
    if (!st->slot)
        return ts_set_error(st->ctx, TS_ERR_OOM, "out of memory");
    st->n_slots = n;
    for (int i = 0; i < st->n; i++) {
        size_t h = name_hash(st->e[i].name) & (n - 1);
        for (; st->slot[h]; h = (h + 1) & (n - 1))
            if (!strcmp(st->e[st->slot[h] - 1].name, st->e[i].name))
                return ts_set_error(st->ctx, TS_ERR_IO,
                                    "%s: tensor \"%s\" appears twice", path,
                                    st->e[i].name);
        st->slot[h] = i + 1;
    }
    return TS_OK;
}

int ts_safetensors_find(const ts_safetensors *st, const char *name) {
    return lookup(st, name);
}

static void map_release(void *p) {
    file_map *m = p;
    if (--m->refcount > 0)
        return;
    if (m->owner_release)
        m->owner_release(m->owner);
    else
        munmap(m->base, m->len);
    free(m);
}

static const struct {
    const char *name;
    int dt; /* ts_dtype, or -1: known to safetensors, not supported here */
} dtypes[] = {{"F32", TS_F32}, {"BF16", TS_BF16}, {"F16", TS_F16},
              {"I32", TS_I32}, {"I64", TS_I64},   {"F64", -1},
              {"I8", -1},      {"U8", -1},        {"I16", -1},
              {"U16", -1},     {"U32", -1},       {"U64", -1},
              {"BOOL", -1},    {"F8_E4M3", -1},   {"F8_E5M2", -1}};

static const char *dtype_tag(ts_dtype dt) {
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (dtypes[i].dt == (int)dt)
            return dtypes[i].name;
    return NULL;
}

static int by_begin(const void *a, const void *b) {
    const entry *x = a, *y = b;
    if (x->file != y->file)
        return x->file - y->file;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static bool push_entry(ts_safetensors *st, const entry *e) {
    if (st->n == st->cap) {
        int cap = st->cap ? 2 * st->cap : 64;
        entry *p = realloc(st->e, sizeof *p * (size_t)cap);
        if (!p)
            return false;
        st->e = p;
        st->cap = cap;
    }
    st->e[st->n++] = *e;
    return true;
}

/* reads one tensor's header entry; on error records a message naming it */
static ts_status parse_entry(ts_ctx *ctx, const char *path, const char *name,
                             json_t *v, entry *e) {
    memset(e, 0, sizeof *e);
    if (!json_is_object(v))
        return ts_set_error(ctx, TS_ERR_IO,
                            "%s: tensor \"%s\": header entry is not an object",
                            path, name);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape");
    json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off))
        return ts_set_error(
            ctx, TS_ERR_IO,
            "%s: tensor \"%s\": needs \"dtype\" (string), \"shape\" "
            "(array) and \"data_offsets\" (array)",
            path, name);
    const char *tag = json_string_value(dt);
    int found = -2;
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (!strcmp(dtypes[i].name, tag))
            found = dtypes[i].dt;
    if (found == -2)
        return ts_set_error(ctx, TS_ERR_IO,
                            "%s: tensor \"%s\": unknown dtype \"%s\"", path,
                            name, tag);
    if (found == -1)
        return ts_set_error(
            ctx, TS_ERR_UNSUPPORTED,
            "%s: tensor \"%s\": dtype %s is not supported (F32, BF16, "
            "F16, I32, I64)",
            path, name, tag);
    e->dt = (ts_dtype)found;
    size_t nd = json_array_size(sh);
    if (nd > TS_MAX_DIMS)
        return ts_set_error(ctx, TS_ERR_IO,
                            "%s: tensor \"%s\": %zu dims (at most %d)", path,
                            name, nd, TS_MAX_DIMS);
    e->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t d = 0; d < nd; d++) {
        json_t *x = json_array_get(sh, d);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return ts_set_error(
                ctx, TS_ERR_IO,
                "%s: tensor \"%s\": shape entry %zu is not a size >= 0", path,
                name, d);
        e->shape[d] = json_integer_value(x);
        if (e->shape[d] && numel > UINT64_MAX / 16 / (uint64_t)e->shape[d])
            return ts_set_error(ctx, TS_ERR_IO,
                                "%s: tensor \"%s\": shape too large", path,
                                name);
        numel *= (uint64_t)e->shape[d];
    }
    json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (json_array_size(off) != 2 || !json_is_integer(b) ||
        !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b))
        return ts_set_error(
            ctx, TS_ERR_IO,
            "%s: tensor \"%s\": data_offsets must be [begin, end] with "
            "0 <= begin <= end",
            path, name);
    e->begin = (uint64_t)json_integer_value(b);
    e->end = (uint64_t)json_integer_value(en);
    if (e->end - e->begin != numel * ts_dtype_size(e->dt))
        return ts_set_error(
            ctx, TS_ERR_IO,
            "%s: tensor \"%s\": shape x dtype size is %llu bytes but "
            "data_offsets span %llu",
            path, name, (unsigned long long)(numel * ts_dtype_size(e->dt)),
            (unsigned long long)(e->end - e->begin));
    return TS_OK;
}

static ts_status open_file(ts_safetensors *st, const char *path) {
    ts_ctx *ctx = st->ctx;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return ts_set_error(ctx, TS_ERR_IO, "%s: cannot open: %s", path,
                            strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ts_set_error(ctx, TS_ERR_IO, "%s: not a regular file", path);
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        close(fd);
        return ts_set_error(
            ctx, TS_ERR_IO,
            "%s: %zu bytes, too short for a safetensors header (truncated?)",
            path, len);
    }
    /* private and writable: tensors used in place (zero-copy weights) may
     * be written, e.g. by an optimizer; the pages are copied on write and
     * the file never changes */
    void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    close(fd);
    if (base == MAP_FAILED)
        return ts_set_error(ctx, TS_ERR_IO, "%s: cannot map: %s", path,
                            strerror(errno));
    file_map *m = calloc(1, sizeof *m);
    int fi = st->n_files;
    file_map **maps = realloc(st->maps, sizeof *maps * (size_t)(fi + 1));
    if (maps)
        st->maps = maps;
    char **paths = realloc(st->paths, sizeof *paths * (size_t)(fi + 1));
    if (paths)
        st->paths = paths;
    uint64_t *ds = realloc(st->data_start, sizeof *ds * (size_t)(fi + 1));
    if (ds)
        st->data_start = ds;
    char *pcopy = strdup(path);
    if (!m || !maps || !paths || !ds || !pcopy) {
        munmap(base, len);
        free(m), free(pcopy);
        return ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", path);
    }
    m->refcount = 1, m->base = base, m->len = len;
    st->maps[fi] = m;
    st->paths[fi] = pcopy;
    st->n_files++;

    const unsigned char *p = base;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    if (!memcmp(p, "GGUF", 4))
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "%s: a GGUF file inside a model folder; give "
                            "the .gguf file itself as the model",
                            path);
    if (hlen > MAX_HEADER && (p[0] == '{' || p[0] == '['))
        return ts_set_error(ctx, TS_ERR_IO,
                            "%s: not a safetensors file (it starts with '%c': "
                            "JSON?); safetensors start with an 8-byte header "
                            "length",
                            path, p[0]);
    if (hlen > MAX_HEADER)
        return ts_set_error(ctx, TS_ERR_IO,
                            "%s: header length %llu is over the limit of %llu "
                            "(not a safetensors file?)",
                            path, (unsigned long long)hlen, MAX_HEADER);
    if (8 + hlen > len)
        return ts_set_error(
            ctx, TS_ERR_IO,
            "%s: header length %llu runs past the end of the %zu-byte "
            "file (truncated?)",
            path, (unsigned long long)hlen, len);
    st->data_start[fi] = 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen,
                              JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ts_set_error(ctx, TS_ERR_IO,
                            "%s: header is not valid JSON (%s, column %d)",
                            path, jerr.text, jerr.column);
    ts_status s = TS_OK;
    if (!json_is_object(root))
        s = ts_set_error(ctx, TS_ERR_IO, "%s: header is not a JSON object",
                         path);
    int first = st->n;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (s != TS_OK)
            break;
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                s = ts_set_error(ctx, TS_ERR_IO,
                                 "%s: __metadata__ is not an object", path);
                break;
            }
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    s = ts_set_error(ctx, TS_ERR_IO,
                                     "%s: __metadata__ \"%s\" is not a string",
                                     path, mk);
                    break;
                }
                if (fi > 0)
                    continue; /* the first file's metadata */
                char **mm = realloc(st->meta,
                                    sizeof *mm * (size_t)(2 * st->n_meta + 2));
                if (!mm) {
                    s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory",
                                     path);
                    break;
                }
                st->meta = mm;
                st->meta[2 * st->n_meta] = strdup(mk);
                st->meta[2 * st->n_meta + 1] = strdup(json_string_value(mv));
                st->n_meta++;
            }
            continue;
        }
        entry e;
        s = parse_entry(ctx, path, key, v, &e);
        if (s != TS_OK)
            break;
        e.file = fi;
        e.name = strdup(key);
        if (!e.name || !push_entry(st, &e)) {
            free(e.name);
            s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", path);
        }
    }
    json_decref(root);
    if (s != TS_OK)
        return s;
    /* the data section: tensors back to back from 0 to its end */
    qsort(st->e + first, (size_t)(st->n - first), sizeof *st->e, by_begin);
    uint64_t at = 0;
    for (int i = first; i < st->n; i++) {
        const entry *e = &st->e[i];
        if (e->begin != at)
            return ts_set_error(
                ctx, TS_ERR_IO,
                "%s: tensor \"%s\" starts at byte %llu of the data, where "
                "%llu was expected (%s)",
                path, e->name, (unsigned long long)e->begin,
                (unsigned long long)at, e->begin < at ? "overlap" : "hole");
        at = e->end;
    }
    if (at > data_len)
        return ts_set_error(
            ctx, TS_ERR_IO,
            "%s: tensor \"%s\" ends at byte %llu but the data section has "
            "%llu (truncated?)",
            path, st->e[st->n - 1].name, (unsigned long long)at,
            (unsigned long long)data_len);
    if (at < data_len)
        return ts_set_error(
            ctx, TS_ERR_IO,
            "%s: %llu bytes after the last tensor are not described by "
            "the header",
            path, (unsigned long long)(data_len - at));
    return TS_OK;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static ts_status open_index(ts_safetensors *st, const char *dir,
                            const char *index) {
    ts_ctx *ctx = st->ctx;
    json_error_t jerr;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ts_set_error(ctx, TS_ERR_IO, "%s: not valid JSON (%s, line %d)",
                            index, jerr.text, jerr.line);
    json_t *wm = json_object_get(root, "weight_map");
    ts_status s = TS_OK;
    if (!json_is_object(wm)) {
        s = ts_set_error(ctx, TS_ERR_IO, "%s: no \"weight_map\" object", index);
        goto done;
    }
    /* shards in order of first appearance */
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v)) {
            s = ts_set_error(ctx, TS_ERR_IO,
                             "%s: weight_map[\"%s\"] is not a file name", index,
                             name);
            goto done;
        }
        const char *shard = json_string_value(v);
        if (strchr(shard, '/')) {
            s = ts_set_error(ctx, TS_ERR_IO,
                             "%s: shard \"%s\" is not a file in the folder",
                             index, shard);
            goto done;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        bool seen = false;
        for (int f = 0; f < st->n_files; f++)
            seen |= !strcmp(st->paths[f], path);
        if (!seen && (s = open_file(st, path)) != TS_OK)
            goto done;
    }
    if ((s = build_index(st, index)) != TS_OK)
        goto done;
    json_object_foreach(wm, name, v) { /* every listed tensor is in its shard */
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(v));
        int k = lookup(st, name);
        bool found = k >= 0 && !strcmp(st->paths[st->e[k].file], path);
        if (!found) {
            s = ts_set_error(ctx, TS_ERR_IO,
                             "%s: tensor \"%s\" is not in its shard %s", index,
                             name, path);
            goto done;
        }
    }
done:
    json_decref(root);
    return s;
}

ts_status ts_safetensors_open(ts_ctx *ctx, const char *path,
                              ts_safetensors **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!path || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_safetensors_open: NULL argument");
    *out = NULL;
    ts_safetensors *st = calloc(1, sizeof *st);
    if (!st)
        return ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    st->ctx = ctx;
    ts_status s;
    if (is_dir(path)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        if (exists(p)) {
            s = open_index(st, path, p);
        } else {
            snprintf(p, sizeof p, "%s/model.safetensors", path);
            s = exists(p)
                    ? open_file(st, p)
                    : ts_set_error(ctx, TS_ERR_IO,
                                   "%s: no model.safetensors or "
                                   "model.safetensors.index.json in the folder",
                                   path);
        }
    } else if (ts_file_is_gguf(path)) { /* its tensors under HF names */
        free(st);
        return ts_gguf_open_as_safetensors(ctx, path, out);
    } else {
        s = open_file(st, path);
    }
    if (s == TS_OK && !st->slot) /* names unique across shards */
        s = build_index(st, path);
    if (s != TS_OK) {
        ts_safetensors_close(st);
        return s;
    }
    *out = st;
    return TS_OK;
}

ts_status st_from_regions(ts_ctx *ctx, const char *origin, int n_regions,
                          const st_region *regions, int n,
                          const st_entry_desc *entries, ts_safetensors **out) {
    *out = NULL;
    ts_safetensors *st = calloc(1, sizeof *st);
    if (st) {
        st->ctx = ctx;
        st->maps = calloc((size_t)n_regions + 1, sizeof *st->maps);
        st->paths = calloc((size_t)n_regions + 1, sizeof *st->paths);
        st->data_start = calloc((size_t)n_regions + 1, sizeof *st->data_start);
    }
    bool ok = st && st->maps && st->paths && st->data_start;
    for (int f = 0; f < n_regions; f++) { /* each taken over, even now */
        file_map *m = ok ? calloc(1, sizeof *m) : NULL;
        char *path = m ? strdup(origin) : NULL;
        if (!path) {
            free(m);
            regions[f].owner_release(regions[f].owner);
            ok = false;
            continue;
        }
        *m = (file_map){1, regions[f].base, regions[f].len, regions[f].owner,
                        regions[f].owner_release};
        st->maps[f] = m, st->paths[f] = path, st->n_files++;
    }
    ts_status s =
        ok ? TS_OK : ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", origin);
    for (int i = 0; i < n && s == TS_OK; i++) {
        const st_entry_desc *d = &entries[i];
        int64_t numel = 1;
        for (int k = 0; k < d->ndim; k++)
            numel *= d->shape[k];
        const file_map *m = d->region >= 0 && d->region < n_regions
                                ? st->maps[d->region]
                                : NULL;
        const char *p = d->data, *base = m ? m->base : NULL;
        if (!m || p < base || d->bytes > m->len ||
            (size_t)(p - base) > m->len - d->bytes ||
            ts_dtype_nbytes(d->dt, numel) != (int64_t)d->bytes) {
            s = ts_set_error(ctx, TS_ERR_IO,
                             "%s: tensor \"%s\" lies outside its memory or "
                             "has %llu bytes for its shape",
                             origin, d->name, (unsigned long long)d->bytes);
            break;
        }
        entry e = {.dt = d->dt, .ndim = d->ndim, .file = d->region};
        memcpy(e.shape, d->shape, sizeof(int64_t) * (size_t)d->ndim);
        e.begin = (uint64_t)(p - base), e.end = e.begin + d->bytes;
        if (!(e.name = strdup(d->name)) || !push_entry(st, &e)) {
            free(e.name);
            s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", origin);
        }
    }
    if (s == TS_OK)
        s = build_index(st, origin);
    if (s != TS_OK) {
        ts_safetensors_close(st);
        return s;
    }
    *out = st;
    return TS_OK;
}

void ts_safetensors_close(ts_safetensors *st) {
    if (!st)
        return;
    for (int i = 0; i < st->n; i++)
        free(st->e[i].name);
    for (int f = 0; f < st->n_files; f++) {
        map_release(st->maps[f]);
        free(st->paths[f]);
    }
    for (int k = 0; k < 2 * st->n_meta; k++)
        free(st->meta[k]);
    free(st->meta), free(st->e), free(st->maps), free(st->paths),
        free(st->data_start), free(st->slot);
    free(st);
}

int ts_safetensors_count(const ts_safetensors *st) {
    return st ? st->n : 0;
}

const char *ts_safetensors_name(const ts_safetensors *st, int i) {
    return st && i >= 0 && i < st->n ? st->e[i].name : NULL;
}

const char *ts_safetensors_metadata(const ts_safetensors *st, const char *key) {
    for (int k = 0; st && key && k < st->n_meta; k++)
        if (!strcmp(st->meta[2 * k], key))
            return st->meta[2 * k + 1];
    return NULL;
}

ts_tensor *ts_safetensors_get(ts_safetensors *st, const char *name) {
    if (!st)
        return NULL;
    int k = lookup(st, name);
    const entry *e = k >= 0 ? &st->e[k] : NULL;
    if (!e) {
        ts_set_error(st->ctx, TS_ERR_INVALID_ARG, "%s: no tensor \"%s\"",
                     st->n_files ? st->paths[0] : "safetensors",
                     name ? name : "(null)");
        return NULL;
    }
    file_map *m = st->maps[e->file];
    char *p = (char *)m->base + st->data_start[e->file] + e->begin;
    size_t es = ts_dtype_size(e->dt); /* 0: a block format, any address */
    if (es && (uintptr_t)p % es != 0) /* unaligned: a copy */
        return ts_from_data(st->ctx, e->dt, e->ndim, e->shape, p);
    m->refcount++;
    ts_tensor *t =
        ts_tensor_wrap(st->ctx, e->dt, e->ndim, e->shape, p, m, map_release);
    if (!t)
        map_release(m);
    return t;
}

static const entry *find_entry(const ts_safetensors *st, const char *name) {
    int k = lookup(st, name);
    return k >= 0 ? &st->e[k] : NULL;
}

bool ts_safetensors_shape(const ts_safetensors *st, const char *name,
                          ts_dtype *dt, int *ndim, int64_t *shape) {
    const entry *e = find_entry(st, name);
    if (!e)
        return false;
    if (dt)
        *dt = e->dt;
    if (ndim)
        *ndim = e->ndim;
    if (shape)
        memcpy(shape, e->shape, sizeof(int64_t) * (size_t)e->ndim);
    return true;
}

/* The first element of n whose bits under mask are all set (an IEEE
 * NaN or Inf: exponent all ones), or -1. Blocks of 1024 elements are
 * tested without branches (vectorizable), the hit found inside its block.
 * width: 2 or 4 bytes; p may be unaligned. */
static int64_t first_nonfinite(const unsigned char *p, int64_t n, int width,
                               uint32_t mask) {
    enum { BLOCK = 1024 };
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t m = n - b < BLOCK ? n - b : BLOCK;
        const unsigned char *q = p + b * width;
        uint32_t any = 0;
        if (width == 4)
            for (int64_t i = 0; i < m; i++) {
                uint32_t u;
                memcpy(&u, q + 4 * i, 4);
                any |= (u & mask) == mask;
            }
        else
            for (int64_t i = 0; i < m; i++) {
                uint16_t u;
                memcpy(&u, q + 2 * i, 2);
                any |= ((uint32_t)u & mask) == mask;
            }
        if (!any)
            continue;
        for (int64_t i = 0; i < m; i++) {
            uint32_t u = 0;
            if (width == 4)
                memcpy(&u, q + 4 * i, 4);
            else {
                uint16_t h;
                memcpy(&h, q + 2 * i, 2);
                u = h;
            }
            if ((u & mask) == mask)
                return b + i;
        }
    }
    return -1;
}

ts_status ts_safetensors_check_finite(ts_safetensors *st, const char *name) {
    if (!st)
        return TS_ERR_INVALID_ARG;
    const entry *e = find_entry(st, name);
    if (!e)
        return ts_set_error(st->ctx, TS_ERR_INVALID_ARG, "%s: no tensor \"%s\"",
                            st->n_files ? st->paths[0] : "safetensors",
                            name ? name : "(null)");
    if (ts_dtype_is_quantized(e->dt)) {
        /* a block's values are its f16 scales times integers: NaN or Inf
         * only through a scale (d; Q4_K/Q5_K's dmin too; Q6_K's d last) */
        size_t bb = ts_dtype_block_bytes(e->dt);
        size_t d_at = e->dt == TS_Q6_K ? bb - 2 : 0;
        bool dmin = e->dt == TS_Q4_K || e->dt == TS_Q5_K;
        const unsigned char *q =
            (const unsigned char *)st->maps[e->file]->base +
            st->data_start[e->file] + e->begin;
        uint64_t nb = (e->end - e->begin) / bb;
        for (uint64_t b = 0; b < nb; b++)
            for (int k = 0; k < (dmin ? 2 : 1); k++) {
                uint16_t h;
                memcpy(&h, q + b * bb + d_at + 2 * (size_t)k, 2);
                if ((h & 0x7c00u) == 0x7c00u)
                    return ts_set_error(
                        st->ctx, TS_ERR_IO,
                        "%s: tensor \"%s\" (%s) has a %s scale in block %llu "
                        "(of %llu): the file is damaged (--no-check-weights "
                        "loads it anyway)",
                        st->paths[e->file], e->name, ts_dtype_name(e->dt),
                        h & 0x3ffu ? "NaN" : "infinite", (unsigned long long)b,
                        (unsigned long long)nb);
            }
        return TS_OK;
    }
    int width = e->dt == TS_F32 ? 4 : 2;
    uint32_t mask = e->dt == TS_F32    ? 0x7f800000u
                    : e->dt == TS_BF16 ? 0x7f80u
                    : e->dt == TS_F16  ? 0x7c00u
                                       : 0;
    if (!mask)
        return TS_OK; /* integers are always finite */
    const unsigned char *p = (const unsigned char *)st->maps[e->file]->base +
                             st->data_start[e->file] + e->begin;
    int64_t n = (int64_t)((e->end - e->begin) / (uint64_t)width);
    int64_t at = first_nonfinite(p, n, width, mask);
    if (at < 0)
        return TS_OK;
    uint32_t u = 0;
    if (width == 4)
        memcpy(&u, p + 4 * at, 4);
    else {
        uint16_t h;
        memcpy(&h, p + 2 * at, 2);
        u = h;
    }
    bool nan = (u & ~mask & (width == 4 ? 0x7fffffffu : 0x7fffu)) != 0;
    return ts_set_error(
        st->ctx, TS_ERR_IO,
        "%s: tensor \"%s\" holds %s at flat index %lld (of %lld %s values): "
        "the checkpoint is damaged (--no-check-weights loads it anyway)",
        st->paths[e->file], e->name,
        nan                      ? "NaN"
        : (u >> (width * 8 - 1)) ? "-Inf"
                                 : "Inf",
        (long long)at, (long long)n, ts_dtype_name(e->dt));
}

/* ---- writing ---- */

ts_status ts_safetensors_save(ts_ctx *ctx, const char *path, int n,
                              const char *const *names, ts_tensor *const *ts,
                              int n_meta, const char *const *meta) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!path || n < 0 || (n && (!names || !ts)) || n_meta < 0 ||
        (n_meta && !meta))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_safetensors_save: bad arguments");
    json_t *root = json_object();
    ts_status s = root ? TS_OK : ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    uint64_t off = 0;
    for (int i = 0; i < n && s == TS_OK; i++) {
        if (!names[i] || !*names[i] || !strcmp(names[i], "__metadata__") ||
            !ts[i]) {
            s = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                             "%s: entry %d has no tensor or an invalid name",
                             path, i);
            break;
        }
        if (json_object_get(root, names[i])) {
            s = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                             "%s: tensor \"%s\" given twice", path, names[i]);
            break;
        }
        json_t *shape = json_array();
        for (int d = 0; d < ts_tensor_ndim(ts[i]); d++)
            json_array_append_new(shape,
                                  json_integer(ts_tensor_shape(ts[i])[d]));
        uint64_t bytes = (uint64_t)ts_tensor_numel(ts[i]) *
                         ts_dtype_size(ts_tensor_dtype(ts[i]));
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype",
                              dtype_tag(ts_tensor_dtype(ts[i])), "shape", shape,
                              "data_offsets", (json_int_t)off,
                              (json_int_t)(off + bytes));
        if (!e || json_object_set_new(root, names[i], e))
            s = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
        off += bytes;
    }
    if (s == TS_OK && n_meta) {
        json_t *m = json_object();
        for (int k = 0; k < n_meta && m; k++)
            json_object_set_new(m, meta[2 * k], json_string(meta[2 * k + 1]));
        if (!m || json_object_set_new(root, "__metadata__", m))
            s = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    }
    char *hdr = s == TS_OK
                    ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER)
                    : NULL;
    json_decref(root);
    if (s == TS_OK && !hdr)
        s = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    if (s != TS_OK) {
        free(hdr);
        return s;
    }
    size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7; /* spaces to 8 */
    ts_atomic_file f;
    if (!ts_atomic_open(&f, path)) {
        free(hdr);
        return ts_set_error(ctx, TS_ERR_IO, "%s: cannot create %s: %s", path,
                            f.tmp, strerror(f.err));
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    bool ok = ts_atomic_write(&f, len8, 8) && ts_atomic_write(&f, hdr, hl) &&
              ts_atomic_write(&f, "        ", padded - hl);
    free(hdr);
    for (int i = 0; i < n && ok; i++) {
        size_t bytes = (size_t)ts_tensor_numel(ts[i]) *
                       ts_dtype_size(ts_tensor_dtype(ts[i]));
        void *buf = malloc(bytes ? bytes : 1);
        ok = buf &&
             ts_tensor_read(ts[i], buf, ts_tensor_dtype(ts[i])) == TS_OK &&
             ts_atomic_write(&f, buf, bytes);
        free(buf);
    }
    if (!ts_atomic_commit(&f, ok))
        return ts_set_error(ctx, TS_ERR_IO,
                            "%s: write failed (%s); the previous file is kept",
                            path, strerror(f.err ? f.err : EIO));
    return TS_OK;
}
