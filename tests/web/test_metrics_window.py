"""Chart points read from the serving metrics' registry."""

from __future__ import annotations

import pytest

from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.web.metrics_window import (
    OUTPUT_TOKENS,
    MetricsWindow,
    Reading,
    quantile,
    read_registry,
)


def test_quantile_interpolates_inside_a_bucket() -> None:
    buckets = ((0.1, 2.0), (0.2, 6.0), (float("inf"), 8.0))
    assert quantile(0.5, buckets) == pytest.approx(0.15)  # rank 4: halfway into (0.1, 0.2]
    assert quantile(0.25, buckets) == pytest.approx(0.1)
    assert quantile(0.99, buckets) == 0.2  # beyond the last finite bound: that bound


def test_quantile_of_nothing_is_none() -> None:
    assert quantile(0.5, ()) is None
    assert quantile(0.5, ((0.1, 0.0), (float("inf"), 0.0))) is None


def test_a_point_compares_the_newest_reading_with_the_window_start() -> None:
    metrics = ServingMetrics()
    clock = iter([100.0, 102.0])
    window = MetricsWindow(lambda: read_registry(metrics.registry, next(clock)), window_s=10)
    first = window.point()
    assert (first["tokens_per_s"], first["ttft_p50_ms"], first["requests_total"]) == (
        None,
        None,
        0.0,
    )
    metrics.output_tokens.labels("m").inc(50)
    metrics.input_tokens.labels("m").inc(40)
    metrics.cached_prompt_tokens.labels("m").inc(10)
    metrics.requests.labels("m", "chat", "200").inc()
    metrics.in_flight.set(3)
    for seconds in (0.004, 0.004, 0.004, 0.02):  # buckets (0, 0.005] and (0.01, 0.025]
        metrics.ttft.labels("m").observe(seconds)
    point = window.point()
    assert point["t"] == 102.0
    assert point["tokens_per_s"] == 25.0
    assert point["kv_hit_rate"] == 0.25
    assert (point["in_flight"], point["requests_total"], point["output_tokens_total"]) == (
        3.0,
        1.0,
        50.0,
    )
    assert point["ttft_p50_ms"] == pytest.approx(5 * 2 / 3, abs=1e-3)
    assert point["ttft_p99_ms"] == pytest.approx(10 + 15 * 0.96, abs=1e-3)
    assert point["itl_p50_ms"] is None


def test_old_readings_leave_the_window() -> None:
    """The rate spans from the newest reading at least ``window_s`` old, to now."""
    times = iter([0.0, 5.0, 11.0, 16.0])

    def read() -> Reading:
        at = next(times)
        return Reading(at, totals={OUTPUT_TOKENS: at * at})

    window = MetricsWindow(read, window_s=10)
    rates = [window.point()["tokens_per_s"] for _ in range(4)]
    assert rates == [None, 5.0, 11.0, (256 - 25) / 11]
