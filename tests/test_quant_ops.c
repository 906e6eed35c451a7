/* test_quant_ops.c — tensors of the block formats (q8_0, q4_0, q4_k,
 * q5_k, q6_k) as the op set sees them: ts_cast quantizes with the
 * reference quantizer and dequantizes bit for bit; matmul takes them as
 * weights (x @ W.T) at decode and prefill row counts, in eager and compiled
 * mode and on another host device; embedding reads their rows; every
 * other use is a clear error. */
#include "backend/cpu/quant_gemm.h"
#include "core/quant.h"
#include "tessera_models.h"
#include "tessera_nn.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const ts_dtype QTYPES[] = {TS_Q8_0, TS_Q4_0, TS_Q4_K, TS_Q5_K, TS_Q6_K};
/* the int8 path quantizes activations too: max error over the output's
 * scale, per format (dequantized weights times f32 activations being the
 * reference); the f32 path (where cpu_gemm_wq_uses_f32) is within float
 * rounding */
static double tolerance(ts_dtype dt) {
    return dt == TS_Q8_0 ? 0.01 : 0.02;
}

static float *read_f32(ts_tensor *t) {
    int64_t n = ts_tensor_numel(t);
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (ts_tensor_read(t, v, TS_F32) != TS_OK) {
        free(v);
        return NULL;
    }
    return v;
}

/* ts_cast to a block format equals ts_quantize_row row by row, and back
 * to f32 equals ts_dequantize_row */
static void test_cast(ts_ctx *ctx, ts_dtype dt) {
    const int64_t N = 5, K = 512;
    int64_t shape[2] = {N, K};
    ts_tensor *w = ts_randn(ctx, TS_F32, 2, shape, 1.0, 7);
    ts_tensor *q = ts_cast(w, dt);
    CHECK(q && ts_tensor_dtype(q) == dt);
    ts_tensor *back = q ? ts_cast(q, TS_F32) : NULL;
    float *wf = read_f32(w), *bf = back ? read_f32(back) : NULL;
    size_t rb = (size_t)ts_dtype_nbytes(dt, K);
    char *blocks = malloc(rb);
    float *row = malloc(sizeof(float) * K);
    int bad_q = 0, bad_d = 0;
    const char *qd = q ? ts_tensor_data(q) : NULL;
    for (int64_t r = 0; qd && bf && r < N; r++) {
        ts_quantize_row(dt, wf + r * K, blocks, K);
        bad_q += memcmp(blocks, qd + r * rb, rb) != 0;
        ts_dequantize_row(dt, blocks, row, K);
        bad_d += memcmp(row, bf + r * K, sizeof(float) * K) != 0;
    }
    CHECK(qd && bf && bad_q == 0 && bad_d == 0);
    /* and to bf16: the dequantized values rounded */
    ts_tensor *b16 = q ? ts_cast(q, TS_BF16) : NULL;
    float *b16f = b16 ? read_f32(b16) : NULL;
    int bad16 = 0;
    for (int64_t i = 0; b16f && bf && i < N * K; i++)
        bad16 += b16f[i] != ts_bf16_to_f32(ts_f32_to_bf16(bf[i]));
    CHECK(b16f && bad16 == 0);
    free(wf), free(bf), free(blocks), free(row), free(b16f);
    ts_release(w), ts_release(q), ts_release(back), ts_release(b16);
}

/* y = x @ Wq.T against x @ dequant(Wq).T in f32, for R rows of x */
static void test_linear(ts_ctx *ctx, ts_dtype dt, int64_t R, bool compiled,
                        int device) {
    const int64_t N = 72, K = 768;
    int64_t ws[2] = {N, K}, xs[2] = {R, K};
    ts_tensor *w = ts_randn(ctx, TS_F32, 2, ws, 0.05, 11);
    ts_tensor *x = ts_randn(ctx, TS_F32, 2, xs, 1.0, 12 + (uint64_t)R);
    ts_tensor *q = ts_cast(w, dt), *wd = ts_cast(q, TS_F32);
    ts_tensor *ref = ts_linear(x, wd, NULL);
    ts_tensor *qx = q, *xx = x;
    ts_device here = ts_get_device(ctx);
    if (device) { /* on cpu:1: the weight's blocks copied there */
        ts_device d = {TS_DEVICE_CPU, device};
        qx = ts_to_device(q, d);
        xx = ts_to_device(x, d);
        ts_set_device(ctx, d);
    }
    ts_mode old = ts_set_mode(ctx, compiled ? TS_MODE_COMPILED : TS_MODE_EAGER);
    ts_tensor *y = ts_linear(xx, qx, NULL);
    float *yf = y ? read_f32(y) : NULL;
    ts_set_mode(ctx, old);
    ts_set_device(ctx, here);
    float *rf = read_f32(ref);
    double worst = 0, scale = 0;
    for (int64_t i = 0; yf && rf && i < R * N; i++)
        scale = fabs(rf[i]) > scale ? fabs(rf[i]) : scale;
    for (int64_t i = 0; yf && rf && i < R * N; i++) {
        double e = fabs((double)yf[i] - rf[i]) / scale;
        worst = e > worst ? e : worst;
    }
    /* the bf16 GEMM path rounds activations and weights to bf16 */
    double tol = cpu_gemm_wq_uses_bf16(cpu_isa_active(), dt, R) ? 0.01
                 : cpu_gemm_wq_uses_f32(cpu_isa_active(), dt, R)
                     ? 1e-5
                     : tolerance(dt);
    if (!yf || worst > tol)
        printf("linear %s R=%lld%s%s: max error %g of the output's scale "
               "(tol %g) %s\n",
               ts_dtype_name(dt), (long long)R, compiled ? " compiled" : "",
               device ? " cpu:1" : "", worst, tol, yf ? "" : ts_errmsg(ctx));
    CHECK(yf && worst <= tol);
    free(yf), free(rf);
    if (device)
        ts_release(qx), ts_release(xx);
    ts_release(w), ts_release(x), ts_release(q), ts_release(wd);
    ts_release(ref), ts_release(y);
}

/* embedding rows of a quantized table: the dequantized rows, as f32 */
static void test_embedding(ts_ctx *ctx, ts_dtype dt) {
    const int64_t V = 10, C = 256;
    int64_t ws[2] = {V, C}, is[1] = {4};
    int32_t ids[4] = {3, 0, 9, 3};
    ts_tensor *w = ts_randn(ctx, TS_F32, 2, ws, 1.0, 3);
    ts_tensor *q = ts_cast(w, dt), *wd = ts_cast(q, TS_F32);
    ts_tensor *id = ts_from_data(ctx, TS_I32, 1, is, ids);
    ts_tensor *e = ts_embedding(q, id);
    CHECK(e && ts_tensor_dtype(e) == TS_F32);
    float *ef = e ? read_f32(e) : NULL, *wf = read_f32(wd);
    int bad = 0;
    for (int i = 0; ef && i < 4; i++)
        bad += memcmp(ef + i * C, wf + ids[i] * C, sizeof(float) * C) != 0;
    CHECK(ef && bad == 0);
    free(ef), free(wf);
    ts_release(w), ts_release(q), ts_release(wd), ts_release(id);
    ts_release(e);
}

/* uses a weight format cannot serve: each a clear error */
static void test_errors(ts_ctx *ctx) {
    int64_t ws[2] = {4, 64}, odd[2] = {4, 48};
    ts_tensor *w = ts_randn(ctx, TS_F32, 2, ws, 1.0, 1);
    ts_tensor *q = ts_cast(w, TS_Q8_0);
    ts_tensor *r = ts_add(q, q);
    CHECK(!r && ts_ctx_status(ctx) == TS_ERR_DTYPE);
    CHECK_MSG(ctx, "q8_0, a quantized weight format");
    ts_clear_error(ctx);
    r = ts_slice(q, 1, 0, 16, 1);
    CHECK(!r);
    CHECK_MSG(ctx, "quantized weight format");
    ts_clear_error(ctx);
    ts_tensor *k4 = ts_cast(w, TS_Q4_K); /* 64 is not whole 256-blocks */
    CHECK(!k4 && ts_ctx_status(ctx) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "not a multiple of the block size 256");
    ts_clear_error(ctx);
    ts_tensor *e = ts_empty(ctx, TS_Q8_0, 2, odd);
    CHECK(!e);
    CHECK_MSG(ctx, "holds whole blocks of 32 along its last dim");
    ts_clear_error(ctx);
    /* a transposed view as an embedding table: its rows are not rows of
     * blocks */
    ts_tensor *qt = ts_transpose(q, 0, 1);
    int32_t one_id = 0;
    int64_t one[1] = {1};
    ts_tensor *id1 = ts_from_data(ctx, TS_I32, 1, one, &one_id);
    r = qt ? ts_embedding(qt, id1) : NULL;
    CHECK(qt && !r);
    CHECK_MSG(ctx, "a q8_0 table is read as whole rows of blocks");
    ts_clear_error(ctx);
    ts_release(qt), ts_release(id1);
    /* x @ Wq (not transposed): the blocks run along the wrong dim */
    int64_t xs[2] = {2, 4};
    ts_tensor *x = ts_randn(ctx, TS_F32, 2, xs, 1.0, 2);
    r = ts_matmul(x, q);
    CHECK(!r);
    CHECK_MSG(ctx, "must be the transpose of a whole (N, K) weight (x @ W.T)");
    ts_clear_error(ctx);
    ts_release(w), ts_release(q), ts_release(x);
}

/* llama.cpp's choice per tensor, transcribed from llama_tensor_get_type
 * for a 28-layer model: Q4_K_M gives v_proj and down_proj Q6_K in the
 * layers i < 3, i >= 24 and (i - 3) % 3 == 2; the head Q6_K */
static void test_type_policy(void) {
    const int more[] = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27};
    for (int i = 0; i < 28; i++) {
        bool m = false;
        for (size_t k = 0; k < sizeof more / sizeof *more; k++)
            m |= more[k] == i;
        char v[96], d[96], q[96];
        snprintf(v, sizeof v, "model.layers.%d.self_attn.v_proj.weight", i);
        snprintf(d, sizeof d, "model.layers.%d.mlp.down_proj.weight", i);
        snprintf(q, sizeof q, "model.layers.%d.self_attn.q_proj.weight", i);
        CHECK(ts_quantize_tensor_type("q4_k_m", v, 2, 1024, 28, true) ==
              (m ? TS_Q6_K : TS_Q4_K));
        CHECK(ts_quantize_tensor_type("q4_k_m", d, 2, 3072, 28, true) ==
              (m ? TS_Q6_K : TS_Q4_K));
        CHECK(ts_quantize_tensor_type("q4_k_m", q, 2, 1024, 28, true) ==
              TS_Q4_K);
        CHECK(ts_quantize_tensor_type("q4_k_s", v, 2, 1024, 28, true) ==
              (i < 4 ? TS_Q5_K : TS_Q4_K));
        CHECK(ts_quantize_tensor_type("q4_k_s", d, 2, 3072, 28, true) ==
              (i < 3 ? TS_Q5_K : TS_Q4_K));
        CHECK(ts_quantize_tensor_type("q8_0", v, 2, 1024, 28, true) == TS_Q8_0);
    }
    /* the head (or the tied table) and the untied table */
    CHECK(ts_quantize_tensor_type("q4_k_m", "lm_head.weight", 2, 1024, 28,
                                  false) == TS_Q6_K);
    CHECK(ts_quantize_tensor_type("q4_k_m", "model.embed_tokens.weight", 2,
                                  1024, 28, true) == TS_Q6_K);
    CHECK(ts_quantize_tensor_type("q4_k_m", "model.embed_tokens.weight", 2,
                                  1024, 28, false) == TS_Q4_K);
    CHECK(ts_quantize_tensor_type("q8_0", "lm_head.weight", 2, 1024, 28,
                                  false) == TS_Q8_0);
    CHECK(ts_quantize_tensor_type("q4_0", "lm_head.weight", 2, 1024, 28,
                                  false) == TS_Q6_K);
    /* norms stay f32; rows that are not whole blocks fall back */
    CHECK(ts_quantize_tensor_type("q4_k_m", "model.norm.weight", 1, 1024, 28,
                                  true) == TS_F32);
    CHECK(ts_quantize_tensor_type("q4_k_m", "model.layers.0.mlp.up_proj.weight",
                                  2, 96, 28, true) == TS_Q8_0);
    CHECK(ts_quantize_tensor_type("q8_0", "model.layers.0.mlp.up_proj.weight",
                                  2, 40, 28, true) == TS_F16);
    CHECK(ts_quantize_tensor_type("bf16", "model.layers.0.mlp.up_proj.weight",
                                  2, 40, 28, true) == TS_BF16);
}

/* a small model quantized in place: logits close to the bf16 model's,
 * the same next token at most positions */
static void test_decoder_quantize(ts_ctx *ctx) {
    ts_model_config c = tu_config("qwen3");
    c.vocab = 512, c.hidden = 256, c.layers = 2, c.heads = 4, c.kv_heads = 2;
    c.head_dim = 64, c.intermediate = 512, c.max_positions = 64;
    c.tie_word_embeddings = true;
    const char *types[] = {"q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0"};
    /* max |logit error| over the largest |logit|: measured 0.015, 0.052,
     * 0.075, 0.146, 0.177 with these seeds; the bounds leave ~1.5x */
    const double tol[] = {0.025, 0.08, 0.12, 0.22, 0.27};
    int64_t shape[2] = {1, 24};
    int64_t ids[24];
    for (int i = 0; i < 24; i++)
        ids[i] = (i * 37 + 5) % c.vocab;
    ts_decoder_options o = {.weight_dtype = TS_F32};
    ts_decoder *ref;
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, &o, 3, &ref));
    ts_tensor *in = ts_from_data(ctx, TS_I64, 2, shape, ids);
    ts_tensor *lr = ts_decoder_forward(ref, in, 0);
    float *rf = lr ? read_f32(lr) : NULL;
    for (size_t t = 0; t < sizeof types / sizeof *types && rf; t++) {
        ts_decoder *m;
        CHECK_OK(ctx, ts_decoder_new(ctx, &c, &o, 3, &m));
        CHECK_OK(ctx, ts_decoder_quantize(m, types[t]));
        ts_tensor *lq = ts_decoder_forward(m, in, 0);
        float *qf = lq ? read_f32(lq) : NULL;
        double worst = 0, scale = 0;
        int agree = 0;
        for (int p = 0; qf && p < 24; p++) {
            int br = 0, bq = 0;
            for (int v = 0; v < c.vocab; v++) {
                float a = rf[p * c.vocab + v], b = qf[p * c.vocab + v];
                scale = fabs(a) > scale ? fabs(a) : scale;
                worst = fabs(a - b) > worst ? fabs(a - b) : worst;
                br = a > rf[p * c.vocab + br] ? v : br;
                bq = b > qf[p * c.vocab + bq] ? v : bq;
            }
            agree += br == bq;
        }
        printf("test_quant_ops: %s model: max logit error %.4f of %.3f, "
               "top-1 agreement %d/24\n",
               types[t], worst, scale, agree);
        CHECK(qf && worst <= tol[t] * scale && agree >= 18);
        free(qf);
        ts_release(lq);
        ts_decoder_free(m);
    }
    ts_tensor *w = ts_decoder_find_param(ref, "model.embed_tokens.weight");
    CHECK(w && ts_tensor_dtype(w) == TS_F32);
    ts_decoder *bad;
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, &o, 1, &bad));
    CHECK(ts_decoder_quantize(bad, "q3_k") == TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, "unknown type \"q3_k\"");
    ts_clear_error(ctx);
    ts_decoder_free(bad);
    free(rf);
    ts_release(in), ts_release(lr);
    ts_decoder_free(ref);
}

int main(void) {
    ts_ctx *ctx = test_ctx();
    for (size_t i = 0; i < sizeof QTYPES / sizeof *QTYPES; i++) {
        ts_dtype dt = QTYPES[i];
        test_cast(ctx, dt);
        test_embedding(ctx, dt);
        const int64_t rows[] = {1, 3, 8, 17, 40};
        for (size_t r = 0; r < sizeof rows / sizeof *rows; r++)
            test_linear(ctx, dt, rows[r], false, 0);
        test_linear(ctx, dt, 5, true, 0);
        test_linear(ctx, dt, 2, false, 1);
    }
    test_errors(ctx);
    test_type_policy();
    test_decoder_quantize(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_quant_ops");
}
