/* gguf_internal.h — what the GGUF files of src/io share and nothing else
 * sees: the type tables, a reference to a GGUF file's mapping and the raw
 * bytes of its tensors (gguf.c), and a safetensors handle made from entries
 * over memory its caller owns (safetensors.c), through which gguf_hf.c shows a
 * GGUF model under Hugging Face's tensor names. */
#ifndef TS_GGUF_INTERNAL_H
#define TS_GGUF_INTERNAL_H

#include "tessera_gguf.h"

#define GGUF_MAX_DIMS      4  /* GGML_MAX_DIMS */
#define GGUF_MAX_NAME      64 /* the spec's limit on tensor names (read) */
#define GGUF_WRITE_NAME    63 /* llama.cpp's (GGML_MAX_NAME with its NUL) */
#define GGUF_MAX_KEY       65535
#define GGUF_ALIGN_DEFAULT 32

/* bytes of each scalar value type (0: string, array) */
extern const uint8_t gguf_type_sizes[TS_GGUF_TYPE_COUNT];
/* the ggml type of a Tessera dtype, or -1 */
int gguf_ggml_of_dtype(ts_dtype dt);

/* A new reference to g's file mapping (an owner for ts_tensor_wrap),
 * released by gguf_map_release; the mapping outlives ts_gguf_close while
 * any reference is held. */
void *gguf_map_retain(ts_gguf *g);
void gguf_map_release(void *owner);
/* the mapping's first byte and length */
void gguf_map_span(const ts_gguf *g, void **base, size_t *len);
/* Tensor i's bytes in the mapping (ts_gguf_tensor_nbytes of them). */
unsigned char *gguf_tensor_bytes(const ts_gguf *g, int64_t i);

/* One tensor of a safetensors handle made by st_from_regions: its bytes
 * are [data, data + bytes) inside region `region`. */
typedef struct {
    const char *name; /* copied */
    ts_dtype dt;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    const void *data;
    uint64_t bytes;
    int region;
} st_entry_desc;

/* Memory the handle's tensors view: the handle takes over one reference,
 * released (owner_release(owner)) when the handle and every tensor got
 * from it are gone. */
typedef struct {
    void *base;
    size_t len;
    void *owner;
    void (*owner_release)(void *owner);
} st_region;

/* A ts_safetensors handle over n_regions regions (taken over even on
 * failure) and n entries, read like one opened from a file (find, get,
 * shape, check_finite; names in the order given); origin names it in
 * messages. Entries must lie inside their region, names be unique. */
ts_status st_from_regions(ts_ctx *ctx, const char *origin, int n_regions,
                          const st_region *regions, int n,
                          const st_entry_desc *entries, ts_safetensors **out);

#endif
