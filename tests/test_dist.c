/* test_dist.c — the collectives of tessera_dist.h against known answers.
 * Run as one process (a world of 1) and under `mpirun -np 2` (and more):
 * every rank checks what it receives; the exit status is nonzero on any
 * rank's failure. */
#include "tessera_dist.h"

#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint16_t bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static float unbf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int main(void) {
    ts_ctx *ctx = NULL;
    CHECK(ts_ctx_new(&ctx, NULL) == TS_OK);
    ts_dist *d = NULL;
    CHECK(ts_dist_init(ctx, &d) == TS_OK);
    int rank = ts_dist_rank(d), w = ts_dist_world(d);
    CHECK(rank >= 0 && rank < w);
    CHECK(ts_dist_local_world(d) >= 1 && ts_dist_local_world(d) <= w);

    /* all-reduce, f32: element i of rank r is i + 1000 r */
    enum { N = 1001 };
    float *f = malloc(sizeof *f * N);
    for (int op = 0; op < 3; op++) {
        for (int i = 0; i < N; i++)
            f[i] = (float)(i + 1000 * rank);
        CHECK(ts_dist_all_reduce(d, f, N, TS_F32, (ts_dist_op)op) == TS_OK);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            double sum = (double)i * w + 1000.0 * w * (w - 1) / 2;
            double want = op == TS_DIST_SUM   ? sum
                          : op == TS_DIST_AVG ? sum / w
                                              : i + 1000.0 * (w - 1);
            bad += fabs(f[i] - want) > 1e-6 * fabs(want) + 1e-6;
        }
        CHECK(bad == 0);
    }

    /* all-reduce, bf16: small integers add exactly */
    uint16_t *h = malloc(sizeof *h * N);
    for (int i = 0; i < N; i++)
        h[i] = bf((float)((i % 17) + rank));
    CHECK(ts_dist_all_reduce(d, h, N, TS_BF16, TS_DIST_SUM) == TS_OK);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += unbf(h[i]) != (float)((i % 17) * w + w * (w - 1) / 2);
    CHECK(bad == 0);
    for (int i = 0; i < N; i++)
        h[i] = bf((float)(rank == w - 1 ? 3 * i : i) / 8);
    CHECK(ts_dist_all_reduce(d, h, N, TS_BF16, TS_DIST_MAX) == TS_OK);
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += h[i] != bf((float)(3 * i) / 8) && w > 1;
    CHECK(bad == 0);

    /* three all-reduces in flight at once (f32 average, bf16 sum, an empty
     * one), tested while they run, waited for in another order */
    float *fa = malloc(sizeof *fa * N);
    uint16_t *hb = malloc(sizeof *hb * N);
    for (int i = 0; i < N; i++) {
        fa[i] = (float)(i + 1000 * rank);
        hb[i] = bf((float)((i % 5) + rank));
    }
    ts_dist_req *ra = NULL, *rb = NULL, *rc = NULL;
    CHECK(ts_dist_all_reduce_start(d, fa, N, TS_F32, TS_DIST_AVG, &ra) ==
          TS_OK);
    CHECK(ts_dist_all_reduce_start(d, hb, N, TS_BF16, TS_DIST_SUM, &rb) ==
          TS_OK);
    CHECK(ts_dist_all_reduce_start(d, NULL, 0, TS_F32, TS_DIST_SUM, &rc) ==
          TS_OK);
    CHECK(ra && rb && rc);
    bool done = false;
    CHECK(ts_dist_test(rc, &done) == TS_OK && done);
    for (int k = 0; k < 1000 && !done; k++)
        CHECK(ts_dist_test(rb, &done) == TS_OK);
    CHECK(ts_dist_wait(rb) == TS_OK);
    CHECK(ts_dist_wait(ra) == TS_OK);
    CHECK(ts_dist_wait(rc) == TS_OK);
    CHECK(ts_dist_wait(NULL) == TS_OK);
    bad = 0;
    for (int i = 0; i < N; i++) {
        double want = i + 1000.0 * (w - 1) / 2;
        bad += fabs(fa[i] - want) > 1e-6 * fabs(want) + 1e-6;
        bad += unbf(hb[i]) != (float)((i % 5) * w + w * (w - 1) / 2);
    }
    CHECK(bad == 0);
    CHECK(ts_dist_all_reduce_start(d, fa, 2, TS_I64, TS_DIST_SUM, &ra) ==
          TS_ERR_DTYPE);
    CHECK(ra == NULL);
    ts_clear_error(ctx);
    free(fa), free(hb);

    /* reduce-scatter with uneven counts: rank r gets r + 2 elements */
    int64_t *counts = malloc(sizeof *counts * (size_t)w), total = 0;
    for (int r = 0; r < w; r++)
        counts[r] = r + 2, total += r + 2;
    size_t room = (size_t)(total + 3 * w); /* also for 3 each, below */
    float *send = malloc(sizeof *send * room);
    float *recv = malloc(sizeof *recv * room);
    for (int64_t i = 0; i < total; i++)
        send[i] = (float)(i * (rank + 1));
    CHECK(ts_dist_reduce_scatter(d, send, recv, counts, 0, TS_F32,
                                 TS_DIST_SUM) == TS_OK);
    int64_t at = 0;
    for (int r = 0; r < rank; r++)
        at += counts[r];
    bad = 0;
    for (int64_t k = 0; k < counts[rank]; k++)
        bad += recv[k] != (float)((at + k) * w * (w + 1) / 2);
    CHECK(bad == 0);
    /* and equal counts, averaged */
    for (int64_t i = 0; i < 3 * w; i++)
        send[i] = (float)(i + rank);
    CHECK(ts_dist_reduce_scatter(d, send, recv, NULL, 3, TS_F32, TS_DIST_AVG) ==
          TS_OK);
    bad = 0;
    for (int k = 0; k < 3; k++)
        bad += fabsf(recv[k] - (float)(3 * rank + k + (w - 1) / 2.0)) > 1e-6f;
    CHECK(bad == 0);

    /* all-gather with uneven counts: rank r sends r + 2 copies of r */
    float mine[64];
    for (int k = 0; k < rank + 2; k++)
        mine[k] = (float)rank + 0.5f;
    CHECK(ts_dist_all_gather(d, mine, recv, counts, 0, TS_F32) == TS_OK);
    bad = 0, at = 0;
    for (int r = 0; r < w; r++)
        for (int64_t k = 0; k < counts[r]; k++)
            bad += recv[at++] != (float)r + 0.5f;
    CHECK(bad == 0);
    uint16_t hm[2] = {bf((float)rank), bf((float)-rank)}, hall[128];
    CHECK(ts_dist_all_gather(d, hm, hall, NULL, 2, TS_BF16) == TS_OK);
    bad = 0;
    for (int r = 0; r < w; r++)
        bad += unbf(hall[2 * r]) != (float)r || unbf(hall[2 * r + 1]) != -r;
    CHECK(bad == 0);

    /* broadcast from the last rank */
    for (int i = 0; i < N; i++)
        f[i] = rank == w - 1 ? (float)i * 0.25f : -1;
    CHECK(ts_dist_broadcast(d, f, N, TS_F32, w - 1) == TS_OK);
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += f[i] != (float)i * 0.25f;
    CHECK(bad == 0);
    CHECK(ts_dist_barrier(d) == TS_OK);

    /* bad arguments: clear errors, every rank alike, nothing sent */
    CHECK(ts_dist_broadcast(d, f, 4, TS_F32, w) == TS_ERR_INVALID_ARG);
    CHECK(strstr(ts_errmsg(ctx), "root") != NULL);
    ts_clear_error(ctx);
    int64_t i64[2] = {1, 2};
    CHECK(ts_dist_all_reduce(d, i64, 2, TS_I64, TS_DIST_SUM) == TS_ERR_DTYPE);
    CHECK(strstr(ts_errmsg(ctx), "f32 and bf16") != NULL);
    ts_clear_error(ctx);
    counts[0] = -1;
    CHECK(ts_dist_all_gather(d, mine, recv, counts, 0, TS_F32) ==
          TS_ERR_INVALID_ARG);
    ts_clear_error(ctx);
    /* no run at all (NULL): a world of one */
    float one[2] = {1.5f, 2.5f}, got[2] = {0, 0};
    CHECK(ts_dist_all_reduce(NULL, one, 2, TS_F32, TS_DIST_SUM) == TS_OK);
    CHECK(one[0] == 1.5f && one[1] == 2.5f);
    CHECK(ts_dist_reduce_scatter(NULL, one, got, NULL, 2, TS_F32,
                                 TS_DIST_AVG) == TS_OK);
    CHECK(got[0] == 1.5f && got[1] == 2.5f);
    got[0] = got[1] = 0;
    CHECK(ts_dist_all_gather(NULL, one, got, NULL, 2, TS_F32) == TS_OK);
    CHECK(got[0] == 1.5f && got[1] == 2.5f);
    CHECK(ts_dist_broadcast(NULL, one, 2, TS_F32, 0) == TS_OK);
    CHECK(ts_dist_broadcast(NULL, one, 2, TS_F32, 1) == TS_ERR_INVALID_ARG);
    CHECK(ts_dist_barrier(NULL) == TS_OK);
    ts_dist_req *rn = NULL;
    CHECK(ts_dist_all_reduce_start(NULL, one, 2, TS_F32, TS_DIST_AVG, &rn) ==
          TS_OK);
    CHECK(ts_dist_wait(rn) == TS_OK);
    CHECK(one[0] == 1.5f && one[1] == 2.5f);
    CHECK(ts_dist_rank(NULL) == 0 && ts_dist_world(NULL) == 1);

    /* the accounting: time and a ring's volume of what went out */
    if (w > 1)
        CHECK(ts_dist_comm_bytes(d) > 0 && ts_dist_comm_seconds(d) > 0);
    else
        CHECK(ts_dist_comm_bytes(d) == 0);

    free(f), free(h), free(counts), free(send), free(recv);
    ts_dist_free(d);
    ts_ctx_free(ctx);
    return test_finish("test_dist");
}
