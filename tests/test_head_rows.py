"""The head's cache shared by rows that draft together (head_rows.py): a row's outputs and draft
logits in a batch, with other rows' entries interleaved, after a row left and after the cache
grew, are exactly the ones it gets alone (fp32, the shipped SmolLM2 head)."""

import torch

from eaglespec.decoding.head_rows import HeadCall, HeadEntries, HeadRows


def catch_up(entries: HeadEntries, features: torch.Tensor, tokens: torch.Tensor, last_only: bool = True) -> HeadCall:
    start = entries.length
    return HeadCall(entries, features, tokens, torch.arange(start, start + len(tokens)), None, last_only)


def draft(entries: HeadEntries, committed: int, features: torch.Tensor, tokens: torch.Tensor) -> HeadCall:
    """Two sibling draft entries under the root: each sees the committed entries and itself."""
    start = entries.length
    mask = torch.zeros(2, start + 2, dtype=torch.bool)
    mask[:, :committed] = True
    mask[0, start] = mask[1, start + 1] = True
    return HeadCall(entries, features, tokens, torch.full((2,), committed), mask)


@torch.inference_mode()
def test_rows_drafting_together_get_what_they_get_alone(shipped):
    torch.manual_seed(0)
    H = shipped.config.hidden_size
    rounds = [[(torch.randn(n, H), torch.randint(0, 1000, (n,))) for n in sizes] for sizes in ([5, 3, 7], [2, 1, 3], [1, 2, 2])]
    drafts = [(torch.randn(2, H), torch.randint(0, 1000, (2,))) for _ in range(3)]

    def run_all(calls: list[HeadCall]) -> list:
        """Each cache's calls in one run (alone: one cache per row)."""
        results = {}
        for rows in {id(call.entries.rows): call.entries.rows for call in calls}.values():
            mine = [call for call in calls if call.entries.rows is rows]
            results.update(zip(map(id, mine), rows.run(mine)))
        return [results[id(call)] for call in calls]

    def play(rows: list[HeadEntries], leaving: HeadRows | None) -> dict:
        got = {}
        for r, entries in enumerate(rounds):
            live = [i for i in range(3) if rows[i].rows is not None]
            for i, result in zip(live, run_all([catch_up(rows[i], *entries[i]) for i in live])):
                got[i, r, "catch-up"] = result
            committed = {i: rows[i].length for i in live}
            for i, result in zip(live, run_all([draft(rows[i], committed[i], *drafts[i]) for i in live])):
                got[i, r, "draft"] = result
            for i in live:
                rows[i].truncate(committed[i])  # drop the draft entries
            if leaving is not None and r == 0:
                leaving.remove(rows[1])  # the middle row leaves: the others' entries move down
        return got

    alone_rows = [HeadEntries(shipped) for _ in range(3)]
    for entries in alone_rows:
        HeadRows(shipped).add(entries)
    alone = play(alone_rows, None)

    shared = HeadRows(shipped, capacity=8)  # grows as the rows fill it
    together_rows = [HeadEntries(shipped) for _ in range(3)]
    for entries in together_rows:
        shared.add(entries)
    together = play(together_rows, shared)

    assert shared.cache.capacity > 8
    assert set(together) <= set(alone) and len(together) == 3 * 3 * 2 - 2 * 2
    for key, (out, logits) in together.items():
        assert torch.equal(out, alone[key][0]) and torch.equal(logits, alone[key][1]), key
    assert together_rows[1].rows is None  # its slots were reclaimed: the others' fill a prefix of the cache
    assert sorted(together_rows[0].slots + together_rows[2].slots) == list(range(together_rows[0].length + together_rows[2].length))
