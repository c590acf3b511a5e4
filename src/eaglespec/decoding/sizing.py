"""How much a row drafts: the policies that size draft trees and chains for the machine at hand.

A round's rows share one target forward, so a row's draft tokens slow every row's round. Before
a row drafts, the `Scheduler` hands its proposer the round's `Budget`: the tokens the other rows
put in the forward, the tokens they are expected to accept and their draft seconds. A sizer
maximizes the whole round's tokens per second (`RoundCosts.rate`: accepted beside + this row's expected
tokens, over draft seconds beside + this row's + the forward over everyone's tokens), so trees
shrink as the batch fills; alone, the budget is empty and this is the row's own rate.

- `best_prefix`: how many of a best-first list of draft nodes to verify (`auto`, `hybrid`, `medusa`);
- `AutoSize`: EAGLE's `auto` tree, grown level by level and stopped where it stops paying, and the
  choice between drafting and plain rounds;
- `BatchChoice`: that choice made for a batch of `auto` rows together (`BatchRates` per batch size);
- `ChainSize`: a copied chain's length (`pld`);
- `Calibration`: accepted over predicted draft tokens, per source (`hybrid`, `medusa`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from eaglespec.decoding.tree import TreeShape
from eaglespec.models.costs import ForwardCosts


@dataclass(frozen=True)
class Budget:
    """A round's other rows: tokens in the target forward, tokens expected to be accepted, draft
    seconds; and whether the batch chose that this row drafts (`BatchChoice`), so that it does not
    decode the round plainly on its own."""

    tokens: int = 0
    accepted: float = 0.0
    seconds: float = 0.0
    drafts: bool = False


ALONE = Budget()  # a row decoded alone: nothing beside it


@dataclass(frozen=True)
class RoundCosts:
    """What a row's draft is sized against: the target's measured forward costs and the budget of
    the round's other rows."""

    costs: ForwardCosts
    budget: Budget = ALONE

    def forward(self, n: int) -> float:
        """Seconds of the forward with this row's n tokens beside the other rows'."""
        return self.costs.forward(self.budget.tokens + n)

    def rate(self, tokens: float, n: int, spent: float) -> float:
        """The round's tokens per second if this row verifies n tokens (its root included), expects
        `tokens` of them accepted (the bonus included) and spent `spent` seconds drafting."""
        return (self.budget.accepted + tokens) / (spent + self.budget.seconds + self.forward(n))


def best_prefix(expected: list[float], costs: RoundCosts, spent: float, plain: bool = False) -> tuple[int, float]:
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


def waited_share(window: float, rounds: int) -> float:
    """The part of a head's pass over the entries of `rounds` rounds without a draft (one entry a
    round and row) that the plain rounds' decayed sums take: they weigh only the latest `window`
    rounds, so each waited round carries its own entry's share, and one pass after a long wait does
    not weigh as if the few rounds in the window had cost it all (in a log at 8 rows, a 65 ms pass
    after 88 plain rounds had been charged to sums worth about 330 ms)."""
    return min(1.0, window / rounds) if rounds > 0 else 1.0


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

    def __init__(self, costs: ForwardCosts, earlier: AutoSize | None = None):
        self.costs = costs
        self.round_costs = RoundCosts(costs)  # this round's costs, with the budget of the rows beside it
        self.accepted, self.predicted = 1.0, 1.0  # decaying sums behind the calibration
        # (tokens, seconds) of drafting rounds and of rounds without a draft, each sum decaying by MEMORY
        # per round of its kind, both starting as one round of vanilla decoding
        self.drafted = [1.0, max(costs.table[1], 1e-6)]
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

    def start_round(self, now: float, budget: Budget = ALONE, plain: bool = False) -> None:
        """A round starts: the last one measured, this one's choice made (the batch's where it chose:
        `plain` for a round without drafts, `budget.drafts` for a drafting one; `BatchChoice`)."""
        self.round_costs = RoundCosts(self.costs, budget)
        if self.round_tokens:  # the last round of this generation, measured
            sums = self.drafted if self.drafting else self.plain
            sums[:] = [self.MEMORY * sums[0] + self.round_tokens, self.MEMORY * sums[1] + now - self.round_start]
            self.plain_rounds = 0 if self.drafting else self.plain_rounds + 1
            self.streak = self.streak + 1 if self.drafting else 0
            if self.rate >= self.plain_rate:
                self.probe = self.PROBE
            elif self.streak == self.PROBE_ROUNDS:  # a probe found drafting still slower
                self.probe = min(2 * self.probe, self.MAX_PROBE)
        self.drafting = not plain and (budget.drafts or self.rate >= self.plain_rate
                                       or self.plain_rounds >= self.probe - 1 or 0 < self.streak < self.PROBE_ROUNDS)
        self.plain_total += not self.drafting
        self.round_start, self.round_tokens = now, 0

    def catch_up(self, waited: float, prompt: float, entries: int) -> None:
        """This drafting round spent `waited` seconds running the head over the `entries` entries that
        waited through rounds without a draft (one a round), counted as theirs so that skipping drafts
        is not paid by drafting, and `prompt` seconds over the prompt's, a cost of the generation, not
        of a round."""
        self.round_start += waited + prompt
        self.plain[1] += waited * waited_share(self.plain[0], entries)

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
        value = self.round_costs.rate(1 + self.calibration * expected, n + 1, spent)
        chosen = set(order[:n])
        kept = []
        for c in candidates:
            if c not in chosen:
                continue
            guess = math.exp(2 * scores[c] - (scores[parents[c]] if parents[c] >= 0 else 0.0))
            grown = self.round_costs.rate(1 + self.calibration * (expected + guess), n + 2, spent + self.level_time)
            if grown > value:
                kept.append(c)
        return kept

    def _best(self, scores: list[float], order: list[int], limit: int, now: float) -> tuple[int, float]:
        """The number of candidates (best first) whose verification maximizes the round's expected
        tokens per second, and the sum of their draft probabilities."""
        calibration = self.calibration
        n, expected = best_prefix([calibration * math.exp(scores[i]) for i in order[:limit]], self.round_costs,
                                  now - self.round_start)
        return n, expected / calibration

    def describe(self, shape: TreeShape) -> str:
        if not self.sizes:
            return shape.describe()
        mean = sum(self.sizes) / len(self.sizes)
        return (f"auto:topk={shape.topk},depth<={shape.depth},tokens<={shape.tokens} (mean {mean:.1f} tokens per "
                f"drafting round, {len(self.sizes)} of {len(self.sizes) + self.plain_total} rounds drafting)")


class BatchChoice:
    """Whether a round of several `auto` EAGLE rows drafts. A row's own choice (`AutoSize`) weighs
    its drafting rounds against its plain ones, but in a batch its plain rounds are slowed by the rows
    drafting beside it, so rows keep drafting where a round with no draft anywhere would be faster
    (EAGLE at 0.81-0.92x vanilla's throughput at 8 rows). The batch chooses for all of them instead,
    per batch size (`BatchRates`), learned once per model; in a drafting round every row drafts and
    sizes its draft against the rows beside it (`Budget`)."""

    def __init__(self, costs: ForwardCosts):
        self.costs = costs
        self.by_size: dict[int, BatchRates] = {}
        self.current: BatchRates | None = None

    def start_round(self, rows: int) -> bool:
        """Whether this round of `rows` rows drafts."""
        if rows not in self.by_size:  # from the nearest batch size's state where there is one
            nearest = min(self.by_size, key=lambda size: (abs(size - rows), size), default=None)
            self.by_size[rows] = BatchRates(rows, self.costs.forward(rows), self.by_size.get(nearest))
        self.current = self.by_size[rows]
        return self.current.decide()

    def finish_round(self, tokens: int, seconds: float, waited: float = 0.0, entries: int = 0) -> None:
        """The round's rows accepted `tokens` tokens in `seconds` (drafting, forward and acceptance),
        `waited` of those seconds the heads' pass over a row's `entries` entries of rounds without a draft."""
        self.current.record(tokens, seconds, waited, entries)


class BatchRates:
    """A batch size's choice between drafting and plain rounds. Plain rounds are measured in tokens
    and seconds, and drafting rounds in tokens and plain rounds' worth of seconds (each round's
    seconds over the latest plain round's: a round's cost grows with the rows' contexts, and an old
    drafting round must not look fast beside new plain ones), each summed with weight MEMORY^age
    over the rounds of its kind. Rounds draft while drafting ones give more tokens per plain round's
    worth of seconds than plain ones, and a run of them that has given more stops only once they give
    less than 1 - MARGIN of them (the tokens of a few rounds vary: at 2 rows, where drafting gained
    1.2x, dips of its measured gain below 1 turned it off); after PROBE - 1 plain rounds drafting
    starts again to measure anew, for as many rounds as make PROBE_ROWS rows' rounds (one row's tokens vary too much to judge
    by, a batch's less), and each such probe that loses to measured plain rounds doubles the wait,
    up to MAX_PROBE rounds (a probe drafts in every row: at 8 rows it cost 2x a plain round). The
    heads' pass over the entries that waited through plain rounds counts as those rounds' time, as in
    `AutoSize` (`waited_share`). The plain rounds' seconds start as the measured forward of one token
    per row, an estimate that leaves out the round's other work, so it weighs as a tenth of a round and the first
    measured plain round outweighs it (and re-weighs the drafting rounds before it); an `earlier`
    state (the nearest batch size's) carries over."""

    PROBE, MAX_PROBE = 8, 128
    PROBE_ROWS = 3
    MEMORY = 0.9
    MARGIN = 0.05
    ESTIMATE_WEIGHT = 0.1

    def __init__(self, rows: int, seconds: float, earlier: BatchRates | None = None):
        self.rows = rows
        self.rounds = -(-self.PROBE_ROWS // rows)  # a probe's rounds
        w = self.ESTIMATE_WEIGHT
        self.plain = [w * rows, w * max(seconds, 1e-6), 0.0]  # tokens, seconds, seconds charged to them
        self.drafted = [w * rows, w]  # tokens, plain rounds' worth of seconds
        self.measured = False  # whether plain rounds were measured (else the estimate stands)
        self.drafting = True  # this round's kind
        self.streak = 0  # drafting rounds since the last plain one
        self.won = False  # whether those rounds have given more than plain ones
        self.waited = 0  # plain rounds since the last drafting one
        self.probe = self.PROBE
        if earlier is not None:
            # tokens per row alike; a drafting round's cost in plain rounds' worth alike
            scale = rows / earlier.rows
            self.drafted = [earlier.drafted[0] * scale, earlier.drafted[1]]
            self.plain = [earlier.plain[0] * scale, *earlier.plain[1:]]
            self.measured, self.probe = earlier.measured, earlier.probe

    def decide(self) -> bool:
        """Whether this round drafts."""
        keeps = 1.0 - self.MARGIN if self.won else 1.0  # a run that has won goes on unless clearly slower
        self.drafting = (self.gain >= keeps or self.waited >= self.probe - 1 or 0 < self.streak < self.rounds)
        return self.drafting

    def record(self, tokens: float, seconds: float, waited: float, entries: int = 0) -> None:
        """This round gave `tokens` tokens in `seconds`, `waited` of them the heads' catch-up over a
        row's `entries` entries of plain rounds."""
        m = self.MEMORY
        self.plain[2] += waited * waited_share(self.plain[0] / self.rows, entries)
        if self.drafting:
            round_seconds = self.rows * self.plain[1] / self.plain[0]  # the latest plain round's
            self.drafted[:] = [m * self.drafted[0] + tokens, m * self.drafted[1] + (seconds - waited) / round_seconds]
        else:
            estimate = self.plain[1] / self.plain[0]
            self.plain[:] = [m * self.plain[0] + tokens, m * self.plain[1] + seconds, m * self.plain[2]]
            if not self.measured:  # drafting rounds so far were weighed against the estimate: against this one
                self.drafted[1] *= estimate / (self.plain[1] / self.plain[0])
        self.measured = self.measured or not self.drafting
        self.waited = 0 if self.drafting else self.waited + 1
        self.streak = self.streak + 1 if self.drafting else 0
        self.won = self.drafting and (self.won or self.gain >= 1.0)
        if self.gain >= 1.0:
            self.probe = self.PROBE
        elif self.streak == self.rounds and self.measured and not self.won:  # a probe found drafting still slower
            self.probe = min(2 * self.probe, self.MAX_PROBE)

    @property
    def gain(self) -> float:
        """Drafting rounds' tokens per second over plain rounds' (the seconds charged to them included)."""
        plain_tokens = self.rows * self.plain[1] / (self.plain[1] + self.plain[2])  # per plain round's seconds
        return self.drafted[0] / self.drafted[1] / plain_tokens


class ChainSize:
    """Sizes a chain draft for the machine at hand. With a_i the share of draft tokens at depth i
    accepted so far in this generation (tested ones only; a prior of one half-accepted try), the
    round verifies the k first tokens of the chain that maximize (1 + sum_{j<=k} a_1 ... a_j) /
    cost(k + 1), cost(n) the target's measured forward of n tokens; k = 0 is a plain round. Where
    forwards cost in proportion to their tokens (CPUs without a matrix unit) short drafts or none
    win; where a forward of 11 tokens costs little more than one, the whole match. A round that
    would go plain drafts one token once in PROBE such rounds, to measure again."""

    PROBE = 8

    def __init__(self, costs: ForwardCosts, depth: int):
        self.costs = costs
        self.tried, self.hits = [1.0] * depth, [0.5] * depth
        self.plain_rounds = 0
        self.sizes: list[int] = []

    def size(self, available: int, budget: Budget = ALONE) -> int:
        costs = RoundCosts(self.costs, budget)
        best, value, expected, reach = 0, costs.rate(1, 1, 0.0), 1.0, 1.0
        for k in range(1, available + 1):
            reach *= self.hits[k - 1] / self.tried[k - 1]
            expected += reach
            rate = costs.rate(expected, k + 1, 0.0)
            if rate > value:
                best, value = k, rate
        self.plain_rounds = self.plain_rounds + 1 if best == 0 else 0
        if best == 0 and self.plain_rounds >= self.PROBE:
            best, self.plain_rounds = 1, 0
        self.sizes.append(best)
        return best

    def count(self, drafted: int, accepted: int) -> None:
        """A round verified `drafted` tokens and accepted the first `accepted` of them."""
        for i in range(min(accepted + 1, drafted)):
            self.tried[i] += 1
            self.hits[i] += i < accepted

    def describe(self, limit: int) -> str:
        drafting = [k for k in self.sizes if k]
        mean = sum(drafting) / len(drafting) if drafting else 0.0
        return (f"pld:auto<={limit} (mean {mean:.1f} tokens per drafting round, {len(drafting)} of "
                f"{len(self.sizes)} rounds with a match drafting)")



class Calibration:
    """Accepted over predicted draft tokens per key (a copying source and its match length), sums
    decaying by MEMORY each round the key drafts, from a prior of one half-accepted token."""

    MEMORY = 0.98
    PRIOR = (0.5, 1.0)

    def __init__(self):
        self.sums: dict[tuple, tuple[float, float]] = {}

    def factor(self, key: tuple) -> float:
        accepted, predicted = self.sums.get(key, self.PRIOR)
        return accepted / predicted

    def update(self, key: tuple, accepted: float, predicted: float) -> None:
        a, p = self.sums.get(key, self.PRIOR)
        self.sums[key] = (self.MEMORY * a + accepted, self.MEMORY * p + predicted)
