"""The Python API: a target and its head loaded in one call, `generate` with transformers' names.

    import eaglespec

    model = eaglespec.load("smollm2-135m-instruct", head="default")
    out = model.generate("Write a haiku about the sea.", chat=True, max_new_tokens=64)
    print(out.text, out.tokens_per_s, out.tau)
    for piece in model.stream("Tell me a story.", chat=True, do_sample=True, temperature=0.8):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

from eaglespec.decoding.model import Model, load

__all__ = ["Model", "load"]
