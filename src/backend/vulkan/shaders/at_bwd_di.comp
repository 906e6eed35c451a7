#version 460
#include "common.glsl"

// at_bwd_di.comp — the attention backward's row terms (k_attention.c):
// di[b, h, t] = sum_d dout[b, h, t, d] out[b, h, t, d], f32, contiguous
// (B, H, T). 16 rows per workgroup, 8 threads per row, summed in a fixed
// order (deterministic).

layout(local_size_x = 128) in;
const uint WG = 128, R = 8, ROWS = WG / R;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc g, o; // (B, H, T, D)
    uint64_t di;
    int H, T, D, nrows;
};

shared float part_sum[WG];

void main() {
    Params P = Params(pc.params);
    const uint tid = gl_LocalInvocationID.x, r = tid / R, part = tid % R;
    TDesc g = P.g, o = P.o;
    const int H = P.H, T = P.T, D = P.D, nrows = P.nrows;
    const int nblocks = (nrows + int(ROWS) - 1) / int(ROWS);
    for (int blk = int(gl_WorkGroupID.x); blk < nblocks;
         blk += int(gl_NumWorkGroups.x)) {
        int row = blk * int(ROWS) + int(r);
        float s = 0.0;
        if (row < nrows) {
            int t = row % T, h = row / T % H, b = row / (T * H);
            int gb = b * g.stride[0] + h * g.stride[1] + t * g.stride[2];
            int ob = b * o.stride[0] + h * o.stride[1] + t * o.stride[2];
            for (int d = int(part); d < D; d += int(R))
                s += ts_load(g.addr, g.dtype, gb + d * g.stride[3]) *
                     ts_load(o.addr, o.dtype, ob + d * o.stride[3]);
        }
        part_sum[tid] = s;
        barrier();
        if (part == 0 && row < nrows) {
            float tot = 0.0;
            for (uint i = 0; i < R; i++)
                tot += part_sum[r * R + i];
            BufF32(P.di).v[row] = tot;
        }
        barrier();
    }
}
