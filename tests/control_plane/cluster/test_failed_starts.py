"""``FailedStarts``: which free workers a deployment's next actor start tries, in order."""

from __future__ import annotations

from dynask.control_plane.cluster.placement_rules import RETRY_AFTER_S, FailedStarts


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


WORKERS = [{"address": f"tcp://10.0.0.{i}:8786"} for i in (1, 2, 3)]


def _order(starts: FailedStarts, deployment: str = "smol") -> list[str]:
    return [w["address"].split(":")[1][2:] for w in starts.order(deployment, WORKERS)]


def test_workers_it_failed_on_go_last_and_wait_their_turn() -> None:
    clock = Clock()
    starts = FailedStarts(clock)
    assert _order(starts) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]

    starts.record("smol", "tcp://10.0.0.1:8786")
    clock.now += 10
    starts.record("smol", "tcp://10.0.0.3:8786")
    assert _order(starts) == ["10.0.0.2"]  # both failed within RETRY_AFTER_S
    assert _order(starts, "other") == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]  # per deployment

    clock.now += RETRY_AFTER_S - 10  # 10.0.0.1 failed RETRY_AFTER_S ago, 10.0.0.3 later
    assert _order(starts) == ["10.0.0.2", "10.0.0.1"]
    clock.now += 10
    assert _order(starts) == ["10.0.0.2", "10.0.0.1", "10.0.0.3"]  # the oldest failure first


def test_a_start_or_a_changed_desired_state_forgets_failures() -> None:
    clock = Clock()
    starts = FailedStarts(clock)
    for worker in WORKERS:
        starts.record("smol", worker["address"])
    starts.started("smol", "tcp://10.0.0.2:8786")
    assert _order(starts) == ["10.0.0.2"]
    starts.clear()
    assert _order(starts) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
