/* engine.c — the serving engine: continuous batching over a paged KV
 * cache with prefix reuse, as vLLM and SGLang do.
 *
 * Blocks: a pool of n_blocks blocks of block_size positions (K and V of
 * every layer, ts_kv_pool); a block's reference count is the number
 * of sequences whose block table holds it, plus one while the prefix
 * cache holds it. Free blocks (count 0) are on a free list.
 *
 * Prefix cache: a radix tree over token ids with one full block per edge
 * (SGLang's RadixAttention at block granularity). Each cached block has a
 * stable hash chained from its parent, XXH3(tokens, seed = parent hash),
 * kept in a hash map for lookup; a request walks its prompt's full blocks
 * and reuses the longest cached run, skipping that prefill. Finished and
 * running sequences insert their full blocks; unreferenced leaves are
 * evicted least recently used when the pool runs short. Every insertion
 * and eviction is published as a KV event for the router.
 *
 * Scheduler (one ts_engine_step): admit waiting requests (FCFS) while
 * slots and blocks allow; give every running sequence in decode its one
 * token first, then chunks of pending prefills up to max_batch_tokens (a
 * long prompt never stalls running streams); one forward pass computes all
 * of them, so the weights are read once per step; sample each sequence's
 * next token with its own parameters. When blocks run out: evict cached
 * leaves, then preempt the youngest running sequence (its blocks freed, its
 * tokens kept; it is recomputed when readmitted, mostly from the cache).
 * Per request on top (issue 19): logit_bias and a constraint's mask
 * (structured outputs) applied to a copy of the logits row before the
 * sampler; prompt log-probabilities read from extra logits rows of the
 * prefill; embeddings pooled from the final hidden states of their prompt
 * rows (ts_decoder_forward_paged_ex). Such requests compute their whole
 * prompt: no prefix reuse.
 * Owns sequences, blocks, the tree and the events; the model computes. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "tessera_engine.h"

#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

typedef enum { SEQ_WAITING, SEQ_RUNNING } seq_state;

typedef struct seq {
    int64_t id;
    seq_state state;
    int32_t *tok; /* prompt then generated tokens */
    size_t n_tok, cap_tok, n_prompt;
    int32_t *blocks; /* block table */
    size_t n_blocks, cap_blocks;
    size_t n_computed;     /* positions whose K/V are in the blocks */
    size_t n_inserted;     /* full blocks handed to the prefix cache */
    uint64_t last_hash;    /* chained hash of block n_inserted - 1 */
    int64_t cached_tokens; /* prefix-cache hit at (first) admission */
    bool admitted_once;
    int n_generated, max_tokens;
    ts_sampler *sm;
    int32_t stop_ids[TS_ENGINE_MAX_STOP_IDS];
    int n_stop_ids;
    bool ignore_eos;
    int logprobs;      /* as ts_request */
    uint64_t order;    /* arrival */
    ts_constraint con; /* con.mask NULL: none; its state freed with s */
    ts_logit_bias *bias;
    int n_bias;
    /* prompt_logprobs: n_prompt - 1 entries by position (entry p: token
     * p + 1 given the ones before), handed over with the first output */
    bool want_plp, out_once;
    ts_engine_output *plp;
    ts_pooling pooling;
    double *pool_sum;      /* hidden floats: MEAN's sum, LAST's row */
    double t_add, queue_s; /* monotonic seconds */
} seq;

typedef struct node {
    uint64_t hash, parent_hash;
    struct node *parent;
    int32_t block;
    int32_t *tokens; /* block_size of them */
    int n_children;
    uint64_t last_used;
} node;

struct ts_engine {
    ts_ctx *ctx;
    ts_decoder *m;
    ts_kv_pool *pool;
    ts_engine_options opt;
    int64_t bs, n_blocks, max_blocks_per_seq;
    int32_t *ref;  /* per block */
    bool *in_tree; /* per block: the prefix cache holds one reference */
    int32_t *free_list;
    int64_t n_free;
    /* the tree: open-addressed map hash -> node */
    node **map;
    size_t map_cap, n_nodes;
    /* sequences */
    seq **running, **waiting;
    int n_running, n_waiting, cap_running, cap_waiting;
    int64_t next_id;
    uint64_t tick, order;
    int32_t eos[8];
    int n_eos;
    /* scratch of one draw: a biased, masked logits row and the mask */
    float *row;
    uint32_t *mask;
    /* final outputs that found no room in a step's out (FIFO) */
    ts_engine_output *pend;
    int n_pend, cap_pend;
    /* events */
    ts_kv_event *events;
    size_t n_events, cap_events;
    uint64_t event_seq;
    ts_engine_stats stats;
};

/* ---- blocks ---- */

static int32_t block_take(ts_engine *e) {
    if (!e->n_free)
        return -1;
    int32_t b = e->free_list[--e->n_free];
    e->ref[b] = 1;
    return b;
}

static void block_release(ts_engine *e, int32_t b) {
    if (--e->ref[b] == 0)
        e->free_list[e->n_free++] = b;
}

/* ---- events ---- */

static void publish(ts_engine *e, ts_kv_event_kind kind, const node *n) {
    if (e->n_events == e->cap_events) {
        size_t cap = e->cap_events ? e->cap_events * 2 : 256;
        ts_kv_event *p = realloc(e->events, cap * sizeof *p);
        if (!p)
            return; /* an event lost beats a crash; counted */
        e->events = p, e->cap_events = cap;
    }
    ts_kv_event *ev = &e->events[e->n_events++];
    memset(ev, 0, sizeof *ev);
    ev->seq = ++e->event_seq;
    ev->kind = kind;
    ev->hash = n->hash;
    ev->parent_hash = n->parent_hash;
    ev->block_size = (int32_t)e->bs;
    if (kind == TS_KV_BLOCK_STORED)
        memcpy(ev->tokens, n->tokens,
               sizeof(int32_t) * (size_t)(e->bs < TS_KV_EVENT_MAX_TOKENS
                                              ? e->bs
                                              : TS_KV_EVENT_MAX_TOKENS));
}

size_t ts_engine_cached_blocks(const ts_engine *e, uint64_t *hashes,
                               uint64_t *parents, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; e && i < e->map_cap && n < cap; i++)
        if (e->map[i]) {
            hashes[n] = e->map[i]->hash;
            parents[n++] = e->map[i]->parent_hash;
        }
    return n;
}

size_t ts_engine_drain_events(ts_engine *e, ts_kv_event *out, size_t cap) {
    if (!e || !out)
        return 0;
    size_t n = e->n_events < cap ? e->n_events : cap;
    if (!n)
        return 0;
    memcpy(out, e->events, n * sizeof *out);
    memmove(e->events, e->events + n, (e->n_events - n) * sizeof *out);
    e->n_events -= n;
    return n;
}

/* ---- the prefix tree ---- */

uint64_t ts_block_hash(uint64_t parent, const int32_t *tokens, int64_t n) {
    return XXH3_64bits_withSeed(tokens, sizeof(int32_t) * (size_t)n, parent);
}

static size_t map_slot(const ts_engine *e, uint64_t h) {
    size_t i = (size_t)(h * 0x9e3779b97f4a7c15ull >> 17) & (e->map_cap - 1);
    while (e->map[i] && e->map[i]->hash != h)
        i = (i + 1) & (e->map_cap - 1);
    return i;
}

static node *tree_find(ts_engine *e, uint64_t h, const int32_t *tokens) {
    node *n = e->map[map_slot(e, h)];
    /* a hash collision with other tokens is a miss, never a wrong reuse */
    if (n && memcmp(n->tokens, tokens, sizeof(int32_t) * (size_t)e->bs))
        return NULL;
    return n;
}

static void map_remove(ts_engine *e, node *n) {
    size_t i = map_slot(e, n->hash);
    e->map[i] = NULL;
    /* re-place the cluster after the hole (linear probing) */
    for (size_t j = (i + 1) & (e->map_cap - 1); e->map[j];
         j = (j + 1) & (e->map_cap - 1)) {
        node *m = e->map[j];
        e->map[j] = NULL;
        e->map[map_slot(e, m->hash)] = m;
    }
}

/* block `block` holding toks (block_size of them) after parent joins the
 * tree with the tree's own reference; NULL when already cached (or a
 * colliding hash: the first is kept) or out of memory */
static node *tree_add(ts_engine *e, const int32_t *toks, uint64_t parent,
                      int32_t block) {
    uint64_t h = ts_block_hash(parent, toks, e->bs);
    if (e->opt.no_prefix_cache || e->map[map_slot(e, h)])
        return NULL;
    if (2 * (e->n_nodes + 1) > e->map_cap)
        return NULL; /* the map is sized for every block; cannot happen */
    node *n = calloc(1, sizeof *n);
    int32_t *t = n ? malloc(sizeof(int32_t) * (size_t)e->bs) : NULL;
    if (!t) {
        free(n);
        return NULL;
    }
    memcpy(t, toks, sizeof(int32_t) * (size_t)e->bs);
    n->hash = h, n->parent_hash = parent, n->tokens = t;
    n->block = block;
    n->parent = parent ? e->map[map_slot(e, parent)] : NULL;
    if (n->parent)
        n->parent->n_children++;
    n->last_used = ++e->tick;
    e->ref[n->block]++; /* the tree's own reference */
    e->in_tree[n->block] = true;
    e->map[map_slot(e, h)] = n;
    e->n_nodes++;
    publish(e, TS_KV_BLOCK_STORED, n);
    return n;
}

/* a sequence's full block k, filled with its tokens, joins the tree */
static void tree_insert(ts_engine *e, seq *s, size_t k) {
    const int32_t *toks = s->tok + k * (size_t)e->bs;
    uint64_t parent = k ? s->last_hash : 0;
    s->last_hash = ts_block_hash(parent, toks, e->bs);
    s->n_inserted = k + 1;
    tree_add(e, toks, parent, s->blocks[k]);
}

/* the least recently used leaf no sequence holds, removed; false if none */
static bool evict_one(ts_engine *e) {
    node *best = NULL;
    for (size_t i = 0; i < e->map_cap; i++) {
        node *n = e->map[i];
        if (n && !n->n_children && e->ref[n->block] == 1 &&
            (!best || n->last_used < best->last_used))
            best = n;
    }
    if (!best)
        return false;
    map_remove(e, best);
    e->n_nodes--;
    if (best->parent)
        best->parent->n_children--;
    publish(e, TS_KV_BLOCK_REMOVED, best);
    e->in_tree[best->block] = false;
    block_release(e, best->block);
    e->stats.evicted_blocks++;
    free(best->tokens);
    free(best);
    return true;
}

/* ---- sequences ---- */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the request is over: its constraint's state goes too (exactly once:
 * every seq is freed once) */
static void seq_free(seq *s) {
    if (!s)
        return;
    if (s->con.mask && s->con.free)
        s->con.free(s->con.state);
    ts_sampler_free(s->sm);
    free(s->bias), free(s->plp), free(s->pool_sum);
    free(s->tok), free(s->blocks), free(s);
}

static void output_free(ts_engine_output *o) {
    free(o->prompt_lp), free(o->embedding);
    o->prompt_lp = NULL, o->embedding = NULL;
}

static void seq_drop_blocks(ts_engine *e, seq *s) {
    for (size_t k = 0; k < s->n_blocks; k++)
        block_release(e, s->blocks[k]);
    s->n_blocks = 0;
    s->n_computed = 0;
    s->n_inserted = 0;
}

static bool push_block(seq *s, int32_t b) {
    if (s->n_blocks == s->cap_blocks) {
        size_t cap = s->cap_blocks ? s->cap_blocks * 2 : 8;
        int32_t *p = realloc(s->blocks, cap * sizeof *p);
        if (!p)
            return false;
        s->blocks = p, s->cap_blocks = cap;
    }
    s->blocks[s->n_blocks++] = b;
    return true;
}

static bool push_token(seq *s, int32_t t) {
    if (s->n_tok == s->cap_tok) {
        size_t cap = s->cap_tok ? s->cap_tok * 2 : 64;
        int32_t *p = realloc(s->tok, cap * sizeof *p);
        if (!p)
            return false;
        s->tok = p, s->cap_tok = cap;
    }
    s->tok[s->n_tok++] = t;
    return true;
}

static bool list_push(seq ***v, int *n, int *cap, seq *s, bool front) {
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 16;
        seq **p = realloc(*v, sizeof *p * (size_t)c);
        if (!p)
            return false;
        *v = p, *cap = c;
    }
    if (front) {
        memmove(*v + 1, *v, sizeof **v * (size_t)*n);
        (*v)[0] = s;
    } else
        (*v)[*n] = s;
    (*n)++;
    return true;
}

static void list_remove(seq **v, int *n, int i) {
    memmove(v + i, v + i + 1, sizeof *v * (size_t)(*n - i - 1));
    (*n)--;
}

/* ---- public: lifetime ---- */

ts_engine_options ts_engine_options_default(void) {
    return (ts_engine_options){
        .block_size = 16, .max_seqs = 16, .max_batch_tokens = 512};
}

ts_status ts_engine_new(ts_ctx *ctx, ts_decoder *m,
                        const ts_engine_options *opt, ts_engine **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!m || !opt || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "engine: NULL argument");
    *out = NULL;
    const ts_model_config *c = ts_decoder_get_config(m);
    ts_engine_options o = *opt;
    if (o.block_size < 1 || o.block_size > 256)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "engine: block_size %lld (want 1..256)",
                            (long long)o.block_size);
    if (o.max_seqs < 1 || o.max_seqs > 4096)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "engine: max_seqs %d (want 1..4096)", o.max_seqs);
    if (o.max_batch_tokens < 1)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "engine: max_batch_tokens %lld (want >= 1)",
                            (long long)o.max_batch_tokens);
    if (o.kv_dtype != TS_KV_BF16 && o.kv_dtype != TS_KV_F32 &&
        o.kv_dtype != TS_KV_INT8)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "engine: kv_dtype %d (want TS_KV_BF16, TS_KV_F32 "
                            "or TS_KV_INT8)",
                            (int)o.kv_dtype);
    /* the type the pool gets (f32 when a layer is off the CPU) sizes it */
    ts_kv_dtype kvt = ts_decoder_kv_dtype(m, o.kv_dtype);
    int64_t per_block = ts_kv_block_bytes_ex(c, o.block_size, kvt);
    int64_t nb = o.n_blocks;
    if (!nb)
        nb = o.kv_memory ? o.kv_memory / per_block : 512;
    if (nb < 1 || nb > ((int64_t)1 << 26))
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "engine: %lld KV blocks (%lld bytes each; want at "
                            "least one)",
                            (long long)nb, (long long)per_block);
    ts_engine *e = calloc(1, sizeof *e);
    if (!e)
        return ts_set_error(ctx, TS_ERR_OOM, "engine: out of memory");
    e->ctx = ctx, e->m = m, e->opt = o, e->bs = o.block_size, e->n_blocks = nb;
    e->max_blocks_per_seq = (c->max_positions + e->bs - 1) / e->bs;
    e->ref = calloc((size_t)nb, sizeof *e->ref);
    e->in_tree = calloc((size_t)nb, sizeof *e->in_tree);
    e->free_list = malloc(sizeof *e->free_list * (size_t)nb);
    e->map_cap = 16;
    while (e->map_cap < 2 * (size_t)nb + 2)
        e->map_cap <<= 1;
    e->map = calloc(e->map_cap, sizeof *e->map);
    e->row = malloc(sizeof(float) * (size_t)c->vocab);
    e->mask = malloc(sizeof(uint32_t) * (size_t)((c->vocab + 31) / 32));
    if (!e->ref || !e->in_tree || !e->free_list || !e->map || !e->row ||
        !e->mask) {
        ts_engine_free(e);
        return ts_set_error(ctx, TS_ERR_OOM, "engine: out of memory");
    }
    for (int64_t b = nb - 1; b >= 0; b--)
        e->free_list[e->n_free++] = (int32_t)b;
    ts_status s = ts_kv_pool_new_ex(m, nb, e->bs, kvt, &e->pool);
    if (s != TS_OK) {
        ts_engine_free(e);
        return s;
    }
    e->stats.blocks_total = nb;
    *out = e;
    return TS_OK;
}

void ts_engine_free(ts_engine *e) {
    if (!e)
        return;
    for (int i = 0; i < e->n_running; i++)
        seq_free(e->running[i]);
    for (int i = 0; i < e->n_waiting; i++)
        seq_free(e->waiting[i]);
    for (int i = 0; i < e->n_pend; i++)
        output_free(&e->pend[i]);
    free(e->pend), free(e->row), free(e->mask);
    for (size_t i = 0; e->map && i < e->map_cap; i++)
        if (e->map[i])
            free(e->map[i]->tokens), free(e->map[i]);
    free(e->running), free(e->waiting), free(e->map);
    free(e->ref), free(e->in_tree), free(e->free_list), free(e->events);
    ts_kv_pool_free(e->pool);
    free(e);
}

void ts_engine_set_eos(ts_engine *e, const int32_t *ids, int n) {
    e->n_eos = 0;
    for (int i = 0; i < n && i < 8; i++)
        e->eos[e->n_eos++] = ids[i];
}

/* the issue-19 parts of a request: logit_bias, constraint, pooling */
static ts_status check_extras(ts_engine *e, const ts_request *r) {
    const ts_model_config *c = ts_decoder_get_config(e->m);
    if (r->pooling < TS_POOL_NONE || r->pooling > TS_POOL_MEAN)
        return ts_set_error(e->ctx, TS_ERR_RANGE, "pooling %d (want 0..2)",
                            (int)r->pooling);
    if (r->n_logit_bias < 0 || r->n_logit_bias > TS_ENGINE_MAX_LOGIT_BIAS ||
        (r->n_logit_bias && !r->logit_bias))
        return ts_set_error(e->ctx, TS_ERR_RANGE,
                            "logit_bias: %d entries (want 0..%d)",
                            r->n_logit_bias, TS_ENGINE_MAX_LOGIT_BIAS);
    for (int i = 0; i < r->n_logit_bias; i++) {
        const ts_logit_bias *b = &r->logit_bias[i];
        if (b->token < 0 || b->token >= c->vocab)
            return ts_set_error(e->ctx, TS_ERR_RANGE,
                                "logit_bias: token %d is outside the "
                                "vocabulary (%lld)",
                                b->token, (long long)c->vocab);
        if (!(b->bias >= -100 && b->bias <= 100))
            return ts_set_error(e->ctx, TS_ERR_RANGE,
                                "logit_bias: bias %g of token %d (want "
                                "-100..100)",
                                (double)b->bias, b->token);
    }
    const ts_constraint *k = &r->constraint;
    if (k->mask && (!k->accept || !k->can_end || !k->done))
        return ts_set_error(e->ctx, TS_ERR_INVALID_ARG,
                            "constraint: mask, accept, can_end and done are "
                            "all required");
    if (k->mask && (k->n_tokens < 0 || k->n_tokens > c->vocab))
        return ts_set_error(e->ctx, TS_ERR_RANGE,
                            "constraint: a mask over %lld tokens; the model "
                            "has %lld",
                            (long long)k->n_tokens, (long long)c->vocab);
    return TS_OK;
}

/* the sizes: tokens within the context and the pool, ids in vocabulary */
static ts_status check_sizes(ts_engine *e, const ts_request *r, int gen) {
    const ts_model_config *c = ts_decoder_get_config(e->m);
    if ((int64_t)r->n_prompt + gen > c->max_positions)
        return ts_set_error(e->ctx, TS_ERR_RANGE,
                            "the prompt (%zu tokens) plus max_tokens (%d) is "
                            "longer than the model's context (%lld)",
                            r->n_prompt, gen, (long long)c->max_positions);
    /* a request that could never fit the pool alone is refused now */
    int64_t need = ((int64_t)r->n_prompt + gen + e->bs - 1) / e->bs;
    if (need > e->n_blocks)
        return ts_set_error(e->ctx, TS_ERR_RANGE,
                            "the request needs %lld KV blocks; the pool has "
                            "%lld",
                            (long long)need, (long long)e->n_blocks);
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= c->vocab)
            return ts_set_error(e->ctx, TS_ERR_RANGE,
                                "prompt token %d at %zu is outside the "
                                "vocabulary (%lld)",
                                r->prompt[i], i, (long long)c->vocab);
    return TS_OK;
}

/* s's buffers for logit_bias, prompt logprobs and pooling */
static bool seq_extras(ts_engine *e, seq *s, const ts_request *r) {
    const ts_model_config *c = ts_decoder_get_config(e->m);
    s->pooling = r->pooling;
    if (s->pooling) {
        s->pool_sum = calloc((size_t)c->hidden, sizeof *s->pool_sum);
        return s->pool_sum != NULL;
    }
    if (r->n_logit_bias) {
        s->bias = malloc(sizeof *s->bias * (size_t)r->n_logit_bias);
        if (!s->bias)
            return false;
        memcpy(s->bias, r->logit_bias,
               sizeof *s->bias * (size_t)r->n_logit_bias);
        s->n_bias = r->n_logit_bias;
    }
    s->want_plp = r->prompt_logprobs;
    if (s->want_plp && r->n_prompt > 1) {
        s->plp = calloc(r->n_prompt - 1, sizeof *s->plp);
        return s->plp != NULL;
    }
    return true;
}

ts_status ts_engine_add(ts_engine *e, const ts_request *r, int64_t *id) {
    if (!e)
        return TS_ERR_INVALID_ARG;
    if (!r || !id || (!r->prompt && r->n_prompt))
        return ts_set_error(e->ctx, TS_ERR_INVALID_ARG,
                            "engine_add: NULL argument");
    bool embed = r->pooling != TS_POOL_NONE;
    if (r->n_prompt < 1)
        return ts_set_error(e->ctx, TS_ERR_INVALID_ARG, "the prompt is empty");
    if (!embed && r->max_tokens < 1)
        return ts_set_error(e->ctx, TS_ERR_RANGE, "max_tokens %d (want >= 1)",
                            r->max_tokens);
    ts_status st = check_extras(e, r);
    if (st == TS_OK)
        st = check_sizes(e, r, embed ? 0 : r->max_tokens);
    if (st != TS_OK)
        return st;
    if (r->logprobs < 0 || r->logprobs > 1 + TS_ENGINE_MAX_TOP)
        return ts_set_error(e->ctx, TS_ERR_RANGE,
                            "top_logprobs %d (want 0..%d)", r->logprobs - 1,
                            TS_ENGINE_MAX_TOP);
    if (r->n_stop_ids < 0 || r->n_stop_ids > TS_ENGINE_MAX_STOP_IDS)
        return ts_set_error(e->ctx, TS_ERR_RANGE, "at most %d stop token ids",
                            TS_ENGINE_MAX_STOP_IDS);
    seq *s = calloc(1, sizeof *s);
    if (!s)
        return ts_set_error(e->ctx, TS_ERR_OOM, "engine: out of memory");
    if (!embed) { /* an embedding draws nothing: its sampling is unused */
        st = ts_sampler_new(e->ctx, &r->sampling, &s->sm);
        ts_sampler_set_prompt_len(s->sm, r->n_prompt);
    }
    for (size_t i = 0; st == TS_OK && i < r->n_prompt; i++)
        if (!push_token(s, r->prompt[i]))
            st = ts_set_error(e->ctx, TS_ERR_OOM, "engine: out of memory");
    if (st == TS_OK && !seq_extras(e, s, r))
        st = ts_set_error(e->ctx, TS_ERR_OOM, "engine: out of memory");
    if (st != TS_OK) {
        seq_free(s); /* s->con still empty: the caller keeps the state */
        return st;
    }
    s->n_prompt = r->n_prompt;
    s->max_tokens = r->max_tokens;
    s->ignore_eos = r->ignore_eos;
    s->logprobs = embed ? 0 : r->logprobs;
    s->n_stop_ids = r->n_stop_ids;
    memcpy(s->stop_ids, r->stop_ids, sizeof(int32_t) * (size_t)r->n_stop_ids);
    s->id = ++e->next_id;
    s->order = ++e->order;
    s->state = SEQ_WAITING;
    s->t_add = now_s();
    if (!list_push(&e->waiting, &e->n_waiting, &e->cap_waiting, s, false)) {
        seq_free(s);
        return ts_set_error(e->ctx, TS_ERR_OOM, "engine: out of memory");
    }
    s->con = r->constraint; /* owned from here on */
    *id = s->id;
    return TS_OK;
}

static void finish(ts_engine *e, seq *s, int i_running) {
    seq_drop_blocks(e, s);
    if (i_running >= 0)
        list_remove(e->running, &e->n_running, i_running);
    seq_free(s);
}

static void count_finish(ts_engine *e, ts_finish_reason why) {
    if (why == TS_FINISH_STOP)
        e->stats.finished_stop++;
    else if (why == TS_FINISH_LENGTH)
        e->stats.finished_length++;
    else if (why == TS_FINISH_ABORT)
        e->stats.finished_abort++;
    else if (why == TS_FINISH_CONSTRAINT)
        e->stats.finished_constraint++;
}

/* running s ends for why: counted, blocks released, freed */
static void end_request(ts_engine *e, seq *s, ts_finish_reason why) {
    count_finish(e, why);
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i] == s) {
            finish(e, s, i);
            return;
        }
}

ts_status ts_engine_abort(ts_engine *e, int64_t id) {
    if (!e)
        return TS_ERR_INVALID_ARG;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->id == id) {
            finish(e, e->running[i], i);
            e->stats.aborted++;
            e->stats.finished_abort++;
            return TS_OK;
        }
    for (int i = 0; i < e->n_waiting; i++)
        if (e->waiting[i]->id == id) {
            seq *s = e->waiting[i];
            list_remove(e->waiting, &e->n_waiting, i);
            seq_drop_blocks(e, s);
            seq_free(s);
            e->stats.aborted++;
            e->stats.finished_abort++;
            return TS_OK;
        }
    for (int i = 0; i < e->n_pend; i++)
        if (e->pend[i].id == id) { /* already over: its last output goes */
            output_free(&e->pend[i]);
            memmove(e->pend + i, e->pend + i + 1,
                    sizeof *e->pend * (size_t)(e->n_pend - i - 1));
            e->n_pend--;
            return TS_OK;
        }
    return ts_set_error(e->ctx, TS_ERR_INVALID_ARG,
                        "engine_abort: no request %lld", (long long)id);
}

bool ts_engine_has_work(const ts_engine *e) {
    return e && (e->n_running || e->n_waiting || e->n_pend);
}

void ts_engine_get_stats(const ts_engine *e, ts_engine_stats *out) {
    if (!e || !out)
        return;
    *out = e->stats;
    out->running = e->n_running;
    out->waiting = e->n_waiting;
    out->blocks_free = e->n_free;
    out->blocks_used = e->n_blocks - e->n_free;
    out->cached_blocks = (int64_t)e->n_nodes;
    out->kv_dtype = ts_kv_pool_dtype(e->pool);
    out->kv_block_bytes = ts_engine_block_bytes(e);
    out->blocks_in_sequences = 0;
    for (int64_t b = 0; b < e->n_blocks; b++)
        out->blocks_in_sequences += e->ref[b] > (int32_t)e->in_tree[b];
}

/* ---- scheduling ---- */

/* a block for s's next position block, evicting cached leaves when the
 * pool is empty; false when nothing can be freed */
static bool grow(ts_engine *e, seq *s) {
    int32_t b = block_take(e);
    while (b < 0 && evict_one(e))
        b = block_take(e);
    if (b < 0)
        return false;
    if (!push_block(s, b)) {
        block_release(e, b);
        return false;
    }
    return true;
}

/* blocks that could serve a new allocation: free ones and evictable
 * cached leaves (an upper bound: evicting a leaf may expose its parent) */
static int64_t blocks_available(const ts_engine *e) {
    int64_t n = e->n_free;
    for (size_t i = 0; i < e->map_cap; i++) {
        const node *x = e->map[i];
        if (x && e->ref[x->block] == 1)
            n++;
    }
    return n;
}

/* reuse the longest cached run of s's full blocks (leaving at least one
 * token to compute); none for a request that reads every prompt row
 * (embeddings, prompt logprobs not yet handed over) */
static void match_prefix(ts_engine *e, seq *s) {
    size_t max_blocks = (s->n_tok - 1) / (size_t)e->bs;
    if (s->pooling || (s->want_plp && !s->out_once))
        max_blocks = 0;
    uint64_t parent = 0;
    size_t k = 0;
    for (; !e->opt.no_prefix_cache && k < max_blocks; k++) {
        const int32_t *toks = s->tok + k * (size_t)e->bs;
        uint64_t h = ts_block_hash(parent, toks, e->bs);
        node *n = tree_find(e, h, toks);
        if (!n || !push_block(s, n->block))
            break;
        e->ref[n->block]++;
        n->last_used = ++e->tick;
        parent = h;
    }
    s->n_computed = k * (size_t)e->bs;
    s->n_inserted = k;
    s->last_hash = parent;
}

/* waiting sequences start while fewer than max_seqs run and fewer than
 * room: each running one may give an output a step, and outputs waiting in
 * pend need their turn in out */
static void admit(ts_engine *e, int room) {
    while (e->n_waiting && e->n_running < e->opt.max_seqs &&
           e->n_running < room) {
        seq *s = e->waiting[0];
        match_prefix(e, s);
        /* its tokens and the next one (none for an embedding): what
         * check_sizes promised would fit the pool alone */
        int64_t next = s->pooling ? 0 : 1;
        int64_t need = ((int64_t)s->n_tok + next + e->bs - 1) / e->bs -
                       (int64_t)s->n_blocks;
        if (blocks_available(e) < need) { /* FCFS: wait for room */
            seq_drop_blocks(e, s);
            break;
        }
        list_remove(e->waiting, &e->n_waiting, 0);
        s->state = SEQ_RUNNING;
        if (!s->admitted_once) { /* the hit a client sees (usage) */
            s->cached_tokens = (int64_t)s->n_computed;
            e->stats.prefix_hit_tokens += s->cached_tokens;
            e->stats.prompt_tokens += (int64_t)s->n_prompt;
            s->admitted_once = true;
            s->queue_s = now_s() - s->t_add;
        }
        list_push(&e->running, &e->n_running, &e->cap_running, s, false);
    }
}

/* the youngest running sequence goes back to waiting, its blocks freed
 * (its tokens kept: recomputed when readmitted, mostly from the cache) */
static seq *preempt_youngest(ts_engine *e) {
    int victim = -1;
    for (int i = 0; i < e->n_running; i++)
        if (victim < 0 || e->running[i]->order > e->running[victim]->order)
            victim = i;
    if (victim < 0)
        return NULL;
    seq *s = e->running[victim];
    list_remove(e->running, &e->n_running, victim);
    seq_drop_blocks(e, s);
    s->state = SEQ_WAITING;
    list_push(&e->waiting, &e->n_waiting, &e->cap_waiting, s, true);
    e->stats.preemptions++;
    return s;
}

typedef struct {
    seq *s;
    size_t from, n; /* tokens [from, from + n) of s this step */
} slice;

/* log-softmax of row at t and the n most likely tokens, into o */
static void fill_logprobs(const float *row, int64_t V, int32_t t, int n,
                          ts_engine_output *o) {
    float mx = row[0];
    for (int64_t i = 1; i < V; i++)
        mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < V; i++)
        sum += exp((double)(row[i] - mx));
    float lse = mx + (float)log(sum);
    o->logprob = row[t] - lse;
    o->n_top = 0;
    for (int64_t i = 0; i < V && n > 0; i++) { /* insertion into top n */
        if (o->n_top == n && row[i] <= row[o->top_ids[n - 1]])
            continue;
        int k = o->n_top < n ? o->n_top++ : n - 1;
        while (k > 0 && row[o->top_ids[k - 1]] < row[i]) {
            o->top_ids[k] = o->top_ids[k - 1];
            k--;
        }
        o->top_ids[k] = (int32_t)i;
    }
    for (int k = 0; k < o->n_top; k++)
        o->top_logprobs[k] = row[o->top_ids[k]] - lse;
}

static bool is_end(const ts_engine *e, const seq *s, int32_t t) {
    for (int k = 0; k < e->n_eos && !s->ignore_eos; k++)
        if (t == e->eos[k])
            return true;
    for (int k = 0; k < s->n_stop_ids; k++)
        if (t == s->stop_ids[k])
            return true;
    return false;
}

/* the constraint's mask over w[V]: banned tokens -inf; the end ids allowed
 * exactly when the constraint can end. false: nothing is allowed */
static bool apply_mask(ts_engine *e, seq *s, float *w, int64_t V) {
    float end_val[8 + TS_ENGINE_MAX_STOP_IDS];
    int32_t end_id[8 + TS_ENGINE_MAX_STOP_IDS];
    int n_end = 0;
    for (int k = 0; k < e->n_eos + s->n_stop_ids; k++) {
        bool eos = k < e->n_eos;
        int32_t t = eos ? e->eos[k] : s->stop_ids[k - e->n_eos];
        if ((eos && s->ignore_eos) || t < 0 || t >= V)
            continue;
        end_id[n_end] = t;
        end_val[n_end++] = w[t];
    }
    size_t n_words = (size_t)(V + 31) / 32;
    memset(e->mask, 0, sizeof(uint32_t) * n_words);
    s->con.mask(s->con.state, e->mask);
    for (size_t wd = 0; wd < n_words; wd++) {
        uint32_t bits = e->mask[wd];
        if (bits == 0xffffffffu)
            continue;
        int64_t hi = (int64_t)(wd + 1) * 32 < V ? (int64_t)(wd + 1) * 32 : V;
        for (int64_t i = (int64_t)wd * 32; i < hi; i++)
            if (!(bits >> (i & 31) & 1))
                w[i] = -INFINITY;
    }
    bool can_end = s->con.can_end(s->con.state);
    for (int k = 0; k < n_end; k++)
        w[end_id[k]] = can_end ? end_val[k] : -INFINITY;
    for (int64_t i = 0; i < V; i++)
        if (w[i] != -INFINITY)
            return true;
    return false;
}

/* the next token of s from its logits row: logit_bias added and the
 * constraint's mask applied on a copy; -1 when the constraint allows
 * nothing (or the sampler failed) */
static int32_t draw(ts_engine *e, seq *s, const float *row, int64_t V) {
    const float *l = row;
    if (s->n_bias || s->con.mask) {
        memcpy(e->row, row, sizeof(float) * (size_t)V);
        for (int i = 0; i < s->n_bias; i++)
            e->row[s->bias[i].token] += s->bias[i].bias;
        if (s->con.mask && !apply_mask(e, s, e->row, V))
            return -1;
        l = e->row;
    }
    return ts_sampler_next(s->sm, l, V, s->tok, s->n_tok);
}

static ts_engine_output first_fields(seq *s) {
    ts_engine_output o = {.id = s->id,
                          .cached_tokens = s->cached_tokens,
                          .prompt_tokens = (int64_t)s->n_prompt,
                          .queue_s = s->queue_s};
    if (!s->out_once && s->want_plp) { /* the prompt's log-probabilities */
        o.prompt_lp = s->plp;
        o.n_prompt_lp = s->plp ? s->n_prompt - 1 : 0;
        s->plp = NULL;
    }
    s->out_once = true;
    return o;
}

/* a final output into pend (flushed at the end of the step); false when
 * pend cannot grow */
static bool pend_push(ts_engine *e, ts_engine_output *o) {
    if (e->n_pend == e->cap_pend) {
        int c = e->cap_pend ? 2 * e->cap_pend : 16;
        ts_engine_output *p = realloc(e->pend, sizeof *p * (size_t)c);
        if (!p)
            return false;
        e->pend = p, e->cap_pend = c;
    }
    e->pend[e->n_pend++] = *o;
    return true;
}

/* o into out when there is room; else a final output waits in pend (the
 * request is gone, nothing of it can come out of order), another is
 * dropped */
static void emit(ts_engine *e, ts_engine_output *out, int cap, int *n_out,
                 ts_engine_output *o) {
    if (*n_out < cap) {
        out[(*n_out)++] = *o;
        return;
    }
    if (o->finish == TS_FINISH_NONE || !pend_push(e, o))
        output_free(o);
}

static void flush_pending(ts_engine *e, ts_engine_output *out, int cap,
                          int *n_out) {
    int k = 0;
    while (k < e->n_pend && *n_out < cap)
        out[(*n_out)++] = e->pend[k++];
    if (!k)
        return;
    memmove(e->pend, e->pend + k, sizeof *e->pend * (size_t)(e->n_pend - k));
    e->n_pend -= k;
}

/* s's next token from its logits row, its output, and its end */
static void sample_row(ts_engine *e, seq *s, const float *row, int64_t V,
                       ts_engine_output *out, int cap, int *n_out) {
    ts_engine_output o = first_fields(s);
    int32_t t = draw(e, s, row, V);
    ts_finish_reason why = TS_FINISH_NONE;
    bool done = false;
    if (t < 0)
        why = s->con.mask ? TS_FINISH_CONSTRAINT : TS_FINISH_ABORT;
    else {
        bool end = is_end(e, s, t);
        if (s->con.mask && !end) {
            if (s->con.accept(s->con.state, t))
                done = s->con.done(s->con.state);
            else
                why = TS_FINISH_CONSTRAINT, t = -1;
        }
    }
    if (t >= 0) {
        s->n_generated++;
        e->stats.generated_tokens++;
        if (!push_token(s, t))
            why = TS_FINISH_ABORT, done = false;
        else if (is_end(e, s, t))
            why = TS_FINISH_STOP;
        else if (!done && s->n_generated >= s->max_tokens)
            why = TS_FINISH_LENGTH;
        if (s->logprobs) /* the model's distribution, before bias and mask */
            fill_logprobs(row, V, t, s->logprobs - 1, &o);
    }
    o.token = t;
    o.finish = why;
    emit(e, out, cap, n_out, &o);
    if (done) { /* the constraint is complete: a STOP output follows */
        ts_engine_output stop = {.id = s->id,
                                 .token = -1,
                                 .finish = TS_FINISH_STOP,
                                 .cached_tokens = s->cached_tokens,
                                 .prompt_tokens = (int64_t)s->n_prompt,
                                 .queue_s = s->queue_s};
        /* a second output for s: it waits in pend so that it never takes
         * the slot of another sequence's token (cap >= max_seqs) */
        if (!pend_push(e, &stop))
            emit(e, out, cap, n_out, &stop);
        why = TS_FINISH_STOP;
    }
    if (why != TS_FINISH_NONE)
        end_request(e, s, why);
}

/* an embedding request whose prompt is computed: its pooled,
 * L2-normalized vector as its one output */
static void finish_embedding(ts_engine *e, seq *s, int64_t C,
                             ts_engine_output *out, int cap, int *n_out) {
    ts_engine_output o = first_fields(s);
    o.token = -1;
    o.finish = TS_FINISH_STOP;
    o.embedding = malloc(sizeof(float) * (size_t)C);
    if (!o.embedding)
        o.finish = TS_FINISH_ABORT;
    double scale = s->pooling == TS_POOL_MEAN ? 1.0 / (double)s->n_prompt : 1,
           sq = 0;
    for (int64_t i = 0; i < C; i++)
        sq += s->pool_sum[i] * s->pool_sum[i];
    double inv = sq > 0 ? 1 / sqrt(sq * scale * scale) : 0;
    for (int64_t i = 0; o.embedding && i < C; i++)
        o.embedding[i] = (float)(s->pool_sum[i] * scale * inv);
    o.dim = o.embedding ? C : 0;
    if (o.embedding)
        e->stats.embeddings++;
    emit(e, out, cap, n_out, &o);
    end_request(e, s, o.finish);
}

/* what one forward pass reads out: logits rows (each sampling sequence's
 * last token first, then prompt-logprob rows) and hidden rows (the
 * positions embeddings pool) */
typedef struct {
    int32_t *rows, *row_pos; /* logits rows; a prompt row's position */
    seq **row_seq;
    int n_sample, n_rows;
    int32_t *hrows;
    seq **hrow_seq;
    int n_h;
    int64_t C;
} readout;

static void readout_free(readout *ro) {
    free(ro->rows), free(ro->row_pos), free(ro->row_seq);
    free(ro->hrows), free(ro->hrow_seq);
}

static bool readout_new(readout *ro, int n_sl, size_t N, int64_t C) {
    memset(ro, 0, sizeof *ro);
    ro->C = C;
    size_t nr = (size_t)n_sl + N;
    ro->rows = malloc(sizeof(int32_t) * nr);
    ro->row_pos = malloc(sizeof(int32_t) * nr);
    ro->row_seq = malloc(sizeof(seq *) * nr);
    ro->hrows = malloc(sizeof(int32_t) * N);
    ro->hrow_seq = malloc(sizeof(seq *) * N);
    return ro->rows && ro->row_pos && ro->row_seq && ro->hrows && ro->hrow_seq;
}

/* slice (s, from, n) starts at flat index t0: its rows to read out */
static void plan_rows(readout *ro, const slice *x, int32_t t0, bool sample) {
    seq *s = x->s;
    bool ends = x->from + x->n == s->n_tok;
    if (s->pooling) {
        if (sample) /* embeddings: hidden rows only */
            return;
        if (x->from == 0) /* (re)computed from the start */
            memset(s->pool_sum, 0, sizeof(double) * (size_t)ro->C);
        for (size_t j = 0; j < x->n; j++)
            if (s->pooling == TS_POOL_MEAN || (ends && j == x->n - 1)) {
                ro->hrows[ro->n_h] = t0 + (int32_t)j;
                ro->hrow_seq[ro->n_h++] = s;
            }
        return;
    }
    if (sample && ends) {
        ro->rows[ro->n_rows] = t0 + (int32_t)x->n - 1;
        ro->row_pos[ro->n_rows] = (int32_t)s->n_tok - 1;
        ro->row_seq[ro->n_rows++] = s;
    }
    if (!sample && s->want_plp && !s->out_once)
        for (size_t j = 0; j < x->n; j++)
            if (x->from + j + 1 < s->n_prompt) {
                ro->rows[ro->n_rows] = t0 + (int32_t)j;
                ro->row_pos[ro->n_rows] = (int32_t)(x->from + j);
                ro->row_seq[ro->n_rows++] = s;
            }
}

/* 64 MiB of f32 logits rows for prompt log-probabilities per step */
#define PLP_STEP_FLOATS ((int64_t)16 << 20)

/* decodes first (one token each), then prefill chunks up to the budget;
 * blocks for every position written this step, preempting the youngest
 * sequences when the pool runs short. false: nothing can make room */
static bool schedule(ts_engine *e, slice *sl, int *n_sl_out) {
    int n_sl = 0;
    int64_t budget = e->opt.max_batch_tokens;
    /* prompt log-probabilities read a logits row per prompt token: at most
     * PLP_STEP_FLOATS of them a step (a long prompt's chunks get smaller) */
    int64_t vocab = ts_decoder_get_config(e->m)->vocab;
    int64_t plp_left =
        PLP_STEP_FLOATS / vocab > 0 ? PLP_STEP_FLOATS / vocab : 1;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < e->n_running && budget > 0; i++) {
            seq *s = e->running[i];
            size_t left = s->n_tok - s->n_computed;
            bool decoding = left == 1;
            if (decoding != (pass == 0))
                continue;
            size_t n = left < (size_t)budget ? left : (size_t)budget;
            if (s->want_plp && !s->out_once && !decoding) {
                if (plp_left < 1)
                    continue;
                if (n > (size_t)plp_left)
                    n = (size_t)plp_left;
                plp_left -= (int64_t)n;
            }
            sl[n_sl++] = (slice){s, s->n_computed, n};
            budget -= (int64_t)n;
        }
    for (int k = 0; k < n_sl; k++) {
        seq *s = sl[k].s;
        size_t need =
            (sl[k].from + sl[k].n + (size_t)e->bs - 1) / (size_t)e->bs;
        while (s->n_blocks < need) {
            if (grow(e, s))
                continue;
            /* out of blocks: the youngest sequence (maybe s) waits */
            seq *victim = e->n_running > 1 ? preempt_youngest(e) : NULL;
            if (!victim) {
                *n_sl_out = n_sl;
                return false;
            }
            for (int j = 0; j < n_sl; j++)
                if (sl[j].s == victim) {
                    memmove(sl + j, sl + j + 1,
                            sizeof *sl * (size_t)(n_sl - j - 1));
                    n_sl--;
                    if (j <= k)
                        k--;
                    break;
                }
            if (victim == s)
                break; /* s's slice is gone; on to the next one */
        }
    }
    *n_sl_out = n_sl;
    return true;
}

/* a tensor's f32 data on the host (a new reference in *host) */
static const float *host_rows(ts_tensor *t, ts_tensor **host) {
    *host = t ? ts_to_device(t, (ts_device){TS_DEVICE_CPU, 0}) : NULL;
    return *host ? ts_tensor_data(*host) : NULL;
}

/* after the pass: prompt log-probabilities, pooled hidden states,
 * finished embeddings, then each sampling sequence's next token */
static void read_out(ts_engine *e, const readout *ro, const slice *sl, int n_sl,
                     const float *L, int64_t V, const float *H,
                     ts_engine_output *out, int cap, int *n_out) {
    for (int r = ro->n_sample; r < ro->n_rows; r++) {
        seq *s = ro->row_seq[r];
        int32_t p = ro->row_pos[r];
        ts_engine_output *o = &s->plp[p];
        memset(o, 0, sizeof *o);
        o->id = s->id;
        o->token = s->tok[p + 1];
        fill_logprobs(L + (size_t)r * (size_t)V, V, o->token,
                      s->logprobs ? s->logprobs - 1 : 0, o);
    }
    for (int r = 0; r < ro->n_h; r++) {
        seq *s = ro->hrow_seq[r];
        const float *h = H + (size_t)r * (size_t)ro->C;
        bool last = s->pooling == TS_POOL_LAST;
        for (int64_t i = 0; i < ro->C; i++)
            s->pool_sum[i] = last ? h[i] : s->pool_sum[i] + h[i];
    }
    for (int k = 0; k < n_sl; k++)
        if (sl[k].s->pooling && sl[k].from + sl[k].n == sl[k].s->n_tok)
            finish_embedding(e, sl[k].s, ro->C, out, cap, n_out);
    for (int r = 0; r < ro->n_sample; r++)
        sample_row(e, ro->row_seq[r], L + (size_t)r * (size_t)V, V, out, cap,
                   n_out);
}

/* the one forward pass over the slices: K/V written, rows read out */
static ts_status forward(ts_engine *e, const slice *sl, int n_sl, readout *ro,
                         ts_tensor **logits, ts_tensor **hidden) {
    ts_ctx *ctx = e->ctx;
    size_t N = 0;
    int64_t max_b = 0;
    for (int k = 0; k < n_sl; k++) {
        N += sl[k].n;
        if ((int64_t)sl[k].s->n_blocks > max_b)
            max_b = (int64_t)sl[k].s->n_blocks;
    }
    size_t meta_n =
        2 + (size_t)(n_sl + 1) + (size_t)n_sl + (size_t)n_sl * (size_t)max_b;
    int32_t *meta = calloc(meta_n, sizeof *meta);
    int32_t *pos = malloc(sizeof(int32_t) * N);
    int64_t *ids = malloc(sizeof(int64_t) * N);
    const ts_model_config *c = ts_decoder_get_config(e->m);
    ts_status st = meta && pos && ids && readout_new(ro, n_sl, N, c->hidden)
                       ? TS_OK
                       : ts_set_error(ctx, TS_ERR_OOM, "engine: out of memory");
    if (st == TS_OK) {
        meta[0] = n_sl, meta[1] = (int32_t)max_b;
        int32_t *start = meta + 2, *clen = start + n_sl + 1,
                *table = clen + n_sl;
        size_t t = 0;
        for (int k = 0; k < n_sl; k++) {
            seq *s = sl[k].s;
            start[k] = (int32_t)t;
            clen[k] = (int32_t)sl[k].from;
            for (size_t b = 0; b < s->n_blocks; b++)
                table[(size_t)k * (size_t)max_b + b] = s->blocks[b];
            for (size_t j = 0; j < sl[k].n; j++, t++) {
                ids[t] = s->tok[sl[k].from + j];
                pos[t] = (int32_t)(sl[k].from + j);
            }
        }
        start[n_sl] = (int32_t)t;
        for (int pass = 0; pass < 2; pass++) { /* sampling rows first */
            int32_t t0 = 0;
            for (int k = 0; k < n_sl; k++) {
                plan_rows(ro, &sl[k], t0, pass == 0);
                t0 += (int32_t)sl[k].n;
            }
            if (pass == 0)
                ro->n_sample = ro->n_rows;
        }
    }
    if (st == TS_OK) {
        bool old = ts_set_grad_enabled(ctx, false);
        ts_mode mode = ctx->mode;
        ctx->mode = TS_MODE_EAGER; /* the pools are written in place */
        int64_t ishape[2] = {1, (int64_t)N}, mshape[1] = {(int64_t)meta_n};
        ts_tensor *in = ts_from_data(ctx, TS_I64, 2, ishape, ids);
        ts_tensor *mt = ts_from_data(ctx, TS_I32, 1, mshape, meta);
        st = in && mt
                 ? ts_decoder_forward_paged_ex(e->m, e->pool, in, pos, mt,
                                               ro->rows, ro->n_rows, ro->hrows,
                                               ro->n_h, logits, hidden)
                 : ts_ctx_status(ctx);
        ctx->mode = mode;
        ts_set_grad_enabled(ctx, old);
        ts_release(in), ts_release(mt);
        if (st == TS_OK) {
            e->stats.steps++;
            e->stats.batch_tokens += (int64_t)N;
        }
    }
    free(meta), free(pos), free(ids);
    return st;
}

static ts_status step_run(ts_engine *e, ts_engine_output *out, int cap,
                          int *n_out) {
    ts_ctx *ctx = e->ctx;
    admit(e, cap - e->n_pend);
    if (!e->n_running)
        return TS_OK;
    slice *sl = calloc((size_t)e->n_running, sizeof *sl);
    if (!sl)
        return ts_set_error(ctx, TS_ERR_OOM, "engine: out of memory");
    int n_sl = 0;
    if (!schedule(e, sl, &n_sl)) {
        free(sl);
        return ts_set_error(ctx, TS_ERR_STATE,
                            "engine: out of KV blocks with nothing to evict "
                            "or preempt");
    }
    if (!n_sl) {
        free(sl);
        return TS_OK;
    }
    readout ro = {0};
    ts_tensor *logits = NULL, *hidden = NULL;
    ts_status st = forward(e, sl, n_sl, &ro, &logits, &hidden);
    if (st == TS_OK) {
        for (int k = 0; k < n_sl; k++) {
            seq *s = sl[k].s;
            s->n_computed += sl[k].n;
            /* full blocks of known tokens join the prefix cache */
            while ((s->n_inserted + 1) * (size_t)e->bs <= s->n_computed)
                tree_insert(e, s, s->n_inserted);
        }
        /* sampling and pooling are the host's: rows on a device come
         * back here */
        ts_tensor *hl = NULL, *hh = NULL;
        const float *L = host_rows(logits, &hl), *H = host_rows(hidden, &hh);
        if ((ro.n_rows && !L) || (ro.n_h && !H))
            st = ts_ctx_status(ctx) ? ts_ctx_status(ctx) : TS_ERR_STATE;
        else
            read_out(e, &ro, sl, n_sl, L, ts_tensor_dim(hl, 1), H, out, cap,
                     n_out);
        ts_release(hl), ts_release(hh);
    }
    ts_release(logits), ts_release(hidden);
    readout_free(&ro);
    free(sl);
    return st;
}

ts_status ts_engine_step(ts_engine *e, ts_engine_output *out, int cap,
                         int *n_out) {
    if (!e || !n_out || (!out && cap))
        return TS_ERR_INVALID_ARG;
    *n_out = 0;
    ts_status st = step_run(e, out, cap, n_out);
    flush_pending(e, out, cap, n_out);
    return st;
}

/* ---- KV transfer (prefill/decode disaggregation) ---- */

int64_t ts_engine_block_size(const ts_engine *e) {
    return e ? e->bs : 0;
}

int64_t ts_engine_block_bytes(const ts_engine *e) {
    return e ? ts_kv_block_bytes_ex(ts_decoder_get_config(e->m), e->bs,
                                    ts_kv_pool_dtype(e->pool))
             : 0;
}

size_t ts_engine_export_prefix(ts_engine *e, const int32_t *tokens,
                               size_t n_tokens, void *buf, size_t max_blocks) {
    if (!e || !tokens || !buf || e->opt.no_prefix_cache)
        return 0;
    size_t per = (size_t)ts_engine_block_bytes(e), k = 0;
    uint64_t parent = 0;
    for (; k < max_blocks && (k + 1) * (size_t)e->bs <= n_tokens; k++) {
        const int32_t *toks = tokens + k * (size_t)e->bs;
        uint64_t h = ts_block_hash(parent, toks, e->bs);
        node *n = tree_find(e, h, toks);
        if (!n || ts_kv_pool_read_block(e->pool, n->block,
                                        (char *)buf + k * per) != TS_OK)
            break;
        n->last_used = ++e->tick;
        parent = h;
    }
    return k;
}

ts_status ts_engine_import_prefix(ts_engine *e, const int32_t *tokens,
                                  size_t n_blocks, const void *buf,
                                  size_t *adopted) {
    if (!e)
        return TS_ERR_INVALID_ARG;
    if (!tokens || !buf || !adopted)
        return ts_set_error(e->ctx, TS_ERR_INVALID_ARG,
                            "engine_import_prefix: NULL argument");
    *adopted = 0;
    const ts_model_config *c = ts_decoder_get_config(e->m);
    for (size_t i = 0; i < n_blocks * (size_t)e->bs; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return ts_set_error(e->ctx, TS_ERR_RANGE,
                                "imported token %d at %zu is outside the "
                                "vocabulary (%lld)",
                                tokens[i], i, (long long)c->vocab);
    if (e->opt.no_prefix_cache)
        return TS_OK; /* nothing to adopt into */
    size_t per = (size_t)ts_engine_block_bytes(e);
    /* the chain's blocks are held while it grows, so making room for
     * block k never evicts block k - 1 */
    int32_t *held = malloc(sizeof(int32_t) * (n_blocks ? n_blocks : 1));
    if (!held)
        return ts_set_error(e->ctx, TS_ERR_OOM, "engine: out of memory");
    size_t n_held = 0;
    uint64_t parent = 0;
    ts_status st = TS_OK;
    for (size_t k = 0; k < n_blocks; k++) {
        const int32_t *toks = tokens + k * (size_t)e->bs;
        uint64_t h = ts_block_hash(parent, toks, e->bs);
        node *n = tree_find(e, h, toks);
        if (!n && e->map[map_slot(e, h)])
            break; /* a colliding hash holds the slot: stop here */
        if (!n) {
            int32_t b = block_take(e);
            while (b < 0 && evict_one(e))
                b = block_take(e);
            if (b < 0)
                break; /* the pool is full of blocks in use: adopt less */
            st =
                ts_kv_pool_write_block(e->pool, b, (const char *)buf + k * per);
            n = st == TS_OK ? tree_add(e, toks, parent, b) : NULL;
            block_release(e, b); /* the tree's reference remains */
            if (!n)
                break;
            (*adopted)++;
        }
        n->last_used = ++e->tick;
        e->ref[n->block]++;
        held[n_held++] = n->block;
        parent = h;
    }
    for (size_t i = 0; i < n_held; i++)
        block_release(e, held[i]);
    free(held);
    return st;
}
