"""The planner's decision (a pure function) and the latency window it reads."""

from __future__ import annotations

import argparse

import pytest

from dynask.control_plane.cli.planner_flags import add_planner_args, planner_config
from dynask.control_plane.planner.decision import DeploymentLoad, PlannerConfig, decide
from dynask.control_plane.serving.latency_window import LatencySummary, LatencyWindow, percentile

CONFIG = PlannerConfig(
    ttft_target_ms=200,
    itl_target_ms=20,
    max_workers=6,
    window_s=10,
    scale_up_at=1.0,
    scale_down_margin=0.7,
)


def load(
    name: str = "decode",
    role: str = "decode",
    replicas: int = 2,
    ready: int | None = None,
    itl_ms: float | None = 10.0,
    ttft_ms: float | None = 100.0,
    rate: float = 4.0,
    previous_rate: float | None = None,
    kv_usage: float = 0.0,
) -> DeploymentLoad:
    requests = int(rate * CONFIG.window_s)
    summary = LatencySummary(
        requests=requests,
        request_rate=rate,
        ttft_p90_s=None if ttft_ms is None else ttft_ms / 1000,
        itl_p90_s=None if itl_ms is None else itl_ms / 1000,
    )
    return DeploymentLoad(
        name, role, replicas, replicas if ready is None else ready, summary, previous_rate, kv_usage
    )


def test_itl_over_target_adds_decode_replicas_in_proportion() -> None:
    decision = decide(CONFIG, [load(itl_ms=30.0)], None)
    assert decision.replicas == {"decode": 3}  # ceil(2 * 30/20)
    assert decision.reasons["decode"] == (
        "ITL p90 30.0 ms (target 20) at 4.00 req/s (predicted 4.00): 2 -> 3"
    )


def test_a_rising_rate_is_planned_for_and_steps_are_bounded() -> None:
    rising = decide(CONFIG, [load(itl_ms=22.0, rate=4.0, previous_rate=3.0)], None)
    assert rising.replicas == {"decode": 3}  # ceil(2 * 1.1 * 1.25) = 3
    assert "predicted 5.00" in rising.reasons["decode"]
    far_over = decide(CONFIG, [load(itl_ms=200.0)], None)
    assert far_over.replicas == {"decode": 4}  # at most max_step (2) more at a time


def test_the_budget_is_never_exceeded_and_the_most_pressed_grows() -> None:
    loads = [
        load("prefill", "prefill", replicas=2, ttft_ms=300.0),  # ratio 1.5
        load("decode", "decode", replicas=3, itl_ms=40.0),  # ratio 2
    ]
    decision = decide(CONFIG, loads, None)
    assert decision.replicas == {"decode": 4}  # 2 + 3 + 1 = 6 workers: prefill trimmed
    assert sum({"prefill": 2, **decision.replicas}.values()) == CONFIG.max_workers
    at_budget = decide(CONFIG, [load(replicas=6, itl_ms=80.0)], None)
    assert at_budget.replicas == {}
    assert "trimmed to 6: budget of 6 workers" in at_budget.hold


def test_roles_answer_for_their_own_target() -> None:
    slow_ttft = decide(CONFIG, [load(role="decode", ttft_ms=900.0, itl_ms=10.0)], None)
    assert slow_ttft.replicas == {}  # a decode deployment does not answer for TTFT
    prefill = decide(CONFIG, [load("p", "prefill", ttft_ms=300.0, itl_ms=90.0)], None)
    assert prefill.replicas == {"p": 3}
    assert prefill.reasons["p"].startswith("TTFT p90 300 ms (target 200)")
    aggregated = decide(CONFIG, [load("a", "aggregated", ttft_ms=100.0, itl_ms=50.0)], None)
    assert aggregated.replicas == {"a": 4}  # ceil(2 * 2.5) = 5, at most max_step (2) more
    assert aggregated.reasons["a"].startswith("ITL p90 50.0 ms (target 20)")


def test_headroom_scales_up_before_the_target_is_missed() -> None:
    config = PlannerConfig(itl_target_ms=20, window_s=10)  # scale_up_at 0.8
    decision = decide(config, [load(itl_ms=17.0)], None)  # 85% of the target
    assert decision.replicas == {"decode": 3}  # ceil(2 * 0.85 / 0.8) = 3
    assert decide(config, [load(itl_ms=15.0)], None).replicas == {}  # 75%: keep


def test_a_full_kv_cache_counts_as_a_miss() -> None:
    decision = decide(CONFIG, [load(itl_ms=10.0, kv_usage=0.95)], None)
    assert decision.replicas == {"decode": 3}
    assert "KV cache 95% full" in decision.reasons["decode"]


def test_scaling_down_is_one_at_a_time_and_never_below_the_minimum() -> None:
    quiet = decide(CONFIG, [load(replicas=3, itl_ms=8.0)], None)  # 8 * 3/2 = 12 < 14
    assert quiet.replicas == {"decode": 2}
    assert "projected 60% of target on 2: 3 -> 2" in quiet.reasons["decode"]
    close = decide(CONFIG, [load(replicas=3, itl_ms=10.0)], None)  # 15 >= 14: keep
    assert close.replicas == {}
    assert close.hold.endswith("keep 3")
    rising = decide(CONFIG, [load(replicas=3, itl_ms=8.0, rate=4.0, previous_rate=2.0)], None)
    assert rising.replicas == {}
    idle = decide(CONFIG, [load(replicas=2, rate=0.0, itl_ms=None, ttft_ms=None)], None)
    assert idle.replicas == {"decode": 1}
    assert idle.reasons["decode"] == "no requests in the last 10s: 2 -> 1"
    floor = decide(CONFIG, [load(replicas=1, rate=0.0, itl_ms=None, ttft_ms=None)], None)
    assert (floor.replicas, floor.hold) == ({}, "decode: no requests")


def test_no_decision_while_actors_start_or_metrics_settle() -> None:
    starting = decide(CONFIG, [load(replicas=3, ready=2, itl_ms=90.0)], None)
    assert starting.replicas == {}
    assert starting.hold == "waiting for actors to become ready: decode (2/3 ready)"
    settling = decide(CONFIG, [load(itl_ms=90.0)], 4.0)
    assert settling.replicas == {}
    assert settling.hold == "waiting for 10s of metrics since the last change (4.0s so far)"
    assert decide(CONFIG, [load(itl_ms=90.0)], 10.0).replicas == {"decode": 4}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("itl_target_ms", 0, "'itl_target_ms' has value 0; expected a number > 0"),
        ("max_workers", 0, "'max_workers' has value 0; expected an integer >= max"),
        ("scale_down_margin", 0.9, "'scale_down_margin' has value 0.9; expected a number in"),
        ("scale_up_at", 1.5, "'scale_up_at' has value 1.5; expected a number in"),
        ("min_replicas", -1, "'min_replicas' has value -1; expected an integer >= 0"),
    ],
)
def test_config_names_the_bad_field(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlannerConfig(**{field: value})  # type: ignore[arg-type]


def test_flags_make_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_planner_args(parser)
    assert planner_config(parser.parse_args([])) is None
    config = planner_config(
        parser.parse_args(
            [
                "--planner",
                "--planner-dry-run",
                "--itl-target-ms",
                "25",
                "--planner-max-workers",
                "4",
            ]
        )
    )
    assert config == PlannerConfig(itl_target_ms=25, max_workers=4, dry_run=True)
    with pytest.raises(ValueError, match="--planner-dry-run needs --planner"):
        planner_config(parser.parse_args(["--planner-dry-run"]))


def test_the_window_keeps_recent_requests_per_model() -> None:
    now = [100.0]
    window = LatencyWindow(clock=lambda: now[0])
    window.observe_stream("m", 0.05, last=100.0, first=99.0, later_deltas=10)
    window.observe_stream("m", 0.20, last=None, first=0.0, later_deltas=0)  # nothing delivered
    window.observe_stream("other", 0.30, last=100.0, first=100.0, later_deltas=0)
    now[0] = 105.0
    window.observe("m", 0.10, 0.3)
    assert window.summary("m", 10.0) == LatencySummary(2, 0.2, 0.10, 0.3)
    assert window.summary("m", 1.0) == LatencySummary(1, 1.0, 0.10, 0.3)
    assert window.summary("other", 10.0) == LatencySummary(1, 0.1, 0.30, None)
    assert window.summary("none", 10.0) == LatencySummary(0, 0.0, None, None)
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.9) == 5.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
