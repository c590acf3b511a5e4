"""`hybrid[:SOURCES]`: one draft tree from several sources, verified in one target forward.

Sources, each proposing paths under the round's root with an estimate of how likely the target
accepts them:
- `eagle`: the EAGLE head's dynamic-tree candidates (`EagleProposer.candidates`; `auto` decides
  which rounds run the head), estimated by their draft path probability times its calibration
  (accepted over predicted, as `AutoSize` keeps it);
- `lookup`: what followed the earlier occurrences of the text's tail in this generation (prompt
  and output), a trie of continuations each scored by the share of occurrences it continued;
- `suffix`: the same over earlier generations of this process (the suffix cache, bounded).
A copied path's share is scaled by the measured accepted-over-predicted ratio of its source
and match length (`Calibration`), so each source's estimates are kept honest by the tokens it
gets accepted. Paths from several sources merge into one trie (a node proposed twice keeps the
better estimate), and the round verifies the n best nodes that maximize (1 + expected accepted)
/ (time spent drafting + the target's measured cost of n + 1 tokens): none where nothing pays.

Every node is chosen, not sampled, so the verifier treats the tree as point-mass proposals:
greedy output is vanilla's, and sampled output follows the target's distribution exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar
from weakref import WeakKeyDictionary

from torch import Tensor

from eaglespec.decoding.drafters.eagle import EagleProposer
from eaglespec.decoding.drafters.registry import Artefact, Method, check_head_kind, register
from eaglespec.decoding.head_rows import Drafting
from eaglespec.decoding.ngram_index import NgramIndex
from eaglespec.decoding.proposer import Proposer
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.decoding.sizing import ALONE, Budget, Calibration, RoundCosts, best_prefix
from eaglespec.decoding.tree import DraftTree, parse_tree
from eaglespec.errors import InvalidArgumentError
from eaglespec.models.costs import ForwardCosts
from eaglespec.timing import Clock

SOURCES = ("eagle", "lookup", "suffix")
COPY_DEPTH = 16  # tokens of a copied continuation
COPY_PATHS = 32  # paths of one source's continuation trie


def match_class(match: int) -> int:
    """Match lengths in classes 2-3, 4-7, 8-15, 16+ (as 2, 3, 4, 5)."""
    return min(match.bit_length(), 5)


@dataclass
class Node:
    estimate: float  # the chance the target accepts the path to this node
    source: str  # the source of the best estimate
    proposals: dict[tuple, float] = field(default_factory=dict)  # calibration key -> raw estimate


class HybridProposer(Proposer):
    def __init__(self, eagle: EagleProposer | None, lookup: bool, cache: NgramIndex | None,
                 calibration: Calibration, costs: ForwardCosts):
        """`eagle`: an `auto` EAGLE proposer (None: no head); `lookup`: copy from this generation's
        text; `cache`: the suffix cache of earlier generations (None: none)."""
        self.eagle, self.cache, self.calibration, self.costs = eagle, cache, calibration, costs
        self.shape = eagle.shape if eagle else parse_tree("auto")
        self.reads = eagle.reads if eagle else ()
        self.entries = eagle.entries if eagle else None
        self.text = NgramIndex() if lookup else None
        self.history: list[int] = []  # the prompt and every accepted token; the root is last
        self.clock = eagle.clock if eagle else Clock("cpu")
        self.nodes: dict[tuple[int, ...], Node] = {}  # the last round's verified nodes by path
        self.sizes: list[int] = []

    def start(self, prompt_ids: list[int], features: Tensor | None) -> None:
        self.history[:] = prompt_ids  # the list the method keeps for its suffix cache
        if self.text is not None:
            self.text_id = self.text.add(prompt_ids)
        if self.eagle:
            self.eagle.start(prompt_ids, features)

    def propose(self, max_depth: int, budget: Budget = ALONE) -> Drafting:
        """A generator (the EAGLE part's head forwards, head_rows.py) that returns the tree."""
        started = self.clock.now()
        nodes: dict[tuple[int, ...], Node] = {}

        def add(path: tuple[int, ...], key: tuple, raw: float, estimate: float) -> None:
            node = nodes.get(path)
            if node is None:
                node = nodes[path] = Node(estimate, key[0])
            elif estimate > node.estimate:
                node.estimate, node.source = estimate, key[0]
            node.proposals[key] = raw

        if self.eagle:
            pool, scores = yield from self.eagle.candidates(max_depth, budget)
            scale = self.eagle.auto.calibration
            for path, score in zip(pool.paths(), scores):
                add(path, ("eagle",), math.exp(score), min(1.0, scale * math.exp(score)))
        for source, index in (("lookup", self.text), ("suffix", self.cache)):
            found = index.continuations(self.history, min(COPY_DEPTH, max_depth), COPY_PATHS) if index else None
            if found:
                key = (source, match_class(found.match))
                scale = self.calibration.factor(key)
                for path, share in zip(found.paths, found.shares):
                    add(path, key, share, min(1.0, scale * share))
        # best first; a node's estimate never exceeds its parent's, and ties go to the shorter path,
        # so every prefix of the order is a tree
        order = sorted(nodes, key=lambda p: (-nodes[p].estimate, len(p)))[: self.shape.max_nodes]
        if self.eagle:  # the head's pass over entries that waited is charged by `auto`, not to this round
            started = max(started, self.eagle.auto.round_start)
        n, _ = best_prefix([nodes[p].estimate for p in order], RoundCosts(self.costs, budget), self.clock.now() - started,
                           plain=True)
        chosen = sorted(order[:n], key=len)
        self.nodes = {p: nodes[p] for p in chosen}
        self.sizes.append(n)
        if self.eagle and self.eagle.auto.drafting:
            mine = [node.proposals[("eagle",)] for node in self.nodes.values() if ("eagle",) in node.proposals]
            self.eagle.auto.chose(len(mine), sum(mine))
        index = {p: i for i, p in enumerate(chosen)}
        return DraftTree([p[-1] for p in chosen], [index[p[:-1]] if len(p) > 1 else -1 for p in chosen],
                         sources=[nodes[p].source for p in chosen])

    def accept(self, tokens: list[int], features: Tensor) -> None:
        path = tuple(tokens[:-1])  # the accepted draft tokens
        accepted = [self.nodes[path[:d]] for d in range(1, len(path) + 1)]
        predicted: dict[tuple, float] = {}
        hits: dict[tuple, int] = {}
        for node in self.nodes.values():
            for key, raw in node.proposals.items():
                predicted[key] = predicted.get(key, 0.0) + raw
        for node in accepted:
            for key in node.proposals:
                hits[key] = hits.get(key, 0) + 1
        for key in predicted:
            if key != ("eagle",):
                self.calibration.update(key, hits.get(key, 0), predicted[key])
        if self.eagle:
            self.eagle.accept(tokens, features, hits.get(("eagle",), 0))
        self.history.extend(tokens)
        if self.text is not None:
            self.text.extend(self.text_id, tokens)

    def describe(self) -> str:
        sources = [s for s, on in zip(SOURCES, (self.eagle, self.text, self.cache)) if on is not None]
        drafting = [n for n in self.sizes if n]
        mean = sum(drafting) / len(drafting) if drafting else 0.0
        return (f"hybrid:{'+'.join(sources)} (mean {mean:.1f} tokens per drafting round, {len(drafting)} of "
                f"{len(self.sizes)} rounds drafting)")


@dataclass
class HybridState:
    """What a `hybrid` method keeps per target model across generations."""

    cache: NgramIndex | None  # earlier generations' texts
    learned: dict = field(default_factory=dict)  # sampling setting -> the EAGLE part's `auto` sizing
    calibrations: dict = field(default_factory=dict)  # sampling setting -> Calibration of the copying sources
    last: list[int] | None = None  # the last generation's text (its final round's tokens aside), which joins
    # the cache when the next one starts


@register
@dataclass(frozen=True)
class Hybrid(Method):
    head: object = None  # EagleHead, where "eagle" is a source
    sources: tuple[str, ...] = SOURCES
    cache_tokens: int = 200_000
    name: ClassVar[str] = "hybrid"
    syntax: ClassVar[str] = "hybrid[:SOURCES]"
    summary: ClassVar[str] = ("one tree from EAGLE, lookup in this generation's text and a suffix cache of earlier "
                              "generations; SOURCES joins some of them with '+' (eagle+lookup+suffix[=TOKENS])")
    needs: ClassVar[Artefact] = Artefact.EAGLE_HEAD
    state: WeakKeyDictionary = field(default_factory=WeakKeyDictionary, init=False, compare=False, repr=False)

    def __post_init__(self):
        if not self.sources or set(self.sources) - set(SOURCES):
            raise InvalidArgumentError(f"hybrid sources {'+'.join(self.sources)}: expected some of {'+'.join(SOURCES)}")
        if "eagle" in self.sources and self.head is None:
            raise InvalidArgumentError(f"hybrid with eagle needs {Artefact.EAGLE_HEAD.help}")
        check_head_kind("hybrid", self.head, "eagle")
        NgramIndex(self.cache_tokens)  # checks the bound

    @staticmethod
    def options(arg: str) -> dict:
        if not arg:
            return {}
        sources, options = [], {}
        for part in arg.split("+"):
            name, eq, value = part.partition("=")
            if name not in SOURCES or name in sources or (eq and (name != "suffix" or not value.lstrip("-").isdigit())):
                raise InvalidArgumentError(
                    f"method 'hybrid:{arg}': expected some of {'+'.join(SOURCES)} joined by '+', once each, "
                    "suffix=N for a suffix cache of N tokens")
            sources.append(name)
            if eq:
                options["cache_tokens"] = int(value)
        return {"sources": tuple(sources), **options}

    @classmethod
    def needs_for(cls, options: dict) -> Artefact | None:
        return Artefact.EAGLE_HEAD if "eagle" in options.get("sources", SOURCES) else None

    def bind(self, target, params: SamplingParams):
        costs = target.model.forward_costs()  # measured once per model
        state = self.state.setdefault(
            target.model, HybridState(NgramIndex(self.cache_tokens) if "suffix" in self.sources else None))
        key = (params.temperature, params.top_p, params.top_k)
        calibration = state.calibrations.setdefault(key, Calibration())
        shape = parse_tree("auto")

        def make(draws, capacity):
            eagle = None
            if "eagle" in self.sources:
                eagle = EagleProposer(self.head, shape, params, draws, costs, state.learned.get(key))
                state.learned[key] = eagle.auto
            if state.cache is not None and state.last is not None:
                state.cache.add(state.last)
            proposer = HybridProposer(eagle, "lookup" in self.sources, state.cache, calibration, costs)
            state.last = proposer.history  # the list the proposer extends
            return proposer

        return make
