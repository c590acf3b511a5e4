"""Benchmark prompts: the bundled MT-bench, HumanEval and ShareGPT held-out split, or a user's
JSONL / JSON file (MT-bench `turns`, `prompt`, GSM8K `question`, Alpaca `instruction` + `input`,
or `conversations` / `messages`). Each item is one or more user turns; a later turn follows the
answer the method generated to the turns before it."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from eaglespec.errors import InvalidArgumentError
from eaglespec.models.conversations import ReadReport, select
from eaglespec.models.fetch import fetch_dataset
from eaglespec.models.registry import DATASETS

BENCH_DATASETS = ("mt-bench", "humaneval", "sharegpt")
SHAREGPT_MAX_CHARS = 4000  # a longer first question (a pasted document) is skipped
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Answer with code only.\n\n```python\n{}```"


@dataclass(frozen=True)
class Item:
    id: str
    turns: tuple[str, ...]  # user turns, in order


def load_items(dataset: str, limit: int | None = None) -> list[Item]:
    """The first `limit` items of a dataset (all with None)."""
    if dataset == "mt-bench":
        items = _mt_bench()
    elif dataset == "humaneval":
        items = _humaneval()
    elif dataset == "sharegpt":
        items = _sharegpt_heldout()
    else:
        items = _user_file(dataset)
    if not items:
        raise InvalidArgumentError(f"dataset '{dataset}' holds no prompts")
    return items[:limit]


def _mt_bench() -> list[Item]:
    path = fetch_dataset(DATASETS["mt-bench"])
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Item(f"mt-bench/{r['question_id']}", tuple(r["turns"])) for r in rows]


def _humaneval() -> list[Item]:
    path = fetch_dataset(DATASETS["humaneval"])
    rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines() if line.strip()]
    return [Item(r["task_id"], (HUMANEVAL_INSTRUCTION.format(r["prompt"]),)) for r in rows]


def _sharegpt_heldout() -> list[Item]:
    """First user turns of the held-out conversations (`eaglespec extract`'s default split, which
    training never reads). ShareGPT splits long conversations into parts (id_0, id_1, ...); a
    later part starts mid-conversation ("continue"), so only first parts are taken."""
    items = []
    for c in select("sharegpt", "heldout", ReadReport()):
        if c.id.rpartition("_")[2] not in ("0", c.id):
            continue
        first = next((m["content"] for m in c.messages if m["role"] == "user"), "")
        if first.strip() and len(first) <= SHAREGPT_MAX_CHARS:
            items.append(Item(f"sharegpt/{c.id}", (first,)))
    return items


def _turns(record: dict) -> tuple[str, ...]:
    if isinstance(record.get("turns"), list):
        return tuple(record["turns"])
    if isinstance(record.get("prompt"), str):
        return (record["prompt"],)
    if isinstance(record.get("question"), str):  # GSM8K
        return (record["question"],)
    if isinstance(record.get("instruction"), str):  # Alpaca
        extra = record.get("input") or ""
        return (record["instruction"] + (f"\n\n{extra}" if extra else ""),)
    for key, role, content in (("conversations", "from", "value"), ("messages", "role", "content")):
        if isinstance(record.get(key), list):
            return tuple(t[content] for t in record[key] if str(t[role]).lower() in ("user", "human"))
    raise ValueError


def _user_file(source: str) -> list[Item]:
    path = Path(source)
    if path.suffix not in (".jsonl", ".json") or not path.is_file():
        raise InvalidArgumentError(
            f"unknown dataset '{source}': use one of {', '.join(BENCH_DATASETS)} or a .jsonl / .json file "
            "of prompts")
    if path.suffix == ".json":
        records = list(enumerate(json.loads(path.read_text(encoding="utf-8")), start=1))
    else:
        lines = path.read_text(encoding="utf-8").splitlines()
        records = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    items = []
    for number, record in records:
        try:
            record = json.loads(record) if isinstance(record, str) else record
            turns = _turns(record)
            if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
                raise ValueError
        except (ValueError, KeyError, TypeError, AttributeError):
            raise InvalidArgumentError(
                f"{path}: record {number} has no prompt: expected 'turns', 'prompt', 'question' (GSM8K), "
                "'instruction' (Alpaca), 'conversations' or 'messages'") from None
        items.append(Item(str(record.get("id", record.get("question_id", f"{path.stem}/{number}"))), turns))
    return items
