#!/usr/bin/env bash
# Speed of two commits side by side on one machine: `eaglespec bench` on SmolLM2, MT-bench (5
# questions, greedy), the two commits' runs alternated REPEATS times, each commit's code from a git
# worktree (PYTHONPATH) with this checkout's venv. Stop background jobs first.
#     bash benchmarks/experiments/compare_commits.sh 1f92baf HEAD benchmarks/results/seams-speed
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=${1:?usage: compare_commits.sh OLD NEW OUT_DIR}; NEW=${2:?}; OUT=${3:?}
REPEATS=${REPEATS:-2}
ROOT=$PWD; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
TREES=$(mktemp -d)
trap 'git worktree remove --force "$TREES/old"; git worktree remove --force "$TREES/new"; rm -rf "$TREES"' EXIT
git worktree add -q --detach "$TREES/old" "$OLD"
git worktree add -q --detach "$TREES/new" "$NEW"
for rep in $(seq "$REPEATS"); do
    for side in old new; do
        (cd "$TREES/$side" && PYTHONPATH="$TREES/$side/src" "$ROOT/.venv/bin/eaglespec" bench \
            --model smollm2-135m-instruct --dataset mt-bench --limit 5 --methods vanilla,eagle,pld,hybrid \
            --temperature 0 --max-new-tokens 128 --threads 2 --out "$OUT/$side-$rep.json")
        rm -f "$OUT/$side-$rep"-*.png
    done
done
