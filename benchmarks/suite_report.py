"""The README's benchmark tables and plots, made from the JSON that benchmarks/suite.sh wrote:
one summary row per model, dataset and temperature (the best tree of EAGLE, the best draft
length of sps), every run's own table below it, and a speedup and a tau plot per model (and one
of where `hybrid`'s tokens came from, where it ran).

    .venv/bin/python benchmarks/suite_report.py [FOLDER]   # FOLDER/summary.md + PNGs (default benchmarks/results/bench)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eaglespec.bench.plots import plot_sources, plot_speedups, plot_tau
from eaglespec.bench.run import markdown


def cell(result: dict, family: str) -> str:
    spec = result["best"].get(family)
    if spec is None:
        return "-"
    s = result["methods"][spec]
    tau = "" if s["tau"] is None else f", tau {s['tau']:.2f}"
    vs = f", {s['speedup_vs_hf']:.2f}x hf" if "speedup_vs_hf" in s else ""
    name = f" ({spec.split(':', 1)[1]})" if ":" in spec else ""
    return f"{s['speedup']:.2f}x{name}{tau}{vs}"


OURS = ("vanilla", "eagle", "sps", "pld", "hybrid", "medusa", "lookahead")
LLAMA_CPP = ("llama.cpp", "llama.cpp-ngram", "llama.cpp-draft")


def versus_llama_cpp(result: dict) -> str:
    """Our fastest method's tokens/s over llama.cpp's fastest method's, on the same turns."""
    def fastest(families):
        runs = [(result["methods"][result["best"][f]]["tokens_per_s"], result["best"][f])
                for f in families if f in result["best"]]
        return max(runs) if runs else None

    ours, theirs = fastest(OURS), fastest(LLAMA_CPP)
    return "-" if not (ours and theirs) else f"{ours[0] / theirs[0]:.2f}x ({ours[1]} / {theirs[1]})"


def main() -> None:
    results_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results" / "bench"
    results = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    if not results:
        raise SystemExit(f"no results in {results_dir}: run benchmarks/suite.sh first")
    families = [f for f in ("eagle", "sps", "pld", "hybrid", "medusa", "lookahead", "hf", "hf-assisted", "hf-pld", "llama.cpp", "llama.cpp-ngram",
                            "llama.cpp-draft")
                if any(f in r["best"] for r in results)]
    lines = ["| model | dataset | T | items (turns) | weights | vanilla tok/s | " + " | ".join(families)
             + " | best of ours / llama.cpp's best (tokens/s) |",
             "|" + "---|" * (7 + len(families))]
    for r in results:
        c = r["config"]
        lines.append(f"| {c['model']} | {c['dataset']} | {c['temperature']:g} | {r['items']} ({r['turns']}) | {c.get('weights', 'dense')} | "
                     f"{r['methods']['vanilla']['tokens_per_s']:.1f} | "
                     + " | ".join(cell(r, f) for f in families) + f" | {versus_llama_cpp(r)} |")
    text = "\n".join(lines) + "\n\n" + "\n\n".join(markdown(r) for r in results) + "\n"
    (results_dir / "summary.md").write_text(text)
    for model in dict.fromkeys(r["config"]["model"] for r in results):
        mine = [r for r in results if r["config"]["model"] == model]
        plot_speedups(mine, results_dir / f"speedup-{model}.png")
        plot_tau(mine, results_dir / f"tau-{model}.png")
        if any("accepted_by_source" in s for r in mine for s in r["methods"].values()):
            plot_sources(mine, results_dir / f"sources-{model}.png")
    print(text)


if __name__ == "__main__":
    main()
