"""The equivalence tests every drafting method in the loop passes, on the bundled SmolLM2 (fp32):
greedy output equals vanilla token for token (also at max_new_tokens, stop strings, the context
limit and a one-token prompt), and sampling follows the target's distribution (a goodness-of-fit
test against exact probabilities). Methods: EAGLE (every tree; the shipped head, a random
head, which exercises rejections, and the shipped head exported to vLLM's layout and imported back), EAGLE-3 heads (a random one, and an "early exit" one that
drafts from the target's own hidden state one layer before the end, which the target often
accepts), classic speculative sampling with a weak draft model, prompt lookup, `hybrid` (EAGLE,
lookup and a suffix cache in one tree; with the shipped head, a random one, and without EAGLE), and
Medusa (a random head, auto-sized and fixed), and Lookahead decoding. Decoded together in one batch
(`loop.Scheduler`), every row's output equals that row decoded alone, greedy or seeded sampling,
with rows joining, leaving and cancelled between rounds."""

from dataclasses import replace

import pytest
import torch
from conftest import bin_of, chi_square_p_value, decode_batch, exact_bins

from eaglespec.decoding.generate import generate, prompt_ids
from eaglespec.decoding.loop import Request, Scheduler
from eaglespec.decoding.drafters import Artefact, method_needs, parse_method
from eaglespec.decoding.drafters.eagle import Eagle
from eaglespec.decoding.drafters.hybrid import Hybrid
from eaglespec.decoding.drafters.prompt_lookup import PromptLookup
from eaglespec.decoding.drafters.prompt_lookup import PromptLookupProposer
from eaglespec.decoding.sizing import ChainSize
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.head import Eagle3Head, EagleHead
from eaglespec.models.costs import ForwardCosts

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What are the three primary colors? Explain briefly.",
    "Repeat this sentence three times: 'The quick brown fox jumps over the lazy dog.'",
]
TREES = ["eagle1", "chain:4", "dynamic:topk=3,depth=4,tokens=10", "auto"]
METHODS = [*(f"eagle:{t}" for t in TREES), "eagle-random:eagle1", "eagle-random:auto", "eagle-imported:chain:4",
           "eagle3-random:eagle1",
           "eagle3-exit:eagle1", "eagle3-exit:auto", "sps:3", "pld:6", "pld", "hybrid", "hybrid-random",
           "hybrid-eagle3", "hybrid:lookup+suffix", "medusa-random", "medusa-random:6", "lookahead", "lookahead:W=3,N=3,G=2"]


pytestmark = pytest.mark.usefixtures("auto_drafts_every_round")


@pytest.fixture(scope="module")
def random_head(smollm2):
    """A random head over a random 4k-token draft vocabulary."""
    torch.manual_seed(0)
    vocab = torch.randperm(smollm2.model.config.vocab_size)[:4096]
    return EagleHead(smollm2.model.config).eval().requires_grad_(False).attach(smollm2.model, vocab)


@pytest.fixture(scope="module")
def eagle3_heads(smollm2):
    """EAGLE-3 heads: a random one over a random 4k-token draft vocabulary, and an "early exit"
    one over the whole vocabulary whose fc passes the hidden state entering the target's last
    layer through and whose own layer adds nothing (zero output projections), so it drafts with
    the target's LM head applied one layer early."""
    c = smollm2.model.config
    torch.manual_seed(0)
    vocab = torch.randperm(c.vocab_size)[:4096]
    random = Eagle3Head(c, (2, 15, 27), len(vocab)).eval().requires_grad_(False).attach(smollm2.model, vocab)
    exit_head = Eagle3Head(c, (2, 15, 29), c.vocab_size).eval().requires_grad_(False).attach(smollm2.model)
    exit_head.init_from_target(smollm2.model)
    with torch.no_grad():
        exit_head.fc.weight.zero_()
        exit_head.fc.weight[:, 2 * c.hidden_size:] = torch.eye(c.hidden_size)
        exit_head.layers[0].attn.o.weight.zero_()
        exit_head.layers[0].mlp.down.weight.zero_()
    return {"eagle3-random": random, "eagle3-exit": exit_head}


@pytest.fixture(scope="module")
def imported_head(smollm2, tmp_path_factory):
    """The shipped head as vLLM loads it (fc's bias folded into attention biases), imported back."""
    from eaglespec.heads.checkpoint import load_head
    from eaglespec.heads.export import export_head

    out = tmp_path_factory.mktemp("export") / "vllm"
    export_head("default", smollm2, "vllm", out)
    return load_head(str(out), smollm2)


@pytest.fixture(scope="module")
def make(shipped, random_head, imported_head, eagle3_heads, smollm2_draft, random_medusa):
    def make(spec: str):
        name, _, tree = spec.partition(":")
        if name == "eagle-imported":
            return Eagle(imported_head, tree)
        if name == "medusa-random":
            return parse_method(spec.replace("-random", ""), medusa=random_medusa)
        if name == "eagle-random":
            return Eagle(random_head, tree)
        if name == "hybrid-random":
            return Hybrid(random_head)
        if name == "hybrid-eagle3":
            return Hybrid(eagle3_heads["eagle3-exit"])
        if name in eagle3_heads:
            return Eagle(eagle3_heads[name], tree)
        return parse_method(spec, head=shipped, draft=smollm2_draft)

    return make


@pytest.fixture(scope="module")
def vanilla(smollm2):
    return [generate(smollm2, p, chat=True, max_new_tokens=40).token_ids for p in PROMPTS]


@pytest.mark.parametrize("spec", METHODS)
def test_greedy_equals_vanilla(smollm2, make, vanilla, spec):
    method = make(spec)
    outs = [generate(smollm2, p, chat=True, max_new_tokens=40, method=method) for p in PROMPTS]
    for out, expected in zip(outs, vanilla):
        assert out.token_ids == expected
        assert out.method == method.name and sum(out.accepted_lengths) == out.target_forwards
    if "random" not in spec:  # drafts the target accepts, so the path is exercised
        assert sum(o.new_tokens for o in outs) > sum(o.target_forwards for o in outs)


@pytest.mark.parametrize("spec", ["vanilla", *METHODS])
def test_batched_rows_equal_rows_decoded_alone(smollm2, make, vanilla, spec):
    """Three prompts, two rows at a time: the third joins when the shortest leaves."""
    method = None if spec == "vanilla" else make(spec)
    ids = [prompt_ids(smollm2, p, chat=True) for p in PROMPTS]
    greedy = SamplingParams()
    outs = decode_batch(smollm2, method, [(ids[0], 24, greedy), (ids[1], 8, greedy), (ids[2], 24, greedy)], 2)
    assert outs == [vanilla[0][:24], vanilla[1][:8], vanilla[2][:24]]


@pytest.mark.parametrize("spec", ["vanilla", "eagle:eagle1", "pld:3", "sps:3"])
def test_batched_sampling_rows_equal_rows_sampled_alone(smollm2, make, spec):
    """Seeded sampling at temperature 1: each row draws what it draws alone, since its random
    choices come from its own generator. (Not for methods whose drafts learn from earlier
    generations, `auto` trees and hybrid's suffix cache: their drafts, and so their random draws,
    differ from run to run; the distribution does not, test_sampling_matches_the_target_distribution.)"""
    method = None if spec == "vanilla" else make(spec)
    ids = [prompt_ids(smollm2, p, chat=True) for p in PROMPTS]
    params = [SamplingParams(temperature=1.0, seed=seed) for seed in (1, 2, 3)]
    alone = [generate(smollm2, i, max_new_tokens=24, temperature=1.0, seed=p.seed, method=method).token_ids
             for i, p in zip(ids, params)]
    assert decode_batch(smollm2, method, [(i, 24, p) for i, p in zip(ids, params)], 3) == alone


def test_cancelling_a_row_leaves_the_others_unchanged(smollm2, make, vanilla):
    method = make("eagle:eagle1")
    ids = [prompt_ids(smollm2, p, chat=True) for p in PROMPTS]
    greedy = SamplingParams()
    outs = decode_batch(smollm2, method, [(i, 40, greedy) for i in ids], 3, cancel=(1, 3))
    assert outs[0] == vanilla[0] and outs[2] == vanilla[2]
    assert 0 < len(outs[1]) < 40 and outs[1] == vanilla[1][:len(outs[1])]


def test_scheduler_bad_input(smollm2, make):
    with pytest.raises(InvalidArgumentError, match="batch size must be >= 1"):
        Scheduler(smollm2.model, 64, 0)
    scheduler = Scheduler(smollm2.model, 64, 2)
    with pytest.raises(InvalidArgumentError, match="needs 110 cache slots"):
        scheduler.submit(Request([1] * 10, SamplingParams(), 100))
    assert scheduler.idle
    # an EAGLE-3 head reads other target layers than an EAGLE-1 head: refused when submitted
    greedy, scheduler = SamplingParams(), Scheduler(smollm2.model, 512, 2)
    scheduler.submit(Request([1] * 10, greedy, 8, proposer=make("eagle:chain:4").bind(smollm2, greedy)))
    with pytest.raises(InvalidArgumentError, match="same target layers"):
        scheduler.submit(Request([1] * 10, greedy, 8, proposer=make("eagle3-random:eagle1").bind(smollm2, greedy)))
    scheduler.submit(Request([1] * 10, greedy, 8))  # vanilla rows go with any
    assert len(scheduler.queue) == 2


@pytest.mark.parametrize("spec", ["eagle:eagle1", "sps:4", "pld:4", "hybrid", "lookahead"])
def test_limits_end_generation_as_vanilla_does(smollm2, shipped, make, spec):
    method = make(spec)
    prompt = "Count from one to twenty in words."
    for kwargs in ({"max_new_tokens": 7}, {"max_new_tokens": 30, "stop_strings": ["five"]}):
        v = generate(smollm2, prompt, chat=True, **kwargs)
        e = generate(smollm2, prompt, chat=True, method=method, **kwargs)
        assert (e.token_ids, e.text, e.finish_reason) == (v.token_ids, v.text, v.finish_reason)
    # the context limit: SmolLM2's context shrunk to just past the prompt
    ids = smollm2.tokenizer("Once upon a time")["input_ids"]
    config = smollm2.model.config
    try:
        smollm2.model.config = shipped.config = replace(config, max_position_embeddings=len(ids) + 9)
        v = generate(smollm2, ids, max_new_tokens=50)
        e = generate(smollm2, ids, max_new_tokens=50, method=method)
    finally:
        smollm2.model.config = shipped.config = config
    assert e.finish_reason == v.finish_reason == "context"
    assert e.token_ids == v.token_ids and len(v.token_ids) == 10
    bos = [smollm2.tokenizer.bos_token_id or 1]  # a one-token prompt
    assert generate(smollm2, bos, max_new_tokens=12, method=method).token_ids == \
        generate(smollm2, bos, max_new_tokens=12).token_ids


SAMPLING_PROMPT = "The best way to learn programming is practice. The best way to learn"


@pytest.mark.parametrize("spec", ["eagle:eagle1", "eagle:dynamic:topk=3,depth=3,tokens=8", "eagle3-exit:eagle1",
                                  "sps:3", "pld:3", "hybrid", "lookahead"])
def test_sampling_matches_the_target_distribution(smollm2, smollm2_hf, make, spec):
    """The first 3 tokens of 300 seeded samples at temperature 1 against their exact vanilla
    probabilities: a chi-square test over the bins of `exact_bins` (16 here), rejecting at p <= 1e-3.

    Its power on these bins is the next test's. The seeds are fixed: the outcome never changes.
    The prompt repeats itself, so that prompt lookup finds drafts to verify.
    """
    method = make(spec)
    ids = smollm2.tokenizer(SAMPLING_PROMPT)["input_ids"]
    n = 300
    bins = exact_bins(smollm2_hf, ids, n)
    assert len(bins) >= 10  # enough spread for the test to mean something
    counts = dict.fromkeys([*bins, "rest"], 0)
    drafted = 0
    for seed in range(n):
        out = generate(smollm2, ids, max_new_tokens=3, temperature=1.0, seed=seed, method=method, ignore_eos=True)
        counts[bin_of(out.token_ids, bins)] += 1
        drafted += out.target_forwards < out.new_tokens
    assert drafted > n // 10  # drafts were accepted, and so also tested
    probs = [*bins.values(), 1 - sum(bins.values())]
    assert chi_square_p_value(list(counts.values()), probs) > 1e-3


def test_the_sampling_test_catches_a_shifted_distribution(smollm2, smollm2_hf):
    """The power of the chi-square test above on its own bins, simulated: 1,000 runs of 300 draws
    from the exact distribution are rejected at most 1% of the time (p < 1e-3 expects 0.1%), and
    from one with a total variation of 0.10 moved from the likeliest bin to the rest at least 80%."""
    n, runs = 300, 1000
    bins = exact_bins(smollm2_hf, smollm2.tokenizer(SAMPLING_PROMPT)["input_ids"], n)
    exact = torch.tensor([*bins.values(), 1 - sum(bins.values())], dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)

    def rejected(distribution: torch.Tensor) -> float:
        draws = torch.multinomial(distribution.expand(runs, -1), n, replacement=True, generator=generator)
        counts = torch.zeros(runs, len(exact), dtype=torch.int64).scatter_add_(1, draws, torch.ones_like(draws))
        return sum(chi_square_p_value(c.tolist(), exact.tolist()) <= 1e-3 for c in counts) / runs

    shifted = exact.clone()
    top = int(exact[:-1].argmax())
    shifted[top] -= 0.10
    shifted[-1] += 0.10
    false, caught = rejected(exact), rejected(shifted)
    print(f"{len(bins)} bins: exact samples rejected {false:.3f}, a shift of 0.10 caught {caught:.3f}")
    assert false <= 0.01 and caught >= 0.80


def test_prompt_lookup_drafts_the_latest_longest_match():
    pld = PromptLookupProposer(num_tokens=3, max_ngram=2)
    pld.start([1, 2, 3, 9, 1, 2, 4, 5, 6, 2], None)
    assert pld.draft(10).tokens == [4, 5, 6]  # 1-gram [2]: its latest earlier occurrence
    pld.accept([7, 1, 2], None)  # ... 6, 2, 7, 1, 2 -> 2-gram [1, 2] matched latest at index 4
    tree = pld.draft(2)
    assert (tree.tokens, tree.parents) == ([4, 5], [-1, 0])
    pld.accept([8], None)  # 8 never occurred: no draft
    assert len(pld.draft(3)) == 0


def test_sized_prompt_lookup_verifies_what_pays_on_the_cost_curve(monkeypatch):
    history = [5, 6, 7, 8, 9, 10, 11, 5]  # [5] recurs: the match is 6 .. 11
    flat = [0.0] + [1.0 + 0.001 * n for n in range(1, 12)]  # a forward of 11 tokens costs about one token
    steep = [0.0] + [float(n) for n in range(1, 12)]  # forwards cost in proportion to their tokens
    monkeypatch.undo()  # (the autouse fixture's sizes in turn)
    pld = PromptLookupProposer(num_tokens=6, costs=ForwardCosts(flat))
    pld.start(history, None)
    assert pld.draft(10).tokens == [6, 7, 8, 9, 10, 11]  # worth verifying whole
    pld.accept([6, 7, 8, 12], None)  # three accepted, the fourth rejected
    assert pld.sizing.tried[:5] == [2, 2, 2, 2, 1] and pld.sizing.hits[:5] == [1.5, 1.5, 1.5, 0.5, 0.5]
    pld = PromptLookupProposer(num_tokens=6, costs=ForwardCosts(steep))
    pld.start(history, None)
    sizes = [len(pld.draft(10)) for _ in range(ChainSize.PROBE)]
    assert sizes == [0] * (ChainSize.PROBE - 1) + [1]  # plain rounds; the eighth drafts one token to measure
    assert "0 of" not in pld.describe() and pld.describe().startswith("pld:auto<=6")


def test_method_specs_and_bad_methods(shipped, smollm2_draft):
    assert parse_method("vanilla") is None
    assert parse_method("pld") == PromptLookup(10, sized=True) and parse_method("pld:4") == PromptLookup(4)
    assert parse_method("sps:2", draft=smollm2_draft).num_tokens == 2
    assert parse_method("eagle:chain:3", head=shipped).tree == "chain:3"
    assert [method_needs(s) for s in ("vanilla", "eagle:chain:2", "sps:3", "pld")] == [
        None, Artefact.EAGLE_HEAD, Artefact.DRAFT_MODEL, None]
    for bad, message in [("jacobi", "unknown method"), ("lookahead:W=0", "W 1-16"), ("lookahead:K=2", "expected lookahead:"), ("medusa", "needs a Medusa head"), ("pld:0", "K >= 1"), ("sps:x", "K >= 1"),
                         ("eagle:chain:0", "chain needs"), ("eagle", "needs an EAGLE head"),
                         ("sps", "needs a draft model"), ("vanilla:2", "unknown method"),
                         ("pld:", "drop the colon")]:
        with pytest.raises(InvalidArgumentError, match=message):
            parse_method(bad)
