/* bench_vulkan.c — the Vulkan backend beside the CPU backend, in one run:
 * matmul GFLOP/s (f32, bf16), fused attention, prefill and decode tok/s of
 * the Qwen3-0.6B architecture (bf16 weights; 2 layers unless --full) with
 * decode's bandwidth (weights and KV read per token / time), and a training
 * step. Each figure is printed for both devices with their ratio. On
 * lavapipe (a CPU emulating a GPU) the Vulkan figures only show that the
 * path runs; on a GPU they are the ones issue 18 sets targets for.
 *
 *   ./build/bench_vulkan [--full] [--size N] [--device vulkan:N] */
#include "qwen3_06b.h"
#include "tessera_nn.h"

#include <math.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void die(ts_ctx *ctx, const char *what) {
    fprintf(stderr, "bench_vulkan: %s: %s\n", what, ts_errmsg(ctx));
    exit(1);
}

/* seconds per call of fn on device d: one warm-up, then calls until
 * min_s has passed (at least 2) */
typedef void (*bench_fn)(ts_ctx *ctx, ts_device d, void *arg);
static double timed(ts_ctx *ctx, ts_device d, bench_fn fn, void *arg,
                    double min_s) {
    fn(ctx, d, arg);
    if (ts_device_sync(ctx, d) != TS_OK)
        die(ctx, "sync");
    int n = 0;
    double t0 = now(), t;
    do {
        fn(ctx, d, arg);
        if (ts_device_sync(ctx, d) != TS_OK)
            die(ctx, "sync");
        n++;
        t = now() - t0;
    } while (t < min_s || n < 2);
    return t / n;
}

static void row(const char *what, double cpu, double vk, const char *unit) {
    printf("%-34s %12.2f %12.2f %s   vulkan/cpu %.2fx\n", what, cpu, vk, unit,
           cpu > 0 ? vk / cpu : 0);
}

/* ---- matmul ---- */

typedef struct {
    ts_tensor *a[2], *b[2]; /* per device: 0 cpu, 1 vulkan */
} mm_arg;

static void mm_run(ts_ctx *ctx, ts_device d, void *p) {
    mm_arg *m = p;
    int k = d.kind == TS_DEVICE_VULKAN;
    ts_tensor *c = ts_matmul(m->a[k], m->b[k]);
    if (!c)
        die(ctx, "matmul");
    ts_release(c);
}

static void bench_matmul(ts_ctx *ctx, ts_device vk, int64_t n, ts_dtype dt) {
    int64_t sh[2] = {n, n};
    mm_arg m;
    ts_tensor *a = ts_randn(ctx, TS_F32, 2, sh, 1, 1),
              *b = ts_randn(ctx, TS_F32, 2, sh, 1, 2);
    m.a[0] = ts_cast(a, dt), m.b[0] = ts_cast(b, dt);
    m.a[1] = ts_to_device(m.a[0], vk), m.b[1] = ts_to_device(m.b[0], vk);
    if (!m.a[1] || !m.b[1])
        die(ctx, "upload");
    double flop = 2.0 * (double)n * (double)n * (double)n;
    double tc = timed(ctx, (ts_device){TS_DEVICE_CPU, 0}, mm_run, &m, 0.5);
    double tv = timed(ctx, vk, mm_run, &m, 0.5);
    char what[64];
    snprintf(what, sizeof what, "matmul %lld^3 %s", (long long)n,
             ts_dtype_name(dt));
    row(what, flop / tc * 1e-9, flop / tv * 1e-9, "GFLOP/s");
    for (int i = 0; i < 2; i++)
        ts_release(m.a[i]), ts_release(m.b[i]);
    ts_release(a), ts_release(b);
}

/* ---- attention ---- */

typedef struct {
    ts_tensor *q[2], *k[2], *v[2];
} at_arg;

static void at_run(ts_ctx *ctx, ts_device d, void *p) {
    at_arg *a = p;
    int k = d.kind == TS_DEVICE_VULKAN;
    ts_tensor *o = ts_attention(a->q[k], a->k[k], a->v[k], NULL, true, 0);
    if (!o)
        die(ctx, "attention");
    ts_release(o);
}

static void bench_attention(ts_ctx *ctx, ts_device vk, int64_t T) {
    int64_t qs[4] = {1, 16, T, 128}, ks[4] = {1, 8, T, 128};
    at_arg a;
    a.q[0] = ts_randn(ctx, TS_F32, 4, qs, 1, 3);
    a.k[0] = ts_randn(ctx, TS_F32, 4, ks, 1, 4);
    a.v[0] = ts_randn(ctx, TS_F32, 4, ks, 1, 5);
    a.q[1] = ts_to_device(a.q[0], vk), a.k[1] = ts_to_device(a.k[0], vk);
    a.v[1] = ts_to_device(a.v[0], vk);
    double tc = timed(ctx, (ts_device){TS_DEVICE_CPU, 0}, at_run, &a, 0.5);
    double tv = timed(ctx, vk, at_run, &a, 0.5);
    /* causal: half of QK^T and PV, 2 flop each */
    double flop = 2.0 * 2.0 * 16 * (double)T * (double)T * 128 / 2;
    char what[64];
    snprintf(what, sizeof what, "attention causal T=%lld GQA 16/8",
             (long long)T);
    row(what, flop / tc * 1e-9, flop / tv * 1e-9, "GFLOP/s");
    for (int i = 0; i < 2; i++)
        ts_release(a.q[i]), ts_release(a.k[i]), ts_release(a.v[i]);
}

/* ---- the model: prefill, decode ---- */

typedef struct {
    ts_decoder *m[2];
    int64_t T;
    int decode_steps;
} lm_arg;

static void prefill_run(ts_ctx *ctx, ts_device d, void *p) {
    lm_arg *a = p;
    int k = d.kind == TS_DEVICE_VULKAN;
    int64_t sh[2] = {1, a->T};
    int64_t *ids = malloc(sizeof *ids * (size_t)a->T);
    for (int64_t i = 0; i < a->T; i++)
        ids[i] = (i * 7 + 1) % 4000;
    ts_tensor *x = ts_from_data(ctx, TS_I64, 2, sh, ids);
    free(ids);
    ts_decoder_cache *kc = NULL;
    if (ts_decoder_cache_new(a->m[k], 1, a->T + 8, &kc) != TS_OK)
        die(ctx, "cache");
    ts_tensor *lg = ts_decoder_forward_cached_last(a->m[k], kc, x);
    if (!lg)
        die(ctx, "prefill");
    ts_release(lg), ts_release(x);
    ts_decoder_cache_free(kc);
}

/* decode_steps tokens after a 32-token prompt (the prompt's time is
 * taken out by timing it alone) */
static double decode_time(ts_ctx *ctx, lm_arg *a, int k, ts_device d) {
    ts_decoder_cache *kc = NULL;
    if (ts_decoder_cache_new(a->m[k], 1, 64 + a->decode_steps, &kc) != TS_OK)
        die(ctx, "cache");
    int64_t ps[2] = {1, 32}, one[2] = {1, 1}, ids[32];
    for (int i = 0; i < 32; i++)
        ids[i] = i * 13 + 5;
    ts_tensor *x = ts_from_data(ctx, TS_I64, 2, ps, ids);
    ts_tensor *lg = ts_decoder_forward_cached_last(a->m[k], kc, x);
    ts_release(x);
    ts_tensor *h = lg ? ts_to_device(lg, (ts_device){TS_DEVICE_CPU, 0}) : NULL;
    ts_release(lg), ts_release(h);
    ts_device_sync(ctx, d);
    double t0 = now();
    for (int s = 0; s < a->decode_steps; s++) {
        int64_t tok = (s * 31 + 7) % 4000;
        x = ts_from_data(ctx, TS_I64, 2, one, &tok);
        lg = ts_decoder_forward_cached_last(a->m[k], kc, x);
        /* the token is sampled on the host: logits come back each step */
        h = lg ? ts_to_device(lg, (ts_device){TS_DEVICE_CPU, 0}) : NULL;
        if (!h)
            die(ctx, "decode");
        ts_release(x), ts_release(lg), ts_release(h);
    }
    double t = now() - t0;
    ts_decoder_cache_free(kc);
    return t / a->decode_steps;
}

/* the same model (seed 1) on cpu:0 (m[0]) and on vk (m[1]) */
static void model_pair(ts_ctx *ctx, ts_device vk, const ts_model_config *c,
                       ts_dtype wdt, ts_decoder *m[2]) {
    char vname[16];
    const char *maps[2] = {"cpu", ts_device_name(vk, vname)};
    for (int k = 0; k < 2; k++) {
        ts_device_map dm;
        if (ts_device_map_parse(ctx, maps[k], (int)c->layers, &dm) != TS_OK)
            die(ctx, "device map");
        ts_decoder_options o = {.weight_dtype = wdt, .device_map = &dm};
        if (ts_decoder_new(ctx, c, &o, 1, &m[k]) != TS_OK)
            die(ctx, "model");
        ts_device_map_free(&dm);
    }
}

static size_t weight_bytes(ts_decoder *m) {
    size_t b = 0;
    ts_tensor *const *p = ts_decoder_params(m);
    for (int i = 0; i < ts_decoder_num_params(m); i++)
        b += (size_t)ts_tensor_numel(p[i]) *
             ts_dtype_size(ts_tensor_dtype(p[i]));
    return b;
}

static void bench_model(ts_ctx *ctx, ts_device vk, bool full) {
    ts_model_config c = qwen3_06b(!full);
    lm_arg a = {.T = 512, .decode_steps = full ? 16 : 32};
    model_pair(ctx, vk, &c, TS_BF16, a.m);
    bool g = ts_set_grad_enabled(ctx, false);
    printf("Qwen3-0.6B architecture, %lld layers, vocab %lld, bf16 weights "
           "(%.0f MB)\n",
           (long long)c.layers, (long long)c.vocab,
           (double)weight_bytes(a.m[0]) / 1e6);
    double tc = timed(ctx, (ts_device){TS_DEVICE_CPU, 0}, prefill_run, &a, 1);
    double tv = timed(ctx, vk, prefill_run, &a, 1);
    row("prefill 512 tokens", 512 / tc, 512 / tv, "tok/s");
    double dc = decode_time(ctx, &a, 0, (ts_device){TS_DEVICE_CPU, 0});
    double dv = decode_time(ctx, &a, 1, vk);
    row("decode (1 sequence, ~40 cached)", 1 / dc, 1 / dv, "tok/s");
    /* bytes read per token: every weight once (the tied embedding's row
     * aside, the head reads it all) and the KV cache so far */
    double kv = 2.0 * (double)c.layers * (double)c.kv_heads *
                (double)c.head_dim * 4 * (32 + a.decode_steps / 2.0);
    double bytes = (double)weight_bytes(a.m[0]) + kv;
    row("decode bandwidth (weights+KV/time)", bytes / dc / 1e9,
        bytes / dv / 1e9, "GB/s");
    ts_set_grad_enabled(ctx, g);
    ts_decoder_free(a.m[0]), ts_decoder_free(a.m[1]);
}

/* ---- a compiled forward: replayed command buffer against recorded per
 * call (TS_NO_DEVICE_GRAPH) ---- */

typedef struct {
    ts_decoder *m;
    ts_tensor *ids;
} cf_arg;

static void cf_run(ts_ctx *ctx, ts_device d, void *p) {
    (void)d;
    cf_arg *a = p;
    ts_set_mode(ctx, TS_MODE_COMPILED);
    ts_tensor *lg = ts_decoder_forward(a->m, a->ids, 0);
    if (!lg || ts_sync(ctx) != TS_OK)
        die(ctx, "compiled forward");
    ts_set_mode(ctx, TS_MODE_EAGER);
    ts_release(lg);
}

static void bench_replay(ts_ctx *ctx, ts_device vk) {
    ts_model_config c = qwen3_06b(true);
    ts_decoder *m[2];
    model_pair(ctx, vk, &c, TS_BF16, m);
    int64_t sh[2] = {1, 16}, ids[16];
    for (int i = 0; i < 16; i++)
        ids[i] = i * 37 + 1;
    cf_arg a = {m[1], ts_from_data(ctx, TS_I64, 2, sh, ids)};
    bool g = ts_set_grad_enabled(ctx, false);
    ts_compile_stats s0, s1;
    ts_get_compile_stats(ctx, &s0);
    double rep = timed(ctx, vk, cf_run, &a, 1);
    ts_get_compile_stats(ctx, &s1);
    setenv("TS_NO_DEVICE_GRAPH", "1", 1);
    double rec = timed(ctx, vk, cf_run, &a, 1);
    unsetenv("TS_NO_DEVICE_GRAPH");
    ts_set_grad_enabled(ctx, g);
    printf("%-34s %12.2f %12.2f ms     replayed/recorded %.2fx (%llu "
           "replays)\n",
           "compiled forward T=16, vulkan", rec * 1e3, rep * 1e3, rec / rep,
           (unsigned long long)(s1.device_replays - s0.device_replays));
    ts_release(a.ids);
    ts_decoder_free(m[0]), ts_decoder_free(m[1]);
}

/* ---- a training step ---- */

typedef struct {
    ts_decoder *m[2];
    ts_adamw *opt[2];
} tr_arg;

static void train_run(ts_ctx *ctx, ts_device d, void *p) {
    tr_arg *a = p;
    int k = d.kind == TS_DEVICE_VULKAN;
    int64_t sh[2] = {4, 128};
    int64_t *ids = malloc(sizeof *ids * 512), *tg = malloc(sizeof *tg * 512);
    for (int i = 0; i < 512; i++)
        ids[i] = (i * 7 + 3) % 4096, tg[i] = (i * 11 + 5) % 4096;
    ts_tensor *x = ts_from_data(ctx, TS_I64, 2, sh, ids);
    ts_tensor *y = ts_from_data(ctx, TS_I64, 2, sh, tg);
    free(ids), free(tg);
    ts_tensor *loss = ts_decoder_loss(a->m[k], x, y, NULL);
    if (!loss || ts_backward(loss, NULL) != TS_OK ||
        ts_adamw_step(a->opt[k]) != TS_OK)
        die(ctx, "train step");
    double l;
    ts_item(loss, &l); /* the host reads the loss every step */
    ts_zero_grads(ts_decoder_params(a->m[k]), ts_decoder_num_params(a->m[k]));
    ts_release(loss), ts_release(x), ts_release(y);
}

static void bench_train(ts_ctx *ctx, ts_device vk) {
    ts_model_config c = qwen3_06b(true);
    c.hidden = 256, c.heads = 4, c.kv_heads = 2, c.head_dim = 64;
    c.intermediate = 768, c.layers = 4;
    tr_arg a;
    model_pair(ctx, vk, &c, TS_F32, a.m);
    for (int k = 0; k < 2; k++) {
        ts_adamw_options ao = ts_adamw_default_options();
        if (ts_adamw_new(ctx, ts_decoder_params(a.m[k]),
                         ts_decoder_num_params(a.m[k]), &ao,
                         &a.opt[k]) != TS_OK)
            die(ctx, "adamw");
    }
    double tc = timed(ctx, (ts_device){TS_DEVICE_CPU, 0}, train_run, &a, 1);
    double tv = timed(ctx, vk, train_run, &a, 1);
    row("train step 4x128, 4 layers x 256", 512 / tc, 512 / tv, "tok/s");
    for (int k = 0; k < 2; k++)
        ts_adamw_free(a.opt[k]), ts_decoder_free(a.m[k]);
}

int main(int argc, char **argv) {
    bool full = false;
    int64_t n = 512;
    const char *dev = "vulkan:0";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--full"))
            full = true;
        else if (!strcmp(argv[i], "--size") && i + 1 < argc)
            n = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            dev = argv[++i];
        else {
            fprintf(stderr,
                    "usage: bench_vulkan [--full] [--size N] [--device D]\n");
            return 2;
        }
    }
    ts_ctx *ctx;
    if (ts_ctx_new(&ctx, NULL) != TS_OK)
        return 1;
    ts_device vk;
    if (ts_device_parse(ctx, dev, &vk) != TS_OK)
        die(ctx, dev);
    ts_device_info ci, vi;
    ts_device_info_get(ctx, (ts_device){TS_DEVICE_CPU, 0}, &ci);
    ts_device_info_get(ctx, vk, &vi);
    printf("cpu:0  %s (%s)\n%-6s %s [%s] %s (%s)\n", ci.name, ci.features, dev,
           vi.name, vi.type, vi.driver, vi.features);
    printf("%-34s %12s %12s\n", "", "cpu:0", dev);
    bench_matmul(ctx, vk, n, TS_F32);
    bench_matmul(ctx, vk, n, TS_BF16);
    bench_attention(ctx, vk, 512);
    bench_model(ctx, vk, full);
    bench_replay(ctx, vk);
    bench_train(ctx, vk);
    ts_ctx_free(ctx);
    return 0;
}
