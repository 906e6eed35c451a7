#version 460
// nr_norm_bwd.comp — dx of rmsnorm (LAYER = 0) and layernorm (LAYER = 1),
// one workgroup per row, as cpu_rmsnorm_backward / cpu_layernorm_backward
// (norm.c), with gw = g * w and xhat = (x - mean) * rstd:
//   rmsnorm:   dx = rstd * (gw - xhat * mean(gw * xhat))
//   layernorm: dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))
// The weight/bias gradients are not here: autograd builds them from ops.
// g, x, w, mean, rstd: any strides; dx (N, C) contiguous.
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int LAYER = 0;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc g, x, w, mean, rstd; // mean: layernorm only
    uint64_t dx;
    int dx_dtype, C, N, has_w;
};

shared vec2 red[gl_WorkGroupSize.x];

// both sums of v over the workgroup (every invocation gets them)
vec2 wg_sum(vec2 v) {
    uint t = gl_LocalInvocationID.x;
    red[t] = v;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2; s > 0; s >>= 1) {
        if (t < s)
            red[t] += red[t + s];
        barrier();
    }
    vec2 r = red[0];
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
    for (int r = int(gl_WorkGroupID.x); r < N; r += int(gl_NumWorkGroups.x)) {
        int xo = row_offset(x, nl, r), go = row_offset(g, nl, r);
        float rs = BufF32(p.rstd.addr).v[row_offset(p.rstd, nl, r)];
        float mu = LAYER == 1 ? BufF32(p.mean.addr).v[row_offset(p.mean, nl, r)]
                              : 0.0;
        vec2 s = vec2(0.0); // sum(gw), sum(gw * xhat)
        for (int c = t; c < C; c += WG) {
            float gw = ts_load(g.addr, g.dtype, go + c * gs);
            if (hw)
                gw *= ts_load(w.addr, w.dtype, c * ws);
            float xh = (ts_load(x.addr, x.dtype, xo + c * xs) - mu) * rs;
            s += vec2(gw, gw * xh);
        }
        vec2 m = wg_sum(s) / float(C);
        int yo = r * C;
        for (int c = t; c < C; c += WG) {
            float gw = ts_load(g.addr, g.dtype, go + c * gs);
            if (hw)
                gw *= ts_load(w.addr, w.dtype, c * ws);
            float xh = (ts_load(x.addr, x.dtype, xo + c * xs) - mu) * rs;
            float d = LAYER == 1 ? gw - m.x - xh * m.y : gw - xh * m.y;
            ts_store(p.dx, p.dx_dtype, yo + c, rs * d);
        }
    }
}
