/* tokenize.c — vLLM's /tokenize, /detokenize and /version: a prompt or
 * chat messages to the model's token ids (exactly what a completion or
 * chat request would feed the engine), ids back to text, and the
 * server's version. Parsing and answers only; the tokenizer and chat
 * template are srv's (tok_mu). */
#define _GNU_SOURCE
#include "server_internal.h"

#include "prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TS_VERSION
#define TS_VERSION "0.23.0"
#endif

enum MHD_Result srv_version(struct MHD_Connection *c) {
    return srv_send_json(c, 200, json_pack("{s:s}", "version", TS_VERSION));
}

static enum MHD_Result bad(struct MHD_Connection *c, const char *param,
                           const char *why) {
    return srv_send_error(c, 400, "invalid_request_error", param,
                          "invalid_value", "%s: %s", param, why);
}

/* the body as a JSON object, or an error sent (*b NULL) */
static enum MHD_Result body_object(struct MHD_Connection *c, hreq *r,
                                   json_t **b) {
    json_error_t je;
    *b = json_loadb(r->body.p ? r->body.p : "", r->body.n,
                    JSON_REJECT_DUPLICATES, &je);
    if (json_is_object(*b))
        return MHD_YES;
    bool parsed = *b != NULL;
    json_decref(*b);
    *b = NULL;
    return srv_send_error(c, 400, "invalid_request_error", NULL, NULL,
                          parsed ? "the body must be a JSON object"
                                 : "the body is not valid JSON: %s",
                          je.text);
}

/* a boolean field (absent: dflt); false when it is of another type */
static bool bool_field(json_t *b, const char *k, bool dflt, bool *out) {
    json_t *v = json_object_get(b, k);
    *out = v && !json_is_null(v) ? json_is_true(v) : dflt;
    return !v || json_is_null(v) || json_is_boolean(v);
}

/* "model", when given, must name this server's model */
static bool model_ok(struct MHD_Connection *c, json_t *b,
                     enum MHD_Result *ret) {
    json_t *m = json_object_get(b, "model");
    if (!m || json_is_null(m))
        return true;
    if (!json_is_string(m))
        *ret = bad(c, "model", "must be a string");
    else if (strcmp(json_string_value(m), srv.model))
        *ret = srv_send_error(c, 404, "invalid_request_error", "model",
                              "model_not_found",
                              "The model `%s` does not exist (this server "
                              "serves `%s`)",
                              json_string_value(m), srv.model);
    else
        return true;
    return false;
}

/* messages rendered with the flags given (the chat endpoint's defaults
 * go through ts_openai_prompt, as a chat request does); 0 or -1 with
 * pe filled */
static int messages_ids(json_t *b, bool gen_prompt, bool special, int32_t **ids,
                        size_t *n, ts_prompt_error *pe) {
    if (gen_prompt && !special)
        return ts_openai_prompt(srv.tok, srv.chat, srv.ctx, &srv.tok_mu, b,
                                true, ids, n, pe);
    memset(pe, 0, sizeof *pe);
    pe->status = 400, pe->param = "messages";
    json_t *m = json_object_get(b, "messages");
    if (!json_is_array(m) || !json_array_size(m)) {
        snprintf(pe->msg, sizeof pe->msg,
                 "messages: must be a non-empty "
                 "array");
        return -1;
    }
    if (!srv.chat) {
        snprintf(pe->msg, sizeof pe->msg,
                 "messages: this model has no chat template");
        return -1;
    }
    char *mj = json_dumps(m, JSON_COMPACT), *text = NULL;
    size_t len = 0;
    pthread_mutex_lock(&srv.tok_mu);
    ts_status s =
        mj ? ts_chat_apply(srv.chat, mj, gen_prompt, NULL, &text, &len)
           : TS_ERR_OOM;
    if (s == TS_OK)
        s = ts_tokenizer_encode_text(srv.tok, text, len, special, ids, n);
    if (s != TS_OK) {
        snprintf(pe->msg, sizeof pe->msg, "messages: %s",
                 mj ? ts_errmsg(srv.ctx) : "out of memory");
        ts_clear_error(srv.ctx);
    }
    pthread_mutex_unlock(&srv.tok_mu);
    free(mj), free(text);
    return s == TS_OK ? 0 : -1;
}

/* bytes as a JSON string, each byte that starts no whole UTF-8
 * character as U+FFFD (as Hugging Face's decode shows a cut character) */
static json_t *lossy_string(const char *t, size_t len) {
    json_t *j = json_stringn(t ? t : "", len);
    if (j)
        return j;
    ts_sbuf s = {0};
    for (size_t i = 0; i < len;) {
        unsigned char ch = (unsigned char)t[i];
        size_t n = ch < 0x80             ? 1
                   : (ch & 0xE0) == 0xC0 ? 2
                   : (ch & 0xF0) == 0xE0 ? 3
                   : (ch & 0xF8) == 0xF0 ? 4
                                         : 0;
        json_t *one = n && i + n <= len ? json_stringn(t + i, n) : NULL;
        if (one)
            ts_sb_add(&s, t + i, n), i += n;
        else
            ts_sb_add(&s, "\xEF\xBF\xBD", 3), i++;
        json_decref(one);
    }
    j = json_stringn(s.p ? s.p : "", s.n);
    free(s.p);
    return j ? j : json_string("");
}

/* one token's text */
static json_t *token_str(int32_t id) {
    char *t = NULL;
    size_t len = 0;
    pthread_mutex_lock(&srv.tok_mu);
    if (ts_tokenizer_decode(srv.tok, &id, 1, false, &t, &len) != TS_OK)
        ts_clear_error(srv.ctx), len = 0;
    pthread_mutex_unlock(&srv.tok_mu);
    json_t *j = lossy_string(t, len);
    free(t);
    return j;
}

enum MHD_Result srv_tokenize(struct MHD_Connection *c, hreq *r) {
    json_t *b;
    enum MHD_Result ret = body_object(c, r, &b);
    if (!b)
        return ret;
    bool chat = json_object_get(b, "messages") != NULL, gen_prompt, special,
         strs;
    int32_t *ids = NULL;
    size_t n = 0;
    ts_prompt_error pe = {0};
    int rc = 0;
    if (!model_ok(c, b, &ret))
        goto out;
    if (chat && json_object_get(b, "prompt")) {
        ret = bad(c, "prompt", "give prompt or messages, not both");
        goto out;
    }
    const char *flag =
        !bool_field(b, "add_generation_prompt", true, &gen_prompt)
            ? "add_generation_prompt"
        : !bool_field(b, "add_special_tokens", !chat, &special)
            ? "add_special_tokens"
        : !bool_field(b, "return_token_strs", false, &strs)
            ? "return_token_strs"
            : NULL;
    if (flag) {
        ret = bad(c, flag, "must be a boolean");
        goto out;
    }
    if (chat)
        rc = messages_ids(b, gen_prompt, special, &ids, &n, &pe);
    else if (!json_is_string(json_object_get(b, "prompt"))) {
        ret = bad(c, "prompt", "must be a string (or give messages)");
        goto out;
    } else {
        json_t *p = json_object_get(b, "prompt");
        pthread_mutex_lock(&srv.tok_mu);
        if (ts_tokenizer_encode_text(srv.tok, json_string_value(p),
                                     json_string_length(p), special, &ids,
                                     &n) != TS_OK) {
            pe.status = 400, pe.param = "prompt";
            snprintf(pe.msg, sizeof pe.msg, "prompt: %s", ts_errmsg(srv.ctx));
            ts_clear_error(srv.ctx);
            rc = -1;
        }
        pthread_mutex_unlock(&srv.tok_mu);
    }
    if (rc) {
        ret = srv_send_error(c, pe.status ? pe.status : 400,
                             "invalid_request_error", pe.param, NULL, "%s",
                             pe.msg);
        goto out;
    }
    json_t *tokens = json_array(), *ts = strs ? json_array() : NULL;
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(tokens, json_integer(ids[i]));
        if (ts)
            json_array_append_new(ts, token_str(ids[i]));
    }
    json_t *resp =
        json_pack("{s:I, s:I, s:o}", "count", (json_int_t)n, "max_model_len",
                  (json_int_t)srv.max_positions, "tokens", tokens);
    if (ts)
        json_object_set_new(resp, "token_strs", ts);
    ret = srv_send_json(c, 200, resp);
out:
    free(ids);
    json_decref(b);
    return ret;
}

enum MHD_Result srv_detokenize(struct MHD_Connection *c, hreq *r) {
    json_t *b;
    enum MHD_Result ret = body_object(c, r, &b);
    if (!b)
        return ret;
    json_t *t = json_object_get(b, "tokens");
    int32_t *ids = NULL;
    char *text = NULL;
    size_t len = 0, n = json_array_size(t);
    int64_t vocab = ts_tokenizer_vocab_size(srv.tok);
    if (!model_ok(c, b, &ret))
        goto out;
    if (!json_is_array(t)) {
        ret = bad(c, "tokens", "must be an array of token ids");
        goto out;
    }
    ids = malloc(sizeof *ids * (n ? n : 1));
    for (size_t i = 0; ids && i < n; i++) {
        json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= vocab) {
            ret = srv_send_error(c, 400, "invalid_request_error", "tokens",
                                 "invalid_value",
                                 "tokens: [%zu] is not a token id (0..%lld)", i,
                                 (long long)vocab - 1);
            goto out;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    if (!ids) {
        ret =
            srv_send_error(c, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    pthread_mutex_lock(&srv.tok_mu);
    ts_status s = ts_tokenizer_decode(srv.tok, ids, n, false, &text, &len);
    char msg[512] = "";
    if (s != TS_OK) {
        snprintf(msg, sizeof msg, "%s", ts_errmsg(srv.ctx));
        ts_clear_error(srv.ctx);
    }
    pthread_mutex_unlock(&srv.tok_mu);
    if (s != TS_OK) {
        ret = srv_send_error(c, 400, "invalid_request_error", "tokens", NULL,
                             "tokens: %s", msg);
        goto out;
    }
    ret = srv_send_json(c, 200,
                        json_pack("{s:o}", "prompt", lossy_string(text, len)));
out:
    free(ids), free(text);
    json_decref(b);
    return ret;
}
