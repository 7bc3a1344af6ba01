"""The Repository on SQLite and PostgreSQL: exact records, events, errors and cascades."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.dialects import sqlite

from dynask.control_plane.state.deployment import DeploymentSpec
from dynask.control_plane.state.models import UTCDateTime
from dynask.control_plane.state.repository import (
    ActorId,
    ActorNotFoundError,
    DeploymentExistsError,
    DeploymentNotFoundError,
    DeploymentRejectedError,
    Repository,
)


def _kinds(repo: Repository) -> list[tuple[str, str, str]]:
    """(who, kind, subject) of every event, oldest first."""
    return [(e.who, e.kind, e.subject) for e in reversed(repo.recent_events(limit=1000))]


# -- DeploymentSpec validation (no database) ---------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "Bad_Name"}, "Deployment 'name' has value 'Bad_Name'; expected 1-63"),
        ({"name": ""}, "Deployment 'name' has value ''; expected 1-63"),
        ({"name": "-lead"}, "Deployment 'name' has value '-lead'; expected 1-63"),
        ({"name": "a" * 64}, f"Deployment 'name' has value '{'a' * 64}'; expected 1-63"),
        ({"model": ""}, "Deployment 'model' has value ''; expected a folder, .gguf file"),
        (
            {"engine": "tgi"},
            "Deployment 'engine' has value 'tgi'; expected one of torch, vllm, mocker, "
            "echo, python, openai",
        ),
        (
            {"role": "both"},
            "Deployment 'role' has value 'both'; expected one of aggregated, prefill, decode",
        ),
        ({"replicas": -1}, "Deployment 'replicas' has value -1; expected an integer >= 0"),
        ({"replicas": 1.5}, "Deployment 'replicas' has value 1.5; expected an integer >= 0"),
        ({"replicas": True}, "Deployment 'replicas' has value True; expected an integer >= 0"),
        (
            {"engine_args": {1: "x"}},
            "Deployment 'engine_args' has value {1: 'x'}; expected a JSON object",
        ),
        (
            {"engine_args": {"x": object}},
            "Deployment 'engine_args' has value {'x': <class 'object'>}; expected a JSON",
        ),
    ],
)
def test_spec_rejects_bad_values(changes: dict[str, Any], message: str) -> None:
    values: dict[str, Any] = {"name": "smollm", "model": "HuggingFaceTB/SmolLM2-135M"} | changes
    with pytest.raises(ValueError) as raised:
        DeploymentSpec(**values)
    assert str(raised.value).startswith(message)


def test_spec_accepts_a_63_character_name_and_has_defaults() -> None:
    spec = DeploymentSpec(name="a" + "-b" * 31, model="m.gguf")
    assert (spec.engine, spec.role, spec.replicas, dict(spec.engine_args)) == (
        "torch",
        "aggregated",
        1,
        {},
    )


def test_naive_timestamps_are_refused() -> None:
    with pytest.raises(ValueError, match="expected a timezone-aware one"):
        UTCDateTime().process_bind_param(datetime(2025, 1, 1), sqlite.dialect())


# -- deployments ---------------------------------------------------------------------------


def test_create_deployment_returns_the_stored_record(repo: Repository) -> None:
    spec = DeploymentSpec("smollm", "smol.gguf", "mocker", "prefill", 2, {"block_size": 16})
    created = repo.create_deployment(spec, who="admin")
    assert (created.name, created.model, created.engine, created.role) == (
        "smollm",
        "smol.gguf",
        "mocker",
        "prefill",
    )
    assert (created.replicas, created.engine_args) == (2, {"block_size": 16})
    assert created.created_at == created.updated_at
    assert created.created_at.tzinfo is UTC
    assert repo.get_deployment("smollm") == created


def test_create_deployment_logs_an_event(repo: Repository) -> None:
    repo.create_deployment(DeploymentSpec("smollm", "smol.gguf"), who="cli")
    [event] = repo.recent_events()
    assert (event.who, event.kind, event.subject) == ("cli", "deployment.created", "smollm")
    assert event.details == {
        "name": "smollm",
        "model": "smol.gguf",
        "engine": "torch",
        "role": "aggregated",
        "replicas": 1,
        "engine_args": {},
        "served_model_name": None,
        "engine_file": None,
    }
    assert event.at.tzinfo is UTC


def test_duplicate_name_is_refused(repo: Repository) -> None:
    repo.create_deployment(DeploymentSpec("smollm", "a.gguf"), who="admin")
    with pytest.raises(DeploymentExistsError) as raised:
        repo.create_deployment(DeploymentSpec("smollm", "b.gguf"), who="admin")
    assert str(raised.value) == "Deployment 'smollm' already exists; pick another name or scale it"
    assert [d.model for d in repo.list_deployments()] == ["a.gguf"]
    assert _kinds(repo) == [("admin", "deployment.created", "smollm")]


def test_a_row_the_database_refuses_is_not_called_a_duplicate(repo: Repository) -> None:
    spec = DeploymentSpec("odd", "m.gguf")
    object.__setattr__(spec, "engine", "no-such-engine")  # past the spec's own check

    with pytest.raises(DeploymentRejectedError) as caught:
        repo.create_deployment(spec, who="admin")

    message = str(caught.value)  # the database's own words, first line
    assert message.startswith("the database refused deployment 'odd': ") and "\n" not in message
    assert "engine_known" in message
    assert repo.get_deployment("odd") is None


def test_an_out_openai_deployment_keeps_its_url(repo: Repository) -> None:
    # Regression: the schema's engine check predated out=openai, and the refused insert
    # surfaced as "Deployment 'default' already exists" from `dynask run out=openai:URL`.
    spec = DeploymentSpec("remote", engine="openai", engine_file="http://gpu-1:8000/v1")
    repo.create_deployment(spec, who="admin")
    stored = repo.get_deployment("remote")
    assert stored is not None
    assert (stored.engine, stored.engine_file) == ("openai", "http://gpu-1:8000/v1")


def test_unknown_deployment_is_none(repo: Repository) -> None:
    assert repo.get_deployment("nope") is None
    assert repo.list_deployments() == []


def test_list_deployments_is_by_name(repo: Repository) -> None:
    for name in ("zeta", "alpha", "mid"):
        repo.create_deployment(DeploymentSpec(name, "m.gguf"), who="admin")
    assert [d.name for d in repo.list_deployments()] == ["alpha", "mid", "zeta"]


def test_scale_deployment(repo: Repository) -> None:
    created = repo.create_deployment(DeploymentSpec("smollm", "m.gguf"), who="admin")
    scaled = repo.scale_deployment("smollm", 3, who="planner")
    assert scaled.replicas == 3
    assert scaled.created_at == created.created_at
    assert scaled.updated_at >= created.updated_at
    assert repo.get_deployment("smollm") == scaled
    [event, _] = repo.recent_events()
    assert (event.who, event.kind, event.details) == (
        "planner",
        "deployment.scaled",
        {"from": 1, "to": 3},
    )


def test_scale_checks_its_input(repo: Repository) -> None:
    repo.create_deployment(DeploymentSpec("smollm", "m.gguf"), who="admin")
    with pytest.raises(ValueError, match=r"^Deployment 'replicas' has value -2; expected an"):
        repo.scale_deployment("smollm", -2, who="admin")
    with pytest.raises(DeploymentNotFoundError) as raised:
        repo.scale_deployment("nope", 1, who="admin")
    assert str(raised.value) == "Deployment 'nope' does not exist"
    assert repo.get_deployment("smollm").replicas == 1  # type: ignore[union-attr]
    assert len(repo.recent_events()) == 1


def test_update_engine_args_replaces_them(repo: Repository) -> None:
    spec = DeploymentSpec("smollm", "m.gguf", engine_args={"a": 1, "b": 2})
    repo.create_deployment(spec, who="admin")
    updated = repo.update_engine_args("smollm", {"max_num_seqs": 8}, who="admin")
    assert updated.engine_args == {"max_num_seqs": 8}
    assert repo.get_deployment("smollm") == updated
    [event, _] = repo.recent_events()
    assert (event.kind, event.details) == (
        "deployment.updated",
        {"engine_args": {"max_num_seqs": 8}},
    )
    with pytest.raises(ValueError, match="'engine_args' has value"):
        repo.update_engine_args("smollm", ["not", "a", "dict"], who="admin")  # type: ignore[arg-type]
    with pytest.raises(DeploymentNotFoundError, match="Deployment 'nope' does not exist"):
        repo.update_engine_args("nope", {}, who="admin")


def test_delete_deployment_cascades_to_its_actors(repo: Repository) -> None:
    repo.create_deployment(DeploymentSpec("gone", "m.gguf"), who="admin")
    repo.create_deployment(DeploymentSpec("kept", "m.gguf"), who="admin")
    repo.add_actor("gone", "tcp://10.0.0.5:40123")
    repo.add_actor("gone", "tcp://10.0.0.6:40123")
    kept = repo.add_actor("kept", "tcp://10.0.0.5:40123")
    repo.delete_deployment("gone", who="cli")
    assert [d.name for d in repo.list_deployments()] == ["kept"]
    assert repo.list_actors() == [kept]
    assert repo.list_actors("gone") == []
    assert _kinds(repo)[-1] == ("cli", "deployment.deleted", "gone")
    with pytest.raises(DeploymentNotFoundError) as raised:
        repo.delete_deployment("gone", who="cli")
    assert str(raised.value) == "Deployment 'gone' does not exist"


# -- actor instances -----------------------------------------------------------------------


def test_add_actor_records_placement(repo: Repository) -> None:
    repo.create_deployment(DeploymentSpec("smollm", "m.gguf"), who="admin")
    actor = repo.add_actor("smollm", "tcp://10.0.0.5:40123")
    assert (actor.deployment_name, actor.worker_address, actor.status) == (
        "smollm",
        "tcp://10.0.0.5:40123",
        "starting",
    )
    assert (actor.stream_address, actor.error) == (None, None)
    assert actor.created_at == actor.updated_at
    assert repo.list_actors("smollm") == [actor]
    with pytest.raises(DeploymentNotFoundError, match="Deployment 'nope' does not exist"):
        repo.add_actor("nope", "tcp://10.0.0.5:40123")
    with pytest.raises(ValueError, match="Actor 'status' has value 'busy'; expected one of"):
        repo.add_actor("smollm", "tcp://10.0.0.5:40123", status="busy")


def test_stale_actor_rows_are_closed_on_start(repo: Repository) -> None:
    repo.create_deployment(DeploymentSpec("smollm", "m.gguf"), who="admin")
    starting = repo.add_actor("smollm", "tcp://10.0.0.5:1")
    ready = repo.add_actor("smollm", "tcp://10.0.0.5:2", status="ready")
    stopped = repo.add_actor("smollm", "tcp://10.0.0.5:3", status="stopped")

    assert repo.close_stale_actors("cli", "left by a killed control plane") == 2
    assert repo.close_stale_actors("cli", "again") == 0

    rows = {a.id: (a.status, a.error) for a in repo.list_actors()}
    assert rows == {
        starting.id: ("lost", "left by a killed control plane"),
        ready.id: ("lost", "left by a killed control plane"),
        stopped.id: ("stopped", None),
    }
    [event] = repo.recent_events(1)
    assert (event.kind, event.details) == (
        "actor.stale_closed",
        {"actors": 2, "reason": "left by a killed control plane"},
    )


def test_update_actor_changes_only_the_given_fields(repo: Repository) -> None:
    repo.create_deployment(DeploymentSpec("smollm", "m.gguf"), who="admin")
    actor = repo.add_actor("smollm", "tcp://10.0.0.5:40123")
    ready = repo.update_actor(actor.id, status="ready", stream_address="10.0.0.5:7001")
    assert (ready.status, ready.stream_address, ready.error) == ("ready", "10.0.0.5:7001", None)
    lost = repo.update_actor(actor.id, status="lost", error="worker died")
    assert (lost.status, lost.stream_address, lost.error) == (
        "lost",
        "10.0.0.5:7001",
        "worker died",
    )
    cleared = repo.update_actor(actor.id, stream_address=None, error=None)
    assert (cleared.status, cleared.stream_address, cleared.error) == ("lost", None, None)
    assert cleared.created_at == actor.created_at
    assert repo.list_actors() == [cleared]


def test_update_actor_checks_its_input(repo: Repository) -> None:
    repo.create_deployment(DeploymentSpec("smollm", "m.gguf"), who="admin")
    actor = repo.add_actor("smollm", "tcp://10.0.0.5:40123")
    with pytest.raises(ValueError, match="Actor 'status' has value 'dead'; expected one of"):
        repo.update_actor(actor.id, status="dead")
    with pytest.raises(ActorNotFoundError) as raised:
        repo.update_actor(ActorId(actor.id + 100), status="ready")
    assert str(raised.value) == f"Actor instance {actor.id + 100} is not known"
    assert repo.list_actors() == [actor]


def test_list_actors_filters_and_keeps_creation_order(repo: Repository) -> None:
    for name in ("b", "a"):
        repo.create_deployment(DeploymentSpec(name, "m.gguf"), who="admin")
    placed = [("b", "tcp://w1:1"), ("a", "tcp://w2:1"), ("b", "tcp://w3:1")]
    for deployment, worker in placed:
        repo.add_actor(deployment, worker)
    assert [(a.deployment_name, a.worker_address) for a in repo.list_actors()] == placed
    assert [a.worker_address for a in repo.list_actors("b")] == ["tcp://w1:1", "tcp://w3:1"]
    assert repo.list_actors("nope") == []


# -- events --------------------------------------------------------------------------------


def test_log_event_returns_the_stored_event(repo: Repository) -> None:
    event = repo.log_event("reconciler", "actor.lost", "smollm", {"actor": 3})
    assert (event.who, event.kind, event.subject, event.details) == (
        "reconciler",
        "actor.lost",
        "smollm",
        {"actor": 3},
    )
    assert repo.recent_events() == [event]


def test_recent_events_are_newest_first_and_limited(repo: Repository) -> None:
    for number in range(5):
        repo.log_event("cli", f"test.{number}", "x", {})
    assert [e.kind for e in repo.recent_events(limit=3)] == ["test.4", "test.3", "test.2"]
    assert len(repo.recent_events()) == 5
