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
/* The index of the tensor called name (hashed: constant time, for
 * checkpoints of many thousand tensors), or -1. */
int ts_safetensors_find(const ts_safetensors *st, const char *name);
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
/* The text of a model's file `file` (e.g. "generation_config.json"): read
 * from the folder, or made from a GGUF's metadata when model is a GGUF
 * file; NULL (no error set) when the folder has no such file. free() it. */
char *ts_model_file_text(ts_ctx *ctx, const char *model, const char *file);

/* ---- config.json ------------------------------------------------------ */

/* The causal LM families config.json may name (model_type, or without
 * one the architectures entry). Each is one entry of config.c's family
 * table: the fields it reads, Hugging Face's defaults, which are required,
 * and the description values no field sets. A "gemma3" config
 * (Gemma3ForConditionalGeneration) is read through its text_config. */
typedef enum {
    TS_ARCH_QWEN3 = 0, /* Qwen3ForCausalLM */
    TS_ARCH_QWEN2,     /* Qwen2ForCausalLM */
    TS_ARCH_LLAMA,     /* LlamaForCausalLM (Llama 1, 2, 3, 3.1, 3.2) */
    TS_ARCH_GPT2,      /* GPT2LMHeadModel */
    TS_ARCH_MISTRAL,   /* MistralForCausalLM */
    TS_ARCH_GEMMA2,    /* Gemma2ForCausalLM */
    TS_ARCH_GEMMA3,    /* Gemma3ForCausalLM (model_type gemma3_text; or
                          gemma3's text_config) */
    TS_ARCH_PHI3,      /* Phi3ForCausalLM */
    TS_ARCH_QWEN3_MOE, /* Qwen3MoeForCausalLM */
    TS_ARCH_MIXTRAL,   /* MixtralForCausalLM */
    TS_ARCH_COUNT
} ts_arch;

/* Norms: RMSNorm x / rms(x) * w; Gemma's RMSNorm x / rms(x) * (1 + w);
 * LayerNorm (x - mean) / std * w + b. */
typedef enum { TS_NORM_RMS = 0, TS_NORM_RMS_1P, TS_NORM_LAYER } ts_norm_kind;
/* Positions: rotary (rope_* below) or a learned table (GPT-2's wpe). */
typedef enum { TS_POS_ROPE = 0, TS_POS_LEARNED } ts_pos_kind;
/* rope_scaling's type: none ("default"), "linear" (positions / factor),
 * "llama3" (Llama 3.1: long wavelengths / factor, a smooth blend),
 * "longrope" (Phi-3: per-frequency short/long factors and an attention
 * factor), "yarn" (NTK-by-parts with beta_fast/beta_slow, mscale). */
typedef enum {
    TS_ROPE_DEFAULT = 0,
    TS_ROPE_LINEAR,
    TS_ROPE_LLAMA3,
    TS_ROPE_LONGROPE,
    TS_ROPE_YARN
} ts_rope_kind;

#define TS_ROPE_MAX_FACTORS 512 /* longrope: one factor per frequency */
#define TS_MAX_DENSE_LAYERS 64  /* mlp_only_layers entries */

/* A Hugging Face config.json read for one of the supported families, with
 * Hugging Face's defaults where a field may be absent: the sizes, and the
 * description of the decoder that one code path (src/models/decoder.c)
 * builds for every family. Filled by ts_config_load, or by hand from
 * ts_model_config_preset. */
typedef struct {
    ts_arch arch;
    /* config.json's model_type: the family's, or "gemma3" for the
     * multimodal wrapper whose text_config was read (its weights sit under
     * language_model.) */
    char model_type[32];
    /* sizes */
    int64_t vocab;    /* vocab_size */
    int64_t hidden;   /* hidden_size | n_embd */
    int64_t layers;   /* num_hidden_layers | n_layer */
    int64_t heads;    /* num_attention_heads | n_head */
    int64_t kv_heads; /* num_key_value_heads (default: heads; GPT-2: heads) */
    int64_t head_dim; /* head_dim (default: Qwen3 128, Gemma 256, else
                         hidden / heads) */
    int64_t intermediate;  /* intermediate_size | n_inner (GPT-2: 4 x hidden) */
    int64_t max_positions; /* max_position_embeddings | n_positions */
    double norm_eps;       /* rms_norm_eps | layer_norm_epsilon */
    /* norms */
    ts_norm_kind norm;  /* every norm of the model */
    bool sandwich_norm; /* Gemma 2/3: the attention and MLP outputs are
                           normed too before the residual add (four norms
                           a layer) */
    /* positions */
    ts_pos_kind pos;
    double rope_theta;  /* rope_theta (default 10000; Mixtral, Gemma 3: 1e6) */
    ts_rope_kind rope;  /* rope_scaling's type (Gemma 3: global layers) */
    double rope_factor; /* linear, llama3, yarn: factor; longrope:
                           max_positions / original (Phi-3) or factor */
    double rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    /* llama3, longrope, yarn: the pretrained length (longrope: Phi-3's
     * top-level original_max_position_embeddings; yarn: max_positions
     * when not given); longrope uses the long factors past it */
    int64_t rope_original_max_positions;
    /* longrope, yarn: cos/sin scale; ts_config_load fills the formula's
     * value when the config gives none (longrope: sqrt(1 + ln(factor) /
     * ln(original)); yarn: 0.1 ln(factor) + 1, or the mscale ratio) */
    double rope_attention_factor;
    double rope_beta_fast, rope_beta_slow; /* yarn (32, 1) */
    int rope_n_factors;                    /* longrope: head_dim / 2 */
    double rope_short_factor[TS_ROPE_MAX_FACTORS];
    double rope_long_factor[TS_ROPE_MAX_FACTORS];
    /* Gemma 3: sliding-window layers use the default rope with this base
     * (rope_local_base_freq); 0: every layer uses rope_theta/rope */
    double rope_local_theta;
    /* attention */
    bool qk_norm;        /* per-head norm of q and k (Qwen3, Gemma 3) */
    bool attention_bias; /* q/k/v projections with biases (Qwen2, GPT-2;
                            attention_bias: true in Llama, Qwen3, Gemma) */
    bool o_bias;         /* o_proj with a bias (GPT-2's c_proj; Llama,
                            Qwen3, Gemma: attention_bias) */
    bool fused_qkv;      /* one q/k/v matrix (Phi-3's qkv_proj, GPT-2) */
    double attn_scale;   /* 0: 1/sqrt(head_dim); Gemma: query_pre_attn_
                            scalar^-0.5; GPT-2 scale_attn_weights false: 1 */
    double attn_softcap; /* 0: none; scores -> c * tanh(scores / c) */
    /* sliding window: 0 none; else layer i attends to the last
     * sliding_window positions (itself included) when i >= sliding_from
     * and (sliding_pattern < 2 or (i + 1) % sliding_pattern != 0): every
     * layer (Mistral, Phi-3, Mixtral), alternate ones (Gemma 2: pattern
     * 2), five local to one global (Gemma 3: pattern 6), from
     * max_window_layers on (Qwen with use_sliding_window). An explicit
     * layer_types list is read into sliding_from and sliding_pattern. */
    int64_t sliding_window;
    int sliding_pattern;
    int64_t sliding_from; /* Qwen's max_window_layers */
    /* MLP: act (hidden_act / hidden_activation / activation_function:
     * silu; gelu_pytorch_tanh, gelu_new: tanh; gelu: erf); gated:
     * act(gate(x)) * up(x) (SwiGLU, GeGLU), else act(up(x)) (GPT-2) */
    ts_act act;
    bool gated;         /* act(gate) * up; false: act(up) */
    bool fused_gate_up; /* one (2F, C) matrix, gate rows first (Phi-3) */
    bool mlp_bias;      /* every MLP matrix with a bias (GPT-2's c_fc,
                           c_proj; Llama's mlp_bias) */
    bool conv1d;        /* matrices stored (in, out): GPT-2's Conv1D */
    /* mixture of experts: n_experts > 0 makes layer i's MLP a sparse one
     * when (i + 1) % moe_step == 0 and i is not in dense_layers */
    int64_t n_experts;       /* num_experts | num_local_experts (0: none) */
    int64_t experts_per_tok; /* num_experts_per_tok (top-k) */
    /* moe_intermediate_size (Mixtral: intermediate_size) */
    int64_t moe_intermediate;
    bool norm_topk_prob;         /* top-k weights renormalized to sum 1 */
    double router_aux_loss_coef; /* the load-balancing loss's weight */
    int64_t moe_step;            /* decoder_sparse_step (1) */
    int n_dense_layers;
    int64_t dense_layers[TS_MAX_DENSE_LAYERS]; /* mlp_only_layers */
    /* embeddings and head */
    bool embed_scale; /* embeddings times sqrt(hidden) (Gemma) */
    bool tie_word_embeddings;
    double final_softcap; /* 0: none; logits -> c * tanh(logits / c) */
    /* the rest */
    ts_dtype dtype;                     /* dtype | torch_dtype (default f32) */
    int64_t bos_token_id, eos_token_id; /* -1 when absent (first eos) */
} ts_model_config;

/* Whether layer i uses the sliding window / a mixture of experts. */
static inline bool ts_model_layer_sliding(const ts_model_config *c, int64_t i) {
    return c->sliding_window > 0 && i >= c->sliding_from &&
           (c->sliding_pattern < 2 || (i + 1) % c->sliding_pattern != 0);
}
static inline bool ts_model_layer_moe(const ts_model_config *c, int64_t i) {
    if (c->n_experts <= 0 || c->moe_step < 1 || (i + 1) % c->moe_step)
        return false;
    for (int k = 0; k < c->n_dense_layers && k < TS_MAX_DENSE_LAYERS; k++)
        if (c->dense_layers[k] == i)
            return false;
    return true;
}

/* A family's description with Hugging Face's defaults and no sizes (all
 * zero: the caller sets vocab, hidden, layers, heads, kv_heads, head_dim,
 * intermediate, max_positions, and the MoE sizes), for a model built by
 * hand. model_type as config.json spells it ("qwen3", "gpt2",
 * "gemma3_text", ...). An unknown one is an error listing the known. */
ts_status ts_model_config_preset(ts_ctx *ctx, const char *model_type,
                                 ts_model_config *out);

/* Reads path (a config.json, or a folder holding one). An unsupported
 * model type is an error listing the supported ones; a missing required
 * field names the field and the family; a mistyped field, or a value
 * outside what a model can have, is an error naming the field and the
 * allowed range; a feature no decoder here has (rope_scaling "dynamic",
 * Phi-3's partial_rotary_factor, a layer_types list no pattern fits, ...)
 * is TS_ERR_UNSUPPORTED naming it. */
ts_status ts_config_load(ts_ctx *ctx, const char *path, ts_model_config *out);
/* The family's model_type ("qwen3", ..., "gemma3_text"), or "unknown". */
const char *ts_arch_name(ts_arch a);

/* ---- images and arrays -------------------------------------------------- */

/* PNG (libpng): any bit depth and color type -> (C, H, W) f32 in [0, 1],
 * C = 1 (gray; gray+alpha with alpha dropped) or 3 (RGB, RGBA with alpha
 * dropped, palette expanded); 16-bit samples divided by 65535, others by
 * 255 (1/2/4-bit gray scaled to 8 bits first). Not a PNG, truncated,
 * corrupt, or over 2^28 pixels: NULL with an error naming the file. */
ts_tensor *ts_png_read(ts_ctx *ctx, const char *path);
/* img (C, H, W), C 1 or 3, any float dtype, values in [0, 1] -> an 8-bit
 * gray or RGB PNG, each value clamped to [0, 1] and rounded as
 * Diffusers/PIL do ((x * 255).round(), half to even; NaN -> 0). Written
 * atomically (a temporary file renamed over path). */
ts_status ts_png_write(ts_ctx *ctx, const char *path, ts_tensor *img);
/* As ts_png_write, into memory: *out (malloc'd, the caller frees) holds
 * *n bytes of PNG file. */
ts_status ts_png_encode(ts_ctx *ctx, ts_tensor *img, unsigned char **out,
                        size_t *n);

/* NumPy .npy (format 1.0, 2.0, 3.0), C order, little-endian: '<f4' -> f32,
 * '<f8' and '<f2' -> f32 (converted), '<i8' -> i64, '<i4' -> i32; 0-d to
 * TS_MAX_DIMS dims. fortran_order True, another dtype (named), a bad magic
 * or a short file: NULL with an error naming the file and the fault. */
ts_tensor *ts_npy_read(ts_ctx *ctx, const char *path);
/* t as '<f4' (f32; bf16 and f16 converted to f32), '<i8' (i64) or '<i4'
 * (i32), format 1.0 (2.0 when the header needs it), written atomically. */
ts_status ts_npy_write(ts_ctx *ctx, const char *path, ts_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
