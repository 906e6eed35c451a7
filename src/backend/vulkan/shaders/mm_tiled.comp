// mm_tiled.comp — Y (batch, M, N) = A (batch, M, K) @ B (batch, K, N), the
// general tiled GEMM of k_matmul.c. A workgroup computes a TILE_M x TILE_N
// tile of Y through shared-memory tiles of A and B, TILE_K deep; each
// invocation holds a REG_M x REG_N register block (rows ty + i*TILE_M/REG_M,
// columns tx + j*TILE_N/REG_N: neighbours read neighbouring shared words
// and write neighbouring Y columns). A and B are read through their own strides (a
// transposed weight is a view, not a copy), as f32/bf16/f16, summed in f32;
// Y is contiguous, stored in its dtype. Edges are bounds-checked (zero
// padding); grid-stride over tiles and batch elements.
#version 460
#include "common.glsl"

layout(constant_id = 0) const uint TILE_M = 64;
layout(constant_id = 1) const uint TILE_N = 64;
layout(constant_id = 2) const uint TILE_K = 16;
// must be (TILE_M / REG_M) * (TILE_N / REG_N): k_matmul.c sets it
layout(local_size_x_id = 3) in;
// each invocation's register block of Y: REG_M x REG_N (one constant for
// both: vk_launch takes 8)
layout(constant_id = 4) const uint REG = 4;
const uint REG_M = REG, REG_N = REG;

// the dtypes (DT_*), so that loads and stores are straight-line code
layout(constant_id = 5) const int A_DT = DT_F32;
layout(constant_id = 6) const int B_DT = DT_F32;
layout(constant_id = 7) const int Y_DT = DT_F32;

// struct mm_params in k_matmul.c (same in mm_gemv.comp)
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t a, b, y;
    int a_dt, b_dt, y_dt;
    int M, N, K;
    int asr, asc, bsr, bsc; // strides of the matrix dims
    int nb, batch;          // batch dims of Y, their product
    int a_kfast, b_nfast;   // which index to run along when loading tiles
    int bshape[TS_MAX_DIMS]; // Y's batch dims
    int abst[TS_MAX_DIMS];   // A's and B's strides over them (0: broadcast)
    int bbst[TS_MAX_DIMS];
};

// padded rows: a column of a tile written by neighbouring invocations
// (k fastest) lands in different banks
const uint LDA = TILE_M + 1;
const uint LDB = TILE_N + 1;
shared float As[TILE_K * LDA]; // [k][m]
shared float Bs[TILE_K * LDB]; // [k][n]

void main() {
    Params p = Params(pc.params);
    const uint SM = TILE_M / REG_M, SN = TILE_N / REG_N;
    const uint NT = SM * SN;
    uint t = gl_LocalInvocationID.x;
    uint tx = t % SN, ty = t / SN;
    uint64_t a = p.a, b = p.b, y = p.y;
    int M = p.M, N = p.N, K = p.K;
    int asr = p.asr, asc = p.asc, bsr = p.bsr, bsc = p.bsc;
    bool a_kfast = p.a_kfast != 0, b_nfast = p.b_nfast != 0;
    int tilesM = (M + int(TILE_M) - 1) / int(TILE_M);
    int tilesN = (N + int(TILE_N) - 1) / int(TILE_N);

    for (int bi = int(gl_WorkGroupID.z); bi < p.batch;
         bi += int(gl_NumWorkGroups.z)) {
        int ao = 0, bo = 0, rest = bi;
        for (int d = p.nb - 1; d >= 0; d--) {
            int c = rest % p.bshape[d];
            rest /= p.bshape[d];
            ao += c * p.abst[d];
            bo += c * p.bbst[d];
        }
        for (int tm = int(gl_WorkGroupID.y); tm < tilesM;
             tm += int(gl_NumWorkGroups.y))
            for (int tn = int(gl_WorkGroupID.x); tn < tilesN;
                 tn += int(gl_NumWorkGroups.x)) {
                int m0 = tm * int(TILE_M), n0 = tn * int(TILE_N);
                float acc[REG_M][REG_N];
                for (uint i = 0; i < REG_M; i++)
                    for (uint j = 0; j < REG_N; j++)
                        acc[i][j] = 0.0;
                for (int k0 = 0; k0 < K; k0 += int(TILE_K)) {
                    for (uint i = t; i < TILE_M * TILE_K; i += NT) {
                        uint mm, kk;
                        if (a_kfast) {
                            kk = i % TILE_K;
                            mm = i / TILE_K;
                        } else {
                            mm = i % TILE_M;
                            kk = i / TILE_M;
                        }
                        int gm = m0 + int(mm), gk = k0 + int(kk);
                        float v = 0.0;
                        if (gm < M && gk < K)
                            v = ts_load(a, A_DT, ao + gm * asr + gk * asc);
                        As[kk * LDA + mm] = v;
                    }
                    for (uint i = t; i < TILE_N * TILE_K; i += NT) {
                        uint nn, kk;
                        if (b_nfast) {
                            nn = i % TILE_N;
                            kk = i / TILE_N;
                        } else {
                            kk = i % TILE_K;
                            nn = i / TILE_K;
                        }
                        int gn = n0 + int(nn), gk = k0 + int(kk);
                        float v = 0.0;
                        if (gn < N && gk < K)
                            v = ts_load(b, B_DT, bo + gk * bsr + gn * bsc);
                        Bs[kk * LDB + nn] = v;
                    }
                    barrier();
                    for (uint kk = 0; kk < TILE_K; kk++) {
                        float av[REG_M], bv[REG_N];
                        for (uint i = 0; i < REG_M; i++)
                            av[i] = As[kk * LDA + ty + i * SM];
                        for (uint j = 0; j < REG_N; j++)
                            bv[j] = Bs[kk * LDB + tx + j * SN];
                        for (uint i = 0; i < REG_M; i++)
                            for (uint j = 0; j < REG_N; j++)
                                acc[i][j] = fma(av[i], bv[j], acc[i][j]);
                    }
                    barrier();
                }
                int yo = bi * M * N;
                for (uint i = 0; i < REG_M; i++) {
                    int gm = m0 + int(ty + i * SM);
                    if (gm >= M)
                        continue;
                    for (uint j = 0; j < REG_N; j++) {
                        int gn = n0 + int(tx + j * SN);
                        if (gn < N)
                            ts_store(y, Y_DT, yo + gm * N + gn, acc[i][j]);
                    }
                }
            }
    }
}
