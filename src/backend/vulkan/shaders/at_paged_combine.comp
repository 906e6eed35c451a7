#version 460
#include "common.glsl"

// at_paged_combine.comp — flash-decoding's reduction (k_attention.c): the
// nsplit partials of each (token, head) from at_paged.comp, (max m, sum l,
// unnormalized output), merged: M = max m, L = sum l e^(m - M),
// out = sum acc e^(m - M) / L. One thread per output element, grid-stride.

layout(local_size_x = 128) in;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc q, k, v, kpool, vpool;
    uint64_t meta, dst, part;
    int H, KV, N, D;
    int nsplit, window, nhb, pad_;
    float scale, softcap;
};

#define NEG_INF (-1.0 / 0.0)

void main() {
    Params P = Params(pc.params);
    const int H = P.H, N = P.N, D = P.D, ns = P.nsplit;
    BufF32 pt = BufF32(P.part);
    const int total = N * H * D, abase = 2 * N * H * ns;
    for (int e = int(gl_GlobalInvocationID.x); e < total;
         e += int(gl_NumWorkGroups.x * gl_WorkGroupSize.x)) {
        int d = e % D, jh = e / D, j = jh / H, h = jh % H;
        int slot0 = jh * ns;
        float M = NEG_INF;
        for (int s = 0; s < ns; s++)
            M = max(M, pt.v[2 * (slot0 + s)]);
        float L = 0.0, o = 0.0;
        for (int s = 0; s < ns; s++) {
            float ms = pt.v[2 * (slot0 + s)];
            float w = ms == NEG_INF ? 0.0 : exp(ms - M);
            L += pt.v[2 * (slot0 + s) + 1] * w;
            o += pt.v[abase + (slot0 + s) * D + d] * w;
        }
        BufF32(P.dst).v[(h * N + j) * D + d] = L > 0.0 ? o * (1.0 / L) : 0.0;
    }
}
