/* layers.c — the stateless layers of the nn layer: linear (Hugging Face
 * weight layout) and the SwiGLU MLP. Built from the public ops only, so the
 * same calls serve eager and compiled mode; owns no state and no kernels. */
#include "tessera_nn.h"

/* x (..., in), w (out, in), b (out) or NULL -> (..., out). */
ts_tensor *ts_linear(ts_tensor *x, ts_tensor *w, ts_tensor *b) {
    ts_tensor *wt = ts_transpose(w, 0, 1); /* (in, out), a view */
    ts_tensor *y = ts_matmul(x, wt);
    ts_release(wt);
    if (!b || !y)
        return y;
    ts_tensor *yb = ts_add(y, b);
    ts_release(y);
    return yb;
}

/* x (..., C) -> gate, up (..., F) -> silu(gate) * up (..., F) -> (..., C) */
ts_tensor *ts_swiglu_mlp(ts_tensor *x, ts_tensor *gate_w, ts_tensor *up_w,
                         ts_tensor *down_w) {
    ts_tensor *gate = ts_linear(x, gate_w, NULL);
    ts_tensor *act = ts_silu(gate);
    ts_release(gate);
    ts_tensor *up = ts_linear(x, up_w, NULL);
    ts_tensor *h = ts_mul(act, up);
    ts_release(act), ts_release(up);
    ts_tensor *y = ts_linear(h, down_w, NULL);
    ts_release(h);
    return y;
}
