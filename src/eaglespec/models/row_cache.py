"""A KV cache shared by the sequences (rows) decoded together: the batch of the decoding loop.

Every row's tokens sit in one preallocated block of slots, and each slot records the row it holds
(`owner`). A row's slots are in its token order, so its i-th slot holds position i. A forward
appends every row's new tokens at the end, `[length, length + T)`, and each new token attends,
through the mask `prepare` builds, to its own row's slots and the new tokens of its own tree;
`keep` then keeps each row's accepted tokens in place, and `drop` removes a row that left (the slots
after it move down). Rows join between rounds with their prompt prefilled on its own (`add`).

Attention gives a query the same numbers whichever keys it does not see sit between the ones it
sees (row_attention.cpp), and the linears give a row the same numbers whatever rows the call
carries (decoder.Linear), so a row decodes in a batch exactly as it does alone.
"""

from __future__ import annotations

import torch
from torch import Tensor

from eaglespec.models.config import ModelConfig
from eaglespec.models.decoder import KVCache


class RowCache(KVCache):
    """A `KVCache` (batch dimension 1) whose slots belong to rows; `lengths[row]` counts a row's."""

    def __init__(self, config: ModelConfig, capacity: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        super().__init__(config, capacity, 1, dtype, device)
        self.owner = torch.full((capacity,), -1, dtype=torch.long, device=device)
        self.lengths: dict[int, int] = {}
        self._written: list[int] = []  # the row of each slot the last forward wrote

    def add(self, row: int, prefilled: KVCache) -> None:
        """Append a new row whose committed tokens are `prefilled`'s (a cache it was prefilled in
        alone; empty for a one-token prompt)."""
        if row in self.lengths:
            raise ValueError(f"row {row} is in the cache already")
        n, start = prefilled.length, self.length
        if start + n > self.capacity:
            raise ValueError(f"cache holds {self.capacity} tokens; {start + n} requested")
        self.k[:, :, :, start:start + n] = prefilled.k[:, :, :, :n]
        self.v[:, :, :, start:start + n] = prefilled.v[:, :, :, :n]
        self.owner[start:start + n] = row
        self.lengths[row] = n
        self.length, self.written, self._written = start + n, 0, []

    def slot_positions(self) -> Tensor:
        """The position of the token in each committed slot: its index among its row's slots (what a
        sliding window measures distance by)."""
        owner = self.owner[:self.length]
        positions = torch.empty(self.length, dtype=torch.long, device=owner.device)
        for row in self.lengths:
            slots = (owner == row).nonzero().squeeze(1)
            positions[slots] = torch.arange(len(slots), device=owner.device)
        return positions

    def prepare(self, blocks: list[tuple[int, Tensor | None]]) -> Tensor | None:
        """Before a forward over several rows' new tokens, block after block: mark the slots it will
        write with their rows and return its mask. `blocks`: (row, mask [m, m] among its m new tokens,
        None for one token). The mask is bool [T, length + T], or None where every new token sees
        the whole cache (one row's one token)."""
        sizes = [1 if own is None else own.shape[0] for _, own in blocks]
        T, start = sum(sizes), self.length
        if start + T > self.capacity:
            raise ValueError(f"cache holds {self.capacity} tokens; {start + T} requested")
        first = start
        for (row, _), m in zip(blocks, sizes):
            self.owner[first:first + m] = row
            first += m
        self._written = [row for (row, _), m in zip(blocks, sizes) for _ in range(m)]  # each written slot's row
        if len(blocks) == 1 and blocks[0][1] is None and start == self.lengths[blocks[0][0]]:
            return None
        mask = torch.zeros(T, start + T, dtype=torch.bool, device=self.owner.device)
        first = 0
        for (row, own), m in zip(blocks, sizes):
            mask[first:first + m, :start] = self.owner[:start] == row
            mask[first:first + m, start + first:start + first + m] = True if own is None else own
            first += m
        return mask

    def keep(self, indices: list[int]) -> None:
        """Keep an ordered subset of the slots the last forward wrote (each row's accepted tokens)."""
        start, end = self.length - self.written, self.length
        owners = [self._written[i] for i in indices]
        super().keep(indices)
        if indices != list(range(len(indices))):  # a prefix keeps its owners in place
            self.owner[start:self.length] = torch.tensor(owners, dtype=torch.long, device=self.owner.device)
        self.owner[self.length:end] = -1
        for row in owners:
            self.lengths[row] += 1
        self._written = owners

    def drop(self, row: int) -> None:
        """Remove a row and its slots; the slots after them move down, in order."""
        length = self.length
        kept = (self.owner[:length] != row).nonzero().squeeze(1)
        n = len(kept)
        if n < length and not (n == 0 or int(kept[-1]) == n - 1):  # not a prefix: move the rest down
            self.k[:, :, :, :n] = self.k[:, :, :, kept]
            self.v[:, :, :, :n] = self.v[:, :, :, kept]
            self.owner[:n] = self.owner[kept]
        self.owner[n:length] = -1
        self.length, self.written, self._written = n, 0, []
        del self.lengths[row]
