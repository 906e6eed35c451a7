/* test_pipeline.c — whole Diffusers pipelines (ts_pipeline_load,
 * ts_pipeline_generate) on the tiny folders tests/ref/ref_pipeline.py writes
 * (argv[1]) against its plain-PyTorch StableDiffusionPipeline /
 * DiTPipeline loops from the same initial latents: each case of cases.json
 * (DDIM, Euler, DPM++ 2M; guidance on and off; negative prompt; two
 * images; DiT with a VAE and in pixel space) gives the reference image and,
 * with latents_only, the reference latents within 1e-4 of max(1, max|ref|);
 * image-to-image against the reference given the same noise; compiled ==
 * eager; every placement (balanced, per component, the UNet split, CFG
 * over two devices) == one device, bit for bit, and the batch over two
 * devices within 1e-5; a request without a scheduler runs the folder's;
 * bf16 weights within a stated bound; class labels; load and request errors
 * naming the fault. */
#include "tessera_diffusion.h"
#include "tessera_io.h"
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define F32_TOL  1e-4 /* of max(1, max|ref|) */
#define BF16_TOL 5e-2 /* bf16 weights, whole pipeline, vs the f32 reference */

static const char *root;
static json_t *doc;
static ts_safetensors *ref;

static float *read_all(ts_tensor *t) {
    int64_t n = ts_tensor_numel(t);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (v && ts_tensor_read(t, v, TS_F32) != TS_OK) {
        free(v);
        return NULL;
    }
    return v;
}

static bool same_shape(ts_tensor *a, ts_tensor *b) {
    return a && b && ts_tensor_ndim(a) == ts_tensor_ndim(b) &&
           !memcmp(ts_tensor_shape(a), ts_tensor_shape(b),
                   sizeof(int64_t) * (size_t)ts_tensor_ndim(a));
}

/* max |a - ref| / max(1, max |ref|); 1e30 when shapes differ */
static double rel_err(ts_tensor *a, ts_tensor *b) {
    if (!same_shape(a, b))
        return 1e30;
    float *x = read_all(a), *y = read_all(b);
    double d = 0, m = 1;
    for (int64_t i = 0; x && y && i < ts_tensor_numel(a); i++) {
        double e = fabs((double)x[i] - (double)y[i]);
        d = e > d || isnan(e) ? e : d;
        m = fabs((double)y[i]) > m ? fabs((double)y[i]) : m;
    }
    if (!x || !y)
        d = 1e30;
    free(x), free(y);
    return d / m;
}

static bool same_bits(ts_tensor *a, ts_tensor *b) {
    if (!same_shape(a, b))
        return false;
    float *x = read_all(a), *y = read_all(b);
    bool same =
        x && y && !memcmp(x, y, sizeof(float) * (size_t)ts_tensor_numel(a));
    free(x), free(y);
    return same;
}

static void check_close(const char *what, ts_tensor *a, ts_tensor *b,
                        double tol) {
    double e = rel_err(a, b);
    ts_test_checks++;
    if (!(e <= tol)) {
        ts_test_failures++;
        fprintf(stderr, "%s: rel err %.3g > %.1g\n", what, e, tol);
    }
}

static ts_tensor *ref_get(const char *name, const char *what) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", name, what);
    ts_tensor *t = ts_safetensors_get(ref, k);
    if (!t)
        fprintf(stderr, "ref.safetensors lacks %s\n", k);
    return t;
}

static json_t *find_case(const char *name) {
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), i, c) {
        if (!strcmp(json_string_value(json_object_get(c, "name")), name))
            return c;
    }
    fprintf(stderr, "cases.json lacks %s\n", name);
    exit(1);
}

static const char *jstr(json_t *c, const char *key) {
    return json_string_value(json_object_get(c, key)); /* NULL: null/absent */
}

static ts_pipeline *load(ts_ctx *ctx, const char *folder,
                         const ts_pipeline_opts *o) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, folder);
    ts_pipeline *pl = NULL;
    CHECK_OK(ctx, ts_pipeline_load(ctx, p, o, &pl));
    return pl;
}

/* The request of case c (its noise as the latents); the tensors it holds
 * are released by request_done. */
static ts_diffusion_request request_of(ts_pipeline *p, json_t *c) {
    const char *name = jstr(c, "name");
    ts_diffusion_request r = {0};
    r.prompt = jstr(c, "prompt");
    r.negative_prompt = jstr(c, "negative_prompt");
    json_t *labels = json_object_get(c, "class_labels");
    if (labels) {
        r.class_id = ts_pipeline_class_id(
            p, json_string_value(json_array_get(labels, 0)));
        CHECK(r.class_id == json_integer_value(json_array_get(
                                json_object_get(c, "class_ids"), 0)));
    }
    r.num_images = (int)json_integer_value(json_object_get(c, "num_images"));
    r.steps = (int)json_integer_value(json_object_get(c, "steps"));
    r.guidance = json_real_value(json_object_get(c, "guidance"));
    r.width = (int)json_integer_value(json_object_get(c, "width"));
    r.height = (int)json_integer_value(json_object_get(c, "height"));
    r.scheduler = jstr(c, "scheduler");
    r.seed = 7;
    r.latents = ref_get(name, "noise");
    return r;
}

static void request_done(ts_diffusion_request *r) {
    ts_release(r->latents);
    ts_release(r->init_image);
}

/* case name on p: the image, and the latents with latents_only */
static ts_tensor *run(ts_ctx *ctx, ts_pipeline *p, const char *name,
                      bool latents_only) {
    ts_diffusion_request r = request_of(p, find_case(name));
    r.latents_only = latents_only;
    ts_tensor *out = NULL;
    CHECK_OK(ctx, ts_pipeline_generate(p, &r, &out));
    request_done(&r);
    return out;
}

/* ---- every case against the reference ---- */

static void test_cases(ts_ctx *ctx, const char *folder) {
    ts_pipeline *p = load(ctx, folder, NULL);
    if (!p)
        return;
    char buf[1024];
    ts_pipeline_describe(p, buf, sizeof buf);
    printf("%s:\n%s", folder, buf);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), i, c) {
        const char *name = jstr(c, "name");
        if (strcmp(jstr(c, "pipeline"), folder) ||
            json_object_get(c, "strength"))
            continue;
        ts_tensor *img = run(ctx, p, name, false);
        ts_tensor *lat = run(ctx, p, name, true);
        ts_tensor *rimg = ref_get(name, "image"),
                  *rlat = ref_get(name, "latents");
        char what[200];
        snprintf(what, sizeof what, "%s image", name);
        check_close(what, img, rimg, F32_TOL);
        snprintf(what, sizeof what, "%s latents", name);
        check_close(what, lat, rlat, F32_TOL);
        printf("  %-22s image rel %.3g, latents rel %.3g\n", name,
               rel_err(img, rimg), rel_err(lat, rlat));
        CHECK(img && ts_tensor_device(img).kind == TS_DEVICE_CPU &&
              ts_tensor_dtype(img) == TS_F32);
        ts_release(img), ts_release(lat), ts_release(rimg), ts_release(rlat);
    }
    ts_pipeline_free(p);
}

/* ---- image-to-image ---- */

static void test_img2img(ts_ctx *ctx) {
    ts_pipeline *p = load(ctx, "sd", NULL);
    if (!p)
        return;
    const char *names[] = {"sd_img2img_ddim", "sd_img2img_euler"};
    for (int k = 0; k < 2; k++) {
        json_t *c = find_case(names[k]);
        ts_diffusion_request r = request_of(p, c);
        ts_release(r.latents);
        r.latents = ref_get(names[k], "noise");
        r.init_image = ref_get("init", "image");
        r.strength = json_real_value(json_object_get(c, "strength"));
        r.seed = (uint64_t)json_integer_value(json_object_get(c, "seed"));
        /* the reference's posterior draw is ts_randn(seed + 1), as the
         * pipeline draws it */
        ts_tensor *eps = ref_get(names[k], "eps");
        ts_tensor *mine = ts_randn(ctx, TS_F32, ts_tensor_ndim(eps),
                                   ts_tensor_shape(eps), 1.0, r.seed + 1);
        CHECK(rel_err(mine, eps) <= 1e-6);
        ts_release(eps), ts_release(mine);
        ts_tensor *img = NULL;
        CHECK_OK(ctx, ts_pipeline_generate(p, &r, &img));
        ts_tensor *rimg = ref_get(names[k], "image");
        CHECK(same_shape(img, rimg));
        printf("  %-22s image vs the reference with the same noise: rel "
               "%.3g\n",
               names[k], rel_err(img, rimg));
        check_close(names[k], img, rimg, F32_TOL);
        /* the same request twice: the same image */
        ts_tensor *again = NULL;
        CHECK_OK(ctx, ts_pipeline_generate(p, &r, &again));
        CHECK(same_bits(img, again));
        /* strength out of range */
        r.strength = 1.5;
        ts_tensor *bad = NULL;
        CHECK(ts_pipeline_generate(p, &r, &bad) != TS_OK && !bad);
        CHECK_MSG(ctx, "strength");
        request_done(&r);
        ts_release(img), ts_release(rimg), ts_release(again);
    }
    ts_pipeline_free(p);
}

/* ---- a request without a scheduler runs the folder's ---- */

static void test_scheduler_default(ts_ctx *ctx) {
    ts_pipeline *p = load(ctx, "sd", NULL);
    if (!p)
        return;
    ts_release(run(ctx, p, "sd_euler_cfg", false));
    ts_diffusion_request r = request_of(p, find_case("sd_ddim_cfg"));
    r.scheduler = NULL; /* the folder's DDIMScheduler */
    ts_tensor *img = NULL, *want = ref_get("sd_ddim_cfg", "image");
    CHECK_OK(ctx, ts_pipeline_generate(p, &r, &img));
    double e = rel_err(img, want);
    printf("  no scheduler after an euler request: rel %.3g to the folder's "
           "DDIM\n",
           e);
    check_close("the folder's scheduler after euler", img, want, F32_TOL);
    request_done(&r);
    ts_release(img), ts_release(want);
    ts_pipeline_free(p);
}

/* ---- compiled == eager ---- */

static void test_compiled(ts_ctx *ctx, const char *folder, const char *name) {
    ts_pipeline *p = load(ctx, folder, NULL);
    if (!p)
        return;
    ts_tensor *eager = run(ctx, p, name, false);
    ts_set_mode(ctx, TS_MODE_COMPILED);
    ts_tensor *comp = run(ctx, p, name, false);
    ts_tensor *comp2 = run(ctx, p, name, false); /* the cached plans */
    ts_set_mode(ctx, TS_MODE_EAGER);
    double e = rel_err(comp, eager);
    printf("  %s compiled vs eager: %s (rel %.3g); replayed: %s\n", name,
           same_bits(comp, eager) ? "same bits" : "differ", e,
           same_bits(comp2, comp) ? "same bits" : "differ");
    CHECK(e <= 1e-6);
    CHECK(same_bits(comp2, comp));
    ts_release(eager), ts_release(comp), ts_release(comp2);
    ts_pipeline_free(p);
}

/* ---- placement: every map gives the one-device bits ---- */

/* Splitting a batch over devices runs each replica's products on fewer
 * rows, and the kernels' blocking (and so the order of their sums) depends
 * on the row count: the same images within BATCH_SPLIT_TOL, not bit for bit.
 * Every other placement runs the same shapes and gives the same bits. */
#define BATCH_SPLIT_TOL 1e-5

static void placed(ts_ctx *ctx, const char *folder, const char *name,
                   ts_tensor *want, const ts_pipeline_opts *o,
                   const char *expect_in_describe) {
    ts_device_stats before, after;
    ts_device d1 = {TS_DEVICE_CPU, 1};
    ts_pipeline *p = load(ctx, folder, o);
    if (!p)
        return;
    char buf[1024];
    ts_pipeline_describe(p, buf, sizeof buf);
    ts_device_get_stats(ctx, d1, &before);
    ts_tensor *got = run(ctx, p, name, false);
    ts_device_get_stats(ctx, d1, &after);
    bool same = same_bits(got, want);
    printf("  %s devices %s map %s cfg_parallel %d batch_devices %d: %s "
           "(rel %.3g)\n",
           name, o->devices ? o->devices : "-",
           o->device_map ? o->device_map : "-", o->cfg_parallel,
           o->batch_devices, same ? "same bits" : "DIFFERS",
           rel_err(got, want));
    if (o->batch_devices > 1)
        check_close("batch over two devices", got, want, BATCH_SPLIT_TOL);
    else
        CHECK(same);
    CHECK(got && ts_tensor_device(got).index == 0);
    /* cpu:1 did work: weights placed there and activations moved there */
    CHECK(after.transfers_in > before.transfers_in);
    if (expect_in_describe && !strstr(buf, expect_in_describe)) {
        ts_test_checks++, ts_test_failures++;
        fprintf(stderr, "describe lacks \"%s\":\n%s", expect_in_describe, buf);
    }
    ts_release(got);
    ts_pipeline_free(p);
}

static void test_placement(ts_ctx *ctx) {
    ts_pipeline *p = load(ctx, "sd", NULL);
    if (!p)
        return;
    ts_tensor *one = run(ctx, p, "sd_ddim_cfg", false);
    ts_tensor *two = run(ctx, p, "sd_ddim_neg_2", false);
    ts_pipeline_free(p);
    const char *devs = "cpu:0,cpu:1";
    ts_pipeline_opts o[] = {
        {.devices = devs, .device_map = "balanced"},
        {.device_map = "unet=cpu:1,vae=cpu:0,text_encoder=cpu:0"},
        {.device_map = "text_encoder=cpu:1,vae=cpu:1"},
        {.device_map = "unet=cpu:0+cpu:1"},
        {.device_map = "unet=cpu:0+cpu:1@2"},
        {.devices = devs, .cfg_parallel = true},
    };
    const char *expect[] = {"cpu:1", "unet: cpu:1", "vae: cpu:1",
                            "cpu:1", "cpu:1",       NULL};
    for (size_t k = 0; k < sizeof o / sizeof o[0]; k++)
        placed(ctx, "sd", "sd_ddim_cfg", one, &o[k], expect[k]);
    ts_pipeline_opts b = {.devices = devs, .batch_devices = 2};
    placed(ctx, "sd", "sd_ddim_neg_2", two, &b, NULL);
    ts_pipeline_opts cb = {.devices = devs, .cfg_parallel = true};
    placed(ctx, "sd", "sd_ddim_neg_2", two, &cb, NULL);
    ts_release(one), ts_release(two);

    p = load(ctx, "dit", NULL);
    if (!p)
        return;
    ts_tensor *d = run(ctx, p, "dit_ddim_cfg", false);
    ts_pipeline_free(p);
    ts_pipeline_opts od[] = {
        {.devices = devs, .device_map = "balanced"},
        {.device_map = "transformer=cpu:1"},
        {.devices = devs, .cfg_parallel = true},
        {.devices = devs, .batch_devices = 2},
    };
    for (size_t k = 0; k < sizeof od / sizeof od[0]; k++)
        placed(ctx, "dit", "dit_ddim_cfg", d, &od[k], NULL);
    ts_release(d);
}

/* ---- bf16 weights ---- */

static void test_bf16(ts_ctx *ctx) {
    ts_pipeline_opts o = {.dtype = TS_BF16};
    const char *cases[][2] = {{"sd", "sd_ddim_cfg"}, {"dit", "dit_ddim_cfg"}};
    for (int k = 0; k < 2; k++) {
        ts_pipeline *p = load(ctx, cases[k][0], &o);
        if (!p)
            continue;
        ts_tensor *img = run(ctx, p, cases[k][1], false);
        ts_tensor *rimg = ref_get(cases[k][1], "image");
        printf("  %s bf16 weights vs the f32 reference: image rel %.3g "
               "(bound %.0g)\n",
               cases[k][1], rel_err(img, rimg), BF16_TOL);
        check_close("bf16 image", img, rimg, BF16_TOL);
        ts_release(img), ts_release(rimg);
        ts_pipeline_free(p);
    }
}

/* ---- class labels ---- */

static void test_labels(ts_ctx *ctx) {
    ts_pipeline *p = load(ctx, "dit", NULL);
    if (!p)
        return;
    CHECK(ts_pipeline_is_class_conditional(p));
    CHECK(ts_pipeline_num_classes(p) == 10);
    CHECK(ts_pipeline_class_id(p, "tench") == 0);
    CHECK(ts_pipeline_class_id(p, "Tinca tinca") == 0);
    CHECK(ts_pipeline_class_id(p, "Carassius auratus") == 1);
    CHECK(ts_pipeline_class_id(p, "GOLDFISH") == 1);
    CHECK(ts_pipeline_class_id(p, "great white shark") == 2);
    CHECK(ts_pipeline_class_id(p, "7") == 7);
    CHECK(ts_pipeline_class_id(p, "unicorn") == -1);
    CHECK_MSG(ctx, "unicorn");
    int w = 0, h = 0;
    ts_pipeline_default_size(p, &w, &h);
    CHECK(w == 16 && h == 16);
    ts_pipeline_free(p);
    p = load(ctx, "dit_pixel", NULL);
    if (p) {
        ts_pipeline_default_size(p, &w, &h);
        CHECK(w == 16 && h == 16);
        ts_pipeline_free(p);
    }
    p = load(ctx, "sd", NULL);
    if (p) {
        CHECK(!ts_pipeline_is_class_conditional(p));
        ts_pipeline_default_size(p, &w, &h);
        CHECK(w == 64 && h == 64);
        ts_pipeline_free(p);
    }
}

/* ---- errors ---- */

static void load_fails(ts_ctx *ctx, const char *folder, const char *needle) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, folder);
    ts_pipeline *pl = NULL;
    ts_status s = ts_pipeline_load(ctx, p, NULL, &pl);
    CHECK(s != TS_OK && !pl);
    CHECK_MSG(ctx, needle);
    printf("  %s: %s\n", folder, ts_errmsg(ctx));
    ts_pipeline_free(pl);
}

static void generate_fails(ts_ctx *ctx, ts_pipeline *p, ts_diffusion_request *r,
                           const char *needle) {
    ts_tensor *out = NULL;
    CHECK(ts_pipeline_generate(p, r, &out) != TS_OK && !out);
    CHECK_MSG(ctx, needle);
    printf("  request: %s\n", ts_errmsg(ctx));
    ts_release(out);
}

/* a text encoder of hidden size 48 before a UNet whose
 * cross_attention_dim is 32: an error naming the sizes, at load or at
 * the first request */
static void cross_dim_fails(ts_ctx *ctx) {
    char p[1024];
    snprintf(p, sizeof p, "%s/err_cross_dim", root);
    ts_pipeline *pl = NULL;
    if (ts_pipeline_load(ctx, p, NULL, &pl) == TS_OK) {
        ts_diffusion_request r = request_of(pl, find_case("sd_ddim_cfg"));
        generate_fails(ctx, pl, &r, "48");
        CHECK_MSG(ctx, "32");
        request_done(&r);
        ts_pipeline_free(pl);
        return;
    }
    CHECK_MSG(ctx, "48");
    CHECK_MSG(ctx, "32");
    printf("  err_cross_dim: %s\n", ts_errmsg(ctx));
}

static void test_errors(ts_ctx *ctx) {
    load_fails(ctx, "no_such_folder", "no_such_folder");
    load_fails(ctx, "err_no_index", "model_index.json");
    load_fails(ctx, "err_class", "StableDiffusionXLPipeline");
    load_fails(ctx, "err_no_unet", "unet");
    cross_dim_fails(ctx);
    ts_pipeline_opts bad = {.device_map = "unet=cpu:0,vae=tpu:3"};
    char p[1024];
    snprintf(p, sizeof p, "%s/sd", root);
    ts_pipeline *pl = NULL;
    CHECK(ts_pipeline_load(ctx, p, &bad, &pl) != TS_OK && !pl);
    CHECK_MSG(ctx, "tpu:3");
    bad = (ts_pipeline_opts){.device_map = "nose=cpu:1"};
    CHECK(ts_pipeline_load(ctx, p, &bad, &pl) != TS_OK && !pl);
    CHECK_MSG(ctx, "nose");

    ts_pipeline *sd = load(ctx, "sd", NULL);
    if (sd) {
        json_t *c = find_case("sd_ddim_cfg");
        ts_diffusion_request r = request_of(sd, c);
        r.prompt = NULL;
        generate_fails(ctx, sd, &r, "prompt");
        request_done(&r);
        r = request_of(sd, c);
        r.width = 60;
        generate_fails(ctx, sd, &r, "60");
        r.width = 64;
        r.scheduler = "heun";
        generate_fails(ctx, sd, &r, "heun");
        r.scheduler = "ddim";
        r.num_images = 3; /* the latents hold one */
        generate_fails(ctx, sd, &r, "latents");
        r.num_images = 1;
        r.width = 128; /* latents 8x8, image 128 wide wants 16 */
        generate_fails(ctx, sd, &r, "latents");
        request_done(&r);
        ts_pipeline_free(sd);
    }
    ts_pipeline *dit = load(ctx, "dit", NULL);
    if (dit) {
        ts_diffusion_request r = request_of(dit, find_case("dit_ddim_cfg"));
        r.class_id = 10;
        generate_fails(ctx, dit, &r, "10");
        r.class_id = -1;
        generate_fails(ctx, dit, &r, "-1");
        request_done(&r);
        ts_pipeline_free(dit);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_pipeline FIXTURE_DIR\n");
        return 2;
    }
    root = argv[1];
    char p[1024];
    snprintf(p, sizeof p, "%s/cases.json", root);
    json_error_t je;
    doc = json_load_file(p, 0, &je);
    if (!doc) {
        fprintf(stderr, "%s: %s\n", p, je.text);
        return 1;
    }
    ts_ctx *ctx = test_ctx();
    snprintf(p, sizeof p, "%s/ref.safetensors", root);
    if (ts_safetensors_open(ctx, p, &ref) != TS_OK) {
        fprintf(stderr, "%s\n", ts_errmsg(ctx));
        return 1;
    }
    test_cases(ctx, "sd");
    test_cases(ctx, "dit");
    test_cases(ctx, "dit_pixel");
    printf("image-to-image:\n");
    test_img2img(ctx);
    test_scheduler_default(ctx);
    printf("compiled:\n");
    test_compiled(ctx, "sd", "sd_euler_cfg");
    test_compiled(ctx, "dit", "dit_dpm_cfg");
    printf("placement:\n");
    test_placement(ctx);
    printf("bf16:\n");
    test_bf16(ctx);
    test_labels(ctx);
    printf("errors:\n");
    test_errors(ctx);
    ts_safetensors_close(ref);
    json_decref(doc);
    ts_ctx_free(ctx);
    return test_finish("test_pipeline");
}
