/* consistency.h — inside src/train: the checks `tessera train` runs
 * before it builds the model (consistency.c). */
#ifndef TS_TRAIN_CONSISTENCY_H
#define TS_TRAIN_CONSISTENCY_H

#include "tessera_io.h"
#include "tessera_train.h"

/* The model (config cfg, read into mc), the tokenizer and the data agree:
 * --seq within the model's positions; bos/eos/pad ids within its
 * vocabulary and the tokenizer's; its vocab_size holding every id of the
 * tokenizer (much larger: a note on stderr when speak) and the data's
 * vocabulary; meta.json's tokenizer_hash the tokenizer's (no hash: a
 * warning when speak); --init-from's own tokenizer the same. Every
 * refusal names both sides. tok_dir receives the tokenizer in use:
 * --tokenizer, else the data folder's, else --init-from's, else "". */
ts_status ts_train_check_consistency(ts_ctx *ctx, const ts_train_options *o,
                                     const char *cfg, const ts_model_config *mc,
                                     bool speak, char *tok_dir, size_t tok_cap);

#endif
