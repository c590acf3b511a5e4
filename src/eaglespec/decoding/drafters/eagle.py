"""`eagle[:TREE]`: the EAGLE head drafts a tree, one head forward per depth level.

The head's cache holds one entry per committed position j: (target feature f[j], token t[j+1]),
at position j. Each round first appends the entries that the last verification made known
(true target features), whose last output predicts the feature at the root and so the root's
children. Every deeper level runs the nodes that get children, each entry reading its parent's
predicted feature and its own token, under a tree mask, at position root + depth - 1. The draft
entries are dropped when the tree is done; only committed entries stay.

Drafting is a generator: each head forward is a `HeadCall` it yields, so that the `Scheduler` runs
the same step of every row's draft in one forward (head_rows.py); the row's entries sit in the
scheduler's cache of the head (`entries`).

Children are the top-k draft tokens when greedy and for the dynamic tree (EAGLE-2: expand the
best `topk` nodes by cumulative log-probability for `depth` levels, keep the best `tokens`), and
are drawn without replacement from the warped draft distribution when sampling a static tree.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import ClassVar
from weakref import WeakKeyDictionary

import torch
from torch import Tensor

from eaglespec.decoding.drafters.registry import Artefact, Method, check_head_kind, register
from eaglespec.decoding.head_rows import Drafting, HeadCall, HeadEntries, HeadResult
from eaglespec.decoding.proposer import Proposer
from eaglespec.decoding.sampling import Draws, SamplingParams, warp
from eaglespec.decoding.sizing import ALONE, AutoSize, Budget
from eaglespec.decoding.tree import TREE_HELP, DraftTree, TreeShape, parse_tree
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.head import DraftHead
from eaglespec.models.costs import ForwardCosts
from eaglespec.timing import Clock


class EagleProposer(Proposer):
    def __init__(self, head: DraftHead, shape: TreeShape, params: SamplingParams, draws: Draws,
                 costs: ForwardCosts | None = None, earlier: AutoSize | None = None):
        """`costs` (the target's `Decoder.forward_costs()`) size the `auto` tree, starting from
        what an `earlier` generation's sizing learned."""
        if head.input_variant != "feature+shifted-token":
            raise InvalidArgumentError(
                f"this head reads '{head.input_variant}' (an ablation variant); decoding needs a "
                "feature+shifted-token head"
            )
        self.head, self.shape, self.params, self.draws = head, shape, params, draws
        self.reads = head.reads
        self.entries = HeadEntries(head)  # in the scheduler's cache of the head
        self.device = head.weight_like.device
        # entries the head has not run yet, in order: (features [1, m, H], tokens [1, m]) per round
        self.pending: list[tuple[Tensor, Tensor]] = []
        self.waited = 0  # of the pending entries, those from rounds that did not draft
        self.prompt_waiting = 0  # of the pending entries, the prompt's (the head has not run it yet)
        if shape.paths is not None:
            self.static = _static_plan(shape.paths)
        self.auto = AutoSize(costs, earlier) if shape.auto else None
        self.batch_chooses = self.auto is not None
        self.clock = Clock(self.device)

    @property
    def sampled(self) -> bool:
        """Whether children are drawn from q (static trees when sampling), else chosen top-k."""
        return not self.params.greedy and self.shape.paths is not None

    def start(self, prompt_ids: list[int], features: Tensor | None) -> None:
        """features [1, P - 1, H] of the prefilled prompt[:-1] (None for a one-token prompt)."""
        if features is not None:
            self.pending = [(features, torch.tensor([prompt_ids[1:]], device=self.device))]
            self.prompt_waiting = features.shape[1]

    def accept(self, tokens: list[int], features: Tensor, drafted: int | None = None) -> None:
        """tokens: the round's accepted tokens (bonus last); features [1, len(tokens), H]: the
        target's features at the root and at the accepted draft nodes. `drafted`: how many of the
        accepted draft tokens this head proposed (in a `hybrid` tree others come from elsewhere);
        None: all of them."""
        if self.auto:
            self.auto.finish_round(len(tokens), len(tokens) - 1 if drafted is None else drafted)
        if self.pending:  # a round that did not draft: its entries wait with these
            self.waited += len(tokens)
        self.pending.append((features, torch.tensor([tokens], device=self.device)))

    def propose(self, max_depth: int, budget: Budget = ALONE) -> Drafting:
        """Draft a tree no deeper than `max_depth` (what the loop can still accept)."""
        if self.shape.paths is not None:
            root = yield from self._catch_up()
            if root is None or max_depth < 1:
                return DraftTree()
            tree = yield from self._static(*root, max_depth)
            self.entries.truncate(self.committed)  # drop the draft entries
            return tree
        pool, scores = yield from self.candidates(max_depth, budget)
        if not len(pool):  # a plain round
            return pool
        order = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
        size = self.auto.size(scores, order, self.shape.tokens, self.clock.now()) if self.auto else self.shape.tokens
        return pool.subset(sorted(order[:size]))

    def skip(self) -> None:
        """No draft this round: the entries wait, and `auto` counts a plain round."""
        self.caught_up = (0.0, 0.0, 0)
        self.auto.start_round(self.clock.now(), plain=True)

    def candidates(self, max_depth: int, budget: Budget = ALONE
                   ) -> Generator[HeadCall, HeadResult, tuple[DraftTree, list[float]]]:
        """The dynamic tree's candidate pool (parents first) and each node's cumulative draft
        log-probability, no deeper than `max_depth`; none where `auto` decodes this round plainly."""
        if self.auto:
            self.caught_up = (0.0, 0.0, 0)
            self.auto.start_round(self.clock.now(), budget)
            if not self.auto.drafting:  # plain decoding pays better here: the entries wait
                return DraftTree(), []
        root = yield from self._catch_up()
        if root is None or max_depth < 1:
            return DraftTree(), []
        pool, scores = yield from self._dynamic(*root, min(self.shape.depth, max_depth))
        self.entries.truncate(self.committed)  # drop the draft entries
        return pool, scores

    def _catch_up(self) -> Generator[HeadCall, HeadResult, tuple[Tensor, Tensor] | None]:
        """Run the head over the entries that wait; returns the feature it predicts at the root and
        its draft logits [1, V_draft] (None where no feature is known yet: a one-token prompt)."""
        if not self.pending:
            return None
        features, tokens = (torch.cat(part, 1)[0] for part in zip(*self.pending))  # joined once, not per round
        started = self.clock.now()
        length = self.entries.length
        positions = torch.arange(length, length + len(tokens), device=self.device)
        out, logits = yield HeadCall(self.entries, self.head.lift(features), tokens, positions, None, True)
        if self.auto:  # the head's pass over the entries of plain rounds and of the prompt
            per_entry = (self.clock.now() - started) / len(tokens)
            self.caught_up = (per_entry * self.waited, per_entry * self.prompt_waiting, self.waited)
            self.auto.catch_up(*self.caught_up)
        self.pending, self.waited, self.prompt_waiting = [], 0, 0
        self.committed = self.entries.length
        self.expanded: dict[int, int] = {}  # node -> index of its draft entry among the row's
        return out[-1], logits

    def _run(self, tree: DraftTree, nodes: list[int], parent_features: Tensor
             ) -> Generator[HeadCall, HeadResult, tuple[Tensor, Tensor]]:
        """Run the entries of `nodes` (each reading its parent's predicted feature and its own
        token); returns their predicted features [n, H] and draft logits [n, V_draft]."""
        depths = tree.depths()
        start = self.entries.length
        n = len(nodes)
        mask = torch.zeros(n, start + n, dtype=torch.bool)
        mask[:, : self.committed] = True
        for row, node in enumerate(nodes):
            ancestor = tree.parents[node]
            while ancestor >= 0:
                mask[row, self.expanded[ancestor]] = True
                ancestor = tree.parents[ancestor]
            mask[row, start + row] = True
            self.expanded[node] = start + row
        positions = torch.tensor([self.committed + depths[i] - 1 for i in nodes], device=self.device)
        tokens = torch.tensor([tree.tokens[i] for i in nodes], device=self.device)
        return (yield HeadCall(self.entries, parent_features, tokens, positions, mask))

    def _choose(self, logits: Tensor, k: int) -> tuple[list[list[int]], Tensor | None]:
        """Children (target ids, up to k per row) of each row of draft logits [n, V_draft], and
        the distributions they were drawn from (None when chosen top-k)."""
        if not self.sampled:
            return self.head.to_target(logits.topk(k, dim=-1).indices).tolist(), None
        q = warp(logits, self.params)
        ids = self.draws.distinct(q, k)
        if self.head.draft_vocab is not None:
            ids = self.head.to_target(torch.tensor(sum(ids, []), dtype=torch.long)).split([len(r) for r in ids])
            ids = [row.tolist() for row in ids]
        return ids, q

    def _static(self, root_feature: Tensor, root_logits: Tensor, max_depth: int
                ) -> Generator[HeadCall, HeadResult, DraftTree]:
        tree = DraftTree(draft_probs={} if self.sampled else None, vocab=self.head.draft_vocab)
        made: dict[int, int] = {-1: -1}  # static path index -> tree node
        features = {-1: root_feature}  # tree node -> its predicted feature (children's input)
        logits = root_logits  # the draft logits after this level's parents
        for level in self.static[:max_depth]:
            parents = [made[p] for p, _ in level if p in made]
            if not parents:
                break
            if parents != [-1]:  # below the first level every parent is a draft node
                out, logits = yield from self._run(tree, parents, torch.stack([features[tree.parents[p]] for p in parents]))
                features.update(zip(parents, out))
            ids, q = self._choose(logits, max(len(kids) for _, kids in level))
            rows = {p: row for row, p in enumerate(parents)}
            for static_parent, kids in level:
                if static_parent not in made:
                    continue
                parent = made[static_parent]
                row = rows[parent]
                if q is not None:
                    tree.draft_probs[parent] = q[row]
                for rank, static_child in enumerate(kids):
                    if rank < len(ids[row]):
                        made[static_child] = len(tree)
                        tree.tokens.append(ids[row][rank])
                        tree.parents.append(parent)
        return tree

    def _dynamic(self, root_feature: Tensor, root_logits: Tensor, depth: int
                 ) -> Generator[HeadCall, HeadResult, tuple[DraftTree, list[float]]]:
        k = self.shape.topk
        pool = DraftTree()  # every candidate; the tree is the best of them
        scores: list[float] = []  # cumulative draft log-probability of each candidate
        frontier, features = [-1], root_feature[None]
        top = self._top(root_logits)
        for level in range(depth):
            base = torch.tensor([scores[p] if p >= 0 else 0.0 for p in frontier])[:, None]
            candidate_scores = base + top.values  # [n, k]
            first = len(pool)
            pool.tokens.extend(self.head.to_target(top.indices).flatten().tolist())
            pool.parents.extend(p for p in frontier for _ in range(k))
            scores.extend(candidate_scores.flatten().tolist())
            if level == depth - 1:
                break
            best = candidate_scores.flatten().topk(k)
            picks = best.indices.tolist()  # this level's candidates to expand, as indices into its k per row
            if self.auto:
                picks = self.auto.frontier(scores, pool.parents, [first + b for b in picks], self.shape.tokens,
                                           self.clock.now())
                picks = [i - first for i in picks]
                if not picks or not self.auto.worth_expanding([scores[first + b] for b in picks]):
                    break
            self.clock.lap()
            frontier = [first + b for b in picks]
            features, logits = yield from self._run(pool, frontier, features[torch.tensor(picks) // k])
            top = self._top(logits)
            if self.auto:
                self.auto.level_time = self.clock.lap()
        return pool, scores

    def _top(self, logits: Tensor):
        """The top-k draft log-probabilities and ids [n, k] from draft logits [n, V_draft]."""
        return torch.log_softmax(logits.float(), dim=-1).topk(self.shape.topk, dim=-1)

    def describe(self) -> str:
        return self.auto.describe(self.shape) if self.auto else self.shape.describe()


def _static_plan(paths) -> list[list[tuple[int, list[int]]]]:
    """Per depth level: (parent path index or -1, its children's path indices by rank)."""
    index = {path: i for i, path in enumerate(paths)}
    levels: list[dict[int, list[tuple[int, int]]]] = []
    for i, path in enumerate(paths):
        if len(path) > 1 and path[:-1] not in index:
            raise InvalidArgumentError(f"static tree: path {list(path)} comes without its parent")
        while len(levels) < len(path):
            levels.append({})
        levels[len(path) - 1].setdefault(index.get(path[:-1], -1), []).append((path[-1], i))
    plan = []
    for level in levels:
        for kids in level.values():
            kids.sort()
            if [rank for rank, _ in kids] != list(range(len(kids))):
                raise InvalidArgumentError("static tree: each node's children must have ranks 0, 1, 2, ...")
        plan.append([(parent, [i for _, i in kids]) for parent, kids in level.items()])
    return plan


@register
@dataclass(frozen=True)
class Eagle(Method):
    head: DraftHead
    tree: str = "auto"
    name: ClassVar[str] = "eagle"
    syntax: ClassVar[str] = "eagle[:TREE]"
    summary: ClassVar[str] = f"the EAGLE head drafts a tree (TREE: {TREE_HELP}; default auto, sized on this machine)"
    needs: ClassVar[Artefact] = Artefact.EAGLE_HEAD
    # per target model, then per sampling setting: the `auto` sizing of the last generation started,
    # where the next one starts
    learned: WeakKeyDictionary = field(default_factory=WeakKeyDictionary, init=False, compare=False, repr=False)

    def __post_init__(self):
        parse_tree(self.tree)
        check_head_kind("eagle", self.head, "eagle")

    @staticmethod
    def options(arg: str) -> dict:
        parse_tree(arg or "auto")
        return {"tree": arg} if arg else {}

    def bind(self, target, params: SamplingParams):
        shape = parse_tree(self.tree)
        if not shape.auto:
            return lambda draws, capacity: EagleProposer(self.head, shape, params, draws)
        costs = target.model.forward_costs()  # measured once per model
        learned = self.learned.setdefault(target.model, {})
        key = (params.temperature, params.top_p, params.top_k)

        def make(draws, capacity):
            proposer = EagleProposer(self.head, shape, params, draws, costs, learned.get(key))
            learned[key] = proposer.auto
            return proposer

        return make
