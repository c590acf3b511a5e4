"""The drafting methods the one decoding loop runs, and their names on the command line.

A method is a recipe checked when it is made; `bind` prepares it for a target and sampling
settings (outside any timed generation) and returns the factory `decode` calls for a fresh
proposer per generation. No method (None) is vanilla decoding.

Each method registers its name (`@register`), parses the text after "name:" in its spec
(`options`, checked before anything is loaded) and says what it needs loaded beside the target
(`needs`: an EAGLE head, a Medusa head, a draft model, or nothing); `parse_method` makes one from a spec.

    eagle[:TREE]   EAGLE head drafting a tree (TREE: see `decoding.tree.parse_tree`; default auto)
    sps[:K]        classic speculative sampling: a smaller draft model drafts a chain of K (4)
    pld[:K]        prompt lookup: a chain of tokens copied from the prompt and output, as much of it
                   as pays on this machine up to 10 tokens, or with K always up to K
    hybrid[:SOURCES]  one tree from EAGLE, lookup in this generation's text and a suffix cache of
                   earlier generations (`decoding.hybrid`); SOURCES joins some of them with "+",
                   "suffix=N" bounding the cache to N tokens (default all, 200000 tokens)
    lookahead[:W=5,N=4,G=5]  Lookahead decoding (`decoding.lookahead`): Jacobi iteration in a window of W
                   columns and N - 1 levels, run in the verification forward, and a pool of the
                   n-grams it produces (G per first token), verified as a trie under the root
    medusa[:N]     Medusa-1's tree of top-k candidates from a Medusa head (`decoding.medusa`), as many
                   nodes as pay on this machine, or with N always the N best

A method whose needs depend on its options says so with `needs_for(options)` (a hybrid without
EAGLE needs no head).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar
from weakref import WeakKeyDictionary

from eaglespec.decoding.draft_model import DraftModelProposer, check_draft_model
from eaglespec.decoding.eagle import EagleProposer
from eaglespec.decoding.hybrid import SOURCES, Calibration, HybridProposer
from eaglespec.decoding.lookahead import LookaheadProposer
from eaglespec.decoding.medusa import MedusaProposer
from eaglespec.decoding.ngram_index import NgramIndex
from eaglespec.decoding.prompt_lookup import PromptLookupProposer
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.decoding.tree import TREE_HELP, parse_tree
from eaglespec.errors import InvalidArgumentError

METHODS: dict[str, type] = {}  # name -> method class, in registration order
NEEDS = {  # what a method can need loaded, and what to do when it is missing
    "head": "an EAGLE head: --head PATH (a folder from `eaglespec train`), or --head default where one is "
            "shipped with eaglespec; in Python eaglespec.load(model, head=...)",
    "draft": "a draft model with the target's tokenizer: --draft-model NAME, or eaglespec.load(model, draft_model=NAME)",
    "medusa": "a Medusa head: --medusa-head PATH (a folder from `eaglespec train --head-type medusa`), or "
              "--medusa-head default where one is shipped; in Python eaglespec.load(model, medusa_head=...)",
}


def _check_head(method: str, head, wanted: str) -> None:
    """A head of the kind a method drafts with ("eagle": EAGLE-1 or EAGLE-3; "medusa")."""
    kind = "medusa" if getattr(head, "head_type", "") == "medusa" else "eagle"
    if head is not None and kind != wanted:
        raise InvalidArgumentError(f"method '{method}' drafts with {'a Medusa' if wanted == 'medusa' else 'an EAGLE'} "
                                   f"head, and this one is {'a Medusa' if kind == 'medusa' else 'an EAGLE'} head: "
                                   f"give it {'--medusa-head' if kind == 'medusa' else '--head'}")


def register(cls: type) -> type:
    METHODS[cls.name] = cls
    return cls


def _count(name: str, arg: str) -> int:
    """The K of name:K: a whole number >= 1."""
    if not (arg.isdigit() and int(arg) >= 1):
        raise InvalidArgumentError(f"method '{name}:{arg}': expected {name}:K with K >= 1 draft tokens")
    return int(arg)


@register
@dataclass(frozen=True)
class Eagle:
    head: object  # EagleHead
    tree: str = "auto"
    name: ClassVar[str] = "eagle"
    syntax: ClassVar[str] = f"eagle[:TREE] ({TREE_HELP})"
    needs: ClassVar[str] = "head"
    # per target model, then per sampling setting: the `auto` sizing of the last generation started,
    # where the next one starts
    learned: WeakKeyDictionary = field(default_factory=WeakKeyDictionary, init=False, compare=False, repr=False)

    def __post_init__(self):
        parse_tree(self.tree)
        _check_head("eagle", self.head, "eagle")

    @staticmethod
    def options(arg: str) -> dict:
        parse_tree(arg or "auto")
        return {"tree": arg} if arg else {}

    def bind(self, target, params: SamplingParams):
        shape = parse_tree(self.tree)
        if not shape.auto:
            return lambda draws, capacity: EagleProposer(self.head, shape, params, draws)
        costs = target.model.verify_costs()  # measured once per model
        learned = self.learned.setdefault(target.model, {})
        key = (params.temperature, params.top_p, params.top_k)

        def make(draws, capacity):
            proposer = EagleProposer(self.head, shape, params, draws, costs, learned.get(key))
            learned[key] = proposer.auto
            return proposer

        return make


@register
@dataclass(frozen=True)
class DraftModel:
    draft: object  # a Target with the target's tokenizer
    num_tokens: int = 4
    name: ClassVar[str] = "sps"
    syntax: ClassVar[str] = "sps[:K]"
    needs: ClassVar[str] = "draft"

    def __post_init__(self):
        if self.num_tokens < 1:
            raise InvalidArgumentError(f"speculative sampling needs at least 1 draft token, got {self.num_tokens}")

    @staticmethod
    def options(arg: str) -> dict:
        return {"num_tokens": _count("sps", arg)} if arg else {}

    def bind(self, target, params: SamplingParams):
        check_draft_model(target, self.draft)
        return lambda draws, capacity: DraftModelProposer(self.draft.model, self.num_tokens, params, draws, capacity)


@register
@dataclass(frozen=True)
class PromptLookup:
    num_tokens: int = 10
    max_ngram: int = 2
    sized: bool = False  # verify as much of each match as pays here (`pld`), not all of it (`pld:K`)
    name: ClassVar[str] = "pld"
    syntax: ClassVar[str] = "pld[:K]"
    needs: ClassVar[str] = ""

    def __post_init__(self):
        PromptLookupProposer(self.num_tokens, self.max_ngram)  # checks the numbers

    @staticmethod
    def options(arg: str) -> dict:
        return {"num_tokens": _count("pld", arg)} if arg else {"sized": True}

    def bind(self, target, params: SamplingParams):
        costs = target.model.verify_costs() if self.sized else None  # measured once per model
        return lambda draws, capacity: PromptLookupProposer(self.num_tokens, self.max_ngram, costs)


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
class Hybrid:
    head: object = None  # EagleHead, where "eagle" is a source
    sources: tuple[str, ...] = SOURCES
    cache_tokens: int = 200_000
    name: ClassVar[str] = "hybrid"
    syntax: ClassVar[str] = "hybrid[:SOURCES] (eagle+lookup+suffix[=TOKENS], any of them)"
    needs: ClassVar[str] = "head"
    state: WeakKeyDictionary = field(default_factory=WeakKeyDictionary, init=False, compare=False, repr=False)

    def __post_init__(self):
        if not self.sources or set(self.sources) - set(SOURCES):
            raise InvalidArgumentError(f"hybrid sources {'+'.join(self.sources)}: expected some of {'+'.join(SOURCES)}")
        if "eagle" in self.sources and self.head is None:
            raise InvalidArgumentError(f"hybrid with eagle needs {NEEDS['head']}")
        _check_head("hybrid", self.head, "eagle")
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

    @staticmethod
    def needs_for(options: dict) -> str:
        return "head" if "eagle" in options.get("sources", SOURCES) else ""

    def bind(self, target, params: SamplingParams):
        costs = target.model.verify_costs()  # measured once per model
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


@register
@dataclass(frozen=True)
class Medusa:
    head: object  # MedusaHead
    nodes: int | None = None  # None: sized on this machine's verify costs each round
    name: ClassVar[str] = "medusa"
    syntax: ClassVar[str] = "medusa[:N]"
    needs: ClassVar[str] = "medusa"
    # per target model, then per sampling setting: the heads' calibration, carried across generations
    calibrations: WeakKeyDictionary = field(default_factory=WeakKeyDictionary, init=False, compare=False, repr=False)

    def __post_init__(self):
        _check_head("medusa", self.head, "medusa")
        if self.nodes is not None and not 1 <= self.nodes <= 64:
            raise InvalidArgumentError(f"method 'medusa:{self.nodes}': expected medusa:N with 1 to 64 nodes")

    @staticmethod
    def options(arg: str) -> dict:
        return {"nodes": _count("medusa", arg)} if arg else {}

    def bind(self, target, params: SamplingParams):
        costs = target.model.verify_costs() if self.nodes is None else None  # measured once per model
        key = (params.temperature, params.top_p, params.top_k)
        calibration = self.calibrations.setdefault(target.model, {}).setdefault(key, Calibration())
        return lambda draws, capacity: MedusaProposer(self.head, self.nodes, calibration, costs)


@register
@dataclass(frozen=True)
class Lookahead:
    window: int = 5  # W
    ngram: int = 4  # N
    pool: int = 5  # G
    name: ClassVar[str] = "lookahead"
    syntax: ClassVar[str] = "lookahead[:W=5,N=4,G=5]"
    needs: ClassVar[str] = ""

    def __post_init__(self):
        LookaheadProposer(self.window, self.ngram, self.pool)  # checks the numbers

    @staticmethod
    def options(arg: str) -> dict:
        names = {"W": "window", "N": "ngram", "G": "pool"}
        options = {}
        for part in filter(None, arg.split(",")):
            key, eq, value = part.partition("=")
            if key not in names or names[key] in options or not eq or not value.isdigit():
                raise InvalidArgumentError(f"method 'lookahead:{arg}': expected lookahead:W=5,N=4,G=5 (any of them)")
            options[names[key]] = int(value)
        return options

    def bind(self, target, params: SamplingParams):
        return lambda draws, capacity: LookaheadProposer(self.window, self.ngram, self.pool)


Method = Eagle | DraftModel | PromptLookup | Hybrid | Medusa | Lookahead
METHOD_HELP = " | ".join(["vanilla", *(cls.syntax for cls in METHODS.values())])


def method_spec(method: str, tree: str = "auto") -> str:
    """The spec of a method name as the CLI and the Python API take it: bare "eagle" drafts `tree`."""
    return f"eagle:{tree}" if method == "eagle" else method


def _lookup(spec: str) -> tuple[type | None, dict]:
    """The method class of a spec (None: vanilla) and its constructor options; raises a one-line
    error on an unknown name or bad options."""
    name, colon, arg = spec.strip().partition(":")
    if name == "vanilla" and not colon:
        return None, {}
    if name not in METHODS:
        raise InvalidArgumentError(f"unknown method '{spec}': expected {METHOD_HELP}")
    if colon and not arg:
        raise InvalidArgumentError(f"method '{spec}': give what follows the colon, or drop the colon")
    return METHODS[name], METHODS[name].options(arg)


def _needs(cls: type, options: dict) -> str:
    return cls.needs_for(options) if hasattr(cls, "needs_for") else cls.needs


def method_needs(spec: str) -> str:
    """What a method needs loaded beside the target: "head", "medusa", "draft" or "" (checks the spec
    without loading anything)."""
    cls, options = _lookup(spec)
    return _needs(cls, options) if cls else ""


def parse_method(spec: str, head=None, draft=None, medusa=None) -> Method | None:
    """A method from its command-line name; `head` (an EAGLE head), `draft` (a draft model's
    Target) and `medusa` (a Medusa head) are what the methods that need them get. Raises a
    one-line error on anything else."""
    cls, options = _lookup(spec)
    if cls is None:
        return None
    needs = _needs(cls, options)
    loaded = {"head": head, "draft": draft, "medusa": medusa, "": None}[needs]
    if needs and loaded is None:
        raise InvalidArgumentError(f"method '{spec.strip()}' needs {NEEDS[needs]}")
    return cls(loaded, **options) if needs else cls(**options)
