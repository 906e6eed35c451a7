#version 460
// moe_route.comp — the experts MLP's routing (k_moe.c): the routed slots
// s = n * K + j of idx (N, K) listed per expert in slot order, each
// expert's list starting at a multiple of TM rows and padded with -1 to
// one, so that every tile of TM rows belongs to one expert.
//   phase 0, E + 1 workgroups: cnt[e] = slots routed to e; the last
//     workgroup sets pos[s] = -1 for slots routed nowhere (-1, or an
//     index outside [0, E): skipped, as the Vulkan gathers skip them)
//   phase 1, E workgroups: pstart[e] (padded rows before e), slot_of
//     (rows -> slot or -1), pos (slot -> row), tile_expert (tile -> e or
//     -1); the last one also pads past the end (slot_of, tile_expert)
// Every expert scans all slots itself: no atomics, the order is the slots'.
#include "common.glsl"

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc idx;
    uint64_t cnt, pstart, slot_of, tile_expert, pos;
    int N, K, E, TM, T_max, phase;
};

shared int sh[256];

int expert_of(Params p, int s) {
    int n = s / p.K, j = s - n * p.K;
    int64_t e = ts_load_i64(p.idx.addr, p.idx.dtype,
                            n * p.idx.stride[0] + j * p.idx.stride[1]);
    return e >= 0 && e < int64_t(p.E) ? int(e) : -1;
}

// the sum of v over the workgroup (every invocation gets it)
int wg_sum(int v) {
    uint lid = gl_LocalInvocationID.x;
    sh[lid] = v;
    barrier();
    for (uint h = 128; h > 0; h >>= 1) {
        if (lid < h) sh[lid] += sh[lid + h];
        barrier();
    }
    int r = sh[0];
    barrier();
    return r;
}

// inclusive prefix sum of v over the workgroup's invocations
int wg_scan(int v) {
    uint lid = gl_LocalInvocationID.x;
    sh[lid] = v;
    barrier();
    for (uint h = 1; h < 256; h <<= 1) {
        int add = lid >= h ? sh[lid - h] : 0;
        barrier();
        sh[lid] += add;
        barrier();
    }
    int r = sh[lid];
    barrier();
    return r;
}

int padded(int c, int tm) { return (c + tm - 1) / tm * tm; }

void main() {
    Params p = Params(pc.params);
    int e = int(gl_WorkGroupID.x), lid = int(gl_LocalInvocationID.x);
    int NK = p.N * p.K;
    BufI32 cnt = BufI32(p.cnt), pos = BufI32(p.pos);
    if (p.phase == 0) {
        if (e == p.E) {
            for (int s = lid; s < NK; s += 256)
                if (expert_of(p, s) < 0) pos.v[s] = -1;
            return;
        }
        int c = 0;
        for (int s = lid; s < NK; s += 256)
            c += expert_of(p, s) == e ? 1 : 0;
        c = wg_sum(c);
        if (lid == 0) cnt.v[e] = c;
        return;
    }
    BufI32 slot_of = BufI32(p.slot_of), tiles = BufI32(p.tile_expert);
    int before = 0;
    for (int q = lid; q < e; q += 256) before += padded(cnt.v[q], p.TM);
    int base = wg_sum(before), mine = cnt.v[e], done = 0;
    for (int s0 = 0; s0 < NK && done < mine; s0 += 256) {
        int s = s0 + lid;
        int flag = s < NK && expert_of(p, s) == e ? 1 : 0;
        int incl = wg_scan(flag);
        if (flag != 0) {
            int row = base + done + incl - 1;
            slot_of.v[row] = s;
            pos.v[s] = row;
        }
        done += wg_sum(flag);
    }
    int rows = padded(mine, p.TM);
    for (int r = mine + lid; r < rows; r += 256) slot_of.v[base + r] = -1;
    for (int t = lid; t < rows / p.TM; t += 256) tiles.v[base / p.TM + t] = e;
    if (lid == 0) BufI32(p.pstart).v[e] = base;
    if (e == p.E - 1) {
        int total = base + rows;
        if (lid == 0) BufI32(p.pstart).v[p.E] = total;
        for (int t = total / p.TM + lid; t < p.T_max; t += 256)
            tiles.v[t] = -1;
        for (int r = total + lid; r < p.T_max * p.TM; r += 256)
            slot_of.v[r] = -1;
    }
}
