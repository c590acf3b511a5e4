"""What every benchmark script records beside its figures, and how it writes them."""

from eaglespec.files import write_json  # noqa: F401
from eaglespec.models.machine import machine  # noqa: F401

# Our weight formats, by label: (activation dtype, --weights), and the llama.cpp copy of the same
# GGUF that each is compared with (by its --weights: dense = BF16, int8 = Q8_0, int4 = the GGUF).
FORMATS = {"bf16": ("bfloat16", "dense"), "fp32": ("float32", "dense"), "int8": ("bfloat16", "int8"),
           "int4": ("bfloat16", "int4"), "int4-fp32": ("float32", "int4")}
PEER = {"llama.cpp BF16": "dense", "llama.cpp Q8_0": "int8", "llama.cpp GGUF (4-bit)": "int4"}


def formats_option(value: str) -> list[str]:
    """A --formats value (comma-separated labels of FORMATS), checked."""
    labels = value.split(",")
    unknown = sorted(set(labels) - set(FORMATS))
    if unknown:
        raise SystemExit(f"unknown format(s) {', '.join(unknown)}: use {', '.join(FORMATS)}")
    return labels
