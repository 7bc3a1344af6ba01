"""Disaggregated prefill over the cuda_ipc block transport (shared memory on a CPU): the
fallbacks of the TCP path hold when the KV is written straight into reserved blocks."""

from __future__ import annotations

import asyncio
from typing import Any

from dynask.actors.engine.engine import LLMEngine
from dynask.kv.transfer_ipc import IPCTransport
from tests.actors.engine.helpers import prompts_of_lengths
from tests.actors.runtime.test_kv_transfer_service import GREEDY, all_blocks_free, pair


def test_kv_that_never_comes_times_out_into_a_local_prefill(
    llama_engines: list[LLMEngine],
) -> None:
    aggregated_engine, prefill_engine, decode_engine = llama_engines
    prompt = prompts_of_lengths([45], seed=11)[0]
    expected = aggregated_engine.generate([prompt], GREEDY)[0].token_ids

    async def main() -> tuple[list[int], dict[str, int]]:
        async with pair(prefill_engine, decode_engine, "cuda_ipc") as (_, decode):
            outputs: asyncio.Queue[Any] = asyncio.Queue()
            loop = asyncio.get_running_loop()

            def listen(batch: list[Any]) -> None:
                for output in batch:
                    if output.request_id == "slow":
                        loop.call_soon_threadsafe(outputs.put_nowait, output)

            decode.engine.add_output_listener(listen)
            assert await decode.prepare_import("slow", prompt, GREEDY, timeout_s=0.2) is not None
            tokens: list[int] = []
            while not (output := await asyncio.wait_for(outputs.get(), 30)).finished:
                tokens += list(output.token_ids)
            return tokens + list(output.token_ids), decode.stats()

    tokens, stats = asyncio.run(main())
    assert (tokens, stats) == (list(expected), {"fallback_timeout": 1, "pending_imports": 0})
    assert all_blocks_free(decode_engine)


def test_client_gone_during_transfer_writes_nothing_and_frees_both_sides(
    llama_engines: list[LLMEngine],
) -> None:
    _, prefill_engine, decode_engine = llama_engines
    prompt = prompts_of_lengths([41], seed=12)[0]

    async def main() -> tuple[int, dict[str, int], dict[str, int]]:
        async with pair(prefill_engine, decode_engine, "cuda_ipc") as (prefill, decode):
            ticket = await decode.prepare_import("gone", prompt, GREEDY, timeout_s=30)
            assert ticket is not None
            decode.abort_import("gone")
            sent = await prefill.prefill_and_send(ticket, prompt, GREEDY)
            while decode.stats()["pending_imports"]:
                await asyncio.sleep(0.01)
            return sent, prefill.stats(), decode.stats()

    sent, prefill_stats, decode_stats = asyncio.run(main())
    assert sent == 0
    assert prefill_stats == {"transfers_unwanted": 1, "pending_imports": 0}
    assert decode_stats == {"fallback_aborted": 1, "pending_imports": 0}
    assert all_blocks_free(prefill_engine) and all_blocks_free(decode_engine)


def test_a_timed_out_claimed_import_prefills_locally_at_once_and_frees_its_blocks_later(
    llama_engines: list[LLMEngine],
) -> None:
    """A prefill actor claims the decode actor's blocks while it prefills; when the decode
    actor stops waiting, the request is prefilled locally without waiting for that
    sender, and the claimed blocks are released only once the sender gives them back."""
    aggregated_engine, prefill_engine, decode_engine = llama_engines
    prompt = prompts_of_lengths([45], seed=13)[0]
    expected = aggregated_engine.generate([prompt], GREEDY)[0].token_ids

    async def main() -> tuple[list[int], bool, dict[str, int]]:
        async with pair(prefill_engine, decode_engine, "cuda_ipc") as (_, decode):
            outputs: asyncio.Queue[Any] = asyncio.Queue()
            loop = asyncio.get_running_loop()

            def listen(batch: list[Any]) -> None:
                for output in batch:
                    if output.request_id == "claimed":
                        loop.call_soon_threadsafe(outputs.put_nowait, output)

            decode.engine.add_output_listener(listen)
            ticket = await decode.prepare_import("claimed", prompt, GREEDY, timeout_s=0.2)
            assert ticket is not None
            sender = IPCTransport()  # a prefill actor's transport, its prefill still running
            claim = await sender.claim(ticket.address, ticket.transfer_id, ticket.blocks_to_send)
            assert claim is not None and len(claim.block_ids) == ticket.blocks_to_send
            tokens: list[int] = []
            while not (output := await asyncio.wait_for(outputs.get(), 30)).finished:
                tokens += list(output.token_ids)
            held_while_claimed = not all_blocks_free(decode_engine)
            await sender.release_claim(claim, "the prefill failed")
            while decode.stats()["pending_imports"]:
                await asyncio.sleep(0.01)
            await sender.close()
            return tokens + list(output.token_ids), held_while_claimed, decode.stats()

    tokens, held_while_claimed, stats = asyncio.run(main())
    assert tokens == list(expected)
    assert held_while_claimed
    assert stats == {"fallback_timeout": 1, "pending_imports": 0}
    assert all_blocks_free(decode_engine)
