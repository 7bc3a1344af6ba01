"""The scheduler's ``remove-worker`` event alone declares an actor lost.

A worker the scheduler removes without closing it keeps its sockets open: no EOF, no
failed heartbeat. Only the event on the ``all`` topic says the actor is gone, and the
stream on it must move. Real in-process Dask cluster of two workers, mocker actors.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from dynask.actors.runtime.engine_actor import EngineActor
from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.control_plane.reliability.actor_health import ActorHealth
from dynask.control_plane.reliability.options import ReliabilityOptions
from tests.control_plane.routing_stack import MODEL, serving_stack, tokens

pytestmark = pytest.mark.slow

SLOW_MOCKER = {"speedup_ratio": 1.0, "num_kv_blocks": 256}  # ~6 ms per decode step


def test_a_worker_removed_by_the_scheduler_loses_its_actor_and_its_stream_moves(
    smollm2_folder: Path,
) -> None:
    spec = EngineSpec(kind="mocker", model=str(smollm2_folder), engine_args=SLOW_MOCKER)

    async def main() -> None:
        async with (
            LocalCluster(
                n_workers=2, processes=False, asynchronous=True, dashboard_address=None
            ) as cluster,
            Client(cluster, asynchronous=True, direct_to_workers=True) as client,
        ):
            workers = sorted(cluster.scheduler.workers)
            proxies = [
                await client.submit(
                    EngineActor, spec, f"mock-{i}", actor=True, pure=False, workers=[worker]
                )
                for i, worker in enumerate(workers)
            ]
            async with serving_stack(proxies) as stack:
                woken: list[None] = []
                health = ActorHealth(
                    client, ReliabilityOptions(), lambda: stack.handles, lambda: woken.append(None)
                )
                health.start()
                stream = await stack.openai.completions.create(
                    model=MODEL,
                    prompt=tokens(seed=1, blocks=2),
                    max_tokens=200,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                )
                await stream.__aiter__().__anext__()
                victim = max(stack.handles, key=lambda h: h.in_flight)

                await cluster.scheduler.remove_worker(
                    address=victim.worker, stimulus_id="test-remove", close=False
                )
                usage = [c.usage async for c in stream if c.usage is not None]

                assert victim.broken and victim.lost_reason == "scheduler"
                assert usage[0] is not None and usage[0].completion_tokens == 200
                assert woken  # the reconciler was woken
                metrics = (await stack.http.get("/metrics")).text
                assert f'dynask_migrations_total{{model="{MODEL}"}} 1.0' in metrics
                health.stop()
            for worker in cluster.workers.values():  # the removed one's actor too
                for actor in list(worker.state.actors.values()):
                    await actor.stop()

    asyncio.run(main())


def test_an_engine_that_stops_stepping_is_lost_though_its_worker_answers(
    smollm2_folder: Path,
) -> None:
    """An echo engine that sleeps 1,000 s after its first step: a stuck engine thread on
    a healthy worker. Round-robin sends one stream to it and one to a normal engine."""
    stuck = EngineSpec(kind="echo", model=str(smollm2_folder), engine_args={"delay_s": 1000.0})
    fine = EngineSpec(kind="echo", model=str(smollm2_folder), engine_args={"delay_s": 0.001})
    options = ReliabilityOptions(
        heartbeat_interval_s=0.1, heartbeat_timeout_s=5.0, engine_stall_timeout_s=1.0
    )

    async def main() -> None:
        async with (
            LocalCluster(
                n_workers=1, processes=False, asynchronous=True, dashboard_address=None
            ) as cluster,
            Client(cluster, asynchronous=True, direct_to_workers=True) as client,
        ):
            proxies = [
                await client.submit(EngineActor, spec, f"echo-{i}", actor=True, pure=False)
                for i, spec in enumerate((stuck, fine))
            ]
            async with serving_stack(proxies, reliability=options) as stack:
                health = ActorHealth(client, options, lambda: stack.handles, lambda: None)
                health.start()
                streams = [
                    await stack.openai.completions.create(
                        model=MODEL,
                        prompt=tokens(seed=seed, blocks=2),
                        max_tokens=20,
                        temperature=0,
                        stream=True,
                        stream_options={"include_usage": True},
                        extra_body={"router_mode": "round-robin"},
                    )
                    for seed in (1, 2)
                ]
                usages = [[c.usage async for c in s if c.usage is not None] for s in streams]

                assert [u[0].completion_tokens for u in usages if u[0]] == [20, 20]
                stuck_handle = stack.handle("echo-0")
                assert stuck_handle.broken and stuck_handle.lost_reason == "engine_stalled"
                for _ in range(500):  # its worker answers: the stuck actor is stopped
                    if not health.quarantined:
                        break
                    await asyncio.sleep(0.01)
                assert health.quarantined == {}
                health.stop()
            for actor in list(cluster.workers[0].state.actors.values()):
                await actor.stop()

    asyncio.run(main())
