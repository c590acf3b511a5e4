"""Mixtral: Mistral's attention with eight experts in every layer, the top two of a softmax
renormalized. Its checkpoints name the router `block_sparse_moe.gate` and an expert's gate, down
and up projections `w1`, `w2`, `w3`: `prepare` gives them the Qwen-MoE names the loader reads."""

import re
from typing import Any

from eaglespec.models.families.family import Family
from eaglespec.models.families.moe import MoE
from eaglespec.models.families.registry import register

PROJECTIONS = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}


@register
class Mixtral(Family):
    model_type = "mixtral"

    @staticmethod
    def layer_config(hf: Any) -> dict:
        return Family.layer_config(hf) | {"moe": MoE(
            experts=hf.num_local_experts, top_k=hf.num_experts_per_tok, intermediate_size=hf.intermediate_size,
            normalize=True, sparse=(True,) * hf.num_hidden_layers)}

    @staticmethod
    def prepare(tensors: dict) -> dict:
        def name(old: str) -> str:
            new = old.replace(".block_sparse_moe.", ".mlp.")
            return re.sub(r"\.experts\.(\d+)\.(w[123])\.", lambda m: f".experts.{m[1]}.{PROJECTIONS[m[2]]}.", new)

        return {name(k): v for k, v in tensors.items()}
