"""``ActorKVSync``: an actor's KV events into the prefix index, gaps healed from dumps.

The actor is faked by what an engine holds (a real ``BlockPool`` with its
``KVEventLog``); frames are what its token stream would carry.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dynask.actors.runtime.token_stream import pack_kv_dump
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
