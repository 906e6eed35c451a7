/* device.c — devices as the runtime sees them: the current device of a
 * context, device names, explicit transfers (ts_to_device) with their
 * statistics, and device_map strings (which device holds the embedding,
 * each decoder layer and the head). The memory of each device is counted
 * where storages are made (tensor.c); ops refuse inputs on different
 * devices (node.c). */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a kind this build has and an index within TS_MAX_DEVICES (whether the
 * machine has the device is the backend's to say) */
static bool device_valid(ts_device d) {
    return (unsigned)d.kind < TS_DEVICE_KINDS && ts_backend_of(d.kind) &&
           d.index >= 0 && d.index < TS_MAX_DEVICES;
}

static const char *const kind_names[TS_DEVICE_KINDS] = {"cpu", "vulkan"};

/* d exists on this machine; else the error names the devices there are */
static ts_status device_check(ts_ctx *ctx, ts_device d) {
    if ((unsigned)d.kind >= TS_DEVICE_KINDS || !ts_backend_of(d.kind))
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "device kind %d: this build has no such backend",
                            (int)d.kind);
    if (d.index < 0 || d.index >= TS_MAX_DEVICES)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "device %s:%d: the index must be 0..%d",
                            kind_names[d.kind], d.index, TS_MAX_DEVICES - 1);
    if (d.kind == TS_DEVICE_CPU)
        return TS_OK;
    int n = ts_device_count(ctx, d.kind);
    if (n == 0)
        return ctx->status; /* the backend said why */
    if (d.index >= n)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "device %s:%d: this machine has %s:0..%s:%d",
                            kind_names[d.kind], d.index, kind_names[d.kind],
                            kind_names[d.kind], n - 1);
    return TS_OK;
}

int ts_device_count(ts_ctx *ctx, ts_device_kind kind) {
    if (!ctx)
        return 0;
    const ts_backend *b =
        (unsigned)kind < TS_DEVICE_KINDS ? ts_backend_of(kind) : NULL;
    if (!b) {
        ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                     "this build has no %s backend (built without %s)",
                     (unsigned)kind < TS_DEVICE_KINDS ? kind_names[kind] : "?",
                     kind == TS_DEVICE_VULKAN ? "libvulkan-dev and glslc"
                                              : "it");
        return 0;
    }
    return b->count(ctx);
}

ts_status ts_device_info_get(ts_ctx *ctx, ts_device d, ts_device_info *out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "device info: NULL");
    ts_status st = device_check(ctx, d);
    return st ? st : ts_backend_of(d.kind)->info(ctx, d.index, out);
}

ts_status ts_device_sync(ts_ctx *ctx, ts_device d) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!device_valid(d))
        return device_check(ctx, d);
    ts_status st = ts_sync(ctx); /* recorded work first */
    return st ? st : ts_backend_of(d.kind)->sync(ctx, d.index);
}

ts_status ts_set_device(ts_ctx *ctx, ts_device d) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    ts_status st = device_check(ctx, d);
    if (st != TS_OK)
        return st;
    ctx->device = d;
    return TS_OK;
}

ts_device ts_get_device(const ts_ctx *ctx) {
    return ctx ? ctx->device : (ts_device){TS_DEVICE_CPU, 0};
}

bool ts_device_equal(ts_device a, ts_device b) {
    return a.kind == b.kind && a.index == b.index;
}

const char *ts_device_name(ts_device d, char *buf) {
    snprintf(buf, 16, "%s:%d",
             (unsigned)d.kind < TS_DEVICE_KINDS ? kind_names[d.kind] : "?",
             d.index);
    return buf;
}

ts_status ts_device_parse(ts_ctx *ctx, const char *s, ts_device *out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!s || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "device: NULL argument");
    const char *colon = strchr(s, ':');
    size_t kl = colon ? (size_t)(colon - s) : strlen(s);
    int kind = -1;
    for (int k = 0; k < TS_DEVICE_KINDS; k++)
        if (kl == strlen(kind_names[k]) && !strncmp(s, kind_names[k], kl))
            kind = k;
    if (kind < 0) {
        if ((kl == 4 && !strncmp(s, "cuda", 4)) ||
            (kl == 3 && !strncmp(s, "tpu", 3)))
            return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                                "device \"%s\": this build has no %.*s "
                                "backend (devices: cpu:0..cpu:%d, vulkan:N)",
                                s, (int)kl, s, TS_MAX_DEVICES - 1);
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "device \"%s\": expected cpu, cpu:N, vulkan or "
                            "vulkan:N",
                            s);
    }
    int idx = 0;
    if (colon) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || v < 0 || v >= TS_MAX_DEVICES)
            return ts_set_error(ctx, TS_ERR_RANGE,
                                "device \"%s\": the index must be 0..%d", s,
                                TS_MAX_DEVICES - 1);
        idx = (int)v;
    }
    ts_device d = {(ts_device_kind)kind, idx};
    ts_status st = device_check(ctx, d);
    if (st != TS_OK)
        return st;
    *out = d;
    return TS_OK;
}

void ts_device_get_stats(const ts_ctx *ctx, ts_device d, ts_device_stats *out) {
    if (!ctx || !out)
        return;
    memset(out, 0, sizeof *out);
    if ((unsigned)d.kind < TS_DEVICE_KINDS && d.index >= 0 &&
        d.index < TS_MAX_DEVICES)
        *out = ctx->dev_stats[d.kind][d.index];
}

ts_tensor *ts_to_device(ts_tensor *t, ts_device d) {
    if (!t)
        return NULL;
    ts_ctx *ctx = t->ctx;
    if (device_check(ctx, d) != TS_OK)
        return NULL;
    if (ts_device_equal(ts_tensor_device(t), d))
        return ts_retain(t);
    ts_tensor *c = ts_contiguous(t); /* on t's device */
    if (!c || ts_materialize(c) != TS_OK) {
        ts_release(c);
        return NULL;
    }
    ts_device from = c->storage->device;
    ts_device old = ctx->device;
    ctx->device = d;
    ts_tensor *out = ts_tensor_new(ctx, t->dtype, t->ndim, t->shape);
    ctx->device = old;
    size_t bytes = (size_t)ts_dtype_nbytes(t->dtype, ts_tensor_numel(c));
    ts_status st = out ? TS_OK : ctx->status;
    if (st == TS_OK && bytes) {
        const ts_backend *src = ts_backend_of(from.kind),
                         *dst = ts_backend_of(d.kind);
        if (from.kind == TS_DEVICE_CPU) /* host to device (or host pool) */
            st = dst->upload(ctx, d.index, out->storage->data, ts_tensor_ptr(c),
                             bytes);
        else if (d.kind == TS_DEVICE_CPU) /* device to host */
            st = src->download(ctx, from.index, out->storage->data,
                               ts_tensor_ptr(c), bytes);
        else if (from.kind == d.kind && from.index == d.index)
            st = dst->copy(ctx, d.index, out->storage->data, ts_tensor_ptr(c),
                           bytes);
        else { /* between two devices: through the host */
            void *tmp = malloc(bytes);
            st = tmp ? src->download(ctx, from.index, tmp, ts_tensor_ptr(c),
                                     bytes)
                     : ts_set_error(ctx, TS_ERR_OOM,
                                    "ts_to_device: out of host memory");
            if (st == TS_OK)
                st = dst->upload(ctx, d.index, out->storage->data, tmp, bytes);
            free(tmp);
        }
    }
    if (st != TS_OK) {
        ts_release(out);
        ts_release(c);
        return NULL;
    }
    if (from.kind == TS_DEVICE_CPU && d.kind != TS_DEVICE_CPU &&
        bytes <= 65536) { /* small host data: keep the host's bytes */
        out->storage->shadow = malloc(bytes);
        if (out->storage->shadow)
            memcpy(out->storage->shadow, ts_tensor_ptr(c), bytes);
    }
    ctx->dev_stats[d.kind][d.index].transfers_in++;
    ctx->dev_stats[d.kind][d.index].bytes_in += bytes;
    ts_release(c);
    return out;
}

/* ---- device_map ---- */

ts_status ts_device_map_auto(ts_ctx *ctx, int n_layers, size_t layer_bytes,
                             size_t other_bytes, ts_device_map *out) {
    memset(out, 0, sizeof *out);
    out->n_layers = n_layers;
    out->layer = calloc((size_t)n_layers + 1, sizeof *out->layer);
    if (!out->layer)
        return ts_set_error(ctx, TS_ERR_OOM, "device_map: out of memory");
    ts_device cpu = {TS_DEVICE_CPU, 0}, gpu = {TS_DEVICE_VULKAN, 0};
    ts_status keep = ctx->status;
    char keep_msg[sizeof ctx->errmsg];
    memcpy(keep_msg, ctx->errmsg, sizeof keep_msg);
    ts_device_info info;
    bool have = ts_device_count(ctx, TS_DEVICE_VULKAN) > 0 &&
                ts_device_info_get(ctx, gpu, &info) == TS_OK;
    /* no GPU is not an error here: all on the host */
    ctx->status = keep;
    memcpy(ctx->errmsg, keep_msg, sizeof keep_msg);
    /* 90% of what is free, less a tenth kept for activations and KV */
    size_t room = have ? info.free_bytes / 10 * 8 : 0;
    int on_gpu = 0;
    if (have && other_bytes <= room) {
        room -= other_bytes;
        while (on_gpu < n_layers && (layer_bytes == 0 || layer_bytes <= room)) {
            room -= layer_bytes;
            on_gpu++;
        }
    }
    bool any = have && other_bytes <= (have ? info.free_bytes / 10 * 8 : 0);
    out->embed = any ? gpu : cpu;
    for (int l = 0; l < n_layers; l++)
        out->layer[l] = l < on_gpu ? gpu : cpu;
    out->head = any && on_gpu == n_layers ? gpu : cpu;
    return TS_OK;
}

void ts_device_map_free(ts_device_map *m) {
    if (m) {
        free(m->layer);
        m->layer = NULL;
    }
}

int ts_device_map_count(const ts_device_map *m) {
    bool used[TS_DEVICE_KINDS][TS_MAX_DEVICES] = {{0}};
    used[m->embed.kind][m->embed.index] = true;
    used[m->head.kind][m->head.index] = true;
    for (int i = 0; i < m->n_layers; i++)
        used[m->layer[i].kind][m->layer[i].index] = true;
    int n = 0;
    for (int k = 0; k < TS_DEVICE_KINDS; k++)
        for (int i = 0; i < TS_MAX_DEVICES; i++)
            n += used[k][i];
    return n;
}

/* one ITEMS list: marks what it names with d; counts placements */
static ts_status place_items(ts_ctx *ctx, const char *spec, char *items,
                             ts_device d, ts_device_map *m, int *placed) {
    for (char *save = NULL, *it = strtok_r(items, ",", &save); it;
         it = strtok_r(NULL, ",", &save)) {
        int lo, hi;
        char *end;
        if (!strcmp(it, "embed")) {
            if (placed[0]++)
                return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                    "device_map \"%s\": embed placed twice",
                                    spec);
            m->embed = d;
            continue;
        }
        if (!strcmp(it, "head")) {
            if (placed[1]++)
                return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                    "device_map \"%s\": head placed twice",
                                    spec);
            m->head = d;
            continue;
        }
        lo = (int)strtol(it, &end, 10);
        if (end == it)
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "device_map \"%s\": \"%s\" is not embed, "
                                "head, a layer or a range of layers",
                                spec, it);
        hi = lo;
        if (*end == '-') {
            char *e2;
            hi = (int)strtol(end + 1, &e2, 10);
            if (e2 == end + 1 || *e2)
                return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                    "device_map \"%s\": bad range \"%s\"", spec,
                                    it);
        } else if (*end)
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "device_map \"%s\": bad item \"%s\"", spec, it);
        if (lo < 0 || hi < lo || hi >= m->n_layers)
            return ts_set_error(ctx, TS_ERR_RANGE,
                                "device_map \"%s\": layers %s outside the "
                                "model's 0-%d",
                                spec, it, m->n_layers - 1);
        for (int l = lo; l <= hi; l++) {
            if (placed[2 + l]++)
                return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                    "device_map \"%s\": layer %d placed twice",
                                    spec, l);
            m->layer[l] = d;
        }
    }
    return TS_OK;
}

ts_status ts_device_map_parse(ts_ctx *ctx, const char *spec, int n_layers,
                              ts_device_map *out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!spec || !out || n_layers < 0)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "device_map: NULL or bad argument");
    memset(out, 0, sizeof *out);
    out->n_layers = n_layers;
    out->layer = calloc((size_t)n_layers + 1, sizeof *out->layer);
    if (!out->layer)
        return ts_set_error(ctx, TS_ERR_OOM, "device_map: out of memory");
    ts_device one;
    if (!strcmp(spec, "auto"))
        return ts_device_map_auto(ctx, n_layers, 0, 0, out);
    /* one device: no groups, and not "ITEMS:DEVICE" (a layer range) */
    bool one_device = !strchr(spec, ';') && !strchr(spec, ',') &&
                      !(spec[0] >= '0' && spec[0] <= '9') &&
                      strncmp(spec, "embed:", 6) && strncmp(spec, "head:", 5);
    if (one_device) {
        one = (ts_device){TS_DEVICE_CPU, 0};
        if (ts_device_parse(ctx, spec, &one) != TS_OK) {
            ts_device_map_free(out);
            return ctx->status;
        }
        out->embed = out->head = one;
        for (int l = 0; l < n_layers; l++)
            out->layer[l] = one;
        return TS_OK;
    }
    char *copy = strdup(spec);
    int *placed = calloc((size_t)n_layers + 2, sizeof *placed);
    ts_status s = copy && placed ? TS_OK
                                 : ts_set_error(ctx, TS_ERR_OOM,
                                                "device_map: out of memory");
    for (char *save = NULL, *grp = s ? NULL : strtok_r(copy, ";", &save);
         grp && s == TS_OK; grp = strtok_r(NULL, ";", &save)) {
        /* ITEMS:DEVICE where DEVICE itself may hold a ':' (cpu:1) */
        char *colon = strchr(grp, ':');
        if (!colon) {
            s = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                             "device_map \"%s\": group \"%s\" has no "
                             "\":DEVICE\"",
                             spec, grp);
            break;
        }
        *colon = 0;
        ts_device d;
        if ((s = ts_device_parse(ctx, colon + 1, &d)) != TS_OK)
            break;
        s = place_items(ctx, spec, grp, d, out, placed);
    }
    for (int k = 0; s == TS_OK && k < n_layers + 2; k++)
        if (!placed[k]) {
            char what[32];
            if (k < 2)
                snprintf(what, sizeof what, "%s", k ? "head" : "embed");
            else
                snprintf(what, sizeof what, "layer %d", k - 2);
            s = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                             "device_map \"%s\": %s is not placed", spec, what);
        }
    free(copy), free(placed);
    if (s != TS_OK)
        ts_device_map_free(out);
    return s;
}
