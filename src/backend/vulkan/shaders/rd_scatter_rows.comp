#version 460
// rd_scatter_rows.comp — acc (V, C) f32 rows at ids += src rows (the
// embedding's gradient, index_add_). Deterministic, without atomics: each
// invocation owns one column c of one range of vocabulary rows and walks
// every id in order, adding the rows whose id falls in its range. So each
// element is summed in token order, as the CPU (bit for bit), and the
// (column, range) grid keeps enough invocations busy even when C is small;
// the price is that each invocation reads all N ids (cheap, shared through
// the cache) — O(N * C * ranges) id reads for O(N * C) adds.
#include "common.glsl"

layout(local_size_x = 64) in;

// rd_scatter_params in k_reduce.c
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc src;  // its leading dims (rows), coalesced; columns by src_cs
    TDesc ids;  // coalesced
    uint64_t acc;
    int N, C, V, src_cs, ranges, vchunk;
};

void main() {
    Params p = Params(pc.params);
    TDesc src = p.src, ids = p.ids;
    int N = p.N, C = p.C, cs = p.src_cs, vchunk = p.vchunk;
    int items = C * p.ranges;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    BufF32 acc = BufF32(p.acc);
    for (int item = int(gl_GlobalInvocationID.x); item < items; item += stride) {
        int rg = item / C, c = item - rg * C;
        int v0 = rg * vchunk, v1 = min(p.V, v0 + vchunk);
        for (int i = 0; i < N; i++) {
            int io = ids.ndim == 1 ? i * ids.stride[0] : ts_offset(ids, i);
            int64_t id = ts_load_i64(ids.addr, ids.dtype, io);
            if (id < v0 || id >= v1) continue;
            int so = src.ndim == 1 ? i * src.stride[0] : ts_offset(src, i);
            int a = int(id) * C + c;
            acc.v[a] = acc.v[a] + ts_load(src.addr, src.dtype, so + c * cs);
        }
    }
}
