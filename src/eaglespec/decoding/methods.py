"""The drafting methods the one decoding loop runs, and their names on the command line.

A method is a recipe checked when it is made; `bind` prepares it for a target and sampling
settings (outside any timed generation) and returns the factory `decode` calls for a fresh
proposer per generation. No method (None) is vanilla decoding.

    eagle[:TREE]   EAGLE head drafting a tree (TREE: see `decoding.tree.parse_tree`; default auto)
    sps[:K]        classic speculative sampling: a smaller draft model drafts a chain of K (4)
    pld[:K]        prompt lookup: a chain of tokens copied from the prompt and output, as much of it
                   as pays on this machine up to 10 tokens, or with K always up to K
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eaglespec.decoding.draft_model import DraftModelProposer, check_draft_model
from eaglespec.decoding.eagle import EagleProposer
from eaglespec.decoding.prompt_lookup import PromptLookupProposer
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.decoding.tree import TREE_HELP, parse_tree
from eaglespec.errors import InvalidArgumentError

METHOD_HELP = f"vanilla | eagle[:TREE] ({TREE_HELP}) | sps[:K] | pld[:K]"


@dataclass(frozen=True)
class Eagle:
    head: object  # EagleHead
    tree: str = "auto"
    name = "eagle"
    # the `auto` sizing of the last generation per target and sampling settings, where the next starts
    learned: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        parse_tree(self.tree)

    def bind(self, target, params: SamplingParams):
        shape = parse_tree(self.tree)
        if not shape.auto:
            return lambda draws, capacity: EagleProposer(self.head, shape, params, draws, capacity)
        costs = target.model.verify_costs()  # measured once per model
        key = (target.model, params.temperature, params.top_p, params.top_k)

        def make(draws, capacity):
            proposer = EagleProposer(self.head, shape, params, draws, capacity, costs, self.learned.get(key))
            self.learned[key] = proposer.auto
            return proposer

        return make


@dataclass(frozen=True)
class DraftModel:
    draft: object  # a Target with the target's tokenizer
    num_tokens: int = 4
    name = "sps"

    def __post_init__(self):
        if self.num_tokens < 1:
            raise InvalidArgumentError(f"speculative sampling needs at least 1 draft token, got {self.num_tokens}")

    def bind(self, target, params: SamplingParams):
        check_draft_model(target, self.draft)
        return lambda draws, capacity: DraftModelProposer(self.draft.model, self.num_tokens, params, draws, capacity)


@dataclass(frozen=True)
class PromptLookup:
    num_tokens: int = 10
    max_ngram: int = 2
    sized: bool = False  # verify as much of each match as pays here (`pld`), not all of it (`pld:K`)
    name = "pld"

    def __post_init__(self):
        PromptLookupProposer(self.num_tokens, self.max_ngram)  # checks the numbers

    def bind(self, target, params: SamplingParams):
        costs = target.model.verify_costs() if self.sized else None  # measured once per model
        return lambda draws, capacity: PromptLookupProposer(self.num_tokens, self.max_ngram, costs)


Method = Eagle | DraftModel | PromptLookup


def method_name(spec: str) -> str:
    """Check a method's command-line name without loading anything; returns vanilla, eagle,
    sps or pld."""
    name, colon, arg = spec.strip().partition(":")
    if name == "vanilla" and not colon:
        return name
    if name == "eagle":
        parse_tree(arg or "auto")
        return name
    if name in ("sps", "pld"):
        if colon and not (arg.isdigit() and int(arg) >= 1):
            raise InvalidArgumentError(f"method '{spec}': expected {name}:K with K >= 1 draft tokens")
        return name
    raise InvalidArgumentError(f"unknown method '{spec}': expected {METHOD_HELP}")


def parse_method(spec: str, head=None, draft=None) -> Method | None:
    """A method from its command-line name; `head` and `draft` (a draft model's Target) are
    what eagle and sps need. Raises a one-line error on anything else."""
    name = method_name(spec)
    arg = spec.strip().partition(":")[2]
    if name == "vanilla":
        return None
    if name == "eagle":
        if head is None:
            raise InvalidArgumentError(
                "method 'eagle' needs an EAGLE head: --head default (or a head folder), or "
                "eaglespec.load(model, head='default')")
        return Eagle(head, arg or "auto")
    if name == "pld":
        return PromptLookup(int(arg)) if arg else PromptLookup(sized=True)
    if draft is None:
        raise InvalidArgumentError(
            "method 'sps' needs a draft model with the target's tokenizer: --draft-model NAME, or "
            "eaglespec.load(model, draft_model=NAME)")
    return DraftModel(draft, int(arg)) if arg else DraftModel(draft)
