"""DistillSpec against the plain draft model: classic speculative sampling (`sps`) on Qwen2.5-Coder-1.5B
with the bundled 0.5B as it is and distilled toward the 1.5B (`eaglespec distill`), on HumanEval and
MT-bench, greedy, each draft's run beside vanilla in the same process.

    .venv/bin/python benchmarks/experiments/distillspec.py ~/.cache/eaglespec/distill/qwen-0.5b-to-1.5b-lora16 \\
        --out benchmarks/results/ablations/distillspec-qwen-1.5b.json
    (or: eaglespec suite benchmarks/suites/distillspec.toml --out benchmarks/results/distillspec-MACHINE)

Stop other work while it runs: on a 2-core machine a background job skews every timing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import machine, write_json  # noqa: E402
from eaglespec.bench.run import Bench, BenchConfig  # noqa: E402

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the `eaglespec distill --out` folder (its draft in RUN/draft)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--datasets", default="humaneval,mt-bench")
    parser.add_argument("--methods", default="vanilla,sps:4")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    args.run = args.run.expanduser()
    if not (args.run / "log.json").is_file():
        raise SystemExit(f"no distillation run at {args.run}: run `eaglespec distill ... --out {args.run}` first "
                         "(docs/training.md#distilled-draft-models-distillspec)")
    log = json.loads((args.run / "log.json").read_text())
    results = {}
    for dataset in args.datasets.split(","):
        for label, draft in (("plain draft", DRAFT), ("distilled draft", str(args.run / "draft"))):
            config = BenchConfig(model=TARGET, dataset=dataset, methods=tuple(args.methods.split(",")), head=None,
                                 medusa_head=None, draft_model=draft, limit=args.limit,
                                 max_new_tokens=args.max_new_tokens)
            summary = Bench(config).run()["methods"]
            results.setdefault(dataset, {})[label] = {
                spec: {k: s[k] for k in ("tau", "speedup", "tokens_per_s", "same_tokens_as_vanilla") if k in s}
                for spec, s in summary.items()}
            print(dataset, label, {spec: (round(s["tau"], 3), round(s["speedup"], 3)) for spec, s in summary.items()})
    write_json({"target": TARGET, "draft": DRAFT, "distilled": str(args.run / "draft"), "limit": args.limit,
                "max_new_tokens": args.max_new_tokens, "temperature": 0.0, "dtype": "bfloat16",
                "distillation": {"config": log["config"], "steps": log["step"], "work_minutes": log["seconds"] / 60,
                                 "heldout": log["scores"]},
                "results": results, "machine": machine()}, args.out)


if __name__ == "__main__":
    main()
