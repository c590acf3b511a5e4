"""Training data: conversations from ShareGPT, user JSONL or plain text, rendered with the
target's own chat template, with a loss mask over assistant tokens and a fixed held-out split.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eaglespec.errors import InvalidArgumentError

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
        from eaglespec.models.fetch import fetch_dataset
        from eaglespec.models.registry import DATASETS

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


def render(tokenizer, conversation: Conversation, max_len: int,
           answer_tokens: int | None = None) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 on assistant tokens, including each turn's end-of-turn marker).

    Assistant spans are found by rendering the conversation turn by turn with the chat template:
    the text before turn i with a generation prompt is a prefix of the text through turn i.
    With `answer_tokens`, the conversation ends after that many tokens of the first assistant turn
    that is longer: what a greedy answer cut at that many new tokens would give.
    """
    if conversation.text is not None:
        ids = tokenizer(conversation.text)["input_ids"][:max_len]
        return _cut_answers(ids, [1] * len(ids), answer_tokens)
    msgs = conversation.messages

    def text_of(messages, generation_prompt=False):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    full = text_of(msgs)
    spans = []
    for i, message in enumerate(msgs):
        if message["role"] != "assistant":
            continue
        before, through = text_of(msgs[:i], generation_prompt=True), text_of(msgs[: i + 1])
        if not (through.startswith(before) and full.startswith(through)):
            raise InvalidArgumentError(
                "this chat template does not render conversations turn by turn; "
                "its assistant spans cannot be located"
            )
        spans.append((len(before), len(through)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"][:max_len]
    mask = []
    span = 0
    for start, end in encoded["offset_mapping"][: len(ids)]:
        while span < len(spans) and spans[span][1] <= start:
            span += 1
        inside = span < len(spans) and spans[span][0] <= start and end <= spans[span][1] and end > start
        mask.append(int(inside))
    return _cut_answers(ids, mask, answer_tokens)


def _cut_answers(ids: list[int], mask: list[int], answer_tokens: int | None) -> tuple[list[int], list[int]]:
    """ids and mask up to the `answer_tokens`-th token of the first trained span longer than that."""
    run = 0
    for i, m in enumerate(mask):
        run = run + 1 if m else 0
        if answer_tokens is not None and run > answer_tokens:
            return ids[:i], mask[:i]
    return ids, mask


def show(tokenizer, conversation: Conversation, max_len: int = 4096) -> str:
    """The rendered conversation with trained (assistant) spans marked as [[...]]."""
    ids, mask = render(tokenizer, conversation, max_len)
    out, current = [], []
    state = 0
    for token, m in zip(ids, mask):
        if m != state:
            out.append(tokenizer.decode(current))
            out.append("[[" if m else "]]")
            current, state = [], m
        current.append(token)
    out.append(tokenizer.decode(current))
    if state:
        out.append("]]")
    return "".join(out)
