/* train_dit.c — `tessera train --dit` (tessera_train.h): a class-
 * conditional DiT trained on the glyph data set with DDPM's noise
 * prediction loss, and the Diffusers DiTPipeline folder it saves. Owns
 * the loop (data, noising, step, EMA, logging, saving); the model is
 * dit.c's, the images glyphs.c's, AdamW nn/optim.c's, collectives
 * dist/'s.
 *
 * A step: the global batch of B images from (seed, step), this rank's
 * B / world of them; per sample t uniform in [0, 1000), eps ~ N(0, 1),
 * x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps (on the host: the data
 * is host-made anyway), the label dropped to the null class with
 * probability class_dropout; loss = mean((DiT(x_t, t, y)[:, :C] - eps)^2);
 * backward; gradients averaged over the ranks; one clipped AdamW update;
 * the EMA moved toward the new weights (its decay warmed up as Diffusers'
 * EMAModel does: min(ema, (1 + k) / (10 + k)) at the k-th update). */
#define _GNU_SOURCE
#include "tessera_diffusion.h"
#include "tessera_nn.h"
#include "tessera_train.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TRAIN_T    1000 /* DDPM's training timesteps */
#define BETA_START 1e-4
#define BETA_END   0.02
#define IMG        TS_GLYPHS_SIZE

ts_dit_train_options ts_dit_default_train_options(void) {
    return (ts_dit_train_options){.patch_size = 4,
                                  .num_layers = 6,
                                  .num_attention_heads = 4,
                                  .attention_head_dim = 32,
                                  .steps = 2000,
                                  .batch = 64,
                                  .warmup = 100,
                                  .log_every = 10,
                                  .lr = 1e-3,
                                  .min_lr = 1e-4,
                                  .weight_decay = 0,
                                  .clip = 1.0,
                                  .beta1 = 0.9,
                                  .beta2 = 0.999,
                                  .ema = 0.999,
                                  .class_dropout = 0.1,
                                  .seed = 1,
                                  .eager = true};
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* splitmix64 */
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unit(uint64_t *s) {
    return ((double)(mix(s) >> 11) + 0.5) * 0x1p-53; /* (0, 1) */
}
static double gauss(uint64_t *s) {
    double u = unit(s), v = unit(s);
    return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static double cos_alpha_bar(double t) {
    double c = cos((t + 0.008) / 1.008 * M_PI / 2);
    return c * c;
}

/* DDPM's linear schedule (betas in f32 as torch.linspace makes them) or
 * squaredcos_cap_v2 (Diffusers' betas_for_alpha_bar, max beta 0.999) */
static void alphas_cumprod(double *abar, bool cosine) {
    double prod = 1;
    for (int t = 0; t < TRAIN_T; t++) {
        float beta;
        if (cosine) {
            double b = 1 - cos_alpha_bar((t + 1.0) / TRAIN_T) /
                               cos_alpha_bar((double)t / TRAIN_T);
            beta = (float)(b < 0.999 ? b : 0.999);
        } else {
            beta = (float)(BETA_START +
                           (BETA_END - BETA_START) * t / (TRAIN_T - 1));
        }
        prod *= 1.0 - (double)beta;
        abar[t] = prod;
    }
}

/* forward + backward FLOPs of one image: 6 x (tokens x the per-token
 * matrices + the per-sample ones: time MLPs, adaLN, proj_out_1) plus
 * attention's 12 L D N^2 (QK^T and AV, forward and backward) */
static double flops_per_image(const ts_dit_config *c) {
    double D = (double)(c->num_attention_heads * c->attention_head_dim);
    double p = (double)c->patch_size, L = (double)c->num_layers;
    double N = (double)((c->sample_size / c->patch_size) *
                        (c->sample_size / c->patch_size));
    double per_token = (double)c->in_channels * p * p * D + L * 12 * D * D +
                       D * p * p * (double)c->out_channels;
    double per_sample = L * (256 * D + D * D + 6 * D * D) + 2 * D * D;
    return 6 * (N * per_token + per_sample) + 12 * L * D * N * N;
}

static ts_status mkdir_one(ts_ctx *ctx, const char *dir) {
    if (mkdir(dir, 0755) && errno != EEXIST)
        return ts_set_error(ctx, TS_ERR_IO, "cannot create %s: %s", dir,
                            strerror(errno));
    return TS_OK;
}

static ts_status write_json(ts_ctx *ctx, json_t *j, const char *path) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = j ? json_dump_file(j, tmp, JSON_INDENT(2)) : -1;
    json_decref(j);
    if (rc || rename(tmp, path)) {
        remove(tmp);
        return ts_set_error(ctx, TS_ERR_IO, "cannot write %s: %s", path,
                            strerror(errno));
    }
    return TS_OK;
}

/* model_index.json and scheduler/scheduler_config.json of the folder */
static ts_status write_pipeline_files(ts_ctx *ctx, const char *dir,
                                      const ts_dit_train_options *o) {
    char p[4200];
    json_t *mi = json_object();
    json_object_set_new(mi, "_class_name", json_string("DiTPipeline"));
    json_object_set_new(mi, "_diffusers_version", json_string("0.30.0"));
    json_object_set_new(
        mi, "transformer",
        json_pack("[s, s]", "diffusers", "DiTTransformer2DModel"));
    json_object_set_new(mi, "scheduler",
                        json_pack("[s, s]", "diffusers", "DDIMScheduler"));
    json_object_set_new(mi, "vae", json_pack("[n, n]")); /* pixel space */
    json_t *labels = json_object();
    for (int k = 0; k < TS_GLYPHS_CLASSES; k++) {
        char key[16], val[2] = {ts_glyphs_char(k), 0};
        snprintf(key, sizeof key, "%d", k);
        json_object_set_new(labels, key, json_string(val));
    }
    json_object_set_new(mi, "id2label", labels);
    snprintf(p, sizeof p, "%s/model_index.json", dir);
    ts_status st = write_json(ctx, mi, p);
    snprintf(p, sizeof p, "%s/scheduler", dir);
    if (st == TS_OK)
        st = mkdir_one(ctx, p);
    json_t *sc = json_pack(
        "{s:s, s:s, s:f, s:s, s:f, s:b, s:f, s:i, s:s, s:b, s:i, s:s, s:b, "
        "s:n}",
        "_class_name", "DDIMScheduler", "_diffusers_version", "0.30.0",
        "beta_end", BETA_END, "beta_schedule",
        o->cosine ? "squaredcos_cap_v2" : "linear", "beta_start", BETA_START,
        "clip_sample", 1, "clip_sample_range", 1.0, "num_train_timesteps",
        TRAIN_T, "prediction_type", "epsilon", "set_alpha_to_one", 1,
        "steps_offset", 0, "timestep_spacing", "leading", "thresholding", 0,
        "trained_betas");
    snprintf(p, sizeof p, "%s/scheduler/scheduler_config.json", dir);
    if (st == TS_OK)
        st = write_json(ctx, sc, p);
    else
        json_decref(sc);
    return st;
}

typedef struct {
    ts_ctx *ctx;
    const ts_dit_train_options *o;
    ts_dit *d;
    ts_glyphs *g;
    ts_adamw *opt;
    ts_tensor **params;
    int n_params;
    float **ema; /* host copies, one per parameter */
    int rank, world;
    double abar[TRAIN_T];
    float *img, *xt, *eps, *tv, *w; /* w: per-image loss weights */
    int64_t *lab;
} run;

/* the rank's slice of step s's global batch, noised */
static ts_status make_batch(run *r, int64_t step, int64_t *b_local) {
    const ts_dit_train_options *o = r->o;
    int64_t B = o->batch, Bl = B / r->world, first = (int64_t)r->rank * Bl;
    uint64_t seed = o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)step;
    ts_status st = ts_glyphs_batch(r->g, seed, (int)B, r->img, r->lab);
    if (st)
        return st;
    for (int64_t i = 0; i < Bl; i++) {
        int64_t gi = first + i;
        uint64_t s = seed ^ (0xA0761D6478BD642Full * (uint64_t)(gi + 1));
        int t = (int)(mix(&s) % TRAIN_T);
        double a = sqrt(r->abar[t]), b = sqrt(1 - r->abar[t]);
        const float *x0 = r->img + gi * IMG * IMG;
        for (int k = 0; k < IMG * IMG; k++) {
            float e = (float)gauss(&s);
            r->eps[i * IMG * IMG + k] = e;
            r->xt[i * IMG * IMG + k] = (float)(a * x0[k] + b * e);
        }
        r->tv[i] = (float)t;
        double snr = r->abar[t] / (1 - r->abar[t]), g = o->snr_gamma;
        r->w[i] = (float)(g > 0 && snr > g ? g / snr : 1.0);
        r->lab[i] =
            unit(&s) < o->class_dropout ? TS_GLYPHS_CLASSES : r->lab[gi];
    }
    *b_local = Bl;
    return TS_OK;
}

static ts_tensor *batch_loss(run *r, int64_t Bl) {
    ts_ctx *ctx = r->ctx;
    int64_t xs[4] = {Bl, 1, IMG, IMG}, ts1[1] = {Bl};
    ts_tensor *x = ts_from_data(ctx, TS_F32, 4, xs, r->xt);
    ts_tensor *e = ts_from_data(ctx, TS_F32, 4, xs, r->eps);
    ts_tensor *t = ts_from_data(ctx, TS_F32, 1, ts1, r->tv);
    ts_tensor *y = ts_from_data(ctx, TS_I64, 1, ts1, r->lab);
    ts_tensor *out = x && e && t && y ? ts_dit_forward(r->d, x, t, y) : NULL;
    ts_tensor *pred = out && ts_dit_out_channels(r->d) != 1
                          ? ts_slice(out, 1, 0, 1, 1)
                          : ts_retain(out);
    ts_tensor *diff = pred ? ts_sub(pred, e) : NULL;
    ts_tensor *sq = diff ? ts_mul(diff, diff) : NULL;
    int64_t ws[4] = {Bl, 1, 1, 1};
    ts_tensor *wt =
        r->o->snr_gamma > 0 ? ts_from_data(ctx, TS_F32, 4, ws, r->w) : NULL;
    ts_tensor *wsq = wt && sq ? ts_mul(sq, wt) : ts_retain(sq);
    ts_tensor *loss = wsq ? ts_mean(wsq, 0, NULL, false) : NULL;
    ts_release(wt), ts_release(wsq);
    ts_release(x), ts_release(e), ts_release(t), ts_release(y);
    ts_release(out), ts_release(pred), ts_release(diff), ts_release(sq);
    return loss;
}

/* the same status on every rank: the worst one's */
static ts_status agree(run *r, ts_status st) {
    if (r->world < 2)
        return st;
    float bad = st != TS_OK ? 1.0f : 0.0f;
    ts_status cs = ts_dist_all_reduce(r->o->dist, &bad, 1, TS_F32, TS_DIST_MAX);
    if (st != TS_OK)
        return st;
    if (cs != TS_OK)
        return cs;
    return bad > 0 ? ts_set_error(r->ctx, TS_ERR_STATE,
                                  "train --dit: another rank failed")
                   : TS_OK;
}

static ts_status all_reduce_grads(run *r) {
    for (int i = 0; i < r->n_params; i++) {
        ts_tensor *g = ts_grad(r->params[i]);
        float *p = g ? ts_tensor_data(g) : NULL;
        if (!p || !ts_tensor_is_contiguous(g) || ts_tensor_dtype(g) != TS_F32)
            return ts_set_error(r->ctx, TS_ERR_STATE,
                                "train --dit: the gradient of %d is not a "
                                "host f32 tensor",
                                i);
        ts_status st = ts_dist_all_reduce(r->o->dist, p, ts_tensor_numel(g),
                                          TS_F32, TS_DIST_AVG);
        if (st)
            return st;
    }
    return TS_OK;
}

static ts_status train_step(run *r, int64_t step, double *loss, double *gnorm) {
    ts_ctx *ctx = r->ctx;
    const ts_dit_train_options *o = r->o;
    int64_t Bl;
    ts_zero_grads(r->params, r->n_params);
    ts_status st = make_batch(r, step, &Bl);
    ts_tensor *l = st == TS_OK ? batch_loss(r, Bl) : NULL;
    if (st == TS_OK && (!l || ts_backward(l, NULL) != TS_OK))
        st = ts_ctx_status(ctx) ? ts_ctx_status(ctx) : TS_ERR_STATE;
    if (r->world > 1) {
        if (st == TS_OK)
            st = ts_sync(ctx);
        st = agree(r, st);
        if (st == TS_OK)
            st = all_reduce_grads(r);
    }
    ts_adamw_set_lr(r->opt, ts_lr_cosine_warmup(step, o->warmup, o->steps,
                                                o->lr, o->min_lr));
    if (st == TS_OK)
        st = ts_adamw_step_clipped(r->opt, o->clip > 0 ? o->clip : INFINITY,
                                   gnorm);
    double v = 0;
    if (st == TS_OK)
        st = ts_item(l, &v); /* runs the recorded step */
    ts_release(l);
    if (st == TS_OK)
        st = ts_sync(ctx);
    float mean = (float)v;
    st = agree(r, st);
    if (st == TS_OK)
        st = ts_dist_all_reduce(o->dist, &mean, 1, TS_F32, TS_DIST_AVG);
    *loss = r->world > 1 ? mean : v;
    /* the EMA, on the host */
    for (int i = 0; st == TS_OK && r->ema && i < r->n_params; i++) {
        const float *p = ts_tensor_data(r->params[i]);
        float *e = r->ema[i];
        /* warmed up as Diffusers' EMAModel: min(ema, (1 + k) / (10 + k))
         * after k + 1 updates, so the initial weights fade out early */
        double warm = (1.0 + (double)step) / (10.0 + (double)step);
        float dec = (float)(o->ema < warm ? o->ema : warm);
        int64_t n = ts_tensor_numel(r->params[i]);
        for (int64_t k = 0; k < n; k++)
            e[k] = dec * e[k] + (1 - dec) * p[k];
    }
    return st;
}

/* the pipeline folder: the EMA weights (when kept) swapped in for the
 * save and back */
static ts_status save_pipeline(run *r) {
    ts_ctx *ctx = r->ctx;
    const char *dir = r->o->out_dir;
    char p[4200];
    ts_status st = write_pipeline_files(ctx, dir, r->o);
    float **keep = NULL;
    if (st == TS_OK && r->ema) {
        keep = calloc((size_t)r->n_params, sizeof *keep);
        for (int i = 0; keep && i < r->n_params; i++) {
            size_t bytes =
                sizeof(float) * (size_t)ts_tensor_numel(r->params[i]);
            float *data = ts_tensor_data(r->params[i]);
            if (!(keep[i] = malloc(bytes)))
                break;
            memcpy(keep[i], data, bytes);
            memcpy(data, r->ema[i], bytes);
        }
    }
    snprintf(p, sizeof p, "%s/transformer", dir);
    if (st == TS_OK)
        st = ts_dit_save(r->d, p);
    for (int i = 0; keep && i < r->n_params; i++) {
        if (keep[i])
            memcpy(ts_tensor_data(r->params[i]), keep[i],
                   sizeof(float) * (size_t)ts_tensor_numel(r->params[i]));
        free(keep[i]);
    }
    if (r->ema && !keep && st == TS_OK)
        st = ts_set_error(ctx, TS_ERR_OOM, "train --dit: out of memory");
    free(keep);
    return st;
}

static ts_status check_options(ts_ctx *ctx, const ts_dit_train_options *o) {
    const char *bad = NULL;
    int world = ts_dist_world(o->dist);
    if (!o->out_dir)
        bad = "--out DIR is required";
    else if (o->batch < 1 || o->steps < 1)
        bad = "--batch and --steps must be >= 1";
    else if (o->batch % world)
        bad = "--batch must be a multiple of the number of ranks";
    else if (!(o->lr > 0) || o->min_lr < 0 || o->min_lr > o->lr)
        bad = "--lr must be > 0 and --min-lr in 0..lr";
    else if (o->warmup < 0 || o->weight_decay < 0 || o->clip < 0)
        bad = "--warmup, --weight-decay and --clip must be >= 0";
    else if (!(o->ema >= 0 && o->ema < 1))
        bad = "--ema must be in [0, 1)";
    else if (!(o->class_dropout >= 0 && o->class_dropout < 1))
        bad = "the class dropout must be in [0, 1)";
    else if (o->log_every < 1 || o->save_every < 0)
        bad = "--log-every must be >= 1 and --save-every >= 0";
    else if (IMG % (o->patch_size > 0 ? o->patch_size : 1) || o->patch_size < 1)
        bad = "--dit-config patch_size must divide 32 (1, 2, 4, 8, 16, 32)";
    return bad ? ts_set_error(ctx, TS_ERR_INVALID_ARG, "train --dit: %s", bad)
               : TS_OK;
}

static void free_run(run *r) {
    for (int i = 0; r->ema && i < r->n_params; i++)
        free(r->ema[i]);
    free(r->ema);
    free(r->img), free(r->xt), free(r->eps), free(r->tv), free(r->w);
    free(r->lab);
    ts_adamw_free(r->opt);
    ts_dit_free(r->d);
    ts_glyphs_close(r->g);
}

ts_status ts_dit_train_run(ts_ctx *ctx, const ts_dit_train_options *o,
                           ts_dit_train_result *res) {
    ts_dit_train_result out = {0};
    ts_status st = check_options(ctx, o);
    if (st)
        return st;
    run r = {.ctx = ctx,
             .o = o,
             .rank = ts_dist_rank(o->dist),
             .world = ts_dist_world(o->dist)};
    alphas_cumprod(r.abar, o->cosine);
    ts_dit_config cfg = {.sample_size = IMG,
                         .in_channels = 1,
                         .out_channels = 1,
                         .patch_size = o->patch_size,
                         .num_layers = o->num_layers,
                         .num_attention_heads = o->num_attention_heads,
                         .attention_head_dim = o->attention_head_dim,
                         .num_classes = TS_GLYPHS_CLASSES};
    st = mkdir_one(ctx, o->out_dir);
    if (st == TS_OK)
        st = ts_glyphs_open(ctx, o->font_dir, &r.g);
    if (st == TS_OK)
        st = ts_dit_new(ctx, &cfg, o->seed, &r.d);
    if (st == TS_OK && o->bf16)
        st = ts_dit_set_compute_dtype(r.d, TS_BF16);
    if (st == TS_OK) {
        r.n_params = ts_dit_parameters(r.d, &r.params, NULL);
        ts_adamw_options ao = {.lr = o->lr,
                               .beta1 = o->beta1,
                               .beta2 = o->beta2,
                               .eps = 1e-8,
                               .weight_decay = o->weight_decay};
        st = ts_adamw_new(ctx, r.params, r.n_params, &ao, &r.opt);
    }
    int64_t B = o->batch;
    r.img = malloc(sizeof(float) * (size_t)(B * IMG * IMG));
    r.xt = malloc(sizeof(float) * (size_t)(B * IMG * IMG));
    r.eps = malloc(sizeof(float) * (size_t)(B * IMG * IMG));
    r.tv = malloc(sizeof(float) * (size_t)B);
    r.w = malloc(sizeof(float) * (size_t)B);
    r.lab = malloc(sizeof(int64_t) * (size_t)B);
    if (st == TS_OK && (!r.img || !r.xt || !r.eps || !r.tv || !r.w || !r.lab))
        st = ts_set_error(ctx, TS_ERR_OOM, "train --dit: out of memory");
    int64_t n_all = 0;
    for (int i = 0; st == TS_OK && i < r.n_params; i++)
        n_all += ts_tensor_numel(r.params[i]);
    if (st == TS_OK && o->ema > 0) {
        r.ema = calloc((size_t)r.n_params, sizeof *r.ema);
        for (int i = 0; r.ema && i < r.n_params; i++) {
            size_t bytes = sizeof(float) * (size_t)ts_tensor_numel(r.params[i]);
            if (!(r.ema[i] = malloc(bytes)))
                break;
            memcpy(r.ema[i], ts_tensor_data(r.params[i]), bytes);
        }
        if (!r.ema || (r.n_params && !r.ema[r.n_params - 1]))
            st = ts_set_error(ctx, TS_ERR_OOM, "train --dit: out of memory");
    }
    ts_peak_info pk = {0};
    if (st == TS_OK && r.rank == 0 && !(o->peak > 0))
        st = ts_peak_measure(ctx, true, &pk);
    st = agree(&r, st);
    float peak_g = (float)((o->peak > 0 ? o->peak : pk.hardware) / 1e9);
    if (st == TS_OK)
        st = ts_dist_broadcast(o->dist, &peak_g, 1, TS_F32, 0);
    double peak = (double)peak_g * 1e9 * r.world;
    double fpi = flops_per_image(&cfg);
    int64_t tokens_per_image = (IMG / o->patch_size) * (IMG / o->patch_size);
    char logp[4200];
    snprintf(logp, sizeof logp, "%s/log.jsonl", o->out_dir);
    FILE *log = NULL;
    if (st == TS_OK && r.rank == 0 && !(log = fopen(logp, "w")))
        st = ts_set_error(ctx, TS_ERR_IO, "cannot write %s: %s", logp,
                          strerror(errno));
    bool quiet = o->quiet || r.rank != 0;
    char peak_desc[512];
    if (o->peak > 0)
        snprintf(peak_desc, sizeof peak_desc,
                 "peak %.1f GFLOP/s (given by --peak-gflops)", peak / 1e9);
    else
        snprintf(peak_desc, sizeof peak_desc,
                 "peak %.1f GFLOP/s = %d core(s) x %.2f GHz x %g FLOP/cycle "
                 "(%s) on %s",
                 peak / 1e9, pk.cores * r.world, pk.clock_hz / 1e9,
                 pk.flops_per_cycle, pk.isa, pk.cpu);
    if (st == TS_OK && !quiet)
        fprintf(stderr,
                "train --dit: %lld parameters, D %lld, %lld layers, %lld "
                "heads, patch %lld (%lld tokens per image), %d fonts x 62 "
                "classes, batch %lld%s, %s, %s, %.2f GFLOP per image (forward "
                "+ backward); %s\n",
                (long long)n_all,
                (long long)(o->num_attention_heads * o->attention_head_dim),
                (long long)o->num_layers, (long long)o->num_attention_heads,
                (long long)o->patch_size, (long long)tokens_per_image,
                ts_glyphs_num_fonts(r.g), (long long)B,
                r.world > 1 ? " (data parallel)" : "",
                o->eager ? "eager" : "compiled",
                o->bf16 ? "bf16 matrices, f32 masters" : "f32", fpi / 1e9,
                peak_desc);
    if (st == TS_OK)
        ts_set_mode(ctx, o->eager ? TS_MODE_EAGER : TS_MODE_COMPILED);
    double t0 = now_s(), timed_s = 0, win_s = 0;
    int64_t timed_steps = 0, win_steps = 0, step = 0;
    while (st == TS_OK && step < o->steps) {
        double loss = 0, gnorm = 0,
               lr = ts_lr_cosine_warmup(step, o->warmup, o->steps, o->lr,
                                        o->min_lr);
        double ts = now_s();
        st = train_step(&r, step, &loss, &gnorm);
        if (st)
            break;
        ts = now_s() - ts;
        if (step > 0)
            timed_s += ts, timed_steps++;
        win_s += ts, win_steps++;
        if (!isfinite(loss)) {
            st = ts_set_error(ctx, TS_ERR_STATE,
                              "train --dit: the loss is %g at step %lld; "
                              "lower --lr or raise --warmup",
                              loss, (long long)step + 1);
            break;
        }
        step++;
        if (step == 1)
            out.first_loss = loss;
        out.last_loss = loss;
        if (step % o->log_every == 0 || step == o->steps) {
            double ips = win_s > 0 ? (double)(B * win_steps) / win_s : 0;
            double tps = ips * (double)tokens_per_image;
            double mfu = peak > 0 ? ips * fpi / peak : 0;
            double el = now_s() - t0;
            double eta = el / (double)step * (double)(o->steps - step);
            if (log) {
                fprintf(log,
                        "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, "
                        "\"grad_norm\": %.6f, \"tokens_per_s\": %.1f, "
                        "\"images_per_s\": %.2f, \"mfu\": %.4f, "
                        "\"elapsed_s\": %.2f}\n",
                        (long long)step, loss, lr, gnorm, tps, ips, mfu, el);
                fflush(log);
            }
            if (!quiet)
                fprintf(stderr,
                        "step %6lld/%lld  loss %.4f  lr %.3g  gnorm %.3f  "
                        "%.0f tok/s (%.1f img/s)  MFU %.1f%%  ETA %.0fs\n",
                        (long long)step, (long long)o->steps, loss, lr, gnorm,
                        tps, ips, 100 * mfu, eta);
            win_s = 0, win_steps = 0;
        }
        if (st == TS_OK && o->save_every && step % o->save_every == 0 &&
            step < o->steps && r.rank == 0) {
            ts_set_mode(ctx, TS_MODE_EAGER);
            st = save_pipeline(&r);
            ts_set_mode(ctx, o->eager ? TS_MODE_EAGER : TS_MODE_COMPILED);
        }
    }
    ts_set_mode(ctx, TS_MODE_EAGER);
    if (st == TS_OK && r.rank == 0)
        st = save_pipeline(&r);
    st = agree(&r, st);
    if (log)
        fclose(log);
    out.steps_done = step;
    out.n_params = n_all;
    out.seconds = now_s() - t0;
    double ips = timed_s > 0 ? (double)(B * timed_steps) / timed_s : 0;
    out.tokens_per_s = ips * (double)tokens_per_image;
    out.flops_per_image = fpi;
    out.peak = peak;
    out.mfu = peak > 0 ? ips * fpi / peak : 0;
    if (res)
        *res = out;
    free_run(&r);
    return st;
}
