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
/* The value of a "__metadata__" key, or NULL. */
const char *ts_safetensors_metadata(const ts_safetensors *st, const char *key);
/* A new reference to the named tensor: a view of the mapped file (no copy)
 * when aligned for its dtype, else a copy. NULL + TS_ERR_INVALID_ARG naming
 * the tensor and file when absent. */
ts_tensor *ts_safetensors_get(ts_safetensors *st, const char *name);

/* Writes n named tensors (any layout; written row-major) and optional
 * metadata pairs (meta[2k] = key, meta[2k+1] = value, n_meta pairs) to
 * path atomically: a temporary file in the same folder, fsync, rename. A
 * failure leaves any previous file at path as it was. */
ts_status ts_safetensors_save(ts_ctx *ctx, const char *path, int n,
                              const char *const *names, ts_tensor *const *ts,
                              int n_meta, const char *const *meta);

#ifdef __cplusplus
}
#endif
#endif
