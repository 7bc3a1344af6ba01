"""Live feeds over server-sent events: the overview's tables and the metrics charts.

Design decisions:
- The overview feed sends rendered HTML (the page's own blocks), one event per table,
  and only when that table changed; htmx's SSE extension swaps it in (``sse-swap``).
- The metrics feed sends one JSON point per tick; our ``metrics.js`` appends it to the
  uPlot charts. Each connection has its own ``MetricsWindow``.
- Each feed is a loop of one tick per ``FEED_INTERVAL_S`` that ends when the client
  goes (sse-starlette cancels it); a tick that fails is reported in the feed as an
  ``error`` event and the feed goes on, so a page never freezes silently.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dynask.web import events
from dynask.web.deps import AdminDeps
from dynask.web.metrics_window import MetricsWindow, read_registry
from dynask.web.snapshot import take_snapshot

log = logging.getLogger(__name__)

FEED_INTERVAL_S = 1.0
PING_S = 15
OVERVIEW_BLOCKS = {
    events.SSE_SUMMARY: "summary",
    events.SSE_WORKERS: "workers_table",
    events.SSE_ACTORS: "actors_table",
}


def make_feed_routes(deps: AdminDeps, interval_s: float = FEED_INTERVAL_S) -> list[Route]:
    async def overview(request: Request) -> Response:
        return EventSourceResponse(overview_events(deps, request, interval_s), ping=PING_S)

    async def metrics(request: Request) -> Response:
        window = MetricsWindow(lambda: read_registry(deps.service.metrics.registry))
        return EventSourceResponse(metrics_events(window, interval_s), ping=PING_S)

    return [
        Route("/feeds/overview", overview, methods=["GET"]),
        Route("/feeds/metrics", metrics, methods=["GET"]),
    ]


async def overview_events(
    deps: AdminDeps, request: Request, interval_s: float
) -> AsyncIterator[ServerSentEvent]:
    sent: dict[str, str] = {}
    while True:
        try:
            snapshot = await take_snapshot(deps.cluster, deps.service, deps.repo)
            context = snapshot.context()
            for event, block in OVERVIEW_BLOCKS.items():
                html = deps.renderer.block(request, "overview.html", block, context)
                if sent.get(event) != html:
                    sent[event] = html
                    yield ServerSentEvent(data=html, event=event)
        except Exception as exc:  # a worker may vanish mid-read; say so and keep going
            log.warning("overview feed tick failed: %s", exc)
            yield ServerSentEvent(data=f"{type(exc).__name__}: {exc}", event="error")
        await asyncio.sleep(interval_s)


async def metrics_events(
    window: MetricsWindow, interval_s: float
) -> AsyncIterator[ServerSentEvent]:
    while True:
        yield ServerSentEvent(data=json.dumps(window.point()), event=events.SSE_METRICS)
        await asyncio.sleep(interval_s)
