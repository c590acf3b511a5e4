"""Feature extraction: one target forward per conversation, stored in sharded safetensors files.

Each shard holds, per token: the token id, the loss mask, the target's feature (bf16), the
target's greedy next token (argmax of its logits) and the log-sum-exp of its logits, so the
trainer can form the target's probabilities over any draft vocabulary from the features alone.
Shards are written under a temporary name and renamed when complete; a restart skips them.
Under torchrun, rank r extracts the shards k with k % world_size == r.
"""

from __future__ import annotations

import errno
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from eaglespec.errors import EaglespecError, InvalidArgumentError
from eaglespec.models.load import Target
from eaglespec.training.data import Conversation, ReadReport, is_held_out, read_conversations, render

LOGIT_CHUNK = 256  # rows of LM-head logits computed at once


@dataclass(frozen=True)
class ExtractConfig:
    model: str
    source: str = "sharegpt"
    split: str = "train"  # "train" or "heldout"
    limit: int | None = None  # conversations taken from the split, in file order
    max_len: int = 2048
    heldout_fraction: float = 0.02
    seed: int = 0
    shard_size: int = 32  # conversations per shard
    regenerate: bool = False  # replace assistant turns with the target's own greedy answers (Table 6)
    regenerate_max_tokens: int = 512


def select(config: ExtractConfig, report: ReadReport) -> list[Conversation]:
    held = config.split == "heldout"
    chosen = []
    for conversation in read_conversations(config.source, report):
        if is_held_out(conversation.id, config.heldout_fraction, config.seed) == held:
            chosen.append(conversation)
            if config.limit is not None and len(chosen) >= config.limit:
                break
    if not chosen:
        raise InvalidArgumentError(
            f"the {config.split} split of '{config.source}' has no conversation with an assistant turn; "
            "check the file (see `eaglespec show-data`)"
        )
    return chosen


def _check_manifest(out: Path, config: ExtractConfig) -> None:
    manifest = out / "manifest.json"
    wanted = asdict(config)
    if manifest.is_file():
        found = json.loads(manifest.read_text())
        if found != wanted:
            diff = {k: (found.get(k), v) for k, v in wanted.items() if found.get(k) != v}
            raise InvalidArgumentError(
                f"{out} holds features made with other settings {diff}: use another --out folder"
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    tmp = manifest.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(wanted, indent=2) + "\n")
    os.replace(tmp, manifest)


@torch.inference_mode()
def target_outputs(target: Target, ids: list[int]) -> dict[str, torch.Tensor]:
    """Features, greedy next tokens and logit log-sum-exps of one sequence."""
    model = target.model
    tokens = torch.tensor([ids], device=model.weight_like.device)
    _, features = model(tokens, model.new_cache(len(ids)), last_logits_only=True)
    features = features[0]
    argmax, lse = [], []
    for chunk in features.split(LOGIT_CHUNK):
        logits = model.lm_head(chunk).float()
        argmax.append(logits.argmax(-1))
        lse.append(torch.logsumexp(logits, -1))
    return {"features": features.to(torch.bfloat16).cpu(), "target_argmax": torch.cat(argmax).int().cpu(),
            "target_lse": torch.cat(lse).cpu()}


def regenerate(target: Target, conversation: Conversation, max_new_tokens: int) -> Conversation:
    """The conversation with each assistant turn replaced by the target's greedy answer to the
    turns before it (earlier answers regenerated too), as the paper's target-generated data."""
    from eaglespec.decoding.generate import generate

    if conversation.text is not None:
        return conversation
    messages: list[dict[str, str]] = []
    for message in conversation.messages:
        if message["role"] == "assistant":
            prompt = target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = target.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            message = {"role": "assistant", "content": generate(target, ids, max_new_tokens=max_new_tokens).text}
        messages.append(message)
    return Conversation(conversation.id, messages)


def _write_shard(path: Path, rows: list[dict[str, torch.Tensor]]) -> None:
    lengths = [len(r["tokens"]) for r in rows]
    tensors = {key: torch.cat([r[key] for r in rows]) for key in rows[0]}
    tensors["offsets"] = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        save_file(tensors, str(tmp))
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.errno == errno.ENOSPC:
            raise EaglespecError(
                f"the disk is full while writing {path.name}; finished shards are kept: "
                "free some space and run the same command again to resume"
            ) from None
        raise


def extract(target: Target, config: ExtractConfig, out: Path, rank: int = 0, world: int = 1) -> dict:
    """Extract the features of a split into `out`; returns a summary. Resumable and idempotent."""
    out = Path(out)
    report = ReadReport()
    conversations = select(config, report)
    if report.summary():
        print(f"{config.source}: {report.summary()}")
    _check_manifest(out, config)
    shards = math.ceil(len(conversations) / config.shard_size)
    todo = [k for k in range(shards) if k % world == rank and not (out / f"shard-{k:05d}.safetensors").is_file()]
    sample = [len(render(target.tokenizer, c, config.max_len)[0]) for c in conversations[:50]]
    per_conversation = sum(sample) / len(sample)
    per_token = 2 * target.model.config.hidden_size + 4 + 1 + 4 + 4
    estimate = per_conversation * len(conversations)
    print(f"{len(conversations)} conversations in {shards} shards, about {estimate / 1e6:.2f}M tokens, "
          f"about {estimate * per_token / 1e9:.2f} GB on disk at {out}; {len(todo)} shards to do here")
    remaining = sum(len(conversations[k * config.shard_size:(k + 1) * config.shard_size]) for k in todo)
    bar = tqdm(total=int(per_conversation * remaining), unit="tok", unit_scale=True,
               desc=f"extracting {config.split}", disable=rank != 0)
    skipped = 0
    for k in todo:
        rows = []
        for conversation in conversations[k * config.shard_size:(k + 1) * config.shard_size]:
            if config.regenerate:
                conversation = regenerate(target, conversation, config.regenerate_max_tokens)
            ids, mask = render(target.tokenizer, conversation, config.max_len)
            bar.update(len(ids))
            if sum(mask[1:]) == 0 or len(ids) < 2:  # nothing to train on after truncation
                skipped += 1
                continue
            rows.append({"tokens": torch.tensor(ids, dtype=torch.int32),
                         "loss_mask": torch.tensor(mask, dtype=torch.uint8),
                         **target_outputs(target, ids)})
        if rows:
            _write_shard(out / f"shard-{k:05d}.safetensors", rows)
        else:
            (out / f"shard-{k:05d}.safetensors").touch()  # an empty shard: nothing to redo
    bar.close()
    return {"conversations": len(conversations), "shards": shards, "skipped_empty": skipped}


class FeatureSet:
    """All conversations of an extracted folder, in shard order: `set[i]` -> dict of tensors."""

    def __init__(self, folder: Path):
        folder = Path(folder)
        files = sorted(folder.glob("shard-*.safetensors"))
        if not (folder / "manifest.json").is_file() or not files:
            raise InvalidArgumentError(f"no extracted features in {folder}: run `eaglespec extract` first")
        self.manifest = json.loads((folder / "manifest.json").read_text())
        self.shards = [load_file(str(f)) for f in files if f.stat().st_size > 0]
        self.index = [(s, int(a), int(b)) for s, shard in enumerate(self.shards)
                      for a, b in zip(shard["offsets"][:-1], shard["offsets"][1:])]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        s, a, b = self.index[i]
        return {k: v[a:b] for k, v in self.shards[s].items() if k != "offsets"}

    def tokens(self) -> int:
        return sum(b - a for _, a, b in self.index)
