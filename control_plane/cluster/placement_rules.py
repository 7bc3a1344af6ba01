"""Which worker may hold which deployment's engine actors: pool workers are fenced off.

A worker named ``dyn-POOL.NODE`` joined pool POOL (``pools``: ``dynask run in=dyn://POOL``
on a node). Whatever control plane places actors on the same scheduler, a plain
``dynask serve`` too, follows one rule: a pool's deployment goes only on that pool's
workers, and every other deployment only on workers that are in no pool. So a node
that joined a pool never ends up serving another control plane's model, and a pool's
engines never take a plain worker.

Among the workers a deployment may take, ``FailedStarts`` orders them: a start that
failed on one (a model folder may exist on some hosts only, a worker may lack a driver or
memory the others have) goes on to the next, a worker the deployment failed on is tried
after the others and not again for ``RETRY_AFTER_S`` (a model that fails at once is not
reloaded every round), and a changed desired state forgets them all (``clear``: the
change may be the fix).

Pure: worker rows as the scheduler's ``identity`` gives them (``name``), no Dask calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
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


RETRY_AFTER_S = 60.0


class FailedStarts:
    """Failed actor starts by (deployment name, worker address), with when they failed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failed: dict[tuple[str, str], float] = {}

    def record(self, deployment: str, worker: str) -> None:
        self._failed[(deployment, worker)] = self._clock()

    def started(self, deployment: str, worker: str) -> None:
        self._failed.pop((deployment, worker), None)

    def clear(self) -> None:
        self._failed.clear()

    def order(self, deployment: str, workers: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """``workers`` to try for ``deployment``: those it never failed on first (in the
        given order), then those it failed on longest ago; none it failed on within
        ``RETRY_AFTER_S``."""
        now = self._clock()
        fresh, retried = [], []
        for worker in workers:
            failed_at = self._failed.get((deployment, str(worker["address"])))
            if failed_at is None:
                fresh.append(worker)
            elif now - failed_at >= RETRY_AFTER_S:
                retried.append((failed_at, worker))
        return fresh + [worker for _, worker in sorted(retried, key=lambda pair: pair[0])]
