"""A snapshot of the engine's load and cache state (for the router, metrics and the UI)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dynask.actors.api.wire_fields import WireDecoder

_DERIVED = ("prefix_hit_rate", "device_hit_rate", "host_hit_rate", "disk_hit_rate")


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

    @property
    def device_hit_rate(self) -> float:
        device_hits = self.prefix_hit_tokens - self.host_hit_tokens - self.disk_hit_tokens
        return self.tier_hit_rate(max(device_hits, 0))

    @property
    def host_hit_rate(self) -> float:
        return self.tier_hit_rate(self.host_hit_tokens)

    @property
    def disk_hit_rate(self) -> float:
        return self.tier_hit_rate(self.disk_hit_tokens)

    def tier(self, tier: str) -> tuple[int, int, float]:
        """An offload tier's (blocks held, capacity in blocks, hit rate); ``host`` or ``disk``."""
        if tier == "host":
            return self.host_kv_blocks, self.host_kv_capacity_blocks, self.host_hit_rate
        if tier == "disk":
            return self.disk_kv_blocks, self.disk_kv_capacity_blocks, self.disk_hit_rate
        raise ValueError(f"EngineStats tier has value {tier!r}; expected 'host' or 'disk'")

    def to_dict(self) -> dict[str, Any]:
        """The wire form (``EngineActor.stats``): the counters and the derived rates."""
        return {**asdict(self), **{name: getattr(self, name) for name in _DERIVED}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineStats:
        """Decodes ``to_dict``'s form (the derived rates are recomputed, not read): a
        missing counter is an error naming it, never a silent 0; an unknown one (a newer
        actor's) is logged and ignored (``wire_fields``)."""
        return _DECODER.decode(data)


_DECODER = WireDecoder(EngineStats, "engine stats", derived=_DERIVED)
