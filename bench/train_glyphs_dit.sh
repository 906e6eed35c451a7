#!/bin/sh
# Reproduces models/glyphs-dit: a class-conditional DiT (Diffusers'
# DiTTransformer2DModel, patch 4, hidden 128, 6 layers, 4 heads, 2.16 M
# parameters) trained by Tessera on the 62 glyph classes 0-9 A-Z a-z
# rendered from the fonts under /usr/share/fonts (the set the Makefile's
# APT_PKGS installs: 77 usable fonts) with small random shifts and scales:
# 3000 steps of 64 images, compiled, seed 1, the DDPM noise-prediction loss
# on the cosine schedule (squaredcos_cap_v2) with min-SNR-5 weights, class
# tables initialised with std 1, saved weights the warmed-up EMA (0.999).
# Figures and the recipe's history: bench/NOTES.md, "Issue 23".
# usage: bench/train_glyphs_dit.sh [BUILD_DIR] [OUT_DIR]
set -e
BUILD=${1:-build}
OUT=${2:-models/glyphs-dit}
exec nice -n 5 "$BUILD/tessera" train --dit --data glyphs --out "$OUT" \
  --dit-config patch_size=4,num_layers=6,num_attention_heads=4,attention_head_dim=32 \
  --steps 3000 --batch 64 --lr 1e-3 --min-lr 1e-4 --warmup 100 \
  --weight-decay 0 --clip 1.0 --ema 0.999 --seed 1 \
  --beta-schedule squaredcos_cap_v2 --snr-gamma 5 --class-init-std 1 \
  --compile --log-every 50 --save-every 500
