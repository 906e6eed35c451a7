/* bench_decode.c — the Qwen3-0.6B architecture (hidden 1024, 28 layers, 16
 * heads / 8 KV heads, head dim 128, MLP 3072, vocab 151936, tied
 * embeddings) with random weights kept in bf16 (or f32 with --f32):
 * prefill of 512 tokens and decode of 128 tokens through the KV cache, in
 * tokens/s at the context's threads, resident memory, and the bandwidth
 * decoding achieves reading the weights against a memcpy of the same size
 * measured in the same run. With --moe: a Qwen3-MoE-shaped model (8
 * experts, top 2) against the dense model with the same active
 * parameters (its MLP as wide as two experts), side by side.
 * With --quant: decode with the weights in bf16 and quantized (q8_0,
 * q4_k_m, q4_0), each against the read bound of its bytes.
 * With --model PATH: that model (a folder or a GGUF file) as loaded,
 * prefill and decode tokens/s as JSON (bench/llamacpp/compare.sh runs it
 * beside llama-bench on the same files).
 *   bench_decode [--f32] [--prefill N] [--decode N] [--small] [--moe]
 *                [--quant] [--model PATH] */
#include "core/core.h"
#include "tessera.h"
#include "tessera_models.h"

#include "qwen3_06b.h"
#include "read_bound.h"
#include <malloc.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long rss_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = atol(line + 6);
    if (f)
        fclose(f);
    return kb / 1024;
}

/* prefill of P tokens then G decode steps of a model made from cfg;
 * tokens/s of each (best of reps) */
static int time_model_loaded(ts_ctx *ctx, ts_decoder *m,
                             const ts_model_config *cfg, int P, int G, int reps,
                             double *prefill_tps, double *decode_tps);

static int time_model(ts_ctx *ctx, const ts_model_config *cfg, int P, int G,
                      int reps, double *prefill_tps, double *decode_tps) {
    ts_decoder_options o = {.weight_dtype = TS_BF16};
    ts_decoder *m;
    if (ts_decoder_new(ctx, cfg, &o, 1, &m) != TS_OK) {
        fprintf(stderr, "bench_decode: %s\n", ts_errmsg(ctx));
        return 1;
    }
    int r = time_model_loaded(ctx, m, cfg, P, G, reps, prefill_tps, decode_tps);
    ts_decoder_free(m);
    return r;
}

/* the same with a model made or loaded already (not freed) */
static int time_model_loaded(ts_ctx *ctx, ts_decoder *m,
                             const ts_model_config *cfg, int P, int G, int reps,
                             double *prefill_tps, double *decode_tps) {
    ts_decoder_cache *kc;
    if (ts_decoder_cache_new(m, 1, P + G, &kc) != TS_OK) {
        fprintf(stderr, "bench_decode: %s\n", ts_errmsg(ctx));
        return 1;
    }
    for (int i = 0; i < ts_decoder_num_params(m); i++)
        ts_set_requires_grad(ts_decoder_param(m, i), false);
    /* inference: the weights packed for the decode kernels, as `tessera
     * run` and the engine do (a no-op below AVX512_BF16) */
    if (ts_decoder_prepack(m) != TS_OK) {
        fprintf(stderr, "bench_decode: %s\n", ts_errmsg(ctx));
        ts_decoder_cache_free(kc);
        return 1;
    }
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)P);
    for (int i = 0; i < P; i++)
        ids[i] = (i * 7919) % cfg->vocab;
    int64_t shape[2] = {1, P}, one[2] = {1, 1};
    *prefill_tps = *decode_tps = 0;
    for (int r = 0; r < reps + 1; r++) { /* the first is a warm-up */
        ts_decoder_cache_reset(kc);
        ts_tensor *in = ts_from_data(ctx, TS_I64, 2, shape, ids);
        double a = now();
        ts_tensor *l = ts_decoder_forward_cached_last(m, kc, in);
        double pf = now() - a;
        ts_release(in), ts_release(l);
        int64_t tok = 1;
        a = now();
        for (int g = 0; g < G; g++) {
            ts_tensor *t = ts_from_data(ctx, TS_I64, 2, one, &tok);
            ts_tensor *lg = ts_decoder_forward_cached_last(m, kc, t);
            ts_tensor *best = ts_argmax(lg, -1, false);
            double v = 0;
            ts_item(best, &v);
            tok = (int64_t)v;
            ts_release(t), ts_release(lg), ts_release(best);
        }
        double dc = now() - a;
        if (r > 0 && P / pf > *prefill_tps)
            *prefill_tps = P / pf;
        if (r > 0 && G / dc > *decode_tps)
            *decode_tps = G / dc;
    }
    free(ids);
    ts_decoder_cache_free(kc);
    return 0;
}

/* --moe: the sparse model and its dense twin, alternately */
static int bench_moe(bool small, int P, int G) {
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_set_grad_enabled(ctx, false);
    ts_model_config moe = bench_preset("qwen3_moe");
    moe.vocab = 32000, moe.hidden = 1024, moe.layers = small ? 2 : 8;
    moe.heads = 16, moe.kv_heads = 8, moe.head_dim = 128;
    moe.max_positions = 4096, moe.norm_eps = 1e-6, moe.rope_theta = 1e6;
    moe.n_experts = 8, moe.experts_per_tok = 2, moe.moe_intermediate = 768;
    moe.intermediate = 3072, moe.moe_step = 1, moe.norm_topk_prob = true;
    ts_model_config dense = bench_preset("qwen3");
    dense.vocab = moe.vocab, dense.hidden = moe.hidden;
    dense.layers = moe.layers, dense.heads = moe.heads;
    dense.kv_heads = moe.kv_heads, dense.head_dim = moe.head_dim;
    dense.max_positions = moe.max_positions, dense.norm_eps = moe.norm_eps;
    dense.rope_theta = moe.rope_theta;
    dense.intermediate = moe.experts_per_tok * moe.moe_intermediate;
    printf("MoE: hidden %lld, %lld layers, %lld experts of %lld, top %lld, "
           "bf16 weights; dense twin: MLP %lld (the same active "
           "parameters); %d threads\n",
           (long long)moe.hidden, (long long)moe.layers,
           (long long)moe.n_experts, (long long)moe.moe_intermediate,
           (long long)moe.experts_per_tok, (long long)dense.intermediate,
           ts_get_num_threads(ctx));
    double mp = 0, md = 0, dp = 0, dd = 0;
    if (time_model(ctx, &moe, P, G, 2, &mp, &md) ||
        time_model(ctx, &dense, P, G, 2, &dp, &dd))
        return 1;
    printf("prefill %d tokens: MoE %.1f tokens/s, dense %.1f tokens/s: "
           "ratio %.2f\n",
           P, mp, dp, mp / dp);
    printf("decode %d tokens: MoE %.2f tokens/s, dense %.2f tokens/s: ratio "
           "%.2f\n",
           G, md, dd, md / dd);
    ts_ctx_free(ctx);
    return 0;
}

/* --quant: decode at batch 1 with the weights in bf16, then quantized to
 * each type (ts_decoder_quantize of a fresh bf16 model, same seed), each
 * beside a streaming read of the same bytes measured in the same run:
 * tokens/s, the ratio to bf16, and the share of the read bound the step
 * reaches (bytes of weights read per token / time). */
static int bench_quant(bool small, int P, int G) {
    static const char *const types[] = {"bf16", "q8_0", "q4_k_m", "q4_0"};
    const int n_types = (int)(sizeof types / sizeof *types);
    ts_model_config cfg = qwen3_06b(small);
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_set_grad_enabled(ctx, false);
    char feats[256];
    ts_cpu_features(feats, sizeof feats);
    printf("Qwen3-0.6B architecture%s, decode at batch 1 after a %d-token "
           "prompt, %d steps; %d threads; cpu path %s (machine: %s)\n",
           small ? " (small)" : "", P, G, ts_get_num_threads(ctx), ts_cpu_isa(),
           ts_cpu_isa_max());
    printf("%-8s %10s %9s %9s %10s %11s %9s\n", "weights", "MiB read", "tok/s",
           "x bf16", "GB/s", "read bound", "share");
    double base = 0;
    for (int t = 0; t < n_types; t++) {
        ts_decoder_options o = {.weight_dtype = TS_BF16};
        ts_decoder *m;
        ts_decoder_cache *kc;
        if (ts_decoder_new(ctx, &cfg, &o, 1, &m) != TS_OK ||
            (strcmp(types[t], "bf16") &&
             ts_decoder_quantize(m, types[t]) != TS_OK) ||
            ts_decoder_cache_new(m, 1, P + G, &kc) != TS_OK) {
            fprintf(stderr, "bench_decode: %s\n", ts_errmsg(ctx));
            return 1;
        }
        int64_t wbytes = 0;
        for (int i = 0; i < ts_decoder_num_params(m); i++) {
            ts_tensor *p = ts_decoder_param(m, i);
            ts_set_requires_grad(p, false);
            wbytes += ts_dtype_nbytes(ts_tensor_dtype(p), ts_tensor_numel(p));
        }
        ts_alloc_empty_cache(ctx);
        malloc_trim(0);
        int64_t *ids = malloc(sizeof(int64_t) * (size_t)P);
        for (int i = 0; i < P; i++)
            ids[i] = (i * 7919) % cfg.vocab;
        int64_t shape[2] = {1, P}, one[2] = {1, 1};
        double best = 0;
        for (int r = 0; r < 3; r++) { /* best of 3 (the first warms up) */
            ts_decoder_cache_reset(kc);
            ts_tensor *in = ts_from_data(ctx, TS_I64, 2, shape, ids);
            ts_release(ts_decoder_forward_cached_last(m, kc, in));
            ts_release(in);
            int64_t tok = 1;
            double a = now();
            for (int g = 0; g < G; g++) {
                ts_tensor *x = ts_from_data(ctx, TS_I64, 2, one, &tok);
                ts_tensor *l = ts_decoder_forward_cached_last(m, kc, x);
                ts_tensor *b = ts_argmax(l, -1, false);
                double v = 0;
                ts_item(b, &v);
                tok = (int64_t)v;
                ts_release(x), ts_release(l), ts_release(b);
            }
            double tps = G / (now() - a);
            best = tps > best ? tps : best;
        }
        free(ids);
        ts_decoder_cache_free(kc);
        ts_decoder_free(m);
        /* the read bound for these bytes, measured now */
        size_t mb = (size_t)wbytes / 128 * 128;
        float *buf = malloc(mb);
        memset(buf, 0, mb);
        double best_read = 1e9;
        float sink = 0;
        for (int r = 0; r < 5; r++) {
            double c0 = now();
            sink += read_all(buf, mb / sizeof(float));
            double c = now() - c0;
            best_read = c < best_read ? c : best_read;
        }
        free(buf);
        double bound = (double)mb / best_read / 1e9;
        double gbs = (double)wbytes * best / 1e9;
        if (t == 0)
            base = best;
        printf("%-8s %10.1f %9.2f %9.2f %10.1f %11.1f %8.0f%%%s\n", types[t],
               wbytes / 1048576.0, best, best / base, gbs, bound,
               100 * gbs / bound, sink == 12345 ? " " : "");
        fflush(stdout);
    }
    ts_ctx_free(ctx);
    return 0;
}

/* --model PATH (a folder or a GGUF file, as loaded): prefill of P tokens
 * and decode of G, best of 3 after a warm-up, as llama-bench's pp and tg
 * tests measure them, for a side-by-side run on the same file */
static int bench_file(const char *path, int P, int G) {
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_set_grad_enabled(ctx, false);
    ts_load_options lo = {.weight_dtype = TS_BF16};
    ts_decoder *m;
    if (ts_decoder_load_opts(ctx, path, &lo, &m) != TS_OK) {
        fprintf(stderr, "bench_decode: %s\n", ts_errmsg(ctx));
        return 1;
    }
    const ts_model_config *cfg = ts_decoder_get_config(m);
    double pp = 0, tg = 0;
    if (time_model_loaded(ctx, m, cfg, P, G, 3, &pp, &tg))
        return 1;
    printf("{\"model\": \"%s\", \"threads\": %d, \"isa\": \"%s\", "
           "\"pp%d\": %.2f, \"tg%d\": %.2f}\n",
           path, ts_get_num_threads(ctx), ts_cpu_isa(), P, pp, G, tg);
    ts_decoder_free(m);
    ts_ctx_free(ctx);
    return 0;
}

int main(int argc, char **argv) {
    bool f32 = false, small = false, moe = false, quant = false;
    const char *model = NULL;
    int P = 512, G = 128;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--f32"))
            f32 = true;
        else if (!strcmp(argv[i], "--small"))
            small = true;
        else if (!strcmp(argv[i], "--moe"))
            moe = true;
        else if (!strcmp(argv[i], "--quant"))
            quant = true;
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc)
            P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            G = atoi(argv[++i]);
        else {
            fprintf(
                stderr,
                "usage: bench_decode [--f32] [--prefill N] "
                "[--decode N] [--small] [--moe] [--quant] [--model PATH]\n");
            return 2;
        }
    }
    if (moe)
        return bench_moe(small, small ? 32 : P, small ? 8 : G / 2);
    if (quant)
        return bench_quant(small, small ? 16 : 64, small ? 8 : 32);
    if (model)
        return bench_file(model, P, G);
    ts_model_config cfg = qwen3_06b(small);
    ts_decoder_options dopt = {.weight_dtype = f32 ? TS_F32 : TS_BF16};
    if (small)
        P = 64, G = 16;
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_set_grad_enabled(ctx, false);
    double t0 = now();
    ts_decoder *m;
    if (ts_decoder_new(ctx, &cfg, &dopt, 1, &m) != TS_OK) {
        fprintf(stderr, "bench_decode: %s\n", ts_errmsg(ctx));
        return 1;
    }
    int64_t wbytes = 0, params = 0;
    for (int i = 0; i < ts_decoder_num_params(m); i++) {
        ts_tensor *p = ts_decoder_param(m, i);
        ts_set_requires_grad(p, false);
        params += ts_tensor_numel(p);
        wbytes +=
            ts_tensor_numel(p) * (int64_t)ts_dtype_size(ts_tensor_dtype(p));
    }
    /* the random init's f32 temporaries go back to the system (a model
     * loaded from a checkpoint has none: no init, zero-copy mapping) */
    ts_alloc_empty_cache(ctx);
    malloc_trim(0);
    /* inference: the packed copies the decode kernels read (resident
     * memory below counts them) */
    if (ts_decoder_prepack(m) != TS_OK) {
        fprintf(stderr, "bench_decode: %s\n", ts_errmsg(ctx));
        return 1;
    }
    long rss_model = rss_mib();
    printf("Qwen3-0.6B architecture%s: %.1f M parameters, %.0f MiB of weights "
           "(%s), %d threads, "
           "built in %.1f s\n",
           small ? " (small)" : "", params / 1e6, wbytes / 1048576.0,
           f32 ? "f32" : "bf16", ts_get_num_threads(ctx), now() - t0);
    ts_decoder_cache *kc;
    if (ts_decoder_cache_new(m, 1, P + G, &kc) != TS_OK)
        return 1;
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)P);
    for (int i = 0; i < P; i++)
        ids[i] = (i * 7919) % cfg.vocab;
    int64_t shape[2] = {1, P};
    ts_tensor *in = ts_from_data(ctx, TS_I64, 2, shape, ids);
    /* a warm-up prefill first (as llama-bench does): the cold one also
     * pays the first touch of every activation buffer */
    double a = now();
    ts_tensor *logits = ts_decoder_forward_cached_last(m, kc, in);
    double cold = now() - a;
    ts_release(logits);
    ts_decoder_cache_reset(kc);
    a = now();
    logits = ts_decoder_forward_cached_last(m, kc, in); /* as generation does */
    double prefill = now() - a;
    if (!logits) {
        fprintf(stderr, "bench_decode: %s\n", ts_errmsg(ctx));
        return 1;
    }
    ts_release(in), ts_release(logits);
    /* decode: one token at a time (argmax of the last logits) */
    int64_t tok = 1, one[2] = {1, 1};
    a = now();
    for (int g = 0; g < G; g++) {
        ts_tensor *t = ts_from_data(ctx, TS_I64, 2, one, &tok);
        ts_tensor *l = ts_decoder_forward_cached_last(m, kc, t);
        ts_tensor *best = ts_argmax(l, -1, false);
        double v = 0;
        ts_item(best, &v);
        tok = (int64_t)v;
        ts_release(t), ts_release(l), ts_release(best);
    }
    double decode = now() - a;
    long rss_run = rss_mib(); /* before the bandwidth buffers below */
    /* memcpy of the weights' size, best of 3, for the bandwidth bound */
    size_t mb = (size_t)wbytes;
    char *src = malloc(mb), *dst = malloc(mb);
    memset(src, 1, mb), memset(dst, 2, mb);
    double best_copy = 1e9;
    for (int r = 0; r < 3; r++) {
        double c0 = now();
        memcpy(dst, src, mb);
        double c = now() - c0;
        if (c < best_copy)
            best_copy = c;
    }
    double copy_gbs = 2.0 * (double)mb / best_copy / 1e9; /* read + write */
    /* the read-only bound: every thread streaming the buffer, best of 7 */
    double best_read = 1e9;
    float sink = 0;
    for (int r = 0; r < 7; r++) {
        double c0 = now();
        sink += read_all((const float *)src, mb / sizeof(float) / 32 * 32);
        double c = now() - c0;
        if (c < best_read)
            best_read = c;
    }
    double bound_gbs = (double)(mb / 128 * 128) / best_read / 1e9;
    /* bytes a decode step reads: every weight (the tied table as the LM
     * head) and the KV cache of the positions so far (f32) */
    double kv_bytes = 0;
    for (int g = 0; g < G; g++)
        kv_bytes += 2.0 * cfg.layers * cfg.kv_heads * cfg.head_dim * 4 *
                    (double)(P + g);
    double read_gbs = ((double)wbytes * G + kv_bytes) / decode / 1e9;
    printf("prefill %d tokens: %.2f s, %.1f tokens/s (cold, the first: %.1f "
           "tokens/s)\n",
           P, prefill, P / prefill, P / cold);
    printf("decode %d tokens: %.2f s, %.2f tokens/s; reads (weights + KV "
           "cache) at %.1f GB/s = %.0f%% of the read bandwidth bound %.1f "
           "GB/s (memcpy: %.1f GB/s read+write)%s\n",
           G, decode, G / decode, read_gbs, 100 * read_gbs / bound_gbs,
           bound_gbs, copy_gbs, sink == 12345 ? " " : "");
    printf("resident memory: %ld MiB after building the model, %ld MiB after "
           "prefill and decode\n",
           rss_model, rss_run);
    free(src), free(dst), free(ids);
    ts_decoder_cache_free(kc);
    ts_decoder_free(m);
    ts_ctx_free(ctx);
    return 0;
}
