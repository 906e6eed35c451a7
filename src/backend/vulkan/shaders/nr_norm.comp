#version 460
// nr_norm.comp — rmsnorm (LAYER = 0) and layernorm (LAYER = 1) forward over
// the last dim: one workgroup per row (grid-stride over rows). Matches
// cpu_rmsnorm / cpu_layernorm (norm.c):
//   rmsnorm:   rstd = 1 / sqrt(mean(x^2) + eps),        y = x * rstd * w
//   layernorm: mean, rstd = 1 / sqrt(mean((x-mean)^2) + eps),
//              y = (x - mean) * rstd * w + b
// The sums are double-floats (hi + lo, error-free additions), reduced by a
// fixed tree in shared memory: the CPU sums layernorm's rows in double,
// and an f32 mean of nearly equal values would be off by more than x -
// mean can bear. x, w, b: any float dtype and strides; y (N, C) and the
// saved mean/rstd (N, f32) contiguous. Workgroup size (a power of two):
// constant 0.
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int LAYER = 0;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc x, w, b;
    uint64_t y, mean, rstd; // mean: layernorm only
    int y_dtype, C, N, has_w, has_b;
    float eps;
};

shared vec2 red[gl_WorkGroupSize.x];

// a + b exactly, as (hi, lo) (Knuth's two-sum; precise: not reassociated)
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

// the double-float sum of v over the workgroup (every invocation gets it)
vec2 wg_sum(vec2 v) {
    uint t = gl_LocalInvocationID.x;
    red[t] = v;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2; s > 0; s >>= 1) {
        if (t < s)
            red[t] = ff_add(red[t], red[t + s]);
        barrier();
    }
    vec2 r = red[0];
    barrier();
    return r;
}

// offset of row r of t: r decomposed over t's first nd dims
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
    TDesc x = p.x, w = p.w, b = p.b;
    int C = p.C, N = p.N, nl = x.ndim - 1;
    int xs = x.stride[nl], ws = w.stride[0], bs = b.stride[0];
    int t = int(gl_LocalInvocationID.x), WG = int(gl_WorkGroupSize.x);
    bool hw = p.has_w != 0, hb = p.has_b != 0;
    float fC = float(C);
    for (int r = int(gl_WorkGroupID.x); r < N; r += int(gl_NumWorkGroups.x)) {
        int xo = row_offset(x, nl, r);
        float mu = 0.0;
        if (LAYER == 1) {
            vec2 s = vec2(0.0);
            for (int c = t; c < C; c += WG)
                s = ff_add(s, vec2(ts_load(x.addr, x.dtype, xo + c * xs), 0.0));
            mu = ff_div(wg_sum(s), fC);
        }
        vec2 q = vec2(0.0);
        for (int c = t; c < C; c += WG) {
            float v = ts_load(x.addr, x.dtype, xo + c * xs) - mu;
            q = ff_add(q, two_prod(v, v));
        }
        float rs = 1.0 / sqrt(ff_div(wg_sum(q), fC) + p.eps);
        if (t == 0) {
            BufF32(p.rstd).v[r] = rs;
            if (LAYER == 1)
                BufF32(p.mean).v[r] = mu;
        }
        int yo = r * C;
        for (int c = t; c < C; c += WG) {
            float v = (ts_load(x.addr, x.dtype, xo + c * xs) - mu) * rs;
            if (hw)
                v *= ts_load(w.addr, w.dtype, c * ws);
            if (LAYER == 1 && hb)
                v += ts_load(b.addr, b.dtype, c * bs);
            ts_store(p.y, p.y_dtype, yo + c, v);
        }
    }
}
