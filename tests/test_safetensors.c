/* test_safetensors.c — safetensors files: reading every dtype with zero
 * copies (and copies when the data is unaligned), metadata, sharded folders
 * through the index, round trips through ts_safetensors_save (including a
 * non-contiguous view), atomic writes that keep the old file on failure,
 * and one clear error per malformed file. argv[1]: the folder written by
 * tests/ref/st_files.py. */
#include "tessera_io.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *dir;

static double at(ts_tensor *t, int64_t flat) {
    int64_t idx[TS_MAX_DIMS] = {0};
    int nd = ts_tensor_ndim(t);
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = flat % ts_tensor_shape(t)[d];
        flat /= ts_tensor_shape(t)[d];
    }
    double v = NAN;
    ts_get(t, idx, &v);
    return v;
}

/* the formulas of st_files.py */
static void check_values(ts_ctx *ctx, ts_safetensors *st, bool want_views) {
    ts_tensor *f32 = ts_safetensors_get(st, "w.f32");
    ts_tensor *bf = ts_safetensors_get(st, "w.bf16");
    ts_tensor *f16 = ts_safetensors_get(st, "w.f16");
    ts_tensor *i64 = ts_safetensors_get(st, "ids.i64");
    ts_tensor *i32 = ts_safetensors_get(st, "ids.i32");
    ts_tensor *sc = ts_safetensors_get(st, "scalar");
    ts_tensor *em = ts_safetensors_get(st, "empty");
    CHECK(f32 && bf && f16 && i64 && i32 && sc && em);
    if (!(f32 && bf && f16 && i64 && i32 && sc && em)) {
        fprintf(stderr, "%s\n", ts_errmsg(ctx));
        return;
    }
    CHECK(ts_tensor_dtype(f32) == TS_F32 && ts_tensor_dim(f32, 1) == 4);
    for (int i = 0; i < 12; i++)
        CHECK(at(f32, i) == i * 0.5);
    CHECK(ts_tensor_dtype(bf) == TS_BF16);
    for (int i = 0; i < 6; i++)
        CHECK(at(bf, i) == i - 2.5);
    for (int i = 0; i < 4; i++)
        CHECK(at(f16, i) == i / 4.0);
    for (int i = 0; i < 5; i++)
        CHECK(at(i64, i) == i * 1000000007.0);
    for (int i = 0; i < 6; i++)
        CHECK(at(i32, i) == i - 3);
    double v;
    CHECK_OK(ctx, ts_item(sc, &v));
    CHECK(v == 7.25 && ts_tensor_ndim(sc) == 0);
    CHECK(ts_tensor_numel(em) == 0 && ts_tensor_dim(em, 1) == 3);
    /* aligned data is viewed in place: two gets see the same bytes of the
     * mapping; unaligned data is copied out, each get its own */
    ts_tensor *again = ts_safetensors_get(st, "w.f32");
    CHECK((ts_tensor_data(again) == ts_tensor_data(f32)) == want_views);
    ts_release(again);
    ts_tensor *all[] = {f32, bf, f16, i64, i32, sc, em};
    for (int i = 0; i < 7; i++)
        ts_release(all[i]);
}

static void test_valid(ts_ctx *ctx) {
    char p[512];
    snprintf(p, sizeof p, "%s/valid.safetensors", dir);
    ts_safetensors *st;
    CHECK_OK(ctx, ts_safetensors_open(ctx, p, &st));
    if (!st)
        return;
    CHECK(ts_safetensors_count(st) == 7);
    CHECK(!strcmp(ts_safetensors_name(st, 0), "w.f32")); /* by offset */
    CHECK(!strcmp(ts_safetensors_metadata(st, "format"), "pt"));
    CHECK(ts_safetensors_metadata(st, "absent") == NULL);
    check_values(ctx, st, true);
    /* tensors outlive the reader: the mapping is refcounted */
    ts_tensor *keep = ts_safetensors_get(st, "w.f32");
    ts_safetensors_close(st);
    CHECK(at(keep, 11) == 5.5);
    ts_release(keep);
    CHECK(ts_safetensors_get(NULL, "x") == NULL);
    CHECK_OK(ctx, ts_safetensors_open(ctx, p, &st));
    CHECK(ts_safetensors_get(st, "nope") == NULL);
    CHECK_MSG(ctx, "no tensor \"nope\"");
    ts_clear_error(ctx);
    ts_safetensors_close(st);
    /* unaligned data: copies with the same values */
    snprintf(p, sizeof p, "%s/unaligned.safetensors", dir);
    CHECK_OK(ctx, ts_safetensors_open(ctx, p, &st));
    if (st)
        check_values(ctx, st, false), ts_safetensors_close(st);
    /* a sharded folder */
    snprintf(p, sizeof p, "%s/sharded", dir);
    CHECK_OK(ctx, ts_safetensors_open(ctx, p, &st));
    if (st) {
        CHECK(ts_safetensors_count(st) == 7);
        check_values(ctx, st, true);
        ts_safetensors_close(st);
    }
    snprintf(p, sizeof p, "%s/badindex", dir);
    CHECK(ts_safetensors_open(ctx, p, &st) == TS_ERR_IO);
    CHECK_MSG(ctx, "tensor \"ghost\" is not in its shard");
    ts_clear_error(ctx);
}

static void test_malformed(ts_ctx *ctx) {
    const struct {
        const char *file;
        ts_status status;
        const char *msg;
    } cases[] = {
        {"truncated", TS_ERR_IO,
         "tensor \"w.f32\" ends at byte 48 but the data section has 43"},
        {"tiny", TS_ERR_IO, "3 bytes, too short for a safetensors header"},
        {"header_too_long", TS_ERR_IO,
         "header length 1000000000 is over the limit"},
        {"header_past_end", TS_ERR_IO, "header length 4096 runs past the end"},
        {"not_json", TS_ERR_IO, "header is not valid JSON"},
        {"not_object", TS_ERR_IO, "header is not a JSON object"},
        {"unknown_dtype", TS_ERR_IO, "tensor \"w.f32\": unknown dtype \"Q7\""},
        {"unsupported_dtype", TS_ERR_UNSUPPORTED, "dtype F64 is not supported"},
        {"size_mismatch", TS_ERR_IO,
         "shape x dtype size is 60 bytes but data_offsets span 48"},
        {"negative_shape", TS_ERR_IO, "shape entry 0 is not a size >= 0"},
        {"missing_field", TS_ERR_IO, "needs \"dtype\" (string), \"shape\""},
        {"overlap", TS_ERR_IO,
         "tensor \"b\" starts at byte 16 of the data, where 32 was expected "
         "(overlap)"},
        {"hole", TS_ERR_IO,
         "tensor \"b\" starts at byte 32 of the data, where 16 was expected "
         "(hole)"},
        {"past_data", TS_ERR_IO, "ends at byte 64 but the data section has 48"},
        {"trailing_bytes", TS_ERR_IO, "16 bytes after the last tensor"},
        {"duplicate_key", TS_ERR_IO, "header is not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/bad_%s.safetensors", dir, cases[i].file);
        ts_safetensors *st = (ts_safetensors *)1;
        ts_status s = ts_safetensors_open(ctx, p, &st);
        CHECK(s == cases[i].status && st == NULL);
        CHECK_MSG(ctx, cases[i].msg);
        CHECK_MSG(ctx, cases[i].file); /* the message names the file */
        if (s != cases[i].status)
            fprintf(stderr, "%s: got %s\n", cases[i].file, ts_status_name(s));
        ts_clear_error(ctx);
    }
    ts_safetensors *st;
    CHECK(ts_safetensors_open(ctx, "/nonexistent/x.safetensors", &st) ==
          TS_ERR_IO);
    CHECK_MSG(ctx, "cannot open");
    ts_clear_error(ctx);
    CHECK(ts_safetensors_open(ctx, dir, &st) == TS_ERR_IO); /* no model file */
    CHECK_MSG(ctx, "no model.safetensors or model.safetensors.index.json");
    ts_clear_error(ctx);
}

static void test_save_round_trip(ts_ctx *ctx) {
    char p[512];
    snprintf(p, sizeof p, "%s/out.safetensors", dir);
    int64_t s2[2] = {5, 7};
    ts_tensor *a = ts_randn(ctx, TS_F32, 2, s2, 1, 1);
    ts_tensor *at_ = ts_transpose(a, 0, 1); /* written row-major */
    ts_tensor *b = ts_cast(a, TS_BF16);
    ts_tensor *c = ts_arange(ctx, TS_I64, 0, 9, 1);
    const char *names[3] = {"model.a_t", "model.b", "c"};
    ts_tensor *ts[3] = {at_, b, c};
    const char *meta[2] = {"format", "pt"};
    CHECK_OK(ctx, ts_safetensors_save(ctx, p, 3, names, ts, 1, meta));
    ts_safetensors *st;
    CHECK_OK(ctx, ts_safetensors_open(ctx, p, &st));
    if (st) {
        CHECK(ts_safetensors_count(st) == 3);
        CHECK(!strcmp(ts_safetensors_metadata(st, "format"), "pt"));
        for (int i = 0; i < 3; i++) {
            ts_tensor *r = ts_safetensors_get(st, names[i]);
            CHECK(r && ts_tensor_dtype(r) == ts_tensor_dtype(ts[i]));
            test_allclose(names[i], r, ts[i], 0, 0);
            ts_release(r);
        }
        ts_safetensors_close(st);
    }
    /* a failed save keeps the previous file: a NULL tensor midway */
    ts_tensor *bad[2] = {c, NULL};
    const char *bn[2] = {"x", "y"};
    CHECK(ts_safetensors_save(ctx, p, 2, bn, bad, 0, NULL) ==
          TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "entry 1 has no tensor");
    ts_clear_error(ctx);
    CHECK(ts_safetensors_save(ctx, "/nonexistent/dir/x.safetensors", 1, names,
                              ts, 0, NULL) == TS_ERR_IO);
    CHECK_MSG(ctx, "cannot create");
    ts_clear_error(ctx);
    const char *dup[2] = {"same", "same"};
    CHECK(ts_safetensors_save(ctx, p, 2, dup, ts, 0, NULL) ==
          TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "tensor \"same\" given twice");
    ts_clear_error(ctx);
    CHECK_OK(ctx, ts_safetensors_open(ctx, p, &st));
    CHECK(st && ts_safetensors_count(st) == 3); /* the old file, whole */
    ts_safetensors_close(st);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    struct stat sb;
    CHECK(stat(tmp, &sb) != 0); /* no temporary left behind */
    unlink(p);
    ts_release(a), ts_release(at_), ts_release(b), ts_release(c);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR (from tests/ref/st_files.py)\n",
                argv[0]);
        return 2;
    }
    dir = argv[1];
    ts_ctx *ctx = test_ctx();
    test_valid(ctx);
    test_malformed(ctx);
    test_save_round_trip(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_safetensors");
}
