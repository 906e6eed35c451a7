// common.glsl — included by every Tessera compute shader: the push constant
// (the device address of the kernel's parameter struct), buffer-reference
// views of device memory, the tensor descriptor, and loads/stores by dtype
// with f32 arithmetic. Matches src/backend/vulkan/vk.h.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference2 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_16bit_storage : require

// ts_dtype (include/tessera.h)
#define DT_F32  0
#define DT_BF16 1
#define DT_F16  2
#define DT_I32  3
#define DT_I64  4
#define TS_MAX_DIMS 8

layout(buffer_reference, std430, buffer_reference_align = 4) buffer BufF32 { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer BufU16 { uint16_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer BufI32 { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer BufU32 { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer BufI64 { int64_t v[]; };

// A tensor: address of element [0...], dtype, dims, strides in elements
// (vk_tdesc in vk.h). 80 bytes.
struct TDesc {
    uint64_t addr;
    int dtype;
    int ndim;
    int shape[TS_MAX_DIMS];
    int stride[TS_MAX_DIMS];
};

layout(push_constant) uniform PushConstants { uint64_t params; } pc;

float bf16_to_f32(uint16_t h) { return uintBitsToFloat(uint(h) << 16); }
// round to nearest even, NaN kept quiet (ts_f32_to_bf16)
uint16_t f32_to_bf16(float f) {
    uint u = floatBitsToUint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return uint16_t((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

// element i (in elements from addr) as f32
float ts_load(uint64_t addr, int dt, int i) {
    if (dt == DT_F32) return BufF32(addr).v[i];
    if (dt == DT_BF16) return bf16_to_f32(BufU16(addr).v[i]);
    if (dt == DT_F16) return unpackHalf2x16(uint(BufU16(addr).v[i])).x;
    if (dt == DT_I32) return float(BufI32(addr).v[i]);
    return float(BufI64(addr).v[i]);
}
void ts_store(uint64_t addr, int dt, int i, float x) {
    if (dt == DT_F32) BufF32(addr).v[i] = x;
    else if (dt == DT_BF16) BufU16(addr).v[i] = f32_to_bf16(x);
    else if (dt == DT_F16) BufU16(addr).v[i] = uint16_t(packHalf2x16(vec2(x, 0.0)) & 0xffffu);
    else if (dt == DT_I32) BufI32(addr).v[i] = int(x);
    else BufI64(addr).v[i] = int64_t(x);
}
// integer elements (ids, indices) without a trip through f32
int64_t ts_load_i64(uint64_t addr, int dt, int i) {
    if (dt == DT_I64) return BufI64(addr).v[i];
    if (dt == DT_I32) return int64_t(BufI32(addr).v[i]);
    return int64_t(ts_load(addr, dt, i));
}

// offset in elements of the element whose row-major index over `shape`
// is `linear`, through t's strides (t.shape must be that shape, or t's
// strides those of a broadcast: vk_desc_bcast)
int ts_offset(TDesc t, int linear) {
    int off = 0;
    for (int d = t.ndim - 1; d >= 0; d--) {
        int s = t.shape[d];
        int c = linear % s;
        linear /= s;
        off += c * t.stride[d];
    }
    return off;
}
float ts_load_at(TDesc t, int linear) {
    return ts_load(t.addr, t.dtype, ts_offset(t, linear));
}
int ts_numel(TDesc t) {
    int n = 1;
    for (int d = 0; d < t.ndim; d++) n *= t.shape[d];
    return n;
}
