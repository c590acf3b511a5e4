"""Exceptions that carry a one-line message telling the user what to do.

The CLI prints them without a traceback and exits non-zero.
"""


class EaglespecError(Exception):
    """Base class: the message is one line that names the problem and the fix."""


class UnknownModelError(EaglespecError):
    pass


class UnsupportedModelError(EaglespecError):
    pass


class CorruptWeightsError(EaglespecError):
    pass


class FetchError(EaglespecError):
    pass


class InvalidArgumentError(EaglespecError):
    pass


class PromptTooLongError(EaglespecError):
    pass


class MissingDependencyError(EaglespecError):
    pass
