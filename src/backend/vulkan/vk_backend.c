/* vk_backend.c — the Vulkan backend as the runtime sees it: the vtable
 * (memory by device address, transfers, the op table by op id, sync,
 * device listing) over vk_device.c and vk_exec.c. Kernels are in k_*.c. */
#include "backend/vulkan/vk_internal.h"

#include <stdio.h>
#include <string.h>

static const vk_kernel vk_kernels[TS_OP_COUNT] = {
    [TS_OP_ADD] = vk_k_binary,
    [TS_OP_SUB] = vk_k_binary,
    [TS_OP_MUL] = vk_k_binary,
    [TS_OP_DIV] = vk_k_binary,
    [TS_OP_EQ] = vk_k_binary,
    [TS_OP_ADD_SCALAR] = vk_k_unary,
    [TS_OP_MUL_SCALAR] = vk_k_unary,
    [TS_OP_NEG] = vk_k_unary,
    [TS_OP_EXP] = vk_k_unary,
    [TS_OP_LOG] = vk_k_unary,
    [TS_OP_SQRT] = vk_k_unary,
    [TS_OP_RSQRT] = vk_k_unary,
    [TS_OP_ABS] = vk_k_unary,
    [TS_OP_POW_SCALAR] = vk_k_unary,
    [TS_OP_TANH] = vk_k_unary,
    [TS_OP_SIGMOID] = vk_k_unary,
    [TS_OP_RELU] = vk_k_unary,
    [TS_OP_SILU] = vk_k_unary,
    [TS_OP_GELU] = vk_k_unary,
    [TS_OP_UNARY_BACKWARD] = vk_k_unary_backward,
    [TS_OP_WHERE] = vk_k_where,
    [TS_OP_MASKED_FILL] = vk_k_masked_fill,
    [TS_OP_CAST] = vk_k_copy,
    [TS_OP_COPY] = vk_k_copy,
    [TS_OP_SUM] = vk_k_reduce,
    [TS_OP_MEAN] = vk_k_reduce,
    [TS_OP_AMAX] = vk_k_reduce,
    [TS_OP_ARGMAX] = vk_k_argmax,
    [TS_OP_SOFTMAX] = vk_k_softmax,
    [TS_OP_LOG_SOFTMAX] = vk_k_softmax,
    [TS_OP_MATMUL] = vk_k_matmul,
    [TS_OP_EMBEDDING] = vk_k_embedding,
    [TS_OP_EMBEDDING_BACKWARD] = vk_k_embedding_backward,
    [TS_OP_CONCAT] = vk_k_concat,
    [TS_OP_SLICE_SCATTER] = vk_k_slice_scatter,
    [TS_OP_RMSNORM] = vk_k_rmsnorm,
    [TS_OP_RMSNORM_BACKWARD] = vk_k_rmsnorm_backward,
    [TS_OP_LAYERNORM] = vk_k_layernorm,
    [TS_OP_LAYERNORM_BACKWARD] = vk_k_layernorm_backward,
    [TS_OP_ROPE] = vk_k_rope,
    [TS_OP_ATTENTION] = vk_k_attention,
    [TS_OP_ATTENTION_BACKWARD] = vk_k_attention_backward,
    [TS_OP_PAGED_ATTENTION] = vk_k_paged_attention,
    [TS_OP_CROSS_ENTROPY] = vk_k_cross_entropy,
    [TS_OP_CROSS_ENTROPY_BACKWARD] = vk_k_cross_entropy_backward,
    [TS_OP_TOPK] = vk_k_topk,
    [TS_OP_GATHER] = vk_k_gather,
    [TS_OP_GATHER_BACKWARD] = vk_k_gather_backward,
    [TS_OP_ONE_HOT] = vk_k_one_hot,
    [TS_OP_COPY_INTO] = vk_k_copy_into,
    [TS_OP_ADAMW] = vk_k_adamw,
    [TS_OP_INDEX_ADD] = vk_k_index_add,
    [TS_OP_MOE_EXPERTS] = vk_k_moe_experts,
    [TS_OP_MOE_EXPERTS_BACKWARD] = vk_k_moe_experts_backward,
};

/* the device an op runs on: its output's (in place: input 0's) */
static int node_dev(const ts_node *n) {
    const ts_tensor *t = n->out ? n->out : n->in[0];
    return t->storage->device.index;
}

static ts_status vk_run_node(ts_ctx *ctx, ts_node *n) {
    vk_kernel k = vk_kernels[n->op];
    if (!k)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "the Vulkan backend has no kernel for op %s (move "
                            "its inputs to the CPU with ts_to_device)",
                            ts_op_table[n->op].name);
    vk_dev *d = vk_dev_get(ctx, node_dev(n));
    if (!d)
        return ctx->status;
    /* an empty output: nothing to compute */
    if (n->out && ts_tensor_numel(n->out) == 0 && !ts_op_table[n->op].in_place)
        return TS_OK;
    return k(ctx, d, n);
}

static void *vk_alloc(ts_ctx *ctx, int dev, size_t bytes) {
    vk_dev *d = vk_dev_get(ctx, dev);
    if (!d)
        return NULL;
    return (void *)(uintptr_t)vk_alloc_addr(ctx, d, bytes);
}

static void vk_free(ts_ctx *ctx, int dev, void *p, size_t bytes) {
    vk_state *s = ctx->backend_state[TS_DEVICE_VULKAN];
    if (p && s && dev >= 0 && dev < TS_MAX_DEVICES && s->devs[dev])
        vk_free_addr(s->devs[dev], (uint64_t)(uintptr_t)p, bytes);
}

#define DEV_OR_FAIL(ctx, dev)                                                  \
    vk_dev *d = vk_dev_get(ctx, dev);                                          \
    if (!d)                                                                    \
        return ctx->status;

static ts_status vk_copy(ts_ctx *ctx, int dev, void *dst, const void *src,
                         size_t bytes) {
    DEV_OR_FAIL(ctx, dev);
    return vk_copy_dev(ctx, d, (uint64_t)(uintptr_t)dst,
                       (uint64_t)(uintptr_t)src, bytes);
}

static ts_status vk_up(ts_ctx *ctx, int dev, void *dst, const void *src,
                       size_t bytes) {
    DEV_OR_FAIL(ctx, dev);
    return vk_upload(ctx, d, (uint64_t)(uintptr_t)dst, src, bytes);
}

static ts_status vk_down(ts_ctx *ctx, int dev, void *dst, const void *src,
                         size_t bytes) {
    DEV_OR_FAIL(ctx, dev);
    return vk_download(ctx, d, dst, (uint64_t)(uintptr_t)src, bytes);
}

static ts_status vk_fill_bytes(ts_ctx *ctx, int dev, void *dst, size_t count,
                               const void *pattern, size_t elem_bytes) {
    DEV_OR_FAIL(ctx, dev);
    if (elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "vulkan: fill of %zu-byte elements", elem_bytes);
    return vk_fill(ctx, d, (uint64_t)(uintptr_t)dst, count, pattern,
                   elem_bytes);
}

static ts_status vk_sync(ts_ctx *ctx, int dev) {
    vk_state *s = ctx->backend_state[TS_DEVICE_VULKAN];
    if (!s || dev < 0 || dev >= TS_MAX_DEVICES || !s->devs[dev])
        return TS_OK; /* never used: nothing queued */
    return vk_exec_wait_all(ctx, s->devs[dev]);
}

static const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
        return "integrated-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
        return "discrete-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
        return "virtual-gpu";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
        return "cpu (software)";
    default:
        return "other";
    }
}

static ts_status vk_info(ts_ctx *ctx, int dev, ts_device_info *out) {
    DEV_OR_FAIL(ctx, dev);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", d->props.deviceName);
    VkPhysicalDeviceDriverProperties dp = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &dp};
    vkGetPhysicalDeviceProperties2(d->phys, &p2);
    uint32_t v = d->props.apiVersion;
    snprintf(out->driver, sizeof out->driver, "%.40s %.60s (Vulkan %u.%u.%u)",
             dp.driverName, dp.driverInfo, VK_API_VERSION_MAJOR(v),
             VK_API_VERSION_MINOR(v), VK_API_VERSION_PATCH(v));
    snprintf(out->type, sizeof out->type, "%s", type_name(d->props.deviceType));
    vk_mem_info(d, &out->free_bytes, &out->total_bytes);
    snprintf(out->features, sizeof out->features,
             "subgroup=%u shared=%uKiB%s%s%s", d->lim.subgroup_size,
             d->lim.max_shared_bytes / 1024, d->lim.fp16 ? " fp16" : "",
             d->lim.atomic_float_add ? " f32-atomic-add" : "",

             d->has_budget ? " memory-budget" : "");
    return TS_OK;
}

static bool vk_fusable_any(int op) {
    return vk_fusable(op);
}

const ts_backend ts_vulkan_backend = {
    .name = "vulkan",
    .kind = TS_DEVICE_VULKAN,
    .alloc = vk_alloc,
    .free = vk_free,
    .copy = vk_copy,
    .upload = vk_up,
    .download = vk_down,
    .fill = vk_fill_bytes,
    .run_node = vk_run_node,
    .sync = vk_sync,
    .fusable = vk_fusable_any,
    .run_fused = vk_run_fused,
    .eval_scalar = NULL,
    .graph_begin = vk_graph_begin,
    .graph_end = vk_graph_end,
    .graph_free = vk_graph_free,
    .count = vk_device_count,
    .info = vk_info,
    .ctx_free = vk_state_free,
};
