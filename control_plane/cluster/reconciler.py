"""The Dask side of the control plane: the cluster, engine actors on workers, reconciling.

``dynask run`` starts an embedded ``LocalCluster`` of worker processes (isolated as on a
real cluster); ``dynask serve`` connects to an existing scheduler. Either way the control
plane's client uses ``direct_to_workers=True``: actor calls then go straight to the worker
instead of through the scheduler (measured here 2–3x faster).

The reconciler makes the cluster match the desired deployments: each replica is one
``EngineActor`` on its own worker (a worker with a ``GPU`` resource gives one GPU to it);
a start that fails goes on to the next free worker (a model folder may exist on some
hosts only; ``placement_rules.FailedStarts``), and one deployment failing stops no other.
It runs every ``RECONCILE_INTERVAL_S`` and at once when ``actor_health`` reports a lost
actor or a worker joining or leaving; a replaced actor gets a new name (its old key may
still be known to the scheduler). Actors are published on the scheduler, so a restarted
control plane adopts the ones still running (``actor_adoption``).

On an external scheduler several control planes may serve the same actors: a lease
(``leadership``) makes one the leader, which reconciles as above; the others follow:
each round they adopt what the leader published and let go of what it withdrew, and
they never start, stop or record an actor. A follower that becomes leader closes the
actor rows its predecessor left, records the actors it serves, adopts the rest and
reconciles (replacing what was lost meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.runtime.gpu_discovery import GPUDiscoveryPlugin
from dynask.control_plane.cluster import adoption as actor_adoption
from dynask.control_plane.cluster.gpu_placement import WorkerPlacement, embedded_cluster
from dynask.control_plane.cluster.leadership import ControlPlaneRole, DatasetTermStore, Lease
from dynask.control_plane.cluster.placement_rules import FailedStarts, may_place
from dynask.control_plane.cluster.plan import create_actor, engine_spec, with_kv_listener
from dynask.control_plane.cluster.pools import PoolPlacement
from dynask.control_plane.cluster.retiring import drain, newest_first, stop_quietly
from dynask.control_plane.cluster.served_actors import ServedActors
from dynask.control_plane.reliability.actor_health import ActorHealth
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.serving.readiness import DeploymentReadiness, deployment_readiness
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.deployment import DeploymentSpec, Role

log = logging.getLogger(__name__)

RECONCILE_INTERVAL_S = 5.0
FOLLOW_INTERVAL_S = 1.0  # how soon a follower serves an actor the leader started


ActorEventHook = Callable[[str, str, dict[str, Any]], None]
DesiredState = Callable[[], Awaitable[list[DeploymentSpec]]]


class ClusterRuntime:
    """Owns the Dask client (and the embedded cluster) and the engine actors."""

    def __init__(
        self,
        service: ServingService,
        deployments: list[DeploymentSpec],
        scheduler_address: str | None = None,
        n_workers: int = 1,
        on_actor_event: ActorEventHook | None = None,
        gpu_placements: Sequence[WorkerPlacement] = (),
        worker_plugins: Sequence[WorkerPlugin] = (),
        desired_state: DesiredState | None = None,
        on_lead: Callable[[], None] = lambda: None,
    ) -> None:
        """``desired_state`` reads the deployments as stored (a follower follows them; a
        new leader starts from them); ``on_lead`` runs as this one becomes the leader,
        before it records the actors it serves (the control plane closes stale rows)."""
        self.service = service
        self.worker_plugins = list(worker_plugins)  # registered at start (tracing's)
        self.deployments = deployments
        self.scheduler_address = scheduler_address
        self.n_workers = n_workers
        self.gpu_placements = list(gpu_placements)  # embedded workers' GPUs (gpu_placement)
        self.cluster: LocalCluster | None = None
        self.client: Client | None = None
        self._on_actor_event = on_actor_event or (lambda *_: None)
        self.served = ServedActors(service)
        self._reconciler: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._used_names: set[str] = set()
        self.health: ActorHealth | None = None
        self.placement: PoolPlacement | None = None  # None: this control plane serves no pool
        # This control plane in leases (the suffix: two containers may share host and pid).
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.lease: Lease | None = None  # None: an embedded cluster, which only we serve
        self._desired_state = desired_state
        self._on_lead = on_lead
        self._leading = False  # whether this one took the lead (closed rows, adopted all)
        self._lease_task: asyncio.Task[None] | None = None
        self._ignored: set[str] = set()  # published actors of deployments not ours
        self._lost: set[str] = set()  # never adopted again (a name is never reused)
        self._failed_starts = FailedStarts()  # tried elsewhere first (``FailedStarts``)

    @property
    def role(self) -> ControlPlaneRole:
        return ControlPlaneRole.LEADER if self.lease is None else self.lease.role

    @property
    def is_leader(self) -> bool:
        return self.role is ControlPlaneRole.LEADER

    def leadership(self) -> dict[str, str | None]:
        """This control plane's role, as ``/health`` and the admin UI show it."""
        leader = self.holder if self.lease is None else self.lease.leader
        return {"id": self.holder, "role": self.role.value, "leader": leader}

    def use_placement(self, placement: PoolPlacement) -> None:
        """Pools (``dyn://POOL``): their deployments follow their workers (``pools``)."""
        self.placement = placement

    async def start(self) -> None:
        address = self.scheduler_address
        if address is None:
            self.cluster = await embedded_cluster(self.n_workers, self.gpu_placements)
            address = self.cluster.scheduler_address
        self.client = await Client(  # type: ignore[no-untyped-call]
            address, asynchronous=True, direct_to_workers=True
        )
        await self.client.register_plugin(GPUDiscoveryPlugin())
        for plugin in self.worker_plugins:
            await self.client.register_plugin(plugin)
        self.health = ActorHealth(
            self.client, self.service.reliability, self.served.handles.values, self._wake.set
        )
        self.health.start()
        if self.scheduler_address is not None:
            self.lease = Lease(DatasetTermStore(self.client, self._scope()), self.holder)
            await self.lease.tick()
            self._lease_task = asyncio.create_task(
                self.lease.keep(lambda _: self._wake.set()), name="lease"
            )
        await self.reconcile()
        self._reconciler = asyncio.create_task(self._reconcile_forever(), name="reconciler")

    def _scope(self) -> str:
        """Which control planes share a lease: a pool's front ends, or a cluster's."""
        if self.placement is None:
            return "cluster"
        return "pool-" + "+".join(sorted(self.placement.pools))

    async def _reconcile_forever(self) -> None:
        while True:
            interval = RECONCILE_INTERVAL_S if self.is_leader else FOLLOW_INTERVAL_S
            with contextlib.suppress(TimeoutError):  # no wake-up: the periodic round
                await asyncio.wait_for(self._wake.wait(), interval)
            self._wake.clear()
            try:
                await self.reconcile()
            except Exception:
                log.exception("reconcile failed; retrying in %.0fs", RECONCILE_INTERVAL_S)

    def set_deployments(self, deployments: list[DeploymentSpec]) -> None:
        """Replaces the desired state; the next ``reconcile`` acts on it."""
        if list(deployments) != self.deployments:
            self._ignored.clear()  # a deployment added or changed may want them now
            self._failed_starts.clear()  # and may start where it failed before
        self.deployments = list(deployments)

    async def reconcile(self) -> None:
        """The leader creates missing replicas on free workers, drops actors whose stream
        broke and stops the ones no deployment wants any more (scaled down or deleted);
        a follower follows the leader's actors instead."""
        async with self._lock:
            if not self.is_leader:
                self._leading = False
                await self._follow()
                return
            if not self._leading:
                await self._take_lead()
            await self._drop_broken()
            placement = self.placement
            if placement is not None:
                self.deployments = placement.wanted(self.deployments, await self._workers())
            await self._stop_surplus()
            failures = [f for d in self.deployments if (f := await self._start_missing(d))]
            if failures:  # after every deployment had its turn: one failing stops no other
                raise failures[0]

    async def _start_missing(self, deployment: DeploymentSpec) -> Exception | None:
        """Starts the deployment's missing replicas on free workers, the next one after a
        failed start (``FailedStarts``); the last failure if replicas are still missing."""
        missing = deployment.replicas - self.served.count(deployment.name)
        if missing <= 0:  # no scheduler call for a deployment that has its replicas
            return None
        served = self.placement.pools if self.placement is not None else ()
        free = [w for w in await self._free_workers() if may_place(deployment, w, served)]
        failure: Exception | None = None
        for worker in self._failed_starts.order(deployment.name, free):
            try:
                await self._start_actor(deployment, worker)
            except Exception as exc:  # logged and recorded as an actor event there
                self._failed_starts.record(deployment.name, str(worker["address"]))
                failure = exc
                continue
            self._failed_starts.started(deployment.name, str(worker["address"]))
            missing -= 1
            if missing == 0:
                return None
        return failure

    async def _follow(self) -> None:
        """A follower's round: the stored desired state, the leader's actors."""
        if self._desired_state is not None:
            self.set_deployments(await self._desired_state())
        await self._drop_broken()
        await self._sync_published()

    async def _take_lead(self) -> None:
        """Becoming the leader: the stored desired state (a dead leader's changes are
        there), the actor rows re-recorded, every published actor adopted (or stopped)."""
        if self._desired_state is not None:
            self.set_deployments(await self._desired_state())
        await self._drop_broken()
        self._on_lead()
        for name, handle in self.served.handles.items():
            details = {"worker": handle.worker, "deployment": handle.deployment}
            self._record(name, "starting", details)
            self._record(name, "ready", {**details, "stream_address": handle.info.stream_address})
        await self._sync_published()
        self._leading = True

    def _record(self, actor: str, status: str, details: dict[str, Any]) -> None:
        """Only the leader writes the actors' lifecycle down."""
        if self.is_leader:
            self._on_actor_event(actor, status, details)

    async def _drop_broken(self) -> None:
        for name, handle in list(self.served.handles.items()):
            if handle.broken:
                log.warning("engine actor %s is gone; the leader replaces it", name)
                self._lost.add(name)
                self.served.remove(name)
                await handle.close()
                await self._forget(name)
                reason = handle.lost_reason or "stream_closed"
                self.service.metrics.actors_lost.labels(reason).inc()
                self._record(name, "lost", {"worker": handle.worker, "reason": reason})

    async def _forget(self, name: str) -> None:
        """Releases the actor's key; the leader also withdraws its dataset."""
        assert self.client is not None
        if self.is_leader:
            await actor_adoption.withdraw(self.client, name)
        self.served.release(name)

    async def _stop_surplus(self) -> None:
        wanted = {d.name: d.replicas for d in self.deployments}
        for name, handle in sorted(self.served.handles.items(), key=newest_first, reverse=True):
            if self.served.count(handle.deployment) <= wanted.get(handle.deployment, 0):
                continue
            self.served.remove(name)
            await drain(handle)
            await self._stop_handle(handle)
            await self._forget(name)
            self._record(name, "stopped", {"worker": handle.worker})

    async def _workers(self) -> list[dict[str, Any]]:
        assert self.client is not None
        info = await self.client.scheduler.identity(n_workers=-1)  # type: ignore[union-attr]
        return [{"address": a, **w} for a, w in info["workers"].items()]

    async def _free_workers(self) -> list[dict[str, Any]]:
        used = self.served.workers()
        if self.health is not None:
            used |= set(self.health.quarantined)  # hung: registered, but not answering
        workers = [w for w in await self._workers() if w["address"] not in used]
        return sorted(workers, key=lambda w: str(w["address"]))

    async def _start_actor(self, deployment: DeploymentSpec, worker: dict[str, Any]) -> None:
        assert self.client is not None
        name = self._actor_name(deployment.name)
        address = str(worker["address"])
        self._on_actor_event(
            name,
            "starting",
            {
                "worker": address,
                "deployment": deployment.name,
                "worker_name": str(worker.get("name", address)),
                "resources": dict(worker.get("resources", {})),
            },
        )
        try:
            spec = engine_spec(deployment)
            proxy, future, info = await create_actor(self.client, spec, name, worker)
            info = await self._with_kv_listener(proxy, deployment.role, info)
            handle = ActorHandle(name, deployment.name, proxy, info, role=deployment.role)
            await handle.connect()
            await actor_adoption.publish(self.client, name, deployment.name, spec, future)
        except Exception as exc:
            log.error("engine actor %s failed to start on %s: %s", name, address, exc)
            self._on_actor_event(name, "failed", {"worker": address, "error": str(exc)})
            raise
        self.served.add(deployment.model_name, handle, future)
        self._on_actor_event(
            name, "ready", {"worker": address, "stream_address": info.stream_address}
        )
        log.info("engine actor %s ready on %s (stream %s)", name, address, info.stream_address)

    async def _with_kv_listener(self, proxy: Any, role: Role, info: ActorInfo) -> ActorInfo:
        return await with_kv_listener(proxy, role, info, self.service.disagg.options.transport)

    def _actor_name(self, deployment: str) -> str:
        index = 0
        while f"{deployment}-{index}" in self._used_names:
            index += 1
        self._used_names.add(f"{deployment}-{index}")
        return f"{deployment}-{index}"

    async def _sync_published(self) -> None:
        """Adopts the published actors not served here yet (a predecessor's, or the
        leader's new ones; see ``actor_adoption``). The leader stops those no deployment
        wants as they are and drops the unreachable; a follower lets go of the actors the
        leader withdrew and leaves everything else to it."""
        assert self.client is not None
        published = await actor_adoption.published_names(self.client)
        if not self.is_leader:
            for name in set(self.served.handles) - published:
                self.served.let_go(name)
        for name in sorted(published - set(self.served.handles) - self._ignored - self._lost):
            self._used_names.add(name)
            try:
                found = await actor_adoption.adopt(self.client, name)
            except Exception as exc:  # its worker died while no leader watched
                log.warning("published engine actor %s is unreachable: %s", name, exc)
                if self.is_leader:
                    await actor_adoption.withdraw(self.client, name)
                continue
            await self._serve_adopted(found)

    async def _serve_adopted(self, found: actor_adoption.PublishedActor) -> None:
        assert self.client is not None
        plan = next((d for d in self.deployments if d.name == found.deployment), None)
        if plan is None or (self.is_leader and engine_spec(plan) != found.spec):
            if self.is_leader and self.placement is None:  # a pool's leader minds its own
                log.warning("stopping engine actor %s: no deployment wants it now", found.name)
                await stop_quietly(found.proxy)
                await actor_adoption.withdraw(self.client, found.name)
            else:
                self._ignored.add(found.name)
            return
        info = await self._with_kv_listener(found.proxy, plan.role, found.info)
        handle = ActorHandle(found.name, found.deployment, found.proxy, info, role=plan.role)
        await handle.connect()
        self.served.add(plan.model_name, handle, found.future)
        details = {"worker": handle.worker, "deployment": found.deployment}
        self._record(found.name, "starting", details)
        self._record(found.name, "ready", {**details, "stream_address": info.stream_address})
        log.info("serving engine actor %s on %s (%s)", found.name, handle.worker, self.role.value)

    def readiness(self) -> list[DeploymentReadiness]:
        """Each deployment's wanted replicas against its engine actors that serve now."""
        ready = Counter(h.deployment for h in self.served.handles.values() if not h.broken)
        return deployment_readiness({d.name: d.replicas for d in self.deployments}, ready)

    async def refresh_stats(self) -> None:
        for handle in list(self.served.handles.values()):
            if not handle.broken:
                stats = await handle.refresh_stats()
                self.service.metrics.observe_actor(handle.name, stats)

    async def _stop_handle(self, handle: ActorHandle) -> None:
        await handle.close()
        if not handle.broken:
            await stop_quietly(handle.proxy)

    async def stop(self) -> None:
        """Stops serving. The last control plane stops its actors; a follower, or a
        leader that handed over to one, leaves them running for the others."""
        for task in (self._reconciler, self._lease_task):
            if task is not None:
                task.cancel()
        if self.health is not None:
            self.health.stop()
        keep_actors = self.lease is not None and await self.lease.hand_over()
        for name in list(self.served.handles):
            handle = self.served.remove(name)
            if keep_actors:
                await handle.close()
                self.served.release(name)
            else:  # the last control plane: the actors go with it
                await self._stop_handle(handle)
                await actor_adoption.withdraw(self.client, name)
                self.served.release(name)
        if self.client is not None:
            await self.client.close()  # type: ignore[no-untyped-call]
        if self.cluster is not None:
            closing = self.cluster.close()
            if closing is not None:
                await closing
