/* load_check.h — what every model loader checks in a checkpoint before
 * trusting it (internal to src/models): each expected tensor present with
 * the shape the config gives (compared on the header, before anything is
 * allocated), its values finite, and the tensors nobody used reported. */
#ifndef TS_MODELS_LOAD_CHECK_H
#define TS_MODELS_LOAD_CHECK_H

#include "tessera_models.h"

typedef struct {
    ts_ctx *ctx;
    const char *dir;
    ts_safetensors *st;
    const ts_load_options *opt;
    bool *used; /* per checkpoint tensor */
} ckpt_review;

ts_status ckpt_review_begin(ckpt_review *r, ts_ctx *ctx, const char *dir,
                            ts_safetensors *st, const ts_load_options *opt);
void ckpt_review_end(ckpt_review *r);
/* The index of the checkpoint tensor called name, or -1. */
int ckpt_find(const ckpt_review *r, const char *name);
/* Tensor k must have shape (ndim, want): marks it used, checks its values
 * unless the options say not to; an error names the tensor (shown as
 * name), the folder and both shapes. */
ts_status ckpt_expect(ckpt_review *r, int k, const char *name, int ndim,
                      const int64_t *want);
/* The warning for tensors not marked used, except those ignore() accepts:
 * up to five names and the count; with layer_of (the layer a name belongs
 * to, or -1) and layers, notes layers beyond config.json's count. */
void ckpt_warn_unused(ckpt_review *r, bool (*ignore)(const char *name),
                      int64_t (*layer_of)(const char *name), int64_t layers,
                      const char *layers_field);

#endif
