"""Pool workers are fenced off: exact rules, and a real scheduler where ``dynask serve``'s
reconciler (no pool served) places its deployment on the plain worker, not the pool's."""

from __future__ import annotations

import asyncio

import pytest
from distributed import LocalCluster, Worker

from dynask.control_plane.cluster.placement_rules import may_place, pool_of
from dynask.control_plane.cluster.reconciler import ClusterRuntime
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.service import ServingService
from dynask.control_plane.state.deployment import DeploymentSpec


@pytest.mark.parametrize(
    ("name", "pool"),
    [
        ("dyn-llama.gpu-node-1-4711-0", "llama"),
        ("dyn-llama-2.node-1-0", "llama-2"),
        ("dyn-llama.", None),  # no node
        ("dyn-Llama.node", None),  # not a pool name
        ("dyn-llama", None),
        ("remote-1-127-0-0-1-cpu", None),
        ("0", None),
        ("", None),
    ],
)
def test_the_pool_of_a_worker_is_in_its_name(name: str, pool: str | None) -> None:
    assert pool_of(name) == pool


def _worker(name: str) -> dict[str, object]:
    return {"address": f"tcp://{name}:1", "name": name}


def test_a_plain_control_plane_keeps_off_every_pool() -> None:
    workers = [_worker("dyn-llama.a-0"), _worker("dyn-qwen.b-0"), _worker("w1")]
    echo = DeploymentSpec("echo", engine="echo")
    llama = DeploymentSpec("llama", engine="echo")  # same name as a pool, but not served as one
    assert [may_place(echo, w, ()) for w in workers] == [False, False, True]
    assert [may_place(llama, w, ()) for w in workers] == [False, False, True]


def test_a_pool_front_end_puts_its_pool_on_its_workers_only() -> None:
    workers = [_worker("dyn-llama.a-0"), _worker("dyn-qwen.b-0"), _worker("w1")]
    llama = DeploymentSpec("llama", engine="echo")
    other = DeploymentSpec("other", engine="echo")  # e.g. made on the front end's admin UI
    assert [may_place(llama, w, {"llama"}) for w in workers] == [True, False, False]
    assert [may_place(other, w, {"llama"}) for w in workers] == [False, False, True]


@pytest.mark.slow  # an engine actor starts (the bundled tokenizer loads)
def test_serve_places_its_actor_on_the_plain_worker_not_the_pool_worker() -> None:
    async def scenario() -> None:
        async with (
            LocalCluster(
                n_workers=0, asynchronous=True, dashboard_address=None, host="127.0.0.1"
            ) as cluster,
            Worker(cluster.scheduler_address, name="dyn-llama.node-1-0", nthreads=1) as pooled,
            Worker(cluster.scheduler_address, name="w-plain", nthreads=1) as plain,
        ):
            # Two replicas wanted: without the fence each worker would get one.
            deployment = DeploymentSpec("echo", engine="echo", replicas=2)
            runtime = ClusterRuntime(
                ServingService(ServingMetrics()), [deployment], cluster.scheduler_address
            )
            await runtime.start()
            try:
                actors = runtime.service.actors()
                assert [(a.name, a.worker) for a in actors] == [("echo-0", plain.address)]
                assert pooled.address not in {a.worker for a in actors}
            finally:
                await runtime.stop()

    asyncio.run(scenario())
