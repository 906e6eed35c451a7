/* bpe.c — Hugging Face tokenizer.json for BPE models of two kinds:
 * byte-level (GPT-2, Llama 3, Qwen2/3: ByteLevel pre-tokenizer and
 * decoder) and SentencePiece-style (Llama 2, Gemma: characters as symbols,
 * `▁` for spaces through the Prepend/Replace normalizers or the Metaspace
 * pre-tokenizer, <0xXX> byte fallback, the Replace/ByteFallback/Fuse/Strip
 * or Metaspace decoders). Also the NFC normalizer (utf8proc), Split
 * pre-tokenizers (PCRE2 with Unicode properties), the BPE merges (a heap,
 * so long words stay n log n), added and special tokens matched before
 * everything else (a trie), and a streaming decoder that only emits whole
 * UTF-8 characters. Owns the vocabulary and merge tables; knows nothing of
 * models. */
#define _GNU_SOURCE /* memmem */
#include "tessera_tokenizer.h"

#include "bytelevel.h"
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

typedef enum { NORM_NFC, NORM_PREPEND, NORM_REPLACE } norm_kind;
typedef struct {
    norm_kind kind;
    char *a, *b; /* PREPEND: a; REPLACE: a -> b */
} norm_step;

typedef enum {
    SPLIT_ISOLATED,
    SPLIT_MERGED_PREV,
    SPLIT_MERGED_NEXT,
    SPLIT_REMOVED
} split_behavior;

#define MAX_NORM 4

/* added tokens by their bytes: edges (node, byte) -> node in a hash */
typedef struct {
    uint64_t *keys; /* node << 8 | byte, + 1; 0 = empty */
    int32_t *child;
    size_t cap;
    int32_t *term;     /* node -> added index or -1 */
    uint8_t first[32]; /* bitmap of the bytes an added token starts with */
    int32_t n_nodes, cap_nodes;
} trie;

struct ts_tokenizer {
    ts_ctx *ctx;
    bool byte_level; /* else SentencePiece-style: symbols are characters */
    bool byte_fallback;
    int32_t byte_ids[256]; /* the <0xXX> tokens, or -1 */
    int32_t unk_id;
    bool fuse_unk;
    norm_step norm[MAX_NORM];
    int n_norm;
    int metaspace; /* pre-tokenizer: 0 none, else prepend 1 never, 2 first,
                      3 always */
    /* SentencePiece-style decoder: replace dec_from by dec_to in each
     * token, <0xXX> as bytes, then strip dec_strip leading spaces */
    char *dec_from, *dec_to;
    int dec_strip;
    trie added_trie;
    split_behavior split_how[MAX_SPLITS];
    /* the post-processor's special tokens around a single text */
    int32_t prefix[4], suffix[4];
    int n_prefix, n_suffix;
    char **id_to_token; /* byte-level form; added tokens: their content */
    bool *is_added, *is_special;
    int32_t vocab_size;
    str_map vocab;
    pair_map merges;
    added_token *added;
    int n_added;
    pcre2_code *split[MAX_SPLITS];
    int n_split;
    bool add_prefix_space;
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[512];
};

/* GPT-2's bytes_to_unicode (bytelevel.h) both ways */
static void byte_map(ts_tokenizer *t) {
    for (int i = 0; i < 512; i++)
        t->cp_to_byte[i] = -1;
    ts_byte_level_map(t->byte_to_cp);
    for (int b = 0; b < 256; b++)
        t->cp_to_byte[t->byte_to_cp[b]] = (int16_t)b;
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
    for (int i = 0; i < t->n_norm; i++)
        free(t->norm[i].a), free(t->norm[i].b);
    free(t->dec_from), free(t->dec_to);
    free(t->added_trie.keys), free(t->added_trie.child),
        free(t->added_trie.term);
    for (int i = 0; i < t->n_split; i++)
        pcre2_code_free(t->split[i]);
    free(t);
}

static ts_status add_split(ts_tokenizer *t, const char *file,
                           const char *pattern, split_behavior how) {
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
    t->split_how[t->n_split] = how;
    t->split[t->n_split++] = re;
    return TS_OK;
}

/* A tokenizer.json step (normalizer, pre-tokenizer, post-processor,
 * decoder), or a Sequence of them listed under key: each through one. */
typedef ts_status (*step_fn)(ts_tokenizer *t, const char *file, json_t *p);
static ts_status parse_steps(ts_tokenizer *t, const char *file, json_t *p,
                             const char *key, step_fn one) {
    if (!p || json_is_null(p))
        return TS_OK;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type || strcmp(type, "Sequence"))
        return one(t, file, p);
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(p, key), i, v) {
        ts_status s = parse_steps(t, file, v, key, one);
        if (s)
            return s;
    }
    return TS_OK;
}

/* one pre-tokenizer step */
static ts_status parse_pretok_step(ts_tokenizer *t, const char *file,
                                   json_t *p) {
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && !strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        const char *behavior =
            json_string_value(json_object_get(p, "behavior"));
        static const char *names[] = {"Isolated", "MergedWithPrevious",
                                      "MergedWithNext", "Removed"};
        int how = -1;
        for (int k = 0; behavior && k < 4; k++)
            if (!strcmp(behavior, names[k]))
                how = k;
        if ((!re && !lit) || how < 0 ||
            json_is_true(json_object_get(p, "invert")))
            return ts_set_error(
                t->ctx, TS_ERR_UNSUPPORTED,
                "%s: Split pre-tokenizer supported with a Regex or String "
                "pattern, behavior Isolated, MergedWithPrevious, "
                "MergedWithNext or Removed, invert false",
                file);
        if (re)
            return add_split(t, file, re, (split_behavior)how);
        char quoted[1024]; /* a literal: \Q...\E */
        if (strlen(lit) + 5 > sizeof quoted || strstr(lit, "\\E"))
            return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                                "%s: Split String pattern too long", file);
        snprintf(quoted, sizeof quoted, "\\Q%s\\E", lit);
        return add_split(t, file, quoted, (split_behavior)how);
    }
    if (type && !strcmp(type, "Metaspace")) {
        const char *rep = json_string_value(json_object_get(p, "replacement"));
        const char *scheme =
            json_string_value(json_object_get(p, "prepend_scheme"));
        json_t *aps = json_object_get(p, "add_prefix_space");
        if (rep && strcmp(rep, "\u2581"))
            return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                                "%s: Metaspace replacement \"%s\" is not "
                                "supported (U+2581)",
                                file, rep);
        t->metaspace = scheme ? (!strcmp(scheme, "never")   ? 1
                                 : !strcmp(scheme, "first") ? 2
                                                            : 3)
                       : aps && !json_is_true(aps) ? 1
                                                   : 3;
        json_t *split = json_object_get(p, "split");
        if (!split || json_is_true(split))
            return add_split(t, file, "\u2581", SPLIT_MERGED_NEXT);
        return TS_OK;
    }
    if (type && !strcmp(type, "ByteLevel")) {
        t->add_prefix_space =
            json_is_true(json_object_get(p, "add_prefix_space"));
        json_t *ur = json_object_get(p, "use_regex");
        t->byte_level = true;
        if (!ur || json_is_true(ur))
            return add_split(t, file, TS_GPT2_PATTERN, SPLIT_ISOLATED);
        return TS_OK;
    }
    return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                        "%s: pre-tokenizer \"%s\" is not supported (Sequence, "
                        "Split, ByteLevel, Metaspace)",
                        file, type ? type : "?");
}

/* ---- added tokens: a byte trie for leftmost-longest matching ---- */

static int32_t trie_child(const trie *tr, int32_t node, unsigned char c) {
    uint64_t key = ((uint64_t)node << 8 | c) + 1;
    size_t i = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & (tr->cap - 1);
    while (tr->keys[i] && tr->keys[i] != key)
        i = (i + 1) & (tr->cap - 1);
    return tr->keys[i] ? tr->child[i] : -1;
}

static bool trie_build(ts_tokenizer *t) {
    trie *tr = &t->added_trie;
    size_t bytes = 1;
    for (int k = 0; k < t->n_added; k++)
        bytes += t->added[k].len;
    tr->cap = 16;
    while (tr->cap < 2 * bytes)
        tr->cap <<= 1;
    tr->keys = calloc(tr->cap, sizeof *tr->keys);
    tr->child = calloc(tr->cap, sizeof *tr->child);
    tr->term = malloc(sizeof *tr->term * bytes);
    if (!tr->keys || !tr->child || !tr->term)
        return false;
    tr->n_nodes = 1;
    tr->term[0] = -1;
    for (int k = 0; k < t->n_added; k++) {
        int32_t node = 0;
        const unsigned char *c = (const unsigned char *)t->added[k].content;
        tr->first[c[0] >> 3] |= (uint8_t)(1u << (c[0] & 7));
        for (size_t j = 0; j < t->added[k].len; j++) {
            uint64_t key = ((uint64_t)node << 8 | c[j]) + 1;
            size_t i =
                (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & (tr->cap - 1);
            while (tr->keys[i] && tr->keys[i] != key)
                i = (i + 1) & (tr->cap - 1);
            if (!tr->keys[i]) {
                tr->keys[i] = key;
                tr->child[i] = tr->n_nodes;
                tr->term[tr->n_nodes++] = -1;
            }
            node = tr->child[i];
        }
        if (tr->term[node] < 0) /* the first of duplicate contents wins */
            tr->term[node] = k;
    }
    return true;
}

/* the longest added token starting at p, or NULL */
static const added_token *trie_match(const ts_tokenizer *t, const char *p,
                                     size_t n, bool allow_special) {
    const trie *tr = &t->added_trie;
    const added_token *best = NULL;
    int32_t node = 0;
    unsigned char c0 = (unsigned char)p[0];
    if (!n || !(tr->first[c0 >> 3] & (1u << (c0 & 7))))
        return NULL;
    for (size_t j = 0; j < n; j++) {
        node = trie_child(tr, node, (unsigned char)p[j]);
        if (node < 0)
            break;
        int32_t k = tr->term[node];
        if (k >= 0 && (allow_special || !t->added[k].special))
            best = &t->added[k];
    }
    return best;
}

/* post_processor: TemplateProcessing's "single" template gives the
 * special tokens around a text (Llama's <s>, Llama 3's
 * <|begin_of_text|>); ByteLevel adds none; Sequence of those. */
static ts_status parse_post_step(ts_tokenizer *t, const char *file, json_t *p) {
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type &&
        (!strcmp(type, "ByteLevel") || !strcmp(type, "RobertaProcessing") ||
         !strcmp(type, "BertProcessing")))
        return TS_OK; /* offsets only, or pairs we do not encode */
    if (!type || strcmp(type, "TemplateProcessing"))
        return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                            "%s: post_processor \"%s\" is not supported "
                            "(TemplateProcessing, ByteLevel, Sequence)",
                            file, type ? type : "?");
    json_t *single = json_object_get(p, "single"),
           *specials = json_object_get(p, "special_tokens");
    bool after = false;
    size_t i;
    json_t *item;
    json_array_foreach(single, i, item) {
        if (json_object_get(item, "Sequence")) {
            after = true;
            continue;
        }
        const char *name = json_string_value(
            json_object_get(json_object_get(item, "SpecialToken"), "id"));
        json_t *ids =
            json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (!name || !json_is_array(ids))
            return ts_set_error(t->ctx, TS_ERR_IO,
                                "%s: post_processor item %zu names no special "
                                "token with ids",
                                file, i);
        size_t k;
        json_t *id;
        json_array_foreach(ids, k, id) {
            json_int_t v = json_integer_value(id);
            int *n = after ? &t->n_suffix : &t->n_prefix;
            if (*n == 4 || v < 0 || v >= t->vocab_size)
                return ts_set_error(t->ctx, TS_ERR_IO,
                                    "%s: post_processor special token \"%s\" "
                                    "is out of range or too many",
                                    file, name);
            (after ? t->suffix : t->prefix)[(*n)++] = (int32_t)v;
        }
    }
    return TS_OK;
}

size_t ts_tokenizer_prefix_ids(const ts_tokenizer *t, const int32_t **ids) {
    *ids = t->prefix;
    return (size_t)t->n_prefix;
}

size_t ts_tokenizer_suffix_ids(const ts_tokenizer *t, const int32_t **ids) {
    *ids = t->suffix;
    return (size_t)t->n_suffix;
}

ts_status ts_tokenizer_encode_text(ts_tokenizer *t, const char *text,
                                   size_t len, bool add_special_tokens,
                                   int32_t **ids, size_t *n) {
    ts_status s = ts_tokenizer_encode(t, text, len, true, ids, n);
    size_t np = add_special_tokens ? (size_t)t->n_prefix : 0,
           ns = add_special_tokens ? (size_t)t->n_suffix : 0;
    if (s != TS_OK || (!np && !ns))
        return s;
    int32_t *all = realloc(*ids, sizeof(int32_t) * (np + *n + ns));
    if (!all) {
        free(*ids), *ids = NULL, *n = 0;
        return ts_set_error(t->ctx, TS_ERR_OOM, "tokenizer: out of memory");
    }
    memmove(all + np, all, sizeof(int32_t) * *n);
    memcpy(all, t->prefix, sizeof(int32_t) * np);
    memcpy(all + np + *n, t->suffix, sizeof(int32_t) * ns);
    *ids = all, *n += np + ns;
    return TS_OK;
}

/* normalizers: NFC, Prepend, Replace (String pattern), or a Sequence */
static ts_status parse_normalizer_step(ts_tokenizer *t, const char *file,
                                       json_t *n) {
    const char *type = json_string_value(json_object_get(n, "type"));
    if (t->n_norm == MAX_NORM)
        return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                            "%s: more than %d normalizer steps", file,
                            MAX_NORM);
    norm_step *st = &t->norm[t->n_norm];
    if (type && !strcmp(type, "NFC")) {
        st->kind = NORM_NFC;
        t->n_norm++;
        return TS_OK;
    }
    if (type && !strcmp(type, "Prepend")) {
        const char *pre = json_string_value(json_object_get(n, "prepend"));
        if (pre) {
            st->kind = NORM_PREPEND, st->a = strdup(pre);
            t->n_norm++;
            return TS_OK;
        }
    }
    if (type && !strcmp(type, "Replace")) {
        const char *from = json_string_value(
            json_object_get(json_object_get(n, "pattern"), "String"));
        const char *to = json_string_value(json_object_get(n, "content"));
        if (from && *from && to) {
            st->kind = NORM_REPLACE, st->a = strdup(from), st->b = strdup(to);
            t->n_norm++;
            return TS_OK;
        }
    }
    return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                        "%s: normalizer \"%s\" is not supported (NFC, "
                        "Prepend, Replace with a String pattern, Sequence)",
                        file, type ? type : "?");
}

/* decoders: ByteLevel; Metaspace; or a Sequence of Replace (String),
 * ByteFallback, Fuse and Strip (leading spaces only) */
static ts_status parse_decoder_step(ts_tokenizer *t, const char *file,
                                    json_t *d) {
    const char *type = json_string_value(json_object_get(d, "type"));
    if (type && !strcmp(type, "ByteLevel")) {
        t->byte_level = true;
        return TS_OK;
    }
    if (type && (!strcmp(type, "ByteFallback") || !strcmp(type, "Fuse")))
        return TS_OK; /* bytes of <0xXX> tokens join whatever follows */
    if (type && !strcmp(type, "Metaspace")) {
        const char *scheme =
            json_string_value(json_object_get(d, "prepend_scheme"));
        json_t *aps = json_object_get(d, "add_prefix_space");
        free(t->dec_from), free(t->dec_to);
        t->dec_from = strdup("\u2581"), t->dec_to = strdup(" ");
        t->dec_strip = (scheme && !strcmp(scheme, "never")) ||
                               (!scheme && aps && !json_is_true(aps))
                           ? 0
                           : 1;
        return TS_OK;
    }
    if (type && !strcmp(type, "Replace") && !t->dec_from) {
        const char *from = json_string_value(
            json_object_get(json_object_get(d, "pattern"), "String"));
        const char *to = json_string_value(json_object_get(d, "content"));
        /* no longer than what it replaces: decoded text never grows */
        if (from && *from && to && strlen(to) <= strlen(from)) {
            t->dec_from = strdup(from), t->dec_to = strdup(to);
            return TS_OK;
        }
    }
    if (type && !strcmp(type, "Strip")) {
        const char *c = json_string_value(json_object_get(d, "content"));
        json_int_t start = json_integer_value(json_object_get(d, "start"));
        json_int_t stop = json_integer_value(json_object_get(d, "stop"));
        if (c && !strcmp(c, " ") && start >= 0 && start < 16 && stop == 0) {
            t->dec_strip = (int)start;
            return TS_OK;
        }
    }
    return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                        "%s: decoder \"%s\" is not supported (ByteLevel, "
                        "Metaspace, Replace, ByteFallback, Fuse, Strip)",
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
    if (!s) {
        t->byte_fallback =
            json_is_true(json_object_get(model, "byte_fallback"));
        t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
        s = parse_steps(t, file, json_object_get(root, "normalizer"),
                        "normalizers", parse_normalizer_step);
    }
    if (!s)
        s = parse_steps(t, file, json_object_get(root, "pre_tokenizer"),
                        "pretokenizers", parse_pretok_step);
    if (!s)
        s = parse_steps(t, file, json_object_get(root, "decoder"), "decoders",
                        parse_decoder_step);
    json_t *post = json_object_get(root, "post_processor");
    if (!s && t->byte_level && (t->byte_fallback || t->metaspace))
        s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: a ByteLevel tokenizer with byte_fallback or "
                         "Metaspace is not supported",
                         file);
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
    if (!s) {
        const char *unk =
            json_string_value(json_object_get(model, "unk_token"));
        t->unk_id = unk ? smap_get(&t->vocab, unk, strlen(unk)) : -1;
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_ids[b] = smap_get(&t->vocab, name, strlen(name));
        }
        if (!trie_build(t))
            s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", file);
    }
    if (!s)
        s = parse_steps(t, file, post, "processors", parse_post_step);
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

/* BPE merges over the symbols sym[0..m): the lowest-ranked pair first,
 * the leftmost among equals (as Hugging Face's tokenizers does), with a
 * binary heap of candidate pairs over a linked list of symbols, so a long
 * word (a SentencePiece text without a pre-tokenizer) stays m log m. */
typedef struct {
    int32_t rank, pos, left, right;
} merge_cand;

static bool cand_less(merge_cand a, merge_cand b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(merge_cand *h, size_t *n, merge_cand c) {
    size_t i = (*n)++;
    while (i && cand_less(c, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static merge_cand heap_pop(merge_cand *h, size_t *n) {
    merge_cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && cand_less(h[c + 1], h[c]))
            c++;
        if (!cand_less(h[c], last))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static void push_cand(const ts_tokenizer *t, merge_cand *h, size_t *n,
                      const int32_t *sym, int32_t i, int32_t j) {
    if (sym[i] < 0 || sym[j] < 0)
        return;
    size_t s = pmap_slot(&t->merges, pair_key(sym[i], sym[j]));
    if (t->merges.keys[s])
        heap_push(h, n, (merge_cand){t->merges.rank[s], i, sym[i], sym[j]});
}

/* the same rule by rescanning the pairs after each merge: quadratic, but
 * faster than the heap for the short words most pre-tokenizers make */
static void bpe_merge_short(ts_tokenizer *t, int32_t *sym, size_t m,
                            ids_vec *o) {
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
}

static void bpe_merge(ts_tokenizer *t, int32_t *sym, size_t m, ids_vec *o) {
    if (m <= 16) {
        bpe_merge_short(t, sym, m, o);
        return;
    }
    /* most words are short: their lists and heap live on the stack */
    int32_t stack_links[2 * 64];
    merge_cand stack_heap[3 * 64];
    bool small = m <= 64;
    int32_t *next = small ? stack_links : malloc(sizeof(int32_t) * m * 2),
            *prev = next ? next + m : NULL;
    merge_cand *heap = small ? stack_heap : malloc(sizeof *heap * 3 * m);
    if (!next || !heap) {
        if (!small)
            free(next), free(heap);
        o->oom = true;
        return;
    }
    size_t nh = 0;
    for (size_t i = 0; i < m; i++) {
        next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
        prev[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < m; i++)
        push_cand(t, heap, &nh, sym, (int32_t)i, (int32_t)i + 1);
    while (nh) {
        merge_cand c = heap_pop(heap, &nh);
        int32_t j = next[c.pos];
        /* stale: a merge changed one side since this pair was queued */
        if (sym[c.pos] != c.left || j < 0 || sym[j] != c.right)
            continue;
        size_t s = pmap_slot(&t->merges, pair_key(c.left, c.right));
        sym[c.pos] = t->merges.merged[s];
        sym[j] = -2; /* gone */
        next[c.pos] = next[j];
        if (next[j] >= 0)
            prev[next[j]] = c.pos;
        if (prev[c.pos] >= 0)
            push_cand(t, heap, &nh, sym, prev[c.pos], c.pos);
        if (next[c.pos] >= 0)
            push_cand(t, heap, &nh, sym, c.pos, next[c.pos]);
    }
    for (int32_t i = 0; i >= 0; i = next[i])
        push_id(o, sym[i]);
    if (!small)
        free(next), free(heap);
}

/* One pre-token (raw bytes) to symbols, then merges. Byte-level: each byte
 * as its GPT-2 character. SentencePiece-style: each character; one that
 * is not in the vocabulary becomes its <0xXX> byte tokens (byte_fallback)
 * or the unknown token (consecutive ones fused when fuse_unk). */
static void bpe_word(ts_tokenizer *t, const unsigned char *w, size_t n,
                     ids_vec *o) {
    int32_t stack_sym[64],
        *sym = n <= 64 ? stack_sym : malloc(sizeof(int32_t) * n);
    if (!sym) {
        o->oom = true;
        return;
    }
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        int32_t id;
        size_t len = 1;
        if (t->byte_level) {
            char c[5];
            int k = ts_put_utf8(c, t->byte_to_cp[w[i]]);
            id = smap_get(&t->vocab, c, (size_t)k);
        } else {
            utf8proc_int32_t cp;
            utf8proc_ssize_t k =
                utf8proc_iterate(w + i, (utf8proc_ssize_t)(n - i), &cp);
            len = k > 0 ? (size_t)k : 1;
            id = smap_get(&t->vocab, (const char *)w + i, len);
            bool bytes_ok = t->byte_fallback;
            for (size_t b = 0; id < 0 && bytes_ok && b < len; b++)
                bytes_ok = t->byte_ids[w[i + b]] >= 0;
            if (id < 0 && bytes_ok) {
                for (size_t b = 0; b < len; b++)
                    sym[m++] = t->byte_ids[w[i + b]];
                i += len;
                continue;
            }
        }
        if (id < 0) {
            id = t->unk_id;
            if (id >= 0 && t->fuse_unk && m && sym[m - 1] == id) {
                i += len;
                continue;
            }
        }
        if (id >= 0) /* with no unknown token, an unknown byte is dropped */
            sym[m++] = id;
        i += len;
    }
    bpe_merge(t, sym, m, o);
    if (sym != stack_sym)
        free(sym);
}

/* splits [p, p+n) by regex re into pieces: the matches and the gaps
 * between them, a match joined to the piece before or after it, or
 * dropped, as `how` says */
static void split_pieces(pcre2_code *re, split_behavior how, const char *p,
                         size_t n, pcre2_match_data *md,
                         void (*emit)(void *, const char *, size_t),
                         void *arg) {
    size_t off = 0, last = 0;
    while (off < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)p, n, off, PCRE2_NO_UTF_CHECK, md,
                             NULL);
        if (rc < 0)
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] > ov[0]) {
            size_t gap_end = how == SPLIT_MERGED_PREV ? ov[1] : ov[0];
            if (gap_end > last)
                emit(arg, p + last, gap_end - last);
            if (how == SPLIT_ISOLATED)
                emit(arg, p + ov[0], ov[1] - ov[0]);
            last = how == SPLIT_MERGED_NEXT ? ov[0] : ov[1];
        }
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
        split_pieces(c->t->split[next.level], c->t->split_how[next.level], p, n,
                     c->md, on_piece, &next);
    } else {
        bpe_word(c->t, (const unsigned char *)p, n, c->out);
    }
}

/* A new string: [p, p+n) with every `from` replaced by `to` (NULL when
 * out of memory). */
static char *replace_all(const char *p, size_t n, const char *from,
                         const char *to, size_t *out_n) {
    size_t fl = strlen(from), tl = strlen(to), hits = 0;
    for (const char *q = p; (q = memmem(q, n - (size_t)(q - p), from, fl));
         q += fl)
        hits++;
    char *o = malloc(n + hits * (tl > fl ? tl - fl : 0) + 1);
    if (!o)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (i + fl <= n && !memcmp(p + i, from, fl)) {
            memcpy(o + k, to, tl);
            k += tl, i += fl;
        } else
            o[k++] = p[i++];
    }
    o[k] = 0;
    *out_n = k;
    return o;
}

static char *prepend(const char *pre, const char *p, size_t n, size_t *out_n) {
    size_t pl = strlen(pre);
    char *o = malloc(pl + n + 1);
    if (!o)
        return NULL;
    memcpy(o, pre, pl);
    memcpy(o + pl, p, n);
    o[pl + n] = 0;
    *out_n = pl + n;
    return o;
}

/* the normalized text so far becomes `next` (false: out of memory) */
static bool swap_in(char **cur, const char **p, size_t *n, char *next,
                    size_t nn) {
    if (!next)
        return false;
    free(*cur);
    *cur = next, *p = next, *n = nn;
    return true;
}

/* Text between added tokens: normalizers, the Metaspace or ByteLevel
 * prefix, the split steps, then BPE on each piece. `first`: the text
 * starts the input (Metaspace's prepend_scheme "first"). */
static ts_status encode_plain(ts_tokenizer *t, const char *p, size_t n,
                              bool first, pcre2_match_data *md, ids_vec *out) {
    if (!n)
        return TS_OK;
    char *cur = NULL; /* the latest normalized copy, owned */
    bool ok = true;
    size_t nn = 0;
    for (int k = 0; k < t->n_norm && ok && n; k++) {
        const norm_step *st = &t->norm[k];
        char *next;
        if (st->kind == NORM_NFC) {
            char *z = strndup(p, n);
            next = z ? (char *)utf8proc_NFC((const utf8proc_uint8_t *)z) : NULL;
            nn = next ? strlen(next) : 0;
            free(z);
        } else if (st->kind == NORM_PREPEND)
            next = prepend(st->a, p, n, &nn);
        else
            next = replace_all(p, n, st->a, st->b, &nn);
        ok = swap_in(&cur, &p, &n, next, nn);
    }
    if (t->metaspace && ok) {
        char *next = replace_all(p, n, " ", "\u2581", &nn);
        ok = swap_in(&cur, &p, &n, next, nn);
        bool pre = t->metaspace == 3 || (t->metaspace == 2 && first);
        if (ok && pre && !(n >= 3 && !memcmp(p, "\u2581", 3))) {
            next = prepend("\u2581", p, n, &nn);
            ok = swap_in(&cur, &p, &n, next, nn);
        }
    }
    if (t->add_prefix_space && n && p[0] != ' ' && ok) {
        char *next = prepend(" ", p, n, &nn);
        ok = swap_in(&cur, &p, &n, next, nn);
    }
    bool oom = !ok;
    if (!oom) {
        split_ctx c = {t, 0, md, out};
        if (t->n_split)
            split_pieces(t->split[0], t->split_how[0], p, n, md, on_piece, &c);
        else
            bpe_word(t, (const unsigned char *)p, n, out);
    }
    free(cur);
    return oom || out->oom
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
        size_t at = t->n_added ? pos : len;
        const added_token *best = NULL;
        for (; at < len; at++)
            if ((best = trie_match(t, text + at, len - at, allow_special)))
                break;
        s = encode_plain(t, text + pos, at - pos, pos == 0, md, &out);
        if (best && s == TS_OK) {
            push_id(&out, best->id);
            pos = at + best->len;
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
    if (t->is_added[id] && t->byte_level) {
        memcpy(o, s, n);
        return n;
    }
    if (!t->byte_level) { /* <0xXX> is a byte; the rest (added tokens too)
                             with ▁ -> " " */
        unsigned b;
        if (t->byte_fallback && !t->is_added[id] && n == 6 &&
            !strncmp(s, "<0x", 3) && s[5] == '>' &&
            sscanf(s + 3, "%2X", &b) == 1) {
            o[0] = (unsigned char)b;
            return 1;
        }
        size_t fl = t->dec_from ? strlen(t->dec_from) : 0;
        size_t tl = t->dec_to ? strlen(t->dec_to) : 0;
        for (size_t i = 0; i < n;) {
            if (fl && i + fl <= n && !memcmp(s + i, t->dec_from, fl)) {
                memcpy(o + k, t->dec_to, tl);
                k += tl, i += fl;
            } else
                o[k++] = (unsigned char)s[i++];
        }
        return k;
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
            k += (size_t)ts_put_utf8((char *)o + k,
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
    size_t strip = 0; /* the Strip decoder: leading spaces of the text */
    while (strip < (size_t)t->dec_strip && strip < k && o[strip] == ' ')
        strip++;
    memmove(o, o + strip, k - strip);
    k -= strip;
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
    while (!st->started && i < n && st->n_stripped < t->dec_strip &&
           buf[i] == ' ') /* the Strip decoder, at the start of the text */
        i++, st->n_stripped++;
    if (i < n)
        st->started = true;
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
