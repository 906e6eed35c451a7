/* bpe.c — Hugging Face tokenizer.json for BPE models of two kinds:
 * byte-level (GPT-2/3.5/4o, gpt-oss, Llama 3, Qwen2/3, DeepSeek-V3, Claude:
 * ByteLevel pre-tokenizer and decoder) and SentencePiece-style (Llama 2,
 * Gemma, Gemini: characters as symbols, `▁` for spaces through the
 * Prepend/Replace normalizers or the Metaspace pre-tokenizer, <0xXX> byte
 * fallback, the Replace/ByteFallback/Fuse/Strip or Metaspace decoders).
 * Also the normalizers (NFC/NFD/NFKC/NFKD through utf8proc, Lowercase,
 * StripAccents, Strip, Prepend, Replace), Split pre-tokenizers (PCRE2 with
 * Unicode properties, each search bounded in steps; every behavior and
 * invert, as NormalizedString::split), ignore_merges, the BPE merges (a
 * heap, so long words stay n log n), added and special tokens matched
 * before everything else (a trie; lstrip/rstrip), ids checked at load
 * (one token an id, tables sized near the entry count), and a streaming
 * decoder that only emits whole UTF-8 characters. CLIP's tokenizer: the
 * BPE end_of_word_suffix (`</w>` on a word's last symbol, a space when
 * decoded), RobertaProcessing's tokens around a text, and a folder with
 * only vocab.json + merges.txt (clip_bpe.c writes its tokenizer.json);
 * the pad token of tokenizer_config.json for ts_tokenizer_encode_padded.
 * Owns the vocabulary and merge tables; knows nothing of models
 * (ts_tokenizer_check_vocab is handed a model's vocab_size). */
#define _GNU_SOURCE       /* memmem */
#include "tessera_gguf.h" /* ts_tokenizer_load_text */
#include "tessera_tokenizer.h"

#include "bytelevel.h"
#include "clip_bpe.h"
#include "core/core.h"
#include "core/strbuf.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define MAX_SPLITS 8

/* ---- hash tables ---- */

typedef struct {
    char **keys; /* string -> id */
    int32_t *vals;
    uint32_t *hash; /* the keys' hashes: most probes end without a strlen */
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
    m->hash = calloc(m->cap, sizeof *m->hash);
    m->n = 0;
    return m->keys && m->vals && m->hash;
}

static int32_t smap_get(const str_map *m, const char *k, size_t n) {
    uint64_t h = fnv(k, n);
    size_t i = h & (m->cap - 1);
    while (m->keys[i]) {
        if (m->hash[i] == (uint32_t)(h >> 32) && !strncmp(m->keys[i], k, n) &&
            !m->keys[i][n])
            return m->vals[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

/* k is kept (not copied); the table must have room (sized at init) */
static void smap_put(str_map *m, char *k, int32_t v) {
    size_t n = strlen(k);
    uint64_t h = fnv(k, n);
    size_t i = h & (m->cap - 1);
    while (m->keys[i]) {
        if (m->hash[i] == (uint32_t)(h >> 32) && !strcmp(m->keys[i], k)) {
            m->vals[i] = v;
            return;
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = k;
    m->vals[i] = v;
    m->hash[i] = (uint32_t)(h >> 32);
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
    bool lstrip, rstrip; /* the token takes the whitespace before / after */
} added_token;

typedef enum {
    NORM_NFC,
    NORM_NFD,
    NORM_NFKC,
    NORM_NFKD,
    NORM_LOWERCASE,
    NORM_STRIP_ACCENTS,
    NORM_STRIP,
    NORM_PREPEND,
    NORM_REPLACE,
    NORM_REPLACE_REGEX
} norm_kind;
typedef struct {
    norm_kind kind;
    char *a, *b;      /* PREPEND: a; REPLACE: a -> b; REPLACE_REGEX: -> b */
    pcre2_code *re;   /* REPLACE_REGEX */
    bool left, right; /* STRIP */
} norm_step;

/* Hugging Face's SplitDelimiterBehavior */
typedef enum {
    SPLIT_ISOLATED,
    SPLIT_MERGED_PREV,
    SPLIT_MERGED_NEXT,
    SPLIT_REMOVED,
    SPLIT_CONTIGUOUS
} split_behavior;

typedef struct {
    pcre2_code *re;
    split_behavior how;
    bool invert; /* the matches are the pieces, the rest the delimiters */
} split_step;

#define MAX_NORM 16

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
    /* the post-processor's special tokens around a single text */
    int32_t prefix[4], suffix[4];
    int n_prefix, n_suffix;
    char **id_to_token; /* byte-level form; added tokens: their content */
    bool *is_added, *is_special, *in_model; /* in_model: model.vocab's */
    int32_t vocab_size;
    str_map vocab;
    pair_map merges;
    added_token *added;
    int n_added;
    split_step split[MAX_SPLITS];
    int n_split;
    bool ignore_merges; /* a word that is a token is that token */
    bool add_prefix_space;
    /* BPE end_of_word_suffix (CLIP's `</w>`): joined to a word's last
     * symbol; a space when decoded, the decoded text then stripped */
    char *eow;
    size_t eow_len;
    int32_t pad_id; /* tokenizer_config.json's pad_token, or -1 */
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
    for (int32_t i = 0; t->id_to_token && i < t->vocab_size; i++)
        free(t->id_to_token[i]);
    free(t->id_to_token), free(t->is_added), free(t->is_special),
        free(t->in_model);
    free(t->vocab.keys), free(t->vocab.vals), free(t->vocab.hash);
    free(t->merges.keys), free(t->merges.rank), free(t->merges.merged);
    free(t->added);
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a), free(t->norm[i].b);
        pcre2_code_free(t->norm[i].re);
    }
    free(t->dec_from), free(t->dec_to), free(t->eow);
    free(t->added_trie.keys), free(t->added_trie.child),
        free(t->added_trie.term);
    for (int i = 0; i < t->n_split; i++)
        pcre2_code_free(t->split[i].re);
    free(t);
}

/* A tokenizer.json pattern: {"Regex": ...} as a regex, {"String": ...}
 * as a literal (PCRE2_LITERAL). what: the step, for errors. */
static ts_status compile_pattern(ts_tokenizer *t, const char *file,
                                 const char *what, json_t *pat,
                                 pcre2_code **out) {
    const char *re = json_string_value(json_object_get(pat, "Regex"));
    const char *lit = json_string_value(json_object_get(pat, "String"));
    const char *src = re ? re : lit;
    if (!src || !*src)
        return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                            "%s: %s needs a non-empty Regex or String pattern",
                            file, what);
    int err;
    PCRE2_SIZE off;
    *out = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | (re ? PCRE2_UCP : PCRE2_LITERAL), &err,
                         &off, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                            "%s: %s regex does not compile at offset %zu: %s",
                            file, what, (size_t)off, (const char *)msg);
    }
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* optional speed-up */
    return TS_OK;
}

static ts_status add_split(ts_tokenizer *t, const char *file, json_t *pat,
                           split_behavior how, bool invert) {
    if (t->n_split == MAX_SPLITS)
        return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                            "%s: more than %d split steps", file, MAX_SPLITS);
    split_step *st = &t->split[t->n_split];
    ts_status s = compile_pattern(t, file, "Split pre-tokenizer", pat, &st->re);
    if (s)
        return s;
    st->how = how, st->invert = invert;
    t->n_split++;
    return TS_OK;
}

/* a split by a regex given as a string (ByteLevel's, Metaspace's) */
static ts_status add_split_regex(ts_tokenizer *t, const char *file,
                                 const char *regex, split_behavior how) {
    json_t *pat = json_pack("{s:s}", "Regex", regex);
    ts_status s = pat ? add_split(t, file, pat, how, false)
                      : ts_set_error(t->ctx, TS_ERR_OOM, "out of memory");
    json_decref(pat);
    return s;
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
        const char *behavior =
            json_string_value(json_object_get(p, "behavior"));
        static const char *names[] = {"Isolated", "MergedWithPrevious",
                                      "MergedWithNext", "Removed",
                                      "Contiguous"};
        int how = -1;
        for (int k = 0; behavior && k < 5; k++)
            if (!strcmp(behavior, names[k]))
                how = k;
        json_t *inv = json_object_get(p, "invert");
        if (how < 0 || (inv && !json_is_boolean(inv)))
            return ts_set_error(
                t->ctx, TS_ERR_UNSUPPORTED,
                "%s: Split pre-tokenizer behavior \"%s\" is not supported "
                "(Isolated, MergedWithPrevious, MergedWithNext, Removed, "
                "Contiguous; invert true or false)",
                file, behavior ? behavior : "(none)");
        return add_split(t, file, json_object_get(p, "pattern"),
                         (split_behavior)how, json_is_true(inv));
    }
    if (type && !strcmp(type, "Metaspace")) {
        /* applied to the whole text before any split (as the only or
         * first pre-tokenizer it is the same) */
        if (t->n_split || t->metaspace || t->byte_level)
            return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                                "%s: a Metaspace pre-tokenizer after another "
                                "pre-tokenizer is not supported",
                                file);
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
            return add_split_regex(t, file, "\u2581", SPLIT_MERGED_NEXT);
        return TS_OK;
    }
    if (type && !strcmp(type, "ByteLevel")) {
        /* add_prefix_space is per piece: the same as on the whole text
         * only when no split comes before */
        bool aps = json_is_true(json_object_get(p, "add_prefix_space"));
        if (aps && (t->n_split || t->metaspace))
            return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                                "%s: a ByteLevel pre-tokenizer with "
                                "add_prefix_space after a split is not "
                                "supported",
                                file);
        t->add_prefix_space = t->add_prefix_space || aps;
        json_t *ur = json_object_get(p, "use_regex");
        t->byte_level = true;
        if (!ur || json_is_true(ur))
            return add_split_regex(t, file, TS_GPT2_PATTERN, SPLIT_ISOLATED);
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
    if (type && !strcmp(type, "ByteLevel"))
        return TS_OK; /* offsets only */
    if (type && (!strcmp(type, "RobertaProcessing") ||
                 !strcmp(type, "BertProcessing"))) {
        /* cls text sep (CLIP: <|startoftext|> text <|endoftext|>); the
         * tokens as ["content", id] pairs */
        json_t *cls = json_array_get(json_object_get(p, "cls"), 1),
               *sep = json_array_get(json_object_get(p, "sep"), 1);
        json_int_t c = json_integer_value(cls), e = json_integer_value(sep);
        if (!json_is_integer(cls) || !json_is_integer(sep) || c < 0 || e < 0 ||
            c >= t->vocab_size || e >= t->vocab_size || t->n_prefix == 4 ||
            t->n_suffix == 4)
            return ts_set_error(t->ctx, TS_ERR_IO,
                                "%s: post_processor %s needs cls and sep as "
                                "[token, id] with ids in the vocabulary",
                                file, type);
        t->prefix[t->n_prefix++] = (int32_t)c;
        t->suffix[t->n_suffix++] = (int32_t)e;
        return TS_OK;
    }
    if (!type || strcmp(type, "TemplateProcessing"))
        return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                            "%s: post_processor \"%s\" is not supported "
                            "(TemplateProcessing, RobertaProcessing, "
                            "BertProcessing, ByteLevel, Sequence)",
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

ts_status ts_tokenizer_encode_padded(ts_tokenizer *t, const char *text,
                                     size_t len, int max_length, int32_t *ids,
                                     int32_t *n_valid) {
    if (!t)
        return TS_ERR_INVALID_ARG;
    int np = t->n_prefix, ns = t->n_suffix;
    if (!ids || !n_valid || (!text && len))
        return ts_set_error(t->ctx, TS_ERR_INVALID_ARG,
                            "tokenizer_encode_padded: NULL argument");
    if (max_length < np + ns || max_length <= 0)
        return ts_set_error(t->ctx, TS_ERR_INVALID_ARG,
                            "tokenizer_encode_padded: max_length %d leaves no "
                            "room for the %d special tokens around the text",
                            max_length, np + ns);
    if (t->pad_id < 0)
        return ts_set_error(t->ctx, TS_ERR_INVALID_ARG,
                            "tokenizer_encode_padded: the tokenizer has no "
                            "pad token (tokenizer_config.json or "
                            "special_tokens_map.json \"pad_token\", or "
                            "tokenizer.json's padding)");
    int32_t *body;
    size_t n;
    ts_status s = ts_tokenizer_encode(t, text, len, true, &body, &n);
    if (s)
        return s;
    size_t room = (size_t)(max_length - np - ns), k = 0;
    if (n > room)
        n = room; /* truncation=True: the end of the text goes */
    for (int i = 0; i < np; i++)
        ids[k++] = t->prefix[i];
    memcpy(ids + k, body, sizeof(int32_t) * n), k += n;
    for (int i = 0; i < ns; i++)
        ids[k++] = t->suffix[i];
    free(body);
    *n_valid = (int32_t)k;
    while (k < (size_t)max_length)
        ids[k++] = t->pad_id;
    return TS_OK;
}

int32_t ts_tokenizer_pad_id(const ts_tokenizer *t) {
    return t ? t->pad_id : -1;
}

/* normalizers: NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Strip,
 * Prepend, Replace (String or Regex pattern), or a Sequence */
static ts_status parse_normalizer_step(ts_tokenizer *t, const char *file,
                                       json_t *n) {
    const char *type = json_string_value(json_object_get(n, "type"));
    if (t->n_norm == MAX_NORM)
        return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                            "%s: more than %d normalizer steps", file,
                            MAX_NORM);
    norm_step *st = &t->norm[t->n_norm];
    static const struct {
        const char *name;
        norm_kind kind;
    } simple[] = {{"NFC", NORM_NFC},
                  {"NFD", NORM_NFD},
                  {"NFKC", NORM_NFKC},
                  {"NFKD", NORM_NFKD},
                  {"Lowercase", NORM_LOWERCASE},
                  {"StripAccents", NORM_STRIP_ACCENTS}};
    for (size_t k = 0; type && k < sizeof simple / sizeof *simple; k++)
        if (!strcmp(type, simple[k].name)) {
            st->kind = simple[k].kind;
            t->n_norm++;
            return TS_OK;
        }
    if (type && !strcmp(type, "Strip")) {
        st->kind = NORM_STRIP;
        st->left = json_is_true(json_object_get(n, "strip_left"));
        st->right = json_is_true(json_object_get(n, "strip_right"));
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
        json_t *pat = json_object_get(n, "pattern");
        const char *from = json_string_value(json_object_get(pat, "String"));
        const char *to = json_string_value(json_object_get(n, "content"));
        if (from && *from && to) {
            st->kind = NORM_REPLACE, st->a = strdup(from), st->b = strdup(to);
            t->n_norm++;
            return st->a && st->b
                       ? TS_OK
                       : ts_set_error(t->ctx, TS_ERR_OOM, "out of memory");
        }
        if (json_object_get(pat, "Regex") && to) {
            st->kind = NORM_REPLACE_REGEX;
            ts_status s =
                compile_pattern(t, file, "Replace normalizer", pat, &st->re);
            if (s)
                return s;
            t->n_norm++;
            st->b = strdup(to);
            return st->b ? TS_OK
                         : ts_set_error(t->ctx, TS_ERR_OOM, "out of memory");
        }
    }
    return ts_set_error(t->ctx, TS_ERR_UNSUPPORTED,
                        "%s: normalizer \"%s\" is not supported (NFC, NFD, "
                        "NFKC, NFKD, Lowercase, StripAccents, Strip, Prepend, "
                        "Replace, Sequence)",
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

/* Whether the normalizers leave a special token's content as it is, so
 * that matching it before normalization (what we do) finds what matching
 * after would (normalized: true, as CLIP's <|startoftext|> has; other
 * added tokens with it stay refused under a normalizer): printable
 * ASCII without capitals or spaces, which the normal forms, Lowercase,
 * StripAccents and Strip keep, and no Replace pattern matches. Prepend
 * changes the text it starts: not kept. */
static bool normalizers_keep(const ts_tokenizer *t, const char *c) {
    for (const char *q = c; *q; q++)
        if (*q <= ' ' || *q > '~' || (*q >= 'A' && *q <= 'Z'))
            return false;
    for (int k = 0; k < t->n_norm; k++) {
        const norm_step *st = &t->norm[k];
        if (st->kind == NORM_PREPEND)
            return false;
        if (st->kind == NORM_REPLACE && strstr(c, st->a))
            return false;
        if (st->kind == NORM_REPLACE_REGEX) {
            pcre2_match_data *md =
                pcre2_match_data_create_from_pattern(st->re, NULL);
            int r = md ? pcre2_match(st->re, (PCRE2_SPTR)c, strlen(c), 0, 0, md,
                                     NULL)
                       : 0;
            pcre2_match_data_free(md);
            if (!md || r != PCRE2_ERROR_NOMATCH)
                return false;
        }
    }
    return true;
}

/* path's bytes (malloc'd, NUL-terminated; a tokenizer.json is tens of MB:
 * read whole, then parsed), or NULL with the error set */
static char *read_all(ts_ctx *ctx, const char *file, size_t *len) {
    FILE *f = fopen(file, "rb");
    if (!f) {
        ts_set_error(ctx, TS_ERR_IO, "%s: cannot open: %s", file,
                     strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 1 >= cap) {
            char *g = realloc(buf, cap = cap ? 2 * cap : 1 << 20);
            if (!g) {
                free(buf), fclose(f);
                ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", file);
                return NULL;
            }
            buf = g;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (!got)
            break;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        ts_set_error(ctx, TS_ERR_IO, "%s: cannot read", file);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

ts_status ts_tokenizer_load(ts_ctx *ctx, const char *path, ts_tokenizer **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!path || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "tokenizer_load: NULL argument");
    *out = NULL;
    if (ts_file_is_gguf(path)) { /* tokenizer.ggml.* as a tokenizer.json */
        char *json;
        ts_status s = ts_gguf_hf_file_text(ctx, path, "tokenizer.json", &json);
        if (s == TS_OK)
            s = ts_tokenizer_load_text(ctx, json, strlen(json), path, out);
        free(json);
        return s;
    }
    char file[4096], dir[4000];
    ts_file_in(path, "tokenizer.json", file, sizeof file);
    bool is_dir = strcmp(file, path) != 0;
    if (snprintf(dir, sizeof dir, "%s", is_dir ? path : file) >=
        (int)sizeof dir)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "path too long: %s", path);
    if (!is_dir) { /* the folder of the file, for its tokenizer_config.json */
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, ".");
    }
    size_t n = 0;
    char *text = NULL;
    ts_status s;
    if (is_dir && ts_clip_folder(dir)) {
        /* a folder without tokenizer.json: CLIP's vocab.json + merges.txt
         * as Hugging Face's CLIPTokenizerFast converts them */
        s = ts_clip_tokenizer_json(ctx, dir, &text, &n);
        if (snprintf(file, sizeof file, "%s/vocab.json", dir) >=
            (int)sizeof file)
            file[0] = 0; /* cannot be: dir is shorter */
    } else {
        text = read_all(ctx, file, &n);
        s = text ? TS_OK : ts_ctx_status(ctx);
    }
    if (s == TS_OK)
        s = ts_tokenizer_load_text(ctx, text, n, file, out);
    free(text);
    if (s == TS_OK) {
        /* the configs' pad token when they name one in the vocabulary (a
         * config that does not parse leaves tokenizer.json's padding: the
         * tokenizer itself loaded; CLIP's files were checked above) */
        char pad[256];
        if (ts_tokenizer_config_token(ctx, dir, "pad_token", pad, sizeof pad) !=
            TS_OK)
            ts_clear_error(ctx), pad[0] = 0;
        int32_t id = pad[0] ? ts_tokenizer_token_id(*out, pad) : -1;
        if (id >= 0)
            (*out)->pad_id = id;
    }
    return s;
}

ts_status ts_tokenizer_load_text(ts_ctx *ctx, const char *json_text, size_t len,
                                 const char *origin, ts_tokenizer **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!json_text || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "tokenizer_load_text: NULL argument");
    *out = NULL;
    const char *file = origin ? origin : "tokenizer.json";
    json_error_t jerr;
    json_t *root = json_loadb(json_text, len, 0, &jerr);
    if (!root)
        return ts_set_error(ctx, TS_ERR_IO, "%s: %s (line %d)", file, jerr.text,
                            jerr.line);
    ts_tokenizer *t = calloc(1, sizeof *t);
    ts_status s = t ? TS_OK : ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    if (t)
        t->ctx = ctx, t->pad_id = -1, byte_map(t);
    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!s && (!mtype || strcmp(mtype, "BPE")))
        s = ts_set_error(
            ctx, TS_ERR_UNSUPPORTED,
            "%s: tokenizer model \"%s\" is not supported (BPE only)", file,
            mtype ? mtype : "(none)");
    /* BPE options that change ids and that we do not implement */
    static const char *const unsupported[] = {"continuing_subword_prefix",
                                              "dropout"};
    for (int k = 0; k < 2 && !s; k++) {
        json_t *o = json_object_get(model, unsupported[k]);
        if (o && !json_is_null(o) &&
            !(json_is_string(o) && !*json_string_value(o)) &&
            !(json_is_number(o) && json_number_value(o) == 0))
            s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                             "%s: BPE model.%s is not supported (null or "
                             "empty only)",
                             file, unsupported[k]);
    }
    json_t *eow = json_object_get(model, "end_of_word_suffix");
    if (!s && eow && !json_is_null(eow) && !json_is_string(eow))
        s = ts_set_error(ctx, TS_ERR_IO,
                         "%s: BPE model.end_of_word_suffix is not a string",
                         file);
    if (!s && json_string_length(eow)) {
        t->eow_len = json_string_length(eow);
        if (!(t->eow = strdup(json_string_value(eow))))
            s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", file);
    }
    if (!s) {
        t->byte_fallback =
            json_is_true(json_object_get(model, "byte_fallback"));
        t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
        t->ignore_merges =
            json_is_true(json_object_get(model, "ignore_merges"));
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
    /* vocabulary and added tokens: each id names one token; tables are
     * sized by the largest id, which may exceed the number of entries by
     * little (real files leave a few gaps) */
    json_t *vocab = json_object_get(model, "vocab"),
           *added = json_object_get(root, "added_tokens");
    if (!s && !json_is_object(vocab))
        s = ts_set_error(ctx, TS_ERR_IO, "%s: model.vocab is not an object",
                         file);
    if (!s && added && !json_is_array(added))
        s = ts_set_error(ctx, TS_ERR_IO, "%s: added_tokens is not an array",
                         file);
    size_t entries = json_object_size(vocab) + json_array_size(added);
    json_int_t max_id = -1, id_limit = 2 * (json_int_t)entries + 1024;
    const char *key;
    json_t *v;
    size_t i;
    if (!s) {
        json_object_foreach(vocab, key, v) {
            json_int_t id = json_integer_value(v);
            if (!json_is_integer(v) || id < 0 || id >= id_limit) {
                s = ts_set_error(ctx, TS_ERR_IO,
                                 "%s: vocab entry \"%s\" has id %s%lld: ids "
                                 "are integers from 0 to %lld (twice the %zu "
                                 "entries + 1024)",
                                 file, key, json_is_integer(v) ? "" : "(none) ",
                                 (long long)id, (long long)id_limit - 1,
                                 entries);
                break;
            }
            if (id > max_id)
                max_id = id;
        }
    }
    if (!s) {
        json_array_foreach(added, i, v) {
            json_t *jid = json_object_get(v, "id");
            json_int_t id = json_integer_value(jid);
            const char *c = json_string_value(json_object_get(v, "content"));
            if (!c || !*c || !json_is_integer(jid) || id < 0 ||
                id >= id_limit) {
                s = ts_set_error(ctx, TS_ERR_IO,
                                 "%s: added token %zu (\"%s\") needs content "
                                 "and an id from 0 to %lld (twice the %zu "
                                 "entries + 1024), not %lld",
                                 file, i, c ? c : "", (long long)id_limit - 1,
                                 entries, (long long)id);
                break;
            }
            /* matching flags we do not implement are refused by name */
            const char *flag =
                json_is_true(json_object_get(v, "single_word")) ? "single_word"
                : json_is_true(json_object_get(v, "normalized")) && t->n_norm &&
                        !(json_is_true(json_object_get(v, "special")) &&
                          normalizers_keep(t, c))
                    ? "normalized"
                    : NULL;
            if (flag) {
                s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                                 "%s: added token \"%s\" has %s true, which "
                                 "is not supported%s",
                                 file, c, flag,
                                 *flag == 'n'
                                     ? " with a normalizer that changes it "
                                       "(only tokens matched before "
                                       "normalization)"
                                     : "");
                break;
            }
            if (id > max_id)
                max_id = id;
        }
    }
    if (!s) {
        t->vocab_size = (int32_t)(max_id + 1);
        size_t cap = (size_t)t->vocab_size + 1;
        t->id_to_token = calloc(cap, sizeof(char *));
        t->is_added = calloc(cap, 1);
        t->is_special = calloc(cap, 1);
        t->in_model = calloc(cap, 1);
        t->added = calloc(json_array_size(added) + 1, sizeof *t->added);
        if (!t->id_to_token || !t->is_added || !t->is_special || !t->in_model ||
            !t->added || !smap_init(&t->vocab, entries))
            s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", file);
    }
    if (!s) {
        json_object_foreach(vocab, key, v) {
            int32_t id = (int32_t)json_integer_value(v);
            if (t->id_to_token[id]) {
                s = ts_set_error(ctx, TS_ERR_IO,
                                 "%s: vocab entries \"%s\" and \"%s\" share "
                                 "id %d (each id names one token)",
                                 file, t->id_to_token[id], key, id);
                break;
            }
            if (!(t->id_to_token[id] = strdup(key))) {
                s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", file);
                break;
            }
            t->in_model[id] = 1;
            smap_put(&t->vocab, t->id_to_token[id], id);
        }
    }
    if (!s) {
        json_array_foreach(added, i, v) {
            const char *c = json_string_value(json_object_get(v, "content"));
            int32_t id = (int32_t)json_integer_value(json_object_get(v, "id"));
            /* an added token may repeat its vocab entry, not replace it */
            if (t->id_to_token[id] && strcmp(t->id_to_token[id], c)) {
                s = ts_set_error(
                    ctx, TS_ERR_IO,
                    "%s: %s \"%s\" and added token \"%s\" share "
                    "id %d (each id names one token)",
                    file, t->is_added[id] ? "added token" : "vocab entry",
                    t->id_to_token[id], c, id);
                break;
            }
            if (t->is_added[id])
                continue; /* listed twice: once is enough */
            if (!t->id_to_token[id]) {
                if (!(t->id_to_token[id] = strdup(c))) {
                    s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory",
                                     file);
                    break;
                }
                smap_put(&t->vocab, t->id_to_token[id], id); /* wins */
            }
            t->is_added[id] = 1;
            t->is_special[id] = json_is_true(json_object_get(v, "special"));
            added_token *a = &t->added[t->n_added++];
            a->content = t->id_to_token[id];
            a->len = strlen(c);
            a->id = id;
            a->special = t->is_special[id];
            a->lstrip = json_is_true(json_object_get(v, "lstrip"));
            a->rstrip = json_is_true(json_object_get(v, "rstrip"));
        }
    }
    /* merges: ["a", "b"] pairs (or "a b" strings), in rank order */
    json_t *merges = json_object_get(model, "merges");
    if (!s && !pmap_init(&t->merges, json_array_size(merges)))
        s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", file);
    json_array_foreach(merges, i, v) {
        if (s)
            break;
        const char *a, *b; /* any length: [a, a+la) and [b, b+lb) */
        size_t la, lb;
        if (json_is_array(v) && json_array_size(v) == 2 &&
            json_is_string(json_array_get(v, 0)) &&
            json_is_string(json_array_get(v, 1))) {
            a = json_string_value(json_array_get(v, 0));
            la = json_string_length(json_array_get(v, 0));
            b = json_string_value(json_array_get(v, 1));
            lb = json_string_length(json_array_get(v, 1));
        } else if (json_is_string(v) && strchr(json_string_value(v), ' ')) {
            a = json_string_value(v);
            const char *sp = strchr(a, ' ');
            la = (size_t)(sp - a), b = sp + 1;
            lb = json_string_length(v) - la - 1;
        } else {
            s = ts_set_error(ctx, TS_ERR_IO,
                             "%s: merge %zu is not a pair of strings", file, i);
            break;
        }
        char stack_ab[256],
            *ab = la + lb <= sizeof stack_ab ? stack_ab : malloc(la + lb);
        if (!ab) {
            s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", file);
            break;
        }
        memcpy(ab, a, la), memcpy(ab + la, b, lb);
        int32_t ia = smap_get(&t->vocab, a, la),
                ib = smap_get(&t->vocab, b, lb),
                im = smap_get(&t->vocab, ab, la + lb);
        if (ab != stack_ab)
            free(ab);
        if (ia < 0 || ib < 0 || im < 0) {
            s = ts_set_error(
                ctx, TS_ERR_IO,
                "%s: merge %zu (\"%.*s\" + \"%.*s\") names a token not in "
                "the vocabulary",
                file, i, (int)(la < 200 ? la : 200), a,
                (int)(lb < 200 ? lb : 200), b);
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
    json_t *pad = json_object_get(json_object_get(root, "padding"), "pad_id");
    if (!s && json_is_integer(pad) && json_integer_value(pad) >= 0 &&
        json_integer_value(pad) < t->vocab_size)
        t->pad_id = (int32_t)json_integer_value(pad);
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

ts_status ts_tokenizer_check_vocab(ts_ctx *ctx, const ts_tokenizer *t,
                                   int64_t model_vocab_size) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!t || model_vocab_size <= 0)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "tokenizer_check_vocab: no tokenizer or a "
                            "vocab_size of %lld (must be positive)",
                            (long long)model_vocab_size);
    for (int64_t id = model_vocab_size; id < t->vocab_size; id++)
        if (t->id_to_token[id])
            return ts_set_error(
                ctx, TS_ERR_RANGE,
                "tokenizer: %s \"%s\" has id %lld, outside the model's "
                "vocab_size %lld (the tokenizer's ids go up to %d): the "
                "tokenizer does not belong to this model",
                t->is_added[id] ? "added token" : "vocab entry",
                t->id_to_token[id], (long long)id, (long long)model_vocab_size,
                t->vocab_size - 1);
    return TS_OK;
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
/* the id of the token whose byte-level form is that of w[0..n), or -1 */
static int32_t byte_level_id(const ts_tokenizer *t, const unsigned char *w,
                             size_t n, ids_vec *o) {
    char stack_form[256], *form = stack_form; /* up to 2 bytes a byte */
    if (2 * n > sizeof stack_form && !(form = malloc(2 * n))) {
        o->oom = true;
        return -1;
    }
    size_t fl = 0;
    for (size_t i = 0; i < n; i++)
        fl += (size_t)ts_put_utf8(form + fl, t->byte_to_cp[w[i]]);
    int32_t id = fl ? smap_get(&t->vocab, form, fl) : -1;
    if (form != stack_form)
        free(form);
    return id;
}

static void bpe_word(ts_tokenizer *t, const unsigned char *w, size_t n,
                     ids_vec *o) {
    if (t->ignore_merges) { /* a word in the vocabulary is its token */
        int32_t id = t->byte_level ? byte_level_id(t, w, n, o)
                                   : smap_get(&t->vocab, (const char *)w, n);
        if (id >= 0 && t->in_model[id]) {
            push_id(o, id);
            return;
        }
    }
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
            char c[5 + 32];
            size_t k = (size_t)ts_put_utf8(c, t->byte_to_cp[w[i]]);
            if (i + 1 == n && t->eow_len && t->eow_len <= 32) /* `</w>` */
                memcpy(c + k, t->eow, t->eow_len), k += t->eow_len;
            id = smap_get(&t->vocab, c, k);
        } else {
            utf8proc_int32_t cp;
            utf8proc_ssize_t k =
                utf8proc_iterate(w + i, (utf8proc_ssize_t)(n - i), &cp);
            len = k > 0 ? (size_t)k : 1;
            if (i + len == n && t->eow_len && len + t->eow_len <= 64) {
                char c[64];
                memcpy(c, w + i, len), memcpy(c + len, t->eow, t->eow_len);
                id = smap_get(&t->vocab, c, len + t->eow_len);
            } else
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

/* ---- pre-tokenization: the split steps, as Hugging Face's
 * NormalizedString::split ---- */

/* Every regex search is bounded in steps (PCRE2's match limit), so no
 * pattern, however it backtracks, can make encoding hang: the patterns of
 * real tokenizers need a few steps per byte of their match (measured:
 * under 4), and a search that needs more is an error naming the step. */
#define REGEX_STEPS_BASE     10000
#define REGEX_STEPS_PER_BYTE 16

typedef struct {
    ts_tokenizer *t;
    pcre2_match_data *md[MAX_SPLITS + 1]; /* one per split level, + 1 for
                                             the normalizers */
    pcre2_match_context *mc;
    ids_vec *out;
    ts_status err;
} enc_state;

/* the next match of re in [p, p+n) at or after off: 1 (at [*s, *e)), 0
 * (none), -1 (error set) */
static int regex_next(enc_state *e, pcre2_code *re, pcre2_match_data *md,
                      const char *p, size_t n, size_t off, size_t *s,
                      size_t *end) {
    pcre2_set_match_limit(
        e->mc, (uint32_t)(REGEX_STEPS_BASE +
                          REGEX_STEPS_PER_BYTE *
                              (n - off < (1u << 26) ? n - off : (1u << 26))));
    int rc =
        pcre2_match(re, (PCRE2_SPTR)p, n, off, PCRE2_NO_UTF_CHECK, md, e->mc);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        e->err = ts_set_error(e->t->ctx, TS_ERR_RANGE,
                              "tokenizer: a pre-tokenizer or normalizer regex "
                              "failed at byte %zu of a %zu-byte piece (%s; at "
                              "most %d + %d steps per byte are allowed)",
                              off, n, (const char *)msg, REGEX_STEPS_BASE,
                              REGEX_STEPS_PER_BYTE);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *s = ov[0], *end = ov[1];
    return 1;
}

/* the offset after an empty match at off: one whole character on */
static size_t next_char(const char *p, size_t n, size_t off) {
    off++;
    while (off < n && ((unsigned char)p[off] & 0xC0) == 0x80)
        off++;
    return off;
}

typedef struct {
    size_t a, b;
    bool match;
} span;

typedef struct {
    span *v;
    size_t n, cap;
    bool oom;
} span_vec;

static void span_push(span_vec *o, size_t a, size_t b, bool match) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 16;
        span *v = realloc(o->v, sizeof *v * cap);
        if (!v) {
            o->oom = true;
            return;
        }
        o->v = v, o->cap = cap;
    }
    o->v[o->n++] = (span){a, b, match};
}

static void split_level(enc_state *e, int level, const char *p, size_t n);

/* HF's split: the matches and the gaps between them (flipped by invert),
 * then joined or dropped as the behavior says; empty pieces dropped */
static void split_pieces(enc_state *e, int level, const char *p, size_t n) {
    const split_step *st = &e->t->split[level];
    span_vec m = {0};
    size_t off = 0, prev = 0, s, end;
    while (off <= n) {
        int r = regex_next(e, st->re, e->md[level], p, n, off, &s, &end);
        if (r < 0) {
            free(m.v);
            return;
        }
        if (!r)
            break;
        if (s > prev)
            span_push(&m, prev, s, false);
        span_push(&m, s, end, true);
        prev = end;
        if (end == n)
            break;
        off = end > s ? end : next_char(p, n, end);
    }
    if (prev < n)
        span_push(&m, prev, n, false);
    if (m.oom) {
        free(m.v);
        e->out->oom = true;
        return;
    }
    size_t k = 0; /* the pieces, in place over m */
    bool prev_match = false;
    if (st->how == SPLIT_MERGED_NEXT) { /* from the end, like HF */
        size_t w = m.n;
        for (size_t i = m.n; i-- > 0;) {
            bool mt = m.v[i].match != st->invert;
            if (mt && !prev_match && w < m.n)
                m.v[w].a = m.v[i].a;
            else
                m.v[--w] = (span){m.v[i].a, m.v[i].b, false};
            prev_match = mt;
        }
        memmove(m.v, m.v + w, sizeof *m.v * (m.n - w));
        k = m.n - w;
    } else {
        for (size_t i = 0; i < m.n; i++) {
            bool mt = m.v[i].match != st->invert;
            span sp = {m.v[i].a, m.v[i].b, false};
            switch (st->how) {
            case SPLIT_REMOVED:
                if (!mt)
                    m.v[k++] = sp;
                break;
            case SPLIT_MERGED_PREV:
                if (mt && !prev_match && k)
                    m.v[k - 1].b = sp.b;
                else
                    m.v[k++] = sp;
                break;
            case SPLIT_CONTIGUOUS:
                if (mt == prev_match && k)
                    m.v[k - 1].b = sp.b;
                else
                    m.v[k++] = sp;
                break;
            default: /* SPLIT_ISOLATED */
                m.v[k++] = sp;
            }
            prev_match = mt;
        }
    }
    for (size_t i = 0; i < k && !e->err && !e->out->oom; i++)
        if (m.v[i].b > m.v[i].a)
            split_level(e, level + 1, p + m.v[i].a, m.v[i].b - m.v[i].a);
    free(m.v);
}

static void split_level(enc_state *e, int level, const char *p, size_t n) {
    if (level == e->t->n_split)
        bpe_word(e->t, (const unsigned char *)p, n, e->out);
    else if (n)
        split_pieces(e, level, p, n);
}

/* ---- normalizers ---- */

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

/* every match of re replaced by `to`; NULL on error (e->err or oom set) */
static char *replace_regex(enc_state *e, pcre2_code *re, const char *p,
                           size_t n, const char *to, size_t *out_n) {
    size_t tl = strlen(to), cap = n + 16, k = 0, off = 0, prev = 0, s, end;
    char *o = malloc(cap);
    while (o && off <= n) {
        int r = regex_next(e, re, e->md[MAX_SPLITS], p, n, off, &s, &end);
        if (r < 0) {
            free(o);
            return NULL;
        }
        if (!r)
            break;
        size_t need = k + (s - prev) + tl + (n - end) + 1;
        if (need > cap) {
            cap = 2 * need;
            char *g = realloc(o, cap);
            if (!g)
                free(o);
            o = g;
            if (!o)
                break;
        }
        memcpy(o + k, p + prev, s - prev), k += s - prev;
        memcpy(o + k, to, tl), k += tl;
        prev = end;
        if (end == n)
            break;
        off = end > s ? end : next_char(p, n, end);
    }
    if (!o) {
        e->out->oom = true;
        return NULL;
    }
    memcpy(o + k, p + prev, n - prev), k += n - prev;
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

/* Rust's char::is_whitespace (Unicode White_Space) */
static bool is_white(int32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Unicode normal forms (utf8proc), Lowercase (Rust's char::to_lowercase:
 * simple mappings, U+0130 to "i̇"), StripAccents (drops nonspacing
 * marks) and Strip, character by character */
static char *map_chars(const char *p, size_t n, norm_kind kind,
                       const norm_step *st, size_t *out_n) {
    if (kind == NORM_NFC || kind == NORM_NFD || kind == NORM_NFKC ||
        kind == NORM_NFKD) {
        int opt =
            UTF8PROC_STABLE |
            (kind == NORM_NFC || kind == NORM_NFKC ? UTF8PROC_COMPOSE
                                                   : UTF8PROC_DECOMPOSE) |
            (kind == NORM_NFKC || kind == NORM_NFKD ? UTF8PROC_COMPAT : 0);
        utf8proc_uint8_t *o = NULL;
        utf8proc_ssize_t k =
            utf8proc_map((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)n, &o,
                         (utf8proc_option_t)opt);
        if (k < 0) {
            free(o);
            return NULL;
        }
        *out_n = (size_t)k;
        return (char *)o;
    }
    char *o = malloc(2 * n + 1); /* a lowercase char is at most one byte
                                    longer than its capital (U+0130: 2 -> 3) */
    if (!o)
        return NULL;
    size_t k = 0, i = 0, end = n;
    utf8proc_int32_t c;
    if (kind == NORM_STRIP) {
        utf8proc_ssize_t l;
        while (st->left && i < n &&
               (l = utf8proc_iterate((const utf8proc_uint8_t *)p + i,
                                     (utf8proc_ssize_t)(n - i), &c)) > 0 &&
               is_white(c))
            i += (size_t)l;
        while (st->right && end > i) {
            size_t b = end - 1;
            while (b > i && ((unsigned char)p[b] & 0xC0) == 0x80)
                b--;
            if (utf8proc_iterate((const utf8proc_uint8_t *)p + b,
                                 (utf8proc_ssize_t)(end - b), &c) <= 0 ||
                !is_white(c))
                break;
            end = b;
        }
        memcpy(o, p + i, end - i);
        k = end - i;
        i = end;
    }
    while (i < end) {
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)p + i,
                                              (utf8proc_ssize_t)(end - i), &c);
        if (l <= 0)
            break;
        i += (size_t)l;
        if (kind == NORM_STRIP_ACCENTS &&
            utf8proc_category(c) == UTF8PROC_CATEGORY_MN)
            continue;
        if (kind == NORM_LOWERCASE) {
            if (c == 0x130) {
                k += (size_t)ts_put_utf8(o + k, 'i');
                c = 0x307;
            } else
                c = utf8proc_tolower(c);
        }
        k += (size_t)ts_put_utf8(o + k, (uint32_t)c);
    }
    o[k] = 0;
    *out_n = k;
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
static ts_status encode_plain(enc_state *e, const char *p, size_t n,
                              bool first) {
    ts_tokenizer *t = e->t;
    if (!n)
        return TS_OK;
    char *cur = NULL; /* the latest normalized copy, owned */
    bool ok = true;
    size_t nn = 0;
    for (int k = 0; k < t->n_norm && ok && n && !e->err; k++) {
        const norm_step *st = &t->norm[k];
        char *next;
        if (st->kind == NORM_PREPEND)
            next = prepend(st->a, p, n, &nn);
        else if (st->kind == NORM_REPLACE)
            next = replace_all(p, n, st->a, st->b, &nn);
        else if (st->kind == NORM_REPLACE_REGEX)
            next = replace_regex(e, st->re, p, n, st->b, &nn);
        else
            next = map_chars(p, n, st->kind, st, &nn);
        ok = swap_in(&cur, &p, &n, next, nn);
    }
    if (t->metaspace && ok && !e->err) {
        char *next = replace_all(p, n, " ", "\u2581", &nn);
        ok = swap_in(&cur, &p, &n, next, nn);
        bool pre = t->metaspace == 3 || (t->metaspace == 2 && first);
        if (ok && pre && !(n >= 3 && !memcmp(p, "\u2581", 3))) {
            next = prepend("\u2581", p, n, &nn);
            ok = swap_in(&cur, &p, &n, next, nn);
        }
    }
    if (t->add_prefix_space && n && p[0] != ' ' && ok && !e->err) {
        char *next = prepend(" ", p, n, &nn);
        ok = swap_in(&cur, &p, &n, next, nn);
    }
    if (ok && !e->err)
        split_level(e, 0, p, n);
    free(cur);
    if (e->err)
        return e->err;
    return !ok || e->out->oom
               ? ts_set_error(t->ctx, TS_ERR_OOM, "tokenizer: out of memory")
               : TS_OK;
}

/* an added token with lstrip / rstrip takes the whitespace before it (back
 * to pos, where the text to encode starts) / after it */
static void strip_around(const added_token *a, const char *text, size_t pos,
                         size_t len, size_t *at, size_t *end) {
    utf8proc_int32_t c;
    while (a->lstrip && *at > pos) {
        size_t b = *at - 1;
        while (b > pos && ((unsigned char)text[b] & 0xC0) == 0x80)
            b--;
        if (utf8proc_iterate((const utf8proc_uint8_t *)text + b,
                             (utf8proc_ssize_t)(*at - b), &c) <= 0 ||
            !is_white(c))
            break;
        *at = b;
    }
    utf8proc_ssize_t l;
    while (a->rstrip && *end < len &&
           (l = utf8proc_iterate((const utf8proc_uint8_t *)text + *end,
                                 (utf8proc_ssize_t)(len - *end), &c)) > 0 &&
           is_white(c))
        *end += (size_t)l;
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
    ids_vec out = {0};
    enc_state e = {.t = t, .out = &out};
    bool oom = !(e.mc = pcre2_match_context_create(NULL));
    for (int k = 0; k < t->n_split && !oom; k++)
        oom = !(e.md[k] =
                    pcre2_match_data_create_from_pattern(t->split[k].re, NULL));
    for (int k = 0; k < t->n_norm && !oom; k++)
        if (t->norm[k].re && !e.md[MAX_SPLITS])
            oom = !(e.md[MAX_SPLITS] =
                        pcre2_match_data_create(16, NULL)); /* any pattern */
    ts_status s =
        oom ? ts_set_error(t->ctx, TS_ERR_OOM, "tokenizer: out of memory")
            : TS_OK;
    size_t pos = 0;
    while (pos < len && s == TS_OK) {
        /* the next added token: earliest, then longest */
        size_t at = t->n_added ? pos : len;
        const added_token *best = NULL;
        for (; at < len; at++)
            if ((best = trie_match(t, text + at, len - at, allow_special)))
                break;
        size_t end = best ? at + best->len : len;
        if (best)
            strip_around(best, text, pos, len, &at, &end);
        s = encode_plain(&e, text + pos, at - pos, pos == 0);
        if (best && s == TS_OK) {
            push_id(&out, best->id);
            pos = end;
        } else {
            pos = len;
        }
    }
    for (int k = 0; k <= MAX_SPLITS; k++)
        pcre2_match_data_free(e.md[k]);
    pcre2_match_context_free(e.mc);
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
    bool eow = t->eow_len && n >= t->eow_len &&
               !memcmp(s + n - t->eow_len, t->eow, t->eow_len);
    if (eow) /* a word's end: a space (CLIP's `</w>`) */
        n -= t->eow_len;
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
    if (eow)
        o[k++] = ' ';
    return k;
}

/* One token's bytes for constrained decoding (grammar.c): byte-level
 * pieces undone, the Strip decoder not applied (a token mid-text keeps its
 * leading space). */
int64_t ts_tokenizer_token_bytes(const ts_tokenizer *t, int32_t id,
                                 unsigned char *buf, size_t cap,
                                 bool *special) {
    if (!t || id < 0 || id >= t->vocab_size || !t->id_to_token[id])
        return -1;
    if (special)
        *special = t->is_special[id];
    size_t need = 4 * strlen(t->id_to_token[id]) + 8;
    unsigned char stack_buf[256], *o = stack_buf;
    if (need > sizeof stack_buf && !(o = malloc(need)))
        return -1;
    size_t n = token_bytes(t, id, o);
    if (buf)
        memcpy(buf, o, n < cap ? n : cap);
    if (o != stack_buf)
        free(o);
    return (int64_t)n;
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
    while (t->eow_len && strip < k && o[strip] == ' ')
        strip++; /* CLIPTokenizerFast's decode: .strip() */
    while (t->eow_len && k > strip && o[k - 1] == ' ')
        k--;
    memmove(o, o + strip, k - strip);
    k -= strip;
    o[k] = 0;
    *text = (char *)o;
    *len = k;
    return TS_OK;
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
        size_t l;
        int got = ts_utf8_char(buf + i, n - i, &l);
        if (got == 0)
            break; /* a partial character: keep it */
        const char *emit =
            got > 0 ? (const char *)buf + i : "\xEF\xBF\xBD"; /* U+FFFD */
        size_t el = got > 0 ? l : 3;
        if (k + el > out_cap) {
            s = ts_set_error(t->ctx, TS_ERR_RANGE,
                             "tokenizer_decode_step: out of room");
            break;
        }
        memcpy(out + k, emit, el);
        k += el;
        i += l;
    }
    st->n_pending = (int)(n - i < sizeof st->pending ? n - i : 0);
    memcpy(st->pending, buf + i, (size_t)st->n_pending);
    *out_len = k;
    if (buf != stack)
        free(buf);
    return s;
}
