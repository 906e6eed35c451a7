/* blas.c — f32 matrix products on the thread pool: OpenBLAS's sgemm, one
 * thread per call, run on slices of the output, one slice per pool chunk.
 * Owns how a product is cut; must not know about tensors.
 *
 * OpenBLAS is the pthread build held to one thread (openblas_set_num_threads
 * once, below): its own workers then never get work and sleep, so nothing
 * spins between products (see threadpool.c), and its buffer allocation is
 * locked, so several pool threads may call it at once. (Debian's serial
 * build has no such lock: concurrent calls shared a packing buffer and
 * gave wrong products; test_threadpool checks.) OpenBLAS's
 * rounding depends on the slice an element falls in (edge tiles take other
 * kernels), so slices are cut by the shape alone: results are the same
 * bits at every thread count, within rounding of an uncut sgemm. */
#include "core/core.h"

#include <cblas.h>
#include <pthread.h>

typedef struct {
    bool ta, tb, split_n;
    int M, N, K, lda, ldb, ldc, width;
    float alpha, beta;
    const float *A, *B;
    float *C;
} sgemm_job;

static void sgemm_slice(void *p, int64_t c) {
    const sgemm_job *j = p;
    int dim = j->split_n ? j->N : j->M;
    int b = (int)c * j->width, e = b + j->width < dim ? b + j->width : dim;
    const float *A = j->A, *B = j->B;
    float *C = j->C;
    int M = j->M, N = j->N;
    if (j->split_n) { /* columns b..e of B and C */
        B += j->tb ? (size_t)b * j->ldb : (size_t)b;
        C += b;
        N = e - b;
    } else { /* rows b..e of A and C */
        A += j->ta ? (size_t)b : (size_t)b * j->lda;
        C += (size_t)b * j->ldc;
        M = e - b;
    }
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                j->tb ? CblasTrans : CblasNoTrans, M, N, j->K, j->alpha, A,
                j->lda, B, j->ldb, j->beta, C, j->ldc);
}

static void blas_one_thread(void) {
    openblas_set_num_threads(1);
}

void ts_blas_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, blas_one_thread);
}

void ts_sgemm(bool ta, bool tb, int M, int N, int K, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta,
              float *C, int ldc) {
    ts_blas_init();
    if (M <= 0 || N <= 0)
        return;
    /* The cut depends on the shape alone, never on the thread count, so a
     * product gives the same bits on 1 thread as on 16. Slices of about
     * 0.5 MFLOP at least (a few microseconds), 16 at most, each at least
     * 64 wide and a multiple of 16. */
    double flops = 2.0 * M * N * (K > 0 ? K : 1);
    bool split_n = N >= M;
    int dim = split_n ? N : M;
    int64_t nc = (int64_t)(flops / 5e5);
    nc = nc > 16 ? 16 : nc;
    nc = nc > dim / 64 ? dim / 64 : nc;
    if (nc < 2) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                    tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
                    ldb, beta, C, ldc);
        return;
    }
    int width = (int)((dim + nc - 1) / nc);
    width = (width + 15) / 16 * 16;
    sgemm_job j = {ta,  tb,    split_n, M,    N, K, lda, ldb,
                   ldc, width, alpha,   beta, A, B, C};
    ts_parallel_chunks((dim + width - 1) / width, sgemm_slice, &j);
}
