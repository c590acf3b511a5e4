"""The drafting methods the one decoding loop runs, and their names on the command line.

A drafter is one file in this package: a `Proposer` (what drafts each round) and a `Method`
registered with `@register`, which says how the method is named and written (`name`, `syntax`,
`summary`), parses the text after "name:" in a spec (`options`, checked before anything is
loaded), names the `Artefact` it needs loaded beside the target (`needs`: an EAGLE head, a Medusa
head, a draft model, or None) and `bind`s itself to a target and sampling settings (outside any
timed generation), returning the factory the loop calls for a fresh proposer per generation.

Everything that lists methods reads this registry: the CLI's help, `eaglespec bench`, the Python
API (`Model.available_methods`), the server's `/v1/models` and its page, and the docs' table. No
method (None) is vanilla decoding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from eaglespec.decoding.proposer import Proposer
from eaglespec.decoding.sampling import Draws, SamplingParams
from eaglespec.errors import InvalidArgumentError


class Artefact(Enum):
    """What a method can need loaded beside the target; the value names the `Model` field (and
    the `eaglespec.load` argument's short name) that holds it."""

    EAGLE_HEAD = "head"
    MEDUSA_HEAD = "medusa"
    DRAFT_MODEL = "draft"

    @property
    def noun(self) -> str:
        return {Artefact.EAGLE_HEAD: "an EAGLE head", Artefact.MEDUSA_HEAD: "a Medusa head",
                Artefact.DRAFT_MODEL: "a draft model with the target's tokenizer"}[self]

    @property
    def help(self) -> str:
        """What it is and how to load one, on the command line and in Python."""
        return self.noun + ": " + {
            Artefact.EAGLE_HEAD: "--head PATH (a folder from `eaglespec train`), or --head default where one is "
                                 "shipped with eaglespec; in Python eaglespec.load(model, head=...)",
            Artefact.MEDUSA_HEAD: "--medusa-head PATH (a folder from `eaglespec train --head-type medusa`), or "
                                  "--medusa-head default where one is shipped; in Python "
                                  "eaglespec.load(model, medusa_head=...)",
            Artefact.DRAFT_MODEL: "--draft-model NAME, or eaglespec.load(model, draft_model=NAME)",
        }[self]


MakeProposer = Callable[[Draws, int], Proposer]  # (the row's draws, its token capacity) -> a proposer


@dataclass(frozen=True)
class Method:
    """A drafting method, checked when it is made. A method that needs an artefact takes it as its
    first field; the options `options()` parses are the rest."""

    name: ClassVar[str]  # what a spec starts with
    syntax: ClassVar[str]  # how a spec is written, for help texts
    summary: ClassVar[str]  # one line: what drafts, for help texts and the docs
    needs: ClassVar[Artefact | None] = None
    source: ClassVar[str] = ""  # what its drafted tokens are called where they are shown (default: its name)

    @staticmethod
    def options(arg: str) -> dict:
        """Constructor options from the text after "name:" ("" when there is none)."""
        if arg:
            raise InvalidArgumentError(f"this method takes no options, got ':{arg}'")
        return {}

    @classmethod
    def needs_for(cls, options: dict) -> Artefact | None:
        """What the method needs with these options (a hybrid without EAGLE needs no head)."""
        return cls.needs

    def bind(self, target, params: SamplingParams) -> MakeProposer:
        """The factory of this method's proposers for `target` (a `Target`) and these settings."""
        raise NotImplementedError


DRAFTERS: dict[str, type[Method]] = {}  # name -> method class, in registration order


def register(cls: type[Method]) -> type[Method]:
    """Register a method class by its `name` (a later class with the same name replaces it)."""
    if not (cls.name and cls.name.isidentifier() and cls.name != "vanilla"):
        raise ValueError(f"a drafting method needs a name that is an identifier other than 'vanilla', got {cls.name!r}")
    DRAFTERS[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    DRAFTERS.pop(name, None)


def method_help() -> str:
    """Every method's syntax: 'vanilla | eagle[:TREE] | ...'."""
    return " | ".join(["vanilla", *(cls.syntax for cls in DRAFTERS.values())])


def method_spec(method: str, tree: str = "auto") -> str:
    """The spec of a method name as the CLI and the Python API take it: bare "eagle" drafts `tree`."""
    return f"eagle:{tree}" if method == "eagle" else method


def _lookup(spec: str) -> tuple[type[Method] | None, dict]:
    """The method class of a spec (None: vanilla) and its constructor options; raises a one-line
    error on an unknown name or bad options."""
    name, colon, arg = spec.strip().partition(":")
    if name == "vanilla" and not colon:
        return None, {}
    if name not in DRAFTERS:
        raise InvalidArgumentError(f"unknown method '{spec}': expected {method_help()}")
    if colon and not arg:
        raise InvalidArgumentError(f"method '{spec}': give what follows the colon, or drop the colon")
    return DRAFTERS[name], DRAFTERS[name].options(arg)


def method_needs(spec: str) -> Artefact | None:
    """What a method needs loaded beside the target (checks the spec without loading anything)."""
    cls, options = _lookup(spec)
    return cls.needs_for(options) if cls else None


def parse_method(spec: str, **loaded: object) -> Method | None:
    """A method from its spec, given what is loaded by the names of the `Artefact` kinds
    (`head=`, `medusa=`, `draft=`; a missing or None one is not loaded). Raises a one-line error
    on anything else."""
    if unknown := set(loaded) - {kind.value for kind in Artefact}:
        raise TypeError(f"parse_method() got unknown artefacts {sorted(unknown)}")
    cls, options = _lookup(spec)
    if cls is None:
        return None
    needs = cls.needs_for(options)
    if needs is None:
        return cls(**options)
    artefact = loaded.get(needs.value)
    if artefact is None:
        raise InvalidArgumentError(f"method '{spec.strip()}' needs {needs.help}")
    return cls(artefact, **options)


def check_head_kind(method: str, head, wanted: str) -> None:
    """A head of the kind a method drafts with ("eagle": EAGLE-1 or EAGLE-3; "medusa")."""
    kind = "medusa" if getattr(head, "head_type", "") == "medusa" else "eagle"
    if head is not None and kind != wanted:
        raise InvalidArgumentError(f"method '{method}' drafts with {'a Medusa' if wanted == 'medusa' else 'an EAGLE'} "
                                   f"head, and this one is {'a Medusa' if kind == 'medusa' else 'an EAGLE'} head: "
                                   f"give it {'--medusa-head' if kind == 'medusa' else '--head'}")


def count_option(name: str, arg: str) -> int:
    """The K of name:K: a whole number >= 1."""
    if not (arg.isdigit() and int(arg) >= 1):
        raise InvalidArgumentError(f"method '{name}:{arg}': expected {name}:K with K >= 1 draft tokens")
    return int(arg)
