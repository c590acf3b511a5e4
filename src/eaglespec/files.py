"""Files written so that an interruption never leaves a half-written one that passes as good:
write to a temporary name next to the target, then rename."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(data: dict, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def save_figure(fig, path: Path) -> None:
    """Save a matplotlib figure as PNG."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, dpi=100, format="png", bbox_inches="tight")
    os.replace(tmp, path)
