"""The table of a benchmark suite's bench runs (`summary.md`): one summary row per run (model,
dataset, temperature) with the best variant of each method family (EAGLE's best tree, the best
draft length of sps), every run's own table below it, and per model a speedup and a tau plot (and
one of where `hybrid`'s tokens came from, where it ran)."""

from __future__ import annotations

from pathlib import Path

from eaglespec.bench.plots import model_label, plot_sources, plot_speedups, plot_tau
from eaglespec.bench.run import markdown
from eaglespec.files import write_text

OURS = ("vanilla", "eagle", "sps", "pld", "hybrid", "medusa", "lookahead")
LLAMA_CPP = ("llama.cpp", "llama.cpp-ngram", "llama.cpp-draft")
FAMILIES = ("eagle", "sps", "pld", "hybrid", "medusa", "lookahead", "hf", "hf-assisted", "hf-pld", *LLAMA_CPP)


def cell(result: dict, family: str) -> str:
    """A method family's best variant: speedup over vanilla, tau, and over transformers' generate."""
    spec = result["best"].get(family)
    if spec is None:
        return "-"
    s = result["methods"][spec]
    tau = "" if s["tau"] is None else f", tau {s['tau']:.2f}"
    vs = f", {s['speedup_vs_hf']:.2f}x hf" if "speedup_vs_hf" in s else ""
    name = f" ({spec.split(':', 1)[1]})" if ":" in spec else ""
    return f"{s['speedup']:.2f}x{name}{tau}{vs}"


def versus_llama_cpp(result: dict) -> str:
    """Our fastest method's tokens/s over llama.cpp's fastest method's, on the same turns."""
    def fastest(families):
        runs = [(result["methods"][result["best"][f]]["tokens_per_s"], result["best"][f])
                for f in families if f in result["best"]]
        return max(runs) if runs else None

    ours, theirs = fastest(OURS), fastest(LLAMA_CPP)
    return "-" if not (ours and theirs) else f"{ours[0] / theirs[0]:.2f}x ({ours[1]} / {theirs[1]})"


def bench_report(results: list[dict], folder: Path) -> str:
    """Write FOLDER/summary.md and the plots; the summary's text."""
    families = [f for f in FAMILIES if any(f in r["best"] for r in results)]
    lines = ["| model | dataset | T | items (turns) | weights | vanilla tok/s | " + " | ".join(families)
             + " | best of ours / llama.cpp's best (tokens/s) |",
             "|" + "---|" * (7 + len(families))]
    for r in results:
        c = r["config"]
        lines.append(f"| {model_label(c)} | {c['dataset']} | {c['temperature']:g} | {r['items']} ({r['turns']}) | "
                     f"{c.get('weights', 'dense')} | {r['methods']['vanilla']['tokens_per_s']:.1f} | "
                     + " | ".join(cell(r, f) for f in families) + f" | {versus_llama_cpp(r)} |")
    text = "\n".join(lines) + "\n\n" + "\n\n".join(markdown(r) for r in results) + "\n"
    write_text(text, Path(folder) / "summary.md")
    for model in dict.fromkeys(r["config"]["model"] for r in results):
        mine = [r for r in results if r["config"]["model"] == model]
        name = Path(model).name  # a bundled model's name, or a model folder's
        plot_speedups(mine, folder / f"speedup-{name}.png")
        plot_tau(mine, folder / f"tau-{name}.png")
        if any("accepted_by_source" in s for r in mine for s in r["methods"].values()):
            plot_sources(mine, folder / f"sources-{name}.png")
    return text
