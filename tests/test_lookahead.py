"""Lookahead decoding: the window rows run beside the tree (each column's guess is the target's
greedy token after that column's trajectory, read as a plain sequence), the n-gram pool and the
window's moves. Greedy equality, the limits and the distribution test run in test_methods.py."""

import torch

from eaglespec.decoding.drafters.lookahead import LookaheadProposer
from eaglespec.decoding.tree import DraftTree


def test_each_column_guesses_the_targets_token_after_its_trajectory(smollm2):
    model = smollm2.model
    prompt = smollm2.tokenizer("The quick brown fox jumps over the lazy dog. The quick brown")["input_ids"]
    W, N = 4, 4
    proposer = LookaheadProposer(W, N, 3)
    proposer.start(prompt, None)
    tree = proposer.draft(10)
    assert len(tree) > 0 and tree.extra is not None  # " fox jumps over" from the prompt's n-grams
    assert len(tree.extra.tokens) == W * (N - 1) - 1
    cache = model.new_cache(len(prompt) + len(tree) + len(tree.extra.tokens) + 1)
    with torch.no_grad():
        model(torch.tensor([prompt[:-1]]), cache)
        start = cache.length
        tokens, mask, positions = tree.verify_inputs(prompt[-1], start, "cpu")
        logits, _ = model(tokens, cache, positions, mask)
    proposer.observe(logits[0, 1 + len(tree):])
    window = proposer.window
    for column in range(W):
        trajectory = [prompt[-1], *window[0][1:column + 1], *(window[level][column] for level in range(1, N - 1))]
        with torch.no_grad():
            alone = model(torch.tensor([prompt[:-1] + trajectory]), model.new_cache(len(prompt) + 8))[0][0, -1]
        assert proposer.guesses[column] == int(alone.argmax())
    # the tree's own rows are verified as they would be without the window beside them
    with torch.no_grad():
        cache = model.new_cache(len(prompt) + len(tree) + 1)
        model(torch.tensor([prompt[:-1]]), cache)
        plain = DraftTree(tree.tokens, tree.parents).verify_inputs(prompt[-1], cache.length, "cpu")
        alone, _ = model(*plain[:1], cache, plain[2], plain[1])
    assert torch.allclose(alone[0], logits[0, :1 + len(tree)], atol=1e-4)


def test_the_pool_keeps_each_columns_trajectory_and_the_window_follows_the_root():
    proposer = LookaheadProposer(window=2, ngram=3, pool=2)
    proposer.start([1, 2, 3, 1, 2, 4], None)
    assert proposer.pool[1] == [(2, 3), (2, 4)] and proposer.pool[2] == [(3, 1)]
    tree = proposer.draft(5)  # the root 4 starts no n-gram
    assert len(tree) == 0 and tree.extra.offsets == [1, 1, 2] and tree.extra.attends == [[], [], [0]]
    window = [list(level) for level in proposer.window]
    proposer.observe(torch.nn.functional.one_hot(torch.tensor([0, 7, 8]), 10).float())  # guesses 7, 8
    proposer.accept([5], None)  # no draft accepted: one move
    assert proposer.pool[4] == [(window[1][0], 7)]  # column 0 starts at the root
    assert proposer.pool[window[0][1]][-1] == (window[1][1], 8)
    assert proposer.window == [window[1], [7, 8]] and proposer.root == 5
    proposer.draft(5)
    proposer.accept([9, 6], None)  # a draft token accepted (no window rows ran): two moves
    assert proposer.window == [[7, 8], [7, 8]] and proposer.root == 6
    for continuation in [(1, 1), (2, 2), (1, 1), (5, 5)]:
        proposer._remember(99, continuation)
    assert proposer.pool[99] == [(2, 2), (5, 5)]  # distinct, the G latest
    assert proposer.describe() == "lookahead:W=2,N=3,G=2 (mean 0.0 draft tokens and 3 window rows per round)"
