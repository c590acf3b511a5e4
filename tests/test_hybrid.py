"""The `hybrid` proposer's parts: the n-gram index behind its copying sources (continuations,
shares, the longest match, the suffix cache's bound), how it merges and sizes a tree, its specs,
and the suffix cache on a repeated workload. Its equivalence with vanilla decoding is tested with
every other method's in test_methods.py, and the exactness of a tree it builds in test_verify.py."""

import pytest
from conftest import drafted

from eaglespec.decoding.generate import generate
from eaglespec.decoding.drafters.hybrid import Hybrid, HybridProposer, match_class
from eaglespec.decoding.drafters import Artefact, method_needs, parse_method
from eaglespec.decoding.sizing import Calibration
from eaglespec.decoding.ngram_index import KEY, NgramIndex
from eaglespec.errors import InvalidArgumentError
from eaglespec.models.costs import ForwardCosts

FLAT = ForwardCosts([0.0] + [1.0 + 0.001 * n for n in range(1, 70)])  # a forward of many tokens costs about one token
STEEP = ForwardCosts([0.0] + [float(n) for n in range(1, 70)])  # forwards cost in proportion to their tokens


def test_continuations_are_the_longest_matches_scored_by_share():
    index = NgramIndex()
    index.add([1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3, 4, 8])
    # tail [.., 2, 3]: three earlier occurrences of [2, 3], each matching 2 tokens back
    found = index.continuations([0, 2, 3], depth=2, max_paths=10)
    assert found.match == 2
    assert dict(zip(found.paths, found.shares)) == {(4,): 2 / 3, (5,): 1 / 3, (4, 9): 1 / 3, (4, 8): 1 / 3,
                                                     (5, 7): 1 / 3}
    # tail [.., 1, 2, 3]: only the first occurrence matches 3 tokens, the longest
    found = index.continuations([1, 2, 3], depth=3, max_paths=10)
    assert (found.match, found.paths, found.shares) == (3, [(4,), (4, 9), (4, 9, 2)], [1.0, 1.0, 1.0])
    # the most frequent paths when fewer are asked for, parents first
    assert index.continuations([0, 2, 3], depth=2, max_paths=2).paths == [(4,), (5,)]
    assert index.continuations([7, 7], depth=2, max_paths=10) is None  # never occurred
    assert index.continuations([4, 8], depth=2, max_paths=10) is None  # only as the tail: nothing after it


def test_a_growing_text_matches_its_own_earlier_part():
    index = NgramIndex()
    text = index.add([5, 6, 7])
    index.extend(text, [8, 5, 6])
    assert index.continuations([8, 5, 6], depth=3, max_paths=10).paths == [(7,), (7, 8), (7, 8, 5)]


def test_the_suffix_cache_forgets_its_oldest_texts_beyond_its_bound():
    index = NgramIndex(max_tokens=50)
    for i in range(40):
        index.add([100 + i, *range(i, i + 19)])
        assert index.tokens <= 50
        assert sum(map(len, index.where.values())) == sum(len(t) - KEY + 1 for t in index.texts.values())
    assert list(index.texts) == [38, 39] and index.tokens == 40
    assert index.continuations([0, 1], 2, 10) is None  # the first text is gone
    index.add(list(range(200, 260)))  # a text longer than the bound: its last 50 tokens
    assert list(index.texts) == [40] and index.texts[40] == list(range(210, 260))
    with pytest.raises(ValueError, match="newest"):
        index.extend(39, [1])
    with pytest.raises(InvalidArgumentError, match="at least 1 token"):
        NgramIndex(max_tokens=0)


def proposer(history, cache=None, costs=FLAT) -> HybridProposer:
    hybrid = HybridProposer(None, True, cache, Calibration(), costs)
    hybrid.start(history, None)
    return hybrid


def test_sources_merge_into_one_tree_sized_by_the_cost_curve():
    cache = NgramIndex()
    cache.add([1, 2, 3, 4, 5, 6])
    hybrid = proposer([9, 2, 3, 7, 8, 0, 2, 3], cache)  # lookup: 2 3 -> 7 8 0; the cache: 2 3 -> 4 5 6
    tree = drafted(hybrid, 3)
    assert sorted(tree.paths()) == [(4,), (4, 5), (4, 5, 6), (7,), (7, 8), (7, 8, 0)]
    assert all(tree.parents[i] < i for i in range(len(tree)))
    assert [tree.sources[tree.paths().index(p)] for p in [(7,), (4, 5)]] == ["lookup", "suffix"]
    hybrid.accept([7, 8, 1], None)  # the lookup's 7 and 8 accepted, then the target's 1
    lookup, suffix = ("lookup", match_class(2)), ("suffix", match_class(2))
    assert hybrid.calibration.factor(lookup) > 0.5 > hybrid.calibration.factor(suffix)
    assert hybrid.history[-3:] == [7, 8, 1]
    # where every verified token costs a forward's worth, the same candidates are not worth it
    assert len(drafted(proposer([9, 2, 3, 7, 8, 0, 2, 3], cache, STEEP), 3)) == 0


def test_a_node_two_sources_propose_is_one_node():
    cache = NgramIndex()
    cache.add([2, 3, 7, 5])
    tree = drafted(proposer([2, 3, 7, 8, 2, 3], cache), 2)
    assert sorted(tree.paths()) == [(7,), (7, 5), (7, 8)]


def test_hybrid_specs_and_bad_input(shipped):
    assert parse_method("hybrid", head=shipped) == Hybrid(shipped)
    assert parse_method("hybrid:lookup+suffix=1000") == Hybrid(None, ("lookup", "suffix"), 1000)
    assert [method_needs(s) for s in ("hybrid", "hybrid:eagle+lookup", "hybrid:suffix")] == [Artefact.EAGLE_HEAD, Artefact.EAGLE_HEAD, None]
    for bad, message in [("hybrid:medusa", "expected some of eagle"), ("hybrid:lookup+lookup", "once each"),
                         ("hybrid:lookup=3", "suffix=N"), ("hybrid:suffix=x", "suffix=N"),
                         ("hybrid:suffix=0", "at least 1 token"), ("hybrid:suffix=-5", "at least 1 token"),
                         ("hybrid", "needs an EAGLE head")]:
        with pytest.raises(InvalidArgumentError, match=message):
            parse_method(bad)


def test_the_suffix_cache_accepts_far_more_on_a_repeated_workload(smollm2, monkeypatch):
    """The same prompts twice in one process: the second pass copies the first pass's answers."""
    monkeypatch.setattr(smollm2.model, "_forward_costs", FLAT)  # sizes that do not depend on this machine
    method = parse_method("hybrid:suffix=5000")
    prompts = ["Name three fruits.", "What is the capital of France?", "Write a haiku about rain."]
    first = [generate(smollm2, p, chat=True, max_new_tokens=32, method=method) for p in prompts]
    again = [generate(smollm2, p, chat=True, max_new_tokens=32, method=method) for p in prompts]
    assert [o.token_ids for o in again] == [o.token_ids for o in first]
    tau = [sum(o.new_tokens for o in outs) / sum(o.target_forwards for o in outs) for outs in (first, again)]
    assert tau[1] > 2 * tau[0] and tau[1] > 4
    assert all(set(o.sources) == {"suffix"} for o in again)
