"""Classic speculative sampling (`sps`, Leviathan et al. 2023; Chen et al. 2023): a smaller
model with the target's tokenizer drafts a chain of k tokens, one forward of its own each.

When sampling, each draft token is drawn from the draft's warped distribution q (the same
temperature, top-k and top-p as the target), and the verifier accepts it with probability
min(1, p/q); greedy drafts take the draft's argmax. The draft keeps its own KV cache: after a
round it keeps the accepted draft tokens it has already run and runs the rest next round.
"""

from __future__ import annotations

import torch
from torch import Tensor

from eaglespec.decoding.sampling import Draws, SamplingParams, warp
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


class DraftModelProposer:
    reads: tuple[int, ...] = ()  # the target's final features (which it ignores)
    def __init__(self, draft: Decoder, num_tokens: int, params: SamplingParams, draws: Draws, capacity: int):
        if capacity + num_tokens > draft.config.max_position_embeddings:
            raise InvalidArgumentError(
                f"the draft model's context ({draft.config.max_position_embeddings} tokens) is shorter than "
                f"this generation needs ({capacity + num_tokens}); lower max_new_tokens")
        self.draft, self.num_tokens, self.params, self.draws = draft, num_tokens, params, draws
        self.shape: TreeShape = parse_tree(f"chain:{num_tokens}")
        self.cache = draft.new_cache(capacity + num_tokens)
        self.device = draft.embed.weight.device
        self.pending: list[int] = []  # accepted tokens the draft has not run yet
        self.base = 0  # cache length before the last round's draft tokens
        self.drafted = 0  # draft tokens the last round left in the cache

    @torch.inference_mode()
    def start(self, prompt_ids: list[int], features: Tensor | None) -> None:
        if len(prompt_ids) > 1:
            self.draft(torch.tensor([prompt_ids[:-1]], device=self.device), self.cache, last_logits_only=True)
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
    def propose(self, max_depth: int) -> DraftTree:
        k = min(self.num_tokens, max_depth)
        if k < 1:
            return DraftTree()
        tokens: list[int] = []
        probs: dict[int, Tensor] | None = None if self.params.greedy else {}
        inputs = self.pending
        for i in range(k):
            logits = self.draft(torch.tensor([inputs], device=self.device), self.cache, last_logits_only=True)[0]
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
