#version 460
// rd_reduce_serial.comp — sum / max / argmax with one invocation per item
// (one slice of one output): neighbouring invocations take neighbouring
// outputs, so when the kept inner dim is contiguous (a reduction over outer
// dims) every step of the loop reads one coalesced line. Also for short
// reductions, where a workgroup per output would idle.
#include "common.glsl"

layout(local_size_x = 64) in;

// rd_reduce_params in k_reduce.c (as rd_reduce_tree.comp)
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

bool is_nan(float v) { return (floatBitsToUint(v) & 0x7fffffffu) > 0x7f800000u; }
bool is_finite(float v) { return (floatBitsToUint(v) & 0x7f800000u) != 0x7f800000u; }

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

void main() {
    Params p = Params(pc.params);
    uint64_t x = p.x;
    int xdt = p.xdt, op = p.op, nr = p.nr, rst0 = p.rst[0];
    int kcount = p.kcount, slices = p.slices, items = kcount * slices;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int item = int(gl_GlobalInvocationID.x); item < items; item += stride) {
        // output fastest: neighbours read neighbouring columns
        int s = item / kcount, o = item - s * kcount;
        int base = kept_offset(p, o);
        int r0 = s * p.chunk, r1 = min(p.rcount, r0 + p.chunk);
        float res;
        if (op == OP_SUM) {
            precise float acc = 0.0, comp = 0.0;
            for (int r = r0; r < r1; r++) {
                float v = ts_load(x, xdt, base + (nr == 1 ? r * rst0 : red_offset(p, r)));
                precise float yv = v - comp;
                precise float t = acc + yv;
                // an infinite sum stays infinite (inf - inf would be NaN)
                comp = is_finite(t) ? (t - acc) - yv : 0.0;
                acc = t;
            }
            res = acc;
        } else if (op == OP_MAX) {
            float m = uintBitsToFloat(0xff800000u);
            bool nan = false;
            for (int r = r0; r < r1; r++) {
                float v = ts_load(x, xdt, base + (nr == 1 ? r * rst0 : red_offset(p, r)));
                if (is_nan(v)) nan = true;
                else m = max(m, v);
            }
            res = nan ? uintBitsToFloat(0x7fc00000u) : m;
        } else {
            // the CPU's scan: the first NaN, else the first largest
            float m = uintBitsToFloat(0xff800000u);
            int best = 0;
            for (int r = r0; r < r1; r++) {
                float v = ts_load(x, xdt, base + (nr == 1 ? r * rst0 : red_offset(p, r)));
                if (v > m || is_nan(v)) {
                    m = v;
                    best = r;
                    if (is_nan(v)) break;
                }
            }
            BufI64(p.y).v[o] = int64_t(best);
            continue;
        }
        // partials are laid out (output, slice) for the second pass
        if (slices > 1) BufF32(p.y).v[o * slices + s] = res;
        else if (op == OP_SUM) ts_store(p.y, p.ydt, o, res * p.scale);
        else ts_store(p.y, p.ydt, o, res);
    }
}
