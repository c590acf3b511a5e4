"""Plots of `eaglespec bench` results: speedup per method (one group of bars per result, e.g.
per dataset) and the distribution of tau over turns."""

from __future__ import annotations

from pathlib import Path

from eaglespec.files import save_figure
from eaglespec.optional import pyplot


def model_label(config: dict) -> str:
    """The run's model, with its head where it is not the shipped one (runs that compare heads)."""
    head = config.get("head")
    return config["model"] if head in (None, "default") else f"{config['model']} (head {'/'.join(Path(head).parts[-2:])})"


def label(result: dict) -> str:
    c = result["config"]
    return f"{model_label(c)} / {c['dataset']} / T={c['temperature']:g}"


def plot_speedups(results: list[dict], path: Path) -> None:
    """Median speedup over vanilla per method, bars grouped by result, whiskers at the quartiles."""
    import statistics

    plt = pyplot()
    methods = list(dict.fromkeys(m for r in results for m in r["methods"] if m != "vanilla"))
    width = 0.8 / len(results)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(methods) * max(1, len(results) / 2)), 4.2))
    for k, result in enumerate(results):
        vanilla = result["methods"]["vanilla"]["runs"]
        xs, medians, low, high = [], [], [], []
        for i, m in enumerate(methods):
            if m not in result["methods"]:
                continue
            ratios = sorted(r["tokens_per_s"] / v["tokens_per_s"]
                            for r, v in zip(result["methods"][m]["runs"], vanilla))
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
            xs.append(i + (k - (len(results) - 1) / 2) * width)
            medians.append(result["methods"][m]["speedup"])
            low.append(max(medians[-1] - q[0], 0))
            high.append(max(q[2] - medians[-1], 0))
        ax.bar(xs, medians, width, yerr=[low, high], capsize=3, label=label(result))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
    ax.set_ylabel("speedup over vanilla (median, quartiles)")
    ax.legend(fontsize=8)
    ax.set_title("tokens/s relative to vanilla decoding, per turn")
    save_figure(fig, path)
    plt.close(fig)


def plot_tau(results: list[dict], path: Path) -> None:
    """Box plots of tau (tokens per target forward) over turns, per method that reports it."""
    plt = pyplot()
    series, names = [], []
    for result in results:
        prefix = f"{label(result)}\n" if len(results) > 1 else ""
        for m, s in result["methods"].items():
            if m in ("vanilla", "hf") or s["tau"] is None:
                continue
            series.append([r["tau"] for r in s["runs"]])
            names.append(prefix + m)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(names)), 4.2))
    if series:
        ax.boxplot(series)
        ax.set_xticks(range(1, len(names) + 1), names, rotation=30, ha="right", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("tau: tokens per target forward")
    ax.set_title("tau over turns")
    save_figure(fig, path)
    plt.close(fig)


def plot_sources(results: list[dict], path: Path) -> None:
    """Where each token of a multi-source method (`hybrid`) came from: its share of the output
    accepted from each draft source, and the target's own tokens (one per round), stacked, one bar
    per result and method."""
    plt = pyplot()
    bars = [(f"{label(r)}\n{m}", s["accepted_by_source"], s["new_tokens"])
            for r in results for m, s in r["methods"].items() if "accepted_by_source" in s]
    sources = list(dict.fromkeys(k for _, by, _ in bars for k in by))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 * len(bars)), 4.2))
    bottom = [0.0] * len(bars)
    for name in [*sources, "target"]:
        shares = [(total - sum(by.values()) if name == "target" else by.get(name, 0)) / total
                  for _, by, total in bars]
        ax.bar(range(len(bars)), shares, bottom=bottom, label=name)
        bottom = [b + s for b, s in zip(bottom, shares)]
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("share of output tokens")
    ax.legend(fontsize=8)
    ax.set_title("where the tokens came from: accepted drafts by source, and the target's own")
    save_figure(fig, path)
    plt.close(fig)
