/* read_bound.h — the machine's read bound for the benchmarks: a streaming
 * read of n floats by every thread of the pool, the most a decode step
 * that only reads its weights can reach (bench_decode, bench_engine). */
#ifndef TS_BENCH_READ_BOUND_H
#define TS_BENCH_READ_BOUND_H

#include "core/core.h"

#include <stddef.h>
#include <stdint.h>

/* the sum of n floats read by every thread in parallel: a read-only
 * stream, the bound a decode step that only reads its weights can reach */
typedef struct {
    const float *p;
    size_t n;
    float part[64];
} read_job;

static inline void read_chunk(void *arg, int64_t c) {
    read_job *j = arg;
    size_t per = (j->n / 64 + 31) / 32 * 32;
    size_t i0 = (size_t)c * per, i1 = i0 + per < j->n ? i0 + per : j->n;
    /* 32 independent lanes the compiler vectorizes at any ISA level */
    float l[32] = {0}, total = 0;
    for (size_t i = i0; i + 32 <= i1; i += 32)
        for (int k = 0; k < 32; k++)
            l[k] += j->p[i + k];
    for (int k = 0; k < 32; k++)
        total += l[k];
    j->part[c] = total;
}

static inline float read_all(const float *p, size_t n) {
    read_job j = {.p = p, .n = n};
    ts_parallel_chunks(64, read_chunk, &j);
    float total = 0;
    for (int c = 0; c < 64; c++)
        total += j.part[c];
    return total;
}

#endif
