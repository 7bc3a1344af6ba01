"""``POST /v1/engines/reset_prefix_cache`` as a user meets it: real mocker actors on an
in-process Dask cluster, the OpenAI API and the endpoint over HTTP, the router's
decisions before and after."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from dynask.control_plane.routing.routing_options import RoutingOptions
from tests.control_plane.routing_stack import (
    MODEL,
    Stack,
    cluster_with_actors,
    overlaps,
    serving_stack,
    tokens,
)

RESET = "/v1/engines/reset_prefix_cache"
ACTORS = ("mock-0", "mock-1")


def _run(
    folder: Path,
    body: Callable[[Stack], Awaitable[None]],
    engine: str = "mocker",
    engine_args: dict[str, Any] | None = None,
    routing: RoutingOptions | None = None,
) -> None:
    async def main() -> None:
        async with (
            cluster_with_actors(folder, len(ACTORS), engine, engine_args) as proxies,
            serving_stack(proxies, routing) as stack,
        ):
            await body(stack)

    asyncio.run(main())


def test_after_a_reset_the_engines_and_the_router_start_cold(smollm2_folder: Path) -> None:
    async def body(stack: Stack) -> None:
        prompt = tokens(seed=7, blocks=6, extra=8)
        await stack.complete(prompt)
        hit = await stack.complete(prompt)
        assert hit.usage.prompt_tokens_details.cached_tokens == 96  # 6 blocks of 16

        answer = await stack.http.post(RESET)

        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "reset": True,
            "engines": [
                {"name": name, "model": MODEL, "reset": True, "reason": None} for name in ACTORS
            ],
        }
        cold = await stack.complete(prompt)
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
        [decision] = await stack.decisions()
        assert overlaps(decision) == dict.fromkeys(ACTORS, 0)  # the index forgot them too
        again = await stack.complete(prompt)
        assert again.usage.prompt_tokens_details.cached_tokens == 96

    _run(smollm2_folder, body)


def test_an_engine_with_a_request_running_says_so_with_409(smollm2_folder: Path) -> None:
    slow = {"speedup_ratio": 1.0, "num_kv_blocks": 256}  # 5.7 ms per decode step

    async def body(stack: Stack) -> None:
        stream = await stack.openai.completions.create(
            model=MODEL,
            prompt=tokens(seed=8, blocks=2),
            max_tokens=1000,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        await stream.__aiter__().__anext__()  # decoding now: its blocks are held
        [decision] = await stack.decisions()
        busy = decision["winner"]

        answer = await stack.http.post(RESET, params={"model": MODEL})

        assert answer.status_code == 409
        body = answer.json()
        assert body["error"]["code"] == "engines_busy"
        assert body["error"]["message"] == (
            f"1 of 2 engines did not reset: {busy}: requests hold KV blocks; retry once they finish"
        )
        by_name = {e["name"]: e for e in body["engines"]}
        assert by_name[busy]["reset"] is False
        assert [e["reset"] for n, e in by_name.items() if n != busy] == [True]
        await stream.close()  # aborted: its blocks are freed
        for _ in range(200):
            answer = await stack.http.post(RESET)
            if answer.status_code == 200:
                break
            await asyncio.sleep(0.01)
        assert answer.status_code == 200

    _run(smollm2_folder, body, engine_args=slow)


@pytest.mark.parametrize(
    ("params", "content", "status", "message"),
    [
        ({"model": "nope"}, b"", 404, "the model 'nope' is not served; available: "),
        ({"modle": MODEL}, b"", 400, "unknown query field 'modle'; only 'model'"),
        ({}, b'{"model": "x"}', 400, "this endpoint takes no body; name one model with ?model="),
    ],
)
def test_what_the_endpoint_refuses_is_named(
    smollm2_folder: Path, params: dict[str, str], content: bytes, status: int, message: str
) -> None:
    async def body(stack: Stack) -> None:
        answer = await stack.http.post(RESET, params=params, content=content)

        assert answer.status_code == status
        assert answer.json()["error"]["message"].startswith(message)

    _run(smollm2_folder, body)


def test_without_kv_events_the_router_forgets_where_prompts_went(smollm2_folder: Path) -> None:
    async def body(stack: Stack) -> None:
        prompt = tokens(seed=9, blocks=4)
        await stack.complete(prompt)
        await stack.complete(prompt)
        [routed] = await stack.decisions()
        assert max(overlaps(routed).values()) == 4  # the approximate index remembered

        answer = await stack.http.post(RESET)

        assert answer.status_code == 409  # echo engines keep no prefix cache
        reasons = {e["reason"] for e in answer.json()["engines"]}
        assert reasons == {"out=echo has no prefix cache this actor can empty"}
        await stack.complete(prompt)
        [decision] = await stack.decisions()
        assert max(overlaps(decision).values()) == 4  # nothing was reset: still assumed

    _run(smollm2_folder, body, engine="echo", engine_args={})
