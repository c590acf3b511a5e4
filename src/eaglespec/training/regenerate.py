"""Self-distilled training data: the training conversations answered by the target itself.

Each conversation keeps its user turns (the first `turns` of them; 0 keeps all) and every
assistant turn is replaced by the target's greedy answer to the turns before it, decoded by the
one decoding loop (greedy output is the target's own whatever the drafting method, so `method`
only sets the speed; vanilla is the default, the fastest of vanilla / pld / eagle on a first
8-conversation try on a CPU without bf16 instructions). A shard's answers are decoded `batch_size`
at a time (`loop.Scheduler`), which again sets only the speed. The result is a dataset folder of gzip'd JSONL
shards (ShareGPT `conversations` records, the original ids kept, so the held-out split is the
same) that `--data` reads like any other source. Shards are written under a temporary name and
renamed when complete; a restart skips finished shards and resumes with the next one.
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from eaglespec.decoding.generate import chat_ids
from eaglespec.decoding.loop import Request, Row, Scheduler
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.errors import InvalidArgumentError
from eaglespec.files import atomic_path, check_manifest, write_json
from eaglespec.models.conversations import Conversation, ReadReport
from eaglespec.models.load import Target
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


def answer_conversations(target: Target, conversations: list[Conversation], config: RegenerateConfig,
                         method=None, batch_size: int = 1) -> list[tuple[Conversation, int]]:
    """Each conversation with its assistant turns answered by the target (greedy), and the number
    of tokens it generated; plain-text records are returned as they are. The conversations' k-th
    answers are decoded `batch_size` at a time (`loop.Scheduler`: rows join as others finish); a
    row's tokens are the ones it gets alone, so the batch size sets only the speed."""

    messages: list[list[dict[str, str]]] = [[] for _ in conversations]
    generated = [0] * len(conversations)
    at = [0] * len(conversations)  # the next message of each conversation to take
    users = [0] * len(conversations)
    live = [k for k, c in enumerate(conversations) if c.text is None]
    while live:
        asks = []  # (index, prompt ids) of the conversations whose next message is an answer
        for k in live:
            ids = None
            for message in conversations[k].messages[at[k]:]:
                at[k] += 1
                if message["role"] == "user":
                    users[k] += 1
                    if config.turns and users[k] > config.turns:
                        break
                if message["role"] == "assistant":
                    ids = chat_ids(target, messages[k], paragraphs=True)
                    break
                messages[k].append(message)
            if ids is not None and len(ids) <= config.max_prompt_tokens:
                asks.append((k, ids))
        params = SamplingParams(temperature=0.0)
        rows = [Row(target.model, Request(ids, params, config.max_new_tokens, target.eos_token_ids,
                                          method.bind(target, params) if method else None), n)
                for n, (_, ids) in enumerate(asks)]
        if rows:
            scheduler = Scheduler(target.model, sum(sorted(row.slots for row in rows)[-batch_size:]), batch_size)
            for row in rows:
                scheduler.enqueue(row)
            while not scheduler.idle:
                scheduler.step()
        for (k, _), row in zip(asks, rows):
            generated[k] += len(row.tokens)
            messages[k].append({"role": "assistant",
                                "content": target.tokenizer.decode(row.tokens, skip_special_tokens=True)})
        live = [k for k, _ in asks]
    out = []
    for conversation, kept, tokens in zip(conversations, messages, generated):
        if conversation.text is not None:
            out.append((conversation, 0))
            continue
        while kept and kept[-1]["role"] != "assistant":
            kept.pop()
        out.append((Conversation(conversation.id, kept), tokens))
    return out


def _record(conversation: Conversation) -> dict:
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    return {"id": conversation.id,
            "conversations": [{"from": names[m["role"]], "value": m["content"]} for m in conversation.messages]}


def _write_shard(path: Path, records: list[dict]) -> None:
    with atomic_path(path) as tmp, gzip.open(tmp, "wt", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def _record_progress(out: Path, shard: int, tokens: int, seconds: float, method: str, batch_size: int) -> None:
    """Per shard: generated tokens, wall seconds (the CPU hours behind the data), the drafting method
    and the batch size (they set only the speed, so one folder's shards may differ in them)."""
    manifest = out / "manifest.json"
    found = json.loads(manifest.read_text())
    found.setdefault("shards", {})[f"{shard:05d}"] = {"tokens": tokens, "seconds": round(seconds, 1),
                                                       "method": method, "batch_size": batch_size}
    write_json(found, manifest)


def regenerate(target: Target, config: RegenerateConfig, out: Path, method=None,
               max_minutes: float | None = None, batch_size: int = 1) -> dict:
    """Answer the split's conversations with the target into `out` (resumable); returns a summary.
    `max_minutes` stops after the shard that passes it (run again to continue); a shard's answers
    are decoded `batch_size` at a time (the answers do not depend on it)."""
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
        shard_start = time.monotonic()
        answered = answer_conversations(target, conversations[k * config.shard_size:(k + 1) * config.shard_size],
                                        config, method, batch_size)
        tokens = sum(generated for _, generated in answered)
        records = [_record(c) for c, _ in answered if c.text is not None or c.messages]
        bar.update(len(answered))
        bar.set_postfix(tokens=tokens)
        _write_shard(out / f"part-{k:05d}.jsonl.gz", records)
        _record_progress(out, k, tokens, time.monotonic() - shard_start, config.method, batch_size)
        done += 1
        if max_minutes is not None and time.monotonic() - started > max_minutes * 60:
            break
    bar.close()
    return {"conversations": len(conversations), "shards": shards, "done_now": done,
            "left": len(todo) - done}
