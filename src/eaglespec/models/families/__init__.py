"""The model families, one file each, and the registry they join. Importing this package registers them."""

from eaglespec.models.families import gemma3, llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe  # noqa: F401
from eaglespec.models.families.family import Family  # noqa: F401
from eaglespec.models.families.registry import FAMILIES, family_of  # noqa: F401
