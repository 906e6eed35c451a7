/* structured.h — a request's structured-output fields (OpenAI's
 * response_format, vLLM's guided_json / guided_regex / guided_grammar /
 * guided_choice and structured_outputs) read into one grammar spec,
 * compiled through the server's grammar cache, and a matcher per choice
 * wrapped as the engine's ts_constraint. */
#ifndef TS_SERVER_STRUCTURED_H
#define TS_SERVER_STRUCTURED_H

#include "tessera_engine.h"
#include "tessera_grammar.h"

#include "prompt.h"

#include <jansson.h>

/* the spec a body asks for; its strings are owned here */
typedef struct {
    ts_grammar_spec spec;
    const char *field; /* the request field it came from, for errors */
    char *src;         /* owned */
} so_request;

/* The vocabulary of tok and a grammar cache; nonzero with err filled. */
int so_init(ts_tokenizer *tok, char *err, size_t cap);
void so_fini(void);

/* 1 with *out filled when body asks for structured output, 0 when it does
 * not, -1 with err filled (400 naming the field) when a field is
 * malformed or more than one is given. */
int so_parse(json_t *body, so_request *out, ts_prompt_error *err);
void so_request_free(so_request *q);

/* spec compiled (or found in the cache; thread-safe); *g to unref. -1 with
 * err naming field and carrying the grammar's message. */
int so_compile(const ts_grammar_spec *spec, const char *field, ts_grammar **g,
               ts_prompt_error *err);

/* A new matcher over g as an engine constraint (the engine frees it);
 * false when out of memory. */
bool so_constraint(ts_grammar *g, ts_constraint *out);

/* A regular expression matching exactly one of the strings (guided_choice);
 * malloc'd. */
char *so_choice_regex(json_t *choices);

#endif
