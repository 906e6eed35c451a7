/* chat.c — a model folder's chat setup: the chat template and special
 * tokens of tokenizer_config.json (or chat_template.jinja beside it, as
 * newer transformers save it), and apply_chat_template's variables
 * (messages, add_generation_prompt, the special tokens, extra variables).
 * Rendering itself is jinja.c's. */
#include "jinja.h"

#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ts_chat {
    ts_ctx *ctx;
    ts_template *tpl;
    json_t *special; /* bos_token, eos_token, pad_token, unk_token */
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

ts_status ts_chat_load(ts_ctx *ctx, const char *dir, ts_chat **out) {
    if (!ctx || !dir || !out)
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "ts_chat_load: NULL argument");
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_error_t je;
    /* Llama's model_max_length (1e30) is too big for an integer */
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg)
        return ts_set_error(ctx, TS_ERR_IO, "%s: %s", path, je.text);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "%s: expected a JSON object", path);
    }
    /* chat_template: a string, or [{"name", "template"}] of which "default" */
    json_t *ct = json_object_get(cfg, "chat_template");
    const char *src = NULL;
    size_t len = 0;
    char *file_src = NULL;
    if (json_is_array(ct)) {
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            if (nm && !strcmp(nm, "default"))
                ct = json_object_get(e, "template");
        }
        if (json_is_array(ct)) {
            json_decref(cfg);
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "%s: chat_template is a list without a "
                                "\"default\" entry",
                                path);
        }
    }
    if (json_is_string(ct)) {
        src = json_string_value(ct);
        len = json_string_length(ct);
    } else if (ct && !json_is_null(ct)) {
        json_decref(cfg);
        return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                            "%s: chat_template must be a string or a list of "
                            "named templates",
                            path);
    } else {
        char jpath[4096];
        snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
        file_src = read_file(jpath, &len);
        src = file_src;
        if (!src) {
            json_decref(cfg);
            return ts_set_error(ctx, TS_ERR_INVALID_ARG,
                                "%s has no chat_template (and there is no "
                                "%s): this model has no chat format",
                                path, jpath);
        }
    }
    ts_template *tpl = NULL;
    ts_status s = ts_template_parse(ctx, src, len, &tpl);
    free(file_src);
    if (s != TS_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", ts_errmsg(ctx));
        json_decref(cfg);
        return ts_set_error(ctx, s, "%s: %s", dir, msg);
    }
    ts_chat *c = calloc(1, sizeof *c);
    if (!c) {
        ts_template_free(tpl);
        json_decref(cfg);
        return ts_set_error(ctx, TS_ERR_OOM, "out of memory");
    }
    c->ctx = ctx;
    c->tpl = tpl;
    c->special = json_object();
    bool ok = c->special != NULL;
    static const char *names[] = {"bos_token", "eos_token", "pad_token",
                                  "unk_token"};
    for (int i = 0; ok && i < 4; i++) {
        const char *t = token_string(json_object_get(cfg, names[i]));
        if (t) /* set_new takes the value, also when it fails */
            ok = json_object_set_new(c->special, names[i], json_string(t)) == 0;
    }
    json_decref(cfg);
    if (!ok) { /* never a chat setup without its bos/eos tokens */
        ts_chat_free(c);
        return ts_set_error(ctx, TS_ERR_OOM,
                            "%s: out of memory while reading the special "
                            "tokens",
                            dir);
    }
    *out = c;
    return TS_OK;
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
