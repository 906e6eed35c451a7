#version 460
// rd_reduce_tree.comp — sum / max / argmax with one workgroup per item: an
// item is one slice of one output's reduced index space (k_reduce.c cuts a
// long reduction into slices whose partials a second pass reduces). Used
// when the reduced elements are contiguous, or few outputs share much work.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_vote : require
#include "common.glsl"

layout(local_size_x = 256) in;

// rd_reduce_params in k_reduce.c
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t x;
    uint64_t y;
    int xdt, ydt, nk, nr;
    int kshape[TS_MAX_DIMS];
    int kst[TS_MAX_DIMS];
    int rshape[TS_MAX_DIMS];
    int rst[TS_MAX_DIMS];
    int kcount, rcount, slices, chunk;
    int op;
    float scale;
};
#define OP_SUM 0
#define OP_MAX 1
#define OP_ARGMAX 2
#define NONE 0x7fffffff

shared float sh_v[256];
shared int sh_i[256];
shared int sh_n[256];

bool is_nan(float v) { return (floatBitsToUint(v) & 0x7fffffffu) > 0x7f800000u; }
bool is_finite(float v) { return (floatBitsToUint(v) & 0x7f800000u) != 0x7f800000u; }
float neg_inf() { return uintBitsToFloat(0xff800000u); }
float qnan() { return uintBitsToFloat(0x7fc00000u); }

// offset of output o / of reduced element r, through the coalesced dims
int kept_offset(Params p, int o) {
    int off = 0;
    for (int d = p.nk - 1; d >= 0; d--) {
        int s = p.kshape[d];
        int c = o % s;
        o /= s;
        off += c * p.kst[d];
    }
    return off;
}
int red_offset(Params p, int r) {
    int off = 0;
    for (int d = p.nr - 1; d >= 0; d--) {
        int s = p.rshape[d];
        int c = r % s;
        r /= s;
        off += c * p.rst[d];
    }
    return off;
}

float wg_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) sh_v[gl_SubgroupID] = v;
    barrier();
    float r = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) r += sh_v[i];
    barrier();
    return r;
}

// max of the non-NaN values; NaN when any lane saw one (as the CPU)
float wg_max(float v, bool nan) {
    v = subgroupMax(v);
    bool any_nan = subgroupAny(nan);
    if (subgroupElect()) {
        sh_v[gl_SubgroupID] = v;
        sh_n[gl_SubgroupID] = any_nan ? 1 : 0;
    }
    barrier();
    float r = neg_inf();
    bool n = false;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        r = max(r, sh_v[i]);
        n = n || sh_n[i] != 0;
    }
    barrier();
    return n ? qnan() : r;
}

// argmax: the first NaN, else the first of the largest values
bool better(float va, int ia, bool na, float vb, int ib, bool nb) {
    if (ia == NONE) return false;
    if (ib == NONE) return true;
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

int wg_argmax(float v, int i, bool nan) {
    uint t = gl_LocalInvocationID.x;
    sh_v[t] = v;
    sh_i[t] = i;
    sh_n[t] = nan ? 1 : 0;
    barrier();
    for (uint s = 128; s > 0; s >>= 1) {
        if (t < s &&
            better(sh_v[t + s], sh_i[t + s], sh_n[t + s] != 0, sh_v[t], sh_i[t], sh_n[t] != 0)) {
            sh_v[t] = sh_v[t + s];
            sh_i[t] = sh_i[t + s];
            sh_n[t] = sh_n[t + s];
        }
        barrier();
    }
    int r = sh_i[0];
    barrier();
    return r;
}

void main() {
    Params p = Params(pc.params);
    uint64_t x = p.x;
    int xdt = p.xdt, op = p.op, nr = p.nr, rst0 = p.rst[0];
    int slices = p.slices, items = p.kcount * slices;
    int tid = int(gl_LocalInvocationID.x);
    for (int item = int(gl_WorkGroupID.x); item < items; item += int(gl_NumWorkGroups.x)) {
        int o = item / slices, s = item - o * slices;
        int base = kept_offset(p, o);
        int r0 = s * p.chunk, r1 = min(p.rcount, r0 + p.chunk);
        if (op == OP_SUM) {
            // compensated, so a long slice per lane loses little
            precise float acc = 0.0, comp = 0.0;
            for (int r = r0 + tid; r < r1; r += 256) {
                float v = ts_load(x, xdt, base + (nr == 1 ? r * rst0 : red_offset(p, r)));
                precise float yv = v - comp;
                precise float t = acc + yv;
                // an infinite sum stays infinite (inf - inf would be NaN)
                comp = is_finite(t) ? (t - acc) - yv : 0.0;
                acc = t;
            }
            float total = wg_sum(acc);
            if (tid == 0) {
                if (slices > 1) BufF32(p.y).v[item] = total;
                else ts_store(p.y, p.ydt, o, total * p.scale);
            }
        } else if (op == OP_MAX) {
            float m = neg_inf();
            bool nan = false;
            for (int r = r0 + tid; r < r1; r += 256) {
                float v = ts_load(x, xdt, base + (nr == 1 ? r * rst0 : red_offset(p, r)));
                if (is_nan(v)) nan = true;
                else m = max(m, v);
            }
            float total = wg_max(m, nan);
            if (tid == 0) {
                if (slices > 1) BufF32(p.y).v[item] = total;
                else ts_store(p.y, p.ydt, o, total);
            }
        } else {
            float m = neg_inf();
            int bi = NONE;
            bool nan = false;
            for (int r = r0 + tid; r < r1 && !nan; r += 256) {
                float v = ts_load(x, xdt, base + (nr == 1 ? r * rst0 : red_offset(p, r)));
                if (bi == NONE || v > m || is_nan(v)) {
                    m = v;
                    bi = r;
                    nan = is_nan(v);
                }
            }
            int best = wg_argmax(m, bi, nan);
            if (tid == 0) BufI64(p.y).v[o] = int64_t(best == NONE ? 0 : best);
        }
    }
}
