"""The repository's own limits, checked where it is a git checkout (CI's clean clone): the tracked
tree stays under 100 MiB, shipped heads included, and the README, the front door, under 250 lines."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tracked_files() -> list[Path]:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / name for name in done.stdout.decode().split("\0") if name]


def test_the_tracked_tree_stays_under_100_mib():
    sizes = {path: path.stat().st_size for path in tracked_files() if path.is_file()}
    largest = sorted(sizes, key=sizes.get, reverse=True)[:3]
    assert sum(sizes.values()) < 100 << 20, "the tracked tree is over 100 MiB; its largest files: " + \
        ", ".join(f"{p.relative_to(ROOT)} ({sizes[p] >> 20} MiB)" for p in largest)


def test_the_readme_stays_under_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
