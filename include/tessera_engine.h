/* tessera_engine.h — generation: the sampler (temperature, top-k, top-p,
 * min-p, repetition penalty, seeded) that turns a row of logits into the
 * next token. */
#ifndef TESSERA_ENGINE_H
#define TESSERA_ENGINE_H

#include "tessera.h"

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

#ifdef __cplusplus
}
#endif
#endif
