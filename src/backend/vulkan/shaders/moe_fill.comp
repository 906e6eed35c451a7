#version 460
// moe_fill.comp — n f32 at addr set to 0: the parts of the experts
// backward's packed gradient that no kernel writes (k_moe.c).
#include "common.glsl"

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t addr;
    int n, pad;
};

void main() {
    Params p = Params(pc.params);
    for (int i = int(gl_GlobalInvocationID.x); i < p.n;
         i += int(gl_NumWorkGroups.x * 256))
        BufF32(p.addr).v[i] = 0.0;
}
