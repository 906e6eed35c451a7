#!/bin/sh
# train_draft_model.sh — how models/kjv-qwen3-draft (the draft model for
# speculative decoding with models/kjv-qwen3: `tessera serve -m
# models/kjv-qwen3 --draft-model models/kjv-qwen3-draft`) was made, with
# tessera alone. The same text and recipe as bench/train_default_model.sh,
# but a smaller model and shorter training, and no tokenizer of its own:
#   1. the King James Bible from Debian's bible-kjv-text (via bible-kjv's
#      `bible` reader), one verse a line;
#   2. the text tokenized into shards with models/kjv-qwen3's tokenizer.json
#      (so the draft's token ids are the target's; 5% held out);
#   3. a Qwen3-architecture model (models/kjv-qwen3-draft.config.json: 2
#      layers, hidden 192) trained from scratch; its last checkpoint,
#      without the optimizer state, becomes models/kjv-qwen3-draft.
#   sh bench/train_draft_model.sh [WORKDIR] (default /tmp/kjv-draft) — a
#   few minutes on 2 cores. Set TESSERA to another binary if wanted.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=${1:-/tmp/kjv-draft}
T=${TESSERA:-$ROOT/build/tessera}
TARGET=$ROOT/models/kjv-qwen3
mkdir -p "$W"
bible -l10000 "gen1:1-rev22:21" | grep -E '^ +[0-9]+ ' |
    sed -E 's/^ +[0-9]+ //' > "$W/kjv.txt"
rm -rf "$W/data" "$W/run"
"$T" prepare-data -t "$TARGET" --out "$W/data" --val-fraction 0.05 \
    --model-config "$ROOT/models/kjv-qwen3-draft.config.json" "$W/kjv.txt"
"$T" train --model-config "$ROOT/models/kjv-qwen3-draft.config.json" \
    --data "$W/data" --out "$W/run" --batch 16 --seq 256 --steps 400 \
    --warmup 30 --lr 2e-3 --min-lr 2e-4 --weight-decay 0.1 --clip 1.0 \
    --eval-every 100 --eval-batches 16 --save-every 200 --seed 1 --compile
last=$W/run/$(cat "$W/run/latest")
# the draft must tokenize exactly as the target does
cmp "$last/tokenizer.json" "$TARGET/tokenizer.json"
rm -rf "$ROOT/models/kjv-qwen3-draft"
mkdir -p "$ROOT/models/kjv-qwen3-draft"
for f in config.json generation_config.json model.safetensors \
    tokenizer.json tokenizer_config.json; do
    cp "$last/$f" "$ROOT/models/kjv-qwen3-draft/"
done
cp "$W/run/log.jsonl" "$ROOT/models/kjv-qwen3-draft/train_log.jsonl"
echo "models/kjv-qwen3-draft <- $last"
