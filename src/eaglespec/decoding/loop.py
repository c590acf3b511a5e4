"""The decoding loop. Each round runs one target forward over the round's root token (the last
accepted token, not yet in the cache) and accepts tokens from its logits.

Vanilla decoding is the loop with no proposer: the round verifies the root alone and accepts
one token. Speculative methods attach a draft tree under the root, verify it in the same
forward (tree mask and positions), keep the accepted path in the cache (`KVCache.keep`) and
accept several tokens per round. The prompt minus its last token is prefilled once; the last
prompt token is the first round's root, so every new token comes from a round and
tau = new tokens / target forwards is exactly 1 for vanilla decoding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from eaglespec.decoding.sampling import SamplingParams, next_token
from eaglespec.errors import InvalidArgumentError, PromptTooLongError
from eaglespec.models.decoder import Decoder


@dataclass
class DecodeStats:
    new_tokens: int = 0
    target_forwards: int = 0  # verification forwards; the prefill is not counted
    finish_reason: str = ""  # "eos", "length", "context" or "stop"

    @property
    def tau(self) -> float:
        """Average tokens accepted per target forward (bonus token included)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0


def check_max_new_tokens(max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise InvalidArgumentError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def check_prompt(model: Decoder, prompt_ids: list[int]) -> None:
    context = model.config.max_position_embeddings
    if not prompt_ids:
        raise InvalidArgumentError("the prompt is empty; give at least one token of text")
    if len(prompt_ids) >= context:
        raise PromptTooLongError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context holds {context}; "
            "shorten the prompt"
        )


@torch.inference_mode()
def decode(model: Decoder, prompt_ids: list[int], params: SamplingParams, max_new_tokens: int,
           eos_token_ids: frozenset[int] = frozenset(), stats: DecodeStats | None = None) -> Iterator[list[int]]:
    """Yield the tokens each round accepts, until EOS (included), `max_new_tokens` or the context limit.

    `stats` is filled in as the loop runs; closing the iterator early (stop strings) is allowed.
    """
    check_max_new_tokens(max_new_tokens)
    check_prompt(model, prompt_ids)
    stats = stats if stats is not None else DecodeStats()
    device = model.embed.weight.device
    generator = params.generator(device)
    cache = model.new_cache(min(len(prompt_ids) + max_new_tokens, model.config.max_position_embeddings))
    prompt = torch.tensor([prompt_ids], device=device)
    if len(prompt_ids) > 1:
        model(prompt[:, :-1], cache, last_logits_only=True)
    root = prompt[:, -1:]  # [1, 1]
    while True:
        if cache.length + root.shape[1] > cache.capacity:
            stats.finish_reason = "context"
            return
        logits, _features = model(root, cache)
        stats.target_forwards += 1
        accepted = next_token(logits[:, -1], params, generator).tolist()
        accepted = accepted[: max_new_tokens - stats.new_tokens]
        for i, token in enumerate(accepted):
            if token in eos_token_ids:
                accepted = accepted[: i + 1]
                stats.finish_reason = "eos"
                break
        stats.new_tokens += len(accepted)
        if not stats.finish_reason and stats.new_tokens == max_new_tokens:
            stats.finish_reason = "length"
        yield accepted
        if stats.finish_reason:
            return
        root = torch.tensor([accepted[-1:]], device=device)
