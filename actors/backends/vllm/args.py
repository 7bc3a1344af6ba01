"""``out=vllm`` engine arguments: what a deployment or the CLI may set, checked early.

Design decisions:

- ``VLLMArgs`` is a plain dataclass (no vLLM import), so the control plane validates a
  deployment's arguments where vLLM is not installed, and a wrong name or value fails
  in the CLI with a message that names the field, not minutes later inside a worker.
- Its field names are the flags dynask already has where they mean the same thing
  (``max_model_len``, ``dtype``, ``kv_cache_gib``, ``max_num_seqs``) and vLLM's own names
  for the rest (``gpu_memory_utilization``, ``enforce_eager``, ``tensor_parallel_size``).
- ``max_model_len`` never crashes the engine: vLLM is always started with
  ``max_model_len=-1`` (its auto-fit: the model's context, reduced to what the KV cache
  holds), and the engine then serves ``min(requested, fitted)``, saying so when it had
  to clamp (``effective_max_model_len``). vLLM itself refuses to start when the asked
  length does not fit — the crash our user hit.
- CPU defaults differ from vLLM's, for this machine class: float32 (bfloat16 gave
  garbage text on these CPUs), eager mode (torch.compile takes minutes on two cores), a
  1 GiB KV cache (vLLM's default reserves most of the host's memory, per engine), and
  no OpenMP core pinning (every engine would pin core 0; Dask workers share the cores).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "float16", "bfloat16")
CPU_DEFAULT_KV_CACHE_GIB = 1.0
_GIB = 2**30


@dataclass(frozen=True)
class VLLMArgs:
    """Arguments of an ``out=vllm`` engine; each is validated when made."""

    max_model_len: int | None = None  # None: the model's context, as far as the cache holds
    dtype: str = "auto"  # auto: float32 on a CPU, the model's own dtype on a GPU
    kv_cache_gib: float | None = None  # KV cache size; None: 1 GiB on a CPU, see below on GPU
    gpu_memory_utilization: float | None = None  # GPU share for weights + KV cache (vLLM: 0.9)
    enforce_eager: bool | None = None  # None: True on a CPU, vLLM's default on a GPU
    tensor_parallel_size: int = 1
    block_size: int | None = None  # tokens per KV block; None: vLLM's (128 on a CPU)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    seed: int = 0
    tokenizer: str | None = None  # a tokenizer folder, when the model folder has none

    def __post_init__(self) -> None:
        _positive("max_model_len", self.max_model_len, minimum=2)
        if self.dtype not in DTYPES:
            raise ValueError(
                f"VLLMArgs 'dtype' has value {self.dtype!r}; expected one of {', '.join(DTYPES)}"
            )
        if self.kv_cache_gib is not None and not 0 < self.kv_cache_gib < float("inf"):
            raise ValueError(
                f"VLLMArgs 'kv_cache_gib' has value {self.kv_cache_gib!r}; "
                "expected a number of GiB > 0"
            )
        utilization = self.gpu_memory_utilization
        if utilization is not None and not 0 < utilization <= 1:
            raise ValueError(
                f"VLLMArgs 'gpu_memory_utilization' has value {utilization!r}; "
                "expected a fraction in (0, 1]"
            )
        _positive("tensor_parallel_size", self.tensor_parallel_size)
        _positive("block_size", self.block_size)
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.seed < 0:
            raise ValueError(f"VLLMArgs 'seed' has value {self.seed!r}; expected an int >= 0")

    def engine_kwargs(self, model_folder: str, on_cpu: bool) -> dict[str, Any]:
        """Keyword arguments for vLLM's ``AsyncEngineArgs`` (KV events not included)."""
        kwargs: dict[str, Any] = {
            "model": model_folder,
            "tokenizer": self.tokenizer or model_folder,
            "max_model_len": -1,  # auto-fit; the requested length is applied on top
            "dtype": "float32" if on_cpu and self.dtype == "auto" else self.dtype,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enable_prefix_caching": self.enable_prefix_caching,
            "seed": self.seed,
            "enforce_eager": on_cpu if self.enforce_eager is None else self.enforce_eager,
        }
        kv_cache_gib = self.kv_cache_gib
        if on_cpu and kv_cache_gib is None and self.gpu_memory_utilization is None:
            kv_cache_gib = CPU_DEFAULT_KV_CACHE_GIB
        if kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * _GIB)
        optional = {
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "block_size": self.block_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
        }
        kwargs.update({key: value for key, value in optional.items() if value is not None})
        return kwargs

    def effective_max_model_len(self, fitted: int) -> int:
        """The context length to serve, given what vLLM's auto-fit chose (``fitted``)."""
        if self.max_model_len is None or self.max_model_len <= fitted:
            return self.max_model_len or fitted
        log.warning(
            "out=vllm: max_model_len %d does not fit this engine (model context and KV cache "
            "allow %d tokens); serving max_model_len=%d. Raise kv_cache_gib or "
            "gpu_memory_utilization for longer contexts.",
            self.max_model_len,
            fitted,
            fitted,
        )
        return fitted


def _positive(name: str, value: int | None, minimum: int = 1) -> None:
    if value is not None and value < minimum:
        raise ValueError(f"VLLMArgs {name!r} has value {value!r}; expected an int >= {minimum}")
