"""Does weighting the early positions of answers more help what a short benchmark drafts? (issue 55)
Two heads continue the same head on the same features for the same training budget, one with
every position alike and one with each answer's first --early-tokens positions weighted
--weight times (`eaglespec train --early-weight`). Both are scored by `eval-head` (fp32) on the
target's own held-out answers, over their first 128 tokens and whole, and on human answers.

    .venv/bin/python benchmarks/experiments/early_weight.py gemma-3-270m \\
        --features ~/.cache/eaglespec/program/gemma-3-270m/stretch-2/train \\
        --heldout ~/.cache/eaglespec/program/gemma-3-270m/heldout \\
        --init ~/.cache/eaglespec/program/gemma-3-270m/stretch-1/run/head --minutes 12 --weight 3 \\
        --out benchmarks/results/ablations/early-weight-gemma-3-270m.json

The runs go to ~/.cache/eaglespec/ablations/early-weight/ (resumable: run again after an interruption).
Stop other work while it runs: the training budget is CPU time, but a busy CPU slows the evaluations.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from common import machine, write_json

ROOT = Path(__file__).resolve().parents[2]
E = str(ROOT / ".venv" / "bin" / "eaglespec")
CACHE = Path(os.environ.get("EAGLESPEC_CACHE", Path.home() / ".cache" / "eaglespec")) / "ablations" / "early-weight"
TRAIN = ["--loss", "feature:1,ce:0.1", "--unroll", "3", "--lr", "3e-4", "--warmup-steps", "10", "--batch", "8",
         "--epochs", "100", "--checkpoint-every", "10", "--eval-limit", "20", "--threads", "2"]


def evaluate(model: str, head: Path, data: str, answer_tokens: int | None) -> dict:
    command = [E, "eval-head", "--model", model, "--head", str(head), "--limit", "50", "--threads", "2",
               "--dtype", "float32", "--json", "--data", data]
    if answer_tokens:
        command += ["--answer-tokens", str(answer_tokens)]
    print("+ " + " ".join(command), flush=True)
    out = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--features", required=True, help="training features (eaglespec extract)")
    parser.add_argument("--heldout", required=True, help="held-out features, scored each epoch")
    parser.add_argument("--init", required=True, help="the head both runs continue")
    parser.add_argument("--minutes", type=float, default=12, help="each run's training budget")
    parser.add_argument("--weight", type=float, default=3.0)
    parser.add_argument("--early-tokens", type=int, default=128)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    own = str(ROOT / "data" / "regenerated" / f"{args.model}-heldout")
    runs = {}
    for name, weight in (("every position alike", 1.0), (f"first {args.early_tokens} x{args.weight:g}", args.weight)):
        folder = CACHE / args.model / f"w{weight:g}-t{args.early_tokens}-{args.minutes:g}min"
        command = [E, "train", "--model", args.model, "--train-features", args.features, "--heldout-features",
                   args.heldout, "--init", args.init, "--out", str(folder), "--budget-minutes", f"{args.minutes:g}",
                   "--early-weight", f"{weight:g}", "--early-tokens", str(args.early_tokens), *TRAIN]
        print("+ " + " ".join(command), flush=True)
        subprocess.run(command, check=True, cwd=ROOT)
        head = folder / "head"
        runs[name] = {"early_weight": weight, "command": " ".join(command[1:]),
                      "own_first128": evaluate(args.model, head, own, 128)["alpha"],
                      "own": evaluate(args.model, head, own, None)["alpha"],
                      "human": evaluate(args.model, head, "sharegpt", None)["alpha"]}
        print(name, runs[name], flush=True)
    write_json({"model": args.model, "features": args.features, "init": args.init, "minutes": args.minutes,
                "early_tokens": args.early_tokens, "runs": runs, "machine": machine()}, args.out)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
