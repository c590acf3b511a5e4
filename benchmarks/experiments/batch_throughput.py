"""Batched speculative decoding on this CPU: throughput of each method at batch sizes 1, 2, 4, 8
(`eaglespec bench --batch-size B`, the same items and settings at every B), its speedup over
vanilla at the same batch size (the form of the EAGLE paper's Table 7), per-token latency per row,
and whether every row's tokens are the ones it gets decoded alone (batch size 1).

    .venv/bin/python benchmarks/experiments/batch_throughput.py smollm2-135m-instruct --out benchmarks/results/batch-MACHINE
    # writes DIR/MODEL.json (summaries; every run's tokens in DIR/MODEL-runs.json) and DIR/MODEL.png

Stop other work while it runs: on a 2-core machine a background job skews every timing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common import machine, write_json  # noqa: E402
from eaglespec.bench.run import Bench, BenchConfig  # noqa: E402
from eaglespec.files import save_figure  # noqa: E402

FIELDS = ("throughput_tokens_per_s", "throughput_speedup", "ms_per_token_p50", "ms_per_token_p95", "tau",
          "same_tokens_as_vanilla", "peak_memory_mb")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--out", required=True, type=Path, help="results folder (one per machine)")
    parser.add_argument("--methods", default="vanilla,eagle,pld,hybrid")
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--dataset", default="mt-bench")
    parser.add_argument("--limit", type=int, default=8, help="items (each batch size runs them all)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    table, runs = {}, {}
    for B in sizes:
        config = BenchConfig(model=args.model, dataset=args.dataset, methods=tuple(args.methods.split(",")),
                             limit=args.limit, max_new_tokens=args.max_new_tokens, batch_size=B)
        bench = Bench(config)
        result = bench.run()
        runs[B] = {spec: [r["token_ids"] for r in s["runs"]] for spec, s in result["methods"].items()}
        table[B] = {spec: {k: s[k] for k in FIELDS} | {"tree": s.get("tree")} for spec, s in result["methods"].items()}
        for spec, rows in runs[B].items():  # each row's tokens against the same item and turn alone
            table[B][spec]["same_tokens_as_batch_size_1"] = sum(a == b for a, b in zip(rows, runs[sizes[0]][spec]))
        table[B]["turns"] = result["turns"]
        del bench
    summary = {"model": args.model, "dataset": args.dataset, "items": args.limit, "max_new_tokens": args.max_new_tokens,
               "temperature": 0.0, "dtype": "bfloat16", "batch_sizes": {str(b): t for b, t in table.items()},
               "machine": machine()}
    write_json(summary, args.out / f"{args.model}.json")
    write_json({str(b): r for b, r in runs.items()}, args.out / f"{args.model}-runs.json")
    plot(summary, args.out / f"{args.model}.png")
    print(markdown(summary["batch_sizes"]))


def markdown(by_size: dict) -> str:
    methods = [m for m in next(iter(by_size.values())) if m != "turns"]
    lines = ["| batch size | " + " | ".join(f"{m}: tokens/s (speedup), tau" for m in methods)
             + " | ms/token p50 / p95 (vanilla; " + methods[1 if len(methods) > 1 else 0] + ") | rows = batch size 1 |",
             "|---|" + "---|" * (len(methods) + 2)]
    for B, row in by_size.items():
        cells = [f"{row[m]['throughput_tokens_per_s']:.1f} ({row[m]['throughput_speedup']:.2f}x), {row[m]['tau']:.2f}"
                 for m in methods]
        pick = [row[m] for m in (methods[0], methods[1 if len(methods) > 1 else 0])]
        cells.append("; ".join(f"{p['ms_per_token_p50']:.1f} / {p['ms_per_token_p95']:.1f}" for p in pick))
        cells.append(f"{sum(row[m]['same_tokens_as_batch_size_1'] for m in methods)} of {row['turns'] * len(methods)}")
        lines.append(f"| {B} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    by_size = summary["batch_sizes"]
    sizes = [int(b) for b in by_size]
    methods = [m for m in next(iter(by_size.values())) if m != "turns"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for m in methods:
        left.plot(sizes, [by_size[str(b)][m]["throughput_tokens_per_s"] for b in sizes], marker="o", label=m)
        right.plot(sizes, [by_size[str(b)][m]["throughput_speedup"] for b in sizes], marker="o", label=m)
    left.set(xlabel="batch size", ylabel="tokens/s, all rows", xscale="log", xticks=sizes, xticklabels=sizes,
             title="throughput")
    right.set(xlabel="batch size", ylabel="x vanilla at the same batch size", xscale="log", xticks=sizes,
              xticklabels=sizes, title="speedup (the paper's Table 7 form)")
    right.axhline(1.0, color="grey", lw=0.8)
    for axis in (left, right):
        axis.minorticks_off()
    left.legend()
    fig.suptitle(f"{summary['model']}, {summary['dataset']} ({summary['items']} items), greedy, bf16, "
                 f"{summary['machine'].get('cpu', '')}", fontsize=9)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
