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

    @property
    def prefix_hit_rate(self) -> float:
        if not self.prefix_queried_tokens:
            return 0.0
        return self.prefix_hit_tokens / self.prefix_queried_tokens

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "prefix_hit_rate": self.prefix_hit_rate}
