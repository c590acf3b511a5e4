#!/usr/bin/env bash
# The main job on the bundled default model: generation with its timing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/eaglespec generate --model smollm2-135m-instruct --chat --threads 2 --max-new-tokens 128 \
    --prompt "${1:-Explain in three sentences why the sky is blue.}"
