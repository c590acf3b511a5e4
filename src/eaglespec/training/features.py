"""Feature extraction: one target forward per conversation, stored in sharded safetensors files.

Each shard holds, per token: the token id, the loss mask, the target's feature (bf16), the
target's greedy next token (argmax of its logits) and the log-sum-exp of its logits, so the
trainer can form the target's probabilities over any draft vocabulary from the features alone
(every objective of `objectives.py` needs nothing else). With `aux_layers` (EAGLE-3 heads) it
also holds the hidden states entering those three layers, concatenated (`aux_features`, bf16).
Shards are written under a temporary name and renamed when complete; a restart skips them.
Under torchrun, rank r extracts the shards k with k % world_size == r.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from eaglespec.errors import EaglespecError, InvalidArgumentError
from eaglespec.files import atomic_path, check_manifest
from eaglespec.heads.head import check_aux_layers
from eaglespec.models.conversations import HELDOUT_FRACTION, SPLIT_SEED, Conversation, ReadReport
from eaglespec.models.conversations import select as select_conversations
from eaglespec.models.load import Target
from eaglespec.timing import work_seconds
from eaglespec.training.data import render

LOGIT_CHUNK = 256  # rows of LM-head logits computed at once


@dataclass(frozen=True)
class ExtractConfig:
    model: str
    source: str = "sharegpt"
    split: str = "train"  # "train" or "heldout"
    limit: int | None = None  # conversations taken from the split, in file order
    max_len: int = 2048
    heldout_fraction: float = HELDOUT_FRACTION
    seed: int = SPLIT_SEED
    shard_size: int = 32  # conversations per shard
    aux_layers: tuple[int, ...] = ()  # EAGLE-3: also store the hidden states entering these layers
    dtype: str = "bfloat16"  # of the target forward (features are stored in bf16 either way)
    skip: int = 0  # conversations of the split passed over first (slices of a long program)
    answer_tokens: int | None = None  # tokens kept of each answer; a conversation ends at the first one cut


def select(config: ExtractConfig, report: ReadReport) -> list[Conversation]:
    """The conversations an extraction reads (`conversations.select` with its settings)."""
    if config.answer_tokens is not None and config.answer_tokens < 1:
        raise InvalidArgumentError(f"--answer-tokens must be >= 1, got {config.answer_tokens}")
    return select_conversations(config.source, config.split, report, config.limit, config.skip,
                                config.heldout_fraction, config.seed)


@torch.inference_mode()
def target_outputs(target: Target, ids: list[int], aux_layers: tuple[int, ...] = ()) -> dict[str, torch.Tensor]:
    """Features, greedy next tokens and logit log-sum-exps of one sequence (and with `aux_layers`
    the hidden states entering those layers, concatenated)."""
    model = target.model
    tokens = torch.tensor([ids], device=model.weight_like.device)
    last = model.config.num_layers
    _, captured = model(tokens, model.new_cache(len(ids)), last_logits_only=True, capture=(*aux_layers, last))
    aux, hidden = captured[0].split([len(aux_layers) * model.config.hidden_size, model.config.hidden_size], dim=-1)
    features = model.norm(hidden)
    extra = {"aux_features": aux.to(torch.bfloat16).cpu()} if aux_layers else {}
    argmax, lse = [], []
    for chunk in features.split(LOGIT_CHUNK):
        logits = model.lm_head(chunk).float()
        argmax.append(logits.argmax(-1))
        lse.append(torch.logsumexp(logits, -1))
    return {"features": features.to(torch.bfloat16).cpu(), "target_argmax": torch.cat(argmax).int().cpu(),
            "target_lse": torch.cat(lse).cpu(), **extra}


def _write_shard(path: Path, rows: list[dict[str, torch.Tensor]], seconds: float) -> None:
    """One shard, atomically; its metadata keeps the seconds its extraction took (`work_seconds`:
    CPU time per thread on a CPU)."""
    lengths = [len(r["tokens"]) for r in rows]
    tensors = {key: torch.cat([r[key] for r in rows]) for key in rows[0]}
    tensors["offsets"] = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    try:
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata={"seconds": f"{seconds:.3f}"})
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise EaglespecError(
                f"the disk is full while writing {path.name}; finished shards are kept: "
                "free some space and run the same command again to resume"
            ) from None
        raise


def _reuse_shard(earlier: Path, path: Path, rendered: list[tuple[list[int], list[int]]]) -> bool:
    """Link (or copy) an earlier extraction's shard to `path` if it holds exactly these sequences
    (token ids and loss masks, in order); whether it did. (Its recorded seconds stay the earlier
    extraction's.)"""
    if not earlier.is_file() or earlier.stat().st_size == 0:
        return False
    with safe_open(str(earlier), "pt") as shard:
        tokens, masks, offsets = (shard.get_tensor(k).tolist() for k in ("tokens", "loss_mask", "offsets"))
    if [(tokens[a:b], masks[a:b]) for a, b in zip(offsets[:-1], offsets[1:])] != rendered:
        return False
    with atomic_path(path) as tmp:
        try:
            os.link(earlier, tmp)
        except OSError:  # another file system
            shutil.copyfile(earlier, tmp)
    return True


def _sequence_key(tokens: torch.Tensor, loss_mask: torch.Tensor) -> tuple[bytes, bytes]:
    return tokens.numpy().tobytes(), loss_mask.numpy().tobytes()


def _sequences(earlier: Path) -> dict[tuple[bytes, bytes], tuple[Path, int, int]]:
    """An extraction's sequences by (token ids, loss mask): (shard, first row, end row)."""
    found = {}
    for shard in sorted(earlier.glob("shard-*.safetensors")):
        if shard.stat().st_size:
            with safe_open(str(shard), "pt") as f:
                tokens, masks, offsets = f.get_tensor("tokens"), f.get_tensor("loss_mask"), f.get_tensor("offsets")
            for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
                found[_sequence_key(tokens[a:b], masks[a:b])] = (shard, a, b)
    return found


def _read_sequence(shard: Path, a: int, b: int) -> dict[str, torch.Tensor]:
    """One sequence's rows of every per-token tensor of a shard."""
    with safe_open(str(shard), "pt") as f:
        return {key: f.get_slice(key)[a:b] for key in f.keys() if key != "offsets"}


def extract(target: Target, config: ExtractConfig, out: Path, rank: int = 0, world: int = 1,
            reuse: Path | str | None = None) -> dict:
    """Extract the features of a split into `out`; returns a summary. Resumable and idempotent.
    `reuse`: an earlier extraction of the same target (model, dtype, layers) whose shards are taken
    as they are wherever they hold exactly the sequences of this one's (e.g. the first shards of a
    source that has grown since), and whose sequences are copied wherever this one has them
    elsewhere (a mix of sources whose shares changed interleaves them anew)."""
    out = Path(out)
    if reuse is not None:
        found = json.loads((Path(reuse) / "manifest.json").read_text()) if (Path(reuse) / "manifest.json").is_file() else {}
        mine = asdict(config)
        if any(found.get(k) != (list(mine[k]) if k == "aux_layers" else mine[k]) for k in ("model", "dtype", "aux_layers")):
            raise InvalidArgumentError(f"--reuse {reuse}: not an extraction of {config.model} in {config.dtype} "
                                       f"with the same layers; extract without --reuse")
    if config.aux_layers:
        check_aux_layers(config.aux_layers, target.model.config.num_layers)
    report = ReadReport()
    conversations = select(config, report)
    if report.summary():
        print(f"{config.source}: {report.summary()}")
    check_manifest(out, asdict(config), "features", added={"answer_tokens": None})
    shards = math.ceil(len(conversations) / config.shard_size)
    todo = [k for k in range(shards) if k % world == rank and not (out / f"shard-{k:05d}.safetensors").is_file()]
    # ~500 conversations from the whole mix (its sources differ in length; 50 from its start had put
    # SmolLM2's EAGLE-3 mix at 2.97M tokens, against 3.82M extracted, and 500 at 3.87M)
    spread = conversations[::max(1, len(conversations) // 500)]
    sample = [len(render(target.tokenizer, c, config.max_len, config.answer_tokens)[0]) for c in spread]
    per_conversation = sum(sample) / len(sample)
    per_token = 2 * (1 + len(config.aux_layers)) * target.model.config.hidden_size + 4 + 1 + 4 + 4
    estimate = per_conversation * len(conversations)
    print(f"{len(conversations)} conversations in {shards} shards, about {estimate / 1e6:.2f}M tokens, "
          f"about {estimate * per_token / 1e9:.2f} GB on disk at {out}; {len(todo)} shards to do here")
    remaining = sum(len(conversations[k * config.shard_size:(k + 1) * config.shard_size]) for k in todo)
    bar = tqdm(total=int(per_conversation * remaining), unit="tok", unit_scale=True,
               desc=f"extracting {config.split}", disable=rank != 0 or not todo)
    skipped = reused = copied = 0
    earlier = _sequences(Path(reuse)) if reuse is not None else {}
    for k in todo:
        rows, shard_start = [], work_seconds(target.model.weight_like.device)
        rendered = [render(target.tokenizer, c, config.max_len, config.answer_tokens)
                    for c in conversations[k * config.shard_size:(k + 1) * config.shard_size]]
        kept = [(ids, mask) for ids, mask in rendered if sum(mask[1:]) > 0 and len(ids) >= 2]
        skipped += len(rendered) - len(kept)  # nothing to train on after truncation
        bar.update(sum(len(ids) for ids, _ in rendered) - sum(len(ids) for ids, _ in kept))
        name = f"shard-{k:05d}.safetensors"
        if reuse is not None and kept and _reuse_shard(Path(reuse) / name, out / name, kept):
            reused += 1
            bar.update(sum(len(ids) for ids, _ in kept))
            continue
        for ids, mask in kept:
            bar.update(len(ids))
            tokens, loss_mask = torch.tensor(ids, dtype=torch.int32), torch.tensor(mask, dtype=torch.uint8)
            if (found := earlier.get(_sequence_key(tokens, loss_mask))) is not None:
                rows.append(_read_sequence(*found))
                copied += 1
            else:
                rows.append({"tokens": tokens, "loss_mask": loss_mask,
                             **target_outputs(target, ids, config.aux_layers)})
        if rows:
            _write_shard(out / f"shard-{k:05d}.safetensors", rows,
                         work_seconds(target.model.weight_like.device) - shard_start)
        else:
            (out / f"shard-{k:05d}.safetensors").touch()  # an empty shard: nothing to redo
    bar.close()
    return {"conversations": len(conversations), "shards": shards, "skipped_empty": skipped,
            **({"reused_shards": reused, "copied_sequences": copied} if reuse is not None else {})}


class FeatureSet:
    """All conversations of an extracted folder, in shard order: `set[i]` -> dict of tensors."""

    def __init__(self, folder: Path):
        folder = Path(folder)
        files = sorted(folder.glob("shard-*.safetensors"))
        if not (folder / "manifest.json").is_file() or not files:
            raise InvalidArgumentError(f"no extracted features in {folder}: run `eaglespec extract` first")
        self.manifest = json.loads((folder / "manifest.json").read_text())
        files = [f for f in files if f.stat().st_size > 0]
        self.shards = [load_file(str(f)) for f in files]
        self.seconds = 0.0  # what the extraction took (`work_seconds`; shards from before it was recorded: 0)
        for f in files:
            with safe_open(str(f), "pt") as shard:
                self.seconds += float((shard.metadata() or {}).get("seconds", 0))
        self.index = [(s, int(a), int(b)) for s, shard in enumerate(self.shards)
                      for a, b in zip(shard["offsets"][:-1], shard["offsets"][1:])]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        s, a, b = self.index[i]
        return {k: v[a:b] for k, v in self.shards[s].items() if k != "offsets"}

    def tokens(self) -> int:
        return sum(b - a for _, a, b in self.index)
