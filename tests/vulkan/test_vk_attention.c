/* test_vk_attention.c — attention on vulkan:0 against the CPU backend:
 * ts_attention_ex forward (f32 and bf16; odd T; head dims 32 to 128; GQA
 * 4:1 and 2:1 and MHA; causal with fewer queries than keys, sliding
 * window, softcap, a broadcast mask, a strided q), its backward through
 * ts_backward (the grads of q, k, v), and ts_paged_attention_ex over a
 * block table whose blocks are out of order, with sequences of different
 * lengths and partly filled last blocks (decode, prefill; the pools
 * written too). Tolerances: f32 rtol 1e-5, atol 2e-5 (outputs), 1e-4
 * (gradients, sums over up to 100 keys of products of O(1) terms); bf16
 * rtol 8e-3, atol 1e-3 (one bf16 rounding of the same f32 value). */
#include "vk_test.h"

#include <stdint.h>
#include <stdlib.h>

#define F32_RTOL  1e-5
#define F32_ATOL  2e-5
#define GRAD_ATOL 1e-4
#define BF16_RTOL 8e-3
#define BF16_ATOL 1e-3

typedef struct {
    ts_dtype dt;
    int64_t B, H, KV, T, S, D;
    bool causal, mask, strided_q;
    int64_t window;
    double softcap, scale;
} attn_case;

static void describe(const attn_case *c, const char *what, char *buf,
                     size_t n) {
    snprintf(
        buf, n, "%s %s B%lld H%lld KV%lld T%lld S%lld D%lld%s%s%s w%lld cap%g",
        what, c->dt == TS_BF16 ? "bf16" : "f32", (long long)c->B,
        (long long)c->H, (long long)c->KV, (long long)c->T, (long long)c->S,
        (long long)c->D, c->causal ? " causal" : "", c->mask ? " mask" : "",
        c->strided_q ? " strided-q" : "", (long long)c->window, c->softcap);
}

/* q's leaf: (B, H, T, D), or with strided_q (B, T, H, D), whose
 * transposed view is q (strides not those of a contiguous tensor) */
static ts_tensor *make_q_leaf(ts_ctx *ctx, const attn_case *c, uint64_t seed) {
    int64_t sq[4] = {c->B, c->H, c->T, c->D};
    if (c->strided_q)
        sq[1] = c->T, sq[2] = c->H;
    return ts_randn(ctx, c->dt, 4, sq, 1, seed);
}
static ts_tensor *q_of(const attn_case *c, ts_tensor *leaf) {
    return c->strided_q ? ts_transpose(leaf, 1, 2) : ts_retain(leaf);
}

/* the additive mask (B, 1, T, S), broadcast over heads: zeros and -1e9
 * (no row wholly hidden), and some finite values */
static ts_tensor *make_mask(ts_ctx *ctx, const attn_case *c) {
    int64_t n = c->B * c->T * c->S, sm[4] = {c->B, 1, c->T, c->S};
    float *m = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        m[i] = i % 7 == 3 ? -1e9f : i % 5 == 1 ? 0.5f : 0.0f;
    for (int64_t r = 0; r < c->B * c->T; r++)
        m[r * c->S + c->S - 1] = 0; /* the last key always visible */
    ts_tensor *t = ts_from_data(ctx, TS_F32, 4, sm, m);
    free(m);
    return t;
}

static ts_attn_opts opts_of(const attn_case *c) {
    return (ts_attn_opts){.causal = c->causal,
                          .scale = c->scale,
                          .window = c->window,
                          .softcap = c->softcap};
}

static double rtol_of(const attn_case *c) {
    return c->dt == TS_BF16 ? BF16_RTOL : F32_RTOL;
}

/* the forward on both devices; with grads, also ts_backward from a random
 * d(out) and the grads of q, k, v */
static void run_case(ts_ctx *ctx, const attn_case *c, bool grads) {
    int64_t sk[4] = {c->B, c->KV, c->S, c->D};
    ts_tensor *ql = make_q_leaf(ctx, c, 101);
    ts_tensor *k = ts_randn(ctx, c->dt, 4, sk, 1, 102);
    ts_tensor *v = ts_randn(ctx, c->dt, 4, sk, 1, 103);
    ts_tensor *mask = c->mask ? make_mask(ctx, c) : NULL;
    ts_tensor *qld = vkt_up(ql), *kd = vkt_up(k), *vd = vkt_up(v);
    ts_tensor *maskd = mask ? vkt_up(mask) : NULL;
    CHECK(qld && kd && vd && (!mask || maskd));
    if (grads) {
        ts_tensor *leaves[6] = {ql, k, v, qld, kd, vd};
        for (int i = 0; i < 6; i++)
            CHECK_OK(ctx, ts_set_requires_grad(leaves[i], true));
    }
    ts_tensor *q = q_of(c, ql), *qd = q_of(c, qld);
    ts_attn_opts o = opts_of(c);
    ts_tensor *want = ts_attention_ex(q, k, v, mask, &o);
    ts_tensor *got = ts_attention_ex(qd, kd, vd, maskd, &o);
    char what[200];
    describe(c, "attention", what, sizeof what);
    CHECK(want != NULL);
    if (!got)
        fprintf(stderr, "%s: %s\n", what, ts_errmsg(ctx)), ts_clear_error(ctx);
    double atol = c->dt == TS_BF16 ? BF16_ATOL : F32_ATOL;
    if (want)
        vkt_close(what, got, want, rtol_of(c), atol);

    if (grads && want && got) {
        int64_t sq[4] = {c->B, c->H, c->T, c->D};
        ts_tensor *g = ts_randn(ctx, c->dt, 4, sq, 1, 104);
        ts_tensor *gd = vkt_up(g);
        CHECK_OK(ctx, ts_backward(want, g));
        CHECK_OK(ctx, ts_backward(got, gd));
        const char *names[3] = {"dq", "dk", "dv"};
        ts_tensor *cpu_leaf[3] = {ql, k, v}, *vk_leaf[3] = {qld, kd, vd};
        double gatol = c->dt == TS_BF16 ? BF16_ATOL : GRAD_ATOL;
        for (int i = 0; i < 3; i++) {
            char w[240];
            snprintf(w, sizeof w, "%s: %s", what, names[i]);
            ts_tensor *gw = ts_grad(cpu_leaf[i]), *gg = ts_grad(vk_leaf[i]);
            CHECK(gw != NULL);
            if (gw)
                vkt_close(w, gg, gw, rtol_of(c), gatol);
        }
        ts_release(g), ts_release(gd);
    }
    ts_release(want), ts_release(got);
    ts_release(q), ts_release(k), ts_release(v), ts_release(mask);
    ts_release(qd), ts_release(kd), ts_release(vd), ts_release(maskd);
    ts_release(ql), ts_release(qld);
}

static void test_forward(ts_ctx *ctx) {
    const attn_case cases[] = {
        /* GQA 4:1, odd T, causal */
        {TS_F32, 1, 4, 1, 17, 17, 32, true, false, false, 0, 0, 0},
        /* GQA 2:1, the queries the last 3 of 100 keys */
        {TS_F32, 2, 4, 2, 3, 100, 64, true, false, false, 0, 0, 0},
        /* MHA, not causal, several query blocks and key tiles */
        {TS_F32, 1, 2, 2, 100, 100, 128, false, false, false, 0, 0, 0},
        /* decoding: one query */
        {TS_F32, 1, 8, 2, 1, 37, 64, true, false, false, 0, 0, 0},
        {TS_F32, 2, 2, 1, 1, 1, 32, true, false, false, 0, 0, 0},
        /* sliding window and softcap, an explicit scale */
        {TS_F32, 1, 4, 1, 33, 65, 32, true, false, false, 9, 3.0, 0.2},
        /* broadcast mask, a window without causal */
        {TS_F32, 2, 2, 1, 17, 40, 32, false, true, false, 5, 0, 0},
        /* q a strided view; a head dim not a power of two */
        {TS_F32, 1, 4, 2, 20, 20, 64, true, false, true, 0, 0, 0},
        {TS_F32, 1, 2, 1, 5, 9, 80, false, false, false, 0, 1.5, 0},
        /* bf16 q, k, v (and out) */
        {TS_BF16, 1, 4, 1, 17, 17, 32, true, false, false, 0, 0, 0},
        {TS_BF16, 1, 2, 2, 100, 100, 128, false, false, false, 0, 0, 0},
        {TS_BF16, 1, 4, 2, 33, 65, 64, true, false, false, 9, 3.0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run_case(ctx, &cases[i], false);
}

static void test_backward(ts_ctx *ctx) {
    const attn_case cases[] = {
        {TS_F32, 1, 4, 1, 17, 17, 32, true, false, false, 0, 0, 0},
        {TS_F32, 2, 2, 2, 3, 20, 64, true, false, false, 0, 0, 0},
        {TS_F32, 1, 4, 2, 33, 33, 32, true, false, false, 7, 2.0, 0},
        {TS_F32, 1, 2, 1, 9, 12, 128, false, true, false, 0, 0, 0},
        {TS_F32, 1, 2, 2, 1, 5, 32, false, false, true, 0, 0, 0},
        {TS_BF16, 1, 4, 2, 17, 17, 64, true, false, false, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run_case(ctx, &cases[i], true);
}

/* ---- paged attention ---- */

typedef struct {
    int64_t H, KV, D, BS, NB, MB;
    int ns;
    const int32_t *clen, *nnew; /* cached and new positions per sequence */
    ts_attn_opts opts;
} paged_case;

/* the meta of ts_paged_attention_ex: blocks handed out as (7 n + 5) mod NB
 * (out of order), unused table entries 0 */
static ts_tensor *make_meta(ts_ctx *ctx, const paged_case *c, int64_t *N) {
    int64_t len = 2 + c->ns + 1 + c->ns + c->ns * c->MB;
    int32_t *m = calloc((size_t)len, sizeof(int32_t));
    m[0] = c->ns, m[1] = (int32_t)c->MB;
    int32_t *start = m + 2, *cl = start + c->ns + 1, *table = cl + c->ns;
    for (int i = 0, next = 0; i < c->ns; i++) {
        start[i + 1] = start[i] + c->nnew[i];
        cl[i] = c->clen[i];
        for (int64_t b = 0; b < c->MB; b++)
            if (b * c->BS < c->clen[i] + c->nnew[i])
                table[i * c->MB + b] = (int32_t)((next++ * 7 + 5) % c->NB);
    }
    *N = start[c->ns];
    ts_tensor *t = ts_from_data(ctx, TS_I32, 1, &len, m);
    free(m);
    return t;
}

static void run_paged(ts_ctx *ctx, const paged_case *c, const char *name) {
    int64_t N;
    ts_tensor *meta = make_meta(ctx, c, &N);
    int64_t sp[4] = {c->NB, c->KV, c->BS, c->D};
    int64_t sq[4] = {1, c->H, N, c->D}, sk[4] = {1, c->KV, N, c->D};
    ts_tensor *kp = ts_randn(ctx, TS_F32, 4, sp, 1, 201);
    ts_tensor *vp = ts_randn(ctx, TS_F32, 4, sp, 1, 202);
    ts_tensor *q = ts_randn(ctx, TS_F32, 4, sq, 1, 203);
    ts_tensor *k = ts_randn(ctx, TS_F32, 4, sk, 1, 204);
    ts_tensor *v = ts_randn(ctx, TS_F32, 4, sk, 1, 205);
    /* uploaded before the CPU's op writes its pools */
    ts_tensor *metad = vkt_up(meta), *kpd = vkt_up(kp), *vpd = vkt_up(vp);
    ts_tensor *qd = vkt_up(q), *kd = vkt_up(k), *vd = vkt_up(v);
    CHECK(metad && kpd && vpd && qd && kd && vd);
    ts_tensor *want = ts_paged_attention_ex(q, k, v, kp, vp, meta, &c->opts);
    ts_tensor *got =
        ts_paged_attention_ex(qd, kd, vd, kpd, vpd, metad, &c->opts);
    CHECK(want != NULL);
    if (!got)
        fprintf(stderr, "%s: %s\n", name, ts_errmsg(ctx)), ts_clear_error(ctx);
    char what[160];
    snprintf(what, sizeof what, "paged %s: out", name);
    if (want)
        vkt_close(what, got, want, F32_RTOL, F32_ATOL);
    snprintf(what, sizeof what, "paged %s: k pool", name);
    vkt_close(what, kpd, kp, 0, 0);
    snprintf(what, sizeof what, "paged %s: v pool", name);
    vkt_close(what, vpd, vp, 0, 0);
    ts_release(want), ts_release(got);
    ts_release(meta), ts_release(kp), ts_release(vp), ts_release(q);
    ts_release(k), ts_release(v), ts_release(metad), ts_release(kpd);
    ts_release(vpd), ts_release(qd), ts_release(kd), ts_release(vd);
}

static void test_paged(ts_ctx *ctx) {
    /* decode: one new token per sequence, long contexts (key splits) */
    static const int32_t dec_clen[3] = {37, 100, 4}, dec_new[3] = {1, 1, 1};
    /* prefill and a mix: a new sequence, one continuing, one decoding */
    static const int32_t mix_clen[3] = {0, 5, 13}, mix_new[3] = {6, 1, 3};
    /* many tokens: one split, the output written directly */
    static const int32_t big_clen[2] = {3, 0}, big_new[2] = {70, 60};
    const paged_case cases[] = {
        {4, 1, 64, 16, 24, 8, 3, dec_clen, dec_new, {0}},
        {4, 4, 32, 16, 24, 8, 3, dec_clen, dec_new, {.softcap = 5}},
        {8, 2, 128, 16, 24, 8, 3, dec_clen, dec_new, {.window = 20}},
        {4, 2, 32, 4, 24, 8, 3, mix_clen, mix_new, {0}},
        {4, 2, 32, 4, 24, 8, 3, mix_clen, mix_new, {.window = 3}},
        {4,
         1,
         64,
         4,
         24,
         8,
         3,
         mix_clen,
         mix_new,
         {.scale = 0.3, .softcap = 5, .window = 4}},
        {4, 2, 32, 8, 40, 10, 2, big_clen, big_new, {0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[32];
        snprintf(name, sizeof name, "case %zu", i);
        run_paged(ctx, &cases[i], name);
    }
}

int main(void) {
    ts_ctx *ctx = vkt_ctx("test_vk_attention");
    test_forward(ctx);
    test_backward(ctx);
    test_paged(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_vk_attention");
}
