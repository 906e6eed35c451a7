/* test_vk_norm.c — the Vulkan norms and rotary embedding (k_norm.c)
 * against the CPU backend on the same inputs: rmsnorm and layernorm with
 * every weight/bias combination, f32 and bf16, hidden sizes 1..1000,
 * strided, sliced and broadcast inputs; rope with the models' tables
 * (prefill and decode positions, per-sequence positions, both
 * directions); and the backward of all three through ts_backward. */
#include "backend/vulkan/vk.h" /* vk_k_rmsnorm: see main */
#include "ops/rules.h"         /* ts_rope_dir: the transposed rope */
#include "vk_test.h"

/* f32: rtol 1e-5 with a small atol for values near 0; bf16 outputs: one
 * bf16 rounding (2^-8) apart at most, with room for an f32 difference
 * that flips a rounding */
#define F32_RTOL  1e-5
#define F32_ATOL  1e-6
#define BF16_RTOL 8e-3
#define BF16_ATOL 1e-3

static ts_ctx *ctx;
static uint64_t seed = 1;
/* whether the Vulkan backend has the kernels autograd builds the weight
 * and bias gradients and the views' backward from (elementwise, reduce,
 * copy: other files); without them only dx is checked, on dense inputs */
static bool grad_ops;

static bool probe_grad_ops(void) {
    int64_t s[2] = {2, 3};
    int d0[1] = {0};
    ts_tensor *a = ts_randn(ctx, TS_F32, 2, s, 1.0, 99), *v = vkt_up(a);
    ts_tensor *m = ts_mul(v, v), *d = ts_sub(v, v);
    ts_tensor *sum = ts_sum(v, 1, d0, false), *c = ts_cast(v, TS_BF16);
    ts_tensor *t = ts_transpose(v, 0, 1), *tc = ts_contiguous(t);
    bool ok = m && d && sum && c && tc;
    ts_release(a), ts_release(v), ts_release(m), ts_release(d);
    ts_release(sum), ts_release(c), ts_release(t), ts_release(tc);
    ts_clear_error(ctx);
    if (!ok)
        printf("test_vk_norm: the Vulkan backend lacks mul/sub/sum/cast/copy:"
               " weight and bias gradients and strided backward not checked\n");
    return ok;
}

static double rtol_of(ts_dtype dt) {
    return dt == TS_F32 ? F32_RTOL : BF16_RTOL;
}
static double atol_of(ts_dtype dt, double scale) {
    return dt == TS_F32 ? F32_ATOL * scale : BF16_ATOL * scale;
}

/* how the (L0, L1, C) input is laid out */
typedef enum {
    LAYOUT_DENSE,     /* contiguous */
    LAYOUT_PERMUTED,  /* leading dims swapped: rows not evenly spaced */
    LAYOUT_COLUMNS,   /* a transposed (C, R): the last dim has stride R */
    LAYOUT_SLICED,    /* [..., 1:1+C] of a wider tensor: offset, row pitch */
    LAYOUT_BROADCAST, /* (1, L1, C) expanded: stride 0 over L0 */
    LAYOUTS
} layout;
static const char *layout_name[LAYOUTS] = {"dense", "permuted", "columns",
                                           "sliced", "broadcast"};

/* the base tensor the view of layout l is cut from */
static ts_tensor *base_for(layout l, ts_dtype dt, int64_t L0, int64_t L1,
                           int64_t C) {
    int64_t s[3] = {L0, L1, C};
    int nd = 3;
    if (l == LAYOUT_PERMUTED)
        s[0] = L1, s[1] = L0;
    else if (l == LAYOUT_COLUMNS)
        s[0] = C, s[1] = L0 * L1, nd = 2;
    else if (l == LAYOUT_SLICED)
        s[2] = C + 3;
    else if (l == LAYOUT_BROADCAST)
        s[0] = 1;
    return ts_randn(ctx, dt, nd, s, 1.0, seed++);
}

/* the (L0, L1, C) view of layout l over base (new reference) */
static ts_tensor *view_of(ts_tensor *base, layout l, int64_t L0, int64_t L1,
                          int64_t C) {
    int64_t s[3] = {L0, L1, C};
    switch (l) {
    case LAYOUT_PERMUTED:
        return ts_transpose(base, 0, 1);
    case LAYOUT_COLUMNS: {
        ts_tensor *t = ts_transpose(base, 0, 1);
        ts_tensor *r = ts_reshape(t, 3, s); /* splits the row dim: a view */
        ts_release(t);
        return r;
    }
    case LAYOUT_SLICED:
        return ts_slice(base, 2, 1, 1 + C, 1);
    case LAYOUT_BROADCAST:
        return ts_expand(base, 3, s);
    default:
        return ts_retain(base);
    }
}

/* a (C) parameter; every other layout reads it with stride 2 */
static ts_tensor *param_base(ts_dtype dt, int64_t C, layout l, double mean) {
    int64_t s[1] = {l % 2 ? 2 * C : C};
    ts_tensor *r = ts_randn(ctx, dt, 1, s, 0.5, seed++);
    if (mean == 0)
        return r;
    ts_tensor *m = ts_add_scalar(r, mean);
    ts_release(r);
    return m;
}
static ts_tensor *param_view(ts_tensor *base, layout l) {
    return l % 2 ? ts_slice(base, 0, 0, ts_tensor_dim(base, 0), 2)
                 : ts_retain(base);
}

typedef enum { NORM_RMS, NORM_LAYER } norm_kind;

static ts_tensor *run_norm(norm_kind k, ts_tensor *x, ts_tensor *w,
                           ts_tensor *b) {
    return k == NORM_RMS ? ts_rmsnorm(x, w, 1e-5) : ts_layernorm(x, w, b, 1e-5);
}

/* one norm on both devices: y, and with grad, dx, dw, db through
 * ts_backward with a random dy. has: bit 0 weight, bit 1 bias. */
static void check_norm(norm_kind k, ts_dtype dt, int64_t L0, int64_t L1,
                       int64_t C, layout l, int has, bool grad) {
    char what[160];
    snprintf(what, sizeof what, "%s %s (%lld, %lld, %lld) %s w%d b%d%s",
             k == NORM_RMS ? "rmsnorm" : "layernorm", ts_dtype_name(dt),
             (long long)L0, (long long)L1, (long long)C, layout_name[l],
             has & 1, has >> 1 & 1, grad ? " grad" : "");
    int64_t ys[3] = {L0, L1, C};
    ts_tensor *xb = base_for(l, dt, L0, L1, C);
    ts_tensor *wb = has & 1 ? param_base(dt, C, l, 1.0) : NULL;
    ts_tensor *bb = has & 2 ? param_base(dt, C, l, 0.0) : NULL;
    ts_tensor *dy = grad ? ts_randn(ctx, dt, 3, ys, 1.0, seed++) : NULL;
    ts_tensor *leaf[2][3] = {{0}}, *y[2] = {0};
    for (int dev = 0; dev < 2; dev++) { /* 0: CPU, 1: vulkan:0 */
        ts_tensor *src[3] = {xb, wb, bb};
        for (int i = 0; i < 3; i++) {
            leaf[dev][i] =
                src[i] ? (dev ? vkt_up(src[i]) : ts_detach(src[i])) : NULL;
            if (grad && leaf[dev][i] && (i == 0 || grad_ops))
                CHECK_OK(ctx, ts_set_requires_grad(leaf[dev][i], true));
        }
        ts_tensor *x = view_of(leaf[dev][0], l, L0, L1, C);
        ts_tensor *w = wb ? param_view(leaf[dev][1], l) : NULL;
        ts_tensor *b = bb ? param_view(leaf[dev][2], l) : NULL;
        y[dev] = run_norm(k, x, w, b);
        if (grad) {
            ts_tensor *g = dev ? vkt_up(dy) : ts_retain(dy);
            CHECK_OK(ctx, ts_backward(y[dev], g));
            ts_release(g);
        }
        ts_release(x), ts_release(w), ts_release(b);
    }
    vkt_close(what, y[1], y[0], rtol_of(dt), atol_of(dt, 1));
    static const char *names[3] = {"dx", "dw", "db"};
    for (int i = 0; grad && i < 3; i++) {
        if (!leaf[0][i] || (i > 0 && !grad_ops))
            continue;
        char w2[200];
        snprintf(w2, sizeof w2, "%s: %s", what, names[i]);
        /* dx sums C products per row; dw, db sum over the rows (and the
         * broadcast layout sums dx over L0 too). Layernorm's dx at C = 1
         * is 0 (x - mean = 0, rstd = 1/sqrt(eps)); the CPU's is the
         * residue of a contracted g*w - mean(g*w), up to rstd ulp(g*w). */
        double n =
            i == 0 ? (l == LAYOUT_BROADCAST ? L0 : 1) * 4.0 : (double)(L0 * L1);
        if (i == 0 && k == NORM_LAYER && C == 1)
            n *= 1000;
        vkt_close(w2, ts_grad(leaf[1][i]), ts_grad(leaf[0][i]), rtol_of(dt),
                  atol_of(dt, n));
    }
    for (int dev = 0; dev < 2; dev++) {
        ts_release(y[dev]);
        for (int i = 0; i < 3; i++)
            ts_release(leaf[dev][i]);
    }
    ts_release(xb), ts_release(wb), ts_release(bb), ts_release(dy);
}

static void test_norms_forward(void) {
    static const int64_t Cs[] = {1, 3, 17, 64, 1000};
    ts_dtype dts[2] = {TS_F32, TS_BF16};
    for (int di = 0; di < 2; di++)
        for (int ci = 0; ci < 5; ci++) {
            int64_t C = Cs[ci], L0 = 3, L1 = C >= 1000 ? 5 : 11;
            for (int l = 0; l < LAYOUTS; l++) {
                check_norm(NORM_RMS, dts[di], L0, L1, C, (layout)l, l % 2, 0);
                /* layernorm: weight and bias, each alone, neither */
                check_norm(NORM_LAYER, dts[di], L0, L1, C, (layout)l,
                           (3 - l) & 3, 0);
            }
        }
}

/* more rows than one launch has workgroups in x (grid-stride) */
static void test_norms_many_rows(void) {
    check_norm(NORM_RMS, TS_F32, 2, 40000, 3, LAYOUT_DENSE, 1, 0);
    check_norm(NORM_LAYER, TS_F32, 2, 40000, 3, LAYOUT_DENSE, 3, 0);
}

static void test_norms_backward(void) {
    static const int64_t Cs[] = {1, 3, 17, 64, 1000};
    ts_dtype dts[2] = {TS_F32, TS_BF16};
    for (int di = 0; di < 2; di++)
        for (int ci = 0; ci < 5; ci++) {
            int64_t C = Cs[ci], L0 = 2, L1 = C >= 1000 ? 3 : 7;
            if (!grad_ops) { /* dx alone */
                for (int has = 0; has < 4; has++)
                    check_norm(has < 2 ? NORM_RMS : NORM_LAYER, dts[di], L0, L1,
                               C, LAYOUT_DENSE, has % 2 ? 3 : 0, 1);
                continue;
            }
            layout l = (layout)((ci + di) % LAYOUTS);
            check_norm(NORM_RMS, dts[di], L0, L1, C, l, 1, 1);
            check_norm(NORM_RMS, dts[di], L0, L1, C, LAYOUT_DENSE, 0, 1);
            check_norm(NORM_LAYER, dts[di], L0, L1, C, l, 3, 1);
            check_norm(NORM_LAYER, dts[di], L0, L1, C, LAYOUT_DENSE, ci % 3, 1);
        }
}

/* rope as the decoder calls it: x (B, H, T, D) is the (B, T, H, D)
 * projection transposed; cos/sin (T, D) from ts_rope_tables at positions
 * pos0.. (decode: T = 1, pos0 > 0), or per_seq: (B, 1, T, D), each
 * sequence at its own offset. tdt: the tables' dtype. */
static void check_rope(ts_dtype dt, ts_dtype tdt, int64_t B, int64_t H,
                       int64_t T, int64_t D, int64_t pos0, bool per_seq,
                       double dir, bool grad) {
    char what[160];
    snprintf(what, sizeof what,
             "rope %s tables %s B%lld H%lld T%lld D%lld pos0 %lld%s dir %g%s",
             ts_dtype_name(dt), ts_dtype_name(tdt), (long long)B, (long long)H,
             (long long)T, (long long)D, (long long)pos0,
             per_seq ? " per-seq" : "", dir, grad ? " grad" : "");
    /* the transpose's backward needs the copy kernel (grad_ops) */
    bool heads_view = !grad || grad_ops;
    int64_t ps[4] = {B, T, H, D}, ys[4] = {B, H, T, D};
    ts_tensor *xb = ts_randn(ctx, dt, 4, heads_view ? ps : ys, 1.0, seed++);
    ts_tensor *cs = NULL, *sn = NULL;
    if (!per_seq) {
        CHECK_OK(ctx, ts_rope_tables(ctx, T, D, 10000.0, pos0, &cs, &sn));
    } else { /* sequence b at pos0 + 5 b */
        ts_tensor *c1[8], *s1[8];
        for (int64_t b = 0; b < B; b++)
            CHECK_OK(ctx, ts_rope_tables(ctx, T, D, 10000.0, pos0 + 5 * b,
                                         &c1[b], &s1[b]));
        ts_tensor *c2 = ts_concat((int)B, c1, 0),
                  *s2 = ts_concat((int)B, s1, 0);
        int64_t ts[4] = {B, 1, T, D};
        cs = ts_reshape(c2, 4, ts), sn = ts_reshape(s2, 4, ts);
        for (int64_t b = 0; b < B; b++)
            ts_release(c1[b]), ts_release(s1[b]);
        ts_release(c2), ts_release(s2);
    }
    if (tdt != TS_F32) {
        ts_tensor *c = ts_cast(cs, tdt), *s = ts_cast(sn, tdt);
        ts_release(cs), ts_release(sn);
        cs = c, sn = s;
    }
    ts_tensor *dy = grad ? ts_randn(ctx, dt, 4, ys, 1.0, seed++) : NULL;
    ts_tensor *leaf[2] = {0}, *y[2] = {0};
    for (int dev = 0; dev < 2; dev++) {
        leaf[dev] = dev ? vkt_up(xb) : ts_detach(xb);
        if (grad)
            CHECK_OK(ctx, ts_set_requires_grad(leaf[dev], true));
        ts_tensor *c = dev ? vkt_up(cs) : ts_retain(cs);
        ts_tensor *s = dev ? vkt_up(sn) : ts_retain(sn);
        ts_tensor *x =
            heads_view ? ts_transpose(leaf[dev], 1, 2) : ts_retain(leaf[dev]);
        y[dev] = ts_rope_dir(x, c, s, dir);
        if (grad) {
            ts_tensor *g = dev ? vkt_up(dy) : ts_retain(dy);
            CHECK_OK(ctx, ts_backward(y[dev], g));
            ts_release(g);
        }
        ts_release(x), ts_release(c), ts_release(s);
    }
    vkt_close(what, y[1], y[0], rtol_of(dt), atol_of(dt, 1));
    if (grad) {
        char w2[200];
        snprintf(w2, sizeof w2, "%s: dx", what);
        vkt_close(w2, ts_grad(leaf[1]), ts_grad(leaf[0]), rtol_of(dt),
                  atol_of(dt, 1));
    }
    for (int dev = 0; dev < 2; dev++)
        ts_release(y[dev]), ts_release(leaf[dev]);
    ts_release(xb), ts_release(cs), ts_release(sn), ts_release(dy);
}

static void test_rope(void) {
    ts_dtype dts[2] = {TS_F32, TS_BF16};
    for (int di = 0; di < 2; di++) {
        ts_dtype dt = dts[di];
        check_rope(dt, TS_F32, 2, 3, 5, 64, 0, false, 1, false);   /* prefill */
        check_rope(dt, TS_F32, 2, 4, 1, 128, 37, false, 1, false); /* decode */
        check_rope(dt, TS_F32, 3, 2, 1, 64, 11, true, 1, false);   /* batch */
        check_rope(dt, TS_F32, 1, 2, 3, 2, 4, false, 1, false);    /* D 2 */
        check_rope(dt, TS_F32, 1, 1, 2, 1026, 0, false, 1, false); /* h > 512 */
        check_rope(dt, dt, 2, 3, 4, 6, 2, true, -1, false);        /* inverse */
        check_rope(dt, TS_F32, 2, 3, 5, 64, 3, false, 1, true);    /* grad */
        check_rope(dt, TS_F32, 2, 2, 1, 34, 9, true, 1, true);
    }
}

int main(void) {
    /* a real reference to k_norm.c: the op table's references are weak,
     * and weak references do not pull a member out of libtessera.a */
    volatile vk_kernel keep = vk_k_rmsnorm;
    (void)keep;
    ctx = vkt_ctx("test_vk_norm");
    grad_ops = probe_grad_ops();
    test_norms_forward();
    test_norms_many_rows();
    test_norms_backward();
    test_rope();
    ts_ctx_free(ctx);
    return test_finish("test_vk_norm");
}
