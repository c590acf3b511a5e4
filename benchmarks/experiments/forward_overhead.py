"""Where a one-token forward's time goes: the weights' bytes, or everything else (Python, operator
dispatch, small ops, allocations).

    .venv/bin/python benchmarks/experiments/forward_overhead.py           # writes benchmarks/results/forward_overhead.json
    .venv/bin/python benchmarks/experiments/forward_overhead.py --eager   # the same without our fused kernels

For each model and weight format it times a one-token forward over a 256-token cache (median of
many), and the same forward through a *skeleton*: the model with the same layers, heads and code
path but every matrix shrunk to a few KiB (hidden size 64, head size 32, vocabulary 256). The
skeleton reads next to no weights, so its time is the forward's overhead, and overhead / forward
is the share to remove. The weight bytes over the remaining time give the bandwidth the linears
reach. Formats (`--formats`): bf16 and fp32 (dense), int8, int4 (bf16 activations), int4-fp32. It also counts the operators one forward dispatches (torch's profiler). `--eager` runs the
layers in Python with their small operations as torch operators, instead of our fused kernels and
the C++ layer stack (how every forward ran before them), for the before/after comparison.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from common import FORMATS, formats_option, machine, write_json
from eaglespec.models import kernels
from eaglespec.models.decoder import Decoder, Stack
from eaglespec.models.load import load_target
from eaglespec.models.quantize import quantize

CONTEXT = 256


def skeleton(model: Decoder, dtype: torch.dtype, weights: str) -> Decoder:
    """The same architecture with tiny matrices, in the same dtype and weight format."""
    c = replace(model.config, hidden_size=64, intermediate_size=64, head_dim=32, vocab_size=256)
    tiny = Decoder(c).to(dtype if weights == "dense" else torch.float32).eval().requires_grad_(False)
    if weights != "dense":
        quantize(tiny, weights, dtype)
    tiny.pack_weights()
    return tiny


@torch.inference_mode()
def one_token_ms(model: Decoder, repeats: int) -> float:
    """Median milliseconds of a one-token forward after CONTEXT cached tokens."""
    cache = model.new_cache(CONTEXT + 1)
    model(torch.zeros(1, CONTEXT, dtype=torch.long), cache, last_logits_only=True)
    token = torch.zeros(1, 1, dtype=torch.long)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(token, cache)
        times.append(time.perf_counter() - start)
        cache.keep([])
    return 1000 * statistics.median(times)


@torch.inference_mode()
def operators(model: Decoder) -> int:
    """Operators one one-token forward dispatches (top-level calls seen by the profiler)."""
    cache = model.new_cache(CONTEXT + 1)
    model(torch.zeros(1, CONTEXT, dtype=torch.long), cache, last_logits_only=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(torch.zeros(1, 1, dtype=torch.long), cache)
    return sum(1 for e in prof.events() if e.cpu_parent is None)


def weight_bytes(model: Decoder) -> int:
    """Bytes a one-token forward reads from its weights: every linear, and one embedding row."""
    seen = {}
    for name, t in model.state_dict().items():
        if name != "embed.weight" or model.config.tie_word_embeddings:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m-instruct")
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--repeats", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="default: results/forward_overhead.json (-eager.json with --eager)")
    p.add_argument("--eager", action="store_true", help="Python layers, torch operators for norms, rotary and SiLU")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.eager:  # each fused kernel declines and the C++ layer stack is off: the layers' torch path
        kernels.rms_norm = kernels.gated = kernels.rope_store = lambda *a: None
        Stack.layer_stack = lambda self: None
    report = {"benchmark": "one-token forward over a 256-token cache: whole vs overhead (a skeleton of the "
                           "same code path with tiny matrices)",
              "machine": machine(), "context": CONTEXT, "repeats": args.repeats,
              "layers": "Python layers, torch operators" if args.eager else "C++ layer stack, fused kernels", "models": {}}
    for name in args.models.split(","):
        rows = {}
        for label in formats_option(args.formats):
            dtype, weights = FORMATS[label]
            target = load_target(name, dtype, weights=weights)
            tiny = skeleton(target.model, target.model.weight_like.dtype, weights)
            one_token_ms(target.model, 5), one_token_ms(tiny, 5)  # warm-up
            whole, overhead = one_token_ms(target.model, args.repeats), one_token_ms(tiny, args.repeats)
            nbytes = weight_bytes(target.model)
            rows[label] = {"forward_ms": round(whole, 2), "overhead_ms": round(overhead, 2),
                           "overhead_share": round(overhead / whole, 3), "operators": operators(target.model),
                           "weight_mib": round(nbytes / 2**20, 1),
                           "weights_gb_per_s": round(nbytes / 1e9 / max(whole - overhead, 1e-6) * 1000, 1)}
            print(name, label, rows[label], flush=True)
        report["models"][name] = rows
    write_json(report, args.out or Path(__file__).resolve().parents[1] / "results" / f"forward_overhead{'-eager' if args.eager else ''}.json")
    print(markdown(report))


def markdown(report: dict) -> str:
    lines = ["| model | weights | forward ms | overhead ms | overhead share | operators | weight MiB | GB/s on weights |",
             "|---|---|---|---|---|---|---|---|"]
    for name, rows in report["models"].items():
        for label, r in rows.items():
            lines.append(f"| {name} | {label} | {r['forward_ms']} | {r['overhead_ms']} | {100 * r['overhead_share']:.0f}% "
                         f"| {r['operators']} | {r['weight_mib']} | {r['weights_gb_per_s']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
