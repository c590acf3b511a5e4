"""Exactness of verification by enumeration: on a 5-token vocabulary, every way the draft tree can
be drawn and every accept/reject/residual branch of the real (batched) verifier is followed with
its exact probability. The first two tokens a round leaves (the second drawn by the next round when
the round stops after one) must follow the target's warped distribution, to float32 precision.
The rows of a batch verify as each alone does: the batched verifier against a node-by-node walk
of one tree (the reference), with the same draws."""

import functools
import itertools

import pytest
import torch
from conftest import drafted

from eaglespec.decoding.drafters.hybrid import HybridProposer
from eaglespec.decoding.sizing import Calibration
from eaglespec.decoding.ngram_index import NgramIndex
from eaglespec.decoding.sampling import Draws, SamplingParams, warp
from eaglespec.decoding.tree import DraftTree
from eaglespec.decoding import verify as verify_module
from eaglespec.decoding.verify import verify
from eaglespec.models.costs import ForwardCosts

V = 5


@functools.cache
def toy_logits(path: tuple[int, ...], seed: int) -> torch.Tensor:
    """A fixed, path-dependent distribution over V tokens (the target: seed 0; the draft: 1)."""
    g = torch.Generator().manual_seed(hash((path, seed)) % 2**31)
    return torch.randn(V, generator=g, dtype=torch.float64) * 1.5


def verify_one(tree: DraftTree, logits: torch.Tensor, params: SamplingParams, draws: Draws):
    """The batched verifier on a batch of one row."""
    return verify([tree], logits, [0], [params], [draws])[0]


def walk(tree: DraftTree, logits: torch.Tensor, params: SamplingParams, draws: Draws):
    """The reference: the multi-round rule (greedy: the argmax path) node by node down one tree,
    with scalar arithmetic on one node's distributions at a time."""
    kids = tree.children()
    path, row = [], 0
    while True:
        if params.greedy:
            token = int(logits[row].argmax())
            child = next((c for c in kids[row] if tree.tokens[c] == token), None)
            if child is None:
                return path, token
        else:
            p = warp(logits[row], params)
            q = verify_module._draft_probs(tree, row - 1, logits.shape[-1])
            child = None
            for c in kids[row]:
                x = tree.tokens[c]
                if draws.accept(min(1.0, float(p[x]) / (1.0 if q is None else float(q[x])))):
                    child = c
                    break
                if q is None:
                    rest = p.clone()
                    rest[x] = 0.0
                else:
                    rest = (p - q).clamp_min(0.0)
                    q[x] = 0.0
                    q /= q.sum()
                if rest.sum() > 0:
                    p = rest / rest.sum()
            if child is None:
                return path, draws.sample(p)
        path.append(child)
        row = child + 1


class Enumerating(Draws):
    """Draws that follow a script of choices and record the probability of the branch taken;
    `run` repeats a function over every branch (an odometer over the choices)."""

    def __init__(self):
        self.script: list[int] = []
        self.arity: list[int] = []

    def _choice(self, n: int) -> int:
        if self.at == len(self.script):
            self.script.append(0)
            self.arity.append(n)
        self.at += 1
        return self.script[self.at - 1]

    def accept(self, probability: float) -> bool:
        accepted = self._choice(2) == 0
        self.weight *= probability if accepted else 1 - probability
        return accepted

    def sample(self, probs: torch.Tensor) -> int:
        x = self._choice(len(probs))
        self.weight *= float(probs[x])
        return x

    def run(self, fn):
        while True:
            self.at, self.weight = 0, 1.0
            result = fn()
            yield self.weight, result
            while self.script and self.script[-1] + 1 == self.arity[-1]:
                self.script.pop()
                self.arity.pop()
            if not self.script:
                return
            self.script[-1] += 1


def ordered_draws(q: torch.Tensor, k: int):
    """Every ordered draw of min(k, support) distinct tokens from q without replacement, with its
    probability (the sequential rule `Draws.distinct` implements)."""
    k = min(k, int((q > 0).sum()))
    for seq in itertools.permutations(range(V), k):
        prob, left = 1.0, 1.0
        for x in seq:
            prob *= float(q[x]) / left
            left -= float(q[x])
        if prob > 0:
            yield prob, list(seq)


SHAPES = {  # children per node, by path of child ranks
    "siblings": {(): 3},
    "tree": {(): 2, (0,): 2, (1,): 1},
    "chain": {(): 1, (0,): 1},
}


def draw_trees(shape: dict, params: SamplingParams, sampled: bool):
    """Every draft tree the shape can produce, with its probability. Children are drawn without
    replacement from the warped draft distribution q, or (sampled=False) fixed: q's top-k."""

    def expand(rank_path, token_path, tree, parent):
        k = shape.get(rank_path, 0)
        if k == 0:
            yield 1.0, tree
            return
        q = warp(toy_logits(token_path, 1), params)
        options = ordered_draws(q, k) if sampled else [(1.0, q.topk(min(k, int((q > 0).sum()))).indices.tolist())]
        for prob, kids in options:
            grown = DraftTree(list(tree.tokens), list(tree.parents),
                              None if tree.draft_probs is None else {**tree.draft_probs, parent: q})
            indices = []
            for x in kids:
                indices.append(len(grown))
                grown.tokens.append(x)
                grown.parents.append(parent)
            yield from _expand_children(expand, rank_path, token_path, grown, indices, kids, prob)

    root = DraftTree(draft_probs={} if sampled else None)
    yield from expand((), (), root, -1)


def _expand_children(expand, rank_path, token_path, tree, indices, kids, prob, at=0):
    if at == len(kids):
        yield prob, tree
        return
    for p_sub, sub in expand(rank_path + (at,), token_path + (kids[at],), tree, indices[at]):
        yield from _expand_children(expand, rank_path, token_path, sub, indices, kids, prob * p_sub, at + 1)


def two_token_distribution(trees, params: SamplingParams) -> torch.Tensor:
    """The first two tokens' distribution, over draft trees given with their probabilities."""
    out = torch.zeros(V, V, dtype=torch.float64)
    for tree_prob, tree in trees:
        logits = torch.stack([toy_logits(path, 0) for path in [(), *tree.paths()]])
        draws = Enumerating()
        for branch_prob, (path, bonus) in draws.run(functools.partial(verify_one, tree, logits, params, draws)):
            tokens = [tree.tokens[i] for i in path] + [bonus]
            weight = tree_prob * branch_prob
            if len(tokens) >= 2:
                out[tokens[0], tokens[1]] += weight
            else:  # the next round draws the second token from the target
                out[tokens[0]] += weight * warp(toy_logits((tokens[0],), 0), params)
    return out


def exact_two_tokens(params: SamplingParams) -> torch.Tensor:
    first = warp(toy_logits((), 0), params)
    return torch.stack([first[a] * warp(toy_logits((a,), 0), params) for a in range(V)]).double()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.3, top_p=0.8),
], ids=["t1", "t0.7-topk3", "t1.3-topp0.8"])
@pytest.mark.parametrize("sampled", [True, False], ids=["drawn-from-q", "top-k"])
def test_one_round_is_exactly_the_target_distribution(shape, params, sampled):
    got = two_token_distribution(draw_trees(SHAPES[shape], params, sampled), params)
    assert abs(float(got.sum()) - 1) < 1e-5  # warp works in float32
    assert torch.allclose(got, exact_two_tokens(params), atol=1e-5)


def test_pruned_trees_and_draft_vocabularies_stay_exact():
    """Pruning keeps a prefix of each node's draws; draft distributions given over a permuted
    draft vocabulary are scattered back to the target's ids."""
    params = SamplingParams(temperature=1.0)
    got = two_token_distribution(((p, tree.prune(3, 2)) for p, tree in draw_trees(SHAPES["tree"], params, True)),
                                 params)
    assert torch.allclose(got, exact_two_tokens(params), atol=1e-5)

    perm = torch.tensor([3, 0, 4, 1, 2])  # draft id i is target id perm[i]
    for tree_prob, tree in draw_trees(SHAPES["siblings"], params, True):
        assert len(tree) == 3
        draft_view = DraftTree(tree.tokens, tree.parents, {n: q[perm] for n, q in tree.draft_probs.items()}, perm)
        logits = torch.stack([toy_logits(path, 0) for path in [(), *tree.paths()]])
        for seed in range(3):
            same = verify_one(tree, logits, params, Draws(torch.Generator().manual_seed(seed)))
            assert verify_one(draft_view, logits, params, Draws(torch.Generator().manual_seed(seed))) == same
        break


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3)],
                         ids=["t1", "t0.7-topk3"])
def test_a_hybrid_tree_of_copied_paths_is_exact(params):
    """A tree `hybrid` builds from its lookup and suffix-cache sources: chosen tokens (point-mass
    proposals, some unlikely or outside the top-k under the target), branching where the sources
    disagree, a node both propose merged."""
    cache = NgramIndex()
    cache.add([1, 2, 0, 4, 1, 2, 0, 3, 1, 2, 4])
    hybrid = HybridProposer(None, True, cache, Calibration(), ForwardCosts([0.0] + [1.0] * 70))
    hybrid.start([3, 1, 2, 3, 0, 1, 2], None)
    tree = drafted(hybrid, 3)
    assert set(tree.paths()) == {(0,), (0, 4), (0, 3), (0, 4, 1), (0, 3, 1), (4,), (3,), (3, 0), (3, 0, 1)}
    assert set(tree.sources) == {"lookup", "suffix"}
    got = two_token_distribution([(1.0, tree)], params)
    assert torch.allclose(got, exact_two_tokens(params), atol=1e-5)


def test_enumeration_catches_a_wrong_residual():
    """The test has power: the same enumeration with the residual left at p (a classic bug)
    does not give the target distribution."""
    original = verify_module.residual
    try:
        verify_module.residual = lambda p, q, drawn, x: (p, original(p, q, drawn, x)[1])
        params = SamplingParams(temperature=1.0)
        got = two_token_distribution(draw_trees(SHAPES["siblings"], params, True), params)
    finally:
        verify_module.residual = original
    assert not torch.allclose(got, exact_two_tokens(SamplingParams(temperature=1.0)), atol=1e-3)


def test_greedy_follows_the_argmax_path():
    # root children 7, 3; node 0 (7) has children 1, 2; node 1 (3) has child 5
    tree = DraftTree([7, 3, 1, 2, 5], [-1, -1, 0, 0, 1])
    logits = torch.zeros(6, 10)
    logits[0, 7] = logits[1, 2] = logits[4, 9] = 1  # root -> 7, node 0 -> 2, node 3 -> 9 (bonus)
    assert verify_one(tree, logits, SamplingParams(), None) == ([0, 3], 9)
    logits[0, 7], logits[0, 4] = 0, 1  # root -> 4: nothing accepted, bonus 4
    assert verify_one(tree, logits, SamplingParams(), None) == ([], 4)


def random_tree(g: torch.Generator, vocab: int, drawn: bool) -> DraftTree:
    """A random tree of 0 to 12 nodes over a small vocabulary. With `drawn`, most nodes' children
    are distinct draws from a draft distribution; the other nodes' siblings may repeat a token (as
    copied paths can)."""
    tree = DraftTree(draft_probs={} if drawn else None)
    for _ in range(int(torch.randint(0, 13, (), generator=g))):
        tree.parents.append(int(torch.randint(-1, len(tree), (), generator=g)))
        tree.tokens.append(0)
    for node, kids in enumerate(tree.children(), start=-1):
        if drawn and len(kids) <= vocab and torch.rand((), generator=g) < 0.7:
            tree.draft_probs[node] = torch.softmax(torch.randn(vocab, generator=g) * 2, -1)
            tokens = torch.randperm(vocab, generator=g)[:len(kids)].tolist()
        else:
            tokens = torch.randint(0, vocab, (len(kids),), generator=g).tolist()
        for kid, token in zip(kids, tokens):
            tree.tokens[kid] = token
    return tree


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.8, top_k=4, top_p=0.9)],
                         ids=["greedy", "t1", "t0.8-topk4-topp0.9"])
def test_a_batch_verifies_as_each_row_alone(params):
    """Rows of random trees (greedy ties included: few distinct logits) packed into one logits
    tensor with gaps between them, some rows greedy and some sampled with other warpers: each
    row's verdict and random draws are those of the reference walk of its tree alone."""
    g = torch.Generator().manual_seed(0)
    vocab = 6
    other = SamplingParams(temperature=1.0, top_p=0.7)
    for trial in range(40):
        rows = int(torch.randint(1, 6, (), generator=g))
        trees = [random_tree(g, vocab, drawn=not params.greedy and r % 2 == 0) for r in range(rows)]
        row_params = [params if r % 3 != 2 else (other if params.greedy else SamplingParams()) for r in range(rows)]
        starts, parts = [], []
        for tree in trees:
            gap = int(torch.randint(0, 3, (), generator=g))  # rows that are not verified (extra rows)
            starts.append(sum(len(part) for part in parts))
            parts.append(torch.randint(0, 3, (1 + len(tree) + gap, vocab), generator=g).float())
        logits = torch.cat(parts)
        seeds = [trial * 10 + r for r in range(rows)]
        got = verify(trees, logits, starts, row_params,
                     [Draws(torch.Generator().manual_seed(s)) for s in seeds])
        for r in range(rows):
            alone = logits[starts[r]:starts[r] + 1 + len(trees[r])]
            draws = Draws(torch.Generator().manual_seed(seeds[r]))
            assert got[r] == walk(trees[r], alone, row_params[r], draws), (trial, r)
