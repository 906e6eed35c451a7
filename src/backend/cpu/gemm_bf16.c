/* gemm_bf16.c — C (M, N) (+)= A (M, K) @ B (K, N) with bf16 operands and f32
 * sums, on AVX512_BF16's vdpbf16ps, BLIS-style: both operands packed into
 * panels of bf16 pairs of K (the layout vdpbf16ps multiplies), f32 rounded
 * to nearest even on the way; a register-blocked micro-kernel of up to MR x
 * NR (8 rows x 48 columns: 24 zmm accumulators, three B vectors and one
 * broadcast A pair), one f32 chain over K per C element whatever the path
 * (so a row's bits never depend on M). Up to 64 rows (decode): A packed
 * whole, B's strips streamed once, shared out among the threads. More rows
 * (prefill, training): A packed a block of rows at a time and shared;
 * tasks on the pool (ts_parallel_chunks) of a few B column strips each,
 * packing their B block KCP pairs of K at a time into an L2-sized buffer
 * of their own (or reading a B pre-packed once, cpu_bf16_packed) while A's
 * rows stream past it MC at a time. Owns the packing, the kernel, the
 * blocking and the pre-packed B; must not know tensors or ops (the packed
 * copies a storage keeps are cpu_backend.c's). Kernel code carries its own
 * target attribute and is only reached when the caller's isa allows: the
 * file builds at baseline x86-64 flags. */
#include "backend/cpu/gemm_bf16.h"

#include "backend/cpu/cpu.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define TS_BF16_TARGET                                                         \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,"     \
                          "avx512vnni,avx2,fma,f16c")))

/* micro-kernel tile: MR rows of A (broadcast pairs) by NR columns of B
 * (NR / 16 zmm) */
#define MR 8
#define NR 48
#define NV (NR / 16)
_Static_assert(MR == 8 || MR % 16 == 0, "panels are packed 16 items a time");
_Static_assert(NR % 16 == 0, "B's strips are whole zmm");
/* blocking (KCP in pairs of K): a task's B block of KCP x 4 NR pairs is
 * 192 KiB and A's rows MC x KCP pairs 256 KiB, together in a 1 MiB L2; a
 * B micro-panel (KCP x NR, 48 KiB) is reused by MC / MR = 32 kernel calls.
 * (On Zen5, 1 thread: 8 x 48 reaches ~410 GFLOP/s on L1-resident panels;
 * KCP 128..512, MC 128..512 and 2..8 strips a task measured alike within
 * the machine's noise.) */
#define KCP 256
#define MC  256
/* a task: about TASK_STRIPS strips of B, no fewer than TASK_ROWS rows */
#define TASK_STRIPS 4
#define TASK_ROWS   256
/* the largest packed A block (rows at a time), in bytes */
#define A_BLOCK_BYTES ((int64_t)4 << 20)

struct cpu_bf16_packed {
    int64_t K, N, Kp; /* Kp = ceil(K / 2) pairs */
    uint32_t *strips; /* ceil(N / NR) strips of Kp x NR pairs */
    size_t bytes;     /* of strips */
    /* what was packed (cpu_bf16_packed_matches) */
    const void *src;
    ts_dtype dt;
    int64_t rs, cs;
};

static bool dtype_ok(ts_dtype dt) {
    return dt == TS_F32 || dt == TS_BF16;
}

/* ---- packing ----
 * A panel of W items (rows of A, columns of B) holds, for each pair kp of
 * K, the W items' bf16 pairs as uint32: low half element 2kp, high half
 * 2kp + 1 (0 past K); items past the matrix are 0. Strip s (items
 * s W .. s W + W - 1) is Kp x W uint32, strips one after another. Items
 * are packed 16 at a time (one zmm), so W is 8 or a multiple of 16. */

typedef struct {
    const char *src;
    ts_dtype dt;
    int64_t es;     /* element size in bytes */
    int64_t sx, sk; /* element strides along the items and along K */
    int64_t nx, K, Kp;
    int W;
    int64_t nstrips;
    uint32_t *out;
} pack_job;

/* f32 -> bf16 of 16 lanes, the bits of ts_f32_to_bf16 (nearest even, NaN
 * kept quiet with its sign) */
static inline TS_BF16_TARGET __m256i bf16_of_f32x16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb =
        _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
        16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
        _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16),
                             _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* n (0..16) contiguous elements as bf16, 0 past n */
static inline TS_BF16_TARGET __m256i load16_bf16(const char *p, ts_dtype dt,
                                                 int64_t n) {
    if (n <= 0)
        return _mm256_setzero_si256();
    __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    if (dt == TS_BF16)
        return _mm256_maskz_loadu_epi16(m, p);
    return bf16_of_f32x16(_mm512_maskz_loadu_ps(m, p));
}

/* n (0..32) contiguous elements of K as 16 bf16 pairs, 0 past n */
static inline TS_BF16_TARGET __m512i load32_pairs(const char *p, ts_dtype dt,
                                                  int64_t n) {
    if (dt == TS_BF16) {
        __mmask32 m =
            n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1);
        return _mm512_maskz_loadu_epi16(m, p);
    }
    __m256i lo = load16_bf16(p, dt, n), hi = load16_bf16(p + 64, dt, n - 16);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* in-place transpose of a 16 x 16 matrix of uint32, one row per zmm */
static inline TS_BF16_TARGET void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* per 128-bit lane, u[4q + c] = column c of rows 4q .. 4q + 3 */
    for (int q = 0; q < 16; q += 4) {
        u[q] = _mm512_unpacklo_epi64(t[q], t[q + 2]);
        u[q + 1] = _mm512_unpackhi_epi64(t[q], t[q + 2]);
        u[q + 2] = _mm512_unpacklo_epi64(t[q + 1], t[q + 3]);
        u[q + 3] = _mm512_unpackhi_epi64(t[q + 1], t[q + 3]);
    }
    for (int c = 0; c < 4; c++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);
        __m512i w0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
        __m512i v1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
        __m512i w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_i32x4(v0, v1, 0x88);
        r[8 + c] = _mm512_shuffle_i32x4(v0, v1, 0xdd);
        r[4 + c] = _mm512_shuffle_i32x4(w0, w1, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(w0, w1, 0xdd);
    }
}

/* the pairs of items x0 .. x0 + 15 at pair kp into their strip(s) */
static inline TS_BF16_TARGET void store16(const pack_job *j, int64_t x0,
                                          int64_t kp, __m512i v) {
    int64_t W = j->W, s = x0 / W;
    uint32_t *p = j->out + (s * j->Kp + kp) * W + x0 % W;
    if (W % 16 == 0) {
        _mm512_storeu_si512(p, v);
        return;
    }
    _mm256_storeu_si256((__m256i *)p, _mm512_castsi512_si256(v));
    if (s + 1 < j->nstrips)
        _mm256_storeu_si256((__m256i *)(p + j->Kp * W),
                            _mm512_extracti64x4_epi64(v, 1));
}

/* groups [g0, g1) of 16 items */
static TS_BF16_TARGET void pack_groups(void *arg, int64_t g0, int64_t g1) {
    const pack_job *j = arg;
    const char *src = j->src;
    int64_t es = j->es, sx = j->sx, sk = j->sk, nx = j->nx, K = j->K;
    if (sx == 1 && sk != 1) {
        /* items contiguous: rows 2kp and 2kp + 1 of K interleaved, along
         * the rows (all groups for a pair, then the next pair) */
        for (int64_t kp = 0; kp < j->Kp; kp++)
            for (int64_t g = g0; g < g1; g++) {
                int64_t x0 = g * 16, n = nx - x0 < 16 ? nx - x0 : 16;
                const char *p = src + (x0 + 2 * kp * sk) * es;
                __m256i lo = load16_bf16(p, j->dt, n);
                __m256i hi = 2 * kp + 1 < K ? load16_bf16(p + sk * es, j->dt, n)
                                            : _mm256_setzero_si256();
                __m512i v = _mm512_or_si512(
                    _mm512_cvtepu16_epi32(lo),
                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
                store16(j, x0, kp, v);
            }
        return;
    }
    for (int64_t g = g0; g < g1; g++) {
        int64_t x0 = g * 16, n = nx - x0 < 16 ? nx - x0 : 16;
        if (sk == 1) { /* pairs contiguous: 16 items x 16 pairs, transposed */
            for (int64_t k = 0; k < K; k += 32) {
                __m512i r[16];
                for (int l = 0; l < 16; l++) {
                    const char *row = src + ((x0 + l) * sx + k) * es;
                    /* the same k of the next group's row: 16 rows (each
                     * a page or two of its own) are more streams than the
                     * hardware prefetcher follows (packing a strip on the
                     * fly: 2x faster than prefetching ahead in the row) */
                    const char *nx = row + 16 * sx * es;
                    _mm_prefetch(nx, _MM_HINT_T0);
                    if (es == 4)
                        _mm_prefetch(nx + 64, _MM_HINT_T0);
                    r[l] = l < n ? load32_pairs(row, j->dt, K - k)
                                 : _mm512_setzero_si512();
                }
                transpose16(r);
                for (int q = 0; q < 16 && k / 2 + q < j->Kp; q++)
                    store16(j, x0, k / 2 + q, r[q]);
            }
            continue;
        }
        for (int64_t kp = 0; kp < j->Kp; kp++) { /* any strides, one by one */
            uint32_t v[16] = {0};
            for (int l = 0; l < n; l++)
                for (int h = 0; h < 2 && 2 * kp + h < K; h++) {
                    const char *e =
                        src + ((x0 + l) * sx + (2 * kp + h) * sk) * es;
                    uint16_t b = j->dt == TS_BF16
                                     ? *(const uint16_t *)e
                                     : ts_f32_to_bf16(*(const float *)e);
                    v[l] |= (uint32_t)b << (16 * h);
                }
            store16(j, x0, kp, _mm512_loadu_si512(v));
        }
    }
}

/* the job packing items [0, nx) of an (nx, K) matrix with strides (sx, sk)
 * into ceil(nx / W) strips at out */
static pack_job pack_job_of(const void *src, ts_dtype dt, int64_t sx,
                            int64_t sk, int64_t nx, int64_t K, int W,
                            uint32_t *out) {
    /* a dimension of one has no stride to speak of: call it contiguous */
    if (nx == 1)
        sx = 1;
    if (K == 1)
        sk = 1;
    pack_job j = {.src = src,
                  .dt = dt,
                  .es = (int64_t)ts_dtype_size(dt),
                  .sx = sx,
                  .sk = sk,
                  .nx = nx,
                  .K = K,
                  .Kp = (K + 1) / 2,
                  .W = W,
                  .nstrips = (nx + W - 1) / W,
                  .out = out};
    return j;
}

/* the same, on the pool (~64K elements a chunk) */
static TS_BF16_TARGET void pack_panels(const void *src, ts_dtype dt, int64_t sx,
                                       int64_t sk, int64_t nx, int64_t K, int W,
                                       uint32_t *out) {
    pack_job j = pack_job_of(src, dt, sx, sk, nx, K, W, out);
    ts_parallel_for((j.nstrips * W + 15) / 16, 65536 / (16 * K) + 1,
                    pack_groups, &j);
}

/* lines to prefetch while a tile runs: lines_per_pair 64-byte lines
 * from p on at each pair of K, up to end */
typedef struct {
    const char *p, *end;
    int lines_per_pair;
} pf_span;

/* ---- micro-kernel ----
 * C (mr, nr) of a tile: the pairs [0, kpn) of A's strip a (MR rows, rows
 * past mr unused) times B's strip b (NR columns, padded with zeros). Every
 * C element is one chain: c = C (load) or 0, then, pair by pair in K's
 * order, c = vdpbf16ps(c, a pair, b pair). Storing c and loading it back
 * is exact, so a chain cut into K blocks (load on every block but the
 * first) is the same chain: the value of an element never depends on the
 * tile, the blocking, the rows beside it or their number. Rows (ROWS, 1 ..
 * MR) are a constant of each instance, so a thin tile does no work for
 * rows it does not have; columns past nr are computed on the zero padding
 * and not stored. */
static inline __attribute__((always_inline)) TS_BF16_TARGET void
tile_rows(int64_t kpn, const uint32_t *a, const uint32_t *b, float *C,
          int64_t ldc, const int ROWS, int nr, bool load, const pf_span *pf) {
    const char *pf_at = pf ? pf->p : NULL;
    int pf_n = pf ? pf->lines_per_pair : 0;
    __m512 c[MR][NV];
    __mmask16 mk[NV];
    for (int v = 0; v < NV; v++) {
        int w = nr - 16 * v;
        mk[v] = w >= 16  ? (__mmask16)0xffff
                : w <= 0 ? (__mmask16)0
                         : (__mmask16)((1u << w) - 1);
    }
    bool full = nr == NR;
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < NV; v++) {
            const float *p = C + r * ldc + 16 * v;
            c[r][v] = !load  ? _mm512_setzero_ps()
                      : full ? _mm512_loadu_ps(p)
                             : _mm512_maskz_loadu_ps(mk[v], p);
        }
    for (int64_t kp = 0; kp < kpn; kp++) {
        __m512bh bv[NV];
        for (int v = 0; v < NV; v++)
            bv[v] = (__m512bh)_mm512_loadu_si512(b + kp * NR + 16 * v);
        if (pf_at && pf_at < pf->end)
            for (int l = 0; l < pf_n; l++, pf_at += 64)
                _mm_prefetch(pf_at, _MM_HINT_T0);
        for (int r = 0; r < ROWS; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[kp * MR + r]);
            for (int v = 0; v < NV; v++)
                c[r][v] = _mm512_dpbf16_ps(c[r][v], av, bv[v]);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < NV; v++) {
            float *p = C + r * ldc + 16 * v;
            if (full)
                _mm512_storeu_ps(p, c[r][v]);
            else
                _mm512_mask_storeu_ps(p, mk[v], c[r][v]);
        }
}

/* the tile of mr (1 .. MR) rows */
static TS_BF16_TARGET void tile(int64_t kpn, const uint32_t *a,
                                const uint32_t *b, float *C, int64_t ldc,
                                int mr, int nr, bool load, const pf_span *pf) {
    _Static_assert(MR == 8, "one case per row count");
    switch (mr) {
    case 1:
        tile_rows(kpn, a, b, C, ldc, 1, nr, load, pf);
        break;
    case 2:
        tile_rows(kpn, a, b, C, ldc, 2, nr, load, pf);
        break;
    case 3:
        tile_rows(kpn, a, b, C, ldc, 3, nr, load, pf);
        break;
    case 4:
        tile_rows(kpn, a, b, C, ldc, 4, nr, load, pf);
        break;
    case 5:
        tile_rows(kpn, a, b, C, ldc, 5, nr, load, pf);
        break;
    case 6:
        tile_rows(kpn, a, b, C, ldc, 6, nr, load, pf);
        break;
    case 7:
        tile_rows(kpn, a, b, C, ldc, 7, nr, load, pf);
        break;
    default:
        tile_rows(kpn, a, b, C, ldc, MR, nr, load, pf);
        break;
    }
}

/* ---- blocking ----
 * For each block of A's rows (packed whole, shared by all tasks): tasks of
 * B's column strips (and, when there are too few to share out, of A's rows
 * too), each packing its block of B, KCP pairs of K at a time, into a
 * buffer of its own that stays in L2 while all the task's rows pass over it
 * (or reading the pre-packed B in place). The sum of a C element is the
 * same chain of operations whatever the tasks: the same bits on any number
 * of threads, packed B or not. */

/* a 64-byte aligned block from the kernel temporaries; *base is what
 * cpu_tmp_free takes */
static uint32_t *tmp_aligned(int64_t bytes, void **base) {
    *base = cpu_tmp_alloc((size_t)bytes + 64);
    if (!*base)
        return NULL;
    uintptr_t p = ((uintptr_t)*base + 63) & ~(uintptr_t)63;
    return (uint32_t *)p;
}

typedef struct {
    const uint32_t *ap; /* A's block: strips of Kp pairs */
    int64_t Kp, K, mb;
    const cpu_bf16_packed *pb; /* B packed, or B itself: */
    const char *b;
    ts_dtype bdt;
    int64_t b_rs, b_cs, N;
    int64_t nstrips, tn, tm; /* B's strips; tasks along N and along M */
    float *C;
    int64_t ldc;
    bool acc;
    atomic_int oom;
} run_job;

/* task t: strips [s0, s1) of B by rows [r0, r1) of A's block */
static TS_BF16_TARGET void task_run(void *arg, int64_t t) {
    run_job *j = arg;
    int64_t Kp = j->Kp, tn = t / j->tm, tm = t % j->tm;
    int64_t s0 = tn * j->nstrips / j->tn, s1 = (tn + 1) * j->nstrips / j->tn;
    int64_t mstrips = (j->mb + MR - 1) / MR;
    int64_t r0 = tm * mstrips / j->tm * MR,
            r1 = (tm + 1) * mstrips / j->tm * MR;
    r1 = r1 < j->mb ? r1 : j->mb;
    int64_t n0 = s0 * NR, n1 = s1 * NR < j->N ? s1 * NR : j->N;
    if (s1 <= s0 || r1 <= r0)
        return;
    void *base = NULL;
    uint32_t *buf = NULL;
    if (!j->pb) { /* the largest task's size, so every task reuses it */
        int64_t most = (j->nstrips + j->tn - 1) / j->tn;
        buf = tmp_aligned(most * NR * KCP * 4, &base);
        if (!buf) {
            atomic_store(&j->oom, 1);
            return;
        }
    }
    int64_t bes = (int64_t)ts_dtype_size(j->bdt);
    for (int64_t pc = 0; pc < Kp; pc += KCP) {
        int64_t kpn = Kp - pc < KCP ? Kp - pc : KCP;
        /* strip s of this K block at bs + (s - s0) * sst */
        const uint32_t *bs;
        int64_t sst;
        if (j->pb) {
            bs = j->pb->strips + (s0 * Kp + pc) * NR, sst = Kp * NR;
        } else {
            int64_t k0 = 2 * pc, kc = j->K - k0 < 2 * kpn ? j->K - k0 : 2 * kpn;
            pack_job pj =
                pack_job_of(j->b + (n0 * j->b_cs + k0 * j->b_rs) * bes, j->bdt,
                            j->b_cs, j->b_rs, n1 - n0, kc, NR, buf);
            pack_groups(&pj, 0, (pj.nstrips * NR + 15) / 16);
            bs = buf, sst = kpn * NR;
        }
        bool load = j->acc || pc > 0;
        for (int64_t m0 = r0; m0 < r1; m0 += MC) {
            int64_t m1 = m0 + MC < r1 ? m0 + MC : r1;
            for (int64_t s = s0; s < s1; s++) {
                int64_t n = s * NR;
                int nr = n1 - n < NR ? (int)(n1 - n) : NR;
                for (int64_t m = m0; m < m1; m += MR) {
                    const uint32_t *as = j->ap + ((m / MR) * Kp + pc) * MR;
                    int mr = m1 - m < MR ? (int)(m1 - m) : MR;
                    tile(kpn, as, bs + (s - s0) * sst, j->C + m * j->ldc + n,
                         j->ldc, mr, nr, load, NULL);
                }
            }
        }
    }
    cpu_tmp_free(base);
}

/* the product with B either packed whole (pb) or packed by the tasks */
static TS_BF16_TARGET bool gemm_run(int64_t M, int64_t N, int64_t K,
                                    const void *A, ts_dtype adt, int64_t a_rs,
                                    int64_t a_cs, const void *B, ts_dtype bdt,
                                    int64_t b_rs, int64_t b_cs,
                                    const cpu_bf16_packed *pb, float *C,
                                    int64_t ldc, bool acc) {
    int64_t Kp = (K + 1) / 2;
    /* rows of A packed at a time (whole strips; no thin last block) */
    int64_t MB = A_BLOCK_BYTES / (Kp * 4) / MR * MR;
    MB = MB < TASK_ROWS ? TASK_ROWS : MB;
    MB = M < MB + MB / 4 ? M : MB;
    void *abase = NULL;
    uint32_t *ap = tmp_aligned((MB + MR - 1) / MR * MR * Kp * 4, &abase);
    if (!ap)
        return false;
    /* tasks of about TASK_STRIPS strips of B, a multiple of the threads in
     * number; rows cut too (at least TASK_ROWS a task) when that leaves
     * fewer than two tasks a thread */
    int64_t threads = ts_threads_count();
    int64_t nstrips = (N + NR - 1) / NR;
    int64_t tn = (nstrips + TASK_STRIPS - 1) / TASK_STRIPS;
    tn = (tn + threads - 1) / threads * threads;
    tn = tn > nstrips ? nstrips : tn;
    const char *a8 = A;
    int64_t aes = (int64_t)ts_dtype_size(adt);
    bool ok = true;
    for (int64_t m0 = 0; m0 < M && ok; m0 += MB) {
        int64_t mb = M - m0 < MB ? M - m0 : MB;
        pack_panels(a8 + m0 * a_rs * aes, adt, a_rs, a_cs, mb, K, MR, ap);
        int64_t tm = tn >= 2 * threads ? 1 : (2 * threads + tn - 1) / tn;
        int64_t most = mb / TASK_ROWS > 1 ? mb / TASK_ROWS : 1;
        tm = tm > most ? most : tm;
        run_job j = {.ap = ap,
                     .Kp = Kp,
                     .K = K,
                     .mb = mb,
                     .pb = pb,
                     .b = B,
                     .bdt = bdt,
                     .b_rs = b_rs,
                     .b_cs = b_cs,
                     .N = N,
                     .nstrips = nstrips,
                     .tn = tn,
                     .tm = tm,
                     .C = C + m0 * ldc,
                     .ldc = ldc,
                     .acc = acc};
        atomic_init(&j.oom, 0);
        ts_parallel_chunks(tn * tm, task_run, &j);
        ok = !atomic_load(&j.oom);
    }
    cpu_tmp_free(abase);
    return ok;
}

/* ---- few rows (decode) ----
 * M <= STREAM_ROWS: A packed whole (M x K as bf16 pairs, at most 64 K x 4
 * bytes), then one pass over B's strips, shared out by ranges among the
 * threads (each streams a run of the weights no other thread reads, in
 * address order: the hardware prefetcher follows). A strip (NR columns x
 * Kp pairs: 96 KiB for K = 1024) is read from memory once, by the first
 * group of 8 rows, and from L2 by the others; K is cut into blocks of KCS
 * pairs only where a strip would outgrow L2. (Zen5, one thread, B in L3:
 * whole strips ran 8 x 48 tiles at 360-400 GFLOP/s, blocks of 128 pairs
 * that stay in L1 at 280-330; software prefetching gained nothing.) An
 * unpacked B is packed a strip at a time into a buffer of the thread's
 * (in L2). Same tiles, same chains: the same bits as gemm_run's. */
#define STREAM_ROWS 64
#define KCS         2048

typedef struct {
    const uint32_t *ap; /* A's strips of MR rows, Kp pairs each */
    int64_t M, K, Kp;
    const cpu_bf16_packed *pb; /* B packed, or B itself: */
    const char *b;
    ts_dtype bdt;
    int64_t b_rs, b_cs, N;
    float *C;
    int64_t ldc;
    bool acc;
    atomic_int oom;
} stream_job;

/* B's strips [s0, s1) */
static TS_BF16_TARGET void stream_range(void *arg, int64_t s0, int64_t s1) {
    stream_job *j = arg;
    int64_t Kp = j->Kp, M = j->M;
    void *base = NULL;
    uint32_t *buf = NULL;
    if (!j->pb) {
        buf = tmp_aligned(Kp * NR * 4, &base);
        if (!buf) {
            atomic_store(&j->oom, 1);
            return;
        }
    }
    int64_t bes = (int64_t)ts_dtype_size(j->bdt);
    for (int64_t s = s0; s < s1; s++) {
        int64_t n = s * NR;
        int nr = j->N - n < NR ? (int)(j->N - n) : NR;
        const uint32_t *bs;
        if (j->pb) {
            bs = j->pb->strips + s * Kp * NR;
        } else {
            pack_job pj = pack_job_of(j->b + n * j->b_cs * bes, j->bdt, j->b_cs,
                                      j->b_rs, nr, j->K, NR, buf);
            pack_groups(&pj, 0, NR / 16);
            bs = buf;
        }
        for (int64_t pc = 0; pc < Kp; pc += KCS) {
            int64_t kpn = Kp - pc < KCS ? Kp - pc : KCS;
            bool load = j->acc || pc > 0;
            /* what the first row group reads next (the packed strips lie
             * one after another): fetched while the other groups compute,
             * a share each */
            int64_t groups = (M + MR - 1) / MR;
            const char *next = (const char *)(bs + (pc + kpn) * NR);
            int64_t next_bytes =
                pc + kpn < Kp ? (Kp - pc - kpn < KCS ? Kp - pc - kpn : KCS)
                : s + 1 < s1  ? (Kp < KCS ? Kp : KCS)
                              : 0;
            next_bytes *= NR * 4;
            for (int64_t m = 0; m < M; m += MR) {
                pf_span pf, *pfp = NULL;
                if (j->pb && m > 0 && next_bytes > 0) {
                    int64_t share = next_bytes / (groups - 1), g = m / MR - 1;
                    pf.p = next + g * share;
                    pf.end = next + (g + 1) * share;
                    pf.lines_per_pair = (int)((share / 64 + kpn - 1) / kpn);
                    pfp = &pf;
                }
                tile(kpn, j->ap + ((m / MR) * Kp + pc) * MR, bs + pc * NR,
                     j->C + m * j->ldc + n, j->ldc,
                     M - m < MR ? (int)(M - m) : MR, nr, load, pfp);
            }
        }
    }
    cpu_tmp_free(base);
}

static TS_BF16_TARGET bool
gemm_stream(int64_t M, int64_t N, int64_t K, const void *A, ts_dtype adt,
            int64_t a_rs, int64_t a_cs, const void *B, ts_dtype bdt,
            int64_t b_rs, int64_t b_cs, const cpu_bf16_packed *pb, float *C,
            int64_t ldc, bool acc) {
    int64_t Kp = (K + 1) / 2;
    void *abase = NULL;
    uint32_t *ap = tmp_aligned((M + MR - 1) / MR * MR * Kp * 4, &abase);
    if (!ap)
        return false;
    pack_panels(A, adt, a_rs, a_cs, M, K, MR, ap);
    stream_job j = {.ap = ap,
                    .M = M,
                    .K = K,
                    .Kp = Kp,
                    .pb = pb,
                    .b = B,
                    .bdt = bdt,
                    .b_rs = b_rs,
                    .b_cs = b_cs,
                    .N = N,
                    .C = C,
                    .ldc = ldc,
                    .acc = acc};
    atomic_init(&j.oom, 0);
    /* a range of strips per task: ~256 KiB of B or more (or 1 strip) */
    int64_t grain = ((int64_t)1 << 18) / (Kp * NR * 4) + 1;
    ts_parallel_for((N + NR - 1) / NR, grain, stream_range, &j);
    cpu_tmp_free(abase);
    return !atomic_load(&j.oom);
}

/* K = 0: the sum is empty */
static void empty_product(int64_t M, int64_t N, float *C, int64_t ldc,
                          bool acc) {
    if (!acc)
        for (int64_t m = 0; m < M; m++)
            memset(C + m * ldc, 0, sizeof(float) * (size_t)N);
}

bool cpu_gemm_bf16(cpu_isa isa, int64_t M, int64_t N, int64_t K, const void *A,
                   ts_dtype adt, int64_t a_rs, int64_t a_cs, const void *B,
                   ts_dtype bdt, int64_t b_rs, int64_t b_cs, float *C,
                   int64_t ldc, bool acc) {
    if (isa < CPU_ISA_AVX512_BF16 || !dtype_ok(adt) || !dtype_ok(bdt))
        return false;
    if (M <= 0 || N <= 0)
        return true;
    if (K <= 0) {
        empty_product(M, N, C, ldc, acc);
        return true;
    }
    if (M <= STREAM_ROWS)
        return gemm_stream(M, N, K, A, adt, a_rs, a_cs, B, bdt, b_rs, b_cs,
                           NULL, C, ldc, acc);
    return gemm_run(M, N, K, A, adt, a_rs, a_cs, B, bdt, b_rs, b_cs, NULL, C,
                    ldc, acc);
}

/* memory for bytes of strips: a large block starts on a 2 MiB boundary
 * and its whole 2 MiB pages are asked for as transparent huge pages
 * (where Linux offers them in madvise mode), so that a decode step
 * streaming it walks few page tables and its first fill takes few page
 * faults; the tail stays on small pages (no memory rounded up) */
static uint32_t *strips_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge)
        return aligned_alloc(64, bytes);
    void *p = NULL;
    if (posix_memalign(&p, huge, bytes))
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes / huge * huge, MADV_HUGEPAGE);
#endif
    return p;
}

cpu_bf16_packed *cpu_bf16_pack_b(cpu_isa isa, int64_t K, int64_t N,
                                 const void *B, ts_dtype bdt, int64_t b_rs,
                                 int64_t b_cs) {
    if (isa < CPU_ISA_AVX512_BF16 || !dtype_ok(bdt) || K < 0 || N < 0)
        return NULL;
    cpu_bf16_packed *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->K = K, p->N = N, p->Kp = (K + 1) / 2;
    p->src = B, p->dt = bdt, p->rs = b_rs, p->cs = b_cs;
    size_t bytes = (size_t)((N + NR - 1) / NR * NR * p->Kp) * 4;
    p->bytes = (bytes + 63) / 64 * 64;
    if (bytes > 0) {
        p->strips = strips_alloc(p->bytes);
        if (!p->strips) {
            free(p);
            return NULL;
        }
        pack_panels(B, bdt, b_cs, b_rs, N, K, NR, p->strips);
    }
    return p;
}

void cpu_bf16_packed_free(cpu_bf16_packed *p) {
    if (!p)
        return;
    free(p->strips);
    free(p);
}

int64_t cpu_bf16_packed_k(const cpu_bf16_packed *p) {
    return p->K;
}

int64_t cpu_bf16_packed_n(const cpu_bf16_packed *p) {
    return p->N;
}

size_t cpu_bf16_packed_bytes(const cpu_bf16_packed *p) {
    return p ? sizeof *p + p->bytes : 0;
}

bool cpu_bf16_packed_matches(const cpu_bf16_packed *p, int64_t K, int64_t N,
                             const void *B, ts_dtype bdt, int64_t b_rs,
                             int64_t b_cs) {
    /* a dimension of one has no stride to speak of */
    return p && p->K == K && p->N == N && p->src == B && p->dt == bdt &&
           (K <= 1 || p->rs == b_rs) && (N <= 1 || p->cs == b_cs);
}

bool cpu_gemm_bf16_packed(cpu_isa isa, int64_t M, const void *A, ts_dtype adt,
                          int64_t a_rs, int64_t a_cs, const cpu_bf16_packed *B,
                          float *C, int64_t ldc, bool acc) {
    if (isa < CPU_ISA_AVX512_BF16 || !dtype_ok(adt) || !B)
        return false;
    if (M <= 0 || B->N <= 0)
        return true;
    if (B->K <= 0) {
        empty_product(M, B->N, C, ldc, acc);
        return true;
    }
    if (M <= STREAM_ROWS)
        return gemm_stream(M, B->N, B->K, A, adt, a_rs, a_cs, NULL, TS_BF16, 0,
                           0, B, C, ldc, acc);
    return gemm_run(M, B->N, B->K, A, adt, a_rs, a_cs, NULL, TS_BF16, 0, 0, B,
                    C, ldc, acc);
}

bool cpu_gemm_bf16_blocked(cpu_isa isa, int64_t M, int64_t N, int64_t K,
                           const void *A, ts_dtype adt, int64_t a_rs,
                           int64_t a_cs, const void *B, ts_dtype bdt,
                           int64_t b_rs, int64_t b_cs,
                           const cpu_bf16_packed *pb, float *C, int64_t ldc,
                           bool acc) {
    if (isa < CPU_ISA_AVX512_BF16 || !dtype_ok(adt) ||
        (pb ? pb->K != K || pb->N != N : !dtype_ok(bdt)))
        return false;
    if (M <= 0 || N <= 0)
        return true;
    if (K <= 0) {
        empty_product(M, N, C, ldc, acc);
        return true;
    }
    return gemm_run(M, N, K, A, adt, a_rs, a_cs, pb ? NULL : B, bdt, b_rs, b_cs,
                    pb, C, ldc, acc);
}

/* ---- reference ---- */

static double bf16_value(const char *base, ts_dtype dt, int64_t i) {
    if (dt == TS_BF16)
        return ts_bf16_to_f32(((const uint16_t *)base)[i]);
    return ts_bf16_to_f32(ts_f32_to_bf16(((const float *)base)[i]));
}

bool cpu_gemm_bf16_reference(int64_t M, int64_t N, int64_t K, const void *A,
                             ts_dtype adt, int64_t a_rs, int64_t a_cs,
                             const void *B, ts_dtype bdt, int64_t b_rs,
                             int64_t b_cs, float *C, int64_t ldc, bool acc) {
    if (!dtype_ok(adt) || !dtype_ok(bdt))
        return false;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = acc ? C[m * ldc + n] : 0.0;
            for (int64_t k = 0; k < K; k++)
                s += bf16_value(A, adt, m * a_rs + k * a_cs) *
                     bf16_value(B, bdt, k * b_rs + n * b_cs);
            C[m * ldc + n] = (float)s;
        }
    return true;
}
