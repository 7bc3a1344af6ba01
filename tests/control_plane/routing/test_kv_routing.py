"""KV-aware routing as a user meets it: real actors on an in-process Dask cluster, their
KV events over the token streams, the OpenAI API over HTTP, ``/v1/routing/decisions``.

Mocker actors run the production scheduler and block pool (so real KV events) with no
simulated model time unless a test needs requests to stay in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from dynask.actors.api.sampling_params import SamplingParams
from dynask.control_plane.routing.routing_options import RoutingOptions
from tests.control_plane.routing_stack import (
    MODEL,
    Stack,
    cluster_with_actors,
    connect_service,
    overlaps,
    serving_stack,
    tokens,
)

ACTORS = ("mock-0", "mock-1", "mock-2")


def _run(
    folder: Path,
    body: Callable[[Stack], Awaitable[None]],
    count: int = 3,
    routing: RoutingOptions | None = None,
    engine: str = "mocker",
    engine_args: dict[str, Any] | None = None,
) -> None:
    async def main() -> None:
        async with (
            cluster_with_actors(folder, count, engine, engine_args) as proxies,
            serving_stack(proxies, routing) as stack,
        ):
            await body(stack)

    asyncio.run(main())


def test_a_prompt_goes_to_the_actor_that_holds_its_prefix(smollm2_folder: Path) -> None:
    async def body(stack: Stack) -> None:
        prefix = tokens(seed=1, blocks=10)
        await stack.complete(prefix)
        [first] = await stack.decisions()
        holder = first["winner"]
        assert first["mode"] == "kv" and overlaps(first) == dict.fromkeys(ACTORS, 0)

        reply = await stack.complete(prefix + tokens(seed=2, blocks=2, extra=8))

        [decision] = await stack.decisions()
        assert decision["winner"] == holder
        assert decision["prompt_blocks"] == 12
        assert overlaps(decision) == {a: 10 if a == holder else 0 for a in ACTORS}
        winner = next(c for c in decision["candidates"] if c["actor"] == holder)
        assert (winner["uncached_blocks"], winner["cached_blocks"]) == (2, 10)
        assert reply.usage.prompt_tokens_details.cached_tokens == 160  # the engine agrees
        metrics = (await stack.http.get("/metrics")).text
        assert f'dynask_kv_cache_hit_ratio{{model="{MODEL}"}} {160 / 360}' in metrics
        assert f'dynask_routing_decision_seconds_count{{model="{MODEL}"}} 2.0' in metrics
        assert f'dynask_routing_overlap_blocks_sum{{actor="{holder}"}} 10.0' in metrics

    _run(smollm2_folder, body)


class _DroppingListener:
    """Stands between a handle and its KV sync and loses frames while ``dropping``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.dropping = True
        self.dropped = 0

    def on_kv_events(self, payload: Any) -> None:
        if self.dropping:
            self.dropped += len(payload)
        else:
            self.inner.on_kv_events(payload)

    def on_stream_closed(self) -> None:
        self.inner.on_stream_closed()


def test_lost_events_are_found_by_their_ids_and_resynced_from_a_dump(
    smollm2_folder: Path,
) -> None:
    async def body(stack: Stack) -> None:
        droppers = {h.name: _DroppingListener(h.listener) for h in stack.handles}
        for handle in stack.handles:
            handle.listener = droppers[handle.name]
        lost = tokens(seed=3, blocks=10)
        await stack.complete(lost)
        [decision] = await stack.decisions()
        holder = decision["winner"]
        routing = stack.routing
        assert droppers[holder].dropped == 1  # the prefill's 10 blocks in one BlockStored, lost
        assert routing.find_matches(routing.local_hashes(lost)) == {}
        for dropper in droppers.values():
            dropper.dropping = False

        # The holder's next event has id 2: the index sees the gap and resyncs.
        later = tokens(seed=4, blocks=3)
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        _ = [o async for o in stack.handle(holder).generate("direct-1", later, params)]
        await routing.wait_synced()

        assert routing.find_matches(routing.local_hashes(lost)) == {holder: 10}
        assert routing.find_matches(routing.local_hashes(later)) == {holder: 3}
        assert routing.prefix.expected_event_id(holder) == 3
        sync = routing.sync(holder)
        assert sync is not None and sync.resyncs == 2  # on connect, then after the gap
        metrics = (await stack.http.get("/metrics")).text
        assert f'dynask_kv_resyncs_total{{actor="{holder}",reason="gap"}} 1.0' in metrics
        await stack.complete(lost + tokens(seed=5, blocks=1))
        [decision] = await stack.decisions()
        assert decision["winner"] == holder and overlaps(decision)[holder] == 10

    # What the events say, alone: no routed prompt counts as predicted-cached here.
    _run(smollm2_folder, body, routing=RoutingOptions(predicted_ttl_s=0))


def test_a_restarted_control_plane_rebuilds_the_index_from_dumps(smollm2_folder: Path) -> None:
    async def body(stack: Stack) -> None:
        prompts = [tokens(seed=10 + i, blocks=4 + i) for i in range(4)]
        for prompt in prompts:
            await stack.complete(prompt)
        holders = [d["winner"] for d in reversed(await stack.decisions(limit=4))]

        service, handles = await connect_service(stack.proxies)  # a second control plane
        try:
            rebuilt = service.models[MODEL].routing
            for prompt, holder in zip(prompts, holders, strict=True):
                assert rebuilt.find_matches(rebuilt.local_hashes(prompt)) == {
                    holder: len(prompt) // 16
                }
            for actor in ACTORS:
                assert rebuilt.prefix.num_blocks(actor) == stack.routing.prefix.num_blocks(actor)
            route = rebuilt.choose("r-1", prompts[3] + tokens(seed=20, blocks=1), handles)
            assert route.actor.name == holders[3]
            assert route.decision.winner_score.overlap_blocks == 7
        finally:
            for handle in handles:
                await handle.close()

    _run(smollm2_folder, body)


def test_a_lost_actor_takes_its_blocks_with_it(smollm2_folder: Path) -> None:
    async def body(stack: Stack) -> None:
        prompt = tokens(seed=30, blocks=10)
        await stack.complete(prompt)
        [decision] = await stack.decisions()
        holder = decision["winner"]
        routing = stack.routing
        assert routing.prefix.num_blocks(holder) == 10

        await stack.proxies[ACTORS.index(holder)].stop()  # its token stream closes
        for _ in range(200):
            if stack.handle(holder).broken:
                break
            await asyncio.sleep(0.01)

        assert stack.handle(holder).broken
        assert routing.prefix.find_matches(routing.local_hashes(prompt)) == {}
        assert holder not in routing.prefix.actors()
        reply = await stack.complete(prompt)
        [decision] = await stack.decisions()
        assert decision["winner"] != holder and len(decision["candidates"]) == 2
        assert reply.usage.completion_tokens == 4

    _run(smollm2_folder, body)


def test_a_request_may_choose_its_router_mode(smollm2_folder: Path) -> None:
    async def body(stack: Stack) -> None:
        prompt = tokens(seed=40, blocks=2)
        for _ in range(3):
            await stack.complete(prompt, router_mode="round-robin")
        await stack.complete(prompt)
        decisions = await stack.decisions(limit=4)
        assert [d["mode"] for d in decisions] == ["kv", "round-robin", "round-robin", "round-robin"]
        assert {d["winner"] for d in decisions[1:]} == set(ACTORS)  # one turn each

        with pytest.raises(openai.BadRequestError) as caught:
            await stack.complete(prompt, router_mode="sticky")
        error = caught.value.body
        assert isinstance(error, dict) and error["param"] == "router_mode"
        assert error["message"] == (
            "'router_mode' has value 'sticky'; use one of kv, approximate, least-loaded, "
            "round-robin, random, or leave it out for the server's default"
        )
        bad_limit = await stack.http.get("/v1/routing/decisions", params={"limit": "0"})
        assert bad_limit.status_code == 400
        assert bad_limit.json()["error"]["message"] == (
            "'limit' has value '0'; expected an integer in [1, 1000]"
        )

    _run(smollm2_folder, body)


def test_every_actor_over_its_limit_sheds_with_503(smollm2_folder: Path) -> None:
    slow = {"speedup_ratio": 1.0, "num_kv_blocks": 256}  # 5.7 ms per decode step

    async def body(stack: Stack) -> None:
        streams = []
        for seed in (50, 51):
            stream = await stack.openai.completions.create(
                model=MODEL,
                prompt=tokens(seed=seed, blocks=2),
                max_tokens=1000,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            await stream.__aiter__().__anext__()  # decoding now: 3 active blocks
            streams.append(stream)
        busy = {d["winner"] for d in await stack.decisions(limit=2)}
        assert busy == {"mock-0", "mock-1"}

        with pytest.raises(openai.InternalServerError) as caught:
            await stack.complete(tokens(seed=52, blocks=2))

        assert caught.value.status_code == 503
        assert caught.value.response.headers["retry-after"] == "1"
        error = caught.value.body
        assert isinstance(error, dict) and error["code"] == "overloaded"
        assert error["message"].startswith(
            f"every engine of model '{MODEL}' is at its limit (max_active_blocks=1, max_queue=None"
        )
        for stream in streams:
            await stream.close()  # the client goes away: the requests are aborted
        for _ in range(200):
            if all(h.in_flight == 0 for h in stack.handles):
                break
            await asyncio.sleep(0.01)
        reply = await stack.complete(tokens(seed=53, blocks=2))
        assert reply.usage.completion_tokens == 4
        metrics = (await stack.http.get("/metrics")).text
        assert f'dynask_requests_shed_total{{model="{MODEL}"}} 1.0' in metrics

    _run(
        smollm2_folder,
        body,
        count=2,
        routing=RoutingOptions(max_active_blocks=1),
        engine_args=slow,
    )


def test_engines_without_kv_events_are_routed_by_where_prompts_went(
    smollm2_folder: Path,
) -> None:
    async def body(stack: Stack) -> None:
        prompt = tokens(seed=60, blocks=6)
        await stack.complete(prompt)
        [first] = await stack.decisions()
        assert stack.routing.sync(first["winner"]) is None  # no events to follow

        await stack.complete(prompt + tokens(seed=61, blocks=1))

        [decision] = await stack.decisions()
        assert decision["winner"] == first["winner"]
        assert overlaps(decision) == {a: 6 if a == first["winner"] else 0 for a in ACTORS[:2]}

    _run(smollm2_folder, body, count=2, engine="echo")
