"""bench/routing/router_sim: the simulated engine's exact step times and prefix hits, and
the router's choices inside the simulation (the product's cost against Dynamo's)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bench.routing.router_sim import POLICIES, Simulation
from bench.routing.router_sim_queue import RouterQueueSimulation
from bench.routing.sim_engine import SimEngine, SimSequence, block_keys
from bench.routing.trace import TraceRequest
from bench.routing.trace_systems import matched_timing
from dynask.actors.backends.mocker_config import MockerConfig

CONFIG = MockerConfig(**matched_timing(64))


def _prefill_ms(tokens: int) -> float:
    return 4.2e-7 * tokens**2 + 0.0152 * tokens + 16.5


def test_block_keys_name_each_64_token_block_by_its_trace_block() -> None:
    request = TraceRequest(0.0, 1100, 1, (7, 9, 4))

    assert block_keys(request, 64) == [(7, i) for i in range(8)] + [(9, i) for i in range(8)] + [
        (4, 0)
    ]


def test_a_prompt_prefills_in_chunks_of_the_step_budget_and_its_blocks_are_cached() -> None:
    engine = SimEngine("actor-0", CONFIG)
    keys = block_keys(TraceRequest(0.0, 10_000, 2, tuple(range(20))), 64)
    seq = SimSequence(0, 0.0, 10_000, 2, keys)
    engine.waiting.append(seq)

    first_end, _, first_stored, _ = engine.step(0.0)
    second_end, _, second_stored, _ = engine.step(first_end)

    assert first_end == pytest.approx(_prefill_ms(8192))
    assert second_end == pytest.approx(_prefill_ms(8192) + _prefill_ms(1808))
    assert seq.first_token_ms == second_end and seq.generated == 1
    assert (len(first_stored), len(second_stored)) == (128, 28)  # 10,000 // 64 = 156


def test_a_later_prompt_starts_after_the_prefix_the_engine_holds() -> None:
    engine = SimEngine("actor-0", CONFIG)
    first = SimSequence(0, 0.0, 1024, 1, block_keys(TraceRequest(0.0, 1024, 1, (1, 2)), 64))
    engine.waiting.append(first)
    end, _, _, _ = engine.step(0.0)
    second = SimSequence(1, end, 1100, 1, block_keys(TraceRequest(0.0, 1100, 1, (1, 2, 3)), 64))
    engine.waiting.append(second)

    engine.step(end)

    assert second.cached_tokens == 1024  # both trace blocks; 76 tokens computed
    assert second.first_token_ms == pytest.approx(end + _prefill_ms(76))


def _shared_prefix_trace() -> list[TraceRequest]:
    # r0 (16k tokens, 256 blocks) lands on actor-0; r1 (16k, unrelated) on another actor
    # while r0 prefills; r2 (192 blocks) shares r0's first 128 and arrives while both
    # still prefill.
    return [
        TraceRequest(0.0, 16_384, 4, tuple(range(100, 132))),
        TraceRequest(1.0, 16_384, 4, tuple(range(200, 232))),
        TraceRequest(2.0, 12_288, 4, (*range(100, 116), *range(300, 308))),
    ]


def test_the_products_cost_keeps_a_shared_prefix_where_dynamos_recomputes_it() -> None:
    product = Simulation(_shared_prefix_trace(), 1.0, 3, POLICIES["kv"]())
    dynamo = Simulation(_shared_prefix_trace(), 1.0, 3, POLICIES["kv-dynamo"]())

    product_result, dynamo_result = product.run(), dynamo.run()

    # Dynamo's cost: r2 on the idle actor is 192 blocks against 64 + 256 on actor-0.
    # The product's: 3 x 192 = 576 against 3 x 64 + 256 = 448: it waits for r0's prefix.
    assert [s.cached_tokens for s in dynamo.sequences] == [0, 0, 0]
    assert [s.cached_tokens for s in product.sequences] == [0, 0, 8192]
    assert product_result["hit"] == pytest.approx(8192 / (16_384 * 2 + 12_288))
    assert dynamo_result["hit"] == 0.0


def test_a_router_queue_sends_the_shortest_held_request_first() -> None:
    trace = [
        TraceRequest(0.0, 8192, 1, tuple(range(16))),
        TraceRequest(1.0, 32_768, 1, tuple(range(100, 164))),
        TraceRequest(2.0, 1024, 1, (500, 501)),
    ]
    queued = RouterQueueSimulation(trace, 1.0, 1, POLICIES["kv"](), threshold_blocks=0)

    queued.run()

    # r0 runs alone; once it has its first token, r2 (16 blocks) goes before r1 (512).
    long, short = (queued.sequences[i].first_token_ms or 0.0 for i in (1, 2))
    assert short == pytest.approx(_prefill_ms(8192) + _prefill_ms(1024))
    assert long > short


def _prompt(index: int, tokens: int, first_hash: int) -> SimSequence:
    request = TraceRequest(float(index), tokens, 2, tuple(range(first_hash, first_hash + 40)))
    return SimSequence(index, float(index), tokens, 2, block_keys(request, 64))


@pytest.mark.parametrize(
    ("order", "grants"),
    [
        ("fcfs", [8192]),  # the long prompt came first and takes the whole step
        ("srpt", [1000, 7192]),  # fewest tokens left first
        ("short:2000", [1000, 7192]),
        ("cap:4096", [4096, 1000]),  # no prompt takes more than 4,096 of a shared step
    ],
)
def test_an_engine_order_decides_whose_prefill_a_step_takes(order: str, grants: list[int]) -> None:
    engine = SimEngine("actor-0", CONFIG, order)
    long, short = _prompt(0, 20_000, 0), _prompt(1, 1000, 100)
    engine.waiting.extend([long, short])

    _, chunks, _, _ = engine.step(2.0)

    assert [tokens for _, tokens in chunks] == grants


def test_an_unknown_engine_order_is_refused() -> None:
    with pytest.raises(ValueError, match="short:TOKENS"):
        SimEngine("actor-0", CONFIG, "short")


SMALL = dataclasses.replace(CONFIG, num_kv_blocks=6)  # 6 blocks of 64 tokens


def _run_to_end(engine: SimEngine, now: float = 0.0) -> tuple[float, list, list]:
    """Steps ``engine`` until it is idle; returns the end and every block stored/evicted."""
    stored: list = []
    removed: list = []
    while engine.waiting or engine.running:
        now, _, new, gone = engine.step(now)
        stored += new
        removed += gone
    return now, stored, removed


def test_a_finished_prompts_blocks_are_evicted_tail_first() -> None:
    engine = SimEngine("actor-0", SMALL)
    first = SimSequence(0, 0.0, 256, 1, block_keys(TraceRequest(0.0, 256, 1, (1,)), 64))
    engine.waiting.append(first)
    end, stored, _ = _run_to_end(engine)
    assert stored == [(1, 0), (1, 1), (1, 2), (1, 3)]
    # 2 plain blocks left; a 4-block prompt needs 2 of the cached ones: the tail goes.
    other = SimSequence(1, end, 256, 1, block_keys(TraceRequest(0.0, 256, 1, (2,)), 64))
    engine.waiting.append(other)

    _, _, _, removed = engine.step(end)

    assert removed == [(1, 3), (1, 2)]
    assert engine.cached_prefix_blocks(first) == 2  # its first two blocks still hit


def _one_block_prompt(index: int, hash_id: int, tokens: int) -> SimSequence:
    """A prompt of ``tokens`` (at most 512) in trace block ``hash_id``, one output token."""
    keys = block_keys(TraceRequest(0.0, tokens, 1, (hash_id,)), 64)
    return SimSequence(index, 0.0, tokens, 1, keys)


@pytest.mark.parametrize(
    ("share", "removed", "prefix_left"),
    [
        (0.5, [(1, 3), (2, 1), (2, 0), (1, 2)], 2),  # segmented: the used-once blocks first
        (0.0, [(1, 3), (1, 2), (1, 1), (1, 0)], 0),  # plain LRU: those freed longest ago
    ],
)
def test_a_prefix_hit_once_outlasts_blocks_used_once(
    share: float, removed: list, prefix_left: int
) -> None:
    engine = SimEngine("actor-0", dataclasses.replace(SMALL, prefix_cache_protected_share=share))
    end = 0.0
    # Prompt 1 (4 blocks) twice: the second takes its first 3 blocks from the cache
    # (reused) and computes the last into a plain block. Then prompt 2 (2 blocks) on the
    # 2 plain ones: the 6 blocks hold 6 cached ones.
    for index, (hash_id, tokens) in enumerate([(1, 256), (1, 256), (2, 128)]):
        engine.waiting.append(_one_block_prompt(index, hash_id, tokens))
        end, _, _ = _run_to_end(engine, end)
    engine.waiting.append(_one_block_prompt(3, 3, 256))  # 4 new blocks: 4 cached ones go

    _, _, _, gone = engine.step(end)

    assert gone == removed
    assert engine.cached_prefix_blocks(_one_block_prompt(4, 1, 256)) == prefix_left


def test_blocks_a_running_sequence_holds_are_never_evicted_a_newcomer_waits() -> None:
    engine = SimEngine("actor-0", SMALL)
    # 320 tokens and 2 outputs: 5 prompt blocks, then decoding, all 6 blocks in the end.
    long = SimSequence(0, 0.0, 320, 3, block_keys(TraceRequest(0.0, 320, 3, (1,)), 64))
    late = SimSequence(1, 0.0, 128, 1, block_keys(TraceRequest(0.0, 128, 1, (2,)), 64))
    engine.waiting.extend([long, late])

    _, chunks, _, _ = engine.step(0.0)  # long takes 5 blocks; late needs 2, 1 is free

    assert [(seq.index, tokens) for seq, tokens in chunks] == [(0, 320)]
    assert list(engine.waiting) == [late]
    _run_to_end(engine)
    assert late.first_token_ms is not None and engine.preemptions == 0


def test_a_running_sequence_without_room_preempts_the_last_admitted() -> None:
    engine = SimEngine("actor-0", dataclasses.replace(SMALL, num_kv_blocks=4))
    # Each takes 2 blocks for its 128-token prompt; decoding needs a third block each.
    seqs = [
        SimSequence(i, 0.0, 128, 3, block_keys(TraceRequest(0.0, 128, 3, (10 + i,)), 64))
        for i in range(2)
    ]
    engine.waiting.extend(seqs)
    now, _, _, _ = engine.step(0.0)  # both prefill: 4 blocks, none left

    _, chunks, _, _ = engine.step(now)  # seq 0's decode needs a block: seq 1 goes back

    assert [(seq.index, tokens) for seq, tokens in chunks] == [(0, 1)]
    assert engine.preemptions == 1 and list(engine.waiting) == [seqs[1]]
    assert seqs[1].computed == 0 and seqs[1].prefill_target() == 128  # its prompt again
    _run_to_end(engine)
    assert seqs[1].cached_tokens == 0  # counted at its first admission only
    assert all(seq.generated == 3 for seq in seqs)


def test_the_router_forgets_blocks_the_events_say_were_evicted() -> None:
    # One actor with 6 blocks: r0's 4 blocks are cached, r1 (unrelated, 4 blocks) evicts
    # two of them; the router's view keeps the events' picture.
    trace = [
        TraceRequest(0.0, 256, 1, (1,)),
        TraceRequest(1000.0, 256, 1, (2,)),
    ]
    simulation = Simulation(trace, 1.0, 1, POLICIES["kv"](), event_delay_ms=0.0, config=SMALL)

    simulation.run()

    assert simulation.views[0].known == {(1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (2, 3)}
    assert simulation.views[0].known == set(simulation.engines[0].refs)


@pytest.mark.parametrize("outlive", [False, True])
def test_an_eviction_cancels_a_predicted_block_unless_predictions_outlive_it(
    outlive: bool,
) -> None:
    # As above: r0 was routed (its 4 blocks predicted for the product's 30 s) and then
    # lost 2 to r1. The next turn of r0's prefix sees the 2 left, or (the router before
    # 2026-12-05) all 4 until the predictions' TTL ends.
    trace = [TraceRequest(0.0, 256, 1, (1,)), TraceRequest(1000.0, 256, 1, (2,))]
    simulation = Simulation(
        trace,
        1.0,
        1,
        POLICIES["kv"](),
        event_delay_ms=0.0,
        config=SMALL,
        predictions_outlive_evictions=outlive,
    )
    simulation.run()

    keys = block_keys(trace[0], SMALL.block_size)
    view = simulation.views[0]
    assert view.overlap(keys, now_ms=2_000.0) == (4 if outlive else 2)
    assert view.overlap(keys, now_ms=30_001.0) == 2  # past the TTL: the events alone


def test_warm_requests_run_but_only_the_slice_is_measured() -> None:
    trace = [TraceRequest(0.0, 1024, 1, (1, 2)), TraceRequest(5000.0, 1100, 1, (1, 2, 3))]
    cold = Simulation(trace[1:], 1.0, 1, POLICIES["kv"]())
    warm = Simulation(trace, 1.0, 1, POLICIES["kv"](), warm=1)

    cold_result, warm_result = cold.run(), warm.run()

    assert cold_result["hit"] == 0.0
    assert warm_result["hit"] == pytest.approx(1024 / 1100)
    assert warm_result["ttft_mean"] == pytest.approx(_prefill_ms(76))


class _Recording(Simulation):
    """Keeps the router's view of actor-0's queued prefill after each progress report."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[dict[int, int]] = []

    def _prefill_reported(self, engine: int, progress: dict[int, int]) -> None:
        super()._prefill_reported(engine, progress)
        self.seen.append(dict(self.views[engine].prefill_blocks))


@pytest.mark.parametrize("reported", [True, False])
def test_the_router_counts_down_a_long_prefill_as_the_engine_reports_it(reported: bool) -> None:
    trace = [TraceRequest(0.0, 20_000, 2, tuple(range(40)))]  # 313 blocks, 3 chunks
    simulation = _Recording(trace, 1.0, 1, POLICIES["kv"](), prefill_progress=reported)

    simulation.run()

    # 20,000 - 8,192 = 11,808 tokens left (185 blocks), then 3,616 (57).
    assert simulation.seen == ([{0: 185}, {0: 57}] if reported else [])


@pytest.mark.parametrize(("approx_cache", "assumed"), [("engine", 32), ("ttl", 48)])
def test_approximate_mode_assumes_no_more_than_the_engine_can_hold(
    approx_cache: str, assumed: int
) -> None:
    # Three unrelated 1,024-token prompts (16 blocks each) on one engine of 32 blocks.
    config = dataclasses.replace(CONFIG, num_kv_blocks=32)
    requests = [TraceRequest(i * 1000.0, 1024, 1, (10 * i, 10 * i + 1)) for i in range(3)]
    sim = Simulation(
        requests, 1.0, 1, POLICIES["approximate"](), config=config, approx_cache=approx_cache
    )

    sim.run()

    approx = sim.views[0].approx
    assert approx is not None and approx.num_blocks("actor-0") == assumed


def test_an_unknown_approximate_cache_model_is_refused() -> None:
    with pytest.raises(ValueError, match="approx_cache has value 'lru'"):
        Simulation([TraceRequest(0.0, 64, 1, (1,))], 1.0, 1, POLICIES["kv"](), approx_cache="lru")
