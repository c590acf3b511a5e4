"""EAGLE-3 heads, the training-time test and the token-level objectives, on tiny random targets:
the unrolled training forward equals chain drafting, every objective and head type trains,
saves and loads in its engine layout, and bad options fail before any work."""

import json
from dataclasses import replace

import pytest
import torch
from conftest import drafted
from safetensors import safe_open

from eaglespec.decoding.drafters.eagle import EagleProposer
from eaglespec.decoding.model import Model
from eaglespec.decoding.sampling import Draws, SamplingParams
from eaglespec.decoding.tree import parse_tree
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads import checkpoint
from eaglespec.heads.checkpoint import HeadMismatchError, load_head, resolve_head, save_head, shipped_heads, shipped_kinds
from eaglespec.heads.export import export_head
from eaglespec.heads.head import Eagle3Head, EagleHead, make_head
from eaglespec.models.load import load_target
from eaglespec.training.evaluate import chain_predictions, head_inputs
from eaglespec.training.features import ExtractConfig, FeatureSet, extract
from eaglespec.training.config import parse_loss
from eaglespec.training.objectives import position_losses
from eaglespec.training.config import TrainConfig
from eaglespec.training.trainer import draft_vocabulary, train

AUX = (1, 2, 3)


@pytest.fixture(scope="module")
def tiny4(make_tiny_target):
    """A tiny random 4-layer Llama (an EAGLE-3 head reads 3 of its layers)."""
    return load_target(str(make_tiny_target("tiny4", num_hidden_layers=4)), "float32")


@pytest.fixture(scope="module")
def features(tmp_path_factory, tiny4):
    data = tmp_path_factory.mktemp("data") / "count.jsonl"
    with open(data, "w") as f:
        for i in range(24):
            answer = " ".join(str(n) for n in range(i, i + 20))
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Count from {i}."},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    root = tmp_path_factory.mktemp("features")
    common = dict(model=str(tiny4.folder), source=str(data), heldout_fraction=0.2, shard_size=8, aux_layers=AUX)
    extract(tiny4, ExtractConfig(split="train", **common), root / "train")
    extract(tiny4, ExtractConfig(split="heldout", **common), root / "heldout")
    return root


def run_config(tiny4, features, out, **kwargs):
    base = dict(model=str(tiny4.folder), train_dir=str(features / "train"), out=str(out),
                heldout_dir=str(features / "heldout"), epochs=1, lr=1e-3, warmup_steps=2,
                batch_conversations=4, draft_vocab=256, checkpoint_every=3, autocast=False)
    return TrainConfig(**(base | kwargs))


def heads(tiny4):
    torch.manual_seed(1)
    vocab = torch.randperm(tiny4.model.config.vocab_size)[:512].sort().values
    return [EagleHead(tiny4.model.config).attach(tiny4.model, vocab).eval(),
            Eagle3Head(tiny4.model.config, AUX, 512).attach(tiny4.model, vocab).eval()]


@pytest.mark.parametrize("kind", [0, 1], ids=["eagle1", "eagle3"])
def test_unrolled_steps_equal_chain_drafting(tiny4, features, kind):
    """Step k of the unrolled training forward at position j equals the hidden state the
    inference drafter (EagleProposer, chain tree) predicts k levels below a root at j + 1."""
    head = heads(tiny4)[kind]
    sample = FeatureSet(features / "heldout")[0]
    inputs = head_inputs(head, sample).float()
    for j in (0, 4, 11):
        seen = []
        logits = head.logits
        head.logits = lambda h: (seen.append(h.clone()), logits(h))[1]  # what each level drafts from
        proposer = EagleProposer(head, parse_tree("chain:4"), SamplingParams(), Draws(torch.Generator()))
        prompt = sample["tokens"][:j + 2].tolist()
        proposer.start(prompt, inputs[None, :j + 1])
        drafted_tokens = drafted(proposer, 4).tokens
        del head.logits
        # the same chain, unrolled: step k reads the drafted token, as the drafter did
        tokens = torch.tensor(prompt + drafted_tokens)
        unrolled = {"tokens": tokens, "features": sample["features"][:len(tokens)],
                    "aux_features": sample["aux_features"][:len(tokens)]}
        unrolled["features"] = torch.cat([unrolled["features"], torch.zeros(len(tokens) - len(unrolled["features"]),
                                                                            unrolled["features"].shape[1])])
        unrolled["aux_features"] = torch.cat([inputs[:j + 1], torch.zeros(len(tokens) - j - 1, inputs.shape[1])])
        steps = chain_predictions(head, unrolled, depth=3, dtype=torch.float32)
        assert len(seen) == 4
        for k in range(4):
            assert torch.allclose(seen[k][0], steps[k][j], atol=1e-5), (j, k)


def test_objectives_are_the_documented_quantities():
    p_logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    lse = torch.logsumexp(torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]), -1)  # one token outside the draft vocabulary
    q_logits = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    p, q = torch.exp(p_logits - lse), torch.softmax(q_logits, -1)
    feats = torch.zeros(1, 3)
    ce = position_losses({"ce": 1.0}, q_logits, p_logits, lse, feats, feats)
    assert torch.allclose(ce, -(p * q.log()).sum(-1))
    accept = position_losses({"accept": 1.0}, q_logits, p_logits, lse, feats, feats)
    assert torch.allclose(accept, -torch.minimum(p, q).sum(-1).log())
    top = position_losses({"topk": 1.0}, q_logits, p_logits, lse, feats, feats)  # 4 tokens < TOPK: all
    assert torch.allclose(top, ce)
    both = position_losses({"ce": 0.5, "feature": 2.0}, q_logits, p_logits, lse, feats + 1, feats)
    assert torch.allclose(both, 0.5 * ce + 2.0 * 0.5)  # SmoothL1 of a difference of 1 is 0.5
    # the acceptance loss is minimal when q = p restricted and renormalized
    assert position_losses({"accept": 1.0}, p_logits, p_logits, lse, feats, feats) < accept


@pytest.mark.parametrize("head_type,loss,unroll,width", [("eagle1", "feature:1,ce:0.1", 3, 0), ("eagle1", "accept", 1, 24),
                                                          ("eagle1", "ce:1,topk:1", 2, 0), ("eagle3", "ce", 3, 24)])
def test_every_objective_and_head_type_trains_saves_and_loads(tiny4, features, tmp_path, head_type, loss, unroll,
                                                              width):
    config = run_config(tiny4, features, tmp_path / "run", head_type=head_type, loss=loss, unroll=unroll,
                        aux_layers=AUX if head_type == "eagle3" else (), intermediate_size=width)
    state = train(config, log=lambda m: None)
    assert state.step > 0 and len(state.evals[0]["alpha"]) == 5
    assert all(h["loss"] == h["loss"] and h["loss"] > 0 for h in state.history)  # finite, not NaN
    head = load_head(str(tmp_path / "run" / "head"), tiny4)
    assert head.head_type == head_type and head.vocab_size == 256
    saved = json.loads((tmp_path / "run" / "head" / "config.json").read_text())
    assert saved["eaglespec"]["train"]["unroll"] == unroll and saved["eaglespec"]["train"]["loss"] == loss
    # --intermediate-size narrows the head's MLP (0: the target's 64), in the file the engines read too
    assert saved["intermediate_size"] == head.layers[0].mlp.down.weight.shape[1] == (width or 64)
    if width:
        export_head(str(tmp_path / "run" / "head"), tiny4, "vllm", tmp_path / "vllm")
        assert json.loads((tmp_path / "vllm" / "config.json").read_text())["intermediate_size"] == width
        assert load_head(str(tmp_path / "vllm"), tiny4).layers[0].mlp.down.weight.shape[1] == width
        model, prompt = Model(tiny4, head), "Count from 3."
        assert model.generate(prompt, method="eagle", max_new_tokens=24).token_ids == \
            model.generate(prompt, method="vanilla", max_new_tokens=24).token_ids
        # a run continued from the head keeps its width
        train(replace(config, out=str(tmp_path / "more"), init=str(tmp_path / "run" / "head"), intermediate_size=0,
                      draft_vocab=0), log=lambda m: None)
        assert load_head(str(tmp_path / "more" / "head"), tiny4).layers[0].mlp.down.weight.shape[1] == width


def test_eagle3_checkpoint_has_the_engine_layout(tiny4, tmp_path):
    head = heads(tiny4)[1]
    save_head(head, tmp_path / "h3", "tiny4")
    keys = set(safe_open(str(tmp_path / "h3" / "model.safetensors"), "pt").keys())
    assert {"fc.weight", *(f"midlayer.self_attn.{x}_proj.weight" for x in "qkvo"), "midlayer.input_layernorm.weight",
            "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
            *(f"midlayer.mlp.{x}_proj.weight" for x in ("gate", "up", "down")), "norm.weight", "lm_head.weight",
            "d2t", "t2d"} == keys
    with safe_open(str(tmp_path / "h3" / "model.safetensors"), "pt") as f:
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
        assert f.get_tensor("midlayer.self_attn.q_proj.weight").shape[1] == 2 * 32
        assert f.get_tensor("fc.weight").shape == (32, 3 * 32)
    assert torch.equal(torch.arange(512) + d2t, head.draft_vocab) and t2d.dtype == torch.bool and int(t2d.sum()) == 512
    config = json.loads((tmp_path / "h3" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 512
    assert config["eagle_aux_hidden_state_layer_ids"] == list(AUX)
    loaded = load_head(str(tmp_path / "h3"), tiny4)
    assert isinstance(loaded, Eagle3Head) and torch.equal(loaded.draft_vocab, head.draft_vocab)
    assert torch.equal(loaded.lm_head.weight, head.lm_head.weight.to(torch.bfloat16).float())
    # layer ids that the target does not have, and a head of one type labelled as the other
    config["eagle_aux_hidden_state_layer_ids"] = [1, 2, 9]
    (tmp_path / "h3" / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadMismatchError, match="indices in 0..3"):
        load_head(str(tmp_path / "h3"), tiny4)
    config["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "h3" / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadMismatchError, match="not an EAGLE-1/2 head"):
        load_head(str(tmp_path / "h3"), tiny4)


def test_the_shipped_eagle3_head_is_named_eagle3(tiny4, tmp_path, monkeypatch):
    """Model a ships an EAGLE-1 default and an EAGLE-3 head beside it, model b an EAGLE-3 default
    (and an older EAGLE-3 head beside it, built locally, which the default overrides)."""
    eagle1, eagle3 = heads(tiny4)
    monkeypatch.setattr(checkpoint, "SHIPPED", tmp_path)
    (tmp_path / "eagle3").mkdir()
    for head, folder in ((eagle1, tmp_path / "a"), (eagle3, tmp_path / "eagle3" / "a"), (eagle3, tmp_path / "b"),
                         (eagle3, tmp_path / "eagle3" / "b")):
        save_head(head, folder, folder.name)
    assert shipped_kinds("a") == ["eagle1", "eagle3"] and shipped_kinds("b") == ["eagle3"] and shipped_kinds("c") == []
    assert resolve_head("default", "a") == tmp_path / "a" and resolve_head("eagle3", "a") == tmp_path / "eagle3" / "a"
    assert resolve_head("eagle3", "b") == resolve_head("default", "b") == tmp_path / "b"
    assert shipped_heads("eagle3") == "a, b" and shipped_heads() == "a, b"
    with pytest.raises(InvalidArgumentError, match=r"no shipped eagle3 head for 'c' \(shipped: a, b\).*train_eagle3.sh"):
        resolve_head("eagle3", "c")
    with pytest.raises(InvalidArgumentError, match="no head at 'eagle3'"):  # a Medusa head has no EAGLE-3 kind
        resolve_head("eagle3", "a", "medusa")


def test_bad_training_options_fail_before_any_work(tiny4, features, tmp_path):
    for kwargs, message in [({"unroll": 0}, "--unroll must be >= 1"), ({"loss": "mse"}, "unknown loss term 'mse'"),
                            ({"loss": "ce:0,feature:0"}, "sum to 0"), ({"loss": "ce:-1"}, "weight >= 0"),
                            ({"head_type": "eagle2"}, "unknown head type"),
                            ({"head_type": "eagle3", "loss": "feature:1,ce:0.1"}, "drop the 'feature' loss term"),
                            ({"aux_layers": (1, 2, 3)}, "EAGLE-3 option"), ({"unroll_decay": 0}, "unroll-decay"),
                            ({"head_type": "medusa", "loss": "ce", "unroll": 1, "intermediate_size": 32},
                             "--intermediate-size"), ({"intermediate_size": -1}, "--intermediate-size")]:
        with pytest.raises(InvalidArgumentError, match=message):
            run_config(tiny4, features, tmp_path / "bad", **kwargs)
    assert parse_loss("ce") == {"ce": 1.0}
    with pytest.raises(InvalidArgumentError, match="indices in 0..3"):
        train(run_config(tiny4, features, tmp_path / "bad", head_type="eagle3", loss="ce", aux_layers=(1, 2, 7)))
    with pytest.raises(InvalidArgumentError, match="extract with --aux-layers 0,1,2"):
        train(run_config(tiny4, features, tmp_path / "bad", head_type="eagle3", loss="ce", aux_layers=(0, 1, 2)))
    with pytest.raises(InvalidArgumentError, match="one decoder layer"):
        make_head(tiny4.model.config, "eagle3", num_layers=2)
    with pytest.raises(InvalidArgumentError, match="indices in 0..3"):
        extract(tiny4, ExtractConfig(str(tiny4.folder), aux_layers=(1, 2, 4)), tmp_path / "bad-features")
    assert not (tmp_path / "bad-features").exists()


def test_a_time_budget_decays_the_lr_to_zero_then_evaluates_and_ends(tiny4, features, tmp_path, capsys):
    config = run_config(tiny4, features, tmp_path / "budget", epochs=1000, budget_minutes=0.03)
    state = train(config, log=lambda m: None)
    assert "training (budget)" in capsys.readouterr().err  # the bar counts the budget's minutes, not 1000 epochs
    assert state.finished and 0 < state.epoch < 1000 and state.evals[-1]["step"] == state.step
    steps = [e["step"] for e in state.evals]
    assert steps == sorted(set(steps))  # no evaluation twice of the same weights
    lrs = [h["lr"] for h in state.history]
    assert lrs[1] > lrs[-1] >= 0
    assert all(b <= a for a, b in zip(lrs[2:], lrs[3:]))  # after the warmup (2 steps), only down
    assert (tmp_path / "budget" / "head" / "config.json").is_file()
    again = train(config, log=lambda m: None)  # a finished run does nothing more
    assert again.step == state.step and len(again.evals) == len(state.evals)


def test_a_run_continues_from_a_saved_head_on_a_later_slice(tiny4, features, tmp_path, monkeypatch):
    """The long program's stretches: the next slice of the split (--skip), training from the last
    head's weights and draft vocabulary."""
    from eaglespec.training import trainer as trainer_module
    from eaglespec.models.conversations import ReadReport
    from eaglespec.training.features import select

    train(run_config(tiny4, features, tmp_path / "first", head_type="eagle3", loss="ce", aux_layers=AUX),
          log=lambda m: None)
    saved = load_head(str(tmp_path / "first" / "head"), tiny4)
    seen = {}
    real = trainer_module.conversation_loss

    def spy(head, *args, **kwargs):  # the head as the first step sees it
        seen.setdefault("fc", head.fc.weight.detach().clone())
        seen.setdefault("vocab", head.draft_vocab)
        return real(head, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "conversation_loss", spy)
    later = run_config(tiny4, features, tmp_path / "later", head_type="eagle3", loss="ce",
                       init=str(tmp_path / "first" / "head"), max_steps=1, draft_vocab=0)
    train(later, log=lambda m: None)
    assert torch.equal(seen["fc"], saved.fc.weight.float()) and torch.equal(seen["vocab"], saved.draft_vocab)
    with pytest.raises(InvalidArgumentError, match="make them agree"):
        train(run_config(tiny4, features, tmp_path / "bad", init=str(tmp_path / "first" / "head")), log=lambda m: None)
    with pytest.raises(InvalidArgumentError, match="--draft-vocab 0"):  # an EAGLE-3 LM head is trained over its vocabulary
        train(run_config(tiny4, features, tmp_path / "bad", head_type="eagle3", loss="ce", aux_layers=AUX,
                         init=str(tmp_path / "first" / "head"), draft_vocab=128), log=lambda m: None)
    # an EAGLE-1 head continued with --draft-vocab N: its weights, a vocabulary picked anew from this data
    train(run_config(tiny4, features, tmp_path / "one", draft_vocab=128), log=lambda m: None)
    first = load_head(str(tmp_path / "one" / "head"), tiny4)
    seen.clear()
    train(run_config(tiny4, features, tmp_path / "repicked", init=str(tmp_path / "one" / "head"), max_steps=1),
          log=lambda m: None)
    assert torch.equal(seen["fc"], first.fc.weight.float())
    assert torch.equal(seen["vocab"].cpu(), draft_vocabulary(FeatureSet(features / "train"), 256))
    assert len(first.draft_vocab) == 128 and len(seen["vocab"]) == 256
    with pytest.raises(InvalidArgumentError, match="--init must be"):
        run_config(tiny4, features, tmp_path / "bad", init=str(tmp_path / "nothing"))
    # --skip: the slice after the first k conversations of the split
    whole = ExtractConfig(str(tiny4.folder), source=FeatureSet(features / "train").manifest["source"], limit=6)
    ids = [c.id for c in select(whole, ReadReport())]
    assert [c.id for c in select(replace(whole, skip=4, limit=2), ReadReport())] == ids[4:6]
