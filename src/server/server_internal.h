/* server_internal.h — what the server's two halves share: server.c (HTTP
 * plumbing: the listener, routing, the engine thread, metrics, KV
 * transfer, lifecycle) and openai.c (the OpenAI protocol: a completion or
 * chat request's parameters, its choices in the engine, whole and
 * streamed responses). The request and choice records, the one server
 * state (srv) and the helpers both call. Not a public header. */
#ifndef TS_SERVER_INTERNAL_H
#define TS_SERVER_INTERNAL_H

#include "tessera_server.h"
#include "tessera_tokenizer.h"

#include "auth.h"
#include "kv_transfer.h"

#include "core/strbuf.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#define MAX_BODY     (16 << 20)
#define MAX_CHOICES  128 /* prompts x best_of (or n) in one request */
#define MAX_STOPS    8
#define EVENT_KEEP   65536
#define KEEPALIVE_MS 1000

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
    /* openai.c's: the sum of its tokens' log-probabilities (best_of ranks
     * by their mean) */
    double sum_lp;
    /* echo: the prompt's text, its first token and the engine's
     * log-probabilities of the others (prompt_lp, owned) */
    char *echo;
    size_t n_echo;
    int32_t prompt0;
    ts_engine_output *plp;
    size_t n_plp;
    bool echo_sent;
    /* tool calling: the parser fed with the decoded text (content goes
     * to text) once no stop string can start in it (raw: the decoded
     * text not yet fed), stream deltas not yet sent, the calls once
     * finished */
    struct ts_tool_parser *tp;
    ts_sbuf raw;
    json_t *tool_deltas, *tool_calls;
    /* embeddings (server.c / embeddings.c) */
    float *embedding; /* malloc'd: the engine's pooled vector, dim floats */
    int64_t dim;
    /* speculative decoding so far: tokens proposed for this choice and
     * accepted of those (the engine's cumulative figures) */
    int64_t spec_proposed, spec_accepted;
} choice;

typedef enum { REQ_OTHER, REQ_COMPLETION, REQ_CHAT, REQ_EVENTS } req_kind;

typedef struct hreq {
    ts_sbuf body;
    bool too_big, unauthorized; /* unauthorized: its body is not kept */
    req_kind kind;
    bool stream, include_usage, cancelled, usage_sent, done_sent;
    int logprobs; /* as ts_request: 0 none, 1 + N top */
    int n;        /* choices in the engine: n_prompts x per_prompt */
    int n_prompts, per_prompt, n_out; /* per_prompt: best_of (or n); n_out:
                                         n, the ones each prompt returns */
    bool echo;
    struct ts_tool_request *tools; /* chat with tools (NULL: none) */
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
    /* embeddings (server.c / embeddings.c) */
    /* the request's log line and metrics: what was asked, the status
     * sent, when its first output came and how long it queued */
    char method[8], path[48];
    int status;
    double t_first, queue_s;
    /* an /v1/embeddings request: one choice per input (ech, n_ech) */
    bool embed;
    choice *ech;
    int n_ech;
} hreq;

/* ---- server state ---- */

/* histograms' upper bounds (seconds or tokens), vLLM's where it has them */
#define N_E2E 16
static const double E2E_B[N_E2E] = {0.3, 0.5, 0.8, 1,  1.5, 2,  2.5, 5,
                                    10,  15,  20,  30, 40,  50, 60,  120};
#define N_NTOK 14
static const double NTOK_B[N_NTOK] = {1,   2,   5,    10,   20,   50,    100,
                                      200, 500, 1000, 2000, 5000, 10000, 20000};

#define N_TTFT 11
#define N_ITL  9
static const double TTFT_B[N_TTFT] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1,    2.5,   5,    10,  30};
static const double ITL_B[N_ITL] = {0.005, 0.01, 0.025, 0.05, 0.1,
                                    0.25,  0.5,  1,     2.5};

typedef struct {
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
    atomic_int eng_want; /* threads waiting for eng_mu (see srv_eng_lock) */
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
    /* issue 19: CORS (NULL: none), the embeddings' pooling, the request
     * log; per request (out_mu): latency, queue time and size histograms,
     * finish reasons (stop, length, abort) */
    ts_origins *origins;
    ts_pooling pooling;
    bool no_log_requests;
    uint64_t e2e_hist[N_E2E + 1], queue_hist[N_E2E + 1];
    double e2e_sum, queue_sum;
    uint64_t ptok_hist[N_NTOK + 1], gtok_hist[N_NTOK + 1];
    double ptok_sum, gtok_sum;
    uint64_t finished[3];
    /* speculative decoding (issue 22): the proposer (NONE: off, no
     * spec_decode metrics or prediction usage) and the draft model
     * loaded beside the model (TS_SPEC_DRAFT), freed after the engine */
    ts_spec_method spec;
    ts_lm *draft;
} srv_state;

extern srv_state srv;
extern volatile sig_atomic_t srv_signal;

/* ---- server.c ---- */
double srv_now(void);
void srv_count_status(int code);
void srv_observe(uint64_t *hist, const double *bounds, int nb, double *sum,
                 double v);
enum MHD_Result srv_send_text(struct MHD_Connection *c, int code,
                              const char *type, const char *text);
enum MHD_Result srv_send_json(struct MHD_Connection *c, int code, json_t *j);
/* OpenAI's error object */
enum MHD_Result srv_send_error(struct MHD_Connection *c, int code,
                               const char *type, const char *param,
                               const char *codestr, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
void srv_active_remove(choice *c);
void srv_eng_lock(void);
json_t *srv_send_prefill(hreq *r);
/* CORS headers for c's Origin on a response about to be queued (none
 * unless --allowed-origins lets that origin in); every response gets them,
 * streamed ones too */
void srv_cors_headers(struct MHD_Connection *c, struct MHD_Response *resp);

/* ---- embeddings.c ---- */
/* n bytes in base64 (malloc'd, NUL-terminated), or NULL */
char *srv_base64(const unsigned char *b, size_t n);

/* ---- images.c: a diffusion pipeline's server ---- */
/* model_dir holds a Diffusers pipeline (model_index.json) */
bool srv_is_pipeline(const char *model_dir);
/* serves /v1/images/generations (and /health, /v1/models, /metrics) for
 * the pipeline in o->model_dir until a signal or ts_server_stop */
int srv_images_run(const ts_server_options *o);

/* ---- metrics.c ---- */
enum MHD_Result srv_metrics(struct MHD_Connection *c);
/* a request's end (MHD's completed callback): its metrics and log line */
void srv_request_end(hreq *r);

/* ---- tokenize.c: /tokenize, /detokenize, /version ---- */
enum MHD_Result srv_tokenize(struct MHD_Connection *c, hreq *r);
enum MHD_Result srv_detokenize(struct MHD_Connection *c, hreq *r);
enum MHD_Result srv_version(struct MHD_Connection *c);

/* ---- embeddings.c ---- */
enum MHD_Result srv_embeddings(struct MHD_Connection *c, hreq *r);
/* an embedding choice's one output (out_mu held, on the engine thread):
 * takes o's vector */
void srv_embed_deliver(choice *c, ts_engine_output *o);
/* aborts r's unfinished inputs in the engine and frees their vectors */
void srv_embed_free(hreq *r);

/* ---- openai.c ---- */
/* once the tokenizer is loaded (ts_server_run) and at the end: the
 * structured-output vocabulary and grammar cache; nonzero with err
 * filled on failure */
int srv_openai_init(char *err, size_t cap);
void srv_openai_fini(void);
bool srv_deliver(choice *c, const ts_engine_output *o);
/* room in srv.active for n more choices (out_mu held), taken before they
 * enter the engine so that none is left outside the list; false when out
 * of memory. Every caller holds eng_mu, so the room stays theirs. */
bool srv_active_reserve(int n);
/* Waits (out_mu held) until ch[0, n) are finished. false when the client
 * of c hung up (or MHD shut its socket down at exit), or the server is
 * stopping and nothing will ever finish them: then those still running
 * are aborted in the engine (their slots and KV blocks freed) and marked
 * finished, "abort". */
bool srv_wait_finished(struct MHD_Connection *c, choice *ch, int n);
enum MHD_Result srv_generate(struct MHD_Connection *c, hreq *r);
/* frees what openai.c keeps in r and its choices (echo text, prompt
 * log-probabilities, tool parsers and calls); idempotent. server.c's
 * completed() calls it before freeing r; openai.c calls it once a
 * response is written */
void srv_openai_release(hreq *r);

#endif
