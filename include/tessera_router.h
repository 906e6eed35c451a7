/* tessera_router.h — many `tessera serve` instances behind one
 * OpenAI-compatible address (src/router, docs/ROUTER.md): prefix-cache-
 * aware and load-aware routing, health checks and failover, and
 * prefill/decode disaggregation with the KV cache moved between servers. */
#ifndef TESSERA_ROUTER_H
#define TESSERA_ROUTER_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_ROUTER_MAX_SERVERS 64
/* listener limits when not given; a server behind a router takes all
 * of the router's connections from one address, so the server's
 * per-client default (512) is at least the router's total */
#define TS_ROUTER_DEFAULT_MAX_CONNECTIONS 512
#define TS_ROUTER_DEFAULT_PER_CLIENT      128
#define TS_ROUTER_DEFAULT_TIMEOUT_S       15

typedef struct {
    const char *host; /* "127.0.0.1" */
    int port;         /* 8000 */
    /* plain servers (each prefills and decodes) ... */
    const char *servers[TS_ROUTER_MAX_SERVERS];
    int n_servers;
    /* ... or disaggregated: prefill servers and decode servers (with
     * --kv-port) */
    const char *prefill[TS_ROUTER_MAX_SERVERS];
    int n_prefill;
    const char *decode[TS_ROUTER_MAX_SERVERS];
    int n_decode;
    const char *model_dir; /* tokenizer and chat template; NULL: none (the
                              prefix scorer then sees no blocks) */
    int policy;            /* ts_route_policy: 0 cache-aware, 1 load,
                              2 round-robin, 3 random */
    double w_prefix, w_queue, w_kv;
    uint64_t seed;
    int health_interval_ms; /* 500 */
    int pd_min_blocks;      /* prefill elsewhere when the decode server
                               lacks at least this many blocks (2) */
    /* clients must send "Authorization: Bearer api_key" to /v1/ (NULL or
     * "": anyone may); the servers get server_api_key (NULL: api_key) on
     * every request the router makes to them */
    const char *api_key, *server_api_key;
    /* listener limits as ts_server_options' (0: the same defaults) */
    int max_connections, max_connections_per_client, conn_timeout_s;
    void (*on_listen)(int port, void *arg);
    void *on_listen_arg;
} ts_router_options;

/* Defaults as above, no servers. */
ts_router_options ts_router_options_default(void);

/* Serves until SIGINT or SIGTERM, then stops taking requests, lets the
 * running ones finish and returns 0 (1 on a startup error, printed). */
int ts_router_run(const ts_router_options *o);

#ifdef __cplusplus
}
#endif
#endif
