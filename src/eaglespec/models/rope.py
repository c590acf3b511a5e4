"""Rotary position embeddings: a config's RoPE settings (`rope_settings`) and the inverse
frequencies and cos/sin scale of each kind transformers' configs name (`frequencies`): plain,
`linear`, `llama3` (Llama-3.x), `yarn` and `longrope` (Phi-3; within its original context, where
its short factors apply), and `freq_factors`: llama.cpp's per-frequency divisors, as a GGUF file
stores Llama-3.x's RoPE (`rope_freqs`; see `gguf_extras`). The formulas are those of the RoPE-scaling papers as transformers applies
them, so that our tables equal its tables."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from eaglespec.errors import UnsupportedModelError

KINDS = ("default", "linear", "llama3", "yarn", "longrope", "freq_factors")


def rope_parameters(hf: Any, layer_type: str | None = None) -> dict:
    """A config's RoPE parameters: transformers 5's `rope_parameters` (per layer type where it has
    several), else 4.x's `rope_scaling` with `rope_theta`; a GGUF's `rope_freq_factors` (see `gguf_extras`)."""
    params = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    params = dict(params)
    if factors := getattr(hf, "rope_freq_factors", None):
        params |= {"rope_type": "freq_factors", "factors": list(factors)}
    params.setdefault("rope_theta", getattr(hf, "rope_theta", None))
    params.setdefault("partial_rotary_factor", getattr(hf, "partial_rotary_factor", None) or 1.0)
    return params


def rope_settings(hf: Any, params: dict | None = None) -> dict:
    """The `ModelConfig` fields of a config's RoPE: `rope_theta`, `rope_scaling` (the scaled kinds'
    parameters as sorted pairs), `rotary_dim` (partial rotary) and, for `longrope`, a context capped
    at the original one (beyond it transformers switches to the long factors as the text grows)."""
    params = rope_parameters(hf) if params is None else params
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in KINDS:
        raise UnsupportedModelError(f"rope scaling '{kind}' is not supported; eaglespec runs the "
                                    f"{', '.join(KINDS)} kinds: use a model with one of those")
    if params.get("rope_theta") is None:
        raise UnsupportedModelError("the config has no rope_theta; add it to config.json")
    settings: dict = {"rope_theta": float(params["rope_theta"])}
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    if (partial := float(params.get("partial_rotary_factor") or 1.0)) != 1.0:
        settings["rotary_dim"] = int(head_dim * partial)
    if kind == "default":
        return settings
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor", "type")}
    scaling["rope_type"] = kind
    if kind == "longrope":
        original = params["original_max_position_embeddings"]
        factor = params.get("factor") or hf.max_position_embeddings / original
        if scaling.get("attention_factor") is None:
            scaling["attention_factor"] = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        settings["max_position_embeddings"] = min(hf.max_position_embeddings, original)
    if kind == "yarn" and scaling.get("factor") is None:
        scaling["factor"] = hf.max_position_embeddings / params["original_max_position_embeddings"]
    settings["rope_scaling"] = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                            for k, v in scaling.items() if v is not None))
    return settings


def frequencies(theta: float, dim: int, scaling: tuple = ()) -> tuple[Tensor, float]:
    """The inverse frequencies [dim / 2] (fp32) of a RoPE over `dim` dimensions, and the factor its
    cos and sin are multiplied by (1 but for `yarn` and `longrope`)."""
    s = dict(scaling)
    kind = s.get("rope_type", "default")
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (theta ** exponents)
    if kind == "linear":
        return inv_freq / s["factor"], 1.0
    if kind == "llama3":
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        original = s["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelength - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelength < original / high) & ~(wavelength > original / low)
        return torch.where(medium, blended, scaled), 1.0
    if kind == "freq_factors":
        return inv_freq / torch.tensor(s["factors"], dtype=torch.float32), 1.0
    if kind == "yarn":
        return _yarn(theta, dim, s, exponents)
    if kind == "longrope":
        return 1.0 / (torch.tensor(s["short_factor"], dtype=torch.float32) * theta ** exponents), s["attention_factor"]
    return inv_freq, 1.0


def _yarn(theta: float, dim: int, s: dict, exponents: Tensor) -> tuple[Tensor, float]:
    """YaRN: interpolated frequencies below the `beta_slow` rotations' dimension, extrapolated above
    `beta_fast`'s, a linear ramp between; cos and sin scaled by 0.1 ln(factor) + 1 (or by mscale's ratio)."""
    factor, original = s["factor"], s["original_max_position_embeddings"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.get("attention_factor")
    if attention is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            attention = mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
        else:
            attention = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.get("beta_fast") or 32), correction_dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp
    pos_freqs = theta ** exponents
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolated) + (1.0 / pos_freqs) * extrapolated
    return inv_freq, float(attention)
