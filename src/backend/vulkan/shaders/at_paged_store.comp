#version 460
#include "common.glsl"

// at_paged_store.comp — paged attention's first step (k_attention.c): the
// new tokens' keys and values (1, KV, N, D) into their sequences' blocks of
// the pools (blocks, KV, block size, D), through meta's block table. One
// thread per (kv head, token, dim), grid-stride.

layout(local_size_x = 128) in;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc q, k, v, kpool, vpool;
    uint64_t meta, dst, part;
    int H, KV, N, D;
    int nsplit, window, nhb, pad_;
    float scale, softcap;
};

// the sequence of token j: the last i with start[i] <= j (start[0] = 0,
// start[n_seqs] = N > j)
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

void main() {
    Params P = Params(pc.params);
    BufI32 m = BufI32(P.meta);
    const int nseq = m.v[0], MB = m.v[1], N = P.N, D = P.D;
    const int clen0 = 2 + nseq + 1, table0 = clen0 + nseq;
    TDesc k = P.k, v = P.v, kp = P.kpool, vp = P.vpool;
    const int BS = kp.shape[2];
    const int total = P.KV * N * D;
    for (int e = int(gl_GlobalInvocationID.x); e < total;
         e += int(gl_NumWorkGroups.x * gl_WorkGroupSize.x)) {
        int d = e % D, j = e / D % N, h = e / (D * N);
        int i = seq_of(m, nseq, j);
        int pos = m.v[clen0 + i] + (j - m.v[2 + i]);
        int blk = m.v[table0 + i * MB + pos / BS], r = pos % BS;
        float kx = ts_load(k.addr, k.dtype,
                           h * k.stride[1] + j * k.stride[2] + d * k.stride[3]);
        float vx = ts_load(v.addr, v.dtype,
                           h * v.stride[1] + j * v.stride[2] + d * v.stride[3]);
        ts_store(kp.addr, kp.dtype,
                 blk * kp.stride[0] + h * kp.stride[1] + r * kp.stride[2] +
                     d * kp.stride[3],
                 kx);
        ts_store(vp.addr, vp.dtype,
                 blk * vp.stride[0] + h * vp.stride[1] + r * vp.stride[2] +
                     d * vp.stride[3],
                 vx);
    }
}
