"""Conversations to train on and to benchmark with: ShareGPT (the bundled file, read object by object
because it is truncated), JSONL of ShareGPT / OpenAI / text records, or plain text; a fixed held-out
split by conversation id; several sources mixed by weight; `own`, the target's own answers."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eaglespec.errors import InvalidArgumentError
from eaglespec.models.fetch import fetch_dataset
from eaglespec.models.registry import DATASETS

OWN_ANSWERS = Path("data") / "regenerated"  # where `own` looks for the folders `eaglespec regenerate` wrote
PARAGRAPH = "\n\n"  # between a conversation's turns, for a base model (no chat template)
HELDOUT_FRACTION = 0.02  # of conversations held out (by id), never trained on
SPLIT_SEED = 0

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
         "bing": "assistant", "assistant": "assistant", "model": "assistant", "system": "system"}


@dataclass
class Conversation:
    id: str
    messages: list[dict[str, str]] = field(default_factory=list)  # {"role", "content"}
    text: str | None = None  # plain text instead of messages: every token is trained on

    @property
    def has_assistant(self) -> bool:
        return self.text is not None or any(m["role"] == "assistant" for m in self.messages)


@dataclass
class ReadReport:
    """What reading skipped, so the user can fix the file."""

    malformed_lines: list[int] = field(default_factory=list)
    without_assistant: int = 0
    truncated_tail: bool = False

    def summary(self) -> str:
        parts = []
        if self.malformed_lines:
            shown = ", ".join(map(str, self.malformed_lines[:10]))
            more = "" if len(self.malformed_lines) <= 10 else f" (and {len(self.malformed_lines) - 10} more)"
            parts.append(f"skipped {len(self.malformed_lines)} malformed lines: {shown}{more}")
        if self.without_assistant:
            parts.append(f"skipped {self.without_assistant} conversations with no assistant turn")
        if self.truncated_tail:
            parts.append("the file ends inside a conversation: the incomplete one was dropped")
        return "; ".join(parts)


def as_paragraphs(tokenizer, messages: list[dict[str, str]], generation_prompt: bool = False) -> str:
    """A conversation as a base model without a chat template reads it: its BOS, then the turns as
    paragraphs (and, for the next turn, the paragraph break before it)."""
    text = (tokenizer.bos_token or "") + PARAGRAPH.join(m["content"] for m in messages)
    return text + (PARAGRAPH if generation_prompt and messages else "")


def _messages(turns: list, role_key: str, content_key: str) -> list[dict[str, str]]:
    out = []
    for turn in turns:
        role = ROLES.get(str(turn[role_key]).lower())
        if role is None or not isinstance(turn[content_key], str):
            raise ValueError(f"unknown role {turn[role_key]!r}")
        out.append({"role": role, "content": turn[content_key]})
    while out and out[0]["role"] == "assistant":  # a reply to nothing: chat templates want a user first
        out.pop(0)
    return out


def parse_record(record: dict, fallback_id: str) -> Conversation:
    """One conversation from a ShareGPT (`conversations`), OpenAI (`messages`) or `text` record."""
    cid = str(record.get("id", fallback_id))
    if "conversations" in record:
        return Conversation(cid, _messages(record["conversations"], "from", "value"))
    if "messages" in record:
        return Conversation(cid, _messages(record["messages"], "role", "content"))
    if isinstance(record.get("text"), str):
        return Conversation(cid, text=record["text"])
    raise ValueError("no 'conversations', 'messages' or 'text' field")


def read_sharegpt(path: Path, report: ReadReport) -> Iterator[Conversation]:
    """Read a JSON array object by object, so a truncated file yields every complete conversation."""
    decoder = json.JSONDecoder()
    text = Path(path).read_text(encoding="utf-8")
    pos = text.index("[") + 1
    index = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            report.truncated_tail = True
            return
        try:
            yield parse_record(record, str(index))
        except (ValueError, KeyError, TypeError):
            report.malformed_lines.append(index + 1)
        index += 1


def read_jsonl(path: Path, report: ReadReport) -> Iterator[Conversation]:
    """JSON Lines, plain or gzip'd (`.jsonl.gz`)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield parse_record(json.loads(line), f"line{number}")
            except (ValueError, KeyError, TypeError, AttributeError):
                report.malformed_lines.append(number)


def read_text(path: Path, report: ReadReport) -> Iterator[Conversation]:
    """Plain text: paragraphs separated by blank lines, grouped into documents of ~4k characters."""
    chunk: list[str] = []
    size = index = 0
    for paragraph in Path(path).read_text(encoding="utf-8").split("\n\n"):
        chunk.append(paragraph)
        size += len(paragraph)
        if size >= 4000:
            yield Conversation(f"text{index}", text="\n\n".join(chunk))
            chunk, size, index = [], 0, index + 1
    if "".join(chunk).strip():
        yield Conversation(f"text{index}", text="\n\n".join(chunk))


def read_conversations(source: str, report: ReadReport) -> Iterator[Conversation]:
    """`sharegpt` (the bundled dataset), or a .json / .jsonl / .txt path. Skips what has no assistant turn."""
    if source == "sharegpt":
        path, reader = fetch_dataset(DATASETS["sharegpt"]), read_sharegpt
    else:
        path = Path(source)
        if path.is_dir():  # a folder of JSONL shards, e.g. from `eaglespec regenerate`
            parts = sorted([*path.glob("part-*.jsonl"), *path.glob("part-*.jsonl.gz")])
            if not parts:
                raise InvalidArgumentError(f"no part-*.jsonl(.gz) shards in the folder '{source}'")
            for part in parts:
                yield from _with_assistant(read_jsonl(part, report), report)
            return
        readers = {".json": read_sharegpt, ".jsonl": read_jsonl, ".gz": read_jsonl, ".txt": read_text}
        if not path.is_file() or path.suffix not in readers or (path.suffix == ".gz" and not path.name.endswith(".jsonl.gz")):
            raise InvalidArgumentError(
                f"no dataset at '{source}': use 'sharegpt', a .json (ShareGPT array), .jsonl or .jsonl.gz "
                "(conversations/messages/text per line) or .txt file, or a folder of part-*.jsonl(.gz) shards"
            )
        reader = readers[path.suffix]
    yield from _with_assistant(reader(path, report), report)


def _with_assistant(conversations: Iterator[Conversation], report: ReadReport) -> Iterator[Conversation]:
    for conversation in conversations:
        if conversation.has_assistant:
            yield conversation
        else:
            report.without_assistant += 1


def is_held_out(conversation_id: str, fraction: float, seed: int) -> bool:
    """A fixed split by conversation: the same id lands on the same side for a given seed."""
    digest = hashlib.sha256(f"{seed}:{conversation_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def parse_sources(spec: str) -> list[tuple[str, float]]:
    """`--data`: one source, or several with weights, `sharegpt:1,data/regenerated/MODEL:1`."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if len(parts) == 1 and parts[0].rpartition(":")[0] == "":
        return [(parts[0], 1.0)]
    sources = []
    for part in parts:
        source, _, weight = part.rpartition(":")
        try:
            value = float(weight)
        except ValueError:
            value = -1.0
        if not source or not value >= 0:
            raise InvalidArgumentError(f"--data '{spec}': give several sources as SOURCE:WEIGHT,SOURCE:WEIGHT with weights >= 0")
        sources.append((source, value))
    if sum(w for _, w in sources) <= 0:
        raise InvalidArgumentError(f"--data '{spec}': the weights sum to 0; give at least one a positive weight")
    return sources


def with_own_answers(spec: str, model: str, split: str = "train", fraction: float = HELDOUT_FRACTION,
                     seed: int = SPLIT_SEED, root: Path = OWN_ANSWERS) -> tuple[str, str | None]:
    """`--data` with `own` (the target's own answers) spelled out: every folder under `root` whose
    manifest says `eaglespec regenerate` wrote it for `model`, each weighted by its conversations in
    the split within own's weight; and a note where there are none (then `own` is left out)."""
    sources = parse_sources(spec)
    if "own" not in (source for source, _ in sources):
        return spec, None
    folders = sorted(path.parent for path in root.glob("*/manifest.json")
                     if json.loads(path.read_text()).get("model") == model)
    held = split == "heldout"
    counts = [sum(is_held_out(c.id, fraction, seed) == held for c in read_conversations(str(folder), ReadReport()))
              for folder in folders]
    note = None
    if not sum(counts):
        note = (f"no own answers of '{model}' in the {split} split under {root}/ (make them with `eaglespec "
                f"regenerate --model {model} --out {root}/{model}`): taking the other sources of '{spec}' alone")
    parts = []
    for source, weight in sources:
        if source == "own":
            parts += [f"{folder}:{weight * n / sum(counts):.6g}" for folder, n in zip(folders, counts) if n]
        else:
            parts.append(f"{source}:{weight:g}")
    if not parts:
        raise InvalidArgumentError(f"--data '{spec}': {note}; and it names no other source")
    return ",".join(parts), note


def _split_of(source: str, split: str, fraction: float, seed: int, report: ReadReport,
              limit: int | None) -> list[Conversation]:
    held = split == "heldout"
    chosen = []
    for conversation in read_conversations(source, report):
        if is_held_out(conversation.id, fraction, seed) == held:
            chosen.append(conversation)
            if limit is not None and len(chosen) >= limit:
                break
    return chosen


def select(source: str, split: str, report: ReadReport, limit: int | None = None, skip: int = 0,
           fraction: float = HELDOUT_FRACTION, seed: int = SPLIT_SEED) -> list[Conversation]:
    """The split's ("train" or "heldout") conversations of `source`, in file order, after the first
    `skip`. With several weighted sources, each gives its share of them (of skip + `limit`, else as
    many as the scarcest source allows), interleaved evenly."""
    if skip < 0 or (limit is not None and limit < 1):
        raise InvalidArgumentError(f"--skip must be >= 0 and --limit >= 1, got {skip} and {limit}")
    sources = [(s, w) for s, w in parse_sources(source) if w > 0]
    total = sum(w for _, w in sources)
    wanted = None if limit is None else skip + limit
    if len(sources) == 1:
        chosen = _split_of(sources[0][0], split, fraction, seed, report, wanted)
    else:
        found = [_split_of(s, split, fraction, seed, report, None) for s, _ in sources]
        n = wanted if wanted is not None else \
            int(min(len(f) * total / w for f, (_, w) in zip(found, sources)))
        counts = [min(len(f), round(n * w / total)) for f, (_, w) in zip(found, sources)]
        # conversation i of a source that gives c sits at (i + 0.5) / c of the mix
        ordered = sorted(((i + 0.5) / c, k, f[i]) for k, (f, c) in enumerate(zip(found, counts)) for i in range(c))
        chosen = [conversation for _, _, conversation in ordered]
    chosen = chosen[skip:]
    if not chosen:
        raise InvalidArgumentError(
            f"the {split} split of '{source}' has no conversation with an assistant turn; "
            "check the file (see `eaglespec show-data`)"
        )
    return chosen
