"""Which worker may hold which deployment's engine actors: pool workers are fenced off.

A worker named ``dyn-POOL.NODE`` joined pool POOL (``pools``: ``dynask run in=dyn://POOL``
on a node). Whatever control plane places actors on the same scheduler, a plain
``dynask serve`` too, follows one rule: a pool's deployment goes only on that pool's
workers, and every other deployment only on workers that are in no pool. So a node
that joined a pool never ends up serving another control plane's model, and a pool's
engines never take a plain worker.

Pure: worker rows as the scheduler's ``identity`` gives them (``name``), no Dask calls.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from dynask.control_plane.cluster.pools import WORKER_PREFIX
from dynask.control_plane.state.deployment import NAME_PATTERN, DeploymentSpec


def pool_of(worker_name: str) -> str | None:
    """The pool a worker joined (``dyn-llama.node-1-0`` → ``llama``); None for a worker
    in no pool."""
    if not worker_name.startswith(WORKER_PREFIX):
        return None
    pool, dot, node = worker_name.removeprefix(WORKER_PREFIX).partition(".")
    return pool if dot and node and NAME_PATTERN.fullmatch(pool) else None


def may_place(
    deployment: DeploymentSpec, worker: dict[str, Any], served_pools: Collection[str]
) -> bool:
    """May ``deployment``'s actor go on ``worker``? ``served_pools``: the pools whose
    deployments this control plane runs (``out=dyn://POOL``); empty for ``dynask serve``."""
    pool = pool_of(str(worker.get("name", "")))
    if deployment.name in served_pools:
        return pool == deployment.name
    return pool is None
