#version 460
#include "common.glsl"

// at_paged.comp — paged attention (k_attention.c, after at_paged_store):
// one workgroup per (key split, block of BQ query heads sharing a kv head,
// token). The token attends to its sequence's positions [lo, pos] (pos =
// ctx_len + its index in the sequence; lo from the window), read through
// the block table in tiles of BK keys (K, then V, through one shared
// buffer) with an online softmax, as at_fwd.comp. With nsplit > 1 those
// positions are cut into nsplit ranges (flash-decoding) and each writes
// its partial (max, sum, unnormalized output) for at_paged_combine.comp;
// with one split the output (1, H, N, D) is written here.

layout(constant_id = 0) const uint D = 64;  // head dim
layout(constant_id = 1) const uint BQ = 4;  // query heads per workgroup
layout(constant_id = 2) const uint BK = 32; // keys per tile
layout(local_size_x = 128) in;
const uint WG = 128;
const uint R = WG / BQ;          // threads per head row
const uint DP = D + 1;           // padded shared row
const uint NC = (D + R - 1) / R; // output dims per thread

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc q, k, v, kpool, vpool;
    uint64_t meta, dst, part; // part: (N, H, nsplit) x (m, l), then x D
    int H, KV, N, D_;
    int nsplit, window, nhb, pad_;
    float scale, softcap;
};

shared float sQ[BQ * DP];
shared float sKV[BK * DP];
shared float sS[BQ * BK];
shared float sP[BQ * BK];

#define NEG_INF (-1.0 / 0.0)

int seq_of(BufI32 m, int nseq, int j) {
    int lo = 0, hi = nseq;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (m.v[2 + mid] <= j)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

// pool rows [s0, s0 + n) of sequence position order, head kvh, into sKV
void load_tile(TDesc t, BufI32 m, int tab, int bs, int kvh, int s0, int n) {
    for (uint e = gl_LocalInvocationID.x; e < BK * D; e += WG) {
        uint j = e / D, d = e % D;
        float x = 0.0;
        if (int(j) < n) {
            int s = s0 + int(j);
            int blk = m.v[tab + s / bs];
            x = ts_load(t.addr, t.dtype,
                        blk * t.stride[0] + kvh * t.stride[1] +
                            (s % bs) * t.stride[2] + int(d) * t.stride[3]);
        }
        sKV[j * DP + d] = x;
    }
}

void main() {
    Params P = Params(pc.params);
    BufI32 m = BufI32(P.meta);
    const int nseq = m.v[0], MB = m.v[1];
    const int H = P.H, G = P.H / P.KV, N = P.N, nsplit = P.nsplit;
    const int sp = int(gl_WorkGroupID.x), j = int(gl_WorkGroupID.z);
    const int kvh = int(gl_WorkGroupID.y) / P.nhb,
              hb = int(gl_WorkGroupID.y) % P.nhb;
    const uint tid = gl_LocalInvocationID.x, row = tid / R, part = tid % R;
    const int nh = min(int(BQ), G - hb * int(BQ)); // live head rows
    const int h0 = kvh * G + hb * int(BQ);
    const float scale = P.scale, cap = P.softcap;
    const float icap = cap > 0.0 ? 1.0 / cap : 0.0;
    TDesc q = P.q, kp = P.kpool, vp = P.vpool;
    const int bs = kp.shape[2];

    int i = seq_of(m, nseq, j);
    int pos = m.v[2 + nseq + 1 + i] + (j - m.v[2 + i]);
    int lo = P.window > 0 && pos - P.window + 1 > 0 ? pos - P.window + 1 : 0;
    int nvis = pos + 1 - lo;
    int chunk = ((nvis + nsplit - 1) / nsplit + int(BK) - 1) / int(BK) *
                int(BK);
    int k_beg = lo + sp * chunk, k_end = min(pos + 1, k_beg + chunk);
    int tab = 2 + nseq + 1 + nseq + i * MB;

    for (uint e = tid; e < BQ * D; e += WG) {
        uint r = e / D, d = e % D;
        sQ[r * DP + d] =
            int(r) < nh ? ts_load(q.addr, q.dtype,
                                  (h0 + int(r)) * q.stride[1] +
                                      j * q.stride[2] + int(d) * q.stride[3])
                        : 0.0;
    }

    float mrow = NEG_INF, l = 0.0;
    float acc[NC];
    for (uint c = 0; c < NC; c++)
        acc[c] = 0.0;
    for (int s0 = k_beg; s0 < k_end; s0 += int(BK)) {
        int bk = min(int(BK), k_end - s0);
        barrier();
        load_tile(kp, m, tab, bs, kvh, s0, bk);
        barrier();
        for (uint e = tid; e < BQ * BK; e += WG) {
            uint r = e / BK, jj = e % BK;
            float x = NEG_INF;
            if (int(r) < nh && int(jj) < bk) {
                float dot = 0.0;
                for (uint d = 0; d < D; d++)
                    dot += sQ[r * DP + d] * sKV[jj * DP + d];
                x = dot * scale;
                if (cap > 0.0)
                    x = cap * tanh(x * icap);
            }
            sS[e] = x;
        }
        barrier();
        load_tile(vp, m, tab, bs, kvh, s0, bk);
        float mx = mrow;
        for (uint jj = 0; jj < BK; jj++)
            mx = max(mx, sS[row * BK + jj]);
        float corr = 1.0;
        if (mx != NEG_INF) {
            corr = mrow == NEG_INF ? 0.0 : exp(mrow - mx);
            mrow = mx;
        }
        for (uint jj = part; jj < BK; jj += R) {
            float x = sS[row * BK + jj];
            sP[row * BK + jj] = x == NEG_INF ? 0.0 : exp(x - mx);
        }
        barrier();
        float sum = 0.0;
        for (uint jj = 0; jj < BK; jj++)
            sum += sP[row * BK + jj];
        l = l * corr + sum;
        for (uint c = 0; c < NC; c++) {
            uint d = part + R * c;
            if (d < D) {
                float a = acc[c] * corr;
                for (int jj = 0; jj < bk; jj++)
                    a += sP[row * BK + jj] * sKV[jj * DP + d];
                acc[c] = a;
            }
        }
    }

    if (int(row) >= nh)
        return;
    int h = h0 + int(row);
    if (nsplit == 1) {
        float inv = l > 0.0 ? 1.0 / l : 0.0;
        for (uint c = 0; c < NC; c++) {
            uint d = part + R * c;
            if (d < D)
                BufF32(P.dst).v[(h * N + j) * int(D) + int(d)] = acc[c] * inv;
        }
        return;
    }
    int slot = (j * H + h) * nsplit + sp;
    if (part == 0) {
        BufF32(P.part).v[2 * slot] = mrow;
        BufF32(P.part).v[2 * slot + 1] = l;
    }
    int abase = 2 * N * H * nsplit + slot * int(D);
    for (uint c = 0; c < NC; c++) {
        uint d = part + R * c;
        if (d < D)
            BufF32(P.part).v[abase + int(d)] = acc[c];
    }
}
