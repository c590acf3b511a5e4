"""Head checkpoints: a folder with `config.json` and `model.safetensors`, in the layouts the
engines load.

- EAGLE-1/2 (`LlamaForCausalLM`, the official release's keys): fc.*, layers.N.self_attn.*,
  layers.N.mlp.*, layers.0.post_attention_layernorm.weight, plus `draft_vocab` when the
  vocabulary is reduced.
- EAGLE-3 (`LlamaForCausalLMEagle3`, as vLLM, SGLang and llama.cpp read it): fc.weight,
  midlayer.{input_layernorm, hidden_norm, self_attn.*, post_attention_layernorm, mlp.*}, norm.weight,
  lm_head.weight, d2t (draft id -> target id offset) and t2d (target ids in the draft vocabulary);
  config.json gives `draft_vocab_size` and `eagle_aux_hidden_state_layer_ids`.
- Medusa (`MedusaModel`, the Medusa release's keys): {k}.0.linear.weight and .bias per head k,
  `medusa_num_heads` and `medusa_num_layers` (1) in config.json, plus `draft_vocab` when the
  vocabulary is reduced. The Medusa release also stores each head's own LM head ({k}.1.weight);
  ours share the target's frozen one, so a file with them is refused. vLLM's layout
  (blocks.{k}.layers.0.*, one `lm_head`, a `token_map` or zeroed rows where the vocabulary is
  reduced) reads as ours where that LM head is the target's.
"""

from __future__ import annotations

import json
import re
from importlib.resources import files
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eaglespec.errors import EaglespecError, InvalidArgumentError
from eaglespec.files import write_folder
from eaglespec.heads import gguf_head
from eaglespec.heads.head import DraftHead, Eagle3Head, EagleHead, MedusaHead, check_aux_layers, default_aux_layers
from eaglespec.models.load import Target, from_hf_state_dict, to_hf_state_dict, unknown_names

# the heads we ship: package data, so that a wheel install has them too
SHIPPED = Path(str(files("eaglespec.heads") / "shipped"))
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # ours and the engines'; the official EAGLE release's
TOKEN_MAP = "token_map.pt"  # SGLang's --speculative-token-map: an EAGLE-1 head's draft vocabulary (target ids)
KINDS = {"eagle1": "an EAGLE-1/2", "eagle3": "an EAGLE-3", "medusa": "a Medusa"}
ARCHITECTURES = {"eagle1": "LlamaForCausalLM", "eagle3": "LlamaForCausalLMEagle3", "medusa": "MedusaModel"}


class HeadMismatchError(EaglespecError):
    pass


def head_layout(head: DraftHead, target_name: str, info: dict | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """The head's config.json and tensors (bf16) in the layout `save_head` writes (see the module's doc)."""
    c = head.config
    config = {
        "architectures": [ARCHITECTURES[head.head_type]], "model_type": c.family, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "num_hidden_layers": len(head.layers),
        "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    if c.rope_scaling:  # the target's scaled RoPE (Llama-3.x), which the head's layer shares
        config["rope_scaling"] = {k: list(v) if isinstance(v, tuple) else v for k, v in c.rope_scaling}
    tensors = {k: v.detach().to("cpu", torch.bfloat16) for k, v in to_hf_state_dict(head.state_dict(), c).items()}
    if head.head_type == "eagle3":
        tensors = {k.replace("layers.0.", "midlayer."): v for k, v in tensors.items()}
        tensors["d2t"], tensors["t2d"] = head.d2t.cpu(), head.t2d.cpu()
        config |= {"draft_vocab_size": head.vocab_size, "eagle_aux_hidden_state_layer_ids": list(head.reads)}
    elif head.head_type == "medusa":
        tensors = {k.replace("heads.", "", 1).replace(".linear.", ".0.linear."): v for k, v in tensors.items()}
        config |= {"medusa_num_heads": len(head.heads), "medusa_num_layers": 1}
        if head.draft_vocab is not None:
            tensors["draft_vocab"] = head.draft_vocab.cpu().to(torch.int64)
    else:
        config["bias"] = True
        if head.draft_vocab is not None:
            tensors["draft_vocab"] = head.draft_vocab.cpu().to(torch.int64)
    config["eaglespec"] = {"target": target_name, "head_type": head.head_type, "input_variant": head.input_variant,
                           "draft_vocab_size": head.vocab_size, **(info or {})}
    return config, tensors


def save_head(head: DraftHead, folder: Path, target_name: str, info: dict | None = None) -> None:
    """Write the head in bf16, atomically (a temporary folder renamed into place)."""
    config, tensors = head_layout(head, target_name, info)

    def fill(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    write_folder(folder, fill)


def shipped_head(target_name: str, kind: str = "eagle") -> Path | None:
    """The folder of the head of a kind we ship for a model, if there is one (a model given as a path
    has none). Kinds: "eagle" (the default EAGLE head, shipped/MODEL), "eagle3" (the EAGLE-3 head:
    the default where it is one, else shipped/eagle3/MODEL beside an EAGLE-1 default) and "medusa"
    (shipped/medusa/MODEL)."""
    default = shipped_head(target_name) if kind == "eagle3" else None
    if default is not None and _type_of(default) == "eagle3":
        return default
    root = SHIPPED / kind if kind in ("eagle3", "medusa") else SHIPPED
    folder = root / target_name
    return folder if folder.parent == root and (folder / "config.json").is_file() else None


def _type_of(folder: Path) -> str:
    """A shipped head's type, from its config.json (ours, as `save_head` writes it)."""
    return head_type_of(json.loads((folder / "config.json").read_text()))


def shipped_kinds(target_name: str) -> list[str]:
    """The head types we ship for a model, the default EAGLE head's first: eagle1 or eagle3, then medusa."""
    default = shipped_head(target_name)
    kinds = [_type_of(default)] if default else []
    if "eagle3" not in kinds and shipped_head(target_name, "eagle3"):
        kinds.append("eagle3")
    return kinds + (["medusa"] if shipped_head(target_name, "medusa") else [])


def shipped_heads(kind: str = "eagle") -> str:
    """The models we ship heads of a kind for, as text."""
    names = {p.parent.name for p in SHIPPED.glob("**/config.json")}
    return ", ".join(sorted(name for name in names if shipped_head(name, kind))) or "none yet"


def resolve_head(spec: str, target_name: str, kind: str = "eagle") -> Path:
    """The folder of a head given as a path, 'default' (the shipped head of `kind`) or, for EAGLE
    heads, 'eagle3' (the shipped EAGLE-3 head, the one the engines that only run EAGLE-3 load)."""
    if spec == "default" or (spec == "eagle3" and kind == "eagle"):
        kind = "eagle3" if spec == "eagle3" else kind
        folder = shipped_head(target_name, kind)
        if folder is None:
            option, recipe = {
                "medusa": ("--medusa-head", "`eaglespec train --head-type medusa`"),
                "eagle3": ("--head", "benchmarks/recipes/train_eagle3.sh"),
                "eagle": ("--head", "`eaglespec train` (benchmarks/recipes/train_head.sh holds the recipes; "
                          "qwen2.5-coder-1.5b-instruct's head is built there, not shipped)")}[kind]
            raise InvalidArgumentError(
                f"no shipped {kind} head for '{target_name}' (shipped: {shipped_heads(kind)}); "
                f"pass {option} PATH to a head trained with {recipe}"
            )
        return folder
    folder, names = Path(spec), "or 'default'" if kind == "medusa" else "'default' or 'eagle3'"
    if _gguf_of(folder) is None and (not (folder / "config.json").is_file()
                                     or not any((folder / f).is_file() for f in WEIGHT_FILES)):
        raise InvalidArgumentError(f"no head at '{spec}': give a folder with config.json and model.safetensors "
                                   f"(or an official EAGLE release's pytorch_model.bin), llama.cpp's {gguf_head.FILE} "
                                   f"(or its folder), {names}")
    return folder


def _gguf_of(path: Path) -> Path | None:
    """The llama.cpp head file `path` names (the file, or a folder that has it and no config.json)."""
    if path.suffix == ".gguf" and path.is_file():
        return path
    if (path / gguf_head.FILE).is_file() and not (path / "config.json").is_file():
        return path / gguf_head.FILE
    return None


def head_type_of(config: dict) -> str:
    """eagle1, eagle3 or medusa, from a head's config.json (after `read_head`)."""
    if "medusa_num_heads" in config:
        return "medusa"
    return "eagle3" if "LlamaForCausalLMEagle3" in config.get("architectures", []) else "eagle1"


def _draft_vocab_of_eagle3(tensors: dict, folder: Path, vocab_size: int) -> torch.Tensor:
    d2t = tensors.pop("d2t", None)
    t2d = tensors.pop("t2d", None)
    if d2t is None:
        raise HeadMismatchError(f"the EAGLE-3 head at {folder} has no d2t table")
    draft_vocab = torch.arange(len(d2t)) + d2t.long()
    if int(draft_vocab.min()) < 0 or int(draft_vocab.max()) >= vocab_size or \
            (t2d is not None and int(t2d.sum()) != len(d2t)):
        raise HeadMismatchError(f"the EAGLE-3 head at {folder} has a d2t table that does not fit this target's vocabulary")
    return draft_vocab


def _unfold_fc_bias(tensors: dict[str, torch.Tensor]) -> None:
    """vLLM's EAGLE-1 layer has no fc bias; `export --format vllm` folds it into layer 0's attention
    biases (q/k/v get W b, o gets b: the same function, see export.py) and gives the other layers
    zero ones. Undo that: fc.bias = o's bias, layer 0's q/k/v biases less W b; biases that come out
    zero (a family without them) are dropped."""
    b = tensors.pop("layers.0.self_attn.o_proj.bias").float()
    tensors["fc.bias"] = b.to(tensors["fc.weight"].dtype)
    for key in [k for k in tensors if re.fullmatch(r"layers\.\d+\.self_attn\.[qkv]_proj\.bias", k)]:
        weight = tensors[key.replace(".bias", ".weight")]
        bias = tensors[key].float() - (weight.float() @ b if key.startswith("layers.0.") else 0)
        tensors[key] = bias.to(weight.dtype)
        if not bool(tensors[key].any()):
            tensors.pop(key)


def read_head(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """A head folder's config and tensors in our layout, from ours or the engines' (official EAGLE-1
    with pytorch_model.bin and embed_tokens, vLLM's folded EAGLE-1, SGLang's with its token map,
    EAGLE-3 with eagle_config, the speculators config, llama.cpp's GGUF)."""
    if (gguf := _gguf_of(folder)) is not None:
        return gguf_head.read_gguf_head(gguf)
    config = json.loads((folder / "config.json").read_text())
    if "speculators_model_type" in config:
        if config["speculators_model_type"] != "eagle3":
            raise HeadMismatchError(f"the speculators head at {folder} is '{config['speculators_model_type']}': "
                                    "eaglespec reads EAGLE-3 ones")
        config = {**config.get("transformer_layer_config", {}), "architectures": [ARCHITECTURES["eagle3"]],
                  **{k: config[k] for k in ("draft_vocab_size", "eagle_aux_hidden_state_layer_ids") if k in config}}
    aux = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if aux and not config.get("eagle_aux_hidden_state_layer_ids"):
        config["eagle_aux_hidden_state_layer_ids"] = aux
    if (folder / "model.safetensors").is_file():
        tensors = load_file(str(folder / "model.safetensors"))
    else:
        tensors = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    tensors.pop("embed_tokens.weight", None)  # official EAGLE-1 files carry a copy of the target's embedding
    kind = head_type_of(config)
    if kind == "eagle1" and "fc.bias" not in tensors:
        if "layers.0.self_attn.o_proj.bias" in tensors:
            _unfold_fc_bias(tensors)
        elif "fc.weight" in tensors:  # a head trained without the bias
            tensors["fc.bias"] = torch.zeros(len(tensors["fc.weight"]), dtype=tensors["fc.weight"].dtype)
    for key in [k for k in tensors if k.endswith("self_attn.o_proj.bias")]:
        if not bool(tensors[key].any()):  # zeros that an engine's config needed, no function
            tensors.pop(key)
    if kind == "medusa":  # vLLM's blocks.K.layers.0.* -> ours, K.0.linear.*; its token_map -> draft_vocab
        tensors = {"draft_vocab" if k == "token_map" else re.sub(r"^blocks\.(\d+)\.layers\.(\d+)\.", r"\1.\2.linear.", k): v
                   for k, v in tensors.items()}
    if kind == "eagle1" and "draft_vocab" not in tensors and (folder / TOKEN_MAP).is_file():
        tensors["draft_vocab"] = torch.load(folder / TOKEN_MAP, map_location="cpu", weights_only=True)
    return config, tensors


def _medusa_draft_vocab(lm_head: torch.Tensor, target: Target, draft_vocab: torch.Tensor | None,
                        folder: Path) -> torch.Tensor | None:
    """The draft vocabulary of a vLLM Medusa file: its token map, or the rows our export kept of the
    target's LM head (the others zeroed), refusing an LM head other than the target's (within 5% by norm:
    an int8 or int4 target's LM head, kept in int8, differs by 1.2% on SmolLM2)."""
    rows, theirs = target.model.lm_head.weight.detach().cpu().float(), lm_head.float()
    if draft_vocab is None and theirs.shape == rows.shape:
        zeroed = (theirs == 0).all(1) & (rows != 0).any(1)
        draft_vocab = (~zeroed).nonzero().flatten() if zeroed.any() else None
    if draft_vocab is not None:
        rows = rows[draft_vocab.long()]
        theirs = theirs[draft_vocab.long()] if len(theirs) > len(rows) else theirs  # (as vLLM slices a full one)
    if theirs.shape != rows.shape or (theirs - rows).norm() > 0.05 * rows.norm():
        raise HeadMismatchError(f"the Medusa head at {folder} has an LM head of its own; eaglespec's Medusa heads "
                                "share the target's (train one with `eaglespec train --head-type medusa`)")
    return draft_vocab


def load_head(spec: str, target: Target, kind: str = "eagle") -> DraftHead:
    """Load a head for `target` for inference (frozen; packed weights where exact, int8 ones beside
    a quantized target), refusing one trained for another model. `kind` says where "default" looks."""
    folder = resolve_head(spec, target.name, kind)
    config, tensors = read_head(folder)
    c = target.model.config
    mine = (config.get("model_type"), config.get("hidden_size"), config.get("vocab_size"))
    theirs = (c.family, c.hidden_size, c.vocab_size)
    ours = config.get("eaglespec", {})
    same_family = mine[0] == theirs[0] or not ours or "export" in ours  # an engine's file names its layer's layout
    if not same_family or mine[1:] != theirs[1:]:
        raise HeadMismatchError(
            f"the head at {folder} fits a {mine[0]} model with hidden size {mine[1]} and vocabulary {mine[2]}, "
            f"but {target.name} is {theirs[0]} with {theirs[1]} and {theirs[2]}: use a head trained for this target"
        )
    dtype = target.model.weight_like.dtype
    kind = head_type_of(config)
    if kind == "eagle3":
        # without the target layers named, the engines read vLLM's default ones (SpecForge's heads rely on it)
        aux = tuple(config.get("eagle_aux_hidden_state_layer_ids") or default_aux_layers(c.num_layers))
        try:
            check_aux_layers(aux, c.num_layers)
        except InvalidArgumentError as err:
            raise HeadMismatchError(f"the EAGLE-3 head at {folder} does not fit {target.name}: {err}") from None
        draft_vocab = _draft_vocab_of_eagle3(tensors, folder, c.vocab_size)
        head: DraftHead = Eagle3Head(c, aux, len(draft_vocab), config.get("intermediate_size"))
        tensors = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
    elif kind == "medusa":
        if any(k.endswith(".1.weight") for k in tensors) or config.get("medusa_num_layers", 1) != 1:
            raise HeadMismatchError(f"the Medusa head at {folder} has its own LM heads or several blocks per head; "
                                    "eaglespec's Medusa heads are one block each on the target's LM head "
                                    "(train one with `eaglespec train --head-type medusa`)")
        head = MedusaHead(c, int(config["medusa_num_heads"]))
        draft_vocab = tensors.pop("draft_vocab", None)
        if "lm_head.weight" in tensors:  # vLLM's copy of the LM head the heads share
            draft_vocab = _medusa_draft_vocab(tensors.pop("lm_head.weight"), target, draft_vocab, folder)
        tensors = {f"heads.{k.replace('.0.linear.', '.linear.')}": v.to(dtype) for k, v in tensors.items()}
    else:
        head = EagleHead(c, config.get("num_hidden_layers", 1), ours.get("input_variant", "feature+shifted-token"),
                         config.get("intermediate_size"))
        draft_vocab = tensors.pop("draft_vocab", None)
    try:
        mapped = tensors if kind == "medusa" else from_hf_state_dict(tensors, dtype)
        missing, unexpected = head.load_state_dict(mapped, strict=False)
    except RuntimeError as err:  # a tensor of another shape
        missing, unexpected = [str(err).splitlines()[-1].strip()], []
    if kind != "medusa":
        unexpected = unknown_names(tensors) + list(unexpected)
    if missing or unexpected:
        raise HeadMismatchError(
            f"the head at {folder} does not have the expected weights (missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}): it is not {KINDS[kind]} head "
            "for this target"
        )
    head = head.to(target.model.weight_like.device, dtype).eval().requires_grad_(False)
    head.attach(target.model, draft_vocab)
    if target.weights:  # the target runs int8 or int4 matrices: the head int8 ones
        head.quantize_weights()
    else:
        head.pack_weights()
    return head
