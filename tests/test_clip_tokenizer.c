/* test_clip_tokenizer.c — CLIP's tokenizer (Stable Diffusion's tokenizer/
 * folder) against its JavaScript peer: argv[1] is clip_peer.json, written
 * by tests/js/clip_peer.mjs with OpenAI CLIP's real merges; for each
 * folder (vocab.json + merges.txt with pad <|endoftext|> or "!", and the
 * converted tokenizer.json) every corpus text must encode (bos + text +
 * eos), decode (special tokens skipped) and pad to 77 (truncated so that
 * eos fits) to the peer's ids and text. Then the errors: a
 * vocab.json + merges.txt folder of another class, no pad token, no room
 * for the special tokens, a pad token not in the vocabulary. */
#include "tessera_tokenizer.h"
#include "test_util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool same_ids(const int32_t *a, size_t n, json_t *want) {
    if (json_array_size(want) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, i)) != a[i])
            return false;
    return true;
}

static void print_ids(const char *what, const int32_t *a, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 40; i++)
        fprintf(stderr, " %d", a[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

static void check_peer(ts_ctx *ctx, json_t *entry, json_t *corpus) {
    const char *name = json_string_value(json_object_get(entry, "name"));
    const char *dir = json_string_value(json_object_get(entry, "dir"));
    ts_tokenizer *tok = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, dir, &tok));
    if (!tok)
        return;
    CHECK(ts_tokenizer_vocab_size(tok) == 49408);
    CHECK(ts_tokenizer_pad_id(tok) ==
          json_integer_value(json_object_get(entry, "pad_id")));
    int bad = 0;
    for (size_t k = 0; k < json_array_size(corpus); k++) {
        json_t *jt = json_array_get(corpus, k);
        const char *text = json_string_value(jt);
        size_t len = json_string_length(jt);
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(ctx, ts_tokenizer_encode_text(tok, text, len, true, &ids, &n));
        json_t *want = json_array_get(json_object_get(entry, "ids"), k);
        bool ok = same_ids(ids, n, want);
        CHECK(ok);
        if (!ok && bad++ < 5) {
            fprintf(stderr, "%s: text %zu \"%.60s\" differs\n", name, k, text);
            print_ids("ours", ids, n);
            int32_t w[512];
            size_t wn = json_array_size(want);
            for (size_t i = 0; i < wn && i < 512; i++)
                w[i] = (int32_t)json_integer_value(json_array_get(want, i));
            print_ids("peer", w, wn < 512 ? wn : 512);
        }
        char *dec = NULL;
        size_t dl = 0;
        CHECK_OK(ctx, ts_tokenizer_decode(tok, ids, n, true, &dec, &dl));
        const char *wd = json_string_value(
            json_array_get(json_object_get(entry, "decoded"), k));
        bool dok = dec && wd && !strcmp(dec, wd);
        CHECK(dok);
        if (!dok && bad++ < 5)
            fprintf(stderr, "%s: text %zu decodes to \"%s\", peer \"%s\"\n",
                    name, k, dec ? dec : "(null)", wd ? wd : "(null)");
        free(dec);
        int32_t padded[77], n_valid = -1;
        CHECK_OK(ctx, ts_tokenizer_encode_padded(tok, text, len, 77, padded,
                                                 &n_valid));
        json_t *wp = json_array_get(json_object_get(entry, "padded"), k);
        bool pok = same_ids(padded, 77, wp);
        CHECK(pok);
        CHECK(n_valid == (int32_t)(n < 77 ? n : 77));
        if (!pok && bad++ < 5) {
            fprintf(stderr, "%s: text %zu pads differently\n", name, k);
            print_ids("ours", padded, 77);
        }
        free(ids);
    }
    printf("%s: %zu texts\n", name, json_array_size(corpus));
    ts_tokenizer_free(tok);
}

static void write_file(const char *dir, const char *name, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (f)
        fputs(text, f), fclose(f);
}

/* a two-merge CLIP-style folder under dir */
static void tiny_folder(const char *dir, const char *config) {
    mkdir(dir, 0755);
    write_file(dir, "vocab.json",
               "{\"a\": 0, \"b\": 1, \"a</w>\": 2, \"b</w>\": 3, "
               "\"ab</w>\": 4, \"<|startoftext|>\": 5, "
               "\"<|endoftext|>\": 6}");
    write_file(dir, "merges.txt", "#version: 0.2\na b</w>\n");
    if (config)
        write_file(dir, "tokenizer_config.json", config);
}

static void check_errors(ts_ctx *ctx, const char *work) {
    char dir[1024];
    ts_tokenizer *tok = NULL;
    /* the tiny folder: "ab" is one token, "ba" two */
    snprintf(dir, sizeof dir, "%s/clip_tiny", work);
    tiny_folder(dir, "{\"tokenizer_class\": \"CLIPTokenizer\"}");
    CHECK_OK(ctx, ts_tokenizer_load(ctx, dir, &tok));
    if (tok) {
        int32_t ids[6], nv;
        CHECK_OK(ctx, ts_tokenizer_encode_padded(tok, "AB ba", 5, 6, ids, &nv));
        int32_t want[6] = {5, 4, 1, 2, 6, 6};
        CHECK(nv == 5 && !memcmp(ids, want, sizeof want));
        /* truncation keeps eos: bos, "ab", eos */
        CHECK_OK(ctx, ts_tokenizer_encode_padded(tok, "ab ba", 5, 3, ids, &nv));
        CHECK(nv == 3 && ids[0] == 5 && ids[1] == 4 && ids[2] == 6);
        CHECK(ts_tokenizer_encode_padded(tok, "ab", 2, 1, ids, &nv) ==
              TS_ERR_INVALID_ARG);
        CHECK_MSG(ctx, "max_length 1");
        char *text = NULL;
        size_t len;
        int32_t dec[4] = {5, 4, 1, 2};
        CHECK_OK(ctx, ts_tokenizer_decode(tok, dec, 4, false, &text, &len));
        CHECK(text && !strcmp(text, "<|startoftext|>ab ba"));
        free(text);
        ts_tokenizer_free(tok), tok = NULL;
    }
    snprintf(dir, sizeof dir, "%s/clip_gpt2", work);
    tiny_folder(dir, "{\"tokenizer_class\": \"GPT2Tokenizer\"}");
    CHECK(ts_tokenizer_load(ctx, dir, &tok) == TS_ERR_UNSUPPORTED && !tok);
    CHECK_MSG(ctx, "GPT2Tokenizer");
    snprintf(dir, sizeof dir, "%s/clip_badpad", work);
    tiny_folder(dir, "{\"pad_token\": \"<pad>\"}");
    CHECK(ts_tokenizer_load(ctx, dir, &tok) != TS_OK && !tok);
    CHECK_MSG(ctx, "the pad_token \"<pad>\" is not in the vocabulary");
    snprintf(dir, sizeof dir, "%s/clip_badmerge", work);
    tiny_folder(dir, NULL);
    write_file(dir, "merges.txt", "#version: 0.2\na b</w>\nlonely\n");
    CHECK(ts_tokenizer_load(ctx, dir, &tok) != TS_OK && !tok);
    CHECK_MSG(ctx, "merges.txt: line 3");
    /* a tokenizer.json without padding or pad_token: no padded encode */
    snprintf(dir, sizeof dir, "%s/nopad", work);
    mkdir(dir, 0755);
    write_file(dir, "tokenizer.json",
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
               "\"merges\": []}}");
    CHECK_OK(ctx, ts_tokenizer_load(ctx, dir, &tok));
    if (tok) {
        int32_t ids[4], nv;
        CHECK(ts_tokenizer_encode_padded(tok, "a", 1, 4, ids, &nv) ==
              TS_ERR_INVALID_ARG);
        CHECK_MSG(ctx, "no pad token");
        ts_tokenizer_free(tok);
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(
            stderr,
            "usage: test_clip_tokenizer clip_peer.json CORPUS... WORKDIR\n");
        return 2;
    }
    ts_ctx *ctx = test_ctx();
    json_error_t je;
    json_t *peer = json_load_file(argv[1], 0, &je);
    json_t *corpus = json_array();
    for (int a = 2; a < argc - 1; a++) {
        json_t *c = json_load_file(argv[a], 0, &je);
        CHECK(json_is_array(c));
        json_array_extend(corpus, c);
        json_decref(c);
    }
    CHECK(json_is_array(peer) && json_array_size(peer) == 3);
    for (size_t i = 0; i < json_array_size(peer); i++)
        check_peer(ctx, json_array_get(peer, i), corpus);
    check_errors(ctx, argv[argc - 1]);
    json_decref(peer), json_decref(corpus);
    ts_ctx_free(ctx);
    return test_finish("test_clip_tokenizer");
}
