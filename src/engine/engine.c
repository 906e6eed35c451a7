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
 * Scheduler (one ts_engine_step): admit waiting requests (by priority,
 * lower first as vLLM's, then FCFS; a higher-priority arrival preempts a
 * lower-priority running sequence when slots or blocks lack) while
 * slots and blocks allow; give every running sequence in decode its one
 * token first, then chunks of pending prefills up to max_batch_tokens (a
 * long prompt never stalls running streams); one forward pass computes all
 * of them, so the weights are read once per step; sample each sequence's
 * next token with its own parameters. When blocks run out: evict cached
 * leaves, then preempt the youngest running sequence of the lowest priority
 * (its blocks freed, its tokens kept; it is recomputed when readmitted,
 * mostly from the cache, before later arrivals of its priority).
 * Per request on top (issue 19): logit_bias and a constraint's mask
 * (structured outputs) applied to a copy of the logits row before the
 * sampler; prompt log-probabilities read from extra logits rows of the
 * prefill; embeddings pooled from the final hidden states of their prompt
 * rows (ts_decoder_forward_paged_ex). Such requests compute their whole
 * prompt: no prefix reuse.
 * Speculative decoding (issue 22, vLLM's two kinds): a decoding sequence
 * gets up to K proposals, from prompt lookup (the tokens that followed the
 * latest earlier occurrence of its longest suffix n-gram) or from a draft
 * model run K times a step, batched over sequences, on its own KV pool
 * (the target's block ids and tables; per block a flag says whether the
 * draft's K/V is there, since cached and imported blocks may lack it).
 * The proposals ride in the same target pass as everything else (1 + K
 * rows of logits); the rule of speculative sampling accepts a prefix of
 * them and draws one more, and the sequence rolls back to what was
 * accepted. Proposals take budget, blocks and out room only where left.
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
    int priority;      /* as ts_request: lower first */
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
    /* speculative decoding: spec_ok when the request may speculate,
     * greedy when its sampling is the argmax; this step's spec_k
     * proposals sit in tok[n_tok ..) (room kept for them and one more);
     * q[spec_k][V] the draft's distributions they were drawn from (a
     * sampled request with a draft model); n_draft positions whose draft
     * K/V are computed; the counts its outputs report */
    bool spec_ok, greedy;
    int spec_k;
    float *q;
    size_t n_draft;
    int64_t spec_proposed, spec_accepted;
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
    /* TS_SPEC_DRAFT: the draft model (not owned) and its own pool, indexed
     * by the same block ids; has_draft[b]: the draft's K/V of all of block
     * b's positions are there (a block from the cache or an import may lack
     * them) */
    ts_decoder *draft;
    ts_kv_pool *dpool;
    bool *has_draft;
    float *p; /* scratch of a verification: the target's distribution */
    ts_engine_options opt;
    bool compiled; /* model steps in the compiled mode (forward_compiled) */
    bool compiled_draft; /* the draft's passes too */
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
    if (e->has_draft)
        e->has_draft[b] = false;
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
    free(s->bias), free(s->plp), free(s->pool_sum), free(s->q);
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
    s->n_draft = 0;
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

/* s before every waiting sequence that runs after it: lower priority
 * value first, then earlier arrival (a preempted sequence keeps its
 * place: it resumes before those that came after it) */
static bool waiting_insert(ts_engine *e, seq *s) {
    if (!list_push(&e->waiting, &e->n_waiting, &e->cap_waiting, s, false))
        return false;
    int i = e->n_waiting - 1;
    while (i > 0 && (e->waiting[i - 1]->priority > s->priority ||
                     (e->waiting[i - 1]->priority == s->priority &&
                      e->waiting[i - 1]->order > s->order))) {
        e->waiting[i] = e->waiting[i - 1];
        i--;
    }
    e->waiting[i] = s;
    return true;
}

static void list_remove(seq **v, int *n, int i) {
    memmove(v + i, v + i + 1, sizeof *v * (size_t)(*n - i - 1));
    (*n)--;
}

static bool all_on_cpu(ts_decoder *m);

/* ---- public: lifetime ---- */

ts_engine_options ts_engine_options_default(void) {
    return (ts_engine_options){
        .block_size = 16, .max_seqs = 64, .max_batch_tokens = 512};
}

/* the speculative-decoding options; their defaults filled in o */
static ts_status check_spec(ts_ctx *ctx, const ts_model_config *c,
                            ts_engine_options *o) {
    if (o->spec < TS_SPEC_NONE || o->spec > TS_SPEC_DRAFT)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "engine: spec %d (want 0..2: none, ngram, draft)",
                            (int)o->spec);
    if (o->spec_tokens < 0 || o->spec_tokens > 16)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "engine: spec_tokens %d (want 1..16; 0: 4)",
                            o->spec_tokens);
    if (o->spec_ngram_min < 0 || o->spec_ngram_min > 64)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "engine: spec_ngram_min %d (want 1..64; 0: 1)",
                            o->spec_ngram_min);
    if (o->spec_ngram_max < 0 || o->spec_ngram_max > 64)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "engine: spec_ngram_max %d (want 1..64; 0: 4)",
                            o->spec_ngram_max);
    o->spec_tokens = o->spec_tokens ? o->spec_tokens : 4;
    o->spec_ngram_min = o->spec_ngram_min ? o->spec_ngram_min : 1;
    o->spec_ngram_max = o->spec_ngram_max ? o->spec_ngram_max : 4;
    if (o->spec_ngram_min > o->spec_ngram_max)
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "engine: spec_ngram_min %d is more than "
                            "spec_ngram_max %d",
                            o->spec_ngram_min, o->spec_ngram_max);
    if (o->spec != TS_SPEC_DRAFT)
        return TS_OK;
    if (!o->spec_draft)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "engine: spec is TS_SPEC_DRAFT but spec_draft "
                            "(the draft model) is NULL");
    const ts_model_config *d = ts_decoder_get_config(o->spec_draft);
    if (d->vocab != c->vocab)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "engine: the draft model's vocabulary has %lld "
                            "tokens, the model's %lld (they must be the same)",
                            (long long)d->vocab, (long long)c->vocab);
    if (d->max_positions < c->max_positions)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "engine: the draft model's context (%lld "
                            "positions) is shorter than the model's (%lld)",
                            (long long)d->max_positions,
                            (long long)c->max_positions);
    return TS_OK;
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
    ts_status s = check_spec(ctx, c, &o);
    if (s != TS_OK)
        return s;
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
    if (o.spec != TS_SPEC_NONE)
        e->p = malloc(sizeof(float) * (size_t)c->vocab);
    if (o.spec == TS_SPEC_DRAFT)
        e->has_draft = calloc((size_t)nb, sizeof *e->has_draft);
    if (!e->ref || !e->in_tree || !e->free_list || !e->map || !e->row ||
        !e->mask || (o.spec != TS_SPEC_NONE && !e->p) ||
        (o.spec == TS_SPEC_DRAFT && !e->has_draft)) {
        ts_engine_free(e);
        return ts_set_error(ctx, TS_ERR_OOM, "engine: out of memory");
    }
    for (int64_t b = nb - 1; b >= 0; b--)
        e->free_list[e->n_free++] = (int32_t)b;
    /* one block more than the engine hands out: compiled steps' padding
     * tokens write there (forward_compiled), in the draft's pool too */
    s = ts_kv_pool_new_ex(m, nb + 1, e->bs, kvt, &e->pool);
    if (s == TS_OK && o.spec == TS_SPEC_DRAFT) {
        e->draft = o.spec_draft; /* its pool: the same blocks' draft K/V */
        s = ts_kv_pool_new_ex(e->draft, nb + 1, e->bs,
                              ts_decoder_kv_dtype(e->draft, kvt), &e->dpool);
    }
    /* the weights packed once into the layout the decode kernels read
     * (a no-op where no kernel wants one) */
    if (s == TS_OK)
        s = ts_decoder_prepack(m);
    if (s == TS_OK && e->draft)
        s = ts_decoder_prepack(e->draft);
    if (s != TS_OK) {
        ts_engine_free(e);
        return s;
    }
    e->stats.blocks_total = nb;
    e->compiled = !o.enforce_eager && all_on_cpu(m);
    e->compiled_draft = e->compiled && e->draft && all_on_cpu(e->draft);
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
    free(e->has_draft), free(e->p);
    ts_kv_pool_free(e->pool);
    ts_kv_pool_free(e->dpool);
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
    /* speculation reads the logits rows of proposed positions: not for a
     * constraint (its state follows every draw), prompt log-probabilities
     * or embeddings */
    s->spec_ok = e->opt.spec != TS_SPEC_NONE && !embed && !r->constraint.mask &&
                 !r->prompt_logprobs;
    s->greedy = r->sampling.temperature == 0 || r->sampling.top_k == 1;
    s->n_stop_ids = r->n_stop_ids;
    memcpy(s->stop_ids, r->stop_ids, sizeof(int32_t) * (size_t)r->n_stop_ids);
    s->id = ++e->next_id;
    s->order = ++e->order;
    s->state = SEQ_WAITING;
    s->t_add = now_s();
    s->priority = r->priority;
    if (!waiting_insert(e, s)) {
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
    /* the draft's K/V: as far as the cached blocks carry it */
    size_t d = 0;
    while (e->has_draft && d < k && e->has_draft[s->blocks[d]])
        d++;
    s->n_draft = d * (size_t)e->bs;
}

/* the running sequence to preempt first: the highest priority value, the
 * youngest among those; -1 when none runs */
static int victim_index(const ts_engine *e) {
    int v = -1;
    for (int i = 0; i < e->n_running; i++) {
        const seq *s = e->running[i], *w = v < 0 ? NULL : e->running[v];
        if (!w || s->priority > w->priority ||
            (s->priority == w->priority && s->order > w->order))
            v = i;
    }
    return v;
}

/* running[i] goes back to waiting, its blocks freed (its tokens kept:
 * recomputed when readmitted, mostly from the cache); returns it */
static seq *preempt_at(ts_engine *e, int i) {
    seq *s = e->running[i];
    list_remove(e->running, &e->n_running, i);
    seq_drop_blocks(e, s);
    s->state = SEQ_WAITING;
    waiting_insert(e, s); /* cannot fail: it held a place in running */
    e->stats.preemptions++;
    return s;
}

static seq *preempt_victim(ts_engine *e) {
    int v = victim_index(e);
    return v < 0 ? NULL : preempt_at(e, v);
}

/* s joins the running sequences, in priority order (prefill chunks are
 * handed out in that order) */
static bool running_insert(ts_engine *e, seq *s) {
    if (!list_push(&e->running, &e->n_running, &e->cap_running, s, false))
        return false;
    int i = e->n_running - 1;
    while (i > 0 && (e->running[i - 1]->priority > s->priority ||
                     (e->running[i - 1]->priority == s->priority &&
                      e->running[i - 1]->order > s->order))) {
        e->running[i] = e->running[i - 1];
        i--;
    }
    e->running[i] = s;
    return true;
}

/* waiting sequences start, best priority first (then first come, first
 * served), while fewer than max_seqs run and fewer than room: each running
 * one may give an output a step, and outputs waiting in pend need their
 * turn in out. When the next one finds no free slot or too few blocks, a
 * running sequence of a lower priority (a higher value) is preempted to
 * make way; among equals the next one waits (no request overtakes an
 * earlier one of its priority). */
static void admit(ts_engine *e, int room) {
    while (e->n_waiting && e->n_running < room) {
        seq *s = e->waiting[0];
        if (e->n_running < e->opt.max_seqs) {
            match_prefix(e, s);
            /* its tokens and the next one (none for an embedding): what
             * check_sizes promised would fit the pool alone */
            int64_t next = s->pooling ? 0 : 1;
            int64_t need = ((int64_t)s->n_tok + next + e->bs - 1) / e->bs -
                           (int64_t)s->n_blocks;
            if (blocks_available(e) >= need && running_insert(e, s)) {
                list_remove(e->waiting, &e->n_waiting, 0);
                s->state = SEQ_RUNNING;
                if (!s->admitted_once) { /* the hit a client sees (usage) */
                    s->cached_tokens = (int64_t)s->n_computed;
                    e->stats.prefix_hit_tokens += s->cached_tokens;
                    e->stats.prompt_tokens += (int64_t)s->n_prompt;
                    s->admitted_once = true;
                    s->queue_s = now_s() - s->t_add;
                }
                continue;
            }
            seq_drop_blocks(e, s);
        }
        int v = victim_index(e);
        if (v < 0 || e->running[v]->priority <= s->priority)
            break; /* wait for room */
        preempt_at(e, v);
    }
}

typedef struct {
    seq *s;
    size_t from, n; /* tokens [from, from + n) of s this step */
    int spec;       /* the last spec of them: proposals (tok[n_tok ..)) */
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

/* the next token of s from its logits row given its first n_seen tokens:
 * logit_bias added and the constraint's mask applied on a copy; -1 when
 * the constraint allows nothing (or the sampler failed) */
static int32_t draw(ts_engine *e, seq *s, const float *row, int64_t V,
                    size_t n_seen) {
    const float *l = row;
    if (s->n_bias || s->con.mask) {
        memcpy(e->row, row, sizeof(float) * (size_t)V);
        for (int i = 0; i < s->n_bias; i++)
            e->row[s->bias[i].token] += s->bias[i].bias;
        if (s->con.mask && !apply_mask(e, s, e->row, V))
            return -1;
        l = e->row;
    }
    return ts_sampler_next(s->sm, l, V, s->tok, n_seen);
}

/* s's distribution from its logits row given its first n_seen tokens
 * (logit_bias added; no constraint: it never speculates) into p[V] */
static ts_status probs(ts_engine *e, seq *s, const float *row, int64_t V,
                       size_t n_seen, float *p) {
    const float *l = row;
    if (s->n_bias) {
        memcpy(e->row, row, sizeof(float) * (size_t)V);
        for (int i = 0; i < s->n_bias; i++)
            e->row[s->bias[i].token] += s->bias[i].bias;
        l = e->row;
    }
    return ts_sampler_probs(s->sm, l, V, s->tok, n_seen, p);
}

static ts_engine_output first_fields(seq *s) {
    ts_engine_output o = {.id = s->id,
                          .cached_tokens = s->cached_tokens,
                          .prompt_tokens = (int64_t)s->n_prompt,
                          .queue_s = s->queue_s,
                          .spec_proposed = s->spec_proposed,
                          .spec_accepted = s->spec_accepted};
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
    int32_t t = draw(e, s, row, V, s->n_tok);
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

/* ---- speculative decoding ---- */

/* room in s->tok for n tokens (proposals live past n_tok) */
static bool reserve_tok(seq *s, size_t n) {
    if (n <= s->cap_tok)
        return true;
    int32_t *p = realloc(s->tok, n * sizeof *p);
    if (!p)
        return false;
    s->tok = p, s->cap_tok = n;
    return true;
}

/* s keeps the blocks of its first n positions; the rest go back */
static void trim_blocks(ts_engine *e, seq *s, size_t n) {
    size_t keep = (n + (size_t)e->bs - 1) / (size_t)e->bs;
    while (s->n_blocks > keep)
        block_release(e, s->blocks[--s->n_blocks]);
}

/* blocks whose every position has the draft's K/V of s's accepted tokens
 * (n_draft of them) are flagged: a sequence that reuses them from the
 * prefix cache need not recompute the draft's */
static void draft_mark(ts_engine *e, const seq *s) {
    for (size_t k = 0; e->has_draft && k < s->n_blocks &&
                       (k + 1) * (size_t)e->bs <= s->n_draft;
         k++)
        e->has_draft[s->blocks[k]] = true;
}

/* prompt lookup: the longest n-gram ending s's tokens (spec_ngram_max
 * down to spec_ngram_min tokens) that occurred earlier in them proposes
 * up to k of the tokens that followed its most recent occurrence, into
 * tok[n_tok ..); their count (0: no match) */
static int ngram_propose(const ts_engine *e, seq *s, int k) {
    const int32_t *t = s->tok;
    int64_t n = (int64_t)s->n_tok;
    int64_t L = e->opt.spec_ngram_max < n - 1 ? e->opt.spec_ngram_max : n - 1;
    for (; L >= e->opt.spec_ngram_min; L--) {
        const int32_t *suffix = t + n - L;
        for (int64_t j = n - L - 1; j >= 0; j--) { /* a token follows it */
            if (t[j] != suffix[0] ||
                memcmp(t + j, suffix, sizeof(int32_t) * (size_t)L))
                continue;
            int64_t m = n - (j + L);
            m = m < k ? m : k;
            memcpy(s->tok + n, t + j + L, sizeof(int32_t) * (size_t)m);
            return (int)m;
        }
    }
    return 0;
}

/* the draft's proposal i (0-based) for s from its logits row, into
 * tok[n_tok + i]: the request's own sampling given the tokens before it
 * (its distribution kept in q for the verification when it samples);
 * false when none could be drawn */
static bool draft_pick(ts_engine *e, seq *s, const float *row, int64_t V,
                       int i) {
    size_t n_seen = s->n_tok + (size_t)i;
    int32_t x;
    if (s->greedy)
        x = draw(e, s, row, V, n_seen);
    else {
        if (!s->q)
            s->q =
                malloc(sizeof(float) * (size_t)e->opt.spec_tokens * (size_t)V);
        float *q = s->q ? s->q + (size_t)i * (size_t)V : NULL;
        x = q && probs(e, s, row, V, n_seen, q) == TS_OK
                ? ts_sampler_draw(s->sm, q, V)
                : -1;
    }
    if (x < 0)
        return false;
    s->tok[n_seen] = x;
    return true;
}

/* a speculating sequence's 1 + spec_k logits rows (its last token's, then
 * each proposal's): proposals accepted by the rule of speculative sampling
 * (greedy: while each is the argmax), then one token drawn after them (at
 * the first rejection from the residual, else the bonus from the last
 * row); each an output, the request ending at the first that finishes it.
 * The sequence rolls back to what was accepted: K/V rows past it are
 * written over later, blocks past it go back, and only accepted full
 * blocks join the prefix cache. */
static void verify_rows(ts_engine *e, seq *s, const float *rows, int64_t V,
                        ts_engine_output *out, int cap, int *n_out) {
    int K = s->spec_k, a = 0;
    size_t base = s->n_tok;
    int32_t y = -1;
    s->spec_k = 0;
    for (int j = 0; j <= K; j++) {
        const float *row = rows + (size_t)j * (size_t)V;
        int32_t x = j < K ? s->tok[base + (size_t)j] : -1;
        if (j == K || s->greedy) {
            y = draw(e, s, row, V, base + (size_t)j);
            if (j < K && y == x) {
                a++;
                continue;
            }
            break;
        }
        bool accepted = false;
        const float *q = e->opt.spec == TS_SPEC_DRAFT
                             ? s->q + (size_t)j * (size_t)V
                             : NULL; /* prompt lookup: a one-hot q */
        y = probs(e, s, row, V, base + (size_t)j, e->p) == TS_OK
                ? ts_sampler_speculate(s->sm, e->p, q, V, x, &accepted)
                : -1;
        if (!accepted)
            break;
        a++;
    }
    if (y >= 0)
        s->tok[base + (size_t)a] = y;
    /* the tokens that go out: up to the first that ends the request */
    int m = a + (y >= 0), n_emit = m;
    ts_finish_reason why = TS_FINISH_NONE;
    for (int j = 0; j < m; j++) {
        int32_t t = s->tok[base + (size_t)j];
        if (is_end(e, s, t))
            why = TS_FINISH_STOP;
        else if (s->n_generated + j + 1 >= s->max_tokens)
            why = TS_FINISH_LENGTH;
        else
            continue;
        n_emit = j + 1;
        break;
    }
    /* nothing could be drawn after the accepted ones: the request ends */
    bool failed = why == TS_FINISH_NONE && y < 0;
    /* accepted: the proposals that go out (not those after an end) */
    int took = a < n_emit ? a : n_emit;
    s->spec_proposed += K, s->spec_accepted += took;
    e->stats.spec_verifications++;
    e->stats.spec_proposed += K, e->stats.spec_accepted += took;
    s->n_tok = base + (size_t)n_emit;
    s->n_computed = base + (size_t)a < s->n_tok ? base + (size_t)a : s->n_tok;
    while ((s->n_inserted + 1) * (size_t)e->bs <= s->n_computed)
        tree_insert(e, s, s->n_inserted);
    if (s->n_draft > s->n_computed)
        s->n_draft = s->n_computed;
    draft_mark(e, s);
    trim_blocks(e, s, s->n_tok);
    for (int j = 0; j < n_emit; j++) {
        ts_engine_output o = first_fields(s);
        o.token = s->tok[base + (size_t)j];
        o.finish = j == n_emit - 1 ? why : TS_FINISH_NONE;
        s->n_generated++;
        e->stats.generated_tokens++;
        if (s->logprobs) /* the model's distribution at that position */
            fill_logprobs(rows + (size_t)j * (size_t)V, V, o.token,
                          s->logprobs - 1, &o);
        emit(e, out, cap, n_out, &o);
    }
    if (failed) {
        ts_engine_output o = first_fields(s);
        o.token = -1;
        o.finish = why = TS_FINISH_ABORT;
        emit(e, out, cap, n_out, &o);
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
    bool ends = x->from + x->n - (size_t)x->spec == s->n_tok;
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
    if (sample && ends) /* the last token's row, then each proposal's */
        for (int j = 0; j <= x->spec; j++) {
            ro->rows[ro->n_rows] = t0 + (int32_t)x->n - 1 - x->spec + j;
            ro->row_pos[ro->n_rows] = (int32_t)s->n_tok - 1 + j;
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

/* speculative tokens for the decoding slices sl[0..n_sl), in order, out
 * of the budget and room (outputs beyond one per sequence): as many as
 * spec_tokens and the request's max_tokens allow (prompt lookup: as many
 * as it finds), written to tok[n_tok ..) by prompt lookup (the draft's
 * come once their blocks are there) */
static void spec_assign(ts_engine *e, slice *sl, int n_sl, int64_t *budget,
                        int64_t room) {
    for (int k = 0; k < n_sl && e->opt.spec != TS_SPEC_NONE; k++) {
        seq *s = sl[k].s;
        int64_t want = e->opt.spec_tokens,
                left = (int64_t)s->max_tokens - s->n_generated - 1;
        want = left < want ? left : want;
        want = *budget < want ? *budget : want;
        want = room < want ? room : want;
        if (!s->spec_ok || want <= 0 ||
            !reserve_tok(s, s->n_tok + (size_t)want + 1))
            continue;
        if (e->opt.spec == TS_SPEC_NGRAM)
            want = ngram_propose(e, s, (int)want);
        sl[k].spec = (int)want;
        *budget -= want, room -= want;
    }
}

/* blocks for the proposals' positions, evicting cached leaves but never
 * preempting: a sequence gets fewer proposals (maybe none) instead */
static void spec_blocks(ts_engine *e, slice *sl, int n_sl) {
    for (int k = 0; k < n_sl; k++) {
        seq *s = sl[k].s;
        size_t end = sl[k].from + sl[k].n + (size_t)sl[k].spec;
        size_t need = (end + (size_t)e->bs - 1) / (size_t)e->bs;
        while (s->n_blocks < need && grow(e, s))
            ;
        if (s->n_blocks < need)
            sl[k].spec =
                (int)(s->n_blocks * (size_t)e->bs - sl[k].from - sl[k].n);
        sl[k].n += (size_t)sl[k].spec;
    }
}

/* decodes first (one token each, and their proposals), then prefill
 * chunks up to the budget; blocks for every position written this step,
 * preempting the youngest sequences when the pool runs short (never for a
 * proposal). false: nothing can make room */
static bool schedule(ts_engine *e, slice *sl, int *n_sl_out,
                     int64_t spec_room) {
    int n_sl = 0;
    int64_t budget = e->opt.max_batch_tokens;
    /* prompt log-probabilities read a logits row per prompt token: at most
     * PLP_STEP_FLOATS of them a step (a long prompt's chunks get smaller) */
    int64_t vocab = ts_decoder_get_config(e->m)->vocab;
    int64_t plp_left =
        PLP_STEP_FLOATS / vocab > 0 ? PLP_STEP_FLOATS / vocab : 1;
    for (int pass = 0; pass < 2; pass++) {
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
            sl[n_sl++] = (slice){s, s->n_computed, n, 0};
            budget -= (int64_t)n;
        }
        if (pass == 0)
            spec_assign(e, sl, n_sl, &budget, spec_room);
    }
    for (int k = 0; k < n_sl; k++) {
        seq *s = sl[k].s;
        size_t need =
            (sl[k].from + sl[k].n + (size_t)e->bs - 1) / (size_t)e->bs;
        while (s->n_blocks < need) {
            if (grow(e, s))
                continue;
            /* out of blocks: the lowest priority's youngest sequence
             * (maybe s) waits */
            seq *victim = e->n_running > 1 ? preempt_victim(e) : NULL;
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
    spec_blocks(e, sl, n_sl);
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
    for (int r = 0; r < ro->n_sample; r++) {
        seq *s = ro->row_seq[r];
        int k = s->spec_k; /* s may be gone after its rows */
        if (k)
            verify_rows(e, s, L + (size_t)r * (size_t)V, V, out, cap, n_out);
        else
            sample_row(e, s, L + (size_t)r * (size_t)V, V, out, cap, n_out);
        r += k;
    }
}

/* ---- compiled steps ----
 * A step's shapes vary with its sequences, so a compiled step is padded to
 * a bucket (vLLM's CUDA graphs by batch size): tokens to a power of two up
 * to 64, then to a multiple of 64; sequences (one more than the step has,
 * for the padding) and block-table width to powers of two; logits rows to a
 * power of two. The padding tokens form one extra sequence whose every
 * block is the pool's scratch block (the one past the engine's blocks,
 * never handed out): they write and read only there, and their rows are
 * never read out. Each bucket's plan is captured once and replayed. */

static int64_t pow2_at_least(int64_t n) {
    int64_t b = 1;
    while (b < n)
        b <<= 1;
    return b;
}

static int64_t bucket_tokens(int64_t n) {
    return n <= 64 ? pow2_at_least(n) : (n + 63) / 64 * 64;
}

/* every weight on the CPU: the plan cache and the padding are the CPU's
 * (a device-placed model runs its steps eagerly) */
static bool all_on_cpu(ts_decoder *m) {
    for (int i = 0; i < ts_decoder_num_params(m); i++)
        if (ts_tensor_device(ts_decoder_param(m, i)).kind != TS_DEVICE_CPU)
            return false;
    return true;
}

/* the step (meta over n_sl sequences with tables max_b wide, N tokens)
 * padded to its bucket and run in the compiled mode: logits of rows
 * [0, n_rows) in *logits ((bucket rows, V); the rows past n_rows are
 * padding) */
static ts_status forward_compiled(ts_engine *e, ts_decoder *m, ts_kv_pool *pool,
                                  const int32_t *meta, int n_sl, int64_t max_b,
                                  int64_t N, const int64_t *ids,
                                  const int32_t *pos, const int32_t *rows,
                                  int64_t n_rows, ts_tensor **logits) {
    ts_ctx *ctx = e->ctx;
    int64_t Nb = bucket_tokens(N), pad = Nb - N;
    int64_t Sb = pow2_at_least(n_sl + 1);
    int64_t need = (pad + e->bs - 1) / e->bs;
    int64_t MBb = pow2_at_least(max_b > need ? max_b : need);
    int64_t Rb = n_rows ? pow2_at_least(n_rows) : 0;
    int32_t scratch = (int32_t)e->n_blocks;
    size_t meta_n = (size_t)(2 + (Sb + 1) + Sb + Sb * MBb);
    int32_t *m2 = malloc(sizeof(int32_t) * meta_n);
    int64_t *ids2 = calloc((size_t)Nb, sizeof *ids2);
    int32_t *pos2 = calloc((size_t)Nb, sizeof *pos2);
    int32_t *rows2 = calloc((size_t)(Rb ? Rb : 1), sizeof *rows2);
    ts_status st = m2 && ids2 && pos2 && rows2
                       ? TS_OK
                       : ts_set_error(ctx, TS_ERR_OOM, "engine: out of memory");
    if (st == TS_OK) {
        const int32_t *start = meta + 2, *clen = start + n_sl + 1,
                      *table = clen + n_sl;
        m2[0] = (int32_t)Sb, m2[1] = (int32_t)MBb;
        int32_t *start2 = m2 + 2, *clen2 = start2 + Sb + 1,
                *table2 = clen2 + Sb;
        for (int64_t i = 0; i <= Sb; i++)
            start2[i] = i <= n_sl ? start[i] : (int32_t)Nb;
        for (int64_t i = 0; i < Sb; i++) {
            clen2[i] = i < n_sl ? clen[i] : 0;
            for (int64_t b = 0; b < MBb; b++)
                table2[i * MBb + b] = i >= n_sl   ? scratch
                                      : b < max_b ? table[i * max_b + b]
                                                  : 0;
        }
        memcpy(ids2, ids, sizeof *ids2 * (size_t)N);
        memcpy(pos2, pos, sizeof *pos2 * (size_t)N);
        if (n_rows)
            memcpy(rows2, rows, sizeof *rows2 * (size_t)n_rows);
    }
    if (st == TS_OK) {
        ts_compile_stats c0, c1;
        ts_get_compile_stats(ctx, &c0);
        ts_mode mode = ts_set_mode(ctx, TS_MODE_COMPILED);
        int64_t ishape[2] = {1, Nb}, mshape[1] = {(int64_t)meta_n};
        ts_tensor *in = ts_from_data(ctx, TS_I64, 2, ishape, ids2);
        ts_tensor *mt = ts_from_data(ctx, TS_I32, 1, mshape, m2);
        st = in && mt
                 ? ts_decoder_forward_paged_ex(m, pool, in, pos2, mt, rows2, Rb,
                                               NULL, 0, logits, NULL)
                 : ts_ctx_status(ctx);
        ts_release(in), ts_release(mt);
        if (st == TS_OK)
            st = ts_sync(ctx);
        ts_set_mode(ctx, mode);
        ts_get_compile_stats(ctx, &c1);
        e->stats.compiled_plans += (int64_t)(c1.compilations - c0.compilations);
        e->stats.compiled_replays += (int64_t)(c1.cache_hits - c0.cache_hits);
    }
    free(m2), free(ids2), free(pos2), free(rows2);
    return st;
}

/* one pass of model m over its pool (the target's, or the draft's) for
 * the slices: their K/V written, the logits at rows[] and the final
 * hidden states at hrows[] read out; compiled (forward_compiled) when
 * asked, else eager */
static ts_status model_pass(ts_engine *e, bool draft, bool compiled,
                            const slice *sl, int n_sl, const int32_t *rows,
                            int n_rows, const int32_t *hrows, int n_h,
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
    ts_status st = meta && pos && ids
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
        bool old = ts_set_grad_enabled(ctx, false);
        if (compiled) {
            st = forward_compiled(e, draft ? e->draft : e->m,
                                  draft ? e->dpool : e->pool, meta, n_sl, max_b,
                                  (int64_t)N, ids, pos, rows, n_rows, logits);
        } else {
            ts_mode mode = ts_set_mode(ctx, TS_MODE_EAGER);
            int64_t ishape[2] = {1, (int64_t)N}, mshape[1] = {(int64_t)meta_n};
            ts_tensor *in = ts_from_data(ctx, TS_I64, 2, ishape, ids);
            ts_tensor *mt = ts_from_data(ctx, TS_I32, 1, mshape, meta);
            st = in && mt
                     ? ts_decoder_forward_paged_ex(draft ? e->draft : e->m,
                                                   draft ? e->dpool : e->pool,
                                                   in, pos, mt, rows, n_rows,
                                                   hrows, n_h, logits, hidden)
                     : ts_ctx_status(ctx);
            ts_set_mode(ctx, mode);
            ts_release(in), ts_release(mt);
        }
        ts_set_grad_enabled(ctx, old);
    }
    free(meta), free(pos), free(ids);
    return st;
}

/* the one forward pass of the model over the slices: K/V written, rows
 * read out */
static ts_status forward(ts_engine *e, const slice *sl, int n_sl, readout *ro,
                         ts_tensor **logits, ts_tensor **hidden) {
    size_t N = 0;
    for (int k = 0; k < n_sl; k++)
        N += sl[k].n;
    const ts_model_config *c = ts_decoder_get_config(e->m);
    if (!readout_new(ro, n_sl, N, c->hidden))
        return ts_set_error(e->ctx, TS_ERR_OOM, "engine: out of memory");
    for (int pass = 0; pass < 2; pass++) { /* sampling rows first */
        int32_t t0 = 0;
        for (int k = 0; k < n_sl; k++) {
            plan_rows(ro, &sl[k], t0, pass == 0);
            t0 += (int32_t)sl[k].n;
        }
        if (pass == 0)
            ro->n_sample = ro->n_rows;
    }
    /* compiled unless asked not to; steps that read prompt rows or
     * hidden states (prompt logprobs, embeddings) run eagerly: their
     * row counts vary too much to bucket */
    bool compiled = e->compiled && !ro->n_h && ro->n_rows == ro->n_sample;
    ts_status st = model_pass(e, false, compiled, sl, n_sl, ro->rows,
                              ro->n_rows, ro->hrows, ro->n_h, logits, hidden);
    if (st == TS_OK) {
        e->stats.steps++;
        e->stats.batch_tokens += (int64_t)N;
    }
    return st;
}

/* one draft pass over ds[0..n): the logits of the last row of each of the
 * first n_read slices give s's proposal i. A proposal that cannot be drawn
 * ends its slice's (sl's) proposals there */
static ts_status draft_pass(ts_engine *e, const slice *ds, int n, int n_read,
                            slice *sl, const int *of, int i) {
    int32_t *rows = calloc((size_t)(n_read ? n_read : 1), sizeof(int32_t));
    if (!rows)
        return ts_set_error(e->ctx, TS_ERR_OOM, "engine: out of memory");
    int32_t t0 = 0;
    for (int k = 0; k < n; k++) {
        t0 += (int32_t)ds[k].n;
        if (k < n_read)
            rows[k] = t0 - 1;
    }
    ts_tensor *logits = NULL, *hl = NULL;
    ts_status st = model_pass(e, true, e->compiled_draft, ds, n, rows, n_read,
                              NULL, 0, &logits, NULL);
    const float *L = st == TS_OK && n_read ? host_rows(logits, &hl) : NULL;
    if (st == TS_OK && n_read && !L)
        st = ts_ctx_status(e->ctx) ? ts_ctx_status(e->ctx) : TS_ERR_STATE;
    for (int k = 0; k < n && st == TS_OK; k++) {
        seq *s = ds[k].s;
        s->n_draft = ds[k].from + ds[k].n;
        if (k >= n_read)
            continue;
        int64_t V = ts_tensor_dim(hl, 1);
        slice *x = &sl[of[k]];
        if (!draft_pick(e, s, L + (size_t)k * (size_t)V, V, i)) {
            x->n -= (size_t)(x->spec - i); /* the proposals so far */
            x->spec = i;
            trim_blocks(e, s, x->from + x->n);
        }
    }
    ts_release(hl), ts_release(logits);
    free(rows);
    return st;
}

/* the draft model's proposals, batched over the speculating slices before
 * the target's pass. Pass 0 catches the draft's K/V up with the target's
 * tokens (what it lacks of the prompt, of blocks reused from the cache and
 * of accepted tokens; at most max_batch_tokens, speculating slices first)
 * and reads each speculating sequence's first proposal off its last
 * token's row; pass i feeds proposal i for the next one. A sequence whose
 * catch-up does not fit this step proposes nothing; every sequence that
 * may speculate keeps up with its prefill this way. */
static ts_status draft_propose(ts_engine *e, slice *sl, int n_sl) {
    slice *ds = malloc(sizeof *ds * (size_t)n_sl);
    int *of = malloc(sizeof(int) * (size_t)n_sl);
    if (!ds || !of) {
        free(ds), free(of);
        return ts_set_error(e->ctx, TS_ERR_OOM, "engine: out of memory");
    }
    int64_t budget = e->opt.max_batch_tokens;
    int n_ds = 0, n_read = 0, max_spec = 0;
    for (int k = 0; k < n_sl; k++) /* a failed step may have left more */
        if (sl[k].s->n_draft > sl[k].s->n_computed)
            sl[k].s->n_draft = sl[k].s->n_computed;
    for (int want = 1; want >= 0; want--)
        for (int k = 0; k < n_sl; k++) {
            seq *s = sl[k].s;
            if (!s->spec_ok || (sl[k].spec > 0) != (want == 1))
                continue;
            /* one that will never speculate (max_tokens) needs no draft */
            if (!sl[k].spec && s->max_tokens - s->n_generated < 3)
                continue;
            /* through the last token for a speculating slice, else
             * through what the target computes this step */
            size_t end = sl[k].from + sl[k].n - (size_t)sl[k].spec;
            /* (a slice cut to no proposals below comes round again with
             * want 0 only once the budget is spent: it is skipped then) */
            if (s->n_draft >= end || budget <= 0) {
                if (want && budget <= 0) { /* no room to catch up */
                    sl[k].n -= (size_t)sl[k].spec, sl[k].spec = 0;
                    trim_blocks(e, s, sl[k].from + sl[k].n);
                }
                continue;
            }
            size_t m = end - s->n_draft;
            if ((int64_t)m > budget) {
                m = (size_t)budget;
                if (want) { /* it catches up now, proposes later */
                    sl[k].n -= (size_t)sl[k].spec, sl[k].spec = 0;
                    trim_blocks(e, s, sl[k].from + sl[k].n);
                }
            }
            if (sl[k].spec > 0) { /* read rows: the first n_read */
                of[n_read] = k;
                ds[n_ds] = ds[n_read];
                ds[n_read++] = (slice){s, s->n_draft, m, 0};
                max_spec = sl[k].spec > max_spec ? sl[k].spec : max_spec;
            } else
                ds[n_ds] = (slice){s, s->n_draft, m, 0};
            n_ds++;
            budget -= (int64_t)m;
        }
    ts_status st = n_ds ? draft_pass(e, ds, n_ds, n_read, sl, of, 0) : TS_OK;
    for (int k = 0; k < n_ds; k++)
        draft_mark(e, ds[k].s); /* catch-up: accepted tokens only */
    for (int i = 1; i < max_spec && st == TS_OK; i++) {
        int n = 0;
        for (int k = 0; k < n_sl; k++)
            if (sl[k].spec > i) {
                seq *s = sl[k].s;
                of[n] = k;
                ds[n++] = (slice){s, s->n_tok + (size_t)i - 1, 1, 0};
            }
        st = n ? draft_pass(e, ds, n, n, sl, of, i) : TS_OK;
    }
    free(ds), free(of);
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
    if (!schedule(e, sl, &n_sl, (int64_t)cap - e->n_running)) {
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
    ts_status st = e->draft ? draft_propose(e, sl, n_sl) : TS_OK;
    for (int k = 0; k < n_sl; k++)
        sl[k].s->spec_k = sl[k].spec;
    if (st == TS_OK)
        st = forward(e, sl, n_sl, &ro, &logits, &hidden);
    if (st == TS_OK) {
        for (int k = 0; k < n_sl; k++) {
            seq *s = sl[k].s;
            /* a speculating sequence's proposals count once accepted */
            s->n_computed += sl[k].n - (size_t)sl[k].spec;
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
