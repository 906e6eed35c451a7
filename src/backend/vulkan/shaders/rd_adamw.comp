#version 460
// rd_adamw.comp — fused AdamW in place, one invocation per element: the
// CPU's formula (cpu_adamw) with the hyperparameters read from the device
// tensor h = {lr, beta1, beta2, eps, weight_decay, bias_correction1,
// bias_correction2[, gradient scale]}, so a step needs no host value.
#include "common.glsl"

layout(local_size_x = 256) in;

// rd_adamw_params in k_reduce.c
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc g; // coalesced
    TDesc h; // (7) or (8) f32
    uint64_t param;
    uint64_t m;
    uint64_t v;
    int pdt, n;
};

void main() {
    Params p = Params(pc.params);
    TDesc g = p.g, h = p.h;
    int hs = h.stride[0];
    BufF32 hb = BufF32(h.addr);
    float lr = hb.v[0], b1 = hb.v[hs], b2 = hb.v[2 * hs], eps = hb.v[3 * hs];
    float wd = hb.v[4 * hs], bc1 = hb.v[5 * hs], bc2 = hb.v[6 * hs];
    float gs = h.shape[0] > 7 ? hb.v[7 * hs] : 1.0;
    // no contraction into fma: the CPU's roundings
    precise float step = lr / bc1;
    precise float inv_bc2 = 1.0 / bc2;
    precise float decay = 1.0 - lr * wd;
    BufF32 mb = BufF32(p.m), vb = BufF32(p.v);
    int n = p.n, pdt = p.pdt;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int i = int(gl_GlobalInvocationID.x); i < n; i += stride) {
        int go = g.ndim == 1 ? i * g.stride[0] : ts_offset(g, i);
        precise float gi = ts_load(g.addr, g.dtype, go) * gs;
        precise float mi = b1 * mb.v[i] + (1.0 - b1) * gi;
        precise float vi = b2 * vb.v[i] + (1.0 - b2) * gi * gi;
        mb.v[i] = mi;
        vb.v[i] = vi;
        precise float pi = ts_load(p.param, pdt, i);
        pi = pi * decay - step * mi / (sqrt(vi * inv_bc2) + eps);
        ts_store(p.param, pdt, i, pi);
    }
}
