#version 460
// rd_softmax_small.comp — softmax / log_softmax along a short dim, one
// invocation per row (a workgroup per row would idle): three passes over
// the row, as the CPU.
#include "common.glsl"

layout(local_size_x = 64) in;

// rd_softmax_params in k_reduce.c (as rd_softmax_rows.comp)
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t x;
    uint64_t y;
    int xdt, ydt, L, xs, ys, nr;
    int rshape[TS_MAX_DIMS];
    int rxst[TS_MAX_DIMS];
    int ryst[TS_MAX_DIMS];
    int rows, log_out;
};

void main() {
    Params p = Params(pc.params);
    uint64_t x = p.x, y = p.y;
    int xdt = p.xdt, ydt = p.ydt, L = p.L, xs = p.xs, ys = p.ys, nr = p.nr;
    bool log_out = p.log_out != 0;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int row = int(gl_GlobalInvocationID.x); row < p.rows; row += stride) {
        int xo = 0, yo = 0, q = row;
        for (int d = nr - 1; d >= 0; d--) {
            int sz = p.rshape[d];
            int c = q % sz;
            q /= sz;
            xo += c * p.rxst[d];
            yo += c * p.ryst[d];
        }
        float m = uintBitsToFloat(0xff800000u);
        for (int k = 0; k < L; k++) {
            float v = ts_load(x, xdt, xo + k * xs);
            m = v > m ? v : m; // NaN skipped here, caught by the sum
        }
        if (m == uintBitsToFloat(0xff800000u)) m = 0.0; // all -inf (CPU)
        float s = 0.0;
        for (int k = 0; k < L; k++) s += exp(ts_load(x, xdt, xo + k * xs) - m);
        float inv = 1.0 / s, lse = m + log(s);
        for (int k = 0; k < L; k++) {
            float v = ts_load(x, xdt, xo + k * xs);
            ts_store(y, ydt, yo + k * ys, log_out ? v - lse : exp(v - m) * inv);
        }
    }
}
