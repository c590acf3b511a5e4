"""Phi-3 (and Phi-4-mini): Llama's layer with q/k/v and gate/up stored fused (`qkv_proj`,
`gate_up_proj`: the layouts ours are), partial rotary and `longrope` where the config has them."""

from eaglespec.models.families.family import Family
from eaglespec.models.families.registry import register


@register
class Phi3(Family):
    model_type = "phi3"
    renames = (
        (r"(?:model\.)?layers\.(\d+)\.self_attn\.qkv_proj\.", r"layers.\1.attn.qkv."),
        (r"(?:model\.)?layers\.(\d+)\.mlp\.gate_up_proj\.", r"layers.\1.mlp.gate_up."),
    )
