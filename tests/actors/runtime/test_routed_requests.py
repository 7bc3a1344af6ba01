"""A reader that connects to an actor's token stream after others is first sent the
routed requests still in flight there, with the tokens each has produced (real sockets,
the engine's hop from another thread); requests that ended, or were dropped with their
owner, are sent only by an actor without KV events, within bounds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dynask.actors.api.outputs import FinishReason, RequestOutput
from dynask.actors.runtime import routed_requests
from dynask.actors.runtime.routed_requests import RoutedRequests
from dynask.actors.runtime.token_stream import (
    KIND_OUTPUTS,
    KIND_ROUTED,
    KIND_ROUTED_ENDED,
    TokenStreamServer,
    read_frame,
)
from dynask.control_plane.routing.peer_routings import RoutingNote, read_peer_routings
from dynask.kv.events import KVEventLog

NOTE = RoutingNote(16, (11, 12), 16, "kv", 1700000000.5).to_wire()


def _record(request_id: str, owner: str, prompt_tokens: int) -> dict[str, Any]:
    return {"i": request_id, "o": owner, "n": prompt_tokens, "r": NOTE}


def test_records_count_tokens_and_leave_when_their_request_ends() -> None:
    routed = RoutedRequests()
    routed.add([_record("a", "cp-1", 40), _record("b", "cp-1", 20), _record("c", "cp-2", 8)])
    routed.advance(
        [
            RequestOutput("a", "x", (1,)),
            RequestOutput("b", "", (), FinishReason.ABORT),
            RequestOutput("unrouted", "y", (5, 6)),
        ]
    )
    routed.advance([RequestOutput("a", "yz", (2, 3))])
    routed.forget(["c", "never-seen"])

    [record] = routed.records()
    assert record == {"i": "a", "o": "cp-1", "n": 40, "r": NOTE, "g": 3}
    record["g"] = 99  # a copy: what was sent does not change what is kept
    assert routed.records()[0]["g"] == 3 and len(routed) == 1


def test_a_reader_that_connects_later_hears_what_is_in_flight_first() -> None:
    async def main() -> None:
        server = TokenStreamServer(asyncio.get_running_loop())
        server.watch_kv_events(KVEventLog())  # an engine with KV events: no ended records
        host, port = (await server.start("127.0.0.1")).rsplit(":", 1)

        async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            readers = server.num_readers
            connection = await asyncio.open_connection(host, int(port))
            while server.num_readers == readers:
                await asyncio.sleep(0.001)
            return connection

        first, first_writer = await connect()
        server.publish_routed([_record("r1", "cp-1", 64), _record("r2", "cp-1", 32)])

        def engine_step() -> None:  # on another thread, as the engine's loop runs
            server.publish([RequestOutput("r1", "ab", (4, 5)), RequestOutput("r2", "", (9,))])
            server.publish([RequestOutput("r2", "c", (6,), FinishReason.LENGTH)])

        await asyncio.to_thread(engine_step)
        for _ in range(2):  # the first reader got both steps (it is the owner: no "routed")
            kind, _ = await read_frame(first)
            assert kind == KIND_OUTPUTS

        late, late_writer = await connect()
        kind, payload = await read_frame(late)
        assert kind == KIND_ROUTED
        [routing] = read_peer_routings(payload)
        assert (routing.request_id, routing.owner, routing.prompt_tokens) == ("r1", "cp-1", 64)
        assert routing.generated_tokens == 2
        assert routing.note == RoutingNote.from_wire(NOTE)

        await asyncio.to_thread(server.publish, [RequestOutput("r1", "", (), FinishReason.STOP)])
        kind, outputs = await read_frame(late)
        assert kind == KIND_OUTPUTS and [o["i"] for o in outputs] == ["r1"]
        # Nothing is in flight now: a third reader's first frame is the next step's deltas.
        third, third_writer = await connect()
        await asyncio.to_thread(server.publish, [RequestOutput("r3", "z", (1,))])
        kind, _ = await read_frame(third)
        assert kind == KIND_OUTPUTS

        for writer in (first_writer, late_writer, third_writer):
            writer.close()
            await writer.wait_closed()
        await server.close()

    asyncio.run(main())


def test_a_routing_heard_as_it_was_made_carries_no_generated_tokens() -> None:
    [routing] = read_peer_routings([_record("r1", "cp-1", 64)])
    assert routing.generated_tokens is None


def test_without_kv_events_the_ended_are_kept_newest_within_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(routed_requests, "MAX_ENDED_RECORDS", 2)
    now = [1000.0]
    routed = RoutedRequests(keep_ended=True, clock=lambda: now[0])
    routed.add([_record(name, "cp-1", 16) for name in ("a", "b", "c", "d")])
    routed.advance([RequestOutput("a", "", (1, 2), FinishReason.STOP)])
    now[0] += 1
    routed.advance([RequestOutput("b", "", (), FinishReason.LENGTH)])
    now[0] += 1
    routed.forget(["c"])  # dropped with its owner: ended too

    assert [(r["i"], r.get("e"), r["g"]) for r in routed.records()] == [
        ("b", True, 0),
        ("c", True, 0),
        ("d", None, 0),
    ]
    now[0] += routed_requests.MAX_ENDED_AGE_S - 0.5  # b ended 601.5 s ago, c 600.5
    assert [r["i"] for r in routed.records()] == ["c", "d"]
    now[0] += 1
    assert [r["i"] for r in routed.records()] == ["d"]


def test_the_ended_are_bounded_by_their_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routed_requests, "MAX_ENDED_HASHES", 5)  # NOTE holds 2 hashes
    routed = RoutedRequests(keep_ended=True)
    routed.add([_record(name, "cp-1", 16) for name in ("a", "b", "c")])
    routed.forget(["a", "b", "c"])
    assert [r["i"] for r in routed.records()] == ["b", "c"]


@pytest.mark.parametrize("kv_events", [False, True])
def test_a_later_reader_hears_the_ended_only_from_an_actor_without_kv_events(
    kv_events: bool,
) -> None:
    async def main() -> list[tuple[str, list[tuple[str, bool]]]]:
        server = TokenStreamServer(asyncio.get_running_loop())
        if kv_events:
            server.watch_kv_events(KVEventLog())
        host, port = (await server.start("127.0.0.1")).rsplit(":", 1)
        server.publish_routed([_record("r1", "cp-1", 64), _record("r2", "cp-1", 32)])
        await asyncio.to_thread(server.publish, [RequestOutput("r1", "", (4,), FinishReason.STOP)])
        await asyncio.sleep(0.05)  # the hop has run: r1 ended on the loop
        reader, writer = await asyncio.open_connection(host, int(port))
        frames = [await read_frame(reader)]
        if not kv_events:
            frames.append(await read_frame(reader))
        await asyncio.to_thread(server.publish, [RequestOutput("r3", "", (5,))])
        frames.append(await read_frame(reader))  # the next step's deltas follow
        writer.close()
        await writer.wait_closed()
        await server.close()
        return [
            (kind, [(r.request_id, r.ended) for r in read_peer_routings(payload)])
            if kind != KIND_OUTPUTS
            else (kind, [])
            for kind, payload in frames
        ]

    # The ended go in a frame of their own, which a reader from before it skips.
    in_flight = (KIND_ROUTED, [("r2", False)])
    ended = (KIND_ROUTED_ENDED, [("r1", True)])
    expected = [in_flight] if kv_events else [ended, in_flight]
    assert asyncio.run(main()) == [*expected, (KIND_OUTPUTS, [])]
