/* image.c — PNG files to and from (C, H, W) float tensors in [0, 1],
 * through libpng: every color type and bit depth read (alpha dropped,
 * palettes expanded, 16-bit scaled), 8-bit gray or RGB written atomically.
 * libpng reports errors by longjmp: each call keeps its state on the heap
 * so that the jump back frees it, and no libpng error aborts. Owns no
 * tensor ops; the pipeline's pixel math (from [-1, 1], NCHW batches) is
 * elsewhere. */
#include "core/core.h"
#include "tessera_io.h"

#include <errno.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#define PNG_MAX_PIXELS ((int64_t)1 << 28)

typedef struct {
    char msg[256]; /* libpng's last error */
    FILE *f;
    png_bytep data;
    png_bytepp rows;
    ts_atomic_file af;
    bool af_open;
    bool to_mem; /* ts_png_encode: the bytes into mem */
    unsigned char *mem;
    size_t mem_n, mem_cap;
} png_job;

static void on_png_error(png_structp png, png_const_charp msg) {
    png_job *j = png_get_error_ptr(png);
    snprintf(j->msg, sizeof j->msg, "%s", msg ? msg : "error");
    png_longjmp(png, 1);
}

static void on_png_warning(png_structp png, png_const_charp msg) {
    (void)png, (void)msg; /* ancillary-chunk trouble: the pixels are fine */
}

static void job_free(png_job *j) {
    if (j->f)
        fclose(j->f);
    free(j->data);
    free(j->rows);
    if (j->af_open)
        ts_atomic_commit(&j->af, false);
    free(j->mem);
    free(j);
}

ts_tensor *ts_png_read(ts_ctx *ctx, const char *path) {
    if (!path) {
        ts_set_error(ctx, TS_ERR_INVALID_ARG, "ts_png_read: path is NULL");
        return NULL;
    }
    png_job *j = calloc(1, sizeof *j);
    if (!j) {
        ts_set_error(ctx, TS_ERR_OOM, "%s: no memory", path);
        return NULL;
    }
    j->f = fopen(path, "rb");
    if (!j->f) {
        ts_set_error(ctx, TS_ERR_IO, "cannot read %s: %s", path,
                     strerror(errno));
        job_free(j);
        return NULL;
    }
    unsigned char sig[8];
    if (fread(sig, 1, 8, j->f) != 8 || png_sig_cmp(sig, 0, 8)) {
        ts_set_error(ctx, TS_ERR_IO, "%s: not a PNG file (bad signature)",
                     path);
        job_free(j);
        return NULL;
    }
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, j,
                                             on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
        ts_set_error(ctx, TS_ERR_OOM, "%s: cannot start libpng", path);
        job_free(j);
        return NULL;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        ts_set_error(ctx, TS_ERR_IO, "%s: bad or truncated PNG: %s", path,
                     j->msg);
        job_free(j);
        return NULL;
    }
    png_set_sig_bytes(png, 8);
    png_init_io(png, j->f);
    png_set_user_limits(png, 1u << 20, 1u << 20);
    png_read_info(png, info);
    png_uint_32 W = png_get_image_width(png, info);
    png_uint_32 H = png_get_image_height(png, info);
    int depth = png_get_bit_depth(png, info);
    int type = png_get_color_type(png, info);
    if ((int64_t)W * H > PNG_MAX_PIXELS) {
        snprintf(j->msg, sizeof j->msg,
                 "%ux%u pixels is too large (at most 2^28)", (unsigned)W,
                 (unsigned)H);
        png_longjmp(png, 1);
    }
    if (type == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(png);
    if (type == PNG_COLOR_TYPE_GRAY && depth < 8)
        png_set_expand_gray_1_2_4_to_8(png);
    if (type & PNG_COLOR_MASK_ALPHA)
        png_set_strip_alpha(png);
    if (depth == 16)
        png_set_swap(png); /* host order (little-endian) */
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int C = png_get_channels(png, info);
    int bytes = png_get_bit_depth(png, info) == 16 ? 2 : 1;
    size_t rowbytes = png_get_rowbytes(png, info);
    if ((C != 1 && C != 3) || rowbytes != (size_t)W * (size_t)C * bytes) {
        snprintf(j->msg, sizeof j->msg, "unexpected layout (%d channels)", C);
        png_longjmp(png, 1);
    }
    j->data = malloc(rowbytes * H);
    j->rows = malloc(sizeof(png_bytep) * H);
    if (!j->data || !j->rows) {
        snprintf(j->msg, sizeof j->msg, "no memory for %ux%u pixels",
                 (unsigned)W, (unsigned)H);
        png_longjmp(png, 1);
    }
    for (png_uint_32 y = 0; y < H; y++)
        j->rows[y] = j->data + rowbytes * y;
    png_read_image(png, j->rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);

    int64_t shape[3] = {C, H, W};
    float *dst = malloc(sizeof(float) * (size_t)C * H * W);
    if (!dst) {
        ts_set_error(ctx, TS_ERR_OOM, "%s: no memory", path);
        job_free(j);
        return NULL;
    }
    double scale = bytes == 2 ? 1.0 / 65535 : 1.0 / 255;
    for (int c = 0; c < C; c++)
        for (png_uint_32 y = 0; y < H; y++)
            for (png_uint_32 x = 0; x < W; x++) {
                size_t k = ((size_t)x * C + c);
                unsigned v = bytes == 2 ? ((const uint16_t *)j->rows[y])[k]
                                        : j->rows[y][k];
                dst[((size_t)c * H + y) * W + x] = (float)(v * scale);
            }
    job_free(j);
    ts_tensor *t = ts_from_data(ctx, TS_F32, 3, shape, dst);
    free(dst);
    return t;
}

static void on_png_write(png_structp png, png_bytep p, size_t n) {
    png_job *j = png_get_io_ptr(png);
    if (j->to_mem) {
        if (j->mem_n + n > j->mem_cap) {
            size_t cap = (j->mem_cap ? j->mem_cap * 2 : 65536) + n;
            unsigned char *m = realloc(j->mem, cap);
            if (!m)
                png_error(png, "out of memory");
            j->mem = m, j->mem_cap = cap;
        }
        memcpy(j->mem + j->mem_n, p, n);
        j->mem_n += n;
        return;
    }
    if (!ts_atomic_write(&j->af, p, n))
        png_error(png, "write failed");
}

static void on_png_flush(png_structp png) {
    (void)png;
}

/* img into the file path (atomically) or, with path NULL, into a new
 * buffer *out of *n bytes */
static ts_status png_encode(ts_ctx *ctx, const char *path, ts_tensor *img,
                            unsigned char **out, size_t *n) {
    bool to_mem = !path;
    if (to_mem)
        path = "PNG";
    int nd = ts_tensor_ndim(img);
    const int64_t *sh = ts_tensor_shape(img);
    if (nd != 3 || (sh[0] != 1 && sh[0] != 3) || sh[1] < 1 || sh[2] < 1 ||
        sh[1] > (1 << 20) || sh[2] > (1 << 20) ||
        sh[1] * sh[2] > PNG_MAX_PIXELS)
        return ts_set_error(ctx, TS_ERR_SHAPE,
                            "%s: a PNG is written from (C, H, W) with C 1 or "
                            "3 and at most 2^28 pixels",
                            path);
    if (!ts_dtype_is_float(ts_tensor_dtype(img)) ||
        ts_dtype_is_quantized(ts_tensor_dtype(img)))
        return ts_set_error(ctx, TS_ERR_DTYPE,
                            "%s: a PNG is written from a float tensor, not %s",
                            path, ts_dtype_name(ts_tensor_dtype(img)));
    int C = (int)sh[0];
    size_t H = (size_t)sh[1], W = (size_t)sh[2];
    float *src = malloc(sizeof(float) * C * H * W);
    png_job *j = calloc(1, sizeof *j);
    if (!src || !j) {
        free(src), free(j);
        return ts_set_error(ctx, TS_ERR_OOM, "%s: no memory", path);
    }
    ts_status st = ts_tensor_read(img, src, TS_F32);
    if (st != TS_OK) {
        free(src), free(j);
        return st;
    }
    j->data = malloc((size_t)C * H * W);
    j->rows = malloc(sizeof(png_bytep) * H);
    if (!j->data || !j->rows) {
        free(src), job_free(j);
        return ts_set_error(ctx, TS_ERR_OOM, "%s: no memory", path);
    }
    for (int c = 0; c < C; c++)
        for (size_t y = 0; y < H; y++)
            for (size_t x = 0; x < W; x++) {
                float v = src[((size_t)c * H + y) * W + x];
                v = v > 0 ? (v < 1 ? v : 1) : 0; /* NaN -> 0 */
                j->data[(y * W + x) * C + c] = (png_byte)rintf(v * 255.0f);
            }
    free(src);
    for (size_t y = 0; y < H; y++)
        j->rows[y] = j->data + y * W * C;
    j->to_mem = to_mem;
    if (!to_mem && !ts_atomic_open(&j->af, path)) {
        int e = j->af.err;
        job_free(j);
        return ts_set_error(ctx, TS_ERR_IO, "cannot write %s: %s", path,
                            strerror(e));
    }
    j->af_open = !to_mem;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, j,
                                              on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_write_struct(png ? &png : NULL, NULL);
        job_free(j);
        return ts_set_error(ctx, TS_ERR_OOM, "%s: cannot start libpng", path);
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        int e = j->af.err;
        ts_set_error(ctx, TS_ERR_IO, "cannot write %s: %s%s%s", path, j->msg,
                     e ? ": " : "", e ? strerror(e) : "");
        job_free(j);
        return TS_ERR_IO;
    }
    png_set_write_fn(png, j, on_png_write, on_png_flush);
    png_set_IHDR(png, info, (png_uint_32)W, (png_uint_32)H, 8,
                 C == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    png_write_image(png, j->rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    if (to_mem) {
        *out = j->mem, *n = j->mem_n;
        j->mem = NULL;
        job_free(j);
        return TS_OK;
    }
    j->af_open = false;
    if (!ts_atomic_commit(&j->af, true)) {
        int e = j->af.err ? j->af.err : EIO;
        job_free(j);
        return ts_set_error(ctx, TS_ERR_IO, "cannot write %s: %s", path,
                            strerror(e));
    }
    job_free(j);
    return TS_OK;
}

ts_status ts_png_write(ts_ctx *ctx, const char *path, ts_tensor *img) {
    if (!path || !img)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "ts_png_write: %s is NULL",
                            path ? "img" : "path");
    return png_encode(ctx, path, img, NULL, NULL);
}

ts_status ts_png_encode(ts_ctx *ctx, ts_tensor *img, unsigned char **out,
                        size_t *n) {
    if (!img || !out || !n)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_png_encode: NULL argument");
    *out = NULL, *n = 0;
    return png_encode(ctx, NULL, img, out, n);
}
