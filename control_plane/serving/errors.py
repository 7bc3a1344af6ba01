"""What the serving pipeline raises when it cannot serve a request: domain errors.

They say what went wrong and carry what a caller needs to act on it (the parameter at
fault, whether and when to retry); they know nothing of HTTP. The HTTP layer turns each
into an OpenAI-shaped response (``api/errors.py``: ``from_serving``); the terminal and
batch front ends print the message.
"""

from __future__ import annotations


class ServingError(Exception):
    """A request the pipeline will not or cannot serve; ``code`` says which case."""

    def __init__(self, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


class InvalidRequestError(ServingError):
    """The request itself is wrong (too long for the model, a bad token id...)."""

    def __init__(self, param: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(message, code=code, param=param)


class ModelNotFoundError(ServingError):
    """No served model has that name (or it has no ready engine)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="model_not_found", param="model")


class UnavailableError(ServingError):
    """The request is fine but cannot be served now: shed at a limit, no ready engine, or
    its engine was lost. ``retry_after_s`` is set when retrying shortly should work."""

    def __init__(self, message: str, *, code: str, retry_after_s: int | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s
