/* test_grammar.c — structured outputs (tessera_grammar.h): known answers
 * byte by byte for regex, EBNF, JSON Schema and any-JSON-object grammars;
 * exact integer ranges over [-1000, 1000]; seeded random walks over the
 * token masks whose texts tests/grammar_check.py validates with jsonschema
 * and re; the cached masks against the slow reference (every token fed to
 * the automaton) on the default 4k vocabulary and Qwen3's 151k; errors
 * naming the unsupported keyword; malformed and hostile inputs; timings.
 * argv: source dir, Qwen3 tokenizer.json (skipped when absent), out dir. */
#include "engine/grammar_internal.h"
#include "test_util.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static ts_ctx *ctx;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static uint64_t rng_state;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static ts_grammar *compile(const ts_vocab *v, ts_grammar_kind k,
                           const char *src) {
    ts_grammar_spec s = {.kind = k, .src = src};
    ts_grammar *g = NULL;
    if (ts_grammar_compile(ctx, v, &s, &g)) {
        fprintf(stderr, "compile failed: %s\n  %s\n", ts_errmsg(ctx), src);
        ts_test_failures++;
    }
    return g;
}

/* the whole text matches (every prefix is viable and it may end there) */
static bool matches(ts_grammar *g, const char *text) {
    ts_matcher *m = NULL;
    if (ts_matcher_new(ctx, g, &m))
        return false;
    bool ok = tsg_matcher_feed(m, (const unsigned char *)text, strlen(text)) &&
              ts_matcher_can_end(m);
    ts_matcher_free(m);
    return ok;
}

static void expect(const ts_vocab *v, ts_grammar_kind k, const char *src,
                   const char *const *yes, const char *const *no) {
    ts_grammar *g = compile(v, k, src);
    if (!g)
        return;
    for (int i = 0; yes && yes[i]; i++) {
        ts_test_checks++;
        if (!matches(g, yes[i])) {
            ts_test_failures++;
            fprintf(stderr, "%s: should accept \"%s\"\n", src, yes[i]);
        }
    }
    for (int i = 0; no && no[i]; i++) {
        ts_test_checks++;
        if (matches(g, no[i])) {
            ts_test_failures++;
            fprintf(stderr, "%s: should reject \"%s\"\n", src, no[i]);
        }
    }
    ts_grammar_unref(g);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_known_answers(const ts_vocab *v) {
    expect(v, TS_GRAMMAR_REGEX, "[a-c]+x{2,3}|\\d{3}",
           L("abxx", "aaxxx", "123", "cxx"),
           L("xx", "abxxxx", "12", "1234", "abx", ""));
    expect(v, TS_GRAMMAR_REGEX, "(?:é+ü?|[^a-z]{2})\\.",
           L("éé.", "éü.", "AB.", "\n1."), L("ü.", "ab.", "é", "ABC."));
    expect(v, TS_GRAMMAR_REGEX, "^\\w+@\\w+\\.(com|org)$",
           L("a@b.com", "x_1@y.org"), L("a@b.net", "@b.com", "a@b.com "));
    expect(v, TS_GRAMMAR_EBNF,
           "root ::= \"(\" expr \")\"\n"
           "expr ::= num (\"+\" expr)?  # right recursion\n"
           "num ::= [0-9]+ | \"-\" [1-9]\n",
           L("(1)", "(12+3+-4)", "(0+0)"), L("()", "(1+)", "(-0)", "1"));
    /* nullable repetitions inside repetitions: the closure terminates */
    expect(v, TS_GRAMMAR_EBNF,
           "root ::= (\"a\"? \"b\"?)* x\nx ::= y*\ny ::= \"\" | \"q\"",
           L("", "abba", "bq", "qqq"), L("c", "qa"));
    expect(v, TS_GRAMMAR_REGEX, "", L(""), L("a"));
    expect(v, TS_GRAMMAR_EBNF, "root ::= \"a\"{2,3} .", L("aab", "aaaé"),
           L("ab", "aaaab"));
    expect(v, TS_GRAMMAR_JSON_OBJECT, NULL,
           L("{}", "{\"x\":[1,2.5e-3,{\"y\":null}],\"z\":\"\\u00e9\\n\"}",
             "{\n  \"a\": true\n}"),
           L("[1]", "{\"a\" 1}", "{\"a\":01}", "{\"a\":\"\x01\"}", "{,}",
             "{                                        }"));
    const char *obj =
        "{\"type\":\"object\",\"properties\":{"
        "\"a\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120},"
        "\"b\":{\"type\":[\"string\",\"null\"],\"maxLength\":3},"
        "\"c\":{\"enum\":[\"x\",1,[true]]}},\"required\":[\"a\",\"c\"]}";
    expect(v, TS_GRAMMAR_JSON_SCHEMA, obj,
           L("{\"a\":7,\"c\":\"x\"}", "{\"a\": -5, \"b\": null, \"c\": [true]}",
             "{\"a\":120,\"b\":\"abc\",\"c\":1}"),
           L("{\"a\":121,\"c\":1}", "{\"a\":-6,\"c\":1}", "{\"a\":007,\"c\":1}",
             "{\"c\":1}", "{\"a\":1,\"b\":\"abcd\",\"c\":1}",
             "{\"c\":1,\"a\":1}", "{\"a\":1,\"c\":2}", "{\"a\":1,\"c\":1,}"));
    expect(v, TS_GRAMMAR_JSON_SCHEMA,
           "{\"type\":\"string\",\"pattern\":\"^[a-z]+\\\"?$\"}",
           L("\"ab\"", "\"ab\\\"\""), L("\"ab\"\"", "\"\"", "\"aB\""));
    expect(v, TS_GRAMMAR_JSON_SCHEMA,
           "{\"type\":\"number\",\"exclusiveMinimum\":-2,\"maximum\":3}",
           L("-1.99", "3", "3.000", "0", "-0.5", "2.999"),
           L("-2", "-2.0", "3.001", "4", "1e2"));
    /* an exclusive bound 0: zero in no spelling ("-0", "0.0", "-0.000") */
    expect(v, TS_GRAMMAR_JSON_SCHEMA,
           "{\"type\":\"number\",\"exclusiveMaximum\":0}",
           L("-1", "-0.5", "-0.001", "-100", "-0.10"),
           L("0", "-0", "-0.0", "-0.000", "0.0", "0.5", "1"));
    expect(v, TS_GRAMMAR_JSON_SCHEMA,
           "{\"type\":\"number\",\"exclusiveMinimum\":0}",
           L("0.5", "1", "0.001", "12.0"),
           L("0", "-0", "0.0", "-0.0", "0.000", "-0.5", "-1"));
    expect(v, TS_GRAMMAR_JSON_SCHEMA,
           "{\"type\":\"number\",\"minimum\":-3,\"exclusiveMaximum\":0}",
           L("-3", "-3.0", "-2.5", "-0.01"),
           L("-3.01", "-4", "0", "-0", "-0.0"));
    expect(v, TS_GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"maximum\":0}",
           L("0", "-0", "-0.0", "-7"), L("0.1", "1"));
    expect(v, TS_GRAMMAR_JSON_SCHEMA,
           "{\"type\":\"integer\",\"exclusiveMaximum\":0}", L("-1", "-20"),
           L("0", "-0", "1"));
    expect(
        v, TS_GRAMMAR_JSON_SCHEMA,
        "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{"
        "\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\","
        "\"items\":{\"$ref\":\"#/$defs/t\"},\"maxItems\":2}},"
        "\"required\":[\"v\"]}},\"$ref\":\"#/$defs/t\"}",
        L("{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]}]}"),
        L("{\"v\":1,\"kids\":[{\"v\":2},{\"v\":2},{\"v\":2}]}",
          "{\"kids\":[]}"));

    /* "required" without "properties": the keys come first, their values
     * additionalProperties' (absent: any value); never ignored */
    expect(v, TS_GRAMMAR_JSON_SCHEMA,
           "{\"type\":\"object\",\"required\":[\"a\",\"b\",\"a\"]}",
           L("{\"a\":1,\"b\":\"x\"}", "{\"a\":{},\"b\":[],\"c\":3}"),
           L("{}", "{\"a\":1}", "{\"b\":1}", "{\"c\":1,\"a\":1,\"b\":1}"));
    expect(v, TS_GRAMMAR_JSON_SCHEMA, "{\"required\":[\"a\"]}",
           L("{\"a\":null}"), L("{}", "{\"b\":1}"));
    expect(v, TS_GRAMMAR_JSON_SCHEMA,
           "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":"
           "\"integer\"}},\"required\":[\"x\",\"y\"],"
           "\"additionalProperties\":{\"type\":\"boolean\"}}",
           L("{\"x\":1,\"y\":true}", "{\"x\":1,\"y\":false,\"z\":true}"),
           L("{\"x\":1}", "{\"x\":1,\"y\":3}", "{\"y\":true}"));

    /* beside const / enum / anyOf: annotations, $defs and a "type" every
     * value has; without "type", the types the keywords apply to */
    expect(v, TS_GRAMMAR_JSON_SCHEMA,
           "{\"enum\":[\"a\",\"b\"],\"type\":\"string\",\"title\":\"T\"}",
           L("\"a\"", "\"b\""), L("\"c\"", "1"));
    expect(v, TS_GRAMMAR_JSON_SCHEMA,
           "{\"const\":3,\"type\":[\"integer\",\"null\"]}", L("3"),
           L("null", "4"));
    expect(v, TS_GRAMMAR_JSON_SCHEMA,
           "{\"anyOf\":[{\"type\":\"null\"}],\"description\":\"x\","
           "\"default\":null}",
           L("null"), L("1"));
    expect(v, TS_GRAMMAR_JSON_SCHEMA, "{\"minimum\":5}", L("5", "7.5"),
           L("4", "4.99", "null"));
    expect(v, TS_GRAMMAR_JSON_SCHEMA, "{\"maxLength\":2,\"minimum\":0}",
           L("\"ab\"", "3"), L("\"abc\"", "-1"));

    /* done: nothing may follow a closed object; prefix and suffix */
    ts_grammar_spec s = {TS_GRAMMAR_JSON_OBJECT, NULL, "<tool_call>\n",
                         "\n</tool_call>"};
    ts_grammar *g = NULL;
    CHECK_OK(ctx, ts_grammar_compile(ctx, v, &s, &g));
    CHECK(g && matches(g, "<tool_call>\n{\"a\":1}\n</tool_call>"));
    CHECK(g && !matches(g, "{\"a\":1}"));
    ts_grammar_unref(g);
    g = compile(v, TS_GRAMMAR_JSON_SCHEMA,
                "{\"type\":\"object\",\"properties\":{\"a\":{\"const\":1}},"
                "\"required\":[\"a\"]}");
    ts_matcher *m = NULL;
    CHECK_OK(ctx, ts_matcher_new(ctx, g, &m));
    CHECK(!ts_matcher_can_end(m) && !ts_matcher_done(m));
    CHECK(tsg_matcher_feed(m, (const unsigned char *)"{\"a\":1", 6));
    CHECK(!ts_matcher_can_end(m));
    CHECK(tsg_matcher_feed(m, (const unsigned char *)" }", 2));
    CHECK(ts_matcher_can_end(m) && ts_matcher_done(m));
    ts_matcher_free(m);
    ts_grammar_unref(g);
}

/* integers: every value in [-1000, 1000] against the bounds */
static void test_integer_ranges(const ts_vocab *v) {
    static const long b[][2] = {{-5, 120},  {0, 0},    {7, 993},    {-999, -10},
                                {-1, 1},    {10, 100}, {-37, 1000}, {123, 129},
                                {-200, 19}, {99, 101}};
    int bad = 0;
    for (size_t k = 0; k < sizeof b / sizeof b[0]; k++) {
        char src[200];
        snprintf(src, sizeof src,
                 "{\"type\":\"integer\",\"minimum\":%ld,\"maximum\":%ld}",
                 b[k][0], b[k][1]);
        ts_grammar *g = compile(v, TS_GRAMMAR_JSON_SCHEMA, src);
        for (long x = -1000; g && x <= 1000; x++) {
            char t[24];
            snprintf(t, sizeof t, "%ld", x);
            bad += matches(g, t) != (x >= b[k][0] && x <= b[k][1]);
        }
        CHECK(g && !matches(g, "-0") && !matches(g, "00"));
        ts_grammar_unref(g);
    }
    /* one-sided: exclusive bounds */
    ts_grammar *g = compile(v, TS_GRAMMAR_JSON_SCHEMA,
                            "{\"type\":\"integer\",\"exclusiveMinimum\":-13}");
    for (long x = -1000; g && x <= 1000; x++) {
        char t[24];
        snprintf(t, sizeof t, "%ld", x);
        bad += matches(g, t) != (x > -13);
    }
    CHECK(g && matches(g, "123456789012"));
    ts_grammar_unref(g);
    CHECK(bad == 0);
}

/* ---- random walks and the reference mask ------------------------------ */

typedef struct {
    ts_grammar_kind kind;
    const char *src;
} walk_spec;

static const walk_spec walk_specs[] = {
    {TS_GRAMMAR_JSON_SCHEMA,
     "{\"type\":\"object\",\"properties\":{"
     "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},"
     "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
     "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b c\",\"é\"]},"
     "\"minItems\":1,\"maxItems\":3},"
     "\"pos\":{\"type\":\"object\",\"properties\":{"
     "\"x\":{\"type\":\"number\",\"minimum\":-10,\"exclusiveMaximum\":10},"
     "\"y\":{\"type\":[\"number\",\"null\"]}},\"required\":[\"x\",\"y\"]}},"
     "\"required\":[\"name\",\"pos\"]}"},
    {TS_GRAMMAR_JSON_SCHEMA,
     "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{"
     "\"id\":{\"type\":\"integer\",\"minimum\":-3,\"maximum\":3},"
     "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},"
     "\"required\":[\"id\",\"next\"]}},\"$ref\":\"#/$defs/node\"}"},
    {TS_GRAMMAR_JSON_SCHEMA,
     "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\","
     "\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"},\"ok\":{\"type\":\"boolean\"},"
     "\"note\":{\"type\":\"string\",\"pattern\":\"q\\\"\"}},"
     "\"required\":[\"code\",\"ok\"],\"additionalProperties\":false}"},
    {TS_GRAMMAR_JSON_SCHEMA,
     "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"integer\","
     "\"exclusiveMinimum\":5},{\"const\":{\"k\":[1,\"2\"]}},"
     "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}]},"
     "\"maxItems\":4}"},
    {TS_GRAMMAR_JSON_SCHEMA,
     "{\"type\":\"object\",\"required\":[\"k\",\"n\"],"
     "\"additionalProperties\":{\"type\":\"integer\",\"minimum\":0,"
     "\"maximum\":9}}"},
    {TS_GRAMMAR_JSON_OBJECT, NULL},
    {TS_GRAMMAR_REGEX, "(\\d{1,3}\\.){3}\\d{1,3}"},
    {TS_GRAMMAR_REGEX, "[A-Z][a-z]{0,8}( [A-Z][a-z]{0,8})*, (19|20)\\d\\d"},
};

/* the cached mask equals every token fed to the automaton */
static int reference_mismatches(ts_matcher *m, const ts_vocab *v,
                                const uint32_t *bits) {
    int bad = 0;
    for (int32_t t = 0; t < ts_vocab_size(v); t++) {
        size_t len;
        const unsigned char *b = tsg_vocab_token(v, t, &len);
        bool ref = b && tsg_matcher_try_bytes(m, b, len);
        if (ref != (bool)(bits[t >> 5] >> (t & 31) & 1)) {
            if (bad < 3)
                fprintf(stderr, "  token %d \"%.*s\": mask %d, reference %d\n",
                        t, (int)len, b ? (const char *)b : "", !ref, ref);
            bad++;
        }
    }
    return bad;
}

typedef struct {
    int walks, finished, ref_checks, ref_bad, accept_bad;
    double mask_ms, n_masks;
} walk_stats;

/* tokens whose bytes close something: preferred late in a walk */
static bool closes(const ts_vocab *v, int32_t t) {
    size_t len;
    const unsigned char *b = tsg_vocab_token(v, t, &len);
    for (size_t i = 0; b && i < len; i++)
        if (b[i] == '"' || b[i] == '}' || b[i] == ']' || b[i] == ',')
            return true;
    return false;
}

static void random_walk(const ts_vocab *v, ts_grammar *g, const walk_spec *ws,
                        int seed, int ref_every, FILE *out, walk_stats *st) {
    int32_t V = ts_vocab_size(v);
    uint32_t *bits = malloc(((size_t)V + 31) / 32 * 4);
    int32_t *allowed = malloc((size_t)V * sizeof *allowed);
    size_t cap = 1 << 14, n = 0;
    char *text = malloc(cap);
    ts_matcher *m = NULL;
    rng_state = (uint64_t)seed * 7919 + 17;
    CHECK_OK(ctx, ts_matcher_new(ctx, g, &m));
    st->walks++;
    for (int step = 0; m && step < 400; step++) {
        double t0 = now_ms();
        ts_matcher_mask(m, bits);
        st->mask_ms += now_ms() - t0, st->n_masks++;
        if (ref_every && step % ref_every == (seed * 7 + 1) % ref_every) {
            st->ref_checks++;
            st->ref_bad += reference_mismatches(m, v, bits);
        }
        int na = 0, nc = 0;
        for (int32_t t = 0; t < V; t++)
            if (bits[t >> 5] >> (t & 31) & 1)
                allowed[na++] = t;
        if (ts_matcher_can_end(m) && (na == 0 || rnd() % 4 == 0)) {
            st->finished++;
            json_t *o =
                json_pack("{s:s, s:s, s:s%}", "kind",
                          ws->kind == TS_GRAMMAR_REGEX         ? "regex"
                          : ws->kind == TS_GRAMMAR_JSON_OBJECT ? "json"
                                                               : "schema",
                          "spec", ws->src ? ws->src : "", "text", text, n);
            char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
            CHECK(line != NULL); /* the text is valid UTF-8 */
            if (line)
                fprintf(out, "%s\n", line);
            free(line);
            json_decref(o);
            break;
        }
        CHECK(na > 0); /* a live state always allows some token */
        if (!na)
            break;
        if (step > 40) { /* steer towards an end */
            for (int i = 0; i < na; i++)
                if (closes(v, allowed[i]))
                    allowed[nc++] = allowed[i];
        }
        int32_t t = allowed[rnd() % (uint32_t)(nc ? nc : na)];
        size_t len;
        const unsigned char *b = tsg_vocab_token(v, t, &len);
        if (!ts_matcher_accept(m, t)) {
            st->accept_bad++;
            break;
        }
        if (n + len + 1 > cap)
            break;
        memcpy(text + n, b, len);
        n += len;
        text[n] = 0;
    }
    ts_matcher_free(m);
    free(text);
    free(allowed);
    free(bits);
}

static void test_walks(const ts_vocab *v, const char *name, int seeds,
                       int ref_seeds, int ref_every, FILE *out) {
    walk_stats st = {0};
    double compile_ms = 0, t_start = now_ms();
    for (size_t k = 0; k < sizeof walk_specs / sizeof walk_specs[0]; k++) {
        double t0 = now_ms();
        ts_grammar *g = compile(v, walk_specs[k].kind, walk_specs[k].src);
        compile_ms += now_ms() - t0;
        for (int s = 0; g && s < seeds; s++)
            random_walk(v, g, &walk_specs[k], s, s < ref_seeds ? ref_every : 0,
                        out, &st);
        ts_grammar_unref(g);
    }
    printf(
        "%s: %d walks, %d finished, %d reference checks (%d mismatches), "
        "compile %.1f ms in all, mask %.3f ms per token on average (%.0f ms)\n",
        name, st.walks, st.finished, st.ref_checks, st.ref_bad, compile_ms,
        st.mask_ms / (st.n_masks ? st.n_masks : 1), now_ms() - t_start);
    CHECK(st.ref_bad == 0);
    CHECK(st.accept_bad == 0);
    CHECK(st.finished >= st.walks * 3 / 4);
}

/* per-token mask cost on the nested schema: the first mask (the cache
 * cold) and the steady state; compile vs the grammar cache's hit */
static void test_timing(const ts_vocab *v, const char *name) {
    ts_grammar_cache *gc = NULL;
    CHECK_OK(ctx, ts_grammar_cache_new(ctx, v, 4, &gc));
    ts_grammar_spec s = {TS_GRAMMAR_JSON_SCHEMA, walk_specs[0].src, NULL, NULL};
    ts_grammar *g = NULL, *g2 = NULL;
    bool hit = true;
    double t0 = now_ms();
    CHECK_OK(ctx, ts_grammar_cache_get(gc, ctx, &s, &g, &hit));
    double t1 = now_ms();
    CHECK(!hit);
    CHECK_OK(ctx, ts_grammar_cache_get(gc, ctx, &s, &g2, &hit));
    double t2 = now_ms();
    CHECK(hit && g == g2);
    ts_grammar_unref(g2);
    int32_t V = ts_vocab_size(v);
    uint32_t *bits = malloc(((size_t)V + 31) / 32 * 4);
    /* one fixed document, token by token (greedy: longest allowed prefix) */
    const char *doc = "{\"name\": \"Ann Lee\", \"age\": 42, \"tags\": [\"a\", "
                      "\"b c\"], \"pos\": {\"x\": -3.25, \"y\": null}}";
    double cold = 0, warm = 0;
    int steps = 0;
    for (int pass = 0; g && pass < 2; pass++) {
        ts_matcher *m = NULL;
        CHECK_OK(ctx, ts_matcher_new(ctx, g, &m));
        size_t at = 0, dl = strlen(doc);
        while (m && at < dl) {
            double a = now_ms();
            ts_matcher_mask(m, bits);
            *(pass ? &warm : &cold) += now_ms() - a;
            int32_t best = -1;
            size_t best_len = 0;
            for (int32_t t = 0; t < V; t++) {
                size_t len;
                const unsigned char *b = tsg_vocab_token(v, t, &len);
                if ((bits[t >> 5] >> (t & 31) & 1) && len > best_len &&
                    at + len <= dl && !memcmp(b, doc + at, len))
                    best = t, best_len = len;
            }
            CHECK(best >= 0);
            if (best < 0 || !ts_matcher_accept(m, best))
                break;
            at += best_len;
            steps += pass;
        }
        CHECK(m && ts_matcher_done(m));
        ts_matcher_free(m);
    }
    int rules, els, entries;
    tsg_grammar_stats(g, &rules, &els, &entries);
    printf("%s (V=%d): compile %.2f ms, cache hit %.4f ms; %d rules, %d "
           "elements, %d mask entries; mask per token: %.3f ms with the "
           "entries made on the way (first document), %.3f ms after "
           "(%d tokens)\n",
           name, V, t1 - t0, t2 - t1, rules, els, entries,
           cold / (steps ? steps : 1), warm / (steps ? steps : 1), steps);
    free(bits);
    ts_grammar_unref(g);
    ts_grammar_cache_free(gc);
}

/* ---- errors ----------------------------------------------------------- */

static void expect_error(const ts_vocab *v, ts_grammar_kind k, const char *src,
                         const char *needle) {
    ts_grammar_spec s = {.kind = k, .src = src};
    ts_grammar *g = NULL;
    ts_status st = ts_grammar_compile(ctx, v, &s, &g);
    ts_test_checks++;
    if (st != TS_ERR_INVALID_ARG || g) {
        ts_test_failures++;
        fprintf(stderr, "should fail (%s): %.80s\n", ts_status_name(st), src);
        ts_grammar_unref(g);
        return;
    }
    CHECK_MSG(ctx, needle);
}

/* 100000 quantifiers on one atom: refused at the second, never a stack
 * overflow (each used to nest a repetition, lowered by recursion) */
static void test_stacked_quantifiers(const ts_vocab *v) {
    enum { N = 100000 };
    char *src = malloc(3 * N + 64);
    char *o = src + sprintf(src, "a");
    for (int i = 0; i < N; i++)
        o += sprintf(o, "{1}");
    expect_error(v, TS_GRAMMAR_REGEX, src,
                 "quantifier on a quantifier at offset 4 of");
    o = src + sprintf(src, "root ::= \"a\"");
    for (int i = 0; i < N; i++)
        o += sprintf(o, "{1}");
    expect_error(v, TS_GRAMMAR_EBNF, src,
                 "quantifier on a quantifier at offset 15 (line 1)");
    o = src + sprintf(src, "{\"type\":\"string\",\"pattern\":\"a");
    memset(o, '*', N);
    strcpy(o + N, "\"}");
    expect_error(v, TS_GRAMMAR_JSON_SCHEMA, src,
                 "bad \"pattern\" at /: regex: a quantifier on a quantifier "
                 "at offset 2");
    free(src);
    expect_error(v, TS_GRAMMAR_REGEX, "a+*", "quantifier on a quantifier");
    expect_error(v, TS_GRAMMAR_REGEX, "a{2}?{3}", "quantifier on a quantifier");
    expect_error(v, TS_GRAMMAR_EBNF, "root ::= [a-z]+?", "on a quantifier");
    /* a group between them is not stacking; lazy forms are one quantifier */
    expect(v, TS_GRAMMAR_REGEX, "(?:a{2})*b??c+?", L("c", "aaaabcc"),
           L("ac", "bb"));
    expect(v, TS_GRAMMAR_EBNF, "root ::= (\"a\"{2})* \"b\"?",
           L("", "aab", "aaaa"), L("a", "bb"));

    /* the lowering's own bound, for trees no front end makes */
    gbuild b;
    gb_init(&b);
    int r = gb_rule(&b, "deep");
    gx *x = gx_str(&b, "a");
    for (int i = 0; i < N; i++)
        x = gx_rep(&b, x, 1, 1);
    gb_define(&b, r, x);
    ts_grammar g = {0};
    ts_test_checks++;
    if (tsg_lower(ctx, &b, &g) != TS_ERR_INVALID_ARG) {
        ts_test_failures++;
        fprintf(stderr, "a tree 100000 deep should be refused\n");
    } else
        CHECK_MSG(ctx, "rule \"deep\" nests expressions deeper than 256");
    gb_free(&b);
}

/* 30000 rules, each the left corner of the one before: parsed (rule
 * names hashed) and checked for left recursion (both were quadratic: about
 * 11 s for this grammar; 0.15 s now). The time is printed, not checked
 * (timed tests flake on a shared machine); with one cycle it is refused */
static void test_long_chain(const ts_vocab *v) {
    enum { N = 30000 };
    char *src = malloc((size_t)N * 32 + 64), *o = src;
    o += sprintf(o, "root ::= r0\n");
    for (int i = 0; i < N; i++)
        o += sprintf(o, "r%d ::= r%d \"x\"\n", i, i + 1);
    sprintf(o, "r%d ::= \"y\"\n", N);
    double t0 = now_ms();
    ts_grammar *g = compile(v, TS_GRAMMAR_EBNF, src);
    double t1 = now_ms();
    char *text = malloc(N + 2);
    text[0] = 'y';
    memset(text + 1, 'x', N);
    text[N + 1] = 0;
    CHECK(g && matches(g, text) && !matches(g, "yxxx"));
    free(text);
    ts_grammar_unref(g);
    sprintf(o, "r%d ::= \"y\" | r7 \"z\"\n", N);
    expect_error(v, TS_GRAMMAR_EBNF, src, "is left-recursive");
    printf("EBNF chain of %d rules: compiled in %.1f ms\n", N, t1 - t0);
    free(src);
}

static void test_errors(const ts_vocab *v) {
    ts_grammar_kind S = TS_GRAMMAR_JSON_SCHEMA, R = TS_GRAMMAR_REGEX,
                    E = TS_GRAMMAR_EBNF;
    expect_error(v, S,
                 "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                 "\"string\",\"patternProperties\":{}}}}",
                 "unsupported keyword \"patternProperties\" at "
                 "/properties/a");
    expect_error(v, S, "{\"oneOf\":[{\"type\":\"string\"}]}",
                 "unsupported keyword \"oneOf\" at /");
    expect_error(v, S, "{\"type\":\"array\",\"items\":{\"uniqueItems\":true}}",
                 "\"uniqueItems\" at /items");
    expect_error(v, S, "{\"$ref\":\"#/$defs/nope\"}",
                 "\"#/$defs/nope\" at / points to nothing");
    expect_error(v, S, "{\"$ref\":\"http://x/y.json\"}", "local references");
    expect_error(v, S, "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}",
                 "no integer");
    expect_error(v, S,
                 "{\"type\":\"number\",\"exclusiveMinimum\":0,"
                 "\"maximum\":0}",
                 "no number lies within the bounds at /");
    expect_error(v, S, "{\"type\":\"number\",\"minimum\":0.5}",
                 "non-integer bound");
    expect_error(v, S,
                 "{\"type\":\"object\",\"properties\":{},"
                 "\"required\":[\"q\"]}",
                 "required property \"q\"");
    expect_error(v, S,
                 "{\"type\":\"object\",\"required\":[\"a\"],"
                 "\"additionalProperties\":false}",
                 "required property \"a\" at / is not in \"properties\", and "
                 "\"additionalProperties\" is false");
    expect_error(v, S, "{\"type\":\"object\",\"required\":[1]}",
                 "\"required\" at / holds a non-string");
    expect_error(v, S,
                 "{\"$ref\":\"#/$defs/s\",\"maxLength\":3,"
                 "\"$defs\":{\"s\":{\"type\":\"string\"}}}",
                 "unsupported keyword combination \"$ref\" + \"maxLength\" "
                 "at /");
    expect_error(v, S,
                 "{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":"
                 "[\"x\",3],\"type\":\"string\"}}}",
                 "unsupported keyword combination \"enum\" + \"type\" at "
                 "/properties/a: the value 3 is not of that type");
    expect_error(v, S, "{\"enum\":[\"ab\"],\"maxLength\":1}",
                 "combination \"enum\" + \"maxLength\" at /");
    expect_error(v, S, "{\"const\":\"ab\",\"pattern\":\"b\"}",
                 "combination \"const\" + \"pattern\" at /");
    expect_error(v, S,
                 "{\"anyOf\":[{\"type\":\"string\"}],\"type\":\"string\"}",
                 "combination \"anyOf\" + \"type\" at /");
    expect_error(v, S, "{\"type\":\"strin\"}", "unknown type \"strin\"");
    expect_error(v, S, "{\"type\":", "not valid JSON");
    expect_error(v, S, "{\"type\":\"string\",\"pattern\":\"(a\"}",
                 "bad \"pattern\" at /");
    expect_error(v, R, "(ab", "missing ')'");
    expect_error(v, R, "a{3,1}", "n < m");
    expect_error(v, R, "[z-a]", "reversed range");
    expect_error(v, R, "(?=x)y", "lookaround");
    expect_error(v, R, "(a)\\1", "backreferences");
    expect_error(v, R, "a\\bb", "word boundaries");
    expect_error(v, R, "*a", "nothing to repeat");
    expect_error(v, R, "a{100001}", "over 100000");
    expect_error(v, R, "a{20000}", "too large");
    expect_error(v, E, "root ::= (\"a\"", "missing ')'");
    expect_error(v, E, "root ::= foo", "\"foo\" is used but not defined");
    expect_error(v, E, "a ::= \"x\"", "no `root");
    expect_error(v, E, "root ::= root \"x\" | \"y\"", "left-recursive");
    expect_error(v, E, "root ::= a\na ::= b \"x\"\nb ::= \"\" | a",
                 "left-recursive");
    expect_error(v, E, "root ::= a\na ::= b \"x\"\nb ::= \"\" | a",
                 "rule \"a\" is left-recursive (it reaches itself before "
                 "reading a byte: a -> b -> a)");
    expect_error(v, E, "root ::= \"a\"* root \"b\" | \"c\"", "root -> root");
    /* cycles of tail references push nothing: they compile */
    expect(v, E, "root ::= x\nx ::= \"a\" | y\ny ::= x", L("a"), L("", "aa"));
    expect(v, E, "root ::= (\"a\"?)* \"b\"", L("b", "aab"), L("", "ba"));
    test_long_chain(v);
    expect_error(v, E, "root ::= \"x\" \nroot ::= \"y\"", "defined twice");
    expect_error(v, E, "root ::= \"abc", "unterminated");
    expect_error(v, E, "root = \"a\"", "expected `name ::=`");

    /* deep nesting is bounded, recursion through $ref is not an error */
    size_t n = 200 * 32;
    char *deep = malloc(n + 64), *o = deep;
    for (int i = 0; i < 100; i++)
        o += sprintf(o, "{\"type\":\"array\",\"items\":");
    o += sprintf(o, "true");
    for (int i = 0; i < 100; i++)
        *o++ = '}';
    *o = 0;
    expect_error(v, S, deep, "nesting deeper than 64");
    o = deep;
    for (int i = 0; i < 150; i++)
        *o++ = '(';
    *o++ = 'a';
    for (int i = 0; i < 150; i++)
        *o++ = ')';
    *o = 0;
    expect_error(v, R, deep, "nested too deeply");
    free(deep);

    test_stacked_quantifiers(v);

    /* a huge enum compiles */
    size_t cap = 5000 * 16 + 64, k = 0;
    char *big = malloc(cap);
    k += (size_t)sprintf(big, "{\"enum\":[");
    for (int i = 0; i < 5000; i++)
        k += (size_t)sprintf(big + k, "%s\"w%d\"", i ? "," : "", i * 7);
    sprintf(big + k, "]}");
    ts_grammar *g = compile(v, S, big);
    CHECK(g && matches(g, "\"w34993\"") && !matches(g, "\"w34994\""));
    /* its 5000 leaves' masks: each entry ORed once, equal to the reference */
    ts_matcher *m = NULL;
    uint32_t *bits = malloc(((size_t)ts_vocab_size(v) + 31) / 32 * 4);
    if (g && !ts_matcher_new(ctx, g, &m)) {
        double t0 = now_ms();
        ts_matcher_mask(m, bits);
        double t1 = now_ms();
        ts_matcher_mask(m, bits);
        double t2 = now_ms();
        CHECK(reference_mismatches(m, v, bits) == 0);
        CHECK(tsg_matcher_feed(m, (const unsigned char *)"\"w3", 3));
        ts_matcher_mask(m, bits);
        CHECK(reference_mismatches(m, v, bits) == 0);
        printf("enum of 5000: first mask %.2f ms, then %.3f ms\n", t1 - t0,
               t2 - t1);
    }
    ts_matcher_free(m);
    free(bits);
    ts_grammar_unref(g);
    /* past the start's limit: refused when compiled, naming the limit */
    k = (size_t)sprintf(big, "{\"enum\":[");
    for (int i = 0; i < 9000 && k + 16 < cap; i++)
        k += (size_t)sprintf(big + k, "%s%d", i ? "," : "", i);
    sprintf(big + k, "]}");
    expect_error(v, S, big,
                 "alternatives may begin the text, more than the "
                 "limit of 8192");
    free(big);
}

/* random bytes as grammars: errors or grammars, never a crash or a hang */
static void test_fuzz(const ts_vocab *v) {
    static const char alphabet[] = "()[]{}|*+?.^$\\-,:\"'#=aZ09 \n\xc3\xa9/~";
    static const char *const pieces[] = {"root ::= ",
                                         "{\"type\":",
                                         "\"properties\":",
                                         "{\"$ref\":\"#\"}",
                                         "\"anyOf\":[",
                                         "\"items\":",
                                         "::=",
                                         "[^",
                                         "\\d",
                                         "{2,3}",
                                         "\"string\"",
                                         "\"integer\"",
                                         "]",
                                         "}",
                                         ",",
                                         "\"minimum\":-7"};
    rng_state = 12345;
    int compiled = 0;
    for (int it = 0; it < 600; it++) {
        char src[96];
        int n = 0, len = 1 + (int)(rnd() % 60);
        while (n < len && n < 80) {
            if (rnd() % 3 == 0) {
                const char *p =
                    pieces[rnd() % (sizeof pieces / sizeof *pieces)];
                size_t pl = strlen(p);
                if (n + (int)pl >= 90)
                    break;
                memcpy(src + n, p, pl);
                n += (int)pl;
            } else
                src[n++] = alphabet[rnd() % (sizeof alphabet - 1)];
        }
        src[n] = 0;
        ts_grammar_spec s = {.kind = (ts_grammar_kind)(2 + it % 3), .src = src};
        ts_grammar *g = NULL;
        if (ts_grammar_compile(ctx, v, &s, &g) == TS_OK) {
            compiled++;
            ts_matcher *m = NULL;
            if (!ts_matcher_new(ctx, g, &m)) {
                uint32_t *bits =
                    malloc(((size_t)ts_vocab_size(v) + 31) / 32 * 4);
                for (int step = 0; step < 3; step++) {
                    ts_matcher_mask(m, bits);
                    int32_t t = (int32_t)(rnd() % (uint32_t)ts_vocab_size(v));
                    ts_matcher_accept(m, t);
                }
                free(bits);
                ts_matcher_free(m);
            }
            ts_grammar_unref(g);
        }
    }
    printf("fuzz: 600 random sources, %d compiled\n", compiled);
    CHECK(compiled > 0);
}

/* ---- threads ---------------------------------------------------------- */

typedef struct {
    ts_grammar *g;
    const ts_vocab *v;
    uint64_t seed;
    char text[2048];
} thread_walk;

/* a walk with its own generator: the same texts whichever thread runs it
 * and whatever the shared mask entries' state */
static void *walk_thread(void *arg) {
    thread_walk *w = arg;
    int32_t V = ts_vocab_size(w->v);
    uint32_t *bits = malloc(((size_t)V + 31) / 32 * 4);
    ts_matcher *m = NULL;
    size_t n = 0;
    uint64_t r = w->seed * 2654435761u + 1;
    w->text[0] = 0;
    if (!bits || ts_matcher_new(NULL, w->g, &m)) {
        free(bits);
        return NULL;
    }
    for (int step = 0; step < 60 && !ts_matcher_done(m); step++) {
        ts_matcher_mask(m, bits);
        int32_t na = 0, pick;
        for (int32_t t = 0; t < V; t++)
            na += bits[t >> 5] >> (t & 31) & 1;
        if (!na)
            break;
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        pick = (int32_t)((r >> 33) % (uint64_t)na);
        for (int32_t t = 0; t < V; t++)
            if ((bits[t >> 5] >> (t & 31) & 1) && pick-- == 0) {
                size_t len;
                const unsigned char *b = tsg_vocab_token(w->v, t, &len);
                if (!ts_matcher_accept(m, t) || n + len >= sizeof w->text)
                    step = 1 << 20;
                else
                    memcpy(w->text + n, b, len), n += len, w->text[n] = 0;
                break;
            }
    }
    ts_matcher_free(m);
    free(bits);
    return NULL;
}

typedef struct {
    ts_grammar_cache *gc;
    const ts_vocab *v;
    ts_grammar *g;
} cache_race;

static void *cache_thread(void *arg) {
    cache_race *r = arg;
    ts_grammar_spec s = {TS_GRAMMAR_EBNF, "root ::= [a-z]+ \"!\"", NULL, NULL};
    if (ts_grammar_cache_get(r->gc, NULL, &s, &r->g, NULL))
        r->g = NULL;
    return NULL;
}

/* one spec compiled by four threads at once: whichever compiles race to
 * insert, all get the one cached grammar (its mask entries shared) */
static void test_cache_race(const ts_vocab *v) {
    enum { T = 4 };
    ts_grammar_cache *gc = NULL;
    CHECK_OK(ctx, ts_grammar_cache_new(ctx, v, 4, &gc));
    cache_race r[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        r[i] = (cache_race){gc, v, NULL};
        CHECK(pthread_create(&th[i], NULL, cache_thread, &r[i]) == 0);
    }
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < T; i++) {
        CHECK(r[i].g && r[i].g == r[0].g);
        ts_grammar_unref(r[i].g);
    }
    ts_grammar_cache_free(gc);
}

/* matchers of one grammar on four threads, the entries made concurrently,
 * give the texts of a single-threaded run */
static void test_threads(const ts_vocab *v) {
    enum { T = 4 };
    thread_walk seq[T], par[T];
    ts_grammar *g1 = compile(v, TS_GRAMMAR_JSON_SCHEMA, walk_specs[0].src);
    ts_grammar *g2 = compile(v, TS_GRAMMAR_JSON_SCHEMA, walk_specs[0].src);
    if (!g1 || !g2)
        return;
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        seq[i] = (thread_walk){.g = g1, .v = v, .seed = (uint64_t)i};
        walk_thread(&seq[i]);
        par[i] = (thread_walk){.g = g2, .v = v, .seed = (uint64_t)i};
    }
    for (int i = 0; i < T; i++)
        CHECK(pthread_create(&th[i], NULL, walk_thread, &par[i]) == 0);
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < T; i++)
        CHECK(seq[i].text[0] && !strcmp(seq[i].text, par[i].text));
    ts_grammar_unref(g1);
    ts_grammar_unref(g2);
}

int main(int argc, char **argv) {
    ctx = test_ctx();
    const char *src_dir = argc > 1 ? argv[1] : ".";
    const char *qwen = argc > 2 ? argv[2] : "";
    const char *out_dir = argc > 3 ? argv[3] : ".";
    char path[1024];
    snprintf(path, sizeof path, "%s/models/kjv-qwen3", src_dir);
    ts_tokenizer *tok = NULL;
    ts_vocab *v = NULL;
    CHECK_OK(ctx, ts_tokenizer_load(ctx, path, &tok));
    CHECK_OK(ctx, ts_vocab_new(ctx, tok, &v));
    if (!v)
        return 1;
    double t0 = now_ms();
    test_known_answers(v);
    test_integer_ranges(v);
    double t1 = now_ms();
    test_errors(v);
    test_fuzz(v);
    test_threads(v);
    test_cache_race(v);
    printf("known answers %.0f ms, errors and fuzz %.0f ms\n", t1 - t0,
           now_ms() - t1);
    char walks[1100];
    snprintf(walks, sizeof walks, "%s/grammar_walks.jsonl", out_dir);
    FILE *out = fopen(walks, "w");
    CHECK(out != NULL);
    if (out) {
        test_walks(v, "kjv-qwen3 (4k)", 20, 20, 20, out);
        ts_tokenizer *qt = NULL;
        ts_vocab *qv = NULL;
        FILE *qf = fopen(qwen, "r");
        if (qf) {
            fclose(qf);
            CHECK_OK(ctx, ts_tokenizer_load(ctx, qwen, &qt));
            CHECK_OK(ctx, ts_vocab_new(ctx, qt, &qv));
        } else
            printf("Qwen3 tokenizer.json not found (%s): its part skipped\n",
                   qwen);
        if (qv) {
            test_walks(qv, "qwen3 (151k)", 3, 1, 400,
                       out); /* 1 check a grammar */
            test_timing(qv, "qwen3");
        }
        test_timing(v, "kjv-qwen3");
        ts_vocab_free(qv);
        ts_tokenizer_free(qt);
        fclose(out);
        char cmd[2400];
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 %s/tests/grammar_check.py %s", src_dir,
                 walks);
        ts_test_checks++;
        if (system(cmd) != 0) {
            ts_test_failures++;
            fprintf(stderr, "grammar_check.py found texts that do not match\n");
        }
    }
    ts_vocab_free(v);
    ts_tokenizer_free(tok);
    ts_ctx_free(ctx);
    printf("test_grammar: %d checks, %d failures\n", ts_test_checks,
           ts_test_failures);
    return ts_test_failures ? 1 : 0;
}
