"""What the decoding loop asks of a drafter each round: the `Proposer` base class.

A proposer drafts a tree under each round's root. It gets the prompt and its features once
(`start`; None for a one-token prompt), then each round:
- `propose(max_depth, budget)`: a generator that yields the draft head forwards it wants run
  (`HeadCall`s, which the `Scheduler` runs for every row in one forward, head_rows.py) and returns
  the round's tree. `budget` is the round's other rows (`sizing.Budget`), which sizing policies
  weigh the draft against. A proposer that runs no head writes `draft()` instead and yields nothing;
- `observe(logits)`: the logits of the extra rows its tree carried (`DraftTree.extra`), after the
  forward and before `accept`;
- `accept(tokens, features)`: the accepted tokens (bonus last) and the target's features at the
  positions before them: its final features, or with `reads` the hidden states entering those
  target layers, concatenated (an EAGLE-3 head).

A proposer that chooses between drafting and plain rounds from measured rates (`batch_chooses`:
`auto` EAGLE) lets a batch of such rows choose for all of them (`sizing.BatchChoice`): in a round
the batch decodes plainly, `skip()` stands for `propose`, and `accept` follows.
"""

from __future__ import annotations

from torch import Tensor

from eaglespec.decoding.head_rows import Drafting, HeadEntries
from eaglespec.decoding.sizing import ALONE, Budget
from eaglespec.decoding.tree import DraftTree, TreeShape


class Proposer:
    shape: TreeShape  # the largest draft it makes (the `Scheduler` reserves cache slots for it)
    reads: tuple[int, ...] = ()  # target layers whose input it reads; () the final features
    entries: HeadEntries | None = None  # its entries in a draft head's cache, where it runs one
    batch_chooses: bool = False  # whether a batch may choose its plain rounds (then `skip` them)
    # this round's head seconds over entries of rounds without a draft and over the prompt, and the
    # number of the former (batch_chooses)
    caught_up: tuple[float, float, int] = (0.0, 0.0, 0)

    def start(self, prompt_ids: list[int], features: Tensor | None) -> None:
        """The prompt, and the target's features at its positions but the last (None: one token)."""

    def propose(self, max_depth: int, budget: Budget = ALONE) -> Drafting:
        """The round's tree, no deeper than `max_depth` (what the loop can still accept)."""
        yield from ()  # no head forwards
        return self.draft(max_depth, budget)

    def draft(self, max_depth: int, budget: Budget = ALONE) -> DraftTree:
        """The round's tree, for a proposer that runs no draft head."""
        raise NotImplementedError(f"{type(self).__name__} defines neither propose() nor draft()")

    def skip(self) -> None:
        """This round has no draft: the batch decodes it plainly (`batch_chooses` proposers)."""
        raise NotImplementedError(f"{type(self).__name__} does not let a batch choose its plain rounds")

    def observe(self, logits: Tensor) -> None:
        """The logits [E, V] of the tree's extra rows."""

    def accept(self, tokens: list[int], features: Tensor) -> None:
        """The round's accepted tokens (bonus last) and the target's features before them."""

    def describe(self) -> str:
        """The draft's shape, for reports (`GenerationOutput.tree`)."""
        return self.shape.describe()
