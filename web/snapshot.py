"""The overview's data: the scheduler, its workers and the engine actors, as plain rows.

The overview page and its SSE feed both render from ``take_snapshot``, so a page load
and a live update show the same thing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from dynask.actors.api.stats import EngineStats
from dynask.control_plane.cluster.cluster_admin import ClusterAdmin, ClusterView
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.deployment import Role
from dynask.control_plane.state.repository import Repository


@dataclass(frozen=True)
class TierRow:
    """One KV offload tier of an engine actor: usage and the share of prompt tokens it served."""

    tier: str  # host | disk
    usage: float
    hit_rate: float


@dataclass(frozen=True)
class ActorRow:
    """One engine actor as the overview shows it."""

    name: str
    deployment: str
    role: Role
    model: str
    worker: str
    running: int
    waiting: int
    in_flight: int
    kv_usage: float | None
    prefix_hit_rate: float | None
    health: str  # ready | broken
    kv_tiers: tuple[TierRow, ...] = ()  # offload tiers below the KV cache, fastest first


@dataclass(frozen=True)
class Snapshot:
    cluster: ClusterView
    actors: list[ActorRow]

    def context(self) -> dict[str, Any]:
        workers = self.cluster.workers
        return {
            "cluster": self.cluster,
            "workers": workers,
            "actors": self.actors,
            "summary": {
                "workers": len(workers),
                "gpus": sum(len(w.gpus) for w in workers),
                "threads": sum(w.nthreads for w in workers),
                "actors_ready": sum(1 for a in self.actors if a.health == "ready"),
                "actors": len(self.actors),
                "running": sum(a.running for a in self.actors),
                "waiting": sum(a.waiting for a in self.actors),
            },
        }


async def take_snapshot(
    cluster: ClusterAdmin, service: ServingService, repo: Repository
) -> Snapshot:
    view = await cluster.view()
    roles = {d.name: d.role for d in await asyncio.to_thread(repo.list_deployments)}
    return Snapshot(view, actor_rows(service, roles))


def actor_rows(service: ServingService, roles: dict[str, Role]) -> list[ActorRow]:
    rows = []
    for model in service.models.values():
        for handle in model.actors:
            stats = handle.stats
            has_kv = stats is not None and stats.num_kv_blocks > 0
            rows.append(
                ActorRow(
                    name=handle.name,
                    deployment=handle.deployment,
                    role=roles.get(handle.deployment, Role.AGGREGATED),
                    model=model.name,
                    worker=handle.worker,
                    running=stats.num_running if stats else 0,
                    waiting=stats.num_waiting if stats else 0,
                    in_flight=handle.in_flight,
                    kv_usage=stats.kv_usage if stats and has_kv else None,
                    prefix_hit_rate=stats.prefix_hit_rate if stats and has_kv else None,
                    health="broken" if handle.broken else "ready",
                    kv_tiers=tier_rows(stats) if stats else (),
                )
            )
    return sorted(rows, key=lambda row: row.name)


def tier_rows(stats: EngineStats) -> tuple[TierRow, ...]:
    """The offload tiers an engine's stats report (none for an engine without them)."""
    rows = []
    for tier in ("host", "disk"):
        used, capacity, hit_rate = stats.tier(tier)
        if capacity:
            rows.append(TierRow(tier, used / capacity, hit_rate))
    return tuple(rows)
