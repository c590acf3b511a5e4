import io
import itertools
import os

import pytest
import torch
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig, MixtralConfig, Phi3Config,
                          Qwen2Config, Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig)

from eaglespec.decoding.head_rows import HeadRows
from eaglespec.decoding.loop import Request, Scheduler
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.decoding.sizing import ALONE, AutoSize, BatchChoice, ChainSize
from eaglespec.models.config import ModelConfig
from eaglespec.models.decoder import Decoder
from eaglespec.models.load import build_decoder

torch.set_num_threads(int(os.environ.get("EAGLESPEC_TEST_THREADS", "2")))  # 1 beside another job

REAL_MODEL_FIXTURES = {"smollm2", "smollm2_hf", "shipped", "random_medusa", "smollm2_draft", "gemma"}


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
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
CONFIGS = {
    "llama": LlamaConfig(**TINY, rope_theta=100000.0, tie_word_embeddings=True),
    "qwen2": Qwen2Config(**TINY, rope_theta=1000000.0, tie_word_embeddings=False),
    "mistral": MistralConfig(**TINY, sliding_window=8, tie_word_embeddings=False),
    # the families of issue 54, each with what sets it apart from Llama turned on
    "gemma3_text": Gemma3TextConfig(**TINY, head_dim=32, query_pre_attn_scalar=24, sliding_window=8,
                                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                                    final_logit_softcapping=30.0),
    "qwen3": Qwen3Config(**TINY, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                         tie_word_embeddings=False),
    "llama3-rope": LlamaConfig(**TINY, rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}),
    "linear-rope": LlamaConfig(**TINY, rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}),
    "yarn-rope": LlamaConfig(**TINY, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                                      "original_max_position_embeddings": 32}),
    "phi3": Phi3Config(**TINY, pad_token_id=0, sliding_window=16, rope_parameters={
        "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}),
    "phi3-longrope": Phi3Config(**TINY, pad_token_id=0, original_max_position_embeddings=96, rope_parameters={
        "rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0 + i / 8 for i in range(8)],
        "long_factor": [2.0 + i for i in range(8)], "original_max_position_embeddings": 96}),
    "qwen2_moe": Qwen2MoeConfig(**TINY, **MOE, shared_expert_intermediate_size=64, mlp_only_layers=[1]),
    "qwen3_moe": Qwen3MoeConfig(**TINY, **MOE, head_dim=32, norm_topk_prob=True),
    "mixtral": MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2),
}
NEW_FAMILIES = [name for name in CONFIGS if name not in ("llama", "qwen2", "mistral")]


def random_model(config) -> torch.nn.Module:
    """transformers' model of `config`, random: biases, norms (Gemma's 1 + w included) and routers
    too, so that a dropped or misread one cannot pass, and the final norm scaled up, so that the
    next-token distribution has likely tokens (for the sampling tests) and greedy choices are clear."""
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float().eval()
    gemma = config.model_type == "gemma3_text"
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.normal_(p, std=0.5)
            elif "norm" in name:
                torch.nn.init.normal_(p, mean=0.0 if gemma else 1.0, std=0.3)
            elif name.endswith("mlp.gate.weight") or name.endswith("shared_expert_gate.weight"):
                torch.nn.init.normal_(p, std=1.0)
        final = hf.model.norm.weight
        final.copy_((1 + final) * 8 - 1 if gemma else final * 8)
    return hf


def tiny_pair(family: str) -> tuple[torch.nn.Module, Decoder]:
    """A tiny random model of a family (`random_model`): (transformers' model, our decoder with the same weights)."""
    hf = random_model(CONFIGS[family])
    return hf, build_decoder(ModelConfig.from_hf(hf.config), hf.state_dict(), torch.float32)


@pytest.fixture(scope="session")
def sentencepiece_model() -> bytes:
    """A tiny sentencepiece model, as large as the tiny vocabulary: llama.cpp's converter takes it
    for most families (it needs the llama.cpp source, which brings sentencepiece)."""
    from eaglespec.models.llamacpp import source

    source()  # a one-line error naming the set-up step when the converter (or sentencepiece) is missing
    import sentencepiece
    lines = [" ".join(f"word{i % 37} thing{i * 7 % 23} number {i}" for i in range(j, j + 12)) for j in range(300)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, model_type="bpe",
                                             vocab_size=TINY["vocab_size"], unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                             minloglevel=2)
    return model.getvalue()


def save_sentencepiece(model: bytes, folder) -> None:
    """Write the tiny sentencepiece model into a Hugging Face folder as its tokenizer."""
    from transformers import LlamaTokenizer

    (folder / "tokenizer.model").write_bytes(model)
    LlamaTokenizer(vocab_file=str(folder / "tokenizer.model")).save_pretrained(folder)


class Digits:
    """A stand-in tokenizer: the tiny models' token ids as text."""

    chat_template = None
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True) -> str:
        return "".join(f"<{i}>" for i in ids)


def tiny_target(family: str, dtype: torch.dtype = torch.float32):
    """(transformers' model, a `Target` of our decoder in `dtype` with the same weights, the
    `Digits` tokenizer and no EOS)."""
    from pathlib import Path

    from eaglespec.models.load import Target

    hf, ours = tiny_pair(family)
    if dtype != torch.float32:
        ours = build_decoder(ModelConfig.from_hf(hf.config), hf.state_dict(), dtype)
        ours.pack_weights()
    hf.generation_config.eos_token_id = None
    return hf, Target(family, Path("."), ours, Digits(), frozenset())


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


@pytest.fixture
def auto_drafts_every_round(monkeypatch):
    """`auto` trees draft in every round here (and batches in every round, unless a test says
    otherwise), and sized prompt lookup, `hybrid` and `medusa` verify 0, 1, 2, ... of their
    candidates in turn: where drafting rounds measure slower than plain ones they decode plainly (a
    matter of the machine's timing, tested in test_eagle.py, test_hybrid.py and with given costs
    below), and these tests must exercise the drafting path."""
    from eaglespec.decoding.drafters import hybrid, medusa

    start_round = AutoSize.start_round

    def drafting(self, now, budget=ALONE, plain=False):
        start_round(self, now, budget, plain)
        self.drafting = not plain

    def in_turn(self, available, budget=ALONE):
        self.sizes.append(len(self.sizes) % (available + 1))
        return self.sizes[-1]

    rounds = itertools.count()

    def nodes_in_turn(expected, costs, spent, plain=False):
        n = next(rounds) % (len(expected) + 1)
        return n, sum(expected[:n])

    monkeypatch.setattr(AutoSize, "start_round", drafting)
    monkeypatch.setattr(BatchChoice, "start_round", lambda self, rows: True)
    monkeypatch.setattr(BatchChoice, "finish_round", lambda self, tokens, seconds, waited=0.0, entries=0: None)
    monkeypatch.setattr(ChainSize, "size", in_turn)
    monkeypatch.setattr(hybrid, "best_prefix", nodes_in_turn)
    monkeypatch.setattr(medusa, "best_prefix", nodes_in_turn)


def exact_bins(hf_model, ids: list[int], n: int, width: int = 8) -> dict[tuple, float]:
    """A partition of 3-token continuations with exact vanilla probabilities (transformers' model,
    temperature 1), each bin expecting at least 5 of n samples: likely sequences (a, b, c), then
    what is left of a likely prefix (a, b, *) and (a, *, *); the rest is everything else."""
    with torch.no_grad():
        p1 = torch.softmax(hf_model(torch.tensor([ids])).logits[0, -1].double(), -1)
        firsts = p1.topk(width).indices.tolist()
        p2 = torch.softmax(hf_model(torch.tensor([ids + [a] for a in firsts])).logits[:, -1].double(), -1)
        bins = {}
        for i, a in enumerate(firsts):
            left_a = float(p1[a])
            seconds = p2[i].topk(width).indices.tolist()
            p3 = torch.softmax(hf_model(torch.tensor([ids + [a, b] for b in seconds])).logits[:, -1].double(), -1)
            for j, b in enumerate(seconds):
                left_ab = float(p1[a] * p2[i, b])
                for c in p3[j].topk(width).indices.tolist():
                    if n * float(p1[a] * p2[i, b] * p3[j, c]) >= 5:
                        bins[(a, b, c)] = float(p1[a] * p2[i, b] * p3[j, c])
                        left_ab -= bins[(a, b, c)]
                        left_a -= bins[(a, b, c)]
                if n * left_ab >= 5:
                    bins[(a, b)] = left_ab
                    left_a -= left_ab
            if n * left_a >= 5:
                bins[(a,)] = left_a
    return bins


def bin_of(tokens: list[int], bins: dict) -> tuple | str:
    for k in (3, 2, 1):
        if tuple(tokens[:k]) in bins:
            return tuple(tokens[:k])
    return "rest"


def chi_square_p_value(counts: list[int], probs: list[float]) -> float:
    n = sum(counts)
    stat = sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs))
    return float(torch.special.gammaincc(torch.tensor((len(counts) - 1) / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def decode_batch(target, method, requests: list[tuple[list[int], int, SamplingParams]], max_rows: int,
                 cancel: tuple[int, int] | None = None) -> list[list[int]]:
    """Decode (prompt, max_new_tokens, params) requests together, at most `max_rows` at a time
    (the rest wait and join as rows leave), in a cache with room for exactly that many; `cancel`
    (i, r): cancel request i after round r. Returns each request's tokens."""
    made = [Request(ids, params, n, target.eos_token_ids, method.bind(target, params) if method else None)
            for ids, n, params in requests]
    slots = sorted((len(ids) + n + 64 for ids, n, _ in requests), reverse=True)
    scheduler = Scheduler(target.model, sum(slots[:max_rows]), max_rows)
    rows = [scheduler.submit(request) for request in made]
    rounds = 0
    while not scheduler.idle:
        scheduler.step()
        rounds += 1
        if cancel and rounds == cancel[1]:
            scheduler.cancel(rows[cancel[0]])
    assert scheduler.cache.length == 0 and not scheduler.cache.lengths  # every slot freed
    return [row.tokens for row in rows]
