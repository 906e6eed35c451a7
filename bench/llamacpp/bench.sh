#!/bin/bash
# bench.sh — llama.cpp's llama-bench on the random Qwen3-0.6B GGUFs
# (BF16, Q8_0, Q4_K_M, from make_qwen3_gguf.py) at 1 and 2 threads:
# prefill of 512 tokens and decode of 128, 3 repetitions each; prints a
# table and leaves one JSON file with every figure and the raw llama-bench
# records. Tessera's figures on the same files come from a command the
# caller passes in (TESSERA_BENCH_CMD, below); without one, the Tessera
# columns stay empty, marked "not run".
#
#   bench/llamacpp/bench.sh
#   THREADS="1 2" FORMATS="bf16 q8_0 q4_k_m" PROMPT=512 GEN=128 REPS=3 \
#   MODELS=build-llamacpp/models OUT=build-llamacpp/bench.json \
#   WAIT_LOAD=1.0 WAIT_MAX=300 TESSERA_BENCH_CMD='...' bench/llamacpp/bench.sh
#
# On a shared machine other jobs skew the figures (2 threads on 2 busy
# cores most of all): the 1-minute load average before each run is
# recorded, and with WAIT_LOAD each run first waits (at most WAIT_MAX
# seconds, then runs anyway) for the load average to fall below WAIT_LOAD.
#
# TESSERA_BENCH_CMD is run with bash once per (file, thread count), with
# these variables exported: MODEL (the GGUF path), FORMAT (bf16, q8_0,
# q4_k_m), HF_DIR (the same weights as a Hugging Face folder), THREADS,
# N_PROMPT, N_GEN, REPS. Its last line of stdout must be one JSON object
# {"prefill_tps": <tokens/s>, "decode_tps": <tokens/s>} (extra keys are
# kept). A failure is recorded as such, never replaced by a number.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
B=${LLAMACPP_DIR:-$ROOT/build-llamacpp}
MODELS=${MODELS:-$B/models}
THREADS=${THREADS:-1 2}
FORMATS=${FORMATS:-bf16 q8_0 q4_k_m}
PROMPT=${PROMPT:-512}
GEN=${GEN:-128}
REPS=${REPS:-3}
STEM=${STEM:-qwen3-0.6b-random}
OUT=${OUT:-$B/bench-$(date -u +%Y%m%dT%H%M%SZ).json}
TESSERA_BENCH_CMD=${TESSERA_BENCH_CMD:-}
WAIT_LOAD=${WAIT_LOAD:-}
WAIT_MAX=${WAIT_MAX:-300}

# waits until the 1-minute load average is below WAIT_LOAD (if set)
wait_for_quiet() {
    [ -n "$WAIT_LOAD" ] || return 0
    local waited=0
    while awk -v max="$WAIT_LOAD" '{ exit !($1 >= max) }' /proc/loadavg && [ "$waited" -lt "$WAIT_MAX" ]; do
        sleep 10
        waited=$((waited + 10))
    done
}

BENCH=$B/build/bin/llama-bench
[ -x "$BENCH" ] || { echo "bench.sh: $BENCH not built; run bench/llamacpp/build.sh" >&2; exit 1; }
for f in $FORMATS; do
    [ -f "$MODELS/$STEM-$f.gguf" ] ||
        { echo "bench.sh: $MODELS/$STEM-$f.gguf missing; run bench/llamacpp/make_qwen3_gguf.py" >&2; exit 1; }
done

RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load average before: $load_before" >&2
for f in $FORMATS; do
    for t in $THREADS; do
        model=$MODELS/$STEM-$f.gguf
        wait_for_quiet
        cut -d' ' -f1 /proc/loadavg >"$RAW/load-$f-t$t"
        echo "llama-bench $f, $t thread(s), load $(cat "$RAW/load-$f-t$t") ..." >&2
        "$BENCH" -m "$model" -t "$t" -p "$PROMPT" -n "$GEN" -r "$REPS" -o json \
            >"$RAW/llama-$f-t$t.json" 2>"$RAW/llama-$f-t$t.log" ||
            { echo "bench.sh: llama-bench failed on $model:" >&2; tail -5 "$RAW/llama-$f-t$t.log" >&2; exit 1; }
        if [ -n "$TESSERA_BENCH_CMD" ]; then
            echo "tessera (TESSERA_BENCH_CMD) $f, $t thread(s) ..." >&2
            if MODEL=$model FORMAT=$f HF_DIR=$MODELS/$STEM-hf THREADS=$t N_PROMPT=$PROMPT \
                N_GEN=$GEN REPS=$REPS bash -c "$TESSERA_BENCH_CMD" >"$RAW/tessera-$f-t$t.out" \
                2>"$RAW/tessera-$f-t$t.log"; then
                :
            else
                echo "failed with status $?" >"$RAW/tessera-$f-t$t.failed"
            fi
        fi
    done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load average after: $load_after" >&2

/usr/bin/python3 "$HERE/bench_table.py" "$RAW" "$OUT" \
    --formats "$FORMATS" --threads "$THREADS" --models "$MODELS" --stem "$STEM" \
    --version-file "$B/VERSION.txt" --tessera-cmd "$TESSERA_BENCH_CMD" \
    --load-before "$load_before" --load-after "$load_after"
