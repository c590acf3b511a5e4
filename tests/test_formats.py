"""Weight formats (dense, int8, int4) and dtypes: the quantizers, and greedy speculative output
equal to vanilla's in each (the bundled SmolLM2; fp32 dense runs in test_methods.py)."""

import functools

import pytest
import torch

from eaglespec.decoding.generate import generate
from eaglespec.decoding.drafters import parse_method
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.checkpoint import load_head
from eaglespec.models.load import load_target
from eaglespec.models.quantize import GROUP, QuantizedLinear, quantize, quantize_int4, quantize_int8

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "What are the three primary colors? Explain briefly."]


def test_int4_recovers_q4_1_weights_exactly():
    """GGUF Q4_1 stores w = d * q + m per group of 32 (d, m fp16, q in 0..15, min and max used)."""
    g = torch.Generator().manual_seed(0)
    N, K = 48, 4 * GROUP
    d = (torch.rand(N, K // GROUP, 1, generator=g) * 0.01 + 1e-3).half().float()
    m = (torch.randn(N, K // GROUP, 1, generator=g) * 0.05).half().float()
    q = torch.randint(0, 16, (N, K // GROUP, GROUP), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15
    w = (d * q + m).reshape(N, K)
    codes, scale, low, exact = quantize_int4(w)
    assert exact == 1.0 and torch.equal(codes.float(), q.reshape(N, K))
    assert torch.allclose(codes.float() * scale.t().repeat_interleave(GROUP, 1) + low.t().repeat_interleave(GROUP, 1),
                          w, rtol=0, atol=1e-6)
    # our int4 kernel keeps scale and low in fp16: the GGUF's own d and m
    assert torch.equal(scale.half().float(), d[..., 0].t()) and torch.equal(low.half().float(), m[..., 0].t())
    # other weights: the nearest of 16 levels, so within half a level
    free = torch.randn(N, K, generator=g)
    codes, scale, low, exact = quantize_int4(free)
    back = codes.float() * scale.t().repeat_interleave(GROUP, 1) + low.t().repeat_interleave(GROUP, 1)
    assert exact < 0.01 and ((back - free).abs() <= scale.t().repeat_interleave(GROUP, 1) / 2 + 1e-6).all()


def test_int8_rounds_each_row_to_its_scale():
    w = torch.randn(40, 64, generator=torch.Generator().manual_seed(1))
    codes, scale = quantize_int8(w)
    assert codes.dtype == torch.int8 and codes.abs().max() == 127
    assert ((codes.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_linear_multiplies_by_its_dequantized_weight(kind):
    g = torch.Generator().manual_seed(2)
    linear = torch.nn.Linear(64, 48, bias=True)
    quantized = QuantizedLinear(linear, kind)
    x = torch.randn(5, 64, generator=g)
    reference = x.bfloat16().float() @ quantized.weight.float().t() + linear.bias
    assert torch.allclose(quantized(x), reference, atol=0.05)
    assert torch.equal(quantized(x[:1]), quantized(x)[:1])  # row-invariant


def test_bad_formats_fail_clearly():
    linear = torch.nn.Linear(40, 8)  # 40 inputs: no int4 groups of 32
    with pytest.raises(InvalidArgumentError, match="divisible by 32 and output sizes by 16"):
        QuantizedLinear(linear, "int4")
    with pytest.raises(InvalidArgumentError, match="dense, int8, int4"):
        quantize(torch.nn.Module(), "int3", torch.float32)


FORMATS = [("bfloat16", "dense"), ("bfloat16", "int8"), ("bfloat16", "int4"), ("float32", "int4")]


@functools.cache
def load(dtype: str, weights: str):
    return load_target("smollm2-135m-instruct", dtype, weights=weights)


@pytest.mark.slow  # loads the bundled model
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_bundled_gguf_runs_its_own_4_bit_weights(dtype):
    assert load(dtype, "int4").weights["int4_groups_exact"] == 1.0  # every Q4_1 group recovered bit for bit


@pytest.mark.slow  # loads the bundled model
@pytest.mark.parametrize("dtype, weights", [*FORMATS, ("float32", "dense")], ids=lambda v: v)
def test_tree_rows_equal_one_token_decoding_at_full_size(dtype, weights):
    """The bit-for-bit row invariance of test_decoder.py on the real model: a 23-node tree (rows
    that are not multiples of 4, wide matrices, 2 threads) against decoding each path alone."""
    from test_decoder import tree_inputs, tree_paths

    g = torch.Generator().manual_seed(7)
    parents, depth = [-1], [0]
    for i in range(1, 23):  # a random tree, parents first, at most 5 deep
        p = int(torch.randint(0, i, (1,), generator=g))
        p = p if depth[p] < 5 else 0
        parents.append(p)
        depth.append(depth[p] + 1)
    model = load(dtype, weights).model
    prefix = torch.randint(0, model.config.vocab_size, (1, 70), generator=g)
    nodes = torch.randint(0, model.config.vocab_size, (1, len(parents)), generator=g)
    positions, mask = tree_inputs(parents, start=70)
    with torch.inference_mode():
        cache = model.new_cache(100)
        model(prefix, cache)
        tree_logits, _ = model(nodes, cache, positions=positions, mask=mask)
        checked = set()
        for path in tree_paths(parents):
            cache = model.new_cache(100)
            model(prefix, cache)
            for node in path:
                logits, _ = model(nodes[:, node:node + 1], cache)
                assert torch.equal(logits[0, 0], tree_logits[0, node]), f"node {node} of {path}"
                checked.add(node)
    assert checked == set(range(len(parents)))


@pytest.mark.slow  # loads the bundled model
@pytest.mark.parametrize("spec", ["eagle:auto", "pld:4"])
@pytest.mark.parametrize("dtype, weights", FORMATS, ids=lambda v: v)  # fp32 dense: test_methods.py
def test_greedy_equals_vanilla_in_every_format(dtype, weights, spec):
    target = load(dtype, weights)
    method = parse_method(spec, head=load_head("default", target))
    for prompt in PROMPTS:
        vanilla = generate(target, prompt, chat=True, max_new_tokens=40)
        out = generate(target, prompt, chat=True, max_new_tokens=40, method=method)
        assert out.token_ids == vanilla.token_ids


@pytest.mark.slow  # loads the bundled model
@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_quantized_target_gets_an_int8_head_that_drafts_as_the_dense_one(weights):
    """Beside int8/int4 targets the head's matrices are int8 too (none left dense); on the same
    target features its draft tokens are the dense head's almost everywhere."""
    dense, target = load("bfloat16", "dense"), load("bfloat16", weights)
    heads = load_head("default", dense), load_head("default", target)
    assert not any(isinstance(m, torch.nn.Linear) for m in heads[1].modules())
    assert heads[1].lm_quantized is not None and heads[0].lm_quantized is None
    ids = dense.tokenizer(PROMPTS[0] + " " + PROMPTS[1], return_tensors="pt").input_ids
    with torch.inference_mode():
        _, features = dense.model(ids, dense.model.new_cache(ids.shape[1]))
        drafts = [head.logits(head(features[:, :-1], ids[:, 1:], head.new_cache(ids.shape[1])))[0].argmax(-1)
                  for head in heads]
    agree = (drafts[0] == drafts[1]).float().mean().item()
    assert agree >= 0.9, agree
