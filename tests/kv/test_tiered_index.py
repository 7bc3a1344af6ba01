"""Tier-aware KV events and prefix index: the router sees where each block is held."""

from __future__ import annotations

import json

import pytest

from dynask.kv.block_pool import BlockPool, CachedBlock
from dynask.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventRecord,
    event_from_dict,
)
from dynask.kv.hashing import SequenceHash
from dynask.kv.prefix_index import KVCacheDump, PrefixIndex, TierOverlap
from dynask.kv.tier import KVTier
from tests.kv.test_prefix_index import BS, Feeder, locals_of, stored

TOKENS = (1, 2, 3, 4, 5, 6)  # three blocks of BS=2


def in_tier(event: BlockStored, tier: KVTier) -> BlockStored:
    return BlockStored.from_token_ids(
        event.block_hashes, event.parent_hash, event.token_ids, BS, tier
    )


def test_a_device_event_reads_as_before_and_a_tier_travels() -> None:
    device = stored(TOKENS)
    assert "tier" not in device.to_dict()
    assert event_from_dict(device.to_dict()).tier is KVTier.DEVICE

    host = in_tier(device, KVTier.HOST)
    assert host.to_dict()["tier"] == "host"
    assert event_from_dict(json.loads(json.dumps(host.to_dict(packed=False)))) == host
    removed = BlockRemoved(device.block_hashes[:1], KVTier.DISK)
    assert removed.to_dict() == {
        "type": "removed",
        "block_hashes": [removed.block_hashes[0]],
        "tier": "disk",
    }
    assert event_from_dict(removed.to_dict()) == removed
    assert event_from_dict({"type": "cleared", "tier": "host"}) == AllBlocksCleared(KVTier.HOST)


def test_an_unknown_tier_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"KV event field 'tier': KV tier has value 'gpu'"):
        event_from_dict({"type": "cleared", "tier": "gpu"})


def test_each_matched_block_counts_in_its_fastest_tier() -> None:
    index = PrefixIndex()
    feed = Feeder(index)
    event = stored(TOKENS)
    feed.send("a", event)  # a: all three on the device
    feed.send("b", in_tier(event, KVTier.DISK))  # b: all three on disk...
    feed.send(
        "b", BlockStored.from_token_ids(event.block_hashes[:1], None, TOKENS[:2], BS)
    )  # ...first also on device
    feed.send("c", in_tier(event, KVTier.HOST))

    matches = index.find_tiered_matches(locals_of(TOKENS))

    assert matches == {
        "a": TierOverlap(device_blocks=3),
        "b": TierOverlap(device_blocks=1, disk_blocks=2),
        "c": TierOverlap(host_blocks=3),
    }
    assert index.find_matches(locals_of(TOKENS)) == {"a": 3, "b": 3, "c": 3}


def test_removing_one_tier_keeps_the_others() -> None:
    index = PrefixIndex()
    feed = Feeder(index)
    event = stored(TOKENS)
    feed.send("a", event)
    feed.send("a", in_tier(event, KVTier.HOST))
    feed.send("a", BlockRemoved(event.block_hashes, KVTier.DEVICE))  # evicted to host

    assert index.find_tiered_matches(locals_of(TOKENS)) == {"a": TierOverlap(host_blocks=3)}
    assert index.num_blocks("a") == 3

    feed.send("a", AllBlocksCleared(KVTier.HOST))
    assert index.find_tiered_matches(locals_of(TOKENS)) == {}
    assert index.num_blocks("a") == 0
    assert index.num_nodes() == 0


def test_a_dump_lists_every_tier_with_parents_first() -> None:
    pool = BlockPool(4, BS)
    blocks = pool.allocate(1)
    first = stored(TOKENS[:2])
    pool.cache_block(blocks[0], first.block_hashes[0], None, TOKENS[:2])
    full = stored(TOKENS)
    h0, h1, h2 = full.block_hashes
    lower = [
        CachedBlock(h2, h1, TOKENS[4:], KVTier.DISK),
        CachedBlock(h1, h0, TOKENS[2:4], KVTier.HOST),
        CachedBlock(h0, None, TOKENS[:2], KVTier.HOST),
        CachedBlock(SequenceHash(99), SequenceHash(98), (7, 8), KVTier.DISK),  # orphan
    ]

    dump = KVCacheDump.from_block_pool(pool, 5, lower)

    assert [(e.block_hashes[0], e.tier) for e in dump.stored] == [
        (h0, KVTier.DEVICE),
        (h1, KVTier.HOST),
        (h2, KVTier.DISK),
        (h0, KVTier.HOST),
    ]
    index = PrefixIndex()
    index.resync("a", KVCacheDump.from_dict(json.loads(json.dumps(dump.to_dict(packed=False)))))
    assert index.find_tiered_matches(locals_of(TOKENS)) == {
        "a": TierOverlap(device_blocks=1, host_blocks=1, disk_blocks=1)
    }
    assert index.apply("a", KVEventRecord(6, AllBlocksCleared())).status == "applied"
    # h0 is still held in host memory, so the chain stays reachable.
    assert index.find_tiered_matches(locals_of(TOKENS)) == {
        "a": TierOverlap(host_blocks=2, disk_blocks=1)
    }
