"""Router replicas with disaggregated serving: two control planes in front of the same
prefill and decode actors (a real in-process Dask cluster, mocker actors, HTTP and the
official client). A remote prefill one of them plans is counted by the other on the
prefill actor until the prefill is over, as the decode request is on the decode actor;
a request aborted before its KV came ends there too; the prefills-per-actor bound holds
for both control planes together; a prefill actor of the release before that still
prefills for them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from dynask.actors.runtime.engine_actor import EngineActor
from dynask.control_plane.disagg.orchestrator import DisaggOptions
from dynask.control_plane.reliability.options import ReliabilityOptions
from tests.actors.engine.helpers import prompts_of_lengths
from tests.control_plane.disagg.test_disagg import ROLES, mockers
from tests.control_plane.routing_stack import MODEL, Stack, serving_stack, until

NO_MIGRATION = ReliabilityOptions(migration_limit=0)
STALLED_PREFILL = {"speedup_ratio": 1.0, "prefill_ms_base": 2000.0}  # each prefill step: 2 s


async def _stream(plane: Stack, prompt: list[int], max_tokens: int) -> None:
    reply = await plane.openai.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True
    )
    async for _ in reply:
        pass


@pytest.mark.slow  # two mocker actors and two control planes, ~10 s
def test_a_remote_prefill_counts_on_the_other_control_planes(tokenizer_folder: Path) -> None:
    options = DisaggOptions(min_remote_prefill_tokens=1)
    prompt = prompts_of_lengths([120], seed=7)[0]  # 7 full blocks of 16 and 8 tokens

    async def main() -> None:
        async with (
            mockers(tokenizer_folder, [STALLED_PREFILL, {}]) as proxies,
            serving_stack(proxies, disagg=options, roles=ROLES) as first,
            serving_stack(proxies, disagg=options, roles=ROLES) as second,
        ):
            reply = asyncio.create_task(first.complete(prompt))
            mine, theirs = first.handle("mock-0").load, second.handle("mock-0").peer_load
            await until(lambda: len(theirs) == 1, "the other control plane to hear the prefill")
            assert (theirs.waiting, theirs.prefill_blocks) == (1, mine.prefill_blocks)
            assert mine.prefill_blocks == 8  # the whole prompt, nothing cached
            assert len(first.handle("mock-0").peer_load) == 0  # its own: not counted twice
            assert len(second.handle("mock-1").peer_load) == 1  # the request, on decode

            completion = await reply
            assert completion.usage is not None and completion.usage.completion_tokens == 4
            await until(lambda: len(theirs) == 0, "the prefill to end on the other one")
            assert first.service.disagg.counters["remote_prefills"] == 1
            await until(lambda: len(second.handle("mock-1").peer_load) == 0, "the request's end")

    asyncio.run(main())


@pytest.mark.slow  # as the test above
def test_a_request_aborted_while_its_kv_is_awaited_ends_on_the_other_control_plane(
    tokenizer_folder: Path,
) -> None:
    """The decode actor never queues a request whose client left before its KV came: it
    publishes the request's end itself, or the other control plane would count it on the
    decode actor for ever."""
    options = DisaggOptions(min_remote_prefill_tokens=1)
    prompt = prompts_of_lengths([120], seed=8)[0]

    async def main() -> None:
        async with (
            mockers(tokenizer_folder, [STALLED_PREFILL, {}]) as proxies,
            serving_stack(proxies, disagg=options, roles=ROLES) as first,
            serving_stack(proxies, disagg=options, roles=ROLES) as second,
        ):
            client = asyncio.create_task(_stream(first, prompt, max_tokens=4))
            decoding, prefilling = (second.handle(n).peer_load for n in ("mock-1", "mock-0"))
            await until(lambda: len(decoding) == len(prefilling) == 1, "the peer to hear both")
            client.cancel()
            await asyncio.gather(client, return_exceptions=True)
            await until(lambda: len(decoding) == 0, "the aborted request's end")
            await until(lambda: len(prefilling) == 0, "the prefill's end (it ran on)")

    asyncio.run(main())


@pytest.mark.slow  # as the test above
def test_the_prefills_per_actor_bound_all_control_planes_together(tokenizer_folder: Path) -> None:
    options = DisaggOptions(min_remote_prefill_tokens=1, max_prefills_per_actor=1)
    first_prompt, second_prompt = prompts_of_lengths([120, 110], seed=9)

    async def main() -> tuple[dict[str, int], dict[str, int]]:
        async with (
            mockers(tokenizer_folder, [STALLED_PREFILL, {}]) as proxies,
            serving_stack(proxies, disagg=options, roles=ROLES) as first,
            serving_stack(proxies, disagg=options, roles=ROLES) as second,
        ):
            held = asyncio.create_task(first.complete(first_prompt))
            prefilling = second.handle("mock-0").peer_load
            await until(lambda: len(prefilling) == 1, "the peer to hear the prefill")
            # The prefill actor holds its one prefill (the first's): the decode actor
            # prefills the second's request itself.
            await second.complete(second_prompt)
            await held
            return dict(first.service.disagg.counters), dict(second.service.disagg.counters)

    firsts, seconds = asyncio.run(main())
    assert firsts == {"remote_prefills": 1, "blocks_moved": 7}
    assert seconds == {"local_prefill_busy": 1}


@pytest.mark.slow  # as the test above
def test_a_departed_control_planes_disaggregated_requests_are_aborted(
    tokenizer_folder: Path,
) -> None:
    """A disaggregated request is the decode actor's once it took it
    (``prepare_remote_prefill``): when the control plane that sent it goes away, the
    actor aborts it, as it does the requests submitted to it, while the other control
    plane's stay."""
    options = DisaggOptions(min_remote_prefill_tokens=1)
    long_decode = {"speedup_ratio": 1.0}  # 5.7 ms a step: 2,000 tokens take ~11 s
    gone_prompt, kept_prompt = prompts_of_lengths([120, 100], seed=10)

    async def main() -> None:
        async with (
            mockers(tokenizer_folder, [{}, long_decode]) as proxies,
            # Its request does not move on (nowhere to go: its handles are closed).
            serving_stack(proxies, disagg=options, roles=ROLES, reliability=NO_MIGRATION) as first,
            serving_stack(proxies, disagg=options, roles=ROLES) as second,
        ):
            decode = proxies[1]
            replies = [  # streamed: a client that leaves is noticed at once
                asyncio.create_task(_stream(plane, prompt, max_tokens=2000))
                for plane, prompt in ((first, gone_prompt), (second, kept_prompt))
            ]

            async def running() -> int:
                return int((await decode.stats())["num_running"])

            deadline = time.monotonic() + 10
            while await running() < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert await running() == 2
            for handle in first.handles:  # its process is gone: nobody reads its deltas
                await handle.close()
            deadline = time.monotonic() + 5
            while await running() > 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert await running() == 1  # the other control plane's runs on
            assert second.service.disagg.counters["remote_prefills"] == 1
            for reply in replies:
                reply.cancel()
            await asyncio.gather(*replies, return_exceptions=True)

    asyncio.run(main())


class PrefillActorBeforeSharing(EngineActor):
    """A prefill actor of the release before prefills were shared between control planes
    (a rolling upgrade that started with the control planes): no
    ``shares_prefill_routings`` in its info, no ``routed`` argument to ``prefill_remote``."""

    async def start(self) -> dict[str, Any]:
        info = await super().start()
        return {key: value for key, value in info.items() if key != "shares_prefill_routings"}

    async def prefill_remote(  # type: ignore[override]  # the old signature
        self, ticket: bytes, packed_request: bytes, timeout_s: float | None = None
    ) -> int:
        return await super().prefill_remote(ticket, packed_request, timeout_s)


@pytest.mark.slow  # as the test above
def test_a_prefill_actor_from_before_sharing_still_prefills(tokenizer_folder: Path) -> None:
    """Called without ``routed``: before, every remote prefill of a newer control plane
    failed on the unexpected argument and the decode actor prefilled instead."""
    options = DisaggOptions(min_remote_prefill_tokens=1)
    prompt = prompts_of_lengths([120], seed=11)[0]

    async def main() -> tuple[dict[str, int], bool, int]:
        async with (
            mockers(tokenizer_folder, [{}, {}], [PrefillActorBeforeSharing, EngineActor]) as px,
            serving_stack(px, disagg=options, roles=ROLES) as first,
            serving_stack(px, disagg=options, roles=ROLES) as second,
        ):
            completion = await first.complete(prompt)
            assert completion.usage is not None
            shares = first.handle("mock-0").info.shares_prefill_routings
            return dict(first.service.disagg.counters), shares, len(second.handles)

    counters, shares, peers = asyncio.run(main())
    assert not shares
    assert peers == 2
    assert counters == {"remote_prefills": 1, "blocks_moved": 7}
