"""Vanilla (one token per forward) decoding speed per weight format: eaglespec against llama.cpp on
the same GGUF weights and against transformers' `generate`, the same prompts and the same number of
new tokens (EOS ignored), every configuration interleaved prompt by prompt.

    bash scripts/setup_llamacpp.sh                  # once: llama.cpp's programs (about 15 minutes)
    .venv/bin/python benchmarks/experiments/vanilla_speed.py    # writes benchmarks/results/vanilla_speed.json

Configurations per model (`--formats`, default all): ours in bf16 and fp32 (dense), int8 and int4
(weight-only quantized, bf16 activations; int4-fp32 with fp32 activations); llama.cpp on the same
weights: BF16 and Q8_0 copies of the bundled GGUF and the bundled GGUF itself (4-bit); transformers
in bf16. Each is timed over the whole request (prefill included) and
reported as the median tokens/s over prompts and repeats, with the resident weight bytes (ours:
the tensors' storage; llama.cpp: the server's peak resident set).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM

from common import FORMATS, PEER, formats_option, machine, write_json
from eaglespec.models.llamacpp import LlamaServer, peer_gguf
from eaglespec.decoding.generate import chat_ids, generate
from eaglespec.models.decoder import Linear
from eaglespec.models.load import load_target

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash map works and when to use one.",
    "Write a Python function that merges two sorted lists, with comments.",
    "What are the main causes of the French Revolution?",
    "Give me a recipe for a vegetarian lasagna, step by step.",
]


def time_ours(target, ids, n):
    start = time.perf_counter()
    out = generate(target, ids, max_new_tokens=n, ignore_eos=True)
    seconds = time.perf_counter() - start
    assert out.new_tokens == n
    return n / seconds


def time_hf(model, ids, n):
    x = torch.tensor([ids])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    seconds = time.perf_counter() - start
    assert out.shape[1] - len(ids) == n
    return n / seconds


def time_peer(server, ids, n):
    out = server.complete(ids, n, 0.0, 0, ignore_eos=True)
    assert len(out["token_ids"]) == n
    return n / out["seconds"]


def weight_mib(target) -> float:
    """Bytes held by the model's tensors and their packed copies (shared storage counted once)."""
    tensors = list(target.model.state_dict().values())
    tensors += [m.packed[1] for m in target.model.modules() if isinstance(m, Linear) and m.packed is not None]
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values()) / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--formats", default=",".join(FORMATS),
                   help="Ours (llama.cpp runs the same weights): " + ", ".join(FORMATS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "vanilla_speed.json")
    args = p.parse_args()
    formats = formats_option(args.formats)
    peers = {label: weights for label, weights in PEER.items() if any(FORMATS[f][1] == weights for f in formats)}
    torch.set_num_threads(args.threads)
    report = {"benchmark": "vanilla decoding per weight format: eaglespec, llama.cpp (same GGUF), transformers",
              "machine": machine(), "new_tokens": args.new_tokens, "prompts": len(PROMPTS),
              "repeats": args.repeats, "models": {}}
    for name in args.models.split(","):
        runners, memory, servers = {}, {}, {}
        for label in formats:
            dtype, weights = FORMATS[label]
            target = load_target(name, dtype, weights=weights)
            runners[f"eaglespec {label}"] = lambda ids, n, t=target: time_ours(t, ids, n)
            memory[f"eaglespec {label}"] = weight_mib(target)
        hf = AutoModelForCausalLM.from_pretrained(str(target.folder), dtype=torch.bfloat16).eval()
        runners["transformers bf16"] = lambda ids, n: time_hf(hf, ids, n)
        for label, weights in peers.items():
            servers[label] = LlamaServer("llama.cpp", peer_gguf(name, weights, "bfloat16"), args.threads)
            runners[label] = lambda ids, n, s=servers[label]: time_peer(s, ids, n)
        all_ids = [chat_ids(target, [{"role": "user", "content": prompt}], paragraphs=True) for prompt in PROMPTS]
        for run in runners.values():  # warm-up
            run(all_ids[0], 8)
        speeds = {k: [] for k in runners}
        jobs = [(r, i) for r in range(args.repeats) for i in range(len(all_ids))]
        for j, (r, i) in enumerate(tqdm(jobs, desc=name)):
            order = list(runners)
            for key in order[j % len(order):] + order[: j % len(order)]:
                speeds[key].append(runners[key](all_ids[i], args.new_tokens))
        for label, server in servers.items():
            memory[label] = server.peak_mb()
            server.stop()
        report["models"][name] = {
            "tokens_per_s": {k: statistics.median(v) for k, v in speeds.items()},
            "memory_mib": memory,
            "runs": speeds,
        }
    write_json(report, args.out)
    print(markdown(report))


def markdown(report: dict) -> str:
    lines = ["| model | configuration | tokens/s (median) | vs llama.cpp on the same weights | MiB |",
             "|---|---|---|---|---|"]
    same = {f"eaglespec {label}": peer for label, (_, weights) in FORMATS.items()  # fp32: no such copy
            for peer, w in PEER.items() if w == weights and label != "fp32"}
    for name, r in report["models"].items():
        t = r["tokens_per_s"]
        for label, speed in t.items():
            peer = same.get(label)
            ratio = f"{speed / t[peer]:.2f}x" if peer in t else "-"
            mib = r["memory_mib"].get(label)
            lines.append(f"| {name} | {label} | {speed:.1f} | {ratio} | {'-' if mib is None else f'{mib:.0f}'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
