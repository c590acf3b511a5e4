#!/usr/bin/env bash
# The full benchmark table: every method side by side, per model, dataset and temperature
# (CPU, 2 threads). Each run writes OUT/MODEL-DATASET-tT.json and
# its plots; a run whose JSON exists is skipped, so an interrupted suite resumes. Then
# suite_report.py prints the README tables and draws the combined plots.
#
#     bash benchmarks/suite.sh            # everything (hours on 2 cores)
#     bash benchmarks/suite.sh smollm2    # only the rows whose name contains "smollm2"
#     WEIGHTS=int4 OUT=benchmarks/results/suite-zen2-avx2-int4 bash benchmarks/suite.sh
#
# WEIGHTS is the target weight format of our methods (bench --weights: dense, int8, int4; the fastest
# is the machine's: see vanilla_speed.py); OUT the folder of the JSON (default benchmarks/results/bench,
# or benchmarks/results/bench-WEIGHTS for other formats, so that no run of one format passes for another's).
#
# The datasets are sub-sampled (LIMIT items, first in file order) to fit a CPU budget. The llama.cpp
# columns need its programs: bash scripts/setup_llamacpp.sh (once).
set -euo pipefail
cd "$(dirname "$0")/.."
ONLY=${1:-}
WEIGHTS=${WEIGHTS:-dense}
OUT=${OUT:-benchmarks/results/bench$([[ $WEIGHTS == dense ]] || echo "-$WEIGHTS")}
mkdir -p "$OUT"
SMALL="vanilla,eagle,eagle:chain:4,eagle:eagle1,eagle:dynamic,pld,pld:10,hybrid,medusa,lookahead,hf,hf-pld,llama.cpp,llama.cpp-ngram"
FLAGSHIP="vanilla,eagle,eagle:chain:4,sps:2,sps:3,sps:4,sps:5,sps:6,sps:7,sps:8,pld,pld:10,hybrid,medusa,lookahead,hf,hf-assisted,hf-pld,llama.cpp,llama.cpp-ngram,llama.cpp-draft"
if [[ ! -f heads/qwen2.5-coder-1.5b-instruct/config.json ]]; then  # not committed (103 MB), hours to build on a CPU
    FLAGSHIP=${FLAGSHIP/eagle,eagle:chain:4,/}
    FLAGSHIP=${FLAGSHIP/hybrid/hybrid:lookup+suffix}
    echo "note: no heads/qwen2.5-coder-1.5b-instruct (bash benchmarks/train_head.sh qwen2.5-coder-1.5b-instruct" \
         "builds it): the 1.5B rows run without eagle" >&2
fi

run() {  # MODEL DATASET TEMPERATURE LIMIT METHODS
    local name="$1-$2-t$3" methods=$5
    [[ -z "$ONLY" || "$name" == *"$ONLY"* ]] || return 0
    [[ -f "$OUT/$name.json" ]] && { echo "have $OUT/$name.json"; return 0; }
    # Medusa where its heads are built (benchmarks/train_medusa.sh MODEL)
    [[ -f heads/medusa/$1/config.json ]] || methods=${methods/,medusa/}
    .venv/bin/eaglespec bench --model "$1" --head default --medusa-head default --dataset "$2" --temperature "$3" \
        --limit "$4" --methods "$methods" --weights "$WEIGHTS" --max-new-tokens 128 --threads 2 --out "$OUT/$name.json"
}

for T in 0 1; do
    run smollm2-135m-instruct mt-bench $T 10 "$SMALL"
    run smollm2-135m-instruct humaneval $T 10 "$SMALL"
    run qwen2.5-coder-0.5b-instruct mt-bench $T 10 "$SMALL"
    run qwen2.5-coder-0.5b-instruct humaneval $T 10 "$SMALL"
    run qwen2.5-coder-1.5b-instruct humaneval $T 10 "$FLAGSHIP"
done
.venv/bin/python benchmarks/suite_report.py "$OUT"
