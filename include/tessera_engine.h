/* tessera_engine.h — generation and serving: the sampler (temperature,
 * top-k, top-p, min-p, repetition penalty, seeded) that turns a row of
 * logits into the next token, and the engine: continuous batching over a
 * paged KV cache with radix-tree prefix reuse (src/engine/engine.c). */
#ifndef TESSERA_ENGINE_H
#define TESSERA_ENGINE_H

#include "tessera.h"
#include "tessera_models.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double temperature;        /* 0: greedy */
    int64_t top_k;             /* 0: off */
    double top_p;              /* 1: off */
    double min_p;              /* 0: off; keep p >= min_p x p(best) */
    double repetition_penalty; /* 1: off; as Hugging Face's (divide
                                  positive logits of seen tokens, multiply
                                  negative ones) */
    uint64_t seed;
    /* OpenAI's, over the generated tokens (after the prompt, see
     * ts_sampler_set_prompt_len): logit -= presence (once per distinct
     * token) + frequency x count. 0: off; each in -2..2 */
    double presence_penalty, frequency_penalty;
} ts_sampling;

/* Defaults: greedy, no filtering, seed 0. */
ts_sampling ts_sampling_default(void);
/* Checks the ranges; the message names the parameter. */
ts_status ts_sampling_check(ts_ctx *ctx, const ts_sampling *s);

typedef struct ts_sampler ts_sampler;
ts_status ts_sampler_new(ts_ctx *ctx, const ts_sampling *s, ts_sampler **out);
void ts_sampler_free(ts_sampler *sm);
/* The next token from logits[V] (f32); seen[0..n_seen) are the tokens so
 * far (for the repetition penalty). logits is not modified. */
int32_t ts_sampler_next(ts_sampler *sm, const float *logits, int64_t V,
                        const int32_t *seen, size_t n_seen);
/* seen[0..n) is the prompt: presence and frequency penalties skip it */
void ts_sampler_set_prompt_len(ts_sampler *sm, size_t n);
/* The distribution ts_sampler_next draws from, into p[V]: the same
 * penalties, temperature and filters (filtered-out tokens 0, the rest
 * summing to 1; greedy: 1 at the argmax). Draws nothing. */
ts_status ts_sampler_probs(ts_sampler *sm, const float *logits, int64_t V,
                           const int32_t *seen, size_t n_seen, float *p);
/* A token drawn from weights p[V] >= 0 (normalized by their sum) with sm's
 * generator; -1 when none has weight. */
int32_t ts_sampler_draw(ts_sampler *sm, const float *p, int64_t V);
/* Speculative sampling's rule (Leviathan et al. 2023, Chen et al. 2023):
 * token x was proposed with probability q[x] (q NULL: proposed
 * deterministically, a one-hot q) and p is the target's distribution
 * (ts_sampler_probs). With sm's generator: accepts x with probability
 * min(1, p[x] / q[x]) (*accepted true, x returned), else returns a draw
 * from normalize(max(0, p - q)). The token emitted is then distributed as
 * p, whatever q. -1 on a bad argument. */
int32_t ts_sampler_speculate(ts_sampler *sm, const float *p, const float *q,
                             int64_t V, int32_t x, bool *accepted);

/* ---- the engine ---------------------------------------------------------- */

/* speculative decoding's proposer (ts_engine_options.spec) */
typedef enum {
    TS_SPEC_NONE = 0, /* none */
    TS_SPEC_NGRAM,    /* prompt lookup (vLLM's "ngram") */
    TS_SPEC_DRAFT     /* a small draft model */
} ts_spec_method;

/* the KV cache's element type (ts_engine_options.kv_dtype): ts_kv_dtype,
 * in tessera_models.h beside the KV pool that stores it */

typedef struct {
    int64_t block_size;       /* positions per KV block (16) */
    int64_t n_blocks;         /* KV blocks in the pool; 0: from kv_memory */
    int64_t kv_memory;        /* bytes for the pool when n_blocks is 0 (0:
                                 512 blocks) */
    int max_seqs;             /* running sequences at most (16) */
    int64_t max_batch_tokens; /* tokens per forward pass at most (512) */
    bool no_prefix_cache;     /* do not reuse cached prefixes */
    /* the KV cache's element type (bf16 by default). Pools placed on a
     * device other than the CPU stay f32 (stats.kv_dtype says which) */
    ts_kv_dtype kv_dtype;
    /* model steps run eagerly; by default they go through the compiled
     * mode, one plan per (batch-size bucket, chunk-size bucket), captured
     * once and replayed (vLLM's --enforce-eager turns its graphs off) */
    bool enforce_eager;
    /* speculative decoding: spec_tokens tokens proposed a step per
     * sequence (1..16, 0: 4), verified in one forward pass of the model
     * by the exact rule of speculative sampling (greedy output is the
     * same as without it; sampled output has the same distribution).
     * Requests with a constraint, prompt_logprobs or pooling decode
     * without it (logprobs ones speculate: their values come from the
     * verifying rows). A sequence's proposals are cut short, down to none,
     * by max_tokens, the step's max_batch_tokens, free KV blocks (no one is
     * preempted for them) and the room in ts_engine_step's out. */
    ts_spec_method spec;
    int spec_tokens;
    /* prompt lookup: the longest n-gram ending the sequence (spec_ngram_max
     * down to spec_ngram_min tokens; 0: 4 and 1) found earlier in its
     * prompt or output proposes the tokens that followed it */
    int spec_ngram_min, spec_ngram_max;
    /* TS_SPEC_DRAFT: the draft model (same vocabulary as the target, a
     * context at least as long); the engine keeps a KV pool for it (as
     * many blocks as the target's, on top of kv_memory) and does not free
     * it. It proposes with the request's own sampling parameters. */
    ts_decoder *spec_draft;
} ts_engine_options;
ts_engine_options ts_engine_options_default(void);

/* A constraint on what a sequence may generate (a structured-output
 * grammar's matcher, tessera_grammar.h): the engine asks for the mask of
 * allowed tokens before each draw (the bits come zeroed), bans the rest,
 * and reports the drawn token (end-of-sequence and stop ids are never
 * reported: they are allowed exactly when can_end says so, whatever the
 * mask). The engine owns state once ts_engine_add succeeds and calls free
 * (may be NULL) exactly once when the request ends (finished, aborted, or
 * the engine freed); when ts_engine_add fails the caller still owns it.
 * A preempted request keeps its state: the tokens it already generated
 * are recomputed, not reported again. mask, accept, can_end and done are
 * all required. */
typedef struct {
    void *state;
    /* bits[(n_tokens + 31) / 32]: set the bit of every token allowed next */
    void (*mask)(void *state, uint32_t *bits);
    /* t was drawn; false: it was not allowed (the request then ends) */
    bool (*accept)(void *state, int32_t t);
    /* the output so far is complete: end-of-sequence tokens are allowed */
    bool (*can_end)(const void *state);
    /* complete and nothing may follow: the request ends (TS_FINISH_STOP) */
    bool (*done)(const void *state);
    void (*free)(void *state);
    /* the tokens mask writes bits for (its tokenizer's vocabulary); 0: the
     * model's. More than the model has is refused */
    int64_t n_tokens;
} ts_constraint;

/* OpenAI's logit_bias: added to a token's logit before sampling; -100
 * bans it, +100 all but forces it. */
typedef struct {
    int32_t token;
    float bias; /* -100..100 */
} ts_logit_bias;
#define TS_ENGINE_MAX_LOGIT_BIAS 300

typedef enum {
    TS_POOL_NONE = 0, /* a generation request */
    TS_POOL_LAST,     /* embedding: the last token's final hidden state */
    TS_POOL_MEAN      /* embedding: the mean over the prompt's tokens */
} ts_pooling;

#define TS_ENGINE_MAX_STOP_IDS 16
typedef struct {
    const int32_t *prompt; /* token ids, copied */
    size_t n_prompt;
    int max_tokens;
    ts_sampling sampling;
    int32_t stop_ids[TS_ENGINE_MAX_STOP_IDS]; /* end the output too */
    int n_stop_ids;
    bool ignore_eos;
    int logprobs; /* 0: none; 1 + N: the chosen token's log-probability
                     and the N most likely (N <= TS_ENGINE_MAX_TOP) */
    /* echo: the log-probabilities of the prompt's tokens too (each given
     * the ones before it; as many of the most likely as logprobs asks),
     * in the first output's prompt_lp */
    bool prompt_logprobs;
    const ts_logit_bias *logit_bias; /* copied; NULL: none */
    int n_logit_bias;
    ts_constraint constraint; /* mask NULL: none */
    /* != NONE: an embedding request; its one output carries the pooled,
     * L2-normalized final hidden state (max_tokens, sampling, logprobs,
     * prompt_logprobs and logit_bias unused). It computes its whole
     * prompt (no prefix reuse), batched with everything else. */
    ts_pooling pooling;
    /* scheduling priority, as vLLM's: lower runs first; among equals,
     * first come first served. When KV blocks run out, the sequence with
     * the highest value (the youngest among those) is preempted. */
    int priority;
} ts_request;
#define TS_ENGINE_MAX_TOP 20

typedef enum {
    TS_FINISH_NONE = 0,
    TS_FINISH_STOP,   /* an end-of-sequence or stop token (included) */
    TS_FINISH_LENGTH, /* max_tokens */
    TS_FINISH_ABORT,
    TS_FINISH_CONSTRAINT /* the constraint refused the drawn token (or
                            allowed none): token -1, nothing drawn */
} ts_finish_reason;

/* One generated token of one request (a step gives one per sequence that
 * reached the end of its known tokens). A constrained request whose
 * constraint is done gives its last token (finish NONE) and then an output
 * with token -1 and finish STOP: in the same step when out has room,
 * else first in the next step. An embedding request's one output has
 * token -1 and finish STOP. */
typedef struct ts_engine_output_s {
    int64_t id;
    int32_t token;
    ts_finish_reason finish; /* != NONE: the request is done and gone */
    int64_t cached_tokens;   /* prompt tokens reused from the cache */
    int64_t prompt_tokens;
    /* with logprobs: log-softmax of the model's logits (before sampling's
     * temperature and filters) for the token and the n_top most likely */
    float logprob;
    int n_top;
    int32_t top_ids[TS_ENGINE_MAX_TOP];
    float top_logprobs[TS_ENGINE_MAX_TOP];
    /* the first output of a prompt_logprobs request: one entry per prompt
     * token from the second on (token, logprob, n_top, top_*), malloc'd,
     * the receiver frees it; NULL otherwise (and for a one-token prompt).
     * Such a request computes its whole prompt (no prefix reuse). */
    struct ts_engine_output_s *prompt_lp;
    size_t n_prompt_lp;
    /* an embedding request's output (finish STOP): dim floats, malloc'd,
     * the receiver frees it */
    float *embedding;
    int64_t dim;
    /* seconds from ts_engine_add to the request's first scheduling */
    double queue_s;
    /* speculative decoding so far for this request: tokens proposed and
     * tokens of those accepted */
    int64_t spec_proposed, spec_accepted;
} ts_engine_output;

/* KV events: a block entered or left the prefix cache. hash chains from
 * the parent's: ts_block_hash(parent_hash, tokens, block_size), 0 for the
 * first block, so a router computes the same hashes from token ids. */
#define TS_KV_EVENT_MAX_TOKENS 64
typedef enum { TS_KV_BLOCK_STORED = 1, TS_KV_BLOCK_REMOVED } ts_kv_event_kind;
typedef struct {
    uint64_t seq; /* 1, 2, ... in the order they happened */
    ts_kv_event_kind kind;
    uint64_t hash, parent_hash;
    int32_t block_size;
    int32_t tokens[TS_KV_EVENT_MAX_TOKENS]; /* stored: the block's tokens
                                               (the first 64) */
} ts_kv_event;
uint64_t ts_block_hash(uint64_t parent_hash, const int32_t *tokens, int64_t n);

typedef struct {
    int running, waiting;
    int64_t blocks_total, blocks_used, blocks_free, cached_blocks;
    int64_t blocks_in_sequences; /* held by requests (not only cached) */
    int64_t evicted_blocks, preemptions, aborted;
    int64_t prompt_tokens, prefix_hit_tokens, generated_tokens;
    int64_t steps, batch_tokens;
    /* requests ended, by finish reason (vLLM's finished-reason metric;
     * finished_abort counts ts_engine_abort's too) */
    int64_t finished_stop, finished_length, finished_abort, finished_constraint;
    int64_t embeddings; /* embedding requests answered */
    /* speculative decoding: verification passes per sequence (each emits
     * 1 + its accepted tokens), tokens proposed, tokens accepted */
    int64_t spec_verifications, spec_proposed, spec_accepted;
    /* the KV cache: its element type (kv_dtype's) and bytes per block */
    ts_kv_dtype kv_dtype;
    int64_t kv_block_bytes;
    /* compiled model steps: plans captured (one per bucket) and steps
     * that replayed one */
    int64_t compiled_plans, compiled_replays;
} ts_engine_stats;

typedef struct ts_engine ts_engine;
/* The engine serves one decoder (any family); its KV pool is
 * allocated here, beside each layer. */
ts_status ts_engine_new(ts_ctx *ctx, ts_decoder *m,
                        const ts_engine_options *opt, ts_engine **out);
void ts_engine_free(ts_engine *e);
/* end-of-sequence ids (generation_config's), unless a request ignores them */
void ts_engine_set_eos(ts_engine *e, const int32_t *ids, int n);
/* Queues a request; *id names it in outputs. A bad request (empty prompt,
 * tokens outside the vocabulary, too long for the context or the pool,
 * bad sampling) is an error naming the parameter; nothing changes. */
ts_status ts_engine_add(ts_engine *e, const ts_request *r, int64_t *id);
/* Drops a request (a client gone): its blocks are released. */
ts_status ts_engine_abort(ts_engine *e, int64_t id);
/* One scheduling step and one forward pass; out (cap >= max_seqs; a
 * smaller cap also bounds how many sequences run at once) gets a token per
 * sequence that produced one, then the final outputs that did not fit (a
 * constraint's STOP after its last token among them); those that still do
 * not fit go out in a later step, and no sequence starts while they wait.
 * With speculative decoding a sequence gives its accepted tokens and the
 * one drawn after them, one output each, in order (the request ends at
 * the first that finishes it); the room in out beyond one per running
 * sequence bounds a step's proposals (cap >= max_seqs x (1 + spec_tokens)
 * never cuts them).
 * Outputs' prompt_lp and embedding are the receiver's to free. */
ts_status ts_engine_step(ts_engine *e, ts_engine_output *out, int cap,
                         int *n_out);
bool ts_engine_has_work(const ts_engine *e);
void ts_engine_get_stats(const ts_engine *e, ts_engine_stats *out);
/* The blocks the prefix cache holds now (a snapshot for a router that
 * joins late): up to cap hashes and their parents' hashes; the count. */
size_t ts_engine_cached_blocks(const ts_engine *e, uint64_t *hashes,
                               uint64_t *parents, size_t cap);
/* Moves up to cap pending KV events into out, oldest first. */
size_t ts_engine_drain_events(ts_engine *e, ts_kv_event *out, size_t cap);

/* ---- KV transfer (prefill on one server, decode on another) ----
 * A block travels as its tokens and ts_engine_block_bytes of K and V (per
 * layer K then V, in the pool's type (stats.kv_dtype), as
 * ts_kv_pool_read_block gives them). */
int64_t ts_engine_block_size(const ts_engine *e);
int64_t ts_engine_block_bytes(const ts_engine *e);
/* Copies the K/V of the longest cached run of tokens' full blocks (at most
 * max_blocks) into buf, block after block; returns how many. */
size_t ts_engine_export_prefix(ts_engine *e, const int32_t *tokens,
                               size_t n_tokens, void *buf, size_t max_blocks);
/* Adopts n_blocks full blocks (tokens[0 .. n_blocks x block_size), their
 * K/V in buf) into the prefix cache, as if this engine had computed them;
 * blocks already cached are kept (and touched). Stops early when the pool
 * has no room; *adopted counts the new blocks. A request with this prefix
 * then starts after it. */
ts_status ts_engine_import_prefix(ts_engine *e, const int32_t *tokens,
                                  size_t n_blocks, const void *buf,
                                  size_t *adopted);

#ifdef __cplusplus
}
#endif
#endif
