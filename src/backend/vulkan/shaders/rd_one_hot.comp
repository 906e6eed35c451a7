#version 460
// rd_one_hot.comp — out (cnt, classes) f32: 1 where the class is idx's
// element, 0 elsewhere, one invocation per output element.
#include "common.glsl"

layout(local_size_x = 256) in;

// rd_one_hot_params in k_reduce.c
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc ix; // coalesced
    uint64_t dst;
    int cnt, classes;
};

void main() {
    Params p = Params(pc.params);
    TDesc ix = p.ix;
    int classes = p.classes, total = p.cnt * classes;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int e = int(gl_GlobalInvocationID.x); e < total; e += stride) {
        int i = e / classes, c = e - i * classes;
        int io = ix.ndim == 1 ? i * ix.stride[0] : ts_offset(ix, i);
        int64_t id = ts_load_i64(ix.addr, ix.dtype, io);
        BufF32(p.dst).v[e] = id == int64_t(c) ? 1.0 : 0.0;
    }
}
