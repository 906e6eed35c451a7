/* k_attention.c — attention on Vulkan: the fused forward (at_fwd), its
 * backward (at_bwd_di, at_bwd_dq, at_bwd_dkdv) and paged attention for
 * serving (at_paged_store, at_paged, at_paged_combine). The same math as
 * the CPU's attention.c, in the manner of FlashAttention-2: K/V tiles
 * through shared memory, an online softmax, no T x S matrix in device
 * memory; the backward recomputes the probabilities from the saved
 * log-sum-exp, and its dk/dv are owned by one workgroup per key block (no
 * float atomics: results do not depend on scheduling). This file picks the
 * tile sizes that fit the device's shared memory and fills the shaders'
 * parameter structs (their layouts are in the shaders). */
#include "backend/vulkan/vk.h"

#include <stdint.h>
#include <string.h>

#define AT_WG 128 /* invocations per workgroup in every at_ shader */

/* a tile: rows (queries, or keys in at_bwd_dkdv) and cols (the other) */
typedef struct {
    int rows, cols;
} at_tile;

typedef size_t (*at_shared_fn)(int D, at_tile t);

/* shared bytes of each shader for head dim D (rows padded to D + 1) */
static size_t fwd_shared(int D, at_tile t) { /* sQ, sKV, sS, sP */
    return 4 * ((size_t)(t.rows + t.cols) * (D + 1) + 2 * t.rows * t.cols);
}
static size_t dq_shared(int D, at_tile t) { /* sQ, sO, sK, sV, sDS, sL, sDi */
    return 4 * ((size_t)2 * (t.rows + t.cols) * (D + 1) + t.rows * t.cols +
                2 * t.rows);
}
static size_t dkdv_shared(int D, at_tile t) { /* rows = keys, cols = queries */
    return 4 * ((size_t)2 * (t.rows + t.cols) * (D + 1) + 2 * t.rows * t.cols +
                2 * t.cols);
}

/* the first of cands (largest first) whose shared memory fits the device,
 * whose rows are at most max_rows, and whose per-thread accumulators
 * (D / (AT_WG / rows) each, acc_arrays of them) stay within 64 floats */
static bool pick_tile(const vk_dev *d, int D, const at_tile *cands, int n,
                      at_shared_fn shared, int max_rows, int acc_arrays,
                      at_tile *out) {
    const vk_limits *lim = vk_dev_limits(d);
    for (int i = 0; i < n; i++) {
        at_tile t = cands[i];
        int per_row = AT_WG / t.rows;
        int acc = acc_arrays * ((D + per_row - 1) / per_row);
        if (t.rows > max_rows) /* rows past T (or S) would idle */
            continue;
        if (shared(D, t) <= lim->max_shared_bytes && acc <= 64) {
            *out = t;
            return true;
        }
    }
    return false;
}

static ts_status no_tile(ts_ctx *ctx, const char *op, int D) {
    return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                        "%s on Vulkan: head dim %d needs more shared memory "
                        "than the device has",
                        op, D);
}

/* the smallest power of two >= n, at least lo */
static int pow2_at_least(int64_t n, int lo) {
    int p = lo;
    while (p < n && p < (1 << 30))
        p *= 2;
    return p;
}

/* window >= S limits nothing: 0, so positions stay within int32 */
static int32_t clamp_window(int64_t window, int64_t S) {
    return window <= 0 || window >= S ? 0 : (int32_t)window;
}

static bool groups_fit(const vk_dev *d, int64_t x, int64_t y, int64_t z) {
    const vk_limits *lim = vk_dev_limits(d);
    return x <= lim->max_groups[0] && y <= lim->max_groups[1] &&
           z <= lim->max_groups[2];
}

static ts_status too_many_groups(ts_ctx *ctx, const char *op) {
    return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                        "%s on Vulkan: more workgroups than the device "
                        "dispatches (shape too large)",
                        op);
}

/* ---- forward ---- */

/* at_fwd.comp's Params */
typedef struct {
    vk_tdesc q, k, v, o, mask;
    uint64_t lse;
    int32_t H, KV, T, S;
    int32_t causal, window, has_mask, pad_;
    float scale, softcap;
} at_fwd_params;
_Static_assert(sizeof(at_fwd_params) == 5 * 80 + 8 + 8 * 4 + 2 * 4,
               "at_fwd_params must match at_fwd.comp");

/* q (B, H, T, D), k, v (B, KV, S, D), [mask] -> out (B, H, T, D), saved
 * lse (B, H, T) f32; attrs i: causal, has mask, window; f: scale, softcap */
ts_status vk_k_attention(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *q = n->in[0], *k = n->in[1];
    int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3];
    int64_t KV = k->shape[1], S = k->shape[2];
    if (B * H * T == 0)
        return TS_OK;
    if (D < 1)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "attention on Vulkan: head dim 0");
    at_fwd_params p;
    memset(&p, 0, sizeof p);
    if (vk_desc(ctx, q, &p.q) || vk_desc(ctx, k, &p.k) ||
        vk_desc(ctx, n->in[2], &p.v) || vk_desc(ctx, n->out, &p.o))
        return ctx->status;
    bool has_mask = n->attrs.i[1] != 0;
    int64_t full[4] = {B, H, T, S};
    if (has_mask && vk_desc_bcast(ctx, n->in[3], 4, full, &p.mask))
        return ctx->status;
    if (!has_mask)
        p.mask = p.q; /* never read */
    p.lse = vk_addr(n->saved[0]);
    p.H = (int32_t)H, p.KV = (int32_t)KV, p.T = (int32_t)T, p.S = (int32_t)S;
    p.causal = n->attrs.i[0] != 0, p.has_mask = has_mask;
    p.window = clamp_window(n->attrs.i[2], S);
    p.scale = (float)n->attrs.f[0], p.softcap = (float)n->attrs.f[1];

    /* wide key tiles for few queries (decoding) */
    static const at_tile cands[] = {{32, 32}, {16, 32}, {16, 16}, {8, 32},
                                    {8, 16},  {8, 8},   {4, 64},  {4, 32},
                                    {4, 16},  {4, 8},   {4, 4}};
    at_tile t;
    if (!pick_tile(d, (int)D, cands, (int)(sizeof cands / sizeof *cands),
                   fwd_shared, pow2_at_least(T, 4), 1, &t))
        return no_tile(ctx, "attention", (int)D);
    int64_t nqb = (T + t.rows - 1) / t.rows;
    if (!groups_fit(d, nqb, H, B))
        return too_many_groups(ctx, "attention");
    return vk_launch(
        ctx, d,
        &(vk_launch_desc){
            .shader = "at_fwd",
            .spec = {(uint32_t)D, (uint32_t)t.rows, (uint32_t)t.cols},
            .nspec = 3,
            .params = &p,
            .params_bytes = sizeof p,
            .groups = {(uint32_t)nqb, (uint32_t)H, (uint32_t)B},
        });
}

/* ---- backward ---- */

/* at_bwd_di.comp's Params */
typedef struct {
    vk_tdesc g, o;
    uint64_t di;
    int32_t H, T, D, nrows;
} at_di_params;
_Static_assert(sizeof(at_di_params) == 2 * 80 + 8 + 4 * 4,
               "at_di_params must match at_bwd_di.comp");

/* at_bwd_dq.comp's and at_bwd_dkdv.comp's Params */
typedef struct {
    vk_tdesc g, q, k, v, lse, mask;
    uint64_t dst, di;
    int32_t H, KV, T, S;
    int32_t causal, window, has_mask, nq;
    int32_t nk, pad_;
    float scale, softcap;
} at_bwd_params;
_Static_assert(sizeof(at_bwd_params) == 6 * 80 + 16 + 10 * 4 + 2 * 4,
               "at_bwd_params must match at_bwd_dq.comp / at_bwd_dkdv.comp");

/* di = rowsum(dout * out) into a temporary (B, H, T) f32 */
static ts_status launch_di(ts_ctx *ctx, vk_dev *d, ts_node *n, uint64_t di) {
    ts_tensor *q = n->in[1];
    at_di_params p;
    memset(&p, 0, sizeof p);
    if (vk_desc(ctx, n->in[0], &p.g) || vk_desc(ctx, n->in[4], &p.o))
        return ctx->status;
    int64_t rows = q->shape[0] * q->shape[1] * q->shape[2];
    p.di = di;
    p.H = (int32_t)q->shape[1], p.T = (int32_t)q->shape[2];
    p.D = (int32_t)q->shape[3], p.nrows = (int32_t)rows;
    return vk_launch(ctx, d,
                     &(vk_launch_desc){
                         .shader = "at_bwd_di",
                         .params = &p,
                         .params_bytes = sizeof p,
                         .groups = {vk_groups_for(d, rows, AT_WG / 8)},
                     });
}

/* inputs g, q, k, v, out, lse, [mask] -> packed [dq | dk | dv] (q's
 * dtype); attrs as the forward's */
ts_status vk_k_attention_backward(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *q = n->in[1], *k = n->in[2];
    int64_t B = q->shape[0], H = q->shape[1], T = q->shape[2], D = q->shape[3];
    int64_t KV = k->shape[1], S = k->shape[2];
    if (ts_tensor_numel(n->out) == 0)
        return TS_OK;
    at_bwd_params p;
    memset(&p, 0, sizeof p);
    vk_tdesc out;
    if (vk_desc(ctx, n->in[0], &p.g) || vk_desc(ctx, q, &p.q) ||
        vk_desc(ctx, k, &p.k) || vk_desc(ctx, n->in[3], &p.v) ||
        vk_desc(ctx, n->in[5], &p.lse) || vk_desc(ctx, n->out, &out))
        return ctx->status;
    bool has_mask = n->attrs.i[1] != 0;
    int64_t full[4] = {B, H, T, S};
    if (has_mask && vk_desc_bcast(ctx, n->in[6], 4, full, &p.mask))
        return ctx->status;
    if (!has_mask)
        p.mask = p.q; /* never read */
    p.dst = out.addr;
    p.H = (int32_t)H, p.KV = (int32_t)KV, p.T = (int32_t)T, p.S = (int32_t)S;
    p.causal = n->attrs.i[0] != 0, p.has_mask = has_mask;
    p.window = clamp_window(n->attrs.i[2], S);
    p.nq = (int32_t)(B * H * T * D), p.nk = (int32_t)(B * KV * S * D);
    p.scale = (float)n->attrs.f[0], p.softcap = (float)n->attrs.f[1];

    static const at_tile dq_cands[] = {{16, 32}, {16, 16}, {16, 8},
                                       {8, 16},  {8, 8},   {4, 32},
                                       {4, 16},  {4, 8},   {4, 4}};
    static const at_tile kv_cands[] = {{32, 16}, {16, 16}, {16, 8},
                                       {8, 8},   {8, 4},   {4, 4}};
    at_tile tq, tk;
    if (!pick_tile(d, (int)D, dq_cands,
                   (int)(sizeof dq_cands / sizeof *dq_cands), dq_shared,
                   pow2_at_least(T, 4), 1, &tq) ||
        !pick_tile(d, (int)D, kv_cands,
                   (int)(sizeof kv_cands / sizeof *kv_cands), dkdv_shared,
                   pow2_at_least(S, 4), 2, &tk))
        return no_tile(ctx, "attention_backward", (int)D);
    int64_t nqb = (T + tq.rows - 1) / tq.rows,
            nkb = (S + tk.rows - 1) / tk.rows;
    if (!groups_fit(d, nqb, H, B) || !groups_fit(d, nkb, KV, B))
        return too_many_groups(ctx, "attention_backward");

    ts_status st = TS_OK;
    if (B * H * T > 0) {
        p.di = vk_temp(ctx, d, sizeof(float) * (size_t)(B * H * T));
        if (!p.di)
            return ctx->status;
        st = launch_di(ctx, d, n, p.di);
        if (st == TS_OK)
            st = vk_launch(
                ctx, d,
                &(vk_launch_desc){
                    .shader = "at_bwd_dq",
                    .spec = {(uint32_t)D, (uint32_t)tq.rows, (uint32_t)tq.cols},
                    .nspec = 3,
                    .params = &p,
                    .params_bytes = sizeof p,
                    .groups = {(uint32_t)nqb, (uint32_t)H, (uint32_t)B},
                });
    }
    if (st == TS_OK && B * KV * S > 0) /* dk, dv (zeros when T is 0) */
        st = vk_launch(
            ctx, d,
            &(vk_launch_desc){
                .shader = "at_bwd_dkdv",
                .spec = {(uint32_t)D, (uint32_t)tk.cols, (uint32_t)tk.rows},
                .nspec = 3,
                .params = &p,
                .params_bytes = sizeof p,
                .groups = {(uint32_t)nkb, (uint32_t)KV, (uint32_t)B},
            });
    return st;
}

/* ---- paged attention ---- */

/* the Params of at_paged_store.comp, at_paged.comp, at_paged_combine.comp */
typedef struct {
    vk_tdesc q, k, v, kpool, vpool;
    uint64_t meta, dst, part;
    int32_t H, KV, N, D;
    int32_t nsplit, window, nhb, pad_;
    float scale, softcap;
} at_paged_params;
_Static_assert(sizeof(at_paged_params) == 5 * 80 + 24 + 8 * 4 + 2 * 4,
               "at_paged_params must match the at_paged shaders");

/* key splits per (token, head block): enough workgroups to fill a large
 * GPU when few tokens decode; 1 (no partials) once the tokens do it */
static int paged_splits(int64_t rows) {
    int64_t s = (256 + rows - 1) / rows;
    return s < 1 ? 1 : s > 16 ? 16 : (int)s;
}

/* q (1, H, N, D), new k, v (1, KV, N, D), pools (blocks, KV, block size,
 * D) f32, meta i32 (see ts_infer_paged_attention) -> out (1, H, N, D) f32;
 * the new keys/values are written into the pools first. attrs i: window;
 * f: scale, softcap. */
ts_status vk_k_paged_attention(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *q = n->in[0], *k = n->in[1];
    int64_t H = q->shape[1], N = q->shape[2], D = q->shape[3];
    int64_t KV = k->shape[1], G = H / KV;
    if (n->in[3]->dtype != TS_F32 || n->in[4]->dtype != TS_F32)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "paged_attention on Vulkan: a %s KV pool (the "
                            "shaders read f32 pools)",
                            ts_dtype_name(n->in[3]->dtype));
    if (N == 0 || H == 0)
        return TS_OK;
    if (D < 1)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "paged_attention on Vulkan: head dim 0");
    at_paged_params p;
    memset(&p, 0, sizeof p);
    vk_tdesc out;
    if (vk_desc(ctx, q, &p.q) || vk_desc(ctx, k, &p.k) ||
        vk_desc(ctx, n->in[2], &p.v) || vk_desc(ctx, n->in[3], &p.kpool) ||
        vk_desc(ctx, n->in[4], &p.vpool) || vk_desc(ctx, n->out, &out))
        return ctx->status;
    p.meta = vk_addr(n->in[5]);
    p.dst = out.addr;
    p.H = (int32_t)H, p.KV = (int32_t)KV, p.N = (int32_t)N, p.D = (int32_t)D;
    /* positions are int32 (the meta's), so a window past them is none */
    p.window = clamp_window(n->attrs.i[0], INT32_MAX);
    p.scale = (float)n->attrs.f[0], p.softcap = (float)n->attrs.f[1];

    /* heads per workgroup: the query heads of one kv head, up to 16 */
    int bq = pow2_at_least(G < 16 ? G : 16, 1);
    static const at_tile cands[][4] = {
        {{1, 64}, {1, 32}, {1, 16}, {1, 8}},
        {{2, 64}, {2, 32}, {2, 16}, {2, 8}},
        {{4, 64}, {4, 32}, {4, 16}, {4, 8}},
        {{8, 64}, {8, 32}, {8, 16}, {8, 8}},
        {{16, 32}, {16, 16}, {16, 8}, {16, 4}},
    };
    int ci = bq == 1 ? 0 : bq == 2 ? 1 : bq == 4 ? 2 : bq == 8 ? 3 : 4;
    at_tile t;
    if (!pick_tile(d, (int)D, cands[ci], 4, fwd_shared, bq, 1, &t))
        return no_tile(ctx, "paged_attention", (int)D);
    int64_t nhb = (G + bq - 1) / bq;
    p.nhb = (int32_t)nhb;
    p.nsplit = paged_splits(N * KV * nhb);
    if (!groups_fit(d, p.nsplit, KV * nhb, N))
        return too_many_groups(ctx, "paged_attention");
    if (p.nsplit > 1) {
        p.part = vk_temp(ctx, d,
                         sizeof(float) * (size_t)(N * H * p.nsplit * (D + 2)));
        if (!p.part)
            return ctx->status;
    }

    ts_status st =
        vk_launch(ctx, d,
                  &(vk_launch_desc){
                      .shader = "at_paged_store",
                      .params = &p,
                      .params_bytes = sizeof p,
                      .groups = {vk_groups_for(d, KV * N * D, AT_WG)},
                  });
    if (st == TS_OK)
        st = vk_launch(
            ctx, d,
            &(vk_launch_desc){
                .shader = "at_paged",
                .spec = {(uint32_t)D, (uint32_t)t.rows, (uint32_t)t.cols},
                .nspec = 3,
                .params = &p,
                .params_bytes = sizeof p,
                .groups = {(uint32_t)p.nsplit, (uint32_t)(KV * nhb),
                           (uint32_t)N},
            });
    if (st == TS_OK && p.nsplit > 1)
        st = vk_launch(ctx, d,
                       &(vk_launch_desc){
                           .shader = "at_paged_combine",
                           .params = &p,
                           .params_bytes = sizeof p,
                           .groups = {vk_groups_for(d, N * H * D, AT_WG)},
                       });
    return st;
}
