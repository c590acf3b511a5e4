"""EAGLE against vanilla decoding (and transformers' `generate` for reference): the first N
MT-bench questions, first turn, chat template, 128 new tokens (EOS ignored), bf16, greedy and
temperature 1; every method runs on a question before the next question starts, in rotating
order. Peak memory (max RSS) comes from one fresh process per method.

    .venv/bin/python benchmarks/eagle_speed.py     # writes benchmarks/results/eagle_speed.json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import machine, write_json
from tqdm import tqdm
from transformers import AutoModelForCausalLM

from eaglespec.api import load
from eaglespec.bench.datasets import mt_bench
from eaglespec.decoding.generate import prompt_ids


def run_hf(model, ids: list[int], n: int, temperature: float, seed: int) -> dict:
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n,
                             do_sample=temperature > 0, temperature=temperature or None, top_p=None, top_k=None)
    seconds = time.perf_counter() - start
    return {"tokens_per_s": (out.shape[1] - len(ids)) / seconds, "tau": 1.0, "tokens": out[0, len(ids):].tolist()}


def run_ours(engine, ids: list[int], n: int, temperature: float, seed: int, tree: str | None) -> dict:
    out = engine.generate(ids, max_new_tokens=n, ignore_eos=True, temperature=temperature, seed=seed,
                          method="eagle" if tree else "vanilla", tree=tree or "auto")
    return {"tokens_per_s": out.tokens_per_s, "tau": out.tau, "tokens": out.token_ids, "tree": out.tree,
            "draft_s": out.draft_s, "verify_s": out.verify_s, "other_s": out.other_s, "seconds": out.seconds,
            "accepted_lengths": out.accepted_lengths, "n_alpha": out.n_alpha}


def peak_rss_mb(model: str, tree: str | None, threads: int) -> float:
    """Max RSS of a fresh process that loads the model (and head) and generates 128 tokens."""
    head, method = ("default", "eagle") if tree else (None, "vanilla")
    code = (
        f"import torch, resource; torch.set_num_threads({threads})\n"
        "from eaglespec.api import load\n"
        f"e = load({model!r}, head={head!r})\n"
        "e.generate('Tell me about the sea.', chat=True, max_new_tokens=128, ignore_eos=True, "
        f"method={method!r}, tree={tree or 'auto'!r})\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1]) / 1024


def summarize(runs: list[dict], baseline: list[dict]) -> dict:
    speedups = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(runs, baseline)]
    summary = {
        "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in runs),
        "speedup_mean": statistics.mean(speedups),
        "speedup_median": statistics.median(speedups),
        "tau": statistics.mean(r["tau"] for r in runs),
    }
    if "draft_s" in runs[0]:
        total = sum(r["seconds"] for r in runs)
        summary["time_split"] = {k: sum(r[f"{k}_s"] for r in runs) / total for k in ("draft", "verify", "other")}
        summary["tree"] = runs[-1]["tree"]
        if runs[0]["n_alpha"] is not None:
            summary["n_alpha"] = [statistics.mean(r["n_alpha"][i] for r in runs if len(r["n_alpha"]) > i)
                                  for i in range(max(len(r["n_alpha"]) for r in runs))]
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    p.add_argument("--trees", default="eagle1,chain:4,dynamic,auto")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--limit", type=int, default=20, help="MT-bench questions (first turn)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-hf", action="store_true", help="Skip transformers' generate")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "eagle_speed.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    questions = mt_bench(args.limit)
    trees = args.trees.split(",")
    report = {"benchmark": "EAGLE vs vanilla, MT-bench first turns", "machine": machine(), "dtype": "bfloat16",
              "questions": len(questions), "new_tokens": args.new_tokens, "models": {}}
    for name in args.models.split(","):
        engine = load(name, head="default")
        hf = None if args.no_hf else AutoModelForCausalLM.from_pretrained(
            str(engine.target.folder), dtype=torch.bfloat16).eval()
        methods = {"vanilla": None, **{f"eagle {t}": t for t in trees}}
        names = [*methods, *([] if hf is None else ["hf generate"])]
        result = {"temperatures": {}}
        for temperature in (float(t) for t in args.temperatures.split(",")):
            runs = {m: [] for m in names}
            ids0 = prompt_ids(engine.target, "Hello!", chat=True)
            for m, tree in methods.items():  # warm-up
                run_ours(engine, ids0, 16, temperature, 0, tree)
            bar = tqdm(questions, desc=f"{name} T={temperature:g}")
            for i, q in enumerate(bar):
                ids = prompt_ids(engine.target, q["turns"][0], chat=True)
                order = names[i % len(names):] + names[: i % len(names)]
                for m in order:
                    if m == "hf generate":
                        runs[m].append(run_hf(hf, ids, args.new_tokens, temperature, i))
                    else:
                        runs[m].append(run_ours(engine, ids, args.new_tokens, temperature, i, methods[m]))
            rows = {m: summarize(runs[m], runs["vanilla"]) for m in names}
            if temperature == 0:
                for m in names:  # greedy: every method's tokens against vanilla's
                    rows[m]["same_tokens_as_vanilla"] = sum(
                        r["tokens"] == v["tokens"] for r, v in zip(runs[m], runs["vanilla"]))
            result["temperatures"][f"{temperature:g}"] = rows
            for m, row in rows.items():
                print(f"{name} T={temperature:g} {m:16s} {row['tokens_per_s']:6.1f} tok/s  "
                      f"x{row['speedup_median']:.2f}  tau {row['tau']:.2f}", flush=True)
        result["peak_rss_mb"] = {m: peak_rss_mb(name, tree, args.threads) for m, tree in
                                 (("vanilla", None), ("eagle auto", "auto"))}
        report["models"][name] = result
        write_json(report, args.out)  # after each model: an interrupted run keeps what it finished
        del hf


if __name__ == "__main__":
    main()
