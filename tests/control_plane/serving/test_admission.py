"""Load shedding: the admission limits, alone and over HTTP (503, Retry-After, recovery)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

from dynask.control_plane.reliability.options import ReliabilityOptions
from dynask.control_plane.serving.admission import Admission, AdmissionRefusedError
from tests.control_plane.routing_stack import MODEL, cluster_with_actors, serving_stack, tokens


def test_in_flight_limit_refuses_the_next_request_until_one_ends() -> None:
    admission = Admission(max_in_flight=2, max_queued_prefill_tokens=None)
    admission.admit("a", 10)
    admission.admit("b", 10)

    with pytest.raises(AdmissionRefusedError) as caught:
        admission.admit("c", 10)

    assert caught.value.limit == "in_flight"
    assert str(caught.value) == (
        "the server has 2 requests in flight, its limit (--max-in-flight 2); retry shortly"
    )
    admission.release("a")
    admission.release("a")  # idempotent
    admission.admit("c", 10)
    assert admission.in_flight == 2 and "c" in admission and "a" not in admission


def test_queued_prefill_tokens_leave_the_queue_at_the_first_token() -> None:
    admission = Admission(max_in_flight=None, max_queued_prefill_tokens=100)
    admission.admit("a", 60)
    with pytest.raises(AdmissionRefusedError) as caught:
        admission.admit("b", 50)
    assert caught.value.limit == "prefill_tokens"
    assert str(caught.value) == (
        "the engines have 60 prompt tokens waiting for prefill and this request adds 50, "
        "over the limit (--max-queued-prefill-tokens 100); retry shortly"
    )

    admission.prefill_done("a")
    admission.admit("b", 50)

    assert admission.queued_prefill_tokens == 50 and admission.in_flight == 2
    admission.release("b")
    admission.release("a")
    assert admission.queued_prefill_tokens == 0 and admission.in_flight == 0


def test_a_prompt_over_the_whole_prefill_limit_is_let_in_alone() -> None:
    admission = Admission(max_in_flight=None, max_queued_prefill_tokens=100)
    admission.admit("big", 500)  # nothing queued: it could never get in otherwise
    with pytest.raises(AdmissionRefusedError):
        admission.admit("small", 1)


def test_a_request_is_admitted_once() -> None:
    admission = Admission(max_in_flight=None, max_queued_prefill_tokens=None)
    admission.admit("a", 1)
    with pytest.raises(ValueError, match="request 'a' is already admitted"):
        admission.admit("a", 1)


def test_waiters_get_freed_slots_in_weighted_fair_order() -> None:
    async def main() -> list[str]:
        admission = Admission(1, None, wait_s=5.0, max_waiting=5)
        admission.admit("running", 1)
        order: list[str] = []

        async def request(name: str, priority: str, tenant: str) -> None:
            reserved = await admission.turn(priority, tenant)
            assert reserved
            admission.admit(name, 1, reserved)
            order.append(name)

        waiters = [
            asyncio.create_task(request(name, priority, tenant))
            for name, priority, tenant in [
                ("low-a", "low", "a"),
                ("normal-b1", "normal", "b"),
                ("normal-b2", "normal", "b"),
                ("normal-c", "normal", "c"),
                ("high-d", "high", "d"),
            ]
        ]
        await asyncio.sleep(0)  # all five wait
        assert len(admission.waiting) == 5
        with pytest.raises(AdmissionRefusedError):
            admission.admit("barging", 1)  # the waiters are first
        admission.release("running")
        for done in range(1, 6):
            while len(order) < done:
                await asyncio.sleep(0)
            admission.release(order[-1])
        await asyncio.gather(*waiters)
        return order

    # DRR over classes in the order they began to wait (low 1, normal 2, high 4 a
    # round); tenants b and c take turns inside normal.
    assert asyncio.run(main()) == ["low-a", "normal-b1", "normal-c", "high-d", "normal-b2"]


def test_a_waiter_times_out_and_one_that_left_gives_its_slot_on() -> None:
    async def main() -> None:
        admission = Admission(1, None, wait_s=0.05, max_waiting=2)
        admission.admit("running", 1)
        with pytest.raises(AdmissionRefusedError) as caught:
            await admission.turn("normal", "t")
        assert caught.value.limit == "queue_wait" and len(admission.waiting) == 0
        assert "no slot came free in 0.05 s (--admission-wait)" in str(caught.value)

        admission.wait_s = 5.0
        gone = asyncio.create_task(admission.turn("high", "t"))
        kept = asyncio.create_task(admission.turn("low", "u"))
        await asyncio.sleep(0)
        admission.release("running")  # reserved for ``gone`` ...
        gone.cancel()  # ... whose client leaves before it comes in
        reservation = await kept  # the slot went on to the next waiter
        assert (reservation.slots, reservation.tokens) == (1, 0)
        admission.admit("kept", 1, reservation)
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert admission.in_flight == 1 and len(admission.waiting) == 0

        admission.wait_s = 0.0
        with pytest.raises(AdmissionRefusedError) as caught:
            await admission.turn("normal", "t")
        assert caught.value.limit == "in_flight"

    asyncio.run(main())


def test_at_most_max_in_flight_requests_wait() -> None:
    async def main() -> None:
        admission = Admission(max_in_flight=1, max_queued_prefill_tokens=None, wait_s=5.0)
        admission.admit("running", 1)
        waiter = asyncio.create_task(admission.turn("normal", "t"))
        await asyncio.sleep(0)
        with pytest.raises(AdmissionRefusedError) as caught:
            await admission.turn("normal", "u")
        assert caught.value.limit == "queue_full"
        waiter.cancel()

    asyncio.run(main())


def test_a_group_waits_for_room_for_all_its_requests_and_keeps_its_turn() -> None:
    async def main() -> None:
        admission = Admission(3, None, wait_s=5.0)
        admission.admit("a", 1)
        admission.admit("b", 1)
        group = asyncio.create_task(admission.turn("normal", "t", slots=3, prompt_tokens=30))
        await asyncio.sleep(0)
        single = asyncio.create_task(admission.turn("high", "u"))
        await asyncio.sleep(0)
        assert admission.waiters == 2 and admission.in_flight == 2

        admission.release("a")  # one free slot: the group's turn, but not its room
        await asyncio.sleep(0)
        assert not group.done() and not single.done()  # the single one does not pass it
        with pytest.raises(AdmissionRefusedError):
            admission.admit("barging", 1)  # the free slot is not taken by a newcomer...
        admission.release("b")
        reservation = await group
        assert (reservation.slots, reservation.tokens) == (3, 30)
        for name in ("g0", "g1", "g2"):
            admission.admit(name, 10, reservation)
        admission.give_back(reservation)
        assert (admission.in_flight, admission.queued_prefill_tokens) == (3, 30)
        assert not single.done()
        admission.release("g0")
        assert (await single).slots == 1

    asyncio.run(main())


def test_a_request_at_the_prefill_token_limit_waits_for_a_first_token() -> None:
    async def main() -> None:
        admission = Admission(None, 100, wait_s=5.0)
        admission.admit("a", 80)
        waiter = asyncio.create_task(admission.turn("normal", "t", prompt_tokens=50))
        await asyncio.sleep(0)
        assert not waiter.done() and admission.waiters == 1
        admission.prefill_done("a")  # its prompt left the queue: room for 50 more
        reservation = await waiter
        admission.admit("b", 50, reservation)
        assert admission.queued_prefill_tokens == 50 and admission.waiters == 0

        admission.wait_s = 0.02
        with pytest.raises(AdmissionRefusedError) as caught:
            await admission.turn("normal", "t", prompt_tokens=60)
        assert caught.value.limit == "queue_wait"
        assert str(caught.value) == (
            "the engines have 50 prompt tokens waiting for prefill and this request adds "
            "60, over the limit (--max-queued-prefill-tokens 100), and no room came free "
            "in 0.02 s (--admission-wait); retry shortly"
        )

    asyncio.run(main())


def test_a_group_over_the_prefill_limit_gets_in_alone_and_unused_room_is_given_back() -> None:
    async def main() -> None:
        admission = Admission(4, 100, wait_s=5.0)
        reservation = await admission.turn("normal", "t", slots=3, prompt_tokens=240)
        admission.admit("g0", 80, reservation)
        admission.admit("g1", 80, reservation)  # its reservation, not the limit, decides
        waiter = asyncio.create_task(admission.turn("normal", "u", slots=2, prompt_tokens=20))
        await asyncio.sleep(0)
        assert not waiter.done()  # 2 in flight + 1 reserved: one slot free of the 2 asked
        admission.give_back(reservation)  # g2 never came in (its placement failed, say)
        await asyncio.sleep(0)
        assert not waiter.done()  # the slots are free, but 160 prompt tokens are queued
        admission.prefill_done("g0")
        assert (await waiter).slots == 2
        assert (admission.in_flight, admission.queued_prefill_tokens) == (2, 80)

    asyncio.run(main())


def test_reliability_options_name_the_bad_field() -> None:
    with pytest.raises(ValueError, match=r"heartbeat_timeout_s \(1\.0\) must be longer"):
        ReliabilityOptions(heartbeat_interval_s=1.0, heartbeat_timeout_s=1.0)
    with pytest.raises(ValueError, match="max_in_flight has value 0; expected an integer >= 1"):
        ReliabilityOptions(max_in_flight=0)


@pytest.mark.slow
def test_load_beyond_the_limit_gets_503_and_the_server_recovers(tiny_llama_folder: Path) -> None:
    slow_echo = {"delay_s": 0.02}
    limits = ReliabilityOptions(max_in_flight=2, admission_wait_s=0)  # refuse at once

    async def main() -> None:
        async with (
            cluster_with_actors(tiny_llama_folder, 1, "echo", slow_echo) as proxies,
            serving_stack(proxies, reliability=limits) as stack,
        ):
            streams = []
            for seed in (1, 2):
                stream = await stack.openai.completions.create(
                    model=MODEL, prompt=tokens(seed=seed, blocks=4), max_tokens=64, stream=True
                )
                await stream.__aiter__().__anext__()
                streams.append(stream)

            with pytest.raises(openai.InternalServerError) as caught:
                await stack.complete(tokens(seed=3, blocks=1))

            assert caught.value.status_code == 503
            assert caught.value.response.headers["retry-after"] == "1"
            body = caught.value.body
            assert isinstance(body, dict) and body["code"] == "overloaded"
            for stream in streams:
                await stream.close()
            for _ in range(300):
                if stack.service.admission.in_flight == 0:
                    break
                await asyncio.sleep(0.01)
            reply = await stack.complete(tokens(seed=4, blocks=1))
            assert reply.usage.completion_tokens == 4
            metrics = (await stack.http.get("/metrics")).text
            assert 'dynask_admission_refused_total{limit="in_flight"} 1.0' in metrics

    asyncio.run(main())
