#!/usr/bin/env bash
# The exact commands behind a Medusa head (src/eaglespec/heads/shipped/medusa/MODEL), the paper's Medusa baseline:
#     bash benchmarks/recipes/train_medusa.sh smollm2-135m-instruct        (shipped)
#     bash benchmarks/recipes/train_medusa.sh qwen2.5-coder-0.5b-instruct  (not committed, over the tree's budget:
#     bash benchmarks/recipes/train_medusa.sh qwen2.5-coder-1.5b-instruct   their configs and curves go to
#                                                                   benchmarks/results/heads/medusa-MODEL/)
# Four Medusa-1 heads (the target frozen) trained for 20 minutes of CPU on the features of the target's
# own answers (data/regenerated/MODEL; for SmolLM2 the 971 after the first 2,217 that stretch 6 of the
# long program trained its EAGLE head on: the same extraction, fp32). The 1.5B has no regenerated
# answers: its heads learn from 128 ShareGPT conversations (human answers, as Medusa-1 was trained),
# extracted in bf16 (twice as fast on a CPU with bf16 instructions). Resumable.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:?usage: train_medusa.sh MODEL}
case "$MODEL" in
    smollm2-135m-instruct) DATA=(--data "data/regenerated/$MODEL" --skip 2217); VOCAB=8192; DTYPE=float32 ;;
    qwen2.5-coder-0.5b-instruct) DATA=(--data "data/regenerated/$MODEL"); VOCAB=16384; DTYPE=float32 ;;
    qwen2.5-coder-1.5b-instruct) DATA=(--data sharegpt --limit 128 --max-len 1024); VOCAB=16384; DTYPE=bfloat16 ;;
    *) echo "no Medusa recipe for '$MODEL'" >&2; exit 1 ;;
esac
E=.venv/bin/eaglespec
CACHE=${EAGLESPEC_CACHE:-$HOME/.cache/eaglespec}
F=$CACHE/features
RUN=$CACHE/medusa/$MODEL
$E extract --model "$MODEL" --data sharegpt --split heldout --limit 50 --dtype "$DTYPE" --threads 2 --out "$F/medusa-$MODEL-heldout"
$E extract --model "$MODEL" "${DATA[@]}" --split train --dtype "$DTYPE" --threads 2 --out "$F/medusa-$MODEL-train"
$E train --model "$MODEL" --train-features "$F/medusa-$MODEL-train" --heldout-features "$F/medusa-$MODEL-heldout" \
    --out "$RUN" --head-type medusa --draft-vocab "$VOCAB" --lr 1e-3 --warmup-steps 10 --epochs 3 \
    --budget-minutes 20 --eval-limit 20 --checkpoint-every 20 --threads 1
H=src/eaglespec/heads/shipped/medusa/$MODEL
rm -rf "$H" && mkdir -p "$H" && cp "$RUN/head/config.json" "$RUN/head/model.safetensors" "$RUN/curves.png" "$H/"
if git check-ignore -q "$H"; then  # the weights stay local; their record is committed
    R=benchmarks/results/heads/medusa-$MODEL
    mkdir -p "$R" && cp "$H/config.json" "$H/curves.png" "$R/"
fi
