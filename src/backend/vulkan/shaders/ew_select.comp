#version 460
// ew_select.comp — where (out = cond ? a : b) and masked_fill (out = mask ?
// value : x) on raw elements of any dtype, all operands broadcast to the
// contiguous output. masked_fill is where with a constant for a.
#include "common.glsl"

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc dst;  // shape: the (coalesced) iteration shape
    TDesc cond; // any dtype; nonzero picks a
    TDesc a;    // unused when has_a == 0: `fill` instead
    TDesc b;
    uint64_t fill; // bits of masked_fill's value in dst's dtype
    int has_a;
    int esize;
    int numel;
    int pad;
};

bool nonzero(TDesc t, int o) {
    if (t.dtype == DT_I64 || t.dtype == DT_I32)
        return ts_load_i64(t.addr, t.dtype, o) != 0;
    return ts_load(t.addr, t.dtype, o) != 0.0;
}

uint64_t load_bits(uint64_t addr, int o, int es) {
    if (es == 8) return uint64_t(BufI64(addr).v[o]);
    if (es == 4) return uint64_t(BufU32(addr).v[o]);
    return uint64_t(uint(BufU16(addr).v[o]));
}

void main() {
    Params p = Params(pc.params);
    int nd = p.dst.ndim, n = p.numel, es = p.esize;
    bool has_a = p.has_a != 0;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < n; i += stride) {
        int od = 0, oc = 0, oa = 0, ob = 0, rest = i;
        for (int d = nd - 1; d >= 0; d--) {
            int s = p.dst.shape[d];
            int c = rest % s;
            rest /= s;
            od += c * p.dst.stride[d];
            oc += c * p.cond.stride[d];
            oa += c * p.a.stride[d];
            ob += c * p.b.stride[d];
        }
        uint64_t v;
        if (nonzero(p.cond, oc))
            v = has_a ? load_bits(p.a.addr, oa, es) : p.fill;
        else
            v = load_bits(p.b.addr, ob, es);
        if (es == 8) BufI64(p.dst.addr).v[od] = int64_t(v);
        else if (es == 4) BufU32(p.dst.addr).v[od] = uint(v);
        else BufU16(p.dst.addr).v[od] = uint16_t(uint(v));
    }
}
