"""Training a draft head (EAGLE-1, EAGLE-3 or Medusa) on extracted features.

The loss is a weighted sum of the terms of `objectives.py` over assistant positions (default
EAGLE-1's SmoothL1(f_hat, f) + 0.1 * soft CE), with U(-noise, noise) on the input features.
With `unroll` K > 1 (the training-time test of EAGLE-3 / HASS) every position is drafted for K
steps exactly as chain drafting runs (`DraftHead.unroll`): step i reads the head's own output of
step i-1, and its loss weighs `unroll_decay`**i. A Medusa head's steps are its heads (head i + 1
predicts one token further than head i, from the same true feature), weighted the same way. AdamW with warmup then linear decay, gradient
clipping, bf16 autocast where the device supports it.

A run folder holds `checkpoint.pt` (head, optimizer, scheduler, data position, history), written atomically every N steps, at each epoch end and on Ctrl-C; the same command
resumes exactly where it stopped. Under torchrun each optimizer step's conversations are split
over the ranks (DistributedDataParallel, gloo on CPU, nccl on GPU); the loss is normalized by the
global count of scored tokens, so K processes compute the same update as one.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from eaglespec.errors import InvalidArgumentError
from eaglespec.files import atomic_path, save_figure
from eaglespec.heads.checkpoint import load_head, save_head
from eaglespec.heads.head import HEAD_TYPES, DraftHead, check_aux_layers, make_head
from eaglespec.models.load import load_target
from eaglespec.optional import available, pyplot
from eaglespec.timing import work_seconds
from eaglespec.training.evaluate import evaluate, head_inputs, head_tokens
from eaglespec.training.features import FeatureSet
from eaglespec.training.objectives import DEFAULT_LOSS, parse_loss, position_losses


@dataclass
class TrainConfig:
    model: str
    train_dir: str
    out: str
    heldout_dir: str | None = None
    epochs: int = 10
    lr: float = 3e-5
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    warmup_steps: int = 100
    batch_conversations: int = 8  # per optimizer step, over all ranks
    noise: float = 0.1
    loss: str = DEFAULT_LOSS  # weighted terms of objectives.py
    unroll: int = 1  # K: draft steps trained per position (training-time test); 1 = EAGLE-1's training
    unroll_decay: float = 0.8  # step i's loss weighs unroll_decay ** i
    head_type: str = "eagle1"  # or "eagle3", "medusa"
    medusa_heads: int = 4  # a Medusa head's heads
    aux_layers: tuple[int, ...] = ()  # EAGLE-3's target layers (default: vLLM's 2, N // 2, N - 3)
    draft_vocab: int = 0  # 0: the full target vocabulary (continuing a head: its own); N: the most frequent N
    num_layers: int = 1
    input_variant: str = "feature+shifted-token"
    # "random", "target-last-layer" (EAGLE-1; EAGLE-3 heads always start their LM head from the
    # target's) or a head folder to continue from (its weights and draft vocabulary; a fresh optimizer)
    init: str = "random"
    device: str = "cpu"  # or "cuda" (under torchrun: each process its LOCAL_RANK's GPU)
    checkpoint_every: int = 50
    eval_limit: int | None = None  # held-out conversations scored each epoch
    autocast: bool = True
    seed: int = 0
    budget_minutes: float | None = None  # train this long (all stretches, evaluations excluded): lr decays to 0 at it
    max_minutes: float | None = None  # stop (resumable) after this long in this run
    max_steps: int | None = None  # stop (resumable) once this many steps are done

    def __post_init__(self):
        """Bad options fail here, before any work."""
        terms = parse_loss(self.loss)
        if self.unroll < 1:
            raise InvalidArgumentError(f"--unroll must be >= 1 draft steps (1: no training-time test), got {self.unroll}")
        if not 0 < self.unroll_decay <= 1:
            raise InvalidArgumentError(f"--unroll-decay must be in (0, 1], got {self.unroll_decay}")
        if self.head_type not in HEAD_TYPES:
            raise InvalidArgumentError(f"unknown head type '{self.head_type}': use {' or '.join(HEAD_TYPES)}")
        if self.head_type == "eagle3":
            if "feature" in terms:
                raise InvalidArgumentError("an EAGLE-3 head predicts no target feature: drop the 'feature' loss "
                                           "term (EAGLE-3 trains on 'ce')")
            if self.init == "target-last-layer" or self.num_layers != 1 or self.input_variant != "feature+shifted-token":
                raise InvalidArgumentError("--init target-last-layer, --layers and --input-variant are EAGLE-1 options")
        elif self.aux_layers:
            raise InvalidArgumentError("--aux-layers is an EAGLE-3 option (EAGLE-1 and Medusa heads read the final feature)")
        if self.head_type == "medusa" and (self.unroll != 1 or self.init == "target-last-layer"):
            raise InvalidArgumentError("--unroll and --init target-last-layer are EAGLE options: a Medusa head "
                                       "trains each of its --medusa-heads on true features")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise InvalidArgumentError(f"--budget-minutes must be > 0, got {self.budget_minutes}")
        if self.init not in ("random", "target-last-layer") and not (Path(self.init) / "config.json").is_file():
            raise InvalidArgumentError(
                f"--init must be 'random', 'target-last-layer' or a head folder to continue from, got '{self.init}'")
        self.aux_layers = tuple(self.aux_layers)

    def same_run(self, other: dict) -> bool:
        """Equal up to the stopping limits, which may change between stretches of one run (a
        setting added since `other` was saved counts as its default)."""
        limits = ("max_minutes", "max_steps")
        defaults = {f.name: f.default for f in fields(self) if f.default is not MISSING}
        mine = json.loads(json.dumps(asdict(self)))  # tuples as lists, as saved
        theirs = json.loads(json.dumps({**defaults, **other}))
        return {k: v for k, v in mine.items() if k not in limits} == \
            {k: v for k, v in theirs.items() if k not in limits}


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
    total, scored0, hits = 0.0, 0, 0
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        cache = head.new_cache(sum(max(L - k, 0) for k in range(depth + 1)), dtype=torch.bfloat16 if autocast else None)
        steps = (forward or Unrolled(head))(inputs, tokens, depth, cache)
        for k, predicted in enumerate(steps):
            at = slice(k + 1, k + 1 + len(predicted))  # chain j's step k predicts position j + k + 1
            draft_logits = head.logits(predicted)
            with torch.no_grad():
                target_logits = head.target_logits(final[at])
            losses = position_losses(terms, draft_logits, target_logits, lse[at], predicted, final[at])
            scored = mask[at]
            total = total + config.unroll_decay ** k * (losses * scored).sum()
            if k == 0:
                draft = head.to_target(draft_logits.detach().argmax(-1))
                scored0 = int(scored.sum())
                hits = int(((draft == sample["target_argmax"][1:].long().to(draft.device)) & scored).sum())
    return total, scored0, hits


def _schedule(config: TrainConfig, total_steps: int):
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - config.warmup_steps))
    return factor


def _atomic_save(obj, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def train(config: TrainConfig, log=print) -> State:
    """Train (or resume) a head; returns the final state. The head is written to `out/head`."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed and not dist.is_initialized():
        dist.init_process_group("nccl" if config.device.startswith("cuda") else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    if config.batch_conversations < world:
        raise InvalidArgumentError(f"batch_conversations ({config.batch_conversations}) must be >= the number of processes ({world})")

    device = torch.device(config.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidArgumentError("--device cuda: no CUDA device here (or torch is a CPU build); use --device cpu")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    target = load_target(config.model, "float32", device)
    train_set = FeatureSet(Path(config.train_dir))
    if train_set.manifest["model"] != config.model:
        raise InvalidArgumentError(f"{config.train_dir} holds features of {train_set.manifest['model']}, not {config.model}")
    heldout = FeatureSet(Path(config.heldout_dir)) if config.heldout_dir else None
    start = None if config.init in ("random", "target-last-layer") else load_head(config.init, target)
    if start is not None:
        if start.head_type != config.head_type:
            raise InvalidArgumentError(f"--init {config.init} is an {start.head_type} head; this run trains an "
                                       f"{config.head_type} head: make them agree")
        if config.draft_vocab and start.head_type == "eagle3":
            raise InvalidArgumentError(f"--init {config.init} is an EAGLE-3 head, whose LM head is trained over its own "
                                       f"{start.vocab_size} draft tokens: continue it with --draft-vocab 0")
        if start.head_type == "medusa" and len(start.heads) != config.medusa_heads:
            raise InvalidArgumentError(f"--init {config.init} has {len(start.heads)} Medusa heads; give "
                                       f"--medusa-heads {len(start.heads)}")
    # EAGLE-1 and Medusa heads draft through the target's own LM head, so a continued one's weights
    # carry over to a vocabulary picked anew from this run's data
    vocab = draft_vocabulary(train_set, config.draft_vocab) if config.draft_vocab else \
        (start.draft_vocab if start is not None else None)
    torch.manual_seed(config.seed)
    if config.aux_layers:
        check_aux_layers(config.aux_layers, target.model.config.num_layers)
    head = make_head(target.model.config, config.head_type, num_layers=config.num_layers,
                     input_variant=config.input_variant, aux_layers=config.aux_layers or (start.reads if start else None) or None,
                     draft_vocab_size=len(vocab) if vocab is not None else None,
                     medusa_heads=config.medusa_heads).attach(target.model, vocab)
    for folder, features in ((config.train_dir, train_set), (config.heldout_dir, heldout)):
        extracted = tuple(features.manifest.get("aux_layers", ())) if features else head.reads
        if head.reads and head.reads != extracted:
            raise InvalidArgumentError(
                f"{folder} holds the hidden states of target layers {list(extracted)}, but this EAGLE-3 head "
                f"reads {list(head.reads)}: extract with --aux-layers {','.join(map(str, head.reads))} (or train "
                "with the layers extracted)")
    if start is not None:
        try:
            head.load_state_dict(start.state_dict())
        except RuntimeError:
            raise InvalidArgumentError(f"the head at {config.init} has other shapes or layers than this run's head "
                                       "(--layers, --aux-layers): make them agree") from None
    elif config.init == "target-last-layer" or config.head_type == "eagle3":
        head.init_from_target(target.model)
    model = None
    if distributed:
        ids = [device] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(Unrolled(head), device_ids=ids)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    per_epoch = len(train_set) // config.batch_conversations
    if per_epoch == 0:
        raise InvalidArgumentError(f"{len(train_set)} conversations make no batch of {config.batch_conversations}")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config, per_epoch * config.epochs))
    state = State()
    autocast = config.autocast and (device.type == "cuda" or torch.ops.mkldnn._is_mkldnn_bf16_supported())

    checkpoint = out / "checkpoint.pt"
    if checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False, map_location=device)
        if not config.same_run(saved["config"]):
            raise InvalidArgumentError(f"{checkpoint} was made with other settings: use another --out folder")
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        state = State(**saved["state"])
        log(f"resuming at epoch {state.epoch + 1}, step {state.step}")

    def elapsed() -> float:
        return base_seconds + work_seconds(device) - started

    def training_seconds() -> float:  # what a time budget counts: evaluations excluded
        return elapsed() - state.evaluating

    def save() -> None:
        state.seconds = elapsed()
        if rank == 0:
            _atomic_save({"config": asdict(config), "head": head.state_dict(), "optimizer": optimizer.state_dict(),
                          "scheduler": scheduler.state_dict(), "state": asdict(state)}, checkpoint)

    def budget_step() -> tuple[float, bool]:
        """With a time budget: the lr of the coming step (warmup by steps, then linear decay to 0
        at the budget) and whether the budget is spent; rank 0 decides for all."""
        warm = min(1.0, (state.step + 1) / config.warmup_steps) if config.warmup_steps else 1.0
        left = 1 - training_seconds() / (config.budget_minutes * 60)
        decision = torch.tensor([config.lr * warm * max(left, 0.0), float(left <= 0)], dtype=torch.float64)
        if distributed:
            dist.broadcast(decision, 0)
        return float(decision[0]), bool(decision[1])

    started, base_seconds, wall_start = work_seconds(device), state.seconds, time.monotonic()
    bar = tqdm(total=per_epoch * config.epochs, initial=state.step, unit="step", desc="training",
               disable=rank != 0)
    try:
        while state.epoch < config.epochs and not state.finished:
            order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(config.seed + state.epoch))
            spent = False
            while state.batch < per_epoch:
                if config.budget_minutes:
                    lr, spent = budget_step()
                    if spent:
                        break
                    for group in optimizer.param_groups:
                        group["lr"] = lr
                lr = optimizer.param_groups[0]["lr"]
                ids = order[state.batch * config.batch_conversations:(state.batch + 1) * config.batch_conversations]
                samples = [train_set[int(i)] for i in ids]
                total = sum(int(s["loss_mask"][1:].sum()) for s in samples)
                loss_sum, hits = 0.0, 0
                for n, (i, sample) in enumerate(list(zip(ids.tolist(), samples))[rank::world]):
                    last = n == len(samples[rank::world]) - 1
                    # the noise of a conversation depends on (seed, epoch, conversation) only, so
                    # resuming and any number of processes draw the same noise
                    noise = torch.Generator().manual_seed((config.seed * 1000 + state.epoch) * 10_000_000 + i)
                    with model.no_sync() if distributed and not last else nullcontext():
                        loss, _, hit = conversation_loss(head, sample, config, noise, autocast, model)
                        (loss * world / max(total, 1)).backward()
                    loss_sum += loss.item()
                    hits += hit
                grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                stats = torch.tensor([loss_sum, hits])
                if distributed:
                    dist.all_reduce(stats)
                state.step += 1
                state.batch += 1
                state.history.append({"step": state.step, "loss": float(stats[0]) / max(total, 1),
                                      "top1": float(stats[1]) / max(total, 1), "grad_norm": float(grad_norm),
                                      "lr": lr})
                bar.update(1)
                bar.set_postfix(loss=f"{state.history[-1]['loss']:.3f}", top1=f"{state.history[-1]['top1']:.3f}")
                if state.step % config.checkpoint_every == 0:
                    save()
                out_of_time = config.max_minutes and time.monotonic() - wall_start > config.max_minutes * 60
                if out_of_time or (config.max_steps and state.step >= config.max_steps):
                    save()
                    log(f"stopped at step {state.step}; run the same command again to resume")
                    return state
            if spent and state.batch == 0:  # the budget ran out with the last epoch, evaluated already
                state.finished = True
                save()
                break
            # the epoch (or the budget's last part of one) counts as done once evaluated: an
            # interrupted evaluation runs again on resume
            if heldout is not None and rank == 0:
                limit = len(heldout) if config.eval_limit is None else min(config.eval_limit, len(heldout))
                head.eval()
                before, trained = elapsed(), training_seconds()
                result = evaluate(head, (heldout[i] for i in range(limit)))
                head.train()
                state.evals.append({"epoch": state.epoch + 1, "step": state.step, **result})
                state.eval_seconds.append(round(trained, 1))
                state.evaluating += elapsed() - before
                log(f"epoch {state.epoch + 1}: held-out alpha " + ", ".join(f"{a:.3f}" for a in result["alpha"]))
            state.epoch += 1
            state.batch = 0
            state.finished = spent
            if rank == 0:
                split = {k: train_set.manifest[k] for k in ("source", "max_len", "heldout_fraction", "seed")}
                record = {"split": split, "train": asdict(config), "evals": state.evals,
                          "eval_seconds": state.eval_seconds,
                          "train_conversations": len(train_set), "train_seconds": round(elapsed()),
                          "feature_seconds": round(train_set.seconds, 1)}
                save_head(head, out / "head", config.model, record)
                if available("matplotlib"):
                    plot_curves(state, out / "curves.png")
                else:
                    log("curves.png not drawn (no matplotlib): pip install 'eaglespec[bench]' to draw it")
            save()
    except KeyboardInterrupt:
        save()  # the last completed step
        log(f"interrupted: saved step {state.step} to {checkpoint}; run the same command to resume")
        raise
    finally:
        bar.close()
    return state


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
