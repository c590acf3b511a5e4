"""`eaglespec distill` (DistillSpec): a draft model trained toward the target with the forward KL,
as a LoRA adapter or all its weights, resumable, loaded wherever a draft model is."""

import json

import pytest
import torch

from eaglespec.errors import InvalidArgumentError
from eaglespec.models.load import load_target
from eaglespec.training.distill import DistillConfig, distill, forward_kl


@pytest.fixture(scope="module")
def pair(make_tiny_target, tmp_path_factory):
    """(teacher folder, student folder, conversations file): tiny random Llamas of one tokenizer."""
    teacher = make_tiny_target("distill-teacher", hidden_size=64, intermediate_size=128, num_attention_heads=4)
    student = make_tiny_target("distill-student", num_hidden_layers=1)
    data = tmp_path_factory.mktemp("distill-data") / "conversations.jsonl"
    words = ["river", "stone", "light", "north", "green", "quiet", "seven", "field"]
    with open(data, "w") as f:
        for i in range(300):  # about 6 held out (2%)
            answer = " ".join(words[(i * k) % 8] for k in range(1, 9))
            f.write(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Say {words[i % 8]}."},
                                                            {"role": "assistant", "content": answer}]}) + "\n")
    return teacher, student, data


def logits(target, ids):
    return target.model(torch.tensor([ids]), target.model.new_cache(len(ids)))[0][0].float()


def test_forward_kl_is_zero_for_equal_distributions_and_positive_otherwise():
    a = torch.randn(5, 11)
    assert forward_kl(a, a).abs().max() < 1e-6 and (forward_kl(a, a.flip(-1)) > 0).all()


def test_a_lora_draft_moves_toward_the_target_resumes_and_loads_as_a_draft_model(pair, tmp_path):
    teacher, student, data = pair
    config = DistillConfig(str(teacher), str(student), str(tmp_path / "run"), str(data), lora_rank=4, lr=3e-3,
                           warmup_steps=2, batch=2, total_minutes=10, budget_minutes=0.05, checkpoint_every=2)
    first = distill(config, log=lambda *_: None)
    scores = first.scores[-1]
    assert first.step >= 2 and scores["after"]["kl"] < scores["before"]["kl"]
    # a second run continues the first: its steps, its losses, its scores
    again = distill(config, log=lambda *_: None)
    assert again.step > first.step and len(again.scores) == 2 and again.losses[:first.step] == first.losses
    # the draft: an adapter over its base, merged at load (the distilled weights, not the base's)
    draft = tmp_path / "run" / "draft"
    adapter = json.loads((draft / "adapter_config.json").read_text())
    assert adapter["base"] == str(student) and adapter["rank"] == 4 and len(adapter["modules"]) == 7
    ids = [1, 5, 9, 200, 7, 3000, 11]
    merged, base = load_target(str(draft), "float32"), load_target(str(student), "float32")
    assert (logits(merged, ids) - logits(base, ids)).abs().max() > 1e-3
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from eaglespec.models.adapter import merge_adapter

    hf = AutoModelForCausalLM.from_pretrained(str(student), dtype=torch.float32).eval()
    hf.load_state_dict(merge_adapter(load_file(str(student / "model.safetensors")), draft))
    with torch.no_grad():
        assert (hf(torch.tensor([ids])).logits[0] - logits(merged, ids)).abs().max() < 1e-4
    # another setting is another run
    with pytest.raises(InvalidArgumentError, match="other settings"):
        distill(DistillConfig(**{**config.__dict__, "lr": 1e-3}), log=lambda *_: None)


def test_rank_0_distils_every_weight_into_a_model_folder(pair, tmp_path):
    teacher, student, data = pair
    distill(DistillConfig(str(teacher), str(student), str(tmp_path / "full"), str(data), lora_rank=0, lr=1e-3,
                          batch=1, budget_minutes=0.02), log=lambda *_: None)
    draft = load_target(str(tmp_path / "full" / "draft"), "float32")
    assert draft.model.config.num_layers == 1


def test_a_draft_of_another_vocabulary_is_refused(make_tiny_target, pair, tmp_path):
    teacher, _, data = pair
    other = make_tiny_target("distill-other-vocab", vocab_size=50000)
    with pytest.raises(InvalidArgumentError, match="vocabulary"):
        distill(DistillConfig(str(teacher), str(other), str(tmp_path / "x"), str(data)), log=lambda *_: None)
