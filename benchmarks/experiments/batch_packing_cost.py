"""What packing several rows into one KV block costs a forward: B rows of L cached tokens, one new
token each, verified in one forward where each token sees only its row (`RowCache`), against the
floor, B new tokens over one row of L (what the forward would cost if attention read only each
row's own keys), and B new tokens over one row of B * L (attention over every key, as packing
scores them today). Best of 15, one forward each, bf16.

    .venv/bin/python benchmarks/experiments/batch_packing_cost.py [--model M] [--context L] [--threads N]

Run it alone: on a 2-core machine a background job skews every timing.
"""

from __future__ import annotations

import argparse
import time

import torch

import eaglespec
from eaglespec.models.row_cache import RowCache


def best_ms(step, repeats: int = 15) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=300, help="cached tokens per row")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, L = eaglespec.load(args.model, head=None).target.model, args.context

    def prefilled(n: int):
        cache = model.new_cache(n + 16)
        model(torch.zeros(1, n, dtype=torch.long), cache, last_logits_only=True)
        return cache

    def new_tokens(cache, B: int, positions=None, mask=None):
        def step():
            model(torch.zeros(1, B, dtype=torch.long), cache, positions, mask)
            cache.keep([])
        return step

    print("| B | packed rows | floor: B tokens over one row of L | B tokens over one row of B * L |")
    print("|---|---|---|---|")
    for B in (1, 2, 4, 8):
        rows = RowCache(model.config, B * L + 16, model.weight_like.dtype)
        for r in range(B):
            rows.add(r, prefilled(L))

        def packed():
            mask = rows.prepare([(r, None) for r in range(B)])
            model(torch.zeros(1, B, dtype=torch.long), rows, torch.full((1, B), L), mask)
            rows.keep([])

        print(f"| {B} | {best_ms(packed):.1f} ms | {best_ms(new_tokens(prefilled(L), B)):.1f} ms | "
              f"{best_ms(new_tokens(prefilled(B * L), B)):.1f} ms |")


if __name__ == "__main__":
    main()
