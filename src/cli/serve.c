/* serve.c — `tessera serve`: the OpenAI-compatible server over one model
 * folder (src/server); its options table (vLLM's spellings as aliases). */
#include "tessera_server.h"

#include "cli/opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    S_MODEL = 1,
    S_HOST,
    S_PORT,
    S_MAX_SEQS,
    S_KV_BLOCKS,
    S_KV_MEMORY,
    S_BLOCK_SIZE,
    S_MAX_BATCH,
    S_NO_PREFIX,
    S_EAGER,
    S_NO_CHECK,
    S_NAME,
    S_DTYPE,
    S_KV_PORT,
    S_KV_PEERS,
    S_KV_SENDERS,
    S_API_KEY,
    S_MAX_CONN,
    S_MAX_CONN_CLIENT,
    S_CONN_TIMEOUT,
    S_NO_KV_EVENTS,
    S_DEVICE_MAP,
    S_TEMPLATE,
    S_ORIGINS,
    S_POOLING,
    S_SPECULATIVE,
    S_SPEC_TOKENS,
    S_LOOKUP_MIN,
    S_LOOKUP_MAX,
    S_DRAFT,
    S_MAX_LEN,
    S_NO_LOG,
    S_KV_DTYPE,
};

#define STR_(x) #x
#define STR(x)  STR_(x)

static const cli_opt SERVE_OPTS[] = {
    {S_MODEL, "-m, --model", CLI_STR, "DIR",
     .help = "the model folder; also the first positional argument (as vllm "
             "serve MODEL)"},
    {S_HOST, "--host", CLI_STR, "ADDR", .def = "127.0.0.1",
     .help = "the address to listen on (0.0.0.0: every interface)"},
    {S_PORT, "--port", CLI_INT, "PORT", 0, 65535, .def = "8000",
     .help = "the port to listen on (0: any free one)"},
    {S_NAME, "--served-model-name", CLI_STR, "NAME",
     .def = "the folder's last component",
     .help = "the model's name in the API (/v1/models, \"model\")"},
    {S_MAX_SEQS, "--max-seqs, --max-num-seqs", CLI_INT, "N", 1, 4096,
     .def = "64", .help = "sequences running at once"},
    {S_MAX_LEN, "--max-model-len, -c, --ctx-size", CLI_INT, "N", 1, 1 << 30,
     .def = "the model's max_position_embeddings",
     .help = "the longest prompt + output in tokens"},
    {S_KV_BLOCKS, "--kv-blocks", CLI_INT, "N", 1, 1 << 26,
     .def = "from --kv-memory", .help = "KV cache blocks in the pool"},
    {S_KV_MEMORY, "--kv-memory", CLI_SIZE, "BYTES", 1, (double)(1LL << 40),
     .def = "512 blocks",
     .help = "bytes for the KV cache when --kv-blocks is not given (K, M, G "
             "suffixes)"},
    {S_BLOCK_SIZE, "--block-size", CLI_INT, "N", 1, 256, .def = "16",
     .help = "positions per KV block"},
    {S_KV_DTYPE, "--kv-dtype, --kv-cache-dtype", CLI_CHOICE,
     .choices = "f32|bf16|int8", .def = "bf16",
     .help = "the KV cache's type: bf16 half of f32's memory, int8 (one f32 "
             "scale per position and KV head) about a quarter; pools on a "
             "device other than the CPU stay f32"},
    {S_MAX_BATCH, "--max-batch-tokens, --max-num-batched-tokens", CLI_INT, "N",
     1, 1 << 20, .def = "512", .help = "tokens per forward pass"},
    {S_NO_PREFIX, "--no-prefix-cache", CLI_FLAG,
     .help = "do not reuse cached prompt prefixes"},
    {S_EAGER, "--enforce-eager", CLI_FLAG,
     .help = "run the model's steps eagerly (default: compiled, one plan "
             "per batch-size bucket)"},
    {S_TEMPLATE, "--chat-template", CLI_STR, "FILE|NAME",
     .def = "the model's (tokenizer_config.json)",
     .help = "a Jinja chat template file or a built-in's name, for models "
             "without one or to replace theirs"},
    {S_ORIGINS, "--allowed-origins", CLI_STR, "ORIGINS",
     .def = "none (no CORS headers)",
     .help = "CORS: \"*\" or a comma-separated list like "
             "https://a.example,http://b:8080"},
    {S_POOLING, "--pooling", CLI_CHOICE, .choices = "last|mean", .def = "last",
     .help = "/v1/embeddings' pooling of the final hidden states"},
    {S_NO_LOG, "--disable-log-requests, --no-log-requests", CLI_FLAG,
     .help = "no line per request on stderr"},
    {S_API_KEY, "--api-key", CLI_STR, "KEY",
     .def = "$TESSERA_API_KEY, else none",
     .help = "every request needs \"Authorization: Bearer KEY\" but "
             "/health, /metrics, /version, the chat page at / and CORS "
             "preflights"},
    {S_DTYPE, "--dtype", CLI_CHOICE, .choices = "f32|bf16", .def = "f32",
     .help = "the weights' type in memory"},
    {S_DEVICE_MAP, "--device-map, --device", CLI_STR, "MAP", .def = "the CPU",
     .help = "a device (cpu, vulkan:0) or a split of the model over devices"},
    {S_NO_CHECK, "--no-check-weights", CLI_FLAG,
     .help = "load weights holding NaN/Inf (refused by default)"},
    {S_KV_PORT, "--kv-port", CLI_INT, "PORT", 0, 65535, .def = "none",
     .help = "receive KV blocks from prefill servers here (0: any port)"},
    {S_KV_SENDERS, "--kv-senders", CLI_STR, "A.B.C.D,...|any",
     .def = "loopback addresses only",
     .help = "who may send KV blocks to --kv-port"},
    {S_KV_PEERS, "--kv-peers", CLI_STR, "HOST:PORT,...",
     .def = "none (KV goes nowhere)",
     .help = "the decode servers' KV addresses a prefill request may name as "
             "kv_transfer_params.target"},
    {S_NO_KV_EVENTS, "--no-kv-events", CLI_FLAG,
     .help = "publish no /v1/kv_events, /v1/kv_cache"},
    {S_MAX_CONN, "--max-connections", CLI_INT, "N", 1, 65536,
     .def = STR(TS_SERVER_DEFAULT_MAX_CONNECTIONS),
     .want = "a count in 1..65536", .help = "connections at once"},
    {S_MAX_CONN_CLIENT, "--max-connections-per-client", CLI_INT, "N", 1, 65536,
     .def = STR(TS_SERVER_DEFAULT_PER_CLIENT), .want = "a count in 1..65536",
     .help = "connections from one address"},
    {S_CONN_TIMEOUT, "--conn-timeout", CLI_INT, "SECONDS", 1, 3600,
     .def = STR(TS_SERVER_DEFAULT_TIMEOUT_S),
     .want = "whole seconds in 1..3600",
     .help = "a connection silent this long while its request is read or its "
             "response written is closed; also the KV receiver's"},
    {S_SPECULATIVE, "--speculative", CLI_CHOICE, .choices = "ngram|draft",
     .def = "none",
     .help = "speculative decoding: tokens proposed by prompt lookup (ngram) "
             "or a draft model (--draft-model), verified in one pass of the "
             "model; greedy output unchanged"},
    {S_SPEC_TOKENS, "--num-speculative-tokens", CLI_INT, "K", 1, 16, .def = "4",
     .help = "tokens proposed a step per sequence"},
    {S_LOOKUP_MIN, "--prompt-lookup-min", CLI_INT, "N", 1, 64,
     .def = "1; --prompt-lookup-max's when only that is given",
     .help = "prompt lookup: the shortest n-gram matched"},
    {S_LOOKUP_MAX, "--prompt-lookup-max", CLI_INT, "N", 1, 64,
     .def = "4; --prompt-lookup-min's when only that is given",
     .help = "prompt lookup: the longest n-gram matched (tried first)"},
    {S_DRAFT, "--draft-model", CLI_STR, "DIR|FILE.gguf",
     .help = "the draft model (implies --speculative draft): the model's "
             "vocabulary, placed and typed as the model"},
    {0},
};

static const cli_cmd SERVE_CMD = {
    .name = "serve",
    .usage = "serve [-m] DIR [--port 8000] [options]",
    .about = "An OpenAI-compatible server (/v1/completions, "
             "/v1/chat/completions, /v1/embeddings, /v1/models, /health, "
             "/metrics) over one model folder, until SIGINT or SIGTERM.",
    .opts = SERVE_OPTS,
    .positional = "  DIR                         the model folder (as -m)\n",
    .short_threads = true,
};

/* one option onto o */
static void serve_opt(ts_server_options *o, int id, const cli_val *v) {
    switch (id) {
    case S_MODEL:
        o->model_dir = v->s;
        break;
    case S_HOST:
        o->host = v->s;
        break;
    case S_PORT:
        o->port = (int)v->i;
        break;
    case S_NAME:
        o->model_name = v->s;
        break;
    case S_MAX_SEQS:
        o->engine.max_seqs = (int)v->i;
        break;
    case S_MAX_LEN:
        o->max_model_len = v->i;
        break;
    case S_KV_BLOCKS:
        o->engine.n_blocks = v->i;
        break;
    case S_KV_MEMORY:
        o->engine.kv_memory = v->i;
        break;
    case S_BLOCK_SIZE:
        o->engine.block_size = v->i;
        break;
    case S_KV_DTYPE: /* the choices' order: f32, bf16, int8 */
        o->engine.kv_dtype = v->choice == 0   ? TS_KV_F32
                             : v->choice == 1 ? TS_KV_BF16
                                              : TS_KV_INT8;
        break;
    case S_MAX_BATCH:
        o->engine.max_batch_tokens = v->i;
        break;
    case S_NO_PREFIX:
        o->engine.no_prefix_cache = true;
        break;
    case S_EAGER:
        o->engine.enforce_eager = true;
        break;
    case S_TEMPLATE:
        o->chat_template = v->s;
        break;
    case S_ORIGINS:
        o->allowed_origins = v->s;
        break;
    case S_POOLING:
        o->pooling = v->choice ? TS_POOL_MEAN : TS_POOL_LAST;
        break;
    case S_NO_LOG:
        o->no_log_requests = true;
        break;
    case S_API_KEY:
        o->api_key = v->s;
        break;
    case S_DTYPE:
        o->weight_dtype = v->choice ? TS_BF16 : TS_F32;
        break;
    case S_DEVICE_MAP:
        o->device_map = v->s;
        break;
    case S_NO_CHECK:
        o->no_check_weights = true;
        break;
    case S_KV_PORT:
        o->kv_port = (int)v->i;
        break;
    case S_KV_SENDERS:
        o->kv_senders = v->s;
        break;
    case S_KV_PEERS:
        o->kv_peers = v->s;
        break;
    case S_NO_KV_EVENTS:
        o->no_kv_events = true;
        break;
    case S_MAX_CONN:
        o->max_connections = (int)v->i;
        break;
    case S_MAX_CONN_CLIENT:
        o->max_connections_per_client = (int)v->i;
        break;
    case S_CONN_TIMEOUT:
        o->conn_timeout_s = (int)v->i;
        break;
    case S_SPECULATIVE:
        o->engine.spec = v->choice ? TS_SPEC_DRAFT : TS_SPEC_NGRAM;
        break;
    case S_SPEC_TOKENS:
        o->engine.spec_tokens = (int)v->i;
        break;
    case S_LOOKUP_MIN:
        o->engine.spec_ngram_min = (int)v->i;
        break;
    case S_LOOKUP_MAX:
        o->engine.spec_ngram_max = (int)v->i;
        break;
    case S_DRAFT:
        o->draft_model_dir = v->s;
        break;
    }
}

int tessera_serve(int argc, char **argv) {
    ts_server_options o = {.host = "127.0.0.1",
                           .port = 8000,
                           .weight_dtype = TS_F32,
                           .kv_port = -1,
                           .pooling = TS_POOL_LAST,
                           .engine = ts_engine_options_default()};
    const char *env_key = getenv("TESSERA_API_KEY");
    o.api_key = env_key && *env_key ? env_key : NULL;
    const cli_cmd *c = &SERVE_CMD;
    cli_parser p;
    cli_val v;
    cli_begin(&p, c, argc, argv);
    for (int id; (id = cli_next(&p, &v)) != CLI_END;) {
        if (id == CLI_HELP)
            return cli_help(c, stdout), 0;
        if (id == CLI_ERROR)
            return 2;
        if (id == CLI_POSITIONAL && o.model_dir)
            return cli_fail(c, "unexpected argument \"%s\" (the model is %s)",
                            v.s, o.model_dir);
        if (id == CLI_POSITIONAL)
            o.model_dir = v.s;
        else
            serve_opt(&o, id, &v);
    }
    if (!o.model_dir)
        return cli_fail(c, "no model: give its folder (-m DIR or DIR; see "
                           "tessera serve --help)");
    return ts_server_run(&o);
}
