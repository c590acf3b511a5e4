"""`lookahead[:W=5,N=4,G=5]`: Lookahead decoding (Fu et al. 2024), one of the paper's baselines.

No model and no data: the target guesses ahead by Jacobi iteration, in the same forward that
verifies. A window of W columns and N - 1 levels of guessed tokens runs as extra rows of every
verification forward (`ExtraRows`, not verified). Column i is a causal sequence at positions
root + 0, 1, ...: the root, level 0's tokens of columns 1..i, then column i's tokens of levels
1..N-2, each one position further; the target's greedy token after its last entry is the
column's new guess. After the forward, every column gives an n-gram (its level-0 token, the
root for column 0, its tokens of the later levels, its new guess: a trajectory of N tokens),
kept in a pool by first token (the G latest distinct ones per token), and the window moves one
level on (level 0 dropped, the new guesses as the last level) for the round and once more per
accepted draft token, so that its positions follow the root. The draft tree is the pool's
n-grams that start with the root, merged into a trie; chosen, not sampled, so the verifier treats
them as point-mass proposals: greedy output is vanilla's and sampled output follows the target's
distribution exactly. The window starts from prompt tokens (a fixed pseudo-random choice), and
the pool from the prompt's own n-grams (what prompt lookup would find: Jacobi trajectories need
rounds to fill it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from eaglespec.decoding.drafters.registry import Method, register
from eaglespec.decoding.proposer import Proposer
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.decoding.sizing import ALONE, Budget
from eaglespec.decoding.tree import DraftTree, ExtraRows, TreeShape
from eaglespec.errors import InvalidArgumentError


class LookaheadProposer(Proposer):

    def __init__(self, window: int = 5, ngram: int = 4, pool: int = 5):
        if not (1 <= window <= 16 and 3 <= ngram <= 8 and 1 <= pool <= 16):
            raise InvalidArgumentError(f"lookahead W={window},N={ngram},G={pool}: W 1-16, N 3-8 and G 1-16")
        self.W, self.N, self.G = window, ngram, pool
        extra = window * (ngram - 1) - 1  # the window's rows but the root
        self.shape = TreeShape("lookahead", None, pool, ngram - 1, pool * (ngram - 1) + extra)
        self.window: list[list[int]] = []  # [level][column]
        self.pool: dict[int, list[tuple[int, ...]]] = {}  # first token -> up to G continuations, latest last
        self.guesses: list[int] | None = None  # the last forward's new guess per column
        self.root = 0
        self.offsets, self.attends = self._rows()
        self.drafted: list[int] = []

    def _rows(self) -> tuple[list[int], list[list[int]]]:
        """The window's rows, level by level (level 0 without column 0, which is the root): their
        position offsets and the earlier rows each attends to."""
        index = {}
        offsets, attends = [], []
        for level in range(self.N - 1):
            for column in range(1 if level == 0 else 0, self.W):
                index[level, column] = len(offsets)
                offsets.append(level + column)
                before = [(0, c) for c in range(1, column + 1 if level else column)] + \
                    [(j, column) for j in range(1, level)]
                attends.append([index[cell] for cell in before])
        return offsets, attends

    def start(self, prompt_ids: list[int], features: Tensor | None) -> None:
        pick = random.Random(0)
        self.window = [[pick.choice(prompt_ids) for _ in range(self.W)] for _ in range(self.N - 1)]
        for i in range(len(prompt_ids) - self.N + 1):
            self._remember(prompt_ids[i], tuple(prompt_ids[i + 1:i + self.N]))
        self.root = prompt_ids[-1]

    def draft(self, max_depth: int, budget: Budget = ALONE) -> DraftTree:
        tokens, parents, index = [], [], {}
        for continuation in reversed(self.pool.get(self.root, [])):  # latest first
            for d in range(1, min(len(continuation), max_depth) + 1):
                path = continuation[:d]
                if path not in index:
                    index[path] = len(tokens)
                    tokens.append(path[-1])
                    parents.append(index[path[:-1]] if d > 1 else -1)
        self.drafted.append(len(tokens))
        window = [self.window[0][1:], *self.window[1:]]
        extra = ExtraRows([t for level in window for t in level], self.offsets, self.attends)
        return DraftTree(tokens, parents, extra=extra)

    def observe(self, logits: Tensor) -> None:
        self.guesses = logits[-self.W:].max(-1).indices.tolist()  # the last level's rows

    def accept(self, tokens: list[int], features: Tensor) -> None:
        if self.guesses is not None:
            for column in range(self.W):
                first = self.root if column == 0 else self.window[0][column]  # (the root stands at level 0, column 0)
                rest = (self.window[level][column] for level in range(1, self.N - 1))
                self._remember(first, (*rest, self.guesses[column]))
            self._advance(self.guesses)
        for _ in tokens[:-1]:  # one more level per accepted draft token, the new last level a copy of level 1
            self._advance(self.window[1])
        self.guesses = None
        self.root = tokens[-1]

    def _advance(self, last: list[int]) -> None:
        self.window = [*self.window[1:], list(last)]

    def _remember(self, first: int, continuation: tuple[int, ...]) -> None:
        kept = self.pool.setdefault(first, [])
        if continuation in kept:
            return
        kept.append(continuation)
        del kept[:-self.G]

    def describe(self) -> str:
        mean = sum(self.drafted) / len(self.drafted) if self.drafted else 0.0
        return (f"lookahead:W={self.W},N={self.N},G={self.G} (mean {mean:.1f} draft tokens and "
                f"{len(self.offsets)} window rows per round)")


@register
@dataclass(frozen=True)
class Lookahead(Method):
    window: int = 5  # W
    ngram: int = 4  # N
    pool: int = 5  # G
    name: ClassVar[str] = "lookahead"
    syntax: ClassVar[str] = "lookahead[:W=5,N=4,G=5]"
    summary: ClassVar[str] = ("Lookahead decoding: Jacobi iteration in a window of W columns and N - 1 levels, run in "
                              "the verification forward, and a pool of the n-grams it produces (G per first token)")

    def __post_init__(self):
        LookaheadProposer(self.window, self.ngram, self.pool)  # checks the numbers

    @staticmethod
    def options(arg: str) -> dict:
        names = {"W": "window", "N": "ngram", "G": "pool"}
        options = {}
        for part in filter(None, arg.split(",")):
            key, eq, value = part.partition("=")
            if key not in names or names[key] in options or not eq or not value.isdigit():
                raise InvalidArgumentError(f"method 'lookahead:{arg}': expected lookahead:W=5,N=4,G=5 (any of them)")
            options[names[key]] = int(value)
        return options

    def bind(self, target, params: SamplingParams):
        return lambda draws, capacity: LookaheadProposer(self.window, self.ngram, self.pool)
