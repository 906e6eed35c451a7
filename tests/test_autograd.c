/* test_autograd.c — the autograd engine: accumulation into .grad, no-grad
 * scopes, detach, zero_grad, gradients through views and broadcasting,
 * repeated backward, very deep graphs, the grad-ready hook, and the errors
 * of bad calls. Values
 * are checked against hand-derived answers. */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static ts_tensor *vec(ts_ctx *ctx, int64_t n, const float *v) {
    ts_tensor *t = ts_from_data(ctx, TS_F32, 1, &n, v);
    ts_set_requires_grad(t, true);
    return t;
}

static float g_at(ts_tensor *t, int64_t i) {
    ts_tensor *g = ts_grad(t);
    if (!g)
        return NAN;
    double v = NAN;
    int64_t idx[TS_MAX_DIMS] = {0};
    idx[ts_tensor_ndim(g) - 1] = i;
    ts_get(g, idx, &v);
    return (float)v;
}

static void test_accumulate_and_zero(ts_ctx *ctx) {
    float xv[3] = {1, 2, 3};
    ts_tensor *x = vec(ctx, 3, xv);
    /* loss = sum(x * x) -> grad 2x; twice -> 4x */
    for (int k = 0; k < 2; k++) {
        ts_tensor *sq = ts_mul(x, x);
        ts_tensor *l = ts_sum(sq, 0, NULL, false);
        CHECK_OK(ctx, ts_backward(l, NULL));
        ts_release(sq), ts_release(l);
    }
    CHECK(g_at(x, 0) == 4 && g_at(x, 2) == 12);
    ts_zero_grad(x);
    CHECK(ts_grad(x) == NULL);
    /* the graph is kept: backward twice from one loss accumulates too */
    ts_tensor *e = ts_exp(x);
    ts_tensor *l = ts_sum(e, 0, NULL, false);
    CHECK_OK(ctx, ts_backward(l, NULL));
    CHECK_OK(ctx, ts_backward(l, NULL));
    CHECK_NEAR(g_at(x, 1), 2 * exp(2.0), 1e-5);
    ts_release(e), ts_release(l), ts_release(x);
}

static void test_no_grad_and_detach(ts_ctx *ctx) {
    float xv[2] = {1, 2};
    ts_tensor *x = vec(ctx, 2, xv);
    bool old = ts_set_grad_enabled(ctx, false);
    ts_tensor *y = ts_mul_scalar(x, 3);
    ts_set_grad_enabled(ctx, old);
    CHECK(!ts_requires_grad(y) && ts_is_leaf(y));
    ts_tensor *d = ts_detach(x);
    CHECK(!ts_requires_grad(d) && ts_tensor_shares_storage(d, x));
    /* y = x * detach(x): gradient only through the first factor */
    ts_tensor *p = ts_mul(x, d);
    ts_tensor *l = ts_sum(p, 0, NULL, false);
    CHECK_OK(ctx, ts_backward(l, NULL));
    CHECK(g_at(x, 0) == 1 && g_at(x, 1) == 2);
    CHECK(ts_backward(y, NULL) == TS_ERR_STATE);
    CHECK_MSG(ctx, "does not require grad");
    ts_clear_error(ctx);
    ts_release(x), ts_release(y), ts_release(d), ts_release(p), ts_release(l);
}

static void test_views_and_broadcast(ts_ctx *ctx) {
    /* w (2, 3); loss = sum(w[:, 1:3:1].T * b) with b (2,) broadcast */
    int64_t shape[2] = {2, 3};
    float wv[6] = {1, 2, 3, 4, 5, 6};
    ts_tensor *w = ts_from_data(ctx, TS_F32, 2, shape, wv);
    ts_set_requires_grad(w, true);
    float bv[2] = {10, 20};
    ts_tensor *b = vec(ctx, 2, bv);
    ts_tensor *s = ts_slice(w, 1, 1, 3, 1); /* (2, 2) */
    ts_tensor *t = ts_transpose(s, 0, 1);   /* (2, 2): [c][r] */
    ts_tensor *m = ts_mul(t, b);            /* b over the last dim (r) */
    ts_tensor *l = ts_sum(m, 0, NULL, false);
    CHECK_OK(ctx, ts_backward(l, NULL));
    float gw[6];
    CHECK_OK(ctx, ts_tensor_read(ts_grad(w), gw, TS_F32));
    /* d/dw[r][c] = b[r] for c in {1, 2}, 0 for c = 0 */
    CHECK(gw[0] == 0 && gw[1] == 10 && gw[2] == 10);
    CHECK(gw[3] == 0 && gw[4] == 20 && gw[5] == 20);
    /* d/db[r] = sum over c of w[r][c], c in {1, 2} */
    CHECK(g_at(b, 0) == 5 && g_at(b, 1) == 11);
    /* expand: grad sums over the expanded dim */
    ts_zero_grad(b);
    int64_t big[2] = {4, 2};
    ts_tensor *e = ts_expand(b, 2, big);
    ts_tensor *l2 = ts_sum(e, 0, NULL, false);
    CHECK_OK(ctx, ts_backward(l2, NULL));
    CHECK(g_at(b, 0) == 4 && g_at(b, 1) == 4);
    ts_tensor *all[] = {w, b, s, t, m, l, e, l2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        ts_release(all[i]);
}

static void test_deep_graph(ts_ctx *ctx) {
    /* 20000 chained ops: no recursion limit in backward or in release */
    float xv[1] = {1};
    ts_tensor *x = vec(ctx, 1, xv);
    ts_tensor *y = ts_retain(x);
    for (int i = 0; i < 20000; i++) {
        ts_tensor *z = ts_add_scalar(y, 0.5);
        ts_release(y);
        y = z;
    }
    ts_tensor *l = ts_sum(y, 0, NULL, false);
    CHECK_OK(ctx, ts_backward(l, NULL));
    CHECK(g_at(x, 0) == 1);
    double v;
    ts_item(l, &v);
    CHECK(v == 10001);
    ts_release(l), ts_release(y), ts_release(x);
}

static void test_shared_subexpression(ts_ctx *ctx) {
    /* y = a * a + exp(a): a used three times, the gradients add up */
    float av[1] = {0.5f};
    ts_tensor *a = vec(ctx, 1, av);
    ts_tensor *sq = ts_mul(a, a), *ex = ts_exp(a);
    ts_tensor *y = ts_add(sq, ex);
    ts_tensor *l = ts_sum(y, 0, NULL, false);
    CHECK_OK(ctx, ts_backward(l, NULL));
    CHECK_NEAR(g_at(a, 0), 2 * 0.5 + exp(0.5), 1e-6);
    ts_tensor *all[] = {a, sq, ex, y, l};
    for (size_t i = 0; i < 5; i++)
        ts_release(all[i]);
}

static void test_errors(ts_ctx *ctx) {
    float xv[3] = {1, 2, 3};
    ts_tensor *x = vec(ctx, 3, xv);
    ts_tensor *y = ts_exp(x);
    CHECK(ts_backward(y, NULL) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "only for a one-element tensor; this one has shape [3]");
    ts_clear_error(ctx);
    int64_t two = 2;
    ts_tensor *g = ts_zeros(ctx, TS_F32, 1, &two);
    CHECK(ts_backward(y, g) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "grad of shape [2] for a tensor of shape [3]");
    ts_clear_error(ctx);
    CHECK(ts_set_requires_grad(y, false) == TS_ERR_STATE);
    CHECK_MSG(ctx, "only leaf tensors");
    ts_clear_error(ctx);
    ts_tensor *ids = ts_arange(ctx, TS_I64, 0, 3, 1);
    CHECK(ts_set_requires_grad(ids, true) == TS_ERR_DTYPE);
    CHECK_MSG(ctx, "dtype i64 cannot require gradients");
    ts_clear_error(ctx);
    /* with an explicit upstream gradient */
    float gv[3] = {1, 0, 2};
    ts_tensor *g3 = ts_from_data(ctx, TS_F32, 1, (int64_t[]){3}, gv);
    CHECK_OK(ctx, ts_backward(y, g3));
    CHECK_NEAR(g_at(x, 2), 2 * exp(3.0), 1e-4);
    CHECK(g_at(x, 1) == 0);
    ts_release(x), ts_release(y), ts_release(g), ts_release(ids),
        ts_release(g3);
}

static void test_bf16_leaf_grad_dtype(ts_ctx *ctx) {
    int64_t n = 4;
    ts_tensor *x = ts_full(ctx, TS_BF16, 1, &n, 1.5);
    ts_set_requires_grad(x, true);
    ts_tensor *y = ts_cast(x, TS_F32);
    ts_tensor *z = ts_mul_scalar(y, 3);
    ts_tensor *l = ts_sum(z, 0, NULL, false);
    CHECK_OK(ctx, ts_backward(l, NULL));
    CHECK(ts_grad(x) && ts_tensor_dtype(ts_grad(x)) == TS_BF16);
    CHECK(g_at(x, 3) == 3);
    ts_release(x), ts_release(y), ts_release(z), ts_release(l);
}

/* grad-ready hook: what it saw of each leaf */
typedef struct {
    ts_tensor *leaf[8];
    float g0[8]; /* the leaf's grad[0] when the hook ran */
    int n;
    int fail_at; /* return an error on this call (-1 never) */
} ready_log;

static ts_status on_ready(void *arg, ts_tensor *leaf) {
    ready_log *r = arg;
    if (r->n == r->fail_at)
        return TS_ERR_STATE;
    if (r->n < 8) {
        r->leaf[r->n] = leaf;
        r->g0[r->n] = g_at(leaf, 0);
    }
    r->n++;
    return TS_OK;
}

static int times_seen(const ready_log *r, const ts_tensor *t) {
    int k = 0;
    for (int i = 0; i < r->n && i < 8; i++)
        k += r->leaf[i] == t;
    return k;
}

/* w * x inside a checkpointed block (w read from the block's argument) */
static ts_tensor *scale_block(void *arg, int n, ts_tensor **in) {
    (void)n;
    return ts_mul(in[0], (ts_tensor *)arg);
}

/* The hook runs once per leaf per backward, when its gradient is whole:
 * a leaf used by three ops (x: 2x + x*y) is reported after the last one,
 * with its final value; a leaf used inside a checkpointed block during the
 * recompute's backward; an unused leaf and one not requiring grad never;
 * the order is the same on every run; an error from the hook stops the
 * backward with a message; in compiled mode the reported gradients are
 * read as their final values. */
static void test_grad_ready_hook(ts_ctx *ctx) {
    for (int mode = 0; mode < 2; mode++) {
        ts_set_mode(ctx, mode ? TS_MODE_COMPILED : TS_MODE_EAGER);
        float xv[2] = {1, 2}, yv[2] = {3, 4}, wv[2] = {5, 6};
        ts_tensor *x = vec(ctx, 2, xv), *y = vec(ctx, 2, yv);
        ts_tensor *w = vec(ctx, 2, wv), *idle = vec(ctx, 2, xv);
        int64_t two = 2;
        ts_tensor *c = ts_from_data(ctx, TS_F32, 1, &two, wv); /* no grad */
        ready_log first = {.fail_at = -1};
        for (int run = 0; run < 2; run++) {
            ready_log r = {.fail_at = -1};
            ts_set_grad_ready_hook(ctx, on_ready, &r);
            ts_tensor *a = ts_mul_scalar(x, 2.0); /* 2x */
            ts_tensor *b = ts_mul(x, y);          /* x*y */
            ts_tensor *s = ts_add(a, b);          /* 2x + xy */
            ts_tensor *in[1] = {s};
            ts_tensor *z = ts_checkpoint(scale_block, w, 1, in); /* w s */
            ts_tensor *zc = ts_mul(z, c);
            ts_tensor *l = ts_sum(zc, 0, NULL, false);
            ts_zero_grad(x), ts_zero_grad(y), ts_zero_grad(w);
            CHECK_OK(ctx, ts_backward(l, NULL));
            ts_set_grad_ready_hook(ctx, NULL, NULL);
            CHECK(r.n == 3);
            CHECK(times_seen(&r, x) == 1 && times_seen(&r, y) == 1 &&
                  times_seen(&r, w) == 1 && times_seen(&r, idle) == 0);
            /* d/dx = c w (2 + y), d/dy = c w x, d/dw = c (2x + xy) */
            for (int i = 0; i < 3; i++) {
                double want = r.leaf[i] == x   ? 5 * 5 * (2 + 3)
                              : r.leaf[i] == y ? 5 * 5 * 1
                                               : 5 * (2 * 1 + 1 * 3);
                CHECK_NEAR(r.g0[i], want, 1e-5);
            }
            if (run == 0)
                first = r;
            else
                for (int i = 0; i < 3; i++)
                    CHECK(r.leaf[i] == first.leaf[i]);
            /* w comes first: the checkpointed block is the last op */
            CHECK(r.leaf[0] == w);
            /* a failing hook stops the backward, with a message */
            ts_zero_grad(x), ts_zero_grad(y), ts_zero_grad(w);
            ready_log bad = {.fail_at = 1};
            ts_set_grad_ready_hook(ctx, on_ready, &bad);
            CHECK(ts_backward(l, NULL) != TS_OK);
            CHECK_MSG(ctx, "grad-ready hook");
            ts_set_grad_ready_hook(ctx, NULL, NULL);
            /* and leaves no count behind: the next pass reports all three */
            ts_zero_grad(x), ts_zero_grad(y), ts_zero_grad(w);
            ready_log again = {.fail_at = -1};
            ts_set_grad_ready_hook(ctx, on_ready, &again);
            CHECK_OK(ctx, ts_backward(l, NULL));
            ts_set_grad_ready_hook(ctx, NULL, NULL);
            CHECK(again.n == 3);
            ts_release(a), ts_release(b), ts_release(s), ts_release(z);
            ts_release(zc), ts_release(l);
        }
        /* a leaf as the root: reported once, every time */
        for (int k = 0; k < 2; k++) {
            ready_log rl = {.fail_at = -1};
            ts_set_grad_ready_hook(ctx, on_ready, &rl);
            CHECK_OK(ctx, ts_backward(idle, ts_grad(x) ? ts_grad(x) : x));
            ts_set_grad_ready_hook(ctx, NULL, NULL);
            CHECK(rl.n == 1 && rl.leaf[0] == idle);
        }
        ts_release(x), ts_release(y), ts_release(w), ts_release(idle);
        ts_release(c);
    }
    ts_set_mode(ctx, TS_MODE_EAGER);
}

/* A tied table (GPT-2's wte): the head's dense gradient first, then the
 * embedding's rows added into that same .grad in place (no dense (V, C)
 * temporary): the gradient is d/dw sum(x @ w^T * c) + the rows of
 * sum(emb(w, ids) * e), ids repeated; and the .grad object stays the one
 * the head made. Eager and compiled. */
static void test_embedding_accumulates(ts_ctx *ctx) {
    for (int mode = 0; mode < 2; mode++) {
        ts_set_mode(ctx, mode ? TS_MODE_COMPILED : TS_MODE_EAGER);
        int64_t V = 5, C = 3, wsh[2] = {5, 3}, xsh[2] = {2, 3}, ish[1] = {4};
        float wv[15], xv[6] = {1, 2, 3, -1, 0.5f, 2};
        for (int i = 0; i < 15; i++)
            wv[i] = 0.1f * (float)i - 0.7f;
        int64_t idv[4] = {3, 0, 3, 4};
        ts_tensor *w = ts_from_data(ctx, TS_F32, 2, wsh, wv);
        ts_tensor *x = ts_from_data(ctx, TS_F32, 2, xsh, xv);
        ts_tensor *ids = ts_from_data(ctx, TS_I64, 1, ish, idv);
        ts_set_requires_grad(w, true);
        /* head: logits = x @ w^T (2, 5); loss = sum(logits) -> dW[v][c] =
         * sum_r x[r][c] */
        ts_tensor *wt = ts_transpose(w, 0, 1);
        ts_tensor *lg = ts_matmul(x, wt);
        ts_tensor *l1 = ts_sum(lg, 0, NULL, false);
        CHECK_OK(ctx, ts_backward(l1, NULL));
        ts_tensor *before = ts_grad(w);
        /* embedding: loss = sum(emb * k), k[j] = j + 1 -> row ids[i] gets
         * (1, 2, 3) per use */
        ts_tensor *em = ts_embedding(w, ids);
        float kv[3] = {1, 2, 3};
        int64_t k3 = 3;
        ts_tensor *k = ts_from_data(ctx, TS_F32, 1, &k3, kv);
        ts_tensor *ek = ts_mul(em, k);
        ts_tensor *l2 = ts_sum(ek, 0, NULL, false);
        CHECK_OK(ctx, ts_backward(l2, NULL));
        CHECK(ts_grad(w) == before); /* added in place */
        float got[15] = {0};
        CHECK_OK(ctx, ts_tensor_read(ts_grad(w), got, TS_F32));
        for (int64_t v = 0; v < V; v++)
            for (int64_t c = 0; c < C; c++) {
                int uses = (v == 3) * 2 + (v == 0) + (v == 4);
                double want = xv[c] + xv[3 + c] + uses * (double)kv[c];
                CHECK_NEAR(got[v * C + c], want, 1e-6);
            }
        /* with no .grad yet, the embedding's dense gradient as before */
        ts_zero_grad(w);
        CHECK_OK(ctx, ts_backward(l2, NULL));
        CHECK_OK(ctx, ts_tensor_read(ts_grad(w), got, TS_F32));
        CHECK_NEAR(got[3 * C + 2], 2 * 3.0, 1e-6);
        CHECK_NEAR(got[1 * C + 0], 0.0, 0);
        ts_release(w), ts_release(x), ts_release(ids), ts_release(wt);
        ts_release(lg), ts_release(l1), ts_release(em), ts_release(k);
        ts_release(ek), ts_release(l2);
    }
    ts_set_mode(ctx, TS_MODE_EAGER);
}

static ts_status read_grad(void *arg, ts_tensor *leaf) {
    (void)arg;
    return isnan(g_at(leaf, 0)) ? TS_ERR_STATE : TS_OK;
}

/* Compiled mode, a hook that reads each gradient as it is final (a sync
 * in the middle of the backward): the gradients equal eager's. (The
 * compiler's liveness walk once shared autograd's visit mark and lost
 * activations at such a sync; dist_train's overlapped compiled run is what
 * caught it.) */
static void test_sync_in_backward(ts_ctx *ctx) {
    float want[2][12], got[12];
    for (int mode = 0; mode < 2; mode++) {
        ts_set_mode(ctx, mode ? TS_MODE_COMPILED : TS_MODE_EAGER);
        int64_t s1[2] = {3, 4}, s2[2] = {4, 2}, sx[2] = {2, 3};
        ts_tensor *w1 = ts_randn(ctx, TS_F32, 2, s1, 1.0, 21);
        ts_tensor *w2 = ts_randn(ctx, TS_F32, 2, s2, 1.0, 22);
        ts_tensor *x = ts_randn(ctx, TS_F32, 2, sx, 1.0, 23);
        ts_set_requires_grad(w1, true);
        ts_set_requires_grad(w2, true);
        ts_tensor *a = ts_matmul(x, w1), *h = ts_tanh(a);
        ts_tensor *y = ts_matmul(h, w2), *yy = ts_mul(y, y);
        ts_tensor *l = ts_sum(yy, 0, NULL, false);
        ts_release(a), ts_release(h), ts_release(y), ts_release(yy);
        ts_set_grad_ready_hook(ctx, mode ? read_grad : NULL, NULL);
        CHECK_OK(ctx, ts_backward(l, NULL));
        ts_set_grad_ready_hook(ctx, NULL, NULL);
        CHECK_OK(ctx, ts_tensor_read(ts_grad(w1), want[mode], TS_F32));
        ts_release(w1), ts_release(w2), ts_release(x), ts_release(l);
    }
    memcpy(got, want[1], sizeof got);
    for (int i = 0; i < 12; i++)
        CHECK_NEAR(got[i], want[0][i], 1e-5);
    ts_set_mode(ctx, TS_MODE_EAGER);
}

int main(void) {
    ts_ctx *ctx = test_ctx();
    test_accumulate_and_zero(ctx);
    test_no_grad_and_detach(ctx);
    test_views_and_broadcast(ctx);
    test_deep_graph(ctx);
    test_shared_subexpression(ctx);
    test_errors(ctx);
    test_bf16_leaf_grad_dtype(ctx);
    test_grad_ready_hook(ctx);
    test_embedding_accumulates(ctx);
    test_sync_in_backward(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_autograd");
}
