"""What a round costs and yields, as the sizers of draft trees see it (`auto` trees, sized lookup
chains, Medusa and hybrid trees): the target's measured forward seconds by tokens, and the batch
the round shares.

Rows decoded together share one target forward, so a row's draft tokens slow every row's round.
Before a row drafts, the `Scheduler` sets `beside`: the tokens the round's other rows put in the
forward, the tokens they are expected to accept and their draft seconds. A sizer then maximizes
the whole round's tokens per second, (accepted beside + this row's expected tokens) / (draft
seconds beside + this row's + the forward over everyone's tokens), and trees shrink as the batch
fills. Alone, `beside` is empty and this is the row's own rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Beside:
    """The round's other rows: tokens in the forward, expected accepted tokens, draft seconds."""

    tokens: int = 0
    accepted: float = 0.0
    seconds: float = 0.0


@dataclass
class VerifyCosts:
    """`table[n]`: seconds of one target forward of n new tokens (`Decoder.verify_costs`); past its
    end a forward costs the last measured segment's seconds per token more."""

    table: list[float]
    beside: Beside = field(default_factory=Beside)

    def forward(self, n: int) -> float:
        """Seconds of the forward with this row's n tokens beside the other rows'."""
        total, last = self.beside.tokens + n, len(self.table) - 1
        if total <= last:
            return self.table[total]
        step = max(1, last // 4)
        return self.table[last] + (total - last) * (self.table[last] - self.table[last - step]) / step

    def rate(self, tokens: float, n: int, spent: float) -> float:
        """The round's tokens per second if this row verifies n tokens (its root included), expects
        `tokens` of them accepted (the bonus included) and spent `spent` seconds drafting."""
        return (self.beside.accepted + tokens) / (spent + self.beside.seconds + self.forward(n))
