"""The Python API: a target and its head loaded in one call, `generate` with transformers' names.

    import eaglespec

    model = eaglespec.load("smollm2-135m-instruct", head="default")
    out = model.generate("Write a haiku about the sea.", chat=True, max_new_tokens=64)
    print(out.text, out.tokens_per_s, out.tau)
    for piece in model.stream("Tell me a story.", chat=True, do_sample=True, temperature=0.8):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglespec.decoding.generate import Generation, GenerationOutput, generate
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.checkpoint import load_head
from eaglespec.heads.head import EagleHead
from eaglespec.models.load import Target, load_target
from eaglespec.models.registry import DEFAULT_MODEL


@dataclass
class Model:
    target: Target
    head: EagleHead | None  # None: vanilla decoding only

    def stream(self, prompt: str | list[int], *, method: str | None = None, **kwargs) -> Generation:
        """A `Generation` to iterate for text pieces; `.output` holds the result at the end.

        method: "eagle" (the default with a head) or "vanilla". Other keyword arguments are
        `Generation`'s: chat, max_new_tokens, do_sample, temperature, top_p, top_k, seed,
        stop_strings, ignore_eos, tree."""
        return Generation(self.target, prompt, head=self._head(method), **kwargs)

    def generate(self, prompt: str | list[int], *, method: str | None = None, **kwargs) -> GenerationOutput:
        """Generate to the end (keyword arguments as for `stream`)."""
        return generate(self.target, prompt, head=self._head(method), **kwargs)

    def _head(self, method: str | None) -> EagleHead | None:
        method = method or ("eagle" if self.head is not None else "vanilla")
        if method not in ("eagle", "vanilla"):
            raise InvalidArgumentError(f"method must be 'eagle' or 'vanilla', got '{method}'")
        if method == "eagle" and self.head is None:
            raise InvalidArgumentError("method 'eagle' needs a head: eaglespec.load(model, head='default' or a folder)")
        return self.head if method == "eagle" else None


def load(model: str = DEFAULT_MODEL, head: str | None = "default", dtype: str = "bfloat16",
         device: str = "cpu") -> Model:
    """Load a target (bundled name, Hugging Face folder or .gguf) and an EAGLE head for it
    ('default': the shipped one; a folder from `eaglespec train`; None: no head)."""
    target = load_target(model, dtype, device)
    return Model(target, load_head(head, target) if head is not None else None)
