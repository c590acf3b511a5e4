"""Llama (SmolLM2, Llama-2/3): RMSNorm, rotary embeddings, grouped-query attention, a SiLU-gated
MLP; attention biases where the config's `attention_bias` says so."""

from eaglespec.models.families.family import Family
from eaglespec.models.families.registry import register


@register
class Llama(Family):
    model_type = "llama"
