/* server.c — the OpenAI-compatible HTTP server (GNU libmicrohttpd, a
 * thread per connection, HTTP/1.1 keep-alive) over one engine.
 *
 * Threads and locks: connection threads parse and validate a request,
 * render the chat template and tokenize (tok_mu: the tokenizer and the
 * template report errors through one context), then add the request's
 * choices to the engine (eng_mu) and to the active list (out_mu). One
 * engine thread runs ts_engine_step under eng_mu, then, under out_mu,
 * hands each output to its choice (a token: decoded to text, stop strings
 * cut, openai.c; an embedding: embeddings.c), publishes the KV events and
 * wakes the connections (out_cv). A
 * streaming response is a content callback that waits on out_cv and writes
 * Server-Sent Events; a client that goes away ends its request (MHD's
 * completion callback) and its engine requests are aborted, freeing their
 * blocks. Lock order: out_mu before tok_mu; eng_mu is never taken with
 * another lock held.
 * This file owns HTTP plumbing, routing, CORS, the engine thread, KV
 * transfer and the lifecycle (the OpenAI protocol is openai.c, the
 * embeddings embeddings.c, /tokenize and co. tokenize.c, metrics and the
 * request log metrics.c), and applies the checks of auth.h (the API key,
 * --kv-peers, --kv-senders, --allowed-origins) and the listener limits;
 * scheduling is the engine's. */
#define _GNU_SOURCE
#include "server_internal.h"

#include "tessera_io.h"
#include "tessera_models.h"
#include "tessera_tokenizer.h"

#include "auth.h"
#include "chat_page.h"
#include "kv_transfer.h"
#include "prompt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

srv_state srv;
volatile sig_atomic_t srv_signal;

/* the request this connection thread is answering (MHD runs one thread
 * per connection): where the status sent is recorded for its log line */
static __thread hreq *cur_req;

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void srv_count_status(int code) {
    int i = code == 200   ? 0
            : code == 400 ? 1
            : code == 401 ? 2
            : code == 404 ? 3
            : code == 405 ? 4
            : code == 413 ? 5
                          : 6;
    if (cur_req)
        cur_req->status = code;
    pthread_mutex_lock(&srv.out_mu);
    srv.status_count[i]++;
    pthread_mutex_unlock(&srv.out_mu);
}

void srv_observe(uint64_t *hist, const double *bounds, int nb, double *sum,
                 double v) {
    int i = 0;
    while (i < nb && v > bounds[i])
        i++;
    hist[i]++;
    *sum += v;
}

/* ---- responses ---- */

enum MHD_Result srv_send_text(struct MHD_Connection *c, int code,
                              const char *type, const char *text) {
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", type);
    srv_cors_headers(c, r);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)code, r);
    MHD_destroy_response(r);
    srv_count_status(code);
    return ret;
}

enum MHD_Result srv_send_json(struct MHD_Connection *c, int code, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    enum MHD_Result ret =
        srv_send_text(c, code, "application/json", s ? s : "{}");
    free(s);
    return ret;
}

/* OpenAI's error object */
enum MHD_Result srv_send_error(struct MHD_Connection *c, int code,
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
    return srv_send_json(c, code, e);
}

/* ---- CORS ---- */

void srv_cors_headers(struct MHD_Connection *c, struct MHD_Response *resp) {
    if (!srv.origins)
        return;
    const char *allow = ts_origins_allow(
        srv.origins, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"));
    /* a cache must not hand one origin's answer to another */
    if (!srv.origins->any)
        MHD_add_response_header(resp, "Vary", "Origin");
    if (allow)
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", allow);
}

/* a header value fit to echo: tokens, commas and spaces, not too long */
static bool header_list_ok(const char *v) {
    if (!v || strlen(v) > 512)
        return false;
    for (; *v; v++)
        if (!(*v == ',' || *v == ' ' || *v == '-' || *v == '_' ||
              (*v >= '0' && *v <= '9') || (*v >= 'a' && *v <= 'z') ||
              (*v >= 'A' && *v <= 'Z')))
            return false;
    return true;
}

/* OPTIONS on any path: a browser's preflight (no API key needed) */
static enum MHD_Result preflight(struct MHD_Connection *c) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Allow", "GET, POST, OPTIONS");
    srv_cors_headers(c, r);
    const char *origin =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (ts_origins_allow(srv.origins, origin)) {
        const char *want = MHD_lookup_connection_value(
            c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        char hdrs[600];
        snprintf(hdrs, sizeof hdrs, "Authorization, Content-Type%s%s",
                 header_list_ok(want) && *want ? ", " : "",
                 header_list_ok(want) ? want : "");
        MHD_add_response_header(r, "Access-Control-Allow-Methods",
                                "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", hdrs);
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    }
    enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    if (cur_req)
        cur_req->status = 204;
    return ret;
}

/* ---- the engine thread ---- */

void srv_active_remove(choice *c) {
    for (int i = 0; i < srv.n_active; i++)
        if (srv.active[i] == c) {
            srv.active[i] = srv.active[--srv.n_active];
            return;
        }
}

/* a token for choice c (out_mu held); returns true when c must be
 * aborted in the engine (a stop string ended it) */
/* the engine's pending KV events into the kept window (eng_mu and out_mu
 * held); ev: room for 256 */
static void collect_events(ts_kv_event *ev) {
    size_t ne;
    while ((ne = ts_engine_drain_events(srv.eng, ev, 256)) > 0) {
        if (srv.n_events + ne > EVENT_KEEP) { /* drop the oldest */
            size_t drop = srv.n_events + ne - EVENT_KEEP;
            memmove(srv.events, srv.events + drop,
                    sizeof *srv.events * (srv.n_events - drop));
            srv.n_events -= drop;
            srv.first_event_seq += drop;
        }
        if (!srv.n_events)
            srv.first_event_seq = ev[0].seq;
        memcpy(srv.events + srv.n_events, ev, sizeof *ev * ne);
        srv.n_events += ne;
    }
}

/* eng_mu for any thread but the engine's. The engine thread releases
 * eng_mu between steps and takes it straight back; a mutex is not fair, so
 * a connection waiting for it (admission, /v1/kv_cache, a KV import) could
 * wait for many steps. A waiter announces itself in eng_want and the
 * engine thread yields until the waiters have had their turn. */
void srv_eng_lock(void) {
    atomic_fetch_add(&srv.eng_want, 1);
    pthread_mutex_lock(&srv.eng_mu);
    atomic_fetch_sub(&srv.eng_want, 1);
}

static choice *find_active(int64_t eid) {
    for (int a = 0; a < srv.n_active; a++)
        if (srv.active[a]->eid == eid)
            return srv.active[a];
    return NULL;
}

/* the first output of any of r's choices: when it came and how long r
 * waited before the engine first scheduled it (the engine's figure) */
static void first_output(hreq *r, const ts_engine_output *o) {
    if (r->t_first > 0)
        return;
    r->t_first = srv_now();
    r->queue_s = o->queue_s;
}

static void *engine_loop(void *arg) {
    (void)arg;
    ts_engine_output *out = malloc(sizeof *out * 4096);
    ts_kv_event *ev = malloc(sizeof *ev * 256);
    int64_t *aborts = malloc(sizeof *aborts * 4096);
    for (;;) {
        for (int spin = 0; spin < 10000 && atomic_load(&srv.eng_want); spin++)
            sched_yield(); /* let waiting connections in first */
        pthread_mutex_lock(&srv.eng_mu);
        while (!srv.stop_engine && !ts_engine_has_work(srv.eng))
            pthread_cond_wait(&srv.eng_cv, &srv.eng_mu);
        if (srv.stop_engine && !ts_engine_has_work(srv.eng)) {
            pthread_mutex_unlock(&srv.eng_mu);
            break;
        }
        int k = 0;
        ts_status st = ts_engine_step(srv.eng, out, 4096, &k);
        bool failed = st != TS_OK;
        if (failed) {
            fprintf(stderr, "tessera serve: engine step: %s\n",
                    ts_errmsg(srv.ctx));
            ts_clear_error(srv.ctx);
        }
        ts_engine_stats est;
        ts_engine_get_stats(srv.eng, &est);
        pthread_mutex_lock(&srv.out_mu);
        collect_events(ev);
        srv.est = est;
        int n_abort = 0;
        for (int i = 0; i < k; i++) {
            choice *c = find_active(out[i].id);
            if (!c) { /* its client is gone: what it carries is dropped */
                free(out[i].embedding), free(out[i].prompt_lp);
                continue;
            }
            first_output(c->req, &out[i]);
            if (c->req->embed)
                srv_embed_deliver(c, &out[i]);
            else if (srv_deliver(c, &out[i]) && n_abort < 4096)
                aborts[n_abort++] = c->eid;
        }
        if (failed) /* nothing can run: every waiting choice ends */
            while (srv.n_active) {
                choice *c = srv.active[0];
                c->finished = true, c->finish_reason = "abort";
                c->safe = c->text.n;
                if (n_abort < 4096)
                    aborts[n_abort++] = c->eid;
                srv_active_remove(c);
            }
        pthread_cond_broadcast(&srv.out_cv);
        pthread_mutex_unlock(&srv.out_mu);
        for (int i = 0; i < n_abort; i++)
            if (ts_engine_abort(srv.eng, aborts[i]) != TS_OK)
                ts_clear_error(srv.ctx); /* already finished */
        pthread_mutex_unlock(&srv.eng_mu);
    }
    free(out), free(ev), free(aborts);
    return NULL;
}

/* ---- KV transfer ---- */

/* the engine's KV type on the wire (TS_KVX_DTYPE_*), set at startup */
static uint32_t srv_kvx_dtype;

static uint32_t kvx_dtype_of(ts_kv_dtype dt) {
    return dt == TS_KV_BF16   ? TS_KVX_DTYPE_BF16
           : dt == TS_KV_INT8 ? TS_KVX_DTYPE_INT8
                              : TS_KVX_DTYPE_F32;
}

static ts_kvx_geometry geometry(uint32_t n_blocks) {
    const ts_model_config *mc = ts_decoder_get_config(ts_lm_decoder(srv.lm));
    return (ts_kvx_geometry){.block_size = (uint32_t)srv.block_size,
                             .layers = (uint32_t)mc->layers,
                             .kv_heads = (uint32_t)mc->kv_heads,
                             .head_dim = (uint32_t)mc->head_dim,
                             .dtype = srv_kvx_dtype,
                             .n_blocks = n_blocks};
}

/* a finished prefill request's prompt blocks to its target; the
 * response's kv_transfer_params */
json_t *srv_send_prefill(hreq *r) {
    size_t per = (size_t)ts_engine_block_bytes(srv.eng);
    size_t nb = r->kv_n / (size_t)srv.block_size;
    void *kv = malloc(nb * per + 1);
    char err[600] = "";
    uint32_t adopted = 0;
    size_t got = 0, len = 0;
    int rc = -1;
    if (kv) {
        srv_eng_lock();
        got = ts_engine_export_prefix(srv.eng, r->kv_ids, r->kv_n, kv, nb);
        pthread_mutex_unlock(&srv.eng_mu);
        ts_kvx_blocks b = {
            .g = geometry((uint32_t)got), .tokens = r->kv_ids, .kv = kv};
        uint8_t *f = ts_kvx_encode(&b, &len);
        if (f && srv.fault_corrupt && len > TS_KVX_HEADER + TS_KVX_META)
            f[len - 1] ^= 0x40; /* fault injection: one bit of the data */
        rc = f ? ts_kvx_send(r->kv_target, f, len, 30000, &adopted, err,
                             sizeof err)
               : -1;
        free(f);
    }
    if (!kv || (rc && !*err))
        snprintf(err, sizeof err, "out of memory for %zu KV blocks", nb);
    free(kv);
    pthread_mutex_lock(&srv.out_mu);
    if (rc)
        srv.kvx_send_failed++;
    else
        srv.kvx_sent++, srv.kvx_blocks_sent += got;
    pthread_mutex_unlock(&srv.out_mu);
    if (rc) {
        fprintf(stderr, "tessera serve: %s\n", err);
        return json_pack("{s:s, s:s, s:I}", "status", "error", "message", err,
                         "blocks", (json_int_t)got);
    }
    return json_pack("{s:s, s:I, s:I, s:I, s:I}", "status", "ok", "blocks",
                     (json_int_t)got, "adopted", (json_int_t)adopted, "tokens",
                     (json_int_t)(got * (size_t)srv.block_size), "bytes",
                     (json_int_t)len);
}

/* the decode side: a geometry check (b NULL), then the adoption */
static int adopt_blocks(void *arg, const ts_kvx_geometry *g,
                        const ts_kvx_blocks *b, uint32_t *adopted, char *err,
                        size_t errcap) {
    (void)arg;
    ts_kvx_geometry me = geometry(g->n_blocks), same_type = *g;
    same_type.dtype = me.dtype;
    if (memcmp(&me, &same_type, sizeof me)) {
        snprintf(err, errcap,
                 "KV blocks of another model: block_size %u, layers %u, "
                 "kv_heads %u, head_dim %u, dtype %s (this server: %u, %u, "
                 "%u, %u, %s)",
                 g->block_size, g->layers, g->kv_heads, g->head_dim,
                 ts_kvx_dtype_name(g->dtype), me.block_size, me.layers,
                 me.kv_heads, me.head_dim, ts_kvx_dtype_name(me.dtype));
        return -1;
    }
    if (g->dtype != me.dtype) {
        snprintf(err, errcap,
                 "KV blocks of type %s, but this server's KV cache is %s "
                 "(start both servers with the same --kv-dtype)",
                 ts_kvx_dtype_name(g->dtype), ts_kvx_dtype_name(me.dtype));
        return -1;
    }
    if (!b)
        return 0;
    ts_kv_event ev[256];
    size_t got = 0;
    srv_eng_lock();
    ts_status st =
        ts_engine_import_prefix(srv.eng, b->tokens, g->n_blocks, b->kv, &got);
    if (st != TS_OK) {
        snprintf(err, errcap, "%s", ts_errmsg(srv.ctx));
        ts_clear_error(srv.ctx);
    }
    pthread_mutex_lock(&srv.out_mu);
    collect_events(ev);
    if (st == TS_OK)
        srv.kvx_blocks_adopted += got;
    pthread_cond_broadcast(&srv.out_cv);
    pthread_mutex_unlock(&srv.out_mu);
    pthread_mutex_unlock(&srv.eng_mu);
    *adopted = (uint32_t)got;
    return st == TS_OK ? 0 : -1;
}

static void *kv_conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    ts_engine_stats st;
    srv_eng_lock();
    ts_engine_get_stats(srv.eng, &st);
    pthread_mutex_unlock(&srv.eng_mu);
    /* room for a block of the widest type (f32), so that blocks of another
     * type reach the geometry check and its message */
    const ts_model_config *mc = ts_decoder_get_config(ts_lm_decoder(srv.lm));
    int64_t widest = ts_kv_block_bytes(mc, srv.block_size);
    if (widest < ts_engine_block_bytes(srv.eng))
        widest = ts_engine_block_bytes(srv.eng);
    uint64_t per = (uint64_t)widest + 4 * (uint64_t)srv.block_size;
    int rc = ts_kvx_serve_connection(
        fd, adopt_blocks, NULL, TS_KVX_META + per * (uint64_t)st.blocks_total,
        srv.timeout_ms);
    pthread_mutex_lock(&srv.out_mu);
    if (rc)
        srv.kvx_refused++;
    else
        srv.kvx_received++;
    pthread_mutex_unlock(&srv.out_mu);
    __atomic_sub_fetch(&srv.kv_conns, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void *kv_listen_loop(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&srv.kv_stop, __ATOMIC_SEQ_CST)) {
        struct pollfd pf = {.fd = srv.kv_fd, .events = POLLIN};
        if (poll(&pf, 1, 200) <= 0)
            continue;
        struct sockaddr_in peer;
        socklen_t pl = sizeof peer;
        int fd =
            accept4(srv.kv_fd, (struct sockaddr *)&peer, &pl, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        if (!ts_kv_senders_allow(srv.kv_senders, (struct sockaddr *)&peer)) {
            close(fd); /* no reply: a stranger learns nothing */
            pthread_mutex_lock(&srv.out_mu);
            bool say = srv.kvx_refused < 10;
            srv.kvx_refused++;
            pthread_mutex_unlock(&srv.out_mu);
            char a[INET_ADDRSTRLEN] = "?";
            inet_ntop(AF_INET, &peer.sin_addr, a, sizeof a);
            if (say)
                fprintf(stderr,
                        "tessera serve: a KV connection from %s refused "
                        "(not in --kv-senders%s)\n",
                        a,
                        srv.kv_senders ? "" : ", which is loopback by default");
            continue;
        }
        pthread_t t;
        if (__atomic_add_fetch(&srv.kv_conns, 1, __ATOMIC_SEQ_CST) >
            TS_KV_MAX_CONNECTIONS) { /* busy: the sender recomputes */
            __atomic_sub_fetch(&srv.kv_conns, 1, __ATOMIC_SEQ_CST);
            close(fd);
            pthread_mutex_lock(&srv.out_mu);
            srv.kvx_refused++;
            pthread_mutex_unlock(&srv.out_mu);
            continue;
        }
        if (pthread_create(&t, NULL, kv_conn, (void *)(intptr_t)fd)) {
            __atomic_sub_fetch(&srv.kv_conns, 1, __ATOMIC_SEQ_CST);
            close(fd);
        } else
            pthread_detach(t);
    }
    return NULL;
}

/* ---- other endpoints ---- */

/* /v1/kv_events: JSON lines, from ?since=SEQ (default: all kept) */
static ssize_t events_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    hreq *r = cls;
    if (r->pend_off == r->pend.n) {
        r->pend.n = r->pend_off = 0;
        pthread_mutex_lock(&srv.out_mu);
        while (!r->pend.n) {
            if (r->events_next < srv.first_event_seq)
                r->events_next = srv.first_event_seq; /* older ones dropped */
            for (size_t i = 0; i < srv.n_events; i++) {
                const ts_kv_event *e = &srv.events[i];
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
            if (r->pend.n || srv_signal)
                break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            if (pthread_cond_timedwait(&srv.out_cv, &srv.out_mu, &ts))
                ts_sb_add(&r->pend, "\n", 1); /* keep-alive: an empty line */
        }
        pthread_mutex_unlock(&srv.out_mu);
        if (!r->pend.n)
            return MHD_CONTENT_READER_END_OF_STREAM;
    }
    size_t n = r->pend.n - r->pend_off < max ? r->pend.n - r->pend_off : max;
    memcpy(buf, r->pend.p + r->pend_off, n);
    r->pend_off += n;
    return (ssize_t)n;
}

/* paths that need no API key: probes, the version and the chat page (a
 * browser loads it before anyone can type a key into it) */
static bool open_path(const char *url) {
    return !strcmp(url, "/health") || !strcmp(url, "/metrics") ||
           !strcmp(url, "/version") || !strcmp(url, "/");
}

/* a new request's record: what its log line names, whether it may go on */
static hreq *request_new(struct MHD_Connection *c, const char *url,
                         const char *method) {
    hreq *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    snprintf(r->method, sizeof r->method, "%s", method);
    snprintf(r->path, sizeof r->path, "%s", url);
    for (char *p = r->path; *p; p++)
        if (*p <= ' ' || *p >= 0x7f)
            *p = '?'; /* one request, one log line */
    for (char *p = r->method; *p; p++)
        if (*p <= ' ' || *p >= 0x7f)
            *p = '?';
    r->unauthorized =
        srv.api_key && strcmp(method, "OPTIONS") && !open_path(url) &&
        !ts_bearer_ok(
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
            srv.api_key);
    return r;
}

/* /v1/kv_cache: the prefix cache's blocks now */
static enum MHD_Result kv_cache_snapshot(struct MHD_Connection *c) {
    srv_eng_lock();
    ts_engine_stats st;
    ts_engine_get_stats(srv.eng, &st);
    size_t cap = (size_t)st.blocks_total;
    uint64_t *h = malloc(sizeof *h * cap), *p = malloc(sizeof *p * cap);
    size_t n = h && p ? ts_engine_cached_blocks(srv.eng, h, p, cap) : 0;
    pthread_mutex_unlock(&srv.eng_mu);
    pthread_mutex_lock(&srv.out_mu);
    uint64_t seq = srv.n_events ? srv.events[srv.n_events - 1].seq : 0;
    pthread_mutex_unlock(&srv.out_mu);
    json_t *blocks = json_array();
    for (size_t i = 0; i < n; i++) {
        char a[17], b[17];
        snprintf(a, sizeof a, "%016llx", (unsigned long long)h[i]);
        snprintf(b, sizeof b, "%016llx", (unsigned long long)p[i]);
        json_array_append_new(
            blocks, json_pack("{s:s, s:s}", "block_hash", a, "parent_hash", b));
    }
    free(h), free(p);
    return srv_send_json(c, 200,
                         json_pack("{s:I, s:I, s:o}", "block_size",
                                   (json_int_t)srv.block_size, "last_event_seq",
                                   (json_int_t)seq, "blocks", blocks));
}

static enum MHD_Result kv_events(struct MHD_Connection *c, hreq *r) {
    const char *since =
        MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "since");
    r->kind = REQ_EVENTS;
    r->events_next = since ? strtoull(since, NULL, 10) : 0;
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16384, events_reader, r, NULL);
    MHD_add_response_header(resp, "Content-Type", "application/jsonl");
    srv_cors_headers(c, resp);
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    srv_count_status(200);
    return ret;
}

static enum MHD_Result health(struct MHD_Connection *c) {
    if (srv.kv_fd < 0)
        return srv_send_text(c, 200, "application/json", "{\"status\":\"ok\"}");
    return srv_send_json(c, 200,
                         json_pack("{s:s, s:i, s:I}", "status", "ok",
                                   "kv_transfer_port", srv.kv_port,
                                   "block_size", (json_int_t)srv.block_size));
}

static enum MHD_Result models(struct MHD_Connection *c) {
    return srv_send_json(c, 200,
                         json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:I}]}",
                                   "object", "list", "data", "id", srv.model,
                                   "object", "model", "created", (json_int_t)0,
                                   "owned_by", "tessera", "max_model_len",
                                   (json_int_t)srv.max_positions));
}

/* the endpoints: path, method, handler (a body-less one takes c only) */
typedef struct {
    const char *path;
    bool post;
    enum MHD_Result (*get)(struct MHD_Connection *c);
    enum MHD_Result (*with)(struct MHD_Connection *c, hreq *r);
} route;

/* GET /: the chat page (chat_page.h; static bytes, sent without a copy) */
static enum MHD_Result chat_page(struct MHD_Connection *c) {
    size_t len = 0;
    const char *html = ts_chat_page_html(&len);
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, (void *)html, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    srv_cors_headers(c, r);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    srv_count_status(200);
    return ret;
}

static enum MHD_Result generate(struct MHD_Connection *c, hreq *r) {
    r->kind =
        !strcmp(r->path, "/v1/chat/completions") ? REQ_CHAT : REQ_COMPLETION;
    return srv_generate(c, r);
}

static const route routes[] = {
    {"/health", false, health, NULL},
    {"/metrics", false, srv_metrics, NULL},
    {"/version", false, srv_version, NULL},
    {"/", false, chat_page, NULL},
    {"/v1/models", false, models, NULL},
    {"/v1/kv_cache", false, kv_cache_snapshot, NULL},
    {"/v1/kv_events", false, NULL, kv_events},
    {"/v1/completions", true, NULL, generate},
    {"/v1/chat/completions", true, NULL, generate},
    {"/v1/embeddings", true, NULL, srv_embeddings},
    {"/tokenize", true, NULL, srv_tokenize},
    {"/detokenize", true, NULL, srv_detokenize},
};

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    (void)cls, (void)version;
    hreq *r = *con_cls;
    if (!r) {
        r = request_new(c, url, method);
        if (!r)
            return MHD_NO;
        *con_cls = r;
        return MHD_YES;
    }
    cur_req = r;
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
    if (!strcmp(method, "OPTIONS"))
        return preflight(c);
    if (r->unauthorized)
        return srv_send_error(c, 401, "invalid_request_error", NULL,
                              "invalid_api_key",
                              "a missing or wrong API key: send "
                              "\"Authorization: Bearer KEY\" with the key this "
                              "server was started with (--api-key)");
    if (r->too_big)
        return srv_send_error(c, 413, "invalid_request_error", NULL, NULL,
                              "the body is larger than %d bytes", MAX_BODY);
    if (srv.no_kv_events &&
        (!strcmp(url, "/v1/kv_cache") || !strcmp(url, "/v1/kv_events")))
        return srv_send_error(c, 404, "invalid_request_error", NULL, NULL,
                              "this server publishes no KV events "
                              "(--no-kv-events)");
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        const route *rt = &routes[i];
        if (strcmp(url, rt->path))
            continue;
        if (rt->post ? !post : !get)
            return srv_send_error(c, 405, "invalid_request_error", NULL, NULL,
                                  "%s is not allowed on %s (use %s)", method,
                                  url, rt->post ? "POST" : "GET");
        return rt->get ? rt->get(c) : rt->with(c, r);
    }
    return srv_send_error(c, 404, "invalid_request_error", NULL, NULL,
                          "no endpoint %s %s", method, url);
}

/* a request's end: a client gone mid-generation aborts its choices */
static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    hreq *r = *con_cls;
    if (!r)
        return;
    cur_req = NULL;
    srv_request_end(r);
    if (r->embed)
        srv_embed_free(r);
    int64_t ids[MAX_CHOICES];
    int n = 0;
    pthread_mutex_lock(&srv.out_mu);
    for (int i = 0; i < r->n; i++)
        if (!r->ch[i].finished) {
            ids[n++] = r->ch[i].eid;
            r->ch[i].finished = true;
            srv_active_remove(&r->ch[i]);
        }
    pthread_mutex_unlock(&srv.out_mu);
    if (n) {
        srv_eng_lock();
        for (int i = 0; i < n; i++)
            if (ts_engine_abort(srv.eng, ids[i]) != TS_OK)
                ts_clear_error(srv.ctx);
        pthread_mutex_unlock(&srv.eng_mu);
    }
    srv_openai_release(r);
    for (int i = 0; i < r->n; i++)
        free(r->ch[i].text.p), free(r->ch[i].lp);
    for (int k = 0; k < r->n_stops; k++)
        free(r->stops[k]);
    free(r->body.p), free(r->pend.p), free(r->kv_ids), free(r);
    *con_cls = NULL;
}

static void on_signal(int sig) {
    srv_signal = sig;
}

/* set from the start of ts_server_run to its return: a ts_server_stop
 * while the model loads ends the server as soon as it listens */
static volatile sig_atomic_t srv_running;

void ts_server_stop(void) {
    if (srv_running)
        srv_signal = -1; /* not a signal: asked by the host program */
}

/* why the last ts_server_run could not start (ts_server_last_error) */
static char srv_error[1024];

/* A startup failure: kept for ts_server_last_error and printed as the
 * CLI always printed it. */
static void startup_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static void startup_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(srv_error, sizeof srv_error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tessera serve: %s\n", srv_error);
}

const char *ts_server_last_error(void) {
    return srv_error;
}

/* ---- speculative decoding ---- */

/* The speculation options (o->engine.spec*, o->draft_model_dir) checked
 * and completed into e, as the engine will use them: a draft model implies
 * TS_SPEC_DRAFT; the defaults (4 tokens, n-grams 1..4) written out.
 * Messages name the CLI's flags (Python's keywords are the same words).
 * Nonzero after startup_error. */
static int spec_options(const ts_server_options *o, ts_engine_options *e) {
    const char *draft =
        o->draft_model_dir && *o->draft_model_dir ? o->draft_model_dir : NULL;
    if (e->spec < TS_SPEC_NONE || e->spec > TS_SPEC_DRAFT) {
        startup_error("--speculative %d: want ngram or draft", (int)e->spec);
        return 1;
    }
    if (draft && e->spec == TS_SPEC_NGRAM) {
        startup_error("--draft-model %s is for --speculative draft, not "
                      "ngram (prompt lookup needs no model)",
                      draft);
        return 1;
    }
    if (draft)
        e->spec = TS_SPEC_DRAFT;
    if (e->spec == TS_SPEC_DRAFT && !draft) {
        startup_error("--speculative draft needs --draft-model DIR|FILE.gguf "
                      "(a small model with the model's vocabulary)");
        return 1;
    }
    if (e->spec_tokens < 0 || e->spec_tokens > 16) {
        startup_error("--num-speculative-tokens %d: want 1..16",
                      e->spec_tokens);
        return 1;
    }
    if (e->spec_ngram_min < 0 || e->spec_ngram_min > 64 ||
        e->spec_ngram_max < 0 || e->spec_ngram_max > 64) {
        bool min_bad = e->spec_ngram_min < 0 || e->spec_ngram_min > 64;
        startup_error("--prompt-lookup-%s %d: want 1..64",
                      min_bad ? "min" : "max",
                      min_bad ? e->spec_ngram_min : e->spec_ngram_max);
        return 1;
    }
    const char *given = e->spec_tokens      ? "--num-speculative-tokens"
                        : e->spec_ngram_min ? "--prompt-lookup-min"
                        : e->spec_ngram_max ? "--prompt-lookup-max"
                                            : NULL;
    if (e->spec == TS_SPEC_NONE) {
        if (given) {
            startup_error("%s needs --speculative ngram|draft (or "
                          "--draft-model)",
                          given);
            return 1;
        }
        return 0;
    }
    if (e->spec == TS_SPEC_DRAFT && (e->spec_ngram_min || e->spec_ngram_max)) {
        startup_error("%s is for --speculative ngram (prompt lookup), not a "
                      "draft model",
                      e->spec_ngram_min ? "--prompt-lookup-min"
                                        : "--prompt-lookup-max");
        return 1;
    }
    if (!e->spec_tokens)
        e->spec_tokens = 4;
    if (e->spec == TS_SPEC_NGRAM) {
        /* as vLLM's: one bound given alone is the other too; none: 1..4 */
        int lo = e->spec_ngram_min, hi = e->spec_ngram_max;
        if (!lo && !hi)
            lo = 1, hi = 4;
        lo = lo ? lo : hi, hi = hi ? hi : lo;
        if (lo > hi) {
            startup_error("--prompt-lookup-min %d is above "
                          "--prompt-lookup-max %d",
                          lo, hi);
            return 1;
        }
        e->spec_ngram_min = lo, e->spec_ngram_max = hi;
    }
    return 0;
}

/* The draft's placement: the model's device_map when it names one device
 * or is "auto"; for a split of the model, the device of its head (where
 * the logits that verify the draft's tokens are). buf: 16 bytes. */
static const char *draft_device_map(const char *map, char *buf) {
    if (!map || !strcmp(map, "auto"))
        return map;
    ts_device_map m;
    if (ts_device_map_parse(srv.ctx, map, (int)ts_lm_config(srv.lm)->layers,
                            &m) != TS_OK) {
        ts_clear_error(srv.ctx); /* the model loaded with it: cannot be */
        return map;
    }
    ts_device_name(m.head, buf);
    ts_device_map_free(&m);
    return buf;
}

/* where load_draft placed the draft ("" without a device map), for the
 * start line */
static char draft_placement[64];

/* Loads e->spec's draft model beside the model (its weight dtype and the
 * checks the model had; no tokenizer: the vocabulary must be the model's,
 * the context at least as long) into srv.draft and e->spec_draft. Nonzero
 * after startup_error. */
static int load_draft(const ts_server_options *o, const ts_load_options *lo,
                      ts_engine_options *e) {
    const char *dir = o->draft_model_dir;
    char dev[32];
    ts_load_options dlo = *lo;
    dlo.device_map = draft_device_map(lo->device_map, dev);
    snprintf(draft_placement, sizeof draft_placement, "%s",
             dlo.device_map ? dlo.device_map : "");
    if (ts_lm_load(srv.ctx, dir, &dlo, &srv.draft) != TS_OK) {
        startup_error("--draft-model %s: %s", dir, ts_errmsg(srv.ctx));
        return 1;
    }
    const ts_model_config *mc = ts_lm_config(srv.lm),
                          *dc = ts_lm_config(srv.draft);
    if (dc->vocab != mc->vocab) {
        startup_error("--draft-model %s: its vocabulary has %lld tokens, the "
                      "model's (%s) %lld: a draft must use the model's "
                      "tokenizer",
                      dir, (long long)dc->vocab, o->model_dir,
                      (long long)mc->vocab);
        return 1;
    }
    if (dc->max_positions < mc->max_positions) { /* the engine's rule */
        startup_error("--draft-model %s: its context (max_position_embeddings"
                      " %lld) is shorter than the model's (%lld)",
                      dir, (long long)dc->max_positions,
                      (long long)mc->max_positions);
        return 1;
    }
    e->spec_draft = ts_lm_decoder(srv.draft);
    return 0;
}

/* the start line of the speculation settings */
static void print_spec(const ts_server_options *o, const ts_engine_options *e) {
    if (e->spec == TS_SPEC_NGRAM)
        fprintf(stderr,
                "tessera serve: speculative decoding: prompt lookup "
                "(n-grams of %d..%d tokens), %d tokens proposed a step\n",
                e->spec_ngram_min, e->spec_ngram_max, e->spec_tokens);
    else if (e->spec == TS_SPEC_DRAFT) {
        const ts_model_config *dc = ts_lm_config(srv.draft);
        fprintf(stderr,
                "tessera serve: speculative decoding: draft model %s (%lld "
                "layers, hidden %lld%s%s), %d tokens proposed a step\n",
                o->draft_model_dir, (long long)dc->layers,
                (long long)dc->hidden, *draft_placement ? ", on " : "",
                draft_placement, e->spec_tokens);
    }
}

/* ---- run ---- */

static int server_run(const ts_server_options *o);

int ts_server_run(const ts_server_options *o) {
    srv_error[0] = 0;
    srv_signal = 0; /* a server run before this one in the process */
    srv_running = 1;
    int rc = server_run(o);
    srv_running = 0;
    return rc;
}

static int server_run(const ts_server_options *o) {
    if (!o || !o->model_dir) {
        startup_error("no model folder");
        return 1;
    }
    memset(&srv, 0, sizeof srv);
    srv.kv_fd = -1;
    srv.no_kv_events = o->no_kv_events;
    srv.api_key = o->api_key && *o->api_key ? o->api_key : NULL;
    srv.no_log_requests = o->no_log_requests;
    if (o->pooling < TS_POOL_NONE || o->pooling > TS_POOL_MEAN) {
        startup_error("pooling %d (want last or mean)", (int)o->pooling);
        return 1;
    }
    srv.pooling = o->pooling == TS_POOL_MEAN ? TS_POOL_MEAN : TS_POOL_LAST;
    ts_origins origins;
    if (o->allowed_origins) {
        char err[400];
        if (ts_origins_parse(o->allowed_origins, &origins, err, sizeof err)) {
            startup_error("%s", err);
            return 1;
        }
        srv.origins = &origins;
    }
    if (srv_is_pipeline(o->model_dir)) /* images, not text */
        return srv_images_run(o);
    int max_conns = o->max_connections > 0 ? o->max_connections
                                           : TS_SERVER_DEFAULT_MAX_CONNECTIONS,
        per_client = o->max_connections_per_client > 0
                         ? o->max_connections_per_client
                         : TS_SERVER_DEFAULT_PER_CLIENT,
        timeout_s = o->conn_timeout_s > 0 ? o->conn_timeout_s
                                          : TS_SERVER_DEFAULT_TIMEOUT_S;
    srv.timeout_ms = timeout_s * 1000;
    ts_kv_peers peers;
    if (o->kv_peers) {
        char err[400];
        if (ts_kv_peers_parse(o->kv_peers, &peers, err, sizeof err)) {
            startup_error("%s", err);
            return 1;
        }
        srv.kv_peers = &peers;
    }
    ts_kv_senders senders;
    if (o->kv_senders) {
        char err[400];
        if (ts_kv_senders_parse(o->kv_senders, &senders, err, sizeof err)) {
            startup_error("%s", err);
            return 1;
        }
        srv.kv_senders = &senders;
    }
    ts_engine_options eo = o->engine; /* + speculation's defaults, draft */
    if (spec_options(o, &eo))
        return 1;
    const char *fault = getenv("TESSERA_FAULT_KV_CORRUPT");
    srv.fault_corrupt = fault && *fault && strcmp(fault, "0");
    if (ts_ctx_new(&srv.ctx, NULL) != TS_OK) {
        startup_error("cannot create a context (out of memory)");
        return 1;
    }
    ts_set_grad_enabled(srv.ctx, false);
    ts_load_options lo = {.weight_dtype = o->weight_dtype,
                          .device_map = o->device_map,
                          .no_check_weights = o->no_check_weights};
    int rc = 1;
    struct MHD_Daemon *d = NULL;
    pthread_t engine_thread, kv_thread;
    bool thread_started = false, kv_started = false;
    if (eo.spec == TS_SPEC_DRAFT && /* before the model's long load */
        ts_model_dir_check(srv.ctx, o->draft_model_dir,
                           TS_MODEL_CONFIG | TS_MODEL_WEIGHTS) != TS_OK) {
        startup_error("--draft-model %s: %s", o->draft_model_dir,
                      ts_errmsg(srv.ctx));
        goto done;
    }
    if (ts_model_dir_check(srv.ctx, o->model_dir, TS_MODEL_ALL) != TS_OK ||
        ts_lm_load(srv.ctx, o->model_dir, &lo, &srv.lm) != TS_OK ||
        ts_tokenizer_load(srv.ctx, o->model_dir, &srv.tok) != TS_OK ||
        ts_tokenizer_check_vocab(srv.ctx, srv.tok,
                                 ts_lm_config(srv.lm)->vocab) != TS_OK) {
        startup_error("%s", ts_errmsg(srv.ctx));
        goto done;
    }
    char oerr[512];
    if (srv_openai_init(oerr, sizeof oerr)) {
        startup_error("%s", oerr);
        goto done;
    }
    if (o->chat_template && *o->chat_template) { /* given: it must load */
        if (ts_chat_load_with(srv.ctx, o->model_dir, o->chat_template,
                              &srv.chat) != TS_OK) {
            startup_error("--chat-template: %s", ts_errmsg(srv.ctx));
            goto done;
        }
    } else if (ts_chat_load(srv.ctx, o->model_dir, &srv.chat) != TS_OK)
        ts_clear_error(srv.ctx); /* no chat template: completions only */
    if (eo.spec == TS_SPEC_DRAFT && load_draft(o, &lo, &eo))
        goto done;
    srv.spec = eo.spec;
    if (ts_engine_new(srv.ctx, ts_lm_decoder(srv.lm), &eo, &srv.eng) != TS_OK) {
        startup_error("%s", ts_errmsg(srv.ctx));
        goto done;
    }
    const ts_model_config *mc = ts_lm_config(srv.lm);
    srv.max_positions = mc->max_positions;
    if (o->max_model_len < 0 || o->max_model_len > mc->max_positions) {
        startup_error("--max-model-len %lld is %s the model's "
                      "max_position_embeddings %lld (config.json)",
                      (long long)o->max_model_len,
                      o->max_model_len < 0 ? "negative, unlike" : "larger than",
                      (long long)mc->max_positions);
        goto done;
    }
    if (o->max_model_len > 0)
        srv.max_positions = o->max_model_len;
    srv.block_size = o->engine.block_size;
    ts_engine_stats est;
    ts_engine_get_stats(srv.eng, &est);
    srv_kvx_dtype = kvx_dtype_of(est.kv_dtype);
    if (mc->eos_token_id >= 0)
        srv.eos[srv.n_eos++] = (int32_t)mc->eos_token_id;
    char *gtext =
        ts_model_file_text(srv.ctx, o->model_dir, "generation_config.json");
    json_t *gc = gtext ? json_loads(gtext, 0, NULL) : NULL;
    free(gtext);
    json_t *ge = json_object_get(gc, "eos_token_id");
    size_t gi;
    json_t *gv;
    if (json_is_integer(ge) && srv.n_eos < 8)
        srv.eos[srv.n_eos++] = (int32_t)json_integer_value(ge);
    json_array_foreach(json_is_array(ge) ? ge : NULL, gi,
                       gv) if (json_is_integer(gv) && srv.n_eos < 8)
        srv.eos[srv.n_eos++] = (int32_t)json_integer_value(gv);
    json_decref(gc);
    const char *eot = srv.chat ? ts_chat_eos_token(srv.chat) : "";
    int32_t eot_id = *eot ? ts_tokenizer_token_id(srv.tok, eot) : -1;
    if (eot_id >= 0 && srv.n_eos < 8)
        srv.eos[srv.n_eos++] = eot_id;
    ts_engine_set_eos(srv.eng, srv.eos, srv.n_eos);
    if (o->model_name)
        snprintf(srv.model, sizeof srv.model, "%s", o->model_name);
    else {
        const char *base = strrchr(o->model_dir, '/');
        snprintf(srv.model, sizeof srv.model, "%s",
                 base && base[1] ? base + 1 : o->model_dir);
    }
    srv.events = malloc(sizeof *srv.events * EVENT_KEEP);
    pthread_mutex_init(&srv.eng_mu, NULL);
    pthread_mutex_init(&srv.out_mu, NULL);
    pthread_mutex_init(&srv.tok_mu, NULL);
    pthread_cond_init(&srv.eng_cv, NULL);
    pthread_cond_init(&srv.out_cv, NULL);
    if (pthread_create(&engine_thread, NULL, engine_loop, NULL)) {
        startup_error("cannot start the engine thread");
        goto done;
    }
    thread_started = true;
    if (o->kv_port >= 0) {
        char err[300];
        srv.kv_fd = ts_kvx_listen(o->host ? o->host : "127.0.0.1", o->kv_port,
                                  &srv.kv_port, err, sizeof err);
        if (srv.kv_fd < 0) {
            startup_error("%s", err);
            goto done;
        }
        if (pthread_create(&kv_thread, NULL, kv_listen_loop, NULL)) {
            startup_error("cannot start the KV thread");
            goto done;
        }
        kv_started = true;
    }
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host ? o->host : "127.0.0.1", &addr.sin_addr) !=
        1) {
        startup_error("bad --host \"%s\" (an IPv4 address)", o->host);
        goto done;
    }
    /* the timeout is MHD's idle limit: it runs while a request is read
     * and a response written, not while the handler or a stream's
     * callback waits for the engine (a stream writes a keep-alive every
     * second); a client that sends nothing is dropped after it */
    errno = 0; /* MHD leaves bind's or listen's errno */
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
        int e = errno;
        startup_error("cannot listen on %s:%d%s%s%s",
                      o->host ? o->host : "127.0.0.1", o->port, e ? " (" : "",
                      e ? strerror(e) : "", e ? ")" : "");
        goto done;
    }
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = info ? info->port : o->port;
    ts_engine_stats est0;
    ts_engine_get_stats(srv.eng, &est0);
    fprintf(stderr,
            "tessera serve: %s on http://%s:%d (%lld KV blocks of %lld "
            "positions)\n",
            srv.model, o->host ? o->host : "127.0.0.1", port,
            (long long)est0.blocks_total, (long long)o->engine.block_size);
    fprintf(stderr,
            "tessera serve: KV cache: %lld blocks x %lld positions, %.2f GiB "
            "(%s)\n",
            (long long)est0.blocks_total, (long long)o->engine.block_size,
            (double)est0.blocks_total * (double)est0.kv_block_bytes /
                (1024.0 * 1024.0 * 1024.0),
            ts_kv_dtype_name(est0.kv_dtype));
    if (srv.kv_fd >= 0)
        fprintf(stderr, "tessera serve: KV transfers on %s:%d\n",
                o->host ? o->host : "127.0.0.1", srv.kv_port);
    fprintf(stderr,
            "tessera serve: scheduler: max_num_seqs %d, max_batch_tokens "
            "%lld, %s steps, priority then first come first served\n",
            o->engine.max_seqs, (long long)o->engine.max_batch_tokens,
            o->engine.enforce_eager ? "eager" : "compiled");
    print_spec(o, &eo);
    if (o->on_listen)
        o->on_listen(port, o->on_listen_arg);
    if (!o->no_signal_handlers) {
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
    }
    signal(SIGPIPE, SIG_IGN);
    while (!srv_signal)
        usleep(100000);
    /* drain: no new connections; running requests finish */
    MHD_quiesce_daemon(d);
    for (;;) {
        pthread_mutex_lock(&srv.out_mu);
        int left = srv.n_active;
        pthread_cond_broadcast(&srv.out_cv);
        pthread_mutex_unlock(&srv.out_mu);
        if (!left)
            break;
        usleep(50000);
    }
    if (srv_signal > 0)
        fprintf(stderr, "tessera serve: stopped (signal %d)\n",
                (int)srv_signal);
    else
        fprintf(stderr, "tessera serve: stopped\n");
    rc = 0;
done:
    if (kv_started) {
        __atomic_store_n(&srv.kv_stop, true, __ATOMIC_SEQ_CST);
        pthread_join(kv_thread, NULL);
        while (__atomic_load_n(&srv.kv_conns, __ATOMIC_SEQ_CST))
            usleep(10000); /* transfers in flight end (--conn-timeout) */
    }
    if (srv.kv_fd >= 0)
        close(srv.kv_fd);
    if (d)
        MHD_stop_daemon(d);
    if (thread_started) {
        srv_eng_lock();
        srv.stop_engine = true;
        pthread_cond_signal(&srv.eng_cv);
        pthread_mutex_unlock(&srv.eng_mu);
        pthread_join(engine_thread, NULL);
    }
    srv_openai_fini();
    ts_engine_free(srv.eng);
    ts_chat_free(srv.chat);
    ts_tokenizer_free(srv.tok);
    ts_lm_free(srv.lm);
    ts_lm_free(srv.draft); /* after the engine, which used it */
    free(srv.active), free(srv.events);
    ts_ctx_free(srv.ctx);
    return rc;
}
