"""Qwen3-MoE: Qwen3's attention (per-head q/k norms) with routed experts, no shared one."""

from typing import Any

from eaglespec.models.families.moe import qwen_moe
from eaglespec.models.families.qwen3 import Qwen3
from eaglespec.models.families.registry import register


@register
class Qwen3Moe(Qwen3):
    model_type = "qwen3_moe"

    @staticmethod
    def layer_config(hf: Any) -> dict:
        return Qwen3.layer_config(hf) | {"moe": qwen_moe(hf, shared=False)}
