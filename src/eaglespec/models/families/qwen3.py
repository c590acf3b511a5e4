"""Qwen3: Qwen2's layer without attention biases (unless `attention_bias`, which covers q, k, v
and o), with an RMSNorm over each head's query and key before RoPE."""

from typing import Any

from eaglespec.models.families.family import Family
from eaglespec.models.families.registry import register


@register
class Qwen3(Family):
    model_type = "qwen3"

    @staticmethod
    def layer_config(hf: Any) -> dict:
        return Family.layer_config(hf) | {
            "qk_norm": True,
            **({} if getattr(hf, "use_sliding_window", False) else {"sliding_window": None, "window_layers": None})}
