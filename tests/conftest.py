import os

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

from eaglespec.decoding.head_rows import HeadRows
from eaglespec.models.config import ModelConfig
from eaglespec.models.decoder import Decoder
from eaglespec.models.load import build_decoder

torch.set_num_threads(int(os.environ.get("EAGLESPEC_TEST_THREADS", "2")))  # 1 beside another job

REAL_MODEL_FIXTURES = {"smollm2", "smollm2_hf", "shipped", "random_medusa", "smollm2_draft"}


def pytest_collection_modifyitems(items):
    """Every test that loads a bundled model, itself or through a fixture, is `slow`: the fast
    tier (`pytest -m "not slow"`, run first by scripts/test.sh) is what runs without one. Tests that
    load one by name are marked by hand, and `no_bundled_model_in_the_fast_tier` holds them to it."""
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def no_bundled_model_in_the_fast_tier(request, monkeypatch):
    """In a run that leaves out the slow tests, a test that loads a bundled model fails, naming the
    marker it lacks (a load in this process; tests that start `eaglespec` processes are marked by hand)."""
    if "not slow" not in (request.config.getoption("markexpr") or "") or request.node.get_closest_marker("slow"):
        return
    from eaglespec.models import load
    from eaglespec.models.registry import BUNDLED

    resolve = load.resolve

    def guarded(spec):
        if spec in BUNDLED:
            pytest.fail(f"{request.node.nodeid} loads the bundled model {spec}: mark it @pytest.mark.slow")
        return resolve(spec)

    monkeypatch.setattr(load, "resolve", guarded)


TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
CONFIGS = {
    "llama": LlamaConfig(**TINY, rope_theta=100000.0, tie_word_embeddings=True),
    "qwen2": Qwen2Config(**TINY, rope_theta=1000000.0, tie_word_embeddings=False),
    "mistral": MistralConfig(**TINY, sliding_window=8, tie_word_embeddings=False),
}


def tiny_pair(family: str) -> tuple[torch.nn.Module, Decoder]:
    """A tiny random model of a family: (transformers' model, our decoder with the same weights)."""
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(CONFIGS[family], attn_implementation="sdpa").float().eval()
    if family == "qwen2":  # random biases, so a dropped bias cannot pass
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    ours = build_decoder(ModelConfig.from_hf(hf.config), hf.state_dict(), torch.float32)
    return hf, ours


def drafted(proposer, max_depth: int):
    """A proposer's tree, drafted alone as the `Scheduler` drafts it (head forwards through a cache
    of its own)."""
    entries = proposer.entries
    if entries is not None and entries.rows is None:
        HeadRows(entries.head).add(entries)
    draft, result = proposer.propose(max_depth), None
    while True:
        try:
            call = draft.send(result)
        except StopIteration as done:
            return done.value
        (result,) = entries.rows.run([call])


@pytest.fixture(scope="session")
def smollm2():
    """The bundled default model in fp32 (fetched on first use)."""
    from eaglespec.models.load import load_target

    return load_target("smollm2-135m-instruct", "float32")


@pytest.fixture(scope="session")
def smollm2_hf(smollm2):
    """transformers' own implementation of the same weights, the reference."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(smollm2.folder), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def make_tiny_target(tmp_path_factory, smollm2):
    """make(name, **config) -> a Hugging Face folder: a tiny random Llama (2 layers, hidden 32 unless
    told otherwise) with SmolLM2's tokenizer and chat template."""

    def make(name: str, **overrides):
        folder = tmp_path_factory.mktemp(name)
        settings = dict(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                        eos_token_id=2, bos_token_id=1, rope_theta=100000.0)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(LlamaConfig(**(settings | overrides))).save_pretrained(folder)
        smollm2.tokenizer.save_pretrained(folder)
        return folder

    return make


@pytest.fixture(scope="session")
def tiny_target_folder(make_tiny_target):
    return make_tiny_target("tiny-target")


@pytest.fixture(scope="session")
def shipped(smollm2):
    """The shipped SmolLM2 head."""
    from eaglespec.heads.checkpoint import load_head

    return load_head("default", smollm2)


@pytest.fixture(scope="session")
def random_medusa(smollm2):
    """A random 3-head Medusa head over a random 4k-token draft vocabulary."""
    from eaglespec.heads.head import MedusaHead

    torch.manual_seed(0)
    head = MedusaHead(smollm2.model.config, 3)
    for block in head.heads:
        torch.nn.init.normal_(block.linear.weight, std=0.05)
    vocab = torch.randperm(smollm2.model.config.vocab_size)[:4096]
    return head.eval().requires_grad_(False).attach(smollm2.model, vocab)


@pytest.fixture(scope="session")
def smollm2_draft(smollm2):
    """A draft model for classic speculative sampling: SmolLM2's first 24 of 30 layers (same
    tokenizer, another distribution: about half of its drafts are rejected)."""
    from dataclasses import replace

    from eaglespec.models.load import Target

    full = smollm2.model
    with torch.device("meta"):
        model = Decoder(replace(full.config, num_layers=24))
    model.embed, model.norm, model.lm_head = full.embed, full.norm, full.lm_head  # shared weights
    model.layers = torch.nn.ModuleList(list(full.layers)[:24])
    return Target("smollm2-first-24-layers", smollm2.folder, model, smollm2.tokenizer, smollm2.eos_token_ids)
