"""Verification cost curve: time of one target forward of 1..64 new tokens over a 512-token cache
(bf16). It says how many draft tokens one verification pass can afford on this machine.

    .venv/bin/python benchmarks/verify_cost.py      # writes results/verify_cost.json and .png
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from common import machine, write_json  # noqa: E402
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "verify_cost.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    report = {"benchmark": "one forward of n new tokens over a cache", "machine": machine(),
              "dtype": "bfloat16", "context": args.context, "repeats": args.repeats, "models": {}}
    for name in args.models.split(","):
        ms = curve(load_target(name, "bfloat16").model, args.context, args.max_tokens, args.repeats)
        report["models"][name] = {"new_tokens": list(range(1, args.max_tokens + 1)), "ms": ms,
                                  "relative_to_one": [m / ms[0] for m in ms]}
        print(f"{name}: " + ", ".join(f"{n}: {ms[n - 1]:.1f} ms" for n in (1, 4, 8, 16, 32, 64)
                                      if n <= args.max_tokens))
    write_json(report, args.out)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in report["models"].items():
        ax.plot(r["new_tokens"], r["ms"], marker=".", label=name)
    ax.set_xlabel(f"new tokens in one forward (over a {args.context}-token cache)")
    ax.set_ylabel("ms per forward")
    ax.set_title(f"Verification cost, bf16, {args.threads} threads")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = args.out.with_suffix(".png")
    fig.savefig(png.with_suffix(".tmp.png"), dpi=120)
    png.with_suffix(".tmp.png").replace(png)


if __name__ == "__main__":
    main()
