#version 460
// nr_norm_bwd.comp — dx of rmsnorm (LAYER = 0) and layernorm (LAYER = 1),
// one workgroup per row, as cpu_rmsnorm_backward / cpu_layernorm_backward
// (norm.c), with gw = g * w, d = x - mean (0 for rmsnorm), xhat = d * rstd:
//   rmsnorm:   dx = rstd * (gw - xhat * mean(gw * xhat))
//   layernorm: dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))
// mean(gw * xhat) = rstd * sum(gw * d) / C. The CPU sums in double; here
// the sums are double-floats (error-free products and additions) reduced
// by a fixed tree, so the result does not hang on f32 cancellation. The
// weight/bias gradients are not here: autograd builds them from ops.
// g, x, w, mean, rstd: any strides; dx (N, C) contiguous.
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int LAYER = 0;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc g, x, w, mean, rstd; // mean: layernorm only
    uint64_t dx;
    int dx_dtype, C, N, has_w;
};

shared vec4 red[gl_WorkGroupSize.x]; // (sum gw, sum gw * d), each hi, lo

vec2 two_sum(float a, float b) {
    precise float s = a + b;
    precise float bb = s - a;
    precise float e = (a - (s - bb)) + (b - bb);
    return vec2(s, e);
}
vec2 ff_add(vec2 a, vec2 b) {
    vec2 s = two_sum(a.x, b.x);
    precise float lo = s.y + (a.y + b.y);
    return two_sum(s.x, lo);
}
// a * b exactly, as (hi, lo) (Dekker's product: Vulkan's fma() may round
// between the multiply and the add, so it cannot give the error term)
vec2 split(float a) {
    precise float c = 4097.0 * a;
    precise float hi = c - (c - a);
    precise float lo = a - hi;
    return vec2(hi, lo);
}
vec2 two_prod(float a, float b) {
    precise float p = a * b;
    vec2 as = split(a), bs = split(b);
    precise float e = ((as.x * bs.x - p) + as.x * bs.y + as.y * bs.x) +
                      as.y * bs.y;
    return vec2(p, e);
}
// (hi + lo) / n rounded to f32 (the division's error corrected once)
float ff_div(vec2 a, float n) {
    float q = a.x / n;
    vec2 qn = two_prod(q, n);
    precise float r = ((a.x - qn.x) - qn.y) + a.y;
    return q + r / n;
}
vec4 ff_add2(vec4 a, vec4 b) { return vec4(ff_add(a.xy, b.xy), ff_add(a.zw, b.zw)); }

vec4 wg_sum(vec4 v) {
    uint t = gl_LocalInvocationID.x;
    red[t] = v;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2; s > 0; s >>= 1) {
        if (t < s)
            red[t] = ff_add2(red[t], red[t + s]);
        barrier();
    }
    vec4 r = red[0];
    barrier();
    return r;
}

int row_offset(TDesc t, int nd, int r) {
    int off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        int s = t.shape[d];
        off += (r % s) * t.stride[d];
        r /= s;
    }
    return off;
}

void main() {
    Params p = Params(pc.params);
    TDesc g = p.g, x = p.x, w = p.w;
    int C = p.C, N = p.N, nl = x.ndim - 1;
    int xs = x.stride[nl], gs = g.stride[nl], ws = w.stride[0];
    int t = int(gl_LocalInvocationID.x), WG = int(gl_WorkGroupSize.x);
    bool hw = p.has_w != 0;
    float fC = float(C);
    for (int r = int(gl_WorkGroupID.x); r < N; r += int(gl_NumWorkGroups.x)) {
        int xo = row_offset(x, nl, r), go = row_offset(g, nl, r);
        float rs = BufF32(p.rstd.addr).v[row_offset(p.rstd, nl, r)];
        float mu = LAYER == 1 ? BufF32(p.mean.addr).v[row_offset(p.mean, nl, r)]
                              : 0.0;
        vec4 s = vec4(0.0);
        for (int c = t; c < C; c += WG) {
            float gw = ts_load(g.addr, g.dtype, go + c * gs);
            if (hw)
                gw *= ts_load(w.addr, w.dtype, c * ws);
            float d = ts_load(x.addr, x.dtype, xo + c * xs) - mu;
            s = ff_add2(s, vec4(gw, 0.0, two_prod(gw, d)));
        }
        s = wg_sum(s);
        float m1 = ff_div(s.xy, fC), m2 = rs * ff_div(s.zw, fC);
        int yo = r * C;
        for (int c = t; c < C; c += WG) {
            float gw = ts_load(g.addr, g.dtype, go + c * gs);
            if (hw)
                gw *= ts_load(w.addr, w.dtype, c * ws);
            float xh = (ts_load(x.addr, x.dtype, xo + c * xs) - mu) * rs;
            float d = LAYER == 1 ? gw - m1 - xh * m2 : gw - xh * m2;
            ts_store(p.dx, p.dx_dtype, yo + c, rs * d);
        }
    }
}
