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
    # Offload tiers (0 when off); hit tokens are prompt tokens loaded from the tier.
    host_kv_blocks: int = 0
    host_kv_capacity_blocks: int = 0
    host_hit_tokens: int = 0
    disk_kv_blocks: int = 0
    disk_kv_capacity_blocks: int = 0
    disk_hit_tokens: int = 0
    disk_corrupt_blocks: int = 0

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

    def tier_hit_rate(self, hit_tokens: int) -> float:
        """A tier's hit tokens over the prompt tokens looked up."""
        return hit_tokens / self.prefix_queried_tokens if self.prefix_queried_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        device_hits = self.prefix_hit_tokens - self.host_hit_tokens - self.disk_hit_tokens
        return {
            **asdict(self),
            "prefix_hit_rate": self.prefix_hit_rate,
            "device_hit_rate": self.tier_hit_rate(max(device_hits, 0)),
            "host_hit_rate": self.tier_hit_rate(self.host_hit_tokens),
            "disk_hit_rate": self.tier_hit_rate(self.disk_hit_tokens),
        }
