"""The planner against mocker actors on a real in-process Dask cluster, with load sent
over HTTP by the official openai client: it scales up under load (never past the
budget), back down when the load stops, and logs every decision with its reason."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import openai
import pytest
import uvicorn
from distributed import LocalCluster

from dynask.control_plane.api.app import build_app
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.planner.decision import PlannerConfig
from dynask.control_plane.planner.loop import PlannerLoop
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.deployment import DeploymentSpec
from dynask.control_plane.state.repository import Repository
from tests.control_plane.server_process import free_port

MODEL = "mock"
BUDGET = 3
UNREACHABLE_ITL_MS = 1e-6  # every request misses it: the load always asks for more


@contextlib.asynccontextmanager
async def served(service: ServingService) -> AsyncIterator[openai.AsyncOpenAI]:
    port = free_port()
    config = uvicorn.Config(
        build_app(service), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0
    )
    try:
        yield client
    finally:
        await client.close()
        server.should_exit = True
        await serving


async def keep_loading(client: openai.AsyncOpenAI, streams: int) -> None:
    async def one_stream(seed: int) -> None:
        while True:
            await client.completions.create(
                model=MODEL,
                prompt=[100 + seed] * 40,
                max_tokens=32,
                extra_body={"ignore_eos": True},
            )

    await asyncio.gather(*(one_stream(i) for i in range(streams)))


async def step_until(
    planner: PlannerLoop, runtime: ClusterRuntime, done: Callable[[], bool], seen: list[int]
) -> None:
    for _ in range(300):
        await planner.step()
        seen.append(runtime.deployments[0].replicas)
        ready = len(runtime.service.ready_actors())
        if done() and ready == runtime.deployments[0].replicas:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the planner did not get there: {[d.hold for d in planner.decisions]}")


@pytest.mark.slow
def test_the_planner_follows_a_load_step_up_and_down(
    repo: Repository, tokenizer_folder: Path
) -> None:
    config = PlannerConfig(
        itl_target_ms=UNREACHABLE_ITL_MS,
        ttft_target_ms=60_000,
        max_workers=BUDGET,
        interval_s=0.1,
        # A window the load never leaves empty: with 0.5 s, a CI run (2 cores, actors
        # starting beside the load) once saw no request finish for half a second at the
        # budget, scaled 3 -> 2 on "no requests" and back up.
        window_s=2.0,
    )

    async def scenario() -> list[int]:
        async with LocalCluster(
            n_workers=BUDGET + 1, processes=False, asynchronous=True, dashboard_address=None
        ) as cluster:
            service = ServingService(ServingMetrics())
            runtime = ClusterRuntime(service, [], scheduler_address=cluster.scheduler_address)
            planner = PlannerLoop(config, runtime, repo)
            dry_run = PlannerLoop(PlannerConfig(**{**vars(config), "dry_run": True}), runtime, repo)
            await runtime.start()
            spec = DeploymentSpec(
                name="decode",
                model=str(tokenizer_folder),
                engine="mocker",
                role="aggregated",
                replicas=1,
                engine_args={"speedup_ratio": 5.0, "num_kv_blocks": 256},  # ~1 ms steps
                served_model_name=MODEL,
            )
            await planner.admin.create(spec, "test")
            seen: list[int] = []
            try:
                await step_until(planner, runtime, lambda: True, seen)  # 1 ready
                async with served(service) as client:
                    load = asyncio.create_task(keep_loading(client, streams=4))
                    window = service.metrics.latency_window
                    while window.summary(MODEL, config.window_s).requests == 0:
                        await asyncio.sleep(0.05)
                    dry = await dry_run.step()
                    assert dry.replicas == {"decode": 3}, dry.hold  # 1 + max_step
                    assert runtime.deployments[0].replicas == 1  # dry run: nothing changed
                    await step_until(
                        planner, runtime, lambda: runtime.deployments[0].replicas == BUDGET, seen
                    )
                    for _ in range(5):  # still over target, at the budget: it stays there
                        await planner.step()
                        seen.append(runtime.deployments[0].replicas)
                        await asyncio.sleep(0.1)
                    load.cancel()
                    with contextlib.suppress(asyncio.CancelledError, openai.APIError):
                        await load
                await step_until(
                    planner, runtime, lambda: runtime.deployments[0].replicas == 1, seen
                )
            finally:
                await runtime.stop()
            return seen

    seen = asyncio.run(scenario())
    assert max(seen) == BUDGET  # reached, never exceeded
    assert seen[-1] == 1
    events = [e for e in reversed(repo.recent_events(200)) if e.kind.startswith("planner.")]
    moves = [(e.kind, e.details["from"], e.details["to"]) for e in events if "to" in e.details]
    assert moves[0] == ("planner.would_scale", 1, 3)
    ups = [m for m in moves if m[0] == "planner.scaled" and m[2] > m[1]]
    downs = [m for m in moves if m[0] == "planner.scaled" and m[2] < m[1]]
    assert ups[-1][2] == BUDGET
    assert downs == [("planner.scaled", 3, 2), ("planner.scaled", 2, 1)]
    reasons = {e.details["reason"].split(" ")[0] for e in events if "to" in e.details}
    assert reasons == {"ITL", "no"}  # "ITL p90 ... (target ...)" and "no requests ..."
    scaled = [e for e in repo.recent_events(200) if e.kind == "deployment.scaled"]
    assert {e.who for e in scaled} == {"planner"}
    holds = [e.details["reason"] for e in events if e.kind == "planner.hold"]
    waiting = f"waiting for {config.window_s:g}s of metrics since the last change"
    assert any(h.startswith(waiting) for h in holds)


@pytest.mark.slow
def test_scaling_down_lets_the_retired_actor_finish_its_requests(
    repo: Repository, tokenizer_folder: Path
) -> None:
    """Regression: the reconciler stopped a retired actor at once, failing its requests."""

    async def scenario() -> list[tuple[str | None, int]]:
        async with LocalCluster(
            n_workers=2, processes=False, asynchronous=True, dashboard_address=None
        ) as cluster:
            service = ServingService(ServingMetrics())
            runtime = ClusterRuntime(service, [], scheduler_address=cluster.scheduler_address)
            planner = PlannerLoop(PlannerConfig(), runtime, repo)
            await runtime.start()
            spec = DeploymentSpec(
                name="decode",
                model=str(tokenizer_folder),
                engine="mocker",
                replicas=2,
                engine_args={"speedup_ratio": 1.0, "num_kv_blocks": 256},  # ~6 ms a token
                served_model_name=MODEL,
            )
            await planner.admin.create(spec, "test")
            try:
                while len(service.ready_actors()) < 2:
                    await asyncio.sleep(0.05)
                async with served(service) as client:
                    requests = [
                        asyncio.create_task(
                            client.completions.create(
                                model=MODEL,
                                prompt=[200 + i] * 20,
                                max_tokens=100,
                                extra_body={"ignore_eos": True},
                            )
                        )
                        for i in range(4)
                    ]
                    while sum(1 for h in service.ready_actors() if h.in_flight) < 2:
                        await asyncio.sleep(0.01)
                    await planner.admin.scale("decode", 1, "test")
                    replies = await asyncio.gather(*requests)
                    while len(service.ready_actors()) > 1:
                        await asyncio.sleep(0.05)
            finally:
                await runtime.stop()
            return [(r.choices[0].finish_reason, r.usage.completion_tokens) for r in replies]

    assert asyncio.run(scenario()) == [("length", 100)] * 4


def test_an_embedded_cluster_grows_to_the_planned_replicas_within_the_budget(
    repo: Repository, tokenizer_folder: Path
) -> None:
    async def scenario() -> int:
        async with LocalCluster(
            n_workers=1, processes=False, asynchronous=True, dashboard_address=None
        ) as cluster:
            runtime = ClusterRuntime(ServingService(ServingMetrics()), [])
            runtime.cluster = cluster  # as ``dynask run`` has it (the test closes it)
            planner = PlannerLoop(PlannerConfig(max_workers=2), runtime, repo)
            spec = DeploymentSpec(
                name="decode", model=str(tokenizer_folder), engine="mocker", replicas=3
            )
            await planner.admin.create(spec, "test")  # no client yet: nothing starts
            await planner._grow_cluster()
            await cluster.wait_for_workers(2)  # type: ignore[no-untyped-call]
            assert len(cluster.worker_spec) == 2  # what it asked for: the budget, not 3
            return len(cluster.scheduler.workers)

    assert asyncio.run(scenario()) == 2
