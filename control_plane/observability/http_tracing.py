"""The HTTP span of each API request, child of the client's W3C ``traceparent``.

A pure ASGI middleware (not Starlette's ``BaseHTTPMiddleware``): it wraps the whole
exchange, a streamed body to its last chunk included, and the span is current while
the route runs, so the serving pipeline's spans (``prepare``, ``route``, ``generate``)
are its children. Only ``/v1/`` paths are traced: scrapes of ``/metrics`` and health
probes would drown the requests.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from dynask.actors.runtime.tracing import TRACEPARENT, context_from

Scope = dict[str, Any]
TRACED_PREFIX = "/v1/"


class TraceRequests:
    """ASGI middleware: one ``SERVER`` span per ``/v1/`` request (see the module docstring)."""

    def __init__(self, app: Any, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(TRACED_PREFIX):
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        span = self.tracer.start_span(
            f"{method} {path}",
            context_from(_header(scope, TRACEPARENT)),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        )

        async def send_traced(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
            await send(message)

        with trace.use_span(span, end_on_exit=True, record_exception=True):
            await self.app(scope, receive, send_traced)


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.encode()
    for key, value in scope.get("headers", ()):
        if key.lower() == wanted:
            return bytes(value).decode("latin-1")
    return None
