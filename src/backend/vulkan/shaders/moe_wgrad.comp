#version 460
// moe_wgrad.comp — an expert weight's gradient (k_moe.c's backward):
//   out[e, j, k] = sum over expert e's rows p, in row order: P[p, j] Q[p, k]
// P, Q: rows gathered from an (N, ...) tensor (gather: row p is token
// slot_of[p] / K) or rows p of an intermediate; padding rows read 0. One
// workgroup owns a 64 x 64 tile of one expert's gradient and walks all of
// that expert's rows 16 at a time, so the sums need no atomics and do not
// depend on the schedule. 16 x 16 invocations, 4 x 4 outputs each.
#include "common.glsl"

layout(local_size_x = 256) in;

const int TJ = 64, TR = 16;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t src[2], outp, slot_of, pstart;
    int gather[2], s0[2], s1[2];
    int J, Kd, K, E, jt, kt;
};

shared float S[2][TR * TJ]; // [0]: P rows, [1]: Q rows, (row, col)
shared int slot[TR];

void load(Params p, int i, int p0, int c0, int n, int lid) {
    uint64_t a = p.src[i];
    int st0 = p.s0[i], st1 = p.s1[i];
    for (int q = lid; q < TR * TJ; q += 256) {
        int r = q / TJ, c = q - r * TJ, s = slot[r];
        float v = 0.0;
        if (s >= 0 && c0 + c < n) {
            int row = p.gather[i] != 0 ? s / p.K : p0 + r;
            v = BufF32(a).v[row * st0 + (c0 + c) * st1];
        }
        S[i][q] = v;
    }
}

void main() {
    Params p = Params(pc.params);
    int lid = int(gl_LocalInvocationID.x);
    int tx = lid & 15, ty = lid >> 4;
    BufI32 slots = BufI32(p.slot_of), ps = BufI32(p.pstart);
    int per = p.jt * p.kt;
    for (int g = int(gl_WorkGroupID.x); g < p.E * per;
         g += int(gl_NumWorkGroups.x)) {
        int e = g / per, rem = g - e * per;
        int j0 = (rem / p.kt) * TJ, k0 = (rem - (rem / p.kt) * p.kt) * TJ;
        int r0 = ps.v[e], r1 = ps.v[e + 1];
        float acc[4][4];
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++) acc[a][b] = 0.0;
        for (int p0 = r0; p0 < r1; p0 += TR) {
            if (lid < TR) slot[lid] = slots.v[p0 + lid];
            barrier();
            load(p, 0, p0, j0, p.J, lid);
            load(p, 1, p0, k0, p.Kd, lid);
            barrier();
            for (int r = 0; r < TR; r++) {
                float pv[4], qv[4];
                for (int a = 0; a < 4; a++) pv[a] = S[0][r * TJ + ty + 16 * a];
                for (int b = 0; b < 4; b++) qv[b] = S[1][r * TJ + tx + 16 * b];
                for (int a = 0; a < 4; a++)
                    for (int b = 0; b < 4; b++)
                        acc[a][b] = fma(pv[a], qv[b], acc[a][b]);
            }
            barrier();
        }
        BufF32 o = BufF32(p.outp);
        for (int a = 0; a < 4; a++) {
            int j = j0 + ty + 16 * a;
            if (j >= p.J) continue;
            for (int b = 0; b < 4; b++) {
                int k = k0 + tx + 16 * b;
                if (k < p.Kd) o.v[(e * p.J + j) * p.Kd + k] = acc[a][b];
            }
        }
    }
}
