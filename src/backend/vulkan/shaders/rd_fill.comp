#version 460
// rd_fill.comp — n f32 at addr set to value (a scatter's zeroed
// accumulator), or, with src != 0, n contiguous f32 from src stored as
// dtype dt at addr (an f32 accumulator into a bf16 / f16 result).
#include "common.glsl"

layout(local_size_x = 256) in;

// rd_fill_params in k_reduce.c
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t addr;
    uint64_t src;
    int n, dt;
    float value;
    int pad;
};

void main() {
    Params p = Params(pc.params);
    uint64_t addr = p.addr, src = p.src;
    int n = p.n, dt = p.dt;
    float value = p.value;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < n; i += stride)
        ts_store(addr, dt, i, src != 0 ? BufF32(src).v[i] : value);
}
