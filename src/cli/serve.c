/* serve.c — `tessera serve`: the OpenAI-compatible server over one model
 * folder (src/server). */
#include "tessera_server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(FILE *f) {
    fprintf(f,
            "usage: tessera serve -m DIR [--host 127.0.0.1] [--port 8000] "
            "[--max-seqs N]\n"
            "         [--kv-blocks N | --kv-memory BYTES] [--block-size 16] "
            "[--max-batch-tokens N]\n"
            "         [--no-prefix-cache] [--served-model-name NAME] "
            "[--dtype f32|bf16] [--device-map MAP]\n"
            "         [--no-check-weights] (load weights holding NaN/Inf; "
            "they are refused by default)\n"
            "         [--kv-port PORT] (receive KV blocks from prefill "
            "servers; 0: any port)\n"
            "         [--kv-senders A.B.C.D,...|any] (who may send KV "
            "blocks to --kv-port;\n"
            "           default: loopback addresses only)\n"
            "         [--kv-peers HOST:PORT,...] (the decode servers' KV "
            "addresses a prefill\n"
            "           request may name as kv_transfer_params.target, as "
            "the router writes them;\n"
            "           without it this server sends KV blocks nowhere)\n"
            "         [--no-kv-events] (publish no /v1/kv_events, "
            "/v1/kv_cache)\n"
            "         [--api-key KEY] (every /v1/ request needs "
            "\"Authorization: Bearer KEY\";\n"
            "           default: $TESSERA_API_KEY; /health and /metrics stay "
            "open)\n"
            "         [--max-connections N] (%d) [--max-connections-per-client "
            "N] (%d)\n"
            "         [--conn-timeout SECONDS] (%d: a connection silent this "
            "long while its request\n"
            "           is read or its response written is closed; also the "
            "KV receiver's)\n",
            TS_SERVER_DEFAULT_MAX_CONNECTIONS, TS_SERVER_DEFAULT_PER_CLIENT,
            TS_SERVER_DEFAULT_TIMEOUT_S);
    return f == stdout ? 0 : 2;
}

static bool parse_int(const char *s, long long lo, long long hi,
                      long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0 || v > ((long long)1 << 40))
        return false;
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    else if (*end == 'G' || *end == 'g')
        v <<= 30, end++;
    if (*end || !(v >= lo && v <= hi)) /* the range after the suffix */
        return false;
    *out = v;
    return true;
}

int tessera_serve(int argc, char **argv) {
    ts_server_options o = {.host = "127.0.0.1",
                           .port = 8000,
                           .weight_dtype = TS_F32,
                           .kv_port = -1,
                           .engine = ts_engine_options_default()};
    const char *env_key = getenv("TESSERA_API_KEY");
    o.api_key = env_key && *env_key ? env_key : NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return usage(stdout);
        else if (!strcmp(a, "-m") && v)
            o.model_dir = v, i++;
        else if (!strcmp(a, "--host") && v)
            o.host = v, i++;
        else if (!strcmp(a, "--port") && v && parse_int(v, 0, 65535, &n))
            o.port = (int)n, i++;
        else if (!strcmp(a, "--max-seqs") && v && parse_int(v, 1, 4096, &n))
            o.engine.max_seqs = (int)n, i++;
        else if (!strcmp(a, "--kv-blocks") && v && parse_int(v, 1, 1 << 26, &n))
            o.engine.n_blocks = n, i++;
        else if (!strcmp(a, "--kv-memory") && v &&
                 parse_int(v, 1, (long long)1 << 40, &n))
            o.engine.kv_memory = n, i++;
        else if (!strcmp(a, "--block-size") && v && parse_int(v, 1, 256, &n))
            o.engine.block_size = n, i++;
        else if (!strcmp(a, "--max-batch-tokens") && v &&
                 parse_int(v, 1, 1 << 20, &n))
            o.engine.max_batch_tokens = n, i++;
        else if (!strcmp(a, "--no-prefix-cache"))
            o.engine.no_prefix_cache = true;
        else if (!strcmp(a, "--no-check-weights"))
            o.no_check_weights = true;
        else if (!strcmp(a, "--served-model-name") && v)
            o.model_name = v, i++;
        else if (!strcmp(a, "--dtype") && v &&
                 (!strcmp(v, "f32") || !strcmp(v, "bf16")))
            o.weight_dtype = strcmp(v, "bf16") ? TS_F32 : TS_BF16, i++;
        else if (!strcmp(a, "--kv-port") && v && parse_int(v, 0, 65535, &n))
            o.kv_port = (int)n, i++;
        else if (!strcmp(a, "--kv-peers") && v)
            o.kv_peers = v, i++;
        else if (!strcmp(a, "--kv-senders") && v)
            o.kv_senders = v, i++;
        else if (!strcmp(a, "--api-key") && v && *v)
            o.api_key = v, i++;
        else if (!strcmp(a, "--max-connections") && v &&
                 parse_int(v, 1, 65536, &n))
            o.max_connections = (int)n, i++;
        else if (!strcmp(a, "--max-connections-per-client") && v &&
                 parse_int(v, 1, 65536, &n))
            o.max_connections_per_client = (int)n, i++;
        else if (!strcmp(a, "--conn-timeout") && v && parse_int(v, 1, 3600, &n))
            o.conn_timeout_s = (int)n, i++;
        else if (!strcmp(a, "--no-kv-events"))
            o.no_kv_events = true;
        else if (!strcmp(a, "--device-map") && v)
            o.device_map = v, i++;
        else {
            const char *want =
                !strcmp(a, "--conn-timeout") ? "whole seconds in 1..3600"
                : !strcmp(a, "--max-connections") ||
                        !strcmp(a, "--max-connections-per-client")
                    ? "a count in 1..65536"
                    : NULL;
            if (want && v)
                fprintf(stderr, "tessera serve: %s \"%s\": want %s\n", a, v,
                        want);
            else
                fprintf(stderr,
                        "tessera serve: bad or incomplete option \"%s\"\n", a);
            return usage(stderr);
        }
    }
    if (!o.model_dir)
        return usage(stderr);
    return ts_server_run(&o);
}
