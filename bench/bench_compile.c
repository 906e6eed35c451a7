/* bench_compile.c — eager against compiled on the Qwen3-style model
 * (hidden 512, 8 layers, 8 heads, 4 KV heads, head dim 64, MLP 1536, vocab
 * 32000, f32): a training step (forward + backward + AdamW) on a batch of
 * 8 x 256 tokens, and a 512-token prefill, side by side in one run. Time is
 * the median of the timed steps after a warm-up step; memory is the
 * allocator's peak during a step above what was in use before it (so
 * parameters and AdamW moments are not counted; gradients are). For the
 * compiled step the plan's predicted peak (arena + results kept) is printed
 * next to the measured one.
 *
 *   bench_compile [--steps N] [--small]
 *   TS_PASSES=-dce,-plan turns compiler passes off one by one. */
#include "tessera.h"
#include "tessera_nn.h"

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
    uint64_t graphs; /* compiled graphs run per step */
    uint64_t compiles, hits; /* plan cache over the whole run */
} result;

/* One run of `steps` timed steps (+1 warm-up) in the given mode. */
static result run(const ts_qwen3_config *cfg, int B, int T, int steps,
                  ts_mode mode, bool train) {
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK) exit(1);
    ts_qwen3_model *m;
    if (ts_qwen3_new(ctx, cfg, 1, &m) != TS_OK) die(ctx, "model");
    ts_adamw *opt = NULL;
    ts_adamw_options o = ts_adamw_default_options();
    o.lr = 1e-4;
    if (train &&
        ts_adamw_new(ctx, ts_qwen3_params(m), ts_qwen3_num_params(m), &o, &opt) != TS_OK)
        die(ctx, "adamw");
    int64_t shape[2] = {B, T};
    ts_tensor *ids = ts_rand(ctx, TS_F32, 2, shape, 0, (double)cfg->vocab, 7);
    ts_tensor *ids64 = ts_cast(ids, TS_I64);
    ts_tensor *tg = ts_rand(ctx, TS_F32, 2, shape, 0, (double)cfg->vocab, 8);
    ts_tensor *tg64 = ts_cast(tg, TS_I64);
    ts_release(ids), ts_release(tg);
    double *times = calloc((size_t)steps + 1, sizeof(double));
    result r = {0};
    ts_set_mode(ctx, mode);
    if (!train) ts_set_grad_enabled(ctx, false);
    for (int s = 0; s <= steps; s++) {
        ts_alloc_stats before, after;
        ts_compile_stats cs0;
        ts_get_compile_stats(ctx, &cs0);
        /* gradients are dropped before the step starts, so both modes
         * count them as new memory of the step */
        if (train) ts_zero_grads(ts_qwen3_params(m), ts_qwen3_num_params(m));
        ts_alloc_reset_peak(ctx);
        ts_alloc_get_stats(ctx, &before);
        double t0 = now();
        double loss = 0;
        if (train) {
            ts_tensor *l = ts_qwen3_loss(m, ids64, tg64, NULL);
            if (!l || ts_backward(l, NULL) != TS_OK) die(ctx, "step");
            if (ts_adamw_step(opt) != TS_OK) die(ctx, "adamw step");
            /* keep only the value: with the loss released, the autograd
             * graph (and every activation it saves) dies with the step,
             * so the compiler may place activations in the shared arena */
            ts_tensor *lv = ts_detach(l);
            ts_release(l);
            if (ts_sync(ctx) != TS_OK) die(ctx, "sync");
            if (ts_item(lv, &loss) != TS_OK) die(ctx, "loss");
            ts_release(lv);
        } else {
            ts_tensor *lg = ts_qwen3_forward(m, ids64, 0);
            if (!lg || ts_sync(ctx) != TS_OK) die(ctx, "prefill");
            ts_release(lg);
        }
        times[s] = now() - t0;
        ts_alloc_get_stats(ctx, &after);
        ts_compile_stats cs;
        ts_get_compile_stats(ctx, &cs);
        /* the arena of the previous graph was already in use before */
        size_t base = before.bytes_in_use;
        if (mode == TS_MODE_COMPILED && s > 0) base -= cs0.arena_bytes;
        r.peak = after.peak_bytes_in_use - base;
        r.predicted = cs.planned_peak_bytes;
        r.loss = loss;
        r.graphs = cs.graphs_run - cs0.graphs_run;
        r.compiles = cs.compilations;
        r.hits = cs.cache_hits;
    }
    qsort(times + 1, (size_t)steps, sizeof(double), cmp_d);
    r.ms = 1e3 * times[1 + steps / 2];
    free(times);
    ts_release(ids64), ts_release(tg64);
    ts_adamw_free(opt);
    ts_qwen3_free(m);
    ts_ctx_free(ctx);
    return r;
}

static void report(const char *what, result e, result c) {
    printf("%-14s eager %9.1f ms  compiled %9.1f ms  speedup %.3fx\n", what,
           e.ms, c.ms, e.ms / c.ms);
    printf("%-14s peak above start: eager %8.1f MiB  compiled %8.1f MiB  "
           "(%.1f%% lower)\n",
           "", e.peak / 1048576.0, c.peak / 1048576.0,
           100.0 * (1.0 - (double)c.peak / (double)e.peak));
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
    if (steps < 1) steps = 1;
    ts_qwen3_config cfg = {.vocab = 32000, .hidden = 512, .layers = 8,
                           .heads = 8, .kv_heads = 4, .head_dim = 64,
                           .intermediate = 1536, .rms_eps = 1e-6,
                           .rope_theta = 1e6, .tie_word_embeddings = false,
                           .max_positions = 4096};
    int B = 8, T = 256, P = 512;
    if (small) {
        cfg.vocab = 1000, cfg.hidden = 128, cfg.layers = 2, cfg.intermediate = 384;
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
    result e = run(&cfg, B, T, steps, TS_MODE_EAGER, true);
    result c = run(&cfg, B, T, steps, TS_MODE_COMPILED, true);
    char what[64];
    snprintf(what, sizeof what, "train %dx%d", B, T);
    report(what, e, c);
    printf("%-14s loss after the steps: eager %.6f compiled %.6f\n", "", e.loss, c.loss);
    result pe = run(&cfg, 1, P, steps, TS_MODE_EAGER, false);
    result pc = run(&cfg, 1, P, steps, TS_MODE_COMPILED, false);
    snprintf(what, sizeof what, "prefill %d", P);
    report(what, pe, pc);
    return 0;
}
