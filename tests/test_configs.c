/* test_configs.c — config.json of every supported family, as published
 * (abridged to the fields config.c reads, plus a few it must ignore),
 * loaded into ts_model_config and every description field held against
 * what Hugging Face's modeling code does with it; the description presets;
 * and the errors: an unknown type lists the supported ones, a missing
 * field is named with its family, bad rope_scaling, wrong lengths and
 * ranges, and wrong JSON types anywhere never crash. */
#include "tessera_io.h"
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

static char dir[64];

/* Writes text (JSON with ' for ") to dir/name and returns the path. */
static const char *put(const char *name, const char *text) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        return path;
    for (const char *c = text; *c; c++)
        fputc(*c == '\'' ? '"' : *c, f);
    fclose(f);
    return path;
}

static ts_status load(ts_ctx *ctx, const char *text, ts_model_config *c) {
    return ts_config_load(ctx, put("config.json", text), c);
}

/* the error status and a part of its message */
static void expect_error(ts_ctx *ctx, const char *text, ts_status want,
                         const char *needle) {
    ts_model_config c;
    ts_status s = load(ctx, text, &c);
    CHECK(s == want);
    if (s != want)
        fprintf(stderr, "  got %s for %s\n", ts_status_name(s), text);
    CHECK_MSG(ctx, needle);
    ts_clear_error(ctx);
}

/* the published configs (abridged) */

static const char *LLAMA32_1B =
    "{'architectures': ['LlamaForCausalLM'], 'attention_bias': false,"
    " 'attention_dropout': 0.0, 'bos_token_id': 128000,"
    " 'eos_token_id': [128001, 128008, 128009], 'head_dim': 64,"
    " 'hidden_act': 'silu', 'hidden_size': 2048, 'initializer_range': 0.02,"
    " 'intermediate_size': 8192, 'max_position_embeddings': 131072,"
    " 'mlp_bias': false, 'model_type': 'llama', 'num_attention_heads': 32,"
    " 'num_hidden_layers': 16, 'num_key_value_heads': 8, 'pretraining_tp': 1,"
    " 'rms_norm_eps': 1e-05, 'rope_scaling': {'factor': 32.0,"
    " 'high_freq_factor': 4.0, 'low_freq_factor': 1.0,"
    " 'original_max_position_embeddings': 8192, 'rope_type': 'llama3'},"
    " 'rope_theta': 500000.0, 'tie_word_embeddings': true,"
    " 'torch_dtype': 'bfloat16', 'use_cache': true, 'vocab_size': 128256}";

static const char *MISTRAL_7B_V01 =
    "{'architectures': ['MistralForCausalLM'], 'bos_token_id': 1,"
    " 'eos_token_id': 2, 'hidden_act': 'silu', 'hidden_size': 4096,"
    " 'initializer_range': 0.02, 'intermediate_size': 14336,"
    " 'max_position_embeddings': 32768, 'model_type': 'mistral',"
    " 'num_attention_heads': 32, 'num_hidden_layers': 32,"
    " 'num_key_value_heads': 8, 'rms_norm_eps': 1e-05, 'rope_theta': 10000.0,"
    " 'sliding_window': 4096, 'tie_word_embeddings': false,"
    " 'torch_dtype': 'bfloat16', 'use_cache': true, 'vocab_size': 32000}";

static const char *MISTRAL_7B_V03 =
    "{'architectures': ['MistralForCausalLM'], 'attention_dropout': 0.0,"
    " 'bos_token_id': 1, 'eos_token_id': 2, 'hidden_act': 'silu',"
    " 'hidden_size': 4096, 'initializer_range': 0.02,"
    " 'intermediate_size': 14336, 'max_position_embeddings': 32768,"
    " 'model_type': 'mistral', 'num_attention_heads': 32,"
    " 'num_hidden_layers': 32, 'num_key_value_heads': 8,"
    " 'rms_norm_eps': 1e-05, 'rope_theta': 1000000.0, 'sliding_window': null,"
    " 'tie_word_embeddings': false, 'torch_dtype': 'bfloat16',"
    " 'use_cache': true, 'vocab_size': 32768}";

static const char *QWEN25_05B =
    "{'architectures': ['Qwen2ForCausalLM'], 'attention_dropout': 0.0,"
    " 'bos_token_id': 151643, 'eos_token_id': 151643, 'hidden_act': 'silu',"
    " 'hidden_size': 896, 'initializer_range': 0.02,"
    " 'intermediate_size': 4864, 'max_position_embeddings': 32768,"
    " 'max_window_layers': 24, 'model_type': 'qwen2',"
    " 'num_attention_heads': 14, 'num_hidden_layers': 24,"
    " 'num_key_value_heads': 2, 'rms_norm_eps': 1e-06,"
    " 'rope_theta': 1000000.0, 'sliding_window': 32768,"
    " 'tie_word_embeddings': true, 'torch_dtype': 'bfloat16',"
    " 'use_cache': true, 'use_mrope': false, 'use_sliding_window': false,"
    " 'vocab_size': 151936}";

static const char *QWEN3_06B =
    "{'architectures': ['Qwen3ForCausalLM'], 'attention_bias': false,"
    " 'attention_dropout': 0.0, 'bos_token_id': 151643,"
    " 'eos_token_id': 151645, 'head_dim': 128, 'hidden_act': 'silu',"
    " 'hidden_size': 1024, 'initializer_range': 0.02,"
    " 'intermediate_size': 3072, 'max_position_embeddings': 40960,"
    " 'max_window_layers': 28, 'model_type': 'qwen3',"
    " 'num_attention_heads': 16, 'num_hidden_layers': 28,"
    " 'num_key_value_heads': 8, 'rms_norm_eps': 1e-06, 'rope_scaling': null,"
    " 'rope_theta': 1000000, 'sliding_window': null,"
    " 'tie_word_embeddings': true, 'torch_dtype': 'bfloat16',"
    " 'transformers_version': '4.51.0', 'use_cache': true,"
    " 'use_sliding_window': false, 'vocab_size': 151936}";

static const char *GEMMA2_2B =
    "{'architectures': ['Gemma2ForCausalLM'], 'attention_bias': false,"
    " 'attention_dropout': 0.0, 'attn_logit_softcapping': 50.0,"
    " 'bos_token_id': 2, 'cache_implementation': 'hybrid', 'eos_token_id': 1,"
    " 'final_logit_softcapping': 30.0, 'head_dim': 256,"
    " 'hidden_act': 'gelu_pytorch_tanh',"
    " 'hidden_activation': 'gelu_pytorch_tanh', 'hidden_size': 2304,"
    " 'initializer_range': 0.02, 'intermediate_size': 9216,"
    " 'max_position_embeddings': 8192, 'model_type': 'gemma2',"
    " 'num_attention_heads': 8, 'num_hidden_layers': 26,"
    " 'num_key_value_heads': 4, 'pad_token_id': 0,"
    " 'query_pre_attn_scalar': 256, 'rms_norm_eps': 1e-06,"
    " 'rope_theta': 10000.0, 'sliding_window': 4096,"
    " 'torch_dtype': 'float32', 'use_cache': true, 'vocab_size': 256000}";

static const char *GEMMA3_1B =
    "{'architectures': ['Gemma3ForCausalLM'], 'attention_bias': false,"
    " 'attention_dropout': 0.0, 'attn_logit_softcapping': null,"
    " 'bos_token_id': 2, 'cache_implementation': 'hybrid',"
    " 'eos_token_id': [1, 106], 'final_logit_softcapping': null,"
    " 'head_dim': 256, 'hidden_activation': 'gelu_pytorch_tanh',"
    " 'hidden_size': 1152, 'initializer_range': 0.02,"
    " 'intermediate_size': 6912, 'max_position_embeddings': 32768,"
    " 'model_type': 'gemma3_text', 'num_attention_heads': 4,"
    " 'num_hidden_layers': 26, 'num_key_value_heads': 1, 'pad_token_id': 0,"
    " 'query_pre_attn_scalar': 256, 'rms_norm_eps': 1e-06,"
    " 'rope_local_base_freq': 10000, 'rope_scaling': null,"
    " 'rope_theta': 1000000, 'sliding_window': 512,"
    " 'sliding_window_pattern': 6, 'torch_dtype': 'bfloat16',"
    " 'use_cache': true, 'vocab_size': 262144}";

/* Gemma 3 4B: the multimodal wrapper; its text_config leaves out what
 * Gemma3TextConfig's defaults give (vocab, heads, head_dim, ...) */
static const char *GEMMA3_4B =
    "{'architectures': ['Gemma3ForConditionalGeneration'],"
    " 'boi_token_index': 255999, 'eoi_token_index': 256000,"
    " 'eos_token_id': [1, 106], 'image_token_index': 262144,"
    " 'mm_tokens_per_image': 256, 'model_type': 'gemma3',"
    " 'text_config': {'hidden_size': 2560, 'intermediate_size': 10240,"
    " 'model_type': 'gemma3_text', 'num_hidden_layers': 34,"
    " 'rope_scaling': {'factor': 8.0, 'rope_type': 'linear'},"
    " 'sliding_window': 1024}, 'torch_dtype': 'bfloat16',"
    " 'vision_config': {'hidden_size': 1152, 'image_size': 896,"
    " 'model_type': 'siglip_vision_model', 'num_hidden_layers': 27}}";

static const char *PHI3_MINI_4K =
    "{'_name_or_path': 'Phi-3-mini-4k-instruct',"
    " 'architectures': ['Phi3ForCausalLM'], 'attention_dropout': 0.0,"
    " 'bos_token_id': 1, 'embd_pdrop': 0.0, 'eos_token_id': 32000,"
    " 'hidden_act': 'silu', 'hidden_size': 3072, 'initializer_range': 0.02,"
    " 'intermediate_size': 8192, 'max_position_embeddings': 4096,"
    " 'model_type': 'phi3', 'num_attention_heads': 32,"
    " 'num_hidden_layers': 32, 'num_key_value_heads': 32,"
    " 'original_max_position_embeddings': 4096, 'pad_token_id': 32000,"
    " 'resid_pdrop': 0.0, 'rms_norm_eps': 1e-05, 'rope_scaling': null,"
    " 'rope_theta': 10000.0, 'sliding_window': 2047,"
    " 'tie_word_embeddings': false, 'torch_dtype': 'bfloat16',"
    " 'use_cache': true, 'attention_bias': false, 'vocab_size': 32064}";

/* Phi-3-mini-128k: rope_scaling is built by phi3_128k() (its 48 + 48
 * factors; the values here are not the published ones, their number is) */
static const char *PHI3_MINI_128K_HEAD =
    "{'architectures': ['Phi3ForCausalLM'], 'attention_dropout': 0.0,"
    " 'bos_token_id': 1, 'embd_pdrop': 0.0, 'eos_token_id': 32000,"
    " 'hidden_act': 'silu', 'hidden_size': 3072, 'initializer_range': 0.02,"
    " 'intermediate_size': 8192, 'max_position_embeddings': 131072,"
    " 'model_type': 'phi3', 'num_attention_heads': 32,"
    " 'num_hidden_layers': 32, 'num_key_value_heads': 32,"
    " 'original_max_position_embeddings': 4096, 'pad_token_id': 32000,"
    " 'resid_pdrop': 0.0, 'rms_norm_eps': 1e-05, 'rope_theta': 10000.0,"
    " 'sliding_window': 262144, 'tie_word_embeddings': false,"
    " 'torch_dtype': 'bfloat16', 'use_cache': true, 'vocab_size': 32064,";

static double short_factor(int i) {
    return 1.0 + 0.01 * i;
}
static double long_factor(int i) {
    return 1.0 + 0.5 * i;
}

/* The 128k config with n factors per list and rope type type. */
static char *phi3_128k(int n, const char *type) {
    size_t cap = 8192;
    char *s = malloc(cap);
    size_t k = (size_t)snprintf(s, cap, "%s 'rope_scaling': {'type': '%s'",
                                PHI3_MINI_128K_HEAD, type);
    for (int l = 0; l < 2; l++) {
        k += (size_t)snprintf(s + k, cap - k, ", '%s': [",
                              l ? "long_factor" : "short_factor");
        for (int i = 0; i < n; i++)
            k += (size_t)snprintf(s + k, cap - k, "%s%.17g", i ? ", " : "",
                                  l ? long_factor(i) : short_factor(i));
        k += (size_t)snprintf(s + k, cap - k, "]");
    }
    snprintf(s + k, cap - k, "}}");
    return s;
}

static const char *QWEN3_30B_A3B =
    "{'architectures': ['Qwen3MoeForCausalLM'], 'attention_bias': false,"
    " 'attention_dropout': 0.0, 'bos_token_id': 151643,"
    " 'decoder_sparse_step': 1, 'eos_token_id': 151645, 'head_dim': 128,"
    " 'hidden_act': 'silu', 'hidden_size': 2048, 'initializer_range': 0.02,"
    " 'intermediate_size': 6144, 'max_position_embeddings': 40960,"
    " 'max_window_layers': 48, 'mlp_only_layers': [],"
    " 'model_type': 'qwen3_moe', 'moe_intermediate_size': 768,"
    " 'norm_topk_prob': true, 'num_attention_heads': 32, 'num_experts': 128,"
    " 'num_experts_per_tok': 8, 'num_hidden_layers': 48,"
    " 'num_key_value_heads': 4, 'output_router_logits': false,"
    " 'rms_norm_eps': 1e-06, 'rope_scaling': null, 'rope_theta': 1000000.0,"
    " 'router_aux_loss_coef': 0.001, 'sliding_window': null,"
    " 'tie_word_embeddings': false, 'torch_dtype': 'bfloat16',"
    " 'use_cache': true, 'use_sliding_window': false, 'vocab_size': 151936}";

static const char *MIXTRAL_8X7B =
    "{'architectures': ['MixtralForCausalLM'], 'attention_dropout': 0.0,"
    " 'bos_token_id': 1, 'eos_token_id': 2, 'hidden_act': 'silu',"
    " 'hidden_size': 4096, 'initializer_range': 0.02,"
    " 'intermediate_size': 14336, 'max_position_embeddings': 32768,"
    " 'model_type': 'mixtral', 'num_attention_heads': 32,"
    " 'num_experts_per_tok': 2, 'num_hidden_layers': 32,"
    " 'num_key_value_heads': 8, 'num_local_experts': 8,"
    " 'output_router_logits': false, 'rms_norm_eps': 1e-05,"
    " 'rope_theta': 1000000.0, 'router_aux_loss_coef': 0.02,"
    " 'router_jitter_noise': 0.0, 'sliding_window': null,"
    " 'tie_word_embeddings': false, 'torch_dtype': 'bfloat16',"
    " 'use_cache': true, 'vocab_size': 32000}";

static const char *GPT2_SMALL =
    "{'activation_function': 'gelu_new', 'architectures': ['GPT2LMHeadModel'],"
    " 'attn_pdrop': 0.1, 'bos_token_id': 50256, 'embd_pdrop': 0.1,"
    " 'eos_token_id': 50256, 'initializer_range': 0.02,"
    " 'layer_norm_epsilon': 1e-05, 'model_type': 'gpt2', 'n_ctx': 1024,"
    " 'n_embd': 768, 'n_head': 12, 'n_inner': null, 'n_layer': 12,"
    " 'n_positions': 1024, 'resid_pdrop': 0.1, 'summary_activation': null,"
    " 'summary_first_dropout': 0.1, 'summary_proj_to_labels': true,"
    " 'summary_type': 'cls_index', 'summary_use_proj': true,"
    " 'task_specific_params': {'text-generation': {'do_sample': true,"
    " 'max_length': 50}}, 'vocab_size': 50257}";

/* A published config with one top-level field replaced (value: JSON with
 * ' for ", or NULL to drop the field). */
static char *edit(const char *base, const char *key, const char *value) {
    char *fixed = strdup(base);
    for (char *c = fixed; *c; c++)
        if (*c == '\'')
            *c = '"';
    json_t *root = json_loads(fixed, 0, NULL);
    free(fixed);
    if (!root)
        return strdup("{}");
    if (!value)
        json_object_del(root, key);
    else {
        char *v = strdup(value);
        for (char *c = v; *c; c++)
            if (*c == '\'')
                *c = '"';
        json_object_set_new(root, key, json_loads(v, JSON_DECODE_ANY, NULL));
        free(v);
    }
    char *out = json_dumps(root, 0);
    json_decref(root);
    return out;
}

/* ---- the families ------------------------------------------------------ */

/* what every plain rope decoder without extras has */
static void check_plain(const ts_model_config *c) {
    CHECK(c->pos == TS_POS_ROPE && !c->sandwich_norm && !c->embed_scale);
    CHECK(!c->fused_qkv && !c->fused_gate_up && !c->conv1d && !c->mlp_bias);
    CHECK(c->attn_scale == 0 && c->attn_softcap == 0 && c->final_softcap == 0);
    CHECK(c->gated && c->act == TS_ACT_SILU);
    CHECK(c->rope_local_theta == 0);
}

static void test_llama(ts_ctx *ctx) {
    ts_model_config c;
    CHECK_OK(ctx, load(ctx, LLAMA32_1B, &c));
    CHECK(c.arch == TS_ARCH_LLAMA && !strcmp(c.model_type, "llama"));
    CHECK(c.vocab == 128256 && c.hidden == 2048 && c.layers == 16 &&
          c.heads == 32 && c.kv_heads == 8 && c.head_dim == 64 &&
          c.intermediate == 8192 && c.max_positions == 131072);
    CHECK(c.norm == TS_NORM_RMS && c.norm_eps == 1e-5 && !c.qk_norm);
    check_plain(&c);
    CHECK(!c.attention_bias && !c.o_bias);
    CHECK(c.rope_theta == 500000.0 && c.rope == TS_ROPE_LLAMA3 &&
          c.rope_factor == 32 && c.rope_low_freq_factor == 1 &&
          c.rope_high_freq_factor == 4 &&
          c.rope_original_max_positions == 8192);
    CHECK(c.sliding_window == 0 && !ts_model_layer_sliding(&c, 0));
    CHECK(c.n_experts == 0 && !ts_model_layer_moe(&c, 0));
    CHECK(c.tie_word_embeddings && c.dtype == TS_BF16);
    CHECK(c.bos_token_id == 128000 && c.eos_token_id == 128001);
    /* attention_bias: biases on q, k, v and o (LlamaAttention); mlp_bias
     * on gate, up and down */
    char *t = edit(LLAMA32_1B, "attention_bias", "true");
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.attention_bias && c.o_bias && !c.mlp_bias);
    free(t);
    t = edit(LLAMA32_1B, "mlp_bias", "true");
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.mlp_bias && !c.attention_bias);
    free(t);
    /* Llama 2: no head_dim (hidden / heads), no kv heads (= heads), no
     * tie (false), no rope_scaling */
    CHECK_OK(ctx, load(ctx,
                       "{'model_type': 'llama', 'hidden_size': 4096,"
                       " 'intermediate_size': 11008,"
                       " 'num_attention_heads': 32, 'num_hidden_layers': 32,"
                       " 'vocab_size': 32000, 'rms_norm_eps': 1e-05,"
                       " 'max_position_embeddings': 4096}",
                       &c));
    CHECK(c.head_dim == 128 && c.kv_heads == 32 && !c.tie_word_embeddings &&
          c.rope == TS_ROPE_DEFAULT && c.rope_theta == 10000 &&
          c.dtype == TS_F32 && c.bos_token_id == -1 && c.eos_token_id == -1);
    /* linear scaling; the newer "dtype" key */
    t = edit(LLAMA32_1B, "rope_scaling", "{'type': 'linear', 'factor': 4.0}");
    char *t2 = edit(t, "torch_dtype", NULL);
    char *t3 = edit(t2, "dtype", "'float16'");
    CHECK_OK(ctx, load(ctx, t3, &c));
    CHECK(c.rope == TS_ROPE_LINEAR && c.rope_factor == 4 && c.dtype == TS_F16);
    free(t), free(t2), free(t3);
    /* transformers 5's one rope_parameters object */
    t = edit(LLAMA32_1B, "rope_scaling", NULL);
    t2 = edit(t, "rope_theta", NULL);
    t3 = edit(t2, "rope_parameters",
              "{'rope_type': 'llama3', 'rope_theta': 500000.0, 'factor': 32.0,"
              " 'high_freq_factor': 4.0, 'low_freq_factor': 1.0,"
              " 'original_max_position_embeddings': 8192}");
    CHECK_OK(ctx, load(ctx, t3, &c));
    CHECK(c.rope == TS_ROPE_LLAMA3 && c.rope_theta == 500000.0 &&
          c.rope_factor == 32 && c.rope_original_max_positions == 8192);
    free(t), free(t2), free(t3);
    t = edit(LLAMA32_1B, "rope_scaling", NULL);
    t2 = edit(t, "rope_parameters", "{'rope_type': 'dynamic', 'factor': 2}");
    expect_error(ctx, t2, TS_ERR_UNSUPPORTED,
                 "rope_parameters type \"dynamic\" is not supported");
    free(t2);
    t2 = edit(t, "rope_parameters", "{'rope_theta': 1000.0}");
    CHECK_OK(ctx, load(ctx, t2, &c));
    CHECK(c.rope == TS_ROPE_DEFAULT && c.rope_theta == 1000);
    free(t), free(t2);
}

static void test_mistral(ts_ctx *ctx) {
    ts_model_config c;
    CHECK_OK(ctx, load(ctx, MISTRAL_7B_V01, &c));
    CHECK(c.arch == TS_ARCH_MISTRAL && c.vocab == 32000 && c.hidden == 4096 &&
          c.heads == 32 && c.kv_heads == 8 && c.head_dim == 128 &&
          c.intermediate == 14336 && c.max_positions == 32768);
    CHECK(c.norm == TS_NORM_RMS && c.norm_eps == 1e-5 && !c.qk_norm &&
          !c.attention_bias && !c.o_bias && !c.tie_word_embeddings);
    check_plain(&c);
    CHECK(c.rope_theta == 10000 && c.rope == TS_ROPE_DEFAULT);
    /* the window on every layer */
    CHECK(c.sliding_window == 4096 && c.sliding_from == 0 &&
          c.sliding_pattern == 0);
    for (int64_t i = 0; i < c.layers; i++)
        CHECK(ts_model_layer_sliding(&c, i));
    /* v0.3: sliding_window null is no window; rope_theta 1e6 */
    CHECK_OK(ctx, load(ctx, MISTRAL_7B_V03, &c));
    CHECK(c.vocab == 32768 && c.rope_theta == 1e6 && c.sliding_window == 0 &&
          !ts_model_layer_sliding(&c, 0));
    /* absent (not null): MistralConfig's default 4096 */
    char *t = edit(MISTRAL_7B_V03, "sliding_window", NULL);
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.sliding_window == 4096);
    free(t);
    /* architectures alone names the family */
    t = edit(MISTRAL_7B_V01, "model_type", NULL);
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.arch == TS_ARCH_MISTRAL && !strcmp(c.model_type, "mistral"));
    free(t);
}

static void test_qwen2(ts_ctx *ctx) {
    ts_model_config c;
    CHECK_OK(ctx, load(ctx, QWEN25_05B, &c));
    CHECK(c.arch == TS_ARCH_QWEN2 && c.hidden == 896 && c.heads == 14 &&
          c.kv_heads == 2 && c.head_dim == 64 && c.intermediate == 4864 &&
          c.layers == 24 && c.vocab == 151936);
    /* biases on q, k, v (Qwen2Attention: bias=True), none on o */
    CHECK(c.attention_bias && !c.o_bias && !c.qk_norm);
    CHECK(c.norm == TS_NORM_RMS && c.norm_eps == 1e-6);
    check_plain(&c);
    CHECK(c.rope_theta == 1e6 && c.tie_word_embeddings);
    /* use_sliding_window false: no window, whatever sliding_window says */
    CHECK(c.sliding_window == 0 && !ts_model_layer_sliding(&c, 23));
    CHECK(c.bos_token_id == 151643 && c.eos_token_id == 151643);
    /* on: layers from max_window_layers on slide */
    char *t = edit(QWEN25_05B, "use_sliding_window", "true");
    char *t2 = edit(t, "max_window_layers", "20");
    CHECK_OK(ctx, load(ctx, t2, &c));
    CHECK(c.sliding_window == 32768 && c.sliding_from == 20);
    CHECK(!ts_model_layer_sliding(&c, 19) && ts_model_layer_sliding(&c, 20) &&
          ts_model_layer_sliding(&c, 23));
    free(t), free(t2);
}

static void test_qwen3(ts_ctx *ctx) {
    ts_model_config c;
    CHECK_OK(ctx, load(ctx, QWEN3_06B, &c));
    CHECK(c.arch == TS_ARCH_QWEN3 && c.hidden == 1024 && c.heads == 16 &&
          c.kv_heads == 8 && c.head_dim == 128 && c.layers == 28 &&
          c.intermediate == 3072 && c.max_positions == 40960);
    CHECK(c.qk_norm && !c.attention_bias && !c.o_bias);
    CHECK(c.norm == TS_NORM_RMS && c.norm_eps == 1e-6);
    check_plain(&c);
    CHECK(c.rope_theta == 1e6 && c.rope == TS_ROPE_DEFAULT &&
          c.sliding_window == 0 && c.tie_word_embeddings);
    CHECK(c.eos_token_id == 151645 && c.dtype == TS_BF16);
    /* Qwen3Config's head_dim is 128 when absent, not hidden / heads */
    char *t = edit(QWEN3_06B, "head_dim", NULL);
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.head_dim == 128);
    free(t);
    /* attention_bias: q, k, v and o */
    t = edit(QWEN3_06B, "attention_bias", "true");
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.attention_bias && c.o_bias);
    free(t);
    /* YaRN as Qwen3's model card adds it */
    t = edit(QWEN3_06B, "rope_scaling",
             "{'rope_type': 'yarn', 'factor': 4.0,"
             " 'original_max_position_embeddings': 32768}");
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.rope == TS_ROPE_YARN && c.rope_factor == 4 &&
          c.rope_original_max_positions == 32768 && c.rope_beta_fast == 32 &&
          c.rope_beta_slow == 1);
    CHECK_NEAR(c.rope_attention_factor, 0.1 * log(4.0) + 1, 1e-15);
    free(t);
    t = edit(QWEN3_06B, "rope_scaling",
             "{'rope_type': 'yarn', 'factor': 2.0, 'beta_fast': 16,"
             " 'beta_slow': 2, 'attention_factor': 1.5}");
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.rope_original_max_positions == 40960 && c.rope_beta_fast == 16 &&
          c.rope_beta_slow == 2 && c.rope_attention_factor == 1.5);
    free(t);
}

static void test_gemma2(ts_ctx *ctx) {
    ts_model_config c;
    CHECK_OK(ctx, load(ctx, GEMMA2_2B, &c));
    CHECK(c.arch == TS_ARCH_GEMMA2 && c.vocab == 256000 && c.hidden == 2304 &&
          c.layers == 26 && c.heads == 8 && c.kv_heads == 4 &&
          c.head_dim == 256 && c.intermediate == 9216 &&
          c.max_positions == 8192);
    /* x / rms(x) * (1 + w), four norms a layer, embeddings x sqrt(C) */
    CHECK(c.norm == TS_NORM_RMS_1P && c.sandwich_norm && c.embed_scale &&
          c.norm_eps == 1e-6 && !c.qk_norm);
    /* GeGLU with the tanh GELU */
    CHECK(c.gated && c.act == TS_ACT_GELU_TANH && !c.mlp_bias &&
          !c.fused_gate_up);
    CHECK(!c.attention_bias && !c.o_bias && !c.fused_qkv);
    /* scores x query_pre_attn_scalar^-0.5, capped at 50; logits at 30 */
    CHECK(c.attn_scale == 1.0 / 16 && c.attn_softcap == 50 &&
          c.final_softcap == 30);
    CHECK(c.pos == TS_POS_ROPE && c.rope_theta == 10000 &&
          c.rope == TS_ROPE_DEFAULT && c.rope_local_theta == 0);
    /* even layers slide (layer_types: (i + 1) % 2 != 0) */
    CHECK(c.sliding_window == 4096 && c.sliding_pattern == 2);
    for (int64_t i = 0; i < c.layers; i++)
        CHECK(ts_model_layer_sliding(&c, i) == (i % 2 == 0));
    CHECK(c.tie_word_embeddings && c.dtype == TS_F32 && c.bos_token_id == 2 &&
          c.eos_token_id == 1);
    /* softcaps null: none */
    char *t = edit(GEMMA2_2B, "attn_logit_softcapping", "null");
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.attn_softcap == 0 && c.final_softcap == 30);
    free(t);
    /* the newer configs' explicit layer_types, the same pattern */
    char lt[1024] = "[";
    for (int i = 0; i < 26; i++)
        snprintf(lt + strlen(lt), sizeof lt - strlen(lt), "%s'%s'",
                 i ? ", " : "", i % 2 ? "full_attention" : "sliding_attention");
    strcat(lt, "]");
    t = edit(GEMMA2_2B, "layer_types", lt);
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.sliding_pattern == 2 && c.sliding_from == 0 &&
          c.sliding_window == 4096);
    free(t);
}

static void test_gemma3(ts_ctx *ctx) {
    ts_model_config c;
    CHECK_OK(ctx, load(ctx, GEMMA3_1B, &c));
    CHECK(c.arch == TS_ARCH_GEMMA3 && !strcmp(c.model_type, "gemma3_text"));
    CHECK(c.vocab == 262144 && c.hidden == 1152 && c.layers == 26 &&
          c.heads == 4 && c.kv_heads == 1 && c.head_dim == 256 &&
          c.intermediate == 6912 && c.max_positions == 32768);
    CHECK(c.norm == TS_NORM_RMS_1P && c.sandwich_norm && c.embed_scale &&
          c.qk_norm);
    CHECK(c.gated && c.act == TS_ACT_GELU_TANH);
    /* no soft caps (null), the Gemma scale */
    CHECK(c.attn_scale == 1.0 / 16 && c.attn_softcap == 0 &&
          c.final_softcap == 0);
    /* global layers: rope_theta (and rope_scaling); local: their base */
    CHECK(c.rope_theta == 1e6 && c.rope_local_theta == 10000 &&
          c.rope == TS_ROPE_DEFAULT);
    /* five sliding to one global: layers 5, 11, 17, 23 are global */
    CHECK(c.sliding_window == 512 && c.sliding_pattern == 6);
    for (int64_t i = 0; i < c.layers; i++)
        CHECK(ts_model_layer_sliding(&c, i) == ((i + 1) % 6 != 0));
    CHECK(c.tie_word_embeddings && c.bos_token_id == 2 && c.eos_token_id == 1 &&
          c.dtype == TS_BF16);
    /* layer_types in place of the pattern */
    char lt[1024] = "[";
    for (int i = 0; i < 26; i++)
        snprintf(lt + strlen(lt), sizeof lt - strlen(lt), "%s'%s'",
                 i ? ", " : "",
                 (i + 1) % 6 ? "sliding_attention" : "full_attention");
    strcat(lt, "]");
    char *t = edit(GEMMA3_1B, "sliding_window_pattern", NULL);
    char *t2 = edit(t, "layer_types", lt);
    CHECK_OK(ctx, load(ctx, t2, &c));
    CHECK(c.sliding_pattern == 6 && c.sliding_from == 0);
    free(t), free(t2);
    /* a list no pattern fits: named, not guessed */
    lt[0] = 0;
    strcat(lt, "[");
    for (int i = 0; i < 26; i++)
        snprintf(lt + strlen(lt), sizeof lt - strlen(lt), "%s'%s'",
                 i ? ", " : "",
                 i == 3 || i == 7 ? "full_attention" : "sliding_attention");
    strcat(lt, "]");
    t = edit(GEMMA3_1B, "layer_types", lt);
    expect_error(ctx, t, TS_ERR_UNSUPPORTED,
                 "layer_types (S sliding, F full: S S S F S S S F S");
    free(t);
    t = edit(GEMMA3_1B, "layer_types", "['sliding_attention']");
    expect_error(ctx, t, TS_ERR_IO,
                 "layer_types has 1 entries; num_hidden_layers is 26");
    free(t);
    t = edit(GEMMA3_1B, "layer_types",
             "[" /* 26 entries, one odd */
             "'chunked_attention', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x',"
             " 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x',"
             " 'x', 'x', 'x', 'x', 'x']");
    expect_error(ctx, t, TS_ERR_UNSUPPORTED,
                 "layer_types[0] is \"chunked_attention\"");
    free(t);
    /* transformers 5: rope_parameters per layer type */
    t = edit(GEMMA3_1B, "rope_theta", NULL);
    t2 = edit(t, "rope_local_base_freq", NULL);
    char *t3 = edit(t2, "rope_parameters",
                    "{'full_attention': {'rope_type': 'linear', 'factor': 8.0,"
                    " 'rope_theta': 1000000.0}, 'sliding_attention':"
                    " {'rope_type': 'default', 'rope_theta': 20000.0}}");
    CHECK_OK(ctx, load(ctx, t3, &c));
    CHECK(c.rope == TS_ROPE_LINEAR && c.rope_factor == 8 &&
          c.rope_theta == 1e6 && c.rope_local_theta == 20000);
    free(t), free(t2), free(t3);
    t = edit(GEMMA3_1B, "rope_parameters",
             "{'full_attention': {'rope_type': 'linear', 'factor': 0}}");
    expect_error(ctx, t, TS_ERR_RANGE,
                 "rope_parameters.full_attention.factor is 0");
    free(t);
    /* Gemma 3 4B's wrapper: its text_config with Gemma3TextConfig's
     * defaults; linear scaling on the global layers */
    CHECK_OK(ctx, load(ctx, GEMMA3_4B, &c));
    CHECK(c.arch == TS_ARCH_GEMMA3 && !strcmp(c.model_type, "gemma3"));
    CHECK(c.hidden == 2560 && c.intermediate == 10240 && c.layers == 34 &&
          c.vocab == 262208 && c.heads == 8 && c.kv_heads == 4 &&
          c.head_dim == 256 && c.max_positions == 131072);
    CHECK(c.rope == TS_ROPE_LINEAR && c.rope_factor == 8 &&
          c.rope_theta == 1e6 && c.rope_local_theta == 10000);
    CHECK(c.sliding_window == 1024 && c.sliding_pattern == 6 && c.qk_norm &&
          c.attn_scale == 1.0 / 16);
    CHECK(c.eos_token_id == 1 && c.dtype == TS_BF16);
    t = edit(GEMMA3_4B, "text_config", NULL);
    expect_error(ctx, t, TS_ERR_UNSUPPORTED,
                 "a gemma3 config without a \"text_config\" object; give the "
                 "text model's folder (model type gemma3_text)");
    free(t);
    t = edit(GEMMA3_4B, "text_config", "{'num_attention_heads': 'eight'}");
    expect_error(ctx, t, TS_ERR_IO,
                 "field \"text_config.num_attention_heads\" must be an "
                 "integer >= 0");
    free(t);
}

static void test_phi3(ts_ctx *ctx) {
    ts_model_config c;
    CHECK_OK(ctx, load(ctx, PHI3_MINI_4K, &c));
    CHECK(c.arch == TS_ARCH_PHI3 && c.vocab == 32064 && c.hidden == 3072 &&
          c.layers == 32 && c.heads == 32 && c.kv_heads == 32 &&
          c.head_dim == 96 && c.intermediate == 8192 &&
          c.max_positions == 4096);
    /* qkv_proj and gate_up_proj (gate rows first), no biases */
    CHECK(c.fused_qkv && c.fused_gate_up && c.gated && c.act == TS_ACT_SILU &&
          !c.attention_bias && !c.o_bias && !c.mlp_bias && !c.conv1d);
    CHECK(c.norm == TS_NORM_RMS && c.norm_eps == 1e-5 && !c.qk_norm &&
          !c.sandwich_norm);
    CHECK(c.rope == TS_ROPE_DEFAULT && c.rope_theta == 10000);
    CHECK(c.sliding_window == 2047 && ts_model_layer_sliding(&c, 0) &&
          ts_model_layer_sliding(&c, 31));
    CHECK(!c.tie_word_embeddings && c.bos_token_id == 1 &&
          c.eos_token_id == 32000);
    /* 128k: longrope, factors stored, factor = 131072 / 4096 */
    char *t = phi3_128k(48, "longrope");
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.rope == TS_ROPE_LONGROPE && c.rope_n_factors == 48 &&
          c.rope_original_max_positions == 4096 && c.rope_factor == 32);
    bool same = true;
    for (int i = 0; i < 48; i++)
        same = same && c.rope_short_factor[i] == short_factor(i) &&
               c.rope_long_factor[i] == long_factor(i);
    CHECK(same);
    CHECK_NEAR(c.rope_attention_factor, sqrt(1 + log(32.0) / log(4096.0)),
               1e-15);
    CHECK(c.sliding_window == 262144 && c.max_positions == 131072);
    free(t);
    /* the first 128k configs said "su" */
    t = phi3_128k(48, "su");
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.rope == TS_ROPE_LONGROPE && c.rope_n_factors == 48);
    free(t);
    /* a list of the wrong length */
    t = phi3_128k(47, "longrope");
    expect_error(ctx, t, TS_ERR_IO,
                 "rope_scaling.short_factor has 47 entries; head_dim / 2 = 48 "
                 "are needed");
    free(t);
    t = edit(PHI3_MINI_4K, "rope_scaling",
             "{'type': 'longrope', 'short_factor': [1.0]}");
    expect_error(ctx, t, TS_ERR_IO, "rope_scaling.short_factor has 1 entries");
    free(t);
    /* Phi-4-mini's partial rotary embedding: not silently full */
    t = edit(PHI3_MINI_4K, "partial_rotary_factor", "0.75");
    expect_error(ctx, t, TS_ERR_UNSUPPORTED,
                 "partial_rotary_factor other than 1 is not supported (model "
                 "type phi3)");
    free(t);
    t = edit(PHI3_MINI_4K, "partial_rotary_factor", "1.0");
    CHECK_OK(ctx, load(ctx, t, &c));
    free(t);
}

static void test_qwen3_moe(ts_ctx *ctx) {
    ts_model_config c;
    CHECK_OK(ctx, load(ctx, QWEN3_30B_A3B, &c));
    CHECK(c.arch == TS_ARCH_QWEN3_MOE && c.hidden == 2048 && c.layers == 48 &&
          c.heads == 32 && c.kv_heads == 4 && c.head_dim == 128 &&
          c.intermediate == 6144 && c.vocab == 151936);
    CHECK(c.qk_norm && !c.attention_bias && c.norm == TS_NORM_RMS);
    check_plain(&c);
    CHECK(c.n_experts == 128 && c.experts_per_tok == 8 &&
          c.moe_intermediate == 768 && c.norm_topk_prob &&
          c.router_aux_loss_coef == 0.001 && c.moe_step == 1 &&
          c.n_dense_layers == 0);
    for (int64_t i = 0; i < c.layers; i++)
        CHECK(ts_model_layer_moe(&c, i));
    CHECK(c.sliding_window == 0 && c.rope_theta == 1e6);
    /* every other layer sparse, two dense by name; norm_topk_prob's
     * default is false */
    char *t = edit(QWEN3_30B_A3B, "decoder_sparse_step", "2");
    char *t2 = edit(t, "mlp_only_layers", "[1, 47]");
    char *t3 = edit(t2, "norm_topk_prob", NULL);
    CHECK_OK(ctx, load(ctx, t3, &c));
    CHECK(c.moe_step == 2 && c.n_dense_layers == 2 && !c.norm_topk_prob);
    CHECK(!ts_model_layer_moe(&c, 0) && !ts_model_layer_moe(&c, 1) &&
          ts_model_layer_moe(&c, 3) && !ts_model_layer_moe(&c, 4) &&
          ts_model_layer_moe(&c, 45) && !ts_model_layer_moe(&c, 47));
    free(t), free(t2), free(t3);
    /* errors */
    t = edit(QWEN3_30B_A3B, "num_experts_per_tok", "200");
    expect_error(ctx, t, TS_ERR_RANGE,
                 "num_experts_per_tok is 200; allowed 1 to num_experts (128)");
    free(t);
    t = edit(QWEN3_30B_A3B, "num_experts_per_tok", "0");
    expect_error(ctx, t, TS_ERR_RANGE, "num_experts_per_tok is 0");
    free(t);
    t = edit(QWEN3_30B_A3B, "mlp_only_layers", "[3, 48]");
    expect_error(ctx, t, TS_ERR_RANGE,
                 "mlp_only_layers[1] is 48; layers are 0 to 47");
    free(t);
    t = edit(QWEN3_30B_A3B, "moe_intermediate_size", NULL);
    expect_error(ctx, t, TS_ERR_IO,
                 "missing field \"moe_intermediate_size\", which model type "
                 "qwen3_moe requires");
    free(t);
    t = edit(QWEN3_30B_A3B, "router_aux_loss_coef", "-1");
    expect_error(ctx, t, TS_ERR_RANGE,
                 "router_aux_loss_coef is -1; allowed from 0");
    free(t);
}

static void test_mixtral(ts_ctx *ctx) {
    ts_model_config c;
    CHECK_OK(ctx, load(ctx, MIXTRAL_8X7B, &c));
    CHECK(c.arch == TS_ARCH_MIXTRAL && c.hidden == 4096 && c.layers == 32 &&
          c.heads == 32 && c.kv_heads == 8 && c.head_dim == 128 &&
          c.vocab == 32000 && c.max_positions == 32768);
    CHECK(c.norm == TS_NORM_RMS && c.norm_eps == 1e-5 && !c.qk_norm &&
          !c.attention_bias);
    check_plain(&c);
    /* each expert is intermediate_size wide; top-2 renormalized */
    CHECK(c.n_experts == 8 && c.experts_per_tok == 2 &&
          c.moe_intermediate == 14336 && c.intermediate == 14336 &&
          c.norm_topk_prob && c.router_aux_loss_coef == 0.02 &&
          c.moe_step == 1);
    for (int64_t i = 0; i < c.layers; i++)
        CHECK(ts_model_layer_moe(&c, i));
    CHECK(c.rope_theta == 1e6 && c.sliding_window == 0 &&
          !c.tie_word_embeddings);
    char *t = edit(MIXTRAL_8X7B, "num_local_experts", NULL);
    expect_error(ctx, t, TS_ERR_IO,
                 "missing field \"num_local_experts\", which model type "
                 "mixtral requires");
    free(t);
    t = edit(MIXTRAL_8X7B, "num_experts_per_tok", "9");
    expect_error(ctx, t, TS_ERR_RANGE,
                 "num_experts_per_tok is 9; allowed 1 to num_local_experts "
                 "(8)");
    free(t);
}

static void test_gpt2(ts_ctx *ctx) {
    ts_model_config c;
    CHECK_OK(ctx, load(ctx, GPT2_SMALL, &c));
    CHECK(c.arch == TS_ARCH_GPT2 && c.vocab == 50257 && c.hidden == 768 &&
          c.layers == 12 && c.heads == 12 && c.kv_heads == 12 &&
          c.head_dim == 64 && c.intermediate == 3072 &&
          c.max_positions == 1024);
    /* LayerNorm with biases, learned positions */
    CHECK(c.norm == TS_NORM_LAYER && c.norm_eps == 1e-5 &&
          c.pos == TS_POS_LEARNED && c.rope == TS_ROPE_DEFAULT);
    /* c_attn (q, k, v fused), Conv1D (in, out), biases everywhere */
    CHECK(c.fused_qkv && c.conv1d && c.attention_bias && c.o_bias &&
          c.mlp_bias && !c.qk_norm);
    /* c_fc -> gelu_new -> c_proj, not gated */
    CHECK(!c.gated && c.act == TS_ACT_GELU_TANH && !c.fused_gate_up);
    CHECK(c.attn_scale == 0 && c.attn_softcap == 0 && c.final_softcap == 0 &&
          c.sliding_window == 0 && c.n_experts == 0 && !c.embed_scale &&
          !c.sandwich_norm);
    CHECK(c.tie_word_embeddings && c.bos_token_id == 50256 &&
          c.eos_token_id == 50256);
    /* n_inner given; plain gelu; unscaled scores */
    char *t = edit(GPT2_SMALL, "n_inner", "1000");
    char *t2 = edit(t, "activation_function", "'gelu'");
    char *t3 = edit(t2, "scale_attn_weights", "false");
    CHECK_OK(ctx, load(ctx, t3, &c));
    CHECK(c.intermediate == 1000 && c.act == TS_ACT_GELU &&
          c.attn_scale == 1.0);
    free(t), free(t2), free(t3);
    t = edit(GPT2_SMALL, "activation_function", "'relu'");
    expect_error(ctx, t, TS_ERR_UNSUPPORTED,
                 "activation_function \"relu\" is not supported (supported: "
                 "silu, swish, gelu, gelu_new, gelu_pytorch_tanh, gelu_fast)");
    free(t);
    t = edit(GPT2_SMALL, "scale_attn_by_inverse_layer_idx", "true");
    expect_error(ctx, t, TS_ERR_UNSUPPORTED,
                 "scale_attn_by_inverse_layer_idx other than false is not "
                 "supported");
    free(t);
    t = edit(GPT2_SMALL, "n_embd", "770");
    expect_error(ctx, t, TS_ERR_IO,
                 "invalid n_embd (must be n_head x the head size)");
    free(t);
    t = edit(GPT2_SMALL, "n_layer", "0");
    expect_error(ctx, t, TS_ERR_RANGE, "n_layer is 0; allowed 1 to 4096");
    free(t);
}

/* ---- errors ------------------------------------------------------------ */

/* review findings: what a field means beyond its value */
static void test_family_rules(ts_ctx *ctx) {
    ts_model_config c;
    /* Gemma 3's sliding_window_pattern 1: (i + 1) % 1 is 0 for every
     * layer, so no layer slides (Hugging Face); 0 is refused */
    const char *g3 =
        "{'model_type': 'gemma3_text', 'vocab_size': 64, 'hidden_size': 32,"
        " 'intermediate_size': 64, 'num_hidden_layers': 4,"
        " 'num_attention_heads': 2, 'num_key_value_heads': 1, 'head_dim': 16,"
        " 'sliding_window': 8, 'sliding_window_pattern': %d}";
    char text[512];
    snprintf(text, sizeof text, g3, 1);
    CHECK_OK(ctx, load(ctx, text, &c));
    for (int64_t i = 0; i < c.layers; i++)
        CHECK(!ts_model_layer_sliding(&c, i));
    snprintf(text, sizeof text, g3, 6);
    CHECK_OK(ctx, load(ctx, text, &c));
    CHECK(ts_model_layer_sliding(&c, 0) && ts_model_layer_sliding(&c, 3));
    snprintf(text, sizeof text, g3, 0);
    expect_error(ctx, text, TS_ERR_IO, "sliding_window_pattern is 0");
    /* rope_parameters whose sliding theta equals the full one */
    CHECK_OK(ctx, load(ctx,
                       "{'model_type': 'gemma3_text', 'vocab_size': 64,"
                       " 'hidden_size': 32, 'intermediate_size': 64,"
                       " 'num_hidden_layers': 2, 'num_attention_heads': 2,"
                       " 'head_dim': 16, 'rope_parameters': {"
                       " 'full_attention': {'rope_type': 'default',"
                       " 'rope_theta': 1000000.0}, 'sliding_attention':"
                       " {'rope_type': 'default', 'rope_theta': 1000000.0}}}",
                       &c));
    CHECK(c.rope_theta == 1e6 && c.rope_local_theta == 1e6);
    /* Mixtral's layers are always sparse; Llama's mlp_bias is refused by
     * name */
    expect_error(ctx,
                 "{'model_type': 'mixtral', 'vocab_size': 64,"
                 " 'hidden_size': 32, 'intermediate_size': 64,"
                 " 'num_hidden_layers': 2, 'num_attention_heads': 2,"
                 " 'num_local_experts': 0, 'num_experts_per_tok': 1}",
                 TS_ERR_IO, "num_local_experts is 0");
    CHECK_OK(ctx, load(ctx,
                       "{'model_type': 'llama', 'vocab_size': 64,"
                       " 'hidden_size': 32, 'intermediate_size': 64,"
                       " 'num_hidden_layers': 2, 'num_attention_heads': 2,"
                       " 'mlp_bias': true}",
                       &c));
    CHECK(c.mlp_bias && c.gated);
}

static void test_errors(ts_ctx *ctx) {
    const char *types[] = {"qwen3",   "qwen2",     "llama",       "gpt2",
                           "mistral", "gemma2",    "gemma3_text", "gemma3",
                           "phi3",    "qwen3_moe", "mixtral"};
    ts_model_config c;
    /* unknown model type / class: named, every supported type listed */
    CHECK(load(ctx, "{'model_type': 'mamba', 'vocab_size': 5}", &c) ==
          TS_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, "model type \"mamba\" is not supported (supported: ");
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        CHECK_MSG(ctx, types[i]);
    ts_clear_error(ctx);
    CHECK(load(ctx, "{'architectures': ['RwkvForCausalLM']}", &c) ==
          TS_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, "architectures entry \"RwkvForCausalLM\" is not supported "
                   "and no model_type is given (supported model types: qwen3, "
                   "qwen2, llama, gpt2, mistral, gemma2, gemma3_text, gemma3 "
                   "(its text_config), phi3, qwen3_moe, mixtral)");
    ts_clear_error(ctx);
    expect_error(ctx, "{'vocab_size': 5}", TS_ERR_UNSUPPORTED,
                 "no model_type nor architectures entry");
    /* missing fields: named with the family */
    char *t = edit(GEMMA2_2B, "hidden_size", NULL);
    expect_error(ctx, t, TS_ERR_IO,
                 "missing field \"hidden_size\", which model type gemma2 "
                 "requires");
    free(t);
    t = edit(GPT2_SMALL, "n_head", NULL);
    expect_error(ctx, t, TS_ERR_IO,
                 "missing field \"n_head\", which model type gpt2 requires");
    free(t);
    /* rope_scaling */
    t = edit(LLAMA32_1B, "rope_scaling", "{'type': 'dynamic', 'factor': 2.0}");
    expect_error(ctx, t, TS_ERR_UNSUPPORTED,
                 "rope_scaling type \"dynamic\" is not supported (supported: "
                 "default, linear, llama3, longrope (or su), yarn)");
    free(t);
    t = edit(LLAMA32_1B, "rope_scaling", "{'factor': 2.0}");
    expect_error(ctx, t, TS_ERR_IO, "rope_scaling has no \"rope_type\"");
    free(t);
    t = edit(LLAMA32_1B, "rope_scaling",
             "{'rope_type': 'llama3', 'factor': 8.0, 'high_freq_factor': 4.0,"
             " 'original_max_position_embeddings': 8192}");
    expect_error(ctx, t, TS_ERR_IO,
                 "missing field \"rope_scaling.low_freq_factor\"");
    free(t);
    t = edit(LLAMA32_1B, "rope_scaling",
             "{'rope_type': 'llama3', 'factor': 8.0, 'high_freq_factor': 1.0,"
             " 'low_freq_factor': 4.0,"
             " 'original_max_position_embeddings': 8192}");
    expect_error(ctx, t, TS_ERR_RANGE,
                 "high_freq_factor (1) must be above low_freq_factor (4)");
    free(t);
    t = edit(LLAMA32_1B, "rope_scaling", "{'type': 'linear', 'factor': 0}");
    expect_error(ctx, t, TS_ERR_RANGE,
                 "rope_scaling.factor is 0; allowed above 0");
    free(t);
    t = edit(LLAMA32_1B, "rope_scaling", "{'type': 'linear'}");
    expect_error(ctx, t, TS_ERR_IO, "missing field \"rope_scaling.factor\"");
    free(t);
    t = edit(QWEN3_06B, "rope_scaling",
             "{'rope_type': 'yarn', 'factor': 4.0, 'beta_fast': -1}");
    expect_error(ctx, t, TS_ERR_RANGE, "rope_scaling.beta_fast is -1");
    free(t);
    /* ranges */
    t = edit(GEMMA2_2B, "attn_logit_softcapping", "-5.0");
    expect_error(ctx, t, TS_ERR_RANGE,
                 "attn_logit_softcapping is -5; allowed from 0");
    free(t);
    t = edit(MISTRAL_7B_V01, "sliding_window", "-1");
    expect_error(ctx, t, TS_ERR_IO,
                 "field \"sliding_window\" must be an integer >= 0");
    free(t);
    t = edit(GEMMA2_2B, "query_pre_attn_scalar", "0");
    expect_error(ctx, t, TS_ERR_RANGE, "query_pre_attn_scalar is 0");
    free(t);
    t = edit(LLAMA32_1B, "rope_theta", "0");
    expect_error(ctx, t, TS_ERR_RANGE, "rope_theta is 0; allowed above 0");
    free(t);
    t = edit(GEMMA3_1B, "rope_local_base_freq", "-1");
    expect_error(ctx, t, TS_ERR_RANGE, "rope_local_base_freq is -1");
    free(t);
    t = edit(LLAMA32_1B, "vocab_size", "2147483653");
    expect_error(ctx, t, TS_ERR_RANGE,
                 "vocab_size is 2147483653; allowed 1 to 2147483647");
    free(t);
    t = edit(LLAMA32_1B, "num_key_value_heads", "3");
    expect_error(ctx, t, TS_ERR_IO,
                 "num_key_value_heads (must divide num_attention_heads)");
    free(t);
    t = edit(QWEN3_30B_A3B, "mlp_only_layers",
             "[" /* 65 */
             "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,"
             "24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,"
             "45,46,47,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]");
    expect_error(ctx, t, TS_ERR_UNSUPPORTED,
                 "mlp_only_layers lists 65 layers; at most 64 are supported");
    free(t);
    /* wrong JSON types: named, never a crash */
    const struct {
        const char *base, *key, *value, *needle;
    } types_bad[] = {
        {LLAMA32_1B, "hidden_size", "'big'",
         "field \"hidden_size\" must be an integer >= 0 (model type llama)"},
        {LLAMA32_1B, "hidden_size", "2048.0", "\"hidden_size\" must be an"},
        {LLAMA32_1B, "rms_norm_eps", "'small'",
         "field \"rms_norm_eps\" must be a number"},
        {LLAMA32_1B, "tie_word_embeddings", "1",
         "field \"tie_word_embeddings\" must be true or false"},
        {LLAMA32_1B, "rope_scaling", "[8]",
         "field \"rope_scaling\" must be an object or null"},
        {LLAMA32_1B, "rope_scaling", "{'rope_type': 3}",
         "field \"rope_scaling.rope_type\" must be a string"},
        {LLAMA32_1B, "rope_scaling", "{'rope_type': 'linear', 'factor': 'x'}",
         "field \"rope_scaling.factor\" must be a number"},
        {LLAMA32_1B, "hidden_act", "5",
         "field \"hidden_act\" must be a string"},
        {LLAMA32_1B, "model_type", "7",
         "field \"model_type\" must be a string"},
        {QWEN3_30B_A3B, "mlp_only_layers", "'none'",
         "field \"mlp_only_layers\" must be a list of layer indices"},
        {QWEN3_30B_A3B, "mlp_only_layers", "[1, 'two']",
         "must be a list of layer indices (integers >= 0)"},
        {GEMMA3_1B, "layer_types", "5", "field \"layer_types\" must be a list"},
        {GEMMA3_1B, "sliding_window_pattern", "'six'",
         "field \"sliding_window_pattern\" must be an integer"},
        {GEMMA3_1B, "sliding_window_pattern", "100000",
         "sliding_window_pattern is 100000; allowed 0 to 4096"},
        {PHI3_MINI_4K, "partial_rotary_factor", "'half'",
         "field \"partial_rotary_factor\" must be a number or true/false"},
        {PHI3_MINI_4K, "rope_scaling",
         "{'type': 'longrope', 'short_factor': 'x', 'long_factor': []}",
         "field \"rope_scaling.short_factor\" must be a list of numbers"},
    };
    for (size_t i = 0; i < sizeof types_bad / sizeof *types_bad; i++) {
        t = edit(types_bad[i].base, types_bad[i].key, types_bad[i].value);
        CHECK(load(ctx, t, &c) != TS_OK);
        CHECK_MSG(ctx, types_bad[i].needle);
        ts_clear_error(ctx);
        free(t);
    }
    /* odd but harmless: eos a string -> none; a huge integer is a JSON
     * error; an array at the top */
    t = edit(LLAMA32_1B, "eos_token_id", "'</s>'");
    CHECK_OK(ctx, load(ctx, t, &c));
    CHECK(c.eos_token_id == -1);
    free(t);
    expect_error(ctx, "{'model_type': 'llama', 'vocab_size': 1e999}", TS_ERR_IO,
                 "not valid JSON");
    expect_error(ctx,
                 "{'model_type': 'llama', 'vocab_size': "
                 "99999999999999999999999}",
                 TS_ERR_IO, "not valid JSON");
    expect_error(ctx, "[1, 2]", TS_ERR_IO, "not a JSON object");
}

/* Every field of every published config set to each odd value: an error
 * or a config that passes the checks, never a crash or a NaN. */
static void test_odd_values(ts_ctx *ctx) {
    const char *configs[] = {LLAMA32_1B,   MISTRAL_7B_V01, QWEN25_05B,
                             QWEN3_06B,    GEMMA2_2B,      GEMMA3_1B,
                             GEMMA3_4B,    PHI3_MINI_4K,   QWEN3_30B_A3B,
                             MIXTRAL_8X7B, GPT2_SMALL};
    const char *odd[] = {
        "null", "'x'",   "[]",   "{}",     "-1",
        "0",    "1e308", "true", "[1, 2]", "9223372036854775807",
        "0.5"};
    int loads = 0, oks = 0;
    for (size_t k = 0; k < sizeof configs / sizeof *configs; k++) {
        char *fixed = edit(configs[k], "_", NULL);
        json_t *root = json_loads(fixed, 0, NULL);
        free(fixed);
        const char *key;
        json_t *v;
        json_object_foreach(root, key, v) {
            (void)v;
            for (size_t o = 0; o < sizeof odd / sizeof *odd; o++) {
                char *t = edit(configs[k], key, odd[o]);
                ts_model_config c;
                ts_status s = load(ctx, t, &c);
                loads++;
                if (s == TS_OK) {
                    oks++;
                    bool sane = c.vocab >= 1 && c.hidden >= 1 &&
                                c.head_dim >= 1 && isfinite(c.norm_eps) &&
                                isfinite(c.rope_theta) &&
                                isfinite(c.attn_scale) &&
                                isfinite(c.rope_attention_factor) &&
                                (c.n_experts == 0 ||
                                 (c.experts_per_tok >= 1 &&
                                  c.experts_per_tok <= c.n_experts));
                    CHECK(sane);
                } else {
                    CHECK(strlen(ts_errmsg(ctx)) > 0);
                }
                ts_clear_error(ctx);
                free(t);
            }
        }
        json_decref(root);
    }
    CHECK(loads > 500 && oks > 0 && oks < loads);
}

/* ---- presets and names ------------------------------------------------- */

static void test_presets(ts_ctx *ctx) {
    ts_model_config c;
    CHECK_OK(ctx, ts_model_config_preset(ctx, "gemma2", &c));
    CHECK(c.arch == TS_ARCH_GEMMA2 && c.vocab == 0 && c.hidden == 0 &&
          c.layers == 0 && c.heads == 0 && c.kv_heads == 0 && c.head_dim == 0 &&
          c.intermediate == 0 && c.max_positions == 0);
    CHECK(c.norm == TS_NORM_RMS_1P && c.sandwich_norm && c.embed_scale &&
          c.attn_softcap == 50 && c.final_softcap == 30 &&
          c.attn_scale == 1.0 / 16 && c.sliding_window == 4096 &&
          c.sliding_pattern == 2 && c.tie_word_embeddings &&
          c.act == TS_ACT_GELU_TANH && c.gated && c.norm_eps == 1e-6 &&
          c.rope_theta == 10000);
    CHECK(c.bos_token_id == -1 && c.eos_token_id == -1 && c.dtype == TS_F32);
    CHECK_OK(ctx, ts_model_config_preset(ctx, "gemma3_text", &c));
    CHECK(c.qk_norm && c.sliding_pattern == 6 && c.rope_local_theta == 10000 &&
          c.rope_theta == 1e6 && c.attn_softcap == 0);
    CHECK_OK(ctx, ts_model_config_preset(ctx, "qwen3_moe", &c));
    CHECK(c.n_experts == 0 && c.experts_per_tok == 0 &&
          c.moe_intermediate == 0 && c.moe_step == 1 && c.qk_norm &&
          c.sliding_window == 0 && c.router_aux_loss_coef == 0.001);
    CHECK_OK(ctx, ts_model_config_preset(ctx, "mixtral", &c));
    CHECK(c.n_experts == 0 && c.moe_intermediate == 0 && c.norm_topk_prob &&
          c.moe_step == 1 && c.rope_theta == 1e6);
    CHECK_OK(ctx, ts_model_config_preset(ctx, "gpt2", &c));
    CHECK(c.pos == TS_POS_LEARNED && c.norm == TS_NORM_LAYER && c.conv1d &&
          c.fused_qkv && !c.gated && c.tie_word_embeddings &&
          c.norm_eps == 1e-5 && c.hidden == 0);
    CHECK_OK(ctx, ts_model_config_preset(ctx, "phi3", &c));
    CHECK(c.fused_qkv && c.fused_gate_up && c.norm_eps == 1e-5 &&
          c.sliding_window == 0);
    CHECK_OK(ctx, ts_model_config_preset(ctx, "qwen2", &c));
    CHECK(c.attention_bias && !c.o_bias && c.sliding_window == 0 &&
          c.sliding_from == 28);
    CHECK(ts_model_config_preset(ctx, "mamba", &c) == TS_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, "model type \"mamba\" is not supported (supported: qwen3");
    ts_clear_error(ctx);
    /* every arch has its name, and its preset is that arch */
    for (int a = 0; a < TS_ARCH_COUNT; a++) {
        const char *name = ts_arch_name((ts_arch)a);
        CHECK(strcmp(name, "unknown") != 0);
        CHECK_OK(ctx, ts_model_config_preset(ctx, name, &c));
        CHECK(c.arch == (ts_arch)a && !strcmp(c.model_type, name));
        for (int b = 0; b < a; b++)
            CHECK(strcmp(name, ts_arch_name((ts_arch)b)) != 0);
    }
    CHECK(!strcmp(ts_arch_name(TS_ARCH_COUNT), "unknown"));
    CHECK(!strcmp(ts_arch_name(TS_ARCH_GEMMA3), "gemma3_text"));
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/ts_configs_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    ts_ctx *ctx = test_ctx();
    test_llama(ctx);
    test_mistral(ctx);
    test_qwen2(ctx);
    test_qwen3(ctx);
    test_gemma2(ctx);
    test_gemma3(ctx);
    test_phi3(ctx);
    test_qwen3_moe(ctx);
    test_mixtral(ctx);
    test_gpt2(ctx);
    test_family_rules(ctx);
    test_errors(ctx);
    test_odd_values(ctx);
    test_presets(ctx);
    ts_ctx_free(ctx);
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    rmdir(dir);
    return test_finish("test_configs");
}
