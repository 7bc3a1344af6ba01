"""Wiring the offload tiers (``kv.offload``) to the built-in engine's KV cache.

``RunnerBlocks`` reads and writes whole blocks of the model runner's per-layer caches in
the tiers' layout (``[n, layers, 2, block_size, kv_heads, head_dim]``: one block is one
contiguous slab, so a block moves in one copy); ``build_kv_offload`` sizes the host and
disk tiers from the engine config. The host tier is pinned when the cache is on a GPU.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.model_runner import KVCacheSpec
from dynask.actors.models.model_source import cache_dir
from dynask.kv.disk_prefetch import DiskPrefetcher
from dynask.kv.disk_tier import DiskTier
from dynask.kv.events import KVEventLog
from dynask.kv.host_tier import HostTier
from dynask.kv.offload import KVOffload
from dynask.kv.tier import KVTier

log = logging.getLogger(__name__)

GB = 10**9

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class RunnerBlocks:
    """Whole KV blocks of per-layer ``(k, v)`` caches (satisfies ``kv.offload.DeviceBlocks``)."""

    def __init__(self, kv_caches: KVCaches) -> None:
        self.kv_caches = kv_caches

    @property
    def device(self) -> torch.device:
        return self.kv_caches[0][0].device

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        k0 = self.kv_caches[0][0]
        out = torch.empty(
            (len(block_ids), len(self.kv_caches), 2, *k0.shape[1:]),
            dtype=k0.dtype,
            device=self.device,
        )
        for layer, (k_cache, v_cache) in enumerate(self.kv_caches):
            out[:, layer, 0] = k_cache.index_select(0, ids)
            out[:, layer, 1] = v_cache.index_select(0, ids)
        return out

    def scatter(self, block_ids: list[int], kv: torch.Tensor) -> None:
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        kv = kv.to(self.device, self.kv_caches[0][0].dtype, non_blocking=True)
        for layer, (k_cache, v_cache) in enumerate(self.kv_caches):
            k_cache.index_copy_(0, ids, kv[:, layer, 0])
            v_cache.index_copy_(0, ids, kv[:, layer, 1])

    def save_to_host(self, block_ids: list[int], buffer: torch.Tensor, rows: list[int]) -> None:
        if self.device.type != "cpu":
            # One gather on the GPU, then one DMA copy per block into the pinned rows,
            # queued on the current stream (the host tier waits before reading them).
            kv = self.gather(block_ids)
            for position, row in enumerate(rows):
                buffer[row].copy_(kv[position], non_blocking=True)
            return
        # Layer by layer, device blocks straight into the buffer rows: the per-layer
        # temporaries stay in the CPU cache, and no [n, layers, ...] tensor is made.
        ids = torch.tensor(block_ids, dtype=torch.long)
        index = torch.tensor(rows, dtype=torch.long)
        for layer, (k_cache, v_cache) in enumerate(self.kv_caches):
            buffer[index, layer, 0] = k_cache.index_select(0, ids)
            buffer[index, layer, 1] = v_cache.index_select(0, ids)

    def load_from_host(self, block_ids: list[int], buffer: torch.Tensor, rows: list[int]) -> None:
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        if self.device.type != "cpu":
            staged = torch.empty(
                (len(rows), *buffer.shape[1:]), dtype=buffer.dtype, device=self.device
            )
            for position, row in enumerate(rows):  # DMA from pinned memory, queued
                staged[position].copy_(buffer[row], non_blocking=True)
            self.scatter(block_ids, staged)
            return
        index = torch.tensor(rows, dtype=torch.long)
        for layer, (k_cache, v_cache) in enumerate(self.kv_caches):
            k_cache.index_copy_(0, ids, buffer[index, layer, 0])
            v_cache.index_copy_(0, ids, buffer[index, layer, 1])


def block_shape(spec: KVCacheSpec) -> tuple[int, ...]:
    """One block of every layer's K and V: ``[layers, 2, block_size, kv_heads, head_dim]``."""
    return (spec.num_layers, 2, spec.block_size, spec.num_kv_heads, spec.head_dim)


def build_kv_offload(
    config: EngineConfig,
    spec: KVCacheSpec,
    kv_caches: KVCaches,
    event_log: KVEventLog,
    layout_key: str,
) -> KVOffload | None:
    """The host and disk tiers ``config`` asks for (None when both are off).

    ``layout_key`` names the model whose KV the disk tier holds (its folder is keyed by
    it, the KV shape and dtype), so another model never reads these files.
    """
    if not config.has_offload_tiers:
        return None
    blocks = RunnerBlocks(kv_caches)
    shape = block_shape(spec)
    block_nbytes = torch.Size(shape).numel() * spec.dtype.itemsize
    host = disk = None
    if config.kv_host_gb > 0:
        capacity = _capacity_blocks(config.kv_host_gb, block_nbytes, "kv_host_gb")
        cuda = blocks.device if blocks.device.type == "cuda" else None
        host = HostTier(capacity, shape, spec.dtype, pin_memory=cuda is not None, copy_device=cuda)
    if config.kv_disk_gb > 0:
        folder = Path(config.kv_disk_path) if config.kv_disk_path else cache_dir() / "kv-blocks"
        _capacity_blocks(config.kv_disk_gb, block_nbytes, "kv_disk_gb")
        try:
            disk = DiskTier(folder, int(config.kv_disk_gb * GB), shape, spec.dtype, layout_key)
        except OSError as exc:
            raise ValueError(
                f"EngineConfig 'kv_disk_path' has value {str(folder)!r}, which cannot hold "
                f"the disk KV tier ({exc}); give a writable folder"
            ) from exc
    offload = KVOffload(
        blocks,
        spec.block_size,
        host=host,
        disk=disk,
        disk_min_uses=config.kv_disk_min_uses,
        event_log=event_log,
        prefetcher=DiskPrefetcher(disk) if disk is not None else None,
    )
    for stats in offload.stats():
        log.info(
            "KV %s tier: %d blocks of %.2f MB (%d held from before)",
            stats.tier,
            stats.capacity_blocks,
            block_nbytes / 1e6,
            stats.used_blocks,
        )
    return offload


def _capacity_blocks(gigabytes: float, block_nbytes: int, name: str) -> int:
    capacity = int(gigabytes * GB) // block_nbytes
    if capacity < 1:
        raise ValueError(
            f"EngineConfig '{name}' has value {gigabytes!r}: less than one KV block "
            f"({block_nbytes / GB:.6f} GB); raise it or set 0 to turn the tier off"
        )
    return capacity


def offload_stats(offload: KVOffload | None, block_size: int) -> dict[str, int]:
    """The tier fields of ``EngineStats``: blocks held, capacity, hit tokens per tier."""
    fields: dict[str, int] = {}
    for stats in offload.stats() if offload is not None else []:
        name = stats.tier.value
        fields[f"{name}_kv_blocks"] = stats.used_blocks
        fields[f"{name}_kv_capacity_blocks"] = stats.capacity_blocks
        fields[f"{name}_hit_tokens"] = stats.onboarded_blocks * block_size
        if stats.tier is KVTier.DISK:
            fields["disk_corrupt_blocks"] = stats.corrupt_blocks
    return fields
