"""Background reads of disk-tier blocks: results by hash, errors as results, a wake-up."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from dynask.kv.block_pool import CachedBlock
from dynask.kv.disk_prefetch import DiskPrefetcher
from dynask.kv.disk_tier import CorruptBlockFile, DiskTier
from dynask.kv.hashing import SequenceHash
from tests.kv.test_disk_tier import block, kv, tier


def test_reads_land_by_hash_and_a_bad_file_lands_as_its_error(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    for n in (1, 2):
        disk.write(block(n), kv(n))
    path = disk.folder / f"{2:016x}.kvblock"
    path.write_bytes(path.read_bytes()[:-1])  # truncated after it was indexed
    woken = threading.Event()
    prefetcher = DiskPrefetcher(disk, on_ready=woken.set)

    prefetcher.request([block(1), block(2)])
    prefetcher.request([block(1)])  # already asked for: not read twice
    assert woken.wait(timeout=60)
    prefetcher.close()

    assert prefetcher.ready(SequenceHash(1)) and prefetcher.ready(SequenceHash(2))
    first = prefetcher.take(SequenceHash(1))
    assert isinstance(first, torch.Tensor) and torch.equal(first, kv(1))
    assert isinstance(prefetcher.take(SequenceHash(2)), CorruptBlockFile)
    assert prefetcher.take(SequenceHash(1)) is None  # taken once
    assert [b.block_hash for b in disk.blocks()] == [1, 2]  # the index is the engine's
    assert disk.settle(SequenceHash(2), CorruptBlockFile("truncated")) is None
    assert [b.block_hash for b in disk.blocks()] == [1] and not path.exists()


def test_a_disk_hit_is_cut_where_the_reader_could_not_keep_all_its_reads(
    tmp_path: Path,
) -> None:
    from dynask.kv.offload import KVOffload
    from tests.kv.test_offload import BLOCK, TensorBlocks

    disk = DiskTier(tmp_path, 10**6, BLOCK, torch.float32, "m")
    for n in range(1, 6):
        disk.write(block2(n), torch.full(BLOCK, float(n)))
    offload = KVOffload(
        TensorBlocks(4), 2, disk=disk, prefetcher=DiskPrefetcher(disk, max_results=4)
    )
    hashes = [SequenceHash(n) for n in range(1, 6)]

    found = offload.find(hashes, [(n, n) for n in range(1, 6)])

    assert [int(b.block_hash) for b in found] == [1, 2]  # 4 results kept: 2 per request
    assert offload.prepare(found).waiting  # the reads start...
    offload.prefetcher.close()  # type: ignore[union-attr]
    onboarding = offload.prepare(found)  # ...and once done, the blocks are ready
    assert not onboarding.waiting and onboarding.num_blocks == 2
    offload.place([0, 1], onboarding)
    assert offload.device_blocks.kv[1][0, 0, 0, 0, 0] == 2.0  # type: ignore[attr-defined]


def block2(n: int) -> CachedBlock:
    return CachedBlock(SequenceHash(n), None, (n, n))
