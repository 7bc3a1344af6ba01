"""How the control plane routes: ``--router-mode`` and the flags that tune it.

``RoutingOptions`` is parsed from the command line (``control_plane/flags.py``) and read by
``ModelRouting``; a bad value raises ``ValueError`` naming the field, before anything starts.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dynask.control_plane.flags import flag, non_negative_float, positive_int
from dynask.control_plane.routing.kv_router import (
    DEFAULT_LOG_SIZE,
    KV_MODE,
    ROUTING_MODES,
    OverloadThresholds,
    RouterConfig,
)
from dynask.kv.approx_index import DEFAULT_TTL_S

DEFAULT_PREDICTED_TTL_S = 30.0  # longer than a prefill in a queue; shorter than an idle cache


@dataclass(frozen=True)
class RoutingOptions:
    """How the control plane routes (``--router-mode`` and friends)."""

    mode: str = flag(
        "--router-mode",
        KV_MODE,
        "kv: the actor holding most of the prompt's KV, net of its load (default)",
        choices=ROUTING_MODES,
    )
    overlap_weight: float = flag(
        "--kv-overlap-weight",
        1.0,
        "cost of one prefill block against one decode block (default {default})",
        type=non_negative_float,
    )
    decode_weight: float = flag(
        "--kv-decode-weight",
        0.1,
        "cost of one active decode block against one queued prefill block (default "
        "{default}; Dynamo's: 1)",
        type=non_negative_float,
    )
    recompute_weight: float = flag(
        "--kv-recompute-weight",
        3.0,
        "cost of one block of the prompt the engine lacks against one queued prefill "
        "block: the recompute it adds for every later request (default {default}; Dynamo's: 1)",
        type=non_negative_float,
    )
    temperature: float = flag(
        "--router-temperature",
        0.0,
        "0: lowest cost wins; > 0: sample by softmax over the costs",
        type=non_negative_float,
    )
    max_active_blocks: int | None = flag(  # None: never shed on active blocks
        "--max-active-blocks",
        None,
        "503 when every engine has this many KV blocks in flight (default: no limit)",
        type=positive_int,
    )
    max_queue: int | None = flag(  # None: never shed on queued requests
        "--max-queue",
        None,
        "503 when every engine has this many requests waiting (default: no limit)",
        type=positive_int,
    )
    approx_ttl_s: float = flag(
        "--router-ttl-secs",
        DEFAULT_TTL_S,
        "approximate routing: how long a routed prompt counts as cached (default {default})",
        type=non_negative_float,
    )
    approx_capacity_blocks: int | None = flag(  # None: the TTL alone forgets blocks
        "--router-approx-capacity-blocks",
        None,
        "approximate routing: blocks assumed held per engine, forgotten as it evicts "
        "(default: the cache size each engine reports; none reported, the TTL alone)",
        type=positive_int,
    )
    predicted_ttl_s: float = flag(
        "--router-predicted-ttl-secs",
        DEFAULT_PREDICTED_TTL_S,
        "kv routing: how long a routed prompt counts as cached before its KV events "
        "confirm it (0: off; default {default})",
        type=non_negative_float,
    )
    replica_sync: bool = flag(
        "--router-replica-sync",
        True,
        "share each routing with the other control planes in front of the same engines, "
        "through the engines' streams (default on)",
        action=argparse.BooleanOptionalAction,
    )
    seed: int | None = None
    log_size: int = DEFAULT_LOG_SIZE

    def __post_init__(self) -> None:
        self.router_config(self.mode)  # each raises ValueError naming the bad field
        _ = self.thresholds
        if isinstance(self.log_size, bool) or not isinstance(self.log_size, int):
            raise ValueError(f"RoutingOptions.log_size has value {self.log_size!r}; expected int")
        if self.log_size < 1:
            raise ValueError(f"RoutingOptions.log_size must be >= 1, got {self.log_size!r}")

    def router_config(self, mode: str) -> RouterConfig:
        return RouterConfig(
            mode,
            self.overlap_weight,
            decode_weight=self.decode_weight,
            recompute_weight=self.recompute_weight,
            temperature=self.temperature,
            seed=self.seed,
        )

    @property
    def thresholds(self) -> OverloadThresholds:
        return OverloadThresholds(self.max_active_blocks, self.max_queue)
