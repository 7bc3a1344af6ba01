"""Tenants: per-API-key (or per ``user`` field) limits and priority classes at admission.

Design decisions:

- A tenant is an API key (its name and prefix) when keys are required, else the request's
  ``user`` field, else ``anonymous``. Key tenants carry the limits stored on the key;
  the others get the server's defaults (``--tenant-*`` flags).
- Three limits, checked before the request is routed so the answer is a plain 429 with
  ``Retry-After`` (OpenAI's ``rate_limit_exceeded`` shape), streaming or not: requests/s
  (a token bucket holding up to one second of requests), concurrent requests, and
  tokens/minute (prompt + ``max_tokens`` of each request admitted in the last 60 s: what
  the request may cost, known before it runs). A tenant over its limit is refused; the
  others keep their share.
- Cheap first: ``refuse_early`` answers a tenant already over its concurrency, rate or
  token limit before its request is templated and tokenized (the costly part of a
  request before admission, run in a worker thread but holding the GIL most of the
  time), so a noisy tenant's refused requests cost the server almost nothing. The exact
  check (with the request's tokens) is ``admit``'s, after tokenizing.
- Priority classes (``high``, ``normal``, ``low``: on the key, or the
  ``x-dynask-priority`` header for a trusted caller) do not change the tenant's limits:
  they weigh its turn when the server is at ``--max-in-flight`` and requests wait
  (``admission``, ``fair_queue``). A tenant's waiting requests count against its
  concurrency limit, so one tenant cannot fill the queue either.
- Counting is O(1) per request on the event loop, except the tokens/minute window
  (one deque entry per request of the last minute).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dynask.control_plane.flags import flag, positive_int
from dynask.control_plane.serving.errors import ServingError
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.state.api_keys import TenantLimits

WINDOW_S = 60.0
ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class TenantDefaults:
    """The limits of tenants without a key of their own; its fields are the ``--tenant-*``
    flags (``control_plane.flags``). None: unlimited."""

    requests_per_s: float | None = flag(
        "--tenant-requests-per-s", None, "requests/s per tenant (default: no limit)", type=float
    )
    max_concurrent: int | None = flag(
        "--tenant-max-concurrent",
        None,
        "requests at once per tenant (default: no limit)",
        type=positive_int,
    )
    tokens_per_minute: int | None = flag(
        "--tenant-tokens-per-minute",
        None,
        "prompt + max_tokens admitted per minute per tenant (default: no limit)",
        type=positive_int,
    )

    def limits(self) -> TenantLimits:
        """The ``TenantLimits`` (normal priority); ``ValueError`` if a value is bad."""
        return TenantLimits(self.requests_per_s, self.max_concurrent, self.tokens_per_minute)


class TenantLimitError(ServingError):
    """A tenant is over one of its limits (a 429 over HTTP); ``retry_after_s`` says when
    to come back."""

    def __init__(self, message: str, limit: str, retry_after_s: float) -> None:
        super().__init__(message, code="rate_limit_exceeded")
        self.limit = limit  # "requests_per_s", "max_concurrent", "tokens_per_minute"
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Tenant:
    """Who a request counts against, and their limits."""

    name: str
    limits: TenantLimits = field(default_factory=TenantLimits)


@dataclass
class _Usage:
    in_flight: set[str] = field(default_factory=set)
    bucket: float = math.inf  # requests the rate still allows now (a new tenant: full)
    bucket_at: float = 0.0
    window: deque[tuple[float, int]] = field(default_factory=deque)  # (admitted at, tokens)
    window_tokens: int = 0


class TenantGate:
    """Each tenant's requests in flight, request rate and tokens, against its limits."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        observe: Callable[[str, int], None] = lambda tenant, in_flight: None,
    ) -> None:
        self._clock = clock
        self._observe = observe  # (tenant, requests in flight) after every change
        self._usage: dict[str, _Usage] = {}
        self._owner: dict[str, str] = {}  # request id -> tenant name

    def in_flight(self, tenant: str) -> int:
        usage = self._usage.get(tenant)
        return len(usage.in_flight) if usage else 0

    def refuse_early(self, tenant: Tenant) -> None:
        """Raises the ``TenantLimitError`` ``admit`` would raise for any request of
        ``tenant`` now, whatever its size; counts nothing. Cheap: call it first."""
        usage = self._usage.get(tenant.name)
        if usage is not None:
            refusal = self._refusal(tenant, usage, 1, self._clock())
            if refusal is not None:
                raise refusal

    def admit(self, request_id: str, tenant: Tenant, tokens: int) -> None:
        """Counts the request against ``tenant``, or raises ``TenantLimitError``."""
        limits, now = tenant.limits, self._clock()
        usage = self._usage.setdefault(tenant.name, _Usage(bucket_at=now))
        refusal = self._refusal(tenant, usage, tokens, now)
        if refusal is not None:
            raise refusal
        if limits.requests_per_s is not None:
            usage.bucket -= 1.0
        usage.window.append((now, tokens))
        usage.window_tokens += tokens
        usage.in_flight.add(request_id)
        self._owner[request_id] = tenant.name
        self._observe(tenant.name, len(usage.in_flight))

    def _refusal(
        self, tenant: Tenant, usage: _Usage, tokens: int, now: float
    ) -> TenantLimitError | None:
        limits = tenant.limits
        if limits.max_concurrent is not None and len(usage.in_flight) >= limits.max_concurrent:
            return TenantLimitError(
                f"tenant {tenant.name!r} has {len(usage.in_flight)} requests in flight, its "
                f"limit ({limits.max_concurrent} concurrent); retry when one ends",
                "max_concurrent",
                1.0,
            )
        if limits.requests_per_s is not None:
            self._refill(usage, limits.requests_per_s, now)
            if usage.bucket < 1.0:
                wait = (1.0 - usage.bucket) / limits.requests_per_s
                return TenantLimitError(
                    f"tenant {tenant.name!r} is over its rate limit "
                    f"({limits.requests_per_s:g} requests/s); retry in {wait:.2f} s",
                    "requests_per_s",
                    wait,
                )
        if limits.tokens_per_minute is not None:
            self._expire(usage, now)
            if usage.window_tokens and usage.window_tokens + tokens > limits.tokens_per_minute:
                wait = self._tokens_free_in(usage, tokens, limits.tokens_per_minute, now)
                return TenantLimitError(
                    f"tenant {tenant.name!r} has used {usage.window_tokens} tokens in the last "
                    f"minute and this request may use {tokens} (prompt + max_tokens), over its "
                    f"limit ({limits.tokens_per_minute} tokens/minute); retry in {wait:.0f} s",
                    "tokens_per_minute",
                    wait,
                )
        return None

    def slot(self, tenant: Tenant, metrics: ServingMetrics) -> TenantSlot:
        """What ``AdmittedRequest`` takes for one request of ``tenant`` (and gives back)."""
        return TenantSlot(self, tenant, metrics)

    def release(self, request_id: str) -> None:
        """The request ended (or never started); a no-op if it is not counted."""
        name = self._owner.pop(request_id, None)
        if name is not None:
            in_flight = self._usage[name].in_flight
            in_flight.discard(request_id)
            self._observe(name, len(in_flight))

    @staticmethod
    def _refill(usage: _Usage, rate: float, now: float) -> None:
        capacity = max(1.0, rate)  # bursts of up to one second of requests
        usage.bucket = min(capacity, usage.bucket + (now - usage.bucket_at) * rate)
        usage.bucket_at = now

    @staticmethod
    def _expire(usage: _Usage, now: float) -> None:
        while usage.window and usage.window[0][0] <= now - WINDOW_S:
            usage.window_tokens -= usage.window.popleft()[1]

    @staticmethod
    def _tokens_free_in(usage: _Usage, tokens: int, limit: int, now: float) -> float:
        """Seconds until enough of the window expires for ``tokens`` more."""
        left = usage.window_tokens
        for admitted_at, used in usage.window:
            left -= used
            if left + tokens <= limit or left == 0:
                return max(0.0, admitted_at + WINDOW_S - now)
        return WINDOW_S


@dataclass(frozen=True)
class TenantSlot:
    """One request's place in its tenant's limits and priority band."""

    gate: TenantGate
    tenant: Tenant
    metrics: ServingMetrics

    def take(self, request_id: str, tokens: int) -> None:
        """Counts the request against its tenant's limits, or raises ``TenantLimitError``."""
        name = self.tenant.name
        counted = self.metrics.tenant_requests
        try:
            self.gate.admit(request_id, self.tenant, tokens)
        except TenantLimitError as exc:
            counted.labels(name, exc.limit).inc()
            raise
        counted.labels(name, "admitted").inc()
        self.metrics.tenant_tokens.labels(name).inc(tokens)

    def release(self, request_id: str) -> None:
        self.gate.release(request_id)
