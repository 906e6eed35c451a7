/* train_cli.c — the training commands: tokenizer-train, prepare-data,
 * train (options on the command line or in a JSON file with the same
 * keys), bench peak, plot-loss (an SVG of log.jsonl). */
#include "tessera_diffusion.h"
#include "tessera_tokenizer.h"
#include "tessera_train.h"

#include "cli/opts.h"

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

enum { K_VOCAB = 1, K_MIN_FREQ, K_OUT };

static const cli_opt TOKENIZER_TRAIN_OPTS[] = {
    {K_VOCAB, "--vocab", CLI_INT, "N", 257, 1 << 24, .def = "4096",
     .help = "the vocabulary's size (256 bytes, the merges, <|endoftext|>)"},
    {K_OUT, "--out", CLI_STR, "DIR",
     .help = "where tokenizer.json and tokenizer_config.json go"},
    {K_MIN_FREQ, "--min-frequency", CLI_INT, "N", 1, 1e9, .def = "2",
     .help = "merge only pairs seen at least N times"},
    {0},
};

static const cli_cmd TOKENIZER_TRAIN_CMD = {
    .name = "tokenizer-train",
    .usage = "tokenizer-train --vocab N --out DIR [--min-frequency 2] "
             "FILES...",
    .about = "Trains a byte-level BPE tokenizer (GPT-2's pre-tokenizer) on "
             "text files.",
    .opts = TOKENIZER_TRAIN_OPTS,
    .positional = "  FILES                       the text files\n",
    .short_threads = true,
};

int tessera_tokenizer_train(int argc, char **argv) {
    ts_bpe_train_options o = ts_bpe_train_default_options();
    const cli_cmd *c = &TOKENIZER_TRAIN_CMD;
    const char *out = NULL;
    const char **files = calloc((size_t)argc, sizeof *files);
    int nf = 0, id;
    cli_parser p;
    cli_val v;
    cli_begin(&p, c, argc, argv);
    while (files && (id = cli_next(&p, &v)) != CLI_END) {
        if (id == CLI_HELP || id == CLI_ERROR) {
            if (id == CLI_HELP)
                cli_help(c, stdout);
            free(files);
            return id == CLI_HELP ? 0 : 2;
        }
        if (id == CLI_POSITIONAL)
            files[nf++] = v.s;
        else if (id == K_VOCAB)
            o.vocab_size = (int)v.i;
        else if (id == K_MIN_FREQ)
            o.min_frequency = (int)v.i;
        else
            out = v.s;
    }
    if (!out || !nf) {
        free(files);
        return cli_fail(c, "%s (see tessera tokenizer-train --help)",
                        !out ? "--out DIR is required" : "no input files");
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

/* prepare-data's options for --help and "did you mean"; the parser below
 * reads each by these names (its messages say what each wants) */
static const cli_opt PREPARE_OPTS[] = {
    {1, "-t, --tokenizer", CLI_STR, "TOKENIZER_DIR",
     .help = "the folder holding tokenizer.json"},
    {2, "--out", CLI_STR, "DIR", .help = "where the shards go"},
    {3, "--val-fraction", CLI_NUM, "F", 0, 0.99, .def = "0.05",
     .help = "the share of the text held out for validation"},
    {4, "--shard-tokens", CLI_INT, "N", 1024, 1e12, .def = "67108864",
     .help = "tokens per shard file"},
    {5, "--model-config", CLI_STR, "CONFIG.json",
     .help = "check the tokenizer's vocabulary against this model's"},
    {0},
};

static const cli_cmd PREPARE_CMD = {
    .name = "prepare-data",
    .usage = "prepare-data -t TOKENIZER_DIR --out DIR [options] FILES...",
    .about = "Tokenizes text files into token shards for tessera train (train "
             "and validation). -t here is the tokenizer: the threads are "
             "--threads only.",
    .opts = PREPARE_OPTS,
    .positional = "  FILES                       the text files\n",
    .short_threads = false,
};

/* "unknown option" with the nearest of PREPARE_OPTS' names, if near */
static void prepare_unknown(const char *a, char *err, size_t cap) {
    const char *names[] = {"-t",
                           "--tokenizer",
                           "--out",
                           "--val-fraction",
                           "--shard-tokens",
                           "--model-config",
                           "--threads",
                           "--help"};
    const char *near = cli_closest(a, names, sizeof names / sizeof *names);
    if (near)
        snprintf(err, cap, "unknown option \"%s\"; did you mean \"%s\"?", a,
                 near);
    else
        snprintf(err, cap, "unknown option \"%s\"", a);
}

int tessera_prepare_data(int argc, char **argv) {
    ts_prepare_options o = {.val_fraction = 0.05, .shard_tokens = 1 << 26};
    const char **files = calloc((size_t)argc, sizeof *files);
    int nf = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool missing = !v || (v[0] == '-' && v[1] == '-');
        char err[256] = "";
        double x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_help(&PREPARE_CMD, stdout);
            free(files);
            return 0;
        }
        if (!strcmp(a, "-t") || !strcmp(a, "--tokenizer") ||
            !strcmp(a, "--out") || !strcmp(a, "--model-config")) {
            if (missing)
                snprintf(err, sizeof err, "%s needs a value: a %s", a,
                         !strcmp(a, "--model-config") ? "config.json file"
                                                      : "folder");
            else if (!strcmp(a, "-t") || !strcmp(a, "--tokenizer"))
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
            prepare_unknown(a, err, sizeof err);
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

enum {
    T_MODEL_CONFIG = 1,
    T_INIT_FROM,
    T_DATA,
    T_OUT,
    T_TOKENIZER,
    T_BATCH,
    T_SEQ,
    T_GRAD_ACCUM,
    T_STEPS,
    T_LR,
    T_MIN_LR,
    T_WARMUP,
    T_SCHEDULE,
    T_WEIGHT_DECAY,
    T_CLIP,
    T_BETA1,
    T_BETA2,
    T_EVAL_EVERY,
    T_EVAL_BATCHES,
    T_SAVE_EVERY,
    T_KEEP_LAST,
    T_LOG_EVERY,
    T_SEED,
    T_DTYPE,
    T_DEVICE,
    T_EAGER,
    T_COMPILE,
    T_CKPT_ACT,
    T_RESUME,
    T_QUIET,
    T_PEAK,
    T_SHARD,
    T_BUCKET_MB,
    T_NO_OVERLAP,
    T_CONFIG,
};

/* train's options: --help prints this table and train_opt parses by it
 * (one name each; "--config FILE" holds the same keys, '_' for '-'); the
 * messages say what each wants (tests/train_cli_flags.py) */
static const cli_opt TRAIN_OPTS[] = {
    {T_MODEL_CONFIG, "--model-config", CLI_STR, "CONFIG.json",
     .want = "a config.json file",
     .help = "train a new model of this config.json (or --init-from)"},
    {T_INIT_FROM, "--init-from", CLI_STR, "DIR", .want = "a folder",
     .help = "start from this model folder's weights"},
    {T_DATA, "--data", CLI_STR, "DIR", .want = "a folder",
     .help = "the token shards (tessera prepare-data)"},
    {T_OUT, "--out", CLI_STR, "DIR", .want = "a folder",
     .help = "checkpoints, log.jsonl and the final model folder"},
    {T_TOKENIZER, "--tokenizer", CLI_STR, "DIR", .want = "a folder",
     .def = "the data folder's",
     .help = "checked against the model and the shards"},
    {T_BATCH, "--batch", CLI_INT, "N", 1, 1 << 20, .def = "8",
     .want = "an integer in 1..1048576, like 8",
     .help = "sequences per step (per rank)"},
    {T_SEQ, "--seq", CLI_INT, "N", 1, 1 << 20, .def = "256",
     .want = "an integer in 1..1048576, like 256",
     .help = "tokens per sequence"},
    {T_GRAD_ACCUM, "--grad-accum", CLI_INT, "N", 1, 64, .def = "1",
     .want = "an integer in 1..64", .help = "micro-batches per optimizer step"},
    {T_STEPS, "--steps", CLI_INT, "N", 1, 1e12, .def = "1000",
     .want = "a positive integer, like 1000", .help = "optimizer steps"},
    {T_LR, "--lr", CLI_NUM, "LR", 1e-12, 10, .def = "3e-4",
     .want = "a positive float <= 10, like 3e-4",
     .help = "the peak learning rate"},
    {T_MIN_LR, "--min-lr", CLI_NUM, "LR", 0, 10, .def = "3e-5",
     .want = "a float in 0..10 (<= --lr), like 3e-5",
     .help = "the cosine schedule's floor"},
    {T_WARMUP, "--warmup", CLI_INT, "N", 0, 1e12, .def = "100",
     .want = "an integer >= 0, like 100", .help = "linear warm-up steps"},
    {T_SCHEDULE, "--schedule", CLI_CHOICE, .choices = "cosine|constant",
     .def = "cosine", .help = "the learning rate after warm-up"},
    {T_WEIGHT_DECAY, "--weight-decay", CLI_NUM, "W", 0, 10, .def = "0.1",
     .want = "a float in 0..10, like 0.1",
     .help = "AdamW's decoupled weight decay"},
    {T_CLIP, "--clip", CLI_NUM, "NORM", 0, 1e9, .def = "1.0",
     .want = "a float >= 0 (0: no clipping), like 1.0",
     .help = "clip the gradient's global norm (0: no clipping)"},
    {T_BETA1, "--beta1", CLI_NUM, "B", 0, 0.999999, .def = "0.9",
     .want = "a float in [0, 1), like 0.9", .help = "AdamW's beta1"},
    {T_BETA2, "--beta2", CLI_NUM, "B", 0, 0.999999, .def = "0.95",
     .want = "a float in [0, 1), like 0.95", .help = "AdamW's beta2"},
    {T_EVAL_EVERY, "--eval-every", CLI_INT, "N", 0, 1e12, .def = "0 (never)",
     .want = "an integer >= 0 (0: never)",
     .help = "validation loss every N steps"},
    {T_EVAL_BATCHES, "--eval-batches", CLI_INT, "N", 1, 1e6, .def = "8",
     .want = "an integer in 1..1000000", .help = "batches per validation"},
    {T_SAVE_EVERY, "--save-every", CLI_INT, "N", 0, 1e12,
     .def = "0 (only at the end)",
     .want = "an integer >= 0 (0: only at the end)",
     .help = "a checkpoint every N steps"},
    {T_KEEP_LAST, "--keep-last", CLI_INT, "N", 0, 1e6, .def = "3",
     .want = "an integer >= 0 (0: keep every checkpoint), like 3",
     .help = "checkpoints kept (0: every one)"},
    {T_LOG_EVERY, "--log-every", CLI_INT, "N", 1, 1e12, .def = "1",
     .want = "a positive integer", .help = "a log line every N steps"},
    {T_SEED, "--seed", CLI_INT, "N", 0, 9e15, .def = "1",
     .want = "an integer >= 0", .help = "initialization and data order"},
    {T_DTYPE, "--dtype", CLI_CHOICE, .choices = "f32|bf16", .def = "f32",
     .help = "bf16: mixed precision (f32 master weights)"},
    {T_DEVICE, "--device", CLI_STR, "cpu|vulkan:N", .def = "cpu",
     .want = "cpu or vulkan:N",
     .help = "the model, its gradients and AdamW's state there"},
    {T_EAGER, "--eager", CLI_FLAG, .help = "run op by op (the default)"},
    {T_COMPILE, "--compile", CLI_FLAG,
     .help = "compile the training step's graph"},
    {T_CKPT_ACT, "--checkpoint-activations", CLI_FLAG,
     .help = "recompute activations in the backward (less memory)"},
    {T_RESUME, "--resume", CLI_FLAG,
     .help = "go on from the last checkpoint in --out"},
    {T_QUIET, "--quiet", CLI_FLAG, .help = "no progress lines"},
    {T_PEAK, "--peak-gflops", CLI_NUM, "G", 1e-3, 1e9,
     .def = "measured (tessera bench peak)",
     .want = "a positive float (GFLOP/s)", .help = "the peak for MFU"},
    {T_SHARD, "--shard", CLI_CHOICE, .choices = "none|grad-opt|full",
     .def = "none",
     .help = "under mpirun -np N: data parallel, ZeRO-2, or fully sharded"},
    {T_BUCKET_MB, "--bucket-mb", CLI_NUM, "MB", 1e-6, 1e6, .def = "16",
     .want = "a positive float (MiB), like 16",
     .help = "data parallel: MiB per all-reduce"},
    {T_NO_OVERLAP, "--no-overlap", CLI_FLAG,
     .help = "all-reduce after the backward, not during it"},
    {T_CONFIG, "--config", CLI_STR, "FILE.json",
     .help = "the same options as a JSON object (keys with - or _); later "
             "flags override"},
    {0},
};

static const cli_cmd TRAIN_CMD = {
    .name = "train",
    .usage = "train (--model-config CONFIG.json | --init-from DIR) --data "
             "DIR --out DIR [options]\n"
             "       tessera train --config FILE.json",
    .about = "Trains a decoder with AdamW on token shards; each option is "
             "--name VALUE (or --name=VALUE).",
    .opts = TRAIN_OPTS,
    .short_threads = true,
};

/* the option named k (without its dashes), or NULL */
static const cli_opt *train_find(const char *k) {
    for (const cli_opt *t = TRAIN_OPTS; t->id; t++)
        if (!strcmp(t->names + 2, k))
            return t;
    return NULL;
}

/* "a, b" or "a, b or c": a choice option's values, for messages */
static void choice_list(const cli_opt *t, char *buf, size_t cap) {
    size_t n = 0, bars = 0;
    for (const char *c = t->choices; *c; c++)
        bars += *c == '|';
    for (const char *c = t->choices; *c && n + 4 < cap; c++) {
        if (*c != '|') {
            buf[n++] = *c;
            continue;
        }
        bool last = bars > 1 && !strchr(c + 1, '|');
        n += (size_t)snprintf(buf + n, cap - n, last ? " or " : ", ");
    }
    buf[n] = 0;
}

/* a numeric option's value into o */
static bool train_number(ts_train_options *o, const cli_opt *t, const char *k,
                         const char *v, char *err, size_t cap) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || !isfinite(x)) {
        snprintf(err, cap, "--%s: \"%s\" is not a number; want %s", k, v,
                 t->want);
        return false;
    }
    if (t->kind == CLI_INT && x != floor(x)) {
        snprintf(err, cap, "--%s: \"%s\" is not an integer; want %s", k, v,
                 t->want);
        return false;
    }
    if (!(x >= t->lo && x <= t->hi)) {
        snprintf(err, cap, "--%s: %s is out of range; want %s", k, v, t->want);
        return false;
    }
    int64_t i = (int64_t)x;
    switch (t->id) {
    case T_BATCH:
        o->batch = i;
        break;
    case T_SEQ:
        o->seq = i;
        break;
    case T_GRAD_ACCUM:
        o->grad_accum = i;
        break;
    case T_STEPS:
        o->steps = i;
        break;
    case T_WARMUP:
        o->warmup = i;
        break;
    case T_EVAL_EVERY:
        o->eval_every = i;
        break;
    case T_EVAL_BATCHES:
        o->eval_batches = i;
        break;
    case T_SAVE_EVERY:
        o->save_every = i;
        break;
    case T_LOG_EVERY:
        o->log_every = i;
        break;
    case T_KEEP_LAST:
        o->keep_last = i;
        break;
    case T_SEED:
        o->seed = (uint64_t)i;
        break;
    case T_LR:
        o->lr = x;
        break;
    case T_MIN_LR:
        o->min_lr = x;
        break;
    case T_WEIGHT_DECAY:
        o->weight_decay = x;
        break;
    case T_CLIP:
        o->clip = x;
        break;
    case T_BETA1:
        o->beta1 = x;
        break;
    case T_BETA2:
        o->beta2 = x;
        break;
    case T_BUCKET_MB:
        o->bucket_mb = x;
        break;
    case T_PEAK:
        o->peak = x * 1e9;
        break;
    }
    return true;
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
    const cli_opt *t = train_find(k);
    if (!t || t->id == T_CONFIG) { /* --config is read by the caller */
        const char *names[64];
        size_t n = 0;
        for (const cli_opt *u = TRAIN_OPTS; u->id && n < 64; u++)
            if (u->id != T_CONFIG)
                names[n++] = u->names + 2;
        const char *near = cli_closest(k, names, n);
        if (near)
            snprintf(err, cap,
                     "unknown option \"--%s\"; did you mean \"--%s\"?", k,
                     near);
        else
            snprintf(err, cap,
                     "unknown option \"--%s\" (see tessera train --help)", k);
        return false;
    }
    *used_value = t->kind != CLI_FLAG;
    /* "--lr --steps 5": --lr's value is missing, not "--steps" */
    bool missing =
        !v || (v[0] == '-' && v[1] == '-') || (t->kind == CLI_STR && !*v);
    char want[64];
    if (t->kind == CLI_CHOICE) {
        char list[48];
        choice_list(t, list, sizeof list);
        snprintf(want, sizeof want, "one of %s", list);
    } else
        snprintf(want, sizeof want, "%s", t->want ? t->want : "");
    if (t->kind != CLI_FLAG && missing) {
        snprintf(err, cap, "--%s needs a value: %s", k, want);
        return false;
    }
    cli_val cv;
    switch (t->kind) {
    case CLI_INT:
    case CLI_NUM:
    case CLI_SIZE:
        return train_number(o, t, k, v, err, cap);
    case CLI_CHOICE:
        if (!cli_value(t, v, &cv)) {
            snprintf(err, cap, "--%s: \"%s\" is not %s", k, v, want);
            return false;
        }
        if (t->id == T_SCHEDULE)
            o->constant_lr = cv.choice == 1;
        else if (t->id == T_DTYPE)
            o->bf16 = cv.choice == 1;
        else
            o->shard = cv.choice;
        return true;
    case CLI_STR: {
        const char **dst[] = {[T_MODEL_CONFIG] = &o->model_config,
                              [T_INIT_FROM] = &o->init_from,
                              [T_DATA] = &o->data_dir,
                              [T_OUT] = &o->out_dir,
                              [T_TOKENIZER] = &o->tokenizer_dir,
                              [T_DEVICE] = &o->device};
        *dst[t->id] = v; /* a device is checked when the run starts */
        return true;
    }
    case CLI_FLAG:
        break;
    }
    switch (t->id) {
    case T_EAGER:
        o->eager = true;
        break;
    case T_COMPILE:
        o->eager = false;
        break;
    case T_RESUME:
        o->resume = true;
        break;
    case T_CKPT_ACT:
        o->checkpoint_activations = true;
        break;
    case T_QUIET:
        o->quiet = true;
        break;
    case T_NO_OVERLAP:
        o->no_overlap = true;
        break;
    }
    return true;
}

static int tessera_train_dit(int argc, char **argv);
static const cli_cmd TRAIN_DIT_CMD;

int tessera_train(int argc, char **argv) {
    /* the DiT form: --dit, or an option only it has */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--dit") || !strncmp(a, "--dit-config", 12) ||
            !strncmp(a, "--fonts", 7) || !strncmp(a, "--ema", 5) ||
            !strncmp(a, "--beta-schedule", 15) ||
            !strncmp(a, "--snr-gamma", 11))
            return tessera_train_dit(argc, argv);
    }
    ts_train_options o = ts_train_default_options();
    json_t *cfg = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool used = false;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_help(&TRAIN_CMD, stdout);
            fputs("\nThe DiT form (train --dit):\n\n", stdout);
            cli_help(&TRAIN_DIT_CMD, stdout);
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
        /* --name=VALUE */
        char key[64];
        const char *eq = err[0] ? NULL : strchr(a, '=');
        if (eq)
            snprintf(key, sizeof key, "%.*s", (int)(eq - a - 2), a + 2),
                v = eq + 1;
        if (err[0] ||
            !train_opt(&o, eq ? key : a + 2, v, &used, err, sizeof err)) {
            fprintf(stderr, "tessera train: %s\n", err);
            json_decref(cfg);
            return 2;
        }
        if (used && !eq)
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

/* ---- train --dit ---- */

enum {
    D_DIT = 1,
    D_DIT_CONFIG,
    D_DATA,
    D_FONTS,
    D_OUT,
    D_STEPS,
    D_BATCH,
    D_LR,
    D_MIN_LR,
    D_WARMUP,
    D_WEIGHT_DECAY,
    D_CLIP,
    D_EMA,
    D_SEED,
    D_DTYPE,
    D_EAGER,
    D_COMPILE,
    D_LOG_EVERY,
    D_SAVE_EVERY,
    D_QUIET,
    D_PEAK,
    D_BETAS,
    D_SNR,
};

static const cli_opt TRAIN_DIT_OPTS[] = {
    {D_DIT, "--dit", CLI_FLAG,
     .help = "train a DiTTransformer2DModel (this form of the command)"},
    {D_DIT_CONFIG, "--dit-config", CLI_STR, "K=V,...",
     .def = "patch_size=4,num_layers=6,num_attention_heads=4,"
            "attention_head_dim=32",
     .help = "the model's shape (Diffusers' config keys)"},
    {D_DATA, "--data", CLI_CHOICE, .choices = "glyphs", .def = "glyphs",
     .help = "the data set: 0-9 A-Z a-z rendered from the fonts"},
    {D_FONTS, "--fonts", CLI_STR, "DIR", .def = "/usr/share/fonts",
     .help = "where the glyph fonts are found"},
    {D_OUT, "--out", CLI_STR, "DIR",
     .help = "the DiTPipeline folder written (and log.jsonl)"},
    {D_STEPS, "--steps", CLI_INT, "N", 1, 1e12, .def = "2000",
     .help = "optimizer steps"},
    {D_BATCH, "--batch", CLI_INT, "N", 1, 1 << 20, .def = "64",
     .help = "images per step (all ranks)"},
    {D_LR, "--lr", CLI_NUM, "LR", 1e-12, 10, .def = "1e-3",
     .help = "the peak learning rate"},
    {D_MIN_LR, "--min-lr", CLI_NUM, "LR", 0, 10, .def = "1e-4",
     .help = "the cosine schedule's floor"},
    {D_WARMUP, "--warmup", CLI_INT, "N", 0, 1e12, .def = "100",
     .help = "linear warm-up steps"},
    {D_WEIGHT_DECAY, "--weight-decay", CLI_NUM, "W", 0, 10, .def = "0",
     .help = "AdamW's decoupled weight decay"},
    {D_CLIP, "--clip", CLI_NUM, "NORM", 0, 1e9, .def = "1.0",
     .help = "clip the gradient's global norm (0: no clipping)"},
    {D_EMA, "--ema", CLI_NUM, "DECAY", 0, 0.999999, .def = "0.999",
     .help = "EMA of the weights, saved (0: the raw weights)"},
    {D_SEED, "--seed", CLI_INT, "N", 0, 9e15, .def = "1",
     .help = "initialization, data and noise"},
    {D_DTYPE, "--dtype", CLI_CHOICE, .choices = "f32|bf16", .def = "f32",
     .help = "bf16: bf16 compute copies of the matrices, f32 masters"},
    {D_EAGER, "--eager", CLI_FLAG, .help = "run op by op (the default)"},
    {D_COMPILE, "--compile", CLI_FLAG,
     .help = "compile the training step's graph"},
    {D_LOG_EVERY, "--log-every", CLI_INT, "N", 1, 1e12, .def = "10",
     .help = "a log line every N steps"},
    {D_SAVE_EVERY, "--save-every", CLI_INT, "N", 0, 1e12,
     .def = "0 (only at the end)", .help = "write the folder every N steps"},
    {D_QUIET, "--quiet", CLI_FLAG, .help = "no progress lines"},
    {D_PEAK, "--peak-gflops", CLI_NUM, "G", 1e-3, 1e9,
     .def = "measured (tessera bench peak)", .help = "the peak for MFU"},
    {D_BETAS, "--beta-schedule", CLI_CHOICE, "S",
     .choices = "linear|squaredcos_cap_v2", .def = "linear",
     .help = "the DDPM schedule's betas (written to the scheduler config)"},
    {D_SNR, "--snr-gamma", CLI_NUM, "G", 0, 1e6, .def = "0 (unweighted)",
     .help = "min-SNR loss weights: min(SNR, G) / SNR per image"},
    {0},
};

static const cli_cmd TRAIN_DIT_CMD = {
    .name = "train",
    .usage = "train --dit --data glyphs --out DIR [--dit-config K=V,...] "
             "[options]",
    .about = "Trains a class-conditional DiT (Diffusers' "
             "DiTTransformer2DModel) on 32x32 glyph images with DDPM's "
             "noise-prediction loss, and saves a DiTPipeline folder (no VAE: "
             "pixel space).",
    .opts = TRAIN_DIT_OPTS,
    .short_threads = true,
};

/* "k=v,k=v" into o; false with err naming the bad entry */
static bool dit_config(ts_dit_train_options *o, const char *spec, char *err,
                       size_t cap) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        double x;
        if (!eq) {
            snprintf(err, cap, "--dit-config: \"%s\" is not KEY=VALUE", kv);
            return false;
        }
        *eq = 0;
        const char *k = kv, *v = eq + 1;
        int64_t *dst =
            !strcmp(k, "patch_size")            ? &o->patch_size
            : !strcmp(k, "num_layers")          ? &o->num_layers
            : !strcmp(k, "num_attention_heads") ? &o->num_attention_heads
            : !strcmp(k, "attention_head_dim")  ? &o->attention_head_dim
                                                : NULL;
        if (!dst) {
            snprintf(err, cap,
                     "--dit-config: unknown key \"%s\" (patch_size, "
                     "num_layers, num_attention_heads, attention_head_dim; "
                     "the data fixes sample_size 32, in_channels 1, "
                     "num_embeds_ada_norm 62)",
                     k);
            return false;
        }
        if (!num(v, 1, 4096, &x) || x != floor(x)) {
            snprintf(err, cap,
                     "--dit-config: %s=\"%s\" is not an integer in 1..4096", k,
                     v);
            return false;
        }
        *dst = (int64_t)x;
    }
    return true;
}

static int tessera_train_dit(int argc, char **argv) {
    ts_dit_train_options o = ts_dit_default_train_options();
    const cli_cmd *c = &TRAIN_DIT_CMD;
    cli_parser p;
    cli_val v;
    int id;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            cli_help(c, stdout);
            return 0;
        }
    cli_begin(&p, c, argc, argv);
    while ((id = cli_next(&p, &v)) != CLI_END) {
        char err[512] = "";
        switch (id) {
        case CLI_HELP:
            cli_help(c, stdout);
            return 0;
        case CLI_ERROR:
            return 2;
        case CLI_POSITIONAL:
            return cli_fail(c,
                            "unexpected argument \"%s\" (see tessera train "
                            "--dit --help)",
                            v.s);
        case D_DIT_CONFIG:
            if (!dit_config(&o, v.s, err, sizeof err))
                return cli_fail(c, "%s", err);
            break;
        case D_FONTS:
            o.font_dir = v.s;
            break;
        case D_OUT:
            o.out_dir = v.s;
            break;
        case D_STEPS:
            o.steps = v.i;
            break;
        case D_BATCH:
            o.batch = v.i;
            break;
        case D_LR:
            o.lr = v.num;
            break;
        case D_MIN_LR:
            o.min_lr = v.num;
            break;
        case D_WARMUP:
            o.warmup = v.i;
            break;
        case D_WEIGHT_DECAY:
            o.weight_decay = v.num;
            break;
        case D_CLIP:
            o.clip = v.num;
            break;
        case D_EMA:
            o.ema = v.num;
            break;
        case D_BETAS:
            o.cosine = v.choice == 1;
            break;
        case D_SNR:
            o.snr_gamma = v.num;
            break;
        case D_SEED:
            o.seed = (uint64_t)v.i;
            break;
        case D_DTYPE:
            o.bf16 = v.choice == 1;
            break;
        case D_EAGER:
            o.eager = true;
            break;
        case D_COMPILE:
            o.eager = false;
            break;
        case D_LOG_EVERY:
            o.log_every = v.i;
            break;
        case D_SAVE_EVERY:
            o.save_every = v.i;
            break;
        case D_QUIET:
            o.quiet = true;
            break;
        case D_PEAK:
            o.peak = v.num * 1e9;
            break;
        default: /* --dit, --data glyphs */
            break;
        }
    }
    if (!o.out_dir)
        return cli_fail(c, "--out DIR is required (see tessera train --dit "
                           "--help)");
    ts_ctx *ctx = NULL;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_dist *dist = NULL;
    if (ts_dist_init(ctx, &dist) != TS_OK)
        return fail(ctx, "train");
    o.dist = dist;
    ts_dit_train_result r;
    ts_status s = ts_dit_train_run(ctx, &o, &r);
    int rank = ts_dist_rank(dist), world = ts_dist_world(dist);
    if (s != TS_OK) {
        if (world > 1)
            fprintf(stderr, "[rank %d of %d] ", rank, world);
        int rc = fail(ctx, "train");
        ts_dist_free(dist);
        return rc;
    }
    if (!o.quiet && rank == 0)
        fprintf(stderr,
                "train --dit: %lld steps, loss %.4f -> %.4f, mean %.0f "
                "tokens/s (patches), MFU %.1f%% of %.1f GFLOP/s (after "
                "the first step), %.1f s -> %s\n",
                (long long)r.steps_done, r.first_loss, r.last_loss,
                r.tokens_per_s, 100 * r.mfu, r.peak / 1e9, r.seconds,
                o.out_dir);
    ts_dist_free(dist);
    ts_ctx_free(ctx);
    return 0;
}

/* ---- bench peak ---- */

static const cli_opt BENCH_OPTS[] = {
    {1, "--fresh", CLI_FLAG, .help = "accepted and ignored: nothing is cached"},
    {0},
};

static const cli_cmd BENCH_CMD = {
    .name = "bench",
    .usage = "bench peak",
    .about = "The machine's f32 matmul peak (cores x clock x FLOP per cycle) "
             "and the sgemm rate reached now: the denominator of train's MFU.",
    .opts = BENCH_OPTS,
    .positional = "  peak                        the one benchmark\n",
    .short_threads = true,
};

int tessera_bench(int argc, char **argv) {
    bool peak = false;
    cli_parser cp;
    cli_val v;
    cli_begin(&cp, &BENCH_CMD, argc, argv);
    for (int id; (id = cli_next(&cp, &v)) != CLI_END;) {
        if (id == CLI_HELP)
            return cli_help(&BENCH_CMD, stdout), 0;
        if (id == CLI_ERROR)
            return 2;
        if (id == CLI_POSITIONAL && (peak || strcmp(v.s, "peak")))
            return cli_fail(&BENCH_CMD,
                            "unexpected argument \"%s\" (the one "
                            "benchmark is peak)",
                            v.s);
        peak |= id == CLI_POSITIONAL;
    }
    if (!peak)
        return cli_fail(&BENCH_CMD, "which benchmark? tessera bench peak");
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

static const cli_opt PLOT_OPTS[] = {
    {1, "--out", CLI_STR, "FILE.svg", .help = "where the plot goes"},
    {0},
};

static const cli_cmd PLOT_CMD = {
    .name = "plot-loss",
    .usage = "plot-loss LOG.jsonl --out loss.svg",
    .about = "The training and validation loss of a train log as an SVG.",
    .opts = PLOT_OPTS,
    .positional = "  LOG.jsonl                   train's log (--out "
                  "DIR/log.jsonl)\n",
    .short_threads = true,
};

int tessera_plot_loss(int argc, char **argv) {
    const char *log = NULL, *out = NULL;
    cli_parser p;
    cli_val v;
    cli_begin(&p, &PLOT_CMD, argc, argv);
    for (int id; (id = cli_next(&p, &v)) != CLI_END;) {
        if (id == CLI_HELP)
            return cli_help(&PLOT_CMD, stdout), 0;
        if (id == CLI_ERROR)
            return 2;
        if (id == CLI_POSITIONAL && log)
            return cli_fail(&PLOT_CMD, "one log only (got %s and %s)", log,
                            v.s);
        *(id == CLI_POSITIONAL ? &log : &out) = v.s;
    }
    if (!log || !out)
        return cli_fail(&PLOT_CMD, "%s (see tessera plot-loss --help)",
                        !log ? "no LOG.jsonl" : "--out FILE.svg is required");
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
