/* tessera_tokenizer.h — Hugging Face tokenizer.json: byte-level BPE with
 * the Split (regex; every behavior, invert) and ByteLevel pre-tokenizers
 * of GPT-2/4o, Llama 3, Qwen2/3, DeepSeek-V3 (ignore_merges honoured);
 * SentencePiece-style BPE (Prepend/Replace normalizers or Metaspace, byte
 * fallback) of Llama 2 and Gemma; the NFC/NFD/NFKC/NFKD, Lowercase,
 * StripAccents and Strip normalizers,
 * added/special tokens matched before BPE, the matching decoders, and
 * incremental decoding that never splits a UTF-8 character. Chat
 * templates (a Jinja subset) from tokenizer_config.json. */
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
/* Fails (TS_ERR_RANGE), naming the first token, vocabulary or added, whose
 * id is >= model_vocab_size (config.json's vocab_size) and both sizes:
 * such a tokenizer would feed the model ids past its embedding. */
ts_status ts_tokenizer_check_vocab(ts_ctx *ctx, const ts_tokenizer *tok,
                                   int64_t model_vocab_size);
/* The id of a token's string form, or -1. */
int32_t ts_tokenizer_token_id(const ts_tokenizer *tok, const char *token);

/* text (len bytes of UTF-8) -> ids (malloc'd, caller frees). Added tokens
 * in the text become their ids; special ones only with allow_special
 * (without, they are encoded as plain text, as split_special_tokens=True
 * does in Hugging Face's tokenizers). Invalid UTF-8 is an error. */
ts_status ts_tokenizer_encode(ts_tokenizer *tok, const char *text, size_t len,
                              bool allow_special, int32_t **ids, size_t *n);
/* The special tokens the post-processor puts before and after a single
 * text (TemplateProcessing: Llama 2's <s>, Llama 3's <|begin_of_text|>),
 * as Hugging Face's encode(text) adds them by default; chat templates
 * write their own. The count; *ids points into the tokenizer. */
size_t ts_tokenizer_prefix_ids(const ts_tokenizer *tok, const int32_t **ids);
size_t ts_tokenizer_suffix_ids(const ts_tokenizer *tok, const int32_t **ids);
/* ts_tokenizer_encode (special tokens in the text recognized) and, with
 * add_special_tokens, the post-processor's tokens around the result, as
 * Hugging Face's encode(text) does by default. A rendered chat template
 * writes its own: encode it without. */
ts_status ts_tokenizer_encode_text(ts_tokenizer *tok, const char *text,
                                   size_t len, bool add_special_tokens,
                                   int32_t **ids, size_t *n);

/* ids -> text (malloc'd, NUL-terminated; *len excludes the NUL). */
ts_status ts_tokenizer_decode(ts_tokenizer *tok, const int32_t *ids, size_t n,
                              bool skip_special, char **text, size_t *len);

/* Token id's raw bytes (byte-level pieces undone, no Strip decoder) into
 * buf (at most cap written); returns the full length, or -1 for an id not
 * in the vocabulary. *special (may be NULL): a special added token. */
int64_t ts_tokenizer_token_bytes(const ts_tokenizer *tok, int32_t id,
                                 unsigned char *buf, size_t cap, bool *special);

/* Streaming detokenizer: feed ids one at a time; each call appends to out
 * (at most out_cap bytes) only the complete UTF-8 characters decoded so
 * far, keeping a partial character for the next call. Out is always valid
 * UTF-8: an ill-formed sequence (overlong, a surrogate, past U+10FFFF, a
 * lead byte whose continuation bytes do not follow) becomes U+FFFD, as
 * Python's errors="replace"; a character still incomplete when the ids
 * stop is held, never emitted. */
typedef struct {
    unsigned char pending[8];
    int n_pending;
    bool started;   /* some text was emitted */
    int n_stripped; /* leading spaces dropped (the Strip decoder) */
} ts_detok_state;
ts_status ts_tokenizer_decode_step(ts_tokenizer *tok, ts_detok_state *st,
                                   int32_t id, char *out, size_t out_cap,
                                   size_t *out_len);

/* ---- CLIP's tokenizer (Stable Diffusion's tokenizer/ folder) -------------
 * ts_tokenizer_load takes a folder with vocab.json + merges.txt (and
 * tokenizer_config.json, special_tokens_map.json) and no tokenizer.json
 * as Hugging Face's CLIPTokenizerFast converts them (NFC, whitespace runs
 * to one space, lower case; CLIP's regex; BPE with `</w>` ending a word;
 * <|startoftext|> text <|endoftext|>), or CLIP's tokenizer.json, to the
 * same ids. Decoding turns `</w>` into a space and strips the text's ends
 * (the streaming decoder keeps a trailing space). The pad token is
 * tokenizer_config.json's (else special_tokens_map.json's, else
 * tokenizer.json's padding) "pad_token": SD 1.x <|endoftext|>, SD 2.x "!"
 * (an added special token there, as in transformers: a "!" in the text
 * becomes it). */

/* tokenizer(text, padding="max_length", max_length=max_length,
 * truncation=True): the post-processor's tokens (bos) + the text's tokens
 * cut so that the closing ones (eos) fit + those, then the pad token up to
 * max_length. ids has max_length entries; *n_valid: the count before the
 * padding. No pad token, or a max_length without room for the special
 * tokens, is an error. */
ts_status ts_tokenizer_encode_padded(ts_tokenizer *tok, const char *text,
                                     size_t len, int max_length, int32_t *ids,
                                     int32_t *n_valid);
/* The pad token's id, or -1 when the tokenizer has none. */
int32_t ts_tokenizer_pad_id(const ts_tokenizer *tok);

/* ---- training a tokenizer ---------------------------------------------- */

typedef struct {
    int vocab_size;             /* 4096: bytes + merges + special tokens */
    int min_frequency;          /* 2: pairs rarer than this are not merged */
    const char *const *special; /* added after the merges; the first is
                                   the end-of-text token (eos) */
    int n_special;
    int64_t model_max_length; /* tokenizer_config.json's */
} ts_bpe_train_options;
ts_bpe_train_options ts_bpe_train_default_options(void);

typedef struct {
    int64_t bytes, distinct_words;
    int merges, vocab_size;
} ts_bpe_train_stats;

/* Trains a byte-level BPE (GPT-2's pre-tokenizer and alphabet) on the
 * files and writes out_dir/tokenizer.json and tokenizer_config.json, which
 * ts_tokenizer_load (and Hugging Face's tokenizers) read. stats may be
 * NULL. */
ts_status ts_bpe_train(ts_ctx *ctx, const char *const *files, int n_files,
                       const ts_bpe_train_options *o, const char *out_dir,
                       ts_bpe_train_stats *stats);

/* ---- Chat templates ----------------------------------------------------
 * The Jinja subset that real chat templates use, rendered exactly as
 * transformers' apply_chat_template renders them with Python's jinja2:
 * trim_blocks and lstrip_blocks on, the loop-controls extension (break,
 * continue), `tojson` as json.dumps(ensure_ascii=False), and the globals
 * raise_exception(msg) and strftime_now(fmt). Supported: {{ }}, {% %} and
 * {# #} with whitespace control (-, +); if/elif/else, for (with `loop`,
 * else, a filter condition, tuple unpacking), set (also ns.attr and block
 * set), macro/call of macros, raw; literals (strings, numbers, lists,
 * dicts, true/false/none), arithmetic, comparisons, and/or/not, in,
 * conditional expressions, slices, the filters and tests listed in
 * docs/CHAT_TEMPLATES.md, string and dict methods (startswith, split,
 * strip, items, get, ...), range, namespace, dict. Anything outside the
 * subset is a parse error naming the construct and the line. */
typedef struct ts_template ts_template;
ts_status ts_template_parse(ts_ctx *ctx, const char *src, size_t len,
                            ts_template **out);
/* vars_json: a JSON object whose members are the template's variables
 * (messages, add_generation_prompt, bos_token, tools, enable_thinking,
 * ...). Output is malloc'd and NUL-terminated; *len excludes the NUL.
 * raise_exception and undefined-variable errors come back as errors with
 * the template's message (TS_ERR_INVALID_ARG), naming the template's line.
 * A template is untrusted input, so one render is bounded: integers are
 * 64-bit and an overflow is an error naming the operation ("integer
 * overflow in 2 ** 100"), as is division by zero; a render that takes more
 * than max_steps evaluation steps (expressions, statements, loop
 * iterations, work in proportion to what filters walk) or builds more than
 * max_bytes of strings and list items (output included) stops with an
 * error naming the limit (TS_ERR_RANGE). Nothing is handed back on error.
 * A failed allocation, here or in ts_template_parse, is TS_ERR_OOM ("out
 * of memory while rendering" / "while parsing", with the template's line). */
ts_status ts_template_render(ts_ctx *ctx, const ts_template *t,
                             const char *vars_json, char **out, size_t *len);
void ts_template_free(ts_template *t);
#define TS_TEMPLATE_MAX_STEPS 5000000ull
#define TS_TEMPLATE_MAX_BYTES ((size_t)128 << 20)
/* The limits of t's later renders (defaults TS_TEMPLATE_MAX_STEPS and
 * TS_TEMPLATE_MAX_BYTES, generous for real chat templates; 0 keeps one). */
void ts_template_set_limits(ts_template *t, unsigned long long max_steps,
                            size_t max_bytes);

/* A model folder's chat setup from tokenizer_config.json: chat_template
 * (a string, or a list of named templates of which "default" is used),
 * bos_token and eos_token (strings or {"content": ...} objects). */
typedef struct ts_chat ts_chat;
ts_status ts_chat_load(ts_ctx *ctx, const char *dir, ts_chat **out);
void ts_chat_free(ts_chat *c);
const char *ts_chat_bos_token(const ts_chat *c); /* "" when none */
const char *ts_chat_eos_token(const ts_chat *c); /* "" when none */
/* messages_json: a JSON array of {"role", "content", ...} objects;
 * extra_vars_json: NULL or a JSON object of further variables (e.g.
 * {"enable_thinking": false}). bos_token and eos_token are passed as
 * apply_chat_template passes them. */
ts_status ts_chat_apply(ts_chat *c, const char *messages_json,
                        bool add_generation_prompt, const char *extra_vars_json,
                        char **out, size_t *len);
/* As ts_chat_load, with the template given (vLLM's --chat-template):
 * template is a file's path or a built-in's name (see
 * ts_chat_builtin_names; "chatml" among them); the folder's
 * tokenizer_config.json still gives bos_token and eos_token (a built-in
 * that needs its own end token names it: ts_chat_eos_token). A name that
 * is neither a readable file nor a built-in is an error listing the
 * built-ins. */
ts_status ts_chat_load_with(ts_ctx *ctx, const char *dir, const char *template,
                            ts_chat **out);
/* The built-in templates' names, comma-separated ("chatml,llama3,...") */
const char *ts_chat_builtin_names(void);
/* Whether the template reads the `tools` variable (tool calling renders
 * through it; without, the server describes the tools in a system
 * message) */
bool ts_chat_takes_tools(const ts_chat *c);
/* The model's tool-call syntax, from its template: "hermes" (Qwen2.5/3:
 * <tool_call>{json}</tool_call>), "llama3" ({"name", "parameters"} JSON,
 * optionally after <|python_tag|>), or "" (none known) */
const char *ts_chat_tool_syntax(const ts_chat *c);

#ifdef __cplusplus
}
#endif
#endif
