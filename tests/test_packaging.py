"""eaglespec as a user installs it: a wheel in a fresh virtual environment outside the checkout,
where `--head default` still finds the head we ship (package data) and EAGLE gives vanilla's tokens."""

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # builds a wheel and a virtual environment


def run(command: list, cwd: Path) -> str:
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stderr[-3000:]}"
    assert "could not build its CPU kernels" not in done.stderr, done.stderr[-3000:]  # the wheel carries them whole
    return done.stdout


def test_a_wheel_installed_outside_the_checkout_generates_with_the_shipped_head(tmp_path):
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", tmp_path, ROOT],
        tmp_path)
    (wheel,) = tmp_path.glob("eaglespec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "eaglespec/heads/shipped/smollm2-135m-instruct/model.safetensors" in names
    # the heads the repository ships, and no head built locally beside them
    tracked = run(["git", "ls-files", "src/eaglespec/heads/shipped"], ROOT).split()
    assert sorted(n for n in names if "/heads/shipped/" in n) == sorted(t.removeprefix("src/") for t in tracked)
    assert "eaglespec/models/row_attention.cpp" in names and "eaglespec/serve/page.html" in names

    env = tmp_path / "venv"
    run([sys.executable, "-m", "venv", env], tmp_path)
    python = env / "bin" / "python"
    run([python, "-m", "pip", "install", "--quiet", "--no-deps", wheel], tmp_path)
    # the dependencies (torch and the rest) come from the test's own environment, appended after the
    # new one's site-packages: only the wheel provides eaglespec there (a .pth line adds a path, and
    # the checkout's editable-install hook in that path is not run)
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = run([python, "-c", "import eaglespec; print(eaglespec.__file__)"], tmp_path).strip()
    assert Path(where).is_relative_to(env), where

    def tokens(method: str) -> list[int]:
        out = run([env / "bin" / "eaglespec", "generate", "--model", "smollm2-135m-instruct", "--head", "default",
                   "--method", method, "--chat", "--prompt", "Name three rivers.", "--max-new-tokens", "24",
                   "--dtype", "float32", "--threads", "2", "--json"], tmp_path)
        return json.loads(out.strip().splitlines()[-1])["token_ids"]

    eagle = tokens("eagle")
    assert len(eagle) == 24 and eagle == tokens("vanilla")
