#!/bin/sh
# glyphs_sheet.sh — the README's sheet: every class of models/glyphs-dit
# drawn by `tessera diffuse` (DDIM, 50 steps, guidance 1.25, seed 1, 4 images), tiled
# 4 samples per class into docs/glyphs-sheet.png (upscaled 2x, nearest).
# Usage: bench/glyphs_sheet.sh [BUILD] [MODEL] [OUT.png]
set -e
BUILD=${1:-build}
MODEL=${2:-models/glyphs-dit}
OUT=${3:-docs/glyphs-sheet.png}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
CLASSES="0 1 2 3 4 5 6 7 8 9 A B C D E F G H I J K L M N O P Q R S T U V W X Y Z a b c d e f g h i j k l m n o p q r s t u v w x y z"
for c in $CLASSES; do
  "$BUILD/tessera" diffuse -m "$MODEL" --class "$c" --steps 50 --guidance 1.25 \
    --seed 1 -n 4 --output-type np --out "$TMP/$c.npy" -q
done
/usr/bin/python3 - "$TMP" "$OUT" $CLASSES <<'PY'
import sys, numpy as np
from PIL import Image
tmp, out, classes = sys.argv[1], sys.argv[2], sys.argv[3:]
cols = 8  # classes per row, 4 samples each
tiles = []
for c in classes:
    a = np.load(f"{tmp}/{c}.npy")[..., 0]  # (4, 32, 32) in [0, 1]
    tiles.append(np.concatenate(list(a), axis=1))  # (32, 128)
rows = []
for r in range(0, len(tiles), cols):
    row = tiles[r:r + cols]
    row += [np.zeros_like(tiles[0])] * (cols - len(row))
    rows.append(np.concatenate([np.pad(t, 2) for t in row], axis=1))
sheet = np.concatenate(rows, axis=0)
img = Image.fromarray((sheet * 255).round().astype(np.uint8), "L")
img.resize((img.width * 2, img.height * 2), Image.NEAREST).save(out)
print(f"wrote {out}: {len(classes)} classes x 4 samples")
PY
