"""An internal error is a 500 in OpenAI's shape and the connection stays usable; a stream
that fails after its first chunk ends with an error event and ``[DONE]`` (issue 16).

A real stack (in-process Dask cluster, mocker actors, the app under uvicorn, pooled
clients). The faults are injected into it: a buggy graph Processor (the request hook, a
real extension point) and a failure of the pipeline after the first delta.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from dynask.control_plane.api.request_schema import GenerationRequest
from tests.control_plane.routing_stack import MODEL, Stack, cluster_with_actors, serving_stack


def _run(folder: Path, body: Callable[[Stack], Awaitable[None]]) -> None:
    async def main() -> None:
        async with (
            cluster_with_actors(folder, 1) as proxies,
            serving_stack(proxies) as stack,
        ):
            await body(stack)

    asyncio.run(main())


def _local_port(response: httpx.Response) -> int:
    """The client side's port of the connection that carried ``response``."""
    stream = response.extensions["network_stream"]
    return int(stream.get_extra_info("socket").getsockname()[1])


async def _buggy_processor(request: GenerationRequest) -> GenerationRequest:
    raise RuntimeError("the processor failed on \ud800")  # even its text cannot be encoded


@pytest.mark.slow
def test_a_500_keeps_the_pooled_connection_usable(smollm2_folder: Path) -> None:
    async def body(stack: Stack) -> None:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        ok = await stack.http.post("/v1/chat/completions", json=chat)
        assert ok.status_code == 200
        stack.service.request_hook = _buggy_processor

        failed = await stack.http.post("/v1/chat/completions", json=chat)
        after = await stack.http.get("/v1/models")

        assert failed.status_code == 500
        assert failed.json()["error"] == {
            "message": "internal error: RuntimeError: the processor failed on \\ud800",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
        assert after.status_code == 200
        assert _local_port(ok) == _local_port(failed) == _local_port(after)  # kept alive
        with pytest.raises(openai.InternalServerError):
            await stack.openai.chat.completions.create(**chat)
        stack.service.request_hook = None
        models = await stack.openai.models.list()  # the same pooled client goes on
        assert [m.id for m in models.data] == [MODEL]

    _run(smollm2_folder, body)


@pytest.mark.slow
def test_a_stream_that_fails_mid_way_ends_with_an_error_event_and_done(
    smollm2_folder: Path,
) -> None:
    async def body(stack: Stack) -> None:
        generate = stack.service.generate

        async def fails_after_one_delta(routed: Any) -> AsyncIterator[Any]:
            async for outputs in generate(routed):
                yield outputs
                raise ValueError("the pipeline broke mid-stream")

        stack.service.generate = fails_after_one_delta  # type: ignore[method-assign]
        request = {
            "model": MODEL,
            "prompt": [5, 6, 7, 8],
            "max_tokens": 20,
            "ignore_eos": True,
            "stream": True,
        }
        async with stack.http.stream("POST", "/v1/completions", json=request) as response:
            assert response.status_code == 200
            events = [line async for line in response.aiter_lines() if line.startswith("data: ")]

        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2].removeprefix("data: ")) == {
            "error": {
                "message": "internal error: ValueError: the pipeline broke mid-stream",
                "type": "server_error",
                "param": None,
                "code": "internal_error",
            }
        }
        assert "text" in json.loads(events[0].removeprefix("data: "))["choices"][0]
        after = await stack.http.get("/live")
        assert after.status_code == 200

    _run(smollm2_folder, body)
