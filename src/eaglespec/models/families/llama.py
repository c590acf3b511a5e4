"""Llama (SmolLM2, Llama-2/3.x): RMSNorm, rotary embeddings (scaled the `llama3`, `linear` or
`yarn` way where the config says so), grouped-query attention, a SiLU-gated MLP; attention biases
where the config's `attention_bias` says so."""

from eaglespec.models.families.family import Family
from eaglespec.models.families.registry import register


@register
class Llama(Family):
    model_type = "llama"
