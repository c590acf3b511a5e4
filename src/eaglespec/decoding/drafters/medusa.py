"""`medusa[:N]`: Medusa-1's tree of top-k candidates from K heads on the target's feature.

Before a round, the target's final feature f at the position before the root is known (the root
is the token the target chose there). Medusa head k drafts the token k places after the root from
f alone, so a path's tokens are drawn independently, one per head: each head offers its TOPK
most likely tokens, and a path's estimate is the product of its tokens' head probabilities times
a calibration (accepted over predicted draft tokens, kept as the proposer runs, as `hybrid` keeps
its copying sources'). Paths are enumerated best first (a node's estimate never exceeds its
parent's, and a node comes after its parent), so every prefix of the order is a tree. `medusa`
verifies the n best that maximize expected tokens per second on the machine's measured
verification costs (`best_prefix`, as `auto` sizes EAGLE's trees; none where nothing pays: then
the next PROBE - 1 rounds decode plainly without running the heads, and the one after verifies at
least the best node, to measure again), `medusa:N` the N best.

Every node is chosen, not sampled: the verifier treats them as point-mass proposals, so greedy
output is vanilla's and sampled output follows the target's distribution exactly.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import ClassVar
from weakref import WeakKeyDictionary

import torch
from torch import Tensor

from eaglespec.decoding.drafters.registry import Artefact, Method, check_head_kind, count_option, register
from eaglespec.decoding.proposer import Proposer
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.decoding.sizing import ALONE, Budget, Calibration, RoundCosts, best_prefix
from eaglespec.decoding.tree import DraftTree, TreeShape
from eaglespec.errors import InvalidArgumentError
from eaglespec.models.costs import ForwardCosts
from eaglespec.timing import Clock

TOPK = 8  # candidate tokens per head
MAX_NODES = 32  # nodes of an auto-sized tree
PROBE = 8  # after a round where no node paid, rounds until the next one that runs the heads


class MedusaProposer(Proposer):
    def __init__(self, head, nodes: int | None, calibration: Calibration, costs: ForwardCosts | None):
        """`head`: a `MedusaHead`; `nodes`: verify this many nodes (None: size each round on the
        target's forward `costs`, which are then required)."""
        self.head, self.nodes, self.calibration, self.costs = head, nodes, calibration, costs
        self.shape = TreeShape("medusa", None, TOPK, len(head.heads), nodes or MAX_NODES)
        self.clock = Clock(head.weight_like.device)
        self.feature: Tensor | None = None  # the target's feature before the root
        self.estimates: list[float] = []  # the last tree's raw estimates
        self.sizes: list[int] = []
        self.plain = 0  # rounds since the last one whose sizing verified a node (auto)

    def start(self, prompt_ids: list[int], features: Tensor | None) -> None:
        self.feature = None if features is None else features[0, -1]

    def candidates(self, max_depth: int) -> tuple[list[tuple[int, ...]], list[float], Tensor]:
        """Paths of head ranks, best first, their probabilities, and each head's top tokens
        [heads, TOPK] (target ids)."""
        head = self.head
        hidden = head(self.feature.to(head.weight_like.dtype))[:max_depth]
        probs = torch.softmax(head.logits(hidden).float(), -1)
        top = probs.topk(min(TOPK, probs.shape[-1]), -1)
        values = top.values.tolist()
        paths, scores = [], []
        # (-score, path, its parent's score): pops the best path left, pushes its next sibling and first child
        heap = [(-values[0][0], (0,), 1.0)]
        while heap and len(paths) < self.shape.tokens:
            negative, path, parent = heapq.heappop(heap)
            paths.append(path)
            scores.append(-negative)
            depth, rank = len(path) - 1, path[-1]
            if rank + 1 < len(values[depth]):
                heapq.heappush(heap, (-parent * values[depth][rank + 1], path[:-1] + (rank + 1,), parent))
            if depth + 1 < len(values):
                heapq.heappush(heap, (negative * values[depth + 1][0], path + (0,), -negative))
        return paths, scores, head.to_target(top.indices)

    def draft(self, max_depth: int, budget: Budget = ALONE) -> DraftTree:
        self.estimates = []
        if self.feature is None or max_depth < 1:
            return DraftTree()
        if self.nodes is None and self.plain % PROBE:  # nothing paid lately: a plain round, heads not run
            self.plain += 1
            self.sizes.append(0)
            return DraftTree()
        started = self.clock.now()
        paths, scores, tokens = self.candidates(max_depth)
        scale = self.calibration.factor(("medusa",))
        if self.nodes is None:
            n, _ = best_prefix([min(1.0, scale * s) for s in scores], RoundCosts(self.costs, budget),
                               self.clock.now() - started, plain=True)
            self.plain = 0 if n else self.plain + 1
            n = n or int(self.plain > 1)  # a probe after PROBE plain rounds: the best node
        else:
            n = min(self.nodes, len(paths))
        paths, self.estimates = paths[:n], scores[:n]
        self.sizes.append(n)
        index = {p: i for i, p in enumerate(paths)}
        return DraftTree([int(tokens[len(p) - 1, p[-1]]) for p in paths],
                         [index[p[:-1]] if len(p) > 1 else -1 for p in paths])

    def accept(self, tokens: list[int], features: Tensor) -> None:
        if self.estimates:
            self.calibration.update(("medusa",), len(tokens) - 1, sum(self.estimates))
        self.feature = features[0, -1]

    def describe(self) -> str:
        drafting = [n for n in self.sizes if n]
        mean = sum(drafting) / len(drafting) if drafting else 0.0
        size = f"{self.nodes} nodes" if self.nodes else "auto-sized"
        return (f"medusa:{len(self.head.heads)} heads, top-{TOPK}, {size} (mean {mean:.1f} tokens per drafting "
                f"round, {len(drafting)} of {len(self.sizes)} rounds drafting)")


@register
@dataclass(frozen=True)
class Medusa(Method):
    head: object  # MedusaHead
    nodes: int | None = None  # None: sized on this machine's forward costs each round
    name: ClassVar[str] = "medusa"
    syntax: ClassVar[str] = "medusa[:N]"
    summary: ClassVar[str] = ("Medusa-1's tree of top-k candidates from a Medusa head, as many nodes as pay on this "
                              "machine, or with N always the N best")
    needs: ClassVar[Artefact] = Artefact.MEDUSA_HEAD
    # per target model, then per sampling setting: the heads' calibration, carried across generations
    calibrations: WeakKeyDictionary = field(default_factory=WeakKeyDictionary, init=False, compare=False, repr=False)

    def __post_init__(self):
        check_head_kind("medusa", self.head, "medusa")
        if self.nodes is not None and not 1 <= self.nodes <= 64:
            raise InvalidArgumentError(f"method 'medusa:{self.nodes}': expected medusa:N with 1 to 64 nodes")

    @staticmethod
    def options(arg: str) -> dict:
        return {"nodes": count_option("medusa", arg)} if arg else {}

    def bind(self, target, params: SamplingParams):
        costs = target.model.forward_costs() if self.nodes is None else None  # measured once per model
        key = (params.temperature, params.top_p, params.top_k)
        calibration = self.calibrations.setdefault(target.model, {}).setdefault(key, Calibration())
        return lambda draws, capacity: MedusaProposer(self.head, self.nodes, calibration, costs)
