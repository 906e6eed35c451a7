/* bpe.c — Hugging Face tokenizer.json for byte-level BPE models (GPT-2,
 * Llama 3, Qwen2/3): the NFC normalizer (utf8proc), Split and ByteLevel
 * pre-tokenizers (PCRE2 with Unicode properties), the BPE merges, added
 * and special tokens matched before everything else, the ByteLevel
 * decoder and a streaming decoder that only emits whole UTF-8 characters.
 * Owns the vocabulary and merge tables; knows nothing of models. */
#define _GNU_SOURCE /* memmem */
#include "tessera_tokenizer.h"

#include "core/core.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define MAX_SPLITS 4

/* ---- hash tables ---- */

typedef struct {
    char **keys; /* string -> id */
    int32_t *vals;
    size_t cap, n;
} str_map;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static bool smap_init(str_map *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 16)
        m->cap <<= 1;
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->vals = calloc(m->cap, sizeof *m->vals);
    m->n = 0;
    return m->keys && m->vals;
}

static int32_t smap_get(const str_map *m, const char *k, size_t n) {
    size_t i = fnv(k, n) & (m->cap - 1);
    while (m->keys[i]) {
        if (strlen(m->keys[i]) == n && !memcmp(m->keys[i], k, n))
            return m->vals[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

/* k is kept (not copied); the table must have room (sized at init) */
static void smap_put(str_map *m, char *k, int32_t v) {
    size_t n = strlen(k), i = fnv(k, n) & (m->cap - 1);
    while (m->keys[i]) {
        if (!strcmp(m->keys[i], k)) {
            m->vals[i] = v;
            return;
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = k;
    m->vals[i] = v;
    m->n++;
}

typedef struct {
    uint64_t *keys; /* (a << 32 | b) + 1; 0 = empty */
    int32_t *rank, *merged;
    size_t cap;
} pair_map;

static bool pmap_init(pair_map *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 16)
        m->cap <<= 1;
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->rank = calloc(m->cap, sizeof *m->rank);
    m->merged = calloc(m->cap, sizeof *m->merged);
    return m->keys && m->rank && m->merged;
}

static size_t pmap_slot(const pair_map *m, uint64_t key) {
    size_t i = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & (m->cap - 1);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static uint64_t pair_key(int32_t a, int32_t b) {
    return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

/* ---- the tokenizer ---- */

typedef struct {
    char *content;
    size_t len;
    int32_t id;
    bool special;
} added_token;

struct ts_tokenizer {
    ts_ctx *ctx;
    char **id_to_token; /* byte-level form; added tokens: their content */
    bool *is_added, *is_special;
    int32_t vocab_size;
    str_map vocab;
    pair_map merges;
    added_token *added;
    int n_added;
    bool nfc;
    pcre2_code *split[MAX_SPLITS];
    int n_split;
    bool add_prefix_space;
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[512];
};

static const char *gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
    "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to
 * code points from 256 up, so every byte is a visible character. */
static void byte_map(ts_tokenizer *t) {
    int n = 0;
    for (int i = 0; i < 512; i++)
        t->cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable =
            (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        t->byte_to_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        t->cp_to_byte[t->byte_to_cp[b]] = (int16_t)b;
    }
}

static int put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80)
        return o[0] = (char)cp, 1;
    if (cp < 0x800)
        return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)),
               2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)), o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

void ts_tokenizer_free(ts_tokenizer *t) {
    if (!t)
        return;
    for (int32_t i = 0; i < t->vocab_size; i++)
        free(t->id_to_token[i]);
    free(t->id_to_token), free(t->is_added), free(t->is_special);
    free(t->vocab.keys), free(t->vocab.vals);
    free(t->merges.keys), free(t->merges.rank), free(t->merges.merged);
    free(t->added);
    for (int i = 0; i < t->n_split; i++)
        pcre2_code_free(t->split[i]);
    free(t);
}

static ts_status add_split(ts_tokenizer *t, const char *file,
                           const char *pattern) {
    if (t->n_split == MAX_SPLITS)
        return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                            "%s: more than %d split steps", file, MAX_SPLITS);
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ts_set_error(
            t->ctx, TS_ERR_UNSUPPORTED,
            "%s: pre-tokenizer regex does not compile at offset %zu: %s", file,
            (size_t)off, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up */
    t->split[t->n_split++] = re;
    return TS_OK;
}

/* one pre-tokenizer step (or a Sequence of them) */
static ts_status parse_pretok(ts_tokenizer *t, const char *file, json_t *p) {
    if (!p || json_is_null(p))
        return TS_OK;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) {
            ts_status s = parse_pretok(t, file, v);
            if (s)
                return s;
        }
        return TS_OK;
    }
    if (type && !strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *behavior =
            json_string_value(json_object_get(p, "behavior"));
        if (!re || !behavior || strcmp(behavior, "Isolated") ||
            json_is_true(json_object_get(p, "invert")))
            return ts_set_error(
                t->ctx, TS_ERR_UNSUPPORTED,
                "%s: Split pre-tokenizer supported with a Regex pattern, "
                "behavior Isolated, invert false",
                file);
        return add_split(t, file, re);
    }
    if (type && !strcmp(type, "ByteLevel")) {
        t->add_prefix_space =
            json_is_true(json_object_get(p, "add_prefix_space"));
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur))
            return add_split(t, file, gpt2_pattern);
        return TS_OK;
    }
    return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                        "%s: pre-tokenizer \"%s\" is not supported (Sequence, "
                        "Split, ByteLevel)",
                        file, type ? type : "?");
}

ts_status ts_tokenizer_load(ts_ctx *ctx, const char *path, ts_tokenizer **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!path || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "tokenizer_load: NULL argument");
    *out = NULL;
    char file[4096];
    ts_file_in(path, "tokenizer.json", file, sizeof file);
    json_error_t jerr;
    json_t *root = json_load_file(file, 0, &jerr);
    if (!root)
        return ts_set_error(ctx, TS_ERR_IO, "%s: %s (line %d)", file, jerr.text,
                            jerr.line);
    ts_tokenizer *t = calloc(1, sizeof *t);
    ts_status s = t ? TS_OK : ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    if (t)
        t->ctx = ctx, byte_map(t);
    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!s && (!mtype || strcmp(mtype, "BPE")))
        s = ts_set_error(
            ctx, TS_ERR_UNSUPPORTED,
            "%s: tokenizer model \"%s\" is not supported (byte-level BPE)",
            file, mtype ? mtype : "(none)");
    if (!s && json_is_true(json_object_get(model, "byte_fallback")))
        s = ts_set_error(
            ctx, TS_ERR_UNSUPPORTED,
            "%s: BPE with byte_fallback (SentencePiece style) is not supported",
            file);
    /* normalizer: none, NFC, or a Sequence of NFC */
    json_t *norm = json_object_get(root, "normalizer");
    if (!s && norm && !json_is_null(norm)) {
        const char *nt = json_string_value(json_object_get(norm, "type"));
        json_t *list = json_object_get(norm, "normalizers");
        if (nt && !strcmp(nt, "Sequence") && json_array_size(list) == 1)
            nt = json_string_value(
                json_object_get(json_array_get(list, 0), "type"));
        if (nt && !strcmp(nt, "NFC"))
            t->nfc = true;
        else if (!(nt && !strcmp(nt, "Sequence") && json_array_size(list) == 0))
            s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                             "%s: normalizer \"%s\" is not supported (NFC)",
                             file, nt ? nt : "?");
    }
    if (!s)
        s = parse_pretok(t, file, json_object_get(root, "pre_tokenizer"));
    json_t *dec = json_object_get(root, "decoder");
    const char *dt = json_string_value(json_object_get(dec, "type"));
    if (!s && dec && !json_is_null(dec) && (!dt || strcmp(dt, "ByteLevel")))
        s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: decoder \"%s\" is not supported (ByteLevel)",
                         file, dt ? dt : "?");
    /* vocabulary: ids may leave no gaps up to the largest, added tokens
     * included */
    json_t *vocab = json_object_get(model, "vocab"),
           *added = json_object_get(root, "added_tokens");
    if (!s && !json_is_object(vocab))
        s = ts_set_error(ctx, TS_ERR_IO, "%s: model.vocab is not an object",
                         file);
    int32_t max_id = -1;
    const char *key;
    json_t *v;
    size_t i;
    if (!s) {
        json_object_foreach(vocab, key, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > INT32_MAX / 2) {
                s = ts_set_error(ctx, TS_ERR_IO,
                                 "%s: vocab entry \"%s\" has no valid id", file,
                                 key);
                break;
            }
            if (json_integer_value(v) > max_id)
                max_id = (int32_t)json_integer_value(v);
        }
        json_array_foreach(added, i, v) {
            json_int_t id = json_integer_value(json_object_get(v, "id"));
            if (id > max_id && id < INT32_MAX / 2)
                max_id = (int32_t)id;
        }
    }
    if (!s) {
        t->vocab_size = max_id + 1;
        t->id_to_token = calloc((size_t)t->vocab_size + 1, sizeof(char *));
        t->is_added = calloc((size_t)t->vocab_size + 1, 1);
        t->is_special = calloc((size_t)t->vocab_size + 1, 1);
        t->added = calloc(json_array_size(added) + 1, sizeof *t->added);
        if (!t->id_to_token || !t->is_added || !t->is_special || !t->added ||
            !smap_init(&t->vocab,
                       json_object_size(vocab) + json_array_size(added)))
            s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", file);
    }
    if (!s) {
        json_object_foreach(vocab, key, v) {
            int32_t id = (int32_t)json_integer_value(v);
            free(t->id_to_token[id]);
            t->id_to_token[id] = strdup(key);
            smap_put(&t->vocab, t->id_to_token[id], id);
        }
        json_array_foreach(added, i, v) {
            const char *c = json_string_value(json_object_get(v, "content"));
            json_int_t id = json_integer_value(json_object_get(v, "id"));
            if (!c || !*c || id < 0 || id > max_id) {
                s = ts_set_error(ctx, TS_ERR_IO,
                                 "%s: added token %zu has no content or id",
                                 file, i);
                break;
            }
            if (!t->id_to_token[id]) {
                t->id_to_token[id] = strdup(c);
                smap_put(&t->vocab, t->id_to_token[id], (int32_t)id);
            }
            t->is_added[id] = 1;
            t->is_special[id] = json_is_true(json_object_get(v, "special"));
            added_token *a = &t->added[t->n_added++];
            a->content = t->id_to_token[id];
            a->len = strlen(c);
            a->id = (int32_t)id;
            a->special = t->is_special[id];
        }
    }
    /* merges: ["a", "b"] pairs (or "a b" strings), in rank order */
    json_t *merges = json_object_get(model, "merges");
    if (!s && !pmap_init(&t->merges, json_array_size(merges)))
        s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", file);
    json_array_foreach(merges, i, v) {
        if (s)
            break;
        char a[1024], b[1024];
        if (json_is_array(v) && json_array_size(v) == 2 &&
            json_is_string(json_array_get(v, 0)) &&
            json_is_string(json_array_get(v, 1))) {
            snprintf(a, sizeof a, "%s",
                     json_string_value(json_array_get(v, 0)));
            snprintf(b, sizeof b, "%s",
                     json_string_value(json_array_get(v, 1)));
        } else if (json_is_string(v) && strchr(json_string_value(v), ' ')) {
            const char *m = json_string_value(v), *sp = strchr(m, ' ');
            snprintf(a, sizeof a, "%.*s", (int)(sp - m), m);
            snprintf(b, sizeof b, "%s", sp + 1);
        } else {
            s = ts_set_error(ctx, TS_ERR_IO,
                             "%s: merge %zu is not a pair of strings", file, i);
            break;
        }
        char ab[2048];
        snprintf(ab, sizeof ab, "%s%s", a, b);
        int32_t ia = smap_get(&t->vocab, a, strlen(a)),
                ib = smap_get(&t->vocab, b, strlen(b));
        int32_t im = smap_get(&t->vocab, ab, strlen(ab));
        if (ia < 0 || ib < 0 || im < 0) {
            s = ts_set_error(
                ctx, TS_ERR_IO,
                "%s: merge %zu (\"%s\" + \"%s\") names a token not in "
                "the vocabulary",
                file, i, a, b);
            break;
        }
        size_t slot = pmap_slot(&t->merges, pair_key(ia, ib));
        if (!t->merges.keys[slot]) { /* the first (lowest) rank wins */
            t->merges.keys[slot] = pair_key(ia, ib);
            t->merges.rank[slot] = (int32_t)i;
            t->merges.merged[slot] = im;
        }
    }
    json_decref(root);
    if (s) {
        ts_tokenizer_free(t);
        return s;
    }
    *out = t;
    return TS_OK;
}

int32_t ts_tokenizer_vocab_size(const ts_tokenizer *t) {
    return t ? t->vocab_size : 0;
}

int32_t ts_tokenizer_token_id(const ts_tokenizer *t, const char *token) {
    return t && token ? smap_get(&t->vocab, token, strlen(token)) : -1;
}

/* ---- encoding ---- */

typedef struct {
    int32_t *v;
    size_t n, cap;
    bool oom;
} ids_vec;

static void push_id(ids_vec *o, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        int32_t *p = realloc(o->v, sizeof *p * cap);
        if (!p) {
            o->oom = true;
            return;
        }
        o->v = p, o->cap = cap;
    }
    o->v[o->n++] = id;
}

/* BPE on one pre-token (raw bytes): byte-level characters, then merges by
 * rank until none applies. */
static void bpe_word(ts_tokenizer *t, const unsigned char *w, size_t n,
                     ids_vec *o) {
    int32_t stack_sym[64],
        *sym = n <= 64 ? stack_sym : malloc(sizeof(int32_t) * n);
    if (!sym) {
        o->oom = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        char c[5];
        int k = put_utf8(c, t->byte_to_cp[w[i]]);
        sym[i] = smap_get(&t->vocab, c, (size_t)k);
    }
    size_t m = n;
    for (;;) {
        int32_t best = INT32_MAX, merged = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            if (sym[i] < 0 || sym[i + 1] < 0)
                continue;
            size_t s = pmap_slot(&t->merges, pair_key(sym[i], sym[i + 1]));
            if (t->merges.keys[s] && t->merges.rank[s] < best)
                best = t->merges.rank[s], merged = t->merges.merged[s], at = i;
        }
        if (merged < 0)
            break;
        sym[at] = merged;
        memmove(sym + at + 1, sym + at + 2, sizeof(int32_t) * (m - at - 2));
        m--;
    }
    for (size_t i = 0; i < m; i++)
        push_id(o, sym[i]);
    if (sym != stack_sym)
        free(sym);
}

/* splits [p, p+n) by regex r into pieces (matches and the gaps between) */
static void split_pieces(pcre2_code *re, const char *p, size_t n,
                         pcre2_match_data *md,
                         void (*emit)(void *, const char *, size_t),
                         void *arg) {
    size_t off = 0, last = 0;
    while (off < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)p, n, off, PCRE2_NO_UTF_CHECK, md,
                             NULL);
        if (rc < 0)
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[0] > last)
            emit(arg, p + last, ov[0] - last);
        if (ov[1] > ov[0])
            emit(arg, p + ov[0], ov[1] - ov[0]);
        last = ov[1];
        off = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
        while (off < n && ((unsigned char)p[off] & 0xC0) == 0x80)
            off++; /* whole chars */
    }
    if (last < n)
        emit(arg, p + last, n - last);
}

typedef struct {
    ts_tokenizer *t;
    int level;
    pcre2_match_data *md;
    ids_vec *out;
} split_ctx;

static void on_piece(void *arg, const char *p, size_t n) {
    split_ctx *c = arg;
    if (c->level + 1 < c->t->n_split) {
        split_ctx next = *c;
        next.level++;
        split_pieces(c->t->split[next.level], p, n, c->md, on_piece, &next);
    } else {
        bpe_word(c->t, (const unsigned char *)p, n, c->out);
    }
}

static ts_status encode_plain(ts_tokenizer *t, const char *p, size_t n,
                              pcre2_match_data *md, ids_vec *out) {
    if (!n)
        return TS_OK;
    char *norm = NULL;
    if (t->nfc) {
        char *z = malloc(n + 1);
        if (!z)
            return ts_set_error(t->ctx, TS_ERR_OOM, "tokenizer: out of memory");
        memcpy(z, p, n);
        z[n] = 0;
        norm = (char *)utf8proc_NFC((const utf8proc_uint8_t *)z);
        free(z);
        if (!norm)
            return ts_set_error(t->ctx, TS_ERR_OOM, "tokenizer: out of memory");
        p = norm, n = strlen(norm);
    }
    char *with_space = NULL;
    if (t->add_prefix_space && n && p[0] != ' ') {
        with_space = malloc(n + 2);
        if (with_space)
            with_space[0] = ' ', memcpy(with_space + 1, p, n), p = with_space,
            n++;
    }
    split_ctx c = {t, 0, md, out};
    if (t->n_split)
        split_pieces(t->split[0], p, n, md, on_piece, &c);
    else
        bpe_word(t, (const unsigned char *)p, n, out);
    free(norm), free(with_space);
    return out->oom
               ? ts_set_error(t->ctx, TS_ERR_OOM, "tokenizer: out of memory")
               : TS_OK;
}

ts_status ts_tokenizer_encode(ts_tokenizer *t, const char *text, size_t len,
                              bool allow_special, int32_t **ids, size_t *n) {
    if (!t)
        return TS_ERR_INVALID_ARG;
    if (!ids || !n || (!text && len))
        return ts_set_error(t->ctx, TS_ERR_INVALID_ARG,
                            "tokenizer_encode: NULL argument");
    *ids = NULL, *n = 0;
    utf8proc_int32_t cp;
    for (size_t i = 0; i < len;) { /* valid UTF-8 only */
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)text + i,
                             (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0)
            return ts_set_error(t->ctx, TS_ERR_INVALID_ARG,
                                "tokenizer_encode: invalid UTF-8 at byte %zu",
                                i);
        i += (size_t)k;
    }
    pcre2_match_data *md =
        t->n_split ? pcre2_match_data_create_from_pattern(t->split[0], NULL)
                   : NULL;
    ids_vec out = {0};
    ts_status s = TS_OK;
    size_t pos = 0;
    while (pos < len && s == TS_OK) {
        /* the next added token: earliest, then longest */
        size_t best_at = len;
        const added_token *best = NULL;
        for (int k = 0; allow_special && k < t->n_added; k++) {
            const added_token *a = &t->added[k];
            const char *hit = memmem(text + pos, len - pos, a->content, a->len);
            if (!hit)
                continue;
            size_t at = (size_t)(hit - text);
            if (at < best_at || (at == best_at && best && a->len > best->len))
                best_at = at, best = a;
        }
        s = encode_plain(t, text + pos, best_at - pos, md, &out);
        if (best && s == TS_OK) {
            push_id(&out, best->id);
            pos = best_at + best->len;
        } else {
            pos = len;
        }
    }
    if (md)
        pcre2_match_data_free(md);
    if (s == TS_OK && out.oom)
        s = ts_set_error(t->ctx, TS_ERR_OOM, "tokenizer: out of memory");
    if (s != TS_OK) {
        free(out.v);
        return s;
    }
    *ids = out.v ? out.v : malloc(sizeof(int32_t));
    *n = out.n;
    return TS_OK;
}

/* ---- decoding ---- */

/* the bytes of one token into o (at least 4 x strlen(token) room) */
static size_t token_bytes(const ts_tokenizer *t, int32_t id, unsigned char *o) {
    const char *s = t->id_to_token[id];
    size_t n = strlen(s), k = 0;
    if (t->is_added[id]) {
        memcpy(o, s, n);
        return n;
    }
    utf8proc_int32_t cp;
    for (size_t i = 0; i < n;) {
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                              (utf8proc_ssize_t)(n - i), &cp);
        if (l <= 0)
            break;
        if (cp >= 0 && cp < 512 && t->cp_to_byte[cp] >= 0)
            o[k++] = (unsigned char)t->cp_to_byte[cp];
        else
            k += (size_t)put_utf8((char *)o + k,
                                  (uint32_t)cp); /* not a byte char */
        i += (size_t)l;
    }
    return k;
}

static ts_status check_id(const ts_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->vocab_size || !t->id_to_token[id])
        return ts_set_error(t->ctx, TS_ERR_RANGE,
                            "tokenizer: id %d is not in the vocabulary (%d)",
                            id, t->vocab_size);
    return TS_OK;
}

ts_status ts_tokenizer_decode(ts_tokenizer *t, const int32_t *ids, size_t n,
                              bool skip_special, char **text, size_t *len) {
    if (!t)
        return TS_ERR_INVALID_ARG;
    if (!text || !len || (!ids && n))
        return ts_set_error(t->ctx, TS_ERR_INVALID_ARG,
                            "tokenizer_decode: NULL argument");
    *text = NULL, *len = 0;
    size_t cap = 1;
    for (size_t i = 0; i < n; i++) {
        if (check_id(t, ids[i]))
            return t->ctx->status;
        cap += 4 * strlen(t->id_to_token[ids[i]]);
    }
    unsigned char *o = malloc(cap);
    if (!o)
        return ts_set_error(t->ctx, TS_ERR_OOM, "tokenizer: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!(skip_special && t->is_special[ids[i]]))
            k += token_bytes(t, ids[i], o + k);
    o[k] = 0;
    *text = (char *)o;
    *len = k;
    return TS_OK;
}

/* length of the UTF-8 sequence a lead byte starts; 0 for a bad lead */
static int seq_len(unsigned char c) {
    return c < 0x80         ? 1
           : (c >> 5) == 6  ? 2
           : (c >> 4) == 14 ? 3
           : (c >> 3) == 30 ? 4
                            : 0;
}

ts_status ts_tokenizer_decode_step(ts_tokenizer *t, ts_detok_state *st,
                                   int32_t id, char *out, size_t out_cap,
                                   size_t *out_len) {
    if (!t)
        return TS_ERR_INVALID_ARG;
    if (!st || !out_len || (!out && out_cap))
        return ts_set_error(t->ctx, TS_ERR_INVALID_ARG,
                            "tokenizer_decode_step: NULL argument");
    *out_len = 0;
    if (check_id(t, id))
        return t->ctx->status;
    size_t tl = strlen(t->id_to_token[id]);
    unsigned char stack[256],
        *buf = tl * 4 + 8 <= sizeof stack ? stack : malloc(tl * 4 + 8);
    if (!buf)
        return ts_set_error(t->ctx, TS_ERR_OOM, "tokenizer: out of memory");
    memcpy(buf, st->pending, (size_t)st->n_pending);
    size_t n = (size_t)st->n_pending + token_bytes(t, id, buf + st->n_pending);
    size_t i = 0, k = 0;
    ts_status s = TS_OK;
    while (i < n) {
        int l = seq_len(buf[i]);
        bool ok = l > 0;
        for (int j = 1; ok && j < l && i + (size_t)j < n; j++)
            ok = (buf[i + j] & 0xC0) == 0x80;
        if (ok && i + (size_t)l > n)
            break; /* a partial character: keep it */
        const char *emit =
            ok ? (const char *)buf + i : "\xEF\xBF\xBD"; /* U+FFFD */
        size_t el = ok ? (size_t)l : 3;
        if (k + el > out_cap) {
            s = ts_set_error(t->ctx, TS_ERR_RANGE,
                             "tokenizer_decode_step: out of room");
            break;
        }
        memcpy(out + k, emit, el);
        k += el;
        i += ok ? (size_t)l : 1;
    }
    st->n_pending = (int)(n - i < sizeof st->pending ? n - i : 0);
    memcpy(st->pending, buf + i, (size_t)st->n_pending);
    *out_len = k;
    if (buf != stack)
        free(buf);
    return s;
}
