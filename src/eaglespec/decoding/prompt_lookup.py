"""Prompt lookup decoding (`pld`): no draft model at all. The draft is a chain of the tokens
that followed the latest earlier occurrence of the text's final n-gram (longest n first), in
the prompt or in what was generated so far. It pays off where the output copies its input:
code edits, summaries, quoted questions.

The draft tokens are chosen, not sampled, so the verifier treats them as point-mass proposals:
greedy output is vanilla's and sampled output follows the target's distribution exactly.
"""

from __future__ import annotations

from torch import Tensor

from eaglespec.decoding.tree import DraftTree, TreeShape, parse_tree
from eaglespec.errors import InvalidArgumentError


class PromptLookupProposer:
    reads: tuple[int, ...] = ()  # the target's final features (which it ignores)
    def __init__(self, num_tokens: int = 10, max_ngram: int = 2):
        if num_tokens < 1 or max_ngram < 1:
            raise InvalidArgumentError(
                f"prompt lookup needs at least 1 draft token and an n-gram of at least 1 token, "
                f"got {num_tokens} and {max_ngram}")
        self.num_tokens, self.max_ngram = num_tokens, max_ngram
        self.shape: TreeShape = parse_tree(f"chain:{num_tokens}")
        self.history: list[int] = []  # the prompt and every accepted token; the root is last

    def start(self, prompt_ids: list[int], features: Tensor | None) -> None:
        self.history = list(prompt_ids)

    def accept(self, tokens: list[int], features: Tensor) -> None:
        self.history.extend(tokens)

    def propose(self, max_depth: int) -> DraftTree:
        k = min(self.num_tokens, max_depth)
        h = self.history
        if k < 1:
            return DraftTree()
        for n in range(min(self.max_ngram, len(h) - 1), 0, -1):
            tail = h[-n:]
            for i in range(len(h) - n - 1, -1, -1):  # latest first; h[i + n] exists
                if h[i] == tail[0] and h[i:i + n] == tail:
                    return DraftTree.chain(h[i + n:i + n + k])
        return DraftTree()

    def describe(self) -> str:
        return f"pld:{self.num_tokens}"
