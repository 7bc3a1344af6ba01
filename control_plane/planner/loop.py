"""The planner's loop: observe the deployments, decide (``planner.decide``), scale.

Design decisions:
- It scales through ``DeploymentAdmin.scale``, the path the admin UI takes: the database
  holds the new replica count (with a ``deployment.scaled`` event by ``planner``) and
  the reconciler starts or stops the actors. The planner never touches actors itself.
- Every change is logged as a ``planner.scaled`` event with its reason (``planner.
  would_scale`` in dry-run mode, which changes nothing); a decision to hold is logged
  when its kind changes (starting / settling / keep), not on every round.
- Embedded mode (a ``LocalCluster``): when the planned replicas outnumber the workers,
  the cluster grows (never past the budget). It never shrinks: a retired worker could
  be one that holds an actor; idle workers cost nothing but their memory on a CPU host.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from dynask.control_plane.cluster.deployment_admin import DeploymentAdmin
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.planner.decision import (
    DeploymentLoad,
    PlanDecision,
    PlannerConfig,
    decide,
)
from dynask.control_plane.state.repository import Repository

log = logging.getLogger(__name__)

WHO = "planner"


class PlannerLoop:
    """Runs ``decide`` every ``config.interval_s`` on the runtime's deployments."""

    def __init__(
        self,
        config: PlannerConfig,
        runtime: ClusterRuntime,
        repo: Repository,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.repo = repo
        self.admin = DeploymentAdmin(repo, runtime)
        self.clock = clock
        self.started_at = clock()
        self.decisions: list[PlanDecision] = []  # newest last, the last 100
        self._changed = False  # a change is waiting to settle (all its actors ready)
        self._settled_at: float | None = None
        self._last_hold_kind = ""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run_forever(), name="planner")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            if not self.runtime.is_leader:  # the leading control plane plans (leadership)
                continue
            try:
                await self.step()
            except Exception:
                log.exception("planner round failed; next in %.0fs", self.config.interval_s)

    async def step(self) -> PlanDecision:
        """One round: refresh the actors' stats, observe, decide, apply."""
        try:
            await self.runtime.refresh_stats()
        except Exception as exc:  # a lost actor: the reconciler replaces it
            log.debug("planner: stats refresh failed: %s", exc)
        loads = self.observe()
        decision = decide(self.config, loads, self._settled_for(loads))
        self.decisions = [*self.decisions[-99:], decision]
        await self._apply(decision, {d.name: d.replicas for d in loads})
        return decision

    def observe(self) -> list[DeploymentLoad]:
        """Each deployment's desired and ready replicas, KV usage and its model's recent
        requests (the window before too, once the planner has run that long)."""
        window = self.runtime.service.metrics.latency_window
        w = self.config.window_s
        ready: dict[str, list[float]] = {}
        for handle in self.runtime.service.ready_actors():
            kv_usage = handle.stats.kv_usage if handle.stats is not None else 0.0
            ready.setdefault(handle.deployment, []).append(kv_usage)
        loads = []
        for plan in self.runtime.deployments:
            summary = window.summary(plan.model_name, w)
            previous = None
            if self.clock() - self.started_at >= 2 * w:
                both = len(window.recent(plan.model_name, 2 * w))
                previous = (both - summary.requests) / w
            usage = ready.get(plan.name, [])
            loads.append(
                DeploymentLoad(
                    name=plan.name,
                    role=plan.role,
                    replicas=plan.replicas,
                    ready=len(usage),
                    latency=summary,
                    previous_rate=previous,
                    kv_usage=max(usage, default=0.0),
                )
            )
        return loads

    def _settled_for(self, loads: list[DeploymentLoad]) -> float | None:
        if not self._changed:
            return None
        if self._settled_at is None:
            if any(d.ready < d.replicas for d in loads):
                return 0.0
            self._settled_at = self.clock()
        return self.clock() - self._settled_at

    async def _apply(self, decision: PlanDecision, current: dict[str, int]) -> None:
        if not decision.replicas:
            await self._log_hold(decision.hold)
            return
        self._last_hold_kind = ""
        kind = "planner.would_scale" if self.config.dry_run else "planner.scaled"
        for name, replicas in decision.replicas.items():
            details = {"from": current[name], "to": replicas, "reason": decision.reasons[name]}
            await asyncio.to_thread(self.repo.log_event, WHO, kind, name, details)
            log.info("%s %s: %s", kind, name, decision.reasons[name])
            if not self.config.dry_run:
                await self.admin.scale(name, replicas, WHO)
        if not self.config.dry_run:
            self._changed, self._settled_at = True, None
            await self._grow_cluster()

    async def _log_hold(self, hold: str) -> None:
        kind = (
            "starting"
            if hold.startswith("waiting for actors")
            else "settling"
            if hold.startswith("waiting for")
            else "keep"
        )
        if kind == self._last_hold_kind:
            return
        self._last_hold_kind = kind
        await asyncio.to_thread(
            self.repo.log_event, WHO, "planner.hold", "planner", {"reason": hold}
        )

    async def _grow_cluster(self) -> None:
        """An embedded cluster gets a worker per planned replica, up to the budget."""
        cluster = self.runtime.cluster
        if cluster is None:
            return
        wanted = min(sum(d.replicas for d in self.runtime.deployments), self.config.max_workers)
        if wanted > len(cluster.workers):
            log.info("planner: growing the local cluster to %d workers", wanted)
            cluster.scale(wanted)  # type: ignore[no-untyped-call]
