/* grammar_ebnf.c — GBNF-style grammars (llama.cpp's, vLLM's
 * guided_grammar in that dialect) to grammar trees: `name ::= alternatives`
 * rules (a rule runs until the next `name ::=`), "literals" with escapes,
 * [classes], `.` (any character), ( groups ), | and the postfix * + ?
 * {m} {m,} {m,n}; # comments. The start is `root`. Left recursion is
 * refused when the grammar is compiled (grammar.c). */
#include "grammar_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#define MAX_NESTING 100

typedef struct {
    ts_ctx *ctx;
    gbuild *b;
    const char *src;
    size_t i, n;
    int line, depth;
    bool *defined;
    int cap_defined;
    ts_status st;
} eb;

static int line_at(const eb *e) {
    int line = 1;
    for (size_t k = 0; k < e->i && k < e->n; k++)
        line += e->src[k] == '\n';
    return line;
}

static gx *eb_fail(eb *e, const char *what) {
    if (!e->st)
        e->st = ts_set_error(e->ctx, TS_ERR_INVALID_ARG,
                             "grammar: %s at line %d", what, line_at(e));
    return NULL;
}

static void skip_space(eb *e) {
    while (e->i < e->n) {
        char c = e->src[e->i];
        if (c == '#')
            while (e->i < e->n && e->src[e->i] != '\n')
                e->i++;
        else if (isspace((unsigned char)c))
            e->i++;
        else
            break;
    }
}

static bool name_char(char c) {
    return isalnum((unsigned char)c) || c == '_' || c == '-';
}

static size_t name_len(const eb *e, size_t at) {
    size_t k = at;
    while (k < e->n && name_char(e->src[k]))
        k++;
    return k - at;
}

/* at a `name ::=`: the next rule starts here */
static bool at_rule_start(eb *e) {
    size_t l = name_len(e, e->i), k = e->i + l;
    if (!l)
        return false;
    while (k < e->n && (e->src[k] == ' ' || e->src[k] == '\t'))
        k++;
    return !strncmp(e->src + k, "::=", 3);
}

static int rule_of(eb *e, const char *name, size_t len) {
    char buf[128];
    if (len >= sizeof buf)
        return eb_fail(e, "a rule name longer than 127 bytes"), -1;
    memcpy(buf, name, len);
    buf[len] = 0;
    int r = gb_find(e->b, buf);
    return r >= 0 ? r : gb_rule(e->b, buf);
}

static gx *parse_alts(eb *e);

static gx *parse_literal(eb *e) {
    e->i++; /* '"' */
    gx *s = gx_seq(e->b);
    while (!e->st) {
        if (e->i >= e->n || e->src[e->i] == '\n')
            return eb_fail(e, "an unterminated \"literal\"");
        char c = e->src[e->i];
        if (c == '"') {
            e->i++;
            break;
        }
        if (c == '\\') {
            e->i++;
            ts_status st;
            int32_t v = tsg_regex_escape(e->ctx, e->src, &e->i, &st);
            if (st) {
                e->st = st;
                return NULL;
            }
            uint32_t r[2] = {(uint32_t)v, (uint32_t)v};
            gx_add(e->b, s, gx_class(e->b, r, 1, false));
        } else {
            /* raw bytes of the source (UTF-8 kept as written) */
            gx_add(e->b, s, gx_lit(e->b, e->src + e->i, 1));
            e->i++;
        }
    }
    return s;
}

static gx *parse_postfix(eb *e, gx *x) {
    for (;;) {
        if (e->i >= e->n)
            return x;
        char c = e->src[e->i];
        int min, max;
        if (c == '*')
            min = 0, max = -1, e->i++;
        else if (c == '+')
            min = 1, max = -1, e->i++;
        else if (c == '?')
            min = 0, max = 1, e->i++;
        else if (c == '{') {
            e->i++;
            char *end;
            long a = strtol(e->src + e->i, &end, 10);
            if (end == e->src + e->i || a < 0 || a > 100000)
                return eb_fail(e, "a bad {m,n} repetition");
            long b = a;
            e->i = (size_t)(end - e->src);
            if (e->src[e->i] == ',') {
                e->i++;
                b = strtol(e->src + e->i, &end, 10);
                if (end == e->src + e->i)
                    b = -1;
                e->i = (size_t)(end - e->src);
            }
            if (e->src[e->i] != '}' || b > 100000 || (b >= 0 && b < a))
                return eb_fail(e, "a bad {m,n} repetition");
            e->i++;
            min = (int)a, max = (int)b;
        } else
            return x;
        /* "a"{1}{1}... would nest one repetition per quantifier (and
         * recurse as deep when lowered) */
        if (e->i < e->n && strchr("*+?{", e->src[e->i])) {
            if (!e->st)
                e->st = ts_set_error(e->ctx, TS_ERR_INVALID_ARG,
                                     "grammar: a quantifier on a quantifier "
                                     "at offset %zu (line %d)",
                                     e->i, line_at(e));
            return NULL;
        }
        x = gx_rep(e->b, x, min, max);
    }
}

static gx *parse_seq(eb *e) {
    gx *s = gx_seq(e->b);
    for (;;) {
        skip_space(e);
        if (e->st || e->i >= e->n || e->src[e->i] == '|' ||
            e->src[e->i] == ')' || at_rule_start(e))
            return s;
        char c = e->src[e->i];
        gx *x;
        if (c == '"')
            x = parse_literal(e);
        else if (c == '[') {
            ts_status st;
            x = tsg_regex_class(e->ctx, e->b, e->src, &e->i, &st);
            if (st)
                e->st = st;
        } else if (c == '.') {
            e->i++;
            uint32_t none[2] = {1, 0}; /* an empty list: negated, all */
            x = gx_class(e->b, none, 0, true);
        } else if (c == '(') {
            if (++e->depth > MAX_NESTING)
                return eb_fail(e, "groups nested too deeply");
            e->i++;
            x = parse_alts(e);
            skip_space(e);
            if (!e->st && (e->i >= e->n || e->src[e->i] != ')'))
                return eb_fail(e, "a missing ')'");
            e->i++;
            e->depth--;
        } else if (name_char(c)) {
            size_t l = name_len(e, e->i);
            x = gx_ref(e->b, rule_of(e, e->src + e->i, l));
            e->i += l;
        } else
            return eb_fail(e, "an unexpected character");
        if (e->st)
            return NULL;
        s = gx_add(e->b, s, parse_postfix(e, x));
    }
}

static gx *parse_alts(eb *e) {
    gx *first = parse_seq(e);
    if (e->st || e->i >= e->n || e->src[e->i] != '|')
        return first; /* no alternation node: one level less to lower */
    gx *alt = gx_alt(e->b);
    gx_add(e->b, alt, first);
    while (!e->st && e->i < e->n && e->src[e->i] == '|') {
        e->i++;
        gx_add(e->b, alt, parse_seq(e));
    }
    return alt;
}

ts_status tsg_ebnf(ts_ctx *ctx, gbuild *b, const char *src, int *root) {
    eb e = {.ctx = ctx, .b = b, .src = src, .n = strlen(src)};
    bool *defined = NULL;
    for (;;) {
        skip_space(&e);
        if (e.st || e.i >= e.n)
            break;
        size_t l = name_len(&e, e.i);
        if (!l || !at_rule_start(&e)) {
            eb_fail(&e, "expected `name ::=`");
            break;
        }
        int r = rule_of(&e, src + e.i, l);
        if (r < 0)
            break;
        e.i += l;
        skip_space(&e);
        e.i += 3; /* ::= */
        gx *body = parse_alts(&e);
        if (e.st)
            break;
        bool *nd = realloc(defined, (size_t)b->n_rules * sizeof *nd);
        if (!nd) {
            e.st = ts_set_error(ctx, TS_ERR_OOM, "grammar: out of memory");
            break;
        }
        for (int k = e.cap_defined; k < b->n_rules; k++)
            nd[k] = false;
        defined = nd, e.cap_defined = b->n_rules;
        if (defined[r]) {
            eb_fail(&e, "a rule defined twice");
            break;
        }
        defined[r] = true;
        gb_define(b, r, body);
    }
    free(defined);
    if (e.st)
        return e.st;
    if (b->oom)
        return ts_set_error(ctx, TS_ERR_OOM, "grammar: out of memory");
    int r = gb_find(b, "root");
    if (r < 0 || !b->bodies[r])
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "grammar: no `root ::= ...` rule");
    *root = r;
    return TS_OK;
}
