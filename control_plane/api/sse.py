"""The SSE response for token streams: sse-starlette's response, with a lean scaffold.

Why not ``EventSourceResponse.__call__`` as is: per request it starts an anyio task group
of four tasks (stream, ping, exit signal, disconnect) and wraps every send in a cancel
scope. Under 64 concurrent streams that scaffold was the largest single cost of the
control plane (a quarter of its CPU in a py-spy profile; 136 µs per request before the
first token in a microbenchmark). Here one plain asyncio task watches for the client's
disconnect and cancels the stream; sends go straight to the server. Headers, separators
and event encoding stay sse-starlette's. HEAD and websocket scopes take sse-starlette's
own path.

What a send costs, and so what is kept off it (issue 21, py-spy on the trace replay):
the socket write itself is the largest part (one ``write`` syscall per ASGI send, over a
third of the SSE share of the control plane's CPU), then the Python around it. So

* nothing is armed per send: keep-alive pings and the stalled-client check are two
  timers per stream (``_StreamClock``), not an ``asyncio.timeout`` per event (a timer
  handle, a heap push and a cancel for every token: ~7 % of the SSE share);
* the stream's last events travel with the end of the response: a body iterator that
  yields ``FinalEvents`` (the last chunk, usage, ``[DONE]``) gets them sent with
  ``more_body=False``, which uvicorn writes with the chunked terminator in one syscall,
  instead of three writes (last chunk, ``[DONE]``, terminator);
* deltas that are already queued go out in one send: the body iterators join them
  (``ActorHandle.generate`` hands over every delta that has arrived); nothing waits for
  more, so no event is delayed to save a write.

A client that stops reading (its socket buffers full) blocks only its own stream's
sends; after ``SEND_TIMEOUT_S`` (checked four times per period, so within 1.25 times
that) without the pending send finishing, the stream is given up (the request is
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
DONE_EVENT = b"data: [DONE]\n\n"  # the end of an OpenAI stream
SEND_TIMEOUT_S = 60.0


class FinalEvents(bytes):
    """A stream's last bytes: ``TokenEventResponse`` sends them with the end of the
    response, in one write. The body iterator must yield nothing after them."""


class TokenEventResponse(EventSourceResponse):
    """An ``EventSourceResponse`` for a stream of ready-made events, one task per stream.

    A client disconnect cancels the body iterator (so its ``finally`` aborts the engine
    request) and ends the response quietly. ``on_close`` runs when the response ends,
    however it ends, even if the body iterator never started (it releases what the
    request holds, such as its place in an actor's load).
    """

    def __init__(
        self,
        *args: Any,
        on_close: Callable[[], None] | None = None,
        send_timeout: float = SEND_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._on_close = on_close
        self._send_timeout = send_timeout

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
        clock = _StreamClock(send, stream, self.ping_interval, self._send_timeout)
        try:
            await self._send_events(send, clock)
        except asyncio.CancelledError:
            if clock.stalled:
                log.warning(
                    "a client read nothing for %.0f s; its stream was given up", clock.timeout
                )
            elif not (watcher.done() and watcher.result()):
                raise  # cancelled from outside (server shutdown): not ours to swallow
            else:
                log.debug("client went away; stream ended")
            stream.uncancel()
            await _close(self.body_iterator)  # its finally aborts the engine request now
        finally:
            watcher.cancel()
            clock.stop()

    async def _send_events(self, send: Send, clock: _StreamClock) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        ended = False
        async for data in self.body_iterator:
            if ended:
                raise RuntimeError("a token stream yielded events after its FinalEvents")
            ended = isinstance(data, FinalEvents)
            body = data if isinstance(data, bytes) else _encode(data, self.sep)
            await clock.send(body, more_body=not ended)
        if not ended:
            await clock.send(b"", more_body=False)

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


class _StreamClock:
    """One stream's sends, with its two timers: a keep-alive comment when the stream has
    been quiet for ``ping_interval`` seconds (0: none), and the stalled-client check,
    which cancels the stream when one send has waited ``timeout`` seconds."""

    def __init__(
        self, send: Send, stream: asyncio.Task[object], ping_interval: float, timeout: float
    ) -> None:
        self._send = send
        self._stream = stream
        self._loop = asyncio.get_running_loop()
        self.timeout = timeout
        self.stalled = False
        self._quiet = True
        self._sending_since: float | None = None
        self._ping_task: asyncio.Task[None] | None = None
        self._pinger = (
            None
            if ping_interval <= 0
            else self._loop.call_later(ping_interval, self._ping_due, ping_interval)
        )
        self._checker = self._loop.call_later(timeout / 4, self._check_stall)

    async def send(self, body: bytes, more_body: bool = True) -> None:
        self._quiet = False
        self._sending_since = self._loop.time()
        await self._send({"type": "http.response.body", "body": body, "more_body": more_body})
        self._sending_since = None

    def _check_stall(self) -> None:
        since = self._sending_since
        if since is not None and self._loop.time() - since >= self.timeout:
            self.stalled = True
            self._stream.cancel()
            return
        self._checker = self._loop.call_later(self.timeout / 4, self._check_stall)

    def _ping_due(self, interval: float) -> None:
        if self._quiet and (self._ping_task is None or self._ping_task.done()):
            self._ping_task = self._loop.create_task(self._ping())
        self._quiet = True
        self._pinger = self._loop.call_later(interval, self._ping_due, interval)

    async def _ping(self) -> None:
        try:
            await self._send({"type": "http.response.body", "body": PING_EVENT, "more_body": True})
        except Exception as exc:  # the stream itself reports a broken connection
            log.debug("ping failed: %s", exc)

    def stop(self) -> None:
        self._checker.cancel()
        if self._pinger is not None:
            self._pinger.cancel()
        if self._ping_task is not None:
            self._ping_task.cancel()
