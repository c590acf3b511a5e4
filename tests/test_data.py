"""Training data: readers, bad lines, chat-template rendering and assistant-only loss masks."""

import json

import pytest

from eaglespec.errors import InvalidArgumentError
from eaglespec.models.conversations import Conversation, ReadReport, is_held_out, read_conversations, read_sharegpt
from eaglespec.training.data import render, show
from eaglespec.training.features import ExtractConfig, select

CHAT = Conversation("c", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello there!"},
                          {"role": "user", "content": "bye"}, {"role": "assistant", "content": "Bye now."}])


def test_mask_covers_exactly_the_assistant_turns(smollm2):
    tok = smollm2.tokenizer
    ids, mask = render(tok, CHAT, 4096)
    trained = tok.decode([t for t, m in zip(ids, mask) if m])
    assert trained == "Hello there!<|im_end|>\nBye now.<|im_end|>\n"
    assert tok.decode(ids) == tok.apply_chat_template(CHAT.messages, tokenize=False)
    assert show(tok, CHAT).count("[[") == 2 and "[[Hello there!<|im_end|>\n]]" in show(tok, CHAT)


def test_a_base_model_trains_on_its_turns_as_plain_paragraphs(smollm2):
    """A tokenizer without a chat template (a base model's): the turns as paragraphs after BOS, the
    loss on the assistant's."""
    import copy

    tok = copy.deepcopy(smollm2.tokenizer)
    tok.chat_template = None
    ids, mask = render(tok, CHAT, 4096)
    assert tok.decode(ids) == (tok.bos_token or "") + "hi\n\nHello there!\n\nbye\n\nBye now."
    assert tok.decode([t for t, m in zip(ids, mask) if m]) == "Hello there!Bye now."


def test_truncation_keeps_mask_aligned(smollm2):
    ids, mask = render(smollm2.tokenizer, CHAT, 10)
    assert len(ids) == len(mask) == 10


def test_answer_cut_ends_the_conversation_at_the_first_long_answer(smollm2):
    tok = smollm2.tokenizer
    ids, mask = render(tok, CHAT, 4096)
    first = mask.index(1)
    cut_ids, cut_mask = render(tok, CHAT, 4096, answer_tokens=2)
    assert cut_ids == ids[:first + 2] and cut_mask == mask[:first + 2] and sum(cut_mask) == 2
    assert render(tok, CHAT, 4096, answer_tokens=1000) == (ids, mask)
    text_ids, text_mask = render(tok, Conversation("t", text="plain text is trained on everywhere"), 4096, 3)
    assert len(text_ids) == 3 and text_mask == [1, 1, 1]
    with pytest.raises(InvalidArgumentError, match="--answer-tokens"):
        select(ExtractConfig("m", answer_tokens=0), ReadReport())


def test_jsonl_formats_and_malformed_lines(tmp_path):
    lines = [
        json.dumps({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}),
        "{not json",
        json.dumps({"messages": [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}),
        json.dumps({"messages": [{"role": "user", "content": "only a question"}]}),
        json.dumps({"something": 1}),
        json.dumps({"text": "plain text is trained on everywhere"}),
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = ReadReport()
    conversations = list(read_conversations(str(path), report))
    assert [c.messages[-1]["content"] if c.messages else c.text for c in conversations] == \
        ["b", "d", "plain text is trained on everywhere"]
    assert report.malformed_lines == [2, 5] and report.without_assistant == 1
    assert "skipped 2 malformed lines: 2, 5" in report.summary()


def test_truncated_sharegpt_array_yields_complete_conversations(tmp_path):
    record = {"id": "x", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    text = json.dumps([record, record | {"id": "y"}])
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) - 30])  # cut inside the second object
    report = ReadReport()
    assert [c.id for c in read_sharegpt(path, report)] == ["x"] and report.truncated_tail


def test_empty_dataset_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "no answer"}]}) + "\n")
    with pytest.raises(InvalidArgumentError, match="no conversation with an assistant turn"):
        select(ExtractConfig("m", str(path)), ReadReport())
    with pytest.raises(InvalidArgumentError, match="no dataset at"):
        select(ExtractConfig("m", str(tmp_path / "missing.jsonl")), ReadReport())


def test_held_out_split_is_fixed_and_seeded():
    ids = [f"conv{i}" for i in range(2000)]
    held = {i for i in ids if is_held_out(i, 0.1, seed=0)}
    assert held == {i for i in ids if is_held_out(i, 0.1, seed=0)}
    assert 120 < len(held) < 280
    assert held != {i for i in ids if is_held_out(i, 0.1, seed=1)}


def test_weighted_sources_mix_in_their_shares(tmp_path):
    import gzip

    for name, n in (("human", 10), ("self", 30)):
        folder = tmp_path / name
        folder.mkdir()
        with gzip.open(folder / "part-00000.jsonl.gz", "wt") as f:  # a folder of shards, as `regenerate` writes
            for i in range(n):
                f.write(json.dumps({"id": f"{name}{i}", "messages": [{"role": "user", "content": "q"},
                                                                     {"role": "assistant", "content": "a"}]}) + "\n")
    spec = f"{tmp_path / 'human'}:1,{tmp_path / 'self'}:3"
    mixed = [c.id for c in select(ExtractConfig(model="", source=spec, limit=8, heldout_fraction=0.0), ReadReport())]
    assert mixed == ["self0", "human0", "self1", "self2", "self3", "human1", "self4", "self5"]
    # no limit: as many as the scarcer source allows at these shares (10 human -> 30 self)
    whole = select(ExtractConfig(model="", source=spec, heldout_fraction=0.0), ReadReport())
    assert len(whole) == 40 and sum(c.id.startswith("human") for c in whole) == 10
    for bad in (f"{tmp_path / 'human'}:x,sharegpt:1", f"{tmp_path / 'human'}:0,sharegpt:0"):
        with pytest.raises(InvalidArgumentError, match="--data"):
            select(ExtractConfig(model="", source=bad), ReadReport())


def test_own_names_the_folders_regenerate_wrote_for_the_model_weighted_by_their_answers(tmp_path):
    """`extract`'s default data, `own:2,sharegpt:1`: `own` is every folder under data/regenerated that
    `eaglespec regenerate` wrote for this target (its manifest says so), each weighted by its
    conversations in the split; without any, the other sources alone and a note saying how to make them."""
    import gzip

    from eaglespec.models.conversations import with_own_answers
    from eaglespec.models.registry import TRAINING_DATA

    for name, model, n in (("m", "m", 30), ("m-more", "m", 10), ("other", "x", 5)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps({"model": model}))
        with gzip.open(folder / "part-00000.jsonl.gz", "wt") as f:
            for i in range(n):
                f.write(json.dumps({"id": f"{name}{i}", "messages": [{"role": "user", "content": "q"},
                                                                     {"role": "assistant", "content": "a"}]}) + "\n")
    spec, note = with_own_answers(TRAINING_DATA, "m", "train", 0.0, 0, tmp_path)
    assert note is None and spec == f"{tmp_path / 'm'}:1.5,{tmp_path / 'm-more'}:0.5,sharegpt:1"
    # the held-out split holds none of them (fraction 0): human answers alone, and why
    spec, note = with_own_answers(TRAINING_DATA, "m", "heldout", 0.0, 0, tmp_path)
    assert spec == "sharegpt:1" and "eaglespec regenerate --model m" in note
    with pytest.raises(InvalidArgumentError, match="no own answers of 'y'"):
        with_own_answers("own", "y", "train", 0.0, 0, tmp_path)
    assert with_own_answers("sharegpt", "m", root=tmp_path) == ("sharegpt", None)
    # the whole mix: two own answers to one human one
    mixed = select(ExtractConfig(model="m", source=with_own_answers(f"own:2,{tmp_path / 'other'}:1", "m", "train", 0.0,
                                                                     0, tmp_path)[0], heldout_fraction=0.0), ReadReport())
    assert len(mixed) == 15 and sum(c.id.startswith("other") for c in mixed) == 5
