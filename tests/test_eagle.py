"""EAGLE-specific behaviour on the bundled SmolLM2 (fp32): n-alpha, tree specs and masks, the
CLI, head checks and the Python API. The equivalence tests every method passes are in
test_methods.py."""

import json
import math

import pytest
from click.testing import CliRunner

from eaglespec.cli import main
from eaglespec.decoding.generate import generate
from eaglespec.decoding.drafters.eagle import Eagle
from eaglespec.decoding.tree import EAGLE1_PATHS, DraftTree, parse_tree
from eaglespec.errors import InvalidArgumentError
from eaglespec.models.costs import ForwardCosts


def test_chain_reports_n_alpha(smollm2, shipped):
    prompt = "Write a Python function that checks whether a number is prime."
    out = generate(smollm2, prompt, chat=True, max_new_tokens=40, method=Eagle(shipped, "chain:3"))
    assert len(out.n_alpha) == 3 and all(0 <= a <= 1 for a in out.n_alpha)
    assert out.n_alpha[0] > 0.2
    assert generate(smollm2, prompt, chat=True, max_new_tokens=8, method=Eagle(shipped, "eagle1")).n_alpha is None


def test_tree_specs():
    assert parse_tree("eagle1").paths == EAGLE1_PATHS and parse_tree("eagle1").max_nodes == 25
    assert parse_tree("chain:3").paths == ((0,), (0, 0), (0, 0, 0)) and parse_tree("chain:3").chain
    d = parse_tree("dynamic:topk=5,tokens=20")
    assert (d.topk, d.depth, d.tokens) == (5, 5, 20)
    for bad in ["eagle2", "chain:0", "chain:x", "dynamic:topk=0", "dynamic:width=3", "dynamic:topk=3,"]:
        if bad == "dynamic:topk=3,":
            assert parse_tree(bad).topk == 3  # a trailing comma is harmless
            continue
        with pytest.raises(InvalidArgumentError):
            parse_tree(bad)


def test_tree_mask_and_pruning():
    tree = DraftTree([5, 6, 7, 8], [-1, -1, 0, 2])  # root -> 5 -> 7 -> 8, root -> 6
    tokens, mask, positions = tree.verify_inputs(root=9, start=2, device="cpu")
    assert tokens.tolist() == [[9, 5, 6, 7, 8]] and positions.tolist() == [[2, 3, 3, 4, 5]]
    assert mask.int().tolist() == [
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 0, 1, 0, 0],
        [1, 1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 0, 1, 1],
    ]
    pruned = tree.prune(max_nodes=3, max_depth=2)
    assert (pruned.tokens, pruned.parents) == ([5, 6, 7], [-1, -1, 0])
    assert tree.prune(10, 10) is tree


@pytest.mark.slow  # loads the bundled model
def test_cli_eagle(monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    result = CliRunner().invoke(main, ["generate", "--prompt", "Say hello.", "--chat", "--method", "eagle",
                                       "--tree", "chain:3", "--max-new-tokens", "12", "--json", "--compare-vanilla"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["method"] == "eagle" and out["tree"] == "chain:3" and out["new_tokens"] >= 1
    assert math.isclose(out["speedup"], out["tokens_per_s"] / out["vanilla_tokens_per_s"])
    assert out["same_tokens_as_vanilla"] is True  # greedy, in the default bf16
    # one alpha per depth the chain of 3 reached (a depth is reported once a draft got there)
    assert 1 <= len(out["n_alpha"]) <= 3 and math.isclose(out["tau"], out["new_tokens"] / out["target_forwards"])
    for args, message in [(["--tree", "chain:"], "unknown tree"), (["--temperature", "-1"], "temperature"),
                          (["--top-p", "1.5"], "top-p")]:
        result = CliRunner().invoke(main, ["generate", "--prompt", "x", "--method", "eagle", *args])
        assert result.exit_code == 1 and message in result.output


def test_a_head_for_another_target_is_refused(tiny_target_folder):
    from eaglespec.heads.checkpoint import resolve_head

    head = resolve_head("default", "smollm2-135m-instruct")
    result = CliRunner().invoke(main, ["generate", "--model", str(tiny_target_folder), "--prompt", "x",
                                       "--method", "eagle", "--head", str(head)])
    assert result.exit_code == 1 and "fits a llama model with hidden size 576" in result.output


@pytest.mark.slow  # loads the bundled model
def test_python_api():
    import eaglespec

    model = eaglespec.load("smollm2-135m-instruct", head="default", dtype="float32")
    eagle = model.generate("Say hello.", chat=True, max_new_tokens=10, tree="chain:2")
    vanilla = model.generate("Say hello.", chat=True, max_new_tokens=10, method="vanilla")
    assert (eagle.method, vanilla.method) == ("eagle", "vanilla") and eagle.token_ids == vanilla.token_ids
    pieces = list(model.stream("Say hello.", chat=True, max_new_tokens=10, do_sample=False))
    assert "".join(pieces) == vanilla.text
    assert model.methods["eagle:auto"].learned  # what the stream's `auto` learned, kept for the next generation
    with pytest.raises(InvalidArgumentError, match="needs an EAGLE head"):
        eaglespec.load("smollm2-135m-instruct", head=None, dtype="float32").generate("x", method="eagle")


def test_auto_decodes_plainly_where_drafting_rounds_are_slower_and_probes_again():
    from eaglespec.decoding.sizing import AutoSize

    auto = AutoSize(ForwardCosts([0.0, 0.010, 0.012]))  # one token verified in 10 ms: 100 tokens/s to beat
    drafting, now = [], 0.0
    for _ in range(100):
        auto.start_round(now)
        drafting.append(auto.drafting)
        now += 0.040 if auto.drafting else 0.010  # a drafting round: 2 tokens in 40 ms (50 tokens/s)
        auto.finish_round(2 if auto.drafting else 1, 1 if auto.drafting else 0)
    # the first PROBE_ROUNDS rounds draft (one round's tokens are too noisy to judge by), then plain
    # rounds; each probe (PROBE_ROUNDS drafting rounds) that finds drafting slower doubles the wait,
    # from PROBE up to MAX_PROBE rounds
    assert (AutoSize.PROBE, AutoSize.MAX_PROBE, AutoSize.PROBE_ROUNDS) == (8, 32, 3)
    assert [i for i, d in enumerate(drafting) if d] == [0, 1, 2, 18, 19, 20, 52, 53, 54, 86, 87, 88]

    # the next generation starts where this one stopped: plain, the probe after 31 plain rounds (11
    # of them ended this generation)
    first, auto = auto, AutoSize(ForwardCosts([0.0, 0.010, 0.012]), earlier=auto)
    assert (auto.accepted, auto.predicted, auto.drafted, auto.plain, auto.probe) == \
        (first.accepted, first.predicted, first.drafted, first.plain, first.probe)
    assert auto.drafted is not first.drafted and not auto.sizes  # its own sums; its own rounds
    drafting = []
    for _ in range(40):
        auto.start_round(now)
        drafting.append(auto.drafting)
        now += 0.040 if auto.drafting else 0.010
        auto.finish_round(2 if auto.drafting else 1, 1 if auto.drafting else 0)
    assert [i for i, d in enumerate(drafting) if d] == [20, 21, 22]

    # one unlucky first round (1 token in 12 ms) does not stop drafting that pays after it (3 in 15 ms)
    auto, drafting, now = AutoSize(ForwardCosts([0.0, 0.010, 0.012])), [], 0.0
    for i in range(20):
        auto.start_round(now)
        drafting.append(auto.drafting)
        tokens = 1 if not auto.drafting or i == 0 else 3
        now += 0.010 if not auto.drafting else 0.012 if i == 0 else 0.015
        auto.finish_round(tokens, tokens - 1)
    assert all(drafting)


def test_a_batch_drafts_only_while_drafting_rounds_beat_plain_ones():
    from eaglespec.decoding.sizing import BatchChoice

    costs = ForwardCosts([0.0, 0.010, 0.012, 0.016, 0.020])  # a forward of 4 tokens (one per row) in 20 ms

    def run(choice, rounds, drafted, plain_seconds, waited=0.0, growth=0.0):
        """Which rounds drafted: drafting ones give `drafted` (tokens, seconds) and `waited` seconds
        more for the heads' catch-up after plain rounds, plain ones 4 tokens in `plain_seconds`;
        every round's seconds grow by `growth` per round before it (longer contexts)."""
        chosen, plain = [], 0  # plain: rounds since the last drafting one (a row's waiting entries)
        for i in range(rounds):
            chosen.append(choice.start_round(4))
            caught_up = waited if chosen[-1] and plain else 0.0
            tokens, seconds = drafted if chosen[-1] else (4, plain_seconds)
            choice.finish_round(tokens, seconds * (1 + growth * i) + caught_up, caught_up, plain if chosen[-1] else 0)
            plain = 0 if chosen[-1] else plain + 1
        return [i for i, drafts in enumerate(chosen) if drafts]

    # drafting: 6 tokens in 60 ms against plain rounds of 4 in 20 ms: one probe of one round (4 rows'
    # rounds are enough to judge by) after PROBE - 1 plain rounds, the wait doubling after each that
    # loses against measured plain rounds (the first lost to the estimate: no longer wait)
    choice = BatchChoice(costs)
    assert run(choice, 200, (6, 0.060), 0.020) == [0, 8, 24, 56, 120]
    # each batch size has its own rates; a new one starts from the nearest one's state, tokens per row
    # alike (a batch whose rows finish must not find 4 rows' drafting tokens fast beside 3 rows' plain ones)
    assert not choice.start_round(3) and choice.by_size.keys() == {3, 4}
    three, four = choice.by_size[3], choice.by_size[4]
    assert three.drafted == [four.drafted[0] * 3 / 4, four.drafted[1]] and three.gain == pytest.approx(four.gain)
    # a round's cost grows with the contexts (here 3% a round): drafting rounds are weighed against
    # the plain rounds of their time, so the first one's speed does not outlive it
    assert run(BatchChoice(costs), 100, (6, 0.060), 0.020, growth=0.03) == [0, 8, 24, 56]
    # the estimate leaves out the round's other work (here plain rounds take 30 ms, not 20): drafting
    # that loses to it (8 tokens in 45 ms) but beats measured plain rounds goes plain for one round only
    assert run(BatchChoice(costs), 30, (8, 0.045), 0.030) == [0, *range(2, 30)]
    # a probe that never gives more than plain rounds stops, even within MARGIN of them
    assert run(BatchChoice(costs), 20, (3.9, 0.020), 0.020) == [0, 8]
    # a drafting run that has given more goes on while within MARGIN of plain rounds (a few rounds'
    # tokens vary), and stops once clearly slower: 4.4 tokens a round, then 3.9, then 3.5
    choice, drafts = BatchChoice(costs), []
    for tokens in [4.4] * 5 + [3.9] * 30 + [3.5] * 20:
        drafts.append(choice.start_round(4))
        choice.finish_round(tokens if drafts[-1] else 4, 0.020)
    assert all(drafts[:35]) and not all(drafts[35:])
    # the heads' catch-up over the entries that waited through plain rounds counts as theirs: drafting
    # at 12 tokens in 40 ms beats plain rounds even with 30 ms of catch-up after them
    assert run(BatchChoice(costs), 12, (12, 0.040), 0.020, waited=0.030) == list(range(12))
    choice = BatchChoice(costs)
    run(choice, 30, (6, 0.060), 0.020, waited=0.005)
    assert choice.by_size[4].plain[2] > 0
    # a catch-up after more plain rounds than the plain sums weigh is charged by each round's share
    rates = choice.by_size[4]
    window, charged = rates.plain[0] / 4, rates.plain[2]
    rates.drafting = True
    rates.record(6, 0.100, 0.040, 100)
    assert rates.plain[2] == pytest.approx(charged + 0.040 * window / 100)


def test_auto_charges_the_heads_catch_up_over_waiting_entries_to_the_rounds_without_a_draft():
    from eaglespec.decoding.sizing import AutoSize

    auto = AutoSize(ForwardCosts([0.0, 0.010, 0.012]))  # both kinds of round start as one vanilla round: 100 tokens/s
    auto.round_start = 1.0
    # this drafting round ran the head over entries of earlier plain rounds (10 ms) and over the
    # prompt (5 ms): the first is theirs, the second no round's
    auto.catch_up(0.010, 0.005, 1)
    assert auto.round_start == 1.015  # the drafting round's clock starts after both
    assert auto.plain_rate == 1 / 0.020 and auto.rate == 1 / 0.010
    # after more plain rounds than the plain sums weigh (here one round's worth), each carries its share
    auto = AutoSize(ForwardCosts([0.0, 0.010, 0.012]))
    auto.catch_up(0.040, 0.0, 40)
    assert auto.plain_rate == pytest.approx(1 / 0.011)


def test_auto_expands_only_the_nodes_whose_children_could_pay_on_this_cost_curve():
    import math

    from eaglespec.decoding.sizing import AutoSize

    scores = [math.log(p) for p in (0.6, 0.2, 0.1, 0.05)]  # the root's four children
    parents, candidates = [-1] * 4, [0, 1, 2, 3]

    def frontier(cost_of):  # seconds of a forward of n tokens
        auto = AutoSize(ForwardCosts([cost_of(n) for n in range(66)]))
        auto.round_start = 0.0
        return auto.frontier(scores, parents, candidates, 32, 0.001)

    assert frontier(lambda n: 0.010) == [0, 1, 2, 3]  # every token free to verify: the tree stays wide
    assert frontier(lambda n: 0.010 + 0.001 * n) == [0]  # a few cost little: a chain under the best
    assert frontier(lambda n: 0.010 * n) == []  # cost in proportion to tokens: nothing deeper pays


def test_trees_shrink_as_the_batch_fills():
    """Rows decoded together share the forward: a row beside others whose tokens already fill the
    forward's cheap part verifies fewer nodes (the `Budget` the scheduler hands its proposer), and
    the cost table extends past its measured end at its last slope."""
    from eaglespec.decoding.sizing import Budget, RoundCosts, best_prefix

    costs = ForwardCosts([0.0] + [0.010] * 16 + [0.010 + 0.001 * n for n in range(1, 50)])  # a knee at 16 tokens
    expected = [0.8, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.1]
    alone, _ = best_prefix(expected, RoundCosts(costs), 0.0)
    crowded_costs = RoundCosts(costs, Budget(tokens=40, accepted=6.0, seconds=0.002))  # three rows of about 13 tokens
    crowded, _ = best_prefix(expected, crowded_costs, 0.0)
    assert alone == 10 and 1 <= crowded < alone
    assert crowded_costs.forward(30) == pytest.approx(0.010 + 0.001 * (70 - 16))  # 40 + 30 tokens, past the measured 65
    assert RoundCosts(costs).forward(3) == 0.010 and RoundCosts(costs).rate(2.0, 3, 0.0) == 2.0 / 0.010


def test_auto_rounds_without_a_draft_keep_the_output(smollm2, shipped, monkeypatch):
    """Rounds that skip drafting leave the head's entries waiting; the next drafting round runs
    them all: greedy output still equals vanilla's."""
    from eaglespec.decoding.sizing import ALONE, AutoSize

    start_round, made = AutoSize.start_round, []

    def every_third(self, now, budget=ALONE):
        start_round(self, now, budget)
        self.drafting = len(made) % 3 == 0
        made.append(self)

    monkeypatch.setattr(AutoSize, "start_round", every_third)
    monkeypatch.setattr(AutoSize, "CALIBRATION_MEMORY", 1.0)  # plain sums, to count with
    prompt = "Write a Python function that checks whether a number is prime."
    vanilla = generate(smollm2, prompt, chat=True, max_new_tokens=40)
    out = generate(smollm2, prompt, chat=True, max_new_tokens=40, method=Eagle(shipped, "auto"))
    assert out.token_ids == vanilla.token_ids and out.tau > 1
    # the sizing counted every accepted draft token (plain rounds accept none) but the last round's,
    # which ends the generation before the proposer hears of it
    missed = (out.new_tokens - out.target_forwards) - (made[-1].accepted - 1)
    assert 0 <= missed <= len(out.accepted_lengths) - 1  # at most the most any round accepted


def test_auto_starts_a_generation_from_what_the_last_one_learned(smollm2, shipped):
    """A method that found drafting slower starts the next generation plain: the prompt's head
    entries wait until a probe, and the output still equals vanilla's."""
    from eaglespec.decoding.sizing import AutoSize

    method = Eagle(shipped, "auto")
    prompt = "Write a Python function that checks whether a number is prime."
    vanilla = generate(smollm2, prompt, chat=True, max_new_tokens=40)
    first = generate(smollm2, prompt, chat=True, max_new_tokens=40, method=method)
    ((learned,),) = (d.values() for d in method.learned.values())  # one target, one sampling setting
    # as if drafting had paid 0.001 token/s: plain rounds, a probe after PROBE - 1 of them (so slow
    # that the probe's PROBE_ROUNDS rounds cannot lift it above plain decoding on a loaded machine)
    learned.drafted, learned.drafting, learned.plain_rounds, learned.probe = [1.0, 1000.0], False, 0, AutoSize.PROBE
    second = generate(smollm2, prompt, chat=True, max_new_tokens=40, method=method)
    assert first.token_ids == second.token_ids == vanilla.token_ids
    ((again,),) = (d.values() for d in method.learned.values())
    assert again is not learned
    assert again.plain_total >= AutoSize.PROBE - 1  # plain from the start, then the probe drafted
    assert again.sizes and second.tau >= 1
