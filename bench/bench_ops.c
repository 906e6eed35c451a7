/* bench_ops.c — op benchmarks of Tessera, each printed as a ratio against a
 * reference measured side by side in the same run (machines are noisy).
 *
 *   matmul     f32 N x N @ N x N, N = 512, 1024, 2048, in GFLOP/s:
 *              ts_matmul and ts_sgemm (the same OpenBLAS on the same
 *              thread pool, called directly) timed alternately rep by rep;
 * torch.matmul at the same thread count from bench/torch_ops.py. Target:
 * ts_matmul >= 95% of the BLAS called directly. attention  forward, B=1 H=16
 * KV=8 T=S=1024 D=128, causal and not: ts_attention against the straightforward
 * PyTorch implementation in bench/torch_ops.py (repeat_interleave, q @ k^T *
 * scale, masked_fill -inf, softmax, @ v). Target: faster than PyTorch (ratio
 * torch/tessera > 1). rmsnorm,   in GB/s of bytes moved = bytes read + bytes
 * written, against add        memcpy of the same number of bytes moved (memcpy
 * of n bytes moves 2n), arrays of 64 MiB each, past the 32 MiB L3. Target: >=
 * 70% of memcpy bandwidth.
 *
 * Every figure is the median of several reps after one warm-up rep; a timed
 * Tessera rep is the op plus the ts_release of its result.
 *
 * Usage: bench_ops [--quick] [--no-torch] [--threads N] [--reps N]
 *   --quick     small sizes, 1 rep: a smoke test that runs in seconds.
 *   --no-torch  skip the PyTorch figures.
 * Exit status: 0 when every op ran and its spot check passed (targets missed
 * are reported, not failed); 1 when an op failed or gave a wrong answer. */
#include "core/core.h"
#include "tessera.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef TS_SOURCE_DIR
#define TS_SOURCE_DIR "."
#endif
#define TORCH_SCRIPT TS_SOURCE_DIR "/bench/torch_ops.py"
#define PYTHON       "/usr/bin/python3"

#define MAX_REPS 64

typedef struct {
    bool quick;
    bool torch;
    int threads;
    int reps; /* 0: per-section default */
} opts;

static int g_failed; /* an op returned NULL or a wrong answer */

/* ---- helpers ------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *xs, int n) {
    double s[MAX_REPS * 2];
    if (n <= 0)
        return NAN;
    memcpy(s, xs, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    return (n % 2) ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static int reps_or(const opts *o, int dflt) {
    if (o->quick)
        return 1;
    int r = o->reps > 0 ? o->reps : dflt;
    return r > MAX_REPS ? MAX_REPS : r;
}

static const char *yes_no(bool met) {
    return met ? "yes" : "NO";
}

/* Reports a NULL from an op (with the context's message) and counts it. */
static bool op_ok(ts_ctx *ctx, const ts_tensor *t, const char *what) {
    if (t)
        return true;
    fprintf(stderr, "bench_ops: %s failed: %s: %s\n", what,
            ts_status_name(ts_ctx_status(ctx)), ts_errmsg(ctx));
    ts_clear_error(ctx);
    g_failed = 1;
    return false;
}

static void spot_fail(const char *what, const char *fmt, double a, double b) {
    fprintf(stderr, "bench_ops: %s: wrong result: ", what);
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    g_failed = 1;
}

/* Allocations that reached the system allocator so far (the rest were
 * served from Tessera's cache); printed per timed call, as a fresh block
 * costs page faults. */
static uint64_t sys_allocs(const ts_ctx *ctx) {
    ts_alloc_stats st;
    memset(&st, 0, sizeof st);
    ts_alloc_get_stats(ctx, &st);
    return st.system_allocs;
}

/* Contiguous f32 data of t (a new reference in *hold to release). */
static const float *f32_data(ts_tensor *t, ts_tensor **hold) {
    *hold = ts_contiguous(t);
    return *hold ? (const float *)ts_tensor_data(*hold) : NULL;
}

/* ---- torch_ops.py -------------------------------------------------------- */

typedef struct {
    bool ok;
    char version[64];
    int threads;
    int n_mm;
    int mm_n[8];
    double mm_sec[8];
    double attn_causal_sec, attn_noncausal_sec;
} torch_res;

/* Single-quotes s for the shell. */
static void shell_quote(char *dst, size_t cap, const char *s) {
    size_t j = 0;
    if (j + 1 < cap)
        dst[j++] = '\'';
    for (; *s && j + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(dst + j, "'\\''", 4);
            j += 4;
        } else {
            dst[j++] = *s;
        }
    }
    if (j + 1 < cap)
        dst[j++] = '\'';
    dst[j] = '\0';
}

/* Runs torch_ops.py with args and parses what it prints. */
static void run_torch(const opts *o, const char *args, torch_res *r) {
    char script[1024], cmd[2048], line[512];
    memset(r, 0, sizeof *r);
    r->attn_causal_sec = r->attn_noncausal_sec = NAN;
    if (!o->torch)
        return;
    shell_quote(script, sizeof script, TORCH_SCRIPT);
    snprintf(cmd, sizeof cmd, "%s %s --threads %d %s", PYTHON, script,
             o->threads, args);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "bench_ops: cannot start %s\n", PYTHON);
        return;
    }
    while (fgets(line, sizeof line, p)) {
        int n;
        double sec, gf;
        char mode[32];
        if (sscanf(line, "torch %63s", r->version) == 1)
            continue;
        if (sscanf(line, "threads %d", &r->threads) == 1)
            continue;
        if (sscanf(line, "matmul %d %lf %lf", &n, &sec, &gf) == 3 &&
            r->n_mm < 8) {
            r->mm_n[r->n_mm] = n;
            r->mm_sec[r->n_mm++] = sec;
            continue;
        }
        if (sscanf(line, "attn %31s %lf", mode, &sec) == 2) {
            if (strcmp(mode, "causal") == 0)
                r->attn_causal_sec = sec;
            if (strcmp(mode, "noncausal") == 0)
                r->attn_noncausal_sec = sec;
        }
    }
    int st = pclose(p);
    r->ok = (st == 0 && r->version[0]);
    if (!r->ok)
        fprintf(stderr,
                "bench_ops: %s failed (status %d); PyTorch figures left "
                "out\n",
                TORCH_SCRIPT, st);
}

/* ---- matmul -------------------------------------------------------------- */

typedef struct {
    int n;
    double ts_gflops, blas_gflops, torch_gflops;
} mm_res;

static void bench_matmul(ts_ctx *ctx, const opts *o, const int *sizes,
                         int nsizes, mm_res *out) {
    torch_res tr;
    char args[256];
    int len = snprintf(args, sizeof args, "--reps %d --matmul ", reps_or(o, 9));
    for (int i = 0; i < nsizes; i++)
        len += snprintf(args + len, sizeof args - (size_t)len, "%s%d",
                        i ? "," : "", sizes[i]);
    run_torch(o, args, &tr);

    printf("\n== matmul f32: (N,N) @ (N,N), GFLOP/s = 2*N^3 / time ==\n");
    printf("ts_matmul and ts_sgemm (OpenBLAS on the pool, called directly) "
           "alternate "
           "rep by rep; torch.matmul at %d threads%s\n",
           o->threads, tr.ok ? "" : " (not run)");
    printf("%6s %12s %12s %9s %12s %10s  %-22s %s\n", "N", "tessera", "BLAS",
           "ts/BLAS", "torch", "ts/torch", "target ts/BLAS >= 0.95",
           "sys allocs/call");

    for (int si = 0; si < nsizes; si++) {
        int n = sizes[si];
        int64_t shape[2] = {n, n};
        mm_res *m = &out[si];
        m->n = n;
        m->ts_gflops = m->blas_gflops = m->torch_gflops = NAN;
        ts_tensor *a = ts_randn(ctx, TS_F32, 2, shape, 1.0, 11 + (uint64_t)n);
        ts_tensor *b = ts_randn(ctx, TS_F32, 2, shape, 1.0, 12 + (uint64_t)n);
        float *c = malloc((size_t)n * (size_t)n * sizeof(float));
        if (!op_ok(ctx, a, "ts_randn") || !op_ok(ctx, b, "ts_randn") || !c) {
            ts_release(a);
            ts_release(b);
            free(c);
            continue;
        }
        const float *pa = ts_tensor_data(a), *pb = ts_tensor_data(b);

        /* Spot check: ts_matmul against the BLAS, once. */
        ts_sgemm(false, false, n, n, n, 1.0f, pa, n, pb, n, 0.0f, c, n);
        ts_tensor *ct = ts_matmul(a, b), *hold = NULL;
        if (!op_ok(ctx, ct, "ts_matmul")) {
            ts_release(a);
            ts_release(b);
            free(c);
            continue;
        }
        const float *pc = f32_data(ct, &hold);
        double maxdiff = 0, maxabs = 0;
        for (size_t i = 0; pc && i < (size_t)n * (size_t)n; i++) {
            double d = fabs((double)pc[i] - (double)c[i]);
            if (!(d <= maxdiff))
                maxdiff = d; /* catches NaN */
            if (fabs((double)c[i]) > maxabs)
                maxabs = fabs((double)c[i]);
        }
        if (!pc || ts_tensor_dim(ct, 0) != n || ts_tensor_dim(ct, 1) != n ||
            !(maxdiff <= 1e-4 * maxabs + 1e-4))
            spot_fail("ts_matmul", "max |ts - BLAS| %g (max |BLAS| %g)",
                      maxdiff, maxabs);
        ts_release(hold);
        ts_release(ct);

        int reps = reps_or(o, n <= 512 ? 31 : n <= 1024 ? 15 : 9);
        double tts[MAX_REPS], tbl[MAX_REPS];
        uint64_t sys0 = sys_allocs(ctx);
        for (int r = -1; r < reps; r++) { /* r == -1: warm-up */
            for (int k = 0; k < 2; k++) {
                bool ts_turn = ((r & 1) == 0) == (k == 0); /* swap order */
                double t0 = now_s();
                if (ts_turn) {
                    ts_tensor *y = ts_matmul(a, b);
                    ts_release(y);
                    if (!y)
                        g_failed = 1;
                } else {
                    ts_sgemm(false, false, n, n, n, 1.0f, pa, n, pb, n, 0.0f, c,
                             n);
                }
                double dt = now_s() - t0;
                if (r >= 0)
                    (ts_turn ? tts : tbl)[r] = dt;
            }
        }
        double allocs = (double)(sys_allocs(ctx) - sys0) / (reps + 1);
        double flop = 2.0 * (double)n * (double)n * (double)n;
        m->ts_gflops = flop / median(tts, reps) / 1e9;
        m->blas_gflops = flop / median(tbl, reps) / 1e9;
        for (int i = 0; i < tr.n_mm; i++)
            if (tr.ok && tr.mm_n[i] == n)
                m->torch_gflops = flop / tr.mm_sec[i] / 1e9;
        double ratio = m->ts_gflops / m->blas_gflops;
        printf("%6d %12.1f %12.1f %9.3f %12.1f %10.3f  %-22s %.2f\n", n,
               m->ts_gflops, m->blas_gflops, ratio, m->torch_gflops,
               m->ts_gflops / m->torch_gflops, yes_no(ratio >= 0.95), allocs);
        fflush(stdout);
        ts_release(a);
        ts_release(b);
        free(c);
    }
}

/* ---- attention ----------------------------------------------------------- */

typedef struct {
    double ts_causal, ts_noncausal;       /* seconds */
    double torch_causal, torch_noncausal; /* seconds */
} attn_res;

/* Checks a few output rows of ts_attention against a double-precision
 * reference computed here. */
static void attn_check(ts_tensor *q, ts_tensor *k, ts_tensor *v, ts_tensor *o,
                       bool causal, int B, int H, int KV, int T, int D) {
    ts_tensor *hq, *hk, *hv, *ho;
    const float *pq = f32_data(q, &hq), *pk = f32_data(k, &hk),
                *pv = f32_data(v, &hv), *po = f32_data(o, &ho);
    const int S = T;
    double *w = malloc((size_t)S * sizeof(double));
    const char *what = causal ? "ts_attention (causal)" : "ts_attention";
    if (!pq || !pk || !pv || !po || !w) {
        spot_fail(what, "cannot read tensors (%g %g)", 0, 0);
        goto done;
    }
    if (ts_tensor_ndim(o) != 4 || ts_tensor_dim(o, 0) != B ||
        ts_tensor_dim(o, 1) != H || ts_tensor_dim(o, 2) != T ||
        ts_tensor_dim(o, 3) != D) {
        spot_fail(what, "wrong output shape (ndim %g, T %g)",
                  (double)ts_tensor_ndim(o), (double)ts_tensor_dim(o, 2));
        goto done;
    }
    const int heads[3] = {0, H / 2 + 1 < H ? H / 2 + 1 : 0, H - 1};
    const int rows[4] = {0, 1, T / 2 + 3 < T ? T / 2 + 3 : 0, T - 1};
    const double scale = 1.0 / sqrt((double)D);
    double maxdiff = 0;
    for (int bi = 0; bi < B; bi++)
        for (int hi = 0; hi < 3; hi++)
            for (int ri = 0; ri < 4; ri++) {
                int h = heads[hi], t = rows[ri], kvh = h / (H / KV);
                int smax = causal ? t + (S - T) : S - 1;
                const float *qr = pq + (((size_t)bi * H + h) * T + t) * D;
                const float *kb = pk + ((size_t)bi * KV + kvh) * S * D;
                const float *vb = pv + ((size_t)bi * KV + kvh) * S * D;
                double mx = -INFINITY, sum = 0;
                for (int s = 0; s <= smax; s++) {
                    double acc = 0;
                    for (int d = 0; d < D; d++)
                        acc += (double)qr[d] * kb[(size_t)s * D + d];
                    w[s] = acc * scale;
                    if (w[s] > mx)
                        mx = w[s];
                }
                for (int s = 0; s <= smax; s++)
                    sum += (w[s] = exp(w[s] - mx));
                const float *orow = po + (((size_t)bi * H + h) * T + t) * D;
                for (int d = 0; d < D; d++) {
                    double acc = 0;
                    for (int s = 0; s <= smax; s++)
                        acc += w[s] * vb[(size_t)s * D + d];
                    double diff = fabs(acc / sum - (double)orow[d]);
                    if (!(diff <= maxdiff))
                        maxdiff = diff;
                }
            }
    if (!(maxdiff <= 1e-3))
        spot_fail(what, "max |ts - reference| %g over %g sampled rows", maxdiff,
                  (double)(B * 3 * 4));
done:
    free(w);
    ts_release(hq);
    ts_release(hk);
    ts_release(hv);
    ts_release(ho);
}

/* Times ts_attention causal and non-causal alternately, reps times each,
 * appending to tc and tn. */
static void attn_time(ts_tensor *q, ts_tensor *k, ts_tensor *v, int reps,
                      double *tc, double *tn) {
    for (int r = 0; r < reps; r++) {
        for (int causal = 1; causal >= 0; causal--) {
            double t0 = now_s();
            ts_tensor *y = ts_attention(q, k, v, NULL, causal, 0.0);
            ts_release(y);
            double dt = now_s() - t0;
            if (!y)
                g_failed = 1;
            (causal ? tc : tn)[r] = dt;
        }
    }
}

static void bench_attention(ts_ctx *ctx, const opts *o, int B, int H, int KV,
                            int T, int D, attn_res *res) {
    int64_t sq[4] = {B, H, T, D}, skv[4] = {B, KV, T, D};
    res->ts_causal = res->ts_noncausal = NAN;
    res->torch_causal = res->torch_noncausal = NAN;
    printf("\n== attention forward: B=%d H=%d KV=%d T=S=%d D=%d, f32 ==\n", B,
           H, KV, T, D);
    printf(
        "ts_attention(q, k, v, NULL, causal, 0) against PyTorch: "
        "repeat_interleave k,v; q@k^T*scale; masked_fill -inf; softmax; @v\n");
    ts_tensor *q = ts_randn(ctx, TS_F32, 4, sq, 1.0, 21);
    ts_tensor *k = ts_randn(ctx, TS_F32, 4, skv, 1.0, 22);
    ts_tensor *v = ts_randn(ctx, TS_F32, 4, skv, 1.0, 23);
    if (!op_ok(ctx, q, "ts_randn") || !op_ok(ctx, k, "ts_randn") ||
        !op_ok(ctx, v, "ts_randn"))
        goto done;

    for (int causal = 1; causal >= 0; causal--) {
        ts_tensor *y = ts_attention(q, k, v, NULL, causal, 0.0);
        if (!op_ok(ctx, y, causal ? "ts_attention (causal)" : "ts_attention"))
            goto done;
        attn_check(q, k, v, y, causal, B, H, KV, T, D);
        ts_release(y);
    }

    /* Ours in two halves around the PyTorch run, so that a slow spell of
     * the machine weighs on both sides alike. */
    int reps = reps_or(o, 9);
    int h1 = (reps + 1) / 2, h2 = reps - h1;
    double tc[MAX_REPS], tn[MAX_REPS];
    attn_time(q, k, v, 1, tc, tn); /* warm-up */
    attn_time(q, k, v, h1, tc, tn);
    torch_res tr;
    char args[128];
    snprintf(args, sizeof args, "--reps %d --attn %d,%d,%d,%d,%d", reps, B, H,
             KV, T, D);
    run_torch(o, args, &tr);
    if (h2 > 0) {
        attn_time(q, k, v, 1, tc + h1, tn + h1); /* warm-up again */
        attn_time(q, k, v, h2, tc + h1, tn + h1);
    }
    res->ts_causal = median(tc, reps);
    res->ts_noncausal = median(tn, reps);
    if (tr.ok) {
        res->torch_causal = tr.attn_causal_sec;
        res->torch_noncausal = tr.attn_noncausal_sec;
    }
    /* FLOPs of the two products; causal counts only the keys seen. */
    double full = 4.0 * B * H * (double)T * T * D;
    double tri = 4.0 * B * H * ((double)T * (T + 1) / 2.0) * D;
    printf("%-11s %12s %12s %12s %12s %12s  %s\n", "mode", "tessera ms",
           "tessera GF/s", "torch ms", "torch GF/s", "torch/ts",
           "target torch/ts > 1");
    for (int causal = 1; causal >= 0; causal--) {
        double ts = causal ? res->ts_causal : res->ts_noncausal;
        double th = causal ? res->torch_causal : res->torch_noncausal;
        double fl = causal ? tri : full;
        printf("%-11s %12.2f %12.1f %12.2f %12.1f %12.3f  %s\n",
               causal ? "causal" : "non-causal", ts * 1e3, fl / ts / 1e9,
               th * 1e3, fl / th / 1e9, th / ts,
               tr.ok ? yes_no(th / ts > 1.0) : "n/a");
    }
    fflush(stdout);
done:
    ts_release(q);
    ts_release(k);
    ts_release(v);
}

/* ---- bandwidth: rmsnorm, add, memcpy ------------------------------------- */

typedef struct {
    char *dst;
    const char *src;
    size_t n;
} cpy_job;

static void *cpy_worker(void *arg) {
    cpy_job *j = arg;
    memcpy(j->dst, j->src, j->n);
    return NULL;
}

/* memcpy split over two threads (information only). */
static void memcpy2(char *dst, const char *src, size_t n) {
    size_t half = (n / 2) & ~(size_t)63;
    cpy_job j = {dst + half, src + half, n - half};
    pthread_t th;
    if (pthread_create(&th, NULL, cpy_worker, &j) != 0) {
        memcpy(dst, src, n);
        return;
    }
    memcpy(dst, src, half);
    pthread_join(th, NULL);
}

typedef struct {
    double op_gbs, cpy_gbs, cpy2_gbs;
    double allocs; /* system allocations per op call */
} bw_res;

/* Times op (a closure over x, y) against memcpy of cpy_bytes (= half the
 * bytes the op moves), alternating rep by rep. */
typedef ts_tensor *(*bw_op)(ts_tensor *x, ts_tensor *y);
static ts_tensor *op_rmsnorm(ts_tensor *x, ts_tensor *w) {
    return ts_rmsnorm(x, w, 1e-6);
}
static ts_tensor *op_add(ts_tensor *a, ts_tensor *b) {
    return ts_add(a, b);
}

static bw_res bw_time(bw_op op, ts_tensor *x, ts_tensor *y, double moved,
                      char *dst, const char *src, size_t cpy_bytes, int reps) {
    double to[MAX_REPS], tc[MAX_REPS], tc2[MAX_REPS];
    uint64_t sys0 = sys_allocs(ts_tensor_ctx(x));
    for (int r = -1; r < reps; r++) {
        double t0 = now_s();
        ts_tensor *z = op(x, y);
        ts_release(z);
        double t1 = now_s();
        memcpy(dst, src, cpy_bytes);
        double t2 = now_s();
        memcpy2(dst, src, cpy_bytes);
        double t3 = now_s();
        if (!z)
            g_failed = 1;
        if (r >= 0) {
            to[r] = t1 - t0;
            tc[r] = t2 - t1;
            tc2[r] = t3 - t2;
        }
    }
    bw_res b;
    b.allocs = (double)(sys_allocs(ts_tensor_ctx(x)) - sys0) / (reps + 1);
    b.op_gbs = moved / median(to, reps) / 1e9;
    b.cpy_gbs = 2.0 * (double)cpy_bytes / median(tc, reps) / 1e9;
    b.cpy2_gbs = 2.0 * (double)cpy_bytes / median(tc2, reps) / 1e9;
    return b;
}

static void bench_bandwidth(ts_ctx *ctx, const opts *o, int64_t rows,
                            int64_t cols, bw_res *rms, bw_res *add) {
    const size_t arr = (size_t)rows * (size_t)cols * sizeof(float);
    const double mib = 1024.0 * 1024.0;
    int64_t shape[2] = {rows, cols}, wshape[1] = {cols};
    *rms = *add = (bw_res){NAN, NAN, NAN, NAN};
    printf("\n== bandwidth: f32 (%lld, %lld), %.0f MiB per array; GB/s = "
           "(bytes read + bytes written) / time / 1e9 ==\n",
           (long long)rows, (long long)cols, (double)arr / mib);
    printf("rmsnorm moves x in + y out (+ weight); add moves a, b in + c out. "
           "memcpy of n bytes moves 2n (read n, write n); the reference\n"
           "memcpy moves the same bytes as the op: n = %.0f MiB for rmsnorm, "
           "%.0f MiB for add. memcpy is one call (1 thread); 'memcpy x2' "
           "splits it over 2 threads (info).\n",
           (double)arr / mib, 1.5 * (double)arr / mib);

    ts_tensor *x = ts_rand(ctx, TS_F32, 2, shape, -1.0, 1.0, 31);
    ts_tensor *b = ts_rand(ctx, TS_F32, 2, shape, -1.0, 1.0, 32);
    ts_tensor *w = ts_rand(ctx, TS_F32, 1, wshape, 0.5, 1.5, 33);
    size_t cpy_max = arr + arr / 2;
    char *src = malloc(cpy_max), *dst = malloc(cpy_max);
    if (!op_ok(ctx, x, "ts_rand") || !op_ok(ctx, b, "ts_rand") ||
        !op_ok(ctx, w, "ts_rand") || !src || !dst)
        goto done;
    memset(src, 1, cpy_max); /* fault the pages in */
    memset(dst, 2, cpy_max);
    const float *px = ts_tensor_data(x), *pb = ts_tensor_data(b),
                *pw = ts_tensor_data(w);

    /* Spot checks. */
    {
        ts_tensor *y = ts_rmsnorm(x, w, 1e-6), *hold = NULL;
        if (op_ok(ctx, y, "ts_rmsnorm")) {
            const float *py = f32_data(y, &hold);
            double maxdiff = py ? 0 : INFINITY;
            int64_t check_rows[3] = {0, rows / 2, rows - 1};
            for (int ri = 0; py && ri < 3; ri++) {
                const float *xr = px + check_rows[ri] * cols;
                double ss = 0;
                for (int64_t c = 0; c < cols; c++)
                    ss += (double)xr[c] * xr[c];
                double inv = 1.0 / sqrt(ss / (double)cols + 1e-6);
                for (int64_t c = 0; c < cols; c++) {
                    double d = fabs(xr[c] * inv * pw[c] -
                                    (double)py[check_rows[ri] * cols + c]);
                    if (!(d <= maxdiff))
                        maxdiff = d;
                }
            }
            if (!(maxdiff <= 1e-4))
                spot_fail("ts_rmsnorm", "max |ts - reference| %g (%g)", maxdiff,
                          0);
            ts_release(hold);
            ts_release(y);
        }
        ts_tensor *z = ts_add(x, b);
        hold = NULL;
        if (op_ok(ctx, z, "ts_add")) {
            const float *pz = f32_data(z, &hold);
            size_t bad = pz ? 0 : 1;
            for (size_t i = 0; pz && i < (size_t)rows * (size_t)cols; i++)
                if (pz[i] != px[i] + pb[i])
                    bad++;
            if (bad)
                spot_fail("ts_add", "%g of %g elements differ", (double)bad,
                          (double)rows * (double)cols);
            ts_release(hold);
            ts_release(z);
        }
    }

    int reps = reps_or(o, 21);
    *rms = bw_time(op_rmsnorm, x, w, 2.0 * (double)arr + (double)cols * 4, dst,
                   src, arr, reps);
    *add = bw_time(op_add, x, b, 3.0 * (double)arr, dst, src, cpy_max, reps);

    printf("%-8s %10s %10s %12s %9s %14s  %-24s %s\n", "op", "MiB moved",
           "op GB/s", "memcpy GB/s", "op/memcpy", "memcpy x2 GB/s",
           "target op/memcpy >= 0.70", "sys allocs/call");
    printf("%-8s %10.0f %10.1f %12.1f %9.3f %14.1f  %-24s %.2f\n", "rmsnorm",
           2.0 * (double)arr / mib, rms->op_gbs, rms->cpy_gbs,
           rms->op_gbs / rms->cpy_gbs, rms->cpy2_gbs,
           yes_no(rms->op_gbs / rms->cpy_gbs >= 0.70), rms->allocs);
    printf("%-8s %10.0f %10.1f %12.1f %9.3f %14.1f  %-24s %.2f\n", "add",
           3.0 * (double)arr / mib, add->op_gbs, add->cpy_gbs,
           add->op_gbs / add->cpy_gbs, add->cpy2_gbs,
           yes_no(add->op_gbs / add->cpy_gbs >= 0.70), add->allocs);
    fflush(stdout);
done:
    free(src);
    free(dst);
    ts_release(x);
    ts_release(b);
    ts_release(w);
}

/* ---- main ---------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f, "usage: bench_ops [--quick] [--no-torch] [--threads N] "
               "[--reps N]\n");
}

int main(int argc, char **argv) {
    opts o = {.quick = false, .torch = true, .threads = 2, .reps = 0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            o.quick = true;
        } else if (strcmp(argv[i], "--no-torch") == 0) {
            o.torch = false;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            o.threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            o.reps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--help") == 0 ||
                   strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (o.threads < 1)
        o.threads = 1;

    char nt[16];
    snprintf(nt, sizeof nt, "%d", o.threads);
    setenv("TS_NUM_THREADS", nt, 1);
    ts_ctx *ctx = NULL;
    ts_ctx_options copt = {.num_threads = o.threads, .no_alloc_cache = false};
    ts_status st = ts_ctx_new(&ctx, &copt);
    if (st != TS_OK || !ctx) {
        fprintf(stderr, "bench_ops: ts_ctx_new: %s\n", ts_status_name(st));
        return 1;
    }
    st = ts_set_num_threads(ctx, o.threads);
    if (st != TS_OK)
        fprintf(stderr, "bench_ops: ts_set_num_threads(%d): %s: %s\n",
                o.threads, ts_status_name(st), ts_errmsg(ctx));

    double t_start = now_s();
    printf("Tessera op benchmarks%s: threads %d (tessera's pool %d; OpenBLAS "
           "one thread a call on it); "
           "median of reps after a warm-up rep\n",
           o.quick ? " (--quick: small sizes, 1 rep)" : "", o.threads,
           ts_get_num_threads(ctx));
    printf("OpenBLAS: %s (core %s)\n", openblas_get_config(),
           openblas_get_corename());

    static const int mm_full[] = {512, 1024, 2048}, mm_quick[] = {64, 128};
    mm_res mm[3];
    int nmm = o.quick ? 2 : 3;
    bench_matmul(ctx, &o, o.quick ? mm_quick : mm_full, nmm, mm);

    attn_res at;
    if (o.quick)
        bench_attention(ctx, &o, 1, 4, 2, 64, 32, &at);
    else
        bench_attention(ctx, &o, 1, 16, 8, 1024, 128, &at);

    bw_res rms, add;
    /* 64 MiB per array in full (4096 x 4096 f32, past the 32 MiB L3). */
    bench_bandwidth(ctx, &o, o.quick ? 256 : 4096, o.quick ? 1024 : 4096, &rms,
                    &add);

    /* Summary of the targets. */
    int met = 0, total = 0;
    printf("\n== targets ==\n");
    for (int i = 0; i < nmm; i++) {
        double r = mm[i].ts_gflops / mm[i].blas_gflops;
        bool ok = r >= 0.95;
        met += ok;
        total++;
        printf("matmul %-5d ts/BLAS %.3f >= 0.95: %s\n", mm[i].n, r,
               yes_no(ok));
    }
    if (at.torch_causal == at.torch_causal) { /* not NaN */
        double r = at.torch_causal / at.ts_causal;
        met += r > 1.0;
        total++;
        printf("attention causal torch/ts %.3f > 1: %s\n", r, yes_no(r > 1.0));
    } else {
        printf("attention: no PyTorch figure\n");
    }
    double rr = rms.op_gbs / rms.cpy_gbs, ra = add.op_gbs / add.cpy_gbs;
    met += (rr >= 0.70) + (ra >= 0.70);
    total += 2;
    printf("rmsnorm op/memcpy %.3f >= 0.70: %s\n", rr, yes_no(rr >= 0.70));
    printf("add op/memcpy %.3f >= 0.70: %s\n", ra, yes_no(ra >= 0.70));
    printf("%d of %d targets met; %s; %.1f s\n", met, total,
           g_failed ? "SOME OPS FAILED (see stderr)" : "all spot checks passed",
           now_s() - t_start);

    ts_ctx_free(ctx);
    return g_failed ? 1 : 0;
}
