"""Benchmark prompts from the bundled data sets."""

from __future__ import annotations

import json

from eaglespec.models.fetch import fetch_dataset
from eaglespec.models.registry import DATASETS


def mt_bench(limit: int | None = None) -> list[dict]:
    """MT-bench questions in file order: {"question_id", "category", "turns": [first, second]}."""
    path = fetch_dataset(DATASETS["mt-bench"])
    questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return questions[:limit]
