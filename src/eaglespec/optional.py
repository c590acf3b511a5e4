"""Optional dependencies, the extras of pyproject.toml: imported where they are used, with a
one-line error that names the extra to install when one is missing."""

from __future__ import annotations

import importlib
from importlib.util import find_spec
from types import ModuleType

from eaglespec.errors import MissingDependencyError


def available(module: str) -> bool:
    return find_spec(module) is not None


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """`module`, imported; `purpose` says what needs it ("eaglespec serve")."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name != module.split(".")[0]:
            raise  # the package is there, and something it imports is not: a broken install, not a missing extra
        raise MissingDependencyError(f"{purpose} needs {error.name}: pip install 'eaglespec[{extra}]'") from None


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the file-only Agg backend."""
    require("matplotlib", "bench", "plotting").use("Agg")
    return importlib.import_module("matplotlib.pyplot")
