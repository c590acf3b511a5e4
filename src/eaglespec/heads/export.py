"""`eaglespec export`: a head in the layout a serving engine loads, checked before it is written.

Formats (what each engine's loader reads; see the README's serving section for the commands):
- `official`: SafeAILab's EAGLE-1/2 release, as its `eagle-llm` runtime loads it (strictly):
  pytorch_model.bin with fc.{weight,bias}, layers.N.* (layer 0 without its input norm) and a copy
  of the target's embed_tokens; a Llama-style config.json with "bias": true. Its draft layer has no
  attention biases, so heads that have them (Qwen2's) cannot go there.
- `vllm`: vLLM's `EagleLlamaForCausalLM` (EAGLE-1) has no fc bias. Layer 0 has no input norm, so
  fc's bias b reaches the layer twice: in q/k/v (as W b) and in the residual stream. Both fold into
  attention biases that vLLM's Llama layer carries (config `attention_bias` for o, `qkv_bias` for
  q/k/v): q/k/v's bias += W b, o's bias = b. The function is the same; the folded biases are
  stored in fp32 so that importing the export gives back the head's own tensors.
  EAGLE-3: `LlamaForCausalLMEagle3` (midlayer.*, d2t, t2d; `eagle_config` with the target layers).
  vLLM's EAGLE-1 drafts over the target's whole vocabulary: a reduced draft vocabulary is dropped.
- `sglang`: SGLang's `LlamaForCausalLMEagle` / `Qwen2ForCausalLMEagle` (EAGLE-1, fc with its bias;
  no "bias" key, which SGLang's Llama layer reads as attention biases) with the draft vocabulary
  as `token_map.pt` for `--speculative-token-map`; EAGLE-3 as for vLLM.
- `speculators`: the speculators config form that vLLM also reads (EAGLE-3 only: speculators has
  no EAGLE-1 form).
- `llama.cpp`: the GGUF that llama.cpp's `--spec-type draft-eagle3` loads (it drafts with EAGLE-3
  heads only, for targets whose graph gives their layers' inputs: `EAGLE3_TARGETS`), made by llama.cpp's own converter from
  the vLLM layout (`bash scripts/setup_llamacpp.sh --source` fetches it; without --source it also
  builds the programs that serve it); `load_head` reads it back (`gguf_head.py`).
  Medusa: `MedusaModel`, a residual block per head (`blocks.K.layers.0.*`, `medusa_fc_bias`) and one
  LM head for all (`original_lm_head`): the target's. vLLM's Medusa drafts a chain of each head's
  top token. Its loader (0.32) refuses a file with its `token_map` (it does not count the tensor as
  loaded), so a reduced draft vocabulary is kept by zeroing the LM head's other rows: their logit
  is 0, below the head's top token's wherever that one is positive (a head trained on the draft
  vocabulary alone says nothing about the rest).
A head's layer is Llama's for every target family (`ModelConfig.for_head`), with the
target's RoPE: a scaled one (Llama-3.x's `llama3`) goes into the config as `rope_parameters` and
`rope_scaling`, as SpecForge's and the engines' Llama-3 heads carry it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from eaglespec.errors import InvalidArgumentError, MissingDependencyError
from eaglespec.files import write_folder
from eaglespec.heads import gguf_head
from eaglespec.heads.checkpoint import TOKEN_MAP, head_layout, load_head
from eaglespec.models.llamacpp import check_eagle3_head, convert_eagle3, programs, source, source_gguf
from eaglespec.models.load import Target

FORMATS = {
    "official": "the official EAGLE-1/2 release (SafeAILab's eagle-llm runtime)",
    "vllm": "vLLM (`--speculative-config` method eagle, eagle3 or medusa)",
    "sglang": "SGLang (`--speculative-algorithm EAGLE` or `EAGLE3`)",
    "speculators": "the speculators config form, read by vLLM (EAGLE-3 heads)",
    "llama.cpp": "llama.cpp (`--spec-type draft-eagle3`; EAGLE-3 heads of Llama, Mistral, Mixtral, Qwen3 and Qwen3-MoE targets)",
}
TYPES = {"official": ("eagle1",), "vllm": ("eagle1", "eagle3", "medusa"), "sglang": ("eagle1", "eagle3"),
         "speculators": ("eagle3",), "llama.cpp": ("eagle3",)}
LLAMA_CPP_FILE = gguf_head.FILE


def check_out(out: Path, force: bool) -> None:
    """Refuse an output folder that exists and holds files, unless told to replace it."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise InvalidArgumentError(f"{out} exists and is not empty: choose another --out, or pass --force to replace it")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise InvalidArgumentError(f"unknown export format '{fmt}': use one of {', '.join(FORMATS)}")


def _llama_config(config: dict) -> dict:
    """A Llama-style config.json for an engine's draft layer, from our head's."""
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "num_hidden_layers", "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size",
            "hidden_act", "tie_word_embeddings", "torch_dtype")
    out = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **{k: config[k] for k in keep}}
    scaling = config.get("rope_scaling")
    if (scaling or {}).get("rope_type") == "freq_factors":
        raise InvalidArgumentError("the head's target was read from a GGUF file, which keeps Llama-3's RoPE as "
                                   "llama.cpp's per-frequency factors, and engines read the llama3 parameters: "
                                   "export with the target's Hugging Face folder as --model")
    out["rope_parameters"] = {"rope_type": "default", **(scaling or {}), "rope_theta": config["rope_theta"]}
    if scaling:  # the key older engines read
        out["rope_scaling"] = scaling
    return out


def _fold_fc_bias(tensors: dict[str, torch.Tensor], num_layers: int) -> None:
    """fc's bias into layer 0's attention biases (see the module's doc), zeros where a layer has none."""
    b = tensors.pop("fc.bias").float()
    for i in range(num_layers):
        attn = f"layers.{i}.self_attn."
        for p in "qkv":
            weight, key = tensors[f"{attn}{p}_proj.weight"], f"{attn}{p}_proj.bias"
            bias = tensors[key].float() if key in tensors else torch.zeros(len(weight))
            tensors[key] = bias + (weight.float() @ b if i == 0 else 0)
        tensors[attn + "o_proj.bias"] = b.clone() if i == 0 else torch.zeros_like(b)


def _has_qkv_bias(tensors: dict[str, torch.Tensor]) -> bool:
    return any(k.endswith("q_proj.bias") for k in tensors)


def _eagle3_engine(config: dict, tensors: dict[str, torch.Tensor], ours: dict) -> dict:
    """EAGLE-3 for vLLM and SGLang: our layout, Llama's config, the target layers under eagle_config."""
    out = _llama_config(config) | {"architectures": ["LlamaForCausalLMEagle3"],
                                   "draft_vocab_size": config["draft_vocab_size"],
                                   "target_hidden_size": config["hidden_size"],
                                   "eagle_aux_hidden_state_layer_ids": config["eagle_aux_hidden_state_layer_ids"],
                                   "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids":
                                                    config["eagle_aux_hidden_state_layer_ids"]}}
    if _has_qkv_bias(tensors):  # vLLM's and SGLang's Llama layers bias q/k/v and o together
        out["attention_bias"] = True
        tensors["midlayer.self_attn.o_proj.bias"] = torch.zeros(config["hidden_size"], dtype=torch.bfloat16)
    return out | {"eaglespec": ours}


def _speculators_config(config: dict, target: Target) -> dict:
    """The speculators form of an EAGLE-3 engine config: the layer's config nested, the algorithm's
    settings and the verifier (target) beside it."""
    layer = {k: v for k, v in config.items() if k not in ("architectures", "eaglespec", "eagle_config")}
    verifier = json.loads((Path(target.folder) / "config.json").read_text()).get("architectures", [])
    return {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": layer, "draft_vocab_size": config["draft_vocab_size"],
            "target_hidden_size": config["hidden_size"], "norm_before_residual": False,
            "eagle_aux_hidden_state_layer_ids": config["eagle_aux_hidden_state_layer_ids"],
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                   "verifier": {"name_or_path": str(target.folder), "architectures": verifier}},
            "eaglespec": config["eaglespec"]}


def expected_shapes(fmt: str, kind: str, config: dict) -> dict[str, tuple[int, ...]]:
    """The tensors (name -> shape) that the format's loader reads for a head with this config: the
    list every export is checked against before anything is written."""
    if kind == "medusa":  # vLLM's
        h = config["hidden_size"]
        shapes = {f"blocks.{k}.layers.0.{p}": (h, h) if p == "weight" else (h,)
                  for k in range(config["medusa_num_heads"]) for p in ("weight", "bias")}
        return shapes | {"lm_head.weight": (config["vocab_size"], h)}
    h, inter = config["hidden_size"], config["intermediate_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    biased = config.get("attention_bias", False) or config.get("qkv_bias", False) or config.get("model_type") == "qwen2"
    prefixes = ["midlayer."] if kind == "eagle3" else [f"layers.{i}." for i in range(config["num_hidden_layers"])]
    shapes: dict[str, tuple[int, ...]] = {}
    for prefix in prefixes:
        first = prefix in ("layers.0.", "midlayer.")
        width = 2 * h if kind == "eagle3" else h
        shapes |= {prefix + "self_attn.q_proj.weight": (q, width), prefix + "self_attn.k_proj.weight": (kv, width),
                   prefix + "self_attn.v_proj.weight": (kv, width), prefix + "self_attn.o_proj.weight": (h, q),
                   prefix + "mlp.gate_proj.weight": (inter, h), prefix + "mlp.up_proj.weight": (inter, h),
                   prefix + "mlp.down_proj.weight": (h, inter), prefix + "post_attention_layernorm.weight": (h,)}
        if biased:
            shapes |= {prefix + "self_attn.q_proj.bias": (q,), prefix + "self_attn.k_proj.bias": (kv,),
                       prefix + "self_attn.v_proj.bias": (kv,)}
        if config.get("attention_bias"):
            shapes[prefix + "self_attn.o_proj.bias"] = (h,)
        if kind == "eagle3":
            shapes |= {prefix + "input_layernorm.weight": (h,), prefix + "hidden_norm.weight": (h,)}
        elif not first:
            shapes[prefix + "input_layernorm.weight"] = (h,)
    if kind == "eagle3":
        n = config["draft_vocab_size"]
        shapes |= {"fc.weight": (h, 3 * h), "norm.weight": (h,), "lm_head.weight": (n, h), "d2t": (n,),
                   "t2d": (config["vocab_size"],)}
    else:
        shapes["fc.weight"] = (h, 2 * h)
        if fmt != "vllm":
            shapes["fc.bias"] = (h,)
        if fmt == "official":
            shapes["embed_tokens.weight"] = (config["vocab_size"], h)
    return shapes


def _validate(fmt: str, kind: str, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    want = expected_shapes(fmt, kind, config)
    missing = sorted(set(want) - set(tensors))
    extra = sorted(set(tensors) - set(want))
    misshaped = sorted(k for k in set(want) & set(tensors) if tuple(tensors[k].shape) != want[k])
    if missing or extra or misshaped:
        raise InvalidArgumentError(f"the {fmt} export of this head would not load: missing {missing[:4]}, "
                                   f"extra {extra[:4]}, misshaped {misshaped[:4]} (a bug: please report it)")


def _medusa_vllm(head, target: Target) -> tuple[dict, dict[str, torch.Tensor]]:
    """vLLM's Medusa layout of a Medusa head (config, tensors), validated. Its config has no other
    key with "num" in its name: vLLM's MedusaConfig takes any such key naming heads as the count."""
    config, ours = head_layout(head, target.name)
    heads = len(head.heads)
    tensors = {f"blocks.{k}.layers.0.{p}": ours[f"{k}.0.linear.{p}"] for k in range(heads) for p in ("weight", "bias")}
    lm = target.model.lm_head.weight.detach().to("cpu", tensors["blocks.0.layers.0.weight"].dtype)
    if head.draft_vocab is not None:  # (vLLM's loader refuses its own token_map)
        kept = torch.zeros(len(lm), 1, dtype=lm.dtype)
        kept[head.draft_vocab.cpu()] = 1
        lm = lm * kept
    tensors["lm_head.weight"] = lm.contiguous()
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": config["hidden_size"],
              "vocab_size": config["vocab_size"], "medusa_num_heads": heads, "medusa_num_layers": 1,
              "medusa_fc_bias": True, "original_lm_head": True, "truncated_vocab_size": config["vocab_size"],
              "torch_dtype": config["torch_dtype"], "eaglespec": config["eaglespec"] | {"export": "vllm"}}
    _validate("vllm", "medusa", config, tensors)
    return config, tensors


def engine_files(head, target: Target, fmt: str) -> tuple[dict, dict[str, torch.Tensor], torch.Tensor | None]:
    """(config.json, tensors, token map or None) of a loaded head in a format, validated."""
    check_format(fmt)
    kind = head.head_type
    if kind not in TYPES[fmt]:
        fits = [f for f, kinds in TYPES.items() if kind in kinds]
        raise InvalidArgumentError(f"the {fmt} format cannot carry {kind} heads: use --format {' or '.join(fits)}")
    if kind == "medusa":
        return (*_medusa_vllm(head, target), None)
    if head.input_variant != "feature+shifted-token":
        raise InvalidArgumentError(f"the engines' heads read the feature and the next token; this head reads "
                                   f"'{head.input_variant}' (an ablation's variant) and runs only in eaglespec")
    config, tensors = head_layout(head, target.name)
    ours = config.pop("eaglespec") | {"export": fmt}  # an export's model_type names its layer, not the target's family
    family = config["model_type"]
    draft_vocab = tensors.pop("draft_vocab", None)
    token_map = None
    if kind == "eagle3":
        config = _eagle3_engine(config, tensors, ours)
        _validate(fmt, kind, config, tensors)
        if fmt == "speculators":
            config = _speculators_config(config, target)
        return config, tensors, None
    if fmt == "official":
        if _has_qkv_bias(tensors):
            raise InvalidArgumentError(f"the official EAGLE runtime's draft layer is Llama's, without attention "
                                       f"biases; this {family} head has them: use --format sglang or vllm")
        config = _llama_config(config) | {"bias": True}
        tensors["embed_tokens.weight"] = target.model.embed.weight.detach().to("cpu", torch.bfloat16).contiguous()
    elif fmt == "vllm":
        _fold_fc_bias(tensors, config["num_hidden_layers"])
        config = _llama_config(config) | {"attention_bias": True, "qkv_bias": True}
    elif not _has_qkv_bias(tensors):  # sglang: a Llama layer
        config = _llama_config(config) | {"architectures": ["LlamaForCausalLMEagle"]}
        token_map = draft_vocab
    elif family == "qwen2":
        config = {k: v for k, v in config.items() if k != "bias"} | {"architectures": ["Qwen2ForCausalLMEagle"]}
        token_map = draft_vocab
    else:
        raise InvalidArgumentError(f"SGLang has EAGLE-1 drafts of Llama layers and Qwen2's biased ones, not a "
                                   f"biased {family} layer: use --format vllm")
    config["eaglespec"] = ours
    _validate(fmt, kind, config, tensors)
    return config, tensors, token_map


def export_head(head_spec: str, target: Target, fmt: str, out: Path, force: bool = False,
                gguf_dtype: str = "bfloat16") -> list[str]:
    """Write the head `head_spec` (a folder, "default" or "eagle3") for `target` in format `fmt` to `out`
    (atomically); returns what to tell the user: the folder and how to serve it. `gguf_dtype`:
    llama.cpp's GGUF in bfloat16 or float32 (`convert_eagle3`; the other formats keep the head's bf16)."""
    check_format(fmt)
    check_out(out, force)
    head = load_head(head_spec, target)
    if fmt == "llama.cpp":  # vLLM's EAGLE-3 layout, then llama.cpp's converter
        check_eagle3_head(head)
        source()  # the converter; the programs serve it
        config, tensors, _ = engine_files(head, target, "vllm")

        def fill(tmp: Path) -> None:
            layout = tmp / "vllm"
            layout.mkdir()
            (layout / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(layout / "model.safetensors"),
                      metadata={"format": "pt"})
            convert_eagle3(layout, Path(target.folder), tmp / LLAMA_CPP_FILE, gguf_dtype)
            shutil.rmtree(layout)

        write_folder(Path(out), fill)
        return [f"wrote {FORMATS[fmt]} head to {out / LLAMA_CPP_FILE}", serve_command(fmt, "eagle3", target, Path(out))]
    config, tensors, token_map = engine_files(head, target, fmt)

    def fill(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if fmt == "official":
            torch.save(tensors, tmp / "pytorch_model.bin")
        else:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
                      metadata={"format": "pt"})
        if token_map is not None:
            torch.save(token_map.cpu().to(torch.int64), tmp / TOKEN_MAP)

    write_folder(Path(out), fill)
    drafts = min(3, len(head.heads)) if head.head_type == "medusa" else 3  # (vLLM's Medusa drafts one token a head)
    return [f"wrote {FORMATS[fmt]} {head.head_type} head to {out}",
            serve_command(fmt, head.head_type, target, Path(out), token_map is not None, drafts)]


def serve_command(fmt: str, kind: str, target: Target, out: Path, token_map: bool = False, drafts: int = 3) -> str:
    """The command (or code) that serves `target` with the exported head."""
    model = target.folder
    if fmt == "llama.cpp":
        try:
            gguf = source_gguf(target.name)
        except InvalidArgumentError:
            gguf = "MODEL.gguf"
        try:
            server = programs() / "llama-server"
        except MissingDependencyError:
            server = "llama-server  (bash scripts/setup_llamacpp.sh builds it)"
        return f"serve: {server} -m {gguf} -md {out / LLAMA_CPP_FILE} --spec-type draft-eagle3"
    if fmt == "official":
        line = (f"serve: python -c \"from eagle.model.ea_model import EaModel; "
                f"m = EaModel.from_pretrained(base_model_path='{model}', ea_model_path='{out}')\"  (eagle-llm)")
        theta = target.model.config.rope_theta
        if theta != 10000:  # eagle-llm 1.2.1's LlamaRotaryEmbedding classes default to base 10000 and are built without it
            line += (f"\nnote: eagle-llm 1.2.1 builds RoPE with base 10000 in the target and the head; this target's "
                     f"rope_theta is {theta:g}, so set that base first (scripts/interop/eagle_llm_engine.py shows how)")
        return line
    if fmt in ("vllm", "speculators"):
        method = {"eagle1": "eagle"}.get(kind, kind)
        spec = json.dumps({"method": method, "model": str(out), "num_speculative_tokens": drafts})
        return f"serve: vllm serve {model} --speculative-config '{spec}'"
    algorithm = "EAGLE3" if kind == "eagle3" else "EAGLE"
    extra = f" --speculative-token-map {out / TOKEN_MAP}" if token_map else ""
    return (f"serve: python -m sglang.launch_server --model-path {model} --speculative-algorithm {algorithm} "
            f"--speculative-draft-model-path {out} --speculative-num-steps 3 --speculative-eagle-topk 4 "
            f"--speculative-num-draft-tokens 8{extra}")
