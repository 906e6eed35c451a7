/* test_router.c — the router's pure parts and the KV transfer:
 * - the router's prompt block hashes are the engine's, block for block (the
 *   engine's BlockStored events on a real model);
 * - the block set against a plain array (put, delete, trim, expire);
 * - scorers (known values) and policies: cache-aware goes where the prefix
 *   is, load to the shortest queue, round-robin cycles, random is seeded,
 *   ineligible servers are never chosen, ties are broken at random;
 * - --weights parsing;
 * - KV-transfer frames: a round trip, and every corruption (a flipped bit,
 *   bad magic, version, kind, length, geometry) detected;
 * - export from one engine, a frame over a socket, import into another:
 *   the second engine reports the prefix cached and answers exactly as the
 *   first; a corrupt frame is refused and adopts nothing; a full pool
 *   adopts less; tokens outside the vocabulary are refused;
 * - the API-key check (Bearer scheme, every near miss refused) and the
 *   --kv-peers allow-list (parsing, bad entries named, exact matches);
 *   the KV receiver's --kv-senders (loopback only by default);
 * - error messages made valid UTF-8 (stray, cut, overlong, surrogate).
 * argv: HF_MODELS_DIR */
#include "tessera_engine.h"
#include "tessera_models.h"
#include "test_util.h"

#include "router/policy.h"
#include "server/auth.h"
#include "server/kv_transfer.h"
#include "server/prompt.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- hashing: router = engine ---- */

static ts_engine *new_engine(ts_ctx *ctx, ts_decoder *m, int64_t blocks) {
    ts_engine_options o = ts_engine_options_default();
    o.n_blocks = blocks;
    ts_engine *e = NULL;
    CHECK_OK(ctx, ts_engine_new(ctx, m, &o, &e));
    return e;
}

/* runs one greedy request to the end; its tokens into out, the cached
 * prompt tokens it reported into *cached */
static int run_one(ts_ctx *ctx, ts_engine *e, const int32_t *p, size_t n,
                   int max_tokens, int32_t *out, int64_t *cached) {
    ts_request r = {.prompt = p,
                    .n_prompt = n,
                    .max_tokens = max_tokens,
                    .sampling = ts_sampling_default(),
                    .ignore_eos = true};
    int64_t id;
    CHECK_OK(ctx, ts_engine_add(e, &r, &id));
    int got = 0;
    for (int guard = 0; ts_engine_has_work(e) && guard < 1000; guard++) {
        ts_engine_output o[16];
        int k = 0;
        CHECK_OK(ctx, ts_engine_step(e, o, 16, &k));
        for (int j = 0; j < k; j++) {
            out[got++] = o[j].token;
            *cached = o[j].cached_tokens;
        }
    }
    return got;
}

static void test_hashes_match_engine(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = new_engine(ctx, m, 64);
    if (!e)
        return;
    int32_t p[150], out[8];
    for (int i = 0; i < 150; i++)
        p[i] = (int32_t)((i * 29 + 5) % 97);
    int64_t cached = 0;
    run_one(ctx, e, p, 150, 4, out, &cached);
    ts_kv_event ev[64];
    size_t ne = ts_engine_drain_events(e, ev, 64);
    size_t nh = 0;
    uint64_t *h = ts_prompt_block_hashes(p, 150, 16, &nh);
    CHECK(nh == 9); /* (150 - 1) / 16 */
    size_t stored = 0;
    for (size_t i = 0; i < ne; i++)
        if (ev[i].kind == TS_KV_BLOCK_STORED) {
            if (stored < nh) {
                CHECK(ev[i].hash == h[stored]);
                CHECK(ev[i].parent_hash == (stored ? h[stored - 1] : 0));
            }
            stored++;
        }
    CHECK(stored >= nh); /* the engine stores every full block it computed */
    /* the lookup the engine makes: the first (n - 1) / bs blocks only */
    free(h);
    h = ts_prompt_block_hashes(p, 33, 16, &nh);
    CHECK(nh == 2);
    free(h);
    h = ts_prompt_block_hashes(p, 32, 16, &nh);
    CHECK(nh == 1);
    free(h);
    ts_engine_free(e);
}

/* ---- the block set ---- */

static void test_block_set(void) {
    ts_block_set s;
    ts_block_set_init(&s);
    enum { N = 3000 };
    static uint64_t keys[N];
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        keys[i] = x;
        CHECK(ts_block_set_put(&s, keys[i], (uint64_t)i + 1));
    }
    CHECK(s.n == N);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += ts_block_set_get(&s, keys[i]) != (uint64_t)i + 1;
    CHECK(bad == 0);
    for (int i = 0; i < N; i += 2) /* every other one out */
        CHECK(ts_block_set_del(&s, keys[i]));
    CHECK(!ts_block_set_del(&s, keys[0]));
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += (ts_block_set_get(&s, keys[i]) != 0) != (i % 2 == 1);
    CHECK(bad == 0);
    CHECK(s.n == N / 2);
    /* trim keeps the newest stamps */
    ts_block_set_trim(&s, 100);
    CHECK(s.n == 100);
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += (ts_block_set_get(&s, keys[i]) != 0) !=
               (i % 2 == 1 && i >= N - 200);
    CHECK(bad == 0);
    ts_block_set_expire(&s, N - 50); /* stamps below N - 50 go */
    CHECK(s.n == 26);                /* even stamps 2950..3000 */
    ts_block_set_clear(&s);
    CHECK(s.n == 0 && !ts_block_set_get(&s, keys[N - 1]));
    CHECK(ts_block_set_put(&s, 0, 7) && ts_block_set_get(&s, 0) == 7);
    ts_block_set_free(&s);
    /* leading hits, from either set (the second only when recent) */
    ts_block_set a, b;
    ts_block_set_init(&a), ts_block_set_init(&b);
    uint64_t hs[5] = {11, 22, 33, 44, 55};
    ts_block_set_put(&a, 11, 1), ts_block_set_put(&a, 22, 1);
    ts_block_set_put(&a, 44, 1);
    CHECK(ts_prefix_hits(&a, NULL, 0, hs, 5) == 2);
    ts_block_set_put(&b, 33, 1000);
    CHECK(ts_prefix_hits(&a, &b, 900, hs, 5) == 4);
    CHECK(ts_prefix_hits(&a, &b, 1001, hs, 5) == 2); /* too old */
    ts_block_set_free(&a), ts_block_set_free(&b);
}

/* ---- scorers and policies ---- */

static void test_scorers(void) {
    CHECK_NEAR(ts_score_prefix(3, 4), 0.75, 1e-12);
    CHECK_NEAR(ts_score_prefix(0, 0), 0, 0);
    CHECK_NEAR(ts_score_prefix(9, 4), 1, 0);
    CHECK_NEAR(ts_score_queue(2, 2, 6), 1, 0);
    CHECK_NEAR(ts_score_queue(6, 2, 6), 0, 0);
    CHECK_NEAR(ts_score_queue(3, 2, 6), 0.75, 1e-12);
    CHECK_NEAR(ts_score_queue(5, 5, 5), 1, 0);
    CHECK_NEAR(ts_score_kv(25, 100), 0.75, 1e-12);
    CHECK_NEAR(ts_score_kv(0, 0), 1, 0);
    CHECK_NEAR(ts_score_kv(200, 100), 0, 0);
}

static void test_policies(void) {
    ts_route_candidate c[4] = {
        {.eligible = true, .hit_blocks = 0, .queue = 0, .kv_total = 100},
        {.eligible = true, .hit_blocks = 8, .queue = 3, .kv_total = 100},
        {.eligible = true, .hit_blocks = 2, .queue = 1, .kv_total = 100},
        {.eligible = false, .hit_blocks = 10, .queue = 0, .kv_total = 100}};
    ts_route_reason why;
    double sc[4];
    ts_route_state st = {
        .policy = TS_POLICY_CACHE_AWARE, .w = {2, 1, 1}, .rng = 7};
    /* 8 of 10 blocks on server 1 beats an idle server with none:
     * 2*0.8 + 0 + 1 = 2.6 against 0 + 1 + 1 = 2 */
    CHECK(ts_route_pick(&st, c, 4, 10, &why, sc) == 1);
    CHECK(why == TS_REASON_PREFIX);
    CHECK_NEAR(sc[1], 2.6, 1e-12);
    CHECK_NEAR(sc[0], 2.0, 1e-12);
    CHECK(sc[3] == -1);
    /* with the prefix weighed lightly, load wins */
    st.w.prefix = 0.5;
    CHECK(ts_route_pick(&st, c, 4, 10, &why, NULL) == 0);
    CHECK(why == TS_REASON_LOAD);
    /* load ignores the prefix */
    st = (ts_route_state){.policy = TS_POLICY_LOAD, .w = {2, 1, 1}, .rng = 7};
    CHECK(ts_route_pick(&st, c, 4, 10, &why, NULL) == 0);
    CHECK(why == TS_REASON_LOAD);
    /* KV pressure counts: server 0 full, server 2 the next best */
    c[0].kv_used = 100;
    c[0].queue = c[1].queue = 1; /* equal queues */
    st.w = (ts_route_weights){0, 1, 1};
    int p = ts_route_pick(&st, c, 4, 10, &why, NULL);
    CHECK(p == 1 || p == 2); /* tied: 1 + 1 each */
    int seen[4] = {0};
    for (int i = 0; i < 200; i++)
        seen[ts_route_pick(&st, c, 4, 10, &why, NULL)]++;
    CHECK(seen[1] > 50 && seen[2] > 50 && seen[0] == 0 && seen[3] == 0);
    c[0].kv_used = 0, c[0].queue = 0, c[1].queue = 3;
    /* round-robin cycles over the eligible ones only */
    st = (ts_route_state){.policy = TS_POLICY_ROUND_ROBIN};
    int order[6];
    for (int i = 0; i < 6; i++)
        order[i] = ts_route_pick(&st, c, 4, 10, &why, NULL);
    CHECK(order[0] == 0 && order[1] == 1 && order[2] == 2 && order[3] == 0 &&
          order[4] == 1 && order[5] == 2);
    CHECK(why == TS_REASON_ROUND_ROBIN);
    /* random: seeded (the same seed, the same sequence), covers all */
    ts_route_state r1 = {.policy = TS_POLICY_RANDOM, .rng = 99}, r2 = r1;
    int same = 1, cover[4] = {0};
    for (int i = 0; i < 300; i++) {
        int a = ts_route_pick(&r1, c, 4, 10, &why, NULL);
        same &= a == ts_route_pick(&r2, c, 4, 10, &why, NULL);
        cover[a]++;
    }
    CHECK(same && cover[0] > 50 && cover[1] > 50 && cover[2] > 50 &&
          cover[3] == 0);
    /* one eligible: it; none: -1 */
    c[0].eligible = c[1].eligible = false;
    CHECK(ts_route_pick(&st, c, 4, 10, &why, NULL) == 2 &&
          why == TS_REASON_ONLY);
    c[2].eligible = false;
    CHECK(ts_route_pick(&st, c, 4, 10, &why, NULL) == -1);
    /* names */
    CHECK(ts_route_policy_parse("cache-aware") == TS_POLICY_CACHE_AWARE);
    CHECK(ts_route_policy_parse("round-robin") == TS_POLICY_ROUND_ROBIN);
    CHECK(ts_route_policy_parse("fastest") == -1);
    CHECK(!strcmp(ts_route_reason_name(TS_REASON_PREFIX), "prefix"));
}

static void test_weights(void) {
    ts_route_weights w = {2, 1, 1};
    const char *bad = NULL;
    CHECK(ts_route_weights_parse("prefix=3,kv=0.5", &w, &bad));
    CHECK(w.prefix == 3 && w.queue == 1 && w.kv == 0.5);
    CHECK(!ts_route_weights_parse("prefix=3,speed=1", &w, &bad));
    CHECK(bad && !strcmp(bad, "speed=1"));
    CHECK(w.prefix == 3); /* unchanged on error */
    CHECK(!ts_route_weights_parse("queue=-1", &w, &bad));
    CHECK(!ts_route_weights_parse("queue=", &w, &bad));
    CHECK(!ts_route_weights_parse("queue=1x", &w, &bad));
}

/* ---- KV-transfer frames ---- */

static ts_kvx_geometry geo(uint32_t nb) {
    return (ts_kvx_geometry){.block_size = 4,
                             .layers = 2,
                             .kv_heads = 1,
                             .head_dim = 2,
                             .n_blocks = nb};
}

static int decode_frame(uint8_t *f, size_t len, ts_kvx_blocks *b, char *err) {
    uint64_t plen, sum;
    if (ts_kvx_check_header(f, TS_KVX_KIND_BLOCKS, 1 << 20, &plen, &sum, err,
                            256))
        return -1;
    if (plen != len - TS_KVX_HEADER) {
        snprintf(err, 256, "length");
        return -1;
    }
    return ts_kvx_decode_blocks(f + TS_KVX_HEADER, plen, sum, b, err, 256);
}

static void test_frames(void) {
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ts_kvx_geometry g = geo(2);
    float kv[2 * 2 * 2 * 1 * 4 * 2]; /* blocks, layers, K/V, heads, bs, D */
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
        kv[i] = (float)i * 0.5f;
    CHECK(ts_kvx_block_bytes(&g) == 2 * 2 * 1 * 4 * 2 * 4);
    /* bf16 rows of 2 x 2 bytes; int8 rows of 2 values, 2 bytes of padding
     * and the f32 scale */
    ts_kvx_geometry g16 = g, g8 = g;
    g16.dtype = TS_KVX_DTYPE_BF16, g8.dtype = TS_KVX_DTYPE_INT8;
    CHECK(ts_kvx_block_bytes(&g16) == 2 * 2 * 1 * 4 * 2 * 2);
    CHECK(ts_kvx_block_bytes(&g8) == 2 * 2 * 1 * 4 * 8);
    ts_kvx_blocks b = {.g = g, .tokens = toks, .kv = kv}, d;
    size_t len;
    uint8_t *f = ts_kvx_encode(&b, &len);
    CHECK(f && len == TS_KVX_HEADER + TS_KVX_META + 8 * 4 + sizeof kv);
    char err[256] = "";
    CHECK(decode_frame(f, len, &d, err) == 0);
    CHECK(!memcmp(&d.g, &g, sizeof g));
    CHECK(!memcmp(d.tokens, toks, sizeof toks) && !memcmp(d.kv, kv, sizeof kv));
    /* a flipped bit anywhere in the payload: the checksum */
    for (size_t at = TS_KVX_HEADER; at < len; at += 7) {
        f[at] ^= 0x10;
        CHECK(decode_frame(f, len, &d, err) == -1);
        CHECK(strstr(err, "checksum") != NULL);
        f[at] ^= 0x10;
    }
    CHECK(decode_frame(f, len, &d, err) == 0);
    f[0] ^= 1; /* magic */
    CHECK(decode_frame(f, len, &d, err) == -1 && strstr(err, "magic"));
    f[0] ^= 1;
    f[4] = 9; /* version */
    CHECK(decode_frame(f, len, &d, err) == -1 && strstr(err, "version 9"));
    f[4] = TS_KVX_VERSION;
    f[6] = TS_KVX_KIND_REPLY; /* kind */
    CHECK(decode_frame(f, len, &d, err) == -1 && strstr(err, "kind"));
    f[6] = TS_KVX_KIND_BLOCKS;
    uint64_t huge = 1ull << 40; /* length over the limit */
    uint8_t saved[8];
    memcpy(saved, f + 8, 8);
    memcpy(f + 8, &huge, 8);
    CHECK(decode_frame(f, len, &d, err) == -1 && strstr(err, "at most"));
    memcpy(f + 8, saved, 8);
    free(f);
    /* a geometry that does not add up (checksum right, sizes wrong) */
    b.g = geo(1);
    f = ts_kvx_encode(&b, &len);
    ts_kvx_geometry lie = geo(2);
    memcpy(f + TS_KVX_HEADER, &lie, sizeof lie);
    uint64_t sum = XXH3_64bits(f + TS_KVX_HEADER, len - TS_KVX_HEADER);
    memcpy(f + 16, &sum, 8);
    CHECK(decode_frame(f, len, &d, err) == -1 && strstr(err, "geometry says"));
    CHECK(decode_frame(f, len - 4, &d, err) == -1); /* truncated */
    free(f);
    /* a dtype past int8 */
    b.g = geo(1);
    b.g.dtype = 3;
    f = ts_kvx_encode(&b, &len);
    CHECK(decode_frame(f, len, &d, err) == -1 && strstr(err, "dtype 3"));
    free(f);
    b.g = geo(2);
    ts_kvx_geometry zero = {0};
    ts_kvx_blocks zb = {.g = zero, .tokens = toks, .kv = kv};
    f = ts_kvx_encode(&zb, &len);
    CHECK(decode_frame(f, len, &d, err) == -1 && strstr(err, "geometry"));
    free(f);
}

/* ---- export, a socket, import ---- */

typedef struct {
    ts_ctx *ctx;
    ts_engine *e;
    ts_decoder *m;
    int fd;
    int rc;
} receiver;

static int adopt(void *arg, const ts_kvx_geometry *g, const ts_kvx_blocks *b,
                 uint32_t *adopted, char *err, size_t cap) {
    receiver *r = arg;
    const ts_model_config *c = ts_decoder_get_config(r->m);
    if (g->block_size != ts_engine_block_size(r->e) || g->layers != c->layers ||
        g->kv_heads != c->kv_heads || g->head_dim != c->head_dim) {
        snprintf(err, cap, "another model");
        return -1;
    }
    if (!b)
        return 0;
    size_t got = 0;
    if (ts_engine_import_prefix(r->e, b->tokens, g->n_blocks, b->kv, &got) !=
        TS_OK) {
        snprintf(err, cap, "%s", ts_errmsg(r->ctx));
        ts_clear_error(r->ctx);
        return -1;
    }
    *adopted = (uint32_t)got;
    return 0;
}

static void *serve_one(void *arg) {
    receiver *r = arg;
    int fd = accept(r->fd, NULL, NULL);
    r->rc = fd >= 0 ? ts_kvx_serve_connection(fd, adopt, r, 1 << 26, 5000) : -2;
    return NULL;
}

/* one frame through a real socket into r's engine: the send's result */
static int transfer(receiver *r, const uint8_t *f, size_t len,
                    uint32_t *adopted, char *err) {
    int port = 0;
    r->fd = ts_kvx_listen("127.0.0.1", 0, &port, err, 256);
    CHECK(r->fd >= 0);
    pthread_t t;
    pthread_create(&t, NULL, serve_one, r);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    int rc = ts_kvx_send(target, f, len, 5000, adopted, err, 256);
    pthread_join(t, NULL);
    close(r->fd);
    return rc;
}

static void test_transfer(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *a = new_engine(ctx, m, 64), *b = new_engine(ctx, m, 64),
              *full = new_engine(ctx, m, 12);
    if (!a || !b || !full)
        goto out;
    int32_t p[140], ref[10], got[10];
    for (int i = 0; i < 140; i++)
        p[i] = (int32_t)((i * 13 + 7) % 97);
    int64_t cached = -1;
    /* the prefill server: computes, exports */
    int n_ref = run_one(ctx, a, p, 140, 10, ref, &cached);
    CHECK(n_ref == 10 && cached == 0);
    size_t per = (size_t)ts_engine_block_bytes(a);
    void *kv = malloc(per * 8);
    size_t nb = ts_engine_export_prefix(a, p, 140, kv, 8);
    CHECK(nb == 8); /* 140 / 16 full blocks */
    const ts_model_config *c = ts_decoder_get_config(m);
    ts_kvx_blocks blk = {.g = {.block_size = 16,
                               .layers = (uint32_t)c->layers,
                               .kv_heads = (uint32_t)c->kv_heads,
                               .head_dim = (uint32_t)c->head_dim,
                               .dtype = TS_KVX_DTYPE_BF16, /* the default */
                               .n_blocks = (uint32_t)nb},
                         .tokens = p,
                         .kv = kv};
    size_t len;
    uint8_t *f = ts_kvx_encode(&blk, &len);
    receiver r = {.ctx = ctx, .e = b, .m = m};
    uint32_t adopted = 0;
    char err[256] = "";
    /* corrupt: refused, nothing adopted */
    f[len - 3] ^= 0x01;
    CHECK(transfer(&r, f, len, &adopted, err) == -1);
    CHECK(strstr(err, "checksum") != NULL);
    ts_engine_stats st;
    ts_engine_get_stats(b, &st);
    CHECK(st.cached_blocks == 0 && r.rc == -1);
    f[len - 3] ^= 0x01;
    /* whole: adopted, events published, the answer unchanged */
    CHECK(transfer(&r, f, len, &adopted, err) == 0);
    CHECK(adopted == 8 && r.rc == 0);
    ts_kv_event ev[32];
    size_t ne = ts_engine_drain_events(b, ev, 32);
    CHECK(ne == 8 && ev[0].kind == TS_KV_BLOCK_STORED);
    int n_got = run_one(ctx, b, p, 140, 10, got, &cached);
    CHECK(n_got == 10 && !memcmp(got, ref, sizeof ref));
    CHECK(cached == 128);
    /* again: already cached, nothing new */
    CHECK(transfer(&r, f, len, &adopted, err) == 0 && adopted == 0);
    /* a small pool with blocks in use adopts what fits */
    int32_t q[100];
    for (int i = 0; i < 100; i++)
        q[i] = (int32_t)((i * 5 + 1) % 97);
    ts_request hold = {.prompt = q,
                       .n_prompt = 100,
                       .max_tokens = 60,
                       .sampling = ts_sampling_default(),
                       .ignore_eos = true};
    int64_t id;
    CHECK_OK(ctx, ts_engine_add(full, &hold, &id));
    ts_engine_output o[4];
    int k;
    CHECK_OK(ctx, ts_engine_step(full, o, 4, &k)); /* 7 blocks in use */
    size_t fa = 99;
    CHECK_OK(ctx, ts_engine_import_prefix(full, p, 8, kv, &fa));
    CHECK(fa == 5); /* 12 - 7 */
    /* tokens outside the vocabulary */
    int32_t badp[16];
    memcpy(badp, p, sizeof badp);
    badp[3] = (int32_t)c->vocab;
    CHECK(ts_engine_import_prefix(b, badp, 1, kv, &fa) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "vocabulary");
    ts_clear_error(ctx);
    /* another model's geometry is refused before the data is read */
    blk.g.head_dim += 1;
    void *wide = calloc(blk.g.n_blocks, ts_kvx_block_bytes(&blk.g));
    blk.kv = wide;
    uint8_t *g2 = ts_kvx_encode(&blk, &len);
    free(wide);
    CHECK(transfer(&r, g2, len, &adopted, err) == -1);
    CHECK(strstr(err, "another model") != NULL);
    free(g2);
    free(f), free(kv);
out:
    ts_engine_free(a), ts_engine_free(b), ts_engine_free(full);
}

/* ---- API keys and KV peers ---- */

static void test_auth(void) {
    CHECK(ts_ct_equal("abc", 3, "abc", 3));
    CHECK(!ts_ct_equal("abd", 3, "abc", 3));
    CHECK(!ts_ct_equal("ab", 2, "abc", 3));
    CHECK(!ts_ct_equal("abcabc", 6, "abc", 3)); /* a repeat of the key */
    CHECK(!ts_ct_equal("", 0, "abc", 3));
    CHECK(ts_ct_equal("", 0, "", 0));
    const char *key = "sk-0123456789";
    CHECK(ts_bearer_ok("Bearer sk-0123456789", key));
    CHECK(ts_bearer_ok("bearer   sk-0123456789 ", key));
    const char *bad[] = {NULL,
                         "",
                         "Bearer",
                         "Bearer ",
                         "Bearer sk-012345678",
                         "Bearer sk-01234567890",
                         "Bearer sk-0123456788",
                         "Basic sk-0123456789",
                         "sk-0123456789",
                         "Bearersk-0123456789",
                         "Bearer sk-0123456789 x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(!ts_bearer_ok(bad[i], key));
    CHECK(!ts_bearer_ok("Bearer x", NULL));

    ts_kv_peers p;
    char err[256];
    CHECK(ts_kv_peers_parse("127.0.0.1:7001,decode-b.local:7002", &p, err,
                            sizeof err) == 0);
    CHECK(p.n == 2 && p.port[0] == 7001 &&
          !strcmp(p.host[1], "decode-b.local"));
    CHECK(ts_kv_peers_allow(&p, "127.0.0.1:7001"));
    CHECK(ts_kv_peers_allow(&p, "DECODE-B.local:7002"));
    const char *no[] = {"127.0.0.1:7002",  "127.0.0.1:70010", "127.0.0.2:7001",
                        "localhost:7001",  "127.0.0.1:7001 ", "127.0.0.1",
                        ":7001",           "127.0.0.1:+7001", "",
                        "127.0.0.1:07001x"};
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        CHECK(!ts_kv_peers_allow(&p, no[i]));
    CHECK(!ts_kv_peers_allow(NULL, "127.0.0.1:7001"));
    const char *badlist[] = {"",        "127.0.0.1", "127.0.0.1:0",
                             "h:65536", "h:7001,",   "h:7001,,h:7002",
                             "h:x",     "a b:1"};
    for (size_t i = 0; i < sizeof badlist / sizeof *badlist; i++) {
        err[0] = 0;
        CHECK(ts_kv_peers_parse(badlist[i], &p, err, sizeof err) == -1);
        CHECK(strstr(err, "--kv-peers") != NULL);
    }
    CHECK(ts_kv_peers_parse("h:1,nonsense", &p, err, sizeof err) == -1 &&
          strstr(err, "\"nonsense\""));

    struct sockaddr_in a = {.sin_family = AF_INET};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6};
    const struct sockaddr *sa = (const struct sockaddr *)&a;
#define FROM(ip) (inet_pton(AF_INET, ip, &a.sin_addr), sa)
    CHECK(ts_kv_senders_allow(NULL, FROM("127.0.0.1")));
    CHECK(ts_kv_senders_allow(NULL, FROM("127.0.0.2")));
    CHECK(!ts_kv_senders_allow(NULL, FROM("10.0.0.5")));
    CHECK(!ts_kv_senders_allow(NULL, FROM("128.0.0.1")));
    CHECK(!ts_kv_senders_allow(NULL, (const struct sockaddr *)&a6));
    ts_kv_senders ks;
    CHECK(ts_kv_senders_parse("10.0.0.5,192.168.1.2", &ks, err, sizeof err) ==
          0);
    CHECK(ts_kv_senders_allow(&ks, FROM("10.0.0.5")));
    CHECK(ts_kv_senders_allow(&ks, FROM("192.168.1.2")));
    CHECK(!ts_kv_senders_allow(&ks, FROM("10.0.0.6")));
    CHECK(!ts_kv_senders_allow(&ks, FROM("127.0.0.1"))); /* as listed only */
    CHECK(ts_kv_senders_parse("any", &ks, err, sizeof err) == 0);
    CHECK(ts_kv_senders_allow(&ks, FROM("10.9.9.9")));
#undef FROM
    const char *badsend[] = {"",
                             "10.0.0",
                             "10.0.0.5,",
                             "decode.local",
                             "::1",
                             "10.0.0.5,,10.0.0.6",
                             "any,10.0.0.1"};
    for (size_t i = 0; i < sizeof badsend / sizeof *badsend; i++) {
        err[0] = 0;
        CHECK(ts_kv_senders_parse(badsend[i], &ks, err, sizeof err) == -1);
        CHECK(strstr(err, "--kv-senders") != NULL);
    }
}

static void test_utf8_sanitize(void) {
    static const char *const cases[][2] = {
        {"abc", "abc"},
        {"caf\xC3\xA9", "caf\xC3\xA9"},
        {"\xF0\x9F\x98\x80!", "\xF0\x9F\x98\x80!"},
        {"cut \xC3", "cut ?"},
        {"cut \xE2\x82", "cut ??"},
        {"a\xFF"
         "b",
         "a?b"},
        {"\x80x", "?x"},
        {"\xC0\xAF", "??"},          /* overlong '/' */
        {"\xED\xA0\x80", "???"},     /* a surrogate */
        {"\xF4\x90\x80\x80", "????"} /* past U+10FFFF */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char b[32];
        snprintf(b, sizeof b, "%s", cases[i][0]);
        ts_utf8_sanitize(b);
        CHECK(!strcmp(b, cases[i][1]));
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s HF_MODELS_DIR\n", argv[0]);
        return 2;
    }
    test_block_set();
    test_scorers();
    test_policies();
    test_weights();
    test_frames();
    test_auth();
    test_utf8_sanitize();
    ts_ctx *ctx = test_ctx();
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/gqa2_untied", argv[1]);
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_load(ctx, dir, &m));
    if (m) {
        ts_set_grad_enabled(ctx, false);
        test_hashes_match_engine(ctx, m);
        test_transfer(ctx, m);
    }
    ts_decoder_free(m);
    ts_ctx_free(ctx);
    return test_finish("test_router");
}
