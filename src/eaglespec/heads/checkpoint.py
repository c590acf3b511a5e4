"""Head checkpoints: a folder with a Llama-style `config.json` and `model.safetensors` holding the
official EAGLE-1/2 key names (fc.*, layers.N.self_attn.*, layers.N.mlp.*,
layers.0.post_attention_layernorm.weight), plus `draft_vocab` when the vocabulary is reduced.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eaglespec.errors import EaglespecError, InvalidArgumentError
from eaglespec.heads.head import EagleHead
from eaglespec.models.load import Target, from_hf_state_dict, to_hf_state_dict

SHIPPED = Path(__file__).resolve().parents[3] / "heads"  # heads/ at the repository root


class HeadMismatchError(EaglespecError):
    pass


def save_head(head: EagleHead, folder: Path, target_name: str, info: dict | None = None) -> None:
    """Write the head in bf16, atomically (a temporary folder renamed into place)."""
    c = head.config
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": c.family, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "num_hidden_layers": len(head.layers),
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size, "bias": True,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "eaglespec": {"target": target_name, "input_variant": head.input_variant,
                      "draft_vocab_size": head.vocab_size, **(info or {})},
    }
    tensors = {k: v.to(torch.bfloat16) for k, v in to_hf_state_dict(head.state_dict(), c).items()}
    if head.draft_vocab is not None:
        tensors["draft_vocab"] = head.draft_vocab.cpu().to(torch.int64)
    folder = Path(folder)
    tmp = folder.parent / f".{folder.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    old = folder.parent / f".{folder.name}.old{os.getpid()}"
    if folder.exists():
        os.rename(folder, old)
    os.rename(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def resolve_head(spec: str, target_name: str) -> Path:
    if spec == "default":
        folder = SHIPPED / target_name
        if not (folder / "config.json").is_file():
            shipped = ", ".join(sorted(p.parent.name for p in SHIPPED.glob("*/config.json"))) or "none yet"
            raise InvalidArgumentError(
                f"no shipped head for '{target_name}' (shipped: {shipped}); "
                "pass --head PATH to a head trained with `eaglespec train` (benchmarks/train_head.sh "
                "holds the recipes; qwen2.5-coder-1.5b-instruct's head is built there, not shipped)"
            )
        return folder
    folder = Path(spec)
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise InvalidArgumentError(f"no head at '{spec}': give a folder with config.json and model.safetensors, or 'default'")
    return folder


def load_head(spec: str, target: Target) -> EagleHead:
    """Load a head for `target` for inference (frozen, packed weights where exact), refusing one
    trained for another model."""
    folder = resolve_head(spec, target.name)
    config = json.loads((folder / "config.json").read_text())
    c = target.model.config
    mine = (config.get("model_type"), config.get("hidden_size"), config.get("vocab_size"))
    theirs = (c.family, c.hidden_size, c.vocab_size)
    if mine != theirs:
        raise HeadMismatchError(
            f"the head at {folder} fits a {mine[0]} model with hidden size {mine[1]} and vocabulary {mine[2]}, "
            f"but {target.name} is {theirs[0]} with {theirs[1]} and {theirs[2]}: use a head trained for this target"
        )
    extra = config.get("eaglespec", {})
    head = EagleHead(c, config.get("num_hidden_layers", 1), extra.get("input_variant", "feature+shifted-token"))
    tensors = load_file(str(folder / "model.safetensors"))
    draft_vocab = tensors.pop("draft_vocab", None)
    tensors.pop("embed_tokens.weight", None)  # official EAGLE-1 files carry a copy of the target's embedding
    dtype = target.model.weight_like.dtype
    missing, unexpected = head.load_state_dict(from_hf_state_dict(tensors, dtype), strict=False)
    if missing or unexpected:
        raise HeadMismatchError(
            f"the head at {folder} does not have the expected weights (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}): it is not an EAGLE-1/2 head for this target"
        )
    head = head.to(target.model.weight_like.device, dtype).eval().requires_grad_(False)
    head.attach(target.model, draft_vocab)
    head.pack_weights()
    return head
