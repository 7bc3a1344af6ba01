"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

The serving pipeline raises domain errors (``serving.errors``); ``from_serving`` is the
one place that says which HTTP status and headers each one gets.
"""

from __future__ import annotations

import math
from typing import Any

from dynask.control_plane.serving.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    ServingError,
    UnavailableError,
)
from dynask.control_plane.serving.tenants import TenantLimitError


class APIError(Exception):
    """An error the client caused or should know about, with its HTTP status."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.error_type = error_type or _default_type(status)
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body; text that UTF-8 cannot encode (a lone surrogate quoted from the
        request or an exception) is escaped, so the answer itself can always be sent."""
        return {
            "error": {
                "message": utf8_safe(self.message),
                "type": self.error_type,
                "param": None if self.param is None else utf8_safe(_cut(self.param)),
                "code": self.code,
            }
        }


PARAM_CHARS = 200  # a param names a field; a client's megabyte-long key is cut


def _cut(param: str) -> str:
    return param if len(param) <= PARAM_CHARS else param[:PARAM_CHARS] + "..."


def utf8_safe(text: str) -> str:
    """``text``, with what UTF-8 cannot encode written as backslash escapes."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error" if status != 503 else "service_unavailable"
    return "invalid_request_error"


def invalid(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(message, status=400, param=param, code=code)


def from_serving(error: ServingError) -> APIError:
    """The response a domain error gets: 400 for a bad request, 404 for an unknown
    model, 503 (with ``Retry-After`` when retrying shortly should work) when it cannot be
    served now."""
    if isinstance(error, TenantLimitError):  # OpenAI's 429: type "requests" or "tokens"
        kind = "tokens" if error.limit == "tokens_per_minute" else "requests"
        retry_after = str(max(1, math.ceil(error.retry_after_s)))
        return APIError(
            error.message,
            status=429,
            code=error.code,
            error_type=kind,
            headers={"Retry-After": retry_after},
        )
    if isinstance(error, UnavailableError):
        retry = error.retry_after_s
        headers = {"Retry-After": str(retry)} if retry is not None else None
        return APIError(error.message, status=503, code=error.code, headers=headers)
    if isinstance(error, ModelNotFoundError):
        return APIError(error.message, status=404, param=error.param, code=error.code)
    if isinstance(error, InvalidRequestError):
        return APIError(error.message, status=400, param=error.param, code=error.code)
    return APIError(error.message, status=500, param=error.param, code=error.code)
