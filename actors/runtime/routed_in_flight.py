"""The routed requests an actor has queued and not finished, for readers that come later.

A control plane that connects to an actor's token stream after others (a second router
started later, or a restarted one) heard nothing of what they had routed there: it saw
the actor as idle until those requests ended, and piled onto it. So the stream keeps the
``"routed"`` record of every request in flight (``token_stream.routed_record``) with the
tokens it has produced so far (``"g"``), and a reader that connects is sent them in one
``"routed"`` frame before anything else (``TokenStreamServer``): it counts each one as
its peer did, waiting for prefill (``g`` 0) or decoding ``g`` tokens.

Everything here runs on the actor's event loop, which owns the stream's sockets: records
come from the submission calls, outputs from the engine thread's per-step hop. Requests
without a router's note are not kept (no record to send), so with replica sync off this
costs nothing per step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dynask.actors.api.outputs import RequestOutput


class RoutedInFlight:
    """Request id → its ``"routed"`` record, with ``"g"``: tokens produced so far."""

    def __init__(self) -> None:
        self._records: dict[str, dict[str, Any]] = {}

    def add(self, records: Iterable[dict[str, Any]]) -> None:
        """Requests just queued (their records as the other readers heard them)."""
        for record in records:
            self._records[str(record["i"])] = {**record, "g": 0}

    def advance(self, outputs: Iterable[RequestOutput]) -> None:
        """An engine step's deltas: tokens counted, finished (or aborted) requests gone."""
        if not self._records:
            return
        for output in outputs:
            record = self._records.get(output.request_id)
            if record is None:
                continue
            if output.finished:
                del self._records[output.request_id]
            else:
                record["g"] += len(output.token_ids)

    def forget(self, request_ids: Iterable[str]) -> None:
        """Requests the actor dropped without a final delta reaching anyone."""
        for request_id in request_ids:
            self._records.pop(request_id, None)

    def records(self) -> list[dict[str, Any]]:
        """The records to send a reader that just connected (copies: they change later)."""
        return [dict(record) for record in self._records.values()]

    def __len__(self) -> int:
        return len(self._records)
