"""What a model family is to eaglespec: the `Family` base class its file fills in.

A family maps a transformers `model_type` onto the decoder: which of the layer's variants it uses,
read from its config (`layer_config`: the `ModelConfig` fields that differ between families), the
names of its weights that are not Llama's (`renames`, tried before the common ones in
`models/load.py`), and what its checkpoint's tensors need before they load (`prepare`). The sizes
are read the same way for every family by `ModelConfig.from_hf`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from eaglespec.errors import UnsupportedModelError
from eaglespec.models.rope import rope_settings


class Family:
    model_type: ClassVar[str]  # transformers' `model_type`
    renames: ClassVar[tuple[tuple[str, str], ...]] = ()  # (Hugging Face name pattern, ours) beyond Llama's

    @staticmethod
    def layer_config(hf: Any) -> dict:
        """The layer variant's `ModelConfig` fields from a transformers config: Llama's reading (its
        RoPE, scaled or not; attention biases where `attention_bias` says so; a sliding window)."""
        if getattr(hf, "mlp_bias", False):
            raise UnsupportedModelError("MLP biases are not supported; use a model without mlp_bias")
        bias = bool(getattr(hf, "attention_bias", False))
        window = getattr(hf, "sliding_window", None) or None
        types = getattr(hf, "layer_types", None)
        return {"qkv_bias": bias, "o_bias": bias, "sliding_window": window, **rope_settings(hf),
                "window_layers": tuple(t == "sliding_attention" for t in types) if window and types else None}

    @staticmethod
    def prepare(tensors: dict) -> dict:
        """The checkpoint's tensors as `models/load.py` reads them (by default, as they are)."""
        return tensors
