"""The training pipeline on a tiny target: extraction, loss, exact resume, Ctrl-C, DDP, n-alpha."""

import errno
import gzip
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from eaglespec.cli import main
from eaglespec.errors import EaglespecError, InvalidArgumentError
from eaglespec.heads.checkpoint import HeadMismatchError, load_head, save_head
from eaglespec.heads.head import INPUT_VARIANTS, EagleHead
from eaglespec.models.load import load_target
from eaglespec.training import features as features_module
from eaglespec.training import trainer as trainer_module
from eaglespec.training.evaluate import chain_predictions
from eaglespec.training.features import ExtractConfig, FeatureSet, extract, target_outputs
from eaglespec.training.config import TrainConfig
from eaglespec.training.trainer import draft_vocabulary, train


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "count.jsonl"
    with open(path, "w") as f:
        for i in range(40):
            answer = " ".join(str(n) for n in range(i, i + 30))
            f.write(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Count from {i}."},
                                                             {"role": "assistant", "content": answer}]}) + "\n")
    return path


@pytest.fixture(scope="module")
def tiny(tiny_target_folder):
    return load_target(str(tiny_target_folder), "float32")


@pytest.fixture(scope="module")
def extracted(tmp_path_factory, tiny, dataset):
    root = tmp_path_factory.mktemp("features")
    common = dict(model=str(tiny.folder), source=str(dataset), heldout_fraction=0.2, shard_size=4)
    extract(tiny, ExtractConfig(split="train", **common), root / "train")
    extract(tiny, ExtractConfig(split="heldout", **common), root / "heldout")
    return root


def config(extracted, out, **kwargs):
    base = dict(model=str(extracted.parent / "x"), train_dir=str(extracted / "train"), out=str(out),
                heldout_dir=str(extracted / "heldout"), epochs=2, lr=1e-3, warmup_steps=2,
                batch_conversations=4, draft_vocab=256, checkpoint_every=3, autocast=False)
    return TrainConfig(**(base | kwargs))


@pytest.fixture
def cfg(extracted, tiny, tmp_path):
    return lambda name, **kw: config(extracted, tmp_path / name, model=str(tiny.folder), **kw)


def test_extraction_matches_the_target_and_resumes(extracted, tiny, dataset):
    train_dir = extracted / "train"
    shards = sorted(train_dir.glob("shard-*.safetensors"))
    assert len(shards) >= 7 and not list(train_dir.glob(".*tmp*"))
    data = FeatureSet(train_dir)
    sample = data[0]
    expected = target_outputs(tiny, sample["tokens"].tolist())
    assert torch.equal(sample["features"], expected["features"])
    assert torch.equal(sample["target_argmax"], expected["target_argmax"])
    # a restart redoes only what is missing, and ignores a half-written file
    times = {s.name: s.stat().st_mtime_ns for s in shards}
    shards[1].unlink()
    (train_dir / ".shard-00002.safetensors.tmp123").write_bytes(b"half")
    config = ExtractConfig(model=str(tiny.folder), source=str(dataset), heldout_fraction=0.2, shard_size=4)
    extract(tiny, config, train_dir)
    assert shards[1].is_file() and shards[0].stat().st_mtime_ns == times[shards[0].name]
    assert len(FeatureSet(train_dir)) == len(data)
    with pytest.raises(InvalidArgumentError, match="other settings"):
        extract(tiny, ExtractConfig(model=str(tiny.folder), source=str(dataset), heldout_fraction=0.2,
                                    shard_size=4, max_len=64), train_dir)


def test_an_extraction_of_grown_data_reuses_the_shards_that_hold_the_same_conversations(tiny, dataset, tmp_path):
    lines = dataset.read_text().splitlines()
    small = tmp_path / "small.jsonl"
    small.write_text("\n".join(lines[:30]) + "\n")  # the source before it grew: its last shard partial
    common = dict(model=str(tiny.folder), heldout_fraction=0.2, shard_size=4)
    extract(tiny, ExtractConfig(source=str(small), **common), tmp_path / "before")
    fresh = extract(tiny, ExtractConfig(source=str(dataset), **common), tmp_path / "fresh")
    summary = extract(tiny, ExtractConfig(source=str(dataset), **common), tmp_path / "after", reuse=tmp_path / "before")
    before = sorted((tmp_path / "before").glob("shard-*"))
    assert 0 < summary["reused_shards"] == len(before) - 1  # every full shard linked
    with safe_open(str(before[-1]), "pt") as partial:  # and the partial one's sequences copied into a new one
        assert summary["copied_sequences"] == len(partial.get_tensor("offsets")) - 1 > 0
    assert {k: v for k, v in summary.items() if k not in ("reused_shards", "copied_sequences")} == fresh
    assert (tmp_path / "after" / before[0].name).stat().st_ino == before[0].stat().st_ino  # linked
    after, reference = FeatureSet(tmp_path / "after"), FeatureSet(tmp_path / "fresh")
    assert len(after) == len(reference)
    for i in range(len(after)):
        assert all(torch.equal(after[i][k], reference[i][k]) for k in reference[i])
    # a mix whose shares changed interleaves the sources anew: no shard is the same, every
    # sequence extracted before is copied, and the features are those of a fresh extraction
    mix = dict(common, source=f"{small}:1,{dataset}:1")
    extract(tiny, ExtractConfig(**mix), tmp_path / "mix-fresh")
    grown = extract(tiny, ExtractConfig(**mix), tmp_path / "mix", reuse=tmp_path / "fresh")
    assert grown["reused_shards"] == 0 and grown["copied_sequences"] == len(FeatureSet(tmp_path / "mix"))
    after, reference = FeatureSet(tmp_path / "mix"), FeatureSet(tmp_path / "mix-fresh")
    assert len(after) == len(reference)
    for i in range(len(after)):
        assert all(torch.equal(after[i][k], reference[i][k]) for k in reference[i])
    with pytest.raises(InvalidArgumentError, match="--reuse"):
        extract(tiny, ExtractConfig(source=str(dataset), dtype="float32", **common), tmp_path / "other",
                reuse=tmp_path / "before")


def test_full_disk_stops_cleanly(tiny, dataset, tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(features_module, "save_file", full)
    with pytest.raises(EaglespecError, match="disk is full"):
        extract(tiny, ExtractConfig(model=str(tiny.folder), source=str(dataset), shard_size=4), tmp_path / "f")
    assert not list((tmp_path / "f").glob("*shard*"))


def test_draft_vocabulary_is_the_most_frequent_assistant_tokens(extracted, tiny):
    data = FeatureSet(extracted / "train")
    vocab = draft_vocabulary(data, 8)
    counts = torch.zeros(49152, dtype=torch.long)
    for i in range(len(data)):
        s = data[i]
        counts += torch.bincount(s["tokens"][s["loss_mask"].bool()].long(), minlength=49152)
    outside = torch.ones(49152, dtype=torch.bool)
    outside[vocab] = False
    assert len(set(vocab.tolist())) == 8 and counts[vocab].min() >= counts[outside].max()  # ties either way


def test_resume_equals_an_uninterrupted_run(cfg):
    whole = train(cfg("whole"), log=lambda m: None)
    first = train(cfg("split", max_steps=3), log=lambda m: None)
    assert first.step == 3
    resumed = train(cfg("split"), log=lambda m: None)
    assert resumed.history == whole.history and resumed.evals == whole.evals
    a = torch.load(cfg("whole").out + "/checkpoint.pt", weights_only=False)["head"]
    b = torch.load(cfg("split").out + "/checkpoint.pt", weights_only=False)["head"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_early_answer_positions_can_weigh_more():
    from eaglespec.training.trainer import answer_weights

    mask = torch.tensor([0, 1, 1, 1, 0, 0, 1, 1, 1, 1], dtype=torch.bool)  # two answers, after their prompts
    assert answer_weights(mask, 1.0, 2).tolist() == mask.float().tolist()
    assert answer_weights(mask, 3.0, 2).tolist() == [0, 3, 3, 1, 0, 0, 3, 3, 1, 1]  # each answer's first 2
    assert answer_weights(torch.zeros(4, dtype=torch.bool), 3.0, 2).tolist() == [0, 0, 0, 0]
    with pytest.raises(InvalidArgumentError, match="--early-weight must be > 0"):
        TrainConfig(model="m", train_dir="t", out="o", early_weight=0)


def test_an_early_weighted_run_trains_another_head(cfg):
    plain = train(cfg("plain", max_steps=2), log=lambda m: None)
    early = train(cfg("early", max_steps=2, early_weight=4.0, early_tokens=4), log=lambda m: None)
    assert plain.history[0]["loss"] != early.history[0]["loss"]


def test_ctrl_c_saves_and_resumes(cfg, monkeypatch):
    whole = train(cfg("whole"), log=lambda m: None)
    calls = {"n": 0}
    real = trainer_module.conversation_loss

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 10:  # in the third step (4 conversations a step)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "conversation_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(cfg("ctrl-c"), log=lambda m: None)
    saved = torch.load(cfg("ctrl-c").out + "/checkpoint.pt", weights_only=False)
    assert saved["state"]["step"] == 2
    monkeypatch.setattr(trainer_module, "conversation_loss", real)
    assert train(cfg("ctrl-c"), log=lambda m: None).history == whole.history


def test_ctrl_c_during_the_epoch_evaluation_evaluates_again_on_resume(cfg, monkeypatch):
    whole = train(cfg("whole"), log=lambda m: None)
    real = trainer_module.evaluate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module, "evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(cfg("ctrl-c"), log=lambda m: None)
    monkeypatch.setattr(trainer_module, "evaluate", real)
    resumed = train(cfg("ctrl-c"), log=lambda m: None)
    assert [e["epoch"] for e in whole.evals] == list(range(1, len(whole.evals) + 1))
    assert resumed.evals == whole.evals and resumed.history == whole.history
    head = json.loads((Path(cfg("ctrl-c").out) / "head" / "config.json").read_text())["eaglespec"]
    assert head["evals"] == whole.evals and head["train_seconds"] >= 0
    assert head["train_conversations"] == len(FeatureSet(cfg("ctrl-c").train_dir))
    assert head["feature_seconds"] > 0 and head["eval_seconds"][-1] <= head["train_seconds"] + 1  # extraction timed


def test_a_light_checkpoint_resumes_a_run_whose_folder_is_lost(cfg, tiny, tmp_path):
    whole = train(cfg("whole"), log=lambda m: None)
    light = tmp_path / "kept" / "run.pt"
    train(cfg("lost", max_steps=3, light_checkpoint=str(light)), log=lambda m: None)
    kept, full = torch.load(light, weights_only=False), Path(cfg("lost").out) / "checkpoint.pt"
    assert kept["optimizer"] is None and kept["state"]["step"] == 3 and kept["state"]["restarted"] == 3
    assert {v.dtype for v in kept["head"].values() if v.is_floating_point()} == {torch.bfloat16}
    assert light.stat().st_size < full.stat().st_size / 2
    shutil.rmtree(cfg("lost").out)
    logs = []
    resumed = train(cfg("lost", light_checkpoint=str(light)), log=logs.append)
    assert "from the light checkpoint" in logs[0]
    assert resumed.history[:3] == whole.history[:3] and resumed.step == whole.step
    assert resumed.history[3]["lr"] == pytest.approx(1e-3 * 0.5)  # warming up again (2 steps)
    assert resumed.history[4]["lr"] == pytest.approx(whole.history[4]["lr"])  # then the run's schedule
    assert resumed.history[3]["loss"] == pytest.approx(whole.history[3]["loss"], rel=0.05)  # from bf16 weights
    assert len(resumed.evals) == len(whole.evals)
    head = load_head(cfg("lost").out + "/head", tiny).state_dict()
    shutil.rmtree(cfg("lost").out)  # lost after the run ended: the same command writes its head again
    assert train(cfg("lost", light_checkpoint=str(light)), log=lambda m: None).history == resumed.history
    again = load_head(cfg("lost").out + "/head", tiny).state_dict()
    assert all(torch.equal(head[k].to(torch.bfloat16), again[k].to(torch.bfloat16)) for k in head)
    with pytest.raises(InvalidArgumentError, match="made with other settings"):
        train(cfg("other", lr=2e-3, light_checkpoint=str(light)), log=lambda m: None)


@pytest.mark.parametrize("variant", INPUT_VARIANTS)
def test_every_input_variant_trains_and_saves(cfg, variant, tiny):
    state = train(cfg(variant, input_variant=variant, epochs=1), log=lambda m: None)
    assert state.step > 0 and len(state.evals[0]["alpha"]) == 5
    head = load_head(cfg(variant).out + "/head", tiny)
    assert head.input_variant == variant and head.vocab_size == 256


def test_a_two_layer_head_trains_and_saves(cfg, tiny):
    state = train(cfg("layers-2", num_layers=2, epochs=1), log=lambda m: None)
    assert state.step > 0 and len(state.evals[0]["alpha"]) == 5
    assert len(load_head(cfg("layers-2").out + "/head", tiny).layers) == 2


def test_training_learns_the_counting_pattern(cfg):
    state = train(cfg("learn", epochs=6, draft_vocab=0), log=lambda m: None)
    assert state.evals[-1]["alpha"][0] > state.evals[0]["alpha"][0] + 0.03  # from 0.0 to about 0.065
    assert state.history[-1]["loss"] < 0.95 * state.history[0]["loss"]


@pytest.mark.parametrize("layers", [1, 2])
def test_chain_predictions_match_step_by_step_drafting(tiny, extracted, layers):
    torch.manual_seed(1)
    head = EagleHead(tiny.model.config, num_layers=layers).attach(tiny.model).eval()
    sample = FeatureSet(extracted / "heldout")[0]
    steps = chain_predictions(head, sample, depth=3)
    tokens, feats = sample["tokens"].long(), sample["features"].float()
    for j in (0, 5, 17):
        with torch.no_grad():
            cache = head.new_cache(64)
            predicted = head(feats[None, :j + 1], tokens[None, 1:j + 2], cache)[0, -1:]
            for k in range(4):
                assert torch.allclose(predicted[0], steps[k][j], atol=1e-4)
                predicted = head(predicted[None], tokens[None, j + k + 2:j + k + 3], cache)[0]


def test_a_medusa_head_trains_on_the_stored_features_and_saves(cfg, tiny, extracted):
    from eaglespec.heads.head import MedusaHead

    settings = dict(head_type="medusa", medusa_heads=3, loss="ce", noise=0.0)
    # (the tiny target's next-token distributions are all near uniform, so only its features give a
    # loss with room to fall: head k regresses the feature at j + k)
    state = train(cfg("medusa", epochs=6, lr=3e-3, **(settings | {"loss": "feature:1,ce:0.1"})), log=lambda m: None)
    assert len(state.evals[0]["alpha"]) == 3  # each head's top-1 agreement
    assert state.history[-1]["loss"] < 0.9 * state.history[0]["loss"]
    head = load_head(cfg("medusa").out + "/head", tiny)
    assert isinstance(head, MedusaHead) and len(head.heads) == 3 and head.vocab_size == 256
    # the loss: head k at position j against the target's distribution at j + k (the token j + k + 1 after it)
    sample = FeatureSet(extracted / "heldout")[0]
    torch.manual_seed(2)
    fresh = MedusaHead(tiny.model.config, 3).attach(tiny.model, head.draft_vocab)
    for block in fresh.heads:
        torch.nn.init.normal_(block.linear.weight, std=0.1)
    loss, scored, _ = trainer_module.conversation_loss(fresh, sample, cfg("medusa", **settings), torch.Generator(),
                                                       autocast=False)
    f, mask = sample["features"].float(), sample["loss_mask"].bool()
    expected = 0.0
    with torch.no_grad():
        for k in range(3):
            for j in range(len(f) - 2 - k + 1):
                at = j + k + 1
                if mask[at]:
                    p = torch.softmax(tiny.model.lm_head(f[at]), -1)[head.draft_vocab]
                    log_q = torch.log_softmax(fresh.logits(fresh.heads[k](f[j])), -1)
                    expected += 0.8 ** k * float(-(p * log_q).sum())
    assert scored == int(mask[1:].sum()) and float(loss.detach()) == pytest.approx(expected, rel=1e-4)
    for bad, message in [(dict(unroll=3), "EAGLE options"), (dict(init="target-last-layer"), "EAGLE options"),
                         (dict(aux_layers=(0, 1, 2)), "EAGLE-3 option"),
                         (dict(init=cfg("medusa").out + "/head", medusa_heads=4), "--medusa-heads 3")]:
        with pytest.raises(InvalidArgumentError, match=message):
            train(cfg("bad-medusa", **(settings | bad)), log=lambda m: None)


def test_head_checkpoint_has_official_keys_and_refuses_another_target(tiny, smollm2, tmp_path):
    head = EagleHead(tiny.model.config).attach(tiny.model, torch.arange(10))
    save_head(head, tmp_path / "head", "tiny")
    from safetensors import safe_open

    keys = set(safe_open(str(tmp_path / "head" / "model.safetensors"), "pt").keys())
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.gate_proj.weight",
            "layers.0.post_attention_layernorm.weight", "draft_vocab"} <= keys
    assert not any("input_layernorm" in k for k in keys)
    loaded = load_head(str(tmp_path / "head"), tiny)
    assert torch.equal(loaded.fc.weight, head.fc.weight.to(torch.bfloat16).float()) and loaded.draft_vocab.tolist() == list(range(10))
    with pytest.raises(HeadMismatchError, match="use a head trained for this target"):
        load_head(str(tmp_path / "head"), smollm2)


def test_two_processes_under_torchrun_match_one(cfg, tmp_path):
    single = train(cfg("single", epochs=1), log=lambda m: None)
    c = cfg("ddp", epochs=1)
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "eaglespec.cli", "train", "--model", c.model, "--train-features", c.train_dir, "--heldout-features",
           c.heldout_dir, "--out", c.out, "--epochs", "1", "--lr", "1e-3", "--warmup-steps", "2", "--batch", "4",
           "--draft-vocab", "256", "--checkpoint-every", "3", "--no-autocast"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    a = torch.load(cfg("single").out + "/checkpoint.pt", weights_only=False)
    b = torch.load(c.out + "/checkpoint.pt", weights_only=False)
    for k in a["head"]:
        assert torch.allclose(a["head"][k], b["head"][k], atol=1e-5), k
    assert [h["loss"] for h in b["state"]["history"]] == pytest.approx([h["loss"] for h in single.history], rel=1e-5)


def test_regenerated_answers_are_the_targets_own_and_resume(tiny, dataset, tmp_path):
    from eaglespec.decoding.generate import chat_ids, generate
    from eaglespec.models.conversations import Conversation, ReadReport, read_conversations
    from eaglespec.training.regenerate import RegenerateConfig, answer_conversations, regenerate

    conversation = Conversation("r", [{"role": "user", "content": "Say something."},
                                      {"role": "assistant", "content": "original answer"},
                                      {"role": "user", "content": "More."},
                                      {"role": "assistant", "content": "second original"}])
    config = RegenerateConfig(str(tiny.folder), str(dataset), turns=0, max_new_tokens=6)
    [(new, generated)] = answer_conversations(tiny, [conversation], config)
    first = generate(tiny, chat_ids(tiny, [{"role": "user", "content": "Say something."}]), max_new_tokens=6)
    assert [m["role"] for m in new.messages] == ["user", "assistant", "user", "assistant"]
    assert new.messages[1]["content"] == first.text != "original answer"
    assert new.messages[3]["content"] != "second original" and generated > first.new_tokens
    [(one_turn, _)] = answer_conversations(tiny, [conversation], replace(config, turns=1))
    assert one_turn.messages == new.messages[:2]
    # answers decoded together are the ones decoded alone, whatever the batch size and however
    # many turns each conversation has (here 2, 1 and 0 answers)
    short = Conversation("s", conversation.messages[:2])
    empty = Conversation("e", conversation.messages[:1])
    alone = answer_conversations(tiny, [conversation, short, empty, conversation], config)
    assert [c.id for c, _ in alone] == ["r", "s", "e", "r"] and alone[1][0].messages == new.messages[:2]
    assert alone[2] == (Conversation("e", []), 0)
    for batch_size in (2, 3):
        assert answer_conversations(tiny, [conversation, short, empty, conversation], config, batch_size=batch_size) == alone
    # a dataset folder, shard by shard; an interrupted run resumes with the next shard
    config = RegenerateConfig(str(tiny.folder), str(dataset), limit=5, max_new_tokens=4, shard_size=2)
    out = tmp_path / "regen"
    assert regenerate(tiny, config, out, max_minutes=0)["left"] == 2  # stopped after the first shard
    first_shard = (out / "part-00000.jsonl.gz").read_bytes()
    # the drafting method sets only the speed: a folder resumes with another, each shard records its own
    from eaglespec.decoding.drafters import parse_method

    assert regenerate(tiny, replace(config, method="pld"), out, parse_method("pld"))["done_now"] == 2
    assert (out / "part-00000.jsonl.gz").read_bytes() == first_shard
    shards = json.loads((out / "manifest.json").read_text())["shards"]
    assert [s["method"] for s in shards.values()] == ["vanilla", "pld", "pld"]
    # ... and so does the batch size: the folder redone 4 answers at a time is the same
    together = tmp_path / "together"
    regenerate(tiny, config, together, batch_size=4)
    assert all(gzip.decompress((together / p.name).read_bytes()) == gzip.decompress(p.read_bytes())
               for p in out.glob("part-*.jsonl.gz"))  # (gzip headers hold the time of writing)
    records = list(read_conversations(str(out), ReadReport()))
    ids = [r.id for r in records]
    assert len(ids) == 5 and ids == sorted(ids, key=lambda i: int(i[1:]))  # file order
    assert all(r.messages[1]["role"] == "assistant" for r in records)
    with pytest.raises(InvalidArgumentError, match="other settings"):
        regenerate(tiny, replace(config, max_new_tokens=5), out)
    # --skip continues another folder's prompts: its first shard is the 4th conversation on
    later = tmp_path / "later"
    regenerate(tiny, replace(config, skip=3, limit=2), later)
    assert [r.id for r in read_conversations(str(later), ReadReport())] == ids[3:]


def test_eval_head_command_reports_n_alpha(cfg, tiny, dataset, tmp_path):
    train(cfg("evalcli", epochs=1), log=lambda m: None)
    result = CliRunner().invoke(main, ["eval-head", "--model", str(tiny.folder), "--head", cfg("evalcli").out + "/head",
                                       "--limit", "3", "--dtype", "float32", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["alpha"]) == 5 and report["tokens_scored"] > 0 and report["conversations"] == 3
    assert all(0 <= a <= 1 for a in report["alpha"])
    # on the target's own answers to the held-out prompts
    from eaglespec.training.regenerate import RegenerateConfig, regenerate

    own = tmp_path / "own"
    regenerate(tiny, RegenerateConfig(str(tiny.folder), str(dataset), split="heldout",
                                      limit=3, max_new_tokens=8, heldout_fraction=0.2), own)
    result = CliRunner().invoke(main, ["eval-head", "--model", str(tiny.folder), "--head", cfg("evalcli").out + "/head",
                                       "--data", str(own), "--limit", "3", "--dtype", "float32", "--json"])
    assert result.exit_code == 0, result.output
    on_own = json.loads(result.stdout)
    assert on_own["data"] == str(own) and on_own["conversations"] == 3
    assert 0 < on_own["tokens_scored"] < report["tokens_scored"]  # answers of at most 8 tokens
    result = CliRunner().invoke(main, ["eval-head", "--model", str(tiny.folder), "--head", cfg("evalcli").out + "/head",
                                       "--data", str(own), "--limit", "3", "--dtype", "float32", "--json",
                                       "--answer-tokens", "3"])
    assert result.exit_code == 0, result.output
    first_three = json.loads(result.stdout)
    assert first_three["tokens_scored"] == 9 and first_three["answer_tokens"] == 3


def test_each_head_type_defaults_to_its_recipe_from_python_and_the_cli(tmp_path, monkeypatch):
    """TrainConfig owns the defaults (the shipped recipes); the CLI's options come from it and only
    override what they give, over a --config file's settings."""
    import tomllib

    from eaglespec.training.config import RECIPES

    where = dict(model="m", train_dir="t", out=str(tmp_path / "run"))
    for kind, recipe in RECIPES.items():
        made = TrainConfig(head_type=kind, **where)
        assert {k: getattr(made, k) for k in recipe} == recipe
        assert TrainConfig.from_settings(tomllib.loads(made.toml())) == made  # train.toml reads back the same
    seen = []
    monkeypatch.setattr(trainer_module, "train", lambda config, log: seen.append(config))
    (tmp_path / "recipe.toml").write_text('head_type = "eagle3"\nlr = 0.01\nunroll = 2\nbetas = [0.8, 0.9]\n')
    result = CliRunner().invoke(main, ["train", "--config", str(tmp_path / "recipe.toml"), "--model", "m",
                                       "--train-features", "t", "--out", where["out"], "--unroll", "4"])
    assert result.exit_code == 0, result.output
    assert seen == [TrainConfig(head_type="eagle3", lr=0.01, unroll=4, betas=(0.8, 0.9), **where)]
    result = CliRunner().invoke(main, ["train", "--model", "m", "--train-features", "t", "--out", where["out"],
                                       "--betas", "0.9,x"])
    assert result.exit_code == 1 and "--betas '0.9,x'" in result.output
    (tmp_path / "typo.toml").write_text('learning_rate = 0.01\n')
    result = CliRunner().invoke(main, ["train", "--config", str(tmp_path / "typo.toml")])
    assert result.exit_code == 1 and "unknown training settings learning_rate" in result.output
    result = CliRunner().invoke(main, ["train", "--train-features", "t", "--out", where["out"]])
    assert result.exit_code == 1 and "give --model (or model in the --config file)" in result.output
