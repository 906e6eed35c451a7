/* train.c — the training loop behind `tessera train` (tessera_train.h).
 *
 * A step: grad_accum micro-batches (forward, backward of loss / accum,
 * gradients accumulating in .grad), global-norm clipping, the learning
 * rate of the step (linear warmup then cosine to min_lr, or constant),
 * one fused AdamW update. In compiled mode the step is recorded and run
 * as planned graphs (cached by shape), eager otherwise; both give the
 * same losses. Checkpoints are Hugging Face folders (model.safetensors,
 * config.json, generation_config.json, tokenizer files) plus
 * optimizer.safetensors (AdamW moments) and trainer_state.json (step,
 * loader position, options), written to a temporary folder and renamed,
 * so a process killed mid-save leaves the previous checkpoint whole. A
 * resumed run reloads all of it and continues with the same batches, so
 * its losses are the ones an uninterrupted run prints. */
#define _GNU_SOURCE
#include "tessera_train.h"

#include "tessera_models.h"
#include "tessera_nn.h"

#include "core/core.h"
#include "core/strbuf.h"
#include "train/consistency.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

ts_train_options ts_train_default_options(void) {
    return (ts_train_options){.batch = 8,
                              .seq = 256,
                              .grad_accum = 1,
                              .steps = 1000,
                              .lr = 3e-4,
                              .min_lr = 3e-5,
                              .warmup = 100,
                              .weight_decay = 0.1,
                              .clip = 1.0,
                              .beta1 = 0.9,
                              .beta2 = 0.95,
                              .eval_every = 0,
                              .eval_batches = 8,
                              .save_every = 0,
                              .log_every = 1,
                              .keep_last = 3,
                              .seed = 1,
                              .bucket_mb = 16};
}

/* ---- files ---- */

static ts_status write_json(ts_ctx *ctx, const char *path, json_t *j) {
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    ts_atomic_file af;
    bool ok = s && ts_atomic_open(&af, path) &&
              ts_atomic_write(&af, s, strlen(s)) &&
              ts_atomic_write(&af, "\n", 1);
    free(s);
    if (!s || !ts_atomic_commit(&af, ok))
        return ts_set_error(ctx, TS_ERR_IO, "cannot write %s", path);
    return TS_OK;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4096];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* ---- the run's state ---- */

typedef struct {
    ts_ctx *ctx;
    const ts_train_options *o;
    ts_decoder *m; /* the model, whatever its family */
    ts_adamw *opt;
    ts_loader *train, *val;
    int n_params;
    ts_tensor *const *params;
    char config_src[4096]; /* the config.json a checkpoint copies */
    char tok_dir[4096];    /* the tokenizer a checkpoint copies ("": none) */
    int64_t step;          /* steps done */
    double val_now;        /* the validation loss at this step, or NAN */
    FILE *log;
    /* distributed */
    ts_dist *dist;
    int rank, world;
    bool shard_opt;       /* --shard grad-opt or full over more than one rank */
    bool shard_full;      /* --shard full: layers' parameters sharded at rest */
    int *layer_of;        /* the decoder layer of each parameter, -1 outside */
    ts_tensor **released; /* full: what a released parameter is (a zero
                            expanded to its shape, no storage) */
    int n_opt;            /* parameters the optimizer updates here */
    int *opt_idx;         /* their indices (grad-opt: the owned ones) */
    int *owner;           /* grad-opt: the rank owning each parameter */
    int *order;           /* grad-opt: parameters in owner order */
    int64_t *counts;      /* grad-opt: elements owned by each rank */
    float *flat, *mine;   /* scratch: every parameter's elements; own */
    struct reducer *red;  /* data parallel: the overlapped all-reduce */
} run;

/* ---- distributed: host views, broadcast, gradient sync, sharding ---- */

static const char *pname(const run *r, int i) {
    return ts_decoder_param_name(r->m, i);
}

static int64_t numel_of(run *r, int i) {
    return ts_tensor_numel(r->params[i]);
}

/* the f32 host elements of t (a parameter or its gradient) */
static float *host_f32(run *r, ts_tensor *t, int i) {
    float *p = t && ts_tensor_dtype(t) == TS_F32 && ts_tensor_is_contiguous(t)
                   ? ts_tensor_data(t)
                   : NULL;
    if (!p)
        ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                     "train: %s %s is not a contiguous f32 host tensor",
                     pname(r, i), t ? "(or its gradient)" : "has no gradient");
    return p;
}

/* every rank must agree that a collective phase went well: a failure on
 * one rank fails all (never a rank waiting forever on the others) */
static ts_status agree(run *r, ts_status st) {
    if (r->world == 1)
        return st;
    float bad = st != TS_OK;
    ts_status cs = ts_dist_all_reduce(r->dist, &bad, 1, TS_F32, TS_DIST_MAX);
    if (cs != TS_OK)
        return cs;
    if (bad > 0 && st == TS_OK)
        st = ts_set_error(r->ctx, TS_ERR_STATE,
                          "train: another rank failed (see its message)");
    return st;
}

/* rank 0's parameters on every rank (a run starts identical everywhere) */
static ts_status broadcast_params(run *r) {
    ts_status st = ts_sync(r->ctx);
    for (int i = 0; st == TS_OK && i < r->n_params; i++) {
        float *p = host_f32(r, r->params[i], i);
        st = p ? ts_dist_broadcast(r->dist, p, numel_of(r, i), TS_F32, 0)
               : ts_ctx_status(r->ctx);
    }
    return st;
}

/* which rank owns which parameter (grad-opt): the largest first, each to
 * the least loaded rank, so every rank holds about 1/world of the state */
static ts_status plan_shards(run *r) {
    int n = r->n_params, w = r->world;
    r->owner = malloc(sizeof *r->owner * (size_t)n);
    r->order = malloc(sizeof *r->order * (size_t)n);
    r->counts = calloc((size_t)w, sizeof *r->counts);
    if (!r->owner || !r->order || !r->counts)
        return ts_set_error(r->ctx, TS_ERR_OOM, "out of memory");
    for (int i = 0; i < n; i++)
        r->order[i] = i;
    for (int a = 1; a < n; a++) /* by size, largest first, stable */
        for (int b = a;
             b > 0 && numel_of(r, r->order[b]) > numel_of(r, r->order[b - 1]);
             b--) {
            int t = r->order[b];
            r->order[b] = r->order[b - 1], r->order[b - 1] = t;
        }
    for (int a = 0; a < n; a++) {
        int best = 0;
        for (int k = 1; k < w; k++)
            if (r->counts[k] < r->counts[best])
                best = k;
        r->owner[r->order[a]] = best;
        r->counts[best] += numel_of(r, r->order[a]);
    }
    int at = 0; /* owner order: rank 0's parameters, then rank 1's, ... */
    for (int k = 0; k < w; k++)
        for (int i = 0; i < n; i++)
            if (r->owner[i] == k)
                r->order[at++] = i;
    r->n_opt = 0;
    for (int i = 0; i < n; i++)
        if (r->owner[i] == r->rank)
            r->opt_idx[r->n_opt++] = i;
    r->mine = malloc(sizeof(float) * (size_t)(r->counts[r->rank] + 1));
    return r->mine ? TS_OK : ts_set_error(r->ctx, TS_ERR_OOM, "out of memory");
}

/* f32 elements per all-reduce (--bucket-mb; a parameter larger than that
 * is a bucket of its own) */
static int64_t bucket_elems(const run *r) {
    double e = r->o->bucket_mb * 1048576.0 / sizeof(float);
    return e >= 1 ? (int64_t)e : 1;
}

/* Data parallel (torch DDP's reducer): the parameters, from the last back
 * (the order backward finishes them), in buckets of up to --bucket-mb,
 * each with its own part of r->flat. With --no-overlap each bucket is
 * all-reduced in turn after the backward. Else, during the last
 * micro-batch's backward the grad-ready
 * hook marks each parameter whose gradient is final; once every
 * parameter of the next bucket in order is, its gradients are copied out
 * (in compiled mode this runs what was recorded so far) and their
 * all-reduce starts, while backward goes on; each hook also lets MPI
 * progress the buckets in flight. After the backward the buckets not yet
 * started are, all are waited for and the averages copied back. Every
 * rank runs the same graph, so all start the same buckets in the same
 * order. */
typedef struct reducer {
    run *r;
    int n_buckets;
    int *bucket_of;    /* of each parameter */
    int *hi, *lo;      /* bucket b: parameters hi down to lo */
    int64_t *off;      /* bucket b's elements in r->flat: off[b]..off[b+1] */
    int *missing;      /* parameters of bucket b not ready this pass */
    bool *ready;       /* each parameter, this pass */
    ts_dist_req **req; /* bucket b's all-reduce, NULL before it starts */
    int next;          /* the next bucket to start */
    int in_backward;   /* buckets started by hooks, the last pass */
    ts_status st;      /* the first failure in a hook */
} reducer;

static void reducer_free(reducer *red) {
    if (!red)
        return;
    for (int b = 0; b < red->n_buckets; b++)
        ts_dist_wait(red->req[b]);
    free(red->bucket_of), free(red->hi), free(red->lo), free(red->off);
    free(red->missing), free(red->ready), free(red->req);
    free(red);
}

static ts_status reducer_new(run *r) {
    int n = r->n_params;
    reducer *red = calloc(1, sizeof *red);
    size_t cnt = (size_t)n + 1;
    if (red) {
        red->r = r;
        red->bucket_of = malloc(sizeof(int) * cnt);
        red->hi = malloc(sizeof(int) * cnt);
        red->lo = malloc(sizeof(int) * cnt);
        red->off = malloc(sizeof(int64_t) * cnt);
        red->missing = malloc(sizeof(int) * cnt);
        red->ready = malloc(sizeof(bool) * cnt);
        red->req = calloc(cnt, sizeof *red->req);
    }
    if (!red || !red->bucket_of || !red->hi || !red->lo || !red->off ||
        !red->missing || !red->ready || !red->req) {
        reducer_free(red);
        return ts_set_error(r->ctx, TS_ERR_OOM, "out of memory");
    }
    int64_t at = 0;
    for (int i = n - 1; i >= 0;) { /* as all_reduce_grads groups them */
        int b = red->n_buckets++;
        int64_t k = 0;
        red->hi[b] = i, red->off[b] = at;
        for (; i >= 0 && (k == 0 || k + numel_of(r, i) <= bucket_elems(r));
             i--) {
            red->bucket_of[i] = b;
            k += numel_of(r, i);
        }
        red->lo[b] = i + 1;
        at += k;
    }
    red->off[red->n_buckets] = at;
    r->red = red;
    return TS_OK;
}

/* bucket b's gradients into r->flat (to_flat) or back from it */
static ts_status bucket_copy(reducer *red, int b, bool to_flat) {
    run *r = red->r;
    int64_t k = red->off[b];
    for (int i = red->hi[b]; i >= red->lo[b]; i--) {
        float *g = host_f32(r, ts_grad(r->params[i]), i);
        if (!g)
            return ts_ctx_status(r->ctx) ? ts_ctx_status(r->ctx) : TS_ERR_STATE;
        size_t bytes = sizeof(float) * (size_t)numel_of(r, i);
        if (to_flat)
            memcpy(r->flat + k, g, bytes);
        else
            memcpy(g, r->flat + k, bytes);
        k += numel_of(r, i);
    }
    return TS_OK;
}

/* --no-overlap: every bucket averaged in turn, after the backward */
static ts_status all_reduce_grads(run *r) {
    reducer *red = r->red;
    ts_status st = TS_OK;
    for (int b = 0; b < red->n_buckets && st == TS_OK; b++) {
        st = bucket_copy(red, b, true);
        if (st == TS_OK)
            st = ts_dist_all_reduce(r->dist, r->flat + red->off[b],
                                    red->off[b + 1] - red->off[b], TS_F32,
                                    TS_DIST_AVG);
        if (st == TS_OK)
            st = bucket_copy(red, b, false);
    }
    return st;
}

/* Starts bucket b's all-reduce, also after a failure (the step's status
 * st: the gradients are then not read, the first error stays the one
 * reported) and when its gradients cannot be read: the other ranks' calls
 * must be matched. */
static ts_status bucket_start(reducer *red, int b, ts_status st) {
    if (st == TS_OK)
        st = bucket_copy(red, b, true);
    ts_status ss = ts_dist_all_reduce_start(
        red->r->dist, red->r->flat + red->off[b], red->off[b + 1] - red->off[b],
        TS_F32, TS_DIST_AVG, &red->req[b]);
    return st != TS_OK ? st : ss;
}

static ts_status on_grad_ready(void *arg, ts_tensor *leaf) {
    reducer *red = arg;
    run *r = red->r;
    int i = 0;
    while (i < r->n_params && r->params[i] != leaf)
        i++;
    if (i == r->n_params || red->st != TS_OK)
        return red->st;
    if (red->ready[i])
        return red->st = ts_set_error(
                   r->ctx, TS_ERR_STATE,
                   "train: the gradient of %s was final twice in one "
                   "backward (used inside and outside a checkpointed "
                   "block?); run with --no-overlap",
                   pname(r, i));
    red->ready[i] = true;
    red->missing[red->bucket_of[i]]--;
    while (red->st == TS_OK && red->next < red->n_buckets &&
           red->missing[red->next] == 0) {
        red->st = bucket_start(red, red->next++, TS_OK);
        red->in_backward++;
    }
    for (int b = 0; b < red->next && red->st == TS_OK; b++) {
        bool done; /* MPI progresses the buckets in flight */
        red->st = ts_dist_test(red->req[b], &done);
    }
    return red->st;
}

/* before the last micro-batch's backward */
static void reducer_arm(reducer *red) {
    run *r = red->r;
    for (int b = 0; b < red->n_buckets; b++)
        red->missing[b] = red->hi[b] - red->lo[b] + 1;
    memset(red->ready, 0, sizeof(bool) * (size_t)r->n_params);
    red->next = red->in_backward = 0;
    red->st = TS_OK;
    ts_set_grad_ready_hook(r->ctx, on_grad_ready, red);
}

/* after it (st: how the backward went): the rest started, all waited for,
 * the averages back in the gradients */
static ts_status reducer_finish(reducer *red, ts_status st) {
    run *r = red->r;
    ts_set_grad_ready_hook(r->ctx, NULL, NULL);
    if (st == TS_OK)
        st = red->st;
    while (red->next < red->n_buckets) /* even after a failure here */
        st = bucket_start(red, red->next++, st);
    for (int b = 0; b < red->n_buckets; b++) {
        ts_status ws = ts_dist_wait(red->req[b]);
        red->req[b] = NULL;
        st = st == TS_OK ? ws : st;
        if (st == TS_OK)
            st = bucket_copy(red, b, false);
    }
    return st;
}

/* grad-opt: each gradient averaged onto the rank that owns it; the others
 * drop theirs */
static ts_status reduce_scatter_grads(run *r) {
    int64_t k = 0;
    for (int a = 0; a < r->n_params; a++) {
        int i = r->order[a];
        float *g = host_f32(r, ts_grad(r->params[i]), i);
        if (!g)
            return ts_ctx_status(r->ctx);
        memcpy(r->flat + k, g, sizeof(float) * (size_t)numel_of(r, i));
        k += numel_of(r, i);
    }
    ts_status st = ts_dist_reduce_scatter(r->dist, r->flat, r->mine, r->counts,
                                          0, TS_F32, TS_DIST_AVG);
    k = 0;
    for (int i = 0; st == TS_OK && i < r->n_params; i++) {
        if (r->owner[i] != r->rank) {
            ts_zero_grad(r->params[i]);
            continue;
        }
        memcpy(ts_tensor_data(ts_grad(r->params[i])), r->mine + k,
               sizeof(float) * (size_t)numel_of(r, i));
        k += numel_of(r, i);
    }
    return st;
}

/* grad-opt: the global gradient norm from each rank's share, and the
 * owned gradients clipped as torch's clip_grad_norm_ does */
static ts_status clip_sharded(run *r, double max_norm, double *norm) {
    double local = 0;
    for (int j = 0; j < r->n_opt; j++) {
        int i = r->opt_idx[j];
        const float *g = ts_tensor_data(ts_grad(r->params[i]));
        for (int64_t e = 0; e < numel_of(r, i); e++)
            local += (double)g[e] * g[e];
    }
    float tot = (float)local;
    ts_status st = ts_dist_all_reduce(r->dist, &tot, 1, TS_F32, TS_DIST_SUM);
    *norm = sqrt((double)tot);
    float coef = (float)(max_norm / (*norm + 1e-6));
    if (st != TS_OK || !(coef < 1))
        return st;
    for (int j = 0; j < r->n_opt; j++) {
        int i = r->opt_idx[j];
        float *g = ts_tensor_data(ts_grad(r->params[i]));
        for (int64_t e = 0; e < numel_of(r, i); e++)
            g[e] *= coef;
    }
    return TS_OK;
}

/* grad-opt: every rank's updated parameters to every rank */
static ts_status all_gather_params(run *r) {
    int64_t k = 0;
    for (int j = 0; j < r->n_opt; j++) {
        int i = r->opt_idx[j];
        memcpy(r->mine + k, ts_tensor_data(r->params[i]),
               sizeof(float) * (size_t)numel_of(r, i));
        k += numel_of(r, i);
    }
    ts_status st =
        ts_dist_all_gather(r->dist, r->mine, r->flat, r->counts, 0, TS_F32);
    k = 0;
    for (int a = 0; st == TS_OK && a < r->n_params; a++) {
        int i = r->order[a];
        memcpy(ts_tensor_data(r->params[i]), r->flat + k,
               sizeof(float) * (size_t)numel_of(r, i));
        k += numel_of(r, i);
    }
    return st;
}

/* out[i] = a new tensor shaped like parameter i holding what its owner
 * has in own[j] (the owner's j-th optimized parameter): the sharded
 * pieces gathered whole on every rank */
static ts_status gather_from_owners(run *r, ts_tensor *const *own,
                                    ts_tensor **out) {
    ts_status st = ts_sync(r->ctx);
    int64_t k = 0;
    for (int j = 0; st == TS_OK && j < r->n_opt; j++) {
        memcpy(r->mine + k, ts_tensor_data(own[j]),
               sizeof(float) * (size_t)ts_tensor_numel(own[j]));
        k += ts_tensor_numel(own[j]);
    }
    if (st == TS_OK)
        st =
            ts_dist_all_gather(r->dist, r->mine, r->flat, r->counts, 0, TS_F32);
    for (int i = 0; i < r->n_params; i++)
        out[i] = NULL;
    k = 0;
    for (int a = 0; st == TS_OK && a < r->n_params; a++) {
        int i = r->order[a];
        ts_tensor *p = r->params[i];
        out[i] = ts_from_data(r->ctx, TS_F32, ts_tensor_ndim(p),
                              ts_tensor_shape(p), r->flat + k);
        if (!out[i])
            st = ts_ctx_status(r->ctx);
        k += numel_of(r, i);
    }
    return st;
}

/* AdamW's moment (sq: the second) of every parameter, for a checkpoint:
 * borrowed from the optimizer, or (grad-opt) gathered from the owners
 * into new tensors (*made set) */
static ts_status full_moments(run *r, bool sq, ts_tensor **out, bool *made) {
    *made = r->shard_opt;
    ts_tensor **own = r->shard_opt ? out + r->n_params : out;
    for (int j = 0; j < r->n_opt; j++)
        own[j] =
            sq ? ts_adamw_exp_avg_sq(r->opt, j) : ts_adamw_exp_avg(r->opt, j);
    return r->shard_opt ? gather_from_owners(r, own, out) : TS_OK;
}

static ts_status write_checkpoint(run *r, ts_tensor *const *pp,
                                  ts_tensor *const *m1, ts_tensor *const *m2) {
    ts_ctx *ctx = r->ctx;
    const ts_train_options *o = r->o;
    char name[64], tmp[4096], final[4096], p[4200];
    snprintf(name, sizeof name, "step_%06lld", (long long)r->step);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", o->out_dir, name);
    snprintf(final, sizeof final, "%s/%s", o->out_dir, name);
    remove_tree(tmp);
    if (mkdir(tmp, 0755))
        return ts_set_error(ctx, TS_ERR_IO, "cannot create %s: %s", tmp,
                            strerror(errno));
    int n = r->n_params;
    const char **names = malloc(sizeof *names * (size_t)n * 2);
    ts_tensor **ts = malloc(sizeof *ts * (size_t)n * 2);
    char **owned = calloc((size_t)n * 2, sizeof *owned);
    ts_status st = names && ts && owned
                       ? TS_OK
                       : ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    for (int i = 0; st == TS_OK && i < n; i++)
        names[i] = pname(r, i), ts[i] = pp[i];
    /* the weights in Hugging Face's layout (experts one tensor each) */
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    const char *meta[2] = {"format", "pt"};
    int n_sd = 0;
    char **sd_names = NULL;
    ts_tensor **sd = NULL;
    if (st == TS_OK)
        st = ts_decoder_state_dict(r->m, pp, &n_sd, &sd_names, &sd);
    if (st == TS_OK)
        st = ts_safetensors_save(ctx, p, n_sd, (const char *const *)sd_names,
                                 sd, 1, meta);
    ts_decoder_state_dict_free(n_sd, sd_names, sd);
    /* AdamW's moments, named after their parameters */
    for (int i = 0; st == TS_OK && i < n; i++) {
        if (asprintf(&owned[2 * i], "exp_avg.%s", names[i]) < 0 ||
            asprintf(&owned[2 * i + 1], "exp_avg_sq.%s", names[i]) < 0)
            st = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    }
    for (int i = 0; st == TS_OK && i < n; i++) {
        names[2 * i] = owned[2 * i], names[2 * i + 1] = owned[2 * i + 1];
        ts[2 * i] = m1[i], ts[2 * i + 1] = m2[i];
    }
    snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp);
    if (st == TS_OK)
        st = ts_safetensors_save(ctx, p, 2 * n, names, ts, 1, meta);
    for (int i = 0; owned && i < 2 * n; i++)
        free(owned[i]);
    free(owned), free(names), free(ts);
    /* the Hugging Face files */
    static const char *const tok_files[] = {"tokenizer.json",
                                            "tokenizer_config.json"};
    snprintf(p, sizeof p, "%s/config.json", tmp);
    if (st == TS_OK)
        st = ts_copy_file(ctx, r->config_src, p);
    for (int i = 0; st == TS_OK && i < 2; i++) {
        char from[4200];
        snprintf(from, sizeof from, "%s/%s", r->tok_dir, tok_files[i]);
        snprintf(p, sizeof p, "%s/%s", tmp, tok_files[i]);
        if (r->tok_dir[0] && access(from, R_OK) == 0)
            st = ts_copy_file(ctx, from, p);
    }
    if (st == TS_OK) {
        ts_model_config mc;
        json_t *gen = json_object();
        if (ts_config_load(ctx, r->config_src, &mc) == TS_OK) {
            if (mc.bos_token_id >= 0)
                json_object_set_new(gen, "bos_token_id",
                                    json_integer(mc.bos_token_id));
            if (mc.eos_token_id >= 0)
                json_object_set_new(gen, "eos_token_id",
                                    json_integer(mc.eos_token_id));
        } else
            ts_clear_error(ctx);
        snprintf(p, sizeof p, "%s/generation_config.json", tmp);
        st = write_json(ctx, p, gen);
        json_decref(gen);
    }
    if (st == TS_OK) {
        json_t *state = json_pack(
            "{s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I}", "step",
            (json_int_t)r->step, "loader_position",
            (json_int_t)ts_loader_position(r->train), "seed",
            (json_int_t)o->seed, "batch", (json_int_t)o->batch, "seq",
            (json_int_t)o->seq, "grad_accum", (json_int_t)o->grad_accum, "lr",
            o->lr, "steps", (json_int_t)o->steps);
        if (state && !isnan(r->val_now)) /* for --keep-last's best */
            json_object_set_new(state, "val_loss", json_real(r->val_now));
        snprintf(p, sizeof p, "%s/trainer_state.json", tmp);
        st = write_json(ctx, p, state);
        json_decref(state);
    }
    if (st == TS_OK) { /* the folder appears whole, then latest names it */
        remove_tree(final);
        if (rename(tmp, final))
            st = ts_set_error(ctx, TS_ERR_IO, "cannot rename %s: %s", tmp,
                              strerror(errno));
    }
    if (st == TS_OK) {
        snprintf(p, sizeof p, "%s/latest", o->out_dir);
        ts_atomic_file af;
        bool ok = ts_atomic_open(&af, p) &&
                  ts_atomic_write(&af, name, strlen(name)) &&
                  ts_atomic_write(&af, "\n", 1);
        if (!ts_atomic_commit(&af, ok))
            st = ts_set_error(ctx, TS_ERR_IO, "cannot write %s", p);
    }
    if (st != TS_OK)
        remove_tree(tmp);
    return st;
}

/* ---- fully sharded (--shard full): a layer's parameters exist on every
 * rank only while the layer runs; at rest each rank holds those it owns.
 * The model's layer hook gathers a layer before its forward and before its
 * recompute in backward (layers are checkpointed), releases it after, and
 * once the layer's backward is done reduce-scatters its gradients to their
 * owners. Outside the layers (embedding, final norm, head) parameters stay
 * whole on every rank between steps, their gradients reduce-scattered and
 * their updates broadcast by the owners, as in grad-opt. Eager steps. */

static bool owned(const run *r, int i) {
    return r->owner[i] == r->rank;
}

static ts_status gather_layer(run *r, int64_t layer) {
    ts_status st = TS_OK;
    for (int i = 0; st == TS_OK && i < r->n_params; i++) {
        if (r->layer_of[i] != layer || owned(r, i))
            continue;
        ts_tensor *p = r->params[i];
        ts_tensor *t =
            ts_empty(r->ctx, TS_F32, ts_tensor_ndim(p), ts_tensor_shape(p));
        st = t ? ts_decoder_set_param(r->m, i, t) : ts_ctx_status(r->ctx);
        ts_release(t);
    }
    for (int i = 0; st == TS_OK && i < r->n_params; i++)
        if (r->layer_of[i] == layer)
            st = ts_dist_broadcast(r->dist, ts_tensor_data(r->params[i]),
                                   numel_of(r, i), TS_F32, r->owner[i]);
    return st;
}

static ts_status release_layer(run *r, int64_t layer) {
    ts_status st = TS_OK;
    for (int i = 0; st == TS_OK && i < r->n_params; i++)
        if (r->layer_of[i] == layer && !owned(r, i))
            st = ts_decoder_set_param(r->m, i, r->released[i]);
    return st;
}

/* the gradients of the parameters in `layer` (-1: outside the layers)
 * averaged onto their owners; the others dropped */
static ts_status reduce_part(run *r, int64_t layer) {
    int64_t *counts = calloc((size_t)r->world, sizeof *counts), k = 0;
    if (!counts)
        return ts_set_error(r->ctx, TS_ERR_OOM, "out of memory");
    ts_status st = TS_OK;
    for (int a = 0; st == TS_OK && a < r->n_params; a++) {
        int i = r->order[a];
        if (r->layer_of[i] != layer)
            continue;
        float *g = host_f32(r, ts_grad(r->params[i]), i);
        if (!g)
            st = ts_ctx_status(r->ctx);
        else
            memcpy(r->flat + k, g, sizeof(float) * (size_t)numel_of(r, i));
        k += numel_of(r, i);
        counts[r->owner[i]] += numel_of(r, i);
    }
    st = agree(r, st);
    if (st == TS_OK)
        st = ts_dist_reduce_scatter(r->dist, r->flat, r->mine, counts, 0,
                                    TS_F32, TS_DIST_AVG);
    k = 0;
    for (int i = 0; st == TS_OK && i < r->n_params; i++) {
        if (r->layer_of[i] != layer)
            continue;
        if (!owned(r, i)) {
            ts_zero_grad(r->params[i]);
            continue;
        }
        memcpy(ts_tensor_data(ts_grad(r->params[i])), r->mine + k,
               sizeof(float) * (size_t)numel_of(r, i));
        k += numel_of(r, i);
    }
    free(counts);
    return st;
}

static ts_status fsdp_hook(void *arg, int64_t layer, bool before,
                           bool backward) {
    run *r = arg;
    if (before)
        return gather_layer(r, layer);
    ts_status st = backward ? reduce_part(r, layer) : TS_OK;
    return st == TS_OK ? release_layer(r, layer) : st;
}

/* full: the owners' updated parameters outside the layers to every rank */
static ts_status broadcast_outer(run *r) {
    ts_status st = TS_OK;
    for (int i = 0; st == TS_OK && i < r->n_params; i++)
        if (r->layer_of[i] < 0)
            st = ts_dist_broadcast(r->dist, ts_tensor_data(r->params[i]),
                                   numel_of(r, i), TS_F32, r->owner[i]);
    return st;
}

/* full: the layers go to rest (each rank keeps what it owns), checkpointed,
 * and the hook takes over */
static ts_status shard_at_rest(run *r) {
    ts_status st = TS_OK;
    r->layer_of = malloc(sizeof *r->layer_of * (size_t)r->n_params);
    r->released = calloc((size_t)r->n_params, sizeof *r->released);
    if (!r->layer_of || !r->released)
        return ts_set_error(r->ctx, TS_ERR_OOM, "out of memory");
    int64_t ones[TS_MAX_DIMS];
    for (int d = 0; d < TS_MAX_DIMS; d++)
        ones[d] = 1;
    ts_tensor *zero = ts_zeros(r->ctx, TS_F32, 1, ones);
    for (int i = 0; i < r->n_params; i++)
        r->layer_of[i] = -1;
    int64_t L = ts_decoder_get_config(r->m)->layers;
    for (int64_t l = 0; l < L; l++) {
        int first = 0, count = 0;
        ts_decoder_layer_params(r->m, l, &first, &count);
        for (int i = first; i < first + count; i++)
            r->layer_of[i] = (int)l;
    }
    for (int i = 0; st == TS_OK && i < r->n_params; i++) {
        if (r->layer_of[i] < 0 || owned(r, i))
            continue;
        ts_tensor *p = r->params[i]; /* one zero seen at every index */
        ts_tensor *z = zero ? ts_reshape(zero, ts_tensor_ndim(p), ones) : NULL;
        r->released[i] =
            z ? ts_expand(z, ts_tensor_ndim(p), ts_tensor_shape(p)) : NULL;
        ts_release(z);
        if (!r->released[i])
            st = ts_ctx_status(r->ctx) ? ts_ctx_status(r->ctx) : TS_ERR_OOM;
    }
    ts_release(zero);
    for (int64_t l = 0; st == TS_OK && l < ts_decoder_get_config(r->m)->layers;
         l++)
        st = release_layer(r, l);
    if (st == TS_OK)
        st = ts_decoder_set_checkpointing(r->m, true);
    if (st == TS_OK)
        st = ts_decoder_set_layer_hook(r->m, fsdp_hook, r);
    return st;
}

/* every parameter whole, for a checkpoint: the model's own, or (full)
 * gathered from their owners into new tensors (*made set) */
static ts_status full_params(run *r, ts_tensor **out, bool *made) {
    *made = r->shard_full;
    if (!r->shard_full) {
        for (int i = 0; i < r->n_params; i++)
            out[i] = r->params[i];
        return TS_OK;
    }
    ts_tensor **own = out + r->n_params;
    for (int j = 0; j < r->n_opt; j++)
        own[j] = r->params[r->opt_idx[j]];
    return gather_from_owners(r, own, out);
}

/* ---- checkpoint retention and the log on resume ---- */

typedef struct {
    int64_t step;
    double val; /* NAN: not evaluated at that step */
} ckpt_entry;

static int by_step(const void *a, const void *b) {
    int64_t x = ((const ckpt_entry *)a)->step,
            y = ((const ckpt_entry *)b)->step;
    return (x > y) - (x < y);
}

/* --keep-last N: of the checkpoints up to this step, the newest N stay,
 * and the one of the best validation loss (the latest of equals), however
 * old; the others are removed, each named on stderr */
static ts_status prune_checkpoints(run *r) {
    const ts_train_options *o = r->o;
    if (o->keep_last <= 0)
        return TS_OK;
    DIR *d = opendir(o->out_dir);
    if (!d)
        return ts_set_error(r->ctx, TS_ERR_IO, "cannot read %s: %s", o->out_dir,
                            strerror(errno));
    ckpt_entry *e = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        long long step;
        int used = 0;
        /* past this step: another run's, not this one's to remove */
        if (sscanf(de->d_name, "step_%lld%n", &step, &used) != 1 ||
            de->d_name[used] || strlen(de->d_name) != 11 || step > r->step)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            ckpt_entry *ne = realloc(e, sizeof *e * cap);
            if (!ne) {
                free(e), closedir(d);
                return ts_set_error(r->ctx, TS_ERR_OOM, "out of memory");
            }
            e = ne;
        }
        char p[4400];
        snprintf(p, sizeof p, "%s/%s/trainer_state.json", o->out_dir,
                 de->d_name);
        json_t *j = json_load_file(p, 0, NULL);
        json_t *v = json_object_get(j, "val_loss");
        e[n++] =
            (ckpt_entry){step, json_is_number(v) ? json_number_value(v) : NAN};
        json_decref(j);
    }
    closedir(d);
    qsort(e, n, sizeof *e, by_step);
    int64_t best = -1;
    double best_val = INFINITY;
    for (size_t i = 0; i < n; i++)
        if (!isnan(e[i].val) && e[i].val <= best_val)
            best_val = e[i].val, best = e[i].step;
    for (size_t i = 0; n > (size_t)o->keep_last && i < n - (size_t)o->keep_last;
         i++) {
        if (e[i].step == best)
            continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/step_%06lld", o->out_dir,
                 (long long)e[i].step);
        remove_tree(p);
        if (!o->quiet)
            fprintf(stderr,
                    "train: removed checkpoint %s (--keep-last %lld%s)\n", p,
                    (long long)o->keep_last,
                    best >= 0 ? " and the best validation loss" : "");
    }
    free(e);
    return TS_OK;
}

/* --resume: log.jsonl keeps its lines up to the checkpoint's step,
 * byte for byte (a temporary file renamed over it); the lines of steps
 * past it, which the resumed run does again, go */
static ts_status truncate_log(run *r, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT
                   ? TS_OK
                   : ts_set_error(r->ctx, TS_ERR_IO, "cannot read %s: %s", path,
                                  strerror(errno));
    ts_atomic_file af;
    bool ok = ts_atomic_open(&af, path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t k;
    int64_t dropped = 0;
    while (ok && (k = getline(&line, &cap, f)) > 0) {
        json_t *j = line[k - 1] == '\n' ? json_loads(line, 0, NULL) : NULL;
        json_t *st = json_object_get(j, "step");
        bool keep = json_is_integer(st) && json_integer_value(st) <= r->step;
        json_decref(j);
        if (keep)
            ok = ts_atomic_write(&af, line, (size_t)k);
        else
            dropped++;
    }
    free(line);
    bool rd = !ferror(f);
    fclose(f);
    if (!ts_atomic_commit(&af, ok && rd))
        return ts_set_error(r->ctx, TS_ERR_IO,
                            "--resume: cannot rewrite %s to step %lld", path,
                            (long long)r->step);
    if (dropped && !r->o->quiet)
        fprintf(stderr,
                "train: %s: %lld line(s) past the checkpoint's step %lld "
                "removed\n",
                path, (long long)dropped, (long long)r->step);
    return TS_OK;
}

/* every rank takes part (a sharded optimizer's moments are gathered);
 * rank 0 writes */
static ts_status save_checkpoint(run *r) {
    int n = r->n_params;
    /* each list: n results, then room for this rank's own n_opt */
    ts_tensor **all = calloc((size_t)n * 6, sizeof *all);
    if (!all)
        return agree(r, ts_set_error(r->ctx, TS_ERR_OOM, "out of memory"));
    ts_tensor **pp = all, **m1 = all + 2 * n, **m2 = all + 4 * n;
    bool made0 = false, made1 = false, made2 = false;
    ts_status st = ts_sync(r->ctx);
    if (st == TS_OK)
        st = full_params(r, pp, &made0);
    if (st == TS_OK)
        st = full_moments(r, false, m1, &made1);
    if (st == TS_OK)
        st = full_moments(r, true, m2, &made2);
    if (st == TS_OK && r->rank == 0)
        st = write_checkpoint(r, pp, m1, m2);
    if (st == TS_OK && r->rank == 0)
        st = prune_checkpoints(r);
    for (int i = 0; i < n; i++) {
        if (made0)
            ts_release(pp[i]);
        if (made1)
            ts_release(m1[i]);
        if (made2)
            ts_release(m2[i]);
    }
    free(all);
    return agree(r, st);
}

/* copies the named tensors of path into dst[] (same shapes) */
static ts_status load_into(ts_ctx *ctx, const char *path, int n,
                           const char *const *names, ts_tensor *const *dst) {
    ts_safetensors *sf = NULL;
    ts_status st = ts_safetensors_open(ctx, path, &sf);
    for (int i = 0; st == TS_OK && i < n; i++) {
        ts_tensor *t = ts_safetensors_get(sf, names[i]);
        if (!t) {
            st = ts_ctx_status(ctx);
            break;
        }
        if (ts_tensor_numel(t) != ts_tensor_numel(dst[i]))
            st = ts_set_error(ctx, TS_ERR_SHAPE, "%s: %s has another shape",
                              path, names[i]);
        else
            st = ts_copy_(dst[i], t);
        ts_release(t);
    }
    ts_safetensors_close(sf);
    return st;
}

static ts_status resume(run *r) {
    ts_ctx *ctx = r->ctx;
    char p[4800], name[256] = "", dir[4400];
    snprintf(p, sizeof p, "%s/latest", r->o->out_dir);
    FILE *f = fopen(p, "r");
    if (!f)
        return ts_set_error(ctx, TS_ERR_IO,
                            "--resume: %s has no checkpoint (no %s)",
                            r->o->out_dir, p);
    if (!fgets(name, sizeof name, f))
        name[0] = 0;
    fclose(f);
    name[strcspn(name, "\n")] = 0;
    snprintf(dir, sizeof dir, "%s/%s", r->o->out_dir, name);
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    json_error_t je;
    json_t *s = json_load_file(p, 0, &je);
    if (!json_is_object(s)) {
        json_decref(s);
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "%s: %s", p, je.text);
    }
    r->step = json_integer_value(json_object_get(s, "step"));
    ts_loader_seek(r->train, (uint64_t)json_integer_value(
                                 json_object_get(s, "loader_position")));
    json_int_t b = json_integer_value(json_object_get(s, "batch")),
               t = json_integer_value(json_object_get(s, "seq"));
    json_decref(s);
    if (b != r->o->batch || t != r->o->seq)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "--resume: %s was trained with batch %lld, seq "
                            "%lld (now %lld, %lld)",
                            dir, (long long)b, (long long)t,
                            (long long)r->o->batch, (long long)r->o->seq);
    int n = r->n_params;
    const char **names = malloc(sizeof *names * (size_t)n * 2);
    ts_tensor **ts = malloc(sizeof *ts * (size_t)n * 2);
    char **owned = calloc((size_t)n * 2, sizeof *owned);
    ts_status st = names && ts && owned
                       ? TS_OK
                       : ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    for (int i = 0; st == TS_OK && i < n; i++)
        names[i] = pname(r, i), ts[i] = r->params[i];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int n_sd = 0;
    char **sd_names = NULL;
    ts_tensor **sd = NULL; /* views of the parameters, HF's names */
    if (st == TS_OK)
        st = ts_decoder_state_dict(r->m, NULL, &n_sd, &sd_names, &sd);
    if (st == TS_OK)
        st = load_into(ctx, p, n_sd, (const char *const *)sd_names, sd);
    ts_decoder_state_dict_free(n_sd, sd_names, sd);
    for (int i = 0; st == TS_OK && i < n; i++)
        if (asprintf(&owned[2 * i], "exp_avg.%s", names[i]) < 0 ||
            asprintf(&owned[2 * i + 1], "exp_avg_sq.%s", names[i]) < 0)
            st = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    for (int j = 0; st == TS_OK && j < r->n_opt; j++) {
        int i = r->opt_idx[j]; /* the optimizer's j-th is parameter i */
        names[2 * j] = owned[2 * i], names[2 * j + 1] = owned[2 * i + 1];
        ts[2 * j] = ts_adamw_exp_avg(r->opt, j);
        ts[2 * j + 1] = ts_adamw_exp_avg_sq(r->opt, j);
    }
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    if (st == TS_OK)
        st = load_into(ctx, p, 2 * r->n_opt, names, ts);
    for (int j = 0; st == TS_OK && j < r->n_opt; j++)
        ts_adamw_set_step_count(r->opt, j, r->step);
    for (int i = 0; owned && i < 2 * n; i++)
        free(owned[i]);
    free(owned), free(names), free(ts);
    if (st == TS_OK)
        st = ts_sync(ctx);
    return st;
}

/* ---- steps ---- */

static double lr_at(const ts_train_options *o, int64_t step) {
    if (o->constant_lr)
        return step < o->warmup ? o->lr * (double)(step + 1) / (double)o->warmup
                                : o->lr;
    /* step + 1: the first update already has a non-zero rate */
    return ts_lr_cosine_warmup(step + 1, o->warmup, o->steps, o->lr, o->min_lr);
}

/* mean loss of the micro-batch (ids, targets hold B x T each) */
static ts_tensor *batch_loss(run *r, int64_t *ids, int64_t *tg, int64_t B) {
    int64_t shape[2] = {B, r->o->seq};
    ts_tensor *i = ts_from_data(r->ctx, TS_I64, 2, shape, ids);
    ts_tensor *t = ts_from_data(r->ctx, TS_I64, 2, shape, tg);
    ts_tensor *l = !i || !t ? NULL : ts_decoder_loss(r->m, i, t, NULL);
    ts_release(i), ts_release(t);
    return l;
}

static ts_status eval_loss(run *r, double *out) {
    ts_ctx *ctx = r->ctx;
    const ts_train_options *o = r->o;
    int64_t B = o->batch, T = o->seq;
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(B * T)),
            *tg = malloc(sizeof(int64_t) * (size_t)(B * T));
    if (!ids || !tg) {
        free(ids), free(tg);
        return ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    }
    bool old = ts_set_grad_enabled(ctx, false);
    ts_loader_seek(r->val, 0);
    int64_t nb = o->eval_batches;
    if (nb * B > ts_loader_windows(r->val))
        nb = ts_loader_windows(r->val) / B > 0 ? ts_loader_windows(r->val) / B
                                               : 1;
    double sum = 0;
    ts_status st = TS_OK;
    for (int64_t k = 0; k < nb && st == TS_OK; k++) {
        st = ts_loader_next(r->val, B, r->rank, r->world, ids, tg);
        ts_tensor *l =
            st == TS_OK ? batch_loss(r, ids, tg, B / r->world) : NULL;
        double v = 0;
        if (st == TS_OK)
            st = l ? ts_item(l, &v) : ts_ctx_status(ctx);
        ts_release(l);
        sum += v;
    }
    ts_set_grad_enabled(ctx, old);
    free(ids), free(tg);
    float mean = (float)(sum / (double)nb);
    st = agree(r, st);
    if (st == TS_OK)
        st = ts_dist_all_reduce(r->dist, &mean, 1, TS_F32, TS_DIST_AVG);
    *out = r->world > 1 ? mean : sum / (double)nb;
    return st;
}

/* one optimizer step; the mean loss over its micro-batches, the gradient
 * norm before clipping */
static ts_status train_step(run *r, int64_t *ids, int64_t *tg, double *loss,
                            double *gnorm) {
    ts_ctx *ctx = r->ctx;
    const ts_train_options *o = r->o;
    int64_t B = o->batch;
    ts_zero_grads(r->params, r->n_params);
    ts_tensor *lv[64];
    int64_t accum = o->grad_accum;
    ts_status st = TS_OK;
    bool overlap = false; /* the reducer armed for this backward */
    for (int64_t a = 0; a < accum && st == TS_OK; a++) {
        st = ts_loader_next(r->train, B, r->rank, r->world, ids, tg);
        ts_tensor *l =
            st == TS_OK ? batch_loss(r, ids, tg, B / r->world) : NULL;
        ts_tensor *scaled =
            l ? (accum > 1 ? ts_mul_scalar(l, 1.0 / (double)accum) : l) : NULL;
        if (r->red && !o->no_overlap && a == accum - 1) {
            reducer_arm(r->red);
            overlap = true;
        }
        if (!scaled || ts_backward(scaled, NULL) != TS_OK)
            st = ts_ctx_status(ctx) ? ts_ctx_status(ctx) : TS_ERR_STATE;
        lv[a] = l ? ts_detach(l) : NULL;
        if (scaled != l)
            ts_release(scaled);
        ts_release(l); /* the activations die with the graph */
    }
    /* a micro-batch before the last failed here: the other ranks' buckets
     * must still be matched */
    bool failed_early = r->red && !o->no_overlap && !overlap && st != TS_OK;
    if (overlap || failed_early) {
        if (failed_early)
            reducer_arm(r->red);
        st = reducer_finish(r->red, st);
    }
    if (r->world > 1) { /* the gradients of the whole global batch */
        if (st == TS_OK)
            st = ts_sync(ctx);
        st = agree(r, st);
        if (st == TS_OK && !overlap) /* (full: the layers' in backward) */
            st = r->shard_full  ? reduce_part(r, -1)
                 : r->shard_opt ? reduce_scatter_grads(r)
                                : all_reduce_grads(r);
    }
    double max_norm = o->clip > 0 ? o->clip : INFINITY;
    ts_adamw_set_lr(r->opt, lr_at(o, r->step));
    if (st == TS_OK && r->shard_opt) {
        st = clip_sharded(r, max_norm, gnorm);
        if (st == TS_OK)
            st = ts_adamw_step(r->opt);
    } else if (st == TS_OK) { /* the clip folded into the update */
        st = ts_adamw_step_clipped(r->opt, max_norm, gnorm);
    }
    if (st == TS_OK)
        st = ts_sync(ctx);
    if (r->shard_opt && (st = agree(r, st)) == TS_OK)
        st = r->shard_full ? broadcast_outer(r) : all_gather_params(r);
    double sum = 0;
    for (int64_t a = 0; a < accum; a++) {
        double v = 0;
        if (st == TS_OK && lv[a])
            st = ts_item(lv[a], &v);
        sum += v;
        ts_release(lv[a]);
    }
    float mean = (float)(sum / (double)accum); /* over the global batch */
    st = agree(r, st);
    if (st == TS_OK)
        st = ts_dist_all_reduce(r->dist, &mean, 1, TS_F32, TS_DIST_AVG);
    *loss = r->world > 1 ? mean : sum / (double)accum;
    return st;
}

/* ---- the run ---- */

static ts_status check_options(ts_ctx *ctx, const ts_train_options *o) {
    const char *bad = NULL;
    if (!o->data_dir)
        bad = "--data DIR is required";
    else if (!o->out_dir)
        bad = "--out DIR is required";
    else if (!o->model_config == !o->init_from)
        bad = "give one of --model-config FILE and --init-from DIR";
    else if (o->batch < 1 || o->seq < 1 || o->steps < 1)
        bad = "--batch, --seq and --steps must be >= 1";
    else if (o->batch % ts_dist_world(o->dist))
        bad = "--batch must be a multiple of the number of ranks";
    else if (o->shard < 0 || o->shard > 2)
        bad = "--shard must be none, grad-opt or full";
    else if (o->shard == 2 && o->grad_accum != 1)
        bad = "--shard full takes --grad-accum 1";
    else if (!(o->bucket_mb > 0))
        bad = "--bucket-mb must be > 0";
    else if (o->grad_accum < 1 || o->grad_accum > 64)
        bad = "--grad-accum must be in 1..64";
    else if (!(o->lr > 0) || o->min_lr < 0 || o->min_lr > o->lr)
        bad = "--lr must be > 0 and --min-lr in 0..lr";
    else if (o->warmup < 0 || o->weight_decay < 0 || o->clip < 0)
        bad = "--warmup, --weight-decay and --clip must be >= 0";
    else if (!(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1))
        bad = "betas must be in [0, 1)";
    else if (o->keep_last < 0)
        bad = "--keep-last must be >= 0 (0: keep every checkpoint)";
    else if (o->eval_every < 0 || o->save_every < 0 || o->log_every < 1 ||
             o->eval_batches < 1)
        bad = "--eval-every and --save-every must be >= 0, --log-every >= 1";
    return bad ? ts_set_error(ctx, TS_ERR_INVALID_ARG, "train: %s", bad)
               : TS_OK;
}

static void fmt_time(char *out, size_t cap, double s) {
    if (s < 0 || !isfinite(s))
        snprintf(out, cap, "?");
    else if (s >= 3600)
        snprintf(out, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else
        snprintf(out, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

ts_status ts_train_run(ts_ctx *ctx, const ts_train_options *o,
                       ts_train_result *res) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    ts_status st = check_options(ctx, o);
    if (st != TS_OK)
        return st;
    run r = {.ctx = ctx,
             .o = o,
             .dist = o->dist,
             .rank = ts_dist_rank(o->dist),
             .world = ts_dist_world(o->dist)};
    ts_train_result out = {0};
    int64_t *ids = NULL, *tg = NULL;
    mkdir(o->out_dir, 0755);
    /* the model: a config's architecture, new or loaded */
    if (o->init_from)
        snprintf(r.config_src, sizeof r.config_src, "%s/config.json",
                 o->init_from);
    else
        snprintf(r.config_src, sizeof r.config_src, "%s", o->model_config);
    ts_model_config arch;
    st = ts_config_load(ctx, r.config_src, &arch);
    if (st == TS_OK)
        st = ts_train_check_consistency(ctx, o, r.config_src, &arch,
                                        !o->quiet && r.rank == 0, r.tok_dir,
                                        sizeof r.tok_dir);
    ts_device_map dmap = {0};
    bool on_dev = o->device && strcmp(o->device, "cpu");
    if (st == TS_OK && on_dev && r.world > 1)
        st = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                          "train: --device %s with %d ranks: distributed "
                          "runs keep their parameters on the host (run one "
                          "process per device without --device)",
                          o->device, r.world);
    if (st == TS_OK && on_dev)
        st = ts_device_map_parse(ctx, o->device, (int)arch.layers, &dmap);
    if (st == TS_OK && o->init_from) {
        ts_load_options lo = {.device_map = on_dev ? o->device : NULL};
        st = ts_decoder_load_opts(ctx, o->init_from, &lo, &r.m);
        if (st == TS_OK) /* loaded weights are leaves that learn */
            for (int i = 0; i < ts_decoder_num_params(r.m); i++)
                ts_set_requires_grad(ts_decoder_param(r.m, i), true);
    } else if (st == TS_OK) {
        ts_decoder_options dopt = {.device_map = on_dev ? &dmap : NULL};
        st = ts_decoder_new(ctx, &arch, &dopt, o->seed, &r.m);
    }
    ts_device_map_free(&dmap);
    if (st == TS_OK && o->checkpoint_activations)
        st = ts_decoder_set_checkpointing(r.m, true);
    if (st == TS_OK && o->bf16)
        st = ts_decoder_set_compute_dtype(r.m, TS_BF16);
    int64_t layers = 0, heads = 0, head_dim = 0;
    if (st == TS_OK) {
        const ts_model_config *mc = ts_decoder_get_config(r.m);
        layers = mc->layers, heads = mc->heads, head_dim = mc->head_dim;
        /* fully sharded layers hand their gradients over when their
         * recompute ends; a sparse layer whose router logits feed the
         * load-balancing loss is not recomputed, so it would not */
        if (o->shard == 2 && r.world > 1 && mc->n_experts > 0 &&
            mc->router_aux_loss_coef > 0)
            st = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                              "train: --shard full does not take a mixture "
                              "of experts with router_aux_loss_coef > 0 "
                              "(%s: %g); use --shard grad-opt or none",
                              r.config_src, mc->router_aux_loss_coef);
    }
    if (st == TS_OK)
        st = ts_loader_open(ctx, o->data_dir, "train", o->seq, o->seed, true,
                            &r.train);
    if (st == TS_OK && o->eval_every &&
        ts_loader_open(ctx, o->data_dir, "val", o->seq, o->seed, false,
                       &r.val) != TS_OK)
        st = ts_ctx_status(ctx);
    if (st == TS_OK) {
        r.n_params = ts_decoder_num_params(r.m);
        r.params = ts_decoder_params(r.m);
        r.opt_idx = malloc(sizeof *r.opt_idx * (size_t)r.n_params);
        int64_t total = 0;
        for (int i = 0; i < r.n_params; i++)
            total += ts_tensor_numel(r.params[i]);
        r.flat = r.world > 1 ? malloc(sizeof(float) * (size_t)total) : NULL;
        if (!r.opt_idx || (r.world > 1 && !r.flat))
            st = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
        r.n_opt = r.n_params;
        for (int i = 0; st == TS_OK && i < r.n_params; i++)
            r.opt_idx[i] = i;
        r.shard_opt = o->shard >= 1 && r.world > 1;
        r.shard_full = o->shard == 2 && r.world > 1;
        if (st == TS_OK && r.shard_opt && r.n_params < r.world)
            st = ts_set_error(ctx, TS_ERR_INVALID_ARG,
                              "train: --shard grad-opt over %d ranks needs "
                              "as many parameters (the model has %d)",
                              r.world, r.n_params);
        if (st == TS_OK && r.shard_opt)
            st = plan_shards(&r);
        if (st == TS_OK && r.world > 1 && !r.shard_opt)
            st = reducer_new(&r);
        if (st == TS_OK && r.world > 1)
            st = broadcast_params(&r);
    }
    st = agree(&r, st);
    if (st == TS_OK) {
        ts_tensor **op = malloc(sizeof *op * (size_t)r.n_opt + 1);
        for (int j = 0; op && j < r.n_opt; j++)
            op[j] = r.params[r.opt_idx[j]];
        ts_adamw_options ao = {.lr = o->lr,
                               .beta1 = o->beta1,
                               .beta2 = o->beta2,
                               .eps = 1e-8,
                               .weight_decay = o->weight_decay};
        st = op ? ts_adamw_new(ctx, op, r.n_opt, &ao, &r.opt)
                : ts_set_error(ctx, TS_ERR_OOM, "out of memory");
        free(op);
    }
    if (st == TS_OK && o->resume)
        st = resume(&r);
    if (st == TS_OK && r.shard_full) /* after a resume filled every layer */
        st = shard_at_rest(&r);
    st = agree(&r, st);
    ids = malloc(sizeof(int64_t) * (size_t)(o->batch * o->seq));
    tg = malloc(sizeof(int64_t) * (size_t)(o->batch * o->seq));
    if (st == TS_OK && (!ids || !tg))
        st = ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    /* counts for MFU */
    int64_t n_all = 0, n_embed = 0;
    for (int i = 0; st == TS_OK && i < r.n_params; i++) {
        int64_t k = ts_tensor_numel(r.params[i]);
        n_all += k;
        /* the input embedding (GPT-2: the positions; its tied wte is
         * the LM head, counted) */
        if (!strcmp(pname(&r, i), "model.embed_tokens.weight") ||
            !strcmp(pname(&r, i), "transformer.wpe.weight"))
            n_embed = k;
    }
    double fpt = layers ? ts_train_flops_per_token(n_all - n_embed, layers,
                                                   heads, head_dim, o->seq)
                        : 0;
    /* rank 0 measures one rank's hardware peak (and what sgemm achieves
     * now, beside it); a given --peak-gflops replaces the hardware's */
    ts_peak_info pk = {0};
    if (st == TS_OK && r.rank == 0)
        st = ts_peak_measure(ctx, o->peak <= 0, &pk);
    double peak = o->peak > 0 ? o->peak : pk.hardware;
    float peak_g = (float)(peak / 1e9);
    st = agree(&r, st);
    if (st == TS_OK)
        st = ts_dist_broadcast(r.dist, &peak_g, 1, TS_F32, 0);
    peak = (double)peak_g * 1e9 * r.world; /* the run's */
    char peak_desc[512];
    if (o->peak > 0)
        snprintf(peak_desc, sizeof peak_desc,
                 "peak %.1f GFLOP/s (given by --peak-gflops)", peak / 1e9);
    else
        snprintf(peak_desc, sizeof peak_desc,
                 "hardware peak %.1f GFLOP/s = %d core(s) x %.2f GHz "
                 "(measured) x %g FLOP/cycle (%s%s%s) on %s; achievable "
                 "(sgemm 1024, measured now) %.1f GFLOP/s",
                 pk.hardware * r.world / 1e9, pk.cores, pk.clock_hz / 1e9,
                 pk.flops_per_cycle, pk.isa, pk.isa_note[0] ? "; " : "",
                 pk.isa_note, pk.cpu, pk.sgemm * r.world / 1e9);
    char logp[4200];
    snprintf(logp, sizeof logp, "%s/log.jsonl", o->out_dir);
    if (st == TS_OK && r.rank == 0 && o->resume)
        st = truncate_log(&r, logp);
    if (st == TS_OK && r.rank == 0 &&
        !(r.log = fopen(logp, o->resume ? "a" : "w")))
        st = ts_set_error(ctx, TS_ERR_IO, "cannot write %s: %s", logp,
                          strerror(errno));
    st = agree(&r, st);
    bool quiet = o->quiet || r.rank != 0; /* rank 0 speaks for the run */
    bool tty = isatty(2) && !quiet;
    char ranks[96] = "";
    if (r.world > 1)
        snprintf(ranks, sizeof ranks, ", %d ranks (%s)", r.world,
                 r.shard_full  ? "fully sharded, eager, layers checkpointed"
                 : r.shard_opt ? "grad-opt sharded"
                               : "data parallel");
    if (st == TS_OK && !quiet)
        fprintf(
            stderr,
            "train: %lld parameters (%lld without the input embedding), %lld "
            "train tokens, batch %lld x %lld x %lld accum, %s, %s, %s%s%s\n",
            (long long)n_all, (long long)(n_all - n_embed),
            (long long)ts_loader_tokens(r.train), (long long)o->batch,
            (long long)o->seq, (long long)o->grad_accum,
            o->eager || r.shard_full ? "eager" : "compiled",
            o->bf16 ? "bf16 matrices, f32 masters" : "f32", peak_desc, ranks,
            o->resume ? ", resumed" : "");
    if (st == TS_OK)
        ts_set_mode(ctx, o->eager || r.shard_full ? TS_MODE_EAGER
                                                  : TS_MODE_COMPILED);
    double t_start = now_s(), t_window = t_start;
    int64_t start_step = r.step, win_tokens = 0;
    /* the summary's rate: the steps after the first of this run (which
     * records and compiles), each timed alone (no eval, save or log) */
    double win_step_s = 0, timed_s = 0, first_step_s = 0;
    int64_t timed_tokens = 0;
    bool peak_logged = false;
    double comm_window = ts_dist_comm_seconds(r.dist);
    out.n_params = n_all;
    bool stop = false; /* on_step asked to end the run */
    while (st == TS_OK && r.step < o->steps && !stop) {
        double loss = 0, gnorm = 0;
        double lr = lr_at(o, r.step);
        double t_step = now_s();
        st = train_step(&r, ids, tg, &loss, &gnorm);
        if (st != TS_OK)
            break;
        t_step = now_s() - t_step;
        int64_t step_tokens = o->batch * o->seq * o->grad_accum;
        win_step_s += t_step;
        if (r.step > start_step) { /* not the run's first step */
            timed_s += t_step, timed_tokens += step_tokens;
            out.timed_steps++;
            if (out.timed_steps == 1)
                out.timed_from = r.step + 1;
        } else
            first_step_s = t_step;
        if (!isfinite(loss)) {
            st = ts_set_error(ctx, TS_ERR_STATE,
                              "train: the loss is %g at step %lld; lower "
                              "--lr or raise --warmup",
                              loss, (long long)r.step + 1);
            break;
        }
        r.step++;
        win_tokens += step_tokens;
        if (r.step == start_step + 1)
            out.first_loss = loss;
        out.last_loss = loss;
        double val = NAN;
        r.val_now = NAN;
        if (o->eval_every &&
            (r.step % o->eval_every == 0 || r.step == o->steps)) {
            ts_set_mode(ctx, TS_MODE_EAGER);
            st = eval_loss(&r, &val);
            ts_set_mode(ctx, o->eager || r.shard_full ? TS_MODE_EAGER
                                                      : TS_MODE_COMPILED);
            out.last_val_loss = val;
            r.val_now = val;
        }
        if (st == TS_OK && o->on_step) {
            double tps1 = t_step > 0 ? (double)step_tokens / t_step : 0;
            ts_train_step_info info = {.step = r.step,
                                       .steps = o->steps,
                                       .loss = loss,
                                       .lr = lr,
                                       .grad_norm = gnorm,
                                       .tokens_per_s = tps1,
                                       .mfu = peak > 0 ? tps1 * fpt / peak : 0,
                                       .step_s = t_step,
                                       .val_loss = val};
            stop = o->on_step(o->on_step_arg, &info);
        }
        double t = now_s();
        if (r.step % o->log_every == 0 || r.step == o->steps || !isnan(val) ||
            stop) {
            double dt = t - t_window;
            double tps = win_step_s > 0 ? (double)win_tokens / win_step_s : 0;
            double mfu = peak > 0 ? tps * fpt / peak : 0;
            double eta = (double)(o->steps - r.step) * (t - t_start) /
                         (double)(r.step - start_step);
            double comm = ts_dist_comm_seconds(r.dist);
            double share = dt > 0 ? (comm - comm_window) / dt : 0;
            comm_window = comm;
            out.comm_share = share;
            char etas[32];
            fmt_time(etas, sizeof etas, eta);
            if (r.log) {
                fprintf(r.log,
                        "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, "
                        "\"grad_norm\": %.6f, \"tokens_per_s\": %.1f, "
                        "\"mfu\": %.4f, \"step_s\": %.6f, \"elapsed_s\": %.2f",
                        (long long)r.step, loss, lr, gnorm, tps, mfu,
                        win_step_s, t - t_start);
                if (!peak_logged) { /* the first line of each run */
                    peak_logged = true;
                    if (o->peak > 0)
                        fprintf(r.log,
                                ", \"peak\": {\"source\": \"given\", "
                                "\"gflops\": %.3f}",
                                peak / 1e9);
                    else {
                        json_t *pj = json_pack(
                            "{s:s, s:f, s:s, s:s, s:s, s:i, s:f, s:f, s:f, "
                            "s:i}",
                            "source", "hardware", "gflops", peak / 1e9, "cpu",
                            pk.cpu, "isa", pk.isa, "isa_note", pk.isa_note,
                            "cores", pk.cores * r.world, "clock_ghz",
                            pk.clock_hz / 1e9, "flops_per_cycle",
                            pk.flops_per_cycle, "sgemm_gflops",
                            pk.sgemm * r.world / 1e9, "ranks", r.world);
                        char *ps = pj ? json_dumps(pj, JSON_PRESERVE_ORDER |
                                                           JSON_COMPACT)
                                      : NULL;
                        if (ps)
                            fprintf(r.log, ", \"peak\": %s", ps);
                        free(ps);
                        json_decref(pj);
                    }
                }
                if (r.world > 1)
                    fprintf(r.log, ", \"comm_share\": %.4f", share);
                if (r.red && !o->no_overlap) /* how many overlapped */
                    fprintf(r.log,
                            ", \"buckets\": %d, \"buckets_in_backward\": %d",
                            r.red->n_buckets, r.red->in_backward);
                if (!isnan(val))
                    fprintf(r.log, ", \"val_loss\": %.6f", val);
                fprintf(r.log, "}\n");
                fflush(r.log);
            }
            if (!quiet) {
                char line[512];
                int n = snprintf(line, sizeof line,
                                 "step %6lld/%lld  loss %.4f  lr %.3g  gnorm "
                                 "%.3f  %.0f tok/s  MFU %.1f%%  ETA %s",
                                 (long long)r.step, (long long)o->steps, loss,
                                 lr, gnorm, tps, 100 * mfu, etas);
                if (r.world > 1)
                    n += snprintf(line + n, sizeof line - (size_t)n,
                                  "  comm %.0f%%", 100 * share);
                if (!isnan(val))
                    snprintf(line + n, sizeof line - (size_t)n, "  val %.4f",
                             val);
                if (tty) {
                    int width = 20, done = (int)(width * r.step / o->steps);
                    fprintf(stderr, "\r[%.*s%*s] %s\033[K", done,
                            "####################", width - done, "", line);
                    if (r.step == o->steps || !isnan(val))
                        fputc('\n', stderr);
                } else
                    fprintf(stderr, "%s\n", line);
            }
            t_window = t, win_tokens = 0, win_step_s = 0;
        }
        if (st == TS_OK && ((o->save_every && r.step % o->save_every == 0) ||
                            r.step == o->steps || stop)) {
            ts_set_mode(ctx, TS_MODE_EAGER);
            st = save_checkpoint(&r);
            ts_set_mode(ctx, o->eager || r.shard_full ? TS_MODE_EAGER
                                                      : TS_MODE_COMPILED);
        }
    }
    ts_set_mode(ctx, TS_MODE_EAGER);
    out.steps_done = r.step;
    out.seconds = now_s() - t_start;
    if (!out.timed_steps && r.step > start_step) { /* one step: that one */
        out.timed_from = r.step, out.timed_steps = 1;
        timed_tokens = o->batch * o->seq * o->grad_accum;
        timed_s = first_step_s;
    }
    out.tokens_per_s = timed_s > 0 ? (double)timed_tokens / timed_s : 0;
    out.mfu = peak > 0 ? out.tokens_per_s * fpt / peak : 0;
    out.peak = peak, out.peak_sgemm = pk.sgemm * r.world;
    if (res)
        *res = out;
    if (r.log)
        fclose(r.log);
    free(ids), free(tg);
    ts_loader_free(r.train), ts_loader_free(r.val);
    ts_adamw_free(r.opt);
    ts_decoder_free(r.m);
    free(r.opt_idx), free(r.owner), free(r.order), free(r.counts);
    for (int i = 0; r.released && i < r.n_params; i++)
        ts_release(r.released[i]);
    free(r.released), free(r.layer_of);
    reducer_free(r.red);
    free(r.flat), free(r.mine);
    return st;
}
