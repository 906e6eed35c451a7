/* demo.c — `tessera demo`: trains a two-layer MLP on a toy task (classify
 * points of three interleaved spirals) for a few hundred eager steps with
 * SGD + momentum, printing the loss as it falls. Shows the library's eager
 * mode and autograd end to end until a real model takes over `make run`. */
#include "tessera.h"

#include "cli/opts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_PER   100 /* points per class */
#define CLASSES 3
#define HIDDEN  64

static void make_spirals(float *x, int64_t *y) {
    unsigned s = 12345;
    for (int c = 0; c < CLASSES; c++)
        for (int i = 0; i < N_PER; i++) {
            float r = (float)i / N_PER;
            s = s * 1103515245u + 12345u;
            float noise = ((float)((s >> 8) & 0xffff) / 65536.0f - 0.5f) * 0.3f;
            float t = (float)c * 4.0f + r * 4.0f + noise;
            int k = c * N_PER + i;
            x[2 * k] = r * sinf(t);
            x[2 * k + 1] = r * cosf(t);
            y[k] = c;
        }
}

static int check(ts_ctx *ctx, const char *what) {
    if (ts_ctx_status(ctx) == TS_OK)
        return 0;
    fprintf(stderr, "tessera demo: %s failed: %s\n", what, ts_errmsg(ctx));
    return 1;
}

static const cli_opt DEMO_OPTS[] = {
    {1, "--steps", CLI_INT, "N", 1, 1000000, .def = "300",
     .help = "training steps"},
    {0},
};

static const cli_cmd DEMO_CMD = {
    .name = "demo",
    .usage = "demo [--steps N]",
    .about = "Trains a two-layer MLP on three interleaved spirals in eager "
             "mode, printing the loss as it falls.",
    .opts = DEMO_OPTS,
    .short_threads = true,
};

int tessera_demo(int argc, char **argv) {
    int steps = 300;
    cli_parser p;
    cli_val v;
    cli_begin(&p, &DEMO_CMD, argc, argv);
    for (int id; (id = cli_next(&p, &v)) != CLI_END;) {
        if (id == CLI_HELP)
            return cli_help(&DEMO_CMD, stdout), 0;
        if (id == CLI_ERROR)
            return 2;
        if (id == CLI_POSITIONAL)
            return cli_fail(&DEMO_CMD, "unexpected argument \"%s\"", v.s);
        steps = (int)v.i;
    }
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK) {
        fprintf(stderr, "tessera demo: cannot create a context\n");
        return 1;
    }
    int64_t n = N_PER * CLASSES;
    float *xs = malloc(sizeof(float) * (size_t)n * 2);
    int64_t *ys = malloc(sizeof(int64_t) * (size_t)n);
    make_spirals(xs, ys);
    int64_t xshape[2] = {n, 2};
    ts_tensor *x = ts_from_data(ctx, TS_F32, 2, xshape, xs);
    ts_tensor *y = ts_from_data(ctx, TS_I64, 1, &n, ys);
    free(xs), free(ys);

    int64_t s1[2] = {2, HIDDEN}, s2[2] = {HIDDEN, CLASSES};
    int64_t b1s = HIDDEN, b2s = CLASSES;
    ts_tensor *params[4] = {ts_randn(ctx, TS_F32, 2, s1, 1.0, 1),
                            ts_zeros(ctx, TS_F32, 1, &b1s),
                            ts_randn(ctx, TS_F32, 2, s2, sqrt(2.0 / HIDDEN), 2),
                            ts_zeros(ctx, TS_F32, 1, &b2s)};
    ts_tensor *mom[4];
    for (int i = 0; i < 4; i++) {
        ts_set_requires_grad(params[i], true);
        mom[i] = ts_zeros(ctx, TS_F32, ts_tensor_ndim(params[i]),
                          ts_tensor_shape(params[i]));
    }
    if (check(ctx, "setup"))
        return 1;
    printf(
        "tessera demo: MLP 2 -> %d -> %d on %lld spiral points, %d threads\n",
        HIDDEN, CLASSES, (long long)n, ts_get_num_threads(ctx));
    const double lr = 0.5, beta = 0.9;
    double first = 0, loss_v = 0;
    for (int step = 0; step <= steps; step++) {
        ts_tensor *h0 = ts_matmul(x, params[0]);
        ts_tensor *h1 = ts_add(h0, params[1]);
        ts_tensor *h = ts_relu(h1);
        ts_tensor *z0 = ts_matmul(h, params[2]);
        ts_tensor *logits = ts_add(z0, params[3]);
        ts_tensor *loss = ts_cross_entropy(logits, y, -100, TS_REDUCE_MEAN);
        for (int i = 0; i < 4; i++)
            ts_zero_grad(params[i]);
        if (loss)
            ts_backward(loss, NULL);
        if (check(ctx, "training step"))
            return 1;
        ts_item(loss, &loss_v);
        if (step == 0)
            first = loss_v;
        if (step % 50 == 0 || step == steps) {
            ts_tensor *pred = ts_argmax(logits, 1, false);
            int64_t *p = ts_tensor_data(pred), correct = 0;
            int64_t *t = ts_tensor_data(y);
            for (int64_t i = 0; i < n; i++)
                correct += p[i] == t[i];
            printf("step %4d  loss %.4f  accuracy %5.1f%%\n", step, loss_v,
                   100.0 * (double)correct / (double)n);
            ts_release(pred);
        }
        /* SGD with momentum, outside the graph */
        bool old = ts_set_grad_enabled(ctx, false);
        for (int i = 0; i < 4 && step < steps; i++) {
            ts_tensor *m1 = ts_mul_scalar(mom[i], beta);
            ts_tensor *m2 = ts_add(m1, ts_grad(params[i]));
            ts_copy_(mom[i], m2);
            ts_tensor *d = ts_mul_scalar(m2, lr);
            ts_tensor *np = ts_sub(params[i], d);
            ts_copy_(params[i], np);
            ts_release(m1), ts_release(m2), ts_release(d), ts_release(np);
        }
        ts_set_grad_enabled(ctx, old);
        ts_release(h0), ts_release(h1), ts_release(h), ts_release(z0);
        ts_release(logits), ts_release(loss);
        if (check(ctx, "update"))
            return 1;
    }
    printf("loss %.4f -> %.4f\n", first, loss_v);
    for (int i = 0; i < 4; i++)
        ts_release(params[i]), ts_release(mom[i]);
    ts_release(x), ts_release(y);
    ts_alloc_stats st;
    ts_alloc_get_stats(ctx, &st);
    printf("allocator: %llu system allocations, %llu served from the cache\n",
           (unsigned long long)st.system_allocs,
           (unsigned long long)st.cache_hits);
    ts_ctx_free(ctx);
    return loss_v < first ? 0 : 1;
}
