/* test_vk_moe.c — the mixture-of-experts MLP (ts_moe_experts) on vulkan:0
 * against the CPU: the forward for f32 and bf16 expert weights, gated and
 * plain, the three activations, E = 2/4/8, top-k 1/2/3, 1 to 130 tokens,
 * slots routed nowhere (-1), i32 and i64 indices, strided views (x
 * transposed, gate/up slices of one fused weight, w a column slice);
 * the backward through ts_backward (x, w and the three weight stacks); and
 * a tiny qwen3_moe decoder's logits and 5 training steps. */
#include "tessera_models.h"
#include "tessera_nn.h"
#include "vk_test.h"

#include <math.h>
#include <stdlib.h>

static ts_ctx *ctx;
static uint64_t seed = 1;

/* f32 sums in another order: rtol 1e-5, atol 1e-5 per sqrt of the terms
 * summed (C in the gate/up products, F in down's, and the rows of an
 * expert in a weight gradient), times the size of the terms */
static double atol_for(double terms, double scale) {
    return 1e-5 * sqrt(terms) * scale;
}

typedef struct {
    int64_t N, K, E, C, F;
    bool gated, bf16, i32, views;
    ts_act act;
} moe_case;

static const char *act_name[] = {"silu", "gelu_tanh", "gelu"};

/* idx (N, K): a fixed pseudo-random expert per slot; every 5th token's
 * last slot and every 7th token's slots route nowhere */
static ts_tensor *make_idx(const moe_case *c) {
    int64_t n = c->N * c->K, shape[2] = {c->N, c->K};
    int64_t *v = malloc(sizeof(int64_t) * (size_t)n);
    int32_t *v32 = malloc(sizeof(int32_t) * (size_t)n);
    uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)(c->N * 131 + c->E);
    for (int64_t t = 0; t < c->N; t++)
        for (int64_t j = 0; j < c->K; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int64_t e = (int64_t)((s >> 33) % (uint64_t)c->E);
            if ((t % 5 == 2 && j == c->K - 1) || t % 7 == 3)
                e = -1;
            v[t * c->K + j] = e;
            v32[t * c->K + j] = (int32_t)e;
        }
    ts_tensor *r = c->i32 ? ts_from_data(ctx, TS_I32, 2, shape, v32)
                          : ts_from_data(ctx, TS_I64, 2, shape, v);
    free(v), free(v32);
    return r;
}

/* the host inputs of a case: x, w, gate (or NULL), up, down; with views,
 * x is stored (C, N), w (N, K + 1) and gate/up as one (E, 2F, C) */
typedef struct {
    ts_tensor *x, *idx, *w, *gate, *up, *down, *fused;
} moe_inputs;

static moe_inputs make_inputs(const moe_case *c) {
    ts_dtype wdt = c->bf16 ? TS_BF16 : TS_F32;
    moe_inputs in = {0};
    int64_t xs[2] = {c->N, c->C}, xt[2] = {c->C, c->N};
    int64_t ws[2] = {c->N, c->K + (c->views ? 1 : 0)};
    int64_t gs[3] = {c->E, c->F, c->C}, ds[3] = {c->E, c->C, c->F};
    int64_t fs[3] = {c->E, 2 * c->F, c->C};
    in.x = ts_randn(ctx, TS_F32, 2, c->views ? xt : xs, 1.0, seed++);
    in.idx = make_idx(c);
    in.w = ts_rand(ctx, TS_F32, 2, ws, 0.1, 1.0, seed++);
    double sd = 1.0 / sqrt((double)c->C);
    if (c->views) {
        in.fused = ts_randn(ctx, wdt, 3, fs, sd, seed++);
    } else {
        in.gate = c->gated ? ts_randn(ctx, wdt, 3, gs, sd, seed++) : NULL;
        in.up = ts_randn(ctx, wdt, 3, gs, sd, seed++);
    }
    in.down = ts_randn(ctx, wdt, 3, ds, 1.0 / sqrt((double)c->F), seed++);
    return in;
}

static void free_inputs(moe_inputs *in) {
    ts_release(in->x), ts_release(in->idx), ts_release(in->w);
    ts_release(in->gate), ts_release(in->up), ts_release(in->down);
    ts_release(in->fused);
}

/* the leaves on one device (dev 0: copies on the CPU, 1: on vulkan:0),
 * requires_grad when grad (the bf16 weights get none) */
typedef struct {
    ts_tensor *leaf[6]; /* x, w, gate, up, down, fused */
} moe_leaves;

static moe_leaves leaves_of(const moe_inputs *in, int dev, bool grad) {
    ts_tensor *src[6] = {in->x, in->w, in->gate, in->up, in->down, in->fused};
    moe_leaves l = {{0}};
    for (int i = 0; i < 6; i++) {
        if (!src[i])
            continue;
        l.leaf[i] = dev ? vkt_up(src[i]) : ts_detach(src[i]);
        if (grad && (i < 2 || ts_tensor_dtype(src[i]) == TS_F32))
            CHECK_OK(ctx, ts_set_requires_grad(l.leaf[i], true));
    }
    return l;
}

/* the op on the leaves, through the views of the case */
static ts_tensor *run_moe(const moe_case *c, const moe_leaves *l,
                          ts_tensor *idx) {
    ts_tensor *x = l->leaf[0], *w = l->leaf[1], *gate = l->leaf[2];
    ts_tensor *up = l->leaf[3];
    ts_tensor *xv = NULL, *wv = NULL, *gv = NULL, *uv = NULL;
    if (c->views) {
        xv = ts_transpose(x, 0, 1);
        wv = ts_slice(w, 1, 1, c->K + 1, 1);
        gv = c->gated ? ts_slice(l->leaf[5], 1, 0, c->F, 1) : NULL;
        uv = ts_slice(l->leaf[5], 1, c->F, 2 * c->F, 1);
        x = xv, w = wv, gate = gv, up = uv;
    }
    ts_tensor *y = ts_moe_experts(x, idx, w, gate, up, l->leaf[4], c->act);
    if (!y)
        fprintf(stderr, "  moe_experts: %s\n", ts_errmsg(ctx));
    ts_release(xv), ts_release(wv), ts_release(gv), ts_release(uv);
    return y;
}

static void case_name(const moe_case *c, char *buf, size_t n) {
    snprintf(buf, n, "moe N=%lld K=%lld E=%lld C=%lld F=%lld %s %s %s%s%s",
             (long long)c->N, (long long)c->K, (long long)c->E, (long long)c->C,
             (long long)c->F, c->gated ? "gated" : "plain", act_name[c->act],
             c->bf16 ? "bf16" : "f32", c->i32 ? " i32" : "",
             c->views ? " views" : "");
}

/* forward, and with grad the backward with a random upstream gradient:
 * the output and every leaf's gradient against the CPU's */
static void check_moe(const moe_case *c, bool grad) {
    char what[200], w2[260];
    case_name(c, what, sizeof what);
    moe_inputs in = make_inputs(c);
    int64_t ys[2] = {c->N, c->C};
    ts_tensor *dy = grad ? ts_randn(ctx, TS_F32, 2, ys, 1.0, seed++) : NULL;
    moe_leaves l[2];
    ts_tensor *y[2] = {0};
    for (int dev = 0; dev < 2; dev++) {
        l[dev] = leaves_of(&in, dev, grad);
        ts_tensor *idx = dev ? vkt_up(in.idx) : ts_retain(in.idx);
        y[dev] = run_moe(c, &l[dev], idx);
        if (grad && y[dev]) {
            ts_tensor *g = dev ? vkt_up(dy) : ts_retain(dy);
            CHECK_OK(ctx, ts_backward(y[dev], g));
            ts_release(g);
        }
        ts_release(idx);
    }
    /* |y| ~ K (weights < 1, terms ~1) */
    vkt_close(what, y[1], y[0], 1e-5,
              atol_for((double)(c->C + c->F), (double)c->K));
    static const char *names[6] = {"dx",  "dw",    "dgate",
                                   "dup", "ddown", "dgate_up"};
    /* rows routed to one expert, about N K / E of them, at most N K */
    double rows = (double)(c->N * c->K);
    double terms[6] = {
        c->K * (double)(c->C + c->F), (double)c->F, rows, rows, rows, rows};
    for (int i = 0; grad && i < 6; i++) {
        ts_tensor *g0 = l[0].leaf[i] ? ts_grad(l[0].leaf[i]) : NULL;
        ts_tensor *g1 = l[1].leaf[i] ? ts_grad(l[1].leaf[i]) : NULL;
        bool wants = l[0].leaf[i] && (i < 2 || !c->bf16);
        CHECK(wants == (g0 != NULL));
        if (!g0)
            continue;
        snprintf(w2, sizeof w2, "%s: %s", what, names[i]);
        vkt_close(w2, g1, g0, 1e-5, atol_for(terms[i], 2.0));
    }
    for (int dev = 0; dev < 2; dev++) {
        ts_release(y[dev]);
        for (int i = 0; i < 6; i++)
            ts_release(l[dev].leaf[i]);
    }
    ts_release(dy);
    free_inputs(&in);
}

static void test_forward(void) {
    const int64_t Ns[] = {1, 3, 17, 64};
    for (int b = 0; b < 2; b++)
        for (int ni = 0; ni < 4; ni++)
            for (int k = 1; k <= 2; k++) {
                moe_case c = {.N = Ns[ni],
                              .K = k,
                              .E = ni % 2 ? 8 : 4,
                              .C = 24,
                              .F = 40,
                              .gated = (ni + k) % 2 == 0 || b,
                              .bf16 = b,
                              .i32 = ni == 2,
                              .act = (ts_act)((ni + k + b) % 3)};
                check_moe(&c, false);
            }
    /* more than one column tile and k step; tiles of 64 rows (N K >=
     * 64 E); strided views; top-3 */
    moe_case wide = {.N = 5, .K = 2, .E = 4, .C = 70, .F = 130, .gated = 1};
    check_moe(&wide, false);
    moe_case tall = {.N = 130, .K = 2, .E = 4, .C = 20, .F = 36, .gated = 1};
    check_moe(&tall, false);
    tall.bf16 = true, tall.gated = false, tall.act = TS_ACT_GELU;
    check_moe(&tall, false);
    moe_case views = {
        .N = 9, .K = 3, .E = 4, .C = 16, .F = 24, .gated = 1, .views = 1};
    check_moe(&views, false);
    views.bf16 = true, views.act = TS_ACT_GELU_TANH;
    check_moe(&views, false);
}

static void test_backward(void) {
    moe_case cases[] = {
        {.N = 17, .K = 2, .E = 4, .C = 24, .F = 40, .gated = 1},
        {.N = 6, .K = 1, .E = 8, .C = 16, .F = 20, .act = TS_ACT_GELU_TANH},
        {.N = 11,
         .K = 2,
         .E = 4,
         .C = 20,
         .F = 18,
         .gated = 1,
         .bf16 = 1,
         .act = TS_ACT_GELU},
        {.N = 130, .K = 2, .E = 4, .C = 20, .F = 70, .gated = 1, .i32 = 1},
        {.N = 9, .K = 3, .E = 4, .C = 16, .F = 24, .gated = 1, .views = 1},
        {.N = 3, .K = 2, .E = 8, .C = 8, .F = 12, .act = TS_ACT_GELU},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_moe(&cases[i], true);
}

/* ---- a whole mixture-of-experts decoder ---- */

static const int64_t IDS[2][6] = {{3, 14, 15, 42, 6, 9}, {5, 35, 8, 9, 7, 1}};

static ts_decoder *tiny_moe(const char *map) {
    ts_model_config e = tu_config("qwen3_moe");
    e.vocab = 101, e.hidden = 32, e.layers = 2, e.heads = 4, e.kv_heads = 2;
    e.head_dim = 8, e.intermediate = 48, e.max_positions = 64;
    e.n_experts = 4, e.experts_per_tok = 2, e.moe_intermediate = 16;
    e.norm_eps = 1e-6, e.rope_theta = 10000;
    ts_device_map dm;
    CHECK_OK(ctx, ts_device_map_parse(ctx, map, (int)e.layers, &dm));
    ts_decoder_options o = {.device_map = &dm};
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_new(ctx, &e, &o, 7, &m));
    ts_device_map_free(&dm);
    return m;
}

/* logits (2, 6, V) on the host, then 5 AdamW steps' losses */
static ts_tensor *model_run(const char *map, double *losses) {
    ts_decoder *m = tiny_moe(map);
    if (!m)
        return NULL;
    int64_t shape[2] = {2, 6}, tg[2][6];
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 6; t++)
            tg[b][t] = (IDS[b][t] * 7 + 3) % 101;
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, IDS);
    ts_tensor *tgt = ts_from_data(ctx, TS_I64, 2, shape, tg);
    bool ge = ts_set_grad_enabled(ctx, false);
    ts_tensor *lg = ts_decoder_forward(m, ids, 0);
    ts_set_grad_enabled(ctx, ge);
    ts_tensor *logits = lg ? vkt_down(lg) : NULL;
    ts_release(lg);
    ts_adamw_options ao = ts_adamw_default_options();
    ao.lr = 3e-3;
    ts_adamw *opt = NULL;
    CHECK_OK(ctx, ts_adamw_new(ctx, ts_decoder_params(m),
                               ts_decoder_num_params(m), &ao, &opt));
    for (int step = 0; opt && step < 5; step++) {
        ts_tensor *loss = ts_decoder_loss(m, ids, tgt, NULL);
        losses[step] = NAN;
        if (!loss) {
            fprintf(stderr, "  train on %s: %s\n", map, ts_errmsg(ctx));
            CHECK(loss != NULL);
            break;
        }
        CHECK_OK(ctx, ts_backward(loss, NULL));
        CHECK_OK(ctx, ts_adamw_step(opt));
        CHECK_OK(ctx, ts_item(loss, &losses[step]));
        for (int i = 0; i < ts_decoder_num_params(m); i++)
            ts_zero_grad(ts_decoder_params(m)[i]);
        ts_release(loss);
    }
    ts_adamw_free(opt);
    ts_release(ids), ts_release(tgt);
    ts_decoder_free(m);
    return logits;
}

static void test_model(void) {
    double cpu[5], vk[5];
    ts_tensor *ref = model_run("cpu", cpu);
    ts_tensor *got = model_run("vulkan:0", vk);
    test_allclose("qwen3_moe logits on vulkan:0", got, ref, 1e-4, 1e-4);
    double worst = 0;
    for (int s = 0; s < 5; s++) {
        double r = fabs(vk[s] - cpu[s]) / fabs(cpu[s]);
        worst = r > worst || isnan(r) ? r : worst;
    }
    printf("training qwen3_moe: loss %.5f -> %.5f on the CPU, %.5f -> %.5f "
           "on vulkan:0, worst relative difference %.2e\n",
           cpu[0], cpu[4], vk[0], vk[4], worst);
    CHECK(worst <= 1e-4);
    CHECK(cpu[4] < cpu[0]);
    ts_release(ref), ts_release(got);
}

/* compiled on Vulkan (the plan recorded once, then replayed with new
 * inputs) against eager on Vulkan */
static void test_compiled(void) {
    ts_decoder *m = tiny_moe("vulkan:0");
    if (!m)
        return;
    bool ge = ts_set_grad_enabled(ctx, false);
    for (int rep = 0; rep < 3; rep++) {
        int64_t shape[2] = {2, 6}, v[2][6];
        for (int b = 0; b < 2; b++)
            for (int t = 0; t < 6; t++)
                v[b][t] = (IDS[b][t] + 17 * rep) % 101;
        ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, v);
        char what[64];
        snprintf(what, sizeof what, "qwen3_moe compiled on vulkan, call %d",
                 rep + 1);
        vkt_eager_vs_compiled(ctx, m, ids, what);
        ts_release(ids);
    }
    ts_set_grad_enabled(ctx, ge);
    ts_decoder_free(m);
}

/* an index outside [-1, E) routes nowhere on Vulkan (the CPU's range
 * check would need the values on the host); no hidden units give 0 */
static void test_edges(void) {
    int64_t xs[2] = {3, 8}, is[2] = {3, 2}, ws[3] = {2, 4, 8};
    int64_t ds[3] = {2, 8, 4}, bad[6] = {0, 2, -1, 1, 7, -3};
    int64_t none[6] = {0, -1, -1, 1, -1, -1};
    ts_tensor *x = ts_randn(ctx, TS_F32, 2, xs, 1.0, seed++);
    ts_tensor *w = ts_rand(ctx, TS_F32, 2, is, 0.1, 1.0, seed++);
    ts_tensor *up = ts_randn(ctx, TS_F32, 3, ws, 0.3, seed++);
    ts_tensor *down = ts_randn(ctx, TS_F32, 3, ds, 0.3, seed++);
    ts_tensor *ib = ts_from_data(ctx, TS_I64, 2, is, bad);
    ts_tensor *in = ts_from_data(ctx, TS_I64, 2, is, none);
    ts_tensor *want = ts_moe_experts(x, in, w, NULL, up, down, TS_ACT_SILU);
    ts_tensor *vx = vkt_up(x), *vw = vkt_up(w), *vu = vkt_up(up);
    ts_tensor *vd = vkt_up(down), *vib = vkt_up(ib);
    ts_tensor *got = ts_moe_experts(vx, vib, vw, NULL, vu, vd, TS_ACT_SILU);
    vkt_close("moe idx out of range on vulkan", got, want, 1e-5, 1e-5);
    ts_release(got), ts_release(want);
    int64_t zs[3] = {2, 0, 8}, zd[3] = {2, 8, 0};
    ts_tensor *zu = ts_randn(ctx, TS_F32, 3, zs, 1.0, seed++);
    ts_tensor *zdn = ts_randn(ctx, TS_F32, 3, zd, 1.0, seed++);
    ts_tensor *vzu = vkt_up(zu), *vzd = vkt_up(zdn), *vin = vkt_up(in);
    want = ts_moe_experts(x, in, w, NULL, zu, zdn, TS_ACT_SILU);
    got = ts_moe_experts(vx, vin, vw, NULL, vzu, vzd, TS_ACT_SILU);
    vkt_close("moe F = 0 on vulkan", got, want, 0, 0);
    ts_release(got), ts_release(want);
    ts_release(x), ts_release(w), ts_release(up), ts_release(down);
    ts_release(ib), ts_release(in), ts_release(vx), ts_release(vw);
    ts_release(vu), ts_release(vd), ts_release(vib), ts_release(zu);
    ts_release(zdn), ts_release(vzu), ts_release(vzd), ts_release(vin);
}

int main(void) {
    ctx = vkt_ctx("test_vk_moe");
    test_forward();
    test_backward();
    test_edges();
    test_model();
    test_compiled();
    ts_ctx_free(ctx);
    return test_finish("test_vk_moe");
}
