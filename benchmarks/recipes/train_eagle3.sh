#!/usr/bin/env bash
# The exact commands behind an EAGLE-3 head (src/eaglespec/heads/shipped/eagle3/MODEL), the head type that vLLM and SGLang
# load beside EAGLE-1 and the only one llama.cpp loads (`--spec-type draft-eagle3`):
#     bash benchmarks/recipes/train_eagle3.sh smollm2-135m-instruct
# The head reads the hidden states entering layers 2, N/2 and N-3 (vLLM's default), learns the
# target's next-token distribution over a draft vocabulary of 8,192 tokens (soft cross-entropy, EAGLE-3's loss) three
# draft steps deep (training-time test), on the long program's data recipe:
# the target's own answers and human ShareGPT ones, two to one, cut at 192 tokens (features in bf16,
# the held-out ones in fp32). BUDGET minutes of training (wall minutes of 2 threads; the learning rate
# decays to 0 at it), so that with its extraction each head costs at least its EAGLE-1 head's CPU hours:
# SmolLM2 780 (13.5 hours behind the shipped head; about 13 hours of a 2-core machine, with 2.97M
# tokens to extract first), Qwen2.5-Coder-0.5B 420 (the program's 4.55 hours after a starting head
# whose cost was not recorded: 1,200 conversations, 3 epochs). Resumable: run it again with the same
# BUDGET after an interruption (a finished run returns at once); another BUDGET is another run, in its own
# folder, from the start (the features are shared). Features and checkpoints are in ~/.cache/eaglespec; where
# that cache is lost with its machine, the features are extracted again and the training resumes from its light
# checkpoint (benchmarks/recipes/checkpoints/, the head in bf16: commit it at the end of each stretch). Its
# config, evals and curves go to benchmarks/results/heads/eagle3-MODEL/. Qwen's head has half its target's MLP width (2,432): with
# its own LM head over the draft vocabulary it is 38 MB in bf16, which could be committed within the tracked tree's
# 100 MiB in place of the EAGLE-1 head; at full size with 16,384 draft tokens it would be 66 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:?usage: train_eagle3.sh MODEL}
case "$MODEL" in
    smollm2-135m-instruct)
        OWN=data/regenerated/$MODEL
        DATA=(--data "$OWN:3460,$OWN-short:1363,$OWN-more:2705,sharegpt:3764" --answer-tokens 192); VOCAB=8192
        WIDTH=0 BUDGET=${BUDGET:-780} ;;
    qwen2.5-coder-0.5b-instruct)  # runs in vLLM and SGLang: llama.cpp's Qwen2 graph gives no layer inputs to a draft
        OWN=data/regenerated/$MODEL
        DATA=(--data "$OWN:194,$OWN-more:3360,sharegpt:1777" --answer-tokens 192); VOCAB=8192
        WIDTH=2432 BUDGET=${BUDGET:-420} ;;
    *) echo "no EAGLE-3 recipe for '$MODEL': see the recipes in this script" >&2; exit 1 ;;
esac
E=.venv/bin/eaglespec
CACHE=${EAGLESPEC_CACHE:-$HOME/.cache/eaglespec}
F=$CACHE/features
RUN=$CACHE/eagle3/$MODEL-${BUDGET}min
A=(--aux-layers eagle3 --dtype float32 --threads 2)
$E extract --model "$MODEL" --data sharegpt --split heldout --limit 50 "${A[@]}" --out "$F/eagle3-$MODEL-heldout"
$E extract --model "$MODEL" "${DATA[@]}" --split train --aux-layers eagle3 --dtype bfloat16 --threads 2 \
    --out "$F/eagle3-$MODEL-mixed"
$E train --model "$MODEL" --train-features "$F/eagle3-$MODEL-mixed" --heldout-features "$F/eagle3-$MODEL-heldout" \
    --out "$RUN" --head-type eagle3 --loss ce --unroll 3 --draft-vocab "$VOCAB" --intermediate-size "$WIDTH" --lr 5e-4 \
    --warmup-steps 20 --batch 8 --epochs 100 --budget-minutes "$BUDGET" --eval-limit 20 --checkpoint-every 10 --threads 2 \
    --light-checkpoint "benchmarks/recipes/checkpoints/eagle3-$MODEL-${BUDGET}min.pt"
H=src/eaglespec/heads/shipped/eagle3/$MODEL
rm -rf "$H" && mkdir -p "$H" && cp "$RUN/head/config.json" "$RUN/head/model.safetensors" "$RUN/curves.png" "$H/"
# scored as the program scores the EAGLE-1 heads (fp32, 50 held-out conversations): human answers (eval.json, as
# theirs), the target's own answers, and their first 128 tokens
score() {  # score FILE OPTIONS...: written whole or not at all
    $E eval-head --model "$MODEL" --head "$H" --limit 50 --dtype float32 --threads 2 --json "${@:2}" > "$1.tmp"
    mv "$1.tmp" "$1"
}
score "$H/eval.json" --data sharegpt
score "$H/eval-own.json" --data "data/regenerated/$MODEL-heldout"
score "$H/eval-own-first128.json" --data "data/regenerated/$MODEL-heldout" --answer-tokens 128
R=benchmarks/results/heads/eagle3-$MODEL
mkdir -p "$R" && cp "$H"/config.json "$H"/eval*.json "$H"/curves.png "$R/"
