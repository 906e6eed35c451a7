/* mpi.c — tessera_dist.h over MPI. MPI is initialized only under an MPI
 * launcher (Open MPI's OMPI_COMM_WORLD_SIZE, or PMI/PMIx variables), so a
 * plain process never starts MPI's runtime. Errors return (MPI_ERRORS_
 * RETURN) and become the context's error with MPI's own message. Counts
 * beyond INT_MAX are sent in pieces. bf16 travels as 16-bit words with
 * user reduction ops that add (or compare) in f32. */
#define _GNU_SOURCE
#include "tessera_dist.h"

#include "core/core.h"

#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct ts_dist {
    ts_ctx *ctx;
    int rank, world, local_world;
    bool mpi; /* initialized here */
    MPI_Op bf16_sum, bf16_max;
    double seconds, bytes;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *t) {
    (void)t;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = ts_f32_to_bf16(ts_bf16_to_f32(a[i]) + ts_bf16_to_f32(b[i]));
}

static void bf16_max_fn(void *in, void *inout, int *len, MPI_Datatype *t) {
    (void)t;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        if (ts_bf16_to_f32(a[i]) > ts_bf16_to_f32(b[i]))
            b[i] = a[i];
}

static const char *env_any(const char *const *names) {
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v)
            return v;
    }
    return NULL;
}

static ts_status mpi_fail(ts_dist *d, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return ts_set_error(d->ctx, TS_ERR_IO, "%s (rank %d of %d): %s", what,
                        d->rank, d->world, msg);
}

ts_status ts_dist_init(ts_ctx *ctx, ts_dist **out) {
    if (!ctx || !out)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    ts_dist *d = calloc(1, sizeof *d);
    if (!d)
        return ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    d->ctx = ctx, d->world = 1, d->local_world = 1;
    static const char *const launched[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                                           "PMI_SIZE", NULL};
    if (env_any(launched)) {
        int inited = 0;
        MPI_Initialized(&inited);
        if (!inited) {
            int rc = MPI_Init(NULL, NULL);
            if (rc != MPI_SUCCESS) {
                free(d);
                return ts_set_error(ctx, TS_ERR_IO, "MPI_Init failed (%d)", rc);
            }
            d->mpi = true;
        }
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &d->world);
        MPI_Comm local;
        if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank,
                                MPI_INFO_NULL, &local) == MPI_SUCCESS) {
            MPI_Comm_size(local, &d->local_world);
            MPI_Comm_free(&local);
        }
        MPI_Op_create(bf16_sum_fn, 1, &d->bf16_sum);
        MPI_Op_create(bf16_max_fn, 1, &d->bf16_max);
    }
    /* the machine's cores shared by the ranks on it, unless chosen */
    static const char *const threads[] = {"TS_NUM_THREADS", "OMP_NUM_THREADS",
                                          NULL};
    if (d->local_world > 1 && !env_any(threads)) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int n = (int)(cores / d->local_world);
        ts_set_num_threads(ctx, n < 1 ? 1 : n);
    }
    *out = d;
    return TS_OK;
}

void ts_dist_free(ts_dist *d) {
    if (!d)
        return;
    if (d->world > 1 || d->mpi) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) {
            MPI_Op_free(&d->bf16_sum);
            MPI_Op_free(&d->bf16_max);
            if (d->mpi)
                MPI_Finalize();
        }
    }
    free(d);
}

int ts_dist_rank(const ts_dist *d) {
    return d ? d->rank : 0;
}
int ts_dist_world(const ts_dist *d) {
    return d ? d->world : 1;
}
int ts_dist_local_world(const ts_dist *d) {
    return d ? d->local_world : 1;
}
double ts_dist_comm_seconds(const ts_dist *d) {
    return d ? d->seconds : 0;
}
double ts_dist_comm_bytes(const ts_dist *d) {
    return d ? d->bytes : 0;
}

static ts_status check_dt(ts_dist *d, ts_dtype dt, const char *what) {
    if (dt != TS_F32 && dt != TS_BF16)
        return ts_set_error(d->ctx, TS_ERR_DTYPE,
                            "%s: f32 and bf16 buffers only", what);
    return TS_OK;
}

static MPI_Datatype mpi_type(ts_dtype dt) {
    return dt == TS_F32 ? MPI_FLOAT : MPI_UINT16_T;
}

static MPI_Op mpi_op(ts_dist *d, ts_dtype dt, ts_dist_op op) {
    if (dt == TS_F32)
        return op == TS_DIST_MAX ? MPI_MAX : MPI_SUM;
    return op == TS_DIST_MAX ? d->bf16_max : d->bf16_sum;
}

static void scale(void *buf, int64_t n, ts_dtype dt, double s) {
    if (dt == TS_F32) {
        float *f = buf, fs = (float)s;
        for (int64_t i = 0; i < n; i++)
            f[i] *= fs;
    } else {
        uint16_t *h = buf;
        for (int64_t i = 0; i < n; i++)
            h[i] = ts_f32_to_bf16((float)(ts_bf16_to_f32(h[i]) * s));
    }
}

#define PIECE ((int64_t)1 << 28) /* elements per MPI call at most */

ts_status ts_dist_all_reduce(ts_dist *d, void *buf, int64_t n, ts_dtype dt,
                             ts_dist_op op) {
    if (!d) /* no run: a world of one */
        return n >= 0 ? TS_OK : TS_ERR_INVALID_ARG;
    if (n < 0 || (n && !buf))
        return ts_set_error(d->ctx, TS_ERR_INVALID_ARG,
                            "all_reduce: %lld elements at %p", (long long)n,
                            buf);
    ts_status st = check_dt(d, dt, "all_reduce");
    if (st != TS_OK || d->world == 1 || n == 0)
        return st;
    double t0 = now_s();
    size_t es = ts_dtype_size(dt);
    for (int64_t at = 0; at < n; at += PIECE) {
        int k = (int)(n - at < PIECE ? n - at : PIECE);
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)at * es, k,
                               mpi_type(dt), mpi_op(d, dt, op), MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return mpi_fail(d, rc, "all_reduce");
    }
    if (op == TS_DIST_AVG)
        scale(buf, n, dt, 1.0 / d->world);
    d->seconds += now_s() - t0;
    d->bytes += 2.0 * (d->world - 1) / d->world * (double)n * (double)es;
    return TS_OK;
}

struct ts_dist_req {
    ts_dist *d;
    void *buf;
    int64_t n;
    ts_dtype dt;
    ts_dist_op op;
    int n_mpi; /* pieces in flight (0: nothing to wait for) */
    MPI_Request mpi[];
};

ts_status ts_dist_all_reduce_start(ts_dist *d, void *buf, int64_t n,
                                   ts_dtype dt, ts_dist_op op,
                                   ts_dist_req **req) {
    if (!req)
        return d ? ts_set_error(d->ctx, TS_ERR_INVALID_ARG,
                                "all_reduce_start: NULL request")
                 : TS_ERR_INVALID_ARG;
    *req = NULL;
    if (n < 0 || (n && !buf))
        return d ? ts_set_error(d->ctx, TS_ERR_INVALID_ARG,
                                "all_reduce_start: %lld elements at %p",
                                (long long)n, buf)
                 : TS_ERR_INVALID_ARG;
    ts_status st = d ? check_dt(d, dt, "all_reduce_start") : TS_OK;
    if (st != TS_OK)
        return st;
    bool comm = d && d->world > 1 && n > 0;
    int pieces = comm ? (int)((n + PIECE - 1) / PIECE) : 0;
    ts_dist_req *r =
        calloc(1, sizeof *r + sizeof(MPI_Request) * (size_t)pieces);
    if (!r)
        return d ? ts_set_error(d->ctx, TS_ERR_OOM,
                                "all_reduce_start: out of memory")
                 : TS_ERR_OOM;
    *r = (ts_dist_req){.d = d, .buf = buf, .n = n, .dt = dt, .op = op};
    *req = r;
    if (!comm)
        return TS_OK;
    double t0 = now_s();
    size_t es = ts_dtype_size(dt);
    for (int p = 0; p < pieces; p++) {
        int64_t at = (int64_t)p * PIECE;
        int k = (int)(n - at < PIECE ? n - at : PIECE);
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + (size_t)at * es, k,
                                mpi_type(dt), mpi_op(d, dt, op), MPI_COMM_WORLD,
                                &r->mpi[p]);
        if (rc != MPI_SUCCESS) {
            /* the other ranks may have started every piece: a failure to
             * start one is an MPI fault the run does not outlive (the
             * trainer's agree() then fails every rank that gets there) */
            r->n_mpi = p; /* wait for those started, report this one */
            st = mpi_fail(d, rc, "all_reduce_start");
            break;
        }
        r->n_mpi = p + 1;
    }
    d->seconds += now_s() - t0;
    d->bytes += 2.0 * (d->world - 1) / d->world * (double)n * (double)es;
    return st;
}

ts_status ts_dist_test(ts_dist_req *r, bool *done) {
    if (!r || !done)
        return TS_ERR_INVALID_ARG;
    *done = true;
    if (r->n_mpi == 0)
        return TS_OK;
    double t0 = now_s();
    int flag = 0;
    int rc = MPI_Testall(r->n_mpi, r->mpi, &flag, MPI_STATUSES_IGNORE);
    r->d->seconds += now_s() - t0;
    if (rc != MPI_SUCCESS)
        return mpi_fail(r->d, rc, "all_reduce (test)");
    *done = flag != 0;
    return TS_OK;
}

ts_status ts_dist_wait(ts_dist_req *r) {
    if (!r)
        return TS_OK;
    ts_status st = TS_OK;
    if (r->n_mpi > 0) {
        double t0 = now_s();
        int rc = MPI_Waitall(r->n_mpi, r->mpi, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(r->d, rc, "all_reduce (wait)");
        else if (r->op == TS_DIST_AVG)
            scale(r->buf, r->n, r->dt, 1.0 / r->d->world);
        r->d->seconds += now_s() - t0;
    }
    free(r);
    return st;
}

/* counts (or n_each) as MPI ints and displacements; false when too big */
static bool int_counts(const ts_dist *d, const int64_t *counts, int64_t n_each,
                       int *c, int *disp, int64_t *total) {
    int64_t at = 0;
    for (int r = 0; r < d->world; r++) {
        int64_t k = counts ? counts[r] : n_each;
        if (k < 0 || k > INT_MAX || at > INT_MAX)
            return false;
        c[r] = (int)k, disp[r] = (int)at;
        at += k;
    }
    *total = at;
    return at <= INT_MAX;
}

/* reduce-scatter and all-gather in a world of one: rank 0's part copied */
static ts_status solo_copy(const void *send, void *recv, const int64_t *counts,
                           int64_t n_each, ts_dtype dt) {
    int64_t k = counts ? counts[0] : n_each;
    if (k < 0 || (k && (!send || !recv)) || ts_dtype_size(dt) == 0)
        return TS_ERR_INVALID_ARG;
    if (k)
        memmove(recv, send, (size_t)k * ts_dtype_size(dt));
    return TS_OK;
}

ts_status ts_dist_reduce_scatter(ts_dist *d, const void *send, void *recv,
                                 const int64_t *counts, int64_t n_each,
                                 ts_dtype dt, ts_dist_op op) {
    if (!d) /* no run: a world of one, rank 0 keeps its part */
        return solo_copy(send, recv, counts, n_each, dt);
    if (!send || !recv)
        return ts_set_error(d->ctx, TS_ERR_INVALID_ARG,
                            "reduce_scatter: a NULL buffer");
    ts_status st = check_dt(d, dt, "reduce_scatter");
    if (st != TS_OK)
        return st;
    int *c = malloc(sizeof *c * (size_t)d->world * 2);
    if (!c)
        return ts_set_error(d->ctx, TS_ERR_OOM, "out of memory");
    int64_t total = 0;
    if (!int_counts(d, counts, n_each, c, c + d->world, &total)) {
        free(c);
        return ts_set_error(d->ctx, TS_ERR_INVALID_ARG,
                            "reduce_scatter: counts must be >= 0 and sum to "
                            "at most %d elements",
                            INT_MAX);
    }
    int mine = c[d->rank];
    size_t es = ts_dtype_size(dt);
    double t0 = now_s();
    if (d->world == 1)
        memmove(recv, send, (size_t)mine * es);
    else {
        int rc = MPI_Reduce_scatter(send, recv, c, mpi_type(dt),
                                    mpi_op(d, dt, op), MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) {
            free(c);
            return mpi_fail(d, rc, "reduce_scatter");
        }
        if (op == TS_DIST_AVG)
            scale(recv, mine, dt, 1.0 / d->world);
        d->bytes +=
            (double)(d->world - 1) / d->world * (double)total * (double)es;
    }
    d->seconds += now_s() - t0;
    free(c);
    return TS_OK;
}

ts_status ts_dist_all_gather(ts_dist *d, const void *send, void *recv,
                             const int64_t *counts, int64_t n_each,
                             ts_dtype dt) {
    if (!d) /* no run: a world of one */
        return solo_copy(send, recv, counts, n_each, dt);
    if (!send || !recv)
        return ts_set_error(d->ctx, TS_ERR_INVALID_ARG,
                            "all_gather: a NULL buffer");
    ts_status st = check_dt(d, dt, "all_gather");
    if (st != TS_OK)
        return st;
    int *c = malloc(sizeof *c * (size_t)d->world * 2);
    if (!c)
        return ts_set_error(d->ctx, TS_ERR_OOM, "out of memory");
    int64_t total = 0;
    if (!int_counts(d, counts, n_each, c, c + d->world, &total)) {
        free(c);
        return ts_set_error(d->ctx, TS_ERR_INVALID_ARG,
                            "all_gather: counts must be >= 0 and sum to at "
                            "most %d elements",
                            INT_MAX);
    }
    size_t es = ts_dtype_size(dt);
    double t0 = now_s();
    if (d->world == 1)
        memmove(recv, send, (size_t)c[0] * es);
    else {
        int rc = MPI_Allgatherv(send, c[d->rank], mpi_type(dt), recv, c,
                                c + d->world, mpi_type(dt), MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) {
            free(c);
            return mpi_fail(d, rc, "all_gather");
        }
        d->bytes +=
            (double)(d->world - 1) / d->world * (double)total * (double)es;
    }
    d->seconds += now_s() - t0;
    free(c);
    return TS_OK;
}

ts_status ts_dist_broadcast(ts_dist *d, void *buf, int64_t n, ts_dtype dt,
                            int root) {
    if (!d) /* no run: a world of one */
        return n >= 0 && root == 0 ? TS_OK : TS_ERR_INVALID_ARG;
    if (n < 0 || (n && !buf))
        return ts_set_error(d->ctx, TS_ERR_INVALID_ARG,
                            "broadcast: %lld elements at %p", (long long)n,
                            buf);
    ts_status st = check_dt(d, dt, "broadcast");
    if (st != TS_OK)
        return st;
    if (root < 0 || root >= d->world)
        return ts_set_error(d->ctx, TS_ERR_INVALID_ARG,
                            "broadcast: root %d is not a rank of %d", root,
                            d->world);
    if (d->world == 1 || n == 0)
        return TS_OK;
    double t0 = now_s();
    size_t es = ts_dtype_size(dt);
    for (int64_t at = 0; at < n; at += PIECE) {
        int k = (int)(n - at < PIECE ? n - at : PIECE);
        int rc = MPI_Bcast((char *)buf + (size_t)at * es, k, mpi_type(dt), root,
                           MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return mpi_fail(d, rc, "broadcast");
    }
    d->seconds += now_s() - t0;
    d->bytes += (double)n * (double)es;
    return TS_OK;
}

ts_status ts_dist_barrier(ts_dist *d) {
    if (!d || d->world == 1)
        return TS_OK;
    double t0 = now_s();
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    d->seconds += now_s() - t0;
    return rc == MPI_SUCCESS ? TS_OK : mpi_fail(d, rc, "barrier");
}
