#!/usr/bin/env bash
# The main job on the bundled default model: EAGLE generation with the shipped head, then vanilla
# decoding on the same prompt for the speedup. The default prompt is MT-bench's first question, the
# benchmark behind the README's figures.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/eaglespec generate --model smollm2-135m-instruct --method eagle --head default --tree auto \
    --chat --threads 2 --max-new-tokens 128 --compare-vanilla \
    --prompt "${1:-Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and must-see attractions.}"
