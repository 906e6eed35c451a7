/* chat.c — a model folder's chat setup: the chat template and special
 * tokens of tokenizer_config.json (or chat_template.jinja beside it, as
 * newer transformers save it), and apply_chat_template's variables
 * (messages, add_generation_prompt, the special tokens, extra variables);
 * or a template given by file or built-in name (chat_builtin.c) instead of
 * the folder's, and what the template says about tool calling. Rendering
 * itself is jinja.c's. */
#include "chat_builtin.h"
#include "jinja.h"
#include "tessera_gguf.h"

#include "core/core.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct ts_chat {
    ts_ctx *ctx;
    ts_template *tpl;
    json_t *special; /* bos_token, eos_token, pad_token, unk_token */
    bool takes_tools;
    const char *tool_syntax; /* static: "hermes", "llama3" or "" */
};

/* "tok" or {"content": "tok", ...} -> the string, or NULL */
static const char *token_string(json_t *v) {
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_string_value(v);
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0)
            break;
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

/* tokenizer_config.json of dir, or NULL with the error set; with
 * optional, a missing file is an empty object (a template given by name
 * or file needs only the special tokens, if any) */
static json_t *load_config(ts_ctx *ctx, const char *dir, bool optional,
                           char *path, size_t path_size) {
    snprintf(path, path_size, "%s/tokenizer_config.json", dir);
    json_error_t je;
    json_t *cfg;
    if (ts_file_is_gguf(dir)) { /* made from its metadata */
        snprintf(path, path_size, "%s", dir);
        char *text = NULL;
        if (ts_gguf_hf_file_text(ctx, dir, "tokenizer_config.json", &text))
            return NULL;
        cfg = json_loads(text, JSON_DECODE_INT_AS_REAL, &je);
        free(text);
    } else /* Llama's model_max_length (1e30) is too big for an integer */
        cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg && optional && access(path, F_OK) != 0)
        return json_object();
    if (!cfg) {
        ts_set_error(ctx, TS_ERR_IO, "%s: %s", path, je.text);
        return NULL;
    }
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        ts_set_error(ctx, TS_ERR_INVALID_ARG, "%s: expected a JSON object",
                     path);
        return NULL;
    }
    return cfg;
}

/* The folder's own template: chat_template (a string, or
 * [{"name", "template"}] of which "default"), else chat_template.jinja.
 * *owned is set when the source was read from a file (the caller frees
 * it); NULL with the error set when there is none. */
static const char *folder_template(ts_ctx *ctx, const char *dir, json_t *cfg,
                                   const char *path, size_t *len,
                                   char **owned) {
    *owned = NULL;
    json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_array(ct)) {
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            if (nm && !strcmp(nm, "default"))
                ct = json_object_get(e, "template");
        }
        if (json_is_array(ct)) {
            ts_set_error(ctx, TS_ERR_INVALID_ARG,
                         "%s: chat_template is a list without a "
                         "\"default\" entry",
                         path);
            return NULL;
        }
    }
    if (json_is_string(ct)) {
        *len = json_string_length(ct);
        return json_string_value(ct);
    }
    if (ct && !json_is_null(ct)) {
        ts_set_error(ctx, TS_ERR_INVALID_ARG,
                     "%s: chat_template must be a string or a list of "
                     "named templates",
                     path);
        return NULL;
    }
    char jpath[4096];
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
    *owned = read_file(jpath, len);
    if (!*owned)
        ts_set_error(ctx, TS_ERR_INVALID_ARG,
                     "%s has no chat_template (and there is no %s): this "
                     "model has no chat format; give one with "
                     "--chat-template FILE or one of %s",
                     path, jpath, ts_chat_builtin_names());
    return *owned;
}

/* Whether src names `tools` as a whole identifier (not tools_in_...) */
static bool reads_tools(const char *src) {
    for (const char *p = src; (p = strstr(p, "tools")) != NULL; p += 5) {
        bool start = p == src || !(isalnum((unsigned char)p[-1]) ||
                                   p[-1] == '_' || p[-1] == '.');
        bool end = !(isalnum((unsigned char)p[5]) || p[5] == '_');
        if (start && end)
            return true;
    }
    return false;
}

static const char *tool_syntax_of(const char *src) {
    if (strstr(src, "<tool_call>"))
        return "hermes";
    if (strstr(src, "<|python_tag|>") || strstr(src, "\"parameters\""))
        return "llama3";
    return "";
}

/* A ts_chat over template source src (len bytes) and cfg's special
 * tokens; eos (NULL: cfg's) overrides eos_token. what names the template
 * in errors. */
static ts_status chat_new(ts_ctx *ctx, const char *what, const char *src,
                          size_t len, json_t *cfg, const char *eos,
                          ts_chat **out) {
    ts_template *tpl = NULL;
    ts_status s = ts_template_parse(ctx, src, len, &tpl);
    if (s != TS_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", ts_errmsg(ctx));
        return ts_set_error(ctx, s, "%s: %s", what, msg);
    }
    ts_chat *c = calloc(1, sizeof *c);
    if (!c) {
        ts_template_free(tpl);
        return ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    }
    c->ctx = ctx;
    c->tpl = tpl;
    /* the source is NUL-terminated (a jansson string or read_file's) */
    c->takes_tools = reads_tools(src);
    c->tool_syntax = tool_syntax_of(src);
    c->special = json_object();
    bool ok = c->special != NULL;
    static const char *names[] = {"bos_token", "eos_token", "pad_token",
                                  "unk_token"};
    for (int i = 0; ok && i < 4; i++) {
        const char *t = token_string(json_object_get(cfg, names[i]));
        if (i == 1 && eos)
            t = eos;
        if (t) /* set_new takes the value, also when it fails */
            ok = json_object_set_new(c->special, names[i], json_string(t)) == 0;
    }
    if (!ok) { /* never a chat setup without its bos/eos tokens */
        ts_chat_free(c);
        return ts_set_error(ctx, TS_ERR_OOM,
                            "%s: out of memory while reading the special "
                            "tokens",
                            what);
    }
    *out = c;
    return TS_OK;
}

ts_status ts_chat_load(ts_ctx *ctx, const char *dir, ts_chat **out) {
    return ts_chat_load_with(ctx, dir, NULL, out);
}

ts_status ts_chat_load_with(ts_ctx *ctx, const char *dir, const char *template,
                            ts_chat **out) {
    if (!ctx || !dir || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_chat_load: NULL argument");
    *out = NULL;
    char path[4096];
    json_t *cfg = load_config(ctx, dir, template != NULL, path, sizeof path);
    if (!cfg)
        return ts_ctx_status(ctx);
    const ts_chat_builtin *b = ts_chat_builtin_find(template);
    const char *src = NULL, *what = template ? template : dir;
    size_t len = 0;
    char *owned = NULL;
    if (b) {
        src = b->source;
        len = strlen(src);
    } else if (template) {
        struct stat st;
        errno = EISDIR; /* a folder opens but reads as nothing */
        if (stat(template, &st) == 0 && S_ISREG(st.st_mode))
            owned = read_file(template, &len);
        src = owned;
        if (!src)
            ts_set_error(ctx, TS_ERR_INVALID_ARG,
                         "chat template \"%s\" is neither a readable file "
                         "(%s) nor a built-in template (%s)",
                         template, strerror(errno), ts_chat_builtin_names());
    } else {
        src = folder_template(ctx, dir, cfg, path, &len, &owned);
    }
    ts_status s =
        src ? chat_new(ctx, what, src, len, cfg, b ? b->eos : NULL, out)
            : ts_ctx_status(ctx);
    free(owned);
    json_decref(cfg);
    return s;
}

void ts_chat_free(ts_chat *c) {
    if (!c)
        return;
    ts_template_free(c->tpl);
    json_decref(c->special);
    free(c);
}

const char *ts_chat_bos_token(const ts_chat *c) {
    const char *s = json_string_value(json_object_get(c->special, "bos_token"));
    return s ? s : "";
}
const char *ts_chat_eos_token(const ts_chat *c) {
    const char *s = json_string_value(json_object_get(c->special, "eos_token"));
    return s ? s : "";
}

ts_status ts_chat_apply(ts_chat *c, const char *messages_json,
                        bool add_generation_prompt, const char *extra_vars_json,
                        char **out, size_t *len) {
    if (!c || !messages_json || !out)
        return ts_set_error(c ? c->ctx : NULL, TS_ERR_INVALID_ARG,
                            "ts_chat_apply: NULL argument");
    json_error_t je;
    json_t *msgs = json_loads(messages_json, 0, &je);
    if (!json_is_array(msgs)) {
        json_decref(msgs);
        return ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                            "chat messages must be a JSON array of "
                            "{\"role\", \"content\"} objects%s%s",
                            msgs ? "" : ": ", msgs ? "" : je.text);
    }
    /* every insert checked: a dropped add_generation_prompt would be a
     * silently wrong prompt */
    json_t *vars = json_object(); /* json_copy drops members it cannot add */
    bool ok = vars != NULL;
    const char *key;
    json_t *val;
    json_object_foreach(c->special, key, val) {
        if (ok)
            ok = json_object_set(vars, key, val) == 0;
    }
    if (ok) /* set_new takes msgs, also when it fails */
        ok = json_object_set_new(vars, "messages", msgs) == 0;
    else
        json_decref(msgs);
    ok = ok && json_object_set_new(vars, "add_generation_prompt",
                                   json_boolean(add_generation_prompt)) == 0;
    if (ok && extra_vars_json) {
        json_t *extra = json_loads(extra_vars_json, 0, &je);
        if (!json_is_object(extra)) {
            json_decref(extra);
            json_decref(vars);
            return ts_set_error(c->ctx, TS_ERR_INVALID_ARG,
                                "chat template variables must be a JSON "
                                "object");
        }
        ok = json_object_update(vars, extra) == 0;
        json_decref(extra);
    }
    if (!ok) {
        json_decref(vars);
        return ts_set_error(c->ctx, TS_ERR_OOM,
                            "chat template: out of memory while setting the "
                            "variables");
    }
    ts_status s = ts_template_render_json(c->ctx, c->tpl, vars, out, len);
    json_decref(vars);
    return s;
}

bool ts_chat_takes_tools(const ts_chat *c) {
    return c && c->takes_tools;
}

const char *ts_chat_tool_syntax(const ts_chat *c) {
    return c ? c->tool_syntax : "";
}
