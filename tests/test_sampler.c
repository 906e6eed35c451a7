/* test_sampler.c — next-token sampling: greedy and its ties, seeded
 * reproducibility, the sampled frequencies against the filtered softmax
 * (temperature, top-k, top-p, min-p) over many draws, Hugging Face's
 * repetition penalty, and parameter errors. */
#include "tessera_engine.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>

static const float L4[4] = {2, 1, 0, -1};

/* frequencies of n draws */
static void draw(ts_ctx *ctx, ts_sampling s, int n, double *freq) {
    ts_sampler *sm;
    CHECK_OK(ctx, ts_sampler_new(ctx, &s, &sm));
    for (int i = 0; i < 4; i++)
        freq[i] = 0;
    for (int i = 0; i < n && sm; i++) {
        int32_t t = ts_sampler_next(sm, L4, 4, NULL, 0);
        if (t >= 0 && t < 4)
            freq[t] += 1.0 / n;
    }
    ts_sampler_free(sm);
}

/* softmax of L4 / temp over the first `keep` entries */
static void expect(double temp, int keep, double *p) {
    double z = 0;
    for (int i = 0; i < 4; i++)
        z += p[i] = i < keep ? exp(L4[i] / temp) : 0;
    for (int i = 0; i < 4; i++)
        p[i] /= z;
}

static void check_freq(const char *what, const double *got,
                       const double *want) {
    for (int i = 0; i < 4; i++) {
        CHECK_NEAR(got[i], want[i], 0.012);
        if (fabs(got[i] - want[i]) > 0.012)
            fprintf(stderr, "%s: token %d at %.4f, expected %.4f\n", what, i,
                    got[i], want[i]);
    }
}

/* ---- the reference: every filter over a full sort (the sampler sorts
 * only the best tokens), the same generator and draw ---- */

typedef struct {
    uint64_t s[4];
} ref_rng;

static uint64_t ref_rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static double ref_uniform(ref_rng *g) {
    uint64_t *s = g->s;
    uint64_t r = ref_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t;
    s[3] = ref_rotl(s[3], 45);
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

static ref_rng ref_seed(uint64_t x) {
    ref_rng g;
    for (int i = 0; i < 4; i++) { /* splitmix64 */
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        g.s[i] = z ^ (z >> 31);
    }
    return g;
}

static const float *ref_l;
static int ref_desc(const void *a, const void *b) {
    float x = ref_l[*(const int32_t *)a], y = ref_l[*(const int32_t *)b];
    if (x != y)
        return x < y ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* *sorted: l and ord hold this row's scaled logits and order already (the
 * row and temperature are the same for a case's draws) */
static int32_t ref_next(const ts_sampling *s, ref_rng *g, const float *logits,
                        int V, float *l, int32_t *ord, bool *sorted) {
    double mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        if (!*sorted)
            l[i] = logits[i] / (float)s->temperature, ord[i] = i;
        mx = l[i] > mx ? l[i] : mx;
    }
    double r = ref_uniform(g);
    if ((s->top_k == 0 || s->top_k >= V) && s->top_p >= 1 && s->min_p <= 0) {
        double sum = 0, u;
        for (int i = 0; i < V; i++)
            sum += (float)exp(l[i] - mx);
        u = r * sum;
        for (int i = 0; i < V; i++)
            if ((u -= (float)exp(l[i] - mx)) < 0)
                return i;
        return V - 1;
    }
    ref_l = l;
    if (!*sorted)
        qsort(ord, (size_t)V, sizeof *ord, ref_desc);
    *sorted = true;
    int keep = s->top_k > 0 && s->top_k < V ? (int)s->top_k : V;
    double sum = 0, acc = 0;
    for (int i = 0; i < keep; i++)
        sum += exp(l[ord[i]] - mx);
    for (int i = 0; s->top_p < 1 && i < keep; i++)
        if ((acc += exp(l[ord[i]] - mx) / sum) >= s->top_p) {
            keep = i + 1;
            break;
        }
    for (int i = 1; s->min_p > 0 && i < keep; i++)
        if (l[ord[i]] - mx < log(s->min_p)) {
            keep = i;
            break;
        }
    sum = 0;
    for (int i = 0; i < keep; i++)
        sum += exp(l[ord[i]] - mx);
    double u = r * sum;
    for (int i = 0; i < keep; i++)
        if ((u -= exp(l[ord[i]] - mx)) < 0)
            return ord[i];
    return ord[keep - 1];
}

/* a 151936-token row (Qwen3's vocabulary): a few likely tokens, a long
 * tail, a flat stretch and banned ones; every filter draws what the full
 * sort draws, draw by draw */
static void test_against_full_sort(ts_ctx *ctx) {
    enum { BIG = 151936, DRAWS = 20 };
    float *row = malloc(sizeof(float) * BIG),
          *work = malloc(sizeof(float) * BIG);
    int32_t *ord = malloc(sizeof(int32_t) * BIG);
    uint64_t x = 12345;
    for (int i = 0; i < BIG; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        double v = (double)(x >> 40) / (double)(1ull << 24); /* [0, 1) */
        row[i] = i % 5000 == 7   ? (float)(8 + 4 * v)
                 : i % 1000 == 3 ? -INFINITY
                 : i > 140000    ? 1.0f
                                 : (float)(30 * v - 25);
    }
    struct {
        double temp, top_p, min_p;
        int64_t top_k;
    } cases[] = {{1, 1, 0, 0},    {0.7, 0.9, 0, 0},    {1, 0.999, 0, 0},
                 {1, 1, 0, 50},   {1, 1, 0, 100000},   {1, 0.95, 0, 40},
                 {1, 1, 0.05, 0}, {1, 1, 1e-9, 0},     {2, 0.99, 1e-4, 0},
                 {0.3, 1, 0, 20}, {1, 0.9999999, 0, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ts_sampling s = ts_sampling_default();
        s.temperature = cases[c].temp, s.top_p = cases[c].top_p;
        s.min_p = cases[c].min_p, s.top_k = cases[c].top_k;
        s.seed = 77 + c;
        ts_sampler *sm = NULL;
        CHECK_OK(ctx, ts_sampler_new(ctx, &s, &sm));
        ref_rng g = ref_seed(s.seed);
        int same = 0;
        bool sorted = false;
        for (int d = 0; sm && d < DRAWS; d++) {
            int32_t got = ts_sampler_next(sm, row, BIG, NULL, 0);
            int32_t want = ref_next(&s, &g, row, BIG, work, ord, &sorted);
            same += got == want;
            CHECK(got >= 0 && got < BIG && row[got] != -INFINITY);
        }
        CHECK(same == DRAWS);
        if (same != DRAWS)
            fprintf(stderr, "case %zu: %d of %d draws as the full sort's\n", c,
                    same, DRAWS);
        ts_sampler_free(sm);
    }
    free(row), free(work), free(ord);
}

int main(void) {
    ts_ctx *ctx = test_ctx();
    ts_sampling s = ts_sampling_default();
    ts_sampler *sm;
    /* greedy; ties go to the lower id */
    CHECK_OK(ctx, ts_sampler_new(ctx, &s, &sm));
    CHECK(ts_sampler_next(sm, L4, 4, NULL, 0) == 0);
    float tie[3] = {1, 3, 3};
    CHECK(ts_sampler_next(sm, tie, 3, NULL, 0) == 1);
    ts_sampler_free(sm);
    /* the same seed, the same draws */
    s.temperature = 1, s.seed = 42;
    int32_t a[50], b[50];
    for (int r = 0; r < 2; r++) {
        CHECK_OK(ctx, ts_sampler_new(ctx, &s, &sm));
        for (int i = 0; i < 50; i++)
            (r ? b : a)[i] = ts_sampler_next(sm, L4, 4, NULL, 0);
        ts_sampler_free(sm);
    }
    CHECK(!memcmp(a, b, sizeof a));
    /* frequencies against the filtered softmax, 40000 draws each */
    double got[4], want[4];
    int N = 40000;
    draw(ctx, s, N, got), expect(1, 4, want),
        check_freq("temperature 1", got, want);
    s.temperature = 0.5;
    draw(ctx, s, N, got), expect(0.5, 4, want),
        check_freq("temperature 0.5", got, want);
    s.temperature = 1, s.top_k = 2;
    draw(ctx, s, N, got), expect(1, 2, want), check_freq("top_k 2", got, want);
    s.top_k = 0, s.top_p = 0.7; /* 0.644 < 0.7 <= 0.881: two tokens */
    draw(ctx, s, N, got), expect(1, 2, want),
        check_freq("top_p 0.7", got, want);
    s.top_p = 1, s.min_p = 0.2; /* p >= 0.2 x 0.644: tokens 0 and 1 */
    draw(ctx, s, N, got), expect(1, 2, want),
        check_freq("min_p 0.2", got, want);
    s.min_p = 0, s.top_k = 1; /* top_k 1 is greedy */
    draw(ctx, s, 100, got);
    CHECK_NEAR(got[0], 1.0, 1e-9);
    /* repetition penalty: positive logits divided, negative multiplied */
    ts_sampling r = ts_sampling_default();
    r.repetition_penalty = 4;
    CHECK_OK(ctx, ts_sampler_new(ctx, &r, &sm));
    int32_t seen[3] = {0, 0, 3};
    CHECK(ts_sampler_next(sm, L4, 4, seen, 3) == 1); /* 2 -> 0.5 < 1 */
    float neg[2] = {-1, -3};
    int32_t seen0[1] = {0};
    CHECK(ts_sampler_next(sm, neg, 2, seen0, 1) == 1); /* -1 -> -4, below -3 */
    ts_sampler_free(sm);
    /* banned tokens (-inf, a constraint's mask) are never drawn, with any
     * filter and penalty; the rest keep their softmax share */
    ts_sampling m = ts_sampling_default();
    m.temperature = 1.5, m.seed = 5, m.repetition_penalty = 1.3;
    m.frequency_penalty = 0.5;
    float masked[6] = {-INFINITY, 1, -INFINITY, 0, -INFINITY, -INFINITY};
    int32_t hist[2] = {3, 0};
    double cnt[6] = {0};
    for (int f = 0; f < 3; f++) {
        m.top_p = f == 1 ? 0.999 : 1, m.min_p = f == 2 ? 0.01 : 0;
        CHECK_OK(ctx, ts_sampler_new(ctx, &m, &sm));
        ts_sampler_set_prompt_len(sm, 1);
        for (int i = 0; sm && i < 20000; i++) {
            int32_t t = ts_sampler_next(sm, masked, 6, hist, 2);
            cnt[t >= 0 && t < 6 ? t : 0] += 1;
        }
        ts_sampler_free(sm);
    }
    CHECK(cnt[0] == 0 && cnt[2] == 0 && cnt[4] == 0 && cnt[5] == 0);
    /* the penalties leave banned token 0 at -inf and token 3's logit 0
     * (0 x 1.3; no frequency penalty: it is in the prompt) */
    double p1 = 1 / (1 + exp(-1 / 1.5));
    CHECK_NEAR(cnt[1] / 60000, p1, 0.01);
    m = ts_sampling_default(); /* greedy skips -inf too */
    CHECK_OK(ctx, ts_sampler_new(ctx, &m, &sm));
    CHECK(ts_sampler_next(sm, masked, 6, NULL, 0) == 1);
    ts_sampler_free(sm);
    /* temperatures so small that the scaled logits overflow: greedy */
    for (int k = 0; k < 2; k++) {
        ts_sampling t = ts_sampling_default();
        t.temperature = k ? 1e-38 : 1e-45, t.seed = 3;
        float big[4] = {-1, 7, 6.5f, -INFINITY};
        CHECK_OK(ctx, ts_sampler_new(ctx, &t, &sm));
        for (int i = 0; sm && i < 20; i++)
            CHECK(ts_sampler_next(sm, big, 4, NULL, 0) == 1);
        ts_sampler_free(sm);
    }
    test_against_full_sort(ctx);
    /* errors name the parameter */
    ts_sampling bad = ts_sampling_default();
    bad.top_p = 0;
    CHECK(ts_sampler_new(ctx, &bad, &sm) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "top_p 0 (want 0 < top_p <= 1)");
    ts_clear_error(ctx);
    bad = ts_sampling_default();
    bad.temperature = -1;
    CHECK(ts_sampling_check(ctx, &bad) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "temperature -1");
    ts_clear_error(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_sampler");
}
