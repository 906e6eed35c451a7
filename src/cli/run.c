/* run.c — `tessera run` (generate text from a Hugging Face model folder,
 * streamed to stdout, speeds to stderr) and `tessera tokenize` (text to ids
 * as JSON, or ids back to text with --decode). */
#include "tessera.h"
#include "tessera_engine.h"
#include "tessera_models.h"
#include "tessera_tokenizer.h"

#include "cli/opts.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_STOPS 8
#define MAX_EOS   8

/* generation_config.json defaults, where it has them */
static void generation_defaults(ts_ctx *ctx, const char *dir, ts_sampling *s,
                                int64_t *eos, int *n_eos) {
    char *text = ts_model_file_text(ctx, dir, "generation_config.json");
    json_t *g = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    if (!g)
        return;
    json_t *v;
    if (json_is_true(json_object_get(g, "do_sample"))) {
        if ((v = json_object_get(g, "temperature")) && json_is_number(v))
            s->temperature = json_number_value(v);
        if ((v = json_object_get(g, "top_k")) && json_is_integer(v))
            s->top_k = json_integer_value(v);
        if ((v = json_object_get(g, "top_p")) && json_is_number(v))
            s->top_p = json_number_value(v);
        if ((v = json_object_get(g, "min_p")) && json_is_number(v))
            s->min_p = json_number_value(v);
    }
    if ((v = json_object_get(g, "repetition_penalty")) && json_is_number(v))
        s->repetition_penalty = json_number_value(v);
    v = json_object_get(g, "eos_token_id");
    if (json_is_integer(v) && *n_eos < MAX_EOS)
        eos[(*n_eos)++] = json_integer_value(v);
    size_t i;
    json_t *e;
    json_array_foreach(json_is_array(v) ? v : NULL, i,
                       e) if (json_is_integer(e) && *n_eos < MAX_EOS)
        eos[(*n_eos)++] = json_integer_value(e);
    json_decref(g);
}

static const char *g_cmd = "run"; /* run or chat, for messages */

/* Ctrl-C in a chat: set by the handler, read by the generation loop (the
 * reply stops) and by the prompt (the chat ends) */
static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static int fail(ts_ctx *ctx, const char *what) {
    fprintf(stderr, "tessera %s: %s: %s\n", g_cmd, what, ts_errmsg(ctx));
    return 1;
}

typedef struct {
    const char *dir, *prompt, *system, *device_map, *chat_template,
        *stops[MAX_STOPS];
    int n_stops, max_new;
    int64_t ctx_size;
    bool compiled, chat, interactive, verbose_prompt, no_check_weights,
        ignore_eos;
    ts_dtype wdt;
} run_opts;

/* A loaded model with its tokenizer, sampler and one KV cache whose
 * contents (cached[0..n_cached)) later prompts reuse as a prefix. */
typedef struct {
    ts_ctx *ctx;
    ts_lm *lm;
    ts_tokenizer *tok;
    ts_chat *chat; /* NULL: the model has no chat template */
    ts_sampler *sm;
    ts_lm_cache *kc;
    int64_t max_T;
    int32_t *cached;
    size_t n_cached;
    int64_t eos[MAX_EOS];
    int n_eos;
} session;

typedef struct {
    size_t n_prompt, n_reused;
    int generated;
    double prefill_s, decode_s;
} gen_stats;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Prompt ids through the model (reusing the cached prefix), then up to
 * max_new tokens streamed to stdout; the reply text (stop strings cut) in
 * *reply (malloc'd). */
static ts_status generate(session *S, const run_opts *o, const int32_t *ids,
                          size_t n_prompt, char **reply, gen_stats *gs) {
    ts_ctx *ctx = S->ctx;
    memset(gs, 0, sizeof *gs);
    *reply = NULL;
    gs->n_prompt = n_prompt;
    if (n_prompt == 0)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "the prompt is empty");
    if ((int64_t)n_prompt + 1 > S->max_T)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "the prompt (%zu tokens) does not fit the context "
                            "of %lld tokens (--ctx-size)",
                            n_prompt, (long long)S->max_T);
    size_t cap = n_prompt + (size_t)o->max_new;
    int32_t *seq = malloc(sizeof(int32_t) * cap);
    char *text = malloc(64 * ((size_t)o->max_new + 1) + 1);
    if (!seq || !text) {
        free(seq), free(text);
        return ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    }
    memcpy(seq, ids, sizeof(int32_t) * n_prompt);
    if (!S->kc && ts_lm_cache_new(S->lm, S->max_T, &S->kc) != TS_OK) {
        free(seq), free(text);
        return ts_ctx_status(ctx);
    }
    /* the longest cached prefix, leaving at least one token to run */
    size_t keep = 0;
    while (keep < S->n_cached && keep + 1 < n_prompt &&
           S->cached[keep] == ids[keep])
        keep++;
    ts_lm_cache_truncate(S->kc, (int64_t)keep);
    gs->n_reused = keep;
    size_t n = n_prompt, max_stop = 0, tl = 0, printed = 0;
    for (int k = 0; k < o->n_stops; k++)
        if (strlen(o->stops[k]) > max_stop)
            max_stop = strlen(o->stops[k]);
    ts_detok_state ds = {0};
    double t0 = now(), t_first = t0;
    bool stopped = false;
    ts_status st = TS_OK;
    size_t feed_from = keep;
    while (gs->generated < o->max_new && !stopped && st == TS_OK &&
           (int64_t)n < S->max_T && !g_interrupted) {
        int64_t T = (int64_t)(n - feed_from), shape[2] = {1, T};
        int64_t *buf = malloc(sizeof(int64_t) * (size_t)T);
        for (int64_t k = 0; buf && k < T; k++)
            buf[k] = seq[feed_from + (size_t)k];
        ts_tensor *in = buf ? ts_from_data(ctx, TS_I64, 2, shape, buf) : NULL;
        free(buf);
        ts_tensor *logits = ts_lm_forward_cached(S->lm, S->kc, in, true);
        ts_release(in);
        ts_tensor *hl = ts_to_device(logits, (ts_device){TS_DEVICE_CPU, 0});
        ts_release(logits);
        logits = hl; /* sampling is the host's */
        float *row = logits ? (float *)ts_tensor_data(logits) : NULL;
        if (!row) {
            st = ts_ctx_status(ctx);
            ts_release(logits);
            break;
        }
        int64_t V = ts_tensor_dim(logits, 2);
        int32_t next = ts_sampler_next(S->sm, row, V, seq, n);
        ts_release(logits);
        if (gs->generated == 0)
            t_first = now();
        feed_from = n;
        seq[n++] = next;
        gs->generated++;
        for (int k = 0; k < S->n_eos && !o->ignore_eos; k++)
            stopped |= next == S->eos[k];
        if (stopped)
            break;
        size_t pl = 0;
        if (ts_tokenizer_decode_step(S->tok, &ds, next, text + tl, 64, &pl) !=
            TS_OK) {
            st = ts_ctx_status(ctx);
            break;
        }
        tl += pl;
        text[tl] = 0;
        for (int k = 0; k < o->n_stops && !stopped; k++) {
            char *hit =
                strstr(text + (printed > max_stop ? printed - max_stop : 0),
                       o->stops[k]);
            if (hit)
                tl = (size_t)(hit - text), stopped = true;
        }
        /* print what can no longer turn into a stop string */
        size_t safe = stopped ? tl : tl > max_stop ? tl - max_stop : 0;
        if (o->n_stops == 0)
            safe = tl;
        if (safe > printed) {
            fwrite(text + printed, 1, safe - printed, stdout);
            fflush(stdout);
            printed = safe;
        }
    }
    /* what was held back for the stop strings, when an end token (or the
     * length) ended the reply; a stop string's cut printed all up to it */
    if (tl > printed)
        fwrite(text + printed, 1, tl - printed, stdout);
    fflush(stdout);
    double t1 = now();
    gs->prefill_s = t_first - t0;
    gs->decode_s = t1 - t_first;
    /* the cache now holds seq[0..n-1) (the last token was not run) */
    free(S->cached);
    S->cached = seq;
    S->n_cached = n ? n - 1 : 0;
    text[tl] = 0;
    *reply = text;
    return st;
}

static void print_stats(const gen_stats *g) {
    size_t run = g->n_prompt - g->n_reused;
    fprintf(stderr,
            "prompt: %zu tokens (%zu reused from the cache) in %.3f s (%.1f "
            "tokens/s); generation: %d tokens in %.3f s (%.1f tokens/s)\n",
            g->n_prompt, g->n_reused, g->prefill_s,
            g->prefill_s > 0 ? run / g->prefill_s : 0, g->generated - 1,
            g->decode_s,
            g->decode_s > 0 && g->generated > 1
                ? (g->generated - 1) / g->decode_s
                : 0);
}

/* the model's input for text: the chat template over messages (a JSON
 * array), or the text itself with the post-processor's special tokens */
static ts_status prompt_ids(session *S, const run_opts *o, json_t *messages,
                            const char *text, int32_t **ids, size_t *n) {
    char *rendered = NULL;
    size_t len = 0;
    bool templated = messages != NULL;
    if (templated) {
        char *mj = json_dumps(messages, JSON_COMPACT);
        ts_status s =
            mj ? ts_chat_apply(S->chat, mj, true, NULL, &rendered, &len)
               : ts_set_error(S->ctx, TS_ERR_OOM, "out of memory");
        free(mj);
        if (s != TS_OK)
            return s;
        text = rendered;
    } else
        len = strlen(text);
    ts_status s =
        ts_tokenizer_encode_text(S->tok, text, len, !templated, ids, n);
    if (s == TS_OK && o->verbose_prompt) {
        fprintf(stderr, "prompt text: ");
        fwrite(text, 1, len, stderr);
        fprintf(stderr, "\nprompt ids: [");
        for (size_t k = 0; k < *n; k++)
            fprintf(stderr, "%s%d", k ? ", " : "", (*ids)[k]);
        fprintf(stderr, "]\n");
    }
    free(rendered);
    return s;
}

static json_t *message(const char *role, const char *content) {
    return json_pack("{s:s, s:s}", "role", role, "content", content);
}

/* One prompt (-p): generate once. */
static int run_once(session *S, const run_opts *o) {
    json_t *msgs = NULL;
    if (o->chat) {
        msgs = json_array();
        if (o->system)
            json_array_append_new(msgs, message("system", o->system));
        json_array_append_new(msgs, message("user", o->prompt));
    }
    int32_t *ids = NULL;
    size_t n = 0;
    ts_status s = prompt_ids(S, o, msgs, o->prompt, &ids, &n);
    json_decref(msgs);
    if (s != TS_OK)
        return fail(S->ctx, "prompt");
    int64_t need = (int64_t)n + o->max_new;
    if (!o->ctx_size && need < S->max_T)
        S->max_T = need; /* a cache the size of this one generation */
    char *reply = NULL;
    gen_stats gs;
    s = generate(S, o, ids, n, &reply, &gs);
    free(ids), free(reply);
    printf("\n");
    fflush(stdout); /* the stats line on stderr comes after the text */
    if (s != TS_OK)
        return fail(S->ctx, "generation");
    print_stats(&gs);
    return 0;
}

/* Interactive chat: a line from stdin is a user turn; the conversation so
 * far is the prompt, whose cached prefix is reused turn after turn. Empty
 * lines are skipped; /reset starts over; /exit or end of input quits. */
static int run_chat(session *S, const run_opts *o) {
    bool tty = isatty(0);
    /* Ctrl-C stops a reply, not the chat; no SA_RESTART, so that at the
     * prompt it interrupts the read and ends the chat */
    struct sigaction sa = {.sa_handler = on_sigint};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    json_t *msgs = json_array();
    if (o->system)
        json_array_append_new(msgs, message("system", o->system));
    if (tty)
        fprintf(stderr,
                "chat with %s (/reset to start over, /exit or "
                "Ctrl-D to quit, Ctrl-C stops a reply)\n",
                o->dir);
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    for (;;) {
        if (tty)
            fprintf(stderr, "> ");
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0 || g_interrupted) { /* end of input, or Ctrl-C here */
            if (tty)
                fputc('\n', stderr);
            break;
        }
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = 0;
        if (!got)
            continue;
        if (!strcmp(line, "/exit"))
            break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(msgs);
            if (o->system)
                json_array_append_new(msgs, message("system", o->system));
            continue;
        }
        json_t *user = message("user", line);
        if (!user) {
            fprintf(stderr, "tessera %s: the input is not valid UTF-8\n",
                    g_cmd);
            continue;
        }
        json_array_append_new(msgs, user);
        int32_t *ids = NULL;
        size_t n = 0;
        char *reply = NULL;
        gen_stats gs;
        ts_status s;
        if (S->chat)
            s = prompt_ids(S, o, msgs, NULL, &ids, &n);
        else /* no template: the turns' text one after another */
            s = prompt_ids(S, o, NULL, line, &ids, &n);
        if (s == TS_OK)
            s = generate(S, o, ids, n, &reply, &gs);
        printf("\n");
        fflush(stdout); /* the stats line on stderr comes after the text */
        if (g_interrupted) {
            fprintf(stderr, "(stopped)\n");
            g_interrupted = 0;
        }
        free(ids);
        if (s != TS_OK) {
            /* a bad turn (too long, not encodable) is dropped; the chat
             * goes on */
            fail(S->ctx, "turn");
            ts_clear_error(S->ctx);
            json_array_remove(msgs, json_array_size(msgs) - 1);
            free(reply);
            rc = 1;
            continue;
        }
        json_array_append_new(msgs, message("assistant", reply ? reply : ""));
        free(reply);
        print_stats(&gs);
        rc = 0;
    }
    free(line);
    json_decref(msgs);
    return rc;
}

enum {
    R_MODEL = 1,
    R_PROMPT,
    R_N,
    R_TEMP,
    R_TOP_K,
    R_TOP_P,
    R_MIN_P,
    R_REP,
    R_SEED,
    R_STOP,
    R_DTYPE,
    R_DEVICE_MAP,
    R_SYSTEM,
    R_CTX,
    R_CHAT,
    R_INTERACTIVE,
    R_VERBOSE,
    R_NO_CHECK,
    R_COMPILE,
    R_EAGER,
    R_TEMPLATE,
    R_IGNORE_EOS,
};

/* run's options; chat takes the same but for the prompt and the modes */
static const cli_opt RUN_OPTS[] = {
    {R_MODEL, "-m, --model", CLI_STR, "DIR",
     .help = "the model folder (config.json, *.safetensors, tokenizer.json); "
             "also the first positional argument"},
    {R_PROMPT, "-p, --prompt", CLI_STR, "TEXT", .only = "run",
     .help = "generate once from TEXT (without it and with a terminal on "
             "stdin: an interactive chat)"},
    {R_N, "-n, --n-predict, --max-tokens", CLI_INT, "N", 1, 1e6, .def = "128",
     .help = "the most tokens to generate per reply"},
    {R_TEMP, "--temperature, --temp", CLI_NUM, "T", 0, 100,
     .def = "generation_config.json's, else 0 (greedy)",
     .help = "sampling temperature"},
    {R_TOP_K, "--top-k", CLI_INT, "K", 0, 1e9,
     .def = "generation_config.json's, else 0 (off)",
     .help = "sample among the K likeliest tokens"},
    {R_TOP_P, "--top-p", CLI_NUM, "P", 1e-9, 1,
     .def = "generation_config.json's, else 1 (off)",
     .want = "a number in (0, 1]",
     .help = "sample among the likeliest tokens holding P of the mass"},
    {R_MIN_P, "--min-p", CLI_NUM, "P", 0, 1,
     .def = "generation_config.json's, else 0 (off)",
     .help = "drop tokens less likely than P x the likeliest's"},
    {R_REP, "--repetition-penalty, --repeat-penalty", CLI_NUM, "R", 1e-3, 100,
     .want = "a number in 0.001..100",
     .def = "generation_config.json's, else 1 (off)",
     .help = "penalize tokens already seen (as Hugging Face's)"},
    {R_SEED, "-s, --seed", CLI_NUM, "S", 0, 1.8e19, .def = "0",
     .help = "the sampler's seed", .want = "a whole number >= 0"},
    {R_STOP, "--stop", CLI_STR, "STR",
     .help = "end the reply before STR (repeatable, at most 8)"},
    {R_IGNORE_EOS, "--ignore-eos", CLI_FLAG,
     .help = "go on past end-of-sequence tokens (up to -n or the context)"},
    {R_SYSTEM, "--system, --system-prompt", CLI_STR, "TEXT",
     .help = "a system message (implies the chat template)"},
    {R_CHAT, "--chat", CLI_FLAG, .only = "run",
     .help = "render -p with the model's chat template as one user message"},
    {R_INTERACTIVE, "-i, --interactive", CLI_FLAG, .only = "run",
     .help = "read user turns from stdin (a chat when the model has a "
             "template, plain text otherwise)"},
    {R_TEMPLATE, "--chat-template", CLI_STR, "FILE|NAME",
     .def = "the model's (tokenizer_config.json)",
     .help = "a Jinja chat template file or a built-in's name"},
    {R_CTX, "-c, --ctx-size, --max-model-len", CLI_INT, "N", 2, 1e7,
     .def = "4096 (capped by the model), or the prompt + -n for -p",
     .help = "the context (prompt + reply) in tokens"},
    {R_VERBOSE, "--verbose-prompt", CLI_FLAG,
     .help = "print the prompt's text and ids to stderr"},
    {R_DTYPE, "--dtype", CLI_CHOICE, .choices = "f32|bf16", .def = "f32",
     .help = "the weights' type in memory"},
    {R_DEVICE_MAP, "--device-map, --device", CLI_STR, "MAP", .def = "the CPU",
     .help = "a device (cpu, vulkan:0) or a split of the model over devices "
             "(embed,0:cpu:0;1,head:vulkan:0)"},
    {R_COMPILE, "--compile", CLI_FLAG,
     .help = "run the forward as a compiled graph"},
    {R_EAGER, "--eager", CLI_FLAG, .help = "run op by op (the default)"},
    {R_NO_CHECK, "--no-check-weights", CLI_FLAG,
     .help = "load without scanning the weights for NaN/Inf"},
    {0},
};

static const cli_cmd RUN_CMD = {
    .name = "run",
    .usage = "run [-m] DIR -p TEXT [options]",
    .about =
        "Generates text from a Hugging Face model folder: the text to stdout, "
        "the speeds to stderr on a line of their own. Without -p and with a "
        "terminal on stdin: an interactive chat (see tessera chat).",
    .opts = RUN_OPTS,
    .positional = "  DIR                         the model folder (as -m)\n",
    .short_threads = true,
};

static const cli_cmd CHAT_CMD = {
    .name = "chat",
    .usage = "chat [-m] DIR [--system TEXT] [options]",
    .about = "An interactive chat in the terminal: each line you type is a "
             "user turn; the conversation so far goes through the model's chat "
             "template; the reply streams as it is made. /reset starts over, "
             "/exit or Ctrl-D quits; Ctrl-C stops a reply (what came so far "
             "stays in the history) and at the prompt quits. The speeds go to "
             "stderr on a line of their own.",
    .opts = RUN_OPTS,
    .positional = "  DIR                         the model folder (as -m)\n",
    .short_threads = true,
};

/* argv onto o and the sampling options the command line gave (set[]);
 * returns -1 to go on, else the exit code */
static int parse_run(const cli_cmd *c, int argc, char **argv, run_opts *o,
                     ts_sampling *cli, bool set[6]) {
    cli_parser p;
    cli_val v;
    cli_begin(&p, c, argc, argv);
    for (int id; (id = cli_next(&p, &v)) != CLI_END;) {
        switch (id) {
        case CLI_HELP:
            cli_help(c, stdout);
            return 0;
        case CLI_ERROR:
            return 2;
        case CLI_POSITIONAL:
            if (o->dir)
                return cli_fail(c,
                                "unexpected argument \"%s\" (the model "
                                "is %s; the prompt is -p TEXT)",
                                v.s, o->dir);
            o->dir = v.s;
            break;
        case R_MODEL:
            o->dir = v.s;
            break;
        case R_PROMPT:
            o->prompt = v.s;
            break;
        case R_N:
            o->max_new = (int)v.i;
            break;
        case R_TEMP:
            cli->temperature = v.num, set[0] = 1;
            break;
        case R_TOP_K:
            cli->top_k = v.i, set[1] = 1;
            break;
        case R_TOP_P:
            cli->top_p = v.num, set[2] = 1;
            break;
        case R_MIN_P:
            cli->min_p = v.num, set[3] = 1;
            break;
        case R_REP:
            cli->repetition_penalty = v.num, set[4] = 1;
            break;
        case R_SEED:
            cli->seed = (uint64_t)v.num, set[5] = 1;
            break;
        case R_STOP:
            if (o->n_stops == MAX_STOPS)
                return cli_fail(c, "at most %d --stop strings", MAX_STOPS);
            o->stops[o->n_stops++] = v.s;
            break;
        case R_IGNORE_EOS:
            o->ignore_eos = true;
            break;
        case R_DTYPE:
            o->wdt = v.choice ? TS_BF16 : TS_F32;
            break;
        case R_DEVICE_MAP:
            o->device_map = v.s;
            break;
        case R_SYSTEM:
            o->system = v.s, o->chat = true;
            break;
        case R_TEMPLATE:
            o->chat_template = v.s, o->chat = true;
            break;
        case R_CTX:
            o->ctx_size = v.i;
            break;
        case R_CHAT:
            o->chat = true;
            break;
        case R_INTERACTIVE:
            o->interactive = true;
            break;
        case R_VERBOSE:
            o->verbose_prompt = true;
            break;
        case R_NO_CHECK:
            o->no_check_weights = true;
            break;
        case R_COMPILE:
            o->compiled = true;
            break;
        case R_EAGER:
            o->compiled = false;
            break;
        }
    }
    if (c == &CHAT_CMD)
        o->chat = o->interactive = true;
    if (!o->prompt && !o->interactive && isatty(0))
        o->interactive = true;
    if (!o->dir)
        return cli_fail(c,
                        "no model: give its folder (-m DIR or DIR; see "
                        "tessera %s --help)",
                        c->name);
    if (!o->prompt && !o->interactive)
        return cli_fail(c, "no prompt: give -p TEXT, or -i to read turns "
                           "from stdin (see tessera run --help)");
    return -1;
}

static int run_command(const cli_cmd *c, int argc, char **argv) {
    run_opts o = {.max_new = 128, .wdt = TS_F32};
    ts_sampling cli = ts_sampling_default();
    bool set[6] = {0}; /* which sampling options the command line gave */
    int parsed = parse_run(c, argc, argv, &o, &cli, set);
    if (parsed >= 0)
        return parsed;
    g_cmd = c->name;
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    /* the folder first: one error naming everything it lacks */
    if (ts_model_dir_check(ctx, o.dir, TS_MODEL_ALL) != TS_OK) {
        fprintf(stderr, "tessera %s: -m takes a model folder: %s\n", g_cmd,
                ts_errmsg(ctx));
        ts_ctx_free(ctx);
        return 1;
    }
    session S = {.ctx = ctx};
    /* defaults from generation_config.json, then the command line */
    ts_sampling s = ts_sampling_default();
    generation_defaults(ctx, o.dir, &s, S.eos, &S.n_eos);
    if (set[0])
        s.temperature = cli.temperature;
    if (set[1])
        s.top_k = cli.top_k;
    if (set[2])
        s.top_p = cli.top_p;
    if (set[3])
        s.min_p = cli.min_p;
    if (set[4])
        s.repetition_penalty = cli.repetition_penalty;
    if (set[5])
        s.seed = cli.seed;
    int rc = 1;
    ts_load_options lo = {.weight_dtype = o.wdt,
                          .device_map = o.device_map,
                          .no_check_weights = o.no_check_weights};
    if (ts_lm_load(ctx, o.dir, &lo, &S.lm) != TS_OK) {
        fail(ctx, "model");
        goto done;
    }
    const ts_model_config *mc = ts_lm_config(S.lm);
    if (!S.n_eos && mc->eos_token_id >= 0)
        S.eos[S.n_eos++] = mc->eos_token_id;
    if (ts_tokenizer_load(ctx, o.dir, &S.tok) != TS_OK ||
        ts_tokenizer_check_vocab(ctx, S.tok, mc->vocab) != TS_OK) {
        fail(ctx, "tokenizer");
        goto done;
    }
    if (o.chat || o.interactive) {
        ts_status cs =
            o.chat_template
                ? ts_chat_load_with(ctx, o.dir, o.chat_template, &S.chat)
                : ts_chat_load(ctx, o.dir, &S.chat);
        if (cs != TS_OK) {
            if (o.chat) { /* asked for a chat format the model lacks */
                fail(ctx,
                     o.chat_template ? "--chat-template" : "chat template");
                goto done;
            }
            ts_clear_error(ctx); /* interactive without one: plain text */
        }
        /* a template's end-of-turn token ends the reply */
        const char *eot = S.chat ? ts_chat_eos_token(S.chat) : "";
        int32_t id = *eot ? ts_tokenizer_token_id(S.tok, eot) : -1;
        if (id >= 0 && S.n_eos < MAX_EOS)
            S.eos[S.n_eos++] = id;
    }
    if (ts_sampler_new(ctx, &s, &S.sm) != TS_OK) {
        fail(ctx, "sampling");
        goto done;
    }
    S.max_T = o.ctx_size ? o.ctx_size : 4096; /* one prompt: sized to it */
    if (S.max_T > mc->max_positions)
        S.max_T = mc->max_positions;
    ts_set_grad_enabled(ctx, false);
    if (o.compiled)
        ts_set_mode(ctx, TS_MODE_COMPILED);
    rc = o.prompt && !o.interactive ? run_once(&S, &o) : run_chat(&S, &o);
done:
    free(S.cached);
    ts_lm_cache_free(S.kc);
    ts_sampler_free(S.sm);
    ts_chat_free(S.chat);
    ts_lm_free(S.lm);
    ts_tokenizer_free(S.tok);
    ts_ctx_free(ctx);
    return rc;
}

int tessera_run(int argc, char **argv) {
    return run_command(&RUN_CMD, argc, argv);
}

int tessera_chat(int argc, char **argv) {
    return run_command(&CHAT_CMD, argc, argv);
}

enum { T_MODEL = 1, T_DECODE };

static const cli_opt TOKENIZE_OPTS[] = {
    {T_MODEL, "-m, --model", CLI_STR, "DIR",
     .help = "the model folder (or a tokenizer.json)"},
    {T_DECODE, "--decode", CLI_FLAG,
     .help = "IDS back to text; IDS as 1,2,3 or as the JSON array tokenize "
             "prints ([1, 2, 3])"},
    {0},
};

static const cli_cmd TOKENIZE_CMD = {
    .name = "tokenize",
    .usage = "tokenize -m DIR TEXT | tokenize -m DIR --decode IDS",
    .about = "The model's tokenizer: TEXT to a JSON array of ids (with the "
             "post-processor's special tokens), or ids back to text.",
    .opts = TOKENIZE_OPTS,
    .positional = "  TEXT | IDS                  the text to encode, or the "
                  "ids to decode\n",
    .short_threads = true,
};

/* "1,2,3", "[1, 2, 3]" or "1 2 3" into ids; false when it is none */
static bool parse_ids(const char *arg, int32_t *ids, size_t cap, size_t *n) {
    const char *p = arg + strspn(arg, " \t\n");
    bool bracket = *p == '[';
    p += bracket;
    *n = 0;
    for (;;) {
        p += strspn(p, " \t\n");
        if (bracket && *p == ']' && !p[1 + strspn(p + 1, " \t\n")])
            return true;
        if (!*p)
            return !bracket && *n > 0;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || *n == cap)
            return false;
        ids[(*n)++] = (int32_t)v;
        p = end + strspn(end, " \t\n");
        if (*p == ',')
            p++;
        else if (*p && *p != ']' && end == p)
            return false;
    }
}

int tessera_tokenize(int argc, char **argv) {
    const char *dir = NULL, *arg = NULL;
    bool decode = false;
    const cli_cmd *c = &TOKENIZE_CMD;
    cli_parser p;
    cli_val v;
    cli_begin(&p, c, argc, argv);
    for (int id; (id = cli_next(&p, &v)) != CLI_END;) {
        if (id == CLI_HELP)
            return cli_help(c, stdout), 0;
        if (id == CLI_ERROR)
            return 2;
        if (id == T_MODEL)
            dir = v.s;
        else if (id == T_DECODE)
            decode = true;
        else if (arg)
            return cli_fail(c,
                            "one TEXT only (got \"%s\" and \"%s\"; "
                            "quote text with spaces)",
                            arg, v.s);
        else
            arg = v.s;
    }
    if (!dir || !arg)
        return cli_fail(c, "%s (see tessera tokenize --help)",
                        !dir ? "no model: give -m DIR" : "no TEXT or IDS");
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    /* a tokenizer.json is taken as it is; anything else must be a folder
     * holding one */
    struct stat sb;
    bool file = stat(dir, &sb) == 0 && S_ISREG(sb.st_mode);
    if ((!file || ts_file_is_gguf(dir)) &&
        ts_model_dir_check(ctx, dir, TS_MODEL_TOKENIZER) != TS_OK) {
        fprintf(stderr, "tessera tokenize: -m takes a model folder: %s\n",
                ts_errmsg(ctx));
        ts_ctx_free(ctx);
        return 1;
    }
    ts_tokenizer *tok;
    if (ts_tokenizer_load(ctx, dir, &tok) != TS_OK) {
        fprintf(stderr, "tessera tokenize: %s\n", ts_errmsg(ctx));
        ts_ctx_free(ctx);
        return 1;
    }
    int rc = 0;
    if (!decode) {
        int32_t *ids;
        size_t n;
        /* with the post-processor's special tokens, as encode() */
        if (ts_tokenizer_encode_text(tok, arg, strlen(arg), true, &ids, &n) !=
            TS_OK) {
            fprintf(stderr, "tessera tokenize: %s\n", ts_errmsg(ctx));
            rc = 1;
        } else {
            printf("[");
            for (size_t i = 0; i < n; i++)
                printf("%s%d", i ? ", " : "", ids[i]);
            printf("]\n");
            free(ids);
        }
    } else {
        static int32_t ids[65536];
        size_t n = 0;
        if (!parse_ids(arg, ids, 65536, &n)) {
            fprintf(stderr,
                    "tessera tokenize: --decode wants ids as 1,2,3 or "
                    "[1, 2, 3] (at most 65536); got \"%s\"\n",
                    arg);
            rc = 2;
        }
        char *text;
        size_t len;
        if (rc == 0 &&
            ts_tokenizer_decode(tok, ids, n, false, &text, &len) != TS_OK) {
            fprintf(stderr, "tessera tokenize: %s\n", ts_errmsg(ctx));
            rc = 1;
        } else if (rc == 0) {
            fwrite(text, 1, len, stdout);
            printf("\n");
            free(text);
        }
    }
    ts_tokenizer_free(tok);
    ts_ctx_free(ctx);
    return rc;
}
