#version 460
// nr_rope.comp — the rotary embedding in the rotate-half layout, as
// cpu_rope (norm.c); h = D/2, cos/sin broadcast to x (tables built on the
// host: ts_rope_tables). DIR > 0:
//   y[d]   = x[d] c[d]     - x[d+h] s[d]
//   y[d+h] = x[d+h] c[d+h] + x[d] s[d+h]
// DIR < 0 (the backward) applies the transpose. Invocation (i, row) does
// the pair (i, i+h) of a row; workgroups tile (h, rows), grid-stride over
// rows. Workgroup size: constants 0 (x) and 1 (y).
#include "common.glsl"

layout(local_size_x_id = 0, local_size_y_id = 1) in;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    TDesc x, cs, sn, y; // cs, sn: strides broadcast to x's shape
    int h, rows;
    float dir;
};

void main() {
    Params p = Params(pc.params);
    TDesc x = p.x, cs = p.cs, sn = p.sn, y = p.y;
    int h = p.h, nl = x.ndim - 1, i = int(gl_GlobalInvocationID.x);
    if (i >= h)
        return;
    int xd = x.stride[nl], cd = cs.stride[nl], sd = sn.stride[nl],
        yd = y.stride[nl];
    bool fwd = p.dir > 0.0;
    int step = int(gl_NumWorkGroups.y * gl_WorkGroupSize.y);
    for (int r = int(gl_GlobalInvocationID.y); r < p.rows; r += step) {
        int ox = 0, oc = 0, os = 0, oy = 0, rem = r;
        for (int d = nl - 1; d >= 0; d--) {
            int s = x.shape[d], k = rem % s;
            rem /= s;
            ox += k * x.stride[d];
            oc += k * cs.stride[d];
            os += k * sn.stride[d];
            oy += k * y.stride[d];
        }
        float x1 = ts_load(x.addr, x.dtype, ox + i * xd);
        float x2 = ts_load(x.addr, x.dtype, ox + (i + h) * xd);
        float c1 = ts_load(cs.addr, cs.dtype, oc + i * cd);
        float c2 = ts_load(cs.addr, cs.dtype, oc + (i + h) * cd);
        float s1 = ts_load(sn.addr, sn.dtype, os + i * sd);
        float s2 = ts_load(sn.addr, sn.dtype, os + (i + h) * sd);
        float y1, y2;
        if (fwd) {
            y1 = x1 * c1 - x2 * s1;
            y2 = x2 * c2 + x1 * s2;
        } else {
            y1 = x1 * c1 + x2 * s2;
            y2 = x2 * c2 - x1 * s1;
        }
        ts_store(y.addr, y.dtype, oy + i * yd, y1);
        ts_store(y.addr, y.dtype, oy + (i + h) * yd, y2);
    }
}
