/* config.c — Hugging Face config.json into ts_model_config for every
 * supported causal LM family. One table (families[]) holds what differs
 * between them: per family its model_type, its architectures class names
 * and its rows, each either a config.json field it reads (Hugging Face's
 * name and default, whether it is required) or a description value no
 * field sets. The code below walks rows and knows no family by name.
 * Errors name the file, the field and the family. Owns nothing after it
 * returns. */
#include "tessera_gguf.h" /* ts_config_from_json_text */
#include "tessera_io.h"

#include "core/core.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* What each size may be: from 1 to hi, so that no product of them
 * (vocab x hidden, heads x head_dim x hidden, ...) nor its bytes can
 * overflow 64 bits, token ids and positions fit 32 bits, and layers stay
 * under the models' limit. */
#define MAX_VOCAB     2147483647ll
#define MAX_HIDDEN    1048576ll
#define MAX_LAYERS    4096ll
#define MAX_HEADS     4096ll
#define MAX_HEAD_DIM  4096ll
#define MAX_FFN       16777216ll
#define MAX_POSITIONS 2147483647ll
#define MAX_EXPERTS   65536ll
#define MAX_THETA     1e15

/* ---- the family table ------------------------------------------------ */

/* What a row fills. Rows without a key are fixed description values. */
typedef enum {
    K_END = 0,
    K_SIZE,        /* int64 >= 0; zero in a preset */
    K_INT,         /* int64 >= 0 */
    K_INT32,       /* int >= 0 (sliding_pattern) */
    K_NUM,         /* double */
    K_BOOL,        /* bool */
    K_ENUM,        /* fixed only: an enum (int) */
    K_ACT,         /* "silu", "gelu_new", ... -> ts_act */
    K_INV_SQRT,    /* q > 0 -> q^-0.5 (Gemma's query_pre_attn_scalar) */
    K_LAYERS,      /* a list of layer indices -> dense_layers */
    K_LAYER_TYPES, /* "sliding_attention" | "full_attention" per layer */
    K_ROPE,        /* the rope_scaling object, or null */
    K_ONLY,        /* a number or bool of which only def is supported */
} row_kind;

enum {
    REQUIRED = 1,  /* absent: an error naming it and the family */
    NULL_NONE = 2, /* null: 0 (none), where absent is the default */
};

/* defaults computed from fields read before */
typedef enum {
    D_VALUE = 0,
    D_HEADS,           /* num_attention_heads */
    D_KV_HEADS,        /* heads when the config gives them, else def: HF's
                          literal defaults (Qwen 32, Gemma 4, Mistral 8) only
                          fit their own default head count; llama and phi3
                          say None -> heads */
    D_HIDDEN_PER_HEAD, /* hidden / heads */
    D_4_HIDDEN,        /* GPT-2's n_inner */
} row_default;

/* what ts_config_load fills: the config, and fields that only shape it */
typedef struct {
    ts_model_config c;
    bool use_sliding_window;        /* Qwen: false drops sliding_window */
    bool scale_attn_weights;        /* GPT-2: false leaves scores unscaled */
    int64_t original_max_positions; /* Phi-3's top-level field (0: none) */
    bool heads_given;
    json_t *rope_scaling, *layer_types;
    char rope_key[48]; /* where rope_scaling came from, for messages */
} parsed;

typedef struct {
    const char *key; /* config.json's name; NULL: a fixed value */
    row_kind kind;
    size_t off;  /* into parsed */
    size_t also; /* offsetof + 1 of a second target (0: none) */
    unsigned flags;
    double def; /* HF's default (for K_ACT, K_ENUM: the enum value) */
    row_default from;
} row;

#define C(m)    offsetof(parsed, c.m)
#define ALSO(m) (offsetof(parsed, c.m) + 1)
#define P(m)    offsetof(parsed, m)
#define SIZE(k, m, fl, d)                                                      \
    { .key = k, .kind = K_SIZE, .off = C(m), .flags = fl, .def = d }
#define SIZE_FROM(k, m, from_, d)                                              \
    { .key = k, .kind = K_SIZE, .off = C(m), .def = d, .from = from_ }
#define INT(k, m, fl, d)                                                       \
    { .key = k, .kind = K_INT, .off = C(m), .flags = fl, .def = d }
#define NUM(k, m, fl, d)                                                       \
    { .key = k, .kind = K_NUM, .off = C(m), .flags = fl, .def = d }
#define BOOL(k, m, d)                                                          \
    { .key = k, .kind = K_BOOL, .off = C(m), .def = d }
#define ACT(k, d)                                                              \
    { .key = k, .kind = K_ACT, .off = C(act), .def = d }
#define ROPE                                                                   \
    { .key = "rope_scaling", .kind = K_ROPE, .off = P(rope_scaling) }
#define ONLY(k, d)                                                             \
    { .key = k, .kind = K_ONLY, .def = d }
#define FIX(kd, m, v)                                                          \
    { .kind = kd, .off = C(m), .def = v }
#define FIX_FROM(m, from_)                                                     \
    { .kind = K_SIZE, .off = C(m), .from = from_ }
#define END                                                                    \
    { .kind = K_END }

/* Llama 1/2/3/3.1/3.2 (LlamaConfig) */
static const row llama_rows[] = {
    SIZE("vocab_size", vocab, REQUIRED, 32000),
    SIZE("hidden_size", hidden, REQUIRED, 4096),
    SIZE("num_hidden_layers", layers, REQUIRED, 32),
    SIZE("num_attention_heads", heads, REQUIRED, 32),
    SIZE_FROM("num_key_value_heads", kv_heads, D_KV_HEADS, 32),
    SIZE_FROM("head_dim", head_dim, D_HIDDEN_PER_HEAD, 0),
    SIZE("intermediate_size", intermediate, REQUIRED, 11008),
    SIZE("max_position_embeddings", max_positions, 0, 2048),
    NUM("rms_norm_eps", norm_eps, 0, 1e-6),
    NUM("rope_theta", rope_theta, 0, 10000),
    ROPE,
    ACT("hidden_act", TS_ACT_SILU),
    {.key = "attention_bias",
     .kind = K_BOOL,
     .off = C(attention_bias),
     .also = ALSO(o_bias)},
    BOOL("mlp_bias", mlp_bias, false),
    BOOL("tie_word_embeddings", tie_word_embeddings, false),
    FIX(K_ENUM, norm, TS_NORM_RMS),
    FIX(K_ENUM, pos, TS_POS_ROPE),
    FIX(K_BOOL, gated, true),
    END};

/* Qwen2 / Qwen2.5 (Qwen2Config): biases on q, k and v, none on o */
static const row qwen2_rows[] = {
    SIZE("vocab_size", vocab, REQUIRED, 151936),
    SIZE("hidden_size", hidden, REQUIRED, 4096),
    SIZE("num_hidden_layers", layers, REQUIRED, 32),
    SIZE("num_attention_heads", heads, REQUIRED, 32),
    SIZE_FROM("num_key_value_heads", kv_heads, D_KV_HEADS, 32),
    SIZE_FROM("head_dim", head_dim, D_HIDDEN_PER_HEAD, 0),
    SIZE("intermediate_size", intermediate, REQUIRED, 22016),
    SIZE("max_position_embeddings", max_positions, 0, 32768),
    NUM("rms_norm_eps", norm_eps, 0, 1e-6),
    NUM("rope_theta", rope_theta, 0, 10000),
    ROPE,
    ACT("hidden_act", TS_ACT_SILU),
    BOOL("tie_word_embeddings", tie_word_embeddings, false),
    {.key = "use_sliding_window", .kind = K_BOOL, .off = P(use_sliding_window)},
    INT("sliding_window", sliding_window, NULL_NONE, 4096),
    INT("max_window_layers", sliding_from, 0, 28),
    {.key = "layer_types", .kind = K_LAYER_TYPES, .off = P(layer_types)},
    FIX(K_BOOL, attention_bias, true),
    FIX(K_ENUM, norm, TS_NORM_RMS),
    FIX(K_ENUM, pos, TS_POS_ROPE),
    FIX(K_BOOL, gated, true),
    END};

/* Qwen3 (Qwen3Config): q/k norms, head_dim 128 unless given */
static const row qwen3_rows[] = {
    SIZE("vocab_size", vocab, REQUIRED, 151936),
    SIZE("hidden_size", hidden, REQUIRED, 4096),
    SIZE("num_hidden_layers", layers, REQUIRED, 32),
    SIZE("num_attention_heads", heads, REQUIRED, 32),
    SIZE_FROM("num_key_value_heads", kv_heads, D_KV_HEADS, 32),
    SIZE("head_dim", head_dim, 0, 128),
    SIZE("intermediate_size", intermediate, REQUIRED, 22016),
    SIZE("max_position_embeddings", max_positions, 0, 32768),
    NUM("rms_norm_eps", norm_eps, 0, 1e-6),
    NUM("rope_theta", rope_theta, 0, 10000),
    ROPE,
    ACT("hidden_act", TS_ACT_SILU),
    {.key = "attention_bias",
     .kind = K_BOOL,
     .off = C(attention_bias),
     .also = ALSO(o_bias)},
    BOOL("tie_word_embeddings", tie_word_embeddings, false),
    {.key = "use_sliding_window", .kind = K_BOOL, .off = P(use_sliding_window)},
    INT("sliding_window", sliding_window, NULL_NONE, 4096),
    INT("max_window_layers", sliding_from, 0, 28),
    {.key = "layer_types", .kind = K_LAYER_TYPES, .off = P(layer_types)},
    FIX(K_BOOL, qk_norm, true),
    FIX(K_ENUM, norm, TS_NORM_RMS),
    FIX(K_ENUM, pos, TS_POS_ROPE),
    FIX(K_BOOL, gated, true),
    END};

/* GPT-2 (GPT2Config): LayerNorm with biases, learned positions, one
 * c_attn (q, k, v) and Conv1D matrices, biases everywhere, tied head */
static const row gpt2_rows[] = {
    SIZE("vocab_size", vocab, REQUIRED, 50257),
    SIZE("n_embd", hidden, REQUIRED, 768),
    SIZE("n_layer", layers, REQUIRED, 12),
    SIZE("n_head", heads, REQUIRED, 12),
    FIX_FROM(kv_heads, D_HEADS),
    FIX_FROM(head_dim, D_HIDDEN_PER_HEAD),
    SIZE_FROM("n_inner", intermediate, D_4_HIDDEN, 0),
    SIZE("n_positions", max_positions, REQUIRED, 1024),
    NUM("layer_norm_epsilon", norm_eps, 0, 1e-5),
    ACT("activation_function", TS_ACT_GELU_TANH),
    BOOL("tie_word_embeddings", tie_word_embeddings, true),
    {.key = "scale_attn_weights",
     .kind = K_BOOL,
     .off = P(scale_attn_weights),
     .def = true},
    ONLY("scale_attn_by_inverse_layer_idx", false),
    FIX(K_ENUM, norm, TS_NORM_LAYER),
    FIX(K_ENUM, pos, TS_POS_LEARNED),
    FIX(K_BOOL, attention_bias, true),
    FIX(K_BOOL, o_bias, true),
    FIX(K_BOOL, fused_qkv, true),
    FIX(K_BOOL, mlp_bias, true),
    FIX(K_BOOL, conv1d, true),
    FIX(K_BOOL, gated, false),
    END};

/* Mistral (MistralConfig): Llama with a sliding window on every layer
 * (null: none) */
static const row mistral_rows[] = {
    SIZE("vocab_size", vocab, REQUIRED, 32000),
    SIZE("hidden_size", hidden, REQUIRED, 4096),
    SIZE("num_hidden_layers", layers, REQUIRED, 32),
    SIZE("num_attention_heads", heads, REQUIRED, 32),
    SIZE_FROM("num_key_value_heads", kv_heads, D_KV_HEADS, 8),
    SIZE_FROM("head_dim", head_dim, D_HIDDEN_PER_HEAD, 0),
    SIZE("intermediate_size", intermediate, REQUIRED, 14336),
    SIZE("max_position_embeddings", max_positions, 0, 131072),
    NUM("rms_norm_eps", norm_eps, 0, 1e-6),
    NUM("rope_theta", rope_theta, 0, 10000),
    ROPE,
    ACT("hidden_act", TS_ACT_SILU),
    INT("sliding_window", sliding_window, NULL_NONE, 4096),
    BOOL("tie_word_embeddings", tie_word_embeddings, false),
    FIX(K_ENUM, norm, TS_NORM_RMS),
    FIX(K_ENUM, pos, TS_POS_ROPE),
    FIX(K_BOOL, gated, true),
    END};

/* Gemma 2 (Gemma2Config): norms x (1 + w) before and after attention and
 * MLP, embeddings x sqrt(hidden), GeGLU, query_pre_attn_scalar, soft caps,
 * a sliding window on even layers, tied head */
static const row gemma2_rows[] = {
    SIZE("vocab_size", vocab, REQUIRED, 256000),
    SIZE("hidden_size", hidden, REQUIRED, 2304),
    SIZE("num_hidden_layers", layers, REQUIRED, 26),
    SIZE("num_attention_heads", heads, REQUIRED, 8),
    SIZE_FROM("num_key_value_heads", kv_heads, D_KV_HEADS, 4),
    SIZE("head_dim", head_dim, 0, 256),
    SIZE("intermediate_size", intermediate, REQUIRED, 9216),
    SIZE("max_position_embeddings", max_positions, 0, 8192),
    NUM("rms_norm_eps", norm_eps, 0, 1e-6),
    NUM("rope_theta", rope_theta, 0, 10000),
    ROPE,
    ACT("hidden_activation", TS_ACT_GELU_TANH),
    {.key = "attention_bias",
     .kind = K_BOOL,
     .off = C(attention_bias),
     .also = ALSO(o_bias)},
    {.key = "query_pre_attn_scalar",
     .kind = K_INV_SQRT,
     .off = C(attn_scale),
     .def = 256},
    INT("sliding_window", sliding_window, NULL_NONE, 4096),
    {.key = "layer_types", .kind = K_LAYER_TYPES, .off = P(layer_types)},
    NUM("attn_logit_softcapping", attn_softcap, NULL_NONE, 50),
    NUM("final_logit_softcapping", final_softcap, NULL_NONE, 30),
    BOOL("tie_word_embeddings", tie_word_embeddings, true),
    ONLY("use_bidirectional_attention", false),
    FIX(K_INT32, sliding_pattern, 2),
    FIX(K_ENUM, norm, TS_NORM_RMS_1P),
    FIX(K_BOOL, sandwich_norm, true),
    FIX(K_BOOL, embed_scale, true),
    FIX(K_ENUM, pos, TS_POS_ROPE),
    FIX(K_BOOL, gated, true),
    END};

/* Gemma 3 text (Gemma3TextConfig): Gemma 2 with q/k norms, no soft caps
 * by default, five sliding layers (their own rope base) to one global */
static const row gemma3_rows[] = {
    SIZE("vocab_size", vocab, REQUIRED, 262208),
    SIZE("hidden_size", hidden, REQUIRED, 2304),
    SIZE("num_hidden_layers", layers, REQUIRED, 26),
    SIZE("num_attention_heads", heads, REQUIRED, 8),
    SIZE_FROM("num_key_value_heads", kv_heads, D_KV_HEADS, 4),
    SIZE("head_dim", head_dim, 0, 256),
    SIZE("intermediate_size", intermediate, REQUIRED, 9216),
    SIZE("max_position_embeddings", max_positions, 0, 131072),
    NUM("rms_norm_eps", norm_eps, 0, 1e-6),
    NUM("rope_theta", rope_theta, 0, 1000000),
    NUM("rope_local_base_freq", rope_local_theta, 0, 10000),
    ROPE,
    ACT("hidden_activation", TS_ACT_GELU_TANH),
    {.key = "attention_bias",
     .kind = K_BOOL,
     .off = C(attention_bias),
     .also = ALSO(o_bias)},
    {.key = "query_pre_attn_scalar",
     .kind = K_INV_SQRT,
     .off = C(attn_scale),
     .def = 256},
    INT("sliding_window", sliding_window, NULL_NONE, 4096),
    {.key = "sliding_window_pattern",
     .kind = K_INT32,
     .off = C(sliding_pattern),
     .def = 6},
    {.key = "layer_types", .kind = K_LAYER_TYPES, .off = P(layer_types)},
    NUM("attn_logit_softcapping", attn_softcap, NULL_NONE, 0),
    NUM("final_logit_softcapping", final_softcap, NULL_NONE, 0),
    BOOL("tie_word_embeddings", tie_word_embeddings, true),
    ONLY("use_bidirectional_attention", false),
    FIX(K_BOOL, qk_norm, true),
    FIX(K_ENUM, norm, TS_NORM_RMS_1P),
    FIX(K_BOOL, sandwich_norm, true),
    FIX(K_BOOL, embed_scale, true),
    FIX(K_ENUM, pos, TS_POS_ROPE),
    FIX(K_BOOL, gated, true),
    END};

/* Phi-3 (Phi3Config): one qkv_proj, one gate_up_proj (gate rows first),
 * longrope scaling with original_max_position_embeddings at the top */
static const row phi3_rows[] = {
    SIZE("vocab_size", vocab, REQUIRED, 32064),
    SIZE("hidden_size", hidden, REQUIRED, 3072),
    SIZE("num_hidden_layers", layers, REQUIRED, 32),
    SIZE("num_attention_heads", heads, REQUIRED, 32),
    SIZE_FROM("num_key_value_heads", kv_heads, D_KV_HEADS, 32),
    SIZE_FROM("head_dim", head_dim, D_HIDDEN_PER_HEAD, 0),
    SIZE("intermediate_size", intermediate, REQUIRED, 8192),
    SIZE("max_position_embeddings", max_positions, 0, 4096),
    {.key = "original_max_position_embeddings",
     .kind = K_INT,
     .off = P(original_max_positions),
     .def = 4096},
    NUM("rms_norm_eps", norm_eps, 0, 1e-5),
    NUM("rope_theta", rope_theta, 0, 10000),
    ROPE,
    ONLY("partial_rotary_factor", 1),
    ACT("hidden_act", TS_ACT_SILU),
    INT("sliding_window", sliding_window, NULL_NONE, 0),
    BOOL("tie_word_embeddings", tie_word_embeddings, false),
    FIX(K_BOOL, fused_qkv, true),
    FIX(K_BOOL, fused_gate_up, true),
    FIX(K_ENUM, norm, TS_NORM_RMS),
    FIX(K_ENUM, pos, TS_POS_ROPE),
    FIX(K_BOOL, gated, true),
    END};

/* Qwen3-MoE (Qwen3MoeConfig): Qwen3 attention; experts on layer i when
 * (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers */
static const row qwen3_moe_rows[] = {
    SIZE("vocab_size", vocab, REQUIRED, 151936),
    SIZE("hidden_size", hidden, REQUIRED, 2048),
    SIZE("num_hidden_layers", layers, REQUIRED, 24),
    SIZE("num_attention_heads", heads, REQUIRED, 32),
    SIZE_FROM("num_key_value_heads", kv_heads, D_KV_HEADS, 4),
    SIZE_FROM("head_dim", head_dim, D_HIDDEN_PER_HEAD, 0),
    SIZE("intermediate_size", intermediate, REQUIRED, 6144),
    SIZE("max_position_embeddings", max_positions, 0, 32768),
    NUM("rms_norm_eps", norm_eps, 0, 1e-6),
    NUM("rope_theta", rope_theta, 0, 10000),
    ROPE,
    ACT("hidden_act", TS_ACT_SILU),
    {.key = "attention_bias",
     .kind = K_BOOL,
     .off = C(attention_bias),
     .also = ALSO(o_bias)},
    BOOL("tie_word_embeddings", tie_word_embeddings, false),
    {.key = "use_sliding_window", .kind = K_BOOL, .off = P(use_sliding_window)},
    INT("sliding_window", sliding_window, NULL_NONE, 4096),
    INT("max_window_layers", sliding_from, 0, 28),
    SIZE("num_experts", n_experts, REQUIRED, 128),
    SIZE("num_experts_per_tok", experts_per_tok, REQUIRED, 8),
    SIZE("moe_intermediate_size", moe_intermediate, REQUIRED, 768),
    BOOL("norm_topk_prob", norm_topk_prob, false),
    NUM("router_aux_loss_coef", router_aux_loss_coef, 0, 0.001),
    INT("decoder_sparse_step", moe_step, 0, 1),
    {.key = "mlp_only_layers", .kind = K_LAYERS, .off = C(dense_layers)},
    FIX(K_BOOL, qk_norm, true),
    FIX(K_ENUM, norm, TS_NORM_RMS),
    FIX(K_ENUM, pos, TS_POS_ROPE),
    FIX(K_BOOL, gated, true),
    END};

/* Mixtral (MixtralConfig): Mistral with experts on every layer, each of
 * intermediate_size; top-k weights always renormalized */
static const row mixtral_rows[] = {
    SIZE("vocab_size", vocab, REQUIRED, 32000),
    SIZE("hidden_size", hidden, REQUIRED, 4096),
    SIZE("num_hidden_layers", layers, REQUIRED, 32),
    SIZE("num_attention_heads", heads, REQUIRED, 32),
    SIZE_FROM("num_key_value_heads", kv_heads, D_KV_HEADS, 8),
    SIZE_FROM("head_dim", head_dim, D_HIDDEN_PER_HEAD, 0),
    {.key = "intermediate_size",
     .kind = K_SIZE,
     .off = C(intermediate),
     .also = ALSO(moe_intermediate),
     .flags = REQUIRED,
     .def = 14336},
    SIZE("max_position_embeddings", max_positions, 0, 131072),
    NUM("rms_norm_eps", norm_eps, 0, 1e-5),
    NUM("rope_theta", rope_theta, 0, 1000000),
    ROPE,
    ACT("hidden_act", TS_ACT_SILU),
    INT("sliding_window", sliding_window, NULL_NONE, 0),
    SIZE("num_local_experts", n_experts, REQUIRED, 8),
    SIZE("num_experts_per_tok", experts_per_tok, REQUIRED, 2),
    NUM("router_aux_loss_coef", router_aux_loss_coef, 0, 0.001),
    BOOL("tie_word_embeddings", tie_word_embeddings, false),
    FIX(K_BOOL, norm_topk_prob, true),
    FIX(K_INT, moe_step, 1),
    FIX(K_ENUM, norm, TS_NORM_RMS),
    FIX(K_ENUM, pos, TS_POS_ROPE),
    FIX(K_BOOL, gated, true),
    END};

typedef struct {
    ts_arch arch;
    const char *model_type;
    const char *classes[2]; /* architectures entries */
    const row *rows;
    bool yarn_means_longrope; /* Phi-3 reads "su" and "yarn" as longrope */
} family;

/* in ts_arch order */
static const family families[TS_ARCH_COUNT] = {
    {TS_ARCH_QWEN3, "qwen3", {"Qwen3ForCausalLM"}, qwen3_rows, false},
    {TS_ARCH_QWEN2, "qwen2", {"Qwen2ForCausalLM"}, qwen2_rows, false},
    {TS_ARCH_LLAMA, "llama", {"LlamaForCausalLM"}, llama_rows, false},
    {TS_ARCH_GPT2, "gpt2", {"GPT2LMHeadModel"}, gpt2_rows, false},
    {TS_ARCH_MISTRAL, "mistral", {"MistralForCausalLM"}, mistral_rows, false},
    {TS_ARCH_GEMMA2, "gemma2", {"Gemma2ForCausalLM"}, gemma2_rows, false},
    {TS_ARCH_GEMMA3, "gemma3_text", {"Gemma3ForCausalLM"}, gemma3_rows, false},
    {TS_ARCH_PHI3, "phi3", {"Phi3ForCausalLM"}, phi3_rows, true},
    {TS_ARCH_QWEN3_MOE,
     "qwen3_moe",
     {"Qwen3MoeForCausalLM"},
     qwen3_moe_rows,
     false},
    {TS_ARCH_MIXTRAL, "mixtral", {"MixtralForCausalLM"}, mixtral_rows, false},
};

/* Configs that wrap a text model's config in a field: read that field
 * with the text family (Hugging Face's defaults fill what it leaves out,
 * as these sub-configs rely on them). */
static const struct {
    const char *model_type, *class_name, *field;
    ts_arch text;
} wrappers[] = {
    {"gemma3", "Gemma3ForConditionalGeneration", "text_config", TS_ARCH_GEMMA3},
};

const char *ts_arch_name(ts_arch a) {
    return (unsigned)a < TS_ARCH_COUNT ? families[a].model_type : "unknown";
}

/* "qwen3, qwen2, ..., gemma3_text, gemma3 (its text_config), ..." */
static const char *supported_list(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < TS_ARCH_COUNT && n < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "",
                              families[i].model_type);
        for (size_t w = 0; w < sizeof wrappers / sizeof *wrappers && n < cap;
             w++)
            if (wrappers[w].text == families[i].arch)
                n +=
                    (size_t)snprintf(buf + n, cap - n, ", %s (its %s)",
                                     wrappers[w].model_type, wrappers[w].field);
    }
    return buf;
}

/* ---- reading ---------------------------------------------------------- */

typedef struct {
    ts_ctx *ctx;
    const char *path;   /* the file, for messages */
    const char *family; /* its model type, for messages */
    const char *prefix; /* "", "text_config.", "rope_scaling." */
    json_t *root;
    bool lenient; /* required fields take HF's defaults (sub-configs) */
    ts_status st;
} reader;

static json_t *value_of(const reader *r, const char *key) {
    json_t *v = json_object_get(r->root, key);
    return v && !json_is_null(v) ? v : NULL;
}

static void fail_type(reader *r, const char *key, const char *what) {
    if (!r->st)
        r->st = ts_set_error(r->ctx, TS_ERR_IO,
                             "%s: field \"%s%s\" must be %s (model type %s)",
                             r->path, r->prefix, key, what, r->family);
}

static void fail_missing(reader *r, const char *key) {
    if (!r->st)
        r->st = ts_set_error(r->ctx, TS_ERR_IO,
                             "%s: missing field \"%s%s\", which model type %s "
                             "requires",
                             r->path, r->prefix, key, r->family);
}

/* an integer >= 0 */
static int64_t get_int(reader *r, const char *key, bool required, int64_t def) {
    json_t *v = value_of(r, key);
    if (r->st)
        return def;
    if (!v) {
        if (required)
            fail_missing(r, key);
        return def;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        fail_type(r, key, "an integer >= 0");
        return def;
    }
    return json_integer_value(v);
}

static double get_num(reader *r, const char *key, bool required, double def) {
    json_t *v = value_of(r, key);
    if (r->st)
        return def;
    if (!v) {
        if (required)
            fail_missing(r, key);
        return def;
    }
    if (!json_is_number(v)) {
        fail_type(r, key, "a number");
        return def;
    }
    return json_number_value(v);
}

static bool get_bool(reader *r, const char *key, bool def) {
    json_t *v = value_of(r, key);
    if (r->st || !v)
        return def;
    if (!json_is_boolean(v)) {
        fail_type(r, key, "true or false");
        return def;
    }
    return json_is_true(v);
}

static const struct {
    const char *name;
    ts_act act;
} acts[] = {{"silu", TS_ACT_SILU},
            {"swish", TS_ACT_SILU},
            {"gelu", TS_ACT_GELU},
            {"gelu_new", TS_ACT_GELU_TANH},
            {"gelu_pytorch_tanh", TS_ACT_GELU_TANH},
            {"gelu_fast", TS_ACT_GELU_TANH}};

static ts_act get_act(reader *r, const char *key, ts_act def) {
    json_t *v = value_of(r, key);
    if (r->st || !v)
        return def;
    const char *s = json_string_value(v);
    if (!s) {
        fail_type(r, key, "a string");
        return def;
    }
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++)
        if (!strcmp(s, acts[i].name))
            return acts[i].act;
    r->st = ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                         "%s: %s%s \"%s\" is not supported (supported: silu, "
                         "swish, gelu, gelu_new, gelu_pytorch_tanh, gelu_fast)",
                         r->path, r->prefix, key, s);
    return def;
}

static void put_int(parsed *p, size_t off, int64_t v) {
    memcpy((char *)p + off, &v, sizeof v);
}
static void put_int32(parsed *p, size_t off, int v) {
    memcpy((char *)p + off, &v, sizeof v);
}
static void put_num(parsed *p, size_t off, double v) {
    memcpy((char *)p + off, &v, sizeof v);
}
static void put_bool(parsed *p, size_t off, bool v) {
    memcpy((char *)p + off, &v, sizeof v);
}
static int64_t int_at(const parsed *p, size_t off) {
    int64_t v;
    memcpy(&v, (const char *)p + off, sizeof v);
    return v;
}

_Static_assert(sizeof(ts_norm_kind) == sizeof(int) &&
                   sizeof(ts_pos_kind) == sizeof(int) &&
                   sizeof(ts_act) == sizeof(int),
               "K_ENUM and K_ACT rows write ints");

static double row_default_value(const row *f, const parsed *p) {
    const ts_model_config *c = &p->c;
    switch (f->from) {
    case D_HEADS:
        return (double)c->heads;
    case D_KV_HEADS:
        return p->heads_given ? (double)c->heads : f->def;
    case D_HIDDEN_PER_HEAD:
        return c->heads > 0 ? (double)(c->hidden / c->heads) : 0;
    case D_4_HIDDEN:
        return c->hidden <= MAX_HIDDEN ? 4.0 * (double)c->hidden : 0;
    default:
        return f->def;
    }
}

/* One row: its field read from r (or its default), written to p. */
static void read_row(reader *r, const row *f, parsed *p) {
    json_t *raw = f->key ? json_object_get(r->root, f->key) : NULL;
    bool null_none = raw && json_is_null(raw) && (f->flags & NULL_NONE);
    bool required = (f->flags & REQUIRED) && !r->lenient;
    double def = null_none ? 0 : row_default_value(f, p);
    switch (f->kind) {
    case K_SIZE:
    case K_INT: {
        int64_t v =
            f->key ? get_int(r, f->key, required, (int64_t)def) : (int64_t)def;
        put_int(p, f->off, v);
        if (f->also)
            put_int(p, f->also - 1, v);
        if (f->off == C(heads) && value_of(r, f->key))
            p->heads_given = true;
        break;
    }
    case K_INT32: {
        int64_t v =
            f->key ? get_int(r, f->key, required, (int64_t)def) : (int64_t)def;
        if (v > MAX_LAYERS && !r->st)
            r->st = ts_set_error(r->ctx, TS_ERR_RANGE,
                                 "%s: %s%s is %lld; allowed 0 to %lld", r->path,
                                 r->prefix, f->key, (long long)v, MAX_LAYERS);
        put_int32(p, f->off, (int)(v > MAX_LAYERS ? 0 : v));
        break;
    }
    case K_NUM:
        put_num(p, f->off, f->key ? get_num(r, f->key, required, def) : def);
        break;
    case K_BOOL: {
        bool v = f->key ? get_bool(r, f->key, def != 0) : def != 0;
        put_bool(p, f->off, v);
        if (f->also)
            put_bool(p, f->also - 1, v);
        break;
    }
    case K_ENUM:
        put_int32(p, f->off, (int)def);
        break;
    case K_ACT:
        put_int32(p, f->off, (int)get_act(r, f->key, (ts_act)(int)def));
        break;
    case K_INV_SQRT: {
        double q = get_num(r, f->key, required, def);
        if (!(q > 0) && !r->st)
            r->st = ts_set_error(r->ctx, TS_ERR_RANGE,
                                 "%s: %s%s is %g; allowed above 0", r->path,
                                 r->prefix, f->key, q);
        put_num(p, f->off, q > 0 ? 1.0 / sqrt(q) : 0);
        break;
    }
    case K_LAYERS: {
        json_t *v = value_of(r, f->key);
        if (r->st || !v)
            break;
        size_t n = json_array_size(v);
        if (!json_is_array(v) || n > TS_MAX_DENSE_LAYERS) {
            if (json_is_array(v))
                r->st = ts_set_error(
                    r->ctx, TS_ERR_UNSUPPORTED,
                    "%s: %s%s lists %zu layers; at most %d are supported",
                    r->path, r->prefix, f->key, n, TS_MAX_DENSE_LAYERS);
            else
                fail_type(r, f->key, "a list of layer indices");
            break;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *e = json_array_get(v, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0) {
                fail_type(r, f->key, "a list of layer indices (integers >= 0)");
                break;
            }
            p->c.dense_layers[i] = json_integer_value(e);
        }
        p->c.n_dense_layers = r->st ? 0 : (int)n;
        break;
    }
    case K_LAYER_TYPES:
    case K_ROPE: {
        json_t *v = value_of(r, f->key);
        bool ok =
            !v || (f->kind == K_ROPE ? json_is_object(v) : json_is_array(v));
        if (!ok)
            fail_type(r, f->key,
                      f->kind == K_ROPE ? "an object or null"
                                        : "a list of \"sliding_attention\" | "
                                          "\"full_attention\"");
        json_t **slot = (json_t **)(void *)((char *)p + f->off);
        *slot = ok ? v : NULL;
        break;
    }
    case K_ONLY: {
        json_t *v = value_of(r, f->key);
        if (r->st || !v)
            break;
        if (!json_is_boolean(v) && !json_is_number(v)) {
            fail_type(r, f->key, "a number or true/false");
            break;
        }
        bool same = json_is_boolean(v) ? json_is_true(v) == (f->def != 0)
                                       : json_number_value(v) == f->def;
        if (!same)
            r->st =
                ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                             "%s: %s%s other than %s is not supported "
                             "(model type %s)",
                             r->path, r->prefix, f->key,
                             json_is_boolean(v) ? (f->def ? "true" : "false")
                             : f->def == 1      ? "1"
                                                : "its default",
                             r->family);
        break;
    }
    case K_END:
        break;
    }
}

/* The name of the field a family reads into member off (for messages). */
static const char *field_name(const family *fam, size_t off,
                              const char *fallback) {
    for (const row *f = fam->rows; f->kind != K_END; f++)
        if (f->key && f->off == off)
            return f->key;
    return fallback;
}

/* ---- what a family's fields mean beyond their values ------------------ */

/* Gemma 3's sliding_window_pattern as Hugging Face reads it (layer i
 * slides iff (i + 1) % pattern != 0: 1 means no sliding layer, 0 is no
 * pattern at all); Mixtral's layers are always sparse; biases on a fused
 * gate_up projection are refused by name. */
static void apply_family_rules(reader *r, parsed *p) {
    ts_model_config *c = &p->c;
    if (r->st)
        return;
    if (c->arch == TS_ARCH_GEMMA3 && !p->layer_types) {
        if (c->sliding_pattern == 0)
            r->st = ts_set_error(r->ctx, TS_ERR_IO,
                                 "%s: %ssliding_window_pattern is 0 (want >= "
                                 "1: every n-th layer is global)",
                                 r->path, r->prefix);
        else if (c->sliding_pattern == 1)
            c->sliding_window = 0; /* every layer global */
    }
    if (!r->st && c->arch == TS_ARCH_MIXTRAL && c->n_experts < 1)
        r->st = ts_set_error(r->ctx, TS_ERR_IO,
                             "%s: %snum_local_experts is %lld (a Mixtral "
                             "layer is always sparse: want >= 1)",
                             r->path, r->prefix, (long long)c->n_experts);
    if (!r->st && c->gated && c->fused_gate_up && c->mlp_bias)
        r->st = ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                             "%s: %smlp_bias true with a fused gate_up_proj "
                             "is not supported",
                             r->path, r->prefix);
}

/* ---- layer_types -> sliding_from, sliding_pattern ---------------------- */

/* Layer i slides iff i >= from and (pattern < 2 or (i + 1) % pattern):
 * the list must be one of those. */
static void apply_layer_types(reader *r, parsed *p) {
    json_t *lt = p->layer_types;
    ts_model_config *c = &p->c;
    if (r->st || !lt)
        return;
    int64_t L = c->layers;
    if ((int64_t)json_array_size(lt) != L) {
        r->st =
            ts_set_error(r->ctx, TS_ERR_IO,
                         "%s: %slayer_types has %zu entries; "
                         "num_hidden_layers is %lld",
                         r->path, r->prefix, json_array_size(lt), (long long)L);
        return;
    }
    int64_t first = -1, n_sliding = 0;
    for (int64_t i = 0; i < L; i++) {
        const char *s = json_string_value(json_array_get(lt, (size_t)i));
        bool sliding = s && !strcmp(s, "sliding_attention");
        if (!sliding && !(s && !strcmp(s, "full_attention"))) {
            r->st =
                ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                             "%s: %slayer_types[%lld] is %s%s%s; supported: "
                             "\"sliding_attention\", \"full_attention\"",
                             r->path, r->prefix, (long long)i, s ? "\"" : "",
                             s ? s : "not a string", s ? "\"" : "");
            return;
        }
        if (sliding && first < 0)
            first = i;
        n_sliding += sliding;
    }
    if (c->sliding_window == 0) /* no window: every layer attends to all */
        return;
    if (n_sliding == 0) {
        c->sliding_window = 0;
        return;
    }
    /* pattern 0: every layer from first on */
    for (int64_t pattern = 0; pattern <= L; pattern += pattern ? 1 : 2) {
        bool fits = true;
        for (int64_t i = 0; i < L && fits; i++) {
            bool want = i >= first && (pattern < 2 || (i + 1) % pattern != 0);
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            fits = want == !strcmp(s, "sliding_attention");
        }
        if (fits) {
            c->sliding_from = first, c->sliding_pattern = (int)pattern;
            return;
        }
    }
    char list[160];
    size_t n = 0;
    for (int64_t i = 0; i < L && n + 8 < sizeof list; i++) {
        const char *s = json_string_value(json_array_get(lt, (size_t)i));
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%c", i ? " " : "",
                              s[0] == 's' ? 'S' : 'F');
    }
    r->st = ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                         "%s: %slayer_types (S sliding, F full: %s%s) is not "
                         "supported: sliding layers must be every layer from "
                         "a first one on, but for every n-th",
                         r->path, r->prefix, list,
                         n + 8 >= sizeof list ? " ..." : "");
}

/* ---- rope_scaling ------------------------------------------------------ */

static const char rope_types[] = "default, linear, llama3, longrope (or su), "
                                 "yarn";

static bool get_factor_list(reader *q, const char *key, double *out, int n) {
    json_t *v = value_of(q, key);
    if (q->st)
        return false;
    if (!v) {
        fail_missing(q, key);
        return false;
    }
    if (!json_is_array(v)) {
        fail_type(q, key, "a list of numbers");
        return false;
    }
    if ((int64_t)json_array_size(v) != n) {
        q->st = ts_set_error(q->ctx, TS_ERR_IO,
                             "%s: %s%s has %zu entries; head_dim / 2 = %d "
                             "are needed",
                             q->path, q->prefix, key, json_array_size(v), n);
        return false;
    }
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        if (!json_is_number(e) || !(json_number_value(e) > 0)) {
            q->st = ts_set_error(q->ctx, TS_ERR_RANGE,
                                 "%s: %s%s[%d] must be a number above 0",
                                 q->path, q->prefix, key, i);
            return false;
        }
        out[i] = json_number_value(e);
    }
    return true;
}

/* yarn's mscale: 0.1 m ln(s) + 1 above s = 1 */
static double yarn_mscale(double s, double m) {
    return s <= 1 ? 1.0 : 0.1 * m * log(s) + 1.0;
}

static void apply_rope_scaling(reader *r, const family *fam, parsed *p) {
    ts_model_config *c = &p->c;
    json_t *rs = p->rope_scaling;
    if (r->st || !rs)
        return;
    reader q = *r;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s%s.", r->prefix, p->rope_key);
    q.prefix = prefix, q.root = rs, q.lenient = false;
    json_t *tv = value_of(&q, "rope_type");
    if (!tv)
        tv = value_of(&q, "type");
    const char *type = json_string_value(tv);
    if (!tv && !strncmp(p->rope_key, "rope_parameters", 15))
        return; /* transformers 5: no type is the default rope */
    if (!tv) {
        r->st = ts_set_error(r->ctx, TS_ERR_IO,
                             "%s: %s%s has no \"rope_type\" (or \"type\"); "
                             "supported: %s",
                             r->path, r->prefix, p->rope_key, rope_types);
        return;
    }
    if (!type) {
        fail_type(&q, "rope_type", "a string");
        r->st = q.st;
        return;
    }
    if (!strcmp(type, "su") ||
        (fam->yarn_means_longrope && !strcmp(type, "yarn")))
        type = "longrope";
    if (!strcmp(type, "default")) {
        c->rope = TS_ROPE_DEFAULT;
    } else if (!strcmp(type, "linear")) {
        c->rope = TS_ROPE_LINEAR;
        c->rope_factor = get_num(&q, "factor", true, 1);
    } else if (!strcmp(type, "llama3")) {
        c->rope = TS_ROPE_LLAMA3;
        c->rope_factor = get_num(&q, "factor", true, 8);
        c->rope_low_freq_factor = get_num(&q, "low_freq_factor", true, 1);
        c->rope_high_freq_factor = get_num(&q, "high_freq_factor", true, 4);
        c->rope_original_max_positions =
            get_int(&q, "original_max_position_embeddings", true, 8192);
        if (!q.st && !(c->rope_high_freq_factor > c->rope_low_freq_factor))
            q.st = ts_set_error(r->ctx, TS_ERR_RANGE,
                                "%s: %shigh_freq_factor (%g) must be above "
                                "low_freq_factor (%g)",
                                r->path, prefix, c->rope_high_freq_factor,
                                c->rope_low_freq_factor);
    } else if (!strcmp(type, "longrope")) {
        c->rope = TS_ROPE_LONGROPE;
        int n = (int)(c->head_dim / 2);
        if (c->head_dim / 2 > TS_ROPE_MAX_FACTORS) {
            r->st = ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                                 "%s: longrope with head_dim %lld; at most "
                                 "%d are supported",
                                 r->path, (long long)c->head_dim,
                                 2 * TS_ROPE_MAX_FACTORS);
            return;
        }
        c->rope_n_factors = n;
        get_factor_list(&q, "short_factor", c->rope_short_factor, n);
        get_factor_list(&q, "long_factor", c->rope_long_factor, n);
        /* Phi-3 keeps the pretrained length at the top level, and then the
         * factor is the ratio of the two lengths */
        int64_t orig = p->original_max_positions;
        double factor = 0;
        if (orig > 0)
            factor = (double)c->max_positions / (double)orig;
        else {
            orig = get_int(&q, "original_max_position_embeddings", false,
                           c->max_positions);
            factor =
                get_num(&q, "factor", false,
                        orig > 0 ? (double)c->max_positions / (double)orig : 1);
        }
        c->rope_original_max_positions = orig;
        c->rope_factor = factor;
        c->rope_attention_factor =
            get_num(&q, "attention_factor", false,
                    factor <= 1 || orig <= 1
                        ? 1.0
                        : sqrt(1 + log(factor) / log((double)orig)));
    } else if (!strcmp(type, "yarn")) {
        c->rope = TS_ROPE_YARN;
        c->rope_factor = get_num(&q, "factor", true, 1);
        c->rope_original_max_positions = get_int(
            &q, "original_max_position_embeddings", false, c->max_positions);
        c->rope_beta_fast = get_num(&q, "beta_fast", false, 32);
        c->rope_beta_slow = get_num(&q, "beta_slow", false, 1);
        double ms = get_num(&q, "mscale", false, 0);
        double ms_all = get_num(&q, "mscale_all_dim", false, 0);
        double f = c->rope_factor;
        c->rope_attention_factor = get_num(
            &q, "attention_factor", false,
            ms != 0 && ms_all != 0 ? yarn_mscale(f, ms) / yarn_mscale(f, ms_all)
                                   : yarn_mscale(f, 1));
        if (!get_bool(&q, "truncate", true) && !q.st)
            q.st = ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                                "%s: %struncate false is not supported",
                                r->path, prefix);
    } else {
        r->st = ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                             "%s: %s%s type \"%s\" is not supported "
                             "(supported: %s)",
                             r->path, r->prefix, p->rope_key, type, rope_types);
        return;
    }
    r->st = q.st;
}

/* transformers 5 writes rope_theta and rope_scaling as one
 * "rope_parameters" object; Gemma 3's holds one per layer type */
static void apply_rope_parameters(reader *r, parsed *p) {
    if (r->st || p->c.pos != TS_POS_ROPE || p->rope_scaling)
        return;
    json_t *rp = value_of(r, "rope_parameters");
    if (!rp)
        return;
    if (!json_is_object(rp)) {
        fail_type(r, "rope_parameters", "an object or null");
        return;
    }
    snprintf(p->rope_key, sizeof p->rope_key, "rope_parameters");
    json_t *full = json_object_get(rp, "full_attention");
    json_t *local = json_object_get(rp, "sliding_attention");
    reader q = *r;
    char prefix[96];
    q.prefix = prefix, q.lenient = false;
    if (json_is_object(local)) {
        snprintf(prefix, sizeof prefix, "%srope_parameters.sliding_attention.",
                 r->prefix);
        q.root = local;
        const char *type =
            json_string_value(json_object_get(local, "rope_type"));
        if (type && strcmp(type, "default"))
            q.st = ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                                "%s: %srope_type \"%s\" is not supported on "
                                "sliding layers (supported: default)",
                                r->path, prefix, type);
        double t = get_num(&q, "rope_theta", false, p->c.rope_local_theta);
        if (t != 0) /* the sliding layers' base, even when it equals the
                       full layers' */
            p->c.rope_local_theta = t;
    }
    if (json_is_object(full)) {
        rp = full;
        snprintf(p->rope_key, sizeof p->rope_key,
                 "rope_parameters.full_attention");
    }
    snprintf(prefix, sizeof prefix, "%s%s.", r->prefix, p->rope_key);
    q.root = rp;
    p->c.rope_theta = get_num(&q, "rope_theta", false, p->c.rope_theta);
    r->st = q.st;
    p->rope_scaling = rp;
}

/* ---- checks ------------------------------------------------------------ */

static ts_status range_error(reader *r, const char *name, long long v,
                             long long lo, long long hi) {
    return ts_set_error(r->ctx, TS_ERR_RANGE,
                        "%s: %s%s is %lld; allowed %lld to %lld", r->path,
                        r->prefix, name, v, lo, hi);
}

/* the sizes every other check relies on */
static ts_status check_sizes(reader *r, const family *fam, const parsed *p) {
    const ts_model_config *c = &p->c;
    const struct {
        size_t off;
        const char *name;
        int64_t lo, hi;
    } ints[] = {
        {C(vocab), "vocab_size", 1, MAX_VOCAB},
        {C(hidden), "hidden_size", 1, MAX_HIDDEN},
        {C(layers), "num_hidden_layers", 1, MAX_LAYERS},
        {C(heads), "num_attention_heads", 1, MAX_HEADS},
        {C(kv_heads), "num_key_value_heads", 1, MAX_HEADS},
        {C(head_dim), "head_dim", 1, MAX_HEAD_DIM},
        {C(intermediate), "intermediate_size", 1, MAX_FFN},
        {C(max_positions), "max_position_embeddings", 1, MAX_POSITIONS},
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        int64_t v = int_at(p, ints[i].off);
        if (v < ints[i].lo || v > ints[i].hi)
            return range_error(r, field_name(fam, ints[i].off, ints[i].name), v,
                               ints[i].lo, ints[i].hi);
    }
    if (!(c->norm_eps > 0 && c->norm_eps < 1))
        return ts_set_error(
            r->ctx, TS_ERR_RANGE, "%s: %s%s is %g; allowed above 0 and below 1",
            r->path, r->prefix, field_name(fam, C(norm_eps), "norm epsilon"),
            c->norm_eps);
    return TS_OK;
}

/* v above lo (lo_open) or from lo; finite (JSON has no inf, but 1e308
 * times a factor has) */
static ts_status check_num(reader *r, const char *name, double v, double lo,
                           bool lo_open) {
    if ((lo_open ? v > lo : v >= lo) && isfinite(v))
        return TS_OK;
    return ts_set_error(r->ctx, TS_ERR_RANGE, "%s: %s%s is %g; allowed %s %g",
                        r->path, r->prefix, name, v, lo_open ? "above" : "from",
                        lo);
}

/* the description: windows, rope, experts, soft caps */
static const char *rope_name(const parsed *p, const char *key, char *buf) {
    snprintf(buf, 96, "%s.%s", p->rope_key, key);
    return buf;
}

static ts_status check_description(reader *r, const family *fam,
                                   const parsed *p) {
    const ts_model_config *c = &p->c;
    char rn[96];
    ts_status s;
    if (c->sliding_window > MAX_POSITIONS)
        return range_error(r, "sliding_window", c->sliding_window, 0,
                           MAX_POSITIONS);
    if (c->sliding_from > MAX_POSITIONS)
        return range_error(r, field_name(fam, C(sliding_from), "sliding_from"),
                           c->sliding_from, 0, MAX_POSITIONS);
    if (c->pos == TS_POS_ROPE) {
        if (!(c->rope_theta > 0 && c->rope_theta <= MAX_THETA))
            return ts_set_error(r->ctx, TS_ERR_RANGE,
                                "%s: %srope_theta is %g; allowed above 0 up "
                                "to %g",
                                r->path, r->prefix, c->rope_theta, MAX_THETA);
        if (c->rope_local_theta != 0 &&
            !(c->rope_local_theta > 0 && c->rope_local_theta <= MAX_THETA))
            return ts_set_error(r->ctx, TS_ERR_RANGE,
                                "%s: %srope_local_base_freq is %g; allowed "
                                "above 0 up to %g",
                                r->path, r->prefix, c->rope_local_theta,
                                MAX_THETA);
    }
    if (c->rope != TS_ROPE_DEFAULT) {
        if ((s = check_num(r, rope_name(p, "factor", rn), c->rope_factor, 0,
                           true)))
            return s;
        if (c->rope != TS_ROPE_LINEAR &&
            (c->rope_original_max_positions < 1 ||
             c->rope_original_max_positions > MAX_POSITIONS))
            return range_error(
                r, rope_name(p, "original_max_position_embeddings", rn),
                c->rope_original_max_positions, 1, MAX_POSITIONS);
    }
    if (c->rope == TS_ROPE_LLAMA3 &&
        (s = check_num(r, rope_name(p, "low_freq_factor", rn),
                       c->rope_low_freq_factor, 0, true)))
        return s;
    if ((c->rope == TS_ROPE_LONGROPE || c->rope == TS_ROPE_YARN) &&
        (s = check_num(r, rope_name(p, "attention_factor", rn),
                       c->rope_attention_factor, 0, true)))
        return s;
    if (c->rope == TS_ROPE_YARN &&
        ((s = check_num(r, rope_name(p, "beta_fast", rn), c->rope_beta_fast, 0,
                        true)) ||
         (s = check_num(r, rope_name(p, "beta_slow", rn), c->rope_beta_slow, 0,
                        true))))
        return s;
    if ((s = check_num(r, "attn_logit_softcapping", c->attn_softcap, 0,
                       false)) ||
        (s = check_num(r, "final_logit_softcapping", c->final_softcap, 0,
                       false)))
        return s;
    if (c->n_experts > 0) {
        const char *ne = field_name(fam, C(n_experts), "num_experts");
        if (c->n_experts > MAX_EXPERTS)
            return range_error(r, ne, c->n_experts, 1, MAX_EXPERTS);
        if (c->experts_per_tok < 1 || c->experts_per_tok > c->n_experts)
            return ts_set_error(r->ctx, TS_ERR_RANGE,
                                "%s: %snum_experts_per_tok is %lld; allowed 1 "
                                "to %s (%lld)",
                                r->path, r->prefix,
                                (long long)c->experts_per_tok, ne,
                                (long long)c->n_experts);
        if (c->moe_intermediate < 1 || c->moe_intermediate > MAX_FFN)
            return range_error(
                r, field_name(fam, C(moe_intermediate), "intermediate_size"),
                c->moe_intermediate, 1, MAX_FFN);
        if (c->moe_step < 1 || c->moe_step > MAX_LAYERS)
            return range_error(r, field_name(fam, C(moe_step), "moe_step"),
                               c->moe_step, 1, MAX_LAYERS);
        for (int i = 0; i < c->n_dense_layers; i++)
            if (c->dense_layers[i] >= c->layers)
                return ts_set_error(r->ctx, TS_ERR_RANGE,
                                    "%s: %smlp_only_layers[%d] is %lld; "
                                    "layers are 0 to %lld",
                                    r->path, r->prefix, i,
                                    (long long)c->dense_layers[i],
                                    (long long)c->layers - 1);
        if ((s = check_num(r, "router_aux_loss_coef", c->router_aux_loss_coef,
                           0, false)))
            return s;
    }
    return TS_OK;
}

/* how the sizes fit together */
static ts_status check_shapes(reader *r, const family *fam,
                              const ts_model_config *c) {
    const char *bad =
        c->heads % c->kv_heads
            ? "num_key_value_heads (must divide num_attention_heads)"
        : c->pos == TS_POS_ROPE && c->head_dim % 2 ? "head_dim (must be even)"
                                                   : NULL;
    if (c->pos == TS_POS_LEARNED && c->head_dim * c->heads != c->hidden)
        bad = "n_embd (must be n_head x the head size)";
    (void)fam;
    return bad ? ts_set_error(r->ctx, TS_ERR_IO, "%s: invalid %s%s", r->path,
                              r->prefix, bad)
               : TS_OK;
}

/* ---- the whole reading ------------------------------------------------- */

/* Every row of fam, then what rows leave to the end: Qwen's
 * use_sliding_window, GPT-2's scale_attn_weights, layer_types, and
 * rope_scaling (they need the sizes). */
static void read_family(reader *r, const family *fam, parsed *p) {
    memset(p, 0, sizeof *p);
    p->use_sliding_window = true, p->scale_attn_weights = true;
    p->c.arch = fam->arch;
    snprintf(p->c.model_type, sizeof p->c.model_type, "%s", fam->model_type);
    p->c.rope = TS_ROPE_DEFAULT;
    snprintf(p->rope_key, sizeof p->rope_key, "rope_scaling");
    for (const row *f = fam->rows; f->kind != K_END && !r->st; f++)
        read_row(r, f, p);
    if (!p->use_sliding_window)
        p->c.sliding_window = 0;
    if (!p->scale_attn_weights)
        p->c.attn_scale = 1.0;
}

/* bos/eos: an integer or a list (the first); -1 when absent */
static int64_t get_token(const json_t *v) {
    if (json_is_array(v))
        v = json_array_get(v, 0);
    return json_is_integer(v) && json_integer_value(v) >= 0
               ? json_integer_value(v)
               : -1;
}

static ts_dtype get_dtype(const json_t *root) {
    const char *td = json_string_value(json_object_get(root, "dtype"));
    if (!td)
        td = json_string_value(json_object_get(root, "torch_dtype"));
    return td && !strcmp(td, "bfloat16")  ? TS_BF16
           : td && !strcmp(td, "float16") ? TS_F16
                                          : TS_F32;
}

/* which family: model_type, or without one the architectures entry;
 * a wrapper's index in *wrapper (else -1) */
static const family *find_family(reader *r, json_t *root, int *wrapper) {
    *wrapper = -1;
    json_t *mtv = json_object_get(root, "model_type");
    if (mtv && !json_is_string(mtv)) {
        fail_type(r, "model_type", "a string");
        return NULL;
    }
    const char *mt = json_string_value(mtv);
    json_t *arr = json_object_get(root, "architectures");
    const char *an =
        json_is_array(arr) ? json_string_value(json_array_get(arr, 0)) : NULL;
    for (int i = 0; i < TS_ARCH_COUNT; i++)
        for (int k = 0; k < 2; k++)
            if (mt ? !strcmp(mt, families[i].model_type) && k == 0
                   : an && families[i].classes[k] &&
                         !strcmp(an, families[i].classes[k]))
                return &families[i];
    for (size_t w = 0; w < sizeof wrappers / sizeof *wrappers; w++)
        if (mt ? !strcmp(mt, wrappers[w].model_type)
               : an && !strcmp(an, wrappers[w].class_name)) {
            *wrapper = (int)w;
            return &families[wrappers[w].text];
        }
    char list[512];
    supported_list(list, sizeof list);
    if (mt)
        r->st = ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                             "%s: model type \"%s\" is not supported "
                             "(supported: %s)",
                             r->path, mt, list);
    else if (an)
        r->st = ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                             "%s: architectures entry \"%s\" is not supported "
                             "and no model_type is given (supported model "
                             "types: %s)",
                             r->path, an, list);
    else
        r->st = ts_set_error(r->ctx, TS_ERR_UNSUPPORTED,
                             "%s: no model_type nor architectures entry; "
                             "say which model this is (supported model "
                             "types: %s)",
                             r->path, list);
    return NULL;
}

/* path's config.json as text (malloc'd, NUL-terminated), its file name
 * in file */
static ts_status load_text(ts_ctx *ctx, const char *path, char *file,
                           size_t cap, char **out) {
    *out = NULL;
    /* a folder without config.json, a path that is not there, a GGUF
     * file: said as such, not as a JSON error */
    struct stat sb;
    bool dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (dir || stat(path, &sb) != 0 || ts_file_is_gguf(path)) {
        ts_status s = ts_model_dir_check(ctx, path, TS_MODEL_CONFIG);
        if (s != TS_OK)
            return s;
    }
    ts_file_in(path, "config.json", file, cap);
    FILE *f = fopen(file, "rb");
    if (!f)
        return ts_set_error(ctx, TS_ERR_IO, "%s: cannot open: %s", file,
                            strerror(errno));
    char *buf = NULL;
    size_t n = 0, room = 0, got;
    do {
        if (n + 1 >= room) {
            char *g = realloc(buf, room = room ? 2 * room : 1 << 16);
            if (!g) {
                free(buf), fclose(f);
                return ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", file);
            }
            buf = g;
        }
        got = fread(buf + n, 1, room - n - 1, f);
        n += got;
    } while (got);
    bool err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return ts_set_error(ctx, TS_ERR_IO, "%s: cannot read", file);
    }
    buf[n] = '\0';
    *out = buf;
    return TS_OK;
}

ts_status ts_config_load(ts_ctx *ctx, const char *path, ts_model_config *out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!path || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_config_load: NULL argument");
    memset(out, 0, sizeof *out);
    char file[4096], *text;
    ts_status s;
    if (ts_file_is_gguf(path)) { /* the config from its metadata */
        if ((s = ts_gguf_hf_file_text(ctx, path, "config.json", &text)))
            return s;
        s = ts_config_from_json_text(ctx, text, path, out);
        free(text);
        return s;
    }
    s = load_text(ctx, path, file, sizeof file, &text);
    if (s != TS_OK)
        return s;
    s = ts_config_from_json_text(ctx, text, file, out);
    free(text);
    return s;
}

ts_status ts_config_from_json_text(ts_ctx *ctx, const char *text,
                                   const char *origin, ts_model_config *out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!text || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_config_from_json_text: NULL argument");
    memset(out, 0, sizeof *out);
    const char *file = origin ? origin : "config.json";
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ts_set_error(ctx, TS_ERR_IO, "%s: not valid JSON: %s (line %d)",
                            file, jerr.text, jerr.line);
    if (!json_is_object(root)) {
        json_decref(root);
        return ts_set_error(ctx, TS_ERR_IO, "%s: not a JSON object", file);
    }
    reader r = {ctx, file, "?", "", root, false, TS_OK};
    char prefix[64];
    int w;
    const family *fam = find_family(&r, root, &w);
    parsed *p = fam ? calloc(1, sizeof *p) : NULL;
    if (fam && !p)
        r.st = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", file);
    if (p) {
        r.family = fam->model_type;
        if (w >= 0) { /* a wrapper: its text model's config */
            json_t *sub = json_object_get(root, wrappers[w].field);
            if (!json_is_object(sub))
                r.st = ts_set_error(
                    ctx, TS_ERR_UNSUPPORTED,
                    "%s: a %s config without a \"%s\" object; give the text "
                    "model's folder (model type %s)",
                    file, wrappers[w].model_type, wrappers[w].field,
                    fam->model_type);
            const char *smt =
                json_string_value(json_object_get(sub, "model_type"));
            if (!r.st && smt && strcmp(smt, fam->model_type))
                r.st = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                                    "%s: %s.model_type is \"%s\"; a %s config "
                                    "holds a %s one",
                                    file, wrappers[w].field, smt,
                                    wrappers[w].model_type, fam->model_type);
            snprintf(prefix, sizeof prefix, "%s.", wrappers[w].field);
            r.root = sub, r.prefix = prefix, r.lenient = true;
        }
        if (!r.st)
            read_family(&r, fam, p);
        if (!r.st)
            r.st = check_sizes(&r, fam, p);
        apply_layer_types(&r, p);
        apply_rope_parameters(&r, p);
        apply_rope_scaling(&r, fam, p);
        apply_family_rules(&r, p);
        if (!r.st)
            r.st = check_description(&r, fam, p);
        if (!r.st)
            r.st = check_shapes(&r, fam, &p->c);
        if (!r.st) {
            *out = p->c;
            if (w >= 0)
                snprintf(out->model_type, sizeof out->model_type, "%s",
                         wrappers[w].model_type);
            /* tokens and dtype: the sub-config's, else the top level's */
            const char *tok[2] = {"bos_token_id", "eos_token_id"};
            int64_t *dst[2] = {&out->bos_token_id, &out->eos_token_id};
            for (int i = 0; i < 2; i++) {
                json_t *v = json_object_get(r.root, tok[i]);
                *dst[i] = get_token(v ? v : json_object_get(root, tok[i]));
            }
            bool sub_dtype = json_object_get(r.root, "dtype") ||
                             json_object_get(r.root, "torch_dtype");
            out->dtype = get_dtype(sub_dtype ? r.root : root);
        }
        free(p);
    }
    json_decref(root);
    return r.st;
}

ts_status ts_model_config_preset(ts_ctx *ctx, const char *model_type,
                                 ts_model_config *out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!model_type || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_model_config_preset: NULL argument");
    memset(out, 0, sizeof *out);
    json_t *none = json_object();
    if (!none)
        return ts_set_error(ctx, TS_ERR_OOM, "preset: out of memory");
    json_object_set_new(none, "model_type", json_string(model_type));
    reader r = {ctx, "ts_model_config_preset", "?", "", none, true, TS_OK};
    int w;
    const family *fam = find_family(&r, none, &w);
    parsed *p = fam ? calloc(1, sizeof *p) : NULL;
    if (fam && !p)
        r.st = ts_set_error(ctx, TS_ERR_OOM, "preset: out of memory");
    if (p) {
        r.family = fam->model_type;
        read_family(&r, fam, p);
        /* the description stays; every size is the caller's */
        for (const row *f = fam->rows; f->kind != K_END; f++)
            if (f->kind == K_SIZE) {
                put_int(p, f->off, 0);
                if (f->also)
                    put_int(p, f->also - 1, 0);
            }
        if (!r.st) {
            *out = p->c;
            out->bos_token_id = out->eos_token_id = -1;
            out->dtype = TS_F32;
        }
        free(p);
    }
    json_decref(none);
    return r.st;
}
