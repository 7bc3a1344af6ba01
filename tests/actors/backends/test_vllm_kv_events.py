"""vLLM's KV events, published by vLLM's own ZMQ publisher, read into dynask's event log.

The publisher is the one vLLM's engine core runs (``ZmqEventPublisher``), bound on an
``ipc://`` path as the engine's is; the events are vLLM's own msgspec classes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm.distributed import kv_events as vllm_events

from dynask.actors.backends.vllm.kv_events import KVCacheMirror, KVEventSubscriber, block_id
from dynask.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventLog
from dynask.kv.hashing import block_hashes
from dynask.kv.prefix_index import PrefixIndex

BLOCK = 4


def stored(hashes: list[Any], parent: Any, first_token: int, medium: str = "GPU") -> Any:
    tokens = list(range(first_token, first_token + BLOCK * len(hashes)))
    return vllm_events.BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=BLOCK,
        lora_id=None,
        medium=medium,
        lora_name=None,
    )


class Pipe:
    """vLLM's publisher and our subscriber on one ipc path."""

    def __init__(self, folder: Path) -> None:
        endpoint = f"ipc://{folder}/kv.ipc"
        self.publisher = vllm_events.ZmqEventPublisher(data_parallel_rank=0, endpoint=endpoint)
        self.log = KVEventLog()
        self.mirror = KVCacheMirror(self.log)
        self.subscriber = KVEventSubscriber(endpoint, self.mirror)
        self.subscriber.start()
        self._connect()

    def _connect(self) -> None:
        """ZMQ drops what is published before the subscription lands: publish until one
        batch arrives, then start from a clean log (the mirror holds nothing yet)."""
        deadline = time.monotonic() + 30
        while not self.log.drain():
            assert time.monotonic() < deadline, "the subscriber never received a batch"
            self.publish(vllm_events.AllBlocksCleared())
            time.sleep(0.05)
        time.sleep(0.2)  # warm-up batches still in flight land before the test's own
        self.log.drain()
        self.first_id = self.log.last_event_id + 1  # of the test's own events

    def publish(self, *events: Any) -> None:
        self.publisher.publish(vllm_events.KVEventBatch(ts=time.time(), events=list(events)))

    def receive(self, count: int) -> list[Any]:
        """The next ``count`` events recorded in our log."""
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < count:
            assert time.monotonic() < deadline, f"got {len(records)} of {count} events"
            records += self.log.drain()
            time.sleep(0.01)
        return [record.event for record in records]

    def close(self) -> None:
        self.subscriber.close()
        self.publisher.shutdown()


@pytest.fixture
def pipe(tmp_path: Path) -> Iterator[Pipe]:
    opened = Pipe(tmp_path)
    yield opened
    opened.close()


def test_vllm_block_hashes_become_u64_ids() -> None:
    digest = bytes(range(32))
    assert block_id(digest) == int.from_bytes(digest[:8], "big")
    assert block_id(2**64 + 5) == 5
    assert block_id(7) == 7


def test_stored_removed_and_cleared_arrive_as_ours(pipe: Pipe) -> None:
    root, child = bytes([1] * 32), bytes([2] * 32)
    pipe.publish(stored([root, child], None, first_token=100))
    pipe.publish(vllm_events.BlockRemoved(block_hashes=[child], medium="GPU"))
    pipe.publish(vllm_events.AllBlocksCleared())

    events = pipe.receive(3)

    assert events == [
        BlockStored.from_token_ids(
            (block_id(root), block_id(child)), None, tuple(range(100, 108)), BLOCK
        ),
        BlockRemoved((block_id(child),)),
        AllBlocksCleared(),
    ]


def test_offload_tiers_and_unknown_removals_are_skipped(pipe: Pipe) -> None:
    pipe.publish(stored([11], None, first_token=0, medium="CPU"))
    pipe.publish(vllm_events.BlockRemoved(block_hashes=[99], medium="GPU"))  # never stored
    pipe.publish(stored([12], None, first_token=0))

    assert pipe.receive(1) == [BlockStored.from_token_ids((12,), None, (0, 1, 2, 3), BLOCK)]
    assert pipe.mirror.num_blocks == 1


def test_the_dump_lists_parents_first_and_feeds_the_router_index(pipe: Pipe) -> None:
    pipe.publish(stored([1], None, first_token=0))
    pipe.publish(stored([2, 3], 1, first_token=4))
    pipe.publish(vllm_events.BlockRemoved(block_hashes=[1], medium="GPU"))
    pipe.publish(stored([1], None, first_token=0))  # the root again: now after its children
    pipe.receive(4)

    dump = pipe.mirror.dump()

    assert dump.last_event_id == pipe.first_id + 3
    assert [entry.block_hashes for entry in dump.stored] == [(1,), (2,), (3,)]
    assert [entry.parent_hash for entry in dump.stored] == [None, 1, 2]
    index = PrefixIndex()
    index.resync("vllm-0", dump)
    local = [pair.local for pair in block_hashes(list(range(12)), BLOCK)]
    assert index.find_matches(local) == {"vllm-0": 3}


def test_a_lost_batch_reports_the_cache_as_cleared(pipe: Pipe) -> None:
    pipe.publish(stored([1], None, first_token=0))
    pipe.receive(1)
    next(pipe.publisher._seq_gen)  # the publisher skips one sequence number, as when it drops

    pipe.publish(stored([2], 1, first_token=4))

    assert pipe.receive(2) == [
        AllBlocksCleared(),
        BlockStored.from_token_ids((2,), 1, (4, 5, 6, 7), BLOCK),
    ]
    assert [entry.block_hashes for entry in pipe.mirror.dump().stored] == []
