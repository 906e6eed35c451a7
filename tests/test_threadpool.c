/* test_threadpool.c — Tessera's thread pool (src/core/threadpool.c) and the
 * f32 products cut over it (src/core/blas.c): every index runs exactly
 * once at any thread count, nested and concurrent submissions run (the
 * inner or second one serially) without deadlock, ts_sgemm gives the
 * same bits at every thread count, within rounding of a double-precision
 * product, and several threads may call it at once. */
#include "core/core.h"
#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- 1. every index once ---- */

typedef struct {
    atomic_int *hits;
    atomic_int calls;
} cover_job;

static void cover_range(void *p, int64_t b, int64_t e) {
    cover_job *j = p;
    atomic_fetch_add(&j->calls, 1);
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add(&j->hits[i], 1);
}

static void test_cover(void) {
    static const int64_t sizes[] = {0, 1, 2, 7, 64, 1000, 100003};
    static const int64_t grains[] = {1, 3, 64, 5000};
    for (int threads = 1; threads <= 4; threads++) {
        ts_threads_apply(threads);
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t g = 0; g < sizeof grains / sizeof *grains; g++) {
                int64_t n = sizes[s];
                cover_job j = {calloc((size_t)n + 1, sizeof(atomic_int)), 0};
                ts_parallel_for(n, grains[g], cover_range, &j);
                int64_t bad = 0;
                for (int64_t i = 0; i < n; i++)
                    bad += atomic_load(&j.hits[i]) != 1;
                CHECK(bad == 0);
                /* never more ranges than 4 per thread, nor smaller than
                 * the grain (but one at least) */
                int most = n < 2 * grains[g] ? 1 : threads * 4;
                CHECK(atomic_load(&j.calls) <= (n ? most : 0));
                free(j.hits);
            }
    }
}

/* ---- 2. nested and concurrent submissions ---- */

static void inner_chunk(void *p, int64_t c) {
    atomic_fetch_add((atomic_long *)p, c + 1);
}

static void outer_chunk(void *p, int64_t c) {
    (void)c;
    ts_parallel_chunks(10, inner_chunk, p); /* runs serially in here */
}

static atomic_int outside_pool;

static void marked_chunk(void *p, int64_t c) {
    if (!ts_in_parallel())
        atomic_fetch_add(&outside_pool, 1);
    outer_chunk(p, c);
}

typedef struct {
    atomic_long sum;
    int rounds;
} submit_job;

static void *submitter(void *p) {
    submit_job *j = p;
    for (int r = 0; r < j->rounds; r++)
        ts_parallel_chunks(8, outer_chunk, &j->sum);
    return NULL;
}

static void test_nested_and_concurrent(void) {
    ts_threads_apply(3);
    /* one submitter: every chunk (the submitter's too) is inside the pool */
    atomic_long sum = 0;
    ts_parallel_chunks(8, marked_chunk, &sum);
    CHECK(atomic_load(&sum) == 8 * 55);
    CHECK(atomic_load(&outside_pool) == 0);
    /* two submitters: one of them runs its loops serially when they meet */
    submit_job a = {0, 200}, b = {0, 200};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, submitter, &a);
    pthread_create(&tb, NULL, submitter, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    /* each round: 8 outer chunks x (1 + ... + 10) */
    CHECK(atomic_load(&a.sum) == 200L * 8 * 55);
    CHECK(atomic_load(&b.sum) == 200L * 8 * 55);
    CHECK(!ts_in_parallel());
}

/* ---- 3. ts_sgemm: the same bits at any thread count, and right ---- */

static float *random_matrix(size_t n, unsigned seed) {
    float *m = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        m[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
    return m;
}

static void test_sgemm(void) {
    /* tall, wide, decode-like (M = 1), odd sizes, each transpose */
    static const int shapes[][3] = {{1, 768, 256},  {3, 1000, 97},
                                    {256, 48, 512}, {515, 300, 64},
                                    {64, 64, 64},   {700, 33, 129}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            int lda = ta ? M + 3 : K + 1, ldb = tb ? K + 2 : N + 5, ldc = N + 4;
            float *A = random_matrix((size_t)(ta ? K : M) * lda, 1 + t);
            float *B = random_matrix((size_t)(tb ? N : K) * ldb, 7 + t);
            float *c0 = random_matrix((size_t)M * ldc, 99);
            size_t bytes = sizeof(float) * (size_t)M * ldc;
            float *first = malloc(bytes), *c = malloc(bytes);
            for (int threads = 1; threads <= 3; threads++) {
                ts_threads_apply(threads);
                memcpy(c, c0, bytes);
                ts_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.25f, c, ldc);
                if (threads == 1)
                    memcpy(first, c, bytes);
                else /* every element and the padding between rows */
                    CHECK(!memcmp(c, first, bytes));
            }
            double worst = 0;
            for (int i = 0; i < M; i++)
                for (int jn = 0; jn < ldc; jn++) {
                    double want = c0[(size_t)i * ldc + jn];
                    if (jn < N) {
                        double d = 0;
                        for (int k = 0; k < K; k++)
                            d += (double)(ta ? A[(size_t)k * lda + i]
                                             : A[(size_t)i * lda + k]) *
                                 (tb ? B[(size_t)jn * ldb + k]
                                     : B[(size_t)k * ldb + jn]);
                        want = 0.5 * d + 0.25 * want;
                    }
                    double e = first[(size_t)i * ldc + jn] - want;
                    worst = e < 0 ? (-e > worst ? -e : worst)
                                  : (e > worst ? e : worst);
                }
            CHECK(worst < 1e-5);
            free(A), free(B), free(c0), free(first), free(c);
        }
}

/* ---- 4. several threads in the BLAS at once ----
 * OpenBLAS's serial build without locking hands two threads one packing
 * buffer: products called at once came out wrong (a training run's losses
 * changed from run to run). Many small and mid-sized products from 4
 * threads, each checked against the same product made alone. */

enum { STRESS_SHAPES = 5, STRESS_THREADS = 4 };
static const int stress_n[STRESS_SHAPES] = {8, 33, 64, 100, 160};

typedef struct {
    const float *A, *B, *C0[STRESS_SHAPES];
    int id, bad;
} stress_job;

static void *stress(void *p) {
    stress_job *j = p;
    float *c = malloc(sizeof(float) * 160 * 160);
    for (int r = 0; r < 400; r++) {
        int s = (r * 7 + j->id * 3) % STRESS_SHAPES, n = stress_n[s];
        /* alone on this thread: the call goes straight to the BLAS */
        ts_sgemm(false, false, n, n, n, 1.0f, j->A, n, j->B, n, 0.0f, c, n);
        j->bad += memcmp(c, j->C0[s], sizeof(float) * (size_t)n * n) != 0;
    }
    free(c);
    return NULL;
}

static void test_sgemm_concurrent(void) {
    float *A = random_matrix(160 * 160, 3), *B = random_matrix(160 * 160, 4);
    float *C0[STRESS_SHAPES];
    ts_threads_apply(1); /* each thread's products unsliced, at once */
    for (int s = 0; s < STRESS_SHAPES; s++) {
        int n = stress_n[s];
        C0[s] = malloc(sizeof(float) * (size_t)n * n);
        ts_sgemm(false, false, n, n, n, 1.0f, A, n, B, n, 0.0f, C0[s], n);
    }
    stress_job j[STRESS_THREADS];
    pthread_t t[STRESS_THREADS];
    for (int i = 0; i < STRESS_THREADS; i++) {
        j[i] = (stress_job){.A = A, .B = B, .id = i};
        memcpy(j[i].C0, C0, sizeof C0);
        pthread_create(&t[i], NULL, stress, &j[i]);
    }
    int bad = 0;
    for (int i = 0; i < STRESS_THREADS; i++) {
        pthread_join(t[i], NULL);
        bad += j[i].bad;
    }
    CHECK(bad == 0);
    for (int s = 0; s < STRESS_SHAPES; s++)
        free(C0[s]);
    free(A), free(B);
}

/* ---- 5. the default is the affinity mask ---- */

static void test_default_threads(void) {
    int n = ts_default_threads();
    CHECK(n >= 1 && n <= 1024);
    ts_threads_apply(0); /* clamped */
    CHECK(ts_threads_count() == 1);
    ts_threads_apply(5000);
    CHECK(ts_threads_count() == 1024);
}

int main(void) {
    test_cover();
    test_nested_and_concurrent();
    test_sgemm();
    test_sgemm_concurrent();
    test_default_threads();
    return test_finish("test_threadpool");
}
