/* test_amp.c — bf16 mixed precision of a Qwen3 model
 * (ts_decoder_set_compute_dtype): the loss is that of the same model with
 * its matrices rounded to bf16; the matrices' gradients reach the f32
 * masters bf16-rounded and close to the rounded model's; norms keep f32
 * gradients; eager and compiled agree; a bad dtype is refused. */
#include "tessera_models.h"

#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static ts_model_config tiny(void) {
    ts_model_config c = tu_config("qwen3");
    c.vocab = 101, c.hidden = 32, c.intermediate = 48, c.layers = 2;
    c.heads = 4, c.kv_heads = 2, c.head_dim = 8;
    c.norm_eps = 1e-6, c.rope_theta = 10000, c.max_positions = 64;
    c.tie_word_embeddings = false;
    return c;
}

static bool is_matrix(const char *name) {
    return strstr(name, "_proj") || !strcmp(name, "lm_head.weight");
}

static float round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* loss and gradients (concatenated) of one forward + backward */
static double step(ts_ctx *ctx, ts_decoder *m, ts_tensor *ids, ts_tensor *tg,
                   float *grads) {
    ts_tensor *const *p = ts_decoder_params(m);
    int n = ts_decoder_num_params(m);
    ts_zero_grads(p, n);
    ts_tensor *loss = ts_decoder_loss(m, ids, tg, NULL);
    double v = NAN;
    CHECK(loss && ts_backward(loss, NULL) == TS_OK);
    CHECK(ts_sync(ctx) == TS_OK && ts_item(loss, &v) == TS_OK);
    ts_release(loss);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        CHECK(ts_tensor_read(ts_grad(p[i]), grads + at, TS_F32) == TS_OK);
        at += (size_t)ts_tensor_numel(p[i]);
    }
    return v;
}

int main(void) {
    ts_ctx *ctx = NULL;
    CHECK(ts_ctx_new(&ctx, NULL) == TS_OK);
    ts_model_config c = tiny();
    ts_decoder *m = NULL, *r = NULL; /* mixed; f32 with rounded weights */
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, NULL, 21, &m));
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, NULL, 21, &r));
    int n = ts_decoder_num_params(m);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        ts_tensor *p = ts_decoder_param(r, i);
        size_t k = (size_t)ts_tensor_numel(p);
        if (is_matrix(ts_decoder_param_name(r, i))) {
            float *d = ts_tensor_data(p);
            for (size_t e = 0; e < k; e++)
                d[e] = round_bf16(d[e]);
        }
        total += k;
    }
    int64_t shape[2] = {2, 12};
    int64_t iv[24], tv[24];
    for (int i = 0; i < 24; i++)
        iv[i] = (i * 29 + 3) % 101, tv[i] = (i * 31 + 7) % 101;
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, iv);
    ts_tensor *tg = ts_from_data(ctx, TS_I64, 2, shape, tv);
    float *gm = malloc(sizeof(float) * total), *gr = malloc(sizeof *gr * total);
    float *ge = malloc(sizeof(float) * total);
    CHECK_OK(ctx, ts_decoder_set_compute_dtype(m, TS_BF16));

    double lr = step(ctx, r, ids, tg, gr);
    double lm = step(ctx, m, ids, tg, gm);
    CHECK(isfinite(lm) && fabs(lm - lr) <= 1e-5 * fabs(lr));
    size_t at = 0;
    int not_bf16 = 0, matrices = 0;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        size_t k = (size_t)ts_tensor_numel(ts_decoder_param(m, i));
        bool mat = is_matrix(ts_decoder_param_name(m, i));
        double amax = 0, d = 0;
        for (size_t e = at; e < at + k; e++) {
            if (mat) {
                uint32_t u;
                memcpy(&u, &gm[e], 4);
                not_bf16 += (u & 0xFFFF) != 0;
            }
            amax = fmax(amax, fabs(gr[e]));
            d = fmax(d, fabs((double)gm[e] - gr[e]));
        }
        matrices += mat;
        worst = fmax(worst, d / (amax + 1e-30));
        at += k;
    }
    CHECK(matrices == 2 * 7 + 1);
    CHECK(not_bf16 == 0); /* every matrix gradient went through bf16 */
    if (worst > 2e-2)
        fprintf(stderr, "mixed vs rounded f32 gradients: %.2e\n", worst);
    CHECK(worst <= 2e-2);
    /* the same in compiled mode */
    ts_set_mode(ctx, TS_MODE_COMPILED);
    double lc = step(ctx, m, ids, tg, ge);
    ts_set_mode(ctx, TS_MODE_EAGER);
    CHECK(fabs(lc - lm) <= 1e-6 * fabs(lm));
    double dc = 0, amax = 0;
    for (size_t e = 0; e < total; e++)
        dc = fmax(dc, fabs((double)ge[e] - gm[e])),
        amax = fmax(amax, fabs(gm[e]));
    CHECK(dc <= 1e-2 * amax);
    /* back to f32: the masters' own loss, unlike the rounded one */
    CHECK_OK(ctx, ts_decoder_set_compute_dtype(m, TS_F32));
    double lf = step(ctx, m, ids, tg, ge);
    CHECK(lf != lm && fabs(lf - lm) <= 1e-2 * fabs(lf));
    CHECK(ts_decoder_set_compute_dtype(m, TS_I64) == TS_ERR_DTYPE);
    CHECK_MSG(ctx, "f32 or bf16");
    ts_clear_error(ctx);

    /* a mixture of experts under bf16 compute: the stacked experts stay
     * f32 (the experts kernel reads them), and every parameter, experts
     * and router included, gets its gradient */
    ts_model_config e = tu_config("qwen3_moe");
    e.vocab = 101, e.hidden = 32, e.layers = 2, e.heads = 4, e.kv_heads = 2;
    e.head_dim = 8, e.intermediate = 48, e.max_positions = 64;
    e.n_experts = 4, e.experts_per_tok = 2, e.moe_intermediate = 16;
    ts_decoder *moe = NULL;
    CHECK_OK(ctx, ts_decoder_new(ctx, &e, NULL, 5, &moe));
    CHECK_OK(ctx, ts_decoder_set_compute_dtype(moe, TS_BF16));
    ts_tensor *ml = ts_decoder_loss(moe, ids, tg, NULL);
    CHECK(ml && ts_backward(ml, NULL) == TS_OK);
    int no_grad = 0, experts = 0;
    for (int i = 0; moe && i < ts_decoder_num_params(moe); i++) {
        no_grad += ts_grad(ts_decoder_param(moe, i)) == NULL;
        experts += strstr(ts_decoder_param_name(moe, i), "experts") != NULL;
    }
    CHECK(no_grad == 0 && experts == 2 * 3);
    ts_release(ml);
    ts_decoder_free(moe);

    ts_release(ids), ts_release(tg);
    free(gm), free(gr), free(ge);
    ts_decoder_free(m), ts_decoder_free(r);
    ts_ctx_free(ctx);
    return test_finish("test_amp");
}
