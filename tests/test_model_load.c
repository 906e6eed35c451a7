/* test_model_load.c — loading a model folder defends itself: the commonest
 * mistakes (a file for its folder, a GGUF file, a folder missing files, a
 * path that is not there) get errors that say what to give; config.json
 * sizes out of range are refused naming the field and the range, and a
 * config that disagrees with the checkpoint is refused (both shapes named)
 * before anything the config's size is allocated; shape arithmetic never
 * overflows; NaN/Inf weights are refused naming the tensor and index (and
 * load with no_check_weights); tensors the model does not use (unknown
 * names, layers beyond num_hidden_layers) give Hugging Face's "Some
 * weights of the checkpoint ... were not used" warning and the model still
 * gives the PyTorch reference's logits. argv[1]: the folder
 * tests/reference/hf_qwen3.py, hf_decoders.py and hf_gpt2.py wrote; the
 * variants are written under it. */
#include "core/core.h"
#include "tessera_models.h"
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>

static const char *dir;

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f)
        fwrite(p, 1, n, f), fclose(f);
}

/* A variant of model src in folder name: config.json with key set to
 * value (key NULL: as it is), the checkpoint's tensors (as a new
 * model.safetensors) plus n_extra tensors (extra_names[i] a copy of
 * extra_from[i]) and, with poison, element poison_at of tensor poison
 * replaced by NaN (f32) or bf16's +Inf. */
typedef struct {
    const char *key;
    json_int_t value;
    int n_extra;
    const char *extra_names[16], *extra_from[16];
    const char *poison;
    int64_t poison_at;
} variant;

static void make_variant(ts_ctx *ctx, const char *src, const char *name,
                         const variant *v, char *out, size_t n_out) {
    char s[600], p[700];
    snprintf(s, sizeof s, "%s/%s", dir, src);
    snprintf(out, n_out, "%s/%s", dir, name);
    mkdir(out, 0755);
    snprintf(p, sizeof p, "%s/config.json", s);
    json_t *cfg = json_load_file(p, 0, NULL);
    CHECK(cfg != NULL);
    if (cfg && v->key)
        json_object_set_new(cfg, v->key, json_integer(v->value));
    snprintf(p, sizeof p, "%s/config.json", out);
    if (cfg)
        json_dump_file(cfg, p, JSON_INDENT(1));
    json_decref(cfg);
    ts_safetensors *st = NULL;
    CHECK_OK(ctx, ts_safetensors_open(ctx, s, &st));
    if (!st)
        return;
    int n = ts_safetensors_count(st), total = n + v->n_extra;
    const char **names = calloc((size_t)total, sizeof *names);
    ts_tensor **ts = calloc((size_t)total, sizeof *ts);
    for (int i = 0; i < total; i++) {
        names[i] = i < n ? ts_safetensors_name(st, i) : v->extra_names[i - n];
        ts[i] = ts_safetensors_get(st, i < n ? names[i] : v->extra_from[i - n]);
        CHECK(ts[i] != NULL);
        if (v->poison && i < n && !strcmp(names[i], v->poison)) {
            /* the mapping is private: the source file stays as it is */
            ts_tensor *t = ts[i];
            if (ts_tensor_dtype(t) == TS_F32)
                ((float *)ts_tensor_data(t))[v->poison_at] = NAN;
            else
                ((uint16_t *)ts_tensor_data(t))[v->poison_at] = 0x7f80;
        }
    }
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    CHECK_OK(ctx, ts_safetensors_save(ctx, p, total, names,
                                      (ts_tensor *const *)ts, 0, NULL));
    for (int i = 0; i < total; i++)
        ts_release(ts[i]);
    free(names), free(ts);
    ts_safetensors_close(st);
}

/* the mistakes a user makes with -m */
static void test_model_paths(ts_ctx *ctx) {
    char p[700], folder[600];
    ts_lm *lm = NULL;
    /* a file of the folder: its folder suggested */
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/gqa2_untied/%s", dir, files[i]);
        CHECK(ts_lm_load(ctx, p, NULL, &lm) == TS_ERR_INVALID_ARG && !lm);
        CHECK_MSG(ctx, "got a file; a model is a Hugging Face folder "
                       "(config.json, *.safetensors, tokenizer.json); did you "
                       "mean its folder ");
        CHECK_MSG(ctx, "/gqa2_untied?");
        ts_clear_error(ctx);
    }
    /* a GGUF file, wherever it is given */
    snprintf(p, sizeof p, "%s/model.gguf", dir);
    const char gguf[] = "GGUF\3\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
    write_bytes(p, gguf, sizeof gguf);
    /* (a GGUF is a model by itself: this one has no metadata) */
    CHECK(ts_lm_load(ctx, p, NULL, &lm) != TS_OK && !lm);
    CHECK_MSG(ctx, "model.gguf: no metadata key \"general.architecture\"");
    ts_clear_error(ctx);
    ts_model_config c;
    CHECK(ts_config_load(ctx, p, &c) != TS_OK);
    CHECK_MSG(ctx, "no metadata key \"general.architecture\"");
    ts_clear_error(ctx);
    ts_safetensors *st = NULL;
    CHECK(ts_safetensors_open(ctx, p, &st) != TS_OK && !st);
    CHECK_MSG(ctx, "no metadata key \"general.architecture\"");
    ts_clear_error(ctx);
    /* config.json read as safetensors: said so, not a header length */
    snprintf(p, sizeof p, "%s/gqa2_untied/config.json", dir);
    CHECK(ts_safetensors_open(ctx, p, &st) == TS_ERR_IO && !st);
    CHECK_MSG(ctx, "not a safetensors file (it starts with '{': JSON?)");
    ts_clear_error(ctx);
    /* a path that is not there: no JSON parser's "(line -1)" */
    snprintf(p, sizeof p, "%s/no_such_model", dir);
    CHECK(ts_lm_load(ctx, p, NULL, &lm) == TS_ERR_IO && !lm);
    CHECK_MSG(ctx, "no_such_model: no such folder (No such file or "
                   "directory); a model is a Hugging Face folder");
    CHECK(!strstr(ts_errmsg(ctx), "line -1"));
    ts_clear_error(ctx);
    CHECK(ts_config_load(ctx, p, &c) == TS_ERR_IO);
    CHECK(!strstr(ts_errmsg(ctx), "line -1"));
    CHECK_MSG(ctx, "no such folder");
    ts_clear_error(ctx);
    /* a folder missing files: what was looked for, what is there */
    snprintf(folder, sizeof folder, "%s/half_model", dir);
    mkdir(folder, 0755);
    snprintf(p, sizeof p, "%s/weights.gguf", folder);
    write_bytes(p, gguf, sizeof gguf);
    CHECK(ts_lm_load(ctx, folder, NULL, &lm) == TS_ERR_IO && !lm);
    CHECK_MSG(ctx, "half_model: not a model folder: no config.json, "
                   "model.safetensors | model.safetensors.index.json (looked "
                   "for config.json, model.safetensors | "
                   "model.safetensors.index.json; the folder holds "
                   "weights.gguf); a GGUF file is a model by itself: give "
                   "the .gguf file (-m FILE.gguf)");
    ts_clear_error(ctx);
    CHECK(ts_model_dir_check(ctx, folder, TS_MODEL_TOKENIZER) == TS_ERR_IO);
    CHECK_MSG(ctx, "no tokenizer.json (looked for tokenizer.json;");
    ts_clear_error(ctx);
    snprintf(p, sizeof p, "%s/gqa2_untied", dir);
    CHECK_OK(ctx,
             ts_model_dir_check(ctx, p, TS_MODEL_CONFIG | TS_MODEL_WEIGHTS));
}

/* shape arithmetic: an error, never a signed overflow or a wrapped size */
static void test_shape_overflow(ts_ctx *ctx) {
    int64_t big[3] = {(int64_t)1 << 62, 4, 0};
    CHECK(ts_shape_numel(2, big) == -1);
    CHECK(ts_shape_numel(3, big) == 0);
    int64_t fits[2] = {(int64_t)1 << 61, 2};
    CHECK(ts_shape_numel(2, fits) == (int64_t)1 << 62);
    /* 2^62 x 4 elements used to wrap to 0 bytes: a tensor with no memory */
    CHECK(ts_empty(ctx, TS_F32, 2, big) == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "overflows 64 bits");
    ts_clear_error(ctx);
    /* 2^61 x 2 elements fit int64, their f32 bytes do not */
    CHECK(ts_empty(ctx, TS_F32, 2, fits) == NULL);
    CHECK(ts_ctx_status(ctx) == TS_ERR_RANGE);
    ts_clear_error(ctx);
}

/* config.json sizes out of range, and sizes that disagree with the
 * checkpoint: refused before anything that size is allocated */
static void test_config_sizes(ts_ctx *ctx) {
    char d[700];
    ts_lm *lm = NULL;
    const struct {
        const char *src, *key;
        json_int_t v;
        const char *msg;
    } bad[] = {
        {"gqa2_untied", "vocab_size", (json_int_t)1 << 62,
         "config.json: vocab_size is 4611686018427387904; allowed 1 to "
         "2147483647"},
        {"gqa2_untied", "vocab_size", (json_int_t)1 << 40,
         "config.json: vocab_size is 1099511627776; allowed 1 to 2147483647"},
        {"gqa2_untied", "hidden_size", (json_int_t)1 << 62,
         "hidden_size is 4611686018427387904; allowed 1 to 1048576"},
        {"gqa2_untied", "num_hidden_layers", 100000,
         "num_hidden_layers is 100000; allowed 1 to 4096"},
        {"gqa2_untied", "intermediate_size", (json_int_t)1 << 40,
         "intermediate_size is 1099511627776; allowed 1 to 16777216"},
        {"gqa2_untied", "head_dim", (json_int_t)1 << 33,
         "head_dim is 8589934592; allowed 1 to 4096"},
        {"gqa2_untied", "num_attention_heads", (json_int_t)1 << 50,
         "num_attention_heads is 1125899906842624; allowed 1 to 4096"},
        {"gqa2_untied", "max_position_embeddings", (json_int_t)1 << 40,
         "max_position_embeddings is 1099511627776; allowed 1 to 2147483647"},
        /* GPT-2: n_inner's default 4 x n_embd must not overflow first */
        {"gpt2_bare", "n_embd", (json_int_t)1 << 62,
         "n_embd is 4611686018427387904; allowed 1 to 1048576"},
        {"gpt2_bare", "vocab_size", (json_int_t)1 << 40,
         "vocab_size is 1099511627776; allowed 1 to 2147483647"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        variant v = {.key = bad[i].key, .value = bad[i].v};
        make_variant(ctx, bad[i].src, "bad_size", &v, d, sizeof d);
        ts_alloc_empty_cache(ctx);
        ts_alloc_reset_peak(ctx);
        ts_alloc_stats a0, a1;
        ts_alloc_get_stats(ctx, &a0);
        CHECK(ts_lm_load(ctx, d, NULL, &lm) == TS_ERR_RANGE && !lm);
        CHECK_MSG(ctx, bad[i].msg);
        ts_clear_error(ctx);
        ts_alloc_get_stats(ctx, &a1);
        CHECK(a1.peak_bytes_in_use - a0.bytes_in_use < 1 << 20);
    }
    variant rope = {.key = "rope_theta", .value = -5};
    make_variant(ctx, "gqa2_untied", "bad_size", &rope, d, sizeof d);
    CHECK(ts_lm_load(ctx, d, NULL, &lm) == TS_ERR_RANGE);
    CHECK_MSG(ctx, "rope_theta is -5; allowed above 0 up to 1e+15");
    ts_clear_error(ctx);
    /* in range, but not the checkpoint's: the header says so before the
     * config's 2^30 x 48 f32 embedding (192 GiB) is allocated */
    const struct {
        const char *src, *key;
        json_int_t v;
        const char *msg;
    } mismatch[] = {
        {"gqa2_untied", "vocab_size", (json_int_t)1 << 30,
         "tensor \"model.embed_tokens.weight\" has shape [97, 48] in the "
         "checkpoint; the config needs [1073741824, 48]"},
        {"gqa2_untied", "intermediate_size", 1 << 24,
         "tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [80, 48] "
         "in the checkpoint; the config needs [16777216, 48]"},
        {"gpt2_bare", "vocab_size", (json_int_t)1 << 30,
         "tensor \"wte.weight\" has shape"},
    };
    for (size_t i = 0; i < sizeof mismatch / sizeof *mismatch; i++) {
        variant v = {.key = mismatch[i].key, .value = mismatch[i].v};
        make_variant(ctx, mismatch[i].src, "bad_size", &v, d, sizeof d);
        ts_alloc_empty_cache(ctx);
        ts_alloc_reset_peak(ctx);
        ts_alloc_stats a0, a1;
        ts_alloc_get_stats(ctx, &a0);
        CHECK(ts_lm_load(ctx, d, NULL, &lm) == TS_ERR_SHAPE && !lm);
        CHECK_MSG(ctx, mismatch[i].msg);
        ts_clear_error(ctx);
        ts_alloc_get_stats(ctx, &a1);
        CHECK(a1.peak_bytes_in_use - a0.bytes_in_use < 1 << 20);
    }
    /* more layers in config.json than in the checkpoint: named, and no
     * model allocated first */
    variant more = {.key = "num_hidden_layers", .value = 3};
    make_variant(ctx, "gqa2_untied", "bad_size", &more, d, sizeof d);
    ts_decoder *m = NULL;
    CHECK(ts_decoder_load(ctx, d, &m) == TS_ERR_IO && !m);
    CHECK_MSG(ctx, "the checkpoint has no tensor "
                   "\"model.layers.2.self_attn.q_proj.weight\"");
    ts_clear_error(ctx);
}

/* logits of model m for the reference's first row of ids: within 1e-4 of
 * the logit scale of the PyTorch reference written for ref */
static void check_reference_logits(ts_ctx *ctx, ts_lm *lm, const char *ref) {
    char p[600];
    size_t ni = 0, nl = 0;
    snprintf(p, sizeof p, "%s/%s.ids", dir, ref);
    int64_t *raw = tu_read_file(p, &ni);
    snprintf(p, sizeof p, "%s/%s.logits", dir, ref);
    float *want = tu_read_file(p, &nl);
    CHECK(raw && want);
    if (!raw || !want || !lm) {
        free(raw), free(want);
        return;
    }
    int64_t T = raw[1], shape[2] = {1, T};
    ts_tensor *ids = ts_from_data(ctx, TS_I64, 2, shape, raw + 2);
    bool old = ts_set_grad_enabled(ctx, false);
    ts_tensor *logits = ts_lm_forward(lm, ids);
    ts_set_grad_enabled(ctx, old);
    CHECK(logits != NULL);
    if (logits) {
        int64_t n = ts_tensor_numel(logits); /* (1, T, V): row 0 of (B, T, V) */
        const float *got = ts_tensor_data(logits);
        double scale = 0, err = 0;
        for (int64_t i = 0; i < n; i++) {
            scale = fmax(scale, fabs(want[i]));
            err = fmax(err, fabs((double)got[i] - want[i]));
        }
        CHECK(scale > 0 && err <= 1e-4 * scale);
    }
    ts_release(ids), ts_release(logits);
    free(raw), free(want);
}

typedef struct {
    int count;
    char last[4096];
} warnings;

static void collect(void *user, const char *msg) {
    warnings *w = user;
    w->count++;
    snprintf(w->last, sizeof w->last, "%s", msg);
}

static void test_weight_values(ts_ctx *ctx) {
    char d[700];
    ts_lm *lm = NULL;
    /* a NaN in one f32 tensor: refused, named with its index */
    variant nan = {.poison = "model.layers.1.mlp.up_proj.weight",
                   .poison_at = 1234};
    make_variant(ctx, "gqa2_untied", "nan_weight", &nan, d, sizeof d);
    CHECK(ts_lm_load(ctx, d, NULL, &lm) == TS_ERR_IO && !lm);
    CHECK_MSG(ctx, "tensor \"model.layers.1.mlp.up_proj.weight\" holds NaN "
                   "at flat index 1234 (of 3840 f32 values)");
    ts_clear_error(ctx);
    /* ... and loads when asked not to check */
    ts_load_options no = {.no_check_weights = true};
    CHECK_OK(ctx, ts_lm_load(ctx, d, &no, &lm));
    ts_tensor *w =
        lm ? ts_decoder_find_param(ts_lm_decoder(lm),
                                   "model.layers.1.mlp.up_proj.weight")
           : NULL;
    CHECK(w && isnan(((float *)ts_tensor_data(w))[1234]));
    ts_lm_free(lm);
    lm = NULL;
    /* an Inf in a bf16 checkpoint (kept in bf16 too) */
    variant inf = {.poison = "model.norm.weight", .poison_at = 5};
    make_variant(ctx, "bf16_tied", "inf_weight", &inf, d, sizeof d);
    ts_load_options bf = {.weight_dtype = TS_BF16};
    CHECK(ts_lm_load(ctx, d, &bf, &lm) == TS_ERR_IO && !lm);
    CHECK_MSG(ctx, "tensor \"model.norm.weight\" holds Inf at flat index 5 "
                   "(of 48 bf16 values)");
    ts_clear_error(ctx);
    /* GPT-2 the same */
    variant g = {.poison = "h.1.mlp.c_fc.bias", .poison_at = 0};
    make_variant(ctx, "gpt2_bare", "nan_gpt2", &g, d, sizeof d);
    CHECK(ts_lm_load(ctx, d, NULL, &lm) == TS_ERR_IO && !lm);
    CHECK_MSG(ctx, "tensor \"h.1.mlp.c_fc.bias\" holds NaN at flat index 0");
    ts_clear_error(ctx);
    CHECK_OK(ctx, ts_lm_load(ctx, d, &no, &lm));
    ts_lm_free(lm);
}

/* the scan by dtype: f16 NaN, f32 -Inf, bf16 values that are large but
 * finite, integers never */
static void test_check_finite(ts_ctx *ctx) {
    int64_t n5[1] = {5}, n3000[1] = {3000};
    uint16_t h[5] = {0x3c00, 0x7bff, 0x7c01, 0x0000, 0xfc00}; /* f16 */
    float f[3000] = {0};
    f[2049] = -INFINITY; /* in the third block of 1024 */
    uint16_t b[5] = {0x7f7f, 0xff7f, 0x0001, 0x8000, 0x3f80}; /* bf16 max.. */
    int32_t i[5] = {0x7f800000, -1, 0x7fc00000, 0, 1};
    ts_tensor *ts[4] = {ts_from_data(ctx, TS_F16, 1, n5, h),
                        ts_from_data(ctx, TS_F32, 1, n3000, f),
                        ts_from_data(ctx, TS_BF16, 1, n5, b),
                        ts_from_data(ctx, TS_I32, 1, n5, i)};
    const char *names[4] = {"half", "single", "brain", "ints"};
    char p[600];
    snprintf(p, sizeof p, "%s/finite.safetensors", dir);
    CHECK_OK(ctx, ts_safetensors_save(ctx, p, 4, names, ts, 0, NULL));
    ts_safetensors *st = NULL;
    CHECK_OK(ctx, ts_safetensors_open(ctx, p, &st));
    CHECK(ts_safetensors_check_finite(st, "half") == TS_ERR_IO);
    CHECK_MSG(ctx, "tensor \"half\" holds NaN at flat index 2 (of 5 f16 "
                   "values)");
    ts_clear_error(ctx);
    CHECK(ts_safetensors_check_finite(st, "single") == TS_ERR_IO);
    CHECK_MSG(ctx, "tensor \"single\" holds -Inf at flat index 2049 (of "
                   "3000 f32 values)");
    ts_clear_error(ctx);
    CHECK_OK(ctx, ts_safetensors_check_finite(st, "brain"));
    CHECK_OK(ctx, ts_safetensors_check_finite(st, "ints"));
    CHECK(ts_safetensors_check_finite(st, "nothing") == TS_ERR_INVALID_ARG);
    ts_clear_error(ctx);
    ts_dtype dt;
    int nd = 0;
    int64_t shape[TS_MAX_DIMS];
    CHECK(ts_safetensors_shape(st, "single", &dt, &nd, shape) && dt == TS_F32 &&
          nd == 1 && shape[0] == 3000);
    CHECK(!ts_safetensors_shape(st, "nothing", NULL, NULL, NULL) &&
          ts_ctx_status(ctx) == TS_OK);
    ts_safetensors_close(st);
    for (int k = 0; k < 4; k++)
        ts_release(ts[k]);
}

static void test_unused_tensors(ts_ctx *ctx) {
    char d[700];
    ts_lm *lm = NULL;
    warnings w = {0};
    ts_load_options o = {.warn = collect, .warn_user = &w};
    /* the clean folders warn about nothing (GPT-2's attn.bias mask buffer
     * is not a weight) */
    const char *clean[] = {"gqa2_untied", "bf16_tied", "gpt2_bare",
                           "gpt2_prefixed"};
    for (int i = 0; i < 4; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", dir, clean[i]);
        CHECK_OK(ctx, ts_lm_load(ctx, p, &o, &lm));
        ts_lm_free(lm);
    }
    CHECK(w.count == 0);
    /* an unknown tensor and a third layer (config.json says 2) */
    variant v = {.n_extra = 1 + 11};
    v.extra_names[0] = "model.extra_head.weight";
    v.extra_from[0] = "model.norm.weight";
    static char names[11][96], from[11][96];
    const char *parts[] = {
        "input_layernorm.weight",  "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "self_attn.q_norm.weight",
        "self_attn.k_norm.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",    "mlp.up_proj.weight",
        "mlp.down_proj.weight"};
    for (int i = 0; i < 11; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.2.%s", parts[i]);
        snprintf(from[i], sizeof from[i], "model.layers.1.%s", parts[i]);
        v.extra_names[1 + i] = names[i];
        v.extra_from[1 + i] = from[i];
    }
    make_variant(ctx, "gqa2_untied", "extra_tensors", &v, d, sizeof d);
    CHECK_OK(ctx, ts_lm_load(ctx, d, &o, &lm));
    CHECK(w.count == 1);
    CHECK(strstr(w.last, "Some weights of the checkpoint at ") &&
          strstr(w.last, "extra_tensors were not used: "));
    CHECK(strstr(w.last, "model.extra_head.weight, "
                         "model.layers.2.input_layernorm.weight, "
                         "model.layers.2.self_attn.q_proj.weight, "
                         "model.layers.2.self_attn.k_proj.weight, "
                         "model.layers.2.self_attn.v_proj.weight, ... (12 in "
                         "all); the checkpoint has layers up to 2, "
                         "config.json's num_hidden_layers is 2"));
    if (w.count)
        printf("warning: %s\n", w.last);
    /* and the model is the reference's still */
    check_reference_logits(ctx, lm, "gqa2_untied");
    ts_lm_free(lm);
    /* GPT-2: a layer beyond n_layer */
    variant g = {.n_extra = 1};
    g.extra_names[0] = "transformer.h.2.ln_1.weight";
    g.extra_from[0] = "transformer.h.1.ln_1.weight";
    make_variant(ctx, "gpt2_prefixed", "extra_gpt2", &g, d, sizeof d);
    w.count = 0;
    CHECK_OK(ctx, ts_lm_load(ctx, d, &o, &lm));
    CHECK(w.count == 1 &&
          strstr(w.last, "were not used: transformer.h.2.ln_1.weight (1 in "
                         "all); the checkpoint has layers up to 2, "
                         "config.json's n_layer is 2"));
    check_reference_logits(ctx, lm, "gpt2_prefixed");
    ts_lm_free(lm);
}

/* A multimodal checkpoint's text weights, in both of Hugging Face's
 * layouts ("language_model." before every name; "model." read as
 * "model.language_model."): loaded with the same logits, and saved back
 * in the layout they came in. */
static void test_wrapper_layouts(ts_ctx *ctx) {
    char src[600], tmp[600], p[700];
    snprintf(src, sizeof src, "%s/gqa2_untied", dir);
    ts_decoder *m = NULL;
    CHECK_OK(ctx, ts_decoder_load(ctx, src, &m));
    if (!m)
        return;
    int n = 0;
    char **names = NULL;
    ts_tensor **ts = NULL;
    CHECK_OK(ctx, ts_decoder_state_dict(m, NULL, &n, &names, &ts));
    int64_t ids[6] = {3, 1, 4, 1, 5, 9}, shape[2] = {1, 6};
    ts_tensor *in = ts_from_data(ctx, TS_I64, 2, shape, ids);
    ts_tensor *want = ts_decoder_forward(m, in, 0);
    const char *spell[2][2] = {{"language_model.", ""},
                               {"model.language_model.", "model."}};
    for (int l = 0; l < 2; l++) {
        snprintf(tmp, sizeof tmp, "%s/wrapper_%d", dir, l);
        mkdir(tmp, 0755);
        char **renamed = calloc((size_t)n, sizeof *renamed);
        for (int i = 0; i < n; i++) {
            const char *name = names[i];
            size_t cut = strlen(spell[l][1]);
            bool moves = !strncmp(name, spell[l][1], cut);
            renamed[i] = malloc(strlen(name) + 32);
            sprintf(renamed[i], "%s%s", moves ? spell[l][0] : "",
                    moves ? name + cut : name);
        }
        snprintf(p, sizeof p, "%s/model.safetensors", tmp);
        CHECK_OK(ctx,
                 ts_safetensors_save(ctx, p, n, (const char *const *)renamed,
                                     ts, 0, NULL));
        char from[700];
        snprintf(from, sizeof from, "%s/config.json", src);
        snprintf(p, sizeof p, "%s/config.json", tmp);
        FILE *fi = fopen(from, "rb"), *fo = fopen(p, "wb");
        int ch;
        while (fi && fo && (ch = fgetc(fi)) != EOF)
            fputc(ch, fo);
        if (fi)
            fclose(fi);
        if (fo)
            fclose(fo);
        ts_decoder *w = NULL;
        CHECK_OK(ctx, ts_decoder_load(ctx, tmp, &w));
        ts_tensor *got = w ? ts_decoder_forward(w, in, 0) : NULL;
        CHECK(got && want &&
              !memcmp(ts_tensor_data(got), ts_tensor_data(want),
                      sizeof(float) * (size_t)ts_tensor_numel(want)));
        /* saved back as it came */
        snprintf(p, sizeof p, "%s/saved", tmp);
        mkdir(p, 0755);
        if (w)
            CHECK_OK(ctx, ts_decoder_save(w, p));
        ts_safetensors *st = NULL;
        CHECK_OK(ctx, ts_safetensors_open(ctx, p, &st));
        for (int i = 0; st && i < n; i++)
            CHECK(ts_safetensors_find(st, renamed[i]) >= 0);
        ts_safetensors_close(st);
        ts_release(got);
        ts_decoder_free(w);
        for (int i = 0; i < n; i++)
            free(renamed[i]);
        free(renamed);
    }
    ts_release(in), ts_release(want);
    ts_decoder_state_dict_free(n, names, ts);
    ts_decoder_free(m);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR (from tests/reference/hf_qwen3.py)\n",
                argv[0]);
        return 2;
    }
    dir = argv[1];
    ts_ctx *ctx = test_ctx();
    test_model_paths(ctx);
    test_shape_overflow(ctx);
    test_config_sizes(ctx);
    test_weight_values(ctx);
    test_check_finite(ctx);
    test_unused_tensors(ctx);
    test_wrapper_layouts(ctx);
    ts_ctx_free(ctx);
    return test_finish("test_model_load");
}
