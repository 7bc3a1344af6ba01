"""Choosing an engine actor for a request (KV-aware routing is its own module, later).

Modes: ``least-loaded`` (fewest requests in flight from this control plane, ties broken
round-robin), ``round-robin`` and ``random``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Protocol, TypeVar

ROUTER_MODES = ("least-loaded", "round-robin", "random")


class Routable(Protocol):
    name: str
    in_flight: int
    broken: bool


R = TypeVar("R", bound=Routable)


class Router:
    def __init__(self, mode: str = "least-loaded", seed: int | None = None) -> None:
        if mode not in ROUTER_MODES:
            raise ValueError(
                f"router mode {mode!r} is not known; use one of {', '.join(ROUTER_MODES)}"
            )
        self.mode = mode
        self._turn = itertools.count()
        self._random = random.Random(seed)

    def choose(self, candidates: Sequence[R]) -> R | None:
        """The actor for the next request, or None when no actor is usable."""
        usable = [c for c in candidates if not c.broken]
        if not usable:
            return None
        if self.mode == "random":
            return self._random.choice(usable)
        turn = next(self._turn)
        if self.mode == "round-robin":
            return usable[turn % len(usable)]
        fewest = min(c.in_flight for c in usable)
        least = [c for c in usable if c.in_flight == fewest]
        return least[turn % len(least)]
