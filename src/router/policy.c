/* policy.c — the router's block sets, scorers and policies (policy.h). */
#include "policy.h"

#include "tessera_engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the block set: open addressing, linear probing ---- */

void ts_block_set_init(ts_block_set *s) {
    memset(s, 0, sizeof *s);
}

void ts_block_set_free(ts_block_set *s) {
    free(s->keys), free(s->stamps);
    ts_block_set_init(s);
}

void ts_block_set_clear(ts_block_set *s) {
    if (s->cap) {
        memset(s->keys, 0, sizeof *s->keys * s->cap);
        memset(s->stamps, 0, sizeof *s->stamps * s->cap);
    }
    s->n = 0;
}

static size_t slot(const ts_block_set *s, uint64_t h) {
    size_t i = (size_t)(h * 0x9e3779b97f4a7c15ull >> 20) & (s->cap - 1);
    while (s->keys[i] && s->keys[i] != h)
        i = (i + 1) & (s->cap - 1);
    return i;
}

static bool grow(ts_block_set *s) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    ts_block_set t = {calloc(cap, sizeof(uint64_t)),
                      calloc(cap, sizeof(uint64_t)), cap, 0};
    if (!t.keys || !t.stamps) {
        free(t.keys), free(t.stamps);
        return false;
    }
    for (size_t i = 0; i < s->cap; i++)
        if (s->keys[i]) {
            size_t j = slot(&t, s->keys[i]);
            t.keys[j] = s->keys[i], t.stamps[j] = s->stamps[i];
            t.n++;
        }
    free(s->keys), free(s->stamps);
    *s = t;
    return true;
}

bool ts_block_set_put(ts_block_set *s, uint64_t h, uint64_t stamp) {
    h = h ? h : 1;
    if (2 * (s->n + 1) > s->cap && !grow(s))
        return false;
    size_t i = slot(s, h);
    if (!s->keys[i])
        s->keys[i] = h, s->n++;
    s->stamps[i] = stamp;
    return true;
}

uint64_t ts_block_set_get(const ts_block_set *s, uint64_t h) {
    h = h ? h : 1;
    if (!s->cap)
        return 0;
    size_t i = slot(s, h);
    return s->keys[i] ? s->stamps[i] : 0;
}

static void remove_at(ts_block_set *s, size_t i) {
    s->keys[i] = 0, s->stamps[i] = 0;
    s->n--;
    /* re-place the cluster after the hole */
    for (size_t j = (i + 1) & (s->cap - 1); s->keys[j];
         j = (j + 1) & (s->cap - 1)) {
        uint64_t k = s->keys[j], st = s->stamps[j];
        s->keys[j] = 0, s->stamps[j] = 0;
        size_t to = slot(s, k);
        s->keys[to] = k, s->stamps[to] = st;
    }
}

bool ts_block_set_del(ts_block_set *s, uint64_t h) {
    h = h ? h : 1;
    if (!s->cap)
        return false;
    size_t i = slot(s, h);
    if (!s->keys[i])
        return false;
    remove_at(s, i);
    return true;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

void ts_block_set_expire(ts_block_set *s, uint64_t before) {
    for (size_t i = 0; i < s->cap;)
        if (s->keys[i] && s->stamps[i] < before)
            remove_at(s, i); /* slot i may hold a moved entry: look again */
        else
            i++;
}

void ts_block_set_trim(ts_block_set *s, size_t keep) {
    if (s->n <= keep)
        return;
    uint64_t *st = malloc(sizeof *st * s->n);
    if (!st) {
        ts_block_set_clear(s);
        return;
    }
    size_t m = 0;
    for (size_t i = 0; i < s->cap; i++)
        if (s->keys[i])
            st[m++] = s->stamps[i];
    qsort(st, m, sizeof *st, cmp_u64);
    uint64_t cut = st[m - keep - 1] + 1; /* drop stamps below cut */
    free(st);
    ts_block_set_expire(s, cut);
}

/* ---- prompts ---- */

uint64_t *ts_prompt_block_hashes(const int32_t *ids, size_t n,
                                 int64_t block_size, size_t *n_blocks) {
    size_t nb = n && block_size > 0 ? (n - 1) / (size_t)block_size : 0;
    uint64_t *h = malloc(sizeof *h * (nb ? nb : 1));
    *n_blocks = h ? nb : 0;
    uint64_t parent = 0;
    for (size_t k = 0; h && k < nb; k++)
        h[k] = parent =
            ts_block_hash(parent, ids + k * (size_t)block_size, block_size);
    return h;
}

size_t ts_prefix_hits(const ts_block_set *a, const ts_block_set *b,
                      uint64_t b_since, const uint64_t *hashes, size_t n) {
    size_t k = 0;
    while (k < n && (ts_block_set_get(a, hashes[k]) ||
                     (b && ts_block_set_get(b, hashes[k]) >= b_since &&
                      ts_block_set_get(b, hashes[k]))))
        k++;
    return k;
}

/* ---- scorers ---- */

double ts_score_prefix(size_t hit_blocks, size_t n_blocks) {
    if (!n_blocks)
        return 0;
    return (double)(hit_blocks < n_blocks ? hit_blocks : n_blocks) /
           (double)n_blocks;
}

double ts_score_queue(int64_t q, int64_t q_min, int64_t q_max) {
    if (q_max <= q_min)
        return 1;
    if (q <= q_min)
        return 1;
    if (q >= q_max)
        return 0;
    return (double)(q_max - q) / (double)(q_max - q_min);
}

double ts_score_kv(int64_t used, int64_t total) {
    if (total <= 0)
        return 1;
    double f = (double)used / (double)total;
    return f < 0 ? 1 : f > 1 ? 0 : 1 - f;
}

/* ---- policies ---- */

static const char *const POLICY[] = {"cache-aware", "load", "round-robin",
                                     "random"};
static const char *const REASON[TS_REASON_N] = {"prefix", "load", "round_robin",
                                                "random", "only", "retry"};

int ts_route_policy_parse(const char *s) {
    for (int i = 0; s && i < 4; i++)
        if (!strcmp(s, POLICY[i]))
            return i;
    return -1;
}

const char *ts_route_policy_name(ts_route_policy p) {
    return (unsigned)p < 4 ? POLICY[p] : "?";
}

const char *ts_route_reason_name(ts_route_reason r) {
    return (unsigned)r < TS_REASON_N ? REASON[r] : "?";
}

bool ts_route_weights_parse(const char *s, ts_route_weights *w,
                            const char **bad) {
    static char part[64];
    ts_route_weights t = *w;
    while (s && *s) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        snprintf(part, sizeof part, "%.*s", (int)len, s);
        *bad = part;
        char *eq = strchr(part, '='), *num_end;
        if (!eq || len >= sizeof part)
            return false;
        double v = strtod(eq + 1, &num_end);
        if (num_end == eq + 1 || *num_end || !isfinite(v) || v < 0)
            return false;
        *eq = 0;
        if (!strcmp(part, "prefix"))
            t.prefix = v;
        else if (!strcmp(part, "queue"))
            t.queue = v;
        else if (!strcmp(part, "kv"))
            t.kv = v;
        else {
            *eq = '=';
            return false;
        }
        s = end ? end + 1 : NULL;
    }
    *w = t;
    return true;
}

static uint64_t next_rand(ts_route_state *st) {
    uint64_t x = st->rng ? st->rng : 0x9e3779b97f4a7c15ull;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    st->rng = x;
    return x;
}

int ts_route_pick(ts_route_state *st, const ts_route_candidate *c, int n,
                  size_t n_blocks, ts_route_reason *why, double *scores) {
    int n_ok = 0, only = -1;
    int64_t q_min = 0, q_max = 0;
    size_t hit_min = (size_t)-1, hit_max = 0;
    for (int i = 0; i < n; i++) {
        if (scores)
            scores[i] = -1;
        if (!c[i].eligible)
            continue;
        if (!n_ok || c[i].queue < q_min)
            q_min = c[i].queue;
        if (!n_ok || c[i].queue > q_max)
            q_max = c[i].queue;
        hit_min = c[i].hit_blocks < hit_min ? c[i].hit_blocks : hit_min;
        hit_max = c[i].hit_blocks > hit_max ? c[i].hit_blocks : hit_max;
        only = i;
        n_ok++;
    }
    if (!n_ok)
        return -1;
    if (n_ok == 1) {
        *why = TS_REASON_ONLY;
        if (scores)
            scores[only] = 1;
        return only;
    }
    if (st->policy == TS_POLICY_ROUND_ROBIN || st->policy == TS_POLICY_RANDOM) {
        /* the k-th eligible one */
        int k = st->policy == TS_POLICY_RANDOM
                    ? (int)(next_rand(st) % (uint64_t)n_ok)
                    : (int)(st->rr++ % (uint64_t)n_ok);
        *why = st->policy == TS_POLICY_RANDOM ? TS_REASON_RANDOM
                                              : TS_REASON_ROUND_ROBIN;
        for (int i = 0; i < n; i++)
            if (c[i].eligible && k-- == 0) {
                if (scores)
                    scores[i] = 1;
                return i;
            }
        return -1; /* cannot happen */
    }
    bool use_prefix = st->policy == TS_POLICY_CACHE_AWARE;
    double best = -1;
    int n_best = 0;
    double *sc = malloc(sizeof *sc * (size_t)n);
    if (!sc)
        return only;
    for (int i = 0; i < n; i++) {
        sc[i] = -1;
        if (!c[i].eligible)
            continue;
        double v = st->w.queue * ts_score_queue(c[i].queue, q_min, q_max) +
                   st->w.kv * ts_score_kv(c[i].kv_used, c[i].kv_total);
        if (use_prefix)
            v += st->w.prefix * ts_score_prefix(c[i].hit_blocks, n_blocks);
        sc[i] = v;
        if (v > best + 1e-12)
            best = v, n_best = 1;
        else if (fabs(v - best) <= 1e-12)
            n_best++;
    }
    int k = (int)(next_rand(st) % (uint64_t)n_best), pick = -1;
    for (int i = 0; i < n && pick < 0; i++)
        if (c[i].eligible && fabs(sc[i] - best) <= 1e-12 && k-- == 0)
            pick = i;
    if (scores)
        memcpy(scores, sc, sizeof *sc * (size_t)n);
    free(sc);
    /* the prefix decided when hits differ and the pick has the most */
    *why = use_prefix && st->w.prefix > 0 && hit_max > hit_min &&
                   c[pick].hit_blocks == hit_max
               ? TS_REASON_PREFIX
               : TS_REASON_LOAD;
    return pick;
}
