"""Verification: which path of a draft tree the target accepts, and the bonus token after it.

Greedy: follow the children whose token equals the target's argmax; the bonus is the argmax
where the path stops. Sampling (the paper's Algorithm 1, multi-round): at each node the
children are tried in their listed order, child x accepted with probability min(1, p(x)/q(x));
after a rejection p <- norm(max(0, p - q)) and, for children drawn without replacement, x leaves
q (q <- norm(q without x)). When no child is accepted the bonus is drawn from what is left of p.
Deterministic children (top-k) are point-mass proposals: q = one-hot(x). Either way every
round's tokens follow the target's warped distribution exactly (tests/test_verify.py
enumerates it).

Every random choice goes through `sampling.Draws`, so a test can enumerate all of them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from eaglespec.decoding.sampling import Draws, SamplingParams, warp
from eaglespec.decoding.tree import DraftTree


class Residual:
    """The multi-round rule at one node: p the target's distribution, `draft` the distribution its
    children were drawn from without replacement (None: deterministic children)."""

    def __init__(self, p: Tensor, draft: Tensor | None):
        self.p = p
        self.q = None if draft is None else draft.clone()

    def acceptance(self, x: int) -> float:
        """Probability that child x is accepted: min(1, p(x) / q(x))."""
        px = float(self.p[x])
        qx = 1.0 if self.q is None else float(self.q[x])
        return min(1.0, px / qx)

    def reject(self, x: int) -> None:
        if self.q is None:
            rest = self.p.clone()
            rest[x] = 0.0
        else:
            rest = (self.p - self.q).clamp_min_(0.0)
            self.q[x] = 0.0
            self.q /= self.q.sum().clamp_min(1e-30)
        total = rest.sum()
        if total > 0:  # else p <= q everywhere: no rejection was possible, up to rounding
            self.p = rest / total


def accept_greedy(tree: DraftTree, logits: Tensor) -> tuple[list[int], int]:
    """(accepted node indices, bonus token) from target logits [1 + N, V] (root first)."""
    best = logits.max(-1).indices.tolist()  # argmax's first maximal index; torch's bf16 argmax is slow on CPUs
    kids = tree.children()
    path: list[int] = []
    row = 0
    while True:
        token = best[row]
        child = next((c for c in kids[row] if tree.tokens[c] == token), None)
        if child is None:
            return path, token
        path.append(child)
        row = child + 1


def accept_sampled(tree: DraftTree, logits: Tensor, params: SamplingParams, draws: Draws) -> tuple[list[int], int]:
    """As `accept_greedy`, for sampling: the multi-round rule, node by node down the tree."""
    kids = tree.children()
    path: list[int] = []
    row = 0
    while True:
        node = Residual(warp(logits[row], params), _draft_probs(tree, row - 1, logits.shape[-1]))
        child = None
        for c in kids[row]:
            x = tree.tokens[c]
            if draws.accept(node.acceptance(x)):
                child = c
                break
            node.reject(x)
        if child is None:
            return path, draws.sample(node.p)
        path.append(child)
        row = child + 1


def _draft_probs(tree: DraftTree, node: int, vocab_size: int) -> Tensor | None:
    """The draft distribution at `node` over the target vocabulary (None: deterministic)."""
    if tree.draft_probs is None or node not in tree.draft_probs:
        return None
    q = tree.draft_probs[node].float()
    if tree.vocab is None:
        return q
    return torch.zeros(vocab_size, dtype=q.dtype, device=q.device).index_copy_(0, tree.vocab, q)


def verify(tree: DraftTree, logits: Tensor, params: SamplingParams, draws: Draws) -> tuple[list[int], int]:
    if params.greedy:
        return accept_greedy(tree, logits)
    return accept_sampled(tree, logits, params, draws)
