/* quantize.c — a model folder (or GGUF) written as a GGUF of another type:
 * `tessera convert` (f32, f16, bf16 or a quantized type) and `tessera
 * quantize` (q8_0, q4_0, q4_k_s/m, q5_k_s/m, q6_k). The type of each
 * tensor follows llama.cpp's llama_tensor_get_type for the same file type
 * without an importance matrix: 1-D tensors (norms, biases) stay f32; the
 * LM head (and a tied embedding table) gets Q6_K under the 4- and 5-bit
 * types; _M types give the value projections and ffn_down of the
 * "use_more_bits" layers Q6_K; a row length that is not whole blocks falls
 * back to Q8_0 (llama.cpp: Q5_0/Q5_1, formats Tessera lacks), else F16.
 * Rows are quantized by the reference quantizers (src/core/quant.c), so
 * the bytes are llama.cpp's. Owns no format code: GGUF through
 * src/io/gguf.c, names through ts_gguf_hf_name. */
#include "tessera_gguf.h"
#include "tessera_models.h"

#include "core/core.h"
#include "core/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* llama.cpp's file types (llama_ftype) for general.file_type */
static const struct {
    const char *name;
    ts_dtype base;
    int ftype;
} file_types[] = {
    {"f32", TS_F32, 0},      {"f16", TS_F16, 1},    {"bf16", TS_BF16, 32},
    {"q8_0", TS_Q8_0, 7},    {"q4_0", TS_Q4_0, 2},  {"q4_k_s", TS_Q4_K, 14},
    {"q4_k_m", TS_Q4_K, 15}, {"q4_k", TS_Q4_K, 15}, {"q5_k_s", TS_Q5_K, 16},
    {"q5_k_m", TS_Q5_K, 17}, {"q5_k", TS_Q5_K, 17}, {"q6_k", TS_Q6_K, 18},
};
#define N_FILE_TYPES (sizeof file_types / sizeof *file_types)

const char *ts_quantize_type_names(void) {
    return "f32, f16, bf16, q8_0, q4_0, q4_k_s, q4_k_m (q4_k), q5_k_s, "
           "q5_k_m (q5_k), q6_k";
}

static int find_type(const char *name) {
    for (size_t i = 0; name && i < N_FILE_TYPES; i++)
        if (!strcasecmp(name, file_types[i].name))
            return (int)i;
    return -1;
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

/* llama.cpp's: more bits for the first and last eighth of the layers and
 * every third one between */
static bool use_more_bits(int64_t i, int64_t n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* the layer number in "...layers.N." or "...h.N.", or -1 */
static int64_t layer_of(const char *name) {
    const char *p = strstr(name, "layers.");
    p = p ? p + 7 : strstr(name, ".h.") ? strstr(name, ".h.") + 3 : NULL;
    return p && *p >= '0' && *p <= '9' ? strtoll(p, NULL, 10) : -1;
}

ts_dtype ts_quantize_tensor_type(const char *file_type, const char *name,
                                 int ndim, int64_t row, int64_t layers,
                                 bool tied_embeddings) {
    int ti = find_type(file_type);
    if (ti < 0 || ndim < 2 || !ends_with(name, "weight"))
        return TS_F32; /* norms, biases: f32 as llama.cpp keeps them */
    ts_dtype base = file_types[ti].base, t = base;
    if (!ts_dtype_is_quantized(base))
        return base;
    const char *ft = file_types[ti].name;
    bool m_type =
        ends_with(ft, "_m") || !strcmp(ft, "q4_k") || !strcmp(ft, "q5_k");
    bool output = !strcmp(name, "lm_head.weight") ||
                  (tied_embeddings && (ends_with(name, "embed_tokens.weight") ||
                                       ends_with(name, "wte.weight")));
    int64_t layer = layer_of(name);
    if (output) {
        if (base != TS_Q8_0)
            t = TS_Q6_K;
    } else if (ends_with(name, "v_proj.weight")) {
        if (m_type && use_more_bits(layer, layers))
            t = TS_Q6_K;
        else if (!strcmp(ft, "q4_k_s") && layer < 4)
            t = TS_Q5_K;
    } else if (ends_with(name, "down_proj.weight") ||
               ends_with(name, "mlp.c_proj.weight")) {
        if (m_type && use_more_bits(layer, layers))
            t = TS_Q6_K;
        else if (!strcmp(ft, "q4_k_s") && layer < layers / 8)
            t = TS_Q5_K;
    }
    if (row % ts_dtype_block_elems(t)) /* rows not whole blocks */
        t = row % 32 == 0 ? TS_Q8_0 : TS_F16;
    return t;
}

ts_status dec_set_param_kept(ts_decoder *m, int i, ts_tensor *t, bool conv1d);

ts_status ts_decoder_quantize(ts_decoder *m, const char *file_type) {
    if (!m)
        return TS_ERR_INVALID_ARG;
    ts_tensor *p0 = ts_decoder_param(m, 0);
    if (!p0)
        return TS_ERR_INVALID_ARG;
    ts_ctx *ctx = p0->ctx;
    if (find_type(file_type) < 0)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "quantize: unknown type \"%s\" (one of %s)",
                            file_type ? file_type : "(null)",
                            ts_quantize_type_names());
    const ts_model_config *c = ts_decoder_get_config(m);
    bool tied = !ts_decoder_find_param(m, "lm_head.weight");
    ts_status s = TS_OK;
    for (int i = 0; i < ts_decoder_num_params(m) && s == TS_OK; i++) {
        ts_tensor *p = ts_decoder_param(m, i);
        const char *name = ts_decoder_param_name(m, i);
        if (ts_tensor_ndim(p) != 2)
            continue; /* norms, biases, stacked experts stay as they are */
        /* rows of `in`: HF's (out, in), or Conv1D's (in, out) transposed */
        ts_tensor *rows = c->conv1d ? ts_transpose(p, 0, 1) : ts_retain(p);
        ts_dtype to = ts_quantize_tensor_type(
            file_type, name, 2, ts_tensor_shape(rows)[1], c->layers, tied);
        if (!ts_dtype_is_quantized(to) && !c->conv1d) {
            ts_release(rows);
            if (to == ts_tensor_dtype(p) || to == TS_F32)
                continue;
            ts_tensor *cast = ts_cast(p, to);
            s = cast ? dec_set_param_kept(m, i, cast, false)
                     : ts_ctx_status(ctx);
            ts_release(cast);
            continue;
        }
        if (!ts_dtype_is_quantized(to)) {
            ts_release(rows);
            continue; /* GPT-2's matrices stay (in, out) unquantized */
        }
        ts_device d = ts_tensor_device(p);
        ts_tensor *host =
            d.kind == TS_DEVICE_CPU
                ? ts_retain(rows)
                : ts_to_device(rows, (ts_device){TS_DEVICE_CPU, 0});
        ts_tensor *q = host ? ts_cast(host, to) : NULL;
        s = q ? dec_set_param_kept(m, i, q, c->conv1d) : ts_ctx_status(ctx);
        ts_release(rows), ts_release(host), ts_release(q);
    }
    return s;
}

ts_status ts_model_quantize(ts_ctx *ctx, const char *in, const char *out,
                            const ts_quantize_options *opt) {
    if (!ctx)
        return TS_ERR_INVALID_ARG;
    if (!in || !out || !opt || !opt->type)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG, "quantize: NULL argument");
    int ti = find_type(opt->type);
    if (ti < 0)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "quantize: unknown type \"%s\" (one of %s)",
                            opt->type, ts_quantize_type_names());
    ts_model_config mc;
    ts_status s =
        ts_model_dir_check(ctx, in, TS_MODEL_CONFIG | TS_MODEL_WEIGHTS);
    if (s == TS_OK)
        s = ts_config_load(ctx, in, &mc);
    if (s != TS_OK)
        return s;
    ts_safetensors *st = NULL;
    if ((s = ts_safetensors_open(ctx, in, &st)) != TS_OK)
        return s;
    ts_gguf_writer *w = ts_gguf_writer_new(ctx);
    if (!w) {
        ts_safetensors_close(st);
        return ts_ctx_status(ctx);
    }
    s = ts_gguf_writer_add_hf_metadata(w, ctx, in);
    if (s == TS_OK)
        s = ts_gguf_writer_add_u32(w, "general.file_type",
                                   (uint32_t)file_types[ti].ftype);
    if (s == TS_OK && ts_dtype_is_quantized(file_types[ti].base))
        s = ts_gguf_writer_add_u32(w, "general.quantization_version", 2);
    bool tied = ts_safetensors_find(st, "lm_head.weight") < 0;
    int n = ts_safetensors_count(st);
    for (int i = 0; i < n && s == TS_OK; i++) {
        const char *name = ts_safetensors_name(st, i);
        char gname[128];
        if (ts_gguf_hf_name(name, gname, sizeof gname) != TS_OK) {
            if (opt->warn)
                opt->warn(opt->warn_user, name);
            continue; /* a tensor no GGUF architecture names */
        }
        ts_tensor *t = ts_safetensors_get(st, name);
        if (!t) {
            s = ts_ctx_status(ctx);
            break;
        }
        int64_t heads = 0;
        bool transpose = false;
        ts_gguf_hf_tensor_rule(&mc, name, &heads, &transpose);
        ts_tensor *src = t;
        if (heads > 0) /* llama: q/k rows into llama.cpp's rope order */
            src = ts_gguf_permute_rows(t, heads, true);
        else if (transpose) { /* GPT-2's Conv1D (in, out) as rows of in */
            ts_tensor *tt = ts_transpose(t, 0, 1);
            src = tt ? ts_contiguous(tt) : NULL;
            ts_release(tt);
        }
        int nd = src ? ts_tensor_ndim(src) : 0;
        int64_t row = nd ? ts_tensor_shape(src)[nd - 1] : 1;
        ts_dtype to =
            ts_quantize_tensor_type(opt->type, name, nd, row, mc.layers, tied);
        ts_tensor *conv = src && ts_tensor_dtype(src) != to ? ts_cast(src, to)
                          : src                             ? ts_retain(src)
                                                            : NULL;
        if (src != t)
            ts_release(src);
        ts_release(t);
        if (!conv || ts_materialize(conv) != TS_OK) {
            ts_release(conv);
            s = ts_ctx_status(ctx) ? ts_ctx_status(ctx) : TS_ERR_OOM;
            break;
        }
        if (opt->progress)
            opt->progress(opt->progress_user, i, n, gname, to);
        s = ts_gguf_writer_add_tensor(w, gname, conv);
        ts_release(conv);
    }
    if (s == TS_OK)
        s = ts_gguf_writer_save(w, out);
    ts_gguf_writer_free(w);
    ts_safetensors_close(st);
    return s;
}
