"""Retiring engine actors: letting their requests finish, stopping them, which goes first."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from dynask.control_plane.serving.actor_handle import ActorHandle

log = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 60.0  # a retired actor finishes its requests for at most this long


async def drain(handle: ActorHandle) -> None:
    """Waits for a retired actor's requests (no new ones reach it) to finish, so scaling
    down loses none; after ``DRAIN_TIMEOUT_S`` the rest are stopped with it."""
    deadline = asyncio.get_running_loop().time() + DRAIN_TIMEOUT_S
    while handle.in_flight and not handle.broken:
        if asyncio.get_running_loop().time() > deadline:
            log.warning("stopping %s with %d requests unfinished", handle.name, handle.in_flight)
            return
        await asyncio.sleep(0.05)


async def stop_quietly(proxy: Any) -> None:
    try:
        await asyncio.wait_for(proxy.stop(), timeout=10)
    except Exception as exc:  # stopping: report, keep closing the rest
        log.warning("stopping an engine actor failed: %s", exc)


def newest_first(item: tuple[str, Any]) -> tuple[str, int]:
    """Sort key of ``(actor name, …)``: actors are named ``DEPLOYMENT-N`` with N counting
    up, so by deployment, then by N as a number (``decode-10`` after ``decode-9``)."""
    base, _, index = item[0].rpartition("-")
    return (base, int(index)) if index.isdigit() else (item[0], -1)
