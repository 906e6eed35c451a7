#version 460
// nr_norm.comp — rmsnorm (LAYER = 0) and layernorm (LAYER = 1) forward over
// the last dim: one workgroup per row (grid-stride over rows), shared-memory
// tree reductions in f32. Matches cpu_rmsnorm / cpu_layernorm (norm.c):
//   rmsnorm:   rstd = 1 / sqrt(mean(x^2) + eps),        y = x * rstd * w
//   layernorm: mean, rstd = 1 / sqrt(mean((x-mean)^2) + eps),
//              y = (x - mean) * rstd * w + b
// x, w, b: any float dtype and strides; y (N, C) and the saved mean/rstd
// (N, f32) contiguous. The workgroup size (a power of two) is constant 0.
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int LAYER = 0;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc x, w, b;
    uint64_t y, mean, rstd; // mean: layernorm only
    int y_dtype, C, N, has_w, has_b;
    float eps;
};

shared float red[gl_WorkGroupSize.x];

// sum of v over the workgroup (every invocation gets it); deterministic
float wg_sum(float v) {
    uint t = gl_LocalInvocationID.x;
    red[t] = v;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2; s > 0; s >>= 1) {
        if (t < s)
            red[t] += red[t + s];
        barrier();
    }
    float r = red[0];
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
    for (int r = int(gl_WorkGroupID.x); r < N; r += int(gl_NumWorkGroups.x)) {
        int xo = row_offset(x, nl, r);
        float mu = 0.0, rs;
        if (LAYER == 1) {
            float s = 0.0;
            for (int c = t; c < C; c += WG)
                s += ts_load(x.addr, x.dtype, xo + c * xs);
            mu = wg_sum(s) / float(C);
        }
        float q = 0.0;
        for (int c = t; c < C; c += WG) {
            float v = ts_load(x.addr, x.dtype, xo + c * xs) - mu;
            q += v * v;
        }
        rs = 1.0 / sqrt(wg_sum(q) / float(C) + p.eps);
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
