"""Qwen2-MoE: Qwen2's attention (q/k/v biases where `qkv_bias`), routed experts and a shared
expert gated by a sigmoid."""

from typing import Any

from eaglespec.models.families.moe import qwen_moe
from eaglespec.models.families.qwen2 import Qwen2
from eaglespec.models.families.registry import register


@register
class Qwen2Moe(Qwen2):
    model_type = "qwen2_moe"

    @staticmethod
    def layer_config(hf: Any) -> dict:
        return Qwen2.layer_config(hf) | {"qkv_bias": bool(getattr(hf, "qkv_bias", True)), "moe": qwen_moe(hf, shared=True)}
