"""Self-distilled training data: the training conversations answered by the target itself.

Each conversation keeps its user turns (the first `turns` of them; 0 keeps all) and every
assistant turn is replaced by the target's greedy answer to the turns before it, decoded by the
one decoding loop (greedy output is the target's own whatever the drafting method, so `method`
only sets the speed; vanilla is the default, the fastest of vanilla / pld / eagle on a first
8-conversation try on a CPU without bf16 instructions). The result is a dataset folder of gzip'd JSONL
shards (ShareGPT `conversations` records, the original ids kept, so the held-out split is the
same) that `--data` reads like any other source. Shards are written under a temporary name and
renamed when complete; a restart skips finished shards and resumes with the next one.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from eaglespec.errors import InvalidArgumentError
from eaglespec.files import check_manifest, write_json
from eaglespec.models.load import Target
from eaglespec.training.data import Conversation, ReadReport
from eaglespec.training.features import ExtractConfig, select


@dataclass(frozen=True)
class RegenerateConfig:
    model: str
    source: str = "sharegpt"
    split: str = "train"
    limit: int | None = None  # conversations taken from the split, in file order
    turns: int = 1  # user turns kept per conversation (0: all)
    max_new_tokens: int = 512  # per answer
    max_prompt_tokens: int = 1024  # an answer whose prompt is longer ends the conversation there
    method: str = "vanilla"  # drafting method of the loop (greedy output is the same for all)
    heldout_fraction: float = 0.02
    seed: int = 0
    shard_size: int = 64  # conversations per shard
    skip: int = 0  # conversations of the split passed over first (continuing another folder's prompts)

    def __post_init__(self):
        if self.turns < 0:
            raise InvalidArgumentError(f"--turns must be >= 0 (0: all), got {self.turns}")
        if self.max_new_tokens < 1 or self.max_prompt_tokens < 1 or self.shard_size < 1:
            raise InvalidArgumentError("--max-new-tokens, --max-prompt-tokens and --shard-size must be >= 1")


def regenerate_conversation(target: Target, conversation: Conversation, config: RegenerateConfig,
                            method=None) -> tuple[Conversation, int]:
    """The conversation with its assistant turns answered by the target (greedy), and the number
    of tokens generated. Plain-text records are returned as they are."""
    from eaglespec.decoding.generate import chat_ids, generate

    if conversation.text is not None:
        return conversation, 0
    messages: list[dict[str, str]] = []
    users, generated = 0, 0
    for message in conversation.messages:
        if message["role"] == "user":
            users += 1
            if config.turns and users > config.turns:
                break
        if message["role"] == "assistant":
            ids = chat_ids(target, messages)
            if len(ids) > config.max_prompt_tokens:
                break
            out = generate(target, ids, max_new_tokens=config.max_new_tokens, method=method)
            generated += out.new_tokens
            message = {"role": "assistant", "content": out.text}
        messages.append(message)
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    return Conversation(conversation.id, messages), generated


def _record(conversation: Conversation) -> dict:
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    return {"id": conversation.id,
            "conversations": [{"from": names[m["role"]], "value": m["content"]} for m in conversation.messages]}


def _write_shard(path: Path, records: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def _record_progress(out: Path, shard: int, tokens: int, seconds: float, method: str) -> None:
    """Per shard: generated tokens, wall seconds (the CPU hours behind the data) and the drafting method
    (it sets only the speed, so one folder's shards may differ in it)."""
    manifest = out / "manifest.json"
    found = json.loads(manifest.read_text())
    found.setdefault("shards", {})[f"{shard:05d}"] = {"tokens": tokens, "seconds": round(seconds, 1),
                                                       "method": method}
    write_json(found, manifest)


def regenerate(target: Target, config: RegenerateConfig, out: Path, method=None,
               max_minutes: float | None = None) -> dict:
    """Answer the split's conversations with the target into `out` (resumable); returns a summary.
    `max_minutes` stops after the shard that passes it (run again to continue)."""
    out = Path(out)
    split = ExtractConfig(config.model, config.source, config.split, config.limit,
                          heldout_fraction=config.heldout_fraction, seed=config.seed, skip=config.skip)
    conversations = select(split, ReadReport())
    settings = asdict(config)
    del settings["method"]  # not a setting of the answers: every method gives the target's greedy output
    check_manifest(out, settings, "answers", added={"skip": 0})
    shards = -(-len(conversations) // config.shard_size)
    todo = [k for k in range(shards) if not (out / f"part-{k:05d}.jsonl.gz").is_file()]
    print(f"{len(conversations)} conversations in {shards} shards at {out}; {len(todo)} shards to do")
    started = time.monotonic()
    bar = tqdm(total=len(todo) * config.shard_size, unit="conv", desc="regenerating")
    done = 0
    for k in todo:
        shard_start, tokens, records = time.monotonic(), 0, []
        for conversation in conversations[k * config.shard_size:(k + 1) * config.shard_size]:
            answered, generated = regenerate_conversation(target, conversation, config, method)
            tokens += generated
            if answered.text is not None or answered.messages:
                records.append(_record(answered))
            bar.update(1)
            bar.set_postfix(tokens=tokens)
        _write_shard(out / f"part-{k:05d}.jsonl.gz", records)
        _record_progress(out, k, tokens, time.monotonic() - shard_start, config.method)
        done += 1
        if max_minutes is not None and time.monotonic() - started > max_minutes * 60:
            break
    bar.close()
    return {"conversations": len(conversations), "shards": shards, "done_now": done,
            "left": len(todo) - done}
