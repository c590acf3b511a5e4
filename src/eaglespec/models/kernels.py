"""Our C++ CPU kernels, compiled on first use (torch's JIT extension builder; about a minute once,
then cached under ~/.cache/torch_extensions, one build per CPU type: they use its instructions).

An interrupted build leaves nothing that blocks the next one (see `_load`).

`row_attention` (row_attention.cpp): attention for decoding and verification whose result for a
query row depends only on that row and the keys it sees, in slot order.
`row_linear` and `row_linear_bf16` (row_linear.cpp): linear layers over fp32 or bf16 weights (bf16
in their own tiled layout from `pack_bf16`) whose result for a row depends only on that row (one
fixed-order dot product per output), reading the weights once for all the rows of a call; likewise
over 8- and 4-bit weights (int8_linear.cpp, int4_linear.cpp). Each runs on the best unit the CPU
has: AMX tiles (amx.h: bf16 and int4, unless EAGLESPEC_AMX=0; a forward over up to 16 rows costs
about what one row does), AVX-512 (with BF16 for bf16 and int4), else AVX2 (avx2.h: products in
fp32 lanes, whose cost grows with every row).
`rms_norm`, `gated`, `rope_store` (layer_ops.cpp): a decoder layer's small operations, one call
each instead of about 60 operator calls per layer, row by row.
`LayerStack` (layer_stack.cpp): the target's decoder layers for inference, one call for all of
them (the same operations and kernels as the Python layers, without their dispatch).

Verification then gives each tree node the numbers vanilla decoding gives it, so greedy speculative
output equals vanilla's in bf16 as in fp32. Where no C++ compiler is found, attention falls back to
torch's SDPA (with a warning: outputs may then differ from vanilla's at rare near-ties) and fp32
linears to MKL with rows padded to a multiple of 4, which keeps them row-invariant.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
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

        name = f"eaglespec_kernels_{_cpu_type()}"
        build = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions") / name
        try:
            build.mkdir(parents=True, exist_ok=True)
            with open(build / "eaglespec.flock", "w") as guard:
                # One build at a time, under a lock the OS drops when its process dies; torch's own
                # marker file is then left only by an interrupted build, and would block every later
                # load forever: remove it.
                fcntl.flock(guard, fcntl.LOCK_EX)
                (build / "lock").unlink(missing_ok=True)
                _module = load(name=name, sources=_copied_sources(build),
                               # -fopenmp: at::parallel_for is OpenMP in the headers; without it every kernel
                               # ran on one thread (torch's bundled libgomp is the runtime either way)
                               extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                               build_directory=str(build), verbose=False)
        except Exception as err:  # no compiler, no ninja: fall back, once, loudly
            _failed = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            warnings.warn(f"eaglespec could not build its CPU kernels ({_failed}); using torch's attention and "
                          "linears, so bf16 speculative output may differ from vanilla's. Install g++ and ninja "
                          "to fix.",
                          stacklevel=3)
    return _module


SOURCES = ("kernels.cpp", "row_attention.cpp", "row_linear.cpp", "int4_linear.cpp", "int8_linear.cpp",
           "layer_ops.cpp", "layer_stack.cpp")
HEADERS = ("amx.h", "avx2.h", "row_groups.h")


def _copied_sources(build: Path) -> list[str]:
    """The C++ sources, copied into the build folder where they differ from its copies: the build
    then depends on their contents, not on where eaglespec is installed, so a checkout and a wheel of
    the same code share one compiled module (ninja recompiles everything when a source's path
    changes: 2 minutes on 2 cores)."""
    copies = build / "src"
    copies.mkdir(exist_ok=True)
    for name in SOURCES + HEADERS:
        text, copy = Path(__file__).with_name(name).read_bytes(), copies / name
        if not copy.is_file() or copy.read_bytes() != text:  # an unchanged copy keeps its time: no rebuild
            partial = copy.with_name(copy.name + ".partial")
            partial.write_bytes(text)
            os.replace(partial, copy)
    return [str(copies / name) for name in SOURCES]


def _cpu_type() -> str:
    """A short fingerprint of the CPU's instruction sets (a build with -march=native runs there only)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return hashlib.sha1(flags.encode()).hexdigest()[:8]


def plain_cpu(*tensors: Tensor) -> bool:
    """Our kernels' case: CPU tensors, no gradient to track, no autocast."""
    return (tensors[0].device.type == "cpu" and not torch.is_autocast_enabled("cpu")
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)))


def row_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
    """x [M, K] @ weight [N, K]^T (+ bias) for fp32 weights, row-invariant; None where our kernel does
    not apply (no compiler or no AVX2, gradients, other dtypes or devices, K not a multiple of 8)."""
    if not (plain_cpu(x, weight) and weight.dtype == torch.float32 and x.dtype in (torch.float32, torch.bfloat16)
            and x.shape[-1] % 8 == 0):
        return None
    module = _load()
    return module.row_linear(x, weight, bias) if module is not None and module.row_linear_available() else None


def pack_bf16(weight: Tensor) -> Tensor | None:
    """A bf16 CPU weight [N, K] in the layout of our bf16 kernel, where this CPU runs it (AVX2), else
    None."""
    if not (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and weight.shape[-1] % 2 == 0):
        return None
    module = _load()
    return module.pack_bf16(weight.detach()) if module is not None and module.row_linear_bf16_available() else None


def row_linear_bf16(x: Tensor, tiles: Tensor, out_features: int, bias: Tensor | None) -> Tensor:
    """x [M, K] bf16 @ W^T (+ bias) with W packed by `pack_bf16`, row-invariant for any M."""
    return _load().row_linear_bf16(x, tiles, out_features, bias)


def bf16_linear_unit() -> str:
    """What runs bf16 linears here: "amx" (our kernel on the tile unit, for K a multiple of 32; our
    int4 kernel then runs on it too), "avx512-bf16" or "avx2" (our kernels on vector units) or
    "torch" (torch's, where ours is not built)."""
    module = _load()
    if module is None or not module.row_linear_bf16_available():
        return "torch"
    return module.row_linear_bf16_unit()


def pack_int4(codes: Tensor, scale: Tensor, low: Tensor) -> Tensor | None:
    """4-bit weights (codes [N, K] in 0..15, w = codes * scale + low with scale and low [K / 32, N])
    in the layout of our int4 kernel, where this CPU runs it (AVX2), else None."""
    module = _load() if codes.device.type == "cpu" else None
    return module.pack_int4(codes, scale, low) if module is not None and module.row_linear_int4_available() else None


def quantized_inputs(kind: str) -> str:
    """How our `kind` ("int4" or "int8") kernel multiplies here: "bf16" (the inputs as they are, exact
    products: AVX-512, AMX), "int8" (AVX2 alone: the inputs rounded to 8-bit codes per group of 32
    inputs, scale max |x| / 127, and integer products, as llama.cpp's CPU kernels do) or "torch"
    (torch's kernel)."""
    module = _load()
    if module is None or not getattr(module, f"row_linear_{kind}_available")():
        return "torch"
    return getattr(module, f"row_linear_{kind}_inputs")()


def row_linear_int4(x: Tensor, packed: Tensor, out_features: int) -> Tensor:
    """x [M, K] bf16 @ W^T with W packed by `pack_int4`, row-invariant for any M; bf16 [M, N]."""
    return _load().row_linear_int4(x, packed, out_features)


def pack_int8(codes: Tensor) -> Tensor | None:
    """8-bit codes [N, K] in the layout of our int8 kernel, where this CPU runs it (AVX2), else None."""
    module = _load() if codes.device.type == "cpu" else None
    if module is None or not module.row_linear_int8_available():
        return None
    if module.row_linear_int8_inputs() == "int8" and codes.shape[1] % 32:  # it rounds inputs in groups of 32
        return None
    return module.pack_int8(codes)


def row_linear_int8(x: Tensor, packed: Tensor, scale: Tensor, out_features: int) -> Tensor:
    """x [M, K] bf16 @ (codes * scale)^T with codes packed by `pack_int8`, row-invariant; bf16 [M, N]."""
    return _load().row_linear_int8(x, packed, scale, out_features)


def row_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, scale: float | None = None) -> Tensor:
    """softmax(scale q k^T) v (scale 1 / sqrt(D) unless given) for q [B, H, M, D], keys/values [B,
    H, S, D], mask bool [M, S] or [B, 1, M, S] (None: every key visible); row-invariant on CPUs (see
    the module docstring). Training (gradients), autocast and other devices use torch's SDPA."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    module = _load() if plain_cpu(q, keys, values) else None
    if module is None:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    if mask is not None:
        mask = mask.reshape(-1, *mask.shape[-2:])
    return module.row_attention(q, keys, values, mask, scale)


def _fused(*tensors: Tensor):
    """The kernels' module where a layer's small operations can run fused (plain CPU fp32/bf16
    tensors of one dtype), else None (the caller runs torch's operators)."""
    if not (plain_cpu(*tensors) and all(t.dtype == tensors[0].dtype for t in tensors)
            and tensors[0].dtype in (torch.float32, torch.bfloat16)):
        return None
    return _load()


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor | None:
    module = _fused(x, weight)
    return None if module is None else module.rms_norm(x, weight, eps)


def gated(x: Tensor, activation: str) -> Tensor | None:
    """act(gate) * up over the two halves of the last axis, act "silu" or "gelu_tanh"."""
    module = _fused(x)
    return None if module is None else module.gated(x, activation == "gelu_tanh")


def rope_store(qkv: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor, start: int,
               heads: int, kv_heads: int, norms: tuple | None = None) -> Tensor | None:
    """q [B, heads, T, D] rotated, with the rotated k and v written to the cache at `start`; with
    `norms` (the q and k RMSNorm modules) each head normalized first."""
    weights = () if norms is None else tuple(n.weight for n in norms)
    module = _fused(qkv, cos, sin, k_cache, v_cache, *weights)
    if module is None:
        return None
    q_norm, k_norm = weights or (None, None)
    eps = norms[0].eps if norms else 0.0
    return module.rope_store(qkv, cos, sin, k_cache, v_cache, start, heads, kv_heads, q_norm, k_norm, eps)


def layer_stack(norms: list, flags: list, attention: list, mlps: list, heads: int, kv_heads: int, eps: float,
                scale: float, gelu: bool, experts: int, top_k: int, normalize: bool):
    """A `LayerStack` (layer_stack.cpp) over these layers' weights, or None without built kernels."""
    module = _load()
    return None if module is None else module.LayerStack(norms, flags, attention, mlps, heads, kv_heads, eps, scale,
                                                         gelu, experts, top_k, normalize)
