"""Medusa: the head (fresh heads repeat the target's own prediction; `unroll` as training and
evaluation read it), its checkpoint layout, the proposer's best-first tree of top-k candidates,
and the refusals of a head of the wrong kind. Greedy equality and the distribution test run in
test_methods.py, training in test_training.py."""

import itertools
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglespec.decoding.drafters.medusa import PROBE, TOPK, Medusa, MedusaProposer
from eaglespec.decoding.drafters import Artefact, method_needs, parse_method
from eaglespec.decoding.sizing import Calibration
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.checkpoint import HeadMismatchError, load_head, save_head
from eaglespec.heads.head import MedusaHead, make_head
from eaglespec.models.costs import ForwardCosts


def test_fresh_heads_give_the_targets_own_logits_and_unroll_as_training_reads(smollm2):
    c = smollm2.model.config
    head = MedusaHead(c, 3).attach(smollm2.model)
    features = torch.randn(5, c.hidden_size)
    own = smollm2.model.lm_head(features)
    logits = head.logits(head(features))
    assert logits.shape == (3, 5, c.vocab_size)
    assert all(torch.allclose(logits[k], own, atol=1e-5) for k in range(3))
    steps = head.unroll(features, torch.zeros(5, dtype=torch.long), depth=4, cache=head.new_cache(0))
    assert [len(s) for s in steps] == [5, 4, 3]  # head k from f[0 .. L - k]
    with pytest.raises(InvalidArgumentError, match="1 to 16 heads"):
        MedusaHead(c, 0)
    with pytest.raises(InvalidArgumentError, match="EAGLE options"):
        make_head(c, "medusa", num_layers=2)


def test_checkpoint_has_medusa_keys_round_trips_and_refuses_own_lm_heads(smollm2, random_medusa, tmp_path):
    folder = tmp_path / "medusa"
    save_head(random_medusa, folder, smollm2.name)
    tensors = load_file(str(folder / "model.safetensors"))
    assert set(tensors) == {"draft_vocab", *(f"{k}.0.linear.{p}" for k in range(3) for p in ("weight", "bias"))}
    loaded = load_head(str(folder), smollm2)
    assert isinstance(loaded, MedusaHead) and len(loaded.heads) == 3 and torch.equal(loaded.draft_vocab,
                                                                                      random_medusa.draft_vocab)
    feature = torch.randn(smollm2.model.config.hidden_size)
    expected = random_medusa.logits(random_medusa(feature))
    assert torch.allclose(loaded.logits(loaded(feature)), expected, atol=0.05 * expected.abs().max().item())
    # the Medusa release's files carry each head's own LM head: ours share the target's
    tensors["0.1.weight"] = torch.zeros(4096, smollm2.model.config.hidden_size)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(HeadMismatchError, match="own LM heads"):
        load_head(str(folder), smollm2)


def test_a_medusa_head_for_another_target_is_refused(random_medusa, tiny_target_folder, tmp_path):
    from eaglespec.models.load import load_target

    save_head(random_medusa, tmp_path / "medusa", "smollm2-135m-instruct")
    with pytest.raises(HeadMismatchError, match="use a head trained for this target"):
        load_head(str(tmp_path / "medusa"), load_target(str(tiny_target_folder), "float32"))


def test_a_head_of_the_wrong_kind_is_refused(shipped, random_medusa):
    assert method_needs("medusa") == method_needs("medusa:8") is Artefact.MEDUSA_HEAD
    assert parse_method("medusa:8", medusa=random_medusa) == Medusa(random_medusa, 8)
    for spec, kwargs, message in [("medusa", {"head": shipped}, "needs a Medusa head"),
                                  ("medusa", {"medusa": shipped}, "this one is an EAGLE head"),
                                  ("eagle", {"head": random_medusa}, "this one is a Medusa head: give it --medusa-head"),
                                  ("hybrid", {"head": random_medusa}, "this one is a Medusa head"),
                                  ("medusa:0", {"medusa": random_medusa}, "K >= 1"),
                                  ("medusa:65", {"medusa": random_medusa}, "1 to 64 nodes")]:
        with pytest.raises(InvalidArgumentError, match=message):
            parse_method(spec, **kwargs)


def test_candidates_are_the_best_paths_by_probability_product_and_every_prefix_is_a_tree(smollm2, random_medusa):
    c = smollm2.model.config
    proposer = MedusaProposer(random_medusa, None, Calibration(), ForwardCosts([0.0] + [1.0] * 40))
    proposer.start([1, 2, 3], torch.randn(1, 2, c.hidden_size))
    paths, scores, tokens = proposer.candidates(3)
    probs = torch.softmax(random_medusa.logits(random_medusa(proposer.feature)).float(), -1)
    top = probs.topk(TOPK, -1).values.tolist()
    assert len(paths) == proposer.shape.tokens == 32
    for path, score in zip(paths, scores):
        assert score == pytest.approx(math.prod(top[d][r] for d, r in enumerate(path)))
    assert scores == sorted(scores, reverse=True)
    assert all(p[:-1] in paths[:i] for i, p in enumerate(paths) if len(p) > 1)  # parents first
    every = sorted((math.prod(top[d][r] for d, r in enumerate(p)) for n in (1, 2, 3)
                    for p in itertools.product(range(TOPK), repeat=n)), reverse=True)
    assert scores == pytest.approx(every[:32])
    assert torch.equal(tokens, random_medusa.to_target(probs.topk(TOPK, -1).indices))
    # flat verification costs: every candidate pays; the tree's tokens are the heads' top tokens
    tree = proposer.draft(3)
    assert len(tree) == 32 and tree.depths() == [len(p) for p in paths]
    assert tree.tokens == [int(tokens[len(p) - 1, p[-1]]) for p in paths]
    assert max(proposer.draft(1).depths()) == 1
    predicted = sum(proposer.estimates)
    proposer.accept([tree.tokens[0], 7], torch.randn(1, 2, c.hidden_size))  # one draft token accepted
    memory, (a, p) = Calibration.MEMORY, Calibration.PRIOR
    assert proposer.calibration.factor(("medusa",)) == pytest.approx((memory * a + 1) / (memory * p + predicted))
    # where nothing pays, the heads rest: PROBE - 1 plain rounds, then the best node verified to measure again
    steep = MedusaProposer(random_medusa, None, Calibration(), ForwardCosts([float(n) for n in range(40)]))
    steep.start([1, 2, 3], torch.randn(1, 2, c.hidden_size))
    calls = []
    real = steep.candidates
    steep.candidates = lambda depth: calls.append(depth) or real(depth)
    sizes = []
    for _ in range(2 * PROBE + 1):
        sizes.append(len(steep.draft(3)))
        steep.accept([5], torch.randn(1, 1, c.hidden_size))
    assert sizes == [0] * PROBE + [1] + [0] * (PROBE - 1) + [1] and len(calls) == 3
    fixed = MedusaProposer(random_medusa, 5, Calibration(), None)
    fixed.start([1], None)
    assert len(fixed.draft(3)) == 0  # no feature yet: a plain round
    fixed.accept([4], torch.randn(1, 1, c.hidden_size))
    assert len(fixed.draft(3)) == 5 and fixed.describe().startswith("medusa:3 heads, top-8, 5 nodes")
