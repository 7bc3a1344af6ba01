"""Nothing lost: real ``dask worker`` processes die or hang under 50 streams.

One ``dask scheduler``, three ``dask worker`` processes (no nanny, so the test kills
exactly the process it means), ``dynask serve`` with three replicas of the tiny random
Llama, requests through the official ``openai`` client. The tests run in order
on one cluster; each leaves three engines serving:

1. ``kill -9`` of the worker busiest with 50 streams: all 50 finish with exactly
   ``max_tokens`` tokens and the same text as an undisturbed run; a new worker gets a
   recreated actor.
2. The same with 30 streams at temperature 1.0 (the OpenAI default), half of them
   seeded: all 30 finish with ``max_tokens`` tokens, the seeded ones with the text of an
   undisturbed run, the unseeded ones continuing the text they had shown.
3. ``SIGSTOP`` of a busy worker: the heartbeats notice (Dask would not for 5 minutes),
   its streams move and finish; after ``SIGCONT`` its orphaned actor is stopped and a
   new one is placed there.
4. ``kill -9`` of the control plane: the restarted one (no deploy file) adopts the
   running actors instead of reloading them, and serves.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from dynask.control_plane.state.database import make_engine
from dynask.control_plane.state.repository import Repository
from tests.control_plane import server_process as sp
from tests.control_plane.dask_processes import DaskProcesses
from tests.control_plane.routing_stack import tokens

pytestmark = pytest.mark.slow

MODEL = "tiny"
MAX_TOKENS = 96
STREAMS = 50
SAMPLED_STREAMS = 30
HEARTBEAT = ["--heartbeat-interval", "0.25", "--heartbeat-timeout", "3"]


class Served:
    """The cluster and the control plane the tests share."""

    def __init__(self, cluster: DaskProcesses, folder: Path, deploy: Path) -> None:
        self.cluster = cluster
        self.folder = folder
        self.db = f"sqlite:///{folder / 'state.db'}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.base = ""
        self.log = folder / "serve.log"
        self.start(deploy)

    def start(self, deploy: Path | None = None) -> None:
        port = sp.free_port()
        log = self.folder / f"serve-{port}.log"
        argv = [str(sp.BIN / "dynask"), "serve", "--scheduler", self.cluster.address]
        argv += ["--port", str(port), "--database-url", self.db, "--no-require-api-key"]
        argv += HEARTBEAT + (["-f", str(deploy)] if deploy else [])
        self.proc = sp.start(argv, log)
        self.log = log
        self.base = f"http://127.0.0.1:{port}"
        sp.wait_healthy(self.base, self.proc, log)

    def engines(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = httpx.get(f"{self.base}/v1/engines", timeout=30).json()
        return data

    def wait_engines(self, count: int, timeout: float = 180) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            engines = self.engines()
            if len(engines) == count:
                return engines
            time.sleep(0.5)
        raise TimeoutError(f"not {count} engines after {timeout}s: {self.engines()}")

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.base}/metrics", timeout=30).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0


@pytest.fixture(scope="module")
def served(tiny_llama_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("worker-loss")
    deploy = folder / "deploy.yaml"
    deploy.write_text(
        "deployments:\n"
        f"  - name: {MODEL}\n"
        f"    model: {tiny_llama_folder}\n"
        "    replicas: 3\n"
        "    engine_args: {kv_cache_gib: 0.05}\n"
    )
    cluster = DaskProcesses(folder)
    cluster.start_scheduler()
    served = None
    try:
        for name in ("w1", "w2", "w3"):
            cluster.start_worker(name)
        served = Served(cluster, folder, deploy)
        served.wait_engines(3)
        _wait_status(f"{served.base}/ready", 200)
        _wait_log_line(served.log, f"dynask: every deployment is up ({MODEL} 3/3)")
        yield served
    finally:
        if served is not None and served.proc is not None:
            sp.stop(served.proc)
        cluster.stop_all()


PROMPTS = [tokens(seed=1000 + i, blocks=1, extra=i % 7) for i in range(STREAMS)]


async def _streams(
    base: str,
    prompts: list[list[int]],
    disturb: Callable[[], None] | None,
    sampling: list[dict[str, Any]] | None = None,
    shown_out: list[str] | None = None,
) -> Any:
    """Runs one stream per prompt (greedy, or with ``sampling[i]``); calls ``disturb`` once
    every stream has shown text; returns each stream's (text, completion tokens) and puts
    the text each had shown before the disturbance into ``shown_out``."""
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    choices = sampling or [{"temperature": 0}] * len(prompts)
    async with client:
        streams = await asyncio.gather(
            *(_open(client, p, c) for p, c in zip(prompts, choices, strict=True))
        )
        shown = await asyncio.gather(*(_first_text(s) for s in streams))
        if shown_out is not None:
            shown_out.extend("".join(text) for text in shown)
        if disturb is not None:
            await asyncio.to_thread(disturb)
        return await asyncio.gather(*(_finish(s, t) for s, t in zip(streams, shown, strict=True)))


async def _open(client: openai.AsyncOpenAI, prompt: list[int], sampling: dict[str, Any]) -> Any:
    return await client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        timeout=300,
        **sampling,
    )


async def _first_text(stream: Any) -> list[str]:
    text: list[str] = []
    async for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].text)
            if chunk.choices[0].text:
                break
    return text


async def _finish(stream: Any, text: list[str]) -> tuple[str, int]:
    usage = 0
    async for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].text)
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return "".join(text), usage


def _wait_status(url: str, status: int, timeout: float = 60) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while (reply := httpx.get(url, timeout=30)).status_code != status:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} still {reply.status_code} after {timeout}s: {reply.text}")
        time.sleep(0.25)
    return reply


def _wait_log_line(log: Path, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not in {log} after {timeout}s")
        time.sleep(0.25)


def _busiest(served: Served) -> dict[str, Any]:
    victim = max(served.engines(), key=lambda e: int(e["in_flight"]))
    assert victim["in_flight"] > 0, "no stream was in flight: the disturbance came too late"
    return victim


def test_kill_9_of_a_worker_under_50_streams_loses_no_token(served: Served) -> None:
    undisturbed = asyncio.run(_streams(served.base, PROMPTS, None))
    assert [count for _, count in undisturbed] == [MAX_TOKENS] * STREAMS
    killed: dict[str, Any] = {}

    def kill_busiest() -> None:
        killed.update(_busiest(served))
        served.cluster.kill(killed["worker"])

    disturbed = asyncio.run(_streams(served.base, PROMPTS, kill_busiest))

    assert disturbed == undisturbed
    assert served.metric(f'dynask_migrations_total{{model="{MODEL}"}}') >= 1
    assert killed["name"] not in {e["name"] for e in served.wait_engines(2)}
    new_worker = served.cluster.start_worker("w4")
    engines = served.wait_engines(3)
    assert new_worker in {e["worker"] for e in engines}  # the lost actor, recreated


def test_kill_9_under_30_streams_at_temperature_1_completes_them_all(served: Served) -> None:
    """The OpenAI default temperature: seeded streams continue exactly, unseeded ones
    continue from the text shown with a fresh seed; none fails."""
    prompts = PROMPTS[:SAMPLED_STREAMS]
    sampling = [
        {"temperature": 1.0, **({"seed": 500 + i} if i % 2 == 0 else {})}
        for i in range(SAMPLED_STREAMS)
    ]
    undisturbed = asyncio.run(_streams(served.base, prompts, None, sampling))
    migrations_before = served.metric(f'dynask_migrations_total{{model="{MODEL}"}}')
    killed: dict[str, Any] = {}

    def kill_busiest() -> None:
        killed.update(_busiest(served))
        served.cluster.kill(killed["worker"])

    shown: list[str] = []
    disturbed = asyncio.run(_streams(served.base, prompts, kill_busiest, sampling, shown))

    assert [count for _, count in disturbed] == [MAX_TOKENS] * SAMPLED_STREAMS
    assert disturbed[0::2] == undisturbed[0::2]  # seeded: token for token
    assert all(text.startswith(seen) for (text, _), seen in zip(disturbed, shown, strict=True))
    assert disturbed[1::2] != undisturbed[1::2]  # unseeded: fresh samples, not replays
    assert served.metric(f'dynask_migrations_total{{model="{MODEL}"}}') > migrations_before
    served.wait_engines(2)
    # A replica short: /health still says ready, /ready (and ?ready=all) does not.
    assert httpx.get(f"{served.base}/health", timeout=30).status_code == 200
    short = httpx.get(f"{served.base}/health?ready=all", timeout=30)
    assert short.status_code == 503
    assert short.json()["deployments"] == [{"name": MODEL, "replicas": 3, "ready": 2}]
    served.cluster.start_worker("w5")
    served.wait_engines(3)
    assert _wait_status(f"{served.base}/ready", 200).json()["deployments"] == [
        {"name": MODEL, "replicas": 3, "ready": 3}
    ]


def test_a_sigstopped_worker_is_noticed_and_its_streams_move(served: Served) -> None:
    prompts = PROMPTS[:12]
    undisturbed = asyncio.run(_streams(served.base, prompts, None))
    paused: dict[str, Any] = {}

    def pause_busiest() -> None:
        paused.update(_busiest(served))
        served.cluster.pause(paused["worker"])

    disturbed = asyncio.run(_streams(served.base, prompts, pause_busiest))

    assert disturbed == undisturbed
    assert served.metric('dynask_actors_lost_total{reason="heartbeat"}') == 1.0
    engines = served.wait_engines(2)
    assert paused["worker"] not in {e["worker"] for e in engines}  # quarantined

    served.cluster.resume(paused["worker"])  # the orphan is stopped, the worker reused
    engines = served.wait_engines(3)
    assert paused["worker"] in {e["worker"] for e in engines}
    assert paused["name"] not in {e["name"] for e in engines}


def test_a_restarted_control_plane_adopts_the_running_actors(served: Served) -> None:
    before = {e["name"]: e["worker"] for e in served.wait_engines(3)}
    assert served.proc is not None
    served.proc.kill()  # kill -9: no chance to stop anything
    served.proc.wait(timeout=30)

    served.start()  # no deploy file: the deployments come from the database

    after = {e["name"]: e["worker"] for e in served.wait_engines(3)}
    assert after == before  # adopted, not recreated
    client = openai.OpenAI(base_url=f"{served.base}/v1", api_key="unused", max_retries=0)
    reply = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    # The rows the killed control plane left "ready" were closed; the adopted actors'
    # are the only ready ones.
    engine = make_engine(served.db)
    try:
        deadline = time.monotonic() + 30
        while len(ready := _ready_rows(engine)) != 3 and time.monotonic() < deadline:
            time.sleep(0.25)
        assert sorted(ready) == sorted(before.values())
    finally:
        engine.dispose()


def _ready_rows(engine: Any) -> list[str]:
    actors = Repository(engine).list_actors()
    return [a.worker_address for a in actors if a.status == "ready"]
