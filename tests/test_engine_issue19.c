/* test_engine_issue19.c — the engine's parts of issue 19 on the Hugging
 * Face decoder of tests/reference/hf_qwen3.py: a constraint's mask is obeyed
 * and its state freed exactly once (finished, aborted, preempted and
 * recomputed, engine freed, add refused); a done constraint's last token is
 * followed by a STOP output; logit_bias bans and forces tokens; prompt
 * log-probabilities equal the log-softmax of a whole-prompt forward, with
 * and without chunked prefill and a warm prefix cache; embeddings (LAST and
 * MEAN) equal the normalized final hidden states of a whole-prompt forward,
 * alone or batched with other requests, and those states times the LM
 * head give the model's logits; finish counts and queue time.
 * argv: HF_MODELS_DIR */
#include "tessera_engine.h"
#include "tessera_models.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define V       97
#define MAX_OUT 80
#define N_REQ   12

/* ---- a toy constraint: tokens t % 3 == 0 only, done after n_done ---- */

typedef struct {
    int n, n_done, n_can_end;
    int *frees; /* counts free calls */
    int32_t hist[MAX_OUT];
    bool deny_all; /* a mask with no bit set */
} toy;

static void toy_mask(void *st, uint32_t *bits) {
    toy *c = st;
    for (int t = 0; t < V && !c->deny_all; t++)
        if (t % 3 == 0)
            bits[t / 32] |= 1u << (t % 32);
}
static bool toy_accept(void *st, int32_t t) {
    toy *c = st;
    if (t % 3 || c->n >= MAX_OUT)
        return false;
    c->hist[c->n++] = t;
    return true;
}
static bool toy_can_end(const void *st) {
    const toy *c = st;
    return c->n >= c->n_can_end;
}
static bool toy_done(const void *st) {
    const toy *c = st;
    return c->n >= c->n_done;
}
static void toy_free(void *st) {
    toy *c = st;
    (*c->frees)++;
    free(c);
}

static ts_constraint toy_new(int n_done, int n_can_end, int *frees) {
    toy *c = calloc(1, sizeof *c);
    c->n_done = n_done, c->n_can_end = n_can_end, c->frees = frees;
    return (ts_constraint){.state = c,
                           .mask = toy_mask,
                           .accept = toy_accept,
                           .can_end = toy_can_end,
                           .done = toy_done,
                           .free = toy_free};
}

/* ---- running requests ---- */

typedef struct {
    int32_t tok[MAX_OUT];
    ts_finish_reason why[MAX_OUT];
    int n;
    ts_engine_output first; /* with its prompt_lp / embedding (owned) */
    bool got_first;
    int n_plp_outputs; /* outputs carrying prompt_lp */
} result;

static void result_free(result *r, int n) {
    for (int i = 0; i < n; i++)
        free(r[i].first.prompt_lp), free(r[i].first.embedding);
}

static void collect(const ts_engine_output *o, int n, const int64_t *ids,
                    int n_ids, result *res) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < n_ids; i++) {
            if (o[j].id != ids[i])
                continue;
            result *r = &res[i];
            if (!r->got_first)
                r->first = o[j], r->got_first = true;
            else
                free(o[j].prompt_lp), free(o[j].embedding);
            r->n_plp_outputs += o[j].prompt_lp != NULL;
            if (r->n < MAX_OUT)
                r->tok[r->n] = o[j].token, r->why[r->n++] = o[j].finish;
        }
}

/* steps until the engine is idle, outputs into res by request */
static void drain(ts_ctx *ctx, ts_engine *e, const int64_t *ids, int n, int cap,
                  result *res) {
    for (int guard = 0; ts_engine_has_work(e) && guard < 5000; guard++) {
        ts_engine_output out[64];
        int k = 0;
        CHECK_OK(ctx, ts_engine_step(e, out, cap, &k));
        if (ts_ctx_status(ctx) != TS_OK)
            return;
        collect(out, k, ids, n, res);
    }
}

static ts_engine *engine(ts_ctx *ctx, ts_decoder *m, int64_t blocks,
                         int max_seqs, int64_t batch_tokens) {
    ts_engine_options o = ts_engine_options_default();
    o.n_blocks = blocks;
    o.max_seqs = max_seqs;
    o.max_batch_tokens = batch_tokens;
    o.kv_dtype = TS_KV_F32; /* compared with f32 whole-prompt forwards */
    ts_engine *e = NULL;
    CHECK_OK(ctx, ts_engine_new(ctx, m, &o, &e));
    return e;
}

static void make_prompt(int32_t *p, size_t n, int seed) {
    for (size_t t = 0; t < n; t++)
        p[t] = (int32_t)((t * 31 + (size_t)seed * 17 + 5) % V);
}

static ts_request gen_request(const int32_t *p, size_t n, int max_tokens) {
    return (ts_request){.prompt = p,
                        .n_prompt = n,
                        .max_tokens = max_tokens,
                        .sampling = ts_sampling_default(),
                        .ignore_eos = true};
}

static void check_no_blocks_held(ts_engine *e) {
    ts_engine_stats st;
    ts_engine_get_stats(e, &st);
    CHECK(st.running == 0 && st.waiting == 0 && st.blocks_in_sequences == 0);
}

/* ---- constraints ---- */

/* greedy and sampled: 5 tokens, each % 3 == 0, then a STOP output */
static void test_constraint_obeyed(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = engine(ctx, m, 64, 4, 64);
    if (!e)
        return;
    int frees = 0;
    int32_t p[2][20];
    int64_t ids[2];
    result res[2] = {0};
    for (int i = 0; i < 2; i++) {
        make_prompt(p[i], 20, i);
        ts_request r = gen_request(p[i], 20, 30);
        r.sampling.temperature = i ? 1.0 : 0;
        r.sampling.seed = 7;
        r.constraint = toy_new(5, 5, &frees);
        CHECK_OK(ctx, ts_engine_add(e, &r, &ids[i]));
    }
    drain(ctx, e, ids, 2, 64, res);
    for (int i = 0; i < 2; i++) {
        CHECK(res[i].n == 6);
        for (int k = 0; k < 5 && k < res[i].n; k++)
            CHECK(res[i].tok[k] >= 0 && res[i].tok[k] % 3 == 0 &&
                  res[i].why[k] == TS_FINISH_NONE);
        CHECK(res[i].tok[5] == -1 && res[i].why[5] == TS_FINISH_STOP);
    }
    CHECK(frees == 2);
    ts_engine_stats st;
    ts_engine_get_stats(e, &st);
    CHECK(st.finished_stop == 2 && st.generated_tokens == 10);
    check_no_blocks_held(e);
    ts_engine_free(e);
}

/* the end-of-sequence id only once the constraint can end: forced by
 * +100 from then on, refused (masked) before */
static void test_constraint_end(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = engine(ctx, m, 64, 4, 64);
    if (!e)
        return;
    int32_t eos = 2;
    ts_engine_set_eos(e, &eos, 1);
    int frees = 0;
    int32_t p[16];
    make_prompt(p, 16, 3);
    ts_logit_bias b = {.token = 2, .bias = 100};
    ts_request r = gen_request(p, 16, 30);
    r.ignore_eos = false;
    r.logit_bias = &b, r.n_logit_bias = 1;
    r.constraint = toy_new(50, 3, &frees);
    int64_t id;
    result res = {0};
    CHECK_OK(ctx, ts_engine_add(e, &r, &id));
    drain(ctx, e, &id, 1, 64, &res);
    CHECK(res.n == 4 && res.tok[0] % 3 == 0 && res.tok[1] % 3 == 0 &&
          res.tok[2] % 3 == 0);
    CHECK(res.tok[3] == 2 && res.why[3] == TS_FINISH_STOP);
    CHECK(frees == 1);
    ts_engine_free(e);
}

/* a mask with nothing allowed ends the request (CONSTRAINT, token -1) */
static void test_constraint_none_allowed(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = engine(ctx, m, 64, 4, 64);
    if (!e)
        return;
    int frees = 0;
    int32_t p[8];
    make_prompt(p, 8, 4);
    ts_request r = gen_request(p, 8, 10);
    r.constraint = toy_new(5, 5, &frees);
    ((toy *)r.constraint.state)->deny_all = true;
    int64_t id;
    result res = {0};
    CHECK_OK(ctx, ts_engine_add(e, &r, &id));
    drain(ctx, e, &id, 1, 64, &res);
    CHECK(res.n == 1 && res.tok[0] == -1 && res.why[0] == TS_FINISH_CONSTRAINT);
    CHECK(frees == 1);
    ts_engine_stats st;
    ts_engine_get_stats(e, &st);
    CHECK(st.finished_constraint == 1 && st.generated_tokens == 0);
    check_no_blocks_held(e);
    ts_engine_free(e);
}

/* many constrained requests in a pool that forces preemption: the same
 * tokens as with room for all (the matcher is not fed twice), each state
 * freed once */
static void run_constrained(ts_ctx *ctx, ts_engine *e, int32_t (*p)[120],
                            int *frees, result *res) {
    int64_t ids[N_REQ];
    memset(res, 0, sizeof(result) * N_REQ);
    for (int i = 0; i < N_REQ; i++) {
        size_t n = (size_t)(20 + (i * 37) % 100);
        make_prompt(p[i], n, i + 10);
        ts_request r = gen_request(p[i], n, 40);
        r.constraint = toy_new(20 + i % 5, 20, frees);
        CHECK_OK(ctx, ts_engine_add(e, &r, &ids[i]));
    }
    drain(ctx, e, ids, N_REQ, 64, res);
}

static void test_constraint_preemption(ts_ctx *ctx, ts_decoder *m) {
    static int32_t p[N_REQ][120];
    static result big[N_REQ], small[N_REQ];
    int frees_big = 0, frees_small = 0;
    ts_engine *e1 = engine(ctx, m, 512, 16, 128);
    ts_engine *e2 = engine(ctx, m, 16, 16, 128);
    if (!e1 || !e2)
        return;
    run_constrained(ctx, e1, p, &frees_big, big);
    run_constrained(ctx, e2, p, &frees_small, small);
    ts_engine_stats st;
    ts_engine_get_stats(e2, &st);
    CHECK(st.preemptions > 0);
    CHECK(frees_big == N_REQ && frees_small == N_REQ);
    for (int i = 0; i < N_REQ; i++) {
        int want = 20 + i % 5; /* tokens, then the STOP output */
        CHECK(small[i].n == want + 1 && big[i].n == want + 1);
        CHECK(!memcmp(small[i].tok, big[i].tok, sizeof(int32_t) * MAX_OUT));
        for (int k = 0; k < want && k < small[i].n; k++)
            CHECK(small[i].tok[k] % 3 == 0);
        CHECK(small[i].why[want] == TS_FINISH_STOP);
    }
    check_no_blocks_held(e2);
    ts_engine_free(e1), ts_engine_free(e2);
}

/* freed once when aborted (running or waiting), when the engine goes,
 * never when ts_engine_add refuses the request */
static void test_constraint_abort(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = engine(ctx, m, 64, 1, 64);
    if (!e)
        return;
    int frees = 0;
    int32_t p[8];
    make_prompt(p, 8, 5);
    ts_request r = gen_request(p, 8, 20);
    int64_t a, b, c;
    r.constraint = toy_new(10, 10, &frees);
    CHECK_OK(ctx, ts_engine_add(e, &r, &a));
    r.constraint = toy_new(10, 10, &frees);
    CHECK_OK(ctx, ts_engine_add(e, &r, &b)); /* waits: max_seqs 1 */
    r.constraint = toy_new(10, 10, &frees);
    CHECK_OK(ctx, ts_engine_add(e, &r, &c));
    ts_engine_output out[4];
    int k;
    CHECK_OK(ctx, ts_engine_step(e, out, 4, &k));
    CHECK(k == 1 && out[0].id == a);
    CHECK_OK(ctx, ts_engine_abort(e, a));
    CHECK(frees == 1);
    CHECK_OK(ctx, ts_engine_abort(e, c)); /* never admitted */
    CHECK(frees == 2);
    ts_constraint kept = toy_new(10, 10, &frees);
    r.constraint = kept;
    r.sampling.top_p = 5; /* refused: the caller keeps its state */
    CHECK(ts_engine_add(e, &r, &c) != TS_OK);
    ts_clear_error(ctx);
    CHECK(frees == 2);
    kept.free(kept.state);
    CHECK(frees == 3);
    ts_engine_stats st;
    ts_engine_get_stats(e, &st);
    CHECK(st.finished_abort == 2);
    ts_engine_free(e); /* b is still running */
    CHECK(frees == 4);
}

/* out with room for one: the STOP output comes first in the next step */
static void test_constraint_small_out(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = engine(ctx, m, 64, 1, 64);
    if (!e)
        return;
    int frees = 0;
    int32_t p[8];
    make_prompt(p, 8, 6);
    ts_request r = gen_request(p, 8, 20);
    r.constraint = toy_new(2, 2, &frees);
    int64_t id;
    result res = {0};
    CHECK_OK(ctx, ts_engine_add(e, &r, &id));
    drain(ctx, e, &id, 1, 1, &res);
    CHECK(res.n == 3 && res.tok[2] == -1 && res.why[2] == TS_FINISH_STOP);
    CHECK(res.why[1] == TS_FINISH_NONE && frees == 1);
    ts_engine_free(e);
}

/* out's cap at max_seqs: a constraint's STOP after its last token waits for
 * the next step rather than take the slot of another sequence's token */
static void test_constraint_stop_keeps_others(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = engine(ctx, m, 64, 2, 64);
    if (!e)
        return;
    int frees = 0;
    int32_t p[2][8];
    make_prompt(p[0], 8, 10), make_prompt(p[1], 8, 11);
    ts_request r[2] = {gen_request(p[0], 8, 20), gen_request(p[1], 8, 6)};
    r[0].constraint = toy_new(2, 2, &frees);
    int64_t ids[2];
    result res[2] = {0};
    for (int i = 0; i < 2; i++)
        CHECK_OK(ctx, ts_engine_add(e, &r[i], &ids[i]));
    drain(ctx, e, ids, 2, 2, res);
    CHECK(res[0].n == 3 && res[0].tok[2] == -1 &&
          res[0].why[2] == TS_FINISH_STOP && frees == 1);
    CHECK(res[1].n == 6 && res[1].why[5] == TS_FINISH_LENGTH);
    for (int i = 0; i < res[1].n; i++)
        CHECK(res[1].tok[i] >= 0 && res[1].tok[i] < V);
    check_no_blocks_held(e);
    ts_engine_free(e);
}

/* a mask over more tokens than the model has is refused; the caller keeps
 * the state */
static void test_constraint_vocab(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = engine(ctx, m, 64, 2, 64);
    if (!e)
        return;
    int frees = 0;
    int32_t p[8];
    make_prompt(p, 8, 12);
    ts_request r = gen_request(p, 8, 4);
    r.constraint = toy_new(2, 2, &frees);
    r.constraint.n_tokens = V + 1;
    int64_t id;
    CHECK(ts_engine_add(e, &r, &id) == TS_ERR_RANGE);
    ts_clear_error(ctx);
    CHECK(frees == 0);
    r.constraint.n_tokens = V;
    CHECK_OK(ctx, ts_engine_add(e, &r, &id));
    result res = {0};
    drain(ctx, e, &id, 1, 64, &res);
    CHECK(res.n == 3 && frees == 1);
    ts_engine_free(e);
}

/* ---- logit_bias ---- */

/* the logits of the next token after p (a whole forward) */
static bool next_logits(ts_ctx *ctx, ts_decoder *m, const int32_t *p, size_t n,
                        float *out) {
    int64_t shape[2] = {1, (int64_t)n};
    ts_tensor *ids = ts_from_data(ctx, TS_I32, 2, shape, p);
    ts_tensor *l = ids ? ts_decoder_forward(m, ids, 0) : NULL;
    ts_tensor *c = l ? ts_contiguous(l) : NULL;
    const float *d = c ? ts_tensor_data(c) : NULL;
    if (d)
        memcpy(out, d + (n - 1) * V, sizeof(float) * V);
    ts_release(ids), ts_release(l), ts_release(c);
    return d != NULL;
}

static int argmax(const float *x, int n, int skip) {
    int b = skip == 0 ? 1 : 0;
    for (int i = 0; i < n; i++)
        if (i != skip && x[i] > x[b])
            b = i;
    return b;
}

static void test_logit_bias(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = engine(ctx, m, 64, 4, 64);
    int32_t p[24];
    make_prompt(p, 24, 8);
    float l[V];
    if (!e || !next_logits(ctx, m, p, 24, l))
        return;
    int best = argmax(l, V, -1), second = argmax(l, V, best);
    int forced = (best + 40) % V;
    ts_logit_bias ban = {best, -100}, force = {forced, 100};
    ts_request r[3] = {gen_request(p, 24, 1), gen_request(p, 24, 1),
                       gen_request(p, 24, 1)};
    r[1].logit_bias = &ban, r[1].n_logit_bias = 1;
    r[2].logit_bias = &force, r[2].n_logit_bias = 1;
    r[2].sampling.temperature = 1, r[2].sampling.seed = 3;
    r[0].logprobs = r[1].logprobs = 1;
    int64_t ids[3];
    result res[3] = {0};
    for (int i = 0; i < 3; i++)
        CHECK_OK(ctx, ts_engine_add(e, &r[i], &ids[i]));
    drain(ctx, e, ids, 3, 64, res);
    CHECK(res[0].tok[0] == best && res[1].tok[0] == second &&
          res[2].tok[0] == forced);
    /* logprobs stay the model's: the banned draw's is its unbiased one */
    double lse = 0, mx = l[best];
    for (int i = 0; i < V; i++)
        lse += exp((double)l[i] - mx);
    lse = mx + log(lse);
    CHECK_NEAR(res[1].first.logprob, l[second] - lse, 1e-4);
    CHECK_NEAR(res[0].first.logprob, l[best] - lse, 1e-4);
    /* bad entries: the message names logit_bias, nothing queued */
    ts_logit_bias bad[2] = {{5, 101}, {V, 1}};
    for (int i = 0; i < 2; i++) {
        ts_request q = gen_request(p, 24, 1);
        q.logit_bias = &bad[i], q.n_logit_bias = 1;
        int64_t id;
        CHECK(ts_engine_add(e, &q, &id) != TS_OK);
        CHECK_MSG(ctx, "logit_bias");
        ts_clear_error(ctx);
    }
    ts_request q = gen_request(p, 24, 1);
    q.logit_bias = &ban, q.n_logit_bias = TS_ENGINE_MAX_LOGIT_BIAS + 1;
    int64_t id;
    CHECK(ts_engine_add(e, &q, &id) != TS_OK);
    CHECK_MSG(ctx, "logit_bias");
    ts_clear_error(ctx);
    CHECK(!ts_engine_has_work(e));
    ts_engine_free(e);
}

/* ---- prompt logprobs ---- */

/* log_softmax of a whole forward's logits (T, V), in double */
static double *ref_log_softmax(ts_ctx *ctx, ts_decoder *m, const int32_t *p,
                               size_t n) {
    int64_t shape[2] = {1, (int64_t)n};
    ts_tensor *ids = ts_from_data(ctx, TS_I32, 2, shape, p);
    ts_tensor *l = ids ? ts_decoder_forward(m, ids, 0) : NULL;
    ts_tensor *c = l ? ts_contiguous(l) : NULL;
    const float *d = c ? ts_tensor_data(c) : NULL;
    double *out = d ? malloc(sizeof(double) * n * V) : NULL;
    for (size_t t = 0; out && t < n; t++) {
        const float *row = d + t * V;
        double mx = row[0], s = 0;
        for (int i = 1; i < V; i++)
            mx = row[i] > mx ? row[i] : mx;
        for (int i = 0; i < V; i++)
            s += exp(row[i] - mx);
        for (int i = 0; i < V; i++)
            out[t * V + (size_t)i] = row[i] - mx - log(s);
    }
    ts_release(ids), ts_release(l), ts_release(c);
    return out;
}

static void check_prompt_lp(const result *r, const int32_t *p, size_t n,
                            const double *ref, int n_top) {
    const ts_engine_output *o = &r->first;
    CHECK(o->prompt_lp && o->n_prompt_lp == n - 1 && r->n_plp_outputs == 1);
    if (!o->prompt_lp || o->n_prompt_lp != n - 1)
        return;
    int bad = 0;
    for (size_t k = 0; k + 1 < n; k++) {
        const ts_engine_output *x = &o->prompt_lp[k];
        const double *row = ref + k * V;
        bad += x->token != p[k + 1] ||
               fabs(x->logprob - row[p[k + 1]]) > 1e-4 || x->n_top != n_top;
        for (int j = 0; j < x->n_top; j++) { /* descending, the right ones */
            bad += fabs(x->top_logprobs[j] - row[x->top_ids[j]]) > 1e-4;
            int above = 0;
            for (int i = 0; i < V; i++)
                above += row[i] > row[x->top_ids[j]] + 1e-6;
            bad += above != j;
        }
    }
    CHECK(bad == 0);
}

static void test_prompt_logprobs(ts_ctx *ctx, ts_decoder *m) {
    static int32_t p[3][100];
    size_t n[3] = {100, 37, 1};
    double *ref[3];
    for (int i = 0; i < 3; i++) {
        make_prompt(p[i], n[i], 20 + i);
        ref[i] = ref_log_softmax(ctx, m, p[i], n[i]);
    }
    int64_t batch[3] = {512, 7, 16}; /* whole, chunked, chunked */
    for (int b = 0; b < 3 && ref[0] && ref[1]; b++) {
        ts_engine *e = engine(ctx, m, 128, 8, batch[b]);
        if (!e)
            break;
        if (b == 2) { /* a warm cache holds p[0]: still computed whole */
            int64_t id;
            result warm = {0};
            ts_request w = gen_request(p[0], n[0], 1);
            CHECK_OK(ctx, ts_engine_add(e, &w, &id));
            drain(ctx, e, &id, 1, 64, &warm);
        }
        int64_t ids[5];
        result res[5] = {0};
        int32_t other[30];
        make_prompt(other, 30, 99);
        ts_request r[5] = {
            gen_request(p[0], n[0], 3), gen_request(other, 30, 5),
            gen_request(p[1], n[1], 2), gen_request(p[2], n[2], 2),
            gen_request(p[0], n[0], 3)};
        r[0].prompt_logprobs = r[2].prompt_logprobs = true;
        r[3].prompt_logprobs = true;
        r[0].logprobs = 1 + 3, r[2].logprobs = 0;
        r[4].logprobs = 1; /* the same prompt without: same tokens */
        for (int i = 0; i < 5; i++)
            CHECK_OK(ctx, ts_engine_add(e, &r[i], &ids[i]));
        drain(ctx, e, ids, 5, 64, res);
        check_prompt_lp(&res[0], p[0], n[0], ref[0], 3);
        check_prompt_lp(&res[2], p[1], n[1], ref[1], 0);
        CHECK(res[0].first.cached_tokens == 0);
        CHECK(res[3].first.prompt_lp == NULL && res[3].n == 2);
        CHECK(res[1].n_plp_outputs == 0 && res[4].n_plp_outputs == 0);
        CHECK(res[0].n == 3 && !memcmp(res[0].tok, res[4].tok, 12));
        result_free(res, 5);
        check_no_blocks_held(e);
        ts_engine_free(e);
    }
    for (int i = 0; i < 3; i++)
        free(ref[i]);
}

/* ---- embeddings ---- */

/* the final hidden states of a whole forward, pooled, normalized */
static bool ref_embedding(ts_ctx *ctx, ts_decoder *m, const int32_t *p,
                          size_t n, ts_pooling how, double *out, int64_t C) {
    int64_t shape[2] = {1, (int64_t)n};
    ts_tensor *ids = ts_from_data(ctx, TS_I32, 2, shape, p);
    ts_tensor *h = ids ? ts_decoder_forward_hidden(m, ids, 0) : NULL;
    ts_tensor *c = h ? ts_contiguous(h) : NULL;
    const float *d = c ? ts_tensor_data(c) : NULL;
    CHECK(h && ts_tensor_dim(h, 2) == C && ts_tensor_dim(h, 1) == (int64_t)n);
    double sq = 0;
    for (int64_t i = 0; d && i < C; i++) {
        double v = 0;
        for (size_t t = how == TS_POOL_LAST ? n - 1 : 0; t < n; t++)
            v += d[t * (size_t)C + (size_t)i];
        out[i] = v;
        sq += v * v;
    }
    for (int64_t i = 0; d && i < C; i++)
        out[i] /= sqrt(sq);
    ts_release(ids), ts_release(h), ts_release(c);
    return d != NULL;
}

/* the hidden states are the head's input: hidden x lm_head^T gives
 * ts_decoder_forward's logits */
static void test_forward_hidden(ts_ctx *ctx, ts_decoder *m) {
    const int64_t C = ts_decoder_get_config(m)->hidden;
    int32_t p[30];
    make_prompt(p, 30, 50);
    int64_t shape[2] = {1, 30};
    ts_tensor *ids = ts_from_data(ctx, TS_I32, 2, shape, p);
    ts_tensor *h = ts_decoder_forward_hidden(m, ids, 0);
    ts_tensor *l = ts_decoder_forward(m, ids, 0);
    ts_tensor *w = ts_decoder_find_param(m, "lm_head.weight");
    ts_tensor *hc = h ? ts_contiguous(h) : NULL,
              *lc = l ? ts_contiguous(l) : NULL;
    ts_tensor *wc = w ? ts_contiguous(w) : NULL;
    const float *H = hc ? ts_tensor_data(hc) : NULL,
                *L = lc ? ts_tensor_data(lc) : NULL,
                *W = wc ? ts_tensor_data(wc) : NULL;
    CHECK(H && L && W && ts_tensor_dim(h, 2) == C);
    double worst = 0;
    for (int t = 0; H && L && W && t < 30; t++)
        for (int v = 0; v < V; v++) {
            double d = 0;
            for (int64_t c = 0; c < C; c++)
                d += (double)H[t * C + c] * W[v * C + c];
            worst = fmax(worst, fabs(d - L[t * V + v]));
        }
    CHECK(worst < 1e-4);
    ts_release(ids), ts_release(h), ts_release(l);
    ts_release(hc), ts_release(lc), ts_release(wc);
}

static double max_diff_d(const float *a, const double *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static void test_embeddings(ts_ctx *ctx, ts_decoder *m) {
    const int64_t C = ts_decoder_get_config(m)->hidden;
    static int32_t p[2][90];
    size_t n[2] = {90, 23};
    double ref[2][2][64]; /* prompt, pooling (LAST, MEAN), C <= 64 */
    CHECK(C <= 64);
    for (int i = 0; i < 2; i++) {
        make_prompt(p[i], n[i], 40 + i);
        for (int k = 0; k < 2; k++)
            if (!ref_embedding(ctx, m, p[i], n[i],
                               k ? TS_POOL_MEAN : TS_POOL_LAST, ref[i][k], C))
                return;
    }
    /* alone, then batched with generations and each other, chunked */
    for (int mode = 0; mode < 2; mode++) {
        ts_engine *e =
            mode ? engine(ctx, m, 128, 8, 20) : engine(ctx, m, 128, 1, 512);
        if (!e)
            return;
        int32_t other[40];
        make_prompt(other, 40, 77);
        ts_request r[6];
        int nr = 0;
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < 2; k++) {
                r[nr] =
                    (ts_request){.prompt = p[i],
                                 .n_prompt = n[i],
                                 .pooling = k ? TS_POOL_MEAN : TS_POOL_LAST};
                nr++;
                if (mode && nr == 2)
                    r[nr++] = gen_request(other, 40, 6);
            }
        if (mode)
            r[nr++] = gen_request(p[0], n[0], 4);
        int64_t ids[6];
        result res[6] = {0};
        for (int i = 0; i < nr; i++) {
            CHECK_OK(ctx, ts_engine_add(e, &r[i], &ids[i]));
            if (!mode) /* alone: one at a time */
                drain(ctx, e, &ids[i], 1, 64, &res[i]);
        }
        if (mode)
            drain(ctx, e, ids, nr, 64, res);
        for (int i = 0, j = 0; i < nr; i++) {
            if (r[i].pooling == TS_POOL_NONE) {
                CHECK(res[i].first.embedding == NULL && res[i].n > 1);
                continue;
            }
            const ts_engine_output *o = &res[i].first;
            CHECK(res[i].n == 1 && o->token == -1 &&
                  o->finish == TS_FINISH_STOP && o->dim == C && o->embedding);
            if (!o->embedding)
                continue;
            double sq = 0;
            for (int64_t c = 0; c < C; c++)
                sq += (double)o->embedding[c] * o->embedding[c];
            CHECK_NEAR(sqrt(sq), 1.0, 1e-5);
            int pi = j / 2, k = j % 2;
            j++;
            double d = max_diff_d(o->embedding, ref[pi][k], C);
            CHECK(d < 1e-5);
            if (d >= 1e-5)
                fprintf(stderr, "embedding %d (mode %d): max diff %g\n", i,
                        mode, d);
        }
        ts_engine_stats st;
        ts_engine_get_stats(e, &st);
        CHECK(st.embeddings == 4 && st.finished_stop == 4);
        CHECK(st.finished_length == (mode ? 2 : 0));
        result_free(res, nr);
        check_no_blocks_held(e);
        ts_engine_free(e);
    }
}

/* requests that exactly fill a 2-block pool are admitted: an embedding of
 * 32 tokens, a generation of 31 + 1 */
static void test_pool_boundary(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = engine(ctx, m, 2, 2, 64);
    if (!e)
        return;
    int32_t p[32];
    make_prompt(p, 32, 13);
    ts_request r[2] = {{.prompt = p, .n_prompt = 32, .pooling = TS_POOL_LAST},
                       gen_request(p, 31, 1)};
    for (int i = 0; i < 2; i++) {
        int64_t id;
        result res = {0};
        CHECK_OK(ctx, ts_engine_add(e, &r[i], &id));
        drain(ctx, e, &id, 1, 64, &res);
        CHECK(res.n == 1 && res.why[0] != TS_FINISH_NONE &&
              res.why[0] != TS_FINISH_ABORT);
        CHECK(!i == (res.first.embedding != NULL));
        result_free(&res, 1);
        check_no_blocks_held(e);
    }
    ts_engine_free(e);
}

/* a second request waits behind the first: its queue time is counted */
static void test_queue_time(ts_ctx *ctx, ts_decoder *m) {
    ts_engine *e = engine(ctx, m, 64, 1, 64);
    if (!e)
        return;
    int32_t p[8];
    make_prompt(p, 8, 9);
    ts_request r = gen_request(p, 8, 3);
    int64_t ids[2];
    result res[2] = {0};
    CHECK_OK(ctx, ts_engine_add(e, &r, &ids[0]));
    CHECK_OK(ctx, ts_engine_add(e, &r, &ids[1]));
    drain(ctx, e, ids, 2, 64, res);
    CHECK(res[0].first.queue_s >= 0 && res[0].first.queue_s < 1);
    CHECK(res[1].first.queue_s > res[0].first.queue_s);
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
    if (m && ts_decoder_get_config(m)->vocab != V) {
        fprintf(stderr, "gqa2_untied: vocab %lld, want %d\n",
                (long long)ts_decoder_get_config(m)->vocab, V);
        CHECK(false);
    } else if (m) {
        ts_set_grad_enabled(ctx, false);
        test_constraint_obeyed(ctx, m);
        test_constraint_end(ctx, m);
        test_constraint_none_allowed(ctx, m);
        test_constraint_preemption(ctx, m);
        test_constraint_abort(ctx, m);
        test_constraint_small_out(ctx, m);
        test_constraint_stop_keeps_others(ctx, m);
        test_constraint_vocab(ctx, m);
        test_logit_bias(ctx, m);
        test_prompt_logprobs(ctx, m);
        test_forward_hidden(ctx, m);
        test_embeddings(ctx, m);
        test_pool_boundary(ctx, m);
        test_queue_time(ctx, m);
    }
    ts_decoder_free(m);
    ts_ctx_free(ctx);
    return test_finish("test_engine_issue19");
}
