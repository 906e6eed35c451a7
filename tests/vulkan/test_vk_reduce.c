/* test_vk_reduce.c — the Vulkan kernels of k_reduce.c against the CPU
 * backend: sum / mean / amax / argmax (inner, outer and several dims,
 * keepdim, long reductions cut in slices, bf16, strided views, NaN and
 * ties), softmax / log_softmax, cross-entropy (ignore_index, every
 * reduction) and its backward, embedding and its backward, index_add_,
 * AdamW over 20 steps, topk, gather and its backward, one_hot.
 *
 * Tolerances: f32 reductions rtol 1e-5 with atol 1e-6 * sqrt(reduced
 * length) (the CPU sums in f64, the device in f32 with compensation);
 * softmax-like f32 rtol 1e-5 atol 1e-6 (1e-5 for log values); bf16 results
 * rtol 8e-3 (one bf16 rounding apart); indices, copies and the scatter-adds
 * (which add in the CPU's order) exactly. */
#include "backend/vulkan/vk.h"
#include "ops/rules.h"
#include "vk_test.h"

#include <math.h>
#include <stdlib.h>

static ts_ctx *ctx;

/* vk_backend.c names the kernels as weak symbols, which do not pull
 * k_reduce.o out of the static library: a strong reference here does (to
 * go once the backend links its kernel files itself) */
vk_kernel test_vk_reduce_link = vk_k_reduce;

/* A view made the same way of the CPU input and of its device copy, so
 * the device kernel sees the strides the CPU kernel sees. */
typedef enum { V_NONE, V_T01, V_T12, V_SLICE2, V_PERM120 } view_kind;

static ts_tensor *make_view(ts_tensor *x, view_kind v) {
    switch (v) {
    case V_T01:
        return ts_transpose(x, 0, 1);
    case V_T12:
        return ts_transpose(x, 1, 2);
    case V_SLICE2: /* every other element of the last dim, from 1 */
        return ts_slice(x, -1, 1, ts_tensor_dim(x, -1), 2);
    case V_PERM120:
        return ts_permute(x, (int[]){1, 2, 0});
    default:
        return ts_retain(x);
    }
}

typedef ts_tensor *(*op_fn)(ts_tensor *x, const void *arg);

/* op(view(base)) on vulkan:0 against the CPU */
static void check_op(const char *what, ts_tensor *base, view_kind v, op_fn op,
                     const void *arg, double rtol, double atol) {
    ts_tensor *bv = vkt_up(base);
    ts_tensor *xc = make_view(base, v), *xv = make_view(bv, v);
    ts_tensor *want = op(xc, arg), *got = op(xv, arg);
    if (!want) {
        ts_test_checks++, ts_test_failures++;
        fprintf(stderr, "%s: no CPU result (%s)\n", what, ts_errmsg(ctx));
    } else {
        vkt_close(what, got, want, rtol, atol);
    }
    ts_release(want), ts_release(got), ts_release(xc), ts_release(xv);
    ts_release(bv);
}

/* ts_backward from root seeded with ones made on root's device (a NULL
 * seed is made on the CPU, which a device graph refuses) */
static ts_status backward_ones(ts_tensor *root) {
    ts_tensor *one = ts_full(ctx, ts_tensor_dtype(root), ts_tensor_ndim(root),
                             ts_tensor_shape(root), 1.0);
    ts_tensor *seed = ts_to_device(one, ts_tensor_device(root));
    ts_status st = ts_backward(root, seed);
    ts_release(one), ts_release(seed);
    return st;
}

/* Whether vulkan:0 has the copy kernel (k_elementwise.c) that a sum's
 * backward needs (the expanded gradient made contiguous); the tests
 * through a sum say they are skipped without it. */
static bool have_copy(const char *what) {
    ts_tensor *x = ts_zeros(ctx, TS_F32, 2, (int64_t[]){2, 3});
    ts_tensor *xv = vkt_up(x), *t = ts_transpose(xv, 0, 1);
    ts_tensor *c = ts_contiguous(t);
    bool ok = c != NULL;
    if (!ok)
        printf("%s: skipped (%s)\n", what, ts_errmsg(ctx));
    ts_release(x), ts_release(xv), ts_release(t), ts_release(c);
    return ok;
}

/* ---- reductions ---- */

typedef struct {
    ts_op_id op;
    int nd;
    int dims[4];
    bool keep;
} red_arg;

static ts_tensor *do_reduce(ts_tensor *x, const void *p) {
    const red_arg *a = p;
    switch (a->op) {
    case TS_OP_SUM:
        return ts_sum(x, a->nd, a->dims, a->keep);
    case TS_OP_MEAN:
        return ts_mean(x, a->nd, a->dims, a->keep);
    case TS_OP_AMAX:
        return ts_amax(x, a->nd, a->dims, a->keep);
    default:
        return ts_argmax(x, a->dims[0], a->keep);
    }
}

static const ts_op_id red_ops[4] = {TS_OP_SUM, TS_OP_MEAN, TS_OP_AMAX,
                                    TS_OP_ARGMAX};
static const char *red_names[4] = {"sum", "mean", "amax", "argmax"};

/* every reduction of x (after view v) over dims, both keepdims */
static void check_reductions(const char *tag, ts_tensor *x, view_kind v, int nd,
                             const int *dims, int64_t rlen, double rtol) {
    for (int k = 0; k < 4; k++) {
        if (red_ops[k] == TS_OP_ARGMAX && nd != 1)
            continue;
        for (int keep = 0; keep < 2; keep++) {
            red_arg a = {.op = red_ops[k], .nd = nd, .keep = keep};
            for (int i = 0; i < nd; i++)
                a.dims[i] = dims[i];
            char what[160];
            snprintf(what, sizeof what, "%s %s keep=%d", red_names[k], tag,
                     keep);
            double atol = red_ops[k] == TS_OP_ARGMAX ? 0 : 1e-6 * sqrt(rlen);
            check_op(what, x, v, do_reduce, &a,
                     red_ops[k] == TS_OP_ARGMAX ? 0 : rtol, atol);
        }
    }
}

static void test_reductions(void) {
    /* inner dim of 1, 3, 17, 1000 */
    const int64_t lens[4] = {1, 3, 17, 1000};
    for (int i = 0; i < 4; i++) {
        char tag[64];
        ts_tensor *x =
            ts_randn(ctx, TS_F32, 2, (int64_t[]){5, lens[i]}, 1.0, 100 + i);
        snprintf(tag, sizeof tag, "(5,%lld) dim 1", (long long)lens[i]);
        check_reductions(tag, x, V_NONE, 1, (int[]){1}, lens[i], 1e-5);
        /* outer dim: the one-invocation-per-output kernel */
        ts_tensor *y =
            ts_randn(ctx, TS_F32, 2, (int64_t[]){lens[i], 67}, 1.0, 200 + i);
        snprintf(tag, sizeof tag, "(%lld,67) dim 0", (long long)lens[i]);
        check_reductions(tag, y, V_NONE, 1, (int[]){0}, lens[i], 1e-5);
        ts_release(x), ts_release(y);
    }
    /* several dims, all dims */
    ts_tensor *x = ts_randn(ctx, TS_F32, 3, (int64_t[]){4, 6, 9}, 1.0, 300);
    check_reductions("(4,6,9) dims 0,2", x, V_NONE, 2, (int[]){0, 2}, 36, 1e-5);
    check_reductions("(4,6,9) dims 1,2", x, V_NONE, 2, (int[]){1, 2}, 54, 1e-5);
    check_reductions("(4,6,9) all", x, V_NONE, 0, NULL, 216, 1e-5);
    check_reductions("(4,6,9) dim 1", x, V_NONE, 1, (int[]){1}, 6, 1e-5);
    /* strided views */
    check_reductions("(4,6,9)^T12 dim 2", x, V_T12, 1, (int[]){2}, 6, 1e-5);
    check_reductions("(4,6,9)^T12 dims 0,1", x, V_T12, 2, (int[]){0, 1}, 36,
                     1e-5);
    check_reductions("(4,6,9) perm(1,2,0) dim 2", x, V_PERM120, 1, (int[]){2},
                     4, 1e-5);
    check_reductions("(4,6,9)[...,1::2] dim 2", x, V_SLICE2, 1, (int[]){2}, 4,
                     1e-5);
    ts_release(x);
    ts_tensor *t = ts_randn(ctx, TS_F32, 2, (int64_t[]){17, 33}, 1.0, 301);
    check_reductions("(17,33)^T dim 1", t, V_T01, 1, (int[]){1}, 17, 1e-5);
    check_reductions("(17,33)^T dim 0", t, V_T01, 1, (int[]){0}, 33, 1e-5);
    ts_release(t);
    /* bf16 in and out */
    ts_tensor *b = ts_randn(ctx, TS_BF16, 2, (int64_t[]){6, 1000}, 1.0, 302);
    check_reductions("bf16 (6,1000) dim 1", b, V_NONE, 1, (int[]){1}, 1000,
                     8e-3);
    check_reductions("bf16 (6,1000) dim 0", b, V_NONE, 1, (int[]){0}, 6, 8e-3);
    ts_release(b);
    /* long reductions: cut in slices, partials reduced by a second pass */
    ts_tensor *l = ts_randn(ctx, TS_F32, 1, (int64_t[]){300001}, 1.0, 303);
    check_reductions("(300001) all", l, V_NONE, 1, (int[]){0}, 300001, 1e-5);
    ts_release(l);
    ts_tensor *c = ts_randn(ctx, TS_F32, 2, (int64_t[]){40000, 3}, 1.0, 304);
    check_reductions("(40000,3) dim 0", c, V_NONE, 1, (int[]){0}, 40000, 1e-5);
    check_reductions("(40000,3)^T dim 1", c, V_T01, 1, (int[]){1}, 40000, 1e-5);
    ts_release(c);
    ts_tensor *w = ts_randn(ctx, TS_F32, 2, (int64_t[]){100, 700}, 1.0, 305);
    check_reductions("(100,700) dim 0", w, V_NONE, 1, (int[]){0}, 100, 1e-5);
    ts_release(w);
}

/* NaN, -inf, ties: amax gives NaN where a NaN is; argmax the first NaN,
 * else the first largest */
static void test_reduce_special(void) {
    float nan = NAN, inf = INFINITY;
    float data[4 * 6] = {1,    3,    3,    -1,   2,    3,    /* ties */
                         -inf, -inf, -inf, -inf, -inf, -inf, /* all -inf */
                         0,    nan,  5,    nan,  1,    2,    /* NaN */
                         -2,   -inf, 7,    7,    -1,   0};
    ts_tensor *x = ts_from_data(ctx, TS_F32, 2, (int64_t[]){4, 6}, data);
    check_reductions("special dim 1", x, V_NONE, 1, (int[]){1}, 6, 1e-5);
    check_reductions("special dim 0", x, V_NONE, 1, (int[]){0}, 4, 1e-5);
    ts_release(x);
    /* many ties over a long row: the first one, across lanes */
    int64_t n = 3000;
    float *r = malloc(sizeof(float) * (size_t)n * 2);
    for (int64_t i = 0; i < 2 * n; i++)
        r[i] = (float)((i * 37) % 101);
    ts_tensor *y = ts_from_data(ctx, TS_F32, 2, (int64_t[]){2, n}, r);
    check_reductions("ties (2,3000) dim 1", y, V_NONE, 1, (int[]){1}, n, 1e-5);
    ts_release(y);
    free(r);
}

/* ---- softmax, log_softmax ---- */

static ts_tensor *do_softmax(ts_tensor *x, const void *p) {
    const int *a = p; /* {log, dim} */
    return a[0] ? ts_log_softmax(x, a[1]) : ts_softmax(x, a[1]);
}

static void check_softmaxes(const char *tag, ts_tensor *x, view_kind v, int dim,
                            bool bf16) {
    for (int lg = 0; lg < 2; lg++) {
        char what[128];
        snprintf(what, sizeof what, "%s %s", lg ? "log_softmax" : "softmax",
                 tag);
        int a[2] = {lg, dim};
        check_op(what, x, v, do_softmax, a, bf16 ? 8e-3 : 1e-5,
                 bf16 ? 1e-4 : (lg ? 1e-5 : 1e-6));
    }
}

static void test_softmax(void) {
    const int64_t lens[4] = {1, 3, 17, 1000};
    for (int i = 0; i < 4; i++) {
        char tag[64];
        ts_tensor *x =
            ts_randn(ctx, TS_F32, 2, (int64_t[]){7, lens[i]}, 3.0, 400 + i);
        snprintf(tag, sizeof tag, "(7,%lld) dim 1", (long long)lens[i]);
        check_softmaxes(tag, x, V_NONE, 1, false);
        snprintf(tag, sizeof tag, "(7,%lld) dim 0", (long long)lens[i]);
        check_softmaxes(tag, x, V_NONE, 0, false);
        snprintf(tag, sizeof tag, "(7,%lld)^T dim 1", (long long)lens[i]);
        check_softmaxes(tag, x, V_T01, 1, false);
        ts_release(x);
    }
    ts_tensor *x3 = ts_randn(ctx, TS_F32, 3, (int64_t[]){3, 5, 130}, 2.0, 410);
    check_softmaxes("(3,5,130)^T12 dim 1", x3, V_T12, 1, false);
    check_softmaxes("(3,5,130) perm dim 0", x3, V_PERM120, 0, false);
    check_softmaxes("(3,5,130)[...,1::2] dim 2", x3, V_SLICE2, 2, false);
    ts_release(x3);
    ts_tensor *b = ts_randn(ctx, TS_BF16, 2, (int64_t[]){4, 300}, 2.0, 411);
    check_softmaxes("bf16 (4,300) dim 1", b, V_NONE, 1, true);
    check_softmaxes("bf16 (4,300) dim 0", b, V_NONE, 0, true);
    ts_release(b);
    /* masked rows: some -inf (as attention masks), one all -inf (NaN) */
    float inf = INFINITY;
    for (int64_t L = 5; L <= 200; L += 195) {
        float *m = malloc(sizeof(float) * 3 * (size_t)L);
        for (int64_t k = 0; k < L; k++) {
            m[k] = k < L / 2 ? -inf : (float)(k % 7) - 3;
            m[L + k] = -inf;
            m[2 * L + k] = k == L - 1 ? 1.5f : -inf;
        }
        ts_tensor *x = ts_from_data(ctx, TS_F32, 2, (int64_t[]){3, L}, m);
        check_softmaxes(L == 5 ? "masked (3,5)" : "masked (3,200)", x, V_NONE,
                        1, false);
        ts_release(x);
        free(m);
    }
}

/* ---- cross-entropy ---- */

static ts_tensor *targets_i64(int64_t N, int64_t V, int64_t ignore,
                              uint64_t seed) {
    int64_t *t = malloc(sizeof(int64_t) * (size_t)N);
    uint64_t s = seed;
    for (int64_t i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int64_t)((s >> 33) % (uint64_t)V);
        if (i % 4 == 1)
            t[i] = ignore;
    }
    ts_tensor *r = ts_from_data(ctx, TS_I64, 1, &N, t);
    free(t);
    return r;
}

typedef struct {
    ts_tensor *t; /* on the CPU; moved along with the logits */
    int64_t ignore;
    ts_reduction red;
} ce_arg;

static ts_tensor *do_ce(ts_tensor *x, const void *p) {
    const ce_arg *a = p;
    ts_tensor *t = ts_to_device(a->t, ts_tensor_device(x));
    ts_tensor *r = ts_cross_entropy(x, t, a->ignore, a->red);
    ts_release(t);
    return r;
}

static void test_cross_entropy(void) {
    const char *rn[3] = {"mean", "sum", "none"};
    const int64_t Vs[3] = {3, 17, 1000};
    for (int vi = 0; vi < 3; vi++) {
        int64_t N = 13, V = Vs[vi];
        ts_tensor *x =
            ts_randn(ctx, TS_F32, 2, (int64_t[]){N, V}, 2.0, 500 + vi);
        ts_tensor *xt =
            ts_randn(ctx, TS_F32, 2, (int64_t[]){V, N}, 2.0, 510 + vi);
        ts_tensor *xb =
            ts_randn(ctx, TS_BF16, 2, (int64_t[]){N, V}, 2.0, 520 + vi);
        ce_arg a = {targets_i64(N, V, -100, 530 + vi), -100, 0};
        for (int r = 0; r < 3; r++) {
            char what[96];
            a.red = (ts_reduction)r;
            snprintf(what, sizeof what, "cross_entropy V=%lld %s", (long long)V,
                     rn[r]);
            check_op(what, x, V_NONE, do_ce, &a, 1e-5, 1e-5);
            snprintf(what, sizeof what, "cross_entropy V=%lld %s transposed",
                     (long long)V, rn[r]);
            check_op(what, xt, V_T01, do_ce, &a, 1e-5, 1e-5);
            snprintf(what, sizeof what, "cross_entropy bf16 V=%lld %s",
                     (long long)V, rn[r]);
            check_op(what, xb, V_NONE, do_ce, &a, 8e-3, 1e-3);
        }
        ts_release(x), ts_release(xt), ts_release(xb), ts_release(a.t);
    }
    /* every row ignored: mean is 0/0 = NaN on both */
    ts_tensor *x = ts_randn(ctx, TS_F32, 2, (int64_t[]){3, 5}, 1.0, 540);
    int64_t all[3] = {7, 7, 7};
    ce_arg a = {ts_from_data(ctx, TS_I64, 1, (int64_t[]){3}, all), 7,
                TS_REDUCE_MEAN};
    check_op("cross_entropy all ignored", x, V_NONE, do_ce, &a, 1e-5, 1e-5);
    ts_release(x), ts_release(a.t);
}

/* the backward kernel alone, with a given upstream gradient and lse */
static void test_cross_entropy_backward_kernel(void) {
    int64_t N = 11, V = 300, ignore = -1;
    ts_tensor *x = ts_randn(ctx, TS_F32, 2, (int64_t[]){N, V}, 2.0, 550);
    ts_tensor *t = targets_i64(N, V, ignore, 551);
    float *xf = malloc(sizeof(float) * (size_t)(N * V)), lse[11];
    ts_tensor_read(x, xf, TS_F32);
    for (int64_t r = 0; r < N; r++) {
        double m = -INFINITY, s = 0;
        for (int64_t k = 0; k < V; k++)
            m = xf[r * V + k] > m ? xf[r * V + k] : m;
        for (int64_t k = 0; k < V; k++)
            s += exp(xf[r * V + k] - m);
        lse[r] = (float)(m + log(s));
    }
    free(xf);
    ts_tensor *l = ts_from_data(ctx, TS_F32, 1, &N, lse);
    for (int r = 0; r < 3; r++) {
        ts_tensor *g = r == TS_REDUCE_NONE
                           ? ts_randn(ctx, TS_F32, 1, &N, 1.0, 552)
                           : ts_scalar(ctx, TS_F32, 0.75);
        ts_attrs at = {.i = {ignore, r}, .ni = 2};
        ts_tensor *in[4] = {g, x, t, l};
        ts_tensor *vin[4] = {vkt_up(g), vkt_up(x), vkt_up(t), vkt_up(l)};
        ts_tensor *want = ts_op_n(TS_OP_CROSS_ENTROPY_BACKWARD, 4, in, &at);
        ts_tensor *got = ts_op_n(TS_OP_CROSS_ENTROPY_BACKWARD, 4, vin, &at);
        char what[64];
        snprintf(what, sizeof what, "cross_entropy_backward red=%d", r);
        vkt_close(what, got, want, 1e-5, 1e-6);
        ts_release(want), ts_release(got), ts_release(g);
        for (int k = 0; k < 4; k++)
            ts_release(vin[k]);
    }
    ts_release(x), ts_release(t), ts_release(l);
}

/* d(loss)/d(logits) through ts_backward on both devices */
static void test_cross_entropy_grad(void) {
    int64_t N = 9, V = 77;
    for (int r = 0; r < 2; r++) {
        ts_tensor *xc = ts_randn(ctx, TS_F32, 2, (int64_t[]){N, V}, 2.0, 560);
        ts_tensor *xv = vkt_up(xc);
        ts_set_requires_grad(xc, true);
        ts_set_requires_grad(xv, true);
        ts_tensor *t = targets_i64(N, V, -100, 561), *tv = vkt_up(t);
        ts_tensor *lc = ts_cross_entropy(xc, t, -100, (ts_reduction)r);
        ts_tensor *lv = ts_cross_entropy(xv, tv, -100, (ts_reduction)r);
        CHECK_OK(ctx, backward_ones(lc));
        CHECK_OK(ctx, backward_ones(lv));
        vkt_close(r ? "cross_entropy grad (sum)" : "cross_entropy grad (mean)",
                  ts_grad(xv), ts_grad(xc), 1e-5, 1e-6);
        ts_release(lc), ts_release(lv), ts_release(t), ts_release(tv);
        ts_release(xc), ts_release(xv);
    }
}

/* ---- embedding, its backward, index_add_ ---- */

static ts_tensor *ids_tensor(ts_dtype dt, int nd, const int64_t *shape,
                             int64_t V, uint64_t seed) {
    int64_t n = 1;
    for (int k = 0; k < nd; k++)
        n *= shape[k];
    int64_t *v = malloc(sizeof(int64_t) * (size_t)n);
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        /* half the ids from a few rows: many repeats */
        v[i] = (int64_t)((s >> 33) % (uint64_t)(i % 2 || V < 3 ? V : 3));
    }
    ts_tensor *t = ts_from_data(ctx, TS_I64, nd, shape, v);
    free(v);
    if (dt != TS_I64) {
        ts_tensor *c = ts_cast(t, dt);
        ts_release(t);
        t = c;
    }
    return t;
}

static ts_tensor *do_embedding(ts_tensor *w, const void *p) {
    ts_tensor *ids = ts_to_device((ts_tensor *)p, ts_tensor_device(w));
    ts_tensor *r = ts_embedding(w, ids);
    ts_release(ids);
    return r;
}

static void test_embedding(void) {
    int64_t V = 50, C = 17;
    ts_tensor *ids = ids_tensor(TS_I64, 2, (int64_t[]){3, 7}, V, 600);
    ts_tensor *ids32 = ids_tensor(TS_I32, 1, (int64_t[]){5}, V, 601);
    ts_tensor *w = ts_randn(ctx, TS_F32, 2, (int64_t[]){V, C}, 1.0, 602);
    ts_tensor *wt = ts_randn(ctx, TS_F32, 2, (int64_t[]){C, V}, 1.0, 603);
    ts_tensor *wb = ts_randn(ctx, TS_BF16, 2, (int64_t[]){V, C}, 1.0, 604);
    check_op("embedding f32", w, V_NONE, do_embedding, ids, 0, 0);
    check_op("embedding i32 ids", w, V_NONE, do_embedding, ids32, 0, 0);
    check_op("embedding transposed weight", wt, V_T01, do_embedding, ids, 0, 0);
    check_op("embedding bf16", wb, V_NONE, do_embedding, ids, 0, 0);
    check_op("embedding column slice", w, V_SLICE2, do_embedding, ids, 0, 0);

    /* the backward kernel: scatter-add, summed in the CPU's order */
    for (int bf = 0; bf < 2; bf++) {
        ts_tensor *g = ts_randn(ctx, bf ? TS_BF16 : TS_F32, 3,
                                (int64_t[]){3, 7, C}, 1.0, 605);
        ts_tensor *gv = vkt_up(g), *iv = vkt_up(ids);
        ts_tensor *want = ts_embedding_backward(g, ids, V);
        ts_tensor *got = ts_embedding_backward(gv, iv, V);
        vkt_close(bf ? "embedding_backward bf16" : "embedding_backward", got,
                  want, 0, 0);
        ts_release(want), ts_release(got);
        /* g as a strided view: (C, 21) transposed */
        ts_release(g), ts_release(gv);
        g = ts_randn(ctx, TS_F32, 2, (int64_t[]){C, 21}, 1.0, 606);
        gv = vkt_up(g);
        ts_tensor *gc = ts_transpose(g, 0, 1), *gvt = ts_transpose(gv, 0, 1);
        ts_tensor *ic = ts_reshape(ids, 1, (int64_t[]){21});
        ts_tensor *ivr = ts_reshape(iv, 1, (int64_t[]){21});
        want = ts_embedding_backward(gc, ic, V);
        got = ts_embedding_backward(gvt, ivr, V);
        vkt_close("embedding_backward strided g", got, want, 0, 0);
        ts_release(want), ts_release(got), ts_release(gc), ts_release(gvt);
        ts_release(ic), ts_release(ivr), ts_release(g), ts_release(gv);
        ts_release(iv);
    }

    /* index_add_: into an existing table */
    ts_tensor *dc = ts_randn(ctx, TS_F32, 2, (int64_t[]){V, C}, 1.0, 607);
    ts_tensor *dv = vkt_up(dc);
    ts_tensor *src = ts_randn(ctx, TS_F32, 3, (int64_t[]){3, 7, C}, 1.0, 608);
    ts_tensor *sv = vkt_up(src), *iv = vkt_up(ids);
    CHECK_OK(ctx, ts_index_add_(dc, ids, src));
    CHECK_OK(ctx, ts_index_add_(dv, iv, sv));
    vkt_close("index_add_", dv, dc, 0, 0);
    ts_release(dc), ts_release(dv), ts_release(src), ts_release(sv);
    ts_release(iv);

    /* through autograd, seeded with a random gradient of the output; twice:
     * the second backward adds into the existing .grad (index_add_) */
    {
        ts_tensor *wc = ts_randn(ctx, TS_F32, 2, (int64_t[]){V, C}, 1.0, 610);
        ts_tensor *wv = vkt_up(wc), *iv2 = vkt_up(ids);
        ts_set_requires_grad(wc, true);
        ts_set_requires_grad(wv, true);
        ts_tensor *ec = ts_embedding(wc, ids), *ev = ts_embedding(wv, iv2);
        ts_tensor *gc =
            ts_randn(ctx, TS_F32, 3, (int64_t[]){3, 7, C}, 1.0, 611);
        ts_tensor *gv = vkt_up(gc);
        CHECK_OK(ctx, ts_backward(ec, gc));
        CHECK_OK(ctx, ts_backward(ev, gv));
        vkt_close("embedding grad (seeded)", ts_grad(wv), ts_grad(wc), 0, 0);
        CHECK_OK(ctx, ts_backward(ec, gc));
        CHECK_OK(ctx, ts_backward(ev, gv));
        vkt_close("embedding grad (seeded, twice)", ts_grad(wv), ts_grad(wc), 0,
                  0);
        ts_release(ec), ts_release(ev), ts_release(gc), ts_release(gv);
        ts_release(wc), ts_release(wv), ts_release(iv2);
    }

    /* through a sum: d sum(embedding(w, ids)) / dw, repeated ids (the sum's
     * backward also needs k_elementwise.c's copy) */
    for (int twice = 0; twice < 2 && have_copy("embedding grad through a sum");
         twice++) {
        ts_tensor *wc = ts_randn(ctx, TS_F32, 2, (int64_t[]){V, C}, 1.0, 609);
        ts_tensor *wv = vkt_up(wc), *iv2 = vkt_up(ids);
        ts_set_requires_grad(wc, true);
        ts_set_requires_grad(wv, true);
        ts_tensor *ec = ts_embedding(wc, ids), *ev = ts_embedding(wv, iv2);
        ts_tensor *sc = ts_sum(ec, 0, NULL, false);
        ts_tensor *sv2 = ts_sum(ev, 0, NULL, false);
        vkt_close("sum(embedding)", sv2, sc, 1e-5, 1e-4);
        /* twice: the second backward accumulates into the existing .grad */
        for (int k = 0; k <= twice; k++) {
            CHECK_OK(ctx, backward_ones(sc));
            CHECK_OK(ctx, backward_ones(sv2));
        }
        vkt_close(twice ? "embedding grad (two backwards)" : "embedding grad",
                  ts_grad(wv), ts_grad(wc), 0, 0);
        ts_release(ec), ts_release(ev), ts_release(sc), ts_release(sv2);
        ts_release(wc), ts_release(wv), ts_release(iv2);
    }
    ts_release(ids), ts_release(ids32), ts_release(w), ts_release(wt);
    ts_release(wb);
}

/* ---- AdamW ---- */

static void test_adamw(void) {
    const int64_t shape[2] = {37, 5};
    for (int bf = 0; bf < 2; bf++) {
        ts_dtype dt = bf ? TS_BF16 : TS_F32;
        ts_tensor *pc = ts_randn(ctx, dt, 2, shape, 1.0, 700);
        ts_tensor *mc = ts_zeros(ctx, TS_F32, 2, shape);
        ts_tensor *vc = ts_zeros(ctx, TS_F32, 2, shape);
        ts_tensor *pv = vkt_up(pc), *mv = vkt_up(mc), *vv = vkt_up(vc);
        double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
        for (int step = 1; step <= 20; step++) {
            /* odd steps: a gradient scale (hyper of 8); a bf16 gradient
             * on step 5; a transposed one on step 7 */
            ts_tensor *g;
            if (step == 7) {
                ts_tensor *gt =
                    ts_randn(ctx, TS_F32, 2, (int64_t[]){shape[1], shape[0]},
                             1.0, 710 + (uint64_t)step);
                g = ts_transpose(gt, 0, 1);
                ts_release(gt);
            } else {
                g = ts_randn(ctx, step == 5 ? TS_BF16 : TS_F32, 2, shape, 1.0,
                             710 + (uint64_t)step);
            }
            float h[8] = {(float)lr,
                          (float)b1,
                          (float)b2,
                          (float)eps,
                          (float)wd,
                          (float)(1 - pow(b1, step)),
                          (float)(1 - pow(b2, step)),
                          0.5f};
            int64_t nh = step % 2 ? 8 : 7;
            ts_tensor *hc = ts_from_data(ctx, TS_F32, 1, &nh, h);
            ts_tensor *hv = vkt_up(hc), *gb = vkt_up(g);
            ts_tensor *gv = step == 7 ? ts_transpose(gb, 0, 1) : ts_retain(gb);
            if (step == 7) { /* the same transposed view on the device */
                ts_release(gv);
                ts_tensor *gtc = ts_transpose(g, 0, 1);
                ts_tensor *gtd = vkt_up(gtc);
                gv = ts_transpose(gtd, 0, 1);
                ts_release(gtc), ts_release(gtd);
            }
            CHECK_OK(ctx, ts_adamw_update_(pc, g, mc, vc, hc));
            CHECK_OK(ctx, ts_adamw_update_(pv, gv, mv, vv, hv));
            ts_release(g), ts_release(gb), ts_release(gv), ts_release(hc);
            ts_release(hv);
        }
        vkt_close(bf ? "adamw 20 steps bf16 param" : "adamw 20 steps param", pv,
                  pc, bf ? 8e-3 : 1e-5, bf ? 1e-3 : 1e-7);
        vkt_close("adamw 20 steps m", mv, mc, 1e-5, 1e-7);
        vkt_close("adamw 20 steps v", vv, vc, 1e-5, 1e-9);
        ts_release(pc), ts_release(mc), ts_release(vc);
        ts_release(pv), ts_release(mv), ts_release(vv);
    }
}

/* ---- topk, gather, gather's backward, one_hot ---- */

static ts_tensor *do_topk(ts_tensor *x, const void *p) {
    return ts_topk(x, *(const int64_t *)p);
}

static void test_topk(void) {
    ts_tensor *x = ts_randn(ctx, TS_F32, 2, (int64_t[]){13, 9}, 1.0, 800);
    ts_tensor *xb = ts_randn(ctx, TS_BF16, 3, (int64_t[]){2, 5, 64}, 1.0, 801);
    const int64_t ks[3] = {1, 2, 9};
    for (int i = 0; i < 3; i++) {
        char what[64];
        snprintf(what, sizeof what, "topk k=%lld", (long long)ks[i]);
        check_op(what, x, V_NONE, do_topk, &ks[i], 0, 0);
        snprintf(what, sizeof what, "topk k=%lld transposed", (long long)ks[i]);
        check_op(what, x, V_T01, do_topk, &ks[i], 0, 0);
    }
    int64_t k8 = 8;
    check_op("topk bf16 (2,5,64) k=8", xb, V_NONE, do_topk, &k8, 0, 0);
    check_op("topk bf16 (2,5,64)^T12 k=2", xb, V_T12, do_topk, &ks[1], 0, 0);
    /* ties and NaN: NaN first, ties by lower index */
    float nan = NAN;
    float d[2 * 6] = {1, 3, 3, nan, 3, nan, 0, 0, -1, 0, 2, -0.0f};
    ts_tensor *s = ts_from_data(ctx, TS_F32, 2, (int64_t[]){2, 6}, d);
    int64_t k6 = 6, k4 = 4;
    check_op("topk ties/NaN k=6", s, V_NONE, do_topk, &k6, 0, 0);
    check_op("topk ties/NaN k=4", s, V_NONE, do_topk, &k4, 0, 0);
    ts_release(x), ts_release(xb), ts_release(s);
}

typedef struct {
    int dim;
    ts_tensor *ix;
} gather_arg;

static ts_tensor *do_gather(ts_tensor *x, const void *p) {
    const gather_arg *a = p;
    ts_tensor *ix = ts_to_device(a->ix, ts_tensor_device(x));
    ts_tensor *r = ts_gather(x, a->dim, ix);
    ts_release(ix);
    return r;
}

static void test_gather_grad_sum(const gather_arg *a1);

static void test_gather(void) {
    ts_tensor *x = ts_randn(ctx, TS_F32, 2, (int64_t[]){6, 9}, 1.0, 900);
    ts_tensor *xb = ts_randn(ctx, TS_BF16, 2, (int64_t[]){6, 9}, 1.0, 901);
    gather_arg a1 = {1, ids_tensor(TS_I64, 2, (int64_t[]){6, 3}, 9, 902)};
    gather_arg a0 = {0, ids_tensor(TS_I32, 2, (int64_t[]){4, 7}, 6, 903)};
    gather_arg at = {1, ids_tensor(TS_I64, 2, (int64_t[]){9, 4}, 6, 904)};
    check_op("gather dim 1", x, V_NONE, do_gather, &a1, 0, 0);
    check_op("gather dim 0 i32 index", x, V_NONE, do_gather, &a0, 0, 0);
    check_op("gather bf16", xb, V_NONE, do_gather, &a1, 0, 0);
    check_op("gather transposed x", x, V_T01, do_gather, &at, 0, 0);
    /* i64 values are copied bit for bit */
    ts_tensor *xi = ids_tensor(TS_I64, 2, (int64_t[]){6, 9}, 1000000, 905);
    check_op("gather i64 x", xi, V_NONE, do_gather, &a1, 0, 0);

    /* backward kernel: repeated indices summed */
    for (int k = 0; k < 2; k++) {
        gather_arg *a = k ? &a0 : &a1;
        ts_tensor *g = ts_randn(ctx, k ? TS_BF16 : TS_F32, 2,
                                ts_tensor_shape(a->ix), 1.0, 906 + k);
        ts_tensor *gv = vkt_up(g), *iv = vkt_up(a->ix);
        ts_tensor *want =
            ts_gather_backward(g, a->ix, a->dim, 2, (int64_t[]){6, 9});
        ts_tensor *got =
            ts_gather_backward(gv, iv, a->dim, 2, (int64_t[]){6, 9});
        vkt_close(k ? "gather_backward dim 0 bf16" : "gather_backward dim 1",
                  got, want, 0, 0);
        ts_release(want), ts_release(got), ts_release(g), ts_release(gv);
        ts_release(iv);
    }
    /* through autograd, seeded with a random gradient of the output */
    ts_tensor *xc = ts_randn(ctx, TS_F32, 2, (int64_t[]){6, 9}, 1.0, 908);
    ts_tensor *xv = vkt_up(xc), *iv = vkt_up(a1.ix);
    ts_set_requires_grad(xc, true);
    ts_set_requires_grad(xv, true);
    ts_tensor *yc = ts_gather(xc, 1, a1.ix), *yv = ts_gather(xv, 1, iv);
    ts_tensor *gc = ts_randn(ctx, TS_F32, 2, (int64_t[]){6, 3}, 1.0, 909);
    ts_tensor *gv = vkt_up(gc);
    CHECK_OK(ctx, ts_backward(yc, gc));
    CHECK_OK(ctx, ts_backward(yv, gv));
    vkt_close("gather grad (seeded)", ts_grad(xv), ts_grad(xc), 0, 0);
    ts_release(yc), ts_release(yv), ts_release(gc), ts_release(gv);
    ts_release(xc), ts_release(xv), ts_release(iv);
    if (have_copy("gather grad through a sum"))
        test_gather_grad_sum(&a1);
    ts_release(x), ts_release(xb), ts_release(xi);
    ts_release(a1.ix), ts_release(a0.ix), ts_release(at.ix);
}

/* d sum(gather(x, 1, index)) / dx on both devices */
static void test_gather_grad_sum(const gather_arg *a1) {
    ts_tensor *xc = ts_randn(ctx, TS_F32, 2, (int64_t[]){6, 9}, 1.0, 908);
    ts_tensor *xv = vkt_up(xc), *iv = vkt_up(a1->ix);
    ts_set_requires_grad(xc, true);
    ts_set_requires_grad(xv, true);
    ts_tensor *yc = ts_gather(xc, 1, a1->ix), *yv = ts_gather(xv, 1, iv);
    ts_tensor *sc = ts_sum(yc, 0, NULL, false),
              *sv = ts_sum(yv, 0, NULL, false);
    CHECK_OK(ctx, backward_ones(sc));
    CHECK_OK(ctx, backward_ones(sv));
    vkt_close("gather grad through a sum", ts_grad(xv), ts_grad(xc), 0, 0);
    ts_release(yc), ts_release(yv), ts_release(sc), ts_release(sv);
    ts_release(xc), ts_release(xv), ts_release(iv);
}

static ts_tensor *do_one_hot(ts_tensor *ix, const void *p) {
    return ts_one_hot(ix, *(const int64_t *)p);
}

static void test_one_hot(void) {
    int64_t n = 7, one = 1;
    ts_tensor *ix = ids_tensor(TS_I64, 2, (int64_t[]){3, 5}, n, 950);
    ts_tensor *ix32 = ids_tensor(TS_I32, 2, (int64_t[]){4, 6}, n, 951);
    ts_tensor *z = ids_tensor(TS_I64, 1, (int64_t[]){3}, 1, 952);
    check_op("one_hot", ix, V_NONE, do_one_hot, &n, 0, 0);
    check_op("one_hot i32 transposed", ix32, V_T01, do_one_hot, &n, 0, 0);
    check_op("one_hot 1 class", z, V_NONE, do_one_hot, &one, 0, 0);
    ts_release(ix), ts_release(ix32), ts_release(z);
}

int main(void) {
    ctx = vkt_ctx("test_vk_reduce");
    test_reductions();
    test_reduce_special();
    test_softmax();
    test_cross_entropy();
    test_cross_entropy_backward_kernel();
    test_cross_entropy_grad();
    test_embedding();
    test_adamw();
    test_topk();
    test_gather();
    test_one_hot();
    ts_ctx_free(ctx);
    return test_finish("test_vk_reduce");
}
