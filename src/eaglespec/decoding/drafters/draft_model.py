"""`sps[:K]`: classic speculative sampling (Leviathan et al. 2023; Chen et al. 2023): a smaller
model with the target's tokenizer drafts a chain of k tokens, one forward of its own each.

When sampling, each draft token is drawn from the draft's warped distribution q (the same
temperature, top-k and top-p as the target), and the verifier accepts it with probability
min(1, p/q); greedy drafts take the draft's argmax. The draft keeps its own KV cache: after a
round it keeps the accepted draft tokens it has already run and runs the rest next round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from eaglespec.decoding.drafters.registry import Artefact, Method, count_option, register
from eaglespec.decoding.proposer import Proposer
from eaglespec.decoding.sampling import Draws, SamplingParams, warp
from eaglespec.decoding.sizing import ALONE, Budget
from eaglespec.decoding.tree import DraftTree, TreeShape, parse_tree
from eaglespec.errors import InvalidArgumentError
from eaglespec.models.decoder import Decoder


def check_draft_model(target, draft) -> None:
    """Refuse a draft model (a `Target`) whose tokens mean something else to the target."""
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise InvalidArgumentError(
            f"draft model {draft.name} has another tokenizer than {target.name}: classic speculative "
            "sampling needs a draft model with the same tokenizer (e.g. a smaller model of the family)")
    if draft.model.config.vocab_size != target.model.config.vocab_size:
        raise InvalidArgumentError(
            f"draft model {draft.name} has {draft.model.config.vocab_size} logits, {target.name} "
            f"{target.model.config.vocab_size}: they must match")


class DraftModelProposer(Proposer):
    def __init__(self, draft: Decoder, num_tokens: int, params: SamplingParams, draws: Draws, capacity: int):
        if capacity + num_tokens > draft.config.max_position_embeddings:
            raise InvalidArgumentError(
                f"the draft model's context ({draft.config.max_position_embeddings} tokens) is shorter than "
                f"this generation needs ({capacity + num_tokens}); lower max_new_tokens")
        self.model, self.num_tokens, self.params, self.draws = draft, num_tokens, params, draws
        self.shape: TreeShape = parse_tree(f"chain:{num_tokens}")
        self.cache = draft.new_cache(capacity + num_tokens)
        self.device = draft.embed.weight.device
        self.pending: list[int] = []  # accepted tokens the draft has not run yet
        self.base = 0  # cache length before the last round's draft tokens
        self.drafted = 0  # draft tokens the last round left in the cache

    @torch.inference_mode()
    def start(self, prompt_ids: list[int], features: Tensor | None) -> None:
        if len(prompt_ids) > 1:
            self.model(torch.tensor([prompt_ids[:-1]], device=self.device), self.cache, last_logits_only=True)
        self.pending = [prompt_ids[-1]]

    def accept(self, tokens: list[int], features: Tensor) -> None:
        """tokens: the accepted draft tokens, then the bonus token."""
        if self.drafted:
            keep = min(len(tokens) - 1, self.drafted)  # accepted draft tokens already in the cache
            self.cache.length = self.base + keep
            self.pending, self.drafted = tokens[keep:], 0
        else:
            self.pending.extend(tokens)

    @torch.inference_mode()
    def draft(self, max_depth: int, budget: Budget = ALONE) -> DraftTree:
        k = min(self.num_tokens, max_depth)
        if k < 1:
            return DraftTree()
        tokens: list[int] = []
        probs: dict[int, Tensor] | None = None if self.params.greedy else {}
        inputs = self.pending
        for i in range(k):
            logits = self.model(torch.tensor([inputs], device=self.device), self.cache, last_logits_only=True)[0]
            logits = logits[0, -1]
            if probs is None:
                token = int(logits.argmax())
            else:
                probs[i - 1] = q = warp(logits, self.params)  # node i - 1's child was drawn from q
                token = self.draws.sample(q)
            tokens.append(token)
            inputs = [token]
        self.drafted = k - 1  # the last draft token was never run
        self.base = self.cache.length - self.drafted
        self.pending = []
        return DraftTree.chain(tokens, probs)

    def describe(self) -> str:
        return f"sps:{self.num_tokens}"


@register
@dataclass(frozen=True)
class DraftModel(Method):
    draft: object  # a Target with the target's tokenizer
    num_tokens: int = 4
    name: ClassVar[str] = "sps"
    syntax: ClassVar[str] = "sps[:K]"
    summary: ClassVar[str] = "classic speculative sampling: a smaller draft model drafts a chain of K (4) tokens"
    needs: ClassVar[Artefact] = Artefact.DRAFT_MODEL

    def __post_init__(self):
        if self.num_tokens < 1:
            raise InvalidArgumentError(f"speculative sampling needs at least 1 draft token, got {self.num_tokens}")

    @staticmethod
    def options(arg: str) -> dict:
        return {"num_tokens": count_option("sps", arg)} if arg else {}

    def bind(self, target, params: SamplingParams):
        check_draft_model(target, self.draft)
        return lambda draws, capacity: DraftModelProposer(self.draft.model, self.num_tokens, params, draws, capacity)
