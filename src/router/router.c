/* router.c — `tessera route`: an OpenAI-compatible front for many
 * `tessera serve` instances (docs/ROUTER.md).
 *
 * Threads: libmicrohttpd runs a thread per client connection; that thread
 * tokenizes the request (tok_mu), scores the servers (mu), and proxies it
 * with a libcurl multi handle of its own, pumped from MHD's content
 * callback so a stream passes through chunk by chunk. Per server, a
 * monitor thread scrapes /health and /metrics and an events thread keeps
 * the set of blocks it has cached (/v1/kv_cache, then /v1/kv_events).
 * Lock order: tok_mu and mu are never held together; no lock is held
 * during I/O. Owns routing, proxying and health; tokens and blocks are the
 * servers'. */
#define _GNU_SOURCE
#include "tessera_io.h"
#include "tessera_router.h"

#include "tessera_tokenizer.h"

#include "core/strbuf.h"
#include "policy.h"
#include "server/auth.h"
#include "server/prompt.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_BODY         (16 << 20)
#define RECENT_MS        5000 /* routed blocks count as cached this long */
#define CHECK_TIMEOUT_MS 3000 /* a health or metrics check */
#define CHECK_FAILS      3 /* failed checks in a row before a server is out */

typedef enum { ROLE_BOTH, ROLE_PREFILL, ROLE_DECODE } role;
static const char *const ROLE_NAME[] = {"both", "prefill", "decode"};

typedef struct {
    char url[256];  /* http://host:port, no trailing slash */
    char host[128]; /* for the KV-transfer target */
    role role;
    /* under R.mu */
    bool healthy, checked, precise, no_events;
    int fails;           /* consecutive failed checks */
    ts_block_set cached; /* precise: the events; approximate: routed */
    ts_block_set recent; /* routed in the last RECENT_MS (stamp: ms) */
    uint64_t approx_tick;
    int64_t running, waiting, kv_used, kv_total, kv_cached, inflight;
    double hits, queries; /* the server's prefix-cache counters */
    int kv_port;
    uint64_t requests, errors;
    pthread_t monitor, events;
} backend;

static struct {
    ts_router_options o;
    backend *b;
    int nb;
    pthread_mutex_t mu;
    ts_route_state st;
    ts_ctx *ctx;
    ts_tokenizer *tok;
    ts_chat *chat;
    pthread_mutex_t tok_mu;
    int64_t block_size;
    bool pd;
    volatile int stop;
    /* metrics (mu) */
    uint64_t decisions[TS_REASON_N], retries, upstream_errors;
    uint64_t prompt_tokens, predicted_hit_tokens;
    uint64_t kvx_ok, kvx_failed, kvx_skipped, status_5xx, active;
    /* what clients must send (NULL: nothing); the header sent to the
     * servers ("Authorization: Bearer KEY", "" when none) */
    const char *api_key;
    char server_auth[600];
} R;

/* the servers' key on every request the router makes to them */
static struct curl_slist *add_server_auth(struct curl_slist *h) {
    return *R.server_auth ? curl_slist_append(h, R.server_auth) : h;
}

static volatile sig_atomic_t g_signal;

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void logf_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tessera route: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* sleeps ms in short slices; false when the router is stopping */
static bool nap(int ms) {
    for (int t = 0; t < ms && !R.stop; t += 50)
        usleep(50000);
    return !R.stop;
}

/* ---- blocking HTTP (monitors, prefill calls) ---- */

static size_t sink(char *p, size_t sz, size_t n, void *u) {
    ts_sb_add(u, p, sz * n);
    return sz * n;
}

/* GET or POST (body != NULL) url+path; the status, or -1 when no answer
 * (err says why), -2 when nothing listens there */
static long http_call(const char *url, const char *path, const char *body,
                      size_t len, long timeout_ms, ts_sbuf *out, char *err,
                      size_t errcap) {
    char full[512];
    snprintf(full, sizeof full, "%s%s", url, path);
    CURL *e = curl_easy_init();
    if (!e) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    char eb[CURL_ERROR_SIZE] = "";
    struct curl_slist *h = NULL;
    curl_easy_setopt(e, CURLOPT_URL, full);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, eb);
    h = add_server_auth(h);
    if (body) {
        h = curl_slist_append(h, "Content-Type: application/json");
        h = curl_slist_append(h, "Expect:");
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    if (h)
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    CURLcode rc = curl_easy_perform(e);
    long status = -1;
    if (rc == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    else {
        snprintf(err, errcap, "%s", *eb ? eb : curl_easy_strerror(rc));
        if (rc == CURLE_COULDNT_CONNECT)
            status = -2;
    }
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    return status;
}

/* ---- monitors ---- */

/* a server out of rotation (mu held): what it had cached is unknown now
 * (it may come back empty); precise mode re-reads it, approximate mode
 * starts over */
static void mark_down(backend *be) {
    be->healthy = false;
    ts_block_set_clear(&be->cached);
    ts_block_set_clear(&be->recent);
}

/* a sample's value in Prometheus text ("name value" lines) */
static bool metric(const char *text, const char *name, double *v) {
    size_t nl = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
        if (!strncmp(p, name, nl) && p[nl] == ' ') {
            *v = strtod(p + nl + 1, NULL);
            return true;
        }
    return false;
}

static void *monitor_loop(void *arg) {
    backend *be = arg;
    while (!R.stop) {
        ts_sbuf h = {0}, m = {0};
        char err[CURL_ERROR_SIZE + 64] = "";
        long st = http_call(be->url, "/health", NULL, 0, CHECK_TIMEOUT_MS, &h,
                            err, sizeof err);
        bool ok = st == 200, refused = st == -2;
        int kv_port = 0;
        if (ok) {
            json_t *j = json_loadb(h.p ? h.p : "", h.n, 0, NULL);
            kv_port =
                (int)json_integer_value(json_object_get(j, "kv_transfer_port"));
            json_decref(j);
            st = http_call(be->url, "/metrics", NULL, 0, CHECK_TIMEOUT_MS, &m,
                           err, sizeof err);
            ok = st == 200, refused = st == -2;
            if (!ok && !*err)
                snprintf(err, sizeof err, "/metrics answered %ld", st);
        } else if (!*err)
            snprintf(err, sizeof err, "/health answered %ld", st);
        double running = 0, waiting = 0, used = 0, total = 0, cached = 0,
               hits = 0, queries = 0;
        if (ok && m.p) {
            metric(m.p, "tessera_requests_running", &running);
            metric(m.p, "tessera_requests_waiting", &waiting);
            metric(m.p, "tessera_kv_blocks_used", &used);
            metric(m.p, "tessera_kv_blocks_total", &total);
            metric(m.p, "tessera_kv_blocks_cached", &cached);
            metric(m.p, "tessera_prefix_cache_hits_total", &hits);
            metric(m.p, "tessera_prefix_cache_queries_total", &queries);
        }
        pthread_mutex_lock(&R.mu);
        /* a server nothing listens on is out at once; one that answers
         * slowly or wrongly (busy, overloaded) only after CHECK_FAILS
         * checks in a row, so a long step does not drop its cache */
        be->fails = ok ? 0 : be->fails + 1;
        bool up = ok || (be->healthy && !refused && be->fails < CHECK_FAILS);
        if (up != be->healthy || !be->checked)
            logf_("%s %s%s%s", be->url,
                  up ? "is healthy" : "is out of rotation", up ? "" : ": ",
                  up ? "" : err);
        if (!up && be->healthy)
            mark_down(be);
        be->healthy = up, be->checked = true;
        if (ok) {
            be->running = (int64_t)running, be->waiting = (int64_t)waiting;
            be->kv_used = (int64_t)used, be->kv_total = (int64_t)total;
            be->kv_cached = (int64_t)cached;
            be->hits = hits, be->queries = queries;
            be->kv_port = kv_port;
        }
        uint64_t t = now_ms();
        ts_block_set_expire(&be->recent, t > RECENT_MS ? t - RECENT_MS : 0);
        pthread_mutex_unlock(&R.mu);
        free(h.p), free(m.p);
        nap(R.o.health_interval_ms);
    }
    return NULL;
}

/* a block hash as the servers write it: 1 to 16 hex digits, nothing else
 * (strtoull would take "zz" as 0 and " 12" as 0x12) */
static bool parse_block_hash(const char *s, uint64_t *out) {
    uint64_t h = 0;
    size_t n = 0;
    for (; s[n]; n++) {
        int c = (unsigned char)s[n], v = c >= '0' && c <= '9'   ? c - '0'
                                         : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                : -1;
        if (v < 0 || n == 16)
            return false;
        h = h << 4 | (uint64_t)v;
    }
    *out = h;
    return n > 0;
}

/* applies one /v1/kv_events line (mu held); a line that is not an event
 * with a well-formed hash changes nothing */
static void apply_event(backend *be, const char *line, size_t len) {
    json_t *j = json_loadb(line, len, 0, NULL);
    const char *type = json_string_value(json_object_get(j, "type"));
    const char *hash = json_string_value(json_object_get(j, "block_hash"));
    uint64_t h;
    if (type && hash && parse_block_hash(hash, &h)) {
        if (!strcmp(type, "BlockStored"))
            ts_block_set_put(&be->cached, h, 1);
        else if (!strcmp(type, "BlockRemoved")) {
            ts_block_set_del(&be->cached, h);
            ts_block_set_del(&be->recent, h); /* routed, then evicted */
        }
    }
    json_decref(j);
}

typedef struct {
    backend *be;
    ts_sbuf line;
} event_stream;

#define EVENT_LINE_MAX 65536

static size_t event_write(char *p, size_t sz, size_t n, void *u) {
    event_stream *es = u;
    if (R.stop)
        return 0; /* aborts the transfer */
    size_t len = sz * n;
    pthread_mutex_lock(&R.mu);
    for (size_t i = 0; i < len; i++) {
        if (p[i] != '\n') {
            /* an event is ~150 bytes: a server that sends no newline must
             * not grow the router's memory; drop the stream (it is
             * followed again from a fresh snapshot) */
            if (es->line.n >= EVENT_LINE_MAX) {
                pthread_mutex_unlock(&R.mu);
                logf_("%s: a /v1/kv_events line over %d bytes; reconnecting",
                      es->be->url, EVENT_LINE_MAX);
                es->line.n = 0;
                return 0;
            }
            ts_sb_add(&es->line, p + i, 1);
            continue;
        }
        if (es->line.n)
            apply_event(es->be, es->line.p, es->line.n);
        es->line.n = 0;
    }
    pthread_mutex_unlock(&R.mu);
    return len;
}

static int event_progress(void *u, curl_off_t a, curl_off_t b, curl_off_t c,
                          curl_off_t d) {
    (void)u, (void)a, (void)b, (void)c, (void)d;
    return R.stop ? 1 : 0;
}

static void *events_loop(void *arg) {
    backend *be = arg;
    while (!R.stop) {
        pthread_mutex_lock(&R.mu);
        bool healthy = be->healthy;
        pthread_mutex_unlock(&R.mu);
        if (!healthy) {
            nap(100);
            continue;
        }
        ts_sbuf snap = {0};
        char err[CURL_ERROR_SIZE + 64];
        long st = http_call(be->url, "/v1/kv_cache", NULL, 0, 5000, &snap, err,
                            sizeof err);
        if (st == 404) { /* no events here: approximate mode */
            pthread_mutex_lock(&R.mu);
            if (!be->no_events)
                logf_("%s publishes no KV events: approximate mode", be->url);
            if (!be->no_events || be->precise)
                ts_block_set_clear(&be->cached);
            be->no_events = true, be->precise = false;
            pthread_mutex_unlock(&R.mu);
            free(snap.p);
            nap(5000);
            continue;
        }
        json_t *j = st == 200 ? json_loadb(snap.p, snap.n, 0, NULL) : NULL;
        free(snap.p);
        if (!j) {
            nap(500);
            continue;
        }
        json_int_t last =
            json_integer_value(json_object_get(j, "last_event_seq"));
        pthread_mutex_lock(&R.mu);
        ts_block_set_clear(&be->cached);
        size_t i;
        json_t *blk;
        json_array_foreach(json_object_get(j, "blocks"), i, blk) {
            const char *h =
                json_string_value(json_object_get(blk, "block_hash"));
            uint64_t hv;
            if (h && parse_block_hash(h, &hv))
                ts_block_set_put(&be->cached, hv, 1);
        }
        be->precise = true, be->no_events = false;
        pthread_mutex_unlock(&R.mu);
        json_decref(j);
        /* then the stream from the snapshot on */
        char path[64];
        snprintf(path, sizeof path, "/v1/kv_events?since=%lld",
                 (long long)last + 1);
        char full[512];
        snprintf(full, sizeof full, "%s%s", be->url, path);
        event_stream es = {be, {0}};
        CURL *e = curl_easy_init();
        struct curl_slist *hdrs = add_server_auth(NULL);
        if (e) {
            curl_easy_setopt(e, CURLOPT_URL, full);
            if (hdrs)
                curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
            curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, event_write);
            curl_easy_setopt(e, CURLOPT_WRITEDATA, &es);
            curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
            curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
            /* the server writes a keep-alive line every second */
            curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
            curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 5L);
            curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
            curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, event_progress);
            curl_easy_perform(e);
            curl_easy_cleanup(e);
        }
        curl_slist_free_all(hdrs);
        free(es.line.p);
        pthread_mutex_lock(&R.mu);
        be->precise = false; /* until the next snapshot */
        pthread_mutex_unlock(&R.mu);
        nap(200);
    }
    return NULL;
}

/* ---- choosing ---- */

typedef struct {
    int idx;
    size_t hits;
    ts_route_reason why;
} choice;

/* picks among role r (ROLE_BOTH: plain servers) the best eligible server
 * not in tried[]; counts it in flight and records the prompt's blocks as
 * routed there. idx -1 when none. */
/* KV pressure (mu held): the blocks a new prompt would compete with, held
 * by sequences or kept in the prefix cache, whichever is more, and what the
 * router knows of before the next scrape (events, recent routing): a new
 * tenant goes where it evicts least of the others' prefixes */
static int64_t kv_occupied(const backend *be) {
    int64_t v = be->kv_used;
    if (be->kv_cached > v)
        v = be->kv_cached;
    if ((int64_t)be->cached.n > v)
        v = (int64_t)be->cached.n;
    if ((int64_t)be->recent.n > v)
        v = (int64_t)be->recent.n;
    return v;
}

static choice pick_server(role r, const uint64_t *hashes, size_t nh,
                          const bool *tried, bool retry) {
    ts_route_candidate c[TS_ROUTER_MAX_SERVERS * 3];
    choice ch = {-1, 0, TS_REASON_ONLY};
    uint64_t t = now_ms(), since = t > RECENT_MS ? t - RECENT_MS : 1;
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nb; i++) {
        backend *be = &R.b[i];
        int64_t scraped = be->running + be->waiting;
        c[i] = (ts_route_candidate){
            .eligible = be->role == r && be->healthy && !tried[i],
            .hit_blocks =
                ts_prefix_hits(&be->cached, &be->recent, since, hashes, nh),
            .queue = scraped > be->inflight ? scraped : be->inflight,
            .kv_used = kv_occupied(be),
            .kv_total = be->kv_total};
    }
    ts_route_reason why;
    int k = ts_route_pick(&R.st, c, R.nb, nh, &why, NULL);
    if (k >= 0) {
        backend *be = &R.b[k];
        ch = (choice){k, c[k].hit_blocks, retry ? TS_REASON_RETRY : why};
        be->inflight++;
        R.decisions[ch.why]++;
        for (size_t i = 0; i < nh; i++) {
            ts_block_set_put(&be->recent, hashes[i], t);
            if (be->no_events)
                ts_block_set_put(&be->cached, hashes[i], ++be->approx_tick);
        }
        if (be->no_events)
            ts_block_set_trim(&be->cached,
                              be->kv_total > 0 ? (size_t)be->kv_total : 512);
    }
    pthread_mutex_unlock(&R.mu);
    return ch;
}

static void server_failed(int k, const char *why) {
    pthread_mutex_lock(&R.mu);
    backend *be = &R.b[k];
    if (be->healthy)
        logf_("%s is out of rotation: %s", be->url, why);
    mark_down(be);
    be->errors++;
    R.upstream_errors++;
    pthread_mutex_unlock(&R.mu);
}

static void done_with(int k) {
    pthread_mutex_lock(&R.mu);
    R.b[k].inflight--;
    pthread_mutex_unlock(&R.mu);
}

/* ---- proxying (a curl multi handle per request) ---- */

typedef struct {
    CURLM *m;
    CURL *e;
    struct curl_slist *hdrs;
    ts_sbuf buf;
    size_t off;
    bool headers_done, done;
    CURLcode res;
    long status;
    char ctype[128];
    size_t received;
    char eb[CURL_ERROR_SIZE];
} upstream;

static size_t up_write(char *p, size_t sz, size_t n, void *u) {
    upstream *up = u;
    ts_sb_add(&up->buf, p, sz * n);
    up->received += sz * n;
    return sz * n;
}

static size_t up_header(char *p, size_t sz, size_t n, void *u) {
    upstream *up = u;
    size_t len = sz * n;
    if (len >= 13 && !strncasecmp(p, "content-type:", 13)) {
        const char *v = p + 13;
        while (*v == ' ')
            v++;
        size_t vl = len - (size_t)(v - p);
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n'))
            vl--;
        snprintf(up->ctype, sizeof up->ctype, "%.*s", (int)vl, v);
    } else if (len <= 2 && (p[0] == '\r' || p[0] == '\n')) {
        long st = 0;
        curl_easy_getinfo(up->e, CURLINFO_RESPONSE_CODE, &st);
        if (st >= 200) /* not a 1xx interim response */
            up->headers_done = true, up->status = st;
    }
    return len;
}

static bool up_start(upstream *up, const char *url, const char *path,
                     const char *body, size_t len) {
    memset(up, 0, sizeof *up);
    char full[512];
    snprintf(full, sizeof full, "%s%s", url, path);
    up->m = curl_multi_init();
    up->e = curl_easy_init();
    if (!up->m || !up->e)
        return false;
    up->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    up->hdrs = curl_slist_append(up->hdrs, "Expect:");
    up->hdrs = add_server_auth(up->hdrs);
    curl_easy_setopt(up->e, CURLOPT_URL, full);
    curl_easy_setopt(up->e, CURLOPT_HTTPHEADER, up->hdrs);
    curl_easy_setopt(up->e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(up->e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(up->e, CURLOPT_WRITEFUNCTION, up_write);
    curl_easy_setopt(up->e, CURLOPT_WRITEDATA, up);
    curl_easy_setopt(up->e, CURLOPT_HEADERFUNCTION, up_header);
    curl_easy_setopt(up->e, CURLOPT_HEADERDATA, up);
    curl_easy_setopt(up->e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(up->e, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    curl_easy_setopt(up->e, CURLOPT_ERRORBUFFER, up->eb);
    curl_easy_setopt(up->e, CURLOPT_TCP_NODELAY, 1L);
    curl_multi_add_handle(up->m, up->e);
    return true;
}

static void up_pump(upstream *up, int timeout_ms) {
    int running = 0;
    size_t before = up->received;
    curl_multi_perform(up->m, &running);
    CURLMsg *msg;
    int q;
    while ((msg = curl_multi_info_read(up->m, &q)))
        if (msg->msg == CURLMSG_DONE)
            up->done = true, up->res = msg->data.result;
    if (!up->done && up->received == before && !up->headers_done)
        curl_multi_poll(up->m, NULL, 0, timeout_ms, NULL);
    else if (!up->done && up->received == before)
        curl_multi_poll(up->m, NULL, 0, timeout_ms, NULL);
}

static void up_free(upstream *up) {
    if (up->m && up->e)
        curl_multi_remove_handle(up->m, up->e);
    if (up->e)
        curl_easy_cleanup(up->e);
    if (up->m)
        curl_multi_cleanup(up->m);
    curl_slist_free_all(up->hdrs);
    free(up->buf.p);
    memset(up, 0, sizeof *up);
}

static const char *up_error(const upstream *up) {
    return *up->eb ? up->eb : curl_easy_strerror(up->res);
}

/* ---- requests ---- */

typedef struct {
    ts_sbuf body;
    bool too_big, unauthorized; /* unauthorized: its body is not kept */
    upstream up;
    int server; /* index in R.b, -1 none */
    bool stream, error_sent, live;
} rreq;

static enum MHD_Result send_raw(struct MHD_Connection *c, int code,
                                const char *ctype, const char *body, size_t len,
                                const char *server, const char *prefill) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, (void *)body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (server)
        MHD_add_response_header(resp, "x-tessera-server", server);
    if (prefill)
        MHD_add_response_header(resp, "x-tessera-prefill", prefill);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)code, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, int code,
                                  const char *type, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ts_utf8_sanitize(msg); /* a quoted URL, or a cut, stays JSON */
    json_t *j = json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", msg,
                          "type", type, "param", "code");
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (code >= 500) {
        pthread_mutex_lock(&R.mu);
        R.status_5xx++;
        pthread_mutex_unlock(&R.mu);
    }
    enum MHD_Result ret = send_raw(c, code, "application/json", s ? s : "{}",
                                   s ? strlen(s) : 2, NULL, NULL);
    free(s);
    return ret;
}

/* the stream's bytes as they come; an SSE error event if it breaks */
static ssize_t proxy_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    rreq *r = cls;
    upstream *up = &r->up;
    for (;;) {
        if (up->off < up->buf.n) {
            size_t n = up->buf.n - up->off < max ? up->buf.n - up->off : max;
            memcpy(buf, up->buf.p + up->off, n);
            up->off += n;
            if (up->off == up->buf.n)
                up->off = up->buf.n = 0;
            return (ssize_t)n;
        }
        if (up->done) {
            if (up->res != CURLE_OK && !r->error_sent) {
                r->error_sent = true;
                server_failed(r->server, up_error(up));
                char msg[1024];
                snprintf(msg, sizeof msg,
                         "the server that was generating this response "
                         "failed: %s: %s",
                         R.b[r->server].url, up_error(up));
                json_t *j =
                    json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message",
                              msg, "type", "server_error", "param", "code");
                char *s = json_dumps(j, JSON_COMPACT);
                json_decref(j);
                ts_sb_printf(&up->buf, "data: %s\n\n", s ? s : "{}");
                free(s);
                continue;
            }
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        up_pump(up, 1000);
    }
}

/* the prefill on server p for decode server d: 0 ok, -1 failed (err) */
static int prefill_on(int p, int d, json_t *req, const char *path, char *err,
                      size_t errcap) {
    pthread_mutex_lock(&R.mu);
    int kv_port = R.b[d].kv_port;
    char target[200];
    snprintf(target, sizeof target, "%s:%d", R.b[d].host, kv_port);
    pthread_mutex_unlock(&R.mu);
    if (kv_port <= 0) {
        snprintf(err, errcap, "%s has no --kv-port", R.b[d].url);
        return -1;
    }
    json_t *q = json_deep_copy(req);
    static const char *const drop[] = {
        "stream",   "stream_options", "n",   "max_completion_tokens",
        "logprobs", "top_logprobs",   "stop"};
    for (size_t i = 0; i < sizeof drop / sizeof *drop; i++)
        json_object_del(q, drop[i]);
    json_object_set_new(q, "max_tokens", json_integer(1));
    json_object_set_new(q, "kv_transfer_params",
                        json_pack("{s:s}", "target", target));
    char *body = json_dumps(q, JSON_COMPACT);
    json_decref(q);
    ts_sbuf out = {0};
    long st = body ? http_call(R.b[p].url, path, body, strlen(body), 600000,
                               &out, err, errcap)
                   : -1;
    free(body);
    int rc = -1;
    if (st < 0)
        server_failed(p, err);
    else if (st != 200)
        snprintf(err, errcap, "%s answered %ld: %.*s", R.b[p].url, st,
                 (int)(out.n < 300 ? out.n : 300), out.p ? out.p : "");
    else {
        json_t *j = json_loadb(out.p, out.n, 0, NULL);
        json_t *kv = json_object_get(j, "kv_transfer_params");
        const char *s = json_string_value(json_object_get(kv, "status"));
        if (s && !strcmp(s, "ok"))
            rc = 0;
        else
            snprintf(err, errcap, "%s",
                     json_string_value(json_object_get(kv, "message"))
                         ? json_string_value(json_object_get(kv, "message"))
                         : "the prefill server reported no transfer");
        json_decref(j);
    }
    free(out.p);
    return rc;
}

static enum MHD_Result route_generate(struct MHD_Connection *c, rreq *r,
                                      const char *path, bool chat) {
    const char *body = r->body.p ? r->body.p : "";
    json_t *j = json_loadb(body, r->body.n, 0, NULL);
    int32_t *ids = NULL;
    size_t n_ids = 0, nh = 0;
    if (json_is_object(j) && R.tok) {
        ts_prompt_error pe;
        if (ts_openai_prompt(R.tok, R.chat, R.ctx, &R.tok_mu, j, chat, &ids,
                             &n_ids, &pe))
            n_ids = 0; /* the server will say what is wrong */
    }
    r->stream = json_is_object(j) && json_is_true(json_object_get(j, "stream"));
    uint64_t *hashes = ts_prompt_block_hashes(ids, n_ids, R.block_size, &nh);
    free(ids);
    bool tried[TS_ROUTER_MAX_SERVERS * 3] = {0};
    char last_err[600] = "";
    const char *prefill_url = NULL;
    role want = R.pd ? ROLE_DECODE : ROLE_BOTH;
    for (int attempt = 0;; attempt++) {
        choice ch = pick_server(want, hashes, nh, tried, attempt > 0);
        if (ch.idx < 0) {
            free(hashes);
            json_decref(j);
            if (attempt)
                return send_error(c, 503, "server_error",
                                  "no healthy server could take the "
                                  "request; the last failure: %s",
                                  last_err);
            return send_error(c, 503, "server_error",
                              "no healthy server to route to");
        }
        tried[ch.idx] = true;
        /* disaggregated: the prompt's KV from a prefill server first */
        if (R.pd && json_is_object(j) &&
            nh >= ch.hits + (size_t)R.o.pd_min_blocks) {
            bool ptried[TS_ROUTER_MAX_SERVERS * 3] = {0};
            char err[600] = "";
            int rc = -1;
            for (;;) {
                choice p = pick_server(ROLE_PREFILL, hashes, nh, ptried, false);
                if (p.idx < 0) {
                    if (!*err) { /* none to try: the decode server does it */
                        snprintf(err, sizeof err, "no healthy prefill server");
                        rc = 1;
                    }
                    break;
                }
                ptried[p.idx] = true;
                rc = prefill_on(p.idx, ch.idx, j, path, err, sizeof err);
                done_with(p.idx);
                pthread_mutex_lock(&R.mu);
                bool p_down = !R.b[p.idx].healthy;
                R.b[p.idx].requests++;
                pthread_mutex_unlock(&R.mu);
                if (rc == 0)
                    prefill_url = R.b[p.idx].url;
                if (rc == 0 || !p_down)
                    break; /* done, or failed for a reason not the server's */
            }
            pthread_mutex_lock(&R.mu);
            if (rc == 0)
                R.kvx_ok++;
            else if (rc == 1)
                R.kvx_skipped++;
            else
                R.kvx_failed++;
            pthread_mutex_unlock(&R.mu);
            if (rc)
                logf_("KV transfer for %s failed (it recomputes): %s",
                      R.b[ch.idx].url, err);
        } else if (R.pd) {
            pthread_mutex_lock(&R.mu);
            R.kvx_skipped++;
            pthread_mutex_unlock(&R.mu);
        }
        upstream *up = &r->up;
        if (!up_start(up, R.b[ch.idx].url, path, body, r->body.n)) {
            up_free(up);
            done_with(ch.idx);
            free(hashes);
            json_decref(j);
            return send_error(c, 500, "server_error", "out of memory");
        }
        while (!up->headers_done && !up->done)
            up_pump(up, 1000);
        if (!up->headers_done) { /* nothing came back: try another */
            snprintf(last_err, sizeof last_err, "%s: %s", R.b[ch.idx].url,
                     up_error(up));
            server_failed(ch.idx, up_error(up));
            up_free(up);
            done_with(ch.idx);
            pthread_mutex_lock(&R.mu);
            R.retries++;
            pthread_mutex_unlock(&R.mu);
            continue;
        }
        r->server = ch.idx;
        r->live = true;
        pthread_mutex_lock(&R.mu);
        R.b[ch.idx].requests++;
        R.prompt_tokens += n_ids;
        R.predicted_hit_tokens += ch.hits * (size_t)R.block_size;
        pthread_mutex_unlock(&R.mu);
        break;
    }
    free(hashes);
    json_decref(j);
    upstream *up = &r->up;
    const char *url = R.b[r->server].url;
    if (!r->stream || up->status != 200) { /* whole: wait for the end */
        while (!up->done)
            up_pump(up, 1000);
        if (up->res != CURLE_OK) {
            server_failed(r->server, up_error(up));
            return send_error(c, 502, "server_error",
                              "the server %s failed mid-response: %s", url,
                              up_error(up));
        }
        return send_raw(
            c, (int)up->status, *up->ctype ? up->ctype : "application/json",
            up->buf.p ? up->buf.p : "", up->buf.n, url, prefill_url);
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16384, proxy_reader, r, NULL);
    MHD_add_response_header(resp, "Content-Type",
                            *up->ctype ? up->ctype : "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "x-tessera-server", url);
    if (prefill_url)
        MHD_add_response_header(resp, "x-tessera-prefill", prefill_url);
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ---- the router's own endpoints ---- */

static enum MHD_Result health(struct MHD_Connection *c) {
    json_t *servers = json_array();
    int up = 0;
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.nb; i++) {
        backend *be = &R.b[i];
        up += be->healthy;
        json_array_append_new(
            servers,
            json_pack("{s:s, s:s, s:b, s:s, s:I, s:I, s:I, s:I, s:I, s:I}",
                      "url", be->url, "role", ROLE_NAME[be->role], "healthy",
                      be->healthy, "mode",
                      be->no_events ? "approximate"
                      : be->precise ? "precise"
                                    : "connecting",
                      "running", (json_int_t)be->running, "waiting",
                      (json_int_t)be->waiting, "kv_used",
                      (json_int_t)be->kv_used, "kv_total",
                      (json_int_t)be->kv_total, "cached_blocks",
                      (json_int_t)be->cached.n, "inflight",
                      (json_int_t)be->inflight));
    }
    pthread_mutex_unlock(&R.mu);
    json_t *j = json_pack(
        "{s:s, s:s, s:o}", "status", up ? "ok" : "unavailable", "policy",
        ts_route_policy_name(R.st.policy), "servers", servers);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    enum MHD_Result ret = send_raw(c, up ? 200 : 503, "application/json",
                                   s ? s : "{}", s ? strlen(s) : 2, NULL, NULL);
    free(s);
    return ret;
}

static enum MHD_Result metrics(struct MHD_Connection *c) {
    ts_sbuf b = {0};
    pthread_mutex_lock(&R.mu);
    ts_sb_printf(&b, "# HELP tessera_router_requests_total requests sent to "
                     "each server\n# TYPE tessera_router_requests_total "
                     "counter\n");
    for (int i = 0; i < R.nb; i++)
        ts_sb_printf(&b, "tessera_router_requests_total{server=\"%s\"} %llu\n",
                     R.b[i].url, (unsigned long long)R.b[i].requests);
    ts_sb_printf(&b, "# TYPE tessera_router_server_healthy gauge\n");
    for (int i = 0; i < R.nb; i++)
        ts_sb_printf(&b, "tessera_router_server_healthy{server=\"%s\"} %d\n",
                     R.b[i].url, R.b[i].healthy);
    ts_sb_printf(&b, "# TYPE tessera_router_server_inflight gauge\n");
    for (int i = 0; i < R.nb; i++)
        ts_sb_printf(&b, "tessera_router_server_inflight{server=\"%s\"} %lld\n",
                     R.b[i].url, (long long)R.b[i].inflight);
    ts_sb_printf(&b, "# HELP tessera_router_decisions_total routing decisions "
                     "by what decided them\n# TYPE "
                     "tessera_router_decisions_total counter\n");
    for (int k = 0; k < TS_REASON_N; k++)
        ts_sb_printf(&b, "tessera_router_decisions_total{reason=\"%s\"} %llu\n",
                     ts_route_reason_name((ts_route_reason)k),
                     (unsigned long long)R.decisions[k]);
    double hits = 0, queries = 0;
    for (int i = 0; i < R.nb; i++)
        hits += R.b[i].hits, queries += R.b[i].queries;
    ts_sb_printf(
        &b,
        "# TYPE tessera_router_prompt_tokens_total counter\n"
        "tessera_router_prompt_tokens_total %llu\n"
        "# HELP tessera_router_predicted_hit_tokens_total prompt tokens the "
        "router expected cached where it sent them\n"
        "# TYPE tessera_router_predicted_hit_tokens_total counter\n"
        "tessera_router_predicted_hit_tokens_total %llu\n"
        "# TYPE tessera_router_predicted_hit_rate gauge\n"
        "tessera_router_predicted_hit_rate %.6f\n"
        "# HELP tessera_router_reported_hit_rate the servers' own prefix-cache "
        "hits over lookups, summed\n"
        "# TYPE tessera_router_reported_hit_rate gauge\n"
        "tessera_router_reported_hit_rate %.6f\n"
        "# TYPE tessera_router_retries_total counter\n"
        "tessera_router_retries_total %llu\n"
        "# TYPE tessera_router_upstream_errors_total counter\n"
        "tessera_router_upstream_errors_total %llu\n"
        "# TYPE tessera_router_kv_transfers_total counter\n"
        "tessera_router_kv_transfers_total{status=\"ok\"} %llu\n"
        "tessera_router_kv_transfers_total{status=\"failed\"} %llu\n"
        "tessera_router_kv_transfers_total{status=\"skipped\"} %llu\n",
        (unsigned long long)R.prompt_tokens,
        (unsigned long long)R.predicted_hit_tokens,
        R.prompt_tokens ? (double)R.predicted_hit_tokens / R.prompt_tokens : 0,
        queries > 0 ? hits / queries : 0, (unsigned long long)R.retries,
        (unsigned long long)R.upstream_errors, (unsigned long long)R.kvx_ok,
        (unsigned long long)R.kvx_failed, (unsigned long long)R.kvx_skipped);
    pthread_mutex_unlock(&R.mu);
    enum MHD_Result ret = send_raw(c, 200, "text/plain; version=0.0.4",
                                   b.p ? b.p : "", b.n, NULL, NULL);
    free(b.p);
    return ret;
}

static enum MHD_Result models(struct MHD_Connection *c) {
    for (int i = 0; i < R.nb; i++) {
        pthread_mutex_lock(&R.mu);
        bool ok = R.b[i].healthy;
        pthread_mutex_unlock(&R.mu);
        if (!ok)
            continue;
        ts_sbuf out = {0};
        char err[CURL_ERROR_SIZE + 64];
        long st = http_call(R.b[i].url, "/v1/models", NULL, 0, 5000, &out, err,
                            sizeof err);
        if (st == 200) {
            enum MHD_Result ret =
                send_raw(c, 200, "application/json", out.p ? out.p : "", out.n,
                         R.b[i].url, NULL);
            free(out.p);
            return ret;
        }
        free(out.p);
    }
    return send_error(c, 503, "server_error", "no healthy server to ask");
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    (void)cls, (void)version;
    rreq *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r)
            return MHD_NO;
        r->server = -1;
        *con_cls = r;
        r->unauthorized =
            R.api_key && !strncmp(url, "/v1/", 4) &&
            !ts_bearer_ok(MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                      "Authorization"),
                          R.api_key);
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
    if (r->unauthorized) {
        json_t *j = json_pack(
            "{s:{s:s, s:s, s:n, s:s}}", "error", "message",
            "a missing or wrong API key: send \"Authorization: Bearer KEY\" "
            "with the key this router was started with (--api-key)",
            "type", "invalid_request_error", "param", "code",
            "invalid_api_key");
        char *js = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        enum MHD_Result ret =
            send_raw(c, 401, "application/json", js ? js : "{}",
                     js ? strlen(js) : 2, NULL, NULL);
        free(js);
        return ret;
    }
    if (r->too_big)
        return send_error(c, 413, "invalid_request_error",
                          "the body is larger than %d bytes", MAX_BODY);
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    bool comp = !strcmp(url, "/v1/completions"),
         chat = !strcmp(url, "/v1/chat/completions");
    if (get && !strcmp(url, "/health"))
        return health(c);
    if (get && !strcmp(url, "/metrics"))
        return metrics(c);
    if (get && !strcmp(url, "/v1/models"))
        return models(c);
    if (post && (comp || chat))
        return route_generate(c, r, url, chat);
    if (comp || chat || !strcmp(url, "/health") || !strcmp(url, "/metrics") ||
        !strcmp(url, "/v1/models"))
        return send_error(c, 405, "invalid_request_error",
                          "%s is not allowed on %s", method, url);
    return send_error(c, 404, "invalid_request_error", "no endpoint %s %s",
                      method, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    rreq *r = *con_cls;
    if (!r)
        return;
    up_free(&r->up); /* a client gone: the server sees its connection close */
    if (r->live)
        done_with(r->server);
    free(r->body.p);
    free(r);
    *con_cls = NULL;
}

static void on_signal(int sig) {
    g_signal = sig;
}

/* ---- run ---- */

ts_router_options ts_router_options_default(void) {
    return (ts_router_options){.host = "127.0.0.1",
                               .port = 8000,
                               .policy = TS_POLICY_CACHE_AWARE,
                               .w_prefix = 2,
                               .w_queue = 1,
                               .w_kv = 1,
                               .health_interval_ms = 500,
                               .pd_min_blocks = 2};
}

static bool add_backend(const char *url, role ro) {
    backend *be = &R.b[R.nb];
    memset(be, 0, sizeof *be);
    size_t len = strlen(url);
    while (len && url[len - 1] == '/')
        len--;
    if (strncmp(url, "http://", 7) || len <= 7 || len >= sizeof be->url) {
        fprintf(stderr,
                "tessera route: server \"%s\" is not an http://HOST:PORT "
                "address\n",
                url);
        return false;
    }
    snprintf(be->url, sizeof be->url, "%.*s", (int)len, url);
    const char *h = be->url + 7, *colon = strrchr(h, ':');
    size_t hl = colon ? (size_t)(colon - h) : strlen(h);
    snprintf(be->host, sizeof be->host, "%.*s", (int)hl, h);
    for (int i = 0; i < R.nb; i++)
        if (!strcmp(R.b[i].url, be->url)) {
            fprintf(stderr, "tessera route: server %s is listed twice\n",
                    be->url);
            return false;
        }
    be->role = ro;
    ts_block_set_init(&be->cached);
    ts_block_set_init(&be->recent);
    R.nb++;
    return true;
}

int ts_router_run(const ts_router_options *o) {
    memset(&R, 0, sizeof R);
    R.o = *o;
    int total = o->n_servers + o->n_prefill + o->n_decode;
    if (!o->n_servers && (!o->n_prefill || !o->n_decode)) {
        fprintf(stderr, "tessera route: no servers (--server URL..., or "
                        "--prefill URL... with --decode URL...)\n");
        return 1;
    }
    if (o->n_servers && (o->n_prefill || o->n_decode)) {
        fprintf(stderr, "tessera route: --server cannot be mixed with "
                        "--prefill/--decode\n");
        return 1;
    }
    if (o->policy < 0 || o->policy > 3 || o->health_interval_ms < 10 ||
        o->pd_min_blocks < 0 || o->w_prefix < 0 || o->w_queue < 0 ||
        o->w_kv < 0) {
        fprintf(stderr, "tessera route: a policy, weight or interval is out "
                        "of range\n");
        return 1;
    }
    R.b = calloc((size_t)total, sizeof *R.b);
    if (!R.b)
        return 1;
    int rc = 1;
    struct MHD_Daemon *d = NULL;
    R.pd = o->n_prefill > 0;
    R.api_key = o->api_key && *o->api_key ? o->api_key : NULL;
    const char *skey = o->server_api_key ? o->server_api_key : R.api_key;
    if (skey && *skey) {
        if (strlen(skey) > sizeof R.server_auth - 32 || strpbrk(skey, "\r\n")) {
            fprintf(stderr, "tessera route: the server API key is longer than "
                            "500 bytes or holds a line break\n");
            free(R.b);
            return 1;
        }
        snprintf(R.server_auth, sizeof R.server_auth,
                 "Authorization: Bearer %s", skey);
    }
    int max_conns = o->max_connections > 0 ? o->max_connections
                                           : TS_ROUTER_DEFAULT_MAX_CONNECTIONS,
        per_client = o->max_connections_per_client > 0
                         ? o->max_connections_per_client
                         : TS_ROUTER_DEFAULT_PER_CLIENT,
        timeout_s = o->conn_timeout_s > 0 ? o->conn_timeout_s
                                          : TS_ROUTER_DEFAULT_TIMEOUT_S;
    pthread_mutex_init(&R.mu, NULL);
    pthread_mutex_init(&R.tok_mu, NULL);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    for (int i = 0; i < o->n_servers; i++)
        if (!add_backend(o->servers[i], ROLE_BOTH))
            goto done;
    for (int i = 0; i < o->n_prefill; i++)
        if (!add_backend(o->prefill[i], ROLE_PREFILL))
            goto done;
    for (int i = 0; i < o->n_decode; i++)
        if (!add_backend(o->decode[i], ROLE_DECODE))
            goto done;
    R.st = (ts_route_state){.policy = (ts_route_policy)o->policy,
                            .w = {o->w_prefix, o->w_queue, o->w_kv},
                            .rng = o->seed * 0x9e3779b97f4a7c15ull + 1};
    R.block_size = 16;
    if (o->model_dir) {
        if (ts_ctx_new(&R.ctx, NULL) != TS_OK ||
            ts_model_dir_check(R.ctx, o->model_dir, TS_MODEL_TOKENIZER) !=
                TS_OK ||
            ts_tokenizer_load(R.ctx, o->model_dir, &R.tok) != TS_OK) {
            fprintf(stderr, "tessera route: %s\n",
                    R.ctx ? ts_errmsg(R.ctx) : "out of memory");
            goto done;
        }
        if (ts_chat_load(R.ctx, o->model_dir, &R.chat) != TS_OK)
            ts_clear_error(R.ctx); /* completions only */
    } else if (o->policy == TS_POLICY_CACHE_AWARE)
        logf_("no -m MODEL_DIR: cache-aware routing cannot see prompts; it "
              "routes by load");
    /* the block size the servers use (all must agree) */
    for (int i = 0; i < R.nb; i++) {
        ts_sbuf out = {0};
        char err[CURL_ERROR_SIZE + 64];
        if (http_call(R.b[i].url, "/v1/kv_cache", NULL, 0, 2000, &out, err,
                      sizeof err) == 200) {
            json_t *j = json_loadb(out.p, out.n, 0, NULL);
            json_int_t bs =
                json_integer_value(json_object_get(j, "block_size"));
            if (bs > 0)
                R.block_size = bs;
            json_decref(j);
            free(out.p);
            break;
        }
        free(out.p);
    }
    for (int i = 0; i < R.nb; i++) {
        pthread_create(&R.b[i].monitor, NULL, monitor_loop, &R.b[i]);
        pthread_create(&R.b[i].events, NULL, events_loop, &R.b[i]);
    }
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host ? o->host : "127.0.0.1", &addr.sin_addr) !=
        1) {
        fprintf(stderr, "tessera route: bad listen address \"%s\"\n", o->host);
        goto stop;
    }
    /* MHD's idle limit runs while a request is read or a response
     * written, not while the handler proxies or a stream's callback waits
     * for the server (which writes a keep-alive every second) */
    d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
            MHD_USE_POLL | MHD_USE_ITC,
        (uint16_t)o->port, NULL, NULL, handle, NULL, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conns,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)per_client,
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "tessera route: cannot listen on %s:%d\n",
                o->host ? o->host : "127.0.0.1", o->port);
        goto stop;
    }
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = info ? info->port : o->port;
    logf_("%d servers on http://%s:%d, policy %s%s (blocks of %lld)", R.nb,
          o->host ? o->host : "127.0.0.1", port,
          ts_route_policy_name(R.st.policy),
          R.pd ? ", prefill/decode disaggregated" : "",
          (long long)R.block_size);
    if (o->on_listen)
        o->on_listen(port, o->on_listen_arg);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    while (!g_signal)
        usleep(100000);
    MHD_quiesce_daemon(d); /* running requests finish */
    for (int waited = 0; waited < 600; waited++) {
        int64_t busy = 0;
        pthread_mutex_lock(&R.mu);
        for (int i = 0; i < R.nb; i++)
            busy += R.b[i].inflight;
        pthread_mutex_unlock(&R.mu);
        if (!busy)
            break;
        usleep(100000);
    }
    logf_("stopped (signal %d)", (int)g_signal);
    rc = 0;
stop:
    R.stop = 1;
    if (d)
        MHD_stop_daemon(d);
    for (int i = 0; i < R.nb; i++) {
        pthread_join(R.b[i].monitor, NULL);
        pthread_join(R.b[i].events, NULL);
    }
done:
    for (int i = 0; i < R.nb; i++) {
        ts_block_set_free(&R.b[i].cached);
        ts_block_set_free(&R.b[i].recent);
    }
    free(R.b);
    ts_chat_free(R.chat);
    ts_tokenizer_free(R.tok);
    if (R.ctx)
        ts_ctx_free(R.ctx);
    curl_global_cleanup();
    return rc;
}
