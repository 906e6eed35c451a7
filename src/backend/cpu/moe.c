/* moe.c — the sparse mixture-of-experts MLP on the CPU (ts_moe_experts),
 * grouped by expert: the routed (token, slot) pairs are counted per expert
 * and sorted into per-expert row lists, each expert's rows are gathered
 * into one contiguous block, and its gate/up/down weights are applied as
 * one matrix product each (ts_sgemm for f32 weights; the bf16 kernel of
 * matmul.c, which reads the weights once for few rows and widens them for
 * many). Each slot's result is kept apart and the slots of a token are
 * added in slot order, so the sums do not depend on the thread count. The
 * backward recomputes the gate/up products and runs the same grouping.
 * Owns the experts MLP only; the router's ops are in routing.c.
 *
 * Shapes: x (N, C); idx, w (N, k); gate, up (E, F, C); down (E, C, F).
 * Rows r of the sorted order (R of them, the routed slots) hold slot
 * s = n * k + j of token n. */
#include "backend/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

/* ---- routing: per-expert row lists ---- */

typedef struct {
    int64_t N, K, E;
    int64_t R;      /* routed slots */
    int64_t *start; /* E + 1: expert e's rows are [start[e], start[e + 1]) */
    int64_t *slot;  /* R: row -> slot */
    int64_t *pos;   /* N * K: slot -> row, -1 when the slot routes nowhere */
    int64_t max_rows;
} moe_routing;

static void routing_free(moe_routing *rt) {
    free(rt->start), free(rt->slot), free(rt->pos);
    rt->start = rt->slot = rt->pos = NULL;
}

static int64_t load_expert(const ts_tensor *idx, int64_t n, int64_t j) {
    const char *p =
        ts_tensor_ptr(idx) + (n * idx->strides[0] + j * idx->strides[1]) *
                                 (int64_t)ts_dtype_size(idx->dtype);
    if (idx->dtype == TS_I32) {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* counts, then a stable counting sort by expert: within an expert the rows
 * keep slot order. Every entry of idx in [0, E) or -1 (no expert). */
static ts_status routing_build(ts_ctx *ctx, const char *op,
                               const ts_tensor *idx, int64_t E,
                               moe_routing *rt) {
    int64_t N = idx->shape[0], K = idx->shape[1];
    *rt = (moe_routing){.N = N, .K = K, .E = E};
    rt->start = calloc((size_t)(2 * E + 1), sizeof(int64_t));
    rt->slot = malloc(sizeof(int64_t) * (size_t)(N * K + 1));
    rt->pos = malloc(sizeof(int64_t) * (size_t)(N * K + 1));
    if (!rt->start || !rt->slot || !rt->pos) {
        routing_free(rt);
        return ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", op);
    }
    int64_t *next = rt->start + E + 1; /* E: the next free row of each */
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < K; j++) {
            int64_t e = load_expert(idx, n, j);
            if (e < -1 || e >= E) {
                routing_free(rt);
                return ts_set_error(ctx, TS_ERR_RANGE,
                                    "%s: idx[%lld, %lld] = %lld is not an "
                                    "expert (want 0 <= idx < E = %lld, or -1 "
                                    "for none)",
                                    op, (long long)n, (long long)j,
                                    (long long)e, (long long)E);
            }
            rt->pos[n * K + j] = e; /* the expert, until placed */
            if (e >= 0)
                rt->start[e + 1]++;
        }
    for (int64_t e = 0; e < E; e++) {
        int64_t m = rt->start[e + 1];
        rt->max_rows = m > rt->max_rows ? m : rt->max_rows;
        rt->start[e + 1] += rt->start[e];
        next[e] = rt->start[e];
    }
    rt->R = rt->start[E];
    for (int64_t s = 0; s < N * K; s++) {
        int64_t e = rt->pos[s];
        if (e < 0)
            continue;
        rt->slot[next[e]] = s;
        rt->pos[s] = next[e]++;
    }
    return TS_OK;
}

/* ---- expert weights ---- */

/* an (E, rows, cols) weight, f32 or bf16, read in place when its rows are
 * contiguous (a slice of a fused gate_up weight, experts apart by any
 * stride): expert e's row r at base + (e * se + r * ld) elements; copied
 * to contiguous when not */
typedef struct {
    const char *base;
    bool bf16;
    int64_t rows, cols, se, ld;
    void *tmp;
} expert_w;

static bool expert_w_init(expert_w *w, const ts_tensor *t) {
    *w = (expert_w){
        .bf16 = t->dtype == TS_BF16, .rows = t->shape[1], .cols = t->shape[2]};
    const int64_t *st = t->strides;
    if ((w->cols == 1 || st[2] == 1) && (w->rows == 1 || st[1] >= w->cols) &&
        st[0] >= 0) {
        w->base = ts_tensor_ptr(t);
        w->se = st[0];
        w->ld = w->rows == 1 ? w->cols : st[1];
        return true;
    }
    size_t es = ts_dtype_size(t->dtype);
    w->tmp = cpu_tmp_alloc(es * (size_t)(ts_tensor_numel(t) + 1));
    if (!w->tmp)
        return false;
    int64_t cst[TS_MAX_DIMS];
    ts_contiguous_strides(t->ndim, t->shape, cst);
    cpu_copy_strided(w->tmp, t->dtype, cst, ts_tensor_ptr(t), t->dtype,
                     t->strides, t->ndim, t->shape);
    w->base = w->tmp;
    w->se = w->rows * w->cols, w->ld = w->cols;
    return true;
}

static const void *expert_at(const expert_w *w, int64_t e) {
    return w->base + (size_t)(e * w->se) * (w->bf16 ? 2 : 4);
}

/* Y (M, rows) = A (M, cols) @ W_e^T */
static bool mul_t(const expert_w *w, int64_t e, const float *A, int64_t M,
                  float *Y) {
    if (!w->bf16) {
        ts_sgemm(false, true, (int)M, (int)w->rows, (int)w->cols, 1.0f, A,
                 (int)w->cols, expert_at(w, e), (int)w->ld, 0.0f, Y,
                 (int)w->rows);
        return true;
    }
    return cpu_gemm_f32_w16t(M, w->rows, w->cols, A, w->cols, expert_at(w, e),
                             w->ld, true, Y);
}

/* Y (M, cols) = beta Y + A (M, rows) @ W_e; a bf16 W_e is widened into
 * wf (rows x cols) first */
static void mul(const expert_w *w, int64_t e, const float *A, int64_t M,
                float *Y, float beta, float *wf) {
    const float *W = expert_at(w, e);
    int64_t ld = w->ld;
    if (w->bf16) {
        cpu_widen_rows(expert_at(w, e), w->ld, w->rows, w->cols, true, wf);
        W = wf, ld = w->cols;
    }
    ts_sgemm(false, false, (int)M, (int)w->cols, (int)w->rows, 1.0f, A,
             (int)w->rows, W, (int)ld, beta, Y, (int)w->cols);
}

/* ---- row loops on the pool ---- */

/* dst row r = src row of token slot[r] / K (+ row0: a segment) */
typedef struct {
    const moe_routing *rt;
    int64_t row0, C;
    const float *src;
    float *dst;
} gather_job;

static void gather_rows(void *arg, int64_t r0, int64_t r1) {
    const gather_job *j = arg;
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = j->rt->slot[j->row0 + r] / j->rt->K;
        memcpy(j->dst + r * j->C, j->src + n * j->C,
               sizeof(float) * (size_t)j->C);
    }
}

static void gather_segment(const moe_routing *rt, int64_t row0, int64_t M,
                           int64_t C, const float *src, float *dst) {
    gather_job j = {rt, row0, C, src, dst};
    ts_parallel_for(M, cpu_grain(C, 16384), gather_rows, &j);
}

/* y = act(x) over n floats, as the unary kernels compute it */
static void act_fwd(ts_act act, float *y, const float *x, int64_t n) {
    if (act == TS_ACT_SILU)
        cpu_silu(y, x, n);
    else if (act == TS_ACT_GELU_TANH)
        cpu_gelu_tanh(y, x, n);
    else
        for (int64_t i = 0; i < n; i++)
            y[i] = cpu_gelu_erf(x[i]);
}

/* y = g act'(x) over n floats (y may be g or x), as unary_backward */
static void act_bwd(ts_act act, float *y, const float *g, const float *x,
                    int64_t n) {
    if (act == TS_ACT_SILU)
        for (int64_t i = 0; i < n; i++)
            y[i] = cpu_silu_bwd(g[i], x[i]);
    else if (act == TS_ACT_GELU_TANH)
        cpu_gelu_tanh_bwd(y, g, x, n);
    else
        for (int64_t i = 0; i < n; i++)
            y[i] = g[i] * cpu_gelu_erf_grad(x[i]);
}

/* The hidden rows (M, F) of one expert. Forward: G = act(G) * U (gated)
 * or U = act(U). Backward recompute (AG given): AG = act(G), A = AG * U;
 * or A = act(U). */
typedef struct {
    ts_act act;
    bool gated;
    int64_t F;
    float *G, *U, *AG, *A;
} hidden_job;

static void hidden_rows(void *arg, int64_t r0, int64_t r1) {
    const hidden_job *j = arg;
    int64_t F = j->F, off = r0 * F, len = (r1 - r0) * F;
    if (!j->gated) {
        act_fwd(j->act, j->AG ? j->A + off : j->U + off, j->U + off, len);
        return;
    }
    float *h = j->AG ? j->AG + off : j->G + off, *u = j->U + off;
    float *a = j->AG ? j->A + off : j->G + off;
    act_fwd(j->act, h, j->G + off, len);
    for (int64_t i = 0; i < len; i++)
        a[i] = h[i] * u[i];
}

static void hidden(ts_act act, bool gated, int64_t M, int64_t F, float *G,
                   float *U, float *AG, float *A) {
    hidden_job j = {act, gated, F, G, U, AG, A};
    ts_parallel_for(M, cpu_grain(F, 16384), hidden_rows, &j);
}

/* out[n] = sum_j w[n, j] Y[pos[n K + j]] over the routed slots, j in order
 * (w NULL: weight 1) */
typedef struct {
    const moe_routing *rt;
    int64_t C;
    const float *w, *Y;
    float *out;
} combine_job;

static void combine_tokens(void *arg, int64_t n0, int64_t n1) {
    const combine_job *j = arg;
    int64_t C = j->C, K = j->rt->K;
    for (int64_t n = n0; n < n1; n++) {
        float *o = j->out + n * C;
        memset(o, 0, sizeof(float) * (size_t)C);
        for (int64_t q = 0; q < K; q++) {
            int64_t r = j->rt->pos[n * K + q];
            if (r < 0)
                continue;
            float wq = j->w ? j->w[n * K + q] : 1.0f;
            const float *y = j->Y + r * C;
            for (int64_t c = 0; c < C; c++)
                o[c] += wq * y[c];
        }
    }
}

static void combine(const moe_routing *rt, int64_t C, const float *w,
                    const float *Y, float *out) {
    combine_job j = {rt, C, w, Y, out};
    ts_parallel_for(rt->N, cpu_grain(C * rt->K, 16384), combine_tokens, &j);
}

/* ---- forward ---- */

/* the inputs of a forward or backward node, from in[first] on */
typedef struct {
    const ts_tensor *x, *idx, *w;
    expert_w gate, up, down;
    bool gated;
    ts_act act;
    int64_t N, C, F, E, K;
} moe_args;

static bool args_init(moe_args *a, const ts_node *n, int first) {
    ts_tensor *const *in = n->in + first;
    memset(a, 0, sizeof *a);
    a->gated = n->attrs.i[1] != 0;
    a->act = (ts_act)n->attrs.i[0];
    a->x = in[0], a->idx = in[1], a->w = in[2];
    const ts_tensor *up = in[a->gated ? 4 : 3], *down = in[a->gated ? 5 : 4];
    a->N = a->x->shape[0], a->C = a->x->shape[1];
    a->E = up->shape[0], a->F = up->shape[1], a->K = a->idx->shape[1];
    return (!a->gated || expert_w_init(&a->gate, in[3])) &&
           expert_w_init(&a->up, up) && expert_w_init(&a->down, down);
}

static void args_free(moe_args *a) {
    cpu_tmp_free(a->gate.tmp), cpu_tmp_free(a->up.tmp),
        cpu_tmp_free(a->down.tmp);
}

/* out (N, C) = the experts MLP; Y (R, C) first holds the gathered rows of
 * x, then each expert's results over its own rows */
static ts_status moe_forward(ts_ctx *ctx, const moe_args *a,
                             const moe_routing *rt, const float *x,
                             const float *w, float *out) {
    int64_t C = a->C, F = a->F, MM = rt->max_rows;
    float *Y = cpu_tmp_alloc(sizeof(float) * (size_t)(rt->R * C + 1));
    float *G = cpu_tmp_alloc(sizeof(float) * (size_t)(MM * F + 1));
    float *U = cpu_tmp_alloc(sizeof(float) * (size_t)(MM * F + 1));
    bool ok = Y && G && U;
    if (ok)
        gather_segment(rt, 0, rt->R, C, x, Y);
    for (int64_t e = 0; ok && e < a->E; e++) {
        int64_t r0 = rt->start[e], M = rt->start[e + 1] - r0;
        if (M == 0)
            continue;
        float *Xe = Y + r0 * C;
        ok = (!a->gated || mul_t(&a->gate, e, Xe, M, G)) &&
             mul_t(&a->up, e, Xe, M, U);
        if (!ok)
            break;
        hidden(a->act, a->gated, M, F, G, U, NULL, NULL);
        /* the rows of Xe are read: the results take their place */
        ok = mul_t(&a->down, e, a->gated ? G : U, M, Xe);
    }
    if (ok)
        combine(rt, C, w, Y, out);
    cpu_tmp_free(Y), cpu_tmp_free(G), cpu_tmp_free(U);
    return ok ? TS_OK
              : ts_set_error(ctx, TS_ERR_OOM, "moe_experts: out of memory");
}

/* in x, idx, w, [gate], up, down -> out (N, C) f32 */
CPU_KERNEL(moe_experts) {
    moe_args a;
    moe_routing rt = {0};
    float *tx = NULL, *tw = NULL;
    bool ok = args_init(&a, n, 0);
    const float *x = ok ? cpu_as_f32(a.x, &tx) : NULL;
    const float *w = ok ? cpu_as_f32(a.w, &tw) : NULL;
    ts_status st = TS_OK;
    if (!x || !w)
        st = ts_set_error(ctx, TS_ERR_OOM, "moe_experts: out of memory");
    if (st == TS_OK)
        st = routing_build(ctx, "moe_experts", a.idx, a.E, &rt);
    float *out = (float *)ts_tensor_ptr(n->out);
    if (st == TS_OK && a.F == 0) /* no hidden units: nothing to add */
        memset(out, 0, sizeof(float) * (size_t)(a.N * a.C));
    else if (st == TS_OK && a.C > 0)
        st = moe_forward(ctx, &a, &rt, x, w, out);
    routing_free(&rt);
    cpu_tmp_free(tx), cpu_tmp_free(tw);
    args_free(&a);
    return st;
}

/* ---- backward ---- */

/* Per expert, with its rows (M of them): Xe the gathered x rows, Ge the
 * gathered upstream rows g[n]:
 *   G = Xe gate^T, U = Xe up^T, AG = act(G), A = AG * U (recomputed)
 *   D = Ge down                      (M, F): d(down_e a) / da per row
 *   dw[slot] = D . A
 *   Ge *= w, D *= w                  (dA = w D)
 *   ddown = Ge^T A
 *   dG = act'(G) (dA * U), dU = dA * AG    (ungated: dU = act'(U) dA)
 *   dgate = dG^T Xe, dup = dU^T Xe
 *   dXe = dG gate + dU up            (into Xe's rows, combined per token)
 */
typedef struct {
    const moe_routing *rt;
    int64_t row0, F;
    ts_act act;
    bool gated;
    const float *w; /* (N, K) */
    float *Ge, *D, *G, *U, *AG, *A;
    int64_t C;
    float *dw; /* (N, K) or NULL */
} bwd_rows_job;

/* rows of one expert: dw, the scaling by w, and dG, dU */
static void bwd_rows(void *arg, int64_t r0, int64_t r1) {
    const bwd_rows_job *j = arg;
    int64_t F = j->F, C = j->C;
    for (int64_t r = r0; r < r1; r++) {
        int64_t s = j->rt->slot[j->row0 + r];
        float *D = j->D + r * F, *A = j->A + r * F, *U = j->U + r * F;
        float *G = j->G + r * F, *Ge = j->Ge + r * C, ws = j->w[s];
        if (j->dw) {
            double dot = 0;
            for (int64_t f = 0; f < F; f++)
                dot += (double)D[f] * A[f];
            j->dw[s] = (float)dot;
        }
        for (int64_t c = 0; c < C; c++)
            Ge[c] *= ws;
        for (int64_t f = 0; f < F; f++)
            D[f] *= ws;
        if (!j->gated) {
            act_bwd(j->act, U, D, U, F);
            continue;
        }
        const float *AG = j->AG + r * F;
        for (int64_t f = 0; f < F; f++) {
            float dA = D[f];
            D[f] = dA * U[f]; /* d(act(G)) */
            U[f] = dA * AG[f];
        }
        act_bwd(j->act, G, D, G, F);
    }
}

typedef struct {
    float *dx, *dw, *dgate, *dup, *ddown; /* NULL: not wanted */
} moe_grads;

static ts_status moe_backward(ts_ctx *ctx, const moe_args *a,
                              const moe_routing *rt, const float *g,
                              const float *x, const float *w,
                              const moe_grads *d) {
    int64_t C = a->C, F = a->F, MM = rt->max_rows;
    size_t mf = sizeof(float) * (size_t)(MM * F + 1);
    float *X = cpu_tmp_alloc(sizeof(float) * (size_t)(rt->R * C + 1));
    float *Ge = cpu_tmp_alloc(sizeof(float) * (size_t)(MM * C + 1));
    float *G = cpu_tmp_alloc(mf), *U = cpu_tmp_alloc(mf),
          *AG = cpu_tmp_alloc(mf), *A = cpu_tmp_alloc(mf),
          *D = cpu_tmp_alloc(mf);
    bool any16 = a->up.bf16 || a->down.bf16 || (a->gated && a->gate.bf16);
    float *wf =
        any16 ? cpu_tmp_alloc(sizeof(float) * (size_t)(F * C + 1)) : NULL;
    bool ok = X && Ge && G && U && AG && A && D && (!any16 || wf);
    if (ok)
        gather_segment(rt, 0, rt->R, C, x, X);
    size_t wsize = (size_t)(F * C);
    for (int64_t e = 0; ok && e < a->E; e++) {
        int64_t r0 = rt->start[e], M = rt->start[e + 1] - r0;
        if (M == 0)
            continue;
        float *Xe = X + r0 * C;
        ok = (!a->gated || mul_t(&a->gate, e, Xe, M, G)) &&
             mul_t(&a->up, e, Xe, M, U);
        if (!ok)
            break;
        hidden(a->act, a->gated, M, F, G, U, AG, A);
        gather_segment(rt, r0, M, C, g, Ge);
        mul(&a->down, e, Ge, M, D, 0.0f, wf);
        bwd_rows_job bj = {rt, r0, F, a->act, a->gated, w, Ge,
                           D,  G,  U, AG,     A,        C, d->dw};
        ts_parallel_for(M, cpu_grain(F + C, 8192), bwd_rows, &bj);
        if (d->ddown)
            ts_sgemm(true, false, (int)C, (int)F, (int)M, 1.0f, Ge, (int)C, A,
                     (int)F, 0.0f, d->ddown + e * wsize, (int)F);
        if (d->dgate && a->gated)
            ts_sgemm(true, false, (int)F, (int)C, (int)M, 1.0f, G, (int)F, Xe,
                     (int)C, 0.0f, d->dgate + e * wsize, (int)C);
        if (d->dup)
            ts_sgemm(true, false, (int)F, (int)C, (int)M, 1.0f, U, (int)F, Xe,
                     (int)C, 0.0f, d->dup + e * wsize, (int)C);
        if (d->dx) { /* over Xe, read for the last time above */
            if (a->gated)
                mul(&a->gate, e, G, M, Xe, 0.0f, wf);
            mul(&a->up, e, U, M, Xe, a->gated ? 1.0f : 0.0f, wf);
        }
    }
    if (ok && d->dx)
        combine(rt, C, NULL, X, d->dx);
    cpu_tmp_free(X), cpu_tmp_free(Ge), cpu_tmp_free(G), cpu_tmp_free(U);
    cpu_tmp_free(AG), cpu_tmp_free(A), cpu_tmp_free(D), cpu_tmp_free(wf);
    return ok ? TS_OK
              : ts_set_error(ctx, TS_ERR_OOM,
                             "moe_experts_backward: out of memory");
}

/* in g, x, idx, w, [gate], up, down -> packed f32 gradients, the parts
 * attrs.i[2] asks for (TS_MOE_WANT_*): dx | dw | dgate | dup | ddown */
CPU_KERNEL(moe_experts_backward) {
    moe_args a;
    moe_routing rt = {0};
    float *tg = NULL, *tx = NULL, *tw = NULL;
    bool ok = args_init(&a, n, 1);
    const float *g = ok ? cpu_as_f32(n->in[0], &tg) : NULL;
    const float *x = ok ? cpu_as_f32(a.x, &tx) : NULL;
    const float *w = ok ? cpu_as_f32(a.w, &tw) : NULL;
    ts_status st = TS_OK;
    if (!g || !x || !w)
        st = ts_set_error(ctx, TS_ERR_OOM,
                          "moe_experts_backward: out of memory");
    if (st == TS_OK)
        st = routing_build(ctx, "moe_experts_backward", a.idx, a.E, &rt);
    if (st == TS_OK) {
        int64_t want = n->attrs.i[2], wsize = a.E * a.F * a.C;
        float *p = (float *)ts_tensor_ptr(n->out);
        memset(p, 0, sizeof(float) * (size_t)ts_tensor_numel(n->out));
        moe_grads d = {0};
        if (want & TS_MOE_WANT_X)
            d.dx = p, p += a.N * a.C;
        if (want & TS_MOE_WANT_W)
            d.dw = p, p += a.N * a.K;
        if (a.gated && (want & TS_MOE_WANT_GATE))
            d.dgate = p, p += wsize;
        if (want & TS_MOE_WANT_UP)
            d.dup = p, p += wsize;
        if (want & TS_MOE_WANT_DOWN)
            d.ddown = p;
        if (a.C > 0 && a.F > 0)
            st = moe_backward(ctx, &a, &rt, g, x, w, &d);
        routing_free(&rt);
    }
    cpu_tmp_free(tg), cpu_tmp_free(tx), cpu_tmp_free(tw);
    args_free(&a);
    return st;
}
