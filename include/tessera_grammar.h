/* tessera_grammar.h — structured outputs: a grammar over bytes (from a JSON
 * schema, a regular expression or an EBNF grammar) compiled against one
 * vocabulary, and a matcher per sequence that gives the mask of the tokens
 * allowed next (xgrammar's approach: the masks of context-independent
 * tokens are computed once per grammar state and kept; only the tokens
 * whose acceptance depends on the stack are checked per step). The engine
 * sees a matcher only through ts_constraint (tessera_engine.h). */
#ifndef TESSERA_GRAMMAR_H
#define TESSERA_GRAMMAR_H

#include "tessera.h"
#include "tessera_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every token's bytes (as the tokenizer decodes it alone, byte-level
 * pieces undone), built once per tokenizer; special tokens have none and
 * are never allowed by a grammar. Immutable: shared across threads. */
typedef struct ts_vocab ts_vocab;
ts_status ts_vocab_new(ts_ctx *ctx, ts_tokenizer *tok, ts_vocab **out);
void ts_vocab_free(ts_vocab *v);
int32_t ts_vocab_size(const ts_vocab *v);

typedef enum {
    TS_GRAMMAR_JSON_OBJECT = 1, /* any JSON object (response_format
                                   json_object) */
    TS_GRAMMAR_JSON_SCHEMA,     /* src: a JSON Schema document */
    TS_GRAMMAR_REGEX,           /* src: a regular expression, whole-match */
    TS_GRAMMAR_EBNF             /* src: GBNF-style rules, `root ::= ...` */
} ts_grammar_kind;

/* What a compiled grammar's text must look like. prefix and suffix
 * (NULL: none) are literal bytes around the structured part, as a tool
 * call's `<tool_call>\n` ... `\n</tool_call>` (xgrammar's structural
 * tags). */
typedef struct {
    ts_grammar_kind kind;
    const char *src; /* NUL-terminated; unused for JSON_OBJECT */
    const char *prefix, *suffix;
} ts_grammar_spec;

/* A compiled grammar: immutable once built, shared by any number of
 * matchers on any threads, reference-counted. A schema keyword outside the
 * supported set (docs/STRUCTURED_OUTPUTS.md), a bad regex or grammar is
 * TS_ERR_INVALID_ARG whose message names the keyword or the position
 * ("json_schema: unsupported keyword \"patternProperties\" at
 * /properties/a"). */
typedef struct ts_grammar ts_grammar;
ts_status ts_grammar_compile(ts_ctx *ctx, const ts_vocab *v,
                             const ts_grammar_spec *spec, ts_grammar **out);
ts_grammar *ts_grammar_ref(ts_grammar *g);
void ts_grammar_unref(ts_grammar *g);

/* Compiled grammars kept by a hash of their spec (kind, src, prefix,
 * suffix), least recently used dropped past capacity; thread-safe. *hit
 * (may be NULL) says whether it was there. The caller unrefs *out. */
typedef struct ts_grammar_cache ts_grammar_cache;
ts_status ts_grammar_cache_new(ts_ctx *ctx, const ts_vocab *v, int capacity,
                               ts_grammar_cache **out);
void ts_grammar_cache_free(ts_grammar_cache *c);
ts_status ts_grammar_cache_get(ts_grammar_cache *c, ts_ctx *ctx,
                               const ts_grammar_spec *spec, ts_grammar **out,
                               bool *hit);

/* One sequence's place in a grammar. */
typedef struct ts_matcher ts_matcher;
ts_status ts_matcher_new(ts_ctx *ctx, ts_grammar *g, ts_matcher **out);
void ts_matcher_free(ts_matcher *m);
/* bits[(V + 31) / 32]: bit t set when token t may come next (V: the
 * vocabulary's size). End-of-sequence tokens are the caller's: allowed
 * when ts_matcher_can_end. */
void ts_matcher_mask(ts_matcher *m, uint32_t *bits);
/* Advances by token t; false (nothing changes) when t is not allowed. */
bool ts_matcher_accept(ts_matcher *m, int32_t t);
/* The text so far is a complete match (the sequence may end here). */
bool ts_matcher_can_end(const ts_matcher *m);
/* Complete, and no byte can follow: the sequence must end. */
bool ts_matcher_done(const ts_matcher *m);

#ifdef __cplusplus
}
#endif
#endif
