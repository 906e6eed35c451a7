/* data.c — token shards (written atomically, read through mmap) and the
 * loader that cuts them into shuffled windows and gives each rank its
 * slice of every global batch (tessera_train.h). */
#include "tessera_train.h"

#include "core/core.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- shards ---- */

ts_status ts_shard_write(ts_ctx *ctx, const char *path, const int32_t *ids,
                         size_t n) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!path || (!ids && n))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "shard_write: NULL");
    uint32_t width = 2;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0)
            return ts_set_error(ctx, TS_ERR_RANGE,
                                "shard_write: token %d at %zu is negative",
                                ids[i], i);
        if (ids[i] > 65535)
            width = 4;
    }
    uint32_t h32[4] = {TS_SHARD_MAGIC, TS_SHARD_VERSION, width, 0};
    uint64_t h64[2] = {(uint64_t)n, 0};
    ts_atomic_file f;
    if (!ts_atomic_open(&f, path))
        return ts_set_error(ctx, TS_ERR_IO, "%s: cannot create: %s", path,
                            strerror(f.err));
    bool ok = ts_atomic_write(&f, h32, sizeof h32) &&
              ts_atomic_write(&f, h64, sizeof h64);
    enum { CH = 1 << 16 };
    uint16_t b16[CH];
    for (size_t i = 0; ok && i < n; i += CH) {
        size_t k = n - i < CH ? n - i : CH;
        if (width == 4)
            ok = ts_atomic_write(&f, ids + i, k * 4);
        else {
            for (size_t j = 0; j < k; j++)
                b16[j] = (uint16_t)ids[i + j];
            ok = ts_atomic_write(&f, b16, k * 2);
        }
    }
    if (!ts_atomic_commit(&f, ok))
        return ts_set_error(ctx, TS_ERR_IO, "%s: write failed: %s", path,
                            strerror(f.err ? f.err : EIO));
    return TS_OK;
}

struct ts_shard {
    void *map;
    size_t len;
    uint32_t width;
    uint64_t count;
    const unsigned char *tokens;
};

ts_status ts_shard_open(ts_ctx *ctx, const char *path, ts_shard **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ts_set_error(ctx, TS_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || sb.st_size < TS_SHARD_HEADER) {
        close(fd);
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "%s: not a token shard (%lld bytes, shorter than "
                            "its header)",
                            path, (long long)sb.st_size);
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return ts_set_error(ctx, TS_ERR_IO, "%s: mmap: %s", path,
                            strerror(errno));
    uint32_t h32[4];
    uint64_t count;
    memcpy(h32, m, sizeof h32);
    memcpy(&count, (char *)m + 16, 8);
    const char *bad = NULL;
    if (h32[0] != TS_SHARD_MAGIC)
        bad = "not a token shard (bad magic)";
    else if (h32[1] != TS_SHARD_VERSION)
        bad = "a shard version this build does not read";
    else if (h32[2] != 2 && h32[2] != 4)
        bad = "a token width other than 2 or 4 bytes";
    else if (count > ((uint64_t)sb.st_size - TS_SHARD_HEADER) / h32[2] ||
             TS_SHARD_HEADER + count * h32[2] != (uint64_t)sb.st_size)
        bad = "a token count that does not match the file's size";
    if (bad) {
        munmap(m, (size_t)sb.st_size);
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "%s: %s", path, bad);
    }
    ts_shard *s = calloc(1, sizeof *s);
    if (!s) {
        munmap(m, (size_t)sb.st_size);
        return ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    }
    *s = (ts_shard){m, (size_t)sb.st_size, h32[2], count,
                    (const unsigned char *)m + TS_SHARD_HEADER};
    *out = s;
    return TS_OK;
}

void ts_shard_close(ts_shard *s) {
    if (s)
        munmap(s->map, s->len), free(s);
}

uint64_t ts_shard_count(const ts_shard *s) {
    return s ? s->count : 0;
}

int32_t ts_shard_token(const ts_shard *s, uint64_t i) {
    if (s->width == 2) {
        uint16_t v;
        memcpy(&v, s->tokens + 2 * i, 2);
        return v;
    }
    int32_t v;
    memcpy(&v, s->tokens + 4 * i, 4);
    return v;
}

/* ---- the loader ---- */

struct ts_loader {
    ts_ctx *ctx;
    ts_shard **sh;
    int n_sh;
    uint64_t *first; /* stream offset of each shard's first token */
    uint64_t total;
    int64_t seq, windows;
    uint64_t seed, pos;
    bool shuffle;
    int64_t *perm; /* the current epoch's order */
    int64_t perm_epoch;
};

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

ts_status ts_loader_open(ts_ctx *ctx, const char *dir, const char *split,
                         int64_t seq, uint64_t seed, bool shuffle,
                         ts_loader **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    if (seq < 1)
        return ts_set_error(ctx, TS_ERR_RANGE, "loader: seq %lld (want >= 1)",
                            (long long)seq);
    DIR *d = opendir(dir);
    if (!d)
        return ts_set_error(ctx, TS_ERR_IO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    size_t pl = strlen(split);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, split, pl) || e->d_name[pl] != '_' || l < 4 ||
            strcmp(e->d_name + l - 4, ".bin"))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **p = realloc(names, sizeof *p * (size_t)cap);
            if (!p)
                break;
            names = p;
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    ts_loader *l = calloc(1, sizeof *l);
    ts_status st = l ? TS_OK : ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    if (st == TS_OK && !n)
        st = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                          "%s: no %s_*.bin shards (made by tessera "
                          "prepare-data)",
                          dir, split);
    if (st == TS_OK) {
        qsort(names, (size_t)n, sizeof *names, cmp_str);
        l->ctx = ctx, l->seq = seq, l->seed = seed, l->shuffle = shuffle;
        l->sh = calloc((size_t)n, sizeof *l->sh);
        l->first = calloc((size_t)n, sizeof *l->first);
        l->perm_epoch = -1;
        if (!l->sh || !l->first)
            st = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    }
    for (int i = 0; st == TS_OK && i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        st = ts_shard_open(ctx, path, &l->sh[i]);
        if (st == TS_OK) {
            l->first[i] = l->total;
            l->total += l->sh[i]->count;
            l->n_sh++;
        }
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (st == TS_OK) {
        l->windows = l->total > (uint64_t)seq
                         ? (int64_t)((l->total - 1) / (uint64_t)seq)
                         : 0;
        if (!l->windows)
            st = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                              "%s: the %s split has %llu tokens, fewer than "
                              "one sequence of %lld + 1",
                              dir, split, (unsigned long long)l->total,
                              (long long)seq);
    }
    if (st == TS_OK) {
        l->perm = malloc(sizeof *l->perm * (size_t)l->windows);
        if (!l->perm)
            st = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    }
    if (st != TS_OK) {
        ts_loader_free(l);
        return st;
    }
    *out = l;
    return TS_OK;
}

void ts_loader_free(ts_loader *l) {
    if (!l)
        return;
    for (int i = 0; i < l->n_sh; i++)
        ts_shard_close(l->sh[i]);
    free(l->sh), free(l->first), free(l->perm), free(l);
}

int64_t ts_loader_windows(const ts_loader *l) {
    return l->windows;
}

int64_t ts_loader_tokens(const ts_loader *l) {
    return (int64_t)l->total;
}

uint64_t ts_loader_position(const ts_loader *l) {
    return l->pos;
}

void ts_loader_seek(ts_loader *l, uint64_t position) {
    l->pos = position;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* the window order of epoch ep: Fisher-Yates from (seed, epoch) */
static void make_perm(ts_loader *l, int64_t ep) {
    for (int64_t i = 0; i < l->windows; i++)
        l->perm[i] = i;
    if (l->shuffle) {
        uint64_t s = l->seed * 0x2545f4914f6cdd1dull + (uint64_t)ep + 1;
        for (int64_t i = l->windows - 1; i > 0; i--) {
            int64_t j = (int64_t)(splitmix(&s) % (uint64_t)(i + 1));
            int64_t t = l->perm[i];
            l->perm[i] = l->perm[j], l->perm[j] = t;
        }
    }
    l->perm_epoch = ep;
}

static int32_t stream_token(const ts_loader *l, uint64_t at) {
    int lo = 0, hi = l->n_sh - 1;
    while (lo < hi) { /* the last shard starting at or before at */
        int mid = (lo + hi + 1) / 2;
        if (l->first[mid] <= at)
            lo = mid;
        else
            hi = mid - 1;
    }
    return ts_shard_token(l->sh[lo], at - l->first[lo]);
}

ts_status ts_loader_next(ts_loader *l, int64_t batch, int rank, int world,
                         int64_t *ids, int64_t *targets) {
    if (world < 1 || rank < 0 || rank >= world || batch < 1 || batch % world)
        return ts_set_error(l->ctx, TS_ERR_RANGE,
                            "loader: batch %lld over %d ranks (want a "
                            "multiple of the ranks)",
                            (long long)batch, world);
    int64_t local = batch / world;
    for (int64_t b = 0; b < local; b++) {
        uint64_t k = l->pos + (uint64_t)(rank * local + b);
        int64_t ep = (int64_t)(k / (uint64_t)l->windows);
        if (ep != l->perm_epoch)
            make_perm(l, ep);
        uint64_t start =
            (uint64_t)l->perm[k % (uint64_t)l->windows] * (uint64_t)l->seq;
        for (int64_t t = 0; t < l->seq; t++) {
            ids[b * l->seq + t] = stream_token(l, start + (uint64_t)t);
            targets[b * l->seq + t] = stream_token(l, start + (uint64_t)t + 1);
        }
    }
    l->pos += (uint64_t)batch;
    return TS_OK;
}

/* ---- the tokenizer's fingerprint ---- */

ts_status ts_tokenizer_file_hash(ts_ctx *ctx, const char *path,
                                 char out[TS_TOKENIZER_HASH_LEN], char *file,
                                 size_t file_cap) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    char p[4200];
    struct stat sb;
    if (!stat(path, &sb) && S_ISDIR(sb.st_mode))
        snprintf(p, sizeof p, "%s/tokenizer.json", path);
    else
        snprintf(p, sizeof p, "%s", path);
    if (file)
        snprintf(file, file_cap, "%s", p);
    FILE *f = fopen(p, "rb");
    if (!f)
        return ts_set_error(ctx, TS_ERR_IO, "%s: %s", p, strerror(errno));
    XXH3_state_t *h = XXH3_createState();
    if (!h) {
        fclose(f);
        return ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    }
    XXH3_128bits_reset(h);
    char buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0)
        XXH3_128bits_update(h, buf, k);
    bool bad = ferror(f);
    fclose(f);
    XXH128_hash_t v = XXH3_128bits_digest(h);
    XXH3_freeState(h);
    if (bad)
        return ts_set_error(ctx, TS_ERR_IO, "cannot read %s", p);
    snprintf(out, TS_TOKENIZER_HASH_LEN, "xxh3-128:%016llx%016llx",
             (unsigned long long)v.high64, (unsigned long long)v.low64);
    return TS_OK;
}
