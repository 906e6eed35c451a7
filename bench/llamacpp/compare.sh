#!/bin/sh
# compare.sh — Tessera and llama.cpp side by side on the same GGUF files,
# same threads, same machine, alternating: llama-bench's pp512/tg (best of
# its repetitions' mean) and bench_decode --model's prefill/decode (best of
# 3), for the random Qwen3-0.6B in BF16, Q8_0 and Q4_K_M that
# make_qwen3_gguf.py writes (run `make llamacpp` first), plus Tessera's own
# `tessera quantize` outputs of the HF folder when they are there.
#   bench/llamacpp/compare.sh [THREADS] [DECODE_TOKENS]
set -e
root=$(cd "$(dirname "$0")/../.." && pwd)
L=${LLAMACPP_DIR:-$root/build-llamacpp}
T=${1:-2}
G=${2:-64}
bench="$L/build/bin/llama-bench"
ours="$root/build/bench_decode"
[ -x "$bench" ] || { echo "no $bench: run make llamacpp"; exit 1; }
[ -x "$ours" ] || { echo "no $ours: run make build"; exit 1; }
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //');" \
     "threads $T; tessera: $("$root/build/tessera" --version | sed -n 's/^cpu path in use: //p')"
printf "%-8s %12s %12s %7s %12s %12s %7s\n" file "pp512 llama" "pp512 ours" ratio \
       "tg$G llama" "tg$G ours" ratio
for t in bf16 q8_0 q4_k_m; do
    f="$L/models/qwen3-0.6b-random-$t.gguf"
    [ -f "$f" ] || continue
    lj=$("$bench" -m "$f" -t "$T" -p 512 -n "$G" -r 3 -o jsonl 2>/dev/null)
    oj=$(TS_NUM_THREADS=$T "$ours" --model "$f" --prefill 512 --decode "$G")
    /usr/bin/python3 - "$t" "$G" "$lj" "$oj" <<'PY'
import json, sys
t, G, lj, oj = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
pp = tg = 0.0
for line in lj.splitlines():
    d = json.loads(line)
    if d["n_prompt"]:
        pp = d["avg_ts"]
    else:
        tg = d["avg_ts"]
print("%-8s %12.1f %12.1f %6.2fx %12.1f %12.1f %6.2fx" % (
    t, pp, oj["pp512"], oj["pp512"] / pp, tg, oj["tg" + G], oj["tg" + G] / tg))
PY
done
