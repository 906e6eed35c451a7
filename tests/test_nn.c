/* test_nn.c — the nn layer against PyTorch: the Qwen3 decoder's logits, loss
 * and every parameter gradient (untied and tied lm_head, RoPE from a nonzero
 * pos0), a linear layer with bias, clip_grad_norm_ and two AdamW steps
 * against torch; the LR schedule, parameter names, bad-config messages, and
 * that ten AdamW steps on one batch lower the loss.
 *
 * The reference is tests/ref/nn_ref.py, run with /usr/bin/python3 through
 * system(); argv[1] is the source directory. TS_TEST_MODE=compiled runs it
 * all in compiled mode. CMake registration:
 *   ts_add_test(test_nn ${PROJECT_SOURCE_DIR})
 */
#include "tessera_models.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- record files shared with nn_ref.py --------------------------------
 * u32 name length, name, u32 dtype (0 f32, 1 i64, 2 f64), u32 ndim,
 * i64 shape[ndim], row-major data. */

enum { REC_F32 = 0, REC_I64 = 1, REC_F64 = 2 };

typedef struct {
    char name[160];
    uint32_t code, ndim;
    int64_t shape[TS_MAX_DIMS];
    int64_t numel;
    void *data;
} record;

typedef struct {
    record *r;
    int n;
} record_set;

static void put_rec(FILE *f, const char *name, uint32_t code, uint32_t ndim,
                    const int64_t *shape, const void *data, size_t bytes) {
    uint32_t len = (uint32_t)strlen(name);
    fwrite(&len, 4, 1, f);
    fwrite(name, 1, len, f);
    fwrite(&code, 4, 1, f);
    fwrite(&ndim, 4, 1, f);
    if (ndim)
        fwrite(shape, 8, ndim, f);
    if (bytes)
        fwrite(data, 1, bytes, f);
}

static void put_tensor(FILE *f, const char *name, ts_tensor *t) {
    bool is_int = !ts_dtype_is_float(ts_tensor_dtype(t));
    ts_dtype dt = is_int ? TS_I64 : TS_F32;
    size_t bytes = (size_t)ts_tensor_numel(t) * ts_dtype_size(dt);
    void *buf = malloc(bytes ? bytes : 1);
    CHECK(ts_tensor_read(t, buf, dt) == TS_OK);
    put_rec(f, name, is_int ? REC_I64 : REC_F32, (uint32_t)ts_tensor_ndim(t),
            ts_tensor_shape(t), buf, bytes);
    free(buf);
}

static void put_f64(FILE *f, const char *name, int n, const double *v) {
    int64_t shape[1] = {n};
    put_rec(f, name, REC_F64, 1, shape, v, sizeof(double) * (size_t)n);
}

static bool read_records(const char *path, record_set *rs) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    uint32_t len;
    bool ok = true;
    while (ok && fread(&len, 4, 1, f) == 1) {
        record r;
        memset(&r, 0, sizeof r);
        ok = len < sizeof r.name && fread(r.name, 1, len, f) == len &&
             fread(&r.code, 4, 1, f) == 1 && fread(&r.ndim, 4, 1, f) == 1 &&
             r.ndim <= TS_MAX_DIMS && r.code <= REC_F64 &&
             fread(r.shape, 8, r.ndim, f) == r.ndim;
        if (!ok)
            break;
        r.numel = 1;
        for (uint32_t i = 0; i < r.ndim; i++)
            r.numel *= r.shape[i];
        size_t es = r.code == REC_F32 ? 4 : 8;
        r.data = malloc((size_t)r.numel * es + 1);
        ok = r.data && fread(r.data, es, (size_t)r.numel, f) == (size_t)r.numel;
        record *grown = realloc(rs->r, sizeof *grown * (size_t)(rs->n + 1));
        if (!ok || !grown) {
            free(r.data);
            ok = false;
            break;
        }
        rs->r = grown;
        rs->r[rs->n++] = r;
    }
    fclose(f);
    return ok;
}

static void free_records(record_set *rs) {
    for (int i = 0; i < rs->n; i++)
        free(rs->r[i].data);
    free(rs->r);
    rs->r = NULL;
    rs->n = 0;
}

/* The f32 record called name as a new tensor; NULL (and a failure) when
 * missing. */
static ts_tensor *expected(ts_ctx *ctx, const record_set *rs,
                           const char *name) {
    for (int i = 0; i < rs->n; i++) {
        const record *r = &rs->r[i];
        if (strcmp(r->name, name) == 0 && r->code == REC_F32)
            return ts_from_data(ctx, TS_F32, (int)r->ndim, r->shape, r->data);
    }
    ts_test_failures++;
    fprintf(stderr, "reference output lacks %s\n", name);
    return NULL;
}

static double expected_scalar(const record_set *rs, const char *name) {
    for (int i = 0; i < rs->n; i++)
        if (strcmp(rs->r[i].name, name) == 0 && rs->r[i].code == REC_F32 &&
            rs->r[i].numel == 1)
            return *(const float *)rs->r[i].data;
    ts_test_failures++;
    fprintf(stderr, "reference output lacks %s\n", name);
    return NAN;
}

/* Compares actual against the reference record name; releases nothing. */
static void check_close(ts_ctx *ctx, const record_set *rs, const char *name,
                        ts_tensor *actual, double rtol, double atol) {
    ts_tensor *e = expected(ctx, rs, name);
    if (e)
        test_allclose(name, actual, e, rtol, atol);
    ts_release(e);
}

/* ---- the small model ---------------------------------------------------- */

static ts_model_config small_config(bool tie) {
    ts_model_config c = tu_config("qwen3");
    c.vocab = 97, c.hidden = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2;
    c.head_dim = 16, c.intermediate = 96, c.norm_eps = 1e-6;
    c.rope_theta = 1e6, c.tie_word_embeddings = tie, c.max_positions = 64;
    return c;
}

enum { B = 2, T = 9, POS0 = 5, ADAM_STEPS = 2 };

/* ids (B, T) in [0, V) and next-token targets with a few -100 */
static void make_batch(ts_ctx *ctx, int64_t V, uint64_t seed, ts_tensor **ids,
                       ts_tensor **targets) {
    int64_t seq[B][T + 1], in[B * T], tg[B * T];
    uint64_t s = seed;
    for (int b = 0; b < B; b++)
        for (int t = 0; t <= T; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            seq[b][t] = (int64_t)((s >> 33) % (uint64_t)V);
        }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            in[b * T + t] = seq[b][t];
            tg[b * T + t] = seq[b][t + 1];
        }
    tg[3] = -100;
    tg[T + 7] = -100;
    int64_t shape[2] = {B, T};
    *ids = ts_from_data(ctx, TS_I64, 2, shape, in);
    *targets = ts_from_data(ctx, TS_I64, 2, shape, tg);
}

static void put_config(FILE *f, const char *name, const ts_model_config *c) {
    double v[11] = {(double)c->vocab,        (double)c->hidden,
                    (double)c->layers,       (double)c->heads,
                    (double)c->kv_heads,     (double)c->head_dim,
                    (double)c->intermediate, c->norm_eps,
                    c->rope_theta,           c->tie_word_embeddings ? 1 : 0,
                    (double)c->max_positions};
    put_f64(f, name, 11, v);
}

/* One model case: the model, its batch, and what forward/backward gave. */
typedef struct {
    const char *tag; /* record prefix */
    ts_decoder *m;
    ts_tensor *ids, *targets;
    ts_tensor *logits, *loss, *logits_pos;
} model_case;

static void case_run(ts_ctx *ctx, model_case *mc, bool tie, uint64_t seed) {
    ts_model_config cfg = small_config(tie);
    CHECK_OK(ctx, ts_decoder_new(ctx, &cfg, NULL, seed, &mc->m));
    make_batch(ctx, cfg.vocab, seed + 1, &mc->ids, &mc->targets);
    mc->loss = ts_decoder_loss(mc->m, mc->ids, mc->targets, &mc->logits);
    CHECK(mc->loss && mc->logits);
    if (mc->loss)
        CHECK_OK(ctx, ts_backward(mc->loss, NULL));
    bool old = ts_set_grad_enabled(ctx, false);
    mc->logits_pos = ts_decoder_forward(mc->m, mc->ids, POS0);
    ts_set_grad_enabled(ctx, old);
    CHECK(mc->logits_pos != NULL);
    if (mc->logits_pos)
        CHECK(!ts_requires_grad(mc->logits_pos));
}

static const double ADAM_HP[8] = {1e-3, 0.9, 0.95,       1e-8,
                                  0.1,  0.5, ADAM_STEPS, POS0};

static void case_write(FILE *f, model_case *mc, bool with_hp) {
    char name[200];
    snprintf(name, sizeof name, "%s/cfg", mc->tag);
    put_config(f, name, ts_decoder_get_config(mc->m));
    snprintf(name, sizeof name, "%s/ids", mc->tag);
    put_tensor(f, name, mc->ids);
    snprintf(name, sizeof name, "%s/targets", mc->tag);
    put_tensor(f, name, mc->targets);
    for (int i = 0; i < ts_decoder_num_params(mc->m); i++) {
        snprintf(name, sizeof name, "%s/param/%s", mc->tag,
                 ts_decoder_param_name(mc->m, i));
        put_tensor(f, name, ts_decoder_param(mc->m, i));
    }
    if (with_hp) {
        snprintf(name, sizeof name, "%s/hp", mc->tag);
        put_f64(f, name, 8, ADAM_HP);
        for (int i = 0; i < ts_decoder_num_params(mc->m); i++) {
            ts_tensor *g = ts_grad(ts_decoder_param(mc->m, i));
            snprintf(name, sizeof name, "%s/cgrad/%s", mc->tag,
                     ts_decoder_param_name(mc->m, i));
            CHECK(g != NULL);
            if (g)
                put_tensor(f, name, g);
        }
    }
}

/* logits, loss and every gradient against the reference */
static void case_check(ts_ctx *ctx, const record_set *rs, model_case *mc,
                       bool with_pos) {
    char name[200];
    snprintf(name, sizeof name, "%s/logits", mc->tag);
    check_close(ctx, rs, name, mc->logits, 1e-4, 1e-5);
    snprintf(name, sizeof name, "%s/loss", mc->tag);
    double loss = NAN;
    if (mc->loss)
        ts_item(mc->loss, &loss);
    double want = expected_scalar(rs, name);
    CHECK_NEAR(loss, want, 1e-5 * fabs(want));
    if (with_pos) {
        snprintf(name, sizeof name, "%s/logits_pos", mc->tag);
        check_close(ctx, rs, name, mc->logits_pos, 1e-4, 1e-5);
    }
    for (int i = 0; i < ts_decoder_num_params(mc->m); i++) {
        ts_tensor *p = ts_decoder_param(mc->m, i);
        snprintf(name, sizeof name, "%s/grad/%s", mc->tag,
                 ts_decoder_param_name(mc->m, i));
        CHECK(ts_grad(p) != NULL);
        check_close(ctx, rs, name, ts_grad(p), 1e-3, 1e-5);
    }
}

/* clip_grad_norm_ then ADAM_STEPS AdamW steps on the same grads */
static void case_check_optim(ts_ctx *ctx, const record_set *rs,
                             model_case *mc) {
    char name[200];
    int n = ts_decoder_num_params(mc->m);
    ts_tensor *const *params = ts_decoder_params(mc->m);
    double total = -1;
    CHECK_OK(ctx, ts_clip_grad_norm(params, n, ADAM_HP[5], &total));
    snprintf(name, sizeof name, "%s/clip_norm", mc->tag);
    double want = expected_scalar(rs, name);
    CHECK_NEAR(total, want, 1e-5 * want);
    CHECK(total > ADAM_HP[5]); /* the case must really clip */
    double clipped = -1;
    CHECK_OK(ctx, ts_clip_grad_norm(params, n, 1e9, &clipped));
    CHECK_NEAR(clipped, ADAM_HP[5], 1e-5);

    ts_adamw_options o = {.lr = ADAM_HP[0],
                          .beta1 = ADAM_HP[1],
                          .beta2 = ADAM_HP[2],
                          .eps = ADAM_HP[3],
                          .weight_decay = ADAM_HP[4]};
    ts_adamw *opt = NULL;
    CHECK_OK(ctx, ts_adamw_new(ctx, params, n, &o, &opt));
    for (int s = 0; s < ADAM_STEPS; s++)
        CHECK_OK(ctx, ts_adamw_step(opt));
    /* the end of a training step (torch_xla's mark_step); eager: a no-op */
    CHECK_OK(ctx, ts_sync(ctx));
    for (int i = 0; i < n; i++) {
        const char *pn = ts_decoder_param_name(mc->m, i);
        snprintf(name, sizeof name, "%s/adamw/%s", mc->tag, pn);
        check_close(ctx, rs, name, params[i], 1e-5, 1e-6);
        snprintf(name, sizeof name, "%s/exp_avg_sq/%s", mc->tag, pn);
        check_close(ctx, rs, name, ts_adamw_exp_avg_sq(opt, i), 1e-3, 1e-12);
        CHECK(ts_adamw_step_count(opt, i) == ADAM_STEPS);
    }
    ts_adamw_free(opt);
}

static void case_free(model_case *mc) {
    ts_release(mc->ids), ts_release(mc->targets), ts_release(mc->logits);
    ts_release(mc->loss), ts_release(mc->logits_pos);
    ts_decoder_free(mc->m);
}

/* The linear layer with bias: y = x @ w^T + b, loss sum(y*y). */
typedef struct {
    ts_tensor *x, *w, *b, *y;
} linear_case;

static void linear_run(ts_ctx *ctx, linear_case *lc) {
    int64_t xs[3] = {3, 5, 8}, ws[2] = {6, 8}, bs[1] = {6};
    lc->x = ts_randn(ctx, TS_F32, 3, xs, 1.0, 11);
    lc->w = ts_randn(ctx, TS_F32, 2, ws, 0.5, 12);
    lc->b = ts_randn(ctx, TS_F32, 1, bs, 0.5, 13);
    ts_set_requires_grad(lc->x, true);
    ts_set_requires_grad(lc->w, true);
    ts_set_requires_grad(lc->b, true);
    lc->y = ts_linear(lc->x, lc->w, lc->b);
    ts_tensor *yy = ts_mul(lc->y, lc->y);
    ts_tensor *l = ts_sum(yy, 0, NULL, false);
    CHECK(l != NULL);
    if (l)
        CHECK_OK(ctx, ts_backward(l, NULL));
    ts_release(yy), ts_release(l);
}

static void linear_free(linear_case *lc) {
    ts_release(lc->x), ts_release(lc->w), ts_release(lc->b);
    ts_release(lc->y);
}

static void test_against_torch(ts_ctx *ctx, const char *srcdir) {
    model_case a = {.tag = "A"}, b = {.tag = "B"};
    linear_case lc = {0};
    case_run(ctx, &a, false, 1234);
    case_run(ctx, &b, true, 99);
    linear_run(ctx, &lc);

    const char *tmp = getenv("TMPDIR");
    char in[512], out[512], cmd[2048];
    snprintf(in, sizeof in, "%s/ts_nn_%d_in.bin", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    snprintf(out, sizeof out, "%s/ts_nn_%d_out.bin", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    FILE *f = fopen(in, "wb");
    CHECK(f != NULL);
    if (f) {
        case_write(f, &a, true);
        case_write(f, &b, false);
        put_tensor(f, "L/x", lc.x);
        put_tensor(f, "L/w", lc.w);
        put_tensor(f, "L/b", lc.b);
        CHECK(fclose(f) == 0);
    }
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 '%s/tests/ref/nn_ref.py' '%s' '%s'", srcdir, in,
             out);
    int rc = system(cmd);
    CHECK(rc == 0);
    if (rc != 0)
        fprintf(stderr, "the reference failed (status %d): %s\n", rc, cmd);
    record_set rs = {0};
    CHECK(rc == 0 && read_records(out, &rs));
    remove(in);
    remove(out);

    case_check(ctx, &rs, &a, true);
    case_check(ctx, &rs, &b, false);
    check_close(ctx, &rs, "L/y", lc.y, 1e-5, 1e-6);
    check_close(ctx, &rs, "L/gx", ts_grad(lc.x), 1e-5, 1e-5);
    check_close(ctx, &rs, "L/gw", ts_grad(lc.w), 1e-5, 1e-5);
    check_close(ctx, &rs, "L/gb", ts_grad(lc.b), 1e-5, 1e-5);
    case_check_optim(ctx, &rs, &a);

    free_records(&rs);
    case_free(&a), case_free(&b);
    linear_free(&lc);
}

/* ---- checks without the reference --------------------------------------- */

static void test_param_names(ts_ctx *ctx) {
    ts_model_config c = small_config(false);
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, NULL, 7, &m));
    CHECK(ts_decoder_num_params(m) == 1 + 11 * 2 + 2);
    CHECK(strcmp(ts_decoder_param_name(m, 0), "model.embed_tokens.weight") ==
          0);
    CHECK(strcmp(ts_decoder_param_name(m, 24), "lm_head.weight") == 0);
    CHECK(ts_decoder_param_name(m, 25) == NULL &&
          ts_decoder_param(m, -1) == NULL);
    ts_tensor *kn =
        ts_decoder_find_param(m, "model.layers.1.self_attn.k_norm.weight");
    CHECK(kn && ts_tensor_ndim(kn) == 1 && ts_tensor_dim(kn, 0) == 16);
    double one = 0;
    int64_t i0[1] = {3};
    if (kn)
        CHECK(ts_get(kn, i0, &one) == TS_OK && one == 1.0);
    ts_tensor *q =
        ts_decoder_find_param(m, "model.layers.0.self_attn.q_proj.weight");
    CHECK(q && ts_tensor_dim(q, 0) == 64 && ts_tensor_dim(q, 1) == 64);
    ts_tensor *k =
        ts_decoder_find_param(m, "model.layers.0.self_attn.k_proj.weight");
    CHECK(k && ts_tensor_dim(k, 0) == 32 && ts_tensor_dim(k, 1) == 64);
    ts_tensor *d =
        ts_decoder_find_param(m, "model.layers.1.mlp.down_proj.weight");
    CHECK(d && ts_tensor_dim(d, 0) == 64 && ts_tensor_dim(d, 1) == 96);
    CHECK(ts_decoder_find_param(m, "model.layers.2.mlp.up_proj.weight") ==
          NULL);
    for (int i = 0; i < ts_decoder_num_params(m); i++)
        CHECK(ts_requires_grad(ts_decoder_param(m, i)));
    /* Normal(0, 0.02): the embedding's std is near 0.02 */
    ts_tensor *e = ts_decoder_param(m, 0);
    ts_tensor *ee = ts_mul(e, e);
    ts_tensor *ms = ts_mean(ee, 0, NULL, false);
    double var = 0;
    CHECK_OK(ctx, ts_item(ms, &var));
    CHECK_NEAR(sqrt(var), 0.02, 0.001);
    ts_release(ee), ts_release(ms);
    ts_decoder_free(m);

    c.tie_word_embeddings = true;
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, NULL, 7, &m));
    CHECK(ts_decoder_num_params(m) == 24);
    CHECK(ts_decoder_find_param(m, "lm_head.weight") == NULL);
    CHECK(strcmp(ts_decoder_param_name(m, 23), "model.norm.weight") == 0);
    ts_decoder_free(m);
}

static void expect_bad_config(ts_ctx *ctx, ts_model_config c,
                              const char *needle) {
    ts_decoder *m = (ts_decoder *)&c; /* must come back NULL */
    CHECK(ts_decoder_new(ctx, &c, NULL, 1, &m) == TS_ERR_INVALID_ARG);
    CHECK(m == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_INVALID_ARG);
    CHECK_MSG(ctx, needle);
    ts_clear_error(ctx);
}

static void test_bad_config(ts_ctx *ctx) {
    ts_model_config c = small_config(false);
    c.kv_heads = 3;
    expect_bad_config(ctx, c, "heads is not a multiple of kv_heads");
    c = small_config(false);
    c.hidden = 0;
    expect_bad_config(ctx, c, "hidden is 0");
    c = small_config(false);
    c.head_dim = 15;
    expect_bad_config(ctx, c, "head_dim is odd");
    c = small_config(false);
    c.vocab = -5;
    expect_bad_config(ctx, c, "vocab is -5");
    c = small_config(false);
    c.layers = 0;
    expect_bad_config(ctx, c, "layers is 0");
    c = small_config(false);
    c.norm_eps = 0;
    expect_bad_config(ctx, c, "norm epsilon");
    c = small_config(false);
    c.rope_theta = -1;
    expect_bad_config(ctx, c, "rope_theta");
    c = small_config(false);
    CHECK(ts_decoder_config_check(ctx, &c) == TS_OK);

    /* bad calls on a good model */
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, NULL, 1, &m));
    int64_t shape[2] = {1, 4};
    ts_tensor *ids = ts_zeros(ctx, TS_I64, 2, shape);
    ts_tensor *y = ts_decoder_forward(m, ids, 61); /* 61..64 > 63 */
    CHECK(y == NULL && ts_ctx_status(ctx) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "max_positions 64");
    ts_clear_error(ctx);
    ts_tensor *fids = ts_zeros(ctx, TS_F32, 2, shape);
    y = ts_decoder_forward(m, fids, 0);
    CHECK(y == NULL && ts_ctx_status(ctx) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "ids must be (B, T) i64 or i32");
    ts_clear_error(ctx);
    int64_t tshape[2] = {1, 3};
    ts_tensor *tg = ts_zeros(ctx, TS_I64, 2, tshape);
    y = ts_decoder_loss(m, ids, tg, NULL);
    CHECK(y == NULL && ts_ctx_status(ctx) == TS_ERR_SHAPE);
    CHECK_MSG(ctx, "targets [1, 3] do not match ids [1, 4]");
    ts_clear_error(ctx);
    ts_release(ids), ts_release(fids), ts_release(tg);

    ts_adamw_options o = ts_adamw_default_options();
    o.beta2 = 1.0;
    ts_adamw *opt = NULL;
    CHECK(ts_adamw_new(ctx, ts_decoder_params(m), ts_decoder_num_params(m), &o,
                       &opt) == TS_ERR_INVALID_ARG);
    CHECK(opt == NULL);
    CHECK_MSG(ctx, "beta2 is 1");
    ts_clear_error(ctx);
    ts_decoder_free(m);
}

static void test_lr_schedule(void) {
    /* warmup 10, total 110, max 1e-3, min 1e-4 */
    CHECK_NEAR(ts_lr_cosine_warmup(0, 10, 110, 1e-3, 1e-4), 0.0, 1e-15);
    CHECK_NEAR(ts_lr_cosine_warmup(5, 10, 110, 1e-3, 1e-4), 5e-4, 1e-15);
    CHECK_NEAR(ts_lr_cosine_warmup(10, 10, 110, 1e-3, 1e-4), 1e-3, 1e-15);
    CHECK_NEAR(ts_lr_cosine_warmup(60, 10, 110, 1e-3, 1e-4), 5.5e-4, 1e-15);
    /* a quarter of the decay: min + (max-min) * (1 + cos(pi/4)) / 2 */
    CHECK_NEAR(ts_lr_cosine_warmup(35, 10, 110, 1e-3, 1e-4),
               1e-4 + 9e-4 * 0.5 * (1 + sqrt(0.5)), 1e-15);
    CHECK_NEAR(ts_lr_cosine_warmup(110, 10, 110, 1e-3, 1e-4), 1e-4, 1e-15);
    CHECK_NEAR(ts_lr_cosine_warmup(500, 10, 110, 1e-3, 1e-4), 1e-4, 1e-15);
    /* no warmup, min 0: Hugging Face's get_cosine_schedule_with_warmup */
    CHECK_NEAR(ts_lr_cosine_warmup(0, 0, 100, 2.0, 0.0), 2.0, 1e-15);
    CHECK_NEAR(ts_lr_cosine_warmup(50, 0, 100, 2.0, 0.0), 1.0, 1e-12);
}

/* AdamW's first step by hand: m-hat = g, v-hat = g*g, so
 * p1 = p * (1 - lr*wd) - lr * g / (|g| + eps). A parameter without a grad is
 * skipped; a bf16 parameter is updated in f32 and rounded back. */
static void test_adamw_first_step(ts_ctx *ctx) {
    float pv[3] = {1, -2, 3}, cv[3] = {0.1f, -0.2f, 0.3f};
    int64_t n3 = 3, n2 = 2;
    ts_tensor *p = ts_from_data(ctx, TS_F32, 1, &n3, pv);
    ts_tensor *c = ts_from_data(ctx, TS_F32, 1, &n3, cv);
    ts_tensor *idle = ts_from_data(ctx, TS_F32, 1, &n3, pv);
    ts_tensor *h = ts_full(ctx, TS_BF16, 1, &n2, 0.5);
    ts_set_requires_grad(p, true);
    ts_set_requires_grad(idle, true);
    ts_set_requires_grad(h, true);
    ts_tensor *pc = ts_mul(p, c); /* grad of p: c */
    ts_tensor *l1 = ts_sum(pc, 0, NULL, false);
    ts_tensor *l2 = ts_sum(h, 0, NULL, false); /* grad of h: ones */
    CHECK_OK(ctx, ts_backward(l1, NULL));
    CHECK_OK(ctx, ts_backward(l2, NULL));
    ts_tensor *params[3] = {p, idle, h};
    ts_adamw_options o = ts_adamw_default_options();
    o.lr = 0.1;
    o.weight_decay = 0.5;
    ts_adamw *opt = NULL;
    CHECK_OK(ctx, ts_adamw_new(ctx, params, 3, &o, &opt));
    CHECK(ts_adamw_get_lr(opt) == 0.1);
    CHECK_OK(ctx, ts_adamw_step(opt));
    CHECK_OK(ctx, ts_sync(ctx));
    const double want[3] = {0.85, -1.8, 2.75};
    for (int64_t i = 0; i < 3; i++) {
        double v = NAN, u = NAN;
        CHECK_OK(ctx, ts_get(p, &i, &v));
        CHECK_NEAR(v, want[i], 1e-6);
        CHECK_OK(ctx, ts_get(idle, &i, &u));
        CHECK(u == pv[i]);
    }
    for (int64_t i = 0; i < 2; i++) {
        double v = NAN;
        CHECK_OK(ctx, ts_get(h, &i, &v));
        CHECK_NEAR(v, 0.5 * 0.95 - 0.1, 1e-3); /* bf16 spacing 2^-10 here */
    }
    CHECK(ts_tensor_dtype(h) == TS_BF16);
    CHECK(ts_adamw_step_count(opt, 0) == 1 && ts_adamw_step_count(opt, 1) == 0);
    CHECK(ts_adamw_exp_avg(opt, 3) == NULL);
    double m0 = NAN;
    int64_t i0 = 0;
    CHECK_OK(ctx, ts_get(ts_adamw_exp_avg(opt, 0), &i0, &m0));
    CHECK_NEAR(m0, 0.1 * 0.1, 1e-8); /* (1 - beta1) * g */

    /* clip: the norm of [c, ones(2)] is sqrt(0.14 + 2); under max_norm
     * nothing changes, over it every grad scales by max_norm / norm */
    double total = 0;
    CHECK_OK(ctx, ts_clip_grad_norm(params, 3, 10.0, &total));
    CHECK_NEAR(total, sqrt(2.14), 1e-6);
    CHECK_OK(ctx, ts_clip_grad_norm(params, 3, 1.0, &total));
    CHECK_NEAR(total, sqrt(2.14), 1e-6);
    double g0 = NAN;
    CHECK_OK(ctx, ts_get(ts_grad(p), &i0, &g0));
    CHECK_NEAR(g0, 0.1 / sqrt(2.14), 1e-6);
    ts_zero_grads(params, 3);
    CHECK(ts_grad(p) == NULL && ts_grad(h) == NULL);
    CHECK_OK(ctx, ts_clip_grad_norm(params, 3, 1.0, &total));
    CHECK(total == 0);
    CHECK_OK(ctx, ts_adamw_step_clipped(opt, 1.0, &total));
    CHECK(total == 0 && ts_adamw_step_count(opt, 0) == 1);
    ts_adamw_free(opt);
    ts_release(p), ts_release(c), ts_release(idle), ts_release(h);
    ts_release(pc), ts_release(l1), ts_release(l2);
}

/* ts_adamw_step_clipped (the clip folded into the update, the gradients
 * left as they are) gives what ts_clip_grad_norm + ts_adamw_step give, with
 * the clip active (max_norm 0.5) and idle (100), over three steps. */
static void test_adamw_step_clipped(ts_ctx *ctx) {
    int64_t sh[2] = {4, 5};
    for (int pass = 0; pass < 2; pass++) {
        double max_norm = pass ? 100.0 : 0.5;
        ts_tensor *a = ts_randn(ctx, TS_F32, 2, sh, 1.0, 11);
        ts_tensor *b = ts_randn(ctx, TS_F32, 2, sh, 1.0, 12);
        ts_tensor *x = ts_randn(ctx, TS_F32, 2, sh, 1.0, 13);
        ts_tensor *pa = ts_contiguous(a), *pb = ts_contiguous(b);
        ts_tensor *qa = ts_mul_scalar(a, 1.0), *qb = ts_mul_scalar(b, 1.0);
        ts_tensor *ps[2] = {pa, pb}, *qs[2] = {qa, qb};
        ts_adamw *oa = NULL, *ob = NULL;
        for (int k = 0; k < 2; k++) {
            ts_set_requires_grad(ps[k], true);
            ts_set_requires_grad(qs[k], true);
        }
        CHECK_OK(ctx, ts_adamw_new(ctx, ps, 2, NULL, &oa));
        CHECK_OK(ctx, ts_adamw_new(ctx, qs, 2, NULL, &ob));
        for (int step = 0; step < 3; step++) {
            double na = 0, nb = 0;
            for (int side = 0; side < 2; side++) {
                ts_tensor **w = side ? qs : ps;
                ts_zero_grads(w, 2);
                ts_tensor *u = ts_mul(w[0], x), *v = ts_mul(u, w[1]);
                ts_tensor *l = ts_sum(v, 0, NULL, false);
                CHECK_OK(ctx, ts_backward(l, NULL));
                ts_release(u), ts_release(v), ts_release(l);
            }
            CHECK_OK(ctx, ts_clip_grad_norm(ps, 2, max_norm, &na));
            CHECK_OK(ctx, ts_adamw_step(oa));
            CHECK_OK(ctx, ts_adamw_step_clipped(ob, max_norm, &nb));
            CHECK(pass || na > max_norm); /* the clip is active */
            CHECK_NEAR(nb, na, 1e-5 * na);
            for (int k = 0; k < 2; k++)
                for (int64_t e = 0; e < 20; e++) {
                    int64_t ix[2] = {e / 5, e % 5};
                    double u = NAN, v = NAN;
                    CHECK_OK(ctx, ts_get(ps[k], ix, &u));
                    CHECK_OK(ctx, ts_get(qs[k], ix, &v));
                    CHECK_NEAR(v, u, 1e-6);
                }
        }
        ts_adamw_free(oa), ts_adamw_free(ob);
        ts_release(a), ts_release(b), ts_release(x);
        ts_release(pa), ts_release(pb), ts_release(qa), ts_release(qb);
    }
}

/* Ten AdamW steps (lr 1e-2, clipped at 1.0) on one fixed batch lower the
 * loss; the schedule drives the learning rate. */
static void test_training_lowers_loss(ts_ctx *ctx) {
    ts_model_config c = small_config(true);
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_new(ctx, &c, NULL, 2024, &m));
    ts_tensor *ids = NULL, *targets = NULL;
    make_batch(ctx, c.vocab, 77, &ids, &targets);
    ts_tensor *const *params = ts_decoder_params(m);
    int n = ts_decoder_num_params(m);
    ts_adamw_options o = ts_adamw_default_options();
    ts_adamw *opt = NULL;
    CHECK_OK(ctx, ts_adamw_new(ctx, params, n, &o, &opt));
    double first = NAN, last = NAN;
    for (int step = 0; step < 10 && opt; step++) {
        ts_adamw_set_lr(opt, ts_lr_cosine_warmup(step, 2, 10, 1e-2, 1e-3));
        ts_tensor *loss = ts_decoder_loss(m, ids, targets, NULL);
        CHECK(loss != NULL);
        if (!loss)
            break;
        double v = NAN;
        ts_item(loss, &v);
        if (step == 0)
            first = v;
        last = v;
        ts_zero_grads(params, n);
        CHECK_OK(ctx, ts_backward(loss, NULL));
        ts_release(loss);
        CHECK_OK(ctx, ts_clip_grad_norm(params, n, 1.0, NULL));
        CHECK_OK(ctx, ts_adamw_step(opt));
    }
    CHECK_NEAR(first, log(97.0), 0.1); /* a fresh model guesses uniformly */
    CHECK(last < first - 0.5);
    if (!(last < first - 0.5))
        fprintf(stderr, "loss %g -> %g over ten steps\n", first, last);
    ts_adamw_free(opt);
    ts_release(ids), ts_release(targets);
    ts_decoder_free(m);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_nn SOURCE_DIR\n");
        return 2;
    }
    ts_ctx *ctx = test_ctx();
    /* TS_TEST_MODE=compiled records every op call and runs it when a result
     * is read: the nn code must give the same answers unchanged */
    const char *mode = getenv("TS_TEST_MODE");
    if (mode && !strcmp(mode, "compiled"))
        ts_set_mode(ctx, TS_MODE_COMPILED);
    test_param_names(ctx);
    test_bad_config(ctx);
    test_lr_schedule();
    test_adamw_first_step(ctx);
    test_adamw_step_clipped(ctx);
    test_against_torch(ctx, argv[1]);
    test_training_lowers_loss(ctx);
    CHECK_OK(ctx, ts_sync(ctx));
    ts_alloc_stats st;
    ts_alloc_get_stats(ctx, &st);
    /* every tensor made here was released (compiled mode keeps its arena) */
    if (ts_get_mode(ctx) == TS_MODE_EAGER)
        CHECK(st.bytes_in_use == 0);
    ts_ctx_free(ctx);
    return test_finish("test_nn");
}
