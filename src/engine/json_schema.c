/* json_schema.c — JSON Schema (and "any JSON object") to grammar rules:
 * the supported keywords of docs/STRUCTURED_OUTPUTS.md, properties in
 * schema order, integer ranges as exact digit automata, bounded JSON
 * whitespace. Anything else is refused with a message naming the keyword
 * and its JSON pointer. Rules only: grammar_build.c lowers them. */
#include "grammar_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_DEPTH  64
#define MAX_BLANKS 32                 /* spaces or tabs in one whitespace run */
#define MAX_BOUND  9007199254740991.0 /* 2^53 - 1 */
#define NO_BOUND   INT64_MAX
/* a pattern's tree, walked by recursion (the regex parser nests groups at
 * most 100 deep, each a level or two) */
#define MAX_PATTERN_DEPTH 256

typedef struct {
    char *ptr;
    json_t *target;
    int rule;
} ref_item;

typedef struct {
    ts_ctx *ctx;
    gbuild *b;
    json_t *doc;
    ts_status st;
    int r_ws, r_char, r_string, r_number, r_int, r_value, r_object, r_array;
    ref_item *refs;
    int n_refs, cap_refs, done_refs;
    int depth;
} jsc;

static gx *fail(jsc *j, const char *fmt, ...) {
    if (j->st)
        return NULL;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    j->st = ts_set_error(j->ctx, TS_ERR_INVALID_ARG, "json_schema: %s", msg);
    return NULL;
}

static const char *show(const char *ptr) {
    return *ptr ? ptr : "/";
}

/* base + "/" + key, with ~ and / escaped (RFC 6901); malloc'd */
static char *ptr_join(const char *base, const char *key) {
    size_t n = strlen(base) + 2 * strlen(key) + 2;
    char *p = malloc(n), *o = p;
    if (!p)
        return NULL;
    o += sprintf(o, "%s/", base);
    for (const char *k = key; *k; k++)
        if (*k == '~')
            *o++ = '~', *o++ = '0';
        else if (*k == '/')
            *o++ = '~', *o++ = '1';
        else
            *o++ = *k;
    *o = 0;
    return p;
}

static char *ptr_index(const char *base, const char *key, size_t i) {
    char k[32];
    snprintf(k, sizeof k, "%zu", i);
    char *a = ptr_join(base, key), *r = a ? ptr_join(a, k) : NULL;
    free(a);
    return r;
}

/* ---- the generic JSON rules ------------------------------------------- */

static gx *cls(jsc *j, uint32_t lo, uint32_t hi) {
    uint32_t r[2] = {lo, hi};
    return gx_class(j->b, r, 1, false);
}

static gx *seqv(jsc *j, int n, ...) {
    gx *s = gx_seq(j->b);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        gx_add(j->b, s, va_arg(ap, gx *));
    va_end(ap);
    return s;
}

static gx *altv(jsc *j, int n, ...) {
    gx *s = gx_alt(j->b);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        gx_add(j->b, s, va_arg(ap, gx *));
    va_end(ap);
    return s;
}

static gx *lit(jsc *j, const char *s) {
    return gx_str(j->b, s);
}

/* a rule made once per grammar: *id caches it */
static gx *shared(jsc *j, int *id, const char *name, gx *(*make)(jsc *)) {
    if (*id < 0) {
        *id = gb_rule(j->b, name);
        gb_define(j->b, *id, make(j));
    }
    return gx_ref(j->b, *id);
}

/* at most one newline, then at most MAX_BLANKS blanks: pretty-printed and
 * compact JSON both fit, endless whitespace does not */
static gx *make_ws(jsc *j) {
    uint32_t blank[4] = {' ', ' ', '\t', '\t'};
    gx *nl = altv(j, 3, gx_empty(j->b), lit(j, "\n"), lit(j, "\r\n"));
    return seqv(j, 2, nl,
                gx_rep(j->b, gx_class(j->b, blank, 2, false), 0, MAX_BLANKS));
}
static gx *ws(jsc *j) {
    return shared(j, &j->r_ws, "ws", make_ws);
}

static gx *hex(jsc *j) {
    uint32_t r[6] = {'0', '9', 'a', 'f', 'A', 'F'};
    return gx_class(j->b, r, 3, false);
}

static gx *make_char(jsc *j) {
    uint32_t r[6] = {0, 0x1F, '"', '"', '\\', '\\'};
    uint32_t esc[] = {'"', '"', '\\', '\\', '/', '/', 'b', 'b',
                      'f', 'f', 'n',  'n',  'r', 'r', 't', 't'};
    gx *escape =
        seqv(j, 2, lit(j, "\\"),
             altv(j, 2, gx_class(j->b, esc, 8, false),
                  seqv(j, 2, lit(j, "u"), gx_rep(j->b, hex(j), 4, 4))));
    return altv(j, 2, gx_class(j->b, r, 3, true), escape);
}
static gx *jchar(jsc *j) {
    return shared(j, &j->r_char, "char", make_char);
}

static gx *make_string(jsc *j) {
    return seqv(j, 3, lit(j, "\""), gx_rep(j->b, jchar(j), 0, -1),
                lit(j, "\""));
}
static gx *jstring(jsc *j) {
    return shared(j, &j->r_string, "string", make_string);
}

static gx *digits(jsc *j, int min, int max) {
    return gx_rep(j->b, cls(j, '0', '9'), min, max);
}

static gx *make_int(jsc *j) {
    return seqv(j, 2, gx_rep(j->b, lit(j, "-"), 0, 1),
                altv(j, 2, lit(j, "0"),
                     seqv(j, 2, cls(j, '1', '9'), digits(j, 0, -1))));
}
static gx *jint(jsc *j) {
    return shared(j, &j->r_int, "integer", make_int);
}

static gx *make_number(jsc *j) {
    uint32_t e[4] = {'e', 'e', 'E', 'E'}, pm[4] = {'+', '+', '-', '-'};
    gx *frac = seqv(j, 2, lit(j, "."), digits(j, 1, -1));
    gx *exp = seqv(j, 3, gx_class(j->b, e, 2, false),
                   gx_rep(j->b, gx_class(j->b, pm, 2, false), 0, 1),
                   digits(j, 1, -1));
    return seqv(j, 3, jint(j), gx_rep(j->b, frac, 0, 1),
                gx_rep(j->b, exp, 0, 1));
}
static gx *jnumber(jsc *j) {
    return shared(j, &j->r_number, "number", make_number);
}

static gx *jvalue(jsc *j);

static gx *make_object(jsc *j) {
    gx *pair = seqv(j, 5, jstring(j), ws(j), lit(j, ":"), ws(j), jvalue(j));
    gx *more = seqv(j, 4, ws(j), lit(j, ","), ws(j), pair);
    return altv(j, 2, seqv(j, 3, lit(j, "{"), ws(j), lit(j, "}")),
                seqv(j, 6, lit(j, "{"), ws(j), pair, gx_rep(j->b, more, 0, -1),
                     ws(j), lit(j, "}")));
}
static gx *jobject(jsc *j) {
    return shared(j, &j->r_object, "object", make_object);
}

static gx *make_array(jsc *j) {
    gx *more = seqv(j, 4, ws(j), lit(j, ","), ws(j), jvalue(j));
    return altv(j, 2, seqv(j, 3, lit(j, "["), ws(j), lit(j, "]")),
                seqv(j, 6, lit(j, "["), ws(j), jvalue(j),
                     gx_rep(j->b, more, 0, -1), ws(j), lit(j, "]")));
}
static gx *jarray(jsc *j) {
    return shared(j, &j->r_array, "array", make_array);
}

static gx *make_value(jsc *j) {
    return altv(j, 7, jobject(j), jarray(j), jstring(j), jnumber(j),
                lit(j, "true"), lit(j, "false"), lit(j, "null"));
}
static gx *jvalue(jsc *j) {
    if (j->r_value < 0) { /* made first: object and array refer to it */
        j->r_value = gb_rule(j->b, "value");
        gb_define(j->b, j->r_value, make_value(j));
    }
    return gx_ref(j->b, j->r_value);
}

static void jsc_init(jsc *j, ts_ctx *ctx, gbuild *b) {
    memset(j, 0, sizeof *j);
    j->ctx = ctx, j->b = b;
    j->r_ws = j->r_char = j->r_string = j->r_number = j->r_int = j->r_value =
        j->r_object = j->r_array = -1;
}

ts_status tsg_json_object(ts_ctx *ctx, gbuild *b, int *root) {
    jsc j;
    jsc_init(&j, ctx, b);
    jvalue(&j);
    *root = j.r_object;
    return b->oom ? ts_set_error(ctx, TS_ERR_OOM, "grammar: out of memory")
                  : TS_OK;
}

/* ---- integer ranges as digit automata --------------------------------- */

/* the decimal strings lo..hi of n digits each (leading digits fixed) */
static gx *same_len(jsc *j, const char *lo, const char *hi, int n) {
    if (n == 0)
        return gx_empty(j->b);
    char d0[2] = {lo[0], 0}, d1[2] = {hi[0], 0};
    if (lo[0] == hi[0])
        return seqv(j, 2, lit(j, d0), same_len(j, lo + 1, hi + 1, n - 1));
    bool lo_zeros = true, hi_nines = true;
    for (int i = 1; i < n; i++)
        lo_zeros &= lo[i] == '0', hi_nines &= hi[i] == '9';
    if (lo_zeros && hi_nines)
        return seqv(j, 2, cls(j, (uint32_t)lo[0], (uint32_t)hi[0]),
                    digits(j, n - 1, n - 1));
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines), memset(zeros, '0', sizeof zeros);
    gx *a = gx_alt(j->b);
    gx_add(j->b, a, seqv(j, 2, lit(j, d0), same_len(j, lo + 1, nines, n - 1)));
    if (lo[0] + 1 <= hi[0] - 1)
        gx_add(j->b, a,
               seqv(j, 2, cls(j, (uint32_t)lo[0] + 1, (uint32_t)hi[0] - 1),
                    digits(j, n - 1, n - 1)));
    gx_add(j->b, a, seqv(j, 2, lit(j, d1), same_len(j, zeros, hi + 1, n - 1)));
    return a;
}

static int ndigits(int64_t x) {
    int n = 1;
    while (x >= 10)
        x /= 10, n++;
    return n;
}

static int64_t pow10i(int n) {
    int64_t p = 1;
    while (n--)
        p *= 10;
    return p;
}

/* non-negative integers in [a, b] without leading zeros; b NO_BOUND:
 * unbounded */
static gx *nonneg_range(jsc *j, int64_t a, int64_t b) {
    gx *alt = gx_alt(j->b);
    int da = ndigits(a), db = b == NO_BOUND ? da : ndigits(b);
    for (int d = da; d <= db; d++) {
        int64_t lo = d == 1 ? 0 : pow10i(d - 1), hi = pow10i(d) - 1;
        if (lo < a)
            lo = a;
        if (b != NO_BOUND && hi > b)
            hi = b;
        char ls[24], hs[24];
        snprintf(ls, sizeof ls, "%lld", (long long)lo);
        snprintf(hs, sizeof hs, "%lld", (long long)hi);
        gx_add(j->b, alt, same_len(j, ls, hs, d));
    }
    if (b == NO_BOUND) /* any longer number */
        gx_add(j->b, alt, seqv(j, 2, cls(j, '1', '9'), digits(j, da, -1)));
    return alt;
}

/* integers in [lo, hi] (NO_BOUND / -NO_BOUND: open) */
static gx *int_range(jsc *j, int64_t lo, int64_t hi) {
    gx *alt = gx_alt(j->b);
    if (hi == NO_BOUND || hi >= 0)
        gx_add(j->b, alt, nonneg_range(j, lo < 0 ? 0 : lo, hi));
    if (lo < 0) {
        int64_t mlo = hi < 0 ? -hi : 1, mhi = lo == -NO_BOUND ? NO_BOUND : -lo;
        gx_add(j->b, alt, seqv(j, 2, lit(j, "-"), nonneg_range(j, mlo, mhi)));
    }
    return alt;
}

/* non-negative decimals m with c < m or c <= m (cex), m < d or m <= d
 * (dex; d NO_BOUND: none); integer part exact, no exponent */
static gx *magnitude(jsc *j, int64_t c, bool cex, int64_t d, bool dex) {
    gx *frac_any =
        gx_rep(j->b, seqv(j, 2, lit(j, "."), digits(j, 1, -1)), 0, 1);
    gx *frac_zero = gx_rep(
        j->b, seqv(j, 2, lit(j, "."), gx_rep(j->b, lit(j, "0"), 1, -1)), 0, 1);
    gx *frac_nonzero = seqv(j, 4, lit(j, "."), digits(j, 0, -1),
                            cls(j, '1', '9'), digits(j, 0, -1));
    gx *alt = gx_alt(j->b);
    int64_t a = c + (cex ? 1 : 0), bmax = d == NO_BOUND ? NO_BOUND : d - 1;
    if (bmax == NO_BOUND || a <= bmax) /* I in [a, d-1], any fraction */
        gx_add(j->b, alt, seqv(j, 2, nonneg_range(j, a, bmax), frac_any));
    char s[24];
    if (cex && (d == NO_BOUND || c <= d - 1)) { /* I == c, fraction > 0 */
        snprintf(s, sizeof s, "%lld", (long long)c);
        gx_add(j->b, alt, seqv(j, 2, lit(j, s), frac_nonzero));
    }
    if (d != NO_BOUND && !dex && (cex ? d > c : d >= c)) { /* I == d */
        snprintf(s, sizeof s, "%lld", (long long)d);
        gx_add(j->b, alt, seqv(j, 2, lit(j, s), frac_zero));
    }
    return alt;
}

typedef struct {
    bool has_lo, has_hi, lo_ex, hi_ex;
    double lo, hi;
} bounds;

static bool read_bounds(jsc *j, json_t *s, const char *ptr, bounds *bd) {
    static const char *names[4] = {"minimum", "exclusiveMinimum", "maximum",
                                   "exclusiveMaximum"};
    memset(bd, 0, sizeof *bd);
    for (int k = 0; k < 4; k++) {
        json_t *x = json_object_get(s, names[k]);
        if (!x)
            continue;
        if (!json_is_number(x)) {
            fail(j, "\"%s\" at %s must be a number", names[k], show(ptr));
            return false;
        }
        double v = json_number_value(x);
        if (!(fabs(v) <= MAX_BOUND)) {
            fail(j, "\"%s\" at %s is beyond +-2^53", names[k], show(ptr));
            return false;
        }
        bool lo = k < 2, ex = k & 1;
        if (lo) { /* the tighter of minimum and exclusiveMinimum */
            if (!bd->has_lo || v > bd->lo || (v == bd->lo && ex))
                bd->has_lo = true, bd->lo = v, bd->lo_ex = ex;
        } else if (!bd->has_hi || v < bd->hi || (v == bd->hi && ex))
            bd->has_hi = true, bd->hi = v, bd->hi_ex = ex;
    }
    return true;
}

static gx *integer_schema(jsc *j, json_t *s, const char *ptr) {
    bounds bd;
    if (!read_bounds(j, s, ptr, &bd))
        return NULL;
    if (!bd.has_lo && !bd.has_hi)
        return jint(j);
    int64_t lo = -NO_BOUND, hi = NO_BOUND;
    if (bd.has_lo)
        lo = bd.lo_ex ? (int64_t)floor(bd.lo) + 1 : (int64_t)ceil(bd.lo);
    if (bd.has_hi)
        hi = bd.hi_ex ? (int64_t)ceil(bd.hi) - 1 : (int64_t)floor(bd.hi);
    if (lo > hi)
        return fail(j, "no integer lies within the bounds at %s", show(ptr));
    return int_range(j, lo, hi);
}

static gx *number_schema(jsc *j, json_t *s, const char *ptr) {
    bounds bd;
    if (!read_bounds(j, s, ptr, &bd))
        return NULL;
    if (!bd.has_lo && !bd.has_hi)
        return jnumber(j);
    if ((bd.has_lo && bd.lo != floor(bd.lo)) ||
        (bd.has_hi && bd.hi != floor(bd.hi)))
        return fail(j,
                    "a non-integer bound on a number at %s is not "
                    "supported (integer bounds are)",
                    show(ptr));
    int64_t lo = bd.has_lo ? (int64_t)bd.lo : -NO_BOUND;
    int64_t hi = bd.has_hi ? (int64_t)bd.hi : NO_BOUND;
    if (lo > hi || (lo == hi && (bd.lo_ex || bd.hi_ex)))
        return fail(j, "no number lies within the bounds at %s", show(ptr));
    gx *alt = gx_alt(j->b);
    if (hi == NO_BOUND || hi > 0 || (hi == 0 && !bd.hi_ex)) {
        bool cex = lo >= 0 && bd.lo_ex;
        gx_add(j->b, alt, magnitude(j, lo > 0 ? lo : 0, cex, hi, bd.hi_ex));
    }
    if (lo < 0) {
        /* magnitudes m of -m: m > c (exclusive) or m >= c; an exclusive
         * maximum 0 excludes "-0" and "-0.0" as well */
        int64_t c = hi < 0 ? -hi : 0, d = lo == -NO_BOUND ? NO_BOUND : -lo;
        bool cex = hi <= 0 && bd.hi_ex;
        gx_add(j->b, alt,
               seqv(j, 2, lit(j, "-"), magnitude(j, c, cex, d, bd.lo_ex)));
    }
    return alt;
}

/* ---- strings ---------------------------------------------------------- */

/* The pattern matches the decoded string: characters JSON must escape are
 * written as their escapes. */
static void json_escape_tree(jsc *j, gx *x, const char *ptr, int depth) {
    if (!x || x->kind == GX_REF || j->st)
        return;
    if (depth > MAX_PATTERN_DEPTH) {
        fail(j, "\"pattern\" at %s nests deeper than %d", show(ptr),
             MAX_PATTERN_DEPTH);
        return;
    }
    if (x->kind != GX_CLASS) {
        for (int i = 0; i < x->n; i++)
            json_escape_tree(j, x->kids[i], ptr, depth + 1);
        return;
    }
    bool special[128] = {0};
    int n_special = 0;
    for (int i = 0; i < x->n; i++)
        for (uint32_t c = x->ranges[2 * i];
             c <= x->ranges[2 * i + 1] && c < 128; c++)
            if (c < 0x20 || c == '"' || c == '\\')
                special[c] = true, n_special++;
    if (!n_special)
        return;
    gx *plain = gx_class(j->b, x->ranges, x->n, false);
    if (!plain)
        return;
    /* plain := x minus the specials: intersect with the complement */
    uint32_t r[6] = {0, 0x1F, '"', '"', '\\', '\\'};
    gx *ok = gx_class(j->b, r, 3, true);
    if (!ok)
        return;
    uint32_t *out = malloc(((size_t)2 * (plain->n + ok->n) + 2) * sizeof *out);
    if (!out) {
        j->b->oom = true;
        return;
    }
    int m = 0;
    for (int a = 0; a < plain->n; a++)
        for (int b = 0; b < ok->n; b++) {
            uint32_t lo = plain->ranges[2 * a] > ok->ranges[2 * b]
                              ? plain->ranges[2 * a]
                              : ok->ranges[2 * b];
            uint32_t hi = plain->ranges[2 * a + 1] < ok->ranges[2 * b + 1]
                              ? plain->ranges[2 * a + 1]
                              : ok->ranges[2 * b + 1];
            if (lo <= hi)
                out[2 * m] = lo, out[2 * m + 1] = hi, m++;
        }
    gx *alt = gx_alt(j->b);
    if (m)
        gx_add(j->b, alt, gx_class(j->b, out, m, false));
    free(out);
    for (uint32_t c = 0; c < 128; c++) {
        if (!special[c])
            continue;
        char e[8];
        const char *shortf = c == '"'    ? "\\\""
                             : c == '\\' ? "\\\\"
                             : c == '\n' ? "\\n"
                             : c == '\t' ? "\\t"
                             : c == '\r' ? "\\r"
                             : c == '\b' ? "\\b"
                             : c == '\f' ? "\\f"
                                         : NULL;
        if (!shortf)
            snprintf(e, sizeof e, "\\u%04x", c), shortf = e;
        gx_add(j->b, alt, lit(j, shortf));
    }
    if (!alt)
        return;
    /* x becomes the alternation (its old ranges are freed with it) */
    free(x->ranges);
    x->ranges = NULL;
    x->kind = GX_ALT;
    x->kids = alt->kids, x->n = alt->n, x->cap = alt->cap;
    alt->kids = NULL, alt->n = alt->cap = 0;
}

static bool read_count(jsc *j, json_t *s, const char *key, const char *ptr,
                       int *out) {
    json_t *x = json_object_get(s, key);
    if (!x)
        return true;
    if (!json_is_integer(x) || json_integer_value(x) < 0 ||
        json_integer_value(x) > 10000) {
        fail(j, "\"%s\" at %s must be an integer in [0, 10000]", key,
             show(ptr));
        return false;
    }
    *out = (int)json_integer_value(x);
    return true;
}

static gx *string_schema(jsc *j, json_t *s, const char *ptr) {
    int min = 0, max = -1;
    if (!read_count(j, s, "minLength", ptr, &min) ||
        !read_count(j, s, "maxLength", ptr, &max))
        return NULL;
    if (max >= 0 && min > max)
        return fail(j, "minLength > maxLength at %s", show(ptr));
    json_t *f = json_object_get(s, "format");
    if (f && !json_is_string(f))
        return fail(j, "\"format\" at %s must be a string", show(ptr));
    json_t *p = json_object_get(s, "pattern");
    if (!p)
        return seqv(j, 3, lit(j, "\""), gx_rep(j->b, jchar(j), min, max),
                    lit(j, "\""));
    if (!json_is_string(p))
        return fail(j, "\"pattern\" at %s must be a string", show(ptr));
    if (min || max >= 0)
        return fail(j,
                    "\"pattern\" together with minLength/maxLength at %s "
                    "is not supported",
                    show(ptr));
    gx *re = NULL;
    bool a0 = false, a1 = false;
    if (tsg_regex(j->ctx, j->b, json_string_value(p), &re, &a0, &a1)) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", ts_errmsg(j->ctx));
        return fail(j, "bad \"pattern\" at %s: %s", show(ptr), msg);
    }
    json_escape_tree(j, re, ptr, 0);
    if (j->st)
        return NULL;
    /* a JSON Schema pattern matches anywhere unless anchored */
    gx *any = gx_rep(j->b, jchar(j), 0, -1);
    return seqv(j, 5, lit(j, "\""), a0 ? gx_empty(j->b) : any, re,
                a1 ? gx_empty(j->b) : any, lit(j, "\""));
}

/* ---- schemas ---------------------------------------------------------- */

static gx *schema(jsc *j, json_t *s, const char *ptr);

static gx *literal_value(jsc *j, json_t *v, const char *what, const char *ptr) {
    char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!d)
        return fail(j, "%s at %s cannot be serialized", what, show(ptr));
    gx *x = lit(j, d);
    free(d);
    return x;
}

static gx *array_schema(jsc *j, json_t *s, const char *ptr) {
    int min = 0, max = -1;
    if (!read_count(j, s, "minItems", ptr, &min) ||
        !read_count(j, s, "maxItems", ptr, &max))
        return NULL;
    if (max >= 0 && min > max)
        return fail(j, "minItems > maxItems at %s", show(ptr));
    json_t *it = json_object_get(s, "items");
    gx *item;
    if (it) {
        char *p = ptr_join(ptr, "items");
        item = p ? schema(j, it, p) : fail(j, "out of memory");
        free(p);
    } else
        item = jvalue(j);
    gx *empty = seqv(j, 3, lit(j, "["), ws(j), lit(j, "]"));
    if (max == 0)
        return empty;
    gx *more = seqv(j, 4, ws(j), lit(j, ","), ws(j), item);
    gx *full =
        seqv(j, 6, lit(j, "["), ws(j), item,
             gx_rep(j->b, more, min > 1 ? min - 1 : 0, max < 0 ? -1 : max - 1),
             ws(j), lit(j, "]"));
    return min == 0 ? altv(j, 2, empty, full) : full;
}

/* rule[2 k + first] := property k (key kx, value v), then rule[2 (k + 1)
 * ...]: the properties after it; optional ones may be skipped */
static void define_property(jsc *j, const int *rule, size_t k, gx *kx, gx *v,
                            bool required, gx *sep) {
    gx *pair = seqv(j, 5, kx, ws(j), lit(j, ":"), ws(j), v);
    for (int first = 0; first < 2; first++) {
        gx *take = seqv(j, 3, first ? gx_empty(j->b) : sep, pair,
                        gx_ref(j->b, rule[2 * (k + 1)]));
        gx *body = required ? take
                            : altv(j, 2, take,
                                   gx_ref(j->b, rule[2 * (k + 1) + first]));
        gb_define(j->b, rule[2 * k + first], body);
    }
}

static gx *key_literal(jsc *j, const char *key, const char *ptr) {
    json_t *ks = json_string(key);
    gx *kx = ks ? literal_value(j, ks, "a property name", ptr)
                : fail(j, "out of memory");
    json_decref(ks);
    return kx;
}

/* additionalProperties' value: its schema's rule, or any value */
static gx *addl_value(jsc *j, int addl_rule) {
    return addl_rule >= 0 ? gx_ref(j->b, addl_rule) : jvalue(j);
}

/* Properties in schema order, then the required names "properties" does
 * not list (their values: additionalProperties'), then, where allowed,
 * further pairs. additionalProperties absent means false when
 * "properties" is given (OpenAI strict), true when not (JSON Schema). */
static gx *object_body(jsc *j, json_t *props, json_t *req_set, json_t *extras,
                       json_t *addl, const char *ptr) {
    bool addl_ok = addl ? !json_is_false(addl) : !props;
    int addl_rule = -1; /* additionalProperties as a schema */
    if (addl && json_is_object(addl)) {
        char *p = ptr_join(ptr, "additionalProperties");
        gx *v = p ? schema(j, addl, p) : fail(j, "out of memory");
        free(p);
        if (!v)
            return NULL;
        addl_rule = v->rule;
    }
    /* rule[2 i + first]: properties i.. remain; first: no comma before the
     * next */
    size_t n = (props ? json_object_size(props) : 0) + json_array_size(extras);
    size_t k = 0;
    int *rule = malloc((2 * n + 2) * sizeof *rule);
    if (!rule)
        return fail(j, "out of memory");
    for (size_t i = 0; i <= n; i++) {
        rule[2 * i] = gb_rule(j->b, "props");
        rule[2 * i + 1] = gb_rule(j->b, "props");
    }
    gx *sep = seqv(j, 3, ws(j), lit(j, ","), ws(j));
    if (addl_ok) {
        gx *addl_pair = seqv(j, 5, jstring(j), ws(j), lit(j, ":"), ws(j),
                             addl_value(j, addl_rule));
        gx *more = gx_rep(j->b, seqv(j, 2, sep, addl_pair), 0, -1);
        gb_define(j->b, rule[2 * n], more);
        gb_define(j->b, rule[2 * n + 1],
                  altv(j, 2, gx_empty(j->b), seqv(j, 2, addl_pair, more)));
    } else {
        gb_define(j->b, rule[2 * n], gx_empty(j->b));
        gb_define(j->b, rule[2 * n + 1], gx_empty(j->b));
    }
    const char *key;
    json_t *val;
    json_object_foreach(props, key, val) {
        char *p = ptr_join(ptr, "properties"),
             *pp = p ? ptr_join(p, key) : NULL;
        free(p);
        gx *v = pp ? schema(j, val, pp) : fail(j, "out of memory");
        free(pp);
        gx *kx = key_literal(j, key, ptr);
        if (j->st)
            break;
        define_property(j, rule, k++, kx, v,
                        json_object_get(req_set, key) != NULL, sep);
    }
    size_t i;
    json_array_foreach(extras, i, val) {
        if (j->st)
            break;
        gx *kx = key_literal(j, json_string_value(val), ptr);
        define_property(j, rule, k++, kx, addl_value(j, addl_rule), true, sep);
    }
    gx *x = seqv(j, 5, lit(j, "{"), ws(j), gx_ref(j->b, rule[1]), ws(j),
                 lit(j, "}"));
    free(rule);
    return j->st ? NULL : x;
}

static gx *object_schema(jsc *j, json_t *s, const char *ptr) {
    json_t *props = json_object_get(s, "properties");
    json_t *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(j, "\"properties\" at %s must be an object", show(ptr));
    if (req && !json_is_array(req))
        return fail(j, "\"required\" at %s must be an array", show(ptr));
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail(j,
                    "\"additionalProperties\" at %s must be a boolean or "
                    "a schema",
                    show(ptr));
    if (!props && !addl && !json_array_size(req))
        return jobject(j); /* any object */
    bool addl_ok = addl ? !json_is_false(addl) : !props;
    /* the required names as a set, and those "properties" does not list
     * (in order, once each): written with additionalProperties' schema,
     * or refused when it allows no other key */
    json_t *req_set = json_object(), *extras = json_array();
    if (!req_set || !extras) {
        json_decref(req_set), json_decref(extras);
        return fail(j, "out of memory");
    }
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r) {
        const char *name = json_string_value(r);
        if (!name) {
            fail(j, "\"required\" at %s holds a non-string", show(ptr));
            break;
        }
        if (json_object_get(req_set, name))
            continue;
        json_object_set_new(req_set, name, json_true());
        if (props && json_object_get(props, name))
            continue;
        if (!addl_ok) {
            fail(j,
                 "required property \"%s\" at %s is not in \"properties\", "
                 "and \"additionalProperties\" %s",
                 name, show(ptr), addl ? "is false" : "is absent (so false)");
            break;
        }
        json_array_append_new(extras, json_string(name));
    }
    gx *x = j->st ? NULL : object_body(j, props, req_set, extras, addl, ptr);
    json_decref(req_set);
    json_decref(extras);
    return x;
}

static gx *typed(jsc *j, const char *type, json_t *s, const char *ptr) {
    if (!strcmp(type, "string"))
        return string_schema(j, s, ptr);
    if (!strcmp(type, "integer"))
        return integer_schema(j, s, ptr);
    if (!strcmp(type, "number"))
        return number_schema(j, s, ptr);
    if (!strcmp(type, "boolean"))
        return altv(j, 2, lit(j, "true"), lit(j, "false"));
    if (!strcmp(type, "null"))
        return lit(j, "null");
    if (!strcmp(type, "object"))
        return object_schema(j, s, ptr);
    if (!strcmp(type, "array"))
        return array_schema(j, s, ptr);
    return fail(j, "unknown type \"%s\" at %s", type, show(ptr));
}

static const char *const known_keywords[] = {
    "type", "properties", "required", "additionalProperties", "items", "enum",
    "const", "anyOf", "minLength", "maxLength", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "$ref",
    "$defs", "definitions", "format",
    /* annotations: no effect on what is generated */
    "title", "description", "$schema", "default", "examples", "$id", "$comment",
    "strict", NULL};

static int ref_rule(jsc *j, const char *ref, const char *ptr) {
    for (int i = 0; i < j->n_refs; i++)
        if (!strcmp(j->refs[i].ptr, ref))
            return j->refs[i].rule;
    if (ref[0] != '#' || (ref[1] && ref[1] != '/')) {
        fail(j,
             "\"$ref\" \"%s\" at %s: only local references (#/...) are "
             "supported",
             ref, show(ptr));
        return -1;
    }
    json_t *t = j->doc; /* JSON pointer, ~0 ~1 undone */
    const char *p = ref + 1;
    while (t && *p == '/') {
        const char *e = strchr(p + 1, '/');
        size_t n = e ? (size_t)(e - p - 1) : strlen(p + 1);
        char *seg = malloc(n + 1);
        if (!seg)
            return fail(j, "out of memory"), -1;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            char c = p[1 + i];
            if (c == '~' && i + 1 < n && (p[2 + i] == '0' || p[2 + i] == '1'))
                c = p[2 + i] == '0' ? '~' : '/', i++;
            seg[m++] = c;
        }
        seg[m] = 0;
        if (json_is_object(t))
            t = json_object_get(t, seg);
        else if (json_is_array(t)) {
            char *end;
            long ix = strtol(seg, &end, 10);
            t = *seg && !*end && ix >= 0 ? json_array_get(t, (size_t)ix) : NULL;
        } else
            t = NULL;
        free(seg);
        p = e ? e : p + 1 + n;
    }
    if (!t) {
        fail(j, "\"$ref\" \"%s\" at %s points to nothing", ref, show(ptr));
        return -1;
    }
    if (j->n_refs == j->cap_refs) {
        int nc = j->cap_refs ? 2 * j->cap_refs : 8;
        ref_item *nr = realloc(j->refs, (size_t)nc * sizeof *nr);
        if (!nr)
            return fail(j, "out of memory"), -1;
        j->refs = nr, j->cap_refs = nc;
    }
    char *copy = strdup(ref);
    int r = gb_rule(j->b, ref);
    if (!copy || r < 0) {
        free(copy);
        return fail(j, "out of memory"), -1;
    }
    j->refs[j->n_refs++] = (ref_item){copy, t, r};
    return r;
}

/* Keywords that do not constrain a value beside $ref, const, enum or
 * anyOf: annotations, the containers of definitions, and "format" (ignored
 * everywhere, as documented). */
static bool neutral_keyword(const char *k) {
    static const char *const neutral[] = {
        "title",    "description", "$schema", "default",     "examples", "$id",
        "$comment", "strict",      "$defs",   "definitions", "format",   NULL};
    for (int i = 0; neutral[i]; i++)
        if (!strcmp(neutral[i], k))
            return true;
    return false;
}

/* A keyword of s beside self (and also, when given) that would constrain
 * the value: refused, never silently dropped. */
static bool lone_keyword(jsc *j, json_t *s, const char *self, const char *also,
                         const char *ptr) {
    const char *key;
    json_t *val;
    json_object_foreach(s, key, val) {
        if (strcmp(key, self) && !(also && !strcmp(key, also)) &&
            !neutral_keyword(key)) {
            fail(j, "unsupported keyword combination \"%s\" + \"%s\" at %s",
                 self, key, show(ptr));
            return false;
        }
    }
    return true;
}

/* whether v is of the JSON Schema type name (1.0 is an integer) */
static bool of_type(const char *name, json_t *v) {
    if (!strcmp(name, "string"))
        return json_is_string(v);
    if (!strcmp(name, "integer"))
        return json_is_integer(v) ||
               (json_is_real(v) &&
                json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(name, "number"))
        return json_is_number(v);
    if (!strcmp(name, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(name, "null"))
        return json_is_null(v);
    if (!strcmp(name, "object"))
        return json_is_object(v);
    return !strcmp(name, "array") && json_is_array(v);
}

/* const / enum (what) beside "type": each value must be of one of the
 * types, else the combination is refused */
static bool values_typed(jsc *j, json_t *type, json_t *values, bool one,
                         const char *what, const char *ptr) {
    if (!type)
        return true;
    if (!json_is_string(type) &&
        !(json_is_array(type) && json_array_size(type)))
        return fail(j, "\"type\" at %s must be a string or a non-empty array",
                    show(ptr)),
               false;
    size_t n = one ? 1 : json_array_size(values);
    for (size_t i = 0; i < n; i++) {
        json_t *v = one ? values : json_array_get(values, i);
        bool ok = false;
        if (json_is_string(type))
            ok = of_type(json_string_value(type), v);
        for (size_t t = 0;
             !ok && json_is_array(type) && t < json_array_size(type); t++) {
            const char *name = json_string_value(json_array_get(type, t));
            ok = name && of_type(name, v);
        }
        if (!ok) {
            char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            fail(j,
                 "unsupported keyword combination %s + \"type\" at %s: the "
                 "value %.60s is not of that type",
                 what, show(ptr), d ? d : "?");
            free(d);
            return false;
        }
    }
    return true;
}

/* No "type": the types the keywords present apply to (each alternative
 * then honours its own), else any value. Values of other types would be
 * valid too; they are not generated. */
static gx *untyped(jsc *j, json_t *s, const char *ptr) {
    static const struct {
        const char *type, *keywords[5];
    } families[] = {
        {"object", {"properties", "additionalProperties", "required", NULL}},
        {"array", {"items", "minItems", "maxItems", NULL}},
        {"string", {"minLength", "maxLength", "pattern", NULL}},
        {"number",
         {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL}},
    };
    gx *alt = NULL;
    for (size_t f = 0; f < sizeof families / sizeof *families && !j->st; f++) {
        bool present = false;
        for (int k = 0; families[f].keywords[k] && !present; k++)
            present = json_object_get(s, families[f].keywords[k]) != NULL;
        if (!present)
            continue;
        if (!alt)
            alt = gx_alt(j->b);
        gx_add(j->b, alt, typed(j, families[f].type, s, ptr));
    }
    return j->st ? NULL : alt ? alt : jvalue(j);
}

static gx *schema_body(jsc *j, json_t *s, const char *ptr) {
    if (json_is_true(s))
        return jvalue(j);
    if (json_is_false(s))
        return fail(j, "the schema at %s (false) allows no value", show(ptr));
    if (!json_is_object(s))
        return fail(j, "the schema at %s is not an object", show(ptr));
    const char *key;
    json_t *val;
    json_object_foreach(s, key, val) {
        bool known = false;
        for (int i = 0; known_keywords[i] && !known; i++)
            known = !strcmp(known_keywords[i], key);
        if (!known)
            return fail(j, "unsupported keyword \"%s\" at %s", key, show(ptr));
    }
    json_t *x, *type = json_object_get(s, "type");
    if ((x = json_object_get(s, "$ref"))) {
        if (!json_is_string(x))
            return fail(j, "\"$ref\" at %s must be a string", show(ptr));
        if (!lone_keyword(j, s, "$ref", NULL, ptr))
            return NULL;
        return gx_ref(j->b, ref_rule(j, json_string_value(x), ptr));
    }
    if ((x = json_object_get(s, "const"))) {
        if (!lone_keyword(j, s, "const", "type", ptr) ||
            !values_typed(j, type, x, true, "\"const\"", ptr))
            return NULL;
        return literal_value(j, x, "\"const\"", ptr);
    }
    if ((x = json_object_get(s, "enum"))) {
        if (!json_is_array(x) || !json_array_size(x))
            return fail(j, "\"enum\" at %s must be a non-empty array",
                        show(ptr));
        if (!lone_keyword(j, s, "enum", "type", ptr) ||
            !values_typed(j, type, x, false, "\"enum\"", ptr))
            return NULL;
        gx *alt = gx_alt(j->b);
        for (size_t i = 0; i < json_array_size(x); i++)
            gx_add(j->b, alt,
                   literal_value(j, json_array_get(x, i), "\"enum\"", ptr));
        return alt;
    }
    if ((x = json_object_get(s, "anyOf"))) {
        if (!json_is_array(x) || !json_array_size(x))
            return fail(j, "\"anyOf\" at %s must be a non-empty array",
                        show(ptr));
        if (!lone_keyword(j, s, "anyOf", NULL, ptr))
            return NULL;
        gx *alt = gx_alt(j->b);
        for (size_t i = 0; i < json_array_size(x) && !j->st; i++) {
            char *p = ptr_index(ptr, "anyOf", i);
            gx_add(j->b, alt,
                   p ? schema(j, json_array_get(x, i), p)
                     : fail(j, "out of memory"));
            free(p);
        }
        return alt;
    }
    if (json_is_string(type))
        return typed(j, json_string_value(type), s, ptr);
    if (json_is_array(type) && json_array_size(type)) {
        gx *alt = gx_alt(j->b);
        for (size_t i = 0; i < json_array_size(type); i++) {
            json_t *t = json_array_get(type, i);
            if (!json_is_string(t))
                return fail(j, "\"type\" at %s holds a non-string", show(ptr));
            gx_add(j->b, alt, typed(j, json_string_value(t), s, ptr));
        }
        return alt;
    }
    if (type)
        return fail(j, "\"type\" at %s must be a string or a non-empty array",
                    show(ptr));
    return untyped(j, s, ptr);
}

/* each schema is a rule of its own: trees are shared, never copied */
static gx *schema(jsc *j, json_t *s, const char *ptr) {
    if (j->st)
        return NULL;
    if (++j->depth > MAX_DEPTH) {
        j->depth--;
        return fail(j, "nesting deeper than %d at %s", MAX_DEPTH, show(ptr));
    }
    int r = gb_rule(j->b, *ptr ? ptr : "/");
    gx *body = schema_body(j, s, ptr);
    j->depth--;
    if (j->st)
        return NULL;
    gb_define(j->b, r, body);
    return gx_ref(j->b, r);
}

ts_status tsg_json_schema(ts_ctx *ctx, gbuild *b, const char *src, int *root) {
    jsc j;
    jsc_init(&j, ctx, b);
    json_error_t err;
    j.doc = json_loads(src, JSON_DECODE_ANY, &err);
    if (!j.doc)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "json_schema: not valid JSON (line %d column %d: "
                            "%s)",
                            err.line, err.column, err.text);
    gx *top = schema(&j, j.doc, "");
    /* referenced schemas, breadth first: no recursion through $ref */
    for (int i = 0; i < j.n_refs && !j.st; i++) {
        const char *p = j.refs[i].ptr + 1; /* the pointer after '#' */
        gx *body = schema(&j, j.refs[i].target, p);
        if (!j.st)
            gb_define(b, j.refs[i].rule, body);
    }
    ts_status st = j.st;
    if (!st && (b->oom || !top))
        st = ts_set_error(ctx, TS_ERR_OOM, "json_schema: out of memory");
    if (!st)
        *root = top->rule;
    for (int i = 0; i < j.n_refs; i++)
        free(j.refs[i].ptr);
    free(j.refs);
    json_decref(j.doc);
    return st;
}
