/* test_compile.c — the compiled mode: the same code run eagerly and
 * compiled gives the same bits (the kernels and their order are the same),
 * for a transformer-style block and for a whole training step (forward,
 * backward, SGD update through ts_copy_); plans are cached by shape and
 * recompiled on a new shape; dead code is removed; buffers are shared by
 * liveness (with freed buffers poisoned, so a wrong plan shows up as NaNs);
 * graph dumps; forcing eager mode. */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define B  2
#define T  8
#define C  32
#define H  4
#define KV 2
#define D  8
#define F  48

typedef struct {
    ts_tensor *wq, *wk, *wv, *wo, *g1, *g2, *wg, *wu, *wd;
} block_params;

static ts_tensor *param(ts_ctx *ctx, int64_t r, int64_t c, uint64_t seed) {
    int64_t s[2] = {r, c};
    ts_tensor *p = ts_randn(ctx, TS_F32, c ? 2 : 1, s, c ? 0.2 : 1.0, seed);
    ts_set_requires_grad(p, true);
    return p;
}

static void make_params(ts_ctx *ctx, block_params *p) {
    p->wq = param(ctx, C, H * D, 1), p->wk = param(ctx, C, KV * D, 2);
    p->wv = param(ctx, C, KV * D, 3), p->wo = param(ctx, H * D, C, 4);
    int64_t c = C;
    p->g1 = ts_full(ctx, TS_F32, 1, &c, 1.0),
    p->g2 = ts_full(ctx, TS_F32, 1, &c, 1.0);
    ts_set_requires_grad(p->g1, true), ts_set_requires_grad(p->g2, true);
    p->wg = param(ctx, C, F, 5), p->wu = param(ctx, C, F, 6),
    p->wd = param(ctx, F, C, 7);
}

static ts_tensor **param_list(block_params *p) {
    return (ts_tensor **)p;
}
#define NPARAMS 9

/* x (B, T, C) -> (B, T, C): pre-norm attention with RoPE and GQA, then a
 * SwiGLU MLP, each with a residual; intermediates released as we go */
static ts_tensor *block(block_params *p, ts_tensor *x, ts_tensor *cs,
                        ts_tensor *sn) {
    ts_tensor *h = ts_rmsnorm(x, p->g1, 1e-6);
    ts_tensor *q = ts_matmul(h, p->wq), *k = ts_matmul(h, p->wk),
              *v = ts_matmul(h, p->wv);
    int64_t qs[4] = {B, T, H, D}, ks[4] = {B, T, KV, D};
    ts_tensor *q4 = ts_reshape(q, 4, qs), *k4 = ts_reshape(k, 4, ks),
              *v4 = ts_reshape(v, 4, ks);
    ts_tensor *qt = ts_transpose(q4, 1, 2), *kt = ts_transpose(k4, 1, 2),
              *vt = ts_transpose(v4, 1, 2);
    ts_tensor *qr = ts_rope(qt, cs, sn), *kr = ts_rope(kt, cs, sn);
    ts_tensor *a = ts_attention(qr, kr, vt, NULL, true, 0);
    ts_tensor *at = ts_transpose(a, 1, 2);
    int64_t flat[3] = {B, T, H * D};
    ts_tensor *af = ts_reshape(at, 3, flat);
    ts_tensor *o = ts_matmul(af, p->wo);
    ts_tensor *x1 = ts_add(x, o);
    ts_tensor *h2 = ts_rmsnorm(x1, p->g2, 1e-6);
    ts_tensor *g = ts_matmul(h2, p->wg), *u = ts_matmul(h2, p->wu);
    ts_tensor *sg = ts_silu(g);
    ts_tensor *gu = ts_mul(sg, u);
    ts_tensor *dn = ts_matmul(gu, p->wd);
    ts_tensor *y = ts_add(x1, dn);
    ts_tensor *tmp[] = {h, q,  k,  v, q4, k4, v4, qt, kt, vt, qr, kr,
                        a, at, af, o, x1, h2, g,  u,  sg, gu, dn};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        ts_release(tmp[i]);
    return y;
}

static bool same_bits(ts_tensor *a, ts_tensor *b) {
    if (!a || !b || ts_tensor_numel(a) != ts_tensor_numel(b))
        return false;
    int64_t n = ts_tensor_numel(a);
    float *x = malloc(sizeof(float) * (size_t)n),
          *y = malloc(sizeof(float) * (size_t)n);
    ts_tensor_read(a, x, TS_F32);
    ts_tensor_read(b, y, TS_F32);
    bool same = memcmp(x, y, sizeof(float) * (size_t)n) == 0;
    free(x), free(y);
    return same;
}

/* one training step: loss = mean((block(x) - target)^2); SGD update */
static double train_step(ts_ctx *ctx, block_params *p, ts_tensor *x,
                         ts_tensor *target, ts_tensor *cs, ts_tensor *sn) {
    ts_tensor *y = block(p, x, cs, sn);
    ts_tensor *d = ts_sub(y, target);
    ts_tensor *d2 = ts_mul(d, d);
    ts_tensor *loss = ts_mean(d2, 0, NULL, false);
    for (int i = 0; i < NPARAMS; i++)
        ts_zero_grad(param_list(p)[i]);
    CHECK_OK(ctx, ts_backward(loss, NULL));
    bool old = ts_set_grad_enabled(ctx, false);
    for (int i = 0; i < NPARAMS; i++) {
        ts_tensor *w = param_list(p)[i];
        ts_tensor *step = ts_mul_scalar(ts_grad(w), 0.1);
        ts_tensor *nw = ts_sub(w, step);
        CHECK_OK(ctx, ts_copy_(w, nw));
        ts_release(step), ts_release(nw);
    }
    ts_set_grad_enabled(ctx, old);
    ts_release(y), ts_release(d), ts_release(d2);
    double v = NAN;
    CHECK_OK(ctx, ts_item(loss, &v)); /* reading the loss runs the graph */
    ts_release(loss);
    return v;
}

static void test_block_and_training_match_eager(void) {
    ts_ctx *ce = test_ctx(), *cc = test_ctx();
    block_params pe, pc;
    make_params(ce, &pe);
    make_params(cc, &pc);
    int64_t xs[3] = {B, T, C};
    ts_tensor *xe = ts_randn(ce, TS_F32, 3, xs, 1, 11),
              *xc = ts_randn(cc, TS_F32, 3, xs, 1, 11);
    ts_tensor *te = ts_randn(ce, TS_F32, 3, xs, 1, 12),
              *tc = ts_randn(cc, TS_F32, 3, xs, 1, 12);
    ts_tensor *cse, *sne, *csc, *snc;
    ts_rope_tables(ce, T, D, 10000, 0, &cse, &sne);
    ts_rope_tables(cc, T, D, 10000, 0, &csc, &snc);
    /* forward only */
    ts_tensor *ye = block(&pe, xe, cse, sne);
    ts_set_mode(cc, TS_MODE_COMPILED);
    ts_tensor *yc = block(&pc, xc, csc, snc);
    CHECK(ts_tensor_data(yc) != NULL); /* reading materializes */
    CHECK(same_bits(ye, yc));
    ts_release(ye), ts_release(yc);
    ts_sync(cc);
    /* five training steps: losses and weights equal bit for bit */
    ts_compile_stats st0, st1;
    ts_get_compile_stats(cc, &st0);
    for (int step = 0; step < 5; step++) {
        double le = train_step(ce, &pe, xe, te, cse, sne);
        double lc = train_step(cc, &pc, xc, tc, csc, snc);
        CHECK(le == lc);
        if (le != lc)
            fprintf(stderr, "step %d: eager %.9g compiled %.9g\n", step, le,
                    lc);
    }
    for (int i = 0; i < NPARAMS; i++)
        CHECK(same_bits(param_list(&pe)[i], param_list(&pc)[i]));
    ts_get_compile_stats(cc, &st1);
    /* the step's graph was built once and replayed four times */
    CHECK(st1.compilations - st0.compilations == 1);
    CHECK(st1.cache_hits - st0.cache_hits == 4);
    CHECK(st1.arena_bytes > 0);
    ts_set_mode(cc, TS_MODE_EAGER);
    for (int i = 0; i < NPARAMS; i++)
        ts_release(param_list(&pe)[i]), ts_release(param_list(&pc)[i]);
    ts_release(xe), ts_release(xc), ts_release(te), ts_release(tc);
    ts_release(cse), ts_release(sne), ts_release(csc), ts_release(snc);
    ts_ctx_free(ce), ts_ctx_free(cc);
}

static void test_cache_by_shape_and_dce(void) {
    ts_ctx *ctx = test_ctx();
    ts_set_mode(ctx, TS_MODE_COMPILED);
    ts_compile_stats st;
    int64_t lens[4] = {16, 16, 32, 16};
    for (int r = 0; r < 4; r++) {
        int64_t s[2] = {4, lens[r]};
        ts_tensor *x = ts_randn(ctx, TS_F32, 2, s, 1, (uint64_t)r);
        ts_tensor *unused = ts_exp(x); /* dead: nobody reads it */
        ts_tensor *a = ts_tanh(x);
        ts_tensor *b = ts_mul_scalar(a, 2);
        ts_release(unused);
        ts_release(a);
        double v;
        int64_t idx[2] = {1, 3};
        CHECK_OK(ctx, ts_get(b, idx, &v));
        double want;
        ts_get(x, idx, &want);
        CHECK_NEAR(v, 2 * tanh(want), 1e-6);
        ts_get_compile_stats(ctx, &st);
        CHECK(st.nodes_dead == 1 && st.nodes_run == 2);
        ts_release(x), ts_release(b);
    }
    /* shapes 16, 16, 32, 16: compiled for 16 and for 32, replayed twice */
    CHECK(st.compilations == 2 && st.cache_hits == 2);
    ts_ctx_free(ctx);
}

/* a chain of 10 elementwise ops over 256 KiB: each intermediate dies at
 * the next op. Fused, the chain is one loop and needs no arena at all.
 * Unfused (TS_PASSES=-fuse), every op writes over its dying input: one
 * buffer; without in-place too, liveness sharing needs two; without any
 * planning, nine. */
static size_t chain_arena(const char *passes, size_t *peak) {
    if (passes)
        setenv("TS_PASSES", passes, 1);
    else
        unsetenv("TS_PASSES");
    ts_ctx *ctx = test_ctx();
    ts_set_mode(ctx, TS_MODE_COMPILED);
    int64_t n = 1 << 16;
    ts_tensor *x = ts_randn(ctx, TS_F32, 1, &n, 1, 5);
    ts_tensor *y = ts_retain(x);
    for (int i = 0; i < 10; i++) {
        ts_tensor *z = i % 2 ? ts_mul_scalar(y, 0.5) : ts_add_scalar(y, 1.0);
        ts_release(y);
        y = z;
    }
    CHECK_OK(ctx, ts_sync(ctx));
    ts_compile_stats st;
    ts_get_compile_stats(ctx, &st);
    *peak = st.planned_peak_bytes;
    float *py = ts_tensor_data(y), *px = ts_tensor_data(x);
    float want = px[7];
    for (int i = 0; i < 10; i++)
        want = i % 2 ? want * 0.5f : want + 1.0f;
    CHECK(py[7] == want);
    ts_release(x), ts_release(y);
    ts_ctx_free(ctx);
    unsetenv("TS_PASSES");
    return st.arena_bytes;
}

static void test_buffers_shared_by_liveness(void) {
    size_t kb = (size_t)(1 << 16) * 4, peak;
    CHECK(chain_arena(NULL, &peak) == 0);
    CHECK(peak == kb); /* only the kept result */
    CHECK(chain_arena("-fuse", &peak) == kb);
    CHECK(peak == 2 * kb);
    CHECK(chain_arena("-fuse,-inplace", &peak) == 2 * kb);
    CHECK(chain_arena("-fuse,-plan,-inplace", &peak) == 9 * kb);
}

/* fusion with broadcasting, a bf16 outside input and a unary backward:
 * the same values as eager (f32 intermediates: bit for bit) */
static void test_fusion_matches_eager(void) {
    ts_ctx *ce = test_ctx(), *cc = test_ctx();
    ts_set_mode(cc, TS_MODE_COMPILED);
    ts_tensor *out[2];
    ts_compile_stats st;
    for (int mode = 0; mode < 2; mode++) {
        ts_ctx *ctx = mode ? cc : ce;
        int64_t s2[2] = {37, 300}, s1[1] = {300};
        ts_tensor *x = ts_randn(ctx, TS_F32, 2, s2, 1, 1);
        ts_tensor *b = ts_randn(ctx, TS_F32, 1, s1, 1, 2);
        ts_tensor *hb0 = ts_randn(ctx, TS_F32, 2, s2, 1, 3);
        ts_tensor *hb = ts_cast(hb0, TS_BF16);
        ts_tensor *hf = ts_cast(hb, TS_F32);
        ts_tensor *a = ts_add(x, b); /* broadcast row */
        ts_tensor *g = ts_gelu(a, TS_GELU_TANH);
        ts_tensor *m = ts_mul(g, hf);
        ts_tensor *nm = ts_neg(m);
        ts_tensor *e = ts_exp(nm);
        out[mode] = ts_sub(e, x);
        ts_tensor *tmp[] = {x, b, hb0, hb, hf, a, g, m, nm, e};
        for (int i = 0; i < 10; i++)
            ts_release(tmp[i]);
        if (mode) {
            CHECK_OK(ctx, ts_sync(ctx));
            ts_get_compile_stats(ctx, &st);
        }
    }
    CHECK(st.nodes_fused >= 5);
    CHECK(ts_tensor_numel(out[0]) == ts_tensor_numel(out[1]));
    float *a = ts_tensor_data(out[0]), *b = ts_tensor_data(out[1]);
    CHECK(memcmp(a, b, sizeof(float) * 37 * 300) == 0);
    ts_release(out[0]), ts_release(out[1]);
    ts_ctx_free(ce), ts_ctx_free(cc);
}

/* exp(x) computed twice, and tanh of each: the second exp and the second
 * tanh are the same computations and run once (TS_PASSES=-cse: twice) */
static void cse_case(const char *passes, uint64_t want_cse) {
    if (passes)
        setenv("TS_PASSES", passes, 1);
    ts_ctx *ctx = test_ctx();
    ts_set_mode(ctx, TS_MODE_COMPILED);
    int64_t n = 100;
    ts_tensor *x = ts_randn(ctx, TS_F32, 1, &n, 1, 3);
    ts_tensor *a1 = ts_exp(x), *a2 = ts_exp(x);
    ts_tensor *b1 = ts_tanh(a1), *b2 = ts_tanh(a2);
    ts_tensor *z = ts_add(b1, b2);
    ts_tensor *other = ts_mul_scalar(x, 2); /* not equal: different op */
    /* intermediates only: results kept after the graph are left alone */
    ts_release(a1), ts_release(a2), ts_release(b1), ts_release(b2);
    CHECK_OK(ctx, ts_sync(ctx));
    ts_compile_stats st;
    ts_get_compile_stats(ctx, &st);
    CHECK(st.nodes_cse == want_cse);
    CHECK(st.nodes_run == 6 - want_cse);
    float *px = ts_tensor_data(x), *pz = ts_tensor_data(z),
          *po = ts_tensor_data(other);
    for (int i = 0; i < n; i++) {
        CHECK_NEAR(pz[i], 2 * tanhf(expf(px[i])), 1e-6);
        CHECK(po[i] == 2 * px[i]);
    }
    ts_release(x), ts_release(z), ts_release(other);
    ts_ctx_free(ctx);
    unsetenv("TS_PASSES");
}

static void test_common_subexpressions(void) {
    cse_case(NULL, 2);
    cse_case("-cse", 0);
}

/* Results read early and again much later are recomputed for the late
 * readers, chains included (b = silu(x) * u needs silu(x) recomputed
 * first): same bits as eager, less arena (TS_PASSES=-remat for contrast) */
static ts_tensor *remat_program(ts_ctx *ctx) {
    int64_t n = 1 << 14;
    ts_tensor *x = ts_randn(ctx, TS_F32, 1, &n, 1, 1);
    ts_tensor *u = ts_randn(ctx, TS_F32, 1, &n, 1, 2);
    ts_tensor *a = ts_silu(x);
    ts_tensor *b = ts_mul(a, u);
    ts_tensor *early = ts_exp(b); /* early readers of b, a */
    ts_tensor *early2 = ts_sigmoid(a);
    ts_tensor *w = ts_add(early, early2);
    for (int i = 0; i < 40; i++) { /* a long middle */
        ts_tensor *z = ts_tanh(w);
        ts_release(w);
        w = ts_mul_scalar(z, 1.5);
        ts_release(z);
    }
    ts_tensor *late = ts_mul(b, a); /* late readers of b, a */
    ts_tensor *late2 = ts_add(late, w);
    ts_tensor *late3 = ts_sub(late2, a);
    ts_tensor *tmp[] = {x, u, a, b, early, early2, w, late, late2};
    for (int i = 0; i < 9; i++)
        ts_release(tmp[i]);
    return late3;
}

static void test_rematerialization(void) {
    ts_ctx *ce = test_ctx();
    ts_tensor *want = remat_program(ce);
    size_t arena[2];
    for (int r = 0; r < 2; r++) {
        if (r)
            setenv("TS_PASSES", "-remat", 1);
        ts_ctx *cc = test_ctx();
        ts_set_mode(cc, TS_MODE_COMPILED);
        ts_tensor *got = remat_program(cc);
        CHECK_OK(cc, ts_sync(cc));
        ts_compile_stats st;
        ts_get_compile_stats(cc, &st);
        arena[r] = st.arena_bytes;
        CHECK(r ? st.nodes_recomputed == 0 : st.nodes_recomputed >= 2);
        CHECK(memcmp(ts_tensor_data(want), ts_tensor_data(got),
                     sizeof(float) * (1 << 14)) == 0);
        ts_release(got);
        ts_ctx_free(cc);
        unsetenv("TS_PASSES");
    }
    CHECK(arena[0] < arena[1]);
    ts_release(want);
    ts_ctx_free(ce);
}

/* constants: ts_full values and what elementwise ops make of them are
 * computed when the plan is built; a constant written through its data
 * pointer is a constant no more (the next plan differs) */
static void test_constant_folding(void) {
    ts_ctx *ctx = test_ctx();
    ts_set_mode(ctx, TS_MODE_COMPILED);
    int64_t n = 1000;
    ts_tensor *x = ts_randn(ctx, TS_F32, 1, &n, 1, 4);
    ts_tensor *two = ts_full(ctx, TS_F32, 1, &n, 2.0);
    ts_tensor *half = ts_scalar(ctx, TS_F32, 0.5);
    for (int round = 0; round < 3; round++) {
        ts_tensor *six = ts_mul_scalar(two, 3); /* constant 6 */
        ts_tensor *k = ts_add(six, half);       /* constant 6.5 */
        ts_tensor *y = ts_mul(x, k);            /* not constant */
        ts_release(six), ts_release(k);
        CHECK_OK(ctx, ts_sync(ctx));
        ts_compile_stats st;
        ts_get_compile_stats(ctx, &st);
        float want = round < 2 ? 6.5f : 3.5f;
        CHECK(st.nodes_folded == (round < 2 ? 2u : 0u));
        float *px = ts_tensor_data(x), *py = ts_tensor_data(y);
        CHECK(py[999] == px[999] * want);
        ts_release(y);
        if (round == 1) { /* written: 2 becomes 1 everywhere */
            float *pt = ts_tensor_data(two);
            for (int i = 0; i < n; i++)
                pt[i] = 1.0f;
        }
    }
    ts_release(x), ts_release(two), ts_release(half);
    ts_ctx_free(ctx);
}

/* Op-by-op rmsnorm and attention are run by the fused kernels when their
 * intermediates are read nowhere else (here: no gradients): results close
 * to eager's (the fused kernels round differently), fewer bytes */
static ts_tensor *by_hand(ts_ctx *ctx, bool with_mask) {
    int64_t xs[3] = {2, 16, 64}, ws = 64, qs[4] = {2, 4, 16, 32};
    ts_tensor *x = ts_randn(ctx, TS_F32, 3, xs, 1, 1);
    ts_tensor *w = ts_randn(ctx, TS_F32, 1, &ws, 1, 2);
    ts_tensor *sq = ts_mul(x, x);
    int last = -1;
    ts_tensor *ms = ts_mean(sq, 1, &last, true);
    ts_tensor *a = ts_add_scalar(ms, 1e-6);
    ts_tensor *r = ts_rsqrt(a);
    ts_tensor *y = ts_mul(x, r);
    ts_tensor *norm = ts_mul(y, w); /* rmsnorm */
    int64_t qshape[4] = {2, 16, 4, 16};
    ts_tensor *q4 = ts_reshape(norm, 4, qshape);
    ts_tensor *q = ts_transpose(q4, 1, 2); /* (2, 4, 16, 16) */
    ts_tensor *k = ts_randn(ctx, TS_F32, 4, (int64_t[]){2, 4, 24, 16}, 1, 3);
    ts_tensor *v = ts_randn(ctx, TS_F32, 4, (int64_t[]){2, 4, 24, 16}, 1, 4);
    ts_tensor *kt = ts_transpose(k, -1, -2);
    ts_tensor *s = ts_matmul(q, kt);
    ts_tensor *ss = ts_mul_scalar(s, 0.25);
    ts_tensor *mask = ts_randn(ctx, TS_F32, 2, (int64_t[]){16, 24}, 1, 5);
    ts_tensor *sm = with_mask ? ts_add(ss, mask) : ts_retain(ss);
    ts_tensor *pr = ts_softmax(sm, -1);
    ts_tensor *o = ts_matmul(pr, v); /* attention */
    ts_tensor *tmp[] = {x, w, sq, ms, a, r,  y,    norm, q4,
                        q, k, v,  kt, s, ss, mask, sm,   pr};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        ts_release(tmp[i]);
    (void)qs;
    return o;
}

static void test_fused_kernel_choice(void) {
    for (int with_mask = 0; with_mask < 2; with_mask++) {
        ts_ctx *ce = test_ctx(), *cc = test_ctx();
        ts_tensor *want = by_hand(ce, with_mask);
        ts_set_mode(cc, TS_MODE_COMPILED);
        ts_set_grad_enabled(cc, false);
        ts_tensor *got = by_hand(cc, with_mask);
        CHECK_OK(cc, ts_sync(cc));
        ts_compile_stats st;
        ts_get_compile_stats(cc, &st);
        CHECK(st.patterns_rewritten == 2);
        test_allclose("fused kernels vs op by op", got, want, 1e-4, 1e-5);
        ts_release(want), ts_release(got);
        ts_ctx_free(ce), ts_ctx_free(cc);
    }
}

/* softmax(q @ k^T * s) @ v that the attention kernel cannot take stays op
 * by op: a value head dim other than the query's (the kernel read past v),
 * and a scale <= 0 (the kernel's "default 1/sqrt(D)") */
static ts_tensor *attention_misfit(ts_ctx *ctx, int64_t Dv, double scale) {
    int64_t qs[4] = {2, 3, 5, 8}, vs[4] = {2, 3, 5, Dv};
    ts_tensor *q = ts_randn(ctx, TS_F32, 4, qs, 1, 1);
    ts_tensor *k = ts_randn(ctx, TS_F32, 4, qs, 1, 2);
    ts_tensor *v = ts_randn(ctx, TS_F32, 4, vs, 1, 3);
    ts_tensor *kt = ts_transpose(k, 2, 3), *s = ts_matmul(q, kt);
    ts_tensor *ss = ts_mul_scalar(s, scale), *p = ts_softmax(ss, -1);
    ts_tensor *o = ts_matmul(p, v);
    ts_tensor *tmp[] = {q, k, v, kt, s, ss, p};
    for (int i = 0; i < 7; i++)
        ts_release(tmp[i]);
    return o;
}

static void test_attention_misfits_stay_unfused(void) {
    const int64_t dv[3] = {4, 8, 8};
    const double scale[3] = {0.3, 0.0, -0.5};
    for (int c = 0; c < 3; c++) {
        ts_ctx *ce = test_ctx(), *cc = test_ctx();
        ts_tensor *want = attention_misfit(ce, dv[c], scale[c]);
        ts_set_mode(cc, TS_MODE_COMPILED);
        ts_set_grad_enabled(cc, false);
        ts_tensor *got = attention_misfit(cc, dv[c], scale[c]);
        CHECK_OK(cc, ts_sync(cc));
        ts_compile_stats st;
        ts_get_compile_stats(cc, &st);
        CHECK(st.patterns_rewritten == 0);
        test_allclose("attention misfit vs eager", got, want, 1e-5, 1e-5);
        ts_release(want), ts_release(got);
        ts_ctx_free(ce), ts_ctx_free(cc);
    }
}

/* matmul epilogues: gelu(x @ w + b) + r runs the product in row panels,
 * each eaten by the fused loop while in cache. One panel gives eager's
 * bits; several panels may not (OpenBLAS splits a smaller product across
 * its threads differently), so they are held to 1e-5 (rel and abs) */
static ts_tensor *linear_gelu_residual(ts_ctx *ctx, int64_t rows) {
    int64_t xs[3] = {2, rows, 96}, ws[2] = {96, 80}, bs = 80,
            rs[3] = {2, rows, 80};
    ts_tensor *x = ts_randn(ctx, TS_F32, 3, xs, 1, 1);
    ts_tensor *w = ts_randn(ctx, TS_F32, 2, ws, 0.1, 2);
    ts_tensor *b = ts_randn(ctx, TS_F32, 1, &bs, 1, 3);
    ts_tensor *r = ts_randn(ctx, TS_F32, 3, rs, 1, 4);
    ts_tensor *mm = ts_matmul(x, w);
    ts_tensor *h = ts_add(mm, b);
    ts_tensor *g = ts_gelu(h, TS_GELU_ERF);
    ts_tensor *y = ts_add(g, r);
    ts_tensor *tmp[] = {x, w, b, r, mm, h, g};
    for (int i = 0; i < 7; i++)
        ts_release(tmp[i]);
    return y;
}

static void test_matmul_epilogue(void) {
    const int64_t rows[2] = {37, 3000}; /* one panel; many panels */
    for (int c = 0; c < 2; c++) {
        ts_ctx *ce = test_ctx(), *cc = test_ctx();
        ts_tensor *want = linear_gelu_residual(ce, rows[c]);
        ts_set_mode(cc, TS_MODE_COMPILED);
        ts_tensor *got = linear_gelu_residual(cc, rows[c]);
        CHECK_OK(cc, ts_sync(cc));
        ts_compile_stats st;
        ts_get_compile_stats(cc, &st);
        CHECK(st.matmul_epilogues == 1 && st.arena_bytes == 0);
        if (c == 0)
            CHECK(memcmp(ts_tensor_data(want), ts_tensor_data(got),
                         sizeof(float) * 2 * (size_t)rows[c] * 80) == 0);
        else
            test_allclose("epilogue in panels", got, want, 1e-5, 1e-5);
        ts_release(want), ts_release(got);
        ts_ctx_free(ce), ts_ctx_free(cc);
    }
}

/* silu(x Wg + bg) * (x Wu + bu): both operands of the mul grow from a
 * matmul; each group keeps one matmul head (two heads in one group left
 * the second matmul without a buffer: a crash) */
static ts_tensor *gated_with_biases(ts_ctx *ctx) {
    int64_t xs[2] = {24, C}, bs[1] = {F};
    ts_tensor *x = ts_randn(ctx, TS_F32, 2, xs, 1.0, 71);
    ts_tensor *wg = param(ctx, C, F, 72), *wu = param(ctx, C, F, 73);
    ts_tensor *bg = ts_randn(ctx, TS_F32, 1, bs, 1.0, 74);
    ts_tensor *bu = ts_randn(ctx, TS_F32, 1, bs, 1.0, 75);
    ts_tensor *g0 = ts_matmul(x, wg), *u0 = ts_matmul(x, wu);
    ts_tensor *g = ts_add(g0, bg), *u = ts_add(u0, bu);
    ts_tensor *a = ts_silu(g);
    ts_tensor *y = ts_mul(a, u);
    ts_tensor *tmp[] = {x, wg, wu, bg, bu, g0, u0, g, u, a};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        ts_release(tmp[i]);
    return y;
}

static void test_two_matmul_groups(void) {
    ts_ctx *ce = test_ctx(), *cc = test_ctx();
    ts_set_grad_enabled(ce, false), ts_set_grad_enabled(cc, false);
    ts_tensor *want = gated_with_biases(ce);
    ts_set_mode(cc, TS_MODE_COMPILED);
    ts_tensor *got = gated_with_biases(cc);
    CHECK_OK(cc, ts_sync(cc));
    test_allclose("silu(x Wg + bg) * (x Wu + bu)", got, want, 1e-6, 1e-6);
    ts_release(want), ts_release(got);
    ts_ctx_free(ce), ts_ctx_free(cc);
}

static void test_views_and_results_kept(void) {
    /* a view of an intermediate outlives the op that made it */
    ts_ctx *ctx = test_ctx();
    ts_set_mode(ctx, TS_MODE_COMPILED);
    int64_t s[2] = {3, 4};
    ts_tensor *x = ts_randn(ctx, TS_F32, 2, s, 1, 9);
    ts_tensor *e = ts_exp(x);
    ts_tensor *col = ts_slice(e, 1, 2, 3, 1);
    ts_release(e);
    ts_tensor *other = ts_neg(x); /* runs in the same graph */
    double v, xv;
    int64_t i0[2] = {2, 0}, i1[2] = {2, 2};
    CHECK_OK(ctx, ts_get(col, i0, &v));
    ts_get(x, i1, &xv);
    CHECK_NEAR(v, exp(xv), 1e-5 * exp(xv));
    CHECK_OK(ctx, ts_get(other, i1, &v));
    CHECK(v == -xv);
    ts_release(x), ts_release(col), ts_release(other);
    ts_ctx_free(ctx);
}

static void test_dump_and_force_eager(void) {
    char dir[] = "/tmp/ts_dump_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    setenv("TS_DUMP_GRAPH", dir, 1);
    ts_ctx *ctx = test_ctx();
    ts_set_mode(ctx, TS_MODE_COMPILED);
    int64_t n = 8;
    ts_tensor *x = ts_randn(ctx, TS_F32, 1, &n, 1, 1);
    ts_tensor *y = ts_sigmoid(x);
    ts_tensor *dead = ts_exp(x);
    ts_release(dead);
    CHECK_OK(ctx, ts_sync(ctx));
    unsetenv("TS_DUMP_GRAPH");
    char path[256], line[512];
    snprintf(path, sizeof path, "%s/graph-000-after.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    bool saw_dead = false, saw_sigmoid = false;
    while (f && fgets(line, sizeof line, f)) {
        saw_dead |= strstr(line, "# dead nodes removed: 1") != NULL;
        saw_sigmoid |=
            strstr(line, "sigmoid(in0:f32[8]) -> f32[8] [kept]") != NULL;
    }
    if (f)
        fclose(f);
    CHECK(saw_dead && saw_sigmoid);
    const char *files[] = {"graph-000-before.txt", "graph-000-after.txt",
                           "graph-000.dot"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        struct stat sb;
        CHECK(stat(path, &sb) == 0 && sb.st_size > 0);
        unlink(path);
    }
    rmdir(dir);
    /* forced eager: compiled mode is refused, ops run at once */
    ts_force_eager(ctx, true);
    ts_set_mode(ctx, TS_MODE_COMPILED);
    CHECK(ts_get_mode(ctx) == TS_MODE_EAGER);
    ts_tensor *z = ts_exp(x);
    ts_compile_stats st;
    ts_get_compile_stats(ctx, &st);
    uint64_t before = st.graphs_run;
    ts_tensor *zs = ts_sum(z, 0, NULL, false);
    double v;
    ts_item(zs, &v);
    ts_release(zs);
    ts_get_compile_stats(ctx, &st);
    CHECK(st.graphs_run == before);
    ts_release(x), ts_release(y), ts_release(z);
    ts_ctx_free(ctx);
}

static void test_errors_surface_at_sync(void) {
    ts_ctx *ctx = test_ctx();
    ts_set_mode(ctx, TS_MODE_COMPILED);
    int64_t vs[2] = {5, 3}, n = 2;
    ts_tensor *w = ts_randn(ctx, TS_F32, 2, vs, 1, 1);
    int64_t ids_v[2] = {1, 7};
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 1, &n, ids_v);
    ts_tensor *e = ts_embedding(w, ids); /* shapes fit: recorded */
    CHECK(e != NULL);
    /* a shape error is found when the call is recorded */
    int64_t bad[1] = {4};
    ts_tensor *o = ts_zeros(ctx, TS_F32, 1, bad);
    CHECK(ts_add(e, o) == NULL);
    CHECK_MSG(ctx, "do not broadcast");
    ts_clear_error(ctx);
    /* a bad index is found when the graph runs */
    CHECK(ts_sync(ctx) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "index 7 out of range [0, 5)");
    ts_clear_error(ctx);
    ts_release(w), ts_release(ids), ts_release(e), ts_release(o);
    ts_ctx_free(ctx);
}

static void test_reads_see_recorded_writes(void) {
    /* reading a tensor that a recorded ts_copy_ writes runs the graph */
    ts_ctx *ctx = test_ctx();
    ts_set_mode(ctx, TS_MODE_COMPILED);
    int64_t n = 3;
    ts_tensor *w = ts_full(ctx, TS_F32, 1, &n, 1.0);
    ts_tensor *two = ts_full(ctx, TS_F32, 1, &n, 2.0);
    ts_tensor *six = ts_mul_scalar(two, 3);
    CHECK_OK(ctx, ts_copy_(w, six));
    double v = 0;
    int64_t i0 = 0;
    CHECK_OK(ctx, ts_get(w, &i0, &v));
    CHECK(v == 6);
    ts_release(w), ts_release(two), ts_release(six);
    ts_ctx_free(ctx);
}

int main(void) {
    setenv("TS_POISON_FREED", "1", 1); /* dead buffers become NaN */
    test_attention_misfits_stay_unfused();
    test_block_and_training_match_eager();
    test_cache_by_shape_and_dce();
    test_buffers_shared_by_liveness();
    test_views_and_results_kept();
    test_common_subexpressions();
    test_fusion_matches_eager();
    test_rematerialization();
    test_constant_folding();
    test_fused_kernel_choice();
    test_two_matmul_groups();
    test_matmul_epilogue();
    test_dump_and_force_eager();
    test_errors_surface_at_sync();
    test_reads_see_recorded_writes();
    return test_finish("test_compile");
}
