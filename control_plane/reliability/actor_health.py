"""Noticing lost engine actors: the scheduler's events, stream EOF, and heartbeats.

Three signals, each for a failure the others miss:

- **Stream EOF.** A worker process that dies closes its sockets; the actor's token
  stream reaches EOF at once and ``ActorHandle`` marks itself broken (no code here).
- **The scheduler's ``remove-worker`` event** (``client.subscribe_topic("all")``): a
  worker that the scheduler lost or retired, including a host that vanished without
  closing its sockets. Every actor on it is declared lost.
- **Heartbeats.** A worker that hangs without dying (``SIGSTOP``, a stuck event loop, a
  wedged GPU driver) keeps its sockets open, and Dask itself only notices after its
  worker TTL (5 minutes by default). So every ``heartbeat_interval_s`` each actor gets a
  cheap ``stats()`` call (no engine lock); an actor that has not answered for
  ``heartbeat_timeout_s`` is declared lost. Each call runs on its own task, so one hung
  actor delays no other. The answers also show an engine thread that is stuck while its
  worker answers: requests waiting or running and the step counter frozen for
  ``engine_stall_timeout_s`` (not for ``out=python`` engines, whose steps are the user's).

A lost actor's requests move (``request_migration``) as soon as it is declared lost;
the reconciler is woken to replace it. A hung worker is *quarantined*: no new actor is
placed there while it is still registered. Its orphaned actor keeps getting heartbeats;
if the worker comes back (``SIGCONT``) the orphan is stopped, freeing its memory, and the
worker is free again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from dynask.actors.api.stats import EngineStats
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.serving.actor_handle import ActorHandle

log = logging.getLogger(__name__)

STOP_ORPHAN_TIMEOUT_S = 30.0
SCHEDULER_TOPIC = "all"


class ActorHealth:
    """Watches the actors that ``handles`` returns; see the module docstring."""

    def __init__(
        self,
        client: Any,  # distributed.Client (asynchronous)
        options: ReliabilityOptions,
        handles: Callable[[], Iterable[ActorHandle]],
        on_change: Callable[[], None],
    ) -> None:
        self._client = client
        self._options = options
        self._handles = handles
        self._on_change = on_change  # wakes the reconciler
        self.quarantined: dict[str, Any] = {}  # hung worker -> its orphaned actor's proxy
        self._last_answer: dict[str, float] = {}
        self._last_step: dict[str, tuple[int, float]] = {}  # actor -> (steps, since when)
        self._pings: dict[str, asyncio.Task[None]] = {}
        self._orphan_pings: dict[str, asyncio.Task[None]] = {}
        self._loop_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._client.subscribe_topic(SCHEDULER_TOPIC, self.on_scheduler_event)
        self._loop_task = asyncio.create_task(self._heartbeat_forever(), name="actor-health")

    def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        for task in [*self._pings.values(), *self._orphan_pings.values()]:
            task.cancel()
        try:
            self._client.unsubscribe_topic(SCHEDULER_TOPIC)
        except Exception as exc:  # the client may be closing already; nothing to undo then
            log.debug("unsubscribing from the scheduler's events failed: %s", exc)

    # ---- the scheduler's events -----------------------------------------------------

    def on_scheduler_event(self, event: tuple[float, Any]) -> None:
        _, message = event
        if not isinstance(message, dict):
            return
        action, worker = message.get("action"), message.get("worker")
        if action == "remove-worker" and isinstance(worker, str):
            self.quarantined.pop(worker, None)
            for handle in list(self._handles()):
                if handle.worker == worker:
                    self.declare_lost(handle, "scheduler", f"the scheduler removed {worker}")
            self._on_change()
        elif action == "add-worker":
            self._on_change()

    # ---- heartbeats -----------------------------------------------------------------

    async def _heartbeat_forever(self) -> None:
        while True:
            await asyncio.sleep(self._options.heartbeat_interval_s)
            try:
                self.check_heartbeats(time.monotonic())
            except Exception:  # never let one bad round stop the watching
                log.exception("heartbeat round failed")

    def check_heartbeats(self, now: float) -> None:
        """Starts a ping for every actor without one in flight; declares lost the actors
        silent for longer than the timeout."""
        timeout = self._options.heartbeat_timeout_s
        live = set()
        for handle in list(self._handles()):
            if handle.broken:
                continue
            live.add(handle.name)
            last = self._last_answer.setdefault(handle.name, now)
            if now - last > timeout:
                self.declare_lost(
                    handle, "heartbeat", f"no answer to heartbeats for {now - last:.1f} s"
                )
                self.quarantined[handle.worker] = handle.proxy
                continue
            stalled = now - self._last_step.get(handle.name, (0, now))[1]
            if stalled > self._options.engine_stall_timeout_s:
                self.declare_lost(
                    handle,
                    "engine_stalled",
                    f"requests waiting, no engine step for {stalled:.1f} s",
                )
                self.quarantined[handle.worker] = handle.proxy
                continue
            ping = self._pings.get(handle.name)
            if ping is None or ping.done():
                self._pings[handle.name] = asyncio.create_task(self._ping(handle))
        for name in set(self._last_answer) - live:
            self._last_answer.pop(name, None)
            self._last_step.pop(name, None)
            self._pings.pop(name, None)
        for worker, proxy in list(self.quarantined.items()):
            ping = self._orphan_pings.get(worker)
            if ping is None or ping.done():
                self._orphan_pings[worker] = asyncio.create_task(self._reclaim(worker, proxy))

    async def _ping(self, handle: ActorHandle) -> None:
        try:
            answer = await asyncio.wait_for(handle.proxy.stats(), self._options.heartbeat_timeout_s)
            stats = EngineStats.from_dict(answer)
        except TimeoutError:
            return  # the next round judges the silence
        except Exception as exc:  # unreachable; EOF or the scheduler usually say so first
            log.debug("heartbeat of %s failed: %s", handle.name, exc)
            return
        now = time.monotonic()
        self._last_answer[handle.name] = now
        self._note_steps(handle, stats, now)

    def _note_steps(self, handle: ActorHandle, stats: EngineStats, now: float) -> None:
        """Restarts the stall clock when the engine stepped, is idle, or runs user code."""
        steps = stats.num_steps
        busy = stats.num_running + stats.num_waiting > 0
        last = self._last_step.get(handle.name)
        if last is None or last[0] != steps or not busy or handle.info.engine == "python":
            self._last_step[handle.name] = (steps, now)

    async def _reclaim(self, worker: str, proxy: Any) -> None:
        """A quarantined worker's orphan: once it answers again, stop it, free the worker."""
        try:
            await asyncio.wait_for(proxy.health(), self._options.heartbeat_timeout_s)
            await asyncio.wait_for(proxy.stop(), STOP_ORPHAN_TIMEOUT_S)
        except Exception as exc:  # still hung (or gone): try again next round
            log.debug("orphaned actor on %s not reclaimed yet: %s", worker, exc)
            return
        if self.quarantined.pop(worker, None) is not None:
            log.warning("worker %s answers again; its orphaned engine actor was stopped", worker)
            self._on_change()

    # ---- declaring -------------------------------------------------------------------

    def declare_lost(self, handle: ActorHandle, kind: str, detail: str) -> None:
        if handle.broken:
            return
        handle.declare_lost(kind, detail)
        self._on_change()
