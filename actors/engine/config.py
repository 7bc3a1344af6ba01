"""The built-in engine's settings, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dynask.kv.block_pool import DEFAULT_PROTECTED_SHARE

if TYPE_CHECKING:  # torch is imported where a device or dtype is made: the control plane
    import torch  # validates configs without loading it

_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the built-in engine needs besides the requests.

    ``kv_cache_gib`` sizes the KV cache on a CPU; on a GPU this engine's weights, activation
    peak and cache take at most ``gpu_memory_utilization`` of the device's total memory
    (vLLM's meaning; ``actors.engine.kv_cache.sizing``), so engines on one GPU add up to <= 1.
    ``num_kv_blocks`` overrides both (tests use it for tiny budgets). ``max_model_len``
    defaults to the model's own limit and is clamped to what the cache can hold. On CUDA,
    ``cuda_graphs`` captures decode steps of 1 to ``max_num_seqs`` rows at start-up (off:
    every step runs eagerly).
    ``decode_burst`` runs up to that many greedy decode-only steps back to back with one
    host sync (module ``decode_burst``); 1, the default, turns bursts off.
    ``async_scheduling`` launches each decode step before the host applies the one before
    (``cuda.overlap``); None, the default, turns it on for CUDA devices only.
    ``max_prefill_tokens_with_decodes`` caps the prefill tokens of a step that also has
    decode rows (chunked prefill that keeps inter-token latency smooth; None: no cap).
    ``cuda_fast_paths`` (on by default since 2026-12-01, verified on an H200: kernel and
    engine tests passed, cached 4,096-token TTFT 19.1 -> 8.1 ms) turns on the CUDA paths of
    issue 19: the skinny fused projections at small batch (``cuda.skinny_matmul``), key
    splits in the paged prefill kernel (``cuda.triton_prefill_split``), cuDNN attention
    for a long lone chunk and the short-prefill CUDA graph of a cached prompt's last block
    (``cuda.prefill_graph``). Off runs exactly the kernels and code paths of before, with
    no extra compile or capture. A CPU device never takes these paths, whatever the flag.
    ``kv_host_gb`` / ``kv_disk_gb`` (10^9 bytes; 0 = off) add the offload tiers below the
    KV cache (``actors.engine.kv_cache.tiers``); disk blocks live under ``kv_disk_path``
    (default ``$DYNASK_CACHE_DIR/kv-blocks``), and only blocks used at least
    ``kv_disk_min_uses`` times are written there.
    """

    model: str | None = None  # HF folder, .gguf file or hub id; None = bundled SmolLM2
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16
    block_size: int = 16
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.9
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    # Share of the cache that blocks hit at least once may hold ahead of blocks used once
    # (segmented LRU, kv.free_queue); 0 is plain LRU.
    prefix_cache_protected_share: float = DEFAULT_PROTECTED_SHARE
    cuda_graphs: bool = True  # decode steps replayed from CUDA graphs (CUDA only)
    decode_burst: int = 1  # greedy decode steps per host sync (1: off)
    async_scheduling: bool | None = None  # next decode step launched first (None: on CUDA)
    max_prefill_tokens_with_decodes: int | None = None  # None: prefill takes the budget
    cuda_fast_paths: bool = True  # issue 19's CUDA paths (CUDA only; off: the ops of before)
    seed: int = 0
    kv_host_gb: float = 0.0
    kv_disk_gb: float = 0.0
    kv_disk_path: str | None = None
    kv_disk_min_uses: int = 2

    def __post_init__(self) -> None:
        self._check_offload()
        _check(self.block_size >= 1, "block_size", self.block_size, "an integer >= 1")
        _check(self.kv_cache_gib > 0, "kv_cache_gib", self.kv_cache_gib, "a number > 0")
        _check(
            0 <= self.prefix_cache_protected_share <= 1,
            "prefix_cache_protected_share",
            self.prefix_cache_protected_share,
            "a number in [0, 1]",
        )
        _check(
            0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            self.gpu_memory_utilization,
            "a number in (0, 1]",
        )
        _check(
            self.num_kv_blocks is None or self.num_kv_blocks >= 1,
            "num_kv_blocks",
            self.num_kv_blocks,
            "an integer >= 1",
        )
        _check(
            self.max_model_len is None or self.max_model_len >= 2,
            "max_model_len",
            self.max_model_len,
            "an integer >= 2",
        )
        _check(
            self.decode_burst >= 1,
            "decode_burst",
            self.decode_burst,
            "an integer >= 1 (1 turns bursts off)",
        )
        _check(
            self.max_prefill_tokens_with_decodes is None
            or self.max_prefill_tokens_with_decodes >= 1,
            "max_prefill_tokens_with_decodes",
            self.max_prefill_tokens_with_decodes,
            "an integer >= 1, or null for no cap",
        )
        _check(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs, "an integer >= 1")
        _check(
            self.max_num_batched_tokens >= 1,
            "max_num_batched_tokens",
            self.max_num_batched_tokens,
            "an integer >= 1",
        )
        _check(
            self.dtype == "auto" or self.dtype in _DTYPES,
            "dtype",
            self.dtype,
            f"one of auto, {', '.join(_DTYPES)}",
        )
        _check(
            self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda"),
            "device",
            self.device,
            "auto, cpu, cuda or cuda:N",
        )

    def _check_offload(self) -> None:
        _check(self.kv_host_gb >= 0, "kv_host_gb", self.kv_host_gb, "a number >= 0 (0: off)")
        _check(self.kv_disk_gb >= 0, "kv_disk_gb", self.kv_disk_gb, "a number >= 0 (0: off)")
        _check(
            self.kv_disk_min_uses >= 1, "kv_disk_min_uses", self.kv_disk_min_uses, "an integer >= 1"
        )
        _check(
            self.enable_prefix_caching or not self.has_offload_tiers,
            "enable_prefix_caching",
            self.enable_prefix_caching,
            "true when kv_host_gb or kv_disk_gb is set (offload tiers keep cached blocks)",
        )

    @property
    def has_offload_tiers(self) -> bool:
        """Whether a host or disk tier sits below the KV cache."""
        return self.kv_host_gb > 0 or self.kv_disk_gb > 0

    def async_scheduling_on(self) -> bool:
        if self.async_scheduling is not None:
            return self.async_scheduling
        return self.torch_device().type == "cuda"

    def torch_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"EngineConfig 'device' has value {self.device!r}, but no CUDA GPU "
                "is available here; use device='cpu' or 'auto'"
            )
        return device

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        import torch

        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        dtype: torch.dtype = getattr(torch, self.dtype)
        return dtype


def _check(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"EngineConfig '{name}' has value {value!r}; expected {expected}")
