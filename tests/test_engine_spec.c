/* test_engine_spec.c — speculative decoding in the engine, on Hugging
 * Face decoders written by tests/reference/hf_qwen3.py (gqa2_untied the
 * target; bf16_tied, another model with its 97 tokens, or the target
 * itself as the draft): greedy outputs are the same as without
 * speculation for prompt lookup and for a draft model, alone and 16 at a
 * time, with a pool small enough to preempt, with a token budget and an
 * out array that squeeze the proposals, with penalties and logit_bias,
 * with logprobs, and after a prefix taken from the cache or imported (the
 * draft recomputes what it lacks: the target as its own draft then accepts
 * every proposal); the counters agree; requests that may not speculate do
 * not; the rule of speculative sampling gives the target's distribution
 * (chi-squared, one-hot and general q), and so does the engine sampling
 * with a draft model (two-sample chi-squared); bad options are errors that
 * name them.
 * argv: HF_MODELS_DIR */
#include "tessera_engine.h"
#include "tessera_models.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OUT 64
#define N_REQ   16
#define OUT_CAP 1024

typedef struct {
    int32_t prompt[200];
    size_t n;
    int max_tokens;
} req;

typedef struct {
    int32_t tok[MAX_OUT];
    float lp[MAX_OUT];
    int n;
    int64_t cached, proposed, accepted;
    ts_finish_reason why;
    bool out_of_order; /* an output after the finishing one, or counters
                          that went down */
} result;

typedef struct {
    ts_spec_method spec;
    ts_decoder *draft;
    int k;                /* spec_tokens (0: the default) */
    int64_t blocks;       /* n_blocks */
    int max_seqs;         /* and the out cap is ... */
    int64_t batch_tokens; /* max_batch_tokens */
    int cap;              /* ts_engine_step's cap (0: OUT_CAP) */
    bool no_prefix_cache;
} setup;

/* prompts with repeated spans (a span of 5..16 tokens said three times,
 * then a tail), so that prompt lookup finds what follows */
static void make_requests(req *r, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        size_t span = 5 + (size_t)((i * 7 + (int)seed) % 12), t = 0;
        int32_t s[16];
        for (size_t j = 0; j < span; j++)
            s[j] = (int32_t)((j * 31 + (size_t)i * 17 + seed * 3) % 97);
        for (int rep = 0; rep < 3; rep++)
            for (size_t j = 0; j < span; j++)
                r[i].prompt[t++] = s[j];
        size_t tail = (size_t)((i * 13 + (int)seed) % 40);
        for (size_t j = 0; j < tail; j++)
            r[i].prompt[t++] = (int32_t)((j * 11 + (size_t)i * 5 + seed) % 97);
        r[i].n = t;
        r[i].max_tokens = 12 + (i * 5) % 28;
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

static ts_engine *engine(ts_ctx *ctx, ts_decoder *m, const setup *su) {
    ts_engine_options o = ts_engine_options_default();
    o.n_blocks = su->blocks ? su->blocks : 512;
    o.max_seqs = su->max_seqs ? su->max_seqs : 16;
    o.max_batch_tokens = su->batch_tokens ? su->batch_tokens : 256;
    o.no_prefix_cache = su->no_prefix_cache;
    o.spec = su->spec;
    o.spec_tokens = su->k;
    o.spec_draft = su->draft;
    ts_engine *e = NULL;
    CHECK_OK(ctx, ts_engine_new(ctx, m, &o, &e));
    return e;
}

static void record(result *res, const ts_engine_output *o) {
    if (res->why != TS_FINISH_NONE || res->n >= MAX_OUT ||
        o->spec_proposed < res->proposed || o->spec_accepted < res->accepted)
        res->out_of_order = true;
    if (res->n < MAX_OUT) {
        res->lp[res->n] = o->logprob;
        res->tok[res->n++] = o->token;
    }
    res->cached = o->cached_tokens;
    res->proposed = o->spec_proposed;
    res->accepted = o->spec_accepted;
    res->why = o->finish;
}

/* rs[0..n) (with their sampling) submitted at once, run to completion */
static void run_requests(ts_ctx *ctx, ts_engine *e, const ts_request *rs, int n,
                         int cap, result *res) {
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)n);
    ts_engine_output *out = malloc(sizeof *out * OUT_CAP);
    memset(res, 0, sizeof(result) * (size_t)n);
    for (int i = 0; i < n && ids; i++)
        CHECK_OK(ctx, ts_engine_add(e, &rs[i], &ids[i]));
    int guard = 0;
    while (ids && out && ts_engine_has_work(e) && guard++ < 100000) {
        int k = 0;
        CHECK_OK(ctx, ts_engine_step(e, out, cap ? cap : OUT_CAP, &k));
        if (ts_ctx_status(ctx) != TS_OK)
            break;
        for (int j = 0; j < k; j++) {
            /* an engine numbers its requests 1, 2, ... as they come */
            int64_t i = out[j].id - ids[0];
            CHECK(i >= 0 && i < n && ids[i] == out[j].id);
            if (i >= 0 && i < n)
                record(&res[i], &out[j]);
            free(out[j].prompt_lp), free(out[j].embedding); /* ours */
        }
    }
    free(ids), free(out);
}

static void run_all(ts_ctx *ctx, ts_engine *e, const req *reqs, int n, int cap,
                    result *res) {
    ts_request rs[N_REQ];
    for (int i = 0; i < n; i++)
        rs[i] = to_request(&reqs[i]);
    run_requests(ctx, e, rs, n, cap, res);
}

static bool same_tokens(const result *a, const result *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i].n != b[i].n || a[i].why != b[i].why ||
            memcmp(a[i].tok, b[i].tok, sizeof(int32_t) * (size_t)a[i].n)) {
            fprintf(stderr, "request %d: %d tokens against %d\n", i, a[i].n,
                    b[i].n);
            return false;
        }
    return true;
}

static void check_no_blocks_held(ts_engine *e) {
    ts_engine_stats st;
    ts_engine_get_stats(e, &st);
    CHECK(st.running == 0 && st.waiting == 0 && st.blocks_in_sequences == 0);
    CHECK(st.blocks_used == st.cached_blocks);
}

/* the engine's counters against the requests' own, and their invariants */
static void check_counters(ts_engine *e, const result *res, int n) {
    ts_engine_stats st;
    ts_engine_get_stats(e, &st);
    int64_t prop = 0, acc = 0, gen = 0;
    for (int i = 0; i < n; i++) {
        CHECK(!res[i].out_of_order);
        CHECK(res[i].accepted <= res[i].proposed);
        prop += res[i].proposed, acc += res[i].accepted, gen += res[i].n;
    }
    CHECK(st.spec_proposed == prop && st.spec_accepted == acc);
    CHECK(st.spec_accepted <= st.spec_proposed);
    CHECK(st.generated_tokens == gen);
    /* each verification emits 1 + its accepted tokens at most */
    CHECK(st.spec_verifications <= st.spec_proposed);
    CHECK(gen >= st.spec_accepted);
}

/* runs reqs under setup su, against the plain engine's answer; the
 * engine's stats in *st */
static void spec_vs_plain(ts_ctx *ctx, ts_decoder *m, const req *r, int n,
                          const setup *su, const result *plain,
                          ts_engine_stats *st, const char *what) {
    ts_engine *e = engine(ctx, m, su);
    if (!e)
        return;
    result got[N_REQ];
    run_all(ctx, e, r, n, su->cap, got);
    bool same = same_tokens(plain, got, n);
    CHECK(same);
    if (!same)
        fprintf(stderr,
                "%s: tokens differ from decoding without "
                "speculation\n",
                what);
    check_counters(e, got, n);
    check_no_blocks_held(e);
    ts_engine_get_stats(e, st);
    printf("  %-40s %2d req: proposed %5lld accepted %5lld (%.0f%%) in %4lld "
           "verifications, %4lld steps for %4lld tokens\n",
           what, n, (long long)st->spec_proposed, (long long)st->spec_accepted,
           st->spec_proposed
               ? 100.0 * (double)st->spec_accepted / (double)st->spec_proposed
               : 0.0,
           (long long)st->spec_verifications, (long long)st->steps,
           (long long)st->generated_tokens);
    ts_engine_free(e);
}

static void plain_run(ts_ctx *ctx, ts_decoder *m, const req *r, int n,
                      result *plain, int64_t *steps) {
    setup su = {0};
    ts_engine *e = engine(ctx, m, &su);
    if (!e)
        return;
    run_all(ctx, e, r, n, 0, plain);
    ts_engine_stats st;
    ts_engine_get_stats(e, &st);
    CHECK(st.spec_proposed == 0 && st.spec_verifications == 0);
    *steps = st.steps;
    printf("  %-40s %2d req: %4lld steps for %4lld tokens\n",
           "without speculation", n, (long long)st.steps,
           (long long)st.generated_tokens);
    ts_engine_free(e);
}

/* greedy: the same tokens with either proposer, alone and 16 at a time;
 * the target as its own draft accepts every proposal */
static void test_greedy_same(ts_ctx *ctx, ts_decoder *m, ts_decoder *other) {
    req r[N_REQ];
    make_requests(r, N_REQ, 3);
    for (int n = 1; n <= N_REQ; n += N_REQ - 1) {
        result plain[N_REQ];
        int64_t plain_steps = 0;
        plain_run(ctx, m, r, n, plain, &plain_steps);
        ts_engine_stats st;
        setup ng = {.spec = TS_SPEC_NGRAM};
        spec_vs_plain(ctx, m, r, n, &ng, plain, &st, "prompt lookup, K 4");
        CHECK(st.spec_proposed > 0 && st.spec_accepted > 0);
        CHECK(st.steps < plain_steps);
        setup ng16 = {.spec = TS_SPEC_NGRAM, .k = 16};
        spec_vs_plain(ctx, m, r, n, &ng16, plain, &st, "prompt lookup, K 16");
        CHECK(st.spec_accepted > 0);
        setup ng1 = {.spec = TS_SPEC_NGRAM, .k = 1};
        spec_vs_plain(ctx, m, r, n, &ng1, plain, &st, "prompt lookup, K 1");
        CHECK(st.spec_accepted > 0);
        setup dr = {.spec = TS_SPEC_DRAFT, .draft = other};
        spec_vs_plain(ctx, m, r, n, &dr, plain, &st, "draft bf16_tied, K 4");
        CHECK(st.spec_proposed > 0);
        setup self = {.spec = TS_SPEC_DRAFT, .draft = m};
        spec_vs_plain(ctx, m, r, n, &self, plain, &st, "draft = target, K 4");
        CHECK(st.spec_proposed > 0 && st.spec_accepted == st.spec_proposed);
        CHECK(st.steps < plain_steps);
        setup self16 = {.spec = TS_SPEC_DRAFT, .draft = m, .k = 16};
        spec_vs_plain(ctx, m, r, n, &self16, plain, &st,
                      "draft = target, K 16");
        CHECK(st.spec_proposed > 0 && st.spec_accepted == st.spec_proposed);
        setup self1 = {.spec = TS_SPEC_DRAFT, .draft = m, .k = 1};
        spec_vs_plain(ctx, m, r, n, &self1, plain, &st, "draft = target, K 1");
        CHECK(st.spec_proposed > 0 && st.spec_accepted == st.spec_proposed);
    }
}

/* a pool of 24 blocks for 16 requests: the cache is evicted, sequences
 * are preempted and recomputed (the draft's K/V too), answers unchanged;
 * a budget of 24 tokens a step and an out array with room for one output
 * per sequence squeeze the proposals, answers unchanged */
static void test_squeezed(ts_ctx *ctx, ts_decoder *m, ts_decoder *other) {
    req r[N_REQ];
    make_requests(r, N_REQ, 9);
    result plain[N_REQ];
    int64_t plain_steps = 0;
    plain_run(ctx, m, r, N_REQ, plain, &plain_steps);
    ts_engine_stats st;
    ts_spec_method how[3] = {TS_SPEC_NGRAM, TS_SPEC_DRAFT, TS_SPEC_DRAFT};
    ts_decoder *drafts[3] = {NULL, m, other};
    const char *names[3] = {"prompt lookup", "draft = target",
                            "draft bf16_tied"};
    for (int v = 0; v < 3; v++) {
        char what[80];
        setup pool = {.spec = how[v], .draft = drafts[v], .blocks = 24};
        snprintf(what, sizeof what, "%s, 24 blocks", names[v]);
        spec_vs_plain(ctx, m, r, N_REQ, &pool, plain, &st, what);
        CHECK(st.preemptions > 0 && st.evicted_blocks > 0);
        CHECK(st.spec_proposed > 0);
        if (drafts[v] == m)
            CHECK(st.spec_accepted == st.spec_proposed);
        setup budget = {
            .spec = how[v], .draft = drafts[v], .k = 8, .batch_tokens = 24};
        snprintf(what, sizeof what, "%s, 24 tokens a step", names[v]);
        spec_vs_plain(ctx, m, r, N_REQ, &budget, plain, &st, what);
        CHECK(st.batch_tokens <= 24 * st.steps && st.spec_proposed > 0);
        if (drafts[v] == m)
            CHECK(st.spec_accepted == st.spec_proposed);
        setup room = {.spec = how[v], .draft = drafts[v], .cap = 20};
        snprintf(what, sizeof what, "%s, out cap 20", names[v]);
        spec_vs_plain(ctx, m, r, N_REQ, &room, plain, &st, what);
        CHECK(st.spec_proposed > 0);
        setup cold = {.spec = how[v],
                      .draft = drafts[v],
                      .blocks = 40,
                      .no_prefix_cache = true,
                      .batch_tokens = 64};
        snprintf(what, sizeof what, "%s, 40 blocks, no cache", names[v]);
        spec_vs_plain(ctx, m, r, N_REQ, &cold, plain, &st, what);
        CHECK(st.spec_proposed > 0);
    }
}

/* penalties, logit_bias and logprobs under speculation: the verification
 * applies them given the tokens before each position */
static void test_processors_and_logprobs(ts_ctx *ctx, ts_decoder *m) {
    req r[4];
    make_requests(r, 4, 21);
    ts_logit_bias bias[2] = {{.token = 5, .bias = 3},
                             {.token = 9, .bias = -100}};
    ts_request rs[4];
    for (int i = 0; i < 4; i++) {
        rs[i] = to_request(&r[i]);
        rs[i].logprobs = 1 + 3;
        if (i % 2)
            rs[i].sampling.repetition_penalty = 1.3;
        if (i >= 2)
            rs[i].sampling.presence_penalty = 0.5,
            rs[i].sampling.frequency_penalty = 0.3;
        if (i == 3)
            rs[i].logit_bias = bias, rs[i].n_logit_bias = 2;
    }
    setup plain = {0}, ng = {.spec = TS_SPEC_NGRAM},
          self = {.spec = TS_SPEC_DRAFT, .draft = m};
    ts_engine *e0 = engine(ctx, m, &plain), *e1 = engine(ctx, m, &ng),
              *e2 = engine(ctx, m, &self);
    if (e0 && e1 && e2) {
        result a[4], b[4], c[4];
        run_requests(ctx, e0, rs, 4, 0, a);
        run_requests(ctx, e1, rs, 4, 0, b);
        run_requests(ctx, e2, rs, 4, 0, c);
        CHECK(same_tokens(a, b, 4) && same_tokens(a, c, 4));
        for (int i = 0; i < 4; i++)
            for (int t = 0; t < a[i].n && t < b[i].n && t < c[i].n; t++) {
                /* a verify row's product need not be bitwise the
                 * decode row's (f32 weights' products depend on the
                 * step's rows; bf16 KV rounds the keys): 1e-3 */
                CHECK_NEAR(b[i].lp[t], a[i].lp[t], 1e-3);
                CHECK_NEAR(c[i].lp[t], a[i].lp[t], 1e-3);
                CHECK(a[i].tok[t] != 9);
            }
        ts_engine_stats st;
        ts_engine_get_stats(e2, &st);
        CHECK(st.spec_proposed > 0 && st.spec_accepted == st.spec_proposed);
        check_counters(e1, b, 4);
        check_counters(e2, c, 4);
    }
    ts_engine_free(e0), ts_engine_free(e1), ts_engine_free(e2);
}

/* a prefix from the cache, then one imported from another engine: the
 * target's blocks are there, the draft's are not (the draft recomputes
 * them: the target as its own draft still accepts everything) */
static void test_prefix_blocks(ts_ctx *ctx, ts_decoder *m) {
    req a;
    make_requests(&a, 1, 4);
    a.n = 150;
    for (size_t t = 0; t < a.n; t++)
        a.prompt[t] = (int32_t)((t * 11 + 5) % 97);
    a.max_tokens = 24;
    req b = a; /* shares a's first 128 tokens (8 blocks) */
    b.n = 140;
    for (size_t t = 128; t < b.n; t++)
        b.prompt[t] = (int32_t)((t * 3 + 1) % 97);
    result pa, pb;
    setup plain = {0}, self = {.spec = TS_SPEC_DRAFT, .draft = m};
    ts_engine *cold = engine(ctx, m, &plain);
    if (!cold)
        return;
    run_all(ctx, cold, &a, 1, 0, &pa);
    run_all(ctx, cold, &b, 1, 0, &pb);
    /* cold's cache holds a's blocks: export them */
    size_t per = (size_t)ts_engine_block_bytes(cold);
    void *buf = malloc(per * 9);
    size_t got = buf ? ts_engine_export_prefix(cold, a.prompt, a.n, buf, 9) : 0;
    CHECK(got == 9);
    /* the same engine: b after a reuses a's blocks and their draft K/V */
    ts_engine *warm = engine(ctx, m, &self);
    if (warm) {
        result ra, rb;
        run_all(ctx, warm, &a, 1, 0, &ra);
        run_all(ctx, warm, &b, 1, 0, &rb);
        CHECK(same_tokens(&pa, &ra, 1) && same_tokens(&pb, &rb, 1));
        CHECK(rb.cached == 128);
        ts_engine_stats st;
        ts_engine_get_stats(warm, &st);
        CHECK(st.spec_proposed > 0 && st.spec_accepted == st.spec_proposed);
        check_no_blocks_held(warm);
    }
    ts_engine_free(warm);
    /* imported: no draft K/V for those blocks */
    ts_engine *imp = engine(ctx, m, &self);
    if (imp && got == 9) {
        size_t adopted = 0;
        CHECK_OK(ctx, ts_engine_import_prefix(imp, a.prompt, 9, buf, &adopted));
        CHECK(adopted == 9);
        result rb;
        run_all(ctx, imp, &b, 1, 0, &rb);
        CHECK(same_tokens(&pb, &rb, 1));
        CHECK(rb.cached == 128);
        ts_engine_stats st;
        ts_engine_get_stats(imp, &st);
        CHECK(st.spec_proposed > 0 && st.spec_accepted == st.spec_proposed);
        check_no_blocks_held(imp);
    }
    ts_engine_free(imp);
    free(buf);
    ts_engine_free(cold);
}

/* a stop token (and an end-of-sequence id) among accepted proposals: the
 * output ends there, the tokens after it dropped, as without speculation;
 * an abort in the middle of a speculating stream frees its blocks; seeded
 * sampling with speculation repeats itself */
static void test_stops_abort_seeds(ts_ctx *ctx, ts_decoder *m) {
    req r[2];
    make_requests(r, 2, 13);
    r[0].max_tokens = r[1].max_tokens = 30;
    setup plain = {0}, self = {.spec = TS_SPEC_DRAFT, .draft = m, .k = 8};
    ts_engine *e0 = engine(ctx, m, &plain), *e1 = engine(ctx, m, &self);
    if (!e0 || !e1) {
        ts_engine_free(e0), ts_engine_free(e1);
        return;
    }
    result free_run[2];
    run_all(ctx, e0, r, 2, 0, free_run);
    /* each request's stop: its 7th token (the first time it comes) */
    ts_request rs[2];
    int at[2];
    for (int i = 0; i < 2; i++) {
        rs[i] = to_request(&r[i]);
        int32_t t = free_run[i].tok[6];
        at[i] = 0;
        while (free_run[i].tok[at[i]] != t)
            at[i]++;
        if (i == 0)
            rs[i].stop_ids[0] = t, rs[i].n_stop_ids = 1;
        else { /* an end-of-sequence id instead */
            rs[i].ignore_eos = false;
            ts_engine_set_eos(e0, &t, 1);
            ts_engine_set_eos(e1, &t, 1);
        }
    }
    /* e0 and e1 both know request 1's eos; request 0 ignores eos */
    result a[2], b[2];
    run_requests(ctx, e0, rs, 2, 0, a);
    run_requests(ctx, e1, rs, 2, 0, b);
    CHECK(same_tokens(a, b, 2));
    for (int i = 0; i < 2; i++)
        CHECK(b[i].n == at[i] + 1 && b[i].why == TS_FINISH_STOP);
    ts_engine_stats st;
    ts_engine_get_stats(e1, &st);
    CHECK(st.spec_accepted > 0);
    check_counters(e1, b, 2);
    check_no_blocks_held(e1);
    /* abort while speculating */
    int64_t id;
    ts_request q = to_request(&r[0]);
    CHECK_OK(ctx, ts_engine_add(e1, &q, &id));
    ts_engine_output out[64];
    int k = 0;
    for (int step = 0; step < 3; step++)
        CHECK_OK(ctx, ts_engine_step(e1, out, 64, &k));
    ts_engine_get_stats(e1, &st);
    CHECK(st.running == 1 && st.blocks_in_sequences > 0);
    CHECK_OK(ctx, ts_engine_abort(e1, id));
    check_no_blocks_held(e1);
    ts_engine_free(e0), ts_engine_free(e1);
    /* sampled with a draft, twice: the same tokens (seeded) */
    ts_request sr[N_REQ];
    req rr[N_REQ];
    make_requests(rr, N_REQ, 29);
    for (int i = 0; i < N_REQ; i++) {
        sr[i] = to_request(&rr[i]);
        sr[i].sampling.temperature = 0.9;
        sr[i].sampling.top_p = 0.95;
        sr[i].sampling.seed = (uint64_t)i + 1;
    }
    result x[N_REQ], y[N_REQ];
    setup su = {.spec = TS_SPEC_DRAFT, .draft = m};
    for (int pass = 0; pass < 2; pass++) {
        ts_engine *e = engine(ctx, m, &su);
        if (!e)
            return;
        run_requests(ctx, e, sr, N_REQ, 0, pass ? y : x);
        check_counters(e, pass ? y : x, N_REQ);
        ts_engine_get_stats(e, &st);
        CHECK(st.spec_accepted > 0);
        ts_engine_free(e);
    }
    CHECK(same_tokens(x, y, N_REQ));
}

/* a constraint that allows even tokens only */
static void even_mask(void *st, uint32_t *bits) {
    (void)st;
    for (int w = 0; w < 4; w++)
        bits[w] = 0x55555555u;
}
static bool even_accept(void *st, int32_t t) {
    (void)st;
    return t % 2 == 0;
}
static bool never(const void *st) {
    (void)st;
    return false;
}

/* constrained and prompt_logprobs requests decode without speculation;
 * a logprobs one and a plain one beside them speculate */
static void test_excluded(ts_ctx *ctx, ts_decoder *m) {
    req r[4];
    make_requests(r, 4, 17);
    ts_request rs[4];
    for (int i = 0; i < 4; i++)
        rs[i] = to_request(&r[i]);
    rs[0].constraint = (ts_constraint){.mask = even_mask,
                                       .accept = even_accept,
                                       .can_end = never,
                                       .done = never};
    rs[1].prompt_logprobs = true;
    rs[2].logprobs = 1;
    setup plain = {0}, ng = {.spec = TS_SPEC_NGRAM};
    ts_engine *e0 = engine(ctx, m, &plain), *e1 = engine(ctx, m, &ng);
    if (e0 && e1) {
        result a[4], b[4];
        run_requests(ctx, e0, rs, 4, 0, a);
        run_requests(ctx, e1, rs, 4, 0, b);
        CHECK(same_tokens(a, b, 4));
        CHECK(b[0].proposed == 0 && b[1].proposed == 0);
        CHECK(b[2].proposed > 0 && b[3].proposed > 0);
        for (int t = 0; t < b[0].n; t++)
            CHECK(b[0].tok[t] % 2 == 0);
        check_counters(e1, b, 4);
    }
    ts_engine_free(e0), ts_engine_free(e1);
}

/* chi-squared's 0.999 quantile for df degrees of freedom (Wilson and
 * Hilferty; within 0.5% for df >= 5) */
static double chi2_q999(int df) {
    double k = 2.0 / (9.0 * df), z = 3.090232;
    double c = 1 - k + z * sqrt(k);
    return df * c * c * c;
}

#define SV    12
#define DRAWS 200000

/* the rule, or one of two wrong ones: every proposal accepted; a
 * rejection drawing from p instead of the residual */
typedef enum { RULE_EXACT, RULE_ALWAYS, RULE_FROM_P } rule_kind;

/* the rule's first emitted token over DRAWS draws (x from q, or x fixed
 * for a one-hot q); chi-squared against p */
static double rule_chi2(ts_ctx *ctx, const float *p, const float *q,
                        int32_t fixed, rule_kind kind, uint64_t seed,
                        double *accept_rate) {
    ts_sampling smp = ts_sampling_default();
    smp.temperature = 1, smp.seed = seed;
    ts_sampler *sm = NULL;
    CHECK_OK(ctx, ts_sampler_new(ctx, &smp, &sm));
    if (!sm)
        return INFINITY;
    double count[SV] = {0}, acc = 0;
    for (int i = 0; i < DRAWS; i++) {
        int32_t x = q ? ts_sampler_draw(sm, q, SV) : fixed;
        bool ok = false;
        int32_t t = kind == RULE_ALWAYS
                        ? x
                        : ts_sampler_speculate(sm, p, q, SV, x, &ok);
        if (kind == RULE_FROM_P && !ok) /* p, not the residual */
            t = ts_sampler_draw(sm, p, SV);
        CHECK(t >= 0 && t < SV);
        if (t >= 0 && t < SV)
            count[t]++;
        acc += ok;
    }
    ts_sampler_free(sm);
    double chi2 = 0;
    for (int v = 0; v < SV; v++) {
        double want = DRAWS * (double)p[v];
        if (want > 0)
            chi2 += (count[v] - want) * (count[v] - want) / want;
        else if (count[v] > 0) /* a token p excludes */
            chi2 = INFINITY;
    }
    *accept_rate = acc / DRAWS;
    return chi2;
}

/* accept/resample's first token is distributed as p: q one-hot (prompt
 * lookup) and a general q; wrong rules (every proposal accepted, or the
 * rejected ones drawn from p) are caught by the same test */
static void test_rule_distribution(ts_ctx *ctx) {
    float p[SV], q[SV];
    double sp = 0, sq = 0;
    for (int v = 0; v < SV; v++) {
        p[v] = (float)(1 + (v * 7) % 5) * (v == 4 ? 0 : 1); /* one zero */
        q[v] = (float)(1 + (v * 5) % 7);
        sp += p[v], sq += q[v];
    }
    for (int v = 0; v < SV; v++)
        p[v] = (float)(p[v] / sp), q[v] = (float)(q[v] / sq);
    double lim = chi2_q999(SV - 2); /* one bin is empty by design */
    double rate = 0;
    double c1 = rule_chi2(ctx, p, NULL, 3, RULE_EXACT, 11, &rate);
    printf("  rule, one-hot q: chi2 %.1f (0.999 quantile %.1f), accepted "
           "%.3f (p(x) %.3f)\n",
           c1, lim, rate, (double)p[3]);
    CHECK(c1 < lim);
    CHECK_NEAR(rate, p[3], 0.005);
    double c2 = rule_chi2(ctx, p, q, 0, RULE_EXACT, 12, &rate);
    double want_rate = 0; /* sum min(p, q) */
    for (int v = 0; v < SV; v++)
        want_rate += p[v] < q[v] ? p[v] : q[v];
    printf("  rule, general q: chi2 %.1f, accepted %.3f (sum min(p, q) "
           "%.3f)\n",
           c2, rate, want_rate);
    CHECK(c2 < lim);
    CHECK_NEAR(rate, want_rate, 0.005);
    /* one-hot q at a token p excludes: always rejected, p drawn */
    double c3 = rule_chi2(ctx, p, NULL, 4, RULE_EXACT, 13, &rate);
    CHECK(c3 < lim && rate == 0);
    /* the test has teeth: q itself is far from p */
    double c4 = rule_chi2(ctx, p, q, 0, RULE_ALWAYS, 14, &rate);
    double c5 = rule_chi2(ctx, p, q, 0, RULE_FROM_P, 15, &rate);
    printf("  wrong rules: every proposal accepted chi2 %.0f, rejected ones "
           "drawn from p chi2 %.0f\n",
           c4, c5);
    CHECK(c4 > 10 * lim && c5 > 10 * lim);
    /* ts_sampler_probs is the distribution ts_sampler_next draws from */
    float logits[SV], pp[SV];
    for (int v = 0; v < SV; v++)
        logits[v] = (float)((v * 37) % 11) * 0.4f - 2;
    int32_t seen[3] = {1, 7, 7};
    ts_sampling smp = ts_sampling_default();
    smp.temperature = 0.8, smp.top_k = 7, smp.top_p = 0.9, smp.min_p = 0.05;
    smp.repetition_penalty = 1.2, smp.presence_penalty = 0.4;
    smp.frequency_penalty = 0.2, smp.seed = 5;
    ts_sampler *sm = NULL;
    CHECK_OK(ctx, ts_sampler_new(ctx, &smp, &sm));
    if (!sm)
        return;
    ts_sampler_set_prompt_len(sm, 1);
    CHECK_OK(ctx, ts_sampler_probs(sm, logits, SV, seen, 3, pp));
    double count[SV] = {0}, sum = 0, chi2 = 0;
    int kept = 0;
    for (int v = 0; v < SV; v++)
        sum += pp[v], kept += pp[v] > 0;
    CHECK_NEAR(sum, 1, 1e-5);
    CHECK(kept > 1 && kept <= 7);
    for (int i = 0; i < DRAWS; i++) {
        int32_t t = ts_sampler_next(sm, logits, SV, seen, 3);
        if (t >= 0 && t < SV)
            count[t]++;
    }
    for (int v = 0; v < SV; v++) {
        if (pp[v] > 0)
            chi2 += (count[v] - DRAWS * pp[v]) * (count[v] - DRAWS * pp[v]) /
                    (DRAWS * pp[v]);
        else
            CHECK(count[v] == 0);
    }
    printf("  ts_sampler_probs against ts_sampler_next's draws: chi2 %.1f "
           "over %d tokens\n",
           chi2, kept);
    CHECK(chi2 < chi2_q999(kept - 1));
    /* greedy: one-hot at the argmax */
    ts_sampler_free(sm);
    smp.temperature = 0;
    CHECK_OK(ctx, ts_sampler_new(ctx, &smp, &sm));
    if (sm) {
        ts_sampler_set_prompt_len(sm, 1);
        int32_t best = ts_sampler_next(sm, logits, SV, seen, 3);
        CHECK_OK(ctx, ts_sampler_probs(sm, logits, SV, seen, 3, pp));
        for (int v = 0; v < SV; v++)
            CHECK(pp[v] == (v == best ? 1.0f : 0.0f));
    }
    ts_sampler_free(sm);
}

/* two-sample chi-squared of histograms a and b (as many draws each) over
 * n bins, bins with fewer than 10 draws between both pooled; *bins the
 * bins it compared */
static double chi2_two(const double *a, const double *b, int n, int *bins) {
    double chi2 = 0, pa = 0, pb = 0;
    *bins = 0;
    for (int v = 0; v < n; v++) {
        if (a[v] + b[v] < 10) {
            pa += a[v], pb += b[v];
            continue;
        }
        chi2 += (a[v] - b[v]) * (a[v] - b[v]) / (a[v] + b[v]);
        (*bins)++;
    }
    if (pa + pb > 0) {
        chi2 += (pa - pb) * (pa - pb) / (pa + pb);
        (*bins)++;
    }
    return chi2;
}

/* the engine at temperature 1: the second generated token's histogram
 * over many seeded requests with speculation (a draft model that differs
 * from the target, so proposals are rejected too; the target itself, so
 * they are accepted; prompt lookup) against the plain engine's, two-sample
 * chi-squared */
#define N_SEEDED 4000
static void test_engine_distribution(ts_ctx *ctx, ts_decoder *m,
                                     ts_decoder *other) {
    int32_t prompt[12] = {5, 17, 33, 2, 90, 41, 5, 17, 33, 2, 61, 8};
    ts_request *rs = malloc(sizeof *rs * N_SEEDED);
    result *res = malloc(sizeof *res * N_SEEDED);
    double hist[4][97] = {{0}};
    ts_spec_method how[4] = {TS_SPEC_NONE, TS_SPEC_DRAFT, TS_SPEC_DRAFT,
                             TS_SPEC_NGRAM};
    ts_decoder *drafts[4] = {NULL, other, m, NULL};
    const char *names[4] = {"", "draft bf16_tied", "draft = target",
                            "prompt lookup"};
    for (int pass = 0; pass < 4 && rs && res; pass++) {
        for (int i = 0; i < N_SEEDED; i++) {
            rs[i] = (ts_request){.prompt = prompt,
                                 .n_prompt = 12,
                                 .max_tokens = 6,
                                 .sampling = ts_sampling_default(),
                                 .ignore_eos = true};
            rs[i].sampling.temperature = 1;
            rs[i].sampling.seed = 1000 + (uint64_t)i * 7919 + (uint64_t)pass;
        }
        setup su = {.spec = how[pass],
                    .draft = drafts[pass],
                    .max_seqs = 64,
                    .batch_tokens = 1024};
        ts_engine *e = engine(ctx, m, &su);
        if (!e)
            break;
        run_requests(ctx, e, rs, N_SEEDED, 0, res);
        for (int i = 0; i < N_SEEDED; i++) {
            CHECK(res[i].n == 6);
            if (res[i].n >= 2 && res[i].tok[1] >= 0 && res[i].tok[1] < 97)
                hist[pass][res[i].tok[1]]++;
        }
        ts_engine_stats st;
        ts_engine_get_stats(e, &st);
        if (pass) {
            check_counters(e, res, N_SEEDED);
            int bins = 0;
            double chi2 = chi2_two(hist[0], hist[pass], 97, &bins);
            double rate = st.spec_proposed ? (double)st.spec_accepted /
                                                 (double)st.spec_proposed
                                           : 0;
            printf("  engine, temperature 1, %-16s: 2nd token over %d seeds, "
                   "chi2 %.1f over %d bins (0.999 quantile %.1f); accepted "
                   "%lld of %lld (%.1f%%)\n",
                   names[pass], N_SEEDED, chi2, bins, chi2_q999(bins - 1),
                   (long long)st.spec_accepted, (long long)st.spec_proposed,
                   100 * rate);
            CHECK(bins > 2 && chi2 < chi2_q999(bins - 1));
            CHECK(st.spec_proposed > 0);
            if (drafts[pass] == other) /* proposals accepted and rejected */
                CHECK(st.spec_accepted > 0 &&
                      st.spec_accepted < st.spec_proposed);
            if (drafts[pass] == m) /* p = q but for rounding */
                CHECK(rate > 0.99);
        }
        ts_engine_free(e);
    }
    free(rs), free(res);
}

static void test_bad_options(ts_ctx *ctx, ts_decoder *m, ts_decoder *v64) {
    ts_engine_options o = ts_engine_options_default();
    ts_engine *e = NULL;
    o.spec = (ts_spec_method)7;
    CHECK(ts_engine_new(ctx, m, &o, &e) == TS_ERR_RANGE && !e);
    CHECK_MSG(ctx, "spec 7");
    ts_clear_error(ctx);
    o.spec = TS_SPEC_NGRAM;
    o.spec_tokens = 17;
    CHECK(ts_engine_new(ctx, m, &o, &e) == TS_ERR_RANGE && !e);
    CHECK_MSG(ctx, "spec_tokens 17");
    ts_clear_error(ctx);
    o.spec_tokens = -1;
    CHECK(ts_engine_new(ctx, m, &o, &e) == TS_ERR_RANGE && !e);
    CHECK_MSG(ctx, "spec_tokens -1");
    ts_clear_error(ctx);
    o.spec_tokens = 0;
    o.spec_ngram_min = 5; /* max's default is 4 */
    CHECK(ts_engine_new(ctx, m, &o, &e) == TS_ERR_RANGE && !e);
    CHECK_MSG(ctx, "spec_ngram_min 5 is more than spec_ngram_max 4");
    ts_clear_error(ctx);
    o.spec_ngram_min = 0, o.spec_ngram_max = 65;
    CHECK(ts_engine_new(ctx, m, &o, &e) == TS_ERR_RANGE && !e);
    CHECK_MSG(ctx, "spec_ngram_max 65");
    ts_clear_error(ctx);
    o.spec_ngram_max = 0;
    o.spec = TS_SPEC_DRAFT;
    CHECK(ts_engine_new(ctx, m, &o, &e) != TS_OK && !e);
    CHECK_MSG(ctx, "spec_draft");
    ts_clear_error(ctx);
    o.spec_draft = v64;
    CHECK(ts_engine_new(ctx, m, &o, &e) != TS_OK && !e);
    CHECK_MSG(ctx, "vocabulary has 64 tokens, the model's 97");
    ts_clear_error(ctx);
    /* the defaults are fine, and a draft given without TS_SPEC_DRAFT is
     * unused */
    o.spec = TS_SPEC_NGRAM;
    CHECK_OK(ctx, ts_engine_new(ctx, m, &o, &e));
    ts_engine_free(e);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s HF_MODELS_DIR\n", argv[0]);
        return 2;
    }
    ts_ctx *ctx = test_ctx();
    char dir[1024];
    ts_decoder *m = NULL, *other = NULL, *v64 = NULL;
    snprintf(dir, sizeof dir, "%s/gqa2_untied", argv[1]);
    CHECK_OK(ctx, ts_decoder_load(ctx, dir, &m));
    snprintf(dir, sizeof dir, "%s/bf16_tied", argv[1]);
    CHECK_OK(ctx, ts_decoder_load(ctx, dir, &other));
    snprintf(dir, sizeof dir, "%s/mha_tied", argv[1]);
    CHECK_OK(ctx, ts_decoder_load(ctx, dir, &v64));
    test_rule_distribution(ctx);
    if (m && other && v64) {
        ts_set_grad_enabled(ctx, false);
        test_greedy_same(ctx, m, other);
        test_squeezed(ctx, m, other);
        test_processors_and_logprobs(ctx, m);
        test_prefix_blocks(ctx, m);
        test_excluded(ctx, m);
        test_stops_abort_seeds(ctx, m);
        test_engine_distribution(ctx, m, other);
        test_bad_options(ctx, m, v64);
    }
    ts_decoder_free(m), ts_decoder_free(other), ts_decoder_free(v64);
    ts_ctx_free(ctx);
    return test_finish("test_engine_spec");
}
