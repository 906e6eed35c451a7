/* sampler.c — next-token sampling from a row of logits, in the order
 * Hugging Face's generate applies its processors: repetition penalty,
 * temperature, top-k, top-p, min-p, then a draw from the softmax with a
 * seeded generator (xoshiro256**); temperature 0 is the argmax. For
 * speculative decoding: the same transforms as a distribution
 * (ts_sampler_probs), draws from a given one, and the accept/resample rule
 * of speculative sampling. Owns only its scratch buffers and generator
 * state. */
#define _GNU_SOURCE /* qsort_r */
#include "tessera_engine.h"

#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ts_sampler {
    ts_ctx *ctx;
    ts_sampling s;
    uint64_t rng[4];
    float *work;
    int32_t *order;
    int64_t cap;
    size_t prompt_len;
};

void ts_sampler_set_prompt_len(ts_sampler *sm, size_t n) {
    if (sm)
        sm->prompt_len = n;
}

ts_sampling ts_sampling_default(void) {
    ts_sampling s = {.temperature = 0,
                     .top_k = 0,
                     .top_p = 1,
                     .min_p = 0,
                     .repetition_penalty = 1,
                     .seed = 0};
    return s;
}

ts_status ts_sampling_check(ts_ctx *ctx, const ts_sampling *s) {
    if (!s)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "sampling: NULL parameters");
    if (!(s->temperature >= 0 && s->temperature <= 100))
        return ts_set_error(ctx, TS_ERR_RANGE, "temperature %g (want 0..100)",
                            s->temperature);
    if (s->top_k < 0)
        return ts_set_error(ctx, TS_ERR_RANGE, "top_k %lld (want >= 0)",
                            (long long)s->top_k);
    if (!(s->top_p > 0 && s->top_p <= 1))
        return ts_set_error(ctx, TS_ERR_RANGE, "top_p %g (want 0 < top_p <= 1)",
                            s->top_p);
    if (!(s->min_p >= 0 && s->min_p <= 1))
        return ts_set_error(ctx, TS_ERR_RANGE, "min_p %g (want 0..1)",
                            s->min_p);
    if (!(s->presence_penalty >= -2 && s->presence_penalty <= 2))
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "presence_penalty %g (want -2..2)",
                            s->presence_penalty);
    if (!(s->frequency_penalty >= -2 && s->frequency_penalty <= 2))
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "frequency_penalty %g (want -2..2)",
                            s->frequency_penalty);
    if (!(s->repetition_penalty > 0 && s->repetition_penalty <= 100))
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "repetition_penalty %g (want 0 < r <= 100)",
                            s->repetition_penalty);
    return TS_OK;
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t next_u64(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

ts_status ts_sampler_new(ts_ctx *ctx, const ts_sampling *s, ts_sampler **out) {
    if (!ctx || !out)
        return TS_ERR_INVALID_ARG;
    *out = NULL;
    if (ts_sampling_check(ctx, s) != TS_OK)
        return ctx->status;
    ts_sampler *sm = calloc(1, sizeof *sm);
    if (!sm)
        return ts_set_error(ctx, TS_ERR_OOM, "sampler: out of memory");
    sm->ctx = ctx;
    sm->s = *s;
    uint64_t x = s->seed;
    for (int i = 0; i < 4; i++) { /* splitmix64 */
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        sm->rng[i] = z ^ (z >> 31);
    }
    *out = sm;
    return TS_OK;
}

void ts_sampler_free(ts_sampler *sm) {
    if (!sm)
        return;
    free(sm->work), free(sm->order);
    free(sm);
}

static int by_logit_desc(const void *a, const void *b, void *base) {
    const float *l = base;
    float x = l[*(const int32_t *)a], y = l[*(const int32_t *)b];
    if (x != y)
        return x < y ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b; /* ties: lower id first */
}

/* greedy: the first of the best */
static int32_t argmax(const float *l, int64_t V) {
    int32_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (l[i] > l[best])
            best = (int32_t)i;
    return best;
}

/* ord[0..n): the tokens whose logit is at least thr, best first */
static int64_t gather_sorted(float *l, int64_t V, float thr, int32_t *ord) {
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++)
        if (l[i] >= thr)
            ord[n++] = (int32_t)i;
    qsort_r(ord, (size_t)n, sizeof *ord, by_logit_desc, l);
    return n;
}

/* no filter: a draw (r in [0, 1)) from the whole softmax, walked in id
 * order; no sort. l's entries become their exp(l - mx) */
static int32_t draw_all(float *l, int64_t V, float mx, double r) {
    double sum = 0;
    for (int64_t i = 0; i < V; i++)
        sum += l[i] = (float)exp((double)l[i] - mx);
    double u = r * sum;
    int32_t last = -1;
    for (int64_t i = 0; i < V; i++) {
        if (l[i] == 0)
            continue;
        last = (int32_t)i;
        u -= l[i];
        if (u < 0)
            return last;
    }
    return last; /* rounding left u: the last token that may be drawn */
}

/* what the request's transforms leave of a row: one token (greedy, or a
 * degenerate row), the whole softmax of l (no filter), or the kept prefix
 * ord[0..keep) of the tokens sorted best first. l is sm->work: the row
 * after penalties, divided by the temperature; mx its largest entry. */
typedef enum { KEPT_ONE, KEPT_ALL, KEPT_SORTED } kept_kind;
typedef struct {
    kept_kind kind;
    int32_t token; /* KEPT_ONE */
    float mx;
    int64_t keep; /* KEPT_SORTED: sm->order[0..keep) */
} kept;

static bool ensure_work(ts_sampler *sm, int64_t V) {
    if (V <= sm->cap)
        return true;
    float *w = realloc(sm->work, sizeof(float) * (size_t)V);
    int32_t *o = realloc(sm->order, sizeof(int32_t) * (size_t)V);
    if (w)
        sm->work = w;
    if (o)
        sm->order = o;
    if (!w || !o) {
        ts_set_error(sm->ctx, TS_ERR_OOM, "sampler: out of memory");
        return false;
    }
    sm->cap = V;
    return true;
}

/* the penalties, temperature and filters over a copy of logits[V] */
static bool transform(ts_sampler *sm, const float *logits, int64_t V,
                      const int32_t *seen, size_t n_seen, kept *k) {
    if (!ensure_work(sm, V))
        return false;
    float *l = sm->work;
    memcpy(l, logits, sizeof(float) * (size_t)V);
    const ts_sampling *s = &sm->s;
    if (s->repetition_penalty != 1)
        for (size_t i = 0; i < n_seen; i++) {
            int32_t t = seen[i];
            if (t < 0 || t >= V)
                continue;
            /* applied once per distinct token, as HF's gather/scatter does */
            bool first = true;
            for (size_t j = 0; j < i && first; j++)
                first = seen[j] != t;
            if (first)
                l[t] = l[t] > 0 ? l[t] / (float)s->repetition_penalty
                                : l[t] * (float)s->repetition_penalty;
        }
    if (s->presence_penalty != 0 || s->frequency_penalty != 0)
        for (size_t i = sm->prompt_len; i < n_seen; i++) {
            int32_t t = seen[i];
            if (t < 0 || t >= V)
                continue;
            bool first = true;
            for (size_t j = sm->prompt_len; j < i && first; j++)
                first = seen[j] != t;
            l[t] -= (float)s->frequency_penalty +
                    (first ? (float)s->presence_penalty : 0.0f);
        }
    k->kind = KEPT_ONE;
    if (s->temperature == 0 || s->top_k == 1) {
        k->token = argmax(l, V);
        return true;
    }
    /* the best token and the largest finite magnitude: a temperature so
     * small that the scaled logits overflow samples at its limit, greedy
     * (the order of l is that of l / temperature) */
    int32_t best = 0;
    double amax = 0;
    for (int64_t i = 0; i < V; i++) {
        best = l[i] > l[best] ? (int32_t)i : best;
        if (isfinite(l[i]) && fabs(l[i]) > amax)
            amax = fabs(l[i]);
    }
    k->token = best;
    if ((float)s->temperature == 0 || amax / s->temperature > 1e37)
        return true;
    if (l[best] == -INFINITY) { /* everything banned: the sorted walk's end */
        k->token = 0;
        return true;
    }
    for (int64_t i = 0; i < V; i++)
        l[i] /= (float)s->temperature;
    float mx = l[best];
    k->mx = mx;
    bool cut_k = s->top_k > 0 && s->top_k < V;
    if (!cut_k && s->top_p >= 1 && s->min_p <= 0) {
        k->kind = KEPT_ALL;
        return true;
    }
    /* The filters read the best tokens in order: sort only those within
     * delta of the best, widening until the kept prefix ends inside them
     * (a near-flat row ends in a full sort). */
    int32_t *ord = sm->order;
    double total = -1, log_min_p = s->min_p > 0 ? log(s->min_p) : -INFINITY;
    int64_t n = 0, keep = 0;
    for (float delta = 16;; delta = delta < 1024 ? delta * 4 : INFINITY) {
        bool all = delta == INFINITY;
        n = gather_sorted(l, V, all ? -INFINITY : mx - delta, ord);
        keep = cut_k ? s->top_k : V;
        if (keep > n && cut_k && !all)
            continue;
        if (all && keep > n)
            keep = n;
        double sum = 0;
        if (keep <= n)
            for (int64_t i = 0; i < keep; i++)
                sum += exp((double)l[ord[i]] - mx);
        else { /* every token is kept so far: the whole row's mass */
            if (total < 0) {
                total = 0;
                for (int64_t i = 0; i < V; i++)
                    total += exp((double)l[i] - mx);
            }
            sum = total;
        }
        if (s->top_p < 1) { /* smallest prefix whose mass reaches top_p */
            double acc = 0;
            int64_t m = keep < n ? keep : n, i = 0;
            for (; i < m; i++) {
                acc += exp((double)l[ord[i]] - mx) / sum;
                if (acc >= s->top_p)
                    break;
            }
            if (i < m)
                keep = i + 1;
            else if (keep > n)
                continue; /* the prefix goes on past the sorted tokens */
        }
        if (s->min_p > 0) { /* p >= min_p * p(best) */
            int64_t m = keep < n ? keep : n;
            for (int64_t i = 1; i < m; i++)
                if ((double)l[ord[i]] - mx < log_min_p) {
                    keep = i;
                    break;
                }
            if (keep > n) { /* all sorted ones pass; the rest are below */
                if (!all && -(double)delta > log_min_p)
                    continue;
                keep = n;
            }
        }
        break;
    }
    k->kind = KEPT_SORTED;
    k->keep = keep;
    return true;
}

/* a uniform double in [0, 1) from the generator */
static double uniform(ts_sampler *sm) {
    return (double)(next_u64(sm->rng) >> 11) * (1.0 / 9007199254740992.0);
}

int32_t ts_sampler_next(ts_sampler *sm, const float *logits, int64_t V,
                        const int32_t *seen, size_t n_seen) {
    if (!sm || !logits || V <= 0)
        return -1;
    kept k;
    if (!transform(sm, logits, V, seen, n_seen, &k))
        return -1;
    if (k.kind == KEPT_ONE)
        return k.token;
    float *l = sm->work, mx = k.mx;
    double r = uniform(sm);
    if (k.kind == KEPT_ALL)
        return draw_all(l, V, mx, r);
    int32_t *ord = sm->order;
    int64_t keep = k.keep;
    double sum = 0;
    for (int64_t i = 0; i < keep; i++)
        sum += exp((double)l[ord[i]] - mx);
    double u = r * sum;
    for (int64_t i = 0; i < keep; i++) {
        u -= exp((double)l[ord[i]] - mx);
        if (u < 0)
            return ord[i];
    }
    /* rounding left u: the last kept token that may be drawn (a banned
     * one, -inf, never is) */
    while (keep > 1 && l[ord[keep - 1]] == -INFINITY)
        keep--;
    return ord[keep - 1];
}

ts_status ts_sampler_probs(ts_sampler *sm, const float *logits, int64_t V,
                           const int32_t *seen, size_t n_seen, float *p) {
    if (!sm || !logits || !p || V <= 0)
        return sm ? ts_set_error(sm->ctx, TS_ERR_INVALID_ARG,
                                 "sampler_probs: NULL argument or V %lld",
                                 (long long)V)
                  : TS_ERR_INVALID_ARG;
    kept k;
    if (!transform(sm, logits, V, seen, n_seen, &k))
        return TS_ERR_OOM;
    const float *l = sm->work;
    if (k.kind == KEPT_ONE) {
        memset(p, 0, sizeof(float) * (size_t)V);
        p[k.token] = 1;
        return TS_OK;
    }
    double sum = 0;
    if (k.kind == KEPT_ALL) {
        for (int64_t i = 0; i < V; i++)
            sum += exp((double)l[i] - k.mx);
        for (int64_t i = 0; i < V; i++)
            p[i] = (float)(exp((double)l[i] - k.mx) / sum);
        return TS_OK;
    }
    const int32_t *ord = sm->order;
    memset(p, 0, sizeof(float) * (size_t)V);
    for (int64_t i = 0; i < k.keep; i++)
        sum += exp((double)l[ord[i]] - k.mx);
    for (int64_t i = 0; i < k.keep; i++)
        p[ord[i]] = (float)(exp((double)l[ord[i]] - k.mx) / sum);
    return TS_OK;
}

/* a draw from w[V] >= 0 (any scale) with u in [0, 1), in id order; -1
 * when nothing has weight */
static int32_t draw_weights(const float *w, int64_t V, double u) {
    double sum = 0;
    for (int64_t i = 0; i < V; i++)
        sum += w[i] > 0 ? (double)w[i] : 0;
    if (!(sum > 0))
        return -1;
    double x = u * sum;
    int32_t last = -1;
    for (int64_t i = 0; i < V; i++) {
        if (!(w[i] > 0))
            continue;
        last = (int32_t)i;
        x -= (double)w[i];
        if (x < 0)
            return last;
    }
    return last; /* rounding left x: the last token with weight */
}

int32_t ts_sampler_draw(ts_sampler *sm, const float *p, int64_t V) {
    if (!sm || !p || V <= 0)
        return -1;
    return draw_weights(p, V, uniform(sm));
}

int32_t ts_sampler_speculate(ts_sampler *sm, const float *p, const float *q,
                             int64_t V, int32_t x, bool *accepted) {
    if (accepted)
        *accepted = false;
    if (!sm || !p || V <= 0 || x < 0 || x >= V || !accepted)
        return -1;
    double qx = q ? (double)q[x] : 1, px = (double)p[x];
    /* accept with probability min(1, p(x) / q(x)) */
    if (px > 0 && (px >= qx || uniform(sm) * qx < px)) {
        *accepted = true;
        return x;
    }
    /* rejected: the residual normalize(max(0, p - q)) */
    if (!ensure_work(sm, V))
        return -1;
    float *r = sm->work;
    for (int64_t i = 0; i < V; i++) {
        float d = p[i] - (q ? q[i] : (i == x ? 1.0f : 0.0f));
        r[i] = d > 0 ? d : 0;
    }
    int32_t t = draw_weights(r, V, uniform(sm));
    /* p == q up to rounding leaves no residual mass: p itself (what it
     * would be in exact arithmetic, never reached then) */
    return t >= 0 ? t : draw_weights(p, V, uniform(sm));
}
