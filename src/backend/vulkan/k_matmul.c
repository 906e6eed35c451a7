/* k_matmul.c — TS_OP_MATMUL on a Vulkan device: Y (batch..., M, N) =
 * A (..., M, K) @ B (..., K, N) with the batch dims broadcast (the shape
 * rule in ops/shape_rules.c; 1-D operands are unsqueezed by ts_matmul
 * before they get here). Same semantics as cpu_matmul: A and B f32, bf16 or
 * f16 (the same dtype, or f32 activations times a bf16/f16 weight), f32
 * accumulation, Y in A's dtype. Operands are read through their strides, so
 * a transposed weight view (x @ W^T) costs no copy.
 *
 * Two shaders: mm_gemv for M <= 8 (decoding: every weight element read
 * once for all rows) and mm_tiled, a shared-memory tiled GEMM, for the
 * rest. A VK_KHR_cooperative_matrix path is not written yet (the glslang
 * this tree builds with does not know GL_KHR_cooperative_matrix, and the
 * CI's lavapipe offers no cooperative matrices to test one on). */
#include "backend/vulkan/vk.h"

#include <stdlib.h>

/* The parameters both shaders read (their Params block, std430). The
 * dtypes are also passed as specialization constants (the shaders' loads
 * are then straight-line code); the copies here are for reading. */
typedef struct {
    uint64_t a, b, y;
    int32_t a_dt, b_dt, y_dt;
    int32_t M, N, K;
    int32_t asr, asc, bsr, bsc;
    int32_t nb, batch;
    int32_t a_kfast, b_nfast;
    int32_t bshape[TS_MAX_DIMS];
    int32_t abst[TS_MAX_DIMS];
    int32_t bbst[TS_MAX_DIMS];
} mm_params;
_Static_assert(sizeof(mm_params) == 176, "mm_params must match Params");

#define MM_GEMV_ROWS 8 /* M up to this goes to mm_gemv */

static bool mm_float(ts_dtype dt) {
    return dt == TS_F32 || dt == TS_BF16 || dt == TS_F16;
}

/* The largest element offset t's view reaches, in elements. */
static int64_t mm_span(const ts_tensor *t) {
    int64_t s = 0;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1)
            s += (t->shape[d] - 1) * llabs(t->strides[d]);
    return s;
}

/* Fills p from the node; the shaders index with 32-bit ints, so a view
 * reaching 2^31 elements or more is refused. */
static ts_status mm_fill(ts_ctx *ctx, const ts_node *n, mm_params *p) {
    const ts_tensor *a = n->in[0], *b = n->in[1], *y = n->out;
    if (!mm_float(a->dtype) || !mm_float(b->dtype) || !mm_float(y->dtype))
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "matmul (vulkan): operands %s @ %s (want f32, "
                            "bf16 or f16)",
                            ts_dtype_name(a->dtype), ts_dtype_name(b->dtype));
    if (a->ndim < 2 || b->ndim < 2 || y->ndim < 2)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "matmul (vulkan): operands need >= 2 dims");
    const int64_t lim = INT32_MAX;
    if (mm_span(a) >= lim || mm_span(b) >= lim || ts_tensor_numel(y) >= lim)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "matmul (vulkan): an operand or the result spans "
                            "2^31 elements or more");
    int nb = y->ndim - 2;
    *p = (mm_params){
        .a = vk_addr(a),
        .b = vk_addr(b),
        .y = vk_addr(y),
        .a_dt = (int32_t)a->dtype,
        .b_dt = (int32_t)b->dtype,
        .y_dt = (int32_t)y->dtype,
        .M = (int32_t)y->shape[nb],
        .N = (int32_t)y->shape[nb + 1],
        .K = (int32_t)a->shape[a->ndim - 1],
        .asr = (int32_t)a->strides[a->ndim - 2],
        .asc = (int32_t)a->strides[a->ndim - 1],
        .bsr = (int32_t)b->strides[b->ndim - 2],
        .bsc = (int32_t)b->strides[b->ndim - 1],
        .nb = nb,
        .batch = 1,
    };
    /* batch strides of a and b as broadcast to y's batch dims */
    for (int d = 0; d < nb; d++) {
        int ia = a->ndim - 2 - nb + d, ib = b->ndim - 2 - nb + d;
        p->bshape[d] = (int32_t)y->shape[d];
        p->abst[d] = ia >= 0 && a->shape[ia] != 1 ? (int32_t)a->strides[ia] : 0;
        p->bbst[d] = ib >= 0 && b->shape[ib] != 1 ? (int32_t)b->strides[ib] : 0;
        p->batch *= (int32_t)y->shape[d];
    }
    /* load along the index whose elements are adjacent in memory */
    p->a_kfast = p->asc == 1 || (p->asr != 1 && llabs(p->asc) < llabs(p->asr));
    p->b_nfast = p->bsc == 1 || (p->bsr != 1 && llabs(p->bsc) < llabs(p->bsr));
    return TS_OK;
}

static uint32_t mm_clamp(int64_t n, uint32_t max) {
    return n < 1 ? 1 : n > (int64_t)max ? max : (uint32_t)n;
}

static ts_status mm_gemv(ts_ctx *ctx, vk_dev *d, const mm_params *p) {
    const vk_limits *lim = vk_dev_limits(d);
    uint32_t nfast = p->b_nfast ? 1 : 0;
    uint32_t cols = nfast ? 64 : 8; /* columns per workgroup (CN) */
    vk_launch_desc l = {
        .shader = "mm_gemv",
        .spec = {nfast, (uint32_t)p->M, (uint32_t)p->a_dt, (uint32_t)p->b_dt,
                 (uint32_t)p->y_dt},
        .nspec = 5,
        .params = p,
        .params_bytes = sizeof *p,
        .groups = {vk_groups_for(d, p->N, cols), 1,
                   mm_clamp(p->batch, lim->max_groups[2])},
    };
    return vk_launch(ctx, d, &l);
}

/* mm_tiled's shape: a TILE x TILE tile of Y per workgroup, TILE_K deep,
 * REG x REG of it per invocation ((TILE / REG)^2 invocations) */
typedef struct {
    uint32_t tile, tile_k, reg;
} mm_tiling;

static ts_status mm_tiled(ts_ctx *ctx, vk_dev *d, const mm_params *p) {
    const vk_limits *lim = vk_dev_limits(d);
    /* the biggest tile that still gives the device enough workgroups:
     * 128 x 128 (256 invocations, 8 x 8 each), 64 x 64 (64, 8 x 8), or
     * 32 x 32 (64, 4 x 4). 8 x 8 blocks: 16 shared loads per 64 FMAs (on
     * lavapipe 512^3 runs 3x faster than with 4 x 4). */
    int64_t b = p->batch;
    int64_t t128 = (int64_t)((p->M + 127) / 128) * ((p->N + 127) / 128) * b;
    int64_t t64 = (int64_t)((p->M + 63) / 64) * ((p->N + 63) / 64) * b;
    mm_tiling tl = {32, 16, 4};
    if (t128 >= 128 && lim->max_workgroup_invocations >= 256 &&
        lim->max_shared_bytes >= 2 * 16 * 129 * sizeof(float))
        tl = (mm_tiling){128, 16, 8};
    else if (t64 >= 32)
        tl = (mm_tiling){64, 16, 8};
    uint32_t threads = (tl.tile / tl.reg) * (tl.tile / tl.reg);
    vk_launch_desc l = {
        .shader = "mm_tiled",
        .spec = {tl.tile, tl.tile, tl.tile_k, threads, tl.reg,
                 (uint32_t)p->a_dt, (uint32_t)p->b_dt, (uint32_t)p->y_dt},
        .nspec = 8,
        .params = p,
        .params_bytes = sizeof *p,
        .groups = {vk_groups_for(d, p->N, tl.tile),
                   mm_clamp((p->M + tl.tile - 1) / tl.tile, lim->max_groups[1]),
                   mm_clamp(p->batch, lim->max_groups[2])},
    };
    return vk_launch(ctx, d, &l);
}

ts_status vk_k_matmul(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    mm_params p;
    ts_status st = mm_fill(ctx, n, &p);
    if (st != TS_OK)
        return st;
    if (p.M == 0 || p.N == 0 || p.batch == 0)
        return TS_OK;
    /* K == 0 needs no case of its own: both shaders then store zeros */
    if (p.M <= MM_GEMV_ROWS &&
        vk_dev_limits(d)->max_workgroup_invocations >= 256)
        return mm_gemv(ctx, d, &p);
    return mm_tiled(ctx, d, &p);
}
