#!/usr/bin/env bash
# EAGLE's `auto` tree against vanilla decoding alone, on six cells of the suite (int4 weights, the
# suite's settings): the measurement behind the README's paragraph on `auto` carrying what it
# learned from one generation to the next. Resumable (a cell whose JSON exists is skipped).
#     bash benchmarks/auto_carry.sh [OUT]     (default benchmarks/results/auto-carry)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/auto-carry}
mkdir -p "$OUT"
for cell in "smollm2-135m-instruct mt-bench 0" "smollm2-135m-instruct mt-bench 1" \
            "smollm2-135m-instruct humaneval 0" "smollm2-135m-instruct humaneval 1" \
            "qwen2.5-coder-0.5b-instruct mt-bench 0" "qwen2.5-coder-0.5b-instruct mt-bench 1"; do
    set -- $cell
    f=$OUT/$1-$2-t$3.json
    [[ -f $f ]] && { echo "have $f"; continue; }
    .venv/bin/eaglespec bench --model "$1" --head default --dataset "$2" --temperature "$3" --limit 10 \
        --methods vanilla,eagle --weights int4 --max-new-tokens 128 --threads 2 --out "$f"
done
.venv/bin/python benchmarks/suite_report.py "$OUT"
