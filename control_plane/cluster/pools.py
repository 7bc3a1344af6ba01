"""Pools: the seeds' ``dyn://POOL`` on Dask. Nodes join a pool; front ends serve it.

``dynask run in=dyn://POOL out=ENGINE MODEL --scheduler S`` on a node registers the pool
(its ``DeploymentSpec``: engine, model, engine arguments) on the scheduler, if no node
did before, and starts a worker named ``dyn-POOL.NODE`` there. ``dynask run in=http
out=dyn://POOL --scheduler S`` reads the pool and runs its deployment with one replica on
each of the pool's workers, and only on them (``PoolPlacement``); nodes may come and go.

Design decisions:
- The scheduler is the only thing nodes and front ends share, so the pool's spec is a
  scheduler dataset (``dynask-pool/POOL``), as the engine actors are (``adoption``). The
  first node registers it; a node asking for another engine or model is refused by name,
  so one pool never mixes models.
- A pool's members are known by their worker names (``dyn-POOL.NODE``): nothing else needs
  to be configured, and the admin UI's worker table shows which pool a worker is in.
- The front end, not the node, creates the engine actors, as for any deployment: so
  routing, migration and the reconciler's replacements work the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
from collections.abc import Sequence
from typing import Any

from dynask.control_plane.state.deployment import DeploymentSpec

log = logging.getLogger(__name__)

DATASET_PREFIX = "dynask-pool/"
WORKER_PREFIX = "dyn-"
SCHEME = "dyn://"
POOL_WAIT_S = 120.0
POOL_POLL_S = 0.5


class PoolMismatchError(ValueError):
    """A node asked to serve a pool with another engine or model than it has."""


def pool_name(address: str) -> str:
    """``dyn://POOL`` → ``POOL`` (ValueError naming the address when it names none)."""
    pool = address.removeprefix(SCHEME)
    if not address.startswith(SCHEME) or not pool:
        raise ValueError(f"'{address}' is not a pool address; use dyn://POOL, e.g. dyn://llama")
    DeploymentSpec(name=pool)  # the pool's deployment is named for it: same rules
    return pool


def worker_name(pool: str, node: str | None = None) -> str:
    """``dyn-llama.gpu-node-1``: this node's worker in ``pool`` (the dot cannot be in a
    pool name, so ``dyn-llama.…`` is never a worker of pool ``llama-2``)."""
    return f"{WORKER_PREFIX}{pool}.{node or socket.gethostname()}"


def in_pool(worker_name: str, pool: str) -> bool:
    return worker_name.startswith(f"{WORKER_PREFIX}{pool}.")


def _same_engine(a: DeploymentSpec, b: DeploymentSpec) -> bool:
    keep = ("engine", "model", "engine_args", "engine_file", "served_model_name", "role")
    return all(getattr(a, name) == getattr(b, name) for name in keep)


async def register(client: Any, spec: DeploymentSpec) -> DeploymentSpec:
    """Registers ``spec`` as its pool's deployment unless a node did; the registered one.
    ``PoolMismatchError`` when the pool serves something else."""
    dataset = DATASET_PREFIX + spec.name
    with contextlib.suppress(KeyError):  # KeyError: registered before (another node's run)
        await client.publish_dataset(dataclasses.replace(spec, replicas=0), name=dataset)
    registered: DeploymentSpec = await client.get_dataset(dataset)
    if not _same_engine(registered, spec):
        raise PoolMismatchError(
            f"pool '{spec.name}' serves {registered.model} with engine {registered.engine} "
            f"(args {dict(registered.engine_args)}); this node was asked for {spec.model} with "
            f"engine {spec.engine} (args {dict(spec.engine_args)})"
        )
    return registered


async def pool_workers(client: Any, pool: str) -> list[str]:
    """The addresses of ``pool``'s workers now."""
    info = await client.scheduler.identity(n_workers=-1)
    return sorted(a for a, w in info["workers"].items() if in_pool(str(w.get("name", "")), pool))


async def wait_for_pool(client: Any, pool: str, timeout: float = POOL_WAIT_S) -> DeploymentSpec:
    """The pool's deployment once it is registered and one of its workers has joined."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        registered = DATASET_PREFIX + pool in await client.list_datasets()
        if registered and await pool_workers(client, pool):
            spec: DeploymentSpec = await client.get_dataset(DATASET_PREFIX + pool)
            return spec
        await asyncio.sleep(POOL_POLL_S)
    raise ValueError(
        f"no node has joined pool '{pool}' within {timeout:.0f}s; on a node run: dynask run "
        f"in=dyn://{pool} out=ENGINE MODEL --scheduler SCHEDULER"
    )


class PoolPlacement:
    """The pools a front end serves: each pool's deployment runs one replica on each of
    the pool's workers (where actors may go at all: ``placement_rules``)."""

    def __init__(self, pools: Sequence[str]) -> None:
        self.pools = frozenset(pools)

    def wanted(
        self, deployments: list[DeploymentSpec], workers: list[dict[str, Any]]
    ) -> list[DeploymentSpec]:
        """``deployments`` with each pool's replicas set to its number of workers."""
        return [
            dataclasses.replace(d, replicas=self._members(d.name, workers))
            if d.name in self.pools
            else d
            for d in deployments
        ]

    def _members(self, pool: str, workers: list[dict[str, Any]]) -> int:
        return sum(1 for w in workers if in_pool(str(w.get("name", "")), pool))
