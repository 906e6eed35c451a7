/* bench_engine.c — the serving engine on the Qwen3-0.6B architecture with
 * random bf16 weights (or --small: 2 layers, vocab 4096), every figure a
 * ratio measured side by side in one run (issue 22's targets):
 *  - aggregate decode tokens/s with 1, 8 and 32 concurrent streams (target:
 *    8 streams >= 5x one stream, 32 streams >= 12x), the engine as
 *    configured beside the old defaults (eager steps, f32 KV) with --compare;
 *  - batch-1 decode against the machine's read bound: the bytes of the
 *    weights a step reads, per token, against a streaming read of as many
 *    bytes (target >= 80%);
 *  - time to first token: a 1,000-token prompt cold and warm with its first
 *    950 tokens cached (target warm/cold <= 0.08), a 4,000-token prompt cold
 *    and with 3,900 tokens cached (target <= 0.05);
 *  - compiled steps against eager ones (decode, 1 and 8 streams).
 *   bench_engine [--small] [--decode N] [--kv-dtype f32|bf16|int8]
 *                [--eager] [--no-compare] [--no-ttft] */
#include "core/core.h"
#include "tessera_engine.h"

#include "qwen3_06b.h"
#include "read_bound.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(ts_ctx *ctx) {
    fprintf(stderr, "bench_engine: %s\n", ts_errmsg(ctx));
    return 1;
}

/* GB/s of the best of 5 streaming reads of bytes bytes */
static double read_bound(size_t bytes) {
    size_t n = bytes / sizeof(float);
    float *p = malloc(n * sizeof(float));
    if (!p)
        return 0;
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(i & 7);
    double best = 1e9, sink = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        sink += read_all(p, n);
        double t = now() - t0;
        best = t < best ? t : best;
    }
    free(p);
    if (sink == -1)
        printf("?");
    return (double)bytes / best / 1e9;
}

/* ---- engine runs ---- */

/* seconds until the request's first token; *cached its reused tokens */
static double ttft(ts_engine *e, const int32_t *prompt, size_t n,
                   int64_t *cached) {
    ts_request r = {.prompt = prompt,
                    .n_prompt = n,
                    .max_tokens = 1,
                    .sampling = ts_sampling_default(),
                    .ignore_eos = true};
    int64_t id;
    double t0 = now();
    if (ts_engine_add(e, &r, &id) != TS_OK)
        return -1;
    while (ts_engine_has_work(e)) {
        ts_engine_output out[64];
        int k = 0;
        if (ts_engine_step(e, out, 64, &k) != TS_OK)
            return -1;
        if (k) {
            *cached = out[0].cached_tokens;
            double t = now() - t0;
            while (ts_engine_has_work(e))
                if (ts_engine_step(e, out, 64, &k) != TS_OK)
                    return -1;
            return t;
        }
    }
    return -1;
}

/* generated tokens per second over streams x n_new tokens, counted from
 * the step after every stream has its first token (prefill is TTFT's) */
static double throughput(ts_engine *e, int streams, int n_new, int64_t vocab,
                         int salt) {
    int64_t id;
    for (int s = 0; s < streams; s++) {
        int32_t prompt[16];
        for (int t = 0; t < 16; t++)
            prompt[t] = (int32_t)((s * 131 + t * 17 + 7 + salt * 7919) % vocab);
        ts_request r = {.prompt = prompt,
                        .n_prompt = 16,
                        .max_tokens = n_new,
                        .sampling = ts_sampling_default(),
                        .ignore_eos = true};
        if (ts_engine_add(e, &r, &id) != TS_OK)
            return -1;
    }
    int64_t got = 0, firsts = 0;
    double t0 = 0;
    while (ts_engine_has_work(e)) {
        ts_engine_output out[128];
        int k = 0;
        if (ts_engine_step(e, out, 128, &k) != TS_OK)
            return -1;
        if (firsts < streams) {
            firsts += k;
            if (firsts >= streams)
                t0 = now();
            continue;
        }
        got += k;
    }
    return (double)got / (now() - t0);
}

static const char *kv_name(ts_kv_dtype d) {
    return d == TS_KV_F32 ? "f32" : d == TS_KV_INT8 ? "int8" : "bf16";
}

static ts_engine *make_engine(ts_ctx *ctx, ts_decoder *m, ts_kv_dtype kv,
                              bool eager, int max_seqs, int64_t blocks) {
    ts_engine_options o = ts_engine_options_default();
    o.n_blocks = blocks;
    o.kv_dtype = kv;
    o.enforce_eager = eager;
    o.max_seqs = max_seqs;
    ts_engine *e = NULL;
    if (ts_engine_new(ctx, m, &o, &e) != TS_OK)
        return NULL;
    return e;
}

int main(int argc, char **argv) {
    bool small = false, eager = false, compare = true, do_ttft = true;
    int n_new = 32;
    ts_kv_dtype kv = TS_KV_BF16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small"))
            small = true;
        else if (!strcmp(argv[i], "--eager"))
            eager = true;
        else if (!strcmp(argv[i], "--no-compare"))
            compare = false;
        else if (!strcmp(argv[i], "--no-ttft"))
            do_ttft = false;
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            n_new = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv-dtype") && i + 1 < argc) {
            const char *k = argv[++i];
            kv = !strcmp(k, "f32")    ? TS_KV_F32
                 : !strcmp(k, "int8") ? TS_KV_INT8
                                      : TS_KV_BF16;
        } else {
            fprintf(stderr,
                    "usage: bench_engine [--small] [--decode N] [--kv-dtype "
                    "f32|bf16|int8] [--eager] [--no-compare] [--no-ttft]\n");
            return 2;
        }
    }
    if (n_new < 2) {
        fprintf(stderr, "bench_engine: --decode wants at least 2 tokens\n");
        return 2;
    }
    ts_model_config cfg = qwen3_06b(small);
    ts_decoder_options dopt = {.weight_dtype = TS_BF16};
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_set_grad_enabled(ctx, false);
    ts_decoder *m;
    double t0 = now();
    if (ts_decoder_new(ctx, &cfg, &dopt, 1, &m) != TS_OK)
        return die(ctx);
    int64_t wbytes = 0;
    for (int i = 0; i < ts_decoder_num_params(m); i++)
        wbytes += ts_dtype_nbytes(ts_tensor_dtype(ts_decoder_param(m, i)),
                                  ts_tensor_numel(ts_decoder_param(m, i)));
    printf("Qwen3-0.6B architecture%s, bf16 weights (%.2f GB), %d threads, "
           "CPU path %s, built in %.1f s\n",
           small ? " (small: 2 layers, vocab 4096)" : "", (double)wbytes / 1e9,
           ts_get_num_threads(ctx), ts_cpu_isa(), now() - t0);
    int64_t blocks = small ? 512 : 1024;
    ts_engine *e = make_engine(ctx, m, kv, eager, 64, blocks);
    if (!e)
        return die(ctx);
    ts_engine_stats st;
    ts_engine_get_stats(e, &st);
    printf("engine: KV %s (%.2f MiB a block of 16 positions, %lld blocks), "
           "%s steps, max_num_seqs 64\n",
           kv_name(st.kv_dtype), (double)st.kv_block_bytes / (1 << 20),
           (long long)blocks, eager ? "eager" : "compiled");

    /* decode scaling */
    int counts[3] = {1, 8, 32};
    double tps[3];
    for (int i = 0; i < 3; i++) {
        tps[i] = throughput(e, counts[i], n_new, cfg.vocab, i);
        if (tps[i] < 0)
            return die(ctx);
        printf("decode, %2d streams x %d tokens: %7.1f tokens/s (%.2fx one "
               "stream)\n",
               counts[i], n_new, tps[i], tps[i] / tps[0]);
    }
    printf("8 streams vs 1: %.2fx (target >= 5: %s); 32 streams vs 1: %.2fx "
           "(target >= 12: %s)\n",
           tps[1] / tps[0], tps[1] / tps[0] >= 5 ? "yes" : "no",
           tps[2] / tps[0], tps[2] / tps[0] >= 12 ? "yes" : "no");

    /* batch-1 decode against the read bound, side by side */
    double bound = read_bound((size_t)wbytes);
    double one = throughput(e, 1, n_new, cfg.vocab, 7);
    double gbs = one * (double)wbytes / 1e9;
    printf("batch-1 decode: %.1f tokens/s = %.1f GB/s of weights; streaming "
           "read of the same %.2f GB: %.1f GB/s: %.0f%% of the bound "
           "(target >= 80%%)\n",
           one, gbs, (double)wbytes / 1e9, bound, 100 * gbs / bound);

    /* compiled against eager steps, and the old defaults */
    if (compare) {
        ts_engine *other = make_engine(ctx, m, kv, !eager, 64, 256);
        ts_engine *old = make_engine(ctx, m, TS_KV_F32, true, 16, 256);
        if (!other || !old)
            return die(ctx);
        for (int i = 0; i < 2; i++) {
            int s = counts[i];
            double a = throughput(e, s, n_new, cfg.vocab, 11 + i);
            double b = throughput(other, s, n_new, cfg.vocab, 11 + i);
            double c = throughput(old, s, n_new, cfg.vocab, 11 + i);
            if (a < 0 || b < 0 || c < 0)
                return die(ctx);
            double comp = eager ? b : a, eag = eager ? a : b;
            printf("decode, %d streams: compiled %.1f / eager %.1f tokens/s "
                   "(%.2fx); old defaults (eager, f32 KV) %.1f: this engine "
                   "%.2fx\n",
                   s, comp, eag, comp / eag, c, a / c);
        }
        ts_engine_get_stats(eager ? other : e, &st);
        printf("compiled steps: %lld plans captured, %lld replays\n",
               (long long)st.compiled_plans, (long long)st.compiled_replays);
        ts_engine_free(other), ts_engine_free(old);
    }

    /* time to first token, cold and over cached prefixes */
    if (do_ttft) {
        int lens[2] = {1000, 4000}, shared[2] = {950, 3900};
        double target[2] = {0.08, 0.05};
        int32_t *a = malloc(sizeof(int32_t) * 4000),
                *b = malloc(sizeof(int32_t) * 4000);
        for (int k = 0; k < 2; k++) {
            int n = lens[k];
            for (int t = 0; t < n; t++) {
                a[t] = (int32_t)((t * 7919 + 13 + k) % cfg.vocab);
                b[t] = t < shared[k] ? a[t]
                                     : (int32_t)((t * 104729 + 5) % cfg.vocab);
            }
            int64_t ca = 0, cb = 0;
            double cold = ttft(e, a, (size_t)n, &ca);
            double warm = ttft(e, b, (size_t)n, &cb);
            /* a second warm request with another tail (the first pays the
             * first use of its buffer sizes) */
            for (int t = shared[k]; t < n; t++)
                b[t] = (int32_t)((t * 104729 + 6) % cfg.vocab);
            double warm2 = ttft(e, b, (size_t)n, &cb);
            if (cold < 0 || warm < 0 || warm2 < 0)
                return die(ctx);
            warm = warm2 < warm ? warm2 : warm;
            printf("TTFT, %d-token prompt: cold %.3f s, warm %.3f s (%lld "
                   "cached): warm/cold %.3f (target <= %.2f: %s)\n",
                   n, cold, warm, (long long)cb, warm / cold, target[k],
                   warm / cold <= target[k] ? "yes" : "no");
        }
        free(a), free(b);
    }
    ts_engine_get_stats(e, &st);
    printf("engine: %lld steps, %lld tokens in batches, %lld prefix-hit of "
           "%lld prompt tokens, %lld plans, %lld replays\n",
           (long long)st.steps, (long long)st.batch_tokens,
           (long long)st.prefix_hit_tokens, (long long)st.prompt_tokens,
           (long long)st.compiled_plans, (long long)st.compiled_replays);
    ts_engine_free(e);
    ts_decoder_free(m);
    ts_ctx_free(ctx);
    return 0;
}
