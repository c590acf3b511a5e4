"""The EAGLE proposer: the head drafts a tree, one head forward per depth level.

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

import math
from collections.abc import Generator

import torch
from torch import Tensor

from eaglespec.decoding.head_rows import Drafting, HeadCall, HeadEntries, HeadResult
from eaglespec.decoding.sampling import Draws, SamplingParams, warp
from eaglespec.decoding.tree import DraftTree, TreeShape
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.head import DraftHead
from eaglespec.models.costs import VerifyCosts
from eaglespec.timing import Clock


class EagleProposer:
    def __init__(self, head: DraftHead, shape: TreeShape, params: SamplingParams, draws: Draws,
                 verify_costs: VerifyCosts | None = None, earlier: AutoSize | None = None):
        """`verify_costs` (the target's `Decoder.verify_costs()`) sizes the `auto` tree, starting from
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
        self.auto = AutoSize(verify_costs, earlier) if shape.auto else None
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

    def propose(self, max_depth: int) -> Drafting:
        """Draft a tree no deeper than `max_depth` (what the loop can still accept)."""
        if self.shape.paths is not None:
            root = yield from self._catch_up()
            if root is None or max_depth < 1:
                return DraftTree()
            tree = yield from self._static(*root, max_depth)
            self.entries.length = self.committed  # drop the draft entries
            return tree
        pool, scores = yield from self.candidates(max_depth)
        if not len(pool):  # a plain round
            return pool
        order = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
        size = self.auto.size(scores, order, self.shape.tokens, self.clock.now()) if self.auto else self.shape.tokens
        return pool.subset(sorted(order[:size]))

    def candidates(self, max_depth: int) -> Generator[HeadCall, HeadResult, tuple[DraftTree, list[float]]]:
        """The dynamic tree's candidate pool (parents first) and each node's cumulative draft
        log-probability, no deeper than `max_depth`; none where `auto` decodes this round plainly."""
        if self.auto:
            self.auto.start_round(self.clock.now())
            if not self.auto.drafting:  # plain decoding pays better here: the entries wait
                return DraftTree(), []
        root = yield from self._catch_up()
        if root is None or max_depth < 1:
            return DraftTree(), []
        pool, scores = yield from self._dynamic(*root, min(self.shape.depth, max_depth))
        self.entries.length = self.committed  # drop the draft entries
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
            self.auto.catch_up(per_entry * self.waited, per_entry * self.prompt_waiting)
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


class AutoSize:
    """Sizes the `auto` tree each round for the machine at hand. A draft path's probability
    (exp of its cumulative log-probability), scaled by the measured ratio of accepted to predicted
    tokens (sums that decay by CALIBRATION_MEMORY per drafting round), estimates how often the
    target accepts it. The round verifies the n best nodes that
    maximize (1 + expected accepted) / (draft time + measured verify cost of n + 1 tokens), and
    drafting expands only the nodes that the best tree so far takes (`frontier`) and stops deepening
    once the next level's expected tokens are worth less than its time. Where even the best tree
    pays less than plain decoding (the measured tokens/s of drafting rounds below that of rounds
    without a draft: tokens over seconds, each summed with weight MEMORY^age over the rounds of its
    kind; as on CPUs whose forwards cost in proportion to their tokens), rounds decode plainly, and
    after PROBE - 1 of them drafting starts again to measure anew. Every run of drafting rounds (the
    generation's first included) is a probe of at least PROBE_ROUNDS rounds, since the tokens one
    round accepts vary too much to judge by (one unlucky first round used to stop drafting for the
    rest of a short answer); each probe that ends with drafting still slower doubles the wait, up
    to MAX_PROBE rounds. The head's pass over the entries that waited through rounds
    without a draft counts as those rounds' time, and its pass over the prompt as no round's
    (`catch_up`). A generation starts from what the `earlier` one learned (the calibration, both
    rates, the plain rounds towards the next probe and the probe's wait), so that a process that
    found drafting slower does not pay to find it again, the head's pass over each prompt included.
    """

    PROBE, MAX_PROBE = 8, 32
    PROBE_ROUNDS = 3
    MEMORY = 0.9
    CALIBRATION_MEMORY = 0.98  # per drafting round, of the sums behind the calibration

    def __init__(self, verify_costs: VerifyCosts, earlier: AutoSize | None = None):
        self.costs = verify_costs
        self.accepted, self.predicted = 1.0, 1.0  # decaying sums behind the calibration
        # (tokens, seconds) of drafting rounds and of rounds without a draft, each sum decaying by MEMORY
        # per round of its kind, both starting as one round of vanilla decoding
        self.drafted = [1.0, max(verify_costs.table[1], 1e-6)]
        self.plain = list(self.drafted)
        self.drafting = True  # whether this round drafts
        self.plain_rounds = 0  # rounds without a draft since the last drafting one
        self.streak = 0  # drafting rounds since the last one without a draft
        self.probe = self.PROBE  # a drafting round after this many rounds (plain ones before it)
        if earlier is not None:
            self.accepted, self.predicted = earlier.accepted, earlier.predicted
            self.drafted, self.plain = list(earlier.drafted), list(earlier.plain)
            # the earlier generation's last round was not measured; a plain one still counts towards the
            # probe, a drafting one towards the probe's rounds
            self.plain_rounds, self.probe = earlier.plain_rounds + (not earlier.drafting), earlier.probe
            self.streak = earlier.streak + 1 if earlier.drafting else 0
        self.plain_total = 0
        self.level_time = 0.0  # the last draft level's seconds
        self.round_start = 0.0
        self.round_tokens = 0  # tokens the last round accepted
        self.prediction = 0.0  # draft tokens the last round was expected to accept
        self.sizes: list[int] = []

    def start_round(self, now: float) -> None:
        if self.round_tokens:  # the last round of this generation, measured
            sums = self.drafted if self.drafting else self.plain
            sums[:] = [self.MEMORY * sums[0] + self.round_tokens, self.MEMORY * sums[1] + now - self.round_start]
            self.plain_rounds = 0 if self.drafting else self.plain_rounds + 1
            self.streak = self.streak + 1 if self.drafting else 0
            if self.rate >= self.plain_rate:
                self.probe = self.PROBE
            elif self.streak == self.PROBE_ROUNDS:  # a probe found drafting still slower
                self.probe = min(2 * self.probe, self.MAX_PROBE)
        self.drafting = (self.rate >= self.plain_rate or self.plain_rounds >= self.probe - 1
                         or 0 < self.streak < self.PROBE_ROUNDS)
        self.plain_total += not self.drafting
        self.round_start, self.round_tokens = now, 0

    def catch_up(self, waited: float, prompt: float) -> None:
        """This drafting round spent `waited` seconds running the head over the entries that waited
        through rounds without a draft, counted as theirs so that skipping drafts is not paid by
        drafting, and `prompt` seconds over the prompt's, a cost of the generation, not of a round."""
        self.round_start += waited + prompt
        self.plain[1] += waited

    def finish_round(self, tokens: int, drafted: int) -> None:
        """The round accepted `tokens` tokens, `drafted` of them draft tokens of this head's."""
        self.round_tokens = tokens
        if self.drafting:
            m = self.CALIBRATION_MEMORY
            self.accepted = m * self.accepted + drafted
            self.predicted = m * self.predicted + self.prediction

    @property
    def rate(self) -> float:
        """Tokens/s of drafting rounds."""
        return self.drafted[0] / self.drafted[1]

    @property
    def plain_rate(self) -> float:
        """Tokens/s of rounds without a draft."""
        return self.plain[0] / self.plain[1]

    @property
    def calibration(self) -> float:
        return self.accepted / self.predicted

    def worth_expanding(self, frontier_scores: list[float]) -> bool:
        gain = self.calibration * sum(map(math.exp, frontier_scores))  # at most this many more tokens
        return gain > self.level_time * self.rate

    def size(self, scores: list[float], order: list[int], limit: int, now: float) -> int:
        """How many of the candidates (best first, `order`) to verify."""
        n, prediction = self._best(scores, order, limit, now)
        self.chose(n, prediction)
        return n

    def chose(self, n: int, prediction: float) -> None:
        """The round verifies `n` of the head's candidates, whose draft probabilities sum to `prediction`."""
        self.sizes.append(n)
        self.prediction = prediction

    def frontier(self, scores: list[float], parents: list[int], candidates: list[int], limit: int,
                 now: float) -> list[int]:
        """Of a level's best candidates, those worth expanding: the best tree over the candidates so
        far takes them (only their children can join it), and adding a child, guessed as likely
        after its parent as the parent after its own (their cumulative log-probabilities), would
        pay for another level and a verified token more. Where each verified token costs much (AVX2)
        drafting narrows to a short chain; where a few more cost little (AMX), it stays wide."""
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        n, expected = self._best(scores, order, limit, now)
        if n >= limit:
            return []
        spent = now - self.round_start
        value = self.costs.rate(1 + self.calibration * expected, n + 1, spent)
        chosen = set(order[:n])
        kept = []
        for c in candidates:
            if c not in chosen:
                continue
            guess = math.exp(2 * scores[c] - (scores[parents[c]] if parents[c] >= 0 else 0.0))
            grown = self.costs.rate(1 + self.calibration * (expected + guess), n + 2, spent + self.level_time)
            if grown > value:
                kept.append(c)
        return kept

    def _best(self, scores: list[float], order: list[int], limit: int, now: float) -> tuple[int, float]:
        """The number of candidates (best first) whose verification maximizes the round's expected
        tokens per second, and the sum of their draft probabilities."""
        calibration = self.calibration
        n, expected = best_prefix([calibration * math.exp(scores[i]) for i in order[:limit]], self.costs,
                                  now - self.round_start)
        return n, expected / calibration

    def describe(self, shape: TreeShape) -> str:
        if not self.sizes:
            return shape.describe()
        mean = sum(self.sizes) / len(self.sizes)
        return (f"auto:topk={shape.topk},depth<={shape.depth},tokens<={shape.tokens} (mean {mean:.1f} tokens per "
                f"drafting round, {len(self.sizes)} of {len(self.sizes) + self.plain_total} rounds drafting)")


def best_prefix(expected: list[float], costs: VerifyCosts, spent: float, plain: bool = False) -> tuple[int, float]:
    """The n first draft nodes (best first, each with its expected acceptance, a tree at every
    prefix) whose verification maximizes the round's expected tokens per second (`costs.rate` of
    1 + their sum, n + 1 tokens and `spent` seconds drafting), and that sum; at least one node
    unless `plain` (n = 0) may win."""
    best, best_value, best_sum, total = 0, costs.rate(1, 1, spent) if plain else -1.0, 0.0, 0.0
    for n, e in enumerate(expected, 1):
        total += e
        value = costs.rate(1 + total, n + 1, spent)
        if value > best_value:
            best, best_value, best_sum = n, value, total
    return best, best_sum


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
