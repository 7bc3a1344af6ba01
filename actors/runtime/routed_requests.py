"""The routed requests an actor keeps for the readers of its token stream that come later.

A control plane that connects to an actor's token stream after others (a second router
started later, or a restarted one) heard nothing of what they had routed there: it saw
the actor as idle until those requests ended, and piled onto it. So the stream keeps the
``"routed"`` record of every request in flight (``token_stream.routed_record``) with the
tokens it has produced so far (``"g"``), and a reader that connects is sent them in one
``"routed"`` frame before anything else (``TokenStreamServer``): it counts each one as
its peer did, waiting for prefill (``g`` 0) or decoding ``g`` tokens.

An engine that publishes no KV events is routed on what the routers assumed (the
approximate index: a routed prompt's blocks are held for a TTL). A joiner would start
that index empty and route blindly for a TTL, so for such an actor the records of the
requests that ended recently are kept too, marked ``"e"``, and sent with the others:
the joiner notes their blocks at their age and counts no load for them. They are kept
newest first up to ``MAX_ENDED_RECORDS`` requests and ``MAX_ENDED_HASHES`` block hashes
(8 MiB of hashes), and for at most ``MAX_ENDED_AGE_S`` (longer than any TTL a router
should assume; older blocks are evicted by then under any load that matters). An engine
with KV events needs none of it: a joiner reads its cache from its dump.

Everything here runs on the actor's event loop, which owns the stream's sockets: records
come from the submission calls, outputs from the engine thread's per-step hop. Requests
without a router's note are not kept (no record to send), so with replica sync off this
costs nothing per step.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from dynask.actors.api.outputs import RequestOutput

MAX_ENDED_RECORDS = 4096
MAX_ENDED_HASHES = 2**20
MAX_ENDED_AGE_S = 600.0
_HASH_BYTES = 8  # the note's hashes are u64 (``RoutingNote.to_wire``)


class RoutedRequests:
    """Request id → its ``"routed"`` record with ``"g"`` (tokens produced so far); with
    ``keep_ended``, the recently ended ones too (see the module docstring)."""

    def __init__(self, keep_ended: bool = False, clock: Callable[[], float] = time.time) -> None:
        self.keep_ended = keep_ended
        self._clock = clock
        self._in_flight: dict[str, dict[str, Any]] = {}
        self._ended: deque[tuple[float, dict[str, Any]]] = (
            deque()
        )  # (ended at, record), oldest first
        self._ended_hashes = 0

    def add(self, records: Iterable[dict[str, Any]]) -> None:
        """Requests just queued (their records as the other readers heard them)."""
        for record in records:
            self._in_flight[str(record["i"])] = {**record, "g": 0}

    def advance(self, outputs: Iterable[RequestOutput]) -> None:
        """An engine step's deltas: tokens counted, finished (or aborted) requests ended."""
        if not self._in_flight:
            return
        for output in outputs:
            record = self._in_flight.get(output.request_id)
            if record is None:
                continue
            if output.finished:
                self._end(self._in_flight.pop(output.request_id))
            else:
                record["g"] += len(output.token_ids)

    def forget(self, request_ids: Iterable[str]) -> None:
        """Requests the actor dropped without a final delta reaching anyone."""
        for request_id in request_ids:
            record = self._in_flight.pop(request_id, None)
            if record is not None:
                self._end(record)

    def _end(self, record: dict[str, Any]) -> None:
        if not self.keep_ended:
            return
        record["e"] = True
        self._ended.append((self._clock(), record))
        self._ended_hashes += _num_hashes(record)
        while len(self._ended) > MAX_ENDED_RECORDS or self._ended_hashes > MAX_ENDED_HASHES:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, record = self._ended.popleft()
        self._ended_hashes -= _num_hashes(record)

    def ended_records(self) -> list[dict[str, Any]]:
        """The ended requests' records still kept, oldest first (copies)."""
        horizon = self._clock() - MAX_ENDED_AGE_S
        while self._ended and self._ended[0][0] < horizon:
            self._drop_oldest()
        return [dict(record) for _, record in self._ended]

    def in_flight_records(self) -> list[dict[str, Any]]:
        """The records of the requests in flight (copies: they change later)."""
        return [dict(record) for record in self._in_flight.values()]

    def records(self) -> list[dict[str, Any]]:
        """Both, ended ones first: what a reader that just connected is sent."""
        return self.ended_records() + self.in_flight_records()

    def __len__(self) -> int:
        return len(self._in_flight) + len(self._ended)


def _num_hashes(record: dict[str, Any]) -> int:
    hashes = record["r"].get("h", b"") if isinstance(record["r"], dict) else b""
    return len(hashes) // _HASH_BYTES if isinstance(hashes, bytes) else 0
