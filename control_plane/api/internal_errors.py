"""The last line of defence: an unexpected exception becomes a 500 in OpenAI's shape and
the connection stays open.

Why a middleware and not Starlette's ``Exception`` handler: that handler runs in
``ServerErrorMiddleware``, which sends the 500 and then re-raises, and uvicorn closes the
connection of any request whose app raised after its response started. A client's pool
then hands the dead connection to its next request, which fails with a reset. Here the
exception is logged and answered, and the app returns normally, so keep-alive holds. An
exception after the response started (a stream half sent) cannot be answered; it is
re-raised and that connection closes, as it must (SSE streams report their own errors
in-band before that can happen, see ``openai_routes``).
"""

from __future__ import annotations

import logging

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dynask.control_plane.api.errors import APIError

log = logging.getLogger(__name__)


def internal_error(exc: BaseException) -> APIError:
    """The OpenAI-shaped 500 for an unexpected exception."""
    return APIError(
        f"internal error: {type(exc).__name__}: {exc}", status=500, code="internal_error"
    )


class CatchInternalErrors:
    """ASGI middleware: an exception before the response started is a 500 JSON answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            log.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            if started:
                raise
            error = internal_error(exc)
            await JSONResponse(error.body(), status_code=500)(scope, receive, send)
