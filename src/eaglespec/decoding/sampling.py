"""Sampling parameters, the warpers that turn logits into the distribution we sample from, and
the random draws of decoding.

The same warpers later apply to the target's p and to a draft's q, so speculative sampling
targets exactly the distribution that plain sampling draws from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from eaglespec.errors import InvalidArgumentError


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1 disable those filters."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise InvalidArgumentError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidArgumentError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidArgumentError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        g = torch.Generator(device)
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


def warp(logits: Tensor, params: SamplingParams) -> Tensor:
    """Probabilities after temperature, then top-k, then top-p (transformers' order). [..., V] float32."""
    logits = logits.float() / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        sorted_drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p  # mass before >= top_p
        drop = torch.empty_like(sorted_drop).scatter_(-1, order, sorted_drop)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class Draws:
    """The random choices of decoding, from one seeded generator."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def accept(self, probability: float) -> bool:
        return torch.rand((), generator=self.generator, device=self.generator.device).item() < probability

    def sample(self, probs: Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def distinct(self, probs: Tensor, k: int) -> list[list[int]]:
        """For each row of probs [R, V], up to k indices drawn in order without replacement (fewer
        where the row has fewer tokens with mass). The largest q / Exp(1) keys come in the order
        of sequential draws, each from q renormalized without the ones before it."""
        keys = probs / torch.empty_like(probs).exponential_(generator=self.generator)
        top = keys.topk(min(k, probs.shape[-1]), dim=-1).indices.tolist()
        support = (probs > 0).sum(-1).tolist()
        return [row[:n] for row, n in zip(top, support)]
