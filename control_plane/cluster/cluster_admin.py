"""What an operator sees of the Dask cluster and can do to it: workers, GPUs, scaling.

Design decisions:
- Read through the runtime's own client (the scheduler's ``identity``; GPUs by
  ``client.run(worker_gpus)``), so the view shows what the reconciler places actors on.
- GPU readings cost one RPC per worker; they are kept for ``GPU_READING_TTL_S`` so that
  several open pages do not multiply that cost.
- Only the embedded cluster of ``dynask run`` can start or retire local workers; on an
  existing scheduler the operator starts ``dask worker`` themselves (``worker_commands``).
- A local worker added to a cluster whose workers are pinned to GPUs gets the next GPU
  round robin; one that would take that GPU's engines past all of its memory is refused
  with ``dynask run``'s own message (``gpu_placement.check_one_more``), before it starts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from dynask.actors.runtime.gpu_discovery import worker_gpus
from dynask.control_plane.cluster.gpu_placement import check_one_more
from dynask.control_plane.cluster.reconciler import ClusterRuntime

log = logging.getLogger(__name__)

GPU_READING_TTL_S = 5.0
WORKER_START_TIMEOUT_S = 120.0


class ClusterActionError(RuntimeError):
    """A worker action that cannot be done here (the message says why)."""


@dataclass(frozen=True)
class WorkerView:
    address: str
    name: str
    nthreads: int
    memory_limit: int  # bytes; 0: no limit
    memory_used: int
    cpu_percent: float
    resources: dict[str, float]
    gpus: list[dict[str, Any]]
    actors: list[str]


@dataclass(frozen=True)
class ClusterView:
    scheduler_address: str | None  # None while the cluster starts
    embedded: bool
    workers: list[WorkerView] = field(default_factory=list)
    leadership: dict[str, str | None] = field(default_factory=dict)  # id, role, leader


class ClusterAdmin:
    """Observes and scales the runtime's cluster."""

    def __init__(self, runtime: ClusterRuntime) -> None:
        self.runtime = runtime
        self._gpus: dict[str, list[dict[str, Any]]] = {}
        self._gpus_read_at = 0.0
        self._background: set[asyncio.Task[None]] = set()

    @property
    def embedded(self) -> bool:
        return self.runtime.scheduler_address is None

    @property
    def scheduler_address(self) -> str | None:
        if self.runtime.scheduler_address is not None:
            return self.runtime.scheduler_address
        cluster = self.runtime.cluster
        return None if cluster is None else str(cluster.scheduler_address)

    def worker_commands(self) -> dict[str, str]:
        """The shell commands that join a worker to this scheduler."""
        address = self.scheduler_address or "tcp://SCHEDULER:8786"
        return {
            "cpu": f"dask worker {address} --nthreads 4",
            # One per GPU, each pinned: NVML and CUDA show every GPU to an unpinned worker.
            "gpu": f"CUDA_VISIBLE_DEVICES=0 dask worker {address} --nthreads 1 --resources GPU=1",
            "cuda": f"dask cuda worker {address} --resources GPU=1",
        }

    async def view(self) -> ClusterView:
        client = self.runtime.client
        if client is None or client.status != "running":
            return ClusterView(
                self.scheduler_address, self.embedded, leadership=self.runtime.leadership()
            )
        info = await client.scheduler.identity(n_workers=-1)  # type: ignore[union-attr]
        gpus = await self._gpu_readings()
        actors: dict[str, list[str]] = {}
        for handle in self.runtime.service.actors():
            actors.setdefault(handle.worker, []).append(handle.name)
        workers = [
            _worker_view(address, worker, gpus.get(address, []), actors.get(address, []))
            for address, worker in info["workers"].items()
        ]
        workers.sort(key=lambda w: (len(w.name), w.name))  # 0, 1, ..., 10 (names are numbers)
        return ClusterView(
            self.scheduler_address, self.embedded, workers, self.runtime.leadership()
        )

    async def _gpu_readings(self) -> dict[str, list[dict[str, Any]]]:
        client = self.runtime.client
        if client is None or time.monotonic() - self._gpus_read_at < GPU_READING_TTL_S:
            return self._gpus
        try:
            self._gpus = await client.run(worker_gpus)  # type: ignore[no-untyped-call]
        except (TimeoutError, OSError) as exc:  # a worker went away mid-call
            log.info("GPU readings failed: %s", exc)
        self._gpus_read_at = time.monotonic()
        return self._gpus

    async def add_local_worker(self) -> int:
        """Starts one more worker process of the embedded cluster; the new worker count.

        Returns at once; when the worker has joined, the reconciler is asked to place
        any replicas that were waiting for a free worker.
        """
        cluster = self._local_cluster()
        if self.runtime.gpu_placements:
            new_name = next(iter(cluster.new_worker_spec()))
            try:
                check_one_more(self.runtime.gpu_placements, cluster.worker_spec, new_name)
            except ValueError as exc:
                raise ClusterActionError(f"No worker started: {exc}") from exc
        wanted = len(cluster.worker_spec) + 1
        cluster.scale(wanted)
        self._in_background(self._reconcile_when_joined(wanted))
        return wanted

    async def retire_worker(self, address: str) -> None:
        """Closes the embedded worker at ``address``; its actors are lost and replaced."""
        cluster = self._local_cluster()
        assert self.runtime.client is not None
        info = await self.runtime.client.scheduler.identity(n_workers=-1)  # type: ignore[union-attr]
        worker = info["workers"].get(address)
        if worker is None:
            raise ClusterActionError(f"no worker has the address {address!r}")
        await cluster.scale_down([worker["name"]])
        self._in_background(self.runtime.reconcile())

    def _local_cluster(self) -> Any:
        if not self.embedded:
            raise ClusterActionError(
                "this control plane runs on an existing scheduler: start or stop workers "
                "with `dask worker` on their hosts"
            )
        if self.runtime.cluster is None or self.runtime.client is None:
            raise ClusterActionError("the cluster is still starting; try again in a moment")
        return self.runtime.cluster

    async def _reconcile_when_joined(self, count: int) -> None:
        client: Any = self.runtime.client  # asynchronous: its methods return awaitables
        await client.wait_for_workers(count, timeout=WORKER_START_TIMEOUT_S)
        await self.runtime.reconcile()

    def _in_background(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("cluster action failed: %s", task.exception())


def _worker_view(
    address: str, worker: dict[str, Any], gpus: list[dict[str, Any]], actors: list[str]
) -> WorkerView:
    metrics = worker.get("metrics", {})
    return WorkerView(
        address=address,
        name=str(worker.get("name", address)),
        nthreads=int(worker.get("nthreads", 0)),
        memory_limit=int(worker.get("memory_limit") or 0),
        memory_used=int(metrics.get("memory", 0)),
        cpu_percent=float(metrics.get("cpu", 0.0)),
        resources={k: float(v) for k, v in worker.get("resources", {}).items()},
        gpus=list(gpus),
        actors=sorted(actors),
    )
