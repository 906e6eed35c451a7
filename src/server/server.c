/* server.c — the OpenAI-compatible HTTP server (GNU libmicrohttpd, a
 * thread per connection, HTTP/1.1 keep-alive) over one engine.
 *
 * Threads and locks: connection threads parse and validate a request,
 * render the chat template and tokenize (tok_mu: the tokenizer and the
 * template report errors through one context), then add the request's
 * choices to the engine (eng_mu) and to the active list (out_mu). One
 * engine thread runs ts_engine_step under eng_mu, then, under out_mu,
 * hands each generated token to its choice (decoded to text, stop strings
 * cut), publishes the KV events and wakes the connections (out_cv). A
 * streaming response is a content callback that waits on out_cv and writes
 * Server-Sent Events; a client that goes away ends its request (MHD's
 * completion callback) and its engine requests are aborted, freeing their
 * blocks. Lock order: out_mu before tok_mu; eng_mu is never taken with
 * another lock held.
 * Owns HTTP, JSON formats, stop strings and metrics, and applies the
 * checks of auth.h (the API key, --kv-peers, --kv-senders) and the
 * listener limits; scheduling is the engine's. */
#define _GNU_SOURCE
#include "tessera_server.h"

#include "tessera_io.h"
#include "tessera_models.h"
#include "tessera_tokenizer.h"

#include "auth.h"
#include "core/strbuf.h"
#include "kv_transfer.h"
#include "prompt.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_BODY     (16 << 20)
#define MAX_CHOICES  16
#define MAX_STOPS    8
#define EVENT_KEEP   65536
#define KEEPALIVE_MS 1000

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- requests ---- */

struct hreq;

typedef struct choice {
    struct hreq *req;
    int index;
    int64_t eid; /* the engine's id */
    ts_detok_state ds;
    ts_sbuf text;      /* decoded so far, stop strings cut */
    size_t safe, sent; /* bytes that can go out / have gone out */
    int n_tokens;
    bool finished, final_sent, role_sent;
    const char *finish_reason;
    int64_t cached, prompt_tokens;
    double t_last;
    ts_engine_output *lp; /* per token, when logprobs were asked for */
    int n_lp, cap_lp, lp_sent;
} choice;

typedef enum { REQ_OTHER, REQ_COMPLETION, REQ_CHAT, REQ_EVENTS } req_kind;

typedef struct hreq {
    ts_sbuf body;
    bool too_big, unauthorized; /* unauthorized: its body is not kept */
    req_kind kind;
    bool stream, include_usage, cancelled, usage_sent, done_sent;
    int logprobs; /* as ts_request: 0 none, 1 + N top */
    int n;
    choice ch[MAX_CHOICES];
    char id[48];
    long created;
    char *stops[MAX_STOPS];
    int n_stops;
    size_t max_stop;
    ts_sbuf pend; /* streamed bytes not yet taken by MHD */
    size_t pend_off;
    uint64_t events_next;
    double t_start;
    /* a prefill for another server: its prompt and where its KV goes */
    bool kv_prefill;
    char kv_target[128];
    int32_t *kv_ids;
    size_t kv_n;
} hreq;

/* ---- server state ---- */

#define N_TTFT 11
#define N_ITL  9
static const double TTFT_B[N_TTFT] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1,    2.5,   5,    10,  30};
static const double ITL_B[N_ITL] = {0.005, 0.01, 0.025, 0.05, 0.1,
                                    0.25,  0.5,  1,     2.5};

static struct {
    ts_ctx *ctx;
    ts_lm *lm;
    ts_tokenizer *tok;
    ts_chat *chat;
    ts_engine *eng;
    char model[256];
    int64_t max_positions, block_size;
    int32_t eos[8];
    int n_eos;
    pthread_mutex_t eng_mu, out_mu, tok_mu;
    atomic_int eng_want; /* threads waiting for eng_mu (see eng_lock) */
    pthread_cond_t eng_cv, out_cv;
    choice **active;
    int n_active, cap_active;
    bool stop_engine;
    /* KV events kept for /v1/kv_events readers */
    ts_kv_event *events;
    size_t n_events;
    uint64_t first_event_seq; /* seq of events[0] */
    /* metrics (out_mu) */
    uint64_t status_count[7]; /* 200 400 401 404 405 413 500 */
    uint64_t prompt_tokens, generated_tokens, cached_tokens;
    uint64_t ttft_hist[N_TTFT + 1], itl_hist[N_ITL + 1];
    double ttft_sum, itl_sum;
    ts_engine_stats est;
    /* KV transfer: the listening socket, counters (out_mu) */
    int kv_fd, kv_port, kv_conns; /* kv_conns: atomic */
    bool no_kv_events, kv_stop, fault_corrupt;
    uint64_t kvx_sent, kvx_send_failed, kvx_received, kvx_refused;
    uint64_t kvx_blocks_sent, kvx_blocks_adopted;
    /* where a prefill may send KV (NULL: nowhere); the API key (NULL:
     * none); the listeners' silence limit in ms */
    ts_kv_peers *kv_peers;
    ts_kv_senders *kv_senders; /* NULL: loopback */
    const char *api_key;
    int timeout_ms;
} S;

static volatile sig_atomic_t g_signal;

static void count_status(int code) {
    int i = code == 200   ? 0
            : code == 400 ? 1
            : code == 401 ? 2
            : code == 404 ? 3
            : code == 405 ? 4
            : code == 413 ? 5
                          : 6;
    pthread_mutex_lock(&S.out_mu);
    S.status_count[i]++;
    pthread_mutex_unlock(&S.out_mu);
}

static void observe(uint64_t *hist, const double *bounds, int nb, double *sum,
                    double v) {
    int i = 0;
    while (i < nb && v > bounds[i])
        i++;
    hist[i]++;
    *sum += v;
}

/* ---- responses ---- */

static enum MHD_Result send_text(struct MHD_Connection *c, int code,
                                 const char *type, const char *text) {
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)code, r);
    MHD_destroy_response(r);
    count_status(code);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int code,
                                 json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    enum MHD_Result ret = send_text(c, code, "application/json", s ? s : "{}");
    free(s);
    return ret;
}

/* OpenAI's error object */
static enum MHD_Result send_error(struct MHD_Connection *c, int code,
                                  const char *type, const char *param,
                                  const char *codestr, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ts_utf8_sanitize(msg); /* a quoted URL or name, or a cut, stays JSON */
    json_t *e =
        json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", msg, "type",
                  type, "param", param ? json_string(param) : json_null(),
                  "code", codestr ? json_string(codestr) : json_null());
    return send_json(c, code, e);
}

/* ---- the engine thread ---- */

static void active_remove(choice *c) {
    for (int i = 0; i < S.n_active; i++)
        if (S.active[i] == c) {
            S.active[i] = S.active[--S.n_active];
            return;
        }
}

/* a token for choice c (out_mu held); returns true when c must be
 * aborted in the engine (a stop string ended it) */
static bool deliver(choice *c, const ts_engine_output *o) {
    hreq *r = c->req;
    double t = now_s();
    if (c->n_tokens == 0)
        observe(S.ttft_hist, TTFT_B, N_TTFT, &S.ttft_sum, t - r->t_start);
    else
        observe(S.itl_hist, ITL_B, N_ITL, &S.itl_sum, t - c->t_last);
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
    S.generated_tokens++;
    bool abort_it = false;
    if (o->finish != TS_FINISH_STOP) { /* a stop token's text is not shown */
        char piece[256];
        size_t pl = 0;
        pthread_mutex_lock(&S.tok_mu);
        if (ts_tokenizer_decode_step(S.tok, &c->ds, o->token, piece,
                                     sizeof piece, &pl) != TS_OK) {
            ts_clear_error(S.ctx);
            pl = 0;
        }
        pthread_mutex_unlock(&S.tok_mu);
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
        active_remove(c);
    return abort_it;
}

/* the engine's pending KV events into the kept window (eng_mu and out_mu
 * held); ev: room for 256 */
static void collect_events(ts_kv_event *ev) {
    size_t ne;
    while ((ne = ts_engine_drain_events(S.eng, ev, 256)) > 0) {
        if (S.n_events + ne > EVENT_KEEP) { /* drop the oldest */
            size_t drop = S.n_events + ne - EVENT_KEEP;
            memmove(S.events, S.events + drop,
                    sizeof *S.events * (S.n_events - drop));
            S.n_events -= drop;
            S.first_event_seq += drop;
        }
        if (!S.n_events)
            S.first_event_seq = ev[0].seq;
        memcpy(S.events + S.n_events, ev, sizeof *ev * ne);
        S.n_events += ne;
    }
}

/* eng_mu for any thread but the engine's. The engine thread releases
 * eng_mu between steps and takes it straight back; a mutex is not fair, so
 * a connection waiting for it (admission, /v1/kv_cache, a KV import) could
 * wait for many steps. A waiter announces itself in eng_want and the
 * engine thread yields until the waiters have had their turn. */
static void eng_lock(void) {
    atomic_fetch_add(&S.eng_want, 1);
    pthread_mutex_lock(&S.eng_mu);
    atomic_fetch_sub(&S.eng_want, 1);
}

static void *engine_loop(void *arg) {
    (void)arg;
    ts_engine_output *out = malloc(sizeof *out * 4096);
    ts_kv_event *ev = malloc(sizeof *ev * 256);
    int64_t *aborts = malloc(sizeof *aborts * 4096);
    for (;;) {
        for (int spin = 0; spin < 10000 && atomic_load(&S.eng_want); spin++)
            sched_yield(); /* let waiting connections in first */
        pthread_mutex_lock(&S.eng_mu);
        while (!S.stop_engine && !ts_engine_has_work(S.eng))
            pthread_cond_wait(&S.eng_cv, &S.eng_mu);
        if (S.stop_engine && !ts_engine_has_work(S.eng)) {
            pthread_mutex_unlock(&S.eng_mu);
            break;
        }
        int k = 0;
        ts_status st = ts_engine_step(S.eng, out, 4096, &k);
        bool failed = st != TS_OK;
        if (failed) {
            fprintf(stderr, "tessera serve: engine step: %s\n",
                    ts_errmsg(S.ctx));
            ts_clear_error(S.ctx);
        }
        ts_engine_stats est;
        ts_engine_get_stats(S.eng, &est);
        pthread_mutex_lock(&S.out_mu);
        collect_events(ev);
        S.est = est;
        int n_abort = 0;
        for (int i = 0; i < k; i++)
            for (int a = 0; a < S.n_active; a++)
                if (S.active[a]->eid == out[i].id) {
                    choice *c = S.active[a];
                    if (deliver(c, &out[i]) && n_abort < 4096)
                        aborts[n_abort++] = c->eid;
                    break;
                }
        if (failed) /* nothing can run: every waiting choice ends */
            while (S.n_active) {
                choice *c = S.active[0];
                c->finished = true, c->finish_reason = "abort";
                c->safe = c->text.n;
                if (n_abort < 4096)
                    aborts[n_abort++] = c->eid;
                active_remove(c);
            }
        pthread_cond_broadcast(&S.out_cv);
        pthread_mutex_unlock(&S.out_mu);
        for (int i = 0; i < n_abort; i++)
            if (ts_engine_abort(S.eng, aborts[i]) != TS_OK)
                ts_clear_error(S.ctx); /* already finished */
        pthread_mutex_unlock(&S.eng_mu);
    }
    free(out), free(ev), free(aborts);
    return NULL;
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
    return send_error(c, 400, "invalid_request_error", p, "invalid_value",
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
    if (!ts_openai_prompt(S.tok, S.chat, S.ctx, &S.tok_mu, body,
                          r->kind == REQ_CHAT, ids, n, &pe))
        return MHD_YES;
    *sent = true;
    return send_error(c, pe.status, "invalid_request_error", pe.param, NULL,
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
    if (json_is_string(model) && strcmp(json_string_value(model), S.model))
        return send_error(c, 404, "invalid_request_error", "model",
                          "model_not_found",
                          "The model `%s` does not exist (this server serves "
                          "`%s`)",
                          json_string_value(model), S.model);
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
    pthread_mutex_lock(&S.tok_mu);
    if (ts_tokenizer_decode(S.tok, &id, 1, false, &text, &len) != TS_OK)
        ts_clear_error(S.ctx), len = 0;
    pthread_mutex_unlock(&S.tok_mu);
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
                     "created", (json_int_t)r->created, "model", S.model);
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
        pthread_mutex_lock(&S.out_mu);
        while (!r->pend.n) {
            if (r->done_sent) {
                pthread_mutex_unlock(&S.out_mu);
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
            if (pthread_cond_timedwait(&S.out_cv, &S.out_mu, &ts)) {
                /* a comment: writing it finds a client that went away */
                ts_sb_add(&r->pend, ": keep-alive\n\n", 14);
            }
        }
        pthread_mutex_unlock(&S.out_mu);
    }
    size_t n = r->pend.n - r->pend_off < max ? r->pend.n - r->pend_off : max;
    memcpy(buf, r->pend.p + r->pend_off, n);
    r->pend_off += n;
    return (ssize_t)n;
}

/* ---- KV transfer ---- */

static ts_kvx_geometry geometry(uint32_t n_blocks) {
    const ts_model_config *mc = ts_decoder_get_config(ts_lm_decoder(S.lm));
    return (ts_kvx_geometry){.block_size = (uint32_t)S.block_size,
                             .layers = (uint32_t)mc->layers,
                             .kv_heads = (uint32_t)mc->kv_heads,
                             .head_dim = (uint32_t)mc->head_dim,
                             .n_blocks = n_blocks};
}

/* a finished prefill request's prompt blocks to its target; the
 * response's kv_transfer_params */
static json_t *send_prefill(hreq *r) {
    size_t per = (size_t)ts_engine_block_bytes(S.eng);
    size_t nb = r->kv_n / (size_t)S.block_size;
    void *kv = malloc(nb * per + 1);
    char err[600] = "";
    uint32_t adopted = 0;
    size_t got = 0, len = 0;
    int rc = -1;
    if (kv) {
        eng_lock();
        got = ts_engine_export_prefix(S.eng, r->kv_ids, r->kv_n, kv, nb);
        pthread_mutex_unlock(&S.eng_mu);
        ts_kvx_blocks b = {
            .g = geometry((uint32_t)got), .tokens = r->kv_ids, .kv = kv};
        uint8_t *f = ts_kvx_encode(&b, &len);
        if (f && S.fault_corrupt && len > TS_KVX_HEADER + TS_KVX_META)
            f[len - 1] ^= 0x40; /* fault injection: one bit of the data */
        rc = f ? ts_kvx_send(r->kv_target, f, len, 30000, &adopted, err,
                             sizeof err)
               : -1;
        free(f);
    }
    if (!kv || (rc && !*err))
        snprintf(err, sizeof err, "out of memory for %zu KV blocks", nb);
    free(kv);
    pthread_mutex_lock(&S.out_mu);
    if (rc)
        S.kvx_send_failed++;
    else
        S.kvx_sent++, S.kvx_blocks_sent += got;
    pthread_mutex_unlock(&S.out_mu);
    if (rc) {
        fprintf(stderr, "tessera serve: %s\n", err);
        return json_pack("{s:s, s:s, s:I}", "status", "error", "message", err,
                         "blocks", (json_int_t)got);
    }
    return json_pack("{s:s, s:I, s:I, s:I, s:I}", "status", "ok", "blocks",
                     (json_int_t)got, "adopted", (json_int_t)adopted, "tokens",
                     (json_int_t)(got * (size_t)S.block_size), "bytes",
                     (json_int_t)len);
}

/* the decode side: a geometry check (b NULL), then the adoption */
static int adopt_blocks(void *arg, const ts_kvx_geometry *g,
                        const ts_kvx_blocks *b, uint32_t *adopted, char *err,
                        size_t errcap) {
    (void)arg;
    ts_kvx_geometry me = geometry(g->n_blocks);
    if (memcmp(&me, g, sizeof me)) {
        snprintf(err, errcap,
                 "KV blocks of another model: block_size %u, layers %u, "
                 "kv_heads %u, head_dim %u, dtype %u (this server: %u, %u, "
                 "%u, %u, 0)",
                 g->block_size, g->layers, g->kv_heads, g->head_dim, g->dtype,
                 me.block_size, me.layers, me.kv_heads, me.head_dim);
        return -1;
    }
    if (!b)
        return 0;
    ts_kv_event ev[256];
    size_t got = 0;
    eng_lock();
    ts_status st =
        ts_engine_import_prefix(S.eng, b->tokens, g->n_blocks, b->kv, &got);
    if (st != TS_OK) {
        snprintf(err, errcap, "%s", ts_errmsg(S.ctx));
        ts_clear_error(S.ctx);
    }
    pthread_mutex_lock(&S.out_mu);
    collect_events(ev);
    if (st == TS_OK)
        S.kvx_blocks_adopted += got;
    pthread_cond_broadcast(&S.out_cv);
    pthread_mutex_unlock(&S.out_mu);
    pthread_mutex_unlock(&S.eng_mu);
    *adopted = (uint32_t)got;
    return st == TS_OK ? 0 : -1;
}

static void *kv_conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    ts_engine_stats st;
    eng_lock();
    ts_engine_get_stats(S.eng, &st);
    pthread_mutex_unlock(&S.eng_mu);
    uint64_t per =
        (uint64_t)ts_engine_block_bytes(S.eng) + 4 * (uint64_t)S.block_size;
    int rc = ts_kvx_serve_connection(
        fd, adopt_blocks, NULL, TS_KVX_META + per * (uint64_t)st.blocks_total,
        S.timeout_ms);
    pthread_mutex_lock(&S.out_mu);
    if (rc)
        S.kvx_refused++;
    else
        S.kvx_received++;
    pthread_mutex_unlock(&S.out_mu);
    __atomic_sub_fetch(&S.kv_conns, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void *kv_listen_loop(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&S.kv_stop, __ATOMIC_SEQ_CST)) {
        struct pollfd pf = {.fd = S.kv_fd, .events = POLLIN};
        if (poll(&pf, 1, 200) <= 0)
            continue;
        struct sockaddr_in peer;
        socklen_t pl = sizeof peer;
        int fd = accept4(S.kv_fd, (struct sockaddr *)&peer, &pl, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        if (!ts_kv_senders_allow(S.kv_senders, (struct sockaddr *)&peer)) {
            close(fd); /* no reply: a stranger learns nothing */
            pthread_mutex_lock(&S.out_mu);
            bool say = S.kvx_refused < 10;
            S.kvx_refused++;
            pthread_mutex_unlock(&S.out_mu);
            char a[INET_ADDRSTRLEN] = "?";
            inet_ntop(AF_INET, &peer.sin_addr, a, sizeof a);
            if (say)
                fprintf(stderr,
                        "tessera serve: a KV connection from %s refused "
                        "(not in --kv-senders%s)\n",
                        a,
                        S.kv_senders ? "" : ", which is loopback by default");
            continue;
        }
        pthread_t t;
        if (__atomic_add_fetch(&S.kv_conns, 1, __ATOMIC_SEQ_CST) >
            TS_KV_MAX_CONNECTIONS) { /* busy: the sender recomputes */
            __atomic_sub_fetch(&S.kv_conns, 1, __ATOMIC_SEQ_CST);
            close(fd);
            pthread_mutex_lock(&S.out_mu);
            S.kvx_refused++;
            pthread_mutex_unlock(&S.out_mu);
            continue;
        }
        if (pthread_create(&t, NULL, kv_conn, (void *)(intptr_t)fd)) {
            __atomic_sub_fetch(&S.kv_conns, 1, __ATOMIC_SEQ_CST);
            close(fd);
        } else
            pthread_detach(t);
    }
    return NULL;
}

static enum MHD_Result respond_whole(struct MHD_Connection *c, hreq *r) {
    pthread_mutex_lock(&S.out_mu);
    bool done = false;
    while (!done) {
        done = true;
        for (int i = 0; i < r->n; i++)
            done &= r->ch[i].finished;
        if (!done)
            pthread_cond_wait(&S.out_cv, &S.out_mu);
    }
    json_t *kvx = NULL;
    if (r->kv_prefill) {
        pthread_mutex_unlock(&S.out_mu);
        kvx = send_prefill(r);
        pthread_mutex_lock(&S.out_mu);
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
                  "created", (json_int_t)r->created, "model", S.model,
                  "choices", choices, "usage", usage_json(r));
    if (kvx)
        json_object_set_new(resp, "kv_transfer_params", kvx);
    pthread_mutex_unlock(&S.out_mu);
    return send_json(c, 200, resp);
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

static enum MHD_Result generate(struct MHD_Connection *c, hreq *r) {
    json_error_t je;
    json_t *b = json_loadb(r->body.p ? r->body.p : "", r->body.n,
                           JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(b)) {
        bool parsed = b != NULL;
        json_decref(b);
        return send_error(c, 400, "invalid_request_error", NULL, NULL,
                          parsed ? "the body must be a JSON object"
                                 : "the body is not valid JSON: %s",
                          je.text);
    }
    json_t *kvp = json_object_get(b, "kv_transfer_params");
    if (kvp && !json_is_null(kvp)) {
        const char *t = json_string_value(json_object_get(kvp, "target"));
        /* refused before anything is resolved or connected to, with the
         * same answer whether or not something listens there */
        if (!S.kv_peers) {
            json_decref(b);
            return bad_param(c, "kv_transfer_params",
                             "this server sends KV blocks to no one (it was "
                             "started without --kv-peers)");
        }
        if (!t || strlen(t) >= sizeof r->kv_target ||
            !ts_kv_peers_allow(S.kv_peers, t)) {
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
    if ((int64_t)n >= S.max_positions) {
        free(ids);
        return send_error(c, 400, "invalid_request_error",
                          r->kind == REQ_CHAT ? "messages" : "prompt",
                          "context_length_exceeded",
                          "This model's maximum context length is %lld "
                          "tokens; the prompt has %zu",
                          (long long)S.max_positions, n);
    }
    if (g.max_tokens < 0) /* chat without max_tokens: the rest, bounded */
        g.max_tokens = (int)(S.max_positions - (int64_t)n < 4096
                                 ? S.max_positions - (int64_t)n
                                 : 4096);
    r->n = g.n;
    r->created = (long)time(NULL);
    static uint64_t counter;
    snprintf(
        r->id, sizeof r->id, "%s-%lx%x%llx",
        r->kind == REQ_CHAT ? "chatcmpl" : "cmpl", (long)r->created,
        (unsigned)getpid(), /* unique across the servers behind a router */
        (unsigned long long)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    r->t_start = now_s();
    /* the choices into the engine, all or none */
    eng_lock();
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
                                   : (uint64_t)now_s() * 1000003u +
                                         (uint64_t)i * 7919u + counter;
        r->ch[i].req = r;
        r->ch[i].index = i;
        st = ts_engine_add(S.eng, &q, &r->ch[i].eid);
        if (st != TS_OK) {
            snprintf(msg, sizeof msg, "%s", ts_errmsg(S.ctx));
            ts_clear_error(S.ctx);
        }
    }
    if (st != TS_OK)
        for (int i = 0; i < added - 1; i++)
            ts_engine_abort(S.eng, r->ch[i].eid);
    if (st == TS_OK) {
        pthread_mutex_lock(&S.out_mu);
        for (int i = 0; i < g.n; i++) {
            if (S.n_active == S.cap_active) {
                int cap = S.cap_active ? S.cap_active * 2 : 64;
                choice **p = realloc(S.active, sizeof *p * (size_t)cap);
                if (p)
                    S.active = p, S.cap_active = cap;
            }
            if (S.n_active < S.cap_active)
                S.active[S.n_active++] = &r->ch[i];
        }
        S.prompt_tokens += n;
        pthread_mutex_unlock(&S.out_mu);
        pthread_cond_signal(&S.eng_cv);
    }
    pthread_mutex_unlock(&S.eng_mu);
    if (st == TS_OK && r->kv_prefill)
        r->kv_ids = ids, r->kv_n = n; /* sent once computed */
    else
        free(ids);
    if (st != TS_OK)
        return send_error(c, 400, "invalid_request_error", param_of(r, msg),
                          NULL, "%s", msg);
    if (!r->stream)
        return respond_whole(c, r);
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16384, stream_reader, r, NULL);
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    count_status(200);
    return ret;
}

/* ---- other endpoints ---- */

static enum MHD_Result metrics(struct MHD_Connection *c) {
    ts_sbuf b = {0};
    /* the engine's figures as of its last step; fresher when the engine is
     * idle (a scrape never waits for a step: a router's health check must
     * not time out on a busy server) */
    ts_engine_stats fresh;
    bool got = pthread_mutex_trylock(&S.eng_mu) == 0;
    if (got) {
        ts_engine_get_stats(S.eng, &fresh);
        pthread_mutex_unlock(&S.eng_mu);
    }
    pthread_mutex_lock(&S.out_mu);
    if (got)
        S.est = fresh;
    static const int codes[7] = {200, 400, 401, 404, 405, 413, 500};
    ts_sb_printf(&b, "# HELP tessera_requests_total HTTP requests by status\n"
                     "# TYPE tessera_requests_total counter\n");
    for (int i = 0; i < 7; i++)
        ts_sb_printf(&b, "tessera_requests_total{status=\"%d\"} %llu\n",
                     codes[i], (unsigned long long)S.status_count[i]);
    ts_sb_printf(
        &b,
        "# TYPE tessera_prompt_tokens_total counter\n"
        "tessera_prompt_tokens_total %llu\n"
        "# TYPE tessera_generation_tokens_total counter\n"
        "tessera_generation_tokens_total %llu\n"
        "# TYPE tessera_requests_running gauge\n"
        "tessera_requests_running %d\n"
        "# TYPE tessera_requests_waiting gauge\n"
        "tessera_requests_waiting %d\n"
        "# TYPE tessera_kv_blocks_used gauge\n"
        "tessera_kv_blocks_used %lld\n"
        "# TYPE tessera_kv_blocks_total gauge\n"
        "tessera_kv_blocks_total %lld\n"
        "# TYPE tessera_kv_blocks_cached gauge\n"
        "tessera_kv_blocks_cached %lld\n"
        "# TYPE tessera_prefix_cache_hit_rate gauge\n"
        "tessera_prefix_cache_hit_rate %.6f\n"
        "# HELP tessera_prefix_cache_queries_total prompt tokens "
        "looked up in the prefix cache\n"
        "# TYPE tessera_prefix_cache_queries_total counter\n"
        "tessera_prefix_cache_queries_total %lld\n"
        "# HELP tessera_prefix_cache_hits_total prompt tokens found "
        "in the prefix cache\n"
        "# TYPE tessera_prefix_cache_hits_total counter\n"
        "tessera_prefix_cache_hits_total %lld\n"
        "# TYPE tessera_kv_transfers_sent_total counter\n"
        "tessera_kv_transfers_sent_total %llu\n"
        "# TYPE tessera_kv_transfers_send_failed_total counter\n"
        "tessera_kv_transfers_send_failed_total %llu\n"
        "# TYPE tessera_kv_transfers_received_total counter\n"
        "tessera_kv_transfers_received_total %llu\n"
        "# TYPE tessera_kv_transfers_refused_total counter\n"
        "tessera_kv_transfers_refused_total %llu\n"
        "# TYPE tessera_kv_blocks_sent_total counter\n"
        "tessera_kv_blocks_sent_total %llu\n"
        "# TYPE tessera_kv_blocks_adopted_total counter\n"
        "tessera_kv_blocks_adopted_total %llu\n",
        (unsigned long long)S.prompt_tokens,
        (unsigned long long)S.generated_tokens, S.est.running, S.est.waiting,
        (long long)S.est.blocks_in_sequences, (long long)S.est.blocks_total,
        (long long)S.est.cached_blocks,
        S.est.prompt_tokens
            ? (double)S.est.prefix_hit_tokens / S.est.prompt_tokens
            : 0.0,
        (long long)S.est.prompt_tokens, (long long)S.est.prefix_hit_tokens,
        (unsigned long long)S.kvx_sent, (unsigned long long)S.kvx_send_failed,
        (unsigned long long)S.kvx_received, (unsigned long long)S.kvx_refused,
        (unsigned long long)S.kvx_blocks_sent,
        (unsigned long long)S.kvx_blocks_adopted);
    const struct {
        const char *name;
        const uint64_t *h;
        const double *bounds;
        int nb;
        double sum;
    } hs[2] = {{"tessera_time_to_first_token_seconds", S.ttft_hist, TTFT_B,
                N_TTFT, S.ttft_sum},
               {"tessera_inter_token_latency_seconds", S.itl_hist, ITL_B, N_ITL,
                S.itl_sum}};
    for (int k = 0; k < 2; k++) {
        uint64_t cum = 0;
        ts_sb_printf(&b, "# TYPE %s histogram\n", hs[k].name);
        for (int i = 0; i <= hs[k].nb; i++) {
            cum += hs[k].h[i];
            if (i < hs[k].nb)
                ts_sb_printf(&b, "%s_bucket{le=\"%g\"} %llu\n", hs[k].name,
                             hs[k].bounds[i], (unsigned long long)cum);
            else
                ts_sb_printf(&b, "%s_bucket{le=\"+Inf\"} %llu\n", hs[k].name,
                             (unsigned long long)cum);
        }
        ts_sb_printf(&b, "%s_sum %.6f\n%s_count %llu\n", hs[k].name, hs[k].sum,
                     hs[k].name, (unsigned long long)cum);
    }
    pthread_mutex_unlock(&S.out_mu);
    enum MHD_Result ret =
        send_text(c, 200, "text/plain; version=0.0.4", b.p ? b.p : "");
    free(b.p);
    return ret;
}

/* /v1/kv_events: JSON lines, from ?since=SEQ (default: all kept) */
static ssize_t events_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    hreq *r = cls;
    if (r->pend_off == r->pend.n) {
        r->pend.n = r->pend_off = 0;
        pthread_mutex_lock(&S.out_mu);
        while (!r->pend.n) {
            if (r->events_next < S.first_event_seq)
                r->events_next = S.first_event_seq; /* older ones dropped */
            for (size_t i = 0; i < S.n_events; i++) {
                const ts_kv_event *e = &S.events[i];
                if (e->seq < r->events_next)
                    continue;
                ts_sb_printf(
                    &r->pend,
                    "{\"seq\":%llu,\"type\":\"%s\",\"block_hash\":\"%016"
                    "llx\",\"parent_hash\":\"%016llx\",\"block_size\":%d",
                    (unsigned long long)e->seq,
                    e->kind == TS_KV_BLOCK_STORED ? "BlockStored"
                                                  : "BlockRemoved",
                    (unsigned long long)e->hash,
                    (unsigned long long)e->parent_hash, e->block_size);
                if (e->kind == TS_KV_BLOCK_STORED) {
                    ts_sb_add(&r->pend, ",\"token_ids\":[", 14);
                    int nt = e->block_size < TS_KV_EVENT_MAX_TOKENS
                                 ? e->block_size
                                 : TS_KV_EVENT_MAX_TOKENS;
                    for (int t = 0; t < nt; t++)
                        ts_sb_printf(&r->pend, "%s%d", t ? "," : "",
                                     e->tokens[t]);
                    ts_sb_add(&r->pend, "]", 1);
                }
                ts_sb_add(&r->pend, "}\n", 2);
                r->events_next = e->seq + 1;
            }
            if (r->pend.n || g_signal)
                break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            if (pthread_cond_timedwait(&S.out_cv, &S.out_mu, &ts))
                ts_sb_add(&r->pend, "\n", 1); /* keep-alive: an empty line */
        }
        pthread_mutex_unlock(&S.out_mu);
        if (!r->pend.n)
            return MHD_CONTENT_READER_END_OF_STREAM;
    }
    size_t n = r->pend.n - r->pend_off < max ? r->pend.n - r->pend_off : max;
    memcpy(buf, r->pend.p + r->pend_off, n);
    r->pend_off += n;
    return (ssize_t)n;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    (void)cls, (void)version;
    hreq *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r)
            return MHD_NO;
        *con_cls = r;
        r->unauthorized =
            S.api_key && !strncmp(url, "/v1/", 4) &&
            !ts_bearer_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                      "Authorization"),
                          S.api_key);
        return MHD_YES;
    }
    if (*upload_size) {
        if (r->unauthorized)
            ; /* read and dropped: a stranger's body takes no memory */
        else if (r->body.n + *upload_size > MAX_BODY)
            r->too_big = true;
        else
            ts_sb_add(&r->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->unauthorized)
        return send_error(c, 401, "invalid_request_error", NULL,
                          "invalid_api_key",
                          "a missing or wrong API key: send "
                          "\"Authorization: Bearer KEY\" with the key this "
                          "server was started with (--api-key)");
    if (r->too_big)
        return send_error(c, 413, "invalid_request_error", NULL, NULL,
                          "the body is larger than %d bytes", MAX_BODY);
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health") && get) {
        if (S.kv_fd < 0)
            return send_text(c, 200, "application/json", "{\"status\":\"ok\"}");
        return send_json(c, 200,
                         json_pack("{s:s, s:i, s:I}", "status", "ok",
                                   "kv_transfer_port", S.kv_port, "block_size",
                                   (json_int_t)S.block_size));
    }
    if (S.no_kv_events &&
        (!strcmp(url, "/v1/kv_cache") || !strcmp(url, "/v1/kv_events")))
        return send_error(c, 404, "invalid_request_error", NULL, NULL,
                          "this server publishes no KV events "
                          "(--no-kv-events)");
    if (!strcmp(url, "/metrics") && get)
        return metrics(c);
    if (!strcmp(url, "/v1/models") && get) {
        json_t *m = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:I}]}", "object",
                              "list", "data", "id", S.model, "object", "model",
                              "created", (json_int_t)0, "owned_by", "tessera",
                              "max_model_len", (json_int_t)S.max_positions);
        return send_json(c, 200, m);
    }
    if (!strcmp(url, "/v1/kv_cache") && get) { /* the snapshot */
        eng_lock();
        ts_engine_stats st;
        ts_engine_get_stats(S.eng, &st);
        size_t cap = (size_t)st.blocks_total;
        uint64_t *h = malloc(sizeof *h * cap), *p = malloc(sizeof *p * cap);
        size_t n = h && p ? ts_engine_cached_blocks(S.eng, h, p, cap) : 0;
        pthread_mutex_unlock(&S.eng_mu);
        pthread_mutex_lock(&S.out_mu);
        uint64_t seq = S.n_events ? S.events[S.n_events - 1].seq : 0;
        pthread_mutex_unlock(&S.out_mu);
        json_t *blocks = json_array();
        for (size_t i = 0; i < n; i++) {
            char a[17], b[17];
            snprintf(a, sizeof a, "%016llx", (unsigned long long)h[i]);
            snprintf(b, sizeof b, "%016llx", (unsigned long long)p[i]);
            json_array_append_new(blocks, json_pack("{s:s, s:s}", "block_hash",
                                                    a, "parent_hash", b));
        }
        free(h), free(p);
        return send_json(c, 200,
                         json_pack("{s:I, s:I, s:o}", "block_size",
                                   (json_int_t)S.block_size, "last_event_seq",
                                   (json_int_t)seq, "blocks", blocks));
    }
    if (!strcmp(url, "/v1/kv_events") && get) {
        const char *since =
            MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "since");
        r->kind = REQ_EVENTS;
        r->events_next = since ? strtoull(since, NULL, 10) : 0;
        struct MHD_Response *resp = MHD_create_response_from_callback(
            MHD_SIZE_UNKNOWN, 16384, events_reader, r, NULL);
        MHD_add_response_header(resp, "Content-Type", "application/jsonl");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        count_status(200);
        return ret;
    }
    bool comp = !strcmp(url, "/v1/completions"),
         chat = !strcmp(url, "/v1/chat/completions");
    if ((comp || chat) && post) {
        r->kind = chat ? REQ_CHAT : REQ_COMPLETION;
        return generate(c, r);
    }
    if (comp || chat || !strcmp(url, "/v1/models") || !strcmp(url, "/health") ||
        !strcmp(url, "/metrics") || !strcmp(url, "/v1/kv_events") ||
        !strcmp(url, "/v1/kv_cache"))
        return send_error(c, 405, "invalid_request_error", NULL, NULL,
                          "%s is not allowed on %s", method, url);
    return send_error(c, 404, "invalid_request_error", NULL, NULL,
                      "no endpoint %s %s", method, url);
}

/* a request's end: a client gone mid-generation aborts its choices */
static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    hreq *r = *con_cls;
    if (!r)
        return;
    int64_t ids[MAX_CHOICES];
    int n = 0;
    pthread_mutex_lock(&S.out_mu);
    for (int i = 0; i < r->n; i++)
        if (!r->ch[i].finished) {
            ids[n++] = r->ch[i].eid;
            r->ch[i].finished = true;
            active_remove(&r->ch[i]);
        }
    pthread_mutex_unlock(&S.out_mu);
    if (n) {
        eng_lock();
        for (int i = 0; i < n; i++)
            if (ts_engine_abort(S.eng, ids[i]) != TS_OK)
                ts_clear_error(S.ctx);
        pthread_mutex_unlock(&S.eng_mu);
    }
    for (int i = 0; i < r->n; i++)
        free(r->ch[i].text.p), free(r->ch[i].lp);
    for (int k = 0; k < r->n_stops; k++)
        free(r->stops[k]);
    free(r->body.p), free(r->pend.p), free(r->kv_ids), free(r);
    *con_cls = NULL;
}

static void on_signal(int sig) {
    g_signal = sig;
}

/* ---- run ---- */

int ts_server_run(const ts_server_options *o) {
    if (!o || !o->model_dir) {
        fprintf(stderr, "tessera serve: no model folder\n");
        return 1;
    }
    memset(&S, 0, sizeof S);
    S.kv_fd = -1;
    S.no_kv_events = o->no_kv_events;
    S.api_key = o->api_key && *o->api_key ? o->api_key : NULL;
    int max_conns = o->max_connections > 0 ? o->max_connections
                                           : TS_SERVER_DEFAULT_MAX_CONNECTIONS,
        per_client = o->max_connections_per_client > 0
                         ? o->max_connections_per_client
                         : TS_SERVER_DEFAULT_PER_CLIENT,
        timeout_s = o->conn_timeout_s > 0 ? o->conn_timeout_s
                                          : TS_SERVER_DEFAULT_TIMEOUT_S;
    S.timeout_ms = timeout_s * 1000;
    ts_kv_peers peers;
    if (o->kv_peers) {
        char err[400];
        if (ts_kv_peers_parse(o->kv_peers, &peers, err, sizeof err)) {
            fprintf(stderr, "tessera serve: %s\n", err);
            return 1;
        }
        S.kv_peers = &peers;
    }
    ts_kv_senders senders;
    if (o->kv_senders) {
        char err[400];
        if (ts_kv_senders_parse(o->kv_senders, &senders, err, sizeof err)) {
            fprintf(stderr, "tessera serve: %s\n", err);
            return 1;
        }
        S.kv_senders = &senders;
    }
    const char *fault = getenv("TESSERA_FAULT_KV_CORRUPT");
    S.fault_corrupt = fault && *fault && strcmp(fault, "0");
    if (ts_ctx_new(&S.ctx, NULL) != TS_OK)
        return 1;
    ts_set_grad_enabled(S.ctx, false);
    ts_load_options lo = {.weight_dtype = o->weight_dtype,
                          .device_map = o->device_map,
                          .no_check_weights = o->no_check_weights};
    int rc = 1;
    struct MHD_Daemon *d = NULL;
    pthread_t engine_thread, kv_thread;
    bool thread_started = false, kv_started = false;
    if (ts_model_dir_check(S.ctx, o->model_dir, TS_MODEL_ALL) != TS_OK ||
        ts_lm_load(S.ctx, o->model_dir, &lo, &S.lm) != TS_OK ||
        ts_tokenizer_load(S.ctx, o->model_dir, &S.tok) != TS_OK ||
        ts_tokenizer_check_vocab(S.ctx, S.tok, ts_lm_config(S.lm)->vocab) !=
            TS_OK) {
        fprintf(stderr, "tessera serve: %s\n", ts_errmsg(S.ctx));
        goto done;
    }
    if (ts_chat_load(S.ctx, o->model_dir, &S.chat) != TS_OK)
        ts_clear_error(S.ctx); /* no chat template: completions only */
    if (ts_engine_new(S.ctx, ts_lm_decoder(S.lm), &o->engine, &S.eng) !=
        TS_OK) {
        fprintf(stderr, "tessera serve: %s\n", ts_errmsg(S.ctx));
        goto done;
    }
    const ts_model_config *mc = ts_lm_config(S.lm);
    S.max_positions = mc->max_positions;
    S.block_size = o->engine.block_size;
    if (mc->eos_token_id >= 0)
        S.eos[S.n_eos++] = (int32_t)mc->eos_token_id;
    char gp[4096];
    snprintf(gp, sizeof gp, "%s/generation_config.json", o->model_dir);
    json_t *gc = json_load_file(gp, 0, NULL);
    json_t *ge = json_object_get(gc, "eos_token_id");
    size_t gi;
    json_t *gv;
    if (json_is_integer(ge) && S.n_eos < 8)
        S.eos[S.n_eos++] = (int32_t)json_integer_value(ge);
    json_array_foreach(json_is_array(ge) ? ge : NULL, gi,
                       gv) if (json_is_integer(gv) && S.n_eos < 8)
        S.eos[S.n_eos++] = (int32_t)json_integer_value(gv);
    json_decref(gc);
    const char *eot = S.chat ? ts_chat_eos_token(S.chat) : "";
    int32_t eot_id = *eot ? ts_tokenizer_token_id(S.tok, eot) : -1;
    if (eot_id >= 0 && S.n_eos < 8)
        S.eos[S.n_eos++] = eot_id;
    ts_engine_set_eos(S.eng, S.eos, S.n_eos);
    if (o->model_name)
        snprintf(S.model, sizeof S.model, "%s", o->model_name);
    else {
        const char *base = strrchr(o->model_dir, '/');
        snprintf(S.model, sizeof S.model, "%s",
                 base && base[1] ? base + 1 : o->model_dir);
    }
    S.events = malloc(sizeof *S.events * EVENT_KEEP);
    pthread_mutex_init(&S.eng_mu, NULL);
    pthread_mutex_init(&S.out_mu, NULL);
    pthread_mutex_init(&S.tok_mu, NULL);
    pthread_cond_init(&S.eng_cv, NULL);
    pthread_cond_init(&S.out_cv, NULL);
    if (pthread_create(&engine_thread, NULL, engine_loop, NULL)) {
        fprintf(stderr, "tessera serve: cannot start the engine thread\n");
        goto done;
    }
    thread_started = true;
    if (o->kv_port >= 0) {
        char err[300];
        S.kv_fd = ts_kvx_listen(o->host ? o->host : "127.0.0.1", o->kv_port,
                                &S.kv_port, err, sizeof err);
        if (S.kv_fd < 0) {
            fprintf(stderr, "tessera serve: %s\n", err);
            goto done;
        }
        if (pthread_create(&kv_thread, NULL, kv_listen_loop, NULL)) {
            fprintf(stderr, "tessera serve: cannot start the KV thread\n");
            goto done;
        }
        kv_started = true;
    }
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host ? o->host : "127.0.0.1", &addr.sin_addr) !=
        1) {
        fprintf(stderr, "tessera serve: bad --host \"%s\" (an IPv4 address)\n",
                o->host);
        goto done;
    }
    /* the timeout is MHD's idle limit: it runs while a request is read
     * and a response written, not while the handler or a stream's
     * callback waits for the engine (a stream writes a keep-alive every
     * second); a client that sends nothing is dropped after it */
    d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
            MHD_USE_POLL |
            MHD_USE_ITC, /* no MHD log: a client hanging up is normal */
        (uint16_t)o->port, NULL, NULL, handle, NULL, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conns,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)per_client,
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "tessera serve: cannot listen on %s:%d\n",
                o->host ? o->host : "127.0.0.1", o->port);
        goto done;
    }
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = info ? info->port : o->port;
    ts_engine_stats est0;
    ts_engine_get_stats(S.eng, &est0);
    fprintf(stderr,
            "tessera serve: %s on http://%s:%d (%lld KV blocks of %lld "
            "positions)\n",
            S.model, o->host ? o->host : "127.0.0.1", port,
            (long long)est0.blocks_total, (long long)o->engine.block_size);
    if (S.kv_fd >= 0)
        fprintf(stderr, "tessera serve: KV transfers on %s:%d\n",
                o->host ? o->host : "127.0.0.1", S.kv_port);
    if (o->on_listen)
        o->on_listen(port, o->on_listen_arg);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    while (!g_signal)
        usleep(100000);
    /* drain: no new connections; running requests finish */
    MHD_quiesce_daemon(d);
    for (;;) {
        pthread_mutex_lock(&S.out_mu);
        int left = S.n_active;
        pthread_cond_broadcast(&S.out_cv);
        pthread_mutex_unlock(&S.out_mu);
        if (!left)
            break;
        usleep(50000);
    }
    fprintf(stderr, "tessera serve: stopped (signal %d)\n", (int)g_signal);
    rc = 0;
done:
    if (kv_started) {
        __atomic_store_n(&S.kv_stop, true, __ATOMIC_SEQ_CST);
        pthread_join(kv_thread, NULL);
        while (__atomic_load_n(&S.kv_conns, __ATOMIC_SEQ_CST))
            usleep(10000); /* transfers in flight end (--conn-timeout) */
    }
    if (S.kv_fd >= 0)
        close(S.kv_fd);
    if (d)
        MHD_stop_daemon(d);
    if (thread_started) {
        eng_lock();
        S.stop_engine = true;
        pthread_cond_signal(&S.eng_cv);
        pthread_mutex_unlock(&S.eng_mu);
        pthread_join(engine_thread, NULL);
    }
    ts_engine_free(S.eng);
    ts_chat_free(S.chat);
    ts_tokenizer_free(S.tok);
    ts_lm_free(S.lm);
    free(S.active), free(S.events);
    ts_ctx_free(S.ctx);
    return rc;
}
