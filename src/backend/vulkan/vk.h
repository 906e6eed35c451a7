/* vk.h — the Vulkan backend's internal interface, shared by its files: the
 * device object (opaque outside vk_device.c), kernel launches, temporary
 * device memory and the kernel signature. Only src/backend/vulkan/ includes
 * it.
 *
 * How a kernel runs. Device memory is addressed by 64-bit device addresses
 * (VK_KHR_buffer_device_address, core in Vulkan 1.2): a storage's data
 * pointer on a Vulkan device IS the device address of its first byte (never
 * dereferenced on the host), so views and the compiler's arena offsets are
 * plain pointer arithmetic. A kernel fills a parameter struct (the device
 * addresses of its tensors, sizes, strides, scalars), and vk_launch copies
 * it into a host-visible parameter area of the current command batch and
 * records the dispatch with that area's address as the only push constant.
 * Shaders (shaders/<name>.comp, GLSL compiled by glslc at build time and
 * embedded) include shaders/common.glsl, which declares the push constant,
 * the buffer-reference types and the load/store helpers by dtype.
 *
 * Dispatches are recorded into a command buffer and submitted in batches;
 * a global memory barrier follows each one, so a kernel sees every earlier
 * kernel's writes. The host waits only where it needs values
 * (vk_download, ts_sync on the device). */
#ifndef TS_VK_H
#define TS_VK_H

#include "ops/ops.h"

#include <stdint.h>

typedef struct vk_dev vk_dev;

/* The device vulkan:index of ctx (created on first use); NULL with the
 * error set when there is no such device or no Vulkan driver. */
vk_dev *vk_dev_get(ts_ctx *ctx, int index);

/* What kernels may want to know about the device. */
typedef struct {
    uint32_t subgroup_size;
    uint32_t max_workgroup_invocations;
    uint32_t max_shared_bytes;
    uint32_t max_groups[3];
    bool atomic_float_add; /* atomicAdd on f32 in buffers (enabled) */
    bool fp16;             /* shaderFloat16 (enabled when offered) */
} vk_limits;
const vk_limits *vk_dev_limits(const vk_dev *d);

/* One dispatch. shader: the file name under shaders/ without ".comp";
 * spec: specialization constants (constant_id 0..nspec-1, 32-bit each, for
 * tile sizes); params: copied at once (the caller's struct may go away). */
#define VK_MAX_SPEC 8
typedef struct {
    const char *shader;
    uint32_t spec[VK_MAX_SPEC];
    int nspec;
    const void *params;
    size_t params_bytes; /* <= VK_MAX_PARAMS */
    uint32_t groups[3];  /* workgroups in x, y, z (0 counts as 1) */
} vk_launch_desc;
#define VK_MAX_PARAMS 4096
ts_status vk_launch(ts_ctx *ctx, vk_dev *d, const vk_launch_desc *l);

/* Device memory for the current batch only (a kernel's partial sums): its
 * device address, freed once the batch that uses it has finished. 0 with
 * TS_ERR_OOM set when the device is full. */
uint64_t vk_temp(ts_ctx *ctx, vk_dev *d, size_t bytes);

/* Device address of t's element [0,...,0]. */
static inline uint64_t vk_addr(const ts_tensor *t) {
    return (uint64_t)(uintptr_t)t->storage->data +
           (uint64_t)t->offset * ts_dtype_size(t->dtype);
}

/* A tensor as shaders see it (struct TDesc in common.glsl, same layout):
 * its element [0..] address, dtype (ts_dtype's values), dims and strides in
 * elements. Kernels index with 32-bit ints: vk_desc refuses (TS_ERR_
 * UNSUPPORTED) a tensor with more than VK_MAX_INDEX elements, or whose
 * farthest element is farther than that from its first (room for a
 * grid-stride loop's i + stride to stay below 2^31). Broadcast reads:
 * vk_desc_bcast gives t's strides as seen in the output's (ndim, shape) (0 on
 * broadcast dims), dims aligned right. */
#define VK_MAX_INDEX ((int64_t)INT32_MAX - (1 << 26))
typedef struct {
    uint64_t addr;
    int32_t dtype;
    int32_t ndim;
    int32_t shape[TS_MAX_DIMS];
    int32_t stride[TS_MAX_DIMS];
} vk_tdesc;
_Static_assert(sizeof(vk_tdesc) == 80, "vk_tdesc must match TDesc");
ts_status vk_desc(ts_ctx *ctx, const ts_tensor *t, vk_tdesc *out);
ts_status vk_desc_bcast(ts_ctx *ctx, const ts_tensor *t, int ndim,
                        const int64_t *shape, vk_tdesc *out);

/* Workgroups to cover n items with `per` items each (ceil), clamped to
 * the device's limit in x (kernels loop over the rest: grid-stride). */
uint32_t vk_groups_for(const vk_dev *d, int64_t n, int64_t per);

/* A kernel: runs node n (inputs n->in, output n->out, saved n->saved),
 * all on the device d. Same contract as a CPU kernel (cpu.h): n->out is a
 * new contiguous tensor unless the op is in place. */
typedef ts_status (*vk_kernel)(ts_ctx *ctx, vk_dev *d, ts_node *n);

/* Kernels, by the file that defines them (the table is in vk_backend.c). */
/* k_elementwise.c */
ts_status vk_k_binary(ts_ctx *, vk_dev *, ts_node *); /* add sub mul div eq */
ts_status vk_k_unary(ts_ctx *, vk_dev *, ts_node *);  /* add_scalar..gelu */
ts_status vk_k_unary_backward(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_where(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_masked_fill(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_copy(ts_ctx *, vk_dev *, ts_node *); /* copy, cast */
ts_status vk_k_copy_into(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_concat(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_slice_scatter(ts_ctx *, vk_dev *, ts_node *);
bool vk_fusable(int op);
ts_status vk_run_fused(ts_ctx *ctx, const struct ts_fused *f);
/* k_reduce.c */
ts_status vk_k_reduce(ts_ctx *, vk_dev *, ts_node *); /* sum mean amax */
ts_status vk_k_argmax(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_softmax(ts_ctx *, vk_dev *, ts_node *); /* and log_softmax */
ts_status vk_k_cross_entropy(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_cross_entropy_backward(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_embedding(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_embedding_backward(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_index_add(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_adamw(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_topk(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_gather(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_gather_backward(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_one_hot(ts_ctx *, vk_dev *, ts_node *);
/* k_matmul.c */
ts_status vk_k_matmul(ts_ctx *, vk_dev *, ts_node *);
/* k_attention.c */
ts_status vk_k_attention(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_attention_backward(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_paged_attention(ts_ctx *, vk_dev *, ts_node *);
/* k_norm.c */
ts_status vk_k_rmsnorm(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_rmsnorm_backward(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_layernorm(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_layernorm_backward(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_rope(ts_ctx *, vk_dev *, ts_node *);
/* k_moe.c */
ts_status vk_k_moe_experts(ts_ctx *, vk_dev *, ts_node *);
ts_status vk_k_moe_experts_backward(ts_ctx *, vk_dev *, ts_node *);

#endif
