"""The few hyper-parameters our decoder needs, read from a Hugging Face config (the layer's
variant by its family's file, `models/families/`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eaglespec.errors import UnsupportedModelError
from eaglespec.models.families import family_of


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
    sliding_window: int | None = None

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        """Build from a transformers `PretrainedConfig` (4.x or 5.x layout)."""
        family = family_of(hf.model_type)
        rope = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise UnsupportedModelError(
                f"rope scaling '{rope_type}' is not supported; use a model with plain RoPE"
            )
        theta = rope.get("rope_theta", getattr(hf, "rope_theta", None))
        if theta is None:
            raise UnsupportedModelError("the config has no rope_theta; add it to config.json")
        heads = hf.num_attention_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        if getattr(hf, "mlp_bias", False):
            raise UnsupportedModelError("MLP biases are not supported; use a model without mlp_bias")
        return cls(
            family=family.model_type,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            rms_norm_eps=hf.rms_norm_eps,
            rope_theta=float(theta),
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            **family.layer_config(hf),
        )
