"""``dynask run``'s engine flags, declared once: each becomes an engine argument when set."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from dynask.control_plane.flags import add_flags, flag, flags_of


@dataclass(frozen=True)
class EngineFlags:
    """The engine arguments ``run`` takes as flags (None or "auto": the engine decides)."""

    device: str = flag("--device", "auto", "auto | cpu | cuda | cuda:N")
    dtype: str = flag("--dtype", "auto", "auto | float32 | bfloat16 | float16")
    kv_cache_gib: float | None = flag("--kv-cache-gib", None, "KV cache size on a CPU", type=float)
    kv_host_gb: float | None = flag(
        "--kv-host-gb", None, "host-memory KV offload tier (GB; 0: off)", type=float
    )
    kv_disk_gb: float | None = flag("--kv-disk-gb", None, "disk KV tier (GB; 0: off)", type=float)
    kv_disk_path: str | None = flag("--kv-disk-path", None, "disk KV tier folder")
    kv_disk_min_uses: int | None = flag(
        "--kv-disk-min-uses", None, "uses before a block goes to disk", type=int
    )
    prefix_cache_protected_share: float | None = flag(
        "--prefix-cache-protected-share",
        None,
        "share of the KV cache that reused prefix blocks may hold ahead of blocks used once "
        "(segmented LRU; 0: plain LRU; default 0.5)",
        type=float,
    )
    max_model_len: int | None = flag("--max-model-len", None, type=int)
    max_num_seqs: int | None = flag("--max-num-seqs", None, type=int)
    max_num_batched_tokens: int | None = flag(
        "--max-num-batched-tokens", None, "tokens per step", type=int
    )
    max_prefill_tokens_with_decodes: int | None = flag(
        "--max-prefill-tokens-with-decodes",
        None,
        "cap on a step's prefill tokens while decodes run (chunked prefill)",
        type=int,
    )
    decode_burst: int | None = flag("--decode-burst", None, "greedy steps per sync", type=int)
    async_scheduling: bool | None = flag(
        "--async-scheduling",
        None,
        "launch each decode step before applying the last (default: on for CUDA)",
        action=argparse.BooleanOptionalAction,
    )
    cuda_fast_paths: bool | None = flag(
        "--cuda-fast-paths",
        None,
        "CUDA fast paths: skinny fused projections, prefill key splits, cuDNN long chunks, "
        "the short-prefill graph (default: on for CUDA; off: the kernels of before)",
        action=argparse.BooleanOptionalAction,
    )
    block_size: int | None = flag("--block-size", None, "tokens per KV block", type=int)
    gpu_memory_utilization: float | None = flag("--gpu-memory-utilization", None, type=float)
    tensor_parallel_size: int | None = flag("--tensor-parallel-size", None, "out=vllm", type=int)
    enforce_eager: bool | None = flag("--enforce-eager", None, "out=vllm", action="store_true")
    kv_events_endpoint: str | None = flag(
        "--kv-events-endpoint",
        None,
        "out=openai: tcp://HOST:PORT of the server's vLLM KV event publisher (default: none, "
        "approximate routing)",
    )


def add_engine_flags(run: argparse.ArgumentParser) -> None:
    add_flags(run, EngineFlags)


def engine_args(args: argparse.Namespace) -> dict[str, Any]:
    """Only the flags the user set; the engine factory rejects ones its engine lacks."""
    given = {
        field.name: getattr(args, declared.dest, None) for field, declared in flags_of(EngineFlags)
    }
    return {k: v for k, v in given.items() if v is not None and v != "auto"}
