"""The CUDA path on a tiny random target: extraction, training (both head types, unrolled) and
drafting run on the GPU and agree with the CPU. Skipped where torch sees no CUDA device (the CPU
machines of CI); run on a GPU machine with `python -m pytest tests/test_cuda.py`."""

import json

import pytest
import torch

from eaglespec.decoding.generate import generate
from eaglespec.decoding.drafters.eagle import Eagle
from eaglespec.heads.checkpoint import load_head
from eaglespec.models.load import load_target
from eaglespec.training.features import ExtractConfig, FeatureSet, extract
from eaglespec.training.config import TrainConfig
from eaglespec.training.trainer import train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def folder(make_tiny_target):
    return make_tiny_target("tiny4-cuda", num_hidden_layers=4, hidden_size=64, intermediate_size=128)


def test_extract_train_and_draft_on_cuda_agree_with_the_cpu(folder, tmp_path):
    data = tmp_path / "count.jsonl"
    with open(data, "w") as f:
        for i in range(16):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Count from {i}."}, {
                "role": "assistant", "content": " ".join(str(n) for n in range(i, i + 20))}]}) + "\n")
    cpu, gpu = load_target(str(folder), "float32"), load_target(str(folder), "float32", "cuda")
    common = dict(model=str(folder), source=str(data), heldout_fraction=0.25, shard_size=8, aux_layers=(1, 2, 3))
    for split in ("train", "heldout"):
        extract(gpu, ExtractConfig(split=split, **common), tmp_path / f"gpu-{split}")
    extract(cpu, ExtractConfig(split="train", **common), tmp_path / "cpu-train")
    a, b = FeatureSet(tmp_path / "gpu-train")[0], FeatureSet(tmp_path / "cpu-train")[0]
    assert torch.equal(a["tokens"], b["tokens"]) and (a["features"].float() - b["features"].float()).abs().max() < 0.05
    for kind, loss in (("eagle1", "feature:1,ce:0.1"), ("eagle3", "ce")):
        runs = {}
        for device in ("cuda", "cpu"):
            config = TrainConfig(model=str(folder), train_dir=str(tmp_path / "gpu-train"), out=str(tmp_path / f"{kind}-{device}"),
                                 heldout_dir=str(tmp_path / "gpu-heldout"), epochs=1, lr=1e-3, warmup_steps=2,
                                 batch_conversations=4, draft_vocab=256, autocast=False, head_type=kind, loss=loss,
                                 unroll=2, aux_layers=(1, 2, 3) if kind == "eagle3" else (), device=device)
            runs[device] = train(config, log=lambda m: None)
        assert [h["loss"] for h in runs["cuda"].history] == pytest.approx([h["loss"] for h in runs["cpu"].history], rel=1e-3)
        head = load_head(str(tmp_path / f"{kind}-cuda" / "head"), gpu)
        assert head.weight_like.device.type == "cuda"
        vanilla = generate(gpu, "Count from 3.", chat=True, max_new_tokens=24)
        for tree in ("chain:3", "eagle1", "auto"):
            assert generate(gpu, "Count from 3.", chat=True, max_new_tokens=24, method=Eagle(head, tree)).token_ids == \
                vanilla.token_ids
