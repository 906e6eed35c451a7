/* route.c — `tessera route`: one OpenAI-compatible address in front of
 * many `tessera serve` instances (src/router, docs/ROUTER.md). Options on
 * the command line (its options table) or in a JSON file with the same
 * keys. */
#include "tessera_router.h"

#include "cli/opts.h"
#include "router/policy.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    O_CONFIG = 1,
    O_LISTEN,
    O_SERVER,
    O_PREFILL,
    O_DECODE,
    O_MODEL,
    O_POLICY,
    O_WEIGHTS,
    O_SEED,
    O_HEALTH,
    O_API_KEY,
    O_SERVER_KEY,
    O_MAX_CONN,
    O_MAX_CONN_CLIENT,
    O_CONN_TIMEOUT,
    O_PD_MIN,
};

#define STR_(x) #x
#define STR(x)  STR_(x)

static const cli_opt ROUTE_OPTS[] = {
    {O_LISTEN, "--listen", CLI_STR, "HOST:PORT", .def = "127.0.0.1:8000",
     .help = "the address to listen on (PORT alone: on 127.0.0.1)"},
    {O_SERVER, "--server", CLI_STR, "URL",
     .help = "a tessera serve instance to route to (repeatable)"},
    {O_PREFILL, "--prefill", CLI_STR, "URL",
     .help = "a prefill server of a disaggregated pair (repeatable, with "
             "--decode); each needs every decode server's KV address in its "
             "--kv-peers"},
    {O_DECODE, "--decode", CLI_STR, "URL",
     .help = "a decode server (repeatable, with --prefill)"},
    {O_MODEL, "-m, --model", CLI_STR, "DIR",
     .def = "none (the approximate cache-aware scorer)",
     .help = "the model folder, whose tokenizer makes prefix matching exact"},
    {O_POLICY, "--policy", CLI_CHOICE,
     .choices = "cache-aware|load|round-robin|random", .def = "cache-aware",
     .help = "how a request picks its server"},
    {O_WEIGHTS, "--weights", CLI_STR, "prefix=2,queue=1,kv=1",
     .def = "prefix=2,queue=1,kv=1",
     .help = "the cache-aware scorer's weights"},
    {O_SEED, "--seed", CLI_INT, "N", 0, 9.2e18, .def = "0",
     .help = "the random policy's and tie-breaks' seed"},
    {O_HEALTH, "--health-interval", CLI_INT, "MS", 10, 600000, .def = "500",
     .help = "how often each server's /health is polled"},
    {O_PD_MIN, "--pd-min-blocks", CLI_INT, "N", 0, 1 << 20, .def = "2",
     .help = "prompts shorter than N KV blocks skip the prefill server"},
    {O_CONFIG, "--config", CLI_STR, "FILE.json",
     .help = "the options in a JSON object (keys: listen, servers, prefill, "
             "decode, model, policy, weights {prefix, queue, kv}, seed, "
             "health_interval_ms, pd_min_blocks, max_connections, "
             "max_connections_per_client, conn_timeout); later flags override"},
    {O_API_KEY, "--api-key", CLI_STR, "KEY",
     .def = "$TESSERA_API_KEY, else none",
     .help = "clients send \"Authorization: Bearer KEY\" to /v1/"},
    {O_SERVER_KEY, "--server-api-key", CLI_STR, "KEY",
     .def = "$TESSERA_SERVER_API_KEY, else the --api-key",
     .help = "the key sent to the servers"},
    {O_MAX_CONN, "--max-connections", CLI_INT, "N", 1, 65536,
     .def = STR(TS_ROUTER_DEFAULT_MAX_CONNECTIONS),
     .want = "a count in 1..65536", .help = "client connections at once"},
    {O_MAX_CONN_CLIENT, "--max-connections-per-client", CLI_INT, "N", 1, 65536,
     .def = STR(TS_ROUTER_DEFAULT_PER_CLIENT), .want = "a count in 1..65536",
     .help = "connections from one address"},
    {O_CONN_TIMEOUT, "--conn-timeout", CLI_INT, "SECONDS", 1, 3600,
     .def = STR(TS_ROUTER_DEFAULT_TIMEOUT_S),
     .want = "whole seconds in 1..3600",
     .help = "a client connection silent this long while its request is read "
             "or its response written is closed"},
    {0},
};

static const cli_cmd ROUTE_CMD = {
    .name = "route",
    .usage = "route --listen HOST:PORT --server URL [--server URL ...] "
             "[options]\n"
             "       tessera route --listen HOST:PORT --prefill URL... "
             "--decode URL... [-m DIR]\n"
             "       tessera route --config FILE.json",
    .about = "One OpenAI-compatible address in front of many tessera serve "
             "instances (docs/ROUTER.md).",
    .opts = ROUTE_OPTS,
    .short_threads = true,
};

static bool parse_long(const char *s, long long lo, long long hi,
                       long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* "HOST:PORT" or "PORT" */
static bool parse_listen(const char *s, ts_router_options *o, char *host,
                         size_t cap) {
    const char *colon = strrchr(s, ':');
    long long port;
    if (!parse_long(colon ? colon + 1 : s, 0, 65535, &port))
        return false;
    if (colon) {
        if ((size_t)(colon - s) >= cap || colon == s)
            return false;
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = 0;
        o->host = host;
    }
    o->port = (int)port;
    return true;
}

static bool add_url(const char **list, int *n, const char *url) {
    if (*n == TS_ROUTER_MAX_SERVERS) {
        fprintf(stderr, "tessera route: at most %d servers per list\n",
                TS_ROUTER_MAX_SERVERS);
        return false;
    }
    list[(*n)++] = url;
    return true;
}

static char g_host[256];

/* the JSON config's keys onto o; strings stay owned by cfg */
static bool load_config(const char *path, json_t **cfg, ts_router_options *o) {
    json_error_t je;
    json_t *j = *cfg = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(j)) {
        fprintf(stderr, "tessera route: %s: %s\n", path,
                j ? "the config must be a JSON object" : je.text);
        return false;
    }
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v) {
        bool ok = true;
        if (!strcmp(key, "listen"))
            ok = json_is_string(v) &&
                 parse_listen(json_string_value(v), o, g_host, sizeof g_host);
        else if (!strcmp(key, "servers") || !strcmp(key, "prefill") ||
                 !strcmp(key, "decode")) {
            const char **list = !strcmp(key, "servers")   ? o->servers
                                : !strcmp(key, "prefill") ? o->prefill
                                                          : o->decode;
            int *n = !strcmp(key, "servers")   ? &o->n_servers
                     : !strcmp(key, "prefill") ? &o->n_prefill
                                               : &o->n_decode;
            size_t i;
            json_t *u;
            ok = json_is_array(v);
            json_array_foreach(v, i, u) ok =
                ok && json_is_string(u) &&
                add_url(list, n, json_string_value(u));
        } else if (!strcmp(key, "model"))
            ok = json_is_string(v), o->model_dir = json_string_value(v);
        else if (!strcmp(key, "policy"))
            ok = (o->policy = ts_route_policy_parse(json_string_value(v))) >= 0;
        else if (!strcmp(key, "weights")) {
            const char *wk;
            json_t *wv;
            ok = json_is_object(v);
            json_object_foreach(v, wk, wv) {
                double x = json_number_value(wv);
                if (!json_is_number(wv) || x < 0)
                    ok = false;
                else if (!strcmp(wk, "prefix"))
                    o->w_prefix = x;
                else if (!strcmp(wk, "queue"))
                    o->w_queue = x;
                else if (!strcmp(wk, "kv"))
                    o->w_kv = x;
                else
                    ok = false;
            }
        } else if (!strcmp(key, "seed"))
            ok = json_is_integer(v) && json_integer_value(v) >= 0,
            o->seed = (uint64_t)json_integer_value(v);
        else if (!strcmp(key, "health_interval_ms"))
            ok = json_is_integer(v) && json_integer_value(v) >= 10 &&
                 json_integer_value(v) <= 600000,
            o->health_interval_ms = (int)json_integer_value(v);
        else if (!strcmp(key, "max_connections") ||
                 !strcmp(key, "max_connections_per_client") ||
                 !strcmp(key, "conn_timeout")) {
            bool t = !strcmp(key, "conn_timeout");
            int *dst = t ? &o->conn_timeout_s
                       : !strcmp(key, "max_connections")
                           ? &o->max_connections
                           : &o->max_connections_per_client;
            ok = json_is_integer(v) && json_integer_value(v) >= 1 &&
                 json_integer_value(v) <= (t ? 3600 : 65536);
            if (ok)
                *dst = (int)json_integer_value(v);
        } else if (!strcmp(key, "pd_min_blocks"))
            ok = json_is_integer(v) && json_integer_value(v) >= 0 &&
                 json_integer_value(v) <= 1 << 20,
            o->pd_min_blocks = (int)json_integer_value(v);
        else {
            fprintf(stderr, "tessera route: %s: unknown key \"%s\"\n", path,
                    key);
            return false;
        }
        if (!ok) {
            fprintf(stderr, "tessera route: %s: bad value for \"%s\"\n", path,
                    key);
            return false;
        }
    }
    return true;
}

/* one option onto o; false (with the message printed) when it is wrong */
static bool route_opt(ts_router_options *o, json_t **cfg, int id,
                      const cli_val *v) {
    const char *bad = NULL;
    ts_route_weights w = {o->w_prefix, o->w_queue, o->w_kv};
    switch (id) {
    case O_CONFIG:
        json_decref(*cfg);
        return load_config(v->s, cfg, o);
    case O_LISTEN:
        if (!parse_listen(v->s, o, g_host, sizeof g_host))
            return cli_fail(&ROUTE_CMD,
                            "--listen \"%s\": want HOST:PORT or PORT "
                            "(0..65535)",
                            v->s),
                   false;
        return true;
    case O_SERVER:
        return add_url(o->servers, &o->n_servers, v->s);
    case O_PREFILL:
        return add_url(o->prefill, &o->n_prefill, v->s);
    case O_DECODE:
        return add_url(o->decode, &o->n_decode, v->s);
    case O_MODEL:
        o->model_dir = v->s;
        return true;
    case O_POLICY:
        o->policy = ts_route_policy_parse(v->s);
        return true;
    case O_WEIGHTS:
        if (!ts_route_weights_parse(v->s, &w, &bad))
            return cli_fail(&ROUTE_CMD,
                            "--weights: \"%s\" is not prefix=, queue= or kv= "
                            "with a number >= 0",
                            bad),
                   false;
        o->w_prefix = w.prefix, o->w_queue = w.queue, o->w_kv = w.kv;
        return true;
    case O_SEED:
        o->seed = (uint64_t)v->i;
        return true;
    case O_HEALTH:
        o->health_interval_ms = (int)v->i;
        return true;
    case O_API_KEY:
        o->api_key = v->s;
        return true;
    case O_SERVER_KEY:
        o->server_api_key = v->s;
        return true;
    case O_MAX_CONN:
        o->max_connections = (int)v->i;
        return true;
    case O_MAX_CONN_CLIENT:
        o->max_connections_per_client = (int)v->i;
        return true;
    case O_CONN_TIMEOUT:
        o->conn_timeout_s = (int)v->i;
        return true;
    case O_PD_MIN:
        o->pd_min_blocks = (int)v->i;
        return true;
    }
    return false;
}

int tessera_route(int argc, char **argv) {
    ts_router_options o = ts_router_options_default();
    const char *k = getenv("TESSERA_API_KEY"),
               *sk = getenv("TESSERA_SERVER_API_KEY");
    o.api_key = k && *k ? k : NULL;
    o.server_api_key = sk && *sk ? sk : NULL;
    json_t *cfg = NULL;
    int rc = 2;
    cli_parser p;
    cli_val v;
    cli_begin(&p, &ROUTE_CMD, argc, argv);
    for (int id; (id = cli_next(&p, &v)) != CLI_END;) {
        if (id == CLI_HELP) {
            cli_help(&ROUTE_CMD, stdout);
            rc = 0;
            goto out;
        }
        if (id == CLI_ERROR)
            goto out;
        if (id == CLI_POSITIONAL) {
            cli_fail(&ROUTE_CMD,
                     "unexpected argument \"%s\" (servers are --server URL; "
                     "see tessera route --help)",
                     v.s);
            goto out;
        }
        if (!route_opt(&o, &cfg, id, &v))
            goto out;
    }
    rc = ts_router_run(&o);
out:
    json_decref(cfg);
    return rc;
}
