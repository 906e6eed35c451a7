/* test_train.c — the training pieces in one process: token shards (2 and
 * 4 bytes a token, one clear error per malformed file), the loader (one
 * epoch visits every window once, seeded shuffles, rank slices that add up
 * to the single-rank batch, seek, epochs rolling over), byte-level BPE
 * training (the tokenizer.json loads and round-trips any text, the vocab
 * has the size asked), prepare-data's shards and split (files read in
 * chunks encode as one text), and ts_train_run on tiny Qwen3 and Llama
 * models, as a world of one and with no ts_dist: the loss falls, eager
 * equals compiled, 3 steps + 3 resumed equal 6 steps (weights and
 * optimizer too), a killed save leaves the previous checkpoint whole, the
 * checkpoint loads and gives the trainer's loss, grad-accum 2 x B equals
 * batch 2B, FLOPs per token and MFU as PaLM counts them, and bad options
 * and files named. Everything runs under ./train_work, removed first. */
#define _GNU_SOURCE /* nftw */
#include "tessera_dist.h"
#include "tessera_models.h"
#include "tessera_tokenizer.h"
#include "tessera_train.h"
#include "test_util.h"

#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define WORK "train_work"

/* ---- files ---- */

static int rm_entry(const char *p, const struct stat *sb, int flag,
                    struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void rm_rf(const char *path) {
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f)
        fwrite(p, 1, n, f), fclose(f);
}

static void write_text(const char *path, const char *text) {
    write_bytes(path, text, strlen(text));
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static off_t file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_size : -1;
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    char *b = tu_read_file(from, &n);
    if (b)
        write_bytes(to, b, n);
    free(b);
}

/* ---- a deterministic English-like text ---- */

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static const char *const WORDS[] = {
    "the",    "model", "learns", "a",    "token", "from",   "data",
    "and",    "it",    "is",     "not",  "that",  "we",     "train",
    "with",   "batch", "of",     "text", "to",    "loss",   "falls",
    "when",   "rate",  "warm",   "up",   "don't", "it's",   "we'll",
    "café",   "naïve", "Zürich", "東京", "über",  "Ωmega",  "résumé",
    "window", "shard", "epoch",  "seed", "rank",  "vector", "matrix"};

/* about `bytes` bytes of sentences, numbers and newlines from seed */
static void gen_text(const char *path, size_t bytes, uint64_t seed) {
    size_t nw = sizeof WORDS / sizeof *WORDS;
    char *b = malloc(bytes + 256);
    size_t n = 0;
    uint64_t s = seed;
    bool cap = true;
    while (n < bytes) {
        const char *w = WORDS[lcg(&s) % nw];
        uint64_t r = lcg(&s) % 100;
        if (r < 4)
            n += (size_t)sprintf(b + n, "%s%llu", n && !cap ? " " : "",
                                 (unsigned long long)(lcg(&s) % 100000));
        else
            n += (size_t)sprintf(
                b + n, "%s%c%s", n && !cap ? " " : "",
                cap && w[0] >= 'a' && w[0] <= 'z' ? w[0] - 32 : w[0], w + 1);
        cap = false;
        if (r >= 90) { /* sentence ends, some with a line break, a blank
                          line, a space before it or an indent after */
            static const char *const ends[] = {". ",   ". ",   ". ",  ". ",
                                               ". ",   ". ",   ".\n", ".\n\n",
                                               ". \n", ".\n  "};
            n += (size_t)sprintf(b + n, "%s", ends[r - 90]);
            cap = true;
        } else if (r >= 86)
            n += (size_t)sprintf(b + n, ",");
    }
    n += (size_t)sprintf(b + n, ".\n");
    write_bytes(path, b, n);
    free(b);
}

/* ---- log.jsonl ---- */

typedef struct {
    int n;
    int64_t step[64];
    double loss[64], mfu[64], tps[64];
} train_log;

static void read_log(const char *dir, train_log *lg) {
    char p[512];
    snprintf(p, sizeof p, "%s/log.jsonl", dir);
    memset(lg, 0, sizeof *lg);
    FILE *f = fopen(p, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f) && lg->n < 64) {
        json_t *j = json_loads(line, 0, NULL);
        CHECK(json_is_object(j));
        lg->step[lg->n] = json_integer_value(json_object_get(j, "step"));
        lg->loss[lg->n] = json_number_value(json_object_get(j, "loss"));
        lg->mfu[lg->n] = json_number_value(json_object_get(j, "mfu"));
        lg->tps[lg->n] = json_number_value(json_object_get(j, "tokens_per_s"));
        lg->n++;
        json_decref(j);
    }
    if (f)
        fclose(f);
}

/* every tensor of a equal to b's within rtol/atol; same names */
static void check_same_tensors(ts_ctx *ctx, const char *pa, const char *pb,
                               double rtol, double atol) {
    ts_safetensors *a = NULL, *b = NULL;
    CHECK_OK(ctx, ts_safetensors_open(ctx, pa, &a));
    CHECK_OK(ctx, ts_safetensors_open(ctx, pb, &b));
    if (a && b) {
        CHECK(ts_safetensors_count(a) == ts_safetensors_count(b));
        CHECK(ts_safetensors_count(a) > 0);
        for (int i = 0; i < ts_safetensors_count(a); i++) {
            const char *name = ts_safetensors_name(a, i);
            ts_tensor *x = ts_safetensors_get(a, name);
            ts_tensor *y = ts_safetensors_get(b, name);
            char what[512];
            snprintf(what, sizeof what, "%s vs %s: %s", pa, pb, name);
            test_allclose(what, x, y, rtol, atol);
            ts_release(x), ts_release(y);
        }
    }
    ts_clear_error(ctx);
    ts_safetensors_close(a), ts_safetensors_close(b);
}

/* ---- 1. shards ---- */

static void test_shards(ts_ctx *ctx) {
    enum { N = 3000 };
    int32_t *small = malloc(sizeof(int32_t) * N);
    int32_t *big = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) {
        small[i] = (int32_t)(((uint32_t)i * 40503u) % 65536u);
        big[i] = (int32_t)(((uint32_t)i * 2654435761u) % 200000u);
    }
    small[7] = 65535, big[0] = 65536, big[1] = INT32_MAX, big[2] = 0;
    const char *p2 = WORK "/s2.bin", *p4 = WORK "/s4.bin";
    CHECK_OK(ctx, ts_shard_write(ctx, p2, small, N));
    CHECK_OK(ctx, ts_shard_write(ctx, p4, big, N));
    CHECK(file_size(p2) == TS_SHARD_HEADER + 2 * N);
    CHECK(file_size(p4) == TS_SHARD_HEADER + 4 * N);
    const char *paths[2] = {p2, p4};
    const int32_t *want[2] = {small, big};
    for (int k = 0; k < 2; k++) {
        ts_shard *s = NULL;
        CHECK_OK(ctx, ts_shard_open(ctx, paths[k], &s));
        if (!s)
            continue;
        CHECK(ts_shard_count(s) == N);
        int bad = 0;
        for (uint64_t i = 0; i < N; i++)
            bad += ts_shard_token(s, i) != want[k][i];
        CHECK(bad == 0);
        ts_shard_close(s);
    }
    /* the header as documented: magic, version, width, count */
    size_t n;
    unsigned char *raw = (unsigned char *)tu_read_file(p2, &n);
    uint32_t h32[4];
    uint64_t cnt;
    memcpy(h32, raw, 16), memcpy(&cnt, raw + 16, 8);
    CHECK(h32[0] == TS_SHARD_MAGIC && !memcmp(raw, "TSTK", 4));
    CHECK(h32[1] == 1 && h32[2] == 2 && h32[3] == 0 && cnt == N);

    /* an empty shard is valid */
    CHECK_OK(ctx, ts_shard_write(ctx, WORK "/empty.bin", NULL, 0));
    ts_shard *s = NULL;
    CHECK_OK(ctx, ts_shard_open(ctx, WORK "/empty.bin", &s));
    CHECK(s && ts_shard_count(s) == 0);
    ts_shard_close(s);

    /* writes that cannot be */
    int32_t neg[3] = {1, -5, 2};
    CHECK(ts_shard_write(ctx, WORK "/neg.bin", neg, 3) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "token -5 at 1 is negative");
    CHECK(!exists(WORK "/neg.bin"));
    ts_clear_error(ctx);
    CHECK(ts_shard_write(ctx, WORK "/no/such/dir.bin", small, 4) == TS_ERR_IO);
    CHECK_MSG(ctx, "no/such/dir.bin");
    ts_clear_error(ctx);

    /* malformed files: one clear error each, never a crash */
    struct {
        const char *name, *msg;
        size_t len;
        int field;  /* header byte offset to patch, -1: none */
        uint64_t v; /* the value written there (u32, or u64 at 16) */
    } cases[] = {
        {"magic.bin", "bad magic", n, 0, 0x4B545355u},
        {"version.bin", "version", n, 4, 2},
        {"width.bin", "token width other than 2 or 4", n, 8, 3},
        {"truncated.bin", "token count that does not match", n - 1, -1, 0},
        {"longer.bin", "token count that does not match", n + 2, -1, 0},
        {"count.bin", "token count that does not match", n, 16, UINT64_MAX},
        {"count2.bin", "token count that does not match", n, 16,
         UINT64_MAX / 2 + 1},
        {"short.bin", "shorter than its header", 20, -1, 0},
        {"zero.bin", "shorter than its header", 0, -1, 0},
    };
    unsigned char *buf = malloc(n + 16);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        memset(buf, 0, n + 16);
        memcpy(buf, raw, n);
        if (cases[c].field == 16)
            memcpy(buf + 16, &cases[c].v, 8);
        else if (cases[c].field >= 0) {
            uint32_t v = (uint32_t)cases[c].v;
            memcpy(buf + cases[c].field, &v, 4);
        }
        char p[256];
        snprintf(p, sizeof p, WORK "/%s", cases[c].name);
        write_bytes(p, buf, cases[c].len);
        ts_shard *bad = (ts_shard *)1;
        CHECK(ts_shard_open(ctx, p, &bad) == TS_ERR_INVALID_ARG);
        CHECK(bad == NULL);
        CHECK_MSG(ctx, cases[c].msg);
        CHECK_MSG(ctx, cases[c].name); /* the file is named */
        ts_clear_error(ctx);
    }
    CHECK(ts_shard_open(ctx, WORK "/absent.bin", &s) == TS_ERR_IO);
    CHECK_MSG(ctx, "absent.bin");
    ts_clear_error(ctx);
    free(buf), free(raw), free(small), free(big);
}

/* ---- 2. the loader ---- */

#define SEQ 8
/* shards of 100, 0, 37 and 250 tokens whose ids are their positions in
 * the stream: 387 tokens, (387 - 1) / 8 = 48 windows */
static void make_position_shards(ts_ctx *ctx, const char *dir) {
    mkdir(dir, 0755);
    int sizes[4] = {100, 0, 37, 250}, at = 0;
    for (int k = 0; k < 4; k++) {
        int32_t ids[256];
        for (int i = 0; i < sizes[k]; i++)
            ids[i] = at++;
        char p[256];
        snprintf(p, sizeof p, "%s/train_%03d.bin", dir, k);
        CHECK_OK(ctx, ts_shard_write(ctx, p, ids, (size_t)sizes[k]));
    }
    int32_t val[20];
    for (int i = 0; i < 20; i++)
        val[i] = 10000 + i;
    char p[256];
    snprintf(p, sizeof p, "%s/val_000.bin", dir);
    CHECK_OK(ctx, ts_shard_write(ctx, p, val, 20));
    /* not shards of the train split */
    snprintf(p, sizeof p, "%s/trainer.bin", dir);
    write_text(p, "x");
    snprintf(p, sizeof p, "%s/train_notes.txt", dir);
    write_text(p, "x");
}

/* the window a row holds, or -1 when the row is not a window (ids
 * consecutive from a multiple of SEQ, targets the ids + 1) */
static int64_t row_window(const int64_t *ids, const int64_t *tg) {
    if (ids[0] % SEQ)
        return -1;
    for (int t = 0; t < SEQ; t++)
        if (ids[t] != ids[0] + t || tg[t] != ids[t] + 1)
            return -1;
    return ids[0] / SEQ;
}

/* the windows of `steps` batches of `batch` rows, world 1 */
static void windows_of(ts_loader *l, int steps, int batch, int64_t *out) {
    int64_t ids[16 * SEQ], tg[16 * SEQ];
    for (int s = 0; s < steps; s++) {
        CHECK(ts_loader_next(l, batch, 0, 1, ids, tg) == TS_OK);
        for (int b = 0; b < batch; b++)
            out[s * batch + b] = row_window(ids + b * SEQ, tg + b * SEQ);
    }
}

static bool is_permutation(const int64_t *w, int n) {
    int seen[64] = {0};
    for (int i = 0; i < n; i++) {
        if (w[i] < 0 || w[i] >= n || seen[w[i]])
            return false;
        seen[w[i]] = 1;
    }
    return true;
}

static void test_loader(ts_ctx *ctx) {
    const char *dir = WORK "/loader";
    make_position_shards(ctx, dir);
    enum { W = 48 };
    ts_loader *l = NULL;
    CHECK_OK(ctx, ts_loader_open(ctx, dir, "train", SEQ, 1, false, &l));
    if (!l)
        return;
    CHECK(ts_loader_tokens(l) == 387 && ts_loader_windows(l) == W);
    /* unshuffled: the windows in order, across the shard boundaries */
    int64_t w[4 * W];
    windows_of(l, 8, 6, w);
    bool in_order = true;
    for (int i = 0; i < W; i++)
        in_order &= w[i] == i;
    CHECK(in_order);
    CHECK(ts_loader_position(l) == W);
    ts_loader_free(l);

    /* shuffled: every window once per epoch, the order from the seed */
    int64_t a[2 * W], a2[2 * W], b[2 * W], by1[2 * W];
    CHECK_OK(ctx, ts_loader_open(ctx, dir, "train", SEQ, 1, true, &l));
    windows_of(l, 16, 6, a); /* two epochs */
    ts_loader_free(l);
    CHECK(is_permutation(a, W) && is_permutation(a + W, W));
    CHECK(memcmp(a, w, sizeof(int64_t) * W) != 0);     /* shuffled */
    CHECK(memcmp(a, a + W, sizeof(int64_t) * W) != 0); /* a new epoch order */
    CHECK_OK(ctx, ts_loader_open(ctx, dir, "train", SEQ, 1, true, &l));
    windows_of(l, 16, 6, a2);
    ts_loader_free(l);
    CHECK(memcmp(a, a2, sizeof a) == 0); /* the same seed, the same order */
    CHECK_OK(ctx, ts_loader_open(ctx, dir, "train", SEQ, 2, true, &l));
    windows_of(l, 16, 6, b);
    ts_loader_free(l);
    CHECK(is_permutation(b, W) && memcmp(a, b, sizeof(int64_t) * W) != 0);
    /* the stream does not depend on the batch size: batches of 5 straddle
     * the epoch boundary (48 = 9 x 5 + 3) and still see a's order */
    CHECK_OK(ctx, ts_loader_open(ctx, dir, "train", SEQ, 1, true, &l));
    int64_t by5[100];
    windows_of(l, 19, 5, by5);
    CHECK(ts_loader_position(l) == 95);
    ts_loader_free(l);
    CHECK(memcmp(by5, a, sizeof(int64_t) * 95) == 0);
    CHECK_OK(ctx, ts_loader_open(ctx, dir, "train", SEQ, 1, true, &l));
    windows_of(l, 2 * W, 1, by1);
    ts_loader_free(l);
    CHECK(memcmp(by1, a, sizeof by1) == 0);

    /* rank slices: for world 2 (and 3), the ranks' rows in rank order are
     * the world-1 batch's rows, step after step */
    for (int world = 2; world <= 3; world++) {
        ts_loader *one = NULL, *r[3] = {NULL, NULL, NULL};
        CHECK_OK(ctx, ts_loader_open(ctx, dir, "train", SEQ, 7, true, &one));
        for (int k = 0; k < world; k++)
            CHECK_OK(ctx,
                     ts_loader_open(ctx, dir, "train", SEQ, 7, true, &r[k]));
        int64_t ids1[6 * SEQ], tg1[6 * SEQ], ids[6 * SEQ], tg[6 * SEQ];
        int bad = 0;
        for (int step = 0; step < 20 && one; step++) { /* 2.5 epochs */
            CHECK(ts_loader_next(one, 6, 0, 1, ids1, tg1) == TS_OK);
            int local = 6 / world;
            for (int k = 0; k < world && r[k]; k++) {
                CHECK(ts_loader_next(r[k], 6, k, world, ids, tg) == TS_OK);
                bad += memcmp(ids, ids1 + k * local * SEQ,
                              sizeof(int64_t) * (size_t)(local * SEQ)) != 0;
                bad += memcmp(tg, tg1 + k * local * SEQ,
                              sizeof(int64_t) * (size_t)(local * SEQ)) != 0;
                CHECK(ts_loader_position(r[k]) == ts_loader_position(one));
            }
        }
        CHECK(bad == 0);
        for (int k = 0; k < world; k++)
            ts_loader_free(r[k]);
        ts_loader_free(one);
    }

    /* seek: a fresh loader moved to another's position continues it, in
     * this epoch and two epochs on */
    ts_loader *x = NULL, *y = NULL;
    CHECK_OK(ctx, ts_loader_open(ctx, dir, "train", SEQ, 1, true, &x));
    CHECK_OK(ctx, ts_loader_open(ctx, dir, "train", SEQ, 1, true, &y));
    if (x && y) {
        int64_t skip[7 * 6];
        windows_of(x, 7, 6, skip);
        CHECK(ts_loader_position(x) == 42);
        ts_loader_seek(y, 42);
        int64_t wx[6], wy[6];
        windows_of(x, 1, 6, wx), windows_of(y, 1, 6, wy);
        CHECK(memcmp(wx, wy, sizeof wx) == 0);
        CHECK(memcmp(wx, a + 42, sizeof wx) == 0);
        ts_loader_seek(y, 130); /* epoch 2: windows 34.. of its order */
        int64_t e2[3 * W], wz[4];
        windows_of(x, (3 * W - 48) / 6, 6, e2); /* x to 144 */
        windows_of(y, 1, 4, wz);
        ts_loader_seek(x, 0);
        int64_t all[3 * W];
        windows_of(x, 3 * W / 6, 6, all); /* after seek(0): from the start */
        CHECK(memcmp(all, a, sizeof(int64_t) * 2 * W) == 0);
        CHECK(is_permutation(all + 2 * W, W));
        CHECK(memcmp(wz, all + 130, sizeof wz) == 0);
        CHECK(ts_loader_position(y) == 134);
    }
    ts_loader_free(x), ts_loader_free(y);

    /* the val split is its own stream; one window needs seq + 1 tokens */
    CHECK_OK(ctx, ts_loader_open(ctx, dir, "val", 19, 1, true, &l));
    if (l) {
        int64_t ids[19], tg[19];
        CHECK(ts_loader_windows(l) == 1 && ts_loader_tokens(l) == 20);
        CHECK(ts_loader_next(l, 1, 0, 1, ids, tg) == TS_OK);
        CHECK(ids[0] == 10000 && ids[18] == 10018 && tg[18] == 10019);
        ts_loader_free(l);
    }

    /* errors */
    int64_t ids[6 * SEQ], tg[6 * SEQ];
    CHECK_OK(ctx, ts_loader_open(ctx, dir, "train", SEQ, 1, true, &l));
    if (l) {
        CHECK(ts_loader_next(l, 5, 0, 2, ids, tg) == TS_ERR_RANGE);
        CHECK_MSG(ctx, "batch 5 over 2 ranks");
        ts_clear_error(ctx);
        CHECK(ts_loader_next(l, 4, 2, 2, ids, tg) == TS_ERR_RANGE);
        ts_clear_error(ctx);
        CHECK(ts_loader_next(l, 0, 0, 1, ids, tg) == TS_ERR_RANGE);
        ts_clear_error(ctx);
        CHECK(ts_loader_position(l) == 0); /* nothing consumed */
        ts_loader_free(l);
    }
    l = (ts_loader *)1;
    CHECK(ts_loader_open(ctx, dir, "train", 0, 1, true, &l) == TS_ERR_RANGE);
    CHECK(l == NULL);
    CHECK_MSG(ctx, "seq 0");
    ts_clear_error(ctx);
    CHECK(ts_loader_open(ctx, dir, "train", 387, 1, true, &l) ==
          TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "387 tokens, fewer than one sequence of 387 + 1");
    ts_clear_error(ctx);
    CHECK_OK(ctx, ts_loader_open(ctx, dir, "train", 386, 1, true, &l));
    CHECK(l && ts_loader_windows(l) == 1);
    ts_loader_free(l);
    CHECK(ts_loader_open(ctx, dir, "test", SEQ, 1, true, &l) ==
          TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "no test_*.bin shards");
    ts_clear_error(ctx);
    CHECK(ts_loader_open(ctx, WORK "/nowhere", "train", SEQ, 1, true, &l) ==
          TS_ERR_IO);
    CHECK_MSG(ctx, "nowhere");
    ts_clear_error(ctx);
    /* a corrupt shard among good ones is named */
    write_text(WORK "/loader/train_004.bin", "TSTK but not a shard at all!!!!!"
                                             "!!!!");
    CHECK(ts_loader_open(ctx, dir, "train", SEQ, 1, true, &l) ==
          TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "train_004.bin");
    CHECK(l == NULL);
    ts_clear_error(ctx);
    remove(WORK "/loader/train_004.bin");
}

/* ---- 3. BPE training and prepare-data ---- */

static void check_round_trip(ts_ctx *ctx, ts_tokenizer *tok, const char *s) {
    int32_t *ids = NULL;
    size_t n = 0;
    char *back = NULL;
    size_t len = 0;
    CHECK_OK(ctx, ts_tokenizer_encode(tok, s, strlen(s), false, &ids, &n));
    CHECK_OK(ctx, ts_tokenizer_decode(tok, ids, n, false, &back, &len));
    ts_test_checks++;
    if (!back || len != strlen(s) || memcmp(back, s, len)) {
        ts_test_failures++;
        fprintf(stderr, "round trip of \"%s\" gave \"%s\"\n", s,
                back ? back : "(null)");
    }
    free(ids), free(back);
}

static size_t count_ids(ts_ctx *ctx, ts_tokenizer *tok, const char *text,
                        size_t len) {
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(ctx, ts_tokenizer_encode(tok, text, len, false, &ids, &n));
    free(ids);
    return n;
}

static void test_bpe_train(ts_ctx *ctx) {
    gen_text(WORK "/corpus_a.txt", 24000, 11);
    gen_text(WORK "/corpus_b.txt", 6000, 12);
    const char *files[2] = {WORK "/corpus_a.txt", WORK "/corpus_b.txt"};
    ts_bpe_train_options o = ts_bpe_train_default_options();
    o.vocab_size = 400;
    ts_bpe_train_stats st;
    CHECK_OK(ctx, ts_bpe_train(ctx, files, 2, &o, WORK "/tok", &st));
    CHECK(st.vocab_size == 400 && st.merges == 400 - 256 - 1);
    CHECK(st.bytes == file_size(files[0]) + file_size(files[1]));
    CHECK(st.distinct_words > 40 && st.distinct_words < 2000);

    /* tokenizer.json: 400 distinct tokens with the ids 0..399, the merges,
     * the end-of-text token last and special */
    json_t *j = json_load_file(WORK "/tok/tokenizer.json", 0, NULL);
    json_t *vocab = json_object_get(json_object_get(j, "model"), "vocab");
    json_t *merges = json_object_get(json_object_get(j, "model"), "merges");
    CHECK(json_object_size(vocab) == 400);
    CHECK(json_array_size(merges) == 400 - 256 - 1);
    {
        int seen[400] = {0}, bad = 0;
        const char *k;
        json_t *v;
        json_object_foreach(vocab, k, v) {
            json_int_t id = json_integer_value(v);
            if (id < 0 || id >= 400 || seen[id]++)
                bad++;
        }
        CHECK(bad == 0);
    }
    json_t *added = json_array_get(json_object_get(j, "added_tokens"), 0);
    CHECK(json_integer_value(json_object_get(added, "id")) == 399);
    CHECK(json_is_true(json_object_get(added, "special")));
    json_decref(j);
    json_t *cfg = json_load_file(WORK "/tok/tokenizer_config.json", 0, NULL);
    const char *eos = json_string_value(json_object_get(cfg, "eos_token"));
    CHECK(eos && !strcmp(eos, "<|endoftext|>"));
    json_decref(cfg);

    ts_tokenizer *tok = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, WORK "/tok", &tok));
    if (!tok)
        return;
    CHECK(ts_tokenizer_vocab_size(tok) == 400);
    CHECK(ts_tokenizer_token_id(tok, "<|endoftext|>") == 399);
    CHECK(ts_tokenizer_token_id(tok, "\xc4\xa0the") >= 256); /* " the" */
    static const char *const texts[] = {
        "The model learns a token from data.",
        "Unseen words: xylophone quokka zephyr!",
        "don't, it's, we'll, they're, I'm, you've, he'd",
        "numbers 0 7 42 123456789 3.14159 -17 1,000,000",
        "  two leading spaces\tand a tab\n\nblank line\r\nCRLF\n",
        "    indented\n        more\n",
        "café naïve Zürich 東京 über Ωmega résumé",
        "emoji: 🙂👍🏽 🇫🇷 and a ZWJ family 👨‍👩‍👧",
        "mixed: Αθήνα, Москва, القاهرة, עברית, हिन्दी, 한국어",
        "\n",
        " ",
        "a",
        "<|endoftext|> written in text is plain text here",
        "trailing spaces   ",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        check_round_trip(ctx, tok, texts[i]);
    /* the special token is one id when allowed */
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(ctx,
             ts_tokenizer_encode(tok, "a<|endoftext|>b", 15, true, &ids, &n));
    CHECK(n == 3 && ids && ids[1] == 399);
    free(ids);
    /* merges compress: the training text and an unseen one of its kind
     * take far fewer tokens than bytes */
    size_t len;
    char *text = tu_read_file(files[0], &len);
    size_t n_train = count_ids(ctx, tok, text, len);
    CHECK(n_train > 0 && (double)len / (double)n_train > 2.5);
    check_round_trip(ctx, tok, text);
    free(text);
    gen_text(WORK "/heldout.txt", 5000, 99);
    text = tu_read_file(WORK "/heldout.txt", &len);
    size_t n_held = count_ids(ctx, tok, text, len);
    CHECK(n_held > 0 && (double)len / (double)n_held > 2.5);
    free(text);
    ts_tokenizer_free(tok);

    /* deterministic: the same files give the same tokenizer.json */
    CHECK_OK(ctx, ts_bpe_train(ctx, files, 2, &o, WORK "/tok2", NULL));
    char *t1 = tu_read_file(WORK "/tok/tokenizer.json", NULL);
    char *t2 = tu_read_file(WORK "/tok2/tokenizer.json", NULL);
    CHECK(t1 && t2 && !strcmp(t1, t2));
    free(t1), free(t2);

    /* a small text runs out of pairs seen twice before the vocab fills */
    write_text(WORK "/tiny.txt", "low lower lowest low low");
    const char *tiny[1] = {WORK "/tiny.txt"};
    o.vocab_size = 1000;
    CHECK_OK(ctx, ts_bpe_train(ctx, tiny, 1, &o, WORK "/tok_tiny", &st));
    CHECK(st.merges > 0 && st.merges < 20);
    CHECK(st.vocab_size == 256 + st.merges + 1);
    CHECK_OK(ctx, ts_tokenizer_load(ctx, WORK "/tok_tiny", &tok));
    if (tok) {
        CHECK(ts_tokenizer_vocab_size(tok) == st.vocab_size);
        CHECK(count_ids(ctx, tok, " low", 4) == 1);
        check_round_trip(ctx, tok, "slow blow lowly 東京");
        ts_tokenizer_free(tok);
    }

    /* errors */
    o.vocab_size = 200;
    CHECK(ts_bpe_train(ctx, files, 2, &o, WORK "/tok_bad", NULL) ==
          TS_ERR_RANGE);
    CHECK_MSG(ctx, "vocab size 200");
    ts_clear_error(ctx);
    o.vocab_size = 400;
    const char *missing[1] = {WORK "/absent.txt"};
    CHECK(ts_bpe_train(ctx, missing, 1, &o, WORK "/tok_bad", NULL) ==
          TS_ERR_IO);
    CHECK_MSG(ctx, "absent.txt");
    ts_clear_error(ctx);
    write_text(WORK "/bad_utf8.txt", "fine text then \xff\xfe bad bytes");
    const char *bad[1] = {WORK "/bad_utf8.txt"};
    CHECK(ts_bpe_train(ctx, bad, 1, &o, WORK "/tok_bad", NULL) ==
          TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "bad_utf8.txt: not valid UTF-8");
    ts_clear_error(ctx);
    CHECK(!exists(WORK "/tok_bad/tokenizer.json"));
}

/* the ids prepare-data should write for one file: its encoding + eot */
static int32_t *doc_ids(ts_ctx *ctx, ts_tokenizer *tok, const char *path,
                        size_t *n) {
    size_t len;
    char *text = tu_read_file(path, &len);
    int32_t *ids = NULL;
    CHECK_OK(ctx, ts_tokenizer_encode(tok, text, len, false, &ids, n));
    free(text);
    ids = realloc(ids, sizeof *ids * (*n + 1));
    ids[(*n)++] = ts_tokenizer_token_id(tok, "<|endoftext|>");
    return ids;
}

/* the concatenated tokens of dir's prefix_NNN.bin shards */
static int32_t *shard_stream(ts_ctx *ctx, const char *dir, const char *prefix,
                             int n_shards, uint64_t per, size_t *n) {
    int32_t *out = NULL;
    *n = 0;
    for (int k = 0; k < n_shards; k++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s_%03d.bin", dir, prefix, k);
        ts_shard *s = NULL;
        CHECK_OK(ctx, ts_shard_open(ctx, p, &s));
        if (!s)
            continue;
        CHECK(ts_shard_count(s) <= per);
        out = realloc(out, sizeof *out * (*n + ts_shard_count(s)));
        for (uint64_t i = 0; i < ts_shard_count(s); i++)
            out[(*n)++] = ts_shard_token(s, i);
        ts_shard_close(s);
    }
    return out;
}

static void test_prepare(ts_ctx *ctx) {
    const char *files[2] = {WORK "/corpus_a.txt", WORK "/corpus_b.txt"};
    ts_prepare_options o = {.tokenizer_dir = WORK "/tok",
                            .out_dir = WORK "/data",
                            .val_fraction = 0.1,
                            .shard_tokens = 1024,
                            .quiet = true};
    ts_prepare_result r;
    CHECK_OK(ctx, ts_prepare_data(ctx, files, 2, &o, &r));
    ts_tokenizer *tok = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, WORK "/tok", &tok));
    if (!tok)
        return;
    /* each file is a document ended by <|endoftext|>; its last tenth goes
     * to val; shards of at most 1024 tokens, in order */
    size_t na, nb;
    int32_t *a = doc_ids(ctx, tok, files[0], &na);
    int32_t *b = doc_ids(ctx, tok, files[1], &nb);
    size_t va = (size_t)((double)na * 0.1), vb = (size_t)((double)nb * 0.1);
    CHECK(r.train_tokens == (int64_t)(na - va + nb - vb));
    CHECK(r.val_tokens == (int64_t)(va + vb));
    CHECK(r.bytes == file_size(files[0]) + file_size(files[1]));
    CHECK(r.train_shards == (int)((r.train_tokens + 1023) / 1024));
    CHECK(r.val_shards == (int)((r.val_tokens + 1023) / 1024));
    size_t nt, nv;
    int32_t *train =
        shard_stream(ctx, WORK "/data", "train", r.train_shards, 1024, &nt);
    int32_t *val =
        shard_stream(ctx, WORK "/data", "val", r.val_shards, 1024, &nv);
    CHECK(nt == na - va + nb - vb && nv == va + vb);
    if (nt == na - va + nb - vb && nv == va + vb) {
        CHECK(!memcmp(train, a, sizeof *a * (na - va)));
        CHECK(!memcmp(train + na - va, b, sizeof *b * (nb - vb)));
        CHECK(!memcmp(val, a + na - va, sizeof *a * va));
        CHECK(!memcmp(val + va, b + nb - vb, sizeof *b * vb));
    }
    free(a), free(b), free(train), free(val);
    char p[512];
    snprintf(p, sizeof p, "%s/train_%03d.bin", WORK "/data", r.train_shards);
    CHECK(!exists(p));
    json_t *m = json_load_file(WORK "/data/meta.json", 0, NULL);
    CHECK(json_integer_value(json_object_get(m, "vocab_size")) == 400);
    CHECK(json_integer_value(json_object_get(m, "train_tokens")) ==
          r.train_tokens);
    CHECK(json_integer_value(json_object_get(m, "val_tokens")) == r.val_tokens);
    CHECK(json_integer_value(json_object_get(m, "eot_token_id")) == 399);
    char th[TS_TOKENIZER_HASH_LEN];
    CHECK_OK(ctx, ts_tokenizer_file_hash(ctx, WORK "/tok", th, NULL, 0));
    CHECK(!strcmp(json_string_value(json_object_get(m, "tokenizer_hash")), th));
    json_decref(m);
    char *t1 = tu_read_file(WORK "/tok/tokenizer.json", NULL);
    char *t2 = tu_read_file(WORK "/data/tokenizer.json", NULL);
    CHECK(t1 && t2 && !strcmp(t1, t2));
    free(t1), free(t2);
    CHECK(exists(WORK "/data/tokenizer_config.json"));
    /* the loader reads it as one stream */
    ts_loader *l = NULL;
    CHECK_OK(ctx, ts_loader_open(ctx, WORK "/data", "train", 16, 1, true, &l));
    CHECK(l && ts_loader_tokens(l) == r.train_tokens);
    ts_loader_free(l);
    ts_tokenizer_free(tok);

    /* again into the same folder with larger shards: the earlier run's
     * shards past the new count are gone (the loader reads them all) */
    o.out_dir = WORK "/data_again";
    CHECK_OK(ctx, ts_prepare_data(ctx, files, 2, &o, &r));
    int many = r.train_shards;
    o.shard_tokens = 1 << 20;
    CHECK_OK(ctx, ts_prepare_data(ctx, files, 2, &o, &r));
    CHECK(many > 1 && r.train_shards == 1);
    CHECK(exists(WORK "/data_again/train_000.bin") &&
          !exists(WORK "/data_again/train_001.bin"));
    snprintf(p, sizeof p, WORK "/data_again/train_%03d.bin", many - 1);
    CHECK(!exists(p));
    CHECK(exists(WORK "/data_again/val_000.bin") &&
          !exists(WORK "/data_again/val_001.bin"));
    o.shard_tokens = 1024;
    /* a tokenizer_config.json naming a token the tokenizer lacks */
    mkdir(WORK "/tok_badcfg", 0755);
    copy_file(WORK "/tok/tokenizer.json", WORK "/tok_badcfg/tokenizer.json");
    write_text(WORK "/tok_badcfg/tokenizer_config.json",
               "{\"eos_token\": {\"content\": \"<|im_end|>\"}}");
    o.tokenizer_dir = WORK "/tok_badcfg", o.out_dir = WORK "/data_badcfg";
    CHECK(ts_prepare_data(ctx, files, 1, &o, &r) == TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "tokenizer_config.json names eos_token \"<|im_end|>\", "
                   "which is not in the tokenizer's vocabulary of 400 ids");
    ts_clear_error(ctx);
    CHECK(!exists(WORK "/data_badcfg/train_000.bin"));
    o.tokenizer_dir = WORK "/tok";
    /* --model-config: checked against the tokenizer before any work */
    write_text(WORK "/prep_small.json",
               "{\"model_type\": \"qwen3\", \"vocab_size\": 300, "
               "\"hidden_size\": 32, \"intermediate_size\": 64,"
               " \"num_hidden_layers\": 1, \"num_attention_heads\": 2}");
    write_text(WORK "/prep_eos.json",
               "{\"model_type\": \"qwen3\", \"vocab_size\": 512, "
               "\"hidden_size\": 32, \"intermediate_size\": 64,"
               " \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
               " \"eos_token_id\": 420}");
    o.out_dir = WORK "/data_model";
    o.model_config = WORK "/prep_small.json";
    CHECK(ts_prepare_data(ctx, files, 1, &o, &r) == TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "the model's vocab_size 300 (" WORK "/prep_small.json) is "
                   "smaller than the tokenizer's 400 ids (" WORK
                   "/tok: ids 0..399)");
    ts_clear_error(ctx);
    o.model_config = WORK "/prep_eos.json";
    CHECK(ts_prepare_data(ctx, files, 1, &o, &r) == TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "eos_token_id 420 in " WORK "/prep_eos.json is not an id "
                   "of the tokenizer");
    ts_clear_error(ctx);
    CHECK(!exists(WORK "/data_model/train_000.bin"));
    o.model_config = NULL;

    /* a fraction of 0 writes no val shards; bad input is named */
    o.out_dir = WORK "/data_noval", o.val_fraction = 0;
    CHECK_OK(ctx, ts_prepare_data(ctx, files, 1, &o, &r));
    CHECK(r.val_tokens == 0 && r.val_shards == 0);
    CHECK(!exists(WORK "/data_noval/val_000.bin"));
    o.val_fraction = 1;
    CHECK(ts_prepare_data(ctx, files, 1, &o, &r) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "val fraction 1");
    ts_clear_error(ctx);
    o.val_fraction = 0.1, o.shard_tokens = 10;
    CHECK(ts_prepare_data(ctx, files, 1, &o, &r) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "shard size 10");
    ts_clear_error(ctx);
    o.shard_tokens = 1024;
    const char *missing[1] = {WORK "/absent.txt"};
    CHECK(ts_prepare_data(ctx, missing, 1, &o, &r) == TS_ERR_IO);
    CHECK_MSG(ctx, "absent.txt");
    ts_clear_error(ctx);
    const char *folder[1] = {WORK "/tok"};
    CHECK(ts_prepare_data(ctx, folder, 1, &o, &r) == TS_ERR_IO);
    CHECK_MSG(ctx, "cannot read " WORK "/tok: Is a directory");
    ts_clear_error(ctx);
    o.tokenizer_dir = WORK "/no_tokenizer";
    CHECK(ts_prepare_data(ctx, files, 1, &o, &r) != TS_OK);
    CHECK_MSG(ctx, "no_tokenizer");
    ts_clear_error(ctx);
}

/* prepare-data reads big files in chunks of about 1 MiB: the tokens are
 * those of the whole text, and a line longer than a chunk (no newline at
 * all) is never cut inside a UTF-8 character */
static void test_prepare_chunks(ts_ctx *ctx) {
    gen_text(WORK "/big.txt", 1200000, 21);
    char *line = malloc(1100000 + 1);
    for (int i = 0; i < 1100000; i += 11)
        memcpy(line + i, "caf\xc3\xa9 ol\xc3\xa9 ", 11);
    write_bytes(WORK "/long_line.txt", line, 1100000);
    free(line);
    const char *files[2] = {WORK "/big.txt", WORK "/long_line.txt"};
    ts_prepare_options o = {.tokenizer_dir = WORK "/tok",
                            .out_dir = WORK "/data_big",
                            .val_fraction = 0,
                            .shard_tokens = 1 << 26,
                            .quiet = true};
    ts_prepare_result r;
    CHECK_OK(ctx, ts_prepare_data(ctx, files, 2, &o, &r));
    ts_tokenizer *tok = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, WORK "/tok", &tok));
    if (!tok)
        return;
    size_t na, nb, nt;
    int32_t *a = doc_ids(ctx, tok, files[0], &na);
    int32_t *b = doc_ids(ctx, tok, files[1], &nb);
    int32_t *t = shard_stream(ctx, WORK "/data_big", "train", 1, 1 << 26, &nt);
    CHECK(r.train_shards == 1 && r.train_tokens == (int64_t)(na + nb));
    CHECK(nt == na + nb && t && !memcmp(t, a, sizeof *a * na) &&
          !memcmp(t + na, b, sizeof *b * nb));
    free(a), free(b), free(t);
    ts_tokenizer_free(tok);
}

/* ---- 4. training ---- */

/* hidden 32, 2 layers, 2 heads of 16, 1 kv head, intermediate 64, tied */
static const char *QWEN3_CONFIG =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\","
    " \"vocab_size\": 400, \"hidden_size\": 32, \"intermediate_size\": 64,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 1, \"head_dim\": 16,"
    " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-06,"
    " \"rope_theta\": 10000.0, \"tie_word_embeddings\": true,"
    " \"eos_token_id\": 399, \"torch_dtype\": \"float32\"}\n";

/* the same shape as Llama: untied head, no q/k norms */
static const char *LLAMA_CONFIG =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
    " \"vocab_size\": 400, \"hidden_size\": 32, \"intermediate_size\": 64,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 1, \"head_dim\": 16,"
    " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-05,"
    " \"rope_theta\": 10000.0, \"bos_token_id\": 1}\n";

/* parameters without the embedding, by hand: per layer q 32x32, k and v
 * 16x32, o 32x32, q/k norms 16 each, gate/up/down 64x32, two norms of 32;
 * then the final norm */
enum {
    N_LAYER = 1024 + 512 + 512 + 1024 + 16 + 16 + 3 * 2048 + 2 * 32,
    N_NO_EMBED = 2 * N_LAYER + 32,
    N_EMBED = 400 * 32
};

/* this process as a world of one, as `tessera train` runs outside mpirun */
static ts_dist *g_dist;

static ts_train_options base_options(const char *out) {
    ts_train_options o = ts_train_default_options();
    o.dist = g_dist;
    o.model_config = WORK "/qwen3.json";
    o.data_dir = WORK "/data";
    o.out_dir = out;
    o.batch = 4, o.seq = 16, o.steps = 8;
    o.lr = 1e-2, o.min_lr = 1e-3, o.warmup = 2;
    o.seed = 3, o.quiet = true;
    o.peak = 1e6; /* no sgemm measurement; MFU = tokens/s * FLOPs / 1e6 */
    return o;
}

static void check_losses_equal(const char *what, const train_log *a,
                               const train_log *b, int from, double rtol) {
    ts_test_checks++;
    for (int i = 0; i < a->n; i++) {
        if (a->step[i] <= from)
            continue;
        int k = -1;
        for (int q = 0; q < b->n; q++)
            if (b->step[q] == a->step[i])
                k = q;
        if (k < 0 || !(fabs(a->loss[i] - b->loss[k]) <=
                       rtol * fabs(a->loss[i]) + 1e-6)) {
            ts_test_failures++;
            fprintf(stderr, "%s: step %lld loss %.6f vs %.6f\n", what,
                    (long long)a->step[i], a->loss[i],
                    k < 0 ? NAN : b->loss[k]);
            return;
        }
    }
}

/* the mean loss of the model in dir on the training batch of step
 * `step` (1-based) as the trainer's loader deals it */
static double checkpoint_loss(ts_ctx *ctx, const char *dir,
                              const ts_train_options *o, int64_t step) {
    ts_decoder *m = NULL;
    double v = NAN;
    CHECK_OK(ctx, ts_decoder_load(ctx, dir, &m));
    ts_loader *l = NULL;
    CHECK_OK(ctx, ts_loader_open(ctx, o->data_dir, "train", o->seq, o->seed,
                                 true, &l));
    if (!m || !l) {
        ts_decoder_free(m), ts_loader_free(l);
        return v;
    }
    int64_t B = o->batch * o->grad_accum, T = o->seq;
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(B * T));
    int64_t *tg = malloc(sizeof(int64_t) * (size_t)(B * T));
    ts_loader_seek(l, (uint64_t)((step - 1) * B));
    CHECK_OK(ctx, ts_loader_next(l, B, 0, 1, ids, tg));
    bool old = ts_set_grad_enabled(ctx, false);
    int64_t shape[2] = {B, T};
    ts_tensor *i = ts_from_data(ctx, TS_I64, 2, shape, ids);
    ts_tensor *t = ts_from_data(ctx, TS_I64, 2, shape, tg);
    ts_tensor *loss = ts_decoder_loss(m, i, t, NULL);
    CHECK(loss != NULL);
    if (loss)
        CHECK_OK(ctx, ts_item(loss, &v));
    ts_release(loss), ts_release(i), ts_release(t);
    ts_set_grad_enabled(ctx, old);
    free(ids), free(tg);
    ts_loader_free(l);
    ts_decoder_free(m);
    return v;
}

static void test_flops(void) {
    /* PaLM: 6 N + 12 L H Q T */
    CHECK(ts_train_flops_per_token(N_NO_EMBED, 2, 2, 16, 16) ==
          6.0 * 18656 + 12.0 * 2 * 2 * 16 * 16);
    CHECK(N_NO_EMBED == 18656);
    CHECK(ts_train_flops_per_token(0, 0, 0, 0, 0) == 0);
    /* Qwen3-0.6B's shape: 28 layers, 16 heads of 128, 440M parameters
     * without the embeddings, 2048 tokens */
    CHECK_NEAR(ts_train_flops_per_token(440401920, 28, 16, 128, 2048),
               6.0 * 440401920 + 12.0 * 28 * 16 * 128 * 2048, 0.5);
}

static void test_peak(ts_ctx *ctx) {
    /* the hardware peak: cores x a measured clock x the ISA's FLOPs per
     * cycle, never below what sgemm achieves; nothing cached on disk */
    char cache[512];
    char *cwd = getcwd(NULL, 0);
    snprintf(cache, sizeof cache, "%s/" WORK "/cache", cwd ? cwd : ".");
    free(cwd);
    char *old =
        getenv("XDG_CACHE_HOME") ? strdup(getenv("XDG_CACHE_HOME")) : NULL;
    setenv("XDG_CACHE_HOME", cache, 1);
    ts_peak_info p;
    CHECK_OK(ctx, ts_peak_measure(ctx, true, &p));
    CHECK(p.clock_hz > 2e8 && p.clock_hz < 8e9);
    CHECK(p.cores >= 1 && p.cores <= ts_get_num_threads(ctx));
    CHECK(p.sgemm > 1e8);
    CHECK(p.hardware >= p.sgemm); /* MFU <= 100% by construction */
    CHECK_NEAR(p.hardware, p.cores * p.clock_hz * p.flops_per_cycle,
               1e-6 * p.hardware);
    CHECK(p.cpu[0] && p.isa[0]);
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        !strstr(p.isa, "AVX-512"))
        CHECK(p.flops_per_cycle == 32 && !strcmp(p.isa, "AVX2+FMA"));
    if (__builtin_cpu_supports("avx512f") && !strstr(p.isa, "AVX-512"))
        CHECK(strstr(p.isa_note, "AVX-512") != NULL); /* named, unused */
#endif
    bool cached = true;
    CHECK(ts_peak_flops(false, &cached) > 1e8 && !cached);
    CHECK(!exists(WORK "/cache/tessera/peak.json"));
    if (old)
        setenv("XDG_CACHE_HOME", old, 1);
    else
        unsetenv("XDG_CACHE_HOME");
    free(old);
}

static void test_loss_falls(ts_ctx *ctx) {
    /* a period-5 pattern: after a few steps the next token is certain */
    const char *dir = WORK "/rep";
    mkdir(dir, 0755);
    int32_t pat[5] = {17, 42, 3, 250, 99}, ids[2000];
    for (int i = 0; i < 2000; i++)
        ids[i] = pat[i % 5];
    CHECK_OK(ctx, ts_shard_write(ctx, WORK "/rep/train_000.bin", ids, 2000));
    CHECK_OK(ctx, ts_shard_write(ctx, WORK "/rep/val_000.bin", ids, 200));
    ts_train_options o = base_options(WORK "/run_rep");
    o.data_dir = dir;
    o.eager = true;
    o.eval_every = 4, o.eval_batches = 2;
    ts_train_result r;
    CHECK_OK(ctx, ts_train_run(ctx, &o, &r));
    train_log lg;
    read_log(WORK "/run_rep", &lg);
    CHECK(lg.n == 8 && r.steps_done == 8);
    CHECK(r.first_loss > 5.5 && r.first_loss < 6.5); /* ln 400 = 5.99 */
    CHECK(r.last_loss < r.first_loss - 1.5);
    CHECK(r.last_val_loss < r.first_loss - 1.5);
    CHECK_NEAR(lg.loss[0], r.first_loss, 1e-6);
    CHECK_NEAR(lg.loss[7], r.last_loss, 1e-6);
    int falls = 0;
    for (int i = 1; i < lg.n; i++)
        falls += lg.loss[i] < lg.loss[i - 1];
    CHECK(falls >= 6);
    char *text = tu_read_file(WORK "/run_rep/log.jsonl", NULL);
    CHECK(text && strstr(text, "\"val_loss\"")); /* steps 4 and 8 */
    free(text);
}

/* o's 8 steps eager into e_dir and compiled into c_dir: the same losses */
static void eager_and_compiled(ts_ctx *ctx, ts_train_options o,
                               const char *e_dir, const char *c_dir,
                               ts_train_result *re, ts_train_result *rc,
                               train_log *le, train_log *lc) {
    o.out_dir = e_dir, o.eager = true;
    CHECK_OK(ctx, ts_train_run(ctx, &o, re));
    o.out_dir = c_dir, o.eager = false;
    CHECK_OK(ctx, ts_train_run(ctx, &o, rc));
    read_log(e_dir, le);
    read_log(c_dir, lc);
    CHECK(le->n == 8 && lc->n == 8);
    check_losses_equal(o.model_config, le, lc, 0, 1e-5);
}

static void test_train_runs(ts_ctx *ctx) {
    ts_train_result re, rc;

    /* eager and compiled: the same losses and weights (today to the bit;
     * the tolerance leaves room for another order of the same sums) */
    ts_train_options o = base_options(NULL);
    train_log le, lc;
    eager_and_compiled(ctx, o, WORK "/run_eager", WORK "/run_compiled", &re,
                       &rc, &le, &lc);
    CHECK(fabs(re.last_loss - rc.last_loss) <= 1e-5 * re.last_loss);
    CHECK(re.last_loss < re.first_loss);
    CHECK(re.n_params == N_NO_EMBED + N_EMBED);
    check_same_tensors(ctx, WORK "/run_eager/step_000008/model.safetensors",
                       WORK "/run_compiled/step_000008/model.safetensors", 1e-5,
                       1e-6);
    /* MFU as logged: tokens/s x (6 N + 12 L H Q T) / peak */
    double fpt = ts_train_flops_per_token(N_NO_EMBED, 2, 2, 16, 16);
    for (int i = 0; i < lc.n; i++)
        CHECK(lc.tps[i] > 0 && fabs(lc.mfu[i] - lc.tps[i] * fpt / 1e6) <=
                                   1e-3 * lc.mfu[i] + 1e-4);

    /* 3 steps, then 3 more resumed = 6 steps, to the bit (constant rate
     * after warmup, so the schedule does not depend on --steps) */
    o = base_options(WORK "/run_6");
    o.constant_lr = true, o.steps = 6;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    o.out_dir = WORK "/run_3_3", o.steps = 3;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    CHECK(exists(WORK "/run_3_3/step_000003/model.safetensors"));
    o.steps = 6, o.resume = true;
    ts_train_result rr;
    CHECK_OK(ctx, ts_train_run(ctx, &o, &rr));
    CHECK(rr.steps_done == 6);
    train_log l6, l33;
    read_log(WORK "/run_6", &l6);
    read_log(WORK "/run_3_3", &l33);
    CHECK(l6.n == 6 && l33.n == 6); /* the log appended on resume */
    for (int i = 0; i < 6 && l33.n == 6; i++)
        CHECK(l33.step[i] == i + 1);
    check_losses_equal("6 vs 3+3", &l6, &l33, 0, 0);
    check_same_tensors(ctx, WORK "/run_6/step_000006/model.safetensors",
                       WORK "/run_3_3/step_000006/model.safetensors", 0, 1e-30);
    check_same_tensors(ctx, WORK "/run_6/step_000006/optimizer.safetensors",
                       WORK "/run_3_3/step_000006/optimizer.safetensors", 0,
                       1e-30);
    char *latest = tu_read_file(WORK "/run_3_3/latest", NULL);
    CHECK(latest && !strcmp(latest, "step_000006\n"));
    free(latest);
    /* resuming a finished run does nothing more */
    CHECK_OK(ctx, ts_train_run(ctx, &o, &rr));
    CHECK(rr.steps_done == 6);
    read_log(WORK "/run_3_3", &l33);
    CHECK(l33.n == 6);

    /* cosine: a run killed after its step-3 save (and in the middle of
     * the next save) resumes to the uninterrupted run's steps 4..6 */
    o = base_options(WORK "/run_cos");
    o.steps = 6, o.save_every = 3;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    const char *ck = WORK "/run_cos/step_000003";
    static const char *const files[] = {
        "model.safetensors", "optimizer.safetensors",
        "config.json",       "generation_config.json",
        "tokenizer.json",    "tokenizer_config.json",
        "trainer_state.json"};
    mkdir(WORK "/run_killed", 0755);
    mkdir(WORK "/run_killed/step_000003", 0755);
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/%s", ck, files[i]);
        snprintf(b, sizeof b, WORK "/run_killed/step_000003/%s", files[i]);
        CHECK(exists(a));
        copy_file(a, b);
    }
    write_text(WORK "/run_killed/latest", "step_000003\n");
    mkdir(WORK "/run_killed/.tmp-step_000006", 0755);
    write_text(WORK "/run_killed/.tmp-step_000006/model.safetensors",
               "half a file");
    o.out_dir = WORK "/run_killed", o.resume = true;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    train_log lcos, lk;
    read_log(WORK "/run_cos", &lcos);
    read_log(WORK "/run_killed", &lk);
    CHECK(lk.n == 3 && lk.step[0] == 4);
    check_losses_equal("6 vs killed at 3 + resumed", &lcos, &lk, 3, 0);
    check_same_tensors(ctx, WORK "/run_cos/step_000006/model.safetensors",
                       WORK "/run_killed/step_000006/model.safetensors", 0,
                       1e-30);
    check_same_tensors(ctx, WORK "/run_cos/step_000006/optimizer.safetensors",
                       WORK "/run_killed/step_000006/optimizer.safetensors", 0,
                       1e-30);
    check_same_tensors(ctx, WORK "/run_cos/step_000003/model.safetensors",
                       WORK "/run_killed/step_000003/model.safetensors", 0,
                       1e-30);
    CHECK(!exists(WORK "/run_killed/.tmp-step_000006"));
    latest = tu_read_file(WORK "/run_killed/latest", NULL);
    CHECK(latest && !strcmp(latest, "step_000006\n"));
    free(latest);

    /* the checkpoint: a Hugging Face folder plus the trainer's files */
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char a[512];
        snprintf(a, sizeof a, WORK "/run_cos/step_000006/%s", files[i]);
        CHECK(exists(a));
    }
    latest = tu_read_file(WORK "/run_cos/latest", NULL);
    CHECK(latest && !strcmp(latest, "step_000006\n"));
    free(latest);
    json_t *ts =
        json_load_file(WORK "/run_cos/step_000003/trainer_state.json", 0, NULL);
    CHECK(json_integer_value(json_object_get(ts, "step")) == 3);
    CHECK(json_integer_value(json_object_get(ts, "loader_position")) == 12);
    json_decref(ts);
    char *c1 = tu_read_file(WORK "/qwen3.json", NULL);
    char *c2 = tu_read_file(WORK "/run_cos/step_000003/config.json", NULL);
    CHECK(c1 && c2 && !strcmp(c1, c2));
    free(c1), free(c2);
    json_t *gen = json_load_file(
        WORK "/run_cos/step_000003/generation_config.json", 0, NULL);
    CHECK(json_integer_value(json_object_get(gen, "eos_token_id")) == 399);
    json_decref(gen);
    /* no leftovers of the atomic saves */
    CHECK(!exists(WORK "/run_cos/.tmp-step_000003") &&
          !exists(WORK "/run_cos/.tmp-step_000006"));

    /* the step-3 checkpoint gives the loss the trainer logged at step 4
     * (its weights are the ones step 4 started from) */
    double l4 = checkpoint_loss(ctx, WORK "/run_cos/step_000003", &o, 4);
    CHECK(fabs(l4 - lcos.loss[3]) <= 1e-5 * lcos.loss[3] + 1e-6);
    /* ts_lm_load reads the same folder with the same logits */
    ts_lm *lm = NULL;
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_lm_load(ctx, WORK "/run_cos/step_000006", NULL, &lm));
    CHECK_OK(ctx, ts_decoder_load(ctx, WORK "/run_cos/step_000006", &m));
    if (lm && m) {
        int64_t ids[12] = {1, 5, 9, 200, 399, 17, 3, 0, 256, 300, 42, 7};
        int64_t shape[2] = {1, 12};
        ts_tensor *x = ts_from_data(ctx, TS_I64, 2, shape, ids);
        ts_tensor *a = ts_lm_forward(lm, x), *b = ts_decoder_forward(m, x, 0);
        test_allclose("ts_lm_load vs ts_decoder_load logits", a, b, 0, 1e-6);
        CHECK(a && ts_tensor_dim(a, 2) == 400);
        ts_release(a), ts_release(b), ts_release(x);
        /* the trained weights, not a fresh model's */
        ts_tensor *w = ts_decoder_find_param(m, "model.norm.weight");
        double v = 1;
        int64_t at[1] = {0};
        CHECK(w && ts_get(w, at, &v) == TS_OK && v != 1.0);
    }
    ts_lm_free(lm), ts_decoder_free(m);

    /* grad-accum 2 of batch 2 = batch 4: each step takes the same 4
     * windows (the loader deals `batch` per micro-batch), and the mean of
     * two equal-sized means is the mean */
    o = base_options(WORK "/run_b4");
    o.steps = 4, o.eager = true;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    o.out_dir = WORK "/run_b2x2", o.batch = 2, o.grad_accum = 2;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    train_log lb4, lb22;
    read_log(WORK "/run_b4", &lb4);
    read_log(WORK "/run_b2x2", &lb22);
    CHECK(lb4.n == 4 && lb22.n == 4);
    check_losses_equal("batch 4 vs 2 x accum 2", &lb4, &lb22, 0, 1e-5);
    check_same_tensors(ctx, WORK "/run_b4/step_000004/model.safetensors",
                       WORK "/run_b2x2/step_000004/model.safetensors", 1e-3,
                       1e-4);
    ts = json_load_file(WORK "/run_b2x2/step_000004/trainer_state.json", 0,
                        NULL);
    CHECK(json_integer_value(json_object_get(ts, "loader_position")) == 16);
    json_decref(ts);

    /* a Llama config trains too, and its checkpoint (untied head) loads */
    write_text(WORK "/llama.json", LLAMA_CONFIG);
    o = base_options(WORK "/run_llama");
    o.model_config = WORK "/llama.json", o.steps = 2;
    ts_train_result rl;
    CHECK_OK(ctx, ts_train_run(ctx, &o, &rl));
    CHECK(rl.n_params == N_NO_EMBED - 2 * 32 + 2 * N_EMBED);
    CHECK(isfinite(rl.last_loss) && rl.last_loss < 6.5);
    CHECK_OK(ctx, ts_lm_load(ctx, WORK "/run_llama/step_000002", NULL, &lm));
    CHECK(lm && ts_lm_config(lm)->arch == TS_ARCH_LLAMA);
    ts_lm_free(lm);
    ts_safetensors *sf = NULL;
    CHECK_OK(ctx,
             ts_safetensors_open(
                 ctx, WORK "/run_llama/step_000002/model.safetensors", &sf));
    ts_tensor *head = sf ? ts_safetensors_get(sf, "lm_head.weight") : NULL;
    CHECK(head && ts_tensor_dim(head, 0) == 400);
    ts_release(head);
    ts_safetensors_close(sf);
}

/* ---- 5. bad input ---- */

static void expect_train_error(ts_ctx *ctx, const ts_train_options *o,
                               ts_status want, const char *msg) {
    ts_train_result r;
    ts_status s = ts_train_run(ctx, o, &r);
    ts_test_checks++;
    if (s != want) {
        ts_test_failures++;
        fprintf(stderr, "ts_train_run: %s (%s), expected %s for \"%s\"\n",
                ts_status_name(s), ts_errmsg(ctx), ts_status_name(want), msg);
    }
    CHECK_MSG(ctx, msg);
    ts_clear_error(ctx);
}

/* GPT-2 through the same loop: eager and compiled give the same losses,
 * which fall, also with its blocks checkpointed, and close ones with bf16
 * matrices; MFU counts every parameter but
 * the position table; 3 steps resumed for 3 more are 6 steps to the bit; a
 * checkpoint is a GPT-2 folder that ts_lm_load (tessera run) reads and whose
 * loss on the next batch is the one logged; what the loop cannot do with GPT-2
 * is refused by name. */
/* --resume rewrites log.jsonl to the checkpoint's step: the kept lines
 * byte for byte, no step twice, a half-written last line gone */
static void test_resume_truncates_log(ts_ctx *ctx) {
    ts_train_options o = base_options(WORK "/run_trunc");
    o.constant_lr = true, o.steps = 6, o.save_every = 2, o.keep_last = 0;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    size_t n_full;
    char *full = tu_read_file(WORK "/run_trunc/log.jsonl", &n_full);
    /* killed after step 6's log line, before its save, in the middle of a
     * line of step 7 (as if from a longer run) */
    rm_rf(WORK "/run_trunc/step_000006");
    write_text(WORK "/run_trunc/latest", "step_000004\n");
    FILE *f = fopen(WORK "/run_trunc/log.jsonl", "a");
    if (f)
        fputs("{\"step\": 7, \"loss\": 5.1", f), fclose(f);
    /* the first 4 lines as they were */
    char *cut = full;
    for (int k = 0; cut && k < 4; k++)
        cut = strchr(cut, '\n') ? strchr(cut, '\n') + 1 : NULL;
    size_t n_kept = cut ? (size_t)(cut - full) : 0;
    o.resume = true;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    size_t n_new;
    char *now = tu_read_file(WORK "/run_trunc/log.jsonl", &n_new);
    CHECK(full && now && n_kept > 0 && n_new > n_kept &&
          !memcmp(full, now, n_kept));
    train_log lg, ref;
    read_log(WORK "/run_trunc", &lg);
    CHECK(lg.n == 6);
    for (int i = 0; i < lg.n; i++)
        CHECK(lg.step[i] == i + 1); /* each step once, in order */
    read_log(WORK "/run_6", &ref);  /* the same options, uninterrupted */
    check_losses_equal("resumed after a truncated log", &ref, &lg, 0, 0);
    CHECK(!exists(WORK "/run_trunc/log.jsonl.tmp"));
    free(full), free(now);
}

/* --keep-last 2: the newest two checkpoints and the best validation
 * loss's, however old; 0 keeps all; 3 by default */
static void test_keep_last(ts_ctx *ctx) {
    CHECK(ts_train_default_options().keep_last == 3);
    ts_train_options o = base_options(WORK "/run_keep");
    o.constant_lr = true, o.steps = 2, o.save_every = 1, o.keep_last = 0;
    o.eval_every = 1, o.eval_batches = 1;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    json_t *ts = json_load_file(WORK "/run_keep/step_000002/trainer_state.json",
                                0, NULL);
    CHECK(json_is_real(json_object_get(ts, "val_loss")));
    json_decref(ts);
    /* step 1's is made the best by far */
    const char *p1 = WORK "/run_keep/step_000001/trainer_state.json";
    ts = json_load_file(p1, 0, NULL);
    CHECK(json_is_real(json_object_get(ts, "val_loss")));
    json_object_set_new(ts, "val_loss", json_real(0.001));
    json_dump_file(ts, p1, 0);
    json_decref(ts);
    o.steps = 6, o.keep_last = 2, o.resume = true;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    CHECK(exists(WORK "/run_keep/step_000001/model.safetensors")); /* best */
    for (int s = 2; s <= 4; s++) {
        char p[256];
        snprintf(p, sizeof p, WORK "/run_keep/step_%06d", s);
        CHECK(!exists(p));
    }
    CHECK(exists(WORK "/run_keep/step_000005/model.safetensors"));
    CHECK(exists(WORK "/run_keep/step_000006/model.safetensors"));
    /* the default: 3, no validation (no best) */
    o = base_options(WORK "/run_keep3");
    o.steps = 5, o.save_every = 1;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    CHECK(!exists(WORK "/run_keep3/step_000001") &&
          !exists(WORK "/run_keep3/step_000002"));
    CHECK(exists(WORK "/run_keep3/step_000003") &&
          exists(WORK "/run_keep3/step_000004") &&
          exists(WORK "/run_keep3/step_000005"));
}

/* the model, the tokenizer and the shards are checked against each
 * other before training; each refusal names both sides */
static void test_train_consistency(ts_ctx *ctx) {
    ts_train_options o = base_options(WORK "/run_cons");
    o.steps = 1;
    /* special ids: past the model's vocabulary, past the tokenizer's */
    write_text(WORK "/eos_far.json",
               "{\"model_type\": \"qwen3\", \"vocab_size\": 400, "
               "\"hidden_size\": 32, \"intermediate_size\": 64,"
               " \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
               " \"num_key_value_heads\": 1, \"head_dim\": 16,"
               " \"eos_token_id\": 450}");
    o.model_config = WORK "/eos_far.json";
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG,
                       "eos_token_id 450 in " WORK
                       "/eos_far.json is outside the model's vocabulary "
                       "(vocab_size 400: ids 0..399)");
    write_text(WORK "/pad_far.json",
               "{\"model_type\": \"qwen3\", \"vocab_size\": 512, "
               "\"hidden_size\": 32, \"intermediate_size\": 64,"
               " \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
               " \"num_key_value_heads\": 1, \"head_dim\": 16,"
               " \"pad_token_id\": 450}");
    o.model_config = WORK "/pad_far.json";
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG,
                       "pad_token_id 450 in " WORK
                       "/pad_far.json is not an id of the tokenizer (" WORK
                       "/data/tokenizer.json has ids 0..399)");
    /* a larger model vocabulary is fine (a note when much larger) */
    write_text(WORK "/vocab_big.json",
               "{\"model_type\": \"qwen3\", \"vocab_size\": 4096, "
               "\"hidden_size\": 32, \"intermediate_size\": 64,"
               " \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
               " \"num_key_value_heads\": 1, \"head_dim\": 16}");
    o.model_config = WORK "/vocab_big.json";
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));

    /* the shards' tokenizer: prepare-data recorded its hash */
    char h_data[TS_TOKENIZER_HASH_LEN], h_alt[TS_TOKENIZER_HASH_LEN];
    CHECK_OK(ctx, ts_tokenizer_file_hash(ctx, WORK "/data", h_data, NULL, 0));
    json_t *m = json_load_file(WORK "/data/meta.json", 0, NULL);
    const char *mh = json_string_value(json_object_get(m, "tokenizer_hash"));
    CHECK(mh && !strcmp(mh, h_data) && strlen(h_data) == 41 &&
          !strncmp(h_data, "xxh3-128:", 9));
    /* another tokenizer: the same one with a byte more (still JSON) */
    mkdir(WORK "/tok_alt", 0755);
    size_t n;
    char *tj = tu_read_file(WORK "/tok/tokenizer.json", &n);
    if (tj) {
        FILE *f = fopen(WORK "/tok_alt/tokenizer.json", "wb");
        if (f)
            fwrite(tj, 1, n, f), fputc(' ', f), fclose(f);
    }
    free(tj);
    CHECK_OK(ctx, ts_tokenizer_file_hash(ctx, WORK "/tok_alt", h_alt, NULL, 0));
    CHECK(strcmp(h_alt, h_data) != 0);
    o = base_options(WORK "/run_cons");
    o.steps = 1, o.tokenizer_dir = WORK "/tok_alt";
    ts_train_result r;
    CHECK(ts_train_run(ctx, &o, &r) == TS_ERR_INVALID_ARG);
    const char *msg = ts_errmsg(ctx);
    CHECK(strstr(msg, h_data) && strstr(msg, h_alt));
    CHECK(strstr(msg, WORK "/tok_alt/tokenizer.json") &&
          strstr(msg, WORK "/data/meta.json"));
    CHECK_MSG(ctx, "the shards in " WORK "/data were made with the tokenizer");
    ts_clear_error(ctx);
    /* the same shards with the tokenizer given by hand: accepted */
    o.tokenizer_dir = WORK "/tok";
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    /* a data folder of an older prepare-data (no hash): still read */
    mkdir(WORK "/data_old", 0755);
    int nt = (int)json_integer_value(json_object_get(m, "train_shards"));
    for (int i = 0; i < nt; i++) {
        char a[256], b[256];
        snprintf(a, sizeof a, WORK "/data/train_%03d.bin", i);
        snprintf(b, sizeof b, WORK "/data_old/train_%03d.bin", i);
        copy_file(a, b);
    }
    copy_file(WORK "/data/tokenizer.json", WORK "/data_old/tokenizer.json");
    json_object_del(m, "tokenizer_hash");
    json_object_del(m, "tokenizer");
    json_dump_file(m, WORK "/data_old/meta.json", 0);
    o = base_options(WORK "/run_cons_old");
    o.steps = 2, o.data_dir = WORK "/data_old";
    CHECK_OK(ctx, ts_train_run(ctx, &o, &r));
    CHECK(r.steps_done == 2);
    json_decref(m);

    /* --init-from a folder whose tokenizer is not the data's */
    const char *init = WORK "/init_alt";
    mkdir(init, 0755);
    static const char *const ck[] = {"model.safetensors", "config.json",
                                     "generation_config.json"};
    for (int i = 0; i < 3; i++) {
        char a[256], b[256];
        snprintf(a, sizeof a, WORK "/run_cos/step_000006/%s", ck[i]);
        snprintf(b, sizeof b, "%s/%s", init, ck[i]);
        copy_file(a, b);
    }
    copy_file(WORK "/tok_alt/tokenizer.json", WORK "/init_alt/tokenizer.json");
    o = base_options(WORK "/run_cons_init");
    o.steps = 1, o.model_config = NULL, o.init_from = init;
    CHECK(ts_train_run(ctx, &o, &r) == TS_ERR_INVALID_ARG);
    msg = ts_errmsg(ctx);
    CHECK(strstr(msg, h_data) && strstr(msg, h_alt));
    CHECK_MSG(ctx, "--init-from " WORK "/init_alt has another tokenizer");
    ts_clear_error(ctx);
    CHECK(!exists(WORK "/run_cons_init/step_000001"));
    /* with its own tokenizer it is the data's: accepted */
    copy_file(WORK "/data/tokenizer.json", WORK "/init_alt/tokenizer.json");
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    char *t1 =
        tu_read_file(WORK "/run_cons_init/step_000001/tokenizer.json", NULL);
    char *t2 = tu_read_file(WORK "/data/tokenizer.json", NULL);
    CHECK(t1 && t2 && !strcmp(t1, t2));
    free(t1), free(t2);
}

/* MFU against the hardware peak (measured at start, named in the log's
 * first line): never above 1, the sgemm achieved beside it and below it;
 * the summary is the mean over the steps after the first, as log.jsonl's
 * per-step lines add up */
static void test_mfu_summary(ts_ctx *ctx) {
    ts_train_options o = base_options(WORK "/run_mfu");
    o.steps = 4, o.peak = 0, o.eager = true;
    ts_train_result r;
    CHECK_OK(ctx, ts_train_run(ctx, &o, &r));
    FILE *f = fopen(WORK "/run_mfu/log.jsonl", "r");
    char line[4096];
    int n = 0;
    double tokens = 0, secs = 0, hw = 0, sg = 0;
    while (f && fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        json_t *pk = json_object_get(j, "peak");
        n++;
        CHECK(json_integer_value(json_object_get(j, "step")) == n);
        CHECK((n == 1) == (pk != NULL)); /* on the run's first line */
        if (pk) {
            hw = json_number_value(json_object_get(pk, "gflops"));
            sg = json_number_value(json_object_get(pk, "sgemm_gflops"));
            CHECK(!strcmp(json_string_value(json_object_get(pk, "source")),
                          "hardware"));
            CHECK(json_string_length(json_object_get(pk, "cpu")) > 0);
            CHECK(json_string_length(json_object_get(pk, "isa")) > 0);
            double ghz = json_number_value(json_object_get(pk, "clock_ghz"));
            double fpc =
                json_number_value(json_object_get(pk, "flops_per_cycle"));
            int64_t cores = json_integer_value(json_object_get(pk, "cores"));
            CHECK(ghz > 0.2 && fpc >= 8 && cores >= 1);
            CHECK(fabs(hw - cores * ghz * fpc) <= 1e-3 * hw);
        }
        double mfu = json_number_value(json_object_get(j, "mfu"));
        double tps = json_number_value(json_object_get(j, "tokens_per_s"));
        double ss = json_number_value(json_object_get(j, "step_s"));
        CHECK(mfu > 0 && mfu <= 1 && ss > 0);
        /* 64 tokens a step; tps printed to 0.1, step_s to 1e-6 */
        CHECK(fabs(tps * ss - 64) <= 0.06 * ss + 6e-7 * tps + 1e-9);
        if (n >= 2) /* after warm-up: steps 2..4 */
            tokens += 64, secs += ss;
        json_decref(j);
    }
    if (f)
        fclose(f);
    CHECK(n == 4);
    CHECK(hw > 0 && sg > 0 && hw >= sg); /* achievable <= hardware */
    CHECK(r.timed_from == 2 && r.timed_steps == 3);
    CHECK(fabs(r.peak - hw * 1e9) <= 1e-3 * r.peak);
    CHECK(fabs(r.peak_sgemm - sg * 1e9) <= 1e-3 * r.peak_sgemm);
    CHECK(secs > 0 && fabs(r.tokens_per_s - tokens / secs) <=
                          r.tokens_per_s * (2e-6 / secs + 1e-9));
    double fpt = ts_train_flops_per_token(N_NO_EMBED, 2, 2, 16, 16);
    CHECK(fabs(r.mfu - r.tokens_per_s * fpt / r.peak) <= 1e-9 * r.mfu);
    CHECK(r.mfu > 0 && r.mfu <= 1);
}

static void test_train_gpt2(ts_ctx *ctx) {
    write_text(WORK "/gpt2.json",
               "{\"model_type\": \"gpt2\", \"n_embd\": 32, \"n_head\": 2,"
               " \"n_layer\": 2, \"n_positions\": 64, \"vocab_size\": 400}");
    ts_train_options o = base_options(NULL);
    o.model_config = WORK "/gpt2.json";
    ts_train_result re, rc;
    train_log le, lc;
    eager_and_compiled(ctx, o, WORK "/g_eager", WORK "/g_compiled", &re, &rc,
                       &le, &lc);
    CHECK(re.first_loss > 5.5 && re.first_loss < 6.5); /* ln 400 = 5.99 */
    CHECK(re.last_loss < re.first_loss - 0.2);
    /* wte 400x32, wpe 64x32, per layer 2 LayerNorms (64 each), c_attn
     * 32x96+96, c_proj 32x32+32, c_fc 32x128+128, mlp.c_proj 128x32+32,
     * ln_f 64 */
    int64_t per_layer = 64 + 3168 + 1056 + 64 + 4224 + 4128;
    CHECK(re.n_params == 12800 + 2048 + 2 * per_layer + 64);
    double fpt = ts_train_flops_per_token(re.n_params - 2048, 2, 2, 16, 16);
    for (int i = 0; i < lc.n; i++)
        CHECK(lc.tps[i] > 0 && fabs(lc.mfu[i] - lc.tps[i] * fpt / 1e6) <=
                                   1e-3 * lc.mfu[i] + 1e-4);
    /* 6 steps against 3 + 3 resumed */
    o = base_options(WORK "/g_6");
    o.model_config = WORK "/gpt2.json";
    o.constant_lr = true, o.steps = 6, o.save_every = 3;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    o.out_dir = WORK "/g_3_3", o.steps = 3;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    o.steps = 6, o.resume = true;
    CHECK_OK(ctx, ts_train_run(ctx, &o, NULL));
    train_log l6, l33;
    read_log(WORK "/g_6", &l6);
    read_log(WORK "/g_3_3", &l33);
    CHECK(l6.n == 6 && l33.n == 6);
    check_losses_equal("gpt2 6 vs 3+3", &l6, &l33, 0, 0);
    check_same_tensors(ctx, WORK "/g_6/step_000006/model.safetensors",
                       WORK "/g_3_3/step_000006/model.safetensors", 0, 1e-30);
    double l4 = checkpoint_loss(ctx, WORK "/g_6/step_000003", &o, 4);
    CHECK(l6.n == 6 && fabs(l4 - l6.loss[3]) <= 1e-5 * l6.loss[3] + 1e-6);
    ts_lm *lm = NULL;
    CHECK_OK(ctx, ts_lm_load(ctx, WORK "/g_6/step_000006", NULL, &lm));
    CHECK(lm && ts_lm_config(lm)->arch == TS_ARCH_GPT2);
    ts_lm_free(lm);
    /* refused, by name */
    /* blocks recomputed in backward: the same losses, eager and compiled */
    o = base_options(NULL);
    o.model_config = WORK "/gpt2.json", o.checkpoint_activations = true;
    ts_train_result ke, kc;
    train_log lke, lkc;
    eager_and_compiled(ctx, o, WORK "/g_ck_eager", WORK "/g_ck_compiled", &ke,
                       &kc, &lke, &lkc);
    check_losses_equal("gpt2 checkpointed vs not", &le, &lkc, 0, 1e-5);
    check_same_tensors(ctx, WORK "/g_eager/step_000008/model.safetensors",
                       WORK "/g_ck_compiled/step_000008/model.safetensors",
                       1e-5, 1e-6);
    /* bf16 matrices: losses within bf16's rounding of f32's, falling; the
     * checkpoint keeps f32 masters */
    o = base_options(WORK "/g_bf16");
    o.model_config = WORK "/gpt2.json", o.bf16 = true, o.eager = true;
    ts_train_result rb;
    CHECK_OK(ctx, ts_train_run(ctx, &o, &rb));
    train_log lb;
    read_log(WORK "/g_bf16", &lb);
    CHECK(lb.n == 8 && fabs(lb.loss[0] - le.loss[0]) < 1e-2 * le.loss[0]);
    CHECK(lb.n == 8 && lb.loss[0] != le.loss[0]); /* bf16 did round */
    CHECK(rb.last_loss < rb.first_loss - 0.2);
    ts_safetensors *st = NULL;
    CHECK_OK(ctx, ts_safetensors_open(
                      ctx, WORK "/g_bf16/step_000008/model.safetensors", &st));
    ts_tensor *te =
        st ? ts_safetensors_get(st, "transformer.wte.weight") : NULL;
    CHECK(te && ts_tensor_dtype(te) == TS_F32);
    ts_release(te);
    ts_safetensors_close(st);
    o = base_options(WORK "/g_bad");
    o.model_config = WORK "/gpt2.json", o.steps = 1, o.seq = 100;
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG,
                       "--seq 100 is longer than the model's 64 positions");
}

static void test_train_errors(ts_ctx *ctx) {
    ts_train_options o = base_options(WORK "/run_bad");
    o.steps = 1;
    o.batch = 0;
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG,
                       "--batch, --seq and --steps must be >= 1");
    o = base_options(WORK "/run_bad");
    o.data_dir = NULL;
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG, "--data DIR is required");
    o = base_options(WORK "/run_bad");
    o.init_from = WORK "/run_cos/step_000006";
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG,
                       "give one of --model-config FILE and --init-from DIR");
    o.model_config = NULL, o.init_from = NULL;
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG, "give one of");
    o = base_options(WORK "/run_bad");
    o.grad_accum = 65;
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG, "--grad-accum");
    o = base_options(WORK "/run_bad");
    o.lr = 0;
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG, "--lr must be > 0");
    o = base_options(WORK "/run_bad");
    o.beta2 = 1;
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG, "betas");
    /* data */
    o = base_options(WORK "/run_bad");
    o.data_dir = WORK "/no_data";
    expect_train_error(ctx, &o, TS_ERR_IO, "no_data");
    mkdir(WORK "/empty_data", 0755);
    o.data_dir = WORK "/empty_data";
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG,
                       "no train_*.bin shards (made by tessera prepare-data)");
    o.data_dir = WORK "/data_noval", o.eval_every = 1;
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG, "no val_*.bin shards");
    o = base_options(WORK "/run_bad");
    write_text(WORK "/long_pos.json",
               "{\"model_type\": \"qwen3\", \"vocab_size\": 400, "
               "\"hidden_size\": 32, \"intermediate_size\": 64,"
               " \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
               " \"num_key_value_heads\": 1, \"head_dim\": 16,"
               " \"max_position_embeddings\": 131072}");
    o.model_config = WORK "/long_pos.json";
    o.seq = 100000; /* more than the data holds */
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG,
                       "fewer than one sequence of 100000 + 1");
    /* model configs */
    o = base_options(WORK "/run_bad");
    write_text(WORK "/bad_field.json",
               "{\"model_type\": \"qwen3\", \"vocab_size\": 400, "
               "\"hidden_size\": \"big\", \"intermediate_size\": 64,"
               " \"num_hidden_layers\": 2, \"num_attention_heads\": 2}");
    o.model_config = WORK "/bad_field.json";
    expect_train_error(ctx, &o, TS_ERR_IO,
                       "field \"hidden_size\" must be an integer");
    write_text(WORK "/bad_kv.json",
               "{\"model_type\": \"qwen3\", \"vocab_size\": 400, "
               "\"hidden_size\": 32, \"intermediate_size\": 64,"
               " \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
               " \"num_key_value_heads\": 3}");
    o.model_config = WORK "/bad_kv.json";
    expect_train_error(ctx, &o, TS_ERR_IO, "num_key_value_heads");
    /* data the model cannot take: ids past its vocabulary, sequences
     * past its positions */
    write_text(WORK "/small_vocab.json",
               "{\"model_type\": \"qwen3\", \"vocab_size\": 300, "
               "\"hidden_size\": 32, \"intermediate_size\": 64,"
               " \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
               " \"num_key_value_heads\": 1, \"head_dim\": 16}");
    o.model_config = WORK "/small_vocab.json";
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG,
                       "the model's vocab_size 300 (" WORK
                       "/small_vocab.json) is smaller than the tokenizer's "
                       "400 ids (" WORK "/data/tokenizer.json: ids 0..399)");
    write_text(WORK "/short_pos.json",
               "{\"model_type\": \"qwen3\", \"vocab_size\": 400, "
               "\"hidden_size\": 32, \"intermediate_size\": 64,"
               " \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
               " \"num_key_value_heads\": 1, \"head_dim\": 16,"
               " \"max_position_embeddings\": 8}");
    o.model_config = WORK "/short_pos.json";
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG,
                       "--seq 16 is longer than the model's 8 positions "
                       "(max_position_embeddings in " WORK "/short_pos.json)");
    o.model_config = WORK "/absent.json";
    expect_train_error(ctx, &o, TS_ERR_IO, "absent.json");
    o.model_config = NULL, o.init_from = WORK "/nowhere_model";
    expect_train_error(ctx, &o, TS_ERR_IO, "nowhere_model");
    /* resume */
    o = base_options(WORK "/run_fresh");
    o.resume = true;
    expect_train_error(ctx, &o, TS_ERR_IO, "has no checkpoint");
    o = base_options(WORK "/run_cos");
    o.resume = true, o.batch = 2, o.steps = 8;
    expect_train_error(ctx, &o, TS_ERR_INVALID_ARG,
                       "was trained with batch 4, seq 16 (now 2, 16)");
    /* an output folder that cannot be made */
    o = base_options(WORK "/qwen3.json/out");
    expect_train_error(ctx, &o, TS_ERR_IO, "qwen3.json/out");
}

/* dist NULL is "this process alone" (tessera_train.h) */
static void test_no_dist(ts_ctx *ctx) {
    ts_train_options o = base_options(WORK "/run_no_dist");
    o.dist = NULL, o.steps = 2, o.eager = true; /* step 2's rate: warmup */
    ts_train_result r;
    CHECK_OK(ctx, ts_train_run(ctx, &o, &r));
    ts_clear_error(ctx);
    train_log a, b;
    read_log(WORK "/run_no_dist", &a);
    read_log(WORK "/run_eager", &b);
    CHECK(a.n == 2);
    check_losses_equal("dist NULL vs a world of 1", &a, &b, 0, 0);
}

int main(void) {
    rm_rf(WORK);
    mkdir(WORK, 0755);
    ts_ctx *ctx = test_ctx();
    CHECK_OK(ctx, ts_dist_init(ctx, &g_dist));
    CHECK(ts_dist_world(g_dist) == 1 && ts_dist_rank(g_dist) == 0);
    test_shards(ctx);
    test_loader(ctx);
    test_bpe_train(ctx);
    test_prepare(ctx);
    test_prepare_chunks(ctx);
    test_flops();
    test_peak(ctx);
    write_text(WORK "/qwen3.json", QWEN3_CONFIG);
    test_loss_falls(ctx);
    test_train_runs(ctx);
    test_resume_truncates_log(ctx);
    test_keep_last(ctx);
    test_mfu_summary(ctx);
    test_train_errors(ctx);
    test_train_consistency(ctx);
    test_train_gpt2(ctx);
    test_no_dist(ctx);
    ts_dist_free(g_dist);
    ts_ctx_free(ctx);
    int rc = test_finish("test_train");
    if (!rc)
        rm_rf(WORK);
    return rc;
}
