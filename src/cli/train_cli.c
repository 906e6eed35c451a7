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

int tessera_prepare_data(int argc, char **argv) {
    ts_prepare_options o = {.val_fraction = 0.05, .shard_tokens = 1 << 26};
    const char **files = calloc((size_t)argc, sizeof *files);
    int nf = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (!strcmp(a, "-t") && v)
            o.tokenizer_dir = v, i++;
        else if (!strcmp(a, "--out") && v)
            o.out_dir = v, i++;
        else if (!strcmp(a, "--val-fraction") && v && num(v, 0, 0.99, &x))
            o.val_fraction = x, i++;
        else if (!strcmp(a, "--shard-tokens") && v && num(v, 1024, 1e12, &x))
            o.shard_tokens = (int64_t)x, i++;
        else if (a[0] != '-')
            files[nf++] = a;
        else {
            fprintf(stderr,
                    "tessera prepare-data: bad or incomplete option \"%s\"\n"
                    "usage: tessera prepare-data -t TOKENIZER_DIR --out DIR "
                    "[--val-fraction 0.05] FILES...\n",
                    a);
            free(files);
            return 2;
        }
    }
    if (!o.tokenizer_dir || !o.out_dir || !nf) {
        fprintf(stderr, "usage: tessera prepare-data -t TOKENIZER_DIR --out "
                        "DIR [--val-fraction 0.05] FILES...\n");
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
    "[--log-every 1] [--seed 1]\n"
    "         [--dtype f32|bf16] [--eager | --compile] "
    "[--checkpoint-activations] [--resume] "
    "[--quiet] [--peak-gflops G]\n"
    "         [--shard none|grad-opt|full] (under mpirun -np N: data "
    "parallel, ZeRO-2, or fully sharded)\n"
    "         [--bucket-mb 16] [--no-overlap] (data parallel: MiB per "
    "all-reduce; all-reduce after the backward, not during it)\n"
    "       tessera train --config FILE.json (the same keys, with "
    "underscores)\n";

/* one option by name (without the dashes, '-' or '_' alike); false when
 * unknown or out of range */
static bool train_opt(ts_train_options *o, const char *key, const char *v,
                      bool *used_value) {
    char k[64];
    snprintf(k, sizeof k, "%s", key);
    for (char *c = k; *c; c++)
        if (*c == '_')
            *c = '-';
    double x;
    *used_value = true;
    if (!strcmp(k, "model-config"))
        return v && (o->model_config = v);
    if (!strcmp(k, "init-from"))
        return v && (o->init_from = v);
    if (!strcmp(k, "data"))
        return v && (o->data_dir = v);
    if (!strcmp(k, "out"))
        return v && (o->out_dir = v);
    struct {
        const char *name;
        double lo, hi;
        int64_t *i;
        double *d;
    } nums[] = {{"batch", 1, 1 << 20, &o->batch, NULL},
                {"seq", 1, 1 << 20, &o->seq, NULL},
                {"grad-accum", 1, 64, &o->grad_accum, NULL},
                {"steps", 1, 1e12, &o->steps, NULL},
                {"warmup", 0, 1e12, &o->warmup, NULL},
                {"eval-every", 0, 1e12, &o->eval_every, NULL},
                {"eval-batches", 1, 1e6, &o->eval_batches, NULL},
                {"save-every", 0, 1e12, &o->save_every, NULL},
                {"log-every", 1, 1e12, &o->log_every, NULL},
                {"lr", 1e-12, 10, NULL, &o->lr},
                {"min-lr", 0, 10, NULL, &o->min_lr},
                {"weight-decay", 0, 10, NULL, &o->weight_decay},
                {"clip", 0, 1e9, NULL, &o->clip},
                {"beta1", 0, 0.999999, NULL, &o->beta1},
                {"beta2", 0, 0.999999, NULL, &o->beta2},
                {"bucket-mb", 1e-6, 1e6, NULL, &o->bucket_mb}};
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++)
        if (!strcmp(k, nums[i].name)) {
            if (!v || !num(v, nums[i].lo, nums[i].hi, &x))
                return false;
            if (nums[i].i)
                *nums[i].i = (int64_t)x;
            else
                *nums[i].d = x;
            return true;
        }
    if (!strcmp(k, "seed")) {
        if (!v || !num(v, 0, 9e15, &x))
            return false;
        o->seed = (uint64_t)x;
        return true;
    }
    if (!strcmp(k, "peak-gflops")) {
        if (!v || !num(v, 1e-3, 1e9, &x))
            return false;
        o->peak = x * 1e9;
        return true;
    }
    if (!strcmp(k, "schedule")) {
        if (!v || (strcmp(v, "cosine") && strcmp(v, "constant")))
            return false;
        o->constant_lr = !strcmp(v, "constant");
        return true;
    }
    if (!strcmp(k, "dtype")) {
        if (!v || (strcmp(v, "f32") && strcmp(v, "bf16")))
            return false;
        o->bf16 = !strcmp(v, "bf16");
        return true;
    }
    if (!strcmp(k, "shard")) {
        static const char *const modes[] = {"none", "grad-opt", "full"};
        for (int m = 0; v && m < 3; m++)
            if (!strcmp(v, modes[m])) {
                o->shard = m;
                return true;
            }
        return false;
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
        if (!strcmp(a, "--config") && v) {
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
                if (flag_ok
                        ? (json_is_true(val) && !train_opt(&o, key, NULL, &u))
                        : !train_opt(&o, key, sv, &u)) {
                    fprintf(stderr,
                            "tessera train: %s: bad key or value \"%s\"\n", v,
                            key);
                    json_decref(cfg);
                    return 2;
                }
            }
            i++;
            continue;
        }
        if (strncmp(a, "--", 2) || !train_opt(&o, a + 2, v, &used)) {
            fprintf(stderr,
                    "tessera train: bad or incomplete option \"%s\"\n%s", a,
                    TRAIN_USAGE);
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
        fprintf(stderr,
                "train: %lld steps, loss %.4f -> %.4f, %.0f tokens/s, MFU "
                "%.1f%%",
                (long long)r.steps_done, r.first_loss, r.last_loss,
                r.tokens_per_s, 100 * r.mfu);
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
    if (argc < 2 || strcmp(argv[1], "peak")) {
        fprintf(stderr, "usage: tessera bench peak [--fresh]\n");
        return 2;
    }
    bool fresh = argc > 2 && !strcmp(argv[2], "--fresh"), cached = false;
    ts_ctx *ctx = NULL; /* sets the thread count (TS_NUM_THREADS) */
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    double p = ts_peak_flops(fresh, &cached);
    printf("peak f32 matmul, %d thread(s): %.1f GFLOP/s (%s)\n",
           ts_get_num_threads(ctx), p / 1e9,
           cached ? "cached" : "measured now, cached");
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
        sx[n] = json_number_value(st), sy[n++] = json_number_value(lo);
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
