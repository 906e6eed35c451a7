/* structured.c — structured outputs on the server's side (structured.h):
 * which request field asks for which grammar, the one vocabulary and
 * grammar cache of the server, and the matcher-as-constraint glue. The
 * grammars themselves are src/engine/grammar*.c's. Compiling runs on
 * connection threads with no lock of ours held: the cache looks up and
 * inserts under its own lock and compiles outside it (a racing insert of
 * the same spec keeps the first), and each compile has a ts_ctx of its own
 * for its error, so one slow grammar holds up no other request. */
#include "structured.h"

#include "core/core.h"
#include "core/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GRAMMAR_CACHE_CAP 64

static struct {
    ts_ctx *ctx; /* init's */
    ts_vocab *vocab;
    ts_grammar_cache *cache;
} so;

/* A context for errors only: it leaves the thread pool as it is (ts_ctx_new
 * applies its thread count to the whole process) and, running no ops, has
 * no TS_PROFILE report to print when freed. */
static ts_ctx *ctx_new(void) {
    ts_ctx *ctx = NULL;
    ts_ctx_options o = {.num_threads = ts_threads_count()};
    if (ts_ctx_new(&ctx, &o) != TS_OK)
        return NULL;
    ctx->profile = false;
    return ctx;
}

int so_init(ts_tokenizer *tok, char *err, size_t cap) {
    if (!(so.ctx = ctx_new())) {
        snprintf(err, cap, "structured outputs: cannot create a context");
        return 1;
    }
    if (ts_vocab_new(so.ctx, tok, &so.vocab) != TS_OK ||
        ts_grammar_cache_new(so.ctx, so.vocab, GRAMMAR_CACHE_CAP, &so.cache) !=
            TS_OK) {
        snprintf(err, cap, "structured outputs: %s", ts_errmsg(so.ctx));
        so_fini();
        return 1;
    }
    return 0;
}

void so_fini(void) {
    if (!so.ctx)
        return;
    ts_grammar_cache_free(so.cache);
    ts_vocab_free(so.vocab);
    ts_ctx_free(so.ctx);
    memset(&so, 0, sizeof so);
}

static int bad(ts_prompt_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(ts_prompt_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    e->status = 400;
    e->param = param;
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

char *so_choice_regex(json_t *choices) {
    ts_sbuf b = {0};
    size_t i;
    json_t *s;
    ts_sb_add(&b, "(", 1);
    json_array_foreach(choices, i, s) {
        if (i)
            ts_sb_add(&b, "|", 1);
        const char *p = json_string_value(s);
        for (size_t k = 0; k < json_string_length(s); k++) {
            if (strchr("\\^$.|?*+()[]{}", p[k]))
                ts_sb_add(&b, "\\", 1);
            ts_sb_add(&b, p + k, 1);
        }
    }
    ts_sb_add(&b, ")", 1);
    return b.p;
}

/* src of kind from v (a string, or for a schema an object dumped); 0 ok */
static int take(so_request *q, const char *field, ts_grammar_kind kind,
                json_t *v, ts_prompt_error *err) {
    q->spec.kind = kind;
    q->field = field;
    if (kind == TS_GRAMMAR_JSON_OBJECT)
        return 0;
    if (kind == TS_GRAMMAR_JSON_SCHEMA && json_is_object(v))
        q->src = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
    else if (kind == TS_GRAMMAR_JSON_SCHEMA && json_is_boolean(v))
        q->src = strdup(json_is_true(v) ? "true" : "false");
    else if (json_is_string(v) && json_string_length(v))
        q->src = strdup(json_string_value(v));
    else if (kind == TS_GRAMMAR_REGEX && json_is_array(v)) { /* a choice */
        size_t i;
        json_t *s;
        if (!json_array_size(v))
            return bad(err, field, "%s: must be a non-empty list of strings",
                       field);
        json_array_foreach(v, i, s) {
            if (!json_is_string(s))
                return bad(err, field,
                           "%s: must be a non-empty list of strings", field);
        }
        q->src = so_choice_regex(v);
    } else
        return bad(err, field, "%s: must be %s", field,
                   kind == TS_GRAMMAR_JSON_SCHEMA ? "a JSON schema (an object)"
                                                  : "a non-empty string");
    if (!q->src)
        return bad(err, field, "%s: out of memory", field);
    q->spec.src = q->src;
    return 0;
}

static int response_format(json_t *rf, so_request *q, ts_prompt_error *err) {
    const char *t = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !t)
        return bad(err, "response_format",
                   "response_format: must be an object with a type");
    if (!strcmp(t, "text"))
        return 0;
    if (!strcmp(t, "json_object"))
        return take(q, "response_format", TS_GRAMMAR_JSON_OBJECT, NULL, err)
                   ? -1
                   : 1;
    if (strcmp(t, "json_schema"))
        return bad(err, "response_format",
                   "response_format: unsupported type \"%s\" (text, "
                   "json_object and json_schema are)",
                   t);
    json_t *js = json_object_get(rf, "json_schema");
    json_t *schema = json_object_get(js, "schema");
    if (!json_is_object(js) || !schema)
        return bad(err, "response_format",
                   "response_format: json_schema needs a \"schema\"");
    return take(q, "response_format", TS_GRAMMAR_JSON_SCHEMA, schema, err) ? -1
                                                                           : 1;
}

static int structured_outputs(json_t *so_, so_request *q,
                              ts_prompt_error *err) {
    if (!json_is_object(so_))
        return bad(err, "structured_outputs",
                   "structured_outputs: must be an object");
    const char *k;
    json_t *v;
    int found = 0;
    json_object_foreach(so_, k, v) {
        ts_grammar_kind kind;
        if (json_is_null(v) || (json_is_false(v) && !strcmp(k, "json_object")))
            continue;
        if (!strcmp(k, "json"))
            kind = TS_GRAMMAR_JSON_SCHEMA;
        else if (!strcmp(k, "regex") || !strcmp(k, "choice"))
            kind = TS_GRAMMAR_REGEX;
        else if (!strcmp(k, "grammar"))
            kind = TS_GRAMMAR_EBNF;
        else if (!strcmp(k, "json_object"))
            kind = TS_GRAMMAR_JSON_OBJECT;
        else
            return bad(err, "structured_outputs",
                       "structured_outputs: unsupported field \"%s\" (json, "
                       "regex, grammar, choice and json_object are)",
                       k);
        if (found++)
            return bad(err, "structured_outputs",
                       "structured_outputs: give one of json, regex, "
                       "grammar, choice, json_object");
        if (!strcmp(k, "choice") && !json_is_array(v))
            return bad(err, "structured_outputs",
                       "structured_outputs: choice must be a list of strings");
        if (!strcmp(k, "regex") && !json_is_string(v))
            return bad(err, "structured_outputs",
                       "structured_outputs: regex must be a string");
        if (take(q, "structured_outputs", kind, v, err))
            return -1;
    }
    return found ? 1 : 0;
}

int so_parse(json_t *body, so_request *out, ts_prompt_error *err) {
    static const struct {
        const char *field;
        ts_grammar_kind kind;
    } guided[] = {{"guided_json", TS_GRAMMAR_JSON_SCHEMA},
                  {"guided_regex", TS_GRAMMAR_REGEX},
                  {"guided_grammar", TS_GRAMMAR_EBNF},
                  {"guided_choice", TS_GRAMMAR_REGEX}};
    memset(out, 0, sizeof *out);
    const char *first = NULL;
    int got = 0;
    json_t *v = json_object_get(body, "response_format");
    if (v && !json_is_null(v)) {
        got = response_format(v, out, err);
        if (got < 0)
            return -1;
        if (got)
            first = "response_format";
    }
    for (size_t i = 0; i < sizeof guided / sizeof *guided; i++) {
        v = json_object_get(body, guided[i].field);
        if (!v || json_is_null(v))
            continue;
        if (first)
            goto two;
        bool choice = !strcmp(guided[i].field, "guided_choice");
        if ((choice && !json_is_array(v)) ||
            (!strcmp(guided[i].field, "guided_regex") && !json_is_string(v)))
            return bad(err, guided[i].field, "%s: must be %s", guided[i].field,
                       choice ? "a list of strings" : "a string");
        if (take(out, guided[i].field, guided[i].kind, v, err))
            return -1;
        first = guided[i].field, got = 1;
    }
    v = json_object_get(body, "structured_outputs");
    if (v && !json_is_null(v)) {
        if (first)
            goto two;
        got = structured_outputs(v, out, err);
    }
    if (got < 0)
        so_request_free(out);
    return got;
two:
    so_request_free(out);
    return bad(err, first,
               "%s: give one structured-output field (response_format, "
               "guided_json, guided_regex, guided_grammar, guided_choice or "
               "structured_outputs)",
               first);
}

void so_request_free(so_request *q) {
    free(q->src);
    memset(q, 0, sizeof *q);
}

int so_compile(const ts_grammar_spec *spec, const char *field, ts_grammar **g,
               ts_prompt_error *err) {
    *g = NULL;
    if (!so.cache)
        return bad(err, field, "%s: structured outputs are not available",
                   field);
    ts_ctx *ctx = ctx_new();
    if (!ctx)
        return bad(err, field, "%s: out of memory", field);
    ts_status st = ts_grammar_cache_get(so.cache, ctx, spec, g, NULL);
    if (st != TS_OK)
        bad(err, field, "%s: %s", field, ts_errmsg(ctx));
    ts_ctx_free(ctx);
    return st == TS_OK ? 0 : -1;
}

/* ---- a matcher as the engine's constraint ---- */

static void c_mask(void *s, uint32_t *bits) {
    ts_matcher_mask(s, bits);
}
static bool c_accept(void *s, int32_t t) {
    return ts_matcher_accept(s, t);
}
static bool c_can_end(const void *s) {
    return ts_matcher_can_end(s);
}
static bool c_done(const void *s) {
    return ts_matcher_done(s);
}
static void c_free(void *s) {
    ts_matcher_free(s);
}

bool so_constraint(ts_grammar *g, ts_constraint *out) {
    ts_matcher *m = NULL; /* its only error is out of memory: no context */
    if (ts_matcher_new(NULL, g, &m) != TS_OK || !m)
        return false;
    *out = (ts_constraint){.state = m,
                           .mask = c_mask,
                           .accept = c_accept,
                           .can_end = c_can_end,
                           .done = c_done,
                           .free = c_free,
                           .n_tokens = ts_vocab_size(so.vocab)};
    return true;
}
