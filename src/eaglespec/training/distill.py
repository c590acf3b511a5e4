"""DistillSpec (Zhou et al., 2023), the EAGLE paper's distilled-draft baseline (its Figs. 1-2): a
draft model trained toward the target with the forward KL, KL(target || draft), on the target's next
token distributions over the training data's answer tokens. The draft trains LoRA adapters (rank r
on every linear of its layers, the base weights frozen) or, with rank 0, all of its weights.

It runs in resumable stretches: `budget_minutes` of work per run (CPU time per thread), the learning
rate decaying linearly to 0 over `total_minutes`, a checkpoint every `checkpoint_every` steps and at
the end. Each run scores the held-out conversations (the mean forward KL and how often the draft's
top token is the target's) before and after it. The result, `out/draft`, is a folder that loads
wherever a draft model does (`--draft-model DIR`): an adapter (`adapter_config.json` naming its
base, `adapter.safetensors`) merged into its base at load, or a full model folder."""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from eaglespec.errors import InvalidArgumentError
from eaglespec.files import atomic_path, write_folder, write_json
from eaglespec.models import adapter
from eaglespec.models.conversations import Conversation, ReadReport, with_own_answers
from eaglespec.models.load import load_target, resolve
from eaglespec.training.data import render
from eaglespec.training.features import ExtractConfig, select

LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class DistillConfig:
    teacher: str  # the target
    student: str  # the draft model (the same tokenizer)
    out: str
    data: str = "sharegpt"
    limit: int | None = None  # training conversations (default: all)
    heldout: int = 20  # held-out conversations scored before and after each run
    max_len: int = 1024
    answer_tokens: int | None = None
    lora_rank: int = 16  # 0: all weights
    lora_alpha: float = 32.0
    lr: float = 2e-4
    warmup_steps: int = 10
    batch: int = 4  # conversations per step
    total_minutes: float = 600.0  # the learning rate reaches 0 here (all runs together)
    budget_minutes: float = 60.0  # this run's
    checkpoint_every: int = 10
    seed: int = 0

    def same_run(self, other: dict) -> bool:
        """Whether a checkpoint's config is this run's (the budget of a stretch may change)."""
        keep = {"budget_minutes", "heldout"}
        return {k: v for k, v in asdict(self).items() if k not in keep} == \
            {k: v for k, v in other.items() if k not in keep}


@dataclass
class State:
    step: int = 0
    seen: int = 0  # conversations trained on, all epochs
    seconds: float = 0.0  # work seconds, all runs
    losses: list[float] = field(default_factory=list)  # per step
    scores: list[dict] = field(default_factory=list)  # held-out, per run: before and after


class LoRALinear(torch.nn.Module):
    """A frozen linear plus a trained low-rank update: W x + (alpha / r) B A x, B starting at 0."""

    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_a = torch.nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.lora_b = torch.nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scale


def add_lora(model: torch.nn.Module, rank: int, alpha: float) -> dict[str, LoRALinear]:
    """Every linear of the decoder layers wrapped in a `LoRALinear`, by its module name."""
    model.requires_grad_(False)
    wrapped = {}
    for name, module in list(model.named_modules()):
        for child, linear in list(module.named_children()):
            if child in LORA_MODULES and isinstance(linear, torch.nn.Linear):
                wrapped[f"{name}.{child}"] = LoRALinear(linear, rank, alpha)
                setattr(module, child, wrapped[f"{name}.{child}"])
    if not wrapped:
        raise InvalidArgumentError(f"the draft model has none of the linears LoRA adapts ({', '.join(LORA_MODULES)}); "
                                   "distil all its weights with --lora-rank 0")
    return wrapped


def forward_kl(teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
    """KL(teacher || student) per position, [T]."""
    p = torch.log_softmax(teacher_logits.float(), -1)
    q = torch.log_softmax(student_logits.float(), -1)
    return (p.exp() * (p - q)).sum(-1)


class Distill:
    """One run: the models, the data, the optimizer and the checkpoint to resume from."""

    def __init__(self, config: DistillConfig, log=print):
        from transformers import AutoModelForCausalLM

        self.config, self.log = config, log
        if config.lora_rank < 0 or config.batch < 1 or config.budget_minutes <= 0 or config.total_minutes <= 0:
            raise InvalidArgumentError("--lora-rank must be >= 0, --batch >= 1 and the minutes > 0")
        self.out = Path(config.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.teacher = load_target(config.teacher, "bfloat16")
        self.student_folder = resolve(config.student)
        self.student = AutoModelForCausalLM.from_pretrained(str(self.student_folder), dtype=torch.float32)
        if self.student.config.vocab_size != self.teacher.model.config.vocab_size:
            raise InvalidArgumentError(f"the draft model's vocabulary ({self.student.config.vocab_size} tokens) is not "
                                       f"the target's ({self.teacher.model.config.vocab_size}): pick a draft model of "
                                       "the same family")
        self.lora = add_lora(self.student, config.lora_rank, config.lora_alpha) if config.lora_rank else {}
        self.params = [p for p in self.student.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=0.0)
        self.train_set = self._conversations("train", config.limit)
        self.heldout = self._conversations("heldout", config.heldout)
        self.state = State()
        self.checkpoint = self.out / "checkpoint.pt"
        self._resume()

    def _conversations(self, split: str, limit: int | None) -> list[Conversation]:
        """The split's conversations (the training ones shuffled), rendered as they are used."""
        source, note = with_own_answers(self.config.data, self.config.teacher, split)  # (as `extract`)
        if note:
            self.log(note)
        chosen = select(ExtractConfig(model=self.config.teacher, source=source, split=split, limit=limit), ReadReport())
        if split == "train":
            random.Random(self.config.seed).shuffle(chosen)
        return chosen

    def _rendered(self, conversation: Conversation) -> tuple[Tensor, Tensor] | None:
        """(ids [T], mask [T]: the positions whose next token is an answer token); None without any."""
        ids, mask = render(self.teacher.tokenizer, conversation, self.config.max_len, self.config.answer_tokens)
        return (torch.tensor(ids), torch.tensor(mask[1:] + [0], dtype=torch.bool)) if sum(mask[1:]) else None

    def _resume(self) -> None:
        if not self.checkpoint.is_file():
            return
        saved = torch.load(self.checkpoint, weights_only=False)
        if not self.config.same_run(saved["config"]):
            raise InvalidArgumentError(f"{self.checkpoint} was made with other settings: use another --out folder")
        for p, value in zip(self.params, saved["params"]):
            p.data.copy_(value)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.state = State(**saved["state"])
        self.log(f"resuming at step {self.state.step} ({self.state.seconds / 60:.1f} minutes of work)")

    def _save(self) -> None:
        saved = {"config": asdict(self.config), "params": [p.detach() for p in self.params],
                 "optimizer": self.optimizer.state_dict(), "state": asdict(self.state)}
        with atomic_path(self.checkpoint) as tmp:
            torch.save(saved, tmp)

    def logits(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """The target's and the draft's logits at the conversation's answer positions [N, V] (the
        draft's with gradients where they are on)."""
        with torch.no_grad():
            model = self.teacher.model
            teacher = model(ids[None], model.new_cache(len(ids)))[0][0][mask]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            student = self.student(ids[None]).logits[0][mask]
        return teacher, student

    @torch.no_grad()
    def score(self) -> dict:
        """Held-out mean forward KL and top-1 agreement, over answer positions."""
        kl, agree, positions = 0.0, 0, 0
        for ids, mask in filter(None, map(self._rendered, self.heldout)):
            teacher, student = self.logits(ids, mask)
            kl += forward_kl(teacher, student).sum().item()
            agree += (teacher.argmax(-1) == student.argmax(-1)).sum().item()
            positions += len(teacher)
        positions = max(positions, 1)
        return {"step": self.state.step, "kl": kl / positions, "top1_agreement": agree / positions,
                "positions": positions}

    def _lr(self) -> float:
        c, minutes = self.config, self.state.seconds / 60
        warm = min(1.0, (self.state.step + 1) / c.warmup_steps) if c.warmup_steps else 1.0
        return c.lr * warm * max(0.0, 1 - minutes / c.total_minutes)

    def run(self) -> State:
        from tqdm import tqdm

        from eaglespec.training.trainer import work_seconds

        config, state = self.config, self.state
        self.student.train()
        before = self.score()
        started, base = work_seconds(torch.device("cpu")), state.seconds
        budget = config.budget_minutes * 60
        bar = tqdm(total=round(budget), desc="distilling", unit="s")
        while state.seconds - base < budget and state.seconds < config.total_minutes * 60:
            for group in self.optimizer.param_groups:
                group["lr"] = self._lr()
            total = 0.0
            for i in range(config.batch):
                rendered = self._rendered(self.train_set[(state.seen + i) % len(self.train_set)])
                if rendered is not None:  # (a conversation cut before its first answer token counts, untrained)
                    loss = forward_kl(*self.logits(*rendered)).mean() / config.batch
                    loss.backward()
                    total += loss.item()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            state.step, state.seen = state.step + 1, state.seen + config.batch
            state.losses.append(total)
            now = base + work_seconds(torch.device("cpu")) - started
            bar.update(round(now - state.seconds))
            state.seconds = now
            bar.set_postfix(step=state.step, kl=f"{total:.3f}")
            if state.step % config.checkpoint_every == 0:
                self._save()
        bar.close()
        self.student.eval()
        state.scores.append({"before": before, "after": self.score()})
        self._save()
        self._write_draft()
        write_json({"config": asdict(config), **asdict(state)}, self.out / "log.json")
        return state

    def _write_draft(self) -> None:
        """`out/draft`: the adapter and its config, or the whole model."""
        from safetensors.torch import save_file

        def fill(folder: Path) -> None:
            if self.lora:
                weights = {f"{name}.{part}": getattr(module, part).detach().to(torch.bfloat16).contiguous()
                           for name, module in self.lora.items() for part in ("lora_a", "lora_b")}
                save_file(weights, str(folder / adapter.WEIGHTS))
                (folder / adapter.CONFIG).write_text(json.dumps(
                    {"base": self.config.student, "rank": self.config.lora_rank, "alpha": self.config.lora_alpha,
                     "modules": sorted(self.lora), "teacher": self.config.teacher}, indent=1))
            else:
                self.student.to(torch.bfloat16).save_pretrained(folder)
                self.student.float()
                for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
                    if (self.student_folder / name).is_file():
                        shutil.copy(self.student_folder / name, folder / name)

        write_folder(self.out / "draft", fill)


def distill(config: DistillConfig, log=print) -> State:
    """Run (or resume) a distillation; the draft is written to `out/draft`."""
    started = time.monotonic()
    state = Distill(config, log).run()
    log(f"{config.out}/draft: step {state.step}, held-out forward KL {state.scores[-1]['before']['kl']:.4f} -> "
        f"{state.scores[-1]['after']['kl']:.4f}, top-1 agreement {state.scores[-1]['before']['top1_agreement']:.3f} -> "
        f"{state.scores[-1]['after']['top1_agreement']:.3f} ({(time.monotonic() - started) / 60:.1f} minutes)")
    return state
