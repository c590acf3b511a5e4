"""Draft trees: what a proposer hands the verifier, and the tree shapes `--tree` names.

A tree hangs under the round's root (the last accepted token). Node i holds a target token id
and the index of its parent (-1 for the root); parents come before children, and the children
of a node are listed in the order they were drawn. The target verifies the root and every node
in one forward: node i sits at position root + depth(i) and attends to the cache, the root and
its own ancestors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import Tensor

from eaglespec.errors import InvalidArgumentError

# EAGLE-1's static tree (paper Fig. 9, the official `mc_sim_7b_63`): paths of child ranks from the root.
EAGLE1_PATHS = (
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)


@dataclass
class ExtraRows:
    """Rows a proposer runs in the verification forward beside its tree (Lookahead's window), not
    verified: their tokens, their positions as offsets from the root's, and for each row the
    earlier extra rows it attends to besides the cache, the root and itself. The loop hands their
    logits to the proposer (`observe`); none of their KV entries stays in the cache."""

    tokens: list[int]
    offsets: list[int]
    attends: list[list[int]]


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)  # target ids of the draft nodes
    parents: list[int] = field(default_factory=list)  # -1 for the root, else an earlier node
    # node (-1: the root) -> the distribution its children were drawn from, without replacement
    # and in their listed order; None when the children were chosen deterministically (top-k),
    # which the verifier treats as point-mass proposals.
    draft_probs: dict[int, Tensor] | None = None
    vocab: Tensor | None = None  # target ids of the entries of draft_probs (None: the target's own)
    sources: list[str] | None = None  # each node's source, where a tree has several (hybrid)
    extra: ExtraRows | None = None  # rows run beside the tree, after its nodes

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: list[int], draft_probs: dict[int, Tensor] | None = None) -> DraftTree:
        """A chain: each token the child of the one before (draft_probs keyed as in the class)."""
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), draft_probs)

    def depths(self) -> list[int]:
        depth: list[int] = []
        for parent in self.parents:
            depth.append(1 if parent < 0 else depth[parent] + 1)
        return depth

    def children(self) -> list[list[int]]:
        """children()[n + 1] lists the children of node n (index 0: the root's)."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, parent in enumerate(self.parents):
            kids[parent + 1].append(i)
        return kids

    def paths(self) -> list[tuple[int, ...]]:
        """Each node's tokens from the root's first child down to it."""
        out: list[tuple[int, ...]] = []
        for token, parent in zip(self.tokens, self.parents):
            out.append((out[parent] if parent >= 0 else ()) + (token,))
        return out

    def verify_inputs(self, root: int, start: int, device: torch.device | str) -> tuple[Tensor, Tensor | None, Tensor]:
        """Tokens [1, 1 + N (+ E)], tree mask [1 + N (+ E), start + 1 + N (+ E)] (None for a lone
        root) and positions for one target forward over the root, the tree and its extra rows,
        `start` tokens in the cache."""
        n = len(self)
        extra = self.extra or ExtraRows([], [], [])
        e = len(extra.tokens)
        tokens = torch.tensor([[root, *self.tokens, *extra.tokens]], device=device)
        positions = torch.tensor([[0, *self.depths(), *extra.offsets]], device=device) + start
        if n + e == 0:
            return tokens, None, positions
        mask = torch.zeros(n + e + 1, start + n + e + 1, dtype=torch.bool)
        mask[:, : start + 1] = True  # the cache and the root
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                mask[i + 1] = mask[parent + 1]
            mask[i + 1, start + i + 1] = True
        for r, attended in enumerate(extra.attends):
            mask[n + 1 + r, [start + n + 1 + a for a in (*attended, r)]] = True
        return tokens, mask.to(device), positions

    def prune(self, max_nodes: int, max_depth: int) -> DraftTree:
        """The nodes no deeper than `max_depth`, then the first `max_nodes` of them (a tree again:
        parents come first); the extra rows only if they all fit too. Used where the context or
        `max_new_tokens` leaves less room."""
        depths = self.depths()
        keep = [i for i in range(len(self)) if depths[i] <= max_depth][: max(max_nodes, 0)]
        extra = self.extra
        if extra and (len(keep) + len(extra.tokens) > max_nodes or max(extra.offsets, default=0) > max_depth):
            extra = None
        if len(keep) == len(self) and extra is self.extra:
            return self
        tree = self.subset(keep)
        tree.extra = extra
        return tree

    def subset(self, keep: list[int]) -> DraftTree:
        """The tree of the nodes `keep` (ascending, each with its parent), without extra rows."""
        new = {old: j for j, old in enumerate(keep)} | {-1: -1}
        probs = None if self.draft_probs is None else {
            new[n]: q for n, q in self.draft_probs.items() if n in new}
        sources = None if self.sources is None else [self.sources[i] for i in keep]
        return DraftTree([self.tokens[i] for i in keep], [new[self.parents[i]] for i in keep], probs, self.vocab,
                         sources)


@dataclass(frozen=True)
class TreeShape:
    """A parsed `--tree` value. `paths` is set for static trees (eagle1, chain), else the dynamic
    tree's parameters are used. `auto` is the dynamic tree whose depth and size are chosen each
    round from measured costs (`depth` and `tokens` are then upper bounds)."""

    name: str
    paths: tuple[tuple[int, ...], ...] | None = None
    topk: int = 4
    depth: int = 5
    tokens: int = 16

    @property
    def chain(self) -> bool:
        return self.paths is not None and all(set(p) == {0} for p in self.paths)

    @property
    def max_nodes(self) -> int:
        return len(self.paths) if self.paths is not None else self.tokens

    @property
    def auto(self) -> bool:
        return self.name == "auto"

    def describe(self) -> str:
        if self.paths is not None:
            return self.name
        return f"{self.name}:topk={self.topk},depth={self.depth},tokens={self.tokens}"


TREE_HELP = "eagle1 | chain:K | dynamic[:topk=T,depth=D,tokens=N] | auto"


def parse_tree(spec: str) -> TreeShape:
    spec = spec.strip()
    if spec == "eagle1":
        return TreeShape("eagle1", EAGLE1_PATHS)
    if m := re.fullmatch(r"chain:(\d+)", spec):
        k = int(m.group(1))
        if not 1 <= k <= 64:
            raise InvalidArgumentError(f"tree '{spec}': a chain needs 1 to 64 tokens")
        return TreeShape(spec, tuple((0,) * d for d in range(1, k + 1)))
    name, _, args = spec.partition(":")
    if name in ("dynamic", "auto"):
        values = {}
        for item in filter(None, args.split(",")):
            key, eq, value = item.partition("=")
            if key not in ("topk", "depth", "tokens") or not eq or not value.isdigit():
                raise InvalidArgumentError(f"tree '{spec}': expected {TREE_HELP}")
            values[key] = int(value)
        bounds = {"depth": 6, "tokens": 32} if name == "auto" else {}
        shape = TreeShape(name, None, **(bounds | values))
        if not (1 <= shape.topk <= 64 and 1 <= shape.depth <= 32 and 1 <= shape.tokens <= 64):
            raise InvalidArgumentError(f"tree '{spec}': topk 1-64, depth 1-32 and tokens 1-64")
        return shape
    raise InvalidArgumentError(f"unknown tree '{spec}': expected {TREE_HELP}")
