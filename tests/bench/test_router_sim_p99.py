"""bench/routing/router_sim_p99: the survival oracle's credit and the eviction age of an
engine, on an engine of two blocks followed by hand."""

from __future__ import annotations

import dataclasses

from bench.routing.router_sim_p99 import AgedEngine, _surviving
from bench.routing.sim_engine import SimSequence, block_keys
from bench.routing.trace import TraceRequest
from bench.routing.trace_systems import matched_timing
from dynask.actors.backends.mocker_config import MockerConfig
from dynask.kv.prefix_index import TierOverlap

TWO_BLOCKS = dataclasses.replace(MockerConfig(**matched_timing(64)), num_kv_blocks=2)


def _engine_after_one_prompt() -> tuple[AgedEngine, SimSequence]:
    """A 128-token prompt with one output token, run and freed at 100 ms: its blocks
    are the free queue, the second first (a sequence is freed tail first)."""
    engine = AgedEngine("actor-0", TWO_BLOCKS)
    keys = block_keys(TraceRequest(0.0, 128, 1, (1,)), 64)
    engine.waiting.append(SimSequence(0, 0.0, 128, 1, keys))
    engine.step(100.0)
    return engine, SimSequence(1, 0.0, 200, 1, [*keys, (2, 0)])


def test_the_free_queue_holds_the_prompt_tail_first() -> None:
    engine, _ = _engine_after_one_prompt()

    assert list(engine.free_cached) == [(1, 1), (1, 0)]
    assert engine.free_plain == 0


def test_the_eviction_age_is_how_long_ago_the_next_evicted_block_was_freed() -> None:
    engine, _ = _engine_after_one_prompt()

    assert engine.head_age_ms(350.0) == 250.0


def test_an_empty_pool_evicts_nothing_it_had_cached() -> None:
    assert AgedEngine("actor-0", TWO_BLOCKS).head_age_ms(350.0) == float("inf")


def test_the_oracle_credits_the_blocks_that_outlast_the_queued_prefill() -> None:
    engine, turn = _engine_after_one_prompt()
    believed = TierOverlap(2)

    # Block (1, 0) is second in the free queue, (1, 1) first: each queued block of
    # prefill evicts one from the head.
    assert [_surviving(engine, {}, turn, believed, queued) for queued in (0, 1, 2)] == [2, 1, 0]


def test_the_oracle_credits_blocks_routed_there_and_not_yet_computed() -> None:
    engine = AgedEngine("actor-0", TWO_BLOCKS)
    turn = SimSequence(1, 0.0, 200, 1, [(5, 0), (5, 1), (2, 0)])

    assert _surviving(engine, {(5, 0): 30_000.0}, turn, TierOverlap(2), 0) == 1
