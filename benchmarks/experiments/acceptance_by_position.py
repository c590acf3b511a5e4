"""Where a head's drafts miss: 0-alpha (the draft's top-1 against the target's greedy token, true
features) by position in the answer, on the target's own answers to held-out prompts, loops apart
from the rest, and on its greedy answers to fresh prompts (the sky prompt, the README demo's until
2026-12-05, and the first turns of MT-bench), each answer scored alone.

    .venv/bin/python benchmarks/experiments/acceptance_by_position.py MODEL [--head default] [--limit 47]
        [--data data/regenerated/MODEL-heldout] [--fresh 10]
    -> benchmarks/results/acceptance-by-position-MODEL.json (and a table on stdout)

An answer is a loop when fewer than half of its 8-token windows are distinct (a line or phrase
repeated to the end, as greedy decoding of a small model often gives). fp32 target forwards.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import write_json

BUCKETS = (0, 8, 16, 32, 64, 128, 256, 512)  # bucket i: answer positions [BUCKETS[i], BUCKETS[i + 1])
SKY_PROMPT = "Explain in three sentences why the sky is blue."  # the main command's prompt until 2026-12-05


def is_loop(answer: list[int], n: int = 8) -> bool:
    windows = [tuple(answer[i:i + n]) for i in range(len(answer) - n + 1)]
    return bool(windows) and len(set(windows)) < len(windows) / 2


class Tally:
    """0-alpha hits and positions per answer-position bucket."""

    def __init__(self):
        self.hits, self.counts = [0] * len(BUCKETS), [0] * len(BUCKETS)

    def add(self, hit: torch.Tensor, scored: torch.Tensor) -> None:
        """hit, scored [L] over a conversation's positions; positions count from each scored span's start."""
        position = -1
        for h, s in zip(hit.tolist(), scored.tolist()):
            position = position + 1 if s else -1
            if s:
                b = max(i for i, edge in enumerate(BUCKETS) if position >= edge)
                self.hits[b] += h
                self.counts[b] += 1

    def report(self) -> dict:
        total = sum(self.counts)
        return {"alpha0": sum(self.hits) / total if total else None, "tokens": total,
                "by_position": [{"from": edge, "alpha0": h / c if c else None, "tokens": c}
                                for edge, h, c in zip(BUCKETS, self.hits, self.counts)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--head", default="default")
    parser.add_argument("--limit", type=int, default=47, help="held-out own answers")
    parser.add_argument("--data", default=None, help="own answers to held-out prompts (default data/regenerated/MODEL-heldout)")
    parser.add_argument("--fresh", type=int, default=10, help="MT-bench first turns answered fresh")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from eaglespec.bench.datasets import load_items
    from eaglespec.decoding.generate import generate, prompt_ids
    from eaglespec.heads.checkpoint import load_head
    from eaglespec.models.load import load_target
    from eaglespec.training.evaluate import chain_hits, held_out_samples
    from eaglespec.training.features import target_outputs

    root = Path(__file__).resolve().parents[2]
    data = args.data or str(root / "data" / "regenerated" / f"{args.model}-heldout")
    target = load_target(args.model, "float32")
    head = load_head(args.head, target)

    groups = {"own answers, loops": Tally(), "own answers, not loops": Tally(), "fresh answers": Tally()}
    _, conversations, samples = held_out_samples(target, head, args.head, args.limit, data)
    for sample in samples:
        answer = sample["tokens"][sample["loss_mask"].bool()].tolist()
        hit, scored = chain_hits(head, sample, depth=0)[0]
        groups["own answers, loops" if is_loop(answer) else "own answers, not loops"].add(hit, scored)

    fresh = []
    prompts = [SKY_PROMPT, *(item.turns[0] for item in load_items("mt-bench", args.fresh))]
    for prompt in prompts:
        ids = prompt_ids(target, prompt, chat=True)
        out = generate(target, ids, max_new_tokens=128)
        tokens = ids + out.token_ids
        sample = {"tokens": torch.tensor(tokens), "loss_mask": torch.tensor([0] * len(ids) + [1] * len(out.token_ids)),
                  **target_outputs(target, tokens, head.reads)}
        hit, scored = chain_hits(head, sample, depth=0)[0]
        groups["fresh answers"].add(hit, scored)
        one = Tally()
        one.add(hit, scored)
        fresh.append({"prompt": prompt, "tokens": len(out.token_ids), "loop": is_loop(out.token_ids),
                      "alpha0": one.report()["alpha0"], "first_16_alpha0": _first(hit, scored, 16)})

    result = {"model": args.model, "head": args.head, "data": data, "own_answers": len(conversations),
              "groups": {name: tally.report() for name, tally in groups.items()}, "fresh": fresh,
              "command": "benchmarks/experiments/acceptance_by_position.py " + " ".join(sys.argv[1:])}
    out_path = root / "benchmarks" / "results" / f"acceptance-by-position-{args.model}.json"
    write_json(result, out_path)

    print("| answers | tokens | 0-alpha | " + " | ".join(f"{e}-" for e in BUCKETS) + " |")
    print("|---|---|---|" + "---|" * len(BUCKETS))
    for name, r in result["groups"].items():
        cells = [f"{b['alpha0']:.2f} ({b['tokens']})" if b["tokens"] else "-" for b in r["by_position"]]
        print(f"| {name} | {r['tokens']} | {r['alpha0'] or 0:.3f} | " + " | ".join(cells) + " |")
    for f in fresh:
        print(f"{f['alpha0']:.2f} (first 16: {f['first_16_alpha0']:.2f}) {f['tokens']:4d} tokens"
              f"{' loop' if f['loop'] else ''}  {f['prompt'][:70]!r}")
    print(f"-> {out_path}")


def _first(hit: torch.Tensor, scored: torch.Tensor, n: int) -> float:
    picked = hit[scored][:n]
    return float(picked.float().mean()) if len(picked) else 0.0


if __name__ == "__main__":
    main()
