"""Weight-only quantized linears: the target's matrices kept as 8- or 4-bit integers and multiplied
without expanding them (our kernels, or torch's on CPUs without AVX2), so a forward reads 2-4x
fewer bytes than bf16.

- `int4`: groups of 32 input weights share a scale and a low end, w = q * scale + low with q in
  0..15. This is the bundled GGUFs' Q4_1 form (w = d * q + m): where a group's dequantized values
  lie on such a grid, the codes are recovered exactly, so the int4 model runs the GGUF's own 4-bit
  weights. Other groups are rounded to the nearest of 16 levels between their min and max. Our
  kernel multiplies them (`kernels.row_linear_int4`: scale and low in fp16, as GGUF stores d and m;
  the codes read once per call for all rows: with AMX or AVX-512 BF16 a draft tree costs little
  more than one token; with AVX2 alone the inputs are rounded to 8-bit codes per group of 32, as
  llama.cpp does, and multiplied as integers, whose cost grows with the rows); without AVX2
  torch's (`_weight_int4pack_mm_for_cpu`, over w = (q - 8) * scale + offset with bf16 scales and
  offsets).
- `int8`: one scale per output row, w = q * scale with q in -127..127: our kernel
  (`kernels.row_linear_int8`: fp32 scales, the codes read once per call for all rows; with AVX2
  alone the inputs rounded to 8-bit codes per group of 32 and integer products, as for int4), without
  AVX2 (or there with inputs not a multiple of 32) torch's (`_weight_int8pack_mm`, bf16 scales).

With `int4` the decoder layers are 4-bit and the LM head (often the embedding, and 8-bit or wider in
GGUF files) is int8; with `int8` all of them are int8. The embedding table stays dense (a lookup
reads one row). Losslessness is relative to vanilla decoding with the same weights: speculative
decoding changes nothing about which weights run.

The kernels take bf16 activations (torch's fp32 path is about 10x slower on CPUs, measured on an
AVX2 machine; `kernels.quantized_inputs` says how int4 and int8 multiply them) and return bf16: a quantized
linear takes its input in bf16 and returns the model's dtype. torch's kernels also use bf16 scales, roundings of the GGUF's fp16 ones.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from eaglespec.errors import InvalidArgumentError
from eaglespec.models import kernels

WEIGHT_FORMATS = ("dense", "int8", "int4")
GROUP = 32  # input weights per int4 scale/offset


def quantize_int4(weight: Tensor) -> tuple[Tensor, Tensor, Tensor, float]:
    """codes [N, K] int32 in 0..15, scale and low [K / GROUP, N] (fp32; w = codes * scale + low),
    and the share of groups whose values lay exactly on their grid (recovered bit for bit)."""
    N, K = weight.shape
    w = weight.float().reshape(N, K // GROUP, GROUP)
    low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    scale = (high - low) / 15  # 0 for a constant group: every code 0, the offset alone gives w
    codes = ((w - low) / torch.where(scale > 0, scale, torch.ones_like(scale))).round().clamp(0, 15)
    exact = ((low + scale * codes) == w).all(-1)
    return (codes.reshape(N, K).to(torch.int32), scale[..., 0].t().contiguous(), low[..., 0].t().contiguous(),
            float(exact.float().mean()))


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """codes [N, K] int8 and one scale per row [N] (fp32), symmetric."""
    w = weight.float()
    scale = w.abs().amax(-1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


# the experts' routers and shared-expert gates stay in the model's dtype: a few rows, read for every
# token, whose rounding would move tokens between experts
KEPT_DENSE = ("router", "shared_gate")


class QuantizedLinear(nn.Module):
    """y = x W^T (+ b) with W stored as int8 or int4 (see the module docstring)."""

    def __init__(self, linear: nn.Linear, kind: str):
        super().__init__()
        self.kind = kind
        self.out_features, self.in_features = linear.weight.shape
        weight = linear.weight.detach()
        if kind == "int4":
            if self.in_features % GROUP or self.out_features % 16:
                raise InvalidArgumentError(
                    f"int4 weights need input sizes divisible by {GROUP} and output sizes by 16 (the kernel's); "
                    f"this model has a {self.out_features} x {self.in_features} matrix: use --weights int8 or dense")
            codes, scale, low, self.exact = quantize_int4(weight)
            if (tiles := kernels.pack_int4(codes, scale, low)) is not None:  # our kernel's layout
                self.register_buffer("packed", tiles)
                self.register_buffer("scale_offset", None)
            else:  # torch's: w = (q - 8) * scale + offset
                offset = low + 8 * scale
                self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))
                self.register_buffer("scale_offset", torch.stack((scale, offset), -1).to(torch.bfloat16))
        elif kind == "int8":
            codes, scale = quantize_int8(weight)
            self.exact = 0.0
            if (tiles := kernels.pack_int8(codes)) is not None:  # our kernel's layout
                self.register_buffer("packed", tiles)
                self.register_buffer("scale_offset", scale)
            else:
                self.register_buffer("packed", codes)
                self.register_buffer("scale_offset", scale.to(torch.bfloat16))
        else:
            raise InvalidArgumentError(f"unknown weight format '{kind}': use one of {', '.join(WEIGHT_FORMATS)}")
        self.bias = linear.bias

    @property
    def weight(self) -> Tensor:
        """The dequantized weight [N, K] in bf16 (what the kernels multiply by; for reading)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16, device=self.packed.device)
        return self._matmul(eye).t().contiguous()

    def _matmul(self, x: Tensor) -> Tensor:
        if self.packed.dim() == 3:  # our kernels' layouts
            if self.kind == "int4":
                return kernels.row_linear_int4(x, self.packed, self.out_features)
            return kernels.row_linear_int8(x, self.packed, self.scale_offset, self.out_features)
        if self.kind == "int4":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scale_offset)
        return torch.ops.aten._weight_int8pack_mm(x, self.packed, self.scale_offset)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        y = self._matmul(rows).view(*x.shape[:-1], self.out_features).to(x.dtype)
        return y if self.bias is None else y + self.bias


def quantize(model: nn.Module, weights: str, dtype: torch.dtype) -> dict:
    """Replace the target's linears in place by quantized ones, from the weights as loaded (fp32,
    so a GGUF's 4-bit grid is intact), and cast everything else to `dtype`. Returns what was
    done: per kind, the number of matrices and the share of int4 groups recovered exactly."""
    if weights not in WEIGHT_FORMATS:
        raise InvalidArgumentError(f"unknown weight format '{weights}': use one of {', '.join(WEIGHT_FORMATS)}")
    if weights == "dense":
        model.to(dtype)
        return {"weights": "dense"}
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise InvalidArgumentError(f"--weights {weights} runs on CPUs (CPU kernels); on {device.type} use dense")
    done, exact = {"int4": 0, "int8": 0}, []  # exact: (groups recovered exactly, groups) per int4 matrix
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear) or child_name in KEPT_DENSE:
                continue
            kind = "int8" if (weights == "int8" or child_name == "lm_head") else "int4"
            quantized = QuantizedLinear(child, kind)
            setattr(module, child_name, quantized)
            done[kind] += 1
            if kind == "int4":
                groups = child.weight.numel() // GROUP
                exact.append((quantized.exact * groups, groups))
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            parameter.data = parameter.data.to(dtype)
    return {"weights": weights, "int4_matrices": done["int4"], "int8_matrices": done["int8"],
            "int4_groups_exact": round(sum(e for e, _ in exact) / sum(n for _, n in exact), 6) if exact else None}
