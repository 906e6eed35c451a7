/* opts.c — the option tables' parser, --help and "did you mean" (opts.h).
 * Knows nothing of any one command: the tables live with the commands. */
#include "cli/opts.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define HELP_COL   30 /* where the help text starts */
#define HELP_WIDTH 79

void cli_begin(cli_parser *p, const cli_cmd *c, int argc, char **argv) {
    *p = (cli_parser){.cmd = c, .argc = argc, .argv = argv, .i = 1};
}

int cli_fail(const cli_cmd *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tessera %s: ", c->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

static bool applies(const cli_opt *o, const cli_cmd *c) {
    return !o->only || !strcmp(o->only, c->name);
}

/* the i-th ", "-separated name of o into buf; false past the last */
static bool nth_name(const cli_opt *o, int i, char *buf, size_t cap) {
    const char *s = o->names;
    for (; i > 0 && s; i--)
        if ((s = strchr(s, ',')))
            s += 1 + (s[1] == ' ');
    if (!s || !*s)
        return false;
    size_t n = strcspn(s, ",");
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = 0;
    return true;
}

static const cli_opt *find(const cli_cmd *c, const char *name) {
    char buf[64];
    for (const cli_opt *o = c->opts; o && o->id; o++)
        for (int k = 0; applies(o, c) && nth_name(o, k, buf, sizeof buf); k++)
            if (!strcmp(buf, name))
                return o;
    return NULL;
}

size_t cli_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), row[64];
    if (lb >= 64 || la >= 64)
        return 64;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best, diag = up;
        }
    }
    return row[lb];
}

const char *cli_closest(const char *word, const char *const *cands, size_t n) {
    const char *best = NULL;
    size_t bd = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        size_t d = cli_edit_distance(word, cands[i]);
        if (d < bd)
            bd = d, best = cands[i];
    }
    /* a typo, not another word: about one edit in three letters */
    return bd <= 1 + strlen(word) / 3 ? best : NULL;
}

static int unknown(const cli_cmd *c, const char *name) {
    static char names[256][64];
    const char *cands[256];
    size_t n = 0;
    for (const cli_opt *o = c->opts; o && o->id; o++)
        for (int k = 0; applies(o, c) && n < 254 &&
                        nth_name(o, k, names[n], sizeof names[n]);
             k++)
            cands[n] = names[n], n++;
    cands[n++] = "--help";
    cands[n++] = "--threads";
    const char *near = cli_closest(name, cands, n);
    if (near)
        return cli_fail(c, "unknown option \"%s\"; did you mean \"%s\"?", name,
                        near);
    return cli_fail(c, "unknown option \"%s\" (see tessera %s --help)", name,
                    c->name);
}

/* what a value of o must be, for messages */
static void want_text(const cli_opt *o, char *buf, size_t cap) {
    if (o->want)
        snprintf(buf, cap, "%s", o->want);
    else if (o->kind == CLI_INT || o->kind == CLI_SIZE)
        snprintf(buf, cap, "a whole number in %.0f..%.0f%s", o->lo, o->hi,
                 o->kind == CLI_SIZE ? " (K, M, G suffixes allowed)" : "");
    else if (o->kind == CLI_NUM)
        snprintf(buf, cap, "a number in %g..%g", o->lo, o->hi);
    else if (o->kind == CLI_CHOICE) {
        size_t n = (size_t)snprintf(buf, cap, "one of ");
        for (const char *c = o->choices; *c && n + 3 < cap; c++)
            if (*c == '|')
                buf[n++] = ',', buf[n++] = ' ';
            else
                buf[n++] = *c;
        buf[n] = 0;
    } else
        snprintf(buf, cap, "%s (not empty)", o->arg ? o->arg : "a value");
}

static bool parse_whole(const char *s, bool suffixes, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s)
        return false;
    if (suffixes && *end && strchr("KkMmGg", *end) && v >= 0 &&
        v < (1LL << 40)) {
        int shift = strchr("Kk", *end) ? 10 : strchr("Mm", *end) ? 20 : 30;
        v <<= shift, end++;
    }
    *out = v;
    return !*end;
}

/* checks s against o into v; false when it does not fit (opts.h) */
bool cli_value(const cli_opt *o, const char *s, cli_val *v) {
    v->s = s;
    char *end;
    switch (o->kind) {
    case CLI_FLAG:
        return true;
    case CLI_STR:
        return *s != 0;
    case CLI_INT:
    case CLI_SIZE:
        return parse_whole(s, o->kind == CLI_SIZE, &v->i) &&
               (double)v->i >= o->lo && (double)v->i <= o->hi &&
               (v->num = (double)v->i, true);
    case CLI_NUM:
        errno = 0;
        v->num = strtod(s, &end);
        return !errno && end != s && !*end && v->num >= o->lo &&
               v->num <= o->hi;
    case CLI_CHOICE: {
        size_t len = strlen(s);
        int k = 0;
        for (const char *c = o->choices; c; k++) {
            size_t n = strcspn(c, "|");
            if (n == len && !strncmp(c, s, n))
                return (v->choice = k), true;
            c = c[n] ? c + n + 1 : NULL;
        }
        return false;
    }
    }
    return false;
}

static int bad_value(cli_parser *p, const cli_opt *o, const char *value) {
    char want[160];
    want_text(o, want, sizeof want);
    const cli_cmd *c = p->cmd;
    if (value)
        cli_fail(c, "%s \"%s\": want %s", p->written, value, want);
    else
        cli_fail(c, "%s needs a value: %s", p->written, want);
    return cli_fail(c,
                    "bad or incomplete option \"%s\" (see tessera %s --help)",
                    p->written, c->name),
           CLI_ERROR;
}

int cli_next(cli_parser *p, cli_val *v) {
    memset(v, 0, sizeof *v);
    if (p->i >= p->argc)
        return CLI_END;
    const char *a = p->argv[p->i++];
    if (!p->no_more_options && !strcmp(a, "--")) {
        p->no_more_options = true;
        return cli_next(p, v);
    }
    if (p->no_more_options || a[0] != '-' || !a[1]) {
        v->s = a;
        return CLI_POSITIONAL;
    }
    if (!strcmp(a, "-h") || !strcmp(a, "--help"))
        return CLI_HELP;
    /* --name=value */
    static char name[64];
    const char *eq = !strncmp(a, "--", 2) ? strchr(a, '=') : NULL,
               *value = eq ? eq + 1 : NULL;
    size_t n = eq ? (size_t)(eq - a) : strlen(a);
    snprintf(name, sizeof name, "%.*s", (int)(n < 63 ? n : 63), a);
    p->written = name;
    const cli_opt *o = find(p->cmd, name);
    if (!o)
        return unknown(p->cmd, name), CLI_ERROR;
    if (o->kind == CLI_FLAG) {
        if (value)
            return cli_fail(p->cmd, "%s takes no value (got \"%s\")", name,
                            value),
                   CLI_ERROR;
        return o->id;
    }
    if (!value && p->i < p->argc) {
        const char *next = p->argv[p->i];
        /* "--lr --steps 5": --lr's value is missing, not "--steps" */
        if (strncmp(next, "--", 2) || !next[2] || o->kind == CLI_STR)
            value = next, p->i++;
        if (value && o->kind == CLI_STR && !strncmp(next, "--", 2) &&
            find(p->cmd, next))
            value = NULL, p->i--;
    }
    if (!value || !cli_value(o, value, v))
        return bad_value(p, o, value);
    return o->id;
}

/* text wrapped at HELP_WIDTH, each line after the first indented */
static void wrapped(FILE *f, const char *text, int col, int indent) {
    const char *s = text;
    while (*s) {
        size_t word = strcspn(s, " \n");
        if (col > indent && col + 1 + (int)word > HELP_WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fwrite(s, 1, word, f);
        col += (int)word;
        s += word;
        if (*s == '\n') {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        }
        while (*s == ' ' || *s == '\n')
            s++;
    }
    fputc('\n', f);
}

static void help_line(FILE *f, const char *names, const char *arg,
                      const char *help, const char *def) {
    char head[160], text[1024];
    snprintf(head, sizeof head, "  %s%s%s", names, arg ? " " : "",
             arg ? arg : "");
    snprintf(text, sizeof text, "%s%s%s%s", help, def ? " (default: " : "",
             def ? def : "", def ? ")" : "");
    fputs(head, f);
    int col = (int)strlen(head);
    if (col >= HELP_COL - 1) {
        fputc('\n', f);
        col = 0;
    }
    fprintf(f, "%*s", HELP_COL - col, "");
    wrapped(f, text, HELP_COL, HELP_COL);
}

void cli_help(const cli_cmd *c, FILE *f) {
    fprintf(f, "usage: tessera %s\n", c->usage);
    if (c->about)
        wrapped(f, c->about, 0, 0);
    if (c->positional) {
        fprintf(f, "\narguments:\n");
        fputs(c->positional, f);
    }
    fprintf(f, "\noptions:\n");
    for (const cli_opt *o = c->opts; o && o->id; o++) {
        if (!applies(o, c))
            continue;
        char arg[96];
        if (o->kind == CLI_CHOICE)
            snprintf(arg, sizeof arg, "%s", o->choices);
        else
            snprintf(arg, sizeof arg, "%s", o->arg ? o->arg : "");
        help_line(f, o->names, o->kind == CLI_FLAG ? NULL : arg, o->help,
                  o->def);
    }
    help_line(f, c->short_threads ? "-t, --threads" : "--threads", "N",
              "threads for the kernels; TS_NUM_THREADS sets the same",
              "the cores this process may run on");
    help_line(f, "-h, --help", NULL, "this help", NULL);
}
