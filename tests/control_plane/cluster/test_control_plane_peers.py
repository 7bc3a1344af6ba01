"""Two ``dynask serve`` processes in front of the same engine actors, one ``kill -9``ed.

A real ``dask scheduler`` and ``dask worker`` processes with mocker engines, two control
planes on the same scheduler and database (the follower serves the leader's actors, the
one started after it joined too), the ``openai`` client with a list of both
(a request that meets a connection error is retried on the other). The leader is killed
while 24 streams run on both: every request is answered, the actors free what the dead
one's streams held, the survivor becomes the leader within the lease's bound, closes the
dead one's actor rows and replaces an actor lost afterwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from dynask.control_plane.server import STALE_ACTOR_REASON
from dynask.control_plane.state.database import make_engine
from dynask.control_plane.state.repository import ActorInstance, Repository
from tests.control_plane import server_process as sp
from tests.control_plane.dask_processes import DaskProcesses

pytestmark = pytest.mark.slow

STREAMS = 24
MAX_TOKENS = 64
DEPLOY = (
    "deployments:\n"
    "  - name: mock\n"
    "    engine: mocker\n"
    "    model: {tokenizer}\n"  # the mocker only reads its tokenizer
    "    replicas: 2\n"
    "    engine_args: {{decode_ms_base: 40.0}}\n"  # 64 tokens: ~2.6 s a stream
)


class ControlPlane:
    def __init__(self, cluster: DaskProcesses, folder: Path, db: str, name: str) -> None:
        port = sp.free_port()
        self.log = folder / f"{name}.log"
        argv = [str(sp.BIN / "dynask"), "serve", "--scheduler", cluster.address]
        argv += ["--port", str(port), "--database-url", db, "--no-require-api-key"]
        argv += ["-f", str(folder / "deploy.yaml")]
        self.proc = sp.start(argv, self.log)
        self.base = f"http://127.0.0.1:{port}"
        sp.wait_healthy(self.base, self.proc, self.log)

    def role(self) -> str:
        health = httpx.get(f"{self.base}/health", timeout=10).json()
        return str(health["control_plane"]["role"])

    def engines(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = httpx.get(f"{self.base}/v1/engines", timeout=30).json()
        return data

    def engines_become(self, count: int) -> list[dict[str, Any]]:
        return _until(lambda: self._engines_if(count), f"{count} engines on {self.base}")

    def _engines_if(self, count: int) -> list[dict[str, Any]] | None:
        engines = self.engines()
        return engines if len(engines) == count else None


def _until(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.25)
    raise TimeoutError(f"not {what} after {timeout}s")


async def _answered(bases: list[str], index: int, retries: list[int]) -> int:
    """One streamed request, first on ``bases[index % 2]``; on a connection error it is
    retried from the start on the other (as a client list does). Its token count."""
    for attempt in range(4):
        base = bases[(index + attempt) % len(bases)]
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        try:
            async with client:
                stream = await client.completions.create(
                    model="mock",
                    prompt=f"request {index}: tell me about control planes",
                    max_tokens=MAX_TOKENS,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                )
                usage = 0
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage.completion_tokens
                return usage
        except (openai.APIConnectionError, httpx.HTTPError):
            retries.append(index)
    raise RuntimeError(f"request {index} was answered by neither control plane")


async def _load_and_kill(bases: list[str], kill: Callable[[], None]) -> tuple[list[int], list[int]]:
    retries: list[int] = []
    requests = [asyncio.create_task(_answered(bases, i, retries)) for i in range(STREAMS)]
    await asyncio.sleep(1.0)  # every stream is decoding on the actors
    await asyncio.to_thread(kill)
    return list(await asyncio.gather(*requests)), retries


def _rows(db: str) -> list[ActorInstance]:
    engine = make_engine(db)
    try:
        return Repository(engine).list_actors()
    finally:
        engine.dispose()


def _idle(engines: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    return engines if all(e["stats"]["kv_usage"] == 0.0 for e in engines) else None


def _two_ready(rows: list[ActorInstance]) -> list[ActorInstance] | None:
    return rows if sum(r.status == "ready" for r in rows) == 2 else None


def test_kill_9_of_the_leading_control_plane_loses_nothing(
    dask_cluster: DaskProcesses, tmp_path: Path, tokenizer_folder: Path
) -> None:
    (tmp_path / "deploy.yaml").write_text(DEPLOY.format(tokenizer=tokenizer_folder))
    db = f"sqlite:///{tmp_path / 'state.db'}"
    w1 = dask_cluster.start_worker("w1")
    a = ControlPlane(dask_cluster, tmp_path, db, "a")
    [only] = a.engines_become(1)  # one worker yet: one of the two replicas
    b = ControlPlane(dask_cluster, tmp_path, db, "b")
    try:
        # b follows: it serves the actor a started, and stole none ...
        assert [e["name"] for e in b.engines_become(1)] == [only["name"]]
        assert (a.role(), b.role()) == ("leader", "follower")
        # ... and the one a starts once a worker joins.
        dask_cluster.start_worker("w2")
        first = a.engines_become(2)
        assert {e["name"] for e in b.engines_become(2)} == {e["name"] for e in first}
        rows_of_a = [r for r in _rows(db) if r.status == "ready"]
        assert len(rows_of_a) == 2

        def kill_a() -> None:
            a.proc.kill()  # kill -9 of the leader, mid-stream
            a.proc.wait(timeout=30)

        killed_at = time.monotonic()
        counts, retries = asyncio.run(_load_and_kill([a.base, b.base], kill_a))

        assert counts == [MAX_TOKENS] * STREAMS  # every request answered, in full
        assert retries  # some were a's and were retried on b
        _until(lambda: b.role() == "leader", "b leading", timeout=30)
        assert time.monotonic() - killed_at < 30
        # The actors aborted the dead reader's requests: no block is held by any.
        idle = _until(lambda: _idle(b.engines()), "the KV blocks freed")
        assert [e["stats"]["num_running"] for e in idle] == [0, 0]
        # a's rows were closed as stale; the ready rows are b's, for the same actors.
        rows = _until(lambda: _two_ready(_rows(db)), "b's rows")
        old = {r.id: r for r in rows if r.id in {x.id for x in rows_of_a}}
        assert {(r.status, r.error) for r in old.values()} == {("lost", STALE_ACTOR_REASON)}
        ready = sorted(r.worker_address for r in rows if r.status == "ready")
        assert ready == sorted(e["worker"] for e in first)

        # b reconciles now: a worker lost afterwards gets its actor replaced on a new one.
        w3 = dask_cluster.start_worker("w3")
        dask_cluster.kill(w1)
        _until(
            lambda: (
                {e["worker"] for e in b.engines()} == {w3, *(e["worker"] for e in first)} - {w1}
            ),
            "the lost actor replaced on w3",
            timeout=120,
        )
    finally:
        for plane in (a, b):
            sp.stop(plane.proc)
