/* vk_exec.c — running work on a Vulkan device: command batches (dispatches
 * recorded into one command buffer, submitted every VK_BATCH_DISPATCHES or
 * when the host needs a value, never one submit and wait per op), the
 * parameter arena each batch owns, pipelines from the embedded SPIR-V
 * (specialization constants, a pipeline cache), temporary memory freed when
 * its batch is done, and transfers through a host-visible staging buffer. */
#include "backend/vulkan/vk_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct vk_shader_blob {
    const char *name;
    const uint32_t *code;
    size_t bytes;
};
extern const struct vk_shader_blob vk_shader_table[];
extern const int vk_shader_count;

#define VK_BATCH_DISPATCHES 256

/* how long the host waits on one batch before calling the device hung:
 * TS_VK_TIMEOUT_S seconds (default 600: a software driver on a busy
 * machine is slow, a hung GPU is hung) */
uint64_t vk_wait_ns(void) {
    static uint64_t ns;
    if (!ns) {
        const char *e = getenv("TS_VK_TIMEOUT_S");
        long s = e ? strtol(e, NULL, 10) : 0;
        ns = (uint64_t)(s > 0 ? s : 600) * 1000000000ull;
    }
    return ns;
}
#define VK_WAIT_NS vk_wait_ns()

/* ---- the pipeline cache on disk ---- */

/* $TS_VK_PIPELINE_CACHE (a folder; "0" or "off": none), else
 * $XDG_CACHE_HOME/tessera, else ~/.cache/tessera; one file per device
 * and driver version */
static bool cache_path(const vk_dev *d, char *buf, size_t n) {
    const char *dir = getenv("TS_VK_PIPELINE_CACHE"), *base = NULL;
    char tmp[4096];
    if (dir && (!strcmp(dir, "0") || !strcmp(dir, "off") || !*dir))
        return false;
    if (!dir && (base = getenv("XDG_CACHE_HOME")) && *base) {
        snprintf(tmp, sizeof tmp, "%s/tessera", base);
        dir = tmp;
    } else if (!dir && (base = getenv("HOME")) && *base) {
        snprintf(tmp, sizeof tmp, "%s/.cache/tessera", base);
        dir = tmp;
    }
    if (!dir)
        return false;
    /* the folder and its parent (~/.cache may not exist yet) */
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        mkdir(parent, 0755);
    }
    mkdir(dir, 0755);
    int w =
        snprintf(buf, n, "%s/vk-pipelines-%04x-%04x-%08x.bin", dir,
                 d->props.vendorID, d->props.deviceID, d->props.driverVersion);
    return w > 0 && (size_t)w < n;
}

static void *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    void *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 &&
        len < (64l << 20) && fseek(f, 0, SEEK_SET) == 0)
        buf = malloc((size_t)len);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *n = buf ? (size_t)len : 0;
    return buf;
}

/* written whole or not at all; a failure only costs the next start time */
static void save_cache(vk_dev *d) {
    size_t n = 0;
    if (vkGetPipelineCacheData(d->dev, d->cache, &n, NULL) != VK_SUCCESS || !n)
        return;
    void *buf = malloc(n);
    ts_atomic_file f;
    if (buf &&
        vkGetPipelineCacheData(d->dev, d->cache, &n, buf) == VK_SUCCESS &&
        ts_atomic_open(&f, d->cache_file))
        ts_atomic_commit(&f, ts_atomic_write(&f, buf, n));
    free(buf);
}

ts_status vk_exec_init(ts_ctx *ctx, vk_dev *d) {
    VkCommandPoolCreateInfo pi = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
        .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
        .queueFamilyIndex = d->qfam};
    VkResult r = vkCreateCommandPool(d->dev, &pi, NULL, &d->pool);
    if (r != VK_SUCCESS)
        return vk_fail(ctx, d, r, "vkCreateCommandPool");
    for (int i = 0; i < VK_BATCHES; i++) {
        vk_batch *b = &d->batch[i];
        VkCommandBufferAllocateInfo ai = {
            .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
            .commandPool = d->pool,
            .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            .commandBufferCount = 1};
        r = vkAllocateCommandBuffers(d->dev, &ai, &b->cb);
        if (r != VK_SUCCESS)
            return vk_fail(ctx, d, r, "vkAllocateCommandBuffers");
        VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        r = vkCreateFence(d->dev, &fi, NULL, &b->fence);
        if (r != VK_SUCCESS)
            return vk_fail(ctx, d, r, "vkCreateFence");
        ts_status st = vk_params_buffer(ctx, d, VK_PARAM_ARENA, &b->params);
        if (st != TS_OK)
            return st;
    }
    ts_status st = vk_host_buffer(ctx, d, VK_STAGING, &d->staging);
    if (st != TS_OK)
        return st;
    VkPushConstantRange range = {
        .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = 8};
    VkPipelineLayoutCreateInfo li = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
        .pushConstantRangeCount = 1,
        .pPushConstantRanges = &range};
    r = vkCreatePipelineLayout(d->dev, &li, NULL, &d->layout);
    if (r != VK_SUCCESS)
        return vk_fail(ctx, d, r, "vkCreatePipelineLayout");
    /* pipelines built by earlier runs on this device and driver: the
     * driver checks the data's header and ignores what does not match */
    size_t n_old = 0;
    void *old = cache_path(d, d->cache_file, sizeof d->cache_file)
                    ? read_all(d->cache_file, &n_old)
                    : NULL;
    VkPipelineCacheCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
        .initialDataSize = n_old,
        .pInitialData = old};
    r = vkCreatePipelineCache(d->dev, &ci, NULL, &d->cache);
    if (r != VK_SUCCESS && old) { /* unusable data: start empty */
        ci.initialDataSize = 0, ci.pInitialData = NULL;
        r = vkCreatePipelineCache(d->dev, &ci, NULL, &d->cache);
    }
    free(old);
    if (r != VK_SUCCESS)
        return vk_fail(ctx, d, r, "vkCreatePipelineCache");
    d->modules = calloc((size_t)vk_shader_count + 1, sizeof *d->modules);
    if (!d->modules)
        return ts_set_error(ctx, TS_ERR_OOM, "vulkan: out of memory");
    return TS_OK;
}

static void batch_release(vk_dev *d, vk_batch *b) {
    for (int i = 0; i < b->n_temps; i++)
        vk_free_addr(d, b->temps[i], b->temp_bytes[i]);
    b->n_temps = 0;
    for (int i = 0; i < b->n_blocks; i++)
        vk_block_release(d, b->blocks[i]);
    b->n_blocks = 0;
    b->params_used = 0;
    b->dispatches = 0;
}

void vk_exec_destroy(vk_dev *d) {
    for (int i = 0; i < VK_BATCHES; i++) {
        vk_batch *b = &d->batch[i];
        if (b->recording)
            vkEndCommandBuffer(b->cb);
        batch_release(d, b);
        free(b->temps), free(b->temp_bytes), free(b->blocks);
        if (b->fence)
            vkDestroyFence(d->dev, b->fence, NULL);
        vk_host_buffer_free(d, &b->params);
    }
    vk_host_buffer_free(d, &d->staging);
    for (int i = 0; i < d->n_pipes; i++)
        vkDestroyPipeline(d->dev, d->pipes[i].pipe, NULL);
    free(d->pipes);
    for (int i = 0; d->modules && i < vk_shader_count; i++)
        if (d->modules[i])
            vkDestroyShaderModule(d->dev, d->modules[i], NULL);
    free(d->modules);
    if (d->cache && d->n_pipes_built && d->cache_file[0])
        save_cache(d);
    if (d->cache)
        vkDestroyPipelineCache(d->dev, d->cache, NULL);
    if (d->layout)
        vkDestroyPipelineLayout(d->dev, d->layout, NULL);
    if (d->pool)
        vkDestroyCommandPool(d->dev, d->pool, NULL);
}

/* waits for batch b's work (when submitted) and frees what it held */
static ts_status batch_wait(ts_ctx *ctx, vk_dev *d, vk_batch *b) {
    if (!b->submitted)
        return TS_OK;
    VkResult r = vkWaitForFences(d->dev, 1, &b->fence, VK_TRUE, VK_WAIT_NS);
    if (r == VK_TIMEOUT) {
        d->lost = true;
        return ts_set_error(ctx, TS_ERR_STATE,
                            "vulkan:%d: the device did not finish its work "
                            "in %llu s; treating it as lost",
                            d->index,
                            (unsigned long long)(VK_WAIT_NS / 1000000000ull));
    }
    if (r != VK_SUCCESS)
        return vk_fail(ctx, d, r, "vkWaitForFences");
    vkResetFences(d->dev, 1, &b->fence);
    b->submitted = false;
    batch_release(d, b);
    return TS_OK;
}

/* the batch being recorded, begun when needed */
static ts_status current(ts_ctx *ctx, vk_dev *d, vk_batch **out) {
    if (d->lost)
        return ts_set_error(ctx, TS_ERR_STATE,
                            "vulkan:%d: the device is lost (an earlier "
                            "error); its tensors are gone",
                            d->index);
    vk_batch *b = &d->batch[d->cur];
    if (!b->recording) {
        ts_status st = batch_wait(ctx, d, b);
        if (st != TS_OK)
            return st;
        VkCommandBufferBeginInfo bi = {
            .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
        VkResult r = vkResetCommandBuffer(b->cb, 0);
        if (r == VK_SUCCESS)
            r = vkBeginCommandBuffer(b->cb, &bi);
        if (r != VK_SUCCESS)
            return vk_fail(ctx, d, r, "vkBeginCommandBuffer");
        b->recording = true;
    }
    *out = b;
    return TS_OK;
}

ts_status vk_exec_flush(ts_ctx *ctx, vk_dev *d) {
    vk_batch *b = &d->batch[d->cur];
    if (!b->recording)
        return TS_OK;
    b->recording = false;
    VkResult r = vkEndCommandBuffer(b->cb);
    if (r == VK_SUCCESS) {
        VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                           .commandBufferCount = 1,
                           .pCommandBuffers = &b->cb};
        r = vkQueueSubmit(d->queue, 1, &si, b->fence);
    }
    if (r != VK_SUCCESS) {
        /* the batch's work is lost: so is every result it would make */
        d->lost = true;
        batch_release(d, b);
        return vk_fail(ctx, d, r, "vkQueueSubmit");
    }
    b->submitted = true;
    d->submits++;
    d->cur = (d->cur + 1) % VK_BATCHES;
    return TS_OK;
}

ts_status vk_exec_wait_keep_temps(ts_ctx *ctx, vk_dev *d) {
    vk_batch *b = &d->batch[d->cur];
    uint64_t *temps = b->temps;
    size_t *tb = b->temp_bytes;
    int n = b->n_temps, cap = b->cap_temps;
    b->temps = NULL, b->temp_bytes = NULL, b->n_temps = b->cap_temps = 0;
    ts_status st = vk_exec_wait_all(ctx, d);
    vk_batch *nb = NULL;
    if (st == TS_OK)
        st = current(ctx, d, &nb);
    if (st != TS_OK || !nb) { /* nothing runs any more: free them */
        for (int i = 0; i < n; i++)
            vk_free_addr(d, temps[i], tb[i]);
        free(temps), free(tb);
        return st;
    }
    /* the recording batch is fresh (its own lists empty): it takes them */
    free(nb->temps), free(nb->temp_bytes);
    nb->temps = temps, nb->temp_bytes = tb;
    nb->n_temps = n, nb->cap_temps = cap;
    return TS_OK;
}

ts_status vk_exec_wait_all(ts_ctx *ctx, vk_dev *d) {
    ts_status st = vk_graph_break(ctx, d);
    if (st == TS_OK)
        st = vk_exec_flush(ctx, d);
    for (int i = 0; i < VK_BATCHES && st == TS_OK; i++)
        st = batch_wait(ctx, d, &d->batch[(d->cur + i) % VK_BATCHES]);
    if (st == TS_OK)
        st = vk_graph_wait_all(ctx, d);
    return st;
}

bool vk_grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap)
        return true;
    int nc = *cap ? *cap * 2 : 16;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q)
        return false;
    *p = q;
    *cap = nc;
    return true;
}

void vk_exec_defer_block(vk_dev *d, vk_block *b) {
    if (d->active && vk_graph_hold_block(d, b))
        return;      /* a recorded plan may read it */
    if (d->active) { /* no room to hold it: run the plan so far, wait */
        vk_graph_break(d->ctx, d);
        vk_exec_wait_all(d->ctx, d);
        vk_block_release(d, b);
        return;
    }
    vk_batch *cur = &d->batch[d->cur];
    /* nothing queued reads it: free at once */
    bool idle = !cur->recording;
    for (int i = 0; i < VK_BATCHES && idle; i++)
        idle = !d->batch[i].submitted;
    if (idle || !vk_grow((void **)&cur->blocks, &cur->cap_blocks,
                         cur->n_blocks + 1, sizeof *cur->blocks)) {
        if (!idle)
            vk_exec_wait_all(d->ctx, d);
        vk_block_release(d, b);
        return;
    }
    if (!cur->recording) { /* hold it with the last submitted batch */
        vk_batch *last = &d->batch[(d->cur + VK_BATCHES - 1) % VK_BATCHES];
        if (last->submitted &&
            vk_grow((void **)&last->blocks, &last->cap_blocks,
                    last->n_blocks + 1, sizeof *last->blocks)) {
            last->blocks[last->n_blocks++] = b;
            return;
        }
        vk_exec_wait_all(d->ctx, d);
        vk_block_release(d, b);
        return;
    }
    cur->blocks[cur->n_blocks++] = b;
}

uint64_t vk_temp(ts_ctx *ctx, vk_dev *d, size_t bytes) {
    if (d->active) { /* freed when the recorded plan has run */
        uint64_t a = vk_alloc_addr(ctx, d, bytes);
        if (a && !vk_graph_hold_temp(d, a, bytes)) {
            vk_free_addr(d, a, bytes);
            ts_set_error(ctx, TS_ERR_OOM, "vulkan: out of memory");
            return 0;
        }
        return a;
    }
    vk_batch *b = NULL;
    if (current(ctx, d, &b) != TS_OK)
        return 0;
    int cap = b->cap_temps;
    if (!vk_grow((void **)&b->temps, &b->cap_temps, b->n_temps + 1,
                 sizeof *b->temps)) {
        ts_set_error(ctx, TS_ERR_OOM, "vulkan: out of memory");
        return 0;
    }
    if (b->cap_temps != cap) { /* temp_bytes grows alongside temps */
        size_t *tb = realloc(b->temp_bytes, sizeof *tb * (size_t)b->cap_temps);
        if (!tb) {
            b->cap_temps = cap;
            ts_set_error(ctx, TS_ERR_OOM, "vulkan: out of memory");
            return 0;
        }
        b->temp_bytes = tb;
    }
    uint64_t a = vk_alloc_addr(ctx, d, bytes);
    if (!a)
        return 0;
    b->temps[b->n_temps] = a;
    b->temp_bytes[b->n_temps++] = bytes;
    return a;
}

/* ---- pipelines ---- */

static int shader_index(const char *name) {
    for (int i = 0; i < vk_shader_count; i++)
        if (!strcmp(vk_shader_table[i].name, name))
            return i;
    return -1;
}

static ts_status pipeline(ts_ctx *ctx, vk_dev *d, const vk_launch_desc *l,
                          VkPipeline *out) {
    int si = shader_index(l->shader);
    if (si < 0)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "vulkan: no shader \"%s\" in this build",
                            l->shader);
    for (int i = 0; i < d->n_pipes; i++) {
        vk_pipe_entry *e = &d->pipes[i];
        if (e->shader == si && e->nspec == l->nspec &&
            !memcmp(e->spec, l->spec, sizeof(uint32_t) * (size_t)l->nspec)) {
            *out = e->pipe;
            return TS_OK;
        }
    }
    VkResult r;
    if (!d->modules[si]) {
        VkShaderModuleCreateInfo mi = {
            .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
            .codeSize = vk_shader_table[si].bytes,
            .pCode = vk_shader_table[si].code};
        r = vkCreateShaderModule(d->dev, &mi, NULL, &d->modules[si]);
        if (r != VK_SUCCESS)
            return vk_fail(ctx, d, r, "vkCreateShaderModule");
    }
    VkSpecializationMapEntry map[VK_MAX_SPEC];
    for (int i = 0; i < l->nspec; i++)
        map[i] = (VkSpecializationMapEntry){(uint32_t)i, (uint32_t)(4 * i), 4};
    VkSpecializationInfo spec = {.mapEntryCount = (uint32_t)l->nspec,
                                 .pMapEntries = map,
                                 .dataSize = 4 * (size_t)l->nspec,
                                 .pData = l->spec};
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = d->modules[si],
                  .pName = "main",
                  .pSpecializationInfo = l->nspec ? &spec : NULL},
        .layout = d->layout};
    VkPipeline p;
    r = vkCreateComputePipelines(d->dev, d->cache, 1, &ci, NULL, &p);
    if (r != VK_SUCCESS)
        return vk_fail(ctx, d, r, "vkCreateComputePipelines");
    if (!vk_grow((void **)&d->pipes, &d->cap_pipes, d->n_pipes + 1,
                 sizeof *d->pipes)) {
        vkDestroyPipeline(d->dev, p, NULL);
        return ts_set_error(ctx, TS_ERR_OOM, "vulkan: out of memory");
    }
    vk_pipe_entry *e = &d->pipes[d->n_pipes++];
    d->n_pipes_built++;
    memset(e, 0, sizeof *e);
    e->shader = si;
    e->nspec = l->nspec;
    memcpy(e->spec, l->spec, sizeof(uint32_t) * (size_t)l->nspec);
    e->pipe = p;
    *out = p;
    return TS_OK;
}

/* every earlier write (kernel or copy) visible to every later access */
void vk_barrier(VkCommandBuffer cb) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT |
                                           VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT |
                                           VK_ACCESS_SHADER_WRITE_BIT |
                                           VK_ACCESS_TRANSFER_READ_BIT |
                                           VK_ACCESS_TRANSFER_WRITE_BIT};
    vkCmdPipelineBarrier(
        cb,
        VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
        VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
        0, 1, &mb, 0, NULL, 0, NULL);
}

/* room for bytes in the current batch's host-visible arena: its host
 * pointer and device address (a full arena submits the batch first) */
static ts_status arena_take(ts_ctx *ctx, vk_dev *d, size_t bytes, vk_batch **bo,
                            void **host, uint64_t *dev) {
    vk_batch *b = NULL;
    ts_status st = current(ctx, d, &b);
    size_t off = (b ? b->params_used + 15 : 0) & ~(size_t)15;
    if (st == TS_OK && off + bytes > VK_PARAM_ARENA) {
        st = vk_exec_flush(ctx, d);
        if (st == TS_OK)
            st = current(ctx, d, &b);
        off = 0;
    }
    if (st != TS_OK)
        return st;
    b->params_used = off + bytes;
    *bo = b;
    *host = (char *)b->params.map + off;
    *dev = b->params.addr + off;
    return TS_OK;
}

ts_status vk_launch(ts_ctx *ctx, vk_dev *d, const vk_launch_desc *l) {
    if (l->params_bytes > VK_MAX_PARAMS || l->nspec > VK_MAX_SPEC)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "vulkan: launch of %s: %zu bytes of params, %d "
                            "specialization constants (at most %d, %d)",
                            l->shader, l->params_bytes, l->nspec, VK_MAX_PARAMS,
                            VK_MAX_SPEC);
    VkPipeline p = VK_NULL_HANDLE;
    ts_status st = pipeline(ctx, d, l, &p);
    if (st != TS_OK)
        return st;
    uint32_t g[3];
    for (int i = 0; i < 3; i++) {
        g[i] = l->groups[i] ? l->groups[i] : 1;
        if (g[i] > d->lim.max_groups[i])
            return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                                "vulkan:%d: %s needs %u workgroups in "
                                "dimension %d (the device allows %u)",
                                d->index, l->shader, g[i], i,
                                d->lim.max_groups[i]);
    }
    d->launches++;
    /* a compiled plan being recorded or replayed takes it */
    if (d->active &&
        vk_graph_launch(ctx, d, p, g, l->params, l->params_bytes, &st))
        return st;
    if (st != TS_OK)
        return st;
    return vk_launch_raw(ctx, d, p, g, l->params, l->params_bytes);
}

ts_status vk_launch_raw(ts_ctx *ctx, vk_dev *d, VkPipeline p,
                        const uint32_t g[3], const void *params, size_t bytes) {
    vk_batch *b = NULL;
    void *host;
    uint64_t addr;
    ts_status st = arena_take(ctx, d, bytes ? bytes : 16, &b, &host, &addr);
    if (st != TS_OK)
        return st;
    if (bytes)
        memcpy(host, params, bytes);
    vkCmdBindPipeline(b->cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
    vkCmdPushConstants(b->cb, d->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, 8,
                       &addr);
    vkCmdDispatch(b->cb, g[0], g[1], g[2]);
    vk_barrier(b->cb);
    if (++b->dispatches >= VK_BATCH_DISPATCHES)
        return vk_exec_flush(ctx, d);
    return TS_OK;
}

uint32_t vk_groups_for(const vk_dev *d, int64_t n, int64_t per) {
    int64_t g = per > 0 ? (n + per - 1) / per : 1;
    if (g < 1)
        g = 1;
    /* at most 65535 (every device's x limit is at least that): kernels loop
     * over the rest with 32-bit indices, and i + stride must not pass
     * 2^31 (vk_desc keeps n below 2^31 - 2^26, stride <= 65535 x 1024) */
    int64_t cap = d->lim.max_groups[0] < 65535 ? d->lim.max_groups[0] : 65535;
    if (g > cap)
        g = cap;
    return (uint32_t)g;
}

ts_status vk_desc(ts_ctx *ctx, const ts_tensor *t, vk_tdesc *out) {
    return vk_desc_bcast(ctx, t, t->ndim, t->shape, out);
}

ts_status vk_desc_bcast(ts_ctx *ctx, const ts_tensor *t, int ndim,
                        const int64_t *shape, vk_tdesc *out) {
    memset(out, 0, sizeof *out);
    out->addr = vk_addr(t);
    out->dtype = (int32_t)t->dtype;
    out->ndim = ndim;
    int64_t n = 1, span = 0; /* elements; the farthest one's offset */
    for (int d = 0; d < ndim; d++) {
        int td = d - (ndim - t->ndim); /* t's dim aligned right */
        int64_t st = td >= 0 && t->shape[td] != 1 ? t->strides[td] : 0;
        if (shape[d] > INT32_MAX || st > INT32_MAX || st < INT32_MIN)
            return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                                "vulkan: a tensor dim of %lld or stride of "
                                "%lld elements is past the kernels' 32-bit "
                                "indexing",
                                (long long)shape[d], (long long)st);
        out->shape[d] = (int32_t)shape[d];
        out->stride[d] = (int32_t)st;
        n *= shape[d] ? shape[d] : 1;
        if (shape[d] > 1)
            span += (shape[d] - 1) * (st < 0 ? -st : st);
        if (n > VK_MAX_INDEX || span > VK_MAX_INDEX)
            break;
    }
    if (n > VK_MAX_INDEX || span > VK_MAX_INDEX)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "vulkan: a tensor of %lld elements reaching %lld "
                            "elements from its start is past the kernels' "
                            "32-bit indexing (at most %lld)",
                            (long long)n, (long long)span,
                            (long long)VK_MAX_INDEX);
    return TS_OK;
}

/* ---- transfers ---- */

/* a transfer's device side: addr's block buffer and offset. A transfer
 * ends a plan's recording or replay first (its commands cannot be
 * patched). */
static ts_status locate(ts_ctx *ctx, vk_dev *d, uint64_t addr, VkBuffer *buf,
                        VkDeviceSize *off) {
    ts_status st = vk_graph_break(ctx, d);
    if (st != TS_OK)
        return st;
    vk_block *b = vk_block_of(d, addr);
    if (!b)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "vulkan:%d: address 0x%llx is not device memory",
                            d->index, (unsigned long long)addr);
    *off = addr - b->raw.addr;
    *buf = b->raw.buf;
    return TS_OK;
}

static void copy_cmd(VkCommandBuffer cb, VkBuffer src, VkDeviceSize so,
                     VkBuffer dst, VkDeviceSize doff, VkDeviceSize n) {
    VkBufferCopy c = {so, doff, n};
    vkCmdCopyBuffer(cb, src, dst, 1, &c);
    vk_barrier(cb);
}

ts_status vk_upload(ts_ctx *ctx, vk_dev *d, uint64_t dst, const void *src,
                    size_t bytes) {
    VkBuffer db = VK_NULL_HANDLE;
    VkDeviceSize doff = 0;
    ts_status ls = bytes ? locate(ctx, d, dst, &db, &doff) : TS_OK;
    if (!bytes || ls != TS_OK)
        return ls;
    if (bytes <= 65536) { /* small: through the batch's arena, no wait */
        vk_batch *b = NULL;
        void *host;
        uint64_t a;
        ts_status st = arena_take(ctx, d, bytes, &b, &host, &a);
        if (st != TS_OK)
            return st;
        memcpy(host, src, bytes);
        copy_cmd(b->cb, b->params.buf, a - b->params.addr, db, doff, bytes);
        return TS_OK;
    }
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < VK_STAGING ? bytes - done : VK_STAGING;
        /* the staging buffer is free once everything queued is done */
        ts_status st = vk_exec_wait_all(ctx, d);
        vk_batch *b = NULL;
        if (st == TS_OK)
            st = current(ctx, d, &b);
        if (st != TS_OK)
            return st;
        memcpy(d->staging.map, (const char *)src + done, n);
        copy_cmd(b->cb, d->staging.buf, 0, db, doff + done, n);
        done += n;
    }
    return vk_exec_flush(ctx, d);
}

ts_status vk_download(ts_ctx *ctx, vk_dev *d, void *dst, uint64_t src,
                      size_t bytes) {
    VkBuffer sb = VK_NULL_HANDLE;
    VkDeviceSize soff = 0;
    ts_status ls = bytes ? locate(ctx, d, src, &sb, &soff) : TS_OK;
    if (!bytes || ls != TS_OK)
        return ls;
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < VK_STAGING ? bytes - done : VK_STAGING;
        vk_batch *b = NULL;
        ts_status st = current(ctx, d, &b);
        if (st != TS_OK)
            return st;
        copy_cmd(b->cb, sb, soff + done, d->staging.buf, 0, n);
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                              .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                              .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
        vkCmdPipelineBarrier(b->cb, VK_PIPELINE_STAGE_TRANSFER_BIT,
                             VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0,
                             NULL);
        st = vk_exec_wait_all(ctx, d);
        if (st != TS_OK)
            return st;
        memcpy((char *)dst + done, d->staging.map, n);
        done += n;
    }
    return TS_OK;
}

ts_status vk_copy_dev(ts_ctx *ctx, vk_dev *d, uint64_t dst, uint64_t src,
                      size_t bytes) {
    VkBuffer sb = VK_NULL_HANDLE, db = VK_NULL_HANDLE;
    VkDeviceSize so = 0, doff = 0;
    vk_batch *b = NULL;
    ts_status st = bytes ? locate(ctx, d, src, &sb, &so) : TS_OK;
    if (bytes && st == TS_OK)
        st = locate(ctx, d, dst, &db, &doff);
    if (bytes && st == TS_OK)
        st = current(ctx, d, &b);
    if (!bytes || st != TS_OK)
        return st;
    copy_cmd(b->cb, sb, so, db, doff, bytes);
    return TS_OK;
}

/* count elements of elem_bytes (2, 4 or 8) from pattern, by a kernel
 * (vkCmdFillBuffer wants 4-byte alignment, a bf16 view may not have it) */
ts_status vk_fill(ts_ctx *ctx, vk_dev *d, uint64_t dst, size_t count,
                  const void *pattern, size_t elem_bytes) {
    struct {
        uint64_t addr;
        uint64_t value;
        uint32_t count, elem_bytes;
    } p = {dst, 0, 0, (uint32_t)elem_bytes};
    memcpy(&p.value, pattern, elem_bytes);
    for (size_t done = 0; done < count;) {
        size_t n = count - done < (1u << 30) ? count - done : (1u << 30);
        p.addr = dst + done * elem_bytes;
        p.count = (uint32_t)n;
        ts_status st = vk_launch(
            ctx, d,
            &(vk_launch_desc){.shader = "core_fill",
                              .params = &p,
                              .params_bytes = sizeof p,
                              .groups = {vk_groups_for(d, (int64_t)n, 256)}});
        if (st != TS_OK)
            return st;
        done += n;
    }
    return TS_OK;
}
