/* run.c — `tessera run` (generate text from a Hugging Face model folder,
 * streamed to stdout, speeds to stderr) and `tessera tokenize` (text to ids
 * as JSON, or ids back to text with --decode). */
#include "tessera.h"
#include "tessera_engine.h"
#include "tessera_models.h"
#include "tessera_tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STOPS 8
#define MAX_EOS   8

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int usage(void) {
    fprintf(stderr, "usage: tessera run -m DIR -p TEXT [-n MAX_TOKENS] "
                    "[--temperature T] [--top-k K]\n"
                    "                   [--top-p P] [--min-p P] "
                    "[--repetition-penalty R] [--seed S]\n"
                    "                   [--stop STR]... [--dtype f32|bf16] "
                    "[--eager|--compile]\n");
    return 2;
}

static bool parse_num(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

/* generation_config.json defaults, where it has them */
static void generation_defaults(const char *dir, ts_sampling *s, int64_t *eos,
                                int *n_eos) {
    char p[4096];
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    json_t *g = json_load_file(p, 0, NULL);
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

static int fail(ts_ctx *ctx, const char *what) {
    fprintf(stderr, "tessera run: %s: %s\n", what, ts_errmsg(ctx));
    return 1;
}

int tessera_run(int argc, char **argv) {
    const char *dir = NULL, *prompt = NULL, *stops[MAX_STOPS];
    int n_stops = 0, max_new = 128;
    bool compiled = false;
    ts_dtype wdt = TS_F32;
    ts_sampling cli = ts_sampling_default();
    bool set[6] = {0}; /* which sampling options the command line gave */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        if (!strcmp(a, "-m") && v)
            dir = v, i++;
        else if (!strcmp(a, "-p") && v)
            prompt = v, i++;
        else if (!strcmp(a, "-n") && v && parse_num(v, 1, 1e6, &d))
            max_new = (int)d, i++;
        else if (!strcmp(a, "--temperature") && v && parse_num(v, 0, 100, &d))
            cli.temperature = d, set[0] = 1, i++;
        else if (!strcmp(a, "--top-k") && v && parse_num(v, 0, 1e9, &d))
            cli.top_k = (int64_t)d, set[1] = 1, i++;
        else if (!strcmp(a, "--top-p") && v && parse_num(v, 1e-9, 1, &d))
            cli.top_p = d, set[2] = 1, i++;
        else if (!strcmp(a, "--min-p") && v && parse_num(v, 0, 1, &d))
            cli.min_p = d, set[3] = 1, i++;
        else if (!strcmp(a, "--repetition-penalty") && v &&
                 parse_num(v, 1e-3, 100, &d))
            cli.repetition_penalty = d, set[4] = 1, i++;
        else if (!strcmp(a, "--seed") && v && parse_num(v, 0, 1.8e19, &d))
            cli.seed = (uint64_t)d, set[5] = 1, i++;
        else if (!strcmp(a, "--stop") && v && n_stops < MAX_STOPS && *v)
            stops[n_stops++] = v, i++;
        else if (!strcmp(a, "--dtype") && v &&
                 (!strcmp(v, "f32") || !strcmp(v, "bf16")))
            wdt = strcmp(v, "bf16") ? TS_F32 : TS_BF16, i++;
        else if (!strcmp(a, "--compile"))
            compiled = true;
        else if (!strcmp(a, "--eager"))
            compiled = false;
        else {
            fprintf(stderr, "tessera run: bad or incomplete option \"%s\"\n",
                    a);
            return usage();
        }
    }
    if (!dir || !prompt)
        return usage();
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    /* defaults from generation_config.json, then the command line */
    ts_sampling s = ts_sampling_default();
    int64_t eos[MAX_EOS];
    int n_eos = 0;
    generation_defaults(dir, &s, eos, &n_eos);
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
    ts_model_config mc;
    if (ts_config_load(ctx, dir, &mc) != TS_OK) {
        fail(ctx, "config");
        ts_ctx_free(ctx);
        return 1;
    }
    if (!n_eos && mc.eos_token_id >= 0)
        eos[n_eos++] = mc.eos_token_id;
    ts_tokenizer *tok = NULL;
    ts_qwen3_model *m = NULL;
    ts_sampler *sm = NULL;
    int rc = 1;
    if (ts_tokenizer_load(ctx, dir, &tok) != TS_OK) {
        fail(ctx, "tokenizer");
        goto done;
    }
    if (ts_decoder_load_as(ctx, dir, wdt, &m) != TS_OK) {
        fail(ctx, "model");
        goto done;
    }
    if (ts_sampler_new(ctx, &s, &sm) != TS_OK) {
        fail(ctx, "sampling");
        goto done;
    }
    int32_t *ids = NULL;
    size_t n_prompt = 0;
    if (ts_tokenizer_encode(tok, prompt, strlen(prompt), true, &ids,
                            &n_prompt) != TS_OK) {
        fail(ctx, "prompt");
        goto done;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "tessera run: the prompt is empty\n");
        free(ids);
        goto done;
    }
    int32_t *seq = realloc(ids, sizeof(int32_t) * (n_prompt + (size_t)max_new));
    if (!seq) {
        free(ids);
        goto done;
    }
    ts_qwen3_cache *kc = NULL;
    if (ts_qwen3_cache_new(m, 1, (int64_t)n_prompt + max_new, &kc) != TS_OK) {
        free(seq);
        fail(ctx, "cache");
        goto done;
    }
    ts_set_grad_enabled(ctx, false);
    if (compiled)
        ts_set_mode(ctx, TS_MODE_COMPILED);
    size_t n = n_prompt, max_stop = 0;
    for (int k = 0; k < n_stops; k++)
        if (strlen(stops[k]) > max_stop)
            max_stop = strlen(stops[k]);
    char *text =
        malloc(64 * ((size_t)max_new + 1) + 1); /* generated text so far */
    size_t tl = 0, printed = 0;
    ts_detok_state ds = {0};
    double t0 = now(), t_first = 0;
    int generated = 0;
    bool stopped = false;
    int64_t T_in = (int64_t)n_prompt;
    ts_status st = TS_OK;
    while (generated < max_new && !stopped && st == TS_OK) {
        int64_t shape[2] = {1, T_in};
        int64_t in64[4096];
        int64_t cnt = T_in;
        int64_t *buf =
            cnt <= 4096 ? in64 : malloc(sizeof(int64_t) * (size_t)cnt);
        for (int64_t k = 0; k < cnt; k++)
            buf[k] = seq[n - (size_t)cnt + (size_t)k];
        ts_tensor *in = ts_from_data(ctx, TS_I64, 2, shape, buf);
        if (buf != in64)
            free(buf);
        ts_tensor *logits = ts_qwen3_forward_cached_last(m, kc, in);
        ts_release(in);
        float *row = logits ? (float *)ts_tensor_data(logits) : NULL;
        if (!row) {
            st = ts_ctx_status(ctx);
            ts_release(logits);
            break;
        }
        int64_t V = ts_tensor_dim(logits, 2);
        int32_t next = ts_sampler_next(sm, row, V, seq, n);
        ts_release(logits);
        if (generated == 0)
            t_first = now();
        seq[n++] = next;
        generated++;
        T_in = 1;
        for (int k = 0; k < n_eos; k++)
            stopped |= next == eos[k];
        if (stopped)
            break;
        size_t pl = 0;
        if (ts_tokenizer_decode_step(tok, &ds, next, text + tl, 64, &pl) !=
            TS_OK) {
            st = ts_ctx_status(ctx);
            break;
        }
        tl += pl;
        text[tl] = 0;
        for (int k = 0; k < n_stops && !stopped; k++) {
            char *hit = strstr(
                text + (printed > max_stop ? printed - max_stop : 0), stops[k]);
            if (hit)
                tl = (size_t)(hit - text), stopped = true;
        }
        /* print what can no longer turn into a stop string */
        size_t safe = stopped ? tl : tl > max_stop ? tl - max_stop : 0;
        if (n_stops == 0)
            safe = tl;
        if (safe > printed) {
            fwrite(text + printed, 1, safe - printed, stdout);
            fflush(stdout);
            printed = safe;
        }
    }
    if (!stopped && tl > printed)
        fwrite(text + printed, 1, tl - printed, stdout);
    printf("\n");
    double t1 = now();
    if (st != TS_OK) {
        fail(ctx, "generation");
    } else {
        double pre = t_first - t0, gen = t1 - t_first;
        fprintf(stderr,
                "prompt: %zu tokens in %.3f s (%.1f tokens/s); generation: %d "
                "tokens in "
                "%.3f s (%.1f tokens/s)\n",
                n_prompt, pre, pre > 0 ? n_prompt / pre : 0, generated - 1, gen,
                gen > 0 && generated > 1 ? (generated - 1) / gen : 0);
        rc = 0;
    }
    free(text), free(seq);
    ts_qwen3_cache_free(kc);
done:
    ts_sampler_free(sm);
    ts_qwen3_free(m);
    ts_tokenizer_free(tok);
    ts_ctx_free(ctx);
    return rc;
}

int tessera_tokenize(int argc, char **argv) {
    const char *dir = NULL, *arg = NULL;
    bool decode = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--decode"))
            decode = true;
        else if (!arg)
            arg = argv[i];
        else
            arg = NULL, i = argc;
    }
    if (!dir || !arg) {
        fprintf(stderr, "usage: tessera tokenize -m DIR TEXT | tessera "
                        "tokenize -m DIR --decode 1,2,3\n");
        return 2;
    }
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
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
        if (ts_tokenizer_encode(tok, arg, strlen(arg), true, &ids, &n) !=
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
        int32_t ids[4096];
        size_t n = 0;
        for (const char *p = arg; *p && rc == 0;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || n == 4096 || (*end && *end != ',')) {
                fprintf(stderr,
                        "tessera tokenize: --decode wants comma-separated ids; "
                        "got \"%s\"\n",
                        arg);
                rc = 2;
                break;
            }
            ids[n++] = (int32_t)v;
            p = *end ? end + 1 : end;
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
