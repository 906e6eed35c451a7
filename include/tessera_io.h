/* tessera_io.h — files in Hugging Face's formats: safetensors (read by mmap
 * with zero copies where dtype and alignment allow; sharded checkpoints
 * through model.safetensors.index.json; atomic writes).
 *
 * Every header field is checked before anything is trusted: the header size
 * (at most 100,000,000 bytes and inside the file), well-formed JSON, known
 * dtypes, shapes of non-negative sizes, byte ranges inside the data section,
 * sorted without holes or overlaps, and shape x dtype size = byte length.
 * Errors name the file and the tensor. */
#ifndef TESSERA_IO_H
#define TESSERA_IO_H

#include "tessera.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_safetensors ts_safetensors;

/* Opens one .safetensors file, or a folder: its
 * model.safetensors.index.json (shards) or its model.safetensors. */
ts_status ts_safetensors_open(ts_ctx *ctx, const char *path,
                              ts_safetensors **out);
void ts_safetensors_close(ts_safetensors *st); /* tensors stay valid */
int ts_safetensors_count(const ts_safetensors *st);
/* Names in the file's order (by offset; shards in index order). */
const char *ts_safetensors_name(const ts_safetensors *st, int i);
/* The value of a "__metadata__" key, or NULL. */
const char *ts_safetensors_metadata(const ts_safetensors *st, const char *key);
/* A new reference to the named tensor: a view of the mapped file (no copy)
 * when aligned for its dtype, else a copy. NULL + TS_ERR_INVALID_ARG naming
 * the tensor and file when absent. */
ts_tensor *ts_safetensors_get(ts_safetensors *st, const char *name);
/* The named tensor's dtype, dims and shape (shape: TS_MAX_DIMS entries)
 * from the header, without reading its data; false when absent (no error
 * recorded). Any argument but st and name may be NULL. */
bool ts_safetensors_shape(const ts_safetensors *st, const char *name,
                          ts_dtype *dt, int *ndim, int64_t *shape);
/* One pass over the named tensor's mapped bytes: TS_OK when every value
 * is finite (integer tensors always are), else TS_ERR_IO naming the file,
 * the tensor, NaN or Inf and the flat index of the first one. */
ts_status ts_safetensors_check_finite(ts_safetensors *st, const char *name);

/* Writes n named tensors (any layout; written row-major) and optional
 * metadata pairs (meta[2k] = key, meta[2k+1] = value, n_meta pairs) to
 * path atomically: a temporary file in the same folder, fsync, rename. A
 * failure leaves any previous file at path as it was. */
ts_status ts_safetensors_save(ts_ctx *ctx, const char *path, int n,
                              const char *const *names, ts_tensor *const *ts,
                              int n_meta, const char *const *meta);

/* ---- model folders ----------------------------------------------------- */

/* What a model folder must hold (ts_model_dir_check's need). */
enum {
    TS_MODEL_CONFIG = 1,  /* config.json */
    TS_MODEL_WEIGHTS = 2, /* model.safetensors | model.safetensors.index.json */
    TS_MODEL_TOKENIZER = 4, /* tokenizer.json */
    TS_MODEL_ALL = 7
};
/* TS_OK when path is a folder holding what need asks for. Otherwise an
 * error that says what to give: a path that does not exist; a file (its
 * folder suggested); a GGUF file (not supported yet); a folder missing
 * files (what was looked for and what the folder holds). What every
 * loader of a model folder calls first. */
ts_status ts_model_dir_check(ts_ctx *ctx, const char *path, unsigned need);
/* Whether path is a file starting with GGUF's magic. */
bool ts_file_is_gguf(const char *path);

/* ---- config.json ------------------------------------------------------ */

typedef enum {
    TS_ARCH_QWEN3 = 0,
    TS_ARCH_QWEN2,
    TS_ARCH_LLAMA,
    TS_ARCH_GPT2
} ts_arch;

/* A Hugging Face config.json read for one of the supported architectures,
 * with Hugging Face's defaults where a field may be absent. */
typedef struct {
    ts_arch arch;
    char model_type[32];
    int64_t vocab;         /* vocab_size */
    int64_t hidden;        /* hidden_size | n_embd */
    int64_t layers;        /* num_hidden_layers | n_layer */
    int64_t heads;         /* num_attention_heads | n_head */
    int64_t kv_heads;      /* num_key_value_heads (default: heads) */
    int64_t head_dim;      /* head_dim (default: hidden / heads) */
    int64_t intermediate;  /* intermediate_size | n_inner (GPT-2: 4 x hidden) */
    int64_t max_positions; /* max_position_embeddings | n_positions */
    double norm_eps;       /* rms_norm_eps | layer_norm_epsilon */
    double rope_theta;     /* rope_theta (default 10000) */
    bool tie_word_embeddings;
    bool attention_bias; /* q/k/v biases (Qwen2: always; Llama: the field) */
    bool qk_norm;        /* Qwen3 */
    /* rope_scaling of type llama3 (Llama 3.1+) */
    bool rope_llama3;
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max_positions;
    ts_dtype dtype;                     /* torch_dtype (default f32) */
    int64_t bos_token_id, eos_token_id; /* -1 when absent (first eos) */
} ts_model_config;

/* Reads path (a config.json, or a folder holding one). An unsupported
 * model type is an error listing the supported ones; a missing or
 * mistyped field, or a size outside what a model can have, is an error
 * naming the field and the allowed range. */
ts_status ts_config_load(ts_ctx *ctx, const char *path, ts_model_config *out);
const char *ts_arch_name(ts_arch a);

#ifdef __cplusplus
}
#endif
#endif
