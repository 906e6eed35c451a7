#version 460
// rd_ce_fwd.comp — cross-entropy forward, a workgroup per row of logits
// (N, V): the row's log-sum-exp (saved for the backward) and its loss
// lse - x[target], 0 for ignore_index. A target out of range gives NaN (the
// CPU refuses it; here no error can come back without a wait).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"

layout(local_size_x = 256) in;

// rd_ce_params in k_reduce.c
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc x;      // (N, V)
    TDesc t;      // (N) i32/i64
    TDesc g;      // backward: upstream gradient, () or (N)
    TDesc lse;    // (N) f32
    uint64_t dst; // forward: loss per row; backward: dlogits (N, V)
    uint64_t aux; // backward, mean: the count of rows not ignored (i32)
    int64_t ignore;
    int outdt, N, V, red;
};

shared float sh_m[256];
shared float sh_s[256];

float neg_inf() { return uintBitsToFloat(0xff800000u); }

void wg_max_sum(inout float m, inout float s) {
    float gm = subgroupMax(m);
    float gs = subgroupAdd(s == 0.0 ? 0.0 : s * exp(m - gm));
    if (subgroupElect()) {
        sh_m[gl_SubgroupID] = gm;
        sh_s[gl_SubgroupID] = gs;
    }
    barrier();
    m = neg_inf();
    for (uint i = 0; i < gl_NumSubgroups; i++) m = max(m, sh_m[i]);
    s = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        float si = sh_s[i];
        s += si == 0.0 ? 0.0 : si * exp(sh_m[i] - m);
    }
    barrier();
}

void main() {
    Params p = Params(pc.params);
    TDesc x = p.x;
    int V = p.V, xs1 = x.stride[1];
    int tid = int(gl_LocalInvocationID.x);
    for (int r = int(gl_WorkGroupID.x); r < p.N; r += int(gl_NumWorkGroups.x)) {
        int xo = r * x.stride[0];
        float m = neg_inf(), s = 0.0;
        for (int k = tid; k < V; k += 256) {
            float v = ts_load(x.addr, x.dtype, xo + k * xs1);
            if (v > m) {
                s = s * exp(m - v) + 1.0;
                m = v;
            } else if (v != neg_inf()) {
                s += exp(v - m);
            }
        }
        wg_max_sum(m, s);
        if (tid == 0) {
            float lse = m + log(s);
            BufF32(p.lse.addr).v[r] = lse;
            int64_t tg = ts_load_i64(p.t.addr, p.t.dtype, r * p.t.stride[0]);
            float loss;
            if (tg == p.ignore) loss = 0.0;
            else if (tg < 0 || tg >= V) loss = uintBitsToFloat(0x7fc00000u);
            else loss = lse - ts_load(x.addr, x.dtype, xo + int(tg) * xs1);
            ts_store(p.dst, p.outdt, r, loss);
        }
    }
}
