"""Deployment changes while serving: checks before storing, and status from the runtime."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dynask.control_plane.cluster.deployment_admin import (
    DeploymentAdmin,
    DeploymentInvalidError,
    check_engine_args,
    check_model,
)
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.deployment import BUNDLED_MODEL, DeploymentSpec
from dynask.control_plane.state.repository import Repository


@pytest.mark.parametrize("model", ["", "bundled:SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2"])
def test_models_that_pass(model: str) -> None:
    check_model(model)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("./missing", "'./missing' is neither an existing folder or .gguf file nor a hub id"),
        ("a/b/c", "'a/b/c' is neither"),
        ("model.gguf", "'model.gguf' is neither"),
    ],
)
def test_models_that_fail(model: str, message: str) -> None:
    with pytest.raises(DeploymentInvalidError, match=message) as caught:
        check_model(model)
    assert caught.value.field == "model"


def test_a_file_must_be_gguf(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    (tmp_path / "small.gguf").write_bytes(b"")
    check_model(str(tmp_path / "small.gguf"))
    with pytest.raises(DeploymentInvalidError, match="is not a .gguf file"):
        check_model(str(tmp_path / "weights.bin"))


def test_engine_arguments_are_checked_by_the_engine() -> None:
    check_engine_args("echo", "", {"delay_s": 0.01})
    with pytest.raises(DeploymentInvalidError, match="'num_kv_blocks' has value 0") as caught:
        check_engine_args("mocker", "", {"num_kv_blocks": 0})
    assert caught.value.field == "engine_args"
    with pytest.raises(DeploymentInvalidError, match="engine 'python' is not one of"):
        check_engine_args("python", "", {})


def test_changes_reach_the_runtime_and_the_log(repo: Repository) -> None:
    runtime = ClusterRuntime(ServingService(ServingMetrics()), [])
    admin = DeploymentAdmin(repo, runtime)

    async def changes() -> list[str]:
        spec = DeploymentSpec(name="echo", model=BUNDLED_MODEL, engine="echo", replicas=1)
        await admin.create(spec, "ops")
        await admin.scale("echo", 3, "ops")
        [status] = await admin.statuses()
        assert (status.state, status.detail) == ("waiting", "0/3 ready; waiting for a free worker")
        assert [(p.name, p.replicas) for p in runtime.deployments] == [("echo", 3)]
        await admin.delete("echo", "ops")
        assert runtime.deployments == []
        return [e.kind for e in repo.recent_events() if e.who == "ops"]

    assert asyncio.run(changes()) == [
        "deployment.deleted",
        "deployment.scaled",
        "deployment.created",
    ]


def test_a_path_no_worker_can_load_says_what_each_found() -> None:
    from dynask.control_plane.cluster.deployment_admin import _nowhere

    missing = "'/m' is neither an existing folder"
    assert _nowhere(missing, {}) == f"{missing} (on this host; the cluster has no worker to ask)"
    assert (
        _nowhere(missing, {"tcp://a:1": missing}) == f"{missing} (on this host and on its worker)"
    )
    assert _nowhere(
        missing, {"tcp://b:2": "the folder '/m' has no config.json", "tcp://a:1": missing}
    ) == (f"{missing} on this host; on tcp://b:2: the folder '/m' has no config.json")
