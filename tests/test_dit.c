/* test_dit.c — DiTTransformer2DModel against a plain PyTorch DiT
 * (tests/ref/ref_dit.py writes the folders: patch 2 with learn_sigma,
 * patch 4 on a non-square input, attention without q/k/v biases): the
 * output to 1e-4 of max(1, max |ref|) with f32 weights and to 3e-2 with
 * bf16 weights, eager == compiled, the gradients of sum(out * w) with
 * respect to seven parameters to 1e-4 of their scale; errors naming the
 * folder, key or tensor at fault; a new model's initialisation (DiT's)
 * and its save/load round trip; a few training steps eager and compiled
 * giving the same losses and a DiTPipeline folder. argv[1]: the folder
 * ref_dit.py wrote. */
#include "tessera_diffusion.h"
#include "tessera_io.h"
#include "tessera_train.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *dir;
static const char *CASES[] = {"dit_p2_sigma", "dit_p4", "dit_nobias"};

/* max |a - b| and max |b| over the elements */
static void diff_stats(ts_tensor *a, ts_tensor *b, double *maxdiff,
                       double *maxref) {
    int64_t n = ts_tensor_numel(b);
    float *x = malloc(sizeof(float) * (size_t)n),
          *y = malloc(sizeof(float) * (size_t)n);
    *maxdiff = INFINITY, *maxref = 0;
    if (x && y && ts_tensor_numel(a) == n &&
        ts_tensor_read(a, x, TS_F32) == TS_OK &&
        ts_tensor_read(b, y, TS_F32) == TS_OK) {
        *maxdiff = 0;
        for (int64_t i = 0; i < n; i++) {
            double d = fabs((double)x[i] - (double)y[i]);
            *maxdiff = d > *maxdiff || isnan(d) ? d : *maxdiff;
            *maxref =
                fabs((double)y[i]) > *maxref ? fabs((double)y[i]) : *maxref;
        }
    }
    free(x), free(y);
}

static void check_close(const char *what, ts_tensor *a, ts_tensor *b,
                        double rel) {
    double md, mr;
    ts_test_checks++;
    if (!a || !b) {
        ts_test_failures++;
        fprintf(stderr, "%s: missing tensor\n", what);
        return;
    }
    diff_stats(a, b, &md, &mr);
    double tol = rel * (mr > 1 ? mr : 1);
    if (!(md <= tol)) {
        ts_test_failures++;
        fprintf(stderr, "%s: max |diff| %.3g > %.3g (max |ref| %.3g)\n", what,
                md, tol, mr);
    } else
        printf("  %-40s max |diff| %.2e (max |ref| %.3g)\n", what, md, mr);
}

typedef struct {
    ts_safetensors *st;
    ts_tensor *x, *t, *y, *out, *loss_w;
} ref_case;

static bool open_ref(ts_ctx *ctx, const char *name, ref_case *r) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/ref.safetensors", dir, name);
    memset(r, 0, sizeof *r);
    if (ts_safetensors_open(ctx, p, &r->st) != TS_OK) {
        CHECK_OK(ctx, ts_ctx_status(ctx));
        return false;
    }
    r->x = ts_safetensors_get(r->st, "x");
    r->t = ts_safetensors_get(r->st, "t");
    r->y = ts_safetensors_get(r->st, "y");
    r->out = ts_safetensors_get(r->st, "out");
    r->loss_w = ts_safetensors_get(r->st, "loss_w");
    CHECK(r->x && r->t && r->y && r->out && r->loss_w);
    return r->x && r->t && r->y && r->out && r->loss_w;
}

static void close_ref(ref_case *r) {
    ts_release(r->x), ts_release(r->t), ts_release(r->y), ts_release(r->out),
        ts_release(r->loss_w);
    if (r->st)
        ts_safetensors_close(r->st);
}

static void test_forward(ts_ctx *ctx, const char *name) {
    printf("%s\n", name);
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ref_case r;
    if (!open_ref(ctx, name, &r)) {
        close_ref(&r);
        return;
    }
    ts_dit *d = NULL;
    CHECK_OK(ctx, ts_dit_load(ctx, p, NULL, &d));
    if (d) {
        CHECK(ts_dit_in_channels(d) == ts_tensor_dim(r.x, 1));
        CHECK(ts_dit_out_channels(d) == ts_tensor_dim(r.out, 1));
        CHECK(ts_dit_param_bytes(d) > 0);
        char what[400];
        ts_tensor *o = ts_dit_forward(d, r.x, r.t, r.y);
        snprintf(what, sizeof what, "%s f32 eager", name);
        check_close(what, o, r.out, 1e-4);
        /* compiled: recorded, planned, run; then replayed */
        ts_set_mode(ctx, TS_MODE_COMPILED);
        for (int k = 0; k < 2; k++) {
            ts_tensor *oc = ts_dit_forward(d, r.x, r.t, r.y);
            CHECK_OK(ctx, ts_sync(ctx));
            snprintf(what, sizeof what, "%s compiled == eager (run %d)", name,
                     k + 1);
            check_close(what, oc, o, 1e-6);
            ts_release(oc);
        }
        ts_set_mode(ctx, TS_MODE_EAGER);
        ts_release(o);
        /* gradients of sum(out * w) */
        ts_tensor **ps;
        const char **names;
        int n = ts_dit_parameters(d, &ps, &names);
        for (int i = 0; i < n; i++)
            ts_set_requires_grad(ps[i], true);
        o = ts_dit_forward(d, r.x, r.t, r.y);
        ts_tensor *m = o ? ts_mul(o, r.loss_w) : NULL;
        ts_tensor *l = m ? ts_sum(m, 0, NULL, false) : NULL;
        CHECK(l != NULL);
        if (l)
            CHECK_OK(ctx, ts_backward(l, NULL));
        int checked = 0;
        for (int i = 0; i < n; i++) {
            char gname[256];
            snprintf(gname, sizeof gname, "grad.%s", names[i]);
            if (ts_safetensors_find(r.st, gname) < 0)
                continue;
            ts_tensor *g = ts_safetensors_get(r.st, gname);
            snprintf(what, sizeof what, "%s %s", name, gname);
            check_close(what, ts_grad(ps[i]), g, 1e-4);
            ts_release(g);
            checked++;
        }
        CHECK(checked >= 6);
        ts_release(o), ts_release(m), ts_release(l);
        ts_dit_free(d);
    }
    /* bf16 weights */
    ts_component_opts bo = {.dtype = TS_BF16};
    d = NULL;
    CHECK_OK(ctx, ts_dit_load(ctx, p, &bo, &d));
    if (d) {
        char what[400];
        ts_tensor *o = ts_dit_forward(d, r.x, r.t, r.y);
        snprintf(what, sizeof what, "%s bf16 weights", name);
        check_close(what, o, r.out, 3e-2);
        ts_release(o);
        ts_dit_free(d);
    }
    close_ref(&r);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f)
        fputs(text, f), fclose(f);
}

/* dir/bad_NAME: config text + the dit_p2_sigma weights */
static const char *bad_folder(const char *tag, const char *config) {
    static char p[1024];
    char q[1100], w[1100];
    snprintf(p, sizeof p, "%s/bad_%s", dir, tag);
    mkdir(p, 0755);
    snprintf(q, sizeof q, "%s/config.json", p);
    write_text(q, config);
    snprintf(q, sizeof q, "%s/diffusion_pytorch_model.safetensors", p);
    snprintf(w, sizeof w, "%s/dit_p2_sigma/diffusion_pytorch_model.safetensors",
             dir);
    unlink(q);
    if (symlink(w, q))
        perror("symlink");
    return p;
}

#define GOOD_KEYS                                                              \
    "\"_class_name\": \"DiTTransformer2DModel\", \"attention_head_dim\": 8, "  \
    "\"in_channels\": 4, \"num_attention_heads\": 2, "                         \
    "\"num_embeds_ada_norm\": 10, \"patch_size\": 2, \"sample_size\": 8, "     \
    "\"out_channels\": 8"

static void test_errors(ts_ctx *ctx) {
    printf("errors\n");
    ts_dit *d = NULL;
    char p[1024];
    snprintf(p, sizeof p, "%s/no_such_folder", dir);
    CHECK(ts_dit_load(ctx, p, NULL, &d) != TS_OK && !d);
    CHECK_MSG(ctx, "no_such_folder");
    CHECK_MSG(ctx, "config.json");
    /* a known architecture's config, but norm_type other than DiT's */
    const char *f = bad_folder("norm", "{" GOOD_KEYS ", \"num_layers\": 2, "
                                       "\"norm_type\": \"ada_norm_single\"}");
    CHECK(ts_dit_load(ctx, f, NULL, &d) != TS_OK && !d);
    CHECK_MSG(ctx, "norm_type");
    CHECK_MSG(ctx, "ada_norm_single");
    /* another class */
    f = bad_folder("class", "{\"_class_name\": \"UNet2DConditionModel\"}");
    CHECK(ts_dit_load(ctx, f, NULL, &d) != TS_OK && !d);
    CHECK_MSG(ctx, "UNet2DConditionModel");
    /* a config that does not match the weights: a mis-shaped tensor */
    f = bad_folder("shape",
                   "{\"_class_name\": \"DiTTransformer2DModel\", "
                   "\"attention_head_dim\": 8, \"in_channels\": 4, "
                   "\"num_attention_heads\": 2, \"num_embeds_ada_norm\": 12, "
                   "\"patch_size\": 2, \"sample_size\": 8, \"out_channels\": "
                   "8, \"num_layers\": 2}");
    CHECK(ts_dit_load(ctx, f, NULL, &d) != TS_OK && !d);
    CHECK_MSG(ctx, "transformer_blocks.0.norm1.emb.class_embedder."
                   "embedding_table.weight");
    CHECK_MSG(ctx, "(11, 16)");
    /* more layers than the file holds: a missing tensor */
    f = bad_folder("missing", "{" GOOD_KEYS ", \"num_layers\": 3}");
    CHECK(ts_dit_load(ctx, f, NULL, &d) != TS_OK && !d);
    CHECK_MSG(ctx, "transformer_blocks.2.");
    CHECK_MSG(ctx, "missing");
    /* a key of the wrong type */
    f = bad_folder("type", "{" GOOD_KEYS ", \"num_layers\": \"two\"}");
    CHECK(ts_dit_load(ctx, f, NULL, &d) != TS_OK && !d);
    CHECK_MSG(ctx, "num_layers");
    /* the good config loads, and bad inputs are named */
    f = bad_folder("good", "{" GOOD_KEYS ", \"num_layers\": 2}");
    CHECK_OK(ctx, ts_dit_load(ctx, f, NULL, &d));
    if (d) {
        int64_t xs[4] = {2, 3, 8, 8}, ts1[1] = {2};
        ts_tensor *x = ts_zeros(ctx, TS_F32, 4, xs);
        ts_tensor *t = ts_zeros(ctx, TS_F32, 1, ts1);
        ts_tensor *y = ts_zeros(ctx, TS_I64, 1, ts1);
        ts_tensor *o = ts_dit_forward(d, x, t, y);
        CHECK(!o);
        CHECK_MSG(ctx, "DiT forward");
        CHECK_MSG(ctx, "(B, 4, H, W)");
        ts_release(x), ts_release(o);
        int64_t xs2[4] = {2, 4, 7, 8};
        x = ts_zeros(ctx, TS_F32, 4, xs2);
        CHECK(!ts_dit_forward(d, x, t, y));
        CHECK_MSG(ctx, "multiples of the patch size 2");
        ts_release(x);
        ts_release(t), ts_release(y);
        ts_dit_free(d);
    }
    ts_clear_error(ctx);
}

/* a new DiT: DiT's initialisation, parameters under Diffusers' names,
 * saved and loaded back bit for bit */
static void test_new_save(ts_ctx *ctx) {
    printf("new + save + load\n");
    ts_dit_config c = {.sample_size = 16,
                       .in_channels = 2,
                       .patch_size = 4,
                       .num_layers = 2,
                       .num_attention_heads = 2,
                       .attention_head_dim = 8,
                       .num_classes = 5,
                       .learn_sigma = true};
    ts_dit *d = NULL;
    CHECK_OK(ctx, ts_dit_new(ctx, &c, 7, &d));
    if (!d)
        return;
    CHECK(ts_dit_out_channels(d) == 4);
    ts_tensor **ps;
    const char **names;
    int n = ts_dit_parameters(d, &ps, &names);
    CHECK(n == 2 + 19 * 2 + 4);
    for (int i = 0; i < n; i++) {
        ts_tensor *a = ts_abs(ps[i]);
        ts_tensor *mx = a ? ts_amax(a, 0, NULL, false) : NULL;
        double v = -1;
        if (mx)
            ts_item(mx, &v);
        ts_release(a), ts_release(mx);
        bool zero = strstr(names[i], "bias") ||
                    strstr(names[i], "norm1.linear") ||
                    strstr(names[i], "proj_out");
        if (zero && v != 0)
            fprintf(stderr, "%s should start at zero (max %g)\n", names[i], v);
        CHECK(zero ? v == 0 : v > 0);
        CHECK(ts_requires_grad(ps[i]));
        if (strstr(names[i], "embedding_table") ||
            strstr(names[i], "timestep_embedder.linear_1.weight"))
            CHECK(v < 0.02 * 7); /* normal(0.02) */
        if (!strcmp(names[i], "transformer_blocks.0.attn1.to_q.weight"))
            CHECK(v <= sqrt(6.0 / 32) && v > 0.5 * sqrt(6.0 / 32)); /* xavier */
    }
    CHECK(!strcmp(names[0], "pos_embed.proj.weight"));
    CHECK(ts_tensor_dim(ps[6], 0) == 6); /* num_classes + 1 (the null class) */
    char p[1024];
    snprintf(p, sizeof p, "%s/saved_dit", dir);
    CHECK_OK(ctx, ts_dit_save(d, p));
    ts_dit *e = NULL;
    CHECK_OK(ctx, ts_dit_load(ctx, p, NULL, &e));
    if (e) {
        ts_tensor **qs;
        const char **qn;
        int m = ts_dit_parameters(e, &qs, &qn);
        CHECK(m == n);
        for (int i = 0; i < n && i < m; i++) {
            CHECK(!strcmp(names[i], qn[i]));
            double md, mr;
            diff_stats(qs[i], ps[i], &md, &mr);
            CHECK(md == 0);
        }
        ts_dit_config g;
        ts_dit_get_config(e, &g);
        CHECK(g.learn_sigma && g.out_channels == 4 && g.num_classes == 5 &&
              g.patch_size == 4);
        ts_dit_free(e);
    }
    ts_dit_free(d);
}

static double last_loss(const char *log) {
    FILE *f = fopen(log, "r");
    char line[1024];
    double v = NAN;
    while (f && fgets(line, sizeof line, f)) {
        const char *s = strstr(line, "\"loss\": ");
        if (s)
            v = atof(s + 8);
    }
    if (f)
        fclose(f);
    return v;
}

/* a few steps of `tessera train --dit`'s loop, eager then compiled */
static void test_train(ts_ctx *ctx) {
    printf("training steps\n");
    double loss[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        ts_dit_train_options o = ts_dit_default_train_options();
        char out[1024];
        snprintf(out, sizeof out, "%s/train_%s", dir, k ? "compiled" : "eager");
        o.out_dir = out;
        o.patch_size = 8, o.num_layers = 2, o.num_attention_heads = 2;
        o.attention_head_dim = 16;
        o.steps = 4, o.batch = 8, o.warmup = 2, o.log_every = 1;
        o.eager = k == 0, o.quiet = true, o.peak = 1e11;
        ts_dit_train_result r;
        ts_status s = ts_dit_train_run(ctx, &o, &r);
        CHECK_OK(ctx, s);
        if (s)
            continue;
        CHECK(r.steps_done == 4 && isfinite(r.last_loss));
        CHECK(r.first_loss > 0.3 && r.first_loss < 3); /* about E[eps^2] */
        CHECK(r.tokens_per_s > 0 && r.mfu > 0 && r.flops_per_image > 0);
        char p[1200];
        snprintf(p, sizeof p, "%s/log.jsonl", out);
        loss[k] = last_loss(p);
        const char *files[] = {
            "model_index.json", "scheduler/scheduler_config.json",
            "transformer/config.json",
            "transformer/diffusion_pytorch_model.safetensors"};
        for (int i = 0; i < 4; i++) {
            struct stat sb;
            snprintf(p, sizeof p, "%s/%s", out, files[i]);
            CHECK(stat(p, &sb) == 0);
        }
        snprintf(p, sizeof p, "%s/model_index.json", out);
        char *mi = tu_read_file(p, NULL);
        CHECK(mi && strstr(mi, "\"DiTPipeline\"") &&
              strstr(mi, "\"id2label\"") && strstr(mi, "\"61\": \"z\""));
        free(mi);
        snprintf(p, sizeof p, "%s/transformer", out);
        ts_dit *d = NULL;
        CHECK_OK(ctx, ts_dit_load(ctx, p, NULL, &d));
        if (d)
            CHECK(ts_dit_num_classes(d) == 62 && ts_dit_sample_size(d) == 32);
        ts_dit_free(d);
    }
    printf("  eager loss %.6f, compiled loss %.6f\n", loss[0], loss[1]);
    CHECK_NEAR(loss[0], loss[1], 1e-5 * fabs(loss[0]));
    /* bad options are named */
    ts_dit_train_options o = ts_dit_default_train_options();
    o.out_dir = dir, o.patch_size = 5;
    CHECK(ts_dit_train_run(ctx, &o, NULL) != TS_OK);
    CHECK_MSG(ctx, "patch_size");
    ts_clear_error(ctx);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_dit REF_DIR (tests/ref/ref_dit.py's)\n");
        return 2;
    }
    dir = argv[1];
    ts_ctx *ctx = test_ctx();
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++)
        test_forward(ctx, CASES[i]);
    test_errors(ctx);
    test_new_save(ctx);
    test_train(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_dit");
}
