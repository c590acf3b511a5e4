"""Training data: conversations (`models.conversations`) rendered with the target's own chat
template (a base model without one: the turns as plain paragraphs after its BOS), with a loss mask
over assistant tokens."""

from __future__ import annotations

from eaglespec.errors import InvalidArgumentError
from eaglespec.models.conversations import Conversation, as_paragraphs


def render(tokenizer, conversation: Conversation, max_len: int,
           answer_tokens: int | None = None) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 on assistant tokens, including each turn's end-of-turn marker).

    Assistant spans are found by rendering the conversation turn by turn with the chat template:
    the text before turn i with a generation prompt is a prefix of the text through turn i.
    With `answer_tokens`, the conversation ends after that many tokens of the first assistant turn
    that is longer: what a greedy answer cut at that many new tokens would give.
    """
    if conversation.text is not None:
        ids = tokenizer(conversation.text)["input_ids"][:max_len]
        return _cut_answers(ids, [1] * len(ids), answer_tokens)
    msgs = conversation.messages

    def text_of(messages, generation_prompt=False):
        if not tokenizer.chat_template:  # a base model: what it continues is plain text
            return as_paragraphs(tokenizer, messages, generation_prompt)
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    full = text_of(msgs)
    spans = []
    for i, message in enumerate(msgs):
        if message["role"] != "assistant":
            continue
        before, through = text_of(msgs[:i], generation_prompt=True), text_of(msgs[: i + 1])
        if not (through.startswith(before) and full.startswith(through)):
            raise InvalidArgumentError(
                "this chat template does not render conversations turn by turn; "
                "its assistant spans cannot be located"
            )
        spans.append((len(before), len(through)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"][:max_len]
    mask = []
    span = 0
    for start, end in encoded["offset_mapping"][: len(ids)]:
        while span < len(spans) and spans[span][1] <= start:
            span += 1
        inside = span < len(spans) and spans[span][0] <= start and end <= spans[span][1] and end > start
        mask.append(int(inside))
    return _cut_answers(ids, mask, answer_tokens)


def _cut_answers(ids: list[int], mask: list[int], answer_tokens: int | None) -> tuple[list[int], list[int]]:
    """ids and mask up to the `answer_tokens`-th token of the first trained span longer than that."""
    run = 0
    for i, m in enumerate(mask):
        run = run + 1 if m else 0
        if answer_tokens is not None and run > answer_tokens:
            return ids[:i], mask[:i]
    return ids, mask


def show(tokenizer, conversation: Conversation, max_len: int = 4096) -> str:
    """The rendered conversation with trained (assistant) spans marked as [[...]]."""
    ids, mask = render(tokenizer, conversation, max_len)
    out, current = [], []
    state = 0
    for token, m in zip(ids, mask):
        if m != state:
            out.append(tokenizer.decode(current))
            out.append("[[" if m else "]]")
            current, state = [], m
        current.append(token)
    out.append(tokenizer.decode(current))
    if state:
        out.append("]]")
    return "".join(out)
