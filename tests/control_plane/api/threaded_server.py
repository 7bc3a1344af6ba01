"""A Starlette app served by a real uvicorn in a daemon thread, for tests that drive it
with blocking clients (httpx, the openai SDK)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.types import ASGIApp

from tests.control_plane.server_process import free_port


@contextmanager
def served_in_thread(app: ASGIApp) -> Iterator[str]:
    """Serves ``app`` on a free loopback port; yields ``http://127.0.0.1:PORT``."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(5)
