/* compile.c — the compiled mode: the recorded graph (trace), its analysis
 * at sync (which results outlive the graph, dead-code elimination), the
 * memory plan (intermediates share one arena by liveness), the cache of
 * plans keyed by the graph's structure, dtypes and shapes, the executor,
 * and the debug dumps (TS_DUMP_GRAPH=DIR). Op semantics stay in the op
 * table and the backends; this file only decides what runs and where its
 * results live. */
#include "ops/ops.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PLAN_CACHE_MAX 64

typedef struct plan {
    struct plan *next;
    uint64_t hash;
    size_t key_len;
    unsigned char *key;
    int n_nodes;
    unsigned char *run; /* per trace node: 1 runs, 0 dead */
    int64_t *out_off;   /* per node: arena offset, -1 own allocation */
    int64_t *saved_off; /* per node x TS_MAX_SAVED */
    size_t arena_bytes;
    ts_device dev; /* the arena's device (the first result's) */
    void *graph;   /* the device's recording of the plan (graph_begin) */
    const ts_backend *graph_be;
    size_t kept_bytes; /* results that outlive the graph, and those on
                          other devices than the arena's */
    int n_bufs;        /* arena buffers: for poisoning dead ones */
    int64_t *buf_off;
    size_t *buf_bytes;
    int *buf_end;
    int n_inplace; /* outputs written over a dying input */
    int *cse_src;  /* per node: the earlier equal node, or -1 */
    int n_cse;
    int *fuse_root;   /* per node: the group root it runs in, or -1 */
    int *group_first; /* per group root: its first member; -1 else */
    int n_fused;      /* nodes folded into a later node's loop */
    int n_epilogue;   /* matmuls whose result a group eats panel-wise */
    int n_remat;      /* results recomputed for late readers */
    int *remat_node, *remat_at;
    int64_t *remat_off;
    size_t remat_saved_bytes; /* sum of (bytes x gap) avoided, for dumps */
    size_t arena_lower_bound; /* most bytes alive at one moment */
    unsigned char *folded;    /* per node: its result is a known constant */
    double *fold_value;
    int n_folded;
    /* fused-kernel rewrites: per root node, the op that replaces its
     * pattern (0 none), its inputs as (node, input) references, a scalar */
    ts_op_id *rw_op;
    int (*rw_ref)[4];
    double *rw_f;
    int n_rewritten;
} plan;

typedef struct ts_trace {
    ts_node **nodes;
    int n, cap;
    plan *plans;
    int n_plans;
    void *arena;
    size_t arena_cap;
    ts_device arena_dev;
} ts_trace;

static ts_trace *trace_of(ts_ctx *ctx) {
    if (!ctx->trace)
        ctx->trace = calloc(1, sizeof(ts_trace));
    return ctx->trace;
}

ts_status ts_trace_append(ts_ctx *ctx, ts_node *n) {
    ts_trace *t = trace_of(ctx);
    if (!t)
        return ts_set_error(ctx, TS_ERR_OOM, "out of memory (trace)");
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 256;
        ts_node **p = realloc(t->nodes, sizeof *p * (size_t)cap);
        if (!p)
            return ts_set_error(ctx, TS_ERR_OOM, "out of memory (trace)");
        t->nodes = p;
        t->cap = cap;
    }
    n->refcount++;
    t->nodes[t->n++] = n;
    return TS_OK;
}

static void plan_free(plan *p) {
    if (p->graph && p->graph_be && p->graph_be->graph_free)
        p->graph_be->graph_free(p->graph);
    free(p->key), free(p->run), free(p->out_off), free(p->saved_off);
    free(p->buf_off), free(p->buf_bytes), free(p->buf_end), free(p->cse_src);
    free(p->fuse_root), free(p->group_first);
    free(p->remat_node), free(p->remat_at), free(p->remat_off);
    free(p->folded), free(p->fold_value);
    free(p->rw_op), free(p->rw_ref), free(p->rw_f);
    free(p);
}

static void trace_clear(ts_ctx *ctx) {
    ts_trace *t = ctx->trace;
    if (!t)
        return;
    for (int i = 0; i < t->n; i++) /* recorded writes are done (or dropped) */
        if (ts_op_table[t->nodes[i]->op].in_place)
            for (int k = 0; k < t->nodes[i]->n_in; k++)
                t->nodes[i]->in[k]->storage->pending_writes = 0;
    int n = t->n;
    t->n = 0;
    for (int i = 0; i < n; i++)
        ts_node_release(t->nodes[i]);
}

void ts_trace_destroy(ts_ctx *ctx) {
    ts_trace *t = ctx->trace;
    if (!t)
        return;
    trace_clear(ctx);
    while (t->plans) {
        plan *p = t->plans;
        t->plans = p->next;
        plan_free(p);
    }
    free(t->nodes);
    if (t->arena)
        ts_backend_of(t->arena_dev.kind)
            ->free(ctx, t->arena_dev.index, t->arena, t->arena_cap);
    free(t);
    ctx->trace = NULL;
}

/* ---- mode ---- */

ts_mode ts_set_mode(ts_ctx *ctx, ts_mode mode) {
    if (!ctx)
        return TS_MODE_EAGER;
    ts_mode old = ctx->mode;
    if (mode == TS_MODE_COMPILED && ctx->force_eager)
        mode = TS_MODE_EAGER;
    if (mode == TS_MODE_EAGER && old == TS_MODE_COMPILED)
        ts_sync(ctx);
    ctx->mode = mode;
    return old;
}

ts_mode ts_get_mode(const ts_ctx *ctx) {
    return ctx ? ctx->mode : TS_MODE_EAGER;
}

void ts_force_eager(ts_ctx *ctx, bool on) {
    if (!ctx)
        return;
    ctx->force_eager = on;
    if (on)
        ts_set_mode(ctx, TS_MODE_EAGER);
}

void ts_get_compile_stats(const ts_ctx *ctx, ts_compile_stats *out) {
    if (ctx && out)
        *out = ctx->cstats;
}

/* ---- analysis ----
 * Storage marks during a sync (storage->scratch): 0 not produced here,
 * i + 1 produced by trace node i. scratch2: bit 1 live after the graph,
 * bit 2 read by a node that runs. Tensor marks (tensor->scratch): how many
 * references trace nodes hold. */

#define LIVE_AFTER 1
#define READ       2

static void count_refs(ts_trace *t, int delta) {
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            n->in[k]->scratch += delta;
        for (int k = 0; k < n->n_saved; k++)
            n->saved[k]->scratch += delta;
    }
}

/* Marks what must exist after the graph: tensors held from outside the
 * trace, everything the autograd graph reachable from them holds, and
 * storages held by headers the trace does not know. */
static bool mark_live(ts_trace *t) {
    /* headers the trace knows, per storage */
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        n->out_st->scratch2 = 0;
        for (int k = 0; k < n->n_in; k++)
            n->in[k]->storage->scratch2 = 0;
        for (int k = 0; k < n->n_saved; k++)
            n->saved[k]->storage->scratch2 = 0;
    }
    /* a work list of tensors found live, then the autograd graph behind them */
    int cap = 4 * t->n + 16, top = 0;
    ts_tensor **stack = malloc(sizeof *stack * (size_t)cap);
    int vcap = t->n + 16, n_visited = 0;
    ts_node **visited = malloc(sizeof *visited * (size_t)vcap);
    if (!stack || !visited) {
        free(stack), free(visited);
        return false;
    }
#define PUSH(x)                                                                \
    do {                                                                       \
        if (top == cap) {                                                      \
            cap *= 2;                                                          \
            ts_tensor **p_ = realloc(stack, sizeof *stack * (size_t)cap);      \
            if (!p_)                                                           \
                goto oom;                                                      \
            stack = p_;                                                        \
        }                                                                      \
        stack[top++] = (x);                                                    \
    } while (0)
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]->refcount > n->in[k]->scratch)
                PUSH(n->in[k]);
        for (int k = 0; k < n->n_saved; k++)
            if (n->saved[k]->refcount > n->saved[k]->scratch)
                PUSH(n->saved[k]);
        if (n->out && n->out->refcount > n->out->scratch)
            PUSH(n->out);
        /* headers nobody in the trace references (views, the user's own
         * handle on a result): the storage counts more holders than the
         * known headers plus this node */
    }
    while (top) {
        ts_tensor *x = stack[--top];
        x->storage->scratch2 |= LIVE_AFTER;
        ts_node *g = x->grad_fn;
        if (g && g->live_visit == 0) {
            if (n_visited == vcap) { /* more autograd nodes than trace: grow */
                ts_node **p =
                    realloc(visited, sizeof *visited * (size_t)(2 * vcap));
                if (!p)
                    goto oom;
                visited = p;
                vcap *= 2;
            }
            g->live_visit = 1;
            visited[n_visited++] = g;
            for (int k = 0; k < g->n_in; k++)
                PUSH(g->in[k]);
            for (int k = 0; k < g->n_saved; k++)
                PUSH(g->saved[k]);
        }
    }
    for (int i = 0; i < n_visited; i++)
        visited[i]->live_visit = 0;
    free(stack), free(visited);
    return true;
oom:
    for (int i = 0; i < n_visited; i++)
        visited[i]->live_visit = 0;
    free(stack), free(visited);
    return false;
#undef PUSH
}

/* Storages with holders the trace cannot see (a view the user holds, the
 * user's own handle on a result) are live after the graph too: a storage's
 * count is its headers plus the nodes writing it; anything above the
 * headers and nodes the trace knows is held from outside. */
static void mark_unseen_holders(ts_trace *t) {
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        n->out_st->scratch = 0;
        for (int k = 0; k < n->n_in; k++)
            n->in[k]->storage->scratch = 0;
        for (int k = 0; k < n->n_saved; k++)
            n->saved[k]->storage->scratch = 0;
        if (n->out)
            n->out->storage->scratch = 0;
    }
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        n->out_st->scratch++; /* the node's own reference */
        ts_tensor *hs[TS_MAX_INPUTS + TS_MAX_SAVED + 1];
        int nh = 0;
        for (int k = 0; k < n->n_in; k++)
            hs[nh++] = n->in[k];
        for (int k = 0; k < n->n_saved; k++)
            hs[nh++] = n->saved[k];
        if (n->out)
            hs[nh++] = n->out;
        for (int k = 0; k < nh; k++)
            if (hs[k]->scratch >= 0) { /* count each header once */
                hs[k]->storage->scratch++;
                hs[k]->scratch = -1 - hs[k]->scratch;
            }
    }
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        if (n->out_st->refcount > n->out_st->scratch)
            n->out_st->scratch2 |= LIVE_AFTER;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]->scratch < 0)
                n->in[k]->scratch = -1 - n->in[k]->scratch;
        for (int k = 0; k < n->n_saved; k++)
            if (n->saved[k]->scratch < 0)
                n->saved[k]->scratch = -1 - n->saved[k]->scratch;
        if (n->out && n->out->scratch < 0)
            n->out->scratch = -1 - n->out->scratch;
    }
}

/* ---- keys ---- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
    bool oom;
} bytes;

static void put(bytes *b, const void *v, size_t n) {
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 4096) + n;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, v, n);
    b->n += n;
}

static void put_i64(bytes *b, int64_t v) {
    put(b, &v, sizeof v);
}

static void put_geometry(bytes *b, const ts_tensor *x) {
    put_i64(b, x->dtype);
    put_i64(b, x->ndim);
    for (int d = 0; d < x->ndim; d++)
        put_i64(b, x->shape[d]), put_i64(b, x->strides[d]);
    put_i64(b, x->offset);
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

#define SLOTS (1 + TS_MAX_SAVED) /* buffers per node: out, saved... */

/* view nodes are in the trace only for the analysis: they never run */
static bool is_view_node(const ts_node *n) {
    return ts_op_table[n->op].is_view;
}
static bool produces(const ts_node *n) {
    return !is_view_node(n) && !ts_op_table[n->op].in_place;
}

/* storage->scratch: > 0 buffer id + 1 of the node slot producing it,
 * < 0 -(index + 1) of an outside input, in order of first use */
static void number_storages(ts_trace *t) {
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            n->in[k]->storage->scratch = 0;
        n->out_st->scratch = 0;
    }
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        if (produces(n))
            n->out_st->scratch = i * SLOTS + 1;
        for (int k = 0; k < n->n_saved; k++)
            n->saved[k]->storage->scratch = i * SLOTS + 2 + k;
    }
    int ext = 0;
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]->storage->scratch == 0)
                n->in[k]->storage->scratch = -(++ext);
        if (n->out_st->scratch == 0)
            n->out_st->scratch = -(++ext);
    }
}

static bool pass_on(const char *name);

static void build_key(ts_trace *t, const unsigned char *run, bytes *b) {
    /* plans built with other passes switched off are other plans */
    put_i64(b, pass_on("dce") | pass_on("plan") << 1 | pass_on("inplace") << 2 |
                   pass_on("cse") << 3 | pass_on("fuse") << 4 |
                   pass_on("remat") << 5 | pass_on("fold") << 6 |
                   pass_on("rewrite") << 7 | pass_on("epilogue") << 8);
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        put_i64(b, n->op);
        put_i64(b, run[i]);
        put_i64(b, n->n_in);
        for (int k = 0; k < 2 * TS_MAX_DIMS; k++)
            put_i64(b, n->attrs.i[k]);
        put(b, n->attrs.f, sizeof n->attrs.f);
        put_i64(b, n->attrs.dtype);
        for (int k = 0; k < n->n_in; k++) {
            ts_storage *st = n->in[k]->storage;
            put_i64(b, st->scratch);
            put_geometry(b, n->in[k]);
            /* outside constants enter the key by value: plans fold them */
            put_i64(b, st->scratch < 0 && st->uniform);
            if (st->scratch < 0 && st->uniform)
                put(b, &st->uniform_value, sizeof(double));
        }
        put_i64(b, n->out_st->scratch);
        put_i64(b, n->out_st->scratch2 & LIVE_AFTER);
        put_i64(b, n->out_desc.dtype);
        put_i64(b, n->out_desc.ndim);
        for (int d = 0; d < n->out_desc.ndim; d++)
            put_i64(b, n->out_desc.shape[d]);
        for (int k = 0; k < n->n_saved; k++)
            put_i64(b, n->saved[k]->storage->scratch2 & LIVE_AFTER);
    }
}

/* ---- memory plan ---- */

typedef struct {
    int id; /* node * SLOTS + slot */
    size_t bytes;
    int start, end; /* trace positions, inclusive */
    int64_t off;
} buffer;

static int by_size_desc(const void *a, const void *b) {
    const buffer *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return x->id - y->id;
}

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

/* The most bytes alive at any one position: no placement can use less. */
static size_t live_bytes_bound(const buffer *bufs, int nb, int n_pos) {
    int64_t *delta = calloc((size_t)n_pos + 2, sizeof(int64_t));
    if (!delta)
        return 0;
    for (int b = 0; b < nb; b++) {
        delta[bufs[b].start] += (int64_t)bufs[b].bytes;
        delta[bufs[b].end + 1] -= (int64_t)bufs[b].bytes;
    }
    int64_t live = 0, most = 0;
    for (int i = 0; i <= n_pos; i++) {
        live += delta[i];
        if (live > most)
            most = live;
    }
    free(delta);
    return (size_t)most;
}

/* Greedy placement: biggest first, each at the lowest offset that overlaps
 * no placed buffer whose lifetime meets its own. */
static size_t place_buffers(buffer *bufs, int nb) {
    qsort(bufs, (size_t)nb, sizeof *bufs, by_size_desc);
    size_t arena = 0;
    for (int i = 0; i < nb; i++) {
        int64_t off = 0;
        bool moved = true;
        while (moved) {
            moved = false;
            for (int j = 0; j < i; j++) {
                buffer *o = &bufs[j];
                if (o->end < bufs[i].start || bufs[i].end < o->start)
                    continue;
                if (off < o->off + (int64_t)o->bytes &&
                    o->off < off + (int64_t)bufs[i].bytes) {
                    off = o->off + (int64_t)o->bytes;
                    moved = true;
                }
            }
        }
        bufs[i].off = off;
        if ((size_t)off + bufs[i].bytes > arena)
            arena = (size_t)off + bufs[i].bytes;
    }
    return arena;
}

/* The planner's invariant: two buffers alive at the same time never share
 * a byte. Checked on every new plan when TS_POISON_FREED is on (tests). */
static bool plan_valid(const buffer *bufs, int nb) {
    for (int i = 0; i < nb; i++)
        for (int j = i + 1; j < nb; j++) {
            const buffer *a = &bufs[i], *b = &bufs[j];
            bool live_together = !(a->end < b->start || b->end < a->start);
            bool overlap = a->off < b->off + (int64_t)b->bytes &&
                           b->off < a->off + (int64_t)a->bytes;
            if (live_together && overlap)
                return false;
        }
    return true;
}

static bool poison_enabled(void);

/* TS_PASSES=-dce,-plan turns passes off one by one (to measure them). */
static bool pass_on(const char *name) {
    const char *e = getenv("TS_PASSES");
    if (!e)
        return true;
    char off[64];
    snprintf(off, sizeof off, "-%s", name);
    const char *p = strstr(e, off);
    size_t n = strlen(off);
    return !(p && (p[n] == '\0' || p[n] == ','));
}

static size_t slot_bytes(const ts_node *n, int slot) {
    const ts_desc *d = slot == 0 ? &n->out_desc : &n->saved_desc[slot - 1];
    return (size_t)ts_shape_numel(d->ndim, d->shape) * ts_dtype_size(d->dtype);
}

/* May op's kernel write its output over input k? True for kernels that
 * read each element (or each row, into a buffer) before writing the same
 * place, so an input that dies here can give its buffer to the output. */
static bool may_alias(ts_op_id op, int k) {
    switch (op) {
    case TS_OP_ADD:
    case TS_OP_SUB:
    case TS_OP_MUL:
    case TS_OP_DIV:
        return k <= 1;
    case TS_OP_ADD_SCALAR:
    case TS_OP_MUL_SCALAR:
    case TS_OP_NEG:
    case TS_OP_EXP:
    case TS_OP_LOG:
    case TS_OP_SQRT:
    case TS_OP_RSQRT:
    case TS_OP_ABS:
    case TS_OP_POW_SCALAR:
    case TS_OP_TANH:
    case TS_OP_SIGMOID:
    case TS_OP_RELU:
    case TS_OP_SILU:
    case TS_OP_GELU:
    case TS_OP_SOFTMAX:
    case TS_OP_LOG_SOFTMAX:
    case TS_OP_ROPE:
        return k == 0;
    case TS_OP_UNARY_BACKWARD:
        return k <= 2;
    case TS_OP_RMSNORM_BACKWARD:
    case TS_OP_LAYERNORM_BACKWARD:
        return k <= 1;
    case TS_OP_CROSS_ENTROPY_BACKWARD:
        return k == 1;
    default:
        return false;
    }
}

/* ---- constant folding ----
 * An elementwise node whose inputs are all constants (tensors made by
 * ts_full/ts_zeros/ts_scalar and not written since, or results folded
 * already) has a constant result: it is computed once, when the plan is
 * built, on one element; at run time its buffer is filled with the value
 * (or not made at all when only other folded nodes read it). */

static bool fold_pass(ts_ctx *ctx, ts_trace *t, plan *p) {
    p->folded = calloc((size_t)t->n + 1, 1);
    p->fold_value = calloc((size_t)t->n + 1, sizeof(double));
    if (!p->folded || !p->fold_value)
        return false;
    (void)ctx;
    /* folding is host arithmetic, the CPU's, whatever the device */
    const ts_backend *cpu = ts_backend_of(TS_DEVICE_CPU);
    if (!pass_on("fold"))
        return true;
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        if (!p->run[i] || !produces(n) || !cpu->fusable(n->op))
            continue;
        float args[3];
        bool constant = true;
        for (int k = 0; k < n->n_in && constant; k++) {
            ts_storage *st = n->in[k]->storage;
            int sc = st->scratch;
            if (sc < 0 && st->uniform) {
                args[k] = (float)st->uniform_value;
            } else if (sc > 0 && (sc - 1) % SLOTS == 0 &&
                       p->folded[(sc - 1) / SLOTS]) {
                args[k] = (float)p->fold_value[(sc - 1) / SLOTS];
            } else {
                constant = false;
            }
        }
        if (!constant)
            continue;
        /* as eager: computed in f32, stored in the output's dtype */
        char one[8];
        ts_store_f32(one, n->out_desc.dtype, cpu->eval_scalar(n, args));
        p->fold_value[i] = ts_load_f64(one, n->out_desc.dtype);
        p->folded[i] = 1;
        p->n_folded++;
    }
    /* folded results that only folded nodes read need no memory */
    int *readers = calloc((size_t)t->n + 1, sizeof(int));
    if (!readers)
        return false;
    for (int j = 0; j < t->n; j++) {
        if (!p->run[j] || p->folded[j])
            continue;
        for (int k = 0; k < t->nodes[j]->n_in; k++) {
            int sc = t->nodes[j]->in[k]->storage->scratch;
            if (sc > 0)
                readers[(sc - 1) / SLOTS]++;
        }
    }
    for (int i = 0; i < t->n; i++)
        if (p->folded[i] && !readers[i] &&
            !(t->nodes[i]->out_st->scratch2 & LIVE_AFTER))
            p->run[i] = 0;
    free(readers);
    return true;
}

/* ---- common-subexpression elimination ----
 * A node equal to an earlier one (same op, attributes and inputs, where an
 * input made by an eliminated node counts as made by its original) does
 * not run; its results are the original's. In-place ops, views and results
 * kept after the graph are left alone. */

static int canon_input(const plan *p, int sc) {
    if (sc <= 0)
        return sc;
    int id = sc - 1, node = id / SLOTS;
    if (p->cse_src[node] >= 0)
        id = p->cse_src[node] * SLOTS + id % SLOTS;
    return id + 1;
}

static bool same_geometry(const ts_tensor *a, const ts_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->offset != b->offset)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->strides[d] != b->strides[d])
            return false;
    return true;
}

static bool nodes_equal(const plan *p, const ts_node *a, const ts_node *b) {
    if (a->op != b->op || a->n_in != b->n_in ||
        a->attrs.dtype != b->attrs.dtype ||
        memcmp(a->attrs.i, b->attrs.i, sizeof a->attrs.i) ||
        memcmp(a->attrs.f, b->attrs.f, sizeof a->attrs.f))
        return false;
    for (int k = 0; k < a->n_in; k++)
        if (canon_input(p, a->in[k]->storage->scratch) !=
                canon_input(p, b->in[k]->storage->scratch) ||
            !same_geometry(a->in[k], b->in[k]))
            return false;
    return true;
}

static uint64_t node_hash(const plan *p, const ts_node *n) {
    uint64_t h = 1469598103934665603ull;
    int64_t v[3 + 2 * TS_MAX_INPUTS];
    int nv = 0;
    v[nv++] = n->op;
    v[nv++] = n->n_in;
    v[nv++] = n->attrs.i[0] ^ (n->attrs.i[1] << 7) ^ (int64_t)n->attrs.f[0];
    for (int k = 0; k < n->n_in; k++) {
        v[nv++] = canon_input(p, n->in[k]->storage->scratch);
        v[nv++] = n->in[k]->offset ^ (n->in[k]->ndim ? n->in[k]->shape[0] : 0);
    }
    return fnv1a((const unsigned char *)v, sizeof(int64_t) * (size_t)nv) ^ h;
}

static bool cse_candidate(const plan *p, int i, const ts_node *n) {
    if (p->folded[i] || p->rw_op[i] || !produces(n) ||
        (n->out_st->scratch2 & LIVE_AFTER))
        return false;
    for (int k = 0; k < n->n_saved; k++)
        if (n->saved[k]->storage->scratch2 & LIVE_AFTER)
            return false;
    return true;
}

static bool cse_pass(ts_trace *t, plan *p) {
    p->cse_src = malloc(sizeof(int) * (size_t)(t->n + 1));
    int cap = 1;
    while (cap < 2 * t->n)
        cap <<= 1;
    int *table = malloc(sizeof(int) * (size_t)cap);
    if (!p->cse_src || !table) {
        free(table);
        return false;
    }
    for (int i = 0; i < t->n; i++)
        p->cse_src[i] = -1;
    for (int i = 0; i < cap; i++)
        table[i] = -1;
    if (!pass_on("cse")) {
        free(table);
        return true;
    }
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        if (!p->run[i] || !cse_candidate(p, i, n))
            continue;
        uint64_t h = node_hash(p, n);
        int slot = (int)(h & (uint64_t)(cap - 1));
        for (;;) {
            int j = table[slot];
            if (j < 0) {
                table[slot] = i;
                break;
            }
            if (nodes_equal(p, t->nodes[j], n)) {
                p->cse_src[i] = j;
                p->run[i] = 0;
                p->n_cse++;
                break;
            }
            slot = (slot + 1) & (cap - 1);
        }
    }
    free(table);
    return true;
}

/* ---- fused-kernel choice ----
 * Math written out op by op is replaced by the fused kernel that computes
 * it, when every intermediate is read only inside the pattern (so nothing
 * else needs it, which in practice means inference and no-grad code):
 *   rmsnorm:   y = x * rsqrt(mean(x*x | x^2, -1, keepdim) + eps) [* w]
 *   attention: o = softmax(q @ k^T [* scale] [+ mask], -1) @ v
 * (q, k, v of shape (B, H, T|S, D), k^T a transposed view). The fused
 * kernels round differently from the op-by-op ones: close, not the same
 * bits. */

#define REF(node, input) ((node)*8 + (input))

/* the node producing x's storage when it runs, is read once, is not kept
 * and has op `op`; else -1 */
static int single_producer(const ts_trace *t, const plan *p, const int *readers,
                           const ts_tensor *x, ts_op_id op) {
    int sc = x->storage->scratch;
    if (sc <= 0 || (sc - 1) % SLOTS != 0)
        return -1;
    int i = (sc - 1) / SLOTS;
    const ts_node *n = t->nodes[i];
    if (!p->run[i] || n->op != op || readers[i] != 1 || p->folded[i] ||
        (n->out_st->scratch2 & LIVE_AFTER) || x->offset != 0 ||
        !ts_tensor_is_contiguous(x))
        return -1;
    return i;
}

static bool same_tensor(const ts_tensor *a, const ts_tensor *b) {
    return a->storage == b->storage && same_geometry(a, b);
}

/* y = mul(x, r), r = rsqrt(add_scalar(mean(sq), eps)), sq = x*x or x^2 */
static bool match_rmsnorm(const ts_trace *t, const plan *p, const int *readers,
                          int y, int *members, int *nm, int *x_ref,
                          double *eps) {
    const ts_node *ny = t->nodes[y];
    if (ny->op != TS_OP_MUL)
        return false;
    for (int side = 0; side < 2; side++) {
        const ts_tensor *x = ny->in[side], *rv = ny->in[1 - side];
        int r = single_producer(t, p, readers, rv, TS_OP_RSQRT);
        if (r < 0 || !ts_dtype_is_float(x->dtype) || x->ndim < 1)
            continue;
        int a = single_producer(t, p, readers, t->nodes[r]->in[0],
                                TS_OP_ADD_SCALAR);
        if (a < 0)
            continue;
        int m = single_producer(t, p, readers, t->nodes[a]->in[0], TS_OP_MEAN);
        if (m < 0)
            continue;
        const ts_node *nmn = t->nodes[m];
        if (nmn->attrs.ni != 1 || nmn->attrs.i[0] != x->ndim - 1 ||
            nmn->attrs.f[0] == 0)
            continue; /* mean over the last dim, keepdim */
        int q = single_producer(t, p, readers, nmn->in[0], TS_OP_MUL);
        int q2 = single_producer(t, p, readers, nmn->in[0], TS_OP_POW_SCALAR);
        if (q >= 0 && !(same_tensor(t->nodes[q]->in[0], x) &&
                        same_tensor(t->nodes[q]->in[1], x)))
            q = -1;
        if (q2 >= 0 && !(same_tensor(t->nodes[q2]->in[0], x) &&
                         t->nodes[q2]->attrs.f[0] == 2.0))
            q2 = -1;
        int sq = q >= 0 ? q : q2;
        if (sq < 0 || x->dtype != ny->out_desc.dtype ||
            !ts_shape_equal(x->ndim, x->shape, ny->out_desc.ndim,
                            ny->out_desc.shape))
            continue;
        members[0] = sq, members[1] = m, members[2] = a, members[3] = r;
        *nm = 4;
        *x_ref = REF(y, side);
        *eps = t->nodes[a]->attrs.f[0];
        return true;
    }
    return false;
}

static bool rewrite_pass(ts_trace *t, plan *p) {
    p->rw_op = calloc((size_t)t->n + 1, sizeof *p->rw_op);
    p->rw_ref = calloc((size_t)t->n + 1, sizeof *p->rw_ref);
    p->rw_f = calloc((size_t)t->n + 1, sizeof *p->rw_f);
    int *readers = calloc((size_t)t->n + 1, sizeof(int));
    if (!p->rw_op || !p->rw_ref || !p->rw_f || !readers) {
        free(readers);
        return false;
    }
    for (int i = 0; i < t->n; i++)
        for (int k = 0; k < 4; k++)
            p->rw_ref[i][k] = -1;
    if (!pass_on("rewrite")) {
        free(readers);
        return true;
    }
    for (int j = 0; j < t->n; j++) {
        if (!p->run[j])
            continue;
        for (int k = 0; k < t->nodes[j]->n_in; k++) {
            int sc = t->nodes[j]->in[k]->storage->scratch;
            if (sc > 0)
                readers[(sc - 1) / SLOTS]++;
        }
        int so = t->nodes[j]->out_st->scratch;
        if (!produces(t->nodes[j]) && so > 0)
            readers[(so - 1) / SLOTS] += 2;
    }
    for (int j = 0; j < t->n; j++) {
        ts_node *n = t->nodes[j];
        if (!p->run[j] || !produces(n) || p->folded[j])
            continue;
        int members[8], nm = 0;
        /* rmsnorm, optionally times a weight of shape (C) */
        int x_ref;
        double eps;
        if (n->op == TS_OP_MUL) {
            int y = -1, w_ref = -1;
            for (int side = 0; side < 2 && y < 0; side++) {
                const ts_tensor *w = n->in[1 - side];
                int cand =
                    single_producer(t, p, readers, n->in[side], TS_OP_MUL);
                if (cand >= 0 && w->ndim == 1 &&
                    w->shape[0] == n->out_desc.shape[n->out_desc.ndim - 1] &&
                    w->dtype == n->out_desc.dtype &&
                    match_rmsnorm(t, p, readers, cand, members, &nm, &x_ref,
                                  &eps)) {
                    y = cand;
                    w_ref = REF(j, 1 - side);
                }
            }
            if (y >= 0) {
                members[nm++] = y;
            } else if (!match_rmsnorm(t, p, readers, j, members, &nm, &x_ref,
                                      &eps)) {
                nm = 0;
            }
            if (nm) {
                p->rw_op[j] = TS_OP_RMSNORM;
                p->rw_ref[j][0] = x_ref;
                p->rw_ref[j][1] = w_ref;
                p->rw_f[j] = eps;
            }
        }
        /* attention: o = matmul(softmax(...), v) */
        if (!nm && n->op == TS_OP_MATMUL && n->in[1]->ndim == 4) {
            int sm = single_producer(t, p, readers, n->in[0], TS_OP_SOFTMAX);
            if (sm >= 0 && t->nodes[sm]->attrs.i[0] == 3) {
                const ts_tensor *cur = t->nodes[sm]->in[0];
                int mask_ref = -1, chain[3], nc = 0;
                double scale = 1.0;
                int ad = single_producer(t, p, readers, cur, TS_OP_ADD);
                if (ad >= 0) { /* + mask: the side made by the scaled product */
                    for (int side = 0; side < 2 && mask_ref < 0; side++) {
                        const ts_tensor *o = t->nodes[ad]->in[side];
                        if (single_producer(t, p, readers, o,
                                            TS_OP_MUL_SCALAR) >= 0 ||
                            single_producer(t, p, readers, o, TS_OP_MATMUL) >=
                                0) {
                            mask_ref = REF(ad, 1 - side);
                            cur = o;
                        }
                    }
                    if (mask_ref >= 0)
                        chain[nc++] = ad;
                }
                int ms = single_producer(t, p, readers, cur, TS_OP_MUL_SCALAR);
                if (ms >= 0) {
                    scale = t->nodes[ms]->attrs.f[0];
                    chain[nc++] = ms;
                    cur = t->nodes[ms]->in[0];
                }
                int qk = single_producer(t, p, readers, cur, TS_OP_MATMUL);
                if (qk >= 0) {
                    const ts_tensor *q = t->nodes[qk]->in[0],
                                    *kt = t->nodes[qk]->in[1];
                    const ts_tensor *v = n->in[1];
                    bool fits =
                        q->ndim == 4 && kt->ndim == 4 && v->ndim == 4 &&
                        q->dtype == kt->dtype && q->dtype == v->dtype &&
                        kt->shape[0] == q->shape[0] &&
                        kt->shape[1] == q->shape[1] &&
                        v->shape[0] == q->shape[0] &&
                        v->shape[1] == q->shape[1] &&
                        kt->shape[2] == q->shape[3] &&
                        v->shape[2] == kt->shape[3] &&
                        v->shape[3] == q->shape[3] &&   /* the kernel's D */
                        scale > 0 && isfinite(scale) && /* <= 0: its default */
                        kt->strides[2] == 1; /* k^T: a transposed view */
                    if (fits) {
                        for (int c = 0; c < nc; c++)
                            members[nm++] = chain[c];
                        members[nm++] = qk;
                        members[nm++] = sm;
                        p->rw_op[j] = TS_OP_ATTENTION;
                        p->rw_ref[j][0] = REF(qk, 0);
                        p->rw_ref[j][1] = REF(qk, 1);
                        p->rw_ref[j][2] = REF(j, 1);
                        p->rw_ref[j][3] = mask_ref;
                        p->rw_f[j] = scale;
                    }
                }
            }
        }
        if (!p->rw_op[j])
            continue;
        for (int k = 0; k < nm; k++)
            p->run[members[k]] = 0; /* no buffers */
        p->n_rewritten++;
    }
    free(readers);
    return true;
}

/* Runs the fused kernel that replaces root j's pattern into out. */
static ts_status run_rewrite(ts_ctx *ctx, ts_trace *t, const plan *p, int j,
                             ts_tensor *out) {
    ts_node fake;
    memset(&fake, 0, sizeof fake);
    fake.op = p->rw_op[j];
    fake.out = out;
    ts_tensor *args[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < 4; k++) {
        int r = p->rw_ref[j][k];
        if (r >= 0 && (k < 2 || fake.op == TS_OP_ATTENTION))
            args[k] = t->nodes[r / 8]->in[r % 8];
    }
    ts_tensor khdr; /* attention: k from its transposed view */
    int64_t rows;
    if (fake.op == TS_OP_RMSNORM) {
        fake.in[0] = args[0];
        fake.n_in = args[1] ? 2 : 1;
        if (args[1])
            fake.in[1] = args[1];
        fake.attrs.f[0] = p->rw_f[j];
        rows = ts_tensor_numel(out) / out->shape[out->ndim - 1];
    } else {
        khdr = *args[1];
        khdr.shape[2] = args[1]->shape[3], khdr.shape[3] = args[1]->shape[2];
        khdr.strides[2] = args[1]->strides[3],
        khdr.strides[3] = args[1]->strides[2];
        fake.in[0] = args[0], fake.in[1] = &khdr, fake.in[2] = args[2];
        fake.n_in = args[3] ? 4 : 3;
        if (args[3])
            fake.in[3] = args[3];
        fake.attrs.i[0] = 0;
        fake.attrs.i[1] = args[3] != NULL;
        fake.attrs.f[0] = p->rw_f[j];
        rows = ts_tensor_numel(out) / out->shape[3];
    }
    /* the saved row statistic (rstd or lse) goes to a scratch buffer on
     * the output's device (a device frees it after the kernel in order) */
    ts_storage st = {.refcount = 1,
                     .ctx = ctx,
                     .external = true,
                     .device = out->storage->device};
    const ts_backend *be = ts_storage_backend(out->storage);
    size_t sbytes = sizeof(float) * (size_t)(rows + 1);
    st.data = be->alloc(ctx, st.device.index, sbytes);
    ts_tensor saved = {.refcount = 1,
                       .ctx = ctx,
                       .dtype = TS_F32,
                       .ndim = 1,
                       .shape = {rows},
                       .strides = {1},
                       .storage = &st};
    if (!st.data)
        return ts_set_error(ctx, TS_ERR_OOM, "fused kernel: out of memory");
    fake.saved[0] = &saved;
    fake.n_saved = 1;
    ts_status s = ts_run_kernel(ctx, &fake);
    be->free(ctx, st.device.index, st.data, sbytes);
    return s;
}

/* ---- elementwise fusion ----
 * A fusable node whose result is read once, by a fusable node of the same
 * output shape, contiguously, and not kept after the graph, joins that
 * reader's group: the group runs as one loop at the reader's place and the
 * result never reaches memory. Moving a node later is safe unless an
 * in-place write in between touches what it reads; such pairs stay apart.
 * Groups are bounded (TS_FUSE_MAX nodes, TS_FUSE_MAX_EXT outside inputs). */

static bool fuse_pass(ts_ctx *ctx, ts_trace *t, plan *p) {
    (void)ctx; /* each node's backend decides what fuses */
    p->fuse_root = malloc(sizeof(int) * (size_t)(t->n + 1));
    p->group_first = malloc(sizeof(int) * (size_t)(t->n + 1));
    int *readers = calloc((size_t)t->n + 1, sizeof(int));
    int *size = malloc(sizeof(int) * (size_t)(t->n + 1)); /* group sizes */
    bool *has_head = calloc((size_t)t->n + 1, sizeof(bool));
    if (!p->fuse_root || !p->group_first || !readers || !size || !has_head) {
        free(readers), free(size), free(has_head);
        return false;
    }
    for (int i = 0; i < t->n; i++)
        p->fuse_root[i] = p->group_first[i] = -1, size[i] = 1;
    if (!pass_on("fuse")) {
        free(readers), free(size), free(has_head);
        return true;
    }
    for (int j = 0; j < t->n; j++) {
        if (!p->run[j])
            continue;
        ts_node *n = t->nodes[j];
        for (int k = 0; k < n->n_in; k++) {
            int sc = canon_input(p, n->in[k]->storage->scratch);
            if (sc > 0 && (sc - 1) % SLOTS == 0)
                readers[(sc - 1) / SLOTS]++;
        }
        int so = canon_input(p, n->out_st->scratch);
        if (!produces(n) && so > 0 && (so - 1) % SLOTS == 0)
            readers[(so - 1) / SLOTS] += 2; /* written in place: keep it */
    }
    for (int j = 0; j < t->n; j++) {
        ts_node *n = t->nodes[j];
        const ts_backend *be = ts_storage_backend(n->out_st);
        if (!p->run[j] || p->folded[j] || p->rw_op[j] || !produces(n) ||
            !be->fusable || !be->fusable(n->op))
            continue;
        for (int k = 0; k < n->n_in; k++) {
            ts_tensor *x = n->in[k];
            int sc = canon_input(p, x->storage->scratch);
            if (sc <= 0 || (sc - 1) % SLOTS != 0)
                continue;
            int i = (sc - 1) / SLOTS;
            ts_node *m = t->nodes[i];
            /* a matmul may head the group (epilogue fusion), one per group */
            bool head = m->op == TS_OP_MATMUL && pass_on("epilogue") &&
                        be->run_fused && !has_head[j];
            /* one head per group: two groups that each grew from a
             * matmul (SwiGLU with biases: add(mm) on both sides of the
             * mul) stay apart, else the second matmul's result would
             * have no buffer */
            if (has_head[i] && has_head[j])
                continue;
            if (!p->run[i] || p->folded[i] || p->rw_op[i] ||
                p->fuse_root[i] >= 0 || readers[i] != 1 ||
                (!head && !be->fusable(m->op)) ||
                (m->out_st->scratch2 & LIVE_AFTER) ||
                m->out_desc.dtype != TS_F32 || x->offset != 0 ||
                !ts_tensor_is_contiguous(x) ||
                !ts_shape_equal(x->ndim, x->shape, n->out_desc.ndim,
                                n->out_desc.shape) ||
                !ts_shape_equal(m->out_desc.ndim, m->out_desc.shape,
                                n->out_desc.ndim, n->out_desc.shape) ||
                size[i] + size[j] > TS_FUSE_MAX)
                continue;
            /* the members of i's and j's groups start at these */
            int first_i = p->group_first[i] >= 0 ? p->group_first[i] : i;
            int first_j = p->group_first[j] >= 0 ? p->group_first[j] : j;
            int first = first_i < first_j ? first_i : first_j;
            /* in-place writes between i and j to anything i's group reads */
            bool hazard = false;
            for (int w = i + 1; w < j && !hazard; w++) {
                ts_node *wn = t->nodes[w];
                if (!p->run[w] || !ts_op_table[wn->op].in_place)
                    continue;
                for (int g = first_i; g <= i && !hazard; g++) {
                    if (g != i && p->fuse_root[g] != i)
                        continue;
                    for (int q = 0; q < t->nodes[g]->n_in; q++)
                        for (int r = 0; r < wn->n_in; r++)
                            hazard |= t->nodes[g]->in[q]->storage ==
                                      wn->in[r]->storage;
                }
            }
            if (hazard)
                continue;
            /* count outside inputs of the merged group */
            ts_storage *ext[2 * TS_FUSE_MAX * 3];
            int n_ext = 0;
            bool too_many = false;
            for (int g = first; g <= j && !too_many; g++) {
                bool member = g == i || g == j || p->fuse_root[g] == i ||
                              p->fuse_root[g] == j;
                if (!member)
                    continue;
                for (int q = 0; q < t->nodes[g]->n_in; q++) {
                    int s2 =
                        canon_input(p, t->nodes[g]->in[q]->storage->scratch);
                    int src =
                        s2 > 0 && (s2 - 1) % SLOTS == 0 ? (s2 - 1) / SLOTS : -1;
                    bool inside = src >= 0 && (src == i || src == j ||
                                               p->fuse_root[src] == i ||
                                               p->fuse_root[src] == j);
                    if (inside)
                        continue;
                    ts_storage *st = t->nodes[g]->in[q]->storage;
                    bool seen = false;
                    for (int e = 0; e < n_ext; e++)
                        seen |= ext[e] == st;
                    if (!seen)
                        ext[n_ext++] = st;
                    too_many = n_ext > TS_FUSE_MAX_EXT;
                }
            }
            if (too_many)
                continue;
            for (int g = first_i; g < i; g++)
                if (p->fuse_root[g] == i)
                    p->fuse_root[g] = j;
            p->fuse_root[i] = j;
            p->group_first[j] = first;
            p->group_first[i] = -1;
            size[j] += size[i];
            p->n_fused += size[i];
            has_head[j] |= has_head[i] || head;
            p->n_epilogue += head;
        }
    }
    free(readers), free(size), free(has_head);
    return true;
}

/* The fused group whose root is j, in trace order, for the backend. */
static void build_group(ts_trace *t, const plan *p, int j, ts_fused *f) {
    memset(f, 0, sizeof *f);
    f->head_ext = -1;
    int member_of[TS_FUSE_MAX];
    for (int g = p->group_first[j]; g <= j; g++) {
        if (g != j && p->fuse_root[g] != j)
            continue;
        if (t->nodes[g]->op == TS_OP_MATMUL) { /* the epilogue's head */
            f->head = t->nodes[g];
            continue;
        }
        member_of[f->n_members] = g;
        f->members[f->n_members++] = t->nodes[g];
    }
    for (int m = 0; m < f->n_members; m++) {
        const ts_node *n = f->members[m];
        for (int k = 0; k < n->n_in; k++) {
            int sc = canon_input(p, n->in[k]->storage->scratch);
            int src = sc > 0 && (sc - 1) % SLOTS == 0 ? (sc - 1) / SLOTS : -1;
            int inside = -1;
            for (int q = 0; q < m && src >= 0; q++)
                if (member_of[q] == src)
                    inside = q;
            if (inside >= 0) {
                f->arg[m][k] = -(inside + 1);
                continue;
            }
            int e = 0; /* outside: by tensor (geometry matters) */
            while (e < f->n_ext && f->ext[e] != n->in[k])
                e++;
            if (e == f->n_ext)
                f->ext[f->n_ext++] = n->in[k];
            f->arg[m][k] = e;
            if (f->head && n->in[k]->storage == f->head->out_st)
                f->head_ext = e;
        }
    }
}

/* ---- rematerialization ----
 * A cheap node (elementwise, a norm, a copy) whose result is read soon
 * after it is made and then again much later (the forward pass and then
 * the backward) is run twice instead: its first buffer dies after the early
 * reads, and a second buffer, filled just before the first late read, lives
 * only through the late ones. Only when every input is alive then anyway
 * and nothing writes those inputs in place in between, so the result is
 * the same bits and no other lifetime grows. */

#define REMAT_MIN_GAP 32

typedef struct {
    int *pos;
    int n, cap;
} read_list;

static bool reads_add(read_list *r, int pos) {
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 4;
        int *q = realloc(r->pos, sizeof(int) * (size_t)cap);
        if (!q)
            return false;
        r->pos = q;
        r->cap = cap;
    }
    int i = r->n++;
    while (i > 0 && r->pos[i - 1] > pos)
        r->pos[i] = r->pos[i - 1], i--;
    r->pos[i] = pos;
    return true;
}

static bool remat_cheap(ts_op_id op) {
    switch (op) {
    case TS_OP_ADD:
    case TS_OP_SUB:
    case TS_OP_MUL:
    case TS_OP_ADD_SCALAR:
    case TS_OP_MUL_SCALAR:
    case TS_OP_NEG:
    case TS_OP_SILU:
    case TS_OP_GELU:
    case TS_OP_SIGMOID:
    case TS_OP_TANH:
    case TS_OP_RELU:
    case TS_OP_RMSNORM:
    case TS_OP_COPY:
    case TS_OP_CAST:
        return true;
    default:
        return false;
    }
}

static int last_read(const read_list *r) {
    return r->n ? r->pos[r->n - 1] : -1;
}

/* reads[id] for id < n * SLOTS: reads of node slot id; the remat buffer of
 * node i (when chosen) is id n * SLOTS + i. */
static bool remat_pass(ts_trace *t, plan *p, read_list *reads, bool *writes) {
    int N = t->n;
    p->remat_node = malloc(sizeof(int) * (size_t)(N + 1));
    p->remat_at = malloc(sizeof(int) * (size_t)(N + 1));
    p->remat_off = malloc(sizeof(int64_t) * (size_t)(N + 1));
    if (!p->remat_node || !p->remat_at || !p->remat_off)
        return false;
    if (!pass_on("remat"))
        return true;
    for (int R = N - 1; R >= 0; R--) {
        ts_node *n = t->nodes[R];
        if (!p->run[R] || p->folded[R] || p->rw_op[R] || !produces(n) ||
            p->fuse_root[R] >= 0 || !remat_cheap(n->op) ||
            (n->out_st->scratch2 & LIVE_AFTER) || writes[R * SLOTS] ||
            !ts_device_equal(n->out_st->device, p->dev))
            continue; /* (the second buffer lives in the arena) */
        if (p->group_first[R] >= 0)
            continue; /* a group's root */
        read_list *r = &reads[R * SLOTS];
        int best = -1, gap = 0, prev = R;
        for (int k = 0; k < r->n; k++) {
            if (r->pos[k] - prev > gap)
                gap = r->pos[k] - prev, best = k;
            prev = r->pos[k];
        }
        if (best <= 0 || gap < REMAT_MIN_GAP)
            continue; /* no early reads */
        int at = r->pos[best];
        bool ok = true;
        for (int s = 1; s <= n->n_saved && ok; s++) /* saved: alive then too */
            ok = last_read(&reads[R * SLOTS + s]) >= at &&
                 !writes[R * SLOTS + s];
        for (int k = 0; k < n->n_in && ok; k++) {
            ts_storage *st = n->in[k]->storage;
            int sc = canon_input(p, st->scratch);
            if (sc > 0) {
                int src = (sc - 1) / SLOTS;
                ok = p->fuse_root[src] < 0 && last_read(&reads[sc - 1]) >= at &&
                     !writes[sc - 1];
            } else {
                for (int w = R + 1; w < at && ok;
                     w++) /* params change at the end */
                    if (p->run[w] && ts_op_table[t->nodes[w]->op].in_place)
                        for (int q = 0; q < t->nodes[w]->n_in; q++)
                            ok &= t->nodes[w]->in[q]->storage != st;
            }
        }
        if (!ok)
            continue;
        /* the late reads move to the new buffer; the inputs gain a read */
        read_list *nr = &reads[N * SLOTS + R];
        for (int k = best; k < r->n; k++)
            if (!reads_add(nr, r->pos[k]))
                return false;
        p->remat_saved_bytes += slot_bytes(n, 0) / 1024 * (size_t)gap;
        r->n = best;
        for (int k = 0; k < n->n_in; k++) {
            int sc = canon_input(p, n->in[k]->storage->scratch);
            if (sc > 0 && !reads_add(&reads[sc - 1], at))
                return false;
        }
        p->remat_node[p->n_remat] = R;
        p->remat_at[p->n_remat++] = at;
    }
    return true;
}

/* the buffer a read of node slot id at position pos sees */
static int buffer_at(const plan *p, int N, int id, int pos) {
    if (id % SLOTS == 0)
        for (int e = 0; e < p->n_remat; e++)
            if (p->remat_node[e] == id / SLOTS && pos >= p->remat_at[e])
                return N * SLOTS + id / SLOTS;
    return id;
}

static int find_root(int *root, int id) {
    while (root[id] != id)
        id = root[id] = root[root[id]];
    return id;
}

static plan *make_plan(ts_ctx *ctx, ts_trace *t, const unsigned char *run,
                       bool *invalid) {
    plan *p = calloc(1, sizeof *p);
    int ids = t->n * SLOTS + t->n; /* node slots, then remat buffers */
    buffer *bufs = calloc((size_t)ids + 1, sizeof *bufs);
    int *last = malloc(sizeof(int) * (size_t)(ids + 1));
    int *root = NULL;
    read_list *reads = calloc((size_t)ids + 1, sizeof *reads);
    bool *writes = calloc((size_t)ids + 1, sizeof *writes);
    if (!p || !bufs || !last || !reads || !writes)
        goto oom;
    p->n_nodes = t->n;
    p->run = malloc((size_t)t->n + 1);
    p->out_off = malloc(sizeof(int64_t) * (size_t)(t->n + 1));
    p->saved_off = malloc(sizeof(int64_t) * (size_t)(t->n * TS_MAX_SAVED + 1));
    if (!p->run || !p->out_off || !p->saved_off)
        goto oom;
    memcpy(p->run, run, (size_t)t->n);
    if (!fold_pass(ctx, t, p) || !rewrite_pass(t, p) || !cse_pass(t, p) ||
        !fuse_pass(ctx, t, p))
        goto oom;
    run = p->run; /* eliminated nodes no longer run */
    /* every read of every produced buffer (members read where their group
     * runs), and in-place writes (which last until they happen) */
    for (int i = 0; i < t->n; i++) {
        if (!run[i])
            continue;
        ts_node *n = t->nodes[i];
        int at = p->fuse_root[i] >= 0 ? p->fuse_root[i] : i; /* runs there */
        for (int k = 0; k < n->n_in; k++) {
            int sc = canon_input(p, n->in[k]->storage->scratch);
            if (sc > 0 && !reads_add(&reads[sc - 1], at))
                goto oom;
        }
        int so = canon_input(p, n->out_st->scratch);
        if (so > 0 && !produces(n)) {
            writes[so - 1] = true;
            if (!reads_add(&reads[so - 1], i))
                goto oom;
        }
        for (int k = 0; p->rw_op[i] && k < 4;
             k++) { /* the fused kernel's inputs */
            int r = p->rw_ref[i][k];
            if (r < 0)
                continue;
            int sc =
                canon_input(p, t->nodes[r / 8]->in[r % 8]->storage->scratch);
            if (sc > 0 && !reads_add(&reads[sc - 1], i))
                goto oom;
        }
    }
    for (int i = 0; i < t->n; i++) /* the arena's device: the first result's */
        if (run[i] && produces(t->nodes[i])) {
            p->dev = t->nodes[i]->out_st->device;
            break;
        }
    if (!remat_pass(t, p, reads, writes))
        goto oom;
    for (int id = 0; id < ids; id++) {
        last[id] = last_read(&reads[id]);
        int made = id < t->n * SLOTS ? id / SLOTS : -1;
        for (int e = 0; e < p->n_remat && made < 0; e++)
            if (t->n * SLOTS + p->remat_node[e] == id)
                made = p->remat_at[e];
        if (last[id] < made)
            last[id] = made;
    }
    /* in place: an output takes the buffer of an input that dies here */
    root = malloc(sizeof(int) * (size_t)(ids + 1));
    if (!root)
        goto oom;
    for (int id = 0; id < ids; id++)
        root[id] = id;
    bool inplace = pass_on("inplace");
    for (int i = 0; i < t->n && inplace; i++) {
        ts_node *n = t->nodes[i];
        if (!run[i] || !produces(n) || (n->out_st->scratch2 & LIVE_AFTER) ||
            p->fuse_root[i] >= 0 || p->folded[i] || p->rw_op[i])
            continue;
        if (p->group_first[i] >= 0)
            continue; /* its loop reads inputs the node never names */
        size_t out_bytes = slot_bytes(n, 0);
        for (int k = 0; k < n->n_in; k++) {
            ts_tensor *x = n->in[k];
            int sc = canon_input(p, x->storage->scratch);
            if (!may_alias(n->op, k) || sc <= 0 ||
                (x->storage->scratch2 & LIVE_AFTER))
                continue;
            int producer = (sc - 1) / SLOTS, slot = (sc - 1) % SLOTS;
            if (p->fuse_root[producer] >= 0 || slot != 0)
                continue;
            if (x->dtype != n->out_desc.dtype || x->offset != 0 ||
                !ts_tensor_is_contiguous(x) ||
                slot_bytes(t->nodes[producer], slot) != out_bytes ||
                (size_t)ts_tensor_numel(x) * ts_dtype_size(x->dtype) !=
                    out_bytes)
                continue;
            int r = find_root(root, buffer_at(p, t->n, sc - 1, i));
            if (last[r] != i)
                continue; /* someone reads it later */
            root[i * SLOTS] = r;
            if (last[i * SLOTS] > last[r])
                last[r] = last[i * SLOTS];
            p->n_inplace++;
            break;
        }
    }
    int nb = 0;
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        p->out_off[i] = -1;
        for (int k = 0; k < TS_MAX_SAVED; k++)
            p->saved_off[i * TS_MAX_SAVED + k] = -1;
        if (!run[i] || p->fuse_root[i] >= 0)
            continue;
        for (int slot = 0; slot < 1 + n->n_saved; slot++) {
            if (slot == 0 && ts_op_table[n->op].in_place)
                continue;
            ts_storage *s = slot == 0 ? n->out_st : n->saved[slot - 1]->storage;
            size_t sz = slot_bytes(n, slot);
            if ((s->scratch2 & LIVE_AFTER) ||
                !ts_device_equal(s->device, p->dev)) {
                p->kept_bytes += sz;
                continue;
            }
            int id = i * SLOTS + slot;
            if (root[id] != id)
                continue; /* lives in an input's buffer */
            bufs[nb++] = (buffer){id, align64(sz ? sz : 1), i, last[id], 0};
        }
    }
    for (int e = 0; e < p->n_remat; e++) { /* second buffers */
        int R = p->remat_node[e], id = t->n * SLOTS + R;
        if (root[id] != id)
            continue;
        size_t sz = slot_bytes(t->nodes[R], 0);
        bufs[nb++] =
            (buffer){id, align64(sz ? sz : 1), p->remat_at[e], last[id], 0};
    }
    p->arena_lower_bound = live_bytes_bound(bufs, nb, t->n);
    if (pass_on("plan")) {
        p->arena_bytes = place_buffers(bufs, nb);
    } else { /* no sharing: every intermediate gets its own bytes */
        for (int b = 0; b < nb; b++) {
            bufs[b].off = (int64_t)p->arena_bytes;
            p->arena_bytes += bufs[b].bytes;
        }
    }
    if (poison_enabled() && !plan_valid(bufs, nb)) {
        *invalid = true;
        goto oom;
    }
    int64_t *off_of = malloc(sizeof(int64_t) * (size_t)(ids + 1));
    p->buf_off = malloc(sizeof(int64_t) * (size_t)(nb + 1));
    p->buf_bytes = malloc(sizeof(size_t) * (size_t)(nb + 1));
    p->buf_end = malloc(sizeof(int) * (size_t)(nb + 1));
    if (!off_of || !p->buf_off || !p->buf_bytes || !p->buf_end) {
        free(off_of);
        goto oom;
    }
    for (int b = 0; b < nb; b++) {
        off_of[bufs[b].id] = bufs[b].off;
        p->buf_off[b] = bufs[b].off;
        p->buf_bytes[b] = bufs[b].bytes;
        p->buf_end[b] = bufs[b].end;
    }
    p->n_bufs = nb;
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        int src = p->cse_src[i];
        if ((!run[i] && src < 0) || p->fuse_root[i] >= 0)
            continue;
        for (int slot = 0; slot < 1 + n->n_saved; slot++) {
            int id = (src >= 0 ? src : i) * SLOTS + slot;
            ts_storage *s = slot == 0 ? n->out_st : n->saved[slot - 1]->storage;
            if ((slot == 0 && !produces(n)) || (s->scratch2 & LIVE_AFTER) ||
                !ts_device_equal(s->device, p->dev))
                continue;
            int64_t off = off_of[find_root(root, id)];
            if (slot == 0)
                p->out_off[i] = off;
            else
                p->saved_off[i * TS_MAX_SAVED + slot - 1] = off;
        }
    }
    for (int e = 0; e < p->n_remat; e++)
        p->remat_off[e] =
            off_of[find_root(root, t->n * SLOTS + p->remat_node[e])];
    free(off_of), free(root), free(bufs), free(last);
    for (int id = 0; id < ids; id++)
        free(reads[id].pos);
    free(reads), free(writes);
    return p;
oom:
    if (p)
        plan_free(p);
    free(root), free(bufs), free(last);
    for (int id = 0; reads && id < ids; id++)
        free(reads[id].pos);
    free(reads), free(writes);
    return NULL;
}

/* ---- dumps ---- */

static void dump_node(FILE *f, ts_trace *t, int i, const plan *p) {
    ts_node *n = t->nodes[i];
    char sb[128];
    fprintf(f, "%%%d = %s(", i, ts_op_table[n->op].name);
    for (int k = 0; k < n->n_in; k++) {
        int sc = n->in[k]->storage->scratch;
        if (sc > 0)
            fprintf(f, "%s%%%d%s", k ? ", " : "", (sc - 1) / SLOTS,
                    (sc - 1) % SLOTS ? ".saved" : "");
        else
            fprintf(f, "%sin%d", k ? ", " : "", -sc - 1);
        fprintf(f, ":%s%s", ts_dtype_name(n->in[k]->dtype),
                ts_shape_str(n->in[k]->ndim, n->in[k]->shape, sb, sizeof sb));
    }
    fprintf(f, ") -> %s%s", ts_dtype_name(n->out_desc.dtype),
            ts_shape_str(n->out_desc.ndim, n->out_desc.shape, sb, sizeof sb));
    if (n->out_st->scratch2 & LIVE_AFTER)
        fprintf(f, " [kept]");
    if (p) {
        if (p->folded[i])
            fprintf(f, " [constant %g]", p->fold_value[i]);
        if (p->rw_op[i])
            fprintf(f, " [runs fused %s]", ts_op_table[p->rw_op[i]].name);
        if (p->cse_src[i] >= 0)
            fprintf(f, " [= %%%d]", p->cse_src[i]);
        else if (p->fuse_root[i] >= 0)
            fprintf(f, " [fused into %%%d]", p->fuse_root[i]);
        else if (!p->run[i])
            fprintf(f, " [dead]");
        else if (p->out_off[i] >= 0)
            fprintf(f, " @arena+%lld (%zu B)", (long long)p->out_off[i],
                    slot_bytes(n, 0));
    }
    fprintf(f, "\n");
}

static void dump_graph(ts_ctx *ctx, ts_trace *t, const plan *p) {
    const char *dir = getenv("TS_DUMP_GRAPH");
    if (!dir || !*dir)
        return;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return;
    static int dump_seq; /* across contexts: one folder, no overwrites */
    int seq = dump_seq++;
    char path[4096];
    for (int stage = 0; stage < 2; stage++) {
        snprintf(path, sizeof path, "%s/graph-%03d-%s.txt", dir, seq,
                 stage ? "after" : "before");
        FILE *f = fopen(path, "w");
        if (!f)
            return;
        fprintf(f, "# graph %d, %s the passes: %d nodes\n", seq,
                stage ? "after" : "before", t->n);
        for (int i = 0; i < t->n; i++)
            if ((!stage && !is_view_node(t->nodes[i])) ||
                (stage && (p->run[i] || p->cse_src[i] >= 0)))
                dump_node(f, t, i, stage ? p : NULL);
        if (stage) {
            int dead = 0;
            for (int i = 0; i < t->n; i++)
                dead += !p->run[i] && !is_view_node(t->nodes[i]) &&
                        p->cse_src[i] < 0;
            fprintf(
                f,
                "# common subexpressions removed: %d\n# outputs in place: %d\n"
                "# matmul epilogues: %d\n"
                "# nodes fused into a later loop: %d\n"
                "# results recomputed for late readers: %d\n"
                "# constants folded: %d\n",
                p->n_cse, p->n_inplace, p->n_epilogue, p->n_fused, p->n_remat,
                p->n_folded);
            for (int e = 0; e < p->n_remat; e++)
                fprintf(f, "#   %%%d again before %%%d @arena+%lld\n",
                        p->remat_node[e], p->remat_at[e],
                        (long long)p->remat_off[e]);
            fprintf(
                f,
                "# arena lower bound (most bytes alive at once): %zu bytes\n",
                p->arena_lower_bound);
            fprintf(f,
                    "# dead nodes removed: %d\n# arena: %zu bytes\n"
                    "# kept results: %zu bytes\n# planned peak: %zu bytes\n",
                    dead, p->arena_bytes, p->kept_bytes,
                    p->arena_bytes + p->kept_bytes);
        }
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/graph-%03d.dot", dir, seq);
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "digraph g%d {\n  node [shape=box, fontname=monospace];\n", seq);
    for (int i = 0; i < t->n; i++) {
        if (!p->run[i])
            continue;
        ts_node *n = t->nodes[i];
        char sb[128];
        fprintf(
            f, "  n%d [label=\"%%%d %s\\n%s%s\"%s];\n", i, i,
            ts_op_table[n->op].name, ts_dtype_name(n->out_desc.dtype),
            ts_shape_str(n->out_desc.ndim, n->out_desc.shape, sb, sizeof sb),
            n->out_st->scratch2 & LIVE_AFTER ? ", style=bold" : "");
        for (int k = 0; k < n->n_in; k++) {
            int sc = n->in[k]->storage->scratch;
            if (sc > 0)
                fprintf(f, "  n%d -> n%d;\n", (sc - 1) / SLOTS, i);
            else
                fprintf(f, "  in%d -> n%d;\n", -sc - 1, i);
        }
    }
    fprintf(f, "}\n");
    fclose(f);
    (void)ctx;
}

/* ---- sync ---- */

static bool poison_enabled(void) {
#ifdef TS_DEBUG_POISON
    return true;
#else
    const char *e = getenv("TS_POISON_FREED");
    return e && *e && strcmp(e, "0") != 0;
#endif
}

static ts_status bind(ts_ctx *ctx, ts_trace *t, ts_storage *s, int64_t off,
                      size_t bytes) {
    if (off >= 0) {
        s->data = (char *)t->arena + off;
        s->external = true; /* the arena owns it */
    } else {
        s->data = ts_storage_backend(s)->alloc(ctx, s->device.index,
                                               bytes ? bytes : 1);
        if (!s->data)
            return ts_set_error(ctx, TS_ERR_OOM,
                                "compiled graph: out of memory for a %zu-byte "
                                "result",
                                bytes);
    }
    s->bytes = bytes;
    s->pending = false;
    return TS_OK;
}

static ts_status execute(ts_ctx *ctx, ts_trace *t, plan *p) {
    if (p->arena_bytes > t->arena_cap ||
        (t->arena && !ts_device_equal(t->arena_dev, p->dev))) {
        /* through the backend's allocator, so its stats count the arena */
        if (t->arena)
            ts_backend_of(t->arena_dev.kind)
                ->free(ctx, t->arena_dev.index, t->arena, t->arena_cap);
        t->arena_cap = align64(p->arena_bytes);
        t->arena_dev = p->dev;
        t->arena =
            ts_backend_of(p->dev.kind)->alloc(ctx, p->dev.index, t->arena_cap);
        if (!t->arena) {
            t->arena_cap = 0;
            return ts_set_error(ctx, TS_ERR_OOM,
                                "compiled graph: out of memory for a %zu-byte "
                                "arena",
                                p->arena_bytes);
        }
    }
    bool poison = poison_enabled();
    ts_status st = TS_OK;
    /* a device that records the plan's kernels once and replays them */
    const ts_backend *gb = ts_backend_of(p->dev.kind);
    const char *ng = getenv("TS_NO_DEVICE_GRAPH");
    bool graph = gb->graph_begin && !(ng && *ng && strcmp(ng, "0"));
    if (graph) {
        p->graph_be = gb;
        st = gb->graph_begin(ctx, p->dev.index, &p->graph);
    }
    for (int i = 0; i < t->n && st == TS_OK; i++) {
        if (p->cse_src[i] >= 0) { /* results are those of an equal node */
            ts_node *n = t->nodes[i], *src = t->nodes[p->cse_src[i]];
            ts_storage *to[1 + TS_MAX_SAVED], *from[1 + TS_MAX_SAVED];
            int m = 0;
            to[m] = n->out_st, from[m++] = src->out_st;
            for (int k = 0; k < n->n_saved; k++)
                to[m] = n->saved[k]->storage,
                from[m++] = src->saved[k]->storage;
            for (int k = 0; k < m; k++) {
                to[k]->data = from[k]->data;
                to[k]->external = true;
                to[k]->pending = false;
            }
            continue;
        }
        /* entries were chosen from the last node back: run them forward, so
         * a recomputed input is ready before what recomputes from it */
        for (int e = p->n_remat - 1; e >= 0 && st == TS_OK; e--) {
            if (p->remat_at[e] != i)
                continue;
            /* recompute into the second buffer; late readers (and equal
             * nodes' storages) now see it */
            ts_node *r = t->nodes[p->remat_node[e]];
            void *data = (char *)t->arena + p->remat_off[e];
            r->out_st->data = data;
            for (int j = 0; j < t->n; j++)
                if (p->cse_src[j] == p->remat_node[e])
                    t->nodes[j]->out_st->data = data;
            ts_tensor rh = {.refcount = 1,
                            .ctx = ctx,
                            .dtype = r->out_desc.dtype,
                            .ndim = r->out_desc.ndim,
                            .storage = r->out_st};
            memcpy(rh.shape, r->out_desc.shape, sizeof rh.shape);
            ts_contiguous_strides(rh.ndim, rh.shape, rh.strides);
            ts_tensor *keep = r->out;
            r->out = &rh;
            st = ts_run_kernel(ctx, r);
            r->out = keep;
        }
        if (st != TS_OK)
            break;
        if (!p->run[i] || p->fuse_root[i] >= 0)
            continue; /* members run at their root */
        ts_node *n = t->nodes[i];
        if (!ts_op_table[n->op].in_place)
            st = bind(ctx, t, n->out_st, p->out_off[i], slot_bytes(n, 0));
        for (int k = 0; k < n->n_saved && st == TS_OK; k++)
            st = bind(ctx, t, n->saved[k]->storage,
                      p->saved_off[i * TS_MAX_SAVED + k], slot_bytes(n, 1 + k));
        if (st != TS_OK)
            break;
        ts_tensor hdr = {.refcount = 1,
                         .ctx = ctx,
                         .dtype = n->out_desc.dtype,
                         .ndim = n->out_desc.ndim,
                         .storage = n->out_st};
        memcpy(hdr.shape, n->out_desc.shape, sizeof hdr.shape);
        ts_contiguous_strides(hdr.ndim, hdr.shape, hdr.strides);
        ts_tensor *keep = n->out;
        n->out = &hdr;
        bool root = p->group_first[i] >= 0;
        if (p->rw_op[i]) {
            st = run_rewrite(ctx, t, p, i, &hdr);
        } else if (p->folded[i]) { /* a constant: fill, no kernel */
            char one[8];
            ts_store_f64(one, hdr.dtype, p->fold_value[i]);
            st = ts_storage_backend(n->out_st)->fill(
                ctx, n->out_st->device.index, n->out_st->data,
                (size_t)ts_tensor_numel(&hdr), one, ts_dtype_size(hdr.dtype));
            n->out_st->uniform = true;
            n->out_st->uniform_value = p->fold_value[i];
        } else if (root) {
            ts_fused f;
            build_group(t, p, i, &f);
            f.out = &hdr;
            st = ts_storage_backend(n->out_st)->run_fused(ctx, &f);
        } else {
            st = ts_run_kernel(ctx, n);
        }
        n->out = keep;
        if (poison) /* arena buffers whose last user just ran: NaN them */
            for (int b = 0; b < p->n_bufs; b++)
                if (p->buf_end[b] == i) {
                    uint32_t nan = 0xffffffffu; /* sizes are 64-aligned */
                    ts_backend_of(t->arena_dev.kind)
                        ->fill(ctx, t->arena_dev.index,
                               (char *)t->arena + p->buf_off[b],
                               p->buf_bytes[b] / 4, &nan, 4);
                }
    }
    if (graph) {
        ts_status e = gb->graph_end(ctx, p->dev.index, p->graph, st == TS_OK);
        if (st == TS_OK)
            st = e;
    }
    return st;
}

ts_status ts_sync(ts_ctx *ctx) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    ts_trace *t = ctx->trace;
    if (!t || t->n == 0 || ctx->syncing)
        return TS_OK;
    ctx->syncing = true;
    ts_status st = TS_OK;
    unsigned char *run = malloc((size_t)t->n + 1);
    bytes key = {0};
    if (!run) {
        st = ts_set_error(ctx, TS_ERR_OOM, "compiled graph: out of memory");
        goto done;
    }
    /* which results outlive the graph */
    count_refs(t, +1);
    bool ok = mark_live(t);
    mark_unseen_holders(t);
    count_refs(t, -1);
    if (!ok) {
        st = ts_set_error(ctx, TS_ERR_OOM, "compiled graph: out of memory");
        goto done;
    }
    number_storages(t);
    /* dead-code elimination, from the last node back */
    for (int i = 0; i < t->n; i++) {
        ts_node *n = t->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            n->in[k]->storage->scratch2 &= ~READ;
        n->out_st->scratch2 &= ~READ;
        for (int k = 0; k < n->n_saved; k++)
            n->saved[k]->storage->scratch2 &= ~READ;
    }
    int dead = 0, views = 0;
    bool dce = pass_on("dce");
    for (int i = t->n - 1; i >= 0; i--) {
        ts_node *n = t->nodes[i];
        /* writes into its inputs (in-place ops; paged attention writes
         * the KV pools): runs even when nothing reads its result */
        bool need = ts_op_table[n->op].in_place ||
                    n->op == TS_OP_PAGED_ATTENTION || !dce ||
                    (n->out_st->scratch2 & (LIVE_AFTER | READ));
        for (int k = 0; k < n->n_saved; k++)
            need |= (n->saved[k]->storage->scratch2 & (LIVE_AFTER | READ)) != 0;
        if (is_view_node(n)) {
            run[i] = 0;
            views++;
            continue;
        }
        run[i] = need;
        dead += !need;
        if (need)
            for (int k = 0; k < n->n_in; k++)
                n->in[k]->storage->scratch2 |= READ;
    }
    /* the plan: from the cache, or built now */
    build_key(t, run, &key);
    if (key.oom) {
        st = ts_set_error(ctx, TS_ERR_OOM, "compiled graph: out of memory");
        goto done;
    }
    uint64_t h = fnv1a(key.p, key.n);
    plan *p = t->plans;
    while (p && !(p->hash == h && p->key_len == key.n &&
                  !memcmp(p->key, key.p, key.n)))
        p = p->next;
    if (p) {
        ctx->cstats.cache_hits++;
    } else {
        bool invalid = false;
        p = make_plan(ctx, t, run, &invalid);
        if (!p) {
            st = invalid ? ts_set_error(ctx, TS_ERR_STATE,
                                        "compiled graph: the memory plan puts "
                                        "two live buffers in the same bytes")
                         : ts_set_error(ctx, TS_ERR_OOM,
                                        "compiled graph: out of memory");
            goto done;
        }
        p->hash = h;
        p->key = key.p;
        p->key_len = key.n;
        key.p = NULL;
        p->next = t->plans;
        t->plans = p;
        if (++t->n_plans > PLAN_CACHE_MAX) { /* drop the oldest */
            plan *q = t->plans;
            while (q->next && q->next->next)
                q = q->next;
            plan_free(q->next);
            q->next = NULL;
            t->n_plans--;
        }
        ctx->cstats.compilations++;
        dump_graph(ctx, t, p);
    }
    ctx->cstats.graphs_run++;
    ctx->cstats.nodes_run = (uint64_t)(t->n - dead - views - p->n_cse);
    ctx->cstats.nodes_cse = (uint64_t)p->n_cse;
    ctx->cstats.outputs_in_place = (uint64_t)p->n_inplace;
    ctx->cstats.nodes_fused = (uint64_t)p->n_fused;
    ctx->cstats.nodes_recomputed = (uint64_t)p->n_remat;
    ctx->cstats.nodes_folded = (uint64_t)p->n_folded;
    ctx->cstats.patterns_rewritten = (uint64_t)p->n_rewritten;
    ctx->cstats.matmul_epilogues = (uint64_t)p->n_epilogue;
    ctx->cstats.nodes_dead = (uint64_t)dead;
    ctx->cstats.arena_bytes = p->arena_bytes;
    ctx->cstats.arena_lower_bound = p->arena_lower_bound;
    ctx->cstats.planned_peak_bytes = p->arena_bytes + p->kept_bytes;
    st = execute(ctx, t, p);
done:
    free(key.p);
    free(run);
    trace_clear(ctx);
    ctx->syncing = false;
    return st;
}
