"""LoRA adapters (`eaglespec distill`'s drafts): a folder with `adapter_config.json` (its base model,
rank, alpha and the adapted linears by their Hugging Face names) and `adapter.safetensors` (each
linear's `lora_a` [r, in] and `lora_b` [out, r]). Loading one loads its base with W + (alpha / r) B A
in place of each adapted W."""

from __future__ import annotations

import json
from pathlib import Path

from torch import Tensor

CONFIG, WEIGHTS = "adapter_config.json", "adapter.safetensors"


def adapter_base(spec: str) -> str | None:
    """The base model of the adapter folder `spec`; None where `spec` is no adapter."""
    path = Path(spec).expanduser()
    return json.loads((path / CONFIG).read_text())["base"] if (path / CONFIG).is_file() else None


def merge_adapter(state: dict[str, Tensor], folder: str | Path) -> dict[str, Tensor]:
    """A base model's weights (by their Hugging Face names) with the adapter in `folder` merged."""
    from safetensors.torch import load_file

    folder = Path(folder).expanduser()
    config = json.loads((folder / CONFIG).read_text())
    scale = config["alpha"] / config["rank"]
    adapter = load_file(str(folder / WEIGHTS))
    for name in config["modules"]:
        weight = state[f"{name}.weight"]
        update = scale * adapter[f"{name}.lora_b"].float() @ adapter[f"{name}.lora_a"].float()
        state[f"{name}.weight"] = (weight.float() + update).to(weight.dtype)
    return state
