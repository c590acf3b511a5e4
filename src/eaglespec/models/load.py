"""Resolve `--model` (bundled name, Hugging Face folder or .gguf file) and load the target."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from eaglespec.errors import CorruptWeightsError, InvalidArgumentError, UnknownModelError
from eaglespec.models.adapter import adapter_base, merge_adapter
from eaglespec.models.config import ModelConfig
from eaglespec.models.decoder import Decoder
from eaglespec.models.families import family_of
from eaglespec.models.fetch import convert_gguf, fetch, sha256_of
from eaglespec.models.quantize import quantize
from eaglespec.models.registry import BUNDLED, cache_root

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class Target:
    """A loaded target model with its tokenizer."""

    name: str
    folder: Path
    model: Decoder
    tokenizer: object  # a transformers tokenizer
    eos_token_ids: frozenset[int]
    weights: dict | None = None  # what `quantize` did (None: dense weights)


def torch_device(spec: str | torch.device) -> torch.device:
    """`--device`, checked: a one-line error for a name torch does not know or a GPU this machine lacks."""
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise InvalidArgumentError(f"unknown device '{spec}': use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgumentError(f"--device {spec}: no CUDA device here (or torch is a CPU build); use --device cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise InvalidArgumentError(f"--device {spec}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def resolve(spec: str) -> Path:
    """Turn a model name or path into a Hugging Face folder, fetching or converting if needed."""
    if spec in BUNDLED:
        return fetch(BUNDLED[spec])
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file() and path.suffix == ".gguf":
        out = cache_root() / "gguf" / f"{path.stem}-{sha256_of(path)[:16]}"
        if not (out / "config.json").is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            convert_gguf(path, out)
        return out
    raise UnknownModelError(
        f"unknown model '{spec}': use one of {', '.join(BUNDLED)} (see `eaglespec models`), "
        "a Hugging Face folder with config.json and safetensors, or a .gguf file"
    )


# Hugging Face parameter names (with or without the "model." prefix, as in EAGLE checkpoints) -> ours
_L = r"(?:model\.)?layers\.(\d+)\."
_RENAMES = [
    (r"(?:model\.)?embed_tokens\.", "embed."),
    (r"(?:model\.)?norm\.", "norm."),
    (_L + r"input_layernorm\.", r"layers.\1.input_norm."),
    (_L + r"post_attention_layernorm\.", r"layers.\1.post_attn_norm."),
    (r"layers\.(\d+)\.hidden_norm\.", r"layers.\1.hidden_norm."),  # EAGLE-3's layer
    (_L + r"self_attn\.o_proj\.", r"layers.\1.attn.o."),
    (_L + r"self_attn\.(q|k)_norm\.", r"layers.\1.attn.\2_norm."),
    (_L + r"mlp\.down_proj\.", r"layers.\1.mlp.down."),
    (_L + r"mlp\.gate\.", r"layers.\1.mlp.router."),  # a mixture of experts' router
    (_L + r"mlp\.experts\.(\d+)\.down_proj\.", r"layers.\1.mlp.experts.\2.down."),
    (_L + r"mlp\.shared_expert\.down_proj\.", r"layers.\1.mlp.shared.down."),
    (_L + r"mlp\.shared_expert_gate\.", r"layers.\1.mlp.shared_gate."),
    (r"lm_head\.", "lm_head."),
    (r"fc\.", "fc."),
]
_FUSED = [  # our fused parameter <- the Hugging Face parameters (`part`) concatenated in `order`
    (_L + r"self_attn\.(?P<part>q|k|v)_proj\.(weight|bias)", r"layers.\1.attn.qkv.\3", ("q", "k", "v")),
    (_L + r"mlp\.(?P<part>gate|up)_proj\.weight", r"layers.\1.mlp.gate_up.weight", ("gate", "up")),
    (_L + r"mlp\.experts\.(\d+)\.(?P<part>gate|up)_proj\.weight", r"layers.\1.mlp.experts.\2.gate_up.weight",
     ("gate", "up")),
    (_L + r"mlp\.shared_expert\.(?P<part>gate|up)_proj\.weight", r"layers.\1.mlp.shared.gate_up.weight", ("gate", "up")),
]


def unstack_experts(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5's stacked experts (`mlp.experts.gate_up_proj` [E, 2I, H], `down_proj` [E, H, I])
    as the per-expert tensors of the checkpoints on disk (gate and up are the halves of gate_up)."""
    out = {}
    for name, tensor in hf.items():
        if m := re.fullmatch(r"(.*\.experts)\.(gate_up|down)_proj", name):
            for e, piece in enumerate(tensor):
                if m[2] == "down":
                    out[f"{m[1]}.{e}.down_proj.weight"] = piece
                else:
                    out[f"{m[1]}.{e}.gate_proj.weight"], out[f"{m[1]}.{e}.up_proj.weight"] = piece.chunk(2)
        else:
            out[name] = tensor
    return out


def from_hf_state_dict(hf: dict[str, torch.Tensor], dtype: torch.dtype,
                       renames: tuple[tuple[str, str], ...] = ()) -> dict[str, torch.Tensor]:
    """Map Hugging Face parameter names onto ours, fusing q/k/v and gate/up; a family's own `renames`
    are tried first. Unknown names are dropped."""
    ours: dict[str, torch.Tensor] = {}
    pieces: dict[str, tuple[tuple[str, ...], dict[str, torch.Tensor]]] = {}
    for name, tensor in unstack_experts(hf).items():
        for pattern, repl in renames:  # a family's names first: its fused layouts are already ours
            if re.match(pattern, name):
                ours[re.sub(pattern, repl, name)] = tensor.to(dtype)
                break
        else:
            for pattern, target, order in _FUSED:
                if m := re.fullmatch(pattern, name):
                    pieces.setdefault(m.expand(target), (order, {}))[1][m["part"]] = tensor
                    break
            else:
                for pattern, repl in _RENAMES:
                    if re.match(pattern, name):
                        ours[re.sub(pattern, repl, name)] = tensor.to(dtype)
                        break
    for target, (order, parts) in pieces.items():
        if set(parts) == set(order):  # else the fused parameter stays missing, for the caller to report
            ours[target] = torch.cat([parts[k] for k in order]).to(dtype)
    return ours


def unknown_names(hf: dict[str, torch.Tensor]) -> list[str]:
    """The names `from_hf_state_dict` would drop (to refuse them where nothing may be skipped)."""
    return sorted(n for n in hf if not any(re.fullmatch(p, n) for p, _, _ in _FUSED)
                  and not any(re.match(p, n) for p, _ in _RENAMES))


def to_hf_state_dict(ours: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """The inverse of `from_hf_state_dict` for layers and fc, without the "model." prefix (EAGLE's keys)."""
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    hf = {}
    for name, tensor in ours.items():
        if m := re.fullmatch(r"layers\.(\d+)\.attn\.qkv\.(weight|bias)", name):
            for part, piece in zip("qkv", tensor.split((q_size, kv_size, kv_size))):
                hf[f"layers.{m[1]}.self_attn.{part}_proj.{m[2]}"] = piece
        elif m := re.fullmatch(r"layers\.(\d+)\.mlp\.gate_up\.weight", name):
            gate, up = tensor.chunk(2)
            hf[f"layers.{m[1]}.mlp.gate_proj.weight"], hf[f"layers.{m[1]}.mlp.up_proj.weight"] = gate, up
        else:
            for ours_name, hf_name in ((".attn.o.", ".self_attn.o_proj."), (".mlp.down.", ".mlp.down_proj."),
                                       (".input_norm.", ".input_layernorm."),
                                       (".post_attn_norm.", ".post_attention_layernorm.")):
                name = name.replace(ours_name, hf_name)
            hf[name] = tensor
    return {k: v.contiguous() for k, v in hf.items()}


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CorruptWeightsError(f"{folder} has no .safetensors file; convert the weights to safetensors")
    tensors = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    tensors[key] = f.get_tensor(key)
        except (SafetensorError, OSError) as err:
            raise CorruptWeightsError(
                f"{file} is truncated or corrupt ({err}); delete it and fetch or convert it again"
            ) from None
    return tensors


def build_decoder(config: ModelConfig, hf_tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> Decoder:
    with torch.device("meta"):
        model = Decoder(config)
    family = family_of(config.family)
    ours = from_hf_state_dict(family.prepare(hf_tensors), dtype, family.renames)
    missing, unexpected = model.load_state_dict(ours, strict=False, assign=True)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise CorruptWeightsError(
            f"the weights do not fit the config (missing {missing[:3]}, unexpected {unexpected[:3]}); "
            "fetch or convert the model again"
        )
    model.tie_weights()
    return model.eval().requires_grad_(False)


def load_target(spec: str, dtype: str | torch.dtype = "bfloat16", device: str | torch.device = "cpu",
                weights: str = "dense") -> Target:
    """Load a target model by bundled name, Hugging Face folder, .gguf path or LoRA adapter folder
    (`models/adapter.py`); `weights` int8 or int4 keeps its linears quantized (see `quantize.py`)."""
    from transformers import AutoConfig, AutoTokenizer

    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    device = torch_device(device)
    base = adapter_base(spec)  # a LoRA adapter folder (`eaglespec distill`): its base, the adapter merged
    folder = resolve(base or spec)
    hf_config = AutoConfig.from_pretrained(str(folder))
    dense = weights == "dense"
    state = merge_adapter(read_safetensors(folder), spec) if base else read_safetensors(folder)
    model = build_decoder(ModelConfig.from_hf(hf_config), state, torch_dtype if dense else torch.float32).to(device)
    report = None if dense else quantize(model, weights, torch_dtype)
    model.pack_weights()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    eos = hf_config.eos_token_id if isinstance(hf_config.eos_token_id, list) else [hf_config.eos_token_id]
    eos_ids = frozenset(i for i in [*eos, tokenizer.eos_token_id] if i is not None)
    return Target(name=spec, folder=folder, model=model, tokenizer=tokenizer, eos_token_ids=eos_ids, weights=report)
