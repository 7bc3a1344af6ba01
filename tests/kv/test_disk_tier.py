"""The disk tier: atomic files, restart, LRU by bytes, every kind of damage detected."""

from __future__ import annotations

from pathlib import Path

import torch

from dynask.kv.block_pool import CachedBlock
from dynask.kv.disk_tier import DiskTier
from dynask.kv.hashing import SequenceHash
from dynask.kv.tier import KVTier

BLOCK = (2, 2, 4, 1, 8)


def block(n: int, parent: int | None = None) -> CachedBlock:
    return CachedBlock(
        SequenceHash(n), None if parent is None else SequenceHash(parent), (n,) * 4, KVTier.HOST
    )


def kv(n: int) -> torch.Tensor:
    return torch.arange(torch.Size(BLOCK).numel(), dtype=torch.float32).reshape(BLOCK) + n


def tier(folder: Path, capacity: int = 10**6, key: str = "model-a") -> DiskTier:
    return DiskTier(folder, capacity, BLOCK, torch.float32, key)


def test_blocks_survive_a_restart_with_their_order_and_parents(tmp_path: Path) -> None:
    first = tier(tmp_path)
    first.write(block(1), kv(1))
    first.write(block(2, parent=1), kv(2))
    first.read(SequenceHash(1), (1,) * 4)  # 1 becomes the most recently used

    again = tier(tmp_path)

    assert [(b.block_hash, b.parent_hash, b.tier) for b in again.blocks()] == [
        (2, 1, KVTier.DISK),
        (1, None, KVTier.DISK),
    ]
    assert again.holds(SequenceHash(2), (2,) * 4)
    assert not again.holds(SequenceHash(2), (9,) * 4)
    read = again.read(SequenceHash(2), (2,) * 4)
    assert read is not None and torch.equal(read, kv(2))
    assert tier(tmp_path, key="model-b").blocks() == []  # another model's KV is not ours


def test_the_oldest_files_go_when_the_bytes_run_out(tmp_path: Path) -> None:
    probe = tier(tmp_path / "probe")
    probe.write(block(1), kv(1))
    file_size = probe.nbytes
    disk = tier(tmp_path, capacity=2 * file_size)

    assert disk.write(block(1), kv(1)) == []
    assert disk.write(block(2), kv(2)) == []
    disk.read(SequenceHash(1), (1,) * 4)
    evicted = disk.write(block(3), kv(3))

    assert [b.block_hash for b in evicted] == [2]
    assert [b.block_hash for b in disk.blocks()] == [1, 3]
    assert disk.nbytes == 2 * file_size
    assert sorted(p.name for p in disk.folder.iterdir()) == [
        f"{1:016x}.kvblock",
        f"{3:016x}.kvblock",
    ]


def test_a_flipped_payload_bit_is_caught_on_read(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    disk.write(block(1), kv(1))
    path = disk.folder / f"{1:016x}.kvblock"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))

    assert disk.read(SequenceHash(1), (1,) * 4) is None
    assert disk.corrupt_blocks == 1 and len(disk) == 0 and not path.exists()


def test_a_truncated_or_renamed_file_is_dropped_at_start_up(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    for n in (1, 2, 3):
        disk.write(block(n), kv(n))
    folder = disk.folder
    truncated = folder / f"{1:016x}.kvblock"
    truncated.write_bytes(truncated.read_bytes()[:-10])
    (folder / f"{2:016x}.kvblock").rename(folder / f"{7:016x}.kvblock")  # name != header
    (folder / ".tmp-left-by-a-crash").write_bytes(b"half a file")

    again = tier(tmp_path)

    assert [b.block_hash for b in again.blocks()] == [3]
    assert again.corrupt_blocks == 2
    assert sorted(p.name for p in folder.iterdir()) == [f"{3:016x}.kvblock"]


def test_a_file_whose_header_claims_other_tokens_is_never_served(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    disk.write(block(1), kv(1))
    # Same hash, other tokens (a collision, or a file swapped in): the read checks tokens.
    assert disk.read(SequenceHash(1), (5,) * 4) is None
    assert disk.corrupt_blocks == 1


def test_a_failed_write_keeps_nothing_and_raises_nothing(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    disk.write(block(1), kv(1))
    for path in disk.folder.iterdir():
        path.unlink()
    disk.folder.rmdir()
    disk.folder.write_bytes(b"not a folder")  # every write in it now fails

    assert disk.write(block(2), kv(2)) == []
    assert [b.block_hash for b in disk.blocks()] == [1] and disk.failed_writes == 1
