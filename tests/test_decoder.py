"""Our decoder against transformers' implementation, tree attention and KV compaction."""

import pytest
import torch
from conftest import CONFIGS, tiny_pair

from eaglespec.models.decoder import Decoder, causal_mask

def full_forward(model: Decoder, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return model(tokens, model.new_cache(tokens.shape[1]))


@pytest.mark.parametrize("family", list(CONFIGS))
def test_incremental_decoding_matches_full_forward(family):
    """Prefill, then one token at a time, then a chunk: the cache must reproduce the full pass."""
    _, ours = tiny_pair(family)
    tokens = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        ref, _ = full_forward(ours, tokens)
        cache = ours.new_cache(20)
        parts = [ours(tokens[:, :10], cache)[0]]
        parts += [ours(tokens[:, i:i + 1], cache)[0] for i in range(10, 14)]
        parts.append(ours(tokens[:, 14:], cache)[0])
    assert (torch.cat(parts, dim=1) - ref).abs().max() < 1e-4


def test_smollm2_logits_match_transformers(smollm2, smollm2_hf):
    ids = smollm2.tokenizer("The quick brown fox jumps over the lazy dog because", return_tensors="pt").input_ids
    with torch.inference_mode():
        ref = smollm2_hf(ids).logits
        logits, _ = full_forward(smollm2.model, ids)
    assert (logits - ref).abs().max() < 1e-3


# A draft tree under a root: parent index of each node (-1 = root).
TREE_PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 6]


def tree_paths(parents: list[int]) -> list[list[int]]:
    children = {i for i in parents if i >= 0}
    leaves = [i for i in range(len(parents)) if i not in children]
    paths = []
    for leaf in leaves:
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    return paths


def tree_inputs(parents: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [1, T] and mask [T, start + T]: each node sees the cache and its ancestors."""
    T = len(parents)
    depth = torch.zeros(T, dtype=torch.long)
    mask = torch.zeros(T, start + T, dtype=torch.bool)
    mask[:, :start] = True
    for i, p in enumerate(parents):
        mask[i, start + i] = True
        if p >= 0:
            depth[i] = depth[p] + 1
            mask[i, start:] |= mask[p, start:]
    return (start + depth).unsqueeze(0), mask


@pytest.mark.parametrize("family", list(CONFIGS))
def test_tree_forward_equals_each_path(family):
    _, ours = tiny_pair(family)
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 97, (1, 6), generator=g)
    nodes = torch.randint(0, 97, (1, len(TREE_PARENTS)), generator=g)
    positions, mask = tree_inputs(TREE_PARENTS, start=6)
    with torch.inference_mode():
        cache = ours.new_cache(6 + len(TREE_PARENTS))
        ours(prefix, cache)
        tree_logits, tree_features = ours(nodes, cache, positions=positions, mask=mask)
        for path in tree_paths(TREE_PARENTS):
            logits, features = full_forward(ours, torch.cat([prefix, nodes[:, path]], dim=1))
            assert (tree_logits[:, path] - logits[:, 6:]).abs().max() < 1e-4
            assert (tree_features[:, path] - features[:, 6:]).abs().max() < 1e-4


@pytest.mark.parametrize("weights", ["dense", "int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_tree_row_gets_the_numbers_of_one_token_decoding(family, dtype, weights):
    """Bit for bit, in every dtype and weight format: a node verified inside a tree (beside other
    rows, with masked keys) gets exactly the logits that decoding its path one token at a time
    gives, which is what makes greedy speculative output equal vanilla's."""
    from eaglespec.models.quantize import quantize

    _, ours = tiny_pair(family)
    quantize(ours, weights, dtype)
    ours.pack_weights()  # as load_target does (oneDNN packing, where the CPU has bf16 support)
    g = torch.Generator().manual_seed(6)
    prefix = torch.randint(0, 97, (1, 70), generator=g)  # more than one key block (64)
    nodes = torch.randint(0, 97, (1, len(TREE_PARENTS)), generator=g)
    positions, mask = tree_inputs(TREE_PARENTS, start=70)
    with torch.inference_mode():
        cache = ours.new_cache(90)
        ours(prefix, cache)
        tree_logits, _ = ours(nodes, cache, positions=positions, mask=mask)
        for path in tree_paths(TREE_PARENTS):
            cache = ours.new_cache(90)
            ours(prefix, cache)
            for node in path:
                logits, _ = ours(nodes[:, node:node + 1], cache)
                assert torch.equal(logits[0, 0], tree_logits[0, node])


def test_tree_forward_on_smollm2(smollm2):
    model = smollm2.model
    prefix = smollm2.tokenizer("Speculative decoding verifies a tree", return_tensors="pt").input_ids
    start = prefix.shape[1]
    nodes = torch.randint(0, 49152, (1, len(TREE_PARENTS)), generator=torch.Generator().manual_seed(4))
    positions, mask = tree_inputs(TREE_PARENTS, start)
    with torch.inference_mode():
        cache = model.new_cache(start + len(TREE_PARENTS))
        model(prefix, cache)
        tree_logits, _ = model(nodes, cache, positions=positions, mask=mask)
        for path in tree_paths(TREE_PARENTS):
            logits, _ = full_forward(model, torch.cat([prefix, nodes[:, path]], dim=1))
            assert (tree_logits[:, path] - logits[:, start:]).abs().max() < 1e-3


@pytest.mark.parametrize("family", list(CONFIGS))
def test_compaction_equals_recomputed_cache(family):
    """Keep one root-to-leaf path of a verified tree; the cache then equals a fresh prefill."""
    _, ours = tiny_pair(family)
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, 97, (1, 6), generator=g)
    nodes = torch.randint(0, 97, (1, len(TREE_PARENTS)), generator=g)
    positions, mask = tree_inputs(TREE_PARENTS, start=6)
    path = [0, 1, 4, 8]
    with torch.inference_mode():
        cache = ours.new_cache(32)
        ours(prefix, cache)
        ours(nodes, cache, positions=positions, mask=mask)
        cache.keep(path)
        fresh = ours.new_cache(32)
        ours(torch.cat([prefix, nodes[:, path]], dim=1), fresh)
        assert cache.length == fresh.length == 10
        assert (cache.k[..., :10, :] - fresh.k[..., :10, :]).abs().max() < 1e-5
        assert (cache.v[..., :10, :] - fresh.v[..., :10, :]).abs().max() < 1e-5
        # decoding continues identically from both caches
        nxt = torch.randint(0, 97, (1, 3), generator=g)
        a, _ = ours(nxt, cache)
        b, _ = ours(nxt, fresh)
    assert (a - b).abs().max() < 1e-4


def test_causal_mask_shape():
    m = causal_mask(2, 3)
    assert m.tolist() == [[True, True, True, False, False],
                          [True, True, True, True, False],
                          [True, True, True, True, True]]


def test_packed_bf16_weights_give_the_same_logits():
    _, ours = tiny_pair("qwen2")
    ours = ours.to(torch.bfloat16)
    tokens = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        plain, _ = full_forward(ours, tokens)
        if not ours.pack_weights():
            pytest.skip("neither our kernels nor oneDNN run bf16 here; weights stay unpacked")
        packed, _ = full_forward(ours, tokens)
        cache = ours.new_cache(12)
        ours(tokens[:, :11], cache)
        step, _ = ours(tokens[:, 11:], cache)
    scale = plain.abs().max()  # a few bf16 roundings of the largest logit
    assert (packed - plain).abs().max() < 1e-2 * scale
    assert (step[:, 0] - plain[:, -1]).abs().max() < 1e-2 * scale


@pytest.mark.parametrize("weights", ["dense", "int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_the_cpp_layer_stack_equals_the_python_layers(family, dtype, weights):
    """kernels.LayerStack runs the same operations as the Python layers: the same bits for a
    prefill, one-token steps and a tree, with the captured hidden states an EAGLE-3 head reads."""
    from eaglespec.models.quantize import quantize

    _, ours = tiny_pair(family)
    quantize(ours, weights, dtype)
    ours.pack_weights()
    if ours.layer_stack() is None:
        pytest.skip("this configuration runs the Python layers (no C++ kernels, or oneDNN-packed weights)")
    g = torch.Generator().manual_seed(8)
    prefix = torch.randint(0, 97, (1, 70), generator=g)
    nodes = torch.randint(0, 97, (1, len(TREE_PARENTS)), generator=g)
    positions, mask = tree_inputs(TREE_PARENTS, start=72)
    capture = (0, 1, len(ours.layers))

    def run():
        with torch.inference_mode():
            cache = ours.new_cache(90)
            outs = [ours(prefix, cache, capture=capture)]
            outs += [ours(prefix[:, i:i + 1], cache, capture=capture) for i in range(2)]
            outs.append(ours(nodes, cache, positions=positions, mask=mask, capture=capture))
            return [t for pair in outs for t in pair] + [cache.k, cache.v]

    fast = run()
    ours.layer_stack = lambda: None  # the Python layers
    slow = run()
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpp_layer_stack_runs_a_layer_without_input_norm(dtype):
    """An EAGLE-1 head's layer (input norm replaced by the identity) through the C++ stack: the
    same bits as the Python layer."""
    from eaglespec.models.decoder import Stack

    _, target = tiny_pair("llama")
    torch.manual_seed(9)
    stack = Stack(target.config, 1)  # randomly initialised linears
    stack.layers[0].input_norm = torch.nn.Identity()
    stack = stack.to(dtype).eval().requires_grad_(False)
    stack.pack_weights()
    if stack.layer_stack() is None:
        pytest.skip("this configuration runs the Python layers (no C++ kernels, or oneDNN-packed weights)")
    x = torch.randn(1, 9, target.config.hidden_size, generator=torch.Generator().manual_seed(9)).to(dtype)

    def run():
        with torch.inference_mode():
            cache = stack.new_cache(12)
            return [stack.run_layers(x[:, :8], cache, None, None)[0], stack.run_layers(x[:, 8:], cache, None, None)[0]]

    fast = run()
    stack.layer_stack = lambda: None  # the Python layer
    assert all(torch.equal(a, b) for a, b in zip(fast, run()))
