"""The memory tiers a KV block can live in, fastest first.

Named after Dynamo's KV block manager: G1 is the engine's device cache (GPU memory, or
the CPU cache of a CPU-only engine), G2 host memory (pinned on a GPU machine), G3 local
disk. A block evicted from one tier may be kept in the next; a prefix hit in a lower
tier loads the block back into the device tier ("onboarding") instead of recomputing it.
"""

from __future__ import annotations

from enum import StrEnum


class KVTier(StrEnum):
    """Where a cached KV block is held."""

    DEVICE = "device"
    HOST = "host"
    DISK = "disk"


TIER_ORDER: tuple[KVTier, ...] = (KVTier.DEVICE, KVTier.HOST, KVTier.DISK)
"""Fastest first: a block's best tier is the first one here that holds it."""


def parse_tier(value: object) -> KVTier:
    """``value`` as a ``KVTier``; ``ValueError`` naming the value and the choices."""
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    choices = ", ".join(repr(t.value) for t in TIER_ORDER)
    raise ValueError(f"KV tier has value {value!r}; expected one of {choices}")


_BY_NAME = {tier.value: tier for tier in TIER_ORDER}
