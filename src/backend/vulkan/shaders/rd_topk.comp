#version 460
// rd_topk.comp — indices of the k largest along the last dim, best first
// (NaN above every number, ties by lower index: the CPU's order). One
// invocation per element computes its rank in its row, the number of
// elements that come before it; ranks below k are written. O(n) reads per
// element: meant for routers' rows (tens to a few hundred experts).
#include "common.glsl"

layout(local_size_x = 64) in;

// rd_topk_params in k_reduce.c
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc x; // its leading dims (rows), coalesced; the last dim by xs
    uint64_t dst;
    int rows, n, k, xs;
};

bool is_nan(float v) { return (floatBitsToUint(v) & 0x7fffffffu) > 0x7f800000u; }
bool ranks_above(float a, float b) { return a > b || (is_nan(a) && !is_nan(b)); }

void main() {
    Params p = Params(pc.params);
    TDesc x = p.x;
    int n = p.n, k = p.k, xs = p.xs, total = p.rows * n;
    int stride = int(gl_NumWorkGroups.x * gl_WorkGroupSize.x);
    for (int e = int(gl_GlobalInvocationID.x); e < total; e += stride) {
        int row = e / n, i = e - row * n;
        int base = x.ndim == 1 ? row * x.stride[0] : ts_offset(x, row);
        float xi = ts_load(x.addr, x.dtype, base + i * xs);
        int rank = 0;
        for (int j = 0; j < n && rank < k; j++) {
            float xj = ts_load(x.addr, x.dtype, base + j * xs);
            if (ranks_above(xj, xi) || (j < i && !ranks_above(xi, xj))) rank++;
        }
        if (rank < k) BufI64(p.dst).v[row * k + rank] = int64_t(i);
    }
}
