"""EAGLE's `auto` tree in one-shot generations, as the main command runs it (a fresh method per
prompt, nothing learned from an earlier generation), against vanilla decoding, for several lengths
of `auto`'s probes (`AutoSize.PROBE_ROUNDS`: drafting rounds before it may judge drafting slower).
The runs of each prompt are interleaved (vanilla, then each probe length), all greedy; each prompt's
text must equal vanilla's.

    .venv/bin/python benchmarks/experiments/auto_probe.py --limit 10 --probe-rounds 1,3 --out benchmarks/results/auto-probe.json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from dataclasses import replace

import torch

from common import machine, write_json
from eaglespec.api import load
from eaglespec.bench.datasets import load_items
from eaglespec.decoding.sizing import AutoSize

SKY = "Explain in three sentences why the sky is blue."  # the main command's prompt until 2026-12-05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dataset", default="mt-bench")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--probe-rounds", default="1,3", help="comma-separated PROBE_ROUNDS values")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1, help="passes over the prompts")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    probes = [int(x) for x in args.probe_rounds.split(",")]
    torch.set_num_threads(2)
    model = load(args.model, "default", "bfloat16", "cpu", None, "dense", None)
    prompts = [SKY] + [item.turns[0] for item in load_items(args.dataset, args.limit)]
    settings = {"chat": True, "max_new_tokens": args.max_new_tokens, "tree": "auto"}
    for method in ("eagle", "vanilla"):  # first-call costs paid before any timed run
        model.generate(prompts[0], **(settings | {"method": method, "max_new_tokens": 8}))
    rows = []
    for repeat in range(args.repeats):
        for index, prompt in enumerate(prompts):
            vanilla = model.generate(prompt, **(settings | {"method": "vanilla"}))
            row = {"prompt": index, "repeat": repeat, "tokens": vanilla.new_tokens, "vanilla_s": vanilla.seconds}
            for rounds in probes:
                AutoSize.PROBE_ROUNDS = rounds
                out = replace(model, methods={}).generate(prompt, **(settings | {"method": "eagle"}))
                if out.token_ids != vanilla.token_ids:
                    raise SystemExit(f"prompt {index}: EAGLE's text differs from vanilla's")
                row[f"probe{rounds}"] = {"seconds": out.seconds, "tau": out.tau, "speedup": vanilla.seconds / out.seconds,
                                         "tree": out.tree}
            rows.append(row)
            print(index, vanilla.new_tokens, " ".join(f"probe{r} {row[f'probe{r}']['speedup']:.2f}x" for r in probes),
                  flush=True)
    summary = {}
    for rounds in probes:
        key = f"probe{rounds}"
        speedups = sorted(r[key]["speedup"] for r in rows)
        summary[key] = {"total_speedup": sum(r["vanilla_s"] for r in rows) / sum(r[key]["seconds"] for r in rows),
                        "median_speedup": speedups[len(speedups) // 2], "worst": speedups[0],
                        "sky_speedups": [r[key]["speedup"] for r in rows if r["prompt"] == 0]}
        print(key, {k: (round(v, 3) if isinstance(v, float) else [round(x, 3) for x in v]) for k, v in summary[key].items()})
    write_json({"machine": machine(), "model": args.model, "dataset": args.dataset, "limit": args.limit,
                "max_new_tokens": args.max_new_tokens, "command": "benchmarks/experiments/auto_probe.py", "summary": summary,
                "rows": rows}, Path(args.out))


if __name__ == "__main__":
    main()
