#version 460
// rd_embedding.comp — out (N, C) = weight (V, C) rows at ids, one
// invocation per output element, copied bit for bit (any element size). An
// id out of [0, V) gives a zero row (the CPU refuses it; here no error can
// come back without a wait).
#include "common.glsl"

layout(local_size_x = 256) in;

// rd_embedding_params in k_reduce.c
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc w;   // (V, C)
    TDesc ids; // coalesced
    uint64_t dst;
    int N, C, es, pad;
};

void main() {
    Params p = Params(pc.params);
    TDesc w = p.w, ids = p.ids;
    int C = p.C, es = p.es, V = w.shape[0];
    int total = p.N * C;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int e = int(gl_GlobalInvocationID.x); e < total; e += stride) {
        int i = e / C, c = e - i * C;
        int io = ids.ndim == 1 ? i * ids.stride[0] : ts_offset(ids, i);
        int64_t id = ts_load_i64(ids.addr, ids.dtype, io);
        bool ok = id >= 0 && id < V;
        int src = ok ? int(id) * w.stride[0] + c * w.stride[1] : 0;
        if (es == 4) BufU32(p.dst).v[e] = ok ? BufU32(w.addr).v[src] : 0u;
        else if (es == 2) BufU16(p.dst).v[e] = ok ? BufU16(w.addr).v[src] : uint16_t(0);
        else BufI64(p.dst).v[e] = ok ? BufI64(w.addr).v[src] : int64_t(0);
    }
}
