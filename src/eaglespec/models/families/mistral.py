"""Mistral: Llama's layer with a sliding attention window (`sliding_window`, where the config sets one)."""

from eaglespec.models.families.family import Family
from eaglespec.models.families.registry import register


@register
class Mistral(Family):
    model_type = "mistral"
