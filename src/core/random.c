/* random.c — seeded random tensors: xoshiro256** seeded by splitmix64,
 * normals by Box-Muller. The same seed gives the same values anywhere. */
#include "core/core.h"

#include <math.h>

typedef struct {
    uint64_t s[4];
} rng;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(rng *r) {
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static ts_tensor *fill_random(ts_ctx *ctx, ts_dtype dt, int ndim,
                              const int64_t *shape, uint64_t seed, bool normal,
                              double a, double b) {
    ts_tensor *t = ts_tensor_new_host(ctx, dt, ndim, shape);
    if (!t)
        return NULL;
    rng r;
    rng_seed(&r, seed);
    int64_t n = ts_tensor_numel(t);
    size_t es = ts_dtype_size(dt);
    char *p = ts_tensor_ptr(t);
    for (int64_t i = 0; i < n; i += 2) {
        double v0, v1;
        if (normal) {
            double u1 = rng_uniform(&r), u2 = rng_uniform(&r);
            double rad = sqrt(-2.0 * log(1.0 - u1));
            v0 = a * rad * cos(2 * M_PI * u2);
            v1 = a * rad * sin(2 * M_PI * u2);
        } else {
            v0 = a + (b - a) * rng_uniform(&r);
            v1 = a + (b - a) * rng_uniform(&r);
        }
        ts_store_f64(p + (size_t)i * es, dt, v0);
        if (i + 1 < n)
            ts_store_f64(p + (size_t)(i + 1) * es, dt, v1);
    }
    return ts_tensor_to_current(ctx, t);
}

ts_tensor *ts_randn(ts_ctx *ctx, ts_dtype dt, int ndim, const int64_t *shape,
                    double std, uint64_t seed) {
    if (ctx && (!(std >= 0) || !isfinite(std))) {
        ts_set_error(ctx, TS_ERR_RANGE, "ts_randn: std %g (want >= 0)", std);
        return NULL;
    }
    return fill_random(ctx, dt, ndim, shape, seed, true, std, 0);
}

ts_tensor *ts_rand(ts_ctx *ctx, ts_dtype dt, int ndim, const int64_t *shape,
                   double lo, double hi, uint64_t seed) {
    if (ctx && !(lo <= hi && isfinite(lo) && isfinite(hi))) {
        ts_set_error(ctx, TS_ERR_RANGE, "ts_rand: range [%g, %g) is empty", lo,
                     hi);
        return NULL;
    }
    return fill_random(ctx, dt, ndim, shape, seed, false, lo, hi);
}
