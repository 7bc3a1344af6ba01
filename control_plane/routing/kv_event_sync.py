"""Keeping one actor's blocks in the prefix index in step with its KV events.

Design decisions:

- The events arrive on the actor's token stream (``token_stream.KIND_KV_EVENTS``); the
  handle passes each frame here, on the control plane's event loop, which owns the index.
- The index is built from a dump when the actor connects (``start``): a control plane
  that starts after the engines served traffic knows their caches at once.
- A gap in the event ids (the index answers ``GAP``), or a frame that cannot be read,
  starts a resync: the actor is asked for a dump (``EngineActor.kv_cache_dump``, taken
  on the engine side under its step lock), and the events that arrive meanwhile are
  kept. The dump replaces the actor's blocks; the kept events then apply on top of it
  (those the dump already covers are duplicates, ignored by id). A gap among them
  starts another round.
- A dump that cannot be fetched drops the actor's blocks: the index under-reports
  rather than sends requests to blocks that may be gone. The next event (it will not be
  the one expected) starts another resync; a dead actor's stream closes, and ``close``
  drops its blocks for good.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from dynask.actors.runtime.token_stream import unpack_kv_dump
from dynask.kv.events import KVEventRecord
from dynask.kv.prefix_index import PrefixIndex

log = logging.getLogger(__name__)

DumpFetcher = Callable[[], Awaitable[bytes]]
"""Returns an actor's ``pack_kv_dump`` bytes (its ``kv_cache_dump`` actor method)."""


class ActorKVSync:
    """Feeds one actor's stream events into a ``PrefixIndex``; resyncs from dumps."""

    def __init__(
        self,
        actor: str,
        index: PrefixIndex,
        fetch_dump: DumpFetcher,
        on_resync: Callable[[str, str], None] | None = None,
    ) -> None:
        self.actor = actor
        self.index = index
        self.resyncs = 0  # dumps applied, the first one included
        self._fetch_dump = fetch_dump
        self._on_resync = on_resync or (lambda _actor, _reason: None)
        self._kept: list[KVEventRecord] | None = None  # None: live, else a dump is due
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def syncing(self) -> bool:
        """Whether a dump is on its way (events are being kept, not applied)."""
        return self._kept is not None

    def start(self) -> None:
        """Builds the actor's blocks from a dump (call once, on the event loop)."""
        self._resync([], "connected")

    def on_kv_events(self, payload: Any) -> None:
        """One ``KIND_KV_EVENTS`` frame's payload: a list of ``KVEventRecord`` dicts."""
        if self._closed:
            return
        try:
            records = [KVEventRecord.from_dict(item) for item in payload]
        except (ValueError, TypeError, AttributeError) as exc:
            log.error("unreadable KV events from %s (%s); resyncing from a dump", self.actor, exc)
            self._resync([], "unreadable events")
            return
        if self._kept is not None:
            self._kept.extend(records)
            return
        self._apply(records)

    def on_stream_closed(self) -> None:
        """The actor's stream broke: its blocks are gone with it."""
        self.close()

    def close(self) -> None:
        """Stops syncing and drops the actor's blocks from the index."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self._kept = None
        self.index.remove_actor(self.actor)

    async def wait(self) -> None:
        """Returns once no dump is on its way (for tests and start-up)."""
        while self._task is not None and not self._task.done():
            await asyncio.wait([self._task])

    def _apply(self, records: list[KVEventRecord]) -> None:
        for position, record in enumerate(records):
            result = self.index.apply(self.actor, record)
            if result.resync_needed:
                log.warning(
                    "KV events of %s skipped from id %d to %d; resyncing from a dump",
                    self.actor,
                    result.expected_event_id,
                    record.event_id,
                )
                self._resync(records[position:], "gap")
                return

    def _resync(self, kept: list[KVEventRecord], reason: str) -> None:
        if self._kept is not None:  # a dump is on its way already: it covers this too
            self._kept.extend(kept)
            return
        self._kept = list(kept)
        self._task = asyncio.create_task(
            self._fetch_and_apply(reason), name=f"kv-sync-{self.actor}"
        )

    async def _fetch_and_apply(self, reason: str) -> None:
        try:
            dump = unpack_kv_dump(await self._fetch_dump())
        except Exception as exc:  # unreachable actor or a bad dump: say which, keep serving
            log.warning("KV cache dump of %s failed (%s); its blocks are dropped", self.actor, exc)
            self._kept = None
            self.index.remove_actor(self.actor)
            return
        if self._closed:
            return
        self.index.resync(self.actor, dump)
        self.resyncs += 1
        self._on_resync(self.actor, reason)
        kept, self._kept = self._kept or [], None
        self._apply(kept)
