// mm_gemv.comp — the few-rows matmul of k_matmul.c (decoding: M = ROWS <= 8
// rows of activations against a weight): Y (batch, M, N) = A @ B. A
// workgroup owns CN columns of Y; each column's reduction over K is split
// into KS slices, one invocation each, so every B element is read once and
// used by all M rows. The slices' partial sums meet in shared memory.
// B_NFAST picks how invocations map onto B so that neighbours read
// neighbouring memory: 0 when B's K elements are adjacent (x @ W^T with W
// a row-major (N, K) weight: 32 slices x 8 columns), 1 when its N elements
// are (a row-major (K, N) B: 4 slices x 64 columns). Sums in f32.
#version 460
#include "common.glsl"

layout(constant_id = 0) const uint B_NFAST = 0;
layout(constant_id = 1) const uint ROWS = 1; // M, 1..8
layout(local_size_x = 256) in;

// the dtypes (DT_*), so that loads and stores are straight-line code
layout(constant_id = 2) const int A_DT = DT_F32;
layout(constant_id = 3) const int B_DT = DT_F32;
layout(constant_id = 4) const int Y_DT = DT_F32;

// struct mm_params in k_matmul.c (same in mm_tiled.comp)
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t a, b, y;
    int a_dt, b_dt, y_dt;
    int M, N, K;
    int asr, asc, bsr, bsc;
    int nb, batch;
    int a_kfast, b_nfast;
    int bshape[TS_MAX_DIMS];
    int abst[TS_MAX_DIMS];
    int bbst[TS_MAX_DIMS];
};

const uint NT = 256;
const uint KS = B_NFAST != 0 ? 4 : 32; // slices of K per column
const uint CN = NT / KS;               // columns per workgroup
shared float red[8 * NT];              // [row][invocation]

void main() {
    Params p = Params(pc.params);
    uint t = gl_LocalInvocationID.x;
    uint col, ks;
    if (B_NFAST != 0) {
        col = t % CN;
        ks = t / CN;
    } else {
        ks = t % KS;
        col = t / KS;
    }
    uint64_t a = p.a, b = p.b, y = p.y;
    int N = p.N, K = p.K;
    int asr = p.asr, asc = p.asc, bsr = p.bsr, bsc = p.bsc;
    int blocks = (N + int(CN) - 1) / int(CN);

    for (int bi = int(gl_WorkGroupID.z); bi < p.batch;
         bi += int(gl_NumWorkGroups.z)) {
        int ao = 0, bo = 0, rest = bi;
        for (int d = p.nb - 1; d >= 0; d--) {
            int c = rest % p.bshape[d];
            rest /= p.bshape[d];
            ao += c * p.abst[d];
            bo += c * p.bbst[d];
        }
        for (int cb = int(gl_WorkGroupID.x); cb < blocks;
             cb += int(gl_NumWorkGroups.x)) {
            int n = cb * int(CN) + int(col);
            float acc[ROWS];
            for (uint m = 0; m < ROWS; m++)
                acc[m] = 0.0;
            if (n < N)
                for (int k = int(ks); k < K; k += int(KS)) {
                    float bv = ts_load(b, B_DT, bo + k * bsr + n * bsc);
                    for (uint m = 0; m < ROWS; m++)
                        acc[m] = fma(ts_load(a, A_DT,
                                             ao + int(m) * asr + k * asc),
                                     bv, acc[m]);
                }
            for (uint m = 0; m < ROWS; m++)
                red[m * NT + t] = acc[m];
            barrier();
            // one invocation per (row, column): the sum of its KS slices
            for (uint q = t; q < CN * ROWS; q += NT) {
                uint c = q % CN, m = q / CN;
                float s = 0.0;
                for (uint j = 0; j < KS; j++)
                    s += red[m * NT +
                             (B_NFAST != 0 ? j * CN + c : c * KS + j)];
                int nn = cb * int(CN) + int(c);
                if (nn < N)
                    ts_store(y, Y_DT, (bi * int(ROWS) + int(m)) * N + nn, s);
            }
            barrier();
        }
    }
}
