"""Request migration as a client sees it: an actor stops mid-stream, the stream goes on.

Real engine actors (the built-in engine on the tiny random Llama, greedy) on an
in-process Dask cluster, the app under uvicorn, the official ``openai`` client. Stopping
an actor closes its token stream, as a dying worker's does; the end-to-end tests with
``kill -9`` and ``SIGSTOP`` of real worker processes are in ``test_worker_loss.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from dynask.control_plane.reliability.options import ReliabilityOptions
from tests.control_plane.routing_stack import (
    MODEL,
    Stack,
    cluster_with_actors,
    serving_stack,
    tokens,
)

pytestmark = pytest.mark.slow  # starts a cluster with two engine actors

TINY = {"kv_cache_gib": 0.05}
MAX_TOKENS = 160
_OUTPUT_TOKENS = f'dynask_output_tokens_total{{model="{MODEL}"}}'


def _run(
    folder: Path,
    body: Callable[[Stack], Awaitable[None]],
    reliability: ReliabilityOptions | None = None,
) -> None:
    async def main() -> None:
        async with (
            cluster_with_actors(folder, 2, "torch", TINY) as proxies,
            serving_stack(proxies, reliability=reliability) as stack,
        ):
            await body(stack)

    asyncio.run(main())


async def _open(stack: Stack, prompt: list[int], **extra: Any) -> Any:
    return await stack.openai.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, **extra},
        **({"temperature": 0.0} if "temperature" not in extra else {}),
    )


async def _finish(stream: Any, text: list[str]) -> tuple[str, int]:
    """Reads the rest of a stream; returns its whole text and completion tokens."""
    usage = 0
    async for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].text)
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return "".join(text), usage


async def _first_text(stream: Any) -> list[str]:
    """Reads up to the first chunk with text; returns the text read."""
    text: list[str] = []
    async for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].text)
            if chunk.choices[0].text:
                return text
    raise AssertionError("the stream ended before any text")


async def _stop_busiest(stack: Stack) -> str:
    victim = max(stack.handles, key=lambda h: h.in_flight)
    assert victim.in_flight > 0
    await stack.proxies[stack.handles.index(victim)].stop()  # its token stream closes
    return victim.name


def test_streams_continue_on_the_other_actor_with_the_same_greedy_tokens(
    tiny_llama_folder: Path,
) -> None:
    prompts = [tokens(seed=100 + i, blocks=1, extra=i) for i in range(6)]

    async def body(stack: Stack) -> None:
        undisturbed = []
        for prompt in prompts:
            undisturbed.append(await _finish(await _open(stack, prompt), []))
        assert all(count == MAX_TOKENS for _, count in undisturbed)

        streams = [await _open(stack, prompt) for prompt in prompts]
        shown = [await _first_text(stream) for stream in streams]
        victim = await _stop_busiest(stack)
        moved = await asyncio.gather(*(_finish(s, t) for s, t in zip(streams, shown, strict=True)))

        assert moved == undisturbed  # same text, every token counted once
        metrics = (await stack.http.get("/metrics")).text
        migrations = _metric(metrics, f'dynask_migrations_total{{model="{MODEL}"}}')
        assert 1 <= migrations <= len(prompts)
        assert stack.handle(victim).broken

    _run(tiny_llama_folder, body)


def test_sampled_requests_move_and_seeded_ones_continue_exactly(tiny_llama_folder: Path) -> None:
    seeded_prompts = [tokens(seed=200 + i, blocks=1, extra=i) for i in range(3)]
    unseeded_prompts = [tokens(seed=210 + i, blocks=1, extra=i) for i in range(3)]

    async def body(stack: Stack) -> None:
        undisturbed = []
        for i, prompt in enumerate(seeded_prompts):
            stream = await _open(stack, prompt, temperature=1.0, seed=7 + i)
            undisturbed.append(await _finish(stream, []))
        before = _metric((await stack.http.get("/metrics")).text, _OUTPUT_TOKENS)

        streams = [
            await _open(stack, prompt, temperature=1.0, seed=7 + i)
            for i, prompt in enumerate(seeded_prompts)
        ] + [await _open(stack, prompt, temperature=1.0) for prompt in unseeded_prompts]
        shown = [await _first_text(stream) for stream in streams]
        await _stop_busiest(stack)
        moved = await asyncio.gather(
            *(_finish(s, list(t)) for s, t in zip(streams, shown, strict=True))
        )

        assert moved[:3] == undisturbed  # seeded: token for token
        for (text, count), seen in zip(moved[3:], shown[3:], strict=True):
            assert count == MAX_TOKENS and text.startswith("".join(seen))
        metrics = (await stack.http.get("/metrics")).text
        assert _metric(metrics, f'dynask_migrations_total{{model="{MODEL}"}}') >= 1
        # Every token counted once, regenerated ones included.
        assert _metric(metrics, _OUTPUT_TOKENS) - before == 6 * MAX_TOKENS

    _run(tiny_llama_folder, body)


def test_the_migration_limit_ends_a_request_with_a_clear_error(tiny_llama_folder: Path) -> None:
    async def body(stack: Stack) -> None:
        stream = await _open(stack, tokens(seed=300, blocks=1))
        await _first_text(stream)
        victim = await _stop_busiest(stack)

        with pytest.raises(openai.APIError) as caught:
            await _finish(stream, [])

        assert f"engine actor {victim} was lost" in str(caught.value)
        assert "has already moved 0 times (--migration-limit 0)" in str(caught.value)
        reply = await stack.complete(tokens(seed=301, blocks=1))  # the other actor serves
        assert reply.usage.completion_tokens == 4

    _run(tiny_llama_folder, body, ReliabilityOptions(migration_limit=0))


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")
