"""The few hyper-parameters our decoder needs, read from a Hugging Face config (the layer's
variant by its family's file, `models/families/`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from eaglespec.models.families import family_of
from eaglespec.models.families.moe import MoE


@dataclass(frozen=True)
class ModelConfig:
    family: str  # a `model_type` of `models.families.FAMILIES`
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool = False
    sliding_window: int | None = None
    # The layer's variants beyond Llama's, each off by default (set by a family's `layer_config`):
    rope_scaling: tuple[tuple[str, Any], ...] = ()  # transformers' rope parameters of a scaled RoPE (models/rope.py)
    rotary_dim: int | None = None  # the leading dimensions of a head that RoPE rotates (None: all)
    window_layers: tuple[bool, ...] | None = None  # which layers the window limits (None: all, where there is one)
    local_rope_theta: float | None = None  # the RoPE base of the windowed layers (Gemma-3), unscaled
    qk_norm: bool = False  # RMSNorm over each head's query and key before RoPE (Qwen3, Gemma-3)
    sandwich_norms: bool = False  # an RMSNorm on the attention's and the MLP's outputs too (Gemma-3)
    activation: str = "silu"  # the gated MLP's: "silu" or "gelu_tanh" (GeGLU)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size), rounded to the weights' dtype (Gemma)
    attn_scale: float | None = None  # the attention's score scale (None: head_dim ** -0.5)
    logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    moe: MoE | None = None

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        """Build from a transformers `PretrainedConfig` (4.x or 5.x layout)."""
        family = family_of(hf.model_type)
        heads = hf.num_attention_heads
        fields = dict(
            family=family.model_type,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
            rms_norm_eps=hf.rms_norm_eps,
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
        )
        return cls(**(fields | family.layer_config(hf)))

    def windowed(self, layer: int) -> bool:
        """Whether the sliding window limits what this layer's queries see."""
        return self.sliding_window is not None and (self.window_layers is None or self.window_layers[layer])

    def for_head(self, intermediate_size: int | None = None) -> ModelConfig:
        """A draft head's layer config: the target's sizes (the MLP's `intermediate_size` where given)
        and global RoPE with Llama's layer (the layer EAGLE heads have for every target family, as in
        the engines' head layouts)."""
        return replace(self, intermediate_size=intermediate_size or self.intermediate_size,
                       sliding_window=self.sliding_window if self.window_layers is None else None, window_layers=None,
                       local_rope_theta=None, rotary_dim=None, qk_norm=False, sandwich_norms=False, activation="silu",
                       embed_scale=False, attn_scale=None, logit_softcap=None, moe=None)
