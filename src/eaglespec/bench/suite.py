"""Benchmark suites: a TOML file declares the runs behind one published table; `eaglespec suite FILE`
runs the ones whose JSON is missing (so a suite stopped midway resumes), then makes the table.

    title = "Every method side by side"
    out = "benchmarks/results/suite"       # the folder of the JSON (--out overrides it, e.g. per machine)
    report = "bench"                       # bench: summary.md and plots from the bench runs' JSON

    [bench]                                # `eaglespec bench` options every bench run shares
    weights = "int4"
    limit = 10

    [[runs]]                               # bench runs: a list expands to one run per value
    model = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]
    dataset = ["mt-bench", "humaneval"]
    temperature = [0, 1]
    methods = "vanilla,eagle,pld,medusa"

    [[runs]]                               # or a script of benchmarks/experiments/ with its arguments,
    script = "verify_cost.py"              # "{out}" standing for the folder; it is done once `creates` exists
    args = ["--out", "{out}/verify_cost.json"]
    creates = "verify_cost.json"

A bench run writes OUT/MODEL-DATASET-tT.json (with `name`, its own file name). A method that
needs a head the model has none of (`--head default` where none is shipped, a Medusa head not
built) is left out of its run, with a note.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from eaglespec.bench.report import bench_report
from eaglespec.bench.run import EXTERNAL
from eaglespec.decoding.methods import method_needs
from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.checkpoint import shipped_head

BENCH_NAME = "{model}-{dataset}-t{temperature}"
EXPERIMENTS = Path("benchmarks") / "experiments"  # of the repository the suite file sits in
REPORTS = ("bench", "none")


@dataclass(frozen=True)
class Run:
    """One run of a suite: its output file (relative to the suite's folder) and the command."""

    creates: str
    command: tuple[str, ...]
    note: str = ""


def _expand(spec: dict) -> list[dict]:
    """One dict per combination of the values given as lists."""
    keys = list(spec)
    values = [v if isinstance(v, list) else [v] for v in spec.values()]
    return [dict(zip(keys, combination)) for combination in itertools.product(*values)]


def _option(key: str, value) -> list[str]:
    flag = "--" + key.replace("_", "-")
    if value is True:
        return [flag]
    return [] if value is False else [flag, f"{value:g}" if isinstance(value, float) else str(value)]


def _available(method: str, options: dict) -> bool:
    """Whether what a method needs is there: its head, when the run asks for the shipped one."""
    need = "" if method in EXTERNAL else method_needs(method)
    if need in ("head", "medusa") and options.get("head" if need == "head" else "medusa_head", "default") == "default":
        return shipped_head(options["model"], "medusa" if need == "medusa" else "eagle") is not None
    return True


def bench_run(options: dict, out: Path) -> Run:
    options = {k: v for k, v in options.items() if k != "name"} | {"name": options.get("name", BENCH_NAME)}
    name = options.pop("name").format(**{k: (f"{v:g}" if isinstance(v, float) else v) for k, v in options.items()})
    if "methods" not in options or "model" not in options:
        raise InvalidArgumentError(f"bench run '{name}' names no model or no methods")
    methods = [m.strip() for m in str(options["methods"]).split(",") if m.strip()]
    kept = [m for m in methods if _available(m, options)]
    options["methods"] = ",".join(kept)
    command = [sys.executable, "-m", "eaglespec", "bench", *itertools.chain.from_iterable(
        _option(k, v) for k, v in options.items()), "--out", str(out / f"{name}.json")]
    left = sorted(set(methods) - set(kept))
    note = f"without {', '.join(left)}: no such head for {options['model']}" if left else ""
    return Run(f"{name}.json", tuple(command), note)


@dataclass(frozen=True)
class Suite:
    path: Path
    title: str
    out: Path
    report: str
    runs: tuple[Run, ...]

    @staticmethod
    def read(path: Path, out: Path | None = None) -> Suite:
        path = Path(path)
        if not path.is_file():
            raise InvalidArgumentError(f"no suite file at '{path}': give a .toml file (see benchmarks/suites/)")
        try:
            spec = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as error:
            raise InvalidArgumentError(f"{path} is not valid TOML: {error}") from None
        unknown = set(spec) - {"title", "out", "report", "bench", "runs"}
        if unknown:
            raise InvalidArgumentError(f"{path}: unknown keys {sorted(unknown)}; use title, out, report, bench, runs")
        if "out" not in spec and out is None:
            raise InvalidArgumentError(f"{path} names no `out` folder; add one or pass --out")
        report = spec.get("report", "none")
        if report not in REPORTS:
            raise InvalidArgumentError(f"{path}: report '{report}' is not one of {', '.join(REPORTS)}")
        folder = Path(out or spec["out"])
        root = path.resolve().parent.parent.parent  # benchmarks/suites/FILE -> the repository
        runs = []
        for entry in spec.get("runs", []):
            if "script" in entry:
                script = root / EXPERIMENTS / entry["script"]
                if not script.is_file() or "creates" not in entry:
                    raise InvalidArgumentError(f"{path}: script run '{entry['script']}' needs an existing script "
                                               f"in {EXPERIMENTS} and `creates`")
                args = [a.replace("{out}", str(folder)) for a in entry.get("args", [])]
                runs.append(Run(entry["creates"], (sys.executable, str(script), *args)))
            else:
                runs += [bench_run(spec.get("bench", {}) | options, folder) for options in _expand(entry)]
        if not runs:
            raise InvalidArgumentError(f"{path} declares no [[runs]]")
        return Suite(path, spec.get("title", path.stem), folder, report, tuple(runs))

    def pending(self, only: str = "") -> list[Run]:
        return [r for r in self.runs if only in r.creates and not (self.out / r.creates).exists()]

    def run(self, only: str = "", echo=print) -> None:
        """Every missing run (in file order), then the report."""
        self.out.mkdir(parents=True, exist_ok=True)
        todo = self.pending(only)
        done = sum((self.out / r.creates).exists() for r in self.runs)
        echo(f"{self.title}: {done} of {len(self.runs)} runs done, {len(todo)} to run")
        for number, run in enumerate(todo, 1):
            echo(f"[{number}/{len(todo)}] {run.creates}" + (f" ({run.note})" if run.note else ""))
            subprocess.run(run.command, check=True)
        if self.report == "bench":
            results = [json.loads((self.out / r.creates).read_text()) for r in self.runs
                       if (self.out / r.creates).is_file()]
            echo(bench_report(results, self.out))
