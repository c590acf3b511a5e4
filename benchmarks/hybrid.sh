#!/usr/bin/env bash
# `hybrid` (EAGLE, lookup and the suffix cache in one tree) against its sources alone, on the suite's
# cells (int4 weights, the suite's settings): vanilla, eagle, pld, hybrid and hybrid without EAGLE.
# The 1.5B row runs without EAGLE where its head is not built. Resumable (a cell whose JSON exists
# is skipped); then suite_report.py draws the tables and plots, where the tokens came from included.
#     bash benchmarks/hybrid.sh [OUT] [ONLY]     (default benchmarks/results/hybrid; ONLY: a part of a cell's name)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/hybrid}
ONLY=${2:-}
mkdir -p "$OUT"
METHODS="vanilla,eagle,pld,hybrid,hybrid:lookup+suffix"
for cell in "smollm2-135m-instruct mt-bench 0" "smollm2-135m-instruct humaneval 0" \
            "qwen2.5-coder-0.5b-instruct mt-bench 0" "qwen2.5-coder-0.5b-instruct humaneval 0" \
            "smollm2-135m-instruct mt-bench 1" "smollm2-135m-instruct humaneval 1" \
            "qwen2.5-coder-0.5b-instruct mt-bench 1" "qwen2.5-coder-0.5b-instruct humaneval 1" \
            "qwen2.5-coder-1.5b-instruct humaneval 0"; do
    set -- $cell
    f=$OUT/$1-$2-t$3.json
    [[ -z "$ONLY" || "$f" == *"$ONLY"* ]] || continue
    [[ -f $f ]] && { echo "have $f"; continue; }
    methods=$METHODS
    [[ -f heads/$1/config.json || $1 != qwen2.5-coder-1.5b-instruct ]] || methods="vanilla,pld,hybrid:lookup+suffix"
    .venv/bin/eaglespec bench --model "$1" --head default --dataset "$2" --temperature "$3" --limit 10 \
        --methods "$methods" --weights int4 --max-new-tokens 128 --threads 2 --out "$f"
done
.venv/bin/python benchmarks/suite_report.py "$OUT"
