#version 460
#include "common.glsl"

// at_fwd.comp — the attention forward (k_attention.c, the CPU's
// attention.c): one workgroup per (query block of BQ rows, head, batch).
// K and then V tiles of BK keys go through one shared buffer; an online
// softmax keeps each row's running max m and sum l, so no T x S matrix
// exists. Writes out (B, H, T, D) and the log-sum-exp (B, H, T) f32.
// Scores are owned linearly (thread e -> row e / BK, key e % BK); the
// output accumulators by rows (R threads per row, dims part + R c).

layout(constant_id = 0) const uint D = 64;  // head dim
layout(constant_id = 1) const uint BQ = 16; // query rows per workgroup
layout(constant_id = 2) const uint BK = 32; // keys per tile
layout(local_size_x = 128) in;
const uint WG = 128;
const uint R = WG / BQ;          // threads per row
const uint DP = D + 1;           // padded shared row: no bank conflicts
const uint NC = (D + R - 1) / R; // output dims per thread

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc q, k, v, o, mask; // mask: broadcast to (B, H, T, S)
    uint64_t lse;           // (B, H, T) f32, contiguous
    int H, KV, T, S;
    int causal, window, has_mask, pad_;
    float scale, softcap;
};

shared float sQ[BQ * DP];
shared float sKV[BK * DP];
shared float sS[BQ * BK]; // scores
shared float sP[BQ * BK]; // probabilities

#define NEG_INF (-1.0 / 0.0)

int g_T, g_S, g_window, g_causal;

// the keys query t sees: [key_lo, key_hi) (the mask may hide more)
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

// rows [s0, s0 + n) of K or V head (b, kvh) into sKV, zeros past n
void load_tile(TDesc t, int b, int kvh, int s0, int n) {
    int base = b * t.stride[0] + kvh * t.stride[1];
    for (uint e = gl_LocalInvocationID.x; e < BK * D; e += WG) {
        uint j = e / D, d = e % D;
        sKV[j * DP + d] =
            int(j) < n ? ts_load(t.addr, t.dtype,
                                 base + (s0 + int(j)) * t.stride[2] +
                                     int(d) * t.stride[3])
                       : 0.0;
    }
}

void main() {
    Params P = Params(pc.params);
    g_T = P.T, g_S = P.S, g_window = P.window, g_causal = P.causal;
    const int H = P.H, G = P.H / P.KV;
    const int qb = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y),
              b = int(gl_WorkGroupID.z), kvh = h / G;
    const uint tid = gl_LocalInvocationID.x, row = tid / R, part = tid % R;
    const int t0 = qb * int(BQ), bq = min(int(BQ), g_T - t0);
    const float scale = P.scale, cap = P.softcap;
    const float icap = cap > 0.0 ? 1.0 / cap : 0.0;
    const bool has_mask = P.has_mask != 0;
    TDesc q = P.q, k = P.k, v = P.v, mask = P.mask;

    int qbase = b * q.stride[0] + h * q.stride[1];
    for (uint e = tid; e < BQ * D; e += WG) {
        uint i = e / D, d = e % D;
        sQ[i * DP + d] =
            int(i) < bq ? ts_load(q.addr, q.dtype,
                                  qbase + (t0 + int(i)) * q.stride[2] +
                                      int(d) * q.stride[3])
                        : 0.0;
    }

    float m = NEG_INF, l = 0.0;
    float acc[NC];
    for (uint c = 0; c < NC; c++)
        acc[c] = 0.0;
    // the keys this block can see; blocks outside are never computed
    const int s_beg = key_lo(t0), s_end = key_hi(t0 + bq - 1);
    for (int s0 = s_beg; s0 < s_end; s0 += int(BK)) {
        int bk = min(int(BK), s_end - s0);
        barrier(); // the last tile's V and probabilities are used up
        load_tile(k, b, kvh, s0, bk);
        barrier();
        for (uint e = tid; e < BQ * BK; e += WG) {
            uint i = e / BK, j = e % BK;
            int t = t0 + int(i), s = s0 + int(j);
            float x = NEG_INF;
            if (int(i) < bq && int(j) < bk) {
                float dot = 0.0;
                for (uint d = 0; d < D; d++)
                    dot += sQ[i * DP + d] * sKV[j * DP + d];
                x = dot * scale;
                if (cap > 0.0)
                    x = cap * tanh(x * icap);
                if (has_mask)
                    x += ts_load(mask.addr, mask.dtype, off4(mask, b, h, t, s));
                if (s < key_lo(t) || s >= key_hi(t))
                    x = NEG_INF;
            }
            sS[e] = x;
        }
        barrier(); // scores complete, K no longer read
        load_tile(v, b, kvh, s0, bk);
        float mx = m;
        for (uint j = 0; j < BK; j++)
            mx = max(mx, sS[row * BK + j]);
        float corr = 1.0;
        if (mx != NEG_INF) { // else nothing visible yet: the row stays
            corr = m == NEG_INF ? 0.0 : exp(m - mx);
            m = mx;
        }
        for (uint j = part; j < BK; j += R) {
            float x = sS[row * BK + j];
            sP[row * BK + j] = x == NEG_INF ? 0.0 : exp(x - mx);
        }
        barrier();
        float sum = 0.0;
        for (uint j = 0; j < BK; j++)
            sum += sP[row * BK + j];
        l = l * corr + sum;
        for (uint c = 0; c < NC; c++) {
            uint d = part + R * c;
            if (d < D) {
                float a = acc[c] * corr;
                for (int j = 0; j < bk; j++)
                    a += sP[row * BK + j] * sKV[j * DP + d];
                acc[c] = a;
            }
        }
    }

    if (int(row) >= bq)
        return;
    int t = t0 + int(row);
    // a row that sees no key gives 0 (PyTorch gives NaN), as the CPU's
    float inv = l > 0.0 ? 1.0 / l : 0.0;
    TDesc o = P.o;
    int obase = off4(o, b, h, t, 0);
    for (uint c = 0; c < NC; c++) {
        uint d = part + R * c;
        if (d < D)
            ts_store(o.addr, o.dtype, obase + int(d) * o.stride[3],
                     acc[c] * inv);
    }
    if (part == 0)
        BufF32(P.lse).v[(b * H + h) * g_T + t] =
            l > 0.0 ? m + log(l) : NEG_INF;
}
