#version 460
// ew_fused.comp — every float elementwise op (binary, unary with a scalar,
// unary backward) and the compiler's fused groups of them: one invocation
// per output element runs the member list in registers, reading the outside
// inputs through their broadcast strides. A plain op is a group of one.
// Ops are the EW_* codes of k_elementwise.c (not ts_op_id: the shader must
// not depend on the op enum's order). The math matches the CPU kernels
// (src/backend/cpu/elementwise.c, cpu.h) to f32 rounding; log, tanh and erf
// are computed here because GLSL's are too coarse near 1 / 0.
#include "common.glsl"

#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256) in;

#define MAX_MEMBERS 16
#define MAX_EXT     11
// the group's size, so that its loops unroll and its values live in
// registers: one pipeline per (inputs, members) pair met
layout(constant_id = 0) const int NEXT = 1; // outside inputs, <= MAX_EXT
layout(constant_id = 1) const int NMEM = 1; // members, <= MAX_MEMBERS

// k_elementwise.c's ew_params: ext[] last, only n_ext of them are copied
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc dst; // shape: the (coalesced) iteration shape, shared by ext[]
    int n_ext;     // = NEXT
    int n_members; // = NMEM
    int numel;
    int pad;
    int op[MAX_MEMBERS];
    int arg[MAX_MEMBERS * 3]; // >= 0 ext[k], < 0 member -(a + 1)
    float scal[MAX_MEMBERS];
    TDesc ext[MAX_EXT];
};

#define EW_ADD        0
#define EW_SUB        1
#define EW_MUL        2
#define EW_DIV        3
#define EW_EQ         4
#define EW_ADD_SCALAR 5
#define EW_MUL_SCALAR 6
#define EW_NEG        7
#define EW_EXP        8
#define EW_LOG        9
#define EW_SQRT       10
#define EW_RSQRT      11
#define EW_ABS        12
#define EW_POW        13
#define EW_TANH       14
#define EW_SIGMOID    15
#define EW_RELU       16
#define EW_SILU       17
#define EW_GELU_ERF   18
#define EW_GELU_TANH  19
// backward: (g, x, out) -> dx
#define EW_BW_EXP       20
#define EW_BW_LOG       21
#define EW_BW_SQRT      22
#define EW_BW_RSQRT     23
#define EW_BW_ABS       24
#define EW_BW_POW       25
#define EW_BW_TANH      26
#define EW_BW_SIGMOID   27
#define EW_BW_RELU      28
#define EW_BW_SILU      29
#define EW_BW_GELU_ERF  30
#define EW_BW_GELU_TANH 31
#define EW_BW_NAN       32

// natural log with ~1 ulp error (Cephes logf): GLSL's log has only an
// absolute error bound near 1
float ew_log(float x) {
    if (isnan(x) || x < 0.0) return uintBitsToFloat(0x7fc00000u);
    if (x == 0.0) return uintBitsToFloat(0xff800000u);
    if (isinf(x)) return x;
    int e;
    float m = frexp(x, e); // [0.5, 1)
    if (m < 0.70710678118654752) {
        e -= 1;
        m = m + m - 1.0;
    } else {
        m = m - 1.0;
    }
    float z = m * m;
    float y = 7.0376836292E-2;
    y = y * m - 1.1514610310E-1;
    y = y * m + 1.1676998740E-1;
    y = y * m - 1.2420140846E-1;
    y = y * m + 1.4249322787E-1;
    y = y * m - 1.6668057665E-1;
    y = y * m + 2.0000714765E-1;
    y = y * m - 2.4999993993E-1;
    y = y * m + 3.3333331174E-1;
    y = y * m * z;
    float fe = float(e);
    y += -2.12194440e-4 * fe;
    y += -0.5 * z;
    return m + y + 0.693359375 * fe;
}

// tanh with a small relative error near 0 (Cephes tanhf): GLSL's is
// (e^x - e^-x) / (e^x + e^-x), which cancels there
float ew_tanh(float x) {
    float a = abs(x);
    if (isnan(x)) return x;
    if (a > 0.625) {
        float e = exp(min(2.0 * a, 88.0));
        float t = 1.0 - 2.0 / (e + 1.0);
        return x < 0.0 ? -t : t;
    }
    float z = x * x;
    float p = -5.70498872745E-3;
    p = p * z + 2.06390887954E-2;
    p = p * z - 5.37397155531E-2;
    p = p * z + 1.33314422036E-1;
    p = p * z - 3.33332819422E-1;
    return p * z * x + x;
}

// erfc with relative error < 1.2e-7 everywhere (Numerical Recipes' erfcc,
// a Chebyshev fit): Phi(x) = erfc(-x / sqrt 2) / 2 stays accurate in the
// left tail
float ew_erfc(float x) {
    float z = abs(x);
    float t = 1.0 / (1.0 + 0.5 * z);
    float p = 0.17087277;
    p = p * t - 0.82215223;
    p = p * t + 1.48851587;
    p = p * t - 1.13520398;
    p = p * t + 0.27886807;
    p = p * t - 0.18628806;
    p = p * t + 0.09678418;
    p = p * t + 0.37409196;
    p = p * t + 1.00002368;
    p = p * t - 1.26551223;
    float r = t * exp(-z * z + p);
    return x >= 0.0 ? r : 2.0 - r;
}

// powf's cases that exp2(f log2 x) gets wrong: x <= 0, f integral
float ew_pow(float x, float f) {
    if (f == 0.0) return 1.0;
    if (f == 1.0) return x;
    if (f == 2.0) return x * x;
    if (f == 0.5) return sqrt(x);
    if (isnan(x) || isnan(f)) return uintBitsToFloat(0x7fc00000u);
    if (x == 0.0) return f > 0.0 ? 0.0 : uintBitsToFloat(0x7f800000u);
    if (x < 0.0) {
        if (floor(f) != f) return uintBitsToFloat(0x7fc00000u);
        float r = pow(-x, f);
        return mod(f, 2.0) == 1.0 ? -r : r;
    }
    return pow(x, f);
}

float ew_sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }

// x sigmoid(2u), 2u = 2k x (1 + c x^2) (cpu_gelu_sig8); du = 2u'
float ew_gelu_sig(float x, out float du) {
    const float k2 = 2.0 * 0.7978845608028654, c = 0.044715;
    float x2 = x * x;
    du = k2 * (3.0 * c * x2 + 1.0);
    return 1.0 / (1.0 + exp(-(k2 * x) * (c * x2 + 1.0)));
}

float ew_phi(float x) { return 0.5 * ew_erfc(-x * 0.70710678118654752); }

float ew_apply(int op, float a, float b, float c, float f) {
    float du, s;
    switch (op) {
    case EW_ADD: return a + b;
    case EW_SUB: return a - b;
    case EW_MUL: return a * b;
    case EW_DIV: return a / b;
    case EW_EQ: return a == b ? 1.0 : 0.0;
    case EW_ADD_SCALAR: return a + f;
    case EW_MUL_SCALAR: return a * f;
    case EW_NEG: return -a;
    case EW_EXP: return exp(a);
    case EW_LOG: return ew_log(a);
    case EW_SQRT: return sqrt(a);
    case EW_RSQRT: return 1.0 / sqrt(a);
    case EW_ABS: return abs(a);
    case EW_POW: return ew_pow(a, f);
    case EW_TANH: return ew_tanh(a);
    case EW_SIGMOID: return ew_sigmoid(a);
    case EW_RELU: return a > 0.0 ? a : 0.0;
    case EW_SILU: return a / (1.0 + exp(-a));
    case EW_GELU_ERF: return a * ew_phi(a);
    case EW_GELU_TANH: return a * ew_gelu_sig(a, du);
    // (g, x, out) = (a, b, c)
    case EW_BW_EXP: return a * c;
    case EW_BW_LOG: return a / b;
    case EW_BW_SQRT: return a * 0.5 / c;
    case EW_BW_RSQRT: return -0.5 * a * c * c * c;
    case EW_BW_ABS: return b > 0.0 ? a : b < 0.0 ? -a : 0.0;
    case EW_BW_POW: return f == 0.0 ? 0.0 : a * f * ew_pow(b, f - 1.0);
    case EW_BW_TANH: return a * (1.0 - c * c);
    case EW_BW_SIGMOID: return a * c * (1.0 - c);
    case EW_BW_RELU: return b > 0.0 ? a : 0.0;
    case EW_BW_SILU:
        s = ew_sigmoid(b);
        return a * s * (1.0 + b * (1.0 - s));
    case EW_BW_GELU_ERF:
        return a * (ew_phi(b) + b * 0.3989422804014327 * exp(-0.5 * b * b));
    case EW_BW_GELU_TANH:
        s = ew_gelu_sig(b, du);
        return a * ((b * (s * (1.0 - s))) * du + s);
    }
    return uintBitsToFloat(0x7fc00000u);
}

void main() {
    Params p = Params(pc.params);
    int nd = p.dst.ndim, n = p.numel;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < n; i += stride) {
        // offsets of element i in the output and every outside input
        int oo = 0;
        int eo[NEXT];
        [[unroll]] for (int k = 0; k < NEXT; k++) eo[k] = 0;
        int rest = i;
        for (int d = nd - 1; d >= 0; d--) {
            int s = p.dst.shape[d];
            int c = rest % s;
            rest /= s;
            oo += c * p.dst.stride[d];
            [[unroll]] for (int k = 0; k < NEXT; k++)
                eo[k] += c * p.ext[k].stride[d];
        }
        float ev[NEXT];
        [[unroll]] for (int k = 0; k < NEXT; k++)
            ev[k] = ts_load(p.ext[k].addr, p.ext[k].dtype, eo[k]);
        float r[NMEM];
        [[unroll]] for (int m = 0; m < NMEM; m++) {
            float x[3];
            [[unroll]] for (int j = 0; j < 3; j++) {
                // selects over constant indices: the registers stay
                // registers (a dynamic index would put them in memory)
                int a = p.arg[m * 3 + j];
                float v = 0.0;
                [[unroll]] for (int k = 0; k < NEXT; k++)
                    v = a == k ? ev[k] : v;
                [[unroll]] for (int q = 0; q < m; q++)
                    v = a == -(q + 1) ? r[q] : v;
                x[j] = v;
            }
            r[m] = ew_apply(p.op[m], x[0], x[1], x[2], p.scal[m]);
        }
        ts_store(p.dst.addr, p.dst.dtype, oo, r[NMEM - 1]);
    }
}
