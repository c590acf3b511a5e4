"""The suffix cache on a repeated workload: the same HumanEval problems asked twice in one process,
greedy. Per pass: tokens/s, tau and the accepted draft tokens by source of `hybrid`, against
`hybrid` without its suffix cache and vanilla decoding (each method in turn on each problem, so
that drifts of the machine spread evenly); then the cache's size, held to a bound far below
the workload, over a long run of generations.

    .venv/bin/python benchmarks/experiments/suffix_cache.py [--model smollm2-135m-instruct] [--problems 20]
        [--weights int4] [--bound 2000] [--out benchmarks/results/suffix-cache-MODEL.json]
"""

from __future__ import annotations

import argparse
import statistics
import tracemalloc
from pathlib import Path

import torch
from tqdm import tqdm

from common import machine, write_json

import eaglespec  # noqa: E402
from eaglespec.bench.datasets import load_items  # noqa: E402
from eaglespec.decoding.generate import chat_ids  # noqa: E402
from eaglespec.decoding.drafters import parse_method  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--problems", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--weights", default="int4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bound", type=int, default=2000, help="tokens the bounded cache of the memory run holds")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out or f"benchmarks/results/suffix-cache-{args.model}.json")
    model = eaglespec.load(args.model, head="default", weights=args.weights)
    eagle = "eagle+" if model.head is not None else ""
    specs = ["vanilla", f"hybrid:{eagle}lookup", f"hybrid:{eagle}lookup+suffix"]
    prompts = [chat_ids(model.target, [{"role": "user", "content": item.turns[0]}])
               for item in load_items("humaneval", args.problems)]
    for spec in specs:  # warm-up, on objects then dropped (a suffix cache would keep the first answer)
        model.generate(prompts[0], method=parse_method(spec, head=model.head) or "vanilla", max_new_tokens=8)
    methods = {spec: parse_method(spec, head=model.head) or "vanilla" for spec in specs}
    runs = {spec: [[], []] for spec in specs}
    bar = tqdm(total=2 * len(prompts) * len(specs), desc="two passes", unit="generation")
    for p in range(2):
        for i, ids in enumerate(prompts):
            for spec in specs[i % len(specs):] + specs[: i % len(specs)]:
                o = model.generate(ids, method=methods[spec], max_new_tokens=args.max_new_tokens)
                runs[spec][p].append({"tokens": o.new_tokens, "seconds": o.seconds, "forwards": o.target_forwards,
                                      "sources": o.sources or {}, "token_ids": o.token_ids})
                bar.update()
    bar.close()
    result = {"config": vars(args), "machine": machine("cpu"), "passes": {}}
    for spec in specs:
        passes = []
        for p, rs in enumerate(runs[spec]):
            tokens, forwards = sum(r["tokens"] for r in rs), sum(r["forwards"] for r in rs)
            ratios = [r["tokens"] / r["seconds"] / (v["tokens"] / v["seconds"])
                      for r, v in zip(rs, runs["vanilla"][p])]
            sources = {}
            for r in rs:
                for k, n in r["sources"].items():
                    sources[k] = sources.get(k, 0) + n
            passes.append({"tokens_per_s": tokens / sum(r["seconds"] for r in rs), "tau": tokens / forwards,
                           "speedup": statistics.median(ratios), "accepted_by_source": sources,
                           "same_tokens_as_vanilla": sum(r["token_ids"] == v["token_ids"]
                                                         for r, v in zip(rs, runs["vanilla"][p]))})
        result["passes"][spec] = passes
    cache = methods[specs[-1]].state[model.target.model].cache
    result["cache_after_two_passes"] = {"tokens": cache.tokens, "texts": len(cache.texts)}
    result["bounded_run"] = bounded_run(model, prompts, args)
    write_json(result, out)
    for spec, passes in result["passes"].items():
        print(f"{spec:32s} " + "  ".join(f"pass {p + 1}: {s['tokens_per_s']:.1f} tok/s, {s['speedup']:.2f}x, "
                                         f"tau {s['tau']:.2f}" for p, s in enumerate(passes)))
    print("bounded run:", result["bounded_run"])
    print("wrote", out)


def bounded_run(model, prompts, args) -> dict:
    """Many generations through a cache bounded far below what they produce: the tokens it holds
    and the memory Python allocated for it, after each pass over the problems."""
    method = parse_method(f"hybrid:lookup+suffix={args.bound}")
    tracemalloc.start()
    held = []
    for _ in tqdm(range(3), desc="bounded cache", unit="pass"):
        for ids in prompts:
            model.generate(ids, method=method, max_new_tokens=32)
        cache = method.state[model.target.model].cache
        held.append({"tokens": cache.tokens, "texts": len(cache.texts),
                     "traced_mib": tracemalloc.get_traced_memory()[0] / 2**20})
    tracemalloc.stop()
    return {"bound": args.bound, "generations_per_pass": len(prompts), "after_each_pass": held}


if __name__ == "__main__":
    main()
