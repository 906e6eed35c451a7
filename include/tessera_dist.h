/* tessera_dist.h — collectives between the processes of a distributed run
 * (src/dist), over MPI (Open MPI). A run started by `mpirun -np N tessera
 * …` has N ranks; a process started any other way is rank 0 of 1 and
 * never touches MPI, so the same binary and the same calls serve both.
 *
 * Buffers are host memory (the CPU device's tensors; an accelerator's are
 * staged through the host), f32 or bf16; bf16 sums are computed in f32 per
 * element and rounded once. Every call is collective: all ranks make it in
 * the same order with the same counts. Time spent inside the collectives
 * is accumulated for the communication share of a training step. */
#ifndef TESSERA_DIST_H
#define TESSERA_DIST_H

#include "tessera.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_dist ts_dist;

/* Joins the run: MPI_Init when launched by mpirun (its environment says
 * so), else a world of 1. The thread count of ctx is set to the cores per
 * local rank unless TS_NUM_THREADS or the context chose one. */
ts_status ts_dist_init(ts_ctx *ctx, ts_dist **out);
/* MPI_Finalize when it was initialized here. NULL is fine. */
void ts_dist_free(ts_dist *d);

int ts_dist_rank(const ts_dist *d);
int ts_dist_world(const ts_dist *d);
int ts_dist_local_world(const ts_dist *d); /* ranks on this machine */

typedef enum { TS_DIST_SUM, TS_DIST_AVG, TS_DIST_MAX } ts_dist_op;

/* A NULL ts_dist is a world of one: every collective is then a copy or
 * nothing. */

/* buf[n] reduced over the ranks, the result on every rank */
ts_status ts_dist_all_reduce(ts_dist *d, void *buf, int64_t n, ts_dtype dt,
                             ts_dist_op op);
/* The same without waiting (MPI_Iallreduce), to overlap with computation:
 * buf must stay untouched until ts_dist_wait(*req) has returned, and every
 * rank starts the same requests in the same order. MPI moves the data
 * when it is called, so call ts_dist_test now and then (e.g. as gradients
 * become ready) to let it progress. *req is set even in a world of one (a
 * request that is done at once). */
typedef struct ts_dist_req ts_dist_req;
ts_status ts_dist_all_reduce_start(ts_dist *d, void *buf, int64_t n,
                                   ts_dtype dt, ts_dist_op op,
                                   ts_dist_req **req);
/* *done: whether req has completed; progresses every pending request */
ts_status ts_dist_test(ts_dist_req *req, bool *done);
/* Waits for req, scales an average, frees req. NULL is fine. */
ts_status ts_dist_wait(ts_dist_req *req);
/* send[sum counts] reduced over the ranks; rank r receives its counts[r]
 * elements (the part of send after those of ranks < r) into recv. counts
 * NULL means n_each elements for every rank. */
ts_status ts_dist_reduce_scatter(ts_dist *d, const void *send, void *recv,
                                 const int64_t *counts, int64_t n_each,
                                 ts_dtype dt, ts_dist_op op);
/* every rank's counts[r] elements of send, concatenated in rank order into
 * recv on every rank; counts NULL: n_each each */
ts_status ts_dist_all_gather(ts_dist *d, const void *send, void *recv,
                             const int64_t *counts, int64_t n_each,
                             ts_dtype dt);
/* root's buf[n] to every rank */
ts_status ts_dist_broadcast(ts_dist *d, void *buf, int64_t n, ts_dtype dt,
                            int root);
ts_status ts_dist_barrier(ts_dist *d);

/* seconds spent in the collectives above, and bytes sent by this rank's
 * calls (the volume a ring algorithm would move), since the start */
double ts_dist_comm_seconds(const ts_dist *d);
double ts_dist_comm_bytes(const ts_dist *d);

#ifdef __cplusplus
}
#endif
#endif
