"""A loaded model: the target with what it can draft with (an EAGLE head, a draft model, a Medusa
head), and the methods made for it, so that what `auto` learns carries from one generation to the
next. `eaglespec.load` (the Python API), the server and the benchmark load through here."""

from __future__ import annotations

from dataclasses import dataclass, field

from eaglespec.decoding.generate import Generation, GenerationOutput, generate
from eaglespec.decoding.drafters import DRAFTERS, Artefact, Method, method_needs, method_spec, parse_method
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.checkpoint import load_head, shipped_head, shipped_heads
from eaglespec.heads.head import DraftHead
from eaglespec.models.load import Target, load_target
from eaglespec.models.registry import DEFAULT_MODEL


@dataclass
class Model:
    target: Target
    head: DraftHead | None  # None: no EAGLE
    draft: Target | None = None  # a draft model for sps
    medusa: DraftHead | None = None  # a Medusa head for `medusa`
    # methods by name, made once, so that what `auto` learns carries from one generation to the next
    methods: dict[str, Method | None] = field(default_factory=dict, compare=False, repr=False)

    def stream(self, prompt: str | list[int], *, method: str | Method | None = None, tree: str = "auto",
               **kwargs) -> Generation:
        """A `Generation` to iterate for text pieces; `.output` holds the result at the end.

        method: "eagle" (the default with a head; drafting `tree`), "vanilla", "pld[:K]",
        "sps[:K]" (with a draft model), any registered method's spec (`decoding.drafters`) or a `Method`. Other keyword arguments are
        `Generation`'s: chat, max_new_tokens, do_sample, temperature, top_p, top_k, seed,
        stop_strings, ignore_eos."""
        return Generation(self.target, prompt, method=self.method(method, tree), **kwargs)

    def generate(self, prompt: str | list[int], *, method: str | Method | None = None, tree: str = "auto",
                 **kwargs) -> GenerationOutput:
        """Generate to the end (keyword arguments as for `stream`)."""
        return generate(self.target, prompt, method=self.method(method, tree), **kwargs)

    @property
    def artefacts(self) -> dict[str, object]:
        """What is loaded beside the target, by the names of the `Artefact` kinds (None: not loaded)."""
        return {kind.value: getattr(self, kind.value) for kind in Artefact}

    def available_methods(self) -> list[str]:
        """The method names this model can decode with, given what is loaded."""
        loaded = self.artefacts
        return ["vanilla", *(name for name in DRAFTERS if (needs := method_needs(name)) is None or loaded[needs.value] is not None)]

    def method(self, method: str | Method | None = None, tree: str = "auto") -> Method | None:
        """The method object for a name (as `stream` takes it; None: vanilla decoding), made once."""
        method = method or ("eagle" if self.head is not None else "vanilla")
        if not isinstance(method, str):
            return method
        spec = method_spec(method, tree)
        if spec not in self.methods:
            needs = method_needs(spec)
            if needs in (Artefact.EAGLE_HEAD, Artefact.MEDUSA_HEAD) and self.artefacts[needs.value] is None:
                kind = "medusa" if needs is Artefact.MEDUSA_HEAD else "eagle"
                raise InvalidArgumentError(f"method '{method}' needs {needs.help}; none is loaded for "
                                           f"{self.target.name} (heads are shipped for {shipped_heads(kind)})")
            self.methods[spec] = parse_method(spec, **self.artefacts)
        return self.methods[spec]


def load(model: str = DEFAULT_MODEL, head: str | None = "default", dtype: str = "bfloat16",
         device: str = "cpu", draft_model: str | None = None, weights: str = "dense",
         medusa_head: str | None = None) -> Model:
    """Load a target (bundled name, Hugging Face folder or .gguf), an EAGLE head for it
    ('default': the one we ship for the model, where there is one, else none; 'eagle3': the
    EAGLE-3 one we ship; a folder from `eaglespec train`; None: no head), optionally a smaller
    draft model with the same tokenizer for classic speculative sampling, and optionally a Medusa
    head (a folder, or 'default': the one we ship) for `medusa`. `weights` int8 / int4 runs the
    target's matrices quantized (CPU). Generation uses EAGLE where a head is loaded, else vanilla decoding."""
    target = load_target(model, dtype, device, weights)
    if head == "default" and shipped_head(target.name) is None:
        head = None
    draft = load_target(draft_model, dtype, device, weights) if draft_model else None
    medusa = load_head(medusa_head, target, "medusa") if medusa_head is not None else None
    return Model(target, load_head(head, target) if head is not None else None, draft, medusa)
