"""Vanilla decoding: greedy equals transformers' generate; sampling, stopping and streaming."""

import pytest
import torch
from conftest import tiny_pair

from eaglespec.decoding.generate import Generation, generate, prompt_ids
from eaglespec.decoding.loop import DecodeStats, decode
from eaglespec.decoding.sampling import Draws, SamplingParams, warp
from eaglespec.errors import InvalidArgumentError, PromptTooLongError

PROMPTS = [
    ("What is the capital of France? Answer in one sentence.", True),
    ("Write a Python function that checks whether a number is prime.", True),
    ("Explain speculative decoding to a ten-year-old.", True),
    ("Once upon a time, in a village by the sea,", False),
]


@pytest.mark.parametrize("prompt,chat", PROMPTS)
def test_greedy_equals_transformers_generate(smollm2, smollm2_hf, prompt, chat):
    ids = prompt_ids(smollm2, prompt, chat)
    ours = generate(smollm2, ids, max_new_tokens=64)
    with torch.inference_mode():
        ref = smollm2_hf.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False)
    assert ours.token_ids == ref[0, len(ids):].tolist()
    assert ours.tau == 1.0 and ours.target_forwards == ours.new_tokens


def test_seeded_sampling_is_reproducible(smollm2):
    kwargs = dict(max_new_tokens=24, temperature=1.0, top_p=0.95, top_k=50, ignore_eos=True)
    a = generate(smollm2, "Tell me a story.", chat=True, seed=7, **kwargs)
    b = generate(smollm2, "Tell me a story.", chat=True, seed=7, **kwargs)
    c = generate(smollm2, "Tell me a story.", chat=True, seed=8, **kwargs)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_max_new_tokens_and_eos(smollm2):
    out = generate(smollm2, "Count from one to one hundred.", chat=True, max_new_tokens=5)
    assert out.new_tokens == 5 and out.finish_reason == "length"
    out = generate(smollm2, "What is 2+2?", chat=True, max_new_tokens=200)
    assert out.finish_reason == "eos" and out.token_ids[-1] in smollm2.eos_token_ids
    assert out.new_tokens < 200 and "<|im_end|>" not in out.text


def test_stop_string_ends_text_and_tokens(smollm2):
    full = generate(smollm2, "List three fruits, one per line.", chat=True, max_new_tokens=40)
    assert "\n" in full.text
    stop = Generation(smollm2, "List three fruits, one per line.", chat=True, max_new_tokens=40,
                      stop_strings=["\n"])
    pieces = list(stop)
    out = stop.output
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.index("\n")] == "".join(pieces)
    assert out.token_ids == full.token_ids[: out.new_tokens]
    assert "\n" in smollm2.tokenizer.decode(out.token_ids)  # the last token completes the stop string


def test_streamed_pieces_join_to_text(smollm2):
    gen = Generation(smollm2, "Say hello in French, Spanish and German.", chat=True, max_new_tokens=30)
    pieces = list(gen)
    assert len(pieces) > 3 and "".join(pieces) == gen.output.text


def test_context_limit_stops_cleanly(smollm2):
    _, model = tiny_pair("llama")
    context = model.config.max_position_embeddings
    stats = DecodeStats()
    rounds = list(decode(model, [1] * (context - 3), SamplingParams(), 10, stats=stats))
    assert stats.finish_reason == "context"
    assert sum(len(r) for r in rounds) == stats.new_tokens == 4  # the last root sits at context - 1
    with pytest.raises(PromptTooLongError):
        Generation(smollm2, [1] * smollm2.model.config.max_position_embeddings)


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.5), dict(top_p=0.0), dict(top_p=1.01),
                                    dict(top_k=-1), dict(max_new_tokens=0)])
def test_bad_arguments_are_rejected(smollm2, kwargs):
    with pytest.raises(InvalidArgumentError):
        Generation(smollm2, "hi", **kwargs)


def test_warp_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    p = warp(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([[5 / 7, 2 / 7, 0, 0, 0]]))
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.5+0.2 < 0.8: keep 3
    assert torch.allclose(p, torch.tensor([[0.5, 0.2, 0.15, 0, 0]]) / 0.85)
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.1))  # always keeps the top token
    assert p[0, 0] == 1
    p = warp(logits[:, [4, 3, 2, 1, 0]], SamplingParams(temperature=1.0, top_p=0.8))  # any order
    assert torch.allclose(p, torch.tensor([[0, 0, 0.15, 0.2, 0.5]]) / 0.85)
    p = warp(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(p, torch.softmax(logits / 0.5, -1))


def test_draws_follow_the_warped_distribution():
    """Single draws follow warp(); draws without replacement follow the sequential rule
    (second pick from q renormalized without the first). Chi-square-sized tolerances."""
    params = SamplingParams(temperature=1.0, top_k=3, seed=0)
    q = warp(torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1])), params)
    draws = Draws(params.generator())
    singles = torch.tensor([draws.sample(q) for _ in range(20000)])
    freq = torch.bincount(singles, minlength=4).float() / len(singles)
    expected = torch.tensor([4 / 9, 3 / 9, 2 / 9, 0])
    assert freq[3] == 0 and (freq - expected).abs().max() < 0.015
    rows = draws.distinct(torch.stack([q, torch.tensor([0, 0, 1.0, 0])]).repeat(10000, 1), 5)
    assert {len(r) for r in rows[0::2]} == {3} and rows[1::2] == [[2]] * 10000  # picks only tokens with mass
    pairs = torch.tensor(rows[0::2])
    first_two = torch.bincount(pairs[:, 0] * 4 + pairs[:, 1], minlength=16).float() / 10000
    exact = torch.zeros(16)
    for a in range(3):
        for b in range(3):
            if a != b:
                exact[a * 4 + b] = q[a] * q[b] / (1 - q[a])
    assert (first_two - exact).abs().max() < 0.02
