"""Benchmark suites (`eaglespec suite`): runs declared in a TOML file, resumable, then the table."""

import json
import re

import pytest
from click.testing import CliRunner

from eaglespec.bench.suite import Suite, _available
from eaglespec.cli import main
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads import checkpoint


def suite_file(tmp_path, text: str):
    """A suite file in a repository of its own: benchmarks/suites/ and benchmarks/experiments/."""
    path = tmp_path / "benchmarks" / "suites" / "toy.toml"
    path.parent.mkdir(parents=True)
    (tmp_path / "benchmarks" / "experiments").mkdir()
    (tmp_path / "benchmarks" / "experiments" / "count.py").write_text(
        "import json, sys\njson.dump({'args': sys.argv[1:]}, open(sys.argv[1], 'w'))\n")
    path.write_text(text)
    return path


def test_a_suite_runs_what_is_missing_then_makes_its_table(tmp_path, tiny_target_folder):
    out = tmp_path / "results"
    path = suite_file(tmp_path, f"""
title = "toy"
out = "{out}"
report = "bench"
[bench]
limit = 1
max_new_tokens = 4
threads = 1
[[runs]]
model = "{tiny_target_folder}"
name = "tiny-{{dataset}}-t{{temperature}}"
dataset = "mt-bench"
temperature = [0, 1]
methods = "vanilla,pld,eagle"
[[runs]]
script = "count.py"
args = ["{out}/counted.json", "x"]
creates = "counted.json"
""")
    suite = Suite.read(path)
    assert [r.creates for r in suite.runs] == ["tiny-mt-bench-t0.json", "tiny-mt-bench-t1.json", "counted.json"]
    # the tiny target has no shipped head: eagle is left out of its runs, and said so
    assert all("without eagle" in r.note for r in suite.runs[:2])

    listed = CliRunner().invoke(main, ["suite", str(path), "--list"])
    assert listed.exit_code == 0 and listed.output.count("to run") == 3
    nothing = CliRunner().invoke(main, ["suite", str(path), "--only", "t9"])
    assert nothing.exit_code == 1 and "matches no run" in nothing.output
    done = CliRunner().invoke(main, ["suite", str(path), "--only", "t0"])
    assert done.exit_code == 0, done.output
    first = json.loads((out / "tiny-mt-bench-t0.json").read_text())
    assert set(first["methods"]) == {"vanilla", "pld"} and first["config"]["max_new_tokens"] == 4
    assert not (out / "tiny-mt-bench-t1.json").exists()
    assert "| vanilla tok/s |" in (out / "summary.md").read_text()

    stamp = (out / "tiny-mt-bench-t0.json").stat().st_mtime_ns
    again = CliRunner().invoke(main, ["suite", str(path)])  # resumes: only the missing run
    assert again.exit_code == 0 and "1 of 3 runs done, 2 to run" in again.output
    assert json.loads((out / "counted.json").read_text()) == {"args": [str(out / "counted.json"), "x"]}
    assert (out / "tiny-mt-bench-t0.json").stat().st_mtime_ns == stamp
    summary = (out / "summary.md").read_text()
    assert summary.count("| mt-bench | 0 |") == 1 and summary.count("| mt-bench | 1 |") == 1


def test_a_run_leaves_out_the_methods_whose_shipped_head_is_missing(tmp_path, monkeypatch):
    """Model a ships an EAGLE-1 head and nothing else (`head` and `medusa_head` as a run names them)."""
    monkeypatch.setattr(checkpoint, "SHIPPED", tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    run = {"model": "a"}
    assert _available("eagle", run) and _available("pld", run) and not _available("medusa", run)
    assert not _available("eagle", run | {"head": "eagle3"}) and not _available("hybrid", run | {"head": "eagle3"})
    assert _available("eagle", run | {"head": "some/folder"})  # a folder is the bench's to check
    (tmp_path / "eagle3" / "a").mkdir(parents=True)
    (tmp_path / "eagle3" / "a" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    assert _available("eagle", run | {"head": "eagle3"})


@pytest.mark.parametrize("text, message", [
    ("out = 'x'\n[[runs]]\nscript = 'nothing.py'\ncreates = 'x.json'", "needs an existing script"),
    ("out = 'x'\n[[runs]]\nmodel = 'm'\ndataset = 'd'\nmethods = 'vanilla'\ntemperature = []", "empty list"),
    ("out = 'x'\nrport = 'bench'", "unknown keys"),
    ("out = 'x'\nreport = 'pie'\n[[runs]]\nmodel = 'm'\nmethods = 'vanilla'", "report 'pie'"),
    ("[[runs]]\nmodel = 'm'\nmethods = 'vanilla'", "names no `out`"),
    ("out = 'x'", "declares no [[runs]]"),
    ("out = 'x'\n[[runs]]\nmodel = 'm'\ndataset = 'd'\nmethods = 'vanilla'\nmax_new_token = 4", "unknown bench options"),
    ("out = 'x'\n[[runs]]\nmodel = 'm'\nmethods = 'vanilla'", "needs its model, dataset and methods"),
    ("out = 'x'\n[[runs]]\nmodel = 'm'\ndataset = 'd'\nmethods = 'vanilla'\nweights = ['int4', 'int8']",
     "several runs write m-d-t0.json"),
    ("out = 'x'\n[[runs]]\nmodel = 'm'\ndataset = 'd'\nmethods = 'vanilla'\nname = '{colour}'", "is not an option"),
    ("out = 'x'\n[[runs]]\nscript = 'count.py'\nargs = '--out x'\ncreates = 'x.json'", "`args` as a list"),
    ("out = [", "not valid TOML"),
])
def test_a_bad_suite_file_is_a_one_line_error(tmp_path, text, message):
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        Suite.read(suite_file(tmp_path, text))
