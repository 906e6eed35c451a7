/* opts.h — the command line's option tables: each command describes its
 * options once (names and aliases, value, range, default, help) and both
 * the parser and --help read that table, so the two cannot drift. Also the
 * "did you mean" of unknown options and commands (edit distance). */
#ifndef TS_CLI_OPTS_H
#define TS_CLI_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum {
    CLI_FLAG,   /* takes no value */
    CLI_STR,    /* any non-empty string */
    CLI_INT,    /* a whole number in [lo, hi] */
    CLI_SIZE,   /* a whole number with an optional K/M/G suffix, in [lo, hi] */
    CLI_NUM,    /* a number in [lo, hi] */
    CLI_CHOICE, /* one of choices ("f32|bf16"); the index in v->choice */
} cli_kind;

typedef struct {
    int id; /* the command's own code; 0 ends a table */
    /* every spelling accepted, ", "-separated, e.g. "-c, --ctx-size" */
    const char *names;
    cli_kind kind;
    const char *arg; /* the value's placeholder in help ("N", "DIR") */
    double lo, hi;
    const char *choices;
    const char *def;  /* the default as help shows it; NULL: none */
    const char *help; /* what it does */
    const char *want; /* NULL: said from kind and range */
    const char *only; /* NULL: every command of the table; else its name */
} cli_opt;

typedef struct {
    const char *name;       /* "run" */
    const char *usage;      /* after "usage: tessera " */
    const char *about;      /* one paragraph after the usage; may be NULL */
    const cli_opt *opts;    /* ends with id 0 */
    const char *positional; /* help for positional arguments; NULL: none */
    bool short_threads;     /* -t is --threads (prepare-data: its tokenizer) */
} cli_cmd;

/* what cli_next returns besides an option's id */
enum {
    CLI_END = 0,
    CLI_POSITIONAL = -1,
    CLI_HELP = -2,
    CLI_ERROR = -3, /* printed to stderr already; exit 2 */
};

typedef struct {
    const char *s; /* the value as written (the positional argument) */
    double num;
    long long i;
    int choice;
} cli_val;

typedef struct {
    const cli_cmd *cmd;
    int argc, i;
    char **argv;
    bool no_more_options; /* after "--" */
    const char *written;  /* the last option as written, for messages */
} cli_parser;

void cli_begin(cli_parser *p, const cli_cmd *c, int argc, char **argv);
/* The next option (its id with its value checked), positional argument,
 * help request, end or error. */
int cli_next(cli_parser *p, cli_val *v);
/* s checked against o (its kind and range) into v; false when it does not
 * fit (for commands with parsers of their own) */
bool cli_value(const cli_opt *o, const char *s, cli_val *v);
/* "tessera CMD: MESSAGE" on stderr and the pointer to --help; returns 2 */
int cli_fail(const cli_cmd *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* the command's --help, generated from its table */
void cli_help(const cli_cmd *c, FILE *f);

size_t cli_edit_distance(const char *a, const char *b);
/* the candidate nearest to word, or NULL when none is near enough */
const char *cli_closest(const char *word, const char *const *cands, size_t n);

#endif
