"""The verification cost of a mixture of experts (the paper's Table 3: Mixtral reaches tau 3.25 but
only 1.50x): one forward of n tokens over one of 1 token, for a random-weight MoE sized for a CPU
(8 experts, the top 2 per token) and a dense model with the same active parameters per token
(one MLP as wide as two experts), both in bf16 on our kernels, each curve measured the way `auto`
measures its target's (`Decoder.forward_costs`: best of 3, 256 cached tokens). One token reads 2 of
8 experts per layer; n tokens read the union of theirs, so the MoE's curve climbs where the dense
one stays flat. `auto` sizes its trees from whatever curve its target measures, the MoE's included.

    .venv/bin/python benchmarks/experiments/moe_verify_cost.py --out benchmarks/results/moe-verify-cost.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import machine, write_json

from eaglespec.models.config import ModelConfig
from eaglespec.models.decoder import Decoder
from eaglespec.models.families.moe import MoE

SIZES = (1, 2, 4, 8, 16, 32, 65)
LAYERS, HIDDEN, EXPERT, EXPERTS, TOP_K = 8, 1024, 2816, 8, 2


def model(moe: bool) -> Decoder:
    config = ModelConfig(family="qwen3_moe" if moe else "qwen3", vocab_size=32000, hidden_size=HIDDEN,
                         intermediate_size=TOP_K * EXPERT, num_layers=LAYERS, num_heads=16, num_kv_heads=4,
                         head_dim=64, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=512,
                         tie_word_embeddings=True, qkv_bias=False, qk_norm=True,
                         moe=MoE(EXPERTS, TOP_K, EXPERT, normalize=True, sparse=(True,) * LAYERS) if moe else None)
    torch.manual_seed(0)
    with torch.no_grad():
        decoder = Decoder(config)
        for p in decoder.parameters():
            p.normal_(std=0.02)
    decoder = decoder.to(torch.bfloat16).eval().requires_grad_(False)
    decoder.pack_weights()
    return decoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    result = {"machine": machine(), "sizes": list(SIZES),
              "shape": {"layers": LAYERS, "hidden": HIDDEN, "experts": EXPERTS, "top_k": TOP_K, "expert_intermediate": EXPERT}}
    for name, moe in (("dense", False), ("moe", True)):
        decoder = model(moe)
        total = sum(p.numel() for p in decoder.parameters())
        table = decoder.forward_costs().table
        result[name] = {"parameters": total, "seconds": [table[n] for n in SIZES],
                        "over_one_token": [round(table[n] / table[1], 3) for n in SIZES]}
        print(name, f"{total / 1e6:.0f}M parameters:", " ".join(f"{n}: {1000 * table[n]:.1f} ms ({table[n] / table[1]:.2f}x)" for n in SIZES),
              flush=True)
        del decoder
    write_json(result, Path(args.out))


if __name__ == "__main__":
    main()
