"""Disaggregated prefill over the block transports (``cuda_ipc`` in shared memory on a CPU,
``ucxx`` over UCX's TCP): the fallbacks of the TCP path hold when the KV is written
straight into reserved blocks."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from dynask.actors.engine.engine import LLMEngine
from tests.actors.engine.helpers import prompts_of_lengths
from tests.actors.runtime.test_kv_transfer_service import (
    GREEDY,
    all_blocks_free,
    outputs_of,
    pair,
    settled,
)
from tests.kv.test_block_transports import KINDS, transport


async def all_tokens(outputs: asyncio.Queue[Any]) -> list[int]:
    tokens: list[int] = []
    while not (output := await asyncio.wait_for(outputs.get(), 30)).finished:
        tokens += list(output.token_ids)
    return tokens + list(output.token_ids)


@pytest.mark.parametrize("kind", KINDS)
def test_kv_that_never_comes_times_out_into_a_local_prefill(
    llama_engines: list[LLMEngine], kind: str
) -> None:
    aggregated_engine, prefill_engine, decode_engine = llama_engines
    prompt = prompts_of_lengths([45], seed=11 + 100 * KINDS.index(kind))[0]
    expected = aggregated_engine.generate([prompt], GREEDY)[0].token_ids

    async def main() -> tuple[list[int], dict[str, int]]:
        async with pair(prefill_engine, decode_engine, kind) as (_, decode):
            outputs = outputs_of(decode.engine, f"slow-{kind}")
            assert (
                await decode.prepare_import(f"slow-{kind}", prompt, GREEDY, timeout_s=0.2)
                is not None
            )
            return await all_tokens(outputs), await settled(decode)

    tokens, stats = asyncio.run(main())
    assert (tokens, stats) == (list(expected), {"fallback_timeout": 1, "pending_imports": 0})
    assert all_blocks_free(decode_engine)


@pytest.mark.parametrize("kind", KINDS)
def test_client_gone_during_transfer_writes_nothing_and_frees_both_sides(
    llama_engines: list[LLMEngine], kind: str
) -> None:
    _, prefill_engine, decode_engine = llama_engines
    prompt = prompts_of_lengths([41], seed=12 + 100 * KINDS.index(kind))[0]

    async def main() -> tuple[int, dict[str, int], dict[str, int]]:
        async with pair(prefill_engine, decode_engine, kind) as (prefill, decode):
            ticket = await decode.prepare_import(f"gone-{kind}", prompt, GREEDY, timeout_s=30)
            assert ticket is not None
            decode.abort_import(f"gone-{kind}")
            sent = await prefill.prefill_and_send(ticket, prompt, GREEDY)
            return sent, prefill.stats(), await settled(decode)

    sent, prefill_stats, decode_stats = asyncio.run(main())
    assert sent == 0
    assert prefill_stats == {"transfers_unwanted": 1, "pending_imports": 0}
    assert decode_stats == {"fallback_aborted": 1, "pending_imports": 0}
    assert all_blocks_free(prefill_engine) and all_blocks_free(decode_engine)


@pytest.mark.parametrize("kind", KINDS)
def test_a_timed_out_claimed_import_prefills_locally_at_once_and_frees_its_blocks_later(
    llama_engines: list[LLMEngine], kind: str
) -> None:
    """A prefill actor claims the decode actor's blocks while it prefills; when the decode
    actor stops waiting, the request is prefilled locally without waiting for that
    sender, and the claimed blocks are released only once the sender gives them back."""
    aggregated_engine, prefill_engine, decode_engine = llama_engines
    prompt = prompts_of_lengths([45], seed=13 + 100 * KINDS.index(kind))[0]
    expected = aggregated_engine.generate([prompt], GREEDY)[0].token_ids

    async def main() -> tuple[list[int], bool, dict[str, int]]:
        async with pair(prefill_engine, decode_engine, kind) as (_, decode):
            outputs = outputs_of(decode.engine, f"claimed-{kind}")
            ticket = await decode.prepare_import(f"claimed-{kind}", prompt, GREEDY, timeout_s=0.2)
            assert ticket is not None
            sender = transport(kind)  # a prefill actor's transport, its prefill still running
            claim = await sender.claim(ticket.address, ticket.transfer_id, ticket.blocks_to_send)
            assert claim is not None and len(claim.block_ids) == ticket.blocks_to_send
            tokens = await all_tokens(outputs)
            held_while_claimed = not all_blocks_free(decode_engine)
            await sender.release_claim(claim, "the prefill failed")
            await settled(decode)
            await sender.close()
            return tokens, held_while_claimed, decode.stats()

    tokens, held_while_claimed, stats = asyncio.run(main())
    assert tokens == list(expected)
    assert held_while_claimed
    assert stats == {"fallback_timeout": 1, "pending_imports": 0}
    assert all_blocks_free(decode_engine)


@pytest.mark.parametrize("kind", KINDS)
def test_a_claim_answered_gone_aborts_the_prefill_before_it_runs(
    llama_engines: list[LLMEngine], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode actor gave up before the prefill actor's claim reached it: the prefill
    is aborted as soon as the claim comes back "gone" (here while the prefill engine's
    steps are held, so it never computes), nothing is sent, every block is free."""
    _, prefill_engine, decode_engine = llama_engines
    prompt = prompts_of_lengths([41], seed=14 + 100 * KINDS.index(kind))[0]
    aborted, release_steps = threading.Event(), threading.Event()
    abort = prefill_engine.abort

    def noted_abort(request_id: str) -> None:
        abort(request_id)
        aborted.set()

    monkeypatch.setattr(prefill_engine, "abort", noted_abort)

    async def main() -> tuple[int, str | None, dict[str, int]]:
        async with pair(prefill_engine, decode_engine, kind) as (prefill, decode):
            ticket = await decode.prepare_import(f"given-up-{kind}", prompt, GREEDY, 30)
            assert ticket is not None
            decode.abort_import(f"given-up-{kind}")
            outputs = outputs_of(prefill_engine, f"{ticket.transfer_id}/prefill")
            holding = threading.Event()

            def hold_steps(_: object) -> None:
                holding.set()
                release_steps.wait(30)

            held = asyncio.ensure_future(
                asyncio.to_thread(prefill_engine.with_kv_blocks, hold_steps)
            )
            await asyncio.to_thread(holding.wait, 10)
            sending = asyncio.ensure_future(prefill.prefill_and_send(ticket, prompt, GREEDY))
            assert await asyncio.to_thread(aborted.wait, 10)
            release_steps.set()
            await held
            sent = await asyncio.wait_for(sending, 30)
            while not (output := await asyncio.wait_for(outputs.get(), 30)).finished:
                pass
            return sent, output.finish_reason, prefill.stats()

    sent, finish_reason, stats = asyncio.run(main())
    assert (sent, finish_reason) == (0, "abort")
    assert stats == {"transfers_unwanted": 1, "pending_imports": 0}
    assert all_blocks_free(prefill_engine) and all_blocks_free(decode_engine)
