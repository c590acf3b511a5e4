"""Benchmark suites (`eaglespec suite`): runs declared in a TOML file, resumable, then the table."""

import json
import re

import pytest
from click.testing import CliRunner

from eaglespec.bench.suite import Suite
from eaglespec.cli import main
from eaglespec.errors import InvalidArgumentError


def suite_file(tmp_path, text: str):
    path = tmp_path / "benchmarks" / "suites" / "toy.toml"
    path.parent.mkdir(parents=True)
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
""")
    suite = Suite.read(path)
    assert [r.creates for r in suite.runs] == ["tiny-mt-bench-t0.json", "tiny-mt-bench-t1.json"]
    # the tiny target has no shipped head: eagle is left out of its runs, and said so
    assert all("without eagle" in r.note for r in suite.runs)

    listed = CliRunner().invoke(main, ["suite", str(path), "--list"])
    assert listed.exit_code == 0 and listed.output.count("to run") == 2
    done = CliRunner().invoke(main, ["suite", str(path), "--only", "t0"])
    assert done.exit_code == 0, done.output
    first = json.loads((out / "tiny-mt-bench-t0.json").read_text())
    assert set(first["methods"]) == {"vanilla", "pld"} and first["config"]["max_new_tokens"] == 4
    assert not (out / "tiny-mt-bench-t1.json").exists()
    assert "| vanilla tok/s |" in (out / "summary.md").read_text()

    stamp = (out / "tiny-mt-bench-t0.json").stat().st_mtime_ns
    again = CliRunner().invoke(main, ["suite", str(path)])  # resumes: only the missing run
    assert again.exit_code == 0 and "1 of 2 runs done, 1 to run" in again.output
    assert (out / "tiny-mt-bench-t0.json").stat().st_mtime_ns == stamp
    summary = (out / "summary.md").read_text()
    assert summary.count("| mt-bench | 0 |") == 1 and summary.count("| mt-bench | 1 |") == 1


@pytest.mark.parametrize("text, message", [
    ("out = 'x'\n[[runs]]\nscript = 'nothing.py'\ncreates = 'x.json'", "needs an existing script"),
    ("out = 'x'\nrport = 'bench'", "unknown keys"),
    ("out = 'x'\nreport = 'pie'\n[[runs]]\nmodel = 'm'\nmethods = 'vanilla'", "report 'pie'"),
    ("[[runs]]\nmodel = 'm'\nmethods = 'vanilla'", "names no `out`"),
    ("out = 'x'", "declares no [[runs]]"),
    ("out = [", "not valid TOML"),
])
def test_a_bad_suite_file_is_a_one_line_error(tmp_path, text, message):
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        Suite.read(suite_file(tmp_path, text))
