"""Vanilla decoding speed: eaglespec against transformers' `generate`, same weights, same prompts,
same number of new tokens (EOS ignored), bf16, runs interleaved.

    .venv/bin/python benchmarks/vanilla_speed.py            # writes benchmarks/results/vanilla_speed.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM

from common import machine, write_json
from eaglespec.decoding.generate import generate, prompt_ids
from eaglespec.models.load import load_target

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash map works and when to use one.",
    "Write a Python function that merges two sorted lists, with comments.",
    "What are the main causes of the French Revolution?",
    "Give me a recipe for a vegetarian lasagna, step by step.",
]


def time_ours(target, ids, n):
    start = time.perf_counter()
    out = generate(target, ids, max_new_tokens=n, ignore_eos=True)
    seconds = time.perf_counter() - start
    assert out.new_tokens == n
    return n / seconds


def time_hf(model, ids, n):
    x = torch.tensor([ids])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    seconds = time.perf_counter() - start
    assert out.shape[1] - len(ids) == n
    return n / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "vanilla_speed.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    report = {"benchmark": "vanilla decoding, eaglespec vs transformers generate", "machine": machine(),
              "dtype": "bfloat16", "new_tokens": args.new_tokens, "prompts": len(PROMPTS),
              "repeats": args.repeats, "models": {}}
    for name in args.models.split(","):
        target = load_target(name, "bfloat16")
        hf = AutoModelForCausalLM.from_pretrained(str(target.folder), dtype=torch.bfloat16).eval()
        runners = {"eaglespec": lambda ids, n: time_ours(target, ids, n),
                   "transformers": lambda ids, n: time_hf(hf, ids, n)}
        all_ids = [prompt_ids(target, prompt, chat=True) for prompt in PROMPTS]
        for run in runners.values():  # warm-up
            run(all_ids[0], 8)
        speeds = {k: [] for k in runners}
        jobs = [(r, i) for r in range(args.repeats) for i in range(len(all_ids))]
        for r, i in tqdm(jobs, desc=name):
            order = list(runners) if (r + i) % 2 == 0 else list(runners)[::-1]
            for key in order:
                speeds[key].append(runners[key](all_ids[i], args.new_tokens))
        ratios = [a / b for a, b in zip(speeds["eaglespec"], speeds["transformers"])]
        report["models"][name] = {
            "tokens_per_s": {k: statistics.median(v) for k, v in speeds.items()},
            "speedup_median": statistics.median(ratios),
            "speedup_min": min(ratios),
            "runs": speeds,
        }
    write_json(report, args.out)
    print("| model | eaglespec tokens/s | transformers tokens/s | speedup (median, min) |")
    print("|---|---|---|---|")
    for name, r in report["models"].items():
        t = r["tokens_per_s"]
        print(f"| {name} | {t['eaglespec']:.1f} | {t['transformers']:.1f} | "
              f"{r['speedup_median']:.2f}x, {r['speedup_min']:.2f}x |")


if __name__ == "__main__":
    main()
