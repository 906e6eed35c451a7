/* policy.h — how the router chooses a server: the cached-block set it
 * keeps per server, the prompt's block hashes, the scorers and the
 * policies. Pure functions (no I/O, no locks), unit-tested in
 * tests/test_router.c. */
#ifndef TS_ROUTER_POLICY_H
#define TS_ROUTER_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- a set of block hashes, each with a stamp (a tick or a time) ---- */
typedef struct {
    uint64_t *keys, *stamps; /* key 0: empty (a block hash of 0 is mapped
                                to 1, a collision the router can afford) */
    size_t cap, n;
} ts_block_set;

void ts_block_set_init(ts_block_set *s);
void ts_block_set_free(ts_block_set *s);
void ts_block_set_clear(ts_block_set *s);
bool ts_block_set_put(ts_block_set *s, uint64_t h, uint64_t stamp);
bool ts_block_set_del(ts_block_set *s, uint64_t h);
/* the stamp of h, 0 when absent */
uint64_t ts_block_set_get(const ts_block_set *s, uint64_t h);
/* removes the entries with the oldest stamps until at most keep remain */
void ts_block_set_trim(ts_block_set *s, size_t keep);
/* removes the entries stamped before `before` */
void ts_block_set_expire(ts_block_set *s, uint64_t before);

/* The chained hashes of the prompt's full blocks that the engine looks up
 * (the first (n - 1) / block_size), as ts_block_hash; malloc'd, *n_blocks
 * their count. */
uint64_t *ts_prompt_block_hashes(const int32_t *ids, size_t n,
                                 int64_t block_size, size_t *n_blocks);
/* how many leading hashes are in a (or, with b non-NULL, stamped in b at
 * or after b_since) */
size_t ts_prefix_hits(const ts_block_set *a, const ts_block_set *b,
                      uint64_t b_since, const uint64_t *hashes, size_t n);

/* ---- scorers, each in 0..1, higher is better ---- */
double ts_score_prefix(size_t hit_blocks, size_t n_blocks);
double ts_score_queue(int64_t q, int64_t q_min, int64_t q_max);
double ts_score_kv(int64_t used, int64_t total);

typedef enum {
    TS_POLICY_CACHE_AWARE,
    TS_POLICY_LOAD,
    TS_POLICY_ROUND_ROBIN,
    TS_POLICY_RANDOM
} ts_route_policy;
/* "cache-aware", "load", "round-robin", "random"; -1 when unknown */
int ts_route_policy_parse(const char *s);
const char *ts_route_policy_name(ts_route_policy p);

typedef struct {
    double prefix, queue, kv;
} ts_route_weights;
/* "prefix=2,queue=1,kv=1" (any subset, each >= 0) over *w; false with
 * *bad the offending part */
bool ts_route_weights_parse(const char *s, ts_route_weights *w,
                            const char **bad);

typedef struct {
    bool eligible; /* healthy and not yet tried */
    size_t hit_blocks;
    int64_t queue; /* waiting + running */
    int64_t kv_used, kv_total;
} ts_route_candidate;

typedef enum {
    TS_REASON_PREFIX,
    TS_REASON_LOAD,
    TS_REASON_ROUND_ROBIN,
    TS_REASON_RANDOM,
    TS_REASON_ONLY,
    TS_REASON_RETRY,
    TS_REASON_N
} ts_route_reason;
const char *ts_route_reason_name(ts_route_reason r);

typedef struct {
    ts_route_policy policy;
    ts_route_weights w;
    uint64_t rng; /* xorshift state (seeded, never 0) */
    uint64_t rr;  /* round-robin position */
} ts_route_state;

/* The eligible candidate to use, or -1 when none; *why the reason;
 * scores[n] (may be NULL) the weighted scores. */
int ts_route_pick(ts_route_state *st, const ts_route_candidate *c, int n,
                  size_t n_blocks, ts_route_reason *why, double *scores);

#endif
