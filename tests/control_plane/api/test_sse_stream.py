"""``TokenEventResponse`` over a real uvicorn server: events, keep-alive pings on a quiet
stream, and a client disconnect that closes the body iterator (so its request is aborted)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dynask.control_plane.api.sse import TokenEventResponse
from tests.control_plane.api.threaded_server import served_in_thread

closed = threading.Event()


async def _slow_events(count: int, gap_s: float) -> AsyncIterator[bytes]:
    try:
        for i in range(count):
            await asyncio.sleep(gap_s)
            yield f"data: {i}\n\n".encode()
    finally:
        closed.set()


async def _stream(request: Request) -> Response:
    count, gap = int(request.query_params["n"]), float(request.query_params["gap"])
    return TokenEventResponse(_slow_events(count, gap), ping=0.1, sep="\n")


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/stream", _stream, methods=["GET", "POST"])])
    with served_in_thread(app) as base:
        yield base


def test_events_arrive_in_order_with_sse_headers(base_url: str) -> None:
    response = httpx.post(f"{base_url}/stream?n=3&gap=0", timeout=5)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-store"
    assert response.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n"


def test_a_quiet_stream_gets_keep_alive_pings(base_url: str) -> None:
    response = httpx.post(f"{base_url}/stream?n=2&gap=0.35", timeout=5)
    assert response.text.count(": ping\n\n") >= 2
    assert [line for line in response.text.split("\n\n") if line.startswith("data")] == [
        "data: 0",
        "data: 1",
    ]


def test_a_client_disconnect_closes_the_event_source(base_url: str) -> None:
    closed.clear()
    with httpx.stream("POST", f"{base_url}/stream?n=1000&gap=0.01", timeout=5) as response:
        lines = response.iter_lines()
        assert next(lines) == "data: 0"
    assert closed.wait(5), "the body iterator was not closed after the client left"


def test_head_takes_sse_starlettes_own_path(base_url: str) -> None:
    response = httpx.head(f"{base_url}/stream?n=3&gap=0", timeout=5)
    assert response.status_code == 200
    assert response.content == b""
