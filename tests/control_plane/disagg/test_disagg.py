"""Disaggregated serving through the whole stack: a real in-process Dask cluster with a
prefill actor and a decode actor, the control plane over HTTP, the official client.

Greedy output equals the same model served aggregated, for concurrent requests, over
TCP and UCXX; a prompt cached on the decode actor moves only its missing blocks; a
prefill that fails falls back to a local prefill; every block is free afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, LocalCluster

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.kv_cache.handoff import movable_blocks
from dynask.actors.runtime.engine_actor import EngineActor
from dynask.actors.runtime.engine_factory import EngineSpec
from dynask.control_plane.disagg.orchestrator import DisaggOptions
from tests.actors.engine.helpers import make_engine, prompts_of_lengths
from tests.control_plane.routing_stack import (
    FAST_MOCKER,
    Stack,
    cluster_with_actors,
    serving_stack,
)
from tests.system_tools import require_module

ROLES = ["prefill", "decode"]
LLAMA_ARGS = {"block_size": 8, "num_kv_blocks": 256}


async def settle(stack: Stack) -> list[dict[str, Any]]:
    """Waits for the prefill tasks; every actor's engine stats and KV transfer stats."""
    await stack.service.disagg.wait_idle()
    result = []
    for proxy in stack.proxies:
        for _ in range(100):  # a finished request frees its blocks on the engine's next step
            stats = {**await proxy.stats(), **await proxy.kv_transfer_stats()}
            if stats["num_free_kv_blocks"] == stats["num_kv_blocks"] and not stats.get(
                "pending_imports"
            ):
                break
            await asyncio.sleep(0.05)
        result.append(stats)
    return result


def assert_all_blocks_free(stats: list[dict[str, Any]]) -> None:
    for actor in stats:
        assert actor["num_free_kv_blocks"] == actor["num_kv_blocks"], actor
        assert actor["pending_imports"] == 0, actor


@pytest.mark.parametrize("kind", ["tcp", "ucxx"])
def test_greedy_output_equals_aggregated(tiny_llama_folder: Path, kind: str) -> None:
    if kind == "ucxx":
        require_module("ucxx", "ucxx-cu12")
    prompts = prompts_of_lengths([20, 33, 47, 58, 71, 90, 12, 100], seed=7)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    reference = make_engine(tiny_llama_folder, **LLAMA_ARGS)
    expected = [stream.text for stream in reference.generate(prompts, params)]
    disagg = DisaggOptions(transport=kind, min_remote_prefill_tokens=16)

    async def main() -> tuple[list[str], list[dict[str, Any]], dict[str, int]]:
        async with (
            cluster_with_actors(tiny_llama_folder, 2, "torch", LLAMA_ARGS) as proxies,
            serving_stack(proxies, disagg=disagg, roles=ROLES) as stack,
        ):
            replies = await asyncio.gather(
                *(stack.complete(p, max_tokens=8, temperature=0.0) for p in prompts)
            )
            stats = await settle(stack)
            return [r.choices[0].text for r in replies], stats, dict(stack.service.disagg.counters)

    texts, (prefill, decode), counters = asyncio.run(main())
    assert texts == expected
    remote = [p for p in prompts if len(p) >= 16]
    assert counters == {
        "remote_prefills": len(remote),
        "blocks_moved": sum(movable_blocks(len(p), 8) for p in remote),
        "local_short_or_cached": len(prompts) - len(remote),
    }
    assert decode["blocks_received"] == prefill["blocks_sent"] == counters["blocks_moved"]
    assert_all_blocks_free([prefill, decode])


def test_prefix_cached_on_decode_moves_only_missing_blocks(tokenizer_folder: Path) -> None:
    shared = prompts_of_lengths([64], seed=3)[0]  # 4 blocks of 16
    longer = shared + prompts_of_lengths([57], seed=4)[0]  # 121 tokens: 7 movable blocks

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with (
            cluster_with_actors(tokenizer_folder, 2) as proxies,
            serving_stack(
                proxies, disagg=DisaggOptions(min_remote_prefill_tokens=1), roles=ROLES
            ) as stack,
        ):
            await stack.complete([*shared, 7])  # 65 tokens: 4 movable blocks
            first = await settle(stack)
            await stack.routing.wait_synced()
            await stack.complete(longer)
            return first, await settle(stack)

    first, (prefill, decode) = asyncio.run(main())
    assert first[1]["blocks_received"] == 4
    assert decode["blocks_received"] - 4 == prefill["blocks_sent"] - 4 == 3
    assert decode["transfers_received"] == 2
    assert_all_blocks_free([prefill, decode])


@asynccontextmanager
async def mockers(
    folder: Path, args: list[dict[str, Any]], classes: list[type] | None = None
) -> AsyncIterator[list[Any]]:
    """Started mocker actors ``mock-0`` ... on an in-process cluster, one per ``args``, of
    ``classes`` where given (default: ``EngineActor``)."""
    async with (
        LocalCluster(
            n_workers=1, processes=False, asynchronous=True, dashboard_address=None
        ) as cluster,
        Client(cluster, asynchronous=True, direct_to_workers=True) as client,
    ):
        proxies = []
        for index, engine_args in enumerate(args):
            spec = EngineSpec("mocker", str(folder), engine_args={**FAST_MOCKER, **engine_args})
            proxies.append(
                await client.submit(
                    EngineActor if classes is None else classes[index],
                    spec,
                    f"mock-{index}",
                    actor=True,
                    pure=False,
                )
            )
        try:
            yield proxies
        finally:
            for proxy in proxies:
                await proxy.stop()


def test_failed_prefill_falls_back_to_the_decode_actor(tokenizer_folder: Path) -> None:
    """A prefill engine without prefix caching cannot keep the blocks it computed until it
    exports them: every remote prefill fails there, and the decode actor prefills."""

    async def main() -> tuple[list[Any], list[dict[str, Any]], dict[str, int]]:
        options = DisaggOptions(min_remote_prefill_tokens=1)
        async with (
            mockers(tokenizer_folder, [{"enable_prefix_caching": False}, {}]) as proxies,
            serving_stack(proxies, disagg=options, roles=ROLES) as stack,
        ):
            prompts = prompts_of_lengths([40, 50, 60, 70], seed=5)
            replies = await asyncio.gather(*(stack.complete(p, max_tokens=5) for p in prompts))
            return replies, await settle(stack), dict(stack.service.disagg.counters)

    replies, (prefill, decode), counters = asyncio.run(main())
    assert [r.usage.completion_tokens for r in replies] == [5, 5, 5, 5]
    assert counters == {"remote_prefill_failed": 4}
    assert decode["fallback_cancelled"] == 4
    assert "blocks_received" not in decode and "blocks_sent" not in prefill
    assert_all_blocks_free([prefill, decode])


def test_short_prompts_and_busy_prefill_actors_stay_local(tokenizer_folder: Path) -> None:
    async def main() -> dict[str, int]:
        options = DisaggOptions(min_remote_prefill_tokens=32, max_prefills_per_actor=0)
        async with (
            cluster_with_actors(tokenizer_folder, 2) as proxies,
            serving_stack(proxies, disagg=options, roles=ROLES) as stack,
        ):
            await stack.complete(prompts_of_lengths([20], seed=1)[0])
            await stack.complete(prompts_of_lengths([80], seed=2)[0])
            return dict(stack.service.disagg.counters)

    assert asyncio.run(main()) == {"local_short_or_cached": 1, "local_prefill_busy": 1}


def test_a_prefill_actor_serving_alone_plans_no_remote_prefill_to_itself(
    tokenizer_folder: Path,
) -> None:
    """No decode actor is up yet (or none is left): requests land on the prefill actor,
    which serves them without sending its KV to itself. (Over cuda_ipc on the H200 that
    self-send failed: a process cannot open its own CUDA IPC handles.)"""

    async def main() -> tuple[Any, list[dict[str, Any]], dict[str, int]]:
        options = DisaggOptions(min_remote_prefill_tokens=1)
        async with (
            cluster_with_actors(tokenizer_folder, 1) as proxies,
            serving_stack(proxies, disagg=options, roles=["prefill"]) as stack,
        ):
            reply = await stack.complete(prompts_of_lengths([80], seed=6)[0], max_tokens=4)
            return reply, await settle(stack), dict(stack.service.disagg.counters)

    reply, (alone,), counters = asyncio.run(main())
    assert reply.usage.completion_tokens == 4
    assert counters == {"local_on_prefill_actor": 1}
    assert "transfers_sent" not in alone and "transfers_received" not in alone
    assert_all_blocks_free([alone])
