"""Files written so that an interruption never leaves a half-written one that passes as good:
write to a temporary name next to the target, then rename."""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from eaglespec.errors import InvalidArgumentError


def json_text(value, depth: int = 0) -> str:
    """JSON indented by structure, with every list of plain values on one line (token ids,
    per-depth figures: one value per line would triple a result file's size)."""
    pad = "  " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(str(k))}: {json_text(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * depth + "}"
    if isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in value):
        return "[\n" + ",\n".join(pad + json_text(v, depth + 1) for v in value) + "\n" + "  " * depth + "]"
    return json.dumps(value)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` (.NAME.tmpPID, in the same folder: the rename never crosses
    file systems) to write the file at; it becomes `path` when the block ends, and is removed if
    the block fails. (The downloads and GGUF copies of gigabytes use a fixed partial name instead,
    which the next run overwrites: a killed process leaves no copy behind.)"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(data: dict, path: Path) -> None:
    write_text(json_text(data) + "\n", path)


def write_text(text: str, path: Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_folder(folder: Path, fill: Callable[[Path], None]) -> None:
    """Make a folder whole or not at all: `fill` writes into a temporary sibling, which then takes
    the folder's place (an older folder of that name is replaced)."""
    folder = Path(folder)
    tmp = folder.parent / f".{folder.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = folder.parent / f".{folder.name}.old{os.getpid()}"
    if folder.exists():
        os.rename(folder, old)
    os.rename(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def save_figure(fig, path: Path, dpi: int = 100) -> None:
    """Save a matplotlib figure as a PNG of at most 256 colours (a third of the full-colour file's
    size, which keeps the committed plots within the tree's size budget; lines and text look the same)."""
    from PIL import Image

    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format="png", bbox_inches="tight")
    with atomic_path(path) as tmp:
        Image.open(buffer).convert("RGB").quantize(256).save(tmp, format="PNG", optimize=True)


def check_manifest(out: Path, wanted: dict, what: str, added: dict | None = None) -> None:
    """A resumable job's folder records its settings in manifest.json: a new folder gets them,
    a folder made with other settings is refused (other keys, e.g. progress, are not compared).
    `added`: settings introduced after folders were made, with the value a folder without them had."""
    manifest = Path(out) / "manifest.json"
    wanted = json.loads(json.dumps(wanted))  # tuples as JSON lists, as read back
    if manifest.is_file():
        found = json.loads(manifest.read_text())
        found = {**(added or {}), **found}
        diff = {k: (found.get(k), v) for k, v in wanted.items() if found.get(k) != v}
        if diff:
            raise InvalidArgumentError(f"{out} holds {what} made with other settings {diff}: use another --out folder")
        return
    write_json(wanted, manifest)
