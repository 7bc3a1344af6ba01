"""``out=vllm`` as a user meets it: two vLLM engines (vLLM's CPU build, float32) in actors
on a real in-process Dask cluster, KV-aware routing over their KV events, the official
``openai`` client over HTTP.

The engines take about half a minute each to start, so one stack serves the module: its
event loop runs in a thread of its own, and each test hands it coroutines.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dynask.actors.api.sampling_params import SamplingParams
from tests.actors.engine.helpers import hf_greedy, hf_model, make_engine
from tests.control_plane.routing_stack import (
    MODEL,
    Stack,
    cluster_with_actors,
    overlaps,
    serving_stack,
    tokens,
)

pytestmark = pytest.mark.slow

VLLM_ARGS = {"block_size": 32, "kv_cache_gib": 0.25, "max_model_len": 2048, "max_num_seqs": 8}
PROMPT_TEXT = "The capital of France is Paris. The capital of Germany is"
T = TypeVar("T")


class LoopThread:
    """An event loop in a daemon thread; ``run`` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def stack(loop: LoopThread, smollm2_folder: Path) -> Iterator[Stack]:
    """The stack lives in ONE task from start to close (Dask's client keeps context vars)."""
    ready: concurrent.futures.Future[Stack] = concurrent.futures.Future()
    done = asyncio.Event()

    async def hold() -> None:
        async with cluster_with_actors(smollm2_folder, 2, "vllm", VLLM_ARGS) as proxies:
            await asyncio.gather(*(proxy.start() for proxy in proxies))  # both at once
            async with serving_stack(proxies) as opened:
                ready.set_result(opened)
                await done.wait()

    held = asyncio.run_coroutine_threadsafe(hold(), loop.loop)
    held.add_done_callback(lambda f: f.exception() and ready.set_exception(f.exception()))  # type: ignore[arg-type]
    try:
        yield ready.result(timeout=600)
    finally:
        loop.loop.call_soon_threadsafe(done.set)
        held.result(timeout=120)


@pytest.fixture(scope="module")
def prompt_ids(smollm2_folder: Path) -> list[int]:
    from transformers import AutoTokenizer

    ids: list[int] = AutoTokenizer.from_pretrained(smollm2_folder).encode(PROMPT_TEXT)
    return ids


def test_greedy_text_equals_the_builtin_engine_and_hf(
    stack: Stack, loop: LoopThread, smollm2_folder: Path, prompt_ids: list[int]
) -> None:
    reply = loop.run(stack.complete(prompt_ids, max_tokens=16, temperature=0))

    reference = hf_greedy(hf_model(smollm2_folder), prompt_ids, 16)
    builtin = make_engine(smollm2_folder)
    builtin.start()
    try:
        ours = builtin.add_request(prompt_ids, SamplingParams(16, 0.0, ignore_eos=True))
        ours.wait(timeout=120)
    finally:
        builtin.shutdown()
    assert ours.token_ids == reference
    assert reply.choices[0].text == ours.text
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(prompt_ids)
    assert reply.usage.completion_tokens == 16


def test_streaming_gives_the_same_text_in_pieces(
    stack: Stack, loop: LoopThread, prompt_ids: list[int]
) -> None:
    async def both() -> tuple[str, list[str], str | None]:
        whole = await stack.complete(prompt_ids, max_tokens=12, temperature=0)
        stream = await stack.openai.completions.create(
            model=MODEL, prompt=prompt_ids, max_tokens=12, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        pieces, finish = [], None
        async for chunk in stream:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        return whole.choices[0].text, pieces, finish

    whole, pieces, finish = loop.run(both())

    assert "".join(pieces) == whole
    assert len([p for p in pieces if p]) > 1
    assert finish == "length"


def test_chat_completion_answers_with_the_chat_template(stack: Stack, loop: LoopThread) -> None:
    reply = loop.run(
        stack.openai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24,
            temperature=0,
        )
    )

    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.choices[0].finish_reason == "stop"  # EOS, as vLLM saw it


def test_logprobs_penalties_and_logit_bias_reach_vllm(
    stack: Stack, loop: LoopThread, prompt_ids: list[int], smollm2_folder: Path
) -> None:
    from transformers import AutoTokenizer

    greedy: dict[str, Any] = dict(model=MODEL, temperature=0, extra_body={"ignore_eos": True})
    reply = loop.run(
        stack.openai.completions.create(prompt=prompt_ids, max_tokens=6, logprobs=3, **greedy)
    )
    biased = loop.run(
        stack.openai.completions.create(
            prompt=prompt_ids, max_tokens=3, logit_bias={"5000": 100}, **greedy
        )
    )
    penalised = loop.run(
        stack.openai.completions.create(
            prompt=prompt_ids,
            max_tokens=3,
            presence_penalty=2.0,
            # min_tokens is not an OpenAI parameter: it travels in the body's extras
            **{**greedy, "extra_body": {**greedy.get("extra_body", {}), "min_tokens": 2}},
        )
    )

    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    assert len(logprobs.tokens) == 6 and "".join(logprobs.tokens) == reply.choices[0].text
    for value, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert len(top) == 3 and value == pytest.approx(max(top.values()))  # greedy: the top
    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder)
    assert biased.choices[0].text == tokenizer.decode([5000] * 3)
    assert penalised.usage is not None and penalised.usage.completion_tokens == 3


def test_a_disconnect_aborts_the_request_inside_vllm(stack: Stack, loop: LoopThread) -> None:
    async def read_then_leave() -> list[dict[str, Any]]:
        stream = await stack.openai.completions.create(
            model=MODEL, prompt=tokens(seed=9, blocks=2), max_tokens=1500, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        received = 0
        async for _chunk in stream:
            received += 1
            if received == 3:
                break
        during = [await proxy.stats() for proxy in stack.proxies]
        await stream.close()
        return during

    during = loop.run(read_then_leave())
    assert sorted(s["num_running"] + s["num_waiting"] for s in during) == [0, 1]

    after = loop.run(_until_idle(stack.proxies))
    assert [s["num_running"] + s["num_waiting"] for s in after] == [0, 0]
    assert [s["kv_usage"] for s in after] == [0.0, 0.0]
    assert max(s["generated_tokens"] for s in after) < 1500


async def _until_idle(proxies: list[Any], timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        stats = [await proxy.stats() for proxy in proxies]
        if all(s["num_running"] + s["num_waiting"] == 0 for s in stats):
            return stats
        assert time.monotonic() < deadline, f"vLLM still holds the request: {stats}"
        await asyncio.sleep(0.1)


def test_a_shared_prefix_goes_to_the_engine_that_holds_it(stack: Stack, loop: LoopThread) -> None:
    prefix = tokens(seed=1, blocks=8)  # 128 tokens: 4 vLLM blocks of 32
    routing = stack.routing

    async def body() -> tuple[dict[str, Any], dict[str, int], dict[str, Any]]:
        await stack.complete(prefix + tokens(seed=2, blocks=0, extra=7))
        [first] = await stack.decisions()
        held = await _until_indexed(stack, prefix, first["winner"])
        await stack.complete(prefix + tokens(seed=3, blocks=0, extra=9))
        [second] = await stack.decisions()
        return first, held, second

    first, held, second = loop.run(body())

    assert first["mode"] == "kv"
    assert routing.block_size == 32
    assert held == {first["winner"]: 4}
    assert second["winner"] == first["winner"]
    assert overlaps(second)[first["winner"]] == 4


async def _until_indexed(
    stack: Stack, prefix: list[int], actor: str, timeout: float = 60
) -> dict[str, int]:
    """The router's view of ``prefix`` once ``actor``'s KV events have put it there."""
    routing = stack.routing
    hashes = routing.local_hashes(prefix)
    deadline = time.monotonic() + timeout
    while routing.find_matches(hashes).get(actor, 0) < len(hashes):
        assert time.monotonic() < deadline, f"no KV events of {actor} reached the router"
        await asyncio.sleep(0.05)
    return {name: n for name, n in routing.find_matches(hashes).items() if n}


STRUCTURED_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "rank": {"type": "integer", "minimum": 1, "maximum": 5},
        "tags": {"type": "array", "items": {"enum": ["big", "old"]}, "maxItems": 2},
        "code": {"type": "string", "pattern": "^[A-Z]{2}$"},
    },
    "required": ["city", "rank", "tags", "code"],
}


def test_structured_outputs_go_to_vllms_own(stack: Stack, loop: LoopThread) -> None:
    """The same spec as the built-in engine's: vLLM's structured outputs enforce it."""
    import json
    import re

    import jsonschema

    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": STRUCTURED_SCHEMA, "strict": True},
    }
    question = [{"role": "user", "content": "Describe Paris in JSON."}]

    async def three() -> tuple[Any, Any, Any]:
        chat = await stack.openai.chat.completions.create(
            model=MODEL, messages=question, max_tokens=80, temperature=0,
            response_format=response_format,
        )  # fmt: skip
        regex = await stack.openai.completions.create(
            model=MODEL, prompt=PROMPT_TEXT, max_tokens=10, temperature=0,
            extra_body={"guided_regex": r" [A-Z][a-z]+\."},
        )  # fmt: skip
        choice = await stack.openai.completions.create(
            model=MODEL, prompt=PROMPT_TEXT, max_tokens=5,
            extra_body={"structured_outputs": {"choice": [" Berlin", " Bonn"]}},
        )  # fmt: skip
        return chat, regex, choice

    chat, regex, choice = loop.run(three())

    jsonschema.validate(json.loads(chat.choices[0].message.content), STRUCTURED_SCHEMA)
    assert chat.choices[0].finish_reason == "stop"
    assert re.fullmatch(r" [A-Z][a-z]+\.", regex.choices[0].text)
    assert choice.choices[0].text in (" Berlin", " Bonn")


TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 30},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                },
                "required": ["city", "days"],
            },
        },
    },
]


def test_forced_tool_calls_go_through_vllms_structured_outputs(
    stack: Stack, loop: LoopThread
) -> None:
    """The tools' grammar (a structural tag in the Hermes format) reaches vLLM: forced
    calls validate, whole and streamed, and ``auto`` is served."""
    import json

    import jsonschema

    schema = TOOLS[0]["function"]["parameters"]
    named = {"type": "function", "function": {"name": "get_weather"}}
    ask: Any = [{"role": "user", "content": "What will the weather be in Paris?"}]
    kwargs: Any = {"model": MODEL, "messages": ask, "tools": TOOLS, "max_tokens": 60}

    async def calls() -> tuple[Any, Any, list[Any], Any]:
        required = await stack.openai.chat.completions.create(
            **kwargs, tool_choice="required", parallel_tool_calls=False, temperature=0
        )  # one call: then the grammar ends the output (SmolLM2 would repeat calls)
        forced = await stack.openai.chat.completions.create(
            **kwargs, tool_choice=named, temperature=1.0, seed=3
        )
        stream = await stack.openai.chat.completions.create(
            **kwargs, tool_choice=named, temperature=0, stream=True
        )
        pieces = [
            piece
            async for chunk in stream
            if chunk.choices
            for piece in chunk.choices[0].delta.tool_calls or []
        ]
        auto = await stack.openai.chat.completions.create(**kwargs, temperature=0)
        return required, forced, pieces, auto

    required, forced, pieces, auto = loop.run(calls(), timeout=300)

    for reply in (required, forced):
        assert reply.choices[0].finish_reason == "tool_calls"
        [call] = reply.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), schema)
    assert pieces[0].function.name == "get_weather"
    jsonschema.validate(json.loads("".join(p.function.arguments or "" for p in pieces)), schema)
    for call in auto.choices[0].message.tool_calls or []:  # auto: any call made validates
        jsonschema.validate(json.loads(call.function.arguments), schema)
