"""The global prefix index: which actor holds which KV blocks, fed by their KV events.

Design decisions:

- One radix tree (``kv.radix_tree``) for all actors, keyed by *local* block hash, so a
  prompt's blocks are looked up once for every actor. The local hashes are computed from
  the tokens a ``BlockStored`` event carries (packed u32 bytes, hashed in place: no token
  is touched in Python), with the index's ``seed`` (the default seed, or
  ``hash_seed(extra_keys)`` for an index of LoRA/salted requests): the engine's sequence
  hashes may have been made with another seed, so they only serve as names.
- Per actor, a dict from *sequence* hash to node: ``BlockRemoved`` carries only sequence
  hashes, and ``BlockStored`` finds its parent through ``parent_hash`` (None = the root).
  A node counts how many of an actor's sequence hashes point at it, so two engine hashes
  of the same tokens (different seeds) share a node without one removal hiding the other.
- A stored block whose parent the actor no longer holds is dropped with the rest of its
  event (as Dynamo does): the actor lacks the parent, so matching from the root could
  never reach the block. So this may under-report what an actor holds, never over-report.
- Event ids per actor must arrive as 1, 2, 3, ...: an older id is a duplicate and is
  ignored; a newer one means events were lost, so the event is not applied, the actor is
  flagged and stays flagged until ``resync`` replaces its blocks from a ``KVCacheDump``.
- Tiers: an event names the tier it is about (device, host, disk; ``kv.tier``). An
  actor holds a block if any tier holds it; a node counts the actor's sequence hashes
  per tier, and ``find_tiered_matches`` reports each matched block in its fastest tier,
  so the router can credit a host or disk hit below a device hit.
- ``on_evicted(actor, local_hashes)`` (optional) hears of each block an actor's events
  take out of its device cache, as the local-hash path from the root (one per run of
  evicted blocks: the shallowest; an empty path when the whole cache is cleared), so an
  index of *assumed* blocks (``ModelRouting``'s predicted ones) can forget them too.
- Pure Python and single-threaded: the control plane's event loop owns the index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dynask.kv.block_pool import BlockPool, CachedBlock
from dynask.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventRecord,
    event_from_dict,
)
from dynask.kv.hashing import DEFAULT_SEED, LocalBlockHash, SequenceHash, packed_block_hashes
from dynask.kv.radix_tree import RadixNode, RadixTree
from dynask.kv.tier import TIER_ORDER, KVTier

# Holder value: per tier (TIER_ORDER), how many of the actor's sequence hashes point here.
_Node = RadixNode[list[int]]
_TIER_INDEX = {tier: position for position, tier in enumerate(TIER_ORDER)}


@dataclass(frozen=True, slots=True)
class TierOverlap:
    """An actor's contiguous match of a prompt, in blocks, by the fastest tier holding each."""

    device_blocks: int = 0
    host_blocks: int = 0
    disk_blocks: int = 0

    @property
    def total_blocks(self) -> int:
        """Blocks matched in any tier."""
        return self.device_blocks + self.host_blocks + self.disk_blocks


class ApplyStatus(StrEnum):
    """What ``PrefixIndex.apply`` did with an event."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"  # an id already applied (or covered by a resync): ignored
    GAP = "gap"  # events were missed: not applied, the actor needs a resync


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """The outcome of applying one event record for one actor."""

    actor: str
    event_id: int
    status: ApplyStatus
    expected_event_id: int  # the id the index wanted (before this event)

    @property
    def resync_needed(self) -> bool:
        """Whether the actor's blocks must be replaced from a dump (``resync``)."""
        return self.status is ApplyStatus.GAP


@dataclass(frozen=True, slots=True)
class KVCacheDump:
    """An actor's whole prefix cache, as of event ``last_event_id`` (0: none yet).

    ``stored`` lists ``BlockStored`` entries with every parent before its children.
    """

    last_event_id: int
    stored: tuple[BlockStored, ...]

    def __post_init__(self) -> None:
        if self.last_event_id < 0:
            raise ValueError(f"KVCacheDump.last_event_id must be >= 0, got {self.last_event_id}")
        for position, entry in enumerate(self.stored):
            if not isinstance(entry, BlockStored):
                raise ValueError(
                    f"KVCacheDump.stored[{position}] has value {entry!r}; expected BlockStored"
                )

    def to_dict(self, *, packed: bool = True) -> dict[str, Any]:
        """A plain dict for msgpack; ``packed=False``: tokens as lists of ints, for JSON
        (``BlockStored.to_dict``)."""
        return {
            "last_event_id": self.last_event_id,
            "stored": [entry.to_dict(packed=packed) for entry in self.stored],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KVCacheDump:
        """Inverse of ``to_dict``; raises ``ValueError`` on a malformed dict."""
        last_event_id = data.get("last_event_id")
        if not isinstance(last_event_id, int) or isinstance(last_event_id, bool):
            raise ValueError(
                f"KV cache dump field 'last_event_id' has value {last_event_id!r}; expected an int"
            )
        stored = data.get("stored")
        if not isinstance(stored, list | tuple):
            raise ValueError(f"KV cache dump field 'stored' has value {stored!r}; expected a list")
        entries = []
        for position, item in enumerate(stored):
            event = event_from_dict(item) if isinstance(item, Mapping) else None
            if not isinstance(event, BlockStored):
                raise ValueError(
                    f"KV cache dump field 'stored[{position}]' has value {item!r}; "
                    "expected a 'stored' event dict"
                )
            entries.append(event)
        return cls(last_event_id=last_event_id, stored=tuple(entries))

    @classmethod
    def from_block_pool(
        cls, pool: BlockPool, last_event_id: int, lower_tiers: Sequence[CachedBlock] = ()
    ) -> KVCacheDump:
        """A dump of ``pool``'s prefix cache and ``lower_tiers``' blocks, parents first.

        Call it where no event can be recorded meanwhile (on the engine thread), with the
        id of the pool's event log at that moment. Blocks whose parent is held in no tier
        are left out: matching from the root could never reach them. A block held in two
        tiers appears once per tier.
        """
        cached = [*pool.cached_blocks(), *lower_tiers]
        children: dict[SequenceHash | None, list[int]] = {}
        for position, block in enumerate(cached):
            children.setdefault(block.parent_hash, []).append(position)
        ordered: list[BlockStored] = []
        stack = list(reversed(children.pop(None, [])))
        while stack:
            block = cached[stack.pop()]
            hashes = (block.block_hash,)
            ordered.append(
                BlockStored.from_token_ids(
                    hashes, block.parent_hash, block.token_ids, pool.block_size, block.tier
                )
            )
            # pop: a hash held in two tiers lists its children once.
            stack.extend(reversed(children.pop(block.block_hash, [])))
        return cls(last_event_id=last_event_id, stored=tuple(ordered))


class _ActorState:
    __slots__ = ("expected_event_id", "nodes", "tiers")

    def __init__(self) -> None:
        self.nodes: dict[SequenceHash, _Node] = {}  # every hash held, in any tier
        self.tiers: dict[SequenceHash, set[KVTier]] = {}
        self.expected_event_id = 1


class PrefixIndex:
    """Which actors hold which prefix blocks, kept current by their KV events."""

    def __init__(
        self,
        seed: int = DEFAULT_SEED,
        on_evicted: Callable[[str, list[int]], None] | None = None,
    ) -> None:
        self.seed = seed
        self.on_evicted = on_evicted
        self._tree: RadixTree[list[int]] = RadixTree()
        self._actors: dict[str, _ActorState] = {}
        self._needs_resync: set[str] = set()

    # ---- feeding ----------------------------------------------------------------------

    def apply(self, actor: str, record: KVEventRecord) -> ApplyResult:
        """Apply one of ``actor``'s event records, if it is the next one expected."""
        state = self._state(actor)
        expected = state.expected_event_id
        if record.event_id < expected:
            return ApplyResult(actor, record.event_id, ApplyStatus.DUPLICATE, expected)
        if record.event_id > expected:
            self._needs_resync.add(actor)
            return ApplyResult(actor, record.event_id, ApplyStatus.GAP, expected)
        event = record.event
        if isinstance(event, BlockStored):
            self._store(actor, state, event)
        elif isinstance(event, BlockRemoved):
            listener = self.on_evicted if event.tier is KVTier.DEVICE else None
            evicted = self._run_heads(state, event.block_hashes) if listener else []
            self._remove(actor, state, event.block_hashes, event.tier)
            if listener is not None:
                for path in evicted:
                    listener(actor, path)
        elif isinstance(event, AllBlocksCleared):
            self._remove(actor, state, list(state.nodes), event.tier)
            if self.on_evicted is not None and event.tier is KVTier.DEVICE:
                self.on_evicted(actor, [])
        else:
            raise ValueError(f"KV event record holds {event!r}; expected a KV event")
        state.expected_event_id = expected + 1
        return ApplyResult(actor, record.event_id, ApplyStatus.APPLIED, expected)

    def resync(self, actor: str, dump: KVCacheDump) -> None:
        """Replace all of ``actor``'s blocks with ``dump``'s; expect its next event id."""
        state = self._state(actor)
        self._remove(actor, state, list(state.nodes), None)
        for entry in dump.stored:
            self._store(actor, state, entry)
        state.expected_event_id = dump.last_event_id + 1
        self._needs_resync.discard(actor)

    def remove_actor(self, actor: str) -> None:
        """Forget ``actor`` entirely (it died or left); a no-op for an unknown actor."""
        state = self._actors.pop(actor, None)
        if state is not None:
            self._remove(actor, state, list(state.nodes), None)
        self._needs_resync.discard(actor)

    # ---- queries ----------------------------------------------------------------------

    def find_matches(self, local_hashes: Sequence[int]) -> dict[str, int]:
        """Per actor, how many leading blocks of the query it holds contiguously.

        Actors that hold not even the first block are absent (their overlap is 0).
        """
        return self._tree.find_matches(local_hashes)

    def find_tiered_matches(self, local_hashes: Sequence[int]) -> dict[str, TierOverlap]:
        """``find_matches``, with each matched block counted in the fastest tier holding it."""
        counts: dict[str, list[int]] = {}
        node = self._tree.root
        active: set[str] | None = None
        for local_hash in local_hashes:
            child = node.children.get(local_hash)
            if child is None:
                break
            node = child
            active = set(node.holders) if active is None else active & node.holders.keys()
            if not active:
                break
            for actor in active:
                per_tier = node.holders[actor]
                best = next(i for i, count in enumerate(per_tier) if count)
                counts.setdefault(actor, [0] * len(TIER_ORDER))[best] += 1
        return {actor: TierOverlap(*tiers) for actor, tiers in counts.items()}

    def num_blocks(self, actor: str) -> int:
        """How many blocks (distinct sequence hashes) ``actor`` holds; 0 if unknown."""
        state = self._actors.get(actor)
        return 0 if state is None else len(state.nodes)

    def actors(self) -> list[str]:
        """Every actor the index has heard of, in order of first contact."""
        return list(self._actors)

    def needs_resync(self, actor: str) -> bool:
        """Whether a gap in ``actor``'s events was seen since its last resync."""
        return actor in self._needs_resync

    def expected_event_id(self, actor: str) -> int:
        """The id of the next event the index will apply for ``actor``."""
        state = self._actors.get(actor)
        return 1 if state is None else state.expected_event_id

    def num_nodes(self) -> int:
        """Nodes in the tree (a full walk: for tests and diagnostics)."""
        return self._tree.num_nodes()

    # ---- internals --------------------------------------------------------------------

    def _state(self, actor: str) -> _ActorState:
        state = self._actors.get(actor)
        if state is None:
            if not isinstance(actor, str) or not actor:
                raise ValueError(f"actor id has value {actor!r}; expected a non-empty string")
            state = self._actors[actor] = _ActorState()
        return state

    def _run_heads(self, state: _ActorState, hashes: Sequence[SequenceHash]) -> list[list[int]]:
        """For ``on_evicted``: the local-hash path of each run's shallowest block among
        ``hashes`` (the others of a run are below it)."""
        nodes = {state.nodes[h] for h in hashes if h in state.nodes}
        return [self._tree.key_path(node) for node in nodes if node.parent not in nodes]

    def _store(self, actor: str, state: _ActorState, event: BlockStored) -> None:
        if event.parent_hash is None:
            node = self._tree.root
        else:
            parent = state.nodes.get(event.parent_hash)
            if parent is None:
                return  # see the module docstring: unreachable from the root
            node = parent
        local = packed_block_hashes(event.packed_token_ids, event.block_size, self.seed)
        tier, nodes, tiers = event.tier, state.nodes, state.tiers
        slot = _TIER_INDEX[tier]
        path = self._tree.path(node, local)
        for position, (block_hash, node) in enumerate(zip(event.block_hashes, path, strict=True)):
            held = nodes.get(block_hash)
            if held is node:  # held already, here (maybe in another tier)
                self._link(actor, state, block_hash, node, tier)
                continue
            if held is not None:  # held at another node: removing it there may prune the
                # nodes made ahead, so the rest goes block by block, as it always did
                self._store_from(actor, state, event, local, position, path[position].parent)
                return
            # A block new to the actor, the usual one: _link's effect, inlined.
            tiers[block_hash] = {tier}
            nodes[block_hash] = node
            per_tier = node.holders.get(actor)
            if per_tier is None:
                per_tier = node.holders[actor] = [0] * len(TIER_ORDER)
            per_tier[slot] += 1

    def _store_from(
        self,
        actor: str,
        state: _ActorState,
        event: BlockStored,
        local: list[LocalBlockHash],
        start: int,
        node: _Node | None,
    ) -> None:
        assert node is not None  # a path node's parent: the root or a node of the path
        for position in range(start, len(local)):
            node = self._tree.child(node, local[position])
            self._link(actor, state, event.block_hashes[position], node, event.tier)

    def _link(
        self, actor: str, state: _ActorState, block_hash: SequenceHash, node: _Node, tier: KVTier
    ) -> None:
        old = state.nodes.get(block_hash)
        if old is not None and old is not node:
            self._remove(actor, state, (block_hash,), None)
        tiers = state.tiers.setdefault(block_hash, set())
        if tier in tiers:
            return
        tiers.add(tier)
        state.nodes[block_hash] = node
        per_tier = node.holders.setdefault(actor, [0] * len(TIER_ORDER))
        per_tier[_TIER_INDEX[tier]] += 1

    def _remove(
        self,
        actor: str,
        state: _ActorState,
        hashes: Iterable[SequenceHash],
        tier: KVTier | None,
    ) -> None:
        """Drops ``hashes`` from ``tier`` (None: from every tier)."""
        for block_hash in hashes:
            tiers = state.tiers.get(block_hash)
            if not tiers:
                continue
            node = state.nodes[block_hash]
            for dropped in set(tiers) if tier is None else tiers & {tier}:
                tiers.discard(dropped)
                self._unlink(actor, node, dropped)
            if not tiers:
                del state.tiers[block_hash], state.nodes[block_hash]

    def _unlink(self, actor: str, node: _Node, tier: KVTier) -> None:
        per_tier = node.holders[actor]
        per_tier[_TIER_INDEX[tier]] -= 1
        if any(per_tier):
            return
        del node.holders[actor]
        self._tree.prune(node)
