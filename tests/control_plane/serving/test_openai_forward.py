"""``out=openai:URL`` as a user meets it: engine actors on a real in-process Dask cluster
forward to real ``vllm serve`` processes of the bundled SmolLM2 (vLLM's CPU build), and
the official ``openai`` client talks to our HTTP API in front of them.

Two servers start once for the module (about a minute or more each on two cores):
``main`` serves every test; ``doomed`` is killed mid-stream by the migration test. Four
actors: two forward to ``main`` without KV events (routed approximately), one to
``main`` with its KV event publisher, one to ``doomed``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from distributed import Client, LocalCluster

from dynask.actors.api.actor_info import ActorInfo
from dynask.actors.backends.openai_forward.upstream import probe
from dynask.actors.runtime.engine_actor import EngineActor
from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.control_plane.serving.actor_handle import ActorHandle
from tests.control_plane.cli.test_vllm_serving import LoopThread
from tests.control_plane.routing_stack import MODEL, Stack, overlaps, serving_stack, tokens
from tests.control_plane.server_process import dynask_run
from tests.control_plane.vllm_server import BLOCK_SIZE, VLLMServer, vllm_servers

pytestmark = pytest.mark.slow


@dataclass
class World:
    main: VLLMServer
    doomed: VLLMServer
    approx: Stack  # actors fwd-0 and fwd-1 -> main, no KV events
    kv: Stack  # actor fwd-kv -> main, with its KV events
    proxies: dict[str, Any]


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@asynccontextmanager
async def _actors(folder: Path, specs: dict[str, EngineSpec]) -> AsyncIterator[dict[str, Any]]:
    async with (
        LocalCluster(
            n_workers=1, processes=False, asynchronous=True, dashboard_address=None
        ) as cluster,
        Client(cluster, asynchronous=True, direct_to_workers=True) as client,
    ):
        proxies = {
            name: await client.submit(EngineActor, spec, name, actor=True, pure=False)
            for name, spec in specs.items()
        }
        try:
            await asyncio.gather(*(proxy.start() for proxy in proxies.values()))
            yield proxies
        finally:
            for proxy in proxies.values():
                await proxy.stop()


@pytest.fixture(scope="module")
def world(loop: LoopThread, smollm2_folder: Path, tmp_path_factory: Any) -> Iterator[World]:
    """Everything lives in ONE task on the loop thread (Dask's client keeps context vars)."""
    folder = tmp_path_factory.mktemp("vllm-servers")
    with vllm_servers(smollm2_folder, folder, 2) as (main, doomed):
        model = str(smollm2_folder)
        kv_args = {"kv_events_endpoint": main.kv_events_endpoint}
        specs = {
            "fwd-0": EngineSpec("openai", model, url=main.url),
            "fwd-1": EngineSpec("openai", model, url=f"{main.url}/v1"),
            "fwd-kv": EngineSpec("openai", model, url=main.url, engine_args=kv_args),
            "fwd-x": EngineSpec("openai", model, url=doomed.url),
        }
        ready: concurrent.futures.Future[World] = concurrent.futures.Future()
        done = asyncio.Event()

        async def hold() -> None:
            async with _actors(smollm2_folder, specs) as proxies:
                approx = [proxies["fwd-0"], proxies["fwd-1"]]
                async with (
                    serving_stack(approx) as approx_stack,
                    serving_stack([proxies["fwd-kv"]]) as kv_stack,
                ):
                    ready.set_result(World(main, doomed, approx_stack, kv_stack, proxies))
                    await done.wait()

        held = asyncio.run_coroutine_threadsafe(hold(), loop.loop)
        held.add_done_callback(lambda f: f.exception() and ready.set_exception(f.exception()))  # type: ignore[arg-type]
        try:
            yield ready.result(timeout=300)
        finally:
            loop.loop.call_soon_threadsafe(done.set)
            held.result(timeout=120)


async def _actor_call(proxy: Any, method: str) -> Any:
    """An actor method's answer (its future is made and awaited on the stack's loop)."""
    return await getattr(proxy, method)()


def _direct(server: VLLMServer, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """The server's own greedy answer, asked without dynask in between."""
    model = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    answer: dict[str, Any] = httpx.post(
        f"{server.url}/v1/completions", json=body, timeout=300
    ).json()
    return answer["choices"][0]


def test_info_says_which_actors_report_kv_events(world: World, loop: LoopThread) -> None:
    infos = {
        name: ActorInfo.from_dict(loop.run(_actor_call(proxy, "start")))
        for name, proxy in world.proxies.items()
    }
    assert {name: info.engine for name, info in infos.items()} == dict.fromkeys(infos, "openai")
    assert {name: info.kv_events for name, info in infos.items()} == {
        "fwd-0": False,
        "fwd-1": False,
        "fwd-kv": True,
        "fwd-x": False,
    }
    assert infos["fwd-kv"].kv_block_size == BLOCK_SIZE
    assert infos["fwd-0"].max_model_len == 2048  # the server's, from its /v1/models
    # The server's cache as approximate routing models it: its size from its metrics,
    # and vLLM's plain LRU.
    with httpx.Client(timeout=10) as client:
        server = probe(client, f"{world.main.url}/v1", None)
    assert server.block_size == BLOCK_SIZE and server.num_kv_blocks > 0
    expected = server.num_kv_blocks * BLOCK_SIZE
    on_main = ("fwd-0", "fwd-1", "fwd-kv")
    assert {name: infos[name].kv_cache_tokens for name in on_main} == dict.fromkeys(
        on_main, expected
    )
    assert {info.kv_protected_share for info in infos.values()} == {0.0}


def test_completion_is_the_servers_own_answer(world: World, loop: LoopThread) -> None:
    prompt = tokens(1, 2)
    reference = _direct(world.main, prompt, 12)

    reply = loop.run(world.approx.complete(prompt, max_tokens=12, temperature=0))

    assert reply.choices[0].text == reference["text"]
    assert reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(prompt), 12)


def test_streamed_chat_equals_the_whole_answer(world: World, loop: LoopThread) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]

    async def both() -> tuple[Any, list[str], Any]:
        client = world.approx.openai
        whole = await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=10,
            temperature=0,  # type: ignore[arg-type]
        )
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        return whole, pieces, usage

    whole, pieces, usage = loop.run(both())

    assert len(pieces) > 1
    assert "".join(pieces) == whole.choices[0].message.content
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_string_ends_the_text_before_it(world: World, loop: LoopThread) -> None:
    async def ask() -> Any:
        return await world.approx.openai.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=20, temperature=0, stop=["."]
        )

    reply = loop.run(ask())

    assert reply.choices[0].text == " Paris"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == 2  # " Paris" and "."


def test_logprobs_are_the_servers(world: World, loop: LoopThread) -> None:
    prompt = tokens(2, 1)

    async def ask() -> Any:
        return await world.approx.openai.completions.create(
            model=MODEL, prompt=prompt, max_tokens=3, temperature=0, logprobs=2
        )

    reply = loop.run(ask())
    model = httpx.get(f"{world.main.url}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 2}
    direct = httpx.post(f"{world.main.url}/v1/completions", json=body, timeout=300).json()

    ours, theirs = reply.choices[0].logprobs, direct["choices"][0]["logprobs"]
    assert ours.tokens == theirs["tokens"]
    assert ours.token_logprobs == pytest.approx(theirs["token_logprobs"], abs=1e-4)
    assert [list(top) for top in ours.top_logprobs] == [list(top) for top in theirs["top_logprobs"]]


def test_structured_output_is_refused_by_name(world: World, loop: LoopThread) -> None:
    async def ask() -> None:
        await world.approx.openai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_object"},
        )

    with pytest.raises(openai.BadRequestError) as refused:
        loop.run(ask())
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == "response_format"  # type: ignore[index]
    assert "out=openai" in refused.value.body["message"]  # type: ignore[index]


def test_client_disconnect_frees_the_request_on_the_server(world: World, loop: LoopThread) -> None:
    async def open_and_leave() -> float:
        stream = await world.approx.openai.completions.create(
            model=MODEL,
            prompt=tokens(3, 1),
            max_tokens=1500,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        seen = 0
        async for chunk in stream:
            seen += bool(chunk.choices and chunk.choices[0].text)
            if seen == 2:
                break
        running = await asyncio.to_thread(world.main.metric, "vllm:num_requests_running")
        await stream.close()
        return running

    assert loop.run(open_and_leave()) == 1.0  # the request was on the server
    deadline = time.monotonic() + 60
    while world.main.metric("vllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert world.main.metric("vllm:num_requests_running") == 0.0
    stats = [loop.run(_actor_call(world.proxies[name], "stats")) for name in ("fwd-0", "fwd-1")]
    assert [s["num_running"] for s in stats] == [0, 0]


def test_approximate_routing_sends_a_repeated_prefix_to_the_same_actor(
    world: World, loop: LoopThread
) -> None:
    prompt = tokens(4, 4)  # four blocks of the router's 16 tokens

    async def twice() -> tuple[dict[str, Any], dict[str, Any]]:
        await world.approx.complete(prompt, max_tokens=1)
        (first,) = await world.approx.decisions()
        await world.approx.complete([*prompt, 7, 8, 9], max_tokens=1)
        (second,) = await world.approx.decisions()
        return first, second

    first, second = loop.run(twice())

    assert set(overlaps(first).values()) == {0}
    winner = first["winner"]
    other = ({"fwd-0", "fwd-1"} - {winner}).pop()
    assert second["winner"] == winner
    assert overlaps(second) == {winner: 4, other: 0}


def test_kv_events_of_the_server_feed_the_router(world: World, loop: LoopThread) -> None:
    prompt = tokens(5, 6)  # 96 tokens: three of the server's 32-token blocks
    routing = world.kv.routing
    hashes = routing.local_hashes(prompt)
    assert routing.block_size == BLOCK_SIZE and len(hashes) == 3

    first = loop.run(world.kv.complete(prompt, max_tokens=1))
    deadline = time.monotonic() + 30
    while routing.find_matches(hashes) != {"fwd-kv": 3} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert routing.find_matches(hashes) == {"fwd-kv": 3}

    again = loop.run(world.kv.complete(prompt, max_tokens=1))
    (decision,) = loop.run(world.kv.decisions())
    assert overlaps(decision) == {"fwd-kv": 3}
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # vLLM recomputes a prompt's last token: 95 cacheable tokens, two whole blocks
    assert again.usage.prompt_tokens_details.cached_tokens == 64


def test_killed_server_moves_the_stream_to_another_actor(world: World, loop: LoopThread) -> None:
    prompt = tokens(6, 1, extra=4)
    reference = _direct(world.main, prompt, 40)

    async def migrate() -> tuple[str, int, str, ActorHandle]:
        async with serving_stack([world.proxies["fwd-x"]]) as stack:
            stream = await stack.openai.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=40,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            pieces: list[str] = []
            usage = 0
            survivor = await _join(stack, world.proxies["fwd-0"])
            try:
                async for chunk in stream:
                    if chunk.choices:
                        pieces.append(chunk.choices[0].text)
                        if len([p for p in pieces if p]) == 5:
                            await asyncio.to_thread(world.doomed.kill)
                    if chunk.usage is not None:
                        usage = chunk.usage.completion_tokens
            finally:
                await survivor.close()
            lost = stack.handle("fwd-x")
            return "".join(pieces), usage, str(lost.lost_reason), lost

    text, usage, reason, lost = loop.run(migrate(), timeout=600)

    assert lost.broken and reason == "stream_closed"
    assert usage == 40
    assert text == reference["text"]


async def _join(stack: Stack, proxy: Any) -> ActorHandle:
    """A second actor joins the stack's model (so the first one is where a request goes)."""
    info = ActorInfo.from_dict(await proxy.start())
    handle = ActorHandle(name=info.name, deployment="d", proxy=proxy, info=info)
    await handle.connect()
    stack.service.add_actor(MODEL, handle)
    return handle


def test_dynask_run_out_openai_serves_the_servers_answer(world: World, tmp_path: Path) -> None:
    prompt = tokens(7, 2)
    reference = _direct(world.main, prompt, 8)
    args = [
        f"out=openai:{world.main.url}/v1",
        "--kv-events-endpoint",
        world.main.kv_events_endpoint,
    ]

    with dynask_run(tmp_path, args) as (base, _):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        reply = client.completions.create(
            model="SmolLM2-135M-Instruct",
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        (engine,) = httpx.get(f"{base}/v1/engines", timeout=30).json()

    assert reply.choices[0].text == reference["text"]
    stats = engine["stats"]
    assert (stats["prompt_tokens"], stats["generated_tokens"]) == (len(prompt), 8)
    assert stats["num_running"] == 0
