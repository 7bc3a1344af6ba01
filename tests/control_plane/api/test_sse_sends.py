"""What ``TokenEventResponse`` hands the server, message by message (ASGI, no socket):
one send per item of the body iterator, ``FinalEvents`` sent with the end of the
response, and a send that never finishes giving the stream up (issue 21)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dynask.control_plane.api.sse import DONE_EVENT, FinalEvents, TokenEventResponse

SCOPE = {"type": "http", "method": "POST", "path": "/", "headers": []}


async def _never_disconnects() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


async def _bodies(events: AsyncIterator[bytes], **kwargs: Any) -> list[tuple[bytes, bool]]:
    """The body messages the response sends, as (body, more_body)."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await TokenEventResponse(events, ping=600, sep="\n", **kwargs)(SCOPE, _never_disconnects, send)
    assert sent[0]["type"] == "http.response.start"
    return [(m["body"], m["more_body"]) for m in sent[1:]]


async def _items(*items: bytes) -> AsyncIterator[bytes]:
    for item in items:
        yield item


def test_final_events_go_out_with_the_end_of_the_response() -> None:
    events = _items(
        b"data: 1\n\n", b"data: 2\n\ndata: 3\n\n", FinalEvents(b"data: 4\n\n" + DONE_EVENT)
    )
    assert asyncio.run(_bodies(events)) == [
        (b"data: 1\n\n", True),
        (b"data: 2\n\ndata: 3\n\n", True),
        (b"data: 4\n\ndata: [DONE]\n\n", False),
    ]


def test_a_stream_without_final_events_ends_with_an_empty_body() -> None:
    assert asyncio.run(_bodies(_items(b"data: 1\n\n"))) == [(b"data: 1\n\n", True), (b"", False)]


def test_events_after_final_events_are_an_error() -> None:
    events = _items(FinalEvents(DONE_EVENT), b"data: late\n\n")
    with pytest.raises(RuntimeError, match="after its FinalEvents"):
        asyncio.run(_bodies(events))


def test_a_send_that_never_finishes_gives_the_stream_up_and_closes_its_events() -> None:
    closed = asyncio.Event()

    async def events() -> AsyncIterator[bytes]:
        try:
            for i in range(1000):
                yield f"data: {i}\n\n".encode()
        finally:
            closed.set()

    async def run() -> tuple[list[bytes], float]:
        sent: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            if len(sent) == 2:  # the client's buffers are full: this send never returns
                await asyncio.Event().wait()
            sent.append(message.get("body", b""))

        loop = asyncio.get_running_loop()
        started = loop.time()
        response = TokenEventResponse(events(), ping=600, sep="\n", send_timeout=0.2)
        await response(SCOPE, _never_disconnects, send)
        assert closed.is_set()  # its finally ran: the engine request is aborted
        return sent, loop.time() - started

    sent, took = asyncio.run(run())
    assert sent == [b"", b"data: 0\n\n"]  # the start (no body) and one event
    assert 0.2 <= took < 0.5
