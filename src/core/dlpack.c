/* dlpack.c — tensors in and out through DLPack (Debian's libdlpack-dev,
 * the unversioned DLManagedTensor that torch.utils.dlpack and numpy speak),
 * without copying: an exported tensor keeps a reference to its ts_tensor
 * until the consumer calls the deleter; an imported one keeps the
 * producer's DLManagedTensor until the storage dies, then calls its
 * deleter. Host memory only: a device tensor is first copied to the host
 * by its owner (ts_to_device). Must not touch the graph: a pending tensor
 * is materialized through ts_materialize like any read. */
#include "core/core.h"

#include <dlpack/dlpack.h>
#include <stdlib.h>
#include <string.h>

/* the exported tensor and the arrays its DLTensor points at */
typedef struct {
    DLManagedTensor m;
    ts_tensor *t;
    int64_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS];
} export_ctx;

static void export_deleter(DLManagedTensor *m) {
    export_ctx *e = m->manager_ctx;
    ts_release(e->t);
    free(e);
}

static bool dl_dtype_of(ts_dtype dt, DLDataType *out) {
    static const DLDataType map[TS_DTYPE_COUNT] = {
        [TS_F32] = {kDLFloat, 32, 1}, [TS_BF16] = {kDLBfloat, 16, 1},
        [TS_F16] = {kDLFloat, 16, 1}, [TS_I32] = {kDLInt, 32, 1},
        [TS_I64] = {kDLInt, 64, 1},
    };
    if ((unsigned)dt >= TS_DTYPE_COUNT || ts_dtype_is_quantized(dt))
        return false; /* DLPack has no block formats */
    *out = map[dt];
    return true;
}

ts_status ts_to_dlpack(ts_tensor *t, struct DLManagedTensor **out) {
    if (!out)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    if (!t)
        return TS_ERR_INVALID_ARG;
    ts_ctx *ctx = t->ctx;
    if (t->storage->device.kind != TS_DEVICE_CPU) {
        char dn[16];
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "DLPack export: the tensor is on %s; only host "
                            "memory is exported (copy it to cpu first)",
                            ts_device_name(t->storage->device, dn));
    }
    ts_status st = ts_materialize(t);
    if (st != TS_OK)
        return st;
    export_ctx *e = calloc(1, sizeof *e);
    if (!e)
        return ts_set_error(ctx, TS_ERR_OOM, "out of memory (DLPack export)");
    e->t = ts_retain(t);
    for (int d = 0; d < t->ndim; d++)
        e->shape[d] = t->shape[d], e->strides[d] = t->strides[d];
    DLTensor *dl = &e->m.dl_tensor;
    dl->data = ts_tensor_ptr(t); /* byte_offset 0: data is element [0..0] */
    dl->device = (DLDevice){kDLCPU, 0};
    dl->ndim = t->ndim;
    dl_dtype_of(t->dtype, &dl->dtype);
    dl->shape = e->shape;
    dl->strides = e->strides;
    dl->byte_offset = 0;
    e->m.manager_ctx = e;
    e->m.deleter = export_deleter;
    *out = &e->m;
    return TS_OK;
}

static void import_release(void *owner) {
    DLManagedTensor *m = owner;
    if (m->deleter)
        m->deleter(m);
}

static bool ts_dtype_of(DLDataType d, ts_dtype *out) {
    if (d.lanes != 1)
        return false;
    if (d.code == kDLFloat && d.bits == 32)
        *out = TS_F32;
    else if (d.code == kDLFloat && d.bits == 16)
        *out = TS_F16;
    else if (d.code == kDLBfloat && d.bits == 16)
        *out = TS_BF16;
    else if (d.code == kDLInt && d.bits == 32)
        *out = TS_I32;
    else if (d.code == kDLInt && d.bits == 64)
        *out = TS_I64;
    else
        return false;
    return true;
}

/* "float64", "uint8", "complex64", "bool", "float32x4" as NumPy and
 * PyTorch name them */
static const char *dl_dtype_name(DLDataType d, char *buf, size_t n) {
    const char *kind = d.code == kDLInt      ? "int"
                       : d.code == kDLUInt   ? "uint"
                       : d.code == kDLFloat  ? "float"
                       : d.code == kDLBfloat ? "bfloat"
                       : d.code == 5         ? "complex" /* kDLComplex */
                       : d.code == 6         ? "bool"    /* kDLBool */
                                             : NULL;
    if (!kind)
        snprintf(buf, n, "(code %u, %u bits)", d.code, d.bits);
    else if (d.code == 6)
        snprintf(buf, n, "bool");
    else
        snprintf(buf, n, "%s%u", kind, d.bits);
    if (d.lanes != 1) {
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "x%u", d.lanes);
    }
    return buf;
}

ts_tensor *ts_from_dlpack(ts_ctx *ctx, struct DLManagedTensor *m) {
    if (!ctx)
        return NULL;
    if (!m) {
        ts_set_error(ctx, TS_ERR_INVALID_ARG, "DLPack import: no tensor");
        return NULL;
    }
    const DLTensor *dl = &m->dl_tensor;
    ts_dtype dt = TS_F32;
    const char *why = NULL;
    char wb[160];
    if (dl->device.device_type != kDLCPU &&
        dl->device.device_type != kDLCUDAHost) {
        snprintf(wb, sizeof wb, "its device type %d is not host memory",
                 (int)dl->device.device_type);
        why = wb;
    } else if (!ts_dtype_of(dl->dtype, &dt)) {
        char dn[48];
        snprintf(wb, sizeof wb,
                 "dtype %s is not a Tessera dtype (float32, bfloat16, "
                 "float16, int32, int64)",
                 dl_dtype_name(dl->dtype, dn, sizeof dn));
        why = wb;
    } else if (dl->ndim < 0 || dl->ndim > TS_MAX_DIMS) {
        snprintf(wb, sizeof wb, "it has %d dims (at most %d)", dl->ndim,
                 TS_MAX_DIMS);
        why = wb;
    }
    size_t es = ts_dtype_size(dt);
    if (!why && dl->byte_offset % es)
        why = "its byte_offset is not a multiple of the element size";
    /* the span of elements the view reaches: [0, span) from data */
    int64_t span = 1, strides[TS_MAX_DIMS];
    bool empty = false;
    for (int d = 0; !why && d < dl->ndim; d++) {
        if (dl->shape[d] < 0)
            why = "it has a negative size";
        else if (dl->shape[d] == 0)
            empty = true;
    }
    if (!why) {
        if (dl->strides)
            memcpy(strides, dl->strides, sizeof(int64_t) * (size_t)dl->ndim);
        else
            ts_contiguous_strides(dl->ndim, dl->shape, strides);
        for (int d = 0; d < dl->ndim && !why; d++) {
            if (strides[d] < 0)
                why = "it has a negative stride";
            else if (!empty)
                span += strides[d] * (dl->shape[d] - 1);
        }
    }
    if (why) {
        ts_set_error(ctx, TS_ERR_UNSUPPORTED, "DLPack import: %s", why);
        return NULL; /* the producer keeps ownership of m */
    }
    if (empty)
        span = 0;
    int64_t flat[1] = {span};
    char *base = (char *)dl->data + dl->byte_offset;
    ts_tensor *whole =
        ts_tensor_wrap(ctx, dt, 1, flat, base, m, import_release);
    if (!whole)
        return NULL;
    ts_tensor *t = ts_tensor_view_of(whole, dl->ndim, dl->shape, strides, 0);
    if (!t) /* failed: m stays the caller's */
        whole->storage->owner_release = NULL;
    ts_release(whole); /* the view keeps the storage, and so m */
    return t;
}
