"""KV offload: blocks evicted from the device cache go down the tiers and come back up.

Design decisions:

- The block pool calls ``on_device_evicted`` with the blocks it is about to reuse; their
  KV is copied straight into the host tier's buffer (``DeviceBlocks.save_to_host``), or
  gathered and written to disk when there is no host tier. A block the host tier evicts
  goes to disk if it was *used* at least ``disk_min_uses`` times (computed or hit;
  Dynamo's frequency filter: one-off prompts do not wear the disk), else it is dropped.
- A block stays in a lower tier when it is onboarded (the tiers are caches of the
  device cache, not a move): evicting it again costs no copy, and the router's view
  changes only by the device tier gaining it.
- ``find`` continues a device-cache hit into the lower tiers, block by block, each block
  from the fastest tier holding it, stopping at the first miss; ``prepare`` reads the
  disk files among them (every file checked) and stops at the first one that cannot be
  read, so a corrupt file shortens the hit and the rest is recomputed; ``place`` then
  copies them into the device blocks allocated for them, host blocks straight from the
  host buffer.
- With a ``DiskPrefetcher``, disk blocks are read on its thread: ``prepare`` answers
  ``waiting`` until every disk block the hit needs has been read, so the request stays
  queued while the others keep running, and is admitted once its KV is in memory.
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
from dynask.kv.disk_prefetch import DiskPrefetcher
from dynask.kv.disk_tier import DiskTier
from dynask.kv.events import BlockRemoved, BlockStored, KVEventLog
from dynask.kv.hashing import SequenceHash
from dynask.kv.host_tier import HostTier, StoreResult
from dynask.kv.tier import KVTier


class DeviceBlocks(Protocol):
    """The engine's KV cache, whole blocks at a time.

    A block's KV is ``[layers, 2, block_size, kv_heads, head_dim]``; ``gather`` and
    ``scatter`` move ``n`` of them as one ``[n, ...]`` tensor (to and from disk), the
    ``*_host`` methods copy straight between device blocks and rows of the host tier's
    buffer.
    """

    @property
    def device(self) -> torch.device: ...

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """KV of these device blocks, ``[n, ...]`` on the device."""

    def scatter(self, block_ids: list[int], kv: torch.Tensor) -> None:
        """Writes ``[n, ...]`` KV (on any device) into these device blocks."""

    def save_to_host(self, block_ids: list[int], buffer: torch.Tensor, rows: list[int]) -> None:
        """Copies device blocks into ``buffer[rows]``."""

    def load_from_host(self, block_ids: list[int], buffer: torch.Tensor, rows: list[int]) -> None:
        """Copies ``buffer[rows]`` into device blocks."""


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


@dataclass
class Onboarding:
    """Lower-tier blocks ready to be placed into device blocks (``KVOffload.prepare``).

    Host blocks are held in the host tier until ``KVOffload.place``; disk blocks were
    read (and checked) already, their KV is in ``disk_kv`` by position.
    """

    blocks: list[CachedBlock] = field(default_factory=list)
    disk_kv: dict[int, torch.Tensor] = field(default_factory=dict)
    waiting: bool = False  # disk blocks are being read in the background: try again later

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
        prefetcher: DiskPrefetcher | None = None,
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
        self.prefetcher = prefetcher
        self._event_log = event_log
        self._counters = {KVTier.HOST: _Counters(), KVTier.DISK: _Counters()}
        capacity = (host.capacity_blocks if host else 0) + (disk.capacity_blocks if disk else 0)
        self._uses = _UseCounts(limit=4 * capacity + 4096)
        if host is not None:
            host.set_spill(self._spill_to_disk)

    # ---- going down -------------------------------------------------------------------

    def on_device_evicted(self, block_ids: list[BlockId], blocks: list[CachedBlock]) -> None:
        """The block pool's eviction listener: keeps the evicted blocks below."""
        ids = [int(i) for i in block_ids]
        host = self.host
        if host is None:
            kv = self.device_blocks.gather(ids)
            for row, block in enumerate(blocks):
                self._spill_to_disk(block, kv[row])
            return

        def copy_in(rows: list[int], slots: list[int]) -> None:
            self.device_blocks.save_to_host([ids[r] for r in rows], host.buffer, slots)

        self._stored(KVTier.HOST, host.store(blocks, copy_in))

    def note_uses(self, hashes: Iterable[SequenceHash]) -> None:
        """Counts one use (computed, or hit in any tier) of each block."""
        for block_hash in hashes:
            self._uses.add(block_hash)

    def _spill_to_disk(self, block: CachedBlock, kv: torch.Tensor) -> None:
        disk = self.disk
        if disk is None or self._uses.get(block.block_hash) < self.disk_min_uses:
            return
        known = disk.holds(block.block_hash, block.token_ids)
        evicted = disk.write(block, kv)
        stored = [block] if not known and disk.holds(block.block_hash, block.token_ids) else []
        self._stored(KVTier.DISK, StoreResult(stored, evicted))

    def _stored(self, tier: KVTier, result: StoreResult) -> None:
        counters = self._counters[tier]
        if result.evicted:
            counters.evicted += len(result.evicted)
            self._emit(BlockRemoved(tuple(b.block_hash for b in result.evicted), tier))
        for block in result.stored:
            counters.stored += 1
            hashes = (block.block_hash,)
            size = self.block_size
            self._emit(
                BlockStored.from_token_ids(hashes, block.parent_hash, block.token_ids, size, tier)
            )

    # ---- coming back up ---------------------------------------------------------------

    def find(
        self, hashes: Sequence[SequenceHash], token_chunks: Sequence[Sequence[int]]
    ) -> list[CachedBlock]:
        """The leading blocks of ``hashes`` held below, each tagged with its fastest tier."""
        found = []
        disk_budget = self.prefetcher.max_blocks_per_request if self.prefetcher else None
        for block_hash, tokens in zip(hashes, token_chunks, strict=True):
            tier = self._holder(block_hash, tokens)
            if tier is None:
                break
            if tier is KVTier.DISK and disk_budget is not None:
                if disk_budget == 0:
                    break  # more than the reader keeps at once: the rest is recomputed
                disk_budget -= 1
            found.append(CachedBlock(block_hash, None, tuple(tokens), tier))
        return found

    def prepare(self, found: Sequence[CachedBlock]) -> Onboarding:
        """Gets ``find``'s blocks ready to place; stops at the first unreadable one.

        Disk blocks are read and checked now, host blocks are held until ``place``, so
        the device allocation that comes in between (evicting into the host tier) cannot
        push them out. Call ``place`` afterwards, always.
        """
        if self._still_reading(found):
            return Onboarding(waiting=True)
        onboarding = Onboarding()
        for position, block in enumerate(found):
            if block.tier is KVTier.DISK:
                kv = self._read_disk(block)
                if kv is None:
                    break
                onboarding.disk_kv[position] = kv
            onboarding.blocks.append(block)
        if self.host is not None:
            self.host.hold(self._host_hashes(onboarding))
        return onboarding

    def place(self, block_ids: list[int], onboarding: Onboarding) -> None:
        """Copies a ``prepare``d onboarding into these fresh device blocks, in order."""
        if len(block_ids) != onboarding.num_blocks:
            raise ValueError(
                f"{len(block_ids)} device blocks for {onboarding.num_blocks} onboarded blocks"
            )
        host_hashes = self._host_hashes(onboarding)
        if self.host is not None and host_hashes:
            host_ids = [
                block_ids[i] for i, b in enumerate(onboarding.blocks) if b.tier is KVTier.HOST
            ]
            slots = self.host.slots_of(host_hashes)
            self.device_blocks.load_from_host(host_ids, self.host.buffer, slots)
            self.host.release(host_hashes)
            self._counters[KVTier.HOST].onboarded += len(host_hashes)
        if onboarding.disk_kv:
            disk_ids = [block_ids[i] for i in onboarding.disk_kv]
            kv = torch.stack(list(onboarding.disk_kv.values()))
            self.device_blocks.scatter(disk_ids, kv)
            self._counters[KVTier.DISK].onboarded += len(disk_ids)

    def _host_hashes(self, onboarding: Onboarding) -> list[SequenceHash]:
        return [b.block_hash for b in onboarding.blocks if b.tier is KVTier.HOST]

    def _holder(self, block_hash: SequenceHash, tokens: Sequence[int]) -> KVTier | None:
        for tier in (self.host, self.disk):
            if tier is not None and tier.holds(block_hash, tokens):
                return tier.tier
        return None

    def _still_reading(self, found: Sequence[CachedBlock]) -> bool:
        """With a prefetcher: starts the reads ``found`` needs; True until all are done."""
        if self.prefetcher is None:
            return False
        on_disk = [b for b in found if b.tier is KVTier.DISK]
        unread = [b for b in on_disk if not self.prefetcher.ready(b.block_hash)]
        self.prefetcher.request(unread)
        return bool(unread)

    def _read_disk(self, block: CachedBlock) -> torch.Tensor | None:
        if self.disk is None:
            return None
        held = self.disk.holds(block.block_hash, block.token_ids)
        if self.prefetcher is not None:
            loaded = self.prefetcher.take(block.block_hash)
            kv = None if loaded is None else self.disk.settle(block.block_hash, loaded)
        else:
            kv = self.disk.read(block.block_hash, block.token_ids)
        if kv is None and held:  # the tier dropped it: a bad file
            self._emit(BlockRemoved((block.block_hash,), KVTier.DISK))
        return kv

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
