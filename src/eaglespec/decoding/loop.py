"""The decoding loop. Each round runs one target forward over the round's root token (the last
accepted token, not yet in the cache) and accepts tokens from its logits.

Vanilla decoding is the loop with no proposer: the round verifies the root alone and accepts
one token. Speculative methods attach a draft tree under the root, verify it in the same
forward (tree mask and positions), keep the accepted path in the cache (`KVCache.keep`) and
accept several tokens per round. The prompt minus its last token is prefilled once; the last
prompt token is the first round's root, so every new token comes from a round and
tau = new tokens / target forwards is exactly 1 for vanilla decoding.

The loop decodes rows: `Scheduler` runs each round for every active row in one target forward
(the rows' tokens side by side in one `RowCache`, each seeing only its own), and rows join and
leave between rounds. `decode` is one row through it. A row's tokens are the ones it gets alone.
"""

from __future__ import annotations

import itertools
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from eaglespec.decoding.head_rows import Drafting, HeadCall, HeadResult, HeadRows
from eaglespec.decoding.proposer import Proposer
from eaglespec.decoding.sampling import Draws, SamplingParams
from eaglespec.decoding.sizing import BatchChoice, Budget
from eaglespec.decoding.tree import DraftTree
from eaglespec.decoding.verify import verify
from eaglespec.errors import InvalidArgumentError, PromptTooLongError
from eaglespec.models.decoder import Decoder
from eaglespec.models.row_cache import RowCache
from eaglespec.timing import Clock


@dataclass
class DecodeStats:
    new_tokens: int = 0
    target_forwards: int = 0  # verification forwards; the prefill is not counted
    finish_reason: str = ""  # "eos", "length", "context" or "stop"
    accepted_lengths: list[int] = field(default_factory=list)  # histogram: rounds that accepted i draft tokens
    tried: list[int] = field(default_factory=list)  # per depth d - 1: draft tokens at depth d the verifier tested
    accepted: list[int] = field(default_factory=list)  # ... and accepted
    sources: dict[str, int] = field(default_factory=dict)  # accepted draft tokens by source (trees that say)
    prefill_s: float = 0.0  # the prompt through the target (and the proposer's start)
    draft_s: float = 0.0  # proposer time per round
    verify_s: float = 0.0  # target forwards over the trees and acceptance

    @property
    def tau(self) -> float:
        """Average tokens accepted per target forward (bonus token included)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    def acceptance_by_depth(self) -> list[float]:
        """Share of tested draft tokens accepted, per depth. With a chain these are the paper's
        n-alpha: the token at depth n + 1 was drafted from n predicted features."""
        return [a / t for a, t in zip(self.accepted, self.tried) if t]

    def count_round(self, tree: DraftTree, path: list[int]) -> None:
        kids = tree.children()
        depth = len(path) + (1 if kids[path[-1] + 1 if path else 0] else 0)
        for d in range(depth):
            if d == len(self.tried):
                self.tried.append(0)
                self.accepted.append(0)
            self.tried[d] += 1
            self.accepted[d] += d < len(path)
        while len(self.accepted_lengths) <= len(path):
            self.accepted_lengths.append(0)
        self.accepted_lengths[len(path)] += 1


def check_max_new_tokens(max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise InvalidArgumentError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def check_prompt(model: Decoder, prompt_ids: list[int]) -> None:
    context = model.config.max_position_embeddings
    if not prompt_ids:
        raise InvalidArgumentError("the prompt is empty; give at least one token of text")
    if len(prompt_ids) >= context:
        raise PromptTooLongError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context holds {context}; "
            "shorten the prompt"
        )


@dataclass
class Request:
    """One sequence to decode: the prompt, how to sample, when to stop, and the drafter to make
    (`proposer(draws, capacity)`, None: vanilla decoding). `stats` is filled in as it decodes."""

    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    proposer: Callable[[Draws, int], Proposer] | None = None
    stats: DecodeStats = field(default_factory=DecodeStats)


class Row:
    """A request in the scheduler, and the handle to it: `tokens` holds what it accepted so far,
    `origins` where each came from (a drafted token's source, "draft" where the tree names none,
    or "target": the round's bonus token), `done` is set when it finished (`stats.finish_reason`
    says why)."""

    def __init__(self, model: Decoder, request: Request, id: int):
        check_max_new_tokens(request.max_new_tokens)
        check_prompt(model, request.prompt_ids)
        self.id, self.request, self.stats = id, request, request.stats
        self.draws = Draws(request.params.generator(tokens_device(model)))
        # tokens this row may hold: positions past the context have no rotary embedding
        self.capacity = min(len(request.prompt_ids) + request.max_new_tokens, model.config.max_position_embeddings)
        self.drafter = request.proposer(self.draws, self.capacity) if request.proposer else None
        self.slots = self.capacity + (self.drafter.shape.max_nodes if self.drafter else 0)  # with its largest tree
        self.root = request.prompt_ids[-1]
        self.tokens: list[int] = []
        self.origins: list[str] = []
        self.done = False
        # this row's part of a round (its latest): tokens in the forward and draft seconds
        self.round_tokens, self.draft_seconds = 1, 0.0

    def budget(self, rows: list[Row], together: set[Row] | tuple = (), drafts: bool = False) -> Budget:
        """The other rows' part of this round (for those yet to draft, of their latest; tokens
        accepted per round so far, one before their first). The draft seconds of the rows drafting
        `together` with this one are on its own clock already. `drafts`: the batch chose that this
        round drafts."""
        others = [row for row in rows if row is not self]
        return Budget(sum(o.round_tokens for o in others),
                      sum(max(o.stats.new_tokens, 1) / max(o.stats.target_forwards, 1) for o in others),
                      sum(o.draft_seconds for o in others if o not in together), drafts)

    @property
    def reads(self) -> tuple[int, ...]:
        return self.drafter.reads if self.drafter else ()


# per model: what batches learned about drafting (`Scheduler._batch_choice`)
BATCH_CHOICES: weakref.WeakKeyDictionary[Decoder, BatchChoice] = weakref.WeakKeyDictionary()


class Scheduler:
    """Rows decoded together: each round drafts every active row's tree, verifies them all in one
    target forward (each row's tokens see only its own, `RowCache`) and accepts each row's tokens.

    `submit(request)` queues a request and returns its `Row`; `step()` admits queued rows while a
    row and cache slots are free (first come, first served; a row reserves its prompt, its
    `max_new_tokens` and its largest draft tree), runs one round and returns the tokens each row
    accepted; `cancel(row)` ends a row and frees its slots. A request that could never fit, or
    whose drafter reads other target layers than the rows' drafters (EAGLE-3 beside EAGLE-1), is
    refused when submitted. Vanilla decoding is the round with no drafter: it verifies the root
    alone and accepts one token."""

    def __init__(self, model: Decoder, slots: int, max_rows: int = 1):
        if max_rows < 1:
            raise InvalidArgumentError(f"the batch size must be >= 1, got {max_rows}")
        self.model, self.max_rows = model, max_rows
        self.cache = RowCache(model.config, slots, model.weight_like.dtype, model.weight_like.device)
        self.heads: dict[object, HeadRows] = {}  # draft head -> the rows' entries in its cache
        self.queue: deque[Row] = deque()
        self.active: list[Row] = []
        self.reserved = 0  # slots the active rows may fill
        self.clock = Clock(tokens_device(model))
        self._ids = itertools.count()

    def submit(self, request: Request) -> Row:
        return self.enqueue(Row(self.model, request, next(self._ids)))

    def enqueue(self, row: Row) -> Row:
        if row.slots > self.cache.capacity:
            raise InvalidArgumentError(
                f"the request needs {row.slots} cache slots (prompt, max_new_tokens and draft tree) and the "
                f"batch's cache holds {self.cache.capacity}; lower max_new_tokens or make the cache larger")
        others = {other.reads for other in (*self.queue, *self.active) if other.drafter}
        if row.drafter and others and others != {row.reads}:
            raise InvalidArgumentError("rows decoded together must draft from the same target layers "
                                       f"({row.reads} against {sorted(others)}); decode them in separate batches")
        self.queue.append(row)
        return row

    def cancel(self, row: Row) -> None:
        """End a row now, queued or decoding; the other rows' output does not change."""
        if row in self.queue:
            self.queue.remove(row)
        elif row in self.active:
            self._leave(row)
        if not row.done:
            row.done, row.stats.finish_reason = True, row.stats.finish_reason or "cancelled"

    @property
    def idle(self) -> bool:
        return not self.queue and not self.active

    @torch.inference_mode()
    def step(self) -> list[tuple[Row, list[int]]]:
        """Admit what fits, run one round for every active row; (row, accepted tokens) per row
        that accepted any (a finished row's last tokens included; a row is done when it says so)."""
        self.clock.lap()  # the caller's time is not ours
        while self.queue and len(self.active) < self.max_rows and self.reserved + self.queue[0].slots <= self.cache.capacity:
            self._admit(self.queue.popleft())
        for row in list(self.active):
            if self.cache.lengths[row.id] + 1 > row.capacity:  # no room for the round's root
                row.stats.finish_reason = "context"
                self._leave(row)
        rows = list(self.active)
        if not rows:
            return []
        started = self.clock.now()
        choice = self._batch_choice(rows)
        if choice is None or choice.start_round(len(rows)):
            drafted = self._draft(rows, chosen=choice is not None)
        else:  # plain rounds pay better for this batch now
            for row in rows:
                if row.drafter:
                    row.drafter.skip()
                row.draft_seconds = 0.0
            drafted = [DraftTree() for _ in rows]
        trees, blocks, tokens, positions = [], [], [], []
        for row, tree in zip(rows, drafted):
            length = self.cache.lengths[row.id]
            ids, mask, offsets = tree.verify_inputs(row.root, 0, tokens_device(self.model))
            row.round_tokens = ids.shape[1]
            trees.append(tree)
            blocks.append((row.id, mask))
            tokens.append(ids)
            positions.append(offsets + length)
        reads = next((row.reads for row in rows if row.drafter), ())  # the same for every drafter (enqueue)
        mask = self.cache.prepare(blocks)
        logits, features = self.model(torch.cat(tokens, 1), self.cache, torch.cat(positions, 1), mask, capture=reads)
        forward_s = self.clock.lap()
        starts = [0, *itertools.accumulate(ids.shape[1] for ids in tokens)]
        verdicts = verify(trees, logits[0], starts[:-1], [row.request.params for row in rows], [row.draws for row in rows])
        kept_all, results = [], []
        for row, tree, first, last, (path, bonus) in zip(rows, trees, starts, starts[1:], verdicts):
            stats, request = row.stats, row.request
            if tree.extra is not None:
                row.drafter.observe(logits[0, first + 1 + len(tree):last])
            stats.target_forwards += 1
            stats.count_round(tree, path)
            kept = [first, *(first + i + 1 for i in path)]
            kept_all += kept
            accepted = [*(tree.tokens[i] for i in path), bonus][: request.max_new_tokens - stats.new_tokens]
            for i, token in enumerate(accepted):
                if token in request.eos_token_ids:
                    accepted = accepted[: i + 1]
                    stats.finish_reason = "eos"
                    break
            stats.new_tokens += len(accepted)
            row.origins += [*(tree.sources[i] if tree.sources else "draft" for i in path), "target"][:len(accepted)]
            for i in path[:len(accepted)] if tree.sources else ():
                stats.sources[tree.sources[i]] = stats.sources.get(tree.sources[i], 0) + 1
            if not stats.finish_reason and stats.new_tokens == request.max_new_tokens:
                stats.finish_reason = "length"
            results.append((row, accepted, kept))
        self.cache.keep(kept_all)
        own_s = self.clock.lap()
        for row, accepted, kept in results:
            if row.drafter and not row.stats.finish_reason:
                row.drafter.accept(accepted, features[:, kept])
            row.stats.verify_s += forward_s + own_s / len(results) + self.clock.lap()
            row.tokens += accepted
            row.root = accepted[-1]
            if row.stats.finish_reason:
                self._leave(row)
        if choice is not None:  # (the rows' catch-ups run in one head forward: the longest counts)
            waited, prompt, entries = (max(parts) for parts in zip(*(row.drafter.caught_up for row in rows)))
            choice.finish_round(sum(len(accepted) for _, accepted, _ in results), self.clock.now() - started - prompt,
                                waited, entries)
        return [(row, accepted) for row, accepted, _ in results]

    def _batch_choice(self, rows: list[Row]) -> BatchChoice | None:
        """The batch's choice between drafting and plain rounds (`sizing.BatchChoice`), where every
        one of several rows has a drafter that makes that choice from measured rates (`auto` EAGLE),
        one per model, kept for later schedulers (a process learns once what drafting is worth at
        each batch size); None: each row drafts as its drafter says (alone, its own choice is the
        batch's; other drafters size their drafts round by round, down to none)."""
        if len(rows) < 2 or not all(row.drafter and row.drafter.batch_chooses for row in rows):
            return None
        if self.model not in BATCH_CHOICES:
            BATCH_CHOICES[self.model] = BatchChoice(self.model.forward_costs())
        return BATCH_CHOICES[self.model]

    def _draft(self, rows: list[Row], chosen: bool = False) -> list[DraftTree]:
        """Each row's tree (empty without a drafter). Drafters that run no draft head draft alone, in
        turn; then those that run one draft together, each step's head forwards in one forward per
        head (`HeadRows.run`), the time they take together on each one's clock and split evenly
        among them in their stats. Each drafter gets the budget of the rows beside it (`chosen`:
        the batch chose that they draft)."""
        context = self.model.config.max_position_embeddings
        trees: dict[Row, DraftTree] = {row: DraftTree() for row in rows}
        depths: dict[Row, int] = {}
        drafters = [row for row in rows if row.drafter]
        together = {row for row in drafters if row.drafter.entries is not None}
        for row in drafters:
            # deeper nodes could not be accepted (max_new_tokens) or have no position (context)
            depths[row] = min(row.request.max_new_tokens - row.stats.new_tokens, context - self.cache.lengths[row.id]) - 1
        for row in drafters:
            if row not in together:
                trees[row] = _alone(row.drafter.propose(depths[row], row.budget(rows, drafts=chosen)))
                row.draft_seconds = self.clock.lap()
                row.stats.draft_s += row.draft_seconds
        drafting: dict[Row, Drafting] = {row: row.drafter.propose(depths[row], row.budget(rows, together, chosen))
                                         for row in drafters if row in together}
        results: dict[Row, HeadResult | None] = dict.fromkeys(drafting)
        while drafting:
            calls: dict[HeadRows, list[tuple[Row, HeadCall]]] = {}
            for row, draft in list(drafting.items()):
                try:
                    call = draft.send(results[row])
                except StopIteration as done:
                    trees[row] = done.value
                    del drafting[row]
                    continue
                calls.setdefault(call.entries.rows, []).append((row, call))
            for head_rows, asked in calls.items():
                results.update(zip((row for row, _ in asked), head_rows.run([call for _, call in asked])))
        if together:
            share = self.clock.lap() / len(together)
            for row in together:
                row.draft_seconds = share
                row.stats.draft_s += share
        return [trees[row].prune(row.slots - self.cache.lengths[row.id] - 1, depths[row]) if row in depths
                else trees[row] for row in rows]

    def _admit(self, row: Row) -> None:
        """Prefill the row's prompt but its last token alone (the same forward as a row decoded
        alone), add it to the cache and start its drafter."""
        prompt = row.request.prompt_ids
        prefilled = self.model.new_cache(len(prompt) - 1)
        features = None  # a one-token prompt has nothing to prefill
        if len(prompt) > 1:
            ids = torch.tensor([prompt[:-1]], device=tokens_device(self.model))
            _logits, features = self.model(ids, prefilled, last_logits_only=True, capture=row.reads)
        self.cache.add(row.id, prefilled)
        if row.drafter:
            if (entries := row.drafter.entries) is not None:
                if entries.head not in self.heads:
                    self.heads[entries.head] = HeadRows(entries.head)
                self.heads[entries.head].add(entries)
            row.drafter.start(prompt, features)
        self.active.append(row)
        self.reserved += row.slots
        row.stats.prefill_s += self.clock.lap()

    def _leave(self, row: Row) -> None:
        self.active.remove(row)
        self.reserved -= row.slots
        self.cache.drop(row.id)
        if row.drafter and (entries := row.drafter.entries) is not None:
            entries.rows.remove(entries)
        row.done = True


def _alone(draft: Drafting) -> DraftTree:
    """The tree of a draft that runs no draft head (it yields no head forward)."""
    try:
        call = next(draft)
    except StopIteration as done:
        return done.value
    raise TypeError(f"a proposer without head entries asked for a head forward ({call!r})")


def tokens_device(model: Decoder) -> torch.device:
    return model.embed.weight.device


def decode(model: Decoder, prompt_ids: list[int], params: SamplingParams, max_new_tokens: int,
           eos_token_ids: frozenset[int] = frozenset(), stats: DecodeStats | None = None,
           proposer: Callable[[Draws, int], Proposer] | None = None) -> Iterator[list[int]]:
    """Yield the tokens each round accepts, until EOS (included), `max_new_tokens` or the context limit:
    one row through the `Scheduler`. `proposer(draws, capacity)` makes the round's drafter (None:
    vanilla decoding). `stats` is filled in as the loop runs; closing the iterator early (stop
    strings) is allowed."""
    request = Request(prompt_ids, params, max_new_tokens, eos_token_ids, proposer,
                      stats if stats is not None else DecodeStats())
    row = Row(model, request, 0)
    scheduler = Scheduler(model, row.slots)
    scheduler.enqueue(row)
    while not row.done:
        for _, accepted in scheduler.step():
            yield accepted
