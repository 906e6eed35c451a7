/* auth.h — what the server and the router check before they act on a
 * request: the API key (Authorization: Bearer KEY, compared in constant
 * time), the KV-transfer peers an operator allowed (--kv-peers) and the
 * browser origins CORS lets in (--allowed-origins). */
#ifndef TS_SERVER_AUTH_H
#define TS_SERVER_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* a == b, in a time that depends on the lengths only, not on where the
 * bytes first differ */
bool ts_ct_equal(const char *a, size_t alen, const char *b, size_t blen);

/* header: the request's Authorization value (NULL: none); key: the
 * expected API key. True when it is "Bearer KEY" (the scheme in any
 * case, spaces after it skipped). */
bool ts_bearer_ok(const char *header, const char *key);

#define TS_MAX_KV_PEERS 64

/* "HOST:PORT,HOST:PORT,..." as the operator gave it */
typedef struct {
    char host[TS_MAX_KV_PEERS][128];
    int port[TS_MAX_KV_PEERS];
    int n;
} ts_kv_peers;

/* Parses list into p. 0, or -1 with err naming the entry at fault. */
int ts_kv_peers_parse(const char *list, ts_kv_peers *p, char *err,
                      size_t errcap);

/* target ("HOST:PORT") is one of p's entries: the host as written (case
 * does not matter), the port as a number. Nothing is resolved. */
bool ts_kv_peers_allow(const ts_kv_peers *p, const char *target);

/* the addresses a decode server takes KV blocks from (--kv-senders):
 * numeric IPv4 addresses, or any */
typedef struct {
    uint32_t addr[TS_MAX_KV_PEERS]; /* network order */
    int n;
    bool any;
} ts_kv_senders;

/* "A.B.C.D,..." or "any" into s. 0, or -1 with err naming the entry. */
int ts_kv_senders_parse(const char *list, ts_kv_senders *s, char *err,
                        size_t errcap);

/* a connection from peer may send KV blocks: one of s's addresses, or
 * with s NULL a loopback address (127.0.0.0/8) */
bool ts_kv_senders_allow(const ts_kv_senders *s, const struct sockaddr *peer);

/* the browser origins CORS lets in (--allowed-origins): "*" or a list of
 * "scheme://host[:port]" as browsers send them in Origin */
#define TS_MAX_ORIGINS 32
typedef struct {
    char origin[TS_MAX_ORIGINS][256];
    int n;
    bool any;
} ts_origins;

/* "*" or "https://a.example,http://b:8080" into o (spaces around entries
 * ignored). 0, or -1 with err naming the entry at fault. */
int ts_origins_parse(const char *list, ts_origins *o, char *err, size_t errcap);

/* the Access-Control-Allow-Origin value for a request from origin ("*",
 * or origin itself when listed; the scheme and host in any case), or NULL
 * when it is not let in (origin NULL: not a cross-origin request) */
const char *ts_origins_allow(const ts_origins *o, const char *origin);

#endif
