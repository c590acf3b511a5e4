"""What a reduced draft vocabulary does: the cost of one draft step (head layer + LM head over
the draft vocabulary, bf16, one token over a 512-token draft cache) and the share of the
target's held-out greedy tokens that the vocabulary contains (an upper bound on 0-alpha).

    .venv/bin/python benchmarks/experiments/draft_vocab.py --model qwen2.5-coder-0.5b-instruct \
        --train-features DIR --heldout-features DIR      # writes results/draft_vocab-MODEL.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from common import machine, write_json
from eaglespec.heads.head import EagleHead
from eaglespec.models.load import load_target
from eaglespec.training.features import FeatureSet
from eaglespec.training.trainer import draft_vocabulary


@torch.inference_mode()
def step_ms(head: EagleHead, repeats: int = 50) -> float:
    h = head.config.hidden_size
    cache = head.new_cache(600)
    head(torch.randn(1, 512, h, dtype=torch.bfloat16), torch.zeros(1, 512, dtype=torch.long), cache)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        head.logits(head(torch.randn(1, 1, h, dtype=torch.bfloat16), torch.zeros(1, 1, dtype=torch.long), cache))
        times.append((time.perf_counter() - start) * 1000)
        cache.keep([])
    return statistics.median(times[5:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--train-features", required=True)
    p.add_argument("--heldout-features", required=True)
    p.add_argument("--sizes", default="4096,8192,16384,32768,0", help="0 is the full vocabulary")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(args.model, "bfloat16")
    train, heldout = FeatureSet(Path(args.train_features)), FeatureSet(Path(args.heldout_features))
    greedy = torch.cat([s["target_argmax"][1:][s["loss_mask"][1:].bool()] for s in
                        (heldout[i] for i in range(len(heldout)))]).long()
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        vocab = draft_vocabulary(train, size) if size else None
        head = EagleHead(target.model.config).to(torch.bfloat16).attach(target.model, vocab)
        head.pack_weights()
        inside = torch.zeros(target.model.config.vocab_size, dtype=torch.bool)
        inside[vocab if vocab is not None else slice(None)] = True
        rows.append({"draft_vocab": size or target.model.config.vocab_size, "draft_step_ms": step_ms(head),
                     "heldout_greedy_coverage": float(inside[greedy].float().mean())})
        print(rows[-1])
    out = Path(__file__).resolve().parents[1] / "results" / f"draft_vocab-{args.model}.json"
    write_json({"benchmark": "reduced draft vocabulary", "model": args.model, "machine": machine(),
                "train_tokens": train.tokens(), "heldout_tokens_scored": len(greedy), "rows": rows}, out)


if __name__ == "__main__":
    main()
