"""The engine actors this control plane routes to, each owned once.

Each actor served here has a handle (its token stream, opened by this control plane),
a Dask future (which keeps its key alive for this client) and a place in the service's
routing. ``ServedActors`` adds and removes the three together, so an actor is never
routed to after its handle closed, and a future is released exactly once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dynask.control_plane.cluster.retiring import drain
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.serving.service import ServingService


class ServedActors:
    def __init__(self, service: ServingService) -> None:
        self.service = service
        self.handles: dict[str, ActorHandle] = {}
        self._futures: dict[str, Any] = {}  # actor name -> its Dask future
        self._letting_go: set[asyncio.Task[None]] = set()

    def add(self, model_name: str, handle: ActorHandle, future: Any) -> None:
        """Routes to ``handle`` (connected already) from now on."""
        self.handles[handle.name] = handle
        self._futures[handle.name] = future
        self.service.add_actor(model_name, handle)

    def remove(self, name: str) -> ActorHandle:
        """No new request goes to ``name``; its handle is the caller's to close."""
        self.service.remove_actor(name)
        return self.handles.pop(name)

    def release(self, name: str) -> None:
        """Drops this client's hold on the actor's key."""
        future = self._futures.pop(name, None)
        if future is not None:
            future.release()

    def let_go(self, name: str) -> None:
        """Stops routing to ``name`` now; its running requests finish (or migrate once it
        stops) before its stream closes. For actors another control plane retires."""
        handle = self.remove(name)

        async def close_when_drained() -> None:
            await drain(handle)
            await handle.close()
            self.release(name)

        task = asyncio.create_task(close_when_drained(), name=f"let-go-{name}")
        self._letting_go.add(task)
        task.add_done_callback(self._letting_go.discard)

    def count(self, deployment: str) -> int:
        return sum(1 for h in self.handles.values() if h.deployment == deployment)

    def workers(self) -> set[str]:
        return {h.worker for h in self.handles.values()}
