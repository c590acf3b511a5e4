"""Texts indexed by their n-grams, for drafts copied from text: what followed the current text's
tail wherever it occurred before, as a trie of continuations scored by how often each one
followed (SuffixDecoding's frequency-scored speculation tree).

`hybrid` keeps two: the text of the current generation (prompt and output, growing as tokens
are accepted) and the suffix cache, earlier generations of the same process, which forgets its
oldest texts beyond a bound on the tokens it holds.
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from dataclasses import dataclass

from eaglespec.errors import InvalidArgumentError

KEY = 2  # the n-gram an occurrence is found by; its match then extends backwards
MAX_MATCH = 32  # tokens a match is measured over
MAX_OCCURRENCES = 64  # the latest occurrences of a key that are looked at


@dataclass
class Continuations:
    """What followed the longest earlier matches of a text's tail: draft paths (token tuples,
    parents first) each with the share of the matches it continued, and the match length."""

    paths: list[tuple[int, ...]]
    shares: list[float]
    match: int


class NgramIndex:
    def __init__(self, max_tokens: int | None = None):
        """`max_tokens`: the oldest texts are forgotten beyond it (None: no bound)."""
        if max_tokens is not None and max_tokens < 1:
            raise InvalidArgumentError(f"a suffix cache must hold at least 1 token, got {max_tokens}")
        self.max_tokens = max_tokens
        self.texts: dict[int, list[int]] = {}  # id -> tokens, oldest first
        self.where: dict[tuple[int, ...], deque[tuple[int, int]]] = {}  # key -> (text id, start), oldest first
        self.tokens = 0
        self.next_id = 0

    def add(self, tokens: list[int]) -> int:
        """Index a new text (of a bounded index, its last `max_tokens` tokens at most); returns its
        id, to `extend` it."""
        text_id, self.next_id = self.next_id, self.next_id + 1
        self.texts[text_id] = []
        self.extend(text_id, tokens[-self.max_tokens:] if self.max_tokens else tokens)
        return text_id

    def extend(self, text_id: int, tokens: list[int]) -> None:
        """Append to a text; in a bounded index only to the newest (whose occurrences come last)."""
        if self.max_tokens is not None and text_id != self.next_id - 1:
            raise ValueError("a bounded index extends only its newest text")
        text = self.texts[text_id]
        start = max(len(text) - KEY + 1, 0)
        text.extend(tokens)
        for i in range(start, len(text) - KEY + 1):
            self.where.setdefault(tuple(text[i:i + KEY]), deque()).append((text_id, i))
        self.tokens += len(tokens)
        while self.max_tokens is not None and self.tokens > self.max_tokens:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        """The oldest text's occurrences are the first of their keys' lists (texts are extended
        newest only)."""
        text_id = next(iter(self.texts))
        text = self.texts.pop(text_id)
        for i in range(len(text) - KEY + 1):
            key = tuple(text[i:i + KEY])
            self.where[key].popleft()
            if not self.where[key]:
                del self.where[key]
        self.tokens -= len(text)

    def continuations(self, tail: list[int], depth: int, max_paths: int) -> Continuations | None:
        """The continuations (up to `depth` tokens) of the earlier occurrences of `tail`'s final
        KEY tokens that match it longest, scored by share; at most `max_paths` paths, the most
        frequent ones. None when the key never occurred with something after it."""
        if len(tail) < KEY or depth < 1:
            return None
        found = self.where.get(tuple(tail[-KEY:]))
        if not found:
            return None
        best, matches = 0, []
        for text_id, start in islice(reversed(found), MAX_OCCURRENCES):  # latest first
            text = self.texts[text_id]
            end = start + KEY
            if end >= len(text):  # the tail itself, nothing after it yet
                continue
            m = KEY
            while m < MAX_MATCH and m < len(tail) and start + KEY - m - 1 >= 0 \
                    and text[start + KEY - m - 1] == tail[-m - 1]:
                m += 1
            if m > best:
                best, matches = m, []
            if m == best:
                matches.append(text[end:end + depth])
        if not matches:
            return None
        counts: dict[tuple[int, ...], int] = {}
        for continuation in matches:
            for d in range(1, len(continuation) + 1):
                path = tuple(continuation[:d])
                counts[path] = counts.get(path, 0) + 1
        # the most frequent paths; a path's count never exceeds its parent's, so (count, shorter
        # first, first seen) keeps every parent ahead of its children
        order = sorted(counts, key=lambda p: (-counts[p], len(p)))[:max_paths]
        order.sort(key=len)
        return Continuations(order, [counts[p] / len(matches) for p in order], best)
