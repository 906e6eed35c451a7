/* test_vk_elementwise.c — the Vulkan elementwise kernels
 * (src/backend/vulkan/k_elementwise.c) against the CPU backend: binary ops
 * with broadcasting, unary ops, their backward through ts_backward, where,
 * masked_fill, cast/copy (ints exact), copy_into, concat, slice_scatter,
 * on f32 and bf16, odd sizes and strided views made on the device; and
 * fused groups run by the compiled mode as one dispatch.
 * Tolerances: f32 rtol 1e-5 (atol 1e-6 where the CPU itself rounds a
 * cancellation: gelu-erf's 1 + erf(x) for x < 0, log near 1); bf16 outputs
 * rtol 8e-3 (one bf16 rounding step); integers exact. */
#include "backend/vulkan/vk.h"
#include "ops/rules.h"
#include "vk_test.h"

/* k_matmul.c may not be linked in yet */
#pragma weak vk_k_matmul

#include <math.h>

static ts_ctx *ctx;

#define F32_RTOL  1e-5
#define F32_ATOL  1e-6
#define BF16_RTOL 8e-3
#define BF16_ATOL 1e-5

static double rtol_of(ts_dtype dt) {
    return dt == TS_F32 ? F32_RTOL : BF16_RTOL;
}
static double atol_of(ts_dtype dt) {
    return dt == TS_F32 ? F32_ATOL : BF16_ATOL;
}

/* ---- views, made the same way on both devices ---- */

typedef ts_tensor *(*view_fn)(ts_tensor *);
static ts_tensor *v_id(ts_tensor *x) {
    return ts_retain(x);
}
static ts_tensor *v_t01(ts_tensor *x) {
    return ts_transpose(x, 0, 1);
}
static ts_tensor *v_perm201(ts_tensor *x) {
    int perm[3] = {2, 0, 1};
    return ts_permute(x, perm);
}
/* every other element of the last dim, from 1 */
static ts_tensor *v_step2(ts_tensor *x) {
    return ts_slice(x, x->ndim - 1, 1, x->shape[x->ndim - 1], 2);
}

/* ---- running one op on both devices ---- */

typedef ts_tensor *(*op_fn)(ts_tensor **in);

/* op over views[k](base[k]) on the CPU and on vulkan:0 (bases uploaded,
 * views made there), results compared */
static void check_op(const char *what, op_fn op, int n, ts_tensor **base,
                     const view_fn *views, double rtol, double atol) {
    ts_tensor *hv[4] = {0}, *ub[4] = {0}, *dv[4] = {0};
    for (int k = 0; k < n; k++) {
        view_fn v = views ? views[k] : v_id;
        hv[k] = v(base[k]);
        ub[k] = vkt_up(base[k]);
        dv[k] = ub[k] ? v(ub[k]) : NULL;
    }
    ts_tensor *want = op(hv), *got = op(dv);
    CHECK(want != NULL);
    if (!got)
        fprintf(stderr, "%s: %s\n", what, ts_errmsg(ctx));
    if (want)
        vkt_close(what, got, want, rtol, atol);
    ts_release(want), ts_release(got);
    for (int k = 0; k < n; k++)
        ts_release(hv[k]), ts_release(ub[k]), ts_release(dv[k]);
}

static ts_tensor *randn(ts_dtype dt, int nd, const int64_t *shape,
                        uint64_t seed) {
    return ts_randn(ctx, dt, nd, shape, 1.0, seed);
}
/* positive values for log, sqrt, rsqrt, pow */
static ts_tensor *randpos(ts_dtype dt, int nd, const int64_t *shape,
                          uint64_t seed) {
    return ts_rand(ctx, dt, nd, shape, 0.1, 3.0, seed);
}

/* ---- binary ---- */

static ts_tensor *op_add(ts_tensor **x) {
    return ts_add(x[0], x[1]);
}
static ts_tensor *op_sub(ts_tensor **x) {
    return ts_sub(x[0], x[1]);
}
static ts_tensor *op_mul(ts_tensor **x) {
    return ts_mul(x[0], x[1]);
}
static ts_tensor *op_div(ts_tensor **x) {
    return ts_div(x[0], x[1]);
}
static ts_tensor *op_eq(ts_tensor **x) {
    return ts_eq(x[0], x[1]);
}

static const struct {
    const char *name;
    op_fn fn;
} binary_ops[] = {
    {"add", op_add}, {"sub", op_sub}, {"mul", op_mul}, {"div", op_div}};

/* a, b shapes that broadcast; views on each */
typedef struct {
    const char *name;
    int na, nb;
    int64_t sa[3], sb[3];
    view_fn va, vb;
} bin_shape;

static void test_binary(void) {
    const bin_shape shapes[] = {
        {"1", 1, 1, {1}, {1}, v_id, v_id},
        {"3", 1, 1, {3}, {3}, v_id, v_id},
        {"1000", 1, 1, {1000}, {1000}, v_id, v_id},
        {"(3,1,17)+(5,17)", 3, 2, {3, 1, 17}, {5, 17}, v_id, v_id},
        {"(17)+(4,17)", 1, 2, {17}, {4, 17}, v_id, v_id},
        {"scalar+(3,5)", 0, 2, {0}, {3, 5}, v_id, v_id},
        {"T(17,5)+(5,17)", 2, 2, {17, 5}, {5, 17}, v_t01, v_id},
        {"perm(9,5,7)+T(5,9)", 3, 2, {9, 5, 7}, {5, 9}, v_perm201, v_t01},
        {"step2(4,35)+(1,17)", 2, 2, {4, 35}, {1, 17}, v_step2, v_id},
    };
    ts_dtype dts[2] = {TS_F32, TS_BF16};
    char what[160];
    uint64_t seed = 100;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 2; t++)
            for (size_t o = 0; o < sizeof binary_ops / sizeof binary_ops[0];
                 o++) {
                const bin_shape *sh = &shapes[s];
                ts_tensor *in[2] = {
                    randn(dts[t], sh->na, sh->sa, seed++),
                    binary_ops[o].fn == op_div
                        ? randpos(dts[t], sh->nb, sh->sb, seed++)
                        : randn(dts[t], sh->nb, sh->sb, seed++)};
                view_fn v[2] = {sh->va, sh->vb};
                snprintf(what, sizeof what, "%s %s %s", binary_ops[o].name,
                         sh->name, ts_dtype_name(dts[t]));
                check_op(what, binary_ops[o].fn, 2, in, v, rtol_of(dts[t]),
                         atol_of(dts[t]));
                ts_release(in[0]), ts_release(in[1]);
            }
}

/* eq on values with many ties, broadcast, both dtypes: exact */
static void test_eq(void) {
    float av[51], bv[17];
    for (int i = 0; i < 51; i++)
        av[i] = (float)((i * 7) % 5) - 2.0f;
    for (int i = 0; i < 17; i++)
        bv[i] = (float)((i * 3) % 5) - 2.0f;
    int64_t sa[2] = {3, 17}, sb[1] = {17};
    ts_dtype dts[2] = {TS_F32, TS_BF16};
    for (int t = 0; t < 2; t++) {
        ts_tensor *a32 = ts_from_data(ctx, TS_F32, 2, sa, av),
                  *b32 = ts_from_data(ctx, TS_F32, 1, sb, bv);
        ts_tensor *in[2] = {ts_cast(a32, dts[t]), ts_cast(b32, dts[t])};
        check_op(dts[t] == TS_F32 ? "eq f32" : "eq bf16", op_eq, 2, in, NULL, 0,
                 0);
        ts_tensor *in2[2] = {in[0], in[0]};
        view_fn v[2] = {v_t01, v_t01};
        check_op("eq x==x transposed", op_eq, 2, in2, v, 0, 0);
        ts_release(a32), ts_release(b32);
        ts_release(in[0]), ts_release(in[1]);
    }
}

/* ---- unary ---- */

static ts_tensor *u_add_s(ts_tensor **x) {
    return ts_add_scalar(x[0], 0.75);
}
static ts_tensor *u_mul_s(ts_tensor **x) {
    return ts_mul_scalar(x[0], -1.5);
}
static ts_tensor *u_neg(ts_tensor **x) {
    return ts_neg(x[0]);
}
static ts_tensor *u_exp(ts_tensor **x) {
    return ts_exp(x[0]);
}
static ts_tensor *u_log(ts_tensor **x) {
    return ts_log(x[0]);
}
static ts_tensor *u_sqrt(ts_tensor **x) {
    return ts_sqrt(x[0]);
}
static ts_tensor *u_rsqrt(ts_tensor **x) {
    return ts_rsqrt(x[0]);
}
static ts_tensor *u_abs(ts_tensor **x) {
    return ts_abs(x[0]);
}
static ts_tensor *u_pow25(ts_tensor **x) {
    return ts_pow_scalar(x[0], 2.5);
}
static ts_tensor *u_pow3(ts_tensor **x) {
    return ts_pow_scalar(x[0], 3.0);
}
static ts_tensor *u_pow2(ts_tensor **x) {
    return ts_pow_scalar(x[0], 2.0);
}
static ts_tensor *u_tanh(ts_tensor **x) {
    return ts_tanh(x[0]);
}
static ts_tensor *u_sigmoid(ts_tensor **x) {
    return ts_sigmoid(x[0]);
}
static ts_tensor *u_relu(ts_tensor **x) {
    return ts_relu(x[0]);
}
static ts_tensor *u_silu(ts_tensor **x) {
    return ts_silu(x[0]);
}
static ts_tensor *u_gelu(ts_tensor **x) {
    return ts_gelu(x[0], TS_GELU_ERF);
}
static ts_tensor *u_gelu_tanh(ts_tensor **x) {
    return ts_gelu(x[0], TS_GELU_TANH);
}

typedef struct {
    const char *name;
    op_fn fn;
    bool positive; /* defined for x > 0 only */
} unary_case;

static const unary_case unary_ops[] = {
    {"add_scalar", u_add_s, false},
    {"mul_scalar", u_mul_s, false},
    {"neg", u_neg, false},
    {"exp", u_exp, false},
    {"log", u_log, true},
    {"sqrt", u_sqrt, true},
    {"rsqrt", u_rsqrt, true},
    {"abs", u_abs, false},
    {"pow 2.5", u_pow25, true},
    {"pow 3", u_pow3, false},
    {"pow 2", u_pow2, false},
    {"tanh", u_tanh, false},
    {"sigmoid", u_sigmoid, false},
    {"relu", u_relu, false},
    {"silu", u_silu, false},
    {"gelu erf", u_gelu, false},
    {"gelu tanh", u_gelu_tanh, false},
};
#define N_UNARY (sizeof unary_ops / sizeof unary_ops[0])

static void test_unary(void) {
    const struct {
        const char *name;
        int nd;
        int64_t shape[3];
        view_fn v;
    } shapes[] = {
        {"1", 1, {1}, v_id},
        {"17", 1, {17}, v_id},
        {"(3,1000)", 2, {3, 1000}, v_id},
        {"T(17,5)", 2, {17, 5}, v_t01},
        {"perm(3,5,7)", 3, {3, 5, 7}, v_perm201},
        {"step2(5,33)", 2, {5, 33}, v_step2},
    };
    ts_dtype dts[2] = {TS_F32, TS_BF16};
    char what[160];
    uint64_t seed = 500;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 2; t++)
            for (size_t o = 0; o < N_UNARY; o++) {
                ts_tensor *x =
                    unary_ops[o].positive
                        ? randpos(dts[t], shapes[s].nd, shapes[s].shape, seed++)
                        : ts_randn(ctx, dts[t], shapes[s].nd, shapes[s].shape,
                                   2.0, seed++);
                snprintf(what, sizeof what, "%s %s %s", unary_ops[o].name,
                         shapes[s].name, ts_dtype_name(dts[t]));
                view_fn v = shapes[s].v;
                check_op(what, unary_ops[o].fn, 1, &x, &v, rtol_of(dts[t]),
                         atol_of(dts[t]));
                ts_release(x);
            }
}

/* ---- backward ---- */

/* gradients of y = op(x...) for a random d(y): ts_backward on both
 * devices, the leaves' .grad compared */
static void check_grad(const char *what, op_fn op, int n, ts_tensor **base,
                       double rtol, double atol) {
    ts_tensor *h[2] = {0}, *u[2] = {0};
    for (int k = 0; k < n; k++) {
        h[k] = ts_detach(base[k]); /* a fresh leaf: .grad of its own */
        u[k] = vkt_up(base[k]);
        ts_set_requires_grad(h[k], true), ts_set_requires_grad(u[k], true);
    }
    ts_tensor *yh = op(h), *yu = op(u);
    ts_tensor *g =
        yh ? ts_randn(ctx, yh->dtype, yh->ndim, yh->shape, 1.0, 77) : NULL;
    ts_tensor *gu = g ? vkt_up(g) : NULL;
    CHECK(yh && yu && gu);
    if (yh && yu && gu) {
        CHECK_OK(ctx, ts_backward(yh, g));
        CHECK_OK(ctx, ts_backward(yu, gu));
        char w[160];
        for (int k = 0; k < n; k++) {
            snprintf(w, sizeof w, "%s: d(input %d)", what, k);
            vkt_close(w, ts_grad(u[k]), ts_grad(h[k]), rtol, atol);
        }
    }
    ts_release(yh), ts_release(yu), ts_release(g), ts_release(gu);
    for (int k = 0; k < n; k++)
        ts_release(h[k]), ts_release(u[k]);
}

static void test_backward(void) {
    int64_t s[2] = {7, 19};
    char what[160];
    ts_dtype dts[2] = {TS_F32, TS_BF16};
    for (int t = 0; t < 2; t++) {
        ts_dtype dt = dts[t];
        double rt = rtol_of(dt), at = atol_of(dt);
        ts_tensor *in[2] = {randn(dt, 2, s, 900 + t),
                            randpos(dt, 2, s, 910 + t)};
        snprintf(what, sizeof what, "backward mul %s", ts_dtype_name(dt));
        check_grad(what, op_mul, 2, in, rt, at);
        snprintf(what, sizeof what, "backward div %s", ts_dtype_name(dt));
        check_grad(what, op_div, 2, in, rt, at);
        for (size_t o = 0; o < N_UNARY; o++) {
            snprintf(what, sizeof what, "backward %s %s", unary_ops[o].name,
                     ts_dtype_name(dt));
            check_grad(what, unary_ops[o].fn, 1,
                       unary_ops[o].positive ? &in[1] : &in[0], rt, at);
        }
        ts_release(in[0]), ts_release(in[1]);
    }
}

/* ---- where, masked_fill ---- */

static ts_tensor *op_where(ts_tensor **x) {
    return ts_where(x[0], x[1], x[2]);
}
static ts_tensor *op_masked_fill(ts_tensor **x) {
    return ts_masked_fill(x[0], x[1], -1e9);
}
static ts_tensor *op_masked_fill_neg(ts_tensor **x) {
    return ts_masked_fill(x[0], x[1], -7.0);
}

/* a 0/1 tensor of dtype dt (from x > 0) */
static ts_tensor *mask_of(ts_dtype dt, int nd, const int64_t *shape,
                          uint64_t seed) {
    ts_tensor *r = randn(TS_F32, nd, shape, seed);
    ts_tensor *m = ts_relu(r), *z = ts_zeros(ctx, TS_F32, nd, shape);
    ts_tensor *e = ts_eq(m, z); /* 1 where r <= 0 */
    ts_tensor *c = ts_cast(e, dt);
    ts_release(r), ts_release(m), ts_release(z), ts_release(e);
    return c;
}

static ts_tensor *ints(ts_dtype dt, int nd, const int64_t *shape,
                       uint64_t seed) {
    ts_tensor *r = ts_randn(ctx, TS_F32, nd, shape, 1000.0, seed);
    ts_tensor *c = ts_cast(r, dt);
    ts_release(r);
    return c;
}

static void test_where(void) {
    int64_t sc[2] = {5, 1}, sa[2] = {5, 17}, sb[1] = {17}, s3[3] = {4, 6, 5};
    ts_dtype vdt[4] = {TS_F32, TS_BF16, TS_I32, TS_I64};
    ts_dtype cdt[3] = {TS_F32, TS_I64, TS_BF16};
    char what[160];
    for (int v = 0; v < 4; v++)
        for (int c = 0; c < 3; c++) {
            ts_tensor *in[3] = {mask_of(cdt[c], 2, sc, 30 + c),
                                vdt[v] >= TS_I32 ? ints(vdt[v], 2, sa, 31)
                                                 : randn(vdt[v], 2, sa, 31),
                                vdt[v] >= TS_I32 ? ints(vdt[v], 1, sb, 32)
                                                 : randn(vdt[v], 1, sb, 32)};
            snprintf(what, sizeof what, "where %s ? %s", ts_dtype_name(cdt[c]),
                     ts_dtype_name(vdt[v]));
            check_op(what, op_where, 3, in, NULL, 0, 0);
            for (int k = 0; k < 3; k++)
                ts_release(in[k]);
        }
    /* permuted operands */
    ts_tensor *in[3] = {mask_of(TS_F32, 3, s3, 40), randn(TS_F32, 3, s3, 41),
                        randn(TS_F32, 3, s3, 42)};
    view_fn vv[3] = {v_perm201, v_perm201, v_perm201};
    check_op("where permuted", op_where, 3, in, vv, 0, 0);
    for (int k = 0; k < 3; k++)
        ts_release(in[k]);

    for (int v = 0; v < 4; v++)
        for (int c = 0; c < 2; c++) {
            ts_tensor *x = vdt[v] >= TS_I32 ? ints(vdt[v], 2, sa, 50)
                                            : randn(vdt[v], 2, sa, 50);
            ts_tensor *m = mask_of(cdt[c], 1, sb, 51);
            ts_tensor *in2[2] = {x, m};
            snprintf(what, sizeof what, "masked_fill %s by %s",
                     ts_dtype_name(vdt[v]), ts_dtype_name(cdt[c]));
            check_op(what,
                     vdt[v] >= TS_I32 ? op_masked_fill_neg : op_masked_fill, 2,
                     in2, NULL, 0, 0);
            /* x transposed (17, 5), mask (5, 1) -> broadcast as (1, 5) */
            ts_tensor *m2 = mask_of(cdt[c], 1, sc, 52);
            ts_tensor *in3[2] = {x, m2};
            view_fn vt[2] = {v_t01, v_id};
            snprintf(what, sizeof what, "masked_fill T %s by %s",
                     ts_dtype_name(vdt[v]), ts_dtype_name(cdt[c]));
            check_op(what,
                     vdt[v] >= TS_I32 ? op_masked_fill_neg : op_masked_fill, 2,
                     in3, vt, 0, 0);
            ts_release(x), ts_release(m), ts_release(m2);
        }
}

/* ---- cast, copy ---- */

static ts_dtype cast_to;
static ts_tensor *op_cast(ts_tensor **x) {
    return ts_cast(x[0], cast_to);
}
static ts_tensor *op_contig(ts_tensor **x) {
    return ts_contiguous(x[0]);
}

/* t's elements as i64, exactly (ints) */
static bool read_i64(ts_tensor *t, int64_t *buf) {
    ts_tensor *h = t && t->storage->device.kind != TS_DEVICE_CPU ? vkt_down(t)
                                                                 : ts_retain(t);
    bool ok = h && ts_tensor_read(h, buf, TS_I64) == TS_OK;
    ts_release(h);
    return ok;
}

static void test_cast(void) {
    int64_t s[2] = {6, 35};
    ts_dtype all[4] = {TS_F32, TS_BF16, TS_I32, TS_I64};
    char what[160];
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            ts_tensor *x = all[a] >= TS_I32
                               ? ints(all[a], 2, s, 60 + a)
                               : ts_randn(ctx, all[a], 2, s, 100.0, 60 + a);
            cast_to = all[b];
            view_fn views[3] = {v_id, v_t01, v_step2};
            const char *vn[3] = {"", " T", " step2"};
            for (int v = 0; v < 3; v++) {
                snprintf(what, sizeof what, "cast %s -> %s%s",
                         ts_dtype_name(all[a]), ts_dtype_name(all[b]), vn[v]);
                check_op(what, op_cast, 1, &x, &views[v], 0, 0);
            }
            ts_release(x);
        }
    /* i64 beyond 2^53 and i32 extremes survive copies exactly */
    int64_t big[6] = {INT64_MAX,        INT64_MIN,           (1LL << 53) + 1,
                      -(1LL << 60) - 3, 1234567890123456789, -1};
    int32_t small[6] = {INT32_MAX, INT32_MIN, 1, -1, 16777217, -16777217};
    int64_t n6 = 6, s23[2] = {2, 3};
    ts_tensor *bi = ts_from_data(ctx, TS_I64, 2, s23, big);
    ts_tensor *si = ts_from_data(ctx, TS_I32, 2, s23, small);
    ts_tensor *ub = vkt_up(bi), *us = vkt_up(si);
    ts_tensor *tb = ub ? ts_transpose(ub, 0, 1) : NULL;
    ts_tensor *cb = ts_contiguous(tb), *c32 = ts_cast(us, TS_I64);
    int64_t got[6],
        want_t[6] = {big[0], big[3], big[1], big[4], big[2], big[5]};
    CHECK(read_i64(cb, got) && memcmp(got, want_t, sizeof got) == 0);
    CHECK(read_i64(c32, got));
    for (int i = 0; i < n6; i++)
        CHECK(got[i] == small[i]);
    ts_release(bi), ts_release(si), ts_release(ub), ts_release(us);
    ts_release(tb), ts_release(cb), ts_release(c32);
    /* contiguous copies of views, f32 and bf16 */
    int64_t s3[3] = {3, 5, 7};
    for (int t = 0; t < 2; t++) {
        ts_tensor *x = randn(t ? TS_BF16 : TS_F32, 3, s3, 70);
        view_fn v = v_perm201;
        check_op("contiguous(permute)", op_contig, 1, &x, &v, 0, 0);
        v = v_step2;
        check_op("contiguous(step2)", op_contig, 1, &x, &v, 0, 0);
        ts_release(x);
    }
}

/* in[0]'s strided view = in[1] broadcast and converted (TS_OP_COPY_INTO),
 * then in[0]'s base compared */
static void check_copy_into(const char *what, ts_tensor *dst_base, view_fn dv,
                            ts_tensor *src) {
    ts_tensor *hb = ts_contiguous(dst_base), *ub = vkt_up(dst_base),
              *us = vkt_up(src);
    ts_tensor *hview = dv(hb), *uview = ub ? dv(ub) : NULL;
    ts_tensor *in_h[2] = {hview, src}, *in_u[2] = {uview, us};
    ts_tensor *rh = ts_op_n(TS_OP_COPY_INTO, 2, in_h, NULL);
    ts_tensor *ru = ts_op_n(TS_OP_COPY_INTO, 2, in_u, NULL);
    CHECK(rh != NULL);
    if (!ru)
        fprintf(stderr, "%s: %s\n", what, ts_errmsg(ctx));
    vkt_close(what, ub, hb, 0, 0);
    ts_release(rh), ts_release(ru), ts_release(hview), ts_release(uview);
    ts_release(hb), ts_release(ub), ts_release(us);
}

static void test_copy_into(void) {
    int64_t sd[2] = {6, 34}, s1[2] = {6, 17}, srow[1] = {17}, st[2] = {34, 6};
    ts_tensor *d32 = randn(TS_F32, 2, sd, 80), *dbf = randn(TS_BF16, 2, sd, 81);
    ts_tensor *src = randn(TS_F32, 2, s1, 82),
              *row = randn(TS_BF16, 1, srow, 83);
    ts_tensor *full = randn(TS_F32, 2, st, 84);
    check_copy_into("copy_into step2 <- (6,17) f32", d32, v_step2, src);
    check_copy_into("copy_into step2 <- row bf16->f32", d32, v_step2, row);
    check_copy_into("copy_into bf16 step2 <- f32", dbf, v_step2, src);
    check_copy_into("copy_into T <- (34,6)", d32, v_t01, full);
    ts_tensor *di = ints(TS_I64, 2, sd, 85), *si = ints(TS_I32, 2, s1, 86);
    check_copy_into("copy_into i64 step2 <- i32", di, v_step2, si);
    ts_release(d32), ts_release(dbf), ts_release(src), ts_release(row);
    ts_release(full), ts_release(di), ts_release(si);
}

/* ---- concat, slice_scatter ---- */

static int concat_dim;
static ts_tensor *op_concat3(ts_tensor **x) {
    return ts_concat(3, x, concat_dim);
}

static void test_concat(void) {
    ts_dtype dts[3] = {TS_F32, TS_BF16, TS_I64};
    char what[160];
    for (int t = 0; t < 3; t++)
        for (int dim = 0; dim < 2; dim++) {
            int64_t sa[2] = {5, 7}, sb[2] = {5, 7}, sc[2] = {5, 7};
            sa[dim] = 3, sb[dim] = 1, sc[dim] = 17;
            ts_tensor *in[3];
            int64_t *ss[3] = {sa, sb, sc};
            for (int k = 0; k < 3; k++)
                in[k] = dts[t] == TS_I64 ? ints(TS_I64, 2, ss[k], 90 + k)
                                         : randn(dts[t], 2, ss[k], 90 + k);
            concat_dim = dim;
            snprintf(what, sizeof what, "concat dim %d %s", dim,
                     ts_dtype_name(dts[t]));
            check_op(what, op_concat3, 3, in, NULL, 0, 0);
            for (int k = 0; k < 3; k++)
                ts_release(in[k]);
        }
    /* transposed inputs: (7, n) viewed as (n, 7), joined on dim 0 */
    int64_t s0[2] = {7, 4}, s1[2] = {7, 9}, s2[2] = {7, 1};
    ts_tensor *in[3] = {randn(TS_F32, 2, s0, 95), randn(TS_F32, 2, s1, 96),
                        randn(TS_F32, 2, s2, 97)};
    view_fn v[3] = {v_t01, v_t01, v_t01};
    concat_dim = 0;
    check_op("concat of transposes", op_concat3, 3, in, v, 0, 0);
    for (int k = 0; k < 3; k++)
        ts_release(in[k]);
}

static ts_attrs scatter_attrs;
static int64_t scatter_shape[3];
static ts_tensor *op_slice_scatter(ts_tensor **x) {
    return ts_slice_scatter(x[0], &scatter_attrs, 3, scatter_shape);
}

static void test_slice_scatter(void) {
    /* g (4, 3, 5) into (4, 11, 5) at dim 1, start 2, step 3: rows 2, 5, 8 */
    int64_t sg[3] = {4, 3, 5};
    scatter_attrs = (ts_attrs){.i = {1, 2, 11, 3}, .ni = 4};
    scatter_shape[0] = 4, scatter_shape[1] = 11, scatter_shape[2] = 5;
    ts_dtype dts[2] = {TS_F32, TS_BF16};
    for (int t = 0; t < 2; t++) {
        ts_tensor *g = randn(dts[t], 3, sg, 110 + t);
        check_op("slice_scatter", op_slice_scatter, 1, &g, NULL, 0, 0);
        ts_release(g);
    }
}

static ts_tensor *op_slice_x2(ts_tensor **x) {
    ts_tensor *s = ts_slice(x[0], 1, 2, 21, 3);
    ts_tensor *y = ts_mul_scalar(s, 2.0);
    ts_release(s);
    return y;
}

static void test_slice_backward(void) {
    int64_t sx[2] = {6, 23};
    ts_tensor *x = randn(TS_F32, 2, sx, 121);
    check_grad("backward of slice (slice_scatter)", op_slice_x2, 1, &x, 0, 0);
    ts_release(x);
}

/* ---- fused groups (compiled mode) ---- */

/* (a*b + c).silu() * d, d broadcast over rows */
static ts_tensor *chain1(ts_tensor **x) {
    ts_tensor *ab = ts_mul(x[0], x[1]);
    ts_tensor *s = ts_add(ab, x[2]);
    ts_tensor *h = ts_silu(s);
    ts_tensor *y = ts_mul(h, x[3]);
    ts_release(ab), ts_release(s), ts_release(h);
    return y;
}

/* gelu(tanh(a) * 0.5 + exp(-b)) - a / 3, a cast from bf16 first (the
 * group's members are f32) */
static ts_tensor *chain2(ts_tensor **x) {
    ts_tensor *a = ts_cast(x[0], TS_F32);
    ts_tensor *t = ts_tanh(a), *t2 = ts_mul_scalar(t, 0.5);
    ts_tensor *nb = ts_neg(x[1]), *e = ts_exp(nb);
    ts_tensor *s = ts_add(t2, e), *g = ts_gelu(s, TS_GELU_ERF);
    ts_tensor *a3 = ts_mul_scalar(a, 1.0 / 3.0);
    ts_tensor *y = ts_sub(g, a3);
    ts_release(a), ts_release(t), ts_release(t2), ts_release(nb), ts_release(e);
    ts_release(s), ts_release(g), ts_release(a3);
    return y;
}

/* runs chain on vulkan tensors in compiled mode; compares with eager CPU
 * and checks that nodes were fused */
static void check_fused(const char *what, op_fn chain, int n, ts_tensor **in,
                        uint64_t min_fused) {
    ts_tensor *want = chain(in);
    ts_tensor *u[4] = {0};
    for (int k = 0; k < n; k++)
        u[k] = vkt_up(in[k]);
    ts_set_mode(ctx, TS_MODE_COMPILED);
    ts_tensor *got = chain(u);
    CHECK_OK(ctx, ts_sync(ctx));
    ts_compile_stats st;
    ts_get_compile_stats(ctx, &st);
    ts_set_mode(ctx, TS_MODE_EAGER);
    if (st.nodes_fused < min_fused)
        fprintf(stderr, "%s: %llu nodes fused (want >= %llu)\n", what,
                (unsigned long long)st.nodes_fused,
                (unsigned long long)min_fused);
    CHECK(st.nodes_fused >= min_fused);
    vkt_close(what, got, want, F32_RTOL, F32_ATOL);
    ts_release(want), ts_release(got);
    for (int k = 0; k < n; k++)
        ts_release(u[k]);
}

/* silu(x @ w + bias) * y: a matmul heading the group (epilogue) */
static ts_tensor *chain3(ts_tensor **x) {
    ts_tensor *mm = ts_matmul(x[0], x[1]);
    ts_tensor *b = ts_add(mm, x[2]), *h = ts_silu(b), *y = ts_mul(h, x[3]);
    ts_release(mm), ts_release(b), ts_release(h);
    return y;
}

static void test_fused(void) {
    int64_t s[2] = {13, 77}, st[2] = {77, 13}, sd[1] = {77};
    ts_tensor *in[4] = {randn(TS_F32, 2, s, 130), randn(TS_F32, 2, s, 131),
                        randn(TS_F32, 2, st, 132), randn(TS_F32, 1, sd, 133)};
    /* c as a transposed view: an outside input with strides */
    ts_tensor *c = in[2];
    in[2] = ts_transpose(c, 0, 1);
    ts_release(c);
    check_fused("fused (a*b+c).silu()*d", chain1, 4, in, 3);
    ts_tensor *in2[2] = {randn(TS_BF16, 2, s, 134), randn(TS_F32, 1, sd, 135)};
    check_fused("fused gelu(tanh(a)/2 + exp(-b)) - a/3", chain2, 2, in2, 5);
    for (int k = 0; k < 4; k++)
        ts_release(in[k]);
    ts_release(in2[0]), ts_release(in2[1]);
    if (!vk_k_matmul) {
        printf("test_vk_elementwise: no vulkan matmul linked: the "
               "matmul-headed group is not tested\n");
        return;
    }
    int64_t sx[2] = {9, 24}, sw[2] = {24, 40}, sb[1] = {40}, sy[2] = {9, 40};
    ts_tensor *in3[4] = {randn(TS_F32, 2, sx, 140), randn(TS_F32, 2, sw, 141),
                         randn(TS_F32, 1, sb, 142), randn(TS_F32, 2, sy, 143)};
    check_fused("fused matmul epilogue", chain3, 4, in3, 3);
    ts_compile_stats cs;
    ts_get_compile_stats(ctx, &cs);
    CHECK(cs.matmul_epilogues >= 1);
    for (int k = 0; k < 4; k++)
        ts_release(in3[k]);
}

/* more elements than one dispatch has invocations on lavapipe (65535
 * groups of 256): the grid-stride loop covers the rest. ~10 s on lavapipe,
 * so only with TS_VK_TEST_LARGE=1 in the environment. */
static ts_tensor *u_big(ts_tensor **x) {
    return ts_mul_scalar(x[0], 3.0);
}
static void test_large(void) {
    int64_t n = 65535LL * 256 + 37;
    ts_tensor *x = ts_rand(ctx, TS_F32, 1, &n, -1.0, 1.0, 150);
    check_op("mul_scalar over 16.8M elements", u_big, 1, &x, NULL, 0, 0);
    ts_release(x);
}

/* what the compiler may put in a fused group on vulkan (this direct call
 * also links k_elementwise.o from the static library, where the backend's
 * table refers to it weakly) */
static void test_fusable(void) {
    CHECK(vk_fusable(TS_OP_ADD) && vk_fusable(TS_OP_GELU));
    CHECK(vk_fusable(TS_OP_UNARY_BACKWARD) && vk_fusable(TS_OP_POW_SCALAR));
    CHECK(!vk_fusable(TS_OP_MATMUL) && !vk_fusable(TS_OP_WHERE));
    CHECK(!vk_fusable(TS_OP_SUM) && !vk_fusable(TS_OP_CAST));
}

int main(void) {
    ctx = vkt_ctx("test_vk_elementwise");
    test_fusable();
    test_binary();
    test_eq();
    test_unary();
    test_backward();
    test_where();
    test_cast();
    test_copy_into();
    test_concat();
    test_slice_scatter();
    test_slice_backward();
    test_fused();
    if (getenv("TS_VK_TEST_LARGE"))
        test_large();
    ts_ctx_free(ctx);
    return test_finish("test_vk_elementwise");
}
