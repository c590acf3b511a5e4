"""Our CPU linear kernel (fp32 weights): the right numbers, and a row's numbers whatever else the call
carries."""

import pytest
import torch

from eaglespec.models.kernels import row_linear

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_row_linear_computes_x_wt_plus_b(x_dtype, bias):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(97, 64, generator=g)  # 97 outputs: a partial last block
    b = torch.randn(97, generator=g) if bias else None
    x = torch.randn(9, 64, generator=g).to(x_dtype)
    y = row_linear(x, w, b)
    ref = x.double() @ w.double().t() + (b.double() if bias else 0)
    assert y.dtype == x_dtype and y.shape == (9, 97)
    # fp32: summation order; bf16 output: one rounding, half a unit in the last of 8 bits
    tolerance = 1e-4 if x_dtype == torch.float32 else ref.abs() * 2**-8 + 1e-4
    assert ((y.double() - ref).abs() <= tolerance).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_gets_the_same_bits_in_any_call(dtype):
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(40, 96, generator=g), torch.randn(40, generator=g)
    x = torch.randn(11, 96, generator=g).to(dtype)
    whole = row_linear(x, w, b)
    for m in range(1, 12):
        assert torch.equal(row_linear(x[:m], w, b), whole[:m])
        assert torch.equal(row_linear(x[m - 1:m], w, b), whole[m - 1:m])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(row_linear(x, w, b), whole)
    finally:
        torch.set_num_threads(threads)


def test_the_kernel_declines_what_it_does_not_run():
    assert row_linear(torch.randn(2, 60), torch.randn(8, 60), None) is None  # K not a multiple of 8
    assert row_linear(torch.randn(2, 64), torch.randn(8, 64, dtype=torch.bfloat16), None) is None  # torch's
    w = torch.randn(8, 64, requires_grad=True)
    assert row_linear(torch.randn(2, 64), w, None) is None  # training: torch's linear keeps the graph
    with torch.no_grad():
        assert row_linear(torch.randn(2, 64), w, None) is not None
