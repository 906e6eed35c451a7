/* gguf_hf.c — a GGUF model seen as a Hugging Face folder, and a folder
 * written as GGUF metadata: config.json, tokenizer.json,
 * tokenizer_config.json and generation_config.json texts made from GGUF
 * metadata (architectures qwen3, qwen2, llama, gpt2; byte-level BPE
 * vocabularies); the GGUF's tensors under Hugging Face's names, viewed in
 * the mapping (a ts_safetensors handle) except the few that llama.cpp's
 * converter rearranged (Llama's q/k rows, GPT-2's Conv1D matrices),
 * which are put back in an anonymous mapping; and the reverse naming and
 * metadata for `tessera convert`. Owns nothing after it returns: the
 * handles it makes own their memory. The file format is gguf.c's. */
#define _GNU_SOURCE /* MAP_ANONYMOUS */
#include "io/gguf_internal.h"

#include "core/core.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- architectures and tensor names ---- */

typedef enum { FAM_DECODER, FAM_GPT2 } family;

static const struct {
    const char *arch, *cls;
    ts_arch ts;
    family fam;
} ARCHS[] = {{"qwen3", "Qwen3ForCausalLM", TS_ARCH_QWEN3, FAM_DECODER},
             {"qwen2", "Qwen2ForCausalLM", TS_ARCH_QWEN2, FAM_DECODER},
             {"llama", "LlamaForCausalLM", TS_ARCH_LLAMA, FAM_DECODER},
             {"gpt2", "GPT2LMHeadModel", TS_ARCH_GPT2, FAM_GPT2}};
#define N_ARCHS (int)(sizeof ARCHS / sizeof *ARCHS)

typedef struct {
    const char *gguf, *hf;
} name_pair;

/* llama-arch.cpp's names and Transformers' (weights and biases alike) */
static const name_pair DEC_GLOBAL[] = {{"token_embd", "model.embed_tokens"},
                                       {"output_norm", "model.norm"},
                                       {"output", "lm_head"}};
static const name_pair DEC_LAYER[] = {{"attn_norm", "input_layernorm"},
                                      {"ffn_norm", "post_attention_layernorm"},
                                      {"attn_q", "self_attn.q_proj"},
                                      {"attn_k", "self_attn.k_proj"},
                                      {"attn_v", "self_attn.v_proj"},
                                      {"attn_output", "self_attn.o_proj"},
                                      {"attn_q_norm", "self_attn.q_norm"},
                                      {"attn_k_norm", "self_attn.k_norm"},
                                      {"ffn_gate", "mlp.gate_proj"},
                                      {"ffn_up", "mlp.up_proj"},
                                      {"ffn_down", "mlp.down_proj"}};
static const name_pair GPT2_GLOBAL[] = {{"token_embd", "transformer.wte"},
                                        {"position_embd", "transformer.wpe"},
                                        {"output_norm", "transformer.ln_f"},
                                        {"output", "lm_head"}};
static const name_pair GPT2_LAYER[] = {
    {"attn_norm", "ln_1"},          {"attn_qkv", "attn.c_attn"},
    {"attn_output", "attn.c_proj"}, {"ffn_norm", "ln_2"},
    {"ffn_up", "mlp.c_fc"},         {"ffn_down", "mlp.c_proj"}};
#define N_OF(a) (int)(sizeof a / sizeof *a)

static const char *supported_archs(void) {
    return "qwen3, qwen2, llama, gpt2";
}

static int arch_index(const char *arch) {
    for (int i = 0; arch && i < N_ARCHS; i++)
        if (!strcmp(ARCHS[i].arch, arch))
            return i;
    return -1;
}

/* general.architecture's entry of ARCHS, or -1 with the error set */
static int gguf_arch(ts_gguf *g, const char **name) {
    const char *arch = NULL;
    if (ts_gguf_get_string(g, "general.architecture", &arch, NULL) != TS_OK)
        return -1;
    int a = arch_index(arch);
    if (name)
        *name = arch;
    if (a < 0)
        ts_set_error(ts_gguf_ctx(g), TS_ERR_UNSUPPORTED,
                     "%s: architecture \"%s\" is not supported (supported: "
                     "%s)",
                     ts_gguf_path(g), arch, supported_archs());
    return a;
}

/* "base.weight" -> base and suffix; false when there is no dot */
static bool split_suffix(const char *name, char *base, size_t cap,
                         const char **suffix) {
    const char *dot = strrchr(name, '.');
    if (!dot || (size_t)(dot - name) >= cap)
        return false;
    memcpy(base, name, (size_t)(dot - name));
    base[dot - name] = '\0';
    *suffix = dot + 1;
    return true;
}

/* GGUF's name -> Hugging Face's for family fam; false when unmapped */
static bool hf_of(family fam, const char *gguf, char *out, size_t cap) {
    char base[96];
    const char *suffix;
    if (!split_suffix(gguf, base, sizeof base, &suffix))
        return false;
    const name_pair *glob = fam == FAM_GPT2 ? GPT2_GLOBAL : DEC_GLOBAL;
    const name_pair *lay = fam == FAM_GPT2 ? GPT2_LAYER : DEC_LAYER;
    int ng = fam == FAM_GPT2 ? N_OF(GPT2_GLOBAL) : N_OF(DEC_GLOBAL);
    int nl = fam == FAM_GPT2 ? N_OF(GPT2_LAYER) : N_OF(DEC_LAYER);
    for (int i = 0; i < ng; i++)
        if (!strcmp(base, glob[i].gguf))
            return snprintf(out, cap, "%s.%s", glob[i].hf, suffix) < (int)cap;
    int layer, used = 0;
    if (sscanf(base, "blk.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0)
        return false;
    for (int i = 0; i < nl; i++)
        if (!strcmp(base + used, lay[i].gguf))
            return snprintf(out, cap, "%s.%d.%s.%s",
                            fam == FAM_GPT2 ? "transformer.h" : "model.layers",
                            layer, lay[i].hf, suffix) < (int)cap;
    return false;
}

ts_status ts_gguf_hf_name(const char *hf_name, char *out, size_t cap) {
    char base[160];
    const char *suffix;
    if (!hf_name || !out || !split_suffix(hf_name, base, sizeof base, &suffix))
        return TS_ERR_INVALID_ARG;
    /* GPT-2 checkpoints come with and without "transformer." */
    const char *b = base;
    bool gpt2 = !strncmp(b, "transformer.", 12) || !strncmp(b, "h.", 2) ||
                !strcmp(b, "wte") || !strcmp(b, "wpe") || !strcmp(b, "ln_f");
    char full[200];
    if (gpt2 && strncmp(b, "transformer.", 12) && strcmp(b, "lm_head")) {
        snprintf(full, sizeof full, "transformer.%s", b);
        b = full;
    }
    const name_pair *glob = gpt2 ? GPT2_GLOBAL : DEC_GLOBAL;
    const name_pair *lay = gpt2 ? GPT2_LAYER : DEC_LAYER;
    int ng = gpt2 ? N_OF(GPT2_GLOBAL) : N_OF(DEC_GLOBAL);
    int nl = gpt2 ? N_OF(GPT2_LAYER) : N_OF(DEC_LAYER);
    int n = -1;
    for (int i = 0; i < ng; i++)
        if (!strcmp(b, glob[i].hf))
            n = snprintf(out, cap, "%s.%s", glob[i].gguf, suffix);
    int layer, used = 0;
    const char *pat = gpt2 ? "transformer.h.%d.%n" : "model.layers.%d.%n";
    if (n < 0 && sscanf(b, pat, &layer, &used) == 1 && used > 0 && layer >= 0)
        for (int i = 0; i < nl; i++)
            if (!strcmp(b + used, lay[i].hf))
                n = snprintf(out, cap, "blk.%d.%s.%s", layer, lay[i].gguf,
                             suffix);
    if (n < 0)
        return TS_ERR_INVALID_ARG;
    return (size_t)n < cap ? TS_OK : TS_ERR_RANGE;
}

/* whether a Hugging Face tensor is stored rearranged in GGUF: Llama's q/k
 * weights and biases (rows permuted for llama.cpp's rope, by heads: q
 * by the query heads, k by the key-value heads), GPT-2's Conv1D matrices
 * (transposed) */
void ts_gguf_hf_tensor_rule(const ts_model_config *c, const char *hf_name,
                            int64_t *permute_heads, bool *transpose) {
    *permute_heads = 0, *transpose = false;
    if (!c || !hf_name)
        return;
    size_t n = strlen(hf_name);
    const char *end =
        n > 5 && !strcmp(hf_name + n - 5, ".bias")     ? hf_name + n - 5
        : n > 7 && !strcmp(hf_name + n - 7, ".weight") ? hf_name + n - 7
                                                       : NULL;
    if (!end)
        return;
    size_t stem = (size_t)(end - hf_name);
    if (c->arch == TS_ARCH_LLAMA && stem >= 6) {
        if (!strncmp(end - 6, "q_proj", 6))
            *permute_heads = c->heads;
        else if (!strncmp(end - 6, "k_proj", 6))
            *permute_heads = c->kv_heads;
    }
    static const char *const conv1d[] = {"attn.c_attn", "attn.c_proj",
                                         "mlp.c_fc", "mlp.c_proj"};
    if (c->arch == TS_ARCH_GPT2 && *end == '.' && end[1] == 'w')
        for (int i = 0; i < 4; i++) {
            size_t k = strlen(conv1d[i]);
            if (stem >= k && !strncmp(end - k, conv1d[i], k))
                *transpose = true;
        }
}

/* rows of rows_total x row_bytes from src to dst, llama.cpp's rope order
 * (to_gguf) or back: within each of n_head heads of D rows, HF row
 * t * D/2 + j is GGUF row 2 j + t */
static void permute_rows(unsigned char *dst, const unsigned char *src,
                         int64_t rows, size_t row_bytes, int64_t n_head,
                         bool to_gguf) {
    int64_t D = rows / n_head, half = D / 2;
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t t = 0; t < 2; t++)
            for (int64_t j = 0; j < half; j++) {
                int64_t hf = h * D + t * half + j, gg = h * D + 2 * j + t;
                memcpy(dst + (size_t)(to_gguf ? gg : hf) * row_bytes,
                       src + (size_t)(to_gguf ? hf : gg) * row_bytes,
                       row_bytes);
            }
}

ts_tensor *ts_gguf_permute_rows(ts_tensor *w, int64_t n_head, bool to_gguf) {
    if (!w)
        return NULL;
    ts_ctx *ctx = ts_tensor_ctx(w);
    int nd = ts_tensor_ndim(w);
    const int64_t *shape = ts_tensor_shape(w);
    int64_t rows = nd ? shape[0] : 0;
    if (nd < 1 || nd > 2 || n_head < 1 || rows % n_head ||
        (rows / n_head) % 2) {
        ts_set_error(ctx, TS_ERR_SHAPE,
                     "permute_rows: %lld rows in %lld heads of an even "
                     "size are needed (%d dims)",
                     (long long)rows, (long long)n_head, nd);
        return NULL;
    }
    ts_tensor *c = ts_dtype_is_quantized(ts_tensor_dtype(w)) ? ts_retain(w)
                                                             : ts_contiguous(w);
    ts_tensor *h = c ? ts_host_copy(c) : NULL;
    ts_release(c);
    const unsigned char *src = h ? ts_tensor_data(h) : NULL;
    if (src && !ts_tensor_is_contiguous(h)) {
        ts_set_error(ctx, TS_ERR_INVALID_ARG,
                     "permute_rows: a block-format tensor must be "
                     "contiguous");
        src = NULL;
    }
    ts_tensor *out =
        src ? ts_tensor_new_host(ctx, ts_tensor_dtype(h), nd, shape) : NULL;
    unsigned char *dst = out ? ts_tensor_data(out) : NULL;
    if (dst) {
        size_t bytes =
            (size_t)ts_dtype_nbytes(ts_tensor_dtype(h), ts_tensor_numel(h));
        permute_rows(dst, src, rows, bytes / (size_t)rows, n_head, to_gguf);
    }
    ts_release(h);
    if (!dst) {
        ts_release(out);
        return NULL;
    }
    return ts_tensor_to_current(ctx, out);
}

/* ---- metadata helpers ---- */

/* {arch}.suffix */
static const char *akey(const char *arch, const char *suffix, char *buf,
                        size_t cap) {
    snprintf(buf, cap, "%s.%s", arch, suffix);
    return buf;
}

/* an unsigned key into *out: required (an error naming it when absent) or
 * def when absent; any other failure (a mistyped value) is an error */
static ts_status get_count(ts_gguf *g, const char *key, bool required,
                           uint64_t def, uint64_t *out) {
    if (ts_gguf_find_key(g, key) < 0) {
        if (required)
            return ts_set_error(ts_gguf_ctx(g), TS_ERR_IO,
                                "%s: no metadata key \"%s\", which the model "
                                "needs",
                                ts_gguf_path(g), key);
        *out = def;
        return TS_OK;
    }
    return ts_gguf_get_u64(g, key, out);
}

/* float32 values as the shortest decimal that reads back as the same
 * float (1e-06, not 9.99999997e-07): Hugging Face's config.json value */
static double short_decimal(float f) {
    char b[40];
    for (int p = 1; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)f);
        if (strtof(b, NULL) == f)
            return strtod(b, NULL);
    }
    return (double)f;
}

static ts_status get_real(ts_gguf *g, const char *key, bool required,
                          double def, double *out) {
    int64_t k = ts_gguf_find_key(g, key);
    if (k < 0) {
        if (required)
            return ts_set_error(ts_gguf_ctx(g), TS_ERR_IO,
                                "%s: no metadata key \"%s\", which the model "
                                "needs",
                                ts_gguf_path(g), key);
        *out = def;
        return TS_OK;
    }
    ts_status s = ts_gguf_get_f64(g, key, out);
    if (s == TS_OK && ts_gguf_kv_type(g, k) == TS_GGUF_FLOAT32)
        *out = short_decimal((float)*out);
    return s;
}

static char *dump(ts_ctx *ctx, const char *what, json_t *root) {
    /* compact: a tokenizer.json of 150k tokens and merges is made and
     * parsed again at every load */
    char *s =
        root ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!s)
        ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", what);
    return s;
}

/* the number of tokens in tokenizer.ggml.tokens, or 0 */
static uint64_t token_count(ts_gguf *g) {
    ts_gguf_type et;
    uint64_t n = 0;
    if (ts_gguf_find_key(g, "tokenizer.ggml.tokens") < 0 ||
        ts_gguf_get_array(g, "tokenizer.ggml.tokens", &et, &n) != TS_OK ||
        et != TS_GGUF_STRING) {
        ts_clear_error(ts_gguf_ctx(g));
        return 0;
    }
    return n;
}

/* tokenizer.ggml.<what>_token_id when present and a valid id: >= 0 */
static int64_t special_id(ts_gguf *g, const char *what) {
    char key[80];
    snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", what);
    uint32_t id;
    if (ts_gguf_find_key(g, key) < 0)
        return -1;
    if (ts_gguf_get_u32(g, key, &id) != TS_OK) {
        ts_clear_error(ts_gguf_ctx(g));
        return -1;
    }
    return id;
}

static bool has_tensor(ts_gguf *g, const char *name) {
    return ts_gguf_find_tensor(g, name) >= 0;
}

/* ---- config.json ---- */

/* rope_scaling from {arch}.rope.scaling.*; NULL when there is none */
static ts_status rope_scaling(ts_gguf *g, const char *arch, json_t **out) {
    *out = NULL;
    char k[160];
    ts_ctx *ctx = ts_gguf_ctx(g);
    if (has_tensor(g, "rope_freqs.weight"))
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "%s: rope_freqs.weight (llama.cpp's form of "
                            "Llama 3.1's rope scaling) is not supported yet",
                            ts_gguf_path(g));
    const char *type = NULL;
    if (ts_gguf_find_key(g, akey(arch, "rope.scaling.type", k, sizeof k)) < 0)
        return TS_OK;
    ts_status s = ts_gguf_get_string(g, k, &type, NULL);
    if (s != TS_OK || !strcmp(type, "none"))
        return s;
    double factor;
    uint64_t orig;
    if ((s = get_real(g, akey(arch, "rope.scaling.factor", k, sizeof k), true,
                      1, &factor)) != TS_OK)
        return s;
    if (!strcmp(type, "linear")) {
        *out = json_pack("{s:s, s:f}", "rope_type", "linear", "factor", factor);
        return TS_OK;
    }
    if (!strcmp(type, "yarn")) {
        if ((s = get_count(g,
                           akey(arch, "rope.scaling.original_context_length", k,
                                sizeof k),
                           true, 0, &orig)) != TS_OK)
            return s;
        *out =
            json_pack("{s:s, s:f, s:I}", "rope_type", "yarn", "factor", factor,
                      "original_max_position_embeddings", (json_int_t)orig);
        return TS_OK;
    }
    return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                        "%s: %s is \"%s\" (supported: none, linear, yarn)",
                        ts_gguf_path(g), k, type);
}

static const char *torch_dtype_of(ts_gguf *g) {
    switch (
        ts_gguf_tensor_type(g, ts_gguf_find_tensor(g, "token_embd.weight"))) {
    case TS_GGML_F32:
        return "float32";
    case TS_GGML_F16:
        return "float16";
    case TS_GGML_BF16:
        return "bfloat16";
    default:
        return NULL;
    }
}

ts_status ts_gguf_hf_config_json(ts_ctx *ctx, ts_gguf *g, char **json) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!g || !json)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_gguf_hf_config_json: NULL argument");
    *json = NULL;
    const char *arch;
    int a = gguf_arch(g, &arch);
    if (a < 0)
        return ts_ctx_status(ctx);
    char k[160];
    uint64_t hidden, layers, heads, kv, ffn, ctx_len, head_dim, vlen, rdim,
        vocab = token_count(g);
    double eps, theta;
    bool gpt2 = ARCHS[a].fam == FAM_GPT2;
    ts_status s;
    if ((s = get_count(g, akey(arch, "embedding_length", k, sizeof k), true, 0,
                       &hidden)) ||
        (s = get_count(g, akey(arch, "block_count", k, sizeof k), true, 0,
                       &layers)) ||
        (s = get_count(g, akey(arch, "attention.head_count", k, sizeof k), true,
                       0, &heads)) ||
        (s = get_count(g, akey(arch, "attention.head_count_kv", k, sizeof k),
                       false, heads, &kv)) ||
        (s = get_count(g, akey(arch, "feed_forward_length", k, sizeof k), !gpt2,
                       4 * hidden, &ffn)) ||
        (s = get_count(g, akey(arch, "context_length", k, sizeof k), true, 0,
                       &ctx_len)) ||
        (s = get_real(g,
                      akey(arch,
                           gpt2 ? "attention.layer_norm_epsilon"
                                : "attention.layer_norm_rms_epsilon",
                           k, sizeof k),
                      true, 0, &eps)))
        return s;
    if (!vocab && (s = get_count(g, akey(arch, "vocab_size", k, sizeof k),
                                 false, 0, &vocab)) != TS_OK)
        return s;
    if (!vocab) { /* the embedding's rows */
        int64_t ne[4];
        if (ts_gguf_tensor_ne(g, ts_gguf_find_tensor(g, "token_embd.weight"),
                              ne) == 2)
            vocab = (uint64_t)ne[1];
    }
    if (!vocab)
        return ts_set_error(ctx, TS_ERR_IO,
                            "%s: no vocabulary size (no tokenizer.ggml.tokens, "
                            "%s.vocab_size nor token_embd.weight)",
                            ts_gguf_path(g), arch);
    if (!heads || hidden % heads)
        return ts_set_error(ctx, TS_ERR_IO,
                            "%s: %s.attention.head_count is %llu for an "
                            "embedding of %llu",
                            ts_gguf_path(g), arch, (unsigned long long)heads,
                            (unsigned long long)hidden);
    bool tied = !has_tensor(g, "output.weight");
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", ARCHS[a].cls));
    json_object_set_new(c, "model_type", json_string(arch));
    json_object_set_new(c, "vocab_size", json_integer((json_int_t)vocab));
    if (gpt2) {
        json_object_set_new(c, "n_embd", json_integer((json_int_t)hidden));
        json_object_set_new(c, "n_layer", json_integer((json_int_t)layers));
        json_object_set_new(c, "n_head", json_integer((json_int_t)heads));
        json_object_set_new(c, "n_positions",
                            json_integer((json_int_t)ctx_len));
        json_object_set_new(c, "n_ctx", json_integer((json_int_t)ctx_len));
        json_object_set_new(c, "n_inner", json_integer((json_int_t)ffn));
        json_object_set_new(c, "layer_norm_epsilon", json_real(eps));
        json_object_set_new(c, "activation_function", json_string("gelu_new"));
    } else {
        if ((s = get_count(g, akey(arch, "attention.key_length", k, sizeof k),
                           false, hidden / heads, &head_dim)) ||
            (s = get_count(g, akey(arch, "attention.value_length", k, sizeof k),
                           false, head_dim, &vlen)) ||
            (s = get_count(g, akey(arch, "rope.dimension_count", k, sizeof k),
                           false, head_dim, &rdim)) ||
            (s = get_real(g, akey(arch, "rope.freq_base", k, sizeof k), false,
                          10000, &theta))) {
            json_decref(c);
            return s;
        }
        if (vlen != head_dim || rdim != head_dim) {
            json_decref(c);
            return ts_set_error(
                ctx, TS_ERR_UNSUPPORTED,
                "%s: %s with key length %llu, value length %llu and rope "
                "dims %llu: only equal ones (full rotary) are supported",
                ts_gguf_path(g), arch, (unsigned long long)head_dim,
                (unsigned long long)vlen, (unsigned long long)rdim);
        }
        json_t *rs;
        if ((s = rope_scaling(g, arch, &rs)) != TS_OK) {
            json_decref(c);
            return s;
        }
        json_object_set_new(c, "hidden_size", json_integer((json_int_t)hidden));
        json_object_set_new(c, "num_hidden_layers",
                            json_integer((json_int_t)layers));
        json_object_set_new(c, "num_attention_heads",
                            json_integer((json_int_t)heads));
        json_object_set_new(c, "num_key_value_heads",
                            json_integer((json_int_t)kv));
        json_object_set_new(c, "head_dim", json_integer((json_int_t)head_dim));
        json_object_set_new(c, "intermediate_size",
                            json_integer((json_int_t)ffn));
        json_object_set_new(c, "max_position_embeddings",
                            json_integer((json_int_t)ctx_len));
        json_object_set_new(c, "rms_norm_eps", json_real(eps));
        json_object_set_new(c, "rope_theta", json_real(theta));
        if (rs)
            json_object_set_new(c, "rope_scaling", rs);
        if (ARCHS[a].ts != TS_ARCH_QWEN2)
            json_object_set_new(
                c, "attention_bias",
                json_boolean(has_tensor(g, "blk.0.attn_q.bias")));
        if (ARCHS[a].ts == TS_ARCH_LLAMA)
            json_object_set_new(
                c, "mlp_bias",
                json_boolean(has_tensor(g, "blk.0.ffn_up.bias")));
    }
    json_object_set_new(c, "tie_word_embeddings", json_boolean(tied));
    const char *dt = torch_dtype_of(g);
    if (dt)
        json_object_set_new(c, "torch_dtype", json_string(dt));
    int64_t bos = special_id(g, "bos"), eos = special_id(g, "eos");
    if (bos >= 0)
        json_object_set_new(c, "bos_token_id", json_integer(bos));
    if (eos >= 0)
        json_object_set_new(c, "eos_token_id", json_integer(eos));
    return (*json = dump(ctx, ts_gguf_path(g), c)) ? TS_OK : TS_ERR_OOM;
}

/* ---- tokenizer.json ---- */

#define QWEN2_SPLIT                                                            \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "      \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define LLAMA3_SPLIT                                                           \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| " \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define GPT4O_SPLIT                                                            \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{"  \
    "Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?["  \
    "\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'"  \
    "s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\"  \
    "s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* tokenizer.ggml.pre -> what Hugging Face's tokenizer.json of that family
 * does: a Split regex (NULL: ByteLevel's own GPT-2 regex), NFC, BPE's
 * ignore_merges */
static const struct {
    const char *pre, *split;
    bool nfc, ignore_merges;
} PRES[] = {
    {"qwen2", QWEN2_SPLIT, true, false},
    {"llama-bpe", LLAMA3_SPLIT, false, true},
    {"llama3", LLAMA3_SPLIT, false, true},
    {"gpt-4o", GPT4O_SPLIT, false, false},
    {"gpt-2", NULL, false, false},
    /* older GGUFs without tokenizer.ggml.pre: GPT-2's byte-level split */
    {"default", NULL, false, false},
};
#define N_PRES (int)(sizeof PRES / sizeof *PRES)

static const char *pre_list(void) {
    return "qwen2, llama-bpe, llama3, gpt-4o, gpt-2, default";
}

enum { TOK_NORMAL = 1, TOK_CONTROL = 3, TOK_USER = 4, TOK_UNUSED = 5 };

static json_t *byte_level(bool use_regex, bool trim) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                     "add_prefix_space", 0, "trim_offsets", trim, "use_regex",
                     use_regex);
}

/* TemplateProcessing with bos before (and eos after) a text */
static json_t *template_post(const char *bos, int64_t bos_id, const char *eos,
                             int64_t eos_id) {
    json_t *single = json_array(), *pair = json_array(), *sp = json_object();
    for (int part = 0; part < 2; part++) {
        json_t *list = part ? pair : single;
        if (bos)
            json_array_append_new(list,
                                  json_pack("{s:{s:s, s:i}}", "SpecialToken",
                                            "id", bos, "type_id", part));
        json_array_append_new(list,
                              json_pack("{s:{s:s, s:i}}", "Sequence", "id",
                                        part ? "B" : "A", "type_id", part));
        if (eos)
            json_array_append_new(list,
                                  json_pack("{s:{s:s, s:i}}", "SpecialToken",
                                            "id", eos, "type_id", part));
    }
    if (bos)
        json_object_set_new(sp, bos,
                            json_pack("{s:s, s:[I], s:[s]}", "id", bos, "ids",
                                      (json_int_t)bos_id, "tokens", bos));
    if (eos)
        json_object_set_new(sp, eos,
                            json_pack("{s:s, s:[I], s:[s]}", "id", eos, "ids",
                                      (json_int_t)eos_id, "tokens", eos));
    return json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing",
                     "single", single, "pair", pair, "special_tokens", sp);
}

/* the token strings of ids bos and eos as JSON-ready copies (NULL: none) */
static char *token_text(ts_gguf *g, int64_t id, uint64_t n_tokens) {
    const char *s;
    size_t len;
    if (id < 0 || (uint64_t)id >= n_tokens ||
        ts_gguf_array_string(g, "tokenizer.ggml.tokens", (uint64_t)id, &s,
                             &len) != TS_OK)
        return NULL;
    char *c = malloc(len + 1);
    if (c) {
        memcpy(c, s, len);
        c[len] = '\0';
    }
    return c;
}

static bool get_flag(ts_gguf *g, const char *key, bool def) {
    bool b = def;
    if (ts_gguf_find_key(g, key) >= 0 && ts_gguf_get_bool(g, key, &b) != TS_OK)
        ts_clear_error(ts_gguf_ctx(g)), b = def;
    return b;
}

static ts_status check_vocab_model(ts_gguf *g) {
    ts_ctx *ctx = ts_gguf_ctx(g);
    const char *model = NULL;
    ts_status s = ts_gguf_get_string(g, "tokenizer.ggml.model", &model, NULL);
    if (s != TS_OK)
        return s;
    if (!strcmp(model, "gpt2"))
        return TS_OK;
    if (!strcmp(model, "llama"))
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "%s: tokenizer.ggml.model \"llama\" (a "
                            "SentencePiece vocabulary) is not supported yet; "
                            "only byte-level BPE (\"gpt2\") is",
                            ts_gguf_path(g));
    return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                        "%s: tokenizer.ggml.model \"%s\" is not supported "
                        "(only byte-level BPE, \"gpt2\")",
                        ts_gguf_path(g), model);
}

/* tokenizer.ggml.pre's entry of PRES, or -1 with the error set */
static int find_pre(ts_gguf *g) {
    const char *pre = "default";
    if (ts_gguf_find_key(g, "tokenizer.ggml.pre") >= 0 &&
        ts_gguf_get_string(g, "tokenizer.ggml.pre", &pre, NULL) != TS_OK)
        return -1;
    for (int i = 0; i < N_PRES; i++)
        if (!strcmp(PRES[i].pre, pre))
            return i;
    ts_set_error(ts_gguf_ctx(g), TS_ERR_UNSUPPORTED,
                 "%s: tokenizer.ggml.pre \"%s\" is not supported (supported: "
                 "%s)",
                 ts_gguf_path(g), pre, pre_list());
    return -1;
}

ts_status ts_gguf_hf_tokenizer_json(ts_ctx *ctx, ts_gguf *g, char **json) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!g || !json)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_gguf_hf_tokenizer_json: NULL argument");
    *json = NULL;
    ts_status s = check_vocab_model(g);
    if (s != TS_OK)
        return s;
    int p = find_pre(g);
    if (p < 0)
        return ts_ctx_status(ctx);
    const char *path = ts_gguf_path(g);
    ts_gguf_type et;
    uint64_t n = 0, n_types = 0, n_merges = 0;
    if ((s = ts_gguf_get_array(g, "tokenizer.ggml.tokens", &et, &n)) != TS_OK)
        return s;
    if (et != TS_GGUF_STRING || n == 0 || n > INT32_MAX)
        return ts_set_error(ctx, TS_ERR_IO,
                            "%s: tokenizer.ggml.tokens is %llu %s elements "
                            "(1 to 2^31 - 1 strings)",
                            path, (unsigned long long)n, ts_gguf_type_name(et));
    bool have_types = ts_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0;
    if (have_types && ((s = ts_gguf_get_array(g, "tokenizer.ggml.token_type",
                                              &et, &n_types)) != TS_OK ||
                       n_types != n || et == TS_GGUF_STRING))
        return s ? s
                 : ts_set_error(ctx, TS_ERR_IO,
                                "%s: tokenizer.ggml.token_type has %llu "
                                "entries of %s for %llu tokens",
                                path, (unsigned long long)n_types,
                                ts_gguf_type_name(et), (unsigned long long)n);
    bool have_merges = ts_gguf_find_key(g, "tokenizer.ggml.merges") >= 0;
    if (have_merges && ((s = ts_gguf_get_array(g, "tokenizer.ggml.merges", &et,
                                               &n_merges)) != TS_OK ||
                        et != TS_GGUF_STRING))
        return s ? s
                 : ts_set_error(ctx, TS_ERR_IO,
                                "%s: tokenizer.ggml.merges is not an array "
                                "of strings",
                                path);
    json_t *vocab = json_object(), *added = json_array(),
           *merges = json_array();
    for (uint64_t i = 0; i < n && s == TS_OK; i++) {
        const char *t;
        size_t len;
        int64_t type = TOK_NORMAL;
        if ((s = ts_gguf_array_string(g, "tokenizer.ggml.tokens", i, &t,
                                      &len)) != TS_OK ||
            (have_types &&
             (s = ts_gguf_array_int(g, "tokenizer.ggml.token_type", i,
                                    &type)) != TS_OK))
            break;
        if (type == TOK_UNUSED) /* llama.cpp's [PADn] fillers */
            continue;
        json_t *str = json_stringn(t, len);
        if (!str || !len) {
            json_decref(str);
            s = ts_set_error(ctx, TS_ERR_IO, "%s: token %llu is %s", path,
                             (unsigned long long)i,
                             len ? "not valid UTF-8" : "empty");
            break;
        }
        if (type == TOK_CONTROL || type == TOK_USER) {
            json_array_append_new(
                added, json_pack("{s:I, s:o, s:b, s:b, s:b, s:b, s:b}", "id",
                                 (json_int_t)i, "content", str, "single_word",
                                 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                 "special", type == TOK_CONTROL));
            continue;
        }
        const char *key = json_string_value(str);
        if (strlen(key) == len && !json_object_get(vocab, key))
            json_object_set_new(vocab, key, json_integer((json_int_t)i));
        json_decref(str); /* a repeated string: its first id keeps it */
    }
    for (uint64_t i = 0; i < n_merges && s == TS_OK; i++) {
        const char *m;
        size_t len;
        if ((s = ts_gguf_array_string(g, "tokenizer.ggml.merges", i, &m,
                                      &len)) != TS_OK)
            break;
        json_t *str = json_stringn(m, len);
        if (!str || !memchr(m, ' ', len)) {
            json_decref(str);
            s = ts_set_error(ctx, TS_ERR_IO,
                             "%s: merge %llu is not two tokens separated by a "
                             "space",
                             path, (unsigned long long)i);
            break;
        }
        json_array_append_new(merges, str);
    }
    if (s != TS_OK) {
        json_decref(vocab), json_decref(added), json_decref(merges);
        return s;
    }
    json_t *model =
        json_pack("{s:s, s:n, s:n, s:s, s:s, s:b, s:b, s:b, s:o, s:o}", "type",
                  "BPE", "dropout", "unk_token", "continuing_subword_prefix",
                  "", "end_of_word_suffix", "", "fuse_unk", 0, "byte_fallback",
                  0, "ignore_merges", PRES[p].ignore_merges, "vocab", vocab,
                  "merges", merges);
    json_t *pretok =
        PRES[p].split
            ? json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type",
                        "Sequence", "pretokenizers", "type", "Split", "pattern",
                        "Regex", PRES[p].split, "behavior", "Isolated",
                        "invert", 0, byte_level(false, false))
            : byte_level(true, true);
    int64_t bos = special_id(g, "bos"), eos = special_id(g, "eos");
    bool add_bos = get_flag(g, "tokenizer.ggml.add_bos_token", false);
    bool add_eos = get_flag(g, "tokenizer.ggml.add_eos_token", false);
    char *bos_s = add_bos ? token_text(g, bos, n) : NULL;
    char *eos_s = add_eos ? token_text(g, eos, n) : NULL;
    json_t *post = bos_s || eos_s ? template_post(bos_s, bos, eos_s, eos)
                                  : byte_level(false, false);
    free(bos_s), free(eos_s);
    json_t *root = json_pack(
        "{s:s, s:n, s:n, s:o, s:o, s:o, s:o, s:o, s:o}", "version", "1.0",
        "truncation", "padding", "added_tokens", added, "normalizer",
        PRES[p].nfc ? json_pack("{s:s}", "type", "NFC") : json_null(),
        "pre_tokenizer", pretok, "post_processor", post, "decoder",
        byte_level(true, true), "model", model);
    return (*json = dump(ctx, path, root)) ? TS_OK : TS_ERR_OOM;
}

/* ---- tokenizer_config.json, generation_config.json, chat template ---- */

const char *ts_gguf_hf_chat_template(ts_gguf *g) {
    const char *t = NULL;
    if (!g || ts_gguf_find_key(g, "tokenizer.chat_template") < 0)
        return NULL;
    if (ts_gguf_get_string(g, "tokenizer.chat_template", &t, NULL) != TS_OK) {
        ts_clear_error(ts_gguf_ctx(g));
        return NULL;
    }
    return t;
}

ts_status ts_gguf_hf_tokenizer_config_json(ts_ctx *ctx, ts_gguf *g,
                                           char **json) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!g || !json)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_gguf_hf_tokenizer_config_json: NULL argument");
    *json = NULL;
    uint64_t n = token_count(g);
    json_t *c = json_object();
    static const char *const names[] = {"bos", "eos", "padding", "unknown"};
    static const char *const fields[] = {"bos_token", "eos_token", "pad_token",
                                         "unk_token"};
    for (int i = 0; i < 4; i++) {
        char *t = token_text(g, special_id(g, names[i]), n);
        json_t *v = t ? json_string(t) : NULL;
        json_object_set_new(c, fields[i], v ? v : json_null());
        free(t);
    }
    json_object_set_new(
        c, "add_bos_token",
        json_boolean(get_flag(g, "tokenizer.ggml.add_bos_token", false)));
    json_object_set_new(
        c, "add_eos_token",
        json_boolean(get_flag(g, "tokenizer.ggml.add_eos_token", false)));
    const char *tpl = ts_gguf_hf_chat_template(g);
    json_t *tv = tpl ? json_string(tpl) : NULL;
    if (tv) /* a template that is not UTF-8 is left out */
        json_object_set_new(c, "chat_template", tv);
    return (*json = dump(ctx, ts_gguf_path(g), c)) ? TS_OK : TS_ERR_OOM;
}

ts_status ts_gguf_hf_generation_config_json(ts_ctx *ctx, ts_gguf *g,
                                            char **json) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!g || !json)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_gguf_hf_generation_config_json: NULL argument");
    *json = NULL;
    json_t *c = json_object();
    int64_t bos = special_id(g, "bos"), eos = special_id(g, "eos"),
            pad = special_id(g, "padding");
    if (bos >= 0)
        json_object_set_new(c, "bos_token_id", json_integer(bos));
    if (eos >= 0)
        json_object_set_new(c, "eos_token_id", json_integer(eos));
    if (pad >= 0)
        json_object_set_new(c, "pad_token_id", json_integer(pad));
    /* llama.cpp's general.sampling.* keys: the model's recommended
     * sampling, which generation_config.json says with do_sample */
    static const struct {
        const char *key, *field;
        bool integer;
    } samp[] = {
        {"general.sampling.temp", "temperature", false},
        {"general.sampling.top_k", "top_k", true},
        {"general.sampling.top_p", "top_p", false},
        {"general.sampling.min_p", "min_p", false},
        {"general.sampling.penalty_repeat", "repetition_penalty", false}};
    bool any = false;
    for (size_t i = 0; i < sizeof samp / sizeof *samp; i++) {
        if (ts_gguf_find_key(g, samp[i].key) < 0)
            continue;
        int64_t iv;
        double fv;
        if (samp[i].integer ? ts_gguf_get_i64(g, samp[i].key, &iv) != TS_OK
                            : get_real(g, samp[i].key, true, 0, &fv) != TS_OK) {
            ts_clear_error(ctx);
            continue;
        }
        json_object_set_new(c, samp[i].field,
                            samp[i].integer ? json_integer(iv) : json_real(fv));
        any = true;
    }
    if (any)
        json_object_set_new(c, "do_sample", json_true());
    return (*json = dump(ctx, ts_gguf_path(g), c)) ? TS_OK : TS_ERR_OOM;
}

/* ---- the tensors under Hugging Face's names ---- */

typedef struct {
    void *base;
    size_t len;
} anon_map;

static void anon_release(void *p) {
    anon_map *m = p;
    munmap(m->base, m->len);
    free(m);
}

typedef enum { AS_IS, PERMUTE, TRANSPOSE } rearrange;

ts_status ts_gguf_open_as_safetensors(ts_ctx *ctx, const char *path,
                                      ts_safetensors **out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!path || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_gguf_open_as_safetensors: NULL argument");
    *out = NULL;
    ts_gguf *g;
    ts_status s = ts_gguf_open(ctx, path, &g);
    if (s != TS_OK)
        return s;
    int a = gguf_arch(g, NULL);
    int64_t n = ts_gguf_tensor_count(g);
    st_entry_desc *e = calloc((size_t)n + 1, sizeof *e);
    char(*names)[128] = calloc((size_t)n + 1, sizeof *names);
    rearrange *how = calloc((size_t)n + 1, sizeof *how);
    uint32_t q_heads = 0, kv_heads = 0;
    if (a < 0)
        s = ts_ctx_status(ctx);
    else if (!e || !names || !how)
        s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", path);
    else if (ARCHS[a].ts == TS_ARCH_LLAMA) { /* the permute's head counts */
        if ((s = ts_gguf_get_u32(g, "llama.attention.head_count", &q_heads)) ==
            TS_OK) {
            kv_heads = q_heads;
            if (ts_gguf_find_key(g, "llama.attention.head_count_kv") >= 0)
                s = ts_gguf_get_u32(g, "llama.attention.head_count_kv",
                                    &kv_heads);
        }
    }
    size_t copy_bytes = 0;
    for (int64_t i = 0; i < n && s == TS_OK; i++) {
        const char *gn = ts_gguf_tensor_name(g, i);
        st_entry_desc *d = &e[i];
        if ((s = ts_gguf_dtype_of(g, ts_gguf_tensor_type(g, i), gn, &d->dt)) !=
            TS_OK)
            break;
        if (!hf_of(ARCHS[a].fam, gn, names[i], sizeof names[i]))
            snprintf(names[i], sizeof names[i], "%s", gn); /* kept as is */
        int64_t ne[4];
        d->ndim = ts_gguf_tensor_ne(g, i, ne);
        for (int k = 0; k < d->ndim; k++)
            d->shape[k] = ne[d->ndim - 1 - k];
        d->name = names[i];
        d->bytes = ts_gguf_tensor_nbytes(g, i);
        d->data = gguf_tensor_bytes(g, i);
        const char *dot = strrchr(gn, '.');
        bool weight = dot && !strcmp(dot, ".weight");
        if (ARCHS[a].ts == TS_ARCH_LLAMA &&
            (strstr(gn, ".attn_q.") || strstr(gn, ".attn_k."))) {
            int64_t heads = strstr(gn, ".attn_q.") ? q_heads : kv_heads;
            if (d->ndim < 1 || d->ndim > 2 || heads < 1 ||
                d->shape[0] % heads || (d->shape[0] / heads) % 2)
                s = ts_set_error(ctx, TS_ERR_IO,
                                 "%s: tensor \"%s\" has %lld rows, not %lld "
                                 "heads of an even size (its rope rows "
                                 "cannot be put back in order)",
                                 path, gn, (long long)d->shape[0],
                                 (long long)heads);
            how[i] = PERMUTE;
        } else if (ARCHS[a].fam == FAM_GPT2 && weight && d->ndim == 2 &&
                   (strstr(gn, ".attn_qkv.") || strstr(gn, ".attn_output.") ||
                    strstr(gn, ".ffn_up.") || strstr(gn, ".ffn_down."))) {
            if (ts_dtype_is_quantized(d->dt))
                s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                                 "%s: tensor \"%s\" is %s; GPT-2's Conv1D "
                                 "matrices are stored transposed, and a "
                                 "block format cannot be transposed back "
                                 "(use an f32, f16 or bf16 GGUF)",
                                 path, gn, ts_dtype_name(d->dt));
            how[i] = TRANSPOSE;
            int64_t t = d->shape[0];
            d->shape[0] = d->shape[1], d->shape[1] = t;
        }
        if (how[i] != AS_IS)
            copy_bytes += (d->bytes + 63) / 64 * 64;
    }
    anon_map *anon = NULL;
    if (s == TS_OK && copy_bytes) {
        anon = malloc(sizeof *anon);
        void *base = anon ? mmap(NULL, copy_bytes, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                          : MAP_FAILED;
        if (base == MAP_FAILED) {
            free(anon);
            anon = NULL;
            s = ts_set_error(ctx, TS_ERR_OOM,
                             "%s: cannot map %zu bytes for the rearranged "
                             "tensors: %s",
                             path, copy_bytes, strerror(errno));
        } else
            anon->base = base, anon->len = copy_bytes;
    }
    size_t at = 0;
    for (int64_t i = 0; i < n && s == TS_OK; i++) {
        st_entry_desc *d = &e[i];
        if (how[i] == AS_IS)
            continue;
        unsigned char *dst = (unsigned char *)anon->base + at;
        const unsigned char *src = d->data;
        if (how[i] == PERMUTE) {
            int64_t rows = d->shape[0];
            permute_rows(dst, src, rows, (size_t)d->bytes / (size_t)rows,
                         strstr(ts_gguf_tensor_name(g, i), ".attn_q.")
                             ? q_heads
                             : kv_heads,
                         false);
        } else { /* (out, in) -> (in, out) */
            size_t es = ts_dtype_size(d->dt);
            int64_t R = d->shape[1], C = d->shape[0]; /* stored R x C */
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++)
                    memcpy(dst + ((size_t)c * (size_t)R + (size_t)r) * es,
                           src + ((size_t)r * (size_t)C + (size_t)c) * es, es);
        }
        d->data = dst, d->region = 1;
        at += (d->bytes + 63) / 64 * 64;
    }
    if (s == TS_OK) {
        void *base;
        size_t len;
        gguf_map_span(g, &base, &len);
        st_region r[2] = {{base, len, gguf_map_retain(g), gguf_map_release},
                          {anon ? anon->base : NULL, anon ? anon->len : 0, anon,
                           anon_release}};
        s = st_from_regions(ctx, path, anon ? 2 : 1, r, (int)n, e, out);
        anon = NULL; /* taken over */
    }
    if (anon)
        anon_release(anon);
    free(e), free(names), free(how);
    ts_gguf_close(g);
    return s;
}

/* ---- a Hugging Face folder as GGUF metadata (`tessera convert`) ---- */

/* a special token of tokenizer_config.json: a string or {"content": ...} */
static const char *special_text(json_t *tc, const char *field) {
    json_t *v = json_object_get(tc, field);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_string_value(v);
}

/* the Split regex of a tokenizer.json's pre_tokenizer (a Split, or the
 * first Split of a Sequence); NULL when there is none */
static const char *split_regex(json_t *pre, bool *byte_level_regex) {
    *byte_level_regex = false;
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (type && !strcmp(type, "Split"))
        return json_string_value(
            json_object_get(json_object_get(pre, "pattern"), "Regex"));
    if (type && !strcmp(type, "ByteLevel")) {
        json_t *ur = json_object_get(pre, "use_regex");
        *byte_level_regex = !ur || json_is_true(ur);
        return NULL;
    }
    size_t i;
    json_t *step;
    const char *found = NULL;
    json_array_foreach(json_object_get(pre, "pretokenizers"), i, step) {
        bool blr;
        const char *r = split_regex(step, &blr);
        if (r && !found)
            found = r;
        *byte_level_regex |= blr;
    }
    return found;
}

typedef struct {
    ts_ctx *ctx;
    ts_gguf_writer *w;
    const char *dir;
    ts_status s;
} meta_writer;

static void put_u32(meta_writer *m, const char *key, uint64_t v) {
    if (m->s == TS_OK && v > UINT32_MAX)
        m->s = ts_set_error(m->ctx, TS_ERR_RANGE,
                            "%s: %s is %llu, over GGUF's uint32", m->dir, key,
                            (unsigned long long)v);
    if (m->s == TS_OK)
        m->s = ts_gguf_writer_add_u32(m->w, key, (uint32_t)v);
}

static void put_f32(meta_writer *m, const char *key, double v) {
    if (m->s == TS_OK)
        m->s = ts_gguf_writer_add_f32(m->w, key, (float)v);
}

static void put_arch_keys(meta_writer *m, const ts_model_config *c,
                          const char *arch) {
    char k[160];
    put_u32(m, akey(arch, "context_length", k, sizeof k),
            (uint64_t)c->max_positions);
    put_u32(m, akey(arch, "embedding_length", k, sizeof k),
            (uint64_t)c->hidden);
    put_u32(m, akey(arch, "block_count", k, sizeof k), (uint64_t)c->layers);
    put_u32(m, akey(arch, "feed_forward_length", k, sizeof k),
            (uint64_t)c->intermediate);
    put_u32(m, akey(arch, "attention.head_count", k, sizeof k),
            (uint64_t)c->heads);
    if (c->arch == TS_ARCH_GPT2) {
        put_f32(m, akey(arch, "attention.layer_norm_epsilon", k, sizeof k),
                c->norm_eps);
        return;
    }
    put_u32(m, akey(arch, "attention.head_count_kv", k, sizeof k),
            (uint64_t)c->kv_heads);
    put_f32(m, akey(arch, "rope.freq_base", k, sizeof k), c->rope_theta);
    put_f32(m, akey(arch, "attention.layer_norm_rms_epsilon", k, sizeof k),
            c->norm_eps);
    put_u32(m, akey(arch, "attention.key_length", k, sizeof k),
            (uint64_t)c->head_dim);
    put_u32(m, akey(arch, "attention.value_length", k, sizeof k),
            (uint64_t)c->head_dim);
    put_u32(m, akey(arch, "rope.dimension_count", k, sizeof k),
            (uint64_t)c->head_dim);
    if (c->rope == TS_ROPE_LINEAR || c->rope == TS_ROPE_YARN) {
        if (m->s == TS_OK)
            m->s = ts_gguf_writer_add_string(
                m->w, akey(arch, "rope.scaling.type", k, sizeof k),
                c->rope == TS_ROPE_LINEAR ? "linear" : "yarn");
        put_f32(m, akey(arch, "rope.scaling.factor", k, sizeof k),
                c->rope_factor);
        if (c->rope == TS_ROPE_YARN)
            put_u32(
                m,
                akey(arch, "rope.scaling.original_context_length", k, sizeof k),
                (uint64_t)c->rope_original_max_positions);
    } else if (c->rope != TS_ROPE_DEFAULT && m->s == TS_OK)
        m->s = ts_set_error(m->ctx, TS_ERR_UNSUPPORTED,
                            "%s: this rope_scaling (llama3, longrope) has no "
                            "GGUF metadata here (llama.cpp stores it as a "
                            "rope_freqs tensor)",
                            m->dir);
}

/* a string-to-id lookup over tokenizer.json's vocab and added tokens */
static int64_t id_of(json_t *vocab, json_t *added, const char *tok) {
    if (!tok)
        return -1;
    json_t *v = json_object_get(vocab, tok);
    if (json_is_integer(v))
        return json_integer_value(v);
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        if (c && !strcmp(c, tok))
            return json_integer_value(json_object_get(a, "id"));
    }
    return -1;
}

static void put_tokenizer(meta_writer *m, const ts_model_config *c, json_t *tok,
                          json_t *tc) {
    ts_ctx *ctx = m->ctx;
    json_t *model = json_object_get(tok, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(tok, "added_tokens");
    bool blr;
    const char *regex =
        split_regex(json_object_get(tok, "pre_tokenizer"), &blr);
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!mtype || strcmp(mtype, "BPE") || !json_is_object(vocab) ||
        (!regex && !blr)) {
        m->s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "%s/tokenizer.json: only byte-level BPE "
                            "tokenizers can be written to GGUF here",
                            m->dir);
        return;
    }
    const char *pre = NULL;
    for (int i = 0; i < N_PRES && !pre; i++)
        if (regex ? PRES[i].split && !strcmp(PRES[i].split, regex)
                  : !PRES[i].split)
            pre = PRES[i].pre;
    if (!pre) {
        m->s = ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "%s/tokenizer.json: its pre-tokenizer regex "
                            "\"%.60s...\" matches no GGUF pre-tokenizer "
                            "known here (%s)",
                            m->dir, regex, pre_list());
        return;
    }
    /* tokens by id, padded to the config's vocabulary as llama.cpp's
     * converter does ([PADn], unused) */
    int64_t n = c->vocab;
    const char *key;
    json_t *v;
    size_t i;
    json_object_foreach(vocab, key, v) if (json_integer_value(v) >= n) n =
        json_integer_value(v) + 1;
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (id >= n)
            n = id + 1;
    }
    const char **toks = calloc((size_t)n + 1, sizeof *toks);
    int32_t *types = calloc((size_t)n + 1, sizeof *types);
    char *pads = malloc((size_t)n * 32 + 1);
    if (!toks || !types || !pads) {
        free(toks), free(types), free(pads);
        m->s = ts_set_error(ctx, TS_ERR_OOM, "%s: out of memory", m->dir);
        return;
    }
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (id >= 0 && id < n)
            toks[id] = key, types[id] = TOK_NORMAL;
    }
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        const char *content = json_string_value(json_object_get(v, "content"));
        if (id >= 0 && id < n && content)
            toks[id] = content,
            types[id] = json_is_true(json_object_get(v, "special"))
                            ? TOK_CONTROL
                            : TOK_USER;
    }
    for (int64_t id = 0; id < n; id++)
        if (!toks[id]) {
            snprintf(pads + 32 * id, 32, "[PAD%lld]", (long long)id);
            toks[id] = pads + 32 * id, types[id] = TOK_UNUSED;
        }
    json_t *merges = json_object_get(model, "merges");
    size_t nm = json_array_size(merges);
    char **ms = calloc(nm + 1, sizeof *ms);
    for (i = 0; ms && i < nm; i++) {
        json_t *e = json_array_get(merges, i);
        const char *a = json_string_value(json_array_get(e, 0)),
                   *b = json_string_value(json_array_get(e, 1));
        if (json_is_string(e))
            ms[i] = strdup(json_string_value(e));
        else if (a && b && (ms[i] = malloc(strlen(a) + strlen(b) + 2)))
            sprintf(ms[i], "%s %s", a, b);
        if (!ms[i])
            break;
    }
    if (m->s == TS_OK && (!ms || i < nm))
        m->s = ts_set_error(ctx, TS_ERR_IO,
                            "%s/tokenizer.json: merge %zu is not a pair of "
                            "strings (or out of memory)",
                            m->dir, i);
    if (m->s == TS_OK)
        m->s = ts_gguf_writer_add_string(m->w, "tokenizer.ggml.model", "gpt2");
    if (m->s == TS_OK)
        m->s = ts_gguf_writer_add_string(m->w, "tokenizer.ggml.pre", pre);
    if (m->s == TS_OK)
        m->s = ts_gguf_writer_add_string_array(m->w, "tokenizer.ggml.tokens",
                                               toks, NULL, (uint64_t)n);
    if (m->s == TS_OK)
        m->s = ts_gguf_writer_add_array(m->w, "tokenizer.ggml.token_type",
                                        TS_GGUF_INT32, types, (uint64_t)n);
    if (m->s == TS_OK)
        m->s = ts_gguf_writer_add_string_array(
            m->w, "tokenizer.ggml.merges", (const char *const *)ms, NULL, nm);
    for (i = 0; ms && i < nm; i++)
        free(ms[i]);
    free(ms), free(toks), free(types), free(pads);
    /* special ids: tokenizer_config.json's tokens, else config.json's */
    static const char *const fields[] = {"bos_token", "eos_token", "pad_token",
                                         "unk_token"};
    static const char *const keys[] = {
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id"};
    for (int k = 0; k < 4; k++) {
        int64_t id = id_of(vocab, added, special_text(tc, fields[k]));
        if (id < 0 && k < 2)
            id = k == 0 ? c->bos_token_id : c->eos_token_id;
        if (id >= 0)
            put_u32(m, keys[k], (uint64_t)id);
    }
    json_t *ab = json_object_get(tc, "add_bos_token");
    bool add_bos = json_is_true(ab);
    if (!json_is_boolean(ab)) { /* a post-processor that puts one first */
        json_t *post = json_object_get(tok, "post_processor");
        json_t *steps = json_object_get(post, "processors");
        for (size_t s = 0; s <= json_array_size(steps); s++) {
            json_t *p = json_array_size(steps) ? json_array_get(steps, s)
                                               : (s ? NULL : post);
            json_t *first = json_array_get(json_object_get(p, "single"), 0);
            add_bos |= json_object_get(first, "SpecialToken") != NULL;
        }
    }
    if (m->s == TS_OK)
        m->s = ts_gguf_writer_add_bool(m->w, "tokenizer.ggml.add_bos_token",
                                       add_bos);
    if (m->s == TS_OK && json_is_boolean(json_object_get(tc, "add_eos_token")))
        m->s = ts_gguf_writer_add_bool(
            m->w, "tokenizer.ggml.add_eos_token",
            json_is_true(json_object_get(tc, "add_eos_token")));
    json_t *tpl = json_object_get(tc, "chat_template");
    if (json_is_array(tpl)) { /* named templates: the default one */
        json_t *e, *found = NULL;
        json_array_foreach(
            tpl, i,
            e) if (!found && json_string_value(json_object_get(e, "name")) &&
                   !strcmp(json_string_value(json_object_get(e, "name")),
                           "default")) found = json_object_get(e, "template");
        tpl = found;
    }
    if (m->s == TS_OK && json_is_string(tpl))
        m->s = ts_gguf_writer_add_string(m->w, "tokenizer.chat_template",
                                         json_string_value(tpl));
}

static json_t *load_json(meta_writer *m, const char *name, bool required) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", m->dir, name);
    json_error_t err = {.line = -1, .text = "no such file"};
    /* a folder's file, or a GGUF's made from its metadata */
    char *text = ts_model_file_text(m->ctx, m->dir, name);
    json_t *j = text ? json_loads(text, 0, &err) : NULL;
    free(text);
    if (!j && (required || err.line > 0) && m->s == TS_OK)
        m->s = ts_set_error(m->ctx, TS_ERR_IO, "%s: %s (line %d)", p, err.text,
                            err.line);
    return j;
}

ts_status ts_gguf_writer_add_hf_metadata(ts_gguf_writer *w, ts_ctx *ctx,
                                         const char *hf_dir) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!w || !hf_dir)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_gguf_writer_add_hf_metadata: NULL argument");
    ts_model_config c;
    ts_status s = ts_config_load(ctx, hf_dir, &c);
    if (s != TS_OK)
        return s;
    const char *arch = NULL;
    for (int a = 0; a < N_ARCHS; a++)
        if (ARCHS[a].ts == c.arch && !strcmp(c.model_type, ARCHS[a].arch))
            arch = ARCHS[a].arch;
    if (!arch)
        return ts_set_error(ctx, TS_ERR_UNSUPPORTED,
                            "%s: model type %s has no GGUF writer here "
                            "(supported: %s)",
                            hf_dir, c.model_type, supported_archs());
    meta_writer m = {ctx, w, hf_dir, TS_OK};
    char name[256];
    snprintf(name, sizeof name, "%s", hf_dir);
    size_t nl = strlen(name);
    while (nl > 1 && name[nl - 1] == '/')
        name[--nl] = '\0';
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    m.s = ts_gguf_writer_add_string(w, "general.architecture", arch);
    if (m.s == TS_OK) /* llama.cpp's: a model, not an adapter */
        m.s = ts_gguf_writer_add_string(w, "general.type", "model");
    if (m.s == TS_OK)
        m.s = ts_gguf_writer_add_string(w, "general.name", base);
    put_arch_keys(&m, &c, arch);
    char k[160];
    put_u32(&m, akey(arch, "vocab_size", k, sizeof k), (uint64_t)c.vocab);
    json_t *tok = load_json(&m, "tokenizer.json", true);
    json_t *tc = load_json(&m, "tokenizer_config.json", false);
    if (m.s == TS_OK)
        put_tokenizer(&m, &c, tok, tc);
    json_decref(tok), json_decref(tc);
    return m.s;
}

ts_status ts_gguf_hf_file_text(ts_ctx *ctx, const char *path, const char *file,
                               char **text) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!path || !file || !text)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_gguf_hf_file_text: NULL argument");
    *text = NULL;
    ts_status (*make)(ts_ctx *, ts_gguf *, char **) =
        !strcmp(file, "config.json")      ? ts_gguf_hf_config_json
        : !strcmp(file, "tokenizer.json") ? ts_gguf_hf_tokenizer_json
        : !strcmp(file, "tokenizer_config.json")
            ? ts_gguf_hf_tokenizer_config_json
        : !strcmp(file, "generation_config.json")
            ? ts_gguf_hf_generation_config_json
            : NULL;
    if (!make)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "%s: a GGUF file holds no %s", path, file);
    ts_gguf *g = NULL;
    ts_status s = ts_gguf_open(ctx, path, &g);
    if (s == TS_OK)
        s = make(ctx, g, text);
    ts_gguf_close(g);
    return s;
}
