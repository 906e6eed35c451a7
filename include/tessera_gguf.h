/* tessera_gguf.h — llama.cpp's GGUF files (versions 2 and 3, little-endian):
 * reading by mmap with every header field checked before it is trusted,
 * metadata by key, tensors viewed in place (zero copy, the mapping kept
 * alive by the tensors after ts_gguf_close), and atomic writing (v3,
 * alignment 32).
 *
 * The layout (ggml's docs/gguf.md), all little-endian:
 *   "GGUF", u32 version, u64 tensor count, u64 metadata count,
 *   metadata: { string key, u32 value type, value }...,
 *   tensor infos: { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type,
 *                   u64 offset }...,
 *   padding to general.alignment (default 32), then the data section;
 *   offsets are relative to its start and multiples of the alignment.
 * A string is a u64 byte count and the bytes (no NUL); an array is a u32
 * element type, a u64 count and the elements.
 *
 * GGUF lists a tensor's dims innermost first (ne[0] is the row length);
 * Tessera's shape is the same dims reversed, so a ggml (ne0 = in, ne1 =
 * out) matrix is a Tessera (out, in) tensor.
 *
 * Below the file: a GGUF model seen as a Hugging Face folder (config.json,
 * tokenizer.json, ... texts from its metadata, its tensors under Hugging
 * Face's names: src/io/gguf_hf.c), so that the folder loader reads it
 * unchanged, and the reverse for `tessera convert`. */
#ifndef TESSERA_GGUF_H
#define TESSERA_GGUF_H

#include "tessera.h"
#include "tessera_io.h"
#include "tessera_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_gguf ts_gguf;

/* Metadata value types, as the file numbers them. */
typedef enum {
    TS_GGUF_UINT8 = 0,
    TS_GGUF_INT8 = 1,
    TS_GGUF_UINT16 = 2,
    TS_GGUF_INT16 = 3,
    TS_GGUF_UINT32 = 4,
    TS_GGUF_INT32 = 5,
    TS_GGUF_FLOAT32 = 6,
    TS_GGUF_BOOL = 7,
    TS_GGUF_STRING = 8,
    TS_GGUF_ARRAY = 9,
    TS_GGUF_UINT64 = 10,
    TS_GGUF_INT64 = 11,
    TS_GGUF_FLOAT64 = 12,
    TS_GGUF_TYPE_COUNT
} ts_gguf_type;

/* ggml's tensor types that map to a Tessera dtype (the others are listed
 * by name in errors: q4_1, q2_k, iq4_xs, ...). */
enum {
    TS_GGML_F32 = 0,
    TS_GGML_F16 = 1,
    TS_GGML_Q4_0 = 2,
    TS_GGML_Q8_0 = 8,
    TS_GGML_Q4_K = 12,
    TS_GGML_Q5_K = 13,
    TS_GGML_Q6_K = 14,
    TS_GGML_I32 = 26,
    TS_GGML_I64 = 27,
    TS_GGML_BF16 = 30
};

/* ---- reading ------------------------------------------------------------ */

/* Maps path and checks the whole header: the magic, version 2 or 3 (1 and
 * big-endian files are TS_ERR_UNSUPPORTED), counts that the file's size can
 * hold, string and array lengths inside the file, known value types, no
 * nested arrays, bools of 0 or 1, unique keys; general.alignment an integer
 * power of two; per tensor: a unique name of 1 to 64 bytes, at most 4 dims,
 * each >= 1, element and byte counts that fit 63 bits, a known ggml type
 * (whole blocks along ne[0]), an offset that is a multiple of the
 * alignment, data inside the file and overlapping no other tensor's. Each
 * failure is TS_ERR_IO (or TS_ERR_UNSUPPORTED) with a message naming the
 * file, the key or tensor, and what is wrong. */
ts_status ts_gguf_open(ts_ctx *ctx, const char *path, ts_gguf **out);
/* Tensors got from g stay valid (they hold the mapping). NULL is fine. */
void ts_gguf_close(ts_gguf *g);
ts_ctx *ts_gguf_ctx(const ts_gguf *g);
const char *ts_gguf_path(const ts_gguf *g);
uint32_t ts_gguf_version(const ts_gguf *g);
uint64_t ts_gguf_alignment(const ts_gguf *g);
/* The file offset where the data section starts. */
uint64_t ts_gguf_data_offset(const ts_gguf *g);

/* ---- metadata ----------------------------------------------------------- */

int64_t ts_gguf_kv_count(const ts_gguf *g);
/* Key i (in file order), or NULL. */
const char *ts_gguf_kv_key(const ts_gguf *g, int64_t i);
/* Key i's type (TS_GGUF_ARRAY for arrays); TS_GGUF_TYPE_COUNT for a bad i. */
ts_gguf_type ts_gguf_kv_type(const ts_gguf *g, int64_t i);
/* The index of key (hashed), or -1. */
int64_t ts_gguf_find_key(const ts_gguf *g, const char *key);
/* "uint32", "string", "array", ... */
const char *ts_gguf_type_name(ts_gguf_type t);

/* Scalars by key. Integers convert among the integer types when the value
 * fits the one asked for; floats among float32/float64 (and from an
 * integer); bool only from bool. An absent key, a value of another kind
 * or one out of range is TS_ERR_IO naming the file, the key, its type and
 * the value; *out is then untouched. */
ts_status ts_gguf_get_u32(const ts_gguf *g, const char *key, uint32_t *out);
ts_status ts_gguf_get_i32(const ts_gguf *g, const char *key, int32_t *out);
ts_status ts_gguf_get_u64(const ts_gguf *g, const char *key, uint64_t *out);
ts_status ts_gguf_get_i64(const ts_gguf *g, const char *key, int64_t *out);
ts_status ts_gguf_get_f32(const ts_gguf *g, const char *key, float *out);
ts_status ts_gguf_get_f64(const ts_gguf *g, const char *key, double *out);
ts_status ts_gguf_get_bool(const ts_gguf *g, const char *key, bool *out);
/* A string value: *out NUL-terminated and owned by g (a string holding a
 * NUL byte is cut there for C; *len, which may be NULL, is the full
 * length). */
ts_status ts_gguf_get_string(const ts_gguf *g, const char *key,
                             const char **out, size_t *len);

/* Arrays by key: the element type and count (TS_ERR_IO when key is absent
 * or not an array). */
ts_status ts_gguf_get_array(const ts_gguf *g, const char *key,
                            ts_gguf_type *elem, uint64_t *n);
/* Element i of a string array: *s points into the mapping (not
 * NUL-terminated), *len bytes. */
ts_status ts_gguf_array_string(const ts_gguf *g, const char *key, uint64_t i,
                               const char **s, size_t *len);
/* Element i of an integer or bool array (a uint64 above INT64_MAX is an
 * error), or of any numeric array as a double. */
ts_status ts_gguf_array_int(const ts_gguf *g, const char *key, uint64_t i,
                            int64_t *out);
ts_status ts_gguf_array_f64(const ts_gguf *g, const char *key, uint64_t i,
                            double *out);
/* A numeric or bool array's elements as stored (little-endian, possibly
 * unaligned: read with memcpy), or NULL (error set) for other arrays. */
const void *ts_gguf_array_data(const ts_gguf *g, const char *key,
                               ts_gguf_type *elem, uint64_t *n);

/* ---- tensors ------------------------------------------------------------ */

int64_t ts_gguf_tensor_count(const ts_gguf *g);
/* Tensor i's name (file order), or NULL. */
const char *ts_gguf_tensor_name(const ts_gguf *g, int64_t i);
/* The index of the tensor called name (hashed), or -1. */
int64_t ts_gguf_find_tensor(const ts_gguf *g, const char *name);
/* Tensor i's ggml type number (-1 for a bad i). */
int ts_gguf_tensor_type(const ts_gguf *g, int64_t i);
/* ggml's name of a type ("f32", "q4_k", "iq2_xxs", ...), NULL if unknown. */
const char *ts_ggml_type_name(int ggml_type);
/* Tensor i's dims in GGUF order (ne[0] innermost; ne has room for 4) and
 * their count; -1 for a bad i. */
int ts_gguf_tensor_ne(const ts_gguf *g, int64_t i, int64_t *ne);
/* Tensor i's byte count and its offset in the file. */
uint64_t ts_gguf_tensor_nbytes(const ts_gguf *g, int64_t i);
uint64_t ts_gguf_tensor_file_offset(const ts_gguf *g, int64_t i);
/* The Tessera dtype of a ggml type; TS_ERR_UNSUPPORTED naming the type
 * (and the tensor, when given) for types Tessera has no dtype for. */
ts_status ts_gguf_dtype_of(const ts_gguf *g, int ggml_type, const char *tensor,
                           ts_dtype *out);
/* A new reference to the named tensor, Tessera's shape (dims reversed):
 * a view of the mapping (no copy; the mapping lives as long as the
 * tensor), or a copy when an element dtype's data is not aligned for it
 * (alignment below 4). NULL with the error set when the name is absent
 * (TS_ERR_INVALID_ARG) or its type has no dtype (TS_ERR_UNSUPPORTED). */
ts_tensor *ts_gguf_tensor(ts_gguf *g, const char *name);

/* ---- writing ------------------------------------------------------------ */

typedef struct ts_gguf_writer ts_gguf_writer;

/* NULL (error set on ctx) when out of memory. */
ts_gguf_writer *ts_gguf_writer_new(ts_ctx *ctx);
void ts_gguf_writer_free(ts_gguf_writer *w); /* NULL is fine */
/* Metadata, in the order added. A key is 1 to 65535 bytes and given once
 * (TS_ERR_INVALID_ARG otherwise); general.alignment, when given, must be
 * 32 (the alignment the writer uses). */
ts_status ts_gguf_writer_add_u8(ts_gguf_writer *w, const char *key, uint8_t v);
ts_status ts_gguf_writer_add_i8(ts_gguf_writer *w, const char *key, int8_t v);
ts_status ts_gguf_writer_add_u16(ts_gguf_writer *w, const char *key,
                                 uint16_t v);
ts_status ts_gguf_writer_add_i16(ts_gguf_writer *w, const char *key, int16_t v);
ts_status ts_gguf_writer_add_u32(ts_gguf_writer *w, const char *key,
                                 uint32_t v);
ts_status ts_gguf_writer_add_i32(ts_gguf_writer *w, const char *key, int32_t v);
ts_status ts_gguf_writer_add_u64(ts_gguf_writer *w, const char *key,
                                 uint64_t v);
ts_status ts_gguf_writer_add_i64(ts_gguf_writer *w, const char *key, int64_t v);
ts_status ts_gguf_writer_add_f32(ts_gguf_writer *w, const char *key, float v);
ts_status ts_gguf_writer_add_f64(ts_gguf_writer *w, const char *key, double v);
ts_status ts_gguf_writer_add_bool(ts_gguf_writer *w, const char *key, bool v);
/* v NUL-terminated; _n: len bytes (may hold NULs). */
ts_status ts_gguf_writer_add_string(ts_gguf_writer *w, const char *key,
                                    const char *v);
ts_status ts_gguf_writer_add_string_n(ts_gguf_writer *w, const char *key,
                                      const char *v, size_t len);
/* n elements of a numeric or bool type (elem: not STRING nor ARRAY), read
 * from data in the host's layout (bool: one byte each, 0 or 1). */
ts_status ts_gguf_writer_add_array(ts_gguf_writer *w, const char *key,
                                   ts_gguf_type elem, const void *data,
                                   uint64_t n);
/* n NUL-terminated strings; lens (may be NULL) gives each one's length
 * instead (strings holding NULs). */
ts_status ts_gguf_writer_add_string_array(ts_gguf_writer *w, const char *key,
                                          const char *const *v,
                                          const size_t *lens, uint64_t n);
/* A tensor, written under name (1 to 63 bytes, unique) with GGUF's dims
 * (t's shape reversed; at most 4 dims, each >= 1). Element dtypes are read
 * in any layout; block dtypes (q8_0, q4_k, ...) are written as their raw
 * bytes and must be contiguous. The writer keeps a reference to t until it
 * is freed; the data is read at save time. */
ts_status ts_gguf_writer_add_tensor(ts_gguf_writer *w, const char *name,
                                    ts_tensor *t);
/* Writes GGUF v3 with alignment 32 to path atomically (a temporary file
 * beside it, fsync, rename): a failure leaves any previous file as it was.
 * The writer stays usable (save again, or free it). */
ts_status ts_gguf_writer_save(ts_gguf_writer *w, const char *path);

/* ---- a GGUF model as a Hugging Face folder -------------------------------
 * For general.architecture qwen3, qwen2, llama and gpt2 with a byte-level
 * BPE vocabulary (tokenizer.ggml.model "gpt2"). Every *json out is a
 * NUL-terminated text the caller frees with free(). */

/* config.json: model_type and the sizes from {arch}.embedding_length,
 * block_count, feed_forward_length, context_length, attention.head_count,
 * head_count_kv, key_length (head_dim), rope.freq_base,
 * attention.layer_norm_rms_epsilon (gpt2: layer_norm_epsilon), rope
 * scaling (linear, yarn); vocab_size from tokenizer.ggml.tokens (else
 * {arch}.vocab_size, else token_embd's rows); tie_word_embeddings when
 * there is no output.weight; attention_bias (mlp_bias) when blk.0 has a
 * q (up) bias; bos/eos ids; torch_dtype from token_embd's type. Floats
 * stored as float32 are written as their shortest decimal (1e-06). An
 * unknown architecture is TS_ERR_UNSUPPORTED naming it and the supported
 * ones; a missing required key is TS_ERR_IO naming it; Llama 3.1's rope
 * scaling (a rope_freqs tensor) is TS_ERR_UNSUPPORTED. */
ts_status ts_gguf_hf_config_json(ts_ctx *ctx, ts_gguf *g, char **json);
/* tokenizer.json of the byte-level BPE: tokens by id into model.vocab
 * (token_type 1 normal, 6 byte), added_tokens (3 control: special; 4
 * user-defined: not special), 5 (unused, llama.cpp's [PADn]) left out;
 * merges; tokenizer.ggml.pre as Hugging Face's pre-tokenizer of that
 * family (qwen2: NFC + Qwen's Split regex; llama-bpe/llama3: Llama 3's,
 * ignore_merges; gpt-4o; gpt-2 and default: ByteLevel's own regex) +
 * ByteLevel; a TemplateProcessing post-processor that adds bos (eos) when
 * tokenizer.ggml.add_bos_token (add_eos_token) says so. A "llama"
 * (SentencePiece) or other vocabulary, or an unknown pre, is
 * TS_ERR_UNSUPPORTED naming it. */
ts_status ts_gguf_hf_tokenizer_json(ts_ctx *ctx, ts_gguf *g, char **json);
/* tokenizer_config.json: bos/eos/pad/unk tokens (their strings),
 * add_bos_token, add_eos_token and chat_template. */
ts_status ts_gguf_hf_tokenizer_config_json(ts_ctx *ctx, ts_gguf *g,
                                           char **json);
/* tokenizer.chat_template (owned by g), or NULL. */
const char *ts_gguf_hf_chat_template(ts_gguf *g);
/* generation_config.json: bos/eos/pad ids and, when the file recommends
 * sampling (general.sampling.temp, top_k, top_p, min_p, penalty_repeat),
 * those with do_sample true. */
ts_status ts_gguf_hf_generation_config_json(ts_ctx *ctx, ts_gguf *g,
                                            char **json);
/* The text of the Hugging Face file `file` ("config.json",
 * "tokenizer.json", "tokenizer_config.json", "generation_config.json") of
 * the GGUF at path, as the functions above make it (free() it): what the
 * loaders read when a model path is a GGUF file. */
ts_status ts_gguf_hf_file_text(ts_ctx *ctx, const char *path, const char *file,
                               char **text);
/* The GGUF at path as a ts_safetensors handle under Hugging Face's names
 * (token_embd.weight -> model.embed_tokens.weight, blk.N.attn_q.weight ->
 * model.layers.N.self_attn.q_proj.weight, ..., output -> lm_head; gpt2's
 * -> transformer.*; names without a counterpart, such as rope_freqs, kept
 * as they are), Tessera's dtypes and shapes, viewing the mapping (zero
 * copy). Two kinds are copies: llama's q/k weights and biases, whose rows
 * convert_hf_to_gguf.py permuted for llama.cpp's rope, put back in Hugging
 * Face's order (whole rows move, so block formats too), and gpt2's Conv1D
 * matrices, transposed back to (in, out) (element dtypes only). Every
 * tensor's type must have a Tessera dtype (TS_ERR_UNSUPPORTED naming the
 * tensor and type otherwise). */
ts_status ts_gguf_open_as_safetensors(ts_ctx *ctx, const char *path,
                                      ts_safetensors **out);

/* ---- a Hugging Face folder as GGUF (`tessera convert`) ------------------ */

/* Hugging Face's tensor name -> GGUF's (model.layers.3.mlp.up_proj.weight
 * -> blk.3.ffn_up.weight; GPT-2's with or without "transformer.").
 * TS_ERR_INVALID_ARG (no message: there is no context) for a name with no
 * GGUF counterpart, TS_ERR_RANGE when out (cap bytes) is too small. */
ts_status ts_gguf_hf_name(const char *hf_name, char *out, size_t cap);
/* How a Hugging Face tensor of a model of config c is stored in GGUF:
 * *permute_heads > 0 for Llama's q_proj/k_proj weights and biases (rows
 * permuted by that many heads: ts_gguf_permute_rows), *transpose for
 * GPT-2's Conv1D matrices (written transposed). */
void ts_gguf_hf_tensor_rule(const ts_model_config *c, const char *hf_name,
                            int64_t *permute_heads, bool *transpose);
/* A new tensor with w's rows (dim 0; a 1-D w: its elements) in
 * llama.cpp's rope order (to_gguf) or back in Hugging Face's: within each
 * of n_head heads of D rows, row t D/2 + j <-> row 2 j + t. Any dtype
 * (block formats: contiguous). NULL with the error set when the rows are
 * not n_head heads of an even size. */
ts_tensor *ts_gguf_permute_rows(ts_tensor *w, int64_t n_head, bool to_gguf);
/* The metadata of the model folder hf_dir into w, as llama.cpp's
 * converter writes it: general.architecture and name; {arch}.* sizes
 * (above) and vocab_size; the tokenizer (tokenizer.ggml.model "gpt2", pre
 * detected from tokenizer.json's Split regex, tokens padded to vocab_size
 * with [PADn], token_type, merges, bos/eos/padding/unknown ids from
 * tokenizer_config.json's tokens else config.json's, add_bos_token) and
 * tokenizer.chat_template from tokenizer_config.json. Tensors are the
 * caller's (ts_gguf_hf_name, ts_gguf_hf_tensor_rule). */
ts_status ts_gguf_writer_add_hf_metadata(ts_gguf_writer *w, ts_ctx *ctx,
                                         const char *hf_dir);

/* ---- Hugging Face files from text ---------------------------------------
 * What ts_config_load and ts_tokenizer_load do, from text in memory (the
 * Hugging Face view of a GGUF below makes its config.json and
 * tokenizer.json as text). origin names the text in messages. */

/* config.json's text (NUL-terminated) into *out, with every check of
 * ts_config_load (src/io/config.c). */
ts_status ts_config_from_json_text(ts_ctx *ctx, const char *text,
                                   const char *origin, ts_model_config *out);
/* tokenizer.json's text (len bytes) into a new tokenizer, with every check
 * of ts_tokenizer_load (src/tokenizer/bpe.c). */
ts_status ts_tokenizer_load_text(ts_ctx *ctx, const char *json_text, size_t len,
                                 const char *origin, ts_tokenizer **out);

#ifdef __cplusplus
}
#endif
#endif
