"""Training a draft head (EAGLE-1, EAGLE-3 or Medusa) on extracted features.

The loss is a weighted sum of the terms of `objectives.py` over assistant positions (default
EAGLE-1's SmoothL1(f_hat, f) + 0.1 * soft CE), with U(-noise, noise) on the input features.
With `unroll` K > 1 (the training-time test of EAGLE-3 / HASS) every position is drafted for K
steps exactly as chain drafting runs (`DraftHead.unroll`): step i reads the head's own output of
step i-1, and its loss weighs `unroll_decay`**i. A Medusa head's steps are its heads (head i + 1
predicts one token further than head i, from the same true feature), weighted the same way. AdamW with warmup then linear decay, gradient
clipping, bf16 autocast where the device supports it.

A run folder holds `checkpoint.pt` (head, optimizer, scheduler, data position, history), written
atomically every N steps, at each epoch end and on Ctrl-C; the same command resumes exactly where it
stopped. A light checkpoint (`light_checkpoint`: the head in bf16, no optimizer state) is a copy small
enough to commit: a run whose folder is lost resumes from it at the same step, data position and
budget, with the optimizer's moments started afresh and the warmup run again. Under torchrun each
optimizer step's conversations are split over the ranks (DistributedDataParallel, gloo on CPU, nccl
on GPU); the loss is normalized by the global count of scored tokens, so K processes compute the
same update as one.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from eaglespec.errors import InvalidArgumentError
from eaglespec.files import atomic_path, save_figure, write_text
from eaglespec.heads.checkpoint import load_head, save_head
from eaglespec.heads.head import DraftHead, check_aux_layers, make_head
from eaglespec.models.load import load_target, torch_device
from eaglespec.optional import available, pyplot
from eaglespec.timing import work_seconds
from eaglespec.training.evaluate import evaluate, head_inputs, head_tokens
from eaglespec.training.features import FeatureSet
from eaglespec.training.config import TrainConfig, parse_loss
from eaglespec.training.objectives import position_losses


@dataclass
class State:
    epoch: int = 0
    batch: int = 0  # next batch within the epoch
    step: int = 0
    history: list[dict] = field(default_factory=list)  # per optimizer step
    evals: list[dict] = field(default_factory=list)  # per epoch
    eval_seconds: list[float] = field(default_factory=list)  # training time (evaluations excluded) at each evaluation
    seconds: float = 0.0  # the run's time so far on its clock (CPU time per thread on a CPU), over all its stretches
    evaluating: float = 0.0  # ... of which in held-out evaluations
    finished: bool = False  # the time budget is spent (and its last evaluation done)
    restarted: int = 0  # the step the optimizer started at (a light checkpoint's): the warmup counts from it


def draft_vocabulary(train: FeatureSet, size: int) -> torch.Tensor:
    """The `size` most frequent target tokens in the assistant turns of the training data."""
    counts = torch.zeros(0, dtype=torch.long)
    for i in range(len(train)):
        s = train[i]
        tokens = s["tokens"][s["loss_mask"].bool()].long()
        if len(tokens):
            counts = torch.nn.functional.pad(counts, (0, max(0, int(tokens.max()) + 1 - len(counts))))
            counts += torch.bincount(tokens, minlength=len(counts))
    if size > len(counts):
        counts = torch.nn.functional.pad(counts, (0, size - len(counts)))
    return torch.topk(counts, size).indices.sort().values


class Unrolled(torch.nn.Module):
    """The head's unrolled chains as one module call, so DistributedDataParallel sees one forward."""

    def __init__(self, head: DraftHead):
        super().__init__()
        self.head = head

    def forward(self, inputs, tokens, depth, cache):
        return self.head.unroll(inputs, tokens, depth, cache)


def conversation_loss(head: DraftHead, sample: dict, config: TrainConfig, generator: torch.Generator,
                      autocast: bool, forward=None) -> tuple[torch.Tensor, int, int]:
    """Summed loss over scored positions (every unrolled step, weighted), the number of scored
    positions of step 0, and the draft's step-0 top-1 hits among them.

    `forward` runs `Unrolled` (the DistributedDataParallel wrapper under torchrun; default the head's).
    """
    terms = parse_loss(config.loss)
    tokens = head_tokens(head, sample["tokens"].long())
    inputs = head_inputs(head, sample).float()
    final = sample["features"].float()
    if config.noise:
        inputs = inputs + (torch.rand(inputs.shape, generator=generator) * 2 - 1) * config.noise
    device_type = head.weight_like.device.type
    L, depth = len(tokens), (len(head.heads) if head.head_type == "medusa" else config.unroll) - 1
    inputs, tokens, final = (t.to(head.weight_like.device) for t in (inputs, tokens, final))
    lse, mask = sample["target_lse"].to(final.device), sample["loss_mask"].bool().to(final.device)
    weights = answer_weights(mask, config.early_weight, config.early_tokens)
    total, scored0, hits = 0.0, 0, 0
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        cache = head.new_cache(sum(max(L - k, 0) for k in range(depth + 1)), dtype=torch.bfloat16 if autocast else None)
        steps = (forward or Unrolled(head))(inputs, tokens, depth, cache)
        with torch.no_grad():  # once for every step: step k's targets are positions k + 1 onwards
            target_logits = head.target_logits(final[1:])
        for k, predicted in enumerate(steps):
            at = slice(k + 1, k + 1 + len(predicted))  # chain j's step k predicts position j + k + 1
            draft_logits = head.logits(predicted)
            losses = position_losses(terms, draft_logits, target_logits[k:k + len(predicted)], lse[at], predicted,
                                     final[at])
            scored = mask[at]
            total = total + config.unroll_decay ** k * (losses * weights[at]).sum()
            if k == 0:
                draft = head.to_target(draft_logits.detach().argmax(-1))
                scored0 = int(scored.sum())
                hits = int(((draft == sample["target_argmax"][1:].long().to(draft.device)) & scored).sum())
    return total, scored0, hits


def answer_weights(mask: torch.Tensor, early_weight: float, early_tokens: int) -> torch.Tensor:
    """Each position's loss weight [L]: 0 outside answers (`mask`), `early_weight` at the first
    `early_tokens` positions of each answer (a run of the mask), 1 after them."""
    weights = mask.float()
    if early_weight == 1:
        return weights
    starts = mask & ~torch.cat([mask.new_zeros(1), mask[:-1]])  # each answer's first position
    answer = torch.cumsum(starts.long(), 0)  # which answer a position belongs to (1-based)
    index = torch.arange(len(mask), device=mask.device)
    first = torch.zeros(int(answer.max()) + 1, dtype=torch.long, device=mask.device)
    first[answer[starts]] = index[starts]
    early = mask & (index - first[answer] < early_tokens)
    return torch.where(early, early_weight * weights, weights)


def _atomic_save(obj, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def train(config: TrainConfig, log=print) -> State:
    """Train (or resume) a head; returns the final state. The head is written to `out/head`."""
    return Run(config, log).run()


class Run:
    """One training run, set up from its config (the target, the features, the head, the optimizer,
    the checkpoint to resume from), then run epoch by epoch, step by step."""

    def __init__(self, config: TrainConfig, log=print):
        self.config, self.log = config, log
        self.distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        if self.distributed and not dist.is_initialized():
            dist.init_process_group("nccl" if config.device.startswith("cuda") else "gloo")
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if self.distributed else (0, 1)
        self.out = Path(config.out)
        self.out.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            write_text(config.toml(), self.out / "train.toml")
        if config.batch_conversations < self.world:
            raise InvalidArgumentError(f"batch_conversations ({config.batch_conversations}) must be >= the number "
                                       f"of processes ({self.world})")
        self.device = self._device()
        target = load_target(config.model, "float32", self.device)
        self.train_set = FeatureSet(Path(config.train_dir))
        if self.train_set.manifest["model"] != config.model:
            raise InvalidArgumentError(f"{config.train_dir} holds features of {self.train_set.manifest['model']}, "
                                       f"not {config.model}")
        self.heldout = FeatureSet(Path(config.heldout_dir)) if config.heldout_dir else None
        self.head = self._head(target)
        self.model = None  # the DistributedDataParallel wrapper under torchrun
        if self.distributed:
            ids = [self.device] if self.device.type == "cuda" else None
            self.model = torch.nn.parallel.DistributedDataParallel(Unrolled(self.head), device_ids=ids)
        self.params = [p for p in self.head.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, betas=config.betas,
                                           weight_decay=config.weight_decay)
        self.per_epoch = len(self.train_set) // config.batch_conversations
        if self.per_epoch == 0:
            raise InvalidArgumentError(f"{len(self.train_set)} conversations make no batch of "
                                       f"{config.batch_conversations}")
        self.state = State()
        total = self.per_epoch * config.epochs  # without a budget the lr decays to 0 at the last epoch's end
        self.lr_factor = lambda step: min(self.warmup(step), max(0.0, (total - step) / max(1, total - config.warmup_steps)))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_factor)
        self.autocast = config.autocast and (self.device.type == "cuda" or torch.ops.mkldnn._is_mkldnn_bf16_supported())
        self.checkpoint = self.out / "checkpoint.pt"
        self._resume()
        self.started, self.base_seconds, self.wall_start = work_seconds(self.device), self.state.seconds, time.monotonic()

    def _device(self) -> torch.device:
        device = torch_device(self.config.device)
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        return device

    def _head(self, target) -> DraftHead:
        """The head to train: new, from the target's last layer, or continued from --init's."""
        config = self.config
        start = None if config.init in ("random", "target-last-layer") else load_head(config.init, target)
        if start is not None:
            if start.head_type != config.head_type:
                raise InvalidArgumentError(f"--init {config.init} is an {start.head_type} head; this run trains an "
                                           f"{config.head_type} head: make them agree")
            if config.draft_vocab and start.head_type == "eagle3":
                raise InvalidArgumentError(f"--init {config.init} is an EAGLE-3 head, whose LM head is trained over "
                                           f"its own {start.vocab_size} draft tokens: continue it with --draft-vocab 0")
            if start.head_type == "medusa" and len(start.heads) != config.medusa_heads:
                raise InvalidArgumentError(f"--init {config.init} has {len(start.heads)} Medusa heads; give "
                                           f"--medusa-heads {len(start.heads)}")
        # EAGLE-1 and Medusa heads draft through the target's own LM head, so a continued one's weights
        # carry over to a vocabulary picked anew from this run's data
        vocab = draft_vocabulary(self.train_set, config.draft_vocab) if config.draft_vocab else \
            (start.draft_vocab if start is not None else None)
        torch.manual_seed(config.seed)
        if config.aux_layers:
            check_aux_layers(config.aux_layers, target.model.config.num_layers)
        head = make_head(target.model.config, config.head_type, num_layers=config.num_layers,
                         input_variant=config.input_variant,
                         intermediate_size=config.intermediate_size or (start.config.intermediate_size if start else None),
                         aux_layers=config.aux_layers or (start.reads if start else None) or None,
                         draft_vocab_size=len(vocab) if vocab is not None else None,
                         medusa_heads=config.medusa_heads).attach(target.model, vocab)
        for folder, features in ((config.train_dir, self.train_set), (config.heldout_dir, self.heldout)):
            extracted = tuple(features.manifest.get("aux_layers", ())) if features else head.reads
            if head.reads and head.reads != extracted:
                raise InvalidArgumentError(
                    f"{folder} holds the hidden states of target layers {list(extracted)}, but this EAGLE-3 head "
                    f"reads {list(head.reads)}: extract with --aux-layers {','.join(map(str, head.reads))} (or "
                    "train with the layers extracted)")
        if start is not None:
            try:
                head.load_state_dict(start.state_dict())
            except RuntimeError:
                raise InvalidArgumentError(f"the head at {config.init} has other shapes or layers than this run's "
                                           "head (--layers, --aux-layers, --intermediate-size): make them agree") from None
        elif config.init == "target-last-layer" or config.head_type == "eagle3":
            head.init_from_target(target.model)
        return head

    def _resume(self) -> None:
        path, light = self.checkpoint, self.config.light_checkpoint
        if not path.is_file() and light:
            path = Path(light)
        if not path.is_file():
            return
        saved = torch.load(path, weights_only=False, map_location=self.device)
        if not self.config.same_run(saved["config"]):
            raise InvalidArgumentError(f"{path} was made with other settings: use another --out folder")
        self.head.load_state_dict(saved["head"])  # a light checkpoint's bf16 weights into the fp32 head
        self.state = State(**saved["state"])
        self.scheduler.load_state_dict(saved["scheduler"])
        if saved["optimizer"] is not None:
            self.optimizer.load_state_dict(saved["optimizer"])
        else:  # a fresh optimizer: the coming step's lr from the warmup run again
            for group in self.optimizer.param_groups:
                group["lr"] = self.config.lr * self.lr_factor(self.state.step)
        self.log(f"resuming at epoch {self.state.epoch + 1}, step {self.state.step}" + (
            "" if saved["optimizer"] is not None else
            f" from the light checkpoint {path} (the optimizer starts afresh: warmup of {self.config.warmup_steps} steps)"))

    def warmup(self, step: int) -> float:
        """The lr's linear warmup factor at `step`, counted from the step the optimizer started at."""
        steps = self.config.warmup_steps
        return min(1.0, (step - self.state.restarted + 1) / steps) if steps else 1.0

    def elapsed(self) -> float:
        return self.base_seconds + work_seconds(self.device) - self.started

    def training_seconds(self) -> float:
        """What a time budget counts: evaluations excluded."""
        return self.elapsed() - self.state.evaluating

    def save(self) -> None:
        self.state.seconds = self.elapsed()
        if self.rank != 0:
            return
        saved = {"config": asdict(self.config), "head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "state": asdict(self.state)}
        _atomic_save(saved, self.checkpoint)
        if self.config.light_checkpoint:
            head = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in saved["head"].items()}
            _atomic_save({**saved, "head": head, "optimizer": None,
                          "state": {**saved["state"], "restarted": self.state.step}}, Path(self.config.light_checkpoint))

    def budget_step(self) -> tuple[float, bool]:
        """With a time budget: the lr of the coming step (warmup by steps, then linear decay to 0
        at the budget) and whether the budget is spent; rank 0 decides for all."""
        config = self.config
        left = 1 - self.training_seconds() / (config.budget_minutes * 60)
        decision = torch.tensor([config.lr * self.warmup(self.state.step) * max(left, 0.0), float(left <= 0)],
                                dtype=torch.float64)
        if self.distributed:
            dist.broadcast(decision, 0)
        return float(decision[0]), bool(decision[1])

    def run(self) -> State:
        config, state = self.config, self.state
        if config.budget_minutes:  # the budget ends the run, not the epochs: the bar counts its minutes
            bar = tqdm(total=config.budget_minutes, initial=min(self.training_seconds() / 60, config.budget_minutes),
                       desc="training (budget)", disable=self.rank != 0,
                       bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.4g}/{total:g} min [{elapsed}<{remaining}{postfix}]")
        else:
            bar = tqdm(total=self.per_epoch * config.epochs, initial=state.step, unit="step", desc="training",
                       disable=self.rank != 0)
        try:
            while state.epoch < config.epochs and not state.finished:
                order = torch.randperm(len(self.train_set),
                                       generator=torch.Generator().manual_seed(config.seed + state.epoch))
                spent = False
                while state.batch < self.per_epoch:
                    if config.budget_minutes:
                        lr, spent = self.budget_step()
                        if spent:
                            break
                        for group in self.optimizer.param_groups:
                            group["lr"] = lr
                    self.step(order)
                    bar.update(min(self.training_seconds() / 60, bar.total) - bar.n if config.budget_minutes else 1)
                    bar.set_postfix(step=state.step, loss=f"{state.history[-1]['loss']:.3f}",
                                    top1=f"{state.history[-1]['top1']:.3f}")
                    if state.step % config.checkpoint_every == 0:
                        self.save()
                    out_of_time = config.max_minutes and time.monotonic() - self.wall_start > config.max_minutes * 60
                    if out_of_time or (config.max_steps and state.step >= config.max_steps):
                        self.save()
                        self.log(f"stopped at step {state.step}; run the same command again to resume")
                        return state
                if spent and state.batch == 0:  # the budget ran out with the last epoch, evaluated already
                    state.finished = True
                    self.save()
                    break
                self.end_epoch(spent)
        except KeyboardInterrupt:
            self.save()  # the last completed step
            self.log(f"interrupted: saved step {state.step} to {self.checkpoint}; run the same command to resume")
            raise
        finally:
            bar.close()
        if self.rank == 0 and not (self.out / "head" / "config.json").is_file():
            self.write_head()  # a finished run resumed from its light checkpoint, its folder lost
        return state

    def step(self, order: torch.Tensor) -> None:
        """One optimizer step over the epoch's next batch of conversations (this rank's share of it)."""
        config, state, rank, world = self.config, self.state, self.rank, self.world
        lr = self.optimizer.param_groups[0]["lr"]
        ids = order[state.batch * config.batch_conversations:(state.batch + 1) * config.batch_conversations]
        samples = [self.train_set[int(i)] for i in ids]
        total = sum(int(s["loss_mask"][1:].sum()) for s in samples)
        loss_sum, hits = 0.0, 0
        for n, (i, sample) in enumerate(list(zip(ids.tolist(), samples))[rank::world]):
            last = n == len(samples[rank::world]) - 1
            # the noise of a conversation depends on (seed, epoch, conversation) only, so resuming and
            # any number of processes draw the same noise
            noise = torch.Generator().manual_seed((config.seed * 1000 + state.epoch) * 10_000_000 + i)
            with self.model.no_sync() if self.distributed and not last else nullcontext():
                loss, _, hit = conversation_loss(self.head, sample, config, noise, self.autocast, self.model)
                (loss * world / max(total, 1)).backward()
            loss_sum += loss.item()
            hits += hit
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        stats = torch.tensor([loss_sum, hits])
        if self.distributed:
            dist.all_reduce(stats)
        state.step += 1
        state.batch += 1
        state.history.append({"step": state.step, "loss": float(stats[0]) / max(total, 1),
                              "top1": float(stats[1]) / max(total, 1), "grad_norm": float(grad_norm), "lr": lr})

    def end_epoch(self, spent: bool) -> None:
        """The epoch (or the budget's last part of one) counts as done once evaluated, the head
        written and the checkpoint saved: an interrupted evaluation runs again on resume."""
        config, state = self.config, self.state
        if self.heldout is not None and self.rank == 0:
            limit = len(self.heldout) if config.eval_limit is None else min(config.eval_limit, len(self.heldout))
            self.head.eval()
            before, trained = self.elapsed(), self.training_seconds()
            result = evaluate(self.head, (self.heldout[i] for i in range(limit)))
            self.head.train()
            state.evals.append({"epoch": state.epoch + 1, "step": state.step, **result})
            state.eval_seconds.append(round(trained, 1))
            state.evaluating += self.elapsed() - before
            self.log(f"epoch {state.epoch + 1}: held-out alpha " + ", ".join(f"{a:.3f}" for a in result["alpha"]))
        state.epoch += 1
        state.batch = 0
        state.finished = spent
        if self.rank == 0:
            self.write_head()
        self.save()

    def write_head(self) -> None:
        """The head as it stands, with its record, to out/head, and the curves to out/curves.png."""
        config, state = self.config, self.state
        split = {k: self.train_set.manifest[k] for k in ("source", "max_len", "heldout_fraction", "seed")}
        record = {"split": split, "train": asdict(config), "evals": state.evals,
                  "eval_seconds": state.eval_seconds, "train_conversations": len(self.train_set),
                  "train_seconds": round(self.elapsed()), "feature_seconds": round(self.train_set.seconds, 1)}
        save_head(self.head, self.out / "head", config.model, record)
        if available("matplotlib"):
            plot_curves(state, self.out / "curves.png")
        else:
            self.log("curves.png not drawn (no matplotlib): pip install 'eaglespec[bench]' to draw it")


def plot_curves(state: State, path: Path) -> None:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [h["step"] for h in state.history]
    window = max(1, len(steps) // 50)
    smooth = lambda xs: [sum(xs[max(0, i - window + 1):i + 1]) / len(xs[max(0, i - window + 1):i + 1])
                         for i in range(len(xs))]
    a.plot(steps, smooth([h["loss"] for h in state.history]))
    a.set_xlabel("step")
    a.set_ylabel("training loss")
    a.grid(alpha=0.3)
    b.plot(steps, smooth([h["top1"] for h in state.history]), label="train top-1 (true features)")
    for n in range(len(state.evals[0]["alpha"]) if state.evals else 0):
        b.plot([e["step"] for e in state.evals], [e["alpha"][n] for e in state.evals], marker="o",
               label=f"held-out {n}-alpha")
    b.set_xlabel("step")
    b.set_ylabel("agreement with the target's greedy token")
    b.grid(alpha=0.3)
    b.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
