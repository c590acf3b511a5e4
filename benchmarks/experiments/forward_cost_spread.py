"""How much the target's measured forward-cost curve (`Decoder.forward_costs`, what `auto`, sized
`pld`, `hybrid` and `medusa` size drafts by) moves between processes: the curve measured in N fresh
processes, one after another, each as a generation measures it (once, on its first sized method).

    .venv/bin/python benchmarks/experiments/forward_cost_spread.py --runs 5 \
        --out benchmarks/results/forward-cost-spread.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from common import machine, write_json

SIZES = (1, 2, 4, 8, 16, 32, 65)
MEASURE = """
import json, sys, torch
torch.set_num_threads(2)
from eaglespec.models.load import load_target
table = load_target(sys.argv[1], "bfloat16").model.forward_costs().table
print(json.dumps([table[n] for n in json.loads(sys.argv[2])]))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    curves = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", MEASURE, args.model, json.dumps(SIZES)], check=True,
                             capture_output=True, text=True).stdout
        curves.append(json.loads(out.strip().splitlines()[-1]))
        print(" ".join(f"{n}: {1000 * s:.1f} ms" for n, s in zip(SIZES, curves[-1])), flush=True)
    ratios = [c[SIZES.index(8)] / c[0] for c in curves]
    result = {"model": args.model, "sizes": SIZES, "seconds": curves,
              "ratio_8_to_1": {"min": min(ratios), "max": max(ratios)}, "machine": machine()}
    write_json(result, Path(args.out))
    print(f"a forward of 8 tokens over one of 1: {min(ratios):.2f}x to {max(ratios):.2f}x; wrote {args.out}")


if __name__ == "__main__":
    main()
