/* k_norm.c — the Vulkan kernels of the fused layers in backend/cpu/norm.c:
 * rmsnorm and layernorm over the last dim (forward with the saved
 * mean/rstd, and dx; autograd builds the weight/bias gradients from
 * ops) and the rotary embedding in the rotate-half layout. Shaders
 * nr_norm (forward), nr_norm_bwd (dx), nr_rope; the norms run one
 * workgroup per row, f32 arithmetic with double-float row sums reduced
 * by a fixed tree in shared memory (deterministic, close to the CPU's
 * double sums). */
#include "backend/vulkan/vk.h"

/* nr_norm.comp's Params (std430) */
typedef struct {
    vk_tdesc x, w, b;
    uint64_t y, mean, rstd;
    int32_t y_dtype, C, N, has_w, has_b;
    float eps;
} nr_norm_params;
_Static_assert(sizeof(nr_norm_params) == 3 * 80 + 3 * 8 + 6 * 4,
               "nr_norm_params must match nr_norm.comp");

/* nr_norm_bwd.comp's Params */
typedef struct {
    vk_tdesc g, x, w, mean, rstd;
    uint64_t dx;
    int32_t dx_dtype, C, N, has_w;
} nr_norm_bwd_params;
_Static_assert(sizeof(nr_norm_bwd_params) == 5 * 80 + 8 + 4 * 4,
               "nr_norm_bwd_params must match nr_norm_bwd.comp");

/* nr_rope.comp's Params */
typedef struct {
    vk_tdesc x, cs, sn, y;
    int32_t h, rows;
    float dir;
    int32_t pad;
} nr_rope_params;
_Static_assert(sizeof(nr_rope_params) == 4 * 80 + 4 * 4,
               "nr_rope_params must match nr_rope.comp");

/* largest power of two <= v (v >= 1) */
static uint32_t pow2_floor(uint32_t v) {
    uint32_t p = 1;
    while (p * 2 <= v)
        p *= 2;
    return p;
}

/* threads per row: enough to keep a few elements per thread, a power of
 * two (the tree reduction) within the device's limit */
static uint32_t norm_workgroup(const vk_dev *d, int64_t C) {
    uint32_t want = C <= 256 ? 64 : C <= 1024 ? 128 : C <= 4096 ? 256 : 512;
    uint32_t max = pow2_floor(vk_dev_limits(d)->max_workgroup_invocations);
    return want < max ? want : max;
}

/* the kernels write their outputs densely, as the CPU's do */
static ts_status need_contiguous(ts_ctx *ctx, const char *op, const char *what,
                                 const ts_tensor *t) {
    if (!ts_tensor_is_contiguous(t))
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "%s (vulkan): the %s tensor is not contiguous", op,
                            what);
    return TS_OK;
}

/* rows N and row length C of x (..., C) */
static void rows_of(const ts_tensor *x, int64_t *N, int64_t *C) {
    *C = x->shape[x->ndim - 1];
    *N = *C ? ts_tensor_numel(x) / *C : 0;
}

/* x, [w], [b] -> y, mean (layernorm), rstd; layer: 0 rmsnorm, 1 layernorm */
static ts_status norm_forward(ts_ctx *ctx, vk_dev *d, ts_node *n, int layer,
                              const char *op) {
    ts_tensor *x = n->in[0], *y = n->out;
    bool has_w = layer ? n->attrs.i[0] != 0 : n->n_in > 1;
    bool has_b = layer ? n->attrs.i[1] != 0 : false;
    ts_tensor *rstd = n->saved[layer ? 1 : 0], *mean = layer ? n->saved[0] : 0;
    int64_t N, C;
    rows_of(x, &N, &C);
    if (N == 0)
        return TS_OK;
    if (need_contiguous(ctx, op, "output", y) ||
        need_contiguous(ctx, op, "saved rstd", rstd) ||
        (mean && need_contiguous(ctx, op, "saved mean", mean)))
        return ctx->status;
    nr_norm_params p = {.y = vk_addr(y),
                        .mean = mean ? vk_addr(mean) : 0,
                        .rstd = vk_addr(rstd),
                        .y_dtype = (int32_t)y->dtype,
                        .C = (int32_t)C,
                        .N = (int32_t)N,
                        .has_w = has_w,
                        .has_b = has_b,
                        .eps = (float)n->attrs.f[0]};
    if (vk_desc(ctx, x, &p.x) || (has_w && vk_desc(ctx, n->in[1], &p.w)) ||
        (has_b && vk_desc(ctx, n->in[has_w ? 2 : 1], &p.b)))
        return ctx->status;
    uint32_t wg = norm_workgroup(d, C);
    return vk_launch(ctx, d,
                     &(vk_launch_desc){.shader = "nr_norm",
                                       .spec = {wg, (uint32_t)layer},
                                       .nspec = 2,
                                       .params = &p,
                                       .params_bytes = sizeof p,
                                       .groups = {vk_groups_for(d, N, 1)}});
}

/* g, x, [mean], rstd, [w] -> dx; layer: 0 rmsnorm, 1 layernorm */
static ts_status norm_backward(ts_ctx *ctx, vk_dev *d, ts_node *n, int layer,
                               const char *op) {
    ts_tensor *g = n->in[0], *x = n->in[1], *dx = n->out;
    int iw = layer ? 4 : 3; /* the weight follows the saved tensors */
    bool has_w = n->n_in > iw;
    int64_t N, C;
    rows_of(x, &N, &C);
    if (N == 0)
        return TS_OK;
    if (need_contiguous(ctx, op, "output", dx))
        return ctx->status;
    nr_norm_bwd_params p = {.dx = vk_addr(dx),
                            .dx_dtype = (int32_t)dx->dtype,
                            .C = (int32_t)C,
                            .N = (int32_t)N,
                            .has_w = has_w};
    if (vk_desc(ctx, g, &p.g) || vk_desc(ctx, x, &p.x) ||
        vk_desc(ctx, n->in[layer ? 3 : 2], &p.rstd) ||
        (layer && vk_desc(ctx, n->in[2], &p.mean)) ||
        (has_w && vk_desc(ctx, n->in[iw], &p.w)))
        return ctx->status;
    uint32_t wg = norm_workgroup(d, C);
    return vk_launch(ctx, d,
                     &(vk_launch_desc){.shader = "nr_norm_bwd",
                                       .spec = {wg, (uint32_t)layer},
                                       .nspec = 2,
                                       .params = &p,
                                       .params_bytes = sizeof p,
                                       .groups = {vk_groups_for(d, N, 1)}});
}

/* x (N, C), [w (C)] -> y (N, C), saved rstd (N) */
ts_status vk_k_rmsnorm(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    return norm_forward(ctx, d, n, 0, "rmsnorm");
}

/* g, x, rstd, [w] -> dx */
ts_status vk_k_rmsnorm_backward(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    return norm_backward(ctx, d, n, 0, "rmsnorm_backward");
}

/* x (N, C), [w], [b] (attrs.i[0], i[1] say which) -> y, saved mean, rstd */
ts_status vk_k_layernorm(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    return norm_forward(ctx, d, n, 1, "layernorm");
}

/* g, x, mean, rstd, [w] -> dx */
ts_status vk_k_layernorm_backward(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    return norm_backward(ctx, d, n, 1, "layernorm_backward");
}

/* x (..., D), cos/sin broadcast to x, direction attrs.f[0] (+1 forward,
 * -1 its transpose) -> y. Workgroups of 128 tile (pair index i < D/2,
 * row): as many i as the row has pairs (up to 128), the rest rows. */
ts_status vk_k_rope(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *x = n->in[0], *y = n->out;
    int64_t D = x->shape[x->ndim - 1], h = D / 2;
    int64_t rows = D ? ts_tensor_numel(x) / D : 0;
    if (rows == 0 || h == 0)
        return TS_OK;
    nr_rope_params p = {
        .h = (int32_t)h, .rows = (int32_t)rows, .dir = (float)n->attrs.f[0]};
    if (vk_desc(ctx, x, &p.x) || vk_desc(ctx, y, &p.y) ||
        vk_desc_bcast(ctx, n->in[1], x->ndim, x->shape, &p.cs) ||
        vk_desc_bcast(ctx, n->in[2], x->ndim, x->shape, &p.sn))
        return ctx->status;
    uint32_t lx = 1;
    while (lx < 128 && lx < (uint64_t)h)
        lx *= 2;
    uint32_t ly = 128 / lx;
    int64_t gy = (rows + ly - 1) / ly, gy_max = vk_dev_limits(d)->max_groups[1];
    return vk_launch(
        ctx, d,
        &(vk_launch_desc){.shader = "nr_rope",
                          .spec = {lx, ly},
                          .nspec = 2,
                          .params = &p,
                          .params_bytes = sizeof p,
                          .groups = {(uint32_t)((h + lx - 1) / lx),
                                     (uint32_t)(gy < gy_max ? gy : gy_max)}});
}
