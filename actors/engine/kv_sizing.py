"""How many KV blocks fit, and how long a sequence may be — decided once at start-up.

A configured ``max_model_len`` larger than the cache can hold is clamped, with one log
line that says so; it is never a start-up crash. Sliding windows do not cap it: both
the CPU path and the CUDA kernels apply them at any length.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.model_config import ModelConfig

log = logging.getLogger(__name__)

GIB = 2**30


@dataclass(frozen=True)
class KVCachePlan:
    num_blocks: int
    block_size: int
    max_model_len: int
    bytes_per_block: int
    budget_source: str  # how the budget was chosen, for the start-up log line

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def gib(self) -> float:
        return self.num_blocks * self.bytes_per_block / GIB


def plan_kv_cache(
    config: EngineConfig, model: ModelConfig, device: torch.device, dtype: torch.dtype
) -> KVCachePlan:
    """Sizes the cache from the budget and clamps ``max_model_len`` to it."""
    bytes_per_block = model.kv_bytes_per_token(dtype) * config.block_size
    num_blocks, source = _num_blocks(config, device, bytes_per_block)
    if num_blocks < 1:
        raise ValueError(
            f"the KV cache budget ({source}) holds no block of {bytes_per_block} bytes; "
            "raise kv_cache_gib or gpu_memory_utilization, or use a smaller model"
        )
    wanted = config.max_model_len or model.max_position_embeddings
    capacity = num_blocks * config.block_size
    max_model_len = min(wanted, capacity)
    if max_model_len < wanted:
        log.warning(
            "max_model_len %d does not fit the KV cache (%d blocks x %d tokens = %d tokens, "
            "%s); clamped to %d. Give the cache more memory to serve longer sequences.",
            wanted,
            num_blocks,
            config.block_size,
            capacity,
            source,
            max_model_len,
        )
    return KVCachePlan(num_blocks, config.block_size, max_model_len, bytes_per_block, source)


def _num_blocks(
    config: EngineConfig, device: torch.device, bytes_per_block: int
) -> tuple[int, str]:
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks, f"num_kv_blocks={config.num_kv_blocks}"
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * config.gpu_memory_utilization) - (total - free)
        source = (
            f"{config.gpu_memory_utilization:.0%} of {total / GIB:.1f} GiB minus "
            f"{(total - free) / GIB:.1f} GiB in use = {budget / GIB:.2f} GiB"
        )
        return max(0, budget) // bytes_per_block, source
    return int(config.kv_cache_gib * GIB) // bytes_per_block, f"kv_cache_gib={config.kv_cache_gib}"
