"""What one model's routing assumes from where it sent prompts: predicted blocks in mode
``kv`` (routed, KV events not in yet) and mode ``approximate`` (no events read at all).

``ModelRouting.choose`` is called directly, on handles of actors whose engines report KV
events but whose events never arrive here (no actor runs): exactly the window between a
decision and its events. The router's load terms stay 0 (no request is admitted)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from dynask.control_plane.routing.model_routing import ModelRouting
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.kv.events import BlockRemoved, BlockStored, KVEventRecord
from dynask.kv.hashing import SequenceHash
from dynask.kv.prefix_index import TierOverlap
from tests.control_plane.routing.replica_script import NAMES, unconnected_handle
from tests.control_plane.routing_stack import BLOCK, tokens


def _handles(kv_events: bool = True) -> list[ActorHandle]:
    # never called: choose reads only names, info and load
    return [unconnected_handle(name, kv_events) for name in NAMES]


def _overlaps(route_scores: tuple) -> dict[str, int]:
    return {score.actor: score.overlap_blocks for score in route_scores}


def test_a_prefix_routed_before_its_events_counts_on_its_actor() -> None:
    routing = ModelRouting("m", RoutingOptions(seed=1), ServingMetrics())
    handles = _handles()
    prefix = tokens(seed=1, blocks=10)

    first = routing.choose("r1", prefix, handles)
    second = routing.choose("r2", prefix + tokens(seed=2, blocks=2), handles)

    holder = first.actor.name
    assert _overlaps(first.decision.scores) == dict.fromkeys(NAMES, 0)
    assert _overlaps(second.decision.scores) == {n: 10 if n == holder else 0 for n in NAMES}
    assert second.actor.name == holder and second.expected_cached_tokens == 160
    assert routing.prefix.find_matches(routing.local_hashes(prefix)) == {}  # no event came
    assert routing.find_tiered_matches(routing.local_hashes(prefix)) == {holder: TierOverlap(10)}


def test_predicted_blocks_expire_and_can_be_turned_off() -> None:
    clock = [0.0]
    routing = ModelRouting("m", RoutingOptions(seed=1, predicted_ttl_s=5), ServingMetrics())
    assert routing.predicted is not None
    routing.predicted._clock = lambda: clock[0]  # the test's clock (ApproxIndex's seam)
    handles = _handles()
    prefix = tokens(seed=3, blocks=4)
    holder = routing.choose("r1", prefix, handles).actor.name

    clock[0] = 4.9
    assert routing.find_matches(routing.local_hashes(prefix)) == {holder: 4}
    clock[0] = 5.0
    assert routing.find_matches(routing.local_hashes(prefix)) == {}

    off = ModelRouting("m", RoutingOptions(seed=1, predicted_ttl_s=0), ServingMetrics())
    off.choose("r1", prefix, handles)
    assert off.predicted is None
    assert _overlaps(off.choose("r2", prefix, handles).decision.scores) == dict.fromkeys(NAMES, 0)


def test_approximate_mode_routes_event_actors_from_the_routed_prompts_only() -> None:
    routing = ModelRouting(
        "m", RoutingOptions(mode="approximate", seed=1, approx_capacity_blocks=6), ServingMetrics()
    )
    handles = _handles(kv_events=True)
    a, b = tokens(seed=4, blocks=5), tokens(seed=5, blocks=3)

    first = routing.choose("r1", a, handles)
    again = routing.choose("r2", a, handles)
    holder = first.actor.name
    assert again.actor.name == holder
    assert _overlaps(again.decision.scores) == {n: 5 if n == holder else 0 for n in NAMES}
    assert routing.predicted is not None and routing.predicted.num_blocks(holder) == 0

    other = routing.choose("r3", b, handles).actor.name  # shares nothing: any actor
    assumed = {n: routing.approx.num_blocks(n) for n in NAMES}
    assert assumed == {n: (5 if n == holder else 0) + (3 if n == other else 0) for n in NAMES}
    # kv mode on the same routing reads the events (none came) and its own predictions.
    kv = routing.choose("r4", a, handles, mode="kv")
    assert _overlaps(kv.decision.scores) == dict.fromkeys(NAMES, 0)


def test_the_approximate_capacity_forgets_least_recent_blocks_per_actor() -> None:
    routing = ModelRouting(
        "m", RoutingOptions(mode="approximate", seed=1, approx_capacity_blocks=6), ServingMetrics()
    )
    [only] = _handles()[:1]
    a, b = tokens(seed=6, blocks=4), tokens(seed=7, blocks=4)

    routing.choose("r1", a, [only])
    routing.choose("r2", b, [only])  # 8 blocks on a 6-block budget: a's last 2 go

    hashes = routing.local_hashes
    assert routing.find_tiered_matches(hashes(a), approximate=True) == {"a0": TierOverlap(2)}
    assert routing.find_tiered_matches(hashes(b), approximate=True) == {"a0": TierOverlap(4)}


def test_a_prefix_its_events_say_was_evicted_stops_counting_though_it_was_routed() -> None:
    # The Mooncake trace's long conversations: turn 2 is routed to the actor whose events
    # show turn 1's prefix (and noted as predicted there); that actor then evicts the
    # prefix's tail. Turn 3 must see only what is left, not turn 2's routing for 30 s.
    routing = ModelRouting("m", RoutingOptions(seed=1), ServingMetrics())
    handles = _handles()
    prefix = tokens(seed=8, blocks=10)
    holder = handles[2].name
    names = tuple(SequenceHash(1000 + i) for i in range(10))
    stored = BlockStored.from_token_ids(names, None, tuple(prefix), BLOCK)
    routing.prefix.apply(holder, KVEventRecord(1, stored))

    turn2 = routing.choose("r2", prefix + tokens(seed=9, blocks=1), handles)
    assert turn2.actor.name == holder and turn2.expected_cached_tokens == 10 * BLOCK

    routing.prefix.apply(holder, KVEventRecord(2, BlockRemoved(names[4:][::-1])))
    assert routing.find_matches(routing.local_hashes(prefix)) == {holder: 4}
    turn3 = routing.choose("r3", prefix + tokens(seed=10, blocks=1), handles)
    assert _overlaps(turn3.decision.scores) == {n: 4 if n == holder else 0 for n in NAMES}


@pytest.mark.parametrize(("share", "kept"), [(0.0, (0, 3, 3)), (0.5, (2, 1, 3))])
def test_an_engines_reported_cache_bounds_approximate_routing_as_the_engine_evicts(
    share: float, kept: tuple[int, int, int]
) -> None:
    # No --router-approx-capacity-blocks: the actor's info says its cache holds 6 blocks
    # and how it evicts. Prompt a is routed twice (reused), then b and c: 8 blocks.
    routing = ModelRouting("m", RoutingOptions(mode="approximate", seed=1), ServingMetrics())
    base = unconnected_handle("a0", kv_events=False)
    info = replace(base.info, kv_cache_tokens=6 * BLOCK, kv_protected_share=share)
    only = ActorHandle(name="a0", deployment="d", proxy=None, info=info)
    routing.add_actor(only)
    prompts = [tokens(seed=12, blocks=2), tokens(seed=13, blocks=3), tokens(seed=14, blocks=3)]
    for request_id, prompt in zip(("r1", "r2", "r3", "r4"), prompts[:1] + prompts, strict=True):
        routing.choose(request_id, prompt, [only])

    # Plain LRU forgets a (least recently routed); segmented LRU keeps reused a and
    # forgets b's tail from probation.
    hashes = routing.local_hashes
    held = tuple(
        routing.find_tiered_matches(hashes(p), approximate=True).get("a0", TierOverlap(0))
        for p in prompts
    )
    assert held == tuple(TierOverlap(n) for n in kept)
    assert routing.approx.num_blocks("a0") == 6


def test_the_approximate_capacity_flag_overrides_what_engines_report() -> None:
    options = RoutingOptions(mode="approximate", seed=1, approx_capacity_blocks=4)
    routing = ModelRouting("m", options, ServingMetrics())
    base = unconnected_handle("a0", kv_events=False)
    info = replace(base.info, kv_cache_tokens=100 * BLOCK)
    only = ActorHandle(name="a0", deployment="d", proxy=None, info=info)
    routing.add_actor(only)

    routing.choose("r1", tokens(seed=15, blocks=6), [only])

    assert routing.approx.num_blocks("a0") == 4


class _UnreachableActor:
    """The proxy of an actor that cannot be reached: its KV dump fails (the sync logs it)."""

    async def kv_cache_dump(self) -> bytes:
        raise ConnectionError("not connected in this test")


def test_an_approximate_actor_added_first_is_resized_to_the_models_blocks() -> None:
    # The approximate actor reports 6 blocks' worth of tokens before the model's block
    # size is known (DEFAULT_BLOCK_SIZE, 16, until then: 12 blocks); the first
    # event-reporting actor brings blocks of 32 tokens, so 6 blocks of 32.
    async def scenario() -> int:
        routing = ModelRouting("m", RoutingOptions(mode="approximate", seed=1), ServingMetrics())
        base = unconnected_handle("a0", kv_events=False)
        info = replace(base.info, kv_cache_tokens=6 * 32)
        approx = ActorHandle(name="a0", deployment="d", proxy=None, info=info)
        routing.add_actor(approx)
        events = unconnected_handle("e0")
        events = ActorHandle(
            name="e0",
            deployment="d",
            proxy=_UnreachableActor(),  # type: ignore[arg-type]
            info=replace(events.info, kv_block_size=32),
        )
        routing.add_actor(events)
        assert routing.block_size == 32
        routing.choose("r1", list(range(8 * 32)), [approx])
        held = routing.approx.num_blocks("a0")
        routing.remove_actor("e0")
        return held

    assert asyncio.run(scenario()) == 6
