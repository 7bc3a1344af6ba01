"""bench/routing/router_sim_tail: each decision's beliefs against the engines' truth, the
hit accounting and the engines' busy share, on a replay small enough to follow by hand."""

from __future__ import annotations

import pytest

from bench.routing.router_sim import POLICIES
from bench.routing.router_sim_tail import (
    HitAccount,
    TailSimulation,
    cache_blocks,
    simulate,
    tail_report,
)
from bench.routing.sim_engine import SimEngine
from bench.routing.trace import TraceRequest
from bench.routing.trace_systems import matched_timing
from dynask.actors.backends.mocker_config import MockerConfig


def _prefill_ms(tokens: int) -> float:
    return 4.2e-7 * tokens**2 + 0.0152 * tokens + 16.5


def _two_conversations() -> TailSimulation:
    """Two prompts at 0 ms (the first warm), the first one's next turn at 1,000 ms."""
    requests = [
        TraceRequest(0.0, 1024, 1, (1, 2)),
        TraceRequest(0.0, 1024, 1, (3, 4)),
        TraceRequest(1000.0, 1100, 1, (1, 2, 5)),
    ]
    sim = simulate(requests, 1.0, 1, POLICIES["kv"](), actors=2)
    sim.run()
    return sim


def test_each_decision_keeps_the_routers_view_and_the_engines_truth() -> None:
    sim = _two_conversations()
    second, turn = sim.decisions[1], sim.decisions[2]

    # The second prompt sees the first one's 16 blocks queued on actor 1 (the step that
    # computes them is in flight, so no work is left to start there) and goes to actor 0.
    assert (second.actor, second.believed_prefill, second.true_prefill) == (0, [0, 16], [0, 0])
    # The next turn finds its 16 blocks on actor 1, by the events and in the engine.
    assert (turn.actor, turn.believed_overlap, turn.held_overlap) == (1, [0, 16], [0, 16])


def test_the_hit_account_counts_the_measured_requests_blocks() -> None:
    sim = _two_conversations()

    assert sim.hit_account() == HitAccount(
        prompt=33, got=16, best_held=16, chosen_held=16, lost_while_queued=0, gained_while_queued=0
    )


def test_busy_share_is_stepping_time_over_the_measured_window() -> None:
    sim = _two_conversations()
    window = 1000.0 + _prefill_ms(76)  # the last first token: 76 uncached tokens at 1,000 ms

    assert sim.busy_share() == pytest.approx(
        [_prefill_ms(1024) / window, (_prefill_ms(1024) + _prefill_ms(76)) / window]
    )


def test_the_report_names_the_slowest_by_their_trace_line() -> None:
    sim = _two_conversations()

    report = tail_report(sim, first_index=500, share=0.5)

    [slowest] = report["slowest"]
    assert (slowest["request"], slowest["got"]) == (500, 0)
    assert slowest["ttft_ms"] == pytest.approx(_prefill_ms(1024))


def test_cache_blocks_counts_what_more_than_one_engine_holds() -> None:
    config = MockerConfig(**matched_timing(64))
    first, second = SimEngine("actor-0", config), SimEngine("actor-1", config)
    first.refs.update({(1, 0): 1, (1, 1): 1})  # in use
    first.free_cached.update({(2, 0): None})  # free, still cached
    second.free_cached.update({(1, 0): None, (3, 0): None})

    assert cache_blocks([first, second]) == (5, 4)  # (1, 0) is on both


def test_the_report_samples_the_caches_at_measured_decisions() -> None:
    sim = _two_conversations()  # measured: requests 1 (at 0 ms) and 2 (at 1,000 ms)

    cache = tail_report(sim, first_index=0, share=0.5)["cache_blocks"]

    # Only request 1's decision is sampled (every 10th measured one): by then actor 1 holds
    # the warm request's 16 full blocks, admitted with it, and nothing else is cached.
    assert cache == {"samples": 1, "held_mean": 16, "distinct_mean": 16, "duplicate_share": 0.0}
