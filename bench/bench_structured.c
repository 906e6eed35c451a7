/* bench_structured.c — structured outputs' cost (issue 19): decode tokens/s
 * with a nested JSON schema against unconstrained decoding of the same
 * prompt, in the same run (target: >= 0.9x), and the time to compile the
 * schema on a first request against a cache hit.
 *   bench_structured [-m MODEL_DIR] [--qwen3 TOKENIZER_DIR] [--tokens N]
 * -m: a model folder (default models/kjv-qwen3, the shipped model: a small
 * model, so the mask's cost weighs most against its fast forward pass);
 * --qwen3: also the Qwen3-0.6B architecture (random bf16 weights) with the
 * real Qwen3 tokenizer's 151k-token vocabulary from that folder. */
#include "tessera_engine.h"
#include "tessera_grammar.h"
#include "tessera_models.h"
#include "tessera_tokenizer.h"

#include "qwen3_06b.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(ts_ctx *ctx, const char *what) {
    fprintf(stderr, "bench_structured: %s: %s\n", what, ts_errmsg(ctx));
    return 1;
}

/* a person with an address, tags and friends (recursive through $defs) */
static const char *SCHEMA =
    "{\"$defs\":{\"person\":{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":24},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"email\":{\"type\":\"string\",\"pattern\":\"[a-z]{1,12}@[a-z]{1,12}\\\\.("
    "com|org)\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":"
    "12},\"maxItems\":6},"
    "\"address\":{\"type\":\"object\",\"properties\":{"
    "\"street\":{\"type\":\"string\",\"maxLength\":32},"
    "\"city\":{\"type\":\"string\",\"maxLength\":20},"
    "\"kind\":{\"enum\":[\"home\",\"work\",\"other\"]}},"
    "\"required\":[\"street\",\"city\",\"kind\"]},"
    "\"friends\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/person\"},"
    "\"maxItems\":3}},"
    "\"required\":[\"name\",\"age\",\"tags\",\"address\",\"friends\"]}},"
    "\"$ref\":\"#/$defs/person\"}";

typedef struct {
    ts_matcher *m;
} mstate;

/* the time spent in the constraint's mask and accept, and their calls:
 * the structured output's own cost, apart from what masking does to the
 * sampler's work */
static double cb_s;
static int64_t cb_masks;

static void c_mask(void *s, uint32_t *bits) {
    double t0 = now();
    ts_matcher_mask(((mstate *)s)->m, bits);
    cb_s += now() - t0, cb_masks++;
}
static bool c_accept(void *s, int32_t t) {
    double t0 = now();
    bool ok = ts_matcher_accept(((mstate *)s)->m, t);
    cb_s += now() - t0;
    return ok;
}
static bool c_can_end(const void *s) {
    return ts_matcher_can_end(((const mstate *)s)->m);
}
static bool c_done(const void *s) {
    return ts_matcher_done(((const mstate *)s)->m);
}
static void c_free(void *s) {
    ts_matcher_free(((mstate *)s)->m);
    free(s);
}

/* the tokenizer's vocabulary: the tokens a matcher's mask covers */
static int32_t vocab_tokens;

typedef struct {
    double tps;      /* tokens per second after every stream's first */
    int64_t tokens;  /* generated in all */
    double cb_ms;    /* mask + accept per drawn token, ms */
    double cb_share; /* of the run's wall time */
} run_result;

/* streams requests of the same prompt; with g, each constrained by it */
static int run(ts_ctx *ctx, ts_engine *e, const int32_t *prompt, size_t n,
               int streams, int max_new, ts_grammar *g, run_result *res) {
    cb_s = 0, cb_masks = 0;
    double t_all = now();
    for (int s = 0; s < streams; s++) {
        ts_request r = {.prompt = prompt,
                        .n_prompt = n,
                        .max_tokens = max_new,
                        .sampling = ts_sampling_default(),
                        .ignore_eos = g == NULL};
        r.sampling.temperature = 0.8;
        r.sampling.seed = 1000 + (uint64_t)s;
        if (g) {
            mstate *ms = calloc(1, sizeof *ms);
            if (!ms || ts_matcher_new(ctx, g, &ms->m) != TS_OK)
                return -1;
            r.constraint = (ts_constraint){.state = ms,
                                           .mask = c_mask,
                                           .accept = c_accept,
                                           .can_end = c_can_end,
                                           .done = c_done,
                                           .free = c_free,
                                           .n_tokens = vocab_tokens};
        }
        int64_t id;
        if (ts_engine_add(e, &r, &id) != TS_OK) {
            if (g)
                c_free(r.constraint.state);
            return -1;
        }
    }
    ts_engine_output out[64];
    int64_t got = 0, firsts = 0;
    double t0 = 0;
    int seen[64] = {0};
    while (ts_engine_has_work(e)) {
        int k = 0;
        if (ts_engine_step(e, out, 64, &k) != TS_OK)
            return -1;
        for (int i = 0; i < k; i++) {
            free(out[i].prompt_lp), free(out[i].embedding);
            if (out[i].token < 0)
                continue; /* the constraint's end, not a token */
            int slot = (int)(out[i].id % 64);
            if (!seen[slot]) {
                seen[slot] = 1;
                if (++firsts == streams)
                    t0 = now();
                continue;
            }
            if (firsts >= streams)
                got++;
        }
    }
    res->tokens = got;
    res->tps = got ? (double)got / (now() - t0) : 0;
    res->cb_ms = cb_masks ? cb_s * 1e3 / (double)cb_masks : 0;
    res->cb_share = cb_s / (now() - t_all);
    return 0;
}

/* unconstrained and constrained runs alternated, best of reps each */
static int compare(ts_ctx *ctx, ts_engine *e, ts_grammar *g,
                   const int32_t *prompt, size_t n, int max_new,
                   const char *label) {
    int counts[2] = {1, 8};
    for (int c = 0; c < 2; c++) {
        run_result best[2];
        memset(best, 0, sizeof best);
        for (int rep = 0; rep < 3; rep++)
            for (int k = 0; k < 2; k++) {
                run_result rr;
                if (run(ctx, e, prompt, n, counts[c], max_new, k ? g : NULL,
                        &rr))
                    return die(ctx, "run");
                if (rr.tps > best[k].tps)
                    best[k] = rr;
            }
        printf("%s, %d stream%s: unconstrained %.1f tokens/s, json_schema "
               "%.1f tokens/s (%lld tokens): %.3fx (target >= 0.9: %s)\n",
               label, counts[c], counts[c] > 1 ? "s" : " ", best[0].tps,
               best[1].tps, (long long)best[1].tokens,
               best[1].tps / best[0].tps,
               best[1].tps / best[0].tps >= 0.9 ? "yes" : "no");
        printf("  the constraint itself (mask + accept): %.4f ms a token, "
               "%.2f%% of the constrained run's time\n",
               best[1].cb_ms, 100 * best[1].cb_share);
    }
    return 0;
}

/* compile time of SCHEMA: the first request (a miss), then a hit; and one
 * mask's time at the grammar's start */
static int compile_times(ts_ctx *ctx, ts_vocab *v, ts_grammar **out) {
    ts_grammar_cache *cache;
    if (ts_grammar_cache_new(ctx, v, 64, &cache) != TS_OK)
        return die(ctx, "cache");
    ts_grammar_spec spec = {.kind = TS_GRAMMAR_JSON_SCHEMA, .src = SCHEMA};
    bool hit = false;
    ts_grammar *g = NULL;
    double t0 = now();
    if (ts_grammar_cache_get(cache, ctx, &spec, &g, &hit) != TS_OK)
        return die(ctx, "compile");
    double cold = now() - t0;
    ts_grammar_unref(g);
    t0 = now();
    if (ts_grammar_cache_get(cache, ctx, &spec, &g, &hit) != TS_OK)
        return die(ctx, "cache hit");
    double warm = now() - t0;
    ts_matcher *m;
    if (ts_matcher_new(ctx, g, &m) != TS_OK)
        return die(ctx, "matcher");
    int32_t V = ts_vocab_size(v);
    uint32_t *bits = calloc((size_t)(V + 31) / 32, 4);
    t0 = now();
    for (int i = 0; i < 100; i++)
        ts_matcher_mask(m, bits);
    double mask = (now() - t0) / 100;
    printf("vocabulary %d: schema compile %.2f ms (first request), %.4f ms "
           "(cached: %s, %.0fx faster); mask at the start %.3f ms\n",
           V, cold * 1e3, warm * 1e3, hit ? "hit" : "MISS", cold / warm,
           mask * 1e3);
    free(bits);
    ts_matcher_free(m);
    ts_grammar_cache_free(cache);
    *out = g;
    return 0;
}

static int bench_model(ts_ctx *ctx, ts_decoder *d, ts_tokenizer *tok,
                       int max_new, const char *label) {
    ts_vocab *v;
    if (ts_vocab_new(ctx, tok, &v) != TS_OK)
        return die(ctx, "vocabulary");
    vocab_tokens = ts_vocab_size(v);
    ts_grammar *g = NULL;
    if (compile_times(ctx, v, &g))
        return 1;
    const char *text = "Write the record of a man of Israel as JSON:";
    int32_t *prompt;
    size_t n;
    if (ts_tokenizer_encode(tok, text, strlen(text), false, &prompt, &n) !=
        TS_OK)
        return die(ctx, "encode");
    ts_engine_options o = ts_engine_options_default();
    o.n_blocks = 1024;
    ts_engine *e;
    if (ts_engine_new(ctx, d, &o, &e) != TS_OK)
        return die(ctx, "engine");
    int rc = compare(ctx, e, g, prompt, n, max_new, label);
    ts_engine_free(e);
    free(prompt);
    ts_grammar_unref(g);
    ts_vocab_free(v);
    return rc;
}

int main(int argc, char **argv) {
    const char *dir = "models/kjv-qwen3", *qwen3 = NULL;
    int max_new = 128;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--qwen3") && i + 1 < argc)
            qwen3 = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            max_new = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_structured [-m MODEL_DIR] [--qwen3 "
                            "TOKENIZER_DIR] [--tokens N]\n");
            return 2;
        }
    }
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_set_grad_enabled(ctx, false);
    printf("%d threads\n", ts_get_num_threads(ctx));
    ts_lm *lm;
    ts_tokenizer *tok;
    if (ts_lm_load(ctx, dir, NULL, &lm) != TS_OK ||
        ts_tokenizer_load(ctx, dir, &tok) != TS_OK)
        return die(ctx, dir);
    int rc = bench_model(ctx, ts_lm_decoder(lm), tok, max_new, dir);
    ts_tokenizer_free(tok);
    ts_lm_free(lm);
    if (!rc && qwen3) {
        ts_model_config cfg = qwen3_06b(false);
        ts_decoder_options dopt = {.weight_dtype = TS_BF16};
        ts_decoder *m;
        if (ts_tokenizer_load(ctx, qwen3, &tok) != TS_OK)
            return die(ctx, qwen3);
        if (ts_decoder_new(ctx, &cfg, &dopt, 1, &m) != TS_OK)
            return die(ctx, "Qwen3-0.6B");
        rc = bench_model(ctx, m, tok, max_new / 2,
                         "Qwen3-0.6B architecture, bf16, Qwen3 vocabulary");
        ts_decoder_free(m);
        ts_tokenizer_free(tok);
    }
    ts_ctx_free(ctx);
    return rc;
}
