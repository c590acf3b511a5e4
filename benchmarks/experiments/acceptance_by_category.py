"""Where a head's drafts fail: its 0-alpha in the engine (a 1-token chain, so every round tests one
draft token after the target's own tokens) on each MT-bench category's first turns, greedy, fp32.

    .venv/bin/python benchmarks/experiments/acceptance_by_category.py smollm2-135m-instruct --out benchmarks/results/acceptance-by-category-smollm2.json

Acceptance counts do not depend on the machine's speed; the run takes about 4 minutes for SmolLM2.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from tqdm import tqdm

from common import machine, write_json  # noqa: E402
import eaglespec  # noqa: E402
from eaglespec.decoding.generate import chat_ids  # noqa: E402
from eaglespec.decoding.loop import DecodeStats, decode  # noqa: E402
from eaglespec.decoding.sampling import SamplingParams  # noqa: E402
from eaglespec.models.fetch import fetch_dataset  # noqa: E402
from eaglespec.models.registry import DATASETS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--head", default="default")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    rows = [json.loads(line) for line in fetch_dataset(DATASETS["mt-bench"]).read_text().splitlines() if line.strip()]
    model = eaglespec.load(args.model, head=args.head, dtype="float32")
    target, params = model.target, SamplingParams()
    proposer = model.method("eagle", "chain:1").bind(target, params)
    tried, accepted = defaultdict(int), defaultdict(int)
    for row in tqdm(rows, desc="first turns"):
        stats = DecodeStats()
        ids = chat_ids(target, [{"role": "user", "content": row["turns"][0]}])
        for _ in decode(target.model, ids, params, args.max_new_tokens, target.eos_token_ids, stats, proposer):
            pass
        tried[row["category"]] += stats.tried[0] if stats.tried else 0
        accepted[row["category"]] += stats.accepted[0] if stats.accepted else 0
    table = {c: {"zero_alpha": round(accepted[c] / tried[c], 4), "draft_tokens_tested": tried[c]}
             for c in sorted(tried, key=lambda c: accepted[c] / tried[c])}
    total = {"zero_alpha": round(sum(accepted.values()) / sum(tried.values()), 4),
             "draft_tokens_tested": sum(tried.values())}
    write_json({"model": args.model, "head": args.head, "dataset": "mt-bench (first turns)", "dtype": "float32",
                "max_new_tokens": args.max_new_tokens, "draft": "eagle:chain:1", "categories": table, "all": total,
                "machine": machine()}, args.out)
    for c, v in [*table.items(), ("all", total)]:
        print(f"| {c} | {v['zero_alpha']:.3f} | {v['draft_tokens_tested']} |")


if __name__ == "__main__":
    main()
