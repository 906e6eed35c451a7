/* test_decode_gemm.c — decode's products against bf16 weights, Y (R, N) =
 * A (R, K) f32 @ W^T with W (N, K) bf16, at every ISA level this machine
 * runs, and the packed weights a decoder keeps for them:
 *   - the f32 path of each level (cpu_gemm_f32_w16t: widen-in-registers
 *     tiles up to 64 rows, a plain loop at sse2) and, at avx512_bf16, the
 *     bf16 GEMM (cpu_gemm_bf16: streaming up to 64 rows, blocked above;
 *     cpu_gemm_bf16_packed; cpu_gemm_bf16_blocked) for R = 1 .. 64, 65,
 *     100, 300 rows, odd N, K even and odd, padded rows: within the bound
 *     of a sum of K rounded products from the double-precision reference;
 *   - bitwise: row r of an R-row product equals row r computed alone (every
 *     R of the bf16 GEMM, R <= 64 of the f32 paths), and the bf16 paths
 *     (unpacked, packed, blocked) agree bit for bit;
 *   - a weight packed on its storage (pack_wanted) then written (ts_copy_
 *     eager and recorded in a compiled graph, ts_set, ts_fill_, the data
 *     pointer, an AdamW step): products follow the new values;
 *   - ts_decoder_prepack: a tiny Qwen3 with random bf16 weights (tied and
 *     untied head) gives the same logits bits for R sequences at once as
 *     for each alone, prepacked or not, and again after a training step;
 *     a GPT-2 (Conv1D projections, x @ W) the same bits prepacked or not.
 * Argument "model" runs only the op and model parts at the active level
 * (tests/CMakeLists.txt runs them once per level through at_isa.sh).
 *
 * Bounds: the bf16 paths sum K products of bf16-rounded operands (each
 * exact in f32) in one f32 chain (K roundings), so |err| <= (K + 3) 2^-24
 * sum|a w| as in test_gemm_bf16.c; the f32 paths add f32 a times bf16 w
 * in L lanes of K / L fused steps each, then the L lanes in a tree: under
 * (K + 8) 2^-24 sum|a w|. A missing or doubled product errs by about
 * sum|a w| / K, far above both for the K used here. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemm_bf16.h"
#include "core/core.h"
#include "tessera_models.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>

static uint64_t rng = 0x853c49e6748fea9bull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

enum { RMAX = 300 };
static const int64_t extra_rows[] = {65, 100, 300};

/* one shape's operands, the reference and |a| |w| sums of its RMAX rows */
typedef struct {
    int64_t N, K, lda, ldw;
    float *A;                /* RMAX rows lda apart */
    uint16_t *W;             /* N rows ldw apart */
    double *ref[2], *mag[2]; /* [0] f32 A, [1] A rounded to bf16 */
} shape;

static shape make_shape(int64_t N, int64_t K, int64_t pad) {
    shape s = {.N = N, .K = K, .lda = K + pad, .ldw = K + 2 * pad};
    s.A = malloc(sizeof(float) * (size_t)(RMAX * s.lda));
    s.W = malloc(sizeof(uint16_t) * (size_t)(N * s.ldw));
    for (int64_t i = 0; i < RMAX * s.lda; i++)
        s.A[i] = frand();
    for (int64_t i = 0; i < N * s.ldw; i++)
        s.W[i] = ts_f32_to_bf16(frand());
    for (int b = 0; b < 2; b++) {
        s.ref[b] = malloc(sizeof(double) * (size_t)(RMAX * N));
        s.mag[b] = malloc(sizeof(double) * (size_t)(RMAX * N));
        for (int64_t r = 0; r < RMAX; r++)
            for (int64_t n = 0; n < N; n++) {
                double sum = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    float a = s.A[r * s.lda + k];
                    if (b)
                        a = ts_bf16_to_f32(ts_f32_to_bf16(a));
                    double p = (double)a * ts_bf16_to_f32(s.W[n * s.ldw + k]);
                    sum += p, mag += fabs(p);
                }
                s.ref[b][r * N + n] = sum, s.mag[b][r * N + n] = mag;
            }
    }
    return s;
}

static void free_shape(shape *s) {
    free(s->A), free(s->W);
    for (int b = 0; b < 2; b++)
        free(s->ref[b]), free(s->mag[b]);
}

/* Y (R rows, ldy apart) against the reference; the columns past N kept */
static bool within_bound(const shape *s, int64_t R, const float *Y, int64_t ldy,
                         bool bf16, const char *what) {
    double slack = bf16 ? 3 : 8;
    int64_t bad = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = 0; n < s->N; n++) {
            double ref = s->ref[bf16][r * s->N + n];
            double tol =
                ((double)s->K + slack) * 0x1p-24 * s->mag[bf16][r * s->N + n] +
                1e-30;
            double err = fabs((double)Y[r * ldy + n] - ref);
            if (!(err <= tol) && bad++ < 3)
                fprintf(stderr,
                        "%s R=%lld N=%lld K=%lld: Y[%lld,%lld] = %.9g, "
                        "ref %.9g, tol %g\n",
                        what, (long long)R, (long long)s->N, (long long)s->K,
                        (long long)r, (long long)n, Y[r * ldy + n], ref, tol);
        }
    return bad == 0;
}

static bool same_rows(const float *a, int64_t lda, const float *b, int64_t ldb,
                      int64_t R, int64_t N) {
    for (int64_t r = 0; r < R; r++)
        if (memcmp(a + r * lda, b + r * ldb, sizeof(float) * (size_t)N))
            return false;
    return true;
}

/* ---- the f32 path of one level ---- */

static void check_f32_level(const cpu_kernel_set *ks, const shape *s) {
    const char *lv = cpu_isa_name(ks->isa);
    int64_t N = s->N, K = s->K;
    float *alone = malloc(sizeof(float) * (size_t)(RMAX * N));
    float *Y = malloc(sizeof(float) * (size_t)(RMAX * N));
    /* every row alone (R = 1) */
    for (int64_t r = 0; r < RMAX; r++)
        CHECK(ks->gemm_f32_w16t(1, N, K, s->A + r * s->lda, s->lda, s->W,
                                s->ldw, true, alone + r * N));
    CHECK(within_bound(s, RMAX, alone, N, false, lv));
    for (int64_t R = 2; R <= 64 + 3; R++) {
        int64_t rows = R <= 64 ? R : extra_rows[R - 65];
        CHECK(
            ks->gemm_f32_w16t(rows, N, K, s->A, s->lda, s->W, s->ldw, true, Y));
        bool ok = within_bound(s, rows, Y, N, false, lv);
        CHECK(ok);
        if (rows <= 64) { /* decode's rows: the bits of each row alone */
            bool same = same_rows(Y, N, alone, N, rows, N);
            CHECK(same);
            if (!same)
                fprintf(stderr,
                        "f32 path at %s: N=%lld K=%lld: a row of R=%lld "
                        "differs from the row alone\n",
                        lv, (long long)N, (long long)K, (long long)rows);
        }
    }
    free(alone), free(Y);
}

/* ---- the bf16 GEMM: unpacked, packed, blocked ---- */

static void check_bf16(cpu_isa isa, const shape *s) {
    int64_t N = s->N, K = s->K, ldc = N + 2;
    size_t bytes = sizeof(float) * (size_t)(RMAX * ldc);
    float *alone = malloc(bytes), *Y = malloc(bytes), *P = malloc(bytes),
          *B = malloc(bytes);
    cpu_bf16_packed *pb = cpu_bf16_pack_b(isa, K, N, s->W, TS_BF16, 1, s->ldw);
    CHECK(pb != NULL);
    CHECK(cpu_bf16_packed_matches(pb, K, N, s->W, TS_BF16, 1, s->ldw));
    CHECK(!cpu_bf16_packed_matches(pb, K, N, s->W + 1, TS_BF16, 1, s->ldw));
    CHECK(cpu_bf16_packed_bytes(pb) >= (size_t)(2 * N * K));
    if (!pb)
        return;
    for (int64_t r = 0; r < RMAX; r++)
        CHECK(cpu_gemm_bf16(isa, 1, N, K, s->A + r * s->lda, TS_F32, s->lda, 1,
                            s->W, TS_BF16, 1, s->ldw, alone + r * ldc, ldc,
                            false));
    CHECK(within_bound(s, RMAX, alone, ldc, true, "bf16 rows alone"));
    for (int64_t R = 1; R <= 64 + 3; R++) {
        int64_t rows = R <= 64 ? R : extra_rows[R - 65];
        for (int64_t i = 0; i < rows * ldc; i++)
            Y[i] = P[i] = B[i] = -7.0f; /* the pads must stay */
        CHECK(cpu_gemm_bf16(isa, rows, N, K, s->A, TS_F32, s->lda, 1, s->W,
                            TS_BF16, 1, s->ldw, Y, ldc, false));
        CHECK(cpu_gemm_bf16_packed(isa, rows, s->A, TS_F32, s->lda, 1, pb, P,
                                   ldc, false));
        CHECK(cpu_gemm_bf16_blocked(isa, rows, N, K, s->A, TS_F32, s->lda, 1,
                                    NULL, TS_BF16, 0, 0, pb, B, ldc, false));
        CHECK(within_bound(s, rows, Y, ldc, true, "bf16"));
        bool same = same_rows(Y, ldc, alone, ldc, rows, N) &&
                    !memcmp(Y, P, sizeof(float) * (size_t)(rows * ldc)) &&
                    !memcmp(Y, B, sizeof(float) * (size_t)(rows * ldc));
        CHECK(same);
        if (!same)
            fprintf(stderr,
                    "bf16 GEMM N=%lld K=%lld R=%lld: rows differ from the "
                    "rows alone, or packed / blocked from unpacked\n",
                    (long long)N, (long long)K, (long long)rows);
        int64_t kept = 0;
        for (int64_t r = 0; r < rows; r++)
            kept += Y[r * ldc + N] == -7.0f && Y[r * ldc + N + 1] == -7.0f &&
                    P[r * ldc + N] == -7.0f && P[r * ldc + N + 1] == -7.0f;
        CHECK(kept == rows);
    }
    /* acc: C += A @ B is one chain from the old C, alone or batched */
    for (int64_t i = 0; i < 9 * ldc; i++)
        Y[i] = P[i] = frand();
    CHECK(cpu_gemm_bf16_packed(isa, 9, s->A, TS_F32, s->lda, 1, pb, Y, ldc,
                               true));
    for (int64_t r = 0; r < 9; r++)
        CHECK(cpu_gemm_bf16(isa, 1, N, K, s->A + r * s->lda, TS_F32, s->lda, 1,
                            s->W, TS_BF16, 1, s->ldw, P + r * ldc, ldc, true));
    CHECK(same_rows(Y, ldc, P, ldc, 9, N));
    cpu_bf16_packed_free(pb);
    free(alone), free(Y), free(P), free(B);
}

static void test_kernels(void) {
    /* N odd (one strip and a part; several), K even and odd, below one
     * vector, with and without padded rows */
    const int64_t shapes[][3] = {{67, 200, 3}, {97, 201, 0}, {131, 33, 1},
                                 {5, 7, 2},    {49, 64, 0},  {1, 100, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        shape s = make_shape(shapes[i][0], shapes[i][1], shapes[i][2]);
        for (int l = 0; l <= (int)cpu_isa_detected(); l++) {
            const cpu_kernel_set *ks = cpu_kernels_for((cpu_isa)l);
            if (ks)
                check_f32_level(ks, &s);
        }
        if (cpu_isa_detected() >= CPU_ISA_AVX512_BF16)
            check_bf16(CPU_ISA_AVX512_BF16, &s);
        free_shape(&s);
    }
}

/* ---- a packed weight, written ---- */

static ts_tensor *rand_tensor(ts_ctx *ctx, ts_dtype dt, int64_t r, int64_t c,
                              uint64_t seed) {
    int64_t shp[2] = {r, c};
    ts_tensor *t = ts_rand(ctx, TS_F32, 2, shp, -1, 1, seed);
    if (dt == TS_F32)
        return t;
    ts_tensor *u = ts_cast(t, dt);
    ts_release(t);
    return u;
}

/* x @ w.T read back into out (R x N floats) */
static void product(ts_tensor *x, ts_tensor *w, float *out) {
    ts_tensor *y = ts_linear(x, w, NULL);
    CHECK(y != NULL);
    if (y)
        CHECK_OK(ts_tensor_ctx(x), ts_tensor_read(y, out, TS_F32));
    ts_release(y);
}

/* the product through a weight nobody packed, with w's present values */
static void fresh_product(ts_tensor *x, ts_tensor *w, float *out) {
    ts_tensor *c = ts_contiguous(w);
    ts_tensor *d = c ? ts_cast(c, TS_F32) : NULL;
    ts_tensor *e = d ? ts_cast(d, TS_BF16) : NULL; /* a new storage */
    CHECK(e != NULL && e->storage != w->storage);
    if (e)
        product(x, e, out);
    ts_release(c), ts_release(d), ts_release(e);
}

static void test_written_after_packing(ts_ctx *ctx) {
    const int64_t R = 5, N = 77, K = 45;
    bool packs = cpu_isa_active() >= CPU_ISA_AVX512_BF16;
    ts_tensor *x = rand_tensor(ctx, TS_F32, R, K, 1);
    ts_tensor *w = rand_tensor(ctx, TS_BF16, N, K, 2);
    ts_tensor *w2 = rand_tensor(ctx, TS_BF16, N, K, 3);
    float *y = malloc(sizeof(float) * R * N),
          *e = malloc(sizeof(float) * R * N);
    w->storage->pack_wanted = true;
    product(x, w, y); /* packs at the first product */
    CHECK((w->storage->packed != NULL) == packs);
    fresh_product(x, w, e);
    CHECK(!memcmp(y, e, sizeof(float) * R * N));

    /* ts_copy_ (eager) */
    CHECK_OK(ctx, ts_copy_(w, w2));
    CHECK(w->storage->packed == NULL);
    product(x, w, y);
    fresh_product(x, w2, e);
    CHECK(!memcmp(y, e, sizeof(float) * R * N));
    CHECK((w->storage->packed != NULL) == packs); /* packed again */

    /* ts_set, ts_fill_, a write through the data pointer */
    int64_t at[2] = {3, 4};
    CHECK_OK(ctx, ts_set(w, at, 100.0));
    CHECK(w->storage->packed == NULL);
    product(x, w, y);
    fresh_product(x, w, e);
    CHECK(!memcmp(y, e, sizeof(float) * R * N));
    CHECK_OK(ctx, ts_fill_(w, 0.5));
    product(x, w, y);
    fresh_product(x, w, e);
    CHECK(!memcmp(y, e, sizeof(float) * R * N));
    uint16_t *p = ts_tensor_data(w);
    CHECK(p != NULL && w->storage->packed == NULL);
    if (p)
        for (int64_t i = 0; i < N * K; i += 7)
            p[i] = ts_f32_to_bf16(-2.0f);
    product(x, w, y);
    fresh_product(x, w, e);
    CHECK(!memcmp(y, e, sizeof(float) * R * N));

    /* compiled: a product, a recorded write, a product; the write happens
     * at ts_sync, between the two, after the first packed the old values */
    ts_tensor *w3 = rand_tensor(ctx, TS_BF16, N, K, 4);
    float *y1 = malloc(sizeof(float) * R * N),
          *e1 = malloc(sizeof(float) * R * N);
    fresh_product(x, w, e1);
    fresh_product(x, w3, e);
    ts_set_mode(ctx, TS_MODE_COMPILED);
    ts_tensor *a = ts_linear(x, w, NULL);
    CHECK_OK(ctx, ts_copy_(w, w3));
    ts_tensor *b = ts_linear(x, w, NULL);
    CHECK_OK(ctx, ts_sync(ctx));
    ts_set_mode(ctx, TS_MODE_EAGER);
    CHECK(a && b);
    if (a && b) {
        CHECK_OK(ctx, ts_tensor_read(a, y1, TS_F32));
        CHECK_OK(ctx, ts_tensor_read(b, y, TS_F32));
        CHECK(!memcmp(y1, e1, sizeof(float) * R * N));
        CHECK(!memcmp(y, e, sizeof(float) * R * N));
    }
    ts_release(a), ts_release(b), ts_release(w3);

    /* an optimizer step on the packed weight */
    CHECK_OK(ctx, ts_set_requires_grad(w, true));
    ts_adamw *opt = NULL;
    ts_adamw_options o = ts_adamw_default_options();
    o.lr = 0.05;
    CHECK_OK(ctx, ts_adamw_new(ctx, &w, 1, &o, &opt));
    ts_tensor *l = ts_linear(x, w, NULL);
    ts_tensor *loss = l ? ts_sum(l, 0, NULL, false) : NULL;
    CHECK(loss != NULL);
    if (loss && opt) {
        CHECK_OK(ctx, ts_backward(loss, NULL));
        fresh_product(x, w, e1);
        CHECK_OK(ctx, ts_adamw_step(opt));
        CHECK(w->storage->packed == NULL);
        bool old = ts_set_grad_enabled(ctx, false);
        product(x, w, y);
        fresh_product(x, w, e);
        ts_set_grad_enabled(ctx, old);
        CHECK(!memcmp(y, e, sizeof(float) * R * N));
        CHECK(memcmp(y, e1, sizeof(float) * R * N)); /* it moved */
    }
    ts_release(l), ts_release(loss);
    ts_adamw_free(opt);

    /* a storage holds one packed view: another view is multiplied as it is */
    ts_set_requires_grad(w, false);
    ts_zero_grad(w);
    product(x, w, y);
    ts_tensor *part = ts_slice(w, 0, 0, 40, 1);
    float *yp = malloc(sizeof(float) * R * 40),
          *ep = malloc(sizeof(float) * R * 40);
    product(x, part, yp);
    fresh_product(x, part, ep);
    CHECK(!memcmp(yp, ep, sizeof(float) * R * 40));
    ts_release(part);
    free(yp), free(ep);

    /* freed with its storage */
    ts_release(x), ts_release(w), ts_release(w2);
    free(y), free(e), free(y1), free(e1);
}

/* ---- a decoder, prepacked ---- */

static ts_model_config tiny(bool tied) {
    ts_model_config c = tu_config("qwen3");
    c.vocab = 101, c.hidden = 34, c.intermediate = 50, c.layers = 2;
    c.heads = 4, c.kv_heads = 2, c.head_dim = 8;
    c.norm_eps = 1e-6, c.rope_theta = 10000, c.max_positions = 64;
    c.tie_word_embeddings = tied;
    return c;
}

/* logits (R * T, V) of R sequences of T tokens each */
static float *logits_of(ts_decoder *m, const int64_t *ids, int64_t R,
                        int64_t T) {
    ts_ctx *ctx = ts_tensor_ctx(ts_decoder_param(m, 0));
    int64_t shp[2] = {R, T}, V = ts_decoder_get_config(m)->vocab;
    ts_tensor *t = ts_from_data(ctx, TS_I64, 2, shp, ids);
    ts_tensor *l = t ? ts_decoder_forward(m, t, 0) : NULL;
    float *out = malloc(sizeof(float) * (size_t)(R * T * V));
    CHECK(l != NULL);
    if (l)
        CHECK_OK(ctx, ts_tensor_read(l, out, TS_F32));
    ts_release(t), ts_release(l);
    return out;
}

/* every sequence of a batch against itself alone: the same bits (rows
 * through the f32 paths only up to 64, their R-independent range) */
static void batch_vs_alone(ts_decoder *m, const char *what) {
    int64_t V = ts_decoder_get_config(m)->vocab;
    bool bf16 = cpu_isa_active() >= CPU_ISA_AVX512_BF16;
    const int64_t batches[][2] = {{2, 1}, {5, 1},  {16, 1}, {64, 1},
                                  {3, 3}, {21, 3}, {70, 1}, {40, 3}};
    int64_t ids[210 * 3];
    for (int i = 0; i < 210 * 3; i++)
        ids[i] = (int64_t)((frand() + 1.0f) * 50.0f) % V;
    for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
        int64_t R = batches[b][0], T = batches[b][1];
        if (R * T > 64 && !bf16)
            continue;
        float *all = logits_of(m, ids, R, T);
        int64_t differ = 0;
        for (int64_t r = 0; r<R; r += R> 8 ? 5 : 1) {
            float *one = logits_of(m, ids + r * T, 1, T);
            differ += memcmp(one, all + r * T * V,
                             sizeof(float) * (size_t)(T * V)) != 0;
            free(one);
        }
        CHECK(differ == 0);
        if (differ)
            fprintf(stderr,
                    "%s at %s: %lld of %lld sequences (T = %lld) differ "
                    "batched from alone\n",
                    what, cpu_isa_name(cpu_isa_active()), (long long)differ,
                    (long long)R, (long long)T);
        free(all);
    }
}

static void test_decoder_prepack(ts_ctx *ctx, bool tied) {
    ts_model_config c = tiny(tied);
    ts_decoder_options o = {.weight_dtype = TS_BF16};
    ts_decoder *m = NULL, *plain = NULL;
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, &o, 7, &m));
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, &o, 7, &plain));
    if (!m || !plain)
        return;
    bool packs = cpu_isa_active() >= CPU_ISA_AVX512_BF16;
    CHECK(ts_decoder_packed_bytes(m) == 0);
    CHECK_OK(ctx, ts_decoder_prepack(m));
    /* the matrices' bytes at least: 2 layers of q, k, v, o, gate, up,
     * down, and the head */
    int64_t C = c.hidden, F = c.intermediate, Q = c.heads * c.head_dim,
            KV = c.kv_heads * c.head_dim;
    int64_t least =
        2 * (c.layers * (Q * C + 2 * KV * C + C * Q + 3 * F * C) + c.vocab * C);
    int64_t got = ts_decoder_packed_bytes(m);
    CHECK(packs ? got >= least : got == 0);
    if (packs && got < least)
        fprintf(stderr, "packed bytes %lld, the matrices hold %lld\n",
                (long long)got, (long long)least);
    /* the embedding table is packed only as a tied head */
    ts_tensor *emb = ts_decoder_find_param(m, "model.embed_tokens.weight");
    CHECK(emb && (emb->storage->packed != NULL) == (packs && tied));
    CHECK(ts_decoder_find_param(m, "model.norm.weight")->storage->packed ==
          NULL);

    bool old = ts_set_grad_enabled(ctx, false);
    batch_vs_alone(m, tied ? "prepacked, tied" : "prepacked, untied");
    /* packed or not: the same logits */
    int64_t ids[12] = {1, 5, 9, 100, 42, 7, 3, 3, 0, 64, 2, 8};
    float *a = logits_of(m, ids, 4, 3), *b = logits_of(plain, ids, 4, 3);
    CHECK(!memcmp(a, b, sizeof(float) * 12 * (size_t)c.vocab));
    free(a), free(b);
    ts_set_grad_enabled(ctx, old);

    /* a training step on both: the packed copies follow the new values */
    ts_decoder *both[2] = {m, plain};
    int64_t tg[12] = {5, 9, 100, 42, 7, 3, 3, 0, 64, 2, 8, 1};
    for (int i = 0; i < 2; i++) {
        ts_adamw *opt = NULL;
        CHECK_OK(ctx, ts_adamw_new(ctx, ts_decoder_params(both[i]),
                                   ts_decoder_num_params(both[i]), NULL, &opt));
        int64_t shp[2] = {4, 3};
        ts_tensor *x = ts_from_data(ctx, TS_I64, 2, shp, ids);
        ts_tensor *t = ts_from_data(ctx, TS_I64, 2, shp, tg);
        ts_tensor *loss = ts_decoder_loss(both[i], x, t, NULL);
        CHECK(loss != NULL);
        if (loss && opt) {
            CHECK_OK(ctx, ts_backward(loss, NULL));
            CHECK_OK(ctx, ts_adamw_step(opt));
        }
        ts_release(x), ts_release(t), ts_release(loss);
        ts_adamw_free(opt);
    }
    old = ts_set_grad_enabled(ctx, false);
    a = logits_of(m, ids, 4, 3), b = logits_of(plain, ids, 4, 3);
    CHECK(!memcmp(a, b, sizeof(float) * 12 * (size_t)c.vocab));
    free(a), free(b);
    CHECK(packs ? ts_decoder_packed_bytes(m) >= least
                : ts_decoder_packed_bytes(m) == 0);
    batch_vs_alone(m, "prepacked, after a step");
    ts_set_grad_enabled(ctx, old);
    ts_decoder_free(m);
    ts_decoder_free(plain);
}

/* GPT-2: Conv1D projections multiply x @ W (W (in, out)), the head x @
 * wte.T: both packed, the same bits as unpacked; at the AVX512_BF16 level
 * a sequence's logits the same batched or alone (below it the Conv1D
 * products go through the general f32 path, not the decode kernel) */
static void test_gpt2_prepack(ts_ctx *ctx) {
    ts_model_config c = tu_config("gpt2");
    c.vocab = 97, c.hidden = 32, c.layers = 2, c.heads = 4, c.kv_heads = 4;
    c.head_dim = 8, c.intermediate = 72, c.max_positions = 64;
    ts_decoder_options o = {.weight_dtype = TS_BF16};
    ts_decoder *m = NULL, *plain = NULL;
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, &o, 3, &m));
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, &o, 3, &plain));
    if (!m || !plain)
        return;
    bool packs = cpu_isa_active() >= CPU_ISA_AVX512_BF16;
    CHECK_OK(ctx, ts_decoder_prepack(m));
    int conv = 0, packed = 0;
    for (int i = 0; i < ts_decoder_num_params(m); i++)
        if (strstr(ts_decoder_param_name(m, i), "c_attn.weight") ||
            strstr(ts_decoder_param_name(m, i), "c_fc.weight")) {
            conv++;
            packed += ts_decoder_param(m, i)->storage->packed != NULL;
        }
    CHECK(conv == 4 && packed == (packs ? conv : 0));
    bool old = ts_set_grad_enabled(ctx, false);
    int64_t ids[12] = {1, 5, 9, 96, 42, 7, 3, 3, 0, 64, 2, 8};
    float *a = logits_of(m, ids, 4, 3), *b = logits_of(plain, ids, 4, 3);
    CHECK(!memcmp(a, b, sizeof(float) * 12 * (size_t)c.vocab));
    free(a), free(b);
    if (packs)
        batch_vs_alone(m, "gpt2, prepacked");
    ts_set_grad_enabled(ctx, old);
    ts_decoder_free(m);
    ts_decoder_free(plain);
}

int main(int argc, char **argv) {
    ts_ctx *ctx = test_ctx();
    bool model_only = argc > 1 && !strcmp(argv[1], "model");
    printf("test_decode_gemm: active level %s, machine's %s\n",
           cpu_isa_name(cpu_isa_active()), cpu_isa_name(cpu_isa_detected()));
    if (!model_only)
        test_kernels();
    test_written_after_packing(ctx);
    test_decoder_prepack(ctx, true);
    test_decoder_prepack(ctx, false);
    test_gpt2_prepack(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_decode_gemm");
}
