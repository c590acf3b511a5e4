#!/usr/bin/env bash
# The main job on the bundled default model: EAGLE generation with the shipped head, then vanilla
# decoding on the same prompt for the speedup.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/eaglespec generate --model smollm2-135m-instruct --method eagle --head default --tree auto \
    --chat --threads 2 --max-new-tokens 128 --compare-vanilla \
    --prompt "${1:-Explain in three sentences why the sky is blue.}"
