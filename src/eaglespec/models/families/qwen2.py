"""Qwen2 (Qwen2.5): Llama's layer with q/k/v biases always; its sliding window applies only where
the config's `use_sliding_window` turns it on."""

from typing import Any

from eaglespec.models.families.family import Family
from eaglespec.models.families.registry import register


@register
class Qwen2(Family):
    model_type = "qwen2"

    @staticmethod
    def layer_config(hf: Any) -> dict:
        return Family.layer_config(hf) | {
            "qkv_bias": True, "o_bias": False,
            **({} if getattr(hf, "use_sliding_window", False) else {"sliding_window": None, "window_layers": None})}
