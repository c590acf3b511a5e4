"""How often a draft model's greedy token equals the target's along the target's own answers:
the first N HumanEval answers of the flagship bench run (vanilla, greedy), scored in one
forward by the 1.5B target and by the 0.5B draft model (bf16, 2 threads).

    .venv/bin/python benchmarks/experiments/draft_agreement.py   # writes benchmarks/results/draft_agreement.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from common import machine, write_json

from eaglespec.bench.datasets import load_items
from eaglespec.decoding.generate import chat_ids
from eaglespec.models.load import load_target

RESULTS = Path(__file__).resolve().parents[1] / "results"


@torch.inference_mode()
def agreement(target, ids: list[int], answer: list[int]) -> float:
    """Share of the answer's tokens that are the model's argmax after the tokens before them."""
    sequence = torch.tensor([ids + answer])
    logits, _ = target.model(sequence, target.model.new_cache(sequence.shape[1]))
    predicted = logits[0, len(ids) - 1:-1].argmax(-1).tolist()
    return sum(p == a for p, a in zip(predicted, answer)) / len(answer)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=RESULTS / "bench" / "qwen2.5-coder-1.5b-instruct-humaneval-t0.json")
    p.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--limit", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(2)
    run = json.loads(args.run.read_text())
    target = load_target(run["config"]["model"], "bfloat16")
    draft = load_target(args.draft_model, "bfloat16")
    rows = []
    for item, answer in zip(load_items(run["config"]["dataset"], args.limit), run["methods"]["vanilla"]["runs"]):
        ids = chat_ids(target, [{"role": "user", "content": item.turns[0]}])
        rows.append({"item": item.id, "tokens": len(answer["token_ids"]),
                     "target": agreement(target, ids, answer["token_ids"]),
                     "draft": agreement(draft, ids, answer["token_ids"])})
        print(rows[-1], flush=True)
    write_json({"benchmark": "greedy agreement with the target's own answers", "run": str(args.run.name),
                "draft_model": args.draft_model, "machine": machine(), "answers": rows}, RESULTS / "draft_agreement.json")


if __name__ == "__main__":
    main()
