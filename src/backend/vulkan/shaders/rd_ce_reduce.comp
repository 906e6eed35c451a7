#version 460
// rd_ce_reduce.comp — one workgroup: the cross-entropy's per-row losses
// (f32, N) summed, and the rows not ignored counted; writes the sum or the
// mean (0/0 = NaN when every row is ignored, as PyTorch), or, with
// red < 0, only the count (an i32, for the backward of a mean).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"

layout(local_size_x = 256) in;

// rd_ce_params in k_reduce.c (as rd_ce_fwd.comp); lse.addr: the losses
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc x;
    TDesc t;
    TDesc g;
    TDesc lse;
    uint64_t dst;
    uint64_t aux;
    int64_t ignore;
    int outdt, N, V, red;
};

#define RED_MEAN 0
#define RED_SUM 1

shared float sh_v[256];
shared int sh_c[256];

void main() {
    Params p = Params(pc.params);
    int tid = int(gl_LocalInvocationID.x);
    bool only_count = p.red < 0;
    precise float acc = 0.0, comp = 0.0;
    int cnt = 0;
    for (int r = tid; r < p.N; r += 256) {
        cnt += ts_load_i64(p.t.addr, p.t.dtype, r * p.t.stride[0]) != p.ignore ? 1 : 0;
        if (only_count) continue;
        precise float yv = BufF32(p.lse.addr).v[r] - comp;
        precise float t = acc + yv;
        bool finite = (floatBitsToUint(t) & 0x7f800000u) != 0x7f800000u;
        comp = finite ? (t - acc) - yv : 0.0; // no inf - inf
        acc = t;
    }
    float sg = subgroupAdd(float(acc));
    int cg = subgroupAdd(cnt);
    if (subgroupElect()) {
        sh_v[gl_SubgroupID] = sg;
        sh_c[gl_SubgroupID] = cg;
    }
    barrier();
    if (tid == 0) {
        float s = 0.0;
        int c = 0;
        for (uint i = 0; i < gl_NumSubgroups; i++) {
            s += sh_v[i];
            c += sh_c[i];
        }
        if (only_count) BufI32(p.dst).v[0] = c;
        else ts_store(p.dst, p.outdt, 0, p.red == RED_SUM ? s : s / float(c));
    }
}
