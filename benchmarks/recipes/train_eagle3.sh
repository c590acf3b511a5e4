#!/usr/bin/env bash
# The exact commands behind an EAGLE-3 head (src/eaglespec/heads/shipped/eagle3/MODEL), the head type that vLLM and SGLang
# load beside EAGLE-1 and the only one llama.cpp loads (`--spec-type draft-eagle3`):
#     bash benchmarks/recipes/train_eagle3.sh smollm2-135m-instruct
# Not committed (about 22 MB for SmolLM2, over the tree's budget): its config, eval and curves go to
# benchmarks/results/heads/eagle3-MODEL/. The head reads the hidden states entering layers 2, N/2 and
# N-3 (vLLM's default), learns the target's next-token distribution over an 8,192-token draft
# vocabulary (soft cross-entropy, EAGLE-3's loss) three draft steps deep (training-time test), on
# the features of the target's own answers (data/regenerated/MODEL, fp32). BUDGET minutes of
# training (default 120; the learning rate decays to 0 at it). Resumable: run it again with the same
# BUDGET after an interruption (a finished run returns at once); another BUDGET is another run, in
# its own folder, from the start (the features are shared).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:?usage: train_eagle3.sh MODEL}
case "$MODEL" in
    smollm2-135m-instruct) DATA=(--data "data/regenerated/$MODEL" --limit 1000); VOCAB=8192 ;;
    *) echo "no EAGLE-3 recipe for '$MODEL' (llama.cpp's EAGLE-3 layer has no attention biases, so Qwen2" \
            "heads would run in vLLM and SGLang only)" >&2; exit 1 ;;
esac
BUDGET=${BUDGET:-120}
E=.venv/bin/eaglespec
CACHE=${EAGLESPEC_CACHE:-$HOME/.cache/eaglespec}
F=$CACHE/features
RUN=$CACHE/eagle3/$MODEL-${BUDGET}min
A=(--aux-layers eagle3 --dtype float32 --threads 2)
$E extract --model "$MODEL" --split heldout --limit 50 "${A[@]}" --out "$F/eagle3-$MODEL-heldout"
$E extract --model "$MODEL" "${DATA[@]}" --split train "${A[@]}" --out "$F/eagle3-$MODEL-train"
$E train --model "$MODEL" --train-features "$F/eagle3-$MODEL-train" --heldout-features "$F/eagle3-$MODEL-heldout" \
    --out "$RUN" --head-type eagle3 --loss ce --unroll 3 --draft-vocab "$VOCAB" --lr 5e-4 --warmup-steps 20 \
    --batch 8 --epochs 100 --budget-minutes "$BUDGET" --eval-limit 20 --checkpoint-every 10 --threads 2
H=src/eaglespec/heads/shipped/eagle3/$MODEL
rm -rf "$H" && mkdir -p "$H" && cp "$RUN/head/config.json" "$RUN/head/model.safetensors" "$RUN/curves.png" "$H/"
$E eval-head --model "$MODEL" --head "$H" --limit 50 --data "data/regenerated/$MODEL-heldout" --answer-tokens 128 \
    --dtype float32 --threads 2 --json | tee "$H/eval.json"
R=benchmarks/results/heads/eagle3-$MODEL
mkdir -p "$R" && cp "$H/config.json" "$H/eval.json" "$H/curves.png" "$R/"
