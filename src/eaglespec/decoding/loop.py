"""The decoding loop. Each round runs one target forward over the round's root token (the last
accepted token, not yet in the cache) and accepts tokens from its logits.

Vanilla decoding is the loop with no proposer: the round verifies the root alone and accepts
one token. Speculative methods attach a draft tree under the root, verify it in the same
forward (tree mask and positions), keep the accepted path in the cache (`KVCache.keep`) and
accept several tokens per round. The prompt minus its last token is prefilled once; the last
prompt token is the first round's root, so every new token comes from a round and
tau = new tokens / target forwards is exactly 1 for vanilla decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from eaglespec.decoding.sampling import Draws, SamplingParams
from eaglespec.decoding.tree import DraftTree, TreeShape
from eaglespec.decoding.verify import verify
from eaglespec.errors import InvalidArgumentError, PromptTooLongError
from eaglespec.models.decoder import Decoder
from eaglespec.timing import Clock


@dataclass
class DecodeStats:
    new_tokens: int = 0
    target_forwards: int = 0  # verification forwards; the prefill is not counted
    finish_reason: str = ""  # "eos", "length", "context" or "stop"
    accepted_lengths: list[int] = field(default_factory=list)  # histogram: rounds that accepted i draft tokens
    tried: list[int] = field(default_factory=list)  # per depth d - 1: draft tokens at depth d the verifier tested
    accepted: list[int] = field(default_factory=list)  # ... and accepted
    sources: dict[str, int] = field(default_factory=dict)  # accepted draft tokens by source (trees that say)
    prefill_s: float = 0.0  # the prompt through the target (and the proposer's start)
    draft_s: float = 0.0  # proposer time per round
    verify_s: float = 0.0  # target forwards over the trees and acceptance

    @property
    def tau(self) -> float:
        """Average tokens accepted per target forward (bonus token included)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    def acceptance_by_depth(self) -> list[float]:
        """Share of tested draft tokens accepted, per depth. With a chain these are the paper's
        n-alpha: the token at depth n + 1 was drafted from n predicted features."""
        return [a / t for a, t in zip(self.accepted, self.tried) if t]

    def count_round(self, tree: DraftTree, path: list[int]) -> None:
        kids = tree.children()
        depth = len(path) + (1 if kids[path[-1] + 1 if path else 0] else 0)
        for d in range(depth):
            if d == len(self.tried):
                self.tried.append(0)
                self.accepted.append(0)
            self.tried[d] += 1
            self.accepted[d] += d < len(path)
        while len(self.accepted_lengths) <= len(path):
            self.accepted_lengths.append(0)
        self.accepted_lengths[len(path)] += 1


def check_max_new_tokens(max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise InvalidArgumentError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def check_prompt(model: Decoder, prompt_ids: list[int]) -> None:
    context = model.config.max_position_embeddings
    if not prompt_ids:
        raise InvalidArgumentError("the prompt is empty; give at least one token of text")
    if len(prompt_ids) >= context:
        raise PromptTooLongError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context holds {context}; "
            "shorten the prompt"
        )


class Proposer(Protocol):
    """Drafts a tree under each round's root. Gets the prompt and its features once (None for a
    one-token prompt), then after each round the accepted tokens and the target's features at
    the positions before them: its final features, or with `reads` the hidden states entering
    those target layers, concatenated (an EAGLE-3 head). A proposer whose trees carry extra rows
    (`DraftTree.extra`) also has `observe(logits)`, which gets their logits [E, V] after the
    forward, before `accept`."""

    shape: TreeShape
    reads: tuple[int, ...]

    def start(self, prompt_ids: list[int], features: Tensor | None) -> None: ...

    def propose(self, max_depth: int) -> DraftTree: ...

    def accept(self, tokens: list[int], features: Tensor) -> None: ...

    def describe(self) -> str:
        """The draft's shape, for reports (`GenerationOutput.tree`)."""
        ...


@torch.inference_mode()
def decode(model: Decoder, prompt_ids: list[int], params: SamplingParams, max_new_tokens: int,
           eos_token_ids: frozenset[int] = frozenset(), stats: DecodeStats | None = None,
           proposer: Callable[[Draws, int], Proposer] | None = None) -> Iterator[list[int]]:
    """Yield the tokens each round accepts, until EOS (included), `max_new_tokens` or the context limit.

    `proposer(draws, capacity)` makes the round's drafter (None: vanilla decoding). `stats` is
    filled in as the loop runs; closing the iterator early (stop strings) is allowed.
    """
    check_max_new_tokens(max_new_tokens)
    check_prompt(model, prompt_ids)
    stats = stats if stats is not None else DecodeStats()
    device = model.embed.weight.device
    draws = Draws(params.generator(device))
    context = model.config.max_position_embeddings
    capacity = min(len(prompt_ids) + max_new_tokens, context)
    drafter = proposer(draws, capacity) if proposer else None
    cache = model.new_cache(capacity + (drafter.shape.max_nodes if drafter else 0))
    clock = Clock(device)
    prompt = torch.tensor([prompt_ids], device=device)
    reads = drafter.reads if drafter else ()
    features = None  # a one-token prompt has nothing to prefill
    if len(prompt_ids) > 1:
        _logits, features = model(prompt[:, :-1], cache, last_logits_only=True, capture=reads)
    if drafter:
        drafter.start(prompt_ids, features)
    stats.prefill_s += clock.lap()
    root = prompt_ids[-1]
    tree = DraftTree()
    while True:
        if cache.length + 1 > capacity:
            stats.finish_reason = "context"
            return
        if drafter:
            # deeper nodes could not be accepted (max_new_tokens) or have no position (context)
            depth = min(max_new_tokens - stats.new_tokens, context - cache.length) - 1
            tree = drafter.propose(depth).prune(cache.capacity - cache.length - 1, depth)
            stats.draft_s += clock.lap()
        tokens, mask, positions = tree.verify_inputs(root, cache.length, device)
        logits, features = model(tokens, cache, positions, mask, capture=reads)
        if tree.extra is not None:
            drafter.observe(logits[0, 1 + len(tree):])
        path, bonus = verify(tree, logits[0, :1 + len(tree)], params, draws)
        stats.target_forwards += 1
        stats.count_round(tree, path)
        kept = [0, *(i + 1 for i in path)]
        cache.keep(kept)
        accepted = [*(tree.tokens[i] for i in path), bonus][: max_new_tokens - stats.new_tokens]
        for i, token in enumerate(accepted):
            if token in eos_token_ids:
                accepted = accepted[: i + 1]
                stats.finish_reason = "eos"
                break
        stats.new_tokens += len(accepted)
        for i in path[:len(accepted)] if tree.sources else ():
            stats.sources[tree.sources[i]] = stats.sources.get(tree.sources[i], 0) + 1
        if not stats.finish_reason and stats.new_tokens == max_new_tokens:
            stats.finish_reason = "length"
        if drafter and not stats.finish_reason:
            drafter.accept(accepted, features[:, kept])
        stats.verify_s += clock.lap()
        yield accepted
        clock.lap()  # the consumer's time is not ours
        if stats.finish_reason:
            return
        root = accepted[-1]

