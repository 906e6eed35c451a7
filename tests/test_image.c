/* test_image.c — PNG and .npy files (src/io/image.c, src/io/npy.c): files
 * written by PIL, a hand-made PNG writer and NumPy (tests/ref/
 * image_files.py make) read with their values checked; our PNG and .npy
 * writes read back by us here and by PIL/NumPy afterwards (image_files.py
 * check); malformed files give errors naming the file and the fault.
 * usage: test_image DIR */
#include "tessera_io.h"
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>

static const char *g_dir;

static const char *at(const char *name) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static bool same_shape(ts_tensor *t, int nd, const int64_t *shape) {
    if (!t || ts_tensor_ndim(t) != nd)
        return false;
    for (int d = 0; d < nd; d++)
        if (ts_tensor_shape(t)[d] != shape[d])
            return false;
    return true;
}

static void test_png_reads(ts_ctx *ctx, json_t *man) {
    const char *name;
    json_t *shape;
    json_object_foreach(json_object_get(man, "png"), name, shape) {
        ts_tensor *img = ts_png_read(ctx, at(name));
        char exp[256];
        snprintf(exp, sizeof exp, "%s.expect.npy", name);
        ts_tensor *want = ts_npy_read(ctx, at(exp));
        int64_t sh[3];
        for (int d = 0; d < 3; d++)
            sh[d] = json_integer_value(json_array_get(shape, (size_t)d));
        CHECK(img != NULL);
        if (!img)
            fprintf(stderr, "%s: %s\n", name, ts_errmsg(ctx));
        CHECK(same_shape(img, 3, sh));
        CHECK(ts_tensor_dtype(img) == TS_F32);
        CHECK(test_allclose(name, img, want, 0, 1e-7));
        ts_release(img), ts_release(want);
    }
}

static void test_png_roundtrip(ts_ctx *ctx) {
    /* gray 5x7 and RGB 9x13 (odd sizes), values b/255 for a byte pattern;
     * three gray pixels out of range or NaN: clamped */
    const int64_t shapes[2][3] = {{1, 5, 7}, {3, 9, 13}};
    const char *names[2] = {"out_gray.png", "out_rgb.png"};
    for (int k = 0; k < 2; k++) {
        const int64_t *s = shapes[k];
        int64_t n = s[0] * s[1] * s[2];
        float *v = malloc(sizeof(float) * (size_t)n);
        for (int64_t c = 0; c < s[0]; c++)
            for (int64_t y = 0; y < s[1]; y++)
                for (int64_t x = 0; x < s[2]; x++)
                    v[(c * s[1] + y) * s[2] + x] =
                        (float)((c * 91 + y * 17 + x * 5) % 256) / 255.0f;
        if (k == 0)
            v[0] = -0.5f, v[1] = 1.7f, v[2] = NAN;
        ts_tensor *t = ts_from_data(ctx, TS_F32, 3, s, v);
        CHECK_OK(ctx, ts_png_write(ctx, at(names[k]), t));
        ts_tensor *r = ts_png_read(ctx, at(names[k]));
        CHECK(same_shape(r, 3, s));
        if (k == 0)
            v[0] = 0, v[1] = 1, v[2] = 0;
        ts_tensor *want = ts_from_data(ctx, TS_F32, 3, s, v);
        CHECK(test_allclose(names[k], r, want, 0, 1e-7));
        ts_release(t), ts_release(r), ts_release(want);
        free(v);
    }
    /* rounding: random values, checked against NumPy's by the check step;
     * here against (x * 255) rounded half to even */
    int64_t s[3] = {1, 6, 11};
    ts_tensor *u = ts_rand(ctx, TS_F32, 3, s, -0.2, 1.2, 99);
    CHECK_OK(ctx, ts_npy_write(ctx, at("out_round.npy"), u));
    CHECK_OK(ctx, ts_png_write(ctx, at("out_round.png"), u));
    ts_tensor *r = ts_png_read(ctx, at("out_round.png"));
    float uv[66], rv[66];
    CHECK_OK(ctx, ts_tensor_read(u, uv, TS_F32));
    CHECK(r && ts_tensor_read(r, rv, TS_F32) == TS_OK);
    int bad = 0;
    for (int i = 0; i < 66; i++) {
        float c = uv[i] < 0 ? 0 : uv[i] > 1 ? 1 : uv[i];
        bad += rv[i] != rintf(c * 255.0f) / 255.0f;
    }
    CHECK(bad == 0);
    ts_release(u), ts_release(r);
    /* bf16 input is written too */
    ts_tensor *h = ts_full(ctx, TS_BF16, 3, s, 0.5);
    CHECK_OK(ctx, ts_png_write(ctx, at("out_bf16.png"), h));
    r = ts_png_read(ctx, at("out_bf16.png"));
    double px = -1;
    int64_t i0[3] = {0, 2, 3};
    CHECK(r && ts_get(r, i0, &px) == TS_OK);
    CHECK_NEAR(px, 128.0 / 255.0, 1e-7); /* 127.5 rounds to even: 128 */
    ts_release(h), ts_release(r);
}

static void test_png_errors(ts_ctx *ctx) {
    struct {
        const char *file, *needle;
    } cases[] = {{"not_png.png", "not a PNG"},
                 {"truncated.png", "bad or truncated PNG"},
                 {"bad_crc.png", "bad or truncated PNG"},
                 {"huge.png", "too large"},
                 {"missing.png", "cannot read"}};
    for (int i = 0; i < 5; i++) {
        ts_clear_error(ctx);
        CHECK(ts_png_read(ctx, at(cases[i].file)) == NULL);
        CHECK_MSG(ctx, cases[i].needle);
        CHECK_MSG(ctx, cases[i].file);
    }
    int64_t s2[3] = {2, 4, 4}, s4[2] = {4, 4};
    ts_tensor *two = ts_zeros(ctx, TS_F32, 3, s2);
    CHECK(ts_png_write(ctx, at("x.png"), two) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "C 1 or 3");
    ts_tensor *flat = ts_zeros(ctx, TS_F32, 2, s4);
    CHECK(ts_png_write(ctx, at("x.png"), flat) == TS_ERR_SHAPE);
    int64_t s3[3] = {1, 2, 2};
    ts_tensor *ints = ts_zeros(ctx, TS_I32, 3, s3);
    CHECK(ts_png_write(ctx, at("x.png"), ints) == TS_ERR_DTYPE);
    CHECK(ts_png_write(ctx, "/nonexistent_dir/x.png", flat) != TS_OK);
    ts_tensor *g = ts_zeros(ctx, TS_F32, 3, s3);
    CHECK(ts_png_write(ctx, "/nonexistent_dir/x.png", g) == TS_ERR_IO);
    CHECK_MSG(ctx, "/nonexistent_dir/x.png");
    ts_release(two), ts_release(flat), ts_release(ints), ts_release(g);
}

static void test_npy_reads(ts_ctx *ctx, json_t *man) {
    const char *name;
    json_t *e;
    json_object_foreach(json_object_get(man, "npy"), name, e) {
        ts_tensor *t = ts_npy_read(ctx, at(name));
        CHECK(t != NULL);
        if (!t) {
            fprintf(stderr, "%s: %s\n", name, ts_errmsg(ctx));
            continue;
        }
        json_t *shape = json_object_get(e, "shape");
        json_t *vals = json_object_get(e, "values");
        int nd = (int)json_array_size(shape);
        int64_t sh[8];
        for (int d = 0; d < nd; d++)
            sh[d] = json_integer_value(json_array_get(shape, (size_t)d));
        CHECK(same_shape(t, nd, sh));
        bool ints = name[0] == 'i';
        CHECK(ts_tensor_dtype(t) == (!strcmp(name, "i8.npy")   ? TS_I64
                                     : !strcmp(name, "i4.npy") ? TS_I32
                                                               : TS_F32));
        int64_t n = ts_tensor_numel(t);
        CHECK((size_t)n == json_array_size(vals));
        double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
        int64_t *iv = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
        float *fv = malloc(sizeof(float) * (size_t)(n ? n : 1));
        int bad = 0;
        if (ints) {
            CHECK_OK(ctx, ts_tensor_read(t, iv, TS_I64));
            for (int64_t i = 0; i < n; i++)
                bad += (double)iv[i] !=
                       json_number_value(json_array_get(vals, (size_t)i));
        } else {
            CHECK_OK(ctx, ts_tensor_read(t, fv, TS_F32));
            for (int64_t i = 0; i < n; i++) /* f8 -> f32: rounded */
                bad += fv[i] != (float)json_number_value(
                                    json_array_get(vals, (size_t)i));
        }
        CHECK(bad == 0);
        if (bad)
            fprintf(stderr, "%s: %d values differ\n", name, bad);
        free(v), free(iv), free(fv);
        ts_release(t);
    }
}

static void test_npy_writes(ts_ctx *ctx) {
    float f[24];
    for (int i = 0; i < 24; i++)
        f[i] = (float)i * 0.25f - 3;
    int64_t s3[3] = {2, 3, 4}, s1 = 5, s2[2] = {3, 2};
    int64_t l[5];
    for (int i = 0; i < 5; i++)
        l[i] = (int64_t)i * 1000000007 - 2;
    int32_t w[6];
    for (int i = 0; i < 6; i++)
        w[i] = -i * 3;
    ts_tensor *tf = ts_from_data(ctx, TS_F32, 3, s3, f);
    ts_tensor *tl = ts_from_data(ctx, TS_I64, 1, &s1, l);
    ts_tensor *tw = ts_from_data(ctx, TS_I32, 2, s2, w);
    ts_tensor *ts = ts_scalar(ctx, TS_F32, 2.5);
    CHECK_OK(ctx, ts_npy_write(ctx, at("out_f32.npy"), tf));
    CHECK_OK(ctx, ts_npy_write(ctx, at("out_i64.npy"), tl));
    CHECK_OK(ctx, ts_npy_write(ctx, at("out_i32.npy"), tw));
    CHECK_OK(ctx, ts_npy_write(ctx, at("out_scalar.npy"), ts));
    /* and back through our reader */
    const char *names[4] = {"out_f32.npy", "out_i64.npy", "out_i32.npy",
                            "out_scalar.npy"};
    ts_tensor *orig[4] = {tf, tl, tw, ts};
    for (int k = 0; k < 4; k++) {
        ts_tensor *r = ts_npy_read(ctx, at(names[k]));
        CHECK(r && ts_tensor_dtype(r) == ts_tensor_dtype(orig[k]));
        CHECK(r &&
              same_shape(r, ts_tensor_ndim(orig[k]), ts_tensor_shape(orig[k])));
        if (r && ts_tensor_dtype(r) == TS_F32)
            CHECK(test_allclose(names[k], r, orig[k], 0, 0));
        ts_release(r);
    }
    /* a strided view is written in row-major order */
    ts_tensor *tt = ts_transpose(tf, 0, 2);
    CHECK_OK(ctx, ts_npy_write(ctx, at("out_t.npy"), tt));
    ts_tensor *rt = ts_npy_read(ctx, at("out_t.npy"));
    CHECK(test_allclose("transposed", rt, tt, 0, 0));
    int64_t sq = 4;
    ts_tensor *q = ts_zeros(ctx, TS_BF16, 1, &sq);
    CHECK_OK(ctx, ts_npy_write(ctx, at("out_bf16.npy"), q));
    ts_tensor *rq = ts_npy_read(ctx, at("out_bf16.npy"));
    CHECK(rq && ts_tensor_dtype(rq) == TS_F32);
    ts_release(tt), ts_release(rt), ts_release(q), ts_release(rq);
    ts_release(tf), ts_release(tl), ts_release(tw), ts_release(ts);
}

static void test_npy_errors(ts_ctx *ctx) {
    struct {
        const char *file, *needle;
        ts_status st;
    } cases[] = {{"fortran.npy", "fortran_order True", TS_ERR_UNSUPPORTED},
                 {"big_endian.npy", "dtype '>f4'", TS_ERR_UNSUPPORTED},
                 {"uint8.npy", "dtype '|u1'", TS_ERR_UNSUPPORTED},
                 {"bad_magic.npy", "bad magic", TS_ERR_IO},
                 {"truncated.npy", "truncated", TS_ERR_IO},
                 {"gray8.png", "bad magic", TS_ERR_IO},
                 {"missing.npy", "cannot read", TS_ERR_IO}};
    for (int i = 0; i < 7; i++) {
        ts_clear_error(ctx);
        CHECK(ts_npy_read(ctx, at(cases[i].file)) == NULL);
        CHECK(ts_ctx_status(ctx) == cases[i].st);
        CHECK_MSG(ctx, cases[i].needle);
        CHECK_MSG(ctx, cases[i].file);
    }
    int64_t s = 3;
    ts_tensor *q = ts_zeros(ctx, TS_Q8_0, 1, &s);
    if (q) {
        CHECK(ts_npy_write(ctx, at("x.npy"), q) == TS_ERR_DTYPE);
        ts_release(q);
    }
    ts_tensor *f = ts_zeros(ctx, TS_F32, 1, &s);
    CHECK(ts_npy_write(ctx, "/nonexistent_dir/x.npy", f) == TS_ERR_IO);
    CHECK_MSG(ctx, "/nonexistent_dir/x.npy");
    ts_release(f);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_image DIR\n");
        return 2;
    }
    g_dir = argv[1];
    json_error_t je;
    json_t *man = json_load_file(at("manifest.json"), 0, &je);
    if (!man) {
        fprintf(stderr, "cannot read %s: %s\n", at("manifest.json"), je.text);
        return 1;
    }
    ts_ctx *ctx = test_ctx();
    test_npy_reads(ctx, man);
    test_png_reads(ctx, man);
    test_png_roundtrip(ctx);
    test_png_errors(ctx);
    test_npy_writes(ctx);
    test_npy_errors(ctx);
    json_decref(man);
    ts_ctx_free(ctx);
    return test_finish("test_image");
}
