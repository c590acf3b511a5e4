"""Gemma-3 (text): layers that alternate between a sliding window with its own RoPE base (five
of every six, by default) and global attention with the config's RoPE; an RMSNorm over each head's
query and key; norms on the attention's and the MLP's inputs and outputs; a GeGLU MLP; embeddings
scaled by sqrt(hidden); the attention scale `query_pre_attn_scalar ** -0.5`.

Gemma's RMSNorm multiplies by (1 + w): `prepare` adds the 1 to the weights once, in fp32, so the
norms are Llama's (the same numbers in fp32; in bf16 the product rounds once more, as in every
other family)."""

import re
from typing import Any

from eaglespec.errors import UnsupportedModelError
from eaglespec.models.families.family import Family
from eaglespec.models.families.registry import register
from eaglespec.models.rope import rope_parameters, rope_settings

NORMS = re.compile(r"(?:model\.)?(?:norm|layers\.\d+\.(?:input_layernorm|post_attention_layernorm|"
                   r"pre_feedforward_layernorm|post_feedforward_layernorm|self_attn\.q_norm|self_attn\.k_norm))\.weight")
ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


@register
class Gemma3(Family):
    model_type = "gemma3_text"
    renames = (  # Gemma's post-attention norm is on the attention's output; the MLP's input norm is "pre-feedforward"
        (r"(?:model\.)?layers\.(\d+)\.post_attention_layernorm\.", r"layers.\1.attn_out_norm."),
        (r"(?:model\.)?layers\.(\d+)\.pre_feedforward_layernorm\.", r"layers.\1.post_attn_norm."),
        (r"(?:model\.)?layers\.(\d+)\.post_feedforward_layernorm\.", r"layers.\1.mlp_out_norm."),
    )

    @staticmethod
    def layer_config(hf: Any) -> dict:
        activation = getattr(hf, "hidden_activation", None) or hf.hidden_act
        if activation not in ACTIVATIONS:
            raise UnsupportedModelError(f"Gemma's activation '{activation}' is not supported; use gelu_pytorch_tanh")
        types = list(hf.layer_types)
        local = rope_settings(hf, rope_parameters(hf, "sliding_attention"))
        if set(local) != {"rope_theta"}:
            raise UnsupportedModelError("scaled RoPE on Gemma's sliding-window layers is not supported")
        return {
            **rope_settings(hf, rope_parameters(hf, "full_attention")),
            "qkv_bias": bool(hf.attention_bias), "o_bias": bool(hf.attention_bias),
            "sliding_window": hf.sliding_window, "window_layers": tuple(t == "sliding_attention" for t in types),
            "local_rope_theta": local["rope_theta"], "qk_norm": True, "sandwich_norms": True,
            "activation": ACTIVATIONS[activation], "embed_scale": True, "attn_scale": hf.query_pre_attn_scalar ** -0.5,
            "logit_softcap": getattr(hf, "final_logit_softcapping", None),
        }

    @staticmethod
    def prepare(tensors: dict) -> dict:
        return {name: (t.float() + 1).to(t.dtype) if NORMS.fullmatch(name) else t for name, t in tensors.items()}
