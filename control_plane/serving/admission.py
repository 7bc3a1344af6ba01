"""Admission control: a request is let in only while the control plane has room for it.

Design decisions:

- Two global limits, checked before a request is routed (so the answer is a plain 503
  with ``Retry-After``, streaming or not): requests in flight (``--max-in-flight``) and
  prompt tokens admitted but still waiting for their first token
  (``--max-queued-prefill-tokens``). The second bounds the prefill work queued on the
  engines; the first bounds everything the control plane holds per request (sockets,
  queues, tasks). Per-actor thresholds (``--max-active-blocks``, ``--max-queue``) stay
  with the router; these are what keeps the whole server's queues from growing without
  bound whatever the routing mode.
- A request leaves the prefill queue at its first delta (``prefill_done``) and leaves
  admission when it ends (``release``); its owner (``AdmittedRequest``) calls them. A
  migrated request keeps its place: it was already admitted.
- At ``--max-in-flight`` a request waits for a slot (``turn``) up to ``wait_s`` seconds
  instead of being refused at once, and slots go to waiters in weighted fair order:
  deficit round robin over the priority classes, round robin over the tenants of each
  class (``fair_queue``). A slot freed while requests wait is *reserved* for the next
  one (a request arriving meanwhile cannot take it: no barging), and given back if that
  waiter has gone (its client disconnected, or its time ran out). At most
  ``max_waiting`` (by default ``max_in_flight``) requests wait; one more is refused at
  once. The prefill-token limit
  still refuses at once: a waiter is woken by a freed slot, not by prefill progress.
- Counting is O(1) per event, on the event loop; only ``turn`` awaits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from dynask.control_plane.serving.errors import UnavailableError
from dynask.control_plane.serving.fair_queue import FairQueue

RETRY_AFTER_S = 1


class AdmissionRefusedError(UnavailableError):
    """The server is at one of its admission limits; the message says which."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message, code="overloaded", retry_after_s=RETRY_AFTER_S)
        self.limit = limit  # "in_flight", "queue_full", "queue_wait" or "prefill_tokens"


@dataclass(slots=True)
class _Admitted:
    prompt_tokens: int
    prefilling: bool = True


class Admission:
    """Requests in flight and their queued prefill tokens, against two limits."""

    def __init__(
        self,
        max_in_flight: int | None,
        max_queued_prefill_tokens: int | None,
        wait_s: float = 0.0,
        max_waiting: int | None = None,  # default: as many as may be in flight
    ) -> None:
        self.max_in_flight = max_in_flight
        self.max_waiting = max_waiting if max_waiting is not None else max_in_flight
        self.max_queued_prefill_tokens = max_queued_prefill_tokens
        self.wait_s = wait_s
        self.queued_prefill_tokens = 0
        self._requests: dict[str, _Admitted] = {}
        self.waiting: FairQueue[asyncio.Future[None]] = FairQueue()
        self._reserved = 0  # slots freed for woken waiters that have not come in yet

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    def _full(self) -> bool:
        limit = self.max_in_flight
        return limit is not None and self.in_flight + self._reserved >= limit

    async def turn(self, priority: str, tenant: str) -> bool:
        """Waits until a slot is free for a request of ``tenant`` in class ``priority``;
        True if the slot was reserved for it (pass it to ``admit``). Raises
        ``AdmissionRefusedError`` when too many wait or the wait is over ``wait_s``."""
        if not self._full() and not self.waiting:
            return False  # a slot is free and nobody waits: ``admit`` takes it at once
        limit = self.max_in_flight or 0
        if self.wait_s <= 0 or len(self.waiting) >= (self.max_waiting or 0):
            reason = "the wait queue is full" if self.wait_s > 0 else "--admission-wait is 0"
            raise AdmissionRefusedError(
                f"the server has {self.in_flight} requests in flight, its limit "
                f"(--max-in-flight {limit}), and {reason}; retry shortly",
                "queue_full" if self.wait_s > 0 else "in_flight",
            )
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.push(ticket, priority, tenant)
        try:  # ``wait``, not ``wait_for``: 3.11's may swallow a cancellation
            done, _ = await asyncio.wait((ticket,), timeout=self.wait_s)
        except BaseException:  # its client went away while it waited
            self._leave(ticket)
            raise
        if not done:
            self._leave(ticket)
            raise AdmissionRefusedError(
                f"the server has {self.in_flight} requests in flight, its limit "
                f"(--max-in-flight {limit}), and no slot came free in {self.wait_s:g} s "
                "(--admission-wait); retry shortly",
                "queue_wait",
            )
        return True

    def _leave(self, ticket: asyncio.Future[None]) -> None:
        """A waiter gave up: out of the queue, or, if it was woken already, its slot to
        the next waiter."""
        if not self.waiting.remove(ticket) and ticket.done() and not ticket.cancelled():
            self._reserved -= 1
            self._wake()
        ticket.cancel()

    def _wake(self) -> None:
        """Reserves each free slot for the next waiter in fair order."""
        while self.waiting and not self._full():
            ticket = self.waiting.pop()
            if ticket is not None and not ticket.done():
                self._reserved += 1
                ticket.set_result(None)

    def admit(self, request_id: str, prompt_tokens: int, reserved: bool = False) -> None:
        """Counts the request, or raises ``AdmissionRefusedError`` if a limit is reached;
        ``reserved``: it holds the slot ``turn`` reserved for it.

        A prompt larger than the whole prefill limit is still let in when nothing else is
        queued: it could never be admitted otherwise, and it is bounded by the model's
        context length anyway.
        """
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already admitted")
        if reserved:
            self._reserved -= 1  # its slot: counted below, or given back if refused
        if self._full():
            raise AdmissionRefusedError(
                f"the server has {self.in_flight} requests in flight, its limit "
                f"(--max-in-flight {self.max_in_flight}); retry shortly",
                "in_flight",
            )
        limit = self.max_queued_prefill_tokens
        queued = self.queued_prefill_tokens
        if limit is not None and queued and queued + prompt_tokens > limit:
            if reserved:
                self._wake()  # the slot it held goes to the next waiter
            raise AdmissionRefusedError(
                f"the engines have {queued} prompt tokens waiting for prefill and this "
                f"request adds {prompt_tokens}, over the limit (--max-queued-prefill-tokens "
                f"{limit}); retry shortly",
                "prefill_tokens",
            )
        self._requests[request_id] = _Admitted(prompt_tokens)
        self.queued_prefill_tokens += prompt_tokens

    def prefill_done(self, request_id: str) -> None:
        """The request's first delta arrived: its prompt is no longer queued."""
        admitted = self._requests.get(request_id)
        if admitted is not None and admitted.prefilling:
            admitted.prefilling = False
            self.queued_prefill_tokens -= admitted.prompt_tokens

    def release(self, request_id: str) -> None:
        """The request ended (or never started); a no-op if it is not counted."""
        self.prefill_done(request_id)
        if self._requests.pop(request_id, None) is not None:
            self._wake()

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests
