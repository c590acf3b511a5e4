"""A draft head's KV cache shared by the rows a `Scheduler` decodes together, so that one head
forward runs a draft step of every row.

A proposer that runs a head (EAGLE, and `hybrid` through it) does not call it: it yields a
`HeadCall` in its row's own terms, as if it had a cache of its own (`HeadEntries`: its entries in
order; the call's new entries come after its first `length`, at the positions and under the mask
over them that it gives), and gets back the predicted hidden states and the draft logits it asked
for. The scheduler gathers one call from every row that drafts and `HeadRows.run` runs them as one
forward, the rows' new entries side by side, each seeing only its own (the mask maps a row's
entries to the slots that hold them), then one LM-head product for all. So the head's weights are
read once per draft step for the whole batch, not once per row.

A row gets the numbers it gets alone: the head's linears, its LM head and its attention are
row-invariant (decoder.Linear, row_attention.cpp; row_cache.py says the same of the target's),
and every call runs under an explicit mask, so none takes a path that a batch would not.

A row drops its draft entries by truncating them to its committed ones (`truncate`); the slots after the last one in use
are free again at the next run, and the entries of a row that left (`remove`) move down then.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator
from dataclasses import dataclass

import torch
from torch import Tensor

from eaglespec.decoding.tree import DraftTree
from eaglespec.models.decoder import causal_mask


class HeadEntries:
    """A row's entries: `slots[i]` is the cache slot of its i-th; `rows` the cache they are in."""

    def __init__(self, head):
        self.head = head
        self.slots: list[int] = []
        self.rows: HeadRows | None = None

    @property
    def length(self) -> int:
        return len(self.slots)

    def truncate(self, n: int) -> None:
        """Keep the first n entries (the committed ones, after a draft)."""
        del self.slots[n:]


@dataclass
class HeadCall:
    """A head forward over m new entries of one row."""

    entries: HeadEntries
    hidden: Tensor  # [m, H]: what each entry reads (a lifted target output or its parent's predicted state)
    tokens: Tensor  # [m] the token each entry reads
    positions: Tensor  # [m]
    mask: Tensor | None  # bool [m, length + m] over the row's entries and the new ones; None: all, causal
    last_logits_only: bool = False  # the draft logits of the last new entry alone, not of each


HeadResult = tuple[Tensor, Tensor]  # a call's predicted hidden states [m, H] and draft logits [m or 1, V_draft]
Drafting = Generator[HeadCall, HeadResult, DraftTree]  # a draft that runs a head: its calls, then its tree


class HeadRows:
    """The rows' entries side by side in one `KVCache` of the head, which grows as rows need."""

    def __init__(self, head, capacity: int = 256):
        self.head = head
        self.cache = head.new_cache(capacity)
        self.members: list[HeadEntries] = []

    def add(self, entries: HeadEntries) -> None:
        if entries.rows is not None or entries.slots:
            raise ValueError("these entries are in a cache already")
        entries.rows = self
        self.members.append(entries)

    def remove(self, entries: HeadEntries) -> None:
        self.members.remove(entries)
        entries.slots.clear()
        entries.rows = None

    def run(self, calls: list[HeadCall]) -> list[HeadResult]:
        """Run the calls (one per row) as one forward."""
        self._compact()
        sizes = [len(call.tokens) for call in calls]
        start, total = self.cache.length, sum(sizes)
        self._reserve(start + total)
        device = self.cache.k.device
        if len(calls) == 1 and calls[0].entries.length == start:  # one row, alone in the cache
            mask = calls[0].mask
            if mask is None and total > 1:
                mask = causal_mask(start, total, device)
            calls[0].entries.slots.extend(range(start, start + total))
        else:
            mask = torch.zeros(total, start + total, dtype=torch.bool, device=device)
            first = 0
            for call, m in zip(calls, sizes):
                own = call.entries.slots
                rows, new = slice(first, first + m), slice(start + first, start + first + m)
                if call.mask is None:
                    if own:
                        mask[rows, torch.tensor(own, device=device)] = True
                    mask[rows, new] = causal_mask(0, m, device)
                else:
                    if own:
                        mask[rows, torch.tensor(own, device=device)] = call.mask[:, :len(own)].to(device)
                    mask[rows, new] = call.mask[:, len(own):].to(device)
                own.extend(range(new.start, new.stop))
                first += m
        hidden, tokens, positions = (joined([getattr(call, part) for call in calls])[None]
                                     for part in ("hidden", "tokens", "positions"))
        out = self.head(hidden, tokens, self.cache, positions, mask)[0]
        ends = list(itertools.accumulate(sizes))
        wanted = [1 if call.last_logits_only else m for call, m in zip(calls, sizes)]
        logits = self.head.logits(joined([out[end - n:end] for n, end in zip(wanted, ends)]))
        if len(calls) == 1:
            return [(out, logits)]
        return list(zip(out.split(sizes), logits.split(wanted)))

    def _compact(self) -> None:
        """Free the slots no row holds: those after the last in use, and move the rest down where
        a row that left leaves holes."""
        n = sum(entries.length for entries in self.members)
        if max((entries.slots[-1] for entries in self.members if entries.slots), default=-1) == n - 1:
            self.cache.length = n  # the slots in use (each in one row) are a prefix
            return
        used = sorted(slot for entries in self.members for slot in entries.slots)
        where = {slot: i for i, slot in enumerate(used)}
        src = torch.tensor(used, device=self.cache.k.device)
        self.cache.k[:, :, :, :n] = self.cache.k[:, :, :, src]
        self.cache.v[:, :, :, :n] = self.cache.v[:, :, :, src]
        for entries in self.members:
            entries.slots[:] = [where[slot] for slot in entries.slots]
        self.cache.length = n

    def _reserve(self, n: int) -> None:
        """Room for n entries: a cache twice as large where it is too small."""
        cache = self.cache
        if n <= cache.capacity:
            return
        grown = self.head.new_cache(max(n, 2 * cache.capacity))
        grown.k[:, :, :, :cache.length] = cache.k[:, :, :, :cache.length]
        grown.v[:, :, :, :cache.length] = cache.v[:, :, :, :cache.length]
        grown.length = cache.length
        self.cache = grown


def joined(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)
