/* qwen3_06b.h — the Qwen3-0.6B architecture the benchmarks build with
 * random weights (hidden 1024, 28 layers, 16 heads / 8 KV heads, head dim
 * 128, MLP 3072, vocab 151936, tied embeddings); small: 2 layers and a
 * 4096-token vocabulary, for quick runs. */
#ifndef TS_BENCH_QWEN3_06B_H
#define TS_BENCH_QWEN3_06B_H

#include "tessera_nn.h"

static inline ts_qwen3_config qwen3_06b(ts_dtype weight_dtype, bool small) {
    ts_qwen3_config cfg = {.vocab = small ? 4096 : 151936,
                           .hidden = 1024,
                           .layers = small ? 2 : 28,
                           .heads = 16,
                           .kv_heads = 8,
                           .head_dim = 128,
                           .intermediate = 3072,
                           .rms_eps = 1e-6,
                           .rope_theta = 1e6,
                           .tie_word_embeddings = true,
                           .max_positions = 40960,
                           .weight_dtype = weight_dtype};
    return cfg;
}

#endif
