"""`eaglespec bench`: the datasets it reads, a small run of every kind of method through the CLI
(fp32, so greedy outputs must be identical), and bad input refused before any work."""

import json

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, LlamaConfig

from eaglespec.bench.datasets import load_items
from eaglespec.models.llamacpp import tau
from eaglespec.bench.run import markdown
from eaglespec.cli import main
from eaglespec.errors import InvalidArgumentError


def test_bundled_datasets():
    mt = load_items("mt-bench")
    assert len(mt) == 80 and all(len(item.turns) == 2 for item in mt)
    humaneval = load_items("humaneval")
    assert len(humaneval) == 164 and "def has_close_elements" in humaneval[0].turns[0]
    sharegpt = load_items("sharegpt", 5)
    assert len(sharegpt) == 5 and all(item.id.endswith("_0") for item in sharegpt)


def test_user_files(tmp_path):
    rows = [{"turns": ["Hi.", "And then?"]}, {"prompt": "Say yes."},
            {"question": "2 + 3?", "answer": "5"},  # GSM8K
            {"instruction": "Translate.", "input": "bonjour", "output": "hello"},  # Alpaca
            {"messages": [{"role": "user", "content": "Hey"}, {"role": "assistant", "content": "Hello"}]}]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    items = load_items(str(path))
    assert [i.turns for i in items] == [("Hi.", "And then?"), ("Say yes.",), ("2 + 3?",),
                                        ("Translate.\n\nbonjour",), ("Hey",)]
    array = tmp_path / "alpaca.json"
    array.write_text(json.dumps(rows[3:4]))
    assert load_items(str(array))[0].turns == ("Translate.\n\nbonjour",)
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"output": "x"}) + "\n")
    with pytest.raises(InvalidArgumentError, match="record 2 has no prompt"):
        load_items(str(path))
    with pytest.raises(InvalidArgumentError, match="unknown dataset"):
        load_items("gsm8k")


@pytest.fixture(scope="module")
def other_tokenizer_folder(tmp_path_factory, smollm2):
    """A tiny random Llama whose tokenizer has one token more than SmolLM2's."""
    folder = tmp_path_factory.mktemp("other-tokenizer")
    tokenizer = smollm2.tokenizer.__class__.from_pretrained(str(smollm2.folder))
    tokenizer.add_tokens(["<an extra token>"])
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow  # loads the bundled model
def test_bench_every_kind_of_method(tmp_path, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"turns": ["Name three colors.", "Now three more."]}\n{"prompt": "Say hello twice."}\n')
    out = tmp_path / "r.json"
    methods = "vanilla,eagle:chain:2,eagle:auto,pld:4,sps:2,hf,hf-assisted,hf-pld"
    result = CliRunner().invoke(main, [
        "bench", "--dataset", str(prompts), "--methods", methods, "--max-new-tokens", "12", "--dtype", "float32",
        "--draft-model", "smollm2-135m-instruct", "--out", str(out)])
    assert result.exit_code == 0, result.output
    r = json.loads(out.read_text())
    assert (r["items"], r["turns"]) == (2, 3) and list(r["methods"]) == methods.split(",")
    for spec, s in r["methods"].items():
        assert s["tokens_per_s"] > 0 and s["speedup"] > 0 and len(s["runs"]) == 3
        assert s["same_tokens_as_vanilla"] == 3, spec  # fp32 greedy: every method is exact
        assert (s["tau"] is None) == (spec in ("hf-assisted", "hf-pld"))
    assert r["methods"]["vanilla"]["speedup"] == 1.0 and r["methods"]["sps:2"]["tau"] > 1
    assert set(r["methods"]["eagle:chain:2"]["time_split"]) == {"prefill", "draft", "verify", "other"}
    assert len(r["methods"]["eagle:chain:2"]["n_alpha"]) == 2 and "acceptance_by_depth" in r["methods"]["eagle:auto"]
    assert "speedup_vs_hf" in r["methods"]["eagle:auto"] and r["best"]["eagle"] in ("eagle:chain:2", "eagle:auto")
    assert (tmp_path / "r-speedup.png").stat().st_size > 0 and (tmp_path / "r-tau.png").stat().st_size > 0
    from PIL import Image

    assert Image.open(tmp_path / "r-tau.png").mode == "P"  # plots are saved in 256 colours (save_figure)
    assert markdown(r) in result.output


@pytest.mark.slow  # loads the bundled model
def test_bench_in_batches(tmp_path, monkeypatch):
    """Three items in batches of 2 (the second batch one item): the batches' turns in step, each
    row's tokens those of the same item decoded alone (fp32)."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"turns": ["Name three colors.", "Now three more."]}\n{"prompt": "Say hello twice."}\n'
                       '{"prompt": "Count to five."}\n')
    runs = {}
    for B in (1, 2):
        out = tmp_path / f"b{B}.json"
        result = CliRunner().invoke(main, [
            "bench", "--dataset", str(prompts), "--methods", "vanilla,eagle:chain:2,pld:4", "--max-new-tokens", "12",
            "--dtype", "float32", "--batch-size", str(B), "--out", str(out)])
        assert result.exit_code == 0, result.output
        r = json.loads(out.read_text())
        assert (r["items"], r["turns"], r["config"]["batch_size"]) == (3, 4, B)
        for spec, s in r["methods"].items():
            assert s["throughput_tokens_per_s"] > 0 and 0 < s["ms_per_token_p50"] <= s["ms_per_token_p95"]
            assert s["same_tokens_as_vanilla"] == 4, spec
        runs[B] = {spec: [(run["item"], run["turn"], run["token_ids"]) for run in s["runs"]]
                   for spec, s in r["methods"].items()}
    assert runs[1] == runs[2]
    assert "throughput tokens/s" in result.output and "batches of 2" in result.output


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--batch-size", "2", "--methods", "vanilla,hf"], "hf decode one prompt at a time here"),
    (["--dataset", "gsm8k"], "unknown dataset"),
    (["--methods", "vanilla,jacobi"], "unknown method 'jacobi'"),
    pytest.param(["--methods", "medusa", "--medusa-head", "/nonexistent-medusa-head"], "no head at '/nonexistent-medusa-head'",
                 marks=pytest.mark.slow),  # refused once the target is loaded
    (["--methods", "sps:3"], "needs a draft model"),
    (["--methods", "hf-assisted"], "needs a draft model"),
    (["--methods", "llama.cpp-draft"], "needs a draft model"),
    (["--methods", "pld,pld"], "listed twice"),
    (["--out", "r.txt"], "must end in .json"),
    (["--temperature", "-1"], "temperature"),
])
def test_bad_input_fails_before_any_work(tmp_path, args, message):
    base = {"--dataset": "mt-bench", "--methods": "vanilla", "--out": str(tmp_path / "r.json")}
    base.update(dict(zip(args[::2], args[1::2])))
    result = CliRunner().invoke(main, ["bench", *sum(base.items(), ())])
    assert result.exit_code == 1 and message in result.output
    assert not list(tmp_path.iterdir())


def test_an_unbuilt_llama_cpp_peer_is_a_one_line_error_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(main, ["bench", "--methods", "vanilla,llama.cpp-ngram",
                                       "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 1 and "run `bash scripts/setup_llamacpp.sh`" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_llama_cpp_tau_counts_one_forward_per_token_not_accepted():
    assert tau(10, {}) == 1.0 and tau(10, {"draft_n": 12, "draft_n_accepted": 6}) == 2.5


def test_a_draft_model_with_another_tokenizer_is_refused(tmp_path, other_tokenizer_folder):
    result = CliRunner().invoke(main, ["bench", "--model", str(other_tokenizer_folder), "--methods", "sps",
                                       "--draft-model", "smollm2-135m-instruct", "--head", "default",
                                       "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 1 and "another tokenizer" in result.output
    assert not list(tmp_path.iterdir())
