/* test_clip_text.c — CLIPTextModel against the plain PyTorch model of
 * tests/ref/ref_clip_text.py (argv[1]: its output folder): last_hidden_state
 * for B = 2 and T = 77 (i64 ids) and T = 9 (i32 ids), quick_gelu and gelu,
 * f32 weights within 1e-4 x max(1, max|ref|); BF16-stored weights (read as
 * f32) against the reference with bf16-rounded weights, same bound;
 * weights kept in bf16 within 2e-2 x max(1, max|ref|) of that reference;
 * eager and compiled modes to the same values; and the errors: a missing
 * folder, a missing tensor, a mis-shaped one, an unknown hidden_act, more
 * tokens than positions, ids of the wrong type. */
#include "tessera_diffusion.h"
#include "tessera_io.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dir_root;
static ts_safetensors *ref;

/* max |a - b| <= tol x max(1, max |b|) */
static void check_close(const char *what, ts_tensor *a, ts_tensor *b,
                        double tol) {
    ts_test_checks++;
    if (!a || !b || ts_tensor_numel(a) != ts_tensor_numel(b)) {
        ts_test_failures++;
        fprintf(stderr, "%s: missing or mis-sized output\n", what);
        return;
    }
    size_t n = (size_t)ts_tensor_numel(a);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    ts_tensor_read(a, x, TS_F32), ts_tensor_read(b, y, TS_F32);
    double err = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - y[i]);
        err = d > err || isnan(d) ? d : err;
        mx = fabs(y[i]) > mx ? fabs(y[i]) : mx;
    }
    double bound = tol * (mx > 1 ? mx : 1);
    printf("%-28s max abs err %.3g (max |ref| %.3g, bound %.3g)\n", what, err,
           mx, bound);
    if (!(err <= bound)) {
        ts_test_failures++;
        fprintf(stderr, "%s: max abs err %g > %g\n", what, err, bound);
    }
    free(x), free(y);
}

static ts_clip_text *load(ts_ctx *ctx, const char *name, ts_dtype dt) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", dir_root, name);
    ts_component_opts o = {.dtype = dt};
    ts_clip_text *c = NULL;
    CHECK_OK(ctx, ts_clip_text_load(ctx, dir, &o, &c));
    return c;
}

static ts_tensor *ref_tensor(const char *model, const char *what, int T) {
    char name[128];
    snprintf(name, sizeof name, "%s.%s%d", model, what, T);
    return ts_safetensors_get(ref, name);
}

/* the model against the reference `what` for T = 77 and 9 */
static void check_model(ts_ctx *ctx, const char *model, const char *folder,
                        ts_dtype dt, const char *what, double tol) {
    ts_clip_text *c = load(ctx, folder, dt);
    if (!c)
        return;
    CHECK(ts_clip_text_hidden_size(c) == 64);
    CHECK(ts_clip_text_max_positions(c) == 77);
    CHECK(ts_clip_text_param_bytes(c) > 0);
    int Ts[2] = {77, 9};
    for (int k = 0; k < 2; k++) {
        ts_tensor *ids = ref_tensor(model, "ids", Ts[k]);
        ts_tensor *want = ref_tensor(model, what, Ts[k]);
        ts_tensor *got = ts_clip_text_forward(c, ids);
        if (!got)
            fprintf(stderr, "%s: %s\n", folder, ts_errmsg(ctx));
        CHECK(got && ts_tensor_ndim(got) == 3 && ts_tensor_dim(got, 0) == 2 &&
              ts_tensor_dim(got, 1) == Ts[k] && ts_tensor_dim(got, 2) == 64 &&
              ts_tensor_dtype(got) == TS_F32);
        char label[128];
        snprintf(label, sizeof label, "%s %s T=%d", folder,
                 dt == TS_BF16 ? "bf16" : "f32", Ts[k]);
        check_close(label, got, want, tol);
        /* compiled: the same ops recorded and replayed, twice (the second
         * from the plan cache) */
        ts_set_mode(ctx, TS_MODE_COMPILED);
        for (int rep = 0; rep < 2; rep++) {
            ts_tensor *cg = ts_clip_text_forward(c, ids);
            snprintf(label, sizeof label, "%s %s T=%d compiled", folder,
                     dt == TS_BF16 ? "bf16" : "f32", Ts[k]);
            check_close(label, cg, got, 1e-6);
            ts_release(cg);
        }
        ts_set_mode(ctx, TS_MODE_EAGER);
        ts_release(got), ts_release(ids), ts_release(want);
    }
    ts_clip_text_free(c);
}

static void check_load_error(ts_ctx *ctx, const char *folder, ts_status want,
                             const char *msg) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", dir_root, folder);
    ts_clip_text *c = NULL;
    ts_status s = ts_clip_text_load(ctx, dir, NULL, &c);
    /* want TS_OK: any failure (the loader's status for it) */
    CHECK(s != TS_OK && (want == TS_OK || s == want) && !c);
    if (s == TS_OK || (want != TS_OK && s != want))
        fprintf(stderr, "%s: %s: %s\n", folder, ts_status_name(s),
                ts_errmsg(ctx));
    CHECK_MSG(ctx, msg);
    ts_clear_error(ctx);
}

static void check_errors(ts_ctx *ctx) {
    check_load_error(ctx, "no_such_folder", TS_ERR_IO, "no config.json");
    check_load_error(ctx, "err_missing", TS_OK,
                     "text_model.encoder.layers.1.mlp.fc2.weight is missing");
    check_load_error(ctx, "err_shape", TS_ERR_SHAPE,
                     "text_model.encoder.layers.0.self_attn.k_proj.weight has "
                     "shape (64, 65)");
    check_load_error(ctx, "err_act", TS_ERR_UNSUPPORTED,
                     "hidden_act \"swish\" is not supported");
    ts_clip_text *c = load(ctx, "clip_quick", TS_F32);
    if (!c)
        return;
    int64_t sh[2] = {1, 78};
    int32_t *v = calloc(78, sizeof *v);
    ts_tensor *ids = ts_from_data(ctx, TS_I32, 2, sh, v);
    CHECK(ts_clip_text_forward(c, ids) == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "78 tokens, but the model has 77 positions");
    ts_clear_error(ctx);
    ts_release(ids);
    float f[4] = {0};
    int64_t fs[2] = {1, 4};
    ts_tensor *fids = ts_from_data(ctx, TS_F32, 2, fs, f);
    CHECK(ts_clip_text_forward(c, fids) == NULL);
    CHECK_MSG(ctx, "ids must be (B, T) of i32 or i64");
    ts_clear_error(ctx);
    ts_release(fids);
    free(v);
    ts_clip_text_free(c);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_clip_text REF_DIR\n");
        return 2;
    }
    dir_root = argv[1];
    ts_ctx *ctx = test_ctx();
    char p[1024];
    snprintf(p, sizeof p, "%s/ref.safetensors", dir_root);
    CHECK_OK(ctx, ts_safetensors_open(ctx, p, &ref));
    if (!ref)
        return test_finish("test_clip_text");
    check_model(ctx, "clip_quick", "clip_quick", TS_F32, "out", 1e-4);
    check_model(ctx, "clip_gelu", "clip_gelu", TS_F32, "out", 1e-4);
    check_model(ctx, "clip_quick", "clip_bf16", TS_F32, "allbf16", 1e-4);
    check_model(ctx, "clip_quick", "clip_quick", TS_BF16, "bf16w", 2e-2);
    check_model(ctx, "clip_gelu", "clip_gelu", TS_BF16, "bf16w", 2e-2);
    check_errors(ctx);
    ts_safetensors_close(ref);
    ts_ctx_free(ctx);
    return test_finish("test_clip_text");
}
