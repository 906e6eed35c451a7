/* npy.c — NumPy's .npy arrays to and from tensors: the magic, the
 * version's header length, the header's Python dict literal ('descr',
 * 'fortran_order', 'shape') parsed strictly, then C-order little-endian
 * data; written atomically with the header padded to 64 bytes as NumPy
 * does. Owns no other array format. */
#include "core/core.h"
#include "tessera_io.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NPY_MAX_HEADER (1 << 20)

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

/* The value text after 'key': in the header dict, or NULL. */
static const char *npy_value(const char *hdr, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(hdr, pat);
    if (!p) {
        snprintf(pat, sizeof pat, "\"%s\"", key);
        p = strstr(hdr, pat);
    }
    if (!p)
        return NULL;
    p += strlen(pat);
    while (*p == ' ')
        p++;
    if (*p != ':')
        return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

/* Parses the header dict; false with why set. */
static bool npy_parse_header(const char *hdr, char *descr, bool *fortran,
                             int *ndim, int64_t *shape, char *why,
                             size_t why_n) {
    const char *d = npy_value(hdr, "descr");
    if (!d || (*d != '\'' && *d != '"')) {
        snprintf(why, why_n, "header has no 'descr' string");
        return false;
    }
    char q = *d++;
    const char *e = strchr(d, q);
    if (!e || e - d >= 16) {
        snprintf(why, why_n, "header's 'descr' is malformed");
        return false;
    }
    memcpy(descr, d, (size_t)(e - d));
    descr[e - d] = 0;
    const char *f = npy_value(hdr, "fortran_order");
    if (!f || (strncmp(f, "True", 4) && strncmp(f, "False", 5))) {
        snprintf(why, why_n, "header has no 'fortran_order' True/False");
        return false;
    }
    *fortran = !strncmp(f, "True", 4);
    const char *s = npy_value(hdr, "shape");
    if (!s || *s != '(') {
        snprintf(why, why_n, "header has no 'shape' tuple");
        return false;
    }
    s++;
    int n = 0;
    for (;;) {
        while (*s == ' ')
            s++;
        if (*s == ')')
            break;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 0 || errno) {
            snprintf(why, why_n, "header's 'shape' is malformed");
            return false;
        }
        if (n >= TS_MAX_DIMS) {
            snprintf(why, why_n, "more than %d dims", TS_MAX_DIMS);
            return false;
        }
        shape[n++] = v;
        s = end;
        while (*s == ' ')
            s++;
        if (*s == 'L') /* Python 2's long */
            s++;
        if (*s == ',')
            s++;
        else if (*s != ')') {
            snprintf(why, why_n, "header's 'shape' is malformed");
            return false;
        }
    }
    *ndim = n;
    return true;
}

ts_tensor *ts_npy_read(ts_ctx *ctx, const char *path) {
    if (!path) {
        ts_set_error(ctx, TS_ERR_INVALID_ARG, "ts_npy_read: path is NULL");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        ts_set_error(ctx, TS_ERR_IO, "cannot read %s: %s", path,
                     strerror(errno));
        return NULL;
    }
    unsigned char pre[12];
    size_t got = fread(pre, 1, 10, f);
    if (got < 10 || memcmp(pre, npy_magic, 6)) {
        fclose(f);
        ts_set_error(ctx, TS_ERR_IO, "%s: not a .npy file (bad magic)", path);
        return NULL;
    }
    int major = pre[6];
    size_t hlen;
    if (major == 1) {
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
    } else if (major == 2 || major == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) {
            fclose(f);
            ts_set_error(ctx, TS_ERR_IO, "%s: truncated .npy header", path);
            return NULL;
        }
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 |
               (size_t)pre[11] << 24;
    } else {
        fclose(f);
        ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                     "%s: .npy format version %d.%d (known: 1.0, 2.0, 3.0)",
                     path, major, pre[7]);
        return NULL;
    }
    if (hlen > NPY_MAX_HEADER) {
        fclose(f);
        ts_set_error(ctx, TS_ERR_IO,
                     "%s: .npy header of %zu bytes is too "
                     "large",
                     path, hlen);
        return NULL;
    }
    char *hdr = malloc(hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) {
        free(hdr);
        fclose(f);
        ts_set_error(ctx, TS_ERR_IO, "%s: truncated .npy header", path);
        return NULL;
    }
    hdr[hlen] = 0;
    char descr[16], why[128];
    bool fortran;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    bool ok =
        npy_parse_header(hdr, descr, &fortran, &ndim, shape, why, sizeof why);
    free(hdr);
    if (!ok) {
        fclose(f);
        ts_set_error(ctx, TS_ERR_IO, "%s: %s", path, why);
        return NULL;
    }
    static const struct {
        const char *descr;
        size_t size;
        ts_dtype dt;
    } kinds[] = {{"<f4", 4, TS_F32},
                 {"<f8", 8, TS_F32},
                 {"<f2", 2, TS_F32},
                 {"<i8", 8, TS_I64},
                 {"<i4", 4, TS_I32}};
    int k = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(descr, kinds[i].descr))
            k = i;
    if (k < 0 || fortran) {
        fclose(f);
        if (fortran)
            ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: fortran_order True is not supported (save a "
                         "C-order array: np.ascontiguousarray)",
                         path);
        else
            ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                         "%s: dtype '%s' is not supported (known: <f4, <f8, "
                         "<f2, <i8, <i4)",
                         path, descr);
        return NULL;
    }
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] && n > INT64_MAX / 16 / shape[d]) {
            fclose(f);
            ts_set_error(ctx, TS_ERR_IO, "%s: shape too large", path);
            return NULL;
        }
        n *= shape[d];
    }
    size_t bytes = (size_t)n * kinds[k].size;
    void *raw = malloc(bytes ? bytes : 1);
    if (!raw) {
        fclose(f);
        ts_set_error(ctx, TS_ERR_OOM, "%s: no memory for %zu bytes", path,
                     bytes);
        return NULL;
    }
    size_t rd = fread(raw, 1, bytes, f);
    fclose(f);
    if (rd != bytes) {
        free(raw);
        ts_set_error(ctx, TS_ERR_IO,
                     "%s: truncated: %zu of %zu data bytes present", path, rd,
                     bytes);
        return NULL;
    }
    ts_tensor *t;
    if (kinds[k].size == 8 && kinds[k].dt == TS_F32) {
        float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
        for (int64_t i = 0; v && i < n; i++) {
            double x;
            memcpy(&x, (char *)raw + 8 * i, 8);
            v[i] = (float)x;
        }
        t = v ? ts_from_data(ctx, TS_F32, ndim, shape, v) : NULL;
        free(v);
    } else if (kinds[k].size == 2) {
        t = ts_from_data(ctx, TS_F16, ndim, shape, raw);
        ts_tensor *c = t ? ts_cast(t, TS_F32) : NULL;
        ts_release(t);
        t = c;
    } else {
        t = ts_from_data(ctx, kinds[k].dt, ndim, shape, raw);
    }
    free(raw);
    if (!t && ts_ctx_status(ctx) == TS_OK)
        ts_set_error(ctx, TS_ERR_OOM, "%s: no memory", path);
    return t;
}

ts_status ts_npy_write(ts_ctx *ctx, const char *path, ts_tensor *t) {
    if (!path || !t)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "ts_npy_write: %s is NULL",
                            path ? "t" : "path");
    ts_dtype dt = ts_tensor_dtype(t), out_dt;
    const char *descr;
    if (dt == TS_I64)
        out_dt = TS_I64, descr = "<i8";
    else if (dt == TS_I32)
        out_dt = TS_I32, descr = "<i4";
    else if (dt == TS_F32 || dt == TS_BF16 || dt == TS_F16)
        out_dt = TS_F32, descr = "<f4";
    else
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "%s: .npy is written from f32, bf16, f16, i64 or "
                            "i32, not %s",
                            path, ts_dtype_name(dt));
    char hdr[512];
    int nd = ts_tensor_ndim(t);
    int p =
        snprintf(hdr, sizeof hdr,
                 "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int d = 0; d < nd; d++)
        p += snprintf(hdr + p, sizeof hdr - (size_t)p, "%lld%s",
                      (long long)ts_tensor_shape(t)[d],
                      nd == 1 ? "," : (d + 1 < nd ? ", " : ""));
    p += snprintf(hdr + p, sizeof hdr - (size_t)p, "), }");
    /* magic + version + 2-byte length + header + '\n', padded to 64 */
    size_t total = 10 + (size_t)p + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)p + pad + 1;
    unsigned char pre[10];
    memcpy(pre, npy_magic, 6);
    pre[6] = 1, pre[7] = 0;
    pre[8] = (unsigned char)(hlen & 0xff), pre[9] = (unsigned char)(hlen >> 8);
    memset(hdr + p, ' ', pad);
    hdr[p + pad] = '\n';
    int64_t n = ts_tensor_numel(t);
    size_t bytes = (size_t)n * ts_dtype_size(out_dt);
    void *data = malloc(bytes ? bytes : 1);
    if (!data)
        return ts_set_error(ctx, TS_ERR_OOM, "%s: no memory", path);
    ts_status st = ts_tensor_read(t, data, out_dt);
    if (st != TS_OK) {
        free(data);
        return st;
    }
    ts_atomic_file af;
    bool ok = ts_atomic_open(&af, path);
    ok = ok && ts_atomic_write(&af, pre, 10);
    ok = ok && ts_atomic_write(&af, hdr, hlen);
    ok = ok && ts_atomic_write(&af, data, bytes);
    free(data);
    if (!ts_atomic_commit(&af, ok))
        return ts_set_error(ctx, TS_ERR_IO, "cannot write %s: %s", path,
                            strerror(af.err ? af.err : EIO));
    return TS_OK;
}
