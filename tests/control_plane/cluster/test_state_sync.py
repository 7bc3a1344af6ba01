"""``ActorRecorder``: actor lifecycles land in the database, written off the caller's thread
(the caller is the event loop that also writes every token stream)."""

from __future__ import annotations

import threading

from dynask.control_plane.cluster.state_sync import ActorRecorder
from dynask.control_plane.state.deployment import DeploymentSpec
from dynask.control_plane.state.repository import Repository


class _ThreadNotingRepository(Repository):
    """The real repository, noting which thread each write ran on."""

    write_threads: set[int]

    def update_actor(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        self.write_threads.add(threading.get_ident())
        super().update_actor(*args, **kwargs)  # type: ignore[arg-type]


def test_lifecycle_is_recorded_in_order_off_the_callers_thread(repo: Repository) -> None:
    noting = _ThreadNotingRepository(repo.engine)
    noting.write_threads = set()
    noting.create_deployment(DeploymentSpec(name="smollm", model="m", engine="mocker"), "test")
    recorder = ActorRecorder(noting)
    details = {"deployment": "smollm", "worker": "tcp://10.0.0.1:4000", "resources": {}}
    recorder("smollm-0", "starting", details)
    recorder("smollm-0", "ready", {**details, "stream_address": "10.0.0.1:5000"})
    recorder.close()

    [actor] = noting.list_actors("smollm")
    assert (actor.status, actor.stream_address) == ("ready", "10.0.0.1:5000")
    kinds = [e.kind for e in noting.recent_events() if e.subject == "smollm-0"]
    assert sorted(kinds) == ["actor.ready", "actor.starting"]
    assert noting.write_threads and threading.get_ident() not in noting.write_threads


def test_a_new_leader_closes_the_open_rows_in_order_with_its_own(repo: Repository) -> None:
    """What ``on_lead`` does: the rows a dead leader left are closed, then the actors the
    new one serves are recorded again; later events reach the new rows, not the old."""
    repo.create_deployment(DeploymentSpec(name="smollm", model="m", engine="mocker"), "test")
    dead = ActorRecorder(repo)
    details = {"deployment": "smollm", "worker": "tcp://10.0.0.1:4000"}
    dead("smollm-0", "starting", details)
    dead("smollm-0", "ready", {**details, "stream_address": "10.0.0.1:5000"})
    dead.close()  # (killed: it writes nothing more)

    leader = ActorRecorder(repo)
    leader.close_stale("cli", "left by a dead leader")
    leader("smollm-0", "starting", details)
    leader("smollm-0", "ready", {**details, "stream_address": "10.0.0.1:5000"})
    leader("smollm-0", "lost", {"worker": details["worker"], "reason": "stream_closed"})
    leader.close()

    rows = [(a.status, a.error) for a in repo.list_actors("smollm")]
    assert rows == [("lost", "left by a dead leader"), ("lost", None)]
