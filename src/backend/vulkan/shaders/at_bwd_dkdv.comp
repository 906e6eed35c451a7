#version 460
#include "common.glsl"

// at_bwd_dkdv.comp — the attention backward's dk and dv (k_attention.c):
// one workgroup per (key block of BK rows, kv head, batch), which owns
// those rows of dk and dv, so no two workgroups write one element and no
// atomics are needed (deterministic). It loops over the query heads of its
// group and the query blocks that see its keys, recomputing
// P = exp(s - lse): dv += P^T dO, dS = P (dO.V - di) scale (times the
// softcap's 1 - tanh^2), dk += dS^T Q. Writes the dk and dv parts of the
// packed [dq | dk | dv] output.

layout(constant_id = 0) const uint D = 64;  // head dim
layout(constant_id = 1) const uint BQ = 8;  // query rows per tile
layout(constant_id = 2) const uint BK = 16; // key rows per workgroup
layout(local_size_x = 128) in;
const uint WG = 128;
const uint R = WG / BK;          // threads per key row
const uint DP = D + 1;           // padded shared row
const uint NC = (D + R - 1) / R; // dk, dv dims per thread

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc g, q, k, v, lse, mask; // lse (B, H, T); mask broadcast (B,H,T,S)
    uint64_t dst, di;            // packed output; di (B, H, T) f32
    int H, KV, T, S;
    int causal, window, has_mask, nq;
    int nk, pad_;
    float scale, softcap;
};

shared float sK[BK * DP];
shared float sV[BK * DP];
shared float sQ[BQ * DP];
shared float sO[BQ * DP]; // dO
shared float sP[BQ * BK];
shared float sDS[BQ * BK];
shared float sL[BQ];
shared float sDi[BQ];

#define NEG_INF (-1.0 / 0.0)

int g_T, g_S, g_window, g_causal;

int key_lo(int t) {
    int lo = t + g_S - g_T - g_window + 1;
    return g_window > 0 && lo > 0 ? lo : 0;
}
int key_hi(int t) {
    int hi = t + g_S - g_T + 1;
    return g_causal == 0 || hi > g_S ? g_S : hi;
}

int off4(TDesc t, int i0, int i1, int i2, int i3) {
    return i0 * t.stride[0] + i1 * t.stride[1] + i2 * t.stride[2] +
           i3 * t.stride[3];
}

void main() {
    Params P = Params(pc.params);
    g_T = P.T, g_S = P.S, g_window = P.window, g_causal = P.causal;
    const int H = P.H, KV = P.KV, G = P.H / P.KV;
    const int kb = int(gl_WorkGroupID.x), kvh = int(gl_WorkGroupID.y),
              b = int(gl_WorkGroupID.z);
    const uint tid = gl_LocalInvocationID.x, krow = tid / R, part = tid % R;
    const int s0 = kb * int(BK), bk = min(int(BK), g_S - s0);
    const float scale = P.scale, cap = P.softcap;
    const float icap = cap > 0.0 ? 1.0 / cap : 0.0;
    const bool has_mask = P.has_mask != 0;
    TDesc q = P.q, g = P.g, k = P.k, v = P.v, mask = P.mask, lse = P.lse;

    int kbase = b * k.stride[0] + kvh * k.stride[1];
    int vbase = b * v.stride[0] + kvh * v.stride[1];
    for (uint e = tid; e < BK * D; e += WG) {
        uint j = e / D, d = e % D;
        bool ok = int(j) < bk;
        int s = s0 + int(j);
        sK[j * DP + d] = ok ? ts_load(k.addr, k.dtype,
                                      kbase + s * k.stride[2] +
                                          int(d) * k.stride[3])
                            : 0.0;
        sV[j * DP + d] = ok ? ts_load(v.addr, v.dtype,
                                      vbase + s * v.stride[2] +
                                          int(d) * v.stride[3])
                            : 0.0;
    }

    float dk[NC], dv[NC];
    for (uint c = 0; c < NC; c++)
        dk[c] = 0.0, dv[c] = 0.0;
    const int nqb = (g_T + int(BQ) - 1) / int(BQ);
    for (int h = kvh * G; h < (kvh + 1) * G; h++)
        for (int qb = 0; qb < nqb; qb++) {
            int t0 = qb * int(BQ), bq = min(int(BQ), g_T - t0);
            // query blocks that see none of these keys are skipped (the
            // forward never computed them either)
            if (key_lo(t0) >= s0 + bk || key_hi(t0 + bq - 1) <= s0)
                continue;
            barrier(); // the last tile's Q, dO, P, dS are used up
            for (uint e = tid; e < BQ * D; e += WG) {
                uint i = e / D, d = e % D;
                bool ok = int(i) < bq;
                int t = t0 + int(i);
                sQ[i * DP + d] =
                    ok ? ts_load(q.addr, q.dtype, off4(q, b, h, t, int(d)))
                       : 0.0;
                sO[i * DP + d] =
                    ok ? ts_load(g.addr, g.dtype, off4(g, b, h, t, int(d)))
                       : 0.0;
            }
            if (tid < BQ) {
                int t = t0 + int(tid);
                bool ok = int(tid) < bq;
                sL[tid] = ok ? ts_load(lse.addr, lse.dtype,
                                       b * lse.stride[0] + h * lse.stride[1] +
                                           t * lse.stride[2])
                             : NEG_INF;
                sDi[tid] = ok ? BufF32(P.di).v[(b * H + h) * g_T + t] : 0.0;
            }
            barrier();
            for (uint e = tid; e < BQ * BK; e += WG) {
                uint i = e / BK, j = e % BK;
                int t = t0 + int(i), s = s0 + int(j);
                float p = 0.0, ds = 0.0;
                if (int(i) < bq && int(j) < bk && sL[i] != NEG_INF) {
                    float dot = 0.0, dp = 0.0;
                    for (uint d = 0; d < D; d++) {
                        dot += sQ[i * DP + d] * sK[j * DP + d];
                        dp += sO[i * DP + d] * sV[j * DP + d];
                    }
                    float x = dot * scale, dcap = 1.0;
                    if (cap > 0.0) {
                        float th = tanh(x * icap);
                        x = cap * th;
                        dcap = 1.0 - th * th;
                    }
                    if (has_mask)
                        x += ts_load(mask.addr, mask.dtype,
                                     off4(mask, b, h, t, s));
                    if (s < key_lo(t) || s >= key_hi(t))
                        x = NEG_INF;
                    p = x == NEG_INF ? 0.0 : exp(x - sL[i]);
                    ds = p * (dp - sDi[i]) * scale * dcap;
                }
                sP[e] = p;
                sDS[e] = ds;
            }
            barrier();
            for (uint c = 0; c < NC; c++) {
                uint d = part + R * c;
                if (d < D) {
                    float av = dv[c], ak = dk[c];
                    for (int i = 0; i < bq; i++) {
                        av += sP[i * BK + krow] * sO[i * DP + d];
                        ak += sDS[i * BK + krow] * sQ[i * DP + d];
                    }
                    dv[c] = av, dk[c] = ak;
                }
            }
        }

    if (int(krow) >= bk)
        return;
    int s = s0 + int(krow);
    int rowoff = ((b * KV + kvh) * g_S + s) * int(D);
    for (uint c = 0; c < NC; c++) {
        uint d = part + R * c;
        if (d < D) {
            ts_store(P.dst, q.dtype, P.nq + rowoff + int(d), dk[c]);
            ts_store(P.dst, q.dtype, P.nq + P.nk + rowoff + int(d), dv[c]);
        }
    }
}
