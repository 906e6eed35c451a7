#version 460
// moe_gemm.comp — the experts MLP's matrix products over tiles of TM rows
// that each belong to one expert (moe_route.comp's padded row order):
//   acc_i[p, j] = sum_k A_i[p, k] B_i[e, j, k]    (i < nprod, p a row of
//                                                  expert e's tile)
// A_i: rows gathered from an (N, ...) tensor (a_gather: row p is token
// slot_of[p] / K) or rows p of an intermediate; padding rows (slot_of -1)
// read 0 and are not written (a_gather[0] decides for both A_i). B_i: an
// expert weight, f32 or bf16, by any strides (se, sj, sk): the same
// shader does W x and W^T x. Epilogue:
//   mode 0: out1 = acc1              mode 1: out1 = acc1 + acc2
//   mode 2: out1 = act(acc1) * acc2  mode 3: out1 = act(acc1)
//   mode 4: out1 = acc1, out2 = acc2
// Workgroup: 16 x 16 invocations, an output tile of TM x 64, each
// invocation TM/16 x 4 of it; k in steps of 16 through shared memory.
#include "common.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const int TM = 64; // 16 or 64

const int TN = 64, TK = 16, RN = 4, RM_MAX = 4;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t a[2], b[2], outp[2], slot_of, tile_expert;
    int a_gather[2], a_s0[2], a_s1[2];
    int b_dt[2], b_se[2], b_sj[2], b_sk[2];
    int J, Kd, K, T_max, out_ld, nprod, mode, act;
};

shared float As[2][TK * 64];
shared float Bs[2][TK * TN];
shared int rowsrc[64]; // the row of A_i to read (gathered or not), -1: pad

// ---- activations, as ew_fused.comp computes them (ts_act) ----
float moe_erfc(float x) {
    float z = abs(x);
    float t = 1.0 / (1.0 + 0.5 * z);
    float q = 0.17087277;
    q = q * t - 0.82215223;
    q = q * t + 1.48851587;
    q = q * t - 1.13520398;
    q = q * t + 0.27886807;
    q = q * t - 0.18628806;
    q = q * t + 0.09678418;
    q = q * t + 0.37409196;
    q = q * t + 1.00002368;
    q = q * t - 1.26551223;
    float r = t * exp(-z * z + q);
    return x >= 0.0 ? r : 2.0 - r;
}
float moe_act(int act, float x) {
    if (act == 0) return x / (1.0 + exp(-x)); // silu
    if (act == 1) { // gelu, tanh approximation: x sigmoid(2u)
        const float k2 = 2.0 * 0.7978845608028654, c = 0.044715;
        return x * (1.0 / (1.0 + exp(-(k2 * x) * (c * x * x + 1.0))));
    }
    return x * (0.5 * moe_erfc(-x * 0.70710678118654752)); // gelu, erf
}

void load_a(Params p, int i, int k0, int lid) {
    uint64_t a = p.a[i];
    int s0 = p.a_s0[i], s1 = p.a_s1[i];
    for (int q = lid; q < TM * TK; q += 256) {
        int r = q / TK, kk = q - r * TK, k = k0 + kk, src = rowsrc[r];
        float v = 0.0;
        if (src >= 0 && k < p.Kd)
            v = BufF32(a).v[src * s0 + k * s1];
        As[i][kk * TM + r] = v;
    }
}

void load_b(Params p, int i, int e, int j0, int k0, int lid) {
    uint64_t b = p.b[i];
    int dt = p.b_dt[i], sj = p.b_sj[i], sk = p.b_sk[i];
    int base = e * p.b_se[i];
    bool jfast = sj == 1 && sk != 1; // read along the contiguous dim
    for (int q = lid; q < TN * TK; q += 256) {
        int j, kk;
        if (jfast) {
            kk = q / TN;
            j = q - kk * TN;
        } else {
            j = q / TK;
            kk = q - j * TK;
        }
        float v = 0.0;
        if (j0 + j < p.J && k0 + kk < p.Kd)
            v = ts_load(b, dt, base + (j0 + j) * sj + (k0 + kk) * sk);
        Bs[i][kk * TN + j] = v;
    }
}

void main() {
    Params p = Params(pc.params);
    int lid = int(gl_LocalInvocationID.x);
    int tx = lid & 15, ty = lid >> 4, RM = TM / 16;
    int j0 = int(gl_WorkGroupID.y) * TN;
    BufI32 slots = BufI32(p.slot_of), tiles = BufI32(p.tile_expert);
    for (int t = int(gl_WorkGroupID.x); t < p.T_max;
         t += int(gl_NumWorkGroups.x)) {
        int e = tiles.v[t];
        if (e < 0) continue; // uniform: the whole tile
        if (lid < TM) {
            int s = slots.v[t * TM + lid];
            rowsrc[lid] = s < 0 ? -1 : p.a_gather[0] != 0 ? s / p.K : t * TM + lid;
        }
        barrier();
        float acc[2][RM_MAX][RN];
        for (int i = 0; i < RM_MAX; i++)
            for (int jj = 0; jj < RN; jj++) acc[0][i][jj] = acc[1][i][jj] = 0.0;
        for (int k0 = 0; k0 < p.Kd; k0 += TK) {
            for (int i = 0; i < p.nprod; i++) {
                load_a(p, i, k0, lid);
                load_b(p, i, e, j0, k0, lid);
            }
            barrier();
            for (int i = 0; i < p.nprod; i++)
                for (int kk = 0; kk < TK; kk++) {
                    float av[RM_MAX], bv[RN];
                    for (int r = 0; r < RM; r++) av[r] = As[i][kk * TM + ty + 16 * r];
                    for (int jj = 0; jj < RN; jj++) bv[jj] = Bs[i][kk * TN + tx + 16 * jj];
                    for (int r = 0; r < RM; r++)
                        for (int jj = 0; jj < RN; jj++)
                            acc[i][r][jj] = fma(av[r], bv[jj], acc[i][r][jj]);
                }
            barrier();
        }
        BufF32 o1 = BufF32(p.outp[0]), o2 = BufF32(p.outp[1]);
        for (int r = 0; r < RM; r++) {
            int row = ty + 16 * r;
            if (rowsrc[row] < 0) continue;
            int at = (t * TM + row) * p.out_ld;
            for (int jj = 0; jj < RN; jj++) {
                int j = j0 + tx + 16 * jj;
                if (j >= p.J) continue;
                float x = acc[0][r][jj], y = acc[1][r][jj];
                if (p.mode == 0 || p.mode == 4) o1.v[at + j] = x;
                else if (p.mode == 1) o1.v[at + j] = x + y;
                else if (p.mode == 2) o1.v[at + j] = moe_act(p.act, x) * y;
                else o1.v[at + j] = moe_act(p.act, x);
                if (p.mode == 4) o2.v[at + j] = y;
            }
        }
        barrier(); // rowsrc is rewritten by the next tile
    }
}
