/* test_hf_models.c — Hugging Face model folders as they are: config.json
 * for each supported architecture (fields, defaults, llama3 rope scaling,
 * errors naming the field), and Qwen3 models written by
 * tests/reference/hf_qwen3.py and Qwen2/Llama ones by hf_decoders.py,
 * loaded and run: logits equal the PyTorch references' to 1e-4 of the logit
 * scale (f32 and bf16 weights, tied and untied, GQA 1/2/4, sharded, q/k/v
 * biases, llama3 rope scaling) and 32 greedy tokens through the KV cache
 * equal theirs. argv[1]: the folder those scripts wrote. */
#include "tessera_models.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *dir;

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f)
        fputs(text, f), fclose(f);
}

static void test_configs(ts_ctx *ctx) {
    char p[512];
    ts_model_config c;
    /* Llama 3.2 1B as published (abridged to the fields read) */
    snprintf(p, sizeof p, "%s/llama.json", dir);
    write_text(
        p,
        "{\"architectures\": [\"LlamaForCausalLM\"], \"bos_token_id\": 128000,"
        " \"eos_token_id\": [128001, 128008, 128009], \"head_dim\": 64,"
        " \"hidden_size\": 2048, \"intermediate_size\": 8192,"
        " \"max_position_embeddings\": 131072, \"model_type\": \"llama\","
        " \"num_attention_heads\": 32, \"num_hidden_layers\": 16,"
        " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05,"
        " \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0,"
        " \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192,"
        " \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0,"
        " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
        " \"vocab_size\": 128256}");
    CHECK_OK(ctx, ts_config_load(ctx, p, &c));
    CHECK(c.arch == TS_ARCH_LLAMA && c.hidden == 2048 && c.kv_heads == 8 &&
          c.head_dim == 64);
    CHECK(c.rope == TS_ROPE_LLAMA3 && c.rope_factor == 32.0 &&
          c.rope_original_max_positions == 8192);
    CHECK(c.rope_theta == 500000.0 && c.tie_word_embeddings &&
          c.dtype == TS_BF16);
    CHECK(c.eos_token_id == 128001 && c.bos_token_id == 128000 &&
          !c.attention_bias);
    /* Qwen2: no head_dim (hidden / heads), biases on q, k, v */
    snprintf(p, sizeof p, "%s/qwen2.json", dir);
    write_text(p, "{\"model_type\": \"qwen2\", \"hidden_size\": 896, "
                  "\"intermediate_size\": 4864,"
                  " \"num_attention_heads\": 14, \"num_hidden_layers\": 24,"
                  " \"num_key_value_heads\": 2, \"vocab_size\": 151936,"
                  " \"rope_theta\": 1000000.0, \"tie_word_embeddings\": true}");
    CHECK_OK(ctx, ts_config_load(ctx, p, &c));
    CHECK(c.arch == TS_ARCH_QWEN2 && c.head_dim == 64 && c.attention_bias &&
          !c.qk_norm);
    /* GPT-2 small */
    snprintf(p, sizeof p, "%s/gpt2.json", dir);
    write_text(p, "{\"activation_function\": \"gelu_new\", \"architectures\": "
                  "[\"GPT2LMHeadModel\"],"
                  " \"model_type\": \"gpt2\", \"n_ctx\": 1024, \"n_embd\": "
                  "768, \"n_head\": 12,"
                  " \"n_inner\": null, \"n_layer\": 12, \"n_positions\": 1024,"
                  " \"layer_norm_epsilon\": 1e-05, \"vocab_size\": 50257}");
    CHECK_OK(ctx, ts_config_load(ctx, p, &c));
    CHECK(c.arch == TS_ARCH_GPT2 && c.intermediate == 3072 &&
          c.head_dim == 64 && c.tie_word_embeddings &&
          c.max_positions == 1024 && c.norm_eps == 1e-5);
    /* the Qwen3 folders of the reference script */
    snprintf(p, sizeof p, "%s/gqa2_untied", dir);
    CHECK_OK(ctx, ts_config_load(ctx, p, &c));
    CHECK(c.arch == TS_ARCH_QWEN3 && c.qk_norm && c.head_dim == 16 &&
          c.hidden == 48);
    /* errors */
    snprintf(p, sizeof p, "%s/bad_unknown_type", dir);
    CHECK(ts_config_load(ctx, p, &c) == TS_ERR_UNSUPPORTED);
    CHECK_MSG(ctx, "model type \"mamba\" is not supported (supported: qwen3, "
                   "qwen2, llama, gpt2, mistral, gemma2, gemma3_text");
    ts_clear_error(ctx);
    snprintf(p, sizeof p, "%s/bad_no_field", dir);
    CHECK(ts_config_load(ctx, p, &c) == TS_ERR_IO);
    CHECK_MSG(ctx, "missing field \"hidden_size\"");
    ts_clear_error(ctx);
    snprintf(p, sizeof p, "%s/typo.json", dir);
    write_text(p, "{\"model_type\": \"llama\", \"vocab_size\": 10, "
                  "\"hidden_size\": \"big\"}");
    CHECK(ts_config_load(ctx, p, &c) == TS_ERR_IO);
    CHECK_MSG(ctx, "field \"hidden_size\" must be an integer");
    ts_clear_error(ctx);
    snprintf(p, sizeof p, "%s/broken.json", dir);
    write_text(p, "{\"model_type\": ");
    CHECK(ts_config_load(ctx, p, &c) == TS_ERR_IO);
    CHECK_MSG(ctx, "broken.json");
    ts_clear_error(ctx);
    snprintf(p, sizeof p, "%s/kv.json", dir);
    write_text(p, "{\"model_type\": \"qwen3\", \"hidden_size\": 64, "
                  "\"intermediate_size\": 96,"
                  " \"num_attention_heads\": 4, \"num_hidden_layers\": 1,"
                  " \"num_key_value_heads\": 3, \"vocab_size\": 10}");
    CHECK(ts_config_load(ctx, p, &c) == TS_ERR_IO);
    CHECK_MSG(ctx, "num_key_value_heads (must divide num_attention_heads)");
    ts_clear_error(ctx);
}

static void test_model(ts_ctx *ctx, const char *name, bool any_decoder) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ts_decoder *m = NULL;
    CHECK_OK(ctx, any_decoder ? ts_decoder_load(ctx, p, &m)
                              : ts_decoder_load(ctx, p, &m));
    if (!m)
        return;
    size_t ni, nl;
    snprintf(p, sizeof p, "%s/%s.ids", dir, name);
    int64_t *raw = tu_read_file(p, &ni);
    snprintf(p, sizeof p, "%s/%s.logits", dir, name);
    float *want = tu_read_file(p, &nl);
    CHECK(raw && want);
    if (!raw || !want)
        return;
    int64_t shape[2] = {raw[0], raw[1]};
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, raw + 2);
    ts_tensor *logits = ts_decoder_forward(m, ids, 0);
    CHECK(logits != NULL);
    if (logits) {
        int64_t n = ts_tensor_numel(logits);
        CHECK((size_t)n * 4 == nl);
        float *got = ts_tensor_data(logits);
        double scale = 0, err = 0;
        for (int64_t i = 0; i < n && (size_t)i * 4 < nl; i++) {
            scale = fmax(scale, fabs(want[i]));
            err = fmax(err, fabs((double)got[i] - want[i]));
        }
        CHECK(err <= 1e-4 * scale);
        printf("%-14s max |logit| %.3f, max error %.2e (%.2e of the scale)\n",
               name, scale, err, err / scale);
    }
    ts_release(ids), ts_release(logits);
    /* greedy decoding through the KV cache: the reference's 32 tokens */
    size_t ng;
    snprintf(p, sizeof p, "%s/%s.greedy", dir, name);
    int64_t *ref = tu_read_file(p, &ng);
    int64_t got[32];
    CHECK(ref && ng == sizeof got);
    CHECK_OK(ctx, ts_decoder_generate_greedy(m, raw + 2, 5, 32, got));
    int same = 0;
    while (ref && same < 32 && got[same] == ref[same])
        same++;
    CHECK(same == 32);
    if (same < 32)
        fprintf(stderr, "%s: greedy differs at token %d\n", name, same);
    free(ref);
    /* the cache: the prompt in two pieces gives the one-pass logits */
    ts_decoder_cache *kc;
    CHECK_OK(ctx, ts_decoder_cache_new(m, 1, 8, &kc));
    int64_t s1[2] = {1, 3}, s2[2] = {1, 2}, s5[2] = {1, 5};
    ts_tensor *a = ts_from_data(ctx, TS_I64, 2, s1, raw + 2);
    ts_tensor *b = ts_from_data(ctx, TS_I64, 2, s2, raw + 5);
    ts_tensor *all = ts_from_data(ctx, TS_I64, 2, s5, raw + 2);
    ts_tensor *la = ts_decoder_forward_cached(m, kc, a);
    ts_tensor *lb = ts_decoder_forward_cached(m, kc, b);
    ts_tensor *lall = ts_decoder_forward(m, all, 0);
    ts_tensor *tail = ts_slice(lall, 1, 3, 5, 1);
    test_allclose("cached logits", lb, tail, 1e-5, 1e-5);
    CHECK(ts_decoder_cache_len(kc) == 5);
    ts_tensor *big = ts_from_data(ctx, TS_I64, 2, s5, raw + 2);
    CHECK(ts_decoder_forward_cached(m, kc, big) == NULL); /* 5 + 5 > 8 */
    CHECK_MSG(ctx, "do not fit the cache");
    ts_clear_error(ctx);
    ts_release(a), ts_release(b), ts_release(all), ts_release(la),
        ts_release(lb);
    ts_release(lall), ts_release(tail), ts_release(big);
    ts_decoder_cache_free(kc);
    free(raw), free(want);
    ts_decoder_free(m);
}

/* GPT-2: logits and 20 greedy tokens against the reference */
static void test_gpt2(ts_ctx *ctx, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_load(ctx, p, &m));
    if (!m)
        return;
    size_t ni, nl, ng;
    snprintf(p, sizeof p, "%s/%s.ids", dir, name);
    int64_t *raw = tu_read_file(p, &ni);
    snprintf(p, sizeof p, "%s/%s.logits", dir, name);
    float *want = tu_read_file(p, &nl);
    snprintf(p, sizeof p, "%s/%s.greedy", dir, name);
    int64_t *ref = tu_read_file(p, &ng);
    CHECK(raw && want && ref && ng == 20 * sizeof(int64_t));
    if (raw && want && ref) {
        int64_t shape[2] = {raw[0], raw[1]};
        ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, raw + 2);
        ts_tensor *logits = ts_decoder_forward(m, ids, 0);
        CHECK(logits && (size_t)ts_tensor_numel(logits) * 4 == nl);
        if (logits && (size_t)ts_tensor_numel(logits) * 4 == nl) {
            float *got = ts_tensor_data(logits);
            double scale = 0, err = 0;
            for (int64_t i = 0; i < ts_tensor_numel(logits); i++) {
                scale = fmax(scale, fabs(want[i]));
                err = fmax(err, fabs((double)got[i] - want[i]));
            }
            CHECK(err <= 1e-4 * scale);
            printf(
                "%-14s max |logit| %.3f, max error %.2e (%.2e of the scale)\n",
                name, scale, err, err / scale);
        }
        int64_t out[20];
        CHECK_OK(ctx, ts_decoder_generate_greedy(m, raw + 2, 5, 20, out));
        CHECK(!memcmp(out, ref, sizeof out));
        ts_release(ids), ts_release(logits);
    }
    free(raw), free(want), free(ref);
    ts_decoder_free(m);
}

static void test_bad_models(ts_ctx *ctx) {
    char p[1024];
    ts_decoder *m = NULL;
    snprintf(p, sizeof p, "%s/bad_missing_tensor", dir);
    CHECK(ts_decoder_load(ctx, p, &m) == TS_ERR_IO && !m);
    CHECK_MSG(ctx, "the checkpoint has no tensor \"model.norm.weight\"");
    ts_clear_error(ctx);
    snprintf(p, sizeof p, "%s/bad_wrong_shape", dir);
    CHECK(ts_decoder_load(ctx, p, &m) == TS_ERR_SHAPE && !m);
    CHECK_MSG(ctx, "tensor \"model.layers.0.mlp.gate_proj.weight\" has shape "
                   "[80, 48] in the "
                   "checkpoint; the config needs [81, 48]");
    ts_clear_error(ctx);
    char d2[600];
    snprintf(d2, sizeof d2, "%s/llama_dir", dir);
    mkdir(d2, 0755);
    snprintf(p, sizeof p, "%s/config.json", d2);
    write_text(p, "{\"model_type\": \"llama\", \"hidden_size\": 64, "
                  "\"intermediate_size\": 96,"
                  " \"num_attention_heads\": 4, \"num_hidden_layers\": 1, "
                  "\"vocab_size\": 10}");
    CHECK(ts_decoder_load(ctx, d2, &m) != TS_OK && !m);
    CHECK_MSG(ctx, "no model.safetensors");
    ts_clear_error(ctx);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR (from tests/reference/hf_qwen3.py)\n",
                argv[0]);
        return 2;
    }
    dir = argv[1];
    ts_ctx *ctx = test_ctx();
    test_configs(ctx);
    const char *models[] = {"gqa2_untied", "mha_tied", "gqa4_sharded",
                            "bf16_tied"};
    for (int i = 0; i < 4; i++)
        test_model(ctx, models[i], false);
    /* the same decoder for Qwen2 (q/k/v biases) and Llama (llama3 rope) */
    const char *others[] = {"qwen2_tied", "llama_gqa4", "llama3_scaled"};
    for (int i = 0; i < 3; i++)
        test_model(ctx, others[i], true);
    /* the bf16 checkpoint kept in bf16 (computed in f32): same logits */
    {
        char p[512];
        snprintf(p, sizeof p, "%s/bf16_tied", dir);
        ts_decoder *m32 = NULL, *m16 = NULL;
        CHECK_OK(ctx, ts_decoder_load(ctx, p, &m32));
        ts_load_options bf = {.weight_dtype = TS_BF16};
        CHECK_OK(ctx, ts_decoder_load_opts(ctx, p, &bf, &m16));
        CHECK(m16 && ts_tensor_dtype(ts_decoder_find_param(
                         m16, "model.embed_tokens.weight")) == TS_BF16);
        int64_t ids[6] = {1, 5, 9, 2, 7, 3}, shape[2] = {1, 6};
        ts_tensor *t = ts_from_data(ctx, TS_I64, 2, shape, ids);
        ts_tensor *a = ts_decoder_forward(m32, t, 0),
                  *b = ts_decoder_forward(m16, t, 0);
        /* at AVX512_BF16 the products round the activations to bf16 too
         * (2-9e-3 of the logits' scale here); elsewhere bf16 weights are
         * only widened */
        bool bf16_gemm = !strcmp(ts_cpu_isa(), "avx512_bf16") ||
                         !strcmp(ts_cpu_isa(), "amx");
        test_allclose("bf16-kept weights", b, a, bf16_gemm ? 0 : 1e-4,
                      bf16_gemm ? 0.1 : 1e-4);
        int64_t g32[12], g16[12];
        CHECK_OK(ctx, ts_decoder_generate_greedy(m32, ids, 6, 12, g32));
        CHECK_OK(ctx, ts_decoder_generate_greedy(m16, ids, 6, 12, g16));
        CHECK(!memcmp(g32, g16, sizeof g32));
        ts_release(t), ts_release(a), ts_release(b);
        ts_decoder_free(m32), ts_decoder_free(m16);
        ts_load_options i32 = {.weight_dtype = TS_I32};
        CHECK(ts_decoder_load_opts(ctx, p, &i32, &m16) == TS_ERR_DTYPE);
        CHECK_MSG(ctx, "weights can be kept in f32 or bf16, not i32");
        ts_clear_error(ctx);
    }
    /* zero copy: a checkpoint in the model's dtype is used where it is
     * mapped (no allocation the size of the weights), and stays writable
     * (copy on write) for an optimizer */
    {
        char p[512];
        snprintf(p, sizeof p, "%s/gqa2_untied", dir);
        ts_alloc_empty_cache(ctx);
        ts_alloc_stats a0, a1;
        ts_alloc_get_stats(ctx, &a0);
        ts_decoder *m = NULL;
        CHECK_OK(ctx, ts_decoder_load(ctx, p, &m));
        ts_alloc_get_stats(ctx, &a1);
        int64_t wbytes = 0;
        for (int i = 0; m && i < ts_decoder_num_params(m); i++)
            wbytes += ts_tensor_numel(ts_decoder_param(m, i)) * 4;
        CHECK(m && a1.bytes_in_use - a0.bytes_in_use < (size_t)wbytes / 10);
        ts_tensor *w = m ? ts_decoder_find_param(m, "model.norm.weight") : NULL;
        CHECK(w && ts_fill_(w, 2.0) == TS_OK &&
              ((float *)ts_tensor_data(w))[0] == 2.0f);
        ts_decoder_free(m);
    }
    test_gpt2(ctx, "gpt2_prefixed");
    test_gpt2(ctx, "gpt2_bare");
    test_bad_models(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_hf_models");
}
