"""The README's ablation tables, from what benchmarks/ablations.sh wrote: held-out n-alpha per
epoch of each ablation head (same data and budget), and the bench runs of the tree and data
ablations.

    .venv/bin/python benchmarks/ablation_report.py   # writes benchmarks/results/ablations/summary.md
"""

from __future__ import annotations

import json
from pathlib import Path

from eaglespec.bench.run import markdown

RESULTS = Path(__file__).parent / "results" / "ablations"


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
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        head = result["config"]["head"]  # a run folder's head/ under the cache: name the run
        name = head if head == "default" else Path(head).parent.name
        parts.append(f"**{path.stem}** (head: {name})\n\n" + markdown(result))
    if not parts:
        raise SystemExit(f"no results in {RESULTS}: run benchmarks/ablations.sh first")
    text = "\n\n".join(parts) + "\n"
    (RESULTS / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
