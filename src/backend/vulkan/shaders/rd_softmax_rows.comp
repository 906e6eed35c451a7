#version 460
// rd_softmax_rows.comp — softmax / log_softmax along one dim, a workgroup
// per row: one pass for the row's max and sum of exponentials (online:
// each lane rescales its sum when its max grows), one pass to write.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"

layout(local_size_x = 256) in;

// rd_softmax_params in k_reduce.c
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t x;
    uint64_t y;
    int xdt, ydt, L, xs, ys, nr;
    int rshape[TS_MAX_DIMS];
    int rxst[TS_MAX_DIMS];
    int ryst[TS_MAX_DIMS];
    int rows, log_out;
};

shared float sh_m[256];
shared float sh_s[256];

float neg_inf() { return uintBitsToFloat(0xff800000u); }

// (m, s) of the whole workgroup: max and sum of e^(v - max)
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
    uint64_t x = p.x, y = p.y;
    int xdt = p.xdt, ydt = p.ydt, L = p.L, xs = p.xs, ys = p.ys, nr = p.nr;
    bool log_out = p.log_out != 0;
    int tid = int(gl_LocalInvocationID.x);
    for (int row = int(gl_WorkGroupID.x); row < p.rows; row += int(gl_NumWorkGroups.x)) {
        int xo = 0, yo = 0, q = row;
        for (int d = nr - 1; d >= 0; d--) {
            int sz = p.rshape[d];
            int c = q % sz;
            q /= sz;
            xo += c * p.rxst[d];
            yo += c * p.ryst[d];
        }
        float m = neg_inf(), s = 0.0;
        for (int k = tid; k < L; k += 256) {
            float v = ts_load(x, xdt, xo + k * xs);
            if (v > m) {
                s = s * exp(m - v) + 1.0;
                m = v;
            } else if (v != neg_inf()) {
                s += exp(v - m); // NaN stays NaN, as the CPU's sum
            }
        }
        wg_max_sum(m, s);
        if (m == neg_inf()) m = 0.0; // all -inf: no inf - inf (CPU)
        float inv = 1.0 / s, lse = m + log(s);
        for (int k = tid; k < L; k += 256) {
            float v = ts_load(x, xdt, xo + k * xs);
            ts_store(y, ydt, yo + k * ys, log_out ? v - lse : exp(v - m) * inv);
        }
    }
}
