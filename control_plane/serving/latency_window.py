"""Recent requests' TTFT and inter-token latency per model, for the planner.

Design decisions:
- One sample per finished request (its TTFT and its mean ITL), kept with the time it
  finished: the planner asks for the requests of the last N seconds, so the request rate
  and the share meeting the targets come from the same samples. The Prometheus
  histograms stay the operator's view; they cannot be read back as a window.
- Bounded: a model keeps at most ``max_samples`` samples; older ones fall off.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestSample:
    """One finished request: when it finished, its TTFT and mean ITL (seconds)."""

    at: float
    ttft_s: float
    itl_s: float | None  # None: a single delivery, no gap to measure


@dataclass(frozen=True)
class LatencySummary:
    """Requests of a window: how many per second, and their 90th-percentile latencies."""

    requests: int
    request_rate: float
    ttft_p90_s: float | None
    itl_p90_s: float | None


class LatencyWindow:
    """Per-model samples of recent requests (the control plane records, the planner reads)."""

    def __init__(
        self, max_samples: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_samples = max_samples
        self.clock = clock
        self._samples: dict[str, deque[RequestSample]] = {}

    def observe(self, model: str, ttft_s: float, itl_s: float | None) -> None:
        samples = self._samples.setdefault(model, deque(maxlen=self.max_samples))
        samples.append(RequestSample(self.clock(), ttft_s, itl_s))

    def observe_stream(
        self, model: str, ttft_s: float, last: float | None, first: float, later_deltas: int
    ) -> None:
        """A finished stream: its mean ITL is the time from the first delivery to the last
        over the deltas after the first delivery (none: a single delivery)."""
        if last is None:
            return  # nothing was delivered
        self.observe(model, ttft_s, (last - first) / later_deltas if later_deltas else None)

    def recent(self, model: str, window_s: float) -> list[RequestSample]:
        since = self.clock() - window_s
        return [s for s in self._samples.get(model, ()) if s.at >= since]

    def summary(self, model: str, window_s: float) -> LatencySummary:
        samples = self.recent(model, window_s)
        itls = [s.itl_s for s in samples if s.itl_s is not None]
        return LatencySummary(
            requests=len(samples),
            request_rate=len(samples) / window_s,
            ttft_p90_s=percentile([s.ttft_s for s in samples], 0.9),
            itl_p90_s=percentile(itls, 0.9),
        )


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile of ``values`` (None when there are none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
