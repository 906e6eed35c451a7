#!/bin/sh
# serve_loadgen.sh — issue 22's serving figures: bench/loadgen.mjs against
# `tessera serve` on the Qwen3-0.6B architecture (random bf16 weights, the
# real Qwen3 tokenizer; bench/llamacpp/make_qwen3_gguf.py writes it) with 1,
# 8 and 32 clients, each configuration beside the same run with the old
# defaults (eager steps, f32 KV cache, 16 sequences), alternating, on one
# machine; loadgen prints generated tokens/s and TTFT/ITL percentiles.
#   sh bench/serve_loadgen.sh [MODEL_DIR] [REQUESTS_PER_CLIENT]
# MODEL_DIR defaults to build-llamacpp/models/qwen3-0.6b-random-hf (made by
# `make llamacpp` and make_qwen3_gguf.py). Prompts: 200 words with a shared
# 150-word head (the prefix cache's case), 64 tokens each.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
M=${1:-$ROOT/build-llamacpp/models/qwen3-0.6b-random-hf}
PER=${2:-4}
T=${TESSERA:-$ROOT/build/tessera}
[ -d "$M" ] || [ -f "$M" ] || {
    echo "serve_loadgen: no model at $M (make llamacpp; then" \
        "bench/llamacpp/make_qwen3_gguf.py)" >&2
    exit 2
}
PORT=${PORT:-18731}
LOG=$(mktemp -d)
trap 'kill $SRV 2>/dev/null || true; rm -rf "$LOG"' EXIT INT TERM
SRV=

serve() { # name, extra flags...
    name=$1
    shift
    "$T" serve -m "$M" --port "$PORT" --dtype bf16 --kv-blocks 2048 \
        --no-log-requests "$@" 2>"$LOG/$name.log" &
    SRV=$!
    i=0
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt 600 ] || ! kill -0 $SRV 2>/dev/null; then
            echo "serve_loadgen: the server did not start:" >&2
            cat "$LOG/$name.log" >&2
            exit 1
        fi
        sleep 0.2
    done
    grep "tessera serve:" "$LOG/$name.log" | sed "s/^/  [$name] /"
}

stop() {
    kill $SRV 2>/dev/null || true
    wait $SRV 2>/dev/null || true
    SRV=
}

for c in ${CLIENTS:-1 8 32}; do
    for cfg in new old; do
        echo "== $c clients, $cfg defaults"
        if [ $cfg = new ]; then
            serve new
        else
            serve old --enforce-eager --kv-dtype f32 --max-num-seqs 16
        fi
        # one warm-up request (first use of the plans and buffers)
        node "$ROOT/bench/loadgen.mjs" --url "http://127.0.0.1:$PORT" \
            --requests 1 --concurrency 1 --max-tokens 8 >/dev/null
        node "$ROOT/bench/loadgen.mjs" --url "http://127.0.0.1:$PORT" \
            --requests $((c * PER)) --concurrency $c --prompt-words 200 \
            --shared-words 150 --max-tokens 64 --duration 600 --seed $c
        if ! kill -0 $SRV 2>/dev/null; then
            echo "serve_loadgen: the server died:" >&2
            tail -20 "$LOG/$cfg.log" >&2
            exit 1
        fi
        stop
    done
done
