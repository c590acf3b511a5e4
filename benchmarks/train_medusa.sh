#!/usr/bin/env bash
# The exact commands behind the shipped Medusa head (heads/medusa/MODEL), the paper's Medusa baseline:
#     bash benchmarks/train_medusa.sh smollm2-135m-instruct
# Four Medusa-1 heads (the target frozen) trained for 20 minutes of CPU on the features of the 971
# answers of the target's own (data/regenerated/MODEL, after the first 2,217) that stretch 6 of the
# long program trained the EAGLE head on: the same extraction, fp32. Resumable.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: train_medusa.sh MODEL}
[[ $MODEL == smollm2-135m-instruct ]] || { echo "no Medusa recipe for '$MODEL'" >&2; exit 1; }
E=.venv/bin/eaglespec
CACHE=${EAGLESPEC_CACHE:-$HOME/.cache/eaglespec}
F=$CACHE/features
RUN=$CACHE/medusa/$MODEL
$E extract --model "$MODEL" --split heldout --limit 50 --dtype float32 --threads 2 --out "$F/medusa-$MODEL-heldout"
$E extract --model "$MODEL" --data "data/regenerated/$MODEL" --split train --skip 2217 --dtype float32 \
    --threads 2 --out "$F/medusa-$MODEL-train"
$E train --model "$MODEL" --train-features "$F/medusa-$MODEL-train" --heldout-features "$F/medusa-$MODEL-heldout" \
    --out "$RUN" --head-type medusa --draft-vocab 8192 --lr 1e-3 --warmup-steps 10 --epochs 3 \
    --budget-minutes 20 --eval-limit 20 --checkpoint-every 20 --threads 1
H=heads/medusa/$MODEL
rm -rf "$H" && mkdir -p "$H" && cp "$RUN/head/config.json" "$RUN/head/model.safetensors" "$RUN/curves.png" "$H/"
