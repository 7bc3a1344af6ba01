"""The offload tiers under eviction pressure: exact contents, events and counters."""

from __future__ import annotations

from pathlib import Path

import torch

from dynask.kv.block_pool import BlockPool
from dynask.kv.disk_tier import DiskTier
from dynask.kv.events import BlockRemoved, BlockStored, KVEventLog
from dynask.kv.hashing import SequenceHash
from dynask.kv.host_tier import HostTier
from dynask.kv.offload import KVOffload, TierStats
from dynask.kv.tier import KVTier

BS = 2
BLOCK = (1, 2, BS, 1, 2)  # layers, k/v, block_size, kv_heads, head_dim


class TensorBlocks:
    """A real (CPU) paged KV cache of ``num_blocks`` blocks in the tiers' layout."""

    device = torch.device("cpu")

    def __init__(self, num_blocks: int) -> None:
        self.kv = torch.zeros((num_blocks, *BLOCK))

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        return self.kv[block_ids].clone()

    def scatter(self, block_ids: list[int], kv: torch.Tensor) -> None:
        self.kv[block_ids] = kv

    def save_to_host(self, block_ids: list[int], buffer: torch.Tensor, rows: list[int]) -> None:
        buffer[rows] = self.kv[block_ids]

    def load_from_host(self, block_ids: list[int], buffer: torch.Tensor, rows: list[int]) -> None:
        self.kv[block_ids] = buffer[rows]


class Engine:
    """A block pool whose evictions go to ``offload``, computing one-block prompts."""

    def __init__(self, tmp_path: Path, host_blocks: int = 2) -> None:
        self.log = KVEventLog()
        self.pool = BlockPool(3, BS, event_log=self.log)
        self.device = TensorBlocks(3)
        self.offload = KVOffload(
            self.device,
            BS,
            host=HostTier(host_blocks, BLOCK, torch.float32),
            disk=DiskTier(tmp_path, 10**6, BLOCK, torch.float32, "test-model"),
            event_log=self.log,
        )
        self.pool.set_eviction_listener(self.offload.on_device_evicted)

    def compute(self, n: int) -> None:
        """Prompt ``n``: one block (tokens n, n), KV filled with n, cached, then freed."""
        [block] = self.pool.allocate(1)
        self.device.kv[block.block_id] = float(n)
        self.pool.cache_block(block, SequenceHash(n), None, (n, n))
        self.offload.note_uses([SequenceHash(n)])
        self.pool.free([block])

    def lower_events(self) -> list[tuple[str, tuple[int, ...], KVTier]]:
        events = []
        for record in self.log.drain():
            event = record.event
            if isinstance(event, BlockStored | BlockRemoved) and event.tier is not KVTier.DEVICE:
                events.append((type(event).__name__, event.block_hashes, event.tier))
        return events


def hashes(blocks: list) -> list[int]:  # type: ignore[type-arg]
    return [int(b.block_hash) for b in blocks]


def test_evictions_flow_down_and_only_reused_blocks_reach_the_disk(tmp_path: Path) -> None:
    engine = Engine(tmp_path)
    for n in (1, 2, 3):  # fills the device tier
        engine.compute(n)
    assert engine.offload.cached_blocks() == []

    engine.compute(4)  # evicts 1 to host
    engine.compute(5)  # evicts 2 to host
    engine.compute(6)  # evicts 3; host full: 1 leaves, used once, so not written to disk
    engine.offload.note_uses([SequenceHash(2)])  # a second use of 2
    engine.compute(7)  # evicts 4; host evicts 2, used twice: written to disk

    host, disk = engine.offload.host, engine.offload.disk
    assert host is not None and disk is not None
    assert hashes(host.blocks()) == [3, 4]
    assert hashes(disk.blocks()) == [2]
    assert sorted(p.name for p in disk.folder.iterdir()) == [f"{2:016x}.kvblock"]
    assert engine.lower_events() == [
        ("BlockStored", (1,), KVTier.HOST),
        ("BlockStored", (2,), KVTier.HOST),
        ("BlockRemoved", (1,), KVTier.HOST),  # the room is made before 3 comes in
        ("BlockStored", (3,), KVTier.HOST),
        ("BlockStored", (2,), KVTier.DISK),  # 2 is on disk before it leaves the host
        ("BlockRemoved", (2,), KVTier.HOST),
        ("BlockStored", (4,), KVTier.HOST),
    ]
    assert engine.offload.stats() == [
        TierStats(KVTier.HOST, 2, used_blocks=2, stored_blocks=4, evicted_blocks=2),
        TierStats(KVTier.DISK, disk.capacity_blocks, used_blocks=1, stored_blocks=1),
    ]


def test_find_and_load_take_each_block_from_its_fastest_tier(tmp_path: Path) -> None:
    engine = Engine(tmp_path)
    for n in (1, 2, 3, 4, 5, 6):
        engine.compute(n)
        if n == 1:
            engine.compute(n)  # 1 is used twice, so the host tier spills it to disk
    # device: 4 5 6; host: 2 3; disk: 1
    found = engine.offload.find(
        [SequenceHash(1), SequenceHash(3), SequenceHash(9)], [(1, 1), (3, 3), (9, 9)]
    )
    assert [(int(b.block_hash), b.tier) for b in found] == [(1, KVTier.DISK), (3, KVTier.HOST)]
    assert engine.offload.find([SequenceHash(3)], [(3, 4)]) == []  # same hash, other tokens

    onboarding = engine.offload.prepare(found)
    # Room for them evicts 4 and 5 into the full host tier: 2 makes way for 4, and 3,
    # held for this onboarding, stays, so 5 finds no slot and is not kept.
    fresh = engine.pool.allocate(2)
    engine.offload.place([int(b.block_id) for b in fresh], onboarding)

    assert torch.equal(engine.device.kv[fresh[0].block_id], torch.full(BLOCK, 1.0))
    assert torch.equal(engine.device.kv[fresh[1].block_id], torch.full(BLOCK, 3.0))
    host = engine.offload.host
    assert host is not None and hashes(host.blocks()) == [4, 3]  # 3 was just read
    onboarded = {s.tier: s.onboarded_blocks for s in engine.offload.stats()}
    assert onboarded == {KVTier.HOST: 1, KVTier.DISK: 1}


def test_a_corrupt_disk_block_ends_the_load_and_is_dropped(tmp_path: Path) -> None:
    engine = Engine(tmp_path, host_blocks=1)
    for n in (1, 2, 3, 4, 5):
        engine.compute(n)
        engine.compute(n)  # every block used twice
    disk = engine.offload.disk
    assert disk is not None and hashes(disk.blocks()) == [1, 2, 3]
    engine.lower_events()
    path = disk.folder / f"{1:016x}.kvblock"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the payload
    path.write_bytes(bytes(data))

    found = engine.offload.find([SequenceHash(1)], [(1, 1)])
    onboarding = engine.offload.prepare(found)

    assert onboarding.blocks == [] and onboarding.disk_kv == {}
    assert not path.exists() and hashes(disk.blocks()) == [2, 3] and disk.corrupt_blocks == 1
    assert engine.lower_events() == [("BlockRemoved", (1,), KVTier.DISK)]
    assert engine.offload.find([SequenceHash(1)], [(1, 1)]) == []
