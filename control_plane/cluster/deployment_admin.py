"""Changing deployments while serving: store the change, then let the reconciler act.

Design decisions:
- The database is the desired state: every change is written first (with its event,
  who/what/when, in the same transaction by ``Repository``), then the runtime's desired
  state is reloaded from it, and a reconcile runs in the background (starting an actor
  loads a model; no request waits for that).
- A deployment is checked before it is stored, beyond ``DeploymentSpec``'s own checks:
  the model must exist when it is a path, on this host or on a worker
  (``actors.models.model_check``), and the engine arguments must be known to the engine,
  of the right type and in range. ``DeploymentInvalidError`` names the field.
- Status merges the runtime's live actors with the actor rows the recorder wrote since
  this control plane started (older rows describe processes that are gone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dynask.actors.models.model_check import model_problem
from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.cluster.state_sync import stored_deployments
from dynask.control_plane.state.deployment import BUNDLED_MODEL, DeploymentSpec
from dynask.control_plane.state.models import utcnow
from dynask.control_plane.state.repository import ActorInstance, Deployment, Repository

log = logging.getLogger(__name__)

DEPLOYABLE_ENGINES = ("torch", "vllm", "mocker", "echo", "openai")
# out=openai's engine arguments that the admin form asks for in fields of their own.
OPENAI_ARG_FIELDS = ("kv_events_endpoint", "api_key_env")
WORKER_CHECK_TIMEOUT_S = 15.0  # asking every worker whether it has a model path


class DeploymentInvalidError(ValueError):
    """A deployment that cannot run; ``field`` names the form field at fault."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


def check_model(model: str) -> None:
    """Raises DeploymentInvalidError unless ``model`` is empty (the bundled model), an
    HF folder or ``.gguf`` file on this host, or a hub id ``org/name``."""
    problem = _problem_here(model)
    if problem is not None:
        raise DeploymentInvalidError("model", problem)


def _problem_here(model: str) -> str | None:
    return None if model == BUNDLED_MODEL else model_problem(model)


def check_engine_args(
    engine: str, model: str, engine_args: Mapping[str, Any], url: str | None = None
) -> None:
    """Raises DeploymentInvalidError unless ``engine`` takes ``engine_args`` (and, for
    ``openai``, the server's ``url``; only it takes one)."""
    if engine not in DEPLOYABLE_ENGINES:
        raise DeploymentInvalidError(
            "engine", f"engine '{engine}' is not one of {', '.join(DEPLOYABLE_ENGINES)}"
        )
    if engine == "openai" or url is not None:
        try:  # the URL alone first: what is wrong with it belongs beside its field
            EngineSpec(kind=engine, url=url)
        except ValueError as exc:
            raise DeploymentInvalidError("url", str(exc)) from exc
    try:  # the spec checks names, types and, where cheap, value ranges
        EngineSpec(kind=engine, model=model or None, engine_args=dict(engine_args), url=url)
    except (ValueError, TypeError) as exc:
        named = [n for n in OPENAI_ARG_FIELDS if engine == "openai" and f"'{n}'" in str(exc)]
        raise DeploymentInvalidError(named[0] if named else "engine_args", str(exc)) from exc


@dataclass(frozen=True)
class DeploymentStatus:
    """A deployment and how far the cluster is from it."""

    deployment: Deployment
    state: str  # ready | starting | waiting | failed | degraded | stopped
    detail: str
    ready_actors: list[str] = field(default_factory=list)


class DeploymentAdmin:
    """Creates, scales and deletes deployments on the database and the running cluster."""

    def __init__(self, repo: Repository, runtime: ClusterRuntime) -> None:
        self.repo = repo
        self.runtime = runtime
        self.started_at = utcnow()
        self._background: set[asyncio.Task[None]] = set()

    async def create(self, spec: DeploymentSpec, who: str) -> Deployment:
        await self.check_model_on_cluster(spec.model)
        check_engine_args(spec.engine, spec.model, spec.engine_args, spec.engine_file)
        created = await asyncio.to_thread(self.repo.create_deployment, spec, who)
        await self.apply()
        return created

    async def check_model_on_cluster(self, model: str) -> None:
        """``check_model``, but a path missing here is asked of every worker (where the
        engine will read it): one that has it is enough."""
        problem = _problem_here(model)
        client = self.runtime.client
        if problem is None:
            return
        if client is None:  # not started yet: this host is all there is to ask
            raise DeploymentInvalidError("model", problem)
        try:
            answers: dict[str, str | None] = await asyncio.wait_for(
                client.run(model_problem, model), WORKER_CHECK_TIMEOUT_S
            )
        except Exception as exc:  # a worker that cannot answer: refuse, saying why
            raise DeploymentInvalidError(
                "model", f"{problem} on this host, and the workers could not be asked: {exc!r}"
            ) from exc
        if any(answer is None for answer in answers.values()):
            return
        raise DeploymentInvalidError("model", _nowhere(problem, answers))

    async def scale(self, name: str, replicas: int, who: str) -> Deployment:
        scaled = await asyncio.to_thread(self.repo.scale_deployment, name, replicas, who)
        await self.apply()
        return scaled

    async def delete(self, name: str, who: str) -> None:
        await asyncio.to_thread(self.repo.delete_deployment, name, who)
        await self.apply()

    async def apply(self) -> None:
        """Makes the runtime's desired state the database's, and reconciles soon."""
        self.runtime.set_deployments(await asyncio.to_thread(stored_deployments, self.repo))
        if self.runtime.client is None:
            return  # still starting: ``start`` reconciles the new desired state
        task = asyncio.create_task(self.runtime.reconcile(), name="reconcile-after-change")
        self._background.add(task)
        task.add_done_callback(self._reconciled)

    def _reconciled(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("reconcile after a deployment change failed: %s", task.exception())

    async def statuses(self) -> list[DeploymentStatus]:
        deployments, rows = await asyncio.to_thread(self._stored)
        ready: dict[str, list[str]] = {}
        for handle in self.runtime.service.ready_actors():
            ready.setdefault(handle.deployment, []).append(handle.name)
        return [
            _status(d, sorted(ready.get(d.name, [])), rows.get(d.name, [])) for d in deployments
        ]

    def _stored(self) -> tuple[list[Deployment], dict[str, list[ActorInstance]]]:
        rows: dict[str, list[ActorInstance]] = {}
        for actor in self.repo.list_actors():
            if actor.updated_at >= self.started_at:
                rows.setdefault(actor.deployment_name, []).append(actor)
        return self.repo.list_deployments(), rows


def _nowhere(problem: str, answers: dict[str, str | None]) -> str:
    """The message for a model path no host can load: this host's problem, and the
    workers' where they differ from it."""
    if not answers:
        return f"{problem} (on this host; the cluster has no worker to ask)"
    others = sorted({(answer, worker) for worker, answer in answers.items() if answer != problem})
    if not others:
        workers = "its worker" if len(answers) == 1 else f"all {len(answers)} workers"
        return f"{problem} (on this host and on {workers})"
    return f"{problem} on this host; " + "; ".join(f"on {w}: {a}" for a, w in others[:3])


def _status(
    deployment: Deployment, ready: list[str], rows: list[ActorInstance]
) -> DeploymentStatus:
    wanted = deployment.replicas
    if wanted == 0:
        return DeploymentStatus(deployment, "stopped", "scaled to 0 replicas", ready)
    if len(ready) >= wanted:
        return DeploymentStatus(deployment, "ready", f"{len(ready)}/{wanted} ready", ready)
    latest = rows[-1] if rows else None
    if latest is not None and latest.status == "failed":
        return DeploymentStatus(deployment, "failed", latest.error or "the actor failed", ready)
    if latest is not None and latest.status == "starting":
        return DeploymentStatus(
            deployment, "starting", f"{len(ready)}/{wanted} ready; loading on a worker", ready
        )
    state = "degraded" if ready else "waiting"
    return DeploymentStatus(
        deployment, state, f"{len(ready)}/{wanted} ready; waiting for a free worker", ready
    )
