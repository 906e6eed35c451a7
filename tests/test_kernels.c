/* test_kernels.c — every fast CPU kernel against the slow reference kept
 * beside it, on random inputs of awkward sizes: the register-blocked GEMM,
 * the fused attention forward and backward (GQA, causal with S > T, an
 * additive mask, sliding windows, softcaps), the paged attention against
 * the fused one, the experts MLP's independence of the thread count, and
 * the matmul op (BLAS with transposed views, bf16). */
#include "backend/cpu/cpu.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static float *rand_buf(int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        p[i] = frand();
    return p;
}

/* max |a - b| / (atol + rtol |b|) */
static double worst(const float *a, const float *b, int64_t n, double rtol,
                    double atol) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (atol + rtol * fabs(b[i]));
        if (!(e <= w))
            w = e; /* NaN counts as worst */
    }
    return w;
}

static void test_gemm(void) {
    const int64_t sizes[][3] = {{1, 1, 1},     {4, 16, 8},    {5, 17, 3},
                                {32, 64, 128}, {33, 70, 129}, {3, 48, 1}};
    for (size_t c = 0; c < sizeof sizes / sizeof *sizes; c++) {
        int64_t M = sizes[c][0], N = sizes[c][1], K = sizes[c][2];
        int64_t lda = K + 3, ldb = N + 5, ldc = N + 1; /* padded rows */
        float *A = rand_buf(M * lda), *B = rand_buf(K * ldb);
        float *C1 = rand_buf(M * ldc),
              *C2 = malloc(sizeof(float) * (size_t)(M * ldc));
        for (int acc = 0; acc < 2; acc++) {
            for (int64_t i = 0; i < M * ldc; i++)
                C2[i] = C1[i];
            cpu_gemm_f32(M, N, K, A, lda, B, ldb, C1, ldc, acc);
            cpu_gemm_f32_reference(M, N, K, A, lda, B, ldb, C2, ldc, acc);
            double w = worst(C1, C2, M * ldc, 1e-5, 1e-5);
            CHECK(w <= 1);
            if (w > 1)
                fprintf(stderr, "gemm %lldx%lldx%lld acc=%d: %.3g x tol\n",
                        (long long)M, (long long)N, (long long)K, acc, w);
        }
        free(A), free(B), free(C1), free(C2);
    }
}

static void attention_case(int64_t B, int64_t H, int64_t KV, int64_t T,
                           int64_t S, int64_t D, bool causal, bool mask,
                           int64_t window, float softcap) {
    cpu_attn_shape p = {.B = B,
                        .H = H,
                        .KV = KV,
                        .T = T,
                        .S = S,
                        .D = D,
                        .causal = causal,
                        .scale = 1.0f / sqrtf((float)D),
                        .window = window,
                        .softcap = softcap};
    float *q = rand_buf(B * H * T * D), *k = rand_buf(B * KV * S * D);
    float *v = rand_buf(B * KV * S * D), *m = NULL;
    if (mask) { /* (T, S) broadcast over B and H, some -inf */
        m = rand_buf(T * S);
        for (int64_t i = 0; i < T * S; i++)
            if (i % 7 == 3)
                m[i] = -INFINITY;
        for (int64_t t = 0; t < T; t++) { /* no empty row: key 0 and */
            m[t * S] = 0;                 /* the query's own position */
            if (t + S - T >= 0)
                m[t * S + t + S - T] = 0;
        }
        p.mask = m;
        p.mask_st[0] = p.mask_st[1] = 0;
        p.mask_st[2] = S;
        p.mask_st[3] = 1;
    }
    int64_t no = B * H * T * D, nl = B * H * T, nk = B * KV * S * D;
    float *o1 = malloc(sizeof(float) * (size_t)no),
          *o2 = malloc(sizeof(float) * (size_t)no);
    float *l1 = malloc(sizeof(float) * (size_t)nl),
          *l2 = malloc(sizeof(float) * (size_t)nl);
    cpu_attention_fwd(&p, q, k, v, o1, l1);
    cpu_attention_reference(&p, q, k, v, o2, l2);
    double wo = worst(o1, o2, no, 1e-4, 1e-5),
           wl = worst(l1, l2, nl, 1e-5, 1e-5);
    CHECK(wo <= 1 && wl <= 1);
    float *g = rand_buf(no);
    float *dq1 = malloc(sizeof(float) * (size_t)no),
          *dq2 = malloc(sizeof(float) * (size_t)no);
    float *dk1 = malloc(sizeof(float) * (size_t)nk),
          *dk2 = malloc(sizeof(float) * (size_t)nk);
    float *dv1 = malloc(sizeof(float) * (size_t)nk),
          *dv2 = malloc(sizeof(float) * (size_t)nk);
    cpu_attention_bwd(&p, q, k, v, o1, l1, g, dq1, dk1, dv1);
    cpu_attention_bwd_reference(&p, q, k, v, g, dq2, dk2, dv2);
    double wq = worst(dq1, dq2, no, 1e-3, 1e-4),
           wk = worst(dk1, dk2, nk, 1e-3, 1e-4);
    double wv = worst(dv1, dv2, nk, 1e-3, 1e-4);
    CHECK(wq <= 1 && wk <= 1 && wv <= 1);
    if (wo > 1 || wl > 1 || wq > 1 || wk > 1 || wv > 1)
        fprintf(
            stderr,
            "attention B%lld H%lld KV%lld T%lld S%lld D%lld causal %d mask %d"
            " window %lld softcap %g: out %.3g lse %.3g dq %.3g dk %.3g dv "
            "%.3g (x tolerance)\n",
            (long long)B, (long long)H, (long long)KV, (long long)T,
            (long long)S, (long long)D, causal, mask, (long long)window,
            (double)softcap, wo, wl, wq, wk, wv);
    free(q), free(k), free(v), free(m), free(o1), free(o2), free(l1), free(l2);
    free(g), free(dq1), free(dq2), free(dk1), free(dk2), free(dv1), free(dv2);
}

/* the decoding kernel reads K/V in place from a cache of max_S positions
 * per head (S used); against the reference on packed copies */
static void decode_case(int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S,
                        int64_t max_S, int64_t D, bool causal, int64_t window,
                        float softcap) {
    cpu_attn_shape p = {.B = B,
                        .H = H,
                        .KV = KV,
                        .T = T,
                        .S = S,
                        .D = D,
                        .causal = causal,
                        .scale = 1.0f / sqrtf((float)D),
                        .window = window,
                        .softcap = softcap};
    float *q = rand_buf(B * H * T * D), *kc = rand_buf(B * KV * max_S * D),
          *vc = rand_buf(B * KV * max_S * D);
    float *k = malloc(sizeof(float) * (size_t)(B * KV * S * D)),
          *v = malloc(sizeof(float) * (size_t)(B * KV * S * D));
    for (int64_t i = 0; i < B * KV; i++) {
        memcpy(k + i * S * D, kc + i * max_S * D, sizeof(float) * S * D);
        memcpy(v + i * S * D, vc + i * max_S * D, sizeof(float) * S * D);
    }
    int64_t no = B * H * T * D, nl = B * H * T;
    float *o1 = malloc(sizeof(float) * no), *o2 = malloc(sizeof(float) * no);
    float *l1 = malloc(sizeof(float) * nl), *l2 = malloc(sizeof(float) * nl);
    cpu_attention_decode(&p, q, kc, KV * max_S * D, max_S * D, vc,
                         KV * max_S * D, max_S * D, o1, l1);
    cpu_attention_reference(&p, q, k, v, o2, l2);
    double wo = worst(o1, o2, no, 1e-4, 1e-5),
           wl = worst(l1, l2, nl, 1e-5, 1e-5);
    CHECK(wo <= 1 && wl <= 1);
    if (wo > 1 || wl > 1)
        fprintf(stderr,
                "decode attention B%lld H%lld KV%lld T%lld S%lld: out %.3g "
                "lse %.3g (x tolerance)\n",
                (long long)B, (long long)H, (long long)KV, (long long)T,
                (long long)S, wo, wl);
    free(q), free(kc), free(vc), free(k), free(v);
    free(o1), free(o2), free(l1), free(l2);
}

static void test_attention(void) {
    decode_case(1, 16, 8, 1, 37, 64, 128, true, 0,
                0);                                  /* Qwen3 GQA, one token */
    decode_case(2, 4, 1, 3, 20, 33, 16, true, 0, 0); /* a few rows, causal */
    decode_case(1, 4, 4, 4, 9, 9, 20, false, 0, 0);  /* D not a multiple of 8 */
    decode_case(1, 2, 2, 1, 1, 5, 8, true, 0, 0);    /* the first token */
    attention_case(1, 2, 2, 5, 5, 8, false, false, 0, 0);
    attention_case(2, 4, 2, 17, 17, 16, true, false, 0, 0); /* GQA, causal */
    attention_case(1, 8, 2, 70, 70, 32, true, false, 0, 0); /* several blocks */
    attention_case(1, 4, 1, 3, 100, 16, true, false, 0, 0); /* decode: S > T */
    attention_case(2, 2, 1, 33, 65, 24, false, true, 0, 0); /* mask */
    attention_case(1, 2, 2, 40, 40, 64, true, true, 0, 0);  /* causal + mask */
    attention_case(1, 1, 1, 1, 1, 4, true, false, 0, 0);
    /* sliding windows (key blocks before the window skipped), softcaps */
    attention_case(1, 2, 1, 70, 70, 16, true, false, 1, 0);
    attention_case(1, 4, 2, 100, 100, 16, true, false, 17, 0);
    attention_case(1, 2, 1, 40, 200, 16, true, false, 64, 0); /* S > T */
    attention_case(2, 2, 1, 33, 65, 24, false, true, 9, 0);   /* + mask */
    attention_case(1, 2, 2, 50, 50, 8, true, false, 0, 3.0f);
    attention_case(1, 4, 1, 70, 90, 16, true, true, 30, 2.0f);
    decode_case(1, 8, 2, 1, 37, 64, 16, true, 5, 0);
    decode_case(2, 4, 1, 3, 20, 33, 16, true, 8, 4.0f);
    decode_case(1, 4, 4, 2, 9, 9, 20, false, 2, 1.0f);
}

/* ts_paged_attention_ex against ts_attention_ex on the same data: three
 * sequences with cached positions (one with none), their blocks spread
 * over the pools out of order; each sequence's keys and values gathered
 * into one (1, KV, S, D) tensor for ts_attention_ex with the new tokens as
 * the last T queries */
static void test_paged_attention(void) {
    ts_ctx *ctx = test_ctx();
    enum { H = 4, KV = 2, D = 16, BS = 4, NB = 24, MB = 8, NS = 3, N = 10 };
    const int32_t clen[NS] = {0, 5, 13}, nnew[NS] = {6, 1, 3};
    int32_t meta[2 + NS + 1 + NS + NS * MB] = {NS, MB};
    int32_t *start = meta + 2, *cl = start + NS + 1, *table = cl + NS;
    for (int i = 0, next = 0; i < NS; i++) {
        start[i + 1] = start[i] + nnew[i];
        cl[i] = clen[i];
        for (int b = 0; b < MB; b++) /* blocks 3, 8, 13, ... (mod 24) */
            table[i * MB + b] =
                b * BS < clen[i] + nnew[i] ? (next++ * 5 + 3) % NB : 0;
    }
    int64_t sm = sizeof meta / sizeof *meta, sp[4] = {NB, KV, BS, D};
    int64_t sq[4] = {1, H, N, D}, sk[4] = {1, KV, N, D};
    ts_tensor *mt = ts_from_data(ctx, TS_I32, 1, &sm, meta);
    ts_tensor *kp = ts_randn(ctx, TS_F32, 4, sp, 1, 11);
    ts_tensor *vp = ts_randn(ctx, TS_F32, 4, sp, 1, 12);
    ts_tensor *q = ts_randn(ctx, TS_F32, 4, sq, 1, 13);
    ts_tensor *k = ts_randn(ctx, TS_F32, 4, sk, 1, 14);
    ts_tensor *v = ts_randn(ctx, TS_F32, 4, sk, 1, 15);
    const ts_attn_opts opts[5] = {{.scale = 0},
                                  {.window = 3},
                                  {.window = 1},
                                  {.scale = 0.3, .softcap = 5},
                                  {.window = 4, .softcap = 2}};
    for (int c = 0; c < 5; c++) {
        ts_tensor *out = ts_paged_attention_ex(q, k, v, kp, vp, mt, &opts[c]);
        CHECK(out != NULL);
        if (!out) {
            fprintf(stderr, "paged attention: %s\n", ts_errmsg(ctx));
            ts_clear_error(ctx);
            continue;
        }
        const float *K = ts_tensor_data(kp), *V = ts_tensor_data(vp);
        const float *kn = ts_tensor_data(k), *vn = ts_tensor_data(v);
        for (int i = 0; i < NS; i++) {
            int64_t S = clen[i] + nnew[i], T = nnew[i];
            int64_t sf[4] = {1, KV, S, D};
            float *kf = malloc(sizeof(float) * KV * S * D),
                  *vf = malloc(sizeof(float) * KV * S * D);
            for (int64_t h = 0; h < KV; h++)
                for (int64_t s = 0; s < S; s++) {
                    /* cached rows from the pools, new ones from k, v */
                    const float *ks, *vs;
                    if (s < clen[i]) {
                        int64_t blk = table[i * MB + s / BS];
                        ks = K + ((blk * KV + h) * BS + s % BS) * D;
                        vs = V + ((blk * KV + h) * BS + s % BS) * D;
                    } else {
                        int64_t j = start[i] + s - clen[i];
                        ks = kn + (h * N + j) * D, vs = vn + (h * N + j) * D;
                    }
                    memcpy(kf + (h * S + s) * D, ks, sizeof(float) * D);
                    memcpy(vf + (h * S + s) * D, vs, sizeof(float) * D);
                }
            ts_tensor *kt = ts_from_data(ctx, TS_F32, 4, sf, kf);
            ts_tensor *vt = ts_from_data(ctx, TS_F32, 4, sf, vf);
            ts_tensor *qi = ts_slice(q, 2, start[i], start[i] + T, 1);
            ts_attn_opts o = opts[c];
            o.causal = true;
            ts_tensor *want = ts_attention_ex(qi, kt, vt, NULL, &o);
            ts_tensor *got = ts_slice(out, 2, start[i], start[i] + T, 1);
            char what[96];
            snprintf(what, sizeof what,
                     "paged attention, options %d, sequence %d", c, i);
            CHECK(want && got);
            if (want && got)
                test_allclose(what, got, want, 1e-4, 1e-5);
            free(kf), free(vf);
            ts_release(kt), ts_release(vt), ts_release(qi);
            ts_release(want), ts_release(got);
        }
        ts_release(out);
    }
    ts_attn_opts bad = {.window = -2};
    ts_tensor *r = ts_paged_attention_ex(q, k, v, kp, vp, mt, &bad);
    CHECK(r == NULL && ts_ctx_status(ctx) == TS_ERR_RANGE);
    CHECK(strstr(ts_errmsg(ctx), "window -2") != NULL);
    ts_clear_error(ctx);
    ts_release(mt), ts_release(kp), ts_release(vp), ts_release(q);
    ts_release(k), ts_release(v);
    ts_ctx_free(ctx);
}

/* the experts MLP's output and gradients, bit for bit the same on 1, 2
 * and 3 threads (each token's slots are added in slot order; products cut
 * by shape alone), with f32 and with bf16 weights */
static void test_moe_threads(void) {
    ts_ctx *ctx = test_ctx();
    enum { N = 128, C = 256, F = 192, E = 4, K = 2 };
    int64_t sx[2] = {N, C}, sk[2] = {N, K}, sw[3] = {E, F, C},
            sd[3] = {E, C, F};
    int64_t ids[N * K];
    for (int n = 0; n < N; n++) /* uneven: expert 0 takes most tokens */
        ids[n * K] = n % 3 ? 0 : n % E, ids[n * K + 1] = (n * 7 + 1) % E;
    ids[5] = -1; /* a slot that routes nowhere */
    for (int dt = 0; dt < 2; dt++) {
        uint64_t ref[6] = {0};
        for (int th = 1; th <= 3; th++) {
            CHECK_OK(ctx, ts_set_num_threads(ctx, th));
            ts_tensor *x = ts_randn(ctx, TS_F32, 2, sx, 1, 1);
            ts_tensor *w = ts_rand(ctx, TS_F32, 2, sk, 0, 1, 2);
            ts_tensor *ix = ts_from_data(ctx, TS_I64, 2, sk, ids);
            ts_tensor *wt[3] = {ts_randn(ctx, TS_F32, 3, sw, 0.1, 3),
                                ts_randn(ctx, TS_F32, 3, sw, 0.1, 4),
                                ts_randn(ctx, TS_F32, 3, sd, 0.1, 5)};
            for (int i = 0; i < 3 && dt; i++) {
                ts_tensor *b = ts_cast(wt[i], TS_BF16);
                ts_release(wt[i]);
                wt[i] = b;
            }
            ts_set_requires_grad(x, true), ts_set_requires_grad(w, true);
            for (int i = 0; i < 3 && !dt; i++)
                ts_set_requires_grad(wt[i], true);
            ts_tensor *y =
                ts_moe_experts(x, ix, w, wt[0], wt[1], wt[2], TS_ACT_SILU);
            ts_tensor *g = ts_randn(ctx, TS_F32, 2, sx, 1, 6);
            CHECK(y != NULL);
            CHECK_OK(ctx, ts_backward(y, g));
            ts_tensor *res[6] = {y,
                                 ts_grad(x),
                                 ts_grad(w),
                                 ts_grad(wt[0]),
                                 ts_grad(wt[1]),
                                 ts_grad(wt[2])};
            for (int r = 0; r < (dt ? 3 : 6); r++) {
                CHECK(res[r] != NULL);
                if (!res[r])
                    continue;
                int64_t cnt = ts_tensor_numel(res[r]);
                float *v = malloc(sizeof(float) * (size_t)cnt);
                ts_tensor_read(res[r], v, TS_F32);
                uint64_t h = 1469598103934665603ull;
                for (int64_t i = 0; i < cnt; i++) {
                    uint32_t u;
                    memcpy(&u, &v[i], 4);
                    h = (h ^ u) * 1099511628211ull;
                }
                free(v);
                if (th == 1)
                    ref[r] = h;
                CHECK(h == ref[r]);
                if (h != ref[r])
                    fprintf(stderr,
                            "moe %s weights: result %d differs on %d "
                            "threads\n",
                            dt ? "bf16" : "f32", r, th);
            }
            ts_release(x), ts_release(w), ts_release(ix), ts_release(y);
            ts_release(g);
            for (int i = 0; i < 3; i++)
                ts_release(wt[i]);
        }
    }
    ts_ctx_free(ctx);
}

/* matmul op (BLAS, views, bf16) against cpu_gemm_f32_reference */
static void test_matmul_op(void) {
    ts_ctx *ctx = test_ctx();
    int64_t M = 37, K = 19, N = 23;
    int64_t as[3] = {3, K, M}, bs[2] = {N, K};
    ts_tensor *a0 = ts_randn(ctx, TS_F32, 3, as, 1, 1); /* (3, K, M) */
    ts_tensor *b0 = ts_randn(ctx, TS_F32, 2, bs, 1, 2); /* (N, K) */
    ts_tensor *a = ts_transpose(a0, 1, 2);              /* (3, M, K) view */
    ts_tensor *b = ts_transpose(b0, 0, 1);              /* (K, N) view */
    for (int dt = 0; dt < 2; dt++) {
        ts_tensor *ac = dt ? ts_cast(a, TS_BF16) : ts_retain(a);
        ts_tensor *bc = dt ? ts_cast(b, TS_BF16) : ts_retain(b);
        ts_tensor *y = ts_matmul(ac, bc);
        CHECK(y && ts_tensor_dim(y, 0) == 3 && ts_tensor_dim(y, 2) == N);
        float *A = malloc(sizeof(float) * (size_t)(3 * M * K));
        float *B = malloc(sizeof(float) * (size_t)(K * N));
        float *Y = malloc(sizeof(float) * (size_t)(3 * M * N));
        float *R = malloc(sizeof(float) * (size_t)(3 * M * N));
        ts_tensor_read(ac, A, TS_F32);
        ts_tensor_read(bc, B, TS_F32);
        ts_tensor_read(y, Y, TS_F32);
        for (int i = 0; i < 3; i++)
            cpu_gemm_f32_reference(M, N, K, A + i * M * K, K, B, N,
                                   R + i * M * N, N, false);
        double w = worst(Y, R, 3 * M * N, dt ? 1e-2 : 1e-5, dt ? 1e-2 : 1e-5);
        CHECK(w <= 1);
        if (w > 1)
            fprintf(stderr, "matmul op dtype %d: %.3g x tol\n", dt, w);
        free(A), free(B), free(Y), free(R);
        ts_release(ac), ts_release(bc), ts_release(y);
    }
    ts_release(a0), ts_release(b0), ts_release(a), ts_release(b);
    ts_ctx_free(ctx);
}

/* f32 activations x bf16 weights (a linear layer's (N, K) weight seen
 * transposed): the decode kernel (few rows), the widen-then-BLAS path (many
 * rows; at the AVX512_BF16 level the bf16 GEMM, activations rounded to
 * bf16) and the general path (a batched weight) against f32 products of
 * the same (exactly widened) weights */
static void test_mixed_matmul(void) {
    ts_ctx *ctx = test_ctx();
    /* one row (the dot kernel), 2..8 (all rows per weight load), more */
    const int64_t rows[10] = {1, 2, 3, 4, 5, 6, 7, 8, 19, 300};
    int64_t ws[2] = {70, 53}; /* (N, K) */
    ts_tensor *w32 = ts_randn(ctx, TS_F32, 2, ws, 1, 7);
    ts_tensor *wb = ts_cast(w32, TS_BF16), *wbf = ts_cast(wb, TS_F32);
    ts_tensor *wt = ts_transpose(wb, 0, 1), *wtf = ts_transpose(wbf, 0, 1);
    for (int c = 0; c < 10; c++) {
        int64_t xs[3] = {1, rows[c], 53};
        ts_tensor *x = ts_randn(ctx, TS_F32, 3, xs, 1, (uint64_t)c);
        /* at the AVX512_BF16 level every row count goes through the bf16
         * GEMM, whose activations are x rounded to bf16 */
        bool bf16_gemm = !strcmp(ts_cpu_isa(), "avx512_bf16") ||
                         !strcmp(ts_cpu_isa(), "amx");
        ts_tensor *xb = bf16_gemm ? ts_cast(x, TS_BF16) : NULL;
        ts_tensor *xr = xb ? ts_cast(xb, TS_F32) : ts_retain(x);
        ts_tensor *y = ts_matmul(x, wt), *want = ts_matmul(xr, wtf);
        CHECK(y && ts_tensor_dtype(y) == TS_F32);
        test_allclose("mixed matmul", y, want, 1e-5, 1e-5);
        ts_release(x), ts_release(y), ts_release(want), ts_release(xb),
            ts_release(xr);
    }
    int64_t bs[3] = {2, 53, 70};
    ts_tensor *bw = ts_randn(ctx, TS_BF16, 3, bs, 1, 9),
              *bwf = ts_cast(bw, TS_F32);
    int64_t xs[3] = {2, 4, 53};
    ts_tensor *x = ts_randn(ctx, TS_F32, 3, xs, 1, 3);
    ts_tensor *y = ts_matmul(x, bw), *want = ts_matmul(x, bwf);
    test_allclose("mixed matmul, batched weight", y, want, 1e-5, 1e-5);
    ts_tensor *w32t = ts_transpose(w32, 0, 1);
    ts_tensor *bad = ts_matmul(wb, w32t); /* bf16 x f32: refused */
    CHECK(bad == NULL && ts_ctx_status(ctx) == TS_ERR_DTYPE);
    ts_clear_error(ctx);
    ts_release(w32t);
    ts_release(x), ts_release(y), ts_release(want), ts_release(bw),
        ts_release(bwf);
    ts_release(w32), ts_release(wb), ts_release(wbf), ts_release(wt),
        ts_release(wtf);
    ts_ctx_free(ctx);
}

int main(void) {
    test_mixed_matmul();
    test_gemm();
    test_attention();
    test_paged_attention();
    test_moe_threads();
    test_matmul_op();
    return test_finish("test_kernels");
}
