/* route.c — `tessera route`: one OpenAI-compatible address in front of
 * many `tessera serve` instances (src/router, docs/ROUTER.md). Options on
 * the command line or in a JSON file with the same keys. */
#include "tessera_router.h"

#include "router/policy.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(FILE *f) {
    fprintf(f,
            "usage: tessera route --listen HOST:PORT --server URL [--server "
            "URL ...]\n"
            "         [-m MODEL_DIR] [--policy "
            "cache-aware|load|round-robin|random]\n"
            "         [--weights prefix=2,queue=1,kv=1] [--seed N] "
            "[--health-interval MS]\n"
            "       tessera route --listen HOST:PORT --prefill URL... "
            "--decode URL... [-m DIR]\n"
            "         [--pd-min-blocks 2] (each prefill server needs every "
            "decode server's\n"
            "         KV address in its --kv-peers: HOST of the --decode URL, "
            "its --kv-port)\n"
            "       tessera route --config FILE.json (keys: listen, servers, "
            "prefill, decode, model,\n"
            "         policy, weights {prefix, queue, kv}, seed, "
            "health_interval_ms, pd_min_blocks,\n"
            "         max_connections, max_connections_per_client, "
            "conn_timeout)\n"
            "     any form: [--api-key KEY] (clients send \"Authorization: "
            "Bearer KEY\" to /v1/;\n"
            "         default: $TESSERA_API_KEY) [--server-api-key KEY] (sent "
            "to the servers;\n"
            "         default: $TESSERA_SERVER_API_KEY, else the --api-key)\n"
            "         [--max-connections N] (%d) "
            "[--max-connections-per-client N] (%d)\n"
            "         [--conn-timeout SECONDS] (%d: a client connection "
            "silent this long while its\n"
            "         request is read or its response written is closed)\n",
            TS_ROUTER_DEFAULT_MAX_CONNECTIONS, TS_ROUTER_DEFAULT_PER_CLIENT,
            TS_ROUTER_DEFAULT_TIMEOUT_S);
    return f == stdout ? 0 : 2;
}

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

int tessera_route(int argc, char **argv) {
    ts_router_options o = ts_router_options_default();
    const char *k = getenv("TESSERA_API_KEY"),
               *sk = getenv("TESSERA_SERVER_API_KEY");
    o.api_key = k && *k ? k : NULL;
    o.server_api_key = sk && *sk ? sk : NULL;
    json_t *cfg = NULL;
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        const char *bad = NULL;
        ts_route_weights w = {o.w_prefix, o.w_queue, o.w_kv};
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            json_decref(cfg);
            return usage(stdout);
        } else if (!strcmp(a, "--config") && v) {
            json_decref(cfg);
            if (!load_config(v, &cfg, &o))
                goto out;
            i++;
        } else if (!strcmp(a, "--listen") && v &&
                   parse_listen(v, &o, g_host, sizeof g_host))
            i++;
        else if (!strcmp(a, "--server") && v) {
            if (!add_url(o.servers, &o.n_servers, v))
                goto out;
            i++;
        } else if (!strcmp(a, "--prefill") && v) {
            if (!add_url(o.prefill, &o.n_prefill, v))
                goto out;
            i++;
        } else if (!strcmp(a, "--decode") && v) {
            if (!add_url(o.decode, &o.n_decode, v))
                goto out;
            i++;
        } else if (!strcmp(a, "-m") && v)
            o.model_dir = v, i++;
        else if (!strcmp(a, "--policy") && v && ts_route_policy_parse(v) >= 0)
            o.policy = ts_route_policy_parse(v), i++;
        else if (!strcmp(a, "--weights") && v) {
            if (!ts_route_weights_parse(v, &w, &bad)) {
                fprintf(stderr,
                        "tessera route: --weights: \"%s\" is not prefix=, "
                        "queue= or kv= with a number >= 0\n",
                        bad);
                goto out;
            }
            o.w_prefix = w.prefix, o.w_queue = w.queue, o.w_kv = w.kv;
            i++;
        } else if (!strcmp(a, "--seed") && v && parse_long(v, 0, INT64_MAX, &n))
            o.seed = (uint64_t)n, i++;
        else if (!strcmp(a, "--health-interval") && v &&
                 parse_long(v, 10, 600000, &n))
            o.health_interval_ms = (int)n, i++;
        else if (!strcmp(a, "--api-key") && v && *v)
            o.api_key = v, i++;
        else if (!strcmp(a, "--server-api-key") && v && *v)
            o.server_api_key = v, i++;
        else if (!strcmp(a, "--max-connections") && v &&
                 parse_long(v, 1, 65536, &n))
            o.max_connections = (int)n, i++;
        else if (!strcmp(a, "--max-connections-per-client") && v &&
                 parse_long(v, 1, 65536, &n))
            o.max_connections_per_client = (int)n, i++;
        else if (!strcmp(a, "--conn-timeout") && v &&
                 parse_long(v, 1, 3600, &n))
            o.conn_timeout_s = (int)n, i++;
        else if (!strcmp(a, "--pd-min-blocks") && v &&
                 parse_long(v, 0, 1 << 20, &n))
            o.pd_min_blocks = (int)n, i++;
        else {
            const char *want =
                !strcmp(a, "--conn-timeout") ? "whole seconds in 1..3600"
                : !strcmp(a, "--max-connections") ||
                        !strcmp(a, "--max-connections-per-client")
                    ? "a count in 1..65536"
                    : NULL;
            if (want && v)
                fprintf(stderr, "tessera route: %s \"%s\": want %s\n", a, v,
                        want);
            else
                fprintf(stderr,
                        "tessera route: bad or incomplete option \"%s\"\n", a);
            usage(stderr);
            goto out;
        }
    }
    rc = ts_router_run(&o);
out:
    json_decref(cfg);
    return rc;
}
