/* test_compat.c — the compatibility matrix: every causal-LM family through
 * the one decoder (ts_decoder_*), checked against the PyTorch reference of
 * tests/compat/ref_models.py on the models make_models.py writes. For each
 * case and check one JSON line goes to DIR/results.jsonl:
 *   {"case", "family", "check", "pass", "error", "bound", "note"}
 * and the test fails if any check fails. The checks (error: what is
 * measured; relative errors are max |got - want| / max |want|):
 *   logits_f32         f32 weights vs the reference: relative, <= 1e-4
 *   logits_bf16        bf16 matrices (weight_dtype TS_BF16) vs the
 *                      reference with the same matrices rounded to bf16,
 *                      f32 math: relative, <= 2e-3 (see BF16_BOUND)
 *   eager_vs_compiled  compiled-mode logits vs eager: relative, <= 1e-6
 *   split_2dev         layers split over cpu:0 and cpu:1 vs one device:
 *                      max |diff|, must be 0 (the same kernels, the same
 *                      order)
 *   engine_greedy      16 greedy tokens after an 8-token prompt from the
 *                      serving engine, from ts_decoder_generate_greedy (KV
 *                      cache) and from the reference (full recompute): the
 *                      number of positions where they differ, must be 0
 *   train_5            5 AdamW steps (lr 1e-3, betas 0.9/0.999, eps 1e-8,
 *                      wd 0.01) on every parameter: the loss before each
 *                      step (cross-entropy, + coef x load-balancing loss
 *                      for MoE) vs torch's: relative, <= 1e-4 each
 *   save_reload        ts_decoder_save, reload: the checkpoint's tensor
 *                      names and shapes as the original's, and the logits
 *                      bit-identical (max |diff| = 0)
 * argv: DIR (make_models.py's OUT) [DEVICE]. With a DEVICE (vulkan:0) the
 * same checks run with every model there (results in
 * DIR/results-DEVICE.jsonl, ':' as '_'), split_2dev splits it between
 * DEVICE and cpu:0 and compares with DEVICE alone to 1e-4 (other kernels
 * on each side); exit 77 (skipped) when the machine lacks DEVICE. */
#include "tessera_engine.h"
#include "tessera_models.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_TOK   64
#define MAX_STEPS 8

/* bf16 keeps 8 significant bits: one rounding moves a value by up to
 * 2^-9 = 1.95e-3 of itself. Rounding all the matrices moves these models'
 * logits by 4.8e-3..5e-2 of their largest (bf16_shift in each case's
 * .json), while the same rounded values in f32 math on both sides differ
 * by summation order only (~1e-6). 2e-3 sits between: it passes any
 * correct f32 evaluation of the bf16 weights, and fails a run that does not
 * round the matrices, or rounds more than them (activations, norms). */
#define BF16_BOUND 2e-3
/* At the AVX512_BF16 level a product of more than 32 rows against bf16
 * matrices is a bf16 GEMM: its activations are rounded to bf16 too (as
 * PyTorch's bf16 autocast and llama.cpp do), which moves the logits about
 * as much as rounding the matrices does (0.7-1.1x bf16_shift measured):
 * there the bound is 1.5 bf16_shift, still failing a run that rounds
 * norms or keeps the matrices in f32 (errors of 0 or several shifts). */
#define BF16_GEMM_SHIFTS 1.5
static bool bf16_gemm_level(void) {
    return !strcmp(ts_cpu_isa(), "avx512_bf16") || !strcmp(ts_cpu_isa(), "amx");
}

static const char *DIR_;
static const char *DEVICE;  /* NULL: the host */
static char DEV_SUFFIX[32]; /* "" or "-vulkan_0" */
static FILE *RESULTS;

typedef struct {
    char name[64], family[32];
    int64_t B, T, V, layers;
    int64_t prompt[MAX_TOK], greedy[MAX_TOK];
    int n_prompt, n_greedy;
    double losses[MAX_STEPS], lr, beta1, beta2, eps, wd;
    int n_losses;
    double bf16_shift;
    int64_t *ids, *targets;      /* (B, T) */
    float *logits, *logits_bf16; /* (B, T, V) */
} ref_case;

/* ---- reading make_models.py's files ------------------------------------- */

/* the value after "key": in a flat JSON object (no nesting that repeats
 * the key), or NULL */
static const char *json_at(const char *js, const char *key) {
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(js, pat);
    if (!p)
        return NULL;
    p += strlen(pat);
    while (*p == ' ' || *p == '\n')
        p++;
    return p;
}

static bool json_num(const char *js, const char *key, double *out) {
    const char *p = json_at(js, key);
    if (!p)
        return false;
    char *end;
    *out = strtod(p, &end);
    return end != p;
}

/* a list of numbers; the count, or -1 */
static int json_nums(const char *js, const char *key, double *out, int max) {
    const char *p = json_at(js, key);
    if (!p || *p != '[')
        return -1;
    p++;
    int n = 0;
    for (;;) {
        while (*p == ' ' || *p == '\n' || *p == ',')
            p++;
        if (*p == ']')
            return n;
        char *end;
        double v = strtod(p, &end);
        if (end == p || n >= max)
            return -1;
        out[n++] = v;
        p = end;
    }
}

static void *read_raw(const char *name, const char *ext, size_t want) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.%s", DIR_, name, ext);
    size_t n = 0;
    char *buf = tu_read_file(path, &n);
    if (buf && n != want) {
        fprintf(stderr, "%s: %zu bytes, expected %zu\n", path, n, want);
        free(buf);
        return NULL;
    }
    if (!buf)
        fprintf(stderr, "cannot read %s\n", path);
    return buf;
}

static bool load_case(ref_case *c) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.json", DIR_, c->name);
    char *js = tu_read_file(path, NULL);
    if (!js) {
        fprintf(stderr, "cannot read %s\n", path);
        return false;
    }
    double v[MAX_TOK], B = 0, T = 0, V = 0, L = 0, betas[2] = {0, 0};
    bool ok = json_num(js, "B", &B) && json_num(js, "T", &T) &&
              json_num(js, "V", &V) && json_num(js, "layers", &L) &&
              json_num(js, "train_lr", &c->lr) &&
              json_num(js, "train_eps", &c->eps) &&
              json_num(js, "train_weight_decay", &c->wd) &&
              json_nums(js, "train_betas", betas, 2) == 2 &&
              json_num(js, "bf16_shift", &c->bf16_shift);
    c->B = (int64_t)B, c->T = (int64_t)T, c->V = (int64_t)V;
    c->layers = (int64_t)L, c->beta1 = betas[0], c->beta2 = betas[1];
    c->n_prompt = json_nums(js, "prompt", v, MAX_TOK);
    for (int i = 0; i < c->n_prompt; i++)
        c->prompt[i] = (int64_t)v[i];
    c->n_greedy = json_nums(js, "greedy", v, MAX_TOK);
    for (int i = 0; i < c->n_greedy; i++)
        c->greedy[i] = (int64_t)v[i];
    c->n_losses = json_nums(js, "train_losses", c->losses, MAX_STEPS);
    free(js);
    if (!ok || c->n_prompt <= 0 || c->n_greedy <= 0 || c->n_losses <= 0) {
        fprintf(stderr, "%s: a field is missing\n", path);
        return false;
    }
    size_t bt = (size_t)(c->B * c->T), btv = bt * (size_t)c->V;
    c->ids = read_raw(c->name, "ids", bt * 8);
    c->targets = read_raw(c->name, "targets", bt * 8);
    c->logits = read_raw(c->name, "logits", btv * 4);
    c->logits_bf16 = read_raw(c->name, "logits_bf16", btv * 4);
    return c->ids && c->targets && c->logits && c->logits_bf16;
}

static void free_case(ref_case *c) {
    free(c->ids), free(c->targets), free(c->logits), free(c->logits_bf16);
}

/* ---- results ------------------------------------------------------------ */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", (unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

/* one line of results.jsonl; a failed check fails the test */
static void record(const ref_case *c, const char *check, bool pass, double err,
                   double bound, const char *note) {
    ts_test_checks++;
    if (!pass) {
        ts_test_failures++;
        fprintf(stderr, "FAIL %s %s: error %.3g (bound %.3g) %s\n", c->name,
                check, err, bound, note ? note : "");
    }
    fprintf(RESULTS, "{\"case\": ");
    json_str(RESULTS, c->name);
    fprintf(RESULTS, ", \"family\": ");
    json_str(RESULTS, c->family);
    fprintf(RESULTS, ", \"check\": ");
    json_str(RESULTS, check);
    fprintf(RESULTS, ", \"pass\": %s, \"error\": ", pass ? "true" : "false");
    if (isfinite(err))
        fprintf(RESULTS, "%.6g", err);
    else
        fprintf(RESULTS, "null");
    fprintf(RESULTS, ", \"bound\": %.6g, \"note\": ", bound);
    json_str(RESULTS, note ? note : "");
    fprintf(RESULTS, "}\n");
    fflush(RESULTS);
}

/* a failure before anything was measured: the error message says why */
static void record_error(ts_ctx *ctx, const ref_case *c, const char *check,
                         double bound, const char *what) {
    char note[1024];
    snprintf(note, sizeof note, "%s: %s", what,
             ts_ctx_status(ctx) != TS_OK ? ts_errmsg(ctx) : "no result");
    record(c, check, false, NAN, bound, note);
    ts_clear_error(ctx);
}

/* ---- helpers ------------------------------------------------------------ */

/* max |a - b| / max |b|, or max |a - b| when scale is false */
static double diff(const float *a, const float *b, size_t n, bool scale) {
    double worst = 0, top = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= worst)) /* NaN counts as the worst */
            worst = isnan(d) ? INFINITY : d;
        if (fabs((double)b[i]) > top)
            top = fabs((double)b[i]);
    }
    return scale ? worst / (top > 0 ? top : 1) : worst;
}

static ts_decoder *load(ts_ctx *ctx, const char *dir, ts_dtype wdt,
                        const char *map) {
    ts_load_options o = {.weight_dtype = wdt, .device_map = map ? map : DEVICE};
    ts_decoder *m = NULL;
    if (ts_decoder_load_opts(ctx, dir, &o, &m) != TS_OK)
        return NULL;
    return m;
}

/* forward of the case's ids: a malloc'd (B, T, V) copy, or NULL */
static float *logits_of(ts_ctx *ctx, ts_decoder *m, const ref_case *c) {
    int64_t shape[2] = {c->B, c->T};
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, c->ids);
    bool old = ts_set_grad_enabled(ctx, false);
    ts_tensor *lg = ts_decoder_forward(m, ids, 0);
    ts_set_grad_enabled(ctx, old);
    float *out = NULL;
    size_t n = (size_t)(c->B * c->T * c->V);
    if (lg && ts_tensor_numel(lg) == (int64_t)n) {
        out = malloc(n * sizeof(float));
        if (ts_tensor_read(lg, out, TS_F32) != TS_OK) {
            free(out);
            out = NULL;
        }
    } else if (lg && ts_ctx_status(ctx) == TS_OK) {
        fprintf(stderr, "%s: logits have %lld values, expected %zu\n", c->name,
                (long long)ts_tensor_numel(lg), n);
    }
    ts_release(lg), ts_release(ids);
    return out;
}

static void case_dir(const ref_case *c, char *out, size_t n) {
    snprintf(out, n, "%s/%s", DIR_, c->name);
}

/* ---- the checks --------------------------------------------------------- */

static void check_logits(ts_ctx *ctx, const ref_case *c, ts_dtype wdt) {
    const char *check = wdt == TS_BF16 ? "logits_bf16" : "logits_f32";
    double bound = wdt != TS_BF16 ? 1e-4
                   : bf16_gemm_level()
                       ? fmax(BF16_BOUND, BF16_GEMM_SHIFTS * c->bf16_shift)
                       : BF16_BOUND;
    char dir[1024], note[256];
    case_dir(c, dir, sizeof dir);
    ts_decoder *m = load(ctx, dir, wdt, NULL);
    float *got = m ? logits_of(ctx, m, c) : NULL;
    if (!got) {
        record_error(ctx, c, check, bound, m ? "forward" : "load");
    } else {
        size_t n = (size_t)(c->B * c->T * c->V);
        double err =
            diff(got, wdt == TS_BF16 ? c->logits_bf16 : c->logits, n, true);
        if (wdt == TS_BF16)
            snprintf(note, sizeof note,
                     "vs the f32 reference %.2e; rounding alone moves "
                     "the reference by %.2e",
                     diff(got, c->logits, n, true), c->bf16_shift);
        else
            note[0] = 0;
        record(c, check, err <= bound, err, bound, note);
    }
    free(got);
    ts_decoder_free(m);
}

static void check_compiled(ts_ctx *ctx, const ref_case *c) {
    char dir[1024];
    case_dir(c, dir, sizeof dir);
    ts_decoder *m = load(ctx, dir, TS_F32, NULL);
    float *eager = m ? logits_of(ctx, m, c) : NULL;
    ts_set_mode(ctx, TS_MODE_COMPILED);
    float *comp = eager ? logits_of(ctx, m, c) : NULL;
    ts_set_mode(ctx, TS_MODE_EAGER);
    if (!comp)
        record_error(ctx, c, "eager_vs_compiled", 1e-6,
                     !m       ? "load"
                     : !eager ? "eager forward"
                              : "compiled forward");
    else {
        double err = diff(comp, eager, (size_t)(c->B * c->T * c->V), true);
        record(c, "eager_vs_compiled", err <= 1e-6, err, 1e-6, "");
    }
    free(eager), free(comp);
    ts_decoder_free(m);
}

static void check_split(ts_ctx *ctx, const ref_case *c) {
    char dir[1024], map[128], note[300];
    case_dir(c, dir, sizeof dir);
    int64_t h = c->layers / 2; /* layers 0..h-1 with the embedding */
    if (h < 1)
        h = 1;
    /* on the host: cpu:0 then cpu:1; with a DEVICE: it, then the host */
    const char *d0 = DEVICE ? DEVICE : "cpu:0",
               *d1 = DEVICE ? "cpu:0" : "cpu:1";
    if (h == c->layers)
        snprintf(map, sizeof map, "embed,0-%lld:%s;head:%s", (long long)(h - 1),
                 d0, d1);
    else
        snprintf(map, sizeof map, "embed,0-%lld:%s;%lld-%lld,head:%s",
                 (long long)(h - 1), d0, (long long)h,
                 (long long)(c->layers - 1), d1);
    ts_decoder *one = load(ctx, dir, TS_F32, NULL);
    float *a = one ? logits_of(ctx, one, c) : NULL;
    ts_decoder_free(one);
    ts_decoder *two = a ? load(ctx, dir, TS_F32, map) : NULL;
    float *b = two ? logits_of(ctx, two, c) : NULL;
    snprintf(note, sizeof note, "device_map \"%s\"", map);
    if (!b)
        record_error(ctx, c, "split_2dev", 0,
                     !a    ? "one-device run"
                     : two ? "split forward"
                           : note);
    else {
        /* the same kernels: the same bits; two backends: their rounding */
        double bound = DEVICE ? 1e-4 : 0;
        double err = diff(b, a, (size_t)(c->B * c->T * c->V), DEVICE != NULL);
        record(c, "split_2dev", err <= bound, err, bound, note);
    }
    free(a), free(b);
    ts_decoder_free(two);
}

/* the engine's greedy tokens for the prompt, alone in the engine */
static bool engine_greedy(ts_ctx *ctx, ts_decoder *m, const ref_case *c,
                          int64_t *out) {
    ts_engine_options o = ts_engine_options_default();
    o.kv_dtype =
        TS_KV_F32; /* against f32 references (bf16 KV: test_engine_kv) */
    ts_engine *e = NULL;
    if (ts_engine_new(ctx, m, &o, &e) != TS_OK)
        return false;
    int32_t prompt[MAX_TOK];
    for (int i = 0; i < c->n_prompt; i++)
        prompt[i] = (int32_t)c->prompt[i];
    ts_request r = {.prompt = prompt,
                    .n_prompt = (size_t)c->n_prompt,
                    .max_tokens = c->n_greedy,
                    .sampling = ts_sampling_default(),
                    .ignore_eos = true};
    r.sampling.temperature = 0;
    int64_t id = -1;
    int n = 0;
    bool ok = ts_engine_add(e, &r, &id) == TS_OK;
    for (int guard = 0; ok && ts_engine_has_work(e) && guard < 1000; guard++) {
        ts_engine_output outs[8];
        int k = 0;
        ok = ts_engine_step(e, outs, 8, &k) == TS_OK;
        for (int j = 0; ok && j < k; j++)
            if (outs[j].id == id && n < c->n_greedy)
                out[n++] = outs[j].token;
    }
    ts_engine_free(e);
    return ok && n == c->n_greedy;
}

static void check_greedy(ts_ctx *ctx, const ref_case *c) {
    char dir[1024], note[512];
    case_dir(c, dir, sizeof dir);
    int64_t kv[MAX_TOK], eng[MAX_TOK];
    ts_decoder *m = load(ctx, dir, TS_F32, NULL);
    if (!m) {
        record_error(ctx, c, "engine_greedy", 0, "load");
        return;
    }
    if (ts_decoder_generate_greedy(m, c->prompt, c->n_prompt, c->n_greedy,
                                   kv) != TS_OK) {
        record_error(ctx, c, "engine_greedy", 0, "ts_decoder_generate_greedy");
        ts_decoder_free(m);
        return;
    }
    if (!engine_greedy(ctx, m, c, eng)) {
        record_error(ctx, c, "engine_greedy", 0, "engine");
        ts_decoder_free(m);
        return;
    }
    int bad_kv = 0, bad_eng = 0, first = -1;
    for (int i = 0; i < c->n_greedy; i++) {
        bad_kv += kv[i] != c->greedy[i];
        bad_eng += eng[i] != c->greedy[i];
        if (first < 0 && (kv[i] != c->greedy[i] || eng[i] != c->greedy[i]))
            first = i;
    }
    if (first < 0)
        snprintf(note, sizeof note, "%d tokens after %d", c->n_greedy,
                 c->n_prompt);
    else
        snprintf(note, sizeof note,
                 "KV cache differs at %d, engine at %d positions; first at "
                 "%d: reference %lld, KV cache %lld, engine %lld",
                 bad_kv, bad_eng, first, (long long)c->greedy[first],
                 (long long)kv[first], (long long)eng[first]);
    record(c, "engine_greedy", first < 0, (double)(bad_kv + bad_eng), 0, note);
    ts_decoder_free(m);
}

static void check_train(ts_ctx *ctx, const ref_case *c) {
    char dir[1024], note[512];
    case_dir(c, dir, sizeof dir);
    ts_decoder *m = load(ctx, dir, TS_F32, NULL);
    if (!m) {
        record_error(ctx, c, "train_5", 1e-4, "load");
        return;
    }
    int np = ts_decoder_num_params(m);
    ts_tensor *const *params = ts_decoder_params(m);
    for (int i = 0; i < np; i++)
        ts_set_requires_grad(params[i], true);
    ts_adamw_options o = {.lr = c->lr,
                          .beta1 = c->beta1,
                          .beta2 = c->beta2,
                          .eps = c->eps,
                          .weight_decay = c->wd};
    ts_adamw *opt = NULL;
    int64_t shape[2] = {c->B, c->T};
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, c->ids);
    ts_tensor *tg = ts_from_data(ctx, TS_I64, 2, shape, c->targets);
    double got[MAX_STEPS], worst = 0;
    int done = 0;
    if (ts_adamw_new(ctx, params, np, &o, &opt) == TS_OK) {
        for (; done < c->n_losses; done++) {
            for (int i = 0; i < np; i++)
                ts_zero_grad(params[i]);
            ts_tensor *l = ts_decoder_loss(m, ids, tg, NULL);
            if (!l || ts_item(l, &got[done]) != TS_OK ||
                ts_backward(l, NULL) != TS_OK || ts_adamw_step(opt) != TS_OK) {
                ts_release(l);
                break;
            }
            ts_release(l);
            double e =
                fabs(got[done] - c->losses[done]) / fabs(c->losses[done]);
            if (!(e <= worst))
                worst = isnan(e) ? INFINITY : e;
        }
    }
    if (done < c->n_losses) {
        char what[64];
        snprintf(what, sizeof what, "step %d", done + 1);
        record_error(ctx, c, "train_5", 1e-4, what);
    } else {
        int at = snprintf(note, sizeof note, "losses");
        for (int s = 0; s < done; s++)
            at +=
                snprintf(note + at, sizeof note - (size_t)at, " %.6f", got[s]);
        snprintf(note + at, sizeof note - (size_t)at, "; reference %.6f..%.6f",
                 c->losses[0], c->losses[done - 1]);
        record(c, "train_5", worst <= 1e-4, worst, 1e-4, note);
    }
    ts_adamw_free(opt);
    ts_release(ids), ts_release(tg);
    ts_decoder_free(m);
}

/* the same tensor names and shapes in two checkpoints; else what differs */
static bool same_layout(ts_ctx *ctx, const char *a, const char *b, char *why,
                        size_t n) {
    ts_safetensors *sa = NULL, *sb = NULL;
    bool ok = ts_safetensors_open(ctx, a, &sa) == TS_OK &&
              ts_safetensors_open(ctx, b, &sb) == TS_OK;
    if (!ok) {
        snprintf(why, n, "cannot open: %s", ts_errmsg(ctx));
        ts_clear_error(ctx);
    }
    if (ok && ts_safetensors_count(sa) != ts_safetensors_count(sb)) {
        snprintf(why, n, "%d tensors saved, the original has %d",
                 ts_safetensors_count(sb), ts_safetensors_count(sa));
        ok = false;
    }
    for (int i = 0; ok && i < ts_safetensors_count(sa); i++) {
        const char *name = ts_safetensors_name(sa, i);
        int na = 0, nb = 0;
        int64_t shape_a[TS_MAX_DIMS], shape_b[TS_MAX_DIMS];
        if (!ts_safetensors_shape(sb, name, NULL, &nb, shape_b)) {
            snprintf(why, n, "%s missing from the saved checkpoint", name);
            ok = false;
        } else {
            ts_safetensors_shape(sa, name, NULL, &na, shape_a);
            if (na != nb ||
                memcmp(shape_a, shape_b, sizeof(int64_t) * (size_t)na)) {
                snprintf(why, n, "%s saved with another shape", name);
                ok = false;
            }
        }
    }
    if (sa)
        ts_safetensors_close(sa);
    if (sb)
        ts_safetensors_close(sb);
    return ok;
}

static void check_save(ts_ctx *ctx, const ref_case *c) {
    char dir[1024], out[1024], note[512] = "";
    case_dir(c, dir, sizeof dir);
    /* a run per device writes its own (they may run at once) */
    snprintf(out, sizeof out, "%s/saved%s", DIR_, DEV_SUFFIX);
    mkdir(out, 0755);
    snprintf(out, sizeof out, "%s/saved%s/%s", DIR_, DEV_SUFFIX, c->name);
    mkdir(out, 0755);
    ts_decoder *m = load(ctx, dir, TS_F32, NULL);
    float *a = m ? logits_of(ctx, m, c) : NULL;
    if (!a || ts_decoder_save(m, out) != TS_OK) {
        record_error(ctx, c, "save_reload", 0,
                     !m   ? "load"
                     : !a ? "forward"
                          : "save");
        free(a);
        ts_decoder_free(m);
        return;
    }
    ts_decoder_free(m);
    ts_decoder *r = load(ctx, out, TS_F32, NULL);
    float *b = r ? logits_of(ctx, r, c) : NULL;
    if (!b) {
        record_error(ctx, c, "save_reload", 0, "reload");
    } else {
        bool layout = same_layout(ctx, dir, out, note, sizeof note);
        double err = diff(b, a, (size_t)(c->B * c->T * c->V), false);
        record(c, "save_reload", layout && err == 0, err, 0, note);
    }
    free(a), free(b);
    ts_decoder_free(r);
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr,
                "usage: test_compat DIR (make_models.py's OUT) [DEVICE]\n");
        return 2;
    }
    DIR_ = argv[1];
    DEVICE = argc == 3 ? argv[2] : NULL;
    char path[1024], *dev = DEV_SUFFIX;
    if (DEVICE) {
        ts_ctx *probe = test_ctx();
        ts_device d;
        if (ts_device_parse(probe, DEVICE, &d) != TS_OK) {
            printf("test_compat: skipped: %s\n", ts_errmsg(probe));
            ts_ctx_free(probe);
            return 77;
        }
        ts_ctx_free(probe);
        snprintf(dev, sizeof DEV_SUFFIX, "-%s", DEVICE);
        for (char *p = dev; *p; p++)
            if (*p == ':')
                *p = '_';
    }
    snprintf(path, sizeof path, "%s/cases.txt", DIR_);
    FILE *cases = fopen(path, "r");
    snprintf(path, sizeof path, "%s/results%s.jsonl", DIR_, dev);
    RESULTS = fopen(path, "w");
    if (!cases || !RESULTS) {
        fprintf(stderr, "cannot open %s/cases.txt or results.jsonl\n", DIR_);
        return 1;
    }
    ts_ctx *ctx = test_ctx();
    /* one case selected by name through TS_COMPAT_CASE (for debugging) */
    const char *only = getenv("TS_COMPAT_CASE");
    ref_case c;
    while (memset(&c, 0, sizeof c),
           fscanf(cases, "%63s %31s", c.name, c.family) == 2) {
        if (only && strcmp(only, c.name))
            continue;
        if (!load_case(&c)) {
            record(&c, "reference_files", false, NAN, 0,
                   "make_models.py's files are missing or short");
            free_case(&c);
            continue;
        }
        check_logits(ctx, &c, TS_F32);
        check_logits(ctx, &c, TS_BF16);
        check_compiled(ctx, &c);
        check_split(ctx, &c);
        check_greedy(ctx, &c);
        check_train(ctx, &c);
        check_save(ctx, &c);
        free_case(&c);
    }
    fclose(cases);
    fclose(RESULTS);
    ts_ctx_free(ctx);
    return test_finish("test_compat");
}
