"""EAGLE-3 heads of Qwen3 and Llama-3 targets in the layout the field writes them in (SpecForge's,
which vLLM and SGLang load: `LlamaForCausalLMEagle3`, `midlayer.*`, `d2t` as offsets, `t2d`, the
target layers under `eagle_config` or at the top): such a head loads with its tensors intact, drafts
vanilla's tokens, and exports to the vLLM, SGLang, speculators and llama.cpp (GGUF) layouts, which
read back to the same head; a Llama-3 target's scaled RoPE travels in the exported config. In llama.cpp's layout
(`-m llamacpp`, which needs llama.cpp's programs: scripts/test-interop.sh builds them) the head
drafts in llama-server beside the target's GGUF, and llama.cpp's tokens are ours."""

import json
from dataclasses import replace

import pytest
import torch
from conftest import CONFIGS, random_model, save_sentencepiece, tiny_target
from safetensors.torch import save_file

from eaglespec.decoding.drafters.eagle import Eagle
from eaglespec.decoding.generate import generate
from eaglespec.heads.checkpoint import load_head
from eaglespec.heads.export import LLAMA_CPP_FILE, export_head
from eaglespec.models.llamacpp import LlamaServer, convert_hf
from eaglespec.models.load import load_target

DRAFT = 40  # draft vocabulary


def specforge_head(target, folder, aux_at_top: bool) -> dict[str, torch.Tensor]:
    """A random EAGLE-3 head for `target` written as SpecForge writes one; returns its tensors."""
    c = target.model.config
    h, q, kv, inter = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    g = torch.Generator().manual_seed(0)

    def random(*shape, mean=0.0):
        return (mean + 0.05 * torch.randn(*shape, generator=g)).to(torch.bfloat16)

    vocab = torch.randperm(c.vocab_size, generator=g)[:DRAFT].sort().values
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[vocab] = True
    m = "midlayer."
    tensors = {"fc.weight": random(h, 3 * h), "norm.weight": random(h, mean=1.0), "lm_head.weight": random(DRAFT, h),
               m + "input_layernorm.weight": random(h, mean=1.0), m + "hidden_norm.weight": random(h, mean=1.0),
               m + "post_attention_layernorm.weight": random(h, mean=1.0),
               m + "self_attn.q_proj.weight": random(q, 2 * h), m + "self_attn.k_proj.weight": random(kv, 2 * h),
               m + "self_attn.v_proj.weight": random(kv, 2 * h), m + "self_attn.o_proj.weight": random(h, q),
               m + "mlp.gate_proj.weight": random(inter, h), m + "mlp.up_proj.weight": random(inter, h),
               m + "mlp.down_proj.weight": random(h, inter),
               "d2t": vocab - torch.arange(DRAFT), "t2d": t2d}
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
              "intermediate_size": inter, "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
              "head_dim": c.head_dim, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "hidden_act": "silu",
              "rope_theta": c.rope_theta, "max_position_embeddings": c.max_position_embeddings,
              "vocab_size": c.vocab_size, "draft_vocab_size": DRAFT, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16"}
    if c.rope_scaling:
        config["rope_scaling"] = dict(c.rope_scaling)
    aux = [0, 1, c.num_layers - 1]
    config |= {"eagle_aux_hidden_state_layer_ids": aux} if aux_at_top else {"eagle_config": {"eagle_aux_hidden_state_layer_ids": aux}}
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return tensors


def head_tensors(head) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in head.state_dict().items()}


@pytest.mark.parametrize("family", ["qwen3", "llama3-rope"])
def test_specforge_eagle3_heads_load_draft_and_export(family, tmp_path, sentencepiece_model):
    hf, target = tiny_target(family)
    hf.config.save_pretrained(tmp_path / "target")  # the verifier's config, which speculators names
    save_sentencepiece(sentencepiece_model, tmp_path / "target")  # llama.cpp's converter writes its vocabulary
    target = replace(target, folder=tmp_path / "target")
    written = specforge_head(target, tmp_path / "specforge", aux_at_top=family == "qwen3")
    head = load_head(str(tmp_path / "specforge"), target)
    assert head.reads == (0, 1, 2)
    assert torch.equal(head.fc.weight, written["fc.weight"].float())
    assert torch.equal(head.layers[0].attn.o.weight, written["midlayer.self_attn.o_proj.weight"].float())
    assert torch.equal(head.to_target(torch.arange(DRAFT)), written["d2t"] + torch.arange(DRAFT))
    prompts = [[5, 17, 33, 5, 17, 33, 5, 17], [60, 2, 91, 44, 8]]
    method = Eagle(head, "chain:3")
    assert [generate(target, p, max_new_tokens=24, method=method).token_ids for p in prompts] == \
        [generate(target, p, max_new_tokens=24).token_ids for p in prompts]
    for fmt in ("vllm", "sglang", "speculators", "llama.cpp"):
        out = tmp_path / fmt
        export_head(str(tmp_path / "specforge"), target, fmt, out)
        back = load_head(str(out), target)
        assert head_tensors(back).keys() == head_tensors(head).keys()
        assert all(torch.equal(a, head_tensors(head)[k]) for k, a in head_tensors(back).items()), fmt
        assert torch.equal(back.to_target(torch.arange(DRAFT)), head.to_target(torch.arange(DRAFT)))
        assert back.reads == head.reads
        if fmt == "llama.cpp":  # its metadata is llama.cpp's, not a config.json; its matrices bf16 unless asked f32
            export_head(str(tmp_path / "specforge"), target, fmt, tmp_path / "f32", gguf_dtype="float32")
            assert gguf_types(out) == {"BF16", "F32"} and gguf_types(tmp_path / "f32") == {"F32"}
            assert all(torch.equal(a, head_tensors(head)[k]) for k, a in head_tensors(load_head(str(tmp_path / "f32"),
                                                                                             target)).items())
            continue
        config = json.loads((out / "config.json").read_text())
        layer = config.get("transformer_layer_config", config)  # speculators nests the layer's config
        assert layer["rope_parameters"]["rope_theta"] == target.model.config.rope_theta
        if family == "llama3-rope":
            assert layer["rope_parameters"]["rope_type"] == layer["rope_scaling"]["rope_type"] == "llama3"
            assert layer["rope_scaling"]["original_max_position_embeddings"] == 32


def gguf_types(folder) -> set[str]:
    """The types of the head GGUF's float tensors (its d2t table is I64)."""
    from gguf import GGUFReader

    return {t.tensor_type.name for t in GGUFReader(folder / LLAMA_CPP_FILE).tensors} - {"I64"}


def clear_prompts(hf, n: int, length: int, margin: float = 1e-3) -> list[list[int]]:
    """`n` random prompts whose greedy continuations (`length` tokens) never pass a near-tie (top two
    logits within `margin`), where llama.cpp's f32 sums, in another order than torch's, may round
    the other way (a random tiny model has such ties: 4e-5 apart after 11 tokens, seen)."""
    g = torch.Generator().manual_seed(0)
    found = []
    for _ in range(50):
        prompt = torch.randint(3, hf.config.vocab_size, (1, 8), generator=g)
        with torch.no_grad():
            out = hf.generate(prompt, max_new_tokens=length, do_sample=False, output_logits=True,
                              return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
        top = torch.cat(out.logits).topk(2).values
        if (top[:, 0] - top[:, 1]).min() > margin:
            found.append(prompt[0].tolist())
        if len(found) == n:
            return found
    raise AssertionError("no prompts without near-ties")


@pytest.mark.llamacpp
@pytest.mark.parametrize("family", ["qwen3", "llama3-rope"])
def test_specforge_eagle3_heads_draft_in_llama_cpp(family, sentencepiece_model, tmp_path):
    """The SpecForge head exported `--format llama.cpp` (llama.cpp's converter on the vLLM layout)
    drafts in llama-server (`draft-eagle3`, a chain of 3; the head's GGUF f32 too) beside the target's
    GGUF (llama.cpp's converter too, f32); llama.cpp's tokens with it, its tokens without it, ours without and ours with
    the same head are one sequence, and llama.cpp accepts as many of the head's drafts as we do: the
    converted head computes what ours does (the random head's drafts are seldom right, but some are).
    The prompts avoid near-ties, where llama.cpp's f32 sums may round the other way."""
    hf = random_model(CONFIGS[family])
    with torch.no_grad():  # EOS (2) never the greedy choice: the answers run their 24 tokens
        hf.lm_head.weight[2] = 0
    hf.save_pretrained(tmp_path / "target")
    save_sentencepiece(sentencepiece_model, tmp_path / "target")
    convert_hf(tmp_path / "target", tmp_path / "target.gguf")
    target = load_target(str(tmp_path / "target"), dtype=torch.float32)
    specforge_head(target, tmp_path / "specforge", aux_at_top=family == "qwen3")
    export_head(str(tmp_path / "specforge"), target, "llama.cpp", tmp_path / "llama.cpp", gguf_dtype="float32")
    prompts = clear_prompts(hf, 2, 24)
    ours = [generate(target, p, max_new_tokens=24).token_ids for p in prompts]
    assert [len(tokens) for tokens in ours] == [24, 24]
    method = Eagle(load_head(str(tmp_path / "specforge"), target), "chain:3")
    drafted = [generate(target, p, max_new_tokens=24, method=method) for p in prompts]
    assert [out.token_ids for out in drafted] == ours
    chain = ("--spec-draft-n-max", "3", "--spec-draft-n-min", "0", "--spec-draft-p-min", "0")
    for method, head in (("llama.cpp", None), ("llama.cpp-eagle3", tmp_path / "llama.cpp" / LLAMA_CPP_FILE)):
        server = LlamaServer(method, tmp_path / "target.gguf", 2, head, context=128, extra=chain if head else ())
        try:
            answers = [server.complete(p, 24, 0.0, 0) for p in prompts]
        finally:
            server.stop()
        assert [a["token_ids"] for a in answers] == ours, method
        if head:  # it drafted, and accepted as many of the head's drafts as we do (8 of llama3-rope's, 0 of qwen3's)
            assert all(a["timings"].get("draft_n", 0) > 0 for a in answers)
            assert [a["timings"]["draft_n_accepted"] for a in answers] == [o.new_tokens - o.target_forwards for o in drafted]
