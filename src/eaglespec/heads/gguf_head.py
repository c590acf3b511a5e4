"""An EAGLE-3 head in llama.cpp's layout (the `eagle3` GGUF that its converter writes and
`llama-server --spec-type draft-eagle3` loads; `eaglespec export --format llama.cpp` makes one),
read back into SpecForge's layout, which `checkpoint.read_head` takes:

- `fc.weight`, `output.weight` (the draft LM head), `output_norm` (the final norm), and the layer's
  `attn_norm` (input), `attn_norm_2` (the hidden states' norm), `ffn_norm` (post-attention) and
  its q/k/v/o and gate/up/down projections;
- q and k rows un-permuted: llama.cpp's converter interleaves each head's two rotary halves;
- `d2t` from the target's token ids to offsets (`d2t[i] = id - i`);
- the target layers read (`eagle3.target_layers`) and the sizes, from the metadata.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from eaglespec.errors import InvalidArgumentError
from eaglespec.models.gguf_extras import read_tensor

LAYER = {"attn_norm": "input_layernorm", "attn_norm_2": "hidden_norm", "ffn_norm": "post_attention_layernorm",
         "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj"}
FILE = "head.gguf"  # the file `export --format llama.cpp` writes
TOP = {"fc.weight": "fc.weight", "output.weight": "lm_head.weight", "output_norm.weight": "norm.weight"}


def read_gguf_head(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, tensors) of a llama.cpp EAGLE-3 head file, in SpecForge's layout."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    if arch != "eagle3":
        raise InvalidArgumentError(f"{path} is a llama.cpp '{arch}' file, not an EAGLE-3 head: give a head.gguf "
                                "made by `eaglespec export --format llama.cpp` or llama.cpp's converter")

    def key(name: str):
        field = reader.fields.get(f"eagle3.{name}")
        return None if field is None else field.contents()

    if key("norm_before_residual") or key("norm_before_fc"):
        raise InvalidArgumentError(f"the EAGLE-3 head at {path} norms before the residual or the fc layer, "
                                "which eaglespec's EAGLE-3 layer does not: use a SpecForge-style head")
    heads, kv_heads = int(key("attention.head_count")), int(key("attention.head_count_kv"))
    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name == "d2t":  # the target's token ids (int64, which dequantize does not take)
            ids = torch.from_numpy(np.array(t.data)).long().flatten()
            tensors["d2t"] = ids - torch.arange(len(ids))
            continue
        value = read_tensor(t)
        if t.name in TOP:
            tensors[TOP[t.name]] = value
        elif t.name.startswith("blk.0."):
            part = t.name[len("blk.0."):].removesuffix(".weight")
            if part == "attn_q":
                value = _unpermute(value, heads)
            elif part == "attn_k":
                value = _unpermute(value, kv_heads)
            tensors[f"midlayer.{LAYER.get(part, part)}.weight"] = value
        # rope_freqs: the target's RoPE, which the head's layer shares (its config, not the file)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "hidden_size": int(key("embedding_length")), "intermediate_size": int(key("feed_forward_length")),
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": int(key("attention.key_length")), "num_hidden_layers": 1,
              "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
              "vocab_size": int(key("vocab_size")), "draft_vocab_size": len(tensors["d2t"]),
              "eagle_aux_hidden_state_layer_ids": [int(i) for i in key("target_layers")]}
    return config, tensors


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of llama.cpp's converter's q/k row order (per head: the two rotary halves interleaved)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
