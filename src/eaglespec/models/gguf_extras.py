"""What a GGUF file holds that transformers' GGUF reader leaves out, read the way llama.cpp reads it,
so that a converted folder is the model llama.cpp runs from the same file (`convert_gguf` applies it):

- the head size (`attention.key_length`: Qwen3's differs from hidden / heads), the experts' and the
  shared expert's widths (`expert_feed_forward_length`, `expert_shared_feed_forward_length`);
- RoPE: the rotated dimensions (Phi's partial rotary), `rope.scaling.type` linear or yarn, Phi-3's
  longrope factors (`rope_factors_short`/`_long`; we run within the original context, where
  llama.cpp takes the short ones too) and the per-frequency divisors (`rope_freqs`) that llama.cpp's
  converter writes for Llama-3.x's `llama3` kind (kept as such: `freq_factors`);
- Gemma-3: the final logit soft-cap, the sliding layers' RoPE base, their pattern (every 6th layer
  global unless the file says otherwise; none without a window) and llama.cpp's attention scale
  (1 / sqrt(head size), or 1 / sqrt(hidden / heads) for the 62-layer 27B);
- Mixtral, which GGUF stores as `llama` with experts: the Mixtral config and the experts' tensors;
- Qwen2-MoE's shared-expert gate, which the reader leaves [1, 1, hidden] for a [1, hidden] weight.

What GGUF does not store stays out of the model, as it does in llama.cpp: a `llama` file has no
sliding window (Mistral's), llama.cpp runs Phi-3 without its window, and a Qwen2-MoE file has no
dense layers among its sparse ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

GEMMA3_PATTERN = 6  # llama.cpp's default for gemma3 files that do not store theirs
GEMMA3_27B_LAYERS = 62


def complete(config: Any, gguf_path: Path, tensors: dict[str, torch.Tensor]) -> tuple[Any, dict[str, torch.Tensor]]:
    """The config and the tensors transformers' reader made of a GGUF file, with what it left out."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    arch = _value(reader, "general.architecture")

    def key(name: str) -> Any:
        return _value(reader, f"{arch}.{name}")

    if (head_dim := key("attention.key_length")) is not None:
        config.head_dim = int(head_dim)
    if (width := key("expert_feed_forward_length")) is not None:
        config.moe_intermediate_size = int(width)
    if (width := key("expert_shared_feed_forward_length")) is not None:
        config.shared_expert_intermediate_size = int(width)
    rope = _rope(config, key, reader)
    if arch == "gemma3":
        _gemma3(config, key, rope)
    else:
        config.rope_parameters = rope
    tensors = {name: t.reshape(1, -1) if name.endswith("shared_expert_gate.weight") else t
               for name, t in tensors.items()}
    if arch == "llama" and (key("expert_count") or 0) > 0:
        config, experts = _mixtral(config, key, reader)
        tensors |= experts
    return config, tensors


def _value(reader, name: str) -> Any:
    field = reader.fields.get(name)
    return None if field is None else field.contents()


def _tensor(reader, name: str) -> torch.Tensor | None:
    """The file's tensor `name` in fp32, or None where it has none."""
    found = next((t for t in reader.tensors if t.name == name), None)
    return None if found is None else read_tensor(found)


def read_tensor(t) -> torch.Tensor:
    """A GGUF reader's tensor, dequantized to fp32, in torch's shape order (llama.cpp's reversed)."""
    from gguf import dequantize

    shape = tuple(int(n) for n in reversed(t.shape.tolist()))
    return torch.from_numpy(np.array(dequantize(t.data, t.tensor_type))).float().reshape(shape)


def _rope(config: Any, key, reader) -> dict:
    """The (global layers') RoPE parameters; a `rope_freqs` tensor goes to `config.rope_freq_factors`."""
    params = {"rope_type": "default", "rope_theta": float(key("rope.freq_base") or 10000.0)}
    before = getattr(config, "rope_parameters", None) or {}
    if "partial_rotary_factor" in before:  # Phi-3's config checks that it is there
        params["partial_rotary_factor"] = before["partial_rotary_factor"]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if (rotated := key("rope.dimension_count")) is not None and int(rotated) != head_dim:
        params["partial_rotary_factor"] = int(rotated) / head_dim  # Phi's partial rotary
    kind = key("rope.scaling.type")
    if kind in ("linear", "yarn"):
        params |= {"rope_type": kind, "factor": float(key("rope.scaling.factor"))}
        if kind == "yarn":
            params["original_max_position_embeddings"] = int(key("rope.scaling.original_context_length"))
            for name, field in (("beta_fast", "rope.scaling.yarn_beta_fast"), ("beta_slow", "rope.scaling.yarn_beta_slow")):
                if (value := key(field)) is not None:
                    params[name] = float(value)
    if (short := _tensor(reader, "rope_factors_short.weight")) is not None:  # Phi-3's longrope
        params |= {"rope_type": "longrope", "short_factor": short.flatten().tolist(),
                   "long_factor": _tensor(reader, "rope_factors_long.weight").flatten().tolist(),
                   "original_max_position_embeddings": int(key("rope.scaling.original_context_length")),
                   "attention_factor": float(key("rope.scaling.attn_factor") or 1.0)}
    if (factors := _tensor(reader, "rope_freqs.weight")) is not None:
        config.rope_freq_factors = [float(f) for f in factors.flatten()]
    return params


def _gemma3(config: Any, key, rope: dict) -> None:
    """Gemma-3's layer pattern, scales and the RoPE of each kind of layer: the global ones scaled
    as the file says, the sliding ones plain with their own base (llama.cpp's reading)."""
    config.final_logit_softcapping = key("final_logit_softcapping")
    layers = config.num_hidden_layers
    if config.num_hidden_layers == GEMMA3_27B_LAYERS:
        config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads
    else:
        config.query_pre_attn_scalar = config.head_dim
    window = key("attention.sliding_window")
    pattern = key("attention.sliding_window_pattern")
    if not window:
        sliding = [False] * layers
    elif isinstance(pattern, list):
        sliding = [bool(p) for p in pattern]
    else:
        n = int(pattern or GEMMA3_PATTERN)
        sliding = [(i + 1) % n != 0 for i in range(layers)]
    config.layer_types = ["sliding_attention" if s else "full_attention" for s in sliding]
    local = float(key("rope.freq_base_swa") or 10000.0)
    config.rope_parameters = {"full_attention": rope, "sliding_attention": {"rope_type": "default", "rope_theta": local}}


def _mixtral(config: Any, key, reader) -> tuple[Any, dict[str, torch.Tensor]]:
    """A `llama` file with experts is Mixtral: per-expert w1 (gate), w2 (down), w3 (up) and the router."""
    from transformers import MixtralConfig

    fields = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures", "head_dim")}
    mixtral = MixtralConfig(**fields, num_local_experts=int(key("expert_count")),
                            num_experts_per_tok=int(key("expert_used_count")))
    mixtral.architectures = ["MixtralForCausalLM"]
    tensors, by_name = {}, {t.name: t for t in reader.tensors}
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}.block_sparse_moe"
        tensors[f"{prefix}.gate.weight"] = read_tensor(by_name[f"blk.{layer}.ffn_gate_inp.weight"])
        for gguf_name, ours in (("ffn_gate_exps", "w1"), ("ffn_down_exps", "w2"), ("ffn_up_exps", "w3")):
            stacked = read_tensor(by_name[f"blk.{layer}.{gguf_name}.weight"])
            for e in range(stacked.shape[0]):
                tensors[f"{prefix}.experts.{e}.{ours}.weight"] = stacked[e].contiguous()
    return mixtral, tensors
