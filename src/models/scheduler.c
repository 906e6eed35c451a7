/* scheduler.c — diffusion noise schedulers from a Diffusers
 * scheduler_config.json: the training noise schedule (betas, cumulative
 * alpha products), the inference timesteps and sigmas for each spacing, and
 * the sampling steps of DDIM (eta 0), Euler discrete (s_churn 0),
 * DPM-Solver++ 2M and DDPM, each as Diffusers computes it (its float32
 * scalars included, so that a loop matches Diffusers' to float rounding).
 * Owns no model: a step takes the model's output and returns the previous
 * sample, built from public elementwise ops (any device, eager or
 * compiled). */
#include "tessera_diffusion.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SCHED_PATH_LEN 1024
#define SCHED_STR      48

enum { PRED_EPSILON, PRED_V, PRED_SAMPLE };

struct ts_scheduler {
    ts_ctx *ctx;
    char path[SCHED_PATH_LEN];
    json_t *config;
    char class_name[SCHED_STR];
    ts_scheduler_kind kind;
    /* the config, with the defaults of the kind that runs */
    int n_train;
    char prediction[SCHED_STR];
    int pred;
    char spacing[SCHED_STR];
    int64_t steps_offset;
    bool set_alpha_to_one, clip_sample;
    double clip_range;
    bool final_sigma_zero;     /* final_sigmas_type "zero" (else sigma_min) */
    bool continuous_t;         /* Euler: timestep_type "continuous" */
    int solver_order;          /* DPM: 1 or 2 */
    bool heun;                 /* DPM: solver_type "heun" (else midpoint) */
    bool lower_order_final;    /* DPM */
    bool euler_at_final;       /* DPM */
    double lambda_min_clipped; /* DPM */
    /* the training schedule */
    double *ac;      /* (n_train) alphas_cumprod, float32 values */
    double final_ac; /* DDIM's final_alpha_cumprod */
    /* the inference schedule */
    int n;                /* steps; 0 before set_timesteps */
    double *t;            /* (n) timesteps */
    float *sigmas;        /* (n + 1) Euler/DPM sigmas, the last one final */
    ts_tensor *hist[2];   /* DPM: converted outputs of the last two steps */
    int lower_order_nums; /* DPM: steps taken since set_timesteps */
    int last_step;        /* DPM: the previous step's index */
    uint64_t seed;        /* DDPM: its step i draws ts_randn(seed + i) */
};

/* ---- config ------------------------------------------------------------- */

/* Python's json writes -Infinity / Infinity / NaN as bare tokens (Diffusers'
 * lambda_min_clipped); jansson rejects them, so they become strings that
 * sched_num reads back. */
static char *quote_nonfinite(const char *src, size_t n, size_t *out_n) {
    char *dst = malloc(n * 2 + 1);
    if (!dst)
        return NULL;
    size_t k = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (in_str) {
            dst[k++] = c;
            if (c == '\\' && i + 1 < n)
                dst[k++] = src[++i];
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') {
            in_str = true;
            dst[k++] = c;
            continue;
        }
        static const char *toks[] = {"-Infinity", "Infinity", "NaN"};
        bool done = false;
        for (int t = 0; t < 3 && !done; t++) {
            size_t L = strlen(toks[t]);
            if (i + L <= n && !memcmp(src + i, toks[t], L)) {
                dst[k++] = '"';
                memcpy(dst + k, toks[t], L);
                k += L;
                dst[k++] = '"';
                i += L - 1;
                done = true;
            }
        }
        if (!done)
            dst[k++] = c;
    }
    dst[k] = 0;
    *out_n = k;
    return dst;
}

static json_t *sched_get(ts_scheduler *s, const char *key) {
    json_t *v = json_object_get(s->config, key);
    return v && !json_is_null(v) ? v : NULL;
}

static bool sched_num(ts_scheduler *s, const char *key, double def,
                      double *out) {
    json_t *v = sched_get(s, key);
    *out = def;
    if (!v)
        return true;
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    if (json_is_string(v)) {
        const char *x = json_string_value(v);
        if (!strcmp(x, "-Infinity"))
            return *out = -INFINITY, true;
        if (!strcmp(x, "Infinity"))
            return *out = INFINITY, true;
    }
    ts_set_error(s->ctx, TS_ERR_INVALID_ARG, "%s: key \"%s\" must be a number",
                 s->path, key);
    return false;
}

static bool sched_int(ts_scheduler *s, const char *key, int64_t def,
                      int64_t *out) {
    json_t *v = sched_get(s, key);
    *out = def;
    if (!v)
        return true;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    ts_set_error(s->ctx, TS_ERR_INVALID_ARG,
                 "%s: key \"%s\" must be an integer", s->path, key);
    return false;
}

static bool sched_bool(ts_scheduler *s, const char *key, bool def, bool *out) {
    json_t *v = sched_get(s, key);
    *out = def;
    if (!v)
        return true;
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return true;
    }
    ts_set_error(s->ctx, TS_ERR_INVALID_ARG,
                 "%s: key \"%s\" must be true or false", s->path, key);
    return false;
}

/* A string key whose value must be one of known ("a|b|c"); its index in
 * *idx. */
static bool sched_enum(ts_scheduler *s, const char *key, const char *def,
                       const char *known, char *out, int *idx) {
    json_t *v = sched_get(s, key);
    const char *x = def;
    if (v && !json_is_string(v)) {
        ts_set_error(s->ctx, TS_ERR_INVALID_ARG,
                     "%s: key \"%s\" must be a string (one of %s)", s->path,
                     key, known);
        return false;
    }
    if (v)
        x = json_string_value(v);
    const char *p = known;
    for (int k = 0; *p; k++) {
        const char *bar = strchr(p, '|');
        size_t L = bar ? (size_t)(bar - p) : strlen(p);
        if (strlen(x) == L && !strncmp(x, p, L)) {
            snprintf(out, SCHED_STR, "%s", x);
            if (idx)
                *idx = k;
            return true;
        }
        p += L + (bar ? 1 : 0);
    }
    ts_set_error(s->ctx, TS_ERR_INVALID_ARG,
                 "%s: key \"%s\": unknown value \"%s\" (known: %s)", s->path,
                 key, x, known);
    return false;
}

/* A string key holding a value Diffusers knows but this file does not
 * implement (one of "a|b"): TS_ERR_UNSUPPORTED naming both. */
static bool sched_refuse_value(ts_scheduler *s, const char *key,
                               const char *values) {
    json_t *v = sched_get(s, key);
    if (!v || !json_is_string(v))
        return true;
    const char *x = json_string_value(v), *p = values;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t L = bar ? (size_t)(bar - p) : strlen(p);
        if (strlen(x) == L && !strncmp(x, p, L)) {
            ts_set_error(s->ctx, TS_ERR_UNSUPPORTED,
                         "%s: key \"%s\": \"%s\" is not supported", s->path,
                         key, x);
            return false;
        }
        p += L + (bar ? 1 : 0);
    }
    return true;
}

/* A boolean feature this file does not implement: true is refused. */
static bool sched_refuse_true(ts_scheduler *s, const char *key) {
    bool on;
    if (!sched_bool(s, key, false, &on))
        return false;
    if (on) {
        ts_set_error(s->ctx, TS_ERR_UNSUPPORTED,
                     "%s: key \"%s\" true is not supported (only false)",
                     s->path, key);
        return false;
    }
    return true;
}

/* ---- the training schedule ---------------------------------------------- */

/* torch.linspace(a, b, n, dtype=float32), as its CPU kernel computes it */
static void linspace_f32(float a, float b, int n, float *out) {
    float step = n > 1 ? (b - a) / (float)(n - 1) : 0.0f;
    int half = n / 2;
    for (int i = 0; i < n; i++)
        out[i] = i < half ? a + step * (float)i : b - step * (float)(n - i - 1);
}

static double alpha_bar_cos(double t) {
    double c = cos((t + 0.008) / 1.008 * 3.14159265358979323846 / 2);
    return c * c;
}

static bool build_training_schedule(ts_scheduler *s) {
    int N = s->n_train;
    double beta_start, beta_end;
    char sched[SCHED_STR];
    int which;
    if (!sched_num(s, "beta_start", 0.0001, &beta_start) ||
        !sched_num(s, "beta_end", 0.02, &beta_end) ||
        !sched_enum(s, "beta_schedule", "linear",
                    "linear|scaled_linear|squaredcos_cap_v2", sched, &which))
        return false;
    float *betas = malloc(sizeof(float) * (size_t)N);
    double *ac = malloc(sizeof(double) * (size_t)N);
    if (!betas || !ac) {
        free(betas), free(ac);
        ts_set_error(s->ctx, TS_ERR_OOM, "%s: no memory for %d betas", s->path,
                     N);
        return false;
    }
    json_t *tb = sched_get(s, "trained_betas");
    if (tb) {
        if (!json_is_array(tb) || (int)json_array_size(tb) != N) {
            free(betas), free(ac);
            ts_set_error(s->ctx, TS_ERR_INVALID_ARG,
                         "%s: key \"trained_betas\" must be a list of "
                         "num_train_timesteps (%d) numbers",
                         s->path, N);
            return false;
        }
        for (int i = 0; i < N; i++)
            betas[i] = (float)json_number_value(json_array_get(tb, i));
    } else if (which == 0) {
        linspace_f32((float)beta_start, (float)beta_end, N, betas);
    } else if (which == 1) {
        linspace_f32((float)sqrt(beta_start), (float)sqrt(beta_end), N, betas);
        for (int i = 0; i < N; i++)
            betas[i] = betas[i] * betas[i];
    } else {
        for (int i = 0; i < N; i++) {
            double t1 = (double)i / N, t2 = (double)(i + 1) / N;
            double b = 1 - alpha_bar_cos(t2) / alpha_bar_cos(t1);
            betas[i] = (float)(b < 0.999 ? b : 0.999);
        }
    }
    /* torch.cumprod over float32 accumulates in double on the CPU */
    double acc = 1;
    for (int i = 0; i < N; i++) {
        float alpha = 1.0f - betas[i];
        acc *= (double)alpha;
        ac[i] = (double)(float)acc;
    }
    free(betas);
    free(s->ac);
    s->ac = ac;
    return true;
}

/* ---- kind and config ---------------------------------------------------- */

static void drop_history(ts_scheduler *s) {
    ts_release(s->hist[0]), ts_release(s->hist[1]);
    s->hist[0] = s->hist[1] = NULL;
    s->lower_order_nums = 0;
    s->last_step = -1;
}

static void drop_timesteps(ts_scheduler *s) {
    free(s->t), free(s->sigmas);
    s->t = NULL, s->sigmas = NULL, s->n = 0;
    drop_history(s);
}

/* Reads the config's keys with the defaults of s->kind's class. */
static bool configure(ts_scheduler *s) {
    ts_scheduler_kind k = s->kind;
    bool ddim_like = k == TS_SCHED_DDIM || k == TS_SCHED_DDPM;
    int64_t n_train;
    char tmp[SCHED_STR];
    if (!sched_int(s, "num_train_timesteps", 1000, &n_train))
        return false;
    if (n_train < 1 || n_train > 100000) {
        ts_set_error(s->ctx, TS_ERR_RANGE,
                     "%s: key \"num_train_timesteps\" is %lld (1 .. 100000)",
                     s->path, (long long)n_train);
        return false;
    }
    s->n_train = (int)n_train;
    if (!sched_enum(s, "prediction_type", "epsilon",
                    "epsilon|v_prediction|sample", s->prediction, &s->pred) ||
        !sched_enum(s, "timestep_spacing", ddim_like ? "leading" : "linspace",
                    "leading|trailing|linspace", s->spacing, NULL) ||
        !sched_int(s, "steps_offset", 0, &s->steps_offset) ||
        !sched_refuse_true(s, "rescale_betas_zero_snr") ||
        !sched_refuse_true(s, "thresholding"))
        return false;
    s->clip_sample = false;
    s->set_alpha_to_one = true;
    s->clip_range = 1;
    if (ddim_like && (!sched_bool(s, "clip_sample", true, &s->clip_sample) ||
                      !sched_num(s, "clip_sample_range", 1.0, &s->clip_range)))
        return false;
    if (k == TS_SCHED_DDIM &&
        !sched_bool(s, "set_alpha_to_one", true, &s->set_alpha_to_one))
        return false;
    json_t *vt = sched_get(s, "variance_type");
    if (k == TS_SCHED_DDPM && vt &&
        (!json_is_string(vt) || strcmp(json_string_value(vt), "fixed_small"))) {
        ts_set_error(s->ctx, TS_ERR_UNSUPPORTED,
                     "%s: key \"variance_type\": only \"fixed_small\" is "
                     "supported for DDPMScheduler",
                     s->path);
        return false;
    }
    if (k == TS_SCHED_EULER || k == TS_SCHED_DPMPP_2M) {
        int fs;
        if (!sched_refuse_true(s, "use_karras_sigmas") ||
            !sched_refuse_true(s, "use_exponential_sigmas") ||
            !sched_refuse_true(s, "use_beta_sigmas") ||
            !sched_enum(s, "final_sigmas_type", "zero", "zero|sigma_min", tmp,
                        &fs))
            return false;
        s->final_sigma_zero = fs == 0;
    }
    s->continuous_t = false;
    if (k == TS_SCHED_EULER) {
        int tt;
        if (!sched_refuse_value(s, "interpolation_type", "log_linear") ||
            !sched_enum(s, "interpolation_type", "linear", "linear", tmp,
                        NULL) ||
            !sched_enum(s, "timestep_type", "discrete", "discrete|continuous",
                        tmp, &tt))
            return false;
        s->continuous_t = tt == 1 && s->pred == PRED_V;
    }
    if (k == TS_SCHED_DPMPP_2M) {
        int64_t order;
        int st;
        if (!sched_refuse_value(s, "algorithm_type",
                                "dpmsolver|sde-dpmsolver|sde-dpmsolver++") ||
            !sched_enum(s, "algorithm_type", "dpmsolver++", "dpmsolver++", tmp,
                        NULL) ||
            !sched_int(s, "solver_order", 2, &order) ||
            !sched_enum(s, "solver_type", "midpoint", "midpoint|heun", tmp,
                        &st) ||
            !sched_bool(s, "lower_order_final", true, &s->lower_order_final) ||
            !sched_bool(s, "euler_at_final", false, &s->euler_at_final) ||
            !sched_refuse_true(s, "use_lu_lambdas") ||
            !sched_num(s, "lambda_min_clipped", -INFINITY,
                       &s->lambda_min_clipped))
            return false;
        if (order != 1 && order != 2) {
            ts_set_error(s->ctx, TS_ERR_UNSUPPORTED,
                         "%s: key \"solver_order\" is %lld (supported: 1, 2)",
                         s->path, (long long)order);
            return false;
        }
        if (sched_get(s, "variance_type")) {
            ts_set_error(s->ctx, TS_ERR_UNSUPPORTED,
                         "%s: key \"variance_type\" must be null for "
                         "DPMSolverMultistepScheduler",
                         s->path);
            return false;
        }
        s->solver_order = (int)order;
        s->heun = st == 1;
    }
    if (!build_training_schedule(s))
        return false;
    s->final_ac = s->set_alpha_to_one ? 1.0 : s->ac[0];
    drop_timesteps(s);
    return true;
}

ts_status ts_scheduler_load(ts_ctx *ctx, const char *config_json_path,
                            ts_scheduler **out) {
    if (!out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_scheduler_load: out is NULL");
    *out = NULL;
    if (!config_json_path)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_scheduler_load: path is NULL");
    FILE *f = fopen(config_json_path, "rb");
    if (!f)
        return ts_set_error(ctx, TS_ERR_IO, "cannot read %s", config_json_path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            char *nb = cap < (64u << 20) ? realloc(buf, cap * 2) : NULL;
            if (!nb)
                free(buf);
            buf = nb, cap *= 2;
        }
    }
    fclose(f);
    if (!buf)
        return ts_set_error(ctx, TS_ERR_IO, "%s: too large or no memory",
                            config_json_path);
    size_t qn;
    char *q = quote_nonfinite(buf, n, &qn);
    free(buf);
    if (!q)
        return ts_set_error(ctx, TS_ERR_OOM, "%s: no memory", config_json_path);
    json_error_t je;
    json_t *root = json_loadb(q, qn, JSON_REJECT_DUPLICATES, &je);
    free(q);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return ts_set_error(ctx, TS_ERR_IO,
                            "%s: not a JSON object (%s, line %d)",
                            config_json_path, root ? "not an object" : je.text,
                            root ? 0 : je.line);
    }
    ts_scheduler *s = calloc(1, sizeof *s);
    if (!s) {
        json_decref(root);
        return ts_set_error(ctx, TS_ERR_OOM, "no memory for a scheduler");
    }
    s->ctx = ctx;
    s->config = root;
    s->last_step = -1;
    snprintf(s->path, sizeof s->path, "%s", config_json_path);
    json_t *cn = json_object_get(root, "_class_name");
    if (!cn || !json_is_string(cn)) {
        ts_scheduler_free(s);
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "%s: key \"_class_name\" is missing (a Diffusers "
                            "scheduler config names its class)",
                            config_json_path);
    }
    snprintf(s->class_name, sizeof s->class_name, "%s", json_string_value(cn));
    static const struct {
        const char *name;
        ts_scheduler_kind kind;
    } classes[] = {{"DDIMScheduler", TS_SCHED_DDIM},
                   {"PNDMScheduler", TS_SCHED_DDIM},
                   {"EulerDiscreteScheduler", TS_SCHED_EULER},
                   {"DPMSolverMultistepScheduler", TS_SCHED_DPMPP_2M},
                   {"DDPMScheduler", TS_SCHED_DDPM}};
    int found = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(s->class_name, classes[i].name))
            found = i;
    if (found < 0) {
        ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                     "%s: key \"_class_name\": unknown scheduler \"%s\" "
                     "(known: DDIMScheduler, PNDMScheduler (run as DDIM), "
                     "EulerDiscreteScheduler, DPMSolverMultistepScheduler, "
                     "DDPMScheduler)",
                     config_json_path, s->class_name);
        ts_scheduler_free(s);
        return TS_ERR_UNSUPPORTED;
    }
    s->kind = classes[found].kind;
    if (!configure(s)) {
        ts_status st = ts_ctx_status(ctx);
        ts_scheduler_free(s);
        return st != TS_OK ? st : TS_ERR_INVALID_ARG;
    }
    *out = s;
    return TS_OK;
}

void ts_scheduler_free(ts_scheduler *s) {
    if (!s)
        return;
    drop_timesteps(s);
    free(s->ac);
    json_decref(s->config);
    free(s);
}

ts_status ts_scheduler_set_kind(ts_scheduler *s, const char *name) {
    if (!s)
        return TS_ERR_INVALID_ARG;
    static const struct {
        const char *name;
        ts_scheduler_kind kind;
    } names[] = {{"ddim", TS_SCHED_DDIM},
                 {"euler", TS_SCHED_EULER},
                 {"dpm++2m", TS_SCHED_DPMPP_2M},
                 {"ddpm", TS_SCHED_DDPM}};
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, names[i].name)) {
            ts_scheduler_kind old = s->kind;
            s->kind = names[i].kind;
            if (!configure(s)) {
                ts_status st = ts_ctx_status(s->ctx);
                s->kind = old;
                configure(s);
                ts_set_error(s->ctx, st, "%s", ts_errmsg(s->ctx));
                return st;
            }
            return TS_OK;
        }
    return ts_set_error(s->ctx, TS_ERR_INVALID_ARG,
                        "unknown scheduler \"%s\" (known: ddim, euler, "
                        "dpm++2m, ddpm)",
                        name ? name : "(null)");
}

ts_scheduler_kind ts_scheduler_get_kind(const ts_scheduler *s) {
    return s->kind;
}

int ts_scheduler_num_train_timesteps(const ts_scheduler *s) {
    return s->n_train;
}

const char *ts_scheduler_prediction_type(const ts_scheduler *s) {
    return s->prediction;
}

const double *ts_scheduler_alphas_cumprod(const ts_scheduler *s, int *n) {
    if (n)
        *n = s->n_train;
    return s->ac;
}

void ts_scheduler_set_seed(ts_scheduler *s, uint64_t seed) {
    s->seed = seed;
}

/* ---- the inference schedule --------------------------------------------- */

/* np.linspace(a, b, num) (endpoint included) */
static double np_linspace_at(double a, double b, int num, int i) {
    if (num < 2)
        return a;
    if (i == num - 1)
        return b;
    return (double)i * ((b - a) / (num - 1)) + a;
}

/* np.arange(start, 0, -step)[i] for a float step (numpy's fill: start +
 * i * ((start - step) - start)) */
static double np_arange_down_at(double start, double step, int i) {
    double delta = (start - step) - start;
    return start + (double)i * delta;
}

/* ((1 - ac) / ac) ** 0.5 in float32, as the schedulers' sigma table */
static float sigma_of_ac(double ac) {
    float a = (float)ac;
    return sqrtf((1.0f - a) / a);
}

/* np.interp(x, arange(N), sig_table) */
static double interp_sigma(const ts_scheduler *s, double x) {
    int N = s->n_train;
    if (x <= 0)
        return sigma_of_ac(s->ac[0]);
    if (x >= N - 1)
        return sigma_of_ac(s->ac[N - 1]);
    int j = (int)floor(x);
    double y0 = sigma_of_ac(s->ac[j]);
    if (x == j)
        return y0;
    double y1 = sigma_of_ac(s->ac[j + 1]);
    return (y1 - y0) * (x - j) + y0;
}

ts_status ts_scheduler_set_timesteps(ts_scheduler *s, int num_inference_steps) {
    if (!s)
        return TS_ERR_INVALID_ARG;
    int n = num_inference_steps, N = s->n_train;
    if (n < 1 || n > N)
        return ts_set_error(s->ctx, TS_ERR_RANGE,
                            "%s: num_inference_steps %d must be in 1 .. "
                            "num_train_timesteps (%d)",
                            s->path, n, N);
    drop_timesteps(s);
    double *t = malloc(sizeof(double) * (size_t)n);
    float *sig = malloc(sizeof(float) * (size_t)(n + 1));
    if (!t || !sig) {
        free(t), free(sig);
        return ts_set_error(s->ctx, TS_ERR_OOM, "no memory for %d timesteps",
                            n);
    }
    bool leading = !strcmp(s->spacing, "leading");
    bool trailing = !strcmp(s->spacing, "trailing");
    double off = (double)s->steps_offset;
    if (s->kind == TS_SCHED_DDIM || s->kind == TS_SCHED_DDPM) {
        for (int i = 0; i < n; i++) {
            if (leading)
                t[i] = (double)((int64_t)(n - 1 - i) * (N / n)) + off;
            else if (trailing)
                t[i] = rint(np_arange_down_at(N, (double)N / n, i)) - 1;
            else
                t[i] = rint(np_linspace_at(0, N - 1, n, n - 1 - i));
        }
    } else if (s->kind == TS_SCHED_EULER) {
        for (int i = 0; i < n; i++) {
            if (leading)
                t[i] = (double)(float)((int64_t)(n - 1 - i) * (N / n)) + off;
            else if (trailing)
                t[i] = (double)(float)rint(
                           np_arange_down_at(N, (double)N / n, i)) -
                       1;
            else
                t[i] = (double)(float)np_linspace_at(0, N - 1, n, n - 1 - i);
        }
    } else { /* DPM: n + 1 points, the last dropped; lambda_min clipping */
        int last = N;
        if (s->lambda_min_clipped > -INFINITY) {
            int clipped = 0; /* searchsorted(flip(lambda_t), value) */
            for (int i = N - 1; i >= 0; i--) {
                float a = (float)s->ac[i];
                float lam = logf(sqrtf(a)) - logf(sqrtf(1.0f - a));
                if ((double)lam < s->lambda_min_clipped)
                    clipped++;
                else
                    break;
            }
            last = N - clipped;
        }
        for (int i = 0; i < n; i++) {
            if (leading)
                t[i] = (double)((int64_t)(n - i) * (last / (n + 1))) + off;
            else if (trailing)
                t[i] = rint(np_arange_down_at(last, (double)N / n, i)) - 1;
            else
                t[i] = rint(np_linspace_at(0, last - 1, n + 1, n - i));
        }
    }
    for (int i = 0; i < n; i++)
        if (t[i] < 0 || t[i] > N - 1 + (s->kind == TS_SCHED_EULER ? 0.5 : 0)) {
            double bad = t[i];
            free(t), free(sig);
            return ts_set_error(s->ctx, TS_ERR_RANGE,
                                "%s: timestep %g of %d steps falls outside "
                                "0 .. %d (check steps_offset and "
                                "timestep_spacing \"%s\")",
                                s->path, bad, n, N - 1, s->spacing);
        }
    if (s->kind == TS_SCHED_EULER || s->kind == TS_SCHED_DPMPP_2M) {
        for (int i = 0; i < n; i++)
            sig[i] = (float)interp_sigma(s, t[i]);
        sig[n] = s->final_sigma_zero ? 0.0f : sigma_of_ac(s->ac[0]);
        if (s->continuous_t)
            for (int i = 0; i < n; i++)
                t[i] = (double)(0.25f * logf(sig[i]));
    } else {
        for (int i = 0; i <= n; i++)
            sig[i] = 0;
    }
    s->t = t, s->sigmas = sig, s->n = n;
    return TS_OK;
}

int ts_scheduler_num_steps(const ts_scheduler *s) {
    return s ? s->n : 0;
}

double ts_scheduler_timestep(const ts_scheduler *s, int i) {
    if (!s || i < 0 || i >= s->n)
        return NAN;
    return s->t[i];
}

double ts_scheduler_init_noise_sigma(const ts_scheduler *s) {
    if (s->kind != TS_SCHED_EULER)
        return 1.0;
    float mx = 0;
    if (s->n > 0) {
        for (int i = 0; i <= s->n; i++)
            mx = s->sigmas[i] > mx ? s->sigmas[i] : mx;
    } else { /* before set_timesteps: the whole training schedule's */
        for (int i = 0; i < s->n_train; i++) {
            float v = sigma_of_ac(s->ac[i]);
            mx = v > mx ? v : mx;
        }
    }
    if (!strcmp(s->spacing, "leading"))
        return (double)sqrtf(mx * mx + 1.0f);
    return (double)mx;
}

static bool check_step(ts_scheduler *s, int i, const char *what) {
    if (s->n == 0) {
        ts_set_error(s->ctx, TS_ERR_STATE,
                     "%s: call ts_scheduler_set_timesteps first", what);
        return false;
    }
    if (i < 0 || i >= s->n) {
        ts_set_error(s->ctx, TS_ERR_RANGE, "%s: step %d is outside 0 .. %d",
                     what, i, s->n - 1);
        return false;
    }
    return true;
}

/* ---- steps -------------------------------------------------------------- */

/* a * x + b * y (either term dropped when its coefficient is NULL) */
static ts_tensor *lincomb(ts_tensor *x, double a, ts_tensor *y, double b) {
    ts_tensor *ax = ts_mul_scalar(x, a);
    ts_tensor *by = ts_mul_scalar(y, b);
    ts_tensor *r = ax && by ? ts_add(ax, by) : NULL;
    ts_release(ax), ts_release(by);
    return r;
}

/* x / v with v a float32 scalar, as torch divides by a 0-d tensor (a
 * product with 1/v rounds differently) */
static ts_tensor *div_scalar(ts_tensor *x, float v) {
    ts_tensor *c = ts_scalar(ts_tensor_ctx(x), TS_F32, (double)v);
    ts_tensor *cd = c ? ts_to_device(c, ts_tensor_device(x)) : NULL;
    ts_tensor *r = cd ? ts_div(x, cd) : NULL;
    ts_release(c), ts_release(cd);
    return r;
}

/* clamp(x, -r, r) = x - relu(x - r) + relu(-x - r) */
static ts_tensor *clamp_sym(ts_tensor *x, double r) {
    ts_tensor *hi = ts_add_scalar(x, -r), *rhi = hi ? ts_relu(hi) : NULL;
    ts_tensor *nx = ts_neg(x), *lo = nx ? ts_add_scalar(nx, -r) : NULL;
    ts_tensor *rlo = lo ? ts_relu(lo) : NULL;
    ts_tensor *a = rhi ? ts_sub(x, rhi) : NULL;
    ts_tensor *out = a && rlo ? ts_add(a, rlo) : NULL;
    ts_release(hi), ts_release(rhi), ts_release(nx), ts_release(lo);
    ts_release(rlo), ts_release(a);
    return out;
}

/* DDIM/DDPM: the predicted x0 and noise from the model output at
 * alpha_prod_t (float32 as Diffusers' tensors) */
static bool predict_x0_eps(ts_scheduler *s, ts_tensor *mo, ts_tensor *x,
                           float ap, ts_tensor **x0, ts_tensor **eps) {
    float bp = 1.0f - ap, sa = sqrtf(ap), sb = sqrtf(bp);
    *x0 = *eps = NULL;
    if (s->pred == PRED_EPSILON) {
        ts_tensor *d = lincomb(x, 1.0, mo, -(double)sb);
        *x0 = d ? div_scalar(d, sa) : NULL;
        ts_release(d);
        *eps = ts_retain(mo);
    } else if (s->pred == PRED_SAMPLE) {
        *x0 = ts_retain(mo);
        ts_tensor *d = lincomb(x, 1.0, mo, -(double)sa);
        *eps = d ? div_scalar(d, sb) : NULL;
        ts_release(d);
    } else {
        *x0 = lincomb(x, sa, mo, -(double)sb);
        *eps = lincomb(mo, sa, x, sb);
    }
    if (*x0 && s->clip_sample) {
        ts_tensor *c = clamp_sym(*x0, s->clip_range);
        ts_release(*x0);
        *x0 = c;
    }
    if (!*x0 || !*eps) {
        ts_release(*x0), ts_release(*eps);
        return false;
    }
    return true;
}

static ts_tensor *step_ddim(ts_scheduler *s, ts_tensor *mo, int i,
                            ts_tensor *x) {
    int64_t t = (int64_t)s->t[i], prev = t - s->n_train / s->n;
    float ap = (float)s->ac[t];
    float ap_prev = prev >= 0 ? (float)s->ac[prev] : (float)s->final_ac;
    ts_tensor *x0, *eps;
    if (!predict_x0_eps(s, mo, x, ap, &x0, &eps))
        return NULL;
    ts_tensor *r = lincomb(x0, sqrtf(ap_prev), eps, sqrtf(1.0f - ap_prev));
    ts_release(x0), ts_release(eps);
    return r;
}

static ts_tensor *step_ddpm(ts_scheduler *s, ts_tensor *mo, int i,
                            ts_tensor *x) {
    int64_t t = (int64_t)s->t[i], prev = t - s->n_train / s->n;
    float ap = (float)s->ac[t];
    float ap_prev = prev >= 0 ? (float)s->ac[prev] : 1.0f;
    float bp = 1.0f - ap, bp_prev = 1.0f - ap_prev;
    float cur_alpha = ap / ap_prev, cur_beta = 1.0f - cur_alpha;
    ts_tensor *x0, *eps;
    if (!predict_x0_eps(s, mo, x, ap, &x0, &eps))
        return NULL;
    ts_release(eps);
    float c0 = sqrtf(ap_prev) * cur_beta / bp;
    float cx = sqrtf(cur_alpha) * bp_prev / bp;
    ts_tensor *mean = lincomb(x0, c0, x, cx);
    ts_release(x0);
    if (!mean || t <= 0)
        return mean;
    float var = bp_prev / bp * cur_beta;
    var = var > 1e-20f ? var : 1e-20f;
    ts_tensor *noise = ts_randn(ts_tensor_ctx(x), TS_F32, ts_tensor_ndim(x),
                                ts_tensor_shape(x), 1.0, s->seed + (uint64_t)i);
    ts_tensor *nd = noise ? ts_to_device(noise, ts_tensor_device(x)) : NULL;
    ts_tensor *r = nd ? lincomb(mean, 1.0, nd, sqrtf(var)) : NULL;
    ts_release(noise), ts_release(nd), ts_release(mean);
    return r;
}

static ts_tensor *step_euler(ts_scheduler *s, ts_tensor *mo, int i,
                             ts_tensor *x) {
    float sigma = s->sigmas[i], dt = s->sigmas[i + 1] - sigma;
    ts_tensor *x0;
    if (s->pred == PRED_EPSILON) {
        x0 = lincomb(x, 1.0, mo, -(double)sigma);
    } else if (s->pred == PRED_SAMPLE) {
        x0 = ts_retain(mo);
    } else {
        float q = sigma * sigma + 1.0f;
        ts_tensor *a = ts_mul_scalar(mo, -sigma / sqrtf(q));
        ts_tensor *b = div_scalar(x, q);
        x0 = a && b ? ts_add(a, b) : NULL;
        ts_release(a), ts_release(b);
    }
    ts_tensor *d = x0 ? ts_sub(x, x0) : NULL;
    ts_tensor *deriv = d ? div_scalar(d, sigma) : NULL;
    ts_tensor *r = deriv ? lincomb(x, 1.0, deriv, dt) : NULL;
    ts_release(x0), ts_release(d), ts_release(deriv);
    return r;
}

static void alpha_sigma_of(float sigma, float *alpha, float *sig_t) {
    *alpha = 1.0f / sqrtf(sigma * sigma + 1.0f);
    *sig_t = sigma * *alpha;
}

static ts_tensor *step_dpm(ts_scheduler *s, ts_tensor *mo, int i,
                           ts_tensor *x) {
    if (s->lower_order_nums > 0 && i != s->last_step + 1) {
        ts_set_error(s->ctx, TS_ERR_STATE,
                     "ts_scheduler_step: DPM++ 2M step %d after step %d "
                     "(steps run in order; set_timesteps starts over)",
                     i, s->last_step);
        return NULL;
    }
    float a_s0, s_s0, a_t, s_t;
    alpha_sigma_of(s->sigmas[i], &a_s0, &s_s0);
    alpha_sigma_of(s->sigmas[i + 1], &a_t, &s_t);
    ts_tensor *x0; /* convert_model_output (dpmsolver++) */
    if (s->pred == PRED_EPSILON) {
        ts_tensor *d = lincomb(x, 1.0, mo, -(double)s_s0);
        x0 = d ? div_scalar(d, a_s0) : NULL;
        ts_release(d);
    } else if (s->pred == PRED_SAMPLE) {
        x0 = ts_retain(mo);
    } else {
        x0 = lincomb(x, a_s0, mo, -(double)s_s0);
    }
    if (!x0)
        return NULL;
    ts_release(s->hist[0]);
    s->hist[0] = s->hist[1];
    s->hist[1] = x0;
    int n = s->n;
    bool lower_final =
        i == n - 1 && (s->euler_at_final || (s->lower_order_final && n < 15) ||
                       s->final_sigma_zero);
    float lam_t = logf(a_t) - logf(s_t), lam_s0 = logf(a_s0) - logf(s_s0);
    float h = lam_t - lam_s0;
    float em1 = expf(-h) - 1.0f;
    double cs = (double)(s_t / s_s0), c0 = -(double)(a_t * em1);
    ts_tensor *r;
    if (s->solver_order == 1 || s->lower_order_nums < 1 || lower_final) {
        r = lincomb(x, cs, x0, c0);
    } else {
        float a_s1, s_s1;
        alpha_sigma_of(s->sigmas[i - 1], &a_s1, &s_s1);
        float lam_s1 = logf(a_s1) - logf(s_s1);
        float h0 = lam_s0 - lam_s1, r0 = h0 / h;
        float c1 = s->heun ? a_t * (em1 / h + 1.0f) : -0.5f * (a_t * em1);
        ts_tensor *diff = ts_sub(s->hist[1], s->hist[0]);
        ts_tensor *d1 = diff ? ts_mul_scalar(diff, 1.0f / r0) : NULL;
        ts_tensor *a = lincomb(x, cs, x0, c0);
        ts_tensor *b = d1 ? ts_mul_scalar(d1, c1) : NULL;
        r = a && b ? ts_add(a, b) : NULL;
        ts_release(diff), ts_release(d1), ts_release(a), ts_release(b);
    }
    if (r) {
        if (s->lower_order_nums < s->solver_order)
            s->lower_order_nums++;
        s->last_step = i;
    }
    return r;
}

static bool check_pair(ts_scheduler *s, ts_tensor *a, ts_tensor *b,
                       const char *what, const char *na, const char *nb) {
    if (!a || !b) {
        ts_set_error(s->ctx, TS_ERR_INVALID_ARG, "%s: %s is NULL", what,
                     !a ? na : nb);
        return false;
    }
    if (ts_tensor_dtype(a) != TS_F32 || ts_tensor_dtype(b) != TS_F32) {
        ts_set_error(s->ctx, TS_ERR_DTYPE,
                     "%s: %s and %s must be f32 (got "
                     "%s, %s)",
                     what, na, nb, ts_dtype_name(ts_tensor_dtype(a)),
                     ts_dtype_name(ts_tensor_dtype(b)));
        return false;
    }
    int nd = ts_tensor_ndim(a);
    bool same = nd == ts_tensor_ndim(b);
    for (int d = 0; same && d < nd; d++)
        same = ts_tensor_shape(a)[d] == ts_tensor_shape(b)[d];
    if (!same) {
        ts_set_error(s->ctx, TS_ERR_SHAPE, "%s: %s and %s differ in shape",
                     what, na, nb);
        return false;
    }
    return true;
}

ts_tensor *ts_scheduler_scale_model_input(ts_scheduler *s, ts_tensor *sample,
                                          int i) {
    if (!s || !sample)
        return NULL;
    if (!check_step(s, i, "ts_scheduler_scale_model_input"))
        return NULL;
    if (s->kind != TS_SCHED_EULER)
        return ts_retain(sample);
    float sigma = s->sigmas[i];
    return div_scalar(sample, sqrtf(sigma * sigma + 1.0f));
}

ts_tensor *ts_scheduler_step(ts_scheduler *s, ts_tensor *model_output, int i,
                             ts_tensor *sample) {
    if (!s)
        return NULL;
    if (!check_step(s, i, "ts_scheduler_step") ||
        !check_pair(s, model_output, sample, "ts_scheduler_step",
                    "model_output", "sample"))
        return NULL;
    switch (s->kind) {
    case TS_SCHED_DDIM:
        return step_ddim(s, model_output, i, sample);
    case TS_SCHED_EULER:
        return step_euler(s, model_output, i, sample);
    case TS_SCHED_DPMPP_2M:
        return step_dpm(s, model_output, i, sample);
    default:
        return step_ddpm(s, model_output, i, sample);
    }
}

ts_status ts_scheduler_set_strength(ts_scheduler *s, double strength,
                                    int *t_start) {
    if (!s)
        return TS_ERR_INVALID_ARG;
    if (s->n == 0)
        return ts_set_error(s->ctx, TS_ERR_STATE,
                            "ts_scheduler_set_strength: call "
                            "ts_scheduler_set_timesteps first");
    if (!(strength >= 0 && strength <= 1))
        return ts_set_error(s->ctx, TS_ERR_RANGE,
                            "strength %g must be in [0, 1]", strength);
    int init = (int)((double)s->n * strength);
    init = init < s->n ? init : s->n;
    if (init < 1)
        return ts_set_error(s->ctx, TS_ERR_RANGE,
                            "strength %g leaves no step of %d (needs "
                            "strength >= 1/%d)",
                            strength, s->n, s->n);
    if (t_start)
        *t_start = s->n - init;
    drop_history(s);
    return TS_OK;
}

ts_tensor *ts_scheduler_add_noise(ts_scheduler *s, ts_tensor *original,
                                  ts_tensor *noise, int i) {
    if (!s)
        return NULL;
    if (!check_step(s, i, "ts_scheduler_add_noise") ||
        !check_pair(s, original, noise, "ts_scheduler_add_noise", "original",
                    "noise"))
        return NULL;
    if (s->kind == TS_SCHED_EULER)
        return lincomb(original, 1.0, noise, s->sigmas[i]);
    if (s->kind == TS_SCHED_DPMPP_2M) {
        float a, sg;
        alpha_sigma_of(s->sigmas[i], &a, &sg);
        return lincomb(original, a, noise, sg);
    }
    float ac = (float)s->ac[(int64_t)s->t[i]];
    return lincomb(original, sqrtf(ac), noise, sqrtf(1.0f - ac));
}

ts_tensor *ts_scheduler_add_noise_at(ts_scheduler *s, ts_tensor *original,
                                     ts_tensor *noise,
                                     const int64_t *train_timesteps) {
    if (!s)
        return NULL;
    if (!check_pair(s, original, noise, "ts_scheduler_add_noise_at", "original",
                    "noise"))
        return NULL;
    int nd = ts_tensor_ndim(original);
    if (nd < 1 || !train_timesteps) {
        ts_set_error(s->ctx, TS_ERR_INVALID_ARG,
                     "ts_scheduler_add_noise_at: original needs a batch dim "
                     "and train_timesteps one entry per row");
        return NULL;
    }
    int64_t B = ts_tensor_shape(original)[0];
    float *ca = malloc(sizeof(float) * (size_t)(B ? B : 1));
    float *cb = malloc(sizeof(float) * (size_t)(B ? B : 1));
    if (!ca || !cb) {
        free(ca), free(cb);
        ts_set_error(s->ctx, TS_ERR_OOM, "no memory");
        return NULL;
    }
    for (int64_t b = 0; b < B; b++) {
        int64_t t = train_timesteps[b];
        if (t < 0 || t >= s->n_train) {
            free(ca), free(cb);
            ts_set_error(s->ctx, TS_ERR_RANGE,
                         "ts_scheduler_add_noise_at: train_timesteps[%lld] = "
                         "%lld is outside 0 .. %d",
                         (long long)b, (long long)t, s->n_train - 1);
            return NULL;
        }
        float ac = (float)s->ac[t];
        ca[b] = sqrtf(ac), cb[b] = sqrtf(1.0f - ac);
    }
    int64_t shape[TS_MAX_DIMS];
    shape[0] = B;
    for (int d = 1; d < nd; d++)
        shape[d] = 1;
    ts_ctx *ctx = ts_tensor_ctx(original);
    ts_device dev = ts_tensor_device(original);
    ts_tensor *ta = ts_from_data(ctx, TS_F32, nd, shape, ca);
    ts_tensor *tb = ts_from_data(ctx, TS_F32, nd, shape, cb);
    free(ca), free(cb);
    ts_tensor *da = ta ? ts_to_device(ta, dev) : NULL;
    ts_tensor *db = tb ? ts_to_device(tb, dev) : NULL;
    ts_tensor *xa = da ? ts_mul(original, da) : NULL;
    ts_tensor *nb = db ? ts_mul(noise, db) : NULL;
    ts_tensor *r = xa && nb ? ts_add(xa, nb) : NULL;
    ts_release(ta), ts_release(tb), ts_release(da), ts_release(db);
    ts_release(xa), ts_release(nb);
    return r;
}
