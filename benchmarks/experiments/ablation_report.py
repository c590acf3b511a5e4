"""The README's ablation tables, from what benchmarks/experiments/ablations.sh wrote: held-out n-alpha per
epoch of each ablation head (same data and budget), the objectives ablation (per budget in
objectives-Nmin/, one time budget for every head: the final held-out n-alpha, and a plot of 0-alpha
against training minutes), the draft-quality ablation (quality-Nmin/: per head n-alpha on the
target's own and on human answers and MT-bench tau and speedup), and the bench runs of the tree and
data ablations.

    .venv/bin/python benchmarks/experiments/ablation_report.py   # writes benchmarks/results/ablations/summary.md
"""

from __future__ import annotations

import json
from pathlib import Path

from eaglespec.bench.run import markdown

RESULTS = Path(__file__).resolve().parents[1] / "results" / "ablations"


def objectives_table(paths: list[Path]) -> str:
    lines = ["| head | type | loss | unrolled steps | training minutes | wall minutes, evaluations included | steps "
             "| epochs | held-out 0-alpha | 1-alpha | 2-alpha | 3-alpha | 4-alpha |", "|" + "---|" * 13]
    for path in paths:
        meta = json.loads(path.read_text())["eaglespec"]
        train, last = meta["train"], meta["evals"][-1]
        epochs = last["step"] * train["batch_conversations"] / meta["train_conversations"]
        alphas = " | ".join(f"{a:.3f}" for a in last["alpha"])
        lines.append(f"| {path.stem} | {train['head_type']} | {train['loss']} | {train['unroll']} "
                     f"| {meta['eval_seconds'][-1] / 60:.1f} | {meta['train_seconds'] / 60:.1f} | {last['step']} "
                     f"| {epochs:.2f} | {alphas} |")
    return "\n".join(lines)


def quality_heads(folder: Path) -> list[Path]:
    """The heads of a quality-Nmin/ folder that have their evaluations (NAME.json beside NAME-own.json)."""
    return sorted(p for p in folder.glob("*.json") if (folder / f"{p.stem}-own.json").is_file())


def quality_table(heads: list[Path]) -> str:
    """One row per head of quality-Nmin/: its recipe, held-out n-alpha (eval-head) on the target's
    own answers and on human ones, MT-bench speedup over vanilla and tau per tree, and the vanilla
    speed and CPU of that bench run (heads measured in different sessions may have had different
    machines: each speedup is against vanilla in its own run)."""
    lines = ["| head | data | type | loss | unrolled steps | steps | epochs | own answers: 0..4-alpha "
             "| human answers: 0..4-alpha | MT-bench, EAGLE-1 tree: speedup, tau | MT-bench, auto: speedup, tau "
             "| MT-bench vanilla tok/s (CPU) |",
             "|" + "---|" * 12]

    def read(path: Path) -> dict | None:
        return json.loads(path.read_text()) if path.is_file() else None

    for path in heads:
        meta = json.loads(path.read_text())["eaglespec"]
        train, last = meta["train"], meta["evals"][-1]
        epochs = last["step"] * train["batch_conversations"] / meta["train_conversations"]
        cells = []
        for text in ("own", "human"):
            result = read(path.with_name(f"{path.stem}-{text}.json"))
            cells.append(", ".join(f"{a:.3f}" for a in result["alpha"]) if result else "-")
        bench = read(path.with_name(f"{path.stem}-mt-bench.json")) or {"methods": {}}
        methods = bench["methods"]
        for m in ("eagle:eagle1", "eagle:auto"):
            cells.append(f"{methods[m]['speedup']:.2f}x, {methods[m]['tau']:.2f}" if m in methods else "-")
        cells.append(f"{methods['vanilla']['tokens_per_s']:.1f} ({bench['machine']['cpu_capability']})"
                     if "vanilla" in methods else "-")
        lines.append(f"| {path.stem} | {path.stem.split('-')[0]} | {train['head_type']} | {train['loss']} "
                     f"| {train['unroll']} | {last['step']} | {epochs:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_objectives(paths: list[Path], out: Path) -> None:
    """Held-out 0-alpha and 2-alpha against minutes of training, one line per head."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from eaglespec.files import save_figure

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for path in paths:
        meta = json.loads(path.read_text())["eaglespec"]
        minutes = [s / 60 for s in meta["eval_seconds"]]
        for n, ax in zip((0, 2), axes):
            ax.plot(minutes, [e["alpha"][n] for e in meta["evals"]], marker="o", label=path.stem)
    for n, ax in zip((0, 2), axes):
        ax.set_xlabel("minutes of training (CPU, 2 threads)")
        ax.set_ylabel(f"held-out {n}-alpha")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out)
    plt.close(fig)


def main() -> None:
    parts = []
    heads = sorted((RESULTS / "heads").glob("*.json"))
    if heads:
        header = ("| head | epochs | held-out conversations | 0-alpha | 1-alpha | 2-alpha | 3-alpha | 4-alpha "
                  "| training conversations | training minutes |")
        lines = [header, "|" + "---|" * 10]
        for path in heads:
            meta = json.loads(path.read_text())["eaglespec"]
            for e in meta["evals"]:
                alphas = " | ".join(f"{a:.3f}" for a in e["alpha"])
                # heads trained before these were recorded have none
                size = meta.get("train_conversations", "-")
                minutes = f"{meta['train_seconds'] / 60:.1f}" if "train_seconds" in meta and e is meta["evals"][-1] else "-"
                lines.append(f"| {path.stem} | {e['epoch']} | {meta['train']['eval_limit']} | {alphas} | {size} | {minutes} |")
        parts.append("\n".join(lines))
    for folder in sorted(RESULTS.glob("objectives-*min"), key=lambda p: float(p.name[len("objectives-"):-3])):
        objectives = sorted(folder.glob("*.json"))  # one per head, at the folder's budget
        parts.append(f"**{folder.name}**\n\n" + objectives_table(objectives))
        plot_objectives(objectives, RESULTS / f"{folder.name}-alpha.png")
    for folder in sorted(RESULTS.glob("quality-*min"), key=lambda p: float(p.name[len("quality-"):-3])):
        heads = quality_heads(folder)
        parts.append(f"**{folder.name}**\n\n" + quality_table(heads))
        plot_objectives(heads, RESULTS / f"{folder.name}-alpha.png")
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        head = result["config"]["head"]  # a run folder's head/ under the cache: name the run
        name = head if head == "default" else Path(head).parent.name
        parts.append(f"**{path.stem}** (head: {name})\n\n" + markdown(result))
    if not parts:
        raise SystemExit(f"no results in {RESULTS}: run benchmarks/experiments/ablations.sh first")
    text = "\n\n".join(parts) + "\n"
    (RESULTS / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
