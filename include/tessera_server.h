/* tessera_server.h — an OpenAI-compatible HTTP server over the engine:
 * /v1/completions and /v1/chat/completions (streamed as Server-Sent
 * Events or whole), /v1/embeddings, /v1/models, vLLM's /tokenize,
 * /detokenize and /version, /health, /metrics (Prometheus text: tessera_*
 * and vLLM's vllm:* names), /v1/kv_events (the prefix cache's block
 * events as JSON lines), /v1/kv_cache (a snapshot of the cached blocks),
 * and a chat page at /. A completion or chat request with
 * "kv_transfer_params": {"target": "HOST:PORT"} is a prefill for another
 * server: its prompt's KV blocks are computed and sent there
 * (src/server/kv_transfer.h) and the response says how it went. The
 * target must be one of kv_peers (the operator's allow-list); a server
 * without kv_peers sends KV nowhere. With api_key, every endpoint but
 * /health, /metrics, /version, the page and CORS preflights wants
 * "Authorization: Bearer KEY" (401 otherwise). One line per request on
 * stderr. docs/SERVING.md has the details. */
#ifndef TESSERA_SERVER_H
#define TESSERA_SERVER_H

#include "tessera_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_SERVER_DEFAULT_MAX_CONNECTIONS 1024
#define TS_SERVER_DEFAULT_PER_CLIENT      512
#define TS_SERVER_DEFAULT_TIMEOUT_S       15
#define TS_KV_MAX_CONNECTIONS             16

typedef struct {
    const char *model_dir;
    const char *model_name; /* NULL: the folder's last component */
    const char *host;       /* "127.0.0.1" */
    int port;               /* 8000 */
    ts_dtype weight_dtype;  /* TS_F32 or TS_BF16 */
    bool no_check_weights;  /* skip the NaN/Inf pass over the weights */
    const char *device_map; /* NULL: the current device */
    ts_engine_options engine;
    /* prefill/decode disaggregation: a port (0: any) on host where this
     * server takes KV blocks from prefill servers into its prefix cache;
     * -1: none. /health names it. */
    int kv_port;
    bool no_kv_events; /* /v1/kv_events and /v1/kv_cache answer 404 */
    /* prefill/decode disaggregation, the sending side: the decode servers'
     * KV addresses "HOST:PORT,..." a request may name as its
     * kv_transfer_params target (exactly as written); NULL: none may */
    const char *kv_peers;
    /* the receiving side (kv_port): the IPv4 addresses "A.B.C.D,..." (or
     * "any") that may send KV blocks; NULL: loopback only */
    const char *kv_senders;
    const char *api_key; /* NULL or "": no authentication */
    /* a chat template for models without one (or to replace theirs): a
     * file's path or a built-in's name (ts_chat_builtin_names); NULL: the
     * model's own */
    const char *chat_template;
    /* CORS: "*" or "https://a.example,http://b:8080"; NULL: no CORS
     * headers (a browser on another origin is refused by the browser).
     * OPTIONS on any path is answered 204 (a preflight; no key needed) */
    const char *allowed_origins;
    /* /v1/embeddings' pooling of the final norm's output over a prompt
     * (TS_POOL_LAST or TS_POOL_MEAN; NONE: LAST), L2-normalized */
    ts_pooling pooling;
    /* the longest prompt + output in tokens (vLLM's --max-model-len); 0:
     * the model's max_position_embeddings (larger is an error) */
    int64_t max_model_len;
    /* no per-request line on stderr (id, method, path, status, tokens,
     * time to first token, total time, finish reasons) */
    bool no_log_requests;
    /* listener limits, 0: the defaults (TS_SERVER_DEFAULT_*): connections
     * in all, from one client address, and the seconds a connection may
     * stay silent while its request is read or its response written
     * (a stream writes a keep-alive every second); the KV receiver takes
     * the same timeout and at most TS_KV_MAX_CONNECTIONS at once */
    int max_connections, max_connections_per_client, conn_timeout_s;
    /* written once listening (the port actually bound, e.g. for port 0) */
    void (*on_listen)(int port, void *arg);
    void *on_listen_arg;
    /* SIGINT and SIGTERM left alone (a host program, e.g. Python, keeps its
     * own handlers): only ts_server_stop ends the server */
    bool no_signal_handlers;
    /* engine.spec TS_SPEC_DRAFT: the draft model's folder or GGUF file (its
     * vocabulary must be the model's); loaded beside the model */
    const char *draft_model_dir;
} ts_server_options;

/* Loads the model and serves until SIGINT or SIGTERM (or ts_server_stop),
 * then stops taking requests, finishes the running ones and returns 0 (1
 * on a startup error, printed to stderr and kept for
 * ts_server_last_error). One server per process at a time. */
int ts_server_run(const ts_server_options *o);
/* From any thread: the running server stops as on SIGTERM (ts_server_run
 * returns once its running requests are done; asked while the model still
 * loads, it returns as soon as it listens). A no-op when none runs. */
void ts_server_stop(void);
/* Why the last ts_server_run returned 1 ("cannot listen on
 * 127.0.0.1:8000 (Address already in use)"); "" after a clean run. Read
 * it once ts_server_run has returned. */
const char *ts_server_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
