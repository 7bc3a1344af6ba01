"""Several ``dynask run in=http out=dyn://POOL`` front ends serve one pool.

A real ``dask scheduler``, one pool node (``in=dyn://chat out=echo``), front ends with
databases of their own (as on different hosts: the lease is on the scheduler). A
follower's exit and then the leader's exit each leave the engine actor running, served
by the front end that remains.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.control_plane import server_process as sp
from tests.control_plane.dask_processes import DaskProcesses

pytestmark = pytest.mark.slow

DYNASK = str(sp.BIN / "dynask")


class FrontEnd:
    def __init__(self, folder: Path, scheduler: str) -> None:
        folder.mkdir()
        port = sp.free_port()
        self.log = folder / "front.log"
        argv = [DYNASK, "run", "in=http", "out=dyn://chat", "--scheduler", scheduler]
        argv += ["--port", str(port), "--database-url", f"sqlite:///{folder / 'state.db'}"]
        self.proc = sp.start(argv, self.log)
        self.base = f"http://127.0.0.1:{port}"

    def wait_healthy(self) -> FrontEnd:
        sp.wait_healthy(self.base, self.proc, self.log)
        return self

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.base}/health", timeout=10).json()
        return body

    def role(self) -> str:
        return str(self.health()["control_plane"]["role"])

    def engine_names(self) -> list[str]:
        return [str(e["name"]) for e in self.health()["engines"]]

    def answers(self, text: str) -> bool:
        client = openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": text}]
        )
        return text in (reply.choices[0].message.content or "")


@pytest.fixture
def node(tmp_path: Path, tokenizer_folder: Path) -> Iterator[str]:
    cluster = DaskProcesses(tmp_path)
    scheduler = cluster.start_scheduler()
    argv = [DYNASK, "run", "in=dyn://chat", "out=echo", str(tokenizer_folder)]  # echo: no weights
    argv += ["--model-name", "chat"]
    proc = sp.start([*argv, "--scheduler", scheduler], tmp_path / "node.log")
    try:
        sp.wait_for_log(tmp_path / "node.log", b"this node joined pool 'chat'", proc)
        yield scheduler
    finally:
        sp.stop(proc)
        cluster.stop_all()


def test_a_followers_exit_and_the_leaders_exit_leave_the_pool_served(
    node: str, tmp_path: Path
) -> None:
    first = FrontEnd(tmp_path / "first", node).wait_healthy()
    fronts = [first]
    try:
        [engine] = first.engine_names()
        # Both followers start together (two process starts overlap: the suite's time).
        second, third = FrontEnd(tmp_path / "second", node), FrontEnd(tmp_path / "third", node)
        fronts += [second.wait_healthy(), third.wait_healthy()]
        assert (first.role(), second.role(), third.role()) == ("leader", "follower", "follower")
        assert second.engine_names() == [engine]  # the same actor, not a new one
        assert second.answers("hello from the second")

        sp.stop(second.proc)  # a follower's normal exit
        assert first.engine_names() == [engine] and first.answers("still the first")
        assert third.role() == "follower"
        sp.stop(first.proc)  # the leader's normal exit: it hands over
        assert third.role() == "leader"  # at once: no lease to wait out
        assert third.engine_names() == [engine] and third.answers("served by the third")
    finally:
        for front in fronts:
            sp.stop(front.proc)
