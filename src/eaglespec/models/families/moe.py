"""What the mixture-of-experts families share: their `MoE` settings (which layers carry experts,
how many run per token, how their weights are combined). The experts' tensors load under one set
of names for every family (`models/load.py`), from the per-expert layouts on disk or transformers
5's stacked one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MoE:
    """A mixture-of-experts MLP: each token runs the `top_k` of `experts` SiLU-gated MLPs that its
    router's softmax ranks first, summed with those probabilities (renormalized over the top k where
    `normalize`), plus a shared expert scaled by a sigmoid gate where the family has one (Qwen2-MoE)."""

    experts: int
    top_k: int
    intermediate_size: int  # each expert's
    normalize: bool
    shared_intermediate_size: int = 0  # 0: no shared expert
    sparse: tuple[bool, ...] = ()  # per layer: the experts (True) or a dense MLP of the config's intermediate size


def qwen_moe(hf: Any, shared: bool) -> MoE:
    """Qwen2-MoE's and Qwen3-MoE's reading: experts every `decoder_sparse_step` layers but those in
    `mlp_only_layers`; top-k weights renormalized only with `norm_topk_prob`."""
    dense = set(getattr(hf, "mlp_only_layers", None) or ())
    step = getattr(hf, "decoder_sparse_step", 1) or 1
    return MoE(experts=hf.num_experts, top_k=hf.num_experts_per_tok, intermediate_size=hf.moe_intermediate_size,
               normalize=bool(hf.norm_topk_prob),
               shared_intermediate_size=hf.shared_expert_intermediate_size if shared else 0,
               sparse=tuple(i not in dense and hf.num_experts > 0 and (i + 1) % step == 0
                            for i in range(hf.num_hidden_layers)))
