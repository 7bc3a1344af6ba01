"""How many KV blocks fit, and how long a sequence may be — decided once at start-up.

A configured ``max_model_len`` larger than the cache can hold is clamped, with one log
line that says so; it is never a start-up crash. Sliding windows do not cap it: both
the CPU path and the CUDA kernels apply them at any length.

On a GPU, ``gpu_memory_utilization`` means what it means in vLLM: the share of the
device's total memory *this engine* may use (weights + activation peak + KV cache),
whatever else runs there. The cache gets that share minus this process's own
allocations (the weights, loaded before the cache is sized) minus the activation peak
of one step; memory of other processes is not charged to it, so two engines at 0.45
each fit one GPU. The share must also be *free*: when cache plus activation peak exceed
the device's free memory, start-up is refused with a message that lists the other
processes on the device (NVML). The activation peak is computed from the model's shape
and the step budget (the largest transient tensors of a step of
``max_num_batched_tokens`` tokens, plus float32 logits of ``max_num_seqs`` rows), not
measured with a profile run: exact for a configuration, and no forward pass is needed
before the cache exists.
"""

from __future__ import annotations

import logging
import os
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
    num_blocks, source = _num_blocks(config, model, device, dtype, bytes_per_block)
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
    config: EngineConfig,
    model: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    bytes_per_block: int,
) -> tuple[int, str]:
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks, f"num_kv_blocks={config.num_kv_blocks}"
    if device.type == "cuda":
        # This engine's own share (the module docstring), not the device's free memory.
        budget = gpu_kv_budget(
            config.gpu_memory_utilization,
            read_device_memory(device),
            activation_peak_bytes(config, model, dtype),
        )
        return budget.kv_bytes // bytes_per_block, budget.source
    return int(config.kv_cache_gib * GIB) // bytes_per_block, f"kv_cache_gib={config.kv_cache_gib}"


@dataclass(frozen=True)
class DeviceMemory:
    """What the budget needs to know about one GPU, read once before the cache exists."""

    total: int  # bytes
    free: int
    own: int  # this process's allocations so far (the weights)
    others: tuple[str, ...] = ()  # "pid 123: 40.2 GiB" per other process NVML lists


@dataclass(frozen=True)
class GPUBudget:
    """This engine's KV cache bytes and the sentence the start-up log gives for them."""

    kv_bytes: int
    source: str


def activation_peak_bytes(config: EngineConfig, model: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes the transient tensors of one step take at most (module docstring)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    tokens = config.max_num_batched_tokens
    qkv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim
    # residual, normed input, attention output and O projection; q/k/v; gate+up and act.
    per_token = 4 * model.hidden_size + qkv + 3 * model.intermediate_size
    logits = 2 * config.max_num_seqs * model.vocab_size * 4  # float32 logits + probabilities
    return tokens * per_token * itemsize + logits


def gpu_kv_budget(fraction: float, memory: DeviceMemory, activation_peak: int) -> GPUBudget:
    """The KV cache bytes of an engine allowed ``fraction`` of the device; ``ValueError``
    when its share cannot hold weights and activations, or the device lacks free room."""
    share = int(memory.total * fraction)
    kv_bytes = share - memory.own - activation_peak
    source = (
        f"{fraction:.0%} of {memory.total / GIB:.1f} GiB = {share / GIB:.2f} GiB, minus this "
        f"engine's weights {memory.own / GIB:.2f} GiB and activation peak "
        f"{activation_peak / GIB:.2f} GiB = {kv_bytes / GIB:.2f} GiB"
    )
    if kv_bytes <= 0:
        raise ValueError(
            f"gpu_memory_utilization {fraction} leaves no room for the KV cache ({source}); "
            "raise it, or lower max_num_batched_tokens / max_num_seqs"
        )
    available = memory.free - activation_peak
    if kv_bytes > available:
        used_elsewhere = memory.total - memory.free - memory.own
        tenants = "; ".join(memory.others) or "NVML lists no process from here"
        raise ValueError(
            f"this engine's KV cache needs {kv_bytes / GIB:.2f} GiB ({source}) but only "
            f"{max(0, available) / GIB:.2f} GiB of the device are free after its activation "
            f"peak: {used_elsewhere / GIB:.2f} GiB are held by others ({tenants}). Lower "
            "gpu_memory_utilization so that the engines on this GPU add up to at most 1"
        )
    return GPUBudget(kv_bytes, source)


def read_device_memory(device: torch.device) -> DeviceMemory:
    """The device's total, free and own memory, and the other processes on it."""
    free, total = torch.cuda.mem_get_info(device)
    own = torch.cuda.memory_reserved(device)
    return DeviceMemory(total, free, own, other_processes(device))


def other_processes(device: torch.device) -> tuple[str, ...]:
    """The other processes NVML lists on ``device`` with their memory; () without NVML."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return ()
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid.removeprefix('GPU-')}")
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except (pynvml.NVMLError, AttributeError) as exc:
        log.info("NVML cannot list the processes on %s: %s", device, exc)
        return ()
    finally:
        pynvml.nvmlShutdown()
    return tuple(
        f"pid {p.pid}: {(p.usedGpuMemory or 0) / GIB:.1f} GiB"
        for p in processes
        if p.pid != os.getpid()
    )
