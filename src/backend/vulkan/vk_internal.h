/* vk_internal.h — the Vulkan backend's own state (vk_device.c, vk_exec.c,
 * vk_backend.c): the per-context instance, the device, its memory blocks
 * and command batches. Kernel files use vk.h only. */
#ifndef TS_VK_INTERNAL_H
#define TS_VK_INTERNAL_H

#include "backend/vulkan/vk.h"

#include <vulkan/vulkan.h>

/* a buffer over a whole VkDeviceMemory, with its device address */
typedef struct {
    VkBuffer buf;
    VkDeviceMemory mem;
    uint64_t addr;
    size_t bytes;
    void *map; /* host-visible memory only */
} vk_raw;

typedef struct vk_block {
    vk_raw raw;
    size_t used;    /* carved from the start (size-class chunks) */
    int live;       /* chunks handed out and not freed */
    bool dedicated; /* one large tensor */
} vk_block;

typedef struct vk_chunk {
    struct vk_chunk *next;
    uint64_t addr;
} vk_chunk;

/* one command buffer and what must live until its work is done */
#define VK_PARAM_ARENA (1u << 20)
typedef struct {
    VkCommandBuffer cb;
    VkFence fence;
    bool recording, submitted;
    int dispatches;
    vk_raw params; /* host-visible: kernel params and small uploads */
    size_t params_used;
    /* freed when the fence signals */
    uint64_t *temps;
    size_t *temp_bytes;
    int n_temps, cap_temps;
    vk_block **blocks;
    int n_blocks, cap_blocks;
} vk_batch;

#define VK_BATCHES 3
#define VK_CLASSES 200
#define VK_STAGING (16u << 20)

typedef struct vk_graph vk_graph;

typedef struct {
    int shader; /* index into vk_shader_table */
    uint32_t spec[VK_MAX_SPEC];
    int nspec;
    VkPipeline pipe;
} vk_pipe_entry;

struct vk_dev {
    ts_ctx *ctx;
    int index;
    bool lost;
    VkPhysicalDevice phys;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties memprops;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    bool has_budget;
    vk_limits lim;
    /* memory */
    size_t block_bytes, mem_reserved, cached_bytes;
    uint64_t max_alloc; /* one VkDeviceMemory / VkBuffer at most */
    vk_block **blocks;  /* sorted by address */
    int n_blocks;
    vk_block *carve; /* where new chunks are cut */
    vk_chunk *free_chunks[VK_CLASSES];
    /* execution */
    VkCommandPool pool;
    vk_batch batch[VK_BATCHES];
    int cur;
    uint64_t submits, launches;
    VkPipelineLayout layout;
    VkPipelineCache cache;
    char cache_file[4200]; /* where the cache is kept between runs ("") */
    int n_pipes_built;
    VkShaderModule *modules; /* per shader, made on first use */
    vk_pipe_entry *pipes;
    int n_pipes, cap_pipes;
    vk_raw staging; /* host-visible, for uploads and downloads */
    /* compiled plans recorded once (vk_graph.c); active: the one whose
     * kernels are being recorded or replayed now */
    vk_graph **graphs;
    int n_graphs, cap_graphs;
    vk_graph *active;
};

typedef struct {
    VkInstance instance;
    VkDebugUtilsMessengerEXT messenger;
    int validation_errors;
    int n_phys;
    VkPhysicalDevice phys[TS_MAX_DEVICES];
    vk_dev *devs[TS_MAX_DEVICES];
    bool failed[TS_MAX_DEVICES];
    char fail_msg[TS_MAX_DEVICES][256];
    char why[320];
} vk_state;

/* vk_device.c */
vk_state *vk_state_get(ts_ctx *ctx);
void vk_state_free(ts_ctx *ctx);
int vk_device_count(ts_ctx *ctx);
void vk_dev_destroy(vk_dev *d);
const char *vk_result_name(VkResult r);
ts_status vk_fail(ts_ctx *ctx, vk_dev *d, VkResult r, const char *what);
ts_status vk_mem_init(ts_ctx *ctx, vk_dev *d);
void vk_mem_destroy(vk_dev *d);
void vk_mem_info(vk_dev *d, size_t *free_bytes, size_t *total);
uint64_t vk_alloc_addr(ts_ctx *ctx, vk_dev *d, size_t bytes);
void vk_free_addr(vk_dev *d, uint64_t addr, size_t bytes);
vk_block *vk_block_of(vk_dev *d, uint64_t addr);
void vk_block_release(vk_dev *d, vk_block *b);
/* host-visible buffers: staging (host-cached: the host reads them) and
 * kernel parameters (device-local when the host can write such memory) */
enum { VK_MEM_DEVICE, VK_MEM_STAGING, VK_MEM_PARAMS };
ts_status vk_host_buffer(ts_ctx *ctx, vk_dev *d, size_t bytes, vk_raw *out);
ts_status vk_params_buffer(ts_ctx *ctx, vk_dev *d, size_t bytes, vk_raw *out);
void vk_host_buffer_free(vk_dev *d, vk_raw *r);

/* vk_exec.c */
ts_status vk_exec_init(ts_ctx *ctx, vk_dev *d);
void vk_exec_destroy(vk_dev *d);
/* submits the batch being recorded (no wait) */
ts_status vk_exec_flush(ts_ctx *ctx, vk_dev *d);
/* submits and waits for everything queued */
ts_status vk_exec_wait_all(ts_ctx *ctx, vk_dev *d);
/* the same, keeping the recording batch's temporaries alive (moved to
 * the next batch) */
ts_status vk_exec_wait_keep_temps(ts_ctx *ctx, vk_dev *d);
uint64_t vk_wait_ns(void);
void vk_exec_defer_block(vk_dev *d, vk_block *b);
ts_status vk_upload(ts_ctx *ctx, vk_dev *d, uint64_t dst, const void *src,
                    size_t bytes);
ts_status vk_download(ts_ctx *ctx, vk_dev *d, void *dst, uint64_t src,
                      size_t bytes);
ts_status vk_copy_dev(ts_ctx *ctx, vk_dev *d, uint64_t dst, uint64_t src,
                      size_t bytes);
ts_status vk_fill(ts_ctx *ctx, vk_dev *d, uint64_t dst, size_t count,
                  const void *pattern, size_t elem_bytes);
/* *p (cap elements of elem bytes) grown to hold need; false when out of
 * memory (*p unchanged) */
bool vk_grow(void **p, int *cap, int need, size_t elem);
/* a global memory barrier: every earlier write seen by every later access */
void vk_barrier(VkCommandBuffer cb);
/* a dispatch of an already built pipeline into the current batch */
ts_status vk_launch_raw(ts_ctx *ctx, vk_dev *d, VkPipeline p,
                        const uint32_t groups[3], const void *params,
                        size_t bytes);

/* vk_graph.c */
ts_status vk_graph_begin(ts_ctx *ctx, int dev, void **handle);
ts_status vk_graph_end(ts_ctx *ctx, int dev, void *handle, bool ok);
void vk_graph_free(void *handle);
ts_status vk_graph_wait_all(ts_ctx *ctx, vk_dev *d);
bool vk_graph_launch(ts_ctx *ctx, vk_dev *d, VkPipeline pipe,
                     const uint32_t groups[3], const void *params, size_t bytes,
                     ts_status *st);
ts_status vk_graph_break(ts_ctx *ctx, vk_dev *d);
bool vk_graph_hold_temp(vk_dev *d, uint64_t addr, size_t bytes);
bool vk_graph_hold_block(vk_dev *d, vk_block *b);

#endif
