#version 460
// rd_gather_scatter.comp — gather's backward: acc (the input's shape,
// contiguous f32, zeroed) += g at index along dim. One invocation per line
// of the index along dim (the other dims fixed), adding in index order:
// lines never share an element, so no atomics, and the sums are the CPU's.
#include "common.glsl"

layout(local_size_x = 64) in;

// rd_gather_params in k_reduce.c (x: g; the accumulator's desc in acc)
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc g;
    TDesc ix;
    TDesc acc;
    int dim, lines, pad0, pad1;
};

void main() {
    Params p = Params(pc.params);
    TDesc g = p.g, ix = p.ix, acc = p.acc;
    int dim = p.dim, J = ix.shape[dim], L = acc.shape[dim];
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int l = int(gl_GlobalInvocationID.x); l < p.lines; l += stride) {
        int go = 0, io = 0, ao = 0, q = l;
        for (int d = ix.ndim - 1; d >= 0; d--) {
            if (d == dim) continue;
            int c = q % ix.shape[d];
            q /= ix.shape[d];
            go += c * g.stride[d];
            io += c * ix.stride[d];
            ao += c * acc.stride[d];
        }
        for (int j = 0; j < J; j++) {
            int64_t id = ts_load_i64(ix.addr, ix.dtype, io + j * ix.stride[dim]);
            if (id < 0 || id >= L) continue;
            int a = ao + int(id) * acc.stride[dim];
            BufF32(acc.addr).v[a] += ts_load(g.addr, g.dtype, go + j * g.stride[dim]);
        }
    }
}
