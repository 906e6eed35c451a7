/* tessera_models.h — models built from Hugging Face folders (config.json +
 * safetensors, loaded as they are). */
#ifndef TESSERA_MODELS_H
#define TESSERA_MODELS_H

#include "tessera_io.h"
#include "tessera_nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds the Qwen3 model that dir's config.json describes and fills its
 * parameters from dir's safetensors (one file or shards), converting the
 * stored dtype to the model's f32. Every parameter must be present with
 * its exact shape (lm_head.weight may be absent when embeddings are tied);
 * errors name the tensor and the file. */
ts_status ts_qwen3_load(ts_ctx *ctx, const char *dir, ts_qwen3_model **out);
/* The same for any decoder the ts_qwen3 model covers: qwen3, qwen2 (q/k/v
 * biases, no qk-norm) and llama (no qk-norm, llama3 rope scaling). */
ts_status ts_decoder_load(ts_ctx *ctx, const char *dir, ts_qwen3_model **out);

#ifdef __cplusplus
}
#endif
#endif
