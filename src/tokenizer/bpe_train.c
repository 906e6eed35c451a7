/* bpe_train.c — trains a byte-level BPE tokenizer (GPT-2's scheme, as
 * Hugging Face's ByteLevelBPETokenizer trains one) and writes it as a
 * tokenizer.json that ts_tokenizer_load and the JS peer both read.
 *
 * Text is split by GPT-2's pattern into words; each distinct word is kept
 * once with its count, as a sequence of symbols (the 256 bytes first).
 * Each round merges the most frequent adjacent pair (ties: the pair whose
 * merged bytes sort first, so the result does not depend on hashing), in
 * every word, until the vocabulary has its size or no pair occurs
 * min_frequency times. Pair counts are kept up to date incrementally from
 * the words that changed. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tessera_tokenizer.h"

#include "bytelevel.h"
#include "core/core.h"
#include "core/strbuf.h"

#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

typedef struct {
    int32_t *sym;
    int32_t n;
    int64_t count;
} word;

/* symbol id -> its bytes */
typedef struct {
    unsigned char *b;
    int32_t n;
} bytes;

/* ---- a map from u64 keys to i64 values (open addressing) ---- */
typedef struct {
    uint64_t *k; /* 0: empty (keys are never 0 here) */
    int64_t *v;
    size_t cap, n;
} map64;

static size_t m_slot(const map64 *m, uint64_t k) {
    size_t i = (size_t)(k * 0x9e3779b97f4a7c15ull >> 16) & (m->cap - 1);
    while (m->k[i] && m->k[i] != k)
        i = (i + 1) & (m->cap - 1);
    return i;
}

static bool m_grow(map64 *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    map64 t = {calloc(cap, 8), calloc(cap, 8), cap, 0};
    if (!t.k || !t.v) {
        free(t.k), free(t.v);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->k[i]) {
            size_t j = m_slot(&t, m->k[i]);
            t.k[j] = m->k[i], t.v[j] = m->v[i], t.n++;
        }
    free(m->k), free(m->v);
    *m = t;
    return true;
}

static int64_t *m_at(map64 *m, uint64_t k) {
    if (2 * (m->n + 1) > m->cap && !m_grow(m))
        return NULL;
    size_t i = m_slot(m, k);
    if (!m->k[i])
        m->k[i] = k, m->v[i] = 0, m->n++;
    return &m->v[i];
}

static uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
}

/* ---- counting words ---- */

typedef struct {
    map64 index; /* XXH3 of the word's bytes -> 1 + its position */
    word *w;
    bytes *text; /* the word's bytes (for collisions) */
    size_t n, cap;
} wordset;

static ts_status add_word(ts_ctx *ctx, wordset *ws, const unsigned char *p,
                          size_t len) {
    uint64_t h = XXH3_64bits(p, len) | 1;
    for (;; h += 2) { /* probe on in the rare case of a collision */
        int64_t *at = m_at(&ws->index, h);
        if (!at)
            return ts_set_error(ctx, TS_ERR_OOM,
                                "tokenizer-train: out of "
                                "memory");
        if (*at) {
            size_t i = (size_t)*at - 1;
            if ((size_t)ws->text[i].n == len &&
                !memcmp(ws->text[i].b, p, len)) {
                ws->w[i].count++;
                return TS_OK;
            }
            continue;
        }
        if (ws->n == ws->cap) {
            size_t cap = ws->cap ? ws->cap * 2 : 4096;
            word *w = realloc(ws->w, sizeof *w * cap);
            if (w)
                ws->w = w;
            bytes *t = realloc(ws->text, sizeof *t * cap);
            if (t)
                ws->text = t;
            if (!w || !t)
                return ts_set_error(ctx, TS_ERR_OOM,
                                    "tokenizer-train: out of memory");
            ws->cap = cap;
        }
        word *w = &ws->w[ws->n];
        w->sym = malloc(sizeof(int32_t) * len);
        ws->text[ws->n].b = malloc(len);
        if (!w->sym || !ws->text[ws->n].b)
            return ts_set_error(ctx, TS_ERR_OOM,
                                "tokenizer-train: out of memory");
        memcpy(ws->text[ws->n].b, p, len);
        ws->text[ws->n].n = (int32_t)len;
        for (size_t i = 0; i < len; i++)
            w->sym[i] = p[i];
        w->n = (int32_t)len, w->count = 1;
        *at = (int64_t)++ws->n;
        return TS_OK;
    }
}

/* text's words (GPT-2's pattern) into ws; special tokens are not words */
static ts_status count_words(ts_ctx *ctx, pcre2_code *re, const char *text,
                             size_t len, const char *file, wordset *ws) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md)
        return ts_set_error(ctx, TS_ERR_OOM, "tokenizer-train: out of memory");
    size_t at = 0;
    ts_status st = TS_OK;
    uint32_t flags = 0; /* the first match checks the whole text's UTF-8;
                           checking it again per match would be quadratic */
    while (at < len && st == TS_OK) {
        int rc = pcre2_match(re, (PCRE2_SPTR)text, len, at, flags, md, NULL);
        flags = PCRE2_NO_UTF_CHECK;
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            st = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                              "%s: not valid UTF-8 near byte %zu", file, at);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) { /* cannot happen with this pattern */
            at++;
            continue;
        }
        st = add_word(ctx, ws, (const unsigned char *)text + ov[0],
                      ov[1] - ov[0]);
        at = ov[1];
    }
    pcre2_match_data_free(md);
    return st;
}

/* ---- merging ---- */

/* a merged pair's bytes compared with another's (the tie-break) */
static int cmp_pair(const bytes *sy, int32_t a, int32_t b, int32_t c,
                    int32_t d) {
    unsigned char x[1024], y[1024];
    size_t nx = 0, ny = 0;
    int32_t p[2] = {a, b}, q[2] = {c, d};
    for (int i = 0; i < 2; i++) {
        size_t k = (size_t)sy[p[i]].n < sizeof x - nx ? (size_t)sy[p[i]].n
                                                      : sizeof x - nx;
        memcpy(x + nx, sy[p[i]].b, k), nx += k;
        k = (size_t)sy[q[i]].n < sizeof y - ny ? (size_t)sy[q[i]].n
                                               : sizeof y - ny;
        memcpy(y + ny, sy[q[i]].b, k), ny += k;
    }
    int r = memcmp(x, y, nx < ny ? nx : ny);
    return r ? r : (nx > ny) - (nx < ny);
}

static void count_pairs(map64 *pairs, const word *w, int64_t sign) {
    for (int32_t i = 0; i + 1 < w->n; i++) {
        int64_t *v = m_at(pairs, pair_key(w->sym[i], w->sym[i + 1]));
        if (v)
            *v += sign * w->count;
    }
}

/* ---- writing tokenizer.json ---- */

static char *symbol_text(const bytes *s, const uint32_t *b2cp) {
    char *o = malloc((size_t)s->n * 4 + 1);
    size_t k = 0;
    for (int32_t i = 0; o && i < s->n; i++)
        k += (size_t)ts_put_utf8(o + k, b2cp[s->b[i]]);
    if (o)
        o[k] = 0;
    return o;
}

static ts_status write_files(ts_ctx *ctx, const char *dir, const bytes *sy,
                             int32_t n_sym, const int32_t (*merges)[2],
                             int32_t n_merges, const ts_bpe_train_options *o) {
    uint32_t b2cp[256];
    ts_byte_level_map(b2cp);
    json_t *vocab = json_object(), *mg = json_array();
    for (int32_t i = 0; i < n_sym; i++) {
        char *t = symbol_text(&sy[i], b2cp);
        json_object_set_new(vocab, t ? t : "", json_integer(i));
        free(t);
    }
    for (int32_t i = 0; i < n_merges; i++) {
        char *a = symbol_text(&sy[merges[i][0]], b2cp),
             *b = symbol_text(&sy[merges[i][1]], b2cp);
        ts_sbuf s = {0};
        ts_sb_printf(&s, "%s %s", a ? a : "", b ? b : "");
        json_array_append_new(mg, json_string(s.p ? s.p : ""));
        free(a), free(b), free(s.p);
    }
    json_t *added = json_array();
    for (int i = 0; i < o->n_special; i++) {
        json_object_set_new(vocab, o->special[i], json_integer(n_sym + i));
        json_array_append_new(
            added,
            json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", n_sym + i,
                      "content", o->special[i], "single_word", 0, "lstrip", 0,
                      "rstrip", 0, "normalized", 0, "special", 1));
    }
    json_t *bl =
        json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                  "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1);
    json_t *tok = json_pack(
        "{s:s, s:n, s:n, s:o, s:n, s:O, s:O, s:O, s:{s:s, s:n, s:n, s:n, "
        "s:n, s:b, s:b, s:b, s:o, s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added,
        "normalizer", "pre_tokenizer", bl, "post_processor", bl, "decoder", bl,
        "model", "type", "BPE", "dropout", "unk_token",
        "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
        "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", mg);
    json_decref(bl);
    const char *eos = o->n_special ? o->special[0] : NULL;
    json_t *cfg = json_pack("{s:s, s:I, s:b}", "tokenizer_class",
                            "PreTrainedTokenizerFast", "model_max_length",
                            (json_int_t)o->model_max_length,
                            "clean_up_"
                            "tokenization_"
                            "spaces",
                            0);
    if (eos) {
        json_object_set_new(cfg, "eos_token", json_string(eos));
        json_object_set_new(cfg, "pad_token", json_string(eos));
    }
    char path[4096];
    ts_status st = TS_OK;
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (json_dump_file(tok, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER))
        st = ts_set_error(ctx, TS_ERR_IO, "tokenizer-train: cannot write %s",
                          path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (st == TS_OK &&
        json_dump_file(cfg, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER))
        st = ts_set_error(ctx, TS_ERR_IO, "tokenizer-train: cannot write %s",
                          path);
    json_decref(tok), json_decref(cfg);
    return st;
}

ts_bpe_train_options ts_bpe_train_default_options(void) {
    static const char *const special[] = {"<|endoftext|>"};
    return (ts_bpe_train_options){.vocab_size = 4096,
                                  .min_frequency = 2,
                                  .special = special,
                                  .n_special = 1,
                                  .model_max_length = 1024};
}

ts_status ts_bpe_train(ts_ctx *ctx, const char *const *files, int n_files,
                       const ts_bpe_train_options *o, const char *out_dir,
                       ts_bpe_train_stats *stats) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!files || n_files < 1 || !o || !out_dir)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "tokenizer-train: no input files");
    if (o->vocab_size < 256 + o->n_special || o->vocab_size > (1 << 24))
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "tokenizer-train: vocab size %d (want %d..%d: "
                            "the 256 bytes and the special tokens at least)",
                            o->vocab_size, 256 + o->n_special, 1 << 24);
    if (o->min_frequency < 1)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "tokenizer-train: min_frequency %d (want >= 1)",
                            o->min_frequency);
    int err;
    PCRE2_SIZE eoff;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)TS_GPT2_PATTERN, PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP, &err, &eoff, NULL);
    if (!re)
        return ts_set_error(ctx, TS_ERR_STATE, "tokenizer-train: the pattern");
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    wordset ws = {0};
    map64 pairs = {0};
    bytes *sy = NULL;
    int32_t(*merges)[2] = NULL;
    ts_status st = TS_OK;
    int64_t total_bytes = 0;
    for (int f = 0; f < n_files && st == TS_OK; f++) {
        FILE *fp = fopen(files[f], "rb");
        if (!fp) {
            st = ts_set_error(ctx, TS_ERR_IO, "tokenizer-train: cannot open %s",
                              files[f]);
            break;
        }
        ts_sbuf text = {0};
        char buf[1 << 16];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, fp)) > 0)
            ts_sb_add(&text, buf, k);
        fclose(fp);
        total_bytes += (int64_t)text.n;
        st = count_words(ctx, re, text.p ? text.p : "", text.n, files[f], &ws);
        free(text.p);
    }
    int32_t n_target = o->vocab_size - o->n_special;
    sy = calloc((size_t)n_target, sizeof *sy);
    merges = malloc(sizeof *merges * (size_t)(n_target > 256 ? n_target : 1));
    if (st == TS_OK && (!sy || !merges))
        st = ts_set_error(ctx, TS_ERR_OOM, "tokenizer-train: out of memory");
    int32_t n_sym = 0, n_merges = 0;
    for (; st == TS_OK && n_sym < 256; n_sym++) {
        sy[n_sym].b = malloc(1);
        sy[n_sym].b[0] = (unsigned char)n_sym, sy[n_sym].n = 1;
    }
    /* which words hold each pair is found by scanning: words are few
     * (distinct), the scan is cheap next to recounting every pair */
    for (size_t i = 0; st == TS_OK && i < ws.n; i++)
        count_pairs(&pairs, &ws.w[i], 1);
    while (st == TS_OK && n_sym < n_target) {
        int64_t best = 0;
        int32_t ba = -1, bb = -1;
        for (size_t i = 0; i < pairs.cap; i++) {
            if (!pairs.k[i] || pairs.v[i] <= 0 || pairs.v[i] < best)
                continue;
            uint64_t key = pairs.k[i] - 1;
            int32_t a = (int32_t)(key >> 32), b = (int32_t)(key & 0xffffffffu);
            if (pairs.v[i] > best || cmp_pair(sy, a, b, ba, bb) < 0)
                best = pairs.v[i], ba = a, bb = b;
        }
        if (best < o->min_frequency || ba < 0)
            break;
        int32_t nid = n_sym++;
        sy[nid].n = sy[ba].n + sy[bb].n;
        sy[nid].b = malloc((size_t)sy[nid].n);
        if (!sy[nid].b) {
            st =
                ts_set_error(ctx, TS_ERR_OOM, "tokenizer-train: out of memory");
            break;
        }
        memcpy(sy[nid].b, sy[ba].b, (size_t)sy[ba].n);
        memcpy(sy[nid].b + sy[ba].n, sy[bb].b, (size_t)sy[bb].n);
        merges[n_merges][0] = ba, merges[n_merges][1] = bb, n_merges++;
        for (size_t i = 0; i < ws.n; i++) {
            word *w = &ws.w[i];
            bool has = false;
            for (int32_t j = 0; j + 1 < w->n && !has; j++)
                has = w->sym[j] == ba && w->sym[j + 1] == bb;
            if (!has)
                continue;
            count_pairs(&pairs, w, -1);
            int32_t out = 0;
            for (int32_t j = 0; j < w->n; j++) {
                if (j + 1 < w->n && w->sym[j] == ba && w->sym[j + 1] == bb) {
                    w->sym[out++] = nid;
                    j++;
                } else
                    w->sym[out++] = w->sym[j];
            }
            w->n = out;
            count_pairs(&pairs, w, 1);
        }
    }
    if (st == TS_OK)
        st = write_files(ctx, out_dir, sy, n_sym, (const int32_t(*)[2])merges,
                         n_merges, o);
    if (stats) {
        stats->bytes = total_bytes;
        stats->distinct_words = (int64_t)ws.n;
        stats->merges = n_merges;
        stats->vocab_size = n_sym + o->n_special;
    }
    for (size_t i = 0; i < ws.n; i++)
        free(ws.w[i].sym), free(ws.text[i].b);
    free(ws.w), free(ws.text), free(ws.index.k), free(ws.index.v);
    free(pairs.k), free(pairs.v);
    for (int32_t i = 0; sy && i < n_sym; i++)
        free(sy[i].b);
    free(sy), free(merges);
    pcre2_code_free(re);
    return st;
}
