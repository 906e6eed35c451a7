/* test_sampler.c — next-token sampling: greedy and its ties, seeded
 * reproducibility, the sampled frequencies against the filtered softmax
 * (temperature, top-k, top-p, min-p) over many draws, Hugging Face's
 * repetition penalty, and parameter errors. */
#include "tessera_engine.h"
#include "test_util.h"

#include <math.h>

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
