"""A snapshot of the engine's load and cache state (for the router, metrics and the UI)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_kv_blocks: int
    num_free_kv_blocks: int
    num_cached_kv_blocks: int
    kv_usage: float  # fraction of blocks held by requests
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int
    num_steps: int
    prompt_tokens: int
    generated_tokens: int

    @classmethod
    def load_only(
        cls, num_running: int, steps: int, prompt_tokens: int, generated_tokens: int
    ) -> EngineStats:
        """Stats of an engine without a KV cache (echo, python): load and counters only."""
        return cls(
            num_running=num_running,
            num_waiting=0,
            num_kv_blocks=0,
            num_free_kv_blocks=0,
            num_cached_kv_blocks=0,
            kv_usage=0.0,
            prefix_queried_tokens=0,
            prefix_hit_tokens=0,
            num_preemptions=0,
            num_steps=steps,
            prompt_tokens=prompt_tokens,
            generated_tokens=generated_tokens,
        )

    @property
    def prefix_hit_rate(self) -> float:
        if not self.prefix_queried_tokens:
            return 0.0
        return self.prefix_hit_tokens / self.prefix_queried_tokens

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "prefix_hit_rate": self.prefix_hit_rate}
