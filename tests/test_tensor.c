/* test_tensor.c — the tensor core: dtype conversions, shapes and views,
 * element access, printing, the caching allocator, error messages and
 * DLPack exchange. */
#include "test_util.h"

#include <dlpack/dlpack.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_bf16_rounding(void) {
    /* 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even */
    CHECK(ts_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80);
    CHECK(ts_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82); /* tie, odd -> up */
    CHECK(ts_f32_to_bf16(1.0f + 1.0f / 256 + 1.0f / 65536) == 0x3f81);
    CHECK(ts_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(ts_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(ts_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(isnan(ts_bf16_to_f32(ts_f32_to_bf16(NAN))));
    /* a NaN whose payload sits only in the low bits must stay NaN */
    CHECK(isnan(ts_bf16_to_f32(ts_f32_to_bf16(bits_f(0x7f800001u)))));
    /* the largest finite f32 rounds to bf16 Inf (as PyTorch does) */
    CHECK(ts_f32_to_bf16(3.4028235e38f) == 0x7f80);
    /* every bf16 survives the round trip */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ts_bf16_to_f32((uint16_t)h);
        if (!isnan(f) && ts_f32_to_bf16(f) != h)
            bad++;
    }
    CHECK(bad == 0);
}

/* compiled for F16C, called only where the CPU has it */
__attribute__((target("f16c"))) static void test_f16_against_f16c(void) {
    /* the hardware F16C conversion (round to nearest even) is the
     * reference; our software conversion must agree bit for bit */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float ours = ts_f16_to_f32((uint16_t)h);
        float hw = _cvtsh_ss((unsigned short)h);
        if (memcmp(&ours, &hw, 4) != 0 && !(isnan(ours) && isnan(hw)))
            bad++;
    }
    CHECK(bad == 0);
    uint64_t s = 42;
    bad = 0;
    for (int i = 0; i < 2000000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(s >> 32);
        /* bias toward the f16 range and its edges */
        if (i % 2)
            u = (u & 0x80000000u) | (0x30000000u + (u % 0x18000000u));
        float f = bits_f(u);
        uint16_t ours = ts_f32_to_f16(f);
        uint16_t hw = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
        if (isnan(f)) {
            if ((ours & 0x7c00) != 0x7c00 || !(ours & 0x3ff))
                bad++;
        } else if (ours != hw) {
            if (bad < 5)
                fprintf(stderr, "f16(%a): ours %04x, F16C %04x\n", (double)f,
                        ours, hw);
            bad++;
        }
    }
    CHECK(bad == 0);
    CHECK(ts_f32_to_f16(65520.0f) == 0x7c00); /* rounds up to Inf */
    CHECK(ts_f32_to_f16(65504.0f) == 0x7bff); /* largest finite */
    CHECK(ts_f32_to_f16(5.9604645e-8f) == 1); /* smallest subnormal */
    CHECK(ts_f32_to_f16(2.9802322e-8f) == 0); /* half of it: tie to even */
}

static ts_tensor *iota(ts_ctx *ctx, int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    ts_tensor *r = ts_arange(ctx, TS_F32, 0, (double)n, 1);
    ts_tensor *v = ts_reshape(r, nd, shape);
    ts_release(r);
    return v;
}

static double at(ts_tensor *t, int64_t i0, int64_t i1, int64_t i2) {
    int64_t idx[3] = {i0, i1, i2};
    double v = NAN;
    ts_get(t, idx, &v);
    return v;
}

static void test_views(ts_ctx *ctx) {
    int64_t shape[3] = {2, 3, 4};
    ts_tensor *x = iota(ctx, 3, shape);
    CHECK(ts_tensor_is_contiguous(x));
    /* permute: no copy, strides permuted */
    int perm[3] = {2, 0, 1};
    ts_tensor *p = ts_permute(x, perm);
    CHECK(ts_tensor_shares_storage(p, x));
    CHECK(ts_tensor_dim(p, 0) == 4 && ts_tensor_dim(p, 1) == 2);
    CHECK(at(p, 3, 1, 2) == at(x, 1, 2, 3));
    CHECK(!ts_tensor_is_contiguous(p));
    /* slice with a step */
    ts_tensor *s = ts_slice(x, 2, 1, 4, 2); /* columns 1, 3 */
    CHECK(ts_tensor_shares_storage(s, x));
    CHECK(ts_tensor_dim(s, 2) == 2);
    CHECK(at(s, 1, 2, 1) == at(x, 1, 2, 3));
    ts_tensor *s2 = ts_slice(x, -1, -3, 100, 1); /* python-style clamp */
    CHECK(ts_tensor_dim(s2, 2) == 3 && at(s2, 0, 0, 0) == 1);
    /* reshape of a contiguous tensor is a view; of a permuted one a copy */
    int64_t flat[2] = {6, -1};
    ts_tensor *r = ts_reshape(x, 2, flat);
    CHECK(ts_tensor_shares_storage(r, x) && ts_tensor_dim(r, 1) == 4);
    ts_tensor *rp = ts_reshape(p, 2, flat);
    CHECK(!ts_tensor_shares_storage(rp, x));
    int64_t i2[2] = {5, 3};
    double v;
    ts_get(rp, i2, &v);
    /* rp = permuted(x) flattened: element 23 in order of p */
    CHECK(v == at(p, 3, 1, 2));
    /* sizes whose product passes 2^63: an error, not a signed overflow */
    int64_t huge[3] = {(int64_t)1 << 62, 4, -1};
    CHECK(ts_reshape(x, 3, huge) == NULL);
    CHECK_MSG(ctx, "more than 2^63 elements");
    ts_clear_error(ctx);
    /* a transposed pair of dims that are mergeable stays a view */
    ts_tensor *t = ts_transpose(x, 0, 1); /* (3, 2, 4) */
    int64_t m[2] = {6, 4};
    ts_tensor *tr = ts_reshape(t, 2, m);
    CHECK(!ts_tensor_shares_storage(tr, x)); /* dims 0,1 not mergeable */
    int64_t m2[4] = {3, 2, 2, 2};
    ts_tensor *tr2 = ts_reshape(t, 4, m2); /* split the last dim: view */
    CHECK(ts_tensor_shares_storage(tr2, x));
    /* expand, squeeze, unsqueeze */
    int64_t one[3] = {1, 3, 1};
    ts_tensor *c = iota(ctx, 3, one);
    int64_t big[4] = {5, 2, 3, 4};
    ts_tensor *e = ts_expand(c, 4, big);
    CHECK(ts_tensor_shares_storage(e, c) && ts_tensor_strides(e)[3] == 0);
    int64_t ei[4] = {4, 1, 2, 3};
    ts_get(e, ei, &v);
    CHECK(v == 2);
    ts_tensor *sq = ts_squeeze(c, 0);
    CHECK(ts_tensor_ndim(sq) == 2 && ts_tensor_dim(sq, 0) == 3);
    ts_tensor *us = ts_unsqueeze(sq, -1);
    CHECK(ts_tensor_ndim(us) == 3 && ts_tensor_dim(us, 2) == 1);
    /* contiguous of a view copies in row-major order */
    ts_tensor *pc = ts_contiguous(p);
    CHECK(ts_tensor_is_contiguous(pc) && !ts_tensor_shares_storage(pc, x));
    float buf[24];
    CHECK_OK(ctx, ts_tensor_read(pc, buf, TS_F32));
    CHECK(buf[0] == 0 && buf[1] == 4 && buf[3] == 12 && buf[6] == 1);
    /* writes through a view reach the base */
    int64_t w[3] = {0, 0, 1};
    CHECK_OK(ctx, ts_set(s, w, -7));
    CHECK(at(x, 0, 0, 3) == -7);
    ts_tensor *all[] = {x, p, s, s2, r, rp, t, tr, tr2, c, e, sq, us, pc};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        ts_release(all[i]);
}

static void test_print(ts_ctx *ctx) {
    int64_t shape[2] = {2, 3};
    float d[6] = {0.5f, -1.25f, 2, 3, 4, 5};
    ts_tensor *x = ts_from_data(ctx, TS_F32, 2, shape, d);
    char *s = ts_to_string(x);
    CHECK(s && !strcmp(s, "tensor([[ 0.5000, -1.2500,  2.0000],\n"
                          "        [ 3.0000,  4.0000,  5.0000]], dtype=f32)"));
    if (s && strcmp(s, "tensor([[ 0.5000, -1.2500,  2.0000],\n"
                       "        [ 3.0000,  4.0000,  5.0000]], dtype=f32)"))
        fprintf(stderr, "got:\n%s\n", s);
    free(s);
    ts_tensor *b = ts_cast(x, TS_BF16);
    s = ts_to_string(b);
    CHECK(s && strstr(s, "dtype=bf16"));
    free(s);
    int64_t big = 5000;
    ts_tensor *r = ts_arange(ctx, TS_I64, 0, 5000, 1);
    s = ts_to_string(r);
    CHECK(s &&
          !strcmp(
              s, "tensor([   0,    1,    2, ..., 4997, 4998, 4999], dtype=i64, "
                 "shape=[5000])"));
    if (s && !strstr(s, "4997"))
        fprintf(stderr, "got: %s\n", s);
    (void)big;
    free(s);
    ts_tensor *sc = ts_scalar(ctx, TS_F32, 3.5);
    s = ts_to_string(sc);
    CHECK(s && !strcmp(s, "tensor(3.5000, dtype=f32)"));
    free(s);
    ts_release(x), ts_release(b), ts_release(r), ts_release(sc);
}

static void test_allocator(void) {
    ts_ctx *ctx = test_ctx();
    ts_alloc_stats st;
    int64_t shape[2] = {256, 256};
    for (int i = 0; i < 10; i++) {
        ts_tensor *a = ts_zeros(ctx, TS_F32, 2, shape);
        ts_tensor *b = ts_add_scalar(a, 1.0);
        ts_release(a), ts_release(b);
    }
    ts_alloc_get_stats(ctx, &st);
    CHECK(st.system_allocs == 2); /* the rest came from the cache */
    CHECK(st.cache_hits == 18);
    CHECK(st.bytes_in_use == 0);
    CHECK(st.peak_bytes_in_use >= 2 * 256 * 256 * 4);
    ts_alloc_empty_cache(ctx);
    ts_alloc_get_stats(ctx, &st);
    CHECK(st.bytes_cached == 0);
    ts_ctx_free(ctx);
    ts_ctx_options opt = {.num_threads = 1, .no_alloc_cache = true};
    CHECK(ts_ctx_new(&ctx, &opt) == TS_OK);
    CHECK(ts_get_num_threads(ctx) == 1);
    ts_tensor *a = ts_zeros(ctx, TS_F32, 2, shape);
    ts_release(a);
    ts_alloc_get_stats(ctx, &st);
    CHECK(st.bytes_cached == 0);
    ts_ctx_free(ctx);
}

static void test_errors(ts_ctx *ctx) {
    int64_t shape[2] = {2, 3};
    ts_tensor *x = ts_zeros(ctx, TS_F32, 2, shape);
    int64_t idx[2] = {2, 0};
    CHECK(ts_get(x, idx, NULL) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "index 2 out of range for dim 0 of shape [2, 3]");
    ts_clear_error(ctx);
    int64_t bad[2] = {4, -1};
    CHECK(ts_reshape(x, 2, bad) == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "cannot view shape [2, 3] (6 elements) as [4, -1]");
    ts_clear_error(ctx);
    CHECK(ts_slice(x, 5, 0, 1, 1) == NULL);
    CHECK_MSG(ctx, "slice: dim 5 out of range for 2 dims");
    ts_clear_error(ctx);
    CHECK(ts_slice(x, 0, 0, 1, 0) == NULL);
    CHECK_MSG(ctx, "step 0");
    ts_clear_error(ctx);
    int perm[2] = {0, 0};
    CHECK(ts_permute(x, perm) == NULL);
    CHECK_MSG(ctx, "not a permutation");
    ts_clear_error(ctx);
    int64_t e[2] = {3, 3};
    CHECK(ts_expand(x, 2, e) == NULL);
    CHECK_MSG(ctx, "cannot expand shape [2, 3] to [3, 3]");
    ts_clear_error(ctx);
    double v;
    CHECK(ts_item(x, &v) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "has 6 elements, not one");
    ts_clear_error(ctx);
    int64_t neg[1] = {-2};
    CHECK(ts_zeros(ctx, TS_F32, 1, neg) == NULL);
    CHECK_MSG(ctx, "dim 0 has size -2");
    ts_clear_error(ctx);
    /* a NULL input keeps the first error for the whole chain */
    ts_tensor *a = ts_reshape(x, 2, bad);
    ts_tensor *b = ts_exp(a);
    ts_tensor *c = ts_add(b, x);
    CHECK(!a && !b && !c);
    CHECK_MSG(ctx, "reshape: cannot view");
    ts_clear_error(ctx);
    CHECK(ts_arange(ctx, TS_F32, 0, 10, 0) == NULL);
    CHECK_MSG(ctx, "step must be nonzero");
    ts_clear_error(ctx);
    ts_release(x);
}

static void test_fill_copy(ts_ctx *ctx) {
    int64_t shape[2] = {3, 4};
    ts_tensor *x = ts_zeros(ctx, TS_BF16, 2, shape);
    ts_tensor *col = ts_slice(x, 1, 1, 2, 1);
    CHECK_OK(ctx, ts_fill_(col, 2.5));
    int64_t row_shape[1] = {4};
    float rv[4] = {1, 2, 3, 4};
    ts_tensor *row = ts_from_data(ctx, TS_F32, 1, row_shape, rv);
    ts_tensor *top = ts_slice(x, 0, 0, 2, 1);
    CHECK_OK(ctx, ts_copy_(top, row)); /* broadcast + cast into a view */
    float out[12];
    CHECK_OK(ctx, ts_tensor_read(x, out, TS_F32));
    CHECK(out[0] == 1 && out[1] == 2 && out[5] == 2 && out[9] == 2.5f &&
          out[8] == 0);
    ts_release(x), ts_release(col), ts_release(row), ts_release(top);
}

static void test_random(ts_ctx *ctx) {
    int64_t n = 100000;
    ts_tensor *a = ts_randn(ctx, TS_F32, 1, &n, 2.0, 7);
    ts_tensor *b = ts_randn(ctx, TS_F32, 1, &n, 2.0, 7);
    float *pa = ts_tensor_data(a), *pb = ts_tensor_data(b);
    CHECK(memcmp(pa, pb, sizeof(float) * (size_t)n) == 0);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++)
        s += pa[i], s2 += (double)pa[i] * pa[i];
    CHECK_NEAR(s / (double)n, 0.0, 0.03);
    CHECK_NEAR(sqrt(s2 / (double)n), 2.0, 0.03);
    ts_tensor *u = ts_rand(ctx, TS_F32, 1, &n, -1, 3, 9);
    float *pu = ts_tensor_data(u), lo = 10, hi = -10;
    for (int64_t i = 0; i < n; i++)
        lo = fminf(lo, pu[i]), hi = fmaxf(hi, pu[i]);
    CHECK(lo >= -1 && hi < 3 && lo < -0.99 && hi > 2.99);
    ts_release(a), ts_release(b), ts_release(u);
}

/* a producer's DLManagedTensor over a malloc'd buffer, counting deleter
 * calls */
typedef struct {
    DLManagedTensor m;
    int64_t shape[3], strides[3];
    float *buf;
    int *deleted;
} producer;

static void producer_deleter(DLManagedTensor *m) {
    producer *p = m->manager_ctx;
    (*p->deleted)++;
    free(p->buf);
    free(p);
}

static producer *producer_new(int *deleted) {
    producer *p = calloc(1, sizeof *p);
    p->buf = malloc(sizeof(float) * 24);
    for (int i = 0; i < 24; i++)
        p->buf[i] = (float)i;
    p->deleted = deleted;
    /* a (3, 4) view of a (4, 6) buffer's columns 1..4 of rows 1..3 */
    p->shape[0] = 3, p->shape[1] = 4;
    p->strides[0] = 6, p->strides[1] = 1;
    p->m.dl_tensor = (DLTensor){.data = p->buf,
                                .device = {kDLCPU, 0},
                                .ndim = 2,
                                .dtype = {kDLFloat, 32, 1},
                                .shape = p->shape,
                                .strides = p->strides,
                                .byte_offset = 7 * sizeof(float)};
    p->m.manager_ctx = p;
    p->m.deleter = producer_deleter;
    return p;
}

static void test_dlpack(ts_ctx *ctx) {
    /* import: strides and byte offset kept, no copy, deleter run once when
     * the last view dies */
    int deleted = 0;
    producer *p = producer_new(&deleted);
    ts_tensor *t = ts_from_dlpack(ctx, &p->m);
    CHECK(t != NULL);
    CHECK(ts_tensor_dim(t, 0) == 3 && ts_tensor_dim(t, 1) == 4);
    CHECK(ts_tensor_data(t) == (void *)(p->buf + 7));
    double v = 0;
    int64_t idx[2] = {2, 3};
    CHECK_OK(ctx, ts_get(t, idx, &v));
    CHECK(v == 7 + 2 * 6 + 3);
    p->buf[7] = 100; /* shared memory */
    int64_t z[2] = {0, 0};
    CHECK_OK(ctx, ts_get(t, z, &v));
    CHECK(v == 100);
    ts_tensor *sum = ts_sum(t, 0, NULL, false);
    double s = 0;
    CHECK_OK(ctx, ts_item(sum, &s));
    double want = 100 - 7;
    for (int r = 1; r <= 3; r++)
        for (int c = 1; c <= 4; c++)
            want += r * 6 + c;
    CHECK(s == want);
    ts_tensor *tt = ts_transpose(t, 0, 1);
    ts_release(t);
    CHECK(deleted == 0); /* the transposed view still holds it */
    ts_release(tt), ts_release(sum);
    CHECK(deleted == 1);

    /* refused imports keep the producer's ownership, with the reason */
    p = producer_new(&deleted);
    p->m.dl_tensor.dtype = (DLDataType){kDLFloat, 64, 1};
    CHECK(ts_from_dlpack(ctx, &p->m) == NULL);
    CHECK_MSG(ctx, "dtype float64 is not a Tessera dtype");
    ts_clear_error(ctx);
    p->m.dl_tensor.dtype = (DLDataType){kDLFloat, 32, 1};
    p->m.dl_tensor.device.device_type = kDLCUDA;
    CHECK(ts_from_dlpack(ctx, &p->m) == NULL);
    CHECK_MSG(ctx, "not host memory");
    ts_clear_error(ctx);
    p->m.dl_tensor.device.device_type = kDLCPU;
    p->strides[1] = -1;
    CHECK(ts_from_dlpack(ctx, &p->m) == NULL);
    CHECK_MSG(ctx, "negative stride");
    ts_clear_error(ctx);
    CHECK(deleted == 1);
    p->m.deleter(&p->m);
    CHECK(deleted == 2);

    /* export: a view of the tensor's memory holding a reference to it */
    int64_t shape[2] = {2, 3};
    ts_tensor *a = ts_arange(ctx, TS_F32, 0, 6, 1);
    ts_tensor *a2 = ts_reshape(a, 2, shape);
    ts_tensor *at = ts_transpose(a2, 0, 1);
    ts_release(a), ts_release(a2);
    DLManagedTensor *m = NULL;
    CHECK_OK(ctx, ts_to_dlpack(at, &m));
    ts_release(at); /* the export keeps it alive */
    CHECK(m && m->dl_tensor.ndim == 2 && m->dl_tensor.shape[0] == 3 &&
          m->dl_tensor.shape[1] == 2 && m->dl_tensor.strides[0] == 1 &&
          m->dl_tensor.strides[1] == 3);
    CHECK(m->dl_tensor.dtype.code == kDLFloat && m->dl_tensor.dtype.bits == 32);
    const float *d = m->dl_tensor.data;
    CHECK(d[2 * 1 + 1 * 3] == 5); /* element [2][1] = a2[1][2] */
    /* and back in: the same memory again */
    ts_tensor *back = ts_from_dlpack(ctx, m);
    CHECK(back && ts_tensor_data(back) == (void *)d);
    int64_t i21[2] = {2, 1};
    CHECK_OK(ctx, ts_get(back, i21, &v));
    CHECK(v == 5);
    ts_release(back); /* runs the export's deleter, releasing at */
}

int main(void) {
    ts_ctx *ctx = test_ctx();
    test_dlpack(ctx);
    test_bf16_rounding();
    __builtin_cpu_init();
    if (__builtin_cpu_supports("f16c"))
        test_f16_against_f16c();
    else
        printf("test_f16_against_f16c: skipped (no F16C on this CPU)\n");
    test_views(ctx);
    test_print(ctx);
    test_allocator();
    test_errors(ctx);
    test_fill_copy(ctx);
    test_random(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_tensor");
}
