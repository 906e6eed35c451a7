/* threadpool.c — Tessera's thread pool: every parallel loop of the CPU
 * kernels and every f32 product (OpenBLAS's single-threaded sgemm, called
 * on slices) runs on it. Owns the worker threads, the fork-join protocol
 * and the thread count; must not know about tensors or ops.
 *
 * Why not OpenMP: libgomp's workers spin for a long time between loops
 * (its spin count is fixed when the library loads), so on a machine shared
 * with another busy process every loop waited for a descheduled spinner
 * and throughput fell 10-30x. Here a worker spins for a short, bounded
 * time (TS_SPIN_US, 50 us by default: the gap between two ops of a decode
 * step), then sleeps on a futex; and work is handed out in chunks claimed
 * one at a time, so a thread that the scheduler takes away holds up at
 * most the chunk it is running while the others take the rest.
 *
 * Protocol: a job is (fn, arg, nchunks), published by the submitting
 * thread with one 64-bit ticket = generation << 32 | next chunk. Claiming
 * a chunk is a compare-and-swap of the ticket, so a worker that wakes late
 * can never run a chunk of a job that has moved on. The submitter runs
 * chunks too, then waits (spin, then futex) until `done` counts them all.
 * One job at a time: a second thread that submits while a job runs, or a
 * chunk that submits from inside a job, runs its loop serially. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "core/core.h"

#include <immintrin.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 1024

static struct {
    pthread_mutex_t submit; /* one job at a time */
    pthread_mutex_t grow;   /* starting workers */
    atomic_int threads;     /* participants, the submitter included */
    int started;            /* workers running (index 1..started) */
    uint32_t gen;           /* last generation published (submitter) */
    _Atomic uint64_t ticket;
    _Atomic(ts_chunk_fn) fn;
    _Atomic(void *) arg;
    atomic_uint nchunks;
    atomic_uint done;    /* futex word: chunks finished in this job */
    atomic_uint wake;    /* futex word: bumped when a job is published */
    atomic_int sleepers; /* workers in futex_wait on wake */
    atomic_int waiting;  /* the submitter sleeps on done */
    int64_t spin_ns;     /* TS_SPIN_US, read once before the first worker */
} P = {.submit = PTHREAD_MUTEX_INITIALIZER,
       .grow = PTHREAD_MUTEX_INITIALIZER,
       .threads = 1,
       .spin_ns = 50000};

static _Thread_local bool in_pool_task;

static void futex_wait(atomic_uint *w, unsigned v) {
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *w, int n) {
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Claims and runs chunks of job `gen` until none are left or the job has
 * moved on. */
static void run_chunks(uint32_t gen) {
    for (;;) {
        uint64_t t = atomic_load(&P.ticket);
        if ((uint32_t)(t >> 32) != gen)
            return;
        uint32_t c = (uint32_t)t, nc = atomic_load(&P.nchunks);
        ts_chunk_fn fn = atomic_load(&P.fn);
        void *arg = atomic_load(&P.arg);
        if (c >= nc) {
            if (atomic_load(&P.ticket) == t)
                return; /* all claimed */
            continue;
        }
        if (!atomic_compare_exchange_weak(&P.ticket, &t, t + 1))
            continue;
        fn(arg, (int64_t)c);
        if (atomic_fetch_add(&P.done, 1) + 1 == nc && atomic_load(&P.waiting))
            futex_wake(&P.done, 1);
    }
}

static void *worker_main(void *p) {
    int index = (int)(intptr_t)p;
    uint32_t seen = 0;
    in_pool_task = true; /* a chunk that submits runs its loop serially */
    for (;;) {
        unsigned w = atomic_load(&P.wake);
        uint32_t gen = (uint32_t)(atomic_load(&P.ticket) >> 32);
        if (gen != seen) {
            seen = gen;
            if (index < atomic_load(&P.threads))
                run_chunks(gen);
            continue;
        }
        /* spin briefly: the next op's loop usually comes within microseconds */
        int64_t until = now_ns() + P.spin_ns;
        bool fresh = false;
        for (int i = 0; !fresh; i++) {
            _mm_pause();
            fresh = (uint32_t)(atomic_load(&P.ticket) >> 32) != seen;
            if ((i & 15) == 15 && now_ns() >= until)
                break;
        }
        if (fresh)
            continue;
        atomic_fetch_add(&P.sleepers, 1);
        futex_wait(&P.wake, w);
        atomic_fetch_sub(&P.sleepers, 1);
    }
    return NULL;
}

/* Starts workers up to n - 1 (the submitter is participant 0). */
static void pool_grow(int n) {
    pthread_mutex_lock(&P.grow);
    if (P.started == 0) { /* no worker reads it yet */
        const char *e = getenv("TS_SPIN_US");
        long us = e && *e ? strtol(e, NULL, 10) : 50;
        P.spin_ns = (us < 0 ? 0 : us > 100000 ? 100000 : us) * 1000;
    }
    while (P.started < n - 1) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &a, worker_main,
                                (void *)(intptr_t)(P.started + 1));
        pthread_attr_destroy(&a);
        if (rc != 0)
            break; /* fewer workers: the loops still complete */
        P.started++;
    }
    pthread_mutex_unlock(&P.grow);
}

void ts_threads_apply(int n) {
    ts_blas_init();
    n = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
    atomic_store(&P.threads, n);
}

int ts_threads_count(void) {
    return atomic_load(&P.threads);
}

bool ts_in_parallel(void) {
    return in_pool_task;
}

void ts_parallel_chunks(int64_t nchunks, ts_chunk_fn fn, void *arg) {
    if (nchunks <= 0)
        return;
    int n = atomic_load(&P.threads);
    if (nchunks == 1 || n <= 1 || nchunks > UINT32_MAX / 2 || in_pool_task ||
        pthread_mutex_trylock(&P.submit) != 0) {
        for (int64_t c = 0; c < nchunks; c++)
            fn(arg, c);
        return;
    }
    if (P.started < n - 1)
        pool_grow(n);
    in_pool_task = true;
    uint32_t gen = ++P.gen;
    if (gen == 0) /* workers start with seen = 0 */
        gen = ++P.gen;
    atomic_store(&P.fn, fn);
    atomic_store(&P.arg, arg);
    atomic_store(&P.nchunks, (unsigned)nchunks);
    atomic_store(&P.done, 0);
    atomic_store(&P.ticket, (uint64_t)gen << 32);
    atomic_fetch_add(&P.wake, 1);
    if (atomic_load(&P.sleepers) > 0)
        futex_wake(&P.wake, INT_MAX);
    run_chunks(gen);
    /* wait for chunks other threads are running */
    int64_t until = now_ns() + P.spin_ns;
    for (int i = 0; atomic_load(&P.done) < (unsigned)nchunks; i++) {
        _mm_pause();
        if ((i & 15) != 15 || now_ns() < until)
            continue;
        atomic_store(&P.waiting, 1);
        unsigned d = atomic_load(&P.done);
        if (d < (unsigned)nchunks)
            futex_wait(&P.done, d);
        atomic_store(&P.waiting, 0);
    }
    in_pool_task = false;
    pthread_mutex_unlock(&P.submit);
}

typedef struct {
    int64_t n, nchunks;
    ts_range_fn fn;
    void *arg;
} range_job;

static void range_chunk(void *p, int64_t c) {
    const range_job *j = p;
    int64_t b = j->n * c / j->nchunks, e = j->n * (c + 1) / j->nchunks;
    if (e > b)
        j->fn(j->arg, b, e);
}

void ts_parallel_for(int64_t n, int64_t grain, ts_range_fn fn, void *arg) {
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int threads = atomic_load(&P.threads);
    int64_t nc = n / grain;
    /* a few chunks per thread: one that is descheduled delays only its own */
    int64_t most = threads > 1 ? (int64_t)threads * 4 : 1;
    nc = nc < 1 ? 1 : nc > most ? most : nc;
    if (nc == 1 || in_pool_task) {
        fn(arg, 0, n);
        return;
    }
    range_job j = {n, nc, fn, arg};
    ts_parallel_chunks(nc, range_chunk, &j);
}

int ts_default_threads(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n >= 1)
            return n > MAX_THREADS ? MAX_THREADS : n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int)(n > MAX_THREADS ? MAX_THREADS : n) : 1;
}
