/* clip_bpe.h — what bpe.c takes from clip_bpe.c: a tokenizer folder's
 * special tokens (tokenizer_config.json, special_tokens_map.json) and
 * CLIP's vocab.json + merges.txt written as the tokenizer.json that
 * Hugging Face's CLIPTokenizerFast converts them to. Not public. */
#ifndef TS_CLIP_BPE_H
#define TS_CLIP_BPE_H

#include "tessera.h"

#include <stdbool.h>
#include <stddef.h>

/* dir holds vocab.json and merges.txt and no tokenizer.json */
bool ts_clip_folder(const char *dir);

/* key ("pad_token", "bos_token", ...) from dir/tokenizer_config.json, else
 * dir/special_tokens_map.json: a string or an {"content": ...} object,
 * into out (cap bytes); "" when neither file names it. A file that is
 * there but not a JSON object is an error naming it. */
ts_status ts_tokenizer_config_token(ts_ctx *ctx, const char *dir,
                                    const char *key, char *out, size_t cap);

/* dir's vocab.json + merges.txt (+ the special tokens of its configs) ->
 * tokenizer.json text (malloc'd, *len bytes). The folder must be CLIP's
 * (tokenizer_class CLIPTokenizer, or merges with `</w>`): other
 * tokenizers from these files are an error naming the class. */
ts_status ts_clip_tokenizer_json(ts_ctx *ctx, const char *dir, char **text,
                                 size_t *len);

#endif
