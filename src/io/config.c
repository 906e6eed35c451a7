/* config.c — Hugging Face config.json: dispatch on model_type (or on
 * architectures[0]) to qwen3, qwen2, llama or gpt2, the fields each reads
 * (with Hugging Face's names and defaults), and errors that name the field.
 * Owns nothing after it returns. */
#include "tessera_io.h"

#include "core/core.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const struct {
    const char *model_type, *architecture;
    ts_arch arch;
} archs[] = {{"qwen3", "Qwen3ForCausalLM", TS_ARCH_QWEN3},
             {"qwen2", "Qwen2ForCausalLM", TS_ARCH_QWEN2},
             {"llama", "LlamaForCausalLM", TS_ARCH_LLAMA},
             {"gpt2", "GPT2LMHeadModel", TS_ARCH_GPT2}};

const char *ts_arch_name(ts_arch a) {
    return (unsigned)a < sizeof archs / sizeof *archs ? archs[a].model_type
                                                      : "unknown";
}

typedef struct {
    ts_ctx *ctx;
    const char *path;
    json_t *root;
    ts_status st;
} reader;

/* an integer field; absent: def (or an error when required) */
static int64_t get_int(reader *r, const char *key, bool required, int64_t def) {
    if (r->st)
        return def;
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v)) {
        if (required)
            r->st = ts_set_error(
                r->ctx, TS_ERR_IO, "%s: missing field \"%s\" (model type %s)",
                r->path, key,
                json_string_value(json_object_get(r->root, "model_type")));
        return def;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        r->st = ts_set_error(r->ctx, TS_ERR_IO,
                             "%s: field \"%s\" must be an integer >= 0",
                             r->path, key);
        return def;
    }
    return json_integer_value(v);
}

static double get_num(reader *r, const char *key, double def) {
    if (r->st)
        return def;
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v))
        return def;
    if (!json_is_number(v)) {
        r->st = ts_set_error(r->ctx, TS_ERR_IO,
                             "%s: field \"%s\" must be a number", r->path, key);
        return def;
    }
    return json_number_value(v);
}

static bool get_bool(reader *r, const char *key, bool def) {
    if (r->st)
        return def;
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v))
        return def;
    if (!json_is_boolean(v)) {
        r->st = ts_set_error(r->ctx, TS_ERR_IO,
                             "%s: field \"%s\" must be true or false", r->path,
                             key);
        return def;
    }
    return json_is_true(v);
}

/* bos/eos: an integer or a list (the first) */
static int64_t get_token(reader *r, const char *key) {
    json_t *v = json_object_get(r->root, key);
    if (json_is_array(v))
        v = json_array_get(v, 0);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* What each size may be: from 1 (or lo) to hi, so that no product of
 * them (vocab x hidden, heads x head_dim x hidden, ...) nor its bytes can
 * overflow 64 bits, token ids and positions fit 32 bits, and layers stay
 * under the models' limit. */
#define MAX_VOCAB     2147483647ll
#define MAX_HIDDEN    1048576ll
#define MAX_LAYERS    4096ll
#define MAX_HEADS     4096ll
#define MAX_HEAD_DIM  4096ll
#define MAX_FFN       16777216ll
#define MAX_POSITIONS 2147483647ll
#define MAX_THETA     1e15

static ts_status check_ranges(ts_ctx *ctx, const char *file,
                              const ts_model_config *c) {
    bool gpt2 = c->arch == TS_ARCH_GPT2;
    const struct {
        const char *name;
        int64_t v, lo, hi;
    } ints[] = {
        {"vocab_size", c->vocab, 1, MAX_VOCAB},
        {gpt2 ? "n_embd" : "hidden_size", c->hidden, 1, MAX_HIDDEN},
        {gpt2 ? "n_layer" : "num_hidden_layers", c->layers, 1, MAX_LAYERS},
        {gpt2 ? "n_head" : "num_attention_heads", c->heads, 1, MAX_HEADS},
        {"num_key_value_heads", c->kv_heads, 1, MAX_HEADS},
        {"head_dim", c->head_dim, 1, MAX_HEAD_DIM},
        {gpt2 ? "n_inner" : "intermediate_size", c->intermediate, 1, MAX_FFN},
        {gpt2 ? "n_positions" : "max_position_embeddings", c->max_positions, 1,
         MAX_POSITIONS},
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (ints[i].v < ints[i].lo || ints[i].v > ints[i].hi)
            return ts_set_error(ctx, TS_ERR_RANGE,
                                "%s: %s is %lld; allowed %lld to %lld", file,
                                ints[i].name, (long long)ints[i].v,
                                (long long)ints[i].lo, (long long)ints[i].hi);
    const char *eps = gpt2 ? "layer_norm_epsilon" : "rms_norm_eps";
    if (!(c->norm_eps > 0 && c->norm_eps < 1))
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "%s: %s is %g; allowed above 0 and below 1", file,
                            eps, c->norm_eps);
    if (!gpt2 && !(c->rope_theta > 0 && c->rope_theta <= MAX_THETA))
        return ts_set_error(ctx, TS_ERR_RANGE,
                            "%s: rope_theta is %g; allowed above 0 up to %g",
                            file, c->rope_theta, MAX_THETA);
    return TS_OK;
}

ts_status ts_config_load(ts_ctx *ctx, const char *path, ts_model_config *out) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!path || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_config_load: NULL argument");
    memset(out, 0, sizeof *out);
    /* a folder without config.json, a path that is not there, a GGUF
     * file: said as such, not as a JSON error */
    struct stat sb;
    bool dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (dir || stat(path, &sb) != 0 || ts_file_is_gguf(path)) {
        ts_status s = ts_model_dir_check(ctx, path, TS_MODEL_CONFIG);
        if (s != TS_OK)
            return s;
    }
    char file[4096];
    ts_file_in(path, "config.json", file, sizeof file);
    json_error_t jerr;
    json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && jerr.line > 0)
        return ts_set_error(ctx, TS_ERR_IO, "%s: not valid JSON: %s (line %d)",
                            file, jerr.text, jerr.line);
    if (!root)
        return ts_set_error(ctx, TS_ERR_IO, "%s: %s", file, jerr.text);
    reader r = {ctx, file, root, TS_OK};
    if (!json_is_object(root))
        r.st = ts_set_error(ctx, TS_ERR_IO, "%s: not a JSON object", file);
    /* which architecture */
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    json_t *arr = json_object_get(root, "architectures");
    const char *an =
        json_is_array(arr) ? json_string_value(json_array_get(arr, 0)) : NULL;
    int found = -1;
    for (size_t i = 0; i < sizeof archs / sizeof *archs && !r.st; i++)
        if ((mt && !strcmp(mt, archs[i].model_type)) ||
            (!mt && an && !strcmp(an, archs[i].architecture)))
            found = (int)i;
    if (!r.st && found < 0)
        r.st = ts_set_error(
            ctx, TS_ERR_UNSUPPORTED,
            "%s: model type \"%s\" is not supported (supported: qwen3, qwen2, "
            "llama, gpt2)",
            file,
            mt   ? mt
            : an ? an
                 : "(none given)");
    if (!r.st) {
        out->arch = archs[found].arch;
        snprintf(out->model_type, sizeof out->model_type, "%s",
                 archs[found].model_type);
        out->vocab = get_int(&r, "vocab_size", true, 0);
        if (out->arch == TS_ARCH_GPT2) {
            out->hidden = get_int(&r, "n_embd", true, 0);
            out->layers = get_int(&r, "n_layer", true, 0);
            out->heads = get_int(&r, "n_head", true, 0);
            out->kv_heads = out->heads;
            out->intermediate =
                get_int(&r, "n_inner", false,
                        out->hidden <= MAX_HIDDEN ? 4 * out->hidden : 0);
            out->max_positions = get_int(&r, "n_positions", true, 0);
            out->norm_eps = get_num(&r, "layer_norm_epsilon", 1e-5);
            out->tie_word_embeddings = true;
            out->attention_bias = true;
        } else {
            out->hidden = get_int(&r, "hidden_size", true, 0);
            out->layers = get_int(&r, "num_hidden_layers", true, 0);
            out->heads = get_int(&r, "num_attention_heads", true, 0);
            out->kv_heads =
                get_int(&r, "num_key_value_heads", false, out->heads);
            out->intermediate = get_int(&r, "intermediate_size", true, 0);
            out->max_positions =
                get_int(&r, "max_position_embeddings", false, 2048);
            out->norm_eps = get_num(&r, "rms_norm_eps", 1e-6);
            out->rope_theta = get_num(&r, "rope_theta", 10000.0);
            out->tie_word_embeddings =
                get_bool(&r, "tie_word_embeddings", out->arch != TS_ARCH_LLAMA);
            out->attention_bias = out->arch == TS_ARCH_QWEN2
                                      ? true
                                      : get_bool(&r, "attention_bias", false);
            out->qk_norm = out->arch == TS_ARCH_QWEN3;
        }
        out->head_dim = get_int(&r, "head_dim", false,
                                out->heads ? out->hidden / out->heads : 0);
        out->bos_token_id = get_token(&r, "bos_token_id");
        out->eos_token_id = get_token(&r, "eos_token_id");
        const char *td =
            json_string_value(json_object_get(root, "torch_dtype"));
        out->dtype = td && !strcmp(td, "bfloat16")  ? TS_BF16
                     : td && !strcmp(td, "float16") ? TS_F16
                                                    : TS_F32;
    }
    json_t *rs = json_object_get(root, "rope_scaling");
    if (!r.st && json_is_object(rs)) {
        const char *type = json_string_value(json_object_get(rs, "rope_type"));
        if (!type)
            type = json_string_value(json_object_get(rs, "type"));
        if (type && !strcmp(type, "llama3")) {
            reader q = {ctx, file, rs, TS_OK};
            out->rope = TS_ROPE_LLAMA3;
            out->rope_factor = get_num(&q, "factor", 8.0);
            out->rope_low_freq_factor = get_num(&q, "low_freq_factor", 1.0);
            out->rope_high_freq_factor = get_num(&q, "high_freq_factor", 4.0);
            out->rope_original_max_positions =
                get_int(&q, "original_max_position_embeddings", false, 8192);
            r.st = q.st;
        } else if (type && strcmp(type, "default")) {
            r.st = ts_set_error(
                ctx, TS_ERR_UNSUPPORTED,
                "%s: rope_scaling type \"%s\" is not supported (llama3)", file,
                type);
        }
    }
    /* sizes that make a model */
    if (!r.st)
        r.st = check_ranges(ctx, file, out);
    if (!r.st) {
        const char *bad =
            out->vocab <= 0    ? "vocab_size"
            : out->hidden <= 0 ? "hidden_size"
            : out->layers <= 0 ? "num_hidden_layers"
            : out->heads <= 0  ? "num_attention_heads"
            : out->kv_heads <= 0 || out->heads % out->kv_heads
                ? "num_key_value_heads (must divide num_attention_heads)"
            : out->head_dim <= 0 || out->head_dim % 2
                ? "head_dim (must be even)"
            : out->intermediate <= 0 ? "intermediate_size"
            : !(out->norm_eps > 0)   ? "the norm epsilon"
            : !(out->rope_theta > 0) && out->arch != TS_ARCH_GPT2 ? "rope_theta"
                                                                  : NULL;
        if (bad)
            r.st = ts_set_error(ctx, TS_ERR_IO, "%s: invalid %s", file, bad);
    }
    json_decref(root);
    return r.st;
}
