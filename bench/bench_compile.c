/* bench_compile.c — eager against compiled on the Qwen3-style model
 * (hidden 512, 8 layers, 8 heads, 4 KV heads, head dim 64, MLP 1536, vocab
 * 32000, f32): a training step (forward + backward + AdamW) on a batch of
 * 8 x 256 tokens, and a 512-token prefill, side by side in one run (their
 * steps alternate). Time is
 * the median of the timed steps after a warm-up step; memory is the
 * allocator's peak during a step above what was in use before it (so
 * parameters and AdamW moments are not counted; gradients are, and the
 * activation figure subtracts them, as memory profilers split it). For the
 * compiled step the plan's predicted peak (arena + results kept) is printed
 * next to the measured one.
 *
 *   bench_compile [--steps N] [--small]
 *   TS_PASSES=-dce,-plan turns compiler passes off one by one. */
#include "qwen3_06b.h"
#include "tessera.h"
#include "tessera_models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(ts_ctx *ctx, const char *what) {
    fprintf(stderr, "bench_compile: %s: %s\n", what, ts_errmsg(ctx));
    exit(1);
}

typedef struct {
    double ms;
    size_t peak;      /* bytes above the step's starting point */
    size_t predicted; /* compiled: arena + kept */
    double loss;
    uint64_t graphs;         /* compiled graphs run per step */
    uint64_t compiles, hits; /* plan cache over the whole run */
    size_t grad_bytes;       /* the gradients' share of peak (train) */
} result;

/* One model, its optimizer and batch, in its own context and mode. */
typedef struct {
    ts_ctx *ctx;
    ts_decoder *m;
    ts_adamw *opt;
    ts_tensor *ids, *targets;
    ts_mode mode;
    bool train;
    double *times;
    result r;
} runner;

static void runner_init(runner *u, const ts_model_config *cfg, int B, int T,
                        int steps, ts_mode mode, bool train) {
    memset(u, 0, sizeof *u);
    if (ts_ctx_new(&u->ctx, NULL) != TS_OK)
        exit(1);
    if (ts_decoder_new(u->ctx, cfg, NULL, 1, &u->m) != TS_OK)
        die(u->ctx, "model");
    ts_adamw_options o = ts_adamw_default_options();
    o.lr = 1e-4;
    if (train &&
        ts_adamw_new(u->ctx, ts_decoder_params(u->m),
                     ts_decoder_num_params(u->m), &o, &u->opt) != TS_OK)
        die(u->ctx, "adamw");
    int64_t shape[2] = {B, T};
    ts_tensor *ids =
        ts_rand(u->ctx, TS_F32, 2, shape, 0, (double)cfg->vocab, 7);
    ts_tensor *tg = ts_rand(u->ctx, TS_F32, 2, shape, 0, (double)cfg->vocab, 8);
    u->ids = ts_cast(ids, TS_I64);
    u->targets = ts_cast(tg, TS_I64);
    ts_release(ids), ts_release(tg);
    u->mode = mode;
    u->train = train;
    u->times = calloc((size_t)steps + 1, sizeof(double));
    ts_set_mode(u->ctx, mode);
    if (!train)
        ts_set_grad_enabled(u->ctx, false);
}

static void runner_step(runner *u, int s) {
    ts_ctx *ctx = u->ctx;
    ts_alloc_stats before, after;
    ts_compile_stats cs0, cs;
    ts_get_compile_stats(ctx, &cs0);
    /* gradients are dropped before the step starts, so both modes count
     * them as new memory of the step */
    if (u->train)
        ts_zero_grads(ts_decoder_params(u->m), ts_decoder_num_params(u->m));
    ts_alloc_reset_peak(ctx);
    ts_alloc_get_stats(ctx, &before);
    double t0 = now(), loss = 0;
    if (u->train) {
        ts_tensor *l = ts_decoder_loss(u->m, u->ids, u->targets, NULL);
        if (!l || ts_backward(l, NULL) != TS_OK)
            die(ctx, "step");
        if (ts_adamw_step(u->opt) != TS_OK)
            die(ctx, "adamw step");
        /* keep only the value: with the loss released, the autograd graph
         * (and every activation it saves) dies with the step, so the
         * compiler may place activations in the shared arena */
        ts_tensor *lv = ts_detach(l);
        ts_release(l);
        if (ts_sync(ctx) != TS_OK)
            die(ctx, "sync");
        if (ts_item(lv, &loss) != TS_OK)
            die(ctx, "loss");
        ts_release(lv);
    } else {
        ts_tensor *lg = ts_decoder_forward(u->m, u->ids, 0);
        if (!lg || ts_sync(ctx) != TS_OK)
            die(ctx, "prefill");
        ts_release(lg);
    }
    u->times[s] = now() - t0;
    ts_alloc_get_stats(ctx, &after);
    ts_get_compile_stats(ctx, &cs);
    /* the arena of the previous graph was already in use before */
    size_t base = before.bytes_in_use;
    if (u->mode == TS_MODE_COMPILED && s > 0)
        base -= cs0.arena_bytes;
    u->r.peak = after.peak_bytes_in_use - base;
    u->r.predicted = cs.planned_peak_bytes;
    u->r.loss = loss;
    u->r.graphs = cs.graphs_run - cs0.graphs_run;
    u->r.compiles = cs.compilations;
    u->r.grad_bytes = 0;
    for (int i = 0; u->train && i < ts_decoder_num_params(u->m); i++) {
        ts_tensor *g = ts_grad(ts_decoder_param(u->m, i));
        if (g)
            u->r.grad_bytes += (size_t)ts_tensor_numel(g) * 4;
    }
    u->r.hits = cs.cache_hits;
}

static result runner_done(runner *u, int steps) {
    qsort(u->times + 1, (size_t)steps, sizeof(double), cmp_d);
    u->r.ms = 1e3 * u->times[1 + steps / 2];
    free(u->times);
    ts_release(u->ids), ts_release(u->targets);
    ts_adamw_free(u->opt);
    ts_decoder_free(u->m);
    ts_ctx_free(u->ctx);
    return u->r;
}

/* Eager and compiled side by side: their steps alternate, so both see the
 * same machine load. */
static void run_pair(const ts_model_config *cfg, int B, int T, int steps,
                     bool train, result *e, result *c) {
    runner ue, uc;
    runner_init(&ue, cfg, B, T, steps, TS_MODE_EAGER, train);
    runner_init(&uc, cfg, B, T, steps, TS_MODE_COMPILED, train);
    for (int s = 0; s <= steps; s++) {
        runner_step(&ue, s);
        runner_step(&uc, s);
    }
    *e = runner_done(&ue, steps);
    *c = runner_done(&uc, steps);
}

static void report(const char *what, result e, result c) {
    printf("%-14s eager %9.1f ms  compiled %9.1f ms  speedup %.3fx\n", what,
           e.ms, c.ms, e.ms / c.ms);
    printf("%-14s peak above start: eager %8.1f MiB  compiled %8.1f MiB  "
           "(%.1f%% lower)\n",
           "", e.peak / 1048576.0, c.peak / 1048576.0,
           100.0 * (1.0 - (double)c.peak / (double)e.peak));
    if (e.grad_bytes) { /* the usual split: activations vs gradients */
        double ea = (double)(e.peak - e.grad_bytes),
               ca = (double)(c.peak - c.grad_bytes);
        printf("%-14s activations (peak minus %.1f MiB of gradients): eager "
               "%.1f MiB  "
               "compiled %.1f MiB  (%.1f%% lower)\n",
               "", e.grad_bytes / 1048576.0, ea / 1048576.0, ca / 1048576.0,
               100.0 * (1.0 - ca / ea));
    }
    printf("%-14s compiled plan predicted %.1f MiB, measured %.1f MiB "
           "(measured/predicted %.3f); %llu graph(s) per step\n",
           "", c.predicted / 1048576.0, c.peak / 1048576.0,
           (double)c.peak / (double)c.predicted, (unsigned long long)c.graphs);
    printf("%-14s plans built %llu, replayed from the cache %llu\n", "",
           (unsigned long long)c.compiles, (unsigned long long)c.hits);
}

int main(int argc, char **argv) {
    int steps = 3;
    bool small = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--small"))
            small = true;
        else {
            fprintf(stderr, "usage: bench_compile [--steps N] [--small]\n");
            return 2;
        }
    }
    if (steps < 1)
        steps = 1;
    ts_model_config cfg = bench_preset("qwen3");
    cfg.vocab = 32000, cfg.hidden = 512, cfg.layers = 8, cfg.heads = 8;
    cfg.kv_heads = 4, cfg.head_dim = 64, cfg.intermediate = 1536;
    cfg.norm_eps = 1e-6, cfg.rope_theta = 1e6;
    cfg.tie_word_embeddings = false, cfg.max_positions = 4096;
    int B = 8, T = 256, P = 512;
    if (small) {
        cfg.vocab = 1000, cfg.hidden = 128, cfg.layers = 2,
        cfg.intermediate = 384;
        cfg.heads = 4, cfg.kv_heads = 2, cfg.head_dim = 32;
        B = 2, T = 64, P = 64;
    }
    const char *passes = getenv("TS_PASSES");
    printf("Qwen3-style model: hidden %lld, %lld layers, %lld heads / %lld KV, "
           "head dim %lld, MLP %lld, vocab %lld, f32; passes: %s\n",
           (long long)cfg.hidden, (long long)cfg.layers, (long long)cfg.heads,
           (long long)cfg.kv_heads, (long long)cfg.head_dim,
           (long long)cfg.intermediate, (long long)cfg.vocab,
           passes ? passes : "all");
    result e, c, pe, pc;
    run_pair(&cfg, B, T, steps, true, &e, &c);
    char what[64];
    snprintf(what, sizeof what, "train %dx%d", B, T);
    report(what, e, c);
    printf("%-14s loss after the steps: eager %.6f compiled %.6f\n", "", e.loss,
           c.loss);
    run_pair(&cfg, 1, P, steps, false, &pe, &pc);
    snprintf(what, sizeof what, "prefill %d", P);
    report(what, pe, pc);
    return 0;
}
