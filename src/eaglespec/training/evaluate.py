"""Held-out acceptance of a head: n-alpha, the draft's top-1 agreement with the target's greedy
next token when its input holds n features it predicted itself (n = 0 is true features).

Chains start at every position j: step 0 reads the true (f[j], t[j+1]); step k reads the
feature it predicted at step k-1 and the true token t[j+k+1]. Each step attends to the true
features up to j and to its own chain, exactly as chain drafting does at inference.
"""

from __future__ import annotations

import json

import torch

from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.checkpoint import load_head, resolve_head
from eaglespec.heads.head import DraftHead
from eaglespec.models.conversations import ReadReport
from eaglespec.models.load import load_target
from eaglespec.training.data import render
from eaglespec.training.features import ExtractConfig, select, target_outputs


def head_tokens(head: DraftHead, tokens: torch.Tensor) -> torch.Tensor:
    """The token the head reads beside f[j]: t[j+1] (shifted variants) or t[j]. Length T - 1."""
    return tokens[:-1] if head.input_variant == "feature+unshifted-token" else tokens[1:]


def head_inputs(head: DraftHead, sample: dict[str, torch.Tensor]) -> torch.Tensor:
    """What the target gave at positions 0..T-2 that the head reads [T - 1, F] (see `DraftHead.reads`)."""
    if head.reads:
        if "aux_features" not in sample or sample["aux_features"].shape[-1] != 3 * head.config.hidden_size:
            raise InvalidArgumentError(
                "this EAGLE-3 head needs features extracted with its aux layers: "
                "run `eaglespec extract --aux-layers ...` with the layers in its config"
            )
        return sample["aux_features"][:-1]
    return sample["features"][:-1]


def chain_predictions(head: DraftHead, sample: dict[str, torch.Tensor], depth: int = 4,
                      dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Per step k = 0..depth: the hidden states [L - k, H] predicted by the chains j = 0..L-1-k
    (L = T - 1), from one conversation's stored features (`DraftHead.unroll`)."""
    dtype = dtype or head.weight_like.dtype
    device = head.weight_like.device
    tokens = head_tokens(head, sample["tokens"].long()).to(device)
    L = len(tokens)
    cache = head.new_cache(sum(max(L - k, 0) for k in range(depth + 1)), dtype=dtype)
    return head.unroll(head_inputs(head, sample).to(device, dtype), tokens, depth, cache)


def chain_hits(head: DraftHead, sample: dict[str, torch.Tensor], depth: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per n = 0..depth: (whether the draft's top-1 equals the target's greedy token, whether the
    position is scored), both [L - n] over the positions k + 1 .. of the conversation."""
    valid = sample["loss_mask"].bool()
    argmax = sample["target_argmax"].long()
    hits = []
    for k, predicted in enumerate(chain_predictions(head, sample, depth)):
        n = len(predicted)
        draft = head.to_target(head.logits(predicted).argmax(-1)).cpu()
        hits.append((draft == argmax[k + 1:k + 1 + n], valid[k + 1:k + 1 + n]))
    return hits


def chain_agreement(head: DraftHead, sample: dict[str, torch.Tensor], depth: int = 4) -> tuple[list[int], list[int]]:
    """Per n = 0..depth: (top-1 agreements, positions scored) on one conversation's features."""
    hits = chain_hits(head, sample, depth)
    return [int((hit & scored).sum()) for hit, scored in hits], [int(scored.sum()) for _, scored in hits]


def evaluate(head: DraftHead, samples, depth: int = 4) -> dict:
    """alpha: [0-alpha, ..., depth-alpha] over all samples, and the number of tokens scored."""
    correct, counts = [0] * (depth + 1), [0] * (depth + 1)
    for sample in samples:
        c, n = chain_agreement(head, sample, depth)
        correct = [a + b for a, b in zip(correct, c)]
        counts = [a + b for a, b in zip(counts, n)]
    return {"alpha": [c / n if n else 0.0 for c, n in zip(correct, counts)], "tokens_scored": counts[0]}


def held_out_alpha(model: str, head_spec: str, limit: int, depth: int = 4, dtype: str = "bfloat16",
                   data: str | None = None, answer_tokens: int | None = None) -> dict:
    """n-alpha of a head on the held-out conversations of the data split it was trained with, or
    on those of `data` (another source split the same way, e.g. the target's own answers to the
    held-out prompts from `eaglespec regenerate --split heldout`), over the first `answer_tokens`
    of each answer if given.

    Features come from a target forward of each conversation (nothing is written to disk).
    """
    target = load_target(model, dtype)
    head = load_head(head_spec, target)
    source, conversations, samples = held_out_samples(target, head, head_spec, limit, data, answer_tokens)
    return {"model": model, "head": head_spec, "data": source, **evaluate(head, samples, depth),
            "conversations": len(conversations), **({"answer_tokens": answer_tokens} if answer_tokens else {})}


def held_out_samples(target, head: DraftHead, head_spec: str, limit: int, data: str | None = None,
                     answer_tokens: int | None = None):
    """(source, conversations, samples): the held-out conversations of the split `head_spec` was
    trained with (or of `data`, split the same way) and a generator of their samples (token ids,
    loss mask and the target's outputs, from a forward of each)."""
    trained = json.loads((resolve_head(head_spec, target.name) / "config.json").read_text())
    split = trained.get("eaglespec", {}).get("split", {})
    config = ExtractConfig(target.name, data or split.get("source", "sharegpt"), "heldout", limit,
                           split.get("max_len", 2048), split.get("heldout_fraction", 0.02), split.get("seed", 0),
                           answer_tokens=answer_tokens)
    conversations = select(config, ReadReport())

    def samples():
        for conversation in conversations:
            ids, mask = render(target.tokenizer, conversation, config.max_len, config.answer_tokens)
            yield {"tokens": torch.tensor(ids), "loss_mask": torch.tensor(mask), **target_outputs(target, ids, head.reads)}

    return config.source, conversations, samples()
