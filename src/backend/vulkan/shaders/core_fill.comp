#version 460
// core_fill — count elements of 2, 4 or 8 bytes set to one bit pattern
// (ts_zeros, ts_full, constants the compiler folded) on the device.
#include "common.glsl"
layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t addr;
    uint64_t value;
    uint count;
    uint elem_bytes;
};
void main() {
    Params p = Params(pc.params);
    uint n = p.count, eb = p.elem_bytes;
    uint64_t v = p.value;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += gl_NumWorkGroups.x * 256u) {
        if (eb == 8u) BufI64(p.addr).v[i] = int64_t(v);
        else if (eb == 4u) BufU32(p.addr).v[i] = uint(v);
        else BufU16(p.addr).v[i] = uint16_t(v);
    }
}
