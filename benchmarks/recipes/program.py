"""The long training program: a model's head improved in stretches, each on ShareGPT conversations
it has not seen, with the CPU time behind every step recorded (acceptance per CPU hour).

    .venv/bin/python benchmarks/recipes/program.py qwen2.5-coder-0.5b-instruct      # one stretch: the recipe's mix
    .venv/bin/python benchmarks/recipes/program.py smollm2-135m-instruct --slice    # the next ShareGPT slice
    .venv/bin/python benchmarks/recipes/program.py smollm2-135m-instruct --data data/regenerated/smollm2-135m-instruct --new-only
    .venv/bin/python benchmarks/recipes/program.py smollm2-135m-instruct --data ... --budget-minutes 60 --draft-vocab 8192
    .venv/bin/python benchmarks/recipes/program.py gemma-3-270m --budget-minutes 30   # a base model's first head
    .venv/bin/python benchmarks/recipes/program.py --report     # program.png and the README table

A stretch extracts the recipe's data (the target's own answers from `eaglespec regenerate` and human
ShareGPT answers, two to one, cut at 192 tokens; `--data SPEC` names other sources; `--slice` takes
the next slice of ShareGPT conversations after those of earlier stretches), trains the shipped head
(`src/eaglespec/heads/shipped/MODEL`) on it for the recipe's budget, measures the
result the same way as the starting point (held-out n-alpha through `eval-head`, fp32, on human
answers and, where they are committed, on the target's own answers; tau on MT-bench through
`bench`), and replaces it only if its expected chain length (1 + a0 + a0 a1 + ...) grew:
over the first FIRST (128) tokens of the target's own answers where this stretch and an earlier one
have that figure (the text a 128-token benchmark drafts), else over the whole of those answers,
else on human answers. `--answer-tokens N` trains on the first N tokens of each answer, `--budget-minutes M` trains for M
minutes instead of the recipe's, and `--draft-vocab N` picks an EAGLE-1 head's draft vocabulary anew
from the stretch's data (`train --draft-vocab`). Stretch 0 measures the head it starts from. The ledger
`benchmarks/results/program/MODEL.json` keeps each stretch's slice, commands, seconds and figures;
`program.png` plots them against CPU hours. A model without a shipped head (gemma-3-270m) starts
from nothing: stretch 0 records plain decoding (tau 1) and stretch 1 trains a head from the target's
last layer with the recipe's `new_head` options (its draft vocabulary). Every step resumes where it stopped (extraction
shards, training checkpoints); a stretch should fit in one session (commit the ledger and the head
after each). A `--data` stretch links the shards of the conversations the stretch before extracted
from its cache where that is still there (`extract --reuse`), and counts only its new shards' time.
With `--new-only` a `--data` stretch takes only the source's conversations after those the last
stretch on the same source trained on, for at most NEW_ONLY_EPOCHS epochs: for a machine whose
feature cache is gone, where extracting the whole grown source again would not fit in a session.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from eaglespec.files import save_figure, write_folder, write_json
from eaglespec.heads.checkpoint import SHIPPED

ROOT = Path(__file__).resolve().parents[2]

RESULTS = ROOT / "benchmarks" / "results" / "program"
CACHE = Path(os.environ.get("EAGLESPEC_CACHE", Path.home() / ".cache" / "eaglespec")) / "program"
E = str(ROOT / ".venv" / "bin" / "eaglespec")
HELDOUT = 50  # held-out conversations scored
# the keep rule's text: the first tokens of the target's own answers, as many as the MT-bench run's
# answers have (a 128-token benchmark never sees the late positions of a 512-token answer)
FIRST = 128
NEW_ONLY_EPOCHS = 3  # a --new-only stretch's passes over its (small) slice
# `eagle` sizes its tree by the machine's measured verify costs (what a user gets, but it moves with
# the machine and its load); `eagle:eagle1` drafts the paper's fixed 26-node tree: its tau measures
# the head alone, comparable from stretch to stretch.
BENCH = ["--dataset", "mt-bench", "--limit", "5", "--methods", "vanilla,eagle,eagle:eagle1", "--temperature", "0",
         "--max-new-tokens", "128", "--threads", "2"]

# Per model: the data of a stretch (`data`: the target's own answers and human ones, two to one,
# the mix the quality ablation ranked first; `conversations`: the size of a ShareGPT slice, with
# --slice), the answers' length and the extraction's dtype, and the training recipe (the head's own
# options: type, draft vocabulary, layers come from the head it continues).
OWN = "data/regenerated/"
RECIPES = {
    "smollm2-135m-instruct": {
        "data": f"{OWN}smollm2-135m-instruct:3460,{OWN}smollm2-135m-instruct-short:1363,"
                f"{OWN}smollm2-135m-instruct-more:2705,sharegpt:3764",
        "answer_tokens": 192, "extract_dtype": "bfloat16",
        "conversations": 500,
        "train": ["--loss", "feature:1,ce:0.1", "--unroll", "3", "--lr", "3e-4", "--warmup-steps", "10",
                  "--batch", "8", "--budget-minutes", "40", "--epochs", "100", "--checkpoint-every", "10",
                  "--eval-limit", "20"],
    },
    "qwen2.5-coder-0.5b-instruct": {
        "data": f"{OWN}qwen2.5-coder-0.5b-instruct:194,{OWN}qwen2.5-coder-0.5b-instruct-more:3360,sharegpt:1777",
        "answer_tokens": 192, "extract_dtype": "bfloat16",
        "conversations": 200,
        "train": ["--loss", "feature:1,ce:0.1", "--unroll", "3", "--lr", "3e-4", "--warmup-steps", "10",
                  "--batch", "8", "--budget-minutes", "60", "--epochs", "100", "--checkpoint-every", "10",
                  "--eval-limit", "20"],
    },
    # a base model: no chat template, so conversations are its turns as paragraphs (training.data);
    # stretch 1 trained on a ShareGPT slice of human answers, before the target's own were
    # regenerated; a new head's draft vocabulary (262k tokens is too wide to draft over on a CPU)
    "gemma-3-270m": {
        "data": f"{OWN}gemma-3-270m:640,sharegpt:320",
        "answer_tokens": 192, "extract_dtype": "bfloat16",
        "conversations": 600,
        "new_head": ["--draft-vocab", "16384"],
        "train": ["--loss", "feature:1,ce:0.1", "--unroll", "3", "--lr", "3e-4", "--warmup-steps", "10",
                  "--batch", "8", "--budget-minutes", "40", "--epochs", "100", "--checkpoint-every", "10",
                  "--eval-limit", "20"],
    },
}


def run(command: list[str]) -> float:
    """Run a command (printed first); its wall seconds."""
    print("+ " + " ".join(command), flush=True)
    started = time.monotonic()
    subprocess.run(command, check=True, cwd=ROOT)
    return time.monotonic() - started


def chain_length(alpha: list[float]) -> float:
    """Expected tokens per round of a chain drafted len(alpha) deep: 1 + a0 + a0 a1 + ..."""
    total, reach = 1.0, 1.0
    for a in alpha:
        reach *= a
        total += reach
    return total


def held_out(model: str, head: str, path: Path, data: Path | None = None, first: int | None = None) -> dict:
    """`eval-head` (fp32 target forward: faster than bf16 on CPUs without bf16 instructions) on
    the held-out human answers, or on `data`'s; over the `first` tokens of each answer if given."""
    if not path.is_file():
        command = [E, "eval-head", "--model", model, "--head", head, "--limit", str(HELDOUT), "--threads", "2",
                   "--dtype", "float32", "--json", "--data", str(data or "sharegpt"),  # (a head's default: its own data)
                   *(["--answer-tokens", str(first)] if first else [])]
        print("+ " + " ".join(command), flush=True)
        out = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
        write_json(json.loads(out.stdout.strip().splitlines()[-1]), path)
    return json.loads(path.read_text())


def own_figures(model: str, head: str, work: Path) -> dict:
    """n-alpha on the target's own answers to the held-out prompts, where they are committed
    (`data/regenerated/MODEL-heldout`): whole, and over each answer's FIRST tokens."""
    own = ROOT / "data" / "regenerated" / f"{model}-heldout"
    if not own.is_dir():
        return {}
    return {"alpha_own_text": held_out(model, head, work / "alpha-own.json", own)["alpha"],
            f"alpha_own_first{FIRST}": held_out(model, head, work / f"alpha-own-first{FIRST}.json", own, FIRST)["alpha"]}


def measure(model: str, head: str, work: Path) -> dict:
    """Held-out n-alpha on human answers and on the target's own (`own_figures`); MT-bench tau."""
    found = held_out(model, head, work / "alpha.json")
    extra = own_figures(model, head, work)
    return {"alpha": found["alpha"], "chain_length": round(chain_length(found["alpha"]), 4),
            "tokens_scored": found["tokens_scored"], **mt_bench(model, head, work), **extra}


def mt_bench(model: str, head: str, work: Path) -> dict:
    """MT-bench tau with the fixed EAGLE-1 tree, and tau and speedup with the `auto` tree."""
    bench = work / "bench-eagle1.json"
    if not bench.is_file():
        run([E, "bench", "--model", model, "--head", head, *BENCH, "--out", str(bench)])
    result = json.loads(bench.read_text())
    methods, auto = result["methods"], result["methods"]["eagle"]
    # the `auto` tree's tau and every speed move with the machine, which differs between sessions
    return {"machine": result["machine"]["cpu"], "mt_bench_tau_eagle1": methods["eagle:eagle1"]["tau"], "mt_bench_tau": auto["tau"],
            "mt_bench_auto_tree": auto["tree"], "mt_bench_speedup": auto["speedup"],
            "mt_bench_tokens_per_s": auto["tokens_per_s"],
            "vanilla_tokens_per_s": methods["vanilla"]["tokens_per_s"]}


def remeasure(model: str, number: int, head: str) -> None:
    """Fill in the figures an earlier stretch lacks because they were measured only since (tau with
    the fixed EAGLE-1 tree, n-alpha on the target's own answers) from its head, wherever the head
    is now (an earlier commit's shipped head); its other figures stay as they were measured. Then the
    keep rule again for every later stretch, and the head it now picks becomes the shipped head."""
    ledger_path = RESULTS / f"{model}.json"
    ledger = json.loads(ledger_path.read_text())
    entry = ledger["stretches"][number]
    work = CACHE / model / f"stretch-{number}"
    work.mkdir(parents=True, exist_ok=True)
    if "mt_bench_tau_eagle1" not in entry:
        entry["mt_bench_tau_eagle1"] = mt_bench(model, head, work)["mt_bench_tau_eagle1"]
    for key, value in own_figures(model, head, work).items():
        entry.setdefault(key, value)
    # the keep rule again for the stretches after it, which were judged without this figure; the
    # last one kept is the head that ships
    stretches = ledger["stretches"]

    def shipped() -> int:
        return max((s["stretch"] for s in stretches if s["stretch"] > 0 and s["kept"]), default=0)

    before = shipped()
    for later in stretches[number + 1:]:
        now = better(later, stretches[:later["stretch"]])
        if now != later["kept"]:
            later["kept"] = now
            later["note"] = (later.get("note", "") + "; " if later.get("note") else "") + \
                f"{'kept' if now else 'not kept'} when --remeasure {number} measured the figure the keep rule compares"
    after = shipped()
    if after != before:
        run_dir = CACHE / model / f"stretch-{after}" / "run" / "head"
        if after == 0 or not run_dir.is_dir():
            write_json(ledger, ledger_path)
            raise SystemExit(f"the keep rule now picks stretch {after}'s head, whose run is not in {CACHE / model}: "
                             f"restore {SHIPPED / model} from the commit that shipped it")
        install(model, CACHE / model / f"stretch-{after}", stretches[after])
    write_json(ledger, ledger_path)
    plot()


def extraction_seconds(features: Path, earlier: Path) -> float:
    """The recorded seconds (CPU time per thread; wall time before 2026-12-02 evening) of the shards in `features` not linked from `earlier` (the stretch
    before: their cost was counted there)."""
    from safetensors import safe_open

    total = 0.0
    for shard in features.glob("shard-*.safetensors"):
        before = earlier / shard.name
        if shard.stat().st_size and not (before.is_file() and os.path.samefile(shard, before)):
            with safe_open(str(shard), "pt") as f:
                total += float((f.metadata() or {}).get("seconds", 0))
    return total


def better(entry: dict, earlier: list[dict]) -> bool:
    """Whether a stretch's head beats every earlier one: expected chain length over the first
    tokens of the target's own answers where it and an earlier head have that figure, else over
    the whole of those answers, else on human answers."""
    for figure in (f"alpha_own_first{FIRST}", "alpha_own_text"):
        if figure in entry:
            known = [chain_length(s[figure]) for s in earlier if figure in s]
            if known:
                return chain_length(entry[figure]) > max(known)
    return entry["chain_length"] > max(s["chain_length"] for s in earlier)


def install(model: str, work: Path, entry: dict) -> None:
    """Make a stretch's trained head (in its cache folder) the shipped head, with its curves and eval.json."""
    def fill(folder: Path) -> None:
        shutil.copytree(work / "run" / "head", folder, dirs_exist_ok=True)
        shutil.copy(work / "run" / "curves.png", folder / "curves.png")
        write_json({"model": model, "head": "default", "alpha": entry["alpha"],
                    "tokens_scored": entry["tokens_scored"], "conversations": HELDOUT}, folder / "eval.json")

    write_folder(SHIPPED / model, fill)


def stretch(model: str, data: str | None, new_only: bool = False, answer_tokens: int | None = None,
            budget_minutes: float | None = None, draft_vocab: int | None = None,
            extract_dtype: str = "float32") -> None:
    recipe = RECIPES[model]
    ledger_path = RESULTS / f"{model}.json"
    ledger = json.loads(ledger_path.read_text()) if ledger_path.is_file() else {"model": model, "stretches": []}
    stretches = ledger["stretches"]
    n = len(stretches)
    work = CACHE / model / f"stretch-{n}"
    work.mkdir(parents=True, exist_ok=True)
    head = SHIPPED / model
    if n == 0 and not (head / "config.json").is_file():  # no head yet: plain decoding, tau 1
        entry = {"stretch": 0, "conversations": 0, "skip": 0, "extract_seconds": 0.0, "train_seconds": 0.0,
                 "note": "no head before the program: stretch 1 trains one from the target's last layer",
                 "alpha": [0.0] * 5, "chain_length": 1.0, "tokens_scored": 0, "mt_bench_tau": 1.0}
    elif n == 0:  # the starting point: the shipped head as it is
        entry = {"stretch": 0, "conversations": 0, "skip": 0, "extract_seconds": 0.0, "train_seconds": 0.0,
                 "note": "the head shipped before the program", **measure(model, str(head), work)}
    else:
        # the ShareGPT slices follow each other; a --data stretch takes all of its source, or with
        # --new-only what follows the conversations of the last stretch on it
        skip = sum(s["conversations"] for s in stretches if "data" not in s)
        if data:
            same = [s for s in stretches if s.get("data") == data]
            skip = (same[-1].get("skip", 0) + same[-1]["conversations"]) if new_only and same else 0
        features = work / "train"
        source = (["--data", data, "--skip", str(skip)] if data
                  else ["--data", "sharegpt", "--skip", str(skip), "--limit", str(recipe["conversations"])])
        # a --data source grows between stretches: the shards of its conversations extracted before stay
        earlier = CACHE / model / f"stretch-{n - 1}" / "train"
        reuse = (["--reuse", str(earlier)] if data and not skip and (earlier / "manifest.json").is_file()
                 and json.loads((earlier / "manifest.json").read_text())["dtype"] == extract_dtype else [])
        cut = ["--answer-tokens", str(answer_tokens)] if answer_tokens else []
        extract = [E, "extract", "--model", model, "--split", "train", *source, *cut, "--dtype", extract_dtype,
                   "--threads", "2", "--out", str(features), *reuse]
        run(extract)
        heldout = CACHE / model / "heldout"
        run([E, "extract", "--model", model, "--data", "sharegpt", "--split", "heldout", "--limit", str(HELDOUT), "--dtype", "float32",
             "--threads", "2", "--out", str(heldout)])
        start = ["--init", str(head)] if (head / "config.json").is_file() else recipe["new_head"]
        train = [E, "train", "--model", model, "--train-features", str(features), "--heldout-features", str(heldout),
                 *start, "--out", str(work / "run"), "--threads", "2", *recipe["train"]]
        if data and skip:
            train[train.index("--epochs") + 1] = str(NEW_ONLY_EPOCHS)
        if budget_minutes:
            train[train.index("--budget-minutes") + 1] = f"{budget_minutes:g}"
        if draft_vocab:
            train += ["--draft-vocab", str(draft_vocab)]
        run(train)
        trained = json.loads((work / "run" / "head" / "config.json").read_text())["eaglespec"]
        from eaglespec.training.features import FeatureSet

        feature_set = FeatureSet(features)
        entry = {"stretch": n, **({"data": data} if data else {}), "skip": skip,
                 **({"answer_tokens": answer_tokens} if answer_tokens else {}),
                 **({"draft_vocab": draft_vocab} if draft_vocab else {}),
                 "conversations": len(feature_set) if data else recipe["conversations"],
                 "tokens": feature_set.tokens(),
                 # what the features cost (wall times of the shards extracted in this stretch) and what
                 # training cost (evaluations excluded)
                 "extract_seconds": round(extraction_seconds(features, earlier), 1),
                 "train_seconds": trained["eval_seconds"][-1] if trained["eval_seconds"] else trained["train_seconds"],
                 "commands": [" ".join(extract[1:]), " ".join(train[1:])],
                 "train_evals": trained["evals"], **measure(model, str(work / "run" / "head"), work)}
        entry["kept"] = better(entry, stretches)
        if entry["kept"]:
            install(model, work, entry)
    hours = sum(s["extract_seconds"] + s["train_seconds"] for s in [*stretches, entry]) / 3600
    entry["cpu_hours"] = round(hours, 3)
    stretches.append(entry)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(ledger, ledger_path)
    print(f"stretch {n}: alpha {', '.join(f'{a:.3f}' for a in entry['alpha'])}, tau {entry.get('mt_bench_tau_eagle1', 1):.2f} "
          f"(EAGLE-1 tree), "
          f"{hours:.2f} CPU hours in all" + ("" if n == 0 else f"; {'kept' if entry['kept'] else 'not kept'}"))
    plot()


def plot() -> None:
    """program.png: held-out 0-alpha and MT-bench tau against CPU hours, one line per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for path in sorted(RESULTS.glob("*.json")):
        ledger = json.loads(path.read_text())
        rows = ledger["stretches"]
        hours = [s["cpu_hours"] for s in rows]
        a.plot(hours, [s["alpha"][0] for s in rows], marker="o", label=f"{ledger['model']} 0-alpha")
        a.plot(hours, [s["alpha"][2] for s in rows], marker="x", linestyle="--", label=f"{ledger['model']} 2-alpha")
        b.plot(hours, [s["mt_bench_tau"] for s in rows], marker="o", label=f"{ledger['model']}, auto tree")
        fixed = [(h, s["mt_bench_tau_eagle1"]) for h, s in zip(hours, rows) if "mt_bench_tau_eagle1" in s]
        if fixed:
            b.plot(*zip(*fixed), marker="x", linestyle="--", label=f"{ledger['model']}, EAGLE-1 tree")
    a.set_xlabel("CPU hours of the program (extraction + training)")
    a.set_ylabel("held-out n-alpha")
    b.set_xlabel("CPU hours of the program (extraction + training)")
    b.set_ylabel("MT-bench tau (greedy)")
    for axis in (a, b):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, RESULTS / "program.png")
    plt.close(fig)


def table() -> str:
    """The README's table: one row per stretch of every model."""
    lines = ["| model | stretch | new conversations (tokens) | CPU hours in all | held-out 0..4-alpha | "
             "chain length | on the target's own answers: 0..4-alpha, chain length | "
             f"their first {FIRST} tokens: 0..4-alpha, chain length | MT-bench tau, EAGLE-1 tree | "
             "MT-bench tau, auto tree | kept |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("*.json")):
        ledger = json.loads(path.read_text())
        for s in ledger["stretches"]:
            data = ("the starting head" if "no head" not in s.get("note", "") else "no head") if s["stretch"] == 0 else f"{s['conversations']} ({s['tokens']:,})"
            if "data" in s:
                what = "new answers" if s.get("skip") else "answers"
                data = f"{s['conversations']} of the target's own {what} ({s['tokens']:,})"
                human = sum(float(part.rpartition(":")[2]) for part in s["data"].split(",") if part.startswith("sharegpt:"))
                if human:  # own and human answers mixed (weights given as counts)
                    data = (f"{s['conversations']} answers, {s['conversations'] - int(human)} the target's own and "
                            f"{int(human)} human ({s['tokens']:,})")
            own, first = (f"{', '.join(f'{a:.3f}' for a in s[k])}; {chain_length(s[k]):.3f}" if k in s else "-"
                          for k in ("alpha_own_text", f"alpha_own_first{FIRST}"))
            if s.get("answer_tokens"):
                data += f", answers cut at {s['answer_tokens']} tokens"
            fixed = f"{s['mt_bench_tau_eagle1']:.2f}" if "mt_bench_tau_eagle1" in s else "-"
            kept = "-" if s["stretch"] == 0 else ("yes" if s["kept"] else "no")
            lines.append(f"| {ledger['model']} | {s['stretch']} | {data} | {s['cpu_hours']:.2f} | "
                         f"{', '.join(f'{a:.3f}' for a in s['alpha'])} | {s['chain_length']:.3f} | {own} | {first} | "
                         f"{fixed} | {s['mt_bench_tau']:.2f} | {kept} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", choices=sorted(RECIPES))
    parser.add_argument("--report", action="store_true", help="Redraw program.png and print the README table.")
    parser.add_argument("--data", help="Train this stretch on all of this source's training conversations "
                        "(default: the recipe's mix of the target's own answers and human ones).")
    parser.add_argument("--slice", action="store_true",
                        help="Train this stretch on the next slice of ShareGPT conversations instead (human answers).")
    parser.add_argument("--new-only", action="store_true",
                        help="With --data: only the conversations after those the last stretch on the same source trained on.")
    parser.add_argument("--answer-tokens", type=int,
                        help="Train on the first this many tokens of each answer (extract --answer-tokens).")
    parser.add_argument("--budget-minutes", type=float,
                        help="This stretch's training minutes, instead of the recipe's (recorded in the ledger's commands).")
    parser.add_argument("--draft-vocab", type=int,
                        help="Pick the head's draft vocabulary anew: this stretch's N most frequent answer tokens "
                             "(EAGLE-1 heads: their weights carry over).")
    parser.add_argument("--extract-dtype", choices=["float32", "bfloat16"], default=None,
                        help="The target's dtype when extracting this stretch's training features (default: the "
                             "recipe's, bfloat16: about half float32's time, and the dtype CPU generation runs in); "
                             "the held-out features stay float32.")
    parser.add_argument("--remeasure", nargs=2, metavar=("STRETCH", "HEAD"),
                        help="Fill in what stretch STRETCH lacks (EAGLE-1-tree tau, n-alpha on own answers) from its head folder HEAD.")
    args = parser.parse_args()
    if args.remeasure:
        if not args.model:
            parser.error("--remeasure needs the MODEL")
        remeasure(args.model, int(args.remeasure[0]), args.remeasure[1])
    elif args.report:
        plot()
        print(table())
    elif args.model:
        recipe = RECIPES[args.model]
        if args.slice and (args.data or args.new_only):
            parser.error("--slice takes the next ShareGPT slice: give it without --data and --new-only")
        data = None if args.slice else args.data or recipe["data"]
        answer_tokens = args.answer_tokens or (None if args.slice else recipe["answer_tokens"])
        if args.budget_minutes is not None and args.budget_minutes <= 0:
            parser.error("--budget-minutes must be positive")
        if args.draft_vocab is not None and args.draft_vocab <= 0:
            parser.error("--draft-vocab must be positive")
        stretch(args.model, data, args.new_only, answer_tokens, args.budget_minutes, args.draft_vocab,
                args.extract_dtype or recipe["extract_dtype"])
    else:
        parser.error("give a MODEL for one stretch, or --report")


if __name__ == "__main__":
    main()
