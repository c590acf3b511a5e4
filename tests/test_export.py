"""`eaglespec export`: heads in the engines' layouts. Every export is imported back and must give
the head's own draft logits bit for bit (vLLM's fold of the fc bias included); what a format
cannot carry, a foreign file with missing, extra or misshaped tensors, and an occupied output
folder are refused with one line."""

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen2Config

from eaglespec.cli import main
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.checkpoint import HeadMismatchError, load_head, save_head
from eaglespec.heads.export import export_head
from eaglespec.heads.head import Eagle3Head, EagleHead, MedusaHead
from eaglespec.models.load import load_target
from eaglespec.training.evaluate import chain_predictions

AUX = (1, 2, 3)


@pytest.fixture(scope="module")
def targets(make_tiny_target, tmp_path_factory, smollm2):
    """Tiny random 4-layer targets of the two layer layouts: Llama (no attention biases) and Qwen2."""
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(Qwen2Config(
        vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, eos_token_id=2, bos_token_id=1,
        tie_word_embeddings=False)).save_pretrained(folder)
    smollm2.tokenizer.save_pretrained(folder)
    return {"llama": load_target(str(make_tiny_target("tiny4-export", num_hidden_layers=4)), "float32"),
            "qwen2": load_target(str(folder), "float32")}


def saved_head(target, kind, folder):
    """A random head (every tensor, biases included, nonzero) over a 512-token draft vocabulary, saved."""
    torch.manual_seed(2)
    c = target.model.config
    head = {"eagle1": lambda: EagleHead(c), "eagle3": lambda: Eagle3Head(c, AUX, 512), "medusa": lambda: MedusaHead(c)}[kind]()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
    vocab = torch.randperm(c.vocab_size)[:512].sort().values
    save_head(head.attach(target.model, vocab), folder, target.name)
    return load_head(str(folder), target)


def draft_outputs(head, target):
    """Per chain step, the predicted hidden states and the draft logits over the head's vocabulary."""
    torch.manual_seed(3)
    h = target.model.config.hidden_size
    sample = {"tokens": torch.randint(0, target.model.config.vocab_size, (12,)), "features": torch.randn(12, h),
              "aux_features": torch.randn(12, 3 * h)}
    steps = chain_predictions(head, sample, depth=3 if isinstance(head, MedusaHead) else 2, dtype=torch.float32)
    return steps, [head.logits(step) for step in steps]


CASES = [("llama", "eagle1", "official"), ("llama", "eagle1", "vllm"), ("llama", "eagle1", "sglang"),
         ("qwen2", "eagle1", "vllm"), ("qwen2", "eagle1", "sglang"),
         ("llama", "eagle3", "vllm"), ("qwen2", "eagle3", "sglang"), ("llama", "eagle3", "speculators"),
         ("llama", "medusa", "vllm")]


@pytest.mark.parametrize("family,kind,fmt", CASES, ids=["-".join(c) for c in CASES])
def test_an_export_imports_back_to_the_same_draft_logits(targets, tmp_path, family, kind, fmt):
    target = targets[family]
    head = saved_head(target, kind, tmp_path / "ours")
    lines = export_head(str(tmp_path / "ours"), target, fmt, tmp_path / "out")
    assert "serve:" in lines[-1]
    back = load_head(str(tmp_path / "out"), target)
    assert type(back) is type(head)
    (states, logits), (their_states, their_logits) = draft_outputs(head, target), draft_outputs(back, target)
    for mine, theirs in zip(states, their_states, strict=True):
        assert torch.equal(mine, theirs)
    if back.vocab_size == head.vocab_size:  # (formats without a reduced draft vocabulary draft over all of it)
        for mine, theirs in zip(logits, their_logits, strict=True):
            assert torch.equal(mine, theirs)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    if fmt == "official":  # the release's file, with the target's embedding, and its bias flag
        state = torch.load(tmp_path / "out" / "pytorch_model.bin", weights_only=True)
        assert torch.equal(state["embed_tokens.weight"], target.model.embed.weight.to(torch.bfloat16))
        assert config["bias"] is True and "fc.bias" in state and "layers.0.input_layernorm.weight" not in state
        return
    names = set(safe_open(str(tmp_path / "out" / "model.safetensors"), "pt").keys())
    if fmt == "vllm" and kind == "eagle1":  # no fc bias: folded into the biases vLLM's layer has
        assert "fc.bias" not in names and "layers.0.self_attn.o_proj.bias" in names
        assert config["attention_bias"] and config["qkv_bias"] and config["model_type"] == "llama"
        assert back.draft_vocab is None  # vLLM's EAGLE-1 drafts over the whole vocabulary
    if fmt == "sglang" and kind == "eagle1":  # fc keeps its bias; the draft vocabulary is a token map
        assert "fc.bias" in names and "bias" not in config
        assert config["architectures"] == [{"llama": "LlamaForCausalLMEagle", "qwen2": "Qwen2ForCausalLMEagle"}[family]]
        assert torch.equal(torch.load(tmp_path / "out" / "token_map.pt"), head.draft_vocab)
        assert torch.equal(back.draft_vocab, head.draft_vocab)
    if kind == "medusa":  # vLLM's MedusaModel: the target's LM head for all heads, zeroed outside the draft vocabulary
        assert config["model_type"] == "medusa" and config["original_lm_head"] and config["medusa_fc_bias"]
        assert not [k for k in config if "num" in k and k != "medusa_num_heads" and "heads" in k]  # (read as the count)
        assert names == {f"blocks.{k}.layers.0.{p}" for k in range(4) for p in ("weight", "bias")} | {"lm_head.weight"}
        tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
        kept = tensors["lm_head.weight"].any(1).nonzero().flatten()
        assert torch.equal(kept, head.draft_vocab) and torch.equal(back.draft_vocab, head.draft_vocab)
        tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1  # an LM head of its own is refused
        save_file(tensors, str(tmp_path / "out" / "model.safetensors"))
        with pytest.raises(HeadMismatchError, match="an LM head of its own"):
            load_head(str(tmp_path / "out"), target)
        # vLLM's own form of a reduced vocabulary: the whole LM head and a token map
        tensors |= {"lm_head.weight": target.model.lm_head.weight.detach().to(tensors["lm_head.weight"].dtype),
                    "token_map": head.draft_vocab}
        save_file(tensors, str(tmp_path / "out" / "model.safetensors"))
        assert torch.equal(load_head(str(tmp_path / "out"), target).draft_vocab, head.draft_vocab)
    if kind == "eagle3":
        aux = config["transformer_layer_config"] if fmt == "speculators" else config["eagle_config"]
        assert aux["eagle_aux_hidden_state_layer_ids"] == list(AUX)
        assert {"midlayer.hidden_norm.weight", "d2t", "t2d", "lm_head.weight"} <= names


def test_what_a_format_cannot_carry_is_refused(targets, tmp_path, random_medusa, smollm2):
    llama, qwen2 = targets["llama"], targets["qwen2"]
    saved_head(llama, "eagle1", tmp_path / "l1")
    saved_head(qwen2, "eagle1", tmp_path / "q1")
    saved_head(llama, "eagle3", tmp_path / "l3")
    saved_head(qwen2, "eagle3", tmp_path / "q3")
    save_head(random_medusa, tmp_path / "medusa", smollm2.name)
    for spec, target, fmt, message in [
        ("l1", llama, "speculators", "use --format official or vllm or sglang"),
        ("l3", llama, "official", "use --format vllm or sglang or speculators"),
        ("q1", qwen2, "official", "this qwen2 head has them: use --format sglang or vllm"),
        ("medusa", smollm2, "sglang", "the sglang format cannot carry medusa heads: use --format vllm"),
        ("l1", llama, "tensorrt", "unknown export format 'tensorrt'"),
        # llama.cpp drafts with EAGLE-3 heads alone, on targets whose graph gives the layers' inputs
        ("l1", llama, "llama.cpp", "EAGLE-3 heads only and this head is eagle1"),
        ("q3", qwen2, "llama.cpp", "qwen2 graph does not hand a draft its layers' inputs"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            export_head(str(tmp_path / spec), target, fmt, tmp_path / f"out-{spec}-{fmt}")
        assert not (tmp_path / f"out-{spec}-{fmt}").exists()
    # an occupied folder is kept unless --force
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(InvalidArgumentError, match="not empty"):
        export_head(str(tmp_path / "l1"), llama, "vllm", tmp_path / "busy")
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    export_head(str(tmp_path / "l1"), llama, "vllm", tmp_path / "busy", force=True)
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["config.json", "model.safetensors"]


def test_an_import_names_missing_extra_and_misshaped_tensors(targets, tmp_path):
    llama = targets["llama"]
    saved_head(llama, "eagle1", tmp_path / "ours")
    export_head(str(tmp_path / "ours"), llama, "sglang", tmp_path / "theirs")
    tensors = load_file(str(tmp_path / "theirs" / "model.safetensors"))
    for change, message in [
        (lambda t: t.pop("layers.0.mlp.up_proj.weight"), "missing"),
        (lambda t: t.update({"layers.0.self_attn.rotary.inv_freq": torch.ones(4)}), "layers.0.self_attn.rotary.inv_freq"),
        (lambda t: t.update({"layers.0.mlp.down_proj.weight": torch.zeros(32, 65)}), "size mismatch"),
    ]:
        changed = dict(tensors)
        change(changed)
        save_file(changed, str(tmp_path / "theirs" / "model.safetensors"))
        with pytest.raises(HeadMismatchError, match=message):
            load_head(str(tmp_path / "theirs"), llama)


@pytest.mark.slow  # loads the bundled model
def test_the_export_command(tmp_path):
    out = tmp_path / "sglang-head"
    result = CliRunner().invoke(main, ["export", "--format", "nope", "--out", str(out)])
    assert result.exit_code == 1 and "unknown export format 'nope'" in result.output and not out.exists()
    result = CliRunner().invoke(main, ["export", "--format", "sglang", "--dtype", "float32", "--out", str(out)])
    assert result.exit_code == 1 and "--dtype sets llama.cpp's GGUF" in result.output and not out.exists()
    result = CliRunner().invoke(main, ["export", "--format", "sglang", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "--speculative-algorithm EAGLE" in result.output and "--speculative-token-map" in result.output
    assert (out / "token_map.pt").is_file()
    result = CliRunner().invoke(main, ["export", "--format", "sglang", "--out", str(out)])
    assert result.exit_code == 1 and "not empty" in result.output
    # the shipped Medusa head goes to vLLM alone
    medusa = tmp_path / "medusa-head"
    result = CliRunner().invoke(main, ["export", "--medusa-head", "default", "--format", "vllm", "--out", str(medusa)])
    assert result.exit_code == 0, result.output
    assert '"method": "medusa"' in result.output and json.loads((medusa / "config.json").read_text())["model_type"] == "medusa"
    for args, message in [(["--format", "sglang"], "use --format vllm"), (["--format", "vllm", "--head", "x"], "not both")]:
        result = CliRunner().invoke(main, ["export", "--medusa-head", "default", *args, "--out", str(tmp_path / "no")])
        assert result.exit_code == 1 and message in result.output and not (tmp_path / "no").exists()
