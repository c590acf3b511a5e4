"""A model family is one file: a `Family` registered by its `model_type` is all `ModelConfig` and
the weight loader consult."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eaglespec.errors import UnsupportedModelError
from eaglespec.models.config import ModelConfig
from eaglespec.models.families import FAMILIES, Family
from eaglespec.models.families.registry import register
from eaglespec.models.load import build_decoder

TINY = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=32)


@pytest.fixture
def biased_llama():
    """A family of its own file's making: Llama's layer with q/k/v biases and its own weight names."""

    class Biased(Family):
        model_type = "biased-llama"
        renames = ((r"model\.layers\.(\d+)\.ln1\.", r"layers.\1.input_norm."),)

        @staticmethod
        def layer_config(hf):
            return Family.layer_config(hf) | {"qkv_bias": True, "sliding_window": 8}

    register(Biased)
    yield Biased
    del FAMILIES["biased-llama"]


def test_a_registered_family_sets_its_layer_and_names_its_weights(biased_llama):
    hf = LlamaConfig(**TINY)
    hf.model_type = "biased-llama"
    config = ModelConfig.from_hf(hf)
    assert (config.family, config.qkv_bias, config.sliding_window) == ("biased-llama", True, 8)
    with torch.device("meta"):
        tensors = {name.replace("input_layernorm", "ln1"): t
                   for name, t in LlamaForCausalLM(LlamaConfig(**TINY)).state_dict().items()}
    for part in "qkv":
        tensors[f"model.layers.0.self_attn.{part}_proj.bias"] = torch.zeros(16 if part == "q" else 8, device="meta")
    model = build_decoder(config, tensors, torch.float32)  # every weight found: none missing or unexpected
    assert model.layers[0].attn.qkv.bias is not None


def test_an_unknown_family_names_those_that_run():
    hf = LlamaConfig(**TINY)
    hf.model_type = "gpt_neox"
    with pytest.raises(UnsupportedModelError, match="architecture 'gpt_neox' is not supported; eaglespec runs .*llama"):
        ModelConfig.from_hf(hf)
