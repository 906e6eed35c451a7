/* k_reduce.c — the Vulkan kernels that reduce or index: sum, mean, amax and
 * argmax over any set of dims; softmax / log_softmax over one dim; fused
 * cross-entropy and its backward; embedding, its backward and index_add_;
 * fused AdamW; and the router's ops (topk, gather and its backward,
 * one_hot). Shaders: shaders/rd_*.comp. Each kernel computes what the CPU
 * kernel of its op computes (src/backend/cpu/reduce.c, loss.c,
 * elementwise.c, routing.c), in f32.
 *
 * Scatter-adds (embedding's and gather's backward, index_add_) use no
 * atomics: each output element is owned by one invocation that adds in the
 * CPU's order, so results are deterministic and equal the CPU's bit for
 * bit.
 *
 * What the CPU checks on index values (ids, targets, gather indices in
 * range) needs the values on the host; here it would cost a wait on the
 * device, so the shaders instead skip an index out of range (a zero row,
 * no add) and a cross-entropy target out of range gives a NaN loss. */
#include "backend/vulkan/vk.h"

#include <string.h>

enum { OP_SUM = 0, OP_MAX = 1, OP_ARGMAX = 2 };

/* ---- helpers ---- */

/* Dims walked by up to three stride arrays at once, merged where every
 * array walks two neighbours as one (st[d] == st[d+1] * shape[d+1]) and
 * without dims of size 1: the row-major flat index over them is the same
 * as over the dims pushed, and most views come down to one or two dims. */
typedef struct {
    int n;
    int64_t shape[TS_MAX_DIMS];
    int64_t st[3][TS_MAX_DIMS];
    int64_t count;
} dimset;

static void dims_init(dimset *s) {
    memset(s, 0, sizeof *s);
    s->count = 1;
}

static void dims_push(dimset *s, int nst, int64_t size, int64_t st0,
                      int64_t st1) {
    int64_t st[2] = {st0, st1};
    s->count *= size;
    if (size == 1)
        return;
    bool merge = s->n > 0;
    for (int k = 0; merge && k < nst; k++)
        merge = s->st[k][s->n - 1] == st[k] * size;
    if (merge) {
        s->shape[s->n - 1] *= size;
        for (int k = 0; k < nst; k++)
            s->st[k][s->n - 1] = st[k];
        return;
    }
    s->shape[s->n] = size;
    for (int k = 0; k < nst; k++)
        s->st[k][s->n] = st[k];
    s->n++;
}

static void dims_to_i32(const dimset *s, int k, int32_t *shape, int32_t *st) {
    for (int d = 0; d < s->n; d++) {
        shape[d] = (int32_t)s->shape[d];
        st[d] = (int32_t)s->st[k][d];
    }
}

/* t's descriptor with its dims merged as dimset's (flat index kept) */
static ts_status desc_flat(ts_ctx *ctx, const ts_tensor *t, vk_tdesc *o) {
    if (vk_desc(ctx, t, o))
        return ctx->status;
    dimset s;
    dims_init(&s);
    for (int d = 0; d < t->ndim; d++)
        dims_push(&s, 1, t->shape[d], t->strides[d], 0);
    o->ndim = s.n;
    memset(o->shape, 0, sizeof o->shape);
    memset(o->stride, 0, sizeof o->stride);
    dims_to_i32(&s, 0, o->shape, o->stride);
    return TS_OK;
}

/* t's descriptor over its leading dims only (rows of its last dim),
 * merged; *last_stride gets the last dim's stride */
static ts_status desc_rows(ts_ctx *ctx, const ts_tensor *t, vk_tdesc *o,
                           int32_t *last_stride) {
    if (vk_desc(ctx, t, o))
        return ctx->status;
    dimset s;
    dims_init(&s);
    for (int d = 0; d + 1 < t->ndim; d++)
        dims_push(&s, 1, t->shape[d], t->strides[d], 0);
    *last_stride = t->ndim ? (int32_t)t->strides[t->ndim - 1] : 0;
    o->ndim = s.n;
    memset(o->shape, 0, sizeof o->shape);
    memset(o->stride, 0, sizeof o->stride);
    dims_to_i32(&s, 0, o->shape, o->stride);
    return TS_OK;
}

static ts_status launch(ts_ctx *ctx, vk_dev *d, const char *shader,
                        const void *params, size_t bytes, uint32_t groups) {
    vk_launch_desc l = {.shader = shader,
                        .params = params,
                        .params_bytes = bytes,
                        .groups = {groups, 1, 1}};
    return vk_launch(ctx, d, &l);
}
#define LAUNCH(shader, p, groups)                                              \
    launch(ctx, d, shader, &(p), sizeof(p), groups)

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}
static int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* rd_fill.comp: n f32 at addr = value, or n f32 from src stored as dt */
typedef struct {
    uint64_t addr, src;
    int32_t n, dt;
    float value;
    int32_t pad;
} rd_fill_params;
_Static_assert(sizeof(rd_fill_params) == 32, "rd_fill_params vs rd_fill");

static ts_status fill_f32(ts_ctx *ctx, vk_dev *d, uint64_t addr, int64_t n,
                          float value) {
    rd_fill_params p = {
        .addr = addr, .n = (int32_t)n, .dt = TS_F32, .value = value};
    return LAUNCH("rd_fill", p, vk_groups_for(d, n, 256));
}

/* y (contiguous, its dtype) = n f32 accumulated at src */
static ts_status store_f32(ts_ctx *ctx, vk_dev *d, const ts_tensor *y,
                           uint64_t src, int64_t n) {
    rd_fill_params p = {
        .addr = vk_addr(y), .src = src, .n = (int32_t)n, .dt = y->dtype};
    return LAUNCH("rd_fill", p, vk_groups_for(d, n, 256));
}

/* an f32 accumulator for a result y: y itself when it is f32, else
 * temporary memory (0 with the error set when the device is full) */
static uint64_t accumulator(ts_ctx *ctx, vk_dev *d, const ts_tensor *y,
                            int64_t n) {
    if (y->dtype == TS_F32)
        return vk_addr(y);
    return vk_temp(ctx, d, (size_t)n * sizeof(float));
}

/* ---- sum, mean, amax, argmax ---- */

typedef struct {
    uint64_t x, y;
    int32_t xdt, ydt, nk, nr;
    int32_t kshape[TS_MAX_DIMS], kst[TS_MAX_DIMS];
    int32_t rshape[TS_MAX_DIMS], rst[TS_MAX_DIMS];
    int32_t kcount, rcount, slices, chunk, op;
    float scale;
} rd_reduce_params;
_Static_assert(sizeof(rd_reduce_params) == 184,
               "rd_reduce_params vs rd_reduce_*.comp");

/* Runs p (all but slices and chunk filled). A workgroup per output when
 * the reduced elements are contiguous or the outputs few; an invocation per
 * output when the kept inner dim is the contiguous one (a reduction over
 * outer dims: each loop step reads a coalesced line) or the reduction is
 * short. A long reduction with few outputs (split) is cut into slices
 * whose f32 partials, laid out (output, slice), a second pass reduces. */
static ts_status reduce_launch(ts_ctx *ctx, vk_dev *d, rd_reduce_params *p,
                               bool split) {
    int64_t K = p->kcount, R = p->rcount;
    bool serial = R <= 32 || (p->nk > 0 && p->kst[p->nk - 1] == 1 &&
                              p->rst[p->nr - 1] != 1 && K >= 64);
    int64_t S = 1;
    if (split && p->op != OP_ARGMAX) {
        if (serial && R > 256 && K < 16384)
            S = min64(min64(ceil_div(R, 128), ceil_div(65536, K)), 1024);
        else if (!serial && R > 8192 && K < 1024)
            S = min64(min64(ceil_div(R, 4096), ceil_div(2048, K)), 1024);
    }
    int64_t chunk = ceil_div(R, S);
    S = chunk ? ceil_div(R, chunk) : 1;
    p->slices = (int32_t)S;
    p->chunk = (int32_t)chunk;
    const char *shader = serial ? "rd_reduce_serial" : "rd_reduce_tree";
    uint32_t groups = vk_groups_for(d, K * S, serial ? 64 : 1);
    if (S == 1)
        return LAUNCH(shader, *p, groups);
    rd_reduce_params q = *p;
    q.y = vk_temp(ctx, d, (size_t)(K * S) * sizeof(float));
    q.ydt = TS_F32;
    if (!q.y || LAUNCH(shader, q, groups))
        return ctx->status;
    /* partials (K, S): the same op over S, the scale applied once */
    rd_reduce_params r = {.x = q.y,
                          .y = p->y,
                          .xdt = TS_F32,
                          .ydt = p->ydt,
                          .nk = K > 1,
                          .nr = 1,
                          .kshape = {(int32_t)K},
                          .kst = {(int32_t)S},
                          .rshape = {(int32_t)S},
                          .rst = {1},
                          .kcount = (int32_t)K,
                          .rcount = (int32_t)S,
                          .op = p->op,
                          .scale = p->scale};
    return reduce_launch(ctx, d, &r, false);
}

/* x's dims split into kept (outputs, row-major) and reduced ones */
static ts_status reduce_plan(ts_ctx *ctx, const ts_node *n,
                             rd_reduce_params *p) {
    ts_tensor *x = n->in[0], *y = n->out;
    vk_tdesc xd, yd;
    if (vk_desc(ctx, x, &xd) || vk_desc(ctx, y, &yd))
        return ctx->status;
    bool red[TS_MAX_DIMS] = {0};
    for (int k = 0; k < n->attrs.ni; k++)
        red[n->attrs.i[k]] = true;
    dimset kept, rd;
    dims_init(&kept);
    dims_init(&rd);
    for (int dd = 0; dd < x->ndim; dd++)
        dims_push(red[dd] ? &rd : &kept, 1, x->shape[dd], x->strides[dd], 0);
    memset(p, 0, sizeof *p);
    p->x = xd.addr;
    p->y = yd.addr;
    p->xdt = x->dtype;
    p->ydt = y->dtype;
    p->nk = kept.n;
    p->nr = rd.n;
    dims_to_i32(&kept, 0, p->kshape, p->kst);
    dims_to_i32(&rd, 0, p->rshape, p->rst);
    p->kcount = (int32_t)kept.count;
    p->rcount = (int32_t)rd.count;
    return TS_OK;
}

/* x -> y over attrs.i's dims; sums in f32 (compensated per lane) */
ts_status vk_k_reduce(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    if (ts_tensor_numel(n->out) == 0)
        return TS_OK;
    rd_reduce_params p;
    if (reduce_plan(ctx, n, &p))
        return ctx->status;
    p.op = n->op == TS_OP_AMAX ? OP_MAX : OP_SUM;
    /* mean over nothing: 0 * inf = NaN, as the CPU */
    p.scale = n->op == TS_OP_MEAN ? (float)(1.0 / (double)p.rcount) : 1.0f;
    return reduce_launch(ctx, d, &p, true);
}

/* x -> i64 index of the first largest (the first NaN) over the dims */
ts_status vk_k_argmax(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    if (ts_tensor_numel(n->out) == 0)
        return TS_OK;
    rd_reduce_params p;
    if (reduce_plan(ctx, n, &p))
        return ctx->status;
    p.op = OP_ARGMAX;
    p.scale = 1.0f;
    return reduce_launch(ctx, d, &p, false);
}

/* ---- softmax, log_softmax ---- */

typedef struct {
    uint64_t x, y;
    int32_t xdt, ydt, L, xs, ys, nr;
    int32_t rshape[TS_MAX_DIMS], rxst[TS_MAX_DIMS], ryst[TS_MAX_DIMS];
    int32_t rows, log_out;
} rd_softmax_params;
_Static_assert(sizeof(rd_softmax_params) == 144,
               "rd_softmax_params vs rd_softmax_*.comp");

/* along attrs.i[0]; rows are the other dims (x and y merged together) */
ts_status vk_k_softmax(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *x = n->in[0], *y = n->out;
    if (ts_tensor_numel(x) == 0)
        return TS_OK;
    vk_tdesc xd, yd;
    if (vk_desc(ctx, x, &xd) || vk_desc(ctx, y, &yd))
        return ctx->status;
    int dim = (int)n->attrs.i[0];
    dimset rows;
    dims_init(&rows);
    for (int k = 0; k < x->ndim; k++)
        if (k != dim)
            dims_push(&rows, 2, x->shape[k], x->strides[k], y->strides[k]);
    rd_softmax_params p = {.x = xd.addr,
                           .y = yd.addr,
                           .xdt = x->dtype,
                           .ydt = y->dtype,
                           .L = (int32_t)x->shape[dim],
                           .xs = (int32_t)x->strides[dim],
                           .ys = (int32_t)y->strides[dim],
                           .nr = rows.n,
                           .rows = (int32_t)rows.count,
                           .log_out = n->op == TS_OP_LOG_SOFTMAX};
    dims_to_i32(&rows, 0, p.rshape, p.rxst);
    dims_to_i32(&rows, 1, p.rshape, p.ryst);
    /* a short row: an invocation per row, not a workgroup */
    if (p.L <= 64)
        return LAUNCH("rd_softmax_small", p, vk_groups_for(d, p.rows, 64));
    return LAUNCH("rd_softmax_rows", p, vk_groups_for(d, p.rows, 1));
}

/* ---- cross-entropy ---- */

typedef struct {
    vk_tdesc x, t, g, lse;
    uint64_t dst, aux;
    int64_t ignore;
    int32_t outdt, N, V, red;
} rd_ce_params;
_Static_assert(sizeof(rd_ce_params) == 360, "rd_ce_params vs rd_ce_*.comp");

/* logits (N, V), targets (N) -> loss (scalar or (N)), saved lse (N) */
ts_status vk_k_cross_entropy(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *x = n->in[0], *t = n->in[1], *y = n->out, *lse = n->saved[0];
    int64_t N = x->shape[0];
    ts_reduction red = (ts_reduction)n->attrs.i[1];
    rd_ce_params p = {.ignore = n->attrs.i[0],
                      .N = (int32_t)N,
                      .V = (int32_t)x->shape[1],
                      .red = red};
    if (vk_desc(ctx, x, &p.x) || vk_desc(ctx, t, &p.t) ||
        vk_desc(ctx, lse, &p.lse))
        return ctx->status;
    /* per-row losses: the result, or f32 for the reduction */
    uint64_t losses = vk_addr(y);
    p.outdt = y->dtype;
    if (red != TS_REDUCE_NONE) {
        losses = vk_temp(ctx, d, (size_t)(N ? N : 1) * sizeof(float));
        p.outdt = TS_F32;
        if (!losses)
            return ctx->status;
    }
    p.dst = losses;
    if (N > 0 && LAUNCH("rd_ce_fwd", p, vk_groups_for(d, N, 1)))
        return ctx->status;
    if (red == TS_REDUCE_NONE)
        return TS_OK;
    p.lse.addr = losses;
    p.dst = vk_addr(y);
    p.outdt = y->dtype;
    return LAUNCH("rd_ce_reduce", p, 1);
}

/* g, logits, targets, lse -> dlogits (N, V) */
ts_status vk_k_cross_entropy_backward(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *g = n->in[0], *x = n->in[1], *t = n->in[2], *lse = n->in[3];
    ts_tensor *y = n->out;
    int64_t N = x->shape[0];
    if (ts_tensor_numel(y) == 0)
        return TS_OK;
    ts_reduction red = (ts_reduction)n->attrs.i[1];
    rd_ce_params p = {.ignore = n->attrs.i[0],
                      .N = (int32_t)N,
                      .V = (int32_t)x->shape[1],
                      .red = red,
                      .outdt = y->dtype};
    if (vk_desc(ctx, x, &p.x) || vk_desc(ctx, t, &p.t) ||
        vk_desc(ctx, g, &p.g) || vk_desc(ctx, lse, &p.lse))
        return ctx->status;
    if (red == TS_REDUCE_MEAN) { /* the rows not ignored, counted first */
        rd_ce_params c = p;
        c.red = -1;
        c.dst = p.aux = vk_temp(ctx, d, sizeof(int32_t));
        if (!c.dst || LAUNCH("rd_ce_reduce", c, 1))
            return ctx->status;
    }
    p.dst = vk_addr(y);
    return LAUNCH("rd_ce_bwd", p, vk_groups_for(d, N, 1));
}

/* ---- embedding, its backward, index_add_ ---- */

typedef struct {
    vk_tdesc w, ids;
    uint64_t dst;
    int32_t N, C, es, pad;
} rd_embedding_params;
_Static_assert(sizeof(rd_embedding_params) == 184,
               "rd_embedding_params vs rd_embedding.comp");

/* out (ids..., C) = weight (V, C) rows at ids */
ts_status vk_k_embedding(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *w = n->in[0], *ids = n->in[1], *y = n->out;
    int64_t N = ts_tensor_numel(ids), C = w->shape[1];
    if (N * C == 0)
        return TS_OK;
    rd_embedding_params p = {.N = (int32_t)N,
                             .C = (int32_t)C,
                             .es = (int32_t)ts_dtype_size(w->dtype)};
    vk_tdesc yd;
    if (vk_desc(ctx, w, &p.w) || desc_flat(ctx, ids, &p.ids) ||
        vk_desc(ctx, y, &yd))
        return ctx->status;
    p.dst = yd.addr;
    return LAUNCH("rd_embedding", p, vk_groups_for(d, N * C, 256));
}

typedef struct {
    vk_tdesc src, ids;
    uint64_t acc;
    int32_t N, C, V, src_cs, ranges, vchunk;
} rd_scatter_params;
_Static_assert(sizeof(rd_scatter_params) == 192,
               "rd_scatter_params vs rd_scatter_rows.comp");

/* acc (V, C) f32 contiguous rows at ids += src rows (numel(ids), C) */
static ts_status scatter_rows(ts_ctx *ctx, vk_dev *d, uint64_t acc, int64_t V,
                              int64_t C, const ts_tensor *ids,
                              const ts_tensor *src) {
    int64_t N = ts_tensor_numel(ids);
    if (N == 0 || C == 0 || V == 0)
        return TS_OK;
    rd_scatter_params p = {
        .acc = acc, .N = (int32_t)N, .C = (int32_t)C, .V = (int32_t)V};
    if (desc_rows(ctx, src, &p.src, &p.src_cs) || desc_flat(ctx, ids, &p.ids))
        return ctx->status;
    /* (column, vocabulary range) owners: ~16k of them, so that a narrow
     * table still fills the device */
    int64_t ranges = min64(ceil_div(16384, C), V);
    int64_t vchunk = ceil_div(V, ranges);
    p.vchunk = (int32_t)vchunk;
    p.ranges = (int32_t)ceil_div(V, vchunk);
    return LAUNCH("rd_scatter_rows", p,
                  vk_groups_for(d, C * (int64_t)p.ranges, 64));
}

/* g (ids..., C), ids -> dweight (V, C) in g's dtype, f32 accumulation */
ts_status vk_k_embedding_backward(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *g = n->in[0], *ids = n->in[1], *y = n->out;
    int64_t V = y->shape[0], C = y->shape[1], VC = V * C;
    if (VC == 0)
        return TS_OK;
    vk_tdesc yd;
    if (vk_desc(ctx, y, &yd))
        return ctx->status;
    uint64_t acc = accumulator(ctx, d, y, VC);
    if (!acc || fill_f32(ctx, d, acc, VC, 0.0f) ||
        scatter_rows(ctx, d, acc, V, C, ids, g))
        return ctx->status;
    return y->dtype == TS_F32 ? TS_OK : store_f32(ctx, d, y, acc, VC);
}

/* in[0] (V, C) f32 contiguous rows at in[1] += in[2], in place */
ts_status vk_k_index_add(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *dst = n->in[0];
    vk_tdesc dd;
    if (ts_tensor_numel(dst) == 0)
        return TS_OK;
    if (vk_desc(ctx, dst, &dd))
        return ctx->status;
    return scatter_rows(ctx, d, dd.addr, dst->shape[0], dst->shape[1], n->in[1],
                        n->in[2]);
}

/* ---- AdamW ---- */

typedef struct {
    vk_tdesc g, h;
    uint64_t param, m, v;
    int32_t pdt, n;
} rd_adamw_params;
_Static_assert(sizeof(rd_adamw_params) == 192,
               "rd_adamw_params vs rd_adamw.comp");

/* in place: param in[0] (contiguous, any float dtype), m in[2], v in[3]
 * (f32); gradient in[1] (any layout and float dtype); hyperparameters
 * in[4] f32 (7) or (8), read on the device */
ts_status vk_k_adamw(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *param = n->in[0];
    int64_t N = ts_tensor_numel(param);
    if (N == 0)
        return TS_OK;
    vk_tdesc pd, md, vd;
    rd_adamw_params p = {.pdt = param->dtype, .n = (int32_t)N};
    if (vk_desc(ctx, param, &pd) || desc_flat(ctx, n->in[1], &p.g) ||
        vk_desc(ctx, n->in[2], &md) || vk_desc(ctx, n->in[3], &vd) ||
        vk_desc(ctx, n->in[4], &p.h))
        return ctx->status;
    p.param = pd.addr;
    p.m = md.addr;
    p.v = vd.addr;
    return LAUNCH("rd_adamw", p, vk_groups_for(d, N, 256));
}

/* ---- topk, gather, gather's backward, one_hot ---- */

typedef struct {
    vk_tdesc x;
    uint64_t dst;
    int32_t rows, n, k, xs;
} rd_topk_params;
_Static_assert(sizeof(rd_topk_params) == 104, "rd_topk_params vs rd_topk.comp");

/* x (..., n) float -> (..., k) i64, best first */
ts_status vk_k_topk(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *x = n->in[0], *y = n->out;
    int64_t len = x->shape[x->ndim - 1], numel = ts_tensor_numel(x);
    if (numel == 0)
        return TS_OK;
    rd_topk_params p = {.rows = (int32_t)(numel / len),
                        .n = (int32_t)len,
                        .k = (int32_t)n->attrs.i[0]};
    vk_tdesc yd;
    if (desc_rows(ctx, x, &p.x, &p.xs) || vk_desc(ctx, y, &yd))
        return ctx->status;
    p.dst = yd.addr;
    return LAUNCH("rd_topk", p, vk_groups_for(d, numel, 64));
}

typedef struct {
    vk_tdesc x, ix;
    uint64_t dst;
    int32_t dim, es, total, pad;
} rd_gather_params;
_Static_assert(sizeof(rd_gather_params) == 184,
               "rd_gather_params vs rd_gather.comp");

/* out (index's shape) = x at index along dim; any dtype */
ts_status vk_k_gather(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *x = n->in[0], *ix = n->in[1], *y = n->out;
    int64_t total = ts_tensor_numel(ix);
    if (total == 0)
        return TS_OK;
    rd_gather_params p = {.dim = (int32_t)n->attrs.i[0],
                          .es = (int32_t)ts_dtype_size(x->dtype),
                          .total = (int32_t)total};
    vk_tdesc yd;
    if (vk_desc(ctx, x, &p.x) || vk_desc(ctx, ix, &p.ix) ||
        vk_desc(ctx, y, &yd))
        return ctx->status;
    p.dst = yd.addr;
    return LAUNCH("rd_gather", p, vk_groups_for(d, total, 256));
}

typedef struct {
    vk_tdesc g, ix, acc;
    int32_t dim, lines, pad0, pad1;
} rd_gscatter_params;
_Static_assert(sizeof(rd_gscatter_params) == 256,
               "rd_gscatter_params vs rd_gather_scatter.comp");

/* g (index's shape), index -> zeros of the input's shape (attrs.i[1..])
 * with g added at index along dim; g's dtype, f32 accumulation */
ts_status vk_k_gather_backward(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *g = n->in[0], *ix = n->in[1], *y = n->out;
    int dim = (int)n->attrs.i[0];
    int64_t ny = ts_tensor_numel(y), J = ix->shape[dim];
    if (ny == 0)
        return TS_OK;
    rd_gscatter_params p = {
        .dim = dim, .lines = (int32_t)(J ? ts_tensor_numel(ix) / J : 0)};
    if (vk_desc(ctx, g, &p.g) || vk_desc(ctx, ix, &p.ix) ||
        vk_desc(ctx, y, &p.acc))
        return ctx->status;
    int64_t st[TS_MAX_DIMS];
    ts_contiguous_strides(y->ndim, y->shape, st);
    for (int k = 0; k < y->ndim; k++)
        p.acc.stride[k] = (int32_t)st[k];
    p.acc.dtype = TS_F32;
    p.acc.addr = accumulator(ctx, d, y, ny);
    if (!p.acc.addr || fill_f32(ctx, d, p.acc.addr, ny, 0.0f))
        return ctx->status;
    if (p.lines > 0 &&
        LAUNCH("rd_gather_scatter", p, vk_groups_for(d, p.lines, 64)))
        return ctx->status;
    return y->dtype == TS_F32 ? TS_OK : store_f32(ctx, d, y, p.acc.addr, ny);
}

typedef struct {
    vk_tdesc ix;
    uint64_t dst;
    int32_t cnt, classes;
} rd_one_hot_params;
_Static_assert(sizeof(rd_one_hot_params) == 96,
               "rd_one_hot_params vs rd_one_hot.comp");

/* idx (...) -> (..., classes) f32 */
ts_status vk_k_one_hot(ts_ctx *ctx, vk_dev *d, ts_node *n) {
    ts_tensor *ix = n->in[0], *y = n->out;
    int64_t cnt = ts_tensor_numel(ix), classes = n->attrs.i[0];
    if (cnt * classes == 0)
        return TS_OK;
    rd_one_hot_params p = {.cnt = (int32_t)cnt, .classes = (int32_t)classes};
    vk_tdesc yd;
    if (desc_flat(ctx, ix, &p.ix) || vk_desc(ctx, y, &yd))
        return ctx->status;
    p.dst = yd.addr;
    return LAUNCH("rd_one_hot", p, vk_groups_for(d, cnt * classes, 256));
}
