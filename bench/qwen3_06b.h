/* qwen3_06b.h — the Qwen3-0.6B architecture the benchmarks build with
 * random weights (hidden 1024, 28 layers, 16 heads / 8 KV heads, head dim
 * 128, MLP 3072, vocab 151936, tied embeddings); small: 2 layers and a
 * 4096-token vocabulary, for quick runs. */
#ifndef TS_BENCH_QWEN3_06B_H
#define TS_BENCH_QWEN3_06B_H

#include "tessera_models.h"

#include <stdio.h>
#include <stdlib.h>

/* a family's description (ts_model_config_preset), sizes to be set */
static inline ts_model_config bench_preset(const char *model_type) {
    ts_model_config c;
    ts_ctx *ctx = NULL;
    if (ts_ctx_new(&ctx, NULL) != TS_OK ||
        ts_model_config_preset(ctx, model_type, &c) != TS_OK) {
        fprintf(stderr, "%s: %s\n", model_type, ctx ? ts_errmsg(ctx) : "?");
        exit(1);
    }
    ts_ctx_free(ctx);
    return c;
}

static inline ts_model_config qwen3_06b(bool small) {
    ts_model_config c = bench_preset("qwen3");
    c.vocab = small ? 4096 : 151936, c.hidden = 1024;
    c.layers = small ? 2 : 28, c.heads = 16, c.kv_heads = 8;
    c.head_dim = 128, c.intermediate = 3072, c.norm_eps = 1e-6;
    c.rope_theta = 1e6, c.tie_word_embeddings = true;
    c.max_positions = 40960;
    return c;
}

#endif
