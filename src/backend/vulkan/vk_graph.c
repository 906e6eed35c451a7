/* vk_graph.c — a compiled plan's kernels recorded once into a command
 * buffer of their own and replayed on later calls with the same shapes
 * (the analogue of CUDA graphs).
 *
 * At a plan's first run on the device, every launch is recorded into the
 * graph's command buffer, with its parameters in the graph's own
 * host-visible arena at a fixed offset; the buffer is submitted at the
 * end. At later runs, the kernels compute their parameters as usual (new
 * inputs and results have new addresses) but vk_launch only writes them
 * over the recorded ones, checking that the launch is the one recorded
 * (shader, specialization, workgroups, size); the recorded buffer is then
 * submitted again, with no command recorded on the host. A launch that
 * differs, or anything else than a launch (a copy, a transfer), ends the
 * replay: what was patched so far runs as ordinary launches and the graph
 * is dropped for that plan (it runs as before, recorded per call). */
#include "backend/vulkan/vk_internal.h"

#include <stdlib.h>
#include <string.h>

#define VK_GRAPH_ARENA (4u << 20)

typedef struct {
    VkPipeline pipe;
    uint32_t groups[3];
    size_t off, bytes;
} vk_rec;

struct vk_graph {
    vk_dev *d;
    VkCommandBuffer cb;
    VkFence fence;
    bool submitted;
    enum { G_NEW, G_RECORDED, G_OFF } state;
    vk_raw params;
    size_t used;
    vk_rec *rec;
    int n, cap, cursor;
    /* memory the recorded kernels may still read: freed at the fence */
    uint64_t *temps;
    size_t *temp_bytes;
    int n_temps, cap_temps;
    vk_block **blocks;
    int n_blocks, cap_blocks;
};

/* waits for the graph's last submission and frees what it held */
static ts_status graph_wait(ts_ctx *ctx, vk_graph *g) {
    vk_dev *d = g->d;
    if (g->submitted) {
        VkResult r =
            vkWaitForFences(d->dev, 1, &g->fence, VK_TRUE, vk_wait_ns());
        if (r != VK_SUCCESS) {
            if (r == VK_TIMEOUT)
                d->lost = true;
            return vk_fail(ctx, d, r == VK_TIMEOUT ? VK_ERROR_DEVICE_LOST : r,
                           "waiting for a recorded plan");
        }
        vkResetFences(d->dev, 1, &g->fence);
        g->submitted = false;
    }
    for (int i = 0; i < g->n_temps; i++)
        vk_free_addr(d, g->temps[i], g->temp_bytes[i]);
    g->n_temps = 0;
    for (int i = 0; i < g->n_blocks; i++)
        vk_block_release(d, g->blocks[i]);
    g->n_blocks = 0;
    return TS_OK;
}

ts_status vk_graph_wait_all(ts_ctx *ctx, vk_dev *d) {
    ts_status st = TS_OK;
    for (int i = 0; i < d->n_graphs && st == TS_OK; i++)
        st = graph_wait(ctx, d->graphs[i]);
    return st;
}

static ts_status graph_new(ts_ctx *ctx, vk_dev *d, vk_graph **out) {
    vk_graph *g = calloc(1, sizeof *g);
    if (!g || !vk_grow((void **)&d->graphs, &d->cap_graphs, d->n_graphs + 1,
                       sizeof *d->graphs)) {
        free(g);
        return ts_set_error(ctx, TS_ERR_OOM, "vulkan: out of memory");
    }
    g->d = d;
    VkCommandBufferAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        .commandPool = d->pool,
        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        .commandBufferCount = 1};
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkResult r = vkAllocateCommandBuffers(d->dev, &ai, &g->cb);
    if (r == VK_SUCCESS)
        r = vkCreateFence(d->dev, &fi, NULL, &g->fence);
    ts_status st = r == VK_SUCCESS
                       ? vk_params_buffer(ctx, d, VK_GRAPH_ARENA, &g->params)
                       : vk_fail(ctx, d, r, "graph command buffer");
    d->graphs[d->n_graphs++] = g;
    *out = g;
    if (st != TS_OK)
        g->state = G_OFF;
    return st;
}

void vk_graph_free(void *handle) {
    vk_graph *g = handle;
    if (!g)
        return;
    vk_dev *d = g->d;
    graph_wait(d->ctx, g);
    for (int i = 0; i < d->n_graphs; i++)
        if (d->graphs[i] == g) {
            d->graphs[i] = d->graphs[--d->n_graphs];
            break;
        }
    if (d->active == g)
        d->active = NULL;
    if (g->fence)
        vkDestroyFence(d->dev, g->fence, NULL);
    if (g->cb)
        vkFreeCommandBuffers(d->dev, d->pool, 1, &g->cb);
    vk_host_buffer_free(d, &g->params);
    free(g->rec), free(g->temps), free(g->temp_bytes), free(g->blocks);
    free(g);
}

ts_status vk_graph_begin(ts_ctx *ctx, int dev, void **handle) {
    vk_dev *d = vk_dev_get(ctx, dev);
    if (!d)
        return ctx->status;
    vk_graph *g = *handle;
    ts_status st = TS_OK;
    if (!g)
        st = graph_new(ctx, d, &g), *handle = g;
    if (st != TS_OK || g->state == G_OFF)
        return st == TS_OK ? TS_OK : (ts_clear_error(ctx), TS_OK);
    /* earlier work first, in submission order; the last replay done
     * before its parameters are overwritten */
    st = vk_exec_flush(ctx, d);
    if (st == TS_OK)
        st = graph_wait(ctx, g);
    if (st != TS_OK)
        return st;
    if (g->state == G_NEW) {
        VkCommandBufferBeginInfo bi = {
            .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        VkResult r = vkBeginCommandBuffer(g->cb, &bi);
        if (r != VK_SUCCESS)
            return vk_fail(ctx, d, r, "vkBeginCommandBuffer (graph)");
        g->n = 0;
        g->used = 0;
    }
    g->cursor = 0;
    d->active = g;
    return TS_OK;
}

static ts_status submit(ts_ctx *ctx, vk_graph *g) {
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                       .commandBufferCount = 1,
                       .pCommandBuffers = &g->cb};
    VkResult r = vkQueueSubmit(g->d->queue, 1, &si, g->fence);
    if (r != VK_SUCCESS)
        return vk_fail(ctx, g->d, r, "vkQueueSubmit (graph)");
    g->submitted = true;
    g->d->submits++;
    return TS_OK;
}

/* stops using the graph for this plan: a recording is submitted as it
 * stands (its launches must run); a replay's patched launches run as
 * ordinary ones */
static ts_status graph_drop(ts_ctx *ctx, vk_graph *g) {
    vk_dev *d = g->d;
    d->active = NULL;
    ts_status st = TS_OK;
    if (g->state == G_NEW) {
        VkResult r = vkEndCommandBuffer(g->cb);
        st = r == VK_SUCCESS ? submit(ctx, g)
                             : vk_fail(ctx, d, r, "vkEndCommandBuffer");
    } else if (g->state == G_RECORDED) {
        for (int i = 0; i < g->cursor && st == TS_OK; i++)
            st = vk_launch_raw(ctx, d, g->rec[i].pipe, g->rec[i].groups,
                               (char *)g->params.map + g->rec[i].off,
                               g->rec[i].bytes);
    }
    g->state = G_OFF;
    return st;
}

ts_status vk_graph_end(ts_ctx *ctx, int dev, void *handle, bool ok) {
    (void)dev;
    vk_graph *g = handle;
    if (!g || g->state == G_OFF || g->d->active != g)
        return TS_OK;
    vk_dev *d = g->d;
    if (!ok || (g->state == G_RECORDED && g->cursor != g->n))
        return graph_drop(ctx, g);
    d->active = NULL;
    if (g->state == G_NEW) {
        VkResult r = vkEndCommandBuffer(g->cb);
        if (r != VK_SUCCESS) {
            g->state = G_OFF;
            return vk_fail(ctx, d, r, "vkEndCommandBuffer (graph)");
        }
        g->state = G_RECORDED;
    } else {
        ctx->cstats.device_replays++;
    }
    return submit(ctx, g);
}

/* a launch while a graph is active: recorded, or written over the
 * recorded one's parameters. Returns false when the graph had to be
 * dropped (the caller then launches as usual). */
bool vk_graph_launch(ts_ctx *ctx, vk_dev *d, VkPipeline pipe,
                     const uint32_t g3[3], const void *params, size_t bytes,
                     ts_status *st) {
    vk_graph *g = d->active;
    *st = TS_OK;
    size_t b = bytes ? bytes : 16;
    if (g->state == G_RECORDED) {
        vk_rec *r = g->cursor < g->n ? &g->rec[g->cursor] : NULL;
        if (!r || r->pipe != pipe || r->bytes != b ||
            memcmp(r->groups, g3, sizeof r->groups)) {
            *st = graph_drop(ctx, g);
            return false;
        }
        memcpy((char *)g->params.map + r->off, params, bytes);
        g->cursor++;
        return true;
    }
    size_t off = (g->used + 15) & ~(size_t)15;
    if (off + b > VK_GRAPH_ARENA ||
        !vk_grow((void **)&g->rec, &g->cap, g->n + 1, sizeof *g->rec)) {
        *st = graph_drop(ctx, g);
        return false;
    }
    g->used = off + b;
    memcpy((char *)g->params.map + off, params, bytes);
    uint64_t addr = g->params.addr + off;
    vkCmdBindPipeline(g->cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    vkCmdPushConstants(g->cb, d->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, 8,
                       &addr);
    vkCmdDispatch(g->cb, g3[0], g3[1], g3[2]);
    vk_barrier(g->cb);
    g->rec[g->n++] = (vk_rec){pipe, {g3[0], g3[1], g3[2]}, off, b};
    return true;
}

/* anything but a launch ends the graph (its commands could not be
 * patched); the caller goes on as usual */
ts_status vk_graph_break(ts_ctx *ctx, vk_dev *d) {
    return d->active ? graph_drop(ctx, d->active) : TS_OK;
}

/* temporary memory and freed blocks of a graph's kernels: kept until the
 * graph's submission is done */
bool vk_graph_hold_temp(vk_dev *d, uint64_t addr, size_t bytes) {
    vk_graph *g = d->active;
    int cap = g->cap_temps;
    if (!vk_grow((void **)&g->temps, &g->cap_temps, g->n_temps + 1,
                 sizeof *g->temps))
        return false;
    if (g->cap_temps != cap) {
        size_t *tb = realloc(g->temp_bytes, sizeof *tb * (size_t)g->cap_temps);
        if (!tb) {
            g->cap_temps = cap;
            return false;
        }
        g->temp_bytes = tb;
    }
    g->temps[g->n_temps] = addr;
    g->temp_bytes[g->n_temps++] = bytes;
    return true;
}

bool vk_graph_hold_block(vk_dev *d, vk_block *b) {
    vk_graph *g = d->active;
    if (!vk_grow((void **)&g->blocks, &g->cap_blocks, g->n_blocks + 1,
                 sizeof *g->blocks))
        return false;
    g->blocks[g->n_blocks++] = b;
    return true;
}
