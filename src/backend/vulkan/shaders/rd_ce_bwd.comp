#version 460
// rd_ce_bwd.comp — cross-entropy backward, a workgroup per row:
// dlogits = (softmax(x) - one_hot(target)) * scale from the saved lse;
// scale = g[r] (no reduction), g (sum) or g / count (mean); ignored rows 0.
#include "common.glsl"

layout(local_size_x = 256) in;

// rd_ce_params in k_reduce.c (as rd_ce_fwd.comp)
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc x;
    TDesc t;
    TDesc g;
    TDesc lse;
    uint64_t dst;
    uint64_t aux;
    int64_t ignore;
    int outdt, N, V, red;
};

#define RED_MEAN 0
#define RED_SUM 1

void main() {
    Params p = Params(pc.params);
    TDesc x = p.x;
    int V = p.V, xs1 = x.stride[1], outdt = p.outdt;
    uint64_t dst = p.dst;
    int tid = int(gl_LocalInvocationID.x);
    for (int r = int(gl_WorkGroupID.x); r < p.N; r += int(gl_NumWorkGroups.x)) {
        int xo = r * x.stride[0];
        int64_t tg = ts_load_i64(p.t.addr, p.t.dtype, r * p.t.stride[0]);
        float scale;
        if (p.red == RED_SUM) scale = ts_load(p.g.addr, p.g.dtype, 0);
        else if (p.red == RED_MEAN)
            scale = ts_load(p.g.addr, p.g.dtype, 0) / float(BufI32(p.aux).v[0]);
        else scale = ts_load(p.g.addr, p.g.dtype, r * p.g.stride[0]);
        if (tg == p.ignore) {
            for (int k = tid; k < V; k += 256) ts_store(dst, outdt, r * V + k, 0.0);
            continue;
        }
        float lse = ts_load(p.lse.addr, DT_F32, r * p.lse.stride[0]);
        int tk = int(tg);
        for (int k = tid; k < V; k += 256) {
            float d = exp(ts_load(x.addr, x.dtype, xo + k * xs1) - lse) * scale;
            if (k == tk) d -= scale;
            ts_store(dst, outdt, r * V + k, d);
        }
    }
}
