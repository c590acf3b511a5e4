"""Verification: which path of each row's draft tree the target accepts, and the bonus token after
it, for all the rows of a round at once (tensor operations across rows and nodes).

Greedy: follow the children whose token equals the target's argmax (the first such child where
siblings repeat a token); the bonus is the argmax where the path stops. Sampling (the paper's
Algorithm 1, multi-round): at each node the children are tried in their listed order, child x
accepted with probability min(1, p(x)/q(x)); after a rejection p <- norm(max(0, p - q)) and, for
children drawn without replacement, x leaves q (q <- norm(q without x)). When no child is accepted
the bonus is drawn from what is left of p. Deterministic children (top-k) are point-mass
proposals: q = one-hot(x). Either way every round's tokens follow the target's warped distribution
exactly (tests/test_verify.py enumerates it).

Every random choice goes through the row's own `sampling.Draws`, in the order a row verified alone
would make it, so a test can enumerate them and a row's output does not depend on its batch.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from eaglespec.decoding.sampling import Draws, SamplingParams, warp
from eaglespec.decoding.tree import DraftTree

Verdict = tuple[list[int], int]  # (accepted node indices, bonus token)


def verify(trees: list[DraftTree], logits: Tensor, starts: list[int], params: list[SamplingParams],
           draws: list[Draws]) -> list[Verdict]:
    """One verdict per row. `logits` [T, V] holds the target's logits of every row's forward: row
    r's root at `starts[r]`, its nodes right after it (node i at starts[r] + 1 + i)."""
    verdicts: list[Verdict | None] = [None] * len(trees)
    groups: dict[SamplingParams | None, list[int]] = {}
    for r, p in enumerate(params):  # rows sampled with the same warpers are verified together
        groups.setdefault(None if p.greedy else dataclasses.replace(p, seed=None), []).append(r)
    for key, rows in groups.items():
        args = [trees[r] for r in rows], logits, [starts[r] for r in rows]
        found = _greedy(*args) if key is None else _sampled(*args, key, [draws[r] for r in rows])
        for r, verdict in zip(rows, found):
            verdicts[r] = verdict
    return verdicts


def _greedy(trees: list[DraftTree], logits: Tensor, starts: list[int]) -> list[Verdict]:
    at: list[int] = []  # logits rows of the roots and nodes, row after row
    parent_at: list[int] = []  # each node's parent's place in `at`
    roots: list[int] = []  # each root's place in `at`
    tokens: list[int] = []
    for tree, start in zip(trees, starts):
        roots.append(len(at))
        parent_at += [len(at) + 1 + p for p in tree.parents]  # the root (-1) is at len(at)
        at += range(start, start + 1 + len(tree))
        tokens += tree.tokens
    if len(at) < logits.shape[0]:  # rows not verified (extra rows, sampled rows) sit between them
        logits = logits[torch.tensor(at, device=logits.device)]
    best = logits.max(-1).indices.cpu()  # torch's bf16 argmax is slow on CPUs
    accepted: list[bool] = []
    if tokens:
        n = len(tokens)
        parent = torch.tensor(parent_at)
        match = torch.tensor(tokens) == best[parent]
        order = torch.arange(n)
        # only the first child that matches: the walk never reaches a later one
        first = torch.full((len(at),), n).scatter_reduce_(0, parent, torch.where(match, order, n), "amin")
        match &= first[parent] == order
        node_at = torch.tensor([base + 1 + i for base, tree in zip(roots, trees) for i in range(len(tree))])
        ok = torch.ones(len(at), dtype=torch.bool)
        for _ in range(max(max(tree.depths(), default=0) for tree in trees)):  # a node counts if its ancestors do
            ok[node_at] = match & ok[parent]
        accepted = ok[node_at].tolist()
    best_list = best.tolist()
    verdicts, node = [], 0
    for base, tree in zip(roots, trees):
        path = [i for i in range(len(tree)) if accepted[node + i]]
        node += len(tree)
        verdicts.append((path, best_list[base + 1 + path[-1] if path else base]))
    return verdicts


def _sampled(trees: list[DraftTree], logits: Tensor, starts: list[int], params: SamplingParams,
             draws: list[Draws]) -> list[Verdict]:
    """The multi-round rule, one tree level at a time for all rows still accepting; at each level
    the children of rank k of every row are tried together."""
    kids = [tree.children() for tree in trees]
    node = [-1] * len(trees)  # each row's current node (-1: its root)
    paths: list[list[int]] = [[] for _ in trees]
    bonus = [0] * len(trees)
    active = list(range(len(trees)))
    vocab_size = logits.shape[-1]
    while active:
        p = warp(logits[torch.tensor([starts[r] + 1 + node[r] for r in active], device=logits.device)], params).cpu()
        drafts = [_draft_probs(trees[r], node[r], vocab_size) for r in active]
        q = torch.stack([torch.zeros(vocab_size) if d is None else d.cpu() for d in drafts])
        drawn = torch.tensor([d is not None for d in drafts])
        options = [kids[r][node[r] + 1] for r in active]
        chosen: list[int | None] = [None] * len(active)
        trying = list(range(len(active)))
        for k in range(max(map(len, options))):
            trying = [a for a in trying if k < len(options[a])]
            if not trying:
                break
            idx = torch.tensor(trying)
            x = torch.tensor([trees[active[a]].tokens[options[a][k]] for a in trying])
            px, qx = p[idx, x], torch.where(drawn[idx], q[idx, x], 1.0)
            rejected = []
            for a, chance in zip(trying, (px / qx).clamp(max=1.0).tolist()):
                if draws[active[a]].accept(chance):
                    chosen[a] = options[a][k]
                else:
                    rejected.append(a)
            if rejected:
                keep = torch.tensor([chosen[a] is None for a in trying])
                idx, x = idx[keep], x[keep]
                p[idx], q[idx] = residual(p[idx], q[idx], drawn[idx], x)
            trying = rejected
        still = []
        for a, r in enumerate(active):
            if chosen[a] is None:
                bonus[r] = draws[r].sample(p[a])
            else:
                paths[r].append(chosen[a])
                node[r] = chosen[a]
                still.append(r)
        active = still
    return list(zip(paths, bonus))


def residual(p: Tensor, q: Tensor, drawn: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """After child x [R] was rejected at R nodes: the target's residual norm(max(0, p - q)) with
    q = one-hot(x) for deterministic children (drawn False), and q without x for drawn ones."""
    rows = torch.arange(len(x))
    point = torch.zeros_like(q)
    point[rows, x] = p[rows, x]
    rest = (p - torch.where(drawn[:, None], q, point)).clamp_min_(0.0)
    q = q.clone()
    q[rows, x] = 0.0
    q /= q.sum(-1, keepdim=True).clamp_min(1e-30)
    total = rest.sum(-1, keepdim=True)
    # total 0: p <= q everywhere, no rejection was possible up to rounding; p stays
    return torch.where(total > 0, rest / total.clamp_min(1e-30), p), q


def _draft_probs(tree: DraftTree, node: int, vocab_size: int) -> Tensor | None:
    """The draft distribution at `node` over the target vocabulary (None: deterministic)."""
    if tree.draft_probs is None or node not in tree.draft_probs:
        return None
    q = tree.draft_probs[node].float()
    if tree.vocab is None:
        return q
    return torch.zeros(vocab_size, dtype=q.dtype, device=q.device).index_copy_(0, tree.vocab, q)
