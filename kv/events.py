"""KV cache events, shaped like NVIDIA Dynamo's, and the per-engine event log.

Design decisions:

- An engine reports what its prefix cache gained and lost as events; the router replays
  them to know which worker holds which blocks. Three kinds suffice: blocks stored,
  blocks removed, everything cleared.
- Event ids are per engine, start at 1 and increase by one, so a consumer that sees a gap
  knows it missed events and must resync from a full dump.
- The engine thread records and another thread drains, so the log is guarded by a lock.
- A consumer that pushes events (the actor's token stream) is woken by ``set_listener``
  only when a record arrives at an *empty* log: one wake-up per batch it drains, not one
  per event, and nothing to poll.
- ``to_dict`` / ``event_from_dict`` give a plain dict that msgpack carries (the token
  stream, dumps); the ``"type"`` key selects the event.
- A stored block's tokens are kept and sent packed, as little-endian u32 bytes
  (``kv.hashing.pack_token_ids``: the very bytes its local hash covers), under
  ``"packed_token_ids"``. A 20k-token prompt is 300+ blocks and ~20k tokens per event
  batch; as msgpack ints the router spent ~30 ns a token parsing, checking and packing
  them again to hash, most of its KV-event CPU. Packed, it checks one length and hashes
  views of the bytes. Local hashes are not sent instead: the router hashes with its own
  seed (``PrefixIndex.seed``), which the engine need not share.
- ``to_dict(packed=False)`` gives the list form (``"token_ids"``: ints), for JSON (which
  has no bytes) and the form events had before; ``event_from_dict`` reads both, so
  actors of an older version (adopted by a newer control plane) still route.
- Each event names the memory tier it is about (``kv.tier``): the device cache, host
  memory or disk. ``"device"`` is the default and is left out of the dict, so events of
  an engine without offload tiers read exactly as before, both ways.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynask.kv.hashing import SequenceHash, pack_token_ids, unpack_token_ids
from dynask.kv.tier import KVTier, parse_tier

STORED = "stored"
REMOVED = "removed"
CLEARED = "cleared"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks entered the prefix cache; ``packed_token_ids`` are all their tokens in
    order, as little-endian u32 (``pack_token_ids``; ``from_token_ids`` packs them)."""

    block_hashes: tuple[SequenceHash, ...]
    parent_hash: SequenceHash | None
    packed_token_ids: bytes
    block_size: int
    tier: KVTier = KVTier.DEVICE

    def __post_init__(self) -> None:
        if not self.block_hashes:
            raise ValueError("BlockStored.block_hashes must not be empty, got ()")
        if self.block_size <= 0:
            raise ValueError(f"BlockStored.block_size must be positive, got {self.block_size!r}")
        if not isinstance(self.packed_token_ids, bytes):
            raise ValueError(
                f"BlockStored.packed_token_ids has type {type(self.packed_token_ids).__name__}; "
                "expected bytes (pack_token_ids, or BlockStored.from_token_ids)"
            )
        expected = len(self.block_hashes) * self.block_size
        if len(self.packed_token_ids) != 4 * expected:
            raise ValueError(
                f"BlockStored.packed_token_ids has {len(self.packed_token_ids)} bytes; expected "
                f"{4 * expected} ({len(self.block_hashes)} blocks of {self.block_size} "
                "u32 tokens)"
            )

    @classmethod
    def from_token_ids(
        cls,
        block_hashes: tuple[SequenceHash, ...],
        parent_hash: SequenceHash | None,
        token_ids: Sequence[int],
        block_size: int,
        tier: KVTier = KVTier.DEVICE,
    ) -> BlockStored:
        """An event from token ids as ints (packed once, here); ``ValueError`` if one
        does not fit in u32."""
        return cls(block_hashes, parent_hash, pack_token_ids(token_ids), block_size, tier)

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The tokens as ints (unpacked on every call: for tests and diagnostics)."""
        return unpack_token_ids(self.packed_token_ids)

    def to_dict(self, *, packed: bool = True) -> dict[str, Any]:
        """A plain dict for the wire; ``packed=False``: the tokens as a list of ints."""
        tokens: dict[str, Any] = (
            {"packed_token_ids": self.packed_token_ids}
            if packed
            else {"token_ids": list(self.token_ids)}
        )
        return {
            "type": STORED,
            "block_hashes": list(self.block_hashes),
            "parent_hash": self.parent_hash,
            **tokens,
            "block_size": self.block_size,
            **_tier_entry(self.tier),
        }


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left the prefix cache (evicted to make room)."""

    block_hashes: tuple[SequenceHash, ...]
    tier: KVTier = KVTier.DEVICE

    def __post_init__(self) -> None:
        if not self.block_hashes:
            raise ValueError("BlockRemoved.block_hashes must not be empty, got ()")

    def to_dict(self, *, packed: bool = True) -> dict[str, Any]:
        """A plain dict for the wire (``packed``: see ``BlockStored.to_dict``)."""
        return {"type": REMOVED, "block_hashes": list(self.block_hashes), **_tier_entry(self.tier)}


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every block of one tier was dropped (the device tier: the whole prefix cache)."""

    tier: KVTier = KVTier.DEVICE

    def to_dict(self, *, packed: bool = True) -> dict[str, Any]:
        """A plain dict for the wire (``packed``: see ``BlockStored.to_dict``)."""
        return {"type": CLEARED, **_tier_entry(self.tier)}


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventRecord:
    """An event with the id the engine's log gave it."""

    event_id: int
    event: KVEvent

    def __post_init__(self) -> None:
        if self.event_id < 1:
            raise ValueError(f"KVEventRecord.event_id must be >= 1, got {self.event_id!r}")

    def to_dict(self, *, packed: bool = True) -> dict[str, Any]:
        """A plain dict for the wire (``packed``: see ``BlockStored.to_dict``)."""
        return {"event_id": self.event_id, "event": self.event.to_dict(packed=packed)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KVEventRecord:
        """Inverse of ``to_dict``; raises ``ValueError`` on a malformed dict."""
        event = data.get("event")
        if not isinstance(event, Mapping):
            raise ValueError(f"KV event record field 'event' has value {event!r}; expected a dict")
        return cls(event_id=_int_field(data, "event_id"), event=event_from_dict(event))


def event_from_dict(data: Mapping[str, Any]) -> KVEvent:
    """Rebuild an event from ``to_dict`` output; raises ``ValueError`` if malformed."""
    kind = data.get("type")
    if kind == STORED:
        return BlockStored(
            block_hashes=_hash_tuple(data, "block_hashes"),
            parent_hash=_optional_hash(data, "parent_hash"),
            packed_token_ids=_packed_token_ids(data),
            block_size=_int_field(data, "block_size"),
            tier=_tier_field(data),
        )
    if kind == REMOVED:
        return BlockRemoved(block_hashes=_hash_tuple(data, "block_hashes"), tier=_tier_field(data))
    if kind == CLEARED:
        return AllBlocksCleared(tier=_tier_field(data))
    raise ValueError(
        f"KV event field 'type' has value {kind!r}; expected one of "
        f"{STORED!r}, {REMOVED!r}, {CLEARED!r}"
    )


class KVEventLog:
    """One engine's pending KV events with monotonic ids starting at 1. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_event_id = 0
        self._pending: list[KVEventRecord] = []
        self._listener: Callable[[], None] | None = None

    def set_listener(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` whenever a record arrives at an empty log (None: stop).

        It runs on the recording thread, outside the lock, and should only schedule a
        ``drain`` elsewhere: records that arrive before that drain wake no one again.
        """
        with self._lock:
            self._listener = listener

    def record(self, event: KVEvent) -> int:
        """Append ``event`` and return its id."""
        with self._lock:
            self._last_event_id += 1
            event_id = self._last_event_id
            wake = self._listener if not self._pending else None
            self._pending.append(KVEventRecord(event_id, event))
        if wake is not None:
            wake()
        return event_id

    def drain(self) -> list[KVEventRecord]:
        """Return the pending records, oldest first, and forget them."""
        with self._lock:
            drained, self._pending = self._pending, []
            return drained

    @property
    def last_event_id(self) -> int:
        """Id of the most recent event ever recorded; 0 before the first."""
        with self._lock:
            return self._last_event_id


def _int_field(data: Mapping[str, Any], name: str) -> int:
    value = data.get(name)
    # bool is an int subclass but never a valid id, size or token.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"KV event field {name!r} has value {value!r}; expected an int")
    return value


def _int_tuple(data: Mapping[str, Any], name: str) -> tuple[int, ...]:
    values = data.get(name)
    if not isinstance(values, list | tuple):
        raise ValueError(f"KV event field {name!r} has value {values!r}; expected a list")
    if set(map(type, values)) <= {int}:  # checked in C: a stored block carries its tokens,
        return tuple(values)  # and one by one they were most of a router's CPU under load
    return tuple(_int_field({name: value}, name) for value in values)


def _packed_token_ids(data: Mapping[str, Any]) -> bytes:
    """A stored event's tokens as ``pack_token_ids`` bytes, from either wire form."""
    packed = data.get("packed_token_ids")
    if packed is None:  # the list form (JSON, or an actor of an older version)
        token_ids = _int_tuple(data, "token_ids")
        try:
            return pack_token_ids(token_ids)
        except ValueError as exc:
            raise ValueError(f"KV event field 'token_ids': {exc}") from None
    if not isinstance(packed, bytes):
        raise ValueError(
            f"KV event field 'packed_token_ids' has type {type(packed).__name__}; expected bytes"
        )
    if len(packed) % 4:
        raise ValueError(
            f"KV event field 'packed_token_ids' has {len(packed)} bytes; expected a multiple "
            "of 4 (little-endian u32 token ids)"
        )
    return packed


def _hash_tuple(data: Mapping[str, Any], name: str) -> tuple[SequenceHash, ...]:
    return tuple(SequenceHash(value) for value in _int_tuple(data, name))


def _optional_hash(data: Mapping[str, Any], name: str) -> SequenceHash | None:
    if data.get(name) is None:
        return None
    return SequenceHash(_int_field(data, name))


def _tier_entry(tier: KVTier) -> dict[str, str]:
    # The device tier is implied, so a tierless consumer or producer sees no change.
    return {} if tier is KVTier.DEVICE else {"tier": tier.value}


def _tier_field(data: Mapping[str, Any]) -> KVTier:
    if data.get("tier") is None:
        return KVTier.DEVICE
    try:
        return parse_tier(data["tier"])
    except ValueError as exc:
        raise ValueError(f"KV event field 'tier': {exc}") from None
