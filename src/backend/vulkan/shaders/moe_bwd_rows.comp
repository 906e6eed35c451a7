#version 460
// moe_bwd_rows.comp — the experts MLP's backward, per routed row p of the
// padded order (slot s = slot_of[p], token n = s / K, weight ws = w[n, j]),
// with D = g[n] down_e (F), G and U the recomputed gate/up products:
//   gated:   AG = act(G), A = AG U;  ungated: A = act(U)
//   dw[s] = D . A
//   dA = ws D; gated: G <- act'(G) (dA U), U <- dA AG; ungated:
//   U <- act'(U) dA
//   D <- ws A   (what ddown = g^T (ws A) reads)
// as cpu moe.c's bwd_rows. A workgroup per row; the dot in shared memory.
#include "common.glsl"

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t D, G, U, slot_of, w, dw;
    int w_s0, w_s1, F, K, P, gated, act, has_dw;
};

shared float red[256];

// ---- activations and g * act'(x), as ew_fused.comp computes them ----
float moe_erfc(float x) {
    float z = abs(x);
    float t = 1.0 / (1.0 + 0.5 * z);
    float q = 0.17087277;
    q = q * t - 0.82215223;
    q = q * t + 1.48851587;
    q = q * t - 1.13520398;
    q = q * t + 0.27886807;
    q = q * t - 0.18628806;
    q = q * t + 0.09678418;
    q = q * t + 0.37409196;
    q = q * t + 1.00002368;
    q = q * t - 1.26551223;
    float r = t * exp(-z * z + q);
    return x >= 0.0 ? r : 2.0 - r;
}
float moe_phi(float x) { return 0.5 * moe_erfc(-x * 0.70710678118654752); }
float moe_gelu_sig(float x, out float du) {
    const float k2 = 2.0 * 0.7978845608028654, c = 0.044715;
    float x2 = x * x;
    du = k2 * (3.0 * c * x2 + 1.0);
    return 1.0 / (1.0 + exp(-(k2 * x) * (c * x2 + 1.0)));
}
float moe_act(int act, float x) {
    float du;
    if (act == 0) return x / (1.0 + exp(-x));
    if (act == 1) return x * moe_gelu_sig(x, du);
    return x * moe_phi(x);
}
float moe_act_bwd(int act, float g, float x) {
    float du, s;
    if (act == 0) {
        s = 1.0 / (1.0 + exp(-x));
        return g * s * (1.0 + x * (1.0 - s));
    }
    if (act == 1) {
        s = moe_gelu_sig(x, du);
        return g * ((x * (s * (1.0 - s))) * du + s);
    }
    return g * (moe_phi(x) + x * 0.3989422804014327 * exp(-0.5 * x * x));
}

void main() {
    Params p = Params(pc.params);
    int lid = int(gl_LocalInvocationID.x);
    BufF32 D = BufF32(p.D), G = BufF32(p.G), U = BufF32(p.U);
    for (int row = int(gl_WorkGroupID.x); row < p.P;
         row += int(gl_NumWorkGroups.x)) {
        int s = BufI32(p.slot_of).v[row];
        if (s < 0) continue; // uniform
        int n = s / p.K, j = s - n * p.K;
        float ws = BufF32(p.w).v[n * p.w_s0 + j * p.w_s1], dot = 0.0;
        for (int f = lid; f < p.F; f += 256) {
            int i = row * p.F + f;
            float d = D.v[i], u = U.v[i], a;
            float dA = ws * d;
            if (p.gated != 0) {
                float g = G.v[i], ag = moe_act(p.act, g);
                a = ag * u;
                G.v[i] = moe_act_bwd(p.act, dA * u, g);
                U.v[i] = dA * ag;
            } else {
                a = moe_act(p.act, u);
                U.v[i] = moe_act_bwd(p.act, dA, u);
            }
            dot += d * a;
            D.v[i] = ws * a;
        }
        red[lid] = dot;
        barrier();
        for (int h = 128; h > 0; h >>= 1) {
            if (lid < h) red[lid] += red[lid + h];
            barrier();
        }
        if (lid == 0 && p.has_dw != 0) BufF32(p.dw).v[s] = red[0];
        barrier();
    }
}
