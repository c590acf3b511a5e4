"""A new drafter is one file: this one is defined here alone, and registering it is all it takes
to find it in the CLI's help, in `eaglespec bench`, in the server's `/v1/models` and in
generation, where greedy output equals vanilla's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from eaglespec.cli import main
from eaglespec.decoding.drafters import DRAFTERS, Method, register, unregister
from eaglespec.decoding.drafters.registry import count_option
from eaglespec.decoding.model import Model
from eaglespec.decoding.proposer import Proposer
from eaglespec.decoding.sizing import ALONE, Budget
from eaglespec.decoding.tree import DraftTree, parse_tree
from eaglespec.models.load import load_target
from eaglespec.serve.app import Settings, create_app


class RepeatProposer(Proposer):
    """Drafts the text's last K tokens again, as a chain: a drafter with no model at all."""

    def __init__(self, k: int):
        self.k, self.shape, self.history = k, parse_tree(f"chain:{k}"), []

    def start(self, prompt_ids, features):
        self.history = list(prompt_ids)

    def draft(self, max_depth: int, budget: Budget = ALONE) -> DraftTree:
        return DraftTree.chain(self.history[-self.k:][:max(max_depth, 0)])

    def accept(self, tokens, features):
        self.history += tokens


@dataclass(frozen=True)
class Repeat(Method):
    k: int = 2
    name: ClassVar[str] = "repeat"
    syntax: ClassVar[str] = "repeat[:K]"
    summary: ClassVar[str] = "the text's last K tokens again (a test's toy)"

    @staticmethod
    def options(arg: str) -> dict:
        return {"k": count_option("repeat", arg)} if arg else {}

    def bind(self, target, params):
        return lambda draws, capacity: RepeatProposer(self.k)


@pytest.fixture
def repeat():
    register(Repeat)
    yield
    unregister("repeat")
    assert "repeat" not in DRAFTERS


@pytest.fixture(scope="module")
def tiny(tiny_target_folder):
    return load_target(str(tiny_target_folder), "float32")


@pytest.mark.parametrize("command", ["generate", "bench", "serve", "regenerate"])
def test_the_cli_help_lists_it(repeat, command):
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=400)
    assert result.exit_code == 0 and "repeat[:K]" in result.output


def test_it_generates_vanilla_tokens(repeat, tiny):
    model = Model(tiny, None)
    assert "repeat" in model.available_methods()
    vanilla = model.generate("one two three one two three", method="vanilla", max_new_tokens=40, ignore_eos=True)
    out = model.generate("one two three one two three", method="repeat:3", max_new_tokens=40, ignore_eos=True)
    assert out.token_ids == vanilla.token_ids and out.target_forwards <= vanilla.target_forwards
    assert out.tree == "chain:3"


def test_bench_runs_it(repeat, tiny_target_folder, tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--model", str(tiny_target_folder), "--dtype", "float32", "--limit", "2",
                                       "--methods", "vanilla,repeat:2", "--max-new-tokens", "16", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())["methods"]["repeat:2"]
    assert summary["same_tokens_as_vanilla"] == len(summary["runs"]) == 4  # two items of two turns
    assert summary["tree"] == "chain:2"


def test_the_server_lists_and_runs_it(repeat, tiny):
    app = create_app(Model(tiny, None), Settings(method="vanilla", cache_tokens=1024))
    with TestClient(app) as client:
        models = client.get("/v1/models").json()["data"]
        assert "repeat" in models[0]["methods"]
        answers = [client.post("/v1/completions", json={"model": tiny.name, "prompt": "one two one two",
                                                        "max_tokens": 12, "temperature": 0, "method": method}).json()
                   for method in ("vanilla", "repeat:2")]
    assert answers[0]["choices"][0]["text"] == answers[1]["choices"][0]["text"]
    assert answers[1]["eaglespec"]["method"] == "repeat:2"
