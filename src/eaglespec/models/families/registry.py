"""The model families eaglespec runs, by transformers' `model_type` (one file each in this package)."""

from __future__ import annotations

from eaglespec.errors import UnsupportedModelError
from eaglespec.models.families.family import Family

FAMILIES: dict[str, type[Family]] = {}


def register(cls: type[Family]) -> type[Family]:
    FAMILIES[cls.model_type] = cls
    return cls


def family_of(model_type: str) -> type[Family]:
    """The family of a `model_type`, or a one-line error naming those that are supported."""
    if model_type not in FAMILIES:
        raise UnsupportedModelError(f"architecture '{model_type}' is not supported; eaglespec runs "
                                    f"{', '.join(FAMILIES)} models: pick one of those")
    return FAMILIES[model_type]
