/* grammar_regex.c — regular expressions (vLLM's guided_regex, JSON Schema's
 * "pattern") to grammar trees: literals, ., classes with ranges and
 * negation, \d \w \s and their negations, groups (capturing, (?:...),
 * named), alternation, * + ? {m} {m,} {m,n} (lazy forms accepted: no
 * effect on what matches), ^ and $ at the ends only. Backreferences,
 * lookaround, word boundaries and inline flags are refused with their
 * position. */
#include "grammar_internal.h"

#include <stdio.h>
#include <string.h>

#define MAX_NESTING 100

typedef struct {
    ts_ctx *ctx;
    gbuild *b;
    const char *src;
    size_t i, n;
    int depth;
    ts_status st;
} rx;

static gx *rx_fail(rx *r, const char *what) {
    if (!r->st)
        r->st = ts_set_error(r->ctx, TS_ERR_INVALID_ARG,
                             "regex: %s at offset %zu of \"%.60s\"", what, r->i,
                             r->src);
    return NULL;
}

/* one UTF-8 character; -1 when malformed */
static int32_t next_cp(rx *r) {
    const unsigned char *s = (const unsigned char *)r->src + r->i;
    size_t left = r->n - r->i;
    unsigned c = s[0];
    int len = c < 0x80         ? 1
              : (c >> 5) == 6  ? 2
              : (c >> 4) == 14 ? 3
              : (c >> 3) == 30 ? 4
                               : 0;
    if (!len || (size_t)len > left)
        return -1;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return -1;
        cp = cp << 6 | (s[k] & 63);
    }
    r->i += (size_t)len;
    return (int32_t)cp;
}

typedef struct {
    uint32_t *r;
    int n, cap;
    bool oom;
} ranges;

static void rg_add(ranges *g, uint32_t lo, uint32_t hi) {
    if (g->n == g->cap) {
        int nc = g->cap ? 2 * g->cap : 8;
        uint32_t *nr = realloc(g->r, (size_t)nc * 2 * sizeof *nr);
        if (!nr) {
            g->oom = true;
            return;
        }
        g->r = nr, g->cap = nc;
    }
    g->r[2 * g->n] = lo, g->r[2 * g->n + 1] = hi, g->n++;
}

/* \d \w \s (upper case: negated) as ranges; ASCII meanings, as Python's
 * re.ASCII (documented) */
static bool shorthand(char c, ranges *g, bool *neg) {
    char l = (char)(c | 0x20);
    *neg = c >= 'A' && c <= 'Z';
    if (l == 'd')
        rg_add(g, '0', '9');
    else if (l == 'w') {
        rg_add(g, '0', '9'), rg_add(g, 'A', 'Z'), rg_add(g, 'a', 'z');
        rg_add(g, '_', '_');
    } else if (l == 's') {
        rg_add(g, ' ', ' '), rg_add(g, '\t', '\r');
    } else
        return false;
    return true;
}

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* an escaped single character after '\\' (r->i past the backslash); -1
 * with an error set when not one */
static int32_t escaped_char(rx *r) {
    if (r->i >= r->n)
        return rx_fail(r, "a trailing backslash"), -1;
    char c = r->src[r->i];
    static const char plain[] = "\\^$.|?*+()[]{}-/\"'#&~ ,:=<>!@%`;";
    switch (c) {
    case 'n':
        r->i++;
        return '\n';
    case 't':
        r->i++;
        return '\t';
    case 'r':
        r->i++;
        return '\r';
    case 'f':
        r->i++;
        return '\f';
    case 'v':
        r->i++;
        return '\v';
    case '0':
        r->i++;
        return 0;
    case 'x':
    case 'u': {
        int n = c == 'x' ? 2 : 4;
        if (r->i + 1 + (size_t)n > r->n)
            return rx_fail(r, "a short \\x or \\u escape"), -1;
        int32_t v = 0;
        for (int k = 0; k < n; k++) {
            int h = hexval(r->src[r->i + 1 + (size_t)k]);
            if (h < 0)
                return rx_fail(r, "a bad hex digit in an escape"), -1;
            v = v * 16 + h;
        }
        r->i += 1 + (size_t)n;
        return v;
    }
    default:
        if (c && strchr(plain, c)) {
            r->i++;
            return (unsigned char)c;
        }
        if (c >= '1' && c <= '9')
            return rx_fail(r, "backreferences are not supported"), -1;
        if (c == 'b' || c == 'B' || c == 'A' || c == 'Z' || c == 'z')
            return rx_fail(r, "anchors and word boundaries (\\b, \\A, \\Z) "
                              "are not supported"),
                   -1;
        return rx_fail(r, "an unknown escape"), -1;
    }
}

static gx *parse_class(rx *r) {
    ranges g = {0};
    bool neg = false;
    r->i++; /* '[' */
    if (r->i < r->n && r->src[r->i] == '^')
        neg = true, r->i++;
    bool first = true;
    while (!r->st) {
        if (r->i >= r->n) {
            rx_fail(r, "an unterminated [class]");
            break;
        }
        char c = r->src[r->i];
        if (c == ']' && !first) {
            r->i++;
            break;
        }
        first = false;
        if (c == '[' && r->i + 1 < r->n && r->src[r->i + 1] == ':') {
            rx_fail(r, "POSIX classes [:name:] are not supported");
            break;
        }
        int32_t lo;
        if (c == '\\') {
            r->i++;
            bool sneg;
            ranges sh = {0};
            if (r->i < r->n && shorthand(r->src[r->i], &sh, &sneg)) {
                r->i++;
                gx *tmp = gx_class(r->b, sh.r, sh.n, sneg); /* normalizes */
                free(sh.r);
                for (int k = 0; tmp && k < tmp->n; k++)
                    rg_add(&g, tmp->ranges[2 * k], tmp->ranges[2 * k + 1]);
                continue;
            }
            free(sh.r);
            lo = escaped_char(r);
        } else
            lo = next_cp(r);
        if (lo < 0) {
            rx_fail(r, "malformed UTF-8");
            break;
        }
        int32_t hi = lo;
        if (r->i + 1 < r->n && r->src[r->i] == '-' && r->src[r->i + 1] != ']') {
            r->i++;
            if (r->src[r->i] == '\\') {
                r->i++;
                hi = escaped_char(r);
            } else
                hi = next_cp(r);
            if (hi < 0) {
                rx_fail(r, "a bad range end");
                break;
            }
            if (hi < lo) {
                rx_fail(r, "a reversed range");
                break;
            }
        }
        rg_add(&g, (uint32_t)lo, (uint32_t)hi);
    }
    gx *x = r->st || g.oom ? NULL : gx_class(r->b, g.r, g.n, neg);
    if (g.oom)
        r->b->oom = true;
    free(g.r);
    return x;
}

static gx *parse_alt(rx *r);

static gx *parse_atom(rx *r) {
    char c = r->src[r->i];
    if (c == '(') {
        if (++r->depth > MAX_NESTING)
            return rx_fail(r, "groups nested too deeply");
        r->i++;
        if (r->i < r->n && r->src[r->i] == '?') {
            const char *p = r->src + r->i;
            if (!strncmp(p, "?:", 2))
                r->i += 2;
            else if (!strncmp(p, "?P<", 3) ||
                     (!strncmp(p, "?<", 2) && p[2] != '=' && p[2] != '!')) {
                const char *e = strchr(p, '>');
                if (!e)
                    return rx_fail(r, "an unterminated group name");
                r->i += (size_t)(e - p) + 1;
            } else
                return rx_fail(r, "lookaround and inline flags are not "
                                  "supported");
        }
        gx *x = parse_alt(r);
        if (r->st)
            return NULL;
        if (r->i >= r->n || r->src[r->i] != ')')
            return rx_fail(r, "a missing ')'");
        r->i++;
        r->depth--;
        return x;
    }
    if (c == '[')
        return parse_class(r);
    if (c == '.') {
        r->i++;
        uint32_t nl[2] = {'\n', '\n'};
        return gx_class(r->b, nl, 1, true);
    }
    if (c == '\\') {
        r->i++;
        ranges sh = {0};
        bool neg;
        if (r->i < r->n && shorthand(r->src[r->i], &sh, &neg)) {
            r->i++;
            gx *x = gx_class(r->b, sh.r, sh.n, neg);
            free(sh.r);
            return x;
        }
        free(sh.r);
        int32_t v = escaped_char(r);
        if (v < 0)
            return NULL;
        uint32_t rr[2] = {(uint32_t)v, (uint32_t)v};
        return gx_class(r->b, rr, 1, false);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return rx_fail(r, "a quantifier with nothing to repeat");
    if (c == '^' || c == '$')
        return rx_fail(r, "^ and $ are supported only at the pattern's ends");
    int32_t v = next_cp(r);
    if (v < 0)
        return rx_fail(r, "malformed UTF-8");
    uint32_t rr[2] = {(uint32_t)v, (uint32_t)v};
    return gx_class(r->b, rr, 1, false);
}

static bool read_int(rx *r, int *out) {
    size_t s = r->i;
    long v = 0;
    while (r->i < r->n && r->src[r->i] >= '0' && r->src[r->i] <= '9') {
        v = v * 10 + (r->src[r->i++] - '0');
        if (v > 100000)
            return rx_fail(r, "a repetition count over 100000"), false;
    }
    *out = (int)v;
    return r->i > s;
}

static gx *parse_quant(rx *r, gx *x) {
    while (!r->st && r->i < r->n) {
        char c = r->src[r->i];
        int min, max;
        if (c == '*')
            min = 0, max = -1, r->i++;
        else if (c == '+')
            min = 1, max = -1, r->i++;
        else if (c == '?')
            min = 0, max = 1, r->i++;
        else if (c == '{') {
            r->i++;
            if (!read_int(r, &min))
                return rx_fail(r, "a bad {m,n} repetition");
            max = min;
            if (r->i < r->n && r->src[r->i] == ',') {
                r->i++;
                if (!read_int(r, &max))
                    max = -1;
            }
            if (r->i >= r->n || r->src[r->i] != '}')
                return rx_fail(r, "a bad {m,n} repetition");
            r->i++;
            if (max >= 0 && max < min)
                return rx_fail(r, "a repetition {m,n} with n < m");
        } else
            break;
        if (r->i < r->n && r->src[r->i] == '?')
            r->i++; /* lazy: the same strings match */
        else if (r->i < r->n && r->src[r->i] == '+')
            return rx_fail(r, "possessive quantifiers are not supported");
        /* a{1}{1}... would nest one repetition per quantifier (and recurse
         * as deep when lowered); Python's re refuses it too */
        if (r->i < r->n && strchr("*+?{", r->src[r->i]))
            return rx_fail(r, "a quantifier on a quantifier");
        x = gx_rep(r->b, x, min, max);
    }
    return x;
}

static gx *parse_seq(rx *r) {
    gx *s = gx_seq(r->b);
    while (!r->st && r->i < r->n && r->src[r->i] != '|' &&
           r->src[r->i] != ')') {
        if (r->src[r->i] == '$' && r->i + 1 == r->n)
            break; /* the end anchor: the caller's */
        gx *a = parse_atom(r);
        if (r->st)
            return NULL;
        s = gx_add(r->b, s, parse_quant(r, a));
    }
    return s;
}

static gx *parse_alt(rx *r) {
    gx *first = parse_seq(r);
    if (r->st || r->i >= r->n || r->src[r->i] != '|')
        return first;
    gx *alt = gx_alt(r->b);
    gx_add(r->b, alt, first);
    while (!r->st && r->i < r->n && r->src[r->i] == '|') {
        r->i++;
        gx_add(r->b, alt, parse_seq(r));
    }
    return alt;
}

ts_status tsg_regex(ts_ctx *ctx, gbuild *b, const char *src, gx **out,
                    bool *anchored_start, bool *anchored_end) {
    rx r = {.ctx = ctx, .b = b, .src = src, .n = strlen(src)};
    bool a0 = false, a1 = false;
    if (r.n && src[0] == '^')
        a0 = true, r.i = 1;
    gx *x = parse_alt(&r);
    if (!r.st && r.i < r.n && src[r.i] == '$' && r.i + 1 == r.n)
        a1 = true, r.i++;
    if (!r.st && r.i < r.n)
        rx_fail(&r, src[r.i] == ')' ? "an unmatched ')'"
                                    : "^ and $ are supported only at the "
                                      "pattern's ends");
    if (r.st)
        return r.st;
    if (b->oom || !x)
        return ts_set_error(ctx, TS_ERR_OOM, "regex: out of memory");
    *out = x;
    if (anchored_start)
        *anchored_start = a0;
    if (anchored_end)
        *anchored_end = a1;
    return TS_OK;
}

/* for grammar_ebnf.c: a [class] at src[*i], and one escaped character
 * after a backslash at src[*i]; *i moves past what was read */
gx *tsg_regex_class(ts_ctx *ctx, gbuild *b, const char *src, size_t *i,
                    ts_status *st) {
    rx r = {.ctx = ctx, .b = b, .src = src, .n = strlen(src), .i = *i};
    gx *x = parse_class(&r);
    *i = r.i, *st = r.st;
    return x;
}

int32_t tsg_regex_escape(ts_ctx *ctx, const char *src, size_t *i,
                         ts_status *st) {
    rx r = {.ctx = ctx, .src = src, .n = strlen(src), .i = *i};
    int32_t v = escaped_char(&r);
    *i = r.i, *st = r.st;
    return v;
}
