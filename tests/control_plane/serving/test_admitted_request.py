"""One owner per request: each path a request ends on gives back what it held exactly once.

An admitted request holds an admission slot, its count in its actor's load and, when
disaggregated, a prefill plan (the prefill actor's load). Every release call is counted
here, per request id, on real engine actors (the mocker, on an in-process Dask cluster)
served over HTTP to the official client: the counts must be exactly one per thing held,
and zero for anything a refused request never took.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from dynask.actors.api.sampling_params import SamplingParams
from dynask.control_plane.disagg.orchestrator import DisaggOptions, DisaggOrchestrator
from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.routing.model_routing import ModelRouting
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.serving.admission import Admission, AdmissionRefusedError
from dynask.control_plane.serving.admitted_request import AdmittedRequest
from dynask.control_plane.serving.errors import UnavailableError
from dynask.control_plane.serving.metrics import ServingMetrics
from dynask.control_plane.serving.placer import Placer
from dynask.control_plane.serving.request import PreparedRequest, ServedModel
from tests.control_plane.routing_stack import (
    MODEL,
    Stack,
    cluster_with_actors,
    serving_stack,
    tokens,
)

pytestmark = pytest.mark.slow  # each test starts a cluster with engine actors

SLOW_MOCKER = {"speedup_ratio": 1.0, "num_kv_blocks": 256}  # ~6 ms per token: streams last
LONG = 400  # tokens: a stream that is surely still running when the test acts on it


class Releases:
    """Counts, per key, the release calls of the service's admission and every actor's
    load (a prefill plan releases its prefill actor's load under ``ID/prefill``)."""

    def __init__(self, stack: Stack) -> None:
        self.admission: Counter[str] = Counter()
        self.load: dict[str, Counter[str]] = {h.name: Counter() for h in stack.handles}
        _count_calls(stack.service.admission, self.admission)
        for handle in stack.handles:
            _count_calls(handle.load, self.load[handle.name])

    def loads(self) -> dict[str, dict[str, int]]:
        """The actors whose load was released, and how often per key."""
        return {name: dict(counts) for name, counts in self.load.items() if counts}


def _count_calls(target: Any, counts: Counter[str]) -> None:
    release = target.release

    def counted(key: str) -> None:
        counts[key] += 1
        release(key)

    target.release = counted


def _run(
    folder: Path,
    body: Callable[[Stack, Releases], Awaitable[None]],
    actors: int = 1,
    engine_args: dict[str, Any] | None = None,
    **stack_options: Any,
) -> None:
    async def main() -> None:
        async with (
            cluster_with_actors(folder, actors, engine_args=engine_args) as proxies,
            serving_stack(proxies, **stack_options) as stack,
        ):
            await body(stack, Releases(stack))

    asyncio.run(main())


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _open_stream(stack: Stack, prompt: list[int], max_tokens: int = LONG) -> Any:
    return await stack.openai.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=max_tokens,
        stream=True,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )


async def _first_text(stream: Any) -> str:
    """Reads up to the first chunk with text; returns the request id."""
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            return str(chunk.id)
    raise AssertionError("the stream ended before any text")


def test_a_finished_request_releases_slot_and_load_once(tokenizer_folder: Path) -> None:
    async def body(stack: Stack, releases: Releases) -> None:
        reply = await stack.complete(tokens(seed=1, blocks=2), max_tokens=4)
        [actor] = stack.handles

        assert releases.admission == {reply.id: 1}
        assert releases.loads() == {actor.name: {reply.id: 1}}
        assert (stack.service.admission.in_flight, actor.in_flight) == (0, 0)

    _run(tokenizer_folder, body)


def test_a_client_that_leaves_releases_slot_and_load_once(tokenizer_folder: Path) -> None:
    async def body(stack: Stack, releases: Releases) -> None:
        stream = await _open_stream(stack, tokens(seed=2, blocks=2))
        request_id = await _first_text(stream)
        await stream.close()  # the client goes away mid-stream
        [actor] = stack.handles
        await _until(lambda: not actor.in_flight and request_id in releases.admission, "release")

        assert releases.admission == {request_id: 1}
        assert releases.loads() == {actor.name: {request_id: 1}}
        assert stack.service.admission.in_flight == 0

    _run(tokenizer_folder, body, engine_args=SLOW_MOCKER)


def test_an_engine_lost_for_good_releases_slot_and_load_once(tokenizer_folder: Path) -> None:
    async def body(stack: Stack, releases: Releases) -> None:
        stream = await _open_stream(stack, tokens(seed=3, blocks=2))
        request_id = await _first_text(stream)
        await stack.proxies[0].stop()  # its token stream closes, as a dying worker's does
        with pytest.raises(openai.APIError, match="--migration-limit 0"):
            async for _ in stream:
                pass
        [actor] = stack.handles

        assert releases.admission == {request_id: 1}
        assert releases.loads() == {actor.name: {request_id: 1}}
        assert (stack.service.admission.in_flight, actor.in_flight) == (0, 0)

    _run(
        tokenizer_folder,
        body,
        engine_args=SLOW_MOCKER,
        reliability=ReliabilityOptions(migration_limit=0),
    )


def test_a_moved_request_releases_each_actor_once_and_its_slot_once(
    tokenizer_folder: Path,
) -> None:
    async def body(stack: Stack, releases: Releases) -> None:
        stream = await _open_stream(stack, tokens(seed=4, blocks=2))
        request_id = await _first_text(stream)
        lost = next(h for h in stack.handles if h.in_flight)
        other = next(h for h in stack.handles if h is not lost)
        await stack.proxies[stack.handles.index(lost)].stop()
        async for _ in stream:  # the stream goes on, on the other actor
            pass

        assert releases.admission == {request_id: 1}
        assert releases.loads() == {
            lost.name: {request_id: 1},
            other.name: {f"{request_id}-m1": 1},
        }
        assert (stack.service.admission.in_flight, other.in_flight) == (0, 0)

    _run(tokenizer_folder, body, actors=2, engine_args=SLOW_MOCKER)


def test_a_disaggregated_request_releases_its_prefill_plan_once(tokenizer_folder: Path) -> None:
    async def body(stack: Stack, releases: Releases) -> None:
        reply = await stack.complete(tokens(seed=5, blocks=4), max_tokens=4)
        await stack.service.disagg.wait_idle()
        prefill, decode = stack.handles

        assert stack.service.disagg.counters["remote_prefills"] == 1
        assert releases.admission == {reply.id: 1}
        assert releases.loads() == {
            prefill.name: {f"{reply.id}/prefill": 1},
            decode.name: {reply.id: 1},
        }
        assert (prefill.in_flight, decode.in_flight) == (0, 0)

    _run(
        tokenizer_folder,
        body,
        actors=2,
        disagg=DisaggOptions(min_remote_prefill_tokens=1),
        roles=["prefill", "decode"],
    )


def test_a_request_refused_by_admission_takes_and_releases_nothing(
    tokenizer_folder: Path,
) -> None:
    async def body(stack: Stack, releases: Releases) -> None:
        stream = await _open_stream(stack, tokens(seed=6, blocks=2))
        held = await _first_text(stream)
        with pytest.raises(openai.APIStatusError) as refused:
            await stack.complete(tokens(seed=7, blocks=2), max_tokens=4)
        assert refused.value.status_code == 503
        assert releases.admission == {} and releases.loads() == {}  # it took nothing
        await stream.close()
        [actor] = stack.handles
        await _until(lambda: not actor.in_flight and held in releases.admission, "release")

        assert releases.admission == {held: 1}
        assert releases.loads() == {actor.name: {held: 1}}

    _run(
        tokenizer_folder,
        body,
        engine_args=SLOW_MOCKER,
        reliability=ReliabilityOptions(max_in_flight=1, admission_wait_s=0),
    )


def test_at_the_limit_a_request_waits_for_the_slot_and_gets_it(tokenizer_folder: Path) -> None:
    async def body(stack: Stack, releases: Releases) -> None:
        stream = await _open_stream(stack, tokens(seed=8, blocks=2))
        held = await _first_text(stream)
        waiting = asyncio.create_task(stack.complete(tokens(seed=9, blocks=2), max_tokens=4))
        await _until(lambda: len(stack.service.admission.waiting) == 1, "waiting")
        assert not waiting.done() and releases.admission == {}
        await stream.close()  # its slot goes to the waiter
        reply = await waiting
        assert reply.usage.completion_tokens == 4
        await _until(lambda: len(releases.admission) == 2, "release")
        assert list(releases.admission.values()) == [1, 1] and held in releases.admission
        metrics = (await stack.http.get("/metrics")).text
        assert 'dynask_admission_wait_seconds_count{priority="normal",tenant="anonymous"} 2.0' in (
            metrics
        )

    _run(
        tokenizer_folder,
        body,
        engine_args=SLOW_MOCKER,
        reliability=ReliabilityOptions(max_in_flight=1, admission_wait_s=30),
    )


def _prepared(model: ServedModel, request_id: str) -> PreparedRequest:
    return PreparedRequest(request_id, model, list(range(40)), SamplingParams(max_tokens=4))


def test_choices_wait_for_room_for_all_of_them_and_too_many_are_a_400(
    tokenizer_folder: Path,
) -> None:
    async def body(stack: Stack, releases: Releases) -> None:
        stream = await _open_stream(stack, tokens(seed=10, blocks=2))
        held = await _first_text(stream)
        # n=2 at --max-in-flight 2 with one running: it waits for both slots, not one.
        waiting = asyncio.create_task(stack.complete(tokens(seed=11, blocks=2), n=2))
        await _until(lambda: stack.service.admission.waiters == 1, "waiting")
        assert stack.service.admission.in_flight == 1 and releases.admission == {}
        with pytest.raises(openai.BadRequestError) as refused:
            await stack.complete(tokens(seed=12, blocks=2), n=3)
        body = refused.value.body
        assert isinstance(body, dict) and body["param"] == "n"
        assert body["message"] == (
            "this request asks for 3 choices (1 prompt(s) x 3), generated together; this "
            "server lets at most 2 requests be in flight (--max-in-flight)"
        )
        await stream.close()  # its slot, with the free one, goes to both choices
        reply = await waiting
        assert [c.index for c in reply.choices] == [0, 1]
        assert reply.usage.completion_tokens == 8
        await _until(lambda: len(releases.admission) == 3, "release")
        assert list(releases.admission.values()) == [1, 1, 1] and held in releases.admission

    _run(
        tokenizer_folder,
        body,
        engine_args=SLOW_MOCKER,
        reliability=ReliabilityOptions(max_in_flight=2, admission_wait_s=30),
    )


def test_a_request_no_actor_can_take_gives_its_slot_back_once() -> None:
    metrics = ServingMetrics()
    model = ServedModel(MODEL, None, ModelRouting(MODEL, RoutingOptions(), metrics))
    admission = Admission(max_in_flight=1, max_queued_prefill_tokens=None)
    released: Counter[str] = Counter()
    _count_calls(admission, released)
    placer = Placer(DisaggOrchestrator(), metrics)

    with pytest.raises(UnavailableError) as caught:
        AdmittedRequest.admit(_prepared(model, "r1"), admission, placer)

    assert (caught.value.code, caught.value.retry_after_s) == ("no_ready_engine", 1)
    assert released == {"r1": 1}
    assert (admission.in_flight, admission.queued_prefill_tokens) == (0, 0)
    # The slot is free again: the next request is admitted as far as its placement.
    with pytest.raises(UnavailableError):
        AdmittedRequest.admit(_prepared(model, "r2"), admission, placer)
    assert released == {"r1": 1, "r2": 1}


def test_a_request_refused_at_the_limit_holds_nothing_to_release() -> None:
    metrics = ServingMetrics()
    model = ServedModel(MODEL, None, ModelRouting(MODEL, RoutingOptions(), metrics))
    admission = Admission(max_in_flight=1, max_queued_prefill_tokens=None)
    admission.admit("busy", 10)
    released: Counter[str] = Counter()
    _count_calls(admission, released)

    with pytest.raises(AdmissionRefusedError) as caught:
        AdmittedRequest.admit(
            _prepared(model, "r1"), admission, Placer(DisaggOrchestrator(), metrics)
        )

    assert (caught.value.code, caught.value.limit) == ("overloaded", "in_flight")
    assert released == {} and admission.in_flight == 1 and "r1" not in admission
