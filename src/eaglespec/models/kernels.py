"""Our C++ CPU kernels, compiled on first use (torch's JIT extension builder; about 40 s once,
then cached under ~/.cache/torch_extensions, one build per CPU type: they use its instructions).

`row_attention` (row_attention.cpp): attention for decoding and verification whose result for a
query row depends only on that row and the keys it sees, in slot order. Verification then gives
each tree node the numbers vanilla decoding gives it, so greedy speculative output equals
vanilla's in bf16 as in fp32. Where no C++ compiler is found, attention falls back to torch's
SDPA with a warning: outputs then match vanilla's in fp32 only up to rare near-ties.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

_module = None
_failed: str | None = None


def _load():
    global _module, _failed
    if _module is None and _failed is None:
        from torch.utils.cpp_extension import load

        try:
            _module = load(name=f"eaglespec_row_attention_{_cpu_type()}",
                           sources=[str(Path(__file__).with_name("row_attention.cpp"))],
                           extra_cflags=["-O3", "-march=native"], verbose=False)
        except Exception as err:  # no compiler, no ninja: fall back, once, loudly
            _failed = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            warnings.warn(f"eaglespec could not build its attention kernel ({_failed}); using torch's SDPA, "
                          "so bf16 speculative output may differ from vanilla's. Install g++ and ninja to fix.",
                          stacklevel=3)
    return _module


def _cpu_type() -> str:
    """A short fingerprint of the CPU's instruction sets (a build with -march=native runs there only)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return hashlib.sha1(flags.encode()).hexdigest()[:8]


def row_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(D)) v for q [B, H, M, D], keys/values [B, H, S, D], mask bool [M, S]
    or [B, 1, M, S] (None: every key visible); row-invariant on CPUs (see the module docstring).
    Training (gradients), autocast and other devices use torch's SDPA."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, keys, values))
    plain = q.device.type == "cpu" and not needs_grad and not torch.is_autocast_enabled("cpu")
    module = _load() if plain else None
    if module is None:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    if mask is not None:
        mask = mask.reshape(-1, *mask.shape[-2:])
    return module.row_attention(q, keys, values, mask, q.shape[-1] ** -0.5)
