/* tessera_tokenizer.h — Hugging Face tokenizer.json: byte-level BPE with
 * the Split (regex) and ByteLevel pre-tokenizers of GPT-2, Llama 3 and
 * Qwen2/3, the NFC normalizer, added/special tokens matched before BPE,
 * the ByteLevel decoder, and incremental decoding that never splits a
 * UTF-8 character. */
#ifndef TESSERA_TOKENIZER_H
#define TESSERA_TOKENIZER_H

#include "tessera.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_tokenizer ts_tokenizer;

/* path: a tokenizer.json, or a folder holding one. A tokenizer of a kind
 * not supported is an error naming the kind. */
ts_status ts_tokenizer_load(ts_ctx *ctx, const char *path, ts_tokenizer **out);
void ts_tokenizer_free(ts_tokenizer *tok);
int32_t ts_tokenizer_vocab_size(const ts_tokenizer *tok);
/* The id of a token's string form, or -1. */
int32_t ts_tokenizer_token_id(const ts_tokenizer *tok, const char *token);

/* text (len bytes of UTF-8) -> ids (malloc'd, caller frees). With
 * allow_special, added tokens in the text become their ids; without, they
 * are encoded as plain text. Invalid UTF-8 is an error. */
ts_status ts_tokenizer_encode(ts_tokenizer *tok, const char *text, size_t len,
                              bool allow_special, int32_t **ids, size_t *n);
/* ids -> text (malloc'd, NUL-terminated; *len excludes the NUL). */
ts_status ts_tokenizer_decode(ts_tokenizer *tok, const int32_t *ids, size_t n,
                              bool skip_special, char **text, size_t *len);

/* Streaming detokenizer: feed ids one at a time; each call appends to out
 * (at most out_cap bytes) only the complete UTF-8 characters decoded so
 * far, keeping a partial character for the next call. */
typedef struct {
    unsigned char pending[8];
    int n_pending;
} ts_detok_state;
ts_status ts_tokenizer_decode_step(ts_tokenizer *tok, ts_detok_state *st,
                                   int32_t id, char *out, size_t out_cap,
                                   size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
