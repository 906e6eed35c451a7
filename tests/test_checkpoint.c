/* test_checkpoint.c — activation checkpointing: a Qwen3 model with each
 * layer checkpointed gives the same loss and the same gradients as without,
 * in eager and compiled mode, and holds less memory between forward and
 * backward; so does GPT-2 with its blocks checkpointed (eager); ts_checkpoint
 * on its own and its bad arguments. */
#include "tessera_models.h"
#include "tessera_nn.h"

#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static ts_model_config tiny(void) {
    ts_model_config c = tu_config("qwen3");
    c.vocab = 97, c.hidden = 32, c.intermediate = 64, c.layers = 3;
    c.heads = 4, c.kv_heads = 2, c.head_dim = 8;
    c.norm_eps = 1e-6, c.rope_theta = 10000, c.max_positions = 64;
    c.tie_word_embeddings = true;
    return c;
}

/* a model under test */
typedef struct {
    ts_decoder *q;
} model;

/* loss and every gradient (concatenated) of one forward + backward;
 * *held the bytes alive after the forward (eager) */
static double step(ts_ctx *ctx, model m, ts_tensor *ids, ts_tensor *tg,
                   float *grads, size_t *held) {
    ts_tensor *const *p = ts_decoder_params(m.q);
    int n = ts_decoder_num_params(m.q);
    ts_zero_grads(p, n);
    ts_alloc_stats a0, a1;
    ts_alloc_get_stats(ctx, &a0);
    ts_tensor *loss = ts_decoder_loss(m.q, ids, tg, NULL);
    ts_alloc_get_stats(ctx, &a1);
    *held = a1.bytes_in_use - a0.bytes_in_use;
    double v = NAN;
    CHECK(loss && ts_backward(loss, NULL) == TS_OK);
    CHECK(ts_sync(ctx) == TS_OK);
    CHECK(ts_item(loss, &v) == TS_OK);
    ts_release(loss);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        ts_tensor *g = ts_grad(p[i]);
        CHECK(g != NULL);
        if (!g)
            continue;
        CHECK(ts_tensor_read(g, grads + at, TS_F32) == TS_OK);
        at += (size_t)ts_tensor_numel(g);
    }
    return v;
}

static double worst_rel(const float *a, const float *b, size_t n) {
    double amax = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        amax = fmax(amax, fabs(a[i]));
        d = fmax(d, fabs((double)a[i] - b[i]));
    }
    return d / (amax + 1e-30);
}

/* a block that squares its input and adds in[1] */
static ts_tensor *sq_plus(void *arg, int n, ts_tensor **in) {
    (void)arg, (void)n;
    ts_tensor *s = ts_mul(in[0], in[0]);
    ts_tensor *r = ts_add(s, in[1]);
    ts_release(s);
    return r;
}

int main(void) {
    ts_ctx *ctx = NULL;
    CHECK(ts_ctx_new(&ctx, NULL) == TS_OK);
    ts_model_config c = tiny();
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, NULL, 11, &m));
    int64_t shape[2] = {2, 16};
    int64_t ids_v[32], tg_v[32];
    for (int i = 0; i < 32; i++)
        ids_v[i] = (i * 37 + 5) % 97, tg_v[i] = (i * 53 + 2) % 97;
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, ids_v);
    ts_tensor *tg = ts_from_data(ctx, TS_I64, 2, shape, tg_v);
    size_t total = 0;
    for (int i = 0; i < ts_decoder_num_params(m); i++)
        total += (size_t)ts_tensor_numel(ts_decoder_param(m, i));
    float *g0 = malloc(sizeof(float) * total), *g1 = malloc(sizeof *g1 * total);

    for (int mode = 0; mode < 2; mode++) {
        ts_set_mode(ctx, mode ? TS_MODE_COMPILED : TS_MODE_EAGER);
        size_t held0 = 0, held1 = 0;
        CHECK_OK(ctx, ts_decoder_set_checkpointing(m, false));
        double l0 = step(ctx, (model){.q = m}, ids, tg, g0, &held0);
        ts_compile_stats s0, s1;
        ts_get_compile_stats(ctx, &s0);
        CHECK_OK(ctx, ts_decoder_set_checkpointing(m, true));
        double l1 = step(ctx, (model){.q = m}, ids, tg, g1, &held1);
        ts_get_compile_stats(ctx, &s1);
        CHECK(isfinite(l0) && fabs(l0 - l1) <= 1e-6 * fabs(l0));
        double w = worst_rel(g0, g1, total);
        if (w > 1e-5)
            fprintf(stderr, "mode %d: gradients differ by %.2e\n", mode, w);
        CHECK(w <= 1e-5);
        fprintf(stderr,
                "%s: held after forward %zu -> %zu bytes, planned peak %zu "
                "-> %zu bytes\n",
                mode ? "compiled" : "eager", held0, held1,
                s0.planned_peak_bytes, s1.planned_peak_bytes);
        if (mode == 0) /* eager: only the layers' inputs stay after forward */
            CHECK(held1 < held0 / 2);
        else /* compiled: the whole step's plan needs less memory */
            CHECK(s1.planned_peak_bytes < s0.planned_peak_bytes);
    }
    ts_set_mode(ctx, TS_MODE_EAGER);
    CHECK_OK(ctx, ts_decoder_set_checkpointing(m, false));

    /* GPT-2, eager: the same loss and gradients, less held after forward */
    ts_model_config gc = tu_config("gpt2");
    gc.vocab = 97, gc.hidden = 32, gc.layers = 3, gc.heads = 4;
    gc.kv_heads = 4, gc.head_dim = 8, gc.intermediate = 128;
    gc.max_positions = 64;
    ts_decoder *g2 = NULL;
    CHECK_OK(ctx, ts_decoder_new(ctx, &gc, NULL, 12, &g2));
    if (g2) {
        size_t gt = 0, h0 = 0, h1 = 0;
        for (int i = 0; i < ts_decoder_num_params(g2); i++)
            gt += (size_t)ts_tensor_numel(ts_decoder_param(g2, i));
        float *a = malloc(sizeof(float) * gt), *b = malloc(sizeof(float) * gt);
        double l0 = step(ctx, (model){.q = g2}, ids, tg, a, &h0);
        CHECK_OK(ctx, ts_decoder_set_checkpointing(g2, true));
        double l1 = step(ctx, (model){.q = g2}, ids, tg, b, &h1);
        CHECK(isfinite(l0) && fabs(l0 - l1) <= 1e-6 * fabs(l0));
        CHECK(worst_rel(a, b, gt) <= 1e-5);
        fprintf(stderr, "gpt2 eager: held after forward %zu -> %zu bytes\n", h0,
                h1);
        CHECK(h1 < h0 / 2);
        free(a), free(b);
    }
    ts_decoder_free(g2);

    /* ts_checkpoint alone: d/dx sum(x*x + b) = 2x, d/db = 1 */
    int64_t s3[1] = {3};
    float xv[3] = {1, -2, 0.5f}, bv[3] = {4, 5, 6};
    ts_tensor *x = ts_from_data(ctx, TS_F32, 1, s3, xv);
    ts_tensor *b = ts_from_data(ctx, TS_F32, 1, s3, bv);
    ts_set_requires_grad(x, true);
    ts_tensor *in[2] = {x, b};
    ts_tensor *y = ts_checkpoint(sq_plus, NULL, 2, in);
    ts_tensor *sum = ts_sum(y, 0, NULL, false);
    CHECK_OK(ctx, ts_backward(sum, NULL));
    float gx[3] = {0}, yv[3] = {0};
    CHECK(ts_tensor_read(ts_grad(x), gx, TS_F32) == TS_OK);
    CHECK(ts_tensor_read(y, yv, TS_F32) == TS_OK);
    for (int i = 0; i < 3; i++) {
        CHECK_NEAR(gx[i], 2 * xv[i], 1e-6);
        CHECK_NEAR(yv[i], xv[i] * xv[i] + bv[i], 1e-6);
    }
    ts_release(y), ts_release(sum);
    /* grad mode off: the block's value, no graph */
    bool old = ts_set_grad_enabled(ctx, false);
    y = ts_checkpoint(sq_plus, NULL, 2, in);
    CHECK(y && !ts_requires_grad(y));
    ts_release(y);
    ts_set_grad_enabled(ctx, old);
    /* bad arguments */
    CHECK(ts_checkpoint(NULL, NULL, 2, in) == NULL);
    CHECK_MSG(ctx, "ts_checkpoint");
    ts_clear_error(ctx);
    ts_tensor *bad[2] = {x, NULL};
    CHECK(ts_checkpoint(sq_plus, NULL, 2, bad) == NULL);
    ts_clear_error(ctx);
    CHECK(ts_decoder_set_checkpointing(NULL, true) == TS_ERR_INVALID_ARG);

    ts_release(x), ts_release(b), ts_release(ids), ts_release(tg);
    free(g0), free(g1);
    ts_decoder_free(m);
    ts_ctx_free(ctx);
    return test_finish("test_checkpoint");
}
