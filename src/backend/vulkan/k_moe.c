/* k_moe.c — the Vulkan kernels of the sparse mixture-of-experts MLP
 * (ts_moe_experts) and its backward, computing what src/backend/cpu/moe.c
 * computes, in f32. Shaders: shaders/moe_*.comp. Owns the experts MLP
 * only; the router's ops (topk, gather) are in k_reduce.c.
 *
 * Shapes: x (N, C); idx, w (N, K); gate, up (E, F, C); down (E, C, F),
 * the weights f32 or bf16 by any strides. Slot s = n * K + j.
 *
 * As on the CPU, tokens are grouped by expert: moe_route lists each
 * expert's routed slots in slot order, starting at a multiple of TM rows
 * and padded to one ("padded rows", at most T_max * TM of them), so every
 * tile of TM rows has one expert and the matrix products (moe_gemm) read
 * each expert's weights once per tile. Nothing is added with atomics:
 * every output element is owned by one invocation that sums in a fixed
 * order (a token's slots in j order, a weight gradient's rows in slot
 * order), so results are deterministic.
 *
 * The CPU rejects an idx entry outside [-1, E) with TS_ERR_RANGE; that
 * check needs the values on the host (a wait on the device), so here such
 * a slot counts as routed nowhere, as the Vulkan gathers skip an index out
 * of range. */
#include "backend/vulkan/vk.h"

#include <string.h>

/* ---- parameter structs (std430 layouts of the shaders' Params) ---- */

typedef struct {
    vk_tdesc idx;
    uint64_t cnt, pstart, slot_of, tile_expert, pos;
    int32_t N, K, E, TM, T_max, phase;
} moe_route_params;
_Static_assert(sizeof(moe_route_params) == 144, "vs moe_route.comp");

typedef struct {
    uint64_t a[2], b[2], out[2], slot_of, tile_expert;
    int32_t a_gather[2], a_s0[2], a_s1[2];
    int32_t b_dt[2], b_se[2], b_sj[2], b_sk[2];
    int32_t J, Kd, K, T_max, out_ld, nprod, mode, act;
} moe_gemm_params;
_Static_assert(sizeof(moe_gemm_params) == 152, "vs moe_gemm.comp");

typedef struct {
    uint64_t src[2], out, slot_of, pstart;
    int32_t gather[2], s0[2], s1[2];
    int32_t J, Kd, K, E, jt, kt;
} moe_wgrad_params;
_Static_assert(sizeof(moe_wgrad_params) == 88, "vs moe_wgrad.comp");

typedef struct {
    uint64_t D, G, U, slot_of, w, dw;
    int32_t w_s0, w_s1, F, K, P, gated, act, has_dw;
} moe_bwd_rows_params;
_Static_assert(sizeof(moe_bwd_rows_params) == 80, "vs moe_bwd_rows.comp");

typedef struct {
    uint64_t Y, out, pos, w;
    int32_t w_s0, w_s1, has_w, N, C, K, ldY, pad;
} moe_combine_params;
_Static_assert(sizeof(moe_combine_params) == 64, "vs moe_combine.comp");

typedef struct {
    uint64_t addr;
    int32_t n, pad;
} moe_fill_params;
_Static_assert(sizeof(moe_fill_params) == 16, "vs moe_fill.comp");

/* moe_gemm's epilogues */
enum {
    EPI_RAW = 0,   /* out1 = acc1 */
    EPI_SUM = 1,   /* out1 = acc1 + acc2 */
    EPI_GATED = 2, /* out1 = act(acc1) * acc2 */
    EPI_ACT = 3,   /* out1 = act(acc1) */
    EPI_BOTH = 4   /* out1 = acc1, out2 = acc2 */
};

static ts_status launch(ts_ctx *ctx, vk_dev *d, const char *shader,
                        const void *params, size_t bytes, uint32_t gx,
                        uint32_t gy, uint32_t spec0) {
    vk_launch_desc l = {.shader = shader,
                        .params = params,
                        .params_bytes = bytes,
                        .groups = {gx, gy, 1}};
    if (spec0) {
        l.spec[0] = spec0;
        l.nspec = 1;
    }
    return vk_launch(ctx, d, &l);
}

static uint32_t clamp_groups(int64_t n) {
    return (uint32_t)(n < 1 ? 1 : n > 65535 ? 65535 : n);
}

/* ---- operands ---- */

/* a row source: rows gathered by token (gather) or rows of a padded
 * intermediate (row stride s0, s1 = 1) */
typedef struct {
    uint64_t addr;
    int32_t gather, s0, s1;
} row_src;

/* an expert weight (E, rows, cols) read as B[e, j, k]: j its rows (W x)
 * or its columns (W^T x) */
typedef struct {
    uint64_t addr;
    int32_t dt, se, sj, sk;
} w_src;

static ts_status token_rows(ts_ctx *ctx, const ts_tensor *t, row_src *r) {
    vk_tdesc td;
    if (vk_desc(ctx, t, &td))
        return ctx->status;
    *r = (row_src){td.addr, 1, td.stride[0], td.stride[1]};
    return TS_OK;
}

static row_src buf_rows(uint64_t addr, int64_t ld) {
    return (row_src){addr, 0, (int32_t)ld, 1};
}

static ts_status weight(ts_ctx *ctx, const ts_tensor *t, bool j_is_rows,
                        w_src *w) {
    vk_tdesc td;
    if (vk_desc(ctx, t, &td))
        return ctx->status;
    *w = (w_src){.addr = td.addr,
                 .dt = td.dtype,
                 .se = td.stride[0],
                 .sj = j_is_rows ? td.stride[1] : td.stride[2],
                 .sk = j_is_rows ? td.stride[2] : td.stride[1]};
    return TS_OK;
}

/* ---- routing ---- */

typedef struct {
    int64_t N, K, E, C, F;
    int32_t TM, T_max; /* padded rows: P = T_max * TM */
    int64_t P;
    bool gated;
    int act;
    uint64_t pstart, slot_of, tile_expert, pos;
} moe_plan;

/* the dims of node n (inputs from in[first]: x, idx, w, [gate], up, down),
 * the tile size, and the routing lists on the device */
static ts_status plan_route(ts_ctx *ctx, vk_dev *d, const ts_node *n, int first,
                            moe_plan *pl) {
    ts_tensor *const *in = n->in + first;
    memset(pl, 0, sizeof *pl);
    pl->gated = n->attrs.i[1] != 0;
    pl->act = (int)n->attrs.i[0];
    const ts_tensor *up = in[pl->gated ? 4 : 3];
    pl->N = in[0]->shape[0], pl->C = in[0]->shape[1];
    pl->K = in[1]->shape[1];
    pl->E = up->shape[0], pl->F = up->shape[1];
    int64_t NK = pl->N * pl->K;
    /* many rows per expert: taller tiles read the weights fewer times */
    pl->TM = NK >= 64 * pl->E ? 64 : 16;
    int64_t T = (NK + pl->TM - 1) / pl->TM + pl->E;
    pl->P = T * pl->TM;
    int64_t widest = pl->C > pl->F ? pl->C : pl->F;
    if (T > INT32_MAX || pl->P * widest >= INT32_MAX ||
        pl->E * pl->F * pl->C >= INT32_MAX)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "moe_experts on Vulkan: %lld routed slots of "
                            "(E, F, C) = (%lld, %lld, %lld) need 2^31 elements "
                            "or more in one buffer",
                            (long long)NK, (long long)pl->E, (long long)pl->F,
                            (long long)pl->C);
    pl->T_max = (int32_t)T;
    uint64_t cnt = vk_temp(ctx, d, sizeof(int32_t) * (size_t)pl->E);
    pl->pstart = vk_temp(ctx, d, sizeof(int32_t) * (size_t)(pl->E + 1));
    pl->slot_of = vk_temp(ctx, d, sizeof(int32_t) * (size_t)pl->P);
    pl->tile_expert = vk_temp(ctx, d, sizeof(int32_t) * (size_t)T);
    pl->pos = vk_temp(ctx, d, sizeof(int32_t) * (size_t)(NK ? NK : 1));
    if (!cnt || !pl->pstart || !pl->slot_of || !pl->tile_expert || !pl->pos)
        return ctx->status;
    moe_route_params p = {.cnt = cnt,
                          .pstart = pl->pstart,
                          .slot_of = pl->slot_of,
                          .tile_expert = pl->tile_expert,
                          .pos = pl->pos,
                          .N = (int32_t)pl->N,
                          .K = (int32_t)pl->K,
                          .E = (int32_t)pl->E,
                          .TM = pl->TM,
                          .T_max = pl->T_max};
    if (vk_desc(ctx, in[1], &p.idx) ||
        launch(ctx, d, "moe_route", &p, sizeof p, (uint32_t)pl->E + 1, 1, 0))
        return ctx->status;
    p.phase = 1;
    return launch(ctx, d, "moe_route", &p, sizeof p, (uint32_t)pl->E, 1, 0);
}

/* ---- launches ---- */

/* out1 (P, J) [, out2] = the epilogue of nprod products A_i B_i^T over Kd;
 * both A_i gathered or both not */
static ts_status gemm(ts_ctx *ctx, vk_dev *d, const moe_plan *pl, int mode,
                      int nprod, const row_src *a, const w_src *b,
                      uint64_t out1, uint64_t out2, int64_t J, int64_t Kd) {
    moe_gemm_params p = {.out = {out1, out2},
                         .slot_of = pl->slot_of,
                         .tile_expert = pl->tile_expert,
                         .J = (int32_t)J,
                         .Kd = (int32_t)Kd,
                         .K = (int32_t)pl->K,
                         .T_max = pl->T_max,
                         .out_ld = (int32_t)J,
                         .nprod = nprod,
                         .mode = mode,
                         .act = pl->act};
    for (int i = 0; i < nprod; i++) {
        p.a[i] = a[i].addr, p.a_gather[i] = a[i].gather;
        p.a_s0[i] = a[i].s0, p.a_s1[i] = a[i].s1;
        p.b[i] = b[i].addr, p.b_dt[i] = b[i].dt, p.b_se[i] = b[i].se;
        p.b_sj[i] = b[i].sj, p.b_sk[i] = b[i].sk;
    }
    return launch(ctx, d, "moe_gemm", &p, sizeof p, clamp_groups(pl->T_max),
                  (uint32_t)((J + 63) / 64), (uint32_t)pl->TM);
}

/* out (E, J, Kd) = per expert, the sum over its rows of P^T Q */
static ts_status wgrad(ts_ctx *ctx, vk_dev *d, const moe_plan *pl, row_src P,
                       row_src Q, uint64_t out, int64_t J, int64_t Kd) {
    moe_wgrad_params p = {.src = {P.addr, Q.addr},
                          .out = out,
                          .slot_of = pl->slot_of,
                          .pstart = pl->pstart,
                          .gather = {P.gather, Q.gather},
                          .s0 = {P.s0, Q.s0},
                          .s1 = {P.s1, Q.s1},
                          .J = (int32_t)J,
                          .Kd = (int32_t)Kd,
                          .K = (int32_t)pl->K,
                          .E = (int32_t)pl->E,
                          .jt = (int32_t)((J + 63) / 64),
                          .kt = (int32_t)((Kd + 63) / 64)};
    return launch(ctx, d, "moe_wgrad", &p, sizeof p,
                  vk_groups_for(d, pl->E * p.jt * p.kt, 1), 1, 0);
}

/* out (N, C) = per token, its slots' rows of Y (ld C) weighted by w (or 1
 * when w is NULL), in slot order */
static ts_status combine(ts_ctx *ctx, vk_dev *d, const moe_plan *pl, uint64_t Y,
                         const ts_tensor *w, uint64_t out) {
    moe_combine_params p = {.Y = Y,
                            .out = out,
                            .pos = pl->pos,
                            .has_w = w != NULL,
                            .N = (int32_t)pl->N,
                            .C = (int32_t)pl->C,
                            .K = (int32_t)pl->K,
                            .ldY = (int32_t)pl->C};
    if (w) {
        vk_tdesc wd;
        if (vk_desc(ctx, w, &wd))
            return ctx->status;
        p.w = wd.addr, p.w_s0 = wd.stride[0], p.w_s1 = wd.stride[1];
    } else {
        p.w = Y; /* never read */
    }
    return launch(ctx, d, "moe_combine", &p, sizeof p,
                  (uint32_t)((pl->C + 255) / 256), clamp_groups(pl->N), 0);
}

static ts_status fill_zero(ts_ctx *ctx, vk_dev *d, uint64_t addr, int64_t n) {
    if (n <= 0)
        return TS_OK;
    moe_fill_params p = {.addr = addr, .n = (int32_t)n};
    return launch(ctx, d, "moe_fill", &p, sizeof p, vk_groups_for(d, n, 256), 1,
                  0);
}

static uint64_t temp_f32(ts_ctx *ctx, vk_dev *d, int64_t n) {
    return vk_temp(ctx, d, sizeof(float) * (size_t)(n ? n : 1));
}

/* ---- forward ---- */

/* in x, idx, w, [gate], up, down -> out (N, C) f32 */
ts_status vk_k_moe_experts(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *const *in = n->in;
    bool gated = n->attrs.i[1] != 0;
    ts_tensor *up = in[gated ? 4 : 3], *down = in[gated ? 5 : 4];
    int64_t N = in[0]->shape[0], C = in[0]->shape[1], F = up->shape[1];
    if (N * C == 0)
        return TS_OK;
    if (F == 0) /* no hidden units: nothing to add */
        return fill_zero(ctx, d, vk_addr(n->out), N * C);
    moe_plan pl;
    if (plan_route(ctx, d, n, 0, &pl))
        return ctx->status;
    row_src xs[2] = {{0}};
    w_src b[2] = {{0}}, wd = {0};
    if (token_rows(ctx, in[0], &xs[0]) ||
        (gated && weight(ctx, in[3], true, &b[0])) ||
        weight(ctx, up, true, &b[gated ? 1 : 0]) ||
        weight(ctx, down, true, &wd))
        return ctx->status;
    xs[1] = xs[0];
    uint64_t H = temp_f32(ctx, d, pl.P * F), Y = temp_f32(ctx, d, pl.P * C);
    if (!H || !Y)
        return ctx->status;
    /* H = act(x gate^T) * (x up^T), or act(x up^T); Y = H down^T */
    if (gemm(ctx, d, &pl, gated ? EPI_GATED : EPI_ACT, gated ? 2 : 1, xs, b, H,
             H, F, C))
        return ctx->status;
    row_src hs = buf_rows(H, F);
    if (gemm(ctx, d, &pl, EPI_RAW, 1, &hs, &wd, Y, Y, C, F))
        return ctx->status;
    return combine(ctx, d, &pl, Y, in[2], vk_addr(n->out));
}

/* ---- backward ---- */

/* where each wanted part of the packed gradient goes (0: not wanted) */
typedef struct {
    uint64_t dx, dw, dgate, dup, ddown;
} moe_parts;

static moe_parts parts_of(const ts_node *n, const moe_plan *pl) {
    int64_t want = n->attrs.i[2], wsize = pl->E * pl->F * pl->C;
    uint64_t p = vk_addr(n->out);
    moe_parts o = {0};
    if (want & TS_MOE_WANT_X)
        o.dx = p, p += sizeof(float) * (uint64_t)(pl->N * pl->C);
    if (want & TS_MOE_WANT_W)
        o.dw = p, p += sizeof(float) * (uint64_t)(pl->N * pl->K);
    if (pl->gated && (want & TS_MOE_WANT_GATE))
        o.dgate = p, p += sizeof(float) * (uint64_t)wsize;
    if (want & TS_MOE_WANT_UP)
        o.dup = p, p += sizeof(float) * (uint64_t)wsize;
    if (want & TS_MOE_WANT_DOWN)
        o.ddown = p;
    return o;
}

/* the weight gradients and dx from G, U (now dG, dU) and D (now w A) */
static ts_status backward_tail(ts_ctx *ctx, vk_dev *d, const moe_plan *pl,
                               const moe_parts *o, ts_tensor *const *in,
                               row_src gs, row_src xs, uint64_t G, uint64_t U,
                               uint64_t D) {
    int64_t C = pl->C, F = pl->F;
    bool gated = pl->gated;
    if (o->ddown && wgrad(ctx, d, pl, gs, buf_rows(D, F), o->ddown, C, F))
        return ctx->status;
    if (o->dgate && wgrad(ctx, d, pl, buf_rows(G, F), xs, o->dgate, F, C))
        return ctx->status;
    if (o->dup && wgrad(ctx, d, pl, buf_rows(U, F), xs, o->dup, F, C))
        return ctx->status;
    if (!o->dx)
        return TS_OK;
    /* dX rows = dG gate_e + dU up_e, then summed per token */
    row_src hs[2] = {buf_rows(gated ? G : U, F), buf_rows(U, F)};
    w_src b[2] = {{0}};
    if ((gated && weight(ctx, in[4], false, &b[0])) ||
        weight(ctx, in[gated ? 5 : 4], false, &b[gated ? 1 : 0]))
        return ctx->status;
    uint64_t X = temp_f32(ctx, d, pl->P * C);
    if (!X || gemm(ctx, d, pl, gated ? EPI_SUM : EPI_RAW, gated ? 2 : 1, hs, b,
                   X, X, C, F))
        return ctx->status;
    return combine(ctx, d, pl, X, NULL, o->dx);
}

/* in g, x, idx, w, [gate], up, down -> packed f32 gradients, the parts
 * attrs.i[2] asks for (TS_MOE_WANT_*): dx | dw | dgate | dup | ddown */
ts_status vk_k_moe_experts_backward(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *const *in = n->in;
    bool gated = n->attrs.i[1] != 0;
    const ts_tensor *up = in[gated ? 5 : 4];
    int64_t C = in[1]->shape[1], F = up->shape[1];
    if (C == 0 || F == 0) /* every gradient is 0 */
        return fill_zero(ctx, d, vk_addr(n->out), ts_tensor_numel(n->out));
    moe_plan pl;
    if (plan_route(ctx, d, n, 1, &pl))
        return ctx->status;
    moe_parts o = parts_of(n, &pl);
    /* dw of the slots routed nowhere */
    if (o.dw && fill_zero(ctx, d, o.dw, pl.N * pl.K))
        return ctx->status;
    row_src xs[2] = {{0}}, gs = {0};
    w_src b[2] = {{0}}, wd = {0};
    if (token_rows(ctx, in[0], &gs) || token_rows(ctx, in[1], &xs[0]) ||
        (gated && weight(ctx, in[4], true, &b[0])) ||
        weight(ctx, up, true, &b[gated ? 1 : 0]) ||
        weight(ctx, in[gated ? 6 : 5], false, &wd))
        return ctx->status;
    xs[1] = xs[0];
    uint64_t G = gated ? temp_f32(ctx, d, pl.P * F) : 0;
    uint64_t U = temp_f32(ctx, d, pl.P * F), D = temp_f32(ctx, d, pl.P * F);
    if ((gated && !G) || !U || !D)
        return ctx->status;
    /* recompute G = x gate^T, U = x up^T; D = g down (reads down^T) */
    if (gemm(ctx, d, &pl, gated ? EPI_BOTH : EPI_RAW, gated ? 2 : 1, xs, b,
             gated ? G : U, U, F, C) ||
        gemm(ctx, d, &pl, EPI_RAW, 1, &gs, &wd, D, D, F, C))
        return ctx->status;
    moe_bwd_rows_params r = {.D = D,
                             .G = gated ? G : U,
                             .U = U,
                             .slot_of = pl.slot_of,
                             .dw = o.dw ? o.dw : D,
                             .F = (int32_t)F,
                             .K = (int32_t)pl.K,
                             .P = (int32_t)pl.P,
                             .gated = gated,
                             .act = pl.act,
                             .has_dw = o.dw != 0};
    vk_tdesc wdesc;
    if (vk_desc(ctx, in[3], &wdesc))
        return ctx->status;
    r.w = wdesc.addr, r.w_s0 = wdesc.stride[0], r.w_s1 = wdesc.stride[1];
    if (launch(ctx, d, "moe_bwd_rows", &r, sizeof r, vk_groups_for(d, pl.P, 1),
               1, 0))
        return ctx->status;
    return backward_tail(ctx, d, &pl, &o, in, gs, xs[0], G, U, D);
}
