/* bench_train.c — training throughput (issue 6): tokens/s and MFU of one
 * training step of GPT-2 124M (d 768, 12 layers, 12 heads, vocab 50257,
 * 1024 positions) at B=4, T=64 (llm.c's CPU trainer) and of the
 * Qwen3-style model of bench_compile.c (hidden 512, 8 layers, vocab 32000)
 * at B=8, T=256, f32, 2 threads, side by side with the same step in
 * PyTorch (bench/train_torch.py, a co-process driven over pipes).
 *
 * A step is src/train/train.c's train_step: zero the grads, loss on a
 * random batch, backward, clipping (1.0) folded into AdamW (lr 3e-4,
 * betas 0.9/0.95, wd 0.1; ts_adamw_step_clipped, the norm read back),
 * sync, the loss read back. Tessera
 * compiled (what `tessera train` runs), Tessera eager and PyTorch take
 * their steps in turn, so all three see the same machine load; each
 * figure is the median of the timed steps after the warm-up steps. MFU =
 * tokens/s x FLOPs per token / peak, FLOPs per token 6 N + 12 L H D T
 * (ts_train_flops_per_token) and peak the hardware's (ts_peak_measure:
 * cores x measured clock x the ISA's FLOPs per cycle, as tessera train
 * reports it); an sgemm measured in this run is shown beside it.
 *
 *   bench_train [--model gpt2|qwen3|all] [--steps N] [--warmup N]
 *               [--no-torch] [--no-eager] [--small] [--eager-first]
 *               [--threads N (2; the figures are at 2)]
 *   bench_train --check DIR   (run by train_torch.py --check)
 */
#define _GNU_SOURCE
#include "core/core.h"
#include "qwen3_06b.h"
#include "tessera.h"
#include "tessera_models.h"
#include "tessera_nn.h"
#include "tessera_train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef TS_SOURCE_DIR
#define TS_SOURCE_DIR "."
#endif

#define LR 3e-4
static int g_threads = 2; /* --threads: Tessera, OpenBLAS and PyTorch */
#define CLIP  1.0
#define MAX_T 4096

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(ts_ctx *ctx, const char *what) {
    fprintf(stderr, "bench_train: %s: %s\n", what,
            ctx ? ts_errmsg(ctx) : strerror(errno));
    exit(1);
}

/* ---- the two models behind one interface ---- */

typedef enum { GPT2, QWEN3 } model_kind;

typedef struct {
    model_kind kind;
    int64_t B, T;
    ts_model_config gpt2;  /* GPT2 */
    ts_model_config qwen3; /* QWEN3 */
} bench_model;

static bench_model gpt2_model(bool small) {
    bench_model b = {.kind = GPT2, .B = 4, .T = 64};
    ts_model_config *c = &b.gpt2;
    *c = bench_preset("gpt2");
    c->vocab = 50257, c->hidden = 768, c->layers = 12, c->heads = 12;
    c->max_positions = 1024, c->norm_eps = 1e-5;
    if (small) /* train_torch.py's GPT2_SMALL */
        c->vocab = 512, c->hidden = 64, c->layers = 2, c->heads = 4,
        c->max_positions = 64, b.B = 2, b.T = 32;
    c->kv_heads = c->heads, c->head_dim = c->hidden / c->heads;
    c->intermediate = 4 * c->hidden;
    return b;
}

/* bench_compile.c's model (train_torch.py's QWEN3) */
static bench_model qwen3_model(bool small) {
    bench_model b = {.kind = QWEN3, .B = 8, .T = 256};
    ts_model_config *q = &b.qwen3;
    *q = bench_preset("qwen3");
    q->vocab = 32000, q->hidden = 512, q->layers = 8, q->heads = 8;
    q->kv_heads = 4, q->head_dim = 64, q->intermediate = 1536;
    q->norm_eps = 1e-6, q->rope_theta = 1e6;
    q->tie_word_embeddings = false, q->max_positions = 4096;
    if (small) { /* train_torch.py's QWEN3_SMALL */
        ts_model_config *c = &b.qwen3;
        c->vocab = 1000, c->hidden = 128, c->layers = 2, c->heads = 4;
        c->kv_heads = 2, c->head_dim = 32, c->intermediate = 384;
        b.B = 2, b.T = 32;
    }
    return b;
}

static const char *model_name(const bench_model *b) {
    return b->kind == GPT2 ? "gpt2" : "qwen3";
}

/* FLOPs per token of a step. with_head: N is every parameter but the
 * input embedding tables (wpe; embed_tokens), so the LM head's matmul
 * counts, tied to wte or not; else N also leaves out GPT-2's tied wte. */
static double flops_per_token(const bench_model *b, bool with_head) {
    int64_t L, H, D, V, C, F, n;
    if (b->kind == GPT2) {
        const ts_model_config *c = &b->gpt2;
        L = c->layers, H = c->heads, D = c->head_dim, V = c->vocab;
        C = c->hidden, F = c->intermediate;
        int64_t layer = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C +
                        (C * F + F) + (F * C + C);
        n = L * layer + 2 * C + (with_head ? V * C : 0);
    } else {
        const ts_model_config *c = &b->qwen3;
        L = c->layers, H = c->heads, D = c->head_dim, V = c->vocab;
        C = c->hidden, F = c->intermediate;
        int64_t layer =
            C * H * D * 2 + C * c->kv_heads * D * 2 + 3 * C * F + 2 * D + 2 * C;
        n = L * layer + C + V * C; /* the untied head counts either way */
    }
    return ts_train_flops_per_token(n, L, H, D, b->T);
}

/* ---- one Tessera trainer ---- */

typedef struct {
    const bench_model *b;
    ts_ctx *ctx;
    ts_decoder *q;
    ts_adamw *opt;
    ts_tensor *const *params;
    int n_params;
    ts_mode mode;
    int64_t *ids, *tg; /* B x T */
    uint64_t rng;
    double *times, loss, gnorm;
    /* forward + loss, backward, clip, AdamW, per timed step; compiled
     * mode only records until clip reads the norm back (a sync) */
    double *phase[4];
    uint64_t compiles_before_timing;
} trainer;

static uint64_t next_rand(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int64_t vocab(const bench_model *b) {
    return b->kind == GPT2 ? b->gpt2.vocab : b->qwen3.vocab;
}

static void trainer_init(trainer *t, const bench_model *b, ts_mode mode,
                         int steps) {
    memset(t, 0, sizeof *t);
    t->b = b, t->mode = mode, t->rng = 2;
    ts_ctx_options co = {.num_threads = g_threads};
    if (ts_ctx_new(&t->ctx, &co) != TS_OK)
        die(NULL, "context");
    ts_status s = ts_decoder_new(t->ctx, b->kind == GPT2 ? &b->gpt2 : &b->qwen3,
                                 NULL, 1, &t->q);
    if (s != TS_OK)
        die(t->ctx, "model");
    t->params = ts_decoder_params(t->q);
    t->n_params = ts_decoder_num_params(t->q);
    ts_adamw_options o = {.lr = LR,
                          .beta1 = 0.9,
                          .beta2 = 0.95,
                          .eps = 1e-8,
                          .weight_decay = 0.1};
    if (ts_adamw_new(t->ctx, t->params, t->n_params, &o, &t->opt) != TS_OK)
        die(t->ctx, "adamw");
    t->ids = malloc(sizeof(int64_t) * (size_t)(b->B * b->T));
    t->tg = malloc(sizeof(int64_t) * (size_t)(b->B * b->T));
    t->times = calloc((size_t)steps + 1, sizeof(double));
    for (int k = 0; k < 4; k++)
        t->phase[k] = calloc((size_t)steps + 1, sizeof(double));
    if (!t->ids || !t->tg || !t->times || !t->phase[0] || !t->phase[1] ||
        !t->phase[2] || !t->phase[3])
        die(NULL, "out of memory");
    ts_set_mode(t->ctx, mode);
}

static ts_tensor *model_loss(trainer *t, ts_tensor *ids, ts_tensor *tg) {
    return ts_decoder_loss(t->q, ids, tg, NULL);
}

/* train.c's train_step on a random batch; its time in seconds. In eager
 * mode the phases' times go to phase[k][slot]. */
static double trainer_step(trainer *t, int slot) {
    const bench_model *b = t->b;
    ts_ctx *ctx = t->ctx;
    int64_t n = b->B * b->T, V = vocab(b);
    for (int64_t i = 0; i < n; i++) /* a window of T + 1 tokens per row */
        t->ids[i] = (int64_t)(next_rand(&t->rng) % (uint64_t)V);
    for (int64_t i = 0; i < n; i++)
        t->tg[i] = (i + 1) % b->T ? t->ids[i + 1]
                                  : (int64_t)(next_rand(&t->rng) % (uint64_t)V);
    double t0 = now();
    ts_zero_grads(t->params, t->n_params);
    int64_t shape[2] = {b->B, b->T};
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, t->ids);
    ts_tensor *tg = ts_from_data(ctx, TS_I64, 2, shape, t->tg);
    ts_tensor *l = ids && tg ? model_loss(t, ids, tg) : NULL;
    ts_release(ids), ts_release(tg);
    double t1 = now();
    if (!l || ts_backward(l, NULL) != TS_OK)
        die(ctx, "forward/backward");
    ts_tensor *lv = ts_detach(l);
    ts_release(l); /* the activations die with the graph */
    double t2 = now();
    ts_adamw_set_lr(t->opt, LR);
    if (ts_adamw_step_clipped(t->opt, CLIP, &t->gnorm) != TS_OK)
        die(ctx, "clip and AdamW");
    double t3 = now();
    if (ts_sync(ctx) != TS_OK || ts_item(lv, &t->loss) != TS_OK)
        die(ctx, "sync");
    ts_release(lv);
    double t4 = now();
    if (slot >= 0) {
        t->phase[0][slot] = t1 - t0, t->phase[1][slot] = t2 - t1;
        t->phase[2][slot] = t3 - t2, t->phase[3][slot] = t4 - t3;
    }
    return t4 - t0;
}

static void trainer_free(trainer *t) {
    free(t->ids), free(t->tg), free(t->times);
    for (int k = 0; k < 4; k++)
        free(t->phase[k]);
    ts_adamw_free(t->opt);
    ts_decoder_free(t->q);
    ts_ctx_free(t->ctx); /* TS_PROFILE=1 prints its kernel times here */
}

/* ---- the PyTorch co-process ---- */

typedef struct {
    pid_t pid;
    FILE *to, *from;
    int64_t n_params;
} torch_proc;

static bool torch_start(torch_proc *p, const bench_model *b, bool small) {
    int in[2], out[2];
    if (pipe(in) || pipe(out))
        return false;
    char script[4096];
    snprintf(script, sizeof script, "%s/bench/train_torch.py", TS_SOURCE_DIR);
    p->pid = fork();
    if (p->pid < 0)
        return false;
    if (p->pid == 0) {
        dup2(in[0], 0), dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        char th[16];
        snprintf(th, sizeof th, "%d", g_threads);
        setenv("OMP_NUM_THREADS", th, 1);
        setenv("OPENBLAS_NUM_THREADS", th, 1);
        setenv("MKL_NUM_THREADS", th, 1);
        const char *argv[] = {"/usr/bin/python3",
                              script,
                              "--serve",
                              "--threads",
                              th,
                              "--model",
                              model_name(b),
                              small ? "--small" : NULL,
                              NULL};
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(in[0]), close(out[1]);
    p->to = fdopen(in[1], "w");
    p->from = fdopen(out[0], "r");
    char line[256];
    if (!p->to || !p->from || !fgets(line, sizeof line, p->from) ||
        sscanf(line, "ready %ld", &p->n_params) != 1) {
        fprintf(stderr, "bench_train: %s did not start\n", script);
        return false;
    }
    return true;
}

static double torch_step(torch_proc *p, double *loss) {
    char line[256];
    double s;
    fputs("step\n", p->to);
    fflush(p->to);
    if (!fgets(line, sizeof line, p->from) ||
        sscanf(line, "%lf %lf", &s, loss) != 2) {
        fprintf(stderr, "bench_train: the PyTorch step failed\n");
        exit(1);
    }
    return s;
}

static void torch_stop(torch_proc *p) {
    if (p->to) {
        fputs("quit\n", p->to);
        fclose(p->to);
    }
    if (p->from)
        fclose(p->from);
    if (p->pid > 0)
        waitpid(p->pid, NULL, 0);
}

/* ---- the run ---- */

typedef struct {
    int steps, warmup;
    bool torch, eager, small;
    bool eager_first; /* eager before compiled in each round */
} options;

typedef struct {
    double ms, tps, mfu, loss;
} figure;

static figure make_figure(const bench_model *b, double *times, int n,
                          double fpt, double peak, double loss) {
    figure f = {.ms = 1e3 * median(times, n), .loss = loss};
    f.tps = (double)(b->B * b->T) / (f.ms / 1e3);
    f.mfu = f.tps * fpt / peak;
    return f;
}

/* the best of reps 2048^3 sgemm runs now (the load of this moment) */
static double sgemm_now(int reps) {
    enum { N = 2048 };
    float *a = malloc(sizeof(float) * N * N),
          *b = malloc(sizeof(float) * N * N),
          *c = malloc(sizeof(float) * N * N);
    double best = 0;
    for (size_t i = 0; a && b && c && i < (size_t)N * N; i++)
        a[i] = (float)(i % 13) * 0.01f, b[i] = (float)(i % 7) * 0.02f;
    for (int r = 0; a && b && c && r < reps; r++) {
        double t = now();
        ts_sgemm(false, false, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
        t = now() - t;
        best = fmax(best, 2.0 * N * N * (double)N / t);
    }
    free(a), free(b), free(c);
    return best;
}

static bool run_model(const bench_model *b, const options *o, double peak) {
    int total = o->warmup + o->steps;
    trainer tc, te;
    trainer_init(&tc, b, TS_MODE_COMPILED, total);
    if (o->eager)
        trainer_init(&te, b, TS_MODE_EAGER, total);
    torch_proc tp = {0};
    bool torch = o->torch && torch_start(&tp, b, o->small);
    double *tt = calloc((size_t)total + 1, sizeof(double)), torch_loss = 0;
    double *sgemm = calloc((size_t)total + 1, sizeof(double));
    if (!tt || !sgemm)
        die(NULL, "out of memory");
    printf("\n%s: batch %lld x %lld = %lld tokens per step; %d warm-up "
           "steps (eager and PyTorch %d) + %d timed steps, taken in turn\n",
           model_name(b), (long long)b->B, (long long)b->T,
           (long long)(b->B * b->T), o->warmup,
           o->warmup > 1 ? o->warmup - 1 : o->warmup, o->steps);
    for (int s = 0; s < total; s++) {
        int slot = s - o->warmup; /* < 0 in the warm-up */
        /* the compiled step builds its last plan in its second step; eager
         * and PyTorch are warm after one, so they skip the first round */
        bool others = s >= (o->warmup > 1 ? 1 : 0);
        double et =
            o->eager && others && o->eager_first ? trainer_step(&te, slot) : 0;
        double ct = trainer_step(&tc, slot);
        if (o->eager && others && !o->eager_first)
            et = trainer_step(&te, slot);
        double pt = torch && others ? torch_step(&tp, &torch_loss) : 0;
        double sg = slot >= 0 ? sgemm_now(3) : 0;
        if (slot >= 0) {
            tc.times[slot] = ct, tt[slot] = pt, sgemm[slot] = sg;
            if (o->eager)
                te.times[slot] = et;
        }
        ts_compile_stats cs;
        ts_get_compile_stats(tc.ctx, &cs);
        fprintf(stderr,
                "  %s step %d%s: compiled %.0f ms (loss %.4f, gnorm %.3f, %llu "
                "plans so far)",
                model_name(b), s + 1, s < o->warmup ? " (warm-up)" : "",
                1e3 * ct, tc.loss, tc.gnorm,
                (unsigned long long)cs.compilations);
        if (o->eager && others)
            fprintf(stderr, "  eager %.0f ms (loss %.4f)", 1e3 * et, te.loss);
        if (torch && others)
            fprintf(stderr, "  torch %.0f ms (loss %.4f)", 1e3 * pt,
                    torch_loss);
        fputc('\n', stderr);
        if (s + 1 == o->warmup)
            tc.compiles_before_timing = cs.compilations;
    }
    /* unsorted copies: make_figure sorts the times */
    double tc_pair[64], te_pair[64], tt_pair[64];
    for (int k = 0; k < o->steps && k < 64; k++)
        tc_pair[k] = tc.times[k], te_pair[k] = o->eager ? te.times[k] : 0,
        tt_pair[k] = tt[k];
    int64_t n_all = 0;
    for (int i = 0; i < tc.n_params; i++)
        n_all += ts_tensor_numel(tc.params[i]);
    double fpt = flops_per_token(b, true), fpt0 = flops_per_token(b, false);
    figure fc = make_figure(b, tc.times, o->steps, fpt, peak, tc.loss);
    figure fe = o->eager
                    ? make_figure(b, te.times, o->steps, fpt, peak, te.loss)
                    : (figure){0};
    figure ft = torch ? make_figure(b, tt, o->steps, fpt, peak, torch_loss)
                      : (figure){0};
    double peak_now = median(sgemm, o->steps);
    ts_compile_stats cs;
    ts_get_compile_stats(tc.ctx, &cs);
    printf("  sgemm 2048 between the steps: %.1f GFLOP/s (median of the "
           "rounds' best of 3: the peak under this run's load, for MFU(now))\n",
           peak_now / 1e9);
    printf("  parameters: Tessera %lld, PyTorch %lld; %.1f MFLOP per token "
           "(6 N + 12 L H D T, N without the input embeddings, LM head "
           "counted); %.1f without any embedding matrix\n",
           (long long)n_all, (long long)tp.n_params, fpt / 1e6, fpt0 / 1e6);
    printf("  %-18s %10s %10s %8s %12s %11s\n", "", "ms/step", "tokens/s",
           "MFU", "MFU(now)", "last loss");
    const char *names[3] = {"Tessera compiled", "Tessera eager", "PyTorch"};
    figure *fs[3] = {&fc, o->eager ? &fe : NULL, torch ? &ft : NULL};
    for (int k = 0; k < 3; k++)
        if (fs[k])
            printf("  %-18s %10.1f %10.1f %7.1f%% %11.1f%% %11.4f\n", names[k],
                   fs[k]->ms, fs[k]->tps, 100 * fs[k]->mfu,
                   100 * fs[k]->mfu * peak / peak_now, fs[k]->loss);
    printf("  compiled: %llu plans built (%llu in the warm-up), %llu "
           "replayed; %llu graphs run\n",
           (unsigned long long)cs.compilations,
           (unsigned long long)tc.compiles_before_timing,
           (unsigned long long)cs.cache_hits,
           (unsigned long long)cs.graphs_run);
    bool met = true;
    if (torch) {
        /* the ratio of the medians, and the median of the ratios of steps
         * taken in the same round (the same load) */
        double *rs = malloc(sizeof(double) * (size_t)o->steps), *re = NULL;
        if (o->eager)
            re = malloc(sizeof(double) * (size_t)o->steps);
        if (!rs || (o->eager && !re))
            die(NULL, "out of memory");
        for (int k = 0; k < o->steps; k++) {
            rs[k] = tt_pair[k] / tc_pair[k];
            if (re)
                re[k] = tt_pair[k] / te_pair[k];
        }
        printf("  per-round ratios (median): compiled/torch %.2fx",
               median(rs, o->steps));
        if (re)
            printf(", eager/torch %.2fx", median(re, o->steps));
        printf("\n");
        free(rs), free(re);
        double r = fc.tps / ft.tps;
        bool ok_r = r >= 1.5, ok_m = fc.mfu >= 0.5;
        met = ok_r && ok_m;
        printf("  %s: compiled/torch tokens/s %.2fx (target >= 1.5: %s); "
               "eager/torch %.2fx; MFU %.1f%% (target >= 50%%: %s); torch "
               "MFU %.1f%%\n",
               model_name(b), r, ok_r ? "met" : "NOT met",
               o->eager ? fe.tps / ft.tps : 0, 100 * fc.mfu,
               ok_m ? "met" : "NOT met", 100 * ft.mfu);
    }
    for (int e = 0; e < 1 + o->eager; e++) {
        trainer *t = e ? &te : &tc;
        double ph[4], sum = 0;
        for (int k = 0; k < 4; k++)
            sum += ph[k] = median(t->phase[k], o->steps);
        printf("  %s step by phase (medians): forward+loss %.0f ms, "
               "backward %.0f ms, clip+AdamW %.0f ms, sync %.0f ms (sum "
               "%.0f)%s\n",
               e ? "eager" : "compiled", 1e3 * ph[0], 1e3 * ph[1], 1e3 * ph[2],
               1e3 * ph[3], 1e3 * sum,
               e ? "" : "; recorded, then run at the norm's read");
    }
    free(tt), free(sgemm);
    torch_stop(&tp);
    if (o->eager)
        trainer_free(&te);
    trainer_free(&tc);
    return met;
}

/* ---- --check DIR: one step of a checkpoint, figures for train_torch.py */

static void check_mode(const char *dir, ts_mode mode, const char *mname) {
    ts_ctx *ctx;
    ts_ctx_options co = {.num_threads = 2};
    if (ts_ctx_new(&ctx, &co) != TS_OK)
        die(NULL, "context");
    ts_decoder *m;
    if (ts_decoder_load(ctx, dir, &m) != TS_OK)
        die(ctx, dir);
    ts_tensor *const *params = ts_decoder_params(m);
    int n = ts_decoder_num_params(m);
    for (int i = 0; i < n; i++)
        ts_set_requires_grad(params[i], true);
    char path[4200];
    snprintf(path, sizeof path, "%s/batch.bin", dir);
    FILE *f = fopen(path, "rb");
    int64_t BT[2];
    if (!f || fread(BT, sizeof BT, 1, f) != 1 || BT[0] < 1 || BT[1] < 1 ||
        BT[1] > MAX_T)
        die(NULL, path);
    size_t k = (size_t)(BT[0] * BT[1]);
    int64_t *buf = malloc(sizeof(int64_t) * 2 * k);
    if (!buf || fread(buf, sizeof(int64_t), 2 * k, f) != 2 * k)
        die(NULL, path);
    fclose(f);
    ts_adamw_options o = {.lr = LR,
                          .beta1 = 0.9,
                          .beta2 = 0.95,
                          .eps = 1e-8,
                          .weight_decay = 0.1};
    ts_adamw *opt;
    if (ts_adamw_new(ctx, params, n, &o, &opt) != TS_OK)
        die(ctx, "adamw");
    ts_set_mode(ctx, mode);
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, BT, buf);
    ts_tensor *tg = ts_from_data(ctx, TS_I64, 2, BT, buf + k);
    ts_tensor *l = ts_decoder_loss(m, ids, tg, NULL);
    double loss, gnorm, loss2;
    if (!l || ts_backward(l, NULL) != TS_OK || ts_item(l, &loss) != TS_OK)
        die(ctx, "step");
    ts_release(l);
    printf("%s loss %.9g\n", mname, loss);
    /* the gradients before clipping, whole, for an element-wise check */
    const char **names = malloc(sizeof *names * (size_t)n);
    ts_tensor **grads = malloc(sizeof *grads * (size_t)n);
    if (!names || !grads)
        die(NULL, "out of memory");
    for (int i = 0; i < n; i++)
        names[i] = ts_decoder_param_name(m, i), grads[i] = ts_grad(params[i]);
    snprintf(path, sizeof path, "%s/grads_%s.safetensors", dir, mname);
    if (ts_safetensors_save(ctx, path, n, names, grads, 0, NULL) != TS_OK)
        die(ctx, path);
    free(names), free(grads);
    for (int i = 0; i < n; i++) { /* norms before clipping, in double */
        ts_tensor *g = ts_grad(params[i]);
        int64_t cnt = g ? ts_tensor_numel(g) : 0;
        float *h = malloc(sizeof(float) * (size_t)(cnt ? cnt : 1));
        if (!g || !h || ts_tensor_read(g, h, TS_F32) != TS_OK)
            die(ctx, ts_decoder_param_name(m, i));
        double ss = 0;
        for (int64_t j = 0; j < cnt; j++)
            ss += (double)h[j] * h[j];
        free(h);
        printf("%s grad %s %.9g\n", mname, ts_decoder_param_name(m, i),
               sqrt(ss));
    }
    if (ts_adamw_step_clipped(opt, CLIP, &gnorm) != TS_OK ||
        ts_sync(ctx) != TS_OK)
        die(ctx, "clip/adamw");
    printf("%s gnorm %.9g\n", mname, gnorm);
    bool old = ts_set_grad_enabled(ctx, false);
    l = ts_decoder_loss(m, ids, tg, NULL);
    if (!l || ts_item(l, &loss2) != TS_OK)
        die(ctx, "loss after the step");
    ts_set_grad_enabled(ctx, old);
    printf("%s loss2 %.9g\n", mname, loss2);
    ts_release(l), ts_release(ids), ts_release(tg);
    free(buf);
    ts_adamw_free(opt);
    ts_decoder_free(m);
    ts_ctx_free(ctx);
}

int main(int argc, char **argv) {
    options o = {.steps = 3, .warmup = 2, .torch = true, .eager = true};
    const char *which = "all";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            o.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            o.warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            which = argv[++i];
        else if (!strcmp(argv[i], "--no-torch"))
            o.torch = false;
        else if (!strcmp(argv[i], "--no-eager"))
            o.eager = false;
        else if (!strcmp(argv[i], "--small"))
            o.small = true;
        else if (!strcmp(argv[i], "--eager-first"))
            o.eager_first = true;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            g_threads = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 2;
        else if (!strcmp(argv[i], "--check") && i + 1 < argc) {
            check_mode(argv[i + 1], TS_MODE_EAGER, "eager");
            check_mode(argv[i + 1], TS_MODE_COMPILED, "compiled");
            return 0;
        } else {
            fprintf(stderr,
                    "usage: bench_train [--model gpt2|qwen3|all] [--steps N] "
                    "[--warmup N] [--no-torch] [--no-eager] [--small] "
                    "[--eager-first] [--threads N]\n"
                    "       bench_train --check DIR\n");
            return 2;
        }
    }
    if (strcmp(which, "all") && strcmp(which, "gpt2") && strcmp(which, "qwen3"))
        return fprintf(stderr, "bench_train: --model gpt2, qwen3 or all\n"), 2;
    if (o.steps < 1 || o.steps > 64)
        o.steps = o.steps < 1 ? 1 : 64;
    if (o.warmup < 0)
        o.warmup = 0;
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0); /* in order with the steps on stderr */
    ts_ctx *ctx;
    ts_ctx_options co = {.num_threads = g_threads};
    if (ts_ctx_new(&ctx, &co) != TS_OK) /* sets the pool's thread count */
        die(NULL, "context");
    ts_peak_info pk;
    if (ts_peak_measure(ctx, false, &pk) != TS_OK)
        die(ctx, "peak");
    double peak = pk.hardware, peak_now = sgemm_now(3);
    ts_ctx_free(ctx);
    double load[3] = {0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
            load[0] = load[1] = load[2] = -1;
        fclose(la);
    }
    printf("bench_train: f32, %d threads; hardware peak %.1f GFLOP/s (%d "
           "cores x %.2f GHz x %d FLOP/cycle, %s, %s); sgemm 2048 now %.1f "
           "GFLOP/s (achievable); load average %.2f %.2f %.2f\n",
           g_threads, peak / 1e9, pk.cores, pk.clock_hz / 1e9,
           (int)pk.flops_per_cycle, pk.isa, pk.cpu, peak_now / 1e9, load[0],
           load[1], load[2]);
    bool met = true;
    if (!strcmp(which, "all") || !strcmp(which, "gpt2")) {
        bench_model b = gpt2_model(o.small);
        met &= run_model(&b, &o, peak);
    }
    if (!strcmp(which, "all") || !strcmp(which, "qwen3")) {
        bench_model b = qwen3_model(o.small);
        met &= run_model(&b, &o, peak);
    }
    if (o.torch)
        printf("\ntargets (>= 1.5x PyTorch tokens/s and MFU >= 50%%, "
               "compiled): %s\n",
               met ? "met" : "NOT met");
    return 0;
}
