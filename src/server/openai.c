/* openai.c — the OpenAI protocol over the engine: a completion or chat
 * request's parameters checked, its prompt tokenized (prompt.c), its
 * choices added to the engine, each generated token delivered to its
 * choice (decoded, stop strings cut) on the engine thread, and the
 * response written whole or as Server-Sent Events. The HTTP plumbing,
 * locks and state are server.c's (server_internal.h). */
#define _GNU_SOURCE
#include "server_internal.h"

#include "tessera_tokenizer.h"

#include "prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

bool srv_deliver(choice *c, const ts_engine_output *o) {
    hreq *r = c->req;
    double t = srv_now();
    if (c->n_tokens == 0)
        srv_observe(srv.ttft_hist, TTFT_B, N_TTFT, &srv.ttft_sum,
                    t - r->t_start);
    else
        srv_observe(srv.itl_hist, ITL_B, N_ITL, &srv.itl_sum, t - c->t_last);
    c->t_last = t;
    c->n_tokens++;
    c->cached = o->cached_tokens;
    c->prompt_tokens = o->prompt_tokens;
    if (r->logprobs && o->finish != TS_FINISH_STOP) {
        if (c->n_lp == c->cap_lp) {
            int cap = c->cap_lp ? c->cap_lp * 2 : 16;
            ts_engine_output *p = realloc(c->lp, sizeof *p * (size_t)cap);
            if (p)
                c->lp = p, c->cap_lp = cap;
        }
        if (c->n_lp < c->cap_lp)
            c->lp[c->n_lp++] = *o;
    }
    srv.generated_tokens++;
    bool abort_it = false;
    if (o->finish != TS_FINISH_STOP) { /* a stop token's text is not shown */
        char piece[256];
        size_t pl = 0;
        pthread_mutex_lock(&srv.tok_mu);
        if (ts_tokenizer_decode_step(srv.tok, &c->ds, o->token, piece,
                                     sizeof piece, &pl) != TS_OK) {
            ts_clear_error(srv.ctx);
            pl = 0;
        }
        pthread_mutex_unlock(&srv.tok_mu);
        size_t from = c->text.n > r->max_stop ? c->text.n - r->max_stop : 0;
        ts_sb_add(&c->text, piece, pl);
        for (int k = 0; k < r->n_stops && c->text.n; k++) {
            char *hit = memmem(c->text.p + from, c->text.n - from, r->stops[k],
                               strlen(r->stops[k]));
            if (hit) {
                c->text.n = (size_t)(hit - c->text.p);
                c->text.p[c->text.n] = 0;
                c->finished = true;
                c->finish_reason = "stop";
                abort_it = o->finish == TS_FINISH_NONE;
                break;
            }
        }
    }
    if (!c->finished && o->finish != TS_FINISH_NONE) {
        c->finished = true;
        c->finish_reason = o->finish == TS_FINISH_LENGTH ? "length"
                           : o->finish == TS_FINISH_STOP ? "stop"
                                                         : "abort";
    }
    /* hold back what could still become a stop string */
    size_t hold = r->max_stop ? r->max_stop - 1 : 0;
    c->safe = c->finished ? c->text.n : c->text.n > hold ? c->text.n - hold : 0;
    if (c->safe < c->sent)
        c->safe = c->sent;
    if (c->finished)
        srv_active_remove(c);
    return abort_it;
}

/* ---- request parsing ---- */

typedef struct {
    ts_sampling s;
    int max_tokens, n;
    bool ignore_eos;
    int32_t stop_ids[TS_ENGINE_MAX_STOP_IDS];
    int n_stop_ids;
    bool seeded;
} gen_params;

/* a number field in [lo, hi] (absent: untouched); false with *err set */
static bool num_field(json_t *o, const char *k, double lo, double hi,
                      double *out, const char **err) {
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_number(v) || json_number_value(v) < lo ||
        json_number_value(v) > hi) {
        *err = k;
        return false;
    }
    *out = json_number_value(v);
    return true;
}

static enum MHD_Result bad_param(struct MHD_Connection *c, const char *p,
                                 const char *why) {
    return srv_send_error(c, 400, "invalid_request_error", p, "invalid_value",
                          "%s: %s", p, why);
}

static bool int_field(json_t *o, const char *k, long lo, long hi, int *out,
                      const char **err) {
    json_t *v = json_object_get(o, k);
    double d = *out;
    if (v && !json_is_null(v) && !json_is_integer(v)) {
        *err = k;
        return false;
    }
    if (!num_field(o, k, (double)lo, (double)hi, &d, err))
        return false;
    if (v && !json_is_null(v))
        *out = (int)d;
    return true;
}

/* the model's input for a completion or a chat request, or an error sent */
static enum MHD_Result prompt_of(struct MHD_Connection *c, hreq *r,
                                 json_t *body, int32_t **ids, size_t *n,
                                 bool *sent) {
    ts_prompt_error pe;
    *sent = false;
    if (!ts_openai_prompt(srv.tok, srv.chat, srv.ctx, &srv.tok_mu, body,
                          r->kind == REQ_CHAT, ids, n, &pe))
        return MHD_YES;
    *sent = true;
    return srv_send_error(c, pe.status, "invalid_request_error", pe.param, NULL,
                          "%s", pe.msg);
}

static enum MHD_Result parse_params(struct MHD_Connection *c, hreq *r,
                                    json_t *b, gen_params *g, bool *sent) {
    *sent = true;
    const char *err = NULL;
    g->s = ts_sampling_default();
    g->s.temperature = 1.0; /* OpenAI's default */
    g->max_tokens = r->kind == REQ_CHAT ? -1 : 16;
    g->n = 1;
    double top_k = 0, seed = 0;
    if (!num_field(b, "temperature", 0, 2, &g->s.temperature, &err) ||
        !num_field(b, "top_p", 1e-9, 1, &g->s.top_p, &err) ||
        !num_field(b, "min_p", 0, 1, &g->s.min_p, &err) ||
        !num_field(b, "top_k", -1, 1e9, &top_k, &err) ||
        !num_field(b, "presence_penalty", -2, 2, &g->s.presence_penalty,
                   &err) ||
        !num_field(b, "frequency_penalty", -2, 2, &g->s.frequency_penalty,
                   &err) ||
        !num_field(b, "repetition_penalty", 1e-3, 100, &g->s.repetition_penalty,
                   &err) ||
        !int_field(b, "max_tokens", 1, 1 << 30, &g->max_tokens, &err) ||
        !int_field(b, "max_completion_tokens", 1, 1 << 30, &g->max_tokens,
                   &err) ||
        !int_field(b, "n", 1, MAX_CHOICES, &g->n, &err))
        return bad_param(c, err, "out of range or of the wrong type");
    g->s.top_k = top_k < 0 ? 0 : (int64_t)top_k;
    json_t *sd = json_object_get(b, "seed");
    if (sd && !json_is_null(sd)) {
        if (!json_is_integer(sd))
            return bad_param(c, "seed", "must be an integer");
        seed = (double)json_integer_value(sd);
        g->s.seed = (uint64_t)json_integer_value(sd);
        g->seeded = true;
    }
    (void)seed;
    json_t *v = json_object_get(b, "stream");
    if (v && !json_is_boolean(v) && !json_is_null(v))
        return bad_param(c, "stream", "must be a boolean");
    r->stream = json_is_true(v);
    json_t *so = json_object_get(b, "stream_options");
    r->include_usage = json_is_true(json_object_get(so, "include_usage"));
    v = json_object_get(b, "ignore_eos");
    g->ignore_eos = json_is_true(v);
    v = json_object_get(b, "logprobs");
    if (r->kind == REQ_CHAT) { /* logprobs: bool, top_logprobs: 0..20 */
        if (v && !json_is_boolean(v) && !json_is_null(v))
            return bad_param(c, "logprobs", "must be a boolean");
        int top = 0;
        if (!int_field(b, "top_logprobs", 0, TS_ENGINE_MAX_TOP, &top, &err))
            return bad_param(c, err, "must be an integer in 0..20");
        if (top && !json_is_true(v))
            return bad_param(c, "top_logprobs", "needs logprobs: true");
        r->logprobs = json_is_true(v) ? 1 + top : 0;
    } else { /* logprobs: how many of the most likely, 0..5 */
        int top = -1;
        if (!int_field(b, "logprobs", 0, 5, &top, &err))
            return bad_param(c, err, "must be an integer in 0..5");
        r->logprobs = top >= 0 ? 1 + top : 0;
    }
    v = json_object_get(b, "stop");
    if (json_is_string(v)) {
        if (json_string_length(v))
            r->stops[r->n_stops++] = strdup(json_string_value(v));
    } else if (json_is_array(v)) {
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s) {
            if (!json_is_string(s) || r->n_stops == MAX_STOPS)
                return bad_param(c, "stop",
                                 "must be a string or up to 8 strings");
            if (json_string_length(s))
                r->stops[r->n_stops++] = strdup(json_string_value(s));
        }
    } else if (v && !json_is_null(v))
        return bad_param(c, "stop", "must be a string or an array");
    for (int k = 0; k < r->n_stops; k++)
        if (strlen(r->stops[k]) > r->max_stop)
            r->max_stop = strlen(r->stops[k]);
    v = json_object_get(b, "stop_token_ids");
    if (json_is_array(v)) {
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s) {
            if (!json_is_integer(s) || g->n_stop_ids == TS_ENGINE_MAX_STOP_IDS)
                return bad_param(c, "stop_token_ids",
                                 "must be up to 16 integers");
            g->stop_ids[g->n_stop_ids++] = (int32_t)json_integer_value(s);
        }
    }
    json_t *model = json_object_get(b, "model");
    if (model && !json_is_string(model))
        return bad_param(c, "model", "must be a string");
    if (json_is_string(model) && strcmp(json_string_value(model), srv.model))
        return srv_send_error(
            c, 404, "invalid_request_error", "model", "model_not_found",
            "The model `%s` does not exist (this server serves "
            "`%s`)",
            json_string_value(model), srv.model);
    *sent = false;
    return MHD_YES;
}

/* ---- response bodies ---- */

static json_t *usage_json(const hreq *r) {
    int64_t completion = 0;
    for (int i = 0; i < r->n; i++)
        completion += r->ch[i].n_tokens;
    int64_t prompt = r->ch[0].prompt_tokens, cached = r->ch[0].cached;
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens",
                     (json_int_t)prompt, "completion_tokens",
                     (json_int_t)completion, "total_tokens",
                     (json_int_t)(prompt + completion), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)cached);
}

/* one token's text (lossy where it holds part of a character) and bytes */
static json_t *token_json(int32_t id, json_t **bytes) {
    char *text = NULL;
    size_t len = 0;
    pthread_mutex_lock(&srv.tok_mu);
    if (ts_tokenizer_decode(srv.tok, &id, 1, false, &text, &len) != TS_OK)
        ts_clear_error(srv.ctx), len = 0;
    pthread_mutex_unlock(&srv.tok_mu);
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < len; i++)
            json_array_append_new(*bytes, json_integer((unsigned char)text[i]));
    }
    json_t *s = json_stringn(text ? text : "", len);
    if (!s) { /* not whole UTF-8: U+FFFD, as a lossy decode shows it */
        ts_sbuf b = {0};
        for (size_t i = 0; i < len; i++) {
            unsigned char ch = (unsigned char)text[i];
            if (ch < 0x80)
                ts_sb_add(&b, text + i, 1);
            else if ((ch & 0xC0) != 0x80)
                ts_sb_add(&b, "\xEF\xBF\xBD", 3);
        }
        s = json_string(b.p ? b.p : "");
        free(b.p);
    }
    free(text);
    return s;
}

/* OpenAI's logprobs object for tokens [from, to) of c (out_mu held) */
static json_t *logprobs_json(const hreq *r, choice *c, int from, int to,
                             size_t offset) {
    if (r->kind == REQ_CHAT) {
        json_t *content = json_array();
        for (int i = from; i < to; i++) {
            const ts_engine_output *o = &c->lp[i];
            json_t *bytes, *tok = token_json(o->token, &bytes);
            json_t *top = json_array();
            for (int k = 0; k < o->n_top; k++) {
                json_t *tb, *tt = token_json(o->top_ids[k], &tb);
                json_array_append_new(
                    top, json_pack("{s:o, s:f, s:o}", "token", tt, "logprob",
                                   (double)o->top_logprobs[k], "bytes", tb));
            }
            json_array_append_new(
                content, json_pack("{s:o, s:f, s:o, s:o}", "token", tok,
                                   "logprob", (double)o->logprob, "bytes",
                                   bytes, "top_logprobs", top));
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array();
    for (int i = from; i < to; i++) {
        const ts_engine_output *o = &c->lp[i];
        json_t *tok = token_json(o->token, NULL);
        json_array_append_new(offs, json_integer((json_int_t)offset));
        offset += json_string_length(tok);
        json_array_append_new(tokens, tok);
        json_array_append_new(lps, json_real(o->logprob));
        json_t *top = json_object();
        for (int k = 0; k < o->n_top; k++) {
            json_t *tt = token_json(o->top_ids[k], NULL);
            json_object_set_new(top, json_string_value(tt),
                                json_real(o->top_logprobs[k]));
            json_decref(tt);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs",
                     lps, "top_logprobs", tops, "text_offset", offs);
}

static json_t *chunk_head(const hreq *r) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", r->id, "object",
                     r->kind == REQ_CHAT ? "chat.completion.chunk"
                                         : "text_completion",
                     "created", (json_int_t)r->created, "model", srv.model);
}

static void sse(ts_sbuf *b, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    ts_sb_add(b, "data: ", 6);
    if (s)
        ts_sb_add(b, s, strlen(s));
    ts_sb_add(b, "\n\n", 2);
    free(s);
}

/* the SSE chunks ready now (out_mu held) */
static void stream_ready(hreq *r, ts_sbuf *b) {
    bool all_final = true;
    for (int i = 0; i < r->n; i++) {
        choice *c = &r->ch[i];
        if (r->kind == REQ_CHAT && !c->role_sent) {
            json_t *j = chunk_head(r);
            json_object_set_new(j, "choices",
                                json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]",
                                          "index", i, "delta", "role",
                                          "assistant", "content", "",
                                          "logprobs", "finish_reason"));
            sse(b, j);
            c->role_sent = true;
        }
        if (c->safe > c->sent) {
            json_t *piece =
                json_stringn(c->text.p + c->sent, c->safe - c->sent);
            if (!piece) { /* not yet whole UTF-8 (cannot happen): wait */
                all_final = false;
                continue;
            }
            json_t *j = chunk_head(r), *ch;
            if (r->kind == REQ_CHAT)
                ch = json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", i, "delta",
                               "content", piece, "logprobs", "finish_reason");
            else
                ch = json_pack("{s:i, s:o, s:n, s:n}", "index", i, "text",
                               piece, "logprobs", "finish_reason");
            if (r->logprobs && c->lp_sent < c->n_lp) {
                json_object_set_new(
                    ch, "logprobs",
                    logprobs_json(r, c, c->lp_sent, c->n_lp, c->sent));
                c->lp_sent = c->n_lp;
            }
            json_object_set_new(j, "choices", json_pack("[o]", ch));
            sse(b, j);
            c->sent = c->safe;
        }
        if (c->finished && c->sent == c->text.n && !c->final_sent) {
            json_t *j = chunk_head(r), *ch;
            if (r->kind == REQ_CHAT)
                ch = json_pack("{s:i, s:{}, s:n, s:s}", "index", i, "delta",
                               "logprobs", "finish_reason", c->finish_reason);
            else
                ch = json_pack("{s:i, s:s, s:n, s:s}", "index", i, "text", "",
                               "logprobs", "finish_reason", c->finish_reason);
            json_object_set_new(j, "choices", json_pack("[o]", ch));
            sse(b, j);
            c->final_sent = true;
        }
        all_final &= c->final_sent;
    }
    if (all_final && r->include_usage && !r->usage_sent) {
        json_t *j = chunk_head(r);
        json_object_set_new(j, "choices", json_array());
        json_object_set_new(j, "usage", usage_json(r));
        sse(b, j);
        r->usage_sent = true;
    }
    if (all_final && !r->done_sent) {
        ts_sb_add(b, "data: [DONE]\n\n", 14);
        r->done_sent = true;
    }
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    hreq *r = cls;
    if (r->pend_off == r->pend.n) {
        r->pend.n = r->pend_off = 0;
        pthread_mutex_lock(&srv.out_mu);
        while (!r->pend.n) {
            if (r->done_sent) {
                pthread_mutex_unlock(&srv.out_mu);
                return MHD_CONTENT_READER_END_OF_STREAM;
            }
            stream_ready(r, &r->pend);
            if (r->pend.n)
                break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += (long)KEEPALIVE_MS % 1000 * 1000000;
            ts.tv_sec += KEEPALIVE_MS / 1000 + ts.tv_nsec / 1000000000;
            ts.tv_nsec %= 1000000000;
            if (pthread_cond_timedwait(&srv.out_cv, &srv.out_mu, &ts)) {
                /* a comment: writing it finds a client that went away */
                ts_sb_add(&r->pend, ": keep-alive\n\n", 14);
            }
        }
        pthread_mutex_unlock(&srv.out_mu);
    }
    size_t n = r->pend.n - r->pend_off < max ? r->pend.n - r->pend_off : max;
    memcpy(buf, r->pend.p + r->pend_off, n);
    r->pend_off += n;
    return (ssize_t)n;
}

static enum MHD_Result respond_whole(struct MHD_Connection *c, hreq *r) {
    pthread_mutex_lock(&srv.out_mu);
    bool done = false;
    while (!done) {
        done = true;
        for (int i = 0; i < r->n; i++)
            done &= r->ch[i].finished;
        if (!done)
            pthread_cond_wait(&srv.out_cv, &srv.out_mu);
    }
    json_t *kvx = NULL;
    if (r->kv_prefill) {
        pthread_mutex_unlock(&srv.out_mu);
        kvx = srv_send_prefill(r);
        pthread_mutex_lock(&srv.out_mu);
    }
    json_t *choices = json_array();
    for (int i = 0; i < r->n; i++) {
        choice *ch = &r->ch[i];
        json_t *txt = json_stringn(ch->text.p ? ch->text.p : "", ch->text.n);
        if (!txt)
            txt = json_string("");
        json_t *lp =
            r->logprobs ? logprobs_json(r, ch, 0, ch->n_lp, 0) : json_null();
        if (r->kind == REQ_CHAT)
            json_array_append_new(
                choices,
                json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", i,
                          "message", "role", "assistant", "content", txt,
                          "logprobs", lp, "finish_reason", ch->finish_reason));
        else
            json_array_append_new(
                choices,
                json_pack("{s:i, s:o, s:o, s:s}", "index", i, "text", txt,
                          "logprobs", lp, "finish_reason", ch->finish_reason));
    }
    json_t *resp =
        json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object",
                  r->kind == REQ_CHAT ? "chat.completion" : "text_completion",
                  "created", (json_int_t)r->created, "model", srv.model,
                  "choices", choices, "usage", usage_json(r));
    if (kvx)
        json_object_set_new(resp, "kv_transfer_params", kvx);
    pthread_mutex_unlock(&srv.out_mu);
    return srv_send_json(c, 200, resp);
}

/* the request parameter an engine error is about */
static const char *param_of(const hreq *r, const char *msg) {
    if (strstr(msg, "max_tokens"))
        return "max_tokens";
    if (strstr(msg, "top_logprobs"))
        return "top_logprobs";
    if (strstr(msg, "prompt"))
        return r->kind == REQ_CHAT ? "messages" : "prompt";
    return NULL;
}

enum MHD_Result srv_generate(struct MHD_Connection *c, hreq *r) {
    json_error_t je;
    json_t *b = json_loadb(r->body.p ? r->body.p : "", r->body.n,
                           JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(b)) {
        bool parsed = b != NULL;
        json_decref(b);
        return srv_send_error(c, 400, "invalid_request_error", NULL, NULL,
                              parsed ? "the body must be a JSON object"
                                     : "the body is not valid JSON: %s",
                              je.text);
    }
    json_t *kvp = json_object_get(b, "kv_transfer_params");
    if (kvp && !json_is_null(kvp)) {
        const char *t = json_string_value(json_object_get(kvp, "target"));
        /* refused before anything is resolved or connected to, with the
         * same answer whether or not something listens there */
        if (!srv.kv_peers) {
            json_decref(b);
            return bad_param(c, "kv_transfer_params",
                             "this server sends KV blocks to no one (it was "
                             "started without --kv-peers)");
        }
        if (!t || strlen(t) >= sizeof r->kv_target ||
            !ts_kv_peers_allow(srv.kv_peers, t)) {
            json_decref(b);
            return bad_param(c, "kv_transfer_params",
                             "target must be one of this server's --kv-peers "
                             "(a decode server's HOST:PORT, as listed)");
        }
        snprintf(r->kv_target, sizeof r->kv_target, "%s", t);
        r->kv_prefill = true;
    }
    gen_params g = {0};
    bool sent;
    enum MHD_Result ret = parse_params(c, r, b, &g, &sent);
    if (!sent && r->kv_prefill) { /* the prompt's KV, one greedy token */
        g.n = 1, g.max_tokens = 1, g.ignore_eos = true;
        g.s = ts_sampling_default();
        r->stream = false, r->logprobs = 0;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (!sent)
        ret = prompt_of(c, r, b, &ids, &n, &sent);
    json_decref(b);
    if (sent) {
        free(ids);
        return ret;
    }
    if (n == 0) {
        free(ids);
        return bad_param(c, r->kind == REQ_CHAT ? "messages" : "prompt",
                         "the prompt is empty");
    }
    if ((int64_t)n >= srv.max_positions) {
        free(ids);
        return srv_send_error(c, 400, "invalid_request_error",
                              r->kind == REQ_CHAT ? "messages" : "prompt",
                              "context_length_exceeded",
                              "This model's maximum context length is %lld "
                              "tokens; the prompt has %zu",
                              (long long)srv.max_positions, n);
    }
    if (g.max_tokens < 0) /* chat without max_tokens: the rest, bounded */
        g.max_tokens = (int)(srv.max_positions - (int64_t)n < 4096
                                 ? srv.max_positions - (int64_t)n
                                 : 4096);
    r->n = g.n;
    r->created = (long)time(NULL);
    static uint64_t counter;
    snprintf(
        r->id, sizeof r->id, "%s-%lx%x%llx",
        r->kind == REQ_CHAT ? "chatcmpl" : "cmpl", (long)r->created,
        (unsigned)getpid(), /* unique across the servers behind a router */
        (unsigned long long)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    r->t_start = srv_now();
    /* the choices into the engine, all or none */
    srv_eng_lock();
    ts_status st = TS_OK;
    char msg[512] = "";
    int added = 0;
    for (int i = 0; i < g.n && st == TS_OK; i++, added++) {
        ts_request q = {.prompt = ids,
                        .n_prompt = n,
                        .max_tokens = g.max_tokens,
                        .sampling = g.s,
                        .n_stop_ids = g.n_stop_ids,
                        .ignore_eos = g.ignore_eos,
                        .logprobs = r->logprobs};
        memcpy(q.stop_ids, g.stop_ids, sizeof q.stop_ids);
        q.sampling.seed = g.seeded ? g.s.seed + (uint64_t)i
                                   : (uint64_t)srv_now() * 1000003u +
                                         (uint64_t)i * 7919u + counter;
        r->ch[i].req = r;
        r->ch[i].index = i;
        st = ts_engine_add(srv.eng, &q, &r->ch[i].eid);
        if (st != TS_OK) {
            snprintf(msg, sizeof msg, "%s", ts_errmsg(srv.ctx));
            ts_clear_error(srv.ctx);
        }
    }
    if (st != TS_OK)
        for (int i = 0; i < added - 1; i++)
            ts_engine_abort(srv.eng, r->ch[i].eid);
    if (st == TS_OK) {
        pthread_mutex_lock(&srv.out_mu);
        for (int i = 0; i < g.n; i++) {
            if (srv.n_active == srv.cap_active) {
                int cap = srv.cap_active ? srv.cap_active * 2 : 64;
                choice **p = realloc(srv.active, sizeof *p * (size_t)cap);
                if (p)
                    srv.active = p, srv.cap_active = cap;
            }
            if (srv.n_active < srv.cap_active)
                srv.active[srv.n_active++] = &r->ch[i];
        }
        srv.prompt_tokens += n;
        pthread_mutex_unlock(&srv.out_mu);
        pthread_cond_signal(&srv.eng_cv);
    }
    pthread_mutex_unlock(&srv.eng_mu);
    if (st == TS_OK && r->kv_prefill)
        r->kv_ids = ids, r->kv_n = n; /* sent once computed */
    else
        free(ids);
    if (st != TS_OK)
        return srv_send_error(c, 400, "invalid_request_error", param_of(r, msg),
                              NULL, "%s", msg);
    if (!r->stream)
        return respond_whole(c, r);
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16384, stream_reader, r, NULL);
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    srv_count_status(200);
    return ret;
}

int srv_openai_init(char *err, size_t cap) {
    (void)err, (void)cap;
    return 0;
}

void srv_openai_fini(void) {}
