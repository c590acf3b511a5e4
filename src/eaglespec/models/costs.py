"""What a target forward costs on this machine, as the sizers of draft trees see it
(`decoding.sizing`): seconds by the number of new tokens, measured once per model
(`Decoder.forward_costs`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ForwardCosts:
    """`table[n]`: seconds of one target forward of n new tokens; past its end a forward costs the
    last measured segment's seconds per token more."""

    table: list[float]

    def forward(self, n: int) -> float:
        """Seconds of a forward of n new tokens."""
        last = len(self.table) - 1
        if n <= last:
            return self.table[n]
        step = max(1, last // 4)
        return self.table[last] + (n - last) * (self.table[last] - self.table[last - step]) / step
