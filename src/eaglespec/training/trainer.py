"""Training an EAGLE head on extracted features.

loss = SmoothL1(f_hat, f) + 0.1 * CE(softmax(LMHead(f)), log_softmax(LMHead(f_hat))) over assistant
positions, with U(-noise, noise) on the input features; AdamW with warmup then linear decay,
gradient clipping, bf16 autocast where the CPU supports it.

A run folder holds `checkpoint.pt` (head, optimizer, scheduler, data position, history), written atomically every N steps, at each epoch end and on Ctrl-C; the same command
resumes exactly where it stopped. Under torchrun each optimizer step's conversations are split
over the ranks (DistributedDataParallel, gloo on CPU, nccl on GPU); the loss is normalized by the
global count of scored tokens, so K processes compute the same update as one.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from eaglespec.errors import InvalidArgumentError
from eaglespec.heads.checkpoint import save_head
from eaglespec.heads.head import EagleHead
from eaglespec.models.load import load_target
from eaglespec.training.evaluate import evaluate, head_tokens
from eaglespec.training.features import FeatureSet


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
    feature_loss_weight: float = 1.0
    token_loss_weight: float = 0.1
    draft_vocab: int = 0  # 0: the full target vocabulary
    num_layers: int = 1
    input_variant: str = "feature+shifted-token"
    init: str = "random"  # or "target-last-layer"
    checkpoint_every: int = 50
    eval_limit: int | None = None  # held-out conversations scored each epoch
    autocast: bool = True
    seed: int = 0
    max_minutes: float | None = None  # stop (resumable) after this long in this run
    max_steps: int | None = None  # stop (resumable) once this many steps are done

    def same_run(self, other: dict) -> bool:
        """Equal up to the stopping limits, which may change between stretches of one run."""
        limits = ("max_minutes", "max_steps")
        return {k: v for k, v in asdict(self).items() if k not in limits} == \
            {k: v for k, v in other.items() if k not in limits}


@dataclass
class State:
    epoch: int = 0
    batch: int = 0  # next batch within the epoch
    step: int = 0
    history: list[dict] = field(default_factory=list)  # per optimizer step
    evals: list[dict] = field(default_factory=list)  # per epoch
    seconds: float = 0.0  # wall time of the run so far, over all its stretches


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


def conversation_loss(head: EagleHead, sample: dict, config: TrainConfig, generator: torch.Generator,
                      autocast: bool, forward=None) -> tuple[torch.Tensor, int, int]:
    """Summed loss over scored positions, their count, and the draft's top-1 hits among them.

    `forward` runs the head (the DistributedDataParallel wrapper under torchrun; default the head).
    """
    tokens = sample["tokens"].long()
    feats = sample["features"].float()
    scored = sample["loss_mask"][1:].bool()
    inputs, target = feats[:-1], feats[1:]
    if config.noise:
        inputs = inputs + (torch.rand(inputs.shape, generator=generator) * 2 - 1) * config.noise
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        cache = head.new_cache(len(inputs), dtype=torch.bfloat16 if autocast else None)
        predicted = (forward or head)(inputs[None], head_tokens(head, tokens)[None], cache)[0]
        draft_logits = head.logits(predicted)
        with torch.no_grad():
            target_logits = head.logits(target)
    target_p = torch.exp(target_logits.float() - sample["target_lse"][1:, None])
    draft_logits = draft_logits.float()
    token_loss = -(target_p * torch.log_softmax(draft_logits, -1)).sum(-1)
    feature_loss = F.smooth_l1_loss(predicted.float(), target, reduction="none").mean(-1)
    loss = config.feature_loss_weight * feature_loss + config.token_loss_weight * token_loss
    hits = head.to_target(draft_logits.detach().argmax(-1)) == sample["target_argmax"][1:].long()
    return (loss * scored).sum(), int(scored.sum()), int((hits & scored).sum())


def _schedule(config: TrainConfig, total_steps: int):
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - config.warmup_steps))
    return factor


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train(config: TrainConfig, log=print) -> State:
    """Train (or resume) a head; returns the final state. The head is written to `out/head`."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    if config.batch_conversations < world:
        raise InvalidArgumentError(f"batch_conversations ({config.batch_conversations}) must be >= the number of processes ({world})")

    target = load_target(config.model, "float32")
    train_set = FeatureSet(Path(config.train_dir))
    if train_set.manifest["model"] != config.model:
        raise InvalidArgumentError(f"{config.train_dir} holds features of {train_set.manifest['model']}, not {config.model}")
    heldout = FeatureSet(Path(config.heldout_dir)) if config.heldout_dir else None
    vocab = draft_vocabulary(train_set, config.draft_vocab) if config.draft_vocab else None
    torch.manual_seed(config.seed)
    head = EagleHead(target.model.config, config.num_layers, config.input_variant).attach(target.model, vocab)
    if config.init == "target-last-layer":
        head.init_from_target(target.model)
    elif config.init != "random":
        raise InvalidArgumentError(f"init must be 'random' or 'target-last-layer', got '{config.init}'")
    model = torch.nn.parallel.DistributedDataParallel(head) if distributed else head
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    per_epoch = len(train_set) // config.batch_conversations
    if per_epoch == 0:
        raise InvalidArgumentError(f"{len(train_set)} conversations make no batch of {config.batch_conversations}")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config, per_epoch * config.epochs))
    state = State()
    autocast = config.autocast and torch.ops.mkldnn._is_mkldnn_bf16_supported()

    checkpoint = out / "checkpoint.pt"
    if checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False)
        if not config.same_run(saved["config"]):
            raise InvalidArgumentError(f"{checkpoint} was made with other settings: use another --out folder")
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        state = State(**saved["state"])
        log(f"resuming at epoch {state.epoch + 1}, step {state.step}")

    def elapsed() -> float:
        return base_seconds + time.monotonic() - started

    def save() -> None:
        state.seconds = elapsed()
        if rank == 0:
            _atomic_save({"config": asdict(config), "head": head.state_dict(), "optimizer": optimizer.state_dict(),
                          "scheduler": scheduler.state_dict(), "state": asdict(state)}, checkpoint)

    started, base_seconds = time.monotonic(), state.seconds
    bar = tqdm(total=per_epoch * config.epochs, initial=state.step, unit="step", desc="training",
               disable=rank != 0)
    try:
        while state.epoch < config.epochs:
            order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(config.seed + state.epoch))
            while state.batch < per_epoch:
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
                                      "lr": scheduler.get_last_lr()[0]})
                bar.update(1)
                bar.set_postfix(loss=f"{state.history[-1]['loss']:.3f}", top1=f"{state.history[-1]['top1']:.3f}")
                if state.step % config.checkpoint_every == 0:
                    save()
                out_of_time = config.max_minutes and time.monotonic() - started > config.max_minutes * 60
                if out_of_time or (config.max_steps and state.step >= config.max_steps):
                    save()
                    log(f"stopped at step {state.step}; run the same command again to resume")
                    return state
            # the epoch counts as done once evaluated: an interrupted evaluation runs again on resume
            if heldout is not None and rank == 0:
                limit = len(heldout) if config.eval_limit is None else min(config.eval_limit, len(heldout))
                head.eval()
                result = evaluate(head, (heldout[i] for i in range(limit)))
                head.train()
                state.evals.append({"epoch": state.epoch + 1, "step": state.step, **result})
                log(f"epoch {state.epoch + 1}: held-out alpha " + ", ".join(f"{a:.3f}" for a in result["alpha"]))
            state.epoch += 1
            state.batch = 0
            if rank == 0:
                split = {k: train_set.manifest[k] for k in ("source", "max_len", "heldout_fraction", "seed")}
                record = {"split": split, "train": asdict(config), "evals": state.evals,
                          "train_conversations": len(train_set), "train_seconds": round(elapsed())}
                save_head(head, out / "head", config.model, record)
                plot_curves(state, out / "curves.png")
            save()
    except KeyboardInterrupt:
        save()  # the last completed step
        log(f"interrupted: saved step {state.step} to {checkpoint}; run the same command to resume")
        raise
    finally:
        bar.close()
    return state


def plot_curves(state: State, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)
    plt.close(fig)
