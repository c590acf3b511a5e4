"""Our CPU kernels (the linear over fp32, bf16, 8- or 4-bit weights, a layer's fused small operations): the right numbers, and a row's
numbers whatever else the call carries."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eaglespec.models import kernels
from eaglespec.models.decoder import RMSNorm, rotate
from eaglespec.models.kernels import row_linear

DTYPES = [torch.float32, torch.bfloat16]
BF16_KERNEL = kernels.pack_bf16(torch.zeros(16, 32, dtype=torch.bfloat16)) is not None  # AVX2 here


def linear(w_dtype):
    """Our linear for weights of w_dtype: (x, w, b) -> y; bf16 weights are packed first."""
    if w_dtype == torch.float32:
        return row_linear
    return lambda x, w, b: kernels.row_linear_bf16(x, kernels.pack_bf16(w), len(w), b)


# (weight dtype, input dtype) pairs our linears run: fp32 weights with either input, bf16 weights with
# bf16 inputs (AVX2 for both)
LINEAR_CASES = [(torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                pytest.param(torch.bfloat16, torch.bfloat16, marks=pytest.mark.skipif(
                    not BF16_KERNEL, reason="our kernels were not built (they need AVX2)"))]


@pytest.mark.parametrize("w_dtype, x_dtype", LINEAR_CASES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("bias", [False, True])
def test_row_linear_computes_x_wt_plus_b(w_dtype, x_dtype, bias):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(97, 64, generator=g).to(w_dtype)  # 97 outputs: a partial last block
    b = torch.randn(97, generator=g).to(w_dtype) if bias else None
    x = torch.randn(9, 64, generator=g).to(x_dtype)
    y = linear(w_dtype)(x, w, b)
    ref = x.double() @ w.double().t() + (b.double() if bias else 0)
    assert y.dtype == x_dtype and y.shape == (9, 97)
    # fp32: summation order; bf16 output: one rounding, half a unit in the last of 8 bits
    tolerance = 1e-4 if x_dtype == torch.float32 else ref.abs() * 2**-8 + 1e-4
    assert ((y.double() - ref).abs() <= tolerance).all()


@pytest.mark.parametrize("w_dtype, x_dtype", LINEAR_CASES, ids=lambda d: str(d).split(".")[-1])
def test_a_row_gets_the_same_bits_in_any_call(w_dtype, x_dtype):
    g = torch.Generator().manual_seed(1)
    # K = 1536: where oneDNN's bf16 rows change with the row count on some CPUs (AMD Zen 5); N = 300:
    # bf16 tiles of 64 outputs, a thread's tiles run in pairs and one alone; 37 rows: the AMX path's
    # passes of 16 rows, two full and one partial
    w, b = torch.randn(300, 1536, generator=g).to(w_dtype), torch.randn(300, generator=g).to(w_dtype)
    x = torch.randn(37, 1536, generator=g).to(x_dtype)
    f = linear(w_dtype)
    whole = f(x, w, b)
    for m in [*range(1, 12), 15, 16, 17, 31, 33]:
        assert torch.equal(f(x[:m], w, b), whole[:m])
        assert torch.equal(f(x[m - 1:m], w, b), whole[m - 1:m])
    assert torch.equal(f(x[5:30], w, b), whole[5:30])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(f(x, w, b), whole)
    finally:
        torch.set_num_threads(threads)


def test_bf16_linears_run_on_the_best_unit_this_cpu_has():
    """AMX where the CPU has it (unless EAGLESPEC_AMX=0), else AVX-512 BF16, else AVX2; torch's
    linears only on a CPU without AVX2. A failed kernel build would show here as "torch"."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if {"avx512_bf16", "avx512f", "avx512bw", "avx512vl"} <= flags:
        amx = {"amx_tile", "amx_bf16"} <= flags and os.environ.get("EAGLESPEC_AMX") != "0"
        expected = "amx" if amx else "avx512-bf16"
    else:
        expected = "avx2" if "avx2" in flags else "torch"
    assert kernels.bf16_linear_unit() == expected


@pytest.mark.skipif(kernels.bf16_linear_unit() != "amx", reason="this CPU has no AMX")
def test_the_vector_paths_run_where_amx_is_switched_off():
    """With AMX on, the tests above run the bf16 and int4 kernels on the tile unit; their vector
    paths (other CPUs, bf16 K not a multiple of 32, EAGLESPEC_AMX=0) get the same checks in a
    process of its own."""
    script = ("import torch, test_kernels as t; from eaglespec.models import kernels; "
              "assert kernels.bf16_linear_unit() == 'avx512-bf16'; "
              "t.test_row_linear_computes_x_wt_plus_b(torch.bfloat16, torch.bfloat16, True); "
              "t.test_a_row_gets_the_same_bits_in_any_call(torch.bfloat16, torch.bfloat16); "
              "t.test_quantized_kernels_multiply_by_their_weights_and_a_row_gets_the_same_bits_in_any_call('int4')")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).parent,
                   env={**os.environ, "EAGLESPEC_AMX": "0"})


@pytest.mark.skipif(not BF16_KERNEL, reason="our kernels were not built (they need AVX2)")
def test_bf16_linears_whose_inputs_are_not_a_multiple_of_32_compute_x_wt():
    """K = 66: the vector path even where AMX is on (the tile unit takes blocks of 32 inputs)."""
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(70, 66, generator=g).bfloat16(), torch.randn(20, 66, generator=g).bfloat16()
    ref = x.double() @ w.double().t()
    y = linear(torch.bfloat16)(x, w, None)
    assert ((y.double() - ref).abs() <= ref.abs() * 2**-8 + 1e-4).all()
    assert torch.equal(linear(torch.bfloat16)(x[3:4], w, None), y[3:4])


def quantized_case(kind: str, N: int, K: int, g: torch.Generator):
    """(our kernel: x -> y, the dequantized weight [N, K] fp32) for random 4- or 8-bit weights."""
    if kind == "int4":
        codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.int32)
        scale = (torch.rand(K // 32, N, generator=g) * 0.01).half().float()
        low = (torch.randn(K // 32, N, generator=g) * 0.05).half().float()
        packed = kernels.pack_int4(codes, scale, low)
        w = codes.float() * scale.t().repeat_interleave(32, 1) + low.t().repeat_interleave(32, 1)
        return (lambda x: kernels.row_linear_int4(x, packed, N)), w
    codes = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    scale = torch.rand(N, generator=g) * 0.01
    packed = kernels.pack_int8(codes)
    return (lambda x: kernels.row_linear_int8(x, packed, scale, N)), codes.float() * scale[:, None]


def kernel_inputs(kind: str, x: torch.Tensor) -> torch.Tensor:
    """x [M, K] bf16 as our `kind` kernel multiplies it (fp32): as it is, or with AVX2 alone its 8-bit
    codes per group of 32 inputs (scale max |x| / 127, nearest even) times their scale."""
    if kernels.quantized_inputs(kind) != "int8":
        return x.float()
    groups = x.float().view(x.shape[0], -1, 32)
    amax = groups.abs().amax(-1, keepdim=True)
    inverse = torch.where(amax > 0, torch.full_like(amax, 127) / amax, 0)  # (127 / amax rounds differently)
    return (groups * inverse).round().mul(amax / 127).view_as(x)


@pytest.mark.skipif(not BF16_KERNEL, reason="our kernels were not built (they need AVX2)")
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_quantized_kernels_multiply_by_their_weights_and_a_row_gets_the_same_bits_in_any_call(kind):
    g = torch.Generator().manual_seed(3)
    N, K = 300, 1536  # several tiles of 64 outputs, a thread's tiles run one by one; 48 int4 groups
    f, w = quantized_case(kind, N, K, g)
    x = torch.randn(37, K, generator=g).bfloat16()  # 37 rows: int4's AMX passes of 16, 16 and 5
    whole = f(x)
    reference = kernel_inputs(kind, x) @ w.t()  # the fp32 product, then one bf16 rounding
    assert ((whole.float() - reference).abs() <= reference.abs() * 2 ** -8 + 1e-4).all()
    for m in [*range(1, 12), 16, 17, 33]:
        assert torch.equal(f(x[:m]), whole[:m])
        assert torch.equal(f(x[m - 1:m]), whole[m - 1:m])
    assert torch.equal(f(x[5:30]), whole[5:30])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(f(x), whole)
    finally:
        torch.set_num_threads(threads)


def test_the_kernel_declines_what_it_does_not_run():
    assert row_linear(torch.randn(2, 60), torch.randn(8, 60), None) is None  # K not a multiple of 8
    assert row_linear(torch.randn(2, 64), torch.randn(8, 64, dtype=torch.bfloat16), None) is None  # packed: pack_bf16
    assert kernels.pack_bf16(torch.randn(8, 64)) is None  # fp32 weights: row_linear
    w = torch.randn(8, 64, requires_grad=True)
    assert row_linear(torch.randn(2, 64), w, None) is None  # training: torch's linear keeps the graph
    with torch.no_grad():
        assert row_linear(torch.randn(2, 64), w, None) is not None
    if kernels.quantized_inputs("int8") == "int8":  # inputs rounded in groups of 32: torch's kernel for K = 40
        assert kernels.pack_int8(torch.zeros(8, 40, dtype=torch.int8)) is None
        assert kernels.pack_int8(torch.zeros(8, 64, dtype=torch.int8)) is not None


def close(y, ref, dtype):
    """Against torch's eager operators in the same dtype: fp32 up to summation order; bf16 within one
    unit in the last place (an fp32 intermediate a hair apart can round the other way)."""
    y, ref = y.double(), ref.double()
    return ((y - ref).abs() <= (1e-5 if dtype == torch.float32 else ref.abs() * 2**-7 + 1e-6)).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_layer_ops_compute_what_torch_computes(dtype):
    g = torch.Generator().manual_seed(2)
    norm = RMSNorm(96, 1e-6).to(dtype)
    norm.weight.data = torch.randn(96, generator=g).to(dtype)
    x = torch.randn(2, 5, 96, generator=g).to(dtype)
    with torch.no_grad():
        assert close(kernels.rms_norm(x, norm.weight, 1e-6), norm(x.requires_grad_()), dtype)  # eager: autograd on
    gate_up = torch.randn(2, 5, 2 * 48, generator=g).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    assert close(kernels.gated(gate_up, "silu"), torch.nn.functional.silu(gate) * up, dtype)

    B, T, heads, kv_heads, D, start = 2, 3, 4, 2, 8, 5
    qkv = torch.randn(B, T, (heads + 2 * kv_heads) * D, generator=g).to(dtype)
    angles = torch.randn(B, 1, T, D // 2, generator=g).repeat(1, 1, 1, 2)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    k_cache, v_cache = (torch.zeros(B, kv_heads, 16, D, dtype=dtype) for _ in range(2))
    q = kernels.rope_store(qkv, cos, sin, k_cache, v_cache, start, heads, kv_heads)
    q_ref, k_ref, v_ref = qkv.split((heads * D, kv_heads * D, kv_heads * D), dim=-1)
    heads_first = lambda t, n: t.view(B, T, n, D).transpose(1, 2)  # noqa: E731
    # bf16: the eager rotation's roundings, bit for bit (its products of bf16 numbers are exact in fp32)
    same = torch.equal if dtype == torch.bfloat16 else lambda a, b: close(a, b, dtype)  # noqa: E731
    assert same(q, rotate(heads_first(q_ref, heads), cos, sin))
    assert same(k_cache[:, :, start:start + T], rotate(heads_first(k_ref, kv_heads), cos, sin))
    assert torch.equal(v_cache[:, :, start:start + T], heads_first(v_ref, kv_heads))
    assert not k_cache[:, :, :start].any() and not k_cache[:, :, start + T:].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_layer_ops_give_a_row_the_same_bits_in_any_call(dtype):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(1, 7, 64, generator=g).to(dtype), torch.randn(64, generator=g).to(dtype)
    gate_up = torch.randn(1, 7, 64, generator=g).to(dtype)
    qkv = torch.randn(1, 7, 4 * 8, generator=g).to(dtype)
    angles = torch.randn(1, 1, 7, 4, generator=g).repeat(1, 1, 1, 2)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    cache = lambda: (torch.zeros(1, 1, 8, 8, dtype=dtype), torch.zeros(1, 1, 8, 8, dtype=dtype))  # noqa: E731
    k_all, v_all = cache()
    q_all = kernels.rope_store(qkv, cos, sin, k_all, v_all, 0, 2, 1)
    norm_all, silu_all = kernels.rms_norm(x, w, 1e-5), kernels.gated(gate_up, "silu")
    for t in range(7):
        one = slice(t, t + 1)
        assert torch.equal(kernels.rms_norm(x[:, one], w, 1e-5), norm_all[:, one])
        assert torch.equal(kernels.gated(gate_up[:, one], "silu"), silu_all[:, one])
        k, v = cache()
        assert torch.equal(kernels.rope_store(qkv[:, one], cos[:, :, one], sin[:, :, one], k, v, t, 2, 1), q_all[:, :, one])
        assert torch.equal(k[:, :, t], k_all[:, :, t]) and torch.equal(v[:, :, t], v_all[:, :, t])


def test_fused_layer_ops_leave_training_to_torch():
    w = torch.randn(64, requires_grad=True)
    assert kernels.rms_norm(torch.randn(2, 64), w, 1e-5) is None  # autograd needs torch's operators
    assert kernels.rms_norm(torch.randn(2, 64), w.detach().bfloat16(), 1e-5) is None  # mixed dtypes
    with torch.no_grad():
        assert kernels.rms_norm(torch.randn(2, 64), w, 1e-5) is not None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [8, 16, 64, 80, 128, 272])
def test_row_attention_computes_softmax_attention_row_by_row(dtype, D):
    """Against torch's attention (head sizes with whole and partial 16-lane chunks; 272 takes the
    kernel's plain loop, as every size does without AVX-512 or AVX2; 80 is whole 8-lane chunks only), and a row's numbers are those it gets
    alone over just the keys it sees."""
    g = torch.Generator().manual_seed(4)
    B, H, M, S = 2, 3, 5, 40
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(dtype) for n in (M, S, S))
    mask = torch.rand(B, 1, M, S, generator=g) < 0.6
    mask[..., 0] = True  # every row sees a key
    y = kernels.row_attention(q, k, v, mask)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    assert ((y.double() - ref).abs() <= (1e-5 if dtype == torch.float32 else ref.abs() * 2**-7 + 1e-3)).all()
    for b, r in [(0, 0), (1, 3)]:
        seen = mask[b, 0, r]
        alone = kernels.row_attention(q[b:b + 1, :, r:r + 1], k[b:b + 1, :, seen], v[b:b + 1, :, seen], None)
        assert torch.equal(alone[0, :, 0], y[b, :, r])


def test_the_build_compiles_copies_that_change_only_with_the_sources(tmp_path):
    """The kernels compile from copies in the build folder, so a wheel and a checkout of the same code
    share one build: a second load rewrites no copy (ninja would rebuild on a newer time), and a copy
    that differs from its source is replaced."""
    sources = [Path(s) for s in kernels._copied_sources(tmp_path)]
    assert [s.name for s in sources] == list(kernels.SOURCES) and all(s.parent == tmp_path / "src" for s in sources)
    copies = {c.name: c.stat().st_mtime_ns for c in (tmp_path / "src").iterdir()}
    assert set(copies) == set(kernels.SOURCES + kernels.HEADERS)
    os.utime(sources[0], ns=(1, 1))
    (tmp_path / "src" / "amx.h").write_text("// stale")
    kernels._copied_sources(tmp_path)
    assert sources[0].stat().st_mtime_ns == 1  # unchanged: left as it was
    assert (tmp_path / "src" / "amx.h").read_bytes() == Path(kernels.__file__).with_name("amx.h").read_bytes()
    assert not list((tmp_path / "src").glob("*.partial"))
