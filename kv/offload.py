"""KV offload: blocks evicted from the device cache go down the tiers and come back up.

Design decisions:

- The block pool calls ``on_device_evicted`` with the blocks it is about to reuse; their
  KV is copied (``DeviceBlocks.gather``) into the host tier, or straight to disk when
  there is no host tier. A block the host tier evicts goes to disk if it was *used* at
  least ``disk_min_uses`` times (computed or hit; Dynamo's frequency filter: one-off
  prompts do not wear the disk), else it is dropped.
- A block stays in a lower tier when it is onboarded (the tiers are caches of the
  device cache, not a move): evicting it again costs no copy, and the router's view
  changes only by the device tier gaining it.
- ``find`` continues a device-cache hit into the lower tiers, block by block, each block
  from the fastest tier holding it, stopping at the first miss; ``load`` reads those
  blocks (host first, then disk files, every file checked) and stops at the first one
  that cannot be read, so a corrupt file shortens the hit and the rest is recomputed.
- Every change in a lower tier is a KV event with that tier, on the engine's event log,
  so the router can weigh host and disk hits below device hits.
- Counters per tier (``TierStats``) give usage and hit rates to the engine's stats.
- Single-threaded: the engine thread owns it (the event log is the shared part).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from dynask.kv.block_pool import BlockId, CachedBlock
from dynask.kv.disk_tier import DiskTier
from dynask.kv.events import BlockRemoved, BlockStored, KVEventLog
from dynask.kv.hashing import SequenceHash
from dynask.kv.host_tier import HostTier
from dynask.kv.tier import KVTier


class DeviceBlocks(Protocol):
    """The engine's KV cache, block by block (``[n, layers, 2, block_size, heads, dim]``)."""

    @property
    def device(self) -> torch.device: ...

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """KV of these device blocks, on the device."""

    def scatter(self, block_ids: list[int], kv: torch.Tensor) -> None:
        """Writes KV (on any device) into these device blocks."""


@dataclass
class TierStats:
    """One lower tier's size and traffic, in blocks."""

    tier: KVTier
    capacity_blocks: int
    used_blocks: int = 0
    stored_blocks: int = 0  # written into the tier
    evicted_blocks: int = 0  # dropped by its LRU
    onboarded_blocks: int = 0  # loaded back into the device tier (hits)
    corrupt_blocks: int = 0  # files that failed a check and were dropped


@dataclass(frozen=True)
class Onboarded:
    """Blocks read from the lower tiers: their identities and KV, ``[n, *block]``."""

    blocks: list[CachedBlock]
    kv: torch.Tensor | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)


@dataclass
class _Counters:
    stored: int = 0
    evicted: int = 0
    onboarded: int = 0


@dataclass
class _UseCounts:
    """How often each recent block was used; forgets the least recent past ``limit``."""

    limit: int
    counts: OrderedDict[SequenceHash, int] = field(default_factory=OrderedDict)

    def add(self, block_hash: SequenceHash) -> None:
        self.counts[block_hash] = self.counts.get(block_hash, 0) + 1
        self.counts.move_to_end(block_hash)
        if len(self.counts) > self.limit:
            self.counts.popitem(last=False)

    def get(self, block_hash: SequenceHash) -> int:
        return self.counts.get(block_hash, 0)


class KVOffload:
    """The host and disk tiers below one engine's device cache."""

    def __init__(
        self,
        device_blocks: DeviceBlocks,
        block_size: int,
        *,
        host: HostTier | None = None,
        disk: DiskTier | None = None,
        disk_min_uses: int = 2,
        event_log: KVEventLog | None = None,
    ) -> None:
        if host is None and disk is None:
            raise ValueError("KVOffload needs a host tier, a disk tier or both")
        if disk_min_uses < 1:
            raise ValueError(f"disk_min_uses must be >= 1, got {disk_min_uses!r}")
        self.device_blocks = device_blocks
        self.block_size = block_size
        self.host = host
        self.disk = disk
        self.disk_min_uses = disk_min_uses
        self._event_log = event_log
        self._counters = {KVTier.HOST: _Counters(), KVTier.DISK: _Counters()}
        capacity = (host.capacity_blocks if host else 0) + (disk.capacity_blocks if disk else 0)
        self._uses = _UseCounts(limit=4 * capacity + 4096)
        if host is not None:
            host.set_spill(self._spill_to_disk)

    # ---- going down -------------------------------------------------------------------

    def on_device_evicted(self, block_ids: list[BlockId], blocks: list[CachedBlock]) -> None:
        """The block pool's eviction listener: keeps the evicted blocks below."""
        kv = self.device_blocks.gather([int(i) for i in block_ids])
        for row, block in enumerate(blocks):
            if self.host is not None:
                self._store(self.host, block, kv[row])
            else:
                self._spill_to_disk(block, kv[row])

    def note_uses(self, hashes: Iterable[SequenceHash]) -> None:
        """Counts one use (computed, or hit in any tier) of each block."""
        for block_hash in hashes:
            self._uses.add(block_hash)

    def _spill_to_disk(self, block: CachedBlock, kv: torch.Tensor) -> None:
        if self.disk is not None and self._uses.get(block.block_hash) >= self.disk_min_uses:
            self._store(self.disk, block, kv)

    def _store(self, tier: HostTier | DiskTier, block: CachedBlock, kv: torch.Tensor) -> None:
        known = tier.holds(block.block_hash, block.token_ids)
        evicted = tier.write(block, kv)
        self._removed(tier.tier, evicted)
        if not known and tier.holds(block.block_hash, block.token_ids):
            self._counters[tier.tier].stored += 1
            hashes = (block.block_hash,)
            size = self.block_size
            self._emit(BlockStored(hashes, block.parent_hash, block.token_ids, size, tier.tier))

    def _removed(self, tier: KVTier, blocks: Sequence[CachedBlock]) -> None:
        if blocks:
            self._counters[tier].evicted += len(blocks)
            self._emit(BlockRemoved(tuple(b.block_hash for b in blocks), tier))

    # ---- coming back up ---------------------------------------------------------------

    def find(
        self, hashes: Sequence[SequenceHash], token_chunks: Sequence[Sequence[int]]
    ) -> list[CachedBlock]:
        """The leading blocks of ``hashes`` held below, each tagged with its fastest tier."""
        found = []
        for block_hash, tokens in zip(hashes, token_chunks, strict=True):
            tier = self._holder(block_hash, tokens)
            if tier is None:
                break
            found.append(CachedBlock(block_hash, None, tuple(tokens), tier.tier))
        return found

    def load(self, found: Sequence[CachedBlock]) -> Onboarded:
        """Reads ``find``'s blocks; stops at the first one that cannot be read."""
        rows: list[torch.Tensor] = []
        blocks: list[CachedBlock] = []
        device = self.device_blocks.device
        for block in found:
            kv = self._read(block, device)
            if kv is None:
                break
            rows.append(kv)
            blocks.append(block)
            self._counters[block.tier].onboarded += 1
        if not rows:
            return Onboarded([])
        return Onboarded(blocks, torch.stack(rows))

    def place(self, block_ids: list[int], onboarded: Onboarded) -> None:
        """Writes onboarded KV into freshly allocated device blocks."""
        if onboarded.kv is not None:
            self.device_blocks.scatter(block_ids, onboarded.kv)

    def _holder(
        self, block_hash: SequenceHash, tokens: Sequence[int]
    ) -> HostTier | DiskTier | None:
        for tier in (self.host, self.disk):
            if tier is not None and tier.holds(block_hash, tokens):
                return tier
        return None

    def _read(self, block: CachedBlock, device: torch.device) -> torch.Tensor | None:
        if block.tier is KVTier.HOST and self.host is not None:
            return self.host.read([block.block_hash], device)[0]
        if self.disk is None:
            return None
        kv = self.disk.read(block.block_hash, block.token_ids)
        if kv is None:
            self._emit(BlockRemoved((block.block_hash,), KVTier.DISK))
            return None
        return kv.to(device)

    # ---- reporting --------------------------------------------------------------------

    def cached_blocks(self) -> list[CachedBlock]:
        """Every block held below the device tier (host first), for a router resync."""
        held = []
        for tier in (self.host, self.disk):
            if tier is not None:
                held += tier.blocks()
        return held

    def stats(self) -> list[TierStats]:
        """Per lower tier, fastest first."""
        result = []
        for tier in (self.host, self.disk):
            if tier is None:
                continue
            counters = self._counters[tier.tier]
            corrupt = tier.corrupt_blocks if isinstance(tier, DiskTier) else 0
            result.append(
                TierStats(
                    tier=tier.tier,
                    capacity_blocks=tier.capacity_blocks,
                    used_blocks=len(tier),
                    stored_blocks=counters.stored,
                    evicted_blocks=counters.evicted,
                    onboarded_blocks=counters.onboarded,
                    corrupt_blocks=corrupt,
                )
            )
        return result

    def _emit(self, event: BlockStored | BlockRemoved) -> None:
        if self._event_log is not None:
            self._event_log.record(event)
