"""What every benchmark script records beside its figures, and how it writes them."""

from eaglespec.files import write_json  # noqa: F401
from eaglespec.timing import machine  # noqa: F401
