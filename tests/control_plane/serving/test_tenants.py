"""Tenant limits, on a clock the test moves (exact values)."""

from __future__ import annotations

import pytest

from dynask.control_plane.serving.tenants import (
    Tenant,
    TenantGate,
    TenantLimitError,
)
from dynask.control_plane.state.api_keys import TenantLimits


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _gate() -> tuple[TenantGate, _Clock, list[tuple[str, int]]]:
    clock, seen = _Clock(), []
    return TenantGate(clock, lambda t, n: seen.append((t, n))), clock, seen


def test_concurrency_limit_refuses_the_next_request_until_one_ends() -> None:
    gate, _, seen = _gate()
    noisy = Tenant("noisy", TenantLimits(max_concurrent=2))
    gate.admit("a", noisy, 10)
    gate.admit("b", noisy, 10)
    with pytest.raises(TenantLimitError) as caught:
        gate.admit("c", noisy, 10)
    assert caught.value.limit == "max_concurrent"
    assert "has 2 requests in flight, its limit (2 concurrent)" in str(caught.value)
    gate.admit("q", Tenant("quiet"), 10)  # another tenant keeps its share
    gate.release("a")
    gate.release("a")  # idempotent
    gate.admit("c", noisy, 10)
    assert seen == [("noisy", 1), ("noisy", 2), ("quiet", 1), ("noisy", 1), ("noisy", 2)]


def test_request_rate_is_a_bucket_of_one_second_of_requests() -> None:
    gate, clock, _ = _gate()
    tenant = Tenant("t", TenantLimits(requests_per_s=2.0))
    gate.admit("1", tenant, 1)  # a new tenant starts with a full bucket: 2 at once
    gate.admit("2", tenant, 1)
    with pytest.raises(TenantLimitError) as first:
        gate.admit("3", tenant, 1)
    clock.now += 0.25
    with pytest.raises(TenantLimitError) as second:
        gate.admit("3", tenant, 1)
    clock.now += 0.25
    gate.admit("3", tenant, 1)

    assert first.value.limit == "requests_per_s"
    assert (first.value.retry_after_s, second.value.retry_after_s) == (0.5, 0.25)


def test_tokens_per_minute_counts_prompt_and_max_tokens_over_a_sliding_minute() -> None:
    gate, clock, _ = _gate()
    tenant = Tenant("t", TenantLimits(tokens_per_minute=100))
    gate.admit("1", tenant, 60)
    clock.now += 20
    gate.admit("2", tenant, 30)
    with pytest.raises(TenantLimitError) as caught:
        gate.admit("3", tenant, 20)
    assert caught.value.limit == "tokens_per_minute"
    assert caught.value.retry_after_s == pytest.approx(40.0)  # when the first 60 expire
    clock.now += 40
    gate.admit("3", tenant, 20)


def test_a_request_larger_than_the_whole_token_limit_passes_when_nothing_else_counts() -> None:
    gate, _, _ = _gate()
    gate.admit("big", Tenant("t", TenantLimits(tokens_per_minute=10)), 500)


def test_refuse_early_answers_as_admit_would_and_counts_nothing() -> None:
    gate, clock, seen = _gate()
    tenant = Tenant("t", TenantLimits(requests_per_s=1.0, max_concurrent=2, tokens_per_minute=100))
    gate.refuse_early(tenant)  # a tenant never seen: nothing to refuse
    gate.admit("a", tenant, 100)
    seen.clear()
    with pytest.raises(TenantLimitError) as caught:
        gate.refuse_early(tenant)
    assert caught.value.limit == "requests_per_s"  # one request/s: the bucket is empty
    clock.now += 1.0
    with pytest.raises(TenantLimitError) as caught:
        gate.refuse_early(tenant)
    assert caught.value.limit == "tokens_per_minute"  # 100 of 100 used: any request is over
    clock.now += 60.0
    gate.refuse_early(tenant)
    assert gate.in_flight("t") == 1 and seen == []  # counted nothing
    gate.admit("b", tenant, 1)
    clock.now += 1.0
    with pytest.raises(TenantLimitError) as caught:
        gate.refuse_early(tenant)
    assert caught.value.limit == "max_concurrent"


def test_limits_name_the_bad_field() -> None:
    with pytest.raises(ValueError, match="'max_concurrent' has value 0"):
        TenantLimits(max_concurrent=0)
    with pytest.raises(ValueError, match="'priority' has value 'urgent'; expected one of"):
        TenantLimits(priority="urgent")
    assert TenantLimits(5, 2, 1000, "high").describe() == (
        "5 req/s, 2 concurrent, 1000 tokens/min, priority high"
    )


def test_the_priority_header_may_lower_a_class_never_raise_it() -> None:
    from dynask.control_plane.serving.errors import InvalidRequestError
    from dynask.control_plane.serving.metrics import ServingMetrics
    from dynask.control_plane.serving.service import ServingService
    from dynask.control_plane.state.api_keys import KeyTenant

    service = ServingService(ServingMetrics())
    high = KeyTenant("batch (dsk_abc)", TenantLimits(max_concurrent=3, priority="high"))
    lowered = service.tenant(high, None, " LOW ")
    assert (lowered.name, lowered.limits) == (
        "batch (dsk_abc)",
        TenantLimits(max_concurrent=3, priority="low"),
    )
    assert service.tenant(high, None, "high").limits.priority == "high"
    assert service.tenant(None, "u1", "high").limits.priority == "normal"  # never raised
    assert service.tenant(None, None, "low").limits.priority == "low"
    with pytest.raises(InvalidRequestError) as caught:
        service.tenant(None, None, "urgent")
    assert str(caught.value) == (
        "the header x-dynask-priority has value 'urgent'; expected one of high, normal, low"
    )
