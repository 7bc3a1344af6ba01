"""``ActorKVSync``: an actor's KV events into the prefix index, gaps healed from dumps.

The actor is faked by what an engine holds (a real ``BlockPool`` with its
``KVEventLog``); frames are what its token stream would carry.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack

from dynask.actors.runtime.token_stream import KIND_KV_EVENTS, encode_frame, pack_kv_dump
from dynask.control_plane.routing.kv_event_sync import ActorKVSync
from dynask.kv.block_pool import BlockPool
from dynask.kv.events import KVEventLog
from dynask.kv.hashing import block_hashes, local_block_hash
from dynask.kv.prefix_index import KVCacheDump, PrefixIndex

BS = 4
A = list(range(100, 112))  # three blocks
B = list(range(200, 208))  # two blocks
C = list(range(300, 304))  # one block


class FakeActor:
    """An engine's block pool and event log; ``dump`` answers like ``kv_cache_dump``."""

    def __init__(self) -> None:
        self.log = KVEventLog()
        self.pool = BlockPool(32, BS, event_log=self.log)
        self.gate: asyncio.Event | None = None  # set: the dump waits for it (after its snapshot)
        self.error: Exception | None = None
        self.dumps = 0

    def store(self, tokens: list[int]) -> None:
        pairs = block_hashes(tokens, BS)
        blocks = self.pool.allocate(len(pairs))
        parent = None
        for index, (block, pair) in enumerate(zip(blocks, pairs, strict=True)):
            self.pool.cache_block(
                block, pair.sequence, parent, tokens[index * BS : (index + 1) * BS]
            )
            parent = pair.sequence
        self.pool.free_request_blocks(blocks)

    def frame(self) -> list[dict[str, Any]]:
        return [record.to_dict() for record in self.log.drain()]

    async def dump(self) -> bytes:
        self.dumps += 1
        snapshot = pack_kv_dump(KVCacheDump.from_block_pool(self.pool, self.log.last_event_id))
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return snapshot


def locals_of(tokens: list[int]) -> list[int]:
    return [local_block_hash(tokens[i : i + BS]) for i in range(0, len(tokens), BS)]


def matches(index: PrefixIndex, *prompts: list[int]) -> list[dict[str, int]]:
    return [index.find_matches(locals_of(prompt)) for prompt in prompts]


def make_sync(actor: FakeActor) -> tuple[ActorKVSync, PrefixIndex, list[tuple[str, str]]]:
    index = PrefixIndex()
    resyncs: list[tuple[str, str]] = []
    sync = ActorKVSync("a", index, actor.dump, lambda name, why: resyncs.append((name, why)))
    return sync, index, resyncs


def test_the_index_starts_from_a_dump_of_what_the_actor_served_before() -> None:
    async def main() -> None:
        actor = FakeActor()
        actor.store(A)
        actor.frame()  # those events went to nobody: no control plane yet
        sync, index, resyncs = make_sync(actor)

        sync.start()
        await sync.wait()

        assert matches(index, A) == [{"a": 3}]
        assert (index.expected_event_id("a"), sync.resyncs, resyncs) == (4, 1, [("a", "connected")])

    asyncio.run(main())


def test_events_that_arrive_during_a_dump_apply_on_top_of_it() -> None:
    async def main() -> None:
        actor = FakeActor()
        actor.store(A)
        early = actor.frame()  # ids 1-3: the dump covers them
        actor.gate = asyncio.Event()
        sync, index, _ = make_sync(actor)
        sync.start()
        await asyncio.sleep(0)  # the dump's snapshot is taken
        actor.store(B)
        sync.on_kv_events(early)
        sync.on_kv_events(actor.frame())  # ids 4-5: newer than the dump

        assert sync.syncing and matches(index, A, B) == [{}, {}]
        actor.gate.set()
        await sync.wait()

        assert not sync.syncing and matches(index, A, B) == [{"a": 3}, {"a": 2}]
        assert index.expected_event_id("a") == 6 and actor.dumps == 1

    asyncio.run(main())


def test_a_lost_frame_is_found_at_the_next_one_and_healed_by_a_dump() -> None:
    async def main() -> None:
        actor = FakeActor()
        sync, index, resyncs = make_sync(actor)
        sync.start()
        await sync.wait()
        actor.store(A)
        actor.frame()  # lost on the way
        actor.store(B)

        sync.on_kv_events(actor.frame())
        assert sync.syncing
        await sync.wait()

        assert matches(index, A, B) == [{"a": 3}, {"a": 2}]
        assert resyncs == [("a", "connected"), ("a", "gap")]
        actor.store(C)
        sync.on_kv_events(actor.frame())
        assert matches(index, C) == [{"a": 1}] and actor.dumps == 2

    asyncio.run(main())


def test_a_failed_dump_drops_the_blocks_and_the_next_event_retries() -> None:
    async def main() -> None:
        actor = FakeActor()
        sync, index, _ = make_sync(actor)
        actor.store(A)
        sync.start()
        await sync.wait()
        actor.frame()
        actor.store(B)
        actor.frame()  # lost
        actor.error = ConnectionError("worker unreachable")
        actor.store(C)

        sync.on_kv_events(actor.frame())
        await sync.wait()

        assert matches(index, A, B, C) == [{}, {}, {}] and not sync.syncing
        actor.error = None
        actor.store(list(range(400, 404)))
        sync.on_kv_events(actor.frame())
        await sync.wait()
        assert matches(index, A, B, C) == [{"a": 3}, {"a": 2}, {"a": 1}]
        assert actor.dumps == 3

    asyncio.run(main())


def test_an_unreadable_frame_resyncs_and_closing_drops_everything() -> None:
    async def main() -> None:
        actor = FakeActor()
        sync, index, resyncs = make_sync(actor)
        sync.start()
        await sync.wait()
        actor.store(A)
        actor.frame()

        sync.on_kv_events([{"event_id": 1, "event": {"type": "moved"}}])
        await sync.wait()
        assert matches(index, A) == [{"a": 3}] and resyncs[-1] == ("a", "unreadable events")

        sync.close()
        actor.store(B)
        sync.on_kv_events(actor.frame())
        assert matches(index, A, B) == [{}, {}] and index.actors() == []

    asyncio.run(main())


def carried(payload: list[dict[str, Any]]) -> Any:
    """A ``KIND_KV_EVENTS`` frame's payload as a reader gets it off the stream."""
    return msgpack.unpackb(encode_frame(KIND_KV_EVENTS, payload)[4:], raw=False)["d"]


def test_packed_events_and_an_older_actors_listed_events_build_the_same_index() -> None:
    """Issue 21: stored blocks' tokens travel packed (u32 bytes); an actor of an older
    version sends them as lists of ints, in its events and its dump alike."""

    async def main() -> None:
        actor = FakeActor()
        actor.store(A)  # served before the control planes connected: in their dumps
        actor.frame()

        async def listed_dump() -> bytes:
            dump = KVCacheDump.from_block_pool(actor.pool, actor.log.last_event_id)
            return bytes(msgpack.packb(dump.to_dict(packed=False), use_bin_type=True))

        packed, listed = PrefixIndex(), PrefixIndex()
        syncs = [ActorKVSync("a", packed, actor.dump), ActorKVSync("a", listed, listed_dump)]
        for sync in syncs:
            sync.start()
            await sync.wait()
        prompts = [A, B, C, A[:8] + C, list(range(500, 604))]  # the last: 26 blocks, evicting
        for tokens in prompts[1:]:
            actor.store(tokens)
            records = actor.log.drain()
            syncs[0].on_kv_events(carried([record.to_dict() for record in records]))
            syncs[1].on_kv_events(carried([record.to_dict(packed=False) for record in records]))

        # The last prompt's allocation took the oldest free blocks: A's three (so A and
        # A[:8] + C match nothing); B, C and the last prompt's 26 blocks are held.
        expected = [{}, {"a": 2}, {"a": 1}, {}, {"a": 26}]
        assert matches(packed, *prompts) == matches(listed, *prompts) == expected
        assert [index.num_blocks("a") for index in (packed, listed)] == [30, 30]  # 26 + 2 + 1 + 1
        # 26 + 2 + 1, and the block after A[:8] held on (with the two nodes above it)
        assert [index.num_nodes() for index in (packed, listed)] == [32, 32]
        assert [index.expected_event_id("a") for index in (packed, listed)] == [35, 35]
        assert [sync.resyncs for sync in syncs] == [1, 1]  # the starting dumps only

    asyncio.run(main())
