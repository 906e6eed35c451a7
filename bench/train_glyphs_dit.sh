#!/bin/sh
# Reproduces models/glyphs-dit: a class-conditional DiT (Diffusers'
# DiTTransformer2DModel, patch 4, hidden 128, 6 layers, 4 heads) trained by
# Tessera on the 62 glyph classes 0-9 A-Z a-z rendered from the fonts under
# /usr/share/fonts (the set the Makefile's APT_PKGS installs: fonts-dejavu-
# core/extra, fonts-liberation, fonts-liberation2, fonts-freefont-ttf,
# fonts-croscore, fonts-noto-mono: 77 usable fonts), 1800 steps of 64
# images, compiled, seed 1. About 25-40 minutes on 2 Zen 5 cores (shared).
# usage: bench/train_glyphs_dit.sh [BUILD_DIR] [OUT_DIR]
set -e
BUILD=${1:-build}
OUT=${2:-models/glyphs-dit}
exec nice -n 5 "$BUILD/tessera" train --dit --data glyphs --out "$OUT" \
  --dit-config patch_size=4,num_layers=6,num_attention_heads=4,attention_head_dim=32 \
  --steps 1800 --batch 64 --lr 1e-3 --min-lr 1e-4 --warmup 100 \
  --weight-decay 0 --clip 1.0 --ema 0.999 --seed 1 --compile \
  --log-every 50 --save-every 500
