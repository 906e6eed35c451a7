#!/bin/sh
# train_default_model.sh — how models/kjv-qwen3 (the default model of
# `make run`) was made, end to end, with tessera alone:
#   1. the King James Bible from Debian's bible-kjv-text (via bible-kjv's
#      `bible` reader), one verse a line;
#   2. a byte-level BPE tokenizer of 4,096 tokens trained on it;
#   3. the text tokenized into shards (5% held out for validation);
#   4. a Qwen3-architecture model (models/kjv-qwen3.config.json) trained
#      from scratch; its last checkpoint, without the optimizer state,
#      becomes models/kjv-qwen3.
#   sh bench/train_default_model.sh [WORKDIR] (default /tmp/kjv) — about
#   20 minutes on 2 cores. Set TESSERA to another binary if wanted.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${1:-/tmp/kjv}
T=${TESSERA:-$ROOT/build/tessera}
mkdir -p "$W"
bible -l10000 "gen1:1-rev22:21" | grep -E '^ +[0-9]+ ' |
    sed -E 's/^ +[0-9]+ //' > "$W/kjv.txt"
"$T" tokenizer-train --vocab 4096 --out "$W/tok" "$W/kjv.txt"
"$T" prepare-data -t "$W/tok" --out "$W/data" --val-fraction 0.05 "$W/kjv.txt"
"$T" train --model-config "$ROOT/models/kjv-qwen3.config.json" \
    --data "$W/data" --out "$W/run" --batch 16 --seq 256 --steps 750 \
    --warmup 50 --lr 1e-3 --min-lr 1e-4 --weight-decay 0.1 --clip 1.0 \
    --eval-every 125 --eval-batches 16 --save-every 250 --seed 1
last=$W/run/$(cat "$W/run/latest")
rm -rf "$ROOT/models/kjv-qwen3"
mkdir -p "$ROOT/models/kjv-qwen3"
for f in config.json generation_config.json model.safetensors \
    tokenizer.json tokenizer_config.json; do
    cp "$last/$f" "$ROOT/models/kjv-qwen3/"
done
cp "$W/run/log.jsonl" "$ROOT/models/kjv-qwen3/train_log.jsonl"
echo "models/kjv-qwen3 <- $last"
