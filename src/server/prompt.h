/* prompt.h — an OpenAI completion or chat body to the model's token ids,
 * as the server and the router both need it (the router hashes the same
 * blocks the engine caches). */
#ifndef TS_SERVER_PROMPT_H
#define TS_SERVER_PROMPT_H

#include "tessera_tokenizer.h"

#include <jansson.h>
#include <pthread.h>

typedef struct {
    int status;        /* HTTP status: 400 */
    const char *param; /* the request field at fault, or NULL */
    char msg[512];
} ts_prompt_error;

/* "messages" through the chat template (chat), or "prompt" (a string, a
 * one-string array, or token ids), tokenized as the model expects (the
 * post-processor's special tokens for raw text). mu guards tok, chat and
 * ctx's error (may be NULL). 0 with *ids (malloc'd) and *n, or -1 with
 * err filled. */
int ts_openai_prompt(ts_tokenizer *tok, ts_chat *chat, ts_ctx *ctx,
                     pthread_mutex_t *mu, json_t *body, bool chat_req,
                     int32_t **ids, size_t *n, ts_prompt_error *err);

/* The chat text ts_openai_prompt tokenizes: body's messages and tools
 * through chat's template with the generation prompt (content parts
 * joined, null content as "", tool-call arguments given as JSON strings
 * parsed to objects; for a template that does not read `tools`, the
 * tools in a Hermes system message and calls and results as <tool_call>
 * and <tool_response> blocks: docs/CHAT_TEMPLATES.md). 0 with *text
 * (malloc'd, *len bytes), or -1 with err filled. */
int ts_openai_chat_text(ts_chat *chat, ts_ctx *ctx, pthread_mutex_t *mu,
                        json_t *body, char **text, size_t *len,
                        ts_prompt_error *err);

/* s made valid UTF-8 in place: every byte that does not start a complete,
 * well-formed sequence (a stray byte, a sequence cut short by truncation,
 * an overlong form, a surrogate) becomes '?'. An error message that
 * quotes a request (its URL, its model name) stays a JSON string. */
void ts_utf8_sanitize(char *s);

#endif
