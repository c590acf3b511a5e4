"""What a training run is set to: `TrainConfig`, one definition of each setting (its default, its
help, its command-line flag: `eaglespec train`'s options are generated from it), the recipe each
head type defaults to, and the loss terms. No torch here, so that the command line starts fast."""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from eaglespec.errors import InvalidArgumentError

TERMS = ("feature", "ce", "accept", "topk")
DEFAULT_LOSS = "feature:1,ce:0.1"  # EAGLE-1's loss


def parse_loss(spec: str) -> dict[str, float]:
    """`name:weight` terms separated by commas (a bare name weighs 1)."""
    terms: dict[str, float] = {}
    for part in spec.split(","):
        name, colon, weight = part.strip().partition(":")
        if name not in TERMS:
            raise InvalidArgumentError(f"unknown loss term '{name}' in '{spec}': use {', '.join(TERMS)} as name:weight")
        try:
            value = float(weight) if colon else 1.0
        except ValueError:
            value = -1.0
        if not value >= 0 or name in terms:
            raise InvalidArgumentError(f"loss '{spec}': each term once, with a weight >= 0 (e.g. ce:0.1)")
        terms[name] = value
    if sum(terms.values()) <= 0:
        raise InvalidArgumentError(f"loss '{spec}': the weights sum to 0, nothing would be trained")
    return terms


def setting(default, help: str, flag: str | None = None, **click_options):
    """A `TrainConfig` field and its command-line option (`eaglespec train` generates its options from
    these: the flag, by default --field-name, its help and any other click settings)."""
    return field(default=default, metadata={"help": help, "flag": flag, **click_options})


# Each head type's defaults: the recipe its shipped heads were trained with (the settings a
# TrainConfig leaves at None, from Python and from the command line alike)
RECIPES = {
    "eagle1": {"lr": 3e-4, "warmup_steps": 10, "loss": DEFAULT_LOSS, "noise": 0.1, "unroll": 3},
    "eagle3": {"lr": 5e-4, "warmup_steps": 20, "loss": "ce", "noise": 0.1, "unroll": 3},
    "medusa": {"lr": 1e-3, "warmup_steps": 10, "loss": "ce", "noise": 0.0, "unroll": 1},
}
HEAD_TYPES = tuple(RECIPES)


def _recipe_help(name: str) -> str:
    return " (default: the head type's recipe, eagle1 / eagle3 / medusa: {})".format(
        " / ".join(str(RECIPES[kind][name]) for kind in RECIPES))


@dataclass
class TrainConfig:
    model: str = setting(None, "The target: bundled model name, Hugging Face folder, or .gguf file.")
    train_dir: str = setting(None, "Training features (a folder from `eaglespec extract`).", "--train-features")
    out: str = setting(None, "Run folder: checkpoints, head/, curves.png, train.toml (the resolved settings).")
    heldout_dir: str | None = setting(None, "Held-out features, scored after each epoch.", "--heldout-features")
    epochs: int = setting(10, "Passes over the training features (an upper bound with --budget-minutes).")
    lr: float | None = setting(None, "Peak learning rate" + _recipe_help("lr") + ".")
    betas: tuple[float, float] = setting((0.9, 0.95), "AdamW's betas, as B1,B2.")
    weight_decay: float = setting(0.0, "AdamW's weight decay.")
    grad_clip: float = setting(0.5, "Gradient norm clipping.")
    warmup_steps: int | None = setting(None, "Steps of linear warmup" + _recipe_help("warmup_steps") + ".")
    batch_conversations: int = setting(8, "Conversations per optimizer step, over all ranks.", "--batch")
    noise: float | None = setting(None, "U(-noise, noise) on input features" + _recipe_help("noise") + ".")
    loss: str | None = setting(None, "Weighted loss terms name:weight: feature (EAGLE-1 regression), ce (soft "
                                     "cross-entropy), accept (-log sum min(p, q)), topk (HASS top-K distillation)"
                               + _recipe_help("loss") + ".")
    unroll: int | None = setting(None, "Draft steps trained per position (the training-time test; 1: EAGLE-1's "
                                       "training)" + _recipe_help("unroll") + ".")
    unroll_decay: float = setting(0.8, "Step i's loss weighs decay**i (Medusa: head i + 1's, Medusa's lambda).")
    early_weight: float = setting(1.0, "Loss weight of the positions among the first --early-tokens of each answer, "
                                       "the ones a short benchmark drafts (1: every position alike).")
    early_tokens: int = setting(128, "Answer positions that --early-weight weighs.")
    head_type: str = setting("eagle1", "The head to train.", "--head-type", choices=HEAD_TYPES)
    medusa_heads: int = setting(4, "Medusa: heads, each one token further ahead.")
    aux_layers: tuple[int, ...] = setting((), "EAGLE-3's target layers, e.g. 2,15,27 (default: 2,N//2,N-3).")
    draft_vocab: int = setting(0, "Reduced draft vocabulary: the N most frequent answer tokens of the training data "
                                  "(0: full; with --init HEAD, 0 keeps the head's and N picks an EAGLE-1 or Medusa "
                                  "head's anew).")
    num_layers: int = setting(1, "Decoder layers of an EAGLE-1 head.", "--layers")
    intermediate_size: int = setting(0, "MLP width of an EAGLE head's decoder layer (0: the target's, or with "
                                        "--init HEAD the head's; a narrower head is smaller to ship and quicker to "
                                        "draft).")
    input_variant: str = setting("feature+shifted-token", "What an EAGLE-1 head reads (the paper's Fig. 8 ablation).",
                                 choices=("feature+shifted-token", "feature+unshifted-token", "feature", "token"))
    init: str = setting("random", "random, target-last-layer (EAGLE-1; EAGLE-3 heads always start their LM head "
                                  "from the target's) or a head folder to continue from (its weights and, unless "
                                  "--draft-vocab N, its draft vocabulary; a fresh optimizer and schedule).")
    device: str = setting("cpu", "cpu or cuda (under torchrun: each process its LOCAL_RANK's GPU).")
    checkpoint_every: int = setting(50, "Steps between checkpoints.")
    light_checkpoint: str | None = setting(None, "Also keep each checkpoint here in small (the head in bf16, no "
                                                 "optimizer state: a file to commit, so a run outlives its machine); "
                                                 "a run whose folder has no checkpoint resumes from it, its optimizer "
                                                 "warming up again.")
    eval_limit: int | None = setting(None, "Held-out conversations scored each epoch (default: all).")
    autocast: bool = setting(True, "bf16 autocast where the device supports it (--no-autocast: fp32).")
    seed: int = setting(0, "Seed of the head's initialization, the batches' order and the noise.")
    budget_minutes: float | None = setting(None, "Train this long in all (over every stretch, evaluations not counted; "
                                                 "on a CPU in CPU time per thread, so other processes do not eat the "
                                                 "budget): the lr decays linearly to 0 at the budget, then the run "
                                                 "evaluates and ends.")
    max_minutes: float | None = setting(None, "Stop after this long in this run; run again to resume.")
    max_steps: int | None = setting(None, "Stop once this many steps are done; run again to resume.")

    def __post_init__(self):
        """Bad options fail here, before any work; the settings left at None take the head type's recipe."""
        for name in ("model", "train_dir", "out"):
            if not getattr(self, name):
                flag = fields_by_name()[name].metadata["flag"] or "--" + name.replace("_", "-")
                raise InvalidArgumentError(f"give {flag} (or {name} in the --config file)")
        if self.head_type not in HEAD_TYPES:
            raise InvalidArgumentError(f"unknown head type '{self.head_type}': use {' or '.join(HEAD_TYPES)}")
        for name, value in RECIPES[self.head_type].items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self.betas, self.aux_layers = tuple(self.betas), tuple(self.aux_layers)
        terms = parse_loss(self.loss)
        if self.unroll < 1:
            raise InvalidArgumentError(f"--unroll must be >= 1 draft steps (1: no training-time test), got {self.unroll}")
        if not 0 < self.unroll_decay <= 1:
            raise InvalidArgumentError(f"--unroll-decay must be in (0, 1], got {self.unroll_decay}")
        if self.head_type == "eagle3":
            if "feature" in terms:
                raise InvalidArgumentError("an EAGLE-3 head predicts no target feature: drop the 'feature' loss "
                                           "term (EAGLE-3 trains on 'ce')")
            if self.init == "target-last-layer" or self.num_layers != 1 or self.input_variant != "feature+shifted-token":
                raise InvalidArgumentError("--init target-last-layer, --layers and --input-variant are EAGLE-1 options")
        elif self.aux_layers:
            raise InvalidArgumentError("--aux-layers is an EAGLE-3 option (EAGLE-1 and Medusa heads read the final feature)")
        if self.intermediate_size < 0 or (self.intermediate_size and (self.head_type == "medusa"
                                                                     or self.init == "target-last-layer")):
            raise InvalidArgumentError(f"--intermediate-size must be >= 0 (0: the target's) and is for EAGLE heads "
                                       f"that do not start from the target's last layer, got {self.intermediate_size}")
        if self.head_type == "medusa" and (self.unroll != 1 or self.init == "target-last-layer"):
            raise InvalidArgumentError("--unroll and --init target-last-layer are EAGLE options: a Medusa head "
                                       "trains each of its --medusa-heads on true features")
        if self.early_weight <= 0 or self.early_tokens < 1:
            raise InvalidArgumentError(f"--early-weight must be > 0 and --early-tokens >= 1, got {self.early_weight} "
                                       f"and {self.early_tokens}")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise InvalidArgumentError(f"--budget-minutes must be > 0, got {self.budget_minutes}")
        if self.init not in ("random", "target-last-layer") and not (Path(self.init) / "config.json").is_file():
            raise InvalidArgumentError(
                f"--init must be 'random', 'target-last-layer' or a head folder to continue from, got '{self.init}'")

    @classmethod
    def from_settings(cls, settings: dict) -> TrainConfig:
        """A config from settings by field name (a --config file's, with the command line's over them)."""
        if unknown := set(settings) - set(fields_by_name()):
            raise InvalidArgumentError(f"unknown training settings {', '.join(sorted(unknown))}: the names are "
                                       f"{', '.join(fields_by_name())}")
        return cls(**settings)

    def toml(self) -> str:
        """The resolved settings as a --config file (`train.toml` in the run folder); None ones left out."""
        lines = ["# the resolved settings of this run: eaglespec train --config train.toml"]
        for name, value in asdict(self).items():
            if value is not None:
                lines.append(f"{name} = {json.dumps(list(value) if isinstance(value, tuple) else value)}")
        return "\n".join(lines) + "\n"

    def same_run(self, other: dict) -> bool:
        """Equal up to the stopping limits and the light checkpoint's place, which may change between
        stretches of one run (a setting added since `other` was saved counts as its default)."""
        limits = ("max_minutes", "max_steps", "light_checkpoint")
        defaults = {f.name: f.default for f in fields(self) if f.default is not MISSING}
        mine = json.loads(json.dumps(asdict(self)))  # tuples as lists, as saved
        theirs = json.loads(json.dumps({**defaults, **other}))
        return {k: v for k, v in mine.items() if k not in limits} == \
            {k: v for k, v in theirs.items() if k not in limits}


def fields_by_name() -> dict:
    return {f.name: f for f in fields(TrainConfig)}
