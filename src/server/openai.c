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
#include "structured.h"
#include "tools.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* the first n bytes of c->raw through the tool parser (final: nothing
 * follows), and taken from raw; the parser's content goes to c->text */
static void feed_tools(choice *c, size_t n, bool final) {
    json_t *deltas = NULL;
    ts_tool_parser_feed(c->tp, c->raw.p ? c->raw.p : "", n, final, &c->text,
                        &deltas);
    if (n) {
        memmove(c->raw.p, c->raw.p + n, c->raw.n - n);
        c->raw.n -= n;
        c->raw.p[c->raw.n] = 0;
    }
    if (deltas) {
        if (!c->tool_deltas)
            c->tool_deltas = json_array();
        json_array_extend(c->tool_deltas, deltas);
        json_decref(deltas);
    }
}

/* the end of a choice with tools: what raw holds (nothing past a stop),
 * the parser flushed, its calls taken; a call makes the finish reason
 * "tool_calls" (out_mu held) */
static void finish_tools(choice *c) {
    feed_tools(c, c->raw.n, true);
    json_t *calls = ts_tool_parser_calls(c->tp);
    if (calls && json_array_size(calls)) {
        c->tool_calls = calls;
        if (!strcmp(c->finish_reason, "stop"))
            c->finish_reason = "tool_calls";
    } else
        json_decref(calls);
}

/* t cut at the earliest stop string that starts at or after from (so
 * nothing after any stop stays); true when there was one */
static bool cut_at_stop(const hreq *r, ts_sbuf *t, size_t from) {
    char *first = NULL;
    for (int k = 0; k < r->n_stops && t->n > from; k++) {
        char *hit =
            memmem(t->p + from, t->n - from, r->stops[k], strlen(r->stops[k]));
        if (hit && (!first || hit < first))
            first = hit;
    }
    if (!first)
        return false;
    t->n = (size_t)(first - t->p);
    t->p[t->n] = 0;
    return true;
}

/* a decoded piece into c's text; true when a stop string ended it. With
 * tools, stops are cut from the model's own text (c->raw, not yet parsed)
 * before the parser sees it, as vLLM does: text after a stop reaches
 * neither the content nor a call, and a stop inside a call is one. The
 * parser gets what can no longer become part of a stop. */
static bool add_text(choice *c, const char *piece, size_t pl) {
    hreq *r = c->req;
    if (!c->tp) {
        size_t from = c->text.n > r->max_stop ? c->text.n - r->max_stop : 0;
        ts_sb_add(&c->text, piece, pl);
        return cut_at_stop(r, &c->text, from);
    }
    ts_sb_add(&c->raw, piece, pl); /* raw: at most max_stop - 1 + pl bytes */
    bool hit = cut_at_stop(r, &c->raw, 0);
    size_t hold = hit || !r->max_stop ? 0 : r->max_stop - 1;
    size_t n = c->raw.n > hold ? c->raw.n - hold : 0;
    /* never a character cut in two: its rest comes with the next piece */
    for (int k = 0; !hit && k < 3 && n > 0 && (c->raw.p[n] & 0xC0) == 0x80; k++)
        n--;
    if (!hit && n > 0)
        feed_tools(c, n, false);
    return hit;
}

/* the engine's output o for choice c (out_mu held); true when c must be
 * aborted in the engine (a stop string ended it) */
bool srv_deliver(choice *c, const ts_engine_output *o) {
    hreq *r = c->req;
    double t = srv_now();
    /* token -1: the engine's end of a completed constraint, no token */
    bool real = o->token >= 0;
    if (o->prompt_lp) { /* echo's prompt log-probabilities, ours now */
        if (!c->plp)
            c->plp = o->prompt_lp, c->n_plp = o->n_prompt_lp;
        else
            free(o->prompt_lp);
    }
    if (real) {
        if (c->n_tokens == 0)
            srv_observe(srv.ttft_hist, TTFT_B, N_TTFT, &srv.ttft_sum,
                        t - r->t_start);
        else
            srv_observe(srv.itl_hist, ITL_B, N_ITL, &srv.itl_sum,
                        t - c->t_last);
        c->t_last = t;
        c->n_tokens++;
        c->sum_lp += o->logprob;
        srv.generated_tokens++;
    }
    c->cached = o->cached_tokens;
    c->prompt_tokens = o->prompt_tokens;
    c->spec_proposed = o->spec_proposed, c->spec_accepted = o->spec_accepted;
    if (r->logprobs && real && o->finish != TS_FINISH_STOP) {
        if (c->n_lp == c->cap_lp) {
            int cap = c->cap_lp ? c->cap_lp * 2 : 16;
            ts_engine_output *p = realloc(c->lp, sizeof *p * (size_t)cap);
            if (p)
                c->lp = p, c->cap_lp = cap;
        }
        if (c->n_lp < c->cap_lp) {
            c->lp[c->n_lp] = *o;
            c->lp[c->n_lp].prompt_lp = NULL, c->lp[c->n_lp].embedding = NULL;
            c->n_lp++;
        }
    }
    bool abort_it = false;
    if (real && o->finish != TS_FINISH_STOP) { /* a stop token's text is
                                                  not shown */
        char piece[256];
        size_t pl = 0;
        pthread_mutex_lock(&srv.tok_mu);
        if (ts_tokenizer_decode_step(srv.tok, &c->ds, o->token, piece,
                                     sizeof piece, &pl) != TS_OK) {
            ts_clear_error(srv.ctx);
            pl = 0;
        }
        pthread_mutex_unlock(&srv.tok_mu);
        if (add_text(c, piece, pl)) {
            c->finished = true;
            c->finish_reason = "stop";
            abort_it = o->finish == TS_FINISH_NONE;
        }
    }
    if (!c->finished && o->finish != TS_FINISH_NONE) {
        c->finished = true;
        c->finish_reason = o->finish == TS_FINISH_LENGTH ? "length"
                           : o->finish == TS_FINISH_STOP ? "stop"
                                                         : "abort";
    }
    if (c->finished && c->tp)
        finish_tools(c);
    /* hold back what could still become a stop string (with tools, raw
     * holds it), and a character cut by that */
    size_t hold = c->tp || !r->max_stop ? 0 : r->max_stop - 1;
    c->safe = c->finished ? c->text.n : c->text.n > hold ? c->text.n - hold : 0;
    for (int k = 0; !c->finished && k < 3 && c->safe > c->sent &&
                    (c->text.p[c->safe] & 0xC0) == 0x80;
         k++)
        c->safe--;
    if (c->safe < c->sent)
        c->safe = c->sent;
    if (c->finished)
        srv_active_remove(c);
    return abort_it;
}

/* ---- request parsing ---- */

/* The fields each endpoint knows: OpenAI's and vLLM's that are honored,
 * and a few that are harmless to accept. Anything else is a 400 naming
 * it, never silently ignored. */
static const char *const COMMON_FIELDS[] = {"model",
                                            "max_tokens",
                                            "max_completion_tokens",
                                            "temperature",
                                            "top_p",
                                            "n",
                                            "stream",
                                            "stream_options",
                                            "logprobs",
                                            "stop",
                                            "presence_penalty",
                                            "frequency_penalty",
                                            "logit_bias",
                                            "seed",
                                            "user",
                                            "metadata",
                                            "store",
                                            "service_tier",
                                            "top_k",
                                            "min_p",
                                            "repetition_penalty",
                                            "ignore_eos",
                                            "stop_token_ids",
                                            "response_format",
                                            "guided_json",
                                            "guided_regex",
                                            "guided_grammar",
                                            "guided_choice",
                                            "structured_outputs",
                                            "kv_transfer_params",
                                            "priority",
                                            NULL};
static const char *const COMPLETION_FIELDS[] = {"prompt", "suffix", "echo",
                                                "best_of", NULL};
static const char *const CHAT_FIELDS[] = {
    "messages",    "top_logprobs",        "tools",
    "tool_choice", "parallel_tool_calls", NULL};

typedef struct {
    ts_sampling s;
    int max_tokens, n, best_of;
    int priority; /* vLLM's: lower runs first */
    bool ignore_eos;
    int32_t stop_ids[TS_ENGINE_MAX_STOP_IDS];
    int n_stop_ids;
    bool seeded;
    ts_logit_bias bias[TS_ENGINE_MAX_LOGIT_BIAS];
    int n_bias;
    const char *suffix; /* in the body; NULL: none */
} gen_params;

/* the fill-in-the-middle tokens (prefix, suffix, middle), -1: none */
static int32_t fim[3] = {-1, -1, -1};

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

static enum MHD_Result prompt_error(struct MHD_Connection *c,
                                    const ts_prompt_error *pe) {
    return srv_send_error(c, pe->status ? pe->status : 400,
                          "invalid_request_error", pe->param, NULL, "%s",
                          pe->msg);
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

static bool in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k))
            return true;
    return false;
}

/* every field known to the endpoint, and the accepted ones' values as we
 * can honor them; *sent when a 400 went out */
static enum MHD_Result check_fields(struct MHD_Connection *c, const hreq *r,
                                    json_t *b, bool *sent) {
    bool chat = r->kind == REQ_CHAT;
    const char *k;
    json_t *v;
    *sent = true;
    json_object_foreach(b, k, v) {
        if (!in_list(COMMON_FIELDS, k) &&
            !in_list(chat ? CHAT_FIELDS : COMPLETION_FIELDS, k))
            return srv_send_error(
                c, 400, "invalid_request_error", k, "unsupported_parameter",
                "unsupported field %s: /v1/%s does not implement it", k,
                chat ? "chat/completions" : "completions");
    }
    v = json_object_get(b, "store");
    if (json_is_true(v))
        return bad_param(c, "store", "this server stores no completions");
    if (v && !json_is_false(v) && !json_is_null(v))
        return bad_param(c, "store", "must be a boolean");
    v = json_object_get(b, "parallel_tool_calls");
    if (json_is_false(v))
        return bad_param(c, "parallel_tool_calls",
                         "false is not supported (a response may hold "
                         "several calls)");
    if (v && !json_is_true(v) && !json_is_null(v))
        return bad_param(c, "parallel_tool_calls", "must be a boolean");
    v = json_object_get(b, "user");
    if (v && !json_is_string(v) && !json_is_null(v))
        return bad_param(c, "user", "must be a string");
    v = json_object_get(b, "metadata");
    if (v && !json_is_object(v) && !json_is_null(v))
        return bad_param(c, "metadata", "must be an object");
    v = json_object_get(b, "service_tier");
    if (v && !json_is_string(v) && !json_is_null(v))
        return bad_param(c, "service_tier", "must be a string");
    *sent = false;
    return MHD_YES;
}

/* logit_bias: {"token id": -100..100} */
static enum MHD_Result parse_logit_bias(struct MHD_Connection *c, json_t *lb,
                                        gen_params *g, bool *sent) {
    *sent = true;
    if (!lb || json_is_null(lb)) {
        *sent = false;
        return MHD_YES;
    }
    if (!json_is_object(lb))
        return bad_param(c, "logit_bias",
                         "must be an object of token ids to biases");
    if (json_object_size(lb) > TS_ENGINE_MAX_LOGIT_BIAS)
        return bad_param(c, "logit_bias", "at most 300 tokens");
    int32_t V = ts_tokenizer_vocab_size(srv.tok);
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
        char *end;
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id >= V)
            return srv_send_error(c, 400, "invalid_request_error", "logit_bias",
                                  "invalid_value",
                                  "logit_bias: \"%s\" is not a token id "
                                  "(0..%d)",
                                  k, (int)V - 1);
        if (!json_is_number(v) || json_number_value(v) < -100 ||
            json_number_value(v) > 100)
            return srv_send_error(c, 400, "invalid_request_error", "logit_bias",
                                  "invalid_value",
                                  "logit_bias: the bias of token %ld must be "
                                  "a number in -100..100",
                                  id);
        g->bias[g->n_bias++] = (ts_logit_bias){
            .token = (int32_t)id, .bias = (float)json_number_value(v)};
    }
    *sent = false;
    return MHD_YES;
}

/* completions' echo, suffix and best_of */
static enum MHD_Result completion_params(struct MHD_Connection *c, hreq *r,
                                         json_t *b, gen_params *g, bool *sent) {
    const char *err = NULL;
    *sent = true;
    json_t *v = json_object_get(b, "echo");
    if (v && !json_is_boolean(v) && !json_is_null(v))
        return bad_param(c, "echo", "must be a boolean");
    r->echo = json_is_true(v);
    v = json_object_get(b, "suffix");
    if (v && !json_is_string(v) && !json_is_null(v))
        return bad_param(c, "suffix", "must be a string");
    if (json_is_string(v) && json_string_length(v)) {
        if (fim[0] < 0)
            return bad_param(c, "suffix",
                             "this model has no fill-in-the-middle tokens");
        g->suffix = json_string_value(v);
    }
    g->best_of = g->n;
    if (!int_field(b, "best_of", 1, MAX_CHOICES, &g->best_of, &err))
        return bad_param(c, err, "must be an integer in 1..128");
    if (g->best_of < g->n)
        return bad_param(c, "best_of", "must be at least n");
    if (g->best_of > g->n && r->stream)
        return bad_param(c, "best_of", "cannot be streamed unless it equals n");
    *sent = false;
    return MHD_YES;
}

static enum MHD_Result parse_params(struct MHD_Connection *c, hreq *r,
                                    json_t *b, gen_params *g, bool *sent) {
    enum MHD_Result ret = check_fields(c, r, b, sent);
    if (*sent)
        return ret;
    *sent = true;
    const char *err = NULL;
    g->s = ts_sampling_default();
    g->s.temperature = 1.0; /* OpenAI's default */
    g->max_tokens = r->kind == REQ_CHAT ? -1 : 16;
    g->n = 1;
    g->priority = 0;
    double top_k = 0;
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
        !int_field(b, "n", 1, MAX_CHOICES, &g->n, &err) ||
        !int_field(b, "priority", -(1L << 30), 1L << 30, &g->priority, &err))
        return bad_param(c, err, "out of range or of the wrong type");
    g->s.top_k = top_k < 0 ? 0 : (int64_t)top_k;
    json_t *sd = json_object_get(b, "seed");
    if (sd && !json_is_null(sd)) {
        if (!json_is_integer(sd))
            return bad_param(c, "seed", "must be an integer");
        g->s.seed = (uint64_t)json_integer_value(sd);
        g->seeded = true;
    }
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
    } else if (v && !json_is_null(v))
        return bad_param(c, "stop_token_ids", "must be an array of integers");
    ret = parse_logit_bias(c, json_object_get(b, "logit_bias"), g, sent);
    if (*sent)
        return ret;
    *sent = true;
    g->best_of = g->n;
    if (r->kind == REQ_COMPLETION) {
        ret = completion_params(c, r, b, g, sent);
        if (*sent)
            return ret;
        *sent = true;
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

/* ---- prompts ---- */

/* one prompt of a request: its ids and, for echo, its text */
typedef struct {
    int32_t *ids;
    size_t n;
    char *text; /* malloc'd */
    size_t n_text;
} prompt_in;

/* the ids of text, no special tokens added; 0 or -1 with e filled */
static int encode_plain(const char *text, int32_t **ids, size_t *n,
                        ts_prompt_error *e) {
    pthread_mutex_lock(&srv.tok_mu);
    ts_status st =
        ts_tokenizer_encode(srv.tok, text, strlen(text), false, ids, n);
    if (st != TS_OK) {
        e->status = 400, e->param = "prompt";
        snprintf(e->msg, sizeof e->msg, "%s", ts_errmsg(srv.ctx));
        ts_clear_error(srv.ctx);
    }
    pthread_mutex_unlock(&srv.tok_mu);
    return st == TS_OK ? 0 : -1;
}

/* <fim_prefix> prefix <fim_suffix> suffix <fim_middle>, as Qwen's coder
 * models (and StarCoder's) were trained on */
static int fim_prompt(const char *prefix, const char *suffix, prompt_in *p,
                      ts_prompt_error *e) {
    int32_t *a = NULL, *s = NULL;
    size_t na = 0, ns = 0;
    if (encode_plain(prefix, &a, &na, e) || encode_plain(suffix, &s, &ns, e)) {
        free(a);
        return -1;
    }
    p->ids = malloc(sizeof *p->ids * (na + ns + 3));
    if (p->ids) {
        p->ids[0] = fim[0];
        memcpy(p->ids + 1, a, sizeof *a * na);
        p->ids[1 + na] = fim[1];
        memcpy(p->ids + 2 + na, s, sizeof *s * ns);
        p->ids[2 + na + ns] = fim[2];
        p->n = na + ns + 3;
    }
    free(a), free(s);
    return p->ids ? 0 : -1;
}

/* one element of "prompt" (a string or token ids) into p */
static int one_prompt(json_t *elem, const gen_params *g, bool echo,
                      prompt_in *p, ts_prompt_error *e) {
    if (g->suffix) {
        if (!json_is_string(elem)) {
            e->status = 400, e->param = "suffix";
            snprintf(e->msg, sizeof e->msg,
                     "suffix: needs the prompt as text, not token ids");
            return -1;
        }
        if (fim_prompt(json_string_value(elem), g->suffix, p, e))
            return -1;
    } else {
        json_t *sub = json_pack("{s:O}", "prompt", elem);
        int rc = ts_openai_prompt(srv.tok, srv.chat, srv.ctx, &srv.tok_mu, sub,
                                  false, &p->ids, &p->n, e);
        json_decref(sub);
        if (rc)
            return -1;
    }
    if (!echo)
        return 0;
    if (json_is_string(elem)) {
        p->n_text = json_string_length(elem);
        p->text = strndup(json_string_value(elem), p->n_text);
        return 0;
    }
    pthread_mutex_lock(&srv.tok_mu);
    if (ts_tokenizer_decode(srv.tok, p->ids, p->n, false, &p->text,
                            &p->n_text) != TS_OK)
        ts_clear_error(srv.ctx);
    pthread_mutex_unlock(&srv.tok_mu);
    return 0;
}

/* the request's prompts: chat's messages, or completions' prompt as a
 * string, token ids, or a list of either (batched); -1 with e filled */
static int prompts_of(hreq *r, json_t *b, const gen_params *g, prompt_in *ps,
                      int *np, ts_prompt_error *e) {
    *np = 0;
    if (r->kind == REQ_CHAT) {
        if (ts_openai_prompt(srv.tok, srv.chat, srv.ctx, &srv.tok_mu, b, true,
                             &ps[0].ids, &ps[0].n, e))
            return -1;
        *np = 1;
        return 0;
    }
    json_t *p = json_object_get(b, "prompt");
    json_t *first = json_array_get(p, 0);
    bool list =
        json_is_array(p) && (json_is_string(first) || json_is_array(first));
    size_t count = list ? json_array_size(p) : 1;
    if (json_is_array(p) && !json_array_size(p)) {
        e->status = 400, e->param = "prompt";
        snprintf(e->msg, sizeof e->msg, "prompt: the list is empty");
        return -1;
    }
    if (count * (size_t)g->best_of > MAX_CHOICES) {
        e->status = 400, e->param = "prompt";
        snprintf(e->msg, sizeof e->msg,
                 "prompt: %zu prompts x %d choices each is more than the %d "
                 "choices a request may have",
                 count, g->best_of, MAX_CHOICES);
        return -1;
    }
    for (size_t i = 0; i < count; i++) {
        json_t *elem = list ? json_array_get(p, i) : p;
        if (list && !json_is_string(elem) && !json_is_array(elem)) {
            e->status = 400, e->param = "prompt";
            snprintf(e->msg, sizeof e->msg,
                     "prompt: a list must hold strings or lists of token ids");
            return -1;
        }
        if (one_prompt(elem, g, r->echo, &ps[i], e))
            return -1;
        (*np)++;
        if (!ps[i].n) {
            e->status = 400, e->param = "prompt";
            snprintf(e->msg, sizeof e->msg, "prompt: the prompt is empty");
            return -1;
        }
    }
    return 0;
}

static void prompts_free(prompt_in *ps, int np) {
    for (int i = 0; i < np; i++)
        free(ps[i].ids), free(ps[i].text);
}

/* ---- response bodies ---- */

/* with speculative decoding on, completion_tokens_details carries
 * OpenAI's predicted-outputs fields: the speculated tokens the model
 * accepted and those it rejected, over all the choices */
static json_t *usage_json(const hreq *r) {
    int64_t completion = 0, prompt = 0, cached = 0, proposed = 0, accepted = 0;
    for (int i = 0; i < r->n; i++) {
        completion += r->ch[i].n_tokens;
        proposed += r->ch[i].spec_proposed;
        accepted += r->ch[i].spec_accepted;
    }
    for (int p = 0; p < r->n_prompts; p++) {
        prompt += r->ch[p * r->per_prompt].prompt_tokens;
        cached += r->ch[p * r->per_prompt].cached;
    }
    json_t *u = json_pack(
        "{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)prompt,
        "completion_tokens", (json_int_t)completion, "total_tokens",
        (json_int_t)(prompt + completion), "prompt_tokens_details",
        "cached_tokens", (json_int_t)cached);
    if (u && srv.spec != TS_SPEC_NONE)
        json_object_set_new(
            u, "completion_tokens_details",
            json_pack("{s:I, s:I}", "accepted_prediction_tokens",
                      (json_int_t)accepted, "rejected_prediction_tokens",
                      (json_int_t)(proposed - accepted)));
    return u;
}

/* text as a JSON string, never NULL for bad bytes: each ill-formed part
 * becomes U+FFFD (a token's part of a character; the decoder's own output
 * is whole UTF-8). A chunk is never
 * dropped or waited for because its text is not JSON. */
static json_t *json_text(const char *text, size_t n) {
    json_t *s = json_stringn(text ? text : "", text ? n : 0);
    if (s)
        return s;
    ts_sbuf b = {0};
    ts_sb_add_lossy(&b, text, n);
    s = json_stringn(b.p ? b.p : "", b.n);
    free(b.p);
    return s ? s : json_string("");
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
    json_t *s = json_text(text, len);
    free(text);
    return s;
}

/* completions' logprobs object, built entry by entry */
typedef struct {
    json_t *tokens, *lps, *tops, *offs;
    size_t offset;
} comp_lp;

/* one token; o NULL: the prompt's first token (no log-probability) */
static void comp_lp_add(comp_lp *l, int32_t id, const ts_engine_output *o) {
    json_t *tok = token_json(id, NULL);
    json_array_append_new(l->offs, json_integer((json_int_t)l->offset));
    l->offset += json_string_length(tok);
    json_array_append_new(l->tokens, tok);
    json_array_append_new(l->lps, o ? json_real(o->logprob) : json_null());
    if (!o) {
        json_array_append_new(l->tops, json_null());
        return;
    }
    json_t *top = json_object();
    for (int k = 0; k < o->n_top; k++) {
        json_t *tt = token_json(o->top_ids[k], NULL);
        json_object_set_new(top, json_string_value(tt),
                            json_real(o->top_logprobs[k]));
        json_decref(tt);
    }
    json_array_append_new(l->tops, top);
}

/* OpenAI's logprobs object for tokens [from, to) of c, after the prompt's
 * when prompt (echo) (out_mu held) */
static json_t *logprobs_json(const hreq *r, choice *c, int from, int to,
                             size_t offset, bool prompt) {
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
    comp_lp l = {json_array(), json_array(), json_array(), json_array(),
                 offset};
    if (prompt) {
        comp_lp_add(&l, c->prompt0, NULL);
        for (size_t i = 0; i < c->n_plp; i++)
            comp_lp_add(&l, c->plp[i].token, &c->plp[i]);
    }
    for (int i = from; i < to; i++)
        comp_lp_add(&l, c->lp[i].token, &c->lp[i]);
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", l.tokens,
                     "token_logprobs", l.lps, "top_logprobs", l.tops,
                     "text_offset", l.offs);
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

/* a chunk of one choice (ch: its fields, taken) */
static void sse_choice(const hreq *r, ts_sbuf *b, json_t *ch) {
    json_t *j = chunk_head(r);
    json_object_set_new(j, "choices", json_pack("[o]", ch));
    sse(b, j);
}

/* chat's first chunk (the role) or completions' echo of the prompt
 * (with logprobs, once the first output brought the prompt's); false
 * while the echo waits */
static bool stream_opening(hreq *r, int i, ts_sbuf *b) {
    choice *c = &r->ch[i];
    if (r->kind == REQ_CHAT && !c->role_sent) {
        sse_choice(r, b,
                   json_pack("{s:i, s:{s:s, s:s}, s:n, s:n}", "index", i,
                             "delta", "role", "assistant", "content", "",
                             "logprobs", "finish_reason"));
        c->role_sent = true;
    }
    if (r->echo && !c->echo_sent) {
        if (r->logprobs && !c->n_tokens && !c->finished)
            return false;
        json_t *t = json_text(c->echo, c->n_echo);
        json_t *lp =
            r->logprobs ? logprobs_json(r, c, 0, 0, 0, true) : json_null();
        sse_choice(r, b,
                   json_pack("{s:i, s:o, s:o, s:n}", "index", i, "text", t,
                             "logprobs", lp, "finish_reason"));
        c->echo_sent = true;
    }
    return true;
}

/* the SSE chunks ready now (out_mu held) */
static void stream_ready(hreq *r, ts_sbuf *b) {
    bool all_final = true;
    for (int i = 0; i < r->n; i++) {
        choice *c = &r->ch[i];
        if (!stream_opening(r, i, b)) {
            all_final = false;
            continue;
        }
        if (c->safe > c->sent) {
            json_t *piece = json_text(c->text.p + c->sent, c->safe - c->sent);
            json_t *ch;
            if (r->kind == REQ_CHAT)
                ch = json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", i, "delta",
                               "content", piece, "logprobs", "finish_reason");
            else
                ch = json_pack("{s:i, s:o, s:n, s:n}", "index", i, "text",
                               piece, "logprobs", "finish_reason");
            if (r->logprobs && c->lp_sent < c->n_lp) {
                json_object_set_new(ch, "logprobs",
                                    logprobs_json(r, c, c->lp_sent, c->n_lp,
                                                  c->n_echo + c->sent, false));
                c->lp_sent = c->n_lp;
            }
            sse_choice(r, b, ch);
            c->sent = c->safe;
        }
        if (c->tool_deltas && json_array_size(c->tool_deltas)) {
            sse_choice(r, b,
                       json_pack("{s:i, s:{s:O}, s:n, s:n}", "index", i,
                                 "delta", "tool_calls", c->tool_deltas,
                                 "logprobs", "finish_reason"));
            json_array_clear(c->tool_deltas);
        }
        if (c->finished && c->sent == c->text.n && !c->final_sent) {
            json_t *ch;
            if (r->kind == REQ_CHAT)
                ch = json_pack("{s:i, s:{}, s:n, s:s}", "index", i, "delta",
                               "logprobs", "finish_reason", c->finish_reason);
            else
                ch = json_pack("{s:i, s:s, s:n, s:s}", "index", i, "text", "",
                               "logprobs", "finish_reason", c->finish_reason);
            sse_choice(r, b, ch);
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
        srv_openai_release(r);
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

/* one finished choice as the client sees it, at index */
static json_t *choice_json(const hreq *r, choice *ch, int index) {
    if (r->kind == REQ_CHAT) {
        json_t *txt = json_text(ch->text.p, ch->text.n);
        if (ch->tool_calls && !ch->text.n) /* only calls: null */
            json_decref(txt), txt = json_null();
        json_t *msg =
            json_pack("{s:s, s:o}", "role", "assistant", "content", txt);
        if (ch->tool_calls)
            json_object_set(msg, "tool_calls", ch->tool_calls);
        json_t *lp = r->logprobs ? logprobs_json(r, ch, 0, ch->n_lp, 0, false)
                                 : json_null();
        return json_pack("{s:i, s:o, s:o, s:s}", "index", index, "message", msg,
                         "logprobs", lp, "finish_reason", ch->finish_reason);
    }
    ts_sbuf t = {0};
    if (r->echo && ch->n_echo)
        ts_sb_add(&t, ch->echo, ch->n_echo);
    if (ch->text.n)
        ts_sb_add(&t, ch->text.p, ch->text.n);
    json_t *txt = json_text(t.p, t.n);
    free(t.p);
    json_t *lp = r->logprobs ? logprobs_json(r, ch, 0, ch->n_lp, 0, r->echo)
                             : json_null();
    return json_pack("{s:i, s:o, s:o, s:s}", "index", index, "text", txt,
                     "logprobs", lp, "finish_reason", ch->finish_reason);
}

static double mean_lp(const choice *c) {
    return c->sum_lp / (c->n_tokens ? c->n_tokens : 1);
}

/* the choices returned: all of them, or with best_of each prompt's n_out
 * of highest mean log-probability (as OpenAI), ties to the first */
static json_t *choices_json(const hreq *r) {
    json_t *choices = json_array();
    for (int p = 0; p < r->n_prompts; p++) {
        int order[MAX_CHOICES];
        int base = p * r->per_prompt;
        for (int k = 0; k < r->per_prompt; k++) {
            int j = k;
            if (r->per_prompt > r->n_out) /* best_of: an insertion sort */
                while (j > 0 && mean_lp(&r->ch[base + order[j - 1]]) <
                                    mean_lp(&r->ch[base + k]))
                    order[j] = order[j - 1], j--;
            order[j] = k;
        }
        for (int j = 0; j < r->n_out; j++)
            json_array_append_new(
                choices, choice_json(r, (choice *)&r->ch[base + order[j]],
                                     p * r->n_out + j));
    }
    return choices;
}

/* ---- waiting for a whole response ---- */

/* how often a request waiting for its whole response looks at its client */
#define WAIT_CHECK_MS 100

/* whether c's client hung up (a read of EOF, a reset) or its socket was
 * shut down (MHD_stop_daemon does so before joining its thread). A request
 * pipelined behind this one is data, not a hang-up. */
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci || ci->connect_fd < 0)
        return false;
    struct pollfd pf = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0)
        return false;
    if (pf.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP))
        return true;
    char b;
    ssize_t got = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                        errno != EINTR);
}

/* ch's unfinished choices aborted in the engine and finished (out_mu held,
 * released around the engine's lock: eng_mu is never taken with another
 * lock held), in batches */
static void abort_choices(choice *ch, int n) {
    for (;;) {
        int64_t ids[64];
        int k = 0;
        for (int i = 0; i < n && k < 64; i++)
            if (!ch[i].finished) {
                ids[k++] = ch[i].eid;
                ch[i].finished = true, ch[i].finish_reason = "abort";
                ch[i].safe = ch[i].text.n;
                srv_active_remove(&ch[i]);
            }
        if (!k)
            return;
        pthread_mutex_unlock(&srv.out_mu);
        srv_eng_lock();
        for (int i = 0; i < k; i++)
            if (ts_engine_abort(srv.eng, ids[i]) != TS_OK)
                ts_clear_error(srv.ctx); /* finished meanwhile */
        pthread_mutex_unlock(&srv.eng_mu);
        pthread_mutex_lock(&srv.out_mu);
    }
}

/* whether any unfinished choice of ch is still in the active list (out_mu
 * held): one that is not will never be delivered to */
static bool any_active(const choice *ch, int n) {
    for (int a = 0; a < srv.n_active; a++)
        if (srv.active[a] >= ch && srv.active[a] < ch + n)
            return true;
    return false;
}

bool srv_wait_finished(struct MHD_Connection *c, choice *ch, int n) {
    double next_check = srv_now() + WAIT_CHECK_MS * 1e-3;
    for (;;) {
        int i = 0;
        while (i < n && ch[i].finished)
            i++;
        if (i == n)
            return true;
        /* the engine wakes waiters every step: the client is looked at on
         * a clock, not on each wake-up */
        if (srv_now() >= next_check) {
            next_check = srv_now() + WAIT_CHECK_MS * 1e-3;
            /* at SIGTERM running requests finish (the drain); one that no
             * longer is in the engine's list never would */
            if (client_gone(c) || (srv_signal && !any_active(ch, n))) {
                abort_choices(ch, n);
                return false;
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)WAIT_CHECK_MS * 1000000;
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        pthread_cond_timedwait(&srv.out_cv, &srv.out_mu, &ts);
    }
}

static enum MHD_Result respond_whole(struct MHD_Connection *c, hreq *r) {
    pthread_mutex_lock(&srv.out_mu);
    if (!srv_wait_finished(c, r->ch, r->n)) {
        /* no one to answer: MHD closes the connection and completed()
         * frees r; 499 (nginx's "client closed request") for the log */
        r->status = 499;
        pthread_mutex_unlock(&srv.out_mu);
        return MHD_NO;
    }
    json_t *kvx = NULL;
    if (r->kv_prefill) {
        pthread_mutex_unlock(&srv.out_mu);
        kvx = srv_send_prefill(r);
        pthread_mutex_lock(&srv.out_mu);
    }
    json_t *resp =
        json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object",
                  r->kind == REQ_CHAT ? "chat.completion" : "text_completion",
                  "created", (json_int_t)r->created, "model", srv.model,
                  "choices", choices_json(r), "usage", usage_json(r));
    if (kvx)
        json_object_set_new(resp, "kv_transfer_params", kvx);
    srv_openai_release(r);
    pthread_mutex_unlock(&srv.out_mu);
    return srv_send_json(c, 200, resp);
}

/* the request parameter an engine error is about */
static const char *param_of(const hreq *r, const char *msg) {
    if (strstr(msg, "max_tokens"))
        return "max_tokens";
    if (strstr(msg, "top_logprobs"))
        return "top_logprobs";
    if (strstr(msg, "logit_bias"))
        return "logit_bias";
    if (strstr(msg, "prompt"))
        return r->kind == REQ_CHAT ? "messages" : "prompt";
    return NULL;
}

/* ---- structured outputs and tools ---- */

/* the grammar the request imposes (NULL: none): response_format & co., or
 * a required or named tool_choice (r->tools, parsed); -1 with e filled */
static int grammar_of(hreq *r, json_t *b, ts_grammar **g, ts_prompt_error *e) {
    *g = NULL;
    so_request q;
    int got = so_parse(b, &q, e);
    if (got < 0)
        return -1;
    if (r->kind == REQ_CHAT) {
        ts_grammar_spec spec;
        if (r->tools && ts_tools_grammar(r->tools, &spec)) {
            if (got) {
                so_request_free(&q);
                e->status = 400, e->param = "tool_choice";
                snprintf(e->msg, sizeof e->msg,
                         "tool_choice: a required or named tool choice "
                         "cannot be combined with %s",
                         q.field ? q.field : "structured outputs");
                return -1;
            }
            return so_compile(&spec, "tool_choice", g, e);
        }
    }
    int rc = got ? so_compile(&q.spec, q.field, g, e) : 0;
    so_request_free(&q);
    return rc;
}

void srv_openai_release(hreq *r) {
    for (int i = 0; i < r->n; i++) {
        choice *c = &r->ch[i];
        free(c->echo), free(c->plp);
        c->echo = NULL, c->plp = NULL, c->n_echo = c->n_plp = 0;
        if (c->tp)
            ts_tool_parser_free(c->tp);
        c->tp = NULL;
        json_decref(c->tool_deltas), json_decref(c->tool_calls);
        c->tool_deltas = c->tool_calls = NULL;
        free(c->raw.p);
        c->raw = (ts_sbuf){0};
    }
    if (r->tools)
        ts_tools_free(r->tools);
    r->tools = NULL;
}

/* ---- admission ---- */

/* the body of a completion or chat request, or an error sent */
static json_t *load_body(struct MHD_Connection *c, hreq *r,
                         enum MHD_Result *ret) {
    json_error_t je;
    json_t *b = json_loadb(r->body.p ? r->body.p : "", r->body.n,
                           JSON_REJECT_DUPLICATES, &je);
    if (json_is_object(b))
        return b;
    bool parsed = b != NULL;
    json_decref(b);
    *ret = srv_send_error(c, 400, "invalid_request_error", NULL, NULL,
                          parsed ? "the body must be a JSON object"
                                 : "the body is not valid JSON: %s",
                          je.text);
    return NULL;
}

/* kv_transfer_params: this request is a prefill for another server;
 * *sent when refused */
static enum MHD_Result kv_params(struct MHD_Connection *c, hreq *r, json_t *b,
                                 bool *sent) {
    *sent = false;
    json_t *kvp = json_object_get(b, "kv_transfer_params");
    if (!kvp || json_is_null(kvp))
        return MHD_YES;
    const char *t = json_string_value(json_object_get(kvp, "target"));
    *sent = true;
    /* refused before anything is resolved or connected to, with the same
     * answer whether or not something listens there */
    if (!srv.kv_peers)
        return bad_param(c, "kv_transfer_params",
                         "this server sends KV blocks to no one (it was "
                         "started without --kv-peers)");
    if (!t || strlen(t) >= sizeof r->kv_target ||
        !ts_kv_peers_allow(srv.kv_peers, t))
        return bad_param(c, "kv_transfer_params",
                         "target must be one of this server's --kv-peers "
                         "(a decode server's HOST:PORT, as listed)");
    snprintf(r->kv_target, sizeof r->kv_target, "%s", t);
    r->kv_prefill = true;
    *sent = false;
    return MHD_YES;
}

/* each choice's engine request; cons[i] a new matcher when g */
static bool choice_setup(hreq *r, const gen_params *g, const prompt_in *ps,
                         ts_grammar *gram, ts_constraint *cons) {
    for (int i = 0; i < r->n; i++) {
        choice *c = &r->ch[i];
        const prompt_in *p = &ps[i / r->per_prompt];
        c->req = r;
        c->index = i;
        c->prompt_tokens = (int64_t)p->n;
        c->prompt0 = p->ids[0];
        if (r->echo && p->text) {
            c->echo = malloc(p->n_text + 1);
            if (!c->echo)
                return false;
            memcpy(c->echo, p->text, p->n_text + 1);
            c->n_echo = p->n_text;
        }
        if (r->tools && !(c->tp = ts_tool_parser_new(r->tools)))
            return false;
        if (gram && !so_constraint(gram, &cons[i]))
            return false;
    }
    (void)g;
    return true;
}

bool srv_active_reserve(int n) {
    if (srv.n_active + n <= srv.cap_active)
        return true;
    int cap = srv.cap_active ? srv.cap_active : 64;
    while (cap < srv.n_active + n)
        cap *= 2;
    choice **pp = realloc(srv.active, sizeof *pp * (size_t)cap);
    if (!pp)
        return false;
    srv.active = pp, srv.cap_active = cap;
    return true;
}

/* the choices into the engine, all or none: 0, or the HTTP status (400:
 * the engine refused one, 503: out of memory) with msg filled */
static int engine_add(hreq *r, const gen_params *g, const prompt_in *ps,
                      ts_constraint *cons, char *msg, size_t cap) {
    static uint64_t counter;
    uint64_t salt = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    srv_eng_lock();
    /* a choice in the engine but not in the active list would never be
     * delivered to nor finish: the room first */
    pthread_mutex_lock(&srv.out_mu);
    bool room = srv_active_reserve(r->n);
    pthread_mutex_unlock(&srv.out_mu);
    if (!room) {
        pthread_mutex_unlock(&srv.eng_mu);
        snprintf(msg, cap, "out of memory for %d more running choices", r->n);
        return 503;
    }
    ts_status st = TS_OK;
    int added = 0;
    for (; added < r->n; added++) {
        const prompt_in *p = &ps[added / r->per_prompt];
        ts_request q = {.prompt = p->ids,
                        .n_prompt = p->n,
                        .max_tokens = g->max_tokens,
                        .sampling = g->s,
                        .n_stop_ids = g->n_stop_ids,
                        .ignore_eos = g->ignore_eos,
                        .priority = g->priority,
                        .logprobs = r->logprobs,
                        .prompt_logprobs = r->echo && r->logprobs,
                        .logit_bias = g->n_bias ? g->bias : NULL,
                        .n_logit_bias = g->n_bias,
                        .constraint = cons[added]};
        if (!q.logprobs && r->per_prompt > r->n_out)
            q.logprobs = 1; /* best_of ranks by them */
        memcpy(q.stop_ids, g->stop_ids, sizeof q.stop_ids);
        q.sampling.seed = g->seeded ? g->s.seed + (uint64_t)added
                                    : (uint64_t)srv_now() * 1000003u +
                                          (uint64_t)added * 7919u + salt;
        st = ts_engine_add(srv.eng, &q, &r->ch[added].eid);
        if (st != TS_OK) {
            snprintf(msg, cap, "%s", ts_errmsg(srv.ctx));
            ts_clear_error(srv.ctx);
            break;
        }
        cons[added].state = NULL; /* the engine's now */
    }
    if (st != TS_OK)
        for (int i = 0; i < added; i++)
            if (ts_engine_abort(srv.eng, r->ch[i].eid) != TS_OK)
                ts_clear_error(srv.ctx);
    if (st == TS_OK) {
        pthread_mutex_lock(&srv.out_mu);
        for (int i = 0; i < r->n; i++)
            srv.active[srv.n_active++] = &r->ch[i];
        for (int p = 0; p < r->n_prompts; p++)
            srv.prompt_tokens += ps[p].n;
        pthread_mutex_unlock(&srv.out_mu);
        pthread_cond_signal(&srv.eng_cv);
    }
    pthread_mutex_unlock(&srv.eng_mu);
    return st == TS_OK ? 0 : 400;
}

static void free_constraints(ts_constraint *cons, int n) {
    for (int i = 0; i < n; i++)
        if (cons[i].state && cons[i].free)
            cons[i].free(cons[i].state);
}

/* the prompts checked against the context; an error sent */
static enum MHD_Result check_lengths(struct MHD_Connection *c, const hreq *r,
                                     const prompt_in *ps, int np, bool *sent) {
    *sent = true;
    for (int p = 0; p < np; p++)
        if ((int64_t)ps[p].n >= srv.max_positions)
            return srv_send_error(c, 400, "invalid_request_error",
                                  r->kind == REQ_CHAT ? "messages" : "prompt",
                                  "context_length_exceeded",
                                  "This model's maximum context length is "
                                  "%lld tokens; the prompt has %zu",
                                  (long long)srv.max_positions, ps[p].n);
    *sent = false;
    return MHD_YES;
}

enum MHD_Result srv_generate(struct MHD_Connection *c, hreq *r) {
    enum MHD_Result ret = MHD_NO;
    json_t *b = load_body(c, r, &ret);
    if (!b)
        return ret;
    gen_params g = {0};
    bool sent;
    ret = kv_params(c, r, b, &sent);
    if (!sent)
        ret = parse_params(c, r, b, &g, &sent);
    if (!sent && r->kv_prefill) { /* the prompt's KV, one greedy token */
        g.n = g.best_of = 1, g.max_tokens = 1, g.ignore_eos = true;
        g.s = ts_sampling_default();
        r->stream = false, r->logprobs = 0, r->echo = false;
    }
    prompt_in *ps = calloc(MAX_CHOICES, sizeof *ps);
    int np = 0;
    ts_grammar *gram = NULL;
    ts_prompt_error pe = {0};
    if (!sent && !ps)
        ret =
            srv_send_error(c, 500, "server_error", NULL, NULL, "out of memory"),
        sent = true;
    /* tools checked (their number bounded) before the template renders
     * them; a prefill checks them but parses no calls */
    if (!sent && r->kind == REQ_CHAT &&
        ts_tools_parse(b, srv.chat, &r->tools, &pe))
        ret = prompt_error(c, &pe), sent = true;
    if (!sent && r->kv_prefill && r->tools)
        ts_tools_free(r->tools), r->tools = NULL;
    if (!sent && (prompts_of(r, b, &g, ps, &np, &pe) ||
                  (!r->kv_prefill && grammar_of(r, b, &gram, &pe))))
        ret = prompt_error(c, &pe), sent = true;
    json_decref(b);
    if (!sent)
        ret = check_lengths(c, r, ps, np, &sent);
    if (!sent && r->kv_prefill && np > 1)
        ret = bad_param(c, "kv_transfer_params", "a prefill takes one prompt"),
        sent = true;
    if (sent) {
        srv_openai_release(r);
        if (gram)
            ts_grammar_unref(gram);
        if (ps)
            prompts_free(ps, np);
        free(ps);
        return ret;
    }
    if (g.max_tokens < 0) { /* chat without max_tokens: the rest, bounded */
        int64_t left = srv.max_positions - (int64_t)ps[0].n;
        g.max_tokens = (int)(left < 4096 ? left : 4096);
    }
    /* prompt + output within the context (--max-model-len or the model's):
     * a longer max_tokens ends with finish_reason "length" there */
    for (int p = 0; p < np; p++) {
        int64_t left = srv.max_positions - (int64_t)ps[p].n;
        if (left < g.max_tokens)
            g.max_tokens = (int)left;
    }
    r->n_prompts = np;
    r->per_prompt = g.best_of;
    r->n_out = g.n;
    r->n = np * g.best_of;
    r->created = (long)time(NULL);
    static uint64_t counter;
    snprintf(
        r->id, sizeof r->id, "%s-%lx%x%llx",
        r->kind == REQ_CHAT ? "chatcmpl" : "cmpl", (long)r->created,
        (unsigned)getpid(), /* unique across the servers behind a router */
        (unsigned long long)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    r->t_start = srv_now();
    ts_constraint cons[MAX_CHOICES];
    memset(cons, 0, sizeof cons);
    char msg[512] = "";
    int rc = 503;
    if (!choice_setup(r, &g, ps, gram, cons))
        snprintf(msg, sizeof msg, "out of memory");
    else
        rc = engine_add(r, &g, ps, cons, msg, sizeof msg);
    free_constraints(cons, r->n);
    if (gram)
        ts_grammar_unref(gram);
    if (rc == 0 && r->kv_prefill) { /* sent once computed */
        r->kv_ids = ps[0].ids, r->kv_n = ps[0].n;
        ps[0].ids = NULL;
    }
    prompts_free(ps, np);
    free(ps);
    if (rc) {
        srv_openai_release(r);
        r->n = 0; /* nothing of it is in the engine */
        if (rc != 400)
            return srv_send_error(c, rc, "server_error", NULL, NULL, "%s", msg);
        return srv_send_error(c, 400, "invalid_request_error", param_of(r, msg),
                              NULL, "%s", msg);
    }
    if (!r->stream)
        return respond_whole(c, r);
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16384, stream_reader, r, NULL);
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    srv_cors_headers(c, resp);
    ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    srv_count_status(200);
    return ret;
}

/* the first of these triples the tokenizer has */
static void find_fim(void) {
    static const char *const names[][3] = {
        {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
        {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
        {"<fim-prefix>", "<fim-suffix>", "<fim-middle>"}};
    fim[0] = fim[1] = fim[2] = -1;
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        int32_t id[3];
        for (int j = 0; j < 3; j++)
            id[j] = ts_tokenizer_token_id(srv.tok, names[k][j]);
        if (id[0] >= 0 && id[1] >= 0 && id[2] >= 0) {
            memcpy(fim, id, sizeof id);
            return;
        }
    }
}

int srv_openai_init(char *err, size_t cap) {
    find_fim();
    return so_init(srv.tok, err, cap);
}

void srv_openai_fini(void) {
    so_fini();
}
