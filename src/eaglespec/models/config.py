"""The few hyper-parameters our decoder needs, read from a Hugging Face config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eaglespec.errors import UnsupportedModelError

SUPPORTED_FAMILIES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True)
class ModelConfig:
    family: str  # one of SUPPORTED_FAMILIES
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
        family = hf.model_type
        if family not in SUPPORTED_FAMILIES:
            raise UnsupportedModelError(
                f"architecture '{family}' is not supported; eaglespec runs "
                f"{', '.join(SUPPORTED_FAMILIES)} models: pick one of those"
            )
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
        if family == "qwen2":
            qkv_bias = True
            window = hf.sliding_window if getattr(hf, "use_sliding_window", False) else None
        else:
            qkv_bias = bool(getattr(hf, "attention_bias", False))
            window = getattr(hf, "sliding_window", None)
        if getattr(hf, "mlp_bias", False):
            raise UnsupportedModelError("MLP biases are not supported; use a model without mlp_bias")
        return cls(
            family=family,
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
            qkv_bias=qkv_bias,
            sliding_window=window,
        )
