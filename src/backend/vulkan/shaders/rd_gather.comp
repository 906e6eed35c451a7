#version 460
// rd_gather.comp — out (index's shape) = x at index along dim (torch's
// gather), one invocation per output element, copied bit for bit. An index
// out of range gives 0 (the CPU refuses it; no error can come back here
// without a wait).
#include "common.glsl"

layout(local_size_x = 256) in;

// rd_gather_params in k_reduce.c
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc x;
    TDesc ix;
    uint64_t dst;
    int dim, es, total, pad;
};

void main() {
    Params p = Params(pc.params);
    TDesc x = p.x, ix = p.ix;
    int dim = p.dim, es = p.es, L = x.shape[dim];
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int e = int(gl_GlobalInvocationID.x); e < p.total; e += stride) {
        int xo = 0, io = 0, q = e;
        for (int d = ix.ndim - 1; d >= 0; d--) {
            int c = q % ix.shape[d];
            q /= ix.shape[d];
            io += c * ix.stride[d];
            if (d != dim) xo += c * x.stride[d];
        }
        int64_t id = ts_load_i64(ix.addr, ix.dtype, io);
        bool ok = id >= 0 && id < L;
        xo = ok ? xo + int(id) * x.stride[dim] : 0;
        if (es == 4) BufU32(p.dst).v[e] = ok ? BufU32(x.addr).v[xo] : 0u;
        else if (es == 2) BufU16(p.dst).v[e] = ok ? BufU16(x.addr).v[xo] : uint16_t(0);
        else BufI64(p.dst).v[e] = ok ? BufI64(x.addr).v[xo] : int64_t(0);
    }
}
