"""Chart points from the control plane's Prometheus registry, over a sliding window.

Design decisions:
- The charts read the same registry ``/metrics`` serves (no second bookkeeping): each
  tick takes a ``Reading`` (counter totals and histogram buckets, summed over labels),
  and a point compares the newest reading with the one ``window_s`` earlier.
- Quantiles come from the bucket counts' difference over the window, interpolated
  linearly inside a bucket as Prometheus' ``histogram_quantile`` does; a window without
  observations gives None (a gap in the chart, not a misleading zero).
- One ``MetricsWindow`` per open chart page: no state shared between clients.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

TTFT = "dynask_time_to_first_token_seconds"
ITL = "dynask_inter_token_latency_seconds"
OUTPUT_TOKENS = "dynask_output_tokens"
INPUT_TOKENS = "dynask_input_tokens"
CACHED_TOKENS = "dynask_cached_prompt_tokens"
REQUESTS = "dynask_requests"
IN_FLIGHT = "dynask_requests_in_flight"

Buckets = tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending


@dataclass(frozen=True)
class Reading:
    """Registry totals at one moment (counters and gauges summed over their labels)."""

    at: float
    totals: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, Buckets] = field(default_factory=dict)


def read_registry(registry: CollectorRegistry, at: float | None = None) -> Reading:
    """A ``Reading`` of ``registry`` now (or stamped ``at``)."""
    totals: dict[str, float] = {}
    cumulative: dict[str, dict[float, float]] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bounds = cumulative.setdefault(family.name, {})
                upper = float(sample.labels["le"])
                bounds[upper] = bounds.get(upper, 0.0) + sample.value
            elif sample.name in (family.name, f"{family.name}_total"):
                totals[family.name] = totals.get(family.name, 0.0) + sample.value
    buckets = {name: tuple(sorted(b.items())) for name, b in cumulative.items()}
    return Reading(time.time() if at is None else at, totals, buckets)


def quantile(q: float, buckets: Buckets) -> float | None:
    """The ``q`` quantile of cumulative ``buckets``; None when they hold no observation."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower_bound  # above the largest finite bucket: its bound
            share = (rank - lower_count) / (count - lower_count) if count > lower_count else 1
            return lower_bound + (upper - lower_bound) * share
        lower_bound, lower_count = upper, count
    return lower_bound


def _difference(new: Buckets, old: Buckets) -> Buckets:
    before = dict(old)
    return tuple((upper, count - before.get(upper, 0.0)) for upper, count in new)


class MetricsWindow:
    """Turns successive readings into chart points over the last ``window_s`` seconds."""

    def __init__(self, read: Callable[[], Reading], window_s: float = 10.0) -> None:
        self._read = read
        self.window_s = window_s
        self._readings: deque[Reading] = deque()

    def point(self) -> dict[str, Any]:
        """Takes a reading and returns the point for now (JSON-ready)."""
        newest = self._read()
        self._readings.append(newest)
        while len(self._readings) > 2 and newest.at - self._readings[1].at >= self.window_s:
            self._readings.popleft()
        return chart_point(self._readings[0], newest)


def chart_point(old: Reading, new: Reading) -> dict[str, Any]:
    """The chart values between two readings: rates, latency quantiles (ms), totals."""
    seconds = new.at - old.at

    def delta(name: str) -> float:
        return new.totals.get(name, 0.0) - old.totals.get(name, 0.0)

    def latency_ms(name: str, q: float) -> float | None:
        value = quantile(q, _difference(new.buckets.get(name, ()), old.buckets.get(name, ())))
        return None if value is None else round(value * 1000, 3)

    prompt_tokens = delta(INPUT_TOKENS)
    return {
        "t": round(new.at, 3),
        "tokens_per_s": round(delta(OUTPUT_TOKENS) / seconds, 3) if seconds > 0 else None,
        "ttft_p50_ms": latency_ms(TTFT, 0.5),
        "ttft_p99_ms": latency_ms(TTFT, 0.99),
        "itl_p50_ms": latency_ms(ITL, 0.5),
        "itl_p99_ms": latency_ms(ITL, 0.99),
        "kv_hit_rate": round(delta(CACHED_TOKENS) / prompt_tokens, 4) if prompt_tokens else None,
        "in_flight": new.totals.get(IN_FLIGHT, 0.0),
        "requests_total": new.totals.get(REQUESTS, 0.0),
        "output_tokens_total": new.totals.get(OUTPUT_TOKENS, 0.0),
    }
