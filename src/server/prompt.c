/* prompt.c — an OpenAI request body to token ids (prompt.h). */
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

/* the messages with content parts joined as text; NULL with e filled */
static json_t *normalized_messages(json_t *msgs, ts_prompt_error *e) {
    if (!json_is_array(msgs) || !json_array_size(msgs)) {
        bad(e, "messages", "must be a non-empty array");
        return NULL;
    }
    json_t *norm = json_array(), *m;
    size_t i;
    json_array_foreach(msgs, i, m) {
        json_t *role = json_object_get(m, "role"),
               *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role)) {
            json_decref(norm);
            bad(e, "messages", "each message needs a string role");
            return NULL;
        }
        json_t *nm = json_deep_copy(m);
        if (json_is_array(content)) {
            ts_sbuf t = {0};
            size_t k;
            json_t *part;
            json_array_foreach(content, k, part) {
                const char *s =
                    json_string_value(json_object_get(part, "text"));
                if (s)
                    ts_sb_add(&t, s, strlen(s));
            }
            json_object_set_new(nm, "content", json_string(t.p ? t.p : ""));
            free(t.p);
        } else if (content && !json_is_string(content) &&
                   !json_is_null(content)) {
            json_decref(nm), json_decref(norm);
            bad(e, "messages",
                "content must be a string or an array of text parts");
            return NULL;
        }
        json_array_append_new(norm, nm);
    }
    return norm;
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
        json_t *norm =
            normalized_messages(json_object_get(body, "messages"), err);
        if (!norm)
            return -1;
        if (!chat) {
            json_decref(norm);
            return bad(err, "messages",
                       "this model has no chat template; use "
                       "/v1/completions");
        }
        char *mj = json_dumps(norm, JSON_COMPACT);
        json_decref(norm);
        if (mu)
            pthread_mutex_lock(mu);
        s = ts_chat_apply(chat, mj ? mj : "[]", true, NULL, &text, &len);
        if (s != TS_OK) {
            bad(err, "messages", "the chat template: %s", ts_errmsg(ctx));
            ts_clear_error(ctx);
        }
        if (mu)
            pthread_mutex_unlock(mu);
        free(mj);
        if (s != TS_OK)
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
