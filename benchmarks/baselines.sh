#!/usr/bin/env bash
# The paper's other baselines, Medusa and Lookahead decoding, beside EAGLE and prompt lookup on the
# suite's cells (int4 weights, the suite's settings): vanilla, eagle, pld, medusa (where
# heads/medusa/MODEL exists), lookahead. Resumable (a cell whose JSON exists is skipped); then
# suite_report.py draws the tables and plots.
#     bash benchmarks/baselines.sh [OUT] [ONLY]    (default benchmarks/results/baselines; ONLY: a part of a cell's name)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/baselines}
ONLY=${2:-}
mkdir -p "$OUT"
for cell in "smollm2-135m-instruct mt-bench 0" "smollm2-135m-instruct humaneval 0" \
            "qwen2.5-coder-0.5b-instruct mt-bench 0" "qwen2.5-coder-0.5b-instruct humaneval 0" \
            "smollm2-135m-instruct mt-bench 1" "smollm2-135m-instruct humaneval 1" \
            "qwen2.5-coder-0.5b-instruct mt-bench 1" "qwen2.5-coder-0.5b-instruct humaneval 1" \
            "qwen2.5-coder-1.5b-instruct humaneval 0" "qwen2.5-coder-1.5b-instruct humaneval 1"; do
    set -- $cell
    f=$OUT/$1-$2-t$3.json
    [[ -z "$ONLY" || "$f" == *"$ONLY"* ]] || continue
    [[ -f $f ]] && { echo "have $f"; continue; }
    methods=vanilla
    [[ -f heads/$1/config.json ]] && methods+=,eagle
    methods+=,pld
    [[ -f heads/medusa/$1/config.json ]] && methods+=,medusa
    methods+=,lookahead
    .venv/bin/eaglespec bench --model "$1" --head default --medusa-head default --dataset "$2" --temperature "$3" \
        --limit 10 --methods "$methods" --weights int4 --max-new-tokens 128 --threads 2 --out "$f"
done
.venv/bin/python benchmarks/suite_report.py "$OUT"
