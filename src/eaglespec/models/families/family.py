"""What a model family is to eaglespec: the `Family` base class its file fills in.

A family maps a transformers `model_type` onto the decoder: which of the layer's variants it uses,
read from its config (`layer_config`: the `ModelConfig` fields that differ between families), and
the names of its weights that are not Llama's (`renames`, tried before the common ones in
`models/load.py`). Everything else (sizes, norms' epsilon, RoPE base, context, tied embeddings) is
read the same way for every family by `ModelConfig.from_hf`.
"""

from __future__ import annotations

from typing import Any, ClassVar


class Family:
    model_type: ClassVar[str]  # transformers' `model_type`
    renames: ClassVar[tuple[tuple[str, str], ...]] = ()  # (Hugging Face name pattern, ours) beyond Llama's

    @staticmethod
    def layer_config(hf: Any) -> dict:
        """The layer variant's `ModelConfig` fields from a transformers config: Llama's reading."""
        return {"qkv_bias": bool(getattr(hf, "attention_bias", False)),
                "sliding_window": getattr(hf, "sliding_window", None)}
