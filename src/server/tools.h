/* tools.h — OpenAI tool calling over a model's chat template: a chat
 * body's `tools` and `tool_choice` checked, the grammar a `required` or
 * named choice imposes on the output, and the parser that turns the
 * model's tool-call syntax (ts_chat_tool_syntax: Hermes/Qwen's
 * <tool_call>{...}</tool_call>, Llama 3's JSON) back into OpenAI's
 * `tool_calls`, whole or streamed as `delta.tool_calls`. The template
 * itself renders `tools` and `role: tool` messages (prompt.c). */
#ifndef TS_SERVER_TOOLS_H
#define TS_SERVER_TOOLS_H

#include "tessera_grammar.h"
#include "tessera_tokenizer.h"

#include "core/strbuf.h"
#include "prompt.h"

#include <jansson.h>

typedef struct ts_tool_request ts_tool_request;

/* the most tools one request may carry */
#define TS_TOOLS_MAX 1024

/* A chat body's tools and tool_choice ("auto", "none", "required", or
 * {"type":"function","function":{"name":...}}), checked before the chat
 * template renders them. 0 with *out NULL when there are no tools (or
 * tool_choice is "none"); -1 with err filled (400 naming "tools" or
 * "tool_choice") when they are malformed, more than TS_TOOLS_MAX, share a
 * name, name an unknown function, or the model has no known tool-call
 * syntax. The syntax parsed is the template's own when it reads `tools`,
 * else Hermes' (what prompt.c's fallback tells the model). */
int ts_tools_parse(json_t *body, const ts_chat *chat, ts_tool_request **out,
                   ts_prompt_error *err);
void ts_tools_free(ts_tool_request *t);

/* The grammar a `required` or named tool_choice imposes (a tool call in
 * the model's syntax whose arguments follow the function's JSON schema);
 * false for "auto" (free text or a call). spec's strings belong to t. */
bool ts_tools_grammar(const ts_tool_request *t, ts_grammar_spec *spec);

/* The model's output, as it is decoded, split into plain content and
 * tool calls. */
typedef struct ts_tool_parser ts_tool_parser;
ts_tool_parser *ts_tool_parser_new(const ts_tool_request *t);
void ts_tool_parser_free(ts_tool_parser *p);
/* Feeds the next decoded text (final: nothing follows). Appends to
 * content the text that is plain content (held back while it may still
 * start a call), and sets *deltas (NULL when none) to a new JSON array of
 * OpenAI stream deltas: {"index", "id", "type": "function", "function":
 * {"name", "arguments"}} on a call's first delta, then {"index",
 * "function": {"arguments": more}}. */
void ts_tool_parser_feed(ts_tool_parser *p, const char *text, size_t n,
                         bool final, ts_sbuf *content, json_t **deltas);
/* After the final feed: message.tool_calls (a new array; NULL when the
 * output held no call). A call whose arguments are not valid JSON stays
 * content. */
json_t *ts_tool_parser_calls(const ts_tool_parser *p);

#endif
