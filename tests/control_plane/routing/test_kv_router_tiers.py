"""The router credits host- and disk-tier hits below device hits (Dynamo: 0.75, 0.25)."""

from __future__ import annotations

import pytest

from dynask.control_plane.routing.kv_router import Candidate, KVRouter, RouterConfig
from dynask.kv.events import BlockStored, KVEventRecord
from dynask.kv.prefix_index import PrefixIndex
from dynask.kv.tier import KVTier
from tests.kv.test_prefix_index import locals_of, stored

TOKENS = tuple(range(1, 9))  # four blocks of 2


def index_with(holders: dict[str, KVTier]) -> PrefixIndex:
    """Each actor holds the whole prompt in one tier."""
    index = PrefixIndex()
    event = stored(TOKENS)
    for actor, tier in holders.items():
        tiered = BlockStored.from_token_ids(
            event.block_hashes, None, event.token_ids, event.block_size, tier
        )
        index.apply(actor, KVEventRecord(1, tiered))
    return index


def choose(index: PrefixIndex, actors: list[str]) -> dict[str, tuple[int, int, float]]:
    hashes = locals_of(TOKENS)
    decision = KVRouter(RouterConfig()).choose(
        "r", hashes, [Candidate(a) for a in actors], index.find_tiered_matches(hashes)
    )
    return {s.actor: (s.overlap_blocks, s.disk_overlap_blocks, s.cost) for s in decision.scores}


def test_device_beats_disk_at_equal_overlap_whatever_the_order() -> None:
    index = index_with({"on-disk": KVTier.DISK, "on-device": KVTier.DEVICE})
    for actors in (["on-disk", "on-device"], ["on-device", "on-disk"]):
        hashes = locals_of(TOKENS)
        decision = KVRouter(RouterConfig()).choose(
            "r", hashes, [Candidate(a) for a in actors], index.find_tiered_matches(hashes)
        )
        assert decision.winner == "on-device"
    # 4 blocks; disk hits are worth 0.25 of a device hit: 4 * 0.75 of the prefill remains.
    assert choose(index, ["on-disk", "on-device"]) == {
        "on-disk": (4, 4, 3.0),
        "on-device": (4, 0, 0.0),
    }


def test_host_sits_between_device_and_disk_and_beats_a_stranger() -> None:
    index = index_with({"h": KVTier.HOST, "d": KVTier.DISK})
    costs = {actor: cost for actor, (_, _, cost) in choose(index, ["h", "d", "x"]).items()}
    assert costs == {"h": 1.0, "d": 3.0, "x": 4.0}


def test_tier_weights_are_checked() -> None:
    with pytest.raises(ValueError, match=r"RouterConfig.disk_tier_weight has value 1.5"):
        RouterConfig(disk_tier_weight=1.5)


def test_tier_gauges_appear_only_for_the_tiers_an_engine_has() -> None:
    from dataclasses import replace

    from dynask.actors.api.stats import EngineStats
    from dynask.control_plane.serving.metrics import ServingMetrics

    metrics = ServingMetrics()
    idle = EngineStats.load_only(num_running=0, steps=0, prompt_tokens=0, generated_tokens=0)
    stats = replace(  # 25 of 100 prompt tokens from host memory, 50 from the device
        idle,
        prefix_queried_tokens=100,
        prefix_hit_tokens=75,
        host_kv_blocks=3,
        host_kv_capacity_blocks=12,
        host_hit_tokens=25,
    )
    metrics.observe_actor("a", stats)
    text = metrics.render().decode()
    assert 'dynask_actor_kv_tier_blocks{actor="a",tier="host"} 3.0' in text
    assert 'dynask_actor_kv_tier_capacity_blocks{actor="a",tier="host"} 12.0' in text
    assert 'dynask_actor_kv_tier_hit_ratio{actor="a",tier="host"} 0.25' in text
    assert 'dynask_actor_kv_tier_hit_ratio{actor="a",tier="device"} 0.5' in text
    assert 'tier="disk"' not in text
