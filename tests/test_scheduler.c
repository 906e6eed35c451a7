/* test_scheduler.c — the diffusion schedulers (src/models/scheduler.c)
 * against tests/ref/ref_schedulers.py, a PyTorch re-implementation of
 * Diffusers' DDIM, Euler discrete, DPM-Solver++ 2M and DDPM: timesteps
 * exactly, init_noise_sigma, a 25- and a 10-step sampling loop with a fake
 * model within 1e-5 of the largest reference value, img2img's start and
 * loop, eager == compiled, DDPM's training noise and step; bad configs and
 * calls give errors that name the key, file or step.
 * usage: test_scheduler OUT_DIR (written by ref_schedulers.py) */
#include "tessera_diffusion.h"
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>

static const char *g_dir;
static int64_t g_shape[4];
static double g_worst_loop; /* the largest loop error seen (relative) */
static int g_compiled_bit_equal, g_compiled_cases;

/* A (shape) f32 tensor from a JSON list of numbers. */
static ts_tensor *tensor_of(ts_ctx *ctx, json_t *list, int nd,
                            const int64_t *shape) {
    size_t n = json_array_size(list);
    float *v = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++)
        v[i] = (float)json_number_value(json_array_get(list, i));
    ts_tensor *t = ts_from_data(ctx, TS_F32, nd, shape, v);
    free(v);
    return t;
}

/* max |t - ref| / max(1, max |ref|) */
static double rel_err(ts_tensor *t, json_t *ref) {
    if (!t)
        return INFINITY;
    int64_t n = ts_tensor_numel(t);
    if ((size_t)n != json_array_size(ref))
        return INFINITY;
    float *v = malloc(sizeof(float) * (size_t)n);
    if (ts_tensor_read(t, v, TS_F32) != TS_OK) {
        free(v);
        return INFINITY;
    }
    double worst = 0, scale = 1;
    for (int64_t i = 0; i < n; i++) {
        double r = json_number_value(json_array_get(ref, (size_t)i));
        scale = fabs(r) > scale ? fabs(r) : scale;
    }
    for (int64_t i = 0; i < n; i++) {
        double r = json_number_value(json_array_get(ref, (size_t)i));
        double e = fabs((double)v[i] - r);
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    free(v);
    return worst / scale;
}

static ts_tensor *fake_model(ts_tensor *x, double t) {
    ts_tensor *a = ts_mul_scalar(x, 0.5);
    ts_tensor *b = ts_add_scalar(a, t / 1000.0);
    ts_tensor *c = ts_tanh(b);
    ts_release(a), ts_release(b);
    return c;
}

/* The sampling loop from latents at step start; returns the final sample. */
static ts_tensor *run_loop(ts_scheduler *s, ts_tensor *latents, int start) {
    ts_tensor *x = ts_retain(latents);
    for (int i = start; x && i < ts_scheduler_num_steps(s); i++) {
        ts_tensor *in = ts_scheduler_scale_model_input(s, x, i);
        ts_tensor *mo = in ? fake_model(in, ts_scheduler_timestep(s, i)) : NULL;
        ts_tensor *nx = mo ? ts_scheduler_step(s, mo, i, x) : NULL;
        ts_release(in), ts_release(mo), ts_release(x);
        x = nx;
    }
    return x;
}

static ts_scheduler *load_case(ts_ctx *ctx, json_t *c) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/scheduler_config.json", g_dir,
             json_string_value(json_object_get(c, "name")));
    ts_scheduler *s = NULL;
    CHECK_OK(ctx, ts_scheduler_load(ctx, path, &s));
    json_t *k = json_object_get(c, "kind");
    if (s && json_is_string(k))
        CHECK_OK(ctx, ts_scheduler_set_kind(s, json_string_value(k)));
    return s;
}

static void check_case(ts_ctx *ctx, ts_ctx *cc, json_t *c, json_t *doc) {
    const char *name = json_string_value(json_object_get(c, "name"));
    ts_scheduler *s = load_case(ctx, c);
    if (!s)
        return;
    ts_tensor *noise =
        tensor_of(ctx, json_object_get(doc, "noise"), 4, g_shape);
    const int steps[2] = {25, 10};
    for (int k = 0; k < 2; k++) {
        int n = steps[k];
        char key[32];
        CHECK_OK(ctx, ts_scheduler_set_timesteps(s, n));
        CHECK(ts_scheduler_num_steps(s) == n);
        snprintf(key, sizeof key, "timesteps_%d", n);
        json_t *ts = json_object_get(c, key);
        /* exact, except Euler's "continuous" 0.25 log(sigma), whose log
         * may differ from torch's in the last bit */
        double ttol = strstr(name, "continuous") ? 1e-6 : 0;
        int bad = 0;
        for (int i = 0; i < n; i++) {
            double r = json_number_value(json_array_get(ts, (size_t)i));
            if (!(fabs(ts_scheduler_timestep(s, i) - r) <= ttol * fabs(r)))
                bad++;
        }
        CHECK(bad == 0);
        if (bad)
            fprintf(stderr, "%s: %d of %d timesteps differ (first: %g vs %g)\n",
                    name, bad, n, ts_scheduler_timestep(s, 0),
                    json_number_value(json_array_get(ts, 0)));
        snprintf(key, sizeof key, "init_sigma_%d", n);
        double sig = json_number_value(json_object_get(c, key));
        CHECK_NEAR(ts_scheduler_init_noise_sigma(s), sig, 1e-6 * sig);
        ts_tensor *lat = ts_mul_scalar(noise, ts_scheduler_init_noise_sigma(s));
        ts_tensor *out = run_loop(s, lat, 0);
        snprintf(key, sizeof key, "loop_%d", n);
        double e = rel_err(out, json_object_get(c, key));
        g_worst_loop = e > g_worst_loop ? e : g_worst_loop;
        CHECK(e <= 1e-5);
        if (!(e <= 1e-5))
            fprintf(stderr, "%s: %d-step loop off by %.3g (relative)\n", name,
                    n, e);
        /* the same loop recorded and compiled */
        if (n == 25) {
            ts_scheduler *sc = load_case(cc, c);
            ts_tensor *nc =
                tensor_of(cc, json_object_get(doc, "noise"), 4, g_shape);
            CHECK_OK(cc, ts_scheduler_set_timesteps(sc, n));
            ts_set_mode(cc, TS_MODE_COMPILED);
            ts_tensor *latc =
                ts_mul_scalar(nc, ts_scheduler_init_noise_sigma(sc));
            ts_tensor *outc = run_loop(sc, latc, 0);
            CHECK_OK(cc, ts_sync(cc));
            ts_set_mode(cc, TS_MODE_EAGER);
            float a[24], b[24];
            CHECK(ts_tensor_numel(out) == 24);
            if (outc && ts_tensor_read(out, a, TS_F32) == TS_OK &&
                ts_tensor_read(outc, b, TS_F32) == TS_OK) {
                g_compiled_cases++;
                g_compiled_bit_equal += !memcmp(a, b, sizeof a);
                double ec = rel_err(outc, json_object_get(c, key));
                CHECK(ec <= 1e-5);
            } else {
                CHECK(!"compiled loop failed");
            }
            ts_release(latc), ts_release(outc), ts_release(nc);
            ts_scheduler_free(sc);
        }
        ts_release(lat), ts_release(out);
    }
    /* img2img: strength 0.6 of 25 steps, noise added at t_start, the rest */
    CHECK_OK(ctx, ts_scheduler_set_timesteps(s, 25));
    int t_start = -1;
    CHECK_OK(ctx, ts_scheduler_set_strength(s, 0.6, &t_start));
    CHECK(t_start == json_integer_value(json_object_get(c, "t_start")));
    ts_tensor *orig = tensor_of(ctx, json_object_get(doc, "orig"), 4, g_shape);
    ts_tensor *n2 = tensor_of(ctx, json_object_get(doc, "noise2"), 4, g_shape);
    ts_tensor *noisy = ts_scheduler_add_noise(s, orig, n2, t_start);
    double e = rel_err(noisy, json_object_get(c, "add_noise"));
    CHECK(e <= 1e-6);
    if (!(e <= 1e-6))
        fprintf(stderr, "%s: add_noise off by %.3g\n", name, e);
    ts_tensor *out = noisy ? run_loop(s, noisy, t_start) : NULL;
    e = rel_err(out, json_object_get(c, "img2img"));
    CHECK(e <= 1e-5);
    if (!(e <= 1e-5))
        fprintf(stderr, "%s: img2img loop off by %.3g\n", name, e);
    ts_release(orig), ts_release(n2), ts_release(noisy), ts_release(out);
    ts_release(noise);
    ts_scheduler_free(s);
}

static void check_ddpm(ts_ctx *ctx, json_t *c, json_t *doc) {
    const char *name = json_string_value(json_object_get(c, "name"));
    ts_scheduler *s = load_case(ctx, c);
    if (!s)
        return;
    CHECK(ts_scheduler_get_kind(s) == TS_SCHED_DDPM);
    int n = 0;
    const double *ac = ts_scheduler_alphas_cumprod(s, &n);
    json_t *rac = json_object_get(c, "alphas_cumprod");
    CHECK(n == (int)json_array_size(rac));
    int exact = 0;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double r = json_number_value(json_array_get(rac, (size_t)i));
        exact += ac[i] == r;
        double e = fabs(ac[i] - r) / r;
        worst = e > worst ? e : worst;
    }
    CHECK(worst <= 1e-6);
    printf("%s: %d of %d alphas_cumprod bit-equal to torch's (worst %.3g)\n",
           name, exact, n, worst);
    int64_t shp[4] = {4, 3, 2, 2};
    ts_tensor *x = tensor_of(ctx, json_object_get(c, "x"), 4, shp);
    ts_tensor *nz = tensor_of(ctx, json_object_get(c, "noise"), 4, shp);
    int64_t tt[4];
    for (int b = 0; b < 4; b++)
        tt[b] = json_integer_value(
            json_array_get(json_object_get(c, "train_t"), (size_t)b));
    ts_tensor *noisy = ts_scheduler_add_noise_at(s, x, nz, tt);
    CHECK(rel_err(noisy, json_object_get(c, "noisy")) <= 1e-6);
    ts_release(noisy);
    int64_t bad_t[4] = {0, 1, 1000, 2};
    CHECK(ts_scheduler_add_noise_at(s, x, nz, bad_t) == NULL);
    CHECK_MSG(ctx, "train_timesteps[2] = 1000");
    ts_release(x), ts_release(nz);
    /* one step: the reference's mean + std * ts_randn(seed + i) */
    CHECK_OK(ctx, ts_scheduler_set_timesteps(s, 10));
    json_t *ts = json_object_get(c, "timesteps_10");
    for (int i = 0; i < 10; i++)
        CHECK(ts_scheduler_timestep(s, i) ==
              json_number_value(json_array_get(ts, (size_t)i)));
    ts_scheduler_set_seed(s, 7);
    ts_tensor *smp = tensor_of(ctx, json_object_get(doc, "noise"), 4, g_shape);
    size_t k;
    json_t *st;
    json_array_foreach(json_object_get(c, "steps"), k, st) {
        int i = (int)json_integer_value(json_object_get(st, "i"));
        double std = json_number_value(json_object_get(st, "std"));
        ts_tensor *mo = fake_model(smp, ts_scheduler_timestep(s, i));
        ts_tensor *out = ts_scheduler_step(s, mo, i, smp);
        ts_tensor *mean =
            tensor_of(ctx, json_object_get(st, "mean"), 4, g_shape);
        ts_tensor *z = ts_randn(ctx, TS_F32, 4, g_shape, 1.0, 7 + (uint64_t)i);
        ts_tensor *zs = ts_mul_scalar(z, std);
        ts_tensor *want = ts_add(mean, zs);
        CHECK(test_allclose(name, out, want, 1e-5, 1e-5));
        ts_release(mo), ts_release(out), ts_release(mean), ts_release(z);
        ts_release(zs), ts_release(want);
    }
    ts_release(smp);
    ts_scheduler_free(s);
}

/* ---- errors ------------------------------------------------------------- */

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* Loading text as a config fails with status st and a message holding
 * needle (and the file's name). */
static void check_bad_config(ts_ctx *ctx, const char *text, ts_status st,
                             const char *needle) {
    char path[1024];
    snprintf(path, sizeof path, "%s/bad_config.json", g_dir);
    write_file(path, text);
    ts_scheduler *s = (ts_scheduler *)1;
    ts_status got = ts_scheduler_load(ctx, path, &s);
    CHECK(got == st);
    CHECK(s == NULL);
    CHECK_MSG(ctx, needle);
    CHECK_MSG(ctx, "bad_config.json");
    if (got != st)
        fprintf(stderr, "  for %s: got %s: %s\n", needle, ts_status_name(got),
                ts_errmsg(ctx));
    ts_clear_error(ctx);
}

static void test_errors(ts_ctx *ctx) {
    ts_scheduler *s = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/no_such_dir/scheduler_config.json", g_dir);
    CHECK(ts_scheduler_load(ctx, path, &s) == TS_ERR_IO);
    CHECK_MSG(ctx, "no_such_dir/scheduler_config.json");
    check_bad_config(ctx, "{\"_class_name\": \"DDIMScheduler\",", TS_ERR_IO,
                     "not a JSON object");
    check_bad_config(ctx, "{\"beta_schedule\": \"linear\"}", TS_ERR_INVALID_ARG,
                     "_class_name");
    check_bad_config(ctx, "{\"_class_name\": \"LMSDiscreteScheduler\"}",
                     TS_ERR_UNSUPPORTED, "LMSDiscreteScheduler");
    check_bad_config(ctx,
                     "{\"_class_name\": \"DDIMScheduler\", \"beta_schedule\": "
                     "\"cosine\"}",
                     TS_ERR_INVALID_ARG,
                     "\"beta_schedule\": unknown value "
                     "\"cosine\"");
    check_bad_config(ctx,
                     "{\"_class_name\": \"EulerDiscreteScheduler\", "
                     "\"prediction_type\": \"flow\"}",
                     TS_ERR_INVALID_ARG, "prediction_type");
    check_bad_config(ctx,
                     "{\"_class_name\": \"DPMSolverMultistepScheduler\", "
                     "\"timestep_spacing\": \"uniform\"}",
                     TS_ERR_INVALID_ARG, "timestep_spacing");
    check_bad_config(ctx,
                     "{\"_class_name\": \"EulerDiscreteScheduler\", "
                     "\"use_karras_sigmas\": true}",
                     TS_ERR_UNSUPPORTED, "use_karras_sigmas");
    check_bad_config(ctx,
                     "{\"_class_name\": \"DPMSolverMultistepScheduler\", "
                     "\"algorithm_type\": \"sde-dpmsolver++\"}",
                     TS_ERR_UNSUPPORTED,
                     "\"algorithm_type\": \"sde-dpmsolver++\"");
    check_bad_config(ctx,
                     "{\"_class_name\": \"DPMSolverMultistepScheduler\", "
                     "\"algorithm_type\": \"dpm\"}",
                     TS_ERR_INVALID_ARG, "unknown value \"dpm\"");
    check_bad_config(ctx,
                     "{\"_class_name\": \"EulerDiscreteScheduler\", "
                     "\"interpolation_type\": \"log_linear\"}",
                     TS_ERR_UNSUPPORTED, "interpolation_type");
    check_bad_config(ctx,
                     "{\"_class_name\": \"DPMSolverMultistepScheduler\", "
                     "\"solver_order\": 3}",
                     TS_ERR_UNSUPPORTED, "solver_order");
    check_bad_config(ctx,
                     "{\"_class_name\": \"DDIMScheduler\", "
                     "\"num_train_timesteps\": \"1000\"}",
                     TS_ERR_INVALID_ARG, "num_train_timesteps");
    check_bad_config(ctx,
                     "{\"_class_name\": \"DDIMScheduler\", "
                     "\"thresholding\": true}",
                     TS_ERR_UNSUPPORTED, "thresholding");
    check_bad_config(ctx,
                     "{\"_class_name\": \"DDPMScheduler\", "
                     "\"variance_type\": \"learned_range\"}",
                     TS_ERR_UNSUPPORTED, "variance_type");
    check_bad_config(ctx,
                     "{\"_class_name\": \"DDIMScheduler\", "
                     "\"trained_betas\": [0.1, 0.2]}",
                     TS_ERR_INVALID_ARG, "trained_betas");

    /* calls: steps out of range, unknown kind, order of DPM's steps */
    snprintf(path, sizeof path, "%s/dpm_defaults/scheduler_config.json", g_dir);
    CHECK_OK(ctx, ts_scheduler_load(ctx, path, &s));
    if (!s)
        return;
    CHECK(ts_scheduler_get_kind(s) == TS_SCHED_DPMPP_2M);
    CHECK(ts_scheduler_num_train_timesteps(s) == 1000);
    CHECK(!strcmp(ts_scheduler_prediction_type(s), "epsilon"));
    CHECK(ts_scheduler_set_timesteps(s, 0) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "num_inference_steps 0");
    CHECK_MSG(ctx, "dpm_defaults/scheduler_config.json");
    CHECK(ts_scheduler_set_timesteps(s, 1001) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "num_train_timesteps (1000)");
    ts_tensor *x = ts_zeros(ctx, TS_F32, 4, g_shape);
    CHECK(ts_scheduler_step(s, x, 0, x) == NULL); /* before set_timesteps */
    CHECK_MSG(ctx, "set_timesteps first");
    CHECK(ts_scheduler_set_kind(s, "lms") == TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "known: ddim, euler, dpm++2m");
    CHECK(ts_scheduler_get_kind(s) == TS_SCHED_DPMPP_2M);
    CHECK_OK(ctx, ts_scheduler_set_timesteps(s, 10));
    CHECK(ts_scheduler_step(s, x, 10, x) == NULL);
    CHECK_MSG(ctx, "step 10 is outside 0 .. 9");
    ts_tensor *y = ts_scheduler_step(s, x, 0, x);
    CHECK(y != NULL);
    CHECK(ts_scheduler_step(s, x, 5, x) == NULL);
    CHECK_MSG(ctx, "step 5 after step 0");
    int64_t other[2] = {2, 12};
    ts_tensor *z = ts_zeros(ctx, TS_F32, 2, other);
    CHECK(ts_scheduler_step(s, z, 1, x) == NULL);
    CHECK_MSG(ctx, "differ in shape");
    int t_start;
    CHECK(ts_scheduler_set_strength(s, 0.05, &t_start) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "strength 0.05 leaves no step");
    CHECK(ts_scheduler_set_strength(s, 1.5, &t_start) == TS_ERR_RANGE);
    CHECK_OK(ctx, ts_scheduler_set_strength(s, 1.0, &t_start));
    CHECK(t_start == 0);
    /* set_kind switches the defaults: a DPM config run as DDIM */
    CHECK_OK(ctx, ts_scheduler_set_kind(s, "ddim"));
    CHECK(ts_scheduler_get_kind(s) == TS_SCHED_DDIM);
    CHECK(ts_scheduler_num_steps(s) == 0);
    CHECK_OK(ctx, ts_scheduler_set_timesteps(s, 10));
    CHECK(ts_scheduler_timestep(s, 0) == 900); /* DDIM's "leading" */
    ts_release(x), ts_release(y), ts_release(z);
    ts_scheduler_free(s);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_scheduler OUT_DIR\n");
        return 2;
    }
    g_dir = argv[1];
    char path[1024];
    snprintf(path, sizeof path, "%s/cases.json", g_dir);
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    if (!doc) {
        fprintf(stderr, "cannot read %s: %s\n", path, je.text);
        return 1;
    }
    for (int d = 0; d < 4; d++)
        g_shape[d] = json_integer_value(
            json_array_get(json_object_get(doc, "shape"), (size_t)d));
    ts_ctx *ctx = test_ctx(), *cc = test_ctx();
    size_t k;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), k, c)
        check_case(ctx, cc, c, doc);
    json_array_foreach(json_object_get(doc, "ddpm"), k, c)
        check_ddpm(ctx, c, doc);
    printf("%zu scheduler cases: worst loop error %.3g (relative); compiled "
           "loops bit-equal to eager: %d of %d\n",
           json_array_size(json_object_get(doc, "cases")), g_worst_loop,
           g_compiled_bit_equal, g_compiled_cases);
    test_errors(ctx);
    json_decref(doc);
    ts_ctx_free(ctx), ts_ctx_free(cc);
    return test_finish("test_scheduler");
}
