#!/usr/bin/env bash
# The exact commands behind the starting heads (stretch 0 of benchmarks/recipes/program.py, whose stretches
# made the committed SmolLM2 and Qwen-0.5B heads from them) and behind the 1.5B's head. It replaces
# src/eaglespec/heads/shipped/MODEL:
#     bash benchmarks/recipes/train_head.sh smollm2-135m-instruct
#     bash benchmarks/recipes/train_head.sh qwen2.5-coder-0.5b-instruct
#     bash benchmarks/recipes/train_head.sh qwen2.5-coder-1.5b-instruct   (not committed: 103 MB; this rebuilds it
#                                                                  and copies its config, eval and curves
#                                                                  under benchmarks/results/heads/)
# Resumable: run it again after an interruption and every step continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:?usage: train_head.sh MODEL}
HELDOUT=(--limit 100); EXTRACT=(--limit 1200)
case "$MODEL" in
    smollm2-135m-instruct) NAME=smollm2; TRAIN=(--draft-vocab 8192 --epochs 10) ;;
    qwen2.5-coder-0.5b-instruct) NAME=qwen05; TRAIN=(--draft-vocab 16384 --epochs 3) ;;
    qwen2.5-coder-1.5b-instruct) NAME=qwen15; HELDOUT=(--limit 30 --max-len 1024)
        EXTRACT=(--limit 320 --max-len 1024); TRAIN=(--draft-vocab 16384 --epochs 6) ;;
    *) echo "no training recipe for '$MODEL'" >&2; exit 1 ;;
esac
E=.venv/bin/eaglespec
CACHE=${EAGLESPEC_CACHE:-$HOME/.cache/eaglespec}
F=$CACHE/features
RUN=$CACHE/runs/$NAME
$E extract --model "$MODEL" --data sharegpt --split heldout "${HELDOUT[@]}" --out "$F/$NAME-heldout" --threads 2
$E extract --model "$MODEL" --data sharegpt --split train "${EXTRACT[@]}" --out "$F/$NAME-train" --threads 2
$E train --model "$MODEL" --train-features "$F/$NAME-train" --heldout-features "$F/$NAME-heldout" \
    --out "$RUN" "${TRAIN[@]}" --lr 5e-4 --warmup-steps 20 --batch 8 --eval-limit 30 \
    --checkpoint-every 20 --threads 2
H=src/eaglespec/heads/shipped/$MODEL  # package data: --head default finds it
rm -rf "$H" && cp -r "$RUN/head" "$H"
cp "$RUN/curves.png" "$H/curves.png"
$E eval-head --model "$MODEL" --head default --limit 50 --json | tee "$H/eval.json"
if git check-ignore -q "$H"; then  # the weights stay local; their record is committed
    R=benchmarks/results/heads/$MODEL
    mkdir -p "$R" && cp "$H/config.json" "$H/eval.json" "$H/curves.png" "$R/"
fi
