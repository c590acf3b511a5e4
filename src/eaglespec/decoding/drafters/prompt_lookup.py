"""`pld[:K]`: prompt lookup decoding, no draft model at all. The draft is a chain of the tokens
that followed the latest earlier occurrence of the text's final n-gram (longest n first), in
the prompt or in what was generated so far. It pays off where the output copies its input:
code edits, summaries, quoted questions.

`pld` verifies as much of the chain as pays on this machine (`ChainSize`: its measured acceptance
by depth against the target's measured cost of a forward of n tokens, at most 10 tokens);
`pld:K` always verifies the whole match, up to K tokens.

The draft tokens are chosen, not sampled, so the verifier treats them as point-mass proposals:
greedy output is vanilla's and sampled output follows the target's distribution exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from eaglespec.decoding.drafters.registry import Method, count_option, register
from eaglespec.decoding.proposer import Proposer
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.decoding.sizing import ALONE, Budget, ChainSize
from eaglespec.decoding.tree import DraftTree, TreeShape, parse_tree
from eaglespec.errors import InvalidArgumentError
from eaglespec.models.costs import ForwardCosts


class PromptLookupProposer(Proposer):
    def __init__(self, num_tokens: int = 10, max_ngram: int = 2, costs: ForwardCosts | None = None):
        """`costs` (the target's `Decoder.forward_costs()`): size each draft (`ChainSize`); None:
        verify the whole match."""
        if num_tokens < 1 or max_ngram < 1:
            raise InvalidArgumentError(
                f"prompt lookup needs at least 1 draft token and an n-gram of at least 1 token, "
                f"got {num_tokens} and {max_ngram}")
        self.num_tokens, self.max_ngram = num_tokens, max_ngram
        self.shape: TreeShape = parse_tree(f"chain:{num_tokens}")
        self.history: list[int] = []  # the prompt and every accepted token; the root is last
        self.sizing = ChainSize(costs, num_tokens) if costs else None
        self.chain: list[int] = []  # the last round's draft

    def start(self, prompt_ids: list[int], features: Tensor | None) -> None:
        self.history = list(prompt_ids)

    def accept(self, tokens: list[int], features: Tensor) -> None:
        if self.sizing and self.chain:  # the accepted draft tokens, then the target's own
            self.sizing.count(len(self.chain), len(tokens) - 1)
        self.history.extend(tokens)

    def draft(self, max_depth: int, budget: Budget = ALONE) -> DraftTree:
        self.chain = self._match(min(self.num_tokens, max_depth))
        if self.sizing and self.chain:
            self.chain = self.chain[:self.sizing.size(len(self.chain), budget)]
        return DraftTree.chain(self.chain) if self.chain else DraftTree()

    def _match(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest final n-gram."""
        h = self.history
        if k < 1:
            return []
        for n in range(min(self.max_ngram, len(h) - 1), 0, -1):
            tail = h[-n:]
            for i in range(len(h) - n - 1, -1, -1):  # latest first; h[i + n] exists
                if h[i] == tail[0] and h[i:i + n] == tail:
                    return h[i + n:i + n + k]
        return []

    def describe(self) -> str:
        return self.sizing.describe(self.num_tokens) if self.sizing else f"pld:{self.num_tokens}"


@register
@dataclass(frozen=True)
class PromptLookup(Method):
    num_tokens: int = 10
    max_ngram: int = 2
    sized: bool = False  # verify as much of each match as pays here (`pld`), not all of it (`pld:K`)
    name: ClassVar[str] = "pld"
    syntax: ClassVar[str] = "pld[:K]"
    summary: ClassVar[str] = ("prompt lookup: a chain copied from the prompt and output, as much of it as pays "
                              "on this machine up to 10 tokens, or with K always up to K")
    source: ClassVar[str] = "lookup"

    def __post_init__(self):
        PromptLookupProposer(self.num_tokens, self.max_ngram)  # checks the numbers

    @staticmethod
    def options(arg: str) -> dict:
        return {"num_tokens": count_option("pld", arg)} if arg else {"sized": True}

    def bind(self, target, params: SamplingParams):
        costs = target.model.forward_costs() if self.sized else None  # measured once per model
        return lambda draws, capacity: PromptLookupProposer(self.num_tokens, self.max_ngram, costs)
