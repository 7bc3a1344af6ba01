"""Router replicas on real actors: two control planes in front of the same mocker actors
(a real Dask cluster, each control plane with its own HTTP server, the ``openai``
client) route a fixed sequence of requests in turn, and decide as one control plane
routing the same sequence alone does.

The actors stall each prefill for ``STALL_MS`` of model time, so while the sequence is
routed no request has produced a token or a KV event: what a router knows of the
others' requests is exactly what reached it through the actors' ``"routed"`` frames.
Each request is sent once the previous one's routing has reached the other control
plane (``peer_load``). The one control plane is ``replica_script``'s, over handles of
actors that cannot have answered yet (as the stalled ones have not); the decisions are
compared with the actors named by the order they first won (idle, empty actors are
alike: which one a tie picked does not matter). A second control plane that connects
after the first has routed hears those requests from the actors as it connects, and its
next decision is the one router's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from dynask.actors.api.actor_info import ActorInfo
from dynask.control_plane.routing.kv_router import RoutingDecision
from dynask.control_plane.routing.model_routing import ModelRouting
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.serving.metrics import ServingMetrics
from tests.control_plane.routing.replica_script import (
    ROUTED_PROMPTS,
    ControlPlane,
    RelayingActors,
    canonical,
)
from tests.control_plane.routing_stack import (
    MODEL,
    Stack,
    cluster_with_actors,
    serving_stack,
    tokens,
    until,
)

ACTORS = ("mock-0", "mock-1", "mock-2")
STALL_MS = 4000.0  # every prefill step's model time: far longer than routing the sequence
STALLED = {"speedup_ratio": 1.0, "num_kv_blocks": 256, "prefill_ms_base": STALL_MS}


async def _stream(stack: Stack, prompt: list[int]) -> None:
    stream = await stack.openai.completions.create(
        model=MODEL, prompt=prompt, max_tokens=64, stream=True, extra_body={"ignore_eos": True}
    )
    async for _ in stream:
        pass


async def _route_in_turn(
    planes: Sequence[Stack],
    tasks: list[asyncio.Task[None]],
    prompts: Sequence[list[int]] = ROUTED_PROMPTS,
) -> list[RoutingDecision]:
    """Sends ``prompts`` to ``planes`` in turn, each once the previous routing is known to
    every plane; their decisions in order."""
    decisions = []
    for number, prompt in enumerate(prompts):
        plane = planes[number % len(planes)]
        log = plane.routing.decisions
        before = len(log)
        tasks.append(asyncio.create_task(_stream(plane, prompt)))
        await until(lambda: len(log) > before, f"request {number} to be routed")  # noqa: B023
        [decision] = log.recent(1)
        for other in planes:
            if other is not plane:
                seen = other.handle(decision.winner).peer_load
                await until(lambda: decision.request_id in seen, "the peer to hear it")  # noqa: B023
        decisions.append(decision)
    return decisions


def _one_router() -> list[RoutingDecision]:
    """One control plane routing ``ROUTED_PROMPTS``, over handles of actors that cannot have
    answered yet (as the stalled ones): what the pair must decide."""
    plane = ControlPlane.new(RoutingOptions(), kv_events=True, names=ACTORS)
    actors = RelayingActors([plane])
    return [
        actors.route(plane, f"r{i}", prompt).decision for i, prompt in enumerate(ROUTED_PROMPTS)
    ]


@pytest.mark.slow  # 30–45 s alone on this loaded 2-core machine, most of it starting 3 engines
def test_two_control_planes_on_the_same_actors_decide_as_one(smollm2_folder: Path) -> None:
    async def main() -> None:
        async with (
            cluster_with_actors(smollm2_folder, len(ACTORS), engine_args=STALLED) as proxies,
            serving_stack(proxies) as first,
            serving_stack(proxies) as second,
        ):
            tasks: list[asyncio.Task[None]] = []
            started = time.monotonic()
            together = await _route_in_turn([first, second], tasks)
            assert time.monotonic() - started < STALL_MS / 1000, "routing outlasted the stall"
            # No request has left its prefill: each one counts as waiting on its own
            # control plane and, through the actors, on the other one.
            for plane in (first, second):
                waiting = [h.load.waiting + h.peer_load.waiting for h in plane.handles]
                assert sum(waiting) == len(ROUTED_PROMPTS)

            assert canonical(together) == canonical(_one_router())
            metrics = (await second.http.get("/metrics")).text
            assert f'dynask_routing_peer_lag_seconds_count{{model="{MODEL}"}} 4.0' in metrics
            for task in tasks:
                task.cancel()  # the clients go away: the actors abort the requests
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


EARLY = 3  # requests the first control plane routes before the second one connects


async def _followers(
    proxies: Sequence[object], metrics: ServingMetrics
) -> tuple[ModelRouting, list[ActorHandle]]:
    """A second control plane's routing over its own connected handles of the actors,
    following their routed frames. Not a whole ``serving_stack``: that waits for each
    actor's KV dump, which a stalled engine answers only after its stall."""
    routing = ModelRouting(MODEL, RoutingOptions(), metrics)
    handles = []
    for proxy in proxies:
        info = ActorInfo.from_dict(await proxy.start())  # type: ignore[attr-defined]
        handle = ActorHandle(name=info.name, deployment="d", proxy=proxy, info=info)
        await handle.connect()
        routing.follow_peers(handle)  # before the first frame is read (ActorHandle.connect)
        handles.append(handle)
    return routing, handles


@pytest.mark.slow  # as the test above
def test_a_control_plane_that_connects_later_counts_what_was_routed_before(
    smollm2_folder: Path,
) -> None:
    async def main() -> None:
        async with (
            cluster_with_actors(smollm2_folder, len(ACTORS), engine_args=STALLED) as proxies,
            serving_stack(proxies) as first,
        ):
            tasks: list[asyncio.Task[None]] = []
            started = time.monotonic()
            decisions = await _route_in_turn([first], tasks, ROUTED_PROMPTS[:EARLY])
            metrics = ServingMetrics()
            routing, handles = await _followers(proxies, metrics)
            try:
                # The actors' first frame to it: the requests in flight, all still waiting.
                by_name = {handle.name: handle for handle in handles}
                for decision in decisions:
                    seen = by_name[decision.winner].peer_load
                    await until(lambda: decision.request_id in seen, "the catch-up")  # noqa: B023
                assert sum(handle.peer_load.waiting for handle in handles) == EARLY
                for handle in first.handles:
                    assert (
                        by_name[handle.name].peer_load.prefill_blocks == handle.load.prefill_blocks
                    )
                # Its next decision is the one a single router makes after those three.
                route = routing.choose("late-0", ROUTED_PROMPTS[EARLY], handles)
                assert time.monotonic() - started < STALL_MS / 1000, "outlasted the stall"
                one = _one_router()[: EARLY + 1]
                assert canonical([*decisions, route.decision]) == canonical(one)
                # Caught-up routings are not timed as a peer's lag (they are old by design).
                timed = metrics.registry.get_sample_value(
                    "dynask_routing_peer_lag_seconds_count", {"model": MODEL}
                )
                assert timed == 0.0
            finally:
                for handle in handles:
                    await handle.close()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def test_a_later_control_plane_takes_the_approximate_blocks_of_ended_requests(
    smollm2_folder: Path,
) -> None:
    """Echo actors publish no KV events: what the first control plane routed there (and
    has finished) reaches a second one only through the actors' first frame to it."""
    prompts = [tokens(seed=30 + i, blocks=3) for i in range(4)]

    async def main() -> None:
        async with (
            cluster_with_actors(smollm2_folder, 2, engine="echo") as proxies,
            serving_stack(proxies) as first,
        ):
            for prompt in prompts:
                await first.openai.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
            async with serving_stack(proxies) as second:
                theirs, mine = (p.service.models[MODEL].routing for p in (first, second))
                for handle in first.handles:
                    assert mine.approx.num_blocks(handle.name) == theirs.approx.num_blocks(
                        handle.name
                    )
                assert sum(mine.approx.num_blocks(h.name) for h in second.handles) == 12
                for prompt in prompts:
                    hashes = mine.local_hashes(prompt)
                    assert mine.find_matches(hashes) == theirs.find_matches(hashes)
                assert sum(len(h.peer_load) for h in second.handles) == 0  # all ended

    asyncio.run(main())
