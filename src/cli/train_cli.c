/* train_cli.c — the training commands: tokenizer-train, prepare-data,
 * train (options on the command line or in a JSON file with the same
 * keys), bench peak, plot-loss (an SVG of log.jsonl). */
#include "tessera_tokenizer.h"
#include "tessera_train.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool num(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

static int fail(ts_ctx *ctx, const char *cmd) {
    fprintf(stderr, "tessera %s: %s\n", cmd, ts_errmsg(ctx));
    ts_ctx_free(ctx);
    return 1;
}

/* ---- tokenizer-train ---- */

int tessera_tokenizer_train(int argc, char **argv) {
    ts_bpe_train_options o = ts_bpe_train_default_options();
    const char *out = NULL;
    const char **files = calloc((size_t)argc, sizeof *files);
    int nf = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (!strcmp(a, "--vocab") && v && num(v, 257, 1 << 24, &x))
            o.vocab_size = (int)x, i++;
        else if (!strcmp(a, "--min-frequency") && v && num(v, 1, 1e9, &x))
            o.min_frequency = (int)x, i++;
        else if (!strcmp(a, "--out") && v)
            out = v, i++;
        else if (a[0] != '-')
            files[nf++] = a;
        else {
            fprintf(stderr,
                    "tessera tokenizer-train: bad or incomplete option "
                    "\"%s\"\nusage: tessera tokenizer-train --vocab N --out "
                    "DIR [--min-frequency 2] FILES...\n",
                    a);
            free(files);
            return 2;
        }
    }
    if (!out || !nf) {
        fprintf(stderr, "usage: tessera tokenizer-train --vocab N --out DIR "
                        "[--min-frequency 2] FILES...\n");
        free(files);
        return 2;
    }
    ts_ctx *ctx = NULL;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_bpe_train_stats st;
    ts_status s = ts_bpe_train(ctx, files, nf, &o, out, &st);
    free(files);
    if (s != TS_OK)
        return fail(ctx, "tokenizer-train");
    fprintf(stderr,
            "tokenizer-train: %lld bytes, %lld distinct words, %d merges, "
            "vocabulary %d -> %s/tokenizer.json\n",
            (long long)st.bytes, (long long)st.distinct_words, st.merges,
            st.vocab_size, out);
    ts_ctx_free(ctx);
    return 0;
}

/* ---- prepare-data ---- */

#define PREPARE_USAGE                                                          \
    "usage: tessera prepare-data -t TOKENIZER_DIR --out DIR [--val-fraction "  \
    "0.05] [--shard-tokens 67108864] [--model-config CONFIG.json] FILES...\n"

int tessera_prepare_data(int argc, char **argv) {
    ts_prepare_options o = {.val_fraction = 0.05, .shard_tokens = 1 << 26};
    const char **files = calloc((size_t)argc, sizeof *files);
    int nf = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool missing = !v || (v[0] == '-' && v[1] == '-');
        char err[256] = "";
        double x;
        if (!strcmp(a, "-t") || !strcmp(a, "--out") ||
            !strcmp(a, "--model-config")) {
            if (missing)
                snprintf(err, sizeof err, "%s needs a value: a %s", a,
                         !strcmp(a, "--model-config") ? "config.json file"
                                                      : "folder");
            else if (!strcmp(a, "-t"))
                o.tokenizer_dir = v, i++;
            else if (!strcmp(a, "--out"))
                o.out_dir = v, i++;
            else
                o.model_config = v, i++;
        } else if (!strcmp(a, "--val-fraction")) {
            if (missing || !num(v, 0, 0.99, &x))
                snprintf(err, sizeof err,
                         "--val-fraction%s%s%s a float in 0..0.99, like 0.05",
                         missing ? " needs a value:" : ": \"", missing ? "" : v,
                         missing ? "" : "\" is not");
            else
                o.val_fraction = x, i++;
        } else if (!strcmp(a, "--shard-tokens")) {
            if (missing || !num(v, 1024, 1e12, &x) || x != floor(x))
                snprintf(err, sizeof err,
                         "--shard-tokens%s%s%s an integer >= 1024, like "
                         "67108864",
                         missing ? " needs a value:" : ": \"", missing ? "" : v,
                         missing ? "" : "\" is not");
            else
                o.shard_tokens = (int64_t)x, i++;
        } else if (a[0] != '-')
            files[nf++] = a;
        else
            snprintf(err, sizeof err, "unknown option \"%s\"", a);
        if (err[0]) {
            fprintf(stderr, "tessera prepare-data: %s\n" PREPARE_USAGE, err);
            free(files);
            return 2;
        }
    }
    if (!o.tokenizer_dir || !o.out_dir || !nf) {
        fprintf(stderr, "tessera prepare-data: %s\n" PREPARE_USAGE,
                !o.tokenizer_dir ? "-t TOKENIZER_DIR is required"
                : !o.out_dir     ? "--out DIR is required"
                                 : "no input files");
        free(files);
        return 2;
    }
    ts_ctx *ctx = NULL;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_prepare_result r;
    ts_status s = ts_prepare_data(ctx, files, nf, &o, &r);
    free(files);
    if (s != TS_OK)
        return fail(ctx, "prepare-data");
    fprintf(stderr,
            "prepare-data: %lld bytes -> %lld train tokens (%d shards), %lld "
            "validation tokens (%d shards) in %s\n",
            (long long)r.bytes, (long long)r.train_tokens, r.train_shards,
            (long long)r.val_tokens, r.val_shards, o.out_dir);
    ts_ctx_free(ctx);
    return 0;
}

/* ---- train ---- */

static const char *TRAIN_USAGE =
    "usage: tessera train (--model-config CONFIG.json | --init-from DIR) "
    "--data DIR --out DIR\n"
    "         [--batch 8] [--seq 256] [--grad-accum 1] [--steps 1000] [--lr "
    "3e-4] [--min-lr 3e-5]\n"
    "         [--warmup 100] [--schedule cosine|constant] [--weight-decay "
    "0.1] [--clip 1.0]\n"
    "         [--eval-every N] [--eval-batches 8] [--save-every N] "
    "[--keep-last 3] [--log-every 1] [--seed 1]\n"
    "         [--tokenizer DIR] (default: the data folder's; checked against "
    "the model and the shards)\n"
    "         [--dtype f32|bf16] [--eager | --compile] "
    "[--checkpoint-activations] [--resume] "
    "[--quiet] [--peak-gflops G]\n"
    "         [--device cpu|vulkan:N] (the model, its gradients and "
    "AdamW's state there)\n"
    "         [--shard none|grad-opt|full] (under mpirun -np N: data "
    "parallel, ZeRO-2, or fully sharded)\n"
    "         [--bucket-mb 16] [--no-overlap] (data parallel: MiB per "
    "all-reduce; all-reduce after the backward, not during it)\n"
    "       tessera train --config FILE.json (the same keys, with "
    "underscores)\n";

/* the numeric options: name, range, integer or not, what to write */
typedef struct {
    const char *name;
    double lo, hi;
    bool integer;
    const char *want;
} num_opt;

static const num_opt NUM_OPTS[] = {
    {"batch", 1, 1 << 20, true, "an integer in 1..1048576, like 8"},
    {"seq", 1, 1 << 20, true, "an integer in 1..1048576, like 256"},
    {"grad-accum", 1, 64, true, "an integer in 1..64"},
    {"steps", 1, 1e12, true, "a positive integer, like 1000"},
    {"warmup", 0, 1e12, true, "an integer >= 0, like 100"},
    {"eval-every", 0, 1e12, true, "an integer >= 0 (0: never)"},
    {"eval-batches", 1, 1e6, true, "an integer in 1..1000000"},
    {"save-every", 0, 1e12, true, "an integer >= 0 (0: only at the end)"},
    {"log-every", 1, 1e12, true, "a positive integer"},
    {"keep-last", 0, 1e6, true,
     "an integer >= 0 (0: keep every checkpoint), like 3"},
    {"seed", 0, 9e15, true, "an integer >= 0"},
    {"lr", 1e-12, 10, false, "a positive float <= 10, like 3e-4"},
    {"min-lr", 0, 10, false, "a float in 0..10 (<= --lr), like 3e-5"},
    {"weight-decay", 0, 10, false, "a float in 0..10, like 0.1"},
    {"clip", 0, 1e9, false, "a float >= 0 (0: no clipping), like 1.0"},
    {"beta1", 0, 0.999999, false, "a float in [0, 1), like 0.9"},
    {"beta2", 0, 0.999999, false, "a float in [0, 1), like 0.95"},
    {"bucket-mb", 1e-6, 1e6, false, "a positive float (MiB), like 16"},
    {"peak-gflops", 1e-3, 1e9, false, "a positive float (GFLOP/s)"},
};

/* options taking a string, and flags taking nothing */
static const char *const STR_OPTS[] = {"model-config", "init-from", "data",
                                       "out",          "tokenizer", "schedule",
                                       "dtype",        "shard",     "device"};
static const char *const FLAG_OPTS[] = {"eager",  "compile",
                                        "resume", "checkpoint-activations",
                                        "quiet",  "no-overlap"};
#define COUNT(a) (sizeof(a) / sizeof *(a))

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), row[64];
    if (lb >= 64)
        return 64;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best, diag = up;
        }
    }
    return row[lb];
}

/* the known option nearest to k, or NULL when none is near */
static const char *closest_option(const char *k) {
    const char *best = NULL;
    size_t bd = (size_t)-1;
    for (size_t i = 0; i < COUNT(NUM_OPTS) + COUNT(STR_OPTS) + COUNT(FLAG_OPTS);
         i++) {
        const char *n = i < COUNT(NUM_OPTS) ? NUM_OPTS[i].name
                        : i < COUNT(NUM_OPTS) + COUNT(STR_OPTS)
                            ? STR_OPTS[i - COUNT(NUM_OPTS)]
                            : FLAG_OPTS[i - COUNT(NUM_OPTS) - COUNT(STR_OPTS)];
        size_t d = edit_distance(k, n);
        if (d < bd)
            bd = d, best = n;
    }
    return bd <= 1 + strlen(k) / 3 ? best : NULL;
}

/* one option by name (without the dashes, '-' or '_' alike); false when
 * unknown, missing its value or out of range, with err saying which and
 * what is allowed */
static bool train_opt(ts_train_options *o, const char *key, const char *v,
                      bool *used_value, char *err, size_t cap) {
    char k[64];
    snprintf(k, sizeof k, "%s", key);
    for (char *c = k; *c; c++)
        if (*c == '_')
            *c = '-';
    double x;
    *used_value = true;
    /* "--lr --steps 5": --lr's value is missing, not "--steps" */
    bool missing = !v || (v[0] == '-' && v[1] == '-');
    for (size_t i = 0; i < COUNT(NUM_OPTS); i++) {
        const num_opt *n = &NUM_OPTS[i];
        if (strcmp(k, n->name))
            continue;
        if (missing) {
            snprintf(err, cap, "--%s needs a value: %s", k, n->want);
            return false;
        }
        char *end;
        errno = 0;
        x = strtod(v, &end);
        if (end == v || *end || !isfinite(x)) {
            snprintf(err, cap, "--%s: \"%s\" is not a number; want %s", k, v,
                     n->want);
            return false;
        }
        if (n->integer && x != floor(x)) {
            snprintf(err, cap, "--%s: \"%s\" is not an integer; want %s", k, v,
                     n->want);
            return false;
        }
        if (!(x >= n->lo && x <= n->hi)) {
            snprintf(err, cap, "--%s: %s is out of range; want %s", k, v,
                     n->want);
            return false;
        }
        int64_t *iv = !strcmp(k, "batch")          ? &o->batch
                      : !strcmp(k, "seq")          ? &o->seq
                      : !strcmp(k, "grad-accum")   ? &o->grad_accum
                      : !strcmp(k, "steps")        ? &o->steps
                      : !strcmp(k, "warmup")       ? &o->warmup
                      : !strcmp(k, "eval-every")   ? &o->eval_every
                      : !strcmp(k, "eval-batches") ? &o->eval_batches
                      : !strcmp(k, "save-every")   ? &o->save_every
                      : !strcmp(k, "log-every")    ? &o->log_every
                      : !strcmp(k, "keep-last")    ? &o->keep_last
                                                   : NULL;
        double *dv = !strcmp(k, "lr")             ? &o->lr
                     : !strcmp(k, "min-lr")       ? &o->min_lr
                     : !strcmp(k, "weight-decay") ? &o->weight_decay
                     : !strcmp(k, "clip")         ? &o->clip
                     : !strcmp(k, "beta1")        ? &o->beta1
                     : !strcmp(k, "beta2")        ? &o->beta2
                     : !strcmp(k, "bucket-mb")    ? &o->bucket_mb
                                                  : NULL;
        if (iv)
            *iv = (int64_t)x;
        else if (dv)
            *dv = x;
        else if (!strcmp(k, "seed"))
            o->seed = (uint64_t)x;
        else /* peak-gflops */
            o->peak = x * 1e9;
        return true;
    }
    if (!strcmp(k, "device")) { /* checked when the run starts */
        if (missing || !*v) {
            snprintf(err, cap, "--device needs a value: cpu or vulkan:N");
            return false;
        }
        o->device = v;
        return true;
    }
    static const char *const choices[][4] = {
        {"schedule", "cosine", "constant", NULL},
        {"dtype", "f32", "bf16", NULL},
        {"shard", "none", "grad-opt", "full"}};
    for (size_t i = 0; i < COUNT(choices); i++) {
        if (strcmp(k, choices[i][0]))
            continue;
        int m = 1;
        while (m < 4 && choices[i][m] && (missing || strcmp(v, choices[i][m])))
            m++;
        if (m == 4 || !choices[i][m]) {
            char want[64];
            snprintf(want, sizeof want, "%s, %s%s%s", choices[i][1],
                     choices[i][2], choices[i][3] ? " or " : "",
                     choices[i][3] ? choices[i][3] : "");
            if (missing)
                snprintf(err, cap, "--%s needs a value: one of %s", k, want);
            else
                snprintf(err, cap, "--%s: \"%s\" is not one of %s", k, v, want);
            return false;
        }
        if (i == 0)
            o->constant_lr = m == 2;
        else if (i == 1)
            o->bf16 = m == 2;
        else
            o->shard = m - 1;
        return true;
    }
    for (size_t i = 0; i < 5; i++) /* the paths */
        if (!strcmp(k, STR_OPTS[i])) {
            if (missing || !*v) {
                snprintf(err, cap, "--%s needs a value: a %s", k,
                         i == 0 ? "config.json file" : "folder");
                return false;
            }
            const char **dst[] = {&o->model_config, &o->init_from, &o->data_dir,
                                  &o->out_dir, &o->tokenizer_dir};
            *dst[i] = v;
            return true;
        }
    *used_value = false;
    if (!strcmp(k, "eager"))
        return o->eager = true;
    if (!strcmp(k, "compile"))
        return !(o->eager = false);
    if (!strcmp(k, "resume"))
        return o->resume = true;
    if (!strcmp(k, "checkpoint-activations"))
        return o->checkpoint_activations = true;
    if (!strcmp(k, "quiet"))
        return o->quiet = true;
    if (!strcmp(k, "no-overlap"))
        return o->no_overlap = true;
    const char *near = closest_option(k);
    if (near)
        snprintf(err, cap, "unknown option \"--%s\"; did you mean \"--%s\"?", k,
                 near);
    else
        snprintf(err, cap, "unknown option \"--%s\" (see tessera train --help)",
                 k);
    return false;
}

int tessera_train(int argc, char **argv) {
    ts_train_options o = ts_train_default_options();
    json_t *cfg = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool used = false;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(TRAIN_USAGE, stdout);
            json_decref(cfg);
            return 0;
        }
        if (!strcmp(a, "--config")) {
            if (!v) {
                fprintf(stderr, "tessera train: --config needs a value: a "
                                "JSON file of options\n");
                json_decref(cfg);
                return 2;
            }
            json_error_t je;
            json_decref(cfg);
            cfg = json_load_file(v, JSON_REJECT_DUPLICATES, &je);
            if (!json_is_object(cfg)) {
                fprintf(stderr, "tessera train: %s: %s\n", v,
                        cfg ? "the config must be a JSON object" : je.text);
                json_decref(cfg);
                return 2;
            }
            const char *key;
            json_t *val;
            json_object_foreach(cfg, key, val) {
                char buf[64];
                const char *sv = json_string_value(val);
                if (json_is_integer(val))
                    snprintf(buf, sizeof buf, "%lld",
                             (long long)json_integer_value(val));
                else if (json_is_real(val))
                    snprintf(buf, sizeof buf, "%.17g", json_real_value(val));
                if (json_is_number(val))
                    sv = buf;
                bool flag_ok = json_is_boolean(val);
                bool u;
                char err[512] = "";
                if (!flag_ok && !sv)
                    snprintf(err, sizeof err,
                             "\"%s\" must be a string, a number or a boolean",
                             key);
                if (err[0] ||
                    (flag_ok ? (json_is_true(val) &&
                                !train_opt(&o, key, NULL, &u, err, sizeof err))
                             : !train_opt(&o, key, sv, &u, err, sizeof err))) {
                    fprintf(stderr, "tessera train: %s: %s\n", v, err);
                    json_decref(cfg);
                    return 2;
                }
            }
            i++;
            continue;
        }
        char err[512] = "";
        if (strncmp(a, "--", 2))
            snprintf(err, sizeof err,
                     "unexpected argument \"%s\" (every option is --name "
                     "VALUE; see tessera train --help)",
                     a);
        if (err[0] || !train_opt(&o, a + 2, v, &used, err, sizeof err)) {
            fprintf(stderr, "tessera train: %s\n", err);
            json_decref(cfg);
            return 2;
        }
        if (used)
            i++;
    }
    ts_ctx *ctx = NULL;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_dist *dist = NULL; /* under mpirun: this rank of the run */
    if (ts_dist_init(ctx, &dist) != TS_OK) {
        json_decref(cfg);
        return fail(ctx, "train");
    }
    o.dist = dist;
    ts_train_result r;
    ts_status s = ts_train_run(ctx, &o, &r);
    json_decref(cfg); /* option strings pointed into it */
    int rank = ts_dist_rank(dist), world = ts_dist_world(dist);
    if (s != TS_OK) {
        if (world > 1)
            fprintf(stderr, "[rank %d of %d] ", rank, world);
        int rc = fail(ctx, "train");
        ts_dist_free(dist);
        return rc;
    }
    if (!o.quiet && rank == 0) {
        char timed[64];
        if (r.timed_steps > 1)
            snprintf(timed, sizeof timed, "steps %lld-%lld",
                     (long long)r.timed_from,
                     (long long)(r.timed_from + r.timed_steps - 1));
        else
            snprintf(timed, sizeof timed, "step %lld", (long long)r.timed_from);
        fprintf(stderr,
                "train: %lld steps, loss %.4f -> %.4f, mean %.0f tokens/s, "
                "MFU %.1f%% of %.1f GFLOP/s (%s, after warm-up)",
                (long long)r.steps_done, r.first_loss, r.last_loss,
                r.tokens_per_s, 100 * r.mfu, r.peak / 1e9, timed);
        if (r.last_val_loss > 0)
            fprintf(stderr, ", validation loss %.4f", r.last_val_loss);
        if (world > 1)
            fprintf(stderr, ", %d ranks, %.0f%% of the time in collectives",
                    world, 100 * r.comm_share);
        fprintf(stderr, ", %.1f s\n", r.seconds);
    }
    ts_dist_free(dist);
    ts_ctx_free(ctx);
    return 0;
}

/* ---- bench peak ---- */

int tessera_bench(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "peak") ||
        (argc > 2 && strcmp(argv[2], "--fresh")) || argc > 3) {
        fprintf(stderr, "usage: tessera bench peak (--fresh is accepted and "
                        "ignored: nothing is cached)\n");
        return 2;
    }
    ts_ctx *ctx = NULL; /* sets the thread count (TS_NUM_THREADS) */
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_peak_info p;
    if (ts_peak_measure(ctx, true, &p) != TS_OK)
        return fail(ctx, "bench peak");
    printf("hardware peak f32, %d core(s): %.1f GFLOP/s = %d x %.2f GHz "
           "(measured) x %g FLOP/cycle (%s)\n",
           p.cores, p.hardware / 1e9, p.cores, p.clock_hz / 1e9,
           p.flops_per_cycle, p.isa);
    if (p.isa_note[0])
        printf("  note: %s\n", p.isa_note);
    printf("  CPU: %s\n  achievable now (sgemm 1024, %d thread(s)): %.1f "
           "GFLOP/s, %.0f%% of the hardware peak\n",
           p.cpu, ts_get_num_threads(ctx), p.sgemm / 1e9,
           100 * p.sgemm / p.hardware);
    ts_ctx_free(ctx);
    return 0;
}

/* ---- plot-loss ---- */

int tessera_plot_loss(int argc, char **argv) {
    const char *log = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (argv[i][0] != '-')
            log = argv[i];
        else {
            fprintf(stderr, "usage: tessera plot-loss LOG.jsonl --out "
                            "loss.svg\n");
            return 2;
        }
    }
    if (!log || !out) {
        fprintf(stderr, "usage: tessera plot-loss LOG.jsonl --out loss.svg\n");
        return 2;
    }
    FILE *f = fopen(log, "r");
    if (!f) {
        fprintf(stderr, "tessera plot-loss: %s: %s\n", log, strerror(errno));
        return 1;
    }
    size_t n = 0, nv = 0, cap = 1024;
    double *sx = malloc(sizeof(double) * cap),
           *sy = malloc(sizeof(double) * cap),
           *vx = malloc(sizeof(double) * cap),
           *vy = malloc(sizeof(double) * cap);
    char line[4096];
    int lineno = 0;
    while (sx && sy && vx && vy && fgets(line, sizeof line, f)) {
        lineno++;
        json_t *j = json_loads(line, 0, NULL);
        json_t *st = json_object_get(j, "step"),
               *lo = json_object_get(j, "loss"),
               *va = json_object_get(j, "val_loss");
        if (!json_is_number(st) || !json_is_number(lo)) {
            fprintf(stderr,
                    "tessera plot-loss: %s:%d is not a log line with "
                    "step and loss\n",
                    log, lineno);
            json_decref(j);
            fclose(f);
            free(sx), free(sy), free(vx), free(vy);
            return 1;
        }
        if (n == cap || nv == cap) {
            cap *= 2;
            sx = realloc(sx, sizeof(double) * cap),
            sy = realloc(sy, sizeof(double) * cap);
            vx = realloc(vx, sizeof(double) * cap),
            vy = realloc(vy, sizeof(double) * cap);
            if (!sx || !sy || !vx || !vy)
                break;
        }
        /* a log from before --resume cut it back holds a resumed run's
         * steps twice: the later lines replace the earlier */
        double step = json_number_value(st);
        while (n && sx[n - 1] >= step)
            n--;
        while (nv && vx[nv - 1] >= step)
            nv--;
        sx[n] = step, sy[n++] = json_number_value(lo);
        if (json_is_number(va))
            vx[nv] = json_number_value(st), vy[nv++] = json_number_value(va);
        json_decref(j);
    }
    fclose(f);
    if (!n) {
        fprintf(stderr, "tessera plot-loss: %s has no log lines\n", log);
        free(sx), free(sy), free(vx), free(vy);
        return 1;
    }
    double x0 = sx[0], x1 = sx[n - 1], y0 = INFINITY, y1 = -INFINITY;
    for (size_t i = 0; i < n; i++)
        y0 = fmin(y0, sy[i]), y1 = fmax(y1, sy[i]);
    for (size_t i = 0; i < nv; i++)
        y0 = fmin(y0, vy[i]), y1 = fmax(y1, vy[i]);
    if (x1 <= x0)
        x1 = x0 + 1;
    if (y1 <= y0)
        y1 = y0 + 1;
    const double W = 800, H = 480, L = 60, R = 20, T = 20, B = 40;
    FILE *o = fopen(out, "w");
    if (!o) {
        fprintf(stderr, "tessera plot-loss: %s: %s\n", out, strerror(errno));
        free(sx), free(sy), free(vx), free(vy);
        return 1;
    }
    fprintf(o,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" "
            "height=\"%g\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H);
    for (int k = 0; k <= 4; k++) { /* axes ticks */
        double yv = y0 + (y1 - y0) * k / 4,
               yp = T + (H - T - B) * (1 - k / 4.0);
        double xv = x0 + (x1 - x0) * k / 4, xp = L + (W - L - R) * k / 4.0;
        fprintf(
            o,
            "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#ddd\"/>"
            "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%.3g</text>\n"
            "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%.0f</text>\n",
            L, yp, W - R, yp, L - 6, yp + 4, yv, xp, H - B + 16, xv);
    }
    const double *xs[2] = {sx, vx}, *ys[2] = {sy, vy};
    size_t ns[2] = {n, nv};
    const char *col[2] = {"#1f77b4", "#d62728"};
    for (int s = 0; s < 2; s++) {
        if (!ns[s])
            continue;
        fprintf(o,
                "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                "points=\"",
                col[s]);
        for (size_t i = 0; i < ns[s]; i++)
            fprintf(o, "%.1f,%.1f ",
                    L + (W - L - R) * (xs[s][i] - x0) / (x1 - x0),
                    T + (H - T - B) * (1 - (ys[s][i] - y0) / (y1 - y0)));
        fprintf(o, "\"/>\n");
    }
    fprintf(o,
            "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">step</text>\n"
            "<text x=\"%g\" y=\"14\" fill=\"%s\">train loss</text>"
            "<text x=\"%g\" y=\"14\" fill=\"%s\">validation loss</text>\n"
            "</svg>\n",
            (L + W - R) / 2, H - 6, L + 10, col[0], L + 110, col[1]);
    fclose(o);
    free(sx), free(sy), free(vx), free(vy);
    fprintf(stderr, "plot-loss: %zu points (%zu validation) -> %s\n", n, nv,
            out);
    return 0;
}
