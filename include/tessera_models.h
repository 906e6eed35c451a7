/* tessera_models.h — models built from Hugging Face folders (config.json +
 * safetensors, loaded as they are). */
#ifndef TESSERA_MODELS_H
#define TESSERA_MODELS_H

#include "tessera_io.h"
#include "tessera_nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the decoder ----------------------------------------------------------
 * One decoder-only transformer for every family of ts_arch, built from the
 * description in ts_model_config (config.c's family table reads it from
 * config.json) and the family's Hugging Face parameter names (decoder.c's
 * name table): norms, positions, attention, MLP or experts, embeddings and
 * head are table data, not per-family forward code. Built from public ops
 * only: eager now, recorded unchanged in compiled mode. */
typedef struct ts_decoder ts_decoder;

/* How a model is built besides its config. */
typedef struct {
    /* dtype of the embedding and projection matrices: TS_F32 (0, the
     * default) or TS_BF16 (kept in bf16, computed in f32); norms and
     * biases stay f32 */
    ts_dtype weight_dtype;
    /* where the parameters (and KV cache) live: NULL for the current
     * device; else a map of cfg->layers layers (copied). A forward moves
     * the activations between devices where the map changes device. */
    const ts_device_map *device_map;
    /* parameters left uninitialized (a loader fills them from a
     * checkpoint): no random init's time and temporaries */
    bool no_init;
} ts_decoder_options;

/* TS_OK, or TS_ERR_INVALID_ARG with a message naming the bad field. */
ts_status ts_decoder_config_check(ts_ctx *ctx, const ts_model_config *cfg);

/* A new model (parameters with requires_grad), initialized as Hugging
 * Face's *PreTrainedModel._init_weights does: Normal(0, 0.02) for
 * embeddings and matrices (GPT-2's residual projections attn.c_proj and
 * mlp.c_proj: 0.02 / sqrt(2 layers)), norm weights ones (Gemma's (1 + w)
 * norms: zeros), biases zeros; each from a seed derived from seed and the
 * parameter's index. opt may be NULL. On failure *out is NULL and
 * ts_errmsg(ctx) says why. */
ts_status ts_decoder_new(ts_ctx *ctx, const ts_model_config *cfg,
                         const ts_decoder_options *opt, uint64_t seed,
                         ts_decoder **out);
void ts_decoder_free(ts_decoder *m); /* NULL is fine */
const ts_model_config *ts_decoder_get_config(const ts_decoder *m);

/* Builds the model dir's config.json describes and fills its parameters
 * from dir's safetensors (one file or shards), converted to the model's
 * dtype. dir must be a model folder (ts_model_dir_check). Every parameter
 * must be present with its exact shape (lm_head.weight may be absent when
 * tied), checked against the checkpoint's header before anything is
 * allocated; errors name the tensor, the file and both shapes. The
 * weights are scanned for NaN/Inf (see ts_load_options); tensors the model
 * does not use are reported as a warning. Loaded parameters do not
 * require grad. */
ts_status ts_decoder_load(ts_ctx *ctx, const char *dir, ts_decoder **out);

/* ... with options: weight dtype and a device_map string ("cpu", "auto",
 * "embed,0-13:cpu:0;14-27,head:cpu:1", see ts_device_map_parse). */
typedef struct {
    ts_dtype weight_dtype;  /* TS_F32 (0, the default) or TS_BF16 */
    const char *device_map; /* NULL: everything on the current device */
    /* Loading scans the f32/bf16/f16 weights the model uses once and
     * refuses a checkpoint holding NaN or Inf (the first one named: tensor
     * and index); true skips the scan (`--no-check-weights`). */
    bool no_check_weights;
    /* Where warnings go, e.g. "Some weights of the checkpoint at DIR were
     * not used: ..." (tensors the model does not have, layers beyond
     * config.json's count): warn(warn_user, message); NULL prints
     * "tessera: warning: message" to stderr. */
    void (*warn)(void *warn_user, const char *message);
    void *warn_user;
} ts_load_options;
ts_status ts_decoder_load_opts(ts_ctx *ctx, const char *dir,
                               const ts_load_options *opt, ts_decoder **out);

/* Inference: every 2-D bf16 matrix the forward multiplies by (the
 * projections, and the LM head, tied or not) marked to be kept in the
 * CPU's bf16 GEMM layout too and packed now, so that decode steps stream
 * the packed copies and the first request does not pay for them (about
 * the matrices' own size again: ts_decoder_packed_bytes). A matrix written
 * later (ts_copy_, an optimizer step) loses its copy and is packed again
 * at its next product, so results always follow the values. A no-op
 * where the CPU runs below avx512_bf16 and for other dtypes or devices.
 * TS_ERR_OOM names the parameter whose copy did not fit. */
ts_status ts_decoder_prepack(ts_decoder *m);
/* The memory the packed copies hold now (0 before ts_decoder_prepack). */
int64_t ts_decoder_packed_bytes(const ts_decoder *m);

/* Parameters as (name, tensor) pairs in Hugging Face's state_dict order
 * and names (Llama-style families: model.embed_tokens.weight,
 * model.layers.{i}.self_attn.q_proj.weight, ..., model.norm.weight,
 * lm_head.weight (absent when tied); GPT-2: transformer.wte.weight,
 * transformer.h.{i}.attn.c_attn.weight, ...). A mixture of experts keeps
 * each layer's experts stacked, one parameter per projection: (E, F, C)
 * for gate and up, (E, C, F) for down, named model.layers.{i}.mlp.experts.
 * gate_proj (Mixtral: ...block_sparse_moe.experts.w1); the checkpoint's
 * per-expert tensors are their slices (ts_decoder_state_dict). Tensors and
 * names are borrowed: they live as long as the model. */
int ts_decoder_num_params(const ts_decoder *m);
const char *ts_decoder_param_name(const ts_decoder *m, int i);
ts_tensor *ts_decoder_param(const ts_decoder *m, int i);
/* The borrowed parameter list, for optimizers and gradient clipping. */
ts_tensor *const *ts_decoder_params(const ts_decoder *m);
/* The parameter called name, or NULL (with no error recorded). */
ts_tensor *ts_decoder_find_param(const ts_decoder *m, const char *name);
/* Replaces parameter i by t (same dtype, shape and device), e.g. a view
 * of a mapped checkpoint: the loader's zero-copy path. */
ts_status ts_decoder_set_param(ts_decoder *m, int i, ts_tensor *t);

/* The checkpoint's view of the parameters, in Hugging Face's names and
 * layout: a stacked expert parameter is E tensors (views of its slices,
 * model.layers.{i}.mlp.experts.{e}.gate_proj.weight), everything else
 * itself. params: tensors standing for the model's parameters (same
 * order and shapes, e.g. gathered copies of sharded ones), or NULL for
 * the model's own. n receives the count; names (malloc'd array of
 * malloc'd strings) and tensors (new references) are the caller's to free
 * with ts_decoder_state_dict_free. */
ts_status ts_decoder_state_dict(const ts_decoder *m, ts_tensor *const *params,
                                int *n, char ***names, ts_tensor ***tensors);
void ts_decoder_state_dict_free(int n, char **names, ts_tensor **tensors);
/* Writes dir/model.safetensors (the state dict above, atomically) and, for
 * a model loaded from a folder, a copy of its config.json: a folder
 * ts_decoder_load (and Hugging Face) read back. */
ts_status ts_decoder_save(ts_decoder *m, const char *dir);

/* ids (B, T) i64 or i32, at positions pos0 .. pos0+T-1 -> logits (B, T, V).
 * Causal self-attention over the T positions given (no KV cache). */
ts_tensor *ts_decoder_forward(ts_decoder *m, ts_tensor *ids, int64_t pos0);
/* The same without the LM head: the final norm's output (B, T, C), the
 * hidden states an embedding pools. */
ts_tensor *ts_decoder_forward_hidden(ts_decoder *m, ts_tensor *ids,
                                     int64_t pos0);
/* Mean cross-entropy of forward(ids, 0) against targets (B, T) i64/i32,
 * the next tokens already aligned with ids (no shift inside); targets of
 * -100 are ignored. A mixture of experts adds router_aux_loss_coef times
 * the load-balancing loss of Hugging Face's load_balancing_loss_func over
 * every sparse layer's router logits. The scalar loss; when logits is not
 * NULL it receives a new reference to the logits (B, T, V). */
ts_tensor *ts_decoder_loss(ts_decoder *m, ts_tensor *ids, ts_tensor *targets,
                           ts_tensor **logits);

/* Activation checkpointing per layer (ts_checkpoint): forward with a graph
 * keeps each layer's input only, backward recomputes the layer. Same
 * values and gradients; less memory, one more forward. (Sparse layers are
 * not checkpointed while the load-balancing loss needs their router
 * logits.) */
ts_status ts_decoder_set_checkpointing(ts_decoder *m, bool on);
/* Mixed precision: with TS_BF16, every forward (and backward) multiplies
 * by bf16 copies of the f32 matrices, cast where used, so their gradients
 * arrive, bf16-rounded, in the f32 masters' .grad; activations, norms and
 * the optimizer stay f32. TS_F32 (the default) uses the masters. */
ts_status ts_decoder_set_compute_dtype(ts_decoder *m, ts_dtype dt);

/* fn(arg, layer, before, backward) around each layer: before and after
 * its forward (backward false), and, for a checkpointed layer, before its
 * recompute and after its backward (backward true: its parameters'
 * gradients are then complete). What fully sharded training uses to
 * gather a layer's parameters just in time and release them after. NULL
 * removes it. An error from fn fails the forward or backward. */
typedef ts_status (*ts_layer_hook)(void *arg, int64_t layer, bool before,
                                   bool backward);
ts_status ts_decoder_set_layer_hook(ts_decoder *m, ts_layer_hook fn, void *arg);
/* The parameters layer i owns (indices into the parameter list): first
 * and count, for sharding by layer; -1 for the embeddings (and learned
 * positions), L for the final norm and head. */
ts_status ts_decoder_layer_params(const ts_decoder *m, int64_t layer,
                                  int *first, int *count);

/* ---- KV cache and generation --------------------------------------------- */

/* Keys and values of every layer for B sequences of up to max_T positions
 * (f32, beside each layer). forward_cached runs ids (B, T) at the
 * positions after those cached, attends to them too, appends its own, and
 * returns the logits (B, T, V). */
typedef struct ts_decoder_cache ts_decoder_cache;
ts_status ts_decoder_cache_new(ts_decoder *m, int64_t B, int64_t max_T,
                               ts_decoder_cache **out);
void ts_decoder_cache_free(ts_decoder_cache *kc);
int64_t ts_decoder_cache_len(const ts_decoder_cache *kc);
void ts_decoder_cache_reset(ts_decoder_cache *kc);
/* keeps the first len positions (a shorter len than cached only) */
void ts_decoder_cache_truncate(ts_decoder_cache *kc, int64_t len);
ts_tensor *ts_decoder_forward_cached(ts_decoder *m, ts_decoder_cache *kc,
                                     ts_tensor *ids);
/* The same, with the logits of the last position only (B, 1, V): what
 * generation needs, without the LM head over the whole prompt. */
ts_tensor *ts_decoder_forward_cached_last(ts_decoder *m, ts_decoder_cache *kc,
                                          ts_tensor *ids);
/* Greedy decoding: the prompt in one pass, then n_new tokens one at a time
 * through the cache, written to out. */
ts_status ts_decoder_generate_greedy(ts_decoder *m, const int64_t *prompt,
                                     int64_t n_prompt, int64_t n_new,
                                     int64_t *out);

/* ---- paged KV cache (serving) ---------------------------------------------
 * A pool of KV blocks shared by many sequences: per layer K and V (blocks,
 * KV, block_size, row), beside the layer. The engine (src/engine) owns
 * which block holds what; the model only reads and writes through the
 * block tables of ts_paged_attention's meta. */
typedef struct ts_kv_pool ts_kv_pool;

/* The pool's element type (the engine's ts_engine_options.kv_dtype; zero
 * is the default, bf16). A row is one position of one KV head:
 *  - TS_KV_BF16: a TS_BF16 tensor (blocks, KV, block_size, D), each value
 *    rounded to nearest even (ts_f32_to_bf16);
 *  - TS_KV_F32: a TS_F32 tensor (blocks, KV, block_size, D);
 *  - TS_KV_INT8: a TS_I32 tensor (blocks, KV, block_size, W) whose words
 *    hold packed rows, W = (D + 3) / 4 + 1: bytes 0..D-1 the int8 values
 *    q, then zero padding, the last word the row's f32 scale; a value is
 *    q x scale, scale = max |x| / 127 over the row and q = x / scale
 *    rounded to nearest (a row of zeros has scale 0; a row holding Inf or
 *    NaN has scale NaN). The scale travels with its row, so a block's bytes
 *    are one contiguous slab per layer and K/V (what a transfer carries).
 * ts_paged_attention tells the three apart by the pool tensors' dtype. */
typedef enum {
    TS_KV_BF16 = 0, /* bf16 K and V */
    TS_KV_F32,      /* f32 */
    TS_KV_INT8      /* int8, one f32 scale per position and KV head */
} ts_kv_dtype;

/* A pool of n_blocks blocks of block_size positions, of type dt; pools of
 * layers placed on a device other than the CPU are f32 (its kernels read
 * f32), and then every layer's is, so that a block's bytes have one
 * layout (ts_kv_pool_dtype says which type the pool got). */
ts_status ts_kv_pool_new_ex(ts_decoder *m, int64_t n_blocks, int64_t block_size,
                            ts_kv_dtype dt, ts_kv_pool **out);
/* the type a pool of type want gets on m's placement (want, or TS_KV_F32
 * when a layer is off the CPU) */
ts_kv_dtype ts_decoder_kv_dtype(const ts_decoder *m, ts_kv_dtype want);
/* ts_kv_pool_new_ex with TS_KV_F32 */
ts_status ts_kv_pool_new(ts_decoder *m, int64_t n_blocks, int64_t block_size,
                         ts_kv_pool **out);
void ts_kv_pool_free(ts_kv_pool *p);
/* the type the pool holds */
ts_kv_dtype ts_kv_pool_dtype(const ts_kv_pool *p);
/* "bf16", "f32", "int8" ("?" for a value outside the enum) */
const char *ts_kv_dtype_name(ts_kv_dtype dt);
/* bytes of one block over all layers (K and V) of type dt: 2 x layers x
 * KV x block_size x the row's bytes (4 D, 2 D, or 4 W for int8) */
int64_t ts_kv_block_bytes_ex(const ts_model_config *c, int64_t block_size,
                             ts_kv_dtype dt);
/* ts_kv_block_bytes_ex of TS_KV_F32 */
int64_t ts_kv_block_bytes(const ts_model_config *c, int64_t block_size);
/* Block `block` of every layer out of the pool into out, or from in into
 * the pool: per layer K then V, each (KV, block_size, row) in the pool's
 * own type and bytes (int8 rows with their scales),
 * ts_kv_block_bytes_ex(pool's type) in all (what a KV transfer carries). */
ts_status ts_kv_pool_read_block(ts_kv_pool *p, int64_t block, void *out);
ts_status ts_kv_pool_write_block(ts_kv_pool *p, int64_t block, const void *in);
/* One engine step: ids (1, N) are the new tokens of several sequences
 * (meta: ts_paged_attention's), positions[N] their positions; returns
 * the logits (n_rows, V) of the tokens at rows[] (each sequence's last). */
ts_tensor *ts_decoder_forward_paged(ts_decoder *m, ts_kv_pool *pool,
                                    ts_tensor *ids, const int32_t *positions,
                                    ts_tensor *meta, const int32_t *rows,
                                    int64_t n_rows);
/* ... and also, or only, final hidden states: *logits (n_rows, V) of the
 * tokens at rows[] (NULL when n_rows is 0) and *hidden (n_hrows, C), the
 * final norm's output at hrows[] (NULL when n_hrows is 0), new
 * references. Both counts 0 only writes the K/V. */
ts_status ts_decoder_forward_paged_ex(ts_decoder *m, ts_kv_pool *pool,
                                      ts_tensor *ids, const int32_t *positions,
                                      ts_tensor *meta, const int32_t *rows,
                                      int64_t n_rows, const int32_t *hrows,
                                      int64_t n_hrows, ts_tensor **logits,
                                      ts_tensor **hidden);

/* ---- any causal LM --------------------------------------------------------
 * A decoder and its single-sequence KV cache, chosen by config.json: what
 * generation drives without knowing the family. */
typedef struct ts_lm ts_lm;
/* dir must be a model folder (ts_model_dir_check: config.json and the
 * safetensors); opt may be NULL (f32, one device, weights checked,
 * warnings to stderr). */
ts_status ts_lm_load(ts_ctx *ctx, const char *dir, const ts_load_options *opt,
                     ts_lm **out);
void ts_lm_free(ts_lm *lm);
const ts_model_config *ts_lm_config(const ts_lm *lm);
/* the decoder inside */
ts_decoder *ts_lm_decoder(ts_lm *lm);
/* KV cache for one sequence of up to max_T positions */
typedef struct ts_lm_cache ts_lm_cache;
ts_status ts_lm_cache_new(ts_lm *lm, int64_t max_T, ts_lm_cache **out);
void ts_lm_cache_free(ts_lm_cache *kc);
int64_t ts_lm_cache_len(const ts_lm_cache *kc);
/* keeps the first len cached positions (to reuse a common prefix) */
void ts_lm_cache_truncate(ts_lm_cache *kc, int64_t len);
/* ids (1, T) after the cached positions -> logits (1, T, V); (1, 1, V) of
 * the last position with last_only */
ts_tensor *ts_lm_forward_cached(ts_lm *lm, ts_lm_cache *kc, ts_tensor *ids,
                                bool last_only);
/* ids (B, T) from position 0 -> logits (B, T, V) */
ts_tensor *ts_lm_forward(ts_lm *lm, ts_tensor *ids);

/* ---- quantized GGUF files (src/models/quantize.c) ------------------------
 * A model folder (or a GGUF) written as a GGUF of file type `type`: "f32",
 * "f16", "bf16" (every matrix in that dtype) or "q8_0", "q4_0", "q4_k_s",
 * "q4_k_m" ("q4_k"), "q5_k_s", "q5_k_m" ("q5_k"), "q6_k" with llama.cpp's
 * choice per tensor (ts_quantize_tensor_type). With the tokenizer, chat
 * template and hyperparameters in the metadata, so llama.cpp and `tessera
 * run -m FILE.gguf` load it as it is. The file is written atomically. */
typedef struct {
    const char *type;
    /* after each tensor: its index of n, GGUF name and dtype (may be NULL) */
    void (*progress)(void *user, int i, int n, const char *name, ts_dtype to);
    void *progress_user;
    /* a tensor left out (no GGUF name), named (may be NULL) */
    void (*warn)(void *user, const char *tensor);
    void *warn_user;
} ts_quantize_options;
ts_status ts_model_quantize(ts_ctx *ctx, const char *in, const char *out,
                            const ts_quantize_options *opt);
/* The dtype llama.cpp gives the tensor `name` (Hugging Face's name; ndim
 * dims, rows of `row` elements, in a model of `layers` layers) under the
 * file type; TS_F32 for 1-D tensors. */
ts_dtype ts_quantize_tensor_type(const char *file_type, const char *name,
                                 int ndim, int64_t row, int64_t layers,
                                 bool tied_embeddings);
/* "f32, f16, bf16, q8_0, ..." for messages and --help */
const char *ts_quantize_type_names(void);
/* The model's matrices quantized in place to the file type's formats (as
 * ts_model_quantize chooses them; norms and biases stay), e.g. a bf16
 * folder run as q8_0 (`tessera run --quantize q8_0`). Quantized weights
 * compute on the CPU: a device map putting one on another backend is an
 * error. The model is for inference afterwards (no gradients). */
ts_status ts_decoder_quantize(ts_decoder *m, const char *file_type);

#ifdef __cplusplus
}
#endif
#endif
