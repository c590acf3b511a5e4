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
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from eaglespec.bench.report import bench_report
from eaglespec.bench.run import EXTERNAL, BenchConfig
from eaglespec.decoding.drafters import Artefact, method_needs
from eaglespec.errors import EaglespecError, InvalidArgumentError
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
    return [] if value is False else [flag, str(value)]


def _available(method: str, options: dict) -> bool:
    """Whether what a method needs is there: its head, when the run asks for a shipped one."""
    need = None if method in EXTERNAL else method_needs(method)
    medusa = need is Artefact.MEDUSA_HEAD
    spec = options.get("medusa_head" if medusa else "head", "default")
    kind = "medusa" if medusa else "eagle3" if spec == "eagle3" else "eagle"
    if need in (Artefact.EAGLE_HEAD, Artefact.MEDUSA_HEAD) and (spec == "default" or kind == "eagle3"):
        return shipped_head(options["model"], kind) is not None
    return True


def _bench_options() -> dict[str, object]:
    """What a bench run may set (`eaglespec bench`'s options, by their config names), with defaults."""
    return {f.name: None if f.default is MISSING else f.default for f in fields(BenchConfig)} | {"threads": None}


def _name_part(value) -> str:
    """A value as it appears in a run's file name: a path by its stem, a number without trailing zeros."""
    if isinstance(value, float):
        return f"{value:g}"
    return Path(value).stem if isinstance(value, str) and "/" in value else str(value)


def bench_run(options: dict, out: Path, known: dict) -> Run:
    options = dict(options)
    template = options.pop("name", BENCH_NAME)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidArgumentError(f"unknown bench options {unknown}; use eaglespec bench's: {', '.join(known)}")
    if not {"model", "dataset", "methods"} <= set(options):
        raise InvalidArgumentError("a bench run needs its model, dataset and methods")
    try:
        name = template.format(**{k: _name_part(v) for k, v in ({**known, **options}).items()})
    except (KeyError, IndexError, ValueError) as error:
        raise InvalidArgumentError(f"run name '{template}': {error!r} is not an option of the run") from None
    methods = [m.strip() for m in str(options["methods"]).split(",") if m.strip()]
    kept = [m for m in methods if _available(m, options)]
    options["methods"] = ",".join(kept)
    command = [sys.executable, "-m", "eaglespec", "bench", *itertools.chain.from_iterable(
        _option(k, v) for k, v in options.items()), "--out", str(out / f"{name}.json")]
    left = [m for m in methods if m not in kept]
    note = f"without {', '.join(left)}: no such head for {options['model']}" if left else ""
    return Run(f"{name}.json", tuple(command), note)


@dataclass(frozen=True)
class Suite:
    path: Path
    title: str
    out: Path
    report: str
    root: Path  # the repository: runs start there
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
        root = path.resolve().parent.parent.parent  # benchmarks/suites/FILE -> the repository
        if not (root / EXPERIMENTS).is_dir():
            raise InvalidArgumentError(f"{path} is not in a repository's benchmarks/suites/ folder")
        folder = Path(out).resolve() if out else root / spec["out"]  # the file's `out` is the repository's
        entries = spec.get("runs", [])
        if not entries or not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise InvalidArgumentError(f"{path} declares no [[runs]]")
        known, runs = _bench_options(), []
        for entry in entries:
            if "script" in entry:
                script = root / EXPERIMENTS / entry["script"]
                args = entry.get("args", [])
                if not script.is_file() or "creates" not in entry or not isinstance(args, list):
                    raise InvalidArgumentError(f"{path}: script run '{entry['script']}' needs an existing script "
                                               f"in {EXPERIMENTS}, `creates` and `args` as a list")
                args = [str(a).replace("{out}", str(folder)) for a in args]
                runs.append(Run(entry["creates"], (sys.executable, str(script), *args)))
            else:
                if any(v == [] for v in entry.values()):
                    raise InvalidArgumentError(f"{path}: a run gives an empty list; give at least one value")
                runs += [bench_run(spec.get("bench", {}) | options, folder, known) for options in _expand(entry)]
        names = [r.creates for r in runs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidArgumentError(f"{path}: several runs write {', '.join(twice)}; put what tells them apart "
                                       "in their `name`, e.g. name = \"{model}-{dataset}-t{temperature}-{weights}\"")
        return Suite(path, spec.get("title", path.stem), folder, report, root, tuple(runs))

    def pending(self, only: str = "") -> list[Run]:
        return [r for r in self.runs if only in r.creates and not (self.out / r.creates).exists()]

    def run(self, only: str = "", echo=print) -> None:
        """Every missing run (in file order), then the report. A script writes its `creates` file
        last, so that a run that failed midway is not taken for done."""
        if only and not any(only in r.creates for r in self.runs):
            raise InvalidArgumentError(f"--only '{only}' matches no run of {self.path}; see --list")
        self.out.mkdir(parents=True, exist_ok=True)
        todo = self.pending(only)
        done = sum((self.out / r.creates).exists() for r in self.runs)
        echo(f"{self.title}: {done} of {len(self.runs)} runs done, {len(todo)} to run")
        for number, run in enumerate(todo, 1):
            echo(f"[{number}/{len(todo)}] {run.creates}" + (f" ({run.note})" if run.note else ""))
            if subprocess.run(run.command, cwd=self.root).returncode != 0:
                raise EaglespecError(f"the run of {run.creates} failed (its output is above); fix it and run the "
                                     "suite again: the runs that are done are kept")
        if self.report == "bench":
            results = [json.loads((self.out / r.creates).read_text()) for r in self.runs
                       if r.command[2:4] == ("eaglespec", "bench") and (self.out / r.creates).is_file()]
            echo(bench_report(results, self.out))
