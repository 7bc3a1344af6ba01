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
- Counting is O(1) per event, on the event loop; nothing here awaits.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynask.control_plane.serving.errors import UnavailableError

RETRY_AFTER_S = 1


class AdmissionRefusedError(UnavailableError):
    """The server is at one of its admission limits; the message says which."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message, code="overloaded", retry_after_s=RETRY_AFTER_S)
        self.limit = limit  # "in_flight" or "prefill_tokens"


@dataclass(slots=True)
class _Admitted:
    prompt_tokens: int
    prefilling: bool = True


class Admission:
    """Requests in flight and their queued prefill tokens, against two limits."""

    def __init__(self, max_in_flight: int | None, max_queued_prefill_tokens: int | None) -> None:
        self.max_in_flight = max_in_flight
        self.max_queued_prefill_tokens = max_queued_prefill_tokens
        self.queued_prefill_tokens = 0
        self._requests: dict[str, _Admitted] = {}

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    def admit(self, request_id: str, prompt_tokens: int) -> None:
        """Counts the request, or raises ``AdmissionRefusedError`` if a limit is reached.

        A prompt larger than the whole prefill limit is still let in when nothing else is
        queued: it could never be admitted otherwise, and it is bounded by the model's
        context length anyway.
        """
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already admitted")
        if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
            raise AdmissionRefusedError(
                f"the server has {self.in_flight} requests in flight, its limit "
                f"(--max-in-flight {self.max_in_flight}); retry shortly",
                "in_flight",
            )
        limit = self.max_queued_prefill_tokens
        queued = self.queued_prefill_tokens
        if limit is not None and queued and queued + prompt_tokens > limit:
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
        self._requests.pop(request_id, None)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests
