#version 460
// moe_combine.comp — out[n, c] = sum over j < K in order, of the slots
// routed somewhere (pos[n K + j] >= 0): w[n, j] Y[pos, c] (w[n, j] = 1
// without w); 0 for a token routed nowhere. The CPU's combine(), the same
// order. x: columns, y: tokens (grid-stride).
#include "common.glsl"

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t Y, outp, pos, w;
    int w_s0, w_s1, has_w, N, C, K, ldY, pad;
};

void main() {
    Params p = Params(pc.params);
    int c = int(gl_GlobalInvocationID.x);
    if (c >= p.C) return;
    BufI32 pos = BufI32(p.pos);
    BufF32 Y = BufF32(p.Y), w = BufF32(p.w);
    for (int n = int(gl_WorkGroupID.y); n < p.N; n += int(gl_NumWorkGroups.y)) {
        float o = 0.0;
        for (int j = 0; j < p.K; j++) {
            int r = pos.v[n * p.K + j];
            if (r < 0) continue;
            float wq = p.has_w != 0 ? w.v[n * p.w_s0 + j * p.w_s1] : 1.0;
            o += wq * Y.v[r * p.ldY + c];
        }
        BufF32(p.outp).v[n * p.C + c] = o;
    }
}
