"""Prompt lookup decoding (`pld`): no draft model at all. The draft is a chain of the tokens
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

from torch import Tensor

from eaglespec.decoding.tree import DraftTree, TreeShape, parse_tree
from eaglespec.errors import InvalidArgumentError
from eaglespec.models.costs import VerifyCosts


class ChainSize:
    """Sizes a chain draft for the machine at hand. With a_i the share of draft tokens at depth i
    accepted so far in this generation (tested ones only; a prior of one half-accepted try), the
    round verifies the k first tokens of the chain that maximize (1 + sum_{j<=k} a_1 ... a_j) /
    cost(k + 1), cost(n) the target's measured forward of n tokens; k = 0 is a plain round. Where
    forwards cost in proportion to their tokens (CPUs without a matrix unit) short drafts or none
    win; where a forward of 11 tokens costs little more than one, the whole match. A round that
    would go plain drafts one token once in PROBE such rounds, to measure again."""

    PROBE = 8

    def __init__(self, verify_costs: VerifyCosts, depth: int):
        self.costs = verify_costs
        self.tried, self.hits = [1.0] * depth, [0.5] * depth
        self.plain_rounds = 0
        self.sizes: list[int] = []

    def size(self, available: int) -> int:
        best, value, expected, reach = 0, self.costs.rate(1, 1, 0.0), 1.0, 1.0
        for k in range(1, available + 1):
            reach *= self.hits[k - 1] / self.tried[k - 1]
            expected += reach
            rate = self.costs.rate(expected, k + 1, 0.0)
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


class PromptLookupProposer:
    reads: tuple[int, ...] = ()  # the target's final features (which it ignores)
    def __init__(self, num_tokens: int = 10, max_ngram: int = 2, verify_costs: VerifyCosts | None = None):
        """`verify_costs` (the target's `Decoder.verify_costs()`): size each draft (`ChainSize`);
        None: verify the whole match."""
        if num_tokens < 1 or max_ngram < 1:
            raise InvalidArgumentError(
                f"prompt lookup needs at least 1 draft token and an n-gram of at least 1 token, "
                f"got {num_tokens} and {max_ngram}")
        self.num_tokens, self.max_ngram = num_tokens, max_ngram
        self.shape: TreeShape = parse_tree(f"chain:{num_tokens}")
        self.history: list[int] = []  # the prompt and every accepted token; the root is last
        self.sizing = ChainSize(verify_costs, num_tokens) if verify_costs else None
        self.draft: list[int] = []  # the last round's

    def start(self, prompt_ids: list[int], features: Tensor | None) -> None:
        self.history = list(prompt_ids)

    def accept(self, tokens: list[int], features: Tensor) -> None:
        if self.sizing and self.draft:  # the accepted draft tokens, then the target's own
            self.sizing.count(len(self.draft), len(tokens) - 1)
        self.history.extend(tokens)

    def propose(self, max_depth: int) -> DraftTree:
        self.draft = self._match(min(self.num_tokens, max_depth))
        if self.sizing and self.draft:
            self.draft = self.draft[:self.sizing.size(len(self.draft))]
        return DraftTree.chain(self.draft) if self.draft else DraftTree()

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
