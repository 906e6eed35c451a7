/* test_engine.c — the serving engine on a Hugging Face decoder written by
 * tests/reference/hf_qwen3.py: paged attention gives the tokens of the
 * model's own KV-cache generation; 16 concurrent greedy requests return
 * exactly what each returns alone (batching invariance); a request sharing
 * a long prefix reports its cached tokens and returns the cold run's
 * output; a pool too small for everything evicts and preempts and still
 * answers the same; KV events chain their hashes; compiled steps give the
 * eager steps' tokens with few plans; priorities order and preempt;
 * bad requests are errors and change nothing; aborted and finished
 * requests hold no blocks.
 * argv: HF_MODELS_DIR */
#include "tessera_engine.h"
#include "tessera_models.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#define MAX_OUT 64
#define N_REQ   16

typedef struct {
    int32_t prompt[200];
    size_t n;
    int max_tokens;
} req;

typedef struct {
    int32_t tok[MAX_OUT];
    int n;
    int64_t cached;
    ts_finish_reason why;
} result;

/* prompts that share structure: lengths 3..200, a common 96-token head
 * for some of them */
static void make_requests(req *r, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        r[i].n = (size_t)(3 + (i * 37 + (int)seed) % 120);
        if (i % 4 == 3)
            r[i].n = 96 + (size_t)i;
        for (size_t t = 0; t < r[i].n; t++)
            r[i].prompt[t] =
                (i % 4 == 3 && t < 96)
                    ? (int32_t)((t * 7 + 3) % 97)
                    : (int32_t)((t * 31 + (size_t)i * 13 + seed) % 97);
        r[i].max_tokens = 8 + (i * 5) % 24;
    }
}

static ts_request to_request(const req *q) {
    ts_request r = {.prompt = q->prompt,
                    .n_prompt = q->n,
                    .max_tokens = q->max_tokens,
                    .sampling = ts_sampling_default(),
                    .ignore_eos = true};
    return r;
}

/* runs reqs[0..n) submitted at once (or one at a time) to completion */
static void run_all(ts_ctx *ctx, ts_engine *e, const req *reqs, int n,
                    bool one_at_a_time, result *res) {
    int64_t ids[N_REQ];
    memset(res, 0, sizeof(result) * (size_t)n);
    for (int i = 0; i < n; i++) {
        ts_request r = to_request(&reqs[i]);
        CHECK_OK(ctx, ts_engine_add(e, &r, &ids[i]));
        while (one_at_a_time && ts_engine_has_work(e)) {
            ts_engine_output out[64];
            int k = 0;
            CHECK_OK(ctx, ts_engine_step(e, out, 64, &k));
            for (int j = 0; j < k; j++) {
                CHECK(out[j].id == ids[i]);
                res[i].tok[res[i].n++] = out[j].token;
                res[i].cached = out[j].cached_tokens;
                res[i].why = out[j].finish;
            }
            if (ts_ctx_status(ctx) != TS_OK)
                return;
        }
    }
    int guard = 0;
    while (ts_engine_has_work(e) && guard++ < 10000) {
        ts_engine_output out[64];
        int k = 0;
        CHECK_OK(ctx, ts_engine_step(e, out, 64, &k));
        if (ts_ctx_status(ctx) != TS_OK)
            return;
        for (int j = 0; j < k; j++)
            for (int i = 0; i < n; i++)
                if (out[j].id == ids[i] && res[i].n < MAX_OUT) {
                    res[i].tok[res[i].n++] = out[j].token;
                    res[i].cached = out[j].cached_tokens;
                    res[i].why = out[j].finish;
                }
    }
}

static bool same_tokens(const result *a, const result *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i].n != b[i].n ||
            memcmp(a[i].tok, b[i].tok, sizeof(int32_t) * (size_t)a[i].n))
            return false;
    return true;
}

static ts_engine *engine(ts_ctx *ctx, ts_decoder *m, int64_t blocks,
                         int max_seqs, int64_t batch_tokens) {
    ts_engine_options o = ts_engine_options_default();
    o.n_blocks = blocks;
    o.max_seqs = max_seqs;
    o.max_batch_tokens = batch_tokens;
    ts_engine *e = NULL;
    CHECK_OK(ctx, ts_engine_new(ctx, m, &o, &e));
    return e;
}

static void check_no_blocks_held(ts_ctx *ctx, ts_engine *e) {
    (void)ctx;
    ts_engine_stats st;
    ts_engine_get_stats(e, &st);
    CHECK(st.running == 0 && st.waiting == 0 && st.blocks_in_sequences == 0);
    CHECK(st.blocks_used == st.cached_blocks); /* the cache holds the rest */
}

/* the engine's tokens equal the model's own KV-cache greedy generation */
static void test_matches_reference(ts_ctx *ctx, ts_decoder *m) {
    req r[3];
    make_requests(r, 3, 5);
    ts_engine_options o = ts_engine_options_default();
    o.n_blocks = 256, o.max_seqs = 4;
    o.max_batch_tokens = 64; /* chunked prefill too */
    o.kv_dtype = TS_KV_F32;  /* the reference generation's cache is f32 */
    ts_engine *e = NULL;
    CHECK_OK(ctx, ts_engine_new(ctx, m, &o, &e));
    if (!e)
        return;
    result got[3];
    run_all(ctx, e, r, 3, false, got);
    for (int i = 0; i < 3; i++) {
        int64_t prompt[200], outv[200 + MAX_OUT];
        for (size_t t = 0; t < r[i].n; t++)
            prompt[t] = r[i].prompt[t];
        CHECK_OK(ctx, ts_decoder_generate_greedy(m, prompt, (int64_t)r[i].n,
                                                 r[i].max_tokens, outv));
        bool same = got[i].n == r[i].max_tokens;
        for (int k = 0; same && k < got[i].n; k++)
            same = got[i].tok[k] == outv[k]; /* out: the new tokens */
        CHECK(same);
        if (!same)
            fprintf(stderr,
                    "request %d: the engine's tokens differ from "
                    "qwen3_generate_greedy's\n",
                    i);
        CHECK(got[i].why == TS_FINISH_LENGTH);
    }
    check_no_blocks_held(ctx, e);
    ts_engine_free(e);
}

static void test_batching_invariance(ts_ctx *ctx, ts_decoder *m) {
    req r[N_REQ];
    make_requests(r, N_REQ, 11);
    result alone[N_REQ], together[N_REQ];
    ts_engine *e1 = engine(ctx, m, 512, 16, 256);
    ts_engine *e2 = engine(ctx, m, 512, 16, 256);
    if (!e1 || !e2)
        return;
    run_all(ctx, e1, r, N_REQ, true, alone);
    run_all(ctx, e2, r, N_REQ, false, together);
    CHECK(same_tokens(alone, together, N_REQ));
    ts_engine_stats st;
    ts_engine_get_stats(e2, &st);
    /* batched: far fewer passes than tokens */
    CHECK(st.steps < st.generated_tokens / 2);
    check_no_blocks_held(ctx, e1);
    check_no_blocks_held(ctx, e2);
    ts_engine_free(e1), ts_engine_free(e2);
}

static void test_prefix_reuse(ts_ctx *ctx, ts_decoder *m) {
    req a, b;
    make_requests(&a, 1, 3);
    a.n = 150;
    for (size_t t = 0; t < a.n; t++)
        a.prompt[t] = (int32_t)((t * 11 + 5) % 97);
    a.max_tokens = 10;
    b = a;
    b.n = 120; /* shares a's first 112 tokens (7 blocks) */
    for (size_t t = 112; t < b.n; t++)
        b.prompt[t] = (int32_t)((t * 3 + 1) % 97);
    ts_engine *warm = engine(ctx, m, 256, 4, 512);
    ts_engine *cold = engine(ctx, m, 256, 4, 512);
    if (!warm || !cold)
        return;
    result ra, rb, rc;
    run_all(ctx, warm, &a, 1, false, &ra);
    run_all(ctx, warm, &b, 1, false, &rb);
    run_all(ctx, cold, &b, 1, false, &rc);
    CHECK(ra.cached == 0 && rb.cached == 112 && rc.cached == 0);
    CHECK(same_tokens(&rb, &rc, 1));
    /* the same prompt again: all but the last (partial) block */
    result rd;
    run_all(ctx, warm, &b, 1, false, &rd);
    CHECK(rd.cached == 112 && same_tokens(&rd, &rc, 1));
    ts_engine_stats st;
    ts_engine_get_stats(warm, &st);
    CHECK(st.prefix_hit_tokens == 224 && st.prompt_tokens == 150 + 120 + 120);
    /* KV events: a's 9 full blocks then b's new ones, hashes chained */
    ts_kv_event ev[64];
    size_t n = ts_engine_drain_events(warm, ev, 64);
    CHECK(n >= 9 && ev[0].kind == TS_KV_BLOCK_STORED && ev[0].parent_hash == 0);
    uint64_t h = 0;
    for (size_t k = 0; k < 9 && k < n; k++) {
        h = ts_block_hash(h, a.prompt + k * 16, 16);
        CHECK(ev[k].hash == h && ev[k].seq == k + 1 &&
              !memcmp(ev[k].tokens, a.prompt + k * 16, 16 * sizeof(int32_t)));
        if (k)
            CHECK(ev[k].parent_hash == ev[k - 1].hash);
    }
    CHECK(ts_engine_drain_events(warm, ev, 64) == 0); /* drained */
    check_no_blocks_held(ctx, warm);
    ts_engine_free(warm), ts_engine_free(cold);
}

/* a pool of 24 blocks for 16 requests of up to 13 blocks each: the cache
 * is evicted, sequences are preempted and recomputed, answers unchanged */
static void test_small_pool(ts_ctx *ctx, ts_decoder *m) {
    req r[N_REQ];
    make_requests(r, N_REQ, 23);
    result big[N_REQ], small[N_REQ];
    ts_engine *e1 = engine(ctx, m, 1024, 16, 256);
    ts_engine *e2 = engine(ctx, m, 24, 16, 256);
    if (!e1 || !e2)
        return;
    run_all(ctx, e1, r, N_REQ, false, big);
    run_all(ctx, e2, r, N_REQ, false, small);
    CHECK(same_tokens(big, small, N_REQ));
    ts_engine_stats st;
    ts_engine_get_stats(e2, &st);
    CHECK(st.evicted_blocks > 0 && st.preemptions > 0);
    check_no_blocks_held(ctx, e2);
    ts_engine_free(e1), ts_engine_free(e2);
}

/* model steps through the compiled mode (the default: one plan per
 * bucket of batch shapes, captured once and replayed) give the tokens of
 * the eager steps, also with chunked prefill and a small pool */
static void test_compiled_matches_eager(ts_ctx *ctx, ts_decoder *m) {
    req r[N_REQ];
    make_requests(r, N_REQ, 41);
    int64_t chunk[2] = {256, 24}, blocks[2] = {512, 24};
    for (int c = 0; c < 2; c++) {
        result eager[N_REQ], compiled[N_REQ];
        ts_engine_options o = ts_engine_options_default();
        o.n_blocks = blocks[c];
        o.max_seqs = 16;
        o.max_batch_tokens = chunk[c];
        ts_engine *e1 = NULL, *e2 = NULL;
        o.enforce_eager = true;
        CHECK_OK(ctx, ts_engine_new(ctx, m, &o, &e1));
        o.enforce_eager = false;
        CHECK_OK(ctx, ts_engine_new(ctx, m, &o, &e2));
        if (!e1 || !e2)
            return;
        run_all(ctx, e1, r, N_REQ, false, eager);
        run_all(ctx, e2, r, N_REQ, false, compiled);
        CHECK(same_tokens(eager, compiled, N_REQ));
        ts_engine_stats s1, s2;
        ts_engine_get_stats(e1, &s1);
        ts_engine_get_stats(e2, &s2);
        CHECK(s1.compiled_plans == 0 && s1.compiled_replays == 0);
        /* every step compiled; few plans (buckets), mostly replayed */
        CHECK(s2.compiled_plans + s2.compiled_replays == s2.steps);
        CHECK(s2.compiled_plans > 0 && s2.compiled_plans <= 40);
        CHECK(s2.compiled_replays > s2.compiled_plans);
        if (c == 1)
            CHECK(s2.preemptions > 0);
        check_no_blocks_held(ctx, e2);
        ts_engine_free(e1), ts_engine_free(e2);
    }
}

/* the order requests finish in, by id; -1 past the end */
static void finish_order(ts_ctx *ctx, ts_engine *e, int64_t *order, int n,
                         int32_t (*tok)[MAX_OUT], const int64_t *ids) {
    int k = 0, guard = 0;
    while (ts_engine_has_work(e) && guard++ < 10000) {
        ts_engine_output out[64];
        int got = 0;
        CHECK_OK(ctx, ts_engine_step(e, out, 64, &got));
        if (ts_ctx_status(ctx) != TS_OK)
            return;
        for (int j = 0; j < got; j++) {
            for (int i = 0; i < n; i++)
                if (out[j].id == ids[i] && out[j].token >= 0)
                    for (int t = 0; t < MAX_OUT; t++)
                        if (tok[i][t] < 0) {
                            tok[i][t] = out[j].token;
                            break;
                        }
            if (out[j].finish != TS_FINISH_NONE && k < n)
                order[k++] = out[j].id;
        }
    }
    for (; k < n; k++)
        order[k] = -1;
}

/* priority, as vLLM's: lower first; a better one arriving while a worse one
 * holds the only slot preempts it; equals are first come first served; the
 * preempted request's tokens are those it gives alone */
static void test_priority(ts_ctx *ctx, ts_decoder *m) {
    req r[4];
    make_requests(r, 4, 7);
    for (int i = 0; i < 4; i++)
        r[i].max_tokens = 12;
    int prio[4] = {5, 0, 1, 1};
    ts_engine *e = engine(ctx, m, 256, 1, 512);
    ts_engine *alone = engine(ctx, m, 256, 1, 512);
    if (!e || !alone)
        return;
    int64_t ids[4], order[4];
    int32_t tok[4][MAX_OUT];
    memset(tok, 0xff, sizeof tok);
    ts_request q = to_request(&r[0]);
    q.priority = prio[0];
    CHECK_OK(ctx, ts_engine_add(e, &q, &ids[0]));
    for (int s = 0; s < 3; s++) { /* r0 runs, its first tokens out */
        ts_engine_output out[8];
        int k = 0;
        CHECK_OK(ctx, ts_engine_step(e, out, 8, &k));
        for (int j = 0; j < k; j++)
            for (int t = 0; t < MAX_OUT; t++)
                if (tok[0][t] < 0) {
                    tok[0][t] = out[j].token;
                    break;
                }
    }
    for (int i = 1; i < 4; i++) {
        q = to_request(&r[i]);
        q.priority = prio[i];
        CHECK_OK(ctx, ts_engine_add(e, &q, &ids[i]));
    }
    finish_order(ctx, e, order, 4, tok, ids);
    /* r1 (0) first, then r2 and r3 (1, in arrival order), r0 (5) last */
    CHECK(order[0] == ids[1] && order[1] == ids[2] && order[2] == ids[3] &&
          order[3] == ids[0]);
    ts_engine_stats st;
    ts_engine_get_stats(e, &st);
    CHECK(st.preemptions >= 1);
    result ref[4];
    run_all(ctx, alone, r, 4, true, ref);
    for (int i = 0; i < 4; i++)
        CHECK(ref[i].n == 12 &&
              !memcmp(ref[i].tok, tok[i], sizeof(int32_t) * 12));
    check_no_blocks_held(ctx, e);
    ts_engine_free(e), ts_engine_free(alone);
}

/* a model split across devices (KV pools beside their layers) serves the
 * same tokens */
static void test_device_split(ts_ctx *ctx, ts_decoder *m, const char *dir) {
    ts_load_options o = {.device_map = "embed,0:cpu:1;1,head:cpu:2"};
    ts_decoder *split = NULL;
    CHECK_OK(ctx, ts_decoder_load_opts(ctx, dir, &o, &split));
    if (!split)
        return;
    req r[6];
    make_requests(r, 6, 31);
    result one[6], two[6];
    ts_engine *e1 = engine(ctx, m, 256, 8, 128);
    ts_engine *e2 = engine(ctx, split, 256, 8, 128);
    if (e1 && e2) {
        run_all(ctx, e1, r, 6, false, one);
        run_all(ctx, e2, r, 6, false, two);
        CHECK(same_tokens(one, two, 6));
    }
    ts_engine_free(e1), ts_engine_free(e2);
    ts_decoder_free(split);
}

static void test_errors_and_abort(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = engine(ctx, m, 64, 4, 64);
    if (!e)
        return;
    int64_t id;
    int32_t prompt[4] = {1, 2, 3, 4}, bad[2] = {5, 97};
    ts_request r = {.prompt = prompt,
                    .n_prompt = 4,
                    .max_tokens = 8,
                    .sampling = ts_sampling_default()};
    r.n_prompt = 0;
    CHECK(ts_engine_add(e, &r, &id) != TS_OK);
    CHECK_MSG(ctx, "the prompt is empty");
    ts_clear_error(ctx);
    r.prompt = bad, r.n_prompt = 2;
    CHECK(ts_engine_add(e, &r, &id) != TS_OK);
    CHECK_MSG(ctx, "prompt token 97 at 1 is outside the vocabulary");
    ts_clear_error(ctx);
    r.prompt = prompt, r.n_prompt = 4, r.max_tokens = 600;
    CHECK(ts_engine_add(e, &r, &id) != TS_OK);
    CHECK_MSG(ctx, "longer than the model's context");
    ts_clear_error(ctx);
    r.max_tokens = 400; /* fits the context, not a pool of 64 x 16 ... */
    r.max_tokens = 8;
    r.sampling.top_p = 2;
    CHECK(ts_engine_add(e, &r, &id) != TS_OK);
    CHECK_MSG(ctx, "top_p");
    ts_clear_error(ctx);
    r.sampling = ts_sampling_default();
    ts_engine_stats st;
    ts_engine_get_stats(e, &st);
    CHECK(st.waiting == 0 && st.running == 0);
    /* abort mid-generation: its blocks come back */
    CHECK_OK(ctx, ts_engine_add(e, &r, &id));
    ts_engine_output out[8];
    int k;
    CHECK_OK(ctx, ts_engine_step(e, out, 8, &k));
    ts_engine_get_stats(e, &st);
    CHECK(st.running == 1 && st.blocks_in_sequences == 1);
    CHECK_OK(ctx, ts_engine_abort(e, id));
    CHECK(ts_engine_abort(e, id) != TS_OK);
    ts_clear_error(ctx);
    check_no_blocks_held(ctx, e);
    ts_engine_free(e);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s HF_MODELS_DIR\n", argv[0]);
        return 2;
    }
    ts_ctx *ctx = test_ctx();
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/gqa2_untied", argv[1]);
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_load(ctx, dir, &m));
    if (m) {
        ts_set_grad_enabled(ctx, false);
        test_matches_reference(ctx, m);
        test_batching_invariance(ctx, m);
        test_prefix_reuse(ctx, m);
        test_small_pool(ctx, m);
        test_compiled_matches_eager(ctx, m);
        test_priority(ctx, m);
        test_device_split(ctx, m, dir);
        test_errors_and_abort(ctx, m);
    }
    ts_decoder_free(m);
    ts_ctx_free(ctx);
    return test_finish("test_engine");
}
