"""The model families, one file each, and the registry they join. Importing this package registers them."""

from eaglespec.models.families import llama, mistral, qwen2  # noqa: F401
from eaglespec.models.families.family import Family  # noqa: F401
from eaglespec.models.families.registry import FAMILIES, family_of  # noqa: F401
