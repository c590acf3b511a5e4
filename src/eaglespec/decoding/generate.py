"""Text in, text out: prompt rendering, streaming detokenization, stop strings and timing
around the decoding loop."""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

from eaglespec.decoding.loop import (
    DecodeStats,
    check_max_new_tokens,
    check_prompt,
    decode,
)
from eaglespec.decoding.drafters import Method
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.errors import InvalidArgumentError
from eaglespec.models.conversations import as_paragraphs
from eaglespec.models.load import Target


@dataclass
class GenerationOutput:
    text: str
    token_ids: list[int]  # new tokens only, EOS included when generation ended on it
    new_tokens: int
    target_forwards: int  # verification forwards, prefill excluded
    tau: float
    seconds: float  # prefill + decoding, not loading
    tokens_per_s: float
    prompt_tokens: int
    finish_reason: str
    method: str = "vanilla"
    tree: str | None = None  # the draft's shape: an EAGLE tree, sps:K or pld:K
    accepted_lengths: list[int] | None = None  # rounds that accepted 0, 1, 2, ... draft tokens
    acceptance_by_depth: list[float] | None = None  # share of tested draft tokens accepted per depth
    n_alpha: list[float] | None = None  # the same with a chain tree: 0-alpha, 1-alpha, ...
    sources: dict[str, int] | None = None  # accepted draft tokens by source (hybrid)
    prefill_s: float = 0.0  # the prompt through the target (and the proposer's start)
    draft_s: float = 0.0  # drafting, every round
    verify_s: float = 0.0  # target forwards over the drafts, and acceptance
    other_s: float = 0.0  # detokenizing, stop strings, the loop itself

    def to_dict(self) -> dict:
        return asdict(self)


def prompt_ids(target: Target, prompt: str, chat: bool) -> list[int]:
    """Raw text is tokenized as transformers does by default; `chat` renders one user turn."""
    if not chat:
        return target.tokenizer(prompt)["input_ids"]
    return chat_ids(target, [{"role": "user", "content": prompt}])


def chat_ids(target: Target, messages: list[dict[str, str]], paragraphs: bool = False) -> list[int]:
    """A conversation ({"role", "content"} messages) rendered with the chat template, ready for
    the assistant's next turn; with `paragraphs`, a base model's (no chat template) as the turns in
    paragraphs, as its heads train on them (`models.conversations.as_paragraphs`)."""
    tokenizer = target.tokenizer
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    elif paragraphs:
        text = as_paragraphs(tokenizer, messages, generation_prompt=True)
    else:
        raise InvalidArgumentError(f"{target.name} has no chat template; use raw text (drop --chat)")
    return tokenizer(text, add_special_tokens=False)["input_ids"]


MARK_WINDOW = 4  # tokens decoded before a token to find where its text ends (TextStream with origins)


class TextStream:
    """Tokens in, text out as it becomes final: each round's accepted tokens are detokenized with
    all before them, text that may still change (an incomplete UTF-8 sequence, a stop string
    forming) is held back, and the first stop string ends the text (`stopped`; `tokens` keeps the
    fewest tokens that complete it). With each token's origin given, the text comes in pieces
    tagged by the origin of the token that produced them."""

    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1  # a stop string may be forming
        self.tokens: list[int] = []
        self.origins: list[str | None] = []
        self.ends: list[int] = []  # with origins: where token k's text ends
        self.tagged = False  # origins were given
        self.text, self.emitted, self.stopped = "", 0, False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _stop_at(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def add(self, accepted: list[int], origins: list[str] | None = None) -> list[tuple[str, str | None]]:
        """The new final text for a round's tokens: (text, origin) pieces (origin None without origins)."""
        before = len(self.tokens)
        self.tokens += accepted
        self.origins += origins if origins is not None else [None] * len(accepted)
        text = self._decode(self.tokens)
        if origins is not None:
            self.tagged = True
            self._mark(before, text)
        cut = self._stop_at(text)
        if cut is not None:
            # keep the fewest tokens of this round that complete the stop string
            while len(self.tokens) > before + 1 and self._stop_at(self._decode(self.tokens[:-1])) is not None:
                self.tokens.pop()
            del self.origins[len(self.tokens):], self.ends[len(self.tokens):]
            self.text, self.stopped = text[:cut], True
            return self.finish()
        self.text = text
        safe = len(text) - self.hold
        while safe > self.emitted and text[safe - 1] == "\ufffd":  # an incomplete UTF-8 sequence
            safe -= 1
        return self._pieces(safe)

    def finish(self) -> list[tuple[str, str | None]]:
        """The text held back, once no token follows."""
        return self._pieces(len(self.text))

    def _mark(self, before: int, text: str) -> None:
        """Where each of a round's tokens ends in the text: the round's last token where the text
        ends, the others by decoding them after a few tokens before them (enough for the pieces'
        boundaries; the text itself is always decoded whole)."""
        window = self.tokens[max(0, before - MARK_WINDOW):before]
        base = len(self._decode(window).rstrip("\ufffd"))
        last = len(text.rstrip("\ufffd"))
        start = self.ends[-1] if self.ends else 0
        for k in range(before, len(self.tokens) - 1):
            grown = len(self._decode(window + self.tokens[before:k + 1]).rstrip("\ufffd")) - base
            self.ends.append(min(max(start + grown, *self.ends[-1:], 0), last))
        self.ends.append(max(last, *self.ends[-1:], 0))

    def _pieces(self, end: int) -> list[tuple[str, str | None]]:
        start, self.emitted = self.emitted, max(end, self.emitted)
        if end <= start:
            return []
        if not self.tagged:
            return [(self.text[start:end], None)]
        pieces = []
        k = min(bisect.bisect_right(self.ends, start), len(self.tokens) - 1)  # the token the text at start is from
        low = self.ends[k - 1] if k else 0
        for k in range(k, len(self.tokens)):
            high = end if k == len(self.tokens) - 1 else self.ends[k]
            piece, origin = self.text[max(low, start):min(high, end)], self.origins[k]
            if piece and pieces and pieces[-1][1] == origin:
                pieces[-1] = (pieces[-1][0] + piece, origin)
            elif piece:
                pieces.append((piece, origin))
            if high >= end:
                break
            low = high
        return pieces


class Generation:
    """Iterate to stream text deltas as they are produced; `output` is set when done.

    Arguments follow transformers' `generate` names. Temperature 0 is greedy decoding; with
    `do_sample` set, False is greedy and True samples (at temperature 1 if none is given).
    `method` drafts each round (a registered `decoding.drafters` method); None is
    vanilla decoding. Checks its arguments on construction, so bad input fails before any work.
    """

    def __init__(self, target: Target, prompt: str | list[int], *, chat: bool = False,
                 max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int | None = None, stop_strings: Sequence[str] = (),
                 ignore_eos: bool = False, method: Method | None = None, do_sample: bool | None = None):
        if do_sample is not None:
            temperature = (temperature or 1.0) if do_sample else 0.0
        self.params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        check_max_new_tokens(max_new_tokens)
        self.target = target
        self.ids = prompt if isinstance(prompt, list) else prompt_ids(target, prompt, chat)
        check_prompt(target.model, self.ids)
        self.method = method
        self.make_proposer = method.bind(target, self.params) if method else None
        self.max_new_tokens = max_new_tokens
        self.stop = [s for s in stop_strings if s]
        self.eos = frozenset() if ignore_eos else target.eos_token_ids
        self.output: GenerationOutput | None = None
        self.drafter = None  # the last proposer made

    def _proposer(self):
        if self.make_proposer is None:
            return None

        def make(draws, capacity):
            self.drafter = self.make_proposer(draws, capacity)
            return self.drafter

        return make

    def __iter__(self) -> Iterator[str]:
        stats = DecodeStats()
        text = TextStream(self.target.tokenizer, self.stop)
        start = time.perf_counter()
        rounds = decode(self.target.model, self.ids, self.params, self.max_new_tokens, self.eos, stats,
                        self._proposer())
        for accepted in rounds:
            delta = "".join(piece for piece, _ in text.add(accepted))
            if text.stopped:
                stats.finish_reason = "stop"
                stats.new_tokens = len(text.tokens)
                rounds.close()
            if delta:
                yield delta
            if text.stopped:
                break
        seconds = time.perf_counter() - start
        if delta := "".join(piece for piece, _ in text.finish()):
            yield delta
        tokens = text.tokens
        self.output = GenerationOutput(
            text=text.text, token_ids=tokens, new_tokens=len(tokens), target_forwards=stats.target_forwards,
            tau=stats.tau,
            seconds=seconds, tokens_per_s=len(tokens) / seconds if seconds > 0 else 0.0,
            prompt_tokens=len(self.ids), finish_reason=stats.finish_reason,
            method=self.method.name if self.method else "vanilla",
            tree=self.drafter.describe() if self.drafter else None,
            accepted_lengths=stats.accepted_lengths, acceptance_by_depth=stats.acceptance_by_depth(),
            n_alpha=stats.acceptance_by_depth() if self.drafter and self.drafter.shape.chain else None,
            sources=stats.sources or None,
            prefill_s=stats.prefill_s, draft_s=stats.draft_s, verify_s=stats.verify_s,
            other_s=max(seconds - stats.prefill_s - stats.draft_s - stats.verify_s, 0.0),
        )


def generate(target: Target, prompt: str | list[int], **kwargs) -> GenerationOutput:
    """Generate to the end and return the output (keyword arguments as for `Generation`)."""
    generation = Generation(target, prompt, **kwargs)
    for _ in generation:
        pass
    return generation.output
