/* prompt.c — an OpenAI request body to token ids (prompt.h): a chat
 * body's messages (text parts, tool calls, role "tool") and tools made
 * into the variables a chat template reads, as transformers and vLLM
 * pass them. */
#include "prompt.h"

#include "core/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(ts_prompt_error *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    e->status = 400;
    e->param = param;
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* A message's content as the template reads it: a string; null or
 * absent as "" (vLLM's choice: Qwen3's template tests `in content`); an
 * array of {"type": "text", "text"} parts joined. NULL with e filled. */
static json_t *content_text(json_t *content, size_t i, ts_prompt_error *e) {
    if (!content || json_is_null(content))
        return json_string("");
    if (json_is_string(content))
        return json_incref(content);
    if (!json_is_array(content)) {
        bad(e, "messages",
            "messages[%zu].content must be a string or an array of text "
            "parts",
            i);
        return NULL;
    }
    ts_sbuf t = {0};
    size_t k;
    json_t *part;
    json_array_foreach(content, k, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!type || strcmp(type, "text") || !json_is_string(text)) {
            free(t.p);
            bad(e, "messages",
                "messages[%zu].content[%zu]: only {\"type\": \"text\", "
                "\"text\": ...} parts are supported, not %s%.40s%s",
                i, k, type ? "\"" : "", type ? type : "this part",
                type ? "\"" : "");
            return NULL;
        }
        ts_sb_add(&t, json_string_value(text), json_string_length(text));
    }
    json_t *r = t.oom ? NULL : json_stringn(t.p ? t.p : "", t.n);
    free(t.p);
    if (!r)
        bad(e, "messages", "out of memory");
    return r;
}

/* An assistant message's tool_calls checked, each function's arguments
 * given as a JSON string turned into the object (as vLLM does: Qwen3's
 * and Llama 3.1's templates print them with tojson). 0, or -1 with e. */
static int normalize_tool_calls(json_t *calls, size_t i, ts_prompt_error *e) {
    if (!json_is_array(calls))
        return bad(e, "messages", "messages[%zu].tool_calls must be an array",
                   i);
    size_t k;
    json_t *call;
    json_array_foreach(calls, k, call) {
        json_t *fn = json_object_get(call, "function");
        json_t *args = json_object_get(fn, "arguments");
        if (!json_is_string(json_object_get(fn, "name")))
            return bad(e, "messages",
                       "messages[%zu].tool_calls[%zu] needs a function "
                       "with a string name",
                       i, k);
        if (!args) {
            if (json_object_set_new(fn, "arguments", json_object()))
                return bad(e, "messages", "out of memory");
            continue;
        }
        if (json_is_object(args))
            continue;
        json_error_t je;
        json_t *obj = json_is_string(args)
                          ? json_loadb(json_string_value(args),
                                       json_string_length(args), 0, &je)
                          : NULL;
        if (!json_is_object(obj)) {
            json_decref(obj);
            return bad(e, "messages",
                       "messages[%zu].tool_calls[%zu].function.arguments "
                       "must be a JSON object (or a string holding one)",
                       i, k);
        }
        if (json_object_set_new(fn, "arguments", obj))
            return bad(e, "messages", "out of memory");
    }
    return 0;
}

/* the messages as the template reads them; NULL with e filled */
static json_t *normalized_messages(json_t *msgs, ts_prompt_error *e) {
    if (!json_is_array(msgs) || !json_array_size(msgs)) {
        bad(e, "messages", "must be a non-empty array");
        return NULL;
    }
    json_t *norm = json_array(), *m;
    size_t i;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role) {
            json_decref(norm);
            bad(e, "messages", "each message needs a string role");
            return NULL;
        }
        json_t *nm = json_deep_copy(m);
        json_t *text = content_text(json_object_get(m, "content"), i, e);
        json_t *calls = json_object_get(nm, "tool_calls");
        bool ok = text && !json_object_set_new(nm, "content", text);
        if (ok && calls && !json_is_null(calls))
            ok = !strcmp(role, "assistant")
                     ? normalize_tool_calls(calls, i, e) == 0
                     : bad(e, "messages",
                           "messages[%zu]: only assistant messages have "
                           "tool_calls",
                           i) == 0;
        if (!ok || json_array_append_new(norm, nm)) {
            if (ok)
                bad(e, "messages", "out of memory");
            json_decref(nm), json_decref(norm);
            return NULL;
        }
    }
    return norm;
}

/* ---- tools for a template that does not read them -----------------------
 * The tools described in a system message in Hermes' format (Qwen2.5's
 * words), assistant tool calls written as <tool_call> blocks and role
 * "tool" messages as a user turn of <tool_response> blocks, so any chat
 * template (ChatML, plain) can carry a tool conversation; the reply is
 * then parsed as "hermes" (tools.c). */

static void hermes_tools_text(ts_sbuf *b, json_t *tools) {
    ts_sb_puts(b, "# Tools\n\nYou may call one or more functions to assist "
                  "with the user query.\n\nYou are provided with function "
                  "signatures within <tools></tools> XML tags:\n<tools>");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char *j = json_dumps(t, 0); /* Python's json.dumps separators */
        ts_sb_puts(b, "\n");
        if (j)
            ts_sb_puts(b, j);
        else
            b->oom = true;
        free(j);
    }
    ts_sb_puts(b, "\n</tools>\n\nFor each function call, return a json "
                  "object with function name and arguments within "
                  "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                  "<function-name>, \"arguments\": <args-json-object>}\n"
                  "</tool_call>");
}

static void hermes_calls_text(ts_sbuf *b, json_t *calls) {
    size_t k;
    json_t *call;
    json_array_foreach(calls, k, call) {
        json_t *fn = json_object_get(call, "function");
        char *args = json_dumps(json_object_get(fn, "arguments"), 0);
        if (b->n || k)
            ts_sb_puts(b, "\n");
        ts_sb_printf(b,
                     "<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n"
                     "</tool_call>",
                     json_string_value(json_object_get(fn, "name")),
                     args ? args : "{}");
        free(args);
    }
}

static json_t *text_message(const char *role, ts_sbuf *b) {
    if (b->oom)
        return NULL;
    return json_pack("{s:s,s:s%}", "role", role, "content", b->p ? b->p : "",
                     b->n);
}

/* norm rewritten for a template without `tools`; NULL when out of memory */
static json_t *hermes_fallback(json_t *norm, json_t *tools) {
    json_t *out = json_array(), *m;
    size_t i, n = json_array_size(norm);
    bool ok = out != NULL;
    for (i = 0; ok && i < n; i++) {
        m = json_array_get(norm, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        json_t *calls = json_object_get(m, "tool_calls");
        ts_sbuf b = {0};
        json_t *nm = NULL;
        if (i == 0 && json_array_size(tools)) {
            bool sys = !strcmp(role, "system");
            if (sys) { /* lengths, not %s: content may hold a NUL */
                ts_sb_add(&b, content,
                          json_string_length(json_object_get(m, "content")));
                ts_sb_puts(&b, "\n\n");
            }
            hermes_tools_text(&b, tools);
            ok = (nm = text_message("system", &b)) &&
                 !json_array_append_new(out, nm);
            free(b.p), b = (ts_sbuf){0};
            if (sys)
                continue;
        }
        if (!strcmp(role, "tool")) {
            for (; i < n && !strcmp(json_string_value(json_object_get(
                                        json_array_get(norm, i), "role")),
                                    "tool");
                 i++) {
                json_t *c = json_object_get(json_array_get(norm, i), "content");
                ts_sb_puts(&b,
                           b.n ? "\n<tool_response>\n" : "<tool_response>\n");
                ts_sb_add(&b, json_string_value(c), json_string_length(c));
                ts_sb_puts(&b, "\n</tool_response>");
            }
            i--; /* the loop's own step moves past the last one */
            nm = text_message("user", &b);
        } else if (!strcmp(role, "assistant") && json_array_size(calls)) {
            ts_sb_add(&b, content,
                      json_string_length(json_object_get(m, "content")));
            hermes_calls_text(&b, calls);
            nm = text_message("assistant", &b);
        } else {
            nm = json_incref(m);
        }
        free(b.p);
        ok = ok && nm && !json_array_append_new(out, nm);
    }
    if (!ok)
        json_decref(out);
    return ok ? out : NULL;
}

/* The template's variables beyond messages: tools (null when none, as
 * apply_chat_template passes it). NULL with e filled. */
static char *template_vars(json_t *tools, ts_prompt_error *e) {
    json_t *v = json_pack("{s:O}", "tools", tools ? tools : json_null());
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!s)
        bad(e, "messages", "out of memory");
    return s;
}

int ts_openai_chat_text(ts_chat *chat, ts_ctx *ctx, pthread_mutex_t *mu,
                        json_t *body, char **text, size_t *len,
                        ts_prompt_error *err) {
    *text = NULL, *len = 0;
    json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return bad(err, "tools", "must be an array of tools");
    if (!json_array_size(tools))
        tools = NULL;
    json_t *norm = normalized_messages(json_object_get(body, "messages"), err);
    if (!norm)
        return -1;
    if (!chat) {
        json_decref(norm);
        return bad(err, "messages",
                   "this model has no chat template; use "
                   "/v1/completions, or start the server with "
                   "--chat-template (%s, or a file)",
                   ts_chat_builtin_names());
    }
    if (!ts_chat_takes_tools(chat)) {
        json_t *fb = hermes_fallback(norm, tools);
        json_decref(norm);
        if (!fb)
            return bad(err, "messages", "out of memory");
        norm = fb, tools = NULL;
    }
    char *mj = json_dumps(norm, JSON_COMPACT);
    json_decref(norm);
    char *vars = template_vars(tools, err);
    if (!mj || !vars) {
        free(mj), free(vars);
        return mj ? -1 : bad(err, "messages", "out of memory");
    }
    if (mu)
        pthread_mutex_lock(mu);
    ts_status s = ts_chat_apply(chat, mj, true, vars, text, len);
    if (s != TS_OK) {
        bad(err, "messages", "the chat template: %s", ts_errmsg(ctx));
        ts_clear_error(ctx);
    }
    if (mu)
        pthread_mutex_unlock(mu);
    free(mj), free(vars);
    return s == TS_OK ? 0 : -1;
}

/* token ids given as the prompt: 1 (done), 0 (not ids), -1 (bad) */
static int prompt_ids(json_t *p, int32_t **ids, size_t *n, ts_prompt_error *e) {
    if (!json_is_array(p) || !json_array_size(p) ||
        !json_is_integer(json_array_get(p, 0)))
        return 0;
    size_t k;
    json_t *v;
    *ids = malloc(sizeof(int32_t) * json_array_size(p));
    if (!*ids)
        return bad(e, "prompt", "out of memory");
    json_array_foreach(p, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > INT32_MAX) {
            free(*ids), *ids = NULL;
            return bad(e, "prompt", "token ids must be integers >= 0");
        }
        (*ids)[k] = (int32_t)json_integer_value(v);
    }
    *n = json_array_size(p);
    return 1;
}

int ts_openai_prompt(ts_tokenizer *tok, ts_chat *chat, ts_ctx *ctx,
                     pthread_mutex_t *mu, json_t *body, bool chat_req,
                     int32_t **ids, size_t *n, ts_prompt_error *err) {
    *ids = NULL, *n = 0;
    char *text = NULL;
    size_t len = 0;
    ts_status s = TS_OK;
    if (chat_req) {
        if (ts_openai_chat_text(chat, ctx, mu, body, &text, &len, err))
            return -1;
    } else {
        json_t *p = json_object_get(body, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1 &&
            json_is_string(json_array_get(p, 0)))
            p = json_array_get(p, 0);
        int got = prompt_ids(p, ids, n, err);
        if (got)
            return got > 0 ? 0 : -1;
        if (!json_is_string(p))
            return bad(err, "prompt",
                       "must be a string or an array of token ids");
        len = json_string_length(p);
        text = malloc(len + 1);
        if (!text)
            return bad(err, "prompt", "out of memory");
        memcpy(text, json_string_value(p), len + 1);
    }
    if (mu)
        pthread_mutex_lock(mu);
    s = ts_tokenizer_encode_text(tok, text, len, !chat_req, ids, n);
    if (s != TS_OK) {
        bad(err, chat_req ? "messages" : "prompt", "%s", ts_errmsg(ctx));
        ts_clear_error(ctx);
    }
    if (mu)
        pthread_mutex_unlock(mu);
    free(text);
    return s == TS_OK ? 0 : -1;
}

void ts_utf8_sanitize(char *s) {
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        unsigned c = p[0];
        int n = c < 0x80             ? 1
                : (c & 0xE0) == 0xC0 ? 2
                : (c & 0xF0) == 0xE0 ? 3
                : (c & 0xF8) == 0xF0 ? 4
                                     : 0;
        bool ok = n > 0;
        for (int k = 1; ok && k < n; k++)
            ok = (p[k] & 0xC0) == 0x80; /* stops at the NUL too */
        if (ok && n > 1) {
            unsigned cp = c & (0x7F >> n);
            for (int k = 1; k < n; k++)
                cp = cp << 6 | (p[k] & 0x3F);
            static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
            ok = cp >= min[n] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}
