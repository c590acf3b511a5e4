#!/usr/bin/env bash
# The exact commands behind the shipped SmolLM2-135M-Instruct head (heads/smollm2-135m-instruct).
# Resumable: run it again after an interruption and every step continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
E=.venv/bin/eaglespec
F=${EAGLESPEC_CACHE:-$HOME/.cache/eaglespec}/features
RUN=${EAGLESPEC_CACHE:-$HOME/.cache/eaglespec}/runs/smollm2
$E extract --model smollm2-135m-instruct --split heldout --limit 100 --out "$F/smollm2-heldout" --threads 2
$E extract --model smollm2-135m-instruct --split train --limit 1200 --out "$F/smollm2-train" --threads 2
$E train --model smollm2-135m-instruct --train-features "$F/smollm2-train" --heldout-features "$F/smollm2-heldout" \
    --out "$RUN" --draft-vocab 8192 --lr 5e-4 --warmup-steps 20 --epochs 10 --batch 8 --eval-limit 30 \
    --checkpoint-every 20 --threads 2
rm -rf heads/smollm2-135m-instruct && mkdir -p heads && cp -r "$RUN/head" heads/smollm2-135m-instruct
cp "$RUN/curves.png" heads/smollm2-135m-instruct/curves.png
$E eval-head --model smollm2-135m-instruct --head default --limit 50 --json | tee heads/smollm2-135m-instruct/eval.json
