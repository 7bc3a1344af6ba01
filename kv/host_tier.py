"""The host-memory tier: KV blocks evicted from the device cache, kept in one host tensor.

Design decisions:

- One preallocated tensor of ``capacity_blocks`` slots, each slot one block laid out
  ``[layers, 2, block_size, kv_heads, head_dim]`` (contiguous, so a block moves in one
  copy). Pinned on a GPU machine, so device↔host copies are DMA transfers that run
  asynchronously; a plain bounded pool on a CPU-only one.
- LRU over slots, keyed by the block's sequence hash; a lookup re-checks the tokens, as
  the device cache does, so a hash collision is a miss.
- Blocks come in by ``store``: slots are found first (evicting), then the caller copies
  all of them in at once (``copy_in``), straight from the device cache into the buffer:
  no intermediate tensor, which on a CPU costs more than the copy itself (fresh pages).
- A block evicted from here is handed to ``spill`` (the disk tier, through
  ``kv.offload``) before its slot is overwritten; blocks being read or written are held
  (``hold``) and never evicted meanwhile. On CUDA the device→host copies are queued
  without waiting; ``spill`` and ``read`` wait for them first, and host→device copies
  are ordered after them on the same stream.
- Not thread-safe: the engine thread owns it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from dynask.kv.block_pool import CachedBlock
from dynask.kv.hashing import SequenceHash
from dynask.kv.tier import KVTier

SpillFn = Callable[[CachedBlock, torch.Tensor], None]
"""Receives a block leaving a tier and its KV (valid only during the call)."""

CopyIn = Callable[[list[int], list[int]], None]
"""Copies KV into host slots: ``copy_in(rows, slots)`` fills ``buffer[slots[i]]`` from the
caller's ``rows[i]`` (e.g. device blocks straight into the pinned buffer)."""


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
        copy_device: torch.device | None = None,
    ) -> None:
        """``pin_memory`` for copies with the CUDA device ``copy_device`` (its streams)."""
        if capacity_blocks < 1:
            raise ValueError(f"HostTier capacity_blocks must be >= 1, got {capacity_blocks!r}")
        self.block_shape = tuple(block_shape)
        self.pinned = pin_memory
        self._copy_device = copy_device
        self.buffer = torch.empty(
            (capacity_blocks, *self.block_shape), dtype=dtype, pin_memory=pin_memory
        )
        self._slots: OrderedDict[SequenceHash, _Slot] = OrderedDict()
        self._free = list(range(capacity_blocks - 1, -1, -1))  # pop() gives slot 0 first
        self._held: set[SequenceHash] = set()  # never evicted: being read or written
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

    def store(self, blocks: Sequence[CachedBlock], copy_in: CopyIn) -> StoreResult:
        """Keeps ``blocks``, copying their KV in with one ``copy_in`` call.

        Blocks already here are only marked as recently used. When every slot is held by
        blocks being read or stored, the remaining blocks are not kept.
        """
        result = StoreResult()
        rows: list[int] = []
        slots: list[int] = []
        for row, block in enumerate(blocks):
            if block.block_hash in self._slots:
                self._slots.move_to_end(block.block_hash)
                continue
            if not self._free and not self._evict_oldest(result.evicted):
                break
            index = self._free.pop()
            self._slots[block.block_hash] = _Slot(index, _as_host(block))
            self._held.add(block.block_hash)  # a later block of this call must not evict it
            result.stored.append(block)
            rows.append(row)
            slots.append(index)
        self._held.difference_update(b.block_hash for b in result.stored)
        if slots:
            copy_in(rows, slots)
            if self.pinned:  # copies from a GPU were queued, not waited for
                stream = torch.cuda.current_stream(self._copy_device)
                self._pending_copy = stream.record_event()
        return result

    def write(self, block: CachedBlock, kv: torch.Tensor) -> StoreResult:
        """``store`` of one block whose KV (``block_shape``, on any device) is ``kv``."""

        def copy_in(_rows: list[int], slots: list[int]) -> None:
            self.buffer[slots[0]].copy_(kv, non_blocking=self.pinned)

        return self.store([block], copy_in)

    def slots_of(self, hashes: Sequence[SequenceHash]) -> list[int]:
        """The buffer rows of these blocks (for a copy out); marks them used."""
        for block_hash in hashes:
            self._slots.move_to_end(block_hash)
        return [self._slots[h].index for h in hashes]

    def hold(self, hashes: Sequence[SequenceHash]) -> None:
        """Keeps these blocks from eviction until ``release`` (while they are read)."""
        self._held.update(hashes)

    def release(self, hashes: Sequence[SequenceHash]) -> None:
        """Ends ``hold``."""
        self._held.difference_update(hashes)

    def read(self, hashes: Sequence[SequenceHash]) -> torch.Tensor:
        """KV of these blocks, ``[n, *block_shape]``, as a new CPU tensor; marks them used."""
        self._wait_for_copies()
        index = torch.tensor(self.slots_of(hashes), dtype=torch.long)
        return self.buffer.index_select(0, index)

    def drop(self, block_hash: SequenceHash) -> bool:
        """Forgets a block without spilling it; False if it was not here."""
        slot = self._slots.pop(block_hash, None)
        if slot is None:
            return False
        self._free.append(slot.index)
        return True

    def _evict_oldest(self, evicted: list[CachedBlock]) -> bool:
        victim = next((h for h in self._slots if h not in self._held), None)
        if victim is None:
            return False
        slot = self._slots.pop(victim)
        if self._spill is not None:
            self._wait_for_copies()
            self._spill(slot.block, self.buffer[slot.index])
        self._free.append(slot.index)
        evicted.append(slot.block)
        return True

    def _wait_for_copies(self) -> None:
        if self._pending_copy is not None:
            self._pending_copy.synchronize()
            self._pending_copy = None


@dataclass
class StoreResult:
    """What one ``store`` did: blocks newly kept, blocks evicted to make room."""

    stored: list[CachedBlock] = field(default_factory=list)
    evicted: list[CachedBlock] = field(default_factory=list)


def _as_host(block: CachedBlock) -> CachedBlock:
    return CachedBlock(block.block_hash, block.parent_hash, block.token_ids, KVTier.HOST)
