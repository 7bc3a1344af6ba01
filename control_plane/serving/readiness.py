"""Readiness by deployment: how many replicas each deployment wants and how many serve.

``/health`` answers 200 as soon as any engine is ready (liveness for a load balancer that
only needs one). ``/ready`` and ``/health?ready=all`` answer 200 only when every
deployment has all its replicas ready, so a client or a rollout can wait for the whole
deployment before sending its first burst (which would otherwise all land on the first
actor up, and die with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DeploymentReadiness:
    """One deployment's wanted and ready replicas."""

    name: str
    replicas: int
    ready: int

    @property
    def complete(self) -> bool:
        return self.ready >= self.replicas

    def to_dict(self) -> dict[str, int | str]:
        return {"name": self.name, "replicas": self.replicas, "ready": self.ready}


def deployment_readiness(
    wanted: Mapping[str, int], ready_actors: Mapping[str, int]
) -> list[DeploymentReadiness]:
    """Each deployment's wanted replicas against its ready engine actors (by name)."""
    return [
        DeploymentReadiness(name, replicas, ready_actors.get(name, 0))
        for name, replicas in wanted.items()
    ]


def all_ready(readiness: list[DeploymentReadiness]) -> bool:
    """Every deployment has all its replicas (and there is at least one deployment)."""
    return bool(readiness) and all(d.complete for d in readiness)


def summary(readiness: list[DeploymentReadiness]) -> str:
    """``decode 2/2, prefill 1/1``: for the log line that says the deployment is up."""
    return ", ".join(f"{d.name} {d.ready}/{d.replicas}" for d in readiness)
