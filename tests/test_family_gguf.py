"""GGUF files of every family, as llama.cpp's own converter writes them (`convert_hf_to_gguf.py`, from
the source that `bash scripts/setup_llamacpp.sh --source` fetches; scripts/test.sh does): a tiny random
model of each family of `conftest.CONFIGS`, saved by transformers and converted to an f32 GGUF, loads
through `eaglespec` (transformers' GGUF reader and `gguf_extras`) with transformers' logits within 1e-4.

A GGUF file stores less than a config.json, and its model is the one llama.cpp runs from it, so the
tiny models leave out what the format does not carry (`GGUF_ONLY`): a `llama` file (Mistral's) has no
sliding window, llama.cpp runs Phi-3 without its window and Qwen2-MoE without dense layers, and it
gives Gemma-3 its attention scale (1 / sqrt(head size)) and its layer pattern (every 6th layer global).

Tokenizers: llama.cpp's converter writes a tiny sentencepiece model (trained here, as large as the
tiny vocabulary) for every family but the Qwen MoEs, whose converter takes byte-level BPE tokenizers
it recognizes only: those take SmolLM2's (a bundled model's, so they are in the slow tier)."""

import pytest
import torch
from conftest import CONFIGS, TINY, random_model, save_sentencepiece

from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.checkpoint import save_head
from eaglespec.heads.export import export_head
from eaglespec.heads.head import Eagle3Head
from eaglespec.models.llamacpp import convert_hf, source
from eaglespec.models.load import load_target

GGUF_ONLY = {"mistral": {"sliding_window": None}, "phi3": {"sliding_window": None},
             "qwen2_moe": {"mlp_only_layers": []},
             "gemma3_text": {"query_pre_attn_scalar": 32, "num_hidden_layers": 6, "layer_types": None}}
BPE_ONLY = ["qwen2_moe", "qwen3_moe"]
SENTENCEPIECE = [family for family in CONFIGS if family not in BPE_ONLY]


def check_gguf(family: str, folder, save_tokenizer, monkeypatch, **config):
    base = CONFIGS[family]
    hf = random_model(type(base)(**(base.to_dict() | GGUF_ONLY.get(family, {}) | config)))
    hf.save_pretrained(folder / "hf")
    save_tokenizer(folder / "hf")
    convert_hf(folder / "hf", folder / "model.gguf")
    monkeypatch.setenv("EAGLESPEC_CACHE", str(folder / "cache"))  # converted here, not found from an earlier run
    target = load_target(str(folder / "model.gguf"), dtype=torch.float32)
    tokens = torch.randint(0, hf.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        logits, _ = target.model(tokens, target.model.new_cache(40))
        assert (logits - hf(tokens).logits).abs().max() < 1e-4
    return target


@pytest.mark.parametrize("family", SENTENCEPIECE)
def test_a_gguf_of_each_family_loads_with_transformers_logits(family, sentencepiece_model, tmp_path, monkeypatch):
    target = check_gguf(family, tmp_path, lambda folder: save_sentencepiece(sentencepiece_model, folder), monkeypatch)
    if family == "llama3-rope":  # its RoPE is llama.cpp's per-frequency factors, which engines do not read
        assert dict(target.model.config.rope_scaling)["rope_type"] == "freq_factors"
        head = Eagle3Head(target.model.config.for_head(), (0, 1, 2), TINY["vocab_size"])
        save_head(head.attach(target.model, torch.arange(TINY["vocab_size"])), tmp_path / "head", target.name)
        with pytest.raises(InvalidArgumentError, match="export with the target's Hugging Face folder"):
            export_head(str(tmp_path / "head"), target, "vllm", tmp_path / "out")


@pytest.mark.parametrize("family", BPE_ONLY)
def test_a_gguf_of_the_qwen_moes_loads_with_transformers_logits(family, smollm2, tmp_path, monkeypatch):
    source()
    check_gguf(family, tmp_path, smollm2.tokenizer.save_pretrained, monkeypatch, vocab_size=len(smollm2.tokenizer))
