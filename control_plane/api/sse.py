"""The SSE response for token streams: sse-starlette's response, with a lean scaffold.

Why not ``EventSourceResponse.__call__`` as is: per request it starts an anyio task group
of four tasks (stream, ping, exit signal, disconnect) and wraps every send in a cancel
scope. Under 64 concurrent streams that scaffold was the largest single cost of the
control plane (a quarter of its CPU in a py-spy profile; 136 µs per request before the
first token in a microbenchmark). Here one plain asyncio task watches for the client's
disconnect and cancels the stream; sends go straight to the server; keep-alive pings
are a timer that only fires on a quiet stream. Headers, separators and event encoding
stay sse-starlette's. HEAD and websocket scopes take sse-starlette's own path.

A client that stops reading (its socket buffers full) blocks only its own stream's
sends; after ``SEND_TIMEOUT_S`` without progress the stream is given up (the request is
aborted on its actor), so a reader that never reads cannot hold a request forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sse_starlette import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.types import Message, Receive, Scope, Send

log = logging.getLogger(__name__)

PING_EVENT = b": ping\n\n"
SEND_TIMEOUT_S = 60.0


class TokenEventResponse(EventSourceResponse):
    """An ``EventSourceResponse`` for a stream of ready-made events, one task per stream.

    A client disconnect cancels the body iterator (so its ``finally`` aborts the engine
    request) and ends the response quietly. ``on_close`` runs when the response ends,
    however it ends, even if the body iterator never started (it releases what the
    request holds, such as its place in an actor's load).
    """

    def __init__(
        self, *args: Any, on_close: Callable[[], None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._respond(scope, receive, send)
        finally:
            if self._on_close is not None:
                self._on_close()

    async def _respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"].upper() == "HEAD":
            await super().__call__(scope, receive, send)
            return
        stream = asyncio.current_task()
        assert stream is not None  # an ASGI app always runs in a task
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(receive, stream))
        pinger = _Pinger(send, self.ping_interval) if self.ping_interval > 0 else None
        try:
            await self._send_events(send, pinger)
        except TimeoutError:
            log.warning("a client read nothing for %.0f s; its stream was given up", SEND_TIMEOUT_S)
            await _close(self.body_iterator)
        except asyncio.CancelledError:
            if not (watcher.done() and watcher.result()):
                raise  # cancelled from outside (server shutdown): not ours to swallow
            stream.uncancel()
            log.debug("client went away; stream ended")
        finally:
            watcher.cancel()
            if pinger is not None:
                pinger.stop()

    async def _send_events(self, send: Send, pinger: _Pinger | None) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        async for data in self.body_iterator:
            body = data if isinstance(data, bytes) else _encode(data, self.sep)
            if pinger is not None:
                pinger.sent()
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _watch_disconnect(receive: Receive, stream: asyncio.Task[object]) -> bool:
        """Waits for ``http.disconnect``; then cancels the stream and returns True."""
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                stream.cancel()
                return True


async def _close(iterator: object) -> None:
    """Closes an async generator now (its ``finally`` aborts the engine request)."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


def _encode(data: object, sep: str) -> bytes:
    """Anything but ready-made bytes: sse-starlette's own event encoding."""
    if isinstance(data, dict):
        return ServerSentEvent(**data).encode()
    if isinstance(data, ServerSentEvent):
        return data.encode()
    return ServerSentEvent(str(data), sep=sep).encode()


class _Pinger:
    """Sends a comment line when the stream has been quiet for ``interval`` seconds."""

    def __init__(self, send: Send, interval: float) -> None:
        self._send = send
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self._quiet = True
        self._task: asyncio.Task[None] | None = None
        self._timer = self._loop.call_later(interval, self._due)

    def sent(self) -> None:
        self._quiet = False

    def _due(self) -> None:
        if self._quiet and (self._task is None or self._task.done()):
            self._task = self._loop.create_task(self._ping())
        self._quiet = True
        self._timer = self._loop.call_later(self._interval, self._due)

    async def _ping(self) -> None:
        try:
            await self._send({"type": "http.response.body", "body": PING_EVENT, "more_body": True})
        except Exception as exc:  # the stream itself reports a broken connection
            log.debug("ping failed: %s", exc)

    def stop(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
