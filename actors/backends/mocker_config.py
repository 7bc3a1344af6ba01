"""The settings of ``out=mocker`` (capacity, batching, timing), validated on construction.

Its own module, free of torch, so a control plane validates a mocker deployment's engine
arguments without importing the engine (``actors.runtime.engine_factory``); the engine that
runs them is ``actors.backends.mocker``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dynask.kv.block_pool import DEFAULT_PROTECTED_SHARE


@dataclass(frozen=True)
class MockerConfig:
    """Capacity, batching and timing of a simulated engine; validated on construction.

    ``max_model_len`` defaults to the whole cache (``num_kv_blocks * block_size``);
    ``vocab_size`` defaults to the tokenizer's. Times are milliseconds of model time.
    """

    num_kv_blocks: int = 16384
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    prefix_cache_protected_share: float = DEFAULT_PROTECTED_SHARE
    speedup_ratio: float = 1.0  # 0 or inf: no sleeping
    prefill_ms_base: float = 0.0  # per step that prefills anything (Dynamo's fit: 16.5)
    prefill_ms_per_token: float = 0.074
    prefill_quadratic_ms: float = 1.25e-6  # per (uncached prompt tokens of the step)^2
    decode_ms_base: float = 5.7  # per step that decodes anything
    decode_ms_per_active_block: float = 0.01  # per KV block the decoding sequences read
    # Times u and u² where u = the decoding sequences' blocks / num_kv_blocks (Dynamo's
    # fit: 54.01 and -25.74). The squared term may be negative as long as the linear one
    # outweighs it (the decode cost never falls below its base for u in [0, 1]).
    decode_ms_per_kv_usage: float = 0.0
    decode_ms_per_kv_usage_squared: float = 0.0
    eos_probability: float = 0.0
    vocab_size: int | None = None
    seed: int = 0
    # Disaggregation: the wire time of one exported block (KV bytes per block / bandwidth),
    # slept after each export outside the engine's lock, as the transfer would take.
    kv_transfer_ms_per_block: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_kv_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            _check(getattr(self, name) >= 1, name, getattr(self, name), "an integer >= 1")
        capacity = self.num_kv_blocks * self.block_size
        _check(
            self.max_model_len is None or 2 <= self.max_model_len <= capacity,
            "max_model_len",
            self.max_model_len,
            f"an integer in [2, {capacity}] (num_kv_blocks * block_size)",
        )
        _check(self.speedup_ratio >= 0, "speedup_ratio", self.speedup_ratio, "a number >= 0")
        for name in (
            "prefill_ms_base",
            "prefill_ms_per_token",
            "prefill_quadratic_ms",
            "decode_ms_base",
            "decode_ms_per_active_block",
            "decode_ms_per_kv_usage",
            "kv_transfer_ms_per_block",
        ):
            value = getattr(self, name)
            _check(math.isfinite(value) and value >= 0, name, value, "a finite number >= 0")
        squared = self.decode_ms_per_kv_usage_squared
        _check(
            math.isfinite(squared) and self.decode_ms_per_kv_usage + min(squared, 0.0) >= 0,
            "decode_ms_per_kv_usage_squared",
            squared,
            f"a finite number >= -decode_ms_per_kv_usage ({-self.decode_ms_per_kv_usage})",
        )
        _check(
            0 <= self.prefix_cache_protected_share <= 1,
            "prefix_cache_protected_share",
            self.prefix_cache_protected_share,
            "a number in [0, 1]",
        )
        _check(
            0 <= self.eos_probability <= 1,
            "eos_probability",
            self.eos_probability,
            "a number in [0, 1]",
        )
        _check(
            self.vocab_size is None or self.vocab_size >= 2,
            "vocab_size",
            self.vocab_size,
            "an integer >= 2",
        )

    @property
    def context_len(self) -> int:
        """``max_model_len``, or the whole cache when it is not set."""
        return self.max_model_len or self.num_kv_blocks * self.block_size


def _check(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"MockerConfig '{name}' has value {value!r}; expected {expected}")
