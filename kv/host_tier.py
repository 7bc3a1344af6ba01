"""The host-memory tier: KV blocks evicted from the device cache, kept in one host tensor.

Design decisions:

- One preallocated tensor of ``capacity_blocks`` slots, each slot one block laid out
  ``[layers, 2, block_size, kv_heads, head_dim]`` (contiguous, so a block moves in one
  copy). Pinned on a GPU machine, so device↔host copies are DMA transfers that run
  asynchronously; a plain bounded pool on a CPU-only one.
- LRU over slots, keyed by the block's sequence hash; a lookup re-checks the tokens, as
  the device cache does, so a hash collision is a miss.
- A block evicted from here is handed to ``spill`` (the disk tier, through
  ``kv.offload``) before its slot is overwritten. On CUDA the device→host copies are
  queued without waiting; ``spill`` and ``read`` to the CPU wait for them first, and
  host→device copies are ordered after them on the same stream.
- Not thread-safe: the engine thread owns it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dynask.kv.block_pool import CachedBlock
from dynask.kv.hashing import SequenceHash
from dynask.kv.tier import KVTier

SpillFn = Callable[[CachedBlock, torch.Tensor], None]
"""Receives a block leaving a tier and its KV (valid only during the call)."""


@dataclass(slots=True)
class _Slot:
    index: int
    block: CachedBlock


class HostTier:
    """Up to ``capacity_blocks`` KV blocks in host memory, least recently used evicted."""

    tier = KVTier.HOST

    def __init__(
        self,
        capacity_blocks: int,
        block_shape: Sequence[int],
        dtype: torch.dtype,
        *,
        pin_memory: bool = False,
    ) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"HostTier capacity_blocks must be >= 1, got {capacity_blocks!r}")
        self.block_shape = tuple(block_shape)
        self.buffer = torch.empty(
            (capacity_blocks, *self.block_shape), dtype=dtype, pin_memory=pin_memory
        )
        self._slots: OrderedDict[SequenceHash, _Slot] = OrderedDict()
        self._free = list(range(capacity_blocks - 1, -1, -1))  # pop() gives slot 0 first
        self._spill: SpillFn | None = None
        self._pending_copy: torch.cuda.Event | None = None

    @property
    def capacity_blocks(self) -> int:
        """How many blocks fit."""
        return int(self.buffer.shape[0])

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block."""
        return int(self.buffer[0].nbytes)

    def __len__(self) -> int:
        return len(self._slots)

    def set_spill(self, spill: SpillFn | None) -> None:
        """Hand every evicted block to ``spill`` before its slot is reused (None: drop)."""
        self._spill = spill

    def holds(self, block_hash: SequenceHash, token_ids: Sequence[int]) -> bool:
        """Whether the block with this hash and exactly these tokens is here."""
        slot = self._slots.get(block_hash)
        return slot is not None and slot.block.token_ids == tuple(token_ids)

    def blocks(self) -> list[CachedBlock]:
        """Every block held, least recently used first."""
        return [slot.block for slot in self._slots.values()]

    def write(self, block: CachedBlock, kv: torch.Tensor) -> list[CachedBlock]:
        """Keeps ``block`` (KV of shape ``block_shape``, on any device); returns evictions.

        A block already here is only marked as recently used.
        """
        if block.block_hash in self._slots:
            self._slots.move_to_end(block.block_hash)
            return []
        evicted = [] if self._free else [self._evict_oldest()]
        index = self._free.pop()
        self.buffer[index].copy_(kv, non_blocking=kv.device.type == "cuda")
        if kv.device.type == "cuda":
            self._pending_copy = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._pending_copy.record(torch.cuda.current_stream(kv.device))
        self._slots[block.block_hash] = _Slot(index, _as_host(block))
        return evicted

    def read(self, hashes: Sequence[SequenceHash], device: torch.device) -> torch.Tensor:
        """KV of these blocks, ``[n, *block_shape]`` on ``device``; marks them used."""
        slots = [self._slots[h] for h in hashes]
        for block_hash in hashes:
            self._slots.move_to_end(block_hash)
        if device.type == "cpu":
            self._wait_for_copies()
            index = torch.tensor([slot.index for slot in slots], dtype=torch.long)
            return self.buffer.index_select(0, index)
        out = torch.empty((len(slots), *self.block_shape), dtype=self.buffer.dtype, device=device)
        for row, slot in enumerate(slots):  # one DMA copy per block, from pinned memory
            out[row].copy_(self.buffer[slot.index], non_blocking=True)
        return out

    def drop(self, block_hash: SequenceHash) -> bool:
        """Forgets a block without spilling it; False if it was not here."""
        slot = self._slots.pop(block_hash, None)
        if slot is None:
            return False
        self._free.append(slot.index)
        return True

    def _evict_oldest(self) -> CachedBlock:
        _, slot = self._slots.popitem(last=False)
        if self._spill is not None:
            self._wait_for_copies()
            self._spill(slot.block, self.buffer[slot.index])
        self._free.append(slot.index)
        return slot.block

    def _wait_for_copies(self) -> None:
        if self._pending_copy is not None:
            self._pending_copy.synchronize()
            self._pending_copy = None


def _as_host(block: CachedBlock) -> CachedBlock:
    return CachedBlock(block.block_hash, block.parent_hash, block.token_ids, KVTier.HOST)
