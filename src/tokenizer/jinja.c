/* jinja.c — the Jinja subset that chat templates use, rendered as
 * transformers' apply_chat_template renders them with Python's jinja2
 * (trim_blocks, lstrip_blocks, loop controls, tojson = json.dumps with
 * ensure_ascii=False, raise_exception, strftime_now). Values follow
 * Python's semantics (truthiness, str(), repr(), floor division, slices by
 * code point). Owns the lexer, the parser (an AST of `node`s) and the
 * tree-walking renderer; values are jansson objects. Knows nothing of
 * tokenizers or models: chat.c feeds it tokenizer_config.json.
 * The supported filters, tests and methods are listed in
 * docs/CHAT_TEMPLATES.md. */
#define _GNU_SOURCE /* memmem */
#include "jinja.h"

#include "core/core.h"
#include "core/strbuf.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#define MAX_DEPTH 200 /* nesting of expressions, statements and macro calls */
/* nesting of the lists and dicts a template builds */
#define MAX_VALUE_DEPTH 512
#define LIST_ITEM_BYTES 16 /* what one list item is charged to the budget */
/* A loop iteration (its `loop` object: ten values) costs as much as a few
 * expressions; an empty body still costs its iterations. */
#define LOOP_ITER_STEPS 4

/* ---- allocation ----
 * Every allocation here goes through these, and so may fail on purpose:
 * tests make the nth one fail (ts_jinja_fail_alloc) to prove that each
 * failure comes back as an error, without a leak or a crash. While armed,
 * jansson's allocations (values, json_loads) are counted too. */
static long alloc_fail_at;    /* 0: none fails */
static bool alloc_fail_after; /* and every one after it */
static long alloc_count;      /* allocations counted since armed */
static bool alloc_fails(void) {
    if (!alloc_fail_at)
        return false;
    ++alloc_count;
    return alloc_count == alloc_fail_at ||
           (alloc_fail_after && alloc_count > alloc_fail_at);
}
static void *j_malloc(size_t n) {
    return alloc_fails() ? NULL : malloc(n);
}
static void *j_calloc(size_t n, size_t size) {
    return alloc_fails() ? NULL : calloc(n, size);
}
static void *j_realloc(void *p, size_t n) {
    return alloc_fails() ? NULL : realloc(p, n);
}
static char *j_strndup(const char *s, size_t n) {
    return alloc_fails() ? NULL : strndup(s, n);
}
static char *j_strdup(const char *s) {
    return j_strndup(s, strlen(s));
}

long ts_jinja_fail_alloc(long n, bool and_after) {
    static json_malloc_t saved_malloc; /* jansson's, while armed */
    static json_free_t saved_free;
    long counted = alloc_count;
    if (!alloc_fail_at && n > 0) {
        json_get_alloc_funcs(&saved_malloc, &saved_free);
        json_set_alloc_funcs(j_malloc, free);
    } else if (alloc_fail_at && n <= 0)
        json_set_alloc_funcs(saved_malloc, saved_free);
    alloc_fail_at = n > 0 ? n : 0;
    alloc_fail_after = and_after;
    alloc_count = 0;
    return counted;
}

/* ---- the render's budget ----
 * A chat template comes from a model folder: untrusted input. One render
 * may take at most max_steps evaluation steps (expressions, statements,
 * loop iterations, and work in proportion to the size of what filters,
 * methods and operators walk) and build at most max_bytes of strings and
 * list items (output included). The budget is thread-local so that the
 * string builders and value printers deep below eval() can charge it
 * without an rt in hand; once spent they stop building and set `over`,
 * and eval()/render() turn that into an error naming the limit. */
typedef enum { BUDGET_OK, BUDGET_STEPS, BUDGET_BYTES, BUDGET_OOM } budget_state;
typedef struct {
    uint64_t steps, max_steps;
    size_t bytes, max_bytes;
    budget_state over;
    json_t *empty; /* "", what a string that could not be built reads as */
} budget;

static _Thread_local budget *cur_budget; /* NULL outside a render */

/* an allocation failed: the render stops with an out-of-memory error */
static bool oom(void) {
    if (cur_budget && !cur_budget->over)
        cur_budget->over = BUDGET_OOM;
    return false;
}

static bool spend_steps(uint64_t n) {
    budget *b = cur_budget;
    if (!b)
        return true;
    if (b->over)
        return false;
    if (n > b->max_steps - b->steps) {
        b->steps = b->max_steps;
        b->over = BUDGET_STEPS;
        return false;
    }
    b->steps += n;
    return true;
}
static bool spend_bytes(size_t n) {
    budget *b = cur_budget;
    if (!b)
        return true;
    if (b->over)
        return false;
    if (n > b->max_bytes - b->bytes) {
        b->over = BUDGET_BYTES;
        return false;
    }
    b->bytes += n;
    return true;
}
/* more bytes than any budget holds (a size that overflows) */
static bool over_bytes(void) {
    if (cur_budget && !cur_budget->over)
        cur_budget->over = BUDGET_BYTES;
    return false;
}
/* n items of `each` bytes, without overflowing the product */
static bool spend_items(size_t n, size_t each) {
    size_t total;
    if (__builtin_mul_overflow(n, each, &total))
        return over_bytes();
    return spend_bytes(total);
}
static bool budget_over(void) {
    return cur_budget && cur_budget->over;
}

/* ts_sb_add, whose growth may fail on purpose too (see alloc_fails) */
static void sb_raw(ts_sbuf *b, const char *s, size_t n) {
    if (!b->oom && n < SIZE_MAX - 1 - b->n && b->n + n + 1 > b->cap &&
        alloc_fails()) {
        b->oom = true;
        return;
    }
    ts_sb_add(b, s, n);
}
/* ts_sbuf appends charged to the budget (nothing appended once spent) */
static void sb_add(ts_sbuf *b, const char *s, size_t n) {
    if (spend_bytes(n))
        sb_raw(b, s, n);
}
static void sb_puts(ts_sbuf *b, const char *s) {
    sb_add(b, s, strlen(s));
}
__attribute__((format(printf, 2, 3))) static void
sb_printf(ts_sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        sb_add(b, tmp, (size_t)n);
        return;
    }
    char *big = j_malloc((size_t)n + 1); /* a long macro name */
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_add(b, big, (size_t)n);
    free(big);
}
/* per * times spaces, charged before they are built (an indent of 10**12
 * is refused, not looped over) */
static void sb_spaces(ts_sbuf *b, long long per, long long times) {
    static const char sp[] = "                                ";
    long long n;
    if (per <= 0 || times <= 0)
        return;
    if (__builtin_mul_overflow(per, times, &n)) {
        over_bytes();
        return;
    }
    if (!spend_bytes((size_t)n))
        return;
    for (; n > 0; n -= (long long)(sizeof sp - 1))
        sb_raw(b, sp,
               n < (long long)(sizeof sp - 1) ? (size_t)n : sizeof sp - 1);
}
/* json_array_append(_new) charged to the budget (nothing added once spent;
 * _new still takes the reference); e NULL or a failed append: oom() */
static void list_add(json_t *l, json_t *e) {
    if (spend_bytes(LIST_ITEM_BYTES) && json_array_append(l, e))
        oom();
}
static void list_add_new(json_t *l, json_t *e) {
    if (!e)
        oom();
    else if (!spend_bytes(LIST_ITEM_BYTES))
        json_decref(e);
    else if (json_array_append_new(l, e))
        oom();
}
/* a new string item of n bytes */
static void list_add_str(json_t *l, const char *s, size_t n) {
    if (n <= SIZE_MAX - LIST_ITEM_BYTES && spend_bytes(LIST_ITEM_BYTES + n)) {
        json_t *e = json_stringn_nocheck(s, n);
        if (!e || json_array_append_new(l, e))
            oom();
    }
}
/* new containers and object members; a failure: oom() */
static json_t *new_array(void) {
    json_t *a = json_array();
    if (!a)
        oom();
    return a;
}
static json_t *new_object(void) {
    json_t *o = json_object();
    if (!o)
        oom();
    return o;
}
static void obj_set_new(json_t *o, const char *k, size_t klen, json_t *v) {
    if (json_object_setn_new_nocheck(o, k, klen, v))
        oom();
}

/* ---- UTF-8 ---- */

static int u8_next(const char *s, size_t n, size_t i, int32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                          (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
        *cp = (unsigned char)s[i];
        return 1;
    }
    *cp = c;
    return (int)k;
}
static size_t u8_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}
/* byte offset of code point k (k <= number of code points) */
static size_t u8_offset(const char *s, size_t n, size_t k) {
    size_t i = 0;
    for (; i < n && k; k--) {
        int32_t c;
        i += u8_next(s, n, i, &c);
    }
    return i;
}
static bool py_isspace(int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 ||
           c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
           c == 0x3000;
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                              (utf8proc_ssize_t)(n - i), &c);
        if (k <= 0)
            return false;
        i += k;
    }
    return true;
}

/* ---- lexer ---- */

typedef enum {
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF
} tok_kind;

typedef struct {
    tok_kind kind;
    int line;
    char *s; /* text, name, string value or operator */
    size_t len;
    long long i;
    bool i_min; /* the literal 9223372036854775808: only -9223372036854775808 */
    double f;
} token;

typedef struct {
    token *v;
    size_t n, cap;
} tok_list;

struct ts_template {
    struct node *root;
    char *err;                    /* a parse error, kept for the message */
    unsigned long long max_steps; /* one render's budget */
    size_t max_bytes;
};

typedef struct {
    ts_ctx *ctx;
    char msg[512];
    bool failed;
    bool oom; /* the failure was an allocation's */
} diag;

static bool fail_at(diag *d, int line, const char *fmt, ...) {
    if (d->failed)
        return false;
    va_list ap;
    va_start(ap, fmt);
    char tmp[400];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (line > 0)
        snprintf(d->msg, sizeof d->msg, "chat template line %d: %s", line, tmp);
    else
        snprintf(d->msg, sizeof d->msg, "chat template: %s", tmp);
    d->failed = true;
    return false;
}

/* an allocation failed while lexing or parsing */
static bool oom_at(diag *d, int line) {
    if (!d->failed)
        d->oom = true;
    return fail_at(d, line, "out of memory while parsing");
}

/* takes t.s, also on failure */
static bool tl_push(diag *d, tok_list *l, token t) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        token *v = j_realloc(l->v, cap * sizeof *v);
        if (!v) {
            free(t.s);
            return oom_at(d, t.line);
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = t;
    return true;
}

static int count_lines(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++)
        c += s[i] == '\n';
    return c;
}

static bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
           c == '\r';
}
static bool is_ident_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_ident(char c) {
    return is_ident_start(c) || (c >= '0' && c <= '9');
}

/* Python string-literal escapes. */
static bool lex_string(diag *d, int line, const char *s, size_t n, size_t *i,
                       ts_sbuf *out) {
    char q = s[(*i)++];
    while (*i < n && s[*i] != q) {
        char c = s[(*i)++];
        if (c != '\\') {
            sb_add(out, &c, 1);
            continue;
        }
        if (*i >= n)
            break;
        char e = s[(*i)++];
        const char *simple = NULL;
        switch (e) {
        case 'n':
            simple = "\n";
            break;
        case 't':
            simple = "\t";
            break;
        case 'r':
            simple = "\r";
            break;
        case '\\':
            simple = "\\";
            break;
        case '\'':
            simple = "'";
            break;
        case '"':
            simple = "\"";
            break;
        case 'a':
            simple = "\a";
            break;
        case 'b':
            simple = "\b";
            break;
        case 'f':
            simple = "\f";
            break;
        case 'v':
            simple = "\v";
            break;
        case '0':
            sb_add(out, "", 1);
            continue;
        case '\n':
            continue;
        default:
            break;
        }
        if (simple) {
            sb_puts(out, simple);
            continue;
        }
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (!digits) { /* unknown escapes stay as written, as in Python */
            sb_add(out, "\\", 1);
            sb_add(out, &e, 1);
            continue;
        }
        if (*i + digits > n)
            return fail_at(d, line, "truncated \\%c escape in a string", e);
        char hex[9] = {0};
        memcpy(hex, s + *i, digits);
        char *end;
        long cp = strtol(hex, &end, 16);
        if (*end || !utf8proc_codepoint_valid(cp))
            return fail_at(d, line, "bad \\%c escape in a string", e);
        *i += digits;
        utf8proc_uint8_t u[4];
        sb_add(out, (char *)u, utf8proc_encode_char(cp, u));
    }
    if (*i >= n)
        return fail_at(d, line, "unterminated string literal");
    (*i)++;
    return true;
}

static const char *OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                            "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                            "]",  "{",  "}",  ",",  ".",  ":",  "|", NULL};

/* Lex the inside of a {{ }} or {% %} tag starting at *i; stops at the
 * closing delimiter (end = "}}" or "%}"), recording whether it carried a
 * '-' or '+' modifier. */
static bool lex_tag(diag *d, const char *s, size_t n, size_t *i, int *line,
                    const char *end, tok_list *out, char *rmod) {
    int brace = 0;
    for (;;) {
        while (*i < n && (s[*i] == ' ' || s[*i] == '\t' || s[*i] == '\n' ||
                          s[*i] == '\r')) {
            *line += s[*i] == '\n';
            (*i)++;
        }
        if (*i >= n)
            return fail_at(d, *line, "unexpected end of template inside a tag");
        char c = s[*i];
        if (!brace && (c == '-' || c == '+') && *i + 3 <= n &&
            !strncmp(s + *i + 1, end, 2)) {
            *rmod = c;
            *i += 3;
            return true;
        }
        if (!brace && !strncmp(s + *i, end, 2)) {
            *rmod = 0;
            *i += 2;
            return true;
        }
        token t = {.line = *line};
        if (is_ident_start(c)) {
            size_t j = *i;
            while (j < n && is_ident(s[j]))
                j++;
            t.kind = T_NAME;
            t.s = j_strndup(s + *i, j - *i);
            t.len = j - *i;
            if (!t.s)
                return oom_at(d, *line);
            *i = j;
        } else if (c >= '0' && c <= '9') {
            size_t j = *i;
            bool fl = false;
            while (j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_'))
                j++;
            if (j + 1 < n && s[j] == '.' && s[j + 1] >= '0' &&
                s[j + 1] <= '9') {
                fl = true;
                j++;
                while (j < n && s[j] >= '0' && s[j] <= '9')
                    j++;
            }
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < n && (s[k] == '+' || s[k] == '-'))
                    k++;
                if (k < n && s[k] >= '0' && s[k] <= '9') {
                    fl = true;
                    j = k;
                    while (j < n && s[j] >= '0' && s[j] <= '9')
                        j++;
                }
            }
            char num[64] = {0};
            size_t k = 0;
            for (size_t q = *i; q < j && k < 63; q++)
                if (s[q] != '_')
                    num[k++] = s[q];
            t.kind = fl ? T_FLOAT : T_INT;
            if (fl)
                t.f = strtod(num, NULL);
            else { /* digits from the source: num may be cut short */
                unsigned long long v = 0;
                const unsigned long long lim =
                    (unsigned long long)INT64_MAX + 1;
                for (size_t q = *i; q < j; q++) {
                    if (s[q] == '_')
                        continue;
                    unsigned dig = (unsigned)(s[q] - '0');
                    if (v > (lim - dig) / 10)
                        return fail_at(d, *line,
                                       "integer literal %.*s does not fit in "
                                       "64 bits (%lld to %lld)",
                                       (int)(j - *i), s + *i,
                                       (long long)INT64_MIN,
                                       (long long)INT64_MAX);
                    v = v * 10 + dig;
                }
                t.i_min = v == lim;
                t.i = t.i_min ? INT64_MIN : (long long)v;
            }
            *i = j;
        } else if (c == '\'' || c == '"') {
            ts_sbuf b = {0};
            sb_add(&b, "", 0);
            if (!lex_string(d, *line, s, n, i, &b) || b.oom) {
                free(b.p);
                return b.oom ? oom_at(d, *line) : false;
            }
            t.kind = T_STRING;
            t.s = b.p;
            t.len = b.n;
        } else {
            const char *op = NULL;
            for (int k = 0; OPS[k]; k++)
                if (!strncmp(s + *i, OPS[k], strlen(OPS[k]))) {
                    op = OPS[k];
                    break;
                }
            if (!op)
                return fail_at(d, *line, "unexpected character '%c'", c);
            if (*op == '{' || *op == '[' || *op == '(')
                brace++;
            else if ((*op == '}' || *op == ']' || *op == ')') && brace > 0)
                brace--;
            t.kind = T_OP;
            t.s = j_strdup(op);
            t.len = strlen(op);
            *i += t.len;
            if (!t.s)
                return oom_at(d, *line);
        }
        if (!tl_push(d, out, t))
            return false;
    }
}

/* Whitespace rules applied to the text before a tag. */
static bool emit_text(diag *d, tok_list *out, const char *s, size_t a, size_t b,
                      int line) {
    if (b <= a)
        return true;
    char *t = j_malloc(b - a + 1);
    if (!t)
        return oom_at(d, line);
    memcpy(t, s + a, b - a); /* the text may hold NULs: no strndup */
    t[b - a] = 0;
    return tl_push(d, out,
                   (token){.kind = T_TEXT, .line = line, .s = t, .len = b - a});
}

static bool lex(diag *d, const char *src, size_t n, tok_list *out) {
    /* Newlines normalized to \n and one trailing newline dropped, as
     * jinja2 does (keep_trailing_newline=False). */
    char *s = j_malloc(n + 1);
    if (!s)
        return oom_at(d, 0);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[m++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n')
                i++;
        } else
            s[m++] = src[i];
    }
    if (m && s[m - 1] == '\n')
        m--;
    s[m] = 0;
    n = m;
    size_t i = 0;
    int line = 1;
    char prev_rmod = 0;      /* modifier of the previous tag's end */
    bool prev_block = false; /* the previous tag was a block or comment */
    while (i <= n) {
        /* find the next tag */
        size_t t = i;
        while (t + 1 < n &&
               !(s[t] == '{' &&
                 (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')))
            t++;
        if (t + 1 >= n)
            t = n;
        size_t a = i, b = t;
        /* the previous tag's right side */
        if (prev_rmod == '-')
            while (a < b && is_ws(s[a]))
                a++;
        else if (prev_block && prev_rmod != '+' && a < b && s[a] == '\n')
            a++;
        char kind = t < n ? s[t + 1] : 0;
        char lmod = t + 2 < n ? s[t + 2] : 0;
        if (kind && lmod == '-') {
            while (b > a && is_ws(s[b - 1]))
                b--;
        } else if ((kind == '%' || kind == '#') && lmod != '+') {
            size_t l = b;
            while (l > a && (s[l - 1] == ' ' || s[l - 1] == '\t'))
                l--;
            if (l == 0 || s[l - 1] == '\n')
                b = l;
        }
        if (!emit_text(d, out, s, a, b, line)) {
            free(s);
            return false;
        }
        line += count_lines(s + i, t - i);
        if (t >= n)
            break;
        i = t + 2;
        if (lmod == '-' || lmod == '+')
            i++;
        if (kind == '#') {
            const char *e = strstr(s + i, "#}");
            if (!e) {
                free(s);
                return fail_at(d, line, "unterminated comment");
            }
            size_t ce = e - s;
            prev_rmod = ce > i && (s[ce - 1] == '-' || s[ce - 1] == '+')
                            ? s[ce - 1]
                            : 0;
            line += count_lines(s + i, ce - i);
            i = ce + 2;
            prev_block = true;
            continue;
        }
        size_t mark = out->n;
        char rmod = 0;
        if (!tl_push(d, out,
                     (token){.kind = kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN,
                             .line = line}) ||
            !lex_tag(d, s, n, &i, &line, kind == '{' ? "}}" : "%}", out,
                     &rmod) ||
            !tl_push(d, out,
                     (token){.kind = kind == '{' ? T_VAR_END : T_BLOCK_END,
                             .line = line})) {
            free(s);
            return false;
        }
        prev_rmod = rmod;
        prev_block = kind == '%';
        /* {% raw %}: everything up to {% endraw %} is text */
        if (kind == '%' && out->n - mark == 3 &&
            out->v[mark + 1].kind == T_NAME &&
            !strcmp(out->v[mark + 1].s, "raw")) {
            size_t r = i, found = 0, after = 0;
            for (; r + 1 < n; r++) {
                if (s[r] != '{' || s[r + 1] != '%')
                    continue;
                size_t q = r + 2;
                if (q < n && (s[q] == '-' || s[q] == '+'))
                    q++;
                while (q < n && (s[q] == ' ' || s[q] == '\t' || s[q] == '\n'))
                    q++;
                if (strncmp(s + q, "endraw", 6))
                    continue;
                q += 6;
                while (q < n && (s[q] == ' ' || s[q] == '\t' || s[q] == '\n'))
                    q++;
                if (q < n && (s[q] == '-' || s[q] == '+'))
                    q++;
                if (!strncmp(s + q, "%}", 2)) {
                    found = r;
                    after = q + 2;
                    break;
                }
            }
            if (!after) {
                free(s);
                return fail_at(d, line, "{%% raw %%} without {%% endraw %%}");
            }
            for (size_t k = mark; k < out->n; k++)
                free(out->v[k].s);
            out->n = mark;
            size_t a2 = i, b2 = found; /* trim_blocks spares raw text */
            if (rmod == '-')
                while (a2 < b2 && is_ws(s[a2]))
                    a2++;
            if (s[found + 2] == '-')
                while (b2 > a2 && is_ws(s[b2 - 1]))
                    b2--;
            if (!emit_text(d, out, s, a2, b2, line)) {
                free(s);
                return false;
            }
            line += count_lines(s + i, after - i);
            prev_rmod =
                s[after - 3] == '-' || s[after - 3] == '+' ? s[after - 3] : 0;
            i = after;
        }
    }
    free(s);
    return tl_push(d, out, (token){.kind = T_EOF, .line = line});
}

/* ---- AST ---- */

typedef enum {
    /* statements */
    N_BODY,
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETBLOCK,
    N_MACRO,
    N_BREAK,
    N_CONTINUE,
    /* expressions */
    E_LIT,
    E_NAME,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,   /* a = callee, kids = args */
    E_FILTER, /* a = operand, s = filter name, kids = args */
    E_TEST,   /* a = operand, s = test name, kids = args, neg */
    E_BIN,    /* s = operator */
    E_AND,
    E_OR,
    E_NOT,
    E_NEG,
    E_COND, /* a if b else c */
    E_LIST,
    E_DICT /* kids = k0, v0, k1, v1, ... */
} node_kind;

typedef struct node node;
struct node {
    node_kind kind;
    int line;
    char *s, *s2; /* names; for N_FOR the targets, for N_SET ns.attr */
    size_t len;   /* N_TEXT: bytes of s (text may hold NULs) */
    json_t *lit;
    node *a, *b, *c;
    node **kids;
    int nkids;
    node **orelse; /* N_IF / N_FOR else branch, N_MACRO defaults */
    int nelse;
    char **kwn; /* keyword arguments of calls and filters */
    node **kwv;
    int nkw;
    bool neg;
};

static void node_free(node *x) {
    if (!x)
        return;
    free(x->s);
    free(x->s2);
    if (x->lit)
        json_decref(x->lit);
    node_free(x->a);
    node_free(x->b);
    node_free(x->c);
    for (int i = 0; i < x->nkids; i++)
        node_free(x->kids[i]);
    for (int i = 0; i < x->nelse; i++)
        node_free(x->orelse[i]);
    for (int i = 0; i < x->nkw; i++) {
        free(x->kwn[i]);
        node_free(x->kwv[i]);
    }
    free(x->kids);
    free(x->orelse);
    free(x->kwn);
    free(x->kwv);
    free(x);
}

/* ---- parser ---- */

typedef struct {
    diag *d;
    tok_list *t;
    size_t i;
    int depth;
} parser;

/* A new node, or NULL (out of memory, reported). */
static node *mk(parser *p, node_kind k, int line) {
    node *x = j_calloc(1, sizeof *x);
    if (!x) {
        oom_at(p->d, line);
        return NULL;
    }
    x->kind = k;
    x->line = line;
    return x;
}
/* A literal node holding j (NULL: its allocation failed); NULL on failure */
static node *mk_lit(parser *p, int line, json_t *j) {
    node *x = j ? mk(p, E_LIT, line) : NULL;
    if (!x) {
        json_decref(j);
        oom_at(p->d, line);
        return NULL;
    }
    x->lit = j;
    return x;
}
/* Appends k to (*v, *n); takes k, freeing it on failure. */
static bool push_kid(parser *p, node ***v, int *n, node *k) {
    node **nv = j_realloc(*v, (*n + 1) * sizeof **v);
    if (!nv) {
        node_free(k);
        return oom_at(p->d, p->t->v[p->i].line);
    }
    *v = nv;
    (*v)[(*n)++] = k;
    return true;
}
/* *dst = a copy of the current token's text */
static bool dup_name(parser *p, char **dst) {
    *dst = j_strdup(p->t->v[p->i].s);
    return *dst || oom_at(p->d, p->t->v[p->i].line);
}

static token *cur(parser *p) {
    return &p->t->v[p->i];
}
static bool is_op(parser *p, const char *op) {
    return cur(p)->kind == T_OP && !strcmp(cur(p)->s, op);
}
static bool is_name(parser *p, const char *nm) {
    return cur(p)->kind == T_NAME && !strcmp(cur(p)->s, nm);
}
static bool accept_op(parser *p, const char *op) {
    if (!is_op(p, op))
        return false;
    p->i++;
    return true;
}
static bool accept_name(parser *p, const char *nm) {
    if (!is_name(p, nm))
        return false;
    p->i++;
    return true;
}
static const char *tok_desc(token *t) {
    switch (t->kind) {
    case T_NAME:
    case T_OP:
        return t->s;
    case T_STRING:
        return "a string";
    case T_INT:
    case T_FLOAT:
        return "a number";
    case T_VAR_END:
        return "'}}'";
    case T_BLOCK_END:
        return "'%}'";
    case T_EOF:
        return "the end of the template";
    default:
        return "text";
    }
}
static bool expect_op(parser *p, const char *op) {
    if (accept_op(p, op))
        return true;
    return fail_at(p->d, cur(p)->line, "expected '%s', found %s", op,
                   tok_desc(cur(p)));
}

static node *parse_expr(parser *p);
static node *parse_or(parser *p);
static node *parse_unary(parser *p, bool with_filter);

/* (args, kwargs) after '(' up to ')' */
static bool parse_args(parser *p, node *call) {
    while (!accept_op(p, ")")) {
        if (call->nkids + call->nkw && !expect_op(p, ","))
            return false;
        if (accept_op(p, ")"))
            break;
        if (cur(p)->kind == T_NAME && p->t->v[p->i + 1].kind == T_OP &&
            !strcmp(p->t->v[p->i + 1].s, "=")) {
            char *nm;
            if (!dup_name(p, &nm))
                return false;
            p->i += 2;
            node *v = parse_expr(p);
            if (!v) {
                free(nm);
                return false;
            }
            char **kn = j_realloc(call->kwn, (call->nkw + 1) * sizeof(char *));
            if (kn)
                call->kwn = kn;
            node **kv =
                kn ? j_realloc(call->kwv, (call->nkw + 1) * sizeof(node *))
                   : NULL;
            if (!kv) {
                free(nm);
                node_free(v);
                return oom_at(p->d, cur(p)->line);
            }
            call->kwv = kv;
            call->kwn[call->nkw] = nm;
            call->kwv[call->nkw++] = v;
        } else {
            node *v = parse_expr(p);
            if (!v || !push_kid(p, &call->kids, &call->nkids, v))
                return false;
        }
    }
    return true;
}

static node *parse_primary(parser *p) {
    token *t = cur(p);
    node *x = NULL;
    if (++p->depth > MAX_DEPTH) {
        fail_at(p->d, t->line, "expression nested too deeply");
        return NULL;
    }
    switch (t->kind) {
    case T_NAME:
        p->i++;
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True"))
            x = mk_lit(p, t->line, json_true());
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False"))
            x = mk_lit(p, t->line, json_false());
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None"))
            x = mk_lit(p, t->line, json_null());
        else if ((x = mk(p, E_NAME, t->line)) && !(x->s = j_strdup(t->s))) {
            node_free(x);
            x = NULL;
            oom_at(p->d, t->line);
        }
        break;
    case T_STRING: {
        /* adjacent literals concatenate */
        ts_sbuf b = {0};
        sb_add(&b, "", 0);
        while (cur(p)->kind == T_STRING) {
            sb_add(&b, cur(p)->s, cur(p)->len);
            p->i++;
        }
        if (!b.oom && !valid_utf8(b.p, b.n))
            fail_at(p->d, t->line, "string literal is not valid UTF-8");
        else
            x = mk_lit(p, t->line, b.oom ? NULL : json_stringn(b.p, b.n));
        free(b.p);
        break;
    }
    case T_INT:
        if (t->i_min) {
            fail_at(p->d, t->line,
                    "integer literal 9223372036854775808 does not fit in 64 "
                    "bits (only its negative does)");
            return NULL;
        }
        p->i++;
        x = mk_lit(p, t->line, json_integer(t->i));
        break;
    case T_FLOAT:
        if (!isfinite(t->f)) {
            fail_at(p->d, t->line,
                    "float literal out of range (it would be inf)");
            return NULL;
        }
        p->i++;
        x = mk_lit(p, t->line, json_real(t->f));
        break;
    case T_OP:
        if (accept_op(p, "(")) {
            if (accept_op(p, ")")) { /* empty tuple */
                x = mk(p, E_LIST, t->line);
                break;
            }
            node *e = parse_expr(p);
            if (!e)
                break;
            if (is_op(p, ",")) { /* a tuple: a list for our purposes */
                x = mk(p, E_LIST, t->line);
                if (!x || !push_kid(p, &x->kids, &x->nkids, e)) {
                    if (!x)
                        node_free(e);
                    node_free(x);
                    x = NULL;
                    break;
                }
                while (accept_op(p, ",") && !is_op(p, ")")) {
                    node *k = parse_expr(p);
                    if (!k || !push_kid(p, &x->kids, &x->nkids, k)) {
                        node_free(x);
                        x = NULL;
                        break;
                    }
                }
                if (x && !expect_op(p, ")")) {
                    node_free(x);
                    x = NULL;
                }
                break;
            }
            if (!expect_op(p, ")")) {
                node_free(e);
                break;
            }
            x = e;
        } else if (accept_op(p, "[")) {
            x = mk(p, E_LIST, t->line);
            while (x && !accept_op(p, "]")) {
                if (x->nkids && !expect_op(p, ",")) {
                    node_free(x);
                    x = NULL;
                    break;
                }
                if (accept_op(p, "]"))
                    break;
                node *k = parse_expr(p);
                if (!k || !push_kid(p, &x->kids, &x->nkids, k)) {
                    node_free(x);
                    x = NULL;
                    break;
                }
            }
        } else if (accept_op(p, "{")) {
            x = mk(p, E_DICT, t->line);
            while (x && !accept_op(p, "}")) {
                if (x->nkids && !expect_op(p, ",")) {
                    node_free(x);
                    x = NULL;
                    break;
                }
                if (accept_op(p, "}"))
                    break;
                node *k = parse_expr(p), *v = NULL;
                if (k && expect_op(p, ":"))
                    v = parse_expr(p);
                if (!v) {
                    node_free(k);
                    node_free(x);
                    x = NULL;
                    break;
                }
                if (!push_kid(p, &x->kids, &x->nkids, k)) {
                    node_free(v);
                    node_free(x);
                    x = NULL;
                    break;
                }
                if (!push_kid(p, &x->kids, &x->nkids, v)) {
                    node_free(x);
                    x = NULL;
                    break;
                }
            }
        } else
            fail_at(p->d, t->line, "unexpected %s", tok_desc(t));
        break;
    default:
        fail_at(p->d, t->line, "unexpected %s", tok_desc(t));
        break;
    }
    p->depth--;
    return x;
}

static node *parse_postfix(parser *p, node *x) {
    while (x) {
        int line = cur(p)->line;
        if (accept_op(p, ".")) {
            if (cur(p)->kind != T_NAME && cur(p)->kind != T_INT) {
                fail_at(p->d, line, "expected an attribute name after '.'");
                node_free(x);
                return NULL;
            }
            if (cur(p)->kind == T_INT && cur(p)->i_min) {
                fail_at(p->d, line, "integer index does not fit in 64 bits");
                node_free(x);
                return NULL;
            }
            node *a = mk(p, E_ATTR, line);
            if (!a) {
                node_free(x);
                return NULL;
            }
            a->a = x;
            if (cur(p)->kind == T_INT) { /* x.0 is x[0] */
                a->kind = E_ITEM;
                a->b = mk_lit(p, line, json_integer(cur(p)->i));
            }
            if (cur(p)->kind == T_INT ? !a->b : !dup_name(p, &a->s)) {
                node_free(a);
                return NULL;
            }
            p->i++;
            x = a;
        } else if (accept_op(p, "[")) {
            node *idx[3] = {0};
            int nparts = 0;
            bool slice = false;
            for (;;) {
                if (!is_op(p, ":") && !is_op(p, "]")) {
                    idx[nparts] = parse_expr(p);
                    if (!idx[nparts])
                        goto bad;
                }
                nparts++;
                if (nparts < 3 && accept_op(p, ":")) {
                    slice = true;
                    continue;
                }
                break;
            }
            if (!expect_op(p, "]"))
                goto bad;
            node *s = mk(p, slice ? E_SLICE : E_ITEM, line);
            if (!s)
                goto bad;
            s->a = x;
            if (slice) {
                s->kids = j_calloc(3, sizeof(node *));
                if (!s->kids) {
                    s->a = NULL;
                    node_free(s);
                    oom_at(p->d, line);
                    goto bad;
                }
                s->nkids = 3;
                memcpy(s->kids, idx, sizeof idx);
            } else {
                if (!idx[0]) {
                    node_free(s);
                    fail_at(p->d, line, "empty subscript");
                    return NULL;
                }
                s->b = idx[0];
            }
            x = s;
            continue;
        bad:
            for (int k = 0; k < 3; k++)
                node_free(idx[k]);
            node_free(x);
            return NULL;
        } else if (accept_op(p, "(")) {
            node *c = mk(p, E_CALL, line);
            if (!c) {
                node_free(x);
                return NULL;
            }
            c->a = x;
            if (!parse_args(p, c)) {
                node_free(c);
                return NULL;
            }
            x = c;
        } else
            break;
    }
    return x;
}

static node *parse_filters_tests(parser *p, node *x) {
    while (x) {
        int line = cur(p)->line;
        if (accept_op(p, "|")) {
            if (cur(p)->kind != T_NAME) {
                fail_at(p->d, line, "expected a filter name after '|'");
                node_free(x);
                return NULL;
            }
            node *f = mk(p, E_FILTER, line);
            if (!f) {
                node_free(x);
                return NULL;
            }
            f->a = x;
            if (!dup_name(p, &f->s)) {
                node_free(f);
                return NULL;
            }
            p->i++;
            if (accept_op(p, "(") && !parse_args(p, f)) {
                node_free(f);
                return NULL;
            }
            x = f;
        } else if (accept_name(p, "is")) {
            node *t = mk(p, E_TEST, line);
            if (!t) {
                node_free(x);
                return NULL;
            }
            t->a = x;
            t->neg = accept_name(p, "not");
            if (cur(p)->kind != T_NAME) {
                fail_at(p->d, line, "expected a test name after 'is'");
                node_free(t);
                return NULL;
            }
            if (!dup_name(p, &t->s)) {
                node_free(t);
                return NULL;
            }
            p->i++;
            if (accept_op(p, "(")) {
                if (!parse_args(p, t)) {
                    node_free(t);
                    return NULL;
                }
            } else if (cur(p)->kind == T_STRING || cur(p)->kind == T_INT ||
                       cur(p)->kind == T_FLOAT || is_op(p, "[") ||
                       is_op(p, "{") ||
                       (cur(p)->kind == T_NAME && !is_name(p, "and") &&
                        !is_name(p, "or") && !is_name(p, "else") &&
                        !is_name(p, "if") && !is_name(p, "in") &&
                        !is_name(p, "is") && !is_name(p, "not"))) {
                /* `is divisibleby 3`, `is sameas false`: one argument */
                node *arg = parse_unary(p, false);
                if (!arg || !push_kid(p, &t->kids, &t->nkids, arg)) {
                    node_free(t);
                    return NULL;
                }
            }
            x = t;
        } else
            break;
    }
    return x;
}

static node *parse_unary(parser *p, bool with_filter) {
    int line = cur(p)->line;
    node *x;
    token *t = cur(p);
    if (is_op(p, "-") && t[1].kind == T_INT && t[1].i_min &&
        !(t[2].kind == T_OP && strchr(".[(", t[2].s[0]))) {
        p->i += 2; /* -9223372036854775808: INT64_MIN as one literal */
        x = mk_lit(p, line, json_integer(INT64_MIN));
    } else if (accept_op(p, "-")) {
        node *o = parse_unary(p, false);
        if (!o)
            return NULL;
        if (!(x = mk(p, E_NEG, line))) {
            node_free(o);
            return NULL;
        }
        x->a = o;
    } else if (accept_op(p, "+"))
        x = parse_unary(p, false);
    else
        x = parse_postfix(p, parse_primary(p));
    return with_filter ? parse_filters_tests(p, x) : x;
}

static node *bin(parser *p, node_kind k, const char *op, int line, node *a,
                 node *b) {
    node *x = a && b ? mk(p, k, line) : NULL;
    if (!x) {
        node_free(a);
        node_free(b);
        return NULL;
    }
    x->a = a;
    x->b = b;
    if (op && !(x->s = j_strdup(op))) {
        node_free(x);
        oom_at(p->d, line);
        return NULL;
    }
    return x;
}

static node *parse_pow(parser *p) {
    node *x = parse_unary(p, true);
    while (x && is_op(p, "**")) {
        int line = cur(p)->line;
        p->i++;
        x = bin(p, E_BIN, "**", line, x, parse_unary(p, true));
    }
    return x;
}
static node *parse_mul(parser *p) {
    node *x = parse_pow(p);
    while (x && (is_op(p, "*") || is_op(p, "/") || is_op(p, "//") ||
                 is_op(p, "%"))) {
        char op[3];
        strcpy(op, cur(p)->s);
        int line = cur(p)->line;
        p->i++;
        x = bin(p, E_BIN, op, line, x, parse_pow(p));
    }
    return x;
}
static node *parse_concat(parser *p) {
    node *x = parse_mul(p);
    while (x && is_op(p, "~")) {
        int line = cur(p)->line;
        p->i++;
        x = bin(p, E_BIN, "~", line, x, parse_mul(p));
    }
    return x;
}
static node *parse_add(parser *p) {
    node *x = parse_concat(p);
    while (x && (is_op(p, "+") || is_op(p, "-"))) {
        char op[2] = {cur(p)->s[0], 0};
        int line = cur(p)->line;
        p->i++;
        x = bin(p, E_BIN, op, line, x, parse_concat(p));
    }
    return x;
}
static node *parse_compare(parser *p) {
    node *x = parse_add(p);
    while (x) {
        int line = cur(p)->line;
        const char *op = NULL;
        if (is_op(p, "==") || is_op(p, "!=") || is_op(p, "<") ||
            is_op(p, ">") || is_op(p, "<=") || is_op(p, ">="))
            op = cur(p)->s;
        else if (is_name(p, "in"))
            op = "in";
        else if (is_name(p, "not") && p->t->v[p->i + 1].kind == T_NAME &&
                 !strcmp(p->t->v[p->i + 1].s, "in")) {
            p->i++;
            op = "not in";
        }
        if (!op)
            break;
        char o[8];
        snprintf(o, sizeof o, "%s", op);
        p->i++;
        x = bin(p, E_BIN, o, line, x, parse_add(p));
    }
    return x;
}
static node *parse_not(parser *p) {
    int line = cur(p)->line;
    if (accept_name(p, "not")) {
        node *o = parse_not(p);
        if (!o)
            return NULL;
        node *x = mk(p, E_NOT, line);
        if (!x) {
            node_free(o);
            return NULL;
        }
        x->a = o;
        return x;
    }
    return parse_compare(p);
}
static node *parse_and(parser *p) {
    node *x = parse_not(p);
    while (x && is_name(p, "and")) {
        int line = cur(p)->line;
        p->i++;
        x = bin(p, E_AND, NULL, line, x, parse_not(p));
    }
    return x;
}
static node *parse_or(parser *p) {
    node *x = parse_and(p);
    while (x && is_name(p, "or")) {
        int line = cur(p)->line;
        p->i++;
        x = bin(p, E_OR, NULL, line, x, parse_and(p));
    }
    return x;
}
static node *parse_expr(parser *p) {
    if (++p->depth > MAX_DEPTH) {
        fail_at(p->d, cur(p)->line, "expression nested too deeply");
        return NULL;
    }
    node *x = parse_or(p);
    while (x && is_name(p, "if")) {
        int line = cur(p)->line;
        p->i++;
        node *c = mk(p, E_COND, line);
        if (!c) {
            node_free(x);
            x = NULL;
            break;
        }
        c->a = x;
        c->b = parse_or(p);
        if (c->b && accept_name(p, "else"))
            c->c = parse_expr(p);
        if (!c->b || (p->d->failed)) {
            node_free(c);
            x = NULL;
            break;
        }
        x = c;
    }
    p->depth--;
    return x;
}

/* ---- statements ---- */

static bool end_block(parser *p) {
    if (cur(p)->kind == T_BLOCK_END) {
        p->i++;
        return true;
    }
    return fail_at(p->d, cur(p)->line, "expected '%%}', found %s",
                   tok_desc(cur(p)));
}

/* Parses statements into body until a {% name %} with name in `ends`
 * (space-separated); leaves p after that name and returns which. */
static bool parse_body(parser *p, node *body, const char *ends, char *which,
                       size_t which_cap);

static node *parse_target_list(parser *p, node *x) {
    /* for-loop targets: name or name, name */
    if (cur(p)->kind != T_NAME) {
        fail_at(p->d, cur(p)->line, "expected a loop variable name");
        return NULL;
    }
    if (!dup_name(p, &x->s))
        return NULL;
    p->i++;
    if (accept_op(p, ",")) {
        if (cur(p)->kind != T_NAME) {
            fail_at(p->d, cur(p)->line, "expected a loop variable name");
            return NULL;
        }
        if (!dup_name(p, &x->s2))
            return NULL;
        p->i++;
    }
    return x;
}

/* After a body that stopped at `which`: an else branch (when which is
 * "else") up to {% end %}, then the closing '%}'. */
static bool parse_else_end(parser *p, node *owner, const char *which,
                           const char *end) {
    char w[32];
    if (!strcmp(which, "else")) {
        node *eb = mk(p, N_BODY, cur(p)->line);
        if (!eb || !push_kid(p, &owner->orelse, &owner->nelse, eb) ||
            !end_block(p) || !parse_body(p, eb, end, w, sizeof w))
            return false;
    }
    return end_block(p);
}

static node *parse_stmt(parser *p) {
    token *t = cur(p);
    int line = t->line;
    if (t->kind != T_NAME) {
        fail_at(p->d, line, "expected a statement name, found %s", tok_desc(t));
        return NULL;
    }
    char which[32];
    if (accept_name(p, "if")) {
        node *x = mk(p, N_IF, line);
        if (!x)
            return NULL;
        x->a = parse_expr(p);
        if (x->a)
            x->b = mk(p, N_BODY, line);
        if (!x->b || !end_block(p) ||
            !parse_body(p, x->b, "elif else endif", which, sizeof which)) {
            node_free(x);
            return NULL;
        }
        node *tail = x;
        while (!strcmp(which, "elif")) {
            node *e = mk(p, N_IF, cur(p)->line);
            if (!e || !push_kid(p, &tail->orelse, &tail->nelse, e)) {
                node_free(x);
                return NULL;
            }
            e->a = parse_expr(p);
            if (e->a)
                e->b = mk(p, N_BODY, line);
            if (!e->b || !end_block(p) ||
                !parse_body(p, e->b, "elif else endif", which, sizeof which)) {
                node_free(x);
                return NULL;
            }
            tail = e;
        }
        if (!parse_else_end(p, tail, which, "endif")) {
            node_free(x);
            return NULL;
        }
        return x;
    }
    if (accept_name(p, "for")) {
        node *x = mk(p, N_FOR, line);
        if (!x)
            return NULL;
        if (!parse_target_list(p, x) ||
            (!accept_name(p, "in") &&
             !fail_at(p->d, cur(p)->line, "expected 'in' in a for loop"))) {
            node_free(x);
            return NULL;
        }
        x->a = parse_or(p); /* `if` here filters the loop */
        if (x->a && accept_name(p, "if"))
            x->c = parse_or(p);
        if (x->a && accept_name(p, "recursive")) {
            fail_at(p->d, line, "recursive for loops are not supported");
            node_free(x);
            return NULL;
        }
        if (x->a && !p->d->failed)
            x->b = mk(p, N_BODY, line);
        if (!x->b || !end_block(p) ||
            !parse_body(p, x->b, "else endfor", which, sizeof which)) {
            node_free(x);
            return NULL;
        }
        if (!parse_else_end(p, x, which, "endfor")) {
            node_free(x);
            return NULL;
        }
        return x;
    }
    if (accept_name(p, "set")) {
        if (cur(p)->kind != T_NAME) {
            fail_at(p->d, line, "expected a variable name after 'set'");
            return NULL;
        }
        node *x = mk(p, N_SET, line);
        if (!x || !dup_name(p, &x->s)) {
            node_free(x);
            return NULL;
        }
        p->i++;
        if (accept_op(p, ".")) {
            if (cur(p)->kind != T_NAME) {
                fail_at(p->d, line, "expected an attribute name after '.'");
                node_free(x);
                return NULL;
            }
            if (!dup_name(p, &x->s2)) {
                node_free(x);
                return NULL;
            }
            p->i++;
        } else if (is_op(p, ",")) {
            fail_at(p->d, line, "tuple assignment in set is not supported");
            node_free(x);
            return NULL;
        }
        if (cur(p)->kind == T_BLOCK_END && !x->s2) { /* block set */
            x->kind = N_SETBLOCK;
            p->i++;
            x->b = mk(p, N_BODY, line);
            if (!x->b || !parse_body(p, x->b, "endset", which, sizeof which) ||
                !end_block(p)) {
                node_free(x);
                return NULL;
            }
            return x;
        }
        if (!expect_op(p, "=") || !(x->a = parse_expr(p)) || !end_block(p)) {
            node_free(x);
            return NULL;
        }
        return x;
    }
    if (accept_name(p, "macro")) {
        if (cur(p)->kind != T_NAME) {
            fail_at(p->d, line, "expected a macro name");
            return NULL;
        }
        node *x = mk(p, N_MACRO, line);
        if (!x || !dup_name(p, &x->s)) {
            node_free(x);
            return NULL;
        }
        p->i++;
        /* parameters: kids = names as E_NAME, orelse = defaults (or NULL) */
        if (!expect_op(p, "(")) {
            node_free(x);
            return NULL;
        }
        while (!accept_op(p, ")")) {
            if (x->nkids && !expect_op(p, ",")) {
                node_free(x);
                return NULL;
            }
            if (cur(p)->kind != T_NAME) {
                fail_at(p->d, cur(p)->line, "expected a parameter name");
                node_free(x);
                return NULL;
            }
            node *nm = mk(p, E_NAME, cur(p)->line);
            if (nm && !dup_name(p, &nm->s)) {
                node_free(nm);
                nm = NULL;
            }
            if (!nm || !push_kid(p, &x->kids, &x->nkids, nm)) {
                node_free(x);
                return NULL;
            }
            p->i++;
            node *def = NULL;
            if ((accept_op(p, "=") && !(def = parse_expr(p))) ||
                !push_kid(p, &x->orelse, &x->nelse, def)) {
                node_free(x);
                return NULL;
            }
        }
        x->b = mk(p, N_BODY, line);
        if (!x->b || !end_block(p) ||
            !parse_body(p, x->b, "endmacro", which, sizeof which) ||
            !end_block(p)) {
            node_free(x);
            return NULL;
        }
        return x;
    }
    if (accept_name(p, "break") || accept_name(p, "continue")) {
        node *x = mk(p, strcmp(t->s, "break") ? N_CONTINUE : N_BREAK, line);
        if (!x || !end_block(p)) {
            node_free(x);
            return NULL;
        }
        return x;
    }
    if (is_name(p, "do") || is_name(p, "filter") || is_name(p, "call") ||
        is_name(p, "include") || is_name(p, "import") ||
        is_name(p, "extends") || is_name(p, "block") || is_name(p, "with") ||
        is_name(p, "generation") || is_name(p, "from")) {
        fail_at(p->d, line, "the '%s' statement is not supported", t->s);
        return NULL;
    }
    fail_at(p->d, line, "unknown statement '%s'", t->s);
    return NULL;
}

static bool parse_body(parser *p, node *body, const char *ends, char *which,
                       size_t which_cap) {
    if (++p->depth > MAX_DEPTH)
        return fail_at(p->d, cur(p)->line, "blocks nested too deeply");
    for (;;) {
        token *t = cur(p);
        if (t->kind == T_EOF) {
            if (ends)
                return fail_at(p->d, t->line,
                               "unexpected end of template: missing one of "
                               "'%s'",
                               ends);
            break;
        }
        if (t->kind == T_TEXT) {
            node *x = mk(p, N_TEXT, t->line);
            if (x && !(x->s = j_malloc(t->len + 1))) {
                node_free(x);
                return oom_at(p->d, t->line);
            }
            if (!x)
                return false;
            memcpy(x->s, t->s, t->len + 1);
            x->len = t->len;
            if (!push_kid(p, &body->kids, &body->nkids, x))
                return false;
            p->i++;
            continue;
        }
        if (t->kind == T_VAR_BEGIN) {
            p->i++;
            node *x = mk(p, N_OUT, t->line);
            if (!x)
                return false;
            x->a = parse_expr(p);
            if (!x->a) {
                node_free(x);
                return false;
            }
            if (cur(p)->kind != T_VAR_END) {
                node_free(x);
                return fail_at(p->d, cur(p)->line, "expected '}}', found %s",
                               tok_desc(cur(p)));
            }
            p->i++;
            if (!push_kid(p, &body->kids, &body->nkids, x))
                return false;
            continue;
        }
        if (t->kind != T_BLOCK_BEGIN)
            return fail_at(p->d, t->line, "unexpected %s", tok_desc(t));
        token *nm = &p->t->v[p->i + 1];
        if (nm->kind == T_NAME && ends) {
            /* is it one of our terminators? */
            size_t l = strlen(nm->s);
            const char *e = ends;
            while ((e = strstr(e, nm->s))) {
                if ((e == ends || e[-1] == ' ') && (e[l] == ' ' || !e[l])) {
                    snprintf(which, which_cap, "%s", nm->s);
                    p->i += 2;
                    p->depth--;
                    return true;
                }
                e += l;
            }
        }
        if (nm->kind == T_NAME &&
            (!strncmp(nm->s, "end", 3) || !strcmp(nm->s, "elif") ||
             !strcmp(nm->s, "else")))
            return fail_at(p->d, nm->line, "unexpected '%s'%s%s%s", nm->s,
                           ends ? " (expected one of '" : "", ends ? ends : "",
                           ends ? "')" : "");
        p->i++;
        node *x = parse_stmt(p);
        if (!x || !push_kid(p, &body->kids, &body->nkids, x))
            return false;
    }
    p->depth--;
    return true;
}

/* ---- values ---- */

typedef enum { V_UNDEF, V_JSON, V_NS, V_MACRO, V_LOOP } vkind;
typedef struct {
    vkind kind;
    json_t *j;         /* owned reference (V_JSON, V_NS, V_LOOP) */
    const node *macro; /* V_MACRO */
    const char *name;  /* V_UNDEF: what was looked up, for messages */
} val;

static val undef(const char *name) {
    return (val){.kind = V_UNDEF, .name = name};
}
static val jv(json_t *j) { /* takes the reference */
    return j ? (val){.kind = V_JSON, .j = j} : undef(NULL);
}
/* a value just built; NULL (its allocation failed) stops the render */
static val jnew(json_t *j) {
    if (!j)
        oom();
    return jv(j);
}
static val vcopy(val v) {
    if (v.j)
        json_incref(v.j);
    return v;
}
static void vfree(val *v) {
    if (v->j)
        json_decref(v->j);
    v->j = NULL;
}

typedef struct {
    char *name;
    val v;
} binding;
typedef struct {
    binding *b;
    int n, cap;
} frame;

typedef struct {
    diag d;
    ts_status status; /* of the error in d: a bad template unless set */
    frame *frames;
    int nframes, cap;
    int loopctl; /* 1 break, 2 continue */
    int depth;
} rt;

static bool frame_push(rt *r) {
    if (r->nframes == r->cap) {
        int cap = r->cap ? r->cap * 2 : 16;
        frame *f = j_realloc(r->frames, cap * sizeof *f);
        if (!f)
            return oom();
        r->frames = f;
        r->cap = cap;
    }
    r->frames[r->nframes++] = (frame){0};
    return true;
}
static void frame_pop(rt *r) {
    frame *f = &r->frames[--r->nframes];
    for (int i = 0; i < f->n; i++) {
        free(f->b[i].name);
        vfree(&f->b[i].v);
    }
    free(f->b);
}
/* takes v; out of memory, v is dropped and the render stops (oom()) */
static void bind(rt *r, const char *name, val v) {
    frame *f = &r->frames[r->nframes - 1];
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->b[i].name, name)) {
            vfree(&f->b[i].v);
            f->b[i].v = v;
            return;
        }
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 8;
        binding *b = j_realloc(f->b, cap * sizeof *b);
        if (!b) {
            vfree(&v);
            oom();
            return;
        }
        f->b = b;
        f->cap = cap;
    }
    char *nm = j_strdup(name);
    if (!nm) {
        vfree(&v);
        oom();
        return;
    }
    f->b[f->n++] = (binding){nm, v};
}
static const val *lookup(rt *r, const char *name) {
    for (int k = r->nframes - 1; k >= 0; k--) {
        frame *f = &r->frames[k];
        for (int i = 0; i < f->n; i++)
            if (!strcmp(f->b[i].name, name))
                return &f->b[i].v;
    }
    return NULL;
}

static bool budget_ok(rt *r, const node *x);
static bool verr(rt *r, const node *x, ts_status status, const char *fmt,
                 va_list ap) {
    if (r->d.failed)
        return false;
    if (cur_budget && cur_budget->over == BUDGET_OOM) /* the first cause */
        return budget_ok(r, x);
    char tmp[400];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    r->status = status;
    return fail_at(&r->d, x ? x->line : 0, "%s", tmp);
}
/* a fault of the template (or its variables) */
__attribute__((format(printf, 3, 4))) static bool err(rt *r, const node *x,
                                                      const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    bool ok = verr(r, x, TS_ERR_INVALID_ARG, fmt, ap);
    va_end(ap);
    return ok;
}
/* a value or a budget past what we can hold: integer overflow, the step
 * and byte limits */
__attribute__((format(printf, 3, 4))) static bool
err_range(rt *r, const node *x, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    bool ok = verr(r, x, TS_ERR_RANGE, fmt, ap);
    va_end(ap);
    return ok;
}

/* A spent budget as an error at x (true while it lasts). */
static bool budget_ok(rt *r, const node *x) {
    budget *b = cur_budget;
    if (!b || !b->over)
        return true;
    if (b->over == BUDGET_STEPS)
        return err_range(r, x,
                         "the template took more than %llu evaluation "
                         "steps, the limit for one render (a loop that "
                         "runs too long?)",
                         (unsigned long long)b->max_steps);
    if (b->over == BUDGET_BYTES)
        return err_range(r, x,
                         "the template built more than %zu bytes of "
                         "strings and lists, the limit for one render",
                         b->max_bytes);
    if (!r->d.failed)
        r->status = TS_ERR_OOM;
    return fail_at(&r->d, x ? x->line : 0, "out of memory while rendering");
}

static bool is_str(val v) {
    return v.kind == V_JSON && json_is_string(v.j);
}
static bool is_int(val v) {
    return v.kind == V_JSON && json_is_integer(v.j);
}
static bool is_bool(val v) {
    return v.kind == V_JSON && json_is_boolean(v.j);
}
static bool is_num(val v) {
    return v.kind == V_JSON && (json_is_number(v.j) || json_is_boolean(v.j));
}
static bool is_list(val v) {
    return v.kind == V_JSON && json_is_array(v.j);
}
static bool is_dict(val v) {
    return (v.kind == V_JSON || v.kind == V_NS || v.kind == V_LOOP) &&
           json_is_object(v.j);
}
static double num(val v) {
    return json_is_boolean(v.j) ? (double)json_is_true(v.j)
                                : json_number_value(v.j);
}
static long long inum(val v) {
    return json_is_boolean(v.j) ? json_is_true(v.j) : json_integer_value(v.j);
}
static const char *sval(val v) {
    return json_string_value(v.j);
}
static size_t slen(val v) {
    return json_string_length(v.j);
}
static val mkstr(const char *s, size_t n) {
    json_t *j = json_stringn_nocheck(s, n);
    if (j)
        return jv(j);
    oom(); /* a string all the same: callers read it before the error */
    return cur_budget && cur_budget->empty ? jv(json_incref(cur_budget->empty))
                                           : undef(NULL);
}
/* the string built in b (a failed allocation is reported, not dropped) */
static val sb_str(const ts_sbuf *b) {
    if (b->oom && cur_budget && !cur_budget->over)
        cur_budget->over = BUDGET_OOM;
    return mkstr(b->p ? b->p : "", b->n);
}

static bool truthy(val v) {
    switch (v.kind) {
    case V_UNDEF:
        return false;
    case V_NS:
    case V_MACRO:
    case V_LOOP:
        return true;
    default:
        break;
    }
    switch (json_typeof(v.j)) {
    case JSON_NULL:
    case JSON_FALSE:
        return false;
    case JSON_TRUE:
        return true;
    case JSON_INTEGER:
        return json_integer_value(v.j) != 0;
    case JSON_REAL:
        return json_real_value(v.j) != 0;
    case JSON_STRING:
        return json_string_length(v.j) != 0;
    case JSON_ARRAY:
        return json_array_size(v.j) != 0;
    case JSON_OBJECT:
        return json_object_size(v.j) != 0;
    }
    return false;
}

/* Python's repr() of a float. */
static void put_float(ts_sbuf *b, double f) {
    if (isnan(f)) {
        sb_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        sb_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    /* tmp = [-]d.ddde[+-]XX: digits and decimal exponent */
    char digits[24];
    int nd = 0, exp10;
    const char *q = tmp;
    bool negative = *q == '-';
    if (negative)
        q++;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9')
            digits[nd++] = *q;
    exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    if (negative)
        sb_puts(b, "-");
    if (exp10 >= -5 && exp10 < 16) {
        if (exp10 < 0) {
            sb_puts(b, "0.");
            for (int k = -1; k > exp10; k--)
                sb_puts(b, "0");
            sb_puts(b, digits);
        } else {
            for (int k = 0; k <= exp10; k++)
                sb_add(b, k < nd ? &digits[k] : "0", 1);
            sb_puts(b, ".");
            if (nd > exp10 + 1)
                sb_puts(b, digits + exp10 + 1);
            else
                sb_puts(b, "0");
        }
    } else {
        sb_add(b, digits, 1);
        if (nd > 1) {
            sb_puts(b, ".");
            sb_puts(b, digits + 1);
        }
        sb_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    }
}

static void put_repr_str(ts_sbuf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n), has_dq = memchr(s, '"', n);
    char q = has_sq && !has_dq ? '"' : '\'';
    sb_add(b, &q, 1);
    for (size_t i = 0; i < n;) {
        int32_t c;
        int k = u8_next(s, n, i, &c);
        if (c == q || c == '\\') {
            sb_puts(b, "\\");
            sb_add(b, s + i, 1);
        } else if (c == '\n')
            sb_puts(b, "\\n");
        else if (c == '\r')
            sb_puts(b, "\\r");
        else if (c == '\t')
            sb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f)
            sb_printf(b, "\\x%02x", c);
        else
            sb_add(b, s + i, k);
        i += k;
    }
    sb_add(b, &q, 1);
}

static void put_str(ts_sbuf *b, val v, bool repr);
static void put_json(ts_sbuf *b, json_t *j, bool repr) {
    val v = {.kind = V_JSON, .j = j};
    put_str(b, v, repr);
}
/* Python's str() (repr=false) or repr() of a value. */
static void put_str(ts_sbuf *b, val v, bool repr) {
    if (v.kind == V_UNDEF || !spend_steps(1)) /* a step per item printed */
        return;
    if (v.kind == V_MACRO) {
        sb_printf(b, "<Macro '%s'>", v.macro->s);
        return;
    }
    if (v.kind == V_NS)
        sb_puts(b, "<Namespace ");
    json_t *j = v.j;
    switch (json_typeof(j)) {
    case JSON_NULL:
        sb_puts(b, "None");
        break;
    case JSON_TRUE:
        sb_puts(b, "True");
        break;
    case JSON_FALSE:
        sb_puts(b, "False");
        break;
    case JSON_INTEGER:
        sb_printf(b, "%lld", (long long)json_integer_value(j));
        break;
    case JSON_REAL:
        put_float(b, json_real_value(j));
        break;
    case JSON_STRING:
        if (repr)
            put_repr_str(b, json_string_value(j), json_string_length(j));
        else
            sb_add(b, json_string_value(j), json_string_length(j));
        break;
    case JSON_ARRAY: {
        sb_puts(b, "[");
        size_t i;
        json_t *e;
        json_array_foreach(j, i, e) {
            if (i)
                sb_puts(b, ", ");
            put_json(b, e, true);
        }
        sb_puts(b, "]");
        break;
    }
    case JSON_OBJECT: {
        sb_puts(b, "{");
        const char *k;
        json_t *e;
        bool first = true;
        json_object_foreach(j, k, e) {
            if (!first)
                sb_puts(b, ", ");
            first = false;
            put_repr_str(b, k, strlen(k));
            sb_puts(b, ": ");
            put_json(b, e, true);
        }
        sb_puts(b, "}");
        break;
    }
    }
    if (v.kind == V_NS)
        sb_puts(b, ">");
}

/* json.dumps(x, ensure_ascii=False, indent=indent, separators=...,
 * sort_keys=...) */
typedef struct {
    long long indent; /* < 0: none */
    const char *item_sep, *key_sep;
    bool sort_keys;
} dump_opts;

static void dump_str(ts_sbuf *b, const char *s, size_t n) {
    sb_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        switch (c) {
        case '"':
            sb_puts(b, "\\\"");
            break;
        case '\\':
            sb_puts(b, "\\\\");
            break;
        case '\n':
            sb_puts(b, "\\n");
            break;
        case '\r':
            sb_puts(b, "\\r");
            break;
        case '\t':
            sb_puts(b, "\\t");
            break;
        case '\b':
            sb_puts(b, "\\b");
            break;
        case '\f':
            sb_puts(b, "\\f");
            break;
        default:
            if (c < 0x20)
                sb_printf(b, "\\u%04x", c);
            else
                sb_add(b, s + i, 1);
        }
    }
    sb_puts(b, "\"");
}

static int key_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void dump_json(ts_sbuf *b, json_t *j, const dump_opts *o, int level) {
    if (!spend_steps(1)) /* a step per item printed */
        return;
    switch (json_typeof(j)) {
    case JSON_NULL:
        sb_puts(b, "null");
        return;
    case JSON_TRUE:
        sb_puts(b, "true");
        return;
    case JSON_FALSE:
        sb_puts(b, "false");
        return;
    case JSON_INTEGER:
        sb_printf(b, "%lld", (long long)json_integer_value(j));
        return;
    case JSON_REAL: {
        double f = json_real_value(j);
        if (isnan(f))
            sb_puts(b, "NaN");
        else if (isinf(f))
            sb_puts(b, f < 0 ? "-Infinity" : "Infinity");
        else
            put_float(b, f);
        return;
    }
    case JSON_STRING:
        dump_str(b, json_string_value(j), json_string_length(j));
        return;
    default:
        break;
    }
    bool arr = json_is_array(j);
    size_t n = arr ? json_array_size(j) : json_object_size(j);
    sb_puts(b, arr ? "[" : "{");
    if (!n) {
        sb_puts(b, arr ? "]" : "}");
        return;
    }
    const char **keys = NULL;
    if (!arr) {
        keys = j_malloc(n * sizeof *keys);
        if (!keys) {
            oom();
            return;
        }
        size_t k = 0;
        const char *key;
        json_t *e;
        json_object_foreach(j, key, e) keys[k++] = key;
        if (o->sort_keys)
            qsort(keys, n, sizeof *keys, key_cmp);
    }
    for (size_t i = 0; i < n; i++) {
        if (i)
            sb_puts(b, o->item_sep);
        if (o->indent >= 0) {
            sb_puts(b, "\n");
            sb_spaces(b, o->indent, level + 1);
        }
        if (arr)
            dump_json(b, json_array_get(j, i), o, level + 1);
        else {
            dump_str(b, keys[i], strlen(keys[i]));
            sb_puts(b, o->key_sep);
            dump_json(b, json_object_get(j, keys[i]), o, level + 1);
        }
    }
    if (o->indent >= 0) {
        sb_puts(b, "\n");
        sb_spaces(b, o->indent, level);
    }
    sb_puts(b, arr ? "]" : "}");
    free(keys);
}

static val to_string(val v) {
    if (is_str(v))
        return vcopy(v);
    ts_sbuf b = {0};
    sb_add(&b, "", 0);
    put_str(&b, v, false);
    val s = sb_str(&b);
    free(b.p);
    return s;
}

/* Python equality across our types. */
static bool py_eq(val a, val b) {
    if (!spend_steps(1)) /* a step per pair compared; spent: an error above */
        return false;
    if (a.kind == V_UNDEF || b.kind == V_UNDEF)
        return a.kind == b.kind;
    if (a.kind != V_JSON || b.kind != V_JSON)
        return a.j == b.j;
    if (is_num(a) && is_num(b)) {
        if (is_int(a) && is_int(b))
            return inum(a) == inum(b);
        return num(a) == num(b);
    }
    if (json_typeof(a.j) != json_typeof(b.j))
        return false;
    if (json_is_array(a.j)) {
        size_t n = json_array_size(a.j);
        if (n != json_array_size(b.j))
            return false;
        for (size_t i = 0; i < n; i++)
            if (!py_eq(jv(json_array_get(a.j, i)), jv(json_array_get(b.j, i))))
                return false;
        return true;
    }
    if (json_is_object(a.j)) {
        if (json_object_size(a.j) != json_object_size(b.j))
            return false;
        const char *k;
        json_t *e;
        json_object_foreach(a.j, k, e) {
            json_t *o = json_object_get(b.j, k);
            if (!o || !py_eq(jv(e), jv(o)))
                return false;
        }
        return true;
    }
    return json_equal(a.j, b.j);
}

/* <0, 0, >0; false when the types do not order */
static bool py_cmp(rt *r, const node *x, val a, val b, int *out) {
    if (!spend_steps(1))
        return budget_ok(r, x);
    if (is_num(a) && is_num(b)) {
        if (is_int(a) && is_int(b))
            *out = (inum(a) > inum(b)) - (inum(a) < inum(b));
        else
            *out = (num(a) > num(b)) - (num(a) < num(b));
        return true;
    }
    if (is_str(a) && is_str(b)) {
        size_t n = slen(a) < slen(b) ? slen(a) : slen(b);
        int c = memcmp(sval(a), sval(b), n);
        *out = c ? c : (slen(a) > slen(b)) - (slen(a) < slen(b));
        return true;
    }
    if (is_list(a) && is_list(b)) {
        size_t na = json_array_size(a.j), nb = json_array_size(b.j);
        for (size_t i = 0; i < na && i < nb; i++) {
            val ea = jv(json_array_get(a.j, i)),
                eb = jv(json_array_get(b.j, i));
            if (!py_eq(ea, eb))
                return py_cmp(r, x, ea, eb, out);
        }
        *out = (na > nb) - (na < nb);
        return true;
    }
    return err(r, x, "cannot order values of different types");
}

static const char *type_name(val v) {
    if (v.kind == V_UNDEF)
        return "undefined";
    if (v.kind == V_NS)
        return "namespace";
    if (v.kind == V_MACRO)
        return "macro";
    if (v.kind == V_LOOP)
        return "loop";
    switch (json_typeof(v.j)) {
    case JSON_NULL:
        return "none";
    case JSON_TRUE:
    case JSON_FALSE:
        return "bool";
    case JSON_INTEGER:
        return "int";
    case JSON_REAL:
        return "float";
    case JSON_STRING:
        return "str";
    case JSON_ARRAY:
        return "list";
    case JSON_OBJECT:
        return "dict";
    }
    return "?";
}

static bool undef_error(rt *r, const node *x, val v) {
    if (v.name)
        return err(r, x, "'%s' is undefined", v.name);
    return err(r, x, "use of an undefined value");
}

/* Items of an iterable as a new JSON array (strings: characters; dicts:
 * keys; undefined: nothing). */
static bool iter_items(rt *r, const node *x, val v, json_t **out) {
    if (v.kind == V_UNDEF) {
        *out = new_array();
        return true;
    }
    if (is_list(v)) {
        *out = json_incref(v.j);
        return true;
    }
    if (is_dict(v)) {
        json_t *a = new_array();
        const char *k;
        json_t *e;
        json_object_foreach(v.j, k, e) list_add_new(a, json_string(k));
        *out = a;
        return true;
    }
    if (is_str(v)) {
        json_t *a = new_array();
        const char *s = sval(v);
        size_t n = slen(v);
        for (size_t i = 0; i < n;) {
            int32_t c;
            int k = u8_next(s, n, i, &c);
            list_add_str(a, s + i, k);
            i += k;
        }
        *out = a;
        return true;
    }
    return err(r, x, "'%s' object is not iterable", type_name(v));
}

static bool eval(rt *r, const node *x, val *out);
static bool render(rt *r, const node *body, ts_sbuf *out);

/* ---- attribute and item access ---- */

static val get_item(val obj, val key) {
    if (is_dict(obj)) {
        if (is_str(key)) {
            json_t *e = json_object_getn(obj.j, sval(key), slen(key));
            return e ? vcopy(jv(e)) : undef(NULL);
        }
        return undef(NULL);
    }
    if (is_list(obj) && (is_int(key) || is_bool(key))) {
        long long n = (long long)json_array_size(obj.j), i = inum(key);
        if (i < 0)
            i += n;
        if (i < 0 || i >= n)
            return undef(NULL);
        return vcopy(jv(json_array_get(obj.j, i)));
    }
    if (is_str(obj) && is_int(key)) {
        long long n = (long long)u8_len(sval(obj), slen(obj)), i = inum(key);
        if (i < 0)
            i += n;
        if (i < 0 || i >= n)
            return undef(NULL);
        size_t a = u8_offset(sval(obj), slen(obj), i);
        int32_t c;
        int k = u8_next(sval(obj), slen(obj), a, &c);
        return mkstr(sval(obj) + a, k);
    }
    return undef(NULL);
}

static val get_attr(val obj, const char *name) {
    if (is_dict(obj)) {
        json_t *e = json_object_get(obj.j, name);
        return e ? vcopy(jv(e)) : undef(name);
    }
    return undef(name);
}

/* Python slice indices for a sequence of length n. */
static bool slice_indices(rt *r, const node *x, val *parts, long long n,
                          long long *start, long long *stop, long long *step) {
    *step = 1;
    if (parts[2].kind != V_UNDEF &&
        !(parts[2].kind == V_JSON && json_is_null(parts[2].j))) {
        if (!is_int(parts[2]))
            return err(r, x, "slice step must be an integer");
        *step = inum(parts[2]);
        if (!*step)
            return err(r, x, "slice step cannot be zero");
    }
    long long def_start = *step > 0 ? 0 : n - 1, def_stop = *step > 0 ? n : -1;
    long long *dst[2] = {start, stop};
    long long defs[2] = {def_start, def_stop};
    for (int k = 0; k < 2; k++) {
        val p = parts[k];
        if (p.kind == V_UNDEF || (p.kind == V_JSON && json_is_null(p.j))) {
            *dst[k] = defs[k];
            continue;
        }
        if (!is_int(p))
            return err(r, x, "slice indices must be integers");
        long long v = inum(p);
        if (v < 0)
            v += n;
        if (*step > 0)
            v = v < 0 ? 0 : v > n ? n : v;
        else
            v = v < -1 ? -1 : v > n - 1 ? n - 1 : v;
        *dst[k] = v;
    }
    return true;
}

/* How many items start, start + step, ... fall before stop (indices
 * from slice_indices: within [-1, n]); counting first, the walk never adds
 * a step past stop (a step near INT64_MAX would overflow). */
static long long slice_count(long long start, long long stop, long long step) {
    unsigned long long span =
        step > 0 ? (stop > start ? (unsigned long long)(stop - start) : 0)
                 : (start > stop ? (unsigned long long)(start - stop) : 0);
    unsigned long long ast =
        step > 0 ? (unsigned long long)step : 0ull - (unsigned long long)step;
    return span ? (long long)((span - 1) / ast + 1) : 0;
}

static bool do_slice(rt *r, const node *x, val obj, val *parts, val *out) {
    long long start, stop, step;
    if (is_list(obj)) {
        long long n = json_array_size(obj.j);
        if (!slice_indices(r, x, parts, n, &start, &stop, &step))
            return false;
        json_t *a = new_array();
        long long count = slice_count(start, stop, step);
        for (long long k = 0, i = start; k < count; k++) {
            list_add(a, json_array_get(obj.j, i));
            if (k + 1 < count) /* never a step past stop */
                i += step;
        }
        *out = jv(a);
        return true;
    }
    if (is_str(obj)) {
        const char *s = sval(obj);
        size_t bn = slen(obj);
        long long n = u8_len(s, bn);
        if (!slice_indices(r, x, parts, n, &start, &stop, &step))
            return false;
        if (!spend_items((size_t)n + 1, sizeof(size_t)))
            return budget_ok(r, x);
        size_t *offs = j_malloc(((size_t)n + 1) * sizeof *offs);
        if (!offs)
            return oom() || budget_ok(r, x);
        size_t i = 0;
        for (long long k = 0; k <= n; k++) {
            offs[k] = i;
            if (k < n) {
                int32_t c;
                i += u8_next(s, bn, i, &c);
            }
        }
        ts_sbuf b = {0};
        sb_add(&b, "", 0);
        long long count = slice_count(start, stop, step);
        for (long long c = 0, k = start; c < count; c++) {
            sb_add(&b, s + offs[k], offs[k + 1] - offs[k]);
            if (c + 1 < count)
                k += step;
        }
        *out = sb_str(&b);
        free(b.p);
        free(offs);
        return true;
    }
    if (obj.kind == V_UNDEF)
        return undef_error(r, x, obj);
    return err(r, x, "'%s' object is not subscriptable", type_name(obj));
}

/* ---- arithmetic ----
 * Python's integers are unbounded, ours are 64-bit: a result that does not
 * fit is an error naming the operation, never a wrapped value. */

/* v as Python prints it, for messages */
static void num_text(val v, char *buf, size_t size) {
    if (is_bool(v)) {
        snprintf(buf, size, "%s", json_is_true(v.j) ? "True" : "False");
    } else if (json_is_real(v.j)) {
        ts_sbuf b = {0};
        put_float(&b, num(v));
        snprintf(buf, size, "%s", b.p ? b.p : "?");
        free(b.p);
    } else
        snprintf(buf, size, "%lld", inum(v));
}

static bool overflow_error(rt *r, const node *x, const char *op, val a, val b) {
    char p[64], q[64];
    num_text(a, p, sizeof p);
    num_text(b, q, sizeof q);
    return err_range(r, x,
                     "integer overflow in %s %s %s (integers are 64-bit "
                     "here, from %lld to %lld)",
                     p, op, q, (long long)INT64_MIN, (long long)INT64_MAX);
}

/* p ** q for q >= 0, false when it does not fit. By squaring: a square
 * that overflows is a factor of the result, whose magnitude is at least as
 * large. */
static bool int_pow(long long p, long long q, long long *v) {
    long long acc = 1, base = p;
    bool of = false;
    for (unsigned long long e = (unsigned long long)q; e && !of;) {
        if (e & 1)
            of |= __builtin_mul_overflow(acc, base, &acc);
        e >>= 1;
        if (e)
            of |= __builtin_mul_overflow(base, base, &base);
    }
    *v = acc;
    return !of;
}

/* a op b on integers (or bools) as Python computes them: + - * // % ** */
static bool int_arith(rt *r, const node *x, const char *op, val a, val b,
                      val *out) {
    long long p = inum(a), q = inum(b), v = 0;
    bool of = false;
    if (!strcmp(op, "+"))
        of = __builtin_add_overflow(p, q, &v);
    else if (!strcmp(op, "-"))
        of = __builtin_sub_overflow(p, q, &v);
    else if (!strcmp(op, "*"))
        of = __builtin_mul_overflow(p, q, &v);
    else if (!strcmp(op, "**")) {
        if (q < 0) { /* Python: a float */
            if (!p)
                return err(r, x,
                           "ZeroDivisionError: 0.0 cannot be raised "
                           "to a negative power");
            *out = jnew(json_real(pow((double)p, (double)q)));
            return true;
        }
        of = !int_pow(p, q, &v);
    } else if (!strcmp(op, "//")) {
        if (!q)
            return err(r, x,
                       "ZeroDivisionError: integer division or modulo by "
                       "zero");
        if (p == INT64_MIN && q == -1)
            of = true;
        else {
            v = p / q;
            if ((p % q) && ((p < 0) != (q < 0)))
                v--;
        }
    } else if (!strcmp(op, "%")) {
        if (!q)
            return err(r, x, "ZeroDivisionError: integer modulo by zero");
        if (q != -1) { /* x % -1 is 0; INT64_MIN % -1 traps in C */
            v = p % q;
            if (v && ((v < 0) != (q < 0)))
                v += q;
        }
    } else
        return err(r, x, "internal: unknown operator %s", op);
    if (of)
        return overflow_error(r, x, op, a, b);
    *out = jnew(json_integer(v));
    return true;
}

/* a op b where one is a float (or op is /), as Python computes them */
static bool float_arith(rt *r, const node *x, const char *op, val a, val b,
                        val *out) {
    double p = num(a), q = num(b), v = 0;
    bool ints = !json_is_real(a.j) && !json_is_real(b.j);
    if (!strcmp(op, "+"))
        v = p + q;
    else if (!strcmp(op, "-"))
        v = p - q;
    else if (!strcmp(op, "*"))
        v = p * q;
    else if (!strcmp(op, "/")) {
        if (q == 0)
            return err(r, x, "ZeroDivisionError: %sdivision by zero",
                       ints ? "" : "float ");
        v = p / q;
    } else if (!strcmp(op, "//") || !strcmp(op, "%")) {
        if (q == 0)
            return err(r, x, "ZeroDivisionError: float %s",
                       op[0] == '%' ? "modulo" : "floor division by zero");
        /* CPython's float_divmod */
        double mod = fmod(p, q), div = (p - mod) / q;
        if (mod) {
            if ((q < 0) != (mod < 0)) {
                mod += q;
                div -= 1.0;
            }
        } else
            mod = copysign(0.0, q);
        if (div) {
            double fl = floor(div);
            v = div - fl > 0.5 ? fl + 1.0 : fl;
        } else
            v = copysign(0.0, p / q);
        if (op[0] == '%')
            v = mod;
    } else if (!strcmp(op, "**")) {
        if (p == 0 && q < 0)
            return err(r, x,
                       "ZeroDivisionError: 0.0 cannot be raised to a "
                       "negative power");
        if (p < 0 && isfinite(q) && q != floor(q)) {
            char ps[64], qs[64];
            num_text(a, ps, sizeof ps);
            num_text(b, qs, sizeof qs);
            return err(r, x,
                       "%s ** %s is a complex number, which chat templates "
                       "do not support",
                       ps, qs);
        }
        v = pow(p, q);
        if (isinf(v) && isfinite(p) && isfinite(q)) {
            char ps[64], qs[64];
            num_text(a, ps, sizeof ps);
            num_text(b, qs, sizeof qs);
            return err_range(r, x,
                             "OverflowError: %s ** %s: Numerical result out "
                             "of range",
                             ps, qs);
        }
    } else
        return err(r, x, "internal: unknown operator %s", op);
    if (!isfinite(v)) { /* JSON values hold no inf or nan */
        char ps[64], qs[64];
        num_text(a, ps, sizeof ps);
        num_text(b, qs, sizeof qs);
        return err_range(r, x,
                         "float overflow in %s %s %s: the result is %s, "
                         "which values here cannot hold",
                         ps, op, qs, isnan(v) ? "nan" : "inf");
    }
    *out = jnew(json_real(v));
    return true;
}

/* s * n for a string or a list s: n copies (none when n <= 0), its size
 * charged to the byte budget before it is built */
static bool repeat(rt *r, const node *x, val s, long long n, val *out) {
    size_t len = is_str(s) ? slen(s) : json_array_size(s.j);
    size_t copies = n > 0 && len ? (size_t)n : 0, total;
    if (__builtin_mul_overflow(copies, len, &total))
        over_bytes();
    if (!budget_ok(r, x))
        return false;
    if (is_str(s)) {
        if (!spend_bytes(total))
            return budget_ok(r, x);
        char *t = j_malloc(total + 1);
        if (!t)
            return oom() || budget_ok(r, x);
        for (size_t k = 0; k < total;) { /* doubling copies */
            size_t m = k ? (k < total - k ? k : total - k) : len;
            memcpy(t + k, k ? t : sval(s), m);
            k += m;
        }
        *out = mkstr(t, total);
        free(t);
        return budget_ok(r, x);
    }
    if (!spend_items(total, LIST_ITEM_BYTES))
        return budget_ok(r, x);
    json_t *l = new_array();
    for (size_t i = 0; i < copies; i++)
        if (json_array_extend(l, s.j)) {
            oom();
            break;
        }
    *out = jv(l);
    return true;
}

static bool binop(rt *r, const node *x, const char *op, val a, val b,
                  val *out) {
    if (!strcmp(op, "~")) {
        val sa = to_string(a), sb = to_string(b);
        ts_sbuf s = {0};
        sb_add(&s, sval(sa), slen(sa));
        sb_add(&s, sval(sb), slen(sb));
        *out = sb_str(&s);
        free(s.p);
        vfree(&sa);
        vfree(&sb);
        return true;
    }
    if (!strcmp(op, "==") || !strcmp(op, "!=")) {
        bool e = py_eq(a, b);
        *out = jnew(json_boolean(op[0] == '=' ? e : !e));
        return true;
    }
    if (!strcmp(op, "in") || !strcmp(op, "not in")) {
        bool found = false;
        if (is_str(b)) {
            if (!is_str(a))
                return err(r, x, "'in <string>' requires a string on the left");
            found = slen(a) == 0 ||
                    (slen(a) <= slen(b) &&
                     memmem(sval(b), slen(b), sval(a), slen(a)) != NULL);
        } else if (is_list(b)) {
            for (size_t i = 0; i < json_array_size(b.j) && !found; i++)
                found = py_eq(a, jv(json_array_get(b.j, i)));
        } else if (is_dict(b)) {
            found = is_str(a) && json_object_getn(b.j, sval(a), slen(a));
        } else if (b.kind == V_UNDEF) {
            return undef_error(r, x, b);
        } else
            return err(r, x, "argument of type '%s' is not iterable",
                       type_name(b));
        *out = jnew(json_boolean(op[0] == 'i' ? found : !found));
        return true;
    }
    if (op[0] == '<' || op[0] == '>') {
        int c;
        if (!py_cmp(r, x, a, b, &c))
            return false;
        bool v = !strcmp(op, "<")    ? c < 0
                 : !strcmp(op, "<=") ? c <= 0
                 : !strcmp(op, ">")  ? c > 0
                                     : c >= 0;
        *out = jnew(json_boolean(v));
        return true;
    }
    if (a.kind == V_UNDEF)
        return undef_error(r, x, a);
    if (b.kind == V_UNDEF)
        return undef_error(r, x, b);
    if (!strcmp(op, "+") && is_str(a) && is_str(b)) {
        ts_sbuf s = {0};
        sb_add(&s, sval(a), slen(a));
        sb_add(&s, sval(b), slen(b));
        *out = sb_str(&s);
        free(s.p);
        return true;
    }
    if (!strcmp(op, "+") && is_list(a) && is_list(b)) {
        if (!spend_items(json_array_size(a.j) + json_array_size(b.j),
                         LIST_ITEM_BYTES))
            return budget_ok(r, x);
        json_t *l = json_copy(a.j);
        if (json_array_extend(l, b.j))
            oom();
        *out = jv(l);
        return true;
    }
    if (!strcmp(op, "*") && ((is_int(a) && (is_str(b) || is_list(b))) ||
                             ((is_str(a) || is_list(a)) && is_int(b))))
        return repeat(r, x, is_int(a) ? b : a, is_int(a) ? inum(a) : inum(b),
                      out);
    if (!is_num(a) || !is_num(b))
        return err(r, x, "unsupported operand types for %s: '%s' and '%s'", op,
                   type_name(a), type_name(b));
    if (!json_is_real(a.j) && !json_is_real(b.j) && strcmp(op, "/"))
        return int_arith(r, x, op, a, b, out);
    return float_arith(r, x, op, a, b, out);
}

/* ---- string helpers ---- */

static bool in_chars(int32_t c, val chars) {
    if (chars.kind == V_UNDEF || !is_str(chars))
        return py_isspace(c);
    const char *s = sval(chars);
    size_t n = slen(chars);
    for (size_t i = 0; i < n;) {
        int32_t d;
        i += u8_next(s, n, i, &d);
        if (d == c)
            return true;
    }
    return false;
}

static val str_strip(val s, val chars, bool left, bool right) {
    const char *p = sval(s);
    size_t n = slen(s), a = 0, b = n;
    while (left && a < b) {
        int32_t c;
        int k = u8_next(p, n, a, &c);
        if (!in_chars(c, chars))
            break;
        a += k;
    }
    while (right && b > a) {
        size_t st = b - 1;
        while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80)
            st--;
        int32_t c;
        u8_next(p, n, st, &c);
        if (!in_chars(c, chars))
            break;
        b = st;
    }
    return mkstr(p + a, b - a);
}

static val str_map_case(val s, int mode) { /* 0 lower, 1 upper */
    const char *p = sval(s);
    size_t n = slen(s);
    ts_sbuf b = {0};
    sb_add(&b, "", 0);
    for (size_t i = 0; i < n;) {
        int32_t c;
        i += u8_next(p, n, i, &c);
        c = mode ? utf8proc_toupper(c) : utf8proc_tolower(c);
        utf8proc_uint8_t u[4];
        sb_add(&b, (char *)u, utf8proc_encode_char(c, u));
    }
    val v = sb_str(&b);
    free(b.p);
    return v;
}

static bool is_cased_letter(int32_t c) {
    return utf8proc_toupper(c) != c || utf8proc_tolower(c) != c;
}

/* Python str.title() (word_split=false) or jinja's title filter (words
 * begin after whitespace, '-', '(', '{', '[', '<'); also capitalize */
static val str_title(val s, int mode) { /* 0 str.title, 1 jinja, 2 capitalize */
    const char *p = sval(s);
    size_t n = slen(s);
    ts_sbuf b = {0};
    sb_add(&b, "", 0);
    bool start = true;
    for (size_t i = 0; i < n;) {
        int32_t c;
        i += u8_next(p, n, i, &c);
        int32_t o;
        if (mode == 2) {
            o = start ? utf8proc_toupper(c) : utf8proc_tolower(c);
            start = false;
        } else if (mode == 0) {
            o = start ? utf8proc_toupper(c) : utf8proc_tolower(c);
            start = !is_cased_letter(c);
        } else {
            o = start ? utf8proc_toupper(c) : utf8proc_tolower(c);
            start = py_isspace(c) || c == '-' || c == '(' || c == '{' ||
                    c == '[' || c == '<';
        }
        utf8proc_uint8_t u[4];
        sb_add(&b, (char *)u, utf8proc_encode_char(o, u));
    }
    val v = sb_str(&b);
    free(b.p);
    return v;
}

static val str_replace(val s, val old, val new, long long count) {
    ts_sbuf b = {0};
    sb_add(&b, "", 0);
    const char *p = sval(s);
    size_t n = slen(s), on = slen(old);
    size_t i = 0;
    long long done = 0;
    if (!on) { /* Python inserts `new` between characters */
        for (; i <= n && (count < 0 || done < count); done++) {
            sb_add(&b, sval(new), slen(new));
            if (i == n) {
                i++;
                break;
            }
            int32_t c;
            int k = u8_next(p, n, i, &c);
            sb_add(&b, p + i, k);
            i += k;
        }
        if (i < n)
            sb_add(&b, p + i, n - i);
    } else {
        while (i < n && (count < 0 || done < count)) {
            const char *f = memmem(p + i, n - i, sval(old), on);
            if (!f)
                break;
            sb_add(&b, p + i, f - (p + i));
            sb_add(&b, sval(new), slen(new));
            i = f - p + on;
            done++;
        }
        sb_add(&b, p + i, n - i);
    }
    val v = sb_str(&b);
    free(b.p);
    return v;
}

static val str_split(val s, val sep, long long maxsplit) {
    json_t *a = new_array();
    const char *p = sval(s);
    size_t n = slen(s);
    if (sep.kind == V_UNDEF || !is_str(sep)) { /* runs of whitespace */
        size_t i = 0;
        long long done = 0;
        for (;;) {
            while (i < n) {
                int32_t c;
                int k = u8_next(p, n, i, &c);
                if (!py_isspace(c))
                    break;
                i += k;
            }
            if (i >= n)
                break;
            if (maxsplit >= 0 && done >= maxsplit) {
                /* the rest, with trailing whitespace stripped */
                val rest = mkstr(p + i, n - i);
                val t = str_strip(rest, undef(NULL), false, true);
                list_add(a, t.j);
                vfree(&rest);
                vfree(&t);
                break;
            }
            size_t j = i;
            while (j < n) {
                int32_t c;
                int k = u8_next(p, n, j, &c);
                if (py_isspace(c))
                    break;
                j += k;
            }
            list_add_str(a, p + i, j - i);
            done++;
            i = j;
        }
        return jv(a);
    }
    size_t sn = slen(sep), i = 0;
    long long done = 0;
    for (;;) {
        const char *f = (maxsplit < 0 || done < maxsplit) && sn
                            ? memmem(p + i, n - i, sval(sep), sn)
                            : NULL;
        if (!f) {
            list_add_str(a, p + i, n - i);
            break;
        }
        list_add_str(a, p + i, f - (p + i));
        i = f - p + sn;
        done++;
    }
    return jv(a);
}

/* ---- calls: arguments ---- */

typedef struct {
    val pos[8];
    int npos;
    char *kwn[8];
    val kw[8];
    int nkw;
} args;

/* Scanning a string costs a step per 64 bytes (searches, comparisons,
 * strip, length, indexing); what is built is charged as bytes. */
static void charge_scan(val v) {
    if (is_str(v))
        spend_steps(slen(v) / 64);
}
static void charge_args(const args *a) {
    for (int i = 0; i < a->npos; i++)
        charge_scan(a->pos[i]);
    for (int i = 0; i < a->nkw; i++)
        charge_scan(a->kw[i]);
}

static void args_free(args *a) {
    for (int i = 0; i < a->npos; i++)
        vfree(&a->pos[i]);
    for (int i = 0; i < a->nkw; i++)
        vfree(&a->kw[i]);
}

static bool eval_args(rt *r, const node *x, args *a, val *first) {
    memset(a, 0, sizeof *a);
    if (first)
        a->pos[a->npos++] = *first;
    if (x->nkids + a->npos > 8 || x->nkw > 8)
        return err(r, x, "too many arguments");
    for (int i = 0; i < x->nkids; i++) {
        if (!eval(r, x->kids[i], &a->pos[a->npos]))
            return false;
        a->npos++;
    }
    for (int i = 0; i < x->nkw; i++) {
        if (!eval(r, x->kwv[i], &a->kw[a->nkw]))
            return false;
        a->kwn[a->nkw++] = x->kwn[i];
    }
    return true;
}

/* positional i, or keyword `name`, or undefined */
static val arg(const args *a, int i, const char *name) {
    if (i >= 0 && i < a->npos)
        return a->pos[i];
    for (int k = 0; k < a->nkw; k++)
        if (name && !strcmp(a->kwn[k], name))
            return a->kw[k];
    return undef(NULL);
}

/* ---- tests ---- */

static bool run_test(rt *r, const node *x, const char *name, args *a,
                     bool *res) {
    val v = a->pos[0];
    val o = arg(a, 1, NULL);
    if (!strcmp(name, "defined"))
        *res = v.kind != V_UNDEF;
    else if (!strcmp(name, "undefined"))
        *res = v.kind == V_UNDEF;
    else if (!strcmp(name, "none"))
        *res = v.kind == V_JSON && json_is_null(v.j);
    else if (!strcmp(name, "string"))
        *res = is_str(v);
    else if (!strcmp(name, "number"))
        *res = is_num(v);
    else if (!strcmp(name, "integer"))
        *res = is_int(v);
    else if (!strcmp(name, "float"))
        *res = v.kind == V_JSON && json_is_real(v.j);
    else if (!strcmp(name, "boolean"))
        *res = is_bool(v);
    else if (!strcmp(name, "true"))
        *res = v.kind == V_JSON && json_is_true(v.j);
    else if (!strcmp(name, "false"))
        *res = v.kind == V_JSON && json_is_false(v.j);
    else if (!strcmp(name, "mapping"))
        *res = is_dict(v) && v.kind != V_LOOP;
    else if (!strcmp(name, "iterable"))
        *res = v.kind == V_UNDEF || is_str(v) || is_list(v) ||
               (is_dict(v) && v.kind == V_JSON);
    else if (!strcmp(name, "sequence"))
        *res = is_str(v) || is_list(v) || (is_dict(v) && v.kind == V_JSON);
    else if (!strcmp(name, "callable"))
        *res = v.kind == V_MACRO;
    else if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (!is_int(v) && !is_bool(v))
            return err(r, x, "test '%s' needs an integer", name);
        *res = (inum(v) & 1) == (name[0] == 'o');
    } else if (!strcmp(name, "divisibleby")) {
        if (!is_num(v) || !is_num(o))
            return err(r, x, "test 'divisibleby' needs numbers");
        if (num(o) == 0)
            return err(r, x, "ZeroDivisionError: %s",
                       json_is_real(v.j) || json_is_real(o.j)
                           ? "float modulo"
                           : "integer modulo by zero");
        if (json_is_real(v.j) || json_is_real(o.j))
            *res = fmod(num(v), num(o)) == 0;
        else /* exact for 64-bit values, and INT64_MIN % -1 does not trap */
            *res = inum(o) == -1 || inum(v) % inum(o) == 0;
    } else if (!strcmp(name, "eq") || !strcmp(name, "equalto") ||
               !strcmp(name, "==") || !strcmp(name, "sameas"))
        *res =
            py_eq(v, o) && (strcmp(name, "sameas") || is_bool(v) == is_bool(o));
    else if (!strcmp(name, "ne") || !strcmp(name, "!="))
        *res = !py_eq(v, o);
    else if (!strcmp(name, "lt") || !strcmp(name, "gt") ||
             !strcmp(name, "le") || !strcmp(name, "ge") ||
             !strcmp(name, "lessthan") || !strcmp(name, "greaterthan")) {
        int c;
        if (!py_cmp(r, x, v, o, &c))
            return false;
        *res = name[0] == 'l'
                   ? (name[1] == 'e' && name[2] == 0 ? c <= 0 : c < 0)
                   : (name[1] == 'e' ? c >= 0 : c > 0);
        if (!strcmp(name, "lessthan"))
            *res = c < 0;
    } else if (!strcmp(name, "in")) {
        val t;
        if (!binop(r, x, "in", v, o, &t))
            return false;
        *res = truthy(t);
        vfree(&t);
    } else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (!is_str(v))
            return err(r, x, "test '%s' needs a string", name);
        val m = str_map_case(v, name[0] == 'u');
        *res = !strcmp(sval(m), sval(v));
        vfree(&m);
    } else
        return err(r, x, "unknown test '%s'", name);
    return true;
}

/* ---- filters ---- */

static bool apply_filter(rt *r, const node *x, const char *name, args *a,
                         val *out);

static val attr_path(val obj, val path) {
    /* "a.b" or an integer index */
    if (is_int(path))
        return get_item(obj, path);
    if (!is_str(path))
        return undef(NULL);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", sval(path));
    val cur = vcopy(obj);
    for (char *tok = strtok(buf, "."); tok; tok = strtok(NULL, ".")) {
        val nx = get_attr(cur, tok);
        vfree(&cur);
        cur = nx;
    }
    return cur;
}

static bool select_items(rt *r, const node *x, args *a, bool by_attr,
                         bool reject, val *out) {
    json_t *items;
    if (!iter_items(r, x, a->pos[0], &items))
        return false;
    json_t *res = new_array();
    size_t i;
    json_t *e;
    json_array_foreach(items, i, e) {
        if (!spend_steps(1)) /* a step per item tested */
            break;
        val item = jv(json_incref(e));
        val subject = by_attr ? attr_path(item, arg(a, 1, NULL)) : vcopy(item);
        bool ok;
        int first_test_arg = by_attr ? 2 : 1;
        if (a->npos > first_test_arg) {
            args t = {0};
            t.pos[t.npos++] = subject;
            for (int k = first_test_arg + 1; k < a->npos && t.npos < 8; k++)
                t.pos[t.npos++] = a->pos[k];
            val tn = a->pos[first_test_arg];
            if (!is_str(tn)) {
                vfree(&item);
                vfree(&subject);
                json_decref(items);
                json_decref(res);
                return err(r, x, "select: the test name must be a string");
            }
            if (!run_test(r, x, sval(tn), &t, &ok)) {
                vfree(&item);
                vfree(&subject);
                json_decref(items);
                json_decref(res);
                return false;
            }
        } else
            ok = truthy(subject);
        if (ok != reject)
            list_add(res, e);
        vfree(&item);
        vfree(&subject);
    }
    json_decref(items);
    *out = jv(res);
    return true;
}

static bool need_str(rt *r, const node *x, const char *what, val v) {
    if (is_str(v))
        return true;
    if (v.kind == V_UNDEF)
        return undef_error(r, x, v);
    return err(r, x, "%s needs a string, not '%s'", what, type_name(v));
}

static bool apply_filter(rt *r, const node *x, const char *name, args *a,
                         val *out) {
    val v = a->pos[0];
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        long long n = 0;
        if (is_str(v))
            n = u8_len(sval(v), slen(v));
        else if (is_list(v))
            n = json_array_size(v.j);
        else if (is_dict(v))
            n = json_object_size(v.j);
        else if (v.kind != V_UNDEF)
            return err(r, x, "object of type '%s' has no length", type_name(v));
        *out = jnew(json_integer(n));
        return true;
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        bool boolean = truthy(arg(a, 2, "boolean"));
        bool use_default = v.kind == V_UNDEF || (boolean && !truthy(v));
        val dflt = arg(a, 1, "default_value");
        *out = use_default ? (dflt.kind == V_UNDEF ? mkstr("", 0) : vcopy(dflt))
                           : vcopy(v);
        return true;
    }
    if (!strcmp(name, "tojson")) {
        if (v.kind == V_UNDEF)
            return undef_error(r, x, v);
        if (v.kind == V_MACRO)
            return err(r, x, "a macro is not JSON serializable");
        val ind = arg(a, 1, "indent"), seps = arg(a, 3, "separators");
        dump_opts o = {.indent = is_int(ind) ? inum(ind) : -1,
                       .item_sep = ", ",
                       .key_sep = ": ",
                       .sort_keys = truthy(arg(a, 4, "sort_keys"))};
        if (o.indent >= 0)
            o.item_sep = ",";
        if (is_list(seps) && json_array_size(seps.j) == 2) {
            o.item_sep = json_string_value(json_array_get(seps.j, 0));
            o.key_sep = json_string_value(json_array_get(seps.j, 1));
            if (!o.item_sep || !o.key_sep)
                return err(r, x, "tojson: separators must be two strings");
        }
        ts_sbuf b = {0};
        sb_add(&b, "", 0);
        dump_json(&b, v.j, &o, 0);
        *out = sb_str(&b);
        free(b.p);
        return true;
    }
    if (!strcmp(name, "string")) {
        *out = to_string(v);
        return true;
    }
    if (!strcmp(name, "safe") || !strcmp(name, "list")) {
        if (name[0] == 's') {
            *out = vcopy(v);
            return true;
        }
        json_t *items;
        if (!iter_items(r, x, v, &items))
            return false;
        if (spend_items(json_array_size(items), LIST_ITEM_BYTES))
            *out = jnew(json_copy(items));
        json_decref(items);
        return budget_ok(r, x);
    }
    if (!strcmp(name, "trim") || !strcmp(name, "upper") ||
        !strcmp(name, "lower") || !strcmp(name, "capitalize") ||
        !strcmp(name, "title")) {
        val s = to_string(v);
        if (!strcmp(name, "trim"))
            *out = str_strip(s, arg(a, 1, "chars"), true, true);
        else if (!strcmp(name, "upper") || !strcmp(name, "lower"))
            *out = str_map_case(s, name[0] == 'u');
        else
            *out = str_title(s, name[0] == 'c' ? 2 : 1);
        vfree(&s);
        return true;
    }
    if (!strcmp(name, "replace")) {
        val s = to_string(v), o = arg(a, 1, "old"), n = arg(a, 2, "new"),
            c = arg(a, 3, "count");
        if (!is_str(o) || !is_str(n)) {
            vfree(&s);
            return err(r, x, "replace needs two strings");
        }
        *out = str_replace(s, o, n, is_int(c) ? inum(c) : -1);
        vfree(&s);
        return true;
    }
    if (!strcmp(name, "join")) {
        json_t *items;
        if (!iter_items(r, x, v, &items))
            return false;
        val d = arg(a, 1, "d"), at = arg(a, 2, "attribute");
        ts_sbuf b = {0};
        sb_add(&b, "", 0);
        size_t i;
        json_t *e;
        json_array_foreach(items, i, e) {
            if (i && is_str(d))
                sb_add(&b, sval(d), slen(d));
            val item = jv(json_incref(e));
            val sub = at.kind != V_UNDEF ? attr_path(item, at) : vcopy(item);
            put_str(&b, sub, false);
            vfree(&sub);
            vfree(&item);
        }
        json_decref(items);
        *out = sb_str(&b);
        free(b.p);
        return true;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        json_t *items;
        if (!iter_items(r, x, v, &items))
            return false;
        size_t n = json_array_size(items);
        *out = n ? vcopy(jv(json_array_get(items, name[0] == 'f' ? 0 : n - 1)))
                 : undef(NULL);
        json_decref(items);
        return true;
    }
    if (!strcmp(name, "reverse")) {
        if (is_str(v)) {
            val parts[3] = {undef(NULL), undef(NULL), jnew(json_integer(-1))};
            bool ok = do_slice(r, x, v, parts, out);
            vfree(&parts[2]);
            return ok;
        }
        json_t *items;
        if (!iter_items(r, x, v, &items))
            return false;
        json_t *res = new_array();
        for (size_t i = json_array_size(items); i-- > 0;)
            list_add(res, json_array_get(items, i));
        json_decref(items);
        *out = jv(res);
        return true;
    }
    if (!strcmp(name, "items")) {
        if (v.kind == V_UNDEF) {
            *out = jv(new_array());
            return true;
        }
        if (!is_dict(v))
            return err(r, x, "items needs a mapping, not '%s'", type_name(v));
        json_t *res = new_array();
        const char *k;
        json_t *e;
        json_object_foreach(v.j, k, e)
            list_add_new(res, json_pack("[sO]", k, e));
        *out = jv(res);
        return true;
    }
    if (!strcmp(name, "int") || !strcmp(name, "float") ||
        !strcmp(name, "abs") || !strcmp(name, "round")) {
        if (!strcmp(name, "abs")) {
            if (!is_num(v))
                return err(r, x, "abs needs a number");
            if (!json_is_real(v.j) && inum(v) == INT64_MIN)
                return err_range(r, x,
                                 "integer overflow in abs(%lld) (integers "
                                 "are 64-bit here)",
                                 (long long)INT64_MIN);
            *out = json_is_real(v.j) ? jnew(json_real(fabs(num(v))))
                                     : jnew(json_integer(llabs(inum(v))));
            return true;
        }
        if (!strcmp(name, "round")) {
            if (!is_num(v))
                return err(r, x, "round needs a number");
            val pr = arg(a, 1, "precision"), m = arg(a, 2, "method");
            const char *method = is_str(m) ? sval(m) : "common";
            bool common = !strcmp(method, "common");
            if (common && !json_is_real(v.j)) { /* Python: round(int) */
                *out = jnew(json_integer(inum(v)));
                return true;
            }
            double scale = pow(10, is_int(pr) ? (double)inum(pr) : 0);
            double f = num(v) * scale;
            /* Python's round() is half to even: nearbyint in the default
             * rounding mode */
            f = !strcmp(method, "floor")  ? floor(f)
                : !strcmp(method, "ceil") ? ceil(f)
                                          : nearbyint(f);
            f /= scale;
            if (scale == 0) /* 10 ** -400: Python rounds to a signed 0 */
                f = copysign(0.0, num(v));
            else if (!isfinite(f)) /* 10 ** 400: the number as it was */
                f = num(v);
            *out = jnew(json_real(f));
            return true;
        }
        bool want_int = name[0] == 'i';
        val dflt = arg(a, 1, "default");
        double f = 0;
        bool ok = false;
        if (is_num(v)) {
            f = num(v);
            ok = true;
            if (want_int && is_int(v)) {
                *out = vcopy(v);
                return true;
            }
        } else if (is_str(v)) {
            char *end;
            val t = str_strip(v, undef(NULL), true, true);
            if (slen(t)) {
                if (want_int) {
                    errno = 0;
                    long long i = strtoll(sval(t), &end, 10);
                    if (!*end && errno == ERANGE) {
                        bool e = err_range(r, x,
                                           "integer overflow in int('%.40s'): "
                                           "integers are 64-bit here",
                                           sval(t));
                        vfree(&t);
                        return e;
                    }
                    if (!*end) {
                        vfree(&t);
                        *out = jnew(json_integer(i));
                        return true;
                    }
                }
                f = strtod(sval(t), &end);
                ok = !*end;
            }
            vfree(&t);
        }
        if (!ok) {
            *out = dflt.kind != V_UNDEF ? vcopy(dflt)
                   : want_int           ? jnew(json_integer(0))
                                        : jnew(json_real(0));
            return true;
        }
        /* jinja2: NaN, and inf read from a string, give the default */
        if (want_int && (isnan(f) || (is_str(v) && isinf(f)))) {
            *out = dflt.kind != V_UNDEF ? vcopy(dflt) : jnew(json_integer(0));
            return true;
        }
        /* [-2^63, 2^63): what a cast may take */
        if (want_int &&
            !(f >= -9223372036854775808.0 && f < 9223372036854775808.0)) {
            ts_sbuf fs = {0};
            put_float(&fs, f);
            bool e = err_range(r, x,
                               "integer overflow in int(%s): integers are "
                               "64-bit here",
                               fs.p ? fs.p : "?");
            free(fs.p);
            return e;
        }
        if (!want_int && !isfinite(f)) /* 'inf'|float */
            return err_range(r, x,
                             "float('%s') is not finite, which values here "
                             "cannot hold",
                             isnan(f) ? "nan" : "inf");
        *out = want_int ? jnew(json_integer((long long)f)) : jnew(json_real(f));
        return true;
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return select_items(r, x, a, true, name[0] == 'r', out);
    if (!strcmp(name, "select") || !strcmp(name, "reject"))
        return select_items(r, x, a, false, name[0] == 'r', out);
    if (!strcmp(name, "map")) {
        json_t *items;
        if (!iter_items(r, x, v, &items))
            return false;
        json_t *res = new_array();
        val at = arg(a, -1, "attribute"), dflt = arg(a, -1, "default");
        size_t i;
        json_t *e;
        json_array_foreach(items, i, e) {
            if (!spend_steps(1)) /* a step per item mapped */
                break;
            val item = jv(json_incref(e)), o;
            if (at.kind != V_UNDEF) {
                o = attr_path(item, at);
                if (o.kind == V_UNDEF && dflt.kind != V_UNDEF)
                    o = vcopy(dflt);
            } else if (a->npos > 1 && is_str(a->pos[1])) {
                args fa = {0};
                fa.pos[fa.npos++] = item;
                for (int k = 2; k < a->npos && fa.npos < 8; k++)
                    fa.pos[fa.npos++] = a->pos[k];
                if (!apply_filter(r, x, sval(a->pos[1]), &fa, &o)) {
                    vfree(&item);
                    json_decref(items);
                    json_decref(res);
                    return false;
                }
            } else {
                vfree(&item);
                json_decref(items);
                json_decref(res);
                return err(r, x, "map needs a filter name or attribute=");
            }
            list_add_new(res, o.j ? o.j : json_null());
            vfree(&item);
        }
        json_decref(items);
        *out = jv(res);
        return true;
    }
    if (!strcmp(name, "unique")) {
        json_t *items;
        if (!iter_items(r, x, v, &items))
            return false;
        json_t *res = new_array();
        size_t i;
        json_t *e;
        json_array_foreach(items, i, e) {
            bool seen = false;
            for (size_t k = 0; k < json_array_size(res) && !seen; k++)
                seen = py_eq(jv(e), jv(json_array_get(res, k)));
            if (!seen)
                list_add(res, e);
        }
        json_decref(items);
        *out = jv(res);
        return true;
    }
    if (!strcmp(name, "indent")) {
        val s = to_string(v), w = arg(a, 1, "width");
        bool first = truthy(arg(a, 2, "first")),
             blank = truthy(arg(a, 3, "blank"));
        ts_sbuf ind = {0};
        sb_add(&ind, "", 0);
        if (is_str(w))
            sb_add(&ind, sval(w), slen(w));
        else
            sb_spaces(&ind, is_int(w) ? inum(w) : 4, 1);
        /* jinja: lines = (s + "\n").splitlines(); the first line as is,
         * the others indented (blank ones only with blank=True) */
        const char *p = sval(s);
        size_t n = slen(s);
        ts_sbuf o = {0};
        sb_add(&o, "", 0);
        if (first)
            sb_add(&o, ind.p, ind.n);
        for (size_t i = 0, line = 0; i <= n; line++) {
            size_t j = i;
            while (j < n && p[j] != '\n')
                j++;
            if (line) {
                sb_puts(&o, "\n");
                if (blank || j > i)
                    sb_add(&o, ind.p, ind.n);
            }
            sb_add(&o, p + i, j - i);
            i = j + 1; /* past the newline; i == n + 1 ends */
        }
        if (ind.oom)
            oom();
        *out = sb_str(&o);
        free(o.p);
        free(ind.p);
        vfree(&s);
        return true;
    }
    if (!strcmp(name, "e") || !strcmp(name, "escape")) {
        val s = to_string(v);
        ts_sbuf o = {0};
        sb_add(&o, "", 0);
        for (size_t i = 0; i < slen(s); i++) {
            char c = sval(s)[i];
            const char *rep = c == '&'    ? "&amp;"
                              : c == '<'  ? "&lt;"
                              : c == '>'  ? "&gt;"
                              : c == '"'  ? "&#34;"
                              : c == '\'' ? "&#39;"
                                          : NULL;
            if (rep)
                sb_puts(&o, rep);
            else
                sb_add(&o, &c, 1);
        }
        *out = sb_str(&o);
        free(o.p);
        vfree(&s);
        return true;
    }
    if (!strcmp(name, "dictsort") || !strcmp(name, "sort")) {
        json_t *items;
        if (name[0] == 'd') {
            args ia = {0};
            ia.pos[ia.npos++] = v;
            if (!apply_filter(r, x, "items", &ia, out))
                return false;
            items = out->j;
        } else {
            json_t *src;
            if (!iter_items(r, x, v, &src))
                return false;
            if (!spend_items(json_array_size(src), LIST_ITEM_BYTES)) {
                json_decref(src);
                return budget_ok(r, x);
            }
            items = json_copy(src); /* shallow: we reorder our own list */
            if (!items)
                oom();
            json_decref(src);
        }
        /* insertion sort keeps it stable; chat templates sort few items */
        size_t n = json_array_size(items);
        bool rev = truthy(arg(a, name[0] == 'd' ? 2 : 1, "reverse"));
        val at = arg(a, -1, "attribute");
        for (size_t i = 1; i < n; i++)
            for (size_t k = i; k > 0; k--) {
                val p = jv(json_array_get(items, k - 1)),
                    q = jv(json_array_get(items, k));
                val kp = name[0] == 'd'       ? jv(json_array_get(p.j, 0))
                         : at.kind != V_UNDEF ? attr_path(p, at)
                                              : vcopy(p);
                val kq = name[0] == 'd'       ? jv(json_array_get(q.j, 0))
                         : at.kind != V_UNDEF ? attr_path(q, at)
                                              : vcopy(q);
                int c = 0;
                bool ok = py_cmp(r, x, kp, kq, &c);
                if (name[0] != 'd') {
                    vfree(&kp);
                    vfree(&kq);
                }
                if (!ok) {
                    json_decref(items);
                    return false;
                }
                if (rev ? c >= 0 : c <= 0)
                    break;
                json_t *t = json_incref(json_array_get(items, k - 1));
                json_array_set(items, k - 1, json_array_get(items, k));
                json_array_set_new(items, k, t);
            }
        *out = jv(items);
        return true;
    }
    if (!strcmp(name, "wordcount")) {
        val s = to_string(v);
        val parts = str_split(s, undef(NULL), -1);
        *out = jnew(json_integer(json_array_size(parts.j)));
        vfree(&parts);
        vfree(&s);
        return true;
    }
    return err(r, x, "unknown filter '%s'", name);
}

/* Lists and dicts built by the template may nest at most MAX_VALUE_DEPTH
 * deep (every printer, comparison and free recurses over them), and a
 * namespace may not hold itself (a cycle). Walks the containers in j, a
 * step per item; depth: the levels above j. */
static bool nesting_ok(rt *r, const node *x, json_t *j, json_t *self,
                       int depth) {
    if (j == self)
        return err(r, x, "a namespace cannot hold itself");
    if (!json_is_array(j) && !json_is_object(j))
        return true;
    if (depth >= MAX_VALUE_DEPTH)
        return err_range(r, x,
                         "lists and dicts nested more than %d deep, the "
                         "limit for values a template builds",
                         MAX_VALUE_DEPTH);
    if (!spend_steps(json_is_array(j) ? json_array_size(j)
                                      : json_object_size(j)))
        return budget_ok(r, x);
    size_t i;
    const char *k;
    json_t *e;
    if (json_is_array(j)) {
        json_array_foreach(
            j, i, e) if (!nesting_ok(r, x, e, self, depth + 1)) return false;
    } else {
        json_object_foreach(
            j, k, e) if (!nesting_ok(r, x, e, self, depth + 1)) return false;
    }
    return true;
}

/* ---- calls: methods, globals, macros ---- */

static bool call_macro(rt *r, const node *call, const node *m, args *a,
                       val *out) {
    if (r->depth > MAX_DEPTH)
        return err(r, call, "macro calls nested too deeply");
    if (a->npos > m->nkids)
        return err(r, call, "macro '%s' takes %d arguments, %d given", m->s,
                   m->nkids, a->npos);
    if (!frame_push(r))
        return budget_ok(r, call);
    for (int i = 0; i < m->nkids; i++) {
        val v = arg(a, i, m->kids[i]->s);
        if (v.kind != V_UNDEF)
            bind(r, m->kids[i]->s, vcopy(v));
        else if (m->orelse[i]) {
            val d;
            if (!eval(r, m->orelse[i], &d)) {
                frame_pop(r);
                return false;
            }
            bind(r, m->kids[i]->s, d);
        } else
            bind(r, m->kids[i]->s, undef(m->kids[i]->s));
    }
    ts_sbuf b = {0};
    sb_add(&b, "", 0);
    r->depth++;
    bool ok = render(r, m->b, &b);
    r->depth--;
    frame_pop(r);
    if (ok)
        *out = sb_str(&b);
    free(b.p);
    return ok;
}

static bool call_method(rt *r, const node *x, val obj, const char *m, args *a,
                        val *out) {
    if (is_str(obj)) {
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            val p = arg(a, 0, NULL);
            json_t *cands =
                is_list(p) ? json_incref(p.j) : json_pack("[O]", p.j);
            if (!cands)
                return oom() || budget_ok(r, x);
            bool hit = false;
            size_t i;
            json_t *e;
            json_array_foreach(cands, i, e) {
                if (!json_is_string(e)) {
                    json_decref(cands);
                    return err(r, x, "%s needs a string", m);
                }
                size_t n = json_string_length(e);
                if (n <= slen(obj) &&
                    !memcmp(m[0] == 's' ? sval(obj) : sval(obj) + slen(obj) - n,
                            json_string_value(e), n))
                    hit = true;
            }
            json_decref(cands);
            *out = jnew(json_boolean(hit));
            return true;
        }
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") ||
            !strcmp(m, "rstrip")) {
            *out = str_strip(obj, arg(a, 0, "chars"), m[0] != 'r', m[0] != 'l');
            return true;
        }
        if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
            val ms = arg(a, 1, "maxsplit");
            if (m[0] == 'r' && is_int(ms) && inum(ms) >= 0)
                return err(r, x, "rsplit with maxsplit is not supported");
            *out = str_split(obj, arg(a, 0, "sep"), is_int(ms) ? inum(ms) : -1);
            return true;
        }
        if (!strcmp(m, "upper") || !strcmp(m, "lower")) {
            *out = str_map_case(obj, m[0] == 'u');
            return true;
        }
        if (!strcmp(m, "title") || !strcmp(m, "capitalize")) {
            *out = str_title(obj, m[0] == 't' ? 0 : 2);
            return true;
        }
        if (!strcmp(m, "replace")) {
            val o = arg(a, 0, NULL), n = arg(a, 1, NULL),
                c = arg(a, 2, "count");
            if (!is_str(o) || !is_str(n))
                return err(r, x, "replace needs two strings");
            *out = str_replace(obj, o, n, is_int(c) ? inum(c) : -1);
            return true;
        }
        if (!strcmp(m, "find") || !strcmp(m, "count") || !strcmp(m, "index")) {
            val s = arg(a, 0, NULL);
            if (!need_str(r, x, m, s))
                return false;
            const char *f = slen(s) <= slen(obj)
                                ? memmem(sval(obj), slen(obj), sval(s), slen(s))
                                : NULL;
            if (m[0] == 'c') {
                long long c = 0;
                if (!slen(s))
                    c = u8_len(sval(obj), slen(obj)) + 1;
                else
                    for (size_t i = 0; (f = memmem(sval(obj) + i, slen(obj) - i,
                                                   sval(s), slen(s)));
                         c++)
                        i = f - sval(obj) + slen(s);
                *out = jnew(json_integer(c));
                return true;
            }
            if (!f && m[0] == 'i')
                return err(r, x, "substring not found");
            *out = jnew(json_integer(
                f ? (long long)u8_len(sval(obj), f - sval(obj)) : -1));
            return true;
        }
        if (!strcmp(m, "join")) {
            json_t *items;
            if (!iter_items(r, x, arg(a, 0, NULL), &items))
                return false;
            ts_sbuf b = {0};
            sb_add(&b, "", 0);
            size_t i;
            json_t *e;
            json_array_foreach(items, i, e) {
                if (!json_is_string(e)) {
                    json_decref(items);
                    free(b.p);
                    return err(r, x, "join: sequence item %zu: expected str",
                               i);
                }
                if (i)
                    sb_add(&b, sval(obj), slen(obj));
                sb_add(&b, json_string_value(e), json_string_length(e));
            }
            json_decref(items);
            *out = sb_str(&b);
            free(b.p);
            return true;
        }
        if (!strcmp(m, "isdigit") || !strcmp(m, "isspace") ||
            !strcmp(m, "isalpha") || !strcmp(m, "isupper") ||
            !strcmp(m, "islower")) {
            bool ok = slen(obj) > 0;
            for (size_t i = 0; i < slen(obj) && ok;) {
                int32_t c;
                i += u8_next(sval(obj), slen(obj), i, &c);
                utf8proc_category_t cat = utf8proc_category(c);
                ok = m[2] == 'd'   ? cat == UTF8PROC_CATEGORY_ND
                     : m[2] == 's' ? py_isspace(c)
                     : m[2] == 'a' ? (cat >= UTF8PROC_CATEGORY_LU &&
                                      cat <= UTF8PROC_CATEGORY_LO)
                     : m[2] == 'u'
                         ? utf8proc_tolower(c) != c || !is_cased_letter(c)
                         : utf8proc_toupper(c) != c || !is_cased_letter(c);
            }
            *out = jnew(json_boolean(ok));
            return true;
        }
    }
    if (is_dict(obj)) {
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            json_t *res = new_array();
            const char *k;
            json_t *e;
            json_object_foreach(obj.j, k, e) {
                if (m[0] == 'i')
                    list_add_new(res, json_pack("[sO]", k, e));
                else if (m[0] == 'k')
                    list_add_new(res, json_string(k));
                else
                    list_add(res, e);
            }
            *out = jv(res);
            return true;
        }
        if (!strcmp(m, "get")) {
            val k = arg(a, 0, NULL);
            val v = get_item(obj, k);
            *out = v.kind == V_UNDEF
                       ? (a->npos > 1 ? vcopy(a->pos[1]) : jv(json_null()))
                       : v;
            return true;
        }
    }
    if (obj.kind == V_LOOP && !strcmp(m, "cycle")) {
        if (!a->npos)
            return err(r, x, "loop.cycle needs arguments");
        long long i = json_integer_value(json_object_get(obj.j, "index0"));
        *out = vcopy(a->pos[i % a->npos]);
        return true;
    }
    if (obj.kind == V_UNDEF)
        return undef_error(r, x, obj);
    return err(r, x, "'%s' object has no method '%s'", type_name(obj), m);
}

static bool call_global(rt *r, const node *x, const char *name, args *a,
                        val *out) {
    if (!strcmp(name, "raise_exception")) {
        val m = to_string(arg(a, 0, "message"));
        bool ok = err(r, x, "%s", sval(m));
        vfree(&m);
        return ok;
    }
    if (!strcmp(name, "range")) {
        long long lo = 0, hi, st = 1;
        for (int i = 0; i < a->npos; i++)
            if (!is_int(a->pos[i]))
                return err(r, x, "range needs integers");
        if (a->npos == 1)
            hi = inum(a->pos[0]);
        else if (a->npos >= 2) {
            lo = inum(a->pos[0]);
            hi = inum(a->pos[1]);
            if (a->npos == 3)
                st = inum(a->pos[2]);
        } else
            return err(r, x, "range needs 1 to 3 arguments");
        if (!st)
            return err(r, x, "range() arg 3 must not be zero");
        /* its length from the unsigned distance: no i += st past hi */
        unsigned long long span =
            st > 0 ? (hi > lo ? (unsigned long long)hi - lo : 0)
                   : (lo > hi ? (unsigned long long)lo - hi : 0);
        unsigned long long step =
            st > 0 ? (unsigned long long)st : 0ull - (unsigned long long)st;
        unsigned long long len = span ? (span - 1) / step + 1 : 0;
        if (len > 100000) /* jinja2's sandbox: MAX_RANGE */
            return err(r, x,
                       "Range too big. The sandbox blocks ranges larger "
                       "than MAX_RANGE (100000).");
        json_t *l = new_array();
        long long i = lo;
        for (unsigned long long k = 0; k < len; k++) {
            list_add_new(l, json_integer(i));
            if (k + 1 < len)
                i += st; /* stays between lo and hi */
        }
        *out = jv(l);
        return true;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        json_t *o = new_object();
        if (a->npos && is_dict(a->pos[0]) && json_object_update(o, a->pos[0].j))
            oom();
        for (int i = 0; i < a->nkw; i++)
            obj_set_new(o, a->kwn[i], strlen(a->kwn[i]),
                        a->kw[i].j ? json_incref(a->kw[i].j) : json_null());
        *out = jv(o);
        if (name[0] == 'n')
            out->kind = V_NS;
        return nesting_ok(r, x, o, NULL, 0);
    }
    if (!strcmp(name, "strftime_now")) {
        val f = arg(a, 0, "format");
        if (!need_str(r, x, "strftime_now", f))
            return false;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[256];
        size_t n = strftime(buf, sizeof buf, sval(f), &tm);
        *out = mkstr(buf, n);
        return true;
    }
    return err(r, x, "'%s' is undefined", name);
}

static bool eval_call(rt *r, const node *x, val *out) {
    const node *callee = x->a;
    args a;
    bool ok;
    if (callee->kind == E_ATTR) { /* obj.method(...) */
        val obj;
        if (!eval(r, callee->a, &obj))
            return false;
        /* a dict member that is a macro is called, not a method */
        if (!eval_args(r, x, &a, NULL)) {
            args_free(&a);
            vfree(&obj);
            return false;
        }
        charge_scan(obj);
        charge_args(&a);
        ok = !budget_over() && call_method(r, x, obj, callee->s, &a, out);
        vfree(&obj);
        args_free(&a);
        return ok;
    }
    if (callee->kind == E_NAME) {
        const val *v = lookup(r, callee->s);
        if (!eval_args(r, x, &a, NULL)) {
            args_free(&a);
            return false;
        }
        if (v && v->kind == V_MACRO)
            ok = call_macro(r, x, v->macro, &a, out);
        else if (v && v->kind != V_UNDEF)
            ok = err(r, x, "'%s' is not callable", callee->s);
        else
            ok = call_global(r, x, callee->s, &a, out);
        args_free(&a);
        return ok;
    }
    return err(r, x, "this expression is not callable");
}

/* ---- evaluation ---- */

static bool eval_node(rt *r, const node *x, val *out) {
    switch (x->kind) {
    case E_LIT:
        *out = jv(json_incref(x->lit));
        return true;
    case E_NAME: {
        const val *v = lookup(r, x->s);
        *out = v ? vcopy(*v) : undef(x->s);
        if (out->kind == V_UNDEF)
            out->name = x->s;
        return true;
    }
    case E_ATTR:
    case E_ITEM: {
        val obj, key = undef(NULL);
        if (!eval(r, x->a, &obj))
            return false;
        if (obj.kind == V_UNDEF) {
            bool ok = obj.name
                          ? err(r, x, "'%s' is undefined", obj.name)
                          : err(r, x, "cannot read '%s' of an undefined value",
                                x->kind == E_ATTR ? x->s : "[...]");
            return ok;
        }
        if (x->kind == E_ATTR)
            *out = get_attr(obj, x->s);
        else {
            if (!eval(r, x->b, &key)) {
                vfree(&obj);
                return false;
            }
            charge_scan(obj);
            *out = get_item(obj, key);
            vfree(&key);
        }
        vfree(&obj);
        return true;
    }
    case E_SLICE: {
        val obj, parts[3] = {undef(NULL), undef(NULL), undef(NULL)};
        if (!eval(r, x->a, &obj))
            return false;
        bool ok = true;
        for (int k = 0; k < 3 && ok; k++)
            if (x->kids[k])
                ok = eval(r, x->kids[k], &parts[k]);
        ok = ok && do_slice(r, x, obj, parts, out);
        for (int k = 0; k < 3; k++)
            vfree(&parts[k]);
        vfree(&obj);
        return ok;
    }
    case E_CALL:
        return eval_call(r, x, out);
    case E_FILTER:
    case E_TEST: {
        val v;
        if (!eval(r, x->a, &v))
            return false;
        args a;
        bool ok = eval_args(r, x, &a, &v);
        if (ok)
            charge_args(&a);
        ok = ok && !budget_over();
        if (ok && x->kind == E_FILTER)
            ok = apply_filter(r, x, x->s, &a, out);
        else if (ok) {
            bool res;
            ok = run_test(r, x, x->s, &a, &res);
            if (ok)
                *out = jnew(json_boolean(res != x->neg));
        }
        args_free(&a);
        return ok;
    }
    case E_BIN: {
        val a, b;
        if (!eval(r, x->a, &a))
            return false;
        if (!eval(r, x->b, &b)) {
            vfree(&a);
            return false;
        }
        charge_scan(a);
        charge_scan(b);
        bool ok = !budget_over() && binop(r, x, x->s, a, b, out);
        vfree(&a);
        vfree(&b);
        return ok;
    }
    case E_AND:
    case E_OR: {
        val a;
        if (!eval(r, x->a, &a))
            return false;
        bool t = truthy(a);
        if ((x->kind == E_AND) != t) { /* short circuit: the left value */
            *out = a;
            return true;
        }
        vfree(&a);
        return eval(r, x->b, out);
    }
    case E_NOT: {
        val a;
        if (!eval(r, x->a, &a))
            return false;
        *out = jnew(json_boolean(!truthy(a)));
        vfree(&a);
        return true;
    }
    case E_NEG: {
        val a;
        if (!eval(r, x->a, &a))
            return false;
        if (!is_num(a)) {
            vfree(&a);
            return err(r, x, "bad operand type for unary -");
        }
        if (!json_is_real(a.j) && inum(a) == INT64_MIN) {
            vfree(&a);
            return err_range(r, x,
                             "integer overflow in -(%lld) (integers are "
                             "64-bit here)",
                             (long long)INT64_MIN);
        }
        *out = json_is_real(a.j) ? jnew(json_real(-num(a)))
                                 : jnew(json_integer(-inum(a)));
        vfree(&a);
        return true;
    }
    case E_COND: {
        val c;
        if (!eval(r, x->b, &c))
            return false;
        bool t = truthy(c);
        vfree(&c);
        if (t)
            return eval(r, x->a, out);
        if (x->c)
            return eval(r, x->c, out);
        *out = undef(NULL);
        return true;
    }
    case E_LIST: {
        json_t *l = new_array();
        for (int i = 0; i < x->nkids; i++) {
            val v;
            if (!eval(r, x->kids[i], &v)) {
                json_decref(l);
                return false;
            }
            list_add_new(l, v.j ? v.j : json_null());
        }
        *out = jv(l);
        return nesting_ok(r, x, l, NULL, 0);
    }
    case E_DICT: {
        json_t *o = new_object();
        for (int i = 0; i + 1 < x->nkids; i += 2) {
            val k, v;
            if (!eval(r, x->kids[i], &k)) {
                json_decref(o);
                return false;
            }
            if (!is_str(k)) {
                vfree(&k);
                json_decref(o);
                return err(r, x, "dict keys must be strings here");
            }
            if (!eval(r, x->kids[i + 1], &v)) {
                vfree(&k);
                json_decref(o);
                return false;
            }
            obj_set_new(o, sval(k), slen(k), v.j ? v.j : json_null());
            vfree(&k);
        }
        *out = jv(o);
        return nesting_ok(r, x, o, NULL, 0);
    }
    default:
        return err(r, x, "internal: not an expression");
    }
}

/* One step per expression evaluated; a budget spent on the way (by the
 * work of a filter, a string or list built) is an error at x. */
static bool eval(rt *r, const node *x, val *out) {
    *out = undef(NULL);
    if (r->d.failed)
        return false;
    if (!spend_steps(1))
        return budget_ok(r, x);
    bool ok = eval_node(r, x, out);
    if (!budget_ok(r, x) || !ok) { /* a spent budget may have cut it short */
        vfree(out);
        *out = undef(NULL);
        ok = false;
    }
    return ok;
}

static bool render_for(rt *r, const node *x, ts_sbuf *out) {
    val seq;
    if (!eval(r, x->a, &seq))
        return false;
    json_t *items;
    if (!iter_items(r, x, seq, &items)) {
        vfree(&seq);
        return false;
    }
    vfree(&seq);
    /* the filter condition sees each item before the loop numbers it */
    if (x->c) {
        json_t *kept = new_array();
        size_t i;
        json_t *e;
        json_array_foreach(items, i, e) {
            if (!frame_push(r)) {
                json_decref(kept);
                json_decref(items);
                return budget_ok(r, x);
            }
            if (x->s2 && json_is_array(e)) {
                bind(r, x->s, vcopy(jv(json_array_get(e, 0))));
                bind(r, x->s2, vcopy(jv(json_array_get(e, 1))));
            } else
                bind(r, x->s, vcopy(jv(e)));
            val c;
            bool ok = eval(r, x->c, &c);
            frame_pop(r);
            if (!ok) {
                json_decref(kept);
                json_decref(items);
                return false;
            }
            if (truthy(c))
                list_add(kept, e);
            vfree(&c);
        }
        json_decref(items);
        items = kept;
    }
    size_t n = json_array_size(items);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        if (!spend_steps(LOOP_ITER_STEPS)) {
            ok = budget_ok(r, x);
            break;
        }
        json_t *e = json_array_get(items, i);
        if (!frame_push(r)) {
            ok = budget_ok(r, x);
            break;
        }
        json_t *loop = new_object();
        obj_set_new(loop, "index", 5, json_integer(i + 1));
        obj_set_new(loop, "index0", 6, json_integer(i));
        obj_set_new(loop, "revindex", 8, json_integer(n - i));
        obj_set_new(loop, "revindex0", 9, json_integer(n - i - 1));
        obj_set_new(loop, "first", 5, json_boolean(i == 0));
        obj_set_new(loop, "last", 4, json_boolean(i + 1 == n));
        obj_set_new(loop, "length", 6, json_integer(n));
        obj_set_new(loop, "depth", 5, json_integer(1));
        obj_set_new(loop, "depth0", 6, json_integer(0));
        if (i)
            obj_set_new(loop, "previtem", 8,
                        json_incref(json_array_get(items, i - 1)));
        if (i + 1 < n)
            obj_set_new(loop, "nextitem", 8,
                        json_incref(json_array_get(items, i + 1)));
        val lv = jv(loop);
        lv.kind = V_LOOP;
        bind(r, "loop", lv);
        if (x->s2) {
            if (!json_is_array(e) || json_array_size(e) != 2) {
                frame_pop(r);
                ok = err(r, x, "cannot unpack a loop item into two names");
                break;
            }
            bind(r, x->s, vcopy(jv(json_array_get(e, 0))));
            bind(r, x->s2, vcopy(jv(json_array_get(e, 1))));
        } else
            bind(r, x->s, vcopy(jv(e)));
        ok = render(r, x->b, out);
        frame_pop(r);
        if (r->loopctl == 1) {
            r->loopctl = 0;
            break;
        }
        r->loopctl = 0;
    }
    json_decref(items);
    if (ok && n == 0 && x->nelse)
        ok = render(r, x->orelse[0], out);
    return ok;
}

static bool render(rt *r, const node *body, ts_sbuf *out) {
    if (++r->depth > MAX_DEPTH)
        return err(r, body, "blocks nested too deeply");
    bool ok = true;
    for (int i = 0; i < body->nkids && ok && !r->loopctl; i++) {
        const node *x = body->kids[i];
        if (!spend_steps(1)) {
            ok = budget_ok(r, x);
            break;
        }
        switch (x->kind) {
        case N_TEXT:
            sb_add(out, x->s, x->len);
            break;
        case N_OUT: {
            val v;
            ok = eval(r, x->a, &v);
            if (ok)
                put_str(out, v, false);
            vfree(&v);
            break;
        }
        case N_IF: {
            const node *branch = x;
            for (;;) {
                val c;
                if (!(ok = eval(r, branch->a, &c)))
                    break;
                bool t = truthy(c);
                vfree(&c);
                if (t) {
                    ok = render(r, branch->b, out);
                    break;
                }
                if (!branch->nelse)
                    break;
                const node *e = branch->orelse[0];
                if (e->kind == N_IF) {
                    branch = e;
                    continue;
                }
                ok = render(r, e, out);
                break;
            }
            break;
        }
        case N_FOR:
            ok = render_for(r, x, out);
            break;
        case N_SET: {
            val v;
            if (!(ok = eval(r, x->a, &v)))
                break;
            if (x->s2) {
                const val *ns = lookup(r, x->s);
                if (!ns || ns->kind != V_NS) {
                    vfree(&v);
                    ok =
                        err(r, x, "'%s' is not a namespace; cannot set '%s.%s'",
                            x->s, x->s, x->s2);
                    break;
                }
                if (!(ok = nesting_ok(r, x, v.j, ns->j, 1))) {
                    vfree(&v);
                    break;
                }
                obj_set_new(ns->j, x->s2, strlen(x->s2),
                            v.j ? v.j : json_null());
            } else
                bind(r, x->s, v);
            break;
        }
        case N_SETBLOCK: {
            ts_sbuf b = {0};
            sb_add(&b, "", 0);
            ok = render(r, x->b, &b);
            if (ok)
                bind(r, x->s, sb_str(&b));
            free(b.p);
            break;
        }
        case N_MACRO:
            bind(r, x->s, (val){.kind = V_MACRO, .macro = x});
            break;
        case N_BREAK:
            r->loopctl = 1;
            break;
        case N_CONTINUE:
            r->loopctl = 2;
            break;
        default:
            ok = err(r, x, "internal: not a statement");
            break;
        }
        ok = ok && budget_ok(r, x); /* output past the byte limit */
    }
    r->depth--;
    return ok && !r->d.failed;
}

/* ---- public ---- */

ts_status ts_template_parse(ts_ctx *ctx, const char *src, size_t len,
                            ts_template **out) {
    if (!ctx || !src || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_template_parse: NULL argument");
    *out = NULL;
    if (!valid_utf8(src, len))
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "chat template: not valid UTF-8");
    diag d = {.ctx = ctx};
    tok_list toks = {0};
    node *root = NULL;
    if (lex(&d, src, len, &toks)) {
        parser p = {.d = &d, .t = &toks};
        root = mk(&p, N_BODY, 1);
        char which[32];
        if (root && !parse_body(&p, root, NULL, which, sizeof which)) {
            node_free(root);
            root = NULL;
        }
    }
    for (size_t i = 0; i < toks.n; i++)
        free(toks.v[i].s);
    free(toks.v);
    if (!root)
        return ts_set_error(ctx, d.oom ? TS_ERR_OOM : TS_ERR_INVALID_ARG, "%s",
                            d.msg);
    ts_template *t = j_calloc(1, sizeof *t);
    if (!t) {
        node_free(root);
        return ts_set_error(ctx, TS_ERR_OOM,
                            "chat template: out of memory while parsing");
    }
    t->root = root;
    t->max_steps = TS_TEMPLATE_MAX_STEPS;
    t->max_bytes = TS_TEMPLATE_MAX_BYTES;
    *out = t;
    return TS_OK;
}

void ts_template_set_limits(ts_template *t, unsigned long long max_steps,
                            size_t max_bytes) {
    if (!t)
        return;
    if (max_steps)
        t->max_steps = max_steps;
    if (max_bytes)
        t->max_bytes = max_bytes;
}

ts_status ts_template_render_json(ts_ctx *ctx, const ts_template *t,
                                  json_t *vars, char **out, size_t *len) {
    if (!ctx || !t || !out || !json_is_object(vars))
        return ts_set_error(
            ctx, TS_ERR_INVALID_ARG,
            "ts_template_render: variables must be a JSON object");
    rt r = {.d = {.ctx = ctx}};
    budget bud = {.max_steps = t->max_steps, .max_bytes = t->max_bytes};
    budget *outer = cur_budget;
    cur_budget = &bud;
    ts_sbuf b = {0};
    bool ok = (bud.empty = json_string("")) != NULL && frame_push(&r);
    if (ok) {
        const char *k;
        json_t *e;
        json_object_foreach(vars, k, e) bind(&r, k, jv(json_incref(e)));
    }
    ok = ok && frame_push(&r); /* the template's own top-level sets */
    if (ok) {
        sb_add(&b, "", 0);
        ok = render(&r, t->root, &b);
    }
    if (b.oom || !bud.empty)
        oom();
    ok = budget_ok(&r, NULL) && ok;
    while (r.nframes)
        frame_pop(&r);
    free(r.frames);
    json_decref(bud.empty);
    cur_budget = outer;
    if (!ok) {
        free(b.p);
        return ts_set_error(ctx, r.status ? r.status : TS_ERR_INVALID_ARG, "%s",
                            r.d.msg);
    }
    *out = b.p;
    if (len)
        *len = b.n;
    return TS_OK;
}

ts_status ts_template_render(ts_ctx *ctx, const ts_template *t,
                             const char *vars_json, char **out, size_t *len) {
    if (!ctx || !t || !vars_json || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_template_render: NULL argument");
    json_error_t je;
    json_t *vars = json_loads(vars_json, JSON_ALLOW_NUL, &je);
    /* jansson gives no reason (or says so) when an allocation failed */
    if (!vars &&
        (json_error_code(&je) == json_error_out_of_memory || !je.text[0]))
        return ts_set_error(ctx, TS_ERR_OOM,
                            "chat template: out of memory while reading the "
                            "template variables");
    if (!vars)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "template variables: %s (line %d)", je.text,
                            je.line);
    ts_status s = ts_template_render_json(ctx, t, vars, out, len);
    json_decref(vars);
    return s;
}

void ts_template_free(ts_template *t) {
    if (!t)
        return;
    node_free(t->root);
    free(t->err);
    free(t);
}
