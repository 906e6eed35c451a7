#version 460
// ew_copy.comp — dst (any strides) = src (strides as seen in dst's shape,
// 0 on broadcast dims), for copy, cast, copy_into, concat and
// slice_scatter; or dst = a constant (slice_scatter's zeros). Modes, as
// cpu_copy_strided converts: same dtype copies the bits; a float pair goes
// through f32; a pair with an integer goes through int64, so i32/i64
// values are exact.
#include "common.glsl"

layout(local_size_x = 256) in;

#define MODE_BITS  0 // same dtype: raw elements of `esize` bytes
#define MODE_FLOAT 1 // float -> float through f32
#define MODE_INT   2 // an integer on either side
#define MODE_FILL  3 // dst = the element whose bits are `fill`

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc dst; // shape: the (coalesced) iteration shape
    TDesc src;
    uint64_t fill;
    int mode;
    int esize;
    int numel;
    int pad;
};

bool is_int(int dt) { return dt == DT_I32 || dt == DT_I64; }

void copy_bits(uint64_t d, int od, uint64_t s, int os, int es) {
    if (es == 8) BufI64(d).v[od] = BufI64(s).v[os];
    else if (es == 4) BufU32(d).v[od] = BufU32(s).v[os];
    else BufU16(d).v[od] = BufU16(s).v[os];
}

void fill_bits(uint64_t d, int od, uint64_t bits, int es) {
    if (es == 8) BufI64(d).v[od] = int64_t(bits);
    else if (es == 4) BufU32(d).v[od] = uint(bits);
    else BufU16(d).v[od] = uint16_t(uint(bits));
}

// an integer side: ints exactly, floats truncated toward zero (C's cast)
void copy_int(TDesc d, int od, TDesc s, int os) {
    if (is_int(s.dtype)) {
        int64_t v = ts_load_i64(s.addr, s.dtype, os);
        if (d.dtype == DT_I64) BufI64(d.addr).v[od] = v;
        else if (d.dtype == DT_I32) BufI32(d.addr).v[od] = int(v);
        else ts_store(d.addr, d.dtype, od, float(v));
    } else {
        float x = ts_load(s.addr, s.dtype, os);
        if (d.dtype == DT_I64) BufI64(d.addr).v[od] = int64_t(x);
        else BufI32(d.addr).v[od] = int(x);
    }
}

void main() {
    Params p = Params(pc.params);
    int nd = p.dst.ndim, n = p.numel, mode = p.mode, es = p.esize;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < n; i += stride) {
        int od = 0, os = 0, rest = i;
        for (int d = nd - 1; d >= 0; d--) {
            int s = p.dst.shape[d];
            int c = rest % s;
            rest /= s;
            od += c * p.dst.stride[d];
            os += c * p.src.stride[d];
        }
        if (mode == MODE_BITS)
            copy_bits(p.dst.addr, od, p.src.addr, os, es);
        else if (mode == MODE_FLOAT)
            ts_store(p.dst.addr, p.dst.dtype, od,
                     ts_load(p.src.addr, p.src.dtype, os));
        else if (mode == MODE_INT)
            copy_int(p.dst, od, p.src, os);
        else
            fill_bits(p.dst.addr, od, p.fill, es);
    }
}
