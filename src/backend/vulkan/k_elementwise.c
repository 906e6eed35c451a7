/* k_elementwise.c — the Vulkan backend's elementwise kernels: binary ops
 * with broadcasting, unary ops and their backward, where, masked_fill,
 * copy/cast, copy_into, concat, slice_scatter, and the compiler's fused
 * elementwise groups (vk_fusable / vk_run_fused). Three shaders serve them
 * all: ew_fused (float math; a plain op is a group of one member),
 * ew_copy (strided copies with conversion) and ew_select (where-style
 * picks of raw elements). The semantics are the CPU's
 * (src/backend/cpu/elementwise.c): inputs of any strides, outputs as the
 * node gives them. Operands' dims are coalesced on the host, so a
 * contiguous op costs one division per element. */
#include "backend/vulkan/vk.h"

#include <stddef.h>
#include <string.h>

/* k_matmul.c may not be linked in yet: a group with a matmul head then
 * reports that the kernel is missing */
#pragma weak vk_k_matmul

#define EW_GROUP 256 /* local_size_x of the ew_* shaders */

/* ew_fused.comp's op codes */
enum {
    EW_ADD,
    EW_SUB,
    EW_MUL,
    EW_DIV,
    EW_EQ,
    EW_ADD_SCALAR,
    EW_MUL_SCALAR,
    EW_NEG,
    EW_EXP,
    EW_LOG,
    EW_SQRT,
    EW_RSQRT,
    EW_ABS,
    EW_POW,
    EW_TANH,
    EW_SIGMOID,
    EW_RELU,
    EW_SILU,
    EW_GELU_ERF,
    EW_GELU_TANH,
    EW_BW_EXP,
    EW_BW_LOG,
    EW_BW_SQRT,
    EW_BW_RSQRT,
    EW_BW_ABS,
    EW_BW_POW,
    EW_BW_TANH,
    EW_BW_SIGMOID,
    EW_BW_RELU,
    EW_BW_SILU,
    EW_BW_GELU_ERF,
    EW_BW_GELU_TANH,
    EW_BW_NAN
};

/* ew_fused.comp's Params; ext[] last so that only n_ext are copied */
typedef struct {
    vk_tdesc dst;
    int32_t n_ext, n_members, numel, pad;
    int32_t op[TS_FUSE_MAX];
    int32_t arg[TS_FUSE_MAX * 3];
    float scal[TS_FUSE_MAX];
    vk_tdesc ext[TS_FUSE_MAX_EXT];
} ew_fused_params;
_Static_assert(offsetof(ew_fused_params, ext) == 416,
               "ew_fused_params must match ew_fused.comp");

/* ew_copy.comp's Params */
enum { COPY_BITS, COPY_FLOAT, COPY_INT, COPY_FILL };
typedef struct {
    vk_tdesc dst, src;
    uint64_t fill;
    int32_t mode, esize, numel, pad;
} ew_copy_params;
_Static_assert(sizeof(ew_copy_params) == 184,
               "ew_copy_params must match ew_copy.comp");

/* ew_select.comp's Params */
typedef struct {
    vk_tdesc dst, cond, a, b;
    uint64_t fill;
    int32_t has_a, esize, numel, pad;
} ew_select_params;
_Static_assert(sizeof(ew_select_params) == 344,
               "ew_select_params must match ew_select.comp");

/* Merges adjacent dims over which every operand steps evenly (the outer
 * stride is the inner stride times the inner size) and drops size-1 dims,
 * so a shader divides once per remaining dim. t[0]'s shape is the
 * iteration shape; all descriptors get the merged shape. */
static void coalesce(vk_tdesc *const *t, int nops) {
    int nd = 0;
    int32_t shape[TS_MAX_DIMS];
    int32_t st[TS_FUSE_MAX_EXT + 1][TS_MAX_DIMS];
    for (int d = 0; d < t[0]->ndim; d++) {
        int32_t s = t[0]->shape[d];
        if (s == 1)
            continue;
        bool merge = nd > 0;
        for (int k = 0; k < nops && merge; k++)
            merge = (int64_t)st[k][nd - 1] == (int64_t)t[k]->stride[d] * s;
        if (merge)
            shape[nd - 1] *= s;
        else
            shape[nd++] = s;
        for (int k = 0; k < nops; k++)
            st[k][nd - 1] = t[k]->stride[d];
    }
    if (nd == 0) { /* a scalar, or all dims 1 */
        shape[nd++] = 1;
        for (int k = 0; k < nops; k++)
            st[k][0] = 0;
    }
    for (int k = 0; k < nops; k++) {
        t[k]->ndim = nd;
        memset(t[k]->shape, 0, sizeof t[k]->shape);
        memset(t[k]->stride, 0, sizeof t[k]->stride);
        memcpy(t[k]->shape, shape, sizeof(int32_t) * (size_t)nd);
        memcpy(t[k]->stride, st[k], sizeof(int32_t) * (size_t)nd);
    }
}

static int64_t desc_numel(const vk_tdesc *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

/* the ew_fused code of node n, or -1 when the shader has no such op */
static int ew_code(const ts_node *n) {
    bool tanh_gelu = n->attrs.i[0] == TS_GELU_TANH;
    switch (n->op) {
    case TS_OP_ADD:
        return EW_ADD;
    case TS_OP_SUB:
        return EW_SUB;
    case TS_OP_MUL:
        return EW_MUL;
    case TS_OP_DIV:
        return EW_DIV;
    case TS_OP_EQ:
        return EW_EQ;
    case TS_OP_ADD_SCALAR:
        return EW_ADD_SCALAR;
    case TS_OP_MUL_SCALAR:
        return EW_MUL_SCALAR;
    case TS_OP_NEG:
        return EW_NEG;
    case TS_OP_EXP:
        return EW_EXP;
    case TS_OP_LOG:
        return EW_LOG;
    case TS_OP_SQRT:
        return EW_SQRT;
    case TS_OP_RSQRT:
        return EW_RSQRT;
    case TS_OP_ABS:
        return EW_ABS;
    case TS_OP_POW_SCALAR:
        return EW_POW;
    case TS_OP_TANH:
        return EW_TANH;
    case TS_OP_SIGMOID:
        return EW_SIGMOID;
    case TS_OP_RELU:
        return EW_RELU;
    case TS_OP_SILU:
        return EW_SILU;
    case TS_OP_GELU:
        return tanh_gelu ? EW_GELU_TANH : EW_GELU_ERF;
    case TS_OP_UNARY_BACKWARD:
        switch ((ts_op_id)n->attrs.i[8]) { /* the forward op */
        case TS_OP_EXP:
            return EW_BW_EXP;
        case TS_OP_LOG:
            return EW_BW_LOG;
        case TS_OP_SQRT:
            return EW_BW_SQRT;
        case TS_OP_RSQRT:
            return EW_BW_RSQRT;
        case TS_OP_ABS:
            return EW_BW_ABS;
        case TS_OP_POW_SCALAR:
            return EW_BW_POW;
        case TS_OP_TANH:
            return EW_BW_TANH;
        case TS_OP_SIGMOID:
            return EW_BW_SIGMOID;
        case TS_OP_RELU:
            return EW_BW_RELU;
        case TS_OP_SILU:
            return EW_BW_SILU;
        case TS_OP_GELU:
            return tanh_gelu ? EW_BW_GELU_TANH : EW_BW_GELU_ERF;
        default:
            return EW_BW_NAN; /* the CPU's answer too */
        }
    default:
        return -1;
    }
}

bool vk_fusable(int op) {
    ts_node probe = {.op = (ts_op_id)op};
    return ew_code(&probe) >= 0;
}

/* One ew_fused dispatch for group f (no head) on device d. */
static ts_status run_group(ts_ctx *ctx, vk_dev *d, const ts_fused *f) {
    ts_tensor *out = f->out;
    if (f->n_members < 1 || f->n_members > TS_FUSE_MAX || f->n_ext < 1 ||
        f->n_ext > TS_FUSE_MAX_EXT)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "vulkan fused elementwise: %d members, %d "
                            "outside inputs (want 1..%d, 1..%d)",
                            f->n_members, f->n_ext, TS_FUSE_MAX,
                            TS_FUSE_MAX_EXT);
    if (ts_tensor_numel(out) == 0)
        return TS_OK;
    ew_fused_params p;
    memset(&p, 0, sizeof p);
    vk_tdesc *all[TS_FUSE_MAX_EXT + 1] = {&p.dst};
    if (vk_desc(ctx, out, &p.dst))
        return ctx->status;
    for (int k = 0; k < f->n_ext; k++) {
        if (vk_desc_bcast(ctx, f->ext[k], out->ndim, out->shape, &p.ext[k]))
            return ctx->status;
        p.ext[k].ndim = p.dst.ndim;
        memcpy(p.ext[k].shape, p.dst.shape, sizeof p.dst.shape);
        all[k + 1] = &p.ext[k];
    }
    coalesce(all, f->n_ext + 1);
    for (int m = 0; m < f->n_members; m++) {
        const ts_node *n = f->members[m];
        int code = ew_code(n);
        if (code < 0)
            return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                                "vulkan fused elementwise: op %s has no "
                                "elementwise kernel",
                                ts_op_table[n->op].name);
        p.op[m] = code;
        p.scal[m] = (float)n->attrs.f[0];
        for (int k = 0; k < n->n_in && k < 3; k++)
            p.arg[m * 3 + k] = f->arg[m][k];
    }
    p.n_ext = f->n_ext;
    p.n_members = f->n_members;
    int64_t numel = desc_numel(&p.dst);
    p.numel = (int32_t)numel;
    vk_launch_desc l = {.shader = "ew_fused",
                        .spec = {(uint32_t)f->n_ext, (uint32_t)f->n_members},
                        .nspec = 2,
                        .params = &p,
                        .params_bytes = offsetof(ew_fused_params, ext) +
                                        sizeof(vk_tdesc) * (size_t)f->n_ext,
                        .groups = {vk_groups_for(d, numel, EW_GROUP), 1, 1}};
    return vk_launch(ctx, d, &l);
}

/* node n (binary, unary, unary backward) as a group of one */
static ts_status run_single(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_fused f;
    memset(&f, 0, sizeof f);
    f.n_members = 1;
    f.members[0] = n;
    f.n_ext = n->n_in;
    for (int k = 0; k < n->n_in; k++) {
        f.ext[k] = n->in[k];
        f.arg[0][k] = k;
    }
    f.out = n->out;
    f.head_ext = -1;
    return run_group(ctx, d, &f);
}

ts_status vk_k_binary(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    return run_single(ctx, d, n);
}

ts_status vk_k_unary(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    return run_single(ctx, d, n);
}

ts_status vk_k_unary_backward(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    return run_single(ctx, d, n);
}

/* A group headed by a matmul (epilogue fusion): the product in batch
 * memory first, then the group reading it (the CPU eats it panel by
 * panel; here one dispatch per part is as good). */
static ts_status run_headed(ts_ctx *ctx, vk_dev *d, const ts_fused *f) {
    ts_tensor *out = f->out;
    if (f->head_ext < 0 || f->head_ext >= f->n_ext)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "vulkan fused elementwise: the matmul head is "
                            "not among the group's inputs");
    int64_t numel = ts_tensor_numel(out);
    uint64_t tmp = vk_temp(ctx, d, sizeof(float) * (size_t)(numel ? numel : 1));
    if (!tmp)
        return ctx->status;
    ts_storage st = {.refcount = 1,
                     .ctx = ctx,
                     .external = true,
                     .data = (void *)(uintptr_t)tmp,
                     .bytes = sizeof(float) * (size_t)numel,
                     .device = out->storage->device};
    ts_tensor prod = {.refcount = 1,
                      .ctx = ctx,
                      .dtype = TS_F32,
                      .ndim = out->ndim,
                      .storage = &st};
    memcpy(prod.shape, out->shape, sizeof prod.shape);
    ts_contiguous_strides(prod.ndim, prod.shape, prod.strides);
    if (!vk_k_matmul)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "the Vulkan backend has no kernel for op matmul "
                            "(the head of a fused group)");
    ts_node mm = *f->head;
    mm.out = &prod;
    if (vk_k_matmul(ctx, d, &mm))
        return ctx->status;
    ts_fused g = *f;
    g.head = NULL;
    g.ext[f->head_ext] = &prod;
    return run_group(ctx, d, &g);
}

ts_status vk_run_fused(ts_ctx *ctx, const ts_fused *f) {
    vk_dev *d = vk_dev_get(ctx, f->out->storage->device.index);
    if (!d)
        return ctx->status;
    return f->head ? run_headed(ctx, d, f) : run_group(ctx, d, f);
}

/* ---- copies ---- */

/* dst (its own strides) = src read with strides in dst's shape, or = the
 * element `fill` when src is NULL */
static ts_status run_copy(ts_ctx *ctx, vk_dev *d, vk_tdesc *dst, vk_tdesc *src,
                          uint64_t fill) {
    ew_copy_params p;
    memset(&p, 0, sizeof p);
    p.dst = *dst;
    p.esize = (int32_t)ts_dtype_size((ts_dtype)dst->dtype);
    if (src) {
        p.src = *src;
        p.src.ndim = p.dst.ndim;
        memcpy(p.src.shape, p.dst.shape, sizeof p.dst.shape);
        bool ints = !ts_dtype_is_float((ts_dtype)dst->dtype) ||
                    !ts_dtype_is_float((ts_dtype)src->dtype);
        p.mode = dst->dtype == src->dtype ? COPY_BITS
                 : ints                   ? COPY_INT
                                          : COPY_FLOAT;
    } else {
        p.mode = COPY_FILL;
        p.fill = fill;
        p.src = p.dst;
    }
    vk_tdesc *all[2] = {&p.dst, &p.src};
    coalesce(all, 2);
    int64_t numel = desc_numel(&p.dst);
    if (numel == 0)
        return TS_OK;
    p.numel = (int32_t)numel;
    vk_launch_desc l = {.shader = "ew_copy",
                        .params = &p,
                        .params_bytes = sizeof p,
                        .groups = {vk_groups_for(d, numel, EW_GROUP), 1, 1}};
    return vk_launch(ctx, d, &l);
}

/* copy and cast: out (contiguous) = in[0] (any strides), converted */
ts_status vk_k_copy(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    vk_tdesc dst, src;
    if (vk_desc(ctx, n->out, &dst) || vk_desc(ctx, n->in[0], &src))
        return ctx->status;
    return run_copy(ctx, d, &dst, &src, 0);
}

/* in[0] (any strides) = in[1] broadcast and converted */
ts_status vk_k_copy_into(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *dt = n->in[0], *s = n->in[1];
    vk_tdesc dst, src;
    if (vk_desc(ctx, dt, &dst) ||
        vk_desc_bcast(ctx, s, dt->ndim, dt->shape, &src))
        return ctx->status;
    return run_copy(ctx, d, &dst, &src, 0);
}

/* out = the inputs side by side along attrs.i[0]: one copy each into its
 * window of out */
ts_status vk_k_concat(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *y = n->out;
    int dim = (int)n->attrs.i[0];
    uint64_t es = ts_dtype_size(y->dtype);
    int64_t off = 0;
    vk_tdesc whole;
    if (vk_desc(ctx, y, &whole))
        return ctx->status;
    for (int k = 0; k < n->n_in; k++) {
        ts_tensor *x = n->in[k];
        vk_tdesc dst = whole, src;
        if (vk_desc(ctx, x, &src))
            return ctx->status;
        dst.shape[dim] = (int32_t)x->shape[dim];
        dst.addr += (uint64_t)(off * whole.stride[dim]) * es;
        if (run_copy(ctx, d, &dst, &src, 0))
            return ctx->status;
        off += x->shape[dim];
    }
    return TS_OK;
}

/* out (attrs.i[4..]) = zeros, with in[0] written at the slice attrs.i[0..3]
 * (dim, start, end, step) describe: slice's gradient */
ts_status vk_k_slice_scatter(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *g = n->in[0], *y = n->out;
    int dim = (int)n->attrs.i[0];
    int64_t start = n->attrs.i[1], step = n->attrs.i[3];
    vk_tdesc whole, dst, src;
    if (vk_desc(ctx, y, &whole) || vk_desc(ctx, g, &src))
        return ctx->status;
    dst = whole;
    if (run_copy(ctx, d, &whole, NULL, 0)) /* zeros: 0 bits in any dtype */
        return ctx->status;
    if ((int64_t)whole.stride[dim] * step > INT32_MAX)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "vulkan slice_scatter: stride %lld too large",
                            (long long)whole.stride[dim] * step);
    for (int k = 0; k < g->ndim; k++)
        dst.shape[k] = (int32_t)g->shape[k];
    dst.stride[dim] = (int32_t)(whole.stride[dim] * step);
    dst.addr += (uint64_t)(start * whole.stride[dim]) * ts_dtype_size(y->dtype);
    return run_copy(ctx, d, &dst, &src, 0);
}

/* ---- where, masked_fill ---- */

static ts_status run_select(ts_ctx *ctx, vk_dev *d, ts_tensor *out,
                            ts_tensor *cond, ts_tensor *a, ts_tensor *b,
                            uint64_t fill) {
    if (ts_tensor_numel(out) == 0)
        return TS_OK;
    ew_select_params p;
    memset(&p, 0, sizeof p);
    int nd = out->ndim;
    if (vk_desc(ctx, out, &p.dst) ||
        vk_desc_bcast(ctx, cond, nd, out->shape, &p.cond) ||
        (a && vk_desc_bcast(ctx, a, nd, out->shape, &p.a)) ||
        vk_desc_bcast(ctx, b, nd, out->shape, &p.b))
        return ctx->status;
    if (!a) { /* masked_fill: a constant; strides 0 keep it out of the way */
        p.a.ndim = nd;
        p.fill = fill;
    }
    p.has_a = a != NULL;
    vk_tdesc *all[4] = {&p.dst, &p.cond, &p.a, &p.b};
    for (int k = 1; k < 4; k++) {
        all[k]->ndim = p.dst.ndim;
        memcpy(all[k]->shape, p.dst.shape, sizeof p.dst.shape);
    }
    coalesce(all, 4);
    int64_t numel = desc_numel(&p.dst);
    p.numel = (int32_t)numel;
    p.esize = (int32_t)ts_dtype_size(out->dtype);
    vk_launch_desc l = {.shader = "ew_select",
                        .params = &p,
                        .params_bytes = sizeof p,
                        .groups = {vk_groups_for(d, numel, EW_GROUP), 1, 1}};
    return vk_launch(ctx, d, &l);
}

/* out = in[0] ? in[1] : in[2], elements of any dtype */
ts_status vk_k_where(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    return run_select(ctx, d, n->out, n->in[0], n->in[1], n->in[2], 0);
}

/* out = in[1] (mask) ? attrs.f[0] : in[0] */
ts_status vk_k_masked_fill(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    unsigned char value[8] = {0};
    uint64_t bits;
    ts_store_f64(value, n->out->dtype, n->attrs.f[0]);
    memcpy(&bits, value, sizeof bits); /* little-endian: low bytes first */
    return run_select(ctx, d, n->out, n->in[1], NULL, n->in[0], bits);
}
