"""The drafters, one file each, and the registry they join (`registry.py`). Importing this package
registers the built-in ones, in the order help texts list them."""

from eaglespec.decoding.drafters import eagle  # noqa: F401  (isort: skip: the order is the help's)
from eaglespec.decoding.drafters import draft_model  # noqa: F401
from eaglespec.decoding.drafters import prompt_lookup  # noqa: F401
from eaglespec.decoding.drafters import hybrid  # noqa: F401
from eaglespec.decoding.drafters import medusa  # noqa: F401
from eaglespec.decoding.drafters import lookahead  # noqa: F401
from eaglespec.decoding.drafters.registry import (  # noqa: F401
    DRAFTERS,
    Artefact,
    MakeProposer,
    Method,
    method_help,
    method_needs,
    method_spec,
    parse_method,
    register,
    unregister,
)
