"""Keeping the database and the running cluster in step.

Deployments (desired state) go into the database when ``run``/``serve`` start, and a
``serve`` without a deploy file restores them from it. Actor instances and workers
(observed state) are written as the runtime starts, loses or replaces actors; every
change lands in the event log. Only the leading control plane writes actor rows
(``leadership``), so the rows left open when it becomes the leader are a dead one's.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dynask.control_plane.state.deployment import DeploymentSpec
from dynask.control_plane.state.repository import (
    ActorId,
    ActorNotFoundError,
    Deployment,
    Repository,
)

log = logging.getLogger(__name__)


def store_deployments(repo: Repository, deployments: list[DeploymentSpec], who: str) -> None:
    """Writes ``deployments`` as the desired state; a changed deployment is replaced."""
    for wanted in deployments:
        current = repo.get_deployment(wanted.name)
        if current is not None and _same(current, wanted):
            continue
        if current is not None:
            repo.delete_deployment(wanted.name, who)
        repo.create_deployment(wanted, who)


def _same(current: Deployment, wanted: DeploymentSpec) -> bool:
    keys = ("model", "engine", "replicas", "served_model_name", "engine_file", "role")
    return all(getattr(current, k) == getattr(wanted, k) for k in keys) and (
        current.engine_args == dict(wanted.engine_args)
    )


def stored_deployments(repo: Repository) -> list[DeploymentSpec]:
    return [d.spec() for d in repo.list_deployments()]


class ActorRecorder:
    """The runtime's actor hook: mirrors actor lifecycles into the database.

    The hook is called on the control plane's event loop, which also writes every token
    stream; the database writes run in order on one thread of their own, so a slow
    database (a remote PostgreSQL) never stalls the streams.
    """

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self._ids: dict[str, ActorId] = {}
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="actor-recorder")

    def __call__(self, actor: str, status: str, details: dict[str, Any]) -> None:
        self._writer.submit(self._record_quietly, actor, status, dict(details))

    def close_stale(self, who: str, reason: str) -> None:
        """Marks the actor rows left open ``lost`` (a control plane becoming the leader:
        rows only leaders write, so these are a dead predecessor's), in order with the
        writes queued before and after."""
        self._writer.submit(self._close_stale_quietly, who, reason)

    def close(self) -> None:
        """Waits for the writes already queued."""
        self._writer.shutdown(wait=True)

    def _record_quietly(self, actor: str, status: str, details: dict[str, Any]) -> None:
        try:
            self._record(actor, status, details)
        except Exception:  # state is advisory here: serving goes on, the log says why
            log.exception("could not record actor %s as %s", actor, status)

    def _close_stale_quietly(self, who: str, reason: str) -> None:
        try:
            stale = self.repo.close_stale_actors(who, reason)
        except Exception:  # state is advisory here: serving goes on, the log says why
            log.exception("could not close the actor rows left open")
            return
        self._ids.clear()
        if stale:
            log.warning("marked %d actor rows left by a previous leader as lost", stale)

    def _record(self, actor: str, status: str, details: dict[str, Any]) -> None:
        worker = str(details.get("worker", ""))
        if status == "starting":
            instance = self.repo.add_actor(str(details["deployment"]), worker, "starting")
            self._ids[actor] = instance.id
        elif actor in self._ids:
            try:
                self.repo.update_actor(
                    self._ids[actor],
                    status=status,
                    stream_address=details.get("stream_address"),
                    error=details.get("error"),
                )
            except ActorNotFoundError:  # its deployment was deleted: the row went with it
                del self._ids[actor]
        self.repo.log_event("runtime", f"actor.{status}", actor, details)
