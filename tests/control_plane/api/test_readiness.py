"""Readiness by deployment: ``/ready`` and ``/health?ready=all`` wait for every replica.

The route over a real app and the real readiness objects; the numbers come from the
reconciler in a running server (``test_worker_loss.py`` checks a real cluster losing and
regaining a replica).
"""

from __future__ import annotations

from starlette.testclient import TestClient

from dynask.control_plane.api.app import build_app
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.readiness import (
    DeploymentReadiness,
    all_ready,
    deployment_readiness,
    summary,
)
from dynask.control_plane.serving.service import ServingService


def test_readiness_counts_ready_actors_against_wanted_replicas() -> None:
    readiness = deployment_readiness({"decode": 3, "prefill": 1}, {"decode": 2, "prefill": 1})

    assert readiness == [DeploymentReadiness("decode", 3, 2), DeploymentReadiness("prefill", 1, 1)]
    assert not all_ready(readiness)
    assert summary(readiness) == "decode 2/3, prefill 1/1"
    assert all_ready(deployment_readiness({"decode": 2}, {"decode": 2}))
    assert not all_ready([])  # nothing deployed is not ready


def _client(readiness: list[DeploymentReadiness]) -> TestClient:
    app = build_app(ServingService(ServingMetrics()), readiness=lambda: readiness)
    return TestClient(app)


def test_ready_is_503_until_every_replica_is_up_then_200() -> None:
    starting = _client([DeploymentReadiness("tiny", 3, 2)])
    up = _client([DeploymentReadiness("tiny", 3, 3)])

    for path in ("/ready", "/health?ready=all"):
        reply = starting.get(path)
        assert reply.status_code == 503
        assert reply.json() == {
            "status": "starting",
            "deployments": [{"name": "tiny", "replicas": 3, "ready": 2}],
        }
        assert up.get(path).status_code == 200
        assert up.get(path).json()["status"] == "ready"


def test_health_keeps_its_meaning_and_refuses_an_unknown_ready_value() -> None:
    client = _client([DeploymentReadiness("tiny", 3, 3)])

    assert client.get("/health").status_code == 503  # no engine in this service
    reply = client.get("/health?ready=some")
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "ready"
    assert "expected 'all'" in reply.json()["error"]["message"]
