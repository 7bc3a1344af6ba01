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
- At either limit a request waits for room (``turn``) up to ``wait_s`` seconds instead
  of being refused at once, and room goes to waiters in weighted fair order: deficit
  round robin over the priority classes, round robin over the tenants of each class
  (``fair_queue``). A waiter is woken by a freed slot or by queued prompt tokens
  reaching their first token. The room a waiter is given is *reserved* for it (a
  ``Reservation``: a request arriving meanwhile cannot take it, no barging) and given
  back if that waiter has gone (its client disconnected, or its time ran out). At most
  ``max_waiting`` (by default ``max_in_flight``) requests wait; one more is refused at
  once.
- A request of several choices (``n``, ``best_of``, a list of prompts) waits for room
  for *all* of them at once: its siblings are generated together, so admitting some
  and waiting for the rest could hold slots that only its own siblings would free (two
  such requests would block each other until their waits ran out). The waiter whose
  turn it is keeps its turn until its whole room is free (head of line: a large request
  is never passed over forever by small ones). One that can never fit
  (more choices than ``--max-in-flight``) is refused by its caller.
- Counting is O(1) per event, on the event loop; only ``turn`` awaits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from dynask.control_plane.serving.errors import UnavailableError
from dynask.control_plane.serving.fair_queue import FairQueue

RETRY_AFTER_S = 1
# How many may wait when only the prefill-token limit is set (else ``max_in_flight``).
DEFAULT_MAX_WAITING = 1024


class AdmissionRefusedError(UnavailableError):
    """The server is at one of its admission limits; the message says which."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message, code="overloaded", retry_after_s=RETRY_AFTER_S)
        self.limit = limit  # "in_flight", "queue_full", "queue_wait" or "prefill_tokens"


@dataclass(slots=True)
class _Admitted:
    prompt_tokens: int
    prefilling: bool = True


@dataclass(slots=True)
class Reservation:
    """Room held for a waiter whose turn came, until its requests come in (``admit``
    takes one slot and that request's prompt tokens from it) or it is given back."""

    slots: int
    tokens: int


@dataclass(eq=False, slots=True)
class _Waiter:
    slots: int
    tokens: int
    woken: asyncio.Future[None]
    reservation: Reservation | None = None


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
        if max_waiting is None:
            max_waiting = DEFAULT_MAX_WAITING if max_in_flight is None else max_in_flight
        self.max_waiting = max_waiting
        self.max_queued_prefill_tokens = max_queued_prefill_tokens
        self.wait_s = wait_s
        self.queued_prefill_tokens = 0
        self._requests: dict[str, _Admitted] = {}
        self.waiting: FairQueue[_Waiter] = FairQueue()
        self._head: _Waiter | None = None  # its turn came; it waits for its whole room
        self._reserved = 0  # slots reserved for woken waiters that have not come in yet
        self._reserved_tokens = 0  # and their prompt tokens

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    @property
    def waiters(self) -> int:
        """How many requests wait for their turn (or for their whole room)."""
        return len(self.waiting) + (self._head is not None)

    def _slots_free(self, slots: int) -> bool:
        limit = self.max_in_flight
        return limit is None or self.in_flight + self._reserved + slots <= limit

    def _tokens_free(self, tokens: int) -> bool:
        """Room for ``tokens`` more queued prompt tokens; when none are queued any prompt
        fits (a prompt larger than the whole limit could never get in otherwise)."""
        limit, pending = self.max_queued_prefill_tokens, self.queued_prefill_tokens
        pending += self._reserved_tokens
        return limit is None or not pending or pending + tokens <= limit

    async def turn(
        self, priority: str, tenant: str, slots: int = 1, prompt_tokens: int = 0
    ) -> Reservation:
        """Waits until there is room for ``slots`` requests of ``tenant`` (class
        ``priority``) with ``prompt_tokens`` prompt tokens between them, and reserves it:
        pass the ``Reservation`` to ``admit`` for each request, then ``give_back`` what
        is left. Raises ``AdmissionRefusedError`` when there is no room and waiting is
        off, too many wait, or the wait is over ``wait_s``."""
        free = self._slots_free(slots) and self._tokens_free(prompt_tokens)
        if free and self._head is None and not self.waiting:
            return self._reserve(slots, prompt_tokens)
        if self.wait_s <= 0:
            raise self._refusal(slots, prompt_tokens, "--admission-wait is 0", "")
        if self.waiters >= self.max_waiting:
            raise self._refusal(slots, prompt_tokens, "the wait queue is full", "queue_full")
        waiter = _Waiter(slots, prompt_tokens, asyncio.get_running_loop().create_future())
        self.waiting.push(waiter, priority, tenant)
        try:  # ``wait``, not ``wait_for``: 3.11's may swallow a cancellation
            done, _ = await asyncio.wait((waiter.woken,), timeout=self.wait_s)
        except BaseException:  # its client went away while it waited
            self._leave(waiter)
            raise
        if not done:
            self._leave(waiter)
            missing = "slot" if not self._slots_free(slots) else "room"
            raise self._refusal(
                slots,
                prompt_tokens,
                f"no {missing} came free in {self.wait_s:g} s (--admission-wait)",
                "queue_wait",
            )
        assert waiter.reservation is not None
        return waiter.reservation

    def _reserve(self, slots: int, tokens: int) -> Reservation:
        self._reserved += slots
        self._reserved_tokens += tokens
        return Reservation(slots, tokens)

    def _refusal(self, slots: int, tokens: int, why: str, limit: str) -> AdmissionRefusedError:
        """The refusal of a request with no room: the limit it is at, and ``why`` it
        did not wait (``limit`` names the refusal; "" for the limit itself)."""
        if not self._slots_free(slots):
            return AdmissionRefusedError(
                f"the server has {self.in_flight} requests in flight, its limit "
                f"(--max-in-flight {self.max_in_flight}), and {why}; retry shortly",
                limit or "in_flight",
            )
        return AdmissionRefusedError(
            f"the engines have {self.queued_prefill_tokens} prompt tokens waiting for "
            f"prefill and this request adds {tokens}, over the limit "
            f"(--max-queued-prefill-tokens {self.max_queued_prefill_tokens}), and {why}; "
            "retry shortly",
            limit or "prefill_tokens",
        )

    def _leave(self, waiter: _Waiter) -> None:
        """A waiter gave up: out of the queue (or off the head), or, if it was woken
        already, its reserved room to the next waiter."""
        if self._head is waiter:
            self._head = None
            self._wake()
        elif not self.waiting.remove(waiter) and waiter.reservation is not None:
            self.give_back(waiter.reservation)
        waiter.woken.cancel()

    def give_back(self, reservation: Reservation) -> None:
        """Returns what is left of ``reservation`` (requests that never came in)."""
        self._reserved -= reservation.slots
        self._reserved_tokens -= reservation.tokens
        reservation.slots = reservation.tokens = 0
        self._wake()

    def _wake(self) -> None:
        """Gives the next waiters in fair order their room while it is free; the one
        whose turn came and whose room is not free yet keeps its turn (``_head``)."""
        while True:
            head = self._head
            if head is None:
                head = self.waiting.pop()
                if head is None:
                    return
                if head.woken.done():
                    continue
                self._head = head
            if not (self._slots_free(head.slots) and self._tokens_free(head.tokens)):
                return
            self._head = None
            head.reservation = self._reserve(head.slots, head.tokens)
            head.woken.set_result(None)

    def admit(
        self, request_id: str, prompt_tokens: int, reserved: Reservation | None = None
    ) -> None:
        """Counts the request, or raises ``AdmissionRefusedError`` if a limit is reached.
        With ``reserved`` (from ``turn``) it takes one slot and its prompt tokens from
        that reservation instead: the room was checked when it was made.

        A prompt larger than the whole prefill limit is still let in when nothing else is
        queued: it could never be admitted otherwise, and it is bounded by the model's
        context length anyway.
        """
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already admitted")
        if reserved is not None and reserved.slots > 0:
            tokens = min(prompt_tokens, reserved.tokens)
            reserved.slots -= 1
            reserved.tokens -= tokens
            self._reserved -= 1
            self._reserved_tokens -= tokens
        else:
            self._check(prompt_tokens)
        self._requests[request_id] = _Admitted(prompt_tokens)
        self.queued_prefill_tokens += prompt_tokens

    def _check(self, prompt_tokens: int) -> None:
        if self.waiters:  # the room that is free is the next waiter's: no barging
            raise AdmissionRefusedError(
                f"{self.waiters} requests wait for room ahead of this one (--max-in-flight "
                f"{self.max_in_flight}, --max-queued-prefill-tokens "
                f"{self.max_queued_prefill_tokens}); retry shortly",
                "queue_full",
            )
        if not self._slots_free(1):
            raise AdmissionRefusedError(
                f"the server has {self.in_flight} requests in flight, its limit "
                f"(--max-in-flight {self.max_in_flight}); retry shortly",
                "in_flight",
            )
        if not self._tokens_free(prompt_tokens):
            raise AdmissionRefusedError(
                f"the engines have {self.queued_prefill_tokens} prompt tokens waiting for "
                f"prefill and this request adds {prompt_tokens}, over the limit "
                f"(--max-queued-prefill-tokens {self.max_queued_prefill_tokens}); retry "
                "shortly",
                "prefill_tokens",
            )

    def prefill_done(self, request_id: str) -> None:
        """The request's first delta arrived: its prompt is no longer queued."""
        admitted = self._requests.get(request_id)
        if admitted is not None and admitted.prefilling:
            admitted.prefilling = False
            self.queued_prefill_tokens -= admitted.prompt_tokens
            if self.waiters:
                self._wake()

    def release(self, request_id: str) -> None:
        """The request ended (or never started); a no-op if it is not counted."""
        self.prefill_done(request_id)
        if self._requests.pop(request_id, None) is not None:
            self._wake()

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests
