"""Disaggregated prefill between two engines in one process: a prefill engine computes
the prompt's KV, the TCP transport moves it into the decode engine's reserved blocks.

Greedy output must equal a plain (aggregated) run of the same engine; only the blocks
the decode engine lacks move; a transfer that breaks falls back to a local prefill; and
every block is free again afterwards on both sides.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.backends.mocker import MockerConfig, build_mocker_engine
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.kv_cache.handoff import movable_blocks
from dynask.actors.models.tokenizer_folder import load_tokenizer
from dynask.actors.runtime.kv_transfer_service import KVTransferService, has_paged_cache
from dynask.kv.transfer import BlockTransport, TransferError, TransferHeader, make_transport
from tests.actors.engine.helpers import TEST_DEVICE, prompts_of_lengths
from tests.system_tools import require_module

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@asynccontextmanager
async def pair(
    prefill_engine: LLMEngine, decode_engine: LLMEngine, kind: str = "tcp"
) -> AsyncIterator[tuple[KVTransferService, KVTransferService]]:
    """The transports the actors make: ``ucxx`` between built-in engines writes blocks."""
    if kind == "ucxx":
        require_module("ucxx", "ucxx-cu12")
    prefill, decode = (
        KVTransferService(engine, make_transport(kind, paged_cache=has_paged_cache(engine)))
        for engine in (prefill_engine, decode_engine)
    )
    await prefill.start("127.0.0.1")
    await decode.start("127.0.0.1")
    try:
        yield prefill, decode
    finally:
        await prefill.close()
        await decode.close()


def outputs_of(engine: LLMEngine, request_id: str) -> asyncio.Queue[Any]:
    """The request's outputs, on this event loop."""
    outputs: asyncio.Queue[Any] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def listen(batch: list[Any]) -> None:
        for output in batch:
            if output.request_id == request_id:
                loop.call_soon_threadsafe(outputs.put_nowait, output)

    engine.add_output_listener(listen)
    return outputs


async def disaggregated(
    prefill: KVTransferService,
    decode: KVTransferService,
    request_id: str,
    prompt: list[int],
    params: SamplingParams = GREEDY,
    timeout_s: float = 30.0,
) -> list[int]:
    """One request the way the control plane runs it; its output token ids."""
    outputs = outputs_of(decode.engine, request_id)
    ticket = await decode.prepare_import(request_id, prompt, params, timeout_s)
    if ticket is not None:
        try:
            await prefill.prefill_and_send(ticket, prompt, params)
        except Exception:
            decode.cancel_import(request_id)
            raise
    tokens: list[int] = []
    while True:
        output = await outputs.get()
        tokens += output.token_ids
        if output.finished:
            return tokens


async def settled(service: KVTransferService, timeout_s: float = 30.0) -> dict[str, int]:
    """The service's counters once no import is pending: an import's request is queued
    before its reservation is released (a thread that waits for the engine's step lock),
    so a finished request may still count as pending for a moment."""
    deadline = time.monotonic() + timeout_s
    while service.stats()["pending_imports"] and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return service.stats()


def all_blocks_free(engine: LLMEngine) -> bool:
    stats = engine.stats()
    return stats.num_free_kv_blocks == stats.num_kv_blocks


@pytest.mark.parametrize("kind", ["tcp", "ucxx", "cuda_ipc"])
def test_greedy_output_equals_aggregated_for_concurrent_requests(
    llama_engines: list[LLMEngine], kind: str
) -> None:
    if kind == "ucxx":
        require_module("ucxx", "ucxx-cu12")
    if kind == "cuda_ipc" and TEST_DEVICE != "cpu":
        pytest.skip("CUDA IPC needs two processes: tests/kv/test_transfer_ipc_cuda.py")
    aggregated_engine, prefill_engine, decode_engine = llama_engines
    prompts = prompts_of_lengths([9, 17, 30, 41, 64, 77, 100, 5], seed=len(kind))
    expected = [s.token_ids for s in aggregated_engine.generate(prompts, GREEDY)]

    async def main() -> list[list[int]]:
        async with pair(prefill_engine, decode_engine, kind) as (prefill, decode):
            got = await asyncio.gather(
                *(
                    disaggregated(prefill, decode, f"{kind}-{i}", prompt)
                    for i, prompt in enumerate(prompts)
                )
            )
            assert isinstance(decode.transport, BlockTransport) == (kind != "tcp")
            moved = sum(movable_blocks(len(p), 8) for p in prompts)
            assert decode.stats()["blocks_received"] == prefill.stats()["blocks_sent"] == moved
            assert (await settled(decode))["pending_imports"] == 0
            return got

    assert asyncio.run(main()) == expected
    assert all_blocks_free(prefill_engine) and all_blocks_free(decode_engine)


@pytest.fixture
def mockers(smollm2_folder: Path) -> Any:
    tokenizer = load_tokenizer(smollm2_folder)
    config = MockerConfig(num_kv_blocks=64, block_size=4, speedup_ratio=0.0)
    engines = [build_mocker_engine(config, tokenizer) for _ in range(2)]
    for engine in engines:
        engine.start()
    yield engines
    for engine in engines:
        engine.shutdown()


def test_prefix_cached_on_decode_moves_only_the_missing_blocks(mockers: list[LLMEngine]) -> None:
    prefill_engine, decode_engine = mockers
    shared = list(range(100, 120))  # 5 blocks of 4
    decode_engine.generate([[*shared, 7]], SamplingParams(max_tokens=1))
    prompt = [*shared, *range(200, 213)]  # 33 tokens: 8 movable blocks, 5 cached on decode

    async def main() -> dict[str, int]:
        async with pair(prefill_engine, decode_engine) as (prefill, decode):
            await disaggregated(prefill, decode, "cached", prompt)
            return {"sent": prefill.stats()["blocks_sent"], **decode.stats()}

    stats = asyncio.run(main())
    assert stats["sent"] == stats["blocks_received"] == 3
    assert decode_engine.stats().prefix_hit_tokens >= 8 * 4
    assert all_blocks_free(prefill_engine) and all_blocks_free(decode_engine)


def test_fully_cached_prompt_is_prefilled_locally(mockers: list[LLMEngine]) -> None:
    prefill_engine, decode_engine = mockers
    prompt = list(range(300, 321))
    decode_engine.generate([prompt], SamplingParams(max_tokens=1))

    async def main() -> dict[str, int]:
        async with pair(prefill_engine, decode_engine) as (prefill, decode):
            tokens = await disaggregated(prefill, decode, "local", prompt)
            assert len(tokens) == GREEDY.max_tokens
            return decode.stats()

    assert asyncio.run(main()) == {"local_prefills": 1, "pending_imports": 0}
    assert all_blocks_free(decode_engine)


def test_transfer_cut_mid_way_falls_back_and_completes(mockers: list[LLMEngine]) -> None:
    prefill_engine, decode_engine = mockers
    prompt = list(range(400, 437))

    async def main() -> dict[str, int]:
        async with pair(prefill_engine, decode_engine) as (_, decode):
            ticket = await decode.prepare_import("cut", prompt, GREEDY, timeout_s=30)
            assert ticket is not None and decode.stats()["pending_imports"] == 1
            done = asyncio.get_running_loop().create_future()

            def listen(batch: list[Any]) -> None:
                for output in batch:
                    if output.request_id == "cut" and output.finished:
                        done.get_loop().call_soon_threadsafe(done.set_result, output)

            decode.engine.add_output_listener(listen)
            kv = torch.zeros((1, 2, ticket.blocks_to_send, 4, 1, 1))
            header = TransferHeader.of(ticket.transfer_id, kv).pack()
            host, port = ticket.address.rsplit(":", 1)
            with socket.create_connection((host, int(port))) as sock:  # a sender that dies
                sock.sendall(struct.pack(">I", len(header)) + header + b"\0" * 7)
            final = await asyncio.wait_for(done, timeout=30)
            assert final.usage.completion_tokens == GREEDY.max_tokens
            return await settled(decode)

    stats = asyncio.run(main())
    assert stats == {"fallback_transfer_error": 1, "pending_imports": 0}
    assert all_blocks_free(decode_engine)


def test_kv_that_never_comes_times_out_into_a_local_prefill(mockers: list[LLMEngine]) -> None:
    prefill_engine, decode_engine = mockers
    prompt = list(range(500, 530))

    async def main() -> dict[str, int]:
        async with pair(prefill_engine, decode_engine) as (_, decode):
            done = asyncio.get_running_loop().create_future()

            def listen(batch: list[Any]) -> None:
                for output in batch:
                    if output.request_id == "slow" and output.finished:
                        done.get_loop().call_soon_threadsafe(done.set_result, output)

            decode.engine.add_output_listener(listen)
            assert await decode.prepare_import("slow", prompt, GREEDY, timeout_s=0.2) is not None
            final = await asyncio.wait_for(done, timeout=30)
            assert final.usage.completion_tokens == GREEDY.max_tokens
            return await settled(decode)

    assert asyncio.run(main()) == {"fallback_timeout": 1, "pending_imports": 0}
    assert all_blocks_free(decode_engine)


def test_client_gone_during_transfer_frees_both_sides(mockers: list[LLMEngine]) -> None:
    """The decode side releases its reservation at once and never queues the request; the
    prefill still runs to the end and sends (into nothing), and frees its blocks after."""
    prefill_engine, decode_engine = mockers
    prompt = list(range(600, 641))

    async def main() -> tuple[dict[str, int], dict[str, int]]:
        async with pair(prefill_engine, decode_engine) as (prefill, decode):
            ticket = await decode.prepare_import("gone", prompt, GREEDY, timeout_s=30)
            assert ticket is not None
            # True once: the request was never queued (its actor publishes its end itself)
            assert decode.abort_import("gone") is True
            assert decode.abort_import("gone") is False
            assert decode.abort_import("never-prepared") is False
            assert await prefill.prefill_and_send(ticket, prompt, GREEDY) == 10
            return prefill.stats(), await settled(decode)

    sent, received = asyncio.run(main())
    assert sent == {"transfers_sent": 1, "blocks_sent": 10, "pending_imports": 0}
    assert received == {"fallback_aborted": 1, "pending_imports": 0}
    assert decode_engine.stats().num_running == decode_engine.stats().num_waiting == 0
    assert all_blocks_free(prefill_engine) and all_blocks_free(decode_engine)


def test_prefill_slower_than_the_timeout_is_aborted(smollm2_folder: Path) -> None:
    tokenizer = load_tokenizer(smollm2_folder)
    slow = MockerConfig(num_kv_blocks=64, block_size=4, speedup_ratio=0.003)  # ~1 s a step
    prefill_engine = build_mocker_engine(slow, tokenizer)
    decode_engine = build_mocker_engine(replace(slow, speedup_ratio=0.0), tokenizer)
    for engine in (prefill_engine, decode_engine):
        engine.start()
    prompt = list(range(700, 741))

    async def main() -> dict[str, int]:
        async with pair(prefill_engine, decode_engine) as (prefill, decode):
            ticket = await decode.prepare_import("late", prompt, GREEDY, timeout_s=0.1)
            assert ticket is not None
            with pytest.raises(TransferError, match="the prefill took longer than 0.2 s"):
                await prefill.prefill_and_send(ticket, prompt, GREEDY, timeout_s=0.2)
            await settled(decode)
            return prefill.stats()

    try:
        assert asyncio.run(main()) == {"prefill_timeouts": 1, "pending_imports": 0}
        deadline = time.monotonic() + 30
        while not all_blocks_free(prefill_engine) and time.monotonic() < deadline:
            time.sleep(0.05)  # the abort frees the blocks at the start of the next step
        assert all_blocks_free(prefill_engine) and all_blocks_free(decode_engine)
    finally:
        for engine in (prefill_engine, decode_engine):
            engine.shutdown()
