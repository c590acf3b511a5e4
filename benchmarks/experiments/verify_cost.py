"""Verification cost curves: time of one target forward of 1..64 new tokens over a 512-token cache,
per weight format (ours: bf16, fp32, int8, int4 with bf16 or fp32 activations), and llama.cpp's forward over the same numbers of
tokens at the same depth on the same GGUF weights (`llama-bench -p N -n 0 -d 512`). They say how
many draft tokens one verification pass can afford on this machine, in each format; `auto` trees
measure the curve of the format they run.

    .venv/bin/python benchmarks/experiments/verify_cost.py      # writes results/verify_cost.json and .png
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from common import FORMATS, PEER, formats_option, machine, write_json  # noqa: E402
from eaglespec.models.llamacpp import peer_gguf, programs  # noqa: E402
from eaglespec.files import save_figure  # noqa: E402
from eaglespec.models.load import load_target  # noqa: E402



@torch.inference_mode()
def curve(model, context: int, max_tokens: int, repeats: int) -> list[float]:
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    cache = model.new_cache(context + max_tokens)
    model(torch.randint(0, vocab, (1, context), generator=g), cache, last_logits_only=True)
    ms = []
    for n in tqdm(range(1, max_tokens + 1), leave=False):
        tokens = torch.randint(0, vocab, (1, n), generator=g)
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            model(tokens, cache)
            times.append((time.perf_counter() - start) * 1000)
            cache.keep([])  # rewind to the 512-token context
        ms.append(statistics.median(times[1:]))
    return ms


def llama_cpp_curve(gguf: Path, context: int, sizes: list[int], repeats: int, threads: int) -> list[float]:
    """llama.cpp's ms per forward of n tokens at depth `context` (llama-bench's prompt tests)."""
    command = [str(programs() / "llama-bench"), "-m", str(gguf), "-p", ",".join(map(str, sizes)), "-n", "0",
               "-d", str(context), "-t", str(threads), "-r", str(repeats), "-o", "json"]
    rows = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    by_size = {r["n_prompt"]: r["avg_ns"] / 1e6 for r in rows}
    return [by_size[n] for n in sizes]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--formats", default=",".join(FORMATS), help="Ours: " + ", ".join(FORMATS))
    p.add_argument("--no-llama-cpp", action="store_true", help="Leave out llama.cpp's curves.")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "verify_cost.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    formats = formats_option(args.formats)
    if not args.no_llama_cpp:
        programs()  # built, or the command that builds it
    report = {"benchmark": "one forward of n new tokens over a cache", "machine": machine(),
              "context": args.context, "repeats": args.repeats, "models": {}}
    sizes = list(range(1, args.max_tokens + 1))
    peer_sizes = [n for n in (1, 2, 4, 8, 16, 24, 32, 48, 64) if n <= args.max_tokens]
    for name in args.models.split(","):
        curves = {}
        for label in formats:
            dtype, weights = FORMATS[label]
            ms = curve(load_target(name, dtype, weights=weights).model, args.context, args.max_tokens, args.repeats)
            curves[label] = {"new_tokens": sizes, "ms": ms, "relative_to_one": [m / ms[0] for m in ms]}
        if not args.no_llama_cpp:
            for label, weights in PEER.items():
                try:
                    ms = llama_cpp_curve(peer_gguf(name, weights, "bfloat16"), args.context, peer_sizes,
                                         args.repeats, args.threads)
                except subprocess.CalledProcessError as err:  # a peer that crashes is reported, not fatal
                    report.setdefault("peer_failures", {})[f"{name} {label}"] = str(err)
                    print(f"{name} {label}: {err}")
                    continue
                curves[label] = {"new_tokens": peer_sizes, "ms": ms, "relative_to_one": [m / ms[0] for m in ms]}
        report["models"][name] = curves
        for label, c in curves.items():
            print(f"{name} {label}: " + ", ".join(f"{n}: {m:.1f} ms" for n, m in zip(c["new_tokens"], c["ms"])
                                                   if n in (1, 4, 8, 16, 32, 64)))
    write_json(report, args.out)
    fig, axes = plt.subplots(1, len(report["models"]), figsize=(6.5 * len(report["models"]), 4.5), squeeze=False)
    for ax, (name, curves) in zip(axes[0], report["models"].items()):
        for label, c in curves.items():
            ax.plot(c["new_tokens"], c["ms"], marker=".", linestyle="--" if "llama" in label else "-", label=label)
        ax.set_xlabel(f"new tokens in one forward (over a {args.context}-token cache)")
        ax.set_ylabel("ms per forward")
        ax.set_title(f"{name}, {args.threads} threads")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, args.out.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()
